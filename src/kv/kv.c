/* Two-class f16 KV cache: SWA rings and growing full planes (kv.h).
 *
 * Invariant kept by every operation: a physical row that is not currently
 * held is all zero. It holds at init (zero-filled), a store only writes the
 * rows it starts holding, rollback restores the exact bytes that were there
 * at the target length, snapshot restore and fork rewrite held rows and
 * zero the rest, and clear zeroes the held rows. So clear is O(held rows)
 * and a cleared cache is bitwise identical to a fresh one. The planes are
 * backend memory; every byte moves through the backend's memory ops. */
#include "kv/kv.h"
#include "backend/backend.h"
#include <inttypes.h>
#include <stdlib.h>

/* Refuse caches above 1 TiB before asking the allocator (which, with
 * overcommit, might "succeed" and fail only when the pages are touched). */
#define MU_KV_MAX_BYTES (1ull << 40)

/* The host memory ops, for caches made without a backend (tests). */
static mu_backend *host_backend(void) {
    static mu_backend host;
    if (!host.alloc) {
        host.name = "host";
        mu_backend_set_host_ops(&host);
    }
    return &host;
}

static int64_t layer_end(const mu_kv_layer *l) { return l->origin_logical + l->len; }

static int64_t physical_of(const mu_kv_layer *l, int64_t pos) {
    return (l->origin_physical + (pos - l->origin_logical)) % l->cap;
}

static size_t head_bytes(const mu_kv_layer *l) { return (size_t)l->head_dim * sizeof(uint16_t); }
static size_t plane_bytes(const mu_kv_layer *l) { return (size_t)l->n_head * (size_t)l->cap * head_bytes(l); }

/* One head of one physical row inside a head-major plane of cap rows. */
static uint16_t *head_at(const mu_kv_layer *l, uint16_t *plane, int64_t cap, int64_t physical, int64_t head) {
    return plane + (head * cap + physical) * l->head_dim;
}

/* n physical rows from `from` (no wrap) of every head: plane -> plane, one
 * strided copy (a head's rows are one span; heads are cap rows apart). */
static mu_copy2d rows_copy(const mu_kv_layer *l, uint16_t *dst, int64_t dcap, int64_t dphys, uint16_t *src, int64_t scap,
                           int64_t sphys, int64_t n) {
    return (mu_copy2d){.dst = head_at(l, dst, dcap, dphys, 0), .dst_stride = (size_t)dcap * head_bytes(l),
                       .src = head_at(l, src, scap, sphys, 0), .src_stride = (size_t)scap * head_bytes(l),
                       .width = (size_t)n * head_bytes(l), .rows = l->n_head};
}

static void copy_rows(mu_backend *be, const mu_kv_layer *l, uint16_t *dst, int64_t dcap, int64_t dphys,
                      uint16_t *src, int64_t scap, int64_t sphys, int64_t n) {
    const mu_copy2d d = rows_copy(l, dst, dcap, dphys, src, scap, sphys, n);
    be->copy2d(be, d.dst, d.dst_stride, d.src, d.src_stride, d.width, d.rows);
}

/* Calls fn on the runs of physical rows holding logical [pos, pos + n) (a
 * ring wraps at most once). */
typedef void (*run_fn)(void *ctx, const mu_kv_layer *l, int64_t physical, int64_t n, int64_t index);
static void for_runs(const mu_kv_layer *l, int64_t pos, int64_t n, run_fn fn, void *ctx) {
    int64_t phys = physical_of(l, pos), index = 0;
    while (n > 0) {
        int64_t run = l->cap - phys < n ? l->cap - phys : n;
        fn(ctx, l, phys, run, index);
        index += run;
        n -= run;
        phys = 0;
    }
}

typedef struct plane_op {
    mu_backend *be;
    uint16_t *k, *v;   /* host side: head-major [n_head][len][head_dim] (snapshots) */
    int64_t len;
} plane_op;

static void zero_run(void *ctx, const mu_kv_layer *l, int64_t phys, int64_t n, int64_t index) {
    (void)index;
    mu_backend *be = ((plane_op *)ctx)->be;
    for (int64_t h = 0; h < l->n_head; h++) {
        be->zero(be, head_at(l, l->k, l->cap, phys, h), (size_t)n * head_bytes(l));
        be->zero(be, head_at(l, l->v, l->cap, phys, h), (size_t)n * head_bytes(l));
    }
}

static void zero_held_rows(mu_backend *be, mu_kv_layer *l) {
    plane_op op = {.be = be};
    for_runs(l, l->origin_logical, l->len, zero_run, &op);
}

/* ---------- init / free / clear ---------- */

