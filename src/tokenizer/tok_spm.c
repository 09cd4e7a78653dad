/* SentencePiece-style BPE ("llama" vocabularies), as llama.cpp's
 * llm_tokenizer_spm: spaces become U+2581, the text is cut into UTF-8
 * characters by lead byte, and adjacent symbols whose concatenation is a
 * vocabulary entry merge, highest score first (ties: leftmost). Symbols that
 * are not tokens at the end fall back to <0xNN> byte tokens. */
#include "tokenizer/tok_internal.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_bigram;

typedef struct spm_state {
    const mu_tokenizer *t;
    const char *s;        /* escaped text */
    uint32_t *start, *len;
    int32_t *prev, *next;
    spm_bigram *heap;
    size_t n_heap, heap_cap;
} spm_state;

static inline bool before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void push(spm_state *st, spm_bigram b) {
    if (st->n_heap == st->heap_cap) {
        st->heap_cap = st->heap_cap ? 2 * st->heap_cap : 256;
        st->heap = mu_xrealloc(st->heap, st->heap_cap * sizeof *st->heap);
    }
    size_t i = st->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!before(&b, &st->heap[parent])) break;
        st->heap[i] = st->heap[parent];
        i = parent;
    }
    st->heap[i] = b;
}

static spm_bigram pop(spm_state *st) {
    spm_bigram top = st->heap[0], last = st->heap[--st->n_heap];
    size_t i = 0, n = st->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, best = i;
        const spm_bigram *bv = &last;
        if (l < n && before(&st->heap[l], bv)) best = l, bv = &st->heap[l];
        if (l + 1 < n && before(&st->heap[l + 1], bv)) best = l + 1;
        if (best == i) break;
        st->heap[i] = st->heap[best];
        i = best;
    }
    if (n) st->heap[i] = last;
    return top;
}

/* Adjacent symbols are contiguous in the text, so the pair is one slice. */
static void try_bigram(spm_state *st, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = st->len[l] + st->len[r];
    int32_t id = tok_map_get(&st->t->by_text, st->s + st->start[l], size);
    if (id < 0) return;
    push(st, (spm_bigram){st->t->scores[id], l, r, size});
}

static bool emit_symbol(spm_state *st, int32_t i, tok_ids *out, mu_error *err) {
    const char *p = st->s + st->start[i];
    int32_t id = tok_map_get(&st->t->by_text, p, st->len[i]);
    if (id >= 0) {
        tok_ids_push(out, id);
        return true;
    }
    for (uint32_t k = 0; k < st->len[i]; k++) {
        uint8_t b = (uint8_t)p[k];
        id = st->t->spm_byte_tok[b];
        if (id < 0) {
            mu_err_set(err, "SPM vocabulary has no token for byte 0x%02X (neither <0x%02X> nor "
                       "the byte itself)", b, b);
            return false;
        }
        tok_ids_push(out, id);
    }
    return true;
}

