/* JSON in (jansson -> values) and out (Python json.dumps, as HF's tojson
 * filter calls it: ensure_ascii=False, optional indent / separators /
 * sort_keys). */
#include "template/tpl_internal.h"
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#define JSON_MAX_DEPTH 1000

static bool from_json(tpl_ctx *c, json_t *j, int depth, tv_value *out) {
    if (depth > JSON_MAX_DEPTH) return tpl_fail(c, "ValueError", "JSON nested too deeply");
    switch (json_typeof(j)) {
    case JSON_NULL: *out = tv_none(); return true;
    case JSON_TRUE: *out = tv_bool(true); return true;
    case JSON_FALSE: *out = tv_bool(false); return true;
    case JSON_INTEGER: *out = tv_int((int64_t)json_integer_value(j)); return true;
    case JSON_REAL: *out = tv_float(json_real_value(j)); return true;
    case JSON_STRING:
        if (!tpl_check_len(c, json_string_length(j))) return false;
        *out = tv_str_new(json_string_value(j), json_string_length(j));
        return true;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        tv_value l = tv_list_new(SEQ_LIST, n);
        for (size_t i = 0; i < n; i++) {
            tv_value v;
            if (!from_json(c, json_array_get(j, i), depth + 1, &v)) {
                tv_unref(l);
                return false;
            }
            tv_list_push(l.as.l, v);
        }
        *out = l;
        return true;
    }
    case JSON_OBJECT: {
        tv_value d = tv_dict_new();
        const char *key;
        json_t *val;
        json_object_foreach(j, key, val) {
            tv_value v;
            if (!from_json(c, val, depth + 1, &v)) {
                tv_unref(d);
                return false;
            }
            tv_dict_set(d.as.d, tv_str_cstr(key), v);
        }
        *out = d;
        return true;
    }
    }
    return tpl_fail(c, "ValueError", "unsupported JSON value");
}

bool tpl_json_parse(tpl_ctx *c, const char *json, const char *what, tv_value *out) {
    json_error_t e;
    json_t *j = json_loadb(json, strlen(json), JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!j)
        return tpl_fail(c, "ValueError", "%s: invalid JSON at line %d column %d: %s", what, e.line, e.column, e.text);
    bool ok = from_json(c, j, 0, out);
    json_decref(j);
    return ok;
}

/* ------------------------------------------------------------------ dumps */
static void dump_string(mu_buf *b, const char *s, size_t n, bool ascii) {
    mu_buf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        size_t st = i;
        uint32_t cp = tpl_utf8_next(s, n, &i);
        switch (cp) {
        case '"': mu_buf_puts(b, "\\\""); continue;
        case '\\': mu_buf_puts(b, "\\\\"); continue;
        case '\n': mu_buf_puts(b, "\\n"); continue;
        case '\r': mu_buf_puts(b, "\\r"); continue;
        case '\t': mu_buf_puts(b, "\\t"); continue;
        case '\b': mu_buf_puts(b, "\\b"); continue;
        case '\f': mu_buf_puts(b, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (ascii && cp > 0x7E)) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                mu_buf_appendf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else
                mu_buf_appendf(b, "\\u%04x", cp);
        } else
            mu_buf_append(b, s + st, i - st);
    }
    mu_buf_putc(b, '"');
}

static void newline_indent(mu_buf *b, const tpl_json_opts *o, int level) {
    mu_buf_putc(b, '\n');
    for (int i = 0; i < level; i++) mu_buf_append(b, o->indent, o->indent_len);
}

static void dump_float(mu_buf *b, double f) {
    if (isnan(f))
        mu_buf_puts(b, "NaN");
    else if (isinf(f))
        mu_buf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else
        tv_write_float(b, f);
}

