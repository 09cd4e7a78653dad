/* The DFlash assistant (docs/speculative.md; tools/train/dflash.py is the reference):
 * a small drafter conditioned on the target's hidden states that proposes a
 * block of tokens in one forward, and the exact greedy speculative loop that
 * verifies those proposals with the target.
 *
 *   ctx   = RMSNorm(fc(concat of target layer inputs at target_layers)) w
 *   block = target.token_embd([anchor, MASK x (block_size-1)])   (no norm)
 *   per layer: a = RMSNorm(h) w; Q = q_norm(Wq a); K/V of block rows from a,
 *              K/V of context rows from ctx (same weights, k_norm on K);
 *              NeoX RoPE at absolute positions; attention over
 *              [context ; block] with no mask inside the block;
 *              h += Wo att; h += Wdown(silu(Wg f) * (Wu f)), f = RMSNorm(h) w
 *   logits = target.output(RMSNorm(h) w_out)    (no logit scale or soft-cap)
 * Context rows are those before the anchor, limited to the 64-row sink plus
 * the last sliding_window rows. */
#ifndef MUSER_SPEC_DFLASH_H
#define MUSER_SPEC_DFLASH_H
#include "gguf/gguf.h"
#include "model/model.h"
#include "backend/backend.h"

#define MU_DFLASH_SINK 64             /* cache ABI constant, not GGUF metadata */
#define MU_DFLASH_DEFAULT_WINDOW 2048 /* used when the key is missing (docs/speculative.md) */

typedef struct mu_dflash_config {
    int64_t n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_ctx_train;
    int64_t block_size;         /* anchor + block_size - 1 mask rows */
    int64_t sliding_window;     /* context rows kept after the sink */
    bool window_defaulted;      /* key missing or 0: MU_DFLASH_DEFAULT_WINDOW */
    float rms_eps, rope_base;
    int32_t mask_token;
    int64_t n_vocab;            /* tokenizer.ggml.tokens */
    int64_t n_target_layers;
    int *target_layers;         /* one-based as stored: input of target layer v (0-based index v) */
} mu_dflash_config;

typedef struct mu_dflash_layer {
    mu_weight q, k, v, o, gate, up, down;
    float *attn_norm, *ffn_norm;    /* [n_embd] */
    float *q_norm, *k_norm;         /* [head_dim] */
} mu_dflash_layer;

typedef struct mu_dflash {
    gguf_file *gguf;
    char *name;
    mu_dflash_config cfg;
    mu_weight fc;                   /* n_target_layers * n_embd -> n_embd */
    float *hidden_norm, *output_norm;
    mu_dflash_layer *layers;
    char tokenizer_sha[65];         /* see mu_dflash_tokenizer_sha */
} mu_dflash;

/* Load and validate a dflash GGUF; NULL with a message naming the key or
 * tensor. A missing sliding_window is accepted with a loud warning on
 * stderr (docs/speculative.md), everything else fails closed. */
mu_dflash *mu_dflash_load(const char *path, mu_error *err);
/* Validate an already-open GGUF (takes ownership of f on success and failure). */
mu_dflash *mu_dflash_from_gguf(gguf_file *f, mu_error *err);
void mu_dflash_free(mu_dflash *d);
/* Give the assistant's matrices to the backend that will run them, for its
 * load-time layouts (model/repack.h); once, before the first forward. */
void mu_dflash_repack(mu_dflash *d, mu_backend *be);
/* Can d draft for target? Hidden size, vocabulary, target layer range and
 * tokenizer identity must match. */
bool mu_dflash_check_target(const mu_dflash *d, const mu_model *target, mu_error *err);
/* SHA-256 (hex) of the tokenizer: the model's tokenizer identity
 * (gguf_sha256_tokenizer) with tokenizer.ggml.mask_token_id left out, so a
 * target and its assistant compare equal. */
void mu_dflash_tokenizer_sha(const gguf_file *f, char hex[65]);

/* ---------------- draft forward (dflash_forward.c) ----------------
 * Per-sequence state: the context K/V of every layer for the committed
 * rows, held as a sink (rows < 64) plus a ring of the last sliding_window
 * rows, each already k-normed and rotated at its absolute position. */
