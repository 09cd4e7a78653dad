/* jinja2's builtin filters, with HF's tojson. Every filter name jinja2
 * knows is in the table so that parse-time "No filter named" checks match;
 * a few never seen in chat templates fail at runtime as unsupported. */
#include "template/tpl_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* BIND(python name, hidden leading params, required params, names...):
 * the signature jinja2's filter function has, for exact TypeErrors. */
#define BIND(fname, hidden, nreq, ...)                       \
    static const char *const names_[] = {__VA_ARGS__, NULL}; \
    tv_value arg[sizeof names_ / sizeof names_[0]];          \
    bool has[sizeof names_ / sizeof names_[0]];              \
    if (!tpl_bind(c, fname, hidden, nreq, a, names_, arg, has)) return false
#define BIND0(fname, hidden)                    \
    static const char *const names_[] = {NULL}; \
    if (!tpl_bind(c, fname, hidden, 0, a, names_, NULL, NULL)) return false

static tv_value new_tuple2(tv_value x, tv_value y) {
    tv_value t = tv_list_new(SEQ_TUPLE, 2);
    tv_list_push(t.as.l, x);
    tv_list_push(t.as.l, y);
    return t;
}

static bool arg_int(tpl_ctx *c, tv_value v, int64_t *out) {
    if (v.type == TV_INT)
        *out = v.as.i;
    else if (v.type == TV_BOOL)
        *out = v.as.b;
    else
        return tpl_fail(c, "TypeError", "'%s' object cannot be interpreted as an integer", tv_type_name(v));
    return true;
}

/* make_attrgetter: "a.b.0" path through environment.getitem. */
static bool attr_path(tpl_ctx *c, tv_value item, tv_value attribute, bool lower, tv_value dflt, tv_value *out) {
    tv_value cur = tv_ref(item);
    if (attribute.type == TV_STR) {
        const tv_str *s = attribute.as.s;
        size_t a = 0;
        while (a <= s->len) {
            const char *dot = memchr(s->s + a, '.', s->len - a);
            size_t e = dot ? (size_t)(dot - s->s) : s->len;
            bool digits = e > a;
            for (size_t k = a; k < e; k++) digits = digits && s->s[k] >= '0' && s->s[k] <= '9';
            tv_value key = digits ? tv_int(strtoll(s->s + a, NULL, 10)) : tv_str_new(s->s + a, e - a), nx;
            bool ok = tpl_getitem(c, cur, key, &nx);
            tv_unref(key);
            tv_unref(cur);
            if (!ok) return false;
            cur = nx;
            if (dflt.type != TV_UNDEFINED && cur.type == TV_UNDEFINED) tv_move(&cur, tv_ref(dflt));
            a = e + 1;
            if (!dot) break;
        }
    } else if (attribute.type != TV_NONE && attribute.type != TV_UNDEFINED) {
        tv_value nx;
        bool ok = tpl_getitem(c, cur, attribute, &nx);
        tv_unref(cur);
        if (!ok) return false;
        cur = nx;
        if (dflt.type != TV_UNDEFINED && cur.type == TV_UNDEFINED) tv_move(&cur, tv_ref(dflt));
    }
    if (lower && cur.type == TV_STR) {
        tv_value l = tpl_str_case(cur, 0);
        tv_unref(cur);
        cur = l;
    }
    *out = cur;
    return true;
}

/* Sort key for sort/dictsort/min/max/unique: one attribute or "a,b". */
static bool sort_key(tpl_ctx *c, tv_value item, tv_value attribute, bool lower, tv_value *out) {
    if (attribute.type == TV_STR && memchr(attribute.as.s->s, ',', attribute.as.s->len)) {
        tv_value parts, comma = tv_str_cstr(",");
        bool ok = tpl_str_split(c, attribute, comma, -1, false, &parts);
        tv_unref(comma);
        if (!ok) return false;
        tv_value key = tv_list_new(SEQ_LIST, parts.as.l->n);
        for (size_t i = 0; i < parts.as.l->n; i++) {
            tv_value k;
            if (!attr_path(c, item, parts.as.l->v[i], lower, tv_undef_anon(), &k)) {
                tv_unref(parts);
                tv_unref(key);
                return false;
            }
            tv_list_push(key.as.l, k);
        }
        tv_unref(parts);
        *out = key;
        return true;
    }
    return attr_path(c, item, attribute, lower, tv_undef_anon(), out);
}

/* ------------------------------------------------------------ filters */
static bool f_unsupported(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out);

static bool f_abs(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    if (!tpl_bind_builtin1(c, "abs", a)) return false;
    if (in.type == TV_INT) {
        if (in.as.i == INT64_MIN) return tpl_fail(c, "OverflowError", "integer result too large");
        *out = tv_int(in.as.i < 0 ? -in.as.i : in.as.i);
    } else if (in.type == TV_BOOL)
        *out = tv_int(in.as.b);
    else if (in.type == TV_FLOAT)
        *out = tv_float(fabs(in.as.f));
    else
        return tpl_fail(c, "TypeError", "bad operand type for abs(): '%s'", tv_type_name(in));
    return true;
}

static bool f_attr(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_attr", 2, 1, "name");
    if (in.type == TV_UNDEFINED) return tpl_fail_undefined(c, in);
    if (arg[0].type != TV_STR)
        return tpl_fail(c, "TypeError", "attribute name must be string, not '%s'", tv_type_name(arg[0]));
    if (in.type == TV_DICT && !tv_dict_get(in.as.d, arg[0])) return tpl_getattr(c, in, arg[0], out);
    if (in.type == TV_DICT) { /* a key is not an attribute */
        bool found;
        if (!tpl_method_lookup(c, in, arg[0].as.s, out, &found)) return false;
        if (found) return true;
        tv_value tmp = tv_dict_new();
        bool ok = tpl_getattr(c, tmp, arg[0], out);
        tv_unref(tmp);
        return ok;
    }
    return tpl_getattr(c, in, arg[0], out);
}

