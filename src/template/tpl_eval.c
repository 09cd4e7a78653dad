/* Tree-walking evaluator with jinja2's runtime semantics: scoping (a fresh
 * scope per loop iteration, lexical macros), calls and macros, compile-time
 * constant folding as jinja2 does it, statements. Operations on values are
 * in tpl_ops.c. */
#include "template/tpl_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_DEPTH 600
#define MAX_MACRO_DEPTH 120

/* ------------------------------------------------------------------ scopes */
static tpl_scope *scope_new(tpl_ctx *c, tpl_scope *parent) {
    (void)c;
    tpl_scope *s = mu_xcalloc(1, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_clear(tpl_scope *s) {
    for (size_t i = 0; i < s->n; i++) tv_unref(s->vars[i].value);
    s->n = 0;
}

/* A scope goes out of use: free it, unless a macro captured it; captured
 * scopes only lose their bindings and are freed with the render. */
static void scope_end(tpl_scope *s) {
    scope_clear(s);
    if (s->captured) return;
    free(s->vars);
    free(s);
}

/* A macro keeps its defining scope chain alive for the whole render. */
static void scope_capture(tpl_ctx *c, tpl_scope *s) {
    for (; s && !s->captured; s = s->parent) {
        s->captured = true;
        s->next_alloc = c->all_scopes;
        c->all_scopes = s;
    }
}

static bool name_eq(const tv_str *a, const tv_str *b) {
    return a == b || (a->len == b->len && memcmp(a->s, b->s, a->len) == 0);
}

static tv_value *scope_slot(tpl_scope *s, const tv_str *name) {
    for (size_t i = s->n; i-- > 0;)
        if (name_eq(s->vars[i].name, name)) return &s->vars[i].value;
    return NULL;
}

static void scope_set(tpl_scope *s, tv_str *name, tv_value v) {
    tv_value *slot = scope_slot(s, name);
    if (slot) {
        tv_move(slot, v);
        return;
    }
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->vars = mu_xrealloc(s->vars, s->cap * sizeof *s->vars);
    }
    s->vars[s->n].name = name;
    s->vars[s->n].value = v;
    s->n++;
}

void tpl_scope_set_global(tpl_scope *s, tv_str *name, tv_value v) { scope_set(s, name, v); }

static const tv_value *scope_lookup(tpl_scope *s, const tv_str *name) {
    for (; s; s = s->parent) {
        tv_value *v = scope_slot(s, name);
        if (v) return v;
    }
    return NULL;
}

static bool eval(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out);
static bool exec_body(tpl_ctx *c, tpl_scope *s, const tpl_node *body);

/* ------------------------------------------------------------------ calls */
static bool call_macro(tpl_ctx *c, const tv_func *fn, const tpl_args *a, tv_value *out);
static bool call_loop(tpl_ctx *c, tv_loop *lp, const tpl_args *a, tv_value *out);

bool tpl_call_value(tpl_ctx *c, tv_value f, const tpl_args *a, tv_value *out) {
    if (f.type == TV_UNDEFINED) return tpl_fail_undefined(c, f);
    if (f.type == TV_LOOP) return call_loop(c, f.as.loop, a, out);
    if (f.type != TV_FUNC) return tpl_fail(c, "TypeError", "'%s' object is not callable", tv_type_name(f));
    if (f.as.fn->kind == FN_MACRO) return call_macro(c, f.as.fn, a, out);
    c->call_data = f.as.fn->data;
    return f.as.fn->fn(c, &f.as.fn->self, a, out);
}

static void args_free(tpl_args *a) {
    for (size_t i = 0; i < a->npos; i++) tv_unref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) tv_unref(a->kw[i]);
    free(a->pos);
    free(a->kw);
    free(a->kwname);
    memset(a, 0, sizeof *a);
}

static void args_push(tpl_args *a, tv_value v) {
    a->pos = mu_xrealloc(a->pos, (a->npos + 1) * sizeof *a->pos);
    a->pos[a->npos++] = v;
}

static void args_push_kw(tpl_args *a, tv_str *name, tv_value v) {
    for (size_t i = 0; i < a->nkw; i++)
        if (name_eq(a->kwname[i], name)) { /* later duplicate (from **kw) wins */
            tv_move(&a->kw[i], v);
            return;
        }
    a->kw = mu_xrealloc(a->kw, (a->nkw + 1) * sizeof *a->kw);
    a->kwname = mu_xrealloc(a->kwname, (a->nkw + 1) * sizeof *a->kwname);
    a->kw[a->nkw] = v;
    a->kwname[a->nkw++] = name;
}

