/* The DFlash draft forward (tools/train/dflash.py is its reference;
 * docs/speculative.md) over the target's backend: every op is a backend op
 * and every activation lives in backend memory. Matrix products go through
 * mu_backend.matmul (the canonical row dot of each weight type); attention
 * is two F32 matmuls per KV head (scores = Q K^T over [context ; block]
 * keys, then P V with V transposed) with the backend's softmax in between;
 * RoPE is the backend's NeoX rotation (rotate_half).
 *
 * Context cache: per layer and KV head, the K (k-normed, rotated at its
 * absolute position) and V (stored transposed, one plane per dimension, so
 * P V reads it as matmul rows) of every committed row that can still be
 * attended to: rows < 64 (the sink) at slot = pos, later rows in a ring of
 * sliding_window slots at 64 + (pos - 64) % window. Attention is unmasked
 * and keys are already rotated, so slot order does not matter; each round
 * projects only the rows committed since the last one. The block's own K/V
 * are written right after the held slots (never past block_size spare
 * slots), so the keys of one head are always one contiguous matrix and
 * its V planes contiguous prefixes. */
#include "spec/dflash.h"
#include "model/forward.h"
#include "util/mumath.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CTX_CHUNK MU_DFLASH_SLACK /* context rows projected per batch */

struct mu_dflash_state {
    const mu_dflash *d;
    const mu_model *t;
    mu_backend *be;
    int64_t sink, window;       /* context capacity sink + window rows */
    int64_t slots;              /* per KV head: attend + CTX_CHUNK scratch slots (the V planes' stride) */
    int64_t attend;             /* slots attention may read: sink + window + block_size */
    bool merge;                 /* a round's context projected inside the draft (MUSER_DFLASH_MERGE=1; docs/speculative.md) */
    int64_t rows;               /* committed context rows (next anchor position) */
    int64_t fed;                /* rows mu_dflash_project_fed left in py for mu_dflash_keep_fed */
    /* backend memory: */
    float **ck;                 /* [n_layer] -> [n_head_kv][slots][head_dim] */
    float **cv;                 /* [n_layer] -> [n_head_kv][head_dim][slots]: V transposed, the P V operand */
    float *cs;                  /* (cos, sin) [max(CTX_CHUNK, block)][head_dim / 2] */
    float *cx, *kt, *vt;        /* context rows: fc output (a projection's, a merged context's), a merged
                                 * context's K, V (each right before a, kb, vb) */
    float *qx;                  /* scratch q rows of a merged context (right before q) */
    float *pkv;                 /* a projection's K and V rows of every layer [n_layer][2][CTX_CHUNK][KV] */
    float *h, *a, *q, *kb, *vb, *att, *o, *fg, *fu; /* block rows */
    float *qh, *oh;             /* one KV head's query rows / outputs [block * group][head_dim] */
    float *p;                   /* scores, then probabilities [block * group][slots] */
    float *logits;              /* [block - 1][n_vocab] */
    void *mem;                  /* one allocation holding every buffer above */
    size_t mem_bytes;
    /* host: */
    double *inv_freq;           /* [head_dim / 2] */
    int64_t *pos, *slot;        /* [max(CTX_CHUNK, block)] row positions and cache slots */
    int32_t *ids;               /* [block] block tokens, then proposals */
    const mu_weight **pw;       /* [2 * n_layer] every layer's K and V weights, */
    float **py;                 /* and their rows in pkv: a projection's product set */
};

