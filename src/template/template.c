/* Public API: parse once, render many times with HF's context variables. */
#include "template/tpl_internal.h"
#include "template/tpl_lex.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define DEFAULT_MAX_OUTPUT ((size_t)32 << 20)
#define DEFAULT_MAX_STEPS 50000000ULL

/* jinja2 splits on \r\n, \r and \n, joins with \n, and drops one
 * trailing newline (keep_trailing_newline=False). */
static char *normalise_source(const char *src, size_t len, size_t *out_len) {
    char *d = mu_xmalloc(len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            d[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else
            d[n++] = src[i];
    }
    if (n && d[n - 1] == '\n') n--;
    d[n] = '\0';
    *out_len = n;
    return d;
}

/* Bytes after a UTF-8 lead byte; -1 if c cannot start a sequence. */
static int utf8_trailing(unsigned c) {
    if (c < 0x80) return 0;
    if (c >= 0xC2 && c <= 0xDF) return 1;
    if (c >= 0xE0 && c <= 0xEF) return 2;
    if (c >= 0xF0 && c <= 0xF4) return 3;
    return -1;
}

/* Offset of the first byte that is not well-formed UTF-8, or len. */
static size_t first_invalid_utf8(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        int extra = utf8_trailing(u[i]);
        if (extra < 0 || (extra && i + (size_t)extra >= len)) return i;
        for (int k = 1; k <= extra; k++)
            if ((u[i + (size_t)k] & 0xC0) != 0x80) return i;
        unsigned c = u[i], d = extra ? u[i + 1] : 0;
        if ((c == 0xE0 && d < 0xA0) || (c == 0xF0 && d < 0x90) || (c == 0xF4 && d > 0x8F) || (c == 0xED && d >= 0xA0))
            return i; /* overlong, beyond U+10FFFF, or a surrogate */
        i += (size_t)extra + 1;
    }
    return len;
}

mu_template *mu_template_parse(const char *src, size_t len, const char *name, mu_error *err) {
    if (!src) {
        mu_err_set(err, "template: no source");
        return NULL;
    }
    if (len > ((size_t)1 << 30)) {
        mu_err_set(err, "%s: template too large (%zu bytes)", name ? name : "template", len);
        return NULL;
    }
    size_t bad = first_invalid_utf8(src, len);
    if (bad < len) { /* jinja2 gets a Python str: the source must decode */
        mu_err_set(err, "%s: invalid UTF-8 at byte offset %zu", name ? name : "template", bad);
        return NULL;
    }
    mu_template *t = mu_xcalloc(1, sizeof *t);
    t->name = mu_xstrdup(name ? name : "template");
    t->src = normalise_source(src, len, &t->len);
    t->nm_loop = tpl_intern(t, "loop", 4);
    t->nm_caller = tpl_intern(t, "caller", 6);
    t->nm_kwargs = tpl_intern(t, "kwargs", 6);
    t->nm_varargs = tpl_intern(t, "varargs", 7);
    if (!tpl_parse(t, err)) {
        mu_template_free(t);
        return NULL;
    }
    return t;
}

void mu_template_free(mu_template *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nimmortals; i++) tv_str_free_immortal(t->immortals[i]);
    free(t->immortals);
    tpl_arena_free(&t->arena);
    free(t->src);
    free(t->name);
    free(t);
}

/* ----------------------------------------------------------------- inputs */
static tv_str *keep_name(tpl_ctx *c, const char *s, size_t n) {
    tv_value v = tv_str_new(s, n);
    tv_list_push(c->keep.as.l, v);
    return v.as.s;
}

static void set_var(tpl_ctx *c, tpl_scope *g, const char *name, tv_value v) {
    tpl_scope_set_global(g, keep_name(c, name, strlen(name)), v);
}

