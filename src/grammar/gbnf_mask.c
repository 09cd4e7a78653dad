/* Token masks. The grammar state plus a half-read code point is a "byte
 * state"; byte states are interned per mask call and their byte
 * transitions memoized in 256-entry rows, so the trie walk costs one table
 * lookup per trie node and the grammar runs once per distinct (state, byte)
 * pair met. A state that returns to itself on whole byte classes (a JSON
 * string body: every printable ASCII byte but '"' and '\\') accepts every
 * trie subtree made only of those classes without walking it (t_sub). */
#include "grammar/gbnf_internal.h"
#include <stdlib.h>

#define T_UNKNOWN (-2)
#define T_DEAD (-1)
#define MAX_BSTATES (1u << 17) /* 128 MiB of transition rows */
#define MAX_WORK (1ull << 27)   /* stacks stepped per mask: bounds pathological grammars */

typedef struct bstate {
    uint32_t cfg;  /* config index */
    gbnf_utf8 u;
} bstate;

typedef struct mask_ctx {
    const mu_grammar *g;
    gbnf_pool pool;
    /* configs: sorted stack sets, interned */
    gbnf_vec cdata, coff;
    uint32_t *cslot, cslot_mask;
    /* byte states */
    bstate *bs;
    uint32_t n_bs, cap_bs;
    int32_t *trans;        /* n_bs rows of 256 */
    uint64_t *self;        /* per byte state: byte classes on which it returns to itself */
    uint8_t *self_done;
    uint64_t *bkey;        /* per byte state: its key, for rehashing */
    uint32_t *bslot, bslot_mask;
    gbnf_vec tmp;
    uint64_t work;
    mu_error *err;
    bool failed;
} mask_ctx;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    return x ^ x >> 33;
}

static uint64_t cfg_hash(const uint32_t *v, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (size_t i = 0; i < n; i++) h = mix(h ^ v[i]);
    return h;
}

static void cfg_rehash(mask_ctx *c) {
    uint32_t cap = c->cslot ? (c->cslot_mask + 1) * 2 : 256;
    free(c->cslot);
    c->cslot = mu_xcalloc(cap, sizeof *c->cslot);
    c->cslot_mask = cap - 1;
    for (uint32_t k = 0; k + 1 < c->coff.n; k++) {
        const uint32_t *v = c->cdata.v + c->coff.v[k];
        uint32_t h = (uint32_t)cfg_hash(v, c->coff.v[k + 1] - c->coff.v[k]) & c->cslot_mask;
        while (c->cslot[h]) h = (h + 1) & c->cslot_mask;
        c->cslot[h] = k + 1;
    }
}

static uint32_t intern_cfg(mask_ctx *c, const uint32_t *v, size_t n) {
    uint32_t n_cfg = (uint32_t)c->coff.n - 1;
    if (!c->cslot || (n_cfg + 1) * 2 > c->cslot_mask + 1) cfg_rehash(c);
    uint32_t h = (uint32_t)cfg_hash(v, n) & c->cslot_mask;
    for (; c->cslot[h]; h = (h + 1) & c->cslot_mask) {
        uint32_t k = c->cslot[h] - 1, a = c->coff.v[k], b = c->coff.v[k + 1];
        if (b - a == n && !memcmp(c->cdata.v + a, v, n * sizeof *v)) return k;
    }
    for (size_t i = 0; i < n; i++) gbnf_vec_push(&c->cdata, v[i]);
    gbnf_vec_push(&c->coff, (uint32_t)c->cdata.n);
    c->cslot[h] = n_cfg + 1;
    return n_cfg;
}

static uint64_t bs_key(uint32_t cfg, gbnf_utf8 u) {
    return (uint64_t)cfg << 32 | (uint64_t)u.val << 8 | (uint64_t)u.remain << 4 | u.len;
}

static void bs_rehash(mask_ctx *c) {
    uint32_t cap = c->bslot ? (c->bslot_mask + 1) * 2 : 256;
    free(c->bslot);
    c->bslot = mu_xcalloc(cap, sizeof *c->bslot);
    c->bslot_mask = cap - 1;
    for (uint32_t k = 0; k < c->n_bs; k++) {
        uint32_t h = (uint32_t)mix(c->bkey[k]) & c->bslot_mask;
        while (c->bslot[h]) h = (h + 1) & c->bslot_mask;
        c->bslot[h] = k + 1;
    }
}

