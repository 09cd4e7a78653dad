/* Chat templates rendered by the C engine vs jinja2 configured like Hugging
 * Face (tests/template_oracle.py, run once for all cases):
 *   1. every tests/data/chat-templates/NAME.jinja x every conversation in
 *      tests/data/template/conversations/NAME.json x add_generation_prompt,
 *   2. tests/data/template/snippets.json (focused language features),
 *   3. random expressions over random values (seeded RNG).
 * Outputs must be byte-identical; where jinja2 raises, the C engine must
 * fail with the same exception type and message.
 * Env: MUSER_SOURCE_DIR (repo root), TEMPLATE_ORACLE_VERBOSE=1 for diffs. */
#include <jansson.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "template/template.h"
#include "testutil.h"

#define DATE "2024-07-26"
#define BOS "<|bos|>"
#define EOS "<|eos|>"

static const char *src_dir(void) {
    const char *d = getenv("MUSER_SOURCE_DIR");
    return d && *d ? d : ".";
}


static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted file names in dir ending with ext. */
static size_t list_dir(const char *dir, const char *ext, char ***out) {
    DIR *d = opendir(dir);
    size_t n = 0, cap = 0;
    char **v = NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name), el = strlen(ext);
            if (l <= el || strcmp(e->d_name + l - el, ext)) continue;
            if (n == cap) v = realloc(v, (cap = cap ? cap * 2 : 64) * sizeof *v);
            v[n++] = strdup(e->d_name);
        }
        closedir(d);
    }
    qsort(v, n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

enum { G_CHAT, G_SNIPPET, G_EXPR, G_LAYOUT, G_MUTATION, G_COUNT };
static const char *const GROUP_NAMES[G_COUNT] = {"chat templates", "snippets", "random expressions", "random layouts",
                                                 "mutated templates"};

typedef struct rcase {
    char label[160];
    const char *tname; /* key into the templates object */
    json_t *job;       /* the case object sent to the oracle */
    int group;
} rcase;

typedef struct suite {
    json_t *templates; /* name -> source */
    rcase *cases;
    size_t n, cap;
} suite;

static json_t *add_case(suite *s, const char *tname, const char *label) {
    if (s->n == s->cap) s->cases = realloc(s->cases, (s->cap = s->cap ? s->cap * 2 : 256) * sizeof *s->cases);
    rcase *c = &s->cases[s->n++];
    snprintf(c->label, sizeof c->label, "%s", label);
    c->tname = tname;
    c->job = json_object();
    json_object_set_new(c->job, "template", json_string(tname));
    json_object_set_new(c->job, "date", json_string(DATE));
    json_object_set_new(c->job, "bos_token", json_string(BOS));
    json_object_set_new(c->job, "eos_token", json_string(EOS));
    return c->job;
}

static char *dump_or_null(json_t *j) {
    return j && !json_is_null(j) ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
}

/* Render one case with the C engine: 0 = output, 1 = error. */
static int render_c(const char *src, size_t len, json_t *job, char **out, size_t *out_len, mu_template_failure *fail) {
    mu_error err = {{0}};
    mu_template *t = mu_template_parse(src, len, "tpl", &err);
    if (!t) {
        snprintf(fail->exc_type, sizeof fail->exc_type, "TemplateSyntaxError");
        /* compare the bare message: drop our "tpl:line:col: " prefix */
        const char *m = err.msg;
        int line, col, used = 0;
        if (sscanf(m, "tpl:%d:%d: %n", &line, &col, &used) == 2 && used > 0) m += used;
        snprintf(fail->message, sizeof fail->message, "%s", m);
        return 1;
    }
    char *msgs = dump_or_null(json_object_get(job, "messages"));
    char *tools = dump_or_null(json_object_get(job, "tools"));
    char *extra = dump_or_null(json_object_get(job, "extra"));
    mu_template_inputs in = {
        .messages_json = msgs,
        .tools_json = tools,
        .extra_json = extra,
        .add_generation_prompt = json_is_true(json_object_get(job, "add_generation_prompt")),
        .bos_token = BOS,
        .eos_token = EOS,
        .date = DATE,
    };
    *out = mu_template_render_ex(t, &in, out_len, fail, &err);
    free(msgs);
    free(tools);
    free(extra);
    mu_template_free(t);
    return *out ? 0 : 1;
}

static void show_diff(const char *label, const char *want, size_t wn, const char *got, size_t gn) {
    size_t i = 0;
    while (i < wn && i < gn && want[i] == got[i]) i++;
    size_t from = i > 80 ? i - 80 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu\n    oracle: ...%.*s\n    engine: ...%.*s\n", label, i,
            (int)((wn - from) < 200 ? wn - from : 200), want + from, (int)((gn - from) < 200 ? gn - from : 200),
            got + from);
}

