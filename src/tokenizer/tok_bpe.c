/* Byte-level BPE ("gpt2" vocabularies), as llama.cpp's llm_tokenizer_bpe.
 *
 * llama.cpp maps every byte of a pre-token through the GPT-2 byte-to-unicode
 * table and merges the resulting characters. The table is a bijection, so we
 * work on the raw bytes directly: every vocabulary text and merge part is
 * decoded once at load, and a "symbol" is a raw byte string with an id.
 * Symbols [0, n_vocab) are the tokens themselves; merge parts and results
 * that are not tokens get ids above. A merge is (left symbol, right symbol)
 * -> (rank, merged symbol); the lowest rank wins, ties go to the leftmost
 * pair, as in llama.cpp's priority queue. */
#include "tokenizer/tok_internal.h"
#include <stdlib.h>

static int32_t intern(mu_tokenizer *t, const char *raw, size_t n) {
    int32_t s = tok_map_get(&t->sym_map, raw, n);
    if (s >= 0) return s;
    uint32_t off = tok_arena_add(&t->sym_text, raw, n);
    s = (int32_t)t->n_sym++;
    if ((size_t)t->n_sym > t->sym_cap) {
        t->sym_cap = 2 * (size_t)t->n_sym;
        t->sym_tok = mu_xrealloc(t->sym_tok, t->sym_cap * sizeof *t->sym_tok);
    }
    t->sym_tok[s] = -1;
    tok_map_put(&t->sym_map, off, (uint32_t)n, s);
    return s;
}

bool tok_bpe_build(mu_tokenizer *t, const gguf_value *merges, mu_error *err) {
    if (merges->type != GGUF_VT_ARRAY || merges->v.arr.elem_type != GGUF_VT_STRING) {
        mu_err_set(err, "tokenizer.ggml.merges must be an array of strings");
        return false;
    }
    uint64_t n_merges = merges->v.arr.n;
    if (n_merges > INT32_MAX) {
        mu_err_set(err, "tokenizer.ggml.merges has %llu entries (limit %d)",
                   (unsigned long long)n_merges, INT32_MAX);
        return false;
    }
    tok_map_init(&t->sym_map, &t->sym_text, (size_t)t->n_vocab + 2 * n_merges);
    t->n_sym = t->n_vocab;
    t->sym_cap = (size_t)t->n_vocab;
    t->sym_tok = mu_xmalloc(t->sym_cap * sizeof *t->sym_tok);
    char *raw = mu_xmalloc(1024);
    size_t raw_cap = 1024;
    for (int64_t id = 0; id < t->n_vocab; id++) { /* sizes bounded by the token arena */
        size_t n = t->text_len[id];
        t->sym_tok[id] = (int32_t)id;
        if (n > raw_cap) raw = mu_xrealloc(raw, raw_cap = n);
        int64_t m = tok_bytelevel_decode(t->text.p + t->text_off[id], n, raw);
        if (m < 0) continue; /* not byte-level text: BPE can never produce it */
        uint32_t off = tok_arena_add(&t->sym_text, raw, (size_t)m);
        tok_map_put(&t->sym_map, off, (uint32_t)m, (int32_t)id); /* texts are unique */
    }
    tok_pairmap_init(&t->merges, n_merges);
    for (uint64_t i = 0; i < n_merges; i++) {
        const gguf_str *s = &merges->v.arr.strs[i];
        /* "left right", split at the first space after the first byte */
        const char *sp = s->len > 1 ? memchr(s->ptr + 1, ' ', s->len - 1) : NULL;
        if (!sp) continue; /* llama.cpp records ("", ""), which never applies */
        size_t nl = (size_t)(sp - s->ptr), nr = s->len - nl - 1;
        if (2 * (nl + nr) > raw_cap) raw = mu_xrealloc(raw, raw_cap = 2 * (nl + nr));
        int64_t ml = tok_bytelevel_decode(s->ptr, nl, raw);
        int64_t mr = ml < 0 ? -1 : tok_bytelevel_decode(sp + 1, nr, raw + ml);
        if (ml <= 0 || mr <= 0) continue; /* parts outside the byte alphabet never match */
        if (t->sym_text.len + 2 * (size_t)(ml + mr) + 3 > TOK_ARENA_LIMIT) {
            mu_err_set(err, "tokenizer.ggml.merges[%llu]: merge texts exceed %u bytes",
                       (unsigned long long)i, TOK_ARENA_LIMIT);
            free(raw);
            return false;
        }
        int32_t a = intern(t, raw, (size_t)ml);
        int32_t b = intern(t, raw + ml, (size_t)mr);
        int32_t ab = intern(t, raw, (size_t)(ml + mr));
        tok_pairmap_put(&t->merges, (uint32_t)a, (uint32_t)b, (int32_t)i, ab);
    }
    for (int c = 0; c < 256; c++) {
        char b = (char)c;
        t->byte_sym[c] = tok_map_get(&t->sym_map, &b, 1);
        t->byte_has_token[c] = t->byte_sym[c] >= 0 && t->sym_tok[t->byte_sym[c]] >= 0;
        t->single_byte_tok[c] = tok_map_get(&t->by_text, &b, 1);
    }
    free(raw);
    return true;
}

