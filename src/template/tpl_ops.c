/* Python semantics of the runtime operations: attribute and item access
 * through jinja2's sandbox, slicing, operators, comparisons, membership,
 * len() and iteration, and the errors they raise. */
#include "template/tpl_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ errors */
bool tpl_fail(tpl_ctx *c, const char *exc, const char *fmt, ...) {
    if (c->failed) return false;
    c->failed = true;
    snprintf(c->exc, sizeof c->exc, "%s", exc);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    return false;
}

bool tpl_fail_undefined(tpl_ctx *c, tv_value u) {
    if (u.type == TV_UNDEFINED && u.as.u) return tpl_fail(c, u.as.u->exc, "%s", u.as.u->msg->s);
    return tpl_fail(c, "UndefinedError", "undefined value");
}

bool tpl_check_len(tpl_ctx *c, size_t n) {
    if (n > c->max_str) return tpl_fail(c, "MemoryError", "size limit exceeded (%zu bytes)", c->max_str);
    return true;
}

bool tpl_buf_finish(tpl_ctx *c, mu_buf *b, bool ok, tv_value *out) {
    if (ok && b->over) ok = tpl_check_len(c, SIZE_MAX);
    if (!ok) {
        mu_buf_free(b);
        return false;
    }
    *out = tv_str_from_buf(b);
    return true;
}

static tv_value undefined_attr(tv_value obj, const char *name, size_t n) {
    mu_buf b = {0}, r = {0};
    tv_object_type_repr(&b, obj);
    tv_write_pystr_repr(&r, b.p, b.len);
    mu_buf_puts(&r, " has no attribute ");
    tv_write_pystr_repr(&r, name, n);
    tv_value u = tv_undef_msg("UndefinedError", "%s", r.p);
    mu_buf_free(&b);
    mu_buf_free(&r);
    return u;
}

static tv_value undefined_element(tv_value obj, tv_value key) {
    if (key.type == TV_STR) return undefined_attr(obj, key.as.s->s, key.as.s->len);
    mu_buf b = {0};
    tv_object_type_repr(&b, obj);
    mu_buf_puts(&b, " has no element ");
    tv_write_repr(&b, key);
    tv_value u = tv_undef_msg("UndefinedError", "%s", b.p);
    mu_buf_free(&b);
    return u;
}

/* ---------------------------------------------------------------- helpers */

static tv_value int_or_float(double f) { return tv_float(f); }

static bool as_int(tv_value v, int64_t *out) {
    if (v.type == TV_INT)
        *out = v.as.i;
    else if (v.type == TV_BOOL)
        *out = v.as.b;
    else
        return false;
    return true;
}

static double as_double(tv_value v) {
    return v.type == TV_FLOAT ? v.as.f : v.type == TV_BOOL ? (double)v.as.b : (double)v.as.i;
}

bool tpl_length(tpl_ctx *c, tv_value v, int64_t *out) {
    switch (v.type) {
    case TV_UNDEFINED: *out = 0; return true;
    case TV_STR: *out = (int64_t)tv_str_cplen(v.as.s); return true;
    case TV_DICT: *out = (int64_t)v.as.d->n; return true;
    case TV_LOOP: *out = (int64_t)v.as.loop->items->n; return true;
    case TV_NS: *out = (int64_t)v.as.ns->attrs->n; return true; /* unreachable in jinja: no len */
    case TV_LIST:
        if (v.as.l->kind != SEQ_GENERATOR && v.as.l->kind != SEQ_REVITER) {
            *out = (int64_t)v.as.l->n;
            return true;
        }
        /* fallthrough */
    default: return tpl_fail(c, "TypeError", "object of type '%s' has no len()", tv_type_name(v));
    }
}

bool tpl_iterate(tpl_ctx *c, tv_value v, tv_value *out) {
    switch (v.type) {
    case TV_UNDEFINED: *out = tv_list_new(SEQ_LIST, 0); return true;
    case TV_LIST: *out = tv_ref(v); return true;
    case TV_DICT: {
        tv_value l = tv_list_new(SEQ_LIST, v.as.d->n);
        for (size_t i = 0; i < v.as.d->n; i++) tv_list_push(l.as.l, tv_ref(v.as.d->k[i]));
        *out = l;
        return true;
    }
    case TV_STR: {
        tv_value l = tv_list_new(SEQ_LIST, v.as.s->len);
        const tv_str *s = v.as.s;
        for (size_t i = 0; i < s->len;) {
            size_t st = i;
            tpl_utf8_next(s->s, s->len, &i);
            tv_list_push(l.as.l, tv_str_markup(tv_str_new(s->s + st, i - st), s->markup));
        }
        *out = l;
        return true;
    }
    case TV_LOOP: *out = tv_ref(tv_list_val(v.as.loop->items)); return true;
    default: return tpl_fail(c, "TypeError", "'%s' object is not iterable", tv_type_name(v));
    }
}

