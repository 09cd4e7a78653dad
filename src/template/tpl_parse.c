/* Parser: token stream -> AST, following jinja2's grammar and precedence
 * (parser.py): condexpr < or < and < not < compare < +,- < ~ < *,/,//,%
 * < ** (left-assoc) < unary < postfix/filters/tests. */
#include "template/tpl_lex.h"
#include <stdio.h>
#include <stdlib.h>

#define MAX_NEST 200

typedef struct P {
    mu_template *t;
    mu_error *err;
    tpl_token *tok;
    size_t ntok, i;
    bool failed;
    bool soft;      /* inside an if / conditional expression (jinja's soft frame) */
    int loop_depth; /* for break / continue */
    int nest;       /* recursion guard */
    uint8_t *macro_flags;
    const char *const *end_stack[64];
    int nend;
    const char *tag_stack[64];
    int ntag;
} P;

typedef struct nvec {
    tpl_node **v;
    size_t n, cap;
} nvec;

static void nvec_push(P *p, nvec *v, tpl_node *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        tpl_node **nv = tpl_arena_alloc(&p->t->arena, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static tpl_nodes nvec_done(nvec *v) { return (tpl_nodes){v->v, v->n}; }

static tpl_token *cur(P *p) { return &p->tok[p->i]; }
static tpl_token *look(P *p) { return &p->tok[p->i + 1 < p->ntok ? p->i + 1 : p->i]; }
static void adv(P *p) {
    if (p->i + 1 < p->ntok) p->i++;
}

static bool tok_is_name(const tpl_token *k, const char *name) {
    return k->type == T_NAME && k->n == strlen(name) && memcmp(k->p, name, k->n) == 0;
}
static bool tok_is_op(const tpl_token *k, int op) { return k->type == T_OP && k->op == op; }

static void describe(const tpl_token *k, char *out, size_t cap) {
    switch (k->type) {
    case T_NAME: snprintf(out, cap, "%.*s", (int)k->n, k->p); break;
    case T_OP: snprintf(out, cap, "%s", tpl_op_text(k->op)); break;
    case T_STRING: snprintf(out, cap, "string"); break;
    case T_INT: snprintf(out, cap, "integer"); break;
    case T_FLOAT: snprintf(out, cap, "float"); break;
    case T_BEND: snprintf(out, cap, "end of statement block"); break;
    case T_VEND: snprintf(out, cap, "end of print statement"); break;
    case T_BBEGIN: snprintf(out, cap, "begin of statement block"); break;
    case T_VBEGIN: snprintf(out, cap, "begin of print statement"); break;
    case T_DATA: snprintf(out, cap, "template data / text"); break;
    default: snprintf(out, cap, "end of template"); break;
    }
}

static void *fail_at(P *p, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void *fail_at(P *p, size_t pos, const char *fmt, ...) {
    if (p->failed) return NULL;
    p->failed = true;
    int line, col;
    tpl_line_col(p->t, pos, &line, &col);
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mu_err_set(p->err, "%s:%d:%d: %s", p->t->name, line, col, msg);
    return NULL;
}

static bool expect_fail(P *p, const char *what) {
    char got[128];
    describe(cur(p), got, sizeof got);
    if (cur(p)->type == T_EOF)
        fail_at(p, cur(p)->pos, "unexpected end of template, expected '%s'.", what);
    else
        fail_at(p, cur(p)->pos, "expected token '%s', got '%s'", what, got);
    return false;
}

static bool expect_op(P *p, int op) {
    if (tok_is_op(cur(p), op)) {
        adv(p);
        return true;
    }
    return expect_fail(p, tpl_op_text(op));
}

static bool expect_type(P *p, int type) {
    if (cur(p)->type == type) {
        adv(p);
        return true;
    }
    return expect_fail(p, type == T_BEND   ? "end of statement block"
                          : type == T_VEND ? "end of print statement"
                                           : "name");
}

static tpl_token *expect_name(P *p) {
    tpl_token *k = cur(p);
    if (k->type == T_NAME) {
        adv(p);
        return k;
    }
    expect_fail(p, "name");
    return NULL;
}

static bool expect_keyword(P *p, const char *name) {
    if (tok_is_name(cur(p), name)) {
        adv(p);
        return true;
    }
    return expect_fail(p, name);
}

static tpl_node *node(P *p, int kind, size_t pos) {
    tpl_node *n = tpl_arena_alloc(&p->t->arena, sizeof *n);
    n->kind = (uint8_t)kind;
    n->pos = (uint32_t)pos;
    n->value = tv_undef_anon();
    n->builtin = -1;
    return n;
}

static tv_str *name_str(P *p, const tpl_token *k) { return tpl_intern(p->t, k->p, k->n); }

/* ------------------------------------------------------------ expressions */
static tpl_node *parse_expression(P *p, bool with_condexpr);
static tpl_node *parse_tuple(P *p, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens);
static tpl_node *parse_unary(P *p, bool with_filter);
static tpl_node *parse_primary(P *p);
static tpl_node *parse_postfix(P *p, tpl_node *n);
static tpl_node *parse_filter(P *p, tpl_node *n, bool start_inline);

static void mark_soft(tpl_node *n) {
    if (!n) return;
    if (n->kind == N_FILTER || n->kind == N_TEST) n->flags |= NF_SOFT;
    mark_soft(n->a);
    mark_soft(n->b);
    mark_soft(n->c);
    mark_soft(n->d);
    for (size_t i = 0; i < n->list.n; i++) mark_soft(n->list.v[i]);
    for (size_t i = 0; i < n->list2.n; i++) mark_soft(n->list2.v[i]);
}

static tpl_node *parse_condexpr(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *e1 = parse_expression(p, false);
    while (e1 && tok_is_name(cur(p), "if")) {
        adv(p);
        bool soft = p->soft;
        p->soft = true;
        mark_soft(e1);
        tpl_node *e2 = parse_expression(p, false), *e3 = NULL;
        if (e2 && tok_is_name(cur(p), "else")) {
            adv(p);
            e3 = parse_condexpr(p);
            if (!e3) e2 = NULL;
        }
        p->soft = soft;
        if (!e2) return NULL;
        tpl_node *c = node(p, N_COND, pos);
        c->a = e2;
        c->b = e1;
        c->c = e3;
        e1 = c;
        pos = cur(p)->pos;
    }
    return e1;
}

static tpl_node *parse_not(P *p);

static tpl_node *parse_bool_chain(P *p, bool is_or) {
    size_t pos = cur(p)->pos;
    tpl_node *l = is_or ? parse_bool_chain(p, false) : parse_not(p);
    while (l && tok_is_name(cur(p), is_or ? "or" : "and")) {
        adv(p);
        tpl_node *r = is_or ? parse_bool_chain(p, false) : parse_not(p);
        if (!r) return NULL;
        tpl_node *n = node(p, is_or ? N_OR : N_AND, pos);
        n->a = l;
        n->b = r;
        l = n;
    }
    return l;
}

static tpl_node *parse_expression(P *p, bool with_condexpr) {
    if (++p->nest > MAX_NEST) return fail_at(p, cur(p)->pos, "expression nested too deeply");
    tpl_node *n = with_condexpr ? parse_condexpr(p) : parse_bool_chain(p, true);
    p->nest--;
    return n;
}

static tpl_node *parse_math1(P *p);

static tpl_node *parse_compare(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *e = parse_math1(p);
    if (!e) return NULL;
    nvec ops = {0};
    for (;;) {
        tpl_token *k = cur(p);
        int op = -1;
        if (k->type == T_OP) {
            switch (k->op) {
            case O_EQ: op = OP_EQ; break;
            case O_NE: op = OP_NE; break;
            case O_LT: op = OP_LT; break;
            case O_LTEQ: op = OP_LE; break;
            case O_GT: op = OP_GT; break;
            case O_GTEQ: op = OP_GE; break;
            default: break;
            }
            if (op >= 0) adv(p);
        } else if (tok_is_name(k, "in")) {
            op = OP_IN;
            adv(p);
        } else if (tok_is_name(k, "not") && tok_is_name(look(p), "in")) {
            op = OP_NOTIN;
            adv(p);
            adv(p);
        }
        if (op < 0) break;
        size_t opos = cur(p)->pos;
        tpl_node *r = parse_math1(p);
        if (!r) return NULL;
        tpl_node *o = node(p, N_COMPARE, opos);
        o->op = (uint8_t)op;
        o->a = r;
        nvec_push(p, &ops, o);
    }
    if (!ops.n) return e;
    tpl_node *c = node(p, N_COMPARE, pos);
    c->a = e;
    c->list = nvec_done(&ops);
    return c;
}

static tpl_node *parse_not(P *p) {
    if (tok_is_name(cur(p), "not")) {
        size_t pos = cur(p)->pos;
        adv(p);
        if (++p->nest > MAX_NEST) return fail_at(p, pos, "expression nested too deeply");
        tpl_node *x = parse_not(p);
        p->nest--;
        if (!x) return NULL;
        tpl_node *n = node(p, N_NOT, pos);
        n->a = x;
        return n;
    }
    return parse_compare(p);
}

static tpl_node *binop(P *p, int op, tpl_node *l, tpl_node *r, size_t pos) {
    tpl_node *n = node(p, N_BINOP, pos);
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static tpl_node *parse_pow(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *l = parse_unary(p, true);
    while (l && tok_is_op(cur(p), O_POW)) {
        adv(p);
        tpl_node *r = parse_unary(p, true);
        if (!r) return NULL;
        l = binop(p, OP_POW, l, r, pos);
    }
    return l;
}

static tpl_node *parse_math2(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *l = parse_pow(p);
    while (l && cur(p)->type == T_OP) {
        int op = cur(p)->op == O_MUL        ? OP_MUL
                 : cur(p)->op == O_DIV      ? OP_DIV
                 : cur(p)->op == O_FLOORDIV ? OP_FLOORDIV
                 : cur(p)->op == O_MOD      ? OP_MOD
                                            : -1;
        if (op < 0) break;
        adv(p);
        tpl_node *r = parse_pow(p);
        if (!r) return NULL;
        l = binop(p, op, l, r, pos);
    }
    return l;
}

static tpl_node *parse_concat(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *first = parse_math2(p);
    if (!first || !tok_is_op(cur(p), O_TILDE)) return first;
    nvec args = {0};
    nvec_push(p, &args, first);
    while (tok_is_op(cur(p), O_TILDE)) {
        adv(p);
        tpl_node *x = parse_math2(p);
        if (!x) return NULL;
        nvec_push(p, &args, x);
    }
    tpl_node *n = node(p, N_CONCAT, pos);
    n->list = nvec_done(&args);
    return n;
}

static tpl_node *parse_math1(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *l = parse_concat(p);
    while (l && (tok_is_op(cur(p), O_ADD) || tok_is_op(cur(p), O_SUB))) {
        int op = cur(p)->op == O_ADD ? OP_ADD : OP_SUB;
        adv(p);
        tpl_node *r = parse_concat(p);
        if (!r) return NULL;
        l = binop(p, op, l, r, pos);
    }
    return l;
}

/* Arguments of a call, filter or test: ( args, k=v, *a, **kw ). */
static bool parse_call_args(P *p, tpl_node *n) {
    size_t pos = cur(p)->pos;
    if (!expect_op(p, O_LPAREN)) return false;
    nvec args = {0}, kwv = {0};
    tv_str **kwn = NULL;
    size_t nkw = 0, capkw = 0;
    bool require_comma = false;
    while (!tok_is_op(cur(p), O_RPAREN)) {
        if (require_comma) {
            if (!expect_op(p, O_COMMA)) return false;
            if (tok_is_op(cur(p), O_RPAREN)) break;
        }
        if (tok_is_op(cur(p), O_MUL)) {
            if (n->c || n->d) return fail_at(p, pos, "invalid syntax for function call expression"), false;
            adv(p);
            if (!(n->c = parse_expression(p, true))) return false;
        } else if (tok_is_op(cur(p), O_POW)) {
            if (n->d) return fail_at(p, pos, "invalid syntax for function call expression"), false;
            adv(p);
            if (!(n->d = parse_expression(p, true))) return false;
        } else if (cur(p)->type == T_NAME && tok_is_op(look(p), O_ASSIGN)) {
            if (n->d) return fail_at(p, pos, "invalid syntax for function call expression"), false;
            tv_str *key = name_str(p, cur(p));
            for (size_t k = 0; k < nkw; k++) /* Python rejects f(a=1, a=2) when compiling */
                if (tv_str_eq(kwn[k], key->s, key->len))
                    return fail_at(p, cur(p)->pos, "keyword argument repeated: %s", key->s), false;
            adv(p);
            adv(p);
            tpl_node *v = parse_expression(p, true);
            if (!v) return false;
            if (nkw == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                tv_str **nk = tpl_arena_alloc(&p->t->arena, capkw * sizeof *nk);
                if (nkw) memcpy(nk, kwn, nkw * sizeof *nk);
                kwn = nk;
            }
            kwn[nkw++] = key;
            nvec_push(p, &kwv, v);
        } else {
            if (n->c || n->d || nkw) return fail_at(p, pos, "invalid syntax for function call expression"), false;
            tpl_node *v = parse_expression(p, true);
            if (!v) return false;
            nvec_push(p, &args, v);
        }
        require_comma = true;
    }
    if (!expect_op(p, O_RPAREN)) return false;
    n->list = nvec_done(&args);
    n->list2 = nvec_done(&kwv);
    n->kwnames = kwn;
    return true;
}

static tpl_node *parse_call(P *p, tpl_node *callee) {
    tpl_node *n = node(p, N_CALL, callee->pos); /* errors point at the start of the call */
    n->a = callee;
    return parse_call_args(p, n) ? n : NULL;
}

static tv_str *parse_dotted_name(P *p) {
    tpl_token *k = expect_name(p);
    if (!k) return NULL;
    if (!tok_is_op(cur(p), O_DOT)) return name_str(p, k);
    mu_buf b = {0};
    mu_buf_append(&b, k->p, k->n);
    while (tok_is_op(cur(p), O_DOT)) {
        adv(p);
        tpl_token *x = expect_name(p);
        if (!x) {
            mu_buf_free(&b);
            return NULL;
        }
        mu_buf_putc(&b, '.');
        mu_buf_append(&b, x->p, x->n);
    }
    tv_str *s = tpl_intern(p->t, b.p, b.len);
    mu_buf_free(&b);
    return s;
}

static tpl_node *check_builtin(P *p, tpl_node *n, bool is_filter) {
    n->builtin = is_filter ? tpl_filter_lookup(n->name->s, n->name->len) : tpl_test_lookup(n->name->s, n->name->len);
    if (p->soft) n->flags |= NF_SOFT;
    if (n->builtin < 0 && !p->soft)
        return fail_at(p, n->pos, "No %s named '%s'.", is_filter ? "filter" : "test", n->name->s);
    return n;
}

static tpl_node *parse_filter(P *p, tpl_node *in, bool start_inline) {
    while (tok_is_op(cur(p), O_PIPE) || start_inline) {
        if (!start_inline) adv(p);
        size_t pos = cur(p)->pos;
        tpl_node *f = node(p, N_FILTER, pos);
        if (!(f->name = parse_dotted_name(p))) return NULL;
        if (tok_is_op(cur(p), O_LPAREN) && !parse_call_args(p, f)) return NULL;
        f->a = in;
        if (!check_builtin(p, f, true)) return NULL;
        in = f;
        start_inline = false;
    }
    return in;
}

static tpl_node *parse_test(P *p, tpl_node *in) {
    size_t pos = cur(p)->pos;
    adv(p); /* is */
    bool negated = false;
    if (tok_is_name(cur(p), "not")) {
        adv(p);
        negated = true;
    }
    tpl_node *t = node(p, N_TEST, pos);
    if (!(t->name = parse_dotted_name(p))) return NULL;
    tpl_token *k = cur(p);
    if (tok_is_op(k, O_LPAREN)) {
        if (!parse_call_args(p, t)) return NULL;
    } else if ((k->type == T_NAME || k->type == T_STRING || k->type == T_INT || k->type == T_FLOAT ||
                tok_is_op(k, O_LPAREN) || tok_is_op(k, O_LBRACKET) || tok_is_op(k, O_LBRACE)) &&
               !tok_is_name(k, "else") && !tok_is_name(k, "or") && !tok_is_name(k, "and")) {
        if (tok_is_name(k, "is")) return fail_at(p, k->pos, "You cannot chain multiple tests with is");
        tpl_node *arg = parse_primary(p);
        if (arg) arg = parse_postfix(p, arg);
        if (!arg) return NULL;
        nvec args = {0};
        nvec_push(p, &args, arg);
        t->list = nvec_done(&args);
    }
    t->a = in;
    if (!check_builtin(p, t, false)) return NULL;
    if (!negated) return t;
    tpl_node *n = node(p, N_NOT, pos);
    n->a = t;
    return n;
}

static tpl_node *parse_subscribed(P *p) {
    size_t pos = cur(p)->pos;
    tpl_node *parts[3] = {NULL, NULL, NULL};
    if (tok_is_op(cur(p), O_COLON)) {
        adv(p);
    } else {
        tpl_node *e = parse_expression(p, true);
        if (!e || !tok_is_op(cur(p), O_COLON)) return e;
        adv(p);
        parts[0] = e;
    }
    if (!tok_is_op(cur(p), O_COLON) && !tok_is_op(cur(p), O_RBRACKET) && !tok_is_op(cur(p), O_COMMA)) {
        if (!(parts[1] = parse_expression(p, true))) return NULL;
    }
    if (tok_is_op(cur(p), O_COLON)) {
        adv(p);
        if (!tok_is_op(cur(p), O_RBRACKET) && !tok_is_op(cur(p), O_COMMA))
            if (!(parts[2] = parse_expression(p, true))) return NULL;
    }
    tpl_node *s = node(p, N_SLICE, pos);
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static tpl_node *parse_subscript(P *p, tpl_node *obj) {
    tpl_token *k = cur(p);
    size_t pos = obj->pos; /* errors point at the start of the expression */
    adv(p);
    if (k->op == O_DOT) {
        tpl_token *a = cur(p);
        adv(p);
        if (a->type == T_NAME) {
            tpl_node *n = node(p, N_GETATTR, pos);
            n->a = obj;
            n->name = name_str(p, a);
            return n;
        }
        if (a->type != T_INT) return fail_at(p, a->pos, "expected name or number");
        tpl_node *c = node(p, N_CONST, a->pos);
        c->value = tv_int(a->ival);
        tpl_node *n = node(p, N_GETITEM, pos);
        n->a = obj;
        n->b = c;
        return n;
    }
    nvec args = {0};
    while (!tok_is_op(cur(p), O_RBRACKET)) {
        if (args.n && !expect_op(p, O_COMMA)) return NULL;
        if (cur(p)->type == T_EOF) return expect_fail(p, "]"), NULL;
        tpl_node *x = parse_subscribed(p);
        if (!x) return NULL;
        nvec_push(p, &args, x);
    }
    if (!expect_op(p, O_RBRACKET)) return NULL;
    tpl_node *n = node(p, N_GETITEM, pos);
    n->a = obj;
    if (args.n == 1)
        n->b = args.v[0];
    else {
        tpl_node *t = node(p, N_TUPLE, pos);
        t->list = nvec_done(&args);
        n->b = t;
    }
    return n;
}

static tpl_node *parse_postfix(P *p, tpl_node *n) {
    while (n) {
        tpl_token *k = cur(p);
        if (tok_is_op(k, O_DOT) || tok_is_op(k, O_LBRACKET))
            n = parse_subscript(p, n);
        else if (tok_is_op(k, O_LPAREN))
            n = parse_call(p, n);
        else
            break;
    }
    return n;
}

static tpl_node *parse_filter_expr(P *p, tpl_node *n) {
    while (n) {
        tpl_token *k = cur(p);
        if (tok_is_op(k, O_PIPE))
            n = parse_filter(p, n, false);
        else if (tok_is_name(k, "is"))
            n = parse_test(p, n);
        else if (tok_is_op(k, O_LPAREN))
            n = parse_call(p, n);
        else
            break;
    }
    return n;
}

static tpl_node *parse_unary(P *p, bool with_filter) {
    tpl_token *k = cur(p);
    size_t pos = k->pos;
    if (++p->nest > MAX_NEST) return fail_at(p, pos, "expression nested too deeply");
    tpl_node *n;
    if (tok_is_op(k, O_SUB) || tok_is_op(k, O_ADD)) {
        adv(p);
        tpl_node *x = parse_unary(p, false);
        if (!x) return NULL;
        n = node(p, k->op == O_SUB ? N_NEG : N_POS, pos);
        n->a = x;
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter) n = parse_filter_expr(p, n);
    p->nest--;
    return n;
}

static bool is_const_name(const tpl_token *k, tv_value *v) {
    if (tok_is_name(k, "true") || tok_is_name(k, "True"))
        *v = tv_bool(true);
    else if (tok_is_name(k, "false") || tok_is_name(k, "False"))
        *v = tv_bool(false);
    else if (tok_is_name(k, "none") || tok_is_name(k, "None"))
        *v = tv_none();
    else
        return false;
    return true;
}

static tpl_node *parse_list_or_dict(P *p, bool is_dict) {
    size_t pos = cur(p)->pos;
    adv(p);
    int close = is_dict ? O_RBRACE : O_RBRACKET;
    nvec keys = {0}, vals = {0};
    while (!tok_is_op(cur(p), close)) {
        if (keys.n && !expect_op(p, O_COMMA)) return NULL;
        if (tok_is_op(cur(p), close)) break;
        tpl_node *k = parse_expression(p, true);
        if (!k) return NULL;
        nvec_push(p, &keys, k);
        if (is_dict) {
            if (!expect_op(p, O_COLON)) return NULL;
            tpl_node *v = parse_expression(p, true);
            if (!v) return NULL;
            nvec_push(p, &vals, v);
        }
    }
    if (!expect_op(p, close)) return NULL;
    tpl_node *n = node(p, is_dict ? N_DICT : N_LIST, pos);
    n->list = nvec_done(&keys);
    n->list2 = nvec_done(&vals);
    return n;
}

static void note_macro_name(P *p, const tpl_token *k) {
    if (!p->macro_flags) return;
    if (tok_is_name(k, "caller"))
        *p->macro_flags |= NF_CALLER;
    else if (tok_is_name(k, "varargs"))
        *p->macro_flags |= NF_VARARGS;
    else if (tok_is_name(k, "kwargs"))
        *p->macro_flags |= NF_KWARGS;
}

static tpl_node *parse_primary(P *p) {
    tpl_token *k = cur(p);
    tpl_node *n;
    if (k->type == T_NAME) {
        tv_value v;
        if (is_const_name(k, &v)) {
            n = node(p, N_CONST, k->pos);
            n->value = v;
        } else {
            n = node(p, N_NAME, k->pos);
            n->name = name_str(p, k);
            note_macro_name(p, k);
        }
        adv(p);
    } else if (k->type == T_STRING) {
        n = node(p, N_CONST, k->pos);
        adv(p);
        if (cur(p)->type != T_STRING) {
            n->value.type = TV_STR;
            n->value.as.s = k->str;
        } else {
            mu_buf b = {0};
            mu_buf_append(&b, k->str->s, k->str->len);
            while (cur(p)->type == T_STRING) {
                mu_buf_append(&b, cur(p)->str->s, cur(p)->str->len);
                adv(p);
            }
            n->value.type = TV_STR;
            n->value.as.s = tpl_intern(p->t, b.p, b.len);
            mu_buf_free(&b);
        }
    } else if (k->type == T_INT || k->type == T_FLOAT) {
        n = node(p, N_CONST, k->pos);
        n->value = k->type == T_INT ? tv_int(k->ival) : tv_float(k->fval);
        adv(p);
    } else if (tok_is_op(k, O_LPAREN)) {
        adv(p);
        n = parse_tuple(p, false, true, NULL, true);
        if (n && !expect_op(p, O_RPAREN)) return NULL;
    } else if (tok_is_op(k, O_LBRACKET)) {
        n = parse_list_or_dict(p, false);
    } else if (tok_is_op(k, O_LBRACE)) {
        n = parse_list_or_dict(p, true);
    } else {
        char d[128];
        describe(k, d, sizeof d);
        if (k->type == T_EOF) return fail_at(p, k->pos, "unexpected end of template");
        return fail_at(p, k->pos, "unexpected '%s'", d);
    }
    return n;
}

/* jinja2 3.1 passes its extra end rules to TokenStream.test_any as one
 * tuple argument, so they never match (`for a, in x` parses `in` as a
 * name and then fails). Reproduced: only the real delimiters end a tuple. */
static bool is_tuple_end(P *p, const char *extra_end) {
    (void)extra_end;
    tpl_token *k = cur(p);
    return k->type == T_VEND || k->type == T_BEND || tok_is_op(k, O_RPAREN);
}

static tpl_node *parse_tuple(P *p, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens) {
    size_t pos = cur(p)->pos;
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && !expect_op(p, O_COMMA)) return NULL;
        if (is_tuple_end(p, extra_end)) break;
        tpl_node *x = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!x) return NULL;
        nvec_push(p, &args, x);
        if (tok_is_op(cur(p), O_COMMA))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            char d[128];
            describe(cur(p), d, sizeof d);
            return fail_at(p, cur(p)->pos, "Expected an expression, got '%s'", d);
        }
    }
    tpl_node *t = node(p, N_TUPLE, pos);
    t->list = nvec_done(&args);
    return t;
}

/* ------------------------------------------------------------- statements */
static bool can_assign(const tpl_node *n) {
    if (n->kind == N_NAME) return true;
    if (n->kind != N_TUPLE) return false;
    for (size_t i = 0; i < n->list.n; i++)
        if (!can_assign(n->list.v[i])) return false;
    return true;
}

static const char *node_type_lower(const tpl_node *n) {
    switch (n->kind) {
    case N_CONST: return "const";
    case N_TUPLE: return "tuple";
    case N_LIST: return "list";
    case N_DICT: return "dict";
    case N_GETATTR: return "getattr";
    case N_GETITEM: return "getitem";
    case N_CALL: return "call";
    case N_FILTER: return "filter";
    default: return "expr";
    }
}

static tpl_node *parse_assign_target(P *p, bool name_only, const char *extra_end, bool with_namespace) {
    tpl_token *k = cur(p);
    tpl_node *t;
    if (with_namespace && k->type == T_NAME && tok_is_op(look(p), O_DOT)) {
        adv(p);
        adv(p);
        tpl_token *attr = expect_name(p);
        if (!attr) return NULL;
        t = node(p, N_NSREF, k->pos);
        t->value.type = TV_STR;
        t->value.as.s = name_str(p, k);
        t->name = name_str(p, attr);
        return t;
    }
    if (name_only) {
        if (!expect_name(p)) return NULL;
        tv_value dummy;
        if (is_const_name(k, &dummy)) return fail_at(p, k->pos, "can't assign to 'const'");
        t = node(p, N_NAME, k->pos);
        t->name = name_str(p, k);
        return t;
    }
    t = parse_tuple(p, true, true, extra_end, false);
    if (!t) return NULL;
    if (!can_assign(t)) return fail_at(p, t->pos, "can't assign to '%s'", node_type_lower(t));
    return t;
}

static tpl_node *subparse(P *p, const char *const *ends);
static tpl_node *parse_statement(P *p);

static bool in_list(const tpl_token *k, const char *const *ends) {
    for (; ends && *ends; ends++)
        if (tok_is_name(k, *ends)) return true;
    return false;
}

static tpl_node *fail_eof(P *p, const char *const *ends, const char *unknown, size_t pos) {
    char msg[700];
    size_t m = 0;
    if (unknown)
        m += (size_t)snprintf(msg + m, sizeof msg - m, "Encountered unknown tag '%s'.", unknown);
    else
        m += (size_t)snprintf(msg + m, sizeof msg - m, "Unexpected end of template.");
    const char *const *looking = ends ? ends : (p->nend ? p->end_stack[p->nend - 1] : NULL);
    if (looking && m < sizeof msg) {
        bool nesting = false;
        for (int s = 0; unknown && s < p->nend; s++)
            for (const char *const *e = p->end_stack[s]; *e; e++)
                if (!strcmp(*e, unknown)) nesting = true;
        m += (size_t)snprintf(
            msg + m, sizeof msg - m,
            nesting ? " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for "
                    : " Jinja was looking for the following tags: ");
        for (const char *const *e = looking; *e && m < sizeof msg; e++)
            m += (size_t)snprintf(msg + m, sizeof msg - m, "%s'%s'", e == looking ? "" : " or ", *e);
        if (m < sizeof msg) m += (size_t)snprintf(msg + m, sizeof msg - m, ".");
    }
    if (p->ntag && m < sizeof msg)
        snprintf(msg + m, sizeof msg - m, " The innermost block that needs to be closed is '%s'.",
                 p->tag_stack[p->ntag - 1]);
    return fail_at(p, pos, "%s", msg);
}

/* `%}` then a body up to one of `ends`; leaves the cursor on the end name. */
static tpl_node *parse_statements(P *p, const char *const *ends, bool drop_needle) {
    if (tok_is_op(cur(p), O_COLON)) adv(p);
    if (!expect_type(p, T_BEND)) return NULL;
    tpl_node *body = subparse(p, ends);
    if (!body) return NULL;
    if (cur(p)->type == T_EOF) return fail_eof(p, ends, NULL, cur(p)->pos);
    if (drop_needle) adv(p);
    return body;
}

static tpl_node *parse_for(P *p, size_t pos) {
    static const char *const body_end[] = {"endfor", "else", NULL};
    static const char *const else_end[] = {"endfor", NULL};
    tpl_node *n = node(p, S_FOR, pos);
    if (!(n->a = parse_assign_target(p, false, "in", false))) return NULL;
    if (!expect_keyword(p, "in")) return NULL;
    if (!(n->b = parse_tuple(p, false, false, "recursive", false))) return NULL;
    bool soft = p->soft;
    p->soft = false;
    if (tok_is_name(cur(p), "if")) {
        adv(p);
        if (!(n->c = parse_expression(p, true))) return NULL;
    }
    if (tok_is_name(cur(p), "recursive")) {
        adv(p);
        n->flags |= NF_RECURSIVE;
    }
    p->loop_depth++;
    n->d = parse_statements(p, body_end, false);
    p->loop_depth--;
    if (!n->d) return NULL;
    bool has_else = tok_is_name(cur(p), "else");
    adv(p);
    if (has_else) {
        tpl_node *e = parse_statements(p, else_end, true);
        if (!e) return NULL;
        n->list2 = e->list;
    }
    p->soft = soft;
    return n;
}

static tpl_node *parse_if(P *p, size_t pos) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const else_end[] = {"endif", NULL};
    bool soft = p->soft;
    p->soft = true;
    tpl_node *result = node(p, S_IF, pos), *n = result;
    for (;;) {
        if (!(n->a = parse_tuple(p, false, false, NULL, false))) return NULL;
        if (!(n->b = parse_statements(p, ends, false))) return NULL;
        tpl_token *k = cur(p);
        adv(p);
        if (tok_is_name(k, "elif")) {
            tpl_node *e = node(p, S_IF, cur(p)->pos);
            n->c = e;
            n = e;
            continue;
        }
        if (tok_is_name(k, "else") && !(n->c = parse_statements(p, else_end, true))) return NULL;
        break;
    }
    p->soft = soft;
    return result;
}

