/* Python printf-style formatting: `"%s: %d" % (a, b)` and the `format`
 * filter. Numeric conversions go through C's printf, whose output for
 * these specifiers is the same as Python's. */
#include "template/tpl_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct fmt_spec {
    char flags[8];
    int nflags;
    long width; /* -1: none */
    long prec;  /* -1: none */
    char conv;
} fmt_spec;

static void pad_text(mu_buf *b, const fmt_spec *f, const char *s, size_t n) {
    size_t cps = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) cps++;
    if (f->prec >= 0 && cps > (size_t)f->prec) {
        n = tpl_utf8_offset(s, n, (size_t)f->prec);
        cps = (size_t)f->prec;
    }
    bool left = memchr(f->flags, '-', (size_t)f->nflags) != NULL;
    size_t pad = f->width > 0 && (size_t)f->width > cps ? (size_t)f->width - cps : 0;
    if (!left)
        for (size_t i = 0; i < pad; i++) mu_buf_putc(b, ' ');
    mu_buf_append(b, s, n);
    if (left)
        for (size_t i = 0; i < pad; i++) mu_buf_putc(b, ' ');
}

static bool format_one(tpl_ctx *c, mu_buf *b, const fmt_spec *f, tv_value v, bool markup) {
    char cfmt[48], out[512];
    int k = 0;
    cfmt[k++] = '%';
    for (int i = 0; i < f->nflags; i++) cfmt[k++] = f->flags[i];
    if (f->width >= 0) k += snprintf(cfmt + k, sizeof cfmt - (size_t)k, "%ld", f->width > 400 ? 400 : f->width);
    if (f->prec >= 0 && f->conv != 's' && f->conv != 'r' && f->conv != 'a')
        k += snprintf(cfmt + k, sizeof cfmt - (size_t)k, ".%ld", f->prec > 300 ? 300 : f->prec);
    switch (f->conv) {
    case 's':
    case 'r':
    case 'a': {
        mu_buf t = {0};
        if (f->conv == 's')
            tv_write_str(&t, v);
        else
            tv_write_repr(&t, v);
        if (markup && !(f->conv == 's' && v.type == TV_STR && v.as.s->markup)) { /* Markup % escapes */
            mu_buf e = {0};
            tpl_html_escape(&e, t.p ? t.p : "", t.len);
            mu_buf_free(&t);
            t = e;
        }
        pad_text(b, f, t.p ? t.p : "", t.len);
        mu_buf_free(&t);
        return true;
    }
    case 'd':
    case 'i':
    case 'u':
    case 'o':
    case 'x':
    case 'X': {
        long long iv;
        if (v.type == TV_INT)
            iv = v.as.i;
        else if (v.type == TV_BOOL)
            iv = v.as.b;
        else if (v.type == TV_FLOAT && (f->conv == 'd' || f->conv == 'i' || f->conv == 'u')) {
            if (isnan(v.as.f) || isinf(v.as.f) || fabs(v.as.f) >= 9.2e18)
                return tpl_fail(c, "OverflowError", "cannot convert float to integer");
            iv = (long long)v.as.f;
        } else if (f->conv == 'd' || f->conv == 'i' || f->conv == 'u')
            return tpl_fail(c, "TypeError", "%%%c format: a real number is required, not %s", f->conv, tv_type_name(v));
        else
            return tpl_fail(c, "TypeError", "%%%c format: an integer is required, not %s", f->conv, tv_type_name(v));
        char conv = f->conv == 'i' || f->conv == 'u' ? 'd' : f->conv;
        snprintf(cfmt + k, sizeof cfmt - (size_t)k, "ll%c", conv);
        if (conv == 'o' && memchr(f->flags, '#', (size_t)f->nflags)) { /* Python writes 0o */
            char tmp[64];
            snprintf(tmp, sizeof tmp, "%llo", iv < 0 ? -(unsigned long long)iv : (unsigned long long)iv);
            snprintf(out, sizeof out, "%s0o%s", iv < 0 ? "-" : "", tmp);
        } else if ((conv == 'x' || conv == 'X' || conv == 'o') && iv < 0) {
            char pos_fmt[48];
            memcpy(pos_fmt, cfmt, sizeof pos_fmt);
            snprintf(out, sizeof out, "-");
            snprintf(out + 1, sizeof out - 1, pos_fmt, -(unsigned long long)iv);
        } else {
            snprintf(out, sizeof out, cfmt, iv);
        }
        mu_buf_puts(b, out);
        return true;
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
        double d;
        if (v.type == TV_FLOAT)
            d = v.as.f;
        else if (v.type == TV_INT)
            d = (double)v.as.i;
        else if (v.type == TV_BOOL)
            d = v.as.b;
        else
            return tpl_fail(c, "TypeError", "must be real number, not %s", tv_type_name(v));
        snprintf(cfmt + k, sizeof cfmt - (size_t)k, "%c", f->conv);
        snprintf(out, sizeof out, cfmt, d);
        mu_buf_puts(b, out);
        return true;
    }
    case 'c':
        if (v.type == TV_INT && v.as.i >= 0 && v.as.i <= 0x10FFFF) {
            mu_buf t = {0};
            tpl_utf8_put(&t, (uint32_t)v.as.i);
            pad_text(b, f, t.p, t.len);
            mu_buf_free(&t);
            return true;
        }
        if (v.type == TV_STR && tv_str_cplen(v.as.s) == 1) {
            pad_text(b, f, v.as.s->s, v.as.s->len);
            return true;
        }
        return tpl_fail(c, "TypeError", "%%c requires int or char");
    default:
        return tpl_fail(c, "ValueError", "unsupported format character '%c' (0x%x)", f->conv,
                        (unsigned)(unsigned char)f->conv);
    }
}

