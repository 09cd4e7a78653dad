/* Two-class f16 KV cache: SWA rings and growing full planes (book Ch 15).
 *
 * Invariant kept by every operation: a physical row that is not currently
 * held is all zero. It holds at init (zero-filled), append only writes the
 * row it starts holding, rollback restores the exact bytes that were there
 * at the target length, snapshot restore rewrites held rows and zeroes the
 * rest, and clear zeroes the held rows. So clear is O(held rows) and a
 * cleared cache is bitwise identical to a fresh one. */
#include "kv/kv.h"
#include "util/hugemap.h"
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Refuse caches above 1 TiB before asking the allocator (which, with
 * overcommit, might "succeed" and fail only when the pages are touched). */
#define MU_KV_MAX_BYTES (1ull << 40)

static int64_t layer_end(const mu_kv_layer *l) { return l->origin_logical + l->len; }

static int64_t physical_of(const mu_kv_layer *l, int64_t pos) {
    return (l->origin_physical + (pos - l->origin_logical)) % l->cap;
}

static size_t row_bytes(const mu_kv_layer *l) { return (size_t)l->row_elems * sizeof(uint16_t); }
static size_t head_bytes(const mu_kv_layer *l) { return (size_t)l->head_dim * sizeof(uint16_t); }

/* One head of one physical row inside a head-major plane. */
static uint16_t *head_at(const mu_kv_layer *l, uint16_t *plane, int64_t physical, int64_t head) {
    return plane + (head * l->cap + physical) * l->head_dim;
}

/* A physical row, all heads, copied out to (or in from) a token-major
 * buffer of row_elems values, or zeroed. */
static void row_out(const mu_kv_layer *l, uint16_t *plane, int64_t physical, uint16_t *dst) {
    for (int64_t h = 0; h < l->n_head; h++) memcpy(dst + h * l->head_dim, head_at(l, plane, physical, h), head_bytes(l));
}

static void row_in(const mu_kv_layer *l, uint16_t *plane, int64_t physical, const uint16_t *src) {
    for (int64_t h = 0; h < l->n_head; h++) memcpy(head_at(l, plane, physical, h), src + h * l->head_dim, head_bytes(l));
}

static void row_zero(const mu_kv_layer *l, uint16_t *plane, int64_t physical) {
    for (int64_t h = 0; h < l->n_head; h++) memset(head_at(l, plane, physical, h), 0, head_bytes(l));
}

/* ---------- init / free / clear ---------- */

/* A zero-filled plane. At 2 MiB or more: a 2 MiB-aligned anonymous mapping
 * advised MADV_HUGEPAGE. Attention walks a plane row by row; in 4 KiB pages
 * every 8 rows of 512 bytes cost a TLB walk (a nested one in a VM). Smaller
 * planes keep 4 KiB pages, so a small cache does not commit a whole huge
 * page per plane. *mapped receives the bytes to unmap (0: calloc'd). */
static bool alloc_zeroed(uint16_t **out, uint64_t *mapped, uint64_t bytes, const char *what, int layer,
                         mu_error *err) {
    uint8_t *p = NULL;
    *mapped = 0;
#if !defined(__SANITIZE_ADDRESS__) /* sanitizer builds keep calloc: its redzones catch a write past a plane */
    if (bytes >= MU_HUGE_PAGE) {
        *mapped = (bytes + MU_HUGE_PAGE - 1) & ~(MU_HUGE_PAGE - 1);
        p = mu_map_aligned(*mapped, false);
#ifdef MADV_HUGEPAGE
        if (p) madvise(p, (size_t)*mapped, MADV_HUGEPAGE);
#endif
    }
#endif
    if (!*mapped) p = calloc(1, (size_t)bytes);
    *out = (uint16_t *)p;
    if (!p) mu_err_set(err, "kv init: cannot allocate %" PRIu64 " bytes for the %s of layer %d", bytes, what, layer);
    return p != NULL;
}

static void free_plane(uint16_t *p, uint64_t mapped) {
    if (!p) return;
    if (mapped) munmap(p, (size_t)mapped);
    else free(p);
}