/* Evaluates call / filter / test arguments of node n. Keyword names from
 * **kwargs dicts are kept alive by `keep` (a list of the dict values). */
static bool eval_args(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tpl_args *a, tv_value *keep) {
    memset(a, 0, sizeof *a);
    *keep = tv_list_new(SEQ_LIST, 0);
    for (size_t i = 0; i < n->list.n; i++) {
        tv_value v;
        if (!eval(c, s, n->list.v[i], &v)) return false;
        args_push(a, v);
    }
    if (n->c) {
        tv_value v, items;
        if (!eval(c, s, n->c, &v)) return false;
        bool ok = tpl_iterate(c, v, &items);
        tv_unref(v);
        if (!ok) return false;
        for (size_t i = 0; i < items.as.l->n; i++) args_push(a, tv_ref(items.as.l->v[i]));
        tv_unref(items);
    }
    for (size_t i = 0; i < n->list2.n; i++) {
        tv_value v;
        if (!eval(c, s, n->list2.v[i], &v)) return false;
        args_push_kw(a, n->kwnames[i], v);
    }
    if (n->d) {
        tv_value v;
        if (!eval(c, s, n->d, &v)) return false;
        if (v.type != TV_DICT) {
            tv_unref(v);
            return tpl_fail(c, "TypeError", "argument after ** must be a mapping");
        }
        for (size_t i = 0; i < v.as.d->n; i++) {
            if (v.as.d->k[i].type != TV_STR) {
                tv_unref(v);
                return tpl_fail(c, "TypeError", "keywords must be strings");
            }
            args_push_kw(a, v.as.d->k[i].as.s, tv_ref(v.as.d->v[i]));
        }
        tv_list_push(keep->as.l, v);
    }
    return true;
}

static tv_value make_macro(tpl_ctx *c, const tpl_node *n, tpl_scope *s, const char *name) {
    scope_capture(c, s);
    tv_func *f = mu_xcalloc(1, sizeof *f);
    f->refs = 1;
    f->kind = FN_MACRO;
    f->name = name;
    f->macro = n;
    f->scope = s;
    f->self = tv_undef_anon();
    tv_value v = {.type = TV_FUNC};
    v.as.fn = f;
    return v;
}

static bool call_macro(tpl_ctx *c, const tv_func *fn, const tpl_args *a, tv_value *out) {
    const tpl_node *m = fn->macro;
    const char *name = fn->name ? fn->name : "caller";
    size_t nparams = m->list.n, ndef = m->list2.n;
    if (a->npos > nparams && !(m->flags & NF_VARARGS))
        return tpl_fail(c, "TypeError", "macro '%s' takes not more than %zu argument(s)", name, nparams);
    if (c->depth > MAX_MACRO_DEPTH * 4) return tpl_fail(c, "RecursionError", "maximum recursion depth exceeded");
    tpl_scope *s = scope_new(c, fn->scope);
    bool *bound = mu_xcalloc(nparams + 1, sizeof *bound);
    bool *used_kw = mu_xcalloc(a->nkw + 1, sizeof *used_kw);
    for (size_t i = 0; i < a->npos && i < nparams; i++) {
        scope_set(s, m->list.v[i]->name, tv_ref(a->pos[i]));
        bound[i] = true;
    }
    bool ok = true;
    if (a->npos < nparams)
        for (size_t i = a->npos; i < nparams; i++)
            for (size_t k = 0; k < a->nkw; k++)
                if (!used_kw[k] && name_eq(a->kwname[k], m->list.v[i]->name)) {
                    scope_set(s, m->list.v[i]->name, tv_ref(a->kw[k]));
                    bound[i] = used_kw[k] = true;
                }
    tv_value caller = tv_undef_msg("UndefinedError", "No caller defined");
    tv_value kwargs = tv_dict_new();
    for (size_t k = 0; k < a->nkw && ok; k++) {
        if (used_kw[k]) continue;
        if ((m->flags & NF_CALLER) && tv_str_is(a->kwname[k], "caller")) {
            tv_move(&caller, tv_ref(a->kw[k]));
        } else if (m->flags & NF_KWARGS) {
            tv_dict_set(kwargs.as.d, tv_ref((tv_value){.type = TV_STR, .as.s = a->kwname[k]}), tv_ref(a->kw[k]));
        } else if (tv_str_is(a->kwname[k], "caller")) {
            ok = tpl_fail(c, "TypeError",
                          "macro '%s' was invoked with two values for the special caller argument. "
                          "This is most likely a bug.",
                          name);
        } else {
            ok = tpl_fail(c, "TypeError", "macro '%s' takes no keyword argument '%s'", name, a->kwname[k]->s);
        }
    }
    for (size_t i = 0; i < nparams && ok; i++) {
        if (bound[i]) continue;
        tv_value v;
        if (i >= nparams - ndef) {
            ok = eval(c, s, m->list2.v[i - (nparams - ndef)], &v);
            if (!ok) break;
        } else {
            v = tv_undef_msg("UndefinedError", "parameter '%s' was not provided", m->list.v[i]->name->s);
        }
        scope_set(s, m->list.v[i]->name, v);
    }
    free(bound);
    free(used_kw);
    if (m->flags & NF_CALLER) scope_set(s, c->t->nm_caller, tv_ref(caller));
    tv_unref(caller);
    if (m->flags & NF_KWARGS) scope_set(s, c->t->nm_kwargs, tv_ref(kwargs));
    tv_unref(kwargs);
    if (m->flags & NF_VARARGS) {
        tv_value va = tv_list_new(SEQ_TUPLE, 0);
        for (size_t i = nparams; i < a->npos; i++) tv_list_push(va.as.l, tv_ref(a->pos[i]));
        scope_set(s, c->t->nm_varargs, va);
    }
    if (!ok) {
        scope_end(s);
        return false;
    }
    mu_buf buf = {.limit = c->max_str};
    mu_buf *saved = c->out;
    c->out = &buf;
    c->depth += 4;
    ok = exec_body(c, s, m->a);
    c->depth -= 4;
    c->out = saved;
    scope_end(s);
    return tpl_buf_finish(c, &buf, ok, out);
}

