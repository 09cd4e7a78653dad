/* Python's str: case mapping, whitespace, split/replace helpers shared
 * with the filters, and the str methods templates call. */
#include "template/tpl_internal.h"
#include <stdio.h>
#include <stdlib.h>

#define want_str tpl_arg_str
#define want_int tpl_arg_int

/* ---------------------------------------------------------- case mapping */
uint32_t tpl_cp_lower(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 32;
    if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
        bool even_upper = (cp < 0x138) || (cp > 0x149 && cp < 0x178);
        if (cp == 0x178) return 0xFF;
        if (even_upper) return (cp % 2 == 0) ? cp + 1 : cp;
        return (cp % 2 == 1) ? cp + 1 : cp;
    }
    if (cp >= 0x391 && cp <= 0x3AB && cp != 0x3A2) return cp + 32;
    if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
    return cp;
}

uint32_t tpl_cp_upper(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
    if (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) return cp - 32;
    if (cp == 0xFF) return 0x178;
    if (cp == 0xB5) return 0x39C;
    if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x178) {
        if (cp == 0x17F) return 'S';
        bool even_upper = (cp < 0x138) || (cp > 0x149 && cp < 0x178);
        if (even_upper) return (cp % 2 == 1) ? cp - 1 : cp;
        return (cp % 2 == 0) ? cp - 1 : cp;
    }
    if (cp >= 0x3B1 && cp <= 0x3CB && cp != 0x3C2) return cp - 32;
    if (cp == 0x3C2) return 0x3A3;
    if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
    if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
    return cp;
}

static bool cp_is_cased(uint32_t cp) { return tpl_cp_lower(cp) != cp || tpl_cp_upper(cp) != cp || cp == 0xDF; }
static bool cp_is_lower(uint32_t cp) { return tpl_cp_upper(cp) != cp || cp == 0xDF; }
static bool cp_is_upper(uint32_t cp) { return tpl_cp_lower(cp) != cp; }

bool tpl_cp_isdigit(uint32_t cp) {
    return (cp >= '0' && cp <= '9') || (cp >= 0x660 && cp <= 0x669) || (cp >= 0xFF10 && cp <= 0xFF19);
}

bool tpl_cp_isalpha(uint32_t cp) {
    if (cp < 0x80) return (cp | 32) >= 'a' && (cp | 32) <= 'z';
    if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return true;
    if (cp >= 0xC0 && cp <= 0x24F) return cp != 0xD7 && cp != 0xF7;
    if (cp >= 0x370 && cp <= 0x3FF) return cp != 0x375 && cp != 0x37E && cp != 0x384 && cp != 0x385 && cp != 0x387;
    if (cp >= 0x400 && cp <= 0x481) return true;
    if (cp >= 0x48A && cp <= 0x52F) return true;
    if (cp >= 0x5D0 && cp <= 0x5EA) return true;
    if (cp >= 0x620 && cp <= 0x64A) return true;
    if (cp >= 0x3041 && cp <= 0x3096) return true;
    if (cp >= 0x30A1 && cp <= 0x30FA) return true;
    if (cp >= 0x4E00 && cp <= 0x9FFF) return true;
    if (cp >= 0xAC00 && cp <= 0xD7A3) return true;
    return false;
}

/* mode: 0 lower, 1 upper, 2 capitalize, 3 title (str.title), 4 swapcase */
tv_value tpl_str_case(tv_value v, int mode) {
    const tv_str *s = v.as.s;
    mu_buf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = tpl_utf8_next(s->s, s->len, &i), r = cp;
        bool up;
        switch (mode) {
        case 0: up = false; break;
        case 1: up = true; break;
        case 2: up = first; break;
        case 3: up = !prev_cased; break;
        default: up = cp_is_lower(cp); break;
        }
        if (up && cp == 0xDF) {
            mu_buf_puts(&b, mode == 2 || mode == 3 ? "Ss" : "SS");
        } else {
            r = up ? tpl_cp_upper(cp) : tpl_cp_lower(cp);
            tpl_utf8_put(&b, r);
        }
        prev_cased = cp_is_cased(cp);
        first = false;
    }
    return tv_str_markup(tv_str_from_buf(&b), s->markup);
}

