/* GBNF grammars (llama.cpp's grammar format) and an incremental recognizer
 * that constrains generated tokens.
 *
 * Syntax: llama.cpp's GBNF, parsed as llama.cpp's grammar parser does
 * (differences: docs/sampling.md):
 * rules `name ::= alternatives` (names [a-zA-Z0-9-]+), `|`, `( )`, `* + ?`,
 * `{m} {m,} {m,n}` (counts <= 2000), string literals and `[...]` / `[^...]`
 * classes with the escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH,
 * `.` (any code point), `#` comments, token terminals `<[id]>` and
 * `<token-text>` and their negations `!<[id]>` / `!<token-text>`. A rule
 * ends at a newline unless inside parentheses or right after `|` / `::=`.
 *
 * Matching: a set of pushdown stacks (llama.cpp's model) kept alive in full,
 * so every ambiguous parse survives; stacks are hash-consed, so equal stacks
 * are one stack. Bytes are decoded as strict UTF-8; a token may end inside a
 * code point, and the grammar advances only when the code point completes.
 * Token terminals match a whole token by id, only at a token boundary.
 *
 * Refused grammars (mu_grammar_parse returns NULL, err says line:column and
 * what is wrong): syntax errors, undefined rules, a rule defined twice, a
 * missing root rule, empty input, bad escapes, code points > U+10FFFF,
 * reversed ranges, empty classes `[]`, repetition counts > 2000 or min > max,
 * repetitions expanding past llama.cpp's 2000-rule limit, groups nested
 * deeper than 256, left recursion (llama.cpp's check, plus hidden left
 * recursion through nullable rules that would grow stacks forever).
 *
 * Limits at match time (an error, never a crash or a hang): at most
 * MU_GRAMMAR_MAX_STACKS live stacks and MU_GRAMMAR_MAX_EXPANSIONS rule
 * expansions per code point.
 *
 * Thread safety: a mu_grammar and a mu_grammar_vocab are immutable after
 * construction. Functions taking a const mu_grammar_state* do not modify it
 * and may run concurrently on one state. */
#ifndef MUSER_GRAMMAR_H
#define MUSER_GRAMMAR_H
#include "util/common.h"
#include <stdio.h>

#define MU_GRAMMAR_MAX_STACKS 16384
#define MU_GRAMMAR_MAX_EXPANSIONS (1u << 20)

typedef struct mu_grammar mu_grammar;
typedef struct mu_grammar_state mu_grammar_state;
typedef struct mu_grammar_vocab mu_grammar_vocab;

/* Resolves a `<token-text>` terminal: text includes the angle brackets
 * (e.g. "<think>"). Returns the token id, or -1 when the text is not exactly
 * one token (llama.cpp tokenizes with special-token parsing and requires one
 * token). */
typedef int32_t (*mu_grammar_token_lookup)(void *ctx, const char *text, size_t len);

/* Parse len bytes of GBNF. root: start rule name (NULL = "root"). Grammars
 * using `<token-text>` need mu_grammar_parse_ex. */
mu_grammar *mu_grammar_parse(const char *text, size_t len, const char *root, mu_error *err);
/* lookup (may be NULL) resolves `<token-text>`; n_vocab > 0 also refuses
 * token ids >= n_vocab. */
mu_grammar *mu_grammar_parse_ex(const char *text, size_t len, const char *root,
                                mu_grammar_token_lookup lookup, void *lookup_ctx, int32_t n_vocab,
                                mu_error *err);
/* Same, resolving `<token-text>` by exact piece equality in vocab (the text
 * must be the piece of exactly one token) and checking ids against it. */
mu_grammar *mu_grammar_parse_with_vocab(const char *text, size_t len, const char *root,
                                        const mu_grammar_vocab *vocab, mu_error *err);
void mu_grammar_free(mu_grammar *g);

/* Number of rules after expansion (named + generated) and of elements. */
size_t mu_grammar_n_rules(const mu_grammar *g);
/* Print the expanded rules in GBNF-like form (debugging). */
void mu_grammar_print(const mu_grammar *g, FILE *f);

/* Token pieces: piece[i] / piece_len[i] are the bytes token i stands for
 * (llama_token_to_piece with special tokens rendered). is_eog may be NULL.
 * EOG tokens are allowed exactly when the grammar is complete; a token with
 * an empty piece or one starting with a NUL byte is never allowed (as in
 * llama.cpp). Copies everything; builds a byte trie for masking. */