mu_dflash_state *mu_dflash_state_new(const mu_dflash *d, const mu_model *target, mu_backend *be) {
    const mu_dflash_config *c = &d->cfg;
    const size_t E = (size_t)c->n_embd, D = (size_t)c->head_dim, Q = (size_t)c->n_head * D;
    const size_t KV = (size_t)c->n_head_kv * D, F = (size_t)c->n_ff, B = (size_t)c->block_size;
    const size_t group = (size_t)(c->n_head / c->n_head_kv);
    mu_dflash_state *st = mu_xcalloc(1, sizeof *st);
    st->d = d;
    st->t = target;
    st->be = be;
    st->sink = MU_DFLASH_SINK;
    st->window = c->sliding_window;
    st->attend = st->sink + st->window + c->block_size;
    st->slots = st->attend + CTX_CHUNK; /* a projection's padding rows: at most CTX_CHUNK - 1 */
    const char *mg = getenv("MUSER_DFLASH_MERGE");
    st->merge = mg && !strcmp(mg, "1"); /* off: slower on the GPU (docs/speculative.md "Context") */
    /* host rows and RoPE table rows: a projection's, or a merged context's and the block's */
    const size_t rows = B + MU_DFLASH_CTX_PAD > CTX_CHUNK ? B + MU_DFLASH_CTX_PAD : CTX_CHUNK;
    const size_t slots = (size_t)st->slots, L = (size_t)c->n_layer;
    /* every backend buffer carved from one allocation, in floats; cx, qx, kt
     * and vt end where a, q, kb and vb begin (their sizes are multiples of
     * 16 floats), so a merged context's rows and the block's are one matrix */
    float **bufs[] = {&st->cs, &st->h, &st->cx, &st->a, &st->o, &st->qx, &st->q, &st->att, &st->kt, &st->kb,
                      &st->vt, &st->vb, &st->fg, &st->fu, &st->qh, &st->oh, &st->p, &st->logits, &st->pkv};
    const size_t sizes[] = {rows * D, B * E, CTX_CHUNK * E, B * E, B * E, MU_DFLASH_CTX_PAD * Q, B * Q,
                            B * Q, CTX_CHUNK * KV, B * KV, CTX_CHUNK * KV, B * KV, B * F, B * F, B * group * D,
                            B * group * D, B * group * slots, (B - 1) * (size_t)target->cfg.n_vocab,
                            2 * L * CTX_CHUNK * KV};
    size_t total = 2 * L * slots * KV;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += (sizes[i] + 15) & ~(size_t)15;
    st->mem_bytes = total * sizeof(float);
    float *p = st->mem = mu_backend_xalloc(be, st->mem_bytes, "the DFlash assistant's state");
    be->zero(be, st->mem, st->mem_bytes); /* stale cache slots stay finite (attention below) */
    st->ck = mu_xcalloc(L, sizeof *st->ck);
    st->cv = mu_xcalloc(L, sizeof *st->cv);
    for (size_t il = 0; il < L; il++) {
        st->ck[il] = p; /* each layer's planes (and pkv's rows below) evenly apart: mu_dflash_keep_fed */
        st->cv[il] = p + slots * KV;
        p += 2 * slots * KV;
    }
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        *bufs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }
    const int64_t half = c->head_dim / 2;
    st->inv_freq = mu_xmalloc((size_t)half * sizeof(double));
    for (int64_t i = 0; i < half; i++)
        st->inv_freq[i] = 1.0 / mu_pow((double)c->rope_base, 2.0 * (double)i / (double)c->head_dim);
    st->pos = mu_xmalloc(rows * sizeof *st->pos);
    st->slot = mu_xmalloc(rows * sizeof *st->slot);
    st->ids = mu_xmalloc(B * sizeof *st->ids);
    st->pw = mu_xmalloc(2 * L * sizeof *st->pw);
    st->py = mu_xmalloc(2 * L * sizeof *st->py);
    for (size_t il = 0; il < L; il++) {
        st->pw[2 * il] = &d->layers[il].k, st->pw[2 * il + 1] = &d->layers[il].v;
        st->py[2 * il] = st->pkv + 2 * il * CTX_CHUNK * KV, st->py[2 * il + 1] = st->py[2 * il] + CTX_CHUNK * KV;
    }
    return st;
}