/* ----------------------------------------------------------- str helpers */
static bool in_chars(const tv_str *chars, uint32_t cp) {
    if (!chars) return tpl_py_isspace(cp);
    for (size_t i = 0; i < chars->len;)
        if (tpl_utf8_next(chars->s, chars->len, &i) == cp) return true;
    return false;
}

tv_value tpl_str_strip(tv_value v, const tv_str *chars, bool left, bool right) {
    const tv_str *s = v.as.s;
    size_t a = 0, e = s->len;
    if (left)
        while (a < e) {
            size_t k = a;
            if (!in_chars(chars, tpl_utf8_next(s->s, e, &k))) break;
            a = k;
        }
    if (right)
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)s->s[st] & 0xC0) == 0x80) st--;
            size_t k = st;
            if (!in_chars(chars, tpl_utf8_next(s->s, e, &k))) break;
            e = st;
        }
    return tv_str_markup(tv_str_new(s->s + a, e - a), s->markup);
}

static tv_value piece(const tv_str *s, size_t a, size_t e) {
    return tv_str_markup(tv_str_new(s->s + a, e - a), s->markup);
}

static bool ws_at(const tv_str *s, size_t i, size_t *next) {
    size_t k = i;
    bool w = tpl_py_isspace(tpl_utf8_next(s->s, s->len, &k));
    *next = k;
    return w;
}

/* str.split / str.rsplit */
bool tpl_str_split(tpl_ctx *c, tv_value v, tv_value sep, int64_t maxsplit, bool right, tv_value *out) {
    const tv_str *s = v.as.s;
    tv_value l = tv_list_new(SEQ_LIST, 0);
    if (sep.type == TV_NONE || sep.type == TV_UNDEFINED) {
        /* runs of whitespace; leading/trailing ignored */
        size_t *st = NULL, *en = NULL, nw = 0;
        size_t i = 0, nx;
        while (i < s->len) {
            while (i < s->len && ws_at(s, i, &nx)) i = nx;
            if (i >= s->len) break;
            size_t a = i;
            while (i < s->len && !ws_at(s, i, &nx)) i = nx;
            st = mu_xrealloc(st, (nw + 1) * sizeof *st);
            en = mu_xrealloc(en, (nw + 1) * sizeof *en);
            st[nw] = a;
            en[nw++] = i;
        }
        if (maxsplit < 0 || (size_t)maxsplit + 1 >= nw) {
            for (size_t k = 0; k < nw; k++) tv_list_push(l.as.l, piece(s, st[k], en[k]));
        } else if (!right) {
            for (size_t k = 0; k < (size_t)maxsplit; k++) tv_list_push(l.as.l, piece(s, st[k], en[k]));
            tv_value rest = piece(s, st[maxsplit], s->len);
            tv_list_push(l.as.l, tpl_str_strip(rest, NULL, false, true));
            tv_unref(rest);
        } else {
            size_t keep = nw - (size_t)maxsplit;
            tv_value rest = piece(s, 0, en[keep - 1]);
            tv_list_push(l.as.l, tpl_str_strip(rest, NULL, true, false));
            tv_unref(rest);
            for (size_t k = keep; k < nw; k++) tv_list_push(l.as.l, piece(s, st[k], en[k]));
        }
        free(st);
        free(en);
        *out = l;
        return true;
    }
    if (!want_str(c, "sep", sep)) return tv_unref(l), false;
    const tv_str *p = sep.as.s;
    if (p->len == 0) {
        tv_unref(l);
        return tpl_fail(c, "ValueError", "empty separator");
    }
    if (!right) {
        size_t a = 0;
        int64_t done = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || done < maxsplit) ? memmem(s->s + a, s->len - a, p->s, p->len) : NULL;
            if (!hit) break;
            size_t at = (size_t)(hit - s->s);
            tv_list_push(l.as.l, piece(s, a, at));
            a = at + p->len;
            done++;
        }
        tv_list_push(l.as.l, piece(s, a, s->len));
    } else {
        tv_value rev = tv_list_new(SEQ_LIST, 0);
        size_t e = s->len;
        int64_t done = 0;
        while (maxsplit < 0 || done < maxsplit) {
            size_t found = SIZE_MAX;
            for (size_t k = e; k >= p->len; k--)
                if (memcmp(s->s + k - p->len, p->s, p->len) == 0) {
                    found = k - p->len;
                    break;
                }
            if (found == SIZE_MAX) break;
            tv_list_push(rev.as.l, piece(s, found + p->len, e));
            e = found;
            done++;
        }
        tv_list_push(l.as.l, piece(s, 0, e));
        for (size_t k = rev.as.l->n; k-- > 0;) tv_list_push(l.as.l, tv_ref(rev.as.l->v[k]));
        tv_unref(rev);
    }
    *out = l;
    return true;
}

