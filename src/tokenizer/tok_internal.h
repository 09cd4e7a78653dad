/* Tokenizer internals shared by the tok_*.c files. */
#ifndef MUSER_TOK_INTERNAL_H
#define MUSER_TOK_INTERNAL_H
#include "tokenizer/tokenizer.h"

/* ---------------- byte arena and hash maps (tok_map.c) ---------------- */

/* Byte store (util/common.h's buffer); strings are referenced by offset so
 * growth is safe. */
typedef mu_buf tok_arena;

/* Appends n bytes. */
static inline void tok_arena_append(tok_arena *a, const void *s, size_t n) { mu_buf_append(a, s, n); }
/* Appends n bytes plus a NUL; returns the offset of the copy. The caller
 * keeps the arena below 4 GiB (checked at load). */
uint32_t tok_arena_add(tok_arena *a, const void *s, size_t n);
#define TOK_ARENA_LIMIT (1u << 30)
#define TOK_MAX_TOKEN_LEN 16384
#define TOK_MAX_TEXT (1u << 29) /* bytes per tokenize call: 3x growth fits int32 */

uint64_t tok_hash(const void *p, size_t n);

/* String (bytes in an arena) -> int32 value, open addressing. */
typedef struct tok_slot {
    uint64_t hash;
    uint32_t off, len;
    int32_t val;
} tok_slot;
typedef struct tok_map {
    tok_slot *slots;
    size_t mask, count;
    const tok_arena *arena;
} tok_map;

void tok_map_init(tok_map *m, const tok_arena *a, size_t expected);
void tok_map_free(tok_map *m);
int32_t tok_map_get(const tok_map *m, const void *key, size_t len); /* -1 if absent */
/* Insert key (already in the arena at off). Returns the existing value if
 * the key was present (and leaves it), else -1 after inserting val. */
int32_t tok_map_put(tok_map *m, uint32_t off, uint32_t len, int32_t val);

/* (uint32, uint32) -> (rank, result), open addressing. */
typedef struct tok_pair_slot {
    uint64_t key;
    int32_t rank, result;
} tok_pair_slot;
typedef struct tok_pairmap {
    tok_pair_slot *slots;
    size_t mask, count;
} tok_pairmap;

void tok_pairmap_init(tok_pairmap *m, size_t expected);
void tok_pairmap_free(tok_pairmap *m);
const tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, uint32_t a, uint32_t b);
/* false if the pair was already present (first insertion wins). */
bool tok_pairmap_put(tok_pairmap *m, uint32_t a, uint32_t b, int32_t rank, int32_t result);

/* Growable id vector. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
static inline void tok_ids_push(tok_ids *o, int32_t id) {
    if (o->n == o->cap) {
        o->cap = o->cap ? 2 * o->cap : 64;
        o->v = mu_xrealloc(o->v, o->cap * sizeof *o->v);
    }
    o->v[o->n++] = id;
}

/* Per-call word cache (tok_cache.c): word bytes -> ids. Keys are not
 * copied; the words must outlive the cache. */
typedef struct tok_word_cache tok_word_cache;
tok_word_cache *tok_word_cache_new(void);
void tok_word_cache_free(tok_word_cache *c);
bool tok_word_cache_get(const tok_word_cache *c, const char *w, size_t n, tok_ids *out);
void tok_word_cache_put(tok_word_cache *c, const char *w, size_t n, const int32_t *ids,
                        size_t k);

/* ---------------- UTF-8 helpers (tok_utf8.c) ---------------- */

/* Length of a valid UTF-8 sequence at s (n bytes available), 0 if invalid
 * or truncated (strict: no overlongs, surrogates or > U+10FFFF). */
size_t tok_utf8_valid_len(const uint8_t *s, size_t n);
/* 1 if s[0..n) could still become valid UTF-8 with more bytes appended. */
bool tok_utf8_is_valid_prefix(const uint8_t *s, size_t n);
/* llama.cpp's lead-byte length table (no validation). */
static inline size_t tok_utf8_lead_len(uint8_t c) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}
size_t tok_utf8_encode(uint32_t cp, char out[4]);
/* GPT-2 byte <-> code point table. */
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the table */
/* Decode a byte-level (GPT-2) string to raw bytes in out (capacity >= n).
 * Returns the raw length, or -1 if some code point is outside the table or
 * the UTF-8 is invalid. */
int64_t tok_bytelevel_decode(const char *s, size_t n, char *out);

/* ---------------- pre-tokenizer (tok_pretok.c) ---------------- */

typedef struct tok_pre tok_pre;
typedef struct tok_pre_flags {
    bool clean_spaces, ignore_merges, add_bos_default, no_bos;
} tok_pre_flags;

/* Compile the regex list for a pre-tokenizer name (NULL = missing = default).
 * NULL + err naming the value if unknown. */