static bool f_batch(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_batch", 1, 1, "linecount", "fill_with");
    int64_t n = 1;
    if (!arg_int(c, arg[0], &n)) return false;
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    tv_value res = tv_list_new(SEQ_GENERATOR, 0), tmp = tv_list_new(SEQ_LIST, 0);
    for (size_t i = 0; i < items.as.l->n; i++) {
        if ((int64_t)tmp.as.l->n == n) {
            tv_list_push(res.as.l, tmp);
            tmp = tv_list_new(SEQ_LIST, 0);
        }
        tv_list_push(tmp.as.l, tv_ref(items.as.l->v[i]));
    }
    if (tmp.as.l->n) {
        if (has[1] && arg[1].type != TV_NONE)
            while ((int64_t)tmp.as.l->n < n) tv_list_push(tmp.as.l, tv_ref(arg[1]));
        tv_list_push(res.as.l, tmp);
    } else
        tv_unref(tmp);
    tv_unref(items);
    *out = res;
    return true;
}

static bool f_case(tpl_ctx *c, tv_value in, tv_value *out, int mode) {
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    *out = tpl_str_case(s, mode);
    tv_unref(s);
    return true;
}
static bool f_lower(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_lower", 1);
    return f_case(c, in, out, 0);
}
static bool f_upper(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_upper", 1);
    return f_case(c, in, out, 1);
}

static bool f_capitalize(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_capitalize", 1);
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    /* capitalize == first code point upper-cased, rest lower-cased */
    tv_value low = tpl_str_case(s, 0);
    mu_buf b = {0};
    if (low.as.s->len) {
        size_t i = 0, j = 0;
        uint32_t cp = tpl_utf8_next(s.as.s->s, s.as.s->len, &i);
        if (cp == 0xDF)
            mu_buf_puts(&b, "Ss");
        else
            tpl_utf8_put(&b, tpl_cp_upper(cp));
        tpl_utf8_next(low.as.s->s, low.as.s->len, &j);
        mu_buf_append(&b, low.as.s->s + j, low.as.s->len - j);
    }
    *out = tv_str_markup(tv_str_from_buf(&b), s.as.s->markup);
    tv_unref(low);
    tv_unref(s);
    return true;
}

static bool f_center(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_center", 1, 0, "width");
    int64_t width = 80;
    if (has[0] && !arg_int(c, arg[0], &width)) return false;
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    int64_t len = (int64_t)tv_str_cplen(s.as.s), total = width > len ? width - len : 0;
    int64_t left = total / 2 + (total & width & 1);
    if (!tpl_check_len(c, (size_t)total)) return tv_unref(s), false;
    mu_buf b = {0};
    for (int64_t i = 0; i < left; i++) mu_buf_putc(&b, ' ');
    mu_buf_append(&b, s.as.s->s, s.as.s->len);
    for (int64_t i = left; i < total; i++) mu_buf_putc(&b, ' ');
    *out = tv_str_markup(tv_str_from_buf(&b), s.as.s->markup);
    tv_unref(s);
    return true;
}

static bool f_length(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    if (!tpl_bind_builtin1(c, "len", a)) return false;
    int64_t n = 1;
    if (!tpl_length(c, in, &n)) return false;
    *out = tv_int(n);
    return true;
}

static bool f_default(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_default", 1, 0, "default_value", "boolean");
    bool boolean = has[1] && tv_truthy(arg[1]);
    if (in.type == TV_UNDEFINED || (boolean && !tv_truthy(in)))
        *out = has[0] ? tv_ref(arg[0]) : tv_str_new("", 0);
    else
        *out = tv_ref(in);
    return true;
}