/* ---------------- per-call state: scratch arrays and the word cache ---------------- */

typedef struct bigram {
    int32_t rank, left, right;
    int32_t lsym, rsym, result;
} bigram;

struct tok_bpe_state {
    /* symbol chain of the current word */
    int32_t *sym, *prev, *next;
    uint32_t *start, *len;
    size_t cap;
    bigram *heap;
    size_t n_heap, heap_cap;
    tok_word_cache *words;
};

enum { CACHE_MAX_WORD = 64 };

tok_bpe_state *tok_bpe_state_new(void) {
    tok_bpe_state *c = mu_xcalloc(1, sizeof(tok_bpe_state));
    c->words = tok_word_cache_new();
    return c;
}

void tok_bpe_state_free(tok_bpe_state *c) {
    if (!c) return;
    free(c->sym);
    free(c->prev);
    free(c->next);
    free(c->start);
    free(c->len);
    free(c->heap);
    tok_word_cache_free(c->words);
    free(c);
}

static void reserve_word(tok_bpe_state *c, size_t n) {
    if (n <= c->cap) return;
    size_t cap = c->cap ? c->cap : 64;
    while (cap < n) cap *= 2;
    c->sym = mu_xrealloc(c->sym, cap * sizeof *c->sym);
    c->prev = mu_xrealloc(c->prev, cap * sizeof *c->prev);
    c->next = mu_xrealloc(c->next, cap * sizeof *c->next);
    c->start = mu_xrealloc(c->start, cap * sizeof *c->start);
    c->len = mu_xrealloc(c->len, cap * sizeof *c->len);
    c->cap = cap;
}

static inline bool bigram_before(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(tok_bpe_state *c, bigram b) {
    if (c->n_heap == c->heap_cap) {
        c->heap_cap = c->heap_cap ? 2 * c->heap_cap : 64;
        c->heap = mu_xrealloc(c->heap, c->heap_cap * sizeof *c->heap);
    }
    size_t i = c->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &c->heap[parent])) break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = b;
}

static bigram heap_pop(tok_bpe_state *c) {
    bigram top = c->heap[0], last = c->heap[--c->n_heap];
    size_t i = 0, n = c->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const bigram *bv = &last;
        if (l < n && bigram_before(&c->heap[l], bv)) best = l, bv = &c->heap[l];
        if (l + 1 < n && bigram_before(&c->heap[l + 1], bv)) best = l + 1;
        if (best == i) break;
        c->heap[i] = c->heap[best];
        i = best;
    }
    if (n) c->heap[i] = last;
    return top;
}

static void add_bigram(const mu_tokenizer *t, tok_bpe_state *c, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || c->sym[l] < 0 || c->sym[r] < 0) return;
    const tok_pair_slot *m = tok_pairmap_get(&t->merges, (uint32_t)c->sym[l], (uint32_t)c->sym[r]);
    if (!m) return;
    heap_push(c, (bigram){m->rank, l, r, c->sym[l], c->sym[r], m->result});
}

