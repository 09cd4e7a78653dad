/* Parsed rules -> matcher tables, after refusing left recursion.
 *
 * Two left-recursion checks:
 *  1. llama.cpp's (llama_grammar_detect_left_recursion): a rule reaching
 *     itself through leftmost references, where a reference is passed over
 *     only if the referenced rule has a literally empty alternative. Every
 *     grammar llama.cpp refuses is refused here.
 *  2. The exact condition under which expanding stacks never ends: a cycle
 *     through leftmost references (passing over every rule that can match
 *     the empty string) that pushes a continuation on the way round. Check 1
 *     misses such cycles hidden behind rules that are only indirectly
 *     nullable; llama.cpp loops forever on them. Cycles that push nothing,
 *     e.g. ( [x]* )*, are harmless and accepted as llama.cpp accepts them. */
#include "grammar/gbnf_internal.h"
#include <stdio.h>
#include <stdlib.h>

/* ---------------- left-corner graph ---------------- */

typedef struct lc_graph {
    uint32_t n;
    uint32_t *off;  /* edges of rule r: dst[off[r] .. off[r + 1]) */
    uint32_t *dst;
    uint8_t *grow;  /* the reference is followed by more of its alternative */
} lc_graph;

/* Edge r -> b for each reference b reached from the start of an
 * alternative of r while every earlier element is a reference to a rule
 * with passable[] set. */
static void lc_build(const mu_grammar *g, const bool *passable, lc_graph *G) {
    G->n = g->n_rules;
    G->off = mu_xcalloc((size_t)g->n_rules + 1, sizeof *G->off);
    for (int pass = 0; pass < 2; pass++) {
        uint32_t k = 0;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (pass) G->off[r] = k;
            bool open = true;
            for (uint32_t p = g->rule_start[r];; p++) {
                const gbnf_elem *e = &g->elem[p];
                if (e->type <= GE_ALT) {
                    open = true;
                    if (e->type == GE_END) break;
                } else if (e->type == GE_RULE_REF && open) {
                    if (pass) {
                        G->dst[k] = e->value;
                        G->grow[k] = !gbnf_is_end(g, p + 1);
                    }
                    k++;
                    open = passable[e->value];
                } else {
                    open = false;
                }
            }
        }
        if (pass) {
            G->off[g->n_rules] = k;
        } else {
            G->dst = mu_xmalloc((k ? k : 1) * sizeof *G->dst);
            G->grow = mu_xmalloc(k ? k : 1);
        }
    }
}

static void lc_free(lc_graph *G) {
    free(G->off);
    free(G->dst);
    free(G->grow);
}

/* "'a' -> 'b' -> 'a'" into buf, shortened if long. */
static void format_path(const mu_grammar *g, const uint32_t *path, size_t n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        if (n > 12 && i == 6) {
            o += (size_t)snprintf(buf + o, cap - o, " -> ...");
            i = n - 6; /* print the last six */
            if (o + 1 >= cap) break;
        }
        int w = snprintf(buf + o, cap - o, "%s'%s'", i ? " -> " : "", g->rule_name[path[i]]);
        if (w < 0 || (size_t)w >= cap - o) break;
        o += (size_t)w;
    }
}

/* ---------------- check 1: llama.cpp's ---------------- */

static bool has_empty_alternative(const mu_grammar *g, uint32_t r) {
    bool at_start = true;
    for (uint32_t p = g->rule_start[r];; p++) {
        uint32_t t = g->elem[p].type;
        if (t <= GE_ALT) {
            if (at_start) return true;
            if (t == GE_END) return false;
            at_start = true;
        } else {
            at_start = false;
        }
    }
}

/* Iterative DFS for any cycle; fills path with it. */
static bool find_cycle(const lc_graph *G, uint32_t *path, size_t *path_n) {
    uint8_t *color = mu_xcalloc(G->n ? G->n : 1, 1);     /* 0 new, 1 on stack, 2 done */
    uint32_t *depth_of = mu_xmalloc((G->n ? G->n : 1) * sizeof *depth_of);
    uint32_t *st = mu_xmalloc((G->n ? G->n : 1) * sizeof *st), *ei = mu_xmalloc((G->n ? G->n : 1) * sizeof *ei);
    bool found = false;
    for (uint32_t s = 0; s < G->n && !found; s++) {
        if (color[s]) continue;
        size_t top = 0;
        st[0] = s;
        ei[0] = G->off[s];
        color[s] = 1;
        depth_of[s] = 0;
        while (!found) {
            uint32_t u = st[top];
            if (ei[top] < G->off[u + 1]) {
                uint32_t v = G->dst[ei[top]++];
                if (color[v] == 1) {
                    size_t n = 0;
                    for (size_t i = depth_of[v]; i <= top; i++) path[n++] = st[i];
                    path[n++] = v;
                    *path_n = n;
                    found = true;
                } else if (!color[v]) {
                    color[v] = 1;
                    st[++top] = v;
                    ei[top] = G->off[v];
                    depth_of[v] = (uint32_t)top;
                }
            } else {
                color[u] = 2;
                if (top == 0) break;
                top--;
            }
        }
    }
    free(color);
    free(depth_of);
    free(st);
    free(ei);
    return found;
}