static bool f_dictsort(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_dictsort", 1, 0, "case_sensitive", "by", "reverse");
    bool cs = has[0] && tv_truthy(arg[0]), rev = has[2] && tv_truthy(arg[2]);
    int pos = 0;
    if (has[1]) {
        if (arg[1].type == TV_STR && tv_str_is(arg[1].as.s, "value"))
            pos = 1;
        else if (!(arg[1].type == TV_STR && tv_str_is(arg[1].as.s, "key")))
            return tpl_fail(c, "FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
    }
    if (in.type == TV_UNDEFINED) return tpl_fail_undefined(c, in); /* Undefined.items raises */
    if (in.type != TV_DICT)
        return tpl_fail(c, "AttributeError", "'%s' object has no attribute 'items'", tv_type_name(in));
    const tv_dict *d = in.as.d;
    tv_value *keys = mu_xmalloc((d->n + 1) * sizeof *keys), *vals = mu_xmalloc((d->n + 1) * sizeof *vals);
    for (size_t i = 0; i < d->n; i++) {
        tv_value k = pos ? d->v[i] : d->k[i];
        keys[i] = (!cs && k.type == TV_STR) ? tpl_str_case(k, 0) : tv_ref(k);
        vals[i] = new_tuple2(tv_ref(d->k[i]), tv_ref(d->v[i]));
    }
    bool ok = tpl_sort_values(c, keys, vals, d->n, rev);
    tv_value l = tv_list_new(SEQ_LIST, d->n);
    for (size_t i = 0; i < d->n; i++) {
        tv_unref(keys[i]);
        tv_list_push(l.as.l, vals[i]);
    }
    free(keys);
    free(vals);
    if (!ok) return tv_unref(l), false;
    *out = l;
    return true;
}

static bool f_escape_common(tpl_ctx *c, tv_value in, tv_value *out, bool force) {
    if (in.type == TV_STR && in.as.s->markup && !force) {
        *out = tv_ref(in);
        return true;
    }
    tv_value s;
    if (!tpl_to_str(c, in, &s)) return false;
    mu_buf b = {0};
    tpl_html_escape(&b, s.as.s->s, s.as.s->len);
    tv_unref(s);
    *out = tv_str_markup(tv_str_from_buf(&b), true);
    return true;
}
static bool f_escape(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    return tpl_bind_builtin1(c, "markupsafe._speedups.escape", a) && f_escape_common(c, in, out, false);
}
static bool f_forceescape(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_forceescape", 1);
    return f_escape_common(c, in, out, true);
}

static bool f_first(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("sync_do_first", 2);
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    *out =
        items.as.l->n ? tv_ref(items.as.l->v[0]) : tv_undef_msg("UndefinedError", "No first item, sequence was empty.");
    tv_unref(items);
    return true;
}

static bool f_last(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_last", 2);
    bool reversible = in.type == TV_STR || in.type == TV_DICT || in.type == TV_UNDEFINED ||
                      (in.type == TV_LIST && in.as.l->kind != SEQ_GENERATOR && in.as.l->kind != SEQ_REVITER);
    if (!reversible) return tpl_fail(c, "TypeError", "'%s' object is not reversible", tv_type_name(in));
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    *out = items.as.l->n ? tv_ref(items.as.l->v[items.as.l->n - 1])
                         : tv_undef_msg("UndefinedError", "No last item, sequence was empty.");
    tv_unref(items);
    return true;
}

/* Python float(str): optional whitespace, sign, digits with single
 * underscores, inf/nan words. */
static bool parse_py_float(const tv_str *s, double *out) {
    size_t a = 0, e = s->len;
    while (a < e && tpl_py_isspace((unsigned char)s->s[a])) a++;
    while (e > a && tpl_py_isspace((unsigned char)s->s[e - 1])) e--;
    if (a == e || e - a > 400) return false;
    char tmp[512];
    size_t m = 0;
    for (size_t i = a; i < e; i++) {
        char ch = s->s[i];
        if (ch == '_') {
            if (i == a || i + 1 == e || !(s->s[i - 1] >= '0' && s->s[i - 1] <= '9') ||
                !(s->s[i + 1] >= '0' && s->s[i + 1] <= '9'))
                return false;
            continue;
        }
        if (!((ch >= '0' && ch <= '9') || ch == '.' || ch == 'e' || ch == 'E' || ch == '+' || ch == '-' ||
              ((ch | 32) >= 'a' && (ch | 32) <= 'z')))
            return false;
        tmp[m++] = ch;
    }
    tmp[m] = '\0';
    const char *p = tmp + ((tmp[0] == '+' || tmp[0] == '-') ? 1 : 0);
    if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity") || !strcasecmp(p, "nan")) {
        *out = strtod(tmp, NULL);
        return true;
    }
    for (const char *q = p; *q; q++)
        if ((*q | 32) >= 'a' && (*q | 32) <= 'z' && (*q | 32) != 'e') return false;
    if (!(p[0] >= '0' && p[0] <= '9') && !(p[0] == '.' && p[1] >= '0' && p[1] <= '9')) return false;
    char *end;
    *out = strtod(tmp, &end);
    return *end == '\0';
}

static bool f_float(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_float", 1, 0, "default");
    tv_value dflt = has[0] ? arg[0] : tv_float(0.0);
    double f;
    switch (in.type) {
    case TV_FLOAT: *out = in; return true;
    case TV_INT: *out = tv_float((double)in.as.i); return true;
    case TV_BOOL: *out = tv_float(in.as.b); return true;
    case TV_UNDEFINED: return tpl_fail_undefined(c, in);
    case TV_STR:
        if (parse_py_float(in.as.s, &f)) {
            *out = tv_float(f);
            return true;
        }
        /* fallthrough */
    default: *out = tv_ref(dflt); return true;
    }
}

