/* The kvpack store (include/muser.h, docs/kvpack.md): a directory of
 * packs named by the keyed prefix chain of their tokens, crash-safe
 * publication, restore into a detached KV generation, prompt cache, LRU
 * garbage collection. */
#include "kvpack/kvpack.h"
#include "kv/kv.h"
#include "model/capture.h"
#include "spec/speculate.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define PREFIX_DOMAIN "muser-kvpack-prefix-v1"

struct muser_kvstore {
    muser_model *m;
    char *dir;
    unsigned char key[KVP_KEY_BYTES];
    bool have_key;
    char key_path[4096];
    const unsigned char *ident;
    size_t ident_len;
    uint64_t bytes_read;
    const volatile int *cancel; /* polled between sections of a restore */
    int zstd_level;             /* 0: packs are written raw */
    uint64_t quota;             /* 0: none; else LRU eviction after each save */
};

static bool ensure_key(muser_kvstore *st, bool create, mu_error *err) {
    if (st->have_key) return true;
    st->have_key = kvp_load_key(st->key_path, create, st->key, err);
    return st->have_key;
}

muser_kvstore *muser_kvstore_open(muser_model *m, const char *dir, const char *key_file, muser_error *err) {
    if (!m || !dir || !*dir) {
        mu_err_set(ERR(err), "kvstore: a model and a directory are required");
        return NULL;
    }
    struct stat sb;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        mu_err_set(ERR(err), "kvstore %s: cannot create the directory: %s", dir, strerror(errno));
        return NULL;
    }
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        mu_err_set(ERR(err), "kvstore %s: not a directory", dir);
        return NULL;
    }
    muser_kvstore *st = mu_xcalloc(1, sizeof *st);
    st->m = m;
    st->dir = mu_xstrdup(dir);
    kvp_key_path(key_file, dir, st->key_path, sizeof st->key_path);
    if (!kvp_model_identity(m, dir, &st->ident, &st->ident_len, ERR(err))) {
        muser_kvstore_close(st);
        return NULL;
    }
    /* a key that exists must be usable now; a missing one is made by the first save */
    if (access(st->key_path, F_OK) == 0 && !ensure_key(st, false, ERR(err))) {
        muser_kvstore_close(st);
        return NULL;
    }
    return st;
}

void muser_kvstore_close(muser_kvstore *st) {
    if (!st) return;
    OPENSSL_cleanse(st->key, sizeof st->key);
    free(st->dir);
    free(st);
}

uint64_t muser_kvstore_bytes_read(const muser_kvstore *st) { return st->bytes_read; }

bool muser_kvstore_set_compression(muser_kvstore *st, int zstd_level, muser_error *err) {
    if (zstd_level < 0 || zstd_level > KVP_ZSTD_MAX_LEVEL) {
        mu_err_set(ERR(err), "kvstore: zstd level %d: must be 0 (off) or 1 to %d", zstd_level, KVP_ZSTD_MAX_LEVEL);
        return false;
    }
    st->zstd_level = zstd_level;
    return true;
}

void muser_kvstore_set_quota(muser_kvstore *st, uint64_t max_bytes) { st->quota = max_bytes; }
void muser_kvstore_set_cancel(muser_kvstore *st, const volatile int *flag) { st->cancel = flag; }

/* ------------------------------------------------------------------ prefix chain */

static void hmac32(const unsigned char key[KVP_KEY_BYTES], const void *a, size_t na, const void *b, size_t nb,
                   const void *c, size_t nc, unsigned char out[32]) {
    kvp_mac_ctx *x = kvp_mac_new(key, a, na);
    kvp_mac_update(x, b, nb);
    kvp_mac_update(x, c, nc);
    kvp_mac_final(x, out);
    kvp_mac_free(x);
}

/* chain[i] = the name of the pack of the first min(256 (i + 1), n)
 * tokens: h_0 = HMAC(key, domain || identity), h_{i+1} = HMAC(key, h_i ||
 * u32 count || tokens of block i, u32 LE). Keyed, so a pack's name does
 * not give its prompt away. Returns the number of blocks. */
