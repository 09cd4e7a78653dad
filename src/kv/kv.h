/* Two-class KV cache (docs/model.md; storage and order: docs/numerics.md, "KV store"), f16 storage.
 *  - Sliding (SWA) layers: a ring of min(n_ctx, window + slack) rows, where
 *    slack is the most rows one forward stores for this sequence minus one:
 *    a batch stores all its rows before attention reads any, so the ring
 *    must still hold the window of the batch's first row. Metadata
 *    origin_logical / origin_physical / len says which logical positions
 *    live where: logical p is at physical (origin_physical + p - origin_logical) % cap.
 *  - Full (NoPE) layers: a growing plane, row p at physical p.
 * Appends are fail-closed: position must equal origin_logical + len.
 * Checkpoint/rollback covers up to MU_KV_MAX_ROLLBACK rows per layer; every
 * journaled append saves the row it overwrites (held or not), so a rollback
 * restores the planes bit for bit, including the ring's rotation.
 * Snapshots copy rows and keep the ring's physical rotation.
 * Storage is head-major: each KV head's rows form one contiguous plane.
 * The planes are backend memory (backend/backend.h): this module keeps the
 * bookkeeping and asks the backend to store, copy, read and zero rows.
 * Invariants: physical rows not currently held are all zero; logical
 * position p always lives at physical row p % cap. */
#ifndef MUSER_KV_H
#define MUSER_KV_H
#include "util/common.h"

#define MU_KV_MAX_ROLLBACK 16

typedef struct mu_backend mu_backend;

typedef struct mu_kv_layer {
    bool swa;
    int64_t cap;              /* rows allocated */
    int64_t n_head, head_dim; /* KV heads and their size */
    int64_t row_elems;        /* n_head * head_dim: one position's K (or V) */
    uint16_t *k, *v;          /* backend memory: f16, head-major [n_head][cap][head_dim], zero-filled at creation */
    int64_t origin_logical;   /* oldest logical position held */
    int64_t origin_physical;  /* its physical row */
    int64_t len;              /* rows held */
} mu_kv_layer;

/* Where the backend's kv_store writes one row: physical row `physical`
 * (every head) of layer l's planes. With jk set (a checkpoint's journal)
 * the row's old bytes go first to row `slot` of the head-major journal
 * planes jk and jv of jcap rows each. Rows of one store may belong to
 * different caches (the sequences of a batch). */
typedef struct mu_kv_dst {
    const mu_kv_layer *l;
    int64_t physical;
    uint16_t *jk, *jv;
    int64_t jcap, slot;
} mu_kv_dst;

typedef struct mu_kv_journal_entry {
    int layer;
    int64_t pos;              /* logical position appended */
    int64_t physical;         /* row overwritten */
    int64_t prev_origin_logical, prev_origin_physical, prev_len;
    int64_t slot;             /* its old contents: row `slot` of the journal planes */
} mu_kv_journal_entry;

typedef struct mu_kv_cache {
    mu_backend *be;           /* owner of the planes */
    int n_layers;
    int64_t n_ctx;            /* maximum logical positions */
    int64_t window;           /* sliding window (0 = none) */
    int64_t slack;            /* extra ring rows (see the top of this file) */
    mu_kv_layer *layers;
    /* checkpoint */
    bool ckpt_active;
    int64_t ckpt_pos;         /* logical length at checkpoint */
    int n_journal;
    mu_kv_journal_entry *journal; /* capacity n_layers * MU_KV_MAX_ROLLBACK */
    uint16_t *jk, *jv;        /* journal planes (backend memory), head-major, one row per entry */
} mu_kv_cache;

/* be == NULL: host memory (the ops ref and cpu share). */
bool mu_kv_init(mu_kv_cache *c, mu_backend *be, int n_layers, const bool *is_swa, int64_t window, int64_t slack,
                int64_t n_ctx, int64_t n_head, int64_t head_dim, mu_error *err);
void mu_kv_free(mu_kv_cache *c);
void mu_kv_clear(mu_kv_cache *c);
/* Length every layer agrees on (layer 0's end). */
int64_t mu_kv_len(const mu_kv_cache *c);

/* Store K and V rows (f32 in backend memory, rounded to f16 RNE at the
 * store) for logical positions [pos, pos + n): n_head * head_dim values per
 * row, heads in order. Refuses a discontinuity, a full context, more rows
 * than the checkpoint allows, or more rows than the ring's slack. */
bool mu_kv_store(mu_kv_cache *c, int layer, int64_t pos, int64_t n, const float *k, const float *v, mu_error *err);
/* The bookkeeping of mu_kv_store without the write: the same checks, the
 * layer's ring and the journal advanced, and dst[0..n) filled; the caller
 * then passes dst to the backend's kv_store (with other caches' rows in
 * one call) before anything reads the layer. */