/* ---------------------------------------------------------- case builders */
static void add_chat_matrix(suite *s, const char *root) {
    char dir[1024], path[1200];
    char **tnames, **cnames;
    snprintf(dir, sizeof dir, "%s/tests/data/chat-templates", root);
    size_t nt = list_dir(dir, ".jinja", &tnames);
    char cdir[1024];
    snprintf(cdir, sizeof cdir, "%s/tests/data/template/conversations", root);
    size_t nc = list_dir(cdir, ".json", &cnames);
    CHECK_MSG(nt >= 38, "found %zu chat templates in %s", nt, dir);
    CHECK_MSG(nc >= 8, "found %zu conversations in %s", nc, cdir);
    json_t **convs = calloc(nc + 1, sizeof *convs);
    for (size_t k = 0; k < nc; k++) {
        snprintf(path, sizeof path, "%s/%s", cdir, cnames[k]);
        json_error_t e;
        convs[k] = json_load_file(path, 0, &e);
        CHECK_MSG(convs[k] != NULL, "%s: %s", path, e.text);
    }
    for (size_t i = 0; i < nt; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, tnames[i]);
        size_t len;
        char *srcbuf = tu_read_file(path, &len);
        CHECK_MSG(srcbuf != NULL, "cannot read %s", path);
        if (!srcbuf) continue;
        json_object_set_new(s->templates, tnames[i], json_stringn(srcbuf, len));
        free(srcbuf);
        const char *tkey = json_object_iter_key(json_object_iter_at(s->templates, tnames[i]));
        for (size_t k = 0; k < nc; k++) {
            if (!convs[k]) continue;
            for (int agp = 0; agp < 2; agp++) {
                char label[160];
                snprintf(label, sizeof label, "%s | %s | agp=%d", tnames[i], cnames[k], agp);
                json_t *job = add_case(s, tkey, label);
                json_object_set(job, "messages", json_object_get(convs[k], "messages"));
                json_t *tools = json_object_get(convs[k], "tools");
                json_object_set(job, "tools", tools ? tools : json_null());
                json_object_set_new(job, "add_generation_prompt", json_boolean(agp));
                json_t *extra = json_object_get(convs[k], "extra");
                if (extra) json_object_set(job, "extra", extra);
            }
        }
    }
    for (size_t k = 0; k < nc; k++) {
        json_decref(convs[k]);
        free(cnames[k]);
    }
    for (size_t i = 0; i < nt; i++) free(tnames[i]);
    free(convs);
    free(cnames);
    free(tnames);
}

/* snippets.json: [{"name", "template", "vars": {...}}] rendered without messages. */
static void add_snippets(suite *s, const char *root) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/data/template/snippets.json", root);
    json_error_t e;
    json_t *all = json_load_file(path, 0, &e);
    CHECK_MSG(all && json_is_array(all), "%s: %s", path, all ? "not an array" : e.text);
    if (!all) return;
    size_t i;
    json_t *sn;
    json_array_foreach(all, i, sn) {
        char key[64];
        snprintf(key, sizeof key, "snippet-%zu", i);
        json_object_set(s->templates, key, json_object_get(sn, "template"));
        const char *tkey = json_object_iter_key(json_object_iter_at(s->templates, key));
        char label[160];
        snprintf(label, sizeof label, "snippet %zu (%s)", i, json_string_value(json_object_get(sn, "name")));
        json_t *job = add_case(s, tkey, label);
        json_t *vars = json_object_get(sn, "vars");
        if (vars) json_object_set(job, "extra", vars);
        json_object_set_new(job, "add_generation_prompt", json_false());
    }
    json_decref(all);
}

