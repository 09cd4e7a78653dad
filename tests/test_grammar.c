/* GBNF grammars: every grammar in tests/data/grammars parses and accepts /
 * rejects hand-checked strings (complete, viable-but-incomplete, refused);
 * UTF-8 split across tokens; ambiguous splits of one string; exact {m,n}
 * bounds; negated classes (including half-read code points); token
 * terminals; parse errors with exact line:column; refusal of left
 * recursion; adversarial inputs (deep nesting, exponential ambiguity, random
 * mutations) that must fail cleanly; EOG only at completion; and the trie
 * masks (whole vocabulary and subsets) against per-token
 * mu_grammar_allows along random walks. Prints the 202,048-token mask
 * timings (not asserted). */
#include "testutil.h"
#include "gguf/gguf.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

static char g_dir[1024];

static void find_data_dir(void) { tu_data_dir(g_dir, sizeof g_dir, "grammars", __FILE__); }

static char *read_text(const char *name, size_t *len) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.gbnf", g_dir, name);
    return tu_read_file(path, len);
}

static mu_grammar *load(const char *name) {
    size_t len = 0;
    char *text = read_text(name, &len);
    CHECK_MSG(text != NULL, "cannot read %s.gbnf", name);
    if (!text) return NULL;
    mu_error err = {{0}};
    mu_grammar *g = mu_grammar_parse(text, len, NULL, &err);
    CHECK_MSG(g != NULL, "%s.gbnf: %s", name, err.msg);
    free(text);
    return g;
}

static mu_grammar *parse_str(const char *text) {
    mu_error err = {{0}};
    mu_grammar *g = mu_grammar_parse(text, strlen(text), NULL, &err);
    CHECK_MSG(g != NULL, "%s: %s", text, err.msg);
    return g;
}

enum { REJECT = -1, PREFIX = 0, FULL = 1 };

/* FULL: accepted and complete; PREFIX: accepted, more needed; REJECT. */
static int match(const mu_grammar *g, const char *s, size_t n) {
    mu_error err = {{0}};
    mu_grammar_state *st = mu_grammar_state_new(g, &err);
    if (!st) return REJECT;
    int r = mu_grammar_accept_bytes(st, s, n, &err) ? (mu_grammar_is_complete(st) ? FULL : PREFIX)
                                                    : REJECT;
    mu_grammar_state_free(st);
    return r;
}

static void expect(const mu_grammar *g, const char *what, const char *s, int want) {
    if (!g) return;
    int got = match(g, s, strlen(s));
    CHECK_MSG(got == want, "%s: \"%s\": got %d, want %d", what, s, got, want);
}

static void expect_all(const mu_grammar *g, const char *what, const char *const *full,
                       const char *const *prefix, const char *const *reject) {
    for (; full && *full; full++) expect(g, what, *full, FULL);
    for (; prefix && *prefix; prefix++) expect(g, what, *prefix, PREFIX);
    for (; reject && *reject; reject++) expect(g, what, *reject, REJECT);
}

static void expect_error(const char *text, size_t len, const char *root, const char *want1,
                         const char *want2) {
    mu_error err = {{0}};
    mu_grammar *g = mu_grammar_parse(text, len, root, &err);
    CHECK_MSG(g == NULL, "grammar should be refused: %.60s", text);
    mu_grammar_free(g);
    CHECK_MSG(strstr(err.msg, want1) != NULL, "%.60s: message '%s' lacks '%s'", text, err.msg, want1);
    if (want2) CHECK_MSG(strstr(err.msg, want2) != NULL, "%.60s: message '%s' lacks '%s'", text, err.msg, want2);
}

#define EXPECT_ERROR(text, w1, w2) expect_error(text, strlen(text), NULL, w1, w2)

/* ---------------- the shipped grammars ---------------- */