static int64_t prefix_chain(const muser_kvstore *st, const unsigned char *ident, size_t ident_len, const int32_t *tokens,
                            int64_t n, unsigned char (*chain)[32]) {
    unsigned char h[32], buf[4 * KVP_CHUNK];
    hmac32(st->key, PREFIX_DOMAIN, sizeof PREFIX_DOMAIN, ident, ident_len, NULL, 0, h);
    int64_t blocks = 0;
    for (int64_t b = 0; b < n; b += KVP_CHUNK) {
        const int64_t cnt = n - b < KVP_CHUNK ? n - b : KVP_CHUNK;
        unsigned char c4[4];
        for (int i = 0; i < 4; i++) c4[i] = (unsigned char)((uint32_t)cnt >> (8 * i));
        for (int64_t i = 0; i < cnt; i++)
            for (int j = 0; j < 4; j++) buf[4 * i + j] = (unsigned char)((uint32_t)tokens[b + i] >> (8 * j));
        unsigned char prev[36];
        memcpy(prev, h, 32);
        memcpy(prev + 32, c4, 4);
        hmac32(st->key, prev, 36, buf, (size_t)(4 * cnt), NULL, 0, h);
        memcpy(chain[blocks++], h, 32);
    }
    return blocks;
}

static void pack_path(const muser_kvstore *st, const char *id, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s.kvpack", st->dir, id);
}

static bool valid_id(const char *id) {
    if (!id || strlen(id) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f'))) return false;
    return true;
}

/* ------------------------------------------------------------------ save */

static bool store_gc(const char *dir, uint64_t max_bytes, const char *keep_id, muser_kvstore_gc_stats *out,
                     mu_error *err);

static bool fsync_dir(const char *dir, mu_error *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    bool ok = fd >= 0 && fsync(fd) == 0;
    if (!ok) mu_err_set(err, "kvstore %s: fsync of the directory failed: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    return ok;
}

/* Publish the pack image at final: lock, temporary file in the same
 * directory, fsync, then link (replace false: an existing pack is never
 * replaced) or rename (replace true: a named slot file is replaced whole),
 * fsync of the directory. Needs no session lock (the image is a copy). */
static bool publish(muser_kvstore *st, const kvp_image *img, const unsigned char *ident, size_t ident_len,
                    const char *final, const char *lockp, const char *tmp, bool replace, bool *existed,
                    uint64_t *bytes_out, mu_error *e) {
    if (!replace && access(final, F_OK) == 0) {
        if (existed) *existed = true;
        return true;
    }
    int lk = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lk < 0) {
        mu_err_set(e, "kvstore save %s: cannot open the lock file: %s", lockp, strerror(errno));
        return false;
    }
    if (flock(lk, LOCK_EX | LOCK_NB) != 0) {
        close(lk);
        mu_err_set(e, "kvstore save: another writer holds %s; refusing to write %s concurrently", lockp, final);
        return false;
    }
    bool ok = false;
    int fd = -1;
    if (!replace && access(final, F_OK) == 0) { /* the other writer finished between our two looks */
        if (existed) *existed = true;
        ok = true;
        goto out;
    }
    unlink(tmp); /* a dead writer of this pid's name: we hold the lock */
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        mu_err_set(e, "kvstore save %s: %s", tmp, strerror(errno));
        goto out;
    }
    uint64_t bytes = 0;
    if (!kvp_write_image(fd, img, ident, ident_len, st->key, &bytes, e)) goto out;
    if (kvp_test_kill_due(bytes)) raise(SIGKILL);
    if (fsync(fd) != 0) {
        mu_err_set(e, "kvstore save %s: fsync: %s", tmp, strerror(errno));
        goto out;
    }
    if (kvp_test_kill_due(bytes + 1)) raise(SIGKILL);
    if (replace ? rename(tmp, final) != 0 : link(tmp, final) != 0) {
        mu_err_set(e, "kvstore save %s: publishing failed: %s", final, strerror(errno));
        goto out;
    }
    if (kvp_test_kill_due(bytes + 2)) raise(SIGKILL);
    if (!replace) unlink(tmp);
    ok = fsync_dir(st->dir, e);
    if (ok && bytes_out) *bytes_out = bytes;
out:
    if (fd >= 0) close(fd);
    if (!ok) unlink(tmp);
    unlink(lockp); /* before the unlock: a writer that opened it re-checks for the pack */
    close(lk);
    return ok;
}

