/* KV cache: ring placement against an independent model of every appended
 * row, fail-closed appends, checkpoint/rollback compared bitwise (all plane
 * bytes and metadata) with copies taken at each length, snapshots, full
 * planes, n_ctx below the window, clear. */
#include "testutil.h"
#include "kv/kv.h"
#include "backend/backend.h"

#define HEADS 3     /* KV heads per row */
#define HEAD_DIM 4
#define ROW (HEADS * HEAD_DIM) /* elements per K/V row */
#define WINDOW 8
#define N_CTX 64
#define MAX_LAYERS 4

static const bool KINDS[MAX_LAYERS] = {true, false, true, false}; /* SWA, full, SWA, full */

/* ---------- the independent model: every row ever appended ---------- */

typedef struct {
    uint16_t k[MAX_LAYERS][N_CTX][ROW], v[MAX_LAYERS][N_CTX][ROW];
} model;

/* Deterministic random non-zero row for (layer, pos, generation). */
static void make_row(int layer, int64_t pos, int gen, int which, float *out) {
    uint64_t s = 0x243F6A8885A308D3ull ^ ((uint64_t)layer << 48) ^ ((uint64_t)pos << 24) ^
                 ((uint64_t)gen << 8) ^ (uint64_t)which;
    for (int i = 0; i < 3; i++) tu_rng_next(&s);
    for (int i = 0; i < ROW; i++) {
        float x = tu_rng_normal(&s) * 3.0f;
        out[i] = x != 0.0f ? x : 0.75f;
    }
}

static bool append_row(mu_kv_cache *c, model *m, int layer, int64_t pos, int gen, mu_error *err) {
    float k[ROW], v[ROW];
    make_row(layer, pos, gen, 0, k);
    make_row(layer, pos, gen, 1, v);
    if (!mu_kv_append(c, layer, pos, k, v, err)) return false;
    for (int i = 0; i < ROW; i++) {
        m->k[layer][pos][i] = mu_f32_to_f16(k[i]);
        m->v[layer][pos][i] = mu_f32_to_f16(v[i]);
    }
    return true;
}

/* Append position `pos` to every layer, as the forward pass does. */
static void append_token(mu_kv_cache *c, model *m, int64_t pos, int gen) {
    mu_error err = {{0}};
    for (int l = 0; l < c->n_layers; l++)
        CHECK_MSG(append_row(c, m, l, pos, gen, &err), "append layer %d pos %lld: %s", l, (long long)pos, err.msg);
}

static bool row_is_zero(const uint16_t *r, int64_t n) {
    for (int64_t i = 0; i < n; i++) if (r[i]) return false;
    return true;
}

/* Every layer holds [end - min(end, cap), end) placed as a ring that started
 * at physical 0; held rows equal the model, all other rows are zero. */
