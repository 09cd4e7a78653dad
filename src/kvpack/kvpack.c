/* The kvpack codec: identity block, HMAC key, writer and checking reader
 * of one pack (byte layout: docs/kvpack.md). The writer streams the
 * session's rows through the backend's download op, section by section;
 * the reader streams them back and hands each checked section to a sink,
 * so a restore never holds more than one 256-row chunk on the host. */
#include "kvpack/kvpack.h"
#include "kv/kv.h"
#include "model/capture.h"
#include "spec/speculate.h"
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
#include <zstd.h>

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

/* HMAC-SHA256 through OpenSSL 3's EVP_MAC (the HMAC_CTX calls are
 * deprecated), its message starting with a domain string (the seal's, the
 * prefix chain's in store.c); a failure of the library aborts. */
typedef kvp_mac_ctx mac_ctx;
mac_ctx *kvp_mac_new(const unsigned char key[KVP_KEY_BYTES], const void *domain, size_t domain_len) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac);
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                           OSSL_PARAM_construct_end()};
    if (!c || !EVP_MAC_init(c, key, KVP_KEY_BYTES, params) || !EVP_MAC_update(c, domain, domain_len)) {
        fprintf(stderr, "muser: OpenSSL HMAC-SHA256 is unavailable\n");
        abort();
    }
    return c;
}
void kvp_mac_update(mac_ctx *c, const void *p, size_t n) {
    if (n && !EVP_MAC_update(c, p, n)) abort();
}
void kvp_mac_final(mac_ctx *c, unsigned char out[32]) {
    size_t len = 0;
    if (!EVP_MAC_final(c, out, &len, 32) || len != 32) abort();
}
void kvp_mac_free(mac_ctx *c) { EVP_MAC_CTX_free(c); }

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
    o->has_assistant = o->n_layer <= 4096 && n == KVP_IDENT_FIXED + o->n_layer + KVP_IDENT_ASSISTANT;
    if (o->n_layer == 0 || o->n_layer > 4096 || (n != KVP_IDENT_FIXED + o->n_layer && !o->has_assistant)) {
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
    if (o->has_assistant) {
        const unsigned char *a = p + KVP_IDENT_FIXED + o->n_layer;
        memcpy(o->assistant_sha, a, 32);
        o->a_layer = get_u64(a + 32);
        o->a_head_kv = get_u64(a + 40);
        o->a_head_dim = get_u64(a + 48);
        o->a_sink = get_u64(a + 56);
        o->a_window = get_u64(a + 64);
        o->a_feat_floats = get_u64(a + 72);
        o->a_feat_rows = get_u64(a + 80);
        /* bounds that keep every size computed from them far from overflow */
        if (!o->a_layer || o->a_layer > 256 || !o->a_head_kv || o->a_head_kv > 4096 || !o->a_head_dim ||
            o->a_head_dim > 4096 || o->a_sink != MU_DFLASH_SINK || !o->a_window || o->a_window > (1u << 24) ||
            !o->a_feat_floats || o->a_feat_floats > (1u << 24) || !o->a_feat_rows || o->a_feat_rows > (1u << 24)) {
            mu_err_set(err, "identity: assistant geometry out of range (assistant_n_layer %" PRIu64 ", assistant_n_head_kv %"
                       PRIu64 ", assistant_head_dim %" PRIu64 ", assistant_sink %" PRIu64 ", assistant_window %" PRIu64
                       ", assistant_feature_floats %" PRIu64 ", assistant_feature_rows %" PRIu64 ")", o->a_layer,
                       o->a_head_kv, o->a_head_dim, o->a_sink, o->a_window, o->a_feat_floats, o->a_feat_rows);
            return false;
        }
    }
    return true;
}

