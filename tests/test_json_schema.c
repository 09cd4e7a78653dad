/* JSON Schema -> GBNF (src/grammar/json_schema.c).
 *
 * 1. Corpus: every tests/data/json_schema/NAME.json must convert to exactly
 *    NAME.gbnf, which llama.cpp's own converter printed (see
 *    tests/data/json_schema/README.md), after one documented patch for muser's deliberate fix of the
 *    additionalProperties key rule. Every produced grammar must also parse
 *    with mu_grammar_parse.
 * 2. Refusals: exact messages for keywords and constructs that llama would
 *    drop or mistranslate.
 * 3. Meaning: a few grammars are run through the GBNF matcher and must
 *    accept exactly the JSON texts the schema allows (brute force over
 *    integer ranges, the cases where llama's own grammar is wrong, escapes in
 *    extra keys, patterns, lengths, enums), and patterns repeating groups
 *    that can match "" are compared with PCRE2 over all short strings. */
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "testutil.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>

static char *read_file(const char *name, size_t *len) {
    char dir[1024], path[1600];
    tu_data_dir(dir, sizeof dir, "json_schema", __FILE__);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return tu_read_file(path, len);
}

static char *convert(const char *schema, mu_error *err) {
    return mu_json_schema_to_gbnf(schema, strlen(schema), err);
}

/* muser's one textual difference from llama (json_schema.h): in key rules
 * `NAME ::= ["] ( ...`, every "[^\"" gains \\\x7F\x00-\x1F. */
static char *patch_key_rules(const char *llama) {
    static const char ADD[] = "\\\\\\x7F\\x00-\\x1F";
    size_t n = strlen(llama);
    char *out = malloc(n * 7 + 1), *o = out; /* each 3-byte [^" grows to 19 */
    for (const char *line = llama; *line;) {
        const char *end = strchr(line, '\n');
        end = end ? end + 1 : line + strlen(line);
        const char *def = strstr(line, " ::= ");
        bool key_rule = def && def < end && strncmp(def + 5, "[\"] ( ", 6) == 0;
        for (const char *p = line; p < end; p++) {
            *o++ = *p;
            if (key_rule && p >= line + 2 && p[-2] == '[' && p[-1] == '^' && p[0] == '"') {
                memcpy(o, ADD, sizeof ADD - 1);
                o += sizeof ADD - 1;
            }
        }
        line = end;
    }
    *o = '\0';
    return out;
}

static void report_first_difference(const char *name, const char *got, const char *want) {
    size_t line = 1;
    const char *g = got, *w = want;
    while (*g && *g == *w) {
        if (*g == '\n') line++;
        g++, w++;
    }
    const char *gl = g, *wl = w;
    while (gl > got && gl[-1] != '\n') gl--;
    while (wl > want && wl[-1] != '\n') wl--;
    fprintf(stderr, "%s: first difference on line %zu\n  got:  %.200s\n  want: %.200s\n", name, line, gl, wl);
}

static void check_parses(const char *name, const char *gbnf) {
    mu_error err = {0};
    mu_grammar *g = mu_grammar_parse(gbnf, strlen(gbnf), NULL, &err);
    CHECK_MSG(g != NULL, "%s: produced grammar does not parse: %s", name, err.msg);
    mu_grammar_free(g);
}

static const char *const CORPUS[] = {
    "primitive_string", "primitives_object", "optional_only", "nested_objects",
    "additional_false", "additional_schema", "additional_with_properties",
    "additional_true_with_properties", "enum_const", "arrays", "tuples", "items_false_tuple",
    "anyof_root", "oneof_nested", "type_arrays", "type_array_root", "allof_objects",
    "allof_enums", "refs", "refs_recursive", "pointer_escape", "formats",
    "format_root_uuid", "string_length", "patterns", "pattern_root", "int_ranges",
    "int_one_sided_fixed", "reserved_names", "empty_schema", "annotated_any",
    "primitive_array",
};

static void test_corpus(void) {
    for (size_t i = 0; i < sizeof CORPUS / sizeof CORPUS[0]; i++) {
        char fname[256];
        size_t len = 0;
        snprintf(fname, sizeof fname, "%s.json", CORPUS[i]);
        char *schema = read_file(fname, &len);
        snprintf(fname, sizeof fname, "%s.gbnf", CORPUS[i]);
        char *llama = read_file(fname, NULL);
        CHECK_MSG(schema && llama, "missing corpus files for %s", CORPUS[i]);
        if (!schema || !llama) continue;
        char *want = patch_key_rules(llama);
        mu_error err = {0};
        char *got = mu_json_schema_to_gbnf(schema, len, &err);
        CHECK_MSG(got != NULL, "%s: refused: %s", CORPUS[i], err.msg);
        if (got) {
            bool same = strcmp(got, want) == 0;
            CHECK_MSG(same, "%s: output differs from llama.cpp's", CORPUS[i]);
            if (!same) report_first_difference(CORPUS[i], got, want);
            check_parses(CORPUS[i], got);
        }
        free(got);
        free(want);
        free(llama);
        free(schema);
    }
}