/* ------------------------------------------------------------ expressions */
static bool eval_filter_chain(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value input, tv_value *out);

static bool eval_call(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *extra_caller, tv_value *out) {
    tv_value f;
    if (!eval(c, s, n->a, &f)) return false;
    tpl_args a;
    tv_value keep;
    bool ok = eval_args(c, s, n, &a, &keep);
    if (ok && extra_caller) args_push_kw(&a, c->t->nm_caller, tv_ref(*extra_caller));
    if (ok) ok = tpl_call_value(c, f, &a, out);
    args_free(&a);
    tv_unref(keep);
    tv_unref(f);
    return ok;
}

/* Filter node: input is the evaluated `a` child, or `block_input` for
 * the innermost filter of {% filter %} / {% set x | f %} chains. */
static bool eval_filter(tpl_ctx *c, tpl_scope *s, const tpl_node *n, const tv_value *block_input, tv_value *out) {
    tv_value in;
    if (n->a) {
        bool ok =
            (block_input && n->a->kind == N_FILTER) ? eval_filter(c, s, n->a, block_input, &in) : eval(c, s, n->a, &in);
        if (!ok) return false;
    } else {
        in = tv_ref(*block_input);
    }
    tpl_args a;
    tv_value keep;
    bool ok = eval_args(c, s, n, &a, &keep);
    if (ok && n->builtin < 0) ok = tpl_fail(c, "TemplateRuntimeError", "No filter named '%s' found.", n->name->s);
    if (ok) ok = tpl_call_filter(c, n->builtin, in, &a, out);
    args_free(&a);
    tv_unref(keep);
    tv_unref(in);
    return ok;
}

static bool eval_filter_chain(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value input, tv_value *out) {
    return eval_filter(c, s, n, &input, out);
}

static bool eval_test(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    tv_value in;
    if (!eval(c, s, n->a, &in)) return false;
    tpl_args a;
    tv_value keep;
    bool ok = eval_args(c, s, n, &a, &keep), r = false;
    if (ok && n->builtin < 0) ok = tpl_fail(c, "TemplateRuntimeError", "No test named '%s' found.", n->name->s);
    if (ok) ok = tpl_call_test(c, n->builtin, in, &a, &r);
    args_free(&a);
    tv_unref(keep);
    tv_unref(in);
    if (ok) *out = tv_bool(r);
    return ok;
}

