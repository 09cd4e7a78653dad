/* The small op interface the forward pass is written against. Every backend
 * (ref, cpu, cuda) implements these ops and must reproduce the ref backend's
 * bits exactly (docs/numerics.md). Activations are row-major f32 [rows][n].
 *
 * Memory: every float* an op takes (activations, KV planes, logits,
 * captured features) is *backend memory*, allocated by the backend's alloc
 * and possibly not addressable by the host (a device backend). Model code
 * only does pointer arithmetic on it and moves bytes across with upload /
 * download; arrays marked "host" (token ids, positions, physical rows) are
 * ordinary host memory. ref and cpu keep everything in host memory. */
#ifndef MUSER_BACKEND_H
#define MUSER_BACKEND_H
#include "quant/quant.h"
#include "kv/kv.h"

typedef struct mu_backend mu_backend;

/* A token id in the host token arrays of embed and embed_norm that stands
 * for the backend's chained token: the one the last chain_pick chose
 * (engine.c, the greedy chain). Only in a forward of one row. */
#define MU_TOKEN_CHAINED (-1)
/* Token ids standing for the backend's token registers (argmax_reg):
 * MU_TOKEN_REG(i) is register i < MU_TOKEN_REGS, in the host token arrays
 * of embed and embed_norm (speculate.c: a verification fed the draft's
 * proposals where they were picked). */
#define MU_TOKEN_REGS 16
#define MU_TOKEN_REG(i) (-2 - (i))

/* The rows of a token tree (speculative verification, docs/speculative.md
 * "Token trees"): one sequence's run of rows stored at consecutive cache
 * positions base, base + 1, ... in row order (the root first, every parent
 * before its children), each standing at position base + its depth. A
 * query row at position pos sees the committed keys before base as usual
 * and then its ancestors, root first, itself last: the key at position
 * base + t (t = 0 .. pos - base) lies at cache position base + anc[t].
 * So it sees the keys plain decoding would see at pos, in the same order. */
#define MU_TREE_MAX 16
typedef struct mu_attn_tree {
    int64_t base;
    int32_t anc[MU_TREE_MAX];
} mu_attn_tree;

/* The tree registers: a token tree built on the backend (tree_reg below)
 * for the verification that follows, so its shape never visits the host
 * before it runs. Node i (the root 0 first, every parent before its
 * children) has parent[i] (-1 for the root), depth[i], and its ancestors
 * root first in node[i].anc[0 .. depth[i]] (node[i].base unused). Nodes
 * n .. MU_TREE_MAX - 1 are fillers: children of the root (depth 1), never
 * part of a kept path. Host backends keep them in mu_backend.treg; a
 * device backend in its own memory. */
typedef struct mu_tree_regs {
    int32_t n;
    int32_t parent[MU_TREE_MAX], depth[MU_TREE_MAX];
    mu_attn_tree node[MU_TREE_MAX];
} mu_tree_regs;

/* One query row of attention: keys are those of `kv` with logical
 * positions in [pos - window + 1, pos] (window 0 = all held positions <= pos),
 * read from cache position mu_attn_key_pos. */
typedef struct mu_attn_args {
    const mu_kv_layer *kv;
    int64_t pos;
    int64_t window;
    int64_t n_head, n_head_kv, head_dim;
    float scale;                 /* 1/sqrt(head_dim) */
    const mu_attn_tree *tree;    /* NULL: a plain row (key p at cache position p) */
    int64_t tbase;               /* with tree: the tree's base (tree->base may be unused: tree registers) */
} mu_attn_args;

/* Where the key at position p of row a lies in its cache. */
static inline int64_t mu_attn_key_pos(const mu_attn_args *a, int64_t p) {
    return a->tree && p >= a->tbase ? a->tbase + a->tree->anc[p - a->tbase] : p;
}

