/* Whole-vocabulary mask timing under json.gbnf on a deterministic synthetic
 * vocabulary shaped like a large byte-level BPE vocabulary:
 *   - ids 0..255: every single byte (0x00 is a never-allowed piece);
 *   - with a seed vocabulary (e.g. the GPT-2 test vocabulary's pieces): its
 *     pieces, then their variants " p", "P", " P", "UPPER", p+"s" / "ed" /
 *     "ing" / "er" / "ly" / "\"" / "," / "." / "\":" / "ion" in that order
 *     until full -- prefix sharing like a real merged vocabulary;
 *   - JSON punctuation and whitespace pieces ("\":", "\", \"", "{\"", ...);
 *   - numbers "0".."999" with and without a leading space;
 *   - CJK / accented / emoji pieces of 1-2 characters, plus byte-level
 *     fragments that stop inside a code point (first 1 or 2 bytes of a
 *     3-byte character, lone continuation bytes);
 *   - English-like words of 1-4 syllables (xorshift, fixed seed) in the
 *     variants word, " word", "Word", " Word", "WORD", "word,", "word.",
 *     "word\"", "word\":", until the vocabulary is full;
 *   - the last 2 tokens: "<|eot|>", "<|end_of_text|>" (EOG), preceded by 8
 *     special-looking texts ("<|header_start|>", ...).
 * All pieces are distinct. */
#include "grammar/gbnf_internal.h"
#include <stdio.h>
#include <stdlib.h>

static const char JSON_GBNF[] =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

/* ---------------- synthetic vocabulary ---------------- */

typedef struct vocab_builder {
    char **piece;
    size_t *len;
    int32_t n, cap;
    uint32_t *slot;     /* dedup: index + 1 */
    uint32_t slot_mask;
} vocab_builder;

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static void add_piece(vocab_builder *b, const char *s, size_t n) {
    if (b->n >= b->cap || !n) return;
    uint32_t h = (uint32_t)fnv(s, n) & b->slot_mask;
    for (; b->slot[h]; h = (h + 1) & b->slot_mask) {
        uint32_t k = b->slot[h] - 1;
        if (b->len[k] == n && !memcmp(b->piece[k], s, n)) return;
    }
    b->piece[b->n] = mu_xmalloc(n);
    memcpy(b->piece[b->n], s, n);
    b->len[b->n] = n;
    b->slot[h] = (uint32_t)++b->n;
}

static void add_str(vocab_builder *b, const char *s) {
    add_piece(b, s, strlen(s));
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static void add_fixed_pieces(vocab_builder *b) {
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        b->piece[b->n] = mu_xmalloc(1);
        b->piece[b->n][0] = ch;
        b->len[b->n] = 1;
        uint32_t h = (uint32_t)fnv(&ch, 1) & b->slot_mask;
        while (b->slot[h]) h = (h + 1) & b->slot_mask;
        b->slot[h] = (uint32_t)++b->n;
    }
    static const char *const punct[] = {
        "\":", "\": ", "\": \"", "\",", "\", \"", "\",\"", "{\"", "\"}", "},", "}, {", "[{", "}]",
        "\":\"", "\n", "  ", "\n  ", "\n    ", "\n      ", "\t", "true", "false", "null", "\\\"",
        "\\n", "\\u", "\\\\", "\":{", "\":[", "],", "]}", "}}", "{}", "[]", ", ", ". ", "...",
        "--", "==", "->", "://", "www", ".com", "\"\"", "\"\n", "\n}", "\n]", ":\"", " \"", "\"."};
    for (size_t i = 0; i < sizeof punct / sizeof punct[0]; i++) add_str(b, punct[i]);
    char buf[16];
    for (int i = 0; i < 1000; i++) {
        snprintf(buf, sizeof buf, "%d", i);
        add_str(b, buf);
        snprintf(buf, sizeof buf, " %d", i);
        add_str(b, buf);
    }
    for (uint32_t cp = 0x4E00; cp < 0x4E00 + 6000; cp++) { /* CJK, one and two characters */
        size_t n = put_utf8(buf, cp);
        add_piece(b, buf, n);
        if (cp % 3 == 0) add_piece(b, buf, n + put_utf8(buf + n, cp + 7));
    }
    for (uint32_t cp = 0xC0; cp < 0x250; cp++) {
        size_t n = put_utf8(buf, cp);
        add_piece(b, buf, n);
    }
    for (uint32_t cp = 0x1F600; cp < 0x1F650; cp++) add_piece(b, buf, put_utf8(buf, cp));
    for (uint32_t cp = 0x3040; cp < 0x30FF; cp++) { /* kana: whole and split in two */
        size_t n = put_utf8(buf, cp);
        add_piece(b, buf, n);
        add_piece(b, buf, 2);
        add_piece(b, buf + 2, 1);
    }
}

