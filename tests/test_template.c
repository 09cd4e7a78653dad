/* Unit tests of the chat-template engine that need no Python: expression
 * semantics, whitespace control, error positions, resource limits, API
 * edge cases, float formatting on random values and crash-freedom on
 * mutated real templates. (Byte-exact agreement with jinja2 is checked by
 * test_template_oracle.) */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "template/template.h"
#include "testutil.h"

/* Render src with extra variables; returns malloc'd output or NULL (err/fail set). */
static char *render(const char *src, const char *extra, mu_template_failure *fail, mu_error *err) {
    mu_template *t = mu_template_parse(src, strlen(src), "t", err);
    if (!t) return NULL;
    mu_template_inputs in = {.extra_json = extra, .date = "2024-02-29", .bos_token = "<s>", .eos_token = "</s>"};
    char *out = mu_template_render_ex(t, &in, NULL, fail, err);
    mu_template_free(t);
    return out;
}

static void expect_out(const char *src, const char *extra, const char *want, int line) {
    mu_error err = {{0}};
    mu_template_failure fail;
    char *got = render(src, extra, &fail, &err);
    if (!got) {
        fprintf(stderr, "line %d: %s\n  failed: %s\n", line, src, err.msg);
        tu_failures++;
        return;
    }
    if (strcmp(got, want)) {
        fprintf(stderr, "line %d: %s\n  want: [%s]\n  got:  [%s]\n", line, src, want, got);
        tu_failures++;
    }
    free(got);
}
#define EXPECT(src, want) expect_out(src, NULL, want, __LINE__)
#define EXPECT_VARS(src, vars, want) expect_out(src, vars, want, __LINE__)

/* The render fails with exactly this err->msg. */
static void expect_err(const char *src, const char *want_msg, const char *want_type, int line) {
    mu_error err = {{0}};
    mu_template_failure fail;
    memset(&fail, 0, sizeof fail);
    char *got = render(src, NULL, &fail, &err);
    if (got) {
        fprintf(stderr, "line %d: %s\n  expected failure, rendered [%s]\n", line, src, got);
        tu_failures++;
        free(got);
        return;
    }
    if (strcmp(err.msg, want_msg) || (want_type && strcmp(fail.exc_type, want_type))) {
        fprintf(stderr, "line %d: %s\n  want: %s (%s)\n  got:  %s (%s)\n", line, src, want_msg,
                want_type ? want_type : "-", err.msg, fail.exc_type);
        tu_failures++;
    }
}
#define EXPECT_ERR(src, msg, type) expect_err(src, msg, type, __LINE__)

static void test_expressions(void) {
    EXPECT("{{ 1 + 2 * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** 3 ** 2 }}",
           "7|3|-4|2|1024|64");
    EXPECT("{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e-5 }}|{{ 1.0 }}",
           "3.5|2.0|0.30000000000000004|1e+16|1e-05|1.0");
    EXPECT("{{ 'a' ~ 1 ~ none ~ true }}|{{ 'ab' * 2 }}|{{ [1] + [2] }}|{{ (1,) }}", "a1NoneTrue|abab|[1, 2]|(1,)");
    EXPECT("{{ 1 < 2 < 3 }}|{{ 'b' in 'abc' }}|{{ 3 not in [1] }}|{{ 1 == 1.0 }}|{{ [1] == (1,) }}",
           "True|True|True|True|False");
    EXPECT("{{ 0 or 'x' }}|{{ '' and 'y' }}|{{ not none }}|{{ 'a' if false else 'b' }}|{{ 'z' if false }}",
           "x||True|b|");
    EXPECT("{{ 'héllo'[1] }}|{{ 'héllo'|length }}|{{ 'abcdef'[::-2] }}|{{ [1, 2, 3][-1] }}|{{ 'héllo'[1:3] }}",
           "é|5|fdb|3|él");
    EXPECT("{{ {'a': 1}.a }}|{{ {'a': 1}['a'] }}|[{{ {}.x }}]|{{ [1, 'a', none, true, {'k': 2.5}] }}",
           "1|1|[]|[1, 'a', None, True, {'k': 2.5}]");
    EXPECT("{{ \"it's\" }}|{{ [\"it's\", 'q\"', 'a\\nb'] }}", "it's|[\"it's\", 'q\"', 'a\\nb']");
    EXPECT("{{ -2 ** 2 }}|{% set n = 2 %}{{ -2 ** n }}|{{ (-2) ** n }}", "4|-4|-4"); /* jinja2's folding quirk */
}