static void test_data_grammars(void) {
    {
        mu_grammar *g = load("arithmetic");
        const char *full[] = {"1+2=3\n", "(a +b)*c= d\n1=1\n", "x_1 = 42\n", NULL};
        const char *prefix[] = {"1+2=3", "(a", "", NULL};
        const char *reject[] = {"1+=3\n", "A=1\n", "1+2=3\n=", NULL};
        expect_all(g, "arithmetic", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("c");
        const char *full[] = {"", "int main(){return 0;}",
                              "int main(){return 0;}int f(int x){x = x*2;}",
                              "float g(){while(a<b){a = a+1;}}", NULL};
        const char *prefix[] = {"int main(){", "int ", "char c(){// hi", NULL};
        const char *reject[] = {"intmain(){}", "int main() {}", "long f(){}", NULL};
        expect_all(g, "c", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("chess");
        const char *full[] = {"1. e4 e5\n2. Nf3 Nc6\n", "1. e4 e5\n2. O-O O-O-O+\n",
                              "1. Ke2 Kxe7#\n10. a8=Q+ bxa1=N\n", NULL};
        const char *prefix[] = {"1. e4 e5\n", "1. e4", NULL};
        const char *reject[] = {"1. e9", "2. e4 e5\n", "1. e4  e5\n", NULL};
        expect_all(g, "chess", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("english");
        const char *full[] = {"Hello, world!", "a\tb\nc", "[x]\\y", NULL};
        const char *prefix[] = {"Hello ", "", NULL};
        const char *reject[] = {"Hello  world", "h\xc3\xa9llo", " a", NULL};
        expect_all(g, "english", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("japanese");
        /* こんにちは 世界 / カタカナ、 */
        const char *full[] = {"\xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf "
                              "\xe4\xb8\x96\xe7\x95\x8c",
                              "\xe3\x82\xab\xe3\x82\xbf\xe3\x82\xab\xe3\x83\x8a\xe3\x80\x81", NULL};
        const char *prefix[] = {"\xe3\x81\x93 ", "\xe3\x81", NULL};
        const char *reject[] = {"hello", "\xe3\x81\x93  \xe3\x81\x93", "\xe3\x81\x93\xc3\xa9",
                                "\xe3\x81\x41", NULL};
        expect_all(g, "japanese", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("json");
        const char *full[] = {"{}", "{\"a\": [1, 2.5, true, null, \"x\\u00e9\"]}",
                              "{\"k\\\"\": \"\\n\", \"n\": {\"m\": []}}", "{\"a\": 1e05}",
                              "{\"a\": -0.5E+7}\n  ", "{\"\xe6\x97\xa5\": \"\xf0\x9f\x98\x80\"}", NULL};
        const char *prefix[] = {"{\"a\"", "{\"a\": [", "{\"a\": 1e", NULL};
        const char *reject[] = {"{\"a\": 01}", "{\"a\": 1e50}", "[1]", "{\"a\": tru}",
                                "{\"a\": \"\x01\"}", "{\"a\": \"\\x\"}", "{} {}", NULL};
        expect_all(g, "json", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("json_arr");
        const char *full[] = {"[\n]", "[\n1,\n{\"a\": true}]", "[\n \"x\",\n2e10]", NULL};
        const char *prefix[] = {"[\n1,", "[\n", NULL};
        const char *reject[] = {"[1]", "[\n1]\n", "[\n1e01]", "[\n  1]", NULL};
        expect_all(g, "json_arr", full, prefix, reject);
        mu_grammar_free(g);
    }
    {
        mu_grammar *g = load("list");
        const char *full[] = {"- a\n- b c\n", "- \xe6\x97\xa5\xe6\x9c\xac\n", NULL};
        const char *prefix[] = {"- a", "- ", NULL};
        const char *reject[] = {"- \n", "-a\n", "- a\xe2\x80\xa8" "b\n", "- a\rb\n",
                                "- \xc2\x85\n", NULL};
        expect_all(g, "list", full, prefix, reject);
        mu_grammar_free(g);
    }
}

/* ---------------- syntax and semantics ---------------- */

static void test_repetition_bounds(void) {
    mu_grammar *g = parse_str("root ::= \"a\"{2,4}");
    const char *r24_full[] = {"aa", "aaa", "aaaa", NULL}, *r24_pre[] = {"", "a", NULL},
               *r24_rej[] = {"aaaaa", "b", NULL};
    expect_all(g, "{2,4}", r24_full, r24_pre, r24_rej);
    mu_grammar_free(g);

    g = parse_str("root ::= [ab]{3}");
    const char *r3_full[] = {"aba", "bbb", NULL}, *r3_pre[] = {"ab", NULL},
               *r3_rej[] = {"abab", "abc", NULL};
    expect_all(g, "{3}", r3_full, r3_pre, r3_rej);
    mu_grammar_free(g);

    g = parse_str("root ::= \"ab\"{2,}");
    const char *r2_full[] = {"abab", "ababababababababababab", NULL}, *r2_pre[] = {"ab", "aba", NULL},
               *r2_rej[] = {"abb", NULL};
    expect_all(g, "{2,}", r2_full, r2_pre, r2_rej);
    mu_grammar_free(g);

    g = parse_str("root ::= \"x\" \"a\"{0} \"y\" [0-9]{0,2}");
    const char *r0_full[] = {"xy", "xy1", "xy12", NULL}, *r0_rej[] = {"xay", "xy123", NULL};
    expect_all(g, "{0}", r0_full, NULL, r0_rej);
    mu_grammar_free(g);

    g = parse_str("root ::= (\"0x\" [A-F0-9]{2} \" \"?){3,5}"); /* llama.cpp's test case */
    const char *hx_full[] = {"0xFF 0x12 0xAB", "0xFF 0x12 0xAB 0x00 0x00", NULL},
               *hx_pre[] = {"0xFF", "0xFF 0x12", NULL},
               *hx_rej[] = {"0xFF 0x12 0xAB 0x00 0x00 0x00", "0xfF", NULL};
    expect_all(g, "{3,5} group", hx_full, hx_pre, hx_rej);
    mu_grammar_free(g);

    g = parse_str("root ::= \"a\"{ 1 , 2 }");
    expect(g, "spaced braces", "aa", FULL);
    mu_grammar_free(g);
}

static void test_classes_and_literals(void) {
    mu_grammar *g = parse_str("root ::= [^abc\\n]+");
    const char *n_full[] = {"xyz", "\xe6\x97\xa5\xe6\x9c\xac", "A-Z", NULL},
               *n_rej[] = {"xaz", "x\ny", NULL};
    expect_all(g, "negated", n_full, NULL, n_rej);
    CHECK_EQ_INT(match(g, "", 0), PREFIX);
    mu_grammar_free(g);

    g = parse_str("root ::= [a-cx-z\\]-]+ \".\"");
    const char *c_full[] = {"abz-].", "y.", NULL}, *c_rej[] = {"d.", "[.", NULL};
    expect_all(g, "ranges", c_full, NULL, c_rej);
    mu_grammar_free(g);

    g = parse_str("root ::= \"\\x41\\u00e9\\U0001F600\\t\\\\\\\"\\[\\]\" . [\\x00-\\x1f]");
    const char *e_full[] = {"A\xc3\xa9\xf0\x9f\x98\x80\t\\\"[]\xe2\x82\xac\x1f", "A\xc3\xa9\xf0\x9f\x98\x80\t\\\"[]z\n",
                            NULL},
               *e_rej[] = {"A\xc3\xa9\xf0\x9f\x98\x80\t\\\"[]z ", NULL};
    expect_all(g, "escapes", e_full, NULL, e_rej);
    mu_grammar_free(g);

    /* a NUL code point is an ordinary character in bytes */
    g = parse_str("root ::= \"a\" [\\x00] \"b\"");
    if (g) CHECK_EQ_INT(match(g, "a\0b", 3), FULL);
    mu_grammar_free(g);

    /* multi-line rules, comments, CRLF, continuation after '|' and '::=' */
    g = parse_str("# header\r\nroot ::=\r\n  \"a\" | # first\r\n  (\r\n    \"b\"\r\n    \"c\" # in group\r\n  ) |\r\n"
                  "  x\r\n\r\nx ::= \"d\"|\r\n  \"e\"\r\n");
    /* a newline before '|' ends the rule (only after '|' does it continue) */
    EXPECT_ERROR("root ::= \"a\"\n  | \"b\"", "line 2, column 3: expected a rule name, found '|'", NULL);
    const char *m_full[] = {"a", "bc", "d", "e", NULL}, *m_rej[] = {"b\n", "ad", NULL};
    expect_all(g, "multi-line", m_full, NULL, m_rej);
    mu_grammar_free(g);

    /* custom root, names with digits / capitals */
    mu_error err = {{0}};
    const char *txt = "Start-1 ::= \"s\" Tail2\nTail2 ::= \"t\"";
    g = mu_grammar_parse(txt, strlen(txt), "Start-1", &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    expect(g, "custom root", "st", FULL);
    mu_grammar_free(g);

    /* llama.cpp accepts ( [x]* )*: a nullable loop that pushes nothing */
    g = parse_str("root ::= ( [x]* )*");
    const char *s_full[] = {"", "x", "xx", NULL}, *s_rej[] = {"y", "xy", NULL};
    expect_all(g, "nullable star", s_full, NULL, s_rej);
    mu_grammar_free(g);

    /* llama.cpp's documented performance pattern x? x? ... and special chars */
    g = parse_str("root ::= ... \"abc\" ...");
    const char *d_full[] = {"abcabcabc", "\xf0\x9f\x94\xb5\xf0\x9f\x9f\xa0\xe2\x9c\x85" "abc"
                            "\xe2\x9d\x8c\xf0\x9f\x9f\xa0\xf0\x9f\x94\xb5", NULL},
               *d_rej[] = {"aaabcccc", "aaaaabcccc", NULL};
    expect_all(g, "dots", d_full, NULL, d_rej);
    mu_grammar_free(g);
}

/* An ambiguous grammar: every split of the same text must survive. */
static void test_ambiguity_strings(void) {
    mu_grammar *g = parse_str("root ::= \"a\"* \"ab\"");
    const char *full[] = {"ab", "aab", "aaaab", NULL}, *pre[] = {"a", "aa", NULL},
               *rej[] = {"b", "abab", "aba", NULL};
    expect_all(g, "a* ab", full, pre, rej);
    mu_grammar_free(g);

    g = parse_str("root ::= x | y\nx ::= \"ab\" \"c\"\ny ::= \"a\" \"bd\"");
    const char *f2[] = {"abc", "abd", NULL}, *p2[] = {"ab", NULL}, *r2[] = {"abe", NULL};
    expect_all(g, "x|y", f2, p2, r2);
    mu_grammar_free(g);

    /* ws can swallow the newline the rule also requires (arithmetic.gbnf) */
    g = parse_str("root ::= [a-z]+ ws \"\\n\"\nws ::= [ \\n]*");
    const char *f3[] = {"ab\n", "ab \n\n", NULL}, *p3[] = {"ab ", NULL};
    expect_all(g, "ws/newline", f3, p3, NULL);
    mu_grammar_free(g);
}

/* ---------------- parse errors ---------------- */

static void test_parse_errors(void) {
    EXPECT_ERROR("root ::= [abc", "line 1, column 14: expected ']' to close the character class",
                 "opened at line 1, column 10");
    EXPECT_ERROR("root ::= \"a\"\nx ::= \"abc", "line 2, column 11: expected '\"' to close the string",
                 "opened at line 2, column 7");
    EXPECT_ERROR("root ::= expr\nexpr ::= term\nterm ::= numero\nnumber ::= [0-9]+",
                 "line 3, column 10: undefined rule 'numero'", NULL);
    EXPECT_ERROR("root ::= (\"a\" |\n  \"b\"", "line 2, column 6: expected ')' to close the group opened "
                 "at line 1, column 10", "found end of input");
    EXPECT_ERROR("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice",
                 "first at line 1, column 1");
    EXPECT_ERROR("root ::= \"\\q\"", "line 1, column 11: unknown escape '\\q'", NULL);
    EXPECT_ERROR("root ::= \"a\"{3,2}", "line 1, column 13: repetition {3,2}", "minimum exceeds");
    EXPECT_ERROR("root ::= \"a\"{2001}", "line 1, column 14: repetition count 2001 exceeds the limit",
                 NULL);
    EXPECT_ERROR("root := \"a\"", "line 1, column 6: expected '::=' after the rule name 'root'", NULL);
    EXPECT_ERROR("root ::= * \"a\"", "line 1, column 10: '*' has nothing to repeat", NULL);
    EXPECT_ERROR("root ::= \"a\" )", "line 1, column 14: expected the end of the line after rule "
                 "'root', found ')'", NULL);
    EXPECT_ERROR("root ::= <[12]", "line 1, column 15: expected '>' to close the token", NULL);
    EXPECT_ERROR("root ::=\n  [z-a]", "line 2, column 4: reversed range", NULL);
    EXPECT_ERROR("root ::= \"\\x4g\"", "line 1, column 11: expected 2 hex digits after '\\x'", NULL);
    EXPECT_ERROR("root ::= \"\\U00110000\"", "line 1, column 11:", "beyond U+10FFFF");
    EXPECT_ERROR("root ::= []", "line 1, column 10: empty character class", NULL);
    EXPECT_ERROR("root ::= \"a\"{2,x}", "line 1, column 16: expected '}' to close the repetition", NULL);
    EXPECT_ERROR("root ::= \"a\"{x}", "line 1, column 14: expected a number after '{'", NULL);
    EXPECT_ERROR("root ::= !\"a\"", "line 1, column 11: expected '<' after '!'", NULL);
    EXPECT_ERROR("root ::= <think>", "line 1, column 10: token text <think> needs a vocabulary", NULL);
    EXPECT_ERROR("root ::= <[99999999999]>", "line 1, column 12: token id 99999999999 is out of range",
                 NULL);
    EXPECT_ERROR("  \"a\"", "line 1, column 3: expected a rule name, found '\"'", NULL);
    EXPECT_ERROR("root ::= \"\xe6\x97\xa5\" \xff", "line 1, column 14: expected the end of the line", NULL);
    EXPECT_ERROR("root ::= \"\xe6\x97\"", "line 1, column 11: invalid UTF-8", NULL);
    EXPECT_ERROR("", "empty", NULL);
    EXPECT_ERROR("  # nothing but a comment\n\n", "empty", NULL);
    EXPECT_ERROR("foo ::= \"a\"", "no rule named 'root'", NULL);
    expect_error("root ::= \"a\"\0\"b\"", 16, NULL, "line 1, column 13: NUL byte", NULL);
    expect_error("root ::= \"foobar\"", 17, "nonexistent", "no rule named 'nonexistent'", NULL);
    /* llama.cpp's repetition-size guard: {1000} of a group already x1000 */
    EXPECT_ERROR("root ::= (\"a\"{0,1000}){0,1000}", "too many rules", "1001 x 1000");
    EXPECT_ERROR("root ::= \"a\"{100}{100}", "line 1, column 18: repetition expands to too many rules",
                 NULL);
}

static void test_left_recursion(void) {
    /* llama.cpp's four cases */
    EXPECT_ERROR("root ::= \"a\" | root \"a\"", "left recursion", "'root' -> 'root'");
    EXPECT_ERROR("root ::= asdf\nasdf ::= \"a\" | asdf \"a\"", "left recursion", "'asdf' -> 'asdf'");
    EXPECT_ERROR("root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | asdf \"d\" | \"e\"",
                 "left recursion", "'asdf' -> 'foo' -> 'asdf'");
    EXPECT_ERROR("root ::= asdf\nasdf ::= \"a\" | foo \"b\"\nfoo ::= \"c\" | empty asdf \"d\" | \"e\"\n"
                 "empty ::= \"blah\" | ", "left recursion", "'asdf' -> 'foo' -> 'asdf'");
    /* hidden behind an indirectly nullable rule: llama.cpp misses it and
     * loops forever; refused here */
    EXPECT_ERROR("root ::= e root \"y\" | \"z\"\ne ::= f\nf ::= \"q\" | ",
                 "left recursion through rules that can match the empty string", "'root' -> 'root'");
    /* right recursion is fine */
    mu_grammar *g = parse_str("root ::= \"a\" root | \"b\"");
    expect(g, "right recursion", "aaab", FULL);
    mu_grammar_free(g);
}

static mu_grammar_vocab *random_vocab(int *n_out);
static void mask_walks(const mu_grammar *g, const mu_grammar_vocab *v, int n, const char *what,
                       uint64_t *rng, int walks, int steps, bool must_progress);

/* Inputs that must fail cleanly, quickly and without crashing. */
static void test_adversarial(void) {
    char buf[4096];
    /* 300 nested groups: refused; 200: fine */
    size_t n = (size_t)snprintf(buf, sizeof buf, "root ::= ");
    for (int i = 0; i < 300; i++) buf[n++] = '(';
    buf[n] = '\0';
    expect_error(buf, n, NULL, "nested deeper than 256", NULL);
    n = (size_t)snprintf(buf, sizeof buf, "root ::= ");
    for (int i = 0; i < 200; i++) buf[n++] = '(';
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\"a\"");
    for (int i = 0; i < 200; i++) buf[n++] = ')';
    buf[n] = '\0';
    mu_grammar *g = parse_str(buf);
    expect(g, "deep groups", "a", FULL);
    mu_grammar_free(g);

    /* 2^n stacks: s ::= "x" s "y" | "x" s "z" | ""  -> capped with a message */
    g = parse_str("root ::= s\ns ::= \"x\" s \"y\" | \"x\" s \"z\" | ");
    if (g) {
        mu_error err = {{0}};
        mu_grammar_state *st = mu_grammar_state_new(g, &err);
        CHECK(mu_grammar_accept_bytes(st, "xxxxxxxx", 8, &err)); /* 2^8 stacks: fine */
        CHECK(mu_grammar_accept_bytes(st, "yzyzyzyz", 8, &err));
        CHECK(mu_grammar_is_complete(st));
        mu_grammar_state_free(st);
        st = mu_grammar_state_new(g, &err);
        size_t start_stacks = mu_grammar_state_n_stacks(st);
        CHECK_EQ_INT(start_stacks, 3); /* "x" (twice) and the empty stack */
        double t0 = mu_now();
        bool ok = mu_grammar_accept_bytes(st, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 30, &err);
        CHECK(!ok);
        CHECK_MSG(strstr(err.msg, "live parse stacks") != NULL, "%s", err.msg);
        CHECK(mu_now() - t0 < 5.0);
        CHECK_EQ_INT(mu_grammar_state_n_stacks(st), start_stacks); /* unchanged */
        mu_grammar_state_free(st);
    }
    mu_grammar_free(g);

    /* x? x? ... x? written 300 times: linear, not quadratic, in stacks */
    n = (size_t)snprintf(buf, sizeof buf, "root ::=");
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, " \"x\"?");
    g = parse_str(buf);
    if (g) {
        char xs[301];
        memset(xs, 'x', 300);
        CHECK_EQ_INT(match(g, xs, 300), FULL);
        CHECK_EQ_INT(match(g, xs, 301 - 1), FULL);
        xs[300] = 'x';
        CHECK_EQ_INT(match(g, xs, 301), REJECT);
    }
    mu_grammar_free(g);

    /* random mutations of the shipped grammars and random bytes: any result,
     * but no crash, and accepted grammars must run */
    static const char *const names[] = {"arithmetic", "c", "chess", "english", "japanese", "json",
                                        "json_arr", "list"};
    uint64_t rng = 0x1234567887654321ull;
    int parsed = 0, nv = 0;
    mu_grammar_vocab *v = random_vocab(&nv);
    for (int it = 0; it < 1600; it++) {
        size_t len = 0;
        char *text = read_text(names[it % 8], &len);
        if (!text) continue;
        int edits = 1 + (int)(tu_rng_next(&rng) % 4);
        for (int e = 0; e < edits && len; e++) {
            size_t at = tu_rng_next(&rng) % len;
            static const char pool[] = "()[]{}|*+?.\"\\<>!^-#:=\n 0129ax,";
            int kind = (int)(tu_rng_next(&rng) % 3);
            if (kind == 0) text[at] = pool[tu_rng_next(&rng) % (sizeof pool - 1)];
            else if (kind == 1) text[at] = (char)(tu_rng_next(&rng) & 0xFF);
            else len = at; /* truncate */
        }
        if (it % 50 == 0)
            for (size_t k = 0; k < len; k++) text[k] = (char)(tu_rng_next(&rng) & 0xFF);
        mu_error err = {{0}};
        mu_grammar *mg = mu_grammar_parse(text, len, NULL, &err);
        if (mg) {
            parsed++;
            mu_grammar_state *st = mu_grammar_state_new(mg, &err);
            if (st) {
                mu_grammar_accept_bytes(st, "{\"a\": 1} 1. e4 - x\n", 19, &err);
                mu_grammar_state_free(st);
            }
            if (v && parsed <= 150) mask_walks(mg, v, nv, "mutated grammar", &rng, 1, 6, false);
            mu_grammar_free(mg);
        } else {
            CHECK_MSG(strncmp(err.msg, "grammar:", 8) == 0, "message: %s", err.msg);
        }
        free(text);
    }
    CHECK(parsed > 50); /* the mutations do not all break the grammar */
    mu_grammar_vocab_free(v);
}

/* ---------------- tokens ---------------- */

typedef struct test_vocab {
    const char *piece[64];
    size_t len[64];
    bool eog[64];
    int n;
} test_vocab;

static void tv_add(test_vocab *t, const char *s, size_t n, bool eog) {
    t->piece[t->n] = s;
    t->len[t->n] = n;
    t->eog[t->n] = eog;
    t->n++;
}

static mu_grammar_vocab *tv_build(test_vocab *t) {
    mu_error err = {{0}};
    mu_grammar_vocab *v = mu_grammar_vocab_new(t->n, t->piece, t->len, t->eog, &err);
    CHECK_MSG(v != NULL, "%s", err.msg);
    return v;
}

/* Allowed set as a string of '0'/'1', checking all three mask forms and
 * mu_grammar_allows agree. */
static void allowed_set(const mu_grammar_state *s, const mu_grammar_vocab *v, char *out) {
    int n = mu_grammar_vocab_size(v);
    bool all[64], sub[64];
    int32_t ids[64];
    uint32_t bits[2] = {0, 0};
    mu_error err = {{0}};
    CHECK(mu_grammar_mask_all(s, v, all, &err));
    CHECK(mu_grammar_mask_bits(s, v, bits, &err));
    for (int i = 0; i < n; i++) ids[i] = n - 1 - i;
    CHECK(mu_grammar_mask(s, v, ids, (size_t)n, sub, &err));
    for (int i = 0; i < n; i++) {
        bool one = mu_grammar_allows(s, v, i);
        CHECK_MSG(all[i] == one && sub[n - 1 - i] == one && ((bits[i >> 5] >> (i & 31) & 1) == one),
                  "token %d: all %d sub %d bits %d allows %d", i, all[i], sub[n - 1 - i],
                  (int)(bits[i >> 5] >> (i & 31) & 1), one);
        out[i] = one ? '1' : '0';
    }
    out[n] = '\0';
}

static void expect_allowed(const mu_grammar_state *s, const mu_grammar_vocab *v, const char *what,
                           const char *want) {
    char got[80];
    allowed_set(s, v, got);
    CHECK_MSG(!strcmp(got, want), "%s: allowed %s, want %s", what, got, want);
}

static void accept_tok(mu_grammar_state *s, const mu_grammar_vocab *v, int id) {
    mu_error err = {{0}};
    CHECK_MSG(mu_grammar_accept_token(s, v, id, &err), "token %d: %s", id, err.msg);
}

static void test_utf8_split(void) {
    test_vocab t = {0};
    tv_add(&t, "\xe3", 1, false);          /* 0: first byte of こ */
    tv_add(&t, "\x81\x93", 2, false);      /* 1: rest of こ */
    tv_add(&t, "\xe3\x81", 2, false);      /* 2 */
    tv_add(&t, "\x93", 1, false);          /* 3 */
    tv_add(&t, "\xe3\x81\x93", 3, false);  /* 4: こ */
    tv_add(&t, " ", 1, false);             /* 5 */
    tv_add(&t, "a", 1, false);             /* 6 */
    tv_add(&t, "\xc3", 1, false);          /* 7: lead of U+00C0-00FF */
    tv_add(&t, "\xe4\xb8", 2, false);      /* 8: 世 prefix, U+4E00-4E3F */
    tv_add(&t, "\x96", 1, false);          /* 9 */
    tv_add(&t, "</s>", 4, true);           /* 10: EOG */
    tv_add(&t, "\x80", 1, false);          /* 11 */
    tv_add(&t, "\xf0\x9f", 2, false);      /* 12: emoji prefix */
    tv_add(&t, "", 0, false);              /* 13: empty, never */
    tv_add(&t, "\0x", 2, false);           /* 14: starts with NUL, never */
    mu_grammar_vocab *v = tv_build(&t);
    mu_grammar *g = load("japanese");
    if (!v || !g) goto done;
    mu_error err = {{0}};
    mu_grammar_state *s = mu_grammar_state_new(g, &err);
    expect_allowed(s, v, "jp start", "101010001000000");
    accept_tok(s, v, 0);
    CHECK(!mu_grammar_is_complete(s));
    /* E3 93 could only be U+38C0-38FF: no class; E3 80 is punctuation */
    expect_allowed(s, v, "jp after E3", "010000000001000");
    mu_grammar_state *c = mu_grammar_state_clone(s);
    accept_tok(s, v, 1);
    CHECK(mu_grammar_is_complete(s));
    expect_allowed(s, v, "jp after こ", "101011001010000");
    accept_tok(s, v, 5);
    accept_tok(s, v, 8);
    expect_allowed(s, v, "jp after 世 prefix", "000100000101000"); /* 4E13, 4E16, 4E00 */
    accept_tok(s, v, 9);
    CHECK(mu_grammar_is_complete(s));
    accept_tok(s, v, 10); /* EOG at completion: accepted, no change */
    CHECK(mu_grammar_is_complete(s));
    /* the clone still waits for the rest of こ */
    CHECK(!mu_grammar_accept_token(c, v, 10, &err));
    CHECK(!mu_grammar_accept_token(c, v, 3, &err));
    CHECK(!mu_grammar_accept_token(c, v, 13, &err));
    accept_tok(c, v, 11); /* E3 80: U+3000-303F, punctuation 、-〾 is possible */
    /* E3 80 93 = U+3013 and E3 80 96 = U+3016 are punctuation; E3 80 80 is
     * U+3000, outside 3001-303E; \x81\x93 completes U+3001 then is bad */
    expect_allowed(c, v, "jp after E3 80", "000100000100000");
    CHECK(!mu_grammar_accept_token(c, v, 11, &err));
    CHECK(strstr(err.msg, "U+3000") != NULL);
    accept_tok(c, v, 3);
    CHECK(mu_grammar_is_complete(c));
    /* bytes split over accept_bytes calls behave the same */
    mu_grammar_state *b = mu_grammar_state_new(g, &err);
    CHECK(mu_grammar_accept_bytes(b, "\xe3", 1, &err));
    CHECK(mu_grammar_accept_bytes(b, "\x81", 1, &err));
    CHECK(!mu_grammar_is_complete(b));
    CHECK(!mu_grammar_accept_bytes(b, "\x41", 1, &err));
    CHECK(strstr(err.msg, "invalid UTF-8") != NULL);
    CHECK(mu_grammar_accept_bytes(b, "\x93\xe4\xb8\x96", 4, &err));
    CHECK(mu_grammar_is_complete(b));
    mu_grammar_state_free(b);
    mu_grammar_state_free(c);
    mu_grammar_state_free(s);
done:
    mu_grammar_free(g);
    mu_grammar_vocab_free(v);
}

/* One string, several token splits: every split must stay alive. */
static void test_ambiguity_tokens(void) {
    test_vocab t = {0};
    tv_add(&t, "a", 1, false);   /* 0 */
    tv_add(&t, "aa", 2, false);  /* 1 */
    tv_add(&t, "ab", 2, false);  /* 2 */
    tv_add(&t, "b", 1, false);   /* 3 */
    tv_add(&t, "aab", 3, false); /* 4 */
    tv_add(&t, "<e>", 3, true);  /* 5: EOG */
    mu_grammar_vocab *v = tv_build(&t);
    mu_grammar *g = parse_str("root ::= \"a\"* \"ab\"");
    if (!v || !g) goto done;
    mu_error err = {{0}};
    mu_grammar_state *s = mu_grammar_state_new(g, &err);
    expect_allowed(s, v, "a*ab start", "111010");
    mu_grammar_state *s2 = mu_grammar_state_clone(s);
    accept_tok(s, v, 1); /* "aa": a a* or a + start of "ab" */
    CHECK(!mu_grammar_is_complete(s));
    expect_allowed(s, v, "a*ab after aa", "111110");
    accept_tok(s, v, 3); /* "aab" */
    CHECK(mu_grammar_is_complete(s));
    expect_allowed(s, v, "a*ab after aab", "000001");
    accept_tok(s2, v, 0);
    accept_tok(s2, v, 4); /* "a" + "aab" */
    CHECK(mu_grammar_is_complete(s2));
    CHECK(!mu_grammar_accept_token(s2, v, 0, &err));
    CHECK(mu_grammar_is_complete(s2)); /* a refused token changes nothing */
    mu_grammar_state_free(s2);
    mu_grammar_state_free(s);
done:
    mu_grammar_free(g);
    mu_grammar_vocab_free(v);
}

/* Negated classes against a half-read code point: viable unless every
 * completion is excluded. */
static void test_negated_partial(void) {
    test_vocab t = {0};
    tv_add(&t, "\xe3\x81", 2, false); /* 0: U+3040-307F */
    tv_add(&t, "\xe3", 1, false);     /* 1: U+3000-3FFF */
    tv_add(&t, "\xe3\x82", 2, false); /* 2: U+3080-30BF */
    tv_add(&t, "\x82", 1, false);     /* 3 */
    tv_add(&t, "\xed\xa0", 2, false); /* 4: would be a surrogate */
    tv_add(&t, "\xed", 1, false);     /* 5: U+D000-D7FF only */
    tv_add(&t, "\x81", 1, false);     /* 6 */
    mu_grammar_vocab *v = tv_build(&t);
    mu_grammar *g1 = parse_str("root ::= [^\\u3040-\\u307F]+");
    mu_grammar *g2 = parse_str("root ::= [^\\u3042]");
    mu_grammar *g3 = parse_str("root ::= .");
    mu_error err = {{0}};
    if (v && g1 && g2 && g3) {
        mu_grammar_state *s = mu_grammar_state_new(g1, &err);
        expect_allowed(s, v, "[^3040-307F]", "0110010");
        mu_grammar_state_free(s);
        s = mu_grammar_state_new(g2, &err); /* llama.cpp refuses token 0 here */
        expect_allowed(s, v, "[^3042]", "1110010");
        accept_tok(s, v, 0);
        expect_allowed(s, v, "[^3042] after E3 81", "0000001");
        CHECK(!mu_grammar_accept_bytes(s, "\x82", 1, &err)); /* U+3042 itself */
        CHECK(mu_grammar_accept_bytes(s, "\x81", 1, &err));
        CHECK(mu_grammar_is_complete(s));
        mu_grammar_state_free(s);
        s = mu_grammar_state_new(g3, &err);
        expect_allowed(s, v, ".", "1110010");
        mu_grammar_state_free(s);
    }
    mu_grammar_free(g1);
    mu_grammar_free(g2);
    mu_grammar_free(g3);
    mu_grammar_vocab_free(v);
}

static void test_token_terminals(void) {
    test_vocab t = {0};
    const char *p[] = {"a", "b", "c", " ", "<", "think", ">", "x", "y", "z", "<think>", "</think>",
                       "x<", "hello"};
    for (int i = 0; i < 14; i++) tv_add(&t, p[i], strlen(p[i]), false);
    tv_add(&t, "<|eot|>", 7, true); /* 14 */
    tv_add(&t, "", 0, false);       /* 15 */
    mu_grammar_vocab *v = tv_build(&t);
    if (!v) return;
    mu_error err = {{0}};
    mu_grammar *g = parse_str("root ::= <[10]> content <[11]>\ncontent ::= (!<[11]>)*");
    if (g) {
        mu_grammar_state *s = mu_grammar_state_new(g, &err);
        expect_allowed(s, v, "tok start", "0000000000100000");
        CHECK(!mu_grammar_accept_bytes(s, "<think>", 7, &err)); /* bytes never match a token id */
        accept_tok(s, v, 10);
        expect_allowed(s, v, "tok content", "1111111111111100");
        accept_tok(s, v, 13);
        accept_tok(s, v, 10);
        accept_tok(s, v, 11);
        CHECK(mu_grammar_is_complete(s));
        expect_allowed(s, v, "tok end", "0000000000000010");
        mu_grammar_state_free(s);
    }
    mu_grammar_free(g);

    /* <token-text> resolved through the vocabulary, and its negation */
    const char *txt = "root ::= <think> \"x\"* </think> rest\nrest ::= !<think> | \"\"";
    g = mu_grammar_parse_with_vocab(txt, strlen(txt), NULL, v, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (g) {
        mu_grammar_state *s = mu_grammar_state_new(g, &err);
        expect_allowed(s, v, "text tok start", "0000000000100000");
        accept_tok(s, v, 10);
        expect_allowed(s, v, "text tok x*", "0000000100010000");
        accept_tok(s, v, 7);
        accept_tok(s, v, 11);
        expect_allowed(s, v, "text tok rest", "1111111111011110");
        accept_tok(s, v, 0);
        CHECK(mu_grammar_is_complete(s));
        mu_grammar_state_free(s);
    }
    mu_grammar_free(g);

    /* a string literal matches the piece's bytes, whatever the token */
    g = parse_str("root ::= \"<think>\" \"x\"");
    if (g) {
        mu_grammar_state *s = mu_grammar_state_new(g, &err);
        expect_allowed(s, v, "literal <think>", "0000100000100000");
        accept_tok(s, v, 4);
        accept_tok(s, v, 5);
        expect_allowed(s, v, "literal <think> after <think", "0000001000000000");
        mu_grammar_state_free(s);
    }
    mu_grammar_free(g);

    /* a token terminal after characters matches only at a token boundary */
    g = parse_str("root ::= \"x\" <[4]>");
    if (g) {
        mu_grammar_state *s = mu_grammar_state_new(g, &err);
        expect_allowed(s, v, "x then <[4]>", "0000000100000000"); /* not "x<" (token 12) */
        accept_tok(s, v, 7);
        expect_allowed(s, v, "<[4]>", "0000100000000000");
        mu_grammar_state_free(s);
    }
    mu_grammar_free(g);

    mu_grammar *bad = mu_grammar_parse_with_vocab("root ::= <[16]>", 15, NULL, v, &err);
    CHECK(bad == NULL);
    CHECK_MSG(strstr(err.msg, "token id 16 is out of range (the vocabulary has 16 tokens)"), "%s", err.msg);
    bad = mu_grammar_parse_with_vocab("root ::= <nope>", 15, NULL, v, &err);
    CHECK(bad == NULL);
    CHECK_MSG(strstr(err.msg, "<nope> is not exactly one token"), "%s", err.msg);
    mu_grammar_vocab_free(v);

    test_vocab d = {0};
    tv_add(&d, "<think>", 7, false);
    tv_add(&d, "<think>", 7, false);
    v = tv_build(&d);
    if (v) {
        bad = mu_grammar_parse_with_vocab("root ::= <think>", 16, NULL, v, &err);
        CHECK(bad == NULL);
        CHECK_EQ_INT(mu_grammar_vocab_find(v, "<think>", 7), -2);
    }
    mu_grammar_vocab_free(v);
}

static void test_eog(void) {
    test_vocab t = {0};
    tv_add(&t, "{", 1, false);
    tv_add(&t, "}", 1, false);
    tv_add(&t, "<eos>", 5, true);
    tv_add(&t, "<eot>", 5, true);
    tv_add(&t, " ", 1, false);
    mu_grammar_vocab *v = tv_build(&t);
    mu_grammar *g = load("json");
    if (v && g) {
        mu_error err = {{0}};
        mu_grammar_state *s = mu_grammar_state_new(g, &err);
        expect_allowed(s, v, "json start", "10000");
        CHECK(!mu_grammar_accept_token(s, v, 2, &err));
        CHECK(strstr(err.msg, "before the grammar is complete") != NULL);
        accept_tok(s, v, 0);
        expect_allowed(s, v, "json {", "01001");
        accept_tok(s, v, 1);
        expect_allowed(s, v, "json {}", "00111"); /* ws may follow, or the end */
        accept_tok(s, v, 3);
        accept_tok(s, v, 4);
        expect_allowed(s, v, "json {} ", "00110");
        CHECK(!mu_grammar_accept_token(s, v, 7, &err)); /* out of range */
        mu_grammar_state_free(s);
    }
    mu_grammar_free(g);
    mu_grammar_vocab_free(v);
}

/* ---------------- masks against the per-token reference ---------------- */

static const char *const FRAGMENTS[] = {
    "{", "}", "[", "]", "\"", "\":", "\": ", "\", \"", "{\"", "\"}", "},", ", ", ":", ",", " ",
    "\n", "\n  ", "true", "false", "null", "tr", "ue", "nu", "0", "1", "12", "-", "-1", ".5", "e",
    "E+", "\\", "\\n", "\\u", "00e9", "\\\"", "name", " the", "Hello", "ab", "a", "aa", "1. ",
    " e4", "e5", "\n2", ". N", "f3", "O-O", "x", "=", "+", "*", "(", ")", "- ", "- a", " b",
    "int", " main", "(){", "return", ";}", "//", "\xe3", "\x81", "\x93", "\xe3\x81", "\x81\x93",
    "\xe3\x81\x93", "\xe4\xb8\x96", "\xe4", "\xb8\x96", "\xe7\x95\x8c", "\xf0\x9f", "\x98\x80",
    "\xf0\x9f\x98\x80", "\xc3\xa9", "\xc3", "\xa9", "\xe2\x80", "\xa8", "\xe3\x80", "\x81 ",
    "\xff", "<think>", "</think>",
};

static mu_grammar_vocab *random_vocab(int *n_out) {
    static char bytes[256];
    static const char *piece[512];
    static size_t len[512];
    static bool eog[512];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bytes[b] = (char)b;
        piece[n] = &bytes[b];
        len[n] = 1;
        eog[n++] = false;
    }
    for (size_t i = 0; i < sizeof FRAGMENTS / sizeof FRAGMENTS[0]; i++) {
        piece[n] = FRAGMENTS[i];
        len[n] = strlen(FRAGMENTS[i]);
        eog[n++] = false;
    }
    piece[n] = "<eos>";
    len[n] = 5;
    eog[n++] = true;
    piece[n] = "";
    len[n] = 0;
    eog[n++] = false;
    piece[n] = "a";  /* a duplicate piece */
    len[n] = 1;
    eog[n++] = false;
    mu_error err = {{0}};
    mu_grammar_vocab *v = mu_grammar_vocab_new(n, piece, len, eog, &err);
    CHECK_MSG(v != NULL, "%s", err.msg);
    *n_out = n;
    return v;
}

/* Random walks: at every step all mask forms must equal allows(), and a
 * token accepted iff allowed. */
static void mask_walks(const mu_grammar *g, const mu_grammar_vocab *v, int n, const char *what,
                       uint64_t *rng, int walks, int steps, bool must_progress) {
    bool *all = malloc((size_t)n), *sub = malloc((size_t)n);
    uint32_t *bits = malloc(((size_t)n + 31) / 32 * sizeof *bits);
    int32_t *ids = malloc((size_t)n * sizeof *ids), *allowed_ids = malloc((size_t)n * sizeof *ids);
    mu_error err = {{0}};
    int mismatches = 0, total_allowed = 0;
    for (int w = 0; w < walks; w++) {
        mu_grammar_state *s = mu_grammar_state_new(g, &err);
        for (int step = 0; step < steps && s; step++) {
            CHECK(mu_grammar_mask_all(s, v, all, &err));
            CHECK(mu_grammar_mask_bits(s, v, bits, &err));
            int m = (int)(tu_rng_next(rng) % (uint64_t)n);
            for (int k = 0; k < m; k++) ids[k] = (int32_t)(tu_rng_next(rng) % (uint64_t)n);
            CHECK(mu_grammar_mask(s, v, ids, (size_t)m, sub, &err));
            int na = 0;
            for (int i = 0; i < n; i++) {
                bool ref = mu_grammar_allows(s, v, i);
                bool b = bits[i >> 5] >> (i & 31) & 1;
                if (all[i] != ref || b != ref) mismatches++;
                if (ref) allowed_ids[na++] = i;
            }
            for (int k = 0; k < m; k++)
                if (sub[k] != all[ids[k]]) mismatches++;
            total_allowed += na;
            /* a disallowed token is refused and leaves the state alone */
            int32_t no = (int32_t)(tu_rng_next(rng) % (uint64_t)n);
            if (!all[no]) {
                size_t before = mu_grammar_state_n_stacks(s);
                CHECK(!mu_grammar_accept_token(s, v, no, &err));
                CHECK_EQ_INT(mu_grammar_state_n_stacks(s), before);
            }
            if (!na) break;
            /* prefer non-single-byte tokens half the time to reach deeper states */
            int32_t pick = allowed_ids[tu_rng_next(rng) % (uint64_t)na];
            for (int tries = 0; tries < 4 && pick < 256 && (tu_rng_next(rng) & 1); tries++)
                pick = allowed_ids[tu_rng_next(rng) % (uint64_t)na];
            CHECK_MSG(mu_grammar_accept_token(s, v, pick, &err), "%s: %s", what, err.msg);
            if (mu_grammar_is_complete(s) && (tu_rng_next(rng) % 8) == 0) break;
        }
        mu_grammar_state_free(s);
    }
    CHECK_MSG(mismatches == 0, "%s: %d mask / allows mismatches", what, mismatches);
    if (must_progress) CHECK_MSG(total_allowed > walks * 4, "%s: walks found almost nothing allowed", what);
    free(all);
    free(sub);
    free(bits);
    free(ids);
    free(allowed_ids);
}

static void test_masks_random(void) {
    int n = 0;
    mu_grammar_vocab *v = random_vocab(&n);
    if (!v) return;
    uint64_t rng = 0xC0FFEE1234ull;
    static const char *const names[] = {"json", "json_arr", "arithmetic", "japanese", "list",
                                        "english", "chess", "c"};
    for (int i = 0; i < 8; i++) {
        mu_grammar *g = load(names[i]);
        if (g) mask_walks(g, v, n, names[i], &rng, 6, 40, true);
        mu_grammar_free(g);
    }
    int think = mu_grammar_vocab_find(v, "<think>", 7), end = mu_grammar_vocab_find(v, "</think>", 8);
    CHECK(think > 0 && end > 0);
    char txt[256];
    snprintf(txt, sizeof txt, "root ::= <[%d]> (!<[%d]>)* <[%d]> ([a-z ] | \"\\xe3\\x81\\x93\")* | "
             "\"a\"* \"ab\" | [^\\u3040-\\u307F]{2,3}", think, end, end);
    mu_grammar *g = parse_str(txt);
    if (g) mask_walks(g, v, n, "tokens+ambiguity", &rng, 12, 30, true);
    mu_grammar_free(g);
    mu_grammar_vocab_free(v);
}

/* The GPT-2 test vocabulary's pieces as a grammar vocabulary (NULL if absent). */
static mu_grammar_vocab *gpt2_vocab(void) {
    char path[1200];
    snprintf(path, sizeof path, "%s/../tokenizer/ggml-vocab-gpt-2.gguf", g_dir);
    mu_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    mu_tokenizer *t = f ? mu_tokenizer_load(f, &err) : NULL;
    CHECK_MSG(t != NULL, "gpt-2 vocabulary: %s", err.msg);
    mu_grammar_vocab *v = NULL;
    if (t) {
        int32_t n = (int32_t)mu_tokenizer_n_vocab(t);
        char **piece = calloc((size_t)n, sizeof *piece);
        size_t *len = calloc((size_t)n, sizeof *len);
        bool *eog = calloc((size_t)n, 1);
        for (int32_t i = 0; i < n; i++) {
            len[i] = mu_token_to_piece(t, i, true, NULL, 0);
            piece[i] = malloc(len[i] + 1);
            mu_token_to_piece(t, i, true, piece[i], len[i]);
            eog[i] = mu_token_is_eog(t, i);
        }
        v = mu_grammar_vocab_new(n, (const char *const *)piece, len, eog, &err);
        CHECK_MSG(v != NULL, "%s", err.msg);
        for (int32_t i = 0; i < n; i++) free(piece[i]);
        free(piece);
        free(len);
        free(eog);
    }
    mu_tokenizer_free(t);
    gguf_close(f);
    return v;
}

static void bench_print(const char *what, const mu_grammar_vocab *v) {
    mu_grammar_bench_result r;
    mu_error err = {{0}};
    double worst = mu_grammar_bench_mask(v, 5, &r, &err);
    CHECK_MSG(worst >= 0, "%s", err.msg);
    if (worst < 0) return;
    CHECK_EQ_INT(r.n_vocab, 202048);
    CHECK(r.n_allowed[0] >= 3);      /* "{", "{\"", "{}", ... */
    CHECK(r.n_allowed[1] > 150000);  /* nearly everything inside a string */
    printf("grammar mask, %s, %d tokens (%zu trie nodes), json.gbnf, median of 5:\n", what,
           r.n_vocab, r.trie_nodes);
    for (int k = 0; k < 3; k++)
        printf("  %-10s %7.3f ms (min %.3f)  %d allowed\n", r.state_name[k], r.ms_median[k],
               r.ms_min[k], r.n_allowed[k]);
}

static void test_bench_print(void) {
    bench_print("synthetic words", NULL);
    mu_grammar_vocab *seed = gpt2_vocab();
    if (!seed) return;
    mu_error err = {{0}};
    mu_grammar_vocab *v = mu_grammar_bench_vocab(202048, seed, &err);
    CHECK_MSG(v != NULL, "%s", err.msg);
    if (v) bench_print("GPT-2 pieces + variants", v);
    mu_grammar_vocab_free(v);
    mu_grammar_vocab_free(seed);
}

int main(void) {
    find_data_dir();
    test_data_grammars();
    test_repetition_bounds();
    test_classes_and_literals();
    test_ambiguity_strings();
    test_parse_errors();
    test_left_recursion();
    test_adversarial();
    test_utf8_split();
    test_ambiguity_tokens();
    test_negated_partial();
    test_token_terminals();
    test_eog();
    test_masks_random();
    test_bench_print();
    TEST_MAIN_END();
}
