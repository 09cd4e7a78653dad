/* Forward-pass contracts on synthetic tiny models:
 *  - prefill == token-by-token decode, bitwise, for chunk sizes 1, 7, 64, 512
 *  - feed_all rows == the corresponding single-feed logits, bitwise
 *  - checkpoint / rollback and snapshot / restore reproduce logits bitwise
 *  - the engine agrees with an independent double-precision forward written
 *    from the model definition (F32 weights), including ring wrap-around
 *  - invalid tokens and a full context fail closed with state unchanged */
#include "testutil.h"
#include "model_fixture.h"
#include "muser.h"
#include "model/model.h"
#include "util/mumath.h"
#include <math.h>

#define PROMPT_LEN 48 /* > window 32: the sliding rings wrap */
#define WINDOW 32

static int32_t prompt[PROMPT_LEN];

static muser_session *new_session(muser_model *m, int64_t chunk) {
    muser_error err;
    muser_session_params sp = {.n_ctx = 256, .prefill_chunk = chunk};
    muser_session *s = muser_session_create(m, &sp, &err);
    if (!s) fprintf(stderr, "session: %s\n", err.msg);
    return s;
}

/* logits after feeding prompt[0..n) in one call with the given chunk size */
static float *logits_after(muser_model *m, int64_t n, int64_t chunk, int64_t V) {
    muser_session *s = new_session(m, chunk);
    muser_error err;
    float *out = malloc((size_t)V * sizeof(float));
    bool ok = muser_session_feed(s, prompt, n, &err);
    CHECK_MSG(ok, "%s", err.msg);
    memcpy(out, muser_session_logits(s), (size_t)V * sizeof(float));
    muser_session_free(s);
    return out;
}

static void test_prefill_equals_decode(const char *type) {
    muser_error err;
    muser_model *m = muser_model_load(fx_synth(type, 7, WINDOW), NULL, &err);
    CHECK_MSG(m != NULL, "%s", m ? "" : err.msg);
    if (!m) return;
    muser_model_info info;
    muser_model_get_info(m, &info);
    int64_t V = info.n_vocab;
    /* one token at a time, keeping every step's logits */
    muser_session *s = new_session(m, 1);
    float *steps = malloc((size_t)(PROMPT_LEN * V) * sizeof(float));
    for (int i = 0; i < PROMPT_LEN; i++) {
        CHECK(muser_session_feed(s, &prompt[i], 1, &err));
        memcpy(steps + i * V, muser_session_logits(s), (size_t)V * sizeof(float));
    }
    muser_session_free(s);
    const int64_t chunks[] = {1, 7, 64, 512};
    for (size_t c = 0; c < 4; c++) {
        float *l = logits_after(m, PROMPT_LEN, chunks[c], V);
        CHECK_MSG(!memcmp(l, steps + (PROMPT_LEN - 1) * V, (size_t)V * sizeof(float)),
                  "%s: prefill chunk %lld differs from decode", type, (long long)chunks[c]);
        free(l);
    }
    /* feed_all rows equal the per-step logits */
    s = new_session(m, 7);
    float *all = malloc((size_t)(PROMPT_LEN * V) * sizeof(float));
    CHECK(muser_session_feed_all(s, prompt, PROMPT_LEN, all, &err));
    CHECK_MSG(!memcmp(all, steps, (size_t)(PROMPT_LEN * V) * sizeof(float)), "%s: feed_all rows differ", type);
    muser_session_free(s);
    free(all);
    free(steps);
    muser_model_free(m);
}