static int32_t intern_bs(mask_ctx *c, uint32_t cfg, gbnf_utf8 u) {
    if (!c->bslot || (c->n_bs + 1) * 2 > c->bslot_mask + 1) bs_rehash(c);
    uint64_t key = bs_key(cfg, u);
    uint32_t h = (uint32_t)mix(key) & c->bslot_mask;
    for (; c->bslot[h]; h = (h + 1) & c->bslot_mask)
        if (c->bkey[c->bslot[h] - 1] == key) return (int32_t)c->bslot[h] - 1;
    if (c->n_bs == c->cap_bs) {
        c->cap_bs = c->cap_bs ? c->cap_bs * 2 : 64;
        c->bs = mu_xrealloc(c->bs, c->cap_bs * sizeof *c->bs);
        c->bkey = mu_xrealloc(c->bkey, c->cap_bs * sizeof *c->bkey);
        c->trans = mu_xrealloc(c->trans, (size_t)c->cap_bs * 256 * sizeof *c->trans);
        c->self = mu_xrealloc(c->self, c->cap_bs * sizeof *c->self);
        c->self_done = mu_xrealloc(c->self_done, c->cap_bs);
    }
    uint32_t k = c->n_bs++;
    c->bs[k] = (bstate){cfg, u};
    c->bkey[k] = key;
    c->self[k] = 0;
    c->self_done[k] = 0;
    for (int b = 0; b < 256; b++) c->trans[(size_t)k * 256 + b] = T_UNKNOWN;
    c->bslot[h] = k + 1;
    return (int32_t)k;
}

static const uint32_t *cfg_of(const mask_ctx *c, uint32_t k, size_t *n) {
    *n = c->coff.v[k + 1] - c->coff.v[k];
    return c->cdata.v + c->coff.v[k];
}

/* Byte states are named by their row offset in trans (index * 256), so the
 * walk's inner step is a single load: trans[row + byte]. */
static int32_t intern_row(mask_ctx *c, uint32_t cfg, gbnf_utf8 u) {
    if (c->n_bs >= MAX_BSTATES && !c->failed) {
        mu_err_set(c->err, "grammar: mask: more than %u distinct grammar states in one mask",
                   MAX_BSTATES);
        c->failed = true;
    }
    if (c->failed) return T_DEAD;
    return intern_bs(c, cfg, u) * 256;
}

static int32_t step(mask_ctx *c, int32_t row, uint8_t b);

/* A state seen returning to itself: find every ASCII byte class on which
 * it always does (non-ASCII bytes start a code point, never a loop). */
static void self_loops(mask_ctx *c, int32_t row) {
    c->self_done[row >> 8] = 1;
    uint64_t m = (1ull << 40) - 1;
    for (int b = 0; b < 128; b++)
        if (step(c, row, (uint8_t)b) != row) m &= ~(1ull << gbnf_byte_class((uint8_t)b));
    c->self[row >> 8] = m;
}

/* The byte state after byte b from the state at row, memoized. */
static int32_t compute(mask_ctx *c, int32_t row, uint8_t b) {
    bstate st = c->bs[row >> 8];
    uint32_t cp;
    int32_t t = T_DEAD;
    size_t n;
    const uint32_t *cfg = cfg_of(c, st.cfg, &n);
    if ((c->work += n + 1) > MAX_WORK && !c->failed) {
        mu_err_set(c->err, "grammar: mask: more than %llu stack steps in one mask (the grammar "
                   "is too ambiguous here)", (unsigned long long)MAX_WORK);
        c->failed = true;
    }
    int r = gbnf_utf8_feed(&st.u, b, &cp);
    if (r == GBNF_U8_MORE) {
        if (gbnf_partial_viable(c->g, &c->pool, cfg, n, &st.u)) t = intern_row(c, st.cfg, st.u);
    } else if (r == GBNF_U8_CP && !c->failed) {
        if (!gbnf_step_cp(c->g, &c->pool, cfg, n, cp, &c->tmp, c->err)) c->failed = true;
        else if (c->tmp.n) t = intern_row(c, intern_cfg(c, c->tmp.v, c->tmp.n), st.u);
    }
    c->trans[row + b] = t;
    if (t == row && !c->self_done[row >> 8]) self_loops(c, row);
    return t;
}