mu_grammar_vocab *mu_grammar_vocab_new(int32_t n_vocab, const char *const *piece,
                                       const size_t *piece_len, const bool *is_eog,
                                       mu_error *err);
void mu_grammar_vocab_free(mu_grammar_vocab *v);
int32_t mu_grammar_vocab_size(const mu_grammar_vocab *v);
/* The one token whose piece is exactly text; -1 if none, -2 if several. */
int32_t mu_grammar_vocab_find(const mu_grammar_vocab *v, const char *text, size_t len);

/* Matching state at the start of the root rule. */
mu_grammar_state *mu_grammar_state_new(const mu_grammar *g, mu_error *err);
mu_grammar_state *mu_grammar_state_clone(const mu_grammar_state *s);
void mu_grammar_state_free(mu_grammar_state *s);

/* Consume bytes (any split: a code point may straddle calls). On refusal the
 * state is unchanged and err names the byte offset and code point. */
bool mu_grammar_accept_bytes(mu_grammar_state *s, const char *bytes, size_t len, mu_error *err);
/* Consume one token (its piece, or a token terminal by id; an EOG token is
 * accepted, without change, only when complete). Unchanged on refusal. */
bool mu_grammar_accept_token(mu_grammar_state *s, const mu_grammar_vocab *v, int32_t id,
                             mu_error *err);
/* Would accept_token succeed? (Independent of the trie: the reference the
 * masks are tested against.) False on out-of-range ids and on limits. */
bool mu_grammar_allows(const mu_grammar_state *s, const mu_grammar_vocab *v, int32_t id);
/* The root rule is complete and no code point is half-read: EOG is legal. */
bool mu_grammar_is_complete(const mu_grammar_state *s);
/* Live stacks (diagnostics; 0 means nothing can follow). */
size_t mu_grammar_state_n_stacks(const mu_grammar_state *s);

/* allowed[k] = whether ids[k] may come next. False (and every entry false)
 * only if a matching limit was hit, with err set. */
bool mu_grammar_mask(const mu_grammar_state *s, const mu_grammar_vocab *v, const int32_t *ids,
                     size_t n, bool *allowed, mu_error *err);
/* Whole vocabulary: bits[i / 32] bit (i % 32) = token i allowed; bits has
 * (n_vocab + 31) / 32 words. Walks the byte trie so shared prefixes are
 * matched once. */
bool mu_grammar_mask_bits(const mu_grammar_state *s, const mu_grammar_vocab *v, uint32_t *bits,
                          mu_error *err);
/* Whole vocabulary as n_vocab bools. */
bool mu_grammar_mask_all(const mu_grammar_state *s, const mu_grammar_vocab *v, bool *allowed,
                         mu_error *err);

/* ---- benchmark (gbnf_bench.c) ---- */

typedef struct mu_grammar_bench_result {
    int32_t n_vocab;
    size_t trie_nodes;
    const char *state_name[3];  /* "start", "in-string", "after-key" */
    double ms_median[3];        /* whole-vocab mask, median over reps */
    double ms_min[3];
    int32_t n_allowed[3];
} mu_grammar_bench_result;

/* Deterministic synthetic vocabulary of n_vocab (>= 20000) tokens, see
 * gbnf_bench.c: all 256 single bytes, JSON punctuation, numbers, CJK /
 * accented / emoji pieces and pieces split inside a code point, then (if
 * seed is given) the seed's pieces and their case / space / suffix
 * variants, then random English-like words until full; the last two tokens
 * are EOG. All pieces distinct. Without a seed prefix sharing is low (about
 * 6.7 trie nodes per token, a pessimistic vocabulary); real BPE vocabularies
 * share more (GPT-2's: 2 nodes per token). */
mu_grammar_vocab *mu_grammar_bench_vocab(int32_t n_vocab, const mu_grammar_vocab *seed,
                                         mu_error *err);
/* Times mu_grammar_mask_bits under json.gbnf (built in) at three states:
 * start, inside a string value, after an object key. Uses v if given, else
 * the 202,048-token synthetic vocabulary. reps >= 1. Returns the largest
 * median in ms, or -1 with err set. */
double mu_grammar_bench_mask(const mu_grammar_vocab *v, int reps, mu_grammar_bench_result *res,
                             mu_error *err);

#endif