static char *escape_spaces(const char *text, size_t n, bool space_prefix, size_t *out_n) {
    size_t spaces = space_prefix;
    for (size_t i = 0; i < n; i++) spaces += text[i] == ' ';
    char *s = mu_xmalloc(n + 2 * spaces + 1), *o = s;
    if (space_prefix) {
        memcpy(o, "\xe2\x96\x81", 3);
        o += 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (text[i] == ' ') {
            memcpy(o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            *o++ = text[i];
        }
    }
    *out_n = (size_t)(o - s);
    return s;
}

/* The merge loop over one segment s[0..m) (symbol arrays sized >= m). */
static bool spm_segment(spm_state *st, const char *s, size_t m, tok_ids *out, mu_error *err) {
    st->s = s;
    st->n_heap = 0;
    int32_t n_sym = 0;
    for (size_t off = 0; off < m;) {
        size_t len = tok_utf8_lead_len((uint8_t)s[off]);
        if (len > m - off) len = m - off;
        st->start[n_sym] = (uint32_t)off;
        st->len[n_sym] = (uint32_t)len;
        st->prev[n_sym] = n_sym - 1;
        off += len;
        st->next[n_sym] = off == m ? -1 : n_sym + 1;
        n_sym++;
    }
    for (int32_t i = 1; i < n_sym; i++) try_bigram(st, i - 1, i);
    while (st->n_heap) {
        spm_bigram b = pop(st);
        int32_t l = b.left, r = b.right;
        if (!st->len[l] || !st->len[r] || st->len[l] + st->len[r] != b.size) continue; /* stale */
        st->len[l] += st->len[r];
        st->len[r] = 0;
        st->next[l] = st->next[r];
        if (st->next[r] >= 0) st->prev[st->next[r]] = l;
        try_bigram(st, st->prev[l], l);
        try_bigram(st, l, st->next[l]);
    }
    for (int32_t i = n_sym ? 0 : -1; i >= 0; i = st->next[i])
        if (!emit_symbol(st, i, out, err)) return false;
    return true;
}

static bool is_space_mark(const char *s, size_t n) {
    return n == 3 && !memcmp(s, "\xe2\x96\x81", 3);
}

void tok_spm_build(mu_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char hex[8], raw = (char)b;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = tok_map_get(&t->by_text, hex, 6);
        t->spm_byte_tok[b] = id >= 0 ? id : tok_map_get(&t->by_text, &raw, 1);
    }
    t->spm_split_at_space = true;
    for (int64_t i = 0; i < t->n_vocab && t->spm_split_at_space; i++)
        t->spm_split_at_space =
            tok_spm_space_splittable(t->text.p + t->text_off[i], t->text_len[i]);
}

bool tok_spm_space_splittable(const char *text, size_t n) {
    bool prev_mark = true; /* nothing before the first symbol */
    for (size_t off = 0; off < n;) {
        size_t len = tok_utf8_lead_len((uint8_t)text[off]);
        if (len > n - off) len = n - off;
        bool mark = is_space_mark(text + off, len);
        if (mark && !prev_mark) return false;
        prev_mark = mark;
        off += len;
    }
    return true;
}

/* With t->spm_split_at_space the escaped text is cut before every U+2581
 * symbol that follows another symbol: no vocabulary entry spans such a cut,
 * so merges never cross it and each piece can be merged (and cached) alone. */
bool tok_spm_fragment(const mu_tokenizer *t, const char *text, size_t n, bool space_prefix,
                      tok_ids *out, mu_error *err) {
    size_t m;
    char *s = escape_spaces(text, n, space_prefix, &m);
    if (m > UINT32_MAX) {
        free(s);
        mu_err_set(err, "SPM fragment of %zu bytes is too long", m);
        return false;
    }
    spm_state st = {.t = t};
    st.start = mu_xmalloc((m + 1) * sizeof *st.start);
    st.len = mu_xmalloc((m + 1) * sizeof *st.len);
    st.prev = mu_xmalloc((m + 1) * sizeof *st.prev);
    st.next = mu_xmalloc((m + 1) * sizeof *st.next);
    tok_word_cache *cache = tok_word_cache_new();
    bool ok = true, prev_mark = true;
    size_t seg = 0;
    for (size_t off = 0; ok && off <= m;) {
        size_t len = off < m ? tok_utf8_lead_len((uint8_t)s[off]) : 0;
        if (len > m - off) len = m - off;
        bool mark = is_space_mark(s + off, len);
        bool cut = off == m || (t->spm_split_at_space && mark && !prev_mark);
        if (cut && off > seg) {
            size_t first = out->n;
            if (!tok_word_cache_get(cache, s + seg, off - seg, out)) {
                ok = spm_segment(&st, s + seg, off - seg, out, err);
                if (ok)
                    tok_word_cache_put(cache, s + seg, off - seg, out->v + first, out->n - first);
            }
            seg = off;
        }
        prev_mark = mark;
        if (off == m) break;
        off += len;
    }
    tok_word_cache_free(cache);
    free(st.start);
    free(st.len);
    free(st.prev);
    free(st.next);
    free(st.heap);
    free(s);
    return ok;
}