/* The patch must really change the two files it is for (else the deliberate
 * difference would be untested) and nothing else. */
static void test_patch_scope(void) {
    int changed = 0;
    for (size_t i = 0; i < sizeof CORPUS / sizeof CORPUS[0]; i++) {
        char fname[256];
        snprintf(fname, sizeof fname, "%s.gbnf", CORPUS[i]);
        char *llama = read_file(fname, NULL);
        if (!llama) continue;
        char *patched = patch_key_rules(llama);
        bool differs = strcmp(patched, llama) != 0;
        bool expected = strncmp(CORPUS[i], "additional_", 11) == 0 && strstr(CORPUS[i], "with_properties");
        CHECK_MSG(differs == expected, "%s: key-rule patch %s", CORPUS[i], differs ? "applies" : "does not apply");
        changed += differs;
        free(patched);
        free(llama);
    }
    CHECK_EQ_INT(changed, 2);
}

/* llama fails on a root $ref whose definitions hold more $refs; muser gives
 * the rules of refs_recursive.gbnf with the root pointing at the definition. */
static void test_root_ref(void) {
    const char *schema =
        "{\"$ref\": \"#/$defs/Node\", \"$defs\": {\"Node\": {\"type\": \"object\", \"properties\": {"
        "\"value\": {\"type\": \"integer\"},"
        "\"children\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/Node\"}},"
        "\"parent\": {\"anyOf\": [{\"$ref\": \"#/$defs/Node\"}, {\"type\": \"null\"}]}},"
        "\"required\": [\"value\"]}}}";
    char *llama = read_file("refs_recursive.gbnf", NULL);
    mu_error err = {0};
    char *got = convert(schema, &err);
    CHECK_MSG(got && llama, "root $ref: %s", err.msg);
    if (!got || !llama) {
        free(got);
        free(llama);
        return;
    }
    /* Expected: llama's lines minus its root / tree / tree-kv, plus ours. */
    char want[8192] = "";
    for (const char *line = llama; *line;) {
        const char *end = strchr(line, '\n') + 1;
        if (strncmp(line, "root ::=", 8) == 0) strcat(want, "root ::= ref-defs-Node\n");
        else if (strncmp(line, "tree", 4) != 0) strncat(want, line, (size_t)(end - line));
        line = end;
    }
    CHECK_MSG(strcmp(got, want) == 0, "root $ref:\n%s\nwant:\n%s", got, want);
    check_parses("root $ref", got);
    free(got);
    free(llama);
}

typedef struct {
    const char *schema, *message;
} refusal;