static void check_layer(const mu_kv_cache *c, const model *m, int layer, int64_t end, const char *what) {
    const mu_kv_layer *l = &c->layers[layer];
    int64_t len = end < l->cap ? end : l->cap, first = end - len;
    CHECK_MSG(l->len == len && l->origin_logical == first && l->origin_physical == first % l->cap,
              "%s: layer %d metadata (%lld, %lld, %lld), expected (%lld, %lld, %lld)", what, layer,
              (long long)l->origin_logical, (long long)l->origin_physical, (long long)l->len,
              (long long)first, (long long)(first % l->cap), (long long)len);
    CHECK_EQ_INT(mu_kv_first(l), first);
    CHECK_EQ_INT(mu_kv_count(l), len);
    CHECK_EQ_INT(mu_kv_end(l), end);
    for (int64_t p = first; p < end; p++) {
        for (int h = 0; h < HEADS; h++) {
            const uint16_t *k = mu_kv_k(l, p, h), *v = mu_kv_v(l, p, h);
            CHECK_MSG(k && v && !memcmp(k, m->k[layer][p] + h * HEAD_DIM, HEAD_DIM * sizeof(uint16_t)) &&
                      !memcmp(v, m->v[layer][p] + h * HEAD_DIM, HEAD_DIM * sizeof(uint16_t)),
                      "%s: layer %d head %d at position %lld differs from the model", what, layer, h, (long long)p);
            /* head-major ring placement: logical p at physical p mod cap of head h's plane */
            CHECK(k == l->k + (h * l->cap + p % l->cap) * HEAD_DIM && v == l->v + (h * l->cap + p % l->cap) * HEAD_DIM);
        }
    }
    CHECK(mu_kv_k(l, first - 1, 0) == NULL && mu_kv_v(l, end, 0) == NULL);
    if (len > 0) {
        CHECK(mu_kv_k(l, first, HEADS) == NULL && mu_kv_v(l, first, -1) == NULL);
        /* the span walk (across the ring's wrap) gives the same pointers, and refuses what is not held */
        const uint16_t *kr[N_CTX], *vr[N_CTX];
        for (int h = 0; h < HEADS; h++) {
            CHECK(mu_kv_head_rows(l, first, len, h, kr, vr));
            for (int64_t i = 0; i < len; i++)
                CHECK_MSG(kr[i] == mu_kv_k(l, first + i, h) && vr[i] == mu_kv_v(l, first + i, h),
                          "%s: layer %d head %d: span row %lld", what, layer, h, (long long)i);
        }
        CHECK(!mu_kv_head_rows(l, first, len + 1, 0, kr, vr) && !mu_kv_head_rows(l, first - 1, 1, 0, kr, vr) &&
              !mu_kv_head_rows(l, first, 1, HEADS, kr, vr) && !mu_kv_head_rows(l, first, 0, 0, kr, vr));
    }
    for (int64_t phys = 0; phys < l->cap; phys++) {
        bool held = (phys - first % l->cap + l->cap) % l->cap < len;
        for (int h = 0; h < HEADS && !held; h++) {
            const int64_t at = (h * l->cap + phys) * HEAD_DIM;
            CHECK_MSG(row_is_zero(l->k + at, HEAD_DIM) && row_is_zero(l->v + at, HEAD_DIM),
                      "%s: layer %d physical row %lld head %d is not held but not zero", what, layer,
                      (long long)phys, h);
        }
    }
}

static void check_all(const mu_kv_cache *c, const model *m, int64_t end, const char *what) {
    for (int l = 0; l < c->n_layers; l++) check_layer(c, m, l, end, what);
}

/* ---------- full bitwise copies of a cache, independent of the snapshot API ---------- */

typedef struct {
    int n_layers;
    mu_kv_layer meta[MAX_LAYERS];
    uint16_t *k[MAX_LAYERS], *v[MAX_LAYERS];
    bool ckpt_active;
    int64_t ckpt_pos;
    int n_journal;
} clone;

static clone clone_take(const mu_kv_cache *c) {
    clone s = {0};
    s.n_layers = c->n_layers;
    for (int i = 0; i < c->n_layers; i++) {
        s.meta[i] = c->layers[i];
        size_t bytes = (size_t)(c->layers[i].cap * ROW) * sizeof(uint16_t);
        s.k[i] = malloc(bytes);
        s.v[i] = malloc(bytes);
        memcpy(s.k[i], c->layers[i].k, bytes);
        memcpy(s.v[i], c->layers[i].v, bytes);
    }
    s.ckpt_active = c->ckpt_active;
    s.ckpt_pos = c->ckpt_pos;
    s.n_journal = c->n_journal;
    return s;
}

static void clone_free(clone *s) {
    for (int i = 0; i < s->n_layers; i++) { free(s->k[i]); free(s->v[i]); }
    memset(s, 0, sizeof *s);
}

/* All plane bytes, metadata and checkpoint state equal. */
static bool clone_equal(const mu_kv_cache *c, const clone *s) {
    if (c->n_layers != s->n_layers || c->ckpt_active != s->ckpt_active || c->ckpt_pos != s->ckpt_pos ||
        c->n_journal != s->n_journal)
        return false;
    for (int i = 0; i < c->n_layers; i++) {
        const mu_kv_layer *a = &c->layers[i], *b = &s->meta[i];
        size_t bytes = (size_t)(a->cap * ROW) * sizeof(uint16_t);
        if (a->swa != b->swa || a->cap != b->cap || a->row_elems != b->row_elems ||
            a->origin_logical != b->origin_logical || a->origin_physical != b->origin_physical ||
            a->len != b->len || memcmp(a->k, s->k[i], bytes) || memcmp(a->v, s->v[i], bytes))
            return false;
    }
    return true;
}