typedef struct mu_dflash_state mu_dflash_state;

mu_dflash_state *mu_dflash_state_new(const mu_dflash *d, const mu_model *target, mu_backend *be);
void mu_dflash_state_free(mu_dflash_state *st);
void mu_dflash_state_reset(mu_dflash_state *st);
/* Committed context rows so far (the next anchor's position). */
int64_t mu_dflash_state_rows(const mu_dflash_state *st);
/* Append n committed target rows (features [n][n_target_layers * n_embd],
 * slots in target_layers order) at positions rows().. ; rows that can no
 * longer be attended to are skipped. features must hold MU_DFLASH_SLACK
 * more readable rows of finite values past its last row: a backend that
 * replays launches projects a fixed count of rows (dflash_forward.c
 * project_context). */
#define MU_DFLASH_CTX_PAD 16 /* rows of a round's projection (it keeps 1..16) */
#define MU_DFLASH_SLACK 64   /* rows of the longest projection */
void mu_dflash_append_context(mu_dflash_state *st, const float *features, int64_t n);
/* A round's n fed rows (speculate.c, rounds on the backend), projected
 * right after their verification, before the round knows which it keeps:
 * row r at position rows() + r, or with tree_reg rows() + the depth of node
 * r of the tree registers (where a kept node ends up); their K and V wait
 * in the state (features: as for append_context, n <= 16). Then
 * mu_dflash_keep_fed(path, keep) stores rows path[0..keep) (ascending;
 * NULL: 0..keep) into the cache slots of rows() .. rows() + keep - 1 (the
 * rest into scratch slots attention never reads) and commits them: the
 * state append_context of those rows would leave (the same products,
 * positions and bits), with nothing buffered or copied between the
 * verification and the next draft. Nothing else may project between the
 * two. */
void mu_dflash_project_fed(mu_dflash_state *st, const float *features, int64_t n, bool tree_reg);
void mu_dflash_keep_fed(mu_dflash_state *st, const int32_t *path, int keep);
/* Whether a round's context rows go into the next draft's launches
 * (MUSER_DFLASH_MERGE=1, mu_dflash_draft), so are buffered until then. */
bool mu_dflash_state_merges(const mu_dflash_state *st);
void mu_dflash_skip_context(mu_dflash_state *st, int64_t n);
/* First mu_dflash_append_context(st, features, n_ctx) (n_ctx may be 0):
 * with MUSER_DFLASH_MERGE=1 a round's few rows are projected in the draft's
 * own launches, the same bits (off by default: slower on the GPU). Then one block at
 * anchor position rows(): writes the argmax (lowest id on ties) of block
 * rows 1..n_prop into proposals, and when logits is non-NULL their logits
 * [n_prop][n_vocab]. 1 <= n_prop < block_size. proposals NULL: into the
 * backend's token registers 0 .. n_prop (argmax_reg, backend.h), nothing
 * to the host. */
void mu_dflash_draft(mu_dflash_state *st, const float *features, int64_t n_ctx, int32_t anchor, int n_prop,
                     int32_t *proposals, float *logits);
/* The same block, its rows 1..n_prop made into a token tree where they lie
 * (the backend's tree_reg, backend.h: tree and token registers, and slot
 * once the work before it has run). */
void mu_dflash_draft_tree(mu_dflash_state *st, const float *features, int64_t n_ctx, int32_t anchor, int n_prop,
                          const int32_t *eog, int n_eog, int32_t *slot);

/* The state as bytes (docs/kvpack.md, "DFlash context"): the held context
 * slots of every layer. bytes: their size for a state of `rows` committed
 * rows; export writes them (host memory), import makes st hold exactly
 * that state. */
int64_t mu_dflash_state_held(const mu_dflash_state *st);
uint64_t mu_dflash_state_bytes(const mu_dflash *d, int64_t rows);
void mu_dflash_state_export(const mu_dflash_state *st, float *out);
void mu_dflash_state_import(mu_dflash_state *st, int64_t rows, const float *in);

#endif
