/* kvpack (docs/kvpack.md): durable packs restore exactly and refuse
 * everything else.
 *  - exactness: save at random depths (before and past the sliding ring's
 *    wrap), restore into sessions of other context sizes and prefill
 *    chunks (other ring capacities), continue 64 tokens: every logits row
 *    is bit-identical to one uninterrupted run; the restored session has
 *    the last logits row without re-feeding;
 *  - prompt cache: a cold prompt, a delta (block-aligned prefix restored,
 *    the rest prefilled) and an exact hit give the logits of a full
 *    prefill; the exact hit feeds nothing;
 *  - refusals, each with a message naming what failed: every byte of the
 *    header, identity, section headers and seal and sampled bytes of every
 *    payload flipped, truncations, a foreign model, a wrong key, a key file
 *    of the wrong mode, a stale version, an identity field (numerics ABI)
 *    changed and re-sealed; a refused restore leaves the live session as it
 *    was; a concurrent writer of the same pack fails closed;
 *  - crash safety: a writer killed (SIGKILL) at 100 random points of a save
 *    never leaves a pack a reader can open that does not verify;
 *  - zstd chunks: round trips bit-exact; a flipped compressed byte is
 *    refused by the digest; frames re-hashed and re-sealed with the right
 *    key that declare another size than the section's count (one byte
 *    more, a 64 MiB bomb, none at all), carry bytes after the frame, or
 *    exceed zstd's bound are refused naming the field;
 *  - DFlash: a speculating session saved after rounds restores into another
 *    session's assistant with bit-identical draft logits, then the same
 *    greedy rounds, proposals and acceptances; a plain session restores
 *    its KV; refused, naming the field: a pack without the assistant's
 *    context, another assistant's hash, a count that does not fit, a
 *    flipped payload byte;
 *  - gc: least recently used packs go first; a store's quota evicts after
 *    each save, keeping the pack just written. */
#include "testutil.h"
#include "model_fixture.h"
#include "muser.h"
#include "kvpack/kvpack.h"
#include "spec/speculate.h"
#include <dirent.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#define WINDOW 32
#define CONT 64
#define MAX_TOK 1024

static int32_t tok(int64_t i) { return (int32_t)((i * 131 + 17 + (i / 7) * 3) % 500); }

static int64_t V;

static bool same_row(const float *a, const float *b) { return !memcmp(a, b, (size_t)V * sizeof(float)); }

static muser_session *session(muser_model *m, int64_t n_ctx, int64_t chunk) {
    muser_error err;
    muser_session_params sp = {.n_ctx = n_ctx, .prefill_chunk = chunk};
    muser_session *s = muser_session_create(m, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    return s;
}

/* rows[i]: the logits after tokens [0, i] in one uninterrupted run */
static float *reference_rows(muser_model *m, int64_t n) {
    muser_error err;
    muser_session *s = session(m, MAX_TOK, 64);
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = tok(i);
    float *rows = malloc((size_t)(n * V) * sizeof(float));
    CHECK_MSG(muser_session_feed_all(s, t, n, rows, &err), "%s", err.msg);
    free(t);
    muser_session_free(s);
    return rows;
}

static void feed_range(muser_session *s, int64_t from, int64_t to, int64_t piece) {
    muser_error err;
    int32_t t[512];
    for (int64_t p = from; p < to;) {
        int64_t n = to - p < piece ? to - p : piece;
        for (int64_t i = 0; i < n; i++) t[i] = tok(p + i);
        CHECK_MSG(muser_session_feed(s, t, n, &err), "%s", err.msg);
        p += n;
    }
}

static void test_exact(muser_model *m, const char *dir, const float *ref) {
    muser_error err;
    muser_kvstore *st = muser_kvstore_open(m, dir, NULL, &err);
    CHECK_MSG(st, "%s", err.msg);
    if (!st) return;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int64_t depths[10] = {1, 5, WINDOW - 1, WINDOW, WINDOW + 1, 2 * WINDOW + 3, 255, 256, 257, 0};
    depths[9] = 300 + (int64_t)(tu_rng_next(&rng) % 300); /* a random depth past the ring's wrap */
    const int64_t ctxs[3] = {700, 1024, 512}, chunks[3] = {16, 512, 7};
    for (int di = 0; di < 10; di++) {
        const int64_t d = depths[di];
        muser_session *a = session(m, 700, 32);
        if (!a) continue;
        feed_range(a, 0, d, 1 + (int64_t)(tu_rng_next(&rng) % 40));
        char id[65];
        bool existed = true;
        CHECK_MSG(muser_kvstore_save(st, a, NULL, id, &existed, &err), "depth %lld: %s", (long long)d, err.msg);
        CHECK(!existed);
        /* packs are immutable: saving again writes nothing */
        CHECK_MSG(muser_kvstore_save(st, a, NULL, id, &existed, &err) && existed, "%s", err.msg);
        muser_session_free(a);
        /* restore into another context size and ring capacity */
        muser_session *b = session(m, ctxs[di % 3], chunks[di % 3]);
        if (!b) continue;
        feed_range(b, 0, 9, 9); /* something to replace */
        CHECK_MSG(muser_kvstore_restore(st, id, b, NULL, &err), "depth %lld: %s", (long long)d, err.msg);
        CHECK_EQ_INT(muser_session_pos(b), d);
        const float *l = muser_session_logits(b);
        CHECK_MSG(l && same_row(l, ref + (d - 1) * V), "depth %lld: restored logits row differs", (long long)d);
        /* continue: one at a time, or in one block for some depths */
        if (di % 2) {
            float *rows = malloc((size_t)(CONT * V) * sizeof(float));
            int32_t t[CONT];
            for (int i = 0; i < CONT; i++) t[i] = tok(d + i);
            CHECK_MSG(muser_session_feed_all(b, t, CONT, rows, &err), "%s", err.msg);
            for (int i = 0; i < CONT; i++)
                CHECK_MSG(same_row(rows + i * V, ref + (d + i) * V), "depth %lld: row %d after restore differs",
                          (long long)d, i);
            free(rows);
        } else {
            for (int i = 0; i < CONT; i++) {
                int32_t t = tok(d + i);
                CHECK_MSG(muser_session_feed(b, &t, 1, &err), "%s", err.msg);
                l = muser_session_logits(b);
                CHECK_MSG(l && same_row(l, ref + (d + i) * V), "depth %lld: row %d after restore differs",
                          (long long)d, i);
            }
        }
        muser_session_free(b);
    }
    /* a context too small for the pack is refused */
    muser_session *small = session(m, 100, 16);
    char id[65];
    int32_t t[700];
    for (int i = 0; i < 700; i++) t[i] = tok(i);
    CHECK_EQ_INT(muser_kvstore_lookup(st, t, depths[9], id), depths[9]);
    CHECK(!muser_kvstore_restore(st, id, small, NULL, &err) && strstr(err.msg, "context"));
    CHECK_EQ_INT(muser_session_pos(small), 0);
    muser_session_free(small);
    muser_kvstore_close(st);
}

static void test_prompt_cache(muser_model *m, const char *dir) {
    muser_error err;
    muser_kvstore *st = muser_kvstore_open(m, dir, NULL, &err);
    CHECK_MSG(st, "%s", err.msg);
    if (!st) return;
    int32_t p1[600], p2[700];
    for (int i = 0; i < 600; i++) p1[i] = tok(i + 5000);
    for (int i = 0; i < 700; i++) p2[i] = i < 530 ? p1[i] : tok(i * 7 + 1);
    muser_session *s = session(m, 1024, 128);
    int64_t reused = -1;
    CHECK_EQ_INT(muser_kvstore_prefill(st, s, p1, 600, &reused, &err), 600);
    CHECK_EQ_INT(reused, 0);
    /* delta: the 512-token block is shared */
    CHECK_EQ_INT(muser_kvstore_prefill(st, s, p2, 700, &reused, &err), 700 - 512);
    CHECK_EQ_INT(reused, 512);
    float *got = malloc((size_t)V * sizeof(float));
    memcpy(got, muser_session_logits(s), (size_t)V * sizeof(float));
    muser_session *full = session(m, 1024, 64);
    CHECK_MSG(muser_session_feed(full, p2, 700, &err), "%s", err.msg);
    CHECK_MSG(same_row(got, muser_session_logits(full)), "delta restore differs from a full prefill");
    /* exact hit: nothing fed, the stored row */
    muser_session *x = session(m, 1024, 256);
    CHECK_EQ_INT(muser_kvstore_prefill(st, x, p2, 700, &reused, &err), 0);
    CHECK_EQ_INT(reused, 700);
    CHECK_MSG(same_row(muser_session_logits(x), muser_session_logits(full)), "exact hit differs");
    /* and it goes on as the full run does */
    int32_t nx = 3;
    CHECK(muser_session_feed(x, &nx, 1, &err) && muser_session_feed(full, &nx, 1, &err));
    CHECK_MSG(same_row(muser_session_logits(x), muser_session_logits(full)), "exact hit continues differently");
    free(got);
    muser_session_free(x);
    muser_session_free(full);
    muser_session_free(s);
    muser_kvstore_close(st);
}

/* ---------------------------------------------------------------- refusals */

static char *slurp(const char *path, size_t *n) { return tu_read_file(path, n); }

static void put_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(p, 1, n, f) == n);
    if (f) fclose(f);
}

