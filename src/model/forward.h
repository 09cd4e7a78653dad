/* The Muse Glimmer forward pass, written once against mu_backend, over a
 * batch of rows from any number of sequences. */
#ifndef MUSER_FORWARD_H
#define MUSER_FORWARD_H
#include "backend/backend.h"
#include "model/model.h"

/* Activation scratch in backend memory, for batches of up to `rows` rows,
 * plus the host arrays a batch's attention call reads. */
typedef struct mu_forward_scratch {
    mu_backend *be;
    int64_t rows;               /* capacity in rows */
    float *x, *h, *q, *k, *v, *g, *att, *o, *fg, *fu, *cs;
    size_t bytes;               /* backend bytes held */
    const mu_kv_layer **kvl;    /* host [rows] */
    mu_kv_dst *kvd;             /* host [rows]: where kv_store writes each row */
} mu_forward_scratch;

void mu_scratch_init(mu_forward_scratch *s, mu_backend *be, const mu_model_config *c, int64_t rows);
void mu_scratch_free(mu_forward_scratch *s);

/* RoPE inverse frequencies (double), one per rotated pair. */
double *mu_rope_inv_freq(const mu_model_config *c);

/* One forward's rows. Each row names its sequence (an index into the kv
 * array the forward gets), its position and whether it wants logits. The
 * rows of one sequence are consecutive in the batch, at consecutive
 * positions continuing that sequence's cache (the caller checks; the KV
 * store refuses anything else). All arrays are host memory. */
typedef struct mu_batch {
    int64_t n;
    const int32_t *token;       /* [n] */
    const int32_t *seq;         /* [n] */
    const int64_t *pos;         /* [n] */
    const bool *logits;         /* [n]; NULL: none */
    const int64_t *cap_row;     /* [n]: capture row of each row, -1 = none; NULL: none */
    /* Token trees (backend/backend.h mu_attn_tree; backends with `trees`):
     * pos is then where a row is stored (consecutive, as above), tpos the
     * position it stands at (RoPE, the window), tree its ancestors (base <
     * 0: a plain row). NULL: every row stands where it is stored. */
    const int64_t *tpos;        /* [n] */
    const mu_attn_tree *tree;   /* [n] */
    /* The rows are one tree of the backend's tree registers (backend.h
     * mu_tree_regs; row r is node r): tree[r].base is its base, tpos[r] =
     * base + r only bounds the position base + depth[r] (rope_table and
     * attention read the registers). */
    bool tree_reg;
} mu_batch;

/* Optional capture of the residual stream entering chosen layers (the
 * conditioning of a DFlash assistant). Boundary b is the input of layer b;
 * b == n_layer is the stream after the last layer. */
typedef struct mu_capture {
    int64_t n;                  /* boundaries captured per row (0 = off) */
    int *slot;                  /* host [n_layer + 1]: slot of boundary b, -1 = not captured */
    float *rows;                /* backend [cap][n * n_embd], slots side by side */
    int64_t cap;                /* rows allocated */
} mu_capture;

/* Run the batch through the model, storing every row's K/V in kv[seq]. The
 * rows with logits set get final norm + LM head + tail, in row order, into
 * logits (backend [n_logits][n_vocab]). Rows with cap_row >= 0 have their
 * captured boundaries copied to cap->rows row cap_row (only copies: logits
 * are bit-identical with or without it). Every op runs once over all rows;
 * attention runs once per layer, each row seeing its own sequence's keys up
 * to its own position. false only if a KV store is refused (a caller bug:
 * the sequences are then poisoned). */
bool mu_forward(const mu_model *m, mu_backend *be, mu_kv_cache *const *kv, mu_forward_scratch *s,
                const double *inv_freq, const mu_batch *b, float *logits, mu_capture *cap, mu_error *err);

/* y[i] = W[i] x for n weights that share their input rows: one
 * matmul_multi where the backend has it (the same bits as n matmuls). */
void mu_matmuls(mu_backend *be, int n, const mu_weight *const *w, const float *x, float *const *y, int64_t rows);

#endif