static void test_filters_and_tests(void) {
    EXPECT("{{ '  x '|trim }}|{{ 'ab'|upper }}|{{ 'hello world'|title }}|{{ 'aXb'|lower }}|{{ 'hI'|capitalize }}",
           "x|AB|Hello World|axb|Hi");
    EXPECT("{{ [3, 1, 2]|sort|join(',') }}|{{ [1, 2, 3]|select('odd')|list }}|{{ [1, 2]|map('string')|join('+') }}",
           "1,2,3|[1, 3]|1+2");
    EXPECT("{{ {'b': 1, 'a': 2}|dictsort }}|{{ x|default('d') }}|{{ ''|default('e', true) }}",
           "[('a', 2), ('b', 1)]|d|e");
    EXPECT("{{ {'a': [1, 'é', none, 2.0]}|tojson }}|{{ [1]|tojson(indent=2) }}",
           "{\"a\": [1, \"é\", null, 2.0]}|[\n  1\n]");
    EXPECT("{{ 'x'|safe + '<b>' }}|{{ '<a>'|e }}|{{ 3|float }}|{{ '3.7'|int }}|{{ 2.5|round }}|{{ -3|abs }}",
           "x&lt;b&gt;|&lt;a&gt;|3.0|3|2.0|3");
    EXPECT("{{ 1 is odd }}|{{ x is defined }}|{{ none is none }}|{{ {} is mapping }}|{{ 'a' is string }}|{{ 3 is "
           "divisibleby 3 }}",
           "True|False|True|True|True|True");
    EXPECT(
        "{{ 'a,b'.split(',') }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ 'x-y'.replace('-', '+') }}|{{ ' a '.strip() }}",
        "['a', 'b']|True|x+y|a");
    EXPECT("{{ strftime_now('%Y-%m-%d %A %d %b') }}", "2024-02-29 Thursday 29 Feb");
}

static void test_statements(void) {
    EXPECT("{% for x in 'ab' %}{{ loop.index }}{{ x }}{{ loop.last }}{% endfor %}", "1aFalse2bTrue");
    EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", "empty");
    EXPECT("{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}", "a=1");
    EXPECT("{% for x in range(6) if x is even %}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}", "0,2,4");
    EXPECT("{% for x in range(9) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x "
           "}}{% endfor %}",
           "023");
    EXPECT("{% set x = 0 %}{% for i in [1, 2] %}{% set x = x + i %}{% endfor %}{{ x }}", "0");
    EXPECT("{% set ns = namespace(x=0) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", "3");
    EXPECT("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c %}[{{ a }}]{% endset %}{{ c }}", "12[1]");
    EXPECT("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", "1B23");
    EXPECT("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}", "<in>");
    EXPECT("{% filter upper %}ab{% endfilter %}|{% generation %}g{% endgeneration %}|{% raw %}{{ x }}{% endraw %}",
           "AB|g|{{ x }}");
}

static void test_whitespace(void) {
    EXPECT("{% if true %}\nyes\n{% endif %}\nafter", "yes\nafter"); /* trim_blocks */
    EXPECT("  {% if true %}\n  x\n  {% endif %}\n", "  x\n");       /* lstrip_blocks, trailing newline dropped */
    EXPECT("a  \n  {{- 'b' -}}  \n  c", "abc");
    EXPECT("  {%+ if true %}x{% endif %}", "  x");
    EXPECT("{% if true +%}\nx{% endif %}", "\nx");
    EXPECT("a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", "a\nb\nc");
    EXPECT("x {# comment #}\n  {#- c -#}  y", "x y");
    EXPECT("  {{ 'v' }}\n", "  v"); /* no lstrip for {{ */
}