static void init_cache(mu_kv_cache *c, int n_layers, const bool *kinds, int64_t window, int64_t n_ctx) {
    mu_error err = {{0}};
    bool ok = mu_kv_init(c, NULL, n_layers, kinds, window, 0, n_ctx, HEADS, HEAD_DIM, &err);
    CHECK_MSG(ok, "init: %s", err.msg);
    if (!ok) exit(1);
}

static bool contains(const mu_error *err, const char *s) { return strstr(err->msg, s) != NULL; }

/* ---------- tests ---------- */

static void test_init_errors(void) {
    mu_kv_cache c;
    mu_error err = {{0}};
    CHECK(!mu_kv_init(&c, NULL, 0, KINDS, WINDOW, 0, N_CTX, HEADS, HEAD_DIM, &err) && contains(&err, "n_layers 0"));
    CHECK(!mu_kv_init(&c, NULL, 4, NULL, WINDOW, 0, N_CTX, HEADS, HEAD_DIM, &err) && contains(&err, "is_swa"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, WINDOW, 0, 0, HEADS, HEAD_DIM, &err) && contains(&err, "n_ctx 0"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, WINDOW, 0, N_CTX, 0, HEAD_DIM, &err) && contains(&err, "n_head 0"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, WINDOW, 0, N_CTX, HEADS, -4, &err) && contains(&err, "head_dim -4"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, -1, 0, N_CTX, HEADS, HEAD_DIM, &err) && contains(&err, "window -1"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, 0, 0, N_CTX, HEADS, HEAD_DIM, &err) && contains(&err, "layer 0 is sliding-window"));
    /* sizes that overflow 64 bits, and sizes that are merely absurd */
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, WINDOW, 0, INT64_MAX, INT64_MAX / 2, 1, &err) && contains(&err, "byte limit"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, WINDOW, 0, (int64_t)1 << 40, 2, 128, &err) && contains(&err, "byte limit"));
    CHECK(!mu_kv_init(&c, NULL, 4, KINDS, WINDOW, 0, N_CTX, INT64_MAX / 2, 4, &err) && contains(&err, "byte limit"));
    CHECK(c.layers == NULL); /* failed init leaves an empty, freeable cache */
    mu_kv_free(&c);
    mu_kv_free(NULL);
}

static void test_append_and_wrap(void) {
    mu_kv_cache c;
    static model m;
    init_cache(&c, 4, KINDS, WINDOW, N_CTX);
    CHECK_EQ_INT(c.layers[0].cap, WINDOW);
    CHECK_EQ_INT(c.layers[1].cap, N_CTX);
    check_all(&c, &m, 0, "empty");
    for (int64_t p = 0; p < 30; p++) {
        append_token(&c, &m, p, 0);
        char what[64];
        snprintf(what, sizeof what, "after position %lld", (long long)p);
        check_all(&c, &m, p + 1, what);
    }
    /* after 30 appends the ring holds 22..29 starting at physical 6 */
    CHECK_EQ_INT(c.layers[2].origin_logical, 22);
    CHECK_EQ_INT(c.layers[2].origin_physical, 6);
    CHECK_EQ_INT(c.layers[3].origin_physical, 0);
    /* f16 round-to-nearest-even at the store */
    float k[ROW], v[ROW];
    for (int i = 0; i < ROW; i++) { k[i] = 1.0f + 0x1p-11f * (float)i; v[i] = -(float)(i + 1) * 10000.0f; }
    mu_error err = {{0}};
    CHECK(mu_kv_append(&c, 0, 30, k, v, &err));
    const uint16_t *kr = mu_kv_k(&c.layers[0], 30, 0), *vr = mu_kv_v(&c.layers[0], 30, 1);
    CHECK_EQ_INT(kr[1], 0x3C00); /* 1 + 2^-11: tie, to even */
    CHECK_EQ_INT(kr[3], 0x3C02); /* 1 + 3*2^-11: tie, to even (up) */
    CHECK_EQ_INT(vr[6 - HEAD_DIM], 0xFC00); /* v[6] = -70000 overflows f16 to -inf */
    for (int i = 0; i < ROW; i++) CHECK_EQ_INT(mu_kv_k(&c.layers[0], 30, i / HEAD_DIM)[i % HEAD_DIM], mu_f32_to_f16(k[i]));
    mu_kv_free(&c);
}