bool kvp_session_identity(muser_session *s, const char *cache_dir, unsigned char **out, size_t *len, mu_error *err) {
    const unsigned char *model;
    size_t mlen;
    if (!kvp_model_identity(muser_session_model(s), cache_dir, &model, &mlen, err)) return false;
    const muser_spec *sp = mu_session_spec(s);
    *len = mlen + (sp ? KVP_IDENT_ASSISTANT : 0);
    unsigned char *p = mu_xcalloc(1, *len);
    memcpy(p, model, mlen);
    if (sp) {
        mu_spec_geom g;
        mu_spec_geometry(sp, &g);
        char hex[65];
        if (!model_file_sha(g.path, cache_dir, hex, err)) {
            free(p);
            return false;
        }
        unsigned char *a = p + mlen;
        unhex(hex, a, 32);
        put_u64(a + 32, (uint64_t)g.n_layer);
        put_u64(a + 40, (uint64_t)g.n_head_kv);
        put_u64(a + 48, (uint64_t)g.head_dim);
        put_u64(a + 56, (uint64_t)g.sink);
        put_u64(a + 64, (uint64_t)g.window);
        put_u64(a + 72, (uint64_t)g.feat_floats);
        put_u64(a + 80, (uint64_t)g.feat_rows);
    }
    *out = p;
    return true;
}