/* Compress (when the store says so), publish, then apply the quota,
 * keeping the pack just written (keep_id). */
static bool finish_and_publish(muser_kvstore *st, kvp_image *img, const unsigned char *ident, size_t ident_len,
                               const char *final, const char *lockp, const char *tmp, bool replace, bool *existed,
                               uint64_t *bytes, const char *keep_id, mu_error *e) {
    if (st->zstd_level && !kvp_compress(img, st->zstd_level, e)) return false;
    if (!publish(st, img, ident, ident_len, final, lockp, tmp, replace, existed, bytes, e)) return false;
    if (st->quota && !(existed && *existed)) {
        muser_kvstore_gc_stats g;
        if (!store_gc(st->dir, st->quota, keep_id, &g, e)) {
            mu_err_prefix(e, "kvstore save: the pack was stored, but evicting down to the quota failed");
            return false;
        }
    }
    return true;
}

struct muser_kvpack_image {
    kvp_image img;
    unsigned char *ident;
    size_t ident_len;
    char id[65];
};

void muser_kvpack_image_free(muser_kvpack_image *im) {
    if (!im) return;
    kvp_image_free(&im->img);
    free(im->ident);
    free(im);
}

uint64_t muser_kvpack_image_bytes(const muser_kvpack_image *im) {
    uint64_t b = 0;
    for (int64_t i = 0; i < im->img.n_chunks; i++) b += im->img.chunks[i].bytes;
    return b + im->img.dflash_len;
}

muser_kvpack_image *muser_kvstore_capture(muser_kvstore *st, muser_session *s, const muser_sampler *smp, char id[65],
                                          bool *existed, muser_error *err) {
    mu_error *e = ERR(err);
    if (existed) *existed = false;
    if (muser_session_model(s) != st->m) {
        mu_err_set(e, "kvstore save: the session belongs to another model than the store");
        return NULL;
    }
    if (!ensure_key(st, true, e)) return NULL;
    muser_kvpack_image *im = mu_xcalloc(1, sizeof *im);
    if (!kvp_session_identity(s, st->dir, &im->ident, &im->ident_len, e)) {
        free(im);
        return NULL;
    }
    mu_session_lock(s);
    int64_t n;
    const int32_t *tokens = mu_session_hist(s, &n);
    if (n <= 0 || n != muser_session_pos(s)) {
        mu_session_unlock(s);
        mu_err_set(e, "kvstore save: the session holds %lld positions, the tokens of %lld are known",
                   (long long)muser_session_pos(s), (long long)n);
        muser_kvpack_image_free(im);
        return NULL;
    }
    unsigned char(*chain)[32] = mu_xmalloc((size_t)((n + KVP_CHUNK - 1) / KVP_CHUNK) * 32);
    int64_t blocks = prefix_chain(st, im->ident, im->ident_len, tokens, n, chain);
    kvp_hex(chain[blocks - 1], 32, im->id);
    free(chain);
    memcpy(id, im->id, 65);
    char final[4200];
    pack_path(st, im->id, final, sizeof final);
    if (access(final, F_OK) == 0) { /* immutable and determined by identity and tokens: nothing to copy */
        mu_session_unlock(s);
        if (existed) *existed = true;
        muser_kvpack_image_free(im);
        return NULL;
    }
    /* the rows are copied out under the lock; compressing and writing go on without it */
    bool ok = kvp_capture(s, smp, &im->img, e);
    mu_session_unlock(s);
    if (!ok) {
        muser_kvpack_image_free(im);
        return NULL;
    }
    return im;
}