/* The store's 32-byte seal key (DIR/kvpack.key), for tests that re-seal a pack. */
static void store_key(const char *dir, unsigned char key[32]) {
    char kp[4200];
    snprintf(kp, sizeof kp, "%s/kvpack.key", dir);
    size_t kn;
    char *kb = slurp(kp, &kn);
    CHECK(kb && kn == 32);
    memset(key, 0, 32);
    if (kb && kn == 32) memcpy(key, kb, 32);
    free(kb);
}

static void hmac_key(const unsigned char *key, const unsigned char *p, size_t n, unsigned char out[32]) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = EVP_MAC_CTX_new(mac);
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    size_t len = 0;
    EVP_MAC_init(c, key, 32, params);
    EVP_MAC_update(c, (const unsigned char *)KVP_SEAL_DOMAIN, sizeof KVP_SEAL_DOMAIN);
    EVP_MAC_update(c, p, n);
    EVP_MAC_final(c, out, &len, 32);
    EVP_MAC_CTX_free(c);
    EVP_MAC_free(mac);
}

static void sha(const unsigned char *p, size_t n, unsigned char out[32]) {
    unsigned int len = 0;
    EVP_Digest(p, n, out, &len, EVP_sha256(), NULL);
}

/* Section starts of a pack (offsets), from its own headers. */
static int sections(const unsigned char *p, size_t n, size_t *at, int cap) {
    int k = 0;
    size_t off = KVP_HEADER_BYTES;
    while (off + KVP_SECTION_BYTES <= n - KVP_SEAL_BYTES && k < cap) {
        uint64_t bytes = 0;
        for (int i = 7; i >= 0; i--) bytes = bytes << 8 | p[off + 24 + i];
        at[k++] = off;
        off += KVP_SECTION_BYTES + bytes;
    }
    return k;
}

static void expect_refusal(const char *path, muser_model *m, const char *want, const char *what, size_t at) {
    muser_error err = {{0}};
    bool ok = muser_kvpack_verify(path, NULL, m, NULL, &err);
    CHECK_MSG(!ok, "%s at %zu: accepted", what, at);
    CHECK_MSG(ok || strstr(err.msg, want), "%s at %zu: message '%s' does not name '%s'", what, at, err.msg, want);
}