static bool check_geometry(int n_layers, const bool *is_swa, int64_t window, int64_t slack, int64_t n_ctx,
                           int64_t n_head, int64_t head_dim, mu_error *err) {
    if (n_layers <= 0 || n_layers > INT32_MAX / MU_KV_MAX_ROLLBACK) {
        mu_err_set(err, "kv init: n_layers %d out of range [1, %d]", n_layers, INT32_MAX / MU_KV_MAX_ROLLBACK);
        return false;
    }
    if (!is_swa) { mu_err_set(err, "kv init: is_swa array is NULL"); return false; }
    if (n_ctx <= 0) { mu_err_set(err, "kv init: n_ctx %" PRId64 " must be positive", n_ctx); return false; }
    if (n_head <= 0) { mu_err_set(err, "kv init: n_head %" PRId64 " must be positive", n_head); return false; }
    if (head_dim <= 0) { mu_err_set(err, "kv init: head_dim %" PRId64 " must be positive", head_dim); return false; }
    if (window < 0) { mu_err_set(err, "kv init: window %" PRId64 " is negative", window); return false; }
    if (slack < 0 || slack > ((int64_t)1 << 24)) {
        mu_err_set(err, "kv init: slack %" PRId64 " out of range [0, 2^24]", slack);
        return false;
    }
    for (int i = 0; i < n_layers; i++) {
        if (is_swa[i] && window == 0) {
            mu_err_set(err, "kv init: layer %d is sliding-window but window is 0 (none)", i);
            return false;
        }
    }
    return true;
}

/* Bytes of `rows` rows, with overflow checks (also fits size_t and int64). */
static bool rows_bytes(int64_t rows, int64_t row_elems, uint64_t *out) {
    uint64_t row;
    return mu_mul_u64((uint64_t)row_elems, sizeof(uint16_t), &row) &&
           mu_mul_u64(row, (uint64_t)rows, out) && *out <= (uint64_t)SIZE_MAX &&
           *out <= (uint64_t)INT64_MAX;
}

static int64_t layer_cap(bool swa, int64_t window, int64_t slack, int64_t n_ctx) {
    return swa && window + slack < n_ctx ? window + slack : n_ctx;
}

/* Total bytes of all planes plus the journal's saved rows. */
static bool total_bytes(int n_layers, const bool *is_swa, int64_t window, int64_t slack, int64_t n_ctx,
                        int64_t row_elems, uint64_t *total) {
    uint64_t bytes;
    *total = 0;
    for (int i = 0; i < n_layers; i++) {
        if (!rows_bytes(layer_cap(is_swa[i], window, slack, n_ctx), row_elems, &bytes) ||
            !mu_mul_u64(bytes, 2, &bytes) || !mu_add_u64(*total, bytes, total))
            return false;
    }
    return rows_bytes((int64_t)n_layers * MU_KV_MAX_ROLLBACK * 2, row_elems, &bytes) &&
           mu_add_u64(*total, bytes, total);
}

static int64_t journal_cap(const mu_kv_cache *c) { return (int64_t)c->n_layers * MU_KV_MAX_ROLLBACK; }

static bool alloc_plane(mu_kv_cache *c, uint16_t **out, size_t bytes, const char *what, int layer, mu_error *err) {
    *out = c->be->alloc(c->be, bytes);
    if (!*out) mu_err_set(err, "kv init: cannot allocate %zu bytes of %s memory for the %s of layer %d", bytes,
                          c->be->name, what, layer);
    return *out != NULL;
}

bool mu_kv_init(mu_kv_cache *c, mu_backend *be, int n_layers, const bool *is_swa, int64_t window, int64_t slack,
                int64_t n_ctx, int64_t n_head, int64_t head_dim, mu_error *err) {
    if (!c) { mu_err_set(err, "kv init: cache is NULL"); return false; }
    memset(c, 0, sizeof *c);
    if (!check_geometry(n_layers, is_swa, window, slack, n_ctx, n_head, head_dim, err)) return false;
    uint64_t total, row = 0;
    if (!mu_mul_u64((uint64_t)n_head, (uint64_t)head_dim, &row) || row > (uint64_t)INT64_MAX ||
        !total_bytes(n_layers, is_swa, window, slack, n_ctx, (int64_t)row, &total) || total > MU_KV_MAX_BYTES) {
        mu_err_set(err, "kv init: %d layers, n_ctx %" PRId64 ", window %" PRId64 ", %" PRId64 " heads of %" PRId64
                   " need more than the %llu-byte limit", n_layers, n_ctx, window, n_head, head_dim,
                   (unsigned long long)MU_KV_MAX_BYTES);
        return false;
    }
    const int64_t row_elems = (int64_t)row;
    c->be = be ? be : host_backend();
    c->n_layers = n_layers;
    c->n_ctx = n_ctx;
    c->window = window;
    c->slack = slack;
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);
    c->journal = calloc((size_t)journal_cap(c), sizeof *c->journal);
    if (!c->layers || !c->journal) {
        mu_err_set(err, "kv init: cannot allocate %d layer records", n_layers);
        mu_kv_free(c);
        return false;
    }
    for (int i = 0; i < n_layers; i++) {
        mu_kv_layer *l = &c->layers[i];
        l->swa = is_swa[i];
        l->cap = layer_cap(l->swa, window, slack, n_ctx);
        l->n_head = n_head;
        l->head_dim = head_dim;
        l->row_elems = row_elems;
        if (!alloc_plane(c, &l->k, plane_bytes(l), "K plane", i, err) ||
            !alloc_plane(c, &l->v, plane_bytes(l), "V plane", i, err)) {
            mu_kv_free(c);
            return false;
        }
    }
    const size_t jbytes = (size_t)journal_cap(c) * (size_t)row_elems * sizeof(uint16_t);
    if (!alloc_plane(c, &c->jk, jbytes, "rollback journal", -1, err) ||
        !alloc_plane(c, &c->jv, jbytes, "rollback journal", -1, err)) {
        mu_kv_free(c);
        return false;
    }
    for (int64_t i = 0; i < journal_cap(c); i++) c->journal[i].slot = i;
    return true;
}