bool muser_kvstore_publish(muser_kvstore *st, muser_kvpack_image *im, bool *existed, muser_error *err) {
    mu_error *e = ERR(err);
    if (existed) *existed = false;
    bool ok = ensure_key(st, true, e);
    if (ok) {
        char final[4200], lockp[4200], tmp[4300];
        pack_path(st, im->id, final, sizeof final);
        snprintf(lockp, sizeof lockp, "%s/%s.lock", st->dir, im->id);
        snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%d", st->dir, im->id, (int)getpid());
        ok = finish_and_publish(st, &im->img, im->ident, im->ident_len, final, lockp, tmp, false, existed, NULL,
                                im->id, e);
    }
    muser_kvpack_image_free(im);
    return ok;
}

bool muser_kvstore_save(muser_kvstore *st, muser_session *s, const muser_sampler *smp, char id[65], bool *existed,
                        muser_error *err) {
    bool had = false;
    muser_kvpack_image *im = muser_kvstore_capture(st, s, smp, id, &had, err);
    if (existed) *existed = had;
    if (!im) return had;
    return muser_kvstore_publish(st, im, existed, err);
}

/* ------------------------------------------------------------------ lookup */

static int64_t lookup(muser_kvstore *st, const unsigned char *ident, size_t ident_len, const int32_t *tokens, int64_t n,
                      char id[65]) {
    if (n <= 0 || !st->have_key) return 0;
    unsigned char(*chain)[32] = mu_xmalloc((size_t)((n + KVP_CHUNK - 1) / KVP_CHUNK) * 32);
    const int64_t blocks = prefix_chain(st, ident, ident_len, tokens, n, chain);
    char path[4200], hex[65];
    int64_t found = 0;
    kvp_hex(chain[blocks - 1], 32, hex);
    pack_path(st, hex, path, sizeof path);
    if (access(path, R_OK) == 0) found = n;
    /* block-aligned prefixes shorter than n, longest first */
    for (int64_t b = (n - 1) / KVP_CHUNK; !found && b >= 1; b--) {
        kvp_hex(chain[b - 1], 32, hex);
        pack_path(st, hex, path, sizeof path);
        if (access(path, R_OK) == 0) found = b * KVP_CHUNK;
    }
    free(chain);
    if (found && id) memcpy(id, hex, 65);
    return found;
}

int64_t muser_kvstore_lookup(muser_kvstore *st, const int32_t *tokens, int64_t n, char id[65]) {
    return lookup(st, st->ident, st->ident_len, tokens, n, id);
}

int64_t muser_kvstore_lookup_for(muser_kvstore *st, muser_session *s, const int32_t *tokens, int64_t n, char id[65]) {
    unsigned char *ident;
    size_t ident_len;
    if (!kvp_session_identity(s, st->dir, &ident, &ident_len, NULL)) return 0;
    const int64_t k = lookup(st, ident, ident_len, tokens, n, id);
    free(ident);
    return k;
}

/* ------------------------------------------------------------------ restore */

typedef struct restore_ctx {
    muser_session *s;
    mu_kv_cache staged;   /* the detached generation */
    int32_t *tokens;
    int64_t n;
    float *logits;
    muser_sampler *smp;
    void *sampler_state;
    size_t sampler_len;
    unsigned char *ident;         /* the pack's identity block: its name chains from it */
    size_t ident_len;
    muser_spec *sp;               /* the session's assistant, or NULL (then a DFlash section is not needed) */
    unsigned char *dflash;        /* its checked state */
    int64_t dflash_rows, dflash_feats;
} restore_ctx;

static bool rs_identity(void *ctx, const unsigned char *p, size_t n, mu_error *err) {
    (void)err;
    restore_ctx *r = ctx;
    r->ident = mu_xmalloc(n);
    memcpy(r->ident, p, n);
    r->ident_len = n;
    return true;
}