/* A final symbol that is not a token: llama.cpp looks up each byte of its
 * byte-level UTF-8 text as a one-byte token and drops the misses. */
static void emit_fallback(const mu_tokenizer *t, const uint8_t *w, size_t n, tok_ids *out) {
    for (size_t i = 0; i < n; i++) {
        char u[4];
        size_t k = tok_utf8_encode(tok_byte_to_cp(w[i]), u);
        for (size_t j = 0; j < k; j++) {
            int32_t id = t->single_byte_tok[(uint8_t)u[j]];
            if (id >= 0) tok_ids_push(out, id);
        }
    }
}

static void emit_symbol(const mu_tokenizer *t, int32_t sym, const uint8_t *w, size_t n,
                        tok_ids *out) {
    int32_t id = sym >= 0 ? t->sym_tok[sym] : -1;
    if (id >= 0) tok_ids_push(out, id);
    else emit_fallback(t, w, n, out);
}

static void bpe_word(const mu_tokenizer *t, tok_bpe_state *c, const uint8_t *w, size_t n,
                     tok_ids *out) {
    if (t->ignore_merges) {
        int32_t s = tok_map_get(&t->sym_map, w, n);
        if (s >= 0 && t->sym_tok[s] >= 0) {
            tok_ids_push(out, t->sym_tok[s]);
            return;
        }
    }
    if (n == 1) {
        emit_symbol(t, t->byte_sym[w[0]], w, 1, out);
        return;
    }
    reserve_word(c, n);
    for (size_t i = 0; i < n; i++) {
        c->sym[i] = t->byte_sym[w[i]];
        c->start[i] = (uint32_t)i;
        c->len[i] = 1;
        c->prev[i] = (int32_t)i - 1;
        c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    c->n_heap = 0;
    for (size_t i = 1; i < n; i++) add_bigram(t, c, (int32_t)i - 1, (int32_t)i);
    while (c->n_heap) {
        bigram b = heap_pop(c);
        int32_t l = b.left, r = b.right;
        /* stale if either side changed since the pair was queued */
        if (!c->len[l] || !c->len[r] || c->sym[l] != b.lsym || c->sym[r] != b.rsym) continue;
        c->len[l] += c->len[r];
        c->len[r] = 0;
        c->sym[l] = b.result;
        c->next[l] = c->next[r];
        if (c->next[r] >= 0) c->prev[c->next[r]] = l;
        add_bigram(t, c, c->prev[l], l);
        add_bigram(t, c, l, c->next[l]);
    }
    for (int32_t i = 0; i >= 0; i = c->next[i])
        emit_symbol(t, c->sym[i], w + c->start[i], c->len[i], out);
}

static void bpe_word_cached(const mu_tokenizer *t, tok_bpe_state *c, const char *w, size_t n,
                            tok_ids *out) {
    if (n < 2 || n > CACHE_MAX_WORD) {
        bpe_word(t, c, (const uint8_t *)w, n, out);
        return;
    }
    if (tok_word_cache_get(c->words, w, n, out)) return;
    size_t first = out->n;
    bpe_word(t, c, (const uint8_t *)w, n, out);
    tok_word_cache_put(c->words, w, n, out->v + first, out->n - first);
}

/* ---------------- fragments ---------------- */

typedef struct piece_ctx {
    const mu_tokenizer *t;
    tok_bpe_state *bs;
    const char *text;
    tok_ids *out;
} piece_ctx;

static bool on_piece(void *ctx, size_t start, size_t len) {
    piece_ctx *p = ctx;
    bpe_word_cached(p->t, p->bs, p->text + start, len, p->out);
    return true;
}

bool tok_bpe_fragment(const mu_tokenizer *t, tok_pre_state *ps, tok_bpe_state *bs,
                      const char *text, const char *clean, size_t n, tok_ids *out,
                      mu_error *err) {
    piece_ctx p = {t, bs, text, out};
    return tok_pre_split(t->pre, ps, clean, n, on_piece, &p, err);
}