static void test_append_rejects(void) {
    mu_kv_cache c;
    static model m;
    mu_error err = {{0}};
    init_cache(&c, 4, KINDS, WINDOW, N_CTX);
    for (int64_t p = 0; p < 30; p++) append_token(&c, &m, p, 0);
    clone before = clone_take(&c);
    float row[ROW];
    make_row(0, 0, 0, 0, row);
    CHECK(!mu_kv_append(&c, 0, 31, row, row, &err) && contains(&err, "expected position 30, got 31"));
    CHECK(!mu_kv_append(&c, 2, 29, row, row, &err) && contains(&err, "layer 2"));
    CHECK(!mu_kv_append(&c, 1, -1, row, row, &err) && contains(&err, "discontinuity"));
    CHECK(!mu_kv_append(&c, 4, 30, row, row, &err) && contains(&err, "layer 4 out of range"));
    CHECK(!mu_kv_append(&c, -1, 30, row, row, &err) && contains(&err, "layer -1 out of range"));
    CHECK(!mu_kv_append(&c, 0, 30, NULL, row, &err) && contains(&err, "NULL"));
    CHECK(clone_equal(&c, &before));
    check_all(&c, &m, 30, "after rejected appends");
    /* the context ends at n_ctx, for rings and full planes alike */
    for (int64_t p = 30; p < N_CTX; p++) append_token(&c, &m, p, 0);
    check_all(&c, &m, N_CTX, "full context");
    clone_free(&before);
    before = clone_take(&c);
    for (int l = 0; l < 4; l++)
        CHECK(!mu_kv_append(&c, l, N_CTX, row, row, &err) && contains(&err, "outside the context (n_ctx 64)"));
    CHECK(clone_equal(&c, &before));
    clone_free(&before);
    mu_kv_free(&c);
}

/* Checkpoint at `prefix`, append m tokens, roll back to every t in
 * [prefix, prefix + m] on a fresh run each, compare with the copy taken when
 * the length was t, then append new rows and check them. */
static int rollback_case(int64_t prefix, int m, int64_t t) {
    mu_kv_cache c;
    static model md;
    mu_error err = {{0}};
    clone at[MU_KV_MAX_ROLLBACK + 1];
    init_cache(&c, 4, KINDS, WINDOW, N_CTX);
    for (int64_t p = 0; p < prefix; p++) append_token(&c, &md, p, 0);
    CHECK(mu_kv_checkpoint(&c, &err));
    at[0] = clone_take(&c);
    for (int j = 1; j <= m; j++) {
        append_token(&c, &md, prefix + j - 1, 1);
        at[j] = clone_take(&c);
    }
    int failures_before = tu_failures;
    CHECK_MSG(mu_kv_rollback(&c, t, &err), "rollback: %s", err.msg);
    CHECK_MSG(clone_equal(&c, &at[t - prefix]), "prefix %lld, %d rows, rollback to %lld: state differs",
              (long long)prefix, m, (long long)t);
    check_all(&c, &md, t, "after rollback");
    /* the rows past t are gone for good: new rows land where they should */
    for (int64_t p = t; p < prefix + m; p++) append_token(&c, &md, p, 2);
    check_all(&c, &md, prefix + m, "re-appended after rollback");
    CHECK(mu_kv_rollback(&c, prefix, &err) && clone_equal(&c, &at[0]));
    for (int j = 0; j <= m; j++) clone_free(&at[j]);
    mu_kv_free(&c);
    return tu_failures - failures_before;
}

static void test_rollback_every_position(void) {
    const int64_t prefixes[] = {0, 3, 8, 30}; /* empty, ring filling, ring exactly full, wrapped */
    int cases = 0, failed = 0;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        for (int m = 1; m <= MU_KV_MAX_ROLLBACK; m++)
            for (int64_t t = prefixes[i]; t <= prefixes[i] + m; t++, cases++)
                failed += rollback_case(prefixes[i], m, t) != 0;
    printf("rollback: %d (prefix, rows, target) cases compared bitwise, %d failed\n", cases, failed);
}

/* A verification-style step: m rows of every layer in one store (the
 * journal holds each layer's rows as a run, restored in one copy), rolled
 * back to every t, against the same rows appended one at a time with
 * copies taken at each length. Rings with slack 15 (cap 23): prefix 30
 * wraps them, and a store may wrap in the middle. */