/* Attention over a batch: row r sees only its own sequence's keys
 * (kv[r]) up to its own position pos[r]. Query rows are already normed and
 * rotated, heads laid out [n_head][head_dim]. */
typedef struct mu_attn_batch {
    int64_t rows;
    const mu_kv_layer *const *kv; /* host [rows] */
    const int64_t *pos;           /* host [rows] */
    int64_t window;
    int64_t n_head, n_head_kv, head_dim;
    float scale;
    const mu_attn_tree *tree;     /* host [rows] or NULL (no tree rows); entries with base < 0 are plain rows */
    /* Not NULL: the tree rows are the tree registers' nodes (row r is node
     * r, the batch one tree alone): tree[r].base is the base, pos[r] =
     * base + r bounds the row's position, base + depth[r]; its ancestors
     * are the registers'. Host backends read *treg (their own registers);
     * a device backend reads its registers where they lie. */
    const mu_tree_regs *treg;
} mu_attn_batch;

/* The single-row description of batch row r. */
static inline mu_attn_args mu_attn_row(const mu_attn_batch *b, int64_t r) {
    const bool t = b->tree && b->tree[r].base >= 0;
    return (mu_attn_args){.kv = b->kv[r], .pos = t && b->treg ? b->tree[r].base + b->treg->depth[r] : b->pos[r],
                          .window = b->window, .n_head = b->n_head, .n_head_kv = b->n_head_kv,
                          .head_dim = b->head_dim, .scale = b->scale,
                          .tree = !t ? NULL : b->treg ? &b->treg->node[r] : &b->tree[r], .tbase = t ? b->tree[r].base : 0};
}

/* One strided copy: copy2d's arguments (copy2d_many). */
typedef struct mu_copy2d {
    void *dst;
    size_t dst_stride;
    const void *src;
    size_t src_stride, width;
    int64_t rows;
} mu_copy2d;

struct mu_backend {
    const char *name;
    void *ctx;
    int n_threads;
    bool trees;                  /* attention takes token-tree rows (mu_attn_tree) */
    int64_t prefill_rows;        /* rows a session's prompt chunk takes by default (0: 512; engine.c caps by depth) */
    void (*destroy)(mu_backend *b);

    /* ---- memory ---- */
    /* `bytes` of backend memory, zero-filled; NULL when it cannot be had. */
    void *(*alloc)(mu_backend *b, size_t bytes);
    void (*free)(mu_backend *b, void *p, size_t bytes);
    /* backend -> backend; the ranges may overlap (memmove semantics). */
    void (*copy)(mu_backend *b, void *dst, const void *src, size_t bytes);
    /* rows of `width` bytes, `dst_stride` / `src_stride` bytes apart,
     * backend -> backend; the ranges do not overlap. */
    void (*copy2d)(mu_backend *b, void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t width,
                   int64_t rows);
    /* Optional (NULL: copy2d for each): n copies (n <= 64) whose
     * destinations overlap neither each other nor any source, as one unit of
     * work (cuda: one launch): the same bytes as the n copy2d calls. */
    void (*copy2d_many)(mu_backend *b, int n, const mu_copy2d *c);
    void (*upload)(mu_backend *b, void *dst, const void *host_src, size_t bytes);
    void (*download)(mu_backend *b, void *host_dst, const void *src, size_t bytes);
    void (*zero)(mu_backend *b, void *dst, size_t bytes);