void mu_kv_free(mu_kv_cache *c) {
    if (!c) return;
    if (c->layers) {
        for (int i = 0; i < c->n_layers; i++) {
            c->be->free(c->be, c->layers[i].k, plane_bytes(&c->layers[i]));
            c->be->free(c->be, c->layers[i].v, plane_bytes(&c->layers[i]));
        }
        const size_t jbytes = (size_t)journal_cap(c) * (size_t)c->layers[0].row_elems * sizeof(uint16_t);
        if (c->jk) c->be->free(c->be, c->jk, jbytes);
        if (c->jv) c->be->free(c->be, c->jv, jbytes);
    }
    free(c->journal);
    free(c->layers);
    memset(c, 0, sizeof *c);
}

void mu_kv_clear(mu_kv_cache *c) {
    if (!c || !c->layers) return;
    for (int i = 0; i < c->n_layers; i++) {
        mu_kv_layer *l = &c->layers[i];
        zero_held_rows(c->be, l);
        l->origin_logical = l->origin_physical = l->len = 0;
    }
    mu_kv_commit(c);
}

int64_t mu_kv_len(const mu_kv_cache *c) { return c && c->layers ? layer_end(&c->layers[0]) : 0; }

/* ---------- store and row access ---------- */

bool mu_kv_reserve(mu_kv_cache *c, int layer, int64_t pos, int64_t n, mu_kv_dst *dst, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv store: cache is not initialized"); return false; }
    if (layer < 0 || layer >= c->n_layers) {
        mu_err_set(err, "kv store: layer %d out of range [0, %d)", layer, c->n_layers);
        return false;
    }
    mu_kv_layer *l = &c->layers[layer];
    int64_t expected = layer_end(l);
    if (n < 1) { mu_err_set(err, "kv store: layer %d: %" PRId64 " rows", layer, n); return false; }
    if (pos != expected) {
        mu_err_set(err, "kv store: layer %d: cache discontinuity: expected position %" PRId64 ", got %" PRId64,
                   layer, expected, pos);
        return false;
    }
    if (pos + n > c->n_ctx) {
        mu_err_set(err, "kv store: layer %d: position %" PRId64 " is outside the context (n_ctx %" PRId64 ")",
                   layer, c->n_ctx > pos ? c->n_ctx : pos, c->n_ctx);
        return false;
    }
    if (l->swa && l->cap < c->n_ctx && n > l->cap - c->window + 1) {
        mu_err_set(err, "kv store: layer %d: %" PRId64 " rows in one store exceed the ring's slack (%" PRId64
                   " rows beyond the window of %" PRId64 ")", layer, n, l->cap - c->window, c->window);
        return false;
    }
    if (c->ckpt_active && pos + n - 1 - c->ckpt_pos >= MU_KV_MAX_ROLLBACK) {
        mu_err_set(err, "kv store: layer %d: position %" PRId64 " would be row %" PRId64 " past the checkpoint "
                   "at %" PRId64 "; at most %d rows can be rolled back (commit first)",
                   layer, pos + n - 1, pos + n - c->ckpt_pos, c->ckpt_pos, MU_KV_MAX_ROLLBACK);
        return false;
    }
    if (c->ckpt_active && c->n_journal + n > journal_cap(c)) {
        mu_err_set(err, "kv store: layer %d: rollback journal full (%d entries)", layer, c->n_journal);
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        bool overwrite = l->len == l->cap; /* only a full SWA ring: pos < n_ctx = cap for full planes */
        int64_t write = overwrite ? l->origin_physical : (l->origin_physical + l->len) % l->cap;
        dst[i] = (mu_kv_dst){.l = l, .physical = write, .slot = -1};
        if (c->ckpt_active) {
            /* keep the old bytes of every written row, held or not, so rollback is bitwise */
            mu_kv_journal_entry *e = &c->journal[c->n_journal++];
            e->layer = layer;
            e->pos = pos + i;
            e->physical = write;
            e->prev_origin_logical = l->origin_logical;
            e->prev_origin_physical = l->origin_physical;
            e->prev_len = l->len;
            /* the backend saves the row's old bytes there as it stores */
            dst[i].jk = c->jk, dst[i].jv = c->jv, dst[i].jcap = journal_cap(c), dst[i].slot = e->slot;
        }
        if (overwrite) {
            l->origin_logical += 1;
            l->origin_physical = (l->origin_physical + 1) % l->cap;
        } else {
            l->len += 1;
        }
    }
    return true;
}