static void test_rollback_multirow(void) {
    const int64_t prefixes[] = {0, 5, 20, 30};
    const int ms[] = {3, 8, 16};
    static model ma, mb;
    int cases = 0, failed = 0;
    for (size_t pi = 0; pi < sizeof prefixes / sizeof *prefixes; pi++)
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
            const int64_t prefix = prefixes[pi];
            const int m = ms[mi];
            for (int64_t t = prefix; t <= prefix + m; t++, cases++) {
                mu_kv_cache a, b;
                mu_error err = {{0}};
                clone at[MU_KV_MAX_ROLLBACK + 1];
                const int before = tu_failures;
                CHECK(mu_kv_init(&a, NULL, 4, KINDS, WINDOW, 15, N_CTX, HEADS, HEAD_DIM, &err));
                CHECK(mu_kv_init(&b, NULL, 4, KINDS, WINDOW, 15, N_CTX, HEADS, HEAD_DIM, &err));
                for (int64_t p = 0; p < prefix; p++) append_token(&a, &ma, p, 0), append_token(&b, &mb, p, 0);
                CHECK(mu_kv_checkpoint(&a, &err) && mu_kv_checkpoint(&b, &err));
                at[0] = clone_take(&b);
                for (int j = 1; j <= m; j++) {
                    append_token(&b, &mb, prefix + j - 1, 1);
                    at[j] = clone_take(&b);
                }
                float k[MU_KV_MAX_ROLLBACK * ROW], v[MU_KV_MAX_ROLLBACK * ROW];
                for (int l = 0; l < 4; l++) {
                    for (int j = 0; j < m; j++) {
                        make_row(l, prefix + j, 1, 0, k + j * ROW);
                        make_row(l, prefix + j, 1, 1, v + j * ROW);
                    }
                    CHECK_MSG(mu_kv_store(&a, l, prefix, m, k, v, &err), "store: %s", err.msg);
                }
                CHECK(clone_equal(&a, &at[m]));
                CHECK_MSG(mu_kv_rollback(&a, t, &err) && clone_equal(&a, &at[t - prefix]),
                          "prefix %lld, %d rows in one store, rollback to %lld: state differs", (long long)prefix, m,
                          (long long)t);
                /* and on to the checkpoint: the runs left after the first rollback */
                CHECK(mu_kv_rollback(&a, prefix, &err) && clone_equal(&a, &at[0]));
                for (int j = 0; j <= m; j++) clone_free(&at[j]);
                mu_kv_free(&a);
                mu_kv_free(&b);
                failed += tu_failures != before;
            }
        }
    printf("rollback after multi-row stores: %d cases compared bitwise, %d failed\n", cases, failed);
}

/* A token tree's kept path (mu_kv_move, then rollback) gives the bytes of
 * storing the path's rows in order; refusals change nothing. */
/* copy2d_many's copies in reverse order: the same bytes as in order only
 * when the copies are independent, as backend.h requires of its callers
 * (a device runs them at once). */
static void reversed_many(mu_backend *b, int n, const mu_copy2d *c) {
    for (int i = n - 1; i >= 0; i--) b->copy2d(b, c[i].dst, c[i].dst_stride, c[i].src, c[i].src_stride, c[i].width, c[i].rows);
}