static void test_refusals(muser_model *m, muser_model *foreign, const char *dir, const float *ref) {
    muser_error err;
    muser_kvstore *st = muser_kvstore_open(m, dir, NULL, &err);
    CHECK_MSG(st, "%s", err.msg);
    if (!st) return;
    const int64_t d = 300; /* KV chunks of both kinds, a ring past its wrap */
    muser_session *a = session(m, 512, 64);
    feed_range(a, 0, d, 64);
    muser_sampling_params spp;
    muser_sampling_params_default(&spp);
    spp.seed = 5;
    muser_sampler *smp = muser_sampler_create(m, &spp, &err);
    CHECK_MSG(smp, "%s", err.msg);
    for (int i = 0; i < 3; i++) { /* move the sampler's streams on: its state is not the seed's */
        int32_t x = muser_sampler_sample(smp, muser_session_logits(a), &err);
        CHECK_MSG(x >= 0 && muser_sampler_accept(smp, x, &err), "%s", err.msg);
    }
    char id[65], path[4200], copy[4200];
    CHECK_MSG(muser_kvstore_save(st, a, smp, id, NULL, &err), "%s", err.msg);
    { /* a fresh sampler given the pack's state draws what the saved one draws next */
        muser_sampler *smp2 = muser_sampler_create(m, &spp, &err);
        muser_session *b = session(m, 1024, 16);
        CHECK_MSG(muser_kvstore_restore(st, id, b, smp2, &err), "%s", err.msg);
        for (int i = 0; i < 8; i++) {
            int32_t x = muser_sampler_sample(smp, muser_session_logits(a), &err);
            int32_t y = muser_sampler_sample(smp2, muser_session_logits(b), &err);
            CHECK_EQ_INT(x, y);
            if (x < 0 || x != y) break;
            CHECK(muser_sampler_accept(smp, x, &err) && muser_sampler_accept(smp2, y, &err));
        }
        muser_sampler_free(smp2);
        muser_session_free(b);
    }
    snprintf(path, sizeof path, "%s/%s.kvpack", dir, id);
    snprintf(copy, sizeof copy, "%s/copy.kvpack", dir);
    muser_kvpack_info info;
    CHECK_MSG(muser_kvpack_verify(path, NULL, m, &info, &err), "%s", err.msg);
    CHECK_EQ_INT(info.n_tokens, d);
    CHECK(info.has_sampler);
    size_t n;
    unsigned char *orig = (unsigned char *)slurp(path, &n);
    CHECK(orig && n == info.file_bytes);
    if (!orig) return;
    size_t at[64];
    int ns = sections(orig, n, at, 64);
    CHECK(ns >= 8);
    /* the live session a refused restore must leave alone */
    muser_session *live = session(m, 512, 64);
    feed_range(live, 0, 40, 40);

    /* single-byte corruptions: structure bytes all, payload bytes sampled */
    uint64_t rng = 12345;
    int tried = 0;
    for (size_t i = 0; i < n; i++) {
        bool structure = i < KVP_HEADER_BYTES || i >= n - KVP_SEAL_BYTES;
        /* every section: its header, the first 16 payload bytes (the whole identity), the last 16 */
        for (int k = 0; k < ns && !structure; k++) {
            const size_t end = k + 1 < ns ? at[k + 1] : n - KVP_SEAL_BYTES;
            structure = (i >= at[k] && i < at[k] + KVP_SECTION_BYTES + (k == 0 ? 300 : 16)) || (i < end && i + 16 >= end);
        }
        if (!structure && tu_rng_next(&rng) % 211) continue;
        unsigned char save = orig[i];
        orig[i] ^= (unsigned char)(1 + tu_rng_next(&rng) % 255);
        put_file(copy, orig, n);
        orig[i] = save;
        const char *want = i < KVP_HEADER_BYTES ? "header" : i >= n - KVP_SEAL_BYTES ? "seal" : "section";
        expect_refusal(copy, m, want, "byte flip", i);
        if (tried++ % 97 == 0) { /* through a restore: refused, the live session untouched */
            CHECK_MSG(!muser_kvstore_restore(st, copy, live, NULL, &err), "restore of a flip at %zu accepted", i);
            CHECK_EQ_INT(muser_session_pos(live), 40);
            CHECK(muser_session_logits(live) && same_row(muser_session_logits(live), ref + 39 * V));
        }
    }
    printf("byte flips refused: %d of %zu bytes\n", tried, n);
    /* a cancelled restore of a good pack: refused, the live session untouched */
    {
        static volatile int stop = 1;
        muser_kvstore_set_cancel(st, &stop);
        CHECK(!muser_kvstore_restore(st, id, live, NULL, &err) && strstr(err.msg, "cancelled"));
        muser_kvstore_set_cancel(st, NULL);
        CHECK_EQ_INT(muser_session_pos(live), 40);
    }
    /* the in-memory snapshot keeps the logits row and the token record now */
    {
        muser_snapshot *snap = muser_session_snapshot(live);
        CHECK(snap != NULL);
        muser_session *other = session(m, 512, 64);
        feed_range(other, 0, 7, 7);
        CHECK_MSG(muser_session_restore(other, snap, &err), "%s", err.msg);
        CHECK(muser_session_logits(other) && same_row(muser_session_logits(other), ref + 39 * V));
        char sid[65];
        CHECK_MSG(muser_kvstore_save(st, other, NULL, sid, NULL, &err), "a restored snapshot is packable: %s", err.msg);
        muser_snapshot_free(snap);
        muser_session_free(other);
    }
    /* the live session goes on exactly */
    {
        int32_t t = tok(40);
        CHECK_MSG(muser_session_feed(live, &t, 1, &err), "%s", err.msg);
        CHECK_MSG(same_row(muser_session_logits(live), ref + 40 * V), "live session changed by refused restores");
    }
    /* truncations */
    size_t cuts[] = {0, 1, 64, KVP_HEADER_BYTES - 1, KVP_HEADER_BYTES, KVP_HEADER_BYTES + 10, n / 3, n / 2, n - KVP_SEAL_BYTES, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        put_file(copy, orig, cuts[i]);
        expect_refusal(copy, m, "truncated", "truncation", cuts[i]);
    }
    /* trailing bytes */
    {
        unsigned char *longer = malloc(n + 1);
        memcpy(longer, orig, n);
        longer[n] = 0;
        put_file(copy, longer, n + 1);
        expect_refusal(copy, m, "trailing", "append", n);
        free(longer);
    }
    /* foreign identity (another model's file) */
    put_file(copy, orig, n);
    expect_refusal(copy, foreign, "identity mismatch: model_sha256", "foreign model", 0);
    /* wrong key */
    {
        char kp[4200];
        snprintf(kp, sizeof kp, "%s/other.key", dir);
        unsigned char k2[32];
        for (int i = 0; i < 32; i++) k2[i] = (unsigned char)(i * 7 + 1);
        int fd = open(kp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        CHECK(fd >= 0 && write(fd, k2, 32) == 32);
        close(fd);
        CHECK(!muser_kvpack_verify(path, kp, m, NULL, &err) && strstr(err.msg, "seal: HMAC-SHA256 mismatch"));
        chmod(kp, 0644);
        CHECK(!muser_kvpack_verify(path, kp, m, NULL, &err) && strstr(err.msg, "mode 0644"));
    }
    /* stale: version 0 with a correct header digest */
    {
        unsigned char *p = malloc(n);
        memcpy(p, orig, n);
        p[8] = 0;
        sha(p, KVP_HEADER_HASHED, p + KVP_HEADER_HASHED);
        put_file(copy, p, n);
        expect_refusal(copy, m, "version 0", "stale version", 8);
        /* an identity field changed and everything re-hashed and re-sealed
         * with the right key: refused by the identity check by name */
        memcpy(p, orig, n);
        p[at[0] + KVP_SECTION_BYTES + 148] ^= 1; /* numerics_abi */
        {
            unsigned char *buf = malloc(KVP_SECTION_HASHED + info.n_layer + KVP_IDENT_FIXED);
            size_t il = KVP_IDENT_FIXED + (size_t)info.n_layer;
            memcpy(buf, p + at[0], KVP_SECTION_HASHED);
            memcpy(buf + KVP_SECTION_HASHED, p + at[0] + KVP_SECTION_BYTES, il);
            sha(buf, KVP_SECTION_HASHED + il, p + at[0] + KVP_SECTION_HASHED);
            free(buf);
        }
        unsigned char key[32];
        store_key(dir, key);
        unsigned char *seal = p + n - KVP_SEAL_BYTES;
        hmac_key(key, p, n - KVP_SEAL_BYTES + 8, seal + 8);
        put_file(copy, p, n);
        expect_refusal(copy, m, "identity mismatch: numerics_abi", "numerics ABI", 0);
        /* and without a model only integrity is checked: it passes */
        CHECK_MSG(muser_kvpack_verify(copy, NULL, NULL, NULL, &err), "%s", err.msg);
        free(p);
    }
    /* a concurrent writer of the same pack fails closed */
    {
        muser_session *c = session(m, 512, 64);
        feed_range(c, 0, 77, 77);
        char cid[65];
        /* find the name this session's pack will have: save elsewhere first */
        char dir2[4200];
        snprintf(dir2, sizeof dir2, "%s/other", dir);
        char kp[4200], kp2[4200];
        snprintf(kp, sizeof kp, "%s/kvpack.key", dir);
        muser_kvstore *st2 = muser_kvstore_open(m, dir2, kp, &err);
        CHECK_MSG(st2, "%s", err.msg);
        CHECK_MSG(st2 && muser_kvstore_save(st2, c, NULL, cid, NULL, &err), "%s", err.msg);
        snprintf(kp2, sizeof kp2, "%s/%s.lock", dir, cid);
        int lk = open(kp2, O_RDWR | O_CREAT, 0600);
        CHECK(lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) == 0);
        CHECK(!muser_kvstore_save(st, c, NULL, cid, NULL, &err) && strstr(err.msg, "another writer"));
        close(lk);
        CHECK_MSG(muser_kvstore_save(st, c, NULL, cid, NULL, &err), "after the other writer: %s", err.msg);
        muser_kvstore_close(st2);
        muser_session_free(c);
    }
    unlink(copy);
    free(orig);
    muser_sampler_free(smp);
    muser_session_free(live);
    muser_session_free(a);
    muser_kvstore_close(st);
}