void mu_dflash_state_free(mu_dflash_state *st) {
    if (!st) return;
    st->be->free(st->be, st->mem, st->mem_bytes);
    free(st->ck); free(st->cv); free(st->inv_freq);
    free(st->pos); free(st->slot); free(st->ids);
    free(st->pw); free(st->py);
    free(st);
}

/* Slots past rows_held() are never read, so stale ones need no clearing. */
void mu_dflash_state_reset(mu_dflash_state *st) { st->rows = 0; }

int64_t mu_dflash_state_rows(const mu_dflash_state *st) { return st->rows; }

bool mu_dflash_state_merges(const mu_dflash_state *st) { return st->merge; }

static int64_t cache_slot(const mu_dflash_state *st, int64_t pos) {
    return pos < st->sink ? pos : st->sink + (pos - st->sink) % st->window;
}

/* Slots [0, rows_held) are exactly the rows the next anchor may attend to. */
static int64_t rows_held(const mu_dflash_state *st) {
    if (st->rows <= st->sink) return st->rows;
    int64_t tail = st->rows - st->sink;
    return st->sink + (tail < st->window ? tail : st->window);
}

/* The cache slots of `rows` context rows from position pos0, m of them
 * real: row r < m at its position's slot, the padding rows m <= r < rows
 * (project_context) each in a scratch slot past the attended ones. */
static void context_slots(const mu_dflash_state *st, int64_t *slot, int64_t m, int64_t rows, int64_t pos0) {
    for (int64_t r = 0; r < rows; r++) slot[r] = r < m ? cache_slot(st, pos0 + r) : st->attend + (r - m);
}

/* K/V rows [rows][n_head_kv * head_dim] into the per-head cache slots
 * st->slot[0..rows) (V into the transposed planes). */
static void store_rows(const mu_dflash_state *st, int il, const float *k, const float *v, int64_t rows) {
    const int64_t D = st->d->cfg.head_dim, Hkv = st->d->cfg.n_head_kv;
    st->be->store_kv_heads(st->be, st->ck[il], st->cv[il], st->slot, st->slots, D, Hkv, k, v, rows);
}

/* (cos, sin) of the positions st->pos[0..rows) (the backend's RoPE table;
 * tree_reg: row r < MU_TREE_MAX at st->pos[r] - r + the depth of node r of
 * the tree registers, backend.h). */
static void rope_table(const mu_dflash_state *st, int64_t rows, bool tree_reg) {
    st->be->rope_table(st->be, st->inv_freq, st->d->cfg.head_dim / 2, st->pos, rows, st->cs, tree_reg);
}

/* Per-head rmsnorm (weights w) then the NeoX rotation of rows whose table
 * rows start at cs_row0: of q (nq heads) and k (nk heads) alike; one launch
 * where the backend has qk_norm_rope. */
static void norm_rope(const mu_dflash_state *st, float *q, const float *wq, int64_t nq, float *k, const float *wk,
                      int64_t nk, int64_t rows, int64_t cs_row0) {
    mu_backend *be = st->be;
    const int64_t D = st->d->cfg.head_dim;
    const float eps = st->d->cfg.rms_eps, *cs = st->cs + cs_row0 * D;
    if (be->qk_norm_rope) {
        be->qk_norm_rope(be, q, wq, nq, k, wk, nk, D, eps, cs, D, rows, NULL, NULL, true);
        return;
    }
    if (nq) {
        be->rmsnorm(be, q, wq, eps, q, D, rows * nq);
        be->rope(be, q, nq, D, D, cs, rows, true);
    }
    be->rmsnorm(be, k, wk, eps, k, D, rows * nk);
    be->rope(be, k, nk, D, D, cs, rows, true);
}

/* norm_rope, then store_rows(il, k, v, rows) of the result: one launch
 * where the backend has qk_norm_rope_heads. */