bool tpl_str_replace(tpl_ctx *c, tv_value v, tv_value old, tv_value nw, int64_t count, tv_value *out) {
    const tv_str *s = v.as.s, *o = old.as.s, *n = nw.as.s;
    mu_buf b = {.limit = c->max_str};
    if (o->len == 0) { /* insert between every code point */
        int64_t done = 0;
        size_t i = 0;
        for (;;) {
            if (count < 0 || done < count) {
                mu_buf_append(&b, n->s, n->len);
                done++;
            }
            if (i >= s->len) break;
            size_t st = i;
            tpl_utf8_next(s->s, s->len, &i);
            mu_buf_append(&b, s->s + st, i - st);
        }
    } else {
        size_t a = 0;
        int64_t done = 0;
        while (count < 0 || done < count) {
            const char *hit = memmem(s->s + a, s->len - a, o->s, o->len);
            if (!hit) break;
            size_t at = (size_t)(hit - s->s);
            mu_buf_append(&b, s->s + a, at - a);
            mu_buf_append(&b, n->s, n->len);
            a = at + o->len;
            done++;
        }
        mu_buf_append(&b, s->s + a, s->len - a);
    }
    if (b.over) {
        mu_buf_free(&b);
        return tpl_check_len(c, SIZE_MAX);
    }
    *out = tv_str_markup(tv_str_from_buf(&b), s->markup);
    return true;
}

void tpl_html_escape(mu_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '&': mu_buf_puts(b, "&amp;"); break;
        case '<': mu_buf_puts(b, "&lt;"); break;
        case '>': mu_buf_puts(b, "&gt;"); break;
        case '\'': mu_buf_puts(b, "&#39;"); break;
        case '"': mu_buf_puts(b, "&#34;"); break;
        default: mu_buf_putc(b, s[i]);
        }
    }
}

bool tpl_str_of(tpl_ctx *c, tv_value v, tv_value *out) {
    if (v.type == TV_STR) {
        *out = tv_ref(v);
        return true;
    }
    return tpl_to_str(c, v, out);
}

/* Python index arguments (start, end) -> byte range of s. */
static void cp_range(const tv_str *s, tv_value start, tv_value end, size_t *a, size_t *e) {
    int64_t len = (int64_t)tv_str_cplen(s), st = 0, en = len;
    if (start.type == TV_INT || start.type == TV_BOOL) st = start.type == TV_INT ? start.as.i : start.as.b;
    if (end.type == TV_INT || end.type == TV_BOOL) en = end.type == TV_INT ? end.as.i : end.as.b;
    if (st < 0) st = st + len < 0 ? 0 : st + len;
    if (en < 0) en = en + len < 0 ? 0 : en + len;
    if (st > len) st = len;
    if (en > len) en = len;
    if (en < st) en = st;
    *a = s->ascii ? (size_t)st : tpl_utf8_offset(s->s, s->len, (size_t)st);
    *e = s->ascii ? (size_t)en : tpl_utf8_offset(s->s, s->len, (size_t)en);
}

static int64_t cp_index(const tv_str *s, size_t byte) {
    if (s->ascii) return (int64_t)byte;
    int64_t n = 0;
    for (size_t i = 0; i < byte; i++)
        if (((unsigned char)s->s[i] & 0xC0) != 0x80) n++;
    return n;
}

/* ------------------------------------------------------------ str methods */
#define SELF_STR (self->as.s)
/* Arity and keyword names are checked against the method table before
 * the call; BIND only maps the arguments onto names. */
#define BIND(fname, ...)                                     \
    static const char *const names_[] = {__VA_ARGS__, NULL}; \
    tv_value arg[sizeof names_ / sizeof names_[0]];          \
    bool has[sizeof names_ / sizeof names_[0]];              \
    if (!tpl_bind(c, fname, 0, 0, a, names_, arg, has)) return false