bool tpl_to_str(tpl_ctx *c, tv_value v, tv_value *out) {
    if (v.type == TV_STR) {
        *out = tv_str_markup(tv_ref(v), false);
        return true;
    }
    mu_buf b = {.limit = c->max_str};
    tv_write_str(&b, v);
    if (b.over) {
        mu_buf_free(&b);
        return tpl_check_len(c, SIZE_MAX);
    }
    *out = tv_str_from_buf(&b);
    return true;
}

/* ------------------------------------------------------------ attributes */
static bool is_indexable_seq(tv_value v) {
    return v.type == TV_LIST && (v.as.l->kind == SEQ_LIST || v.as.l->kind == SEQ_TUPLE);
}

static tv_value unsafe_attr(tv_value obj, const char *name, size_t n) {
    mu_buf b = {0};
    mu_buf_puts(&b, "access to attribute ");
    tv_write_pystr_repr(&b, name, n);
    mu_buf_puts(&b, " of ");
    const char *tn = tv_type_name(obj);
    tv_write_pystr_repr(&b, tn, strlen(tn));
    mu_buf_puts(&b, " object is unsafe.");
    tv_value u = tv_undef_msg("SecurityError", "%s", b.p);
    mu_buf_free(&b);
    return u;
}

/* getattr(obj, name) with the sandbox's rules, no item fallback. */
static bool attr_only(tpl_ctx *c, tv_value obj, const tv_str *name, tv_value *out, bool *found) {
    *found = false;
    if (name->len >= 2 && name->s[0] == '_' && name->s[1] == '_') {
        *out = unsafe_attr(obj, name->s, name->len);
        *found = true;
        return true;
    }
    if (obj.type == TV_NS) {
        const tv_value *v = tv_dict_get_str(obj.as.ns->attrs, name->s, name->len);
        if (v) {
            *out = tv_ref(*v);
            *found = true;
        }
        return true;
    }
    if (obj.type == TV_LOOP) {
        *out = tpl_loop_attr(c, obj.as.loop, name, found);
        return true;
    }
    return tpl_method_lookup(c, obj, name, out, found);
}

bool tpl_getattr(tpl_ctx *c, tv_value obj, tv_value name, tv_value *out) {
    if (obj.type == TV_UNDEFINED) return tpl_fail_undefined(c, obj);
    const tv_str *nm = name.as.s;
    bool found;
    if (!attr_only(c, obj, nm, out, &found)) return false;
    if (found) return true;
    if (obj.type == TV_DICT) {
        const tv_value *v = tv_dict_get(obj.as.d, name);
        if (v) {
            *out = tv_ref(*v);
            return true;
        }
    }
    *out = undefined_attr(obj, nm->s, nm->len);
    return true;
}

bool tpl_getitem(tpl_ctx *c, tv_value obj, tv_value key, tv_value *out) {
    if (obj.type == TV_UNDEFINED) return tpl_fail_undefined(c, obj);
    int64_t idx;
    if (obj.type == TV_DICT) {
        const tv_value *v = tv_dict_get(obj.as.d, key);
        if (v) {
            *out = tv_ref(*v);
            return true;
        }
    } else if ((is_indexable_seq(obj) || obj.type == TV_STR) && as_int(key, &idx)) {
        int64_t len = obj.type == TV_STR ? (int64_t)tv_str_cplen(obj.as.s) : (int64_t)obj.as.l->n;
        if (idx < 0) idx += len;
        if (idx >= 0 && idx < len) {
            if (obj.type == TV_LIST) {
                *out = tv_ref(obj.as.l->v[idx]);
            } else {
                const tv_str *s = obj.as.s;
                size_t st = s->ascii ? (size_t)idx : tpl_utf8_offset(s->s, s->len, (size_t)idx), e = st;
                tpl_utf8_next(s->s, s->len, &e);
                *out = tv_str_markup(tv_str_new(s->s + st, e - st), s->markup);
            }
            return true;
        }
    }
    if (key.type == TV_STR) {
        bool found;
        if (!attr_only(c, obj, key.as.s, out, &found)) return false;
        if (found) return true;
    }
    *out = undefined_element(obj, key);
    return true;
}