/* The identity check made sure the assistant is the session's (same file
 * and geometry), so the payload fits its state exactly. */
static bool rs_dflash(void *ctx, int64_t rows, int64_t n_feats, const unsigned char *p, size_t n, mu_error *err) {
    (void)err;
    restore_ctx *r = ctx;
    if (!r->sp) return true;
    r->dflash = mu_xmalloc(n ? n : 1);
    memcpy(r->dflash, p, n);
    r->dflash_rows = rows;
    r->dflash_feats = n_feats;
    return true;
}

static bool rs_tokens(void *ctx, const int32_t *t, int64_t n, mu_error *err) {
    restore_ctx *r = ctx;
    if (n > r->staged.n_ctx) {
        mu_err_set(err, "the pack holds %lld tokens; the session's context is %lld", (long long)n,
                   (long long)r->staged.n_ctx);
        return false;
    }
    r->tokens = mu_xmalloc((size_t)n * sizeof *t);
    memcpy(r->tokens, t, (size_t)n * sizeof *t);
    r->n = n;
    return true;
}

static bool rs_kv(void *ctx, int layer, int64_t first, int64_t count, const uint16_t *k, const uint16_t *v,
                  mu_error *err) {
    restore_ctx *r = ctx;
    return mu_kv_place(&r->staged, layer, first, count, k, v, err);
}

static bool rs_logits(void *ctx, const float *row, int64_t n, mu_error *err) {
    (void)err;
    restore_ctx *r = ctx;
    r->logits = mu_xmalloc((size_t)n * sizeof *row);
    memcpy(r->logits, row, (size_t)n * sizeof *row);
    return true;
}

static bool rs_sampler(void *ctx, const void *p, size_t n, mu_error *err) {
    (void)err;
    restore_ctx *r = ctx;
    r->sampler_state = mu_xmalloc(n ? n : 1);
    memcpy(r->sampler_state, p, n);
    r->sampler_len = n;
    return true;
}

/* Restore the pack at path into s; with id (a store's pack), the chain of
 * the pack's tokens must be its name. */
static bool restore_path(muser_kvstore *st, const char *path, const char *id, muser_session *s, muser_sampler *smp,
                         mu_error *err) {
    if (!ensure_key(st, false, err)) return false;
    unsigned char *want;
    size_t want_len;
    if (!kvp_session_identity(s, st->dir, &want, &want_len, err)) return false;
    restore_ctx r = {.s = s, .smp = smp, .sp = mu_session_spec(s)};
    /* the detached generation: new backend memory of the session's own geometry */
    mu_session_lock(s);
    bool ok = mu_session_new_kv(s, &r.staged, err);
    mu_session_unlock(s);
    if (!ok) {
        free(want);
        return false;
    }
    kvp_sink sink = {&r, rs_identity, rs_tokens, rs_kv, rs_logits, rs_sampler, rs_dflash};
    kvp_info info;
    ok = kvp_read(path, st->key, want, want_len, &sink, st->cancel, &info, err);
    free(want);
    if (ok && r.sp && !r.dflash) { /* the identity check already demands it; never swap in half a state */
        mu_err_set(err, "%s: the pack has no DFlash context for the session's assistant", path);
        ok = false;
    }
    if (ok && id) { /* the name is the chain of the tokens: a renamed pack is refused */
        unsigned char(*chain)[32] = mu_xmalloc((size_t)((r.n + KVP_CHUNK - 1) / KVP_CHUNK) * 32);
        int64_t blocks = prefix_chain(st, r.ident, r.ident_len, r.tokens, r.n, chain);
        char hex[65];
        kvp_hex(chain[blocks - 1], 32, hex);
        free(chain);
        if (strcmp(hex, id)) {
            mu_err_set(err, "%s: the pack's tokens chain to %s, not to its name", path, hex);
            ok = false;
        }
    }
    if (ok) { /* the sampler last but one and the swap last: nothing changes unless everything can */
        mu_session_lock(s);
        if (mu_session_busy(s)) {
            mu_err_set(err, "kvpack restore: the session has queued input");
            ok = false;
        } else if (smp && r.sampler_state &&
                   !muser_sampler_state_load(smp, r.sampler_state, r.sampler_len, (muser_error *)err)) {
            mu_err_prefix(err, "%s: sampler", path);
            ok = false;
        } else {
            mu_session_install(s, &r.staged, r.tokens, r.n, r.logits);
            if (r.sp) mu_spec_import(r.sp, r.dflash_rows, r.dflash_feats, r.dflash);
        }
        mu_session_unlock(s);
    }
    if (!ok) mu_kv_free(&r.staged);
    if (ok) {
        st->bytes_read = info.file_bytes;
        /* LRU: a restore is a use; the access time is set explicitly (relatime does not matter) */
        struct timespec ts[2] = {{.tv_nsec = UTIME_NOW}, {.tv_nsec = UTIME_OMIT}};
        utimensat(AT_FDCWD, path, ts, 0);
    }
    free(r.tokens);
    free(r.logits);
    free(r.sampler_state);
    free(r.ident);
    free(r.dflash);
    return ok;
}

