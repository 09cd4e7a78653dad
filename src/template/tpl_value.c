/* Value model of the template interpreter: refcounted strings, lists,
 * dicts and callables with Python's equality, truthiness, str() and repr(). */
#include "template/tpl_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ arena */
struct tpl_arena_block {
    tpl_arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *tpl_arena_alloc(tpl_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    tpl_arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = mu_xmalloc(sizeof *b + cap);
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void tpl_arena_free(tpl_arena *a) {
    for (tpl_arena_block *b = a->head, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    a->head = NULL;
}

/* -------------------------------------------------------------------- UTF-8 */
uint32_t tpl_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    uint32_t c = u[k];
    if (c < 0x80) {
        *i = k + 1;
        return c;
    }
    int extra = c >= 0xF8 ? -1 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    if (extra < 0 || k + (size_t)extra >= n) {
        *i = k + 1;
        return 0xFFFD;
    }
    uint32_t cp = c & (0x3Fu >> extra);
    for (int j = 1; j <= extra; j++) {
        if ((u[k + (size_t)j] & 0xC0) != 0x80) {
            *i = k + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (u[k + (size_t)j] & 0x3F);
    }
    *i = k + 1 + (size_t)extra;
    return cp;
}

void tpl_utf8_put(mu_buf *b, uint32_t cp) {
    char t[4];
    if (cp < 0x80) {
        t[0] = (char)cp;
        mu_buf_append(b, t, 1);
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        mu_buf_append(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        mu_buf_append(b, t, 3);
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        mu_buf_append(b, t, 4);
    }
}

/* str.isspace(): the same set Python's re `\s` matches. */
bool tpl_py_isspace(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t tpl_utf8_offset(const char *s, size_t n, size_t cps) {
    size_t i = 0;
    while (cps-- && i < n) tpl_utf8_next(s, n, &i);
    return i;
}

/* ----------------------------------------------------------------- strings */
static tv_str *str_alloc(size_t n) {
    tv_str *s = mu_xmalloc(sizeof *s + n + 1);
    s->refs = 1;
    s->markup = 0;
    s->len = n;
    s->s[n] = '\0';
    return s;
}

static void str_scan_ascii(tv_str *s) {
    s->ascii = 1;
    for (size_t i = 0; i < s->len; i++)
        if ((unsigned char)s->s[i] >= 0x80) {
            s->ascii = 0;
            break;
        }
}

tv_value tv_str_new(const char *p, size_t n) {
    tv_str *s = str_alloc(n);
    if (n) memcpy(s->s, p, n);
    str_scan_ascii(s);
    tv_value v = {.type = TV_STR};
    v.as.s = s;
    return v;
}

tv_value tv_str_cstr(const char *p) { return tv_str_new(p, strlen(p)); }

tv_value tv_str_markup(tv_value v, bool markup) {
    if (v.type != TV_STR || v.as.s->markup == markup) return v;
    tv_value c = tv_str_new(v.as.s->s, v.as.s->len);
    c.as.s->markup = markup;
    tv_unref(v);
    return c;
}

tv_value tv_str_from_buf(mu_buf *b) {
    tv_value v = tv_str_new(b->p ? b->p : "", b->len);
    mu_buf_free(b);
    return v;
}

tv_str *tv_str_immortal(const char *p, size_t n) {
    tv_value v = tv_str_new(p, n);
    v.as.s->refs = TV_IMMORTAL;
    return v.as.s;
}

void tv_str_free_immortal(tv_str *s) { free(s); }

size_t tv_str_cplen(const tv_str *s) {
    if (s->ascii) return s->len;
    size_t n = 0;
    for (size_t i = 0; i < s->len; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) n++;
    return n;
}

bool tv_str_eq(const tv_str *a, const char *s, size_t n) { return a->len == n && memcmp(a->s, s, n) == 0; }

/* ------------------------------------------------------------------- lists */
tv_value tv_list_new(tv_seq_kind kind, size_t cap) {
    tv_list *l = mu_xcalloc(1, sizeof *l);
    l->refs = 1;
    l->kind = (uint8_t)kind;
    if (cap) {
        l->v = mu_xmalloc(cap * sizeof *l->v);
        l->cap = cap;
    }
    return tv_list_val(l);
}

void tv_list_push(tv_list *l, tv_value v) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->v = mu_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = v;
}

/* ------------------------------------------------------------------- dicts */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

/* Equal values hash equally under Python rules (1, 1.0 and True). */
uint64_t tv_hash(tv_value v) {
    switch (v.type) {
    case TV_BOOL: return mix64((uint64_t)v.as.b);
    case TV_INT: return mix64((uint64_t)v.as.i);
    case TV_FLOAT:
        if (v.as.f == floor(v.as.f) && fabs(v.as.f) < 9.2e18) return mix64((uint64_t)(int64_t)v.as.f);
        {
            uint64_t u;
            memcpy(&u, &v.as.f, 8);
            return mix64(u ^ 0x5bd1e995u);
        }
    case TV_STR: return hash_bytes(v.as.s->s, v.as.s->len);
    case TV_LIST: {
        uint64_t h = 0x345678;
        for (size_t i = 0; i < v.as.l->n; i++) h = mix64(h ^ tv_hash(v.as.l->v[i]));
        return h;
    }
    case TV_NONE: return 0x9e3779b97f4a7c15ULL;
    default: return mix64((uint64_t)(uintptr_t)v.as.d);
    }
}

tv_value tv_dict_new(void) {
    tv_dict *d = mu_xcalloc(1, sizeof *d);
    d->refs = 1;
    return tv_dict_val(d);
}

static void dict_index_insert(tv_dict *d, size_t entry) {
    size_t mask = d->nslots - 1, i = tv_hash(d->k[entry]) & mask;
    while (d->slots[i]) i = (i + 1) & mask;
    d->slots[i] = (uint32_t)(entry + 1);
}

static void dict_reindex(tv_dict *d) {
    free(d->slots);
    d->nslots = 16;
    while (d->nslots < d->n * 2 + 2) d->nslots *= 2;
    d->slots = mu_xcalloc(d->nslots, sizeof *d->slots);
    for (size_t e = 0; e < d->n; e++) dict_index_insert(d, e);
}

static long dict_find(const tv_dict *d, tv_value key) {
    if (!d->slots) {
        for (size_t e = 0; e < d->n; e++)
            if (tv_equal(d->k[e], key)) return (long)e;
        return -1;
    }
    size_t mask = d->nslots - 1, i = tv_hash(key) & mask;
    while (d->slots[i]) {
        size_t e = d->slots[i] - 1;
        if (tv_equal(d->k[e], key)) return (long)e;
        i = (i + 1) & mask;
    }
    return -1;
}

void tv_dict_set(tv_dict *d, tv_value k, tv_value v) {
    long e = dict_find(d, k);
    if (e >= 0) { /* Python keeps the first key object and position */
        tv_unref(k);
        tv_move(&d->v[e], v);
        return;
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        d->k = mu_xrealloc(d->k, d->cap * sizeof *d->k);
        d->v = mu_xrealloc(d->v, d->cap * sizeof *d->v);
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    if (d->n > 8) {
        if (!d->slots || d->n * 2 > d->nslots)
            dict_reindex(d);
        else
            dict_index_insert(d, d->n - 1);
    }
}

const tv_value *tv_dict_get(const tv_dict *d, tv_value key) {
    long e = dict_find(d, key);
    return e >= 0 ? &d->v[e] : NULL;
}

const tv_value *tv_dict_get_str(const tv_dict *d, const char *s, size_t n) {
    if (!d->slots) {
        for (size_t e = 0; e < d->n; e++)
            if (d->k[e].type == TV_STR && tv_str_eq(d->k[e].as.s, s, n)) return &d->v[e];
        return NULL;
    }
    size_t mask = d->nslots - 1, i = hash_bytes(s, n) & mask;
    while (d->slots[i]) {
        size_t e = d->slots[i] - 1;
        if (d->k[e].type == TV_STR && tv_str_eq(d->k[e].as.s, s, n)) return &d->v[e];
        i = (i + 1) & mask;
    }
    return NULL;
}

tv_value tv_dict_copy(const tv_dict *d) {
    tv_value out = tv_dict_new();
    for (size_t i = 0; i < d->n; i++) tv_dict_set(out.as.d, tv_ref(d->k[i]), tv_ref(d->v[i]));
    return out;
}

/* --------------------------------------------------------------- refcounts */
static uint32_t *refs_of(tv_value v) {
    switch (v.type) {
    case TV_STR: return &v.as.s->refs;
    case TV_LIST: return &v.as.l->refs;
    case TV_DICT: return &v.as.d->refs;
    case TV_FUNC: return &v.as.fn->refs;
    case TV_NS: return &v.as.ns->refs;
    case TV_LOOP: return &v.as.loop->refs;
    case TV_UNDEFINED: return v.as.u ? &v.as.u->refs : NULL;
    default: return NULL;
    }
}

tv_value tv_ref(tv_value v) {
    uint32_t *r = refs_of(v);
    if (r && *r != TV_IMMORTAL) (*r)++;
    return v;
}

static void free_value(tv_value v) {
    switch (v.type) {
    case TV_STR: free(v.as.s); break;
    case TV_LIST:
        for (size_t i = 0; i < v.as.l->n; i++) tv_unref(v.as.l->v[i]);
        free(v.as.l->v);
        free(v.as.l);
        break;
    case TV_DICT:
        for (size_t i = 0; i < v.as.d->n; i++) {
            tv_unref(v.as.d->k[i]);
            tv_unref(v.as.d->v[i]);
        }
        free(v.as.d->k);
        free(v.as.d->v);
        free(v.as.d->slots);
        free(v.as.d);
        break;
    case TV_FUNC:
        tv_unref(v.as.fn->self);
        free(v.as.fn);
        break;
    case TV_NS:
        tv_unref(tv_dict_val(v.as.ns->attrs));
        free(v.as.ns);
        break;
    case TV_LOOP:
        tv_unref(tv_list_val(v.as.loop->items));
        tv_unref(v.as.loop->last_changed);
        free(v.as.loop);
        break;
    case TV_UNDEFINED:
        tv_unref((tv_value){.type = TV_STR, .as.s = v.as.u->msg});
        free(v.as.u);
        break;
    default: break;
    }
}

void tv_unref(tv_value v) {
    uint32_t *r = refs_of(v);
    if (!r || *r == TV_IMMORTAL) return;
    if (--*r == 0) free_value(v);
}

tv_value tv_func_builtin(const char *name, tpl_builtin_fn fn, tv_value self) {
    tv_func *f = mu_xcalloc(1, sizeof *f);
    f->refs = 1;
    f->kind = FN_BUILTIN;
    f->name = name;
    f->fn = fn;
    f->self = tv_ref(self);
    tv_value v = {.type = TV_FUNC};
    v.as.fn = f;
    return v;
}

tv_value tv_undef_msg(const char *exc, const char *fmt, ...) {
    mu_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    char tmp[1024];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    mu_buf_puts(&b, tmp);
    tv_undef *u = mu_xcalloc(1, sizeof *u);
    u->refs = 1;
    u->exc = exc;
    u->msg = tv_str_from_buf(&b).as.s;
    tv_value v = {.type = TV_UNDEFINED};
    v.as.u = u;
    return v;
}

/* ---------------------------------------------------------- Python semantics */
bool tv_truthy(tv_value v) {
    switch (v.type) {
    case TV_UNDEFINED:
    case TV_NONE: return false;
    case TV_BOOL: return v.as.b;
    case TV_INT: return v.as.i != 0;
    case TV_FLOAT: return v.as.f != 0.0;
    case TV_STR: return v.as.s->len > 0;
    case TV_LIST:
        if (v.as.l->kind == SEQ_GENERATOR || v.as.l->kind == SEQ_REVITER) return true;
        return v.as.l->n > 0;
    case TV_DICT: return v.as.d->n > 0;
    default: return true;
    }
}

static bool num_equal(tv_value a, tv_value b) {
    if (a.type == TV_FLOAT || b.type == TV_FLOAT) {
        if (a.type == TV_FLOAT && b.type == TV_FLOAT) return a.as.f == b.as.f;
        double f = a.type == TV_FLOAT ? a.as.f : b.as.f;
        tv_value o = a.type == TV_FLOAT ? b : a;
        int64_t i = o.type == TV_BOOL ? o.as.b : o.as.i;
        if (f != floor(f) || !(fabs(f) < 9223372036854775808.0)) return false;
        return (int64_t)f == i;
    }
    int64_t x = a.type == TV_BOOL ? a.as.b : a.as.i;
    int64_t y = b.type == TV_BOOL ? b.as.b : b.as.i;
    return x == y;
}

static bool seq_family_equal(uint8_t a, uint8_t b) {
    bool la = a == SEQ_LIST, lb = b == SEQ_LIST, ta = a == SEQ_TUPLE, tb = b == SEQ_TUPLE;
    return (la && lb) || (ta && tb);
}

bool tv_equal(tv_value a, tv_value b) {
    if (tv_is_number(a) && tv_is_number(b)) return num_equal(a, b);
    if (a.type != b.type) return false;
    switch (a.type) {
    case TV_UNDEFINED:
    case TV_NONE: return true;
    case TV_STR:
        return a.as.s == b.as.s || (a.as.s->len == b.as.s->len && memcmp(a.as.s->s, b.as.s->s, a.as.s->len) == 0);
    case TV_LIST:
        if (a.as.l == b.as.l) return true;
        if (!seq_family_equal(a.as.l->kind, b.as.l->kind) || a.as.l->n != b.as.l->n) return false;
        for (size_t i = 0; i < a.as.l->n; i++)
            if (!tv_equal(a.as.l->v[i], b.as.l->v[i])) return false;
        return true;
    case TV_DICT:
        if (a.as.d == b.as.d) return true;
        if (a.as.d->n != b.as.d->n) return false;
        for (size_t i = 0; i < a.as.d->n; i++) {
            const tv_value *o = tv_dict_get(b.as.d, a.as.d->k[i]);
            if (!o || !tv_equal(a.as.d->v[i], *o)) return false;
        }
        return true;
    default: return a.as.d == b.as.d;
    }
}

const char *tv_type_name(tv_value v) {
    switch (v.type) {
    case TV_UNDEFINED: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return v.as.s->markup ? "Markup" : "str";
    case TV_LIST:
        switch (v.as.l->kind) {
        case SEQ_TUPLE: return "tuple";
        case SEQ_GENERATOR: return "generator";
        case SEQ_REVITER: return "list_reverseiterator";
        case SEQ_DICT_KEYS: return "dict_keys";
        case SEQ_DICT_VALUES: return "dict_values";
        case SEQ_DICT_ITEMS: return "dict_items";
        default: return "list";
        }
    case TV_DICT: return "dict";
    case TV_FUNC:
        if (v.as.fn->kind == FN_MACRO) return "Macro";
        return v.as.fn->pytype ? v.as.fn->pytype : "builtin_function_or_method";
    case TV_NS: return "Namespace";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

void tv_object_type_repr(mu_buf *b, tv_value v) {
    if (v.type == TV_NONE) {
        mu_buf_puts(b, "None");
        return;
    }
    const char *mod = v.type == TV_NS                                    ? "jinja2.utils."
                      : v.type == TV_LOOP                                ? "jinja2.runtime."
                      : (v.type == TV_FUNC && v.as.fn->kind == FN_MACRO) ? "jinja2.runtime."
                      : (v.type == TV_STR && v.as.s->markup)             ? "markupsafe."
                      : v.type == TV_UNDEFINED                           ? "jinja2.runtime."
                                                                         : "";
    mu_buf_appendf(b, "%s%s object", mod, tv_type_name(v));
}

/* repr(float): shortest round-trip digits, Python's layout rules. */
void tv_write_float(mu_buf *b, double f) {
    if (isnan(f)) {
        mu_buf_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        mu_buf_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1;
    if (neg) mu_buf_putc(b, '-');
    if (decpt <= -4 || decpt > 16) {
        mu_buf_putc(b, digits[0]);
        if (nd > 1) {
            mu_buf_putc(b, '.');
            mu_buf_append(b, digits + 1, (size_t)nd - 1);
        }
        mu_buf_appendf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        mu_buf_puts(b, "0.");
        for (int i = 0; i < -decpt; i++) mu_buf_putc(b, '0');
        mu_buf_append(b, digits, (size_t)nd);
    } else if (decpt >= nd) {
        mu_buf_append(b, digits, (size_t)nd);
        for (int i = nd; i < decpt; i++) mu_buf_putc(b, '0');
        mu_buf_puts(b, ".0");
    } else {
        mu_buf_append(b, digits, (size_t)decpt);
        mu_buf_putc(b, '.');
        mu_buf_append(b, digits + decpt, (size_t)(nd - decpt));
    }
}

/* str.isprintable() for one code point (the non-printable ranges that
 * occur in practice: controls, format characters, separators). */
static bool py_isprintable(uint32_t cp) {
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
    if (cp == 0x1680 || cp == 0x180E || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
    if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || (cp >= 0xFFF9 && cp <= 0xFFFB)) return false;
    if ((cp >= 0x600 && cp <= 0x605) || cp == 0x61C || cp == 0x6DD || cp == 0x70F || cp == 0x8E2) return false;
    if ((cp >= 0xD800 && cp <= 0xF8FF) || cp == 0xFFFE || cp == 0xFFFF) return false;
    if ((cp >= 0xE0000 && cp <= 0xE007F) || cp >= 0xF0000) return false;
    return true;
}

void tv_write_pystr_repr(mu_buf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    mu_buf_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t start = i;
        uint32_t cp = tpl_utf8_next(s, n, &i);
        if (cp == (uint32_t)q || cp == '\\') {
            mu_buf_putc(b, '\\');
            mu_buf_putc(b, (char)cp);
        } else if (cp == '\n')
            mu_buf_puts(b, "\\n");
        else if (cp == '\r')
            mu_buf_puts(b, "\\r");
        else if (cp == '\t')
            mu_buf_puts(b, "\\t");
        else if (!py_isprintable(cp)) {
            if (cp < 0x100)
                mu_buf_appendf(b, "\\x%02x", cp);
            else if (cp < 0x10000)
                mu_buf_appendf(b, "\\u%04x", cp);
            else
                mu_buf_appendf(b, "\\U%08x", cp);
        } else
            mu_buf_append(b, s + start, i - start);
    }
    mu_buf_putc(b, q);
}

static void write_seq_items(mu_buf *b, const tv_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        if (i) mu_buf_puts(b, ", ");
        tv_write_repr(b, l->v[i]);
    }
}

void tv_write_repr(mu_buf *b, tv_value v) {
    switch (v.type) {
    case TV_UNDEFINED: mu_buf_puts(b, "Undefined"); return;
    case TV_STR:
        if (v.as.s->markup) mu_buf_puts(b, "Markup(");
        tv_write_pystr_repr(b, v.as.s->s, v.as.s->len);
        if (v.as.s->markup) mu_buf_putc(b, ')');
        return;
    case TV_LIST: {
        const tv_list *l = v.as.l;
        switch (l->kind) {
        case SEQ_TUPLE:
            mu_buf_putc(b, '(');
            write_seq_items(b, l);
            if (l->n == 1) mu_buf_putc(b, ',');
            mu_buf_putc(b, ')');
            return;
        case SEQ_GENERATOR: mu_buf_puts(b, "<generator object>"); return;
        case SEQ_REVITER: mu_buf_puts(b, "<list_reverseiterator object>"); return;
        case SEQ_DICT_KEYS:
        case SEQ_DICT_VALUES:
        case SEQ_DICT_ITEMS:
            mu_buf_appendf(b, "%s([", tv_type_name(v));
            write_seq_items(b, l);
            mu_buf_puts(b, "])");
            return;
        default:
            mu_buf_putc(b, '[');
            write_seq_items(b, l);
            mu_buf_putc(b, ']');
            return;
        }
    }
    case TV_DICT: {
        const tv_dict *d = v.as.d;
        mu_buf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) mu_buf_puts(b, ", ");
            tv_write_repr(b, d->k[i]);
            mu_buf_puts(b, ": ");
            tv_write_repr(b, d->v[i]);
        }
        mu_buf_putc(b, '}');
        return;
    }
    case TV_FUNC:
        if (v.as.fn->kind == FN_MACRO) {
            mu_buf_puts(b, "<Macro ");
            if (v.as.fn->name)
                tv_write_pystr_repr(b, v.as.fn->name, strlen(v.as.fn->name));
            else
                mu_buf_puts(b, "'caller'");
            mu_buf_putc(b, '>');
        } else if (v.as.fn->pyrepr) {
            mu_buf_puts(b, v.as.fn->pyrepr);
        } else { /* Python shows an address here; print something stable */
            mu_buf_appendf(b, "<%s %s>", v.as.fn->pytype ? v.as.fn->pytype : "built-in method", v.as.fn->name);
        }
        return;
    case TV_NS:
        mu_buf_puts(b, "<Namespace ");
        tv_write_repr(b, tv_dict_val(v.as.ns->attrs));
        mu_buf_putc(b, '>');
        return;
    case TV_LOOP: mu_buf_appendf(b, "<LoopContext %zu/%zu>", v.as.loop->index0 + 1, v.as.loop->items->n); return;
    default: tv_write_str(b, v); return;
    }
}

void tv_write_str(mu_buf *b, tv_value v) {
    switch (v.type) {
    case TV_UNDEFINED: return;
    case TV_NONE: mu_buf_puts(b, "None"); return;
    case TV_BOOL: mu_buf_puts(b, v.as.b ? "True" : "False"); return;
    case TV_INT: mu_buf_appendf(b, "%lld", (long long)v.as.i); return;
    case TV_FLOAT: tv_write_float(b, v.as.f); return;
    case TV_STR: mu_buf_append(b, v.as.s->s, v.as.s->len); return;
    default: tv_write_repr(b, v); return;
    }
}
