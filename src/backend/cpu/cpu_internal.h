/* Internals of the CPU backend: the per-ISA kernel table the op drivers
 * (cpu_backend.c, cpu_attention.c) dispatch to. Every kernel reproduces the
 * ref backend bit for bit; each ISA file says how. */
#ifndef MUSER_CPU_INTERNAL_H
#define MUSER_CPU_INTERNAL_H
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_pool.h"

#define CPU_ATTN_BLOCK 256 /* keys per online-softmax block (docs/numerics.md) */
/* Per-thread attention scratch (floats): 16 transposed keys (or two rows),
 * a score block per head and the block's K/V row pointers. */
#define CPU_ATTN_SCRATCH(D, G) (16 * ((D) + 16) + ((G) + 16) * (CPU_ATTN_BLOCK + 16) + 64)

/* One attention call as the kernels see it. */
typedef struct cpu_attn_job {
    const mu_attn_args *a;
    const float *q;    /* [n_head][head_dim] */
    int64_t first;     /* first logical key position */
    int64_t group;     /* query heads per KV head */
    int64_t g0, n_g;   /* the heads of the group this call computes: g0 .. g0 + n_g - 1 */
} cpu_attn_job;

/* Query head g0 of KV head kvh's group (the call's first head). */
static inline const float *cpu_attn_q(const cpu_attn_job *j, int64_t kvh) {
    return j->q + (kvh * j->group + j->g0) * j->a->head_dim;
}

/* Partial result of one 256-key block for the n_g heads of one KV head
 * that a call computes: m[n_g], l[n_g], acc[n_g][head_dim]. */
typedef struct cpu_attn_part {
    float *m, *l, *acc;
} cpu_attn_part;

typedef struct cpu_kernels {
    mu_cpu_isa isa;
    /* The load-time layout these kernels read besides GGUF rows
     * (MU_LAYOUT_X16, MU_LAYOUT_X8; MU_LAYOUT_ROWS: none). */
    uint8_t pack_layout;
    /* Quantized weights: can qmatmul take this weight (type and mode)? */
    bool (*q_supported)(const mu_weight *w);
    /* Bytes of the activation buffer for `rows` rows against w: Q8_K blocks
     * [rows][n_in/256], plus whatever side tables the kernel wants. */
    size_t (*act_bytes)(const mu_weight *w, int64_t rows);
    /* Quantize rows [r0, r1) of x[rows][n_in] into act: Q8_K blocks exactly as
     * mu_quantize_q8k gives them, each block's codes permuted into the order
     * this kernel reads for w's type, plus the side tables of those rows.
     * r0 is a multiple of 16, r1 too or equal to rows. */
    void (*quantize_rows)(const mu_weight *w, const float *x, int64_t r0, int64_t r1, int64_t rows, void *act);
    /* Does quantize_rows write w's blocks only for `rows` rows (no side
     * tables across rows)? Then r0 and r1 may be any rows. NULL: never. */
    bool (*blocks_only)(const mu_weight *w, int64_t rows);
    /* y[r * n_out + o] for o in [o0, o1), r < rows. */
    void (*qmatmul)(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y);
    /* Same for F32/F16/BF16 weights against f32 rows x[rows][n_in]. */
    void (*fmatmul)(const mu_weight *w, int64_t o0, int64_t o1, const float *x, int64_t rows, float *y);
    void (*rmsnorm_row)(const float *x, const float *w, float eps, float *y, int64_t n);
    /* One row: n_heads heads of head_dim, first n_rot dims rotated. */
    void (*rope_row)(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs);
    void (*sigmoid_gate)(float *x, const float *g, int64_t n);
    void (*swiglu)(float *gate, const float *up, int64_t n);
    void (*add)(float *x, const float *y, int64_t n);
    void (*logit_tail)(float *l, float scale, float cap, int64_t n);
    /* Keys [start, end] of KV head kvh into part (the block formulas);
     * scratch holds CPU_ATTN_SCRATCH(head_dim, group) floats, 64-byte aligned. */
    void (*attn_block)(const cpu_attn_job *job, int64_t kvh, int64_t start, int64_t end, cpu_attn_part *part,
                       float *scratch);
    /* out[i] = out[i] * ca + in[i] * cb (the block merge). */
    void (*scale_add2)(float *out, const float *in, float ca, float cb, int64_t n);
    /* out[i] = out[i] / l */
    void (*div_scalar)(float *out, float l, int64_t n);
    /* dst[i] = f16 of src[i], rounded to nearest even (mu_f32_to_f16: the
     * KV store) */
    void (*f16_row)(uint16_t *dst, const float *src, int64_t n);
} cpu_kernels;

extern const cpu_kernels mu_cpu_kernels_scalar;
extern const cpu_kernels mu_cpu_kernels_avx2;
extern const cpu_kernels mu_cpu_kernels_avx512;

#endif