static bool eval_compare(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    tv_value left;
    if (!eval(c, s, n->a, &left)) return false;
    bool r = true;
    for (size_t i = 0; i < n->list.n && r; i++) {
        const tpl_node *o = n->list.v[i];
        tv_value right;
        if (!eval(c, s, o->a, &right)) {
            tv_unref(left);
            return false;
        }
        bool ok = tpl_compare(c, o->op, left, right, &r);
        tv_unref(left);
        left = right;
        if (!ok) {
            tv_unref(left);
            return false;
        }
    }
    tv_unref(left);
    *out = tv_bool(r);
    return true;
}

static bool eval_seq(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_seq_kind kind, tv_value *out) {
    tv_value l = tv_list_new(kind, n->list.n);
    for (size_t i = 0; i < n->list.n; i++) {
        tv_value v;
        if (!eval(c, s, n->list.v[i], &v)) {
            tv_unref(l);
            return false;
        }
        tv_list_push(l.as.l, v);
    }
    *out = l;
    return true;
}

static bool eval_dict(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    tv_value d = tv_dict_new();
    for (size_t i = 0; i < n->list.n; i++) {
        tv_value k, v;
        if (!eval(c, s, n->list.v[i], &k)) goto fail;
        if (!tpl_require_hashable(c, k) || !eval(c, s, n->list2.v[i], &v)) {
            tv_unref(k);
            goto fail;
        }
        tv_dict_set(d.as.d, k, v);
    }
    *out = d;
    return true;
fail:
    tv_unref(d);
    return false;
}

static bool eval_unary(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    tv_value v;
    if (!eval(c, s, n->a, &v)) return false;
    bool neg = n->kind == N_NEG;
    if (v.type == TV_UNDEFINED) {
        bool r = tpl_fail_undefined(c, v);
        tv_unref(v);
        return r;
    }
    if (v.type == TV_BOOL) v = tv_int(v.as.b);
    if (v.type == TV_INT) {
        if (neg && v.as.i == INT64_MIN) return tpl_fail(c, "OverflowError", "integer result too large");
        *out = tv_int(neg ? -v.as.i : v.as.i);
        return true;
    }
    if (v.type == TV_FLOAT) {
        *out = tv_float(neg ? -v.as.f : v.as.f);
        return true;
    }
    tpl_fail(c, "TypeError", "bad operand type for unary %c: '%s'", neg ? '-' : '+', tv_type_name(v));
    tv_unref(v);
    return false;
}

static bool eval_name(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    (void)c;
    const tv_value *v = scope_lookup(s, n->name);
    if (v) {
        *out = tv_ref(*v);
        return true;
    }
    if (tpl_global_lookup(n->name->s, n->name->len, out)) return true;
    mu_buf b = {0};
    tv_write_pystr_repr(&b, n->name->s, n->name->len);
    *out = tv_undef_msg("UndefinedError", "%s is undefined", b.p);
    mu_buf_free(&b);
    return true;
}

static bool is_negative_number(tv_value v) {
    if (v.type == TV_INT) return v.as.i < 0;
    if (v.type == TV_FLOAT) return signbit(v.as.f) && !isnan(v.as.f);
    return false;
}

/* jinja2 folds a negative constant base and writes it as "-14", so the
 * generated Python `(-14 ** n)` means -(14 ** n). Reproduced here. */
static bool neg_const_pow(tpl_ctx *c, tv_value a, tv_value b, tv_value *out) {
    tv_value pos = a.type == TV_FLOAT ? tv_float(-a.as.f) : tv_int(-(a.type == TV_BOOL ? a.as.b : a.as.i)), r;
    bool ok = tpl_binop(c, OP_POW, pos, b, &r);
    tv_unref(b);
    if (!ok) return false;
    *out = r.type == TV_FLOAT ? tv_float(-r.as.f) : tv_int(-r.as.i);
    return true;
}

static bool try_const(tpl_ctx *c, tpl_scope *s, const tpl_node *n, bool any_value, tv_value *out);