static int32_t step(mask_ctx *c, int32_t row, uint8_t b) {
    int32_t t = c->trans[row + b];
    return t == T_UNKNOWN ? compute(c, row, b) : t;
}

/* Sets up c and returns the start byte state. */
static int32_t ctx_init(mask_ctx *c, const mu_grammar_state *s, mu_error *err) {
    memset(c, 0, sizeof *c);
    c->g = s->g;
    c->err = err;
    gbnf_pool_copy(&c->pool, &s->pool);
    gbnf_vec_push(&c->coff, 0);
    return intern_bs(c, intern_cfg(c, s->cfg.v, s->cfg.n), s->part) * 256;
}

static void ctx_free(mask_ctx *c) {
    gbnf_pool_free(&c->pool);
    gbnf_vec_free(&c->cdata);
    gbnf_vec_free(&c->coff);
    gbnf_vec_free(&c->tmp);
    free(c->cslot);
    free(c->bs);
    free(c->trans);
    free(c->bkey);
    free(c->bslot);
    free(c->self);
    free(c->self_done);
}

/* ---------------- token terminals ---------------- */

typedef struct token_tops {
    uint32_t n_not;       /* distinct !<[x]> values seen (capped at 2) */
    uint32_t not_id;
    gbnf_vec pos;         /* <[x]> values */
} token_tops;

static void collect_token_tops(const mu_grammar_state *s, token_tops *t) {
    memset(t, 0, sizeof *t);
    if (s->part.remain) return; /* token terminals only at a code point boundary */
    const mu_grammar *g = s->g;
    for (size_t i = 0; i < s->cfg.n; i++) {
        uint32_t id = s->cfg.v[i];
        if (id == GBNF_NIL) continue;
        uint32_t p = s->pool.node[id].pos;
        if (g->kind[p] == GK_TOKEN) {
            gbnf_vec_push(&t->pos, g->elem[p].value);
        } else if (g->kind[p] == GK_TOKEN_NOT) {
            if (t->n_not == 0) {
                t->not_id = g->elem[p].value;
                t->n_not = 1;
            } else if (t->not_id != g->elem[p].value) {
                t->n_not = 2;
            }
        }
    }
}

static bool token_tops_allow(const token_tops *t, int32_t id) {
    if (t->n_not == 2 || (t->n_not == 1 && t->not_id != (uint32_t)id)) return true;
    for (size_t i = 0; i < t->pos.n; i++)
        if (t->pos.v[i] == (uint32_t)id) return true;
    return false;
}

static void apply_token_tops(const token_tops *t, const mu_grammar_vocab *v, uint32_t *bits) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (t->n_not) {
        uint32_t x = t->not_id;
        bool keep = x < (uint32_t)v->n_vocab && (bits[x >> 5] >> (x & 31) & 1);
        for (size_t w = 0; w < words; w++) bits[w] |= v->normal_bits[w];
        if (t->n_not == 1 && x < (uint32_t)v->n_vocab && !keep) bits[x >> 5] &= ~(1u << (x & 31));
    }
    for (size_t i = 0; i < t->pos.n; i++) {
        uint32_t x = t->pos.v[i];
        if (x < (uint32_t)v->n_vocab && (v->normal_bits[x >> 5] >> (x & 31) & 1))
            bits[x >> 5] |= 1u << (x & 31);
    }
}

/* ---------------- masks ---------------- */

/* One forward pass over the preorder trie. The state of the last visited
 * node stays in a register, so descending a chain of single children costs
 * one dependent load per byte; dead subtrees are jumped over, and subtrees
 * made only of bytes on which the parent state loops are accepted whole. */
