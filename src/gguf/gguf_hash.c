/* Identity hashes of a GGUF file (OpenSSL EVP SHA-256).
 *
 * Tokenizer surface, version "muser-c.gguf-tokenizer.v1": SHA-256 of
 *   the ASCII tag "muser-c.gguf-tokenizer.v1" and one 0x00 byte, then
 *   for each key/value whose key starts with "tokenizer." but not with
 *   "tokenizer.chat_template", in file order, its GGUF v3 record:
 *     u64 LE key length, key bytes, u32 LE value type id, value, where
 *     value = scalar: little-endian at its native width (bool: one byte 0/1,
 *             floats: their IEEE bits, so -0.0 != 0.0 and NaN payloads count);
 *             string: u64 LE byte length, bytes;
 *             array: u32 LE element type, u64 LE count, each element encoded
 *             as above without a type id (nested arrays recursively).
 * The reader accepts exactly one encoding per value (bools must be 0/1), so
 * this equals the record's bytes in the file and is hashed straight from the
 * mapping. It depends on key order, names, types and values, and on nothing
 * else (tensors, alignment, other keys, template). */
#include "gguf/gguf_internal.h"
#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define TOKENIZER_HASH_TAG "muser-c.gguf-tokenizer.v1"
#define FILE_HASH_CHUNK ((size_t)16 << 20)

static void to_hex(const unsigned char *d, char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[64] = '\0';
}

/* One-shot over a list of byte ranges; false only if OpenSSL fails. */
typedef struct range { const void *p; size_t n; } range;

static bool sha256_ranges(const range *r, size_t count, char hex[65]) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    for (size_t i = 0; ok && i < count; i++) ok = EVP_DigestUpdate(ctx, r[i].p, r[i].n);
    ok = ok && EVP_DigestFinal_ex(ctx, d, &dlen) && dlen == 32;
    EVP_MD_CTX_free(ctx);
    if (ok) to_hex(d, hex);
    else memset(hex, 0, 65);
    return ok;
}

static bool is_tokenizer_identity_key(const char *key) {
    static const char prefix[] = "tokenizer.", excluded[] = "tokenizer.chat_template";
    return !strncmp(key, prefix, sizeof prefix - 1) && strncmp(key, excluded, sizeof excluded - 1);
}

void gguf_sha256_tokenizer(const gguf_file *f, char hex[65]) {
    const gguf_reader_priv *pv = f ? f->priv : NULL;
    if (!pv) {
        memset(hex, 0, 65);
        return;
    }
    uint64_t n = 1;
    for (uint64_t i = 0; i < f->n_kv; i++) n += is_tokenizer_identity_key(f->kv[i].key);
    range *r = mu_xmalloc(n * sizeof *r);
    size_t k = 0;
    r[k++] = (range){TOKENIZER_HASH_TAG, sizeof TOKENIZER_HASH_TAG}; /* tag + NUL */
    for (uint64_t i = 0; i < f->n_kv; i++) {
        if (!is_tokenizer_identity_key(f->kv[i].key)) continue;
        uint64_t begin = f->kv[i].offset, end = pv->kv_end[i];
        r[k++] = (range){f->base + begin, (size_t)(end - begin)};
    }
    sha256_ranges(r, k, hex);
    free(r);
}

bool gguf_sha256_chat_template(const gguf_file *f, char hex[65]) {
    const gguf_value *v = gguf_get(f, "tokenizer.chat_template");
    if (!v || v->type != GGUF_VT_STRING) {
        memset(hex, 0, 65);
        return false;
    }
    range r = {v->v.str.ptr, (size_t)v->v.str.len};
    return sha256_ranges(&r, 1, hex);
}

bool gguf_sha256_file(const char *path, char hex[65],
                      void (*progress)(uint64_t done, uint64_t total, void *ctx), void *ctx,
                      mu_error *err) {
    memset(hex, 0, 65);
    uint64_t total;
    int fd = gguf_open_regular(path, &total, err);
    if (fd < 0) return false;
    uint8_t *buf = NULL;
    EVP_MD_CTX *md = NULL;
    bool ok = false;
    buf = malloc(FILE_HASH_CHUNK);
    md = EVP_MD_CTX_new();
    if (!buf || !md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
        mu_err_set(err, "%s: cannot set up SHA-256 (out of memory?)", path);
        goto out;
    }
    uint64_t done = 0;
    for (;;) {
        ssize_t r = read(fd, buf, FILE_HASH_CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            mu_err_set(err, "%s: read failed at offset %" PRIu64 ": %s", path, done, strerror(errno));
            goto out;
        }
        if (r == 0) break;
        if (!EVP_DigestUpdate(md, buf, (size_t)r)) {
            mu_err_set(err, "%s: SHA-256 update failed", path);
            goto out;
        }
        done += (uint64_t)r;
        if (progress) progress(done, total > done ? total : done, ctx);
    }
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    if (!EVP_DigestFinal_ex(md, d, &dlen) || dlen != 32) {
        mu_err_set(err, "%s: SHA-256 finalization failed", path);
        goto out;
    }
    to_hex(d, hex);
    ok = true;
out:
    EVP_MD_CTX_free(md);
    free(buf);
    close(fd);
    return ok;
}