/* Python int(str, base). */
static bool parse_py_int(const tv_str *s, int64_t base, int64_t *out) {
    size_t a = 0, e = s->len;
    while (a < e && tpl_py_isspace((unsigned char)s->s[a])) a++;
    while (e > a && tpl_py_isspace((unsigned char)s->s[e - 1])) e--;
    bool neg = false;
    if (a < e && (s->s[a] == '+' || s->s[a] == '-')) neg = s->s[a++] == '-';
    if (a + 1 < e && s->s[a] == '0') {
        char p = s->s[a + 1] | 32;
        int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == 0 || base == pb)) {
            base = pb;
            a += 2;
            if (a < e && s->s[a] == '_') a++;
        }
    }
    if (base == 0) base = 10;
    if (a == e) return false;
    uint64_t v = 0;
    for (size_t i = a; i < e; i++) {
        char ch = s->s[i];
        if (ch == '_' && i > a && i + 1 < e && s->s[i + 1] != '_') continue;
        int d = (ch >= '0' && ch <= '9')                 ? ch - '0'
                : ((ch | 32) >= 'a' && (ch | 32) <= 'z') ? (ch | 32) - 'a' + 10
                                                         : 99;
        if (d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool f_int(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_int", 1, 0, "default", "base");
    tv_value dflt = has[0] ? arg[0] : tv_int(0);
    int64_t base = 10, v;
    if (has[1] && !arg_int(c, arg[1], &base)) return false;
    double f;
    switch (in.type) {
    case TV_INT: *out = in; return true;
    case TV_BOOL: *out = tv_int(in.as.b); return true;
    case TV_FLOAT:
        if (isnan(in.as.f)) return tpl_fail(c, "ValueError", "cannot convert float NaN to integer");
        if (isinf(in.as.f)) return tpl_fail(c, "OverflowError", "cannot convert float infinity to integer");
        if (fabs(in.as.f) >= 9.2233720368547758e18) return tpl_fail(c, "OverflowError", "integer result too large");
        *out = tv_int((int64_t)in.as.f);
        return true;
    case TV_UNDEFINED: return tpl_fail_undefined(c, in);
    case TV_STR:
        if (parse_py_int(in.as.s, base, &v)) {
            *out = tv_int(v);
            return true;
        }
        if (parse_py_float(in.as.s, &f) && !isnan(f) && !isinf(f) && fabs(f) < 9.2233720368547758e18) {
            *out = tv_int((int64_t)f);
            return true;
        }
        /* fallthrough */
    default: *out = tv_ref(dflt); return true;
    }
}

static bool f_indent(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_indent", 1, 0, "width", "first", "blank");
    mu_buf ind = {0};
    if (has[0] && arg[0].type == TV_STR)
        mu_buf_append(&ind, arg[0].as.s->s, arg[0].as.s->len);
    else {
        int64_t w = 4;
        if (has[0] && arg[0].type != TV_INT && arg[0].type != TV_BOOL)
            return tpl_fail(c, "TypeError", "can't multiply sequence by non-int of type '%s'", tv_type_name(arg[0]));
        if (has[0]) arg_int(c, arg[0], &w);
        if (!tpl_check_len(c, w > 0 ? (size_t)w : 0)) return false;
        for (int64_t i = 0; i < w; i++) mu_buf_putc(&ind, ' ');
    }
    bool first = has[1] && tv_truthy(arg[1]), blank = has[2] && tv_truthy(arg[2]);
    if (in.type != TV_STR) { /* s += "\n"; s.splitlines() */
        mu_buf_free(&ind);
        if (in.type == TV_UNDEFINED) return tpl_fail_undefined(c, in);
        if (in.type == TV_LIST && in.as.l->kind == SEQ_LIST)
            return tpl_fail(c, "AttributeError", "'list' object has no attribute 'splitlines'");
        if (in.type == TV_LIST && in.as.l->kind == SEQ_TUPLE)
            return tpl_fail(c, "TypeError", "can only concatenate tuple (not \"str\") to tuple");
        return tpl_fail(c, "TypeError", "unsupported operand type(s) for +=: '%s' and 'str'", tv_type_name(in));
    }
    /* s += "\n"; lines = s.splitlines() */
    tv_value s;
    {
        mu_buf t = {0};
        mu_buf_append(&t, in.as.s->s, in.as.s->len);
        mu_buf_putc(&t, '\n');
        s = tv_str_from_buf(&t);
    }
    tv_value lines;
    bool ok = tpl_call_method0(c, s, "splitlines", &lines);
    tv_unref(s);
    if (!ok) {
        mu_buf_free(&ind);
        return false;
    }
    mu_buf b = {.limit = c->max_str};
    if (first) mu_buf_append(&b, ind.p, ind.len);
    for (size_t i = 0; i < lines.as.l->n; i++) {
        const tv_str *ln = lines.as.l->v[i].as.s;
        if (i) {
            mu_buf_putc(&b, '\n');
            if (blank || ln->len) mu_buf_append(&b, ind.p, ind.len);
        }
        mu_buf_append(&b, ln->s, ln->len);
    }
    tv_unref(lines);
    mu_buf_free(&ind);
    if (b.over) {
        mu_buf_free(&b);
        return tpl_check_len(c, SIZE_MAX);
    }
    *out = tv_str_markup(tv_str_from_buf(&b), in.as.s->markup);
    return true;
}

static bool f_items(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_items", 1);
    if (in.type == TV_UNDEFINED) {
        *out = tv_list_new(SEQ_GENERATOR, 0);
        return true;
    }
    if (in.type != TV_DICT) return tpl_fail(c, "TypeError", "Can only get item pairs from a mapping.");
    tv_value l = tv_list_new(SEQ_GENERATOR, in.as.d->n);
    for (size_t i = 0; i < in.as.d->n; i++)
        tv_list_push(l.as.l, new_tuple2(tv_ref(in.as.d->k[i]), tv_ref(in.as.d->v[i])));
    *out = l;
    return true;
}

static bool f_join(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("sync_do_join", 2, 0, "d", "attribute");
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    mu_buf b = {.limit = c->max_str};
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        if (i && has[0]) tv_write_str(&b, arg[0]);
        tv_value v = items.as.l->v[i];
        if (has[1] && arg[1].type != TV_NONE) {
            tv_value x;
            ok = attr_path(c, v, arg[1], false, tv_undef_anon(), &x);
            if (ok) {
                tv_write_str(&b, x);
                tv_unref(x);
            }
        } else
            tv_write_str(&b, v);
    }
    tv_unref(items);
    return tpl_buf_finish(c, &b, ok, out);
}

static bool f_list(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("sync_do_list", 1);
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    tv_value l = tv_list_new(SEQ_LIST, items.as.l->n);
    for (size_t i = 0; i < items.as.l->n; i++) tv_list_push(l.as.l, tv_ref(items.as.l->v[i]));
    tv_unref(items);
    *out = l;
    return true;
}

static bool kw_lookup(const tpl_args *a, const char *name, tv_value *v) {
    for (size_t i = 0; i < a->nkw; i++)
        if (tv_str_is(a->kwname[i], name)) {
            *v = a->kw[i];
            return true;
        }
    return false;
}

static bool f_map(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    tv_value res = tv_list_new(SEQ_GENERATOR, 0);
    *out = res;
    if (!tv_truthy(in)) return true;
    tv_value attribute, dflt = tv_undef_anon();
    bool by_attr = !a->npos && kw_lookup(a, "attribute", &attribute);
    if (by_attr) {
        kw_lookup(a, "default", &dflt);
        for (size_t i = 0; i < a->nkw; i++)
            if (!tv_str_is(a->kwname[i], "attribute") && !tv_str_is(a->kwname[i], "default"))
                return tv_unref(res),
                       tpl_fail(c, "FilterArgumentError", "Unexpected keyword argument '%s'", a->kwname[i]->s);
        if (dflt.type == TV_NONE) dflt = tv_undef_anon();
    } else if (!a->npos) {
        tv_unref(res);
        return tpl_fail(c, "FilterArgumentError", "map requires a filter argument");
    }
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return tv_unref(res), false;
    tpl_args rest = {.npos = a->npos ? a->npos - 1 : 0,
                     .pos = a->npos ? a->pos + 1 : NULL,
                     .nkw = a->nkw,
                     .kwname = a->kwname,
                     .kw = a->kw};
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        tv_value r;
        ok = by_attr ? attr_path(c, items.as.l->v[i], attribute, false, dflt, &r)
                     : tpl_call_filter_named(c, a->pos[0], items.as.l->v[i], &rest, &r);
        if (ok) tv_list_push(res.as.l, r);
    }
    tv_unref(items);
    if (!ok) tv_unref(res);
    return ok;
}