static bool m_strip_common(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, bool l, bool r) {
    BIND("strip", "chars");
    const tv_str *chars = NULL;
    if (has[0] && arg[0].type != TV_NONE) {
        if (!want_str(c, "strip arg", arg[0])) return false;
        chars = arg[0].as.s;
    }
    *out = tpl_str_strip(*self, chars, l, r);
    return true;
}
static bool m_strip(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_strip_common(c, self, a, out, true, true);
}
static bool m_lstrip(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_strip_common(c, self, a, out, true, false);
}
static bool m_rstrip(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_strip_common(c, self, a, out, false, true);
}

static bool m_case(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, int mode) {
    (void)c;
    (void)a; /* arity checked by the method table */
    *out = tpl_str_case(*self, mode);
    return true;
}
static bool m_lower(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_case(c, self, a, out, 0);
}
static bool m_upper(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_case(c, self, a, out, 1);
}
static bool m_capitalize(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)c;
    (void)a; /* arity checked by the method table */
    tv_value low = tpl_str_case(*self, 0);
    const tv_str *s = low.as.s;
    if (!s->len) {
        *out = low;
        return true;
    }
    size_t i = 0;
    uint32_t cp = tpl_utf8_next(SELF_STR->s, SELF_STR->len, &i);
    mu_buf b = {0};
    if (cp == 0xDF)
        mu_buf_puts(&b, "Ss");
    else
        tpl_utf8_put(&b, tpl_cp_upper(cp));
    size_t j = 0;
    tpl_utf8_next(s->s, s->len, &j);
    mu_buf_append(&b, s->s + j, s->len - j);
    tv_unref(low);
    *out = tv_str_markup(tv_str_from_buf(&b), SELF_STR->markup);
    return true;
}
static bool m_title(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_case(c, self, a, out, 3);
}
static bool m_swapcase(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_case(c, self, a, out, 4);
}

static bool m_split_common(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, bool right) {
    BIND(right ? "rsplit" : "split", "sep", "maxsplit");
    int64_t maxsplit = -1;
    if (has[1] && !want_int(c, arg[1], &maxsplit)) return false;
    return tpl_str_split(c, *self, has[0] ? arg[0] : tv_none(), maxsplit, right, out);
}
static bool m_split(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_split_common(c, self, a, out, false);
}
static bool m_rsplit(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_split_common(c, self, a, out, true);
}

static bool m_splitlines(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    BIND("splitlines", "keepends");
    bool keep = has[0] && tv_truthy(arg[0]);
    const tv_str *s = SELF_STR;
    tv_value l = tv_list_new(SEQ_LIST, 0);
    size_t start = 0;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        uint32_t cp = tpl_utf8_next(s->s, s->len, &i);
        bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                   cp == 0x2028 || cp == 0x2029;
        if (!brk) continue;
        if (cp == '\r' && i < s->len && s->s[i] == '\n') i++;
        tv_list_push(l.as.l, piece(s, start, keep ? i : st));
        start = i;
    }
    if (start < s->len) tv_list_push(l.as.l, piece(s, start, s->len));
    *out = l;
    return true;
}

static bool affix_match(tpl_ctx *c, const tv_str *s, size_t a, size_t e, tv_value affix, bool suffix, bool *out) {
    if (affix.type == TV_LIST && affix.as.l->kind == SEQ_TUPLE) {
        *out = false;
        for (size_t i = 0; i < affix.as.l->n && !*out; i++)
            if (!affix_match(c, s, a, e, affix.as.l->v[i], suffix, out)) return false;
        return true;
    }
    if (affix.type != TV_STR)
        return tpl_fail(c, "TypeError", "%s first arg must be str or a tuple of str, not %s",
                        suffix ? "endswith" : "startswith", tv_type_name(affix));
    const tv_str *p = affix.as.s;
    if (p->len > e - a)
        *out = false;
    else
        *out = memcmp(suffix ? s->s + e - p->len : s->s + a, p->s, p->len) == 0;
    return true;
}