uint64_t kvp_dflash_bytes(const kvp_ident *id, int64_t n, int64_t rows) {
    if (!id->has_assistant || rows < 0 || rows > n || (uint64_t)(n - rows) > id->a_feat_rows) return 0;
    const int64_t sink = (int64_t)id->a_sink, window = (int64_t)id->a_window, tail = rows - sink;
    const int64_t held = rows <= sink ? rows : sink + (tail < window ? tail : window);
    return id->a_layer * 2 * id->a_head_kv * id->a_head_dim * (uint64_t)held * 4 +
           (uint64_t)(n - rows) * id->a_feat_floats * 4;
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
    /* the assistant: only when the restoring session has one (a plain
     * session restores the target's KV of any pack and ignores the rest) */
    if (!b->has_assistant) return true;
    if (!a->has_assistant) {
        hexs(b->assistant_sha, y);
        mu_err_set(err, "identity mismatch: assistant_sha256: the pack has no DFlash assistant context, the session's "
                   "assistant is %s", y);
        return false;
    }
    if (memcmp(a->assistant_sha, b->assistant_sha, 32)) {
        hexs(a->assistant_sha, x);
        hexs(b->assistant_sha, y);
        mu_err_set(err, "identity mismatch: assistant_sha256: the pack has %s, the session's assistant %s", x, y);
        return false;
    }
    struct { const char *name; uint64_t p, q; } g[] = {
        {"assistant_n_layer", a->a_layer, b->a_layer},       {"assistant_n_head_kv", a->a_head_kv, b->a_head_kv},
        {"assistant_head_dim", a->a_head_dim, b->a_head_dim}, {"assistant_sink", a->a_sink, b->a_sink},
        {"assistant_window", a->a_window, b->a_window},      {"assistant_feature_floats", a->a_feat_floats, b->a_feat_floats},
        {"assistant_feature_rows", a->a_feat_rows, b->a_feat_rows},
    };
    for (size_t i = 0; i < sizeof g / sizeof *g; i++)
        if (g[i].p != g[i].q) {
            mu_err_set(err, "identity mismatch: %s: the pack has %" PRIu64 ", the session's assistant %" PRIu64,
                       g[i].name, g[i].p, g[i].q);
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
    if (!w->unsealed) kvp_mac_update(w->mac, b, n);
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
static void write_section(writer *w, uint32_t type, uint32_t layer, uint64_t first, uint64_t count, uint32_t codec,
                          const void *payload, uint64_t bytes) {
    unsigned char h[KVP_SECTION_HASHED] = {0}, d[32];
    put_u32(h, type);
    put_u32(h + 4, layer);
    put_u64(h + 8, first);
    put_u64(h + 16, count);
    put_u64(h + 24, bytes);
    put_u32(h + 32, codec);
    sha256(h, sizeof h, payload, (size_t)bytes, d);
    w_put(w, h, sizeof h);
    w_put(w, d, sizeof d);
    w_put(w, payload, (size_t)bytes);
}

bool kvp_capture(muser_session *s, const muser_sampler *smp, kvp_image *img, mu_error *err) {
    memset(img, 0, sizeof *img);
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
    if (smp) {
        img->sampler_len = muser_sampler_state_size(smp);
        img->sampler = mu_xmalloc(img->sampler_len ? img->sampler_len : 1);
        img->has_sampler = true;
        if (!muser_sampler_state_save(smp, img->sampler, img->sampler_len, (muser_error *)err)) {
            kvp_image_free(img);
            return false;
        }
    }
    img->n = n;
    img->n_ctx = kv->n_ctx;
    img->n_vocab = V;
    img->tokens = mu_xmalloc((size_t)n * sizeof *tokens);
    memcpy(img->tokens, tokens, (size_t)n * sizeof *tokens);
    img->logits = mu_xmalloc((size_t)V * sizeof *logits);
    memcpy(img->logits, logits, (size_t)V * sizeof *logits);
    int64_t cap = 0;
    for (int l = 0; l < kv->n_layers; l++) cap += n_chunks(layer_first(kv->layers[l].swa, W, n), n);
    img->chunks = mu_xcalloc((size_t)(cap ? cap : 1), sizeof *img->chunks);
    for (int l = 0; l < kv->n_layers; l++) {
        const int64_t first = layer_first(kv->layers[l].swa, W, n);
        for (int64_t c = first; c < n; c = (c / KVP_CHUNK + 1) * KVP_CHUNK) {
            int64_t end = (c / KVP_CHUNK + 1) * KVP_CHUNK;
            if (end > n) end = n;
            const int64_t rows = end - c;
            kvp_chunk *ch = &img->chunks[img->n_chunks++];
            ch->layer = (uint32_t)l;
            ch->first = c;
            ch->rows = rows;
            ch->bytes = kv_bytes((uint64_t)H, (uint64_t)D, rows);
            ch->data = mu_xmalloc((size_t)ch->bytes);
            uint16_t *k = (uint16_t *)ch->data;
            if (!mu_kv_read(kv, l, c, rows, k, k + H * rows * D, err)) {
                kvp_image_free(img);
                return false;
            }
        }
    }
    const muser_spec *sp = mu_session_spec(s);
    if (sp && !mu_spec_export(sp, &img->dflash_rows, &img->dflash, &img->dflash_len, err)) {
        mu_err_prefix(err, "kvpack save: the DFlash assistant's context");
        kvp_image_free(img);
        return false;
    }
    return true;
}

void kvp_image_free(kvp_image *img) {
    for (int64_t i = 0; i < img->n_chunks; i++) free(img->chunks[i].data);
    free(img->chunks);
    free(img->tokens);
    free(img->logits);
    free(img->sampler);
    free(img->dflash);
    memset(img, 0, sizeof *img);
}

/* Each chunk on its own (a reader decompresses one chunk at a time, into a
 * buffer of the size the section's count gives: docs/kvpack.md). */
bool kvp_compress(kvp_image *img, int level, mu_error *err) {
    if (level < 1 || level > KVP_ZSTD_MAX_LEVEL) {
        mu_err_set(err, "kvpack: zstd level %d: must be 1 to %d", level, KVP_ZSTD_MAX_LEVEL);
        return false;
    }
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    if (!cc || ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1))) {
        ZSTD_freeCCtx(cc);
        mu_err_set(err, "kvpack: cannot set up a zstd compressor");
        return false;
    }
    for (int64_t i = 0; i < img->n_chunks; i++) {
        kvp_chunk *ch = &img->chunks[i];
        const size_t bound = ZSTD_compressBound((size_t)ch->bytes);
        unsigned char *out = mu_xmalloc(bound);
        const size_t r = ZSTD_compress2(cc, out, bound, ch->data, (size_t)ch->bytes);
        if (ZSTD_isError(r)) {
            mu_err_set(err, "kvpack: zstd compression of kv layer %u rows %lld..%lld failed: %s", ch->layer,
                       (long long)ch->first, (long long)(ch->first + ch->rows - 1), ZSTD_getErrorName(r));
            free(out);
            ZSTD_freeCCtx(cc);
            return false;
        }
        free(ch->data);
        ch->data = mu_xrealloc(out, r);
        ch->bytes = r;
        ch->codec = KVP_CODEC_ZSTD;
    }
    ZSTD_freeCCtx(cc);
    img->compressed = true;
    return true;
}