    /* ---- ops ---- */
    /* x[r] = token_embd row tokens[r] (host ids), dequantized to f32. */
    void (*embed)(mu_backend *b, const mu_weight *w, const int32_t *tokens, int64_t rows, float *x);
    /* y[r][0..n_out) = W x[r] for r < rows (canonical row dot). */
    void (*matmul)(mu_backend *b, const mu_weight *w, const float *x, float *y, int64_t rows);
    /* Optional (NULL: matmul per weight): y[i] = W[i] x for n weights that
     * read the same rows x, as one unit of work, so threads need not wait
     * for each other between them. The same bits as n matmul calls. */
    void (*matmul_multi)(mu_backend *b, int n, const mu_weight *const *w, const float *x, float *const *y,
                         int64_t rows);
    /* y = x * inv_rms(x) [* w] per row of n; w may be NULL (weightless norm). */
    void (*rmsnorm)(mu_backend *b, const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows);
    /* cs[r][i] = (cos, sin) of pos[r] * inv_freq[i], i < n_pairs: computed
     * in double with the engine's own cos/sin and rounded to f32 once.
     * pos and inv_freq are host arrays. tree_reg: row r is node r of the
     * tree registers, pos[r] = base + r, and its position is base +
     * depth[r] (mu_attn_batch.treg). */
    void (*rope_table)(mu_backend *b, const double *inv_freq, int64_t n_pairs, const int64_t *pos, int64_t rows,
                       float *cs, bool tree_reg);
    /* Rotation of the first n_rot dims of each head, in place; cs holds
     * [rows][n_rot/2] (cos, sin) pairs for that row. neox false: interleaved
     * pairs (2i, 2i+1) (GPT-J, ggml mode 0); true: pairs (i, i + n_rot/2). */
    void (*rope)(mu_backend *b, float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs,
                 int64_t rows, bool neox);
    /* Store K and V rows (f32, n_head * head_dim each, rounded to f16 RNE):
     * row r at dst[r] (host [rows]: its layer's planes, physical row, and
     * journal slot, whose old bytes are saved first, kv.h mu_kv_dst). The
     * rows may go to different caches (one store for a batch's sequences). */
    void (*kv_store)(mu_backend *b, int64_t rows, const mu_kv_dst *dst, const float *k, const float *v);
    /* out[r][n_head*head_dim] for every query row of the batch (rows of
     * token trees only where `trees` is set). */
    void (*attention)(mu_backend *b, const mu_attn_batch *a, const float *q, float *out);
    /* x[i] *= sigmoid(g[i]) */
    void (*sigmoid_gate)(mu_backend *b, float *x, const float *g, int64_t n);
    /* gate[i] = silu(gate[i]) * up[i] */
    void (*swiglu)(mu_backend *b, float *gate, const float *up, int64_t n);
    /* x[i] += y[i] */
    void (*add)(mu_backend *b, float *x, const float *y, int64_t n);
    /* logits = cap > 0 ? tanh((l * scale) / cap) * cap : l * scale */
    void (*logit_tail)(mu_backend *b, float *logits, float scale, float cap, int64_t n);
    /* Per row of n, over its first n_valid entries: s = x * scale; m = max s;
     * e = expf(s - m) summed in order into f32; x = e / sum; entries
     * [n_valid, n) become 0. n_valid may change from call to call without
     * changing the launch (backends that replay launches pass it as data). */
    void (*softmax)(mu_backend *b, float *x, float scale, int64_t n, int64_t n_valid, int64_t rows);
    /* out[r] (host) = index of the largest x[r][i], the lowest on ties. */
    void (*argmax)(mu_backend *b, const float *x, int64_t n, int64_t rows, int32_t *out);
    /* The index of the first non-finite value (NaN, +inf, -inf) of x[0..n),
     * n when there is none (util/common.h mu_first_nonfinite's answer), or
     * -1: not scanned here, the caller scans what it downloads. The engine
     * asks once per forward for all its logits rows, so a device backend
     * scans many rows where they are and sends back 8 bytes (and answers -1
     * for a few short rows, where its launch and round trip cost more than
     * the host's scan). */
    int64_t (*first_nonfinite)(mu_backend *b, const float *x, int64_t n);
    /* K and V head rows into per-head slot planes: for row r, head h <
     * n_head, k[(r * n_head + h) * D + d] goes to slot slots[r] (host) of
     * K plane h, kd[(h * S + slot) * D + d], and v's value to V's
     * transposed plane, vd[(h * D + d) * S + slot] (one launch on a device). */
    void (*store_kv_heads)(mu_backend *b, float *kd, float *vd, const int64_t *slots, int64_t S, int64_t D,
                           int64_t n_head, const float *k, const float *v, int64_t rows);
    /* store_kv_heads for n_layers layers: layer l's planes at kd / vd + l *
     * plane_stride and its rows at k / v + l * src_stride (floats), the
     * same slots (one launch on a device). */
    void (*store_kv_heads_layers)(mu_backend *b, float *kd, float *vd, int64_t plane_stride, const int64_t *slots,
                                  int64_t S, int64_t D, int64_t n_head, const float *k, const float *v,
                                  int64_t src_stride, int64_t rows, int64_t n_layers);

