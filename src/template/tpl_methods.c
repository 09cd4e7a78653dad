/* Methods of the builtin types as Python has them (str, dict, list,
 * tuple; mutators blocked as jinja2's ImmutableSandboxedEnvironment does),
 * loop attributes, template globals and shared string helpers. */
#include "template/tpl_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* ------------------------------------------------------------- arguments */
/* Binds like a Python function `fname(<hidden params>, *names)` whose first
 * `nreq` names are required; errors are CPython's TypeError messages
 * (hidden params are what jinja2 passes first: the value, the environment). */
bool tpl_bind(tpl_ctx *c, const char *fname, int hidden, int nreq, const tpl_args *a, const char *const *names,
              tv_value *slots, bool *given) {
    size_t n = 0;
    while (names[n]) n++;
    for (size_t i = 0; i < n; i++) {
        slots[i] = tv_undef_anon();
        given[i] = false;
    }
    if (a->npos > n) {
        size_t total = (size_t)hidden + n, req = (size_t)hidden + (size_t)nreq, got = (size_t)hidden + a->npos;
        if (req == total)
            return tpl_fail(c, "TypeError", "%s() takes %zu positional argument%s but %zu %s given", fname, total,
                            total == 1 ? "" : "s", got, got == 1 ? "was" : "were");
        return tpl_fail(c, "TypeError", "%s() takes from %zu to %zu positional arguments but %zu %s given", fname, req,
                        total, got, got == 1 ? "was" : "were");
    }
    for (size_t i = 0; i < a->npos; i++) {
        slots[i] = a->pos[i];
        given[i] = true;
    }
    for (size_t k = 0; k < a->nkw; k++) {
        size_t i = 0;
        while (i < n && !tv_str_is(a->kwname[k], names[i])) i++;
        if (i == n)
            return tpl_fail(c, "TypeError", "%s() got an unexpected keyword argument '%s'", fname, a->kwname[k]->s);
        if (given[i]) return tpl_fail(c, "TypeError", "%s() got multiple values for argument '%s'", fname, names[i]);
        slots[i] = a->kw[k];
        given[i] = true;
    }
    size_t missing = 0;
    for (int i = 0; i < nreq; i++) missing += !given[i];
    if (missing) {
        char list[256] = "";
        size_t done = 0, m = 0;
        for (int i = 0; i < nreq; i++) {
            if (given[i]) continue;
            const char *sep = done == 0 ? "" : (done + 1 == missing ? (missing > 2 ? ", and " : " and ") : ", ");
            m += (size_t)snprintf(list + m, sizeof list - m, "%s'%s'", sep, names[i]);
            done++;
            if (m >= sizeof list) break;
        }
        return tpl_fail(c, "TypeError", "%s() missing %zu required positional argument%s: %s", fname, missing,
                        missing == 1 ? "" : "s", list);
    }
    return true;
}

/* A C builtin of exactly one argument (abs, len, markupsafe.escape). */
bool tpl_bind_builtin1(tpl_ctx *c, const char *fname, const tpl_args *a) {
    if (a->nkw) return tpl_fail(c, "TypeError", "%s() takes no keyword arguments", fname);
    if (a->npos) return tpl_fail(c, "TypeError", "%s() takes exactly one argument (%zu given)", fname, a->npos + 1);
    return true;
}

bool tpl_arg_str(tpl_ctx *c, const char *what, tv_value v) {
    if (v.type == TV_STR) return true;
    return tpl_fail(c, "TypeError", "%s must be str, not %s", what, tv_type_name(v));
}

bool tpl_arg_int(tpl_ctx *c, tv_value v, int64_t *out) {
    if (v.type == TV_INT)
        *out = v.as.i;
    else if (v.type == TV_BOOL)
        *out = v.as.b;
    else
        return tpl_fail(c, "TypeError", "'%s' object cannot be interpreted as an integer", tv_type_name(v));
    return true;
}

