/* `muser bench --draft FILE`: greedy generation from a text prompt, plain
 * (mu_greedy_generate) against speculative (mu_speculate_greedy: every step
 * speculates, no gate), timed the same way as the other tests (warm-up,
 * repetitions, median/CV, optional pause). The two token streams must be
 * identical in every repetition: a run that differs is reported as an
 * error, not as a speed. */
#include "bench/bench.h"
#include "model/api_internal.h"
#include "spec/speculate.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per second after the first token (which both get from the prompt). */
static double rate(int64_t n, double seconds) { return n > 1 && seconds > 0 ? (double)(n - 1) / seconds : 0; }

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
    mu_dflash *d = mu_dflash_load(o->draft_path, err);
    muser_session_params spp = {.n_ctx = n_prompt + n + 1};
    muser_session *s = d ? muser_session_create(mm, &spp, (muser_error *)err) : NULL;
    int32_t *a = mu_xmalloc((size_t)n * sizeof(int32_t)), *b = mu_xmalloc((size_t)n * sizeof(int32_t));
    double *sa = mu_xmalloc((size_t)o->reps * sizeof(double)), *sb = mu_xmalloc((size_t)o->reps * sizeof(double));
    bool ok = s != NULL;
    if (ok) snprintf(res->draft_name, sizeof res->draft_name, "%s", d->name);
    for (int i = 0; i < o->warmup + o->reps && ok; i++) {
        double t_plain = 0;
        mu_spec_stats st;
        if (i >= o->warmup) mu_bench_pause(o->pause_s);
        int64_t na = mu_greedy_generate(mm, s, prompt, n_prompt, n, a, &t_plain, err);
        if (na > 0 && i >= o->warmup) mu_bench_pause(o->pause_s);
        int64_t nb = na > 0 ? mu_speculate_greedy(mm, d, s, prompt, n_prompt, vl, n, b, &st, err) : -1;
        ok = na > 0 && nb > 0;
        if (ok && (na != nb || memcmp(a, b, (size_t)na * sizeof(int32_t)))) {
            mu_err_set(err, "bench: speculative greedy output differs from plain greedy (repetition %d)", i);
            ok = false;
        }
        if (ok && i >= o->warmup) {
            sa[i - o->warmup] = rate(na, t_plain);
            sb[i - o->warmup] = rate(nb, st.t_total - st.t_prefill);
            res->rounds += st.verify_steps;
            res->round_tokens += st.step_tokens;
            res->drafted += st.drafted;
            res->accepted += st.accepted;
            res->n_gen = na;
        }
    }
    if (ok) {
        mu_bench_stats_compute(&res->plain, sa, o->reps);
        mu_bench_stats_compute(&res->spec, sb, o->reps);
        res->n_prompt = n_prompt;
        res->verify_len = vl;
        res->ran = true;
    }
    free(sa);
    free(sb);
    free(a);
    free(b);
    free(prompt);
    muser_session_free(s);
    mu_dflash_free(d);
    return ok;
}
