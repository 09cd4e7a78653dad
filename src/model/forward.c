/* One forward pass (book Ch 10-19; spec muse-glimmer-gguf.md §6):
 *   x = rmsnorm(embed(tokens))                             (weightless, eps)
 *   per layer:  h = rmsnorm(x)*attn_norm; q,k,v,g = W h
 *               q,k = per-head rmsnorm * q_norm/k_norm; RoPE on sliding layers
 *               a = attention(q, K, V) * sigmoid(g); o = Wo a
 *               x += rmsnorm(o, 1e-8) * post_attention_norm
 *               h = rmsnorm(x)*ffn_norm; f = Wdown(silu(Wg h) * (Wu h))
 *               x += rmsnorm(f, 1e-8) * post_ffw_norm
 *   logits = softcap(logit_scale * Wout (rmsnorm(x)*output_norm))
 * Every op is row-independent except attention, which runs row by row after
 * that row's K/V append, so prefill equals one-at-a-time decode bit for bit.
 * mu_forward_capture also copies the residual entering chosen layers (the
 * DFlash assistant's conditioning); it only reads x, so logits are unchanged. */
#include "model/forward.h"
#include "util/mumath.h"
#include <math.h>
#include <stdlib.h>

void mu_scratch_init(mu_forward_scratch *s, const mu_model_config *c, int64_t rows) {
    size_t R = (size_t)rows, E = (size_t)c->n_embd, Q = (size_t)(c->n_head * c->head_dim);
    size_t KV = (size_t)(c->n_head_kv * c->head_dim), F = (size_t)c->n_ff;
    s->rows = rows;
    s->x = mu_xmalloc(R * E * sizeof(float));
    s->h = mu_xmalloc(R * E * sizeof(float));
    s->o = mu_xmalloc(R * E * sizeof(float));
    s->q = mu_xmalloc(R * Q * sizeof(float));
    s->g = mu_xmalloc(R * Q * sizeof(float));
    s->att = mu_xmalloc(R * Q * sizeof(float));
    s->k = mu_xmalloc(R * KV * sizeof(float));
    s->v = mu_xmalloc(R * KV * sizeof(float));
    s->fg = mu_xmalloc(R * F * sizeof(float));
    s->fu = mu_xmalloc(R * F * sizeof(float));
    s->cs = mu_xmalloc(R * (size_t)c->n_rot * sizeof(float));
}

void mu_scratch_free(mu_forward_scratch *s) {
    free(s->x); free(s->h); free(s->o); free(s->q); free(s->g); free(s->att);
    free(s->k); free(s->v); free(s->fg); free(s->fu); free(s->cs);
    memset(s, 0, sizeof *s);
}

/* inv_freq[i] = freq_scale * base^(-2i/n_rot), in double with the engine's own pow. */
double *mu_rope_inv_freq(const mu_model_config *c) {
    int64_t n = c->n_rot / 2;
    double *f = mu_xmalloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        f[i] = (double)c->rope_freq_scale_swa * mu_pow((double)c->rope_base_swa, -2.0 * (double)i / (double)c->n_rot);
    return f;
}

/* (cos, sin) of pos * inv_freq[i], computed in double and rounded to f32 once,
 * on the CPU for every backend. */
static void rope_table(const mu_model_config *c, const double *inv_freq, int64_t p0, int64_t rows, float *cs) {
    int64_t n = c->n_rot / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) {
            double a = (double)(p0 + r) * inv_freq[i];
            cs[(r * n + i) * 2] = (float)mu_cos(a);
            cs[(r * n + i) * 2 + 1] = (float)mu_sin(a);
        }
}

/* y[i] = W[i] x for weights that share their input rows. */
static void matmuls(mu_backend *be, int n, const mu_weight *const *w, const float *x, float *const *y, int64_t rows) {
    if (be->matmul_multi) {
        be->matmul_multi(be, n, w, x, y, rows);
        return;
    }
    for (int i = 0; i < n; i++) be->matmul(be, w[i], x, y[i], rows);
}

