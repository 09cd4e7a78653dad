/* Hash-consed parse stacks and the step that moves a set of them over one
 * code point (or one token-terminal match), as llama.cpp's
 * llama_grammar_advance_stack / llama_grammar_accept do, but with stacks as
 * shared, interned linked lists: pushing is O(1), equal stacks are one id,
 * and a set of stacks is a sorted id array. */
#include "grammar/gbnf_internal.h"
#include <stdio.h>
#include <stdlib.h>

void gbnf_vec_reserve(gbnf_vec *a, size_t n) {
    if (n <= a->cap) return;
    a->cap = n;
    a->v = mu_xrealloc(a->v, n * sizeof *a->v);
}

void gbnf_vec_free(gbnf_vec *a) {
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* ---------------- pool ---------------- */

static uint32_t node_hash(uint32_t pos, uint32_t parent) {
    uint64_t x = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> 32 ^ x);
}

void gbnf_pool_init(gbnf_pool *p) {
    memset(p, 0, sizeof *p);
    p->cap = 64;
    p->node = mu_xmalloc(p->cap * sizeof *p->node);
    p->mark = mu_xcalloc(p->cap, sizeof *p->mark);
    p->node[0] = (gbnf_node){UINT32_MAX, 0};
    p->n = 1;
    p->slot = mu_xcalloc(128, sizeof *p->slot);
    p->slot_mask = 127;
}

void gbnf_pool_free(gbnf_pool *p) {
    free(p->node);
    free(p->mark);
    free(p->slot);
    gbnf_vec_free(&p->todo);
    memset(p, 0, sizeof *p);
}

void gbnf_pool_copy(gbnf_pool *dst, const gbnf_pool *src) {
    memset(dst, 0, sizeof *dst);
    dst->n = src->n;
    dst->cap = src->n + 64;
    dst->node = mu_xmalloc(dst->cap * sizeof *dst->node);
    memcpy(dst->node, src->node, src->n * sizeof *dst->node);
    dst->mark = mu_xcalloc(dst->cap, sizeof *dst->mark);
    dst->slot_mask = src->slot_mask;
    dst->slot = mu_xmalloc(((size_t)src->slot_mask + 1) * sizeof *dst->slot);
    memcpy(dst->slot, src->slot, ((size_t)src->slot_mask + 1) * sizeof *dst->slot);
}

static void grow_slots(gbnf_pool *p) {
    uint32_t cap = (p->slot_mask + 1) * 2;
    free(p->slot);
    p->slot = mu_xcalloc(cap, sizeof *p->slot);
    p->slot_mask = cap - 1;
    for (uint32_t id = 1; id < p->n; id++) {
        uint32_t h = node_hash(p->node[id].pos, p->node[id].parent) & p->slot_mask;
        while (p->slot[h]) h = (h + 1) & p->slot_mask;
        p->slot[h] = id;
    }
}

/* The stack "pos on top of parent"; GBNF_NONE past GBNF_MAX_NODES. */
static uint32_t push(gbnf_pool *p, uint32_t parent, uint32_t pos) {
    uint32_t h = node_hash(pos, parent) & p->slot_mask;
    for (uint32_t id; (id = p->slot[h]); h = (h + 1) & p->slot_mask)
        if (p->node[id].pos == pos && p->node[id].parent == parent) return id;
    if (p->n >= GBNF_MAX_NODES) return GBNF_NONE;
    if (p->n == p->cap) {
        uint32_t cap = p->cap * 2;
        p->node = mu_xrealloc(p->node, cap * sizeof *p->node);
        p->mark = mu_xrealloc(p->mark, cap * sizeof *p->mark);
        memset(p->mark + p->cap, 0, (cap - p->cap) * sizeof *p->mark);
        p->cap = cap;
    }
    uint32_t id = p->n++;
    p->node[id] = (gbnf_node){pos, parent};
    p->mark[id] = 0;
    p->slot[h] = id;
    if ((uint64_t)p->n * 2 > (uint64_t)p->slot_mask + 1) grow_slots(p);
    return id;
}

static void next_epoch(gbnf_pool *p) {
    if (++p->epoch == 0) {
        memset(p->mark, 0, p->cap * sizeof *p->mark);
        p->epoch = 1;
    }
}