static void norm_rope_store(const mu_dflash_state *st, int il, float *q, const float *wq, int64_t nq, float *k,
                            const float *wk, int64_t nk, const float *v, int64_t rows, int64_t cs_row0) {
    mu_backend *be = st->be;
    const int64_t D = st->d->cfg.head_dim;
    if (be->qk_norm_rope_heads) {
        be->qk_norm_rope_heads(be, q, wq, nq, k, wk, nk, D, st->d->cfg.rms_eps, st->cs + cs_row0 * D, D, rows, true,
                               st->ck[il], st->cv[il], st->slot, st->slots, v);
        return;
    }
    norm_rope(st, q, wq, nq, k, wk, nk, rows, cs_row0);
    store_rows(st, il, k, v, rows);
}

/* A backend that can replay a bracket's launches (backend.h forward_begin)
 * gets one key per launch shape: what differs between two brackets of one
 * key (positions, slots, tokens) travels as uploaded arguments. */
static void bracket_begin(mu_dflash_state *st, uint64_t tag, int64_t a, int64_t b) {
    if (!st->be->forward_begin) return;
    const uint64_t v[3] = {tag, (uint64_t)a, (uint64_t)b};
    uint64_t key = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 3; i++) key = (key ^ v[i]) * 0x100000001B3ull;
    st->be->forward_begin(st->be, key);
}

static void bracket_end(mu_dflash_state *st) {
    if (st->be->forward_end) st->be->forward_end(st->be, true);
}

/* Rows a projection of m context rows computes: a backend that replays
 * launches (forward_begin) projects a fixed count, MU_DFLASH_CTX_PAD or
 * CTX_CHUNK, so that every round's projection is one launch shape (a round
 * keeps 1..16 rows: one graph instead of one capture per count). The rows
 * past m read the caller's slack rows (dflash.h, MU_DFLASH_SLACK) and go
 * to scratch slots (context_slots), which attention never reads. Every
 * row's products are the same bits at any row count (docs/numerics.md). */
static int64_t projected_rows(const mu_dflash_state *st, int64_t m) {
    return !st->be->forward_begin ? m : m <= MU_DFLASH_CTX_PAD ? MU_DFLASH_CTX_PAD : CTX_CHUNK;
}

/* fc and the hidden norm of n context rows into the n rows ending at st->a
 * (the end of cx). */
static float *context_input(mu_dflash_state *st, const float *features, int64_t n) {
    const mu_dflash *d = st->d;
    float *x = st->a - n * d->cfg.n_embd;
    st->be->matmul(st->be, &d->fc, features, x, n);
    st->be->rmsnorm(st->be, x, d->hidden_norm, d->cfg.rms_eps, x, d->cfg.n_embd, n);
    return x;
}

/* K (k-normed, rotated) and V of n rows of features at positions st->pos
 * (tree_reg: rope_table's) into st->py, in a bracket of their own (tag),
 * then (store) into the cache slots st->slot. Every layer's K and V
 * products read the same rows, so they are one set (on a device: one
 * quantization, a launch per 8 matrices); then each layer's norm and
 * rotation, and store. */
static void project_rows(mu_dflash_state *st, const float *features, int64_t n, uint64_t tag, bool tree_reg,
                         bool store) {
    const mu_dflash *d = st->d;
    const mu_dflash_config *c = &d->cfg;
    mu_backend *be = st->be;
    const int64_t L = c->n_layer;
    bracket_begin(st, tag, n, tree_reg);
    const float *x = context_input(st, features, n);
    rope_table(st, n, tree_reg);
    mu_matmuls(be, (int)(2 * L), st->pw, x, st->py, n);
    for (int64_t il = 0; il < L; il++) {
        if (store)
            norm_rope_store(st, (int)il, NULL, NULL, 0, st->py[2 * il], d->layers[il].k_norm, c->n_head_kv,
                            st->py[2 * il + 1], n, 0);
        else
            norm_rope(st, NULL, NULL, 0, st->py[2 * il], d->layers[il].k_norm, c->n_head_kv, n, 0);
    }
    bracket_end(st);
}