/* ------------------------------------------------- random expressions */
static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static unsigned rnd(unsigned n) { return (unsigned)(tu_rng_next(&rng_state) % n); }

static void rand_atom(char *b, size_t cap) {
    static const char *const strs[] = {"'abc'", "'Hello World'", "' pad '", "'a,b,,c'", "'ÉtÉ ünï'",
                                       "''",    "'x'",           "\"it's\""};
    switch (rnd(8)) {
    case 0: snprintf(b, cap, "%d", (int)rnd(2000) - 1000); break;
    case 1: snprintf(b, cap, "%d.%d", (int)rnd(200) - 100, (int)rnd(1000)); break;
    case 2: snprintf(b, cap, "%s", strs[rnd(8)]); break;
    case 3: snprintf(b, cap, "%s", rnd(2) ? "true" : "false"); break;
    case 4: snprintf(b, cap, "none"); break;
    case 5: snprintf(b, cap, "[%d, %d, %d]", (int)rnd(9) + 1, (int)rnd(9) + 1, (int)rnd(9) + 1); break;
    case 6: snprintf(b, cap, "{'k%d': %d, 'a': 'v'}", (int)rnd(5), (int)rnd(100)); break;
    default: snprintf(b, cap, "%s", rnd(2) ? "n" : "s"); break; /* variables from vars */
    }
}

static void rand_expr(char *b, size_t cap, int depth) {
    static const char *const binops[] = {"+",  "-",  "*", "/",  "//",  "%",  "**", "~",
                                         "==", "!=", "<", ">=", "and", "or", "in", "not in"};
    static const char *const filters[] = {"length",      "string",
                                          "upper",       "trim",
                                          "int",         "float",
                                          "abs",         "first",
                                          "last",        "list",
                                          "tojson",      "reverse|list",
                                          "round",       "default('d')",
                                          "title",       "capitalize",
                                          "sort|list",   "join(',')",
                                          "wordcount",   "sum",
                                          "max",         "min",
                                          "unique|list", "items|list",
                                          "dictsort",    "replace('a','_')",
                                          "center(9)",   "indent(2)"};
    static const char *const tests[] = {"defined",  "none",     "string", "number", "integer", "float", "mapping",
                                        "sequence", "iterable", "odd",    "even",   "boolean", "true",  "false"};
    char x[512], y[512];
    if (depth <= 0) {
        rand_atom(b, cap);
        return;
    }
    switch (rnd(7)) {
    case 0:
    case 1:
        rand_expr(x, sizeof x, depth - 1);
        rand_expr(y, sizeof y, depth - 1);
        {
            const char *op = binops[rnd(16)];
            /* small integer exponents: Python's complex results are out of scope */
            if (!strcmp(op, "**")) snprintf(y, sizeof y, "%d", (int)rnd(5) - 1);
            snprintf(b, cap, "(%s %s %s)", x, op, y);
        }
        break;
    case 2:
        rand_expr(x, sizeof x, depth - 1);
        snprintf(b, cap, "(%s|%s)", x, filters[rnd(sizeof filters / sizeof *filters)]);
        break;
    case 3:
        rand_expr(x, sizeof x, depth - 1);
        snprintf(b, cap, "(%s is %s%s)", x, rnd(3) ? "" : "not ", tests[rnd(sizeof tests / sizeof *tests)]);
        break;
    case 4:
        rand_expr(x, sizeof x, depth - 1);
        rand_expr(y, sizeof y, depth - 1);
        snprintf(b, cap, "(%s if %s else 'no')", x, y);
        break;
    case 5:
        rand_expr(x, sizeof x, depth - 1);
        snprintf(b, cap, "%s[%d:%d]", x, (int)rnd(5) - 2, (int)rnd(5) - 1);
        break;
    default:
        rand_expr(x, sizeof x, depth - 1);
        snprintf(b, cap, "(not %s)", x);
        break;
    }
}