static void test_undefined_and_errors(void) {
    EXPECT("[{{ nothing }}][{{ nothing|length }}][{{ nothing is defined }}][{% for x in nothing %}x{% endfor %}]",
           "[][0][False][]");
    EXPECT_ERR("{{ nothing.attr }}", "t:1:4: 'nothing' is undefined", "UndefinedError");
    EXPECT_ERR("line1\n{{ {}.a.b }}", "t:2:4: 'dict object' has no attribute 'a'", "UndefinedError");
    EXPECT_ERR("{{ 'a' + 1 }}", "t:1:4: can only concatenate str (not \"int\") to str", "TypeError");
    EXPECT_ERR("{{ 1 // 0 }}", "t:1:4: integer division or modulo by zero", "ZeroDivisionError");
    EXPECT_ERR("{% set l = [] %}{{ l.append(1) }}", "t:1:20: access to attribute 'append' of 'list' object is unsafe.",
               "SecurityError");
    EXPECT_ERR("\n\n  {{ raise_exception('No system role') }}", "t:3:6: No system role", "TemplateError");
    EXPECT("{% if x %}{{ 1|nosuch }}{% endif %}x", "x"); /* unknown filters inside if fail only when run */
    EXPECT_ERR("{% if true %}{{ 1|nosuch }}{% endif %}", "t:1:19: No filter named 'nosuch' found.",
               "TemplateRuntimeError");
}

