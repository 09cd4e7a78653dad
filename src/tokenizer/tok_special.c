/* Special-token partition, equivalent to llama.cpp's tokenizer_st_partition.
 *
 * llama.cpp takes the special tokens longest first and, for each, cuts every
 * occurrence out of the raw fragments that remain (left to right, never
 * across a fragment already cut), dropping whitespace next to tokens marked
 * LSTRIP / RSTRIP. Scanning the text once per special token is too slow for
 * large vocabularies, so we find every occurrence of every special text in
 * one pass over a trie, then replay the same decisions in priority order on
 * a per-byte occupancy map. The outcome is identical. */
#include "tokenizer/tok_internal.h"
#include <stdlib.h>

static int cmp_priority(const void *a, const void *b, void *ctx) {
    const mu_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = t->text_len[x], ly = t->text_len[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return (x > y) - (x < y);
}

static int32_t trie_child(const mu_tokenizer *t, int32_t node, uint8_t b) {
    for (int32_t c = t->trie[node].child; c >= 0; c = t->trie[c].sibling)
        if (t->trie[c].byte == b) return c;
    return -1;
}

static void trie_insert(mu_tokenizer *t, size_t *cap, const uint8_t *s, size_t n, int32_t id) {
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = trie_child(t, node, s[i]);
        if (c < 0) {
            if (t->n_trie == *cap) {
                *cap *= 2;
                t->trie = mu_xrealloc(t->trie, *cap * sizeof *t->trie);
            }
            c = (int32_t)t->n_trie++;
            t->trie[c] = (tok_trie_node){-1, t->trie[node].child, -1, s[i]};
            t->trie[node].child = c;
        }
        node = c;
    }
    t->trie[node].token = id;
}

void tok_special_build(mu_tokenizer *t) {
    const uint16_t special = MU_TOKEN_ATTR_CONTROL | MU_TOKEN_ATTR_USER_DEFINED |
                             MU_TOKEN_ATTR_UNKNOWN;
    int32_t *ids = mu_xmalloc(((size_t)t->n_vocab + 1) * sizeof *ids);
    size_t n = 0;
    for (int64_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & special) ids[n++] = (int32_t)id;
    qsort_r(ids, n, sizeof *ids, cmp_priority, t);
    t->special_prio = mu_xmalloc((size_t)t->n_vocab * sizeof *t->special_prio);
    for (int64_t id = 0; id < t->n_vocab; id++) t->special_prio[id] = -1;
    size_t cap = 256;
    t->trie = mu_xmalloc(cap * sizeof *t->trie);
    t->trie[0] = (tok_trie_node){-1, -1, -1, 0};
    t->n_trie = 1;
    memset(t->trie_first, 0, sizeof t->trie_first);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        const uint8_t *s = (const uint8_t *)t->text.p + t->text_off[id];
        t->special_prio[id] = (int32_t)i;
        trie_insert(t, &cap, s, t->text_len[id], id);
        t->trie_first[s[0]] = true;
    }
    t->n_special = n;
    free(ids);
}

/* ---------------- partition ---------------- */

typedef struct occurrence {
    int32_t prio, token;
    size_t pos, len;
} occurrence;

static int cmp_occurrence(const void *a, const void *b) {
    const occurrence *x = a, *y = b;
    if (x->prio != y->prio) return x->prio < y->prio ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static bool eligible(const mu_tokenizer *t, int32_t id, bool parse_special) {
    /* user-defined tokens are always split out; control / unknown on request */
    return parse_special || !(t->attr[id] & (MU_TOKEN_ATTR_CONTROL | MU_TOKEN_ATTR_UNKNOWN));
}

static occurrence *find_occurrences(const mu_tokenizer *t, const uint8_t *s, size_t n,
                                    bool parse_special, size_t *n_occ) {
    occurrence *occ = NULL;
    size_t cnt = 0, cap = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t->trie_first[s[i]]) continue;
        int32_t node = 0;
        for (size_t j = i; j < n; j++) {
            node = trie_child(t, node, s[j]);
            if (node < 0) break;
            int32_t id = t->trie[node].token;
            if (id < 0 || !eligible(t, id, parse_special)) continue;
            if (cnt == cap) {
                cap = cap ? 2 * cap : 16;
                occ = mu_xrealloc(occ, cap * sizeof *occ);
            }
            occ[cnt++] = (occurrence){t->special_prio[id], id, i, j + 1 - i};
        }
    }
    *n_occ = cnt;
    return occ;
}

static bool is_c_space(uint8_t c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

enum { FREE = 0, TAKEN = 1, DROPPED = 2 };

static bool span_free(const uint8_t *state, size_t pos, size_t len) {
    for (size_t k = 0; k < len; k++)
        if (state[pos + k] != FREE) return false;
    return true;
}

tok_fragment *tok_special_partition(const mu_tokenizer *t, const char *text, size_t n,
                                    bool parse_special, size_t *n_frag) {
    const uint8_t *s = (const uint8_t *)text;
    size_t n_occ = 0;
    occurrence *occ = n ? find_occurrences(t, s, n, parse_special, &n_occ) : NULL;
    if (!n_occ) {
        free(occ);
        tok_fragment *f = mu_xmalloc(sizeof *f);
        f[0] = (tok_fragment){0, n, -1};
        *n_frag = n ? 1 : 0;
        return f;
    }
    qsort(occ, n_occ, sizeof *occ, cmp_occurrence);
    uint8_t *state = mu_xcalloc(n, 1);
    int32_t *token_at = mu_xmalloc(n * sizeof *token_at); /* valid where a token starts */
    for (size_t i = 0; i < n_occ; i++) {
        const occurrence *o = &occ[i];
        if (!span_free(state, o->pos, o->len)) continue;
        memset(state + o->pos, TAKEN, o->len);
        token_at[o->pos] = o->token;
        if (t->attr[o->token] & MU_TOKEN_ATTR_LSTRIP)
            for (size_t k = o->pos; k > 0 && state[k - 1] == FREE && is_c_space(s[k - 1]); k--)
                state[k - 1] = DROPPED;
        if (t->attr[o->token] & MU_TOKEN_ATTR_RSTRIP)
            for (size_t k = o->pos + o->len; k < n && state[k] == FREE && is_c_space(s[k]); k++)
                state[k] = DROPPED;
    }
    /* fragments: maximal free runs and the chosen tokens, in text order */
    size_t cnt = 0, cap = 2 * n_occ + 1;
    tok_fragment *f = mu_xmalloc(cap * sizeof *f);
    for (size_t i = 0; i < n;) {
        if (state[i] == DROPPED) {
            i++;
        } else if (state[i] == TAKEN) {
            int32_t id = token_at[i];
            size_t len = t->text_len[id];
            f[cnt++] = (tok_fragment){i, len, id};
            i += len;
        } else {
            size_t j = i;
            while (j < n && state[j] == FREE) j++;
            f[cnt++] = (tok_fragment){i, j - i, -1};
            i = j;
        }
    }
    free(state);
    free(token_at);
    free(occ);
    *n_frag = cnt;
    return f;
}
