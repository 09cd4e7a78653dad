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

/* Run rows tokens at positions p0.. through the model, appending K/V.
 * Caller has validated token ids, contiguity and capacity. If logits is
 * non-NULL, the final norm + LM head + tail run for the last n_logits rows
 * and write logits[n_logits][n_vocab]. false only if a KV append is
 * refused (a caller bug: the session is then poisoned). */
bool mu_forward(const mu_model *m, mu_backend *be, mu_kv_cache *kv, mu_forward_scratch *s,
                const double *inv_freq, const int32_t *tokens, int64_t rows, int64_t p0,
                float *logits, int64_t n_logits, mu_error *err);

#endif