static void test_parse_errors(void) {
    struct {
        const char *src, *msg;
    } cases[] = {
        {"{% for x in y %}\n  {% endif %}",
         "t:2:6: Encountered unknown tag 'endif'. Jinja was looking for the following tags: "
         "'endfor' or 'else'. The innermost block that needs to be closed is 'for'."},
        {"{% for x in y %}{% if z %}{% endfor %}",
         "t:1:30: Encountered unknown tag 'endfor'. You probably made a nesting "
         "mistake. Jinja is expecting this tag, but currently looking for 'elif' or "
         "'else' or 'endif'. The innermost block that needs to be closed is 'if'."},
        {"a\nb\n  {% endfor %}", "t:3:6: Encountered unknown tag 'endfor'."},
        {"{% if x %}\nunclosed",
         "t:2:9: Unexpected end of template. Jinja was looking for the following tags: 'elif' or "
         "'else' or 'endif'. The innermost block that needs to be closed is 'if'."},
        {"{{ 1 + }}", "t:1:8: unexpected 'end of print statement'"},
        {"line\n{{ x | nosuchfilter }}", "t:2:8: No filter named 'nosuchfilter'."},
        {"{{ (1 }}", "t:1:7: unexpected '}', expected ')'"},
        {"{{ 'abc }}", "t:1:4: unexpected char \"'\" at 3"},
        {"{# never closed", "t:1:1: Missing end of comment tag"},
        {"{% raw %}x", "t:1:1: Missing end of raw directive"},
        {"{{ x", "t:1:5: unexpected end of template, expected 'end of print statement'."},
        {"{% break %}", "t:1:4: 'break' outside loop"},
        {"{% macro m(a=1, b) %}{% endmacro %}", "t:1:17: non-default argument follows default argument"},
        {"{{ 1 is number is number }}", "t:1:16: You cannot chain multiple tests with is"},
        {"{% include 'x' %}", "t:1:4: the 'include' tag is not supported"},
        {"\xc3\xa9\xc3\xa9 {{ ! }}", "t:1:7: unexpected char '!' at 8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mu_error err = {{0}};
        mu_template *t = mu_template_parse(cases[i].src, strlen(cases[i].src), "t", &err);
        CHECK_MSG(t == NULL, "case %zu parsed: %s", i, cases[i].src);
        mu_template_free(t);
        CHECK_MSG(strcmp(err.msg, cases[i].msg) == 0, "case %zu:\n  want %s\n  got  %s", i, cases[i].msg, err.msg);
    }
}

static void test_limits(void) {
    mu_error err = {{0}};
    mu_template_failure fail;
    /* unbounded macro recursion */
    char *out = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &fail, &err);
    CHECK(out == NULL);
    CHECK_MSG(!strcmp(fail.exc_type, "RecursionError"), "%s: %s", fail.exc_type, fail.message);
    /* deep expression nesting fails at parse time without overflowing the stack */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (size_t i = 0; i < depth; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < depth; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    mu_template *t = mu_template_parse(deep, strlen(deep), "t", &err);
    CHECK(t == NULL);
    CHECK_MSG(strstr(err.msg, "nested too deeply") != NULL, "%s", err.msg);
    free(deep);
    /* deep block nesting */
    char *blocks = malloc(200 * 20 + 1);
    blocks[0] = '\0';
    for (int i = 0; i < 200; i++) strcat(blocks, "{% if true %}");
    t = mu_template_parse(blocks, strlen(blocks), "t", &err);
    CHECK(t == NULL);
    free(blocks);
    /* output size limit */
    const char *big = "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}";
    t = mu_template_parse(big, strlen(big), "t", &err);
    CHECK(t != NULL);
    mu_template_inputs in = {.max_output = 1 << 20, .date = "2024-01-01"};
    out = mu_template_render_ex(t, &in, NULL, &fail, &err);
    CHECK(out == NULL);
    CHECK_MSG(strstr(fail.message, "output size limit") != NULL, "%s", fail.message);
    mu_template_free(t);
    /* huge intermediate strings and lists */
    out = render("{{ ('a' * 1000000000)|length }}", NULL, &fail, &err);
    CHECK(out == NULL && !strcmp(fail.exc_type, "MemoryError"));
    out = render("{{ ([1] * 1000000000)|length }}", NULL, &fail, &err);
    CHECK(out == NULL && !strcmp(fail.exc_type, "MemoryError"));
    /* step limit bounds the running time */
    const char *slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    t = mu_template_parse(slow, strlen(slow), "t", &err);
    CHECK(t != NULL);
    mu_template_inputs in2 = {.max_steps = 200000, .date = "2024-01-01"};
    out = mu_template_render_ex(t, &in2, NULL, &fail, &err);
    CHECK(out == NULL);
    CHECK_MSG(strstr(fail.message, "step limit") != NULL, "%s", fail.message);
    mu_template_free(t);
    /* sandbox range limit, as jinja2 */
    out = render("{{ range(100001)|length }}", NULL, &fail, &err);
    CHECK(out == NULL && !strcmp(fail.exc_type, "OverflowError"));
    /* namespaces referencing each other are released (ASan checks leaks) */
    out = render("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{% set a.self = a %}ok", NULL,
                 &fail, &err);
    CHECK(out && !strcmp(out, "ok"));
    free(out);
}

static void test_api(void) {
    mu_error err = {{0}};
    const char *src =
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}{{ tools is none }}{{ documents is none }}{{ extra }}";
    mu_template *t = mu_template_parse(src, strlen(src), NULL, &err);
    CHECK(t != NULL);
    mu_template_inputs in = {.messages_json = "[{\"role\":\"user\",\"content\":\"hi \\u00e9\"}]",
                             .add_generation_prompt = true,
                             .bos_token = "<s>",
                             .extra_json = "{\"extra\": [1, 2.5, null]}",
                             .date = "2024-01-01"};
    size_t n = 0;
    char *out = mu_template_render_ex(t, &in, &n, NULL, &err);
    const char *want = "<s><user>hi é<assistant>TrueTrue[1, 2.5, None]";
    CHECK_MSG(out && !strcmp(out, want), "got %s", out ? out : err.msg);
    CHECK_EQ_INT(n, strlen(want));
    char *again = mu_template_render(t, &in, &err); /* templates are reusable */
    CHECK(again && out && !strcmp(again, out));
    free(again);
    free(out);
    in.messages_json = "[{\"role\": ";
    out = mu_template_render(t, &in, &err);
    CHECK(out == NULL && strstr(err.msg, "messages: invalid JSON") != NULL);
    in.messages_json = "[]";
    in.extra_json = "[1]";
    out = mu_template_render(t, &in, &err);
    CHECK(out == NULL && strstr(err.msg, "extra: expected a JSON object") != NULL);
    in.extra_json = NULL;
    in.date = "2024-13-01";
    out = mu_template_render(t, &in, &err);
    CHECK(out == NULL && strstr(err.msg, "YYYY-MM-DD") != NULL);
    mu_template_free(t);
    CHECK(mu_template_parse(NULL, 0, "x", &err) == NULL);
    t = mu_template_parse("ok \xc3\x28 bad", 11, "u", &err);
    CHECK(t == NULL && strcmp(err.msg, "u: invalid UTF-8 at byte offset 3") == 0);
    t = mu_template_parse("\xed\xa0\x80", 3, "u", &err); /* a surrogate */
    CHECK(t == NULL && strstr(err.msg, "offset 0") != NULL);
    CHECK(mu_template_render(NULL, &in, &err) == NULL);
    mu_template_free(NULL);
    /* NUL bytes pass through */
    t = mu_template_parse("a\0b{{ 'c' }}", 12, "t", &err);
    CHECK(t != NULL);
    mu_template_inputs none_in = {.date = "2024-01-01"};
    out = mu_template_render_ex(t, &none_in, &n, NULL, &err);
    CHECK(out && n == 4 && !memcmp(out, "a\0bc", 4));
    free(out);
    mu_template_free(t);
}