static int u32_cmp(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static void sort_ids(gbnf_vec *a) {
    if (a->n < 16) {
        for (size_t i = 1; i < a->n; i++) {
            uint32_t x = a->v[i];
            size_t j = i;
            for (; j && a->v[j - 1] > x; j--) a->v[j] = a->v[j - 1];
            a->v[j] = x;
        }
    } else {
        qsort(a->v, a->n, sizeof *a->v, u32_cmp);
    }
}

void gbnf_pool_compact(gbnf_pool *p, gbnf_vec *cfg) {
    gbnf_pool q;
    gbnf_pool_init(&q);
    uint32_t *map = mu_xmalloc(p->n * sizeof *map);
    for (uint32_t i = 0; i < p->n; i++) map[i] = GBNF_NONE;
    map[GBNF_NIL] = GBNF_NIL;
    gbnf_vec chain = {0};
    for (size_t i = 0; i < cfg->n; i++) {
        chain.n = 0;
        for (uint32_t x = cfg->v[i]; map[x] == GBNF_NONE; x = p->node[x].parent) gbnf_vec_push(&chain, x);
        while (chain.n) {
            uint32_t x = chain.v[--chain.n];
            map[x] = push(&q, map[p->node[x].parent], p->node[x].pos);
        }
        cfg->v[i] = map[cfg->v[i]];
    }
    gbnf_vec_free(&chain);
    free(map);
    gbnf_pool_free(p);
    *p = q;
    sort_ids(cfg);
}

/* ---------------- expansion ---------------- */

static bool limit(mu_error *err, const char *what) {
    mu_err_set(err, "grammar: %s", what);
    return false;
}

/* Replace stack s by every stack reachable from it without consuming input
 * whose top is a terminal (or the empty stack), appending new ones to out.
 * Marks (this epoch) make repeated stacks free and break the harmless
 * cycles the compile step lets through. */
static bool expand(const mu_grammar *g, gbnf_pool *p, uint32_t s, gbnf_vec *out, uint32_t *work,
                   mu_error *err) {
    gbnf_vec *todo = &p->todo;
    todo->n = 0;
    gbnf_vec_push(todo, s);
    while (todo->n) {
        uint32_t t = todo->v[--todo->n];
        if (p->mark[t] == p->epoch) continue;
        p->mark[t] = p->epoch;
        uint32_t pos = p->node[t].pos;
        if (t == GBNF_NIL || g->kind[pos] != GK_REF) {
            if (out->n >= MU_GRAMMAR_MAX_STACKS)
                return limit(err, "more than " "16384" " live parse stacks: the grammar is too "
                             "ambiguous here (MU_GRAMMAR_MAX_STACKS)");
            gbnf_vec_push(out, t);
            continue;
        }
        if (++*work > MU_GRAMMAR_MAX_EXPANSIONS)
            return limit(err, "more than 1048576 rule expansions for one character "
                         "(MU_GRAMMAR_MAX_EXPANSIONS)");
        uint32_t base = p->node[t].parent;
        if (!gbnf_is_end(g, pos + 1)) base = push(p, base, pos + 1);
        if (base == GBNF_NONE) return limit(err, "parse stacks exceed 8388608 nodes");
        uint32_t r = g->elem[pos].value;
        for (uint32_t k = g->alt_off[r]; k < g->alt_off[r + 1]; k++) {
            uint32_t a = g->alt[k];
            uint32_t ns = gbnf_is_end(g, a) ? base : push(p, base, a);
            if (ns == GBNF_NONE) return limit(err, "parse stacks exceed 8388608 nodes");
            gbnf_vec_push(todo, ns);
        }
    }
    return true;
}

/* The stack with the terminal on top of s consumed. */
static uint32_t pop_terminal(const mu_grammar *g, gbnf_pool *p, uint32_t s) {
    uint32_t nxt = g->next[p->node[s].pos], parent = p->node[s].parent;
    return gbnf_is_end(g, nxt) ? parent : push(p, parent, nxt);
}

bool gbnf_initial(const mu_grammar *g, gbnf_pool *p, gbnf_vec *out, mu_error *err) {
    out->n = 0;
    next_epoch(p);
    uint32_t work = 0;
    for (uint32_t k = g->alt_off[g->root]; k < g->alt_off[g->root + 1]; k++) {
        uint32_t a = g->alt[k];
        uint32_t s = gbnf_is_end(g, a) ? GBNF_NIL : push(p, GBNF_NIL, a);
        if (s == GBNF_NONE) return limit(err, "parse stacks exceed 8388608 nodes");
        if (!expand(g, p, s, out, &work, err)) return false;
    }
    sort_ids(out);
    return true;
}

bool gbnf_step_cp(const mu_grammar *g, gbnf_pool *p, const uint32_t *cfg, size_t n, uint32_t cp,
                  gbnf_vec *out, mu_error *err) {
    out->n = 0;
    next_epoch(p);
    uint32_t work = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = cfg[i];
        if (s == GBNF_NIL) continue;
        uint32_t pos = p->node[s].pos;
        if (g->kind[pos] != GK_CLASS || !gbnf_class_match(g, g->cls[pos], cp)) continue;
        uint32_t ns = pop_terminal(g, p, s);
        if (ns == GBNF_NONE) return limit(err, "parse stacks exceed 8388608 nodes");
        if (!expand(g, p, ns, out, &work, err)) return false;
    }
    sort_ids(out);
    return true;
}