static void test_rollback_and_snapshot(void) {
    muser_error err;
    muser_model *m = muser_model_load(fx_synth("Q4_K", 3, WINDOW), NULL, &err);
    CHECK(m != NULL);
    if (!m) return;
    muser_model_info info;
    muser_model_get_info(m, &info);
    int64_t V = info.n_vocab;
    float *ref = logits_after(m, 44, 512, V);
    /* 24 tokens, checkpoint, 16 "draft" tokens (4 right, 12 garbage), roll back to 28 and continue */
    muser_session *s = new_session(m, 512);
    CHECK(muser_session_feed(s, prompt, 24, &err));
    CHECK(muser_session_checkpoint(s, &err));
    int32_t draft[16];
    for (int i = 0; i < 16; i++) draft[i] = i < 4 ? prompt[24 + i] : (int32_t)((i * 37) % V);
    CHECK(muser_session_feed(s, draft, 16, &err));
    int32_t extra = 1;
    CHECK(!muser_session_feed(s, &extra, 1, &err)); /* 17th row past the checkpoint is refused */
    CHECK_EQ_INT(muser_session_pos(s), 40);
    CHECK(muser_session_rollback(s, 28, &err));
    muser_session_commit(s);
    CHECK_EQ_INT(muser_session_pos(s), 28);
    CHECK(muser_session_feed(s, prompt + 28, 16, &err));
    CHECK_MSG(!memcmp(muser_session_logits(s), ref, (size_t)V * sizeof(float)), "rollback changed the logits");
    /* snapshot at 44, feed more, restore, feed the same: identical */
    muser_snapshot *snap = muser_session_snapshot(s);
    int32_t more[5] = {5, 6, 7, 8, 9};
    CHECK(muser_session_feed(s, more, 5, &err));
    float *after = malloc((size_t)V * sizeof(float));
    memcpy(after, muser_session_logits(s), (size_t)V * sizeof(float));
    CHECK(muser_session_feed(s, more, 5, &err));
    CHECK(muser_session_restore(s, snap, &err));
    CHECK_EQ_INT(muser_session_pos(s), 44);
    CHECK(muser_session_feed(s, more, 5, &err));
    CHECK_MSG(!memcmp(muser_session_logits(s), after, (size_t)V * sizeof(float)), "restore changed the logits");
    muser_snapshot_free(snap);
    /* invalid token and full context: refused, position unchanged */
    int32_t bad[2] = {1, (int32_t)V};
    int64_t pos = muser_session_pos(s);
    CHECK(!muser_session_feed(s, bad, 2, &err));
    CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
    CHECK_EQ_INT(muser_session_pos(s), pos);
    int32_t *many = calloc(300, sizeof(int32_t));
    CHECK(!muser_session_feed(s, many, 300, &err));
    CHECK(strstr(err.msg, "context full") != NULL);
    CHECK_EQ_INT(muser_session_pos(s), pos);
    free(many);
    free(after);
    free(ref);
    muser_session_free(s);
    muser_model_free(m);
}

/* ---------- independent double-precision forward (F32 weights) ---------- */

static void d_rmsnorm(double *x, const float *w, double eps, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * inv * (w ? (double)w[i] : 1.0);
}

static void d_matvec(const mu_weight *w, const double *x, double *y, float *rowbuf) {
    for (int64_t o = 0; o < w->n_out; o++) {
        mu_weight_dequant_row(w, o, rowbuf);
        double acc = 0;
        for (int64_t i = 0; i < w->n_in; i++) acc += (double)rowbuf[i] * x[i];
        y[o] = acc;
    }
}