/* repr(float) on random doubles: round-trips, has a '.' or exponent.
 * (Digit-exactness against Python is covered by test_template_oracle.) */
static void test_float_repr(void) {
    uint64_t rng = 0x1234567887654321ULL;
    for (int i = 0; i < 2000; i++) {
        uint64_t bits = tu_rng_next(&rng);
        double d;
        memcpy(&d, &bits, 8);
        if (!isfinite(d) || d == 0.0) continue;
        if (i % 2) d = (double)(int64_t)(bits >> 20) / (double)(1 + (bits & 0xFFF)); /* everyday magnitudes */
        char extra[128], ref[64];
        char num[40];
        snprintf(num, sizeof num, "%.17g", d);
        if (!strpbrk(num, ".e")) strcat(num, ".0"); /* keep it a JSON real */
        snprintf(extra, sizeof extra, "{\"x\": %s}", num);
        mu_error err = {{0}};
        mu_template_failure fail;
        char *out = render("{{ x }}", extra, &fail, &err);
        CHECK(out != NULL);
        if (!out) continue;
        CHECK_MSG(strtod(out, NULL) == d, "%s does not round-trip %.17g", out, d);
        int digits = 0;
        for (const char *q = out; *q && *q != 'e'; q++) digits += *q >= '0' && *q <= '9';
        (void)ref;
        CHECK_MSG(digits <= 17 + 16, "%s has too many digits", out); /* fixed notation pads with zeros up to 1e16 */
        CHECK_MSG(strchr(out, '.') || strchr(out, 'e'), "%s lacks '.' or exponent", out);
        free(out);
    }
}

