/* GBNF text -> rules, following llama-grammar.cpp's recursive descent
 * (llama_grammar_parser) so that the same grammars parse to the same rules:
 * groups become generated rules, repetitions expand exactly as llama.cpp
 * rewrites them (S{m,n} = m copies of S then n-m nested optional rules),
 * with its 2000 repetition / 2000 generated-rule limits. Errors carry the
 * line and column (1-based, columns count code points). */
#include "grammar/gbnf_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_REPETITION 2000      /* llama.cpp MAX_REPETITION_THRESHOLD */
#define MAX_GROUP_DEPTH 256
#define MAX_ELEMENTS (1u << 22)  /* after expansion; guards "long literal"{2000} chains */

typedef struct evec {
    gbnf_elem *e;
    size_t n, cap;
} evec;

typedef struct psym {
    char *name;
    size_t name_len;
    evec body;          /* the rule, END-terminated once defined */
    bool defined, generated;
    size_t def_pos;     /* where the definition starts */
    size_t ref_pos;     /* first reference, SIZE_MAX if none */
} psym;

typedef struct parser {
    const char *s;
    size_t len, pos;
    psym *sym;
    uint32_t n_sym, cap_sym;
    uint32_t *slot;     /* name hash -> named symbol index + 1 */
    uint32_t slot_mask;
    uint64_t n_elems;
    int depth;
    mu_grammar_token_lookup lookup;
    void *lookup_ctx;
    int32_t n_vocab;
    mu_error *err;
    bool failed;
} parser;

/* ---------------- errors ---------------- */