bool mu_kv_store(mu_kv_cache *c, int layer, int64_t pos, int64_t n, const float *k, const float *v, mu_error *err) {
    if (!k || !v) { mu_err_set(err, "kv store: layer %d position %" PRId64 ": K or V row is NULL", layer, pos); return false; }
    mu_kv_dst local[64], *dst = n <= 64 ? local : mu_xmalloc((size_t)n * sizeof *dst);
    const bool ok = mu_kv_reserve(c, layer, pos, n, dst, err);
    if (ok) c->be->kv_store(c->be, n, dst, k, v);
    if (dst != local) free(dst);
    return ok;
}

static bool is_held(const mu_kv_layer *l, int64_t pos) {
    return l && pos >= l->origin_logical && pos < layer_end(l);
}

const uint16_t *mu_kv_k(const mu_kv_layer *l, int64_t pos, int64_t head) {
    return is_held(l, pos) && head >= 0 && head < l->n_head ? head_at(l, l->k, l->cap, physical_of(l, pos), head) : NULL;
}

const uint16_t *mu_kv_v(const mu_kv_layer *l, int64_t pos, int64_t head) {
    return is_held(l, pos) && head >= 0 && head < l->n_head ? head_at(l, l->v, l->cap, physical_of(l, pos), head) : NULL;
}

bool mu_kv_head_rows(const mu_kv_layer *l, int64_t pos, int64_t n, int64_t head, const uint16_t **k,
                     const uint16_t **v) {
    if (n <= 0 || !is_held(l, pos) || !is_held(l, pos + n - 1) || head < 0 || head >= l->n_head) return false;
    const uint16_t *kp = head_at(l, l->k, l->cap, 0, head), *vp = head_at(l, l->v, l->cap, 0, head);
    for (int64_t i = 0, phys = physical_of(l, pos); i < n; i++) {
        k[i] = kp + phys * l->head_dim;
        v[i] = vp + phys * l->head_dim;
        if (++phys == l->cap) phys = 0;
    }
    return true;
}

/* ---------- truncate ---------- */

/* Can a layer drop everything from n on and still serve position n? */
static bool keeps_window(const mu_kv_cache *c, const mu_kv_layer *l, int64_t n) {
    const int64_t need = l->swa && n - c->window + 1 > 0 ? n - c->window + 1 : 0;
    return n == 0 || need >= l->origin_logical;
}

bool mu_kv_truncate(mu_kv_cache *c, int64_t n, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv truncate: cache is not initialized"); return false; }
    if (c->ckpt_active) { mu_err_set(err, "kv truncate: a checkpoint is active"); return false; }
    if (n < 0) { mu_err_set(err, "kv truncate to %" PRId64 ": negative", n); return false; }
    for (int i = 0; i < c->n_layers; i++)
        if (n < layer_end(&c->layers[i]) && !keeps_window(c, &c->layers[i], n)) {
            mu_err_set(err, "kv truncate to %" PRId64 ": layer %d holds [%" PRId64 ", %" PRId64 "); its ring no longer "
                       "holds the window before that position", n, i, c->layers[i].origin_logical, layer_end(&c->layers[i]));
            return false;
        }
    for (int i = 0; i < c->n_layers; i++) {
        mu_kv_layer *l = &c->layers[i];
        if (n >= layer_end(l)) continue;
        plane_op op = {.be = c->be};
        const int64_t from = n > l->origin_logical ? n : l->origin_logical;
        for_runs(l, from, layer_end(l) - from, zero_run, &op);
        l->len = from - l->origin_logical;
        if (l->len == 0) { /* empty: the next store (position n) starts the layer again */
            l->origin_logical = n;
            l->origin_physical = n % l->cap;
        }
    }
    return true;
}

/* ---------- fork ---------- */

