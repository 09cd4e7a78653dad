/* Scalar kernels: the reference functions themselves (src/quant/weight_row.c,
 * src/util/mumath.c), sliced so that the CPU backend's thread pool can share
 * the work. The fallback for CPUs without AVX2, and the oracle of the tests. */
#include "backend/cpu/cpu_internal.h"
#include "util/mumath.h"
#include <math.h>

static bool scalar_q_supported(const mu_weight *w) { return mu_weight_uses_q8k(w, NULL); }

static size_t scalar_act_bytes(const mu_weight *w, int64_t rows) {
    return (size_t)(rows * (w->n_in / MU_QK_K)) * sizeof(mu_block_q8k);
}

static void scalar_quantize_rows(const mu_weight *w, const float *x, int64_t r0, int64_t r1, int64_t rows, void *act) {
    (void)rows;
    bool via_f16 = false;
    mu_weight_uses_q8k(w, &via_f16);
    const int64_t nb = w->n_in / MU_QK_K;
    mu_block_q8k *xq = act;
    for (int64_t r = r0; r < r1; r++) mu_quantize_q8k(x + r * w->n_in, xq + r * nb, w->n_in, via_f16);
}

static void scalar_qmatmul(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) {
    const int64_t nb = w->n_in / MU_QK_K;
    const mu_block_q8k *xq = act;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = o0; o < o1; o++) y[r * w->n_out + o] = mu_weight_dot_row(w, o, NULL, xq + r * nb);
}

static void scalar_fmatmul(const mu_weight *w, int64_t o0, int64_t o1, const float *x, int64_t rows, float *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = o0; o < o1; o++) y[r * w->n_out + o] = mu_weight_dot_row(w, o, x + r * w->n_in, NULL);
}

static void scalar_rmsnorm_row(const float *x, const float *w, float eps, float *y, int64_t n) {
    float mean = mu_sumsq_f32(x, n) / (float)n;
    float inv = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) y[i] = w ? (x[i] * inv) * w[i] : x[i] * inv;
}

static void scalar_rope_row(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs) {
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        for (int64_t i = 0; i < n_rot / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * c - x1 * s;
            v[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

static void scalar_sigmoid_gate(float *x, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * mu_sigmoidf(g[i]);
}

static void scalar_swiglu(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) gate[i] = mu_siluf(gate[i]) * up[i];
}

static void scalar_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

static void scalar_logit_tail(float *l, float scale, float cap, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = l[i] * scale;
        l[i] = cap > 0 ? mu_tanhf(v / cap) * cap : v;
    }
}

/* The ref's block body for each head of the group. */
static void scalar_attn_block(const cpu_attn_job *job, int64_t kvh, int64_t start, int64_t end,
                              cpu_attn_part *part, float *scratch) {
    const mu_attn_args *a = job->a;
    const int64_t D = a->head_dim, n = end - start + 1;
    float *kbuf = scratch, *scores = scratch + D + 16;
    for (int64_t g = 0; g < job->n_g; g++) {
        const float *q = cpu_attn_q(job, kvh) + g * D;
        float m_b = -INFINITY;
        for (int64_t p = 0; p < n; p++) {
            const uint16_t *k = mu_kv_k(a->kv, mu_attn_key_pos(a, start + p), kvh);
            for (int64_t d = 0; d < D; d++) kbuf[d] = mu_f16_to_f32(k[d]);
            float s = mu_dot_f32(q, kbuf, D) * a->scale;
            scores[p] = s;
            if (s > m_b) m_b = s;
        }
        float l_b = 0.0f, *acc = part->acc + g * D;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
        for (int64_t p = 0; p < n; p++) {
            const uint16_t *v = mu_kv_v(a->kv, mu_attn_key_pos(a, start + p), kvh);
            float e = mu_expf(scores[p] - m_b);
            l_b = l_b + e;
            for (int64_t d = 0; d < D; d++) acc[d] = fmaf(e, mu_f16_to_f32(v[d]), acc[d]);
        }
        part->m[g] = m_b;
        part->l[g] = l_b;
    }
}

static void scalar_scale_add2(float *out, const float *in, float ca, float cb, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = out[i] * ca + in[i] * cb;
}

static void scalar_div_scalar(float *out, float l, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = out[i] / l;
}

static void scalar_f16_row(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mu_f32_to_f16(src[i]);
}

const cpu_kernels mu_cpu_kernels_scalar = {
    .isa = MU_CPU_ISA_SCALAR,
    .q_supported = scalar_q_supported,
    .act_bytes = scalar_act_bytes,
    .quantize_rows = scalar_quantize_rows,
    .qmatmul = scalar_qmatmul,
    .fmatmul = scalar_fmatmul,
    .rmsnorm_row = scalar_rmsnorm_row,
    .rope_row = scalar_rope_row,
    .sigmoid_gate = scalar_sigmoid_gate,
    .swiglu = scalar_swiglu,
    .add = scalar_add,
    .logit_tail = scalar_logit_tail,
    .attn_block = scalar_attn_block,
    .scale_add2 = scalar_scale_add2,
    .div_scalar = scalar_div_scalar,
    .f16_row = scalar_f16_row,
};