static bool m_affix(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, bool suffix) {
    BIND(suffix ? "endswith" : "startswith", "prefix", "start", "end");
    if (!has[0])
        return tpl_fail(c, "TypeError", "%s() takes at least 1 argument (0 given)", suffix ? "endswith" : "startswith");
    size_t st, en;
    cp_range(SELF_STR, arg[1], arg[2], &st, &en);
    bool r;
    if (!affix_match(c, SELF_STR, st, en, arg[0], suffix, &r)) return false;
    *out = tv_bool(r);
    return true;
}
static bool m_startswith(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_affix(c, self, a, out, false);
}
static bool m_endswith(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_affix(c, self, a, out, true);
}

static bool m_replace(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    BIND("replace", "old", "new", "count");
    if (!has[0] || !has[1]) return tpl_fail(c, "TypeError", "replace expected at least 2 arguments, got %zu", a->npos);
    if (!want_str(c, "replace() argument 1", arg[0]) || !want_str(c, "replace() argument 2", arg[1])) return false;
    int64_t count = -1;
    if (has[2] && !want_int(c, arg[2], &count)) return false;
    if (!SELF_STR->markup) return tpl_str_replace(c, *self, arg[0], arg[1], count, out);
    /* Markup.replace escapes plain arguments */
    tv_value esc[2];
    for (int i = 0; i < 2; i++) {
        mu_buf b = {0};
        if (arg[i].as.s->markup)
            mu_buf_append(&b, arg[i].as.s->s, arg[i].as.s->len);
        else
            tpl_html_escape(&b, arg[i].as.s->s, arg[i].as.s->len);
        esc[i] = tv_str_from_buf(&b);
    }
    bool ok = tpl_str_replace(c, *self, esc[0], esc[1], count, out);
    tv_unref(esc[0]);
    tv_unref(esc[1]);
    return ok;
}

static bool m_find_common(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, bool right, bool raise,
                          bool count) {
    BIND(count ? "count" : right ? (raise ? "rindex" : "rfind") : (raise ? "index" : "find"), "sub", "start", "end");
    if (!has[0]) return tpl_fail(c, "TypeError", "expected at least 1 argument, got 0");
    if (!want_str(c, "must be str", arg[0])) return false;
    const tv_str *s = SELF_STR, *p = arg[0].as.s;
    size_t st, en;
    cp_range(s, arg[1], arg[2], &st, &en);
    if (count) {
        int64_t n = 0;
        if (p->len == 0)
            n = cp_index(s, en) - cp_index(s, st) + 1;
        else
            for (size_t i = st; i + p->len <= en;) {
                const char *hit = memmem(s->s + i, en - i, p->s, p->len);
                if (!hit) break;
                n++;
                i = (size_t)(hit - s->s) + p->len;
            }
        *out = tv_int(n);
        return true;
    }
    int64_t found = -1;
    if (p->len <= en - st) {
        if (!right) {
            const char *hit = memmem(s->s + st, en - st, p->s, p->len);
            if (hit) found = cp_index(s, (size_t)(hit - s->s));
        } else {
            for (size_t k = en - p->len + 1; k-- > st;)
                if (memcmp(s->s + k, p->s, p->len) == 0) {
                    found = cp_index(s, k);
                    break;
                }
        }
    }
    if (found < 0 && raise) return tpl_fail(c, "ValueError", "substring not found");
    *out = tv_int(found);
    return true;
}
static bool m_find(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_find_common(c, self, a, out, false, false, false);
}
static bool m_rfind(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_find_common(c, self, a, out, true, false, false);
}
static bool m_index(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_find_common(c, self, a, out, false, true, false);
}
static bool m_rindex(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_find_common(c, self, a, out, true, true, false);
}
static bool m_count(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_find_common(c, self, a, out, false, false, true);
}