/* ---------------------------------------------------------------- zstd */

static int32_t mu_sample_argmax_test(const float *l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static void set64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }

/* The pack orig with section k's payload replaced, every digest, the
 * header's file_bytes and the seal recomputed with the store's key: what
 * only a holder of the key could make, so only the codec's own checks can
 * refuse it. */
static unsigned char *rebuild(const unsigned char *orig, size_t n, int k, const void *payload, size_t plen,
                              const unsigned char key[32], size_t *out_n) {
    size_t at[256];
    int ns = sections(orig, n, at, 256);
    const uint64_t old = le64(orig + at[k] + 24);
    const size_t m = n - old + plen;
    unsigned char *p = malloc(m), *q;
    memcpy(p, orig, at[k] + KVP_SECTION_BYTES);
    memcpy(p + at[k] + KVP_SECTION_BYTES, payload, plen);
    const size_t tail = at[k] + KVP_SECTION_BYTES + old;
    memcpy(p + at[k] + KVP_SECTION_BYTES + plen, orig + tail, n - tail);
    q = p + at[k];
    set64(q + 24, plen);
    unsigned char *buf = malloc(KVP_SECTION_HASHED + plen);
    memcpy(buf, q, KVP_SECTION_HASHED);
    memcpy(buf + KVP_SECTION_HASHED, payload, plen);
    sha(buf, KVP_SECTION_HASHED + plen, q + KVP_SECTION_HASHED);
    free(buf);
    set64(p + 24, m);
    sha(p, KVP_HEADER_HASHED, p + KVP_HEADER_HASHED);
    hmac_key(key, p, m - KVP_SEAL_BYTES + 8, p + m - KVP_SEAL_BYTES + 8);
    (void)ns;
    *out_n = m;
    return p;
}

