/* Internals shared by the gbnf_*.c files: the compiled grammar, hash-consed
 * parse stacks, strict UTF-8 decoding and the token vocabulary trie. */
#ifndef MUSER_GBNF_INTERNAL_H
#define MUSER_GBNF_INTERNAL_H
#include "grammar/grammar.h"

/* Element types, in llama.cpp's encoding: a rule is a flat run of elements,
 * alternatives separated by ALT, the rule closed by END. A character class
 * is CHAR / CHAR_NOT / CHAR_ANY followed by CHAR_ALT items, any of which
 * may be followed by CHAR_RNG_UPPER to make it a range. */
enum {
    GE_END = 0,
    GE_ALT,
    GE_RULE_REF,
    GE_CHAR,
    GE_CHAR_NOT,
    GE_CHAR_RNG_UPPER,
    GE_CHAR_ALT,
    GE_CHAR_ANY,
    GE_TOKEN,
    GE_TOKEN_NOT,
};

typedef struct gbnf_elem {
    uint32_t type;
    uint32_t value; /* code point, rule index or token id */
} gbnf_elem;

typedef struct gbnf_range {
    uint32_t lo, hi;
} gbnf_range;

typedef struct gbnf_class {
    uint64_t ascii[2];    /* final answer (negation applied) for code points < 128 */
    uint32_t first, n;    /* sorted, merged ranges in grammar->ranges[first..first+n) */
    bool negated;
} gbnf_class;

/* What an element means when it is on top of a stack. */
enum { GK_END = 0, GK_REF, GK_CLASS, GK_TOKEN, GK_TOKEN_NOT, GK_INNER };

struct mu_grammar {
    gbnf_elem *elem;
    uint32_t n_elem;
    uint32_t n_rules;
    uint32_t root;
    uint32_t *rule_start;   /* first element of rule r */
    char **rule_name;       /* generated rules: "<rule>_<n>" as llama.cpp names them */
    uint32_t *alt;          /* first element of each alternative ... */
    uint32_t *alt_off;      /* ... of rule r: alt[alt_off[r] .. alt_off[r + 1]) */
    uint8_t *kind;          /* per element: GK_* */
    uint32_t *cls;          /* per element: class index (GK_CLASS) */
    uint32_t *next;         /* per element: the element after this terminal */
    gbnf_class *classes;
    uint32_t n_classes;
    gbnf_range *ranges;
    uint32_t n_ranges;
};

static inline bool gbnf_is_end(const mu_grammar *g, uint32_t pos) {
    return g->elem[pos].type <= GE_ALT;
}

bool gbnf_class_match(const mu_grammar *g, uint32_t cls, uint32_t cp);
/* Does some code point in [lo, hi] match the class? */
bool gbnf_class_overlaps(const mu_grammar *g, uint32_t cls, uint32_t lo, uint32_t hi);

/* Called by the parser once the rules are complete (gbnf_compile.c):
 * refuses left recursion, then builds the tables above. */
bool gbnf_compile(mu_grammar *g, mu_error *err);

/* ---- growable uint32 vector ---- */

typedef struct gbnf_vec {
    uint32_t *v;
    size_t n, cap;
} gbnf_vec;

static inline void gbnf_vec_push(gbnf_vec *a, uint32_t x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 16;
        a->v = mu_xrealloc(a->v, a->cap * sizeof *a->v);
    }
    a->v[a->n++] = x;
}
void gbnf_vec_reserve(gbnf_vec *a, size_t n);
void gbnf_vec_free(gbnf_vec *a);

/* ---- hash-consed stacks (gbnf_stack.c) ----
 * A stack is a node id: node (pos, parent) = element pos on top of the
 * stack parent. Node 0 is the empty stack (the root rule is complete).
 * Equal stacks get equal ids, so a set of stacks is a sorted id array
 * (a "config"), compared and hashed as plain integers. */

#define GBNF_NIL 0u
#define GBNF_NONE UINT32_MAX
#define GBNF_MAX_NODES (1u << 23)

typedef struct gbnf_node {
    uint32_t pos, parent;
} gbnf_node;

typedef struct gbnf_pool {
    gbnf_node *node;
    uint32_t *mark;      /* per node: epoch of the last visit (dedup while expanding) */
    uint32_t n, cap;
    uint32_t *slot;      /* open addressing over node ids, 0 = empty */
    uint32_t slot_mask;
    uint32_t epoch;
    gbnf_vec todo;       /* scratch for expansion */
} gbnf_pool;

void gbnf_pool_init(gbnf_pool *p);
void gbnf_pool_free(gbnf_pool *p);
void gbnf_pool_copy(gbnf_pool *dst, const gbnf_pool *src);
/* Drop every node not on a stack of cfg; cfg is renumbered and re-sorted. */
void gbnf_pool_compact(gbnf_pool *p, gbnf_vec *cfg);

/* Stacks at the start of the root rule. */
bool gbnf_initial(const mu_grammar *g, gbnf_pool *p, gbnf_vec *out, mu_error *err);
/* The stacks after code point cp (out is cleared first, sorted on return).
 * False only when a limit is hit (err set). An empty out means cp is not
 * allowed. */
