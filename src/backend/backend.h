/* The small op interface the forward pass is written against. Every backend
 * (ref, cpu, cuda) implements these ops and must reproduce the ref backend's
 * bits exactly (docs/numerics.md). Activations are row-major f32 [rows][n]. */
#ifndef MUSER_BACKEND_H
#define MUSER_BACKEND_H
#include "quant/quant.h"
#include "kv/kv.h"

typedef struct mu_backend mu_backend;

/* One attention call: query rows (already normed and rotated), heads laid
 * out [n_head][head_dim]; keys are those of `kv` with logical positions in
 * [pos - window + 1, pos] (window 0 = all held positions <= pos). */
typedef struct mu_attn_args {
    const mu_kv_layer *kv;
    int64_t pos;
    int64_t window;
    int64_t n_head, n_head_kv, head_dim;
    float scale;                 /* 1/sqrt(head_dim) */
} mu_attn_args;

struct mu_backend {
    const char *name;
    void *ctx;
    int n_threads;
    void (*destroy)(mu_backend *b);
    /* y[r][0..n_out) = W x[r] for r < rows (canonical row dot). */
    void (*matmul)(mu_backend *b, const mu_weight *w, const float *x, float *y, int64_t rows);
    /* Optional (NULL: matmul per weight): y[i] = W[i] x for n weights that
     * read the same rows x, as one unit of work, so threads need not wait
     * for each other between them. The same bits as n matmul calls. */
    void (*matmul_multi)(mu_backend *b, int n, const mu_weight *const *w, const float *x, float *const *y,
                         int64_t rows);
    /* y = x * inv_rms(x) [* w] per row of n; w may be NULL (weightless norm). */
    void (*rmsnorm)(mu_backend *b, const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows);
    /* Interleaved (GPT-J) rotation of the first n_rot dims of each head, in
     * place; cs holds [rows][n_rot/2] (cos, sin) pairs for that row. */
    void (*rope)(mu_backend *b, float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot,
                 const float *cs, int64_t rows);
    /* out[n_head*head_dim] for one query row. */
    void (*attention)(mu_backend *b, const mu_attn_args *a, const float *q, float *out);
    /* x[i] *= sigmoid(g[i]) */
    void (*sigmoid_gate)(mu_backend *b, float *x, const float *g, int64_t n);
    /* gate[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(mu_backend *b, float *gate, const float *up, int64_t n);
    /* x[i] += y[i] */
    void (*add)(mu_backend *b, float *x, const float *y, int64_t n);
    /* Optional (NULL: none), called once per weight at load before any op
     * reads it: wants_repack says whether this backend has a faster layout
     * for w; repack rewrites w's bytes into it in place (`data` is w->data,
     * writable) and sets w->layout. */
    bool (*wants_repack)(mu_backend *b, const mu_weight *w);
    /* Optional: should the weights be copied into anonymous huge-page memory
     * at load (gguf_make_resident), before any repack? */
    bool (*wants_resident)(mu_backend *b);
    void (*repack)(mu_backend *b, mu_weight *w, uint8_t *data);
    /* logits = cap > 0 ? tanh((l * scale) / cap) * cap : l * scale */
    void (*logit_tail)(mu_backend *b, float *logits, float scale, float cap, int64_t n);
};

mu_backend *mu_backend_ref_create(int n_threads);

#endif
