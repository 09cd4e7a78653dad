/* The Muse Glimmer forward pass, written once against mu_backend. */
#ifndef MUSER_FORWARD_H
#define MUSER_FORWARD_H
#include "backend/backend.h"
#include "model/model.h"

typedef struct mu_forward_scratch {
    int64_t rows;               /* capacity in rows */
    float *x, *h, *q, *k, *v, *g, *att, *o, *fg, *fu, *cs;
} mu_forward_scratch;

void mu_scratch_init(mu_forward_scratch *s, const mu_model_config *c, int64_t rows);
void mu_scratch_free(mu_forward_scratch *s);

/* RoPE inverse frequencies (double), one per rotated pair. */
double *mu_rope_inv_freq(const mu_model_config *c);

/* Optional capture of the residual stream entering chosen layers (the
 * conditioning of a DFlash assistant). Boundary b is the input of layer b;
 * b == n_layer is the stream after the last layer. */
typedef struct mu_capture {
    int64_t n;                  /* boundaries captured per row (0 = off) */
    int *slot;                  /* [n_layer + 1]: slot of boundary b, -1 = not captured */
    float *rows;                /* [cap][n * n_embd], slots side by side */
    int64_t cap;                /* rows allocated */
} mu_capture;

/* Run rows tokens at positions p0.. through the model, appending K/V.
 * Caller has validated token ids, contiguity and capacity. If logits is
 * non-NULL, the final norm + LM head + tail run for the last n_logits rows
 * and write logits[n_logits][n_vocab]. false only if a KV append is
 * refused (a caller bug: the session is then poisoned). */
bool mu_forward(const mu_model *m, mu_backend *be, mu_kv_cache *kv, mu_forward_scratch *s,
                const double *inv_freq, const int32_t *tokens, int64_t rows, int64_t p0,
                float *logits, int64_t n_logits, mu_error *err);
/* The same, also writing the captured boundaries of each row r to
 * cap->rows row (row0 + r) when cap is non-NULL (cap->cap >= row0 + rows).
 * Capturing only copies: logits are bit-identical with or without it. */
bool mu_forward_capture(const mu_model *m, mu_backend *be, mu_kv_cache *kv, mu_forward_scratch *s,
                        const double *inv_freq, const int32_t *tokens, int64_t rows, int64_t p0,
                        float *logits, int64_t n_logits, mu_capture *cap, int64_t row0, mu_error *err);

#endif
