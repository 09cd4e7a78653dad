/* Tokenizers built from GGUF metadata, token-for-token compatible with
 * llama.cpp's llama-vocab for the supported vocabularies:
 *
 *   tokenizer.ggml.model = "gpt2"   byte-level BPE (merge ranks, GPT-2
 *       byte-to-unicode table) behind the regex pre-tokenizer named by
 *       tokenizer.ggml.pre (PCRE2). Missing pre = llama.cpp's "default".
 *   tokenizer.ggml.model = "llama"  SentencePiece-style BPE by scores with
 *       <0xNN> byte fallback, ' ' -> U+2581 and the add-space-prefix rule.
 *
 * Special tokens: control / user-defined / unknown texts are matched before
 * the normal tokenizer, longest first (user-defined always, control and
 * unknown only with parse_special), exactly as llama.cpp partitions them.
 *
 * Deliberate differences from llama.cpp (only for invalid input or ties):
 *   - gpt2: a byte that is not part of valid UTF-8 keeps its own byte token
 *     when the vocabulary has one (llama.cpp substitutes U+FFFD), so
 *     detokenize(tokenize(x)) == x for every byte string x with full byte
 *     vocabularies such as Llama-4's; the pre-tokenizer treats the byte like
 *     U+FFFD. Bytes without a token become U+FFFD as in llama.cpp.
 *     llama.cpp's lenient decoding of overlong / surrogate sequences is not
 *     reproduced: those bytes count as invalid.
 *   - when several EOT / EOM / FIM candidate texts exist, the first of
 *     llama.cpp's list wins (llama.cpp: hash-map order); equal-length special
 *     tokens are tried in id order (llama.cpp: unspecified sort order).
 *   - "<|eot|>" (Llama-4 / Muse Glimmer) is recognised as an end-of-generation
 *     text in addition to llama.cpp's list.
 *   - out-of-range special-token ids in the metadata are refused (llama.cpp
 *     warns and keeps its default).
 *
 * End of generation: eos, eot and eom (the keys merged into one set, as
 * Muse Glimmer's two end tokens EOS and EOT need), plus the tokens llama.cpp
 * recognises by text.
 *
 * A loaded tokenizer is immutable: every function below may be called from
 * several threads at once (a mu_detok belongs to one thread). */
#ifndef MUSER_TOKENIZER_H
#define MUSER_TOKENIZER_H
#include "gguf/gguf.h"

typedef struct mu_tokenizer mu_tokenizer;

/* Token attributes (llama.cpp's llama_token_attr bit values). */
enum {
    MU_TOKEN_ATTR_UNDEFINED = 0,
    MU_TOKEN_ATTR_UNKNOWN = 1 << 0,
    MU_TOKEN_ATTR_UNUSED = 1 << 1,
    MU_TOKEN_ATTR_NORMAL = 1 << 2,
    MU_TOKEN_ATTR_CONTROL = 1 << 3,
    MU_TOKEN_ATTR_USER_DEFINED = 1 << 4,
    MU_TOKEN_ATTR_BYTE = 1 << 5,
    MU_TOKEN_ATTR_LSTRIP = 1 << 7, /* whitespace before the token is dropped */
    MU_TOKEN_ATTR_RSTRIP = 1 << 8, /* whitespace after the token is dropped */
};

/* NULL + message if the tokenizer keys are absent or invalid, the model or
 * pre-tokenizer is unknown (the message names the value). The result does
 * not reference f: the file may be closed afterwards. */
mu_tokenizer *mu_tokenizer_load(const gguf_file *f, mu_error *err);
void mu_tokenizer_free(mu_tokenizer *t);

int64_t mu_tokenizer_n_vocab(const mu_tokenizer *t);
const char *mu_tokenizer_model(const mu_tokenizer *t); /* "gpt2" | "llama" */
const char *mu_tokenizer_pre(const mu_tokenizer *t);   /* pre-tokenizer name in use */

/* Tokenize len bytes of text (any bytes; NUL allowed). Returns the token
 * count (>= 0) with *out malloc'd (free() it; non-NULL even when 0), or -1
 * with err set. add_special: prepend BOS / append EOS as the model asks.
 * parse_special: also match control and unknown token texts. */
int64_t mu_tokenize(const mu_tokenizer *t, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t **out, mu_error *err);

/* Exact vocabulary lookup of a token text; -1 if none. */
int32_t mu_tokenizer_find(const mu_tokenizer *t, const char *text, size_t len);