static void add_random(suite *s, int count) {
    for (int i = 0; i < count; i++) {
        char e[2048], key[64], tpl[2200], label[160];
        rand_expr(e, sizeof e, 1 + (int)rnd(3));
        snprintf(tpl, sizeof tpl, "{{ %s }}", e);
        snprintf(key, sizeof key, "random-%d", i);
        json_object_set_new(s->templates, key, json_string(tpl));
        const char *tkey = json_object_iter_key(json_object_iter_at(s->templates, key));
        snprintf(label, sizeof label, "random %d", i);
        json_t *job = add_case(s, tkey, label);
        json_t *vars = json_object();
        json_object_set_new(vars, "n", json_integer((json_int_t)rnd(100) - 50));
        json_object_set_new(vars, "s", json_string(rnd(2) ? "MiXed Case" : "  spaced\ttext\n"));
        json_object_set_new(job, "extra", vars);
        json_object_set_new(job, "add_generation_prompt", json_false());
    }
}

/* ------------------------------------------- random whitespace layouts */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s) {
    size_t m = strlen(s);
    if (b->n + m + 1 > b->cap) b->p = realloc(b->p, b->cap = (b->n + m + 1) * 2);
    memcpy(b->p + b->n, s, m + 1);
    b->n += m;
}

static void rand_text(sbuf *b) {
    static const char *const pieces[] = {"a",    "b c",   " ",      "  ",     "\t", "\n", "\n\n", "  \n",
                                         "\n  ", "x\n  ", "\u00a0", "\u3000", "#",  "%",  "}",    "é"};
    int n = 1 + (int)rnd(3);
    for (int i = 0; i < n; i++) sb_put(b, pieces[rnd(sizeof pieces / sizeof *pieces)]);
}

static const char *rand_open_sign(void) {
    static const char *const s[] = {"", "", "-", "+"};
    return s[rnd(4)];
}
static const char *rand_close_sign(bool block) {
    static const char *const s[] = {"", "", "-", "+"};
    return s[rnd(block ? 4 : 3)];
}
static const char *rand_ws(void) {
    static const char *const s[] = {" ", " ", "", "\n", "  "};
    return s[rnd(5)];
}

static void rand_tag(sbuf *b, const char *body) {
    char t[256];
    snprintf(t, sizeof t, "{%%%s%s%s%s%s%%}", rand_open_sign(), rand_ws(), body, rand_ws(), rand_close_sign(true));
    sb_put(b, t);
}

static void rand_layout(sbuf *b, int depth) {
    int n = 1 + (int)rnd(4);
    for (int i = 0; i < n; i++) {
        char t[256];
        switch (rnd(depth > 0 ? 8 : 5)) {
        case 0:
        case 1: rand_text(b); break;
        case 2: {
            static const char *const e[] = {"'v'", "x", "1", "''", "loop_var|default('d')"};
            snprintf(t, sizeof t, "{{%s%s%s%s%s}}", rand_open_sign(), rand_ws(), e[rnd(5)], rand_ws(),
                     rand_close_sign(false));
            sb_put(b, t);
            break;
        }
        case 3:
            snprintf(t, sizeof t, "{#%s c%s%s#}", rand_open_sign(), rand_ws(), rand_close_sign(true));
            sb_put(b, t);
            break;
        case 4: rand_tag(b, "set q = 1"); break;
        case 5:
            rand_tag(b, rnd(2) ? "if x" : "if not x");
            rand_layout(b, depth - 1);
            if (rnd(2)) {
                rand_tag(b, "else");
                rand_layout(b, depth - 1);
            }
            rand_tag(b, "endif");
            break;
        case 6:
            rand_tag(b, "for loop_var in [1, 2]");
            rand_layout(b, depth - 1);
            rand_tag(b, "endfor");
            break;
        default:
            rand_tag(b, "raw");
            rand_text(b);
            sb_put(b, rnd(2) ? "{{ raw }}" : "");
            rand_tag(b, "endraw");
            break;
        }
    }
}