static bool eval_inner(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    tv_value a, b;
    bool ok;
    if (c->const_mode && !(n->flags & NF_CONST) && n->kind != N_SLICE)
        return tpl_fail(c, "Impossible", "not a compile-time constant");
    switch (n->kind) {
    case N_CONST: *out = tv_ref(n->value); return true;
    case N_NAME: return eval_name(c, s, n, out);
    case N_TUPLE: return eval_seq(c, s, n, SEQ_TUPLE, out);
    case N_LIST: return eval_seq(c, s, n, SEQ_LIST, out);
    case N_DICT: return eval_dict(c, s, n, out);
    case N_GETATTR:
        if (!eval(c, s, n->a, &a)) return false;
        ok = tpl_getattr(c, a, (tv_value){.type = TV_STR, .as.s = n->name}, out);
        tv_unref(a);
        return ok;
    case N_GETITEM:
        if (!eval(c, s, n->a, &a)) return false;
        if (n->b->kind == N_SLICE) {
            tv_value parts[3] = {tv_none(), tv_none(), tv_none()};
            const tpl_node *pn[3] = {n->b->a, n->b->b, n->b->c};
            ok = true;
            for (int i = 0; i < 3 && ok; i++)
                if (pn[i]) ok = eval(c, s, pn[i], &parts[i]);
            if (ok) ok = tpl_slice(c, a, parts, out);
            for (int i = 0; i < 3; i++) tv_unref(parts[i]);
        } else {
            ok = eval(c, s, n->b, &b);
            if (ok) {
                ok = tpl_getitem(c, a, b, out);
                tv_unref(b);
            }
        }
        tv_unref(a);
        return ok;
    case N_CALL: return eval_call(c, s, n, NULL, out);
    case N_FILTER: return eval_filter(c, s, n, NULL, out);
    case N_TEST: return eval_test(c, s, n, out);
    case N_BINOP: {
        bool folded = false; /* the base of ** became a compile-time constant */
        if (n->op == OP_POW && !c->const_mode && (n->a->flags & NF_CONST) && n->a->kind != N_CONST) {
            folded = try_const(c, s, n->a, false, &a);
            if (c->failed) return false;
        }
        if (!folded && !eval(c, s, n->a, &a)) return false;
        if (!eval(c, s, n->b, &b)) {
            tv_unref(a);
            return false;
        }
        if (folded && is_negative_number(a)) return neg_const_pow(c, a, b, out);
        ok = tpl_binop(c, n->op, a, b, out);
        tv_unref(a);
        tv_unref(b);
        return ok;
    }
    case N_CONCAT: {
        mu_buf buf = {.limit = c->max_str};
        for (size_t i = 0; i < n->list.n; i++) {
            if (!eval(c, s, n->list.v[i], &a)) {
                mu_buf_free(&buf);
                return false;
            }
            tv_write_str(&buf, a);
            tv_unref(a);
        }
        if (buf.over) {
            mu_buf_free(&buf);
            return tpl_check_len(c, SIZE_MAX);
        }
        *out = tv_str_from_buf(&buf);
        return true;
    }
    case N_COMPARE: return eval_compare(c, s, n, out);
    case N_AND:
    case N_OR:
        if (!eval(c, s, n->a, &a)) return false;
        if (tv_truthy(a) == (n->kind == N_OR)) {
            *out = a;
            return true;
        }
        tv_unref(a);
        return eval(c, s, n->b, out);
    case N_NOT:
        if (!eval(c, s, n->a, &a)) return false;
        *out = tv_bool(!tv_truthy(a));
        tv_unref(a);
        return true;
    case N_NEG:
    case N_POS: return eval_unary(c, s, n, out);
    case N_COND:
        if (!eval(c, s, n->a, &a)) return false;
        ok = tv_truthy(a);
        tv_unref(a);
        if (ok) return eval(c, s, n->b, out);
        if (n->c) return eval(c, s, n->c, out);
        {
            int line, col;
            tpl_line_col(c->t, n->pos, &line, &col);
            *out = tv_undef_msg(
                "UndefinedError",
                "the inline if-expression on line %d evaluated to false and no else section was defined.", line);
        }
        return true;
    default: return tpl_fail(c, "TemplateSyntaxError", "cannot evaluate this node");
    }
}

static bool enter(tpl_ctx *c) {
    if (++c->steps > c->max_steps)
        return tpl_fail(c, "RuntimeError", "template step limit exceeded (%llu)", (unsigned long long)c->max_steps);
    if (++c->depth > MAX_DEPTH) {
        c->depth--;
        return tpl_fail(c, "RecursionError", "maximum recursion depth exceeded");
    }
    return true;
}

/* Values jinja2 can embed as compile-time constants (has_safe_repr). */
static bool safe_repr(tv_value v) {
    switch (v.type) {
    case TV_NONE:
    case TV_BOOL:
    case TV_INT:
    case TV_FLOAT:
    case TV_STR: return true;
    case TV_LIST:
        if (v.as.l->kind != SEQ_LIST && v.as.l->kind != SEQ_TUPLE) return false;
        for (size_t i = 0; i < v.as.l->n; i++)
            if (!safe_repr(v.as.l->v[i])) return false;
        return true;
    case TV_DICT:
        for (size_t i = 0; i < v.as.d->n; i++)
            if (!safe_repr(v.as.d->k[i]) || !safe_repr(v.as.d->v[i])) return false;
        return true;
    default: return false;
    }
}

