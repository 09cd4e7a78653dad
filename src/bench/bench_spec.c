/* `muser bench --draft FILE`: greedy generation from a text prompt, plain
 * against speculative (every step speculates, no gate), timed the same way
 * as the other tests (warm-up, repetitions, median/CV, optional pause). The
 * two token streams must be identical in every repetition: a run that
 * differs is reported as an error, not as a speed. */
#include "bench/bench.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void pause_for(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static int32_t argmax(const float *l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

/* Plain greedy: n tokens after the prompt; tokens/s of the decode part. */
static bool plain_run(muser_session *s, const int32_t *prompt, int64_t n_prompt, int64_t n, int64_t n_vocab,
                      int32_t *out, double *tok_s, mu_error *err) {
    muser_session_reset(s);
    if (!muser_session_feed(s, prompt, n_prompt, (muser_error *)err)) return false;
    double t0 = mu_now();
    out[0] = argmax(muser_session_logits(s), n_vocab);
    for (int64_t i = 1; i < n; i++) {
        if (!muser_session_feed(s, &out[i - 1], 1, (muser_error *)err)) return false;
        out[i] = argmax(muser_session_logits(s), n_vocab);
    }
    double dt = mu_now() - t0;
    *tok_s = dt > 0 ? (double)(n - 1) / dt : 0;
    return true;
}

static bool spec_run(muser_spec *sp, muser_session *s, const int32_t *prompt, int64_t n_prompt, int64_t n,
                     int64_t n_vocab, int32_t *out, double *tok_s, mu_error *err) {
    muser_spec_reset(sp);
    if (!muser_spec_feed(sp, prompt, n_prompt, (muser_error *)err)) return false;
    double t0 = mu_now();
    int64_t k = 0;
    out[k++] = argmax(muser_session_logits(s), n_vocab);
    while (k < n) {
        int max = n - k < 16 ? (int)(n - k) : 16;
        int got = muser_spec_next(sp, out[k - 1], NULL, max, out + k, NULL, (muser_error *)err);
        if (got <= 0) return false;
        k += got;
    }
    double dt = mu_now() - t0;
    *tok_s = dt > 0 ? (double)(n - 1) / dt : 0;
    return true;
}

bool mu_bench_spec_run(const mu_bench_opts *o, muser_model *mm, mu_bench_spec *res, mu_error *err) {
    memset(res, 0, sizeof *res);
    const int64_t n = o->n_gen > 1 ? o->n_gen : 128;
    muser_model_info info;
    muser_model_get_info(mm, &info);
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
    muser_spec_params p = {.verify_len = o->verify_len ? o->verify_len : 7, .no_gate = true};
    muser_spec *sp = s ? muser_spec_create(s, d, &p, (muser_error *)err) : NULL;
    int32_t *a = mu_xmalloc((size_t)n * sizeof(int32_t)), *b = mu_xmalloc((size_t)n * sizeof(int32_t));
    double *sa = mu_xmalloc((size_t)o->reps * sizeof(double)), *sb = mu_xmalloc((size_t)o->reps * sizeof(double));
    bool ok = sp != NULL;
    if (ok) snprintf(res->draft_name, sizeof res->draft_name, "%s", muser_draft_name(d));
    for (int i = 0; i < o->warmup + o->reps && ok; i++) {
        double va = 0, vb = 0;
        if (i >= o->warmup) pause_for(o->pause_s);
        ok = plain_run(s, prompt, n_prompt, n, info.n_vocab, a, &va, err);
        if (ok && i >= o->warmup) pause_for(o->pause_s);
        if (ok) {
            muser_spec_reset_stats(sp);
            ok = spec_run(sp, s, prompt, n_prompt, n, info.n_vocab, b, &vb, err);
        }
        if (ok && memcmp(a, b, (size_t)n * sizeof(int32_t))) {
            mu_err_set(err, "bench: speculative greedy output differs from plain greedy (repetition %d)", i);
            ok = false;
        }
        if (ok && i >= o->warmup) {
            sa[i - o->warmup] = va;
            sb[i - o->warmup] = vb;
            muser_spec_stats st;
            muser_spec_get_stats(sp, &st);
            res->rounds += st.rounds;
            res->round_tokens += st.round_tokens;
            res->drafted += st.drafted;
            res->accepted += st.accepted;
        }
    }
    if (ok) {
        mu_bench_stats_compute(&res->plain, sa, o->reps);
        mu_bench_stats_compute(&res->spec, sb, o->reps);
        res->n_prompt = n_prompt;
        res->n_gen = n;
        res->verify_len = p.verify_len;
        res->ran = true;
    }
    free(sa);
    free(sb);
    free(a);
    free(b);
    free(prompt);
    muser_spec_free(sp);
    muser_session_free(s);
    muser_draft_free(d);
    return ok;
}