/* m consecutive context rows from p0 (padded to projected_rows). */
static void project_context(mu_dflash_state *st, const float *features, int64_t p0, int64_t m) {
    const int64_t n = projected_rows(st, m);
    for (int64_t r = 0; r < n; r++) st->pos[r] = p0 + r;
    context_slots(st, st->slot, m, n, p0);
    project_rows(st, features, n, 0xDF1A5C0, false, true);
}

void mu_dflash_project_fed(mu_dflash_state *st, const float *features, int64_t n, bool tree_reg) {
    st->fed = projected_rows(st, n);
    for (int64_t r = 0; r < st->fed; r++) st->pos[r] = st->rows + r;
    project_rows(st, features, st->fed, 0xDF1A5C1, tree_reg, false);
}

/* The fed rows' K/V (st->py, as mu_dflash_project_fed left them) stored:
 * kept row path[j] into the slot of position rows() + j, the others into
 * scratch slots, in a bracket of their own: every layer in one
 * store_kv_heads_layers (the layers' planes and rows lie evenly apart:
 * mu_dflash_state_new), else a store_kv_heads each. */
void mu_dflash_keep_fed(mu_dflash_state *st, const int32_t *path, int keep) {
    const mu_dflash_config *c = &st->d->cfg;
    const int64_t L = c->n_layer, n = st->fed, KV = c->n_head_kv * c->head_dim;
    mu_backend *be = st->be;
    for (int64_t r = 0; r < n; r++) st->slot[r] = st->attend + r; /* scratch: attention never reads it */
    for (int j = 0; j < keep; j++) st->slot[path ? path[j] : j] = cache_slot(st, st->rows + j);
    bracket_begin(st, 0xDF1A5C2, n, 0);
    if (be->store_kv_heads_layers) {
        be->store_kv_heads_layers(be, st->ck[0], st->cv[0], 2 * st->slots * KV, st->slot, st->slots, c->head_dim,
                                  c->n_head_kv, st->py[0], st->py[1], 2 * CTX_CHUNK * KV, n, L);
    } else {
        for (int64_t il = 0; il < L; il++) store_rows(st, (int)il, st->py[2 * il], st->py[2 * il + 1], n);
    }
    bracket_end(st);
    st->rows += keep;
    st->fed = 0;
}

/* Rows that no later anchor can attend to (past the sink, with at least
 * `window` rows still to come before the next draft) need no projection. */
void mu_dflash_skip_context(mu_dflash_state *st, int64_t n) { st->rows += n; }

void mu_dflash_append_context(mu_dflash_state *st, const float *features, int64_t n) {
    const int64_t stride = st->d->cfg.n_target_layers * st->d->cfg.n_embd;
    const int64_t first = st->rows, end = st->rows + n;
    for (int64_t p = first; p < end;) {
        if (p >= st->sink && p < end - st->window) { /* evicted before anyone could attend to it */
            p = end - st->window;
            continue;
        }
        int64_t m = end - p < CTX_CHUNK ? end - p : CTX_CHUNK;
        if (p < st->sink && p + m > st->sink) m = st->sink - p; /* runs stay on one side of the sink edge */
        project_context(st, features + (p - first) * stride, p, m);
        p += m;
    }
    st->rows = end;
}

/* softmax(scale * Q K^T) V for query rows [r0, r0 + nr) of the block, one
 * KV head at a time; keys = the held context slots, then the block's. */