/* Mutated real templates must parse-or-fail and render-or-fail cleanly. */
static void test_mutation_fuzz(void) {
    const char *root = getenv("MUSER_SOURCE_DIR");
    char path[1024];
    const char *names[] = {"Qwen-Qwen3-0.6B.jinja", "google-gemma-4-31B-it.jinja", "openai-gpt-oss-120b.jinja",
                           "meta-llama-Llama-3.1-8B-Instruct.jinja"};
    const char *msgs =
        "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
        "{\"role\":\"assistant\",\"content\":\"a\",\"tool_calls\":[{\"id\":\"abcdefghi\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},{\"role\":\"tool\",\"content\":\"r\"}]";
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}]";
    static const char *const inserts[] = {"{%", "%}", "{{", "}}",    "{#",     "-",    "(",  ")", "[",  "]",    "'",
                                          "\"", "|",  ".",  "endif", "endfor", "loop", "\n", " ", "\\", "\xff", "\xc3"};
    uint64_t rng = 0xfeedface12345678ULL;
    int parsed = 0, rendered = 0, total = 0;
    const char *it_env = getenv("TEMPLATE_FUZZ_ITERS"), *seed_env = getenv("TEMPLATE_FUZZ_SEED");
    int iters = it_env ? atoi(it_env) : 150;
    if (seed_env) rng ^= strtoull(seed_env, NULL, 0) * 0x9E3779B97F4A7C15ULL;
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        snprintf(path, sizeof path, "%s/tests/data/chat-templates/%s", root ? root : ".", names[f]);
        FILE *fp = fopen(path, "rb");
        CHECK_MSG(fp != NULL, "cannot open %s", path);
        if (!fp) continue;
        char *orig = malloc(1 << 20);
        size_t len = fread(orig, 1, (1 << 20) - 1, fp);
        fclose(fp);
        char *buf = malloc(len + 64);
        for (int iter = 0; iter < iters; iter++) {
            size_t n = len;
            memcpy(buf, orig, len);
            int edits = 1 + (int)(tu_rng_next(&rng) % 3);
            for (int e = 0; e < edits && n > 0; e++) {
                size_t at = tu_rng_next(&rng) % n;
                switch (tu_rng_next(&rng) % 3) {
                case 0: /* delete a span */ {
                    size_t span = 1 + tu_rng_next(&rng) % 8;
                    if (at + span > n) span = n - at;
                    memmove(buf + at, buf + at + span, n - at - span);
                    n -= span;
                    break;
                }
                case 1: /* insert a token */ {
                    const char *ins = inserts[tu_rng_next(&rng) % (sizeof inserts / sizeof inserts[0])];
                    size_t il = strlen(ins);
                    if (n + il >= len + 64) break;
                    memmove(buf + at + il, buf + at, n - at);
                    memcpy(buf + at, ins, il);
                    n += il;
                    break;
                }
                default: buf[at] = (char)(tu_rng_next(&rng) & 0xFF); break;
                }
            }
            total++;
            mu_error err = {{0}};
            mu_template *t = mu_template_parse(buf, n, "fuzz", &err);
            if (!t) {
                CHECK_MSG(strncmp(err.msg, "fuzz:", 5) == 0, "unlabelled parse error: %s", err.msg);
                continue;
            }
            parsed++;
            mu_template_inputs in = {.messages_json = msgs,
                                     .tools_json = tools,
                                     .add_generation_prompt = true,
                                     .bos_token = "<s>",
                                     .eos_token = "</s>",
                                     .date = "2024-01-01",
                                     .max_steps = 2000000};
            char *out = mu_template_render(t, &in, &err);
            if (out)
                rendered++;
            else
                CHECK_MSG(err.msg[0] != '\0', "render failed without a message");
            free(out);
            mu_template_free(t);
        }
        free(buf);
        free(orig);
    }
    printf("mutation fuzz: %d variants, %d parsed, %d rendered\n", total, parsed, rendered);
    CHECK(total > 0 && parsed > 0);
}

/* One parsed template rendered from several threads at once gives the same
 * bytes as a single-threaded render (the AST is read-only at render time). */
typedef struct thread_job {
    const mu_template *t;
    const mu_template_inputs *in;
    const char *want;
    int mismatches;
} thread_job;

static void *render_many(void *arg) {
    thread_job *j = arg;
    for (int i = 0; i < 40; i++) {
        mu_error err;
        char *out = mu_template_render(j->t, j->in, &err);
        if (!out || strcmp(out, j->want)) j->mismatches++;
        free(out);
    }
    return NULL;
}

static void test_threads(void) {
    const char *src = "{% macro m(x) %}[{{ x|upper }}]{% endmacro %}{% set ns = namespace(n=0) %}"
                      "{% for msg in messages %}{% set ns.n = ns.n + 1 %}{{ m(msg.content) }}{{ loop.index }}"
                      "{{ 'a' ~ 'b' }}{% endfor %}{{ ns.n }}{{ {'k': [1, 2.5]}|tojson }}";
    mu_error err;
    mu_template *t = mu_template_parse(src, strlen(src), "t", &err);
    CHECK(t != NULL);
    if (!t) return;
    mu_template_inputs in = {.messages_json = "[{\"content\": \"x\"}, {\"content\": \"é\"}]", .date = "2024-01-01"};
    char *want = mu_template_render(t, &in, &err);
    CHECK(want && !strcmp(want, "[X]1ab[É]2ab2{\"k\": [1, 2.5]}"));
    thread_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, &in, want ? want : "", 0};
        CHECK(pthread_create(&th[i], NULL, render_many, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(jobs[i].mismatches, 0);
    }
    free(want);
    mu_template_free(t);
}

int main(void) {
    test_expressions();
    test_filters_and_tests();
    test_statements();
    test_whitespace();
    test_undefined_and_errors();
    test_parse_errors();
    test_limits();
    test_api();
    test_threads();
    test_float_repr();
    test_mutation_fuzz();
    TEST_MAIN_END();
}