static void test_zstd(muser_model *m, const char *dir, const float *ref) {
    muser_error err;
    muser_kvstore *st = muser_kvstore_open(m, dir, NULL, &err);
    CHECK_MSG(st, "%s", err.msg);
    if (!st) return;
    CHECK(!muser_kvstore_set_compression(st, 20, &err) && strstr(err.msg, "zstd level 20"));
    CHECK_MSG(muser_kvstore_set_compression(st, 3, &err), "%s", err.msg);
    /* round trip, bit-exact: before and past the ring's wrap, past a chunk boundary */
    const int64_t depths[3] = {7, WINDOW + 9, 300};
    char id[65], path[4200];
    for (int di = 0; di < 3; di++) {
        const int64_t d = depths[di];
        muser_session *a = session(m, 700, 32);
        feed_range(a, 0, d, 50);
        CHECK_MSG(muser_kvstore_save(st, a, NULL, id, NULL, &err), "%s", err.msg);
        muser_session_free(a);
        snprintf(path, sizeof path, "%s/%s.kvpack", dir, id);
        muser_kvpack_info info;
        CHECK_MSG(muser_kvpack_verify(path, NULL, m, &info, &err), "%s", err.msg);
        CHECK_MSG(info.zstd && info.kv_raw_bytes > 0 && info.kv_stored_bytes != info.kv_raw_bytes,
                  "depth %lld: the pack is not compressed (zstd %d, %llu of %llu bytes)", (long long)d, info.zstd,
                  (unsigned long long)info.kv_stored_bytes, (unsigned long long)info.kv_raw_bytes);
        muser_session *b = session(m, 1024, 16);
        CHECK_MSG(muser_kvstore_restore(st, id, b, NULL, &err), "depth %lld: %s", (long long)d, err.msg);
        CHECK_EQ_INT(muser_session_pos(b), d);
        CHECK_MSG(muser_session_logits(b) && same_row(muser_session_logits(b), ref + (d - 1) * V),
                  "zstd depth %lld: restored logits row differs", (long long)d);
        for (int i = 0; i < 16; i++) {
            int32_t t = tok(d + i);
            CHECK_MSG(muser_session_feed(b, &t, 1, &err), "%s", err.msg);
            CHECK_MSG(same_row(muser_session_logits(b), ref + (d + i) * V), "zstd depth %lld: row %d differs",
                      (long long)d, i);
        }
        muser_session_free(b);
    }
    /* the last pack (300 tokens): damage and crafted frames */
    size_t n;
    unsigned char *orig = (unsigned char *)slurp(path, &n);
    CHECK(orig != NULL);
    if (!orig) return;
    size_t at[64];
    const int ns = sections(orig, n, at, 64);
    char copy[4200];
    snprintf(copy, sizeof copy, "%s/copy.kvpack", dir);
    /* a flipped byte of a compressed payload: the digest refuses it before anything is decompressed */
    int kv_secs = 0, first_kv = -1;
    for (int k = 0; k < ns; k++) {
        if (orig[at[k]] != KVP_SEC_KV) continue;
        if (first_kv < 0) first_kv = k;
        kv_secs++;
        CHECK_EQ_INT(orig[at[k] + 32], KVP_CODEC_ZSTD);
        const size_t len = (size_t)le64(orig + at[k] + 24), offs[3] = {0, len / 2, len - 1};
        for (int j = 0; j < 3; j++) {
            const size_t i = at[k] + KVP_SECTION_BYTES + offs[j];
            orig[i] ^= 0x5a;
            put_file(copy, orig, n);
            orig[i] ^= 0x5a;
            expect_refusal(copy, m, "SHA-256 mismatch", "compressed byte flip", i);
        }
    }
    CHECK_MSG(kv_secs >= 4 && first_kv > 0, "%d kv sections", kv_secs);
    unsigned char key[32];
    store_key(dir, key);
    /* the first kv section's raw size, from its count */
    muser_model_info mi;
    muser_model_get_info(m, &mi);
    const size_t rows = (size_t)le64(orig + at[first_kv] + 16);
    const size_t raw = 2 * (size_t)mi.n_head_kv * rows * (size_t)mi.head_dim * 2;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    const size_t big = (size_t)64 << 20; /* a bomb: 64 MiB of zeros in a few KiB */
    unsigned char *src = calloc(1, big), *frame = malloc(ZSTD_compressBound(big));
    size_t fl, pn;
    unsigned char *p;
    struct { size_t content; bool size_flag; size_t extra; const char *want, *what; } cases[] = {
        {raw + 1, true, 0, "count (", "a frame one byte larger than count says"},
        {big, true, 0, "content size is 67108864 bytes; count", "a decompression bomb"},
        {raw, false, 0, "declares no content size", "a frame without its content size"},
        {raw, true, 3, "its zstd frame ends after", "bytes after the frame"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ZSTD_CCtx_reset(cc, ZSTD_reset_session_and_parameters);
        ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, cases[c].size_flag);
        fl = ZSTD_compress2(cc, frame, ZSTD_compressBound(big), src, cases[c].content);
        CHECK(!ZSTD_isError(fl));
        memset(frame + fl, 0, cases[c].extra);
        p = rebuild(orig, n, first_kv, frame, fl + cases[c].extra, key, &pn);
        put_file(copy, p, pn);
        expect_refusal(copy, m, cases[c].want, cases[c].what, 0);
        muser_session *live = session(m, 512, 64);
        CHECK(!muser_kvstore_restore(st, copy, live, NULL, &err) && muser_session_pos(live) == 0);
        muser_session_free(live);
        free(p);
    }
    /* the rebuild itself is sound: the original frame rebuilt verifies */
    p = rebuild(orig, n, first_kv, orig + at[first_kv] + KVP_SECTION_BYTES, (size_t)le64(orig + at[first_kv] + 24),
                key, &pn);
    put_file(copy, p, pn);
    CHECK_MSG(muser_kvpack_verify(copy, NULL, m, NULL, &err), "rebuilt original: %s", err.msg);
    free(p);
    /* a payload_bytes beyond zstd's bound for the chunk is a damaged header, refused before any allocation */
    {
        unsigned char *junk = calloc(1, ZSTD_compressBound(raw) + 1);
        p = rebuild(orig, n, first_kv, junk, ZSTD_compressBound(raw) + 1, key, &pn);
        put_file(copy, p, pn);
        expect_refusal(copy, m, "payload_bytes", "payload_bytes over the bound", 0);
        free(p);
        free(junk);
    }
    ZSTD_freeCCtx(cc);
    free(src);
    free(frame);
    free(orig);
    unlink(copy);
    muser_kvstore_close(st);
}