static void attention(mu_dflash_state *st, int il, int64_t r0, int64_t nr) {
    const mu_dflash_config *c = &st->d->cfg;
    mu_backend *be = st->be;
    const int64_t D = c->head_dim, H = c->n_head, group = H / c->n_head_kv, nq = nr * group;
    const int64_t n_valid = rows_held(st) + c->block_size;
    /* A backend that replays launches gets one shape for every round: all
     * slots as keys, the softmax giving the slots past n_valid probability
     * 0. The valid keys keep their indices, and (each dot product's terms
     * summed in index order per lane, from +0) a 0 * finite term adds
     * nothing, except that it turns a lane sum of -0 (every valid product
     * underflowed) into +0, a sign of zero the next nonzero addition
     * absorbs (docs/cuda.md, "Speculative decoding on the GPU"); stale
     * slots are finite (the state starts zeroed). */
    const int64_t n_keys = be->forward_begin ? st->attend : n_valid;
    if (be->dense_attention) { /* the loop below as one op (one launch instead of ten per layer on cuda) */
        const float scale = 1.0f / sqrtf((float)D);
        be->dense_attention(be, st->q + r0 * H * D, nr, H, c->n_head_kv, D, st->ck[il], st->cv[il], st->slots, n_keys,
                            n_valid, scale, st->att + r0 * H * D);
        return;
    }
    const float scale = 1.0f / sqrtf((float)D);
    const size_t head_rows = (size_t)(group * D) * sizeof(float), q_row = (size_t)(H * D) * sizeof(float);
    for (int64_t g = 0; g < c->n_head_kv; g++) {
        const float *k = st->ck[il] + g * st->slots * D, *vt = st->cv[il] + g * D * st->slots;
        /* query rows of this head group, (row, head) order */
        be->copy2d(be, st->qh, head_rows, st->q + (r0 * H + g * group) * D, q_row, head_rows, nr);
        mu_weight kw = mu_f32_matrix(k, D, n_keys, D);
        be->matmul(be, &kw, st->qh, st->p, nq);
        be->softmax(be, st->p, scale, n_keys, n_valid, nq);
        mu_weight vw = mu_f32_matrix(vt, n_keys, D, st->slots);
        be->matmul(be, &vw, st->p, st->oh, nq);
        be->copy2d(be, st->att + (r0 * H + g * group) * D, q_row, st->oh, head_rows, head_rows, nr);
    }
}

/* h += o (rows of n_embd), then a = rmsnorm(h) * w: one fused step where
 * the backend has one (backend.h residual, w_o NULL), the same bits. */
static void add_norm(mu_dflash_state *st, float *h, const float *w, int64_t rows) {
    const mu_dflash_config *c = &st->d->cfg;
    mu_backend *be = st->be;
    if (be->residual) {
        be->residual(be, h, st->o, NULL, 0.0f, st->a, w, c->rms_eps, c->n_embd, rows);
        return;
    }
    be->add(be, h, st->o, rows * c->n_embd);
    be->rmsnorm(be, h, w, c->rms_eps, st->a, c->n_embd, rows);
}

/* One layer; every block row feeds K/V, but only rows [r0, r0 + nr) need
 * outputs (the last layer computes just the rows that are scored). Its
 * input norm (st->a) was computed by the layer before (add_norm); it ends
 * with h += o and a = rmsnorm(h) * next (the next layer's input norm, or
 * the output norm over rows [r0, r0 + nr) into a's first rows). nc > 0:
 * the nc context rows right before the block's (st->a - nc rows: a merged
 * context, draft_rows) take the same K/V products, norms and stores in the
 * same launches (their q rows are computed and not used). */