/* ----------------------------------------------------------- dict methods */
static bool m_dict_get(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    if (a->nkw) return tpl_fail(c, "TypeError", "get() takes no keyword arguments");
    if (a->npos < 1 || a->npos > 2)
        return tpl_fail(c, "TypeError", "get expected at least 1 argument, got %zu", a->npos);
    if (!tpl_require_hashable(c, a->pos[0])) return false;
    const tv_value *v = tv_dict_get(self->as.d, a->pos[0]);
    *out = v ? tv_ref(*v) : a->npos > 1 ? tv_ref(a->pos[1]) : tv_none();
    return true;
}

static bool dict_view(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, int which) {
    (void)c;
    (void)a; /* arity checked by the method table */
    const tv_dict *d = self->as.d;
    tv_value l = tv_list_new(which == 0 ? SEQ_DICT_KEYS : which == 1 ? SEQ_DICT_VALUES : SEQ_DICT_ITEMS, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0)
            tv_list_push(l.as.l, tv_ref(d->k[i]));
        else if (which == 1)
            tv_list_push(l.as.l, tv_ref(d->v[i]));
        else {
            tv_value t = tv_list_new(SEQ_TUPLE, 2);
            tv_list_push(t.as.l, tv_ref(d->k[i]));
            tv_list_push(t.as.l, tv_ref(d->v[i]));
            tv_list_push(l.as.l, t);
        }
    }
    *out = l;
    return true;
}
static bool m_keys(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return dict_view(c, self, a, out, 0);
}
static bool m_values(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return dict_view(c, self, a, out, 1);
}
static bool m_items(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return dict_view(c, self, a, out, 2);
}
static bool m_dict_copy(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)c;
    (void)a; /* arity checked by the method table */
    *out = tv_dict_copy(self->as.d);
    return true;
}

/* ----------------------------------------------------------- list methods */
static bool m_list_count(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    if (a->npos != 1 || a->nkw)
        return tpl_fail(c, "TypeError", "count() takes exactly one argument (%zu given)", a->npos);
    int64_t n = 0;
    for (size_t i = 0; i < self->as.l->n; i++) n += tv_equal(self->as.l->v[i], a->pos[0]);
    *out = tv_int(n);
    return true;
}

static bool m_list_index(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    if (a->npos < 1 || a->nkw) return tpl_fail(c, "TypeError", "index expected at least 1 argument, got 0");
    for (size_t i = 0; i < self->as.l->n; i++)
        if (tv_equal(self->as.l->v[i], a->pos[0])) {
            *out = tv_int((int64_t)i);
            return true;
        }
    mu_buf b = {0};
    tv_write_repr(&b, a->pos[0]);
    tpl_fail(c, "ValueError", self->as.l->kind == SEQ_TUPLE ? "tuple.index(x): x not in tuple" : "%s is not in list",
             b.p);
    mu_buf_free(&b);
    return false;
}

static bool m_list_copy(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)c;
    (void)a; /* arity checked by the method table */
    tv_value l = tv_list_new(SEQ_LIST, self->as.l->n);
    for (size_t i = 0; i < self->as.l->n; i++) tv_list_push(l.as.l, tv_ref(self->as.l->v[i]));
    *out = l;
    return true;
}

/* ------------------------------------------------------------ method table */
#define M0(n, f) \
    { n, f, 0, 0, ST_NONE, NULL }
static const tpl_method DICT_METHODS[] = {{"get", m_dict_get, 1, 2, ST_EXPECTED, NULL},
                                          M0("keys", m_keys),
                                          M0("values", m_values),
                                          M0("items", m_items),
                                          M0("copy", m_dict_copy),
                                          M0("clear", NULL),
                                          M0("pop", NULL),
                                          M0("popitem", NULL),
                                          M0("setdefault", NULL),
                                          M0("update", NULL),
                                          {NULL, NULL, 0, 0, 0, NULL}};
static const tpl_method LIST_METHODS[] = {{"count", m_list_count, 1, 1, ST_ONE, NULL},
                                          {"index", m_list_index, 1, 3, ST_EXPECTED, NULL},
                                          M0("copy", m_list_copy),
                                          M0("append", NULL),
                                          M0("clear", NULL),
                                          M0("extend", NULL),
                                          M0("insert", NULL),
                                          M0("pop", NULL),
                                          M0("remove", NULL),
                                          M0("reverse", NULL),
                                          M0("sort", NULL),
                                          {NULL, NULL, 0, 0, 0, NULL}};