static bool minmax(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out, bool is_max) {
    BIND(is_max ? "do_max" : "do_min", 2, 0, "case_sensitive", "attribute");
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    if (!items.as.l->n) {
        tv_unref(items);
        *out = tv_undef_msg("UndefinedError", "No aggregated item, sequence was empty.");
        return true;
    }
    bool lower = !(has[0] && tv_truthy(arg[0]));
    tv_value attribute = has[1] ? arg[1] : tv_none();
    size_t best = 0;
    tv_value bestkey;
    bool ok = attr_path(c, items.as.l->v[0], attribute, lower, tv_undef_anon(), &bestkey);
    for (size_t i = 1; i < items.as.l->n && ok; i++) {
        tv_value k;
        bool better;
        ok = attr_path(c, items.as.l->v[i], attribute, lower, tv_undef_anon(), &k);
        if (!ok) break;
        ok = tpl_compare(c, OP_LT, is_max ? bestkey : k, is_max ? k : bestkey, &better);
        if (ok && better) {
            tv_move(&bestkey, k);
            best = i;
        } else
            tv_unref(k);
    }
    if (ok) {
        tv_unref(bestkey);
        *out = tv_ref(items.as.l->v[best]);
    }
    tv_unref(items);
    return ok;
}
static bool f_max(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) { return minmax(c, in, a, out, true); }
static bool f_min(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) { return minmax(c, in, a, out, false); }

/* select / reject / selectattr / rejectattr */
static bool select_common(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out, bool want, bool by_attr) {
    tv_value res = tv_list_new(SEQ_GENERATOR, 0);
    *out = res;
    if (!tv_truthy(in)) return true;
    size_t off = 0;
    tv_value attribute = tv_none();
    if (by_attr) {
        if (!a->npos) return tv_unref(res), tpl_fail(c, "FilterArgumentError", "Missing parameter for attribute name");
        attribute = a->pos[0];
        off = 1;
    }
    bool has_test = a->npos > off;
    tpl_args rest = {.npos = has_test ? a->npos - off - 1 : 0,
                     .pos = has_test ? a->pos + off + 1 : NULL,
                     .nkw = a->nkw,
                     .kwname = a->kwname,
                     .kw = a->kw};
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return tv_unref(res), false;
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        tv_value v = items.as.l->v[i], x;
        ok = attr_path(c, v, attribute, false, tv_undef_anon(), &x);
        if (!ok) break;
        bool r;
        if (has_test)
            ok = tpl_call_test_named(c, a->pos[off], x, &rest, &r);
        else
            r = tv_truthy(x);
        tv_unref(x);
        if (ok && r == want) tv_list_push(res.as.l, tv_ref(v));
    }
    tv_unref(items);
    if (!ok) tv_unref(res);
    return ok;
}
static bool f_select(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    return select_common(c, in, a, out, true, false);
}
static bool f_reject(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    return select_common(c, in, a, out, false, false);
}
static bool f_selectattr(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    return select_common(c, in, a, out, true, true);
}
static bool f_rejectattr(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    return select_common(c, in, a, out, false, true);
}

static bool f_replace(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_replace", 2, 2, "old", "new", "count");
    int64_t count = -1;
    if (has[2] && arg[2].type != TV_NONE && !arg_int(c, arg[2], &count)) return false;
    tv_value s, o, n;
    if (!tpl_to_str(c, in, &s)) return false;
    if (!tpl_to_str(c, arg[0], &o)) return tv_unref(s), false;
    if (!tpl_to_str(c, arg[1], &n)) return tv_unref(s), tv_unref(o), false;
    bool ok = tpl_str_replace(c, s, o, n, count, out);
    tv_unref(s);
    tv_unref(o);
    tv_unref(n);
    return ok;
}