static void block_layer(mu_dflash_state *st, int il, int64_t r0, int64_t nr, const float *next, int64_t nc) {
    const mu_dflash_config *c = &st->d->cfg;
    const mu_dflash_layer *lw = &st->d->layers[il];
    mu_backend *be = st->be;
    const int64_t E = c->n_embd, D = c->head_dim, Q = c->n_head * D, B = c->block_size, KV = c->n_head_kv * D;
    float *h = st->h + r0 * E;
    /* one set for the projections of the same rows: q of every row, even
     * in the last layer, which attends from rows r0 .. r0 + nr only (a row's
     * q is the same bits at any row count; on a device one quantization and
     * one launch instead of three and a second norm) */
    mu_matmuls(be, 3, (const mu_weight *[]){&lw->q, &lw->k, &lw->v}, st->a - nc * E,
               (float *[]){st->q - nc * Q, st->kb - nc * KV, st->vb - nc * KV}, nc + B);
    /* q's rows are k's; the table's rows are the context's, then the block's */
    norm_rope_store(st, il, st->q - nc * Q, lw->q_norm, c->n_head, st->kb - nc * KV, lw->k_norm, c->n_head_kv,
                    st->vb - nc * KV, nc + B, 0);
    attention(st, il, r0, nr);
    be->matmul(be, &lw->o, st->att + r0 * Q, st->o, nr);
    add_norm(st, h, lw->ffn_norm, nr);
    mu_matmuls(be, 2, (const mu_weight *[]){&lw->gate, &lw->up}, st->a, (float *[]){st->fg, st->fu}, nr);
    be->swiglu(be, st->fg, st->fu, nr * c->n_ff);
    be->matmul(be, &lw->down, st->fg, st->o, nr);
    add_norm(st, h, next, nr);
}

/* Whether n context rows from rows() can be projected inside the next
 * draft: what mu_dflash_append_context would project as one batch of at
 * most MU_DFLASH_CTX_PAD rows (none skipped, not across the sink edge). */
static bool can_merge(const mu_dflash_state *st, int64_t n) {
    const int64_t p = st->rows;
    return st->merge && n > 0 && n <= MU_DFLASH_CTX_PAD && !(p < st->sink && p + n > st->sink) &&
           !(p >= st->sink && n > st->window);
}

/* The block's forward up to the target's head: its logits rows 1..n_prop
 * in st->logits. n_ctx committed rows (features; can_merge) come first:
 * projected in the same layers and launches as the block. */
static void draft_rows(mu_dflash_state *st, const float *features, int64_t n_ctx, int32_t anchor, int n_prop) {
    const mu_dflash_config *c = &st->d->cfg;
    const mu_model *t = st->t;
    mu_backend *be = st->be;
    const int64_t E = c->n_embd, B = c->block_size;
    int64_t nc = 0;
    if (n_ctx) {
        const int64_t p0 = st->rows;
        nc = projected_rows(st, n_ctx);
        context_input(st, features, nc);
        st->rows += n_ctx;
        context_slots(st, st->slot, n_ctx, nc, p0);
        for (int64_t r = 0; r < nc; r++) st->pos[r] = p0 + r;
    }
    const int64_t held = rows_held(st);
    for (int64_t r = 0; r < B; r++) {
        st->ids[r] = r ? c->mask_token : anchor;
        st->pos[nc + r] = st->rows + r;
        st->slot[nc + r] = held + r;
    }
    rope_table(st, nc + B, false);
    be->embed(be, &t->token_embd, st->ids, B, st->h);
    be->rmsnorm(be, st->h, st->d->layers[0].attn_norm, c->rms_eps, st->a, E, B);
    for (int il = 0; il < c->n_layer; il++) {
        bool last = il == c->n_layer - 1;
        /* the last layer's rows 1..n_prop end in the final norm */
        block_layer(st, il, last ? 1 : 0, last ? n_prop : B,
                    last ? st->d->output_norm : st->d->layers[il + 1].attn_norm, nc);
    }
    /* rows 1..n_prop, normed into a: the target's head (no logit scale, no soft-cap) */
    be->matmul(be, &t->output, st->a, st->logits, n_prop);
}

/* Context rows that cannot be merged into the draft are projected first,
 * in brackets of their own; then the draft's bracket, keyed by the
 * proposal count, the mode and the merged rows' count (the context length
 * is data: attention). Returns the rows left to merge. */
static int64_t draft_begin(mu_dflash_state *st, const float *features, int64_t n_ctx, int n_prop, int mode) {
    if (n_ctx && !can_merge(st, n_ctx)) {
        mu_dflash_append_context(st, features, n_ctx);
        n_ctx = 0;
    }
    bracket_begin(st, 0xDF1A5D0, n_prop, mode + 4 * (n_ctx ? projected_rows(st, n_ctx) : 0));
    return n_ctx;
}