/* A nested body with a fresh frame: not soft, not in a loop (macros). */
static tpl_node *parse_frame_body(P *p, const char *const *ends, bool reset_loop) {
    bool soft = p->soft;
    int loops = p->loop_depth;
    p->soft = false;
    if (reset_loop) p->loop_depth = 0;
    tpl_node *b = parse_statements(p, ends, true);
    p->soft = soft;
    p->loop_depth = loops;
    return b;
}

static tpl_node *parse_set(P *p, size_t pos) {
    static const char *const ends[] = {"endset", NULL};
    tpl_node *target = parse_assign_target(p, false, NULL, true);
    if (!target) return NULL;
    if (tok_is_op(cur(p), O_ASSIGN)) {
        adv(p);
        tpl_node *n = node(p, S_SET, pos);
        n->a = target;
        if (!(n->b = parse_tuple(p, false, true, NULL, false))) return NULL;
        return n;
    }
    tpl_node *n = node(p, S_SETBLOCK, pos);
    n->a = target;
    if (tok_is_op(cur(p), O_PIPE) && !(n->c = parse_filter(p, NULL, false))) return NULL;
    if (!(n->b = parse_frame_body(p, ends, false))) return NULL;
    return n;
}

static bool parse_signature(P *p, tpl_node *n) {
    if (!expect_op(p, O_LPAREN)) return false;
    nvec args = {0}, defs = {0};
    while (!tok_is_op(cur(p), O_RPAREN)) {
        if (args.n && !expect_op(p, O_COMMA)) return false;
        tpl_node *a = parse_assign_target(p, true, NULL, false);
        if (!a) return false;
        if (tok_is_op(cur(p), O_ASSIGN)) {
            adv(p);
            tpl_node *d = parse_expression(p, true);
            if (!d) return false;
            nvec_push(p, &defs, d);
        } else if (defs.n) {
            fail_at(p, a->pos, "non-default argument follows default argument");
            return false;
        }
        nvec_push(p, &args, a);
    }
    if (!expect_op(p, O_RPAREN)) return false;
    n->list = nvec_done(&args);
    n->list2 = nvec_done(&defs);
    return true;
}