static bool check_llama_left_recursion(const mu_grammar *g, mu_error *err) {
    bool *empty = mu_xmalloc(g->n_rules);
    for (uint32_t r = 0; r < g->n_rules; r++) empty[r] = has_empty_alternative(g, r);
    lc_graph G;
    lc_build(g, empty, &G);
    uint32_t *path = mu_xmalloc(((size_t)g->n_rules + 1) * sizeof *path);
    size_t n = 0;
    bool cyc = find_cycle(&G, path, &n);
    if (cyc) {
        char buf[600];
        format_path(g, path, n, buf, sizeof buf);
        mu_err_set(err, "grammar: left recursion: rule '%s' derives itself at its left edge "
                   "(%s); rewrite it right-recursively, e.g. x ::= \"a\" x | \"a\"",
                   g->rule_name[path[0]], buf);
    }
    free(path);
    lc_free(&G);
    free(empty);
    return !cyc;
}

/* ---------------- check 2: stack growth ---------------- */

static bool *compute_nullable(const mu_grammar *g) {
    bool *nul = mu_xcalloc(g->n_rules ? g->n_rules : 1, 1);
    for (bool changed = true; changed;) {
        changed = false;
        for (uint32_t r = 0; r < g->n_rules; r++) {
            if (nul[r]) continue;
            bool alt_ok = true;
            for (uint32_t p = g->rule_start[r];; p++) {
                const gbnf_elem *e = &g->elem[p];
                if (e->type <= GE_ALT) {
                    if (alt_ok) {
                        nul[r] = changed = true;
                        break;
                    }
                    if (e->type == GE_END) break;
                    alt_ok = true;
                } else if (e->type != GE_RULE_REF || !nul[e->value]) {
                    alt_ok = false;
                }
            }
        }
    }
    return nul;
}

static bool *compute_reachable(const mu_grammar *g) {
    bool *seen = mu_xcalloc(g->n_rules ? g->n_rules : 1, 1);
    uint32_t *todo = mu_xmalloc((g->n_rules ? g->n_rules : 1) * sizeof *todo);
    size_t n = 0;
    todo[n++] = g->root;
    seen[g->root] = true;
    while (n) {
        uint32_t r = todo[--n];
        for (uint32_t p = g->rule_start[r]; g->elem[p].type != GE_END; p++) {
            if (g->elem[p].type != GE_RULE_REF || seen[g->elem[p].value]) continue;
            seen[g->elem[p].value] = true;
            todo[n++] = g->elem[p].value;
        }
    }
    free(todo);
    return seen;
}

/* Strongly connected components (iterative Tarjan) over reachable rules. */
static uint32_t *components(const lc_graph *G, const bool *live) {
    uint32_t n = G->n ? G->n : 1, counter = 0, n_comp = 0;
    uint32_t *index = mu_xmalloc(n * sizeof *index), *low = mu_xmalloc(n * sizeof *low);
    uint32_t *comp = mu_xmalloc(n * sizeof *comp);
    uint32_t *cs = mu_xmalloc(n * sizeof *cs), *ce = mu_xmalloc(n * sizeof *ce);
    uint32_t *ss = mu_xmalloc(n * sizeof *ss);
    bool *on = mu_xcalloc(n, 1);
    for (uint32_t i = 0; i < G->n; i++) index[i] = comp[i] = UINT32_MAX;
    for (uint32_t s = 0; s < G->n; s++) {
        if (!live[s] || index[s] != UINT32_MAX) continue;
        size_t top = 0, sn = 0;
        cs[0] = s;
        ce[0] = G->off[s];
        index[s] = low[s] = counter++;
        ss[sn++] = s;
        on[s] = true;
        for (;;) {
            uint32_t u = cs[top];
            if (ce[top] < G->off[u + 1]) {
                uint32_t v = G->dst[ce[top]++];
                if (index[v] == UINT32_MAX) {
                    index[v] = low[v] = counter++;
                    ss[sn++] = v;
                    on[v] = true;
                    cs[++top] = v;
                    ce[top] = G->off[v];
                } else if (on[v] && index[v] < low[u]) {
                    low[u] = index[v];
                }
                continue;
            }
            if (low[u] == index[u]) {
                uint32_t w;
                do {
                    w = ss[--sn];
                    on[w] = false;
                    comp[w] = n_comp;
                } while (w != u);
                n_comp++;
            }
            if (top == 0) break;
            top--;
            if (low[u] < low[cs[top]]) low[cs[top]] = low[u];
        }
    }
    free(index);
    free(low);
    free(cs);
    free(ce);
    free(ss);
    free(on);
    return comp;
}