static bool m_join(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    BIND("join", "iterable");
    if (!has[0]) return tpl_fail(c, "TypeError", "join() takes exactly one argument (0 given)");
    tv_value items;
    if (!tpl_iterate(c, arg[0], &items)) return false;
    bool markup = SELF_STR->markup;
    mu_buf b = {.limit = c->max_str};
    bool ok = true;
    for (size_t i = 0; i < items.as.l->n && ok; i++) {
        tv_value it = items.as.l->v[i];
        if (it.type != TV_STR) {
            ok = tpl_fail(c, "TypeError", "sequence item %zu: expected str instance, %s found", i, tv_type_name(it));
            break;
        }
        if (i) mu_buf_append(&b, SELF_STR->s, SELF_STR->len);
        if (markup && !it.as.s->markup)
            tpl_html_escape(&b, it.as.s->s, it.as.s->len);
        else
            mu_buf_append(&b, it.as.s->s, it.as.s->len);
    }
    tv_unref(items);
    tv_value joined;
    if (!tpl_buf_finish(c, &b, ok, &joined)) return false;
    *out = tv_str_markup(joined, markup);
    return true;
}

static bool m_is_class(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, int kind) {
    (void)c;
    (void)a; /* arity checked by the method table */
    const tv_str *s = SELF_STR;
    bool r = s->len > 0, any_cased = false, prev_cased = false, title_ok = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = tpl_utf8_next(s->s, s->len, &i);
        switch (kind) {
        case 0: r = r && tpl_cp_isdigit(cp); break;
        case 1: r = r && tpl_cp_isalpha(cp); break;
        case 2: r = r && (tpl_cp_isalpha(cp) || tpl_cp_isdigit(cp)); break;
        case 3: r = r && tpl_py_isspace(cp); break;
        case 4:
            if (cp_is_upper(cp)) r = false;
            if (cp_is_lower(cp)) any_cased = true;
            break;
        case 5:
            if (cp_is_lower(cp)) r = false;
            if (cp_is_upper(cp)) any_cased = true;
            break;
        case 6:
            if (cp_is_upper(cp)) {
                if (prev_cased) title_ok = false;
                any_cased = true;
            } else if (cp_is_lower(cp) && !prev_cased)
                title_ok = false;
            prev_cased = cp_is_cased(cp);
            break;
        default: r = r && cp < 0x80; break;
        }
    }
    if (kind == 4 || kind == 5) r = any_cased && r;
    if (kind == 6) r = any_cased && title_ok;
    if (kind == 7) r = r || s->len == 0;
    *out = tv_bool(r);
    return true;
}
static bool m_isdigit(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 0);
}
static bool m_isalpha(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 1);
}
static bool m_isalnum(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 2);
}
static bool m_isspace(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 3);
}
static bool m_islower(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 4);
}
static bool m_isupper(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 5);
}
static bool m_istitle(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 6);
}
static bool m_isascii(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_is_class(c, self, a, out, 7);
}

static bool m_pad(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, int mode) {
    BIND(mode == 0 ? "center" : mode == 1 ? "ljust" : "rjust", "width", "fillchar");
    int64_t width = 0;
    if (!has[0]) return tpl_fail(c, "TypeError", "expected at least 1 argument, got 0");
    if (!want_int(c, arg[0], &width)) return false;
    const char *fill = " ";
    size_t fill_len = 1;
    if (has[1]) {
        if (!want_str(c, "fillchar", arg[1])) return false;
        if (tv_str_cplen(arg[1].as.s) != 1)
            return tpl_fail(c, "TypeError", "The fill character must be exactly one character long");
        fill = arg[1].as.s->s;
        fill_len = arg[1].as.s->len;
    }
    int64_t len = (int64_t)tv_str_cplen(SELF_STR);
    if (!tpl_check_len(c, width > len ? (size_t)(width - len) * fill_len : 0)) return false;
    int64_t total = width > len ? width - len : 0, left = 0;
    if (mode == 0)
        left = total / 2 + (total & width & 1);
    else if (mode == 2)
        left = total;
    mu_buf b = {0};
    for (int64_t i = 0; i < left; i++) mu_buf_append(&b, fill, fill_len);
    mu_buf_append(&b, SELF_STR->s, SELF_STR->len);
    for (int64_t i = left; i < total; i++) mu_buf_append(&b, fill, fill_len);
    *out = tv_str_markup(tv_str_from_buf(&b), SELF_STR->markup);
    return true;
}
static bool m_center(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_pad(c, self, a, out, 0);
}
static bool m_ljust(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_pad(c, self, a, out, 1);
}
static bool m_rjust(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_pad(c, self, a, out, 2);
}