static tpl_node *parse_macro_like(P *p, tpl_node *n, const char *const *ends) {
    uint8_t *saved = p->macro_flags;
    p->macro_flags = &n->flags;
    n->a = parse_frame_body(p, ends, true);
    p->macro_flags = saved;
    return n->a ? n : NULL;
}

static tpl_node *parse_macro(P *p, size_t pos) {
    static const char *const ends[] = {"endmacro", NULL};
    tpl_node *n = node(p, S_MACRO, pos);
    tpl_node *name = parse_assign_target(p, true, NULL, false);
    if (!name) return NULL;
    n->name = name->name;
    uint8_t *saved = p->macro_flags;
    p->macro_flags = &n->flags; /* defaults may mention caller too */
    bool ok = parse_signature(p, n);
    p->macro_flags = saved;
    if (!ok) return NULL;
    return parse_macro_like(p, n, ends);
}

static tpl_node *parse_call_block(P *p, size_t pos) {
    static const char *const ends[] = {"endcall", NULL};
    tpl_node *n = node(p, S_CALLBLOCK, pos);
    if (tok_is_op(cur(p), O_LPAREN) && !parse_signature(p, n)) return NULL;
    tpl_node *call = parse_expression(p, true);
    if (!call) return NULL;
    if (call->kind != N_CALL) return fail_at(p, pos, "expected call");
    n->b = call;
    return parse_macro_like(p, n, ends);
}