static bool check_geometry(int n_layers, const bool *is_swa, int64_t window, int64_t n_ctx,
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

static int64_t layer_cap(bool swa, int64_t window, int64_t n_ctx) {
    return swa && window < n_ctx ? window : n_ctx;
}

/* Total bytes of all planes plus the journal's saved rows. */
static bool total_bytes(int n_layers, const bool *is_swa, int64_t window, int64_t n_ctx,
                        int64_t row_elems, uint64_t *total) {
    uint64_t bytes;
    *total = 0;
    for (int i = 0; i < n_layers; i++) {
        if (!rows_bytes(layer_cap(is_swa[i], window, n_ctx), row_elems, &bytes) ||
            !mu_mul_u64(bytes, 2, &bytes) || !mu_add_u64(*total, bytes, total))
            return false;
    }
    return rows_bytes((int64_t)n_layers * MU_KV_MAX_ROLLBACK * 2, row_elems, &bytes) &&
           mu_add_u64(*total, bytes, total);
}

static bool alloc_journal(mu_kv_cache *c, int64_t row_elems, mu_error *err) {
    int n = c->n_layers * MU_KV_MAX_ROLLBACK;
    c->journal = calloc((size_t)n, sizeof *c->journal);
    if (!c->journal) { mu_err_set(err, "kv init: cannot allocate the rollback journal (%d entries)", n); return false; }
    for (int i = 0; i < n; i++) {
        /* one block per entry: old K row, then old V row */
        c->journal[i].old_k = malloc(2 * (size_t)row_elems * sizeof(uint16_t));
        if (!c->journal[i].old_k) {
            mu_err_set(err, "kv init: cannot allocate rollback journal entry %d", i);
            return false;
        }
        c->journal[i].old_v = c->journal[i].old_k + row_elems;
    }
    return true;
}

bool mu_kv_init(mu_kv_cache *c, int n_layers, const bool *is_swa, int64_t window,
                int64_t n_ctx, int64_t n_head, int64_t head_dim, mu_error *err) {
    if (!c) { mu_err_set(err, "kv init: cache is NULL"); return false; }
    memset(c, 0, sizeof *c);
    if (!check_geometry(n_layers, is_swa, window, n_ctx, n_head, head_dim, err)) return false;
    uint64_t total, row = 0;
    if (!mu_mul_u64((uint64_t)n_head, (uint64_t)head_dim, &row) || row > (uint64_t)INT64_MAX ||
        !total_bytes(n_layers, is_swa, window, n_ctx, (int64_t)row, &total) || total > MU_KV_MAX_BYTES) {
        mu_err_set(err, "kv init: %d layers, n_ctx %" PRId64 ", window %" PRId64 ", %" PRId64 " heads of %" PRId64
                   " need more than the %llu-byte limit", n_layers, n_ctx, window, n_head, head_dim,
                   (unsigned long long)MU_KV_MAX_BYTES);
        return false;
    }
    const int64_t row_elems = (int64_t)row;
    c->n_layers = n_layers;
    c->n_ctx = n_ctx;
    c->window = window;
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);
    if (!c->layers) {
        mu_err_set(err, "kv init: cannot allocate %d layer records", n_layers);
        mu_kv_free(c);
        return false;
    }
    for (int i = 0; i < n_layers; i++) {
        mu_kv_layer *l = &c->layers[i];
        l->swa = is_swa[i];
        l->cap = layer_cap(l->swa, window, n_ctx);
        l->n_head = n_head;
        l->head_dim = head_dim;
        l->row_elems = row_elems;
        uint64_t bytes;
        rows_bytes(l->cap, row_elems, &bytes);  /* checked by total_bytes */
        if (!alloc_zeroed(&l->k, &l->mapped, bytes, "K plane", i, err) ||
            !alloc_zeroed(&l->v, &l->mapped, bytes, "V plane", i, err)) {
            mu_kv_free(c);
            return false;
        }
    }
    if (!alloc_journal(c, row_elems, err)) {
        mu_kv_free(c);
        return false;
    }
    return true;
}