/* Compile-time folding of a constant subtree: used when it succeeds and
 * (unless printed directly) yields an embeddable constant; otherwise the
 * node is evaluated at runtime like any other. */
static bool try_const(tpl_ctx *c, tpl_scope *s, const tpl_node *n, bool any_value, tv_value *out) {
    c->const_mode = true;
    tv_value v;
    bool ok = eval_inner(c, s, n, &v);
    c->const_mode = false;
    if (ok && (any_value || safe_repr(v))) {
        *out = v;
        return true;
    }
    if (ok)
        tv_unref(v);
    else if (c->steps <= c->max_steps) {
        c->failed = false;
        c->pos_set = false;
    }
    return false;
}

static bool eval(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value *out) {
    if ((n->flags & NF_CONST) && n->kind != N_CONST && !c->const_mode && try_const(c, s, n, false, out)) return true;
    if (c->failed) return false;
    if (!enter(c)) {
        if (!c->pos_set) c->pos_set = true, c->err_pos = n->pos;
        return false;
    }
    bool ok = eval_inner(c, s, n, out);
    c->depth--;
    if (!ok && !c->pos_set) {
        c->pos_set = true;
        c->err_pos = n->pos;
    }
    return ok;
}

/* ------------------------------------------------------------- statements */
static bool assign(tpl_ctx *c, tpl_scope *s, const tpl_node *target, tv_value v) {
    if (target->kind == N_NAME) {
        scope_set(s, target->name, v);
        return true;
    }
    /* tuple unpacking */
    tv_value items;
    bool ok = tpl_iterate(c, v, &items);
    tv_unref(v);
    if (!ok) return false;
    size_t want = target->list.n, got = items.as.l->n;
    if (got != want) {
        tv_unref(items);
        if (got < want)
            return tpl_fail(c, "ValueError", "not enough values to unpack (expected %zu, got %zu)", want, got);
        return tpl_fail(c, "ValueError", "too many values to unpack (expected %zu)", want);
    }
    for (size_t i = 0; i < want && ok; i++) ok = assign(c, s, target->list.v[i], tv_ref(items.as.l->v[i]));
    tv_unref(items);
    return ok;
}

static bool write_value(tpl_ctx *c, tv_value v) {
    tv_write_str(c->out, v);
    if (c->out->over) return tpl_fail(c, "MemoryError", "output size limit exceeded (%zu bytes)", c->max_str);
    return true;
}

static bool exec_output(tpl_ctx *c, tpl_scope *s, const tpl_node *n) {
    for (size_t i = 0; i < n->list.n; i++) {
        tv_value v;
        const tpl_node *x = n->list.v[i];
        bool folded = (x->flags & NF_CONST) && x->kind != N_CONST && try_const(c, s, x, true, &v);
        if (c->failed) return false;
        if (!folded && !eval(c, s, x, &v)) return false;
        bool ok = write_value(c, v);
        tv_unref(v);
        if (!ok) return false;
    }
    return true;
}

/* The items a for statement walks: list(iterable), then the loop filter. */
static bool loop_items(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value iterable, tv_value *out) {
    tv_value items;
    if (!tpl_iterate(c, iterable, &items)) return false;
    bool ok = true;
    if (n->c) { /* `for x in xs if cond` */
        tv_value kept = tv_list_new(SEQ_LIST, items.as.l->n);
        for (size_t i = 0; i < items.as.l->n && ok; i++) {
            tpl_scope *fs = scope_new(c, s);
            tv_value t;
            ok = assign(c, fs, n->a, tv_ref(items.as.l->v[i])) && eval(c, fs, n->c, &t);
            if (ok) {
                if (tv_truthy(t)) tv_list_push(kept.as.l, tv_ref(items.as.l->v[i]));
                tv_unref(t);
            }
            scope_end(fs);
        }
        tv_unref(items);
        items = kept;
    } else if (items.as.l->kind != SEQ_LIST) {
        tv_value copy = tv_list_new(SEQ_LIST, items.as.l->n);
        for (size_t i = 0; i < items.as.l->n; i++) tv_list_push(copy.as.l, tv_ref(items.as.l->v[i]));
        tv_unref(items);
        items = copy;
    }
    if (!ok) {
        tv_unref(items);
        return false;
    }
    *out = items;
    return true;
}