static bool f_reverse(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_reverse", 1);
    if (in.type == TV_STR) {
        const tv_str *s = in.as.s;
        mu_buf b = {0};
        size_t e = s->len;
        while (e > 0) {
            size_t st = e - 1;
            while (st > 0 && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            mu_buf_append(&b, s->s + st, e - st);
            e = st;
        }
        *out = tv_str_markup(tv_str_from_buf(&b), s->markup);
        return true;
    }
    tv_value items;
    if (!tpl_iterate(c, in, &items)) {
        c->failed = false;
        return tpl_fail(c, "FilterArgumentError", "argument must be iterable");
    }
    bool iter_kind = in.type == TV_UNDEFINED || in.type == TV_DICT ||
                     (in.type == TV_LIST && in.as.l->kind != SEQ_GENERATOR && in.as.l->kind != SEQ_REVITER);
    tv_value l = tv_list_new(iter_kind ? SEQ_REVITER : SEQ_LIST, items.as.l->n);
    for (size_t i = items.as.l->n; i-- > 0;) tv_list_push(l.as.l, tv_ref(items.as.l->v[i]));
    tv_unref(items);
    *out = l;
    return true;
}

/* round(x, n) correctly rounded, half to even, like Python. */
static double py_round(double x, int64_t nd) {
    if (isnan(x) || isinf(x)) return x;
    if (nd > 300) return x;
    if (nd >= 0) {
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    double p = 1.0;
    for (int64_t i = 0; i < -nd && p < 1e308; i++) p *= 10.0;
    double y = x / p;
    double r = nearbyint(y);
    return r * p;
}

static bool f_round(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_round", 1, 0, "precision", "method");
    int64_t prec = 0;
    if (has[0] && !arg_int(c, arg[0], &prec)) return false;
    int method = 0;
    if (has[1]) {
        if (arg[1].type == TV_STR && tv_str_is(arg[1].as.s, "ceil"))
            method = 1;
        else if (arg[1].type == TV_STR && tv_str_is(arg[1].as.s, "floor"))
            method = 2;
        else if (!(arg[1].type == TV_STR && tv_str_is(arg[1].as.s, "common")))
            return tpl_fail(c, "FilterArgumentError", "method must be common, ceil or floor");
    }
    if (method != 0 && !tv_is_number(in)) { /* math.ceil(value * 10 ** precision) */
        tv_value scaled;
        if (!tpl_binop(c, OP_MUL, in, tv_int(1), &scaled)) return false;
        tv_unref(scaled);
        return tpl_fail(c, "TypeError", "must be real number, not %s", tv_type_name(in));
    }
    if (!tv_is_number(in)) return tpl_fail(c, "TypeError", "type %s doesn't define __round__ method", tv_type_name(in));
    if (method == 0) {
        if (in.type != TV_FLOAT) {
            int64_t v = in.type == TV_BOOL ? in.as.b : in.as.i;
            if (prec < 0) v = (int64_t)py_round((double)v, prec);
            *out = tv_int(v);
        } else
            *out = tv_float(py_round(in.as.f, prec));
        return true;
    }
    double scale = pow(10.0, (double)prec);
    double v = in.type == TV_FLOAT ? in.as.f : (double)(in.type == TV_BOOL ? in.as.b : in.as.i);
    double r = method == 1 ? ceil(v * scale) : floor(v * scale);
    *out = tv_float(r / scale);
    return true;
}

static bool f_safe(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_mark_safe", 1);
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    *out = tv_str_markup(s, true);
    return true;
}

static bool f_slice(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("sync_do_slice", 1, 1, "slices", "fill_with");
    int64_t slices = 1;
    if (!arg_int(c, arg[0], &slices)) return false;
    if (slices <= 0) return tpl_fail(c, "ZeroDivisionError", "integer division or modulo by zero");
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    int64_t len = (int64_t)items.as.l->n, per = len / slices, extra = len % slices, offset = 0;
    tv_value res = tv_list_new(SEQ_GENERATOR, (size_t)slices);
    for (int64_t k = 0; k < slices; k++) {
        int64_t start = offset + k * per;
        if (k < extra) offset++;
        int64_t end = offset + (k + 1) * per;
        tv_value tmp = tv_list_new(SEQ_LIST, 0);
        for (int64_t i = start; i < end; i++) tv_list_push(tmp.as.l, tv_ref(items.as.l->v[i]));
        if (has[1] && arg[1].type != TV_NONE && k >= extra) tv_list_push(tmp.as.l, tv_ref(arg[1]));
        tv_list_push(res.as.l, tmp);
    }
    tv_unref(items);
    *out = res;
    return true;
}

static bool f_sort(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_sort", 2, 0, "reverse", "case_sensitive", "attribute");
    bool rev = has[0] && tv_truthy(arg[0]), lower = !(has[1] && tv_truthy(arg[1]));
    tv_value attribute = has[2] ? arg[2] : tv_none();
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    size_t n = items.as.l->n;
    tv_value *keys = mu_xmalloc((n + 1) * sizeof *keys), *vals = mu_xmalloc((n + 1) * sizeof *vals);
    bool ok = true;
    size_t made = 0;
    for (; made < n && ok; made++) {
        vals[made] = tv_ref(items.as.l->v[made]);
        ok = sort_key(c, items.as.l->v[made], attribute, lower, &keys[made]);
        if (!ok) tv_unref(vals[made]);
    }
    if (!ok) made--;
    if (ok) ok = tpl_sort_values(c, keys, vals, n, rev);
    tv_value l = tv_list_new(SEQ_LIST, n);
    for (size_t i = 0; i < made; i++) {
        tv_unref(keys[i]);
        tv_list_push(l.as.l, vals[i]);
    }
    free(keys);
    free(vals);
    tv_unref(items);
    if (!ok) return tv_unref(l), false;
    *out = l;
    return true;
}

static bool f_string(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    if (!tpl_bind_builtin1(c, "markupsafe._speedups.soft_str", a)) return false;
    return tpl_str_of(c, in, out);
}

static bool f_sum(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("sync_do_sum", 2, 0, "attribute", "start");
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    tv_value acc = has[1] ? tv_ref(arg[1]) : tv_int(0);
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        tv_value x, r;
        if (has[0] && arg[0].type != TV_NONE)
            ok = attr_path(c, items.as.l->v[i], arg[0], false, tv_undef_anon(), &x);
        else
            x = tv_ref(items.as.l->v[i]);
        if (!ok) break;
        ok = tpl_binop(c, OP_ADD, acc, x, &r);
        tv_unref(x);
        if (ok) tv_move(&acc, r);
    }
    tv_unref(items);
    if (!ok) return tv_unref(acc), false;
    *out = acc;
    return true;
}

/* jinja's title: split on [-\s({\[<]+, first char upper, rest lower. */
static bool f_title(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_title", 1);
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    const tv_str *t = s.as.s;
    mu_buf b = {0};
    bool at_start = true;
    for (size_t i = 0; i < t->len;) {
        uint32_t cp = tpl_utf8_next(t->s, t->len, &i);
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || tpl_py_isspace(cp);
        if (sep) {
            tpl_utf8_put(&b, cp);
            at_start = true;
        } else if (at_start) {
            if (cp == 0xDF)
                mu_buf_puts(&b, "SS");
            else
                tpl_utf8_put(&b, tpl_cp_upper(cp));
            at_start = false;
        } else {
            tpl_utf8_put(&b, tpl_cp_lower(cp));
        }
    }
    tv_unref(s);
    *out = tv_str_from_buf(&b);
    return true;
}

static bool f_tojson(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("_cached_compile_jinja_template.<locals>.tojson", 1, 0, "ensure_ascii", "indent", "separators", "sort_keys");
    tpl_json_opts o = {.item_sep = ", ", .item_sep_len = 2, .key_sep = ": ", .key_sep_len = 2};
    o.ensure_ascii = has[0] && tv_truthy(arg[0]);
    o.sort_keys = has[3] && tv_truthy(arg[3]);
    char spaces[256];
    if (has[1] && arg[1].type != TV_NONE) {
        o.has_indent = true;
        o.item_sep = ",";
        o.item_sep_len = 1;
        if (arg[1].type == TV_STR) {
            o.indent = arg[1].as.s->s;
            o.indent_len = arg[1].as.s->len;
        } else if (arg[1].type == TV_INT || arg[1].type == TV_BOOL) {
            int64_t w = arg[1].type == TV_INT ? arg[1].as.i : arg[1].as.b;
            if (w > 255) return tpl_fail(c, "ValueError", "indent too large");
            if (w < 0) w = 0;
            memset(spaces, ' ', (size_t)w);
            o.indent = spaces;
            o.indent_len = (size_t)w;
        } else {
            return tpl_fail(c, "TypeError", "can't multiply sequence by non-int of type '%s'", tv_type_name(arg[1]));
        }
    }
    if (has[2] && arg[2].type != TV_NONE) {
        tv_value seps;
        if (!tpl_iterate(c, arg[2], &seps)) return false;
        bool ok = seps.as.l->n == 2 && seps.as.l->v[0].type == TV_STR && seps.as.l->v[1].type == TV_STR;
        if (ok) {
            o.item_sep = seps.as.l->v[0].as.s->s;
            o.item_sep_len = seps.as.l->v[0].as.s->len;
            o.key_sep = seps.as.l->v[1].as.s->s;
            o.key_sep_len = seps.as.l->v[1].as.s->len;
        }
        mu_buf b = {.limit = c->max_str};
        if (ok)
            ok = tpl_json_dump(c, &b, in, &o, 0);
        else
            tpl_fail(c, "ValueError", "separators must be a pair of strings");
        tv_unref(seps);
        return tpl_buf_finish(c, &b, ok, out);
    }
    mu_buf b = {.limit = c->max_str};
    return tpl_buf_finish(c, &b, tpl_json_dump(c, &b, in, &o, 0), out);
}

static bool f_trim(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_trim", 1, 0, "chars");
    const tv_str *chars = NULL;
    if (has[0] && arg[0].type != TV_NONE) {
        if (arg[0].type != TV_STR) return tpl_fail(c, "TypeError", "strip arg must be None or str");
        chars = arg[0].as.s;
    }
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    *out = tpl_str_strip(s, chars, true, true);
    tv_unref(s);
    return true;
}

static bool f_truncate(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_truncate", 2, 0, "length", "killwords", "end", "leeway");
    int64_t length = 255, leeway = 5;
    if (has[0] && !arg_int(c, arg[0], &length)) return false;
    if (has[3] && arg[3].type != TV_NONE && !arg_int(c, arg[3], &leeway)) return false;
    bool kill = has[1] && tv_truthy(arg[1]);
    tv_value end = has[2] ? arg[2] : tv_undef_anon();
    const char *ends = end.type == TV_STR ? end.as.s->s : "...";
    size_t endlen = end.type == TV_STR ? end.as.s->len : 3;
    int64_t endcp = end.type == TV_STR ? (int64_t)tv_str_cplen(end.as.s) : 3;
    if (length < endcp)
        return tpl_fail(c, "AssertionError", "expected length >= %lld, got %lld", (long long)endcp, (long long)length);
    if (leeway < 0) return tpl_fail(c, "AssertionError", "expected leeway >= 0, got %lld", (long long)leeway);
    if (in.type != TV_STR) return tpl_fail(c, "TypeError", "object of type '%s' has no len()", tv_type_name(in));
    const tv_str *s = in.as.s;
    int64_t len = (int64_t)tv_str_cplen(s);
    if (len <= length + leeway) {
        *out = tv_ref(in);
        return true;
    }
    size_t cut = tpl_utf8_offset(s->s, s->len, (size_t)(length - endcp));
    if (!kill) {
        size_t k = cut;
        while (k > 0 && s->s[k - 1] != ' ') k--;
        if (k > 0) cut = k - 1;
    }
    mu_buf b = {0};
    mu_buf_append(&b, s->s, cut);
    mu_buf_append(&b, ends, endlen);
    *out = tv_str_markup(tv_str_from_buf(&b), s->markup);
    return true;
}

static bool f_unique(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND("do_unique", 2, 0, "case_sensitive", "attribute");
    bool lower = !(has[0] && tv_truthy(arg[0]));
    tv_value attribute = has[1] ? arg[1] : tv_none();
    tv_value items;
    if (!tpl_iterate(c, in, &items)) return false;
    tv_value res = tv_list_new(SEQ_GENERATOR, 0), seen = tv_dict_new();
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        tv_value k;
        ok = attr_path(c, items.as.l->v[i], attribute, lower, tv_undef_anon(), &k);
        if (!ok) break;
        ok = tpl_require_hashable(c, k);
        if (ok && !tv_dict_get(seen.as.d, k)) {
            tv_dict_set(seen.as.d, k, tv_none());
            tv_list_push(res.as.l, tv_ref(items.as.l->v[i]));
        } else
            tv_unref(k);
    }
    tv_unref(seen);
    tv_unref(items);
    if (!ok) return tv_unref(res), false;
    *out = res;
    return true;
}

