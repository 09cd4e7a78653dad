/* muser: an inference engine for Muse Glimmer GGUF models.
 *
 * Embedding API. A model is loaded once (read-only mmap, validated
 * fail-closed) and shared by any number of sessions; a session owns a KV
 * cache and a position. Every fallible call takes a muser_error* (may be
 * NULL) and reports one precise message on failure.
 *
 *   muser_error err;
 *   muser_model *m = muser_model_load("model.gguf", NULL, &err);
 *   muser_session *s = muser_session_create(m, NULL, &err);
 *   int32_t toks[] = {1, 2, 3};
 *   muser_session_feed(s, toks, 3, &err);           // prefill
 *   const float *logits = muser_session_logits(s);  // last row, n_vocab floats
 *   ...
 *   muser_session_free(s); muser_model_free(m);
 */
#ifndef MUSER_H
#define MUSER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUSER_VERSION "0.1.0"

typedef struct muser_model muser_model;
typedef struct muser_session muser_session;
typedef struct muser_snapshot muser_snapshot;

typedef struct muser_error {
    char msg[1024];
} muser_error;

typedef enum muser_backend_kind {
    MUSER_BACKEND_DEFAULT = 0, /* best available */
    MUSER_BACKEND_REF = 1,     /* scalar reference: the numerical specification */
    MUSER_BACKEND_CPU = 2,     /* SIMD CPU backend, bit-identical to ref */
    MUSER_BACKEND_CUDA = 3,
} muser_backend_kind;

typedef struct muser_model_params {
    muser_backend_kind backend;
    int n_threads;              /* 0 = all cores */
} muser_model_params;

typedef struct muser_model_info {
    const char *architecture;   /* "muse-glimmer" */
    const char *name;
    const char *lane;           /* "q4_k_xl" or "nvfp4" */
    const char *backend;        /* resolved backend name */
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int64_t sliding_window, n_swa_layers;
    uint64_t file_bytes;
    uint64_t weight_bytes_per_token; /* weights streamed per decoded token */
} muser_model_info;

muser_model *muser_model_load(const char *path, const muser_model_params *params, muser_error *err);
void muser_model_free(muser_model *m);
void muser_model_get_info(const muser_model *m, muser_model_info *info);
/* Resolve a backend name ("ref", "cpu", "cuda", "auto"); false if unknown. */
bool muser_backend_from_name(const char *name, muser_backend_kind *out);

typedef struct muser_session_params {
    int64_t n_ctx;              /* 0 = the model's training context */
    int64_t prefill_chunk;      /* rows per forward call during prefill; 0 = 512 */
} muser_session_params;

muser_session *muser_session_create(muser_model *m, const muser_session_params *params, muser_error *err);
void muser_session_free(muser_session *s);
/* Forget everything (position 0). */
void muser_session_reset(muser_session *s);
int64_t muser_session_pos(const muser_session *s);
int64_t muser_session_n_ctx(const muser_session *s);

/* Feed tokens at the current position. On success the logits of the last
 * token are available from muser_session_logits (n_vocab floats, valid until
 * the next feed). Prefill of N tokens gives bit-identical logits to feeding
 * them one at a time. Fails (state unchanged) on an invalid token id or a
 * full context; a non-finite logit is an error that poisons the session
 * until muser_session_reset. */
bool muser_session_feed(muser_session *s, const int32_t *tokens, int64_t n, muser_error *err);
/* As feed, but writes every row's logits to out[n][n_vocab] (speculative verify). */
bool muser_session_feed_all(muser_session *s, const int32_t *tokens, int64_t n, float *out, muser_error *err);
const float *muser_session_logits(const muser_session *s);

/* Rollback window: checkpoint now, feed up to 16 tokens, roll back to any
 * position in between (exact: ring rows restored), or commit. */
bool muser_session_checkpoint(muser_session *s, muser_error *err);
bool muser_session_rollback(muser_session *s, int64_t pos, muser_error *err);
void muser_session_commit(muser_session *s);

/* Full snapshots of KV and position (restore onto a session of the same model and n_ctx). */
muser_snapshot *muser_session_snapshot(const muser_session *s);
bool muser_session_restore(muser_session *s, const muser_snapshot *snap, muser_error *err);
void muser_snapshot_free(muser_snapshot *snap);

/* ---------------- text layer ----------------
 * Available when the GGUF carries tokenizer metadata (tokenizer.ggml.*).
 * Strings returned by muser_* allocation functions are freed with free(). */
bool muser_model_has_tokenizer(const muser_model *m);
/* Token ids for text (count >= 0, *out malloc'd) or -1 with err.
 * add_special: BOS/EOS as the model asks; parse_special: match control-token texts. */
int64_t muser_tokenize(const muser_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t **out, muser_error *err);
/* Whole-sequence text (NUL-terminated, *len excludes it) or NULL with err. */
char *muser_detokenize(const muser_model *m, const int32_t *ids, size_t n, bool render_special, size_t *len,
                       muser_error *err);
/* Raw vocabulary text of one token (NULL if out of range). */
const char *muser_token_text(const muser_model *m, int32_t id);
bool muser_token_is_eog(const muser_model *m, int32_t id);
int32_t muser_token_bos(const muser_model *m);

/* Streaming detokenizer: each push returns only complete UTF-8 (valid until
 * the next call); flush ends the stream. */
typedef struct muser_detok muser_detok;
muser_detok *muser_detok_new(const muser_model *m, bool render_special);
const char *muser_detok_push(muser_detok *d, int32_t id, size_t *len);
const char *muser_detok_flush(muser_detok *d, size_t *len);
void muser_detok_free(muser_detok *d);

/* Render the model's tokenizer.chat_template (Jinja, as Hugging Face does)
 * for an OpenAI-style JSON array of messages. Returns malloc'd text or NULL
 * with err (template syntax errors name line and column). */
typedef struct muser_chat_params {
    const char *messages_json;   /* required: JSON array */
    const char *tools_json;      /* optional JSON array */
    bool add_generation_prompt;
    const char *date;            /* "YYYY-MM-DD" for strftime_now; NULL = today */
} muser_chat_params;
char *muser_chat_render(const muser_model *m, const muser_chat_params *p, muser_error *err);
/* SHA-256 (hex) of tokenizer.chat_template, "" if none: part of the identity. */
const char *muser_chat_template_sha256(const muser_model *m);

#ifdef __cplusplus
}
#endif
#endif