static bool attention_block(const mu_model *m, mu_backend *be, mu_kv_cache *kv, mu_forward_scratch *s,
                            const double *inv_freq, int il, int64_t rows, int64_t p0, mu_error *err) {
    const mu_model_config *c = &m->cfg;
    const mu_layer_weights *lw = &m->layers[il];
    const int64_t E = c->n_embd, D = c->head_dim, Q = c->n_head * D, KV = c->n_head_kv * D;
    be->rmsnorm(be, s->x, lw->attn_norm, c->rms_eps, s->h, E, rows);
    matmuls(be, 4, (const mu_weight *[]){&lw->attn_q, &lw->attn_k, &lw->attn_v, &lw->attn_gate}, s->h,
            (float *[]){s->q, s->k, s->v, s->g}, rows);
    be->rmsnorm(be, s->q, lw->attn_q_norm, c->rms_eps, s->q, D, rows * c->n_head);
    be->rmsnorm(be, s->k, lw->attn_k_norm, c->rms_eps, s->k, D, rows * c->n_head_kv);
    if (c->is_swa[il]) {
        rope_table(c, inv_freq, p0, rows, s->cs);
        be->rope(be, s->q, c->n_head, D, c->n_rot, s->cs, rows);
        be->rope(be, s->k, c->n_head_kv, D, c->n_rot, s->cs, rows);
    }
    mu_attn_args a = {
        .kv = &kv->layers[il], .window = c->is_swa[il] ? c->sliding_window : 0,
        .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = D,
        .scale = 1.0f / sqrtf((float)D),
    };
    for (int64_t r = 0; r < rows; r++) {
        /* Callers check capacity and contiguity first; this is the backstop. */
        if (!mu_kv_append(kv, il, p0 + r, s->k + r * KV, s->v + r * KV, err)) return false;
        a.pos = p0 + r;
        be->attention(be, &a, s->q + r * Q, s->att + r * Q);
    }
    be->sigmoid_gate(be, s->att, s->g, rows * Q);
    be->matmul(be, &lw->attn_output, s->att, s->o, rows);
    be->rmsnorm(be, s->o, lw->post_attention_norm, MU_POST_NORM_EPS, s->o, E, rows);
    be->add(be, s->x, s->o, rows * E);
    return true;
}

static void ffn_block(const mu_model *m, mu_backend *be, mu_forward_scratch *s, int il, int64_t rows) {
    const mu_model_config *c = &m->cfg;
    const mu_layer_weights *lw = &m->layers[il];
    const int64_t E = c->n_embd;
    be->rmsnorm(be, s->x, lw->ffn_norm, c->rms_eps, s->h, E, rows);
    matmuls(be, 2, (const mu_weight *[]){&lw->ffn_gate, &lw->ffn_up}, s->h, (float *[]){s->fg, s->fu}, rows);
    be->swiglu(be, s->fg, s->fu, rows * c->n_ff);
    be->matmul(be, &lw->ffn_down, s->fg, s->o, rows);
    be->rmsnorm(be, s->o, lw->post_ffw_norm, MU_POST_NORM_EPS, s->o, E, rows);
    be->add(be, s->x, s->o, rows * E);
}

/* Copy the residual rows entering layer il into their capture slot. */
static void capture_boundary(const mu_capture *cap, int il, const float *x, int64_t E, int64_t rows, int64_t row0) {
    int slot = cap->slot[il];
    if (slot < 0) return;
    const int64_t stride = cap->n * E;
    for (int64_t r = 0; r < rows; r++)
        memcpy(cap->rows + (row0 + r) * stride + slot * E, x + r * E, (size_t)E * sizeof(float));
}

bool mu_forward(const mu_model *m, mu_backend *be, mu_kv_cache *kv, mu_forward_scratch *s,
                const double *inv_freq, const int32_t *tokens, int64_t rows, int64_t p0,
                float *logits, int64_t n_logits, mu_error *err) {
    return mu_forward_capture(m, be, kv, s, inv_freq, tokens, rows, p0, logits, n_logits, NULL, 0, err);
}

bool mu_forward_capture(const mu_model *m, mu_backend *be, mu_kv_cache *kv, mu_forward_scratch *s,
                        const double *inv_freq, const int32_t *tokens, int64_t rows, int64_t p0,
                        float *logits, int64_t n_logits, mu_capture *cap, int64_t row0, mu_error *err) {
    const mu_model_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    if (cap && cap->n == 0) cap = NULL;
    for (int64_t r = 0; r < rows; r++) mu_weight_dequant_row(&m->token_embd, tokens[r], s->x + r * E);
    be->rmsnorm(be, s->x, NULL, c->rms_eps, s->x, E, rows);
    for (int il = 0; il < c->n_layer; il++) {
        if (cap) capture_boundary(cap, il, s->x, E, rows, row0);
        if (!attention_block(m, be, kv, s, inv_freq, il, rows, p0, err)) return false;
        ffn_block(m, be, s, il, rows);
    }
    if (cap) capture_boundary(cap, (int)c->n_layer, s->x, E, rows, row0);
    if (!logits) return true;
    const float *last = s->x + (rows - n_logits) * E;
    be->rmsnorm(be, last, m->output_norm, c->rms_eps, s->h, E, n_logits);
    be->matmul(be, &m->output, s->h, logits, n_logits);
    be->logit_tail(be, logits, c->logit_scale, c->softcap, n_logits * c->n_vocab);
    return true;
}