static size_t make_word(uint64_t *rng, char *o) {
    static const char *const onset[] = {"", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m",
                                        "n", "p", "r", "s", "t", "v", "w", "st", "tr", "pr",
                                        "ch", "sh", "th", "gr", "bl", "cl", "fr", "sp", "qu"};
    static const char *const vowel[] = {"a", "e", "i", "o", "u", "ea", "ou", "io", "ai", "y"};
    static const char *const coda[] = {"", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "m",
                                       "ck", "x", "rt", "ll"};
    size_t n = 0;
    int syl = 1 + (int)(rng_next(rng) % 4);
    for (int i = 0; i < syl; i++) {
        const char *parts[3] = {onset[rng_next(rng) % 30], vowel[rng_next(rng) % 10],
                                coda[rng_next(rng) % 15]};
        for (int k = 0; k < 3; k++) {
            size_t l = strlen(parts[k]);
            memcpy(o + n, parts[k], l);
            n += l;
        }
    }
    return n;
}

static void add_words(vocab_builder *b, int32_t until) {
    uint64_t rng = 0x6A09E667F3BCC909ull;
    char w[64], v[80];
    while (b->n < until) {
        size_t n = make_word(&rng, w);
        int variant = (int)(rng_next(&rng) % 9);
        size_t m = 0;
        if (variant == 1 || variant == 3) v[m++] = ' ';
        memcpy(v + m, w, n);
        if (variant == 2 || variant == 3) v[m] = (char)(v[m] - 32);
        if (variant == 4)
            for (size_t i = 0; i < n; i++) v[m + i] = (char)(v[m + i] - 32);
        m += n;
        if (variant == 5) v[m++] = ',';
        if (variant == 6) v[m++] = '.';
        if (variant == 7) v[m++] = '"';
        if (variant == 8) { v[m++] = '"'; v[m++] = ':'; }
        int32_t before = b->n;
        add_piece(b, v, m);
        if (b->n == before) add_piece(b, w, n);
    }
}

/* Variant k of a seed piece (BPE-like growth of a real vocabulary):
 * 0 " "+p, 1 Capitalized, 2 " "+Capitalized, 3 UPPER, then p + a suffix. */
static size_t seed_variant(const char *p, size_t n, int k, char *o, size_t cap) {
    static const char *const suffix[] = {"s", "ed", "ing", "er", "ly", "\"", ",", ".", "\":", "ion"};
    bool alpha = n && ((p[0] >= 'a' && p[0] <= 'z') || (p[0] >= 'A' && p[0] <= 'Z'));
    if (n + 4 > cap || (k < 4 && !alpha)) return 0;
    size_t m = 0;
    if (k == 0 || k == 2) o[m++] = ' ';
    memcpy(o + m, p, n);
    if ((k == 1 || k == 2) && o[m] >= 'a' && o[m] <= 'z') o[m] = (char)(o[m] - 32);
    if (k == 3)
        for (size_t i = 0; i < n; i++)
            if (o[i] >= 'a' && o[i] <= 'z') o[i] = (char)(o[i] - 32);
    m += n;
    if (k >= 4) {
        const char *sfx = suffix[k - 4];
        size_t sl = strlen(sfx);
        memcpy(o + m, sfx, sl);
        m += sl;
    }
    return m;
}

static void add_seeded(vocab_builder *b, const mu_grammar_vocab *seed, int32_t until) {
    char buf[600];
    for (int32_t i = 0; i < seed->n_vocab && b->n < until; i++) {
        size_t n;
        const char *p = gbnf_piece(seed, i, &n);
        if (!(seed->flag[i] & GV_EOG)) add_piece(b, p, n);
    }
    for (int k = 0; k < 14 && b->n < until; k++) {
        for (int32_t i = 0; i < seed->n_vocab && b->n < until; i++) {
            size_t n;
            const char *p = gbnf_piece(seed, i, &n);
            if (seed->flag[i] & GV_EOG) continue;
            size_t m = seed_variant(p, n, k, buf, sizeof buf);
            if (m) add_piece(b, buf, m);
        }
    }
}