/* ---------------------------------------------------------------- DFlash */

/* Every section digest, the header's and the seal recomputed for a pack
 * edited in place (same length): only the codec's own checks can refuse it. */
static void reseal(unsigned char *p, size_t n, const unsigned char key[32]) {
    size_t at[512];
    const int ns = sections(p, n, at, 512);
    for (int k = 0; k < ns; k++) {
        const size_t len = (size_t)le64(p + at[k] + 24);
        unsigned char *buf = malloc(KVP_SECTION_HASHED + len);
        memcpy(buf, p + at[k], KVP_SECTION_HASHED);
        memcpy(buf + KVP_SECTION_HASHED, p + at[k] + KVP_SECTION_BYTES, len);
        sha(buf, KVP_SECTION_HASHED + len, p + at[k] + KVP_SECTION_HASHED);
        free(buf);
    }
    sha(p, KVP_HEADER_HASHED, p + KVP_HEADER_HASHED);
    hmac_key(key, p, n - KVP_SEAL_BYTES + 8, p + n - KVP_SEAL_BYTES + 8);
}

static muser_spec *spec_on(muser_session *s, const muser_draft *d) {
    muser_error err;
    muser_spec_params p = {.verify_len = 7, .no_gate = true}; /* no timing gate: every step a round */
    muser_spec *sp = muser_spec_create(s, d, &p, &err);
    CHECK_MSG(sp, "%s", err.msg);
    return sp;
}

/* A speculating session saved after rounds (its assistant's ring filled and
 * rows buffered) restores into another session's assistant exactly: the
 * same draft logits, then the same greedy tokens and round statistics. */