static const tpl_method TUPLE_METHODS[] = {{"count", m_list_count, 1, 1, ST_ONE, NULL},
                                           {"index", m_list_index, 1, 3, ST_EXPECTED, NULL},
                                           {NULL, NULL, 0, 0, 0, NULL}};

static bool kw_allowed(const char *list, const tv_str *name) {
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (tv_str_eq(name, p, n)) return true;
        p = e ? e + 1 : p + n;
    }
    return false;
}

/* The wrapper every method call goes through: CPython's arity errors. */
static bool method_call(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out, const tpl_method *m) {
    const char *owner = tv_type_name(*self);
    if (m->style != ST_ANY) {
        for (size_t k = 0; k < a->nkw; k++) {
            if (!m->kw) return tpl_fail(c, "TypeError", "%s.%s() takes no keyword arguments", owner, m->name);
            if (!kw_allowed(m->kw, a->kwname[k]))
                return tpl_fail(c, "TypeError", "'%s' is an invalid keyword argument for %s()", a->kwname[k]->s,
                                m->name);
        }
        size_t n = a->npos + (m->kw ? 0 : a->nkw);
        if (n < m->min || n > m->max) {
            bool few = n < m->min;
            unsigned lim = few ? m->min : m->max;
            switch (m->style) {
            case ST_AT:
                return tpl_fail(c, "TypeError", "%s() takes at %s %u argument%s (%zu given)", m->name,
                                few ? "least" : "most", lim, lim == 1 ? "" : "s", n);
            case ST_EXPECTED:
                return tpl_fail(c, "TypeError", "%s expected at %s %u argument%s, got %zu", m->name,
                                few ? "least" : "most", lim, lim == 1 ? "" : "s", n);
            case ST_ONE:
                return tpl_fail(c, "TypeError", "%s.%s() takes exactly one argument (%zu given)", owner, m->name, n);
            default: return tpl_fail(c, "TypeError", "%s.%s() takes no arguments (%zu given)", owner, m->name, n);
            }
        }
    }
    return m->fn(c, self, a, out);
}

/* Bound methods are FN_BUILTIN values of this dispatcher; the table entry
 * travels as the function's data. */
static bool method_dispatch(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    return method_call(c, self, a, out, (const tpl_method *)c->call_data);
}

bool tpl_method_lookup(tpl_ctx *c, tv_value obj, const tv_str *name, tv_value *out, bool *found) {
    (void)c;
    const tpl_method *table = NULL;
    if (obj.type == TV_STR)
        table = tpl_str_methods;
    else if (obj.type == TV_DICT)
        table = DICT_METHODS;
    else if (obj.type == TV_LIST && obj.as.l->kind == SEQ_LIST)
        table = LIST_METHODS;
    else if (obj.type == TV_LIST && obj.as.l->kind == SEQ_TUPLE)
        table = TUPLE_METHODS;
    *found = false;
    for (; table && table->name; table++) {
        if (!tv_str_is(name, table->name)) continue;
        *found = true;
        if (!table->fn) {
            const char *tn = tv_type_name(obj);
            *out = tv_undef_msg("SecurityError", "access to attribute '%s' of '%s' object is unsafe.", name->s, tn);
        } else {
            *out = tv_func_builtin(table->name, method_dispatch, obj);
            out->as.fn->data = table;
        }
        return true;
    }
    return true;
}

/* ---------------------------------------------------------- loop context */
static bool loop_cycle(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    if (!a->npos) return tpl_fail(c, "TypeError", "no items for cycling given");
    *out = tv_ref(a->pos[self->as.loop->index0 % a->npos]);
    return true;
}

static bool loop_changed(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)c;
    tv_loop *l = self->as.loop;
    tv_value cur = tv_list_new(SEQ_TUPLE, a->npos);
    for (size_t i = 0; i < a->npos; i++) tv_list_push(cur.as.l, tv_ref(a->pos[i]));
    bool changed = !l->has_changed || !tv_equal(l->last_changed, cur);
    if (changed) {
        tv_move(&l->last_changed, cur);
        l->has_changed = true;
    } else
        tv_unref(cur);
    *out = tv_bool(changed);
    return true;
}