static const refusal REFUSALS[] = {
    /* keywords llama drops silently */
    {"{\"type\":\"string\",\"format\":\"email\"}", "unsupported format \"email\" at /format"},
    {"{\"type\":\"number\",\"minimum\":0}", "keyword \"minimum\" at /minimum is not supported for type \"number\""},
    {"{\"type\":\"integer\",\"multipleOf\":3}", "unsupported keyword \"multipleOf\" at /multipleOf"},
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]+$\",\"minLength\":2}",
     "keyword \"minLength\" at /minLength is not supported together with \"pattern\""},
    {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"minProperties\":1}",
     "unsupported keyword \"minProperties\" at /minProperties"},
    {"{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}",
     "unsupported keyword \"uniqueItems\" at /uniqueItems"},
    {"{\"not\":{\"type\":\"string\"}}", "unsupported keyword \"not\" at /not"},
    {"{\"type\":\"string\",\"x-foo\":1}", "unsupported keyword \"x-foo\" at /x-foo"},
    {"{\"type\":\"object\",\"required\":[\"a\"]}",
     "keyword \"required\" at /required is not supported for type \"object\""},
    {"{\"const\":\"abc\",\"maxLength\":2}", "keyword \"maxLength\" at /maxLength is not supported together with \"const\""},
    {"{\"type\":\"string\",\"enum\":[\"a\",1]}",
     "keyword \"type\" at /type is not honoured together with \"enum\" (values of other types would pass)"},
    {"{\"prefixItems\":[{\"type\":\"string\"}],\"items\":{\"type\":\"integer\"}}",
     "keyword \"prefixItems\" at /prefixItems is not supported together with \"items\""},
    {"{\"prefixItems\":[{\"type\":\"string\"}],\"minItems\":2}",
     "minItems/maxItems at (root) contradict the 1-item tuple (llama ignores them)"},
    {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
     "required property \"b\" at /required/0 is not declared in \"properties\""},
    {"{\"anyOf\":[{\"type\":\"string\"}],\"oneOf\":[{\"type\":\"null\"}]}",
     "\"oneOf\" and \"anyOf\" at (root) cannot be combined"},
    {"{\"type\":\"integer\",\"minimum\":0,\"exclusiveMinimum\":0}",
     "\"minimum\" and \"exclusiveMinimum\" at (root) cannot be combined"},
    {"{\"properties\":{\"a\":{\"$id\":\"x\"}}}", "unsupported keyword \"$id\" at /properties/a/$id (only the root may have one)"},
    /* $ref */
    {"{\"$ref\":\"https://example.com/schema.json\"}", "remote $ref \"https://example.com/schema.json\" at /$ref is not supported"},
    {"{\"$ref\":\"other.json#/a\"}", "unsupported $ref \"other.json#/a\" at /$ref (only \"#/...\" pointers into this document)"},
    {"{\"$ref\":\"#\"}", "unsupported $ref \"#\" at /$ref (only \"#/...\" pointers into this document)"},
    {"{\"$ref\":\"#/$defs/missing\",\"$defs\":{}}", "$ref \"#/$defs/missing\" at /$ref does not resolve: no \"missing\""},
    {"{\"$ref\":\"#/$defs/~2\",\"$defs\":{}}",
     "$ref \"#/$defs/~2\" at /$ref: malformed JSON pointer ('~' must be followed by 0 or 1)"},
    {"{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/a-b\"},\"y\":{\"$ref\":\"#/$defs/a_b\"}},"
     "\"$defs\":{\"a-b\":{\"type\":\"object\",\"properties\":{\"s\":{}}},\"a_b\":{\"type\":\"object\",\"properties\":{\"t\":{}}}}}",
     "$ref \"#/$defs/a_b\" at /properties/y/$ref: its rule name \"ref-defs-a-b\" is already taken by another "
     "definition or property (llama would silently reuse it)"},
    /* patterns */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"abc\"}}}",
     "pattern \"abc\" at /properties/a/pattern must start with '^' and end with '$' (llama only translates anchored patterns)"},
    {"{\"type\":\"string\",\"pattern\":\"^a.b$\"}",
     "pattern \"^a.b$\" at /pattern: '.' is not supported (llama translates it to [^\\x0A\\x0D], which also matches "
     "'\"' and '\\' and breaks the JSON string; use a class such as [^\"\\\\\\x00-\\x1F]) at index 2"},
    {"{\"type\":\"string\",\"pattern\":\"^\\\\d{3}$\"}",
     "pattern \"^\\d{3}$\" at /pattern: escape \"\\d\" is not supported (llama copies it into the grammar verbatim; "
     "write classes like [0-9] instead) at index 1"},
    {"{\"type\":\"string\",\"pattern\":\"^[^@]+$\"}",
     "pattern \"^[^@]+$\" at /pattern: negated character class must exclude '\"', '\\' and \\x00-\\x1F "
     "(e.g. [^\"\\\\\\x00-\\x1F]), or it would break the JSON string at index 1"},
    {"{\"type\":\"string\",\"pattern\":\"^[ -~]+$\"}",
     "pattern \"^[ -~]+$\" at /pattern: character class can match '\"', '\\' or a control character, which would "
     "break the JSON string at index 1"},
    {"{\"type\":\"string\",\"pattern\":\"^(?:ab)$\"}",
     "pattern \"^(?:ab)$\" at /pattern: \"(?\" groups (lookarounds, non-capturing) are not supported at index 1"},
    {"{\"type\":\"string\",\"pattern\":\"^a\\\\.+$\"}",
     "pattern \"^a\\.+$\" at /pattern: quantifier after an escaped character (llama would repeat the whole "
     "preceding literal; wrap the character in a group) at index 4"},
    {"{\"type\":\"string\",\"pattern\":\"^[a-z]{,3}$\"}",
     "pattern \"^[a-z]{,3}$\" at /pattern: only {n}, {n,} and {n,m} quantifiers are supported at index 6"},
    {"{\"type\":\"string\",\"pattern\":\"^a{2}{3}$\"}", "pattern \"^a{2}{3}$\" at /pattern: quantifier after a quantifier at index 5"},
    {"{\"type\":\"string\",\"pattern\":\"^a\\\"b$\"}",
     "pattern \"^a\"b$\" at /pattern: '\"' is not supported (it would end the JSON string) at index 2"},
    {"{\"type\":\"string\",\"pattern\":\"^(ab$\"}", "pattern \"^(ab$\" at /pattern: unclosed '(' at index 4"},
    {"{\"type\":\"string\",\"pattern\":\"^ab)$\"}", "pattern \"^ab)$\" at /pattern: unbalanced ')' at index 3"},
    {"{\"type\":\"string\",\"pattern\":\"^a]$\"}", "pattern \"^a]$\" at /pattern: unbalanced bracket at index 2"},
    {"{\"type\":\"string\",\"pattern\":\"^a^b$\"}", "pattern \"^a^b$\" at /pattern: anchor inside the pattern at index 2"},
    {"{\"type\":\"string\",\"pattern\":\"^*a$\"}", "pattern \"^*a$\" at /pattern: quantifier with nothing to repeat at index 1"},
    {"{\"type\":\"string\",\"pattern\":\"^[a\\\\-z]$\"}",
     "pattern \"^[a\\-z]$\" at /pattern: escape \"\\-\" in a character class is not supported at index 3"},
    {"{\"type\":\"string\",\"pattern\":\"^a\\\\$\"}", "pattern \"^a\\$\" at /pattern: trailing backslash at index 2"},
    /* objects, allOf */
    {"{\"type\":\"object\",\"properties\":{\"a\":true}}",
     "schema at /properties/a must be a JSON object (boolean schemas are not supported)"},
    {"{\"properties\":{\"a\\\"b\":{}},\"additionalProperties\":true}",
     "property at /properties/a\"b cannot be combined with additionalProperties: its name contains '\"'"},
    {"{\"properties\":{\"\":{}}}",
     "property at /properties/: an empty property name is not supported in a top-level object (llama would name its "
     "rule \"root\")"},
    {"{\"type\":\"object\",\"additionalProperties\":3}",
     "\"additionalProperties\" at /additionalProperties must be a boolean or a schema"},
    {"{\"allOf\":[{\"properties\":{\"a\":{}}},{\"properties\":{\"a\":{}}}]}",
     "property at /allOf/1/properties/a is declared twice across allOf"},
    {"{\"allOf\":[{\"enum\":[\"a\"]},{\"enum\":[\"b\"]}]}", "the enums of allOf at /allOf have no value in common"},
    {"{\"allOf\":[{\"properties\":{\"a\":{}}},{\"minProperties\":1}]}",
     "allOf entry at /allOf/1 must have \"properties\" or \"enum\" (llama ignores anything else)"},
    {"{\"allOf\":[{\"anyOf\":[{\"properties\":{\"a\":{}},\"required\":[\"a\"]}]}]}",
     "\"required\" at /allOf/0/anyOf/0/required inside anyOf within allOf is not supported (llama makes these "
     "properties optional)"},
    /* malformed values */
    {"{\"type\":\"integer\",\"minimum\":1.5}", "\"minimum\" at /minimum must be an integer of at most 16 digits"},
    {"{\"type\":\"integer\",\"minimum\":100000000000000000}", "\"minimum\" at /minimum must be an integer of at most 16 digits"},
    {"{\"type\":\"integer\",\"minimum\":10,\"maximum\":5}", "no integer satisfies the bounds at (root)"},
    {"{\"type\":\"string\",\"maxLength\":2,\"minLength\":3}", "minLength exceeds maxLength at (root)"},
    {"{\"type\":\"array\",\"items\":{},\"minItems\":3,\"maxItems\":2}", "minItems exceeds maxItems at (root)"},
    {"{\"type\":\"string\",\"minLength\":-1}", "\"minLength\" at /minLength must be a non-negative integer (at most 1000000000)"},
    {"{\"type\":\"string\",\"format\":5}", "\"format\" at /format must be a string"},
    {"{\"anyOf\":[]}", "\"anyOf\" at /anyOf must be a non-empty array of schemas"},
    {"{\"enum\":[]}", "\"enum\" at /enum must be a non-empty array"},
    {"{\"type\":\"foo\"}", "unsupported type \"foo\" at /type"},
    {"{\"type\":[]}", "\"type\" at /type must be a type name or a non-empty array of them"},
    {"[1,2]", "the document must be a JSON object"},
    {"{\"a\":1,\"a\":2}", "invalid JSON at line 1, column 10: duplicate object key near '\"a\"'"},
};