static void test_dflash(const char *dir) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    char mp_[512], dp_[512];
    snprintf(mp_, sizeof mp_, "%s/models/glimmer-tiny-q4_k_xl.gguf", src ? src : ".");
    snprintf(dp_, sizeof dp_, "%s/models/glimmer-tiny-dflash-q4_k_xl.gguf", src ? src : ".");
    muser_error err;
    muser_model_params mp = {.backend = MUSER_BACKEND_CPU, .n_threads = 2};
    muser_model *m = muser_model_load(mp_, &mp, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!m) return;
    muser_draft *d = muser_draft_load(dp_, m, &err);
    CHECK_MSG(d, "%s", err.msg);
    muser_kvstore *st = d ? muser_kvstore_open(m, dir, NULL, &err) : NULL;
    CHECK_MSG(st, "%s", err.msg);
    if (!st) { muser_draft_free(d); muser_model_free(m); return; }
    muser_model_info mi;
    muser_model_get_info(m, &mi);
    const int64_t Vt = mi.n_vocab;
    /* a prompt past the assistant's sink and window, then greedy rounds */
    int32_t prompt[420];
    for (int i = 0; i < 420; i++) prompt[i] = (int32_t)((i * 37 + 11) % 60 + 300 + (i % 7 == 0 ? 5 : 0));
    muser_session_params spar = {.n_ctx = 1024, .prefill_chunk = 64};
    muser_session *a = muser_session_create(m, &spar, &err);
    muser_spec *spa = spec_on(a, d);
    CHECK_MSG(muser_spec_feed(spa, prompt, 420, &err), "%s", err.msg);
    int32_t pend = mu_sample_argmax_test(muser_session_logits(a), Vt), out[16];
    for (int r = 0; r < 12; r++) {
        int n = muser_spec_next(spa, pend, NULL, 16, out, NULL, &err);
        CHECK_MSG(n > 0, "%s", err.msg);
        if (n <= 0) break;
        pend = out[n - 1];
    }
    char id[65];
    CHECK_MSG(muser_kvstore_save(st, a, NULL, id, NULL, &err), "%s", err.msg);
    const int64_t saved = muser_session_pos(a);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.kvpack", dir, id);
    muser_kvpack_info info;
    CHECK_MSG(muser_kvpack_verify(path, NULL, m, &info, &err), "%s", err.msg);
    CHECK(info.has_dflash && strlen(info.assistant_sha256) == 64);
    /* restore into another speculating session (other prefill chunk) */
    muser_session_params spar2 = {.n_ctx = 900, .prefill_chunk = 7};
    muser_session *b = muser_session_create(m, &spar2, &err);
    muser_spec *spb = spec_on(b, d);
    CHECK_MSG(muser_kvstore_restore(st, id, b, NULL, &err), "%s", err.msg);
    CHECK_EQ_INT(muser_session_pos(b), saved);
    int32_t pa[7], pb[7];
    float *la = malloc((size_t)(7 * Vt) * sizeof(float)), *lb = malloc((size_t)(7 * Vt) * sizeof(float));
    mu_spec_draft_now(spa, pend, 7, pa, la);
    mu_spec_draft_now(spb, pend, 7, pb, lb);
    CHECK_MSG(!memcmp(pa, pb, sizeof pa) && !memcmp(la, lb, (size_t)(7 * Vt) * sizeof(float)),
              "the restored assistant drafts differently");
    muser_spec_reset_stats(spa);
    muser_spec_reset_stats(spb);
    int32_t qa = pend, qb = pend;
    for (int r = 0; r < 12; r++) {
        int32_t oa[16], ob[16];
        int na = muser_spec_next(spa, qa, NULL, 16, oa, NULL, &err);
        int nb = muser_spec_next(spb, qb, NULL, 16, ob, NULL, &err);
        CHECK_MSG(na > 0 && na == nb && !memcmp(oa, ob, (size_t)na * sizeof *oa), "round %d differs after restore", r);
        if (na <= 0 || na != nb) break;
        qa = oa[na - 1];
        qb = ob[nb - 1];
    }
    muser_spec_stats sa, sb;
    muser_spec_get_stats(spa, &sa);
    muser_spec_get_stats(spb, &sb);
    CHECK_MSG(sa.rounds == sb.rounds && sa.drafted == sb.drafted && sa.accepted == sb.accepted && sa.accepted > 0,
              "rounds %lld/%lld, accepted %lld/%lld", (long long)sa.rounds, (long long)sb.rounds,
              (long long)sa.accepted, (long long)sb.accepted);
    /* a plain session restores the target's KV of the pack and ignores the assistant's context */
    muser_session *c = muser_session_create(m, &spar, &err);
    CHECK_MSG(muser_kvstore_restore(st, path, c, NULL, &err), "%s", err.msg);
    CHECK_EQ_INT(muser_session_pos(c), saved);
    /* a pack without the assistant's context is refused by a speculating session */
    char pid[65];
    CHECK_MSG(muser_kvstore_save(st, c, NULL, pid, NULL, &err), "%s", err.msg);
    CHECK(strcmp(pid, id)); /* another name: the identity differs */
    muser_session *e2 = muser_session_create(m, &spar, &err);
    muser_spec *spe = spec_on(e2, d);
    CHECK(!muser_kvstore_restore(st, pid, e2, NULL, &err) && strstr(err.msg, "assistant_sha256") &&
          strstr(err.msg, "no DFlash"));
    CHECK_EQ_INT(muser_session_pos(e2), 0);
    /* re-sealed with the right key: another assistant's hash, a count that does not fit */
    size_t n;
    unsigned char *orig = (unsigned char *)slurp(path, &n), key[32];
    {
        char kp[4200];
        snprintf(kp, sizeof kp, "%s/kvpack.key", dir);
        size_t kn;
        char *kb = slurp(kp, &kn);
        CHECK(kb && kn == 32);
        if (kb) memcpy(key, kb, 32);
        free(kb);
    }
    size_t at[512];
    const int ns = sections(orig, n, at, 512);
    int dk = -1;
    for (int k = 0; k < ns; k++)
        if (orig[at[k]] == KVP_SEC_DFLASH) dk = k;
    CHECK(dk > 0);
    char copy[4200];
    snprintf(copy, sizeof copy, "%s/copy.kvpack", dir);
    unsigned char *p = malloc(n);
    memcpy(p, orig, n);
    p[at[0] + KVP_SECTION_BYTES + KVP_IDENT_FIXED + (size_t)mi.n_layer] ^= 1; /* assistant_sha256 */
    reseal(p, n, key);
    put_file(copy, p, n);
    CHECK(!muser_kvstore_restore(st, copy, e2, NULL, &err) && strstr(err.msg, "identity mismatch: assistant_sha256"));
    CHECK_MSG(muser_kvpack_verify(copy, NULL, m, NULL, &err), "verify -m compares the model's fields only: %s", err.msg);
    memcpy(p, orig, n);
    set64(p + at[dk] + 16, le64(p + at[dk] + 16) - 1); /* count */
    reseal(p, n, key);
    put_file(copy, p, n);
    expect_refusal(copy, m, "count", "dflash count", at[dk] + 16);
    CHECK(!muser_kvstore_restore(st, copy, e2, NULL, &err) && strstr(err.msg, "(dflash)"));
    CHECK_EQ_INT(muser_session_pos(e2), 0);
    memcpy(p, orig, n);
    p[at[dk] + KVP_SECTION_BYTES + 100] ^= 4; /* the payload, digest not recomputed */
    put_file(copy, p, n);
    expect_refusal(copy, m, "section", "dflash payload flip", at[dk] + KVP_SECTION_BYTES + 100);
    unlink(copy);
    free(p);
    free(orig);
    free(la);
    free(lb);
    muser_spec_free(spe);
    muser_session_free(e2);
    muser_session_free(c);
    muser_spec_free(spb);
    muser_session_free(b);
    muser_spec_free(spa);
    muser_session_free(a);
    muser_kvstore_close(st);
    muser_draft_free(d);
    muser_model_free(m);
}

/* ---------------------------------------------------------------- kill -9 */

static int verify_all(muser_model *m, const char *dir, int *temps) {
    DIR *d = opendir(dir);
    int good = 0;
    *temps = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        size_t l = strlen(de->d_name);
        if (!strncmp(de->d_name, ".tmp-", 5)) (*temps)++;
        if (l < 7 || strcmp(de->d_name + l - 7, ".kvpack")) continue;
        muser_error err;
        CHECK_MSG(muser_kvpack_verify(p, NULL, m, NULL, &err), "a published pack does not verify: %s", err.msg);
        good++;
    }
    if (d) closedir(d);
    return good;
}

static void test_kill(muser_model *m, const char *dir) {
    muser_error err;
    muser_kvstore *st = muser_kvstore_open(m, dir, NULL, &err);
    CHECK_MSG(st, "%s", err.msg);
    if (!st) return;
    muser_session *a = session(m, 512, 64);
    feed_range(a, 0, 150, 64);
    char id[65], path[4200];
    CHECK_MSG(muser_kvstore_save(st, a, NULL, id, NULL, &err), "%s", err.msg);
    snprintf(path, sizeof path, "%s/%s.kvpack", dir, id);
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    const int64_t size = sb.st_size;
    uint64_t rng = 777;
    int published = 0;
    for (int it = 0; it < 100; it++) {
        unlink(path);
        int64_t kill_at = it < 3 ? size + it : (int64_t)(tu_rng_next(&rng) % (uint64_t)(size + 3));
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            mu_kvpack_test_kill_at(kill_at);
            muser_error e2;
            muser_kvstore_save(st, a, NULL, id, NULL, &e2);
            _exit(3); /* not reached: the hook kills first */
        }
        int status = 0;
        waitpid(pid, &status, 0);
        CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "kill at %lld: the writer was not killed",
                  (long long)kill_at);
        int temps;
        int good = verify_all(m, dir, &temps);
        /* a pack appears only once it was linked whole */
        CHECK_MSG(good == (kill_at == size + 2), "kill at %lld of %lld: %d packs published", (long long)kill_at,
                  (long long)size, good);
        published += good;
        muser_kvstore_gc_stats g;
        CHECK(muser_kvstore_gc(dir, UINT64_MAX, &g, &err));
        CHECK_MSG(g.temp_removed == temps, "kill at %lld: %d temporary files, gc removed %lld", (long long)kill_at,
                  temps, (long long)g.temp_removed);
    }
    CHECK(published >= 1);
    /* after all that, a normal save still works and verifies */
    unlink(path);
    CHECK_MSG(muser_kvstore_save(st, a, NULL, id, NULL, &err), "%s", err.msg);
    CHECK_MSG(muser_kvpack_verify(path, NULL, m, NULL, &err), "%s", err.msg);
    muser_session_free(a);
    muser_kvstore_close(st);
}