/* obj[start:stop:step]: jinja2 emits a plain Python subscript for slices
 * (no environment.getitem), so errors are Python's TypeErrors. */
static tv_value undefined_slice(tv_value obj, tv_value parts[3]) {
    mu_buf b = {0};
    tv_object_type_repr(&b, obj);
    mu_buf_puts(&b, " has no element slice(");
    for (int i = 0; i < 3; i++) {
        if (i) mu_buf_puts(&b, ", ");
        tv_write_repr(&b, parts[i]);
    }
    mu_buf_putc(&b, ')');
    tv_value u = tv_undef_msg("UndefinedError", "%s", b.p);
    mu_buf_free(&b);
    return u;
}

bool tpl_slice(tpl_ctx *c, tv_value obj, tv_value parts[3], tv_value *out) {
    if (obj.type == TV_UNDEFINED) return tpl_fail_undefined(c, obj);
    /* compile-time folding goes through environment.getitem: TypeError -> Undefined */
    bool bad_type = !is_indexable_seq(obj) && obj.type != TV_STR;
    int64_t v[3] = {0, 0, 1};
    bool has[3], bad_index = false;
    for (int i = 0; i < 3; i++) {
        has[i] = parts[i].type != TV_NONE;
        if (has[i] && !as_int(parts[i], &v[i])) bad_index = true;
    }
    if (c->const_mode && (bad_type || bad_index)) {
        *out = undefined_slice(obj, parts);
        return true;
    }
    if (obj.type == TV_DICT) return tpl_fail(c, "TypeError", "unhashable type: 'slice'");
    if (bad_type) return tpl_fail(c, "TypeError", "'%s' object is not subscriptable", tv_type_name(obj));
    for (int i = 2; i >= 0; i--) {
        if (has[i] && !as_int(parts[i], &v[i]))
            return tpl_fail(c, "TypeError", "slice indices must be integers or None or have an __index__ method");
        if (i == 2 && has[2] && v[2] == 0) return tpl_fail(c, "ValueError", "slice step cannot be zero");
    }
    int64_t len = obj.type == TV_STR ? (int64_t)tv_str_cplen(obj.as.s) : (int64_t)obj.as.l->n;
    int64_t step = has[2] ? v[2] : 1;
    int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
    int64_t se[2];
    for (int k = 0; k < 2; k++) {
        if (!has[k]) {
            se[k] = (k == 0) == (step < 0) ? upper : lower;
            continue;
        }
        int64_t x = v[k];
        if (x < 0) {
            x += len;
            if (x < lower) x = lower;
        } else if (x > upper)
            x = upper;
        se[k] = x;
    }
    if (obj.type == TV_STR) {
        const tv_str *s = obj.as.s;
        mu_buf b = {0};
        size_t *offs = NULL;
        if (!s->ascii) {
            offs = mu_xmalloc(((size_t)len + 1) * sizeof *offs);
            size_t i = 0;
            for (int64_t k = 0; k < len; k++) {
                offs[k] = i;
                tpl_utf8_next(s->s, s->len, &i);
            }
            offs[len] = s->len;
        }
        for (int64_t i = se[0]; step > 0 ? i < se[1] : i > se[1]; i += step) {
            size_t a = offs ? offs[i] : (size_t)i, e = offs ? offs[i + 1] : (size_t)i + 1;
            mu_buf_append(&b, s->s + a, e - a);
        }
        free(offs);
        *out = tv_str_markup(tv_str_from_buf(&b), s->markup);
        return true;
    }
    tv_value l = tv_list_new((tv_seq_kind)obj.as.l->kind, 0);
    for (int64_t i = se[0]; step > 0 ? i < se[1] : i > se[1]; i += step) tv_list_push(l.as.l, tv_ref(obj.as.l->v[i]));
    *out = l;
    return true;
}

/* ------------------------------------------------------------- operators */
static bool type_error_binop(tpl_ctx *c, const char *op, tv_value a, tv_value b) {
    return tpl_fail(c, "TypeError", "unsupported operand type(s) for %s: '%s' and '%s'", op, tv_type_name(a),
                    tv_type_name(b));
}

