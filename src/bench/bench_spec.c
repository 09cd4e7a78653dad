/* `muser bench --draft FILE`: greedy generation from a text prompt, plain
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

bool mu_bench_spec_run(const mu_bench_opts *o, muser_model *mm, mu_bench_spec *res, mu_error *err) {
    memset(res, 0, sizeof *res);
    const int64_t n = o->n_gen > 1 ? o->n_gen : 128;
    const int vl = o->verify_len ? o->verify_len : 7;
    int32_t *prompt = NULL;
    const char *text = o->spec_prompt ? o->spec_prompt : "In the beginning God created the heaven and the earth.";
    int64_t n_prompt = muser_tokenize(mm, text, strlen(text), true, true, &prompt, (muser_error *)err);
    if (n_prompt <= 0) {
        if (n_prompt == 0) mu_err_set(err, "bench: the speculation prompt is empty");
        free(prompt);
        return false;
    }
    muser_draft *d = muser_draft_load(o->draft_path, mm, (muser_error *)err);
    muser_session_params spp = {.n_ctx = n_prompt + n + 1};
    muser_session *s = d ? muser_session_create(mm, &spp, (muser_error *)err) : NULL;
    double *sa = mu_xmalloc((size_t)o->reps * sizeof(double)), *sb = mu_xmalloc((size_t)o->reps * sizeof(double));
    bool ok = s != NULL;
    if (ok) snprintf(res->draft_name, sizeof res->draft_name, "%s", muser_draft_name(d));
    for (int i = 0; i < o->warmup + o->reps && ok; i++) {
        mu_gen_pair r = {0};
        if (i >= o->warmup) mu_bench_pause(o->pause_s);
        ok = mu_gen_greedy(s, NULL, NULL, prompt, n_prompt, n, &r, (muser_error *)err);
        if (ok && i >= o->warmup) mu_bench_pause(o->pause_s);
        ok = ok && mu_gen_greedy(s, d, &(muser_spec_params){.verify_len = vl, .tree = o->spec_tree}, prompt, n_prompt, n, &r, (muser_error *)err);
        if (ok && mu_gen_pair_diff(&r) >= 0) {
            mu_err_set(err, "bench: speculative greedy output differs from plain greedy (repetition %d)", i);
            ok = false;
        }
        if (ok && i >= o->warmup) {
            sa[i - o->warmup] = mu_gen_rate(r.n_plain, r.t_plain);
            sb[i - o->warmup] = mu_gen_rate(r.n_spec, r.t_spec);
            res->rounds += r.st.rounds + r.st.plain_steps; /* a plain step verifies no proposal */
            res->round_tokens += r.st.round_tokens + r.st.plain_steps;
            res->drafted += r.st.drafted;
            res->accepted += r.st.accepted;
            res->n_gen = r.n_plain;
        }
        mu_gen_pair_free(&r);
    }
    if (ok) {
        mu_bench_stats_compute(&res->plain, sa, o->reps);
        mu_bench_stats_compute(&res->spec, sb, o->reps);
        res->n_prompt = n_prompt;
        res->verify_len = vl;
        res->tree = o->spec_tree;
        res->ran = true;
    }
    free(sa);
    free(sb);
    free(prompt);
    muser_session_free(s);
    muser_draft_free(d);
    return ok;
}