/* be NULL: the host's planes; else be's (with copy2d_many reversed). */
static void test_move_path(mu_backend *be) {
    static const int32_t path[] = {0, 2, 5, 11, 15}; /* row 2 moves to 1 before row 5 moves to 2 */
    enum { NP = sizeof path / sizeof *path, T = 16 };
    const int64_t prefixes[] = {0, 5, 30};
    int cases = 0;
    for (size_t pi = 0; pi < sizeof prefixes / sizeof *prefixes; pi++) {
        const int64_t prefix = prefixes[pi];
        static model ma, mb;
        mu_kv_cache a, b;
        mu_error err = {{0}};
        CHECK(mu_kv_init(&a, be, 4, KINDS, WINDOW, T - 1, N_CTX, HEADS, HEAD_DIM, &err));
        CHECK(mu_kv_init(&b, be, 4, KINDS, WINDOW, T - 1, N_CTX, HEADS, HEAD_DIM, &err));
        for (int64_t p = 0; p < prefix; p++) append_token(&a, &ma, p, 0), append_token(&b, &mb, p, 0);
        int64_t from[NP], to[NP];
        for (int j = 0; j < NP; j++) from[j] = prefix + path[j], to[j] = prefix + j;
        CHECK(!mu_kv_move(&a, from, to, NP, &err) && contains(&err, "no active checkpoint"));
        CHECK(mu_kv_checkpoint(&a, &err) && mu_kv_checkpoint(&b, &err));
        clone at0 = clone_take(&a);
        float k[T * ROW], v[T * ROW];
        for (int l = 0; l < 4; l++) { /* the tree's rows: node i's row is made as position prefix + i's */
            for (int i = 0; i < T; i++) make_row(l, prefix + i, 1, 0, k + i * ROW), make_row(l, prefix + i, 1, 1, v + i * ROW);
            CHECK(mu_kv_store(&a, l, prefix, T, k, v, &err));
            for (int j = 0; j < NP; j++) { /* plain: the path's rows at consecutive positions */
                memcpy(k + j * ROW, k + path[j] * ROW, sizeof(float) * ROW);
                memcpy(v + j * ROW, v + path[j] * ROW, sizeof(float) * ROW);
            }
            CHECK(mu_kv_store(&b, l, prefix, NP, k, v, &err));
        }
        clone before = clone_take(&a);
        int64_t early[1] = {prefix - 1}, late[1] = {prefix + T};
        if (prefix > 0) CHECK(!mu_kv_move(&a, from, early, 1, &err) && contains(&err, "before the checkpoint"));
        CHECK(!mu_kv_move(&a, late, to, 1, &err) && contains(&err, "does not hold both"));
        CHECK(clone_equal(&a, &before));
        CHECK_MSG(mu_kv_move(&a, from, to, NP, &err) && mu_kv_rollback(&a, prefix + NP, &err), "%s", err.msg);
        clone want = clone_take(&b);
        CHECK_MSG(clone_equal(&a, &want), "prefix %lld: the moved path differs from plain stores", (long long)prefix);
        CHECK(mu_kv_rollback(&a, prefix, &err) && clone_equal(&a, &at0)); /* the journal still restores all */
        clone_free(&at0), clone_free(&before), clone_free(&want);
        mu_kv_free(&a), mu_kv_free(&b);
        cases++;
    }
    printf("kept tree paths%s: %d cases compared bitwise\n", be ? " (copies gathered, run in reverse)" : "", cases);
}

static void test_rollback_limits(void) {
    mu_kv_cache c;
    static model m;
    mu_error err = {{0}};
    clone at[MU_KV_MAX_ROLLBACK + 1];
    init_cache(&c, 4, KINDS, WINDOW, N_CTX);
    CHECK(!mu_kv_rollback(&c, 0, &err) && contains(&err, "no active checkpoint"));
    for (int64_t p = 0; p < 20; p++) append_token(&c, &m, p, 0);
    CHECK(mu_kv_checkpoint(&c, &err));
    CHECK(!mu_kv_checkpoint(&c, &err) && contains(&err, "already active"));
    at[0] = clone_take(&c);
    for (int j = 1; j <= MU_KV_MAX_ROLLBACK; j++) {
        append_token(&c, &m, 20 + j - 1, 1);
        at[j] = clone_take(&c);
    }
    /* a 17th row past the checkpoint is refused, on every layer, state unchanged */
    float row[ROW];
    make_row(0, 36, 1, 0, row);
    for (int l = 0; l < 4; l++)
        CHECK(!mu_kv_append(&c, l, 36, row, row, &err) && contains(&err, "at most 16 rows"));
    CHECK(clone_equal(&c, &at[MU_KV_MAX_ROLLBACK]));
    CHECK(!mu_kv_rollback(&c, 19, &err) && contains(&err, "outside [20, 36]"));
    CHECK(!mu_kv_rollback(&c, 37, &err) && contains(&err, "outside [20, 36]"));
    CHECK(clone_equal(&c, &at[MU_KV_MAX_ROLLBACK]));
    /* step down one position at a time: the checkpoint stays active */
    for (int64_t t = 36; t >= 20; t--)
        CHECK_MSG(mu_kv_rollback(&c, t, &err) && clone_equal(&c, &at[t - 20]), "descending rollback to %lld",
                  (long long)t);
    /* a token only half stored (mid forward pass) */
    for (int l = 0; l < 2; l++) CHECK(append_row(&c, &m, l, 20, 3, &err));
    CHECK(!mu_kv_checkpoint(&c, &err)); /* already active */
    CHECK(!mu_kv_rollback(&c, 21, &err) && contains(&err, "layer 2"));
    CHECK(mu_kv_rollback(&c, 20, &err) && clone_equal(&c, &at[0]));
    /* layer-major order (all rows of layer 0, then layer 1, ...) rolls back too */
    for (int l = 0; l < 4; l++)
        for (int64_t p = 20; p < 24; p++) CHECK(append_row(&c, &m, l, p, 1, &err));
    CHECK(mu_kv_rollback(&c, 22, &err) && clone_equal(&c, &at[2]));
    /* commit keeps the rows and ends the checkpoint */
    append_token(&c, &m, 22, 4);
    clone committed = clone_take(&c);
    mu_kv_commit(&c);
    CHECK(!c.ckpt_active && c.n_journal == 0);
    CHECK(!mu_kv_rollback(&c, 22, &err) && contains(&err, "no active checkpoint"));
    check_all(&c, &m, 23, "after commit");
    /* checkpoint refused while layers disagree */
    CHECK(append_row(&c, &m, 0, 23, 4, &err));
    CHECK(!mu_kv_checkpoint(&c, &err) && contains(&err, "layer 0 ends at 24, layer 1 at 23"));
    for (int j = 0; j <= MU_KV_MAX_ROLLBACK; j++) clone_free(&at[j]);
    clone_free(&committed);
    mu_kv_free(&c);
}