bool kvp_write_image(int fd, const kvp_image *img, const unsigned char *ident, size_t ident_len,
                     const unsigned char key[KVP_KEY_BYTES], uint64_t *bytes_out, mu_error *err) {
    const int64_t n = img->n, V = img->n_vocab;
    /* layout: sizes first, so the header can carry the file's length */
    uint64_t total = KVP_HEADER_BYTES, sections = 0;
    total += KVP_SECTION_BYTES + ident_len;
    total += KVP_SECTION_BYTES + 4 * (uint64_t)n;
    sections += 2;
    for (int64_t i = 0; i < img->n_chunks; i++) total += KVP_SECTION_BYTES + img->chunks[i].bytes;
    sections += (uint64_t)img->n_chunks;
    total += KVP_SECTION_BYTES + 4 * (uint64_t)V;
    sections++;
    if (img->dflash) {
        total += KVP_SECTION_BYTES + img->dflash_len;
        sections++;
    }
    if (img->has_sampler) {
        total += KVP_SECTION_BYTES + img->sampler_len;
        sections++;
    }
    total += KVP_SEAL_BYTES;

    writer w = {.fd = fd, .cap = (size_t)1 << 20};
    w.buf = mu_xmalloc(w.cap);
    w.mac = kvp_mac_new(key, KVP_SEAL_DOMAIN, sizeof KVP_SEAL_DOMAIN) /* with its NUL */;

    unsigned char hdr[KVP_HEADER_BYTES] = {0};
    memcpy(hdr, KVP_MAGIC, 8);
    put_u32(hdr + 8, KVP_VERSION);
    put_u32(hdr + 12, KVP_HEADER_BYTES);
    put_u32(hdr + 16, (img->compressed ? KVP_FLAG_ZSTD : 0) | (img->dflash ? KVP_FLAG_DFLASH : 0));
    put_u32(hdr + 20, (uint32_t)sections);
    put_u64(hdr + 24, total);
    put_u64(hdr + 32, (uint64_t)n);
    put_u64(hdr + 40, (uint64_t)img->n_ctx); /* the saver's context: informational */
    sha256(hdr, KVP_HEADER_HASHED, NULL, 0, hdr + KVP_HEADER_HASHED);
    w_put(&w, hdr, sizeof hdr);

    write_section(&w, KVP_SEC_IDENTITY, 0, 0, ident_len, KVP_CODEC_RAW, ident, ident_len);
    unsigned char *tb = mu_xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) put_u32(tb + 4 * i, (uint32_t)img->tokens[i]);
    write_section(&w, KVP_SEC_TOKENS, 0, 0, (uint64_t)n, KVP_CODEC_RAW, tb, 4 * (uint64_t)n);
    free(tb);
    for (int64_t i = 0; i < img->n_chunks && !w.failed; i++) {
        const kvp_chunk *ch = &img->chunks[i];
        write_section(&w, KVP_SEC_KV, ch->layer, (uint64_t)ch->first, (uint64_t)ch->rows, ch->codec, ch->data,
                      ch->bytes);
    }
    unsigned char *lb = mu_xmalloc((size_t)V * 4);
    for (int64_t i = 0; i < V; i++) {
        uint32_t b;
        memcpy(&b, &img->logits[i], 4);
        put_u32(lb + 4 * i, b);
    }
    write_section(&w, KVP_SEC_LOGITS, 0, 0, (uint64_t)V, KVP_CODEC_RAW, lb, 4 * (uint64_t)V);
    free(lb);
    if (img->dflash)
        write_section(&w, KVP_SEC_DFLASH, 0, 0, (uint64_t)img->dflash_rows, KVP_CODEC_RAW, img->dflash, img->dflash_len);
    if (img->has_sampler)
        write_section(&w, KVP_SEC_SAMPLER, 0, 0, img->sampler_len, KVP_CODEC_RAW, img->sampler, img->sampler_len);
    unsigned char seal[KVP_SEAL_BYTES];
    memcpy(seal, KVP_SEAL_MAGIC, 8);
    kvp_mac_update(w.mac, seal, 8);
    kvp_mac_final(w.mac, seal + 8);
    w.unsealed = true; /* the tag is not part of what it authenticates */
    w_put(&w, seal, sizeof seal);
    w_flush(&w);
    bool ok = true;
    if (w.failed) {
        mu_err_set(err, "kvpack save: %s", w.why);
        ok = false;
    } else if (w.written != total) {
        mu_err_set(err, "kvpack save: wrote %" PRIu64 " bytes, the layout says %" PRIu64, w.written, total);
        ok = false;
    }
    free(w.buf);
    kvp_mac_free(w.mac);
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
    case KVP_SEC_DFLASH: return "dflash";
    }
    return "unknown";
}