static void test_refusals(void) {
    for (size_t i = 0; i < sizeof REFUSALS / sizeof REFUSALS[0]; i++) {
        mu_error err = {0};
        char *got = convert(REFUSALS[i].schema, &err);
        char want[1100];
        snprintf(want, sizeof want, "json schema: %s", REFUSALS[i].message);
        CHECK_MSG(got == NULL, "accepted %s", REFUSALS[i].schema);
        CHECK_MSG(strcmp(err.msg, want) == 0, "%s\n  got:  %s\n  want: %s", REFUSALS[i].schema, err.msg, want);
        free(got);
    }
    /* err may be NULL */
    CHECK(convert("{\"not\":{}}", NULL) == NULL);
}

/* Keywords that only constrain other types are ignored, as JSON Schema says. */
static void test_vacuous_keywords(void) {
    static const char *const OK[] = {
        "{\"type\":\"integer\",\"minLength\":5,\"format\":\"int64\",\"items\":{}}",
        "{\"type\":[\"string\",\"null\"],\"minItems\":3,\"maxLength\":2}",
        "{\"type\":\"string\",\"properties\":{\"a\":{}},\"minimum\":1}",
        "{\"type\":\"object\",\"additionalProperties\":true,\"maxLength\":1}",
    };
    for (size_t i = 0; i < sizeof OK / sizeof OK[0]; i++) {
        mu_error err = {0};
        char *got = convert(OK[i], &err);
        CHECK_MSG(got != NULL, "%s: %s", OK[i], err.msg);
        free(got);
    }
}

/* ---- meaning, through the GBNF matcher ---- */

typedef struct {
    mu_grammar *g;
} compiled;