static bool m_zfill(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    BIND("zfill", "width");
    int64_t width = 0;
    if (!has[0]) return tpl_fail(c, "TypeError", "zfill() takes exactly one argument (0 given)");
    if (!want_int(c, arg[0], &width)) return false;
    const tv_str *s = SELF_STR;
    int64_t len = (int64_t)tv_str_cplen(s);
    if (!tpl_check_len(c, width > len ? (size_t)(width - len) : 0)) return false;
    mu_buf b = {0};
    size_t skip = (s->len && (s->s[0] == '+' || s->s[0] == '-')) ? 1 : 0;
    mu_buf_append(&b, s->s, skip);
    for (int64_t i = len; i < width; i++) mu_buf_putc(&b, '0');
    mu_buf_append(&b, s->s + skip, s->len - skip);
    *out = tv_str_markup(tv_str_from_buf(&b), s->markup);
    return true;
}

static bool m_partition_common(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, bool right) {
    BIND(right ? "rpartition" : "partition", "sep");
    if (!has[0] || !want_str(c, "sep", arg[0]))
        return has[0] ? false : tpl_fail(c, "TypeError", "partition() takes exactly one argument (0 given)");
    const tv_str *s = SELF_STR, *p = arg[0].as.s;
    if (!p->len) return tpl_fail(c, "ValueError", "empty separator");
    size_t at = SIZE_MAX;
    if (!right) {
        const char *hit = memmem(s->s, s->len, p->s, p->len);
        if (hit) at = (size_t)(hit - s->s);
    } else if (p->len <= s->len) {
        for (size_t k = s->len - p->len + 1; k-- > 0;)
            if (memcmp(s->s + k, p->s, p->len) == 0) {
                at = k;
                break;
            }
    }
    tv_value t = tv_list_new(SEQ_TUPLE, 3);
    if (at == SIZE_MAX) {
        tv_list_push(t.as.l, right ? piece(s, 0, 0) : piece(s, 0, s->len));
        tv_list_push(t.as.l, piece(s, 0, 0));
        tv_list_push(t.as.l, right ? piece(s, 0, s->len) : piece(s, 0, 0));
    } else {
        tv_list_push(t.as.l, piece(s, 0, at));
        tv_list_push(t.as.l, piece(s, at, at + p->len));
        tv_list_push(t.as.l, piece(s, at + p->len, s->len));
    }
    *out = t;
    return true;
}
static bool m_partition(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_partition_common(c, self, a, out, false);
}
static bool m_rpartition(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_partition_common(c, self, a, out, true);
}

static bool m_remove_affix(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, bool suffix) {
    BIND(suffix ? "removesuffix" : "removeprefix", "affix");
    if (!has[0] || !want_str(c, "argument", arg[0]))
        return has[0] ? false : tpl_fail(c, "TypeError", "expected 1 argument");
    const tv_str *s = SELF_STR, *p = arg[0].as.s;
    bool m = p->len <= s->len && memcmp(suffix ? s->s + s->len - p->len : s->s, p->s, p->len) == 0;
    *out = !m ? tv_ref(*self) : suffix ? piece(s, 0, s->len - p->len) : piece(s, p->len, s->len);
    return true;
}
static bool m_removeprefix(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_remove_affix(c, self, a, out, false);
}
static bool m_removesuffix(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return m_remove_affix(c, self, a, out, true);
}