static void walk_trie(mask_ctx *c, const mu_grammar_vocab *v, int32_t start, uint32_t *bits) {
    int32_t *stk = mu_xmalloc(((size_t)v->max_depth + 1) * sizeof *stk);
    const gbnf_tnode *node = v->node;
    const int32_t *ids = v->t_ids;
    const int32_t *trans = c->trans;
    const uint64_t *self = c->self;
    int32_t cur = start;
    uint32_t cur_d = 0, k = 0; /* k: first token of node i in t_ids */
    stk[0] = start;
    for (uint32_t i = 0, n = v->n_nodes; i < n;) {
        gbnf_tnode nd = node[i];
        int32_t parent = nd.depth == cur_d + 1 ? cur : stk[nd.depth - 1];
        uint64_t loops = self[parent >> 8];
        if (loops && !(v->t_sub[i] & ~loops)) {
            uint32_t end = v->t_tok[nd.skip];
            for (; k < end; k++) bits[ids[k] >> 5] |= 1u << (ids[k] & 31);
            i = nd.skip;
            continue;
        }
        int32_t t = trans[parent + nd.byte];
        if (t == T_UNKNOWN) {
            t = compute(c, parent, nd.byte);
            trans = c->trans;
            self = c->self;
        }
        if (t < 0) {
            i = nd.skip;
            k = v->t_tok[i];
            continue;
        }
        cur = stk[nd.depth] = t;
        cur_d = nd.depth;
        if (nd.ntok) {
            uint32_t end = nd.ntok < 255 ? k + nd.ntok : v->t_tok[i + 1];
            for (; k < end; k++) bits[ids[k] >> 5] |= 1u << (ids[k] & 31);
        }
        i++;
    }
    free(stk);
}

bool mu_grammar_mask_bits(const mu_grammar_state *s, const mu_grammar_vocab *v, uint32_t *bits,
                          mu_error *err) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    memset(bits, 0, words * sizeof *bits);
    mask_ctx c;
    int32_t start = ctx_init(&c, s, err);
    walk_trie(&c, v, start, bits);
    bool failed = c.failed;
    ctx_free(&c);
    if (failed) {
        memset(bits, 0, words * sizeof *bits);
        return false;
    }
    token_tops t;
    collect_token_tops(s, &t);
    apply_token_tops(&t, v, bits);
    gbnf_vec_free(&t.pos);
    if (mu_grammar_is_complete(s))
        for (uint32_t k = 0; k < v->n_eog; k++) bits[v->eog[k] >> 5] |= 1u << (v->eog[k] & 31);
    return true;
}

bool mu_grammar_mask_all(const mu_grammar_state *s, const mu_grammar_vocab *v, bool *allowed,
                         mu_error *err) {
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    uint32_t *bits = mu_xmalloc(words * sizeof *bits);
    bool ok = mu_grammar_mask_bits(s, v, bits, err);
    for (int32_t i = 0; i < v->n_vocab; i++) allowed[i] = bits[i >> 5] >> (i & 31) & 1;
    free(bits);
    return ok;
}

bool mu_grammar_mask(const mu_grammar_state *s, const mu_grammar_vocab *v, const int32_t *ids,
                     size_t n, bool *allowed, mu_error *err) {
    mask_ctx c;
    int32_t start = ctx_init(&c, s, err);
    token_tops t;
    collect_token_tops(s, &t);
    bool complete = mu_grammar_is_complete(s);
    for (size_t k = 0; k < n && !c.failed; k++) {
        int32_t id = ids[k];
        allowed[k] = false;
        if (id < 0 || id >= v->n_vocab) continue;
        if (v->flag[id]) {
            allowed[k] = (v->flag[id] & GV_EOG) && complete;
            continue;
        }
        if (token_tops_allow(&t, id)) {
            allowed[k] = true;
            continue;
        }
        size_t len;
        const uint8_t *p = (const uint8_t *)gbnf_piece(v, id, &len);
        int32_t st = start;
        for (size_t i = 0; i < len && st >= 0; i++) st = step(&c, st, p[i]);
        allowed[k] = st >= 0;
    }
    bool failed = c.failed;
    ctx_free(&c);
    gbnf_vec_free(&t.pos);
    if (failed)
        for (size_t k = 0; k < n; k++) allowed[k] = false;
    return !failed;
}