static tpl_node *parse_filter_block(P *p, size_t pos) {
    static const char *const ends[] = {"endfilter", NULL};
    tpl_node *n = node(p, S_FILTERBLOCK, pos);
    if (!(n->b = parse_filter(p, NULL, true))) return NULL;
    if (!(n->a = parse_frame_body(p, ends, false))) return NULL;
    return n;
}

static tpl_node *parse_with(P *p, size_t pos) {
    static const char *const ends[] = {"endwith", NULL};
    tpl_node *n = node(p, S_WITH, pos);
    nvec targets = {0}, values = {0};
    while (cur(p)->type != T_BEND) {
        if (targets.n && !expect_op(p, O_COMMA)) return NULL;
        tpl_node *t = parse_assign_target(p, false, NULL, false);
        if (!t || !expect_op(p, O_ASSIGN)) return NULL;
        tpl_node *v = parse_expression(p, true);
        if (!v) return NULL;
        nvec_push(p, &targets, t);
        nvec_push(p, &values, v);
    }
    n->list = nvec_done(&targets);
    n->list2 = nvec_done(&values);
    if (!(n->a = parse_frame_body(p, ends, false))) return NULL;
    return n;
}

static tpl_node *parse_print(P *p, size_t pos) {
    tpl_node *n = node(p, S_OUTPUT, pos);
    nvec items = {0};
    while (cur(p)->type != T_BEND) {
        if (items.n && !expect_op(p, O_COMMA)) return NULL;
        tpl_node *x = parse_expression(p, true);
        if (!x) return NULL;
        nvec_push(p, &items, x);
    }
    n->list = nvec_done(&items);
    return n;
}

