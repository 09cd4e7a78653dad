/* The reference backend: plain scalar C, one function per op. This file IS
 * the numerical specification (docs/numerics.md); faster backends must
 * reproduce its bits exactly. Compiled with -ffp-contract=off: every fused
 * multiply-add is written as fmaf, every other product and sum rounds. */
#include "backend/backend.h"
#include "util/mumath.h"
#include <math.h>
#include <stdlib.h>

/* ---------- matmul: one canonical row dot per output ---------- */

static void ref_matmul(mu_backend *b, const mu_weight *w, const float *x, float *y, int64_t rows) {
    (void)b;
    bool via_f16 = false;
    bool q8 = mu_weight_uses_q8k(w, &via_f16);
    mu_block_q8k *xq = q8 ? mu_xmalloc((size_t)(w->n_in / MU_QK_K) * sizeof *xq) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * w->n_in;
        if (q8) mu_quantize_q8k(xr, xq, w->n_in, via_f16);
        for (int64_t o = 0; o < w->n_out; o++)
            y[r * w->n_out + o] = mu_weight_dot_row(w, o, xr, xq);
    }
    free(xq);
}

/* ---------- RMSNorm: inv = 1 / sqrt(sumsq / n + eps); y = (x * inv) * w ---------- */

static void ref_rmsnorm(mu_backend *b, const float *x, const float *w, float eps, float *y, int64_t n,
                        int64_t rows) {
    (void)b;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float mean = mu_sumsq_f32(xr, n) / (float)n;
        float inv = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < n; i++) yr[i] = w ? (xr[i] * inv) * w[i] : xr[i] * inv;
    }
}

/* ---------- RoPE: interleaved pairs (ggml mode 0) or NeoX halves ---------- */

static void ref_rope(mu_backend *b, float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                     const float *cs, int64_t rows, bool neox) {
    (void)b;
    if (neox) {
        mu_host_rope_neox(x, n_heads, head_dim, n_rot, cs, rows);
        return;
    }
    const int64_t half = n_rot / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *csr = cs + r * n_rot;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (r * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float c = csr[2 * i], s = csr[2 * i + 1];
                float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * c - x1 * s;
                v[2 * i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

/* ---------- attention: logical-order key blocks, online softmax ---------- */

#define MU_ATTN_BLOCK 256

static void attend_head(const mu_attn_args *a, const float *q, int64_t kv_head, int64_t first, float *out,
                        float *kbuf, float *acc_b) {
    const int64_t D = a->head_dim;
    float M = 0, L = 0;
    for (int64_t d = 0; d < D; d++) out[d] = 0;
    float scores[MU_ATTN_BLOCK];
    for (int64_t start = first; start <= a->pos; start += MU_ATTN_BLOCK) {
        int64_t end = start + MU_ATTN_BLOCK - 1 < a->pos ? start + MU_ATTN_BLOCK - 1 : a->pos;
        float m_b = -INFINITY;
        for (int64_t p = start; p <= end; p++) {
            const uint16_t *k = mu_kv_k(a->kv, mu_attn_key_pos(a, p), kv_head);
            for (int64_t d = 0; d < D; d++) kbuf[d] = mu_f16_to_f32(k[d]);
            float s = mu_dot_f32(q, kbuf, D) * a->scale;
            scores[p - start] = s;
            if (s > m_b) m_b = s;
        }
        float l_b = 0;
        for (int64_t d = 0; d < D; d++) acc_b[d] = 0;
        for (int64_t p = start; p <= end; p++) {
            const uint16_t *v = mu_kv_v(a->kv, mu_attn_key_pos(a, p), kv_head);
            float e = mu_expf(scores[p - start] - m_b);
            l_b = l_b + e;
            for (int64_t d = 0; d < D; d++) acc_b[d] = fmaf(e, mu_f16_to_f32(v[d]), acc_b[d]);
        }
        if (start == first) {
            M = m_b;
            L = l_b;
            for (int64_t d = 0; d < D; d++) out[d] = acc_b[d];
            continue;
        }
        float M2 = m_b > M ? m_b : M;
        float ca = mu_expf(M - M2), cb = mu_expf(m_b - M2);
        L = L * ca + l_b * cb;
        for (int64_t d = 0; d < D; d++) out[d] = out[d] * ca + acc_b[d] * cb;
        M = M2;
    }
    for (int64_t d = 0; d < D; d++) out[d] = out[d] / L;
}

static void attend_row(const mu_attn_args *a, const float *q, float *out) {
    int64_t first = mu_kv_first(a->kv);
    if (a->window > 0 && a->pos - a->window + 1 > first) first = a->pos - a->window + 1;
    float *kbuf = mu_xmalloc((size_t)a->head_dim * 2 * sizeof(float));
    int64_t group = a->n_head / a->n_head_kv;
    for (int64_t h = 0; h < a->n_head; h++)
        attend_head(a, q + h * a->head_dim, h / group, first, out + h * a->head_dim, kbuf, kbuf + a->head_dim);
    free(kbuf);
}

static void ref_attention(mu_backend *b, const mu_attn_batch *ab, const float *q, float *out) {
    (void)b;
    const int64_t Q = ab->n_head * ab->head_dim;
    for (int64_t r = 0; r < ab->rows; r++) {
        mu_attn_args a = mu_attn_row(ab, r);
        attend_row(&a, q + r * Q, out + r * Q);
    }
}

/* ---------- elementwise ---------- */

static void ref_sigmoid_gate(mu_backend *b, float *x, const float *g, int64_t n) {
    (void)b;
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * mu_sigmoidf(g[i]);
}

static void ref_swiglu(mu_backend *b, float *gate, const float *up, int64_t n) {
    (void)b;
    for (int64_t i = 0; i < n; i++) gate[i] = mu_siluf(gate[i]) * up[i];
}

static void ref_add(mu_backend *b, float *x, const float *y, int64_t n) {
    (void)b;
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

/* Scale, then soft-cap (the order is part of the contract: docs/numerics.md). */
static void ref_logit_tail(mu_backend *b, float *l, float scale, float cap, int64_t n) {
    (void)b;
    for (int64_t i = 0; i < n; i++) {
        float v = l[i] * scale;
        l[i] = cap > 0 ? mu_tanhf(v / cap) * cap : v;
    }
}

static void ref_destroy(mu_backend *b) { free(b); }

mu_backend *mu_backend_ref_create(int n_threads) {
    mu_backend *b = mu_xcalloc(1, sizeof *b);
    b->name = "ref";
    b->n_threads = n_threads > 0 ? n_threads : 1;
    b->destroy = ref_destroy;
    mu_backend_set_host_ops(b);
    b->matmul = ref_matmul;
    b->rmsnorm = ref_rmsnorm;
    b->rope = ref_rope;
    b->attention = ref_attention;
    b->trees = true;
    b->sigmoid_gate = ref_sigmoid_gate;
    b->swiglu = ref_swiglu;
    b->add = ref_add;
    b->logit_tail = ref_logit_tail;
    return b;
}