    /* ---- optional fused ops (NULL: the forward runs the ops they stand
     * for, one by one; a fused op gives the same bits) ---- */
    /* The sandwich residual step over rows of n: x += rmsnorm(o, eps_o) * w_o
     * (w_o NULL: x += o, the DFlash assistant's plain residual); then, if h:
     * h = rmsnorm(x, eps_h) * w_h. o's contents may be lost. */
    void (*residual)(mu_backend *b, float *x, float *o, const float *w_o, float eps_o, float *h, const float *w_h,
                     float eps_h, int64_t n, int64_t rows);
    /* residual(...), and each row r of the new x (n floats) also to cap +
     * r * cap_stride: a hidden-state capture of the next layer's input
     * (src/model/forward.c) in the same launch, not a copy after it. */
    void (*residual_capture)(mu_backend *b, float *x, float *o, const float *w_o, float eps_o, float *h,
                             const float *w_h, float eps_h, int64_t n, int64_t rows, float *cap, int64_t cap_stride);
    /* Per-head rmsnorm of q (rows x nq heads; nq may be 0) and k (rows x nk
     * heads) with the head_dim weights wq, wk and eps; then, if cs, rope
     * (interleaved, or NeoX with neox) on both; then, if dst, kv_store(rows,
     * dst, k, v) of the result (the same bytes as the separate ops, in one
     * launch). */
    void (*qk_norm_rope)(mu_backend *b, float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk,
                         int64_t head_dim, float eps, const float *cs, int64_t n_rot, int64_t rows,
                         const mu_kv_dst *dst, const float *v, bool neox);
    /* qk_norm_rope(..., dst NULL, ...), then store_kv_heads(kd, vd, slots,
     * S, head_dim, nk, k, v, rows) of the result: the DFlash assistant's
     * norm, rotation and K/V store (src/spec/dflash_forward.c) in one
     * launch, the same bytes. */
    void (*qk_norm_rope_heads)(mu_backend *b, float *q, const float *wq, int64_t nq, float *k, const float *wk,
                               int64_t nk, int64_t head_dim, float eps, const float *cs, int64_t n_rot, int64_t rows,
                               bool neox, float *kd, float *vd, const int64_t *slots, int64_t S, const float *v);
    /* The forward's entry: embed(w, tokens, rows, x), rmsnorm(x, NULL, eps,
     * x, w->n_in, rows), rmsnorm(x, w_h, eps, h, w->n_in, rows). */
    void (*embed_norm)(mu_backend *b, const mu_weight *w, const int32_t *tokens, int64_t rows, float eps,
                       const float *w_h, float *x, float *h);
    /* attention(a, q, out), then sigmoid_gate(out, g, rows * n_head *
     * head_dim) (the same bits, in one launch where the backend can). */
    void (*attention_gate)(mu_backend *b, const mu_attn_batch *a, const float *q, const float *g, float *out);
    /* The DFlash assistant's attention (src/spec/dflash_forward.c), for query
     * rows r < rows and heads h < n_head, KV head g = h / (n_head / n_head_kv):
     * s[j] = dot(k[g][j], q[r][h]) for keys j < n_valid (the float dot of
     * docs/numerics.md), p = softmax(s, scale), out[r][h][d] =
     * dot(v[g][d][0 .. n_valid), p): the same bits as the matmul / softmax /
     * matmul per KV head over the n_valid keys. k is [n_head_kv][slots][D],
     * v [n_head_kv][D][slots] (transposed); q and out [rows][n_head][D];
     * n_keys >= n_valid bounds the keys of any call with this launch shape
     * (n_valid may change between calls without changing the launch). */
    void (*dense_attention)(mu_backend *b, const float *q, int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t D,
                            const float *k, const float *v, int64_t slots, int64_t n_keys, int64_t n_valid, float scale,
                            float *out);