/* str.format with positional / named fields and empty format specs. */
static bool m_format(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    const tv_str *s = SELF_STR;
    mu_buf b = {.limit = c->max_str};
    size_t auto_idx = 0;
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->s[i];
        if (ch == '}') {
            if (i + 1 < s->len && s->s[i + 1] == '}')
                i++;
            else {
                mu_buf_free(&b);
                return tpl_fail(c, "ValueError", "Single '}' encountered in format string");
            }
            mu_buf_putc(&b, '}');
            continue;
        }
        if (ch != '{') {
            mu_buf_putc(&b, ch);
            continue;
        }
        if (i + 1 < s->len && s->s[i + 1] == '{') {
            mu_buf_putc(&b, '{');
            i++;
            continue;
        }
        const char *close = memchr(s->s + i, '}', s->len - i);
        if (!close) {
            mu_buf_free(&b);
            return tpl_fail(c, "ValueError", "Single '{' encountered in format string");
        }
        size_t fs = i + 1, fe = (size_t)(close - s->s);
        i = fe;
        if (memchr(s->s + fs, ':', fe - fs) || memchr(s->s + fs, '!', fe - fs)) {
            mu_buf_free(&b);
            return tpl_fail(c, "ValueError", "format specs are not supported");
        }
        tv_value v = tv_undef_anon();
        bool found = false;
        if (fe == fs) {
            if (auto_idx < a->npos) v = a->pos[auto_idx], found = true;
            auto_idx++;
        } else if (s->s[fs] >= '0' && s->s[fs] <= '9') {
            size_t k = (size_t)strtoul(s->s + fs, NULL, 10);
            if (k < a->npos) v = a->pos[k], found = true;
        } else {
            for (size_t k = 0; k < a->nkw; k++)
                if (tv_str_eq(a->kwname[k], s->s + fs, fe - fs)) v = a->kw[k], found = true;
        }
        if (!found) {
            mu_buf_free(&b);
            return tpl_fail(c, fe == fs || (s->s[fs] >= '0' && s->s[fs] <= '9') ? "IndexError" : "KeyError",
                            "Replacement index out of range for positional args tuple");
        }
        tv_write_str(&b, v);
    }
    if (b.over) {
        mu_buf_free(&b);
        return tpl_check_len(c, SIZE_MAX);
    }
    *out = tv_str_from_buf(&b);
    return true;
}

#define M0(n, f) \
    { n, f, 0, 0, ST_NONE, NULL }
const tpl_method tpl_str_methods[] = {{"strip", m_strip, 0, 1, ST_EXPECTED, NULL},
                                      {"lstrip", m_lstrip, 0, 1, ST_EXPECTED, NULL},
                                      {"rstrip", m_rstrip, 0, 1, ST_EXPECTED, NULL},
                                      M0("lower", m_lower),
                                      M0("upper", m_upper),
                                      M0("casefold", m_lower),
                                      M0("capitalize", m_capitalize),
                                      M0("title", m_title),
                                      M0("swapcase", m_swapcase),
                                      {"split", m_split, 0, 2, ST_AT, "sep,maxsplit"},
                                      {"rsplit", m_rsplit, 0, 2, ST_AT, "sep,maxsplit"},
                                      {"splitlines", m_splitlines, 0, 1, ST_AT, "keepends"},
                                      {"startswith", m_startswith, 1, 3, ST_AT, NULL},
                                      {"endswith", m_endswith, 1, 3, ST_AT, NULL},
                                      {"replace", m_replace, 2, 3, ST_EXPECTED, NULL},
                                      {"find", m_find, 1, 3, ST_AT, NULL},
                                      {"rfind", m_rfind, 1, 3, ST_AT, NULL},
                                      {"index", m_index, 1, 3, ST_AT, NULL},
                                      {"rindex", m_rindex, 1, 3, ST_AT, NULL},
                                      {"count", m_count, 1, 3, ST_AT, NULL},
                                      {"join", m_join, 1, 1, ST_ONE, NULL},
                                      M0("isdigit", m_isdigit),
                                      M0("isdecimal", m_isdigit),
                                      M0("isnumeric", m_isdigit),
                                      M0("isalpha", m_isalpha),
                                      M0("isalnum", m_isalnum),
                                      M0("isspace", m_isspace),
                                      M0("islower", m_islower),
                                      M0("isupper", m_isupper),
                                      M0("istitle", m_istitle),
                                      M0("isascii", m_isascii),
                                      {"center", m_center, 1, 2, ST_EXPECTED, NULL},
                                      {"ljust", m_ljust, 1, 2, ST_EXPECTED, NULL},
                                      {"rjust", m_rjust, 1, 2, ST_EXPECTED, NULL},
                                      {"zfill", m_zfill, 1, 1, ST_ONE, NULL},
                                      {"partition", m_partition, 1, 1, ST_ONE, NULL},
                                      {"rpartition", m_rpartition, 1, 1, ST_ONE, NULL},
                                      {"removeprefix", m_removeprefix, 1, 1, ST_ONE, NULL},
                                      {"removesuffix", m_removesuffix, 1, 1, ST_ONE, NULL},
                                      {"format", m_format, 0, 255, ST_ANY, NULL},
                                      {NULL, NULL, 0, 0, 0, NULL}};