static bool concat_str(tpl_ctx *c, tv_value a, tv_value b, tv_value *out) {
    const tv_str *x = a.as.s, *y = b.as.s;
    bool markup = x->markup || y->markup;
    mu_buf buf = {.limit = c->max_str};
    if (markup && !x->markup)
        tpl_html_escape(&buf, x->s, x->len);
    else
        mu_buf_append(&buf, x->s, x->len);
    if (markup && !y->markup)
        tpl_html_escape(&buf, y->s, y->len);
    else
        mu_buf_append(&buf, y->s, y->len);
    if (buf.over) {
        mu_buf_free(&buf);
        return tpl_check_len(c, SIZE_MAX);
    }
    *out = tv_str_markup(tv_str_from_buf(&buf), markup);
    return true;
}

static bool repeat(tpl_ctx *c, tv_value seq, int64_t times, tv_value *out) {
    if (times < 0) times = 0;
    if (seq.type == TV_STR) {
        if (seq.as.s->len && (uint64_t)times > c->max_str / seq.as.s->len) return tpl_check_len(c, SIZE_MAX);
        mu_buf b = {0};
        for (int64_t i = 0; i < times; i++) mu_buf_append(&b, seq.as.s->s, seq.as.s->len);
        *out = tv_str_markup(tv_str_from_buf(&b), seq.as.s->markup);
        return true;
    }
    if (seq.as.l->n && (uint64_t)times > (c->max_str / 16) / seq.as.l->n) return tpl_check_len(c, SIZE_MAX);
    tv_value l = tv_list_new((tv_seq_kind)seq.as.l->kind, 0);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.as.l->n; k++) tv_list_push(l.as.l, tv_ref(seq.as.l->v[k]));
    *out = l;
    return true;
}

static bool py_floor_div_mod(tpl_ctx *c, int op, double x, double y, tv_value *out) {
    if (y == 0.0)
        return tpl_fail(c, "ZeroDivisionError", op == OP_MOD ? "float modulo" : "float floor division by zero");
    double mod = fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0.0) {
        if ((y < 0) != (mod < 0)) {
            mod += y;
            div -= 1.0;
        }
    } else {
        mod = copysign(0.0, y);
    }
    double floordiv;
    if (div != 0.0) {
        floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
        floordiv = copysign(0.0, x / y);
    }
    *out = tv_float(op == OP_MOD ? mod : floordiv);
    return true;
}

static bool int_pow(tpl_ctx *c, int64_t base, int64_t e, tv_value *out) {
    int64_t r = 1;
    while (e > 0) {
        if (e & 1) {
            if (__builtin_mul_overflow(r, base, &r)) return tpl_fail(c, "OverflowError", "integer result too large");
        }
        e >>= 1;
        if (e && __builtin_mul_overflow(base, base, &base))
            return tpl_fail(c, "OverflowError", "integer result too large");
    }
    *out = tv_int(r);
    return true;
}

static bool arith(tpl_ctx *c, int op, tv_value a, tv_value b, tv_value *out) {
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "** or pow()"};
    int64_t x = 0, y = 0;
    bool ints = as_int(a, &x) && as_int(b, &y);
    if (!ints && !(tv_is_number(a) && tv_is_number(b))) return type_error_binop(c, sym[op], a, b);
    double fx = as_double(a), fy = as_double(b);
    int64_t r;
    switch (op) {
    case OP_ADD:
        if (!ints) {
            *out = tv_float(fx + fy);
            return true;
        }
        if (__builtin_add_overflow(x, y, &r)) return tpl_fail(c, "OverflowError", "integer result too large");
        *out = tv_int(r);
        return true;
    case OP_SUB:
        if (!ints) {
            *out = tv_float(fx - fy);
            return true;
        }
        if (__builtin_sub_overflow(x, y, &r)) return tpl_fail(c, "OverflowError", "integer result too large");
        *out = tv_int(r);
        return true;
    case OP_MUL:
        if (!ints) {
            *out = tv_float(fx * fy);
            return true;
        }
        if (__builtin_mul_overflow(x, y, &r)) return tpl_fail(c, "OverflowError", "integer result too large");
        *out = tv_int(r);
        return true;
    case OP_DIV:
        if (fy == 0.0) return tpl_fail(c, "ZeroDivisionError", ints ? "division by zero" : "float division by zero");
        *out = int_or_float(fx / fy);
        return true;
    case OP_FLOORDIV:
    case OP_MOD:
        if (!ints) return py_floor_div_mod(c, op, fx, fy, out);
        if (y == 0)
            return tpl_fail(c, "ZeroDivisionError",
                            op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
            return op == OP_MOD ? (*out = tv_int(0), true) : tpl_fail(c, "OverflowError", "integer result too large");
        {
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                m += y;
                q -= 1;
            }
            *out = tv_int(op == OP_MOD ? m : q);
        }
        return true;
    case OP_POW:
        if (ints && y >= 0) return int_pow(c, x, y, out);
        if (fx == 0.0 && fy < 0) return tpl_fail(c, "ZeroDivisionError", "0.0 cannot be raised to a negative power");
        if (fx < 0 && fy != floor(fy)) return tpl_fail(c, "ValueError", "complex results are not supported");
        if (!ints && isfinite(fx) && isfinite(fy) && !isfinite(pow(fx, fy)))
            return tpl_fail(c, "OverflowError", "(34, 'Numerical result out of range')");
        *out = tv_float(pow(fx, fy));
        return true;
    }
    return false;
}