static tpl_node *parse_statement_inner(P *p, tpl_token *k) {
    size_t pos = k->pos;
    if (tok_is_name(k, "for")) return adv(p), parse_for(p, pos);
    if (tok_is_name(k, "if")) return adv(p), parse_if(p, pos);
    if (tok_is_name(k, "set")) return adv(p), parse_set(p, pos);
    if (tok_is_name(k, "macro")) return adv(p), parse_macro(p, pos);
    if (tok_is_name(k, "call")) return adv(p), parse_call_block(p, pos);
    if (tok_is_name(k, "filter")) return adv(p), parse_filter_block(p, pos);
    if (tok_is_name(k, "with")) return adv(p), parse_with(p, pos);
    if (tok_is_name(k, "print")) return adv(p), parse_print(p, pos);
    if (tok_is_name(k, "break") || tok_is_name(k, "continue")) {
        bool brk = tok_is_name(k, "break");
        adv(p);
        if (!p->loop_depth) return fail_at(p, pos, "'%s' outside loop", brk ? "break" : "continue");
        return node(p, brk ? S_BREAK : S_CONTINUE, pos);
    }
    if (tok_is_name(k, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        adv(p);
        tpl_node *b = parse_statements(p, ends, true);
        if (b) b->flags |= NF_GENERATION;
        return b;
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", NULL};
    if (in_list(k, unsupported)) return fail_at(p, pos, "the '%.*s' tag is not supported", (int)k->n, k->p);
    char name[128];
    describe(k, name, sizeof name);
    p->ntag--; /* jinja pops the unknown tag before reporting */
    tpl_node *r = fail_eof(p, NULL, name, pos);
    p->ntag++;
    return r;
}

static tpl_node *parse_statement(P *p) {
    tpl_token *k = cur(p);
    if (k->type != T_NAME) return fail_at(p, k->pos, "tag name expected");
    if (p->ntag >= 64 || p->nend >= 63) return fail_at(p, k->pos, "blocks nested too deeply");
    p->tag_stack[p->ntag++] = name_str(p, k)->s;
    tpl_node *n = parse_statement_inner(p, k);
    p->ntag--;
    return n;
}

static tpl_node *subparse(P *p, const char *const *ends) {
    tpl_node *body = node(p, S_BODY, cur(p)->pos);
    nvec items = {0};
    if (ends) p->end_stack[p->nend++] = ends;
    bool ok = true;
    while (ok) {
        tpl_token *k = cur(p);
        if (k->type == T_EOF) break;
        if (k->type == T_DATA) {
            tpl_node *d = node(p, S_DATA, k->pos);
            d->value.type = TV_STR;
            d->value.as.s = k->str;
            nvec_push(p, &items, d);
            adv(p);
        } else if (k->type == T_VBEGIN) {
            adv(p);
            tpl_node *e = parse_tuple(p, false, true, NULL, false);
            ok = e && expect_type(p, T_VEND);
            if (ok) {
                tpl_node *o = node(p, S_OUTPUT, k->pos);
                nvec one = {0};
                nvec_push(p, &one, e);
                o->list = nvec_done(&one);
                nvec_push(p, &items, o);
            }
        } else if (k->type == T_BBEGIN) {
            adv(p);
            if (ends && in_list(cur(p), ends)) break;
            tpl_node *s = parse_statement(p);
            ok = s && expect_type(p, T_BEND);
            if (ok) nvec_push(p, &items, s);
        } else {
            char d[64];
            describe(k, d, sizeof d);
            fail_at(p, k->pos, "unexpected '%s'", d);
            ok = false;
        }
    }
    if (ends) p->nend--;
    if (!ok || p->failed) return NULL;
    body->list = nvec_done(&items);
    return body;
}

/* jinja2's optimizer evaluates constant subtrees at compile time
 * (nodes.*.as_const) and gives up when it reaches a name, a call, a
 * context filter (map, select, reject, selectattr, rejectattr, random) or
 * a filter block. Marks the expressions where that attempt might succeed
 * (and/or/if-else may succeed without touching their other operand). */
static bool nodes_const(const tpl_nodes *l) {
    for (size_t i = 0; i < l->n; i++)
        if (!(l->v[i]->flags & NF_CONST)) return false;
    return true;
}

static bool opt_const(tpl_node *n) { return !n || (n->flags & NF_CONST); }

static bool is_context_filter(const tv_str *name) {
    static const char *const ctx[] = {"map", "select", "reject", "selectattr", "rejectattr", "random", NULL};
    for (int i = 0; ctx[i]; i++)
        if (tv_str_is(name, ctx[i])) return true;
    return false;
}

static void mark_const(tpl_node *n) {
    if (!n) return;
    mark_const(n->a);
    mark_const(n->b);
    mark_const(n->c);
    mark_const(n->d);
    for (size_t i = 0; i < n->list.n; i++) mark_const(n->list.v[i]);
    for (size_t i = 0; i < n->list2.n; i++) mark_const(n->list2.v[i]);
    bool k = false;
    switch (n->kind) {
    case N_CONST: k = true; break;
    case N_TUPLE:
    case N_LIST:
    case N_CONCAT: k = nodes_const(&n->list); break;
    case N_DICT: k = nodes_const(&n->list) && nodes_const(&n->list2); break;
    case N_GETATTR:
    case N_NOT:
    case N_NEG:
    case N_POS: k = opt_const(n->a); break;
    case N_GETITEM:
        k = opt_const(n->a) &&
            (n->b->kind == N_SLICE ? opt_const(n->b->a) && opt_const(n->b->b) && opt_const(n->b->c) : opt_const(n->b));
        break;
    case N_BINOP: k = opt_const(n->a) && opt_const(n->b); break;
    case N_AND:
    case N_OR: k = opt_const(n->a); break; /* the right side may never be reached */
    case N_COMPARE:
        k = opt_const(n->a);
        for (size_t i = 0; i < n->list.n; i++) k = k && opt_const(n->list.v[i]->a);
        break;
    case N_COND: k = opt_const(n->a); break;
    case N_FILTER:
    case N_TEST:
        k = n->a && n->builtin >= 0 && opt_const(n->a) && nodes_const(&n->list) && nodes_const(&n->list2) &&
            opt_const(n->c) && opt_const(n->d) && !(n->kind == N_FILTER && is_context_filter(n->name));
        break;
    default: break;
    }
    if (k) n->flags |= NF_CONST;
}

void tpl_line_col(const mu_template *t, size_t pos, int *line, int *col) {
    int l = 1;
    size_t start = 0;
    if (pos > t->len) pos = t->len;
    for (size_t i = 0; i < pos; i++)
        if (t->src[i] == '\n') {
            l++;
            start = i + 1;
        }
    int c = 1;
    for (size_t i = start; i < pos;) {
        tpl_utf8_next(t->src, t->len, &i);
        c++;
    }
    *line = l;
    *col = c;
}

bool tpl_parse(mu_template *t, mu_error *err) {
    tpl_lexer L = {.t = t, .err = err};
    if (!tpl_lex(&L)) {
        free(L.tok);
        return false;
    }
    P p = {.t = t, .err = err, .tok = L.tok, .ntok = L.ntok};
    t->root = subparse(&p, NULL);
    free(L.tok);
    if (t->root) mark_const(t->root);
    return t->root != NULL && !p.failed;
}