/* Path from a to b inside one component (BFS), written as a .. b. */
static size_t component_path(const lc_graph *G, const uint32_t *comp, uint32_t a, uint32_t b,
                             uint32_t *path) {
    uint32_t *prev = mu_xmalloc(G->n * sizeof *prev), *q = mu_xmalloc(G->n * sizeof *q);
    for (uint32_t i = 0; i < G->n; i++) prev[i] = UINT32_MAX;
    size_t qh = 0, qt = 0;
    q[qt++] = a;
    prev[a] = a;
    while (qh < qt && prev[b] == UINT32_MAX) {
        uint32_t u = q[qh++];
        for (uint32_t k = G->off[u]; k < G->off[u + 1]; k++) {
            uint32_t v = G->dst[k];
            if (comp[v] != comp[a] || prev[v] != UINT32_MAX) continue;
            prev[v] = u;
            q[qt++] = v;
        }
    }
    size_t n = 0;
    for (uint32_t v = b;; v = prev[v]) {
        path[n++] = v;
        if (v == a || n > G->n) break;
    }
    for (size_t i = 0; i < n / 2; i++) {
        uint32_t t = path[i];
        path[i] = path[n - 1 - i];
        path[n - 1 - i] = t;
    }
    free(prev);
    free(q);
    return n;
}

static bool check_stack_growth(const mu_grammar *g, mu_error *err) {
    bool *nul = compute_nullable(g), *live = compute_reachable(g);
    lc_graph G;
    lc_build(g, nul, &G);
    uint32_t *comp = components(&G, live);
    bool ok = true;
    for (uint32_t u = 0; u < G.n && ok; u++) {
        if (!live[u]) continue;
        for (uint32_t k = G.off[u]; k < G.off[u + 1] && ok; k++) {
            uint32_t v = G.dst[k];
            if (!G.grow[k] || comp[v] != comp[u]) continue;
            uint32_t *path = mu_xmalloc(((size_t)G.n + 2) * sizeof *path);
            path[0] = u;
            size_t n = 1 + component_path(&G, comp, v, u, path + 1);
            char buf[600];
            format_path(g, path, n, buf, sizeof buf);
            mu_err_set(err, "grammar: left recursion through rules that can match the empty "
                       "string: rule '%s' derives itself at its left edge (%s); llama.cpp would "
                       "loop forever on it", g->rule_name[u], buf);
            free(path);
            ok = false;
        }
    }
    free(comp);
    lc_free(&G);
    free(nul);
    free(live);
    return ok;
}

/* ---------------- character classes ---------------- */