static bool f_wordcount(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    BIND0("do_wordcount", 1);
    tv_value s;
    if (!tpl_str_of(c, in, &s)) return false;
    int64_t n = 0;
    bool inword = false;
    for (size_t i = 0; i < s.as.s->len;) {
        uint32_t cp = tpl_utf8_next(s.as.s->s, s.as.s->len, &i);
        bool w = cp == '_' || tpl_cp_isalpha(cp) || tpl_cp_isdigit(cp);
        if (w && !inword) n++;
        inword = w;
    }
    tv_unref(s);
    *out = tv_int(n);
    return true;
}

bool tpl_format_percent(tpl_ctx *c, tv_value fmt, tv_value args, tv_value *out);

static bool f_format(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    if (a->npos && a->nkw)
        return tpl_fail(c, "FilterArgumentError", "can't handle positional and keyword arguments at the same time");
    tv_value s, packed;
    if (!tpl_str_of(c, in, &s)) return false;
    if (a->nkw) {
        packed = tv_dict_new();
        for (size_t i = 0; i < a->nkw; i++)
            tv_dict_set(packed.as.d, tv_ref((tv_value){.type = TV_STR, .as.s = a->kwname[i]}), tv_ref(a->kw[i]));
    } else {
        packed = tv_list_new(SEQ_TUPLE, a->npos);
        for (size_t i = 0; i < a->npos; i++) tv_list_push(packed.as.l, tv_ref(a->pos[i]));
    }
    bool ok = tpl_format_percent(c, s, packed, out);
    tv_unref(s);
    tv_unref(packed);
    return ok;
}