    /* Optional: the engine brackets a forward of few rows (decode,
     * verification) with these, key naming the batch's shape, so that a
     * backend can replay its launches as one graph (cuda_backend.c). ok is
     * false when the forward failed. */
    void (*forward_begin)(mu_backend *b, uint64_t key);
    void (*forward_end)(mu_backend *b, bool ok);

    /* Optional (NULL: host memory, src/bench/membw.c): the read bandwidth
     * of the memory this backend's weights live in, in GB/s, over a buffer
     * of `bytes` (best of reps passes); false when it cannot be measured
     * (e.g. the buffer does not fit). For muser bench's % figures. */
    bool (*read_bandwidth)(mu_backend *b, size_t bytes, int reps, double *gbs);

    /* Optional (NULL: malloc and free): host memory that download writes
     * straight into (cuda: page-locked, so no copy through a staging
     * buffer). The engine keeps each session's logits row there. NULL when
     * it cannot be had. */
    void *(*host_alloc)(mu_backend *b, size_t bytes);
    void (*host_free)(mu_backend *b, void *p, size_t bytes);

    /* Optional (NULL: no greedy chain; engine.c muser_session_decode_chain):
     * chain_pick looks at the logits row x[0..n) where it lies: its first
     * maximum (the lowest index among equal maxima, float equality) becomes
     * the chained token (MU_TOKEN_CHAINED) of the next forward, and slot
     * (2 int32 of host_alloc memory; slot[1] zeroed by the caller) gets,
     * once the work before it has run, {token, 1} when that maximum is
     * unique and every value finite (then it is exactly the draw of a
     * greedy chain, docs/sampling.md), else {0, 2}: the caller must look at
     * the row itself. A forward of few rows may end with it (inside
     * forward_begin / forward_end: it is replayed with the forward).
     * chain_wait returns once slot[1] is not 0; false, with err, when the
     * backend failed or finished its work without writing it. */
    void (*chain_pick)(mu_backend *b, const float *x, int64_t n, int32_t *slot);
    bool (*chain_wait)(mu_backend *b, volatile int32_t *slot, mu_error *err);
    int32_t chained; /* host backends: the chained token */
    /* Optional (NULL both: a speculative round goes through the host,
     * speculate.c): argmax_reg sets token register r (MU_TOKEN_REG(r)) to
     * argmax's answer for row r of x [rows][n], rows <= MU_TOKEN_REGS,
     * nothing to the host. pick_rows looks at rows r < rows of x [rows][n]
     * where they lie and, once the work before it has run, writes slot[2r]
     * = the first maximum of row r and slot[2r + 1] = 1 when that maximum
     * is unique and the row finite (chain_pick's rule), else 2; before the
     * flag of row 0, slot[2 rows + i] = register i for i < n_regs. slot is
     * host_alloc memory, the flags zeroed by the caller; chain_wait(&slot[2r])
     * waits for row r. Either may end a forward bracket (it is replayed). */
    void (*argmax_reg)(mu_backend *b, const float *x, int64_t n, int64_t rows);
    void (*pick_rows)(mu_backend *b, const float *x, int64_t n, int64_t rows, int n_regs, int32_t *slot);
    int32_t regs[MU_TOKEN_REGS]; /* host backends: the token registers */
    uint64_t reg_epoch;          /* drafts that set the token registers so far (src/spec/dflash_forward.c) */
    /* Optional (NULL: trees are built on the host, speculate.c): the
     * token tree over the draft's rows x [rows][n] (rows < MU_TREE_MAX),
     * built as mu_spec_tree_build builds it (src/spec/spec_tree.h; eog:
     * host [n_eog], n_eog <= MU_SPEC_TREE_EOG_MAX), into the tree registers
     * (nodes rows + 1 .. MU_TREE_MAX - 1 and any the tree lacks are
     * fillers) and the token registers (register i = node i + 1's token, 0
     * for fillers, i < rows); and, once the work before it has run,
     * slot[0] = the nodes n, slot[1 + i] = node i's parent, slot[1 +
     * MU_TREE_MAX + i] = its token (the root's: -1), i < MU_TREE_MAX
     * (MU_SPEC_TREE_SLOT int32 of host_alloc memory; no flag: it is written
     * before any later op's, e.g. pick_rows'). May end a forward bracket. */
    void (*tree_reg)(mu_backend *b, const float *x, int64_t n, int64_t rows, const int32_t *eog, int n_eog,
                     int32_t *slot);
    mu_tree_regs treg; /* host backends: the tree registers */