static bool parse_date(tpl_ctx *c, const char *date) {
    if (!date) {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        c->year = tm.tm_year + 1900;
        c->month = tm.tm_mon + 1;
        c->day = tm.tm_mday;
        return true;
    }
    int y, m, d;
    char tail;
    if (sscanf(date, "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31 || y < 1 ||
        y > 9999)
        return tpl_fail(c, "ValueError", "date: expected YYYY-MM-DD, got '%.64s'", date);
    c->year = y;
    c->month = m;
    c->day = d;
    return true;
}

static bool load_inputs(tpl_ctx *c, tpl_scope *g, const mu_template_inputs *in) {
    tv_value v;
    if (in->messages_json) {
        if (!tpl_json_parse(c, in->messages_json, "messages", &v)) return false;
        set_var(c, g, "messages", v);
    }
    if (in->tools_json) {
        if (!tpl_json_parse(c, in->tools_json, "tools", &v)) return false;
        set_var(c, g, "tools", v);
    } else {
        set_var(c, g, "tools", tv_none());
    }
    set_var(c, g, "documents", tv_none());
    set_var(c, g, "add_generation_prompt", tv_bool(in->add_generation_prompt));
    if (in->bos_token) set_var(c, g, "bos_token", tv_str_cstr(in->bos_token));
    if (in->eos_token) set_var(c, g, "eos_token", tv_str_cstr(in->eos_token));
    if (in->extra_json) {
        if (!tpl_json_parse(c, in->extra_json, "extra", &v)) return false;
        if (v.type != TV_DICT) {
            tv_unref(v);
            return tpl_fail(c, "ValueError", "extra: expected a JSON object");
        }
        for (size_t i = 0; i < v.as.d->n; i++) {
            const tv_str *k = v.as.d->k[i].as.s;
            tpl_scope_set_global(g, keep_name(c, k->s, k->len), tv_ref(v.as.d->v[i]));
        }
        tv_unref(v);
    }
    return true;
}

/* Namespaces can reference each other (ns.a = ns): empty them all, then
 * drop the render-wide references. */
static void release_namespaces(tpl_ctx *c) {
    for (tv_ns *ns = c->live_ns; ns; ns = ns->next_live) {
        tv_dict *d = ns->attrs;
        tv_value *k = d->k, *v = d->v;
        size_t n = d->n;
        d->k = d->v = NULL;
        d->n = d->cap = 0;
        free(d->slots);
        d->slots = NULL;
        d->nslots = 0;
        for (size_t i = 0; i < n; i++) {
            tv_unref(k[i]);
            tv_unref(v[i]);
        }
        free(k);
        free(v);
    }
    for (tv_ns *ns = c->live_ns, *nx; ns; ns = nx) {
        nx = ns->next_live;
        tv_value v = {.type = TV_NS};
        v.as.ns = ns;
        tv_unref(v);
    }
    c->live_ns = NULL;
}

static void report(const mu_template *t, const tpl_ctx *c, mu_template_failure *fail, mu_error *err) {
    int line = 0, col = 0;
    if (c->pos_set) tpl_line_col(t, c->err_pos, &line, &col);
    if (fail) {
        snprintf(fail->exc_type, sizeof fail->exc_type, "%s", c->exc);
        snprintf(fail->message, sizeof fail->message, "%s", c->msg);
        fail->line = line;
        fail->col = col;
    }
    if (line)
        mu_err_set(err, "%s:%d:%d: %s", t->name, line, col, c->msg);
    else
        mu_err_set(err, "%s: %s", t->name, c->msg);
}

char *mu_template_render_ex(const mu_template *t, const mu_template_inputs *in, size_t *out_len,
                            mu_template_failure *fail, mu_error *err) {
    if (fail) memset(fail, 0, sizeof *fail);
    if (!t || !in) {
        mu_err_set(err, "template: no template or inputs");
        return NULL;
    }
    tpl_ctx c = {0};
    c.t = t;
    c.max_str = in->max_output ? in->max_output : DEFAULT_MAX_OUTPUT;
    c.max_steps = in->max_steps ? in->max_steps : DEFAULT_MAX_STEPS;
    c.keep = tv_list_new(SEQ_LIST, 16);
    mu_buf out = {.limit = c.max_str};
    c.out = &out;
    tpl_scope *globals = tpl_scope_new(&c, NULL);
    bool ok = parse_date(&c, in->date) && load_inputs(&c, globals, in);
    if (ok) {
        tpl_scope *root = tpl_scope_new(&c, globals);
        ok = tpl_exec_root(&c, root);
        tpl_scope_end(root);
    }
    tpl_scope_end(globals);
    tpl_scopes_free(&c);
    release_namespaces(&c);
    tv_unref(c.keep);
    if (!ok) {
        if (!c.failed) tpl_fail(&c, "RuntimeError", "render failed");
        report(t, &c, fail, err);
        mu_buf_free(&out);
        return NULL;
    }
    if (out_len) *out_len = out.len;
    if (!out.p) {
        out.p = mu_xmalloc(1);
        out.p[0] = '\0';
    }
    return out.p;
}

char *mu_template_render(const mu_template *t, const mu_template_inputs *in, mu_error *err) {
    return mu_template_render_ex(t, in, NULL, NULL, err);
}
