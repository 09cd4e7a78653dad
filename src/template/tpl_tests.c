/* jinja2's builtin tests (`x is defined`, `x is divisibleby 3`, ...). */
#include "template/tpl_internal.h"
#include <stdio.h>
#include <string.h>

static bool one_arg(tpl_ctx *c, const char *name, const tpl_args *a, tv_value *v) {
    if (a->npos + a->nkw != 1)
        return tpl_fail(c, "TypeError", "%s() takes exactly 2 arguments (%zu given)", name, a->npos + a->nkw + 1);
    *v = a->npos ? a->pos[0] : a->kw[0];
    return true;
}

static bool mod_test(tpl_ctx *c, tv_value in, tv_value m, int64_t want, bool *out) {
    tv_value r, w = tv_int(want);
    if (!tpl_binop(c, OP_MOD, in, m, &r)) return false;
    *out = tv_equal(r, w);
    tv_unref(r);
    return true;
}

static bool t_odd(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)a;
    return mod_test(c, in, tv_int(2), 1, out);
}
static bool t_even(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)a;
    return mod_test(c, in, tv_int(2), 0, out);
}
static bool t_divisibleby(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    tv_value n;
    return one_arg(c, "test_divisibleby", a, &n) && mod_test(c, in, n, 0, out);
}
static bool t_defined(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type != TV_UNDEFINED;
    return true;
}
static bool t_undefined(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_UNDEFINED;
    return true;
}
static bool t_filter(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_STR && tpl_filter_lookup(in.as.s->s, in.as.s->len) >= 0;
    return true;
}
static bool t_test(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_STR && tpl_test_lookup(in.as.s->s, in.as.s->len) >= 0;
    return true;
}
static bool t_none(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_NONE;
    return true;
}
static bool t_boolean(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_BOOL;
    return true;
}
static bool t_false(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_BOOL && !in.as.b;
    return true;
}
static bool t_true(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_BOOL && in.as.b;
    return true;
}
static bool t_integer(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_INT;
    return true;
}
static bool t_float(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_FLOAT;
    return true;
}
static bool t_number(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = tv_is_number(in);
    return true;
}
static bool t_string(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_STR;
    return true;
}
static bool t_mapping(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_DICT;
    return true;
}
static bool t_escaped(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_STR && in.as.s->markup;
    return true;
}
static bool t_sequence(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_STR || in.type == TV_DICT || in.type == TV_UNDEFINED ||
           (in.type == TV_LIST && (in.as.l->kind == SEQ_LIST || in.as.l->kind == SEQ_TUPLE));
    return true;
}
static bool t_iterable(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out =
        in.type == TV_STR || in.type == TV_DICT || in.type == TV_UNDEFINED || in.type == TV_LIST || in.type == TV_LOOP;
    return true;
}
static bool t_callable(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)c;
    (void)a;
    *out = in.type == TV_FUNC || in.type == TV_UNDEFINED || in.type == TV_LOOP;
    return true;
}
static bool t_sameas(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    tv_value o = tv_none();
    if (!one_arg(c, "test_sameas", a, &o)) return false;
    if (in.type != o.type)
        *out = false;
    else if (in.type == TV_NONE)
        *out = true;
    else if (in.type == TV_BOOL)
        *out = in.as.b == o.as.b;
    else if (in.type == TV_INT)
        *out = in.as.i == o.as.i && in.as.i >= -5 && in.as.i <= 256;
    else if (in.type == TV_FLOAT)
        *out = false;
    else if (in.type == TV_UNDEFINED)
        *out = in.as.u == o.as.u && in.as.u != NULL;
    else
        *out = in.as.d == o.as.d;
    return true;
}
static bool t_lower(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)a;
    tv_value s, r;
    if (!tpl_to_str(c, in, &s)) return false;
    bool ok = tpl_call_method0(c, s, "islower", &r);
    tv_unref(s);
    if (ok) *out = r.as.b;
    return ok;
}
static bool t_upper(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    (void)a;
    tv_value s, r;
    if (!tpl_to_str(c, in, &s)) return false;
    bool ok = tpl_call_method0(c, s, "isupper", &r);
    tv_unref(s);
    if (ok) *out = r.as.b;
    return ok;
}
static bool t_in(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) {
    tv_value seq;
    return one_arg(c, "test_in", a, &seq) && tpl_contains(c, seq, in, out);
}
static bool cmp_test(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out, int op) {
    tv_value o = tv_none();
    return one_arg(c, "operator", a, &o) && tpl_compare(c, op, in, o, out);
}
static bool t_eq(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) { return cmp_test(c, in, a, out, OP_EQ); }
static bool t_ne(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) { return cmp_test(c, in, a, out, OP_NE); }
static bool t_gt(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) { return cmp_test(c, in, a, out, OP_GT); }
static bool t_ge(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) { return cmp_test(c, in, a, out, OP_GE); }
static bool t_lt(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) { return cmp_test(c, in, a, out, OP_LT); }
static bool t_le(tpl_ctx *c, tv_value in, const tpl_args *a, bool *out) { return cmp_test(c, in, a, out, OP_LE); }