static void add_random_layouts(suite *s, int count) {
    for (int i = 0; i < count; i++) {
        sbuf b = {0};
        rand_layout(&b, 2);
        char key[64], label[160];
        snprintf(key, sizeof key, "layout-%d", i);
        json_object_set_new(s->templates, key, json_stringn(b.p, b.n));
        const char *tkey = json_object_iter_key(json_object_iter_at(s->templates, key));
        snprintf(label, sizeof label, "layout %d", i);
        json_t *job = add_case(s, tkey, label);
        json_t *vars = json_object();
        json_object_set_new(vars, "x", json_boolean(rnd(2)));
        json_object_set_new(job, "extra", vars);
        json_object_set_new(job, "add_generation_prompt", json_false());
        free(b.p);
    }
}

/* ------------------------------------------- mutated real templates */
/* Small random edits of the real templates, rendered with a tool-call
 * conversation. Where both sides reject the source at parse time only the
 * fact is compared (jinja2 and this parser word some syntax errors
 * differently); everything else must agree exactly. */
static void add_mutations(suite *s, const char *root, int count) {
    static const char *const names[] = {"Qwen-Qwen3-0.6B.jinja",
                                        "google-gemma-4-31B-it.jinja",
                                        "openai-gpt-oss-120b.jinja",
                                        "meta-llama-Llama-3.1-8B-Instruct.jinja",
                                        "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                                        "ibm-granite-granite-4.0.jinja",
                                        "deepseek-ai-DeepSeek-V3.2.jinja"};
    static const char *const inserts[] = {"{%", "%}",   "{{",    "}}",    "{#",  "-",       "(",      ")",    "[",
                                          "]",  "'",    "\"",    "|",     ".",   "endif",   "endfor", "loop", "\n",
                                          " ",  "not ", " or 1", "|trim", "[0]", "|length", "~"};
    char path[1200], cpath[1200];
    snprintf(cpath, sizeof cpath, "%s/tests/data/template/conversations/tool_call_obj.json", root);
    json_error_t e;
    json_t *conv = json_load_file(cpath, 0, &e);
    CHECK_MSG(conv != NULL, "%s: %s", cpath, e.text);
    if (!conv) return;
    for (int i = 0; i < count; i++) {
        const char *name = names[rnd(sizeof names / sizeof names[0])];
        snprintf(path, sizeof path, "%s/tests/data/chat-templates/%s", root, name);
        size_t n;
        char *src = tu_read_file(path, &n);
        if (!src) continue;
        src = realloc(src, n + 64);
        int edits = 1 + (int)rnd(2);
        for (int k = 0; k < edits && n > 0; k++) {
            size_t at = rnd((unsigned)n);
            if (rnd(2)) {
                size_t span = 1 + rnd(6);
                if (at + span > n) span = n - at;
                memmove(src + at, src + at + span, n - at - span);
                n -= span;
            } else {
                const char *ins = inserts[rnd(sizeof inserts / sizeof inserts[0])];
                size_t il = strlen(ins);
                if (n + il >= n + 60) continue;
                memmove(src + at + il, src + at, n - at);
                memcpy(src + at, ins, il);
                n += il;
            }
        }
        /* keep valid UTF-8 so that both sides read the same text */
        json_t *str = json_stringn(src, n);
        free(src);
        if (!str) continue;
        char key[64], label[160];
        snprintf(key, sizeof key, "mutation-%d", i);
        json_object_set_new(s->templates, key, str);
        const char *tkey = json_object_iter_key(json_object_iter_at(s->templates, key));
        snprintf(label, sizeof label, "mutation %d of %s", i, name);
        json_t *job = add_case(s, tkey, label);
        json_object_set(job, "messages", json_object_get(conv, "messages"));
        json_object_set(job, "tools", json_object_get(conv, "tools"));
        json_object_set_new(job, "add_generation_prompt", json_boolean(rnd(2)));
    }
    json_decref(conv);
}

/* ---------------------------------------------------------- comparison */
typedef struct stats {
    size_t same_out, same_err, mismatched, skipped;
} stats;

/* Python has big integers and complex numbers, this engine does not
 * (documented); random expressions can reach them, real templates do not. */
static bool out_of_scope(const rcase *rc, int c_err, const mu_template_failure *fail, json_t *r) {
    const char *o_err = json_string_value(json_object_get(r, "error"));
    const char *o_out = json_string_value(json_object_get(r, "output"));
    if (rc->group != G_EXPR && rc->group != G_MUTATION) return false;
    return (c_err && (!strcmp(fail->message, "integer result too large") ||
                      !strcmp(fail->message, "complex results are not supported"))) ||
           (o_err && strstr(o_err, "complex")) || (o_out && strstr(o_out, "j)"));
}

