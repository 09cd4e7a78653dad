/* kvpack internals: the pack codec (kvpack.c) and the store (store.c).
 * The byte layout is docs/kvpack.md; the public calls are in include/muser.h. */
#ifndef MUSER_KVPACK_H
#define MUSER_KVPACK_H
#include "model/api_internal.h"

#define KVP_MAGIC "MUSERKVP"
#define KVP_SEAL_MAGIC "MUKVSEAL"
#define KVP_VERSION 1u
#define KVP_HEADER_BYTES 128u
#define KVP_HEADER_HASHED 96u       /* the header SHA-256 covers bytes [0, 96) */
#define KVP_SECTION_BYTES 72u
#define KVP_SECTION_HASHED 40u      /* a section's SHA-256 covers its bytes [0, 40) and its payload */
#define KVP_SEAL_BYTES 40u
#define KVP_CHUNK 256               /* KV rows per chunk, at positions that are multiples of 256 */
#define KVP_KEY_BYTES 32
#define KVP_KV_F16 1u               /* KV element type: IEEE half, RNE-rounded at the store (docs/numerics.md) */
/* Bumped whenever a change to docs/numerics.md changes the bits a forward
 * produces: KV rows written under another ABI would not continue exactly. */
#define KVP_NUMERICS_ABI 1u
#define KVP_IDENT_FIXED 200u        /* identity bytes before the per-layer flags */
#define KVP_IDENT_ASSISTANT 88u     /* the assistant extension after the per-layer flags (flags bit 1) */
#define KVP_SEAL_DOMAIN "muser-kvpack-seal-v1"

enum { KVP_SEC_IDENTITY = 1, KVP_SEC_TOKENS = 2, KVP_SEC_KV = 3, KVP_SEC_LOGITS = 4, KVP_SEC_SAMPLER = 5,
       KVP_SEC_DFLASH = 6 };
enum { KVP_CODEC_RAW = 0, KVP_CODEC_ZSTD = 1 };
#define KVP_FLAG_ZSTD 1u            /* header flags bit 0: every kv section's payload is one zstd frame */
#define KVP_FLAG_DFLASH 2u          /* bit 1: the identity names a DFlash assistant; its context section follows */
#define KVP_ZSTD_MAX_LEVEL 19

typedef struct kvp_ident {
    unsigned char model_sha[32], tokenizer_sha[32], template_sha[32], types_sha[32];
    char lane[17];
    uint32_t kv_type, numerics_abi;
    uint64_t n_layer, n_head_kv, head_dim, n_vocab, window, n_embd;
    unsigned char swa[4096];
    /* the DFlash assistant extension (docs/kvpack.md) */
    bool has_assistant;
    unsigned char assistant_sha[32];
    uint64_t a_layer, a_head_kv, a_head_dim, a_sink, a_window, a_feat_floats, a_feat_rows;
} kvp_ident;

/* The identity block of m (built once per load and kept in m; the file's
 * SHA-256 through the store's cache when cache_dir is not NULL). */
bool kvp_model_identity(muser_model *m, const char *cache_dir, const unsigned char **block, size_t *len,
                        mu_error *err);
bool kvp_parse_identity(const unsigned char *p, size_t n, kvp_ident *out, mu_error *err);
/* The identity a pack of session s has: the model's block, and when a
 * muser_spec is bound to s the assistant extension (its file's SHA-256
 * through the store's cache at cache_dir, its geometry). malloc'd. */
bool kvp_session_identity(muser_session *s, const char *cache_dir, unsigned char **out, size_t *len, mu_error *err);
/* Bytes of a DFlash section payload for n tokens and `rows` committed
 * assistant rows under identity id (0 when rows is out of range). */
uint64_t kvp_dflash_bytes(const kvp_ident *id, int64_t n, int64_t rows);

/* HMAC-SHA256 (OpenSSL), keyed, its message starting with domain. */
typedef struct evp_mac_ctx_st kvp_mac_ctx;
kvp_mac_ctx *kvp_mac_new(const unsigned char key[KVP_KEY_BYTES], const void *domain, size_t domain_len);
void kvp_mac_update(kvp_mac_ctx *c, const void *p, size_t n);
void kvp_mac_final(kvp_mac_ctx *c, unsigned char out[32]);
void kvp_mac_free(kvp_mac_ctx *c);

