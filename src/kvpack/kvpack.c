/* The kvpack codec: identity block, HMAC key, writer and checking reader
 * of one pack (byte layout: docs/kvpack.md). The writer streams the
 * session's rows through the backend's download op, section by section;
 * the reader streams them back and hands each checked section to a sink,
 * so a restore never holds more than one 256-row chunk on the host. */
#include "kvpack/kvpack.h"
#include "kv/kv.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* Packs are little-endian and KV rows go to disk as they lie in memory. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvpack writes f16 rows in host order: little-endian hosts only"
#endif

/* ------------------------------------------------------------------ bytes */

static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

void kvp_hex(const unsigned char *d, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = 0;
}

static bool unhex(const char *h, unsigned char *out, size_t n) {
    for (size_t i = 0; i < 2 * n; i++) {
        int c = h[i], v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) return false;
        out[i / 2] = (unsigned char)(i % 2 ? out[i / 2] | v : v << 4);
    }
    return true;
}

static void sha256(const void *a, size_t na, const void *b, size_t nb, unsigned char out[32]) {
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned int len = 0;
    if (!c || !EVP_DigestInit_ex(c, EVP_sha256(), NULL) || !EVP_DigestUpdate(c, a, na) ||
        (nb && !EVP_DigestUpdate(c, b, nb)) || !EVP_DigestFinal_ex(c, out, &len)) {
        fprintf(stderr, "muser: OpenSSL SHA-256 failed\n");
        abort();
    }
    EVP_MD_CTX_free(c);
}

/* HMAC-SHA256 through OpenSSL 3's EVP_MAC (the HMAC_CTX calls are deprecated). */
typedef EVP_MAC_CTX mac_ctx;
static mac_ctx *mac_new(const unsigned char key[KVP_KEY_BYTES]) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac);
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    if (!c || !EVP_MAC_init(c, key, KVP_KEY_BYTES, params) ||
        !EVP_MAC_update(c, (const unsigned char *)KVP_SEAL_DOMAIN, sizeof KVP_SEAL_DOMAIN)) { /* with its NUL */
        fprintf(stderr, "muser: OpenSSL HMAC-SHA256 is unavailable\n");
        abort();
    }
    return c;
}
static void mac_update(mac_ctx *c, const void *p, size_t n) {
    if (n && !EVP_MAC_update(c, p, n)) abort();
}
static void mac_final(mac_ctx *c, unsigned char out[32]) {
    size_t len = 0;
    if (!EVP_MAC_final(c, out, &len, 32) || len != 32) abort();
}

/* ------------------------------------------------------------------ test hook */

static int64_t g_kill_at = -1;
void mu_kvpack_test_kill_at(int64_t at) { g_kill_at = at; }
bool kvp_test_kill_due(uint64_t stage) { return g_kill_at >= 0 && (uint64_t)g_kill_at == stage; }

/* ------------------------------------------------------------------ identity */

/* The model file's SHA-256. Hashing a 17 GB file takes minutes, so a store
 * keeps it under DIR/models/, keyed by the file's path, device, inode,
 * size, mtime and ctime (ctime cannot be set back by a user, so a file
 * rewritten in place gets a new key). */