/* Renders one case with the engine and compares with the oracle's result. */
static bool compare_case(suite *s, rcase *rc, json_t *r, bool verbose, stats *st) {
    json_t *src_j = json_object_get(s->templates, rc->tname);
    char *got = NULL;
    size_t got_len = 0;
    mu_template_failure fail;
    memset(&fail, 0, sizeof fail);
    int c_err = render_c(json_string_value(src_j), json_string_length(src_j), rc->job, &got, &got_len, &fail);
    bool o_ok = json_is_true(json_object_get(r, "ok")), match = false;
    if (out_of_scope(rc, c_err, &fail, r)) {
        st->skipped++;
        free(got);
        return true;
    }
    if (o_ok && !c_err) {
        json_t *want = json_object_get(r, "output");
        match = json_string_length(want) == got_len && memcmp(json_string_value(want), got, got_len) == 0;
        if (!match && verbose) show_diff(rc->label, json_string_value(want), json_string_length(want), got, got_len);
        st->same_out += match;
    } else if (!o_ok && c_err) {
        const char *wt = json_string_value(json_object_get(r, "error_type"));
        const char *wm = json_string_value(json_object_get(r, "error"));
        bool o_syntax = !strcmp(wt, "TemplateSyntaxError") || !strcmp(wt, "TemplateAssertionError") ||
                        !strcmp(wt, "SyntaxError"); /* from compiling jinja2's generated Python */
        if (rc->group == G_MUTATION && o_syntax && !strcmp(fail.exc_type, "TemplateSyntaxError"))
            match = true; /* both reject the mutated source; wording may differ */
        else if (!strcmp(wt, "RecursionError") && !strcmp(fail.exc_type, wt))
            match = true; /* Python words it by where the limit hit */
        else if (rc->group == G_MUTATION && strstr(wm, "root.<locals>.t_") && strstr(fail.message, "No filter named"))
            match = true; /* jinja2's stub for an unknown filter rejects keyword arguments with its own error */
        else
            match = !strcmp(wt, fail.exc_type) && !strcmp(wm, fail.message);
        if (!match && verbose)
            fprintf(stderr, "  %s: oracle %s: %s\n          engine %s: %s\n", rc->label, wt, wm, fail.exc_type,
                    fail.message);
        st->same_err += match;
    } else if (verbose) {
        if (o_ok)
            fprintf(stderr, "  %s: engine failed (%s: %s), oracle rendered\n", rc->label, fail.exc_type, fail.message);
        else
            fprintf(stderr, "  %s: oracle raised %s: %s, engine rendered %zu bytes\n", rc->label,
                    json_string_value(json_object_get(r, "error_type")), json_string_value(json_object_get(r, "error")),
                    got_len);
    }
    if (!match) {
        st->mismatched++;
        if (!verbose && st->mismatched <= 20) fprintf(stderr, "  mismatch: %s\n", rc->label);
    }
    free(got);
    return match;
}

/* Writes all cases to one jobs file and runs the oracle once. */
static json_t *run_oracle(suite *s, const char *root, char *dir, size_t dir_cap) {
    char tmpl[] = "/tmp/muser-tpl-XXXXXX";
    const char *tmpdir = mkdtemp(tmpl);
    CHECK(tmpdir != NULL);
    if (!tmpdir) return NULL;
    snprintf(dir, dir_cap, "%s", tmpdir);
    char jobs_path[256], out_path[256], cmd[2048];
    snprintf(jobs_path, sizeof jobs_path, "%s/jobs.json", tmpdir);
    snprintf(out_path, sizeof out_path, "%s/out.json", tmpdir);
    json_t *jobs = json_object(), *cases = json_array();
    json_object_set(jobs, "templates", s->templates);
    for (size_t i = 0; i < s->n; i++) json_array_append(cases, s->cases[i].job);
    json_object_set_new(jobs, "cases", cases);
    CHECK(json_dump_file(jobs, jobs_path, JSON_COMPACT) == 0);
    json_decref(jobs);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/template_oracle.py' '%s' '%s'", root, jobs_path, out_path);
    int rc = system(cmd);
    CHECK_MSG(rc == 0, "oracle failed (%d): %s", rc, cmd);
    json_error_t e;
    json_t *res = rc == 0 ? json_load_file(out_path, 0, &e) : NULL;
    CHECK_MSG(res != NULL, "cannot read the oracle's results %s", out_path);
    if (getenv("TEMPLATE_ORACLE_KEEP"))
        fprintf(stderr, "jobs kept in %s\n", jobs_path);
    else
        unlink(jobs_path);
    unlink(out_path);
    rmdir(tmpdir);
    return res;
}