void mu_kv_free(mu_kv_cache *c) {
    if (!c) return;
    if (c->journal) {
        for (int i = 0; i < c->n_layers * MU_KV_MAX_ROLLBACK; i++) free(c->journal[i].old_k);
    }
    free(c->journal);
    if (c->layers) {
        for (int i = 0; i < c->n_layers; i++) {
            free_plane(c->layers[i].k, c->layers[i].mapped);
            free_plane(c->layers[i].v, c->layers[i].mapped);
        }
    }
    free(c->layers);
    memset(c, 0, sizeof *c);
}

static void zero_held_rows(mu_kv_layer *l) {
    for (int64_t i = 0; i < l->len; i++) {
        int64_t p = (l->origin_physical + i) % l->cap;
        row_zero(l, l->k, p);
        row_zero(l, l->v, p);
    }
}

void mu_kv_clear(mu_kv_cache *c) {
    if (!c || !c->layers) return;
    for (int i = 0; i < c->n_layers; i++) {
        mu_kv_layer *l = &c->layers[i];
        zero_held_rows(l);
        l->origin_logical = l->origin_physical = l->len = 0;
    }
    mu_kv_commit(c);
}

/* ---------- append and row access ---------- */

static void store_row_f16(const mu_kv_layer *l, uint16_t *plane, int64_t physical, const float *src) {
    for (int64_t h = 0; h < l->n_head; h++) {
        uint16_t *dst = head_at(l, plane, physical, h);
        for (int64_t i = 0; i < l->head_dim; i++) dst[i] = mu_f32_to_f16(src[h * l->head_dim + i]);
    }
}

bool mu_kv_append(mu_kv_cache *c, int layer, int64_t pos, const float *k, const float *v, mu_error *err) {
    if (!c || !c->layers) { mu_err_set(err, "kv append: cache is not initialized"); return false; }
    if (layer < 0 || layer >= c->n_layers) {
        mu_err_set(err, "kv append: layer %d out of range [0, %d)", layer, c->n_layers);
        return false;
    }
    if (!k || !v) { mu_err_set(err, "kv append: layer %d position %" PRId64 ": K or V row is NULL", layer, pos); return false; }
    mu_kv_layer *l = &c->layers[layer];
    int64_t expected = layer_end(l);
    if (pos != expected) {
        mu_err_set(err, "kv append: layer %d: cache discontinuity: expected position %" PRId64 ", got %" PRId64,
                   layer, expected, pos);
        return false;
    }
    if (pos >= c->n_ctx) {
        mu_err_set(err, "kv append: layer %d: position %" PRId64 " is outside the context (n_ctx %" PRId64 ")",
                   layer, pos, c->n_ctx);
        return false;
    }
    if (c->ckpt_active && pos - c->ckpt_pos >= MU_KV_MAX_ROLLBACK) {
        mu_err_set(err, "kv append: layer %d: position %" PRId64 " would be row %" PRId64 " past the checkpoint "
                   "at %" PRId64 "; at most %d rows can be rolled back (commit first)",
                   layer, pos, pos - c->ckpt_pos + 1, c->ckpt_pos, MU_KV_MAX_ROLLBACK);
        return false;
    }
    if (c->ckpt_active && c->n_journal >= c->n_layers * MU_KV_MAX_ROLLBACK) {
        mu_err_set(err, "kv append: layer %d: rollback journal full (%d entries)", layer, c->n_journal);
        return false;
    }

    bool overwrite = l->len == l->cap;  /* only a full SWA ring: pos < n_ctx = cap for full planes */
    int64_t write = overwrite ? l->origin_physical : (l->origin_physical + l->len) % l->cap;
    if (c->ckpt_active) {
        /* keep the old bytes of every written row, held or not, so rollback is bitwise */
        mu_kv_journal_entry *e = &c->journal[c->n_journal++];
        e->layer = layer;
        e->pos = pos;
        e->physical = write;
        e->prev_origin_logical = l->origin_logical;
        e->prev_origin_physical = l->origin_physical;
        e->prev_len = l->len;
        e->saved = true;
        row_out(l, l->k, write, e->old_k);
        row_out(l, l->v, write, e->old_v);
    }
    store_row_f16(l, l->k, write, k);
    store_row_f16(l, l->v, write, v);
    if (overwrite) {
        l->origin_logical += 1;
        l->origin_physical = (l->origin_physical + 1) % l->cap;
    } else {
        l->len += 1;
    }
    return true;
}