bool muser_kvstore_restore(muser_kvstore *st, const char *id, muser_session *s, muser_sampler *smp, muser_error *err) {
    if (muser_session_model(s) != st->m) {
        mu_err_set(ERR(err), "kvstore restore: the session belongs to another model than the store");
        return false;
    }
    char path[4200];
    if (valid_id(id)) {
        pack_path(st, id, path, sizeof path);
        return restore_path(st, path, id, s, smp, ERR(err));
    }
    /* a path to a pack file (not necessarily in the store) */
    return restore_path(st, id, NULL, s, smp, ERR(err));
}

/* ------------------------------------------------------------------ prompt cache */

static bool feed(muser_session *s, muser_spec *sp, const int32_t *t, int64_t n, muser_error *err) {
    return sp ? muser_spec_feed(sp, t, n, err) : muser_session_feed(s, t, n, err);
}

int64_t muser_kvstore_prefill(muser_kvstore *st, muser_session *s, const int32_t *tokens, int64_t n, int64_t *reused,
                              muser_error *err) {
    if (reused) *reused = 0;
    if (n <= 0) {
        mu_err_set(ERR(err), "prompt cache: empty prompt");
        return -1;
    }
    if (n > muser_session_n_ctx(s)) {
        mu_err_set(ERR(err), "the prompt (%lld tokens) does not fit the context (%lld tokens)", (long long)n,
                   (long long)muser_session_n_ctx(s));
        return -1;
    }
    if (!ensure_key(st, true, ERR(err))) return -1;
    /* with an assistant bound to s its context is restored, fed and stored along (docs/kvpack.md) */
    muser_spec *sp = mu_session_spec(s);
    unsigned char *ident;
    size_t ident_len;
    if (!kvp_session_identity(s, st->dir, &ident, &ident_len, ERR(err))) return -1;
    char id[65];
    int64_t k = lookup(st, ident, ident_len, tokens, n, id);
    free(ident);
    if (k > 0) {
        if (!muser_kvstore_restore(st, id, s, NULL, err)) return -1;
        if (reused) *reused = k;
        if (k == n) return 0; /* the stored logits row is the prompt's */
    } else if (sp) {
        muser_spec_reset(sp);
    } else {
        muser_session_reset(s);
    }
    const int64_t b = n / KVP_CHUNK * KVP_CHUNK;
    bool existed;
    if (b > k && b < n) { /* a block-aligned pack for longer prompts sharing this prefix */
        if (!feed(s, sp, tokens + k, b - k, err)) return -1;
        if (!muser_kvstore_save(st, s, NULL, id, &existed, err)) return -1;
        if (!feed(s, sp, tokens + b, n - b, err)) return -1;
    } else if (!feed(s, sp, tokens + k, n - k, err)) {
        return -1;
    }
    if (!muser_kvstore_save(st, s, NULL, id, &existed, err)) return -1;
    return n - k;
}

