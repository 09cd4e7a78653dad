/* `muser bench --draft FILE`: greedy generation from a prompt (or each of a set), plain
 * against speculative (every step speculates, no gate), both through the
 * request loop of src/gen (mu_gen_greedy), timed the same way as the
 * other tests (warm-up, repetitions, median/CV, optional pause). The two
 * token streams must be identical in every repetition: a run that differs
 * is reported as an error, not as a speed. */
#include "bench/bench.h"
#include "gen/gen.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One prompt of the set: its ids (each inside the vocabulary), or its
 * text tokenized like -p. */
static int64_t spec_prompt(muser_model *mm, const mu_bench_prompt *q, int k, int32_t **ids, mu_error *err) {
    if (!q->ids) {
        int64_t n = muser_tokenize(mm, q->text, strlen(q->text), true, true, ids, (muser_error *)err);
        if (n == 0) mu_err_set(err, "bench: speculation prompt %d ('%.40s') is empty", k + 1, q->text);
        return n > 0 ? n : -1;
    }
    muser_model_info info;
    muser_model_get_info(mm, &info);
    for (int64_t i = 0; i < q->n_ids; i++)
        if (q->ids[i] >= info.n_vocab) {
            mu_err_set(err, "bench: speculation prompt %d: token id %d (position %lld) is outside the vocabulary (0..%lld)",
                       k + 1, q->ids[i], (long long)i, (long long)info.n_vocab - 1);
            return -1;
        }
    *ids = mu_xmalloc((size_t)q->n_ids * sizeof **ids);
    memcpy(*ids, q->ids, (size_t)q->n_ids * sizeof **ids);
    return q->n_ids;
}

bool mu_bench_spec_run(const mu_bench_opts *o, muser_model *mm, mu_bench_spec *res, mu_error *err) {
    memset(res, 0, sizeof *res);
    const int64_t n = o->n_gen > 1 ? o->n_gen : 128;
    const int vl = o->verify_len ? o->verify_len : 7;
    /* the prompts: --spec-prompts' lines, else --spec-prompt, else a Genesis verse */
    const mu_bench_prompt one = {.text = o->spec_prompt ? o->spec_prompt : "In the beginning God created the heaven and the earth."};
    const int np = o->n_spec_prompts ? o->n_spec_prompts : 1;
    int32_t **prompt = mu_xcalloc((size_t)np, sizeof *prompt);
    int64_t *n_prompt = mu_xcalloc((size_t)np, sizeof *n_prompt), longest = 0;
    bool ok = true;
    for (int k = 0; k < np && ok; k++) {
        n_prompt[k] = spec_prompt(mm, o->n_spec_prompts ? &o->spec_prompts[k] : &one, k, &prompt[k], err);
        ok = n_prompt[k] > 0;
        if (ok && n_prompt[k] > longest) longest = n_prompt[k];
    }
    muser_draft *d = ok ? muser_draft_load(o->draft_path, mm, (muser_error *)err) : NULL;
    muser_session_params spp = {.n_ctx = longest + n + 1};
    muser_session *s = d ? muser_session_create(mm, &spp, (muser_error *)err) : NULL;
    double *sa = mu_xmalloc((size_t)o->reps * sizeof(double)), *sb = mu_xmalloc((size_t)o->reps * sizeof(double));
    ok = s != NULL;
    if (ok) snprintf(res->draft_name, sizeof res->draft_name, "%s", muser_draft_name(d));
    res->ratio_min = 1e30;
    /* a repetition: every prompt plain, then speculative; its speed is the
     * tokens of all prompts over their summed seconds */
    for (int i = 0; i < o->warmup + o->reps && ok; i++) {
        int64_t tok_a = 0, tok_b = 0;
        double sec_a = 0, sec_b = 0;
        if (i >= o->warmup) mu_bench_pause(o->pause_s);
        for (int k = 0; k < np && ok; k++) {
            mu_gen_pair r = {0};
            ok = mu_gen_greedy(s, NULL, NULL, prompt[k], n_prompt[k], n, &r, (muser_error *)err);
            ok = ok && mu_gen_greedy(s, d, &(muser_spec_params){.verify_len = vl, .tree = o->spec_tree}, prompt[k],
                                     n_prompt[k], n, &r, (muser_error *)err);
            if (ok && mu_gen_pair_diff(&r) >= 0) {
                mu_err_set(err, "bench: speculative greedy output differs from plain greedy (prompt %d, repetition %d)", k, i);
                ok = false;
            }
            if (ok && i >= o->warmup) {
                tok_a += r.n_plain;
                sec_a += r.t_plain;
                tok_b += r.n_spec;
                sec_b += r.t_spec;
                res->rounds += r.st.rounds + r.st.plain_steps; /* a plain step verifies no proposal */
                res->round_tokens += r.st.round_tokens + r.st.plain_steps;
                res->drafted += r.st.drafted;
                res->accepted += r.st.accepted;
                res->n_gen = np > 1 ? n : r.n_plain; /* a set: the most any prompt generates */
                if (i == o->warmup + o->reps - 1 && r.t_spec > 0 && r.t_plain > 0) { /* the last repetition's spread */
                    const double q = mu_gen_rate(r.n_spec, r.t_spec) / mu_gen_rate(r.n_plain, r.t_plain);
                    if (q < res->ratio_min) res->ratio_min = q;
                    if (q > res->ratio_max) res->ratio_max = q;
                }
            }
            mu_gen_pair_free(&r);
        }
        if (ok && i >= o->warmup) {
            sa[i - o->warmup] = mu_gen_rate(tok_a, sec_a);
            sb[i - o->warmup] = mu_gen_rate(tok_b, sec_b);
        }
    }
    if (ok) {
        mu_bench_stats_compute(&res->plain, sa, o->reps);
        mu_bench_stats_compute(&res->spec, sb, o->reps);
        res->n_prompt = n_prompt[0];
        res->n_prompts = np;
        res->verify_len = vl;
        res->tree = o->spec_tree;
        res->ran = true;
    }
    free(sa);
    free(sb);
    for (int k = 0; k < np; k++) free(prompt[k]);
    free(prompt);
    free(n_prompt);
    muser_session_free(s);
    muser_draft_free(d);
    return ok;
}