tv_value tpl_loop_attr(tpl_ctx *c, tv_loop *l, const tv_str *name, bool *found) {
    (void)c;
    int64_t idx = (int64_t)l->index0, len = (int64_t)l->items->n;
    *found = true;
    if (tv_str_is(name, "index")) return tv_int(idx + 1);
    if (tv_str_is(name, "index0")) return tv_int(idx);
    if (tv_str_is(name, "revindex")) return tv_int(len - idx);
    if (tv_str_is(name, "revindex0")) return tv_int(len - idx - 1);
    if (tv_str_is(name, "first")) return tv_bool(idx == 0);
    if (tv_str_is(name, "last")) return tv_bool(idx == len - 1);
    if (tv_str_is(name, "length")) return tv_int(len);
    if (tv_str_is(name, "depth")) return tv_int(l->depth0 + 1);
    if (tv_str_is(name, "depth0")) return tv_int(l->depth0);
    if (tv_str_is(name, "previtem"))
        return idx > 0 ? tv_ref(l->items->v[idx - 1]) : tv_undef_msg("UndefinedError", "there is no previous item");
    if (tv_str_is(name, "nextitem"))
        return idx + 1 < len ? tv_ref(l->items->v[idx + 1]) : tv_undef_msg("UndefinedError", "there is no next item");
    tv_value self = {.type = TV_LOOP};
    self.as.loop = l;
    if (tv_str_is(name, "cycle") || tv_str_is(name, "changed")) {
        bool cyc = tv_str_is(name, "cycle");
        tv_value m = tv_func_builtin(cyc ? "cycle" : "changed", cyc ? loop_cycle : loop_changed, self);
        m.as.fn->pytype = "method";
        return m;
    }
    *found = false;
    return tv_undef_anon();
}

/* ---------------------------------------------------------------- globals */
static bool g_range(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)self;
    if (a->nkw)
        return tpl_fail(c, "TypeError", "safe_range() got an unexpected keyword argument '%s'", a->kwname[0]->s);
    if (a->npos < 1 || a->npos > 3)
        return tpl_fail(c, "TypeError",
                        a->npos ? "range expected at most 3 arguments, got %zu"
                                : "range expected at least 1 argument, got %zu",
                        a->npos);
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a->npos; i++)
        if (!tpl_arg_int(c, a->pos[i], &v[i])) return false;
    int64_t start = a->npos == 1 ? 0 : v[0], stop = a->npos == 1 ? v[0] : v[1], step = a->npos == 3 ? v[2] : 1;
    if (step == 0) return tpl_fail(c, "ValueError", "range() arg 3 must not be zero");
    double count = step > 0 ? (stop > start ? ((double)stop - (double)start + (double)step - 1) / (double)step : 0)
                            : (stop < start ? ((double)start - (double)stop - (double)step - 1) / (double)-step : 0);
    if (count > 100000)
        return tpl_fail(c, "OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    tv_value l = tv_list_new(SEQ_LIST, (size_t)count);
    for (int64_t x = start; step > 0 ? x < stop : x > stop; x += step) tv_list_push(l.as.l, tv_int(x));
    *out = l;
    return true;
}

static bool dict_update_from(tpl_ctx *c, tv_dict *d, tv_value src) {
    if (src.type == TV_DICT) {
        for (size_t i = 0; i < src.as.d->n; i++) tv_dict_set(d, tv_ref(src.as.d->k[i]), tv_ref(src.as.d->v[i]));
        return true;
    }
    if (src.type == TV_NS) return dict_update_from(c, d, tv_dict_val(src.as.ns->attrs));
    if (src.type == TV_UNDEFINED) return tpl_fail_undefined(c, src); /* dict() asks it for .keys */
    tv_value items;
    if (!tpl_iterate(c, src, &items)) return false;
    for (size_t i = 0; i < items.as.l->n; i++) {
        tv_value pair;
        if (!tpl_iterate(c, items.as.l->v[i], &pair)) return tv_unref(items), false;
        if (pair.as.l->n != 2) {
            size_t n = pair.as.l->n;
            tv_unref(pair);
            tv_unref(items);
            return tpl_fail(c, "ValueError", "dictionary update sequence element #%zu has length %zu; 2 is required", i,
                            n);
        }
        if (!tpl_require_hashable(c, pair.as.l->v[0])) return tv_unref(pair), tv_unref(items), false;
        tv_dict_set(d, tv_ref(pair.as.l->v[0]), tv_ref(pair.as.l->v[1]));
        tv_unref(pair);
    }
    tv_unref(items);
    return true;
}