bool tpl_binop(tpl_ctx *c, int op, tv_value a, tv_value b, tv_value *out) {
    if (a.type == TV_UNDEFINED) return tpl_fail_undefined(c, a);
    if (op == OP_MOD && a.type == TV_STR) return tpl_format_percent(c, a, b, out); /* str.__mod__ takes anything */
    if (b.type == TV_UNDEFINED) return tpl_fail_undefined(c, b);
    if (op == OP_ADD) {
        if (a.type == TV_STR && b.type == TV_STR) return concat_str(c, a, b, out);
        if (a.type == TV_STR && !a.as.s->markup)
            return tpl_fail(c, "TypeError", "can only concatenate str (not \"%s\") to str", tv_type_name(b));
        if (a.type == TV_LIST && b.type == TV_LIST && is_indexable_seq(a) && a.as.l->kind == b.as.l->kind) {
            if (!tpl_check_len(c, (a.as.l->n + b.as.l->n) * 16)) return false;
            tv_value l = tv_list_new((tv_seq_kind)a.as.l->kind, a.as.l->n + b.as.l->n);
            for (size_t i = 0; i < a.as.l->n; i++) tv_list_push(l.as.l, tv_ref(a.as.l->v[i]));
            for (size_t i = 0; i < b.as.l->n; i++) tv_list_push(l.as.l, tv_ref(b.as.l->v[i]));
            *out = l;
            return true;
        }
        if (is_indexable_seq(a)) {
            const char *tn = tv_type_name(a);
            return tpl_fail(c, "TypeError", "can only concatenate %s (not \"%s\") to %s", tn, tv_type_name(b), tn);
        }
    }
    if (op == OP_MUL) {
        int64_t n;
        if ((a.type == TV_STR || is_indexable_seq(a)) && as_int(b, &n)) return repeat(c, a, n, out);
        if ((b.type == TV_STR || is_indexable_seq(b)) && as_int(a, &n)) return repeat(c, b, n, out);
        if (a.type == TV_STR || is_indexable_seq(a))
            return tpl_fail(c, "TypeError", "can't multiply sequence by non-int of type '%s'", tv_type_name(b));
        if (b.type == TV_STR || is_indexable_seq(b))
            return tpl_fail(c, "TypeError", "can't multiply sequence by non-int of type '%s'", tv_type_name(a));
    }
    if (op == OP_MOD && a.type == TV_STR) return tpl_format_percent(c, a, b, out);
    return arith(c, op, a, b, out);
}

static int cmp_num(tv_value a, tv_value b) {
    int64_t x = 0, y = 0;
    if (as_int(a, &x) && as_int(b, &y)) return (x > y) - (x < y);
    double fx = as_double(a), fy = as_double(b);
    if (a.type != TV_FLOAT && b.type == TV_FLOAT) {
        /* exact int-vs-float ordering for large ints */
        if (fy >= 9223372036854775808.0) return -1;
        if (fy < -9223372036854775808.0) return 1;
        if (fy == floor(fy)) {
            int64_t iy = (int64_t)fy;
            return (x > iy) - (x < iy);
        }
    }
    if (a.type == TV_FLOAT && b.type != TV_FLOAT) return -cmp_num(b, a);
    if (fx != fx || fy != fy) return 2; /* unordered */
    return (fx > fy) - (fx < fy);
}