/* The HMAC key: exactly 32 bytes in a regular file of mode 0600 owned by
 * this user. create: make one (O_EXCL, 0600) when the file is missing. */
bool kvp_load_key(const char *path, bool create, unsigned char key[KVP_KEY_BYTES], mu_error *err);
/* Key path: explicit, else $MUSER_KVPACK_KEY, else DIR/kvpack.key. */
void kvp_key_path(const char *explicit_path, const char *dir, char *out, size_t cap);

/* One KV chunk of a pack being written: raw rows (K then V, f16), or
 * after kvp_compress one zstd frame of them. */
typedef struct kvp_chunk {
    uint32_t layer, codec;
    int64_t first, rows;
    unsigned char *data;
    uint64_t bytes;
} kvp_chunk;

/* A session's whole pack content in host memory: what a save copies out
 * under the engine's lock so that compressing and writing need no lock. */
typedef struct kvp_image {
    int64_t n, n_ctx, n_vocab;
    int32_t *tokens;
    float *logits;
    unsigned char *sampler;
    size_t sampler_len;
    bool has_sampler;
    kvp_chunk *chunks;
    int64_t n_chunks;
    bool compressed;
    unsigned char *dflash;      /* the DFlash context section's payload (docs/kvpack.md), or NULL */
    uint64_t dflash_len;
    int64_t dflash_rows;        /* the assistant's committed context rows (the section's count) */
} kvp_image;

/* Copy the session's pack content out (the session locked by the caller). */
bool kvp_capture(muser_session *s, const muser_sampler *smp, kvp_image *img, mu_error *err);
/* Replace every KV chunk by one zstd frame at level 1..KVP_ZSTD_MAX_LEVEL. */
bool kvp_compress(kvp_image *img, int level, mu_error *err);
/* Write the image as a pack to fd. */
bool kvp_write_image(int fd, const kvp_image *img, const unsigned char *ident, size_t ident_len,
                     const unsigned char key[KVP_KEY_BYTES], uint64_t *bytes, mu_error *err);
void kvp_image_free(kvp_image *img);

typedef struct kvp_sink {
    void *ctx;
    bool (*identity)(void *ctx, const unsigned char *p, size_t n, mu_error *err);
    bool (*tokens)(void *ctx, const int32_t *t, int64_t n, mu_error *err);
    bool (*kv)(void *ctx, int layer, int64_t first, int64_t count, const uint16_t *k, const uint16_t *v,
               mu_error *err);
    bool (*logits)(void *ctx, const float *row, int64_t n, mu_error *err);
    bool (*sampler)(void *ctx, const void *p, size_t n, mu_error *err);
    /* the assistant's context: rows committed, n - rows buffered, the payload */
    bool (*dflash)(void *ctx, int64_t rows, int64_t n_feats, const unsigned char *p, size_t n, mu_error *err);
} kvp_sink;

typedef struct kvp_info {
    uint64_t file_bytes, n_tokens;
    uint32_t n_sections, flags;
    uint64_t stored_kv_bytes, raw_kv_bytes; /* kv payloads as stored and decompressed */
    bool has_sampler, has_dflash;
    kvp_ident ident;
} kvp_info;

/* Read and check every byte of a pack: framing, header SHA-256, each
 * section's SHA-256 and its place in the order, the identity against
 * want (NULL: not compared; a want without the assistant extension
 * compares the model's fields only, as `muser kvpack verify -m` does;
 * restores pass the session's whole identity), the seal. The sink (may be NULL) sees each
 * section as soon as it checks out; the caller commits nothing before
 * this returns true. cancel (may be NULL) is polled between sections. */
bool kvp_read(const char *path, const unsigned char key[KVP_KEY_BYTES], const unsigned char *want, size_t want_len,
              const kvp_sink *sink, const volatile int *cancel, kvp_info *info, mu_error *err);

/* Test hook (tests/test_kvpack.c): a writer in a child process kills
 * itself with SIGKILL once it has written `at` bytes of the temporary
 * file; at == size: after the last write, size + 1: after the fsync,
 * size + 2: after the publishing link. < 0 (the default) never. */
void mu_kvpack_test_kill_at(int64_t at);
bool kvp_test_kill_due(uint64_t stage);

void kvp_hex(const unsigned char *d, size_t n, char *out);

#endif