static bool build_dict(tpl_ctx *c, const char *fname, const tpl_args *a, tv_value *out) {
    if (a->npos > 1) return tpl_fail(c, "TypeError", "%s expected at most 1 argument, got %zu", fname, a->npos);
    tv_value d = tv_dict_new();
    if (a->npos && !dict_update_from(c, d.as.d, a->pos[0])) return tv_unref(d), false;
    for (size_t k = 0; k < a->nkw; k++)
        tv_dict_set(d.as.d, tv_ref((tv_value){.type = TV_STR, .as.s = a->kwname[k]}), tv_ref(a->kw[k]));
    *out = d;
    return true;
}

static bool g_dict(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)self;
    return build_dict(c, "dict", a, out);
}

static bool g_namespace(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)self;
    tv_value d;
    if (!build_dict(c, "dict", a, &d)) return false;
    tv_ns *ns = mu_xcalloc(1, sizeof *ns);
    ns->refs = 2; /* one for the caller, one for the render-wide list */
    ns->attrs = d.as.d;
    ns->next_live = c->live_ns;
    c->live_ns = ns;
    out->type = TV_NS;
    out->as.ns = ns;
    return true;
}

static bool g_raise_exception(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)self;
    (void)out;
    static const char *const names[] = {"message", NULL};
    tv_value arg[1];
    bool has[1];
    if (!tpl_bind(c, "_cached_compile_jinja_template.<locals>.raise_exception", 0, 1, a, names, arg, has)) return false;
    mu_buf b = {0};
    tv_write_str(&b, arg[0]);
    tpl_fail(c, "TemplateError", "%s", b.p ? b.p : "");
    mu_buf_free(&b);
    return false;
}

static bool g_strftime_now(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)self;
    static const char *const names[] = {"format", NULL};
    tv_value arg[1];
    bool has[1];
    if (!tpl_bind(c, "_cached_compile_jinja_template.<locals>.strftime_now", 0, 1, a, names, arg, has)) return false;
    if (arg[0].type != TV_STR)
        return tpl_fail(c, "TypeError", "strftime() argument 1 must be str, not %s", tv_type_name(arg[0]));
    struct tm tm = {0};
    tm.tm_year = c->year - 1900;
    tm.tm_mon = c->month - 1;
    tm.tm_mday = c->day;
    tm.tm_isdst = -1;
    time_t tt = timegm(&tm); /* normalises weekday / yearday */
    gmtime_r(&tt, &tm);
    const tv_str *fmt = arg[0].as.s;
    if (memchr(fmt->s, '\0', fmt->len)) return tpl_fail(c, "ValueError", "embedded null character");
    char buf[4096];
    size_t n = fmt->len ? strftime(buf, sizeof buf, fmt->s, &tm) : 0;
    if (fmt->len && n == 0 && fmt->len > 0) buf[0] = '\0';
    *out = tv_str_new(buf, n);
    return true;
}

static bool joiner_call(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    if (a->npos || a->nkw) return tpl_fail(c, "TypeError", "__call__() takes 1 positional argument");
    tv_dict *st = self->as.d;
    const tv_value *used = tv_dict_get_str(st, "used", 4);
    if (!used || !tv_truthy(*used)) {
        tv_dict_set(st, tv_str_cstr("used"), tv_bool(true));
        *out = tv_str_new("", 0);
    } else {
        *out = tv_ref(*tv_dict_get_str(st, "sep", 3));
    }
    return true;
}