static bool same_geometry(const mu_kv_cache *a, const mu_kv_cache *b, const char *what, mu_error *err) {
    bool same = a->n_layers == b->n_layers && a->n_ctx == b->n_ctx && a->window == b->window;
    for (int i = 0; same && i < a->n_layers; i++) {
        const mu_kv_layer *x = &a->layers[i], *y = &b->layers[i];
        same = x->swa == y->swa && x->cap == y->cap && x->n_head == y->n_head && x->head_dim == y->head_dim;
    }
    if (!same)
        mu_err_set(err, "%s: geometry mismatch (%d layers, n_ctx %" PRId64 ", window %" PRId64 " against %d layers, "
                   "n_ctx %" PRId64 ", window %" PRId64 ", or a layer's ring or heads)", what, a->n_layers, a->n_ctx,
                   a->window, b->n_layers, b->n_ctx, b->window);
    return same;
}

typedef struct fork_op {
    mu_backend *be;
    const mu_kv_layer *src;
} fork_op;

/* Source and destination place position p at the same physical row p % cap. */
static void fork_run(void *ctx, const mu_kv_layer *l, int64_t phys, int64_t n, int64_t index) {
    (void)index;
    fork_op *f = ctx;
    copy_rows(f->be, l, l->k, l->cap, phys, f->src->k, l->cap, phys, n);
    copy_rows(f->be, l, l->v, l->cap, phys, f->src->v, l->cap, phys, n);
}

bool mu_kv_fork(mu_kv_cache *dst, const mu_kv_cache *src, int64_t n, mu_error *err) {
    if (!dst || !src || !dst->layers || !src->layers) { mu_err_set(err, "kv fork: cache is not initialized"); return false; }
    if (dst == src) { mu_err_set(err, "kv fork: source and destination are the same cache"); return false; }
    if (!same_geometry(dst, src, "kv fork", err)) return false;
    for (int i = 0; i < src->n_layers; i++) {
        const mu_kv_layer *s = &src->layers[i];
        const int64_t need = s->swa && n - src->window + 1 > 0 ? n - src->window + 1 : 0;
        if (n < 0 || n > layer_end(s) || (n > 0 && need < s->origin_logical)) {
            mu_err_set(err, "kv fork of %" PRId64 " positions: layer %d holds [%" PRId64 ", %" PRId64 ")%s", n, i,
                       s->origin_logical, layer_end(s),
                       n > layer_end(s) ? "" : "; its ring no longer holds the window before that position");
            return false;
        }
    }
    mu_kv_clear(dst);
    for (int i = 0; i < src->n_layers; i++) {
        const mu_kv_layer *s = &src->layers[i];
        mu_kv_layer *d = &dst->layers[i];
        int64_t first = n - d->cap > s->origin_logical ? n - d->cap : s->origin_logical;
        if (first > n) first = n;
        fork_op op = {.be = dst->be, .src = s};
        d->origin_logical = first;
        d->origin_physical = first % d->cap;
        d->len = n - first;
        for_runs(d, first, n - first, fork_run, &op);
    }
    return true;
}

/* ---------- checkpoint / rollback / commit ---------- */

/* An empty journal whose entries own slots in order, so that a store's rows
 * land in consecutive journal rows and a rollback restores them in runs. */
static void journal_reset(mu_kv_cache *c) {
    c->n_journal = 0;
    for (int64_t i = 0; i < journal_cap(c); i++) c->journal[i].slot = i;
}

bool mu_kv_checkpoint(mu_kv_cache *c, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv checkpoint: cache is not initialized"); return false; }
    if (c->ckpt_active) {
        mu_err_set(err, "kv checkpoint: a checkpoint at %" PRId64 " is already active; commit or roll back first",
                   c->ckpt_pos);
        return false;
    }
    int64_t len = layer_end(&c->layers[0]);
    for (int i = 1; i < c->n_layers; i++) {
        if (layer_end(&c->layers[i]) != len) {
            mu_err_set(err, "kv checkpoint: layers disagree on the length: layer 0 ends at %" PRId64
                       ", layer %d at %" PRId64, len, i, layer_end(&c->layers[i]));
            return false;
        }
    }
    c->ckpt_active = true;
    c->ckpt_pos = len;
    journal_reset(c);
    return true;
}

/* A rollback's copies, gathered for copy2d_many (backend.h) while their
 * destinations stay apart: a run that overlaps a gathered one of its layer
 * sends the gathered ones first, so every row is restored in undo order. */
#define UNDO_MAX 32 /* runs per copy2d_many (two copies each) */
typedef struct undo_batch {
    int n;
    int layer[UNDO_MAX];
    int64_t phys[UNDO_MAX], rows[UNDO_MAX];
    mu_copy2d cp[2 * UNDO_MAX];
} undo_batch;

static void undo_flush(mu_kv_cache *c, undo_batch *u) {
    if (u->n) c->be->copy2d_many(c->be, 2 * u->n, u->cp);
    u->n = 0;
}

/* Undo entries [i0, i1] (a run: one layer, consecutive physical rows and
 * journal slots): their saved rows go back in one copy per plane (now, or
 * gathered into u), and the layer's metadata becomes what it was before the
 * run's first entry. */