static void test_snapshots(void) {
    mu_kv_cache c, other;
    static model m;
    mu_error err = {{0}};
    init_cache(&c, 4, KINDS, WINDOW, N_CTX);
    for (int64_t p = 0; p < 30; p++) append_token(&c, &m, p, 0);
    CHECK(append_row(&c, &m, 0, 30, 0, &err)); /* mid-token: layers differ in length */
    mu_kv_snapshot *s = mu_kv_snapshot_take(&c);
    CHECK(s != NULL);
    clone original = clone_take(&c);
    CHECK(c.layers[0].origin_physical == 7 && c.layers[2].origin_physical == 6); /* rotated rings */
    /* mutate: more rows (wrapping further), a checkpoint and a rollback */
    for (int l = 1; l < 4; l++) CHECK(append_row(&c, &m, l, 30, 5, &err));
    for (int64_t p = 31; p < 41; p++) append_token(&c, &m, p, 5);
    CHECK(mu_kv_checkpoint(&c, &err));
    append_token(&c, &m, 41, 5);
    CHECK(mu_kv_snapshot_restore(&c, s, &err));
    CHECK(clone_equal(&c, &original)); /* bitwise, rotation included; checkpoint dropped */
    /* onto a fresh cache of the same geometry, and after clear */
    init_cache(&other, 4, KINDS, WINDOW, N_CTX);
    CHECK(mu_kv_snapshot_restore(&other, s, &err) && clone_equal(&other, &original));
    mu_kv_clear(&c);
    CHECK(mu_kv_snapshot_restore(&c, s, &err) && clone_equal(&c, &original));
    mu_kv_free(&other);
    /* any geometry difference is refused and leaves the target untouched */
    struct { int n_layers; bool kinds[MAX_LAYERS]; int64_t window, n_ctx, heads, head_dim; const char *msg; } bad[] = {
        {3, {true, false, true}, WINDOW, N_CTX, HEADS, HEAD_DIM, "3 layers"},
        {4, {true, false, true, false}, WINDOW, 32, HEADS, HEAD_DIM, "n_ctx 32"},
        {4, {true, false, true, false}, 16, N_CTX, HEADS, HEAD_DIM, "window 16"},
        {4, {true, true, true, false}, WINDOW, N_CTX, HEADS, HEAD_DIM, "layer 1 mismatch: snapshot is full"},
        {4, {true, false, true, false}, WINDOW, N_CTX, HEADS, HEAD_DIM + 4, "layer 0 mismatch"},
        /* same row size, other head split */
        {4, {true, false, true, false}, WINDOW, N_CTX, HEAD_DIM, HEADS, "rows of 4 heads x 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(mu_kv_init(&other, NULL, bad[i].n_layers, bad[i].kinds, bad[i].window, 0, bad[i].n_ctx, bad[i].heads,
                                bad[i].head_dim, &err));
        uint16_t *k0 = other.layers[0].k;
        CHECK_MSG(!mu_kv_snapshot_restore(&other, s, &err) && contains(&err, bad[i].msg),
                  "geometry case %zu: %s", i, err.msg);
        CHECK(other.layers[0].len == 0 && row_is_zero(k0, other.layers[0].cap * other.layers[0].row_elems));
        mu_kv_free(&other);
    }
    CHECK(!mu_kv_snapshot_restore(&c, NULL, &err));
    CHECK(mu_kv_snapshot_take(NULL) == NULL);
    mu_kv_snapshot_free(s);
    mu_kv_snapshot_free(NULL);
    clone_free(&original);
    mu_kv_free(&c);
}