typedef struct sec {
    uint32_t type, layer;
    uint64_t first, count, bytes;
    unsigned char *payload;
} sec;

/* What the next section's header must say: everything exact except the
 * payload's length, which lies in [min_bytes, max_bytes] (equal for raw
 * sections of a known size), and count, which any_count leaves free. */
typedef struct sec_want {
    uint32_t type, layer;
    uint64_t first, count, min_bytes, max_bytes;
    uint32_t codec;
    bool any_count;
} sec_want;

static void sec_label(const sec *s, char *out, size_t cap) {
    if (s->type == KVP_SEC_KV)
        snprintf(out, cap, "kv layer %u rows %" PRIu64 "..%" PRIu64, s->layer, s->first, s->first + s->count - 1);
    else
        snprintf(out, cap, "%s", sec_name(s->type));
}

static bool read_section(reader *r, uint32_t index, const sec_want *want, sec *got, mu_error *err) {
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
        (!want->any_count && got->count != want->count) || got->bytes < want->min_bytes ||
        got->bytes > want->max_bytes || codec != want->codec || reserved != 0 || got->bytes > r->size - r->off) {
        mu_err_set(err, "%s: section %u at offset %" PRIu64 ": header damaged or out of order: expected %s layer %u "
                   "first %" PRIu64 " count %" PRIu64 " payload_bytes %" PRIu64 "..%" PRIu64 " codec %u, found %s "
                   "layer %u first %" PRIu64 " count %" PRIu64 " payload_bytes %" PRIu64 " codec %u reserved %u",
                   r->path, index, at, sec_name(want->type), want->layer, want->first, want->count, want->min_bytes,
                   want->max_bytes, want->codec, sec_name(got->type), got->layer, got->first, got->count, got->bytes,
                   codec, reserved);
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
        char label[96];
        sec_label(got, label, sizeof label);
        mu_err_set(err, "%s: section %u (%s) at offset %" PRIu64 ": SHA-256 mismatch (the section is damaged)",
                   r->path, index, label, at);
        free(got->payload);
        got->payload = NULL;
        return false;
    }
    kvp_mac_update(r->mac, h, sizeof h);
    kvp_mac_update(r->mac, got->payload, (size_t)got->bytes);
    return true;
}

/* A kv section's zstd frame, already digest-checked, into out: exactly
 * `raw` bytes (what the section's count gives), never more. The frame must
 * be one whole frame filling payload_bytes and declare that content size,
 * so a frame that would expand further (a decompression bomb) is refused
 * before anything is decompressed. */