static compiled compile(const char *schema) {
    compiled c = {0};
    mu_error err = {0};
    char *text = convert(schema, &err);
    CHECK_MSG(text != NULL, "%s: %s", schema, err.msg);
    if (!text) return c;
    c.g = mu_grammar_parse(text, strlen(text), NULL, &err);
    CHECK_MSG(c.g != NULL, "%s: %s", schema, err.msg);
    free(text);
    return c;
}

static bool accepts(const compiled *c, const char *json) {
    if (!c->g) return false;
    mu_error err = {0};
    mu_grammar_state *s = mu_grammar_state_new(c->g, &err);
    bool ok = s && mu_grammar_accept_bytes(s, json, strlen(json), &err) && mu_grammar_is_complete(s);
    mu_grammar_state_free(s);
    return ok;
}

static void check_int_range(const char *schema, long long lo, long long hi, long long from, long long to) {
    compiled c = compile(schema);
    int wrong = 0;
    for (long long v = from; v <= to && c.g; v++) {
        char num[32];
        snprintf(num, sizeof num, "%lld", v);
        bool want = v >= lo && v <= hi;
        if (accepts(&c, num) != want && wrong++ < 5)
            fprintf(stderr, "%s: %s %s\n", schema, num, want ? "rejected" : "accepted");
    }
    CHECK_MSG(wrong == 0, "%s: %d wrong", schema, wrong);
    mu_grammar_free(c.g);
}

static void test_integer_ranges(void) {
    const long long BIG = 9999999999999999LL;
    check_int_range("{\"type\":\"integer\",\"minimum\":-57,\"maximum\":123}", -57, 123, -400, 400);
    check_int_range("{\"type\":\"integer\",\"exclusiveMinimum\":-1000,\"exclusiveMaximum\":-13}", -999, -14, -1500, 50);
    check_int_range("{\"type\":\"integer\",\"minimum\":25}", 25, BIG, -50, 3000);   /* llama's text */
    check_int_range("{\"type\":\"integer\",\"minimum\":-100}", -100, BIG, -3000, 3000);
    check_int_range("{\"type\":\"integer\",\"maximum\":100}", -BIG, 100, -3000, 3000);
    /* llama's own grammars accept 10..99 and 981..9999 here: */
    check_int_range("{\"type\":\"integer\",\"minimum\":100}", 100, BIG, -50, 3000);
    check_int_range("{\"type\":\"integer\",\"minimum\":98081}", 98081, BIG, 97000, 99000);
    check_int_range("{\"type\":\"integer\",\"maximum\":-5}", -BIG, -5, -3000, 50);

    compiled c = compile("{\"type\":\"integer\",\"maximum\":-5}");
    CHECK(!accepts(&c, "-05"));  /* llama's grammar takes it: not JSON */
    CHECK(accepts(&c, "-9999999999999999"));
    mu_grammar_free(c.g);
    c = compile("{\"type\":\"integer\",\"minimum\":100}");
    CHECK(accepts(&c, "9999999999999999"));
    CHECK(!accepts(&c, "10000000000000000"));  /* past llama's 16-digit integers */
    mu_grammar_free(c.g);
}

static void test_extra_keys(void) {
    compiled c = compile("{\"properties\":{\"and\":{\"type\":\"null\"},\"also\":{\"type\":\"null\"},"
                         "\"z\":{\"type\":\"null\"}},\"additionalProperties\":true}");
    CHECK(accepts(&c, "{\"x\":1}"));
    CHECK(accepts(&c, "{\"and\":null}"));
    CHECK(accepts(&c, "{\"ax\":[1]}"));
    CHECK(accepts(&c, "{\"andy\":[1]}"));
    /* llama's key rule also refuses proper prefixes of declared names:
     * narrower than the schema, never wrong. */
    CHECK(!accepts(&c, "{\"an\":[1]}"));
    CHECK(accepts(&c, "{\"also\":null, \"zz\":\"q\"}"));
    CHECK(!accepts(&c, "{\"and\":1}"));    /* declared key is not an extra key */
    CHECK(!accepts(&c, "{\"z\":true}"));
    CHECK(!accepts(&c, "{\"\\\":1}"));     /* {"\":1}: llama's grammar takes it */
    CHECK(!accepts(&c, "{\"\x01\":1}"));
    mu_grammar_free(c.g);
}

static void test_strings_and_enums(void) {
    compiled c = compile("{\"type\":\"string\",\"pattern\":\"^[0-9]{5}(-[0-9]{4})?$\"}");
    CHECK(accepts(&c, "\"12345\""));
    CHECK(accepts(&c, "\"12345-6789\""));
    CHECK(!accepts(&c, "\"1234\""));
    CHECK(!accepts(&c, "\"123456\""));
    CHECK(!accepts(&c, "\"12345-678\""));
    mu_grammar_free(c.g);

    c = compile("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    CHECK(!accepts(&c, "\"a\""));
    CHECK(accepts(&c, "\"ab\""));
    CHECK(accepts(&c, "\"a\\nb\""));
    CHECK(!accepts(&c, "\"abcd\""));
    mu_grammar_free(c.g);

    c = compile("{\"enum\":[\"a\\\"b\", 1.5, null, {\"k\": [true]}]}");
    CHECK(accepts(&c, "\"a\\\"b\""));
    CHECK(accepts(&c, "1.5"));
    CHECK(accepts(&c, "null"));
    CHECK(accepts(&c, "{\"k\": [true]}"));
    CHECK(!accepts(&c, "\"ab\""));
    CHECK(!accepts(&c, "1.50"));
    mu_grammar_free(c.g);

    c = compile("{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}");
    CHECK(!accepts(&c, "[]"));
    CHECK(accepts(&c, "[true]"));
    CHECK(accepts(&c, "[true, false]"));
    CHECK(!accepts(&c, "[true,false,true]"));
    mu_grammar_free(c.g);
}