bool tpl_format_percent(tpl_ctx *c, tv_value fmt, tv_value args, tv_value *out) {
    const tv_str *s = fmt.as.s;
    bool is_tuple = args.type == TV_LIST && args.as.l->kind == SEQ_TUPLE;
    bool is_map = args.type == TV_DICT;
    size_t nargs = is_tuple ? args.as.l->n : 1, next = 0;
    bool used_map = false;
    mu_buf b = {.limit = c->max_str};
    for (size_t i = 0; i < s->len; i++) {
        if (s->s[i] != '%') {
            mu_buf_putc(&b, s->s[i]);
            continue;
        }
        if (++i >= s->len) {
            mu_buf_free(&b);
            return tpl_fail(c, "ValueError", "incomplete format");
        }
        fmt_spec f = {.width = -1, .prec = -1};
        tv_value v = tv_undef_anon();
        bool have = false;
        if (s->s[i] == '(') {
            const char *close = memchr(s->s + i, ')', s->len - i);
            if (!close) {
                mu_buf_free(&b);
                return tpl_fail(c, "ValueError", "incomplete format key");
            }
            if (!is_map) {
                mu_buf_free(&b);
                return tpl_fail(c, "TypeError", "format requires a mapping");
            }
            size_t ks = i + 1, ke = (size_t)(close - s->s);
            const tv_value *hit = tv_dict_get_str(args.as.d, s->s + ks, ke - ks);
            if (!hit) {
                mu_buf_free(&b);
                return tpl_fail(c, "KeyError", "'%.*s'", (int)(ke - ks), s->s + ks);
            }
            v = *hit;
            have = used_map = true;
            i = ke + 1;
        }
        while (i < s->len && strchr("-+ #0", s->s[i]) && f.nflags < 7) f.flags[f.nflags++] = s->s[i++];
        if (i < s->len && s->s[i] == '*') {
            if (next >= nargs || !is_tuple || args.as.l->v[next].type != TV_INT) {
                mu_buf_free(&b);
                return tpl_fail(c, "TypeError", "* wants int");
            }
            f.width = (long)args.as.l->v[next++].as.i;
            i++;
        } else
            while (i < s->len && s->s[i] >= '0' && s->s[i] <= '9')
                f.width = (f.width < 0 ? 0 : f.width) * 10 + (s->s[i++] - '0');
        if (i < s->len && s->s[i] == '.') {
            i++;
            f.prec = 0;
            while (i < s->len && s->s[i] >= '0' && s->s[i] <= '9') f.prec = f.prec * 10 + (s->s[i++] - '0');
        }
        while (i < s->len && (s->s[i] == 'h' || s->s[i] == 'l' || s->s[i] == 'L')) i++;
        if (i >= s->len) {
            mu_buf_free(&b);
            return tpl_fail(c, "ValueError", "incomplete format");
        }
        f.conv = s->s[i];
        if (f.conv == '%') {
            mu_buf_putc(&b, '%');
            continue;
        }
        if (!have) {
            if (next >= nargs) {
                mu_buf_free(&b);
                return tpl_fail(c, "TypeError", "not enough arguments for format string");
            }
            v = is_tuple ? args.as.l->v[next] : args;
            next++;
        }
        if (!format_one(c, &b, &f, v, s->markup)) {
            mu_buf_free(&b);
            return false;
        }
    }
    /* Python only complains about unused arguments when the right operand
     * is a tuple or has no __getitem__ (lists, dicts, Undefined have one) */
    bool subscriptable =
        args.type == TV_DICT || args.type == TV_UNDEFINED || (args.type == TV_LIST && args.as.l->kind == SEQ_LIST);
    if (!used_map && next < nargs && (is_tuple || !subscriptable)) {
        mu_buf_free(&b);
        return tpl_fail(c, "TypeError", "not all arguments converted during string formatting");
    }
    if (b.over) {
        mu_buf_free(&b);
        return tpl_check_len(c, SIZE_MAX);
    }
    *out = tv_str_markup(tv_str_from_buf(&b), s->markup);
    return true;
}