/* One run of a for statement over `iterable` (depth0 > 0 for `loop(x)`
 * calls of a recursive loop). A fresh scope per iteration, as jinja2. */
static bool run_loop(tpl_ctx *c, tpl_scope *s, const tpl_node *n, tv_value iterable, int depth0) {
    tv_value items;
    if (!loop_items(c, s, n, iterable, &items)) return false;
    if (items.as.l->n == 0) {
        tv_unref(items);
        if (!n->list2.n) return true;
        tpl_node body = {.kind = S_BODY, .list = n->list2};
        tpl_scope *es = scope_new(c, s); /* else-body assignments stay local too */
        bool ok = exec_body(c, es, &body);
        scope_end(es);
        return ok;
    }
    tv_loop *lp = mu_xcalloc(1, sizeof *lp);
    lp->refs = 1;
    lp->items = items.as.l; /* takes the reference */
    lp->depth0 = depth0;
    lp->node = n;
    lp->scope = s;
    lp->active = true;
    tv_value loopv = {.type = TV_LOOP};
    loopv.as.loop = lp;
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        if (++c->steps > c->max_steps) {
            ok = tpl_fail(c, "RuntimeError", "template step limit exceeded (%llu)", (unsigned long long)c->max_steps);
            break;
        }
        lp->index0 = i;
        tpl_scope *is = scope_new(c, s);
        scope_set(is, c->t->nm_loop, tv_ref(loopv));
        ok = assign(c, is, n->a, tv_ref(items.as.l->v[i])) && exec_body(c, is, n->d);
        scope_end(is);
        if (c->loop_ctl == 1) {
            c->loop_ctl = 0;
            break;
        }
        c->loop_ctl = 0;
    }
    lp->active = false; /* `loop` may outlive the statement; its scope does not */
    tv_unref(loopv);
    return ok;
}

static bool exec_for(tpl_ctx *c, tpl_scope *s, const tpl_node *n) {
    tv_value iterable;
    if (!eval(c, s, n->b, &iterable)) return false;
    bool ok = run_loop(c, s, n, iterable, 0);
    tv_unref(iterable);
    return ok;
}