static int range_cmp(const void *a, const void *b) {
    const gbnf_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

typedef struct class_builder {
    gbnf_range *tmp;
    size_t tmp_cap;
    uint32_t *slot;     /* class hash table: index + 1 */
    uint32_t slot_mask;
    uint32_t cap_classes, cap_ranges;
} class_builder;

static uint32_t class_hash(const gbnf_range *r, uint32_t n, bool neg) {
    uint64_t h = neg ? 0x9E3779B97F4A7C15ull : 0x243F6A8885A308D3ull;
    for (uint32_t i = 0; i < n; i++) {
        h = (h ^ r[i].lo) * 0x100000001B3ull;
        h = (h ^ r[i].hi) * 0x100000001B3ull;
    }
    return (uint32_t)(h ^ h >> 32);
}

static void class_rehash(mu_grammar *g, class_builder *B) {
    uint32_t cap = B->slot ? (B->slot_mask + 1) * 2 : 256;
    free(B->slot);
    B->slot = mu_xcalloc(cap, sizeof *B->slot);
    B->slot_mask = cap - 1;
    for (uint32_t c = 0; c < g->n_classes; c++) {
        const gbnf_class *k = &g->classes[c];
        uint32_t h = class_hash(g->ranges + k->first, k->n, k->negated) & B->slot_mask;
        while (B->slot[h]) h = (h + 1) & B->slot_mask;
        B->slot[h] = c + 1;
    }
}

/* The class starting at element p (sorted, merged, deduplicated); sets
 * *end to the element after the class. */
static uint32_t intern_class(mu_grammar *g, class_builder *B, uint32_t p, uint32_t *end) {
    size_t n = 0;
    bool neg = g->elem[p].type == GE_CHAR_NOT;
    uint32_t q = p;
    do {
        if (n == B->tmp_cap) {
            B->tmp_cap = B->tmp_cap ? B->tmp_cap * 2 : 64;
            B->tmp = mu_xrealloc(B->tmp, B->tmp_cap * sizeof *B->tmp);
        }
        if (g->elem[q].type == GE_CHAR_ANY) {
            B->tmp[n++] = (gbnf_range){0, UINT32_MAX};
            q++;
        } else if (g->elem[q + 1].type == GE_CHAR_RNG_UPPER) {
            B->tmp[n++] = (gbnf_range){g->elem[q].value, g->elem[q + 1].value};
            q += 2;
        } else {
            B->tmp[n++] = (gbnf_range){g->elem[q].value, g->elem[q].value};
            q++;
        }
    } while (g->elem[q].type == GE_CHAR_ALT);
    *end = q;
    qsort(B->tmp, n, sizeof *B->tmp, range_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && (uint64_t)B->tmp[m - 1].hi + 1 >= B->tmp[i].lo) {
            if (B->tmp[i].hi > B->tmp[m - 1].hi) B->tmp[m - 1].hi = B->tmp[i].hi;
        } else {
            B->tmp[m++] = B->tmp[i];
        }
    }
    if (!B->slot || (g->n_classes + 1) * 2 > B->slot_mask + 1) class_rehash(g, B);
    uint32_t h = class_hash(B->tmp, (uint32_t)m, neg) & B->slot_mask;
    for (; B->slot[h]; h = (h + 1) & B->slot_mask) {
        const gbnf_class *k = &g->classes[B->slot[h] - 1];
        if (k->negated == neg && k->n == m && !memcmp(g->ranges + k->first, B->tmp, m * sizeof *B->tmp))
            return B->slot[h] - 1;
    }
    if (g->n_classes == B->cap_classes) {
        B->cap_classes = B->cap_classes ? B->cap_classes * 2 : 64;
        g->classes = mu_xrealloc(g->classes, B->cap_classes * sizeof *g->classes);
    }
    while (g->n_ranges + m > B->cap_ranges) {
        B->cap_ranges = B->cap_ranges ? B->cap_ranges * 2 : 256;
        g->ranges = mu_xrealloc(g->ranges, B->cap_ranges * sizeof *g->ranges);
    }
    gbnf_class *k = &g->classes[g->n_classes];
    k->first = g->n_ranges;
    k->n = (uint32_t)m;
    k->negated = neg;
    memcpy(g->ranges + g->n_ranges, B->tmp, m * sizeof *B->tmp);
    g->n_ranges += (uint32_t)m;
    k->ascii[0] = k->ascii[1] = 0;
    for (uint32_t cp = 0; cp < 128; cp++) {
        bool in = false;
        for (size_t i = 0; i < m && !in; i++) in = B->tmp[i].lo <= cp && cp <= B->tmp[i].hi;
        if (in != neg) k->ascii[cp >> 6] |= 1ull << (cp & 63);
    }
    B->slot[h] = g->n_classes + 1;
    return g->n_classes++;
}

/* Index of the last range with lo <= cp, or -1. */
static int64_t range_floor(const gbnf_range *r, uint32_t n, uint32_t cp) {
    int64_t a = 0, b = (int64_t)n - 1, best = -1;
    while (a <= b) {
        int64_t mid = (a + b) / 2;
        if (r[mid].lo <= cp) {
            best = mid;
            a = mid + 1;
        } else {
            b = mid - 1;
        }
    }
    return best;
}

bool gbnf_class_match(const mu_grammar *g, uint32_t cls, uint32_t cp) {
    const gbnf_class *k = &g->classes[cls];
    if (cp < 128) return (k->ascii[cp >> 6] >> (cp & 63)) & 1;
    const gbnf_range *r = g->ranges + k->first;
    int64_t i = range_floor(r, k->n, cp);
    bool in = i >= 0 && r[i].hi >= cp;
    return in != k->negated;
}