static void test_full_planes_only(void) {
    const bool full[2] = {false, false};
    mu_kv_cache c;
    static model m;
    mu_error err = {{0}};
    init_cache(&c, 2, full, 0, N_CTX); /* window 0 = none is fine without SWA layers */
    CHECK_EQ_INT(c.layers[0].cap, N_CTX);
    for (int64_t p = 0; p < N_CTX; p++) append_token(&c, &m, p, 0);
    check_all(&c, &m, N_CTX, "full planes at n_ctx");
    CHECK_EQ_INT(c.layers[1].origin_logical, 0);
    float row[ROW];
    make_row(0, 0, 0, 0, row);
    CHECK(!mu_kv_append(&c, 1, N_CTX, row, row, &err) && contains(&err, "outside the context"));
    mu_kv_free(&c);
}

static void test_context_below_window(void) {
    mu_kv_cache c;
    static model m;
    mu_error err = {{0}};
    init_cache(&c, 4, KINDS, WINDOW, 5);
    for (int l = 0; l < 4; l++) CHECK_EQ_INT(c.layers[l].cap, 5);
    for (int64_t p = 0; p < 2; p++) append_token(&c, &m, p, 0);
    CHECK(mu_kv_checkpoint(&c, &err));
    clone at2 = clone_take(&c);
    for (int64_t p = 2; p < 5; p++) append_token(&c, &m, p, 1);
    check_all(&c, &m, 5, "n_ctx 5 filled");
    CHECK_EQ_INT(c.layers[0].origin_logical, 0); /* never wraps */
    float row[ROW];
    make_row(0, 0, 0, 0, row);
    CHECK(!mu_kv_append(&c, 0, 5, row, row, &err) && contains(&err, "n_ctx 5"));
    CHECK(mu_kv_rollback(&c, 2, &err) && clone_equal(&c, &at2));
    clone_free(&at2);
    mu_kv_free(&c);
}

static void test_clear(void) {
    mu_kv_cache c, fresh;
    static model m;
    mu_error err = {{0}};
    init_cache(&c, 4, KINDS, WINDOW, N_CTX);
    init_cache(&fresh, 4, KINDS, WINDOW, N_CTX);
    clone empty = clone_take(&fresh);
    for (int64_t p = 0; p < 30; p++) append_token(&c, &m, p, 0);
    CHECK(mu_kv_checkpoint(&c, &err));
    append_token(&c, &m, 30, 0);
    mu_kv_clear(&c);
    CHECK(clone_equal(&c, &empty)); /* bitwise a fresh cache, checkpoint gone */
    for (int64_t p = 0; p < 10; p++) append_token(&c, &m, p, 6);
    check_all(&c, &m, 10, "after clear");
    clone_free(&empty);
    mu_kv_free(&fresh);
    mu_kv_free(&c);
}

int main(void) {
    test_init_errors();
    test_append_and_wrap();
    test_append_rejects();
    test_rollback_every_position();
    test_rollback_limits();
    test_rollback_multirow();
    test_move_path(NULL);
    mu_backend *rev = mu_backend_ref_create(1);
    rev->copy2d_many = reversed_many;
    test_move_path(rev);
    rev->destroy(rev);
    test_snapshots();
    test_full_planes_only();
    test_context_below_window();
    test_clear();
    TEST_MAIN_END();
}