static void test_against_double_forward(void) {
    mu_error err;
    mu_model *m = mu_model_load(fx_synth("F32", 11, WINDOW), &err);
    CHECK_MSG(m != NULL, "%s", m ? "" : err.msg);
    if (!m) return;
    const mu_model_config *c = &m->cfg;
    const int64_t T = PROMPT_LEN, E = c->n_embd, D = c->head_dim, H = c->n_head, HKV = c->n_head_kv;
    const int64_t Q = H * D, KV = HKV * D, F = c->n_ff, V = c->n_vocab;
    double *x = calloc((size_t)(T * E), sizeof(double));
    double *K = calloc((size_t)(T * KV), sizeof(double)), *Vv = calloc((size_t)(T * KV), sizeof(double));
    double *h = malloc((size_t)E * 8), *q = malloc((size_t)Q * 8), *g = malloc((size_t)Q * 8);
    double *att = malloc((size_t)Q * 8), *o = malloc((size_t)E * 8), *fg = malloc((size_t)F * 8);
    double *fu = malloc((size_t)F * 8), *sc = malloc((size_t)T * 8), *logits = malloc((size_t)V * 8);
    float *rowbuf = malloc((size_t)(F > V ? F : V > E ? V : E) * 4 + (size_t)F * 4);
    for (int64_t t = 0; t < T; t++) {
        mu_weight_dequant_row(&m->token_embd, prompt[t], rowbuf);
        for (int64_t i = 0; i < E; i++) x[t * E + i] = rowbuf[i];
        d_rmsnorm(x + t * E, NULL, c->rms_eps, E);
    }
    for (int il = 0; il < c->n_layer; il++) {
        const mu_layer_weights *lw = &m->layers[il];
        for (int64_t t = 0; t < T; t++) { /* causal: row t sees rows <= t, so per-row order is fine */
            double *xt = x + t * E;
            memcpy(h, xt, (size_t)E * 8);
            d_rmsnorm(h, lw->attn_norm, c->rms_eps, E);
            d_matvec(&lw->attn_q, h, q, rowbuf);
            d_matvec(&lw->attn_k, h, K + t * KV, rowbuf);
            d_matvec(&lw->attn_v, h, Vv + t * KV, rowbuf);
            d_matvec(&lw->attn_gate, h, g, rowbuf);
            for (int64_t hh = 0; hh < H; hh++) d_rmsnorm(q + hh * D, lw->attn_q_norm, c->rms_eps, D);
            for (int64_t hh = 0; hh < HKV; hh++) d_rmsnorm(K + t * KV + hh * D, lw->attn_k_norm, c->rms_eps, D);
            if (c->is_swa[il]) {
                for (int64_t i = 0; i < c->n_rot / 2; i++) {
                    double th = (double)t * pow((double)c->rope_base_swa, -2.0 * (double)i / (double)c->n_rot);
                    double cs = cos(th), sn = sin(th);
                    for (int64_t hh = 0; hh < H + HKV; hh++) {
                        double *v = hh < H ? q + hh * D : K + t * KV + (hh - H) * D;
                        double a = v[2 * i], b = v[2 * i + 1];
                        v[2 * i] = a * cs - b * sn;
                        v[2 * i + 1] = a * sn + b * cs;
                    }
                }
            }
            /* the engine stores K (after RoPE) and V as f16: model that exactly */
            for (int64_t i = 0; i < KV; i++) {
                K[t * KV + i] = mu_round_f16((float)K[t * KV + i]);
                Vv[t * KV + i] = mu_round_f16((float)Vv[t * KV + i]);
            }
            int64_t first = c->is_swa[il] && t - c->sliding_window + 1 > 0 ? t - c->sliding_window + 1 : 0;
            for (int64_t hh = 0; hh < H; hh++) {
                int64_t kh = hh / (H / HKV);
                double mx = -INFINITY, sum = 0;
                for (int64_t p = first; p <= t; p++) {
                    double d = 0;
                    for (int64_t j = 0; j < D; j++) d += q[hh * D + j] * K[p * KV + kh * D + j];
                    sc[p] = d / sqrt((double)D);
                    if (sc[p] > mx) mx = sc[p];
                }
                for (int64_t j = 0; j < D; j++) att[hh * D + j] = 0;
                for (int64_t p = first; p <= t; p++) {
                    double e = exp(sc[p] - mx);
                    sum += e;
                    for (int64_t j = 0; j < D; j++) att[hh * D + j] += e * Vv[p * KV + kh * D + j];
                }
                for (int64_t j = 0; j < D; j++) att[hh * D + j] /= sum;
            }
            for (int64_t i = 0; i < Q; i++) att[i] *= 1.0 / (1.0 + exp(-g[i]));
            d_matvec(&lw->attn_output, att, o, rowbuf);
            d_rmsnorm(o, lw->post_attention_norm, 1e-8, E);
            for (int64_t i = 0; i < E; i++) xt[i] += o[i];
        }
        for (int64_t t = 0; t < T; t++) {
            double *xt = x + t * E;
            memcpy(h, xt, (size_t)E * 8);
            d_rmsnorm(h, lw->ffn_norm, c->rms_eps, E);
            d_matvec(&lw->ffn_gate, h, fg, rowbuf);
            d_matvec(&lw->ffn_up, h, fu, rowbuf);
            for (int64_t i = 0; i < F; i++) fg[i] = fg[i] / (1.0 + exp(-fg[i])) * fu[i];
            d_matvec(&lw->ffn_down, fg, o, rowbuf);
            d_rmsnorm(o, lw->post_ffw_norm, 1e-8, E);
            for (int64_t i = 0; i < E; i++) xt[i] += o[i];
        }
    }
    memcpy(h, x + (T - 1) * E, (size_t)E * 8);
    d_rmsnorm(h, m->output_norm, c->rms_eps, E);
    d_matvec(&m->output, h, logits, rowbuf);
    for (int64_t i = 0; i < V; i++) {
        double l = logits[i] * c->logit_scale;
        logits[i] = c->softcap > 0 ? tanh(l / c->softcap) * c->softcap : l;
    }
    mu_model_free(m);

    muser_error merr;
    muser_model *mm = muser_model_load(fx_synth("F32", 11, WINDOW), NULL, &merr);
    float *eng = logits_after(mm, T, 512, V);
    double maxabs = 0, maxdiff = 0;
    for (int64_t i = 0; i < V; i++) {
        if (fabs(logits[i]) > maxabs) maxabs = fabs(logits[i]);
        if (fabs(logits[i] - eng[i]) > maxdiff) maxdiff = fabs(logits[i] - eng[i]);
    }
    printf("engine vs double forward: max |diff| %.3g, max |logit| %.3g\n", maxdiff, maxabs);
    CHECK(maxabs > 0.1); /* the comparison must be about something */
    CHECK_MSG(maxdiff <= 2e-4 * maxabs, "engine deviates from the model definition: %.3g", maxdiff);
    free(eng);
    muser_model_free(mm);
    free(x); free(K); free(Vv); free(h); free(q); free(g); free(att); free(o);
    free(fg); free(fu); free(sc); free(logits); free(rowbuf);
}

int main(void) {
    for (int i = 0; i < PROMPT_LEN; i++) prompt[i] = (int32_t)((i * 131 + 17) % 300);
    const char *types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "q4_k_xl", "nvfp4", "nvfp4_ggml"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_prefill_equals_decode(types[i]);
    test_rollback_and_snapshot();
    test_against_double_forward();
    fx_cleanup();
    TEST_MAIN_END();
}