static bool f_unsupported(tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out) {
    (void)in;
    (void)a;
    (void)out;
    return tpl_fail(c, "TemplateRuntimeError", "this filter is not supported by the muser template engine");
}

typedef struct filter_entry {
    const char *name;
    tpl_filter_fn fn;
} filter_entry;

static const filter_entry FILTERS[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"filesizeformat", f_unsupported},
    {"first", f_first},
    {"float", f_float},
    {"forceescape", f_forceescape},
    {"format", f_format},
    {"groupby", f_unsupported},
    {"indent", f_indent},
    {"int", f_int},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"items", f_items},
    {"map", f_map},
    {"min", f_min},
    {"max", f_max},
    {"pprint", f_unsupported},
    {"random", f_unsupported},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"slice", f_slice},
    {"sort", f_sort},
    {"string", f_string},
    {"striptags", f_unsupported},
    {"sum", f_sum},
    {"title", f_title},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"urlencode", f_unsupported},
    {"urlize", f_unsupported},
    {"wordcount", f_wordcount},
    {"wordwrap", f_unsupported},
    {"xmlattr", f_unsupported},
    {"tojson", f_tojson},
};
#define NFILTERS (int)(sizeof FILTERS / sizeof FILTERS[0])

int tpl_filter_lookup(const char *name, size_t n) {
    for (int i = 0; i < NFILTERS; i++)
        if (strlen(FILTERS[i].name) == n && memcmp(FILTERS[i].name, name, n) == 0) return i;
    return -1;
}

bool tpl_call_filter(tpl_ctx *c, int id, tv_value in, const tpl_args *a, tv_value *out) {
    if (id < 0 || id >= NFILTERS) return tpl_fail(c, "TemplateRuntimeError", "unknown filter");
    return FILTERS[id].fn(c, in, a, out);
}

bool tpl_call_filter_named(tpl_ctx *c, tv_value name, tv_value in, const tpl_args *a, tv_value *out) {
    int id = name.type == TV_STR ? tpl_filter_lookup(name.as.s->s, name.as.s->len) : -1;
    if (id < 0) {
        mu_buf b = {0};
        tv_write_repr(&b, name);
        tpl_fail(c, "TemplateRuntimeError", "No filter named %s.", b.p);
        mu_buf_free(&b);
        return false;
    }
    return tpl_call_filter(c, id, in, a, out);
}