void mu_dflash_draft(mu_dflash_state *st, const float *features, int64_t n_ctx, int32_t anchor, int n_prop,
                     int32_t *proposals, float *logits) {
    mu_backend *be = st->be;
    const int64_t V = st->t->cfg.n_vocab;
    /* proposals NULL: into the token registers, inside the bracket */
    n_ctx = draft_begin(st, features, n_ctx, n_prop, proposals ? 0 : 1);
    draft_rows(st, features, n_ctx, anchor, n_prop);
    if (!proposals) {
        be->argmax_reg(be, st->logits, V, n_prop);
        be->reg_epoch++;
        bracket_end(st);
        return;
    }
    bracket_end(st); /* before the argmax: its result goes to the host */
    be->argmax(be, st->logits, V, n_prop, proposals);
    if (logits) be->download(be, logits, st->logits, (size_t)n_prop * (size_t)V * sizeof(float));
}

void mu_dflash_draft_tree(mu_dflash_state *st, const float *features, int64_t n_ctx, int32_t anchor, int n_prop,
                          const int32_t *eog, int n_eog, int32_t *slot) {
    n_ctx = draft_begin(st, features, n_ctx, n_prop, 2);
    draft_rows(st, features, n_ctx, anchor, n_prop);
    st->be->tree_reg(st->be, st->logits, st->t->cfg.n_vocab, n_prop, eog, n_eog, slot);
    st->be->reg_epoch++;
    bracket_end(st);
}

/* ---------------- durable state (docs/kvpack.md, "DFlash context") ----------------
 * The context cache's held slots [0, rows_held) of every layer, as they
 * lie in backend memory: per layer K [n_head_kv][held][head_dim], then V
 * [n_head_kv][head_dim][held] (the transposed planes, each cut to held).
 * The slot of a position depends only on rows, sink and window, so an
 * import into a state of the same assistant is the same cache, bit for
 * bit. */
int64_t mu_dflash_state_held(const mu_dflash_state *st) { return rows_held(st); }

uint64_t mu_dflash_state_bytes(const mu_dflash *d, int64_t rows) {
    const mu_dflash_config *c = &d->cfg;
    const int64_t sink = MU_DFLASH_SINK, tail = rows - sink;
    const int64_t held = rows <= sink ? rows : sink + (tail < c->sliding_window ? tail : c->sliding_window);
    return (uint64_t)c->n_layer * 2 * (uint64_t)(c->n_head_kv * c->head_dim) * (uint64_t)held * sizeof(float);
}

void mu_dflash_state_export(const mu_dflash_state *st, float *out) {
    const mu_dflash_config *c = &st->d->cfg;
    const int64_t D = c->head_dim, Hkv = c->n_head_kv, S = st->slots, held = rows_held(st);
    for (int il = 0; il < c->n_layer; il++) {
        for (int64_t h = 0; h < Hkv; h++, out += held * D)
            st->be->download(st->be, out, st->ck[il] + h * S * D, (size_t)(held * D) * sizeof(float));
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t d = 0; d < D; d++, out += held)
                st->be->download(st->be, out, st->cv[il] + (h * D + d) * S, (size_t)held * sizeof(float));
    }
}

void mu_dflash_state_import(mu_dflash_state *st, int64_t rows, const float *in) {
    const mu_dflash_config *c = &st->d->cfg;
    st->rows = rows;
    const int64_t D = c->head_dim, Hkv = c->n_head_kv, S = st->slots, held = rows_held(st);
    for (int il = 0; il < c->n_layer; il++) {
        for (int64_t h = 0; h < Hkv; h++, in += held * D)
            st->be->upload(st->be, st->ck[il] + h * S * D, in, (size_t)(held * D) * sizeof(float));
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t d = 0; d < D; d++, in += held)
                st->be->upload(st->be, st->cv[il] + (h * D + d) * S, in, (size_t)held * sizeof(float));
    }
}