/* ------------------------------------------------------------------ single files */

/* A plain file name inside dir: no path separators, no leading dot (the
 * store's own files), not the key. */
static bool plain_name(const char *name, mu_error *err) {
    if (!name || !*name || strchr(name, '/') || name[0] == '.' || strlen(name) > 255 || !strcmp(name, "kvpack.key")) {
        mu_err_set(err, "file name '%s' must be a plain name (no '/', no leading '.', not kvpack.key)", name ? name : "");
        return false;
    }
    return true;
}

bool muser_kvpack_save_file(muser_session *s, const muser_sampler *smp, const char *dir, const char *name,
                            const char *key_file, int zstd_level, uint64_t *bytes, muser_error *err) {
    mu_error *e = ERR(err);
    if (!plain_name(name, e)) return false;
    muser_kvstore *st = muser_kvstore_open(muser_session_model(s), dir, key_file, err);
    if (!st) return false;
    bool ok = ensure_key(st, true, e);
    if (ok) {
        char final[4400], lockp[4400], tmp[4500];
        snprintf(final, sizeof final, "%s/%s", dir, name);
        snprintf(lockp, sizeof lockp, "%s/.lock-%s", dir, name);
        snprintf(tmp, sizeof tmp, "%s/.tmpf-%s-%d", dir, name, (int)getpid());
        mu_session_lock(s);
        kvp_image img;
        ok = kvp_capture(s, smp, &img, e);
        mu_session_unlock(s);
        unsigned char *ident = NULL;
        size_t ident_len = 0;
        if (ok) {
            ok = muser_kvstore_set_compression(st, zstd_level, err) &&
                 kvp_session_identity(s, dir, &ident, &ident_len, e) &&
                 finish_and_publish(st, &img, ident, ident_len, final, lockp, tmp, true, NULL, bytes, NULL, e);
            kvp_image_free(&img);
        }
        free(ident);
    }
    muser_kvstore_close(st);
    return ok;
}

bool muser_kvpack_restore_file(muser_session *s, muser_sampler *smp, const char *dir, const char *name,
                               const char *key_file, uint64_t *bytes, muser_error *err) {
    mu_error *e = ERR(err);
    if (!plain_name(name, e)) return false;
    muser_kvstore *st = muser_kvstore_open(muser_session_model(s), dir, key_file, err);
    if (!st) return false;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    bool ok = restore_path(st, path, NULL, s, smp, e);
    if (ok && bytes) *bytes = st->bytes_read;
    muser_kvstore_close(st);
    return ok;
}

/* ------------------------------------------------------------------ verify */