static void line_col(const parser *P, size_t at, size_t *line, size_t *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at && i < P->len; i++) {
        unsigned char c = (unsigned char)P->s[i];
        if (c == '\n') {
            (*line)++;
            *col = 1;
        } else if ((c & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

static bool fail(parser *P, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(parser *P, size_t at, const char *fmt, ...) {
    if (P->failed) return false;
    P->failed = true;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t line, col;
    line_col(P, at, &line, &col);
    mu_err_set(P->err, "grammar: line %zu, column %zu: %s", line, col, msg);
    return false;
}

/* A readable name for the character at offset at ("'x'", "end of line"). */
static const char *describe(const parser *P, size_t at, char *buf, size_t cap) {
    if (at >= P->len) return "end of input";
    unsigned char c = (unsigned char)P->s[at];
    if (c == '\n' || c == '\r') return "end of line";
    if (c >= 0x20 && c < 0x7F) snprintf(buf, cap, "'%c'", c);
    else snprintf(buf, cap, "byte 0x%02X", c);
    return buf;
}

static bool where_opened(const parser *P, size_t at, char *buf, size_t cap) {
    size_t line, col;
    line_col(P, at, &line, &col);
    snprintf(buf, cap, "line %zu, column %zu", line, col);
    return true;
}

/* ---------------- characters ---------------- */

static int cur(const parser *P) {
    return P->pos < P->len ? (unsigned char)P->s[P->pos] : 0;
}

static int peek(const parser *P, size_t k) {
    return P->pos + k < P->len ? (unsigned char)P->s[P->pos + k] : 0;
}

static bool at_end(const parser *P) {
    return P->pos >= P->len;
}

static bool is_digit(int c) {
    return c >= '0' && c <= '9';
}

static bool is_word(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' || is_digit(c);
}

/* Blanks and comments; newlines too where a rule may continue. */
static void skip_space(parser *P, bool newline_ok) {
    while (!at_end(P)) {
        int c = cur(P);
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            P->pos++;
        } else if (c == '#') {
            while (!at_end(P) && cur(P) != '\r' && cur(P) != '\n') P->pos++;
        } else {
            break;
        }
    }
}

static bool parse_hex(parser *P, int digits, char esc, uint32_t *out) {
    size_t start = P->pos - 2; /* the backslash */
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int c = cur(P), d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return fail(P, start, "expected %d hex digits after '\\%c'", digits, esc);
        v = v << 4 | (uint32_t)d;
        P->pos++;
    }
    if (v > 0x10FFFF) return fail(P, start, "escape '\\%c%.*s' is beyond U+10FFFF", esc, digits,
                                  P->s + start + 2);
    *out = v;
    return true;
}

/* One UTF-8 code point of grammar text. */
static bool parse_utf8(parser *P, uint32_t *out) {
    gbnf_utf8 u = {0, 0, 0};
    size_t start = P->pos;
    while (!at_end(P)) {
        int r = gbnf_utf8_feed(&u, (uint8_t)cur(P), out);
        P->pos++;
        if (r == GBNF_U8_CP) return true;
        if (r == GBNF_U8_BAD) break;
    }
    return fail(P, start, "invalid UTF-8 in grammar text");
}

/* A literal or class character, escapes as llama.cpp's parse_char. */
static bool parse_char(parser *P, uint32_t *out) {
    if (cur(P) != '\\') return parse_utf8(P, out);
    size_t start = P->pos;
    int e = peek(P, 1);
    P->pos += 2;
    switch (e) {
    case 'x': return parse_hex(P, 2, 'x', out);
    case 'u': return parse_hex(P, 4, 'u', out);
    case 'U': return parse_hex(P, 8, 'U', out);
    case 't': *out = '\t'; return true;
    case 'r': *out = '\r'; return true;
    case 'n': *out = '\n'; return true;
    case '\\': case '"': case '[': case ']': *out = (uint32_t)e; return true;
    default: {
        if (start + 1 >= P->len) return fail(P, start, "unexpected end of input after '\\'");
        char shown[8];
        snprintf(shown, sizeof shown, "%c", e >= 0x20 && e < 0x7F ? e : '?');
        return fail(P, start, "unknown escape '\\%s' (known: \\n \\r \\t \\\\ \\\" \\[ \\] "
                    "\\xHH \\uHHHH \\UHHHHHHHH)", shown);
    }
    }
}

/* ---------------- symbols ---------------- */

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint32_t new_sym(parser *P, const char *name, size_t n, bool generated) {
    if (P->n_sym == P->cap_sym) {
        P->cap_sym = P->cap_sym ? P->cap_sym * 2 : 64;
        P->sym = mu_xrealloc(P->sym, P->cap_sym * sizeof *P->sym);
    }
    psym *s = &P->sym[P->n_sym];
    memset(s, 0, sizeof *s);
    s->name = mu_xmalloc(n + 1);
    memcpy(s->name, name, n);
    s->name[n] = '\0';
    s->name_len = n;
    s->generated = generated;
    s->ref_pos = SIZE_MAX;
    return P->n_sym++;
}

static void rehash(parser *P) {
    uint32_t cap = P->slot ? (P->slot_mask + 1) * 2 : 256;
    free(P->slot);
    P->slot = mu_xcalloc(cap, sizeof *P->slot);
    P->slot_mask = cap - 1;
    for (uint32_t i = 0; i < P->n_sym; i++) {
        if (P->sym[i].generated) continue;
        uint32_t h = name_hash(P->sym[i].name, P->sym[i].name_len) & P->slot_mask;
        while (P->slot[h]) h = (h + 1) & P->slot_mask;
        P->slot[h] = i + 1;
    }
}

/* The symbol for a user name, created on first mention (as llama.cpp's
 * get_symbol_id, so symbol counts match its generated-rule limit). */
static uint32_t named_sym(parser *P, const char *name, size_t n) {
    if (!P->slot || (P->n_sym + 1) * 2 > P->slot_mask + 1) rehash(P);
    uint32_t h = name_hash(name, n) & P->slot_mask;
    for (; P->slot[h]; h = (h + 1) & P->slot_mask) {
        psym *s = &P->sym[P->slot[h] - 1];
        if (s->name_len == n && !memcmp(s->name, name, n)) return P->slot[h] - 1;
    }
    uint32_t id = new_sym(P, name, n, false);
    P->slot[h] = id + 1;
    return id;
}

/* A generated rule "<base>_<id>", as llama.cpp's generate_symbol_id. */
static uint32_t generated_sym(parser *P, uint32_t base) {
    char buf[64];
    int n = snprintf(buf, sizeof buf, "_%u", P->n_sym);
    size_t bl = P->sym[base].name_len;
    char *name = mu_xmalloc(bl + (size_t)n + 1);
    memcpy(name, P->sym[base].name, bl);
    memcpy(name + bl, buf, (size_t)n + 1);
    uint32_t id = new_sym(P, name, bl + (size_t)n, true);
    free(name);
    return id;
}

/* ---------------- rule bodies ---------------- */

static bool push(parser *P, evec *r, uint32_t type, uint32_t value) {
    if (++P->n_elems > MAX_ELEMENTS)
        return fail(P, P->pos, "grammar too large: more than %u elements after expanding "
                    "repetitions", MAX_ELEMENTS);
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->e = mu_xrealloc(r->e, r->cap * sizeof *r->e);
    }
    r->e[r->n++] = (gbnf_elem){type, value};
    return true;
}

static void set_rule(parser *P, uint32_t id, evec *body) {
    free(P->sym[id].body.e);
    P->sym[id].body = *body;
    memset(body, 0, sizeof *body);
}

/* Sequence state: where the last item starts (what a repetition operator
 * applies to) and how many rules it stands for (llama.cpp's n_prev_rules). */
typedef struct seq {
    uint32_t rule_sym; /* the user rule being parsed: base name of generated rules */
    evec *rule;
    size_t last_start;
    uint64_t n_prev_rules;
    bool nested;
} seq;

/* S{min,max} (max == UINT64_MAX: unbounded), rewritten as llama.cpp does:
 * S repeated min times, then either S' ::= S S' | (unbounded) or a chain of
 * max-min nested optional rules S'(k) ::= S S'(k-1) |. */
static bool repeat(parser *P, seq *q, uint64_t min, uint64_t max, size_t op_pos, const char *op) {
    bool unbounded = max == UINT64_MAX;
    if (q->last_start == q->rule->n) return fail(P, op_pos, "'%s' has nothing to repeat", op);
    uint64_t total = (!unbounded && max > 0) ? max : (min > 0 ? min : 1);
    if (q->n_prev_rules * total >= MAX_REPETITION)
        return fail(P, op_pos, "repetition expands to too many rules (%llu x %llu >= %d, "
                    "llama.cpp's limit); reduce the count or the repeated group",
                    (unsigned long long)q->n_prev_rules, (unsigned long long)total,
                    MAX_REPETITION);
    size_t plen = q->rule->n - q->last_start;
    gbnf_elem *prev = mu_xmalloc((plen ? plen : 1) * sizeof *prev);
    memcpy(prev, q->rule->e + q->last_start, plen * sizeof *prev);
    bool ok = true;
    if (min == 0) {
        P->n_elems -= plen;
        q->rule->n = q->last_start;
    } else {
        for (uint64_t i = 1; i < min && ok; i++)
            for (size_t k = 0; k < plen && ok; k++) ok = push(P, q->rule, prev[k].type, prev[k].value);
    }
    uint64_t n_opt = unbounded ? 1 : max - min;
    uint32_t last_rec = 0;
    for (uint64_t i = 0; i < n_opt && ok; i++) {
        evec rec = {0};
        uint32_t id = generated_sym(P, q->rule_sym);
        for (size_t k = 0; k < plen && ok; k++) ok = push(P, &rec, prev[k].type, prev[k].value);
        if (ok && (i > 0 || unbounded)) ok = push(P, &rec, GE_RULE_REF, unbounded ? id : last_rec);
        if (ok) ok = push(P, &rec, GE_ALT, 0) && push(P, &rec, GE_END, 0);
        set_rule(P, id, &rec);
        free(rec.e);
        last_rec = id;
    }
    if (ok && n_opt > 0) ok = push(P, q->rule, GE_RULE_REF, last_rec);
    free(prev);
    q->n_prev_rules *= total;
    return ok;
}

/* A count inside {...}: digits, at most MAX_REPETITION. */
static bool parse_count(parser *P, uint64_t *out) {
    size_t start = P->pos;
    uint64_t v = 0;
    while (is_digit(cur(P))) {
        if (v <= MAX_REPETITION) v = v * 10 + (uint64_t)(cur(P) - '0');
        P->pos++;
    }
    if (v > MAX_REPETITION)
        return fail(P, start, "repetition count %.*s exceeds the limit of %d",
                    (int)(P->pos - start > 24 ? 24 : P->pos - start), P->s + start, MAX_REPETITION);
    *out = v;
    return true;
}

static bool parse_braces(parser *P, seq *q) {
    size_t open = P->pos;
    P->pos++;
    skip_space(P, q->nested);
    char buf[16];
    if (!is_digit(cur(P)))
        return fail(P, P->pos, "expected a number after '{', found %s",
                    describe(P, P->pos, buf, sizeof buf));
    uint64_t min = 0, max = UINT64_MAX;
    if (!parse_count(P, &min)) return false;
    skip_space(P, q->nested);
    if (cur(P) == '}') {
        max = min;
    } else if (cur(P) == ',') {
        P->pos++;
        skip_space(P, q->nested);
        if (is_digit(cur(P))) {
            if (!parse_count(P, &max)) return false;
            skip_space(P, q->nested);
        }
        if (cur(P) != '}') {
            char at[64];
            where_opened(P, open, at, sizeof at);
            return fail(P, P->pos, "expected '}' to close the repetition opened at %s, found %s",
                        at, describe(P, P->pos, buf, sizeof buf));
        }
    } else {
        return fail(P, P->pos, "expected ',' or '}' in repetition, found %s",
                    describe(P, P->pos, buf, sizeof buf));
    }
    P->pos++;
    skip_space(P, q->nested);
    if (max != UINT64_MAX && max < min)
        return fail(P, open, "repetition {%llu,%llu}: the minimum exceeds the maximum",
                    (unsigned long long)min, (unsigned long long)max);
    return repeat(P, q, min, max, open, "{");
}

static bool parse_literal(parser *P, seq *q) {
    size_t open = P->pos;
    P->pos++;
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    while (cur(P) != '"' || at_end(P)) {
        if (at_end(P)) {
            char at[64];
            where_opened(P, open, at, sizeof at);
            return fail(P, P->pos, "expected '\"' to close the string opened at %s", at);
        }
        uint32_t cp;
        if (!parse_char(P, &cp) || !push(P, q->rule, GE_CHAR, cp)) return false;
    }
    P->pos++;
    skip_space(P, q->nested);
    return true;
}

static bool parse_class(parser *P, seq *q) {
    size_t open = P->pos;
    P->pos++;
    uint32_t first_type = GE_CHAR;
    if (cur(P) == '^') {
        P->pos++;
        first_type = GE_CHAR_NOT;
    }
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    while (cur(P) != ']' || at_end(P)) {
        if (at_end(P)) {
            char at[64];
            where_opened(P, open, at, sizeof at);
            return fail(P, P->pos, "expected ']' to close the character class opened at %s", at);
        }
        size_t item = P->pos;
        uint32_t lo, hi;
        if (!parse_char(P, &lo)) return false;
        uint32_t type = q->rule->n > q->last_start ? GE_CHAR_ALT : first_type;
        if (!push(P, q->rule, type, lo)) return false;
        if (cur(P) == '-' && peek(P, 1) != ']' && !at_end(P)) {
            if (P->pos + 1 >= P->len) {
                P->pos++;
                continue; /* reported as the unclosed class */
            }
            P->pos++;
            if (!parse_char(P, &hi)) return false;
            if (hi < lo)
                return fail(P, item, "reversed range in character class: U+%04X-U+%04X", lo, hi);
            if (!push(P, q->rule, GE_CHAR_RNG_UPPER, hi)) return false;
        }
    }
    if (q->rule->n == q->last_start)
        return fail(P, open, "empty character class '%s' matches nothing",
                    first_type == GE_CHAR ? "[]" : "[^]");
    P->pos++;
    skip_space(P, q->nested);
    return true;
}

/* <[id]>, <token-text>, optionally negated with '!'. */
static bool parse_token(parser *P, seq *q) {
    size_t start = P->pos;
    uint32_t type = GE_TOKEN;
    char buf[16];
    if (cur(P) == '!') {
        type = GE_TOKEN_NOT;
        P->pos++;
        if (cur(P) != '<')
            return fail(P, P->pos, "expected '<' after '!', found %s",
                        describe(P, P->pos, buf, sizeof buf));
    }
    size_t lt = P->pos;
    P->pos++;
    int64_t id;
    if (cur(P) == '[') {
        P->pos++;
        size_t ds = P->pos;
        uint64_t v = 0;
        while (is_digit(cur(P))) {
            if (v <= INT32_MAX) v = v * 10 + (uint64_t)(cur(P) - '0');
            P->pos++;
        }
        if (P->pos == ds)
            return fail(P, P->pos, "expected a token id after '<[', found %s",
                        describe(P, P->pos, buf, sizeof buf));
        if (v > INT32_MAX)
            return fail(P, ds, "token id %.*s is out of range", (int)(P->pos - ds > 24 ? 24 : P->pos - ds),
                        P->s + ds);
        if (cur(P) != ']')
            return fail(P, P->pos, "expected ']' after the token id, found %s",
                        describe(P, P->pos, buf, sizeof buf));
        P->pos++;
        if (cur(P) != '>')
            return fail(P, P->pos, "expected '>' to close the token, found %s",
                        describe(P, P->pos, buf, sizeof buf));
        P->pos++;
        id = (int64_t)v;
    } else {
        while (!at_end(P) && cur(P) != '>') P->pos++;
        if (at_end(P)) {
            char at[64];
            where_opened(P, lt, at, sizeof at);
            return fail(P, P->pos, "expected '>' to close the token text opened at %s", at);
        }
        P->pos++;
        size_t n = P->pos - lt;
        int shown = n > 64 ? 64 : (int)n;
        if (!P->lookup)
            return fail(P, lt, "token text %.*s needs a vocabulary to resolve (use <[id]> or "
                        "parse with a vocabulary)", shown, P->s + lt);
        id = P->lookup(P->lookup_ctx, P->s + lt, n);
        if (id < 0) return fail(P, lt, "%.*s is not exactly one token of the vocabulary", shown,
                                P->s + lt);
    }
    if (P->n_vocab > 0 && id >= P->n_vocab)
        return fail(P, start, "token id %lld is out of range (the vocabulary has %d tokens)",
                    (long long)id, P->n_vocab);
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    if (!push(P, q->rule, type, (uint32_t)id)) return false;
    skip_space(P, q->nested);
    return true;
}

static bool parse_alternates(parser *P, uint32_t rule_sym, uint32_t target, bool nested);

static bool parse_group(parser *P, seq *q) {
    size_t open = P->pos;
    if (P->depth >= MAX_GROUP_DEPTH)
        return fail(P, open, "groups nested deeper than %d levels", MAX_GROUP_DEPTH);
    P->pos++;
    skip_space(P, true);
    uint32_t n_before = P->n_sym;
    uint32_t sub = generated_sym(P, q->rule_sym);
    P->depth++;
    bool ok = parse_alternates(P, q->rule_sym, sub, true);
    P->depth--;
    if (!ok) return false;
    q->n_prev_rules = P->n_sym - n_before > 1 ? P->n_sym - n_before : 1;
    q->last_start = q->rule->n;
    if (!push(P, q->rule, GE_RULE_REF, sub)) return false;
    if (cur(P) != ')' || at_end(P)) {
        char at[64], buf[16];
        where_opened(P, open, at, sizeof at);
        return fail(P, P->pos, "expected ')' to close the group opened at %s, found %s", at,
                    describe(P, P->pos, buf, sizeof buf));
    }
    P->pos++;
    skip_space(P, q->nested);
    return true;
}

static bool parse_reference(parser *P, seq *q) {
    size_t start = P->pos;
    while (is_word(cur(P)) && !at_end(P)) P->pos++;
    uint32_t id = named_sym(P, P->s + start, P->pos - start);
    if (P->sym[id].ref_pos == SIZE_MAX) P->sym[id].ref_pos = start;
    skip_space(P, q->nested);
    q->last_start = q->rule->n;
    q->n_prev_rules = 1;
    return push(P, q->rule, GE_RULE_REF, id);
}

static bool parse_sequence(parser *P, seq *q) {
    for (;;) {
        if (at_end(P)) return true;
        int c = cur(P);
        size_t op = P->pos;
        bool ok;
        if (c == '"') ok = parse_literal(P, q);
        else if (c == '[') ok = parse_class(P, q);
        else if (c == '<' || c == '!') ok = parse_token(P, q);
        else if (is_word(c)) ok = parse_reference(P, q);
        else if (c == '(') ok = parse_group(P, q);
        else if (c == '{') ok = parse_braces(P, q);
        else if (c == '.') {
            q->last_start = q->rule->n;
            q->n_prev_rules = 1;
            ok = push(P, q->rule, GE_CHAR_ANY, 0);
            P->pos++;
            skip_space(P, q->nested);
        } else if (c == '*' || c == '+' || c == '?') {
            P->pos++;
            skip_space(P, q->nested);
            char opname[2] = {(char)c, 0};
            ok = repeat(P, q, c == '+' ? 1 : 0, c == '?' ? 1 : UINT64_MAX, op, opname);
        } else {
            return true;
        }
        if (!ok) return false;
    }
}

static bool parse_alternates(parser *P, uint32_t rule_sym, uint32_t target, bool nested) {
    evec rule = {0};
    seq q = {rule_sym, &rule, 0, 1, nested};
    bool ok = parse_sequence(P, &q);
    while (ok && cur(P) == '|' && !at_end(P)) {
        ok = push(P, &rule, GE_ALT, 0);
        P->pos++;
        skip_space(P, true);
        q.last_start = rule.n;
        q.n_prev_rules = 1;
        if (ok) ok = parse_sequence(P, &q);
    }
    if (ok) ok = push(P, &rule, GE_END, 0);
    if (ok) set_rule(P, target, &rule);
    free(rule.e);
    return ok;
}

static bool parse_rule(parser *P) {
    size_t start = P->pos;
    char buf[16];
    while (is_word(cur(P)) && !at_end(P)) P->pos++;
    if (P->pos == start)
        return fail(P, start, "expected a rule name, found %s", describe(P, start, buf, sizeof buf));
    size_t name_end = P->pos;
    skip_space(P, false);
    if (!(peek(P, 0) == ':' && peek(P, 1) == ':' && peek(P, 2) == '='))
        return fail(P, P->pos, "expected '::=' after the rule name '%.*s', found %s",
                    (int)(name_end - start > 64 ? 64 : name_end - start), P->s + start,
                    describe(P, P->pos, buf, sizeof buf));
    uint32_t id = named_sym(P, P->s + start, name_end - start);
    psym *s = &P->sym[id];
    if (s->defined) {
        char at[64];
        where_opened(P, s->def_pos, at, sizeof at);
        return fail(P, start, "rule '%s' is defined twice (first at %s)", s->name, at);
    }
    s->defined = true;
    s->def_pos = start;
    P->pos += 3;
    skip_space(P, true);
    if (!parse_alternates(P, id, id, false)) return false;
    if (cur(P) == '\r' && !at_end(P)) {
        P->pos += peek(P, 1) == '\n' ? 2 : 1;
    } else if (cur(P) == '\n' && !at_end(P)) {
        P->pos++;
    } else if (!at_end(P)) {
        return fail(P, P->pos, "expected the end of the line after rule '%s', found %s",
                    P->sym[id].name, describe(P, P->pos, buf, sizeof buf));
    }
    skip_space(P, true);
    return true;
}

/* ---------------- result ---------------- */

static bool check_defined(parser *P, const char *root) {
    for (uint32_t i = 0; i < P->n_sym; i++) {
        const psym *s = &P->sym[i];
        if (!s->defined && !s->generated)
            return fail(P, s->ref_pos, "undefined rule '%s'", s->name);
    }
    for (uint32_t i = 0; i < P->n_sym; i++)
        if (!P->sym[i].generated && !strcmp(P->sym[i].name, root)) return true;
    mu_err_set(P->err, "grammar: no rule named '%s' (the start rule)", root);
    P->failed = true;
    return false;
}

static mu_grammar *build(parser *P, const char *root) {
    mu_grammar *g = mu_xcalloc(1, sizeof *g);
    g->n_rules = P->n_sym;
    g->rule_start = mu_xmalloc(P->n_sym * sizeof *g->rule_start);
    g->rule_name = mu_xmalloc(P->n_sym * sizeof *g->rule_name);
    size_t total = 0;
    for (uint32_t i = 0; i < P->n_sym; i++) total += P->sym[i].body.n;
    g->elem = mu_xmalloc(total * sizeof *g->elem);
    g->n_elem = (uint32_t)total;
    size_t at = 0;
    for (uint32_t i = 0; i < P->n_sym; i++) {
        psym *s = &P->sym[i];
        g->rule_start[i] = (uint32_t)at;
        memcpy(g->elem + at, s->body.e, s->body.n * sizeof *g->elem);
        at += s->body.n;
        g->rule_name[i] = s->name;
        s->name = NULL;
        if (!s->generated && !strcmp(g->rule_name[i], root)) g->root = i;
    }
    return g;
}

static void parser_free(parser *P) {
    for (uint32_t i = 0; i < P->n_sym; i++) {
        free(P->sym[i].name);
        free(P->sym[i].body.e);
    }
    free(P->sym);
    free(P->slot);
}

mu_grammar *mu_grammar_parse_ex(const char *text, size_t len, const char *root,
                                mu_grammar_token_lookup lookup, void *lookup_ctx, int32_t n_vocab,
                                mu_error *err) {
    if (!root) root = "root";
    parser P = {.s = text, .len = text ? len : 0, .lookup = lookup, .lookup_ctx = lookup_ctx,
                .n_vocab = n_vocab, .err = err};
    const char *nul = P.len ? memchr(text, '\0', P.len) : NULL;
    if (nul) {
        fail(&P, (size_t)(nul - text), "NUL byte in grammar text");
        return NULL;
    }
    skip_space(&P, true);
    if (at_end(&P)) {
        mu_err_set(err, "grammar: empty (no rules)");
        return NULL;
    }
    bool ok = true;
    while (ok && !at_end(&P)) ok = parse_rule(&P);
    if (ok) ok = check_defined(&P, root);
    mu_grammar *g = ok ? build(&P, root) : NULL;
    parser_free(&P);
    if (g && !gbnf_compile(g, err)) {
        mu_grammar_free(g);
        g = NULL;
    }
    return g;
}

mu_grammar *mu_grammar_parse(const char *text, size_t len, const char *root, mu_error *err) {
    return mu_grammar_parse_ex(text, len, root, NULL, NULL, 0, err);
}

static int32_t vocab_lookup(void *ctx, const char *text, size_t len) {
    int32_t id = mu_grammar_vocab_find(ctx, text, len);
    return id >= 0 ? id : -1;
}

mu_grammar *mu_grammar_parse_with_vocab(const char *text, size_t len, const char *root,
                                        const mu_grammar_vocab *vocab, mu_error *err) {
    return mu_grammar_parse_ex(text, len, root, vocab_lookup, (void *)vocab,
                               mu_grammar_vocab_size(vocab), err);
}

void mu_grammar_free(mu_grammar *g) {
    if (!g) return;
    for (uint32_t i = 0; i < g->n_rules; i++) free(g->rule_name[i]);
    free(g->rule_name);
    free(g->rule_start);
    free(g->elem);
    free(g->alt);
    free(g->alt_off);
    free(g->kind);
    free(g->cls);
    free(g->next);
    free(g->classes);
    free(g->ranges);
    free(g);
}

size_t mu_grammar_n_rules(const mu_grammar *g) {
    return g->n_rules;
}