/* Repeating a group that can match "" (json_schema.c, pat_item.ne): llama
 * writes "(a|)+" as ("a" |)+, which GBNF parsers refuse as left recursion.
 * Each pattern's grammar must parse and accept exactly the strings PCRE2
 * matches, over every string of a, b, c up to length 6. */
static void check_pattern_language(const char *pattern) {
    char schema[512];
    snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"%s\"}", pattern);
    compiled c = compile(schema);
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &errcode, &erroff, NULL);
    CHECK_MSG(re != NULL, "%s: PCRE2 refuses it", pattern);
    if (!c.g || !re) {
        mu_grammar_free(c.g);
        pcre2_code_free(re);
        return;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int wrong = 0, matched = 0;
    for (int len = 0; len <= 6; len++) {
        int total = 1;
        for (int k = 0; k < len; k++) total *= 3;
        for (int code = 0; code < total; code++) {
            char s[8], json[16];
            for (int k = 0, v = code; k < len; k++, v /= 3) s[k] = (char)('a' + v % 3);
            s[len] = '\0';
            snprintf(json, sizeof json, "\"%s\"", s);
            bool want = pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)len, 0, 0, md, NULL) >= 0;
            matched += want;
            if (accepts(&c, json) != want && wrong++ < 5)
                fprintf(stderr, "%s: \"%s\" %s\n", pattern, s, want ? "rejected" : "accepted");
        }
    }
    CHECK_MSG(wrong == 0, "%s: %d strings judged differently from PCRE2", pattern, wrong);
    CHECK_MSG(matched > 0, "%s: PCRE2 matches nothing, the comparison is vacuous", pattern);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    mu_grammar_free(c.g);
}

static void test_nullable_repetition(void) {
    static const char *const PATTERNS[] = {
        "^(a|)+$",          "^(a|)*b$",         "^(|ab)+c?$",       "^(a?)+$",
        "^(a*)+b$",         "^(a?b?)+c$",       "^((a|)(b|))*$",    "^(a|){2,3}$",
        "^(a?){2,}b$",      "^(a|b?){0,2}c$",   "^((a|)+)+$",       "^(a|b|)+c$",
        "^()+a$",           "^(a{0})*b$",       "^((ab|)c?){1,2}$", "^(a*b*){2}c?$",
        "^([ab]?|c)+$",     "^(a(b|)|)+c$",     "^((a|)b)+$",       "^(a|)?b$",
        "^(a{0,2}){2}b?$",  "^((c|)(a?)+)*b$",  "^(a|)+?b$",        "^(a?){3}$",
    };
    for (size_t i = 0; i < sizeof PATTERNS / sizeof PATTERNS[0]; i++) check_pattern_language(PATTERNS[i]);

    compiled c = compile("{\"type\":\"string\",\"pattern\":\"^f(orboa|)+baz*qux?$\"}");
    static const char *const YES[] = {"\"fbaqu\"", "\"forboabazzqux\"", "\"forboaorboabaqu\"",
                                      "\"fbazzzqux\"", "\"forboabaqux\""};
    static const char *const NO[] = {"\"fbaz\"", "\"forbobaqu\"", "\"forboaorbbaqu\"", "\"baqu\"",
                                     "\"fbaquxx\"", "\"forboaforboabaqu\"", "\"\""};
    for (size_t i = 0; i < sizeof YES / sizeof YES[0]; i++) CHECK_MSG(accepts(&c, YES[i]), "rejected %s", YES[i]);
    for (size_t i = 0; i < sizeof NO / sizeof NO[0]; i++) CHECK_MSG(!accepts(&c, NO[i]), "accepted %s", NO[i]);
    mu_grammar_free(c.g);

    /* inside an object, next to other properties */
    c = compile("{\"type\":\"object\",\"properties\":{\"w\":{\"type\":\"string\",\"pattern\":\"^(x?y?)+z$\"},"
                "\"n\":{\"type\":\"integer\"}},\"required\":[\"w\",\"n\"]}");
    CHECK(accepts(&c, "{\"w\":\"z\",\"n\":1}"));
    CHECK(accepts(&c, "{\"w\":\"yxxyz\",\"n\":1}"));
    CHECK(!accepts(&c, "{\"w\":\"yx\",\"n\":1}"));
    CHECK(!accepts(&c, "{\"w\":\"zz\",\"n\":1}"));
    mu_grammar_free(c.g);
}