/* Ordering of two values; 2 means unordered (NaN). */
static bool order(tpl_ctx *c, const char *opname, tv_value a, tv_value b, int *res) {
    if (a.type == TV_UNDEFINED) return tpl_fail_undefined(c, a);
    if (b.type == TV_UNDEFINED) return tpl_fail_undefined(c, b);
    if (tv_is_number(a) && tv_is_number(b)) {
        *res = cmp_num(a, b);
        return true;
    }
    if (a.type == TV_STR && b.type == TV_STR) {
        size_t n = a.as.s->len < b.as.s->len ? a.as.s->len : b.as.s->len;
        int r = memcmp(a.as.s->s, b.as.s->s, n);
        *res = r ? (r > 0) - (r < 0) : (a.as.s->len > b.as.s->len) - (a.as.s->len < b.as.s->len);
        return true;
    }
    if (is_indexable_seq(a) && is_indexable_seq(b) && a.as.l->kind == b.as.l->kind) {
        size_t n = a.as.l->n < b.as.l->n ? a.as.l->n : b.as.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_equal(a.as.l->v[i], b.as.l->v[i])) continue;
            return order(c, opname, a.as.l->v[i], b.as.l->v[i], res);
        }
        *res = (a.as.l->n > b.as.l->n) - (a.as.l->n < b.as.l->n);
        return true;
    }
    return tpl_fail(c, "TypeError", "'%s' not supported between instances of '%s' and '%s'", opname, tv_type_name(a),
                    tv_type_name(b));
}

bool tpl_compare(tpl_ctx *c, int op, tv_value a, tv_value b, bool *out) {
    static const char *const names[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    if (op == OP_EQ || op == OP_NE) {
        *out = tv_equal(a, b) == (op == OP_EQ);
        return true;
    }
    if (op == OP_IN || op == OP_NOTIN) {
        if (!tpl_contains(c, b, a, out)) return false;
        if (op == OP_NOTIN) *out = !*out;
        return true;
    }
    int r;
    if (!order(c, names[op], a, b, &r)) return false;
    if (r == 2)
        *out = false;
    else if (op == OP_LT)
        *out = r < 0;
    else if (op == OP_LE)
        *out = r <= 0;
    else if (op == OP_GT)
        *out = r > 0;
    else
        *out = r >= 0;
    return true;
}

static bool is_hashable(tv_value v) {
    if (v.type == TV_DICT || v.type == TV_NS || v.type == TV_LOOP) return false;
    if (v.type == TV_LIST) {
        if (v.as.l->kind != SEQ_TUPLE) return v.as.l->kind == SEQ_GENERATOR || v.as.l->kind == SEQ_REVITER;
        for (size_t i = 0; i < v.as.l->n; i++)
            if (!is_hashable(v.as.l->v[i])) return false;
    }
    return true;
}

bool tpl_require_hashable(tpl_ctx *c, tv_value v) {
    if (is_hashable(v)) return true;
    tv_value bad = v;
    if (v.type == TV_LIST && v.as.l->kind == SEQ_TUPLE)
        for (size_t i = 0; i < v.as.l->n; i++)
            if (!is_hashable(v.as.l->v[i])) bad = v.as.l->v[i];
    return tpl_fail(c, "TypeError", "unhashable type: '%s'", tv_type_name(bad));
}

bool tpl_contains(tpl_ctx *c, tv_value container, tv_value item, bool *out) {
    switch (container.type) {
    case TV_UNDEFINED: *out = false; return true;
    case TV_STR:
        if (item.type != TV_STR)
            return tpl_fail(c, "TypeError", "'in <string>' requires string as left operand, not %s",
                            tv_type_name(item));
        *out =
            item.as.s->len == 0 || memmem(container.as.s->s, container.as.s->len, item.as.s->s, item.as.s->len) != NULL;
        return true;
    case TV_DICT:
        if (!tpl_require_hashable(c, item)) return false;
        *out = tv_dict_get(container.as.d, item) != NULL;
        return true;
    case TV_LIST:
        *out = false;
        for (size_t i = 0; i < container.as.l->n && !*out; i++) *out = tv_equal(container.as.l->v[i], item);
        return true;
    case TV_LOOP: {
        tv_value l = tv_list_val(container.as.loop->items);
        return tpl_contains(c, l, item, out);
    }
    default: return tpl_fail(c, "TypeError", "argument of type '%s' is not iterable", tv_type_name(container));
    }
}