bool mu_kv_reserve(mu_kv_cache *c, int layer, int64_t pos, int64_t n, mu_kv_dst *dst, mu_error *err);
static inline bool mu_kv_append(mu_kv_cache *c, int layer, int64_t pos, const float *k, const float *v, mu_error *err) {
    return mu_kv_store(c, layer, pos, 1, k, v, err);
}
/* Logical positions held by a layer: [first, first + count). */
static inline int64_t mu_kv_first(const mu_kv_layer *l) { return l->origin_logical; }
static inline int64_t mu_kv_count(const mu_kv_layer *l) { return l->len; }
static inline int64_t mu_kv_end(const mu_kv_layer *l) { return l->origin_logical + l->len; }
/* Host backends only (the planes are host memory):
 * one head's K or V (head_dim values) at a logical position; NULL when pos
 * is not held or head is out of range. Each head's plane is contiguous (the
 * head-major layout of docs/numerics.md), so attention over consecutive positions of one
 * head streams one address range; a ring wraps once. */
const uint16_t *mu_kv_k(const mu_kv_layer *l, int64_t pos, int64_t head);
const uint16_t *mu_kv_v(const mu_kv_layer *l, int64_t pos, int64_t head);
/* The same for the n positions [pos, pos + n) of one head, into k[0..n) and
 * v[0..n), walking the ring once (no division per row). Returns false,
 * filling nothing, unless every position is held and head is in range. */
bool mu_kv_head_rows(const mu_kv_layer *l, int64_t pos, int64_t n, int64_t head, const uint16_t **k,
                     const uint16_t **v);

/* Checkpoint at the current length (all layers must agree; fails if one is
 * already active); rollback to any pos in [ckpt_pos, shortest layer length]
 * restores every layer to its exact state at length pos and keeps the
 * checkpoint active; commit drops the journal. Appending more than
 * MU_KV_MAX_ROLLBACK rows per layer past a checkpoint fails. clear and
 * snapshot restore also drop an active checkpoint. */
bool mu_kv_checkpoint(mu_kv_cache *c, mu_error *err);
bool mu_kv_rollback(mu_kv_cache *c, int64_t pos, mu_error *err);
void mu_kv_commit(mu_kv_cache *c);

/* Copy the rows at positions from[i] to positions to[i] (every layer, K
 * and V), i = 0 .. n-1 in order: a token tree's kept path moved to where
 * plain decoding would have stored it (docs/speculative.md "Token trees").
 * Needs an active checkpoint at or before every to[i] (whose old bytes the
 * journal then holds, so a rollback still restores them) and every
 * position held; refused otherwise, nothing moved. */
bool mu_kv_move(mu_kv_cache *c, const int64_t *from, const int64_t *to, int n, mu_error *err);

/* Make dst hold src's first n positions (everything attention at position
 * n onward reads: full planes [0, n), rings the n_ctx..window tail), as an
 * uninterrupted run to n would. Same geometry; fails when src no longer
 * holds a needed row (its ring has moved past n) or n exceeds src's length.
 * dst's checkpoint is dropped. */
bool mu_kv_fork(mu_kv_cache *dst, const mu_kv_cache *src, int64_t n, mu_error *err);

/* Keep only positions [0, n): later rows are zeroed. Fails (nothing
 * changed) when a ring no longer holds the window before n, or while a
 * checkpoint is active. n >= the length is a no-op. */
bool mu_kv_truncate(mu_kv_cache *c, int64_t n, mu_error *err);

/* Snapshot: deep copy of held rows and metadata (physical rotation kept).
 * take returns NULL when out of memory; restore fails on any geometry
 * difference (layers, n_ctx, window, layer kinds, row size). */
typedef struct mu_kv_snapshot mu_kv_snapshot;
mu_kv_snapshot *mu_kv_snapshot_take(const mu_kv_cache *c);
bool mu_kv_snapshot_restore(mu_kv_cache *c, const mu_kv_snapshot *s, mu_error *err);
void mu_kv_snapshot_free(mu_kv_snapshot *s);

/* Row transfer by logical position, for durable packs (src/kvpack/):
 * host buffers are head-major [n_head][n][head_dim] f16, K then V apart.
 * read copies held positions [pos, pos + n) out through the backend's
 * download op (false, nothing written, unless all are held). place
 * appends them to a layer: pos must be the layer's end, or the layer must
 * be empty (it then starts at pos, at physical row pos % cap, the
 * invariant above); n may not exceed the free rows of the ring or plane.
 * Only whole-cache staging uses place (nothing is journaled). */
bool mu_kv_read(const mu_kv_cache *c, int layer, int64_t pos, int64_t n, uint16_t *k, uint16_t *v, mu_error *err);
bool mu_kv_place(mu_kv_cache *c, int layer, int64_t pos, int64_t n, const uint16_t *k, const uint16_t *v,
                 mu_error *err);

#endif