/* ---- additionalProperties next to very long property names ----
 * llama's "any other key" rule nests one group per character of the longest
 * declared name; past KEY_TRIE_NESTED_MAX (json_schema.c) muser writes a
 * flat rule per trie node instead. The grammar must parse and refuse as an
 * extra key exactly the declared names. */

static char *repeat_str(const char *unit, size_t n) {
    size_t u = strlen(unit);
    char *s = malloc(u * n + 1);
    for (size_t i = 0; i < n; i++) memcpy(s + i * u, unit, u);
    s[u * n] = '\0';
    return s;
}

/* {"k1": v1, "k2": v2} (k2 may be NULL) */
static char *obj2(const char *k1, const char *v1, const char *k2, const char *v2) {
    size_t n = strlen(k1) + strlen(v1) + (k2 ? strlen(k2) + strlen(v2) : 0) + 16;
    char *s = malloc(n);
    if (k2) snprintf(s, n, "{\"%s\":%s,\"%s\":%s}", k1, v1, k2, v2);
    else snprintf(s, n, "{\"%s\":%s}", k1, v1);
    return s;
}

static void check_obj(const compiled *c, const char *k1, const char *v1, const char *k2, const char *v2,
                      bool want, const char *what) {
    char *json = obj2(k1, v1, k2, v2);
    CHECK_MSG(accepts(c, json) == want, "%s (%zu-byte key): %s", what, strlen(k2 ? k2 : k1),
              want ? "rejected" : "accepted");
    free(json);
}

/* One declared string property `name` (spelled `declared` in JSON output:
 * llama's key literals escape non-ASCII characters), extra keys with
 * integer values. `flat`: past KEY_TRIE_NESTED_MAX, where also the proper
 * prefixes of the name and keys starting with an escape are extra keys
 * (llama's nested rule refuses them: narrower, kept for shorter names). */
static void check_long_key(const char *schema_fmt, const char *name, const char *declared, bool flat) {
    char *schema = malloc(strlen(schema_fmt) + strlen(name) + 1);
    sprintf(schema, schema_fmt, name);
    compiled c = compile(schema);
    size_t n = strlen(name);
    /* cut at code point boundaries: the first one, all but the last one */
    size_t first = 1, last = n - 1;
    while ((name[first] & 0xC0) == 0x80) first++;
    while ((name[last] & 0xC0) == 0x80) last--;
    char *prefix = strdup(name), *shorter = strdup(name), *longer = malloc(n + 2), *changed = strdup(name);
    prefix[first] = '\0';
    shorter[last] = '\0';
    memcpy(longer, name, n);
    longer[n] = 'q';
    longer[n + 1] = '\0';
    changed[last] = changed[last] == 'q' ? 'r' : 'q';
    changed[last + 1] = '\0';
    check_obj(&c, declared, "\"s\"", NULL, NULL, true, "declared key");
    check_obj(&c, name, "1", NULL, NULL, false, "declared key with an extra key's value");
    check_obj(&c, declared, "\"s\"", name, "1", false, "declared key again as an extra key");
    check_obj(&c, shorter, "1", NULL, NULL, flat, "prefix one character short");
    check_obj(&c, prefix, "1", NULL, NULL, flat, "one-character prefix");
    check_obj(&c, "", "1", NULL, NULL, true, "empty key");
    check_obj(&c, longer, "1", NULL, NULL, true, "extension");
    check_obj(&c, changed, "1", NULL, NULL, true, "last character changed");
    check_obj(&c, declared, "\"s\"", longer, "2", true, "declared key, then an extension");
    check_obj(&c, changed, "\"s\"", NULL, NULL, false, "extra key with a string value");
    check_obj(&c, "\\n", "1", NULL, NULL, flat, "key starting with an escape");
    check_obj(&c, "\\u0041", "1", NULL, NULL, flat, "key starting with a \\u escape");
    check_obj(&c, "\\", "1", NULL, NULL, false, "raw backslash (invalid JSON)");
    free(prefix);
    free(shorter);
    free(longer);
    free(changed);
    mu_grammar_free(c.g);
    free(schema);
}