/* loop(items) inside a `recursive` loop renders the loop body over items. */
static bool call_loop(tpl_ctx *c, tv_loop *lp, const tpl_args *a, tv_value *out) {
    if (!(lp->node->flags & NF_RECURSIVE))
        return tpl_fail(c, "TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    if (a->nkw || a->npos != 1)
        return tpl_fail(c, "TypeError", "LoopContext.__call__() takes 2 positional arguments but %zu were given",
                        a->npos + 1);
    if (!lp->active) return tpl_fail(c, "RuntimeError", "the loop has finished");
    if (c->depth > MAX_MACRO_DEPTH * 4) return tpl_fail(c, "RecursionError", "maximum recursion depth exceeded");
    mu_buf buf = {.limit = c->max_str};
    mu_buf *saved = c->out;
    c->out = &buf;
    c->depth += 4;
    bool ok = run_loop(c, lp->scope, lp->node, a->pos[0], lp->depth0 + 1);
    c->depth -= 4;
    c->out = saved;
    return tpl_buf_finish(c, &buf, ok, out);
}

/* The namespace `ns` of an `ns.attr` target, or NULL after failing as jinja2 does. */
static const tv_value *nsref_target(tpl_ctx *c, tpl_scope *s, const tpl_node *target) {
    const tv_value *ns = scope_lookup(s, target->value.as.s);
    if (ns && ns->type == TV_NS) return ns;
    tpl_fail(c, "TemplateRuntimeError", "cannot assign attribute on non-namespace object");
    return NULL;
}

static bool check_nsref(tpl_ctx *c, tpl_scope *s, const tpl_node *target) {
    return nsref_target(c, s, target) != NULL;
}

static bool exec_set(tpl_ctx *c, tpl_scope *s, const tpl_node *target, tv_value v) {
    if (target->kind != N_NSREF) return assign(c, s, target, v);
    const tv_value *ns = nsref_target(c, s, target);
    if (!ns) {
        tv_unref(v);
        return false;
    }
    tv_dict_set(ns->as.ns->attrs, tv_ref((tv_value){.type = TV_STR, .as.s = target->name}), v);
    return true;
}

/* Renders a body into a string in a child scope. */
static bool capture(tpl_ctx *c, tpl_scope *s, const tpl_node *body, tv_value *out) {
    mu_buf buf = {.limit = c->max_str};
    mu_buf *saved = c->out;
    c->out = &buf;
    tpl_scope *inner = scope_new(c, s);
    bool ok = exec_body(c, inner, body);
    scope_end(inner);
    c->out = saved;
    return tpl_buf_finish(c, &buf, ok, out);
}

static bool exec_stmt(tpl_ctx *c, tpl_scope *s, const tpl_node *n) {
    tv_value v, r;
    bool ok;
    switch (n->kind) {
    case S_DATA:
        mu_buf_append(c->out, n->value.as.s->s, n->value.as.s->len);
        if (c->out->over) return tpl_fail(c, "MemoryError", "output size limit exceeded (%zu bytes)", c->max_str);
        return true;
    case S_OUTPUT: return exec_output(c, s, n);
    case S_IF:
        for (;;) {
            if (!eval(c, s, n->a, &v)) return false;
            ok = tv_truthy(v);
            tv_unref(v);
            if (ok) return exec_body(c, s, n->b);
            if (!n->c) return true;
            if (n->c->kind != S_IF) return exec_body(c, s, n->c);
            n = n->c;
        }
    case S_FOR: return exec_for(c, s, n);
    case S_SET:
        if (n->a->kind == N_NSREF && !check_nsref(c, s, n->a)) return false; /* jinja2 checks before evaluating */
        if (!eval(c, s, n->b, &v)) return false;
        return exec_set(c, s, n->a, v);
    case S_SETBLOCK:
        if (!capture(c, s, n->b, &v)) return false;
        if (n->a->kind == N_NSREF && !check_nsref(c, s, n->a)) return tv_unref(v), false;
        if (n->c) {
            ok = eval_filter_chain(c, s, n->c, v, &r);
            tv_unref(v);
            if (!ok) return false;
            v = r;
        }
        return exec_set(c, s, n->a, v);
    case S_MACRO: scope_set(s, n->name, make_macro(c, n, s, n->name->s)); return true;
    case S_CALLBLOCK: {
        tv_value caller = make_macro(c, n, s, NULL);
        ok = eval_call(c, s, n->b, &caller, &v);
        tv_unref(caller);
        if (!ok) return false;
        ok = write_value(c, v);
        tv_unref(v);
        return ok;
    }
    case S_FILTERBLOCK:
        if (!capture(c, s, n->a, &v)) return false;
        ok = eval_filter_chain(c, s, n->b, v, &r);
        tv_unref(v);
        if (!ok) return false;
        ok = write_value(c, r);
        tv_unref(r);
        return ok;
    case S_WITH: {
        tpl_scope *ws = scope_new(c, s);
        ok = true;
        for (size_t i = 0; i < n->list.n && ok; i++) {
            ok = eval(c, s, n->list2.v[i], &v);
            if (ok) ok = assign(c, ws, n->list.v[i], v);
        }
        if (ok) ok = exec_body(c, ws, n->a);
        scope_end(ws);
        return ok;
    }
    case S_BREAK: c->loop_ctl = 1; return true;
    case S_CONTINUE: c->loop_ctl = 2; return true;
    case S_BODY: return exec_body(c, s, n);
    default: return tpl_fail(c, "TemplateSyntaxError", "cannot execute this node");
    }
}

static bool exec_body(tpl_ctx *c, tpl_scope *s, const tpl_node *body) {
    for (size_t i = 0; i < body->list.n; i++) {
        const tpl_node *n = body->list.v[i];
        if (!enter(c)) {
            if (!c->pos_set) c->pos_set = true, c->err_pos = n->pos;
            return false;
        }
        bool ok = exec_stmt(c, s, n);
        c->depth--;
        if (!ok) {
            if (!c->pos_set) {
                c->pos_set = true;
                c->err_pos = n->pos;
            }
            return false;
        }
        if (c->loop_ctl) return true;
    }
    return true;
}

bool tpl_exec_root(tpl_ctx *c, tpl_scope *s) { return exec_body(c, s, c->t->root); }

tpl_scope *tpl_scope_new(tpl_ctx *c, tpl_scope *parent) { return scope_new(c, parent); }

void tpl_scope_end(tpl_scope *s) { scope_end(s); }

void tpl_scopes_free(tpl_ctx *c) {
    for (tpl_scope *s = c->all_scopes, *nx; s; s = nx) {
        nx = s->next_alloc;
        scope_clear(s);
        s->captured = false;
        free(s->vars);
        free(s);
    }
    c->all_scopes = NULL;
}