static void undo_run(mu_kv_cache *c, int i0, int i1, undo_batch *u) {
    const mu_kv_journal_entry *e = &c->journal[i0];
    mu_kv_layer *l = &c->layers[e->layer];
    const int64_t n = i1 - i0 + 1;
    if (u) {
        for (int i = 0; i < u->n; i++)
            if (u->layer[i] == e->layer && e->physical < u->phys[i] + u->rows[i] && u->phys[i] < e->physical + n) {
                undo_flush(c, u);
                break;
            }
        if (u->n == UNDO_MAX) undo_flush(c, u);
        u->layer[u->n] = e->layer, u->phys[u->n] = e->physical, u->rows[u->n] = n;
        u->cp[2 * u->n] = rows_copy(l, l->k, l->cap, e->physical, c->jk, journal_cap(c), e->slot, n);
        u->cp[2 * u->n + 1] = rows_copy(l, l->v, l->cap, e->physical, c->jv, journal_cap(c), e->slot, n);
        u->n++;
    } else {
        copy_rows(c->be, l, l->k, l->cap, e->physical, c->jk, journal_cap(c), e->slot, n);
        copy_rows(c->be, l, l->v, l->cap, e->physical, c->jv, journal_cap(c), e->slot, n);
    }
    l->origin_logical = e->prev_origin_logical;
    l->origin_physical = e->prev_origin_physical;
    l->len = e->prev_len;
}

static void swap_entries(mu_kv_journal_entry *a, mu_kv_journal_entry *b) {
    mu_kv_journal_entry t = *a;
    *a = *b;
    *b = t;
}

bool mu_kv_rollback(mu_kv_cache *c, int64_t pos, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv rollback: cache is not initialized"); return false; }
    if (!c->ckpt_active) { mu_err_set(err, "kv rollback to %" PRId64 ": no active checkpoint", pos); return false; }
    int64_t shortest = INT64_MAX;
    int shortest_layer = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (layer_end(&c->layers[i]) < shortest) { shortest = layer_end(&c->layers[i]); shortest_layer = i; }
    }
    if (pos < c->ckpt_pos || pos > shortest) {
        mu_err_set(err, "kv rollback to %" PRId64 ": outside [%" PRId64 ", %" PRId64 "] (checkpoint, "
                   "length of layer %d, the shortest)", pos, c->ckpt_pos, shortest, shortest_layer);
        return false;
    }
    /* undo newest first, a run of entries at a time (the rows of a run are
     * distinct, so their order within it does not matter); entries of
     * different layers are independent */
    undo_batch batch, *u = c->be->copy2d_many ? &batch : NULL;
    if (u) u->n = 0;
    for (int i = c->n_journal - 1; i >= 0; i--) {
        if (c->journal[i].pos < pos) continue;
        int i0 = i;
        while (i0 > 0) {
            const mu_kv_journal_entry *a = &c->journal[i0 - 1], *b = &c->journal[i0];
            if (a->pos < pos || a->layer != b->layer || a->pos + 1 != b->pos || a->physical + 1 != b->physical ||
                a->slot + 1 != b->slot)
                break;
            i0--;
        }
        undo_run(c, i0, i, u);
        i = i0;
    }
    if (u) undo_flush(c, u);
    /* keep the older entries in order; swapping keeps each journal row owned once */
    int kept = 0;
    for (int i = 0; i < c->n_journal; i++)
        if (c->journal[i].pos < pos) swap_entries(&c->journal[kept++], &c->journal[i]);
    c->n_journal = kept;
    return true;
}

bool mu_kv_move(mu_kv_cache *c, const int64_t *from, const int64_t *to, int n, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv move: cache is not initialized"); return false; }
    if (!c->ckpt_active) { mu_err_set(err, "kv move: no active checkpoint"); return false; }
    for (int i = 0; i < n; i++) {
        if (to[i] < c->ckpt_pos) {
            mu_err_set(err, "kv move to %" PRId64 ": before the checkpoint at %" PRId64, to[i], c->ckpt_pos);
            return false;
        }
        for (int il = 0; il < c->n_layers; il++)
            if (!is_held(&c->layers[il], from[i]) || !is_held(&c->layers[il], to[i])) {
                mu_err_set(err, "kv move %" PRId64 " -> %" PRId64 ": layer %d does not hold both", from[i], to[i], il);
                return false;
            }
    }
    /* Gathered for copy2d_many (backend.h: one launch on a device) while no
     * row of a layer is both written and read or written twice: a copy that
     * would be sends the gathered ones first, so rows move in the order
     * given (a path's row j may read a row an earlier move wrote to). */
    enum { MOVE_MAX = 32 };
    mu_copy2d cp[2 * MOVE_MAX];
    int n_cp = 0, lay[MOVE_MAX];
    int64_t dph[MOVE_MAX], sph[MOVE_MAX];
    for (int i = 0; i < n; i++) {
        if (from[i] == to[i]) continue;
        for (int il = 0; il < c->n_layers; il++) {
            mu_kv_layer *l = &c->layers[il];
            const int64_t src = physical_of(l, from[i]), dst = physical_of(l, to[i]);
            if (!c->be->copy2d_many) {
                copy_rows(c->be, l, l->k, l->cap, dst, l->k, l->cap, src, 1);
                copy_rows(c->be, l, l->v, l->cap, dst, l->v, l->cap, src, 1);
                continue;
            }
            bool clash = n_cp == MOVE_MAX;
            for (int g = 0; g < n_cp && !clash; g++)
                clash = lay[g] == il && (dst == sph[g] || dst == dph[g] || src == dph[g]);
            if (clash) {
                c->be->copy2d_many(c->be, 2 * n_cp, cp);
                n_cp = 0;
            }
            lay[n_cp] = il, dph[n_cp] = dst, sph[n_cp] = src;
            cp[2 * n_cp] = rows_copy(l, l->k, l->cap, dst, l->k, l->cap, src, 1);
            cp[2 * n_cp + 1] = rows_copy(l, l->v, l->cap, dst, l->v, l->cap, src, 1);
            n_cp++;
        }
    }
    if (n_cp) c->be->copy2d_many(c->be, 2 * n_cp, cp);
    return true;
}