bool gbnf_class_overlaps(const mu_grammar *g, uint32_t cls, uint32_t lo, uint32_t hi) {
    const gbnf_class *k = &g->classes[cls];
    const gbnf_range *r = g->ranges + k->first;
    int64_t i = range_floor(r, k->n, lo);
    if (k->negated) return !(i >= 0 && r[i].hi >= hi); /* merged ranges: covered by one or not at all */
    if (i >= 0 && r[i].hi >= lo) return true;
    return (uint32_t)(i + 1) < k->n && r[i + 1].lo <= hi;
}

/* ---------------- tables ---------------- */

static void build_alternatives(mu_grammar *g) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < g->n_elem; p++) n += g->elem[p].type <= GE_ALT;
    g->alt = mu_xmalloc((n ? n : 1) * sizeof *g->alt);
    g->alt_off = mu_xmalloc(((size_t)g->n_rules + 1) * sizeof *g->alt_off);
    uint32_t k = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        g->alt_off[r] = k;
        g->alt[k++] = g->rule_start[r];
        for (uint32_t p = g->rule_start[r]; g->elem[p].type != GE_END; p++)
            if (g->elem[p].type == GE_ALT) g->alt[k++] = p + 1;
    }
    g->alt_off[g->n_rules] = k;
}

static void build_terminals(mu_grammar *g) {
    g->kind = mu_xcalloc(g->n_elem ? g->n_elem : 1, 1);
    g->cls = mu_xcalloc(g->n_elem ? g->n_elem : 1, sizeof *g->cls);
    g->next = mu_xcalloc(g->n_elem ? g->n_elem : 1, sizeof *g->next);
    class_builder B = {0};
    for (uint32_t p = 0; p < g->n_elem; p++) {
        switch (g->elem[p].type) {
        case GE_END: case GE_ALT: g->kind[p] = GK_END; break;
        case GE_RULE_REF: g->kind[p] = GK_REF; g->next[p] = p + 1; break;
        case GE_TOKEN: g->kind[p] = GK_TOKEN; g->next[p] = p + 1; break;
        case GE_TOKEN_NOT: g->kind[p] = GK_TOKEN_NOT; g->next[p] = p + 1; break;
        case GE_CHAR: case GE_CHAR_NOT: case GE_CHAR_ANY:
            g->kind[p] = GK_CLASS;
            g->cls[p] = intern_class(g, &B, p, &g->next[p]);
            break;
        default: g->kind[p] = GK_INNER; break;
        }
    }
    free(B.tmp);
    free(B.slot);
}

bool gbnf_compile(mu_grammar *g, mu_error *err) {
    if (!check_llama_left_recursion(g, err) || !check_stack_growth(g, err)) return false;
    build_alternatives(g);
    build_terminals(g);
    return true;
}

/* ---------------- printing ---------------- */

static void print_cp(FILE *f, uint32_t c) {
    if (c == '\\' || c == ']' || c == '[' || c == '"' || c == '-' || c == '^') fprintf(f, "\\%c", c);
    else if (c >= 0x20 && c < 0x7F) fputc((int)c, f);
    else if (c <= 0xFF) fprintf(f, "\\x%02X", c);
    else if (c <= 0xFFFF) fprintf(f, "\\u%04X", c);
    else fprintf(f, "\\U%08X", c);
}

void mu_grammar_print(const mu_grammar *g, FILE *f) {
    for (uint32_t r = 0; r < g->n_rules; r++) {
        fprintf(f, "%s ::=", g->rule_name[r]);
        for (uint32_t p = g->rule_start[r]; g->elem[p].type != GE_END; p++) {
            const gbnf_elem *e = &g->elem[p];
            switch (e->type) {
            case GE_ALT: fprintf(f, " |"); break;
            case GE_RULE_REF: fprintf(f, " %s", g->rule_name[e->value]); break;
            case GE_TOKEN: fprintf(f, " <[%u]>", e->value); break;
            case GE_TOKEN_NOT: fprintf(f, " !<[%u]>", e->value); break;
            case GE_CHAR_ANY: fprintf(f, " ."); break;
            case GE_CHAR: case GE_CHAR_NOT:
                fprintf(f, e->type == GE_CHAR ? " [" : " [^");
                for (uint32_t q = p;; q++) {
                    if (g->elem[q].type == GE_CHAR_RNG_UPPER) fputc('-', f);
                    print_cp(f, g->elem[q].value);
                    uint32_t t = g->elem[q + 1].type;
                    if (t != GE_CHAR_ALT && t != GE_CHAR_RNG_UPPER) {
                        p = q;
                        break;
                    }
                }
                fputc(']', f);
                break;
            default: break;
            }
        }
        fputc('\n', f);
    }
}