/* Raw vocabulary string (NUL-terminated; *len may be NULL); NULL if id is
 * out of range. */
const char *mu_token_text(const mu_tokenizer *t, int32_t id);
const char *mu_token_text_n(const mu_tokenizer *t, int32_t id, size_t *len);
uint32_t mu_token_attr(const mu_tokenizer *t, int32_t id); /* 0 if out of range */
bool mu_token_is_control(const mu_tokenizer *t, int32_t id);
bool mu_token_is_eog(const mu_tokenizer *t, int32_t id);
/* The end-of-generation set, ascending ids. */
size_t mu_tokenizer_eog_ids(const mu_tokenizer *t, const int32_t **ids);

/* Special ids, -1 if none. */
int32_t mu_token_bos(const mu_tokenizer *t);
int32_t mu_token_eos(const mu_tokenizer *t);
int32_t mu_token_eot(const mu_tokenizer *t);
int32_t mu_token_eom(const mu_tokenizer *t);
int32_t mu_token_unk(const mu_tokenizer *t);
int32_t mu_token_pad(const mu_tokenizer *t);
int32_t mu_token_mask(const mu_tokenizer *t);
bool mu_tokenizer_add_bos(const mu_tokenizer *t);
bool mu_tokenizer_add_eos(const mu_tokenizer *t);

/* Bytes one token stands for (llama_token_to_piece with lstrip 0): control
 * and unknown tokens render their text only if render_special. Copies
 * min(length, cap) bytes to buf and returns the full length (no NUL). */
size_t mu_token_to_piece(const mu_tokenizer *t, int32_t id, bool render_special, char *buf,
                         size_t cap);

/* Whole-sequence detokenization as llama_detokenize: remove_special drops a
 * leading BOS / trailing EOS the model adds; unparse_special renders control
 * tokens; SPM drops the leading space of the first piece; the
 * clean-up-spaces pass runs where the model asks (gpt-2, falcon, ...).
 * Returns malloc'd bytes (NUL-terminated; *len, if len is not NULL, excludes
 * the NUL), NULL + err for an id out of range. */
char *mu_detokenize(const mu_tokenizer *t, const int32_t *ids, size_t n, bool remove_special,
                    bool unparse_special, size_t *len, mu_error *err);

/* Streaming detokenizer: push ids one at a time; each call returns only
 * complete UTF-8 sequences. A valid but incomplete sequence at the end (at
 * most 3 bytes) is held back until a later piece completes it. Bytes that can
 * never form valid UTF-8 are emitted as U+FFFD, one per byte, unless
 * MU_DETOK_RAW_INVALID passes them through unchanged. flush() ends the
 * stream: held-back bytes are emitted the same way (as U+FFFD, or raw).
 * Concatenated output == mu_detokenize(ids, remove_special=false,
 * unparse_special=render flag) minus the clean-up-spaces pass, whenever the
 * bytes are valid UTF-8 (always, with MU_DETOK_RAW_INVALID). */
enum {
    MU_DETOK_SPECIAL = 1,     /* render control / unknown token texts */
    MU_DETOK_SEQ_START = 2,   /* first push starts a sequence: SPM leading-space rule */
    MU_DETOK_RAW_INVALID = 4, /* pass invalid bytes through instead of U+FFFD */
};
typedef struct mu_detok {
    const mu_tokenizer *tok;
    unsigned flags;
    bool strip_next;      /* drop one leading space of the next piece */
    uint8_t pend[4];      /* held-back incomplete UTF-8 sequence */
    size_t n_pend;
    char *buf;            /* output of the last call */
    size_t cap;
} mu_detok;

/* init starts a fresh stream (free() a used one first). */
void mu_detok_init(mu_detok *d, const mu_tokenizer *t, unsigned flags);
/* Returns the text now complete, NUL-terminated and valid until the next
 * call on d; *len (len may be NULL) its length. NULL (and *len 0) if id is
 * out of range; the stream is unchanged. */
const char *mu_detok_push(mu_detok *d, int32_t id, size_t *len);
const char *mu_detok_flush(mu_detok *d, size_t *len);
void mu_detok_free(mu_detok *d);

/* Tokenize n_bytes of deterministic English-like prose (plus a warm-up) on
 * the calling thread and return the throughput in MB/s (1e6 bytes), or a
 * negative value with err set. */
double mu_tokenizer_bench(const mu_tokenizer *t, size_t n_bytes, mu_error *err);

#endif