void mu_kv_commit(mu_kv_cache *c) {
    if (!c) return;
    c->ckpt_active = false;
    c->ckpt_pos = 0;
    journal_reset(c);
}

/* ---------- snapshots ---------- */

typedef struct snapshot_layer {
    bool swa;
    int64_t cap, n_head, head_dim, row_elems, origin_logical, origin_physical, len;
    uint16_t *k, *v;  /* held rows in logical order, head-major [n_head][len][head_dim], host memory */
} snapshot_layer;

struct mu_kv_snapshot {
    int n_layers;
    int64_t n_ctx, window;
    snapshot_layer *layers;
};

void mu_kv_snapshot_free(mu_kv_snapshot *s) {
    if (!s) return;
    if (s->layers) {
        for (int i = 0; i < s->n_layers; i++) {
            free(s->layers[i].k);
            free(s->layers[i].v);
        }
    }
    free(s->layers);
    free(s);
}

/* Held rows between the planes and a head-major host copy of len rows. */
static void save_run(void *ctx, const mu_kv_layer *l, int64_t phys, int64_t n, int64_t index) {
    plane_op *op = ctx;
    for (int64_t h = 0; h < l->n_head; h++) {
        op->be->download(op->be, op->k + (h * op->len + index) * l->head_dim, head_at(l, l->k, l->cap, phys, h),
                         (size_t)n * head_bytes(l));
        op->be->download(op->be, op->v + (h * op->len + index) * l->head_dim, head_at(l, l->v, l->cap, phys, h),
                         (size_t)n * head_bytes(l));
    }
}

static void load_run(void *ctx, const mu_kv_layer *l, int64_t phys, int64_t n, int64_t index) {
    plane_op *op = ctx;
    for (int64_t h = 0; h < l->n_head; h++) {
        op->be->upload(op->be, head_at(l, l->k, l->cap, phys, h), op->k + (h * op->len + index) * l->head_dim,
                       (size_t)n * head_bytes(l));
        op->be->upload(op->be, head_at(l, l->v, l->cap, phys, h), op->v + (h * op->len + index) * l->head_dim,
                       (size_t)n * head_bytes(l));
    }
}

mu_kv_snapshot *mu_kv_snapshot_take(const mu_kv_cache *c) {
    if (!c || !c->layers) return NULL;
    mu_kv_snapshot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_layers = c->n_layers;
    s->n_ctx = c->n_ctx;
    s->window = c->window;
    s->layers = calloc((size_t)c->n_layers, sizeof *s->layers);
    if (!s->layers) { free(s); return NULL; }
    for (int i = 0; i < c->n_layers; i++) {
        const mu_kv_layer *l = &c->layers[i];
        snapshot_layer *d = &s->layers[i];
        *d = (snapshot_layer){l->swa, l->cap, l->n_head, l->head_dim, l->row_elems,
                              l->origin_logical, l->origin_physical, l->len, NULL, NULL};
        size_t bytes = (size_t)l->len * (size_t)l->row_elems * sizeof(uint16_t);
        d->k = malloc(bytes ? bytes : 1);
        d->v = malloc(bytes ? bytes : 1);
        if (!d->k || !d->v) { mu_kv_snapshot_free(s); return NULL; }
        plane_op op = {.be = c->be, .k = d->k, .v = d->v, .len = l->len};
        for_runs(l, l->origin_logical, l->len, save_run, &op);
    }
    return s;
}

