/* Token pieces and their byte trie (depth-first preorder, see
 * gbnf_internal.h), built by sorting the pieces: consecutive sorted pieces
 * share exactly their common prefix, so each piece adds one node per byte
 * past that prefix. */
#include "grammar/gbnf_internal.h"
#include <stdlib.h>

#define MAX_PIECE 65535u /* trie depth is 16-bit */

typedef struct sorted_piece {
    const char *s;
    uint32_t len;
    int32_t id;
} sorted_piece;

static int piece_cmp(const void *a, const void *b) {
    const sorted_piece *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* t_sub bottom-up: going backwards, acc[d] gathers the classes of the
 * already-seen children at depth d of the next node at depth d - 1. */
static void summarize_subtrees(mu_grammar_vocab *v) {
    v->t_sub = mu_xmalloc((v->n_nodes ? v->n_nodes : 1) * sizeof *v->t_sub);
    uint64_t *acc = mu_xcalloc((size_t)v->max_depth + 2, sizeof *acc);
    for (uint32_t i = v->n_nodes; i-- > 0;) {
        uint32_t d = v->node[i].depth;
        uint64_t m = 1ull << gbnf_byte_class(v->node[i].byte) | acc[d + 1];
        acc[d + 1] = 0;
        v->t_sub[i] = m;
        acc[d] |= m;
    }
    free(acc);
}

static void build_trie(mu_grammar_vocab *v) {
    sorted_piece *sp = mu_xmalloc((size_t)v->n_vocab * sizeof *sp);
    size_t n = 0, total = 0;
    for (int32_t i = 0; i < v->n_vocab; i++) {
        if (v->flag[i]) continue;
        sp[n++] = (sorted_piece){v->bytes + v->off[i], v->len[i], i};
        total += v->len[i];
        if (v->len[i] > v->max_depth) v->max_depth = v->len[i];
    }
    qsort(sp, n, sizeof *sp, piece_cmp);
    v->node = mu_xmalloc((total ? total : 1) * sizeof *v->node);
    v->t_tok = mu_xmalloc((total + 1) * sizeof *v->t_tok);
    v->t_ids = mu_xmalloc((n ? n : 1) * sizeof *v->t_ids);
    uint32_t *path = mu_xmalloc(((size_t)v->max_depth + 1) * sizeof *path);
    uint32_t nodes = 0, n_ids = 0, path_len = 0;
    for (size_t k = 0; k < n; k++) {
        uint32_t l = 0;
        if (k) {
            const sorted_piece *a = &sp[k - 1], *b = &sp[k];
            uint32_t m = a->len < b->len ? a->len : b->len;
            while (l < m && a->s[l] == b->s[l]) l++;
        }
        for (; path_len > l; path_len--) v->node[path[path_len]].skip = nodes; /* leave subtrees */
        for (uint32_t d = l + 1; d <= sp[k].len; d++) {
            v->node[nodes] = (gbnf_tnode){0, (uint16_t)d, (uint8_t)sp[k].s[d - 1], 0};
            v->t_tok[nodes] = n_ids;
            path[d] = nodes++;
            path_len = d;
        }
        v->t_ids[n_ids++] = sp[k].id; /* always the newest node: see the header comment */
        if (v->node[nodes - 1].ntok < 255) v->node[nodes - 1].ntok++;
    }
    for (; path_len > 0; path_len--) v->node[path[path_len]].skip = nodes;
    v->t_tok[nodes] = n_ids;
    v->n_nodes = nodes;
    v->node = mu_xrealloc(v->node, (nodes ? nodes : 1) * sizeof *v->node);
    summarize_subtrees(v);
    free(path);
    free(sp);
}

mu_grammar_vocab *mu_grammar_vocab_new(int32_t n_vocab, const char *const *piece,
                                       const size_t *piece_len, const bool *is_eog,
                                       mu_error *err) {
    if (n_vocab <= 0 || !piece || !piece_len) {
        mu_err_set(err, "grammar vocabulary: %d tokens (need at least one, with pieces)", n_vocab);
        return NULL;
    }
    size_t total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        if (piece_len[i] > MAX_PIECE || (piece_len[i] && !piece[i])) {
            mu_err_set(err, "grammar vocabulary: token %d: piece of %zu bytes is invalid", i,
                       piece_len[i]);
            return NULL;
        }
        total += piece_len[i];
    }
    mu_grammar_vocab *v = mu_xcalloc(1, sizeof *v);
    v->n_vocab = n_vocab;
    v->bytes = mu_xmalloc(total ? total : 1);
    v->off = mu_xmalloc((size_t)n_vocab * sizeof *v->off);
    v->len = mu_xmalloc((size_t)n_vocab * sizeof *v->len);
    v->flag = mu_xcalloc((size_t)n_vocab, 1);
    v->normal_bits = mu_xcalloc(((size_t)n_vocab + 31) / 32, sizeof *v->normal_bits);
    size_t at = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        v->off[i] = at;
        v->len[i] = (uint32_t)piece_len[i];
        if (piece_len[i]) memcpy(v->bytes + at, piece[i], piece_len[i]);
        at += piece_len[i];
        if (is_eog && is_eog[i]) v->flag[i] = GV_EOG;
        else if (!piece_len[i] || piece[i][0] == '\0') v->flag[i] = GV_NEVER;
        else v->normal_bits[i >> 5] |= 1u << (i & 31);
        if (v->flag[i] & GV_EOG) v->n_eog++;
    }
    v->eog = mu_xmalloc((v->n_eog ? v->n_eog : 1) * sizeof *v->eog);
    for (int32_t i = 0, k = 0; i < n_vocab; i++)
        if (v->flag[i] & GV_EOG) v->eog[k++] = i;
    build_trie(v);
    return v;
}

void mu_grammar_vocab_free(mu_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->flag);
    free(v->eog);
    free(v->normal_bits);
    free(v->node);
    free(v->t_sub);
    free(v->t_tok);
    free(v->t_ids);
    free(v);
}

int32_t mu_grammar_vocab_size(const mu_grammar_vocab *v) {
    return v ? v->n_vocab : 0;
}

int32_t mu_grammar_vocab_find(const mu_grammar_vocab *v, const char *text, size_t len) {
    int32_t found = -1;
    for (int32_t i = 0; i < v->n_vocab; i++) {
        if (v->len[i] != len || memcmp(v->bytes + v->off[i], text, len)) continue;
        if (found >= 0) return -2;
        found = i;
    }
    return found;
}