static bool unzstd(reader *r, ZSTD_DCtx *dc, uint32_t index, const sec *s, uint64_t raw, unsigned char *out,
                   mu_error *err) {
    char label[96];
    sec_label(s, label, sizeof label);
    const uint64_t at = r->off - s->bytes - KVP_SECTION_BYTES;
    const size_t fsize = ZSTD_findFrameCompressedSize(s->payload, (size_t)s->bytes);
    if (ZSTD_isError(fsize)) {
        mu_err_set(err, "%s: section %u (%s) at offset %" PRIu64 ": payload is not a zstd frame: %s", r->path, index,
                   label, at, ZSTD_getErrorName(fsize));
        return false;
    }
    if (fsize != s->bytes) {
        mu_err_set(err, "%s: section %u (%s) at offset %" PRIu64 ": payload_bytes %" PRIu64 ", but its zstd frame "
                   "ends after %zu bytes", r->path, index, label, at, s->bytes, fsize);
        return false;
    }
    const unsigned long long csize = ZSTD_getFrameContentSize(s->payload, (size_t)s->bytes);
    if (csize == ZSTD_CONTENTSIZE_UNKNOWN || csize == ZSTD_CONTENTSIZE_ERROR) {
        mu_err_set(err, "%s: section %u (%s) at offset %" PRIu64 ": the zstd frame declares no content size; count "
                   "(%" PRIu64 " rows) says %" PRIu64 " bytes", r->path, index, label, at, s->count, raw);
        return false;
    }
    if (csize != raw) {
        mu_err_set(err, "%s: section %u (%s) at offset %" PRIu64 ": the zstd frame's content size is %llu bytes; "
                   "count (%" PRIu64 " rows) says %" PRIu64, r->path, index, label, at, csize, s->count, raw);
        return false;
    }
    const size_t got = ZSTD_decompressDCtx(dc, out, (size_t)raw, s->payload, (size_t)s->bytes);
    if (ZSTD_isError(got) || got != raw) {
        mu_err_set(err, "%s: section %u (%s) at offset %" PRIu64 ": zstd decompression %s (count says %" PRIu64
                   " bytes)", r->path, index, label, at, ZSTD_isError(got) ? ZSTD_getErrorName(got) : "came up short",
                   raw);
        return false;
    }
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
    r.mac = kvp_mac_new(key, KVP_SEAL_DOMAIN, sizeof KVP_SEAL_DOMAIN) /* with its NUL */;
    bool ok = false;
    sec s = {0};
    kvp_ident model_ident;
    ZSTD_DCtx *dctx = NULL;
    unsigned char *unbuf = NULL; /* one decompressed chunk */
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
    info->flags = get_u32(hdr + 16);
    if (info->flags & ~(uint32_t)(KVP_FLAG_ZSTD | KVP_FLAG_DFLASH)) {
        mu_err_set(err, "%s: header: flags 0x%x; this build knows bits 0 (zstd) and 1 (DFlash context) only", path,
                   info->flags);
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
    kvp_mac_update(r.mac, hdr, sizeof hdr);
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
    if (ibytes < KVP_IDENT_FIXED + 1 || ibytes > KVP_IDENT_FIXED + 4096 + KVP_IDENT_ASSISTANT) {
        mu_err_set(err, "%s: section 0 (identity): %" PRIu64 " bytes, out of range", path, ibytes);
        goto done;
    }
    if (!read_section(&r, index++, &(sec_want){KVP_SEC_IDENTITY, 0, 0, ibytes, ibytes, ibytes, 0, false}, &s, err))
        goto done;
    if (!kvp_parse_identity(s.payload, (size_t)s.bytes, &info->ident, err)) { mu_err_prefix(err, "%s", path); goto done; }
    if (want_ident) {
        if (!kvp_parse_identity(want_ident, want_len, &model_ident, err)) goto done;
        if (!same_identity(&info->ident, &model_ident, err)) { mu_err_prefix(err, "%s", path); goto done; }
    }
    if (sink && sink->identity && !sink->identity(sink->ctx, s.payload, (size_t)s.bytes, err)) goto done;
    free(s.payload);
    s.payload = NULL;
    const kvp_ident *id = &info->ident;
    const int64_t n = (int64_t)info->n_tokens;
    info->has_dflash = info->flags & KVP_FLAG_DFLASH;
    if (info->has_dflash != id->has_assistant) {
        mu_err_set(err, "%s: header: flags bit 1 (DFlash context) is %d but the identity %s an assistant", path,
                   (int)info->has_dflash, id->has_assistant ? "names" : "names no");
        goto done;
    }
    /* the sections this identity and length call for */
    uint64_t expect = 2 + 1 + (info->has_dflash ? 1 : 0);
    for (uint64_t l = 0; l < id->n_layer; l++) expect += (uint64_t)n_chunks(layer_first(id->swa[l], (int64_t)id->window, n), n);
    if (info->n_sections != expect && info->n_sections != expect + 1) {
        mu_err_set(err, "%s: header: n_sections %u; this identity and %" PRId64 " tokens need %" PRIu64 " (or %" PRIu64
                   " with sampler state)", path, info->n_sections, n, expect, expect + 1);
        goto done;
    }
    info->has_sampler = info->n_sections == expect + 1;
    if (!read_section(&r, index++, &(sec_want){KVP_SEC_TOKENS, 0, 0, (uint64_t)n, 4 * (uint64_t)n, 4 * (uint64_t)n, 0, false},
                      &s, err))
        goto done;
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
    const bool zstd = info->flags & KVP_FLAG_ZSTD;
    if (zstd && !(dctx = ZSTD_createDCtx())) { mu_err_set(err, "%s: cannot set up a zstd decompressor", path); goto done; }
    for (uint64_t l = 0; l < id->n_layer; l++) {
        for (int64_t c = layer_first(id->swa[l], (int64_t)id->window, n); c < n; c = (c / KVP_CHUNK + 1) * KVP_CHUNK) {
            if (cancel && *cancel) { mu_err_set(err, "%s: restore cancelled", path); goto done; }
            int64_t end = (c / KVP_CHUNK + 1) * KVP_CHUNK;
            if (end > n) end = n;
            const uint64_t raw = kv_bytes(H, D, end - c);
            /* a frame is never larger than zstd's bound for its content */
            sec_want want = {KVP_SEC_KV, (uint32_t)l, (uint64_t)c, (uint64_t)(end - c), zstd ? 1 : raw,
                             zstd ? ZSTD_compressBound((size_t)raw) : raw, zstd ? KVP_CODEC_ZSTD : KVP_CODEC_RAW, false};
            if (!read_section(&r, index++, &want, &s, err)) goto done;
            info->stored_kv_bytes += s.bytes;
            info->raw_kv_bytes += raw;
            const unsigned char *rows = s.payload;
            if (zstd) {
                if (!unbuf) unbuf = mu_xmalloc((size_t)kv_bytes(H, D, KVP_CHUNK));
                if (!unzstd(&r, dctx, index - 1, &s, raw, unbuf, err)) goto done;
                rows = unbuf;
            }
            const uint16_t *k = (const uint16_t *)rows, *v = k + H * (uint64_t)(end - c) * D;
            if (sink && sink->kv && !sink->kv(sink->ctx, (int)l, c, end - c, k, v, err)) goto done;
            free(s.payload);
            s.payload = NULL;
        }
    }
    if (!read_section(&r, index++,
                      &(sec_want){KVP_SEC_LOGITS, 0, 0, id->n_vocab, 4 * id->n_vocab, 4 * id->n_vocab, 0, false}, &s, err))
        goto done;
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
    if (info->has_dflash) {
        /* count = the assistant's committed rows; the payload's length follows from it, checked
         * after the digest; the allocation is bounded by the largest any count could need */
        const uint64_t held_max = (uint64_t)n < id->a_sink + id->a_window ? (uint64_t)n : id->a_sink + id->a_window;
        const uint64_t room = id->a_layer * 2 * id->a_head_kv * id->a_head_dim * held_max * 4 +
                              ((uint64_t)n < id->a_feat_rows ? (uint64_t)n : id->a_feat_rows) * id->a_feat_floats * 4;
        if (!read_section(&r, index++, &(sec_want){KVP_SEC_DFLASH, 0, 0, 0, 0, room, 0, true}, &s, err)) goto done;
        const uint64_t want = s.count <= (uint64_t)n ? kvp_dflash_bytes(id, n, (int64_t)s.count) : 0;
        if (!want || want != s.bytes) {
            mu_err_set(err, "%s: section %u (dflash): count %" PRIu64 " (assistant context rows) and payload_bytes %"
                       PRIu64 " do not fit %" PRId64 " tokens (at most %" PRIu64 " buffered rows; %" PRIu64
                       " bytes for this count)", path, index - 1, s.count, s.bytes, n, id->a_feat_rows, want);
            goto done;
        }
        if (sink && sink->dflash &&
            !sink->dflash(sink->ctx, (int64_t)s.count, n - (int64_t)s.count, s.payload, (size_t)s.bytes, err))
            goto done;
        free(s.payload);
        s.payload = NULL;
    }
    if (info->has_sampler) {
        uint64_t room = r.size - r.off;
        if (room < KVP_SECTION_BYTES + KVP_SEAL_BYTES) { mu_err_set(err, "%s: truncated before the sampler section", path); goto done; }
        if (!read_section(&r, index++, &(sec_want){KVP_SEC_SAMPLER, 0, 0, 0, 0, room, 0, true}, &s, err)) goto done;
        if (sink && sink->sampler && !sink->sampler(sink->ctx, s.payload, (size_t)s.bytes, err)) goto done;
        free(s.payload);
        s.payload = NULL;
    }
    unsigned char seal[KVP_SEAL_BYTES], mac[32];
    if (!r_get(&r, seal, sizeof seal, "the seal", err)) goto done;
    if (memcmp(seal, KVP_SEAL_MAGIC, 8)) { mu_err_set(err, "%s: seal: magic is not " KVP_SEAL_MAGIC, path); goto done; }
    kvp_mac_update(r.mac, seal, 8);
    kvp_mac_final(r.mac, mac);
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
    free(unbuf);
    ZSTD_freeDCtx(dctx);
    kvp_mac_free(r.mac);
    fclose(r.f);
    return ok;
}