mu_grammar_vocab *mu_grammar_bench_vocab(int32_t n_vocab, const mu_grammar_vocab *seed,
                                         mu_error *err) {
    static const char *const special[] = {"<|header_start|>", "<|header_end|>", "<|begin_of_text|>",
                                          "<|python_start|>", "<|python_end|>", "<|image|>",
                                          "<|patch|>", "<|reserved_0|>"};
    static const char *const eog[] = {"<|eot|>", "<|end_of_text|>"};
    if (n_vocab < 20000) {
        mu_err_set(err, "grammar bench: vocabulary of %d tokens is too small (>= 20000)", n_vocab);
        return NULL;
    }
    vocab_builder b = {0};
    b.cap = n_vocab;
    b.piece = mu_xcalloc((size_t)n_vocab, sizeof *b.piece);
    b.len = mu_xcalloc((size_t)n_vocab, sizeof *b.len);
    uint32_t slots = 1;
    while (slots < (uint32_t)n_vocab * 2u) slots <<= 1;
    b.slot = mu_xcalloc(slots, sizeof *b.slot);
    b.slot_mask = slots - 1;
    add_fixed_pieces(&b);
    if (seed) add_seeded(&b, seed, n_vocab - 10);
    add_words(&b, n_vocab - 10);
    for (int i = 0; i < 8; i++) add_str(&b, special[i]);
    for (int i = 0; i < 2; i++) add_str(&b, eog[i]);
    mu_grammar_vocab *v = NULL;
    if (b.n != n_vocab) {
        mu_err_set(err, "grammar bench: built %d of %d tokens", b.n, n_vocab);
    } else {
        bool *is_eog = mu_xcalloc((size_t)n_vocab, 1);
        is_eog[n_vocab - 1] = is_eog[n_vocab - 2] = true;
        v = mu_grammar_vocab_new(n_vocab, (const char *const *)b.piece, b.len, is_eog, err);
        free(is_eog);
    }
    for (int32_t i = 0; i < b.n; i++) free(b.piece[i]);
    free(b.piece);
    free(b.len);
    free(b.slot);
    return v;
}

/* ---------------- timing ---------------- */

static int dbl_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool time_state(const mu_grammar_state *s, const mu_grammar_vocab *v, int reps, double *med,
                       double *mn, int32_t *n_allowed, mu_error *err) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    uint32_t *bits = mu_xmalloc(words * sizeof *bits);
    double *t = mu_xmalloc((size_t)reps * sizeof *t);
    bool ok = mu_grammar_mask_bits(s, v, bits, err); /* warm-up */
    for (int r = 0; r < reps && ok; r++) {
        double t0 = mu_now();
        ok = mu_grammar_mask_bits(s, v, bits, err);
        t[r] = (mu_now() - t0) * 1e3;
    }
    if (ok) {
        qsort(t, (size_t)reps, sizeof *t, dbl_cmp);
        *med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        *mn = t[0];
        int32_t c = 0;
        for (size_t w = 0; w < words; w++) c += __builtin_popcount(bits[w]);
        *n_allowed = c;
    }
    free(t);
    free(bits);
    return ok;
}

double mu_grammar_bench_mask(const mu_grammar_vocab *v, int reps, mu_grammar_bench_result *res,
                             mu_error *err) {
    static const char *const names[3] = {"start", "in-string", "after-key"};
    static const char *const prefix[3] = {"", "{\"name\": \"Ada Lovelace, the ",
                                          "{\"name\": \"Ada\", \"age\""};
    if (reps < 1) reps = 1;
    mu_grammar_vocab *own = NULL;
    if (!v && !(v = own = mu_grammar_bench_vocab(202048, NULL, err))) return -1;
    mu_grammar *g = mu_grammar_parse(JSON_GBNF, sizeof JSON_GBNF - 1, NULL, err);
    double worst = -1;
    memset(res, 0, sizeof *res);
    res->n_vocab = v->n_vocab;
    res->trie_nodes = v->n_nodes;
    for (int k = 0; k < 3 && g; k++) {
        res->state_name[k] = names[k];
        mu_grammar_state *s = mu_grammar_state_new(g, err);
        bool ok = s && mu_grammar_accept_bytes(s, prefix[k], strlen(prefix[k]), err) &&
                  time_state(s, v, reps, &res->ms_median[k], &res->ms_min[k], &res->n_allowed[k], err);
        mu_grammar_state_free(s);
        if (!ok) {
            worst = -1;
            break;
        }
        if (res->ms_median[k] > worst) worst = res->ms_median[k];
    }
    mu_grammar_free(g);
    mu_grammar_vocab_free(own);
    return worst;
}