static bool model_file_sha(const char *path, const char *cache_dir, char hex[65], mu_error *err) {
    char cache[4200] = "";
    struct stat st;
    if (cache_dir && stat(path, &st) == 0) {
        char real[PATH_MAX];
        if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path);
        char keytxt[PATH_MAX + 200];
        int n = snprintf(keytxt, sizeof keytxt, "muser-kvpack-model-hash-v1|%s|%llu|%llu|%lld|%lld.%09ld|%lld.%09ld", real,
                         (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, (long long)st.st_size,
                         (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec,
                         st.st_ctim.tv_nsec);
        unsigned char d[32];
        char dh[65];
        sha256(keytxt, (size_t)n, NULL, 0, d);
        kvp_hex(d, 32, dh);
        snprintf(cache, sizeof cache, "%s/models/%s", cache_dir, dh);
        FILE *f = fopen(cache, "r");
        if (f) {
            char buf[80] = "";
            unsigned char tmp[32];
            bool ok = fgets(buf, sizeof buf, f) && strlen(buf) >= 64 && unhex(buf, tmp, 32);
            fclose(f);
            if (ok) {
                memcpy(hex, buf, 64);
                hex[64] = 0;
                return true;
            }
        }
    }
    if (!gguf_sha256_file(path, hex, NULL, NULL, err)) return false;
    if (cache[0]) { /* best effort: a cache that cannot be written only costs the next load a rehash */
        char dir[4200], tmp[4300];
        snprintf(dir, sizeof dir, "%s/models", cache_dir);
        mkdir(dir, 0700);
        snprintf(tmp, sizeof tmp, "%s.tmp%d", cache, (int)getpid());
        FILE *f = fopen(tmp, "w");
        if (f) {
            bool ok = fprintf(f, "%s\n", hex) == 65;
            ok = fflush(f) == 0 && ok;
            ok = fsync(fileno(f)) == 0 && ok;
            fclose(f);
            if (!ok || rename(tmp, cache) != 0) unlink(tmp);
        }
    }
    return true;
}

static void build_identity(muser_model *mm, const char *file_hex, unsigned char **out, size_t *len) {
    const mu_model *m = mm->m;
    const mu_model_config *c = &m->cfg;
    const size_t n = KVP_IDENT_FIXED + (size_t)c->n_layer;
    unsigned char *p = mu_xcalloc(1, n);
    char tok[65];
    unhex(file_hex, p, 32);
    gguf_sha256_tokenizer(m->gguf, tok);
    unhex(tok, p + 32, 32);
    if (mm->chat_template_sha[0]) unhex(mm->chat_template_sha, p + 64, 32);
    /* weight types: each tensor's name and ggml type, in file order */
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int dl = 0;
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (uint64_t i = 0; ok && i < m->gguf->n_tensors; i++) {
        const gguf_tensor *t = &m->gguf->tensors[i];
        unsigned char ty[4];
        put_u32(ty, t->type);
        ok = EVP_DigestUpdate(ctx, t->name, strlen(t->name) + 1) && EVP_DigestUpdate(ctx, ty, 4);
    }
    if (!ok || !EVP_DigestFinal_ex(ctx, p + 96, &dl)) {
        fprintf(stderr, "muser: OpenSSL SHA-256 failed\n");
        abort();
    }
    EVP_MD_CTX_free(ctx);
    strncpy((char *)p + 128, m->lane, 16);
    put_u32(p + 144, KVP_KV_F16);
    put_u32(p + 148, KVP_NUMERICS_ABI);
    put_u64(p + 152, (uint64_t)c->n_layer);
    put_u64(p + 160, (uint64_t)c->n_head_kv);
    put_u64(p + 168, (uint64_t)c->head_dim);
    put_u64(p + 176, (uint64_t)c->n_vocab);
    put_u64(p + 184, (uint64_t)c->sliding_window);
    put_u64(p + 192, (uint64_t)c->n_embd);
    for (int64_t i = 0; i < c->n_layer; i++) p[KVP_IDENT_FIXED + i] = c->is_swa[i] ? 1 : 0;
    *out = p;
    *len = n;
}

bool kvp_model_identity(muser_model *mm, const char *cache_dir, const unsigned char **block, size_t *len,
                        mu_error *err) {
    pthread_mutex_lock(&mm->ident_lock);
    bool ok = true;
    if (!mm->kv_identity) {
        if (mm->m->cfg.n_layer > 4096) {
            mu_err_set(err, "kvpack: %lld layers; a pack holds at most 4096", (long long)mm->m->cfg.n_layer);
            ok = false;
        } else {
            char hex[65];
            ok = model_file_sha(mm->m->gguf->path, cache_dir, hex, err);
            if (ok) build_identity(mm, hex, &mm->kv_identity, &mm->kv_identity_len);
        }
    }
    if (ok) {
        *block = mm->kv_identity;
        *len = mm->kv_identity_len;
    }
    pthread_mutex_unlock(&mm->ident_lock);
    return ok;
}

bool kvp_parse_identity(const unsigned char *p, size_t n, kvp_ident *o, mu_error *err) {
    memset(o, 0, sizeof *o);
    if (n < KVP_IDENT_FIXED) {
        mu_err_set(err, "identity: %zu bytes, fewer than the fixed %u", n, KVP_IDENT_FIXED);
        return false;
    }
    memcpy(o->model_sha, p, 32);
    memcpy(o->tokenizer_sha, p + 32, 32);
    memcpy(o->template_sha, p + 64, 32);
    memcpy(o->types_sha, p + 96, 32);
    memcpy(o->lane, p + 128, 16);
    o->kv_type = get_u32(p + 144);
    o->numerics_abi = get_u32(p + 148);
    o->n_layer = get_u64(p + 152);
    o->n_head_kv = get_u64(p + 160);
    o->head_dim = get_u64(p + 168);
    o->n_vocab = get_u64(p + 176);
    o->window = get_u64(p + 184);
    o->n_embd = get_u64(p + 192);
    if (o->n_layer == 0 || o->n_layer > 4096 || n != KVP_IDENT_FIXED + o->n_layer) {
        mu_err_set(err, "identity: n_layer %" PRIu64 " does not match its %zu bytes", o->n_layer, n);
        return false;
    }
    if (o->kv_type != KVP_KV_F16) {
        mu_err_set(err, "identity: kv_type %u is not f16 (%u)", o->kv_type, KVP_KV_F16);
        return false;
    }
    if (!o->n_head_kv || !o->head_dim || o->n_head_kv > 4096 || o->head_dim > 4096 || !o->n_vocab ||
        o->n_vocab > (1u << 24) || o->window > (1u << 24)) {
        mu_err_set(err, "identity: geometry out of range (n_head_kv %" PRIu64 ", head_dim %" PRIu64 ", n_vocab %" PRIu64
                   ", sliding_window %" PRIu64 ")", o->n_head_kv, o->head_dim, o->n_vocab, o->window);
        return false;
    }
    for (uint64_t i = 0; i < o->n_layer; i++) {
        if (p[KVP_IDENT_FIXED + i] > 1) {
            mu_err_set(err, "identity: swa_layers[%" PRIu64 "] is %u, not 0 or 1", i, p[KVP_IDENT_FIXED + i]);
            return false;
        }
        o->swa[i] = p[KVP_IDENT_FIXED + i];
        if (o->swa[i] && !o->window) {
            mu_err_set(err, "identity: layer %" PRIu64 " slides but sliding_window is 0", i);
            return false;
        }
    }
    return true;
}

static void hexs(const unsigned char *d, char *out) { kvp_hex(d, 32, out); }

/* First field that differs, named as docs/kvpack.md names it. */
static bool same_identity(const kvp_ident *a /* pack */, const kvp_ident *b /* model */, mu_error *err) {
    char x[65], y[65];
    struct { const char *name; const unsigned char *p, *q; } h[] = {
        {"model_sha256", a->model_sha, b->model_sha},
        {"tokenizer_sha256", a->tokenizer_sha, b->tokenizer_sha},
        {"chat_template_sha256", a->template_sha, b->template_sha},
        {"weight_types_sha256", a->types_sha, b->types_sha},
    };
    for (size_t i = 0; i < sizeof h / sizeof *h; i++)
        if (memcmp(h[i].p, h[i].q, 32)) {
            hexs(h[i].p, x);
            hexs(h[i].q, y);
            mu_err_set(err, "identity mismatch: %s: the pack has %s, the model %s", h[i].name, x, y);
            return false;
        }
    if (strcmp(a->lane, b->lane)) {
        mu_err_set(err, "identity mismatch: weight_lane: the pack has '%s', the model '%s'", a->lane, b->lane);
        return false;
    }
    struct { const char *name; uint64_t p, q; } v[] = {
        {"kv_type", a->kv_type, b->kv_type},     {"numerics_abi", a->numerics_abi, b->numerics_abi},
        {"n_layer", a->n_layer, b->n_layer},     {"n_head_kv", a->n_head_kv, b->n_head_kv},
        {"head_dim", a->head_dim, b->head_dim},  {"n_vocab", a->n_vocab, b->n_vocab},
        {"sliding_window", a->window, b->window}, {"n_embd", a->n_embd, b->n_embd},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        if (v[i].p != v[i].q) {
            mu_err_set(err, "identity mismatch: %s: the pack has %" PRIu64 ", the model %" PRIu64, v[i].name, v[i].p,
                       v[i].q);
            return false;
        }
    for (uint64_t i = 0; i < a->n_layer; i++)
        if (a->swa[i] != b->swa[i]) {
            mu_err_set(err, "identity mismatch: swa_layers[%" PRIu64 "]: the pack has %u, the model %u", i, a->swa[i],
                       b->swa[i]);
            return false;
        }
    return true;
}

/* ------------------------------------------------------------------ key */

void kvp_key_path(const char *explicit_path, const char *dir, char *out, size_t cap) {
    const char *env = getenv("MUSER_KVPACK_KEY");
    if (explicit_path && *explicit_path) snprintf(out, cap, "%s", explicit_path);
    else if (env && *env) snprintf(out, cap, "%s", env);
    else snprintf(out, cap, "%s/kvpack.key", dir && *dir ? dir : ".");
}

bool kvp_load_key(const char *path, bool create, unsigned char key[KVP_KEY_BYTES], mu_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT && create) {
        unsigned char k[KVP_KEY_BYTES];
        if (getrandom(k, sizeof k, 0) != (ssize_t)sizeof k) {
            mu_err_set(err, "kvpack key %s: getrandom failed: %s", path, strerror(errno));
            return false;
        }
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
        int w = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        bool ok = w >= 0 && write(w, k, sizeof k) == (ssize_t)sizeof k && fsync(w) == 0;
        if (w >= 0) close(w);
        /* link, not rename: two first users racing both end up with the winner's key */
        if (!ok || (link(tmp, path) != 0 && errno != EEXIST)) {
            mu_err_set(err, "kvpack key %s: cannot create it: %s", path, strerror(errno));
            unlink(tmp);
            return false;
        }
        unlink(tmp);
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) {
        mu_err_set(err, "kvpack key %s: %s", path, strerror(errno));
        return false;
    }
    struct stat st;
    bool ok = fstat(fd, &st) == 0;
    if (!ok) mu_err_set(err, "kvpack key %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) { mu_err_set(err, "kvpack key %s: not a regular file", path); ok = false; }
    else if ((st.st_mode & 0777) != 0600) {
        mu_err_set(err, "kvpack key %s: mode %04o; the key file must be 0600 (chmod 600 it)", path,
                   (unsigned)(st.st_mode & 0777));
        ok = false;
    } else if (st.st_uid != geteuid()) {
        mu_err_set(err, "kvpack key %s: owned by uid %u, not by this user (%u)", path, (unsigned)st.st_uid,
                   (unsigned)geteuid());
        ok = false;
    } else if (st.st_size != KVP_KEY_BYTES) {
        mu_err_set(err, "kvpack key %s: %lld bytes; the key is exactly %d", path, (long long)st.st_size, KVP_KEY_BYTES);
        ok = false;
    } else if (read(fd, key, KVP_KEY_BYTES) != KVP_KEY_BYTES) {
        mu_err_set(err, "kvpack key %s: short read", path);
        ok = false;
    }
    close(fd);
    return ok;
}

/* ------------------------------------------------------------------ layout */

/* Rows a layer's pack holds for a sequence of n tokens: full planes all
 * of them, rings the window's tail [n - window + 1, n) that attention at
 * position n onward can still read (docs/numerics.md, "Attention"). */
static int64_t layer_first(bool swa, int64_t window, int64_t n) {
    return swa && n - window + 1 > 0 ? n - window + 1 : 0;
}

/* Chunks of [first, n) cut at multiples of KVP_CHUNK. */
static int64_t n_chunks(int64_t first, int64_t n) {
    return first >= n ? 0 : (n - 1) / KVP_CHUNK - first / KVP_CHUNK + 1;
}

static uint64_t kv_bytes(uint64_t n_head, uint64_t head_dim, int64_t rows) {
    return 2 * n_head * (uint64_t)rows * head_dim * sizeof(uint16_t);
}

/* ------------------------------------------------------------------ writer */

typedef struct writer {
    int fd;
    unsigned char *buf;
    size_t len, cap;
    uint64_t written;  /* bytes handed to write() */
    mac_ctx *mac;
    bool unsealed;     /* bytes past the sealed range (the seal itself) */
    bool failed;
    char why[256];
} writer;

static void w_flush(writer *w) {
    if (w->failed || !w->len) return;
    size_t n = w->len;
    bool kill = g_kill_at >= 0 && (uint64_t)g_kill_at < w->written + n;
    if (kill) n = (size_t)((uint64_t)g_kill_at - w->written);
    for (size_t off = 0; off < n;) {
        ssize_t r = write(w->fd, w->buf + off, n - off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(w->why, sizeof w->why, "write: %s", r < 0 ? strerror(errno) : "no progress");
            w->failed = true;
            return;
        }
        off += (size_t)r;
    }
    w->written += n;
    if (kill) raise(SIGKILL);
    w->len = 0;
}

static void w_put(writer *w, const void *p, size_t n) {
    const unsigned char *b = p;
    if (!w->unsealed) mac_update(w->mac, b, n);
    while (n && !w->failed) {
        size_t k = w->cap - w->len < n ? w->cap - w->len : n;
        memcpy(w->buf + w->len, b, k);
        w->len += k;
        b += k;
        n -= k;
        if (w->len == w->cap) w_flush(w);
    }
}

/* One section: header, its digest (over header and payload, so the
 * payload is in host memory first: at most one 256-row chunk), payload. */
static void write_section(writer *w, uint32_t type, uint32_t layer, uint64_t first, uint64_t count,
                          const void *payload, uint64_t bytes) {
    unsigned char h[KVP_SECTION_HASHED] = {0}, d[32];
    put_u32(h, type);
    put_u32(h + 4, layer);
    put_u64(h + 8, first);
    put_u64(h + 16, count);
    put_u64(h + 24, bytes);
    sha256(h, sizeof h, payload, (size_t)bytes, d);
    w_put(w, h, sizeof h);
    w_put(w, d, sizeof d);
    w_put(w, payload, (size_t)bytes);
}

bool kvp_write(int fd, muser_session *s, const muser_sampler *smp, const unsigned char *ident, size_t ident_len,
               const unsigned char key[KVP_KEY_BYTES], uint64_t *bytes_out, mu_error *err) {
    const mu_kv_cache *kv = mu_session_kv(s);
    int64_t n;
    const int32_t *tokens = mu_session_hist(s, &n);
    const float *logits = muser_session_logits(s);
    const int64_t pos = muser_session_pos(s);
    const muser_model *mm = muser_session_model(s);
    const mu_model_config *cfg = &mm->m->cfg;
    if (mu_session_busy(s)) { mu_err_set(err, "kvpack save: the session has queued input"); return false; }
    if (mu_session_poisoned(s)) { mu_err_set(err, "kvpack save: the session is poisoned"); return false; }
    if (kv->ckpt_active) { mu_err_set(err, "kvpack save: a checkpoint is active; commit or roll back first"); return false; }
    if (pos == 0) { mu_err_set(err, "kvpack save: the session is empty"); return false; }
    if (n != pos) {
        mu_err_set(err, "kvpack save: the session holds %lld positions but only the tokens of %lld are known "
                   "(rows that were not fed as tokens cannot be packed)", (long long)pos, (long long)n);
        return false;
    }
    if (!logits) {
        mu_err_set(err, "kvpack save: the session has no logits row for its last token (fed it again, or restore "
                   "a snapshot that has one)");
        return false;
    }
    const int64_t V = cfg->n_vocab, H = cfg->n_head_kv, D = cfg->head_dim, W = cfg->sliding_window;
    size_t slen = 0;
    unsigned char *sstate = NULL;
    if (smp) {
        slen = muser_sampler_state_size(smp);
        sstate = mu_xmalloc(slen ? slen : 1);
        if (!muser_sampler_state_save(smp, sstate, slen, (muser_error *)err)) {
            free(sstate);
            return false;
        }
    }
    /* layout: sizes first, so the header can carry the file's length */
    uint64_t total = KVP_HEADER_BYTES, sections = 0;
    total += KVP_SECTION_BYTES + ident_len;
    total += KVP_SECTION_BYTES + 4 * (uint64_t)n;
    sections += 2;
    for (int l = 0; l < kv->n_layers; l++) {
        const int64_t first = layer_first(kv->layers[l].swa, W, n);
        for (int64_t c = first; c < n; c = (c / KVP_CHUNK + 1) * KVP_CHUNK) {
            int64_t end = (c / KVP_CHUNK + 1) * KVP_CHUNK;
            if (end > n) end = n;
            total += KVP_SECTION_BYTES + kv_bytes((uint64_t)H, (uint64_t)D, end - c);
            sections++;
        }
    }
    total += KVP_SECTION_BYTES + 4 * (uint64_t)V;
    sections++;
    if (smp) {
        total += KVP_SECTION_BYTES + slen;
        sections++;
    }
    total += KVP_SEAL_BYTES;

    writer w = {.fd = fd, .cap = (size_t)1 << 20};
    w.buf = mu_xmalloc(w.cap);
    w.mac = mac_new(key);

    unsigned char hdr[KVP_HEADER_BYTES] = {0};
    memcpy(hdr, KVP_MAGIC, 8);
    put_u32(hdr + 8, KVP_VERSION);
    put_u32(hdr + 12, KVP_HEADER_BYTES);
    put_u32(hdr + 16, 0); /* flags: no compression */
    put_u32(hdr + 20, (uint32_t)sections);
    put_u64(hdr + 24, total);
    put_u64(hdr + 32, (uint64_t)n);
    put_u64(hdr + 40, (uint64_t)kv->n_ctx); /* the saver's context: informational */
    sha256(hdr, KVP_HEADER_HASHED, NULL, 0, hdr + KVP_HEADER_HASHED);
    w_put(&w, hdr, sizeof hdr);

    write_section(&w, KVP_SEC_IDENTITY, 0, 0, ident_len, ident, ident_len);
    unsigned char *tb = mu_xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) put_u32(tb + 4 * i, (uint32_t)tokens[i]);
    write_section(&w, KVP_SEC_TOKENS, 0, 0, (uint64_t)n, tb, 4 * (uint64_t)n);
    free(tb);
    const size_t chunk_bytes = (size_t)kv_bytes((uint64_t)H, (uint64_t)D, KVP_CHUNK);
    uint16_t *kvbuf = mu_xmalloc(chunk_bytes);
    bool ok = true;
    for (int l = 0; ok && l < kv->n_layers && !w.failed; l++) {
        const int64_t first = layer_first(kv->layers[l].swa, W, n);
        for (int64_t c = first; ok && c < n; c = (c / KVP_CHUNK + 1) * KVP_CHUNK) {
            int64_t end = (c / KVP_CHUNK + 1) * KVP_CHUNK;
            if (end > n) end = n;
            const int64_t rows = end - c;
            ok = mu_kv_read(kv, l, c, rows, kvbuf, kvbuf + H * rows * D, err);
            if (ok) write_section(&w, KVP_SEC_KV, (uint32_t)l, (uint64_t)c, (uint64_t)rows, kvbuf,
                                  kv_bytes((uint64_t)H, (uint64_t)D, rows));
        }
    }
    free(kvbuf);
    if (ok) {
        unsigned char *lb = mu_xmalloc((size_t)V * 4);
        for (int64_t i = 0; i < V; i++) {
            uint32_t b;
            memcpy(&b, &logits[i], 4);
            put_u32(lb + 4 * i, b);
        }
        write_section(&w, KVP_SEC_LOGITS, 0, 0, (uint64_t)V, lb, 4 * (uint64_t)V);
        free(lb);
        if (smp) write_section(&w, KVP_SEC_SAMPLER, 0, 0, slen, sstate, slen);
        unsigned char seal[KVP_SEAL_BYTES];
        memcpy(seal, KVP_SEAL_MAGIC, 8);
        mac_update(w.mac, seal, 8);
        mac_final(w.mac, seal + 8);
        w.unsealed = true; /* the tag is not part of what it authenticates */
        w_put(&w, seal, sizeof seal);
        w_flush(&w);
        if (w.failed) {
            mu_err_set(err, "kvpack save: %s", w.why);
            ok = false;
        } else if (w.written != total) {
            mu_err_set(err, "kvpack save: wrote %" PRIu64 " bytes, the layout says %" PRIu64, w.written, total);
            ok = false;
        }
    }
    free(sstate);
    free(w.buf);
    EVP_MAC_CTX_free(w.mac);
    if (ok && bytes_out) *bytes_out = total;
    return ok;
}

/* ------------------------------------------------------------------ reader */

typedef struct reader {
    FILE *f;
    uint64_t off, size;
    mac_ctx *mac;
    const char *path;
} reader;

static bool r_get(reader *r, void *p, size_t n, const char *what, mu_error *err) {
    if (n > r->size - r->off) {
        mu_err_set(err, "%s: truncated: %s needs %zu bytes at offset %" PRIu64 "; the file has %" PRIu64, r->path,
                   what, n, r->off, r->size);
        return false;
    }
    if (n && fread(p, 1, n, r->f) != n) {
        mu_err_set(err, "%s: read error in %s at offset %" PRIu64 ": %s", r->path, what, r->off, strerror(errno));
        return false;
    }
    r->off += n;
    return true;
}

static const char *sec_name(uint32_t t) {
    switch (t) {
    case KVP_SEC_IDENTITY: return "identity";
    case KVP_SEC_TOKENS: return "tokens";
    case KVP_SEC_KV: return "kv";
    case KVP_SEC_LOGITS: return "logits";
    case KVP_SEC_SAMPLER: return "sampler";
    }
    return "unknown";
}

typedef struct sec {
    uint32_t type, layer;
    uint64_t first, count, bytes;
    unsigned char *payload;
} sec;

/* The next section, whose header must be exactly `want` (bytes == 0 with
 * type SAMPLER: any length the file still has room for). */
static bool read_section(reader *r, uint32_t index, const sec *want, sec *got, mu_error *err) {
    unsigned char h[KVP_SECTION_BYTES];
    char what[96];
    snprintf(what, sizeof what, "section %u (%s)", index, sec_name(want->type));
    if (!r_get(r, h, sizeof h, what, err)) return false;
    got->type = get_u32(h);
    got->layer = get_u32(h + 4);
    got->first = get_u64(h + 8);
    got->count = get_u64(h + 16);
    got->bytes = get_u64(h + 24);
    const uint32_t codec = get_u32(h + 32), reserved = get_u32(h + 36);
    const uint64_t at = r->off - sizeof h;
    /* fields are checked before the digest so that a damaged length never sizes an allocation */
    if (got->type != want->type || got->layer != want->layer || got->first != want->first ||
        (want->bytes && (got->count != want->count || got->bytes != want->bytes)) || codec != 0 || reserved != 0 ||
        got->bytes > r->size - r->off) {
        mu_err_set(err, "%s: section %u at offset %" PRIu64 ": header damaged or out of order: expected %s layer %u "
                   "first %" PRIu64 " count %" PRIu64 " bytes %" PRIu64 " codec 0, found %s layer %u first %" PRIu64
                   " count %" PRIu64 " bytes %" PRIu64 " codec %u reserved %u",
                   r->path, index, at, sec_name(want->type), want->layer, want->first, want->count, want->bytes,
                   sec_name(got->type), got->layer, got->first, got->count, got->bytes, codec, reserved);
        return false;
    }
    got->payload = malloc(got->bytes ? (size_t)got->bytes : 1);
    if (!got->payload) {
        mu_err_set(err, "%s: section %u: cannot allocate %" PRIu64 " bytes", r->path, index, got->bytes);
        return false;
    }
    if (!r_get(r, got->payload, (size_t)got->bytes, what, err)) {
        free(got->payload);
        got->payload = NULL;
        return false;
    }
    unsigned char d[32];
    sha256(h, KVP_SECTION_HASHED, got->payload, (size_t)got->bytes, d);
    if (CRYPTO_memcmp(d, h + KVP_SECTION_HASHED, 32)) {
        char extra[80] = "";
        if (got->type == KVP_SEC_KV)
            snprintf(extra, sizeof extra, " layer %u rows %" PRIu64 "..%" PRIu64, got->layer, got->first,
                     got->first + got->count - 1);
        mu_err_set(err, "%s: section %u (%s%s) at offset %" PRIu64 ": SHA-256 mismatch (the section is damaged)",
                   r->path, index, sec_name(got->type), extra, at);
        free(got->payload);
        got->payload = NULL;
        return false;
    }
    mac_update(r->mac, h, sizeof h);
    mac_update(r->mac, got->payload, (size_t)got->bytes);
    return true;
}

bool kvp_read(const char *path, const unsigned char key[KVP_KEY_BYTES], const unsigned char *want_ident,
              size_t want_len, const kvp_sink *sink, const volatile int *cancel, kvp_info *info, mu_error *err) {
    kvp_info local;
    if (!info) info = &local;
    memset(info, 0, sizeof *info);
    reader r = {.path = path};
    r.f = fopen(path, "rb");
    if (!r.f) {
        mu_err_set(err, "%s: %s", path, strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fileno(r.f), &st) != 0 || !S_ISREG(st.st_mode)) {
        mu_err_set(err, "%s: not a regular file", path);
        fclose(r.f);
        return false;
    }
    r.size = (uint64_t)st.st_size;
    r.mac = mac_new(key);
    bool ok = false;
    sec s = {0};
    kvp_ident model_ident;
    unsigned char hdr[KVP_HEADER_BYTES], d[32];
    if (!r_get(&r, hdr, sizeof hdr, "the header", err)) goto done;
    if (memcmp(hdr, KVP_MAGIC, 8)) { mu_err_set(err, "%s: header: magic is not " KVP_MAGIC " (not a kvpack)", path); goto done; }
    const uint32_t version = get_u32(hdr + 8);
    if (version != KVP_VERSION) {
        mu_err_set(err, "%s: header: version %u; this build reads version %u only (a stale or newer pack)", path,
                   version, KVP_VERSION);
        goto done;
    }
    sha256(hdr, KVP_HEADER_HASHED, NULL, 0, d);
    if (CRYPTO_memcmp(d, hdr + KVP_HEADER_HASHED, 32)) {
        mu_err_set(err, "%s: header: SHA-256 mismatch (the header is damaged)", path);
        goto done;
    }
    if (get_u32(hdr + 12) != KVP_HEADER_BYTES) {
        mu_err_set(err, "%s: header: header_bytes %u, expected %u", path, get_u32(hdr + 12), KVP_HEADER_BYTES);
        goto done;
    }
    if (get_u32(hdr + 16) != 0) {
        mu_err_set(err, "%s: header: flags 0x%x; this build knows none (compression is not implemented)", path,
                   get_u32(hdr + 16));
        goto done;
    }
    for (unsigned i = 48; i < KVP_HEADER_HASHED; i++)
        if (hdr[i]) { mu_err_set(err, "%s: header: reserved byte %u is not zero", path, i); goto done; }
    info->n_sections = get_u32(hdr + 20);
    info->file_bytes = get_u64(hdr + 24);
    info->n_tokens = get_u64(hdr + 32);
    if (info->file_bytes != r.size) {
        mu_err_set(err, "%s: header: file_bytes says %" PRIu64 " bytes, the file has %" PRIu64 " (%s)", path,
                   info->file_bytes, r.size, r.size < info->file_bytes ? "truncated" : "trailing bytes");
        goto done;
    }
    if (info->n_tokens == 0 || info->n_tokens > ((uint64_t)1 << 24)) {
        mu_err_set(err, "%s: header: n_tokens %" PRIu64 " out of range [1, 2^24]", path, info->n_tokens);
        goto done;
    }
    mac_update(r.mac, hdr, sizeof hdr);
    uint32_t index = 0;
    /* identity: its length is only bounded until the block is parsed */
    unsigned char ih[KVP_SECTION_BYTES];
    if (r.size - r.off < KVP_SECTION_BYTES) { mu_err_set(err, "%s: truncated before the identity section", path); goto done; }
    {
        long at = ftell(r.f);
        if (fread(ih, 1, sizeof ih, r.f) != sizeof ih || fseek(r.f, at, SEEK_SET) != 0) {
            mu_err_set(err, "%s: read error", path);
            goto done;
        }
    }
    const uint64_t ibytes = get_u64(ih + 24);
    if (ibytes < KVP_IDENT_FIXED + 1 || ibytes > KVP_IDENT_FIXED + 4096) {
        mu_err_set(err, "%s: section 0 (identity): %" PRIu64 " bytes, out of range", path, ibytes);
        goto done;
    }
    if (!read_section(&r, index++, &(sec){KVP_SEC_IDENTITY, 0, 0, ibytes, ibytes, NULL}, &s, err)) goto done;
    if (!kvp_parse_identity(s.payload, (size_t)s.bytes, &info->ident, err)) { mu_err_prefix(err, "%s", path); goto done; }
    if (want_ident) {
        if (!kvp_parse_identity(want_ident, want_len, &model_ident, err)) goto done;
        if (!same_identity(&info->ident, &model_ident, err)) { mu_err_prefix(err, "%s", path); goto done; }
    }
    free(s.payload);
    s.payload = NULL;
    const kvp_ident *id = &info->ident;
    const int64_t n = (int64_t)info->n_tokens;
    /* the sections this identity and length call for */
    uint64_t expect = 2 + 1;
    for (uint64_t l = 0; l < id->n_layer; l++) expect += (uint64_t)n_chunks(layer_first(id->swa[l], (int64_t)id->window, n), n);
    if (info->n_sections != expect && info->n_sections != expect + 1) {
        mu_err_set(err, "%s: header: n_sections %u; this identity and %" PRId64 " tokens need %" PRIu64 " (or %" PRIu64
                   " with sampler state)", path, info->n_sections, n, expect, expect + 1);
        goto done;
    }
    info->has_sampler = info->n_sections == expect + 1;
    if (!read_section(&r, index++, &(sec){KVP_SEC_TOKENS, 0, 0, (uint64_t)n, 4 * (uint64_t)n, NULL}, &s, err)) goto done;
    {
        int32_t *t = mu_xmalloc((size_t)n * sizeof *t);
        for (int64_t i = 0; i < n; i++) {
            uint32_t v = get_u32(s.payload + 4 * i);
            if (v >= id->n_vocab) {
                mu_err_set(err, "%s: tokens: token %u at index %" PRId64 " is outside the vocabulary of %" PRIu64, path, v,
                           i, id->n_vocab);
                free(t);
                goto done;
            }
            t[i] = (int32_t)v;
        }
        bool sok = !sink || !sink->tokens || sink->tokens(sink->ctx, t, n, err);
        free(t);
        if (!sok) goto done;
    }
    free(s.payload);
    s.payload = NULL;
    const uint64_t H = id->n_head_kv, D = id->head_dim;
    for (uint64_t l = 0; l < id->n_layer; l++) {
        for (int64_t c = layer_first(id->swa[l], (int64_t)id->window, n); c < n; c = (c / KVP_CHUNK + 1) * KVP_CHUNK) {
            if (cancel && *cancel) { mu_err_set(err, "%s: restore cancelled", path); goto done; }
            int64_t end = (c / KVP_CHUNK + 1) * KVP_CHUNK;
            if (end > n) end = n;
            sec want = {KVP_SEC_KV, (uint32_t)l, (uint64_t)c, (uint64_t)(end - c), kv_bytes(H, D, end - c), NULL};
            if (!read_section(&r, index++, &want, &s, err)) goto done;
            const uint16_t *k = (const uint16_t *)s.payload, *v = k + H * (uint64_t)(end - c) * D;
            if (sink && sink->kv && !sink->kv(sink->ctx, (int)l, c, end - c, k, v, err)) goto done;
            free(s.payload);
            s.payload = NULL;
        }
    }
    if (!read_section(&r, index++, &(sec){KVP_SEC_LOGITS, 0, 0, id->n_vocab, 4 * id->n_vocab, NULL}, &s, err)) goto done;
    {
        float *row = mu_xmalloc((size_t)id->n_vocab * sizeof *row);
        for (uint64_t i = 0; i < id->n_vocab; i++) {
            uint32_t b = get_u32(s.payload + 4 * i);
            memcpy(&row[i], &b, 4);
            if (!isfinite(row[i])) {
                mu_err_set(err, "%s: logits: entry %" PRIu64 " is not finite", path, i);
                free(row);
                goto done;
            }
        }
        bool sok = !sink || !sink->logits || sink->logits(sink->ctx, row, (int64_t)id->n_vocab, err);
        free(row);
        if (!sok) goto done;
    }
    free(s.payload);
    s.payload = NULL;
    if (info->has_sampler) {
        uint64_t room = r.size - r.off;
        if (room < KVP_SECTION_BYTES + KVP_SEAL_BYTES) { mu_err_set(err, "%s: truncated before the sampler section", path); goto done; }
        if (!read_section(&r, index++, &(sec){KVP_SEC_SAMPLER, 0, 0, 0, 0, NULL}, &s, err)) goto done;
        if (sink && sink->sampler && !sink->sampler(sink->ctx, s.payload, (size_t)s.bytes, err)) goto done;
        free(s.payload);
        s.payload = NULL;
    }
    unsigned char seal[KVP_SEAL_BYTES], mac[32];
    if (!r_get(&r, seal, sizeof seal, "the seal", err)) goto done;
    if (memcmp(seal, KVP_SEAL_MAGIC, 8)) { mu_err_set(err, "%s: seal: magic is not " KVP_SEAL_MAGIC, path); goto done; }
    mac_update(r.mac, seal, 8);
    mac_final(r.mac, mac);
    if (CRYPTO_memcmp(mac, seal + 8, 32)) {
        mu_err_set(err, "%s: seal: HMAC-SHA256 mismatch (a different key, or the pack was altered)", path);
        goto done;
    }
    if (r.off != r.size) {
        mu_err_set(err, "%s: %" PRIu64 " bytes after the seal", path, r.size - r.off);
        goto done;
    }
    ok = true;
done:
    free(s.payload);
    EVP_MAC_CTX_free(r.mac);
    fclose(r.f);
    return ok;
}