static bool g_joiner(tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out) {
    (void)self;
    static const char *const names[] = {"sep", NULL};
    tv_value arg[1];
    bool has[1];
    if (!tpl_bind(c, "Joiner.__init__", 1, 0, a, names, arg, has)) return false;
    tv_value st = tv_dict_new();
    tv_dict_set(st.as.d, tv_str_cstr("sep"), has[0] ? tv_ref(arg[0]) : tv_str_cstr(", "));
    *out = tv_func_builtin("joiner", joiner_call, st);
    out->as.fn->pytype = "Joiner";
    tv_unref(st);
    return true;
}

/* Globals of jinja2's sandbox plus HF's two; their Python type names and
 * reprs show when a template prints or concatenates them by mistake. */
static const struct {
    const char *name;
    tpl_builtin_fn fn;
    const char *pytype, *pyrepr;
} GLOBALS[] = {
    {"range", g_range, "function", NULL},
    {"dict", g_dict, "type", "<class 'dict'>"},
    {"namespace", g_namespace, "type", "<class 'jinja2.utils.Namespace'>"},
    {"joiner", g_joiner, "type", "<class 'jinja2.utils.Joiner'>"},
    {"raise_exception", g_raise_exception, "function", NULL},
    {"strftime_now", g_strftime_now, "function", NULL},
};

bool tpl_call_method0(tpl_ctx *c, tv_value obj, const char *name, tv_value *out) {
    tv_value nm = tv_str_cstr(name), fn;
    bool found = false, ok = tpl_method_lookup(c, obj, nm.as.s, &fn, &found);
    tv_unref(nm);
    if (ok && !found) ok = tpl_fail(c, "AttributeError", "'%s' object has no attribute '%s'", tv_type_name(obj), name);
    if (!ok) return false;
    tpl_args none = {0};
    ok = tpl_call_value(c, fn, &none, out);
    tv_unref(fn);
    return ok;
}

bool tpl_global_lookup(const char *name, size_t n, tv_value *out) {
    for (size_t i = 0; i < sizeof GLOBALS / sizeof GLOBALS[0]; i++)
        if (strlen(GLOBALS[i].name) == n && memcmp(GLOBALS[i].name, name, n) == 0) {
            *out = tv_func_builtin(GLOBALS[i].name, GLOBALS[i].fn, tv_undef_anon());
            out->as.fn->pytype = GLOBALS[i].pytype;
            out->as.fn->pyrepr = GLOBALS[i].pyrepr;
            return true;
        }
    return false;
}

/* ---------------------------------------------------------------- sorting */
/* Stable merge sort of vals by keys with Python's `<`; reverse keeps the
 * original order of equal keys, like sorted(reverse=True). */
static bool sort_less(tpl_ctx *c, tv_value x, tv_value y, bool reverse, bool *lt) {
    return tpl_compare(c, OP_LT, reverse ? y : x, reverse ? x : y, lt);
}

static bool merge_sort(tpl_ctx *c, tv_value *k, tv_value *v, tv_value *tk, tv_value *tv, size_t n, bool reverse) {
    if (n < 2) return true;
    size_t h = n / 2;
    if (!merge_sort(c, k, v, tk, tv, h, reverse) || !merge_sort(c, k + h, v + h, tk, tv, n - h, reverse)) return false;
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        bool lt;
        if (!sort_less(c, k[j], k[i], reverse, &lt)) return false;
        if (lt) {
            tk[o] = k[j];
            tv[o++] = v[j++];
        } else {
            tk[o] = k[i];
            tv[o++] = v[i++];
        }
    }
    while (i < h) {
        tk[o] = k[i];
        tv[o++] = v[i++];
    }
    while (j < n) {
        tk[o] = k[j];
        tv[o++] = v[j++];
    }
    memcpy(k, tk, n * sizeof *k);
    memcpy(v, tv, n * sizeof *v);
    return true;
}

bool tpl_sort_values(tpl_ctx *c, tv_value *keys, tv_value *vals, size_t n, bool reverse) {
    tv_value *tk = mu_xmalloc((n + 1) * sizeof *tk), *tv = mu_xmalloc((n + 1) * sizeof *tv);
    bool ok = merge_sort(c, keys, vals, tk, tv, n, reverse);
    free(tk);
    free(tv);
    return ok;
}