tok_pre *tok_pre_new(const char *name, tok_pre_flags *flags, mu_error *err);
void tok_pre_free(tok_pre *p);
const char *tok_pre_name(const tok_pre *p);

/* Split text[0..n) (valid UTF-8) into pieces and call emit for each piece in
 * order (offsets relative to text). Returns false with err on a regex
 * engine error. */
typedef bool (*tok_piece_fn)(void *ctx, size_t start, size_t len);
typedef struct tok_pre_state tok_pre_state; /* per-call PCRE2 match data */
tok_pre_state *tok_pre_state_new(const tok_pre *p);
void tok_pre_state_free(tok_pre_state *s);
bool tok_pre_split(const tok_pre *p, tok_pre_state *s, const char *text, size_t n,
                   tok_piece_fn emit, void *ctx, mu_error *err);

/* ---------------- the tokenizer ---------------- */

enum tok_kind { TOK_BPE, TOK_SPM };

/* Special-token trie node (first-child / next-sibling). */
typedef struct tok_trie_node {
    int32_t child, sibling;
    int32_t token; /* token ending here, -1 if none */
    uint8_t byte;
} tok_trie_node;

struct mu_tokenizer {
    enum tok_kind kind;
    char model[16];
    tok_pre *pre;                 /* BPE only */
    bool clean_spaces, ignore_merges, add_space_prefix, add_bos, add_eos;

    int64_t n_vocab;
    tok_arena text;               /* vocab texts, NUL-terminated */
    uint32_t *text_off, *text_len;
    tok_arena pieces;             /* token_to_piece(special=true), NUL-terminated */
    uint32_t *piece_off, *piece_len;
    float *scores;
    uint16_t *attr;
    tok_map by_text;              /* vocab text -> id */

    /* BPE: symbols are raw byte strings; ids [0, n_vocab) are the tokens
     * (by their byte-level-decoded text), above that merge parts/results
     * that are not tokens. */
    tok_arena sym_text;
    tok_map sym_map;              /* raw bytes -> symbol */
    int32_t *sym_tok;             /* symbol -> token or -1 */
    int64_t n_sym;
    size_t sym_cap;
    int32_t byte_sym[256];        /* one raw byte -> symbol or -1 */
    int32_t single_byte_tok[256]; /* token whose vocab text is that one byte */
    bool byte_has_token[256];     /* BPE can emit this raw byte as a token */
    tok_pairmap merges;           /* (left, right) -> (rank, merged symbol) */

    /* SPM: byte-fallback tokens (<0xNN>, else the byte itself; -1 none) */
    int32_t spm_byte_tok[256];
    /* SPM: no token has U+2581 right after another character, so the text
     * may be cut before every such U+2581 without changing the result */
    bool spm_split_at_space;

    int32_t bos, eos, eot, eom, unk, sep, pad, mask;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    int32_t *eog;
    size_t n_eog;

    /* Special tokens (control / user-defined / unknown): priority = index in
     * prio order (longer first, then lower id); trie over their texts. */
    int32_t *special_prio;        /* token -> priority, -1 if not special */
    tok_trie_node *trie;
    size_t n_trie;
    bool trie_first[256];
    size_t n_special;
};

/* tok_bpe.c / tok_spm.c */
bool tok_bpe_build(mu_tokenizer *t, const gguf_value *merges, mu_error *err);
typedef struct tok_bpe_state tok_bpe_state;
tok_bpe_state *tok_bpe_state_new(void);
void tok_bpe_state_free(tok_bpe_state *c);
/* Tokenize one raw fragment: text = the bytes to encode, clean = the same
 * n bytes made valid UTF-8 for the regexes. The word cache in bs keeps
 * pointers into text: it must stay valid while bs lives. */
bool tok_bpe_fragment(const mu_tokenizer *t, tok_pre_state *ps, tok_bpe_state *bs,
                      const char *text, const char *clean, size_t n, tok_ids *out,
                      mu_error *err);
/* Byte-fallback table and the segmentation check, at load. */
void tok_spm_build(mu_tokenizer *t);
/* false if the text has U+2581 right after another symbol */
bool tok_spm_space_splittable(const char *text, size_t n);
bool tok_spm_fragment(const mu_tokenizer *t, const char *text, size_t n, bool space_prefix,
                      tok_ids *out, mu_error *err);

/* tok_special.c */
void tok_special_build(mu_tokenizer *t);
typedef struct tok_fragment {
    size_t start, len;
    int32_t token; /* -1: raw text [start, start+len) */
} tok_fragment;
/* Partition text into raw and special-token fragments (malloc'd array). */
tok_fragment *tok_special_partition(const mu_tokenizer *t, const char *text, size_t n,
                                    bool parse_special, size_t *n_frag);

/* tok_decode.c */
bool tok_pieces_build(mu_tokenizer *t, mu_error *err);

#endif