bool muser_kvpack_verify(const char *path, const char *key_file, muser_model *m, muser_kvpack_info *out,
                         muser_error *err) {
    char dir[4096], key_path[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    kvp_key_path(key_file, dir, key_path, sizeof key_path);
    unsigned char key[KVP_KEY_BYTES];
    if (!kvp_load_key(key_path, false, key, ERR(err))) return false;
    const unsigned char *ident = NULL;
    size_t ident_len = 0;
    if (m && !kvp_model_identity(m, dir, &ident, &ident_len, ERR(err))) return false;
    kvp_info info;
    bool ok = kvp_read(path, key, ident, ident_len, NULL, NULL, &info, ERR(err));
    OPENSSL_cleanse(key, sizeof key);
    if (ok && out) {
        memset(out, 0, sizeof *out);
        out->file_bytes = info.file_bytes;
        out->n_tokens = info.n_tokens;
        out->has_sampler = info.has_sampler;
        out->zstd = info.flags & KVP_FLAG_ZSTD;
        out->has_dflash = info.has_dflash;
        if (info.has_dflash) kvp_hex(info.ident.assistant_sha, 32, out->assistant_sha256);
        out->kv_stored_bytes = info.stored_kv_bytes;
        out->kv_raw_bytes = info.raw_kv_bytes;
        kvp_hex(info.ident.model_sha, 32, out->model_sha256);
        kvp_hex(info.ident.tokenizer_sha, 32, out->tokenizer_sha256);
        kvp_hex(info.ident.template_sha, 32, out->chat_template_sha256);
        snprintf(out->lane, sizeof out->lane, "%s", info.ident.lane);
        out->n_layer = (int64_t)info.ident.n_layer;
        out->n_head_kv = (int64_t)info.ident.n_head_kv;
        out->head_dim = (int64_t)info.ident.head_dim;
        out->n_vocab = (int64_t)info.ident.n_vocab;
        out->sliding_window = (int64_t)info.ident.window;
        out->numerics_abi = info.ident.numerics_abi;
    }
    return ok;
}

/* ------------------------------------------------------------------ gc */

typedef struct gc_entry {
    char name[80];
    uint64_t bytes;
    struct timespec atime;
} gc_entry;

static int by_atime(const void *a, const void *b) {
    const gc_entry *x = a, *y = b;
    if (x->atime.tv_sec != y->atime.tv_sec) return x->atime.tv_sec < y->atime.tv_sec ? -1 : 1;
    if (x->atime.tv_nsec != y->atime.tv_nsec) return x->atime.tv_nsec < y->atime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

bool muser_kvstore_gc(const char *dir, uint64_t max_bytes, muser_kvstore_gc_stats *out, muser_error *err) {
    return store_gc(dir, max_bytes, NULL, out, ERR(err));
}

/* gc; keep_id (may be NULL) names a pack that is never evicted (a save's own). */
static bool store_gc(const char *dir, uint64_t max_bytes, const char *keep_id, muser_kvstore_gc_stats *out,
                     mu_error *err) {
    muser_kvstore_gc_stats g = {0};
    DIR *d = opendir(dir);
    if (!d) {
        mu_err_set(err, "kvstore gc %s: %s", dir, strerror(errno));
        return false;
    }
    gc_entry *ent = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    char path[4400];
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t len = strlen(nm);
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, nm);
        if (!strncmp(nm, ".tmp-", 5) && len > 70 && len == 70 + strspn(nm + 70, "0123456789") && nm[69] == '-') {
            /* a writer's temporary file: remove it unless its writer still holds the pack's lock */
            char lockp[4400], id[65];
            memcpy(id, nm + 5, 64);
            id[64] = 0;
            snprintf(lockp, sizeof lockp, "%s/%s.lock", dir, id);
            int lk = open(lockp, O_RDWR | O_CLOEXEC);
            bool held = lk >= 0 && flock(lk, LOCK_EX | LOCK_NB) != 0;
            if (lk >= 0) close(lk);
            if (!held && unlink(path) == 0) g.temp_removed++;
            continue;
        }
        if (len != 64 + 7 || strcmp(nm + 64, ".kvpack") || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        if (n == cap) {
            cap = cap * 2 + 16;
            ent = mu_xrealloc(ent, cap * sizeof *ent);
        }
        snprintf(ent[n].name, sizeof ent[n].name, "%s", nm);
        ent[n].bytes = (uint64_t)sb.st_size;
        ent[n].atime = sb.st_atim;
        g.bytes_before += ent[n].bytes;
        n++;
    }
    closedir(d);
    if (n) qsort(ent, n, sizeof *ent, by_atime);
    g.packs = (int64_t)n;
    g.bytes_after = g.bytes_before;
    for (size_t i = 0; i < n && g.bytes_after > max_bytes; i++) {
        if (keep_id && !strncmp(ent[i].name, keep_id, 64)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent[i].name);
        if (unlink(path) == 0) {
            g.bytes_after -= ent[i].bytes;
            g.removed++;
        }
    }
    free(ent);
    bool ok = fsync_dir(dir, err);
    if (out) *out = g;
    return ok;
}