bool gbnf_step_cp(const mu_grammar *g, gbnf_pool *p, const uint32_t *cfg, size_t n, uint32_t cp,
                  gbnf_vec *out, mu_error *err);
/* The stacks after a whole token matched by a token terminal. */
bool gbnf_step_token(const mu_grammar *g, gbnf_pool *p, const uint32_t *cfg, size_t n,
                     int32_t id, gbnf_vec *out, mu_error *err);
/* Does some stack have a token terminal on top that token id matches? */
bool gbnf_token_matches(const mu_grammar *g, const gbnf_pool *p, const uint32_t *cfg, size_t n,
                        int32_t id);

/* ---- strict UTF-8 (RFC 3629: no overlongs, surrogates or > U+10FFFF) ---- */

typedef struct gbnf_utf8 {
    uint32_t val;    /* bits so far */
    uint8_t remain;  /* continuation bytes still expected; 0 = between code points */
    uint8_t len;     /* length of the sequence being read */
} gbnf_utf8;

enum { GBNF_U8_MORE, GBNF_U8_CP, GBNF_U8_BAD };

/* Feed one byte: GBNF_U8_CP sets *cp and resets u. BAD leaves u undefined. */
int gbnf_utf8_feed(gbnf_utf8 *u, uint8_t b, uint32_t *cp);
/* The code points a half-read sequence can still become (surrogates and
 * overlongs excluded); false if none. */
bool gbnf_utf8_range(const gbnf_utf8 *u, uint32_t *lo, uint32_t *hi);
/* Can some completion of the half-read sequence u continue a stack of cfg? */
bool gbnf_partial_viable(const mu_grammar *g, const gbnf_pool *p, const uint32_t *cfg, size_t n,
                         const gbnf_utf8 *u);

/* ---- matching state ---- */

struct mu_grammar_state {
    const mu_grammar *g;
    gbnf_pool pool;   /* compact: holds only the stacks of cfg */
    gbnf_vec cfg;     /* sorted live stacks */
    gbnf_utf8 part;   /* half-read code point, if any */
};

/* ---- vocabulary (gbnf_vocab.c) ----
 * The trie is stored in depth-first preorder: node i hangs below the last
 * node before it with depth depth[i] - 1, and skip[i] is the first node
 * after its subtree, so a masking walk is one forward pass that jumps over
 * dead subtrees. Nodes are 8 bytes so the walk streams little memory. */

enum { GV_EOG = 1, GV_NEVER = 2 };

typedef struct gbnf_tnode {
    uint32_t skip;   /* first node after this subtree */
    uint16_t depth;  /* 1 for children of the (implicit) root */
    uint8_t byte;
    uint8_t ntok;    /* tokens ending here; 255 = look at t_tok */
} gbnf_tnode;

struct mu_grammar_vocab {
    int32_t n_vocab;
    char *bytes;
    size_t *off;        /* piece i = bytes[off[i] .. off[i] + len[i]) */
    uint32_t *len;
    uint8_t *flag;      /* GV_* */
    int32_t *eog;       /* ids of EOG tokens */
    uint32_t n_eog;
    uint32_t *normal_bits; /* bitmap of tokens that are neither EOG nor never-allowed */
    uint32_t n_nodes;
    gbnf_tnode *node;
    uint32_t *t_tok;    /* tokens ending at node i: t_ids[t_tok[i] .. t_tok[i + 1]) */
    int32_t *t_ids;
    uint64_t *t_sub;    /* byte classes (gbnf_byte_class) present in the subtree of node i */
    uint32_t max_depth;
};

/* The 64 byte classes of the trie's subtree summaries: each ASCII
 * punctuation character and \t \n \r ' ' alone, other control bytes,
 * digits, upper- and lower-case letters, then UTF-8 continuation, 2-, 3-,
 * 4-byte leads and invalid bytes. A grammar state that returns to itself on
 * every byte of some classes accepts, unwalked, every subtree made only of
 * them (a JSON string body, say). */
static inline unsigned gbnf_byte_class(uint8_t b) {
    if (b >= 0x80) {
        if (b < 0xC0) return 59;
        if (b >= 0xC2 && b <= 0xDF) return 60;
        if (b >= 0xE0 && b <= 0xEF) return 61;
        if (b >= 0xF0 && b <= 0xF4) return 62;
        return 63;
    }
    if (b >= '0' && b <= '9') return 37;
    if (b >= 'A' && b <= 'Z') return 38;
    if (b >= 'a' && b <= 'z') return 39;
    if (b == '\t') return 0;
    if (b == '\n') return 1;
    if (b == '\r') return 2;
    if (b == ' ') return 3;
    if (b < 0x20 || b == 0x7F) return 4;
    if (b <= 0x2F) return 5 + (b - 0x21u);   /* ! .. /  : 5..19 */
    if (b <= 0x40) return 20 + (b - 0x3Au);  /* : .. @  : 20..26 */
    if (b <= 0x60) return 27 + (b - 0x5Bu);  /* [ .. `  : 27..32 */
    return 33 + (b - 0x7Bu);                 /* { .. ~  : 33..36 */
}

static inline const char *gbnf_piece(const mu_grammar_vocab *v, int32_t id, size_t *len) {
    *len = v->len[id];
    return v->bytes + v->off[id];
}

#endif