    /* ---- load time ---- */
    /* Optional (NULL: none), called once per weight at load before any op
     * reads it: wants_repack says whether this backend has a faster layout
     * for w; repack rewrites w's bytes into it in place (`data` is w->data,
     * writable) and sets w->layout. */
    bool (*wants_repack)(mu_backend *b, const mu_weight *w);
    /* Optional: should the weights be copied into anonymous huge-page memory
     * at load (gguf_make_resident), before any repack? */
    bool (*wants_resident)(mu_backend *b);
    void (*repack)(mu_backend *b, mu_weight *w, uint8_t *data);
    /* Optional (NULL: none), called at load after the weights for each
     * vector of n floats the ops read as a weight (the norms, never NULL;
     * repack.h: mu_hold_vectors): a device
     * backend copies it now; otherwise its first use would upload it, a
     * synchronous copy inside the first forward (CUDA: each one a gap of
     * tens of microseconds in which the GPU waits, docs/cuda.md). */
    void (*hold)(mu_backend *b, const float *v, int64_t n);
};

mu_backend *mu_backend_ref_create(int n_threads);

/* The host-memory implementations that ref and cpu share (host_ops.c):
 * memory, embed, rope_table, kv_store, softmax, argmax, first_nonfinite,
 * store_kv_heads. They
 * are the reference for these ops. */
void mu_backend_set_host_ops(mu_backend *b);
/* The K and V rows of one head for the keys at positions [pos, pos + n)
 * of row a (mu_kv_head_rows, with a token tree's keys taken from where they
 * lie: mu_attn_key_pos). false, filling nothing, unless every key is held. */
bool mu_attn_head_rows(const mu_attn_args *a, int64_t pos, int64_t n, int64_t head, const uint16_t **k,
                       const uint16_t **v);
/* kv_store's save step on host planes (ref and cpu). */
void mu_host_kv_save(int64_t rows, const mu_kv_dst *dst);
/* The NeoX rotation (rope with neox true) on host rows: ref and cpu both
 * run this one (only the DFlash assistant uses it). */
void mu_host_rope_neox(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs, int64_t rows);

/* A matrix of activations as an F32 weight for matmul: n_out rows of n_in
 * values, `stride` floats apart, in backend memory (the DFlash assistant's
 * attention products). */
mu_weight mu_f32_matrix(const float *data, int64_t n_in, int64_t n_out, int64_t stride);

/* Backend memory with a failure that names what it was for (aborts: out
 * of memory for scratch is not recoverable mid-forward). */
void *mu_backend_xalloc(mu_backend *b, size_t bytes, const char *what);

#endif