static void test_gc(muser_model *m, const char *dir) {
    muser_error err;
    muser_kvstore *st = muser_kvstore_open(m, dir, NULL, &err);
    CHECK_MSG(st, "%s", err.msg);
    if (!st) return;
    char ids[3][65];
    for (int i = 0; i < 3; i++) {
        muser_session *s = session(m, 512, 64);
        feed_range(s, 0, 20 + i, 64);
        CHECK_MSG(muser_kvstore_save(st, s, NULL, ids[i], NULL, &err), "%s", err.msg);
        muser_session_free(s);
        usleep(20000);
    }
    /* use the oldest: it becomes the most recent */
    muser_session *s = session(m, 512, 64);
    usleep(20000);
    CHECK_MSG(muser_kvstore_restore(st, ids[0], s, NULL, &err), "%s", err.msg);
    muser_session_free(s);
    struct stat sb;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s.kvpack", dir, ids[0]);
    CHECK(stat(p, &sb) == 0);
    muser_kvstore_gc_stats g;
    CHECK(muser_kvstore_gc(dir, (uint64_t)sb.st_size, &g, &err));
    CHECK_EQ_INT(g.packs, 3);
    CHECK_EQ_INT(g.removed, 2);
    CHECK(access(p, F_OK) == 0);
    /* a quota on the store: each save evicts least recently used packs, never the one it wrote */
    {
        const uint64_t quota = (uint64_t)sb.st_size * 3 / 2; /* room for one pack of about this size, not two */
        muser_kvstore_set_quota(st, quota);
        char qid[65];
        muser_session *q = session(m, 512, 64);
        feed_range(q, 0, 20, 64);
        int32_t t = tok(999);
        CHECK_MSG(muser_session_feed(q, &t, 1, &err), "%s", err.msg);
        CHECK_MSG(muser_kvstore_save(st, q, NULL, qid, NULL, &err), "%s", err.msg);
        muser_session_free(q);
        snprintf(p, sizeof p, "%s/%s.kvpack", dir, qid);
        CHECK_MSG(access(p, F_OK) == 0, "the quota evicted the pack just written");
        CHECK(muser_kvstore_gc(dir, UINT64_MAX, &g, &err));
        CHECK_MSG(g.packs == 1 && g.bytes_after <= quota, "after a save under the quota: %lld packs, "
                  "%llu bytes", (long long)g.packs, (unsigned long long)g.bytes_after);
        /* a pack larger than the quota on its own is kept (it is the one just written) */
        muser_kvstore_set_quota(st, 1);
        q = session(m, 512, 64);
        feed_range(q, 0, 30, 64);
        CHECK_MSG(muser_kvstore_save(st, q, NULL, qid, NULL, &err), "%s", err.msg);
        muser_session_free(q);
        CHECK(muser_kvstore_gc(dir, UINT64_MAX, &g, &err) && g.packs == 1);
        muser_kvstore_set_quota(st, 0);
    }
    /* a key file of the wrong mode is refused when the store opens */
    snprintf(p, sizeof p, "%s/kvpack.key", dir);
    chmod(p, 0640);
    CHECK(!muser_kvstore_open(m, dir, NULL, &err) && strstr(err.msg, "mode 0640"));
    chmod(p, 0600);
    muser_kvstore_close(st);
}

int main(void) {
    unsetenv("MUSER_KVPACK_KEY");
    muser_error err;
    muser_model_params mp = {.backend = MUSER_BACKEND_CPU, .n_threads = 2};
    muser_model *m = muser_model_load(fx_synth("q4_k_xl", 11, WINDOW), &mp, &err);
    muser_model *foreign = muser_model_load(fx_synth("q4_k_xl", 12, WINDOW), &mp, &err);
    CHECK_MSG(m && foreign, "%s", err.msg);
    if (!m || !foreign) TEST_MAIN_END();
    muser_model_info mi;
    muser_model_get_info(m, &mi);
    V = mi.n_vocab;
    float *ref = reference_rows(m, 700 + CONT);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/exact", fx_tmpdir());
    test_exact(m, dir, ref);
    snprintf(dir, sizeof dir, "%s/cache", fx_tmpdir());
    test_prompt_cache(m, dir);
    snprintf(dir, sizeof dir, "%s/refuse", fx_tmpdir());
    test_refusals(m, foreign, dir, ref);
    snprintf(dir, sizeof dir, "%s/zstd", fx_tmpdir());
    test_zstd(m, dir, ref);
    snprintf(dir, sizeof dir, "%s/dflash", fx_tmpdir());
    test_dflash(dir);
    snprintf(dir, sizeof dir, "%s/kill", fx_tmpdir());
    test_kill(m, dir);
    snprintf(dir, sizeof dir, "%s/gc", fx_tmpdir());
    test_gc(m, dir);
    free(ref);
    muser_model_free(foreign);
    muser_model_free(m);
    fx_cleanup();
    TEST_MAIN_END();
}