static bool token_top_matches(const mu_grammar *g, const gbnf_pool *p, uint32_t s, int32_t id) {
    if (s == GBNF_NIL) return false;
    uint32_t pos = p->node[s].pos;
    if (g->kind[pos] == GK_TOKEN) return g->elem[pos].value == (uint32_t)id;
    if (g->kind[pos] == GK_TOKEN_NOT) return g->elem[pos].value != (uint32_t)id;
    return false;
}

bool gbnf_token_matches(const mu_grammar *g, const gbnf_pool *p, const uint32_t *cfg, size_t n,
                        int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (token_top_matches(g, p, cfg[i], id)) return true;
    return false;
}

bool gbnf_step_token(const mu_grammar *g, gbnf_pool *p, const uint32_t *cfg, size_t n,
                     int32_t id, gbnf_vec *out, mu_error *err) {
    out->n = 0;
    next_epoch(p);
    uint32_t work = 0;
    for (size_t i = 0; i < n; i++) {
        if (!token_top_matches(g, p, cfg[i], id)) continue;
        uint32_t ns = pop_terminal(g, p, cfg[i]);
        if (ns == GBNF_NONE) return limit(err, "parse stacks exceed 8388608 nodes");
        if (!expand(g, p, ns, out, &work, err)) return false;
    }
    sort_ids(out);
    return true;
}

/* ---------------- UTF-8 ---------------- */

bool gbnf_utf8_range(const gbnf_utf8 *u, uint32_t *lo, uint32_t *hi) {
    static const uint32_t min_for_len[5] = {0, 0, 0x80, 0x800, 0x10000};
    unsigned sh = 6u * u->remain;
    uint32_t a = u->val << sh, b = a | ((1u << sh) - 1);
    if (a < min_for_len[u->len]) a = min_for_len[u->len];
    if (b > 0x10FFFF) b = 0x10FFFF;
    if (u->len == 3) { /* cut out the surrogates D800-DFFF */
        if (a >= 0xD800 && b <= 0xDFFF) return false;
        if (a < 0xD800 && b >= 0xD800) b = 0xD7FF;
        else if (a <= 0xDFFF && b > 0xDFFF) a = 0xE000;
    }
    *lo = a;
    *hi = b;
    return a <= b;
}

int gbnf_utf8_feed(gbnf_utf8 *u, uint8_t b, uint32_t *cp) {
    if (u->remain == 0) {
        if (b < 0x80) {
            *cp = b;
            return GBNF_U8_CP;
        }
        if (b >= 0xC2 && b <= 0xDF) *u = (gbnf_utf8){b & 0x1Fu, 1, 2};
        else if (b >= 0xE0 && b <= 0xEF) *u = (gbnf_utf8){b & 0x0Fu, 2, 3};
        else if (b >= 0xF0 && b <= 0xF4) *u = (gbnf_utf8){b & 0x07u, 3, 4};
        else return GBNF_U8_BAD;
        uint32_t lo, hi;
        return gbnf_utf8_range(u, &lo, &hi) ? GBNF_U8_MORE : GBNF_U8_BAD;
    }
    if ((b & 0xC0) != 0x80) return GBNF_U8_BAD;
    u->val = u->val << 6 | (b & 0x3Fu);
    u->remain--;
    uint32_t lo, hi;
    if (!gbnf_utf8_range(u, &lo, &hi)) return GBNF_U8_BAD; /* overlong, surrogate, > U+10FFFF */
    if (u->remain) return GBNF_U8_MORE;
    *cp = u->val;
    *u = (gbnf_utf8){0, 0, 0};
    return GBNF_U8_CP;
}

bool gbnf_partial_viable(const mu_grammar *g, const gbnf_pool *p, const uint32_t *cfg, size_t n,
                         const gbnf_utf8 *u) {
    uint32_t lo, hi;
    if (!gbnf_utf8_range(u, &lo, &hi)) return false;
    for (size_t i = 0; i < n; i++) {
        if (cfg[i] == GBNF_NIL) continue;
        uint32_t pos = p->node[cfg[i]].pos;
        if (g->kind[pos] == GK_CLASS && gbnf_class_overlaps(g, g->cls[pos], lo, hi)) return true;
    }
    return false;
}