/* A dict key as json.dumps converts it; false if the type is not allowed. */
static bool key_text(tpl_ctx *c, mu_buf *b, tv_value k) {
    switch (k.type) {
    case TV_STR: mu_buf_append(b, k.as.s->s, k.as.s->len); return true;
    case TV_BOOL: mu_buf_puts(b, k.as.b ? "true" : "false"); return true;
    case TV_NONE: mu_buf_puts(b, "null"); return true;
    case TV_INT: mu_buf_appendf(b, "%lld", (long long)k.as.i); return true;
    case TV_FLOAT: dump_float(b, k.as.f); return true;
    default: return tpl_fail(c, "TypeError", "keys must be str, int, float, bool or None, not %s", tv_type_name(k));
    }
}

static bool dump_dict(tpl_ctx *c, mu_buf *b, const tv_dict *d, const tpl_json_opts *o, int depth) {
    if (d->n == 0) {
        mu_buf_puts(b, "{}");
        return true;
    }
    size_t *order = mu_xmalloc(d->n * sizeof *order);
    for (size_t i = 0; i < d->n; i++) order[i] = i;
    bool ok = true;
    if (o->sort_keys) {
        tv_value *keys = mu_xmalloc(d->n * sizeof *keys), *idx = mu_xmalloc(d->n * sizeof *idx);
        for (size_t i = 0; i < d->n; i++) {
            keys[i] = d->k[i];
            idx[i] = tv_int((int64_t)i);
        }
        ok = tpl_sort_values(c, keys, idx, d->n, false);
        for (size_t i = 0; ok && i < d->n; i++) order[i] = (size_t)idx[i].as.i;
        free(keys);
        free(idx);
    }
    mu_buf_putc(b, '{');
    for (size_t k = 0; ok && k < d->n; k++) {
        size_t i = order[k];
        if (k) mu_buf_append(b, o->item_sep, o->item_sep_len);
        if (o->has_indent) newline_indent(b, o, depth + 1);
        mu_buf key = {0};
        ok = key_text(c, &key, d->k[i]);
        if (ok) dump_string(b, key.p ? key.p : "", key.len, o->ensure_ascii);
        mu_buf_free(&key);
        if (!ok) break;
        mu_buf_append(b, o->key_sep, o->key_sep_len);
        ok = tpl_json_dump(c, b, d->v[i], o, depth + 1);
    }
    free(order);
    if (!ok) return false;
    if (o->has_indent) newline_indent(b, o, depth);
    mu_buf_putc(b, '}');
    return true;
}

bool tpl_json_dump(tpl_ctx *c, mu_buf *b, tv_value v, const tpl_json_opts *o, int depth) {
    if (depth > JSON_MAX_DEPTH)
        return tpl_fail(c, "RecursionError", "maximum recursion depth exceeded while encoding a JSON object");
    switch (v.type) {
    case TV_NONE: mu_buf_puts(b, "null"); return true;
    case TV_BOOL: mu_buf_puts(b, v.as.b ? "true" : "false"); return true;
    case TV_INT: mu_buf_appendf(b, "%lld", (long long)v.as.i); return true;
    case TV_FLOAT: dump_float(b, v.as.f); return true;
    case TV_STR: dump_string(b, v.as.s->s, v.as.s->len, o->ensure_ascii); return true;
    case TV_DICT: return dump_dict(c, b, v.as.d, o, depth);
    case TV_LIST:
        if (v.as.l->kind == SEQ_LIST || v.as.l->kind == SEQ_TUPLE) {
            const tv_list *l = v.as.l;
            if (l->n == 0) {
                mu_buf_puts(b, "[]");
                return true;
            }
            mu_buf_putc(b, '[');
            for (size_t i = 0; i < l->n; i++) {
                if (i) mu_buf_append(b, o->item_sep, o->item_sep_len);
                if (o->has_indent) newline_indent(b, o, depth + 1);
                if (!tpl_json_dump(c, b, l->v[i], o, depth + 1)) return false;
            }
            if (o->has_indent) newline_indent(b, o, depth);
            mu_buf_putc(b, ']');
            return true;
        }
        return tpl_fail(c, "TypeError", "Object of type %s is not JSON serializable", tv_type_name(v));
    default: return tpl_fail(c, "TypeError", "Object of type %s is not JSON serializable", tv_type_name(v));
    }
}