static bool snapshot_fits(const mu_kv_cache *c, const mu_kv_snapshot *s, mu_error *err) {
    if (s->n_layers != c->n_layers || s->n_ctx != c->n_ctx || s->window != c->window) {
        mu_err_set(err, "kv snapshot restore: geometry mismatch: snapshot has %d layers, n_ctx %" PRId64
                   ", window %" PRId64 "; cache has %d layers, n_ctx %" PRId64 ", window %" PRId64,
                   s->n_layers, s->n_ctx, s->window, c->n_layers, c->n_ctx, c->window);
        return false;
    }
    for (int i = 0; i < c->n_layers; i++) {
        const snapshot_layer *d = &s->layers[i];
        const mu_kv_layer *l = &c->layers[i];
        if (d->swa != l->swa || d->cap != l->cap || d->n_head != l->n_head || d->head_dim != l->head_dim) {
            mu_err_set(err, "kv snapshot restore: layer %d mismatch: snapshot is %s with %" PRId64 " rows of %"
                       PRId64 " heads x %" PRId64 ", cache is %s with %" PRId64 " rows of %" PRId64 " heads x %" PRId64,
                       i, d->swa ? "sliding" : "full", d->cap, d->n_head, d->head_dim,
                       l->swa ? "sliding" : "full", l->cap, l->n_head, l->head_dim);
            return false;
        }
    }
    return true;
}

bool mu_kv_snapshot_restore(mu_kv_cache *c, const mu_kv_snapshot *s, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv snapshot restore: cache is not initialized"); return false; }
    if (!s) { mu_err_set(err, "kv snapshot restore: snapshot is NULL"); return false; }
    if (!snapshot_fits(c, s, err)) return false;
    for (int i = 0; i < c->n_layers; i++) {
        mu_kv_layer *l = &c->layers[i];
        const snapshot_layer *d = &s->layers[i];
        zero_held_rows(c->be, l);  /* with the invariant, the whole plane is now zero */
        l->origin_logical = d->origin_logical;
        l->origin_physical = d->origin_physical;
        l->len = d->len;
        plane_op op = {.be = c->be, .k = d->k, .v = d->v, .len = l->len};
        for_runs(l, l->origin_logical, l->len, load_run, &op);
    }
    mu_kv_commit(c);  /* the journal described the replaced state */
    return true;
}

/* ---------- row transfer by logical position (durable packs) ---------- */

bool mu_kv_read(const mu_kv_cache *c, int layer, int64_t pos, int64_t n, uint16_t *k, uint16_t *v, mu_error *err) {
    if (!c || !c->layers || layer < 0 || layer >= c->n_layers) {
        mu_err_set(err, "kv read: layer %d out of range", layer);
        return false;
    }
    const mu_kv_layer *l = &c->layers[layer];
    if (n < 0 || (n > 0 && (pos < l->origin_logical || pos + n > layer_end(l)))) {
        mu_err_set(err, "kv read: layer %d holds [%" PRId64 ", %" PRId64 "), not [%" PRId64 ", %" PRId64 ")", layer,
                   l->origin_logical, layer_end(l), pos, pos + n);
        return false;
    }
    plane_op op = {.be = c->be, .k = k, .v = v, .len = n};
    if (n > 0) for_runs(l, pos, n, save_run, &op);
    return true;
}

bool mu_kv_place(mu_kv_cache *c, int layer, int64_t pos, int64_t n, const uint16_t *k, const uint16_t *v,
                 mu_error *err) {
    if (!c || !c->layers || layer < 0 || layer >= c->n_layers) {
        mu_err_set(err, "kv place: layer %d out of range", layer);
        return false;
    }
    mu_kv_layer *l = &c->layers[layer];
    if (c->ckpt_active) { mu_err_set(err, "kv place: a checkpoint is active"); return false; }
    if (pos < 0 || n < 0 || pos + n > c->n_ctx) {
        mu_err_set(err, "kv place: layer %d: positions [%" PRId64 ", %" PRId64 ") outside the context of %" PRId64,
                   layer, pos, pos + n, c->n_ctx);
        return false;
    }
    if (l->len > 0 && pos != layer_end(l)) {
        mu_err_set(err, "kv place: layer %d ends at %" PRId64 "; rows at %" PRId64 " would leave a gap", layer,
                   layer_end(l), pos);
        return false;
    }
    if (l->len + n > l->cap) {
        mu_err_set(err, "kv place: layer %d: %" PRId64 " rows do not fit its %" PRId64 "-row %s", layer, l->len + n,
                   l->cap, l->swa ? "ring" : "plane");
        return false;
    }
    if (n == 0) return true;
    if (l->len == 0) {
        l->origin_logical = pos;
        l->origin_physical = pos % l->cap;
    }
    l->len += n;
    plane_op op = {.be = c->be, .k = (uint16_t *)k, .v = (uint16_t *)v, .len = n};
    for_runs(l, pos, n, load_run, &op);
    return true;
}