typedef struct test_entry {
    const char *name;
    tpl_test_fn fn;
    const char *pyname; /* the Python callable jinja2 registers */
    int nargs;          /* arguments after the tested value */
} test_entry;

static const test_entry TESTS[] = {
    {"odd", t_odd, "test_odd", 0},
    {"even", t_even, "test_even", 0},
    {"divisibleby", t_divisibleby, "test_divisibleby", 1},
    {"defined", t_defined, "test_defined", 0},
    {"undefined", t_undefined, "test_undefined", 0},
    {"filter", t_filter, "test_filter", 0},
    {"test", t_test, "test_test", 0},
    {"none", t_none, "test_none", 0},
    {"boolean", t_boolean, "test_boolean", 0},
    {"false", t_false, "test_false", 0},
    {"true", t_true, "test_true", 0},
    {"integer", t_integer, "test_integer", 0},
    {"float", t_float, "test_float", 0},
    {"lower", t_lower, "test_lower", 0},
    {"upper", t_upper, "test_upper", 0},
    {"string", t_string, "test_string", 0},
    {"mapping", t_mapping, "test_mapping", 0},
    {"number", t_number, "test_number", 0},
    {"sequence", t_sequence, "test_sequence", 0},
    {"iterable", t_iterable, "test_iterable", 0},
    {"callable", t_callable, "callable", 0},
    {"sameas", t_sameas, "test_sameas", 1},
    {"escaped", t_escaped, "test_escaped", 0},
    {"in", t_in, "test_in", 1},
    {"==", t_eq, "eq", 1},
    {"eq", t_eq, "eq", 1},
    {"equalto", t_eq, "eq", 1},
    {"!=", t_ne, "ne", 1},
    {"ne", t_ne, "ne", 1},
    {">", t_gt, "gt", 1},
    {"gt", t_gt, "gt", 1},
    {"greaterthan", t_gt, "gt", 1},
    {"ge", t_ge, "ge", 1},
    {">=", t_ge, "ge", 1},
    {"<", t_lt, "lt", 1},
    {"lt", t_lt, "lt", 1},
    {"lessthan", t_lt, "lt", 1},
    {"<=", t_le, "le", 1},
    {"le", t_le, "le", 1},
};
#define NTESTS (int)(sizeof TESTS / sizeof TESTS[0])

int tpl_test_lookup(const char *name, size_t n) {
    for (int i = 0; i < NTESTS; i++)
        if (strlen(TESTS[i].name) == n && memcmp(TESTS[i].name, name, n) == 0) return i;
    return -1;
}

/* Python's complaint when a test gets the wrong arguments. */
static bool test_arity(tpl_ctx *c, const test_entry *t, const tpl_args *a) {
    size_t want = (size_t)t->nargs + 1, got = a->npos + 1;
    bool builtin = !strncmp(t->pyname, "test_", 5) ? false : true;
    if (a->nkw && builtin) return tpl_fail(c, "TypeError", "%s() takes no keyword arguments", t->pyname);
    if (a->nkw &&
        (!t->nargs || a->nkw > 1 || a->npos ||
         !(tv_str_is(a->kwname[0], "num") || tv_str_is(a->kwname[0], "other") || tv_str_is(a->kwname[0], "seq"))))
        return tpl_fail(c, "TypeError", "%s() got an unexpected keyword argument '%s'", t->pyname,
                        a->kwname[a->nkw - 1]->s);
    if (a->nkw) return true;
    if (got == want) return true;
    if (!strcmp(t->pyname, "callable"))
        return tpl_fail(c, "TypeError", "callable() takes exactly one argument (%zu given)", got);
    if (builtin) return tpl_fail(c, "TypeError", "%s expected %zu arguments, got %zu", t->pyname, want, got);
    if (got > want)
        return tpl_fail(c, "TypeError", "%s() takes %zu positional argument%s but %zu were given", t->pyname, want,
                        want == 1 ? "" : "s", got);
    return tpl_fail(c, "TypeError", "%s() missing 1 required positional argument: '%s'", t->pyname,
                    !strcmp(t->pyname, "test_divisibleby") ? "num"
                    : !strcmp(t->pyname, "test_sameas")    ? "other"
                                                           : "seq");
}

bool tpl_call_test(tpl_ctx *c, int id, tv_value in, const tpl_args *a, bool *out) {
    if (id < 0 || id >= NTESTS) return tpl_fail(c, "TemplateRuntimeError", "unknown test");
    if (!test_arity(c, &TESTS[id], a)) return false;
    return TESTS[id].fn(c, in, a, out);
}

bool tpl_call_test_named(tpl_ctx *c, tv_value name, tv_value in, const tpl_args *a, bool *out) {
    int id = name.type == TV_STR ? tpl_test_lookup(name.as.s->s, name.as.s->len) : -1;
    if (id < 0) {
        mu_buf b = {0};
        tv_write_repr(&b, name);
        tpl_fail(c, "TemplateRuntimeError", "No test named %s.", b.p);
        mu_buf_free(&b);
        return false;
    }
    return tpl_call_test(c, id, in, a, out);
}