/* ------------------------------------------------------------------ main */
int main(void) {
    const char *root = src_dir();
    const char *nr = getenv("TEMPLATE_ORACLE_RANDOM"), *seed = getenv("TEMPLATE_ORACLE_SEED");
    int nrandom = nr ? atoi(nr) : 400;
    if (seed) rng_state ^= strtoull(seed, NULL, 0) * 0x2545F4914F6CDD1DULL;
    suite s = {.templates = json_object()};
    size_t start[G_COUNT + 1];
    start[G_CHAT] = s.n;
    add_chat_matrix(&s, root);
    start[G_SNIPPET] = s.n;
    add_snippets(&s, root);
    start[G_EXPR] = s.n;
    add_random(&s, nrandom);
    start[G_LAYOUT] = s.n;
    add_random_layouts(&s, nrandom);
    start[G_MUTATION] = s.n;
    add_mutations(&s, root, nrandom * 3 / 4);
    start[G_COUNT] = s.n;
    for (int g = 0; g < G_COUNT; g++)
        for (size_t i = start[g]; i < start[g + 1]; i++) s.cases[i].group = g;

    char dir[256];
    json_t *res = run_oracle(&s, root, dir, sizeof dir);
    json_t *results = json_object_get(res, "results");
    CHECK_MSG(json_array_size(results) == s.n, "oracle returned %zu results for %zu cases", json_array_size(results),
              s.n);
    bool verbose = getenv("TEMPLATE_ORACLE_VERBOSE") != NULL;
    stats st[G_COUNT];
    memset(st, 0, sizeof st);
    size_t row_ok = 0, row_n = 0, row_err = 0;
    char row[128] = "";
    printf("%-55s %s\n", "chat template", "agree/cases (cases where jinja2 raises)");
    for (size_t i = 0; i < s.n && i < json_array_size(results); i++) {
        rcase *rc = &s.cases[i];
        json_t *r = json_array_get(results, i);
        bool match = compare_case(&s, rc, r, verbose, &st[rc->group]);
        if (rc->group != G_CHAT) continue;
        size_t tl = strcspn(rc->label, " |");
        if (strncmp(row, rc->label, tl) || row[tl] != '\0') {
            if (row_n) printf("%-55s %zu/%zu (%zu)\n", row, row_ok, row_n, row_err);
            snprintf(row, sizeof row, "%.*s", (int)tl, rc->label);
            row_ok = row_n = row_err = 0;
        }
        row_n++;
        row_ok += match;
        row_err += !json_is_true(json_object_get(r, "ok"));
        if (i + 1 == start[G_SNIPPET]) printf("%-55s %zu/%zu (%zu)\n", row, row_ok, row_n, row_err);
    }
    size_t mismatched = 0;
    for (int g = 0; g < G_COUNT; g++) {
        printf("%-20s %5zu cases: identical output %5zu, same error %5zu, mismatched %zu, out of scope %zu\n",
               GROUP_NAMES[g], start[g + 1] - start[g], st[g].same_out, st[g].same_err, st[g].mismatched,
               st[g].skipped);
        mismatched += st[g].mismatched;
    }
    CHECK_MSG(mismatched == 0, "%zu cases differ from jinja2", mismatched);
    json_decref(res);
    for (size_t i = 0; i < s.n; i++) json_decref(s.cases[i].job);
    free(s.cases);
    json_decref(s.templates);
    TEST_MAIN_END();
}