static bool is_held(const mu_kv_layer *l, int64_t pos) {
    return l && pos >= l->origin_logical && pos < layer_end(l);
}

const uint16_t *mu_kv_k(const mu_kv_layer *l, int64_t pos, int64_t head) {
    return is_held(l, pos) && head >= 0 && head < l->n_head ? head_at(l, l->k, physical_of(l, pos), head) : NULL;
}

const uint16_t *mu_kv_v(const mu_kv_layer *l, int64_t pos, int64_t head) {
    return is_held(l, pos) && head >= 0 && head < l->n_head ? head_at(l, l->v, physical_of(l, pos), head) : NULL;
}

bool mu_kv_head_rows(const mu_kv_layer *l, int64_t pos, int64_t n, int64_t head, const uint16_t **k,
                     const uint16_t **v) {
    if (n <= 0 || !is_held(l, pos) || !is_held(l, pos + n - 1) || head < 0 || head >= l->n_head) return false;
    const uint16_t *kp = head_at(l, l->k, 0, head), *vp = head_at(l, l->v, 0, head);
    for (int64_t i = 0, phys = physical_of(l, pos); i < n; i++) {
        k[i] = kp + phys * l->head_dim;
        v[i] = vp + phys * l->head_dim;
        if (++phys == l->cap) phys = 0;
    }
    return true;
}

/* ---------- checkpoint / rollback / commit ---------- */

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
    c->n_journal = 0;
    return true;
}

static void undo_entry(mu_kv_cache *c, const mu_kv_journal_entry *e) {
    mu_kv_layer *l = &c->layers[e->layer];
    if (e->saved) {
        row_in(l, l->k, e->physical, e->old_k);
        row_in(l, l->v, e->physical, e->old_v);
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
    /* undo newest first; entries of different layers are independent */
    for (int i = c->n_journal - 1; i >= 0; i--)
        if (c->journal[i].pos >= pos) undo_entry(c, &c->journal[i]);
    /* keep the older entries in order; swapping keeps each entry's row block owned once */
    int kept = 0;
    for (int i = 0; i < c->n_journal; i++)
        if (c->journal[i].pos < pos) swap_entries(&c->journal[kept++], &c->journal[i]);
    c->n_journal = kept;
    return true;
}

void mu_kv_commit(mu_kv_cache *c) {
    if (!c) return;
    c->ckpt_active = false;
    c->ckpt_pos = 0;
    c->n_journal = 0;
}

/* ---------- snapshots ---------- */

typedef struct snapshot_layer {
    bool swa;
    int64_t cap, n_head, head_dim, row_elems, origin_logical, origin_physical, len;
    uint16_t *k, *v;  /* held rows in logical order, token-major, len * row_elems each */
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
        size_t bytes = (size_t)l->len * row_bytes(l);
        d->k = malloc(bytes ? bytes : 1);
        d->v = malloc(bytes ? bytes : 1);
        if (!d->k || !d->v) { mu_kv_snapshot_free(s); return NULL; }
        for (int64_t j = 0; j < l->len; j++) {
            int64_t p = (l->origin_physical + j) % l->cap;
            row_out(l, l->k, p, d->k + j * l->row_elems);
            row_out(l, l->v, p, d->v + j * l->row_elems);
        }
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
        zero_held_rows(l);  /* with the invariant, the whole plane is now zero */
        l->origin_logical = d->origin_logical;
        l->origin_physical = d->origin_physical;
        l->len = d->len;
        for (int64_t j = 0; j < l->len; j++) {
            int64_t p = (l->origin_physical + j) % l->cap;
            row_in(l, l->k, p, d->k + j * l->row_elems);
            row_in(l, l->v, p, d->v + j * l->row_elems);
        }
    }
    mu_kv_commit(c);  /* the journal described the replaced state */
    return true;
}