static void test_long_property_names(void) {
    static const char PLAIN[] = "{\"type\":\"object\",\"properties\":{\"%s\":{\"type\":\"string\"}},"
                                "\"additionalProperties\":{\"type\":\"integer\"}}";
    const size_t LENGTHS[] = {200, 201, 300, 1000};
    for (size_t i = 0; i < sizeof LENGTHS / sizeof LENGTHS[0]; i++) {
        char *k = repeat_str("k", LENGTHS[i]);
        check_long_key(PLAIN, k, k, LENGTHS[i] > 200);
        free(k);
    }
    char *mixed = repeat_str("ab-+.", 100);
    check_long_key(PLAIN, mixed, mixed, true);
    free(mixed);
    /* multi-byte characters: one trie node per code point */
    char *wide = repeat_str("\u00e9\u2713", 150), *wide_json = repeat_str("\\u00e9\\u2713", 150);
    check_long_key(PLAIN, wide, wide_json, true);
    free(wide);
    free(wide_json);

    /* several names sharing long prefixes; a node whose children are '+',
     * '-' and '.' (a class "+-." would be a range and refuse ',') */
    char *p = repeat_str("x", 260);
    size_t n = strlen(p);
    char schema[4096];
    snprintf(schema, sizeof schema,
             "{\"type\":\"object\",\"properties\":{\"%s\":{\"type\":\"null\"},\"%s+\":{\"type\":\"null\"},"
             "\"%s-a\":{\"type\":\"null\"},\"%s.\":{\"type\":\"null\"},\"x\":{\"type\":\"null\"},"
             "\"xy\":{\"type\":\"null\"}},\"additionalProperties\":true}",
             p, p, p, p);
    compiled c = compile(schema);
    char *key = malloc(n + 4);
    static const struct {
        const char *suffix;
        bool declared;
    } TAILS[] = {{"", true}, {"+", true}, {"-a", true}, {".", true}, {",", false}, {"-", false},
                 {"-ab", false}, {"+a", false}, {"..", false}, {"/", false}, {"*", false}};
    for (size_t i = 0; i < sizeof TAILS / sizeof TAILS[0]; i++) {
        snprintf(key, n + 4, "%s%s", p, TAILS[i].suffix);
        check_obj(&c, key, "null", NULL, NULL, true, TAILS[i].suffix);
        check_obj(&c, key, "[1]", NULL, NULL, !TAILS[i].declared, TAILS[i].suffix);
    }
    check_obj(&c, "x", "[1]", NULL, NULL, false, "short declared name");
    check_obj(&c, "xy", "[1]", NULL, NULL, false, "short declared name");
    check_obj(&c, "xx", "[1]", NULL, NULL, true, "short prefix");
    check_obj(&c, "xz", "[1]", NULL, NULL, true, "short other key");
    check_obj(&c, "xyz", "[1]", NULL, NULL, true, "short extension");
    free(key);
    mu_grammar_free(c.g);

    /* a nested object, with a required long name */
    char *q = repeat_str("\u00fc", 300), *q_json = repeat_str("\\u00fc", 300);
    char *inner = malloc(strlen(q) * 2 + 256);
    sprintf(inner, "{\"type\":\"object\",\"properties\":{\"o\":{\"type\":\"object\",\"properties\":{\"%s\":"
                   "{\"type\":\"string\"}},\"required\":[\"%s\"],\"additionalProperties\":{\"type\":\"integer\"}}}}",
            q, q);
    c = compile(inner);
    char *v = malloc(strlen(q_json) * 2 + 64);
    sprintf(v, "{\"o\":{\"%s\":\"s\",\"a\":1}}", q_json);
    CHECK_MSG(accepts(&c, v), "nested: rejected %.40s", v);
    sprintf(v, "{\"o\":{\"%s\":\"s\",\"%s\":1}}", q_json, q);
    CHECK_MSG(!accepts(&c, v), "nested: accepted the declared name as an extra key");
    sprintf(v, "{\"o\":{\"a\":1}}");
    CHECK_MSG(!accepts(&c, v), "nested: accepted a missing required name");
    free(v);
    free(inner);
    mu_grammar_free(c.g);
    free(q);
    free(q_json);

    /* two objects whose flat key rules differ only in the last name */
    char *a = repeat_str("k", 210), *b = repeat_str("k", 210);
    b[209] = 'j';
    char *two = malloc(1024), *val = malloc(1024);
    snprintf(two, 1024, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"%s\":{}},"
             "\"additionalProperties\":{\"type\":\"integer\"}},\"b\":{\"type\":\"object\",\"properties\":"
             "{\"%s\":{}},\"additionalProperties\":{\"type\":\"integer\"}}}}", a, b);
    c = compile(two);
    snprintf(val, 1024, "{\"a\":{\"%s\":1},\"b\":{\"%s\":1}}", b, a);
    CHECK_MSG(accepts(&c, val), "two objects: rejected each other's names as extra keys");
    snprintf(val, 1024, "{\"a\":{\"%s\":\"s\"},\"b\":{\"%s\":1}}", a, b);
    CHECK_MSG(!accepts(&c, val), "two objects: accepted b's own name as its extra key");
    snprintf(val, 1024, "{\"a\":{\"%s\":\"s\",\"%s\":1}}", a, a);
    CHECK_MSG(!accepts(&c, val), "two objects: accepted a's own name as its extra key");
    mu_grammar_free(c.g);
    free(two);
    free(val);
    free(a);
    free(b);
    free(p);
}

int main(void) {
    test_corpus();
    test_patch_scope();
    test_root_ref();
    test_refusals();
    test_vacuous_keywords();
    test_integer_ranges();
    test_extra_keys();
    test_strings_and_enums();
    test_nullable_repetition();
    test_long_property_names();
    TEST_MAIN_END();
}
