/* JSON Schema -> GBNF in llama.cpp's dialect; json_schema.h says what is
 * supported, refused and deliberately different.
 *
 * The code follows the structure of llama's converter so the two can be
 * compared case by case: visit() tries the same cases in the same order, and
 * every helper adds its rules in the same order as llama's, because a rule
 * name that is already taken by a different body gets a number appended in
 * insertion order. On top of that, every schema object is checked after its
 * case is chosen: each keyword must be an annotation, honoured by that case,
 * or irrelevant to the types the produced rule can generate; anything else
 * is refused with its JSON pointer. */
#include "grammar/json_schema.h"

#include <jansson.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Formatted strings and string lists (text is built in an mu_buf,          */
/* src/util/common.h)                                                          */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = mu_xmalloc(n > 0 ? (size_t)n + 1 : 1);
    va_start(ap, fmt);
    vsnprintf(s, n > 0 ? (size_t)n + 1 : 1, fmt, ap);
    va_end(ap);
    return s;
}

typedef struct {
    char **v;
    size_t n, cap;
} strlist;

static void sl_push(strlist *l, const char *s) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->v = mu_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = mu_xstrdup(s);
}

static long sl_find(const strlist *l, const char *s) {
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->v[i], s) == 0) return (long)i;
    return -1;
}

static void sl_free(strlist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    *l = (strlist){0};
}

/* jansson hands out valid UTF-8 only, so the lead byte gives the length. */
static size_t utf8_decode(const char *s, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) { *cp = u[0]; return 1; }
    if (u[0] < 0xE0) { *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); return 2; }
    if (u[0] < 0xF0) {
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

/* ------------------------------------------------------------------------ */
/* JSON pointers for error messages                                          */

static char *ptr_key(const char *base, const char *key) {
    mu_buf b = {0};
    mu_buf_puts(&b, base);
    mu_buf_putc(&b, '/');
    for (const char *p = key; *p; p++) {
        if (*p == '~') mu_buf_puts(&b, "~0");
        else if (*p == '/') mu_buf_puts(&b, "~1");
        else mu_buf_putc(&b, *p);
    }
    return mu_buf_take(&b);
}

static char *ptr_index(const char *base, size_t i) { return str_printf("%s/%zu", base, i); }

/* The root's pointer is "", which reads badly in a sentence. */
static const char *where(const char *path) { return path[0] ? path : "(root)"; }

/* ------------------------------------------------------------------------ */
/* Python's json.dumps (ensure_ascii, ", " and ": " separators), which llama's
 * Python converter uses for enum / const values and property-name literals */

static void py_dump_string(mu_buf *b, const char *s, size_t len) {
    mu_buf_putc(b, '"');
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += utf8_decode(s + i, &cp);
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
        if (cp >= 0x20 && cp < 0x7F) {
            mu_buf_putc(b, (char)cp);
        } else if (cp < 0x10000) {
            mu_buf_appendf(b, "\\u%04x", (unsigned)cp);
        } else {
            uint32_t v = cp - 0x10000;
            mu_buf_appendf(b, "\\u%04x\\u%04x", (unsigned)(0xD800 | (v >> 10)), (unsigned)(0xDC00 | (v & 0x3FF)));
        }
    }
    mu_buf_putc(b, '"');
}

/* repr(float): the shortest digits that read back to x, positional notation
 * for decimal exponents -4..15, else d.ddde+XX; always a '.' or an 'e'. */
static void py_float_repr(mu_buf *b, double x) {
    if (x == 0) {
        mu_buf_puts(b, signbit(x) ? "-0.0" : "0.0");
        return;
    }
    char buf[48];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    char digits[24];
    int nd = 0;
    const char *s = buf;
    if (*s == '-') {
        mu_buf_putc(b, '-');
        s++;
    }
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && nd < 20) digits[nd++] = *s;
    int exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            mu_buf_puts(b, "0.");
            for (int i = 0; i < -exp10 - 1; i++) mu_buf_putc(b, '0');
            mu_buf_append(b, digits, (size_t)nd);
            return;
        }
        for (int i = 0; i <= exp10; i++) mu_buf_putc(b, i < nd ? digits[i] : '0');
        mu_buf_putc(b, '.');
        if (nd > exp10 + 1) mu_buf_append(b, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        else mu_buf_putc(b, '0');
        return;
    }
    mu_buf_putc(b, digits[0]);
    if (nd > 1) {
        mu_buf_putc(b, '.');
        mu_buf_append(b, digits + 1, (size_t)(nd - 1));
    }
    mu_buf_appendf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
}

static void py_dumps(mu_buf *b, json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        bool first = true;
        mu_buf_putc(b, '{');
        json_object_foreach(v, k, x) {
            if (!first) mu_buf_puts(b, ", ");
            first = false;
            py_dump_string(b, k, strlen(k));
            mu_buf_puts(b, ": ");
            py_dumps(b, x);
        }
        mu_buf_putc(b, '}');
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *x;
        mu_buf_putc(b, '[');
        json_array_foreach(v, i, x) {
            if (i) mu_buf_puts(b, ", ");
            py_dumps(b, x);
        }
        mu_buf_putc(b, ']');
        break;
    }
    case JSON_STRING: py_dump_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: mu_buf_appendf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: py_float_repr(b, json_real_value(v)); break;
    case JSON_TRUE: mu_buf_puts(b, "true"); break;
    case JSON_FALSE: mu_buf_puts(b, "false"); break;
    case JSON_NULL: mu_buf_puts(b, "null"); break;
    }
}

/* A GBNF string literal: quotes, backslashes and line breaks escaped. */
static void add_literal(mu_buf *b, const char *s) {
    mu_buf_putc(b, '"');
    for (; *s; s++) {
        switch (*s) {
        case '\r': mu_buf_puts(b, "\\r"); break;
        case '\n': mu_buf_puts(b, "\\n"); break;
        case '"': mu_buf_puts(b, "\\\""); break;
        case '\\': mu_buf_puts(b, "\\\\"); break;
        default: mu_buf_putc(b, *s);
        }
    }
    mu_buf_putc(b, '"');
}

/* The rule text llama uses for an enum / const value. */
static void add_constant(mu_buf *b, json_t *v) {
    mu_buf dumped = {0};
    py_dumps(&dumped, v);
    add_literal(b, mu_buf_str(&dumped));
    mu_buf_free(&dumped);
}

/* ------------------------------------------------------------------------ */
/* Converter state, errors and the rule table                                */

typedef struct {
    char *name, *body;
} gbnf_rule;

/* One $ref seen so far: llama names its rule "ref" + the pointer. */
typedef struct {
    char *ref;
    char *ref_name;     /* the name llama gives it ("ref-defs-Foo") */
    char *rule;         /* what visiting the target returned (may differ) */
    unsigned types;
    bool done;          /* false while the target is being visited */
    bool used_recursively;
} ref_entry;

typedef struct {
    json_t *doc;
    gbnf_rule *rules;
    size_t n_rules, cap_rules;
    ref_entry *refs;
    size_t n_refs, cap_refs;
    bool failed;
    char msg[1024];
} converter;

/* Records the first refusal; later ones are consequences of it. */
static void vrefuse(converter *c, const char *fmt, va_list ap) {
    if (c->failed) return;
    c->failed = true;
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
}

/* The same, returning NULL for functions that return a rule or a node... */
static void *fail(converter *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *fail(converter *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrefuse(c, fmt, ap);
    va_end(ap);
    return NULL;
}

/* ...and false for those that return success. */
static bool refuse(converter *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool refuse(converter *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vrefuse(c, fmt, ap);
    va_end(ap);
    return false;
}

static long find_rule(const converter *c, const char *name) {
    for (size_t i = 0; i < c->n_rules; i++)
        if (strcmp(c->rules[i].name, name) == 0) return (long)i;
    return -1;
}

static const char *insert_rule(converter *c, char *owned_name, const char *body) {
    if (c->n_rules == c->cap_rules) {
        c->cap_rules = c->cap_rules ? c->cap_rules * 2 : 32;
        c->rules = mu_xrealloc(c->rules, c->cap_rules * sizeof *c->rules);
    }
    c->rules[c->n_rules].name = owned_name;
    c->rules[c->n_rules].body = mu_xstrdup(body);
    return c->rules[c->n_rules++].name;
}

/* Runs of characters outside [a-zA-Z0-9-] become one '-'. */
static char *sanitize_name(const char *name) {
    mu_buf b = {0};
    bool in_run = false;
    for (const char *p = name; *p; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-';
        if (ok) mu_buf_putc(&b, ch);
        else if (!in_run) mu_buf_putc(&b, '-');
        in_run = !ok;
    }
    return mu_buf_take(&b);
}

/* llama's _add_rule: reuse the name when free or holding the same body,
 * else the first of name0, name1, ... that is. The returned name lives as
 * long as the converter. */
static const char *add_rule(converter *c, const char *name, const char *body) {
    char *esc = sanitize_name(name);
    long at = find_rule(c, esc);
    if (at < 0) return insert_rule(c, esc, body);
    if (strcmp(c->rules[at].body, body) == 0) {
        free(esc);
        return c->rules[at].name;
    }
    for (unsigned i = 0;; i++) {
        char *key = str_printf("%s%u", esc, i);
        at = find_rule(c, key);
        if (at < 0) {
            free(esc);
            return insert_rule(c, key, body);
        }
        if (strcmp(c->rules[at].body, body) == 0) {
            free(esc);
            free(key);
            return c->rules[at].name;
        }
        free(key);
    }
}

/* llama's built-in rules, with the rules each one refers to. */
typedef struct {
    const char *name, *body;
    const char *deps[6];
} builtin_rule;

static const char SPACE_RULE[] = "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}";

static const builtin_rule BUILTINS[] = {
    {"boolean", "(\"true\" | \"false\") space", {0}},
    {"decimal-part", "[0-9]{1,16}", {0}},
    {"integral-part", "[0] | [1-9] [0-9]{0,15}", {0}},
    {"number", "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space",
     {"integral-part", "decimal-part"}},
    {"integer", "(\"-\"? integral-part) space", {"integral-part"}},
    {"value", "object | array | string | number | boolean | null",
     {"object", "array", "string", "number", "boolean", "null"}},
    {"object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space",
     {"string", "value"}},
    {"array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", {"value"}},
    {"uuid", "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
             "[0-9a-fA-F]{12} \"\\\"\" space", {0}},
    {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})", {0}},
    {"string", "\"\\\"\" char* \"\\\"\" space", {"char"}},
    {"null", "\"null\" space", {0}},
    /* string formats */
    {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )", {0}},
    {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? ( \"Z\" | "
             "( \"+\" | \"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )", {0}},
    {"date-time", "date \"T\" time", {"date", "time"}},
    {"date-string", "\"\\\"\" date \"\\\"\" space", {"date"}},
    {"time-string", "\"\\\"\" time \"\\\"\" space", {"time"}},
    {"date-time-string", "\"\\\"\" date-time \"\\\"\" space", {"date-time"}},
};

static const builtin_rule *find_builtin(const char *name) {
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (strcmp(BUILTINS[i].name, name) == 0) return &BUILTINS[i];
    return NULL;
}

/* Adds a built-in under `name` plus whatever it refers to that is missing. */
static const char *add_builtin_as(converter *c, const char *name, const char *builtin) {
    const builtin_rule *r = find_builtin(builtin);
    const char *got = add_rule(c, name, r->body);
    for (size_t i = 0; i < 6 && r->deps[i]; i++)
        if (find_rule(c, r->deps[i]) < 0) add_builtin_as(c, r->deps[i], r->deps[i]);
    return got;
}

static const char *add_builtin(converter *c, const char *name) { return add_builtin_as(c, name, name); }

/* Names llama never gives to a schema's own rule (it appends '-'). */
static bool is_reserved_name(const char *name) {
    return strcmp(name, "root") == 0 || strcmp(name, "dot") == 0 || find_builtin(name);
}

/* "parent-child", or "child" at the top level. */
static char *child_name(const char *name, const char *child) {
    return name[0] ? str_printf("%s-%s", name, child) : mu_xstrdup(child);
}

/* ------------------------------------------------------------------------ */
/* Keywords and the types they constrain                                     */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_FRAC = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64 };
#define T_NUM (T_INT | T_FRAC)
#define T_ALL 127u

typedef enum { KW_ANNOTATION, KW_ROOT_ID, KW_ANY, KW_STRING, KW_NUMBER, KW_ARRAY, KW_OBJECT } kw_class;

typedef struct {
    const char *name;
    kw_class cls;
    bool supported; /* honoured by some case of the converter */
} keyword_info;

static const keyword_info KEYWORDS[] = {
    /* annotations: they never constrain a value */
    {"title", KW_ANNOTATION, true}, {"description", KW_ANNOTATION, true}, {"$schema", KW_ANNOTATION, true},
    {"$comment", KW_ANNOTATION, true}, {"examples", KW_ANNOTATION, true}, {"default", KW_ANNOTATION, true},
    {"deprecated", KW_ANNOTATION, true}, {"readOnly", KW_ANNOTATION, true}, {"writeOnly", KW_ANNOTATION, true},
    /* definition containers: only read through $ref */
    {"$defs", KW_ANNOTATION, true}, {"definitions", KW_ANNOTATION, true},
    /* a nested $id would change what relative references mean */
    {"$id", KW_ROOT_ID, true},
    {"type", KW_ANY, true}, {"enum", KW_ANY, true}, {"const", KW_ANY, true}, {"anyOf", KW_ANY, true},
    {"oneOf", KW_ANY, true}, {"allOf", KW_ANY, true}, {"$ref", KW_ANY, true},
    {"not", KW_ANY, false}, {"if", KW_ANY, false}, {"then", KW_ANY, false}, {"else", KW_ANY, false},
    {"$anchor", KW_ANY, false}, {"$dynamicRef", KW_ANY, false}, {"$dynamicAnchor", KW_ANY, false},
    {"$recursiveRef", KW_ANY, false}, {"$recursiveAnchor", KW_ANY, false}, {"$vocabulary", KW_ANY, false},
    {"minLength", KW_STRING, true}, {"maxLength", KW_STRING, true}, {"pattern", KW_STRING, true},
    {"format", KW_STRING, true}, {"contentEncoding", KW_STRING, false}, {"contentMediaType", KW_STRING, false},
    {"contentSchema", KW_STRING, false},
    {"minimum", KW_NUMBER, true}, {"maximum", KW_NUMBER, true}, {"exclusiveMinimum", KW_NUMBER, true},
    {"exclusiveMaximum", KW_NUMBER, true}, {"multipleOf", KW_NUMBER, false},
    {"items", KW_ARRAY, true}, {"prefixItems", KW_ARRAY, true}, {"additionalItems", KW_ARRAY, true},
    {"minItems", KW_ARRAY, true}, {"maxItems", KW_ARRAY, true}, {"uniqueItems", KW_ARRAY, false},
    {"contains", KW_ARRAY, false}, {"minContains", KW_ARRAY, false}, {"maxContains", KW_ARRAY, false},
    {"unevaluatedItems", KW_ARRAY, false},
    {"properties", KW_OBJECT, true}, {"required", KW_OBJECT, true}, {"additionalProperties", KW_OBJECT, true},
    {"patternProperties", KW_OBJECT, false}, {"propertyNames", KW_OBJECT, false},
    {"minProperties", KW_OBJECT, false}, {"maxProperties", KW_OBJECT, false},
    {"dependentRequired", KW_OBJECT, false}, {"dependentSchemas", KW_OBJECT, false},
    {"dependencies", KW_OBJECT, false}, {"unevaluatedProperties", KW_OBJECT, false},
};

static const keyword_info *find_keyword(const char *name) {
    for (size_t i = 0; i < sizeof KEYWORDS / sizeof KEYWORDS[0]; i++)
        if (strcmp(KEYWORDS[i].name, name) == 0) return &KEYWORDS[i];
    return NULL;
}

static unsigned class_types(kw_class cls) {
    switch (cls) {
    case KW_STRING: return T_STR;
    case KW_NUMBER: return T_NUM;
    case KW_ARRAY: return T_ARR;
    case KW_OBJECT: return T_OBJ;
    default: return T_ALL;
    }
}

static unsigned type_bits(const char *name) {
    static const struct { const char *name; unsigned bits; } TYPES[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"integer", T_INT}, {"number", T_NUM},
        {"string", T_STR}, {"array", T_ARR}, {"object", T_OBJ},
    };
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (strcmp(TYPES[i].name, name) == 0) return TYPES[i].bits;
    return 0;
}

/* JSON Schema counts 2.0 as an integer. */
static unsigned value_types(json_t *v) {
    switch (json_typeof(v)) {
    case JSON_NULL: return T_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    case JSON_INTEGER: return T_INT;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? T_INT : T_FRAC;
    case JSON_STRING: return T_STR;
    case JSON_ARRAY: return T_ARR;
    case JSON_OBJECT: return T_OBJ;
    }
    return T_ALL;
}

/* What the case chosen for one schema object honours and produces. */
typedef struct {
    const char *consumed[8];
    unsigned types;      /* value types the produced rule can generate */
    char context[96];    /* ends "keyword K at P is not supported ..." */
    bool checked_by_alternatives;
} branch;

static void consume(branch *b, const char *keyword) {
    for (size_t i = 0; i < 8; i++)
        if (!b->consumed[i]) {
            b->consumed[i] = keyword;
            return;
        }
}

static bool is_consumed(const branch *b, const char *keyword) {
    for (size_t i = 0; i < 8 && b->consumed[i]; i++)
        if (strcmp(b->consumed[i], keyword) == 0) return true;
    return false;
}

/* The types "type" allows (all without it); refuses a malformed "type". */
static bool declared_types(converter *c, json_t *schema, const char *path, unsigned *out) {
    json_t *type = json_object_get(schema, "type");
    *out = T_ALL;
    if (!type) return true;
    char *at = ptr_key(path, "type");
    bool ok = true;
    if (json_is_string(type)) {
        *out = type_bits(json_string_value(type));
        if (!*out) ok = refuse(c, "unsupported type \"%s\" at %s", json_string_value(type), at);
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        size_t i;
        json_t *t;
        *out = 0;
        json_array_foreach(type, i, t) {
            unsigned bits = json_is_string(t) ? type_bits(json_string_value(t)) : 0;
            if (!bits) {
                ok = refuse(c, "\"type\" at %s: entry %zu is not a known type name", at, i);
                break;
            }
            *out |= bits;
        }
    } else {
        ok = refuse(c, "\"type\" at %s must be a type name or a non-empty array of them", at);
    }
    free(at);
    return ok;
}

static bool is_known_format(const char *f) {
    static const char *const FORMATS[] = {"date", "time", "date-time", "uuid", "uuid1",
                                          "uuid2", "uuid3", "uuid4", "uuid5"};
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++)
        if (strcmp(FORMATS[i], f) == 0) return true;
    return false;
}

static bool check_keyword(converter *c, const char *key, json_t *val, const char *path, const branch *b,
                          unsigned declared) {
    const keyword_info *kw = find_keyword(key);
    char *at = ptr_key(path, key);
    bool ok = true;
    if (!kw) {
        ok = refuse(c, "unsupported keyword \"%s\" at %s", key, at);
    } else if (kw->cls == KW_ANNOTATION) {
        /* never constrains */
    } else if (kw->cls == KW_ROOT_ID) {
        if (path[0]) ok = refuse(c, "unsupported keyword \"$id\" at %s (only the root may have one)", at);
    } else if (strcmp(key, "type") == 0) {
        if (b->types & ~declared)
            ok = refuse(c, "keyword \"type\" at %s is not honoured %s (values of other types would pass)", at,
                      b->context);
    } else if (is_consumed(b, key) || (strcmp(key, "additionalProperties") == 0 && json_is_true(val))) {
        /* honoured, or says nothing */
    } else if (!(class_types(kw->cls) & b->types)) {
        /* constrains only types this rule never produces */
    } else if (!kw->supported) {
        ok = refuse(c, "unsupported keyword \"%s\" at %s", key, at);
    } else if (strcmp(key, "format") == 0 && json_is_string(val) && !is_known_format(json_string_value(val))) {
        ok = refuse(c, "unsupported format \"%s\" at %s", json_string_value(val), at);
    } else {
        ok = refuse(c, "keyword \"%s\" at %s is not supported %s", key, at, b->context);
    }
    free(at);
    return ok;
}

static bool check_keywords(converter *c, json_t *schema, const char *path, const branch *b) {
    unsigned declared;
    if (!declared_types(c, schema, path, &declared)) return false;
    const char *key;
    json_t *val;
    json_object_foreach(schema, key, val) {
        if (!check_keyword(c, key, val, path, b, declared)) return false;
    }
    return true;
}

/* Inside allOf only `allowed` and annotations may appear (llama reads
 * nothing else there). */
static bool only_keys(converter *c, json_t *schema, const char *path, const char *const *allowed, size_t n) {
    const char *key;
    json_t *val;
    json_object_foreach(schema, key, val) {
        const keyword_info *kw = find_keyword(key);
        if (kw && kw->cls == KW_ANNOTATION) continue;
        bool ok = false;
        for (size_t i = 0; i < n; i++) ok = ok || strcmp(allowed[i], key) == 0;
        if (!ok) {
            char *at = ptr_key(path, key);
            fail(c, "keyword \"%s\" at %s is not supported inside allOf (llama ignores it there)", key, at);
            free(at);
            return false;
        }
    }
    return true;
}

/* A non-negative integer keyword (minItems, maxLength, ...). */
static bool read_count(converter *c, json_t *schema, const char *path, const char *key, bool *present, long *out) {
    json_t *v = json_object_get(schema, key);
    *present = v != NULL;
    if (!v) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000000) {
        char *at = ptr_key(path, key);
        fail(c, "\"%s\" at %s must be a non-negative integer (at most 1000000000)", key, at);
        free(at);
        return false;
    }
    *out = (long)json_integer_value(v);
    return true;
}

/* ------------------------------------------------------------------------ */
/* Repetition (llama's _build_repetition)                                    */

static char *repetition(const char *item, long min, bool has_max, long max, const char *sep) {
    if (has_max && max == 0) return mu_xstrdup("");
    if (min == 0 && has_max && max == 1) return str_printf("%s?", item);
    if (!sep) {
        if (min == 1 && !has_max) return str_printf("%s+", item);
        if (min == 0 && !has_max) return str_printf("%s*", item);
        if (has_max) return str_printf("%s{%ld,%ld}", item, min, max);
        return str_printf("%s{%ld,}", item, min);
    }
    char *sep_item = str_printf("(%s %s)", sep, item);
    char *rest = repetition(sep_item, min > 0 ? min - 1 : 0, has_max, has_max ? max - 1 : 0, NULL);
    char *result = min == 0 ? str_printf("(%s %s)?", item, rest) : str_printf("%s %s", item, rest);
    free(sep_item);
    free(rest);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Integer ranges (llama's _generate_min_max_int)                            */

/* llama's integer rule stops at 16 digits; so do the bounds. */
#define INT_LIMIT INT64_C(9999999999999999)

static void digit_range(mu_buf *o, char from, char to) {
    mu_buf_putc(o, '[');
    mu_buf_putc(o, from);
    if (from != to) {
        mu_buf_putc(o, '-');
        mu_buf_putc(o, to);
    }
    mu_buf_putc(o, ']');
}

static void more_digits(mu_buf *o, int min_digits, int max_digits) {
    mu_buf_puts(o, "[0-9]");
    if (min_digits == max_digits && min_digits == 1) return;
    if (min_digits == max_digits) mu_buf_appendf(o, "{%d}", min_digits);
    else mu_buf_appendf(o, "{%d,%d}", min_digits, max_digits);
}

static void repeat_char(char *dst, char ch, size_t n) {
    memset(dst, ch, n);
    dst[n] = '\0';
}

/* All numbers from `from` to `to`, two digit strings of the same length. */
static void uniform_range(mu_buf *o, const char *from, const char *to) {
    size_t len = strlen(from), i = 0;
    while (i < len && from[i] == to[i]) i++;
    if (i > 0) {
        mu_buf_putc(o, '"');
        mu_buf_append(o, from, i);
        mu_buf_putc(o, '"');
    }
    if (i == len) return;
    if (i > 0) mu_buf_putc(o, ' ');
    size_t sub_len = len - i - 1;
    if (sub_len == 0) {
        mu_buf_appendf(o, "[%c-%c]", from[i], to[i]);
        return;
    }
    char zeros[24], nines[24];
    repeat_char(zeros, '0', sub_len);
    repeat_char(nines, '9', sub_len);
    const char *from_sub = from + i + 1, *to_sub = to + i + 1;
    bool to_reached = false;
    mu_buf_putc(o, '(');
    if (strcmp(from_sub, zeros) == 0) {
        digit_range(o, from[i], (char)(to[i] - 1));
        mu_buf_putc(o, ' ');
        more_digits(o, (int)sub_len, (int)sub_len);
    } else {
        mu_buf_appendf(o, "[%c] (", from[i]);
        uniform_range(o, from_sub, nines);
        mu_buf_putc(o, ')');
        if (from[i] < to[i] - 1) {
            mu_buf_puts(o, " | ");
            if (strcmp(to_sub, nines) == 0) {
                digit_range(o, (char)(from[i] + 1), to[i]);
                to_reached = true;
            } else {
                digit_range(o, (char)(from[i] + 1), (char)(to[i] - 1));
            }
            mu_buf_putc(o, ' ');
            more_digits(o, (int)sub_len, (int)sub_len);
        }
    }
    if (!to_reached) {
        mu_buf_puts(o, " | ");
        digit_range(o, to[i], to[i]);
        mu_buf_putc(o, ' ');
        uniform_range(o, zeros, to_sub);
    }
    mu_buf_putc(o, ')');
}

static void int_range(mu_buf *o, bool has_min, int64_t min, bool has_max, int64_t max, int decimals_left,
                      bool top_level) {
    if (has_min && has_max) {
        if (min < 0 && max < 0) {
            mu_buf_puts(o, "\"-\" (");
            int_range(o, true, -max, true, -min, decimals_left, true);
            mu_buf_putc(o, ')');
            return;
        }
        if (min < 0) {
            mu_buf_puts(o, "\"-\" (");
            int_range(o, true, 0, true, -min, decimals_left, true);
            mu_buf_puts(o, ") | ");
            min = 0;
        }
        char min_s[24], max_s[24], nines[24];
        snprintf(min_s, sizeof min_s, "%" PRId64, min);
        snprintf(max_s, sizeof max_s, "%" PRId64, max);
        for (size_t digits = strlen(min_s); digits < strlen(max_s); digits++) {
            repeat_char(nines, '9', digits);
            uniform_range(o, min_s, nines);
            min_s[0] = '1';
            repeat_char(min_s + 1, '0', digits);
            mu_buf_puts(o, " | ");
        }
        uniform_range(o, min_s, max_s);
        return;
    }
    int less_decimals = decimals_left - 1 > 1 ? decimals_left - 1 : 1;
    if (has_min) {
        if (min < 0) {
            mu_buf_puts(o, "\"-\" (");
            int_range(o, false, 0, true, -min, decimals_left, false);
            mu_buf_puts(o, ") | [0] | [1-9] ");
            more_digits(o, 0, decimals_left - 1);
        } else if (min == 0) {
            if (top_level) {
                mu_buf_puts(o, "[0] | [1-9] ");
                more_digits(o, 0, less_decimals);
            } else {
                more_digits(o, 1, decimals_left);
            }
        } else if (min <= 9) {
            char ch = (char)('0' + min), start = top_level ? '1' : '0';
            if (ch > start) {
                digit_range(o, start, (char)(ch - 1));
                mu_buf_putc(o, ' ');
                more_digits(o, 1, less_decimals);
                mu_buf_puts(o, " | ");
            }
            digit_range(o, ch, '9');
            mu_buf_putc(o, ' ');
            more_digits(o, 0, less_decimals);
        } else {
            char min_s[24];
            snprintf(min_s, sizeof min_s, "%" PRId64, min);
            int len = (int)strlen(min_s);
            char first = min_s[0];
            if (first > '1') {
                digit_range(o, top_level ? '1' : '0', (char)(first - 1));
                mu_buf_putc(o, ' ');
                more_digits(o, len, less_decimals);
                mu_buf_puts(o, " | ");
            }
            digit_range(o, first, first);
            mu_buf_puts(o, " (");
            int_range(o, true, strtoll(min_s + 1, NULL, 10), false, 0, less_decimals, false);
            mu_buf_putc(o, ')');
            if (first < '9') {
                mu_buf_puts(o, " | ");
                digit_range(o, (char)(first + 1), '9');
                mu_buf_putc(o, ' ');
                more_digits(o, len - 1, less_decimals);
            }
        }
        return;
    }
    if (max >= 0) {
        if (top_level) {
            mu_buf_puts(o, "\"-\" [1-9] ");
            more_digits(o, 0, less_decimals);
            mu_buf_puts(o, " | ");
        }
        int_range(o, true, 0, true, max, decimals_left, true);
    } else {
        mu_buf_puts(o, "\"-\" (");
        int_range(o, true, -max, false, 0, decimals_left, false);
        mu_buf_putc(o, ')');
    }
}

/* llama's minimum-only construction recurses on the digits after the first
 * as a plain number, losing their count: it is exact (verified against a
 * brute-force check of the Python original) only below 10, or for at most
 * 15 digits none of which, between the first and the last, is 0 or 1. */
static bool llama_min_only_exact(int64_t min) {
    if (min < 10) return true;
    char s[24];
    int len = snprintf(s, sizeof s, "%" PRId64, min);
    if (len > 15) return false;
    for (int i = 1; i < len - 1; i++)
        if (s[i] == '0' || s[i] == '1') return false;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Patterns (llama's _visit_pattern), refusing what it mistranslates         */

typedef struct {
    char *txt;
    bool literal; /* txt is the inside of a "..." literal */
    bool is_bar;  /* an alternation '|' */
    int atoms;    /* regex characters merged into a literal */
    int repeats;  /* quantifiers applied: 1, or 2 with a lazy '?' */
    /* What the GBNF text (to_rule) matches, for repeating it safely: a
     * repeated item that can match "" makes the GBNF parser see left
     * recursion ("(a|)+"), so repetitions use `ne` instead, the same
     * language without "". ne is NULL when not nullable (ne would be the
     * text itself) or when the item matches nothing but "". */
    bool nullable;
    char *ne;
} pat_item;

typedef struct {
    pat_item *v;
    size_t n, cap;
} pat_seq;

typedef struct {
    converter *c;
    const char *pattern, *at; /* for messages */
    const char *rule_name;    /* sub-rules are named rule_name-1, -2, ... */
    const char *s;            /* the pattern between the anchors */
    uint32_t *cp;             /* its code points */
    size_t *off;              /* byte offset of each, n + 1 entries */
    size_t n, i;
    strlist sub_bodies, sub_names;
} pat_ctx;

static bool pat_fail(pat_ctx *p, size_t index, const char *what) {
    fail(p->c, "pattern \"%s\" at %s: %s at index %zu", p->pattern, p->at, what, index + 1);
    return false;
}

static void seq_push(pat_seq *s, char *txt, bool literal, bool is_bar, int atoms) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->v = mu_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = (pat_item){txt, literal, is_bar, atoms, 0, false, NULL};
}

static void seq_free(pat_seq *s) {
    for (size_t i = 0; i < s->n; i++) {
        free(s->v[i].txt);
        free(s->v[i].ne);
    }
    free(s->v);
    *s = (pat_seq){0};
}

static char *to_rule(const pat_item *it) {
    return it->literal ? str_printf("\"%s\"", it->txt) : mu_xstrdup(it->txt);
}

/* llama's join_seq: a single literal run comes back as one literal; anything
 * else is the items joined by spaces, literals NOT merged (the Python
 * converter joins the unmerged sequence). */
static pat_item pat_join(const pat_seq *s) {
    size_t runs = 0;
    for (size_t i = 0; i < s->n; i++)
        if (!(s->v[i].literal && i > 0 && s->v[i - 1].literal)) runs++;
    mu_buf b = {0};
    if (runs == 1 && s->v[0].literal) {
        int atoms = 0;
        for (size_t i = 0; i < s->n; i++) {
            mu_buf_puts(&b, s->v[i].txt);
            atoms += s->v[i].atoms;
        }
        return (pat_item){mu_buf_take(&b), true, false, atoms, 0, false, NULL};
    }
    if (runs == 1)
        return (pat_item){mu_xstrdup(s->v[0].txt), false, s->v[0].is_bar, 0, s->v[0].repeats, false, NULL};
    for (size_t i = 0; i < s->n; i++) {
        char *r = to_rule(&s->v[i]);
        if (i) mu_buf_putc(&b, ' ');
        mu_buf_puts(&b, r);
        free(r);
    }
    return (pat_item){mu_buf_take(&b), false, false, 0, 0, false, NULL};
}

/* ---- Nullable items (see pat_item.ne) ----
 * Repeating an item X that can match "" is rewritten over X', the language
 * of X without "": X* and X+ become X'*, X{m,n} becomes X'{0,n} and X{m,}
 * becomes X'*. The language is unchanged: a concatenation of X-strings is
 * the concatenation of its non-empty ones, and missing copies up to m can
 * always be filled with "". */

/* Skips one GBNF literal "..." or class [...] starting at t[i]. */
static size_t gbnf_skip_quoted(const char *t, size_t i) {
    char close = t[i] == '"' ? '"' : ']';
    for (i++; t[i] && t[i] != close; i++)
        if (t[i] == '\\' && t[i + 1]) i++;
    return t[i] ? i + 1 : i;
}

/* Whether GBNF text has a space (a sequence) or a '|' (an alternation)
 * outside literals, classes and groups, and whether it ends in a postfix
 * operator. */
static void gbnf_top_level(const char *t, bool *has_space, bool *has_bar, bool *ends_postfix) {
    int depth = 0;
    char last = 0;
    *has_space = *has_bar = false;
    for (size_t i = 0; t[i];) {
        char ch = t[i];
        if (ch == '"' || ch == '[') {
            i = gbnf_skip_quoted(t, i);
            last = ']';
            continue;
        }
        if (ch == '(') depth++;
        else if (ch == ')') depth--;
        else if (depth == 0 && ch == ' ') *has_space = true;
        else if (depth == 0 && ch == '|') *has_bar = true;
        last = ch;
        i++;
    }
    *ends_postfix = last && strchr("*+?}", last);
}

/* t as one element a postfix operator can follow. */
static char *gbnf_atom(const char *t) {
    bool sp, bar, post;
    gbnf_top_level(t, &sp, &bar, &post);
    return sp || bar || post ? str_printf("(%s)", t) : mu_xstrdup(t);
}

/* t as an element of a sequence. */
static char *gbnf_seq_part(const char *t) {
    bool sp, bar, post;
    gbnf_top_level(t, &sp, &bar, &post);
    return bar ? str_printf("(%s)", t) : mu_xstrdup(t);
}

/* An item's language without "", as GBNF text; NULL if that is empty. */
static char *pat_non_empty(const pat_item *it) { return it->nullable ? (it->ne ? mu_xstrdup(it->ne) : NULL) : to_rule(it); }

/* Whether the alternatives of `s` can match "", and their language without
 * "": a nullable alternative X1 .. Xk (every Xi nullable) loses "" as
 * X1' X2 .. Xk | X2' X3 .. Xk | .. | Xk' (the first non-empty part is some
 * Xi'); other alternatives stay as they are. */
static bool seq_nullable(const pat_seq *s, char **ne) {
    mu_buf out = {0};
    bool nullable = false;
    size_t parts = 0;
    for (size_t a = 0; a <= s->n;) {
        size_t b = a;
        while (b < s->n && !s->v[b].is_bar) b++;
        bool all = true;
        for (size_t i = a; i < b; i++) all = all && s->v[i].nullable;
        nullable = nullable || all;
        for (size_t i = a; i < b; i++) {
            char *first = all ? pat_non_empty(&s->v[i]) : to_rule(&s->v[i]);
            if (first) {
                char *part = all ? gbnf_seq_part(first) : mu_xstrdup(first);
                mu_buf_puts(&out, parts++ ? " | " : "");
                mu_buf_puts(&out, part);
                for (size_t j = i + 1; j < b; j++) {
                    char *r = to_rule(&s->v[j]);
                    mu_buf_appendf(&out, " %s", r);
                    free(r);
                }
                free(part);
                free(first);
            }
            if (!all) break; /* the whole alternative, once */
        }
        a = b + 1;
    }
    *ne = NULL;
    if (nullable && parts) *ne = mu_buf_take(&out);
    mu_buf_free(&out);
    return nullable;
}

static bool is_non_literal(uint32_t ch) { return ch < 128 && ch && strchr("|.()[]{}*+?", (int)ch); }
static bool is_escapable(uint32_t ch) { return ch < 128 && ch && strchr("^$.[]()|{}*+?", (int)ch); }

static char *pat_slice(const pat_ctx *p, size_t from, size_t to) {
    size_t a = p->off[from], b = p->off[to];
    char *s = mu_xmalloc(b - a + 1);
    memcpy(s, p->s + a, b - a);
    s[b - a] = '\0';
    return s;
}

/* Repeating a merged literal would repeat all of it: llama turns "a\.+"
 * into "a."+ instead of "a" "."+. A second quantifier is a regex syntax
 * error, except '?' making the first one lazy (same language). */
static bool pat_can_repeat(pat_ctx *p, const pat_seq *seq, bool lazy_mark) {
    if (seq->n == 0 || seq->v[seq->n - 1].is_bar)
        return pat_fail(p, p->i, "quantifier with nothing to repeat");
    int repeats = seq->v[seq->n - 1].repeats;
    if (repeats > 1 || (repeats == 1 && !lazy_mark))
        return pat_fail(p, p->i, "quantifier after a quantifier");
    if (seq->v[seq->n - 1].literal && seq->v[seq->n - 1].atoms > 1)
        return pat_fail(p, p->i, "quantifier after an escaped character (llama would repeat the whole "
                                 "preceding literal; wrap the character in a group)");
    return true;
}

static bool pat_simple_quantifier(pat_ctx *p, pat_seq *seq) {
    if (!pat_can_repeat(p, seq, p->cp[p->i] == '?')) return false;
    char q = (char)p->cp[p->i++];
    pat_item *last = &seq->v[seq->n - 1];
    last->repeats++;
    char *r = to_rule(last), *ne = pat_non_empty(last), *txt;
    bool was_nullable = last->nullable;
    if (was_nullable && !ne) {
        txt = mu_xstrdup(""); /* only "" to repeat */
    } else if (was_nullable && q != '?') {
        /* X* and X+ of a nullable X: X'* (see pat_item.ne) */
        char *atom = gbnf_atom(ne);
        txt = str_printf("%s*", atom);
        free(ne);
        ne = str_printf("%s+", atom);
        free(atom);
    } else {
        txt = str_printf("%s%c", r, q); /* llama's text */
        if (q == '*') {
            free(ne);
            ne = str_printf("%s+", r);
        }
    }
    free(last->txt);
    free(last->ne);
    last->txt = txt;
    last->literal = false;
    /* X+ of a non-nullable X is the only result that cannot match "" */
    last->nullable = was_nullable || q != '+';
    last->ne = last->nullable ? ne : NULL;
    if (!last->nullable) free(ne);
    free(r);
    return true;
}

/* {n}, {n,} or {n,m}; ECMA reads anything else (like {,m}) literally. */
static bool parse_braces(const char *s, long *min, bool *has_max, long *max) {
    char *end;
    if (*s < '0' || *s > '9' || strlen(s) > 21) return false;
    *min = strtol(s, &end, 10);
    if (*end == '\0') {
        *has_max = true;
        *max = *min;
        return *min <= 1000000000;
    }
    if (*end != ',') return false;
    s = end + 1;
    *has_max = *s != '\0';
    *max = 0;
    if (*has_max) {
        if (*s < '0' || *s > '9') return false;
        *max = strtol(s, &end, 10);
        if (*end != '\0' || *max > 1000000000) return false;
    }
    return *min <= 1000000000;
}

static bool pat_braces(pat_ctx *p, pat_seq *seq) {
    size_t start = p->i;
    while (p->i < p->n && p->cp[p->i] != '}') p->i++;
    if (p->i >= p->n) return pat_fail(p, start, "unclosed '{'");
    char *inner = pat_slice(p, start + 1, p->i);
    long min, max;
    bool has_max, ok = parse_braces(inner, &min, &has_max, &max);
    free(inner);
    if (!ok) return pat_fail(p, start, "only {n}, {n,} and {n,m} quantifiers are supported");
    if (has_max && min > max) return pat_fail(p, start, "quantifier minimum exceeds its maximum");
    size_t quant_at = p->i;
    p->i = start;
    if (!pat_can_repeat(p, seq, false)) return false;
    p->i = quant_at + 1;
    pat_item *last = &seq->v[seq->n - 1];
    last->repeats = 1;
    bool was_nullable = last->nullable;
    if (was_nullable && !last->ne) {
        free(last->txt);
        last->txt = mu_xstrdup(""); /* only "" to repeat */
        last->literal = false;
        return true;
    }
    if (was_nullable) {
        /* X{m,n} of a nullable X: X'{0,n} (see pat_item.ne) */
        min = 0;
        free(last->txt);
        last->txt = last->ne;
        last->ne = NULL;
    }
    char *item;
    if (last->literal) {
        item = str_printf("\"%s\"", last->txt);
    } else {
        long k = sl_find(&p->sub_bodies, last->txt);
        if (k < 0) {
            char *name = str_printf("%s-%zu", p->rule_name, p->sub_bodies.n + 1);
            sl_push(&p->sub_names, add_rule(p->c, name, last->txt));
            sl_push(&p->sub_bodies, last->txt);
            free(name);
            k = (long)p->sub_bodies.n - 1;
        }
        item = mu_xstrdup(p->sub_names.v[k]);
    }
    free(last->txt);
    last->txt = repetition(item, min, has_max, max, NULL);
    last->literal = false;
    bool only_empty = has_max && max == 0;
    last->nullable = min == 0 || only_empty;
    last->ne = last->nullable && !only_empty ? repetition(item, 1, has_max, max, NULL) : NULL;
    free(item);
    return true;
}

/* One character of a class as llama's GBNF parser reads it. */
static bool class_char(pat_ctx *p, size_t *j, size_t end, uint32_t *out) {
    if (p->cp[*j] != '\\') {
        *out = p->cp[(*j)++];
        return true;
    }
    uint32_t e = *j + 1 < end ? p->cp[*j + 1] : 0;
    int hex = 0;
    switch (e) {
    case ']': case '[': case '\\': case '"': *out = e; *j += 2; return true;
    case 't': *out = '\t'; *j += 2; return true;
    case 'n': *out = '\n'; *j += 2; return true;
    case 'r': *out = '\r'; *j += 2; return true;
    case 'x': hex = 2; break;
    case 'u': hex = 4; break;
    default: {
        char *esc = pat_slice(p, *j, *j + 2 <= end ? *j + 2 : end);
        char what[96];
        snprintf(what, sizeof what, "escape \"%s\" in a character class is not supported", esc);
        free(esc);
        return pat_fail(p, *j, what);
    }
    }
    uint32_t v = 0;
    for (int k = 0; k < hex; k++) {
        size_t at = *j + 2 + (size_t)k;
        uint32_t h = at < end ? p->cp[at] : 0;
        int d = h >= '0' && h <= '9' ? (int)(h - '0') : h >= 'a' && h <= 'f' ? (int)(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? (int)(h - 'A' + 10) : -1;
        if (d < 0) return pat_fail(p, *j, "malformed hex escape in a character class");
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    *j += 2 + (size_t)hex;
    return true;
}

/* Inside a JSON string a raw '"', '\' or control character breaks the
 * syntax, so a class must not match them (a negated class must exclude all
 * of them). */
static bool json_unsafe_in(uint32_t lo, uint32_t hi) {
    return lo < 0x20 || (lo <= '"' && hi >= '"') || (lo <= '\\' && hi >= '\\');
}

static bool pat_check_class(pat_ctx *p, size_t start, size_t end) {
    size_t j = start + 1;
    bool negated = j < end && p->cp[j] == '^';
    if (negated) j++;
    if (j == end) return pat_fail(p, start, "empty character class");
    bool covered[0x20 + 2] = {0}; /* control characters, then '"' and '\' */
    while (j < end) {
        uint32_t lo, hi;
        if (!class_char(p, &j, end, &lo)) return false;
        hi = lo;
        if (j + 1 < end && p->cp[j] == '-') {
            j++;
            if (!class_char(p, &j, end, &hi)) return false;
            if (hi < lo) return pat_fail(p, start, "reversed range in a character class");
        }
        if (!negated && json_unsafe_in(lo, hi))
            return pat_fail(p, start, "character class can match '\"', '\\' or a control character, "
                                      "which would break the JSON string");
        for (uint32_t ch = 0; ch < 0x20; ch++) covered[ch] |= lo <= ch && ch <= hi;
        covered[0x20] |= lo <= '"' && '"' <= hi;
        covered[0x21] |= lo <= '\\' && '\\' <= hi;
    }
    for (size_t k = 0; negated && k < sizeof covered; k++)
        if (!covered[k])
            return pat_fail(p, start, "negated character class must exclude '\"', '\\' and \\x00-\\x1F "
                                      "(e.g. [^\"\\\\\\x00-\\x1F]), or it would break the JSON string");
    return true;
}

static bool pat_class(pat_ctx *p, pat_seq *seq) {
    size_t start = p->i++;
    while (p->i < p->n && p->cp[p->i] != ']') p->i += p->cp[p->i] == '\\' ? 2 : 1;
    if (p->i >= p->n) return pat_fail(p, start, "unclosed '['");
    size_t end = p->i++;
    if (!pat_check_class(p, start, end)) return false;
    seq_push(seq, pat_slice(p, start, end + 1), false, false, 0);
    return true;
}

/* A run of plain characters, split like llama does: the last character
 * before a quantifier or group stands alone. */
static bool pat_literal(pat_ctx *p, pat_seq *seq) {
    mu_buf lit = {0};
    int atoms = 0;
    bool ok = true;
    while (ok && p->i < p->n) {
        uint32_t ch = p->cp[p->i];
        if (ch == '\\' && p->i + 1 < p->n) {
            if (!is_escapable(p->cp[p->i + 1])) {
                char *esc = pat_slice(p, p->i, p->i + 2);
                char what[128];
                snprintf(what, sizeof what, "escape \"%s\" is not supported (llama copies it into the grammar "
                                            "verbatim; write classes like [0-9] instead)", esc);
                free(esc);
                ok = pat_fail(p, p->i, what);
                break;
            }
            mu_buf_putc(&lit, (char)p->cp[p->i + 1]);
            p->i += 2;
            atoms++;
            continue;
        }
        if (ch == '\\') ok = pat_fail(p, p->i, "trailing backslash");
        else if (ch == '"') ok = pat_fail(p, p->i, "'\"' is not supported (it would end the JSON string)");
        else if (ch < 0x20) ok = pat_fail(p, p->i, "control character");
        else if (ch == '^' || ch == '$') ok = pat_fail(p, p->i, "anchor inside the pattern");
        if (!ok) break;
        bool last = p->i + 1 == p->n;
        if (is_non_literal(ch) ||
            !(last || lit.len == 0 || p->cp[p->i + 1] == '.' || !is_non_literal(p->cp[p->i + 1])))
            break;
        mu_buf_append(&lit, p->s + p->off[p->i], p->off[p->i + 1] - p->off[p->i]);
        p->i++;
        atoms++;
    }
    if (ok && lit.len) seq_push(seq, mu_buf_take(&lit), true, false, atoms);
    mu_buf_free(&lit);
    return ok;
}

static bool pat_transform(pat_ctx *p, int depth, bool in_group, pat_item *out);

static bool pat_group(pat_ctx *p, int depth, pat_seq *seq) {
    size_t start = p->i++;
    if (p->i < p->n && p->cp[p->i] == '?')
        return pat_fail(p, start, "\"(?\" groups (lookarounds, non-capturing) are not supported");
    pat_item inner;
    if (!pat_transform(p, depth + 1, true, &inner)) return false;
    char *r = to_rule(&inner);
    seq_push(seq, str_printf("(%s)", r), false, false, 0);
    seq->v[seq->n - 1].nullable = inner.nullable;
    seq->v[seq->n - 1].ne = inner.ne ? str_printf("(%s)", inner.ne) : NULL;
    free(r);
    free(inner.txt);
    free(inner.ne);
    return true;
}

static bool pat_transform(pat_ctx *p, int depth, bool in_group, pat_item *out) {
    if (depth > 100) return pat_fail(p, p->i, "groups nested too deeply");
    pat_seq seq = {0};
    bool ok = true, closed = false;
    while (ok && !closed && p->i < p->n) {
        uint32_t ch = p->cp[p->i];
        if (ch == '.') {
            ok = pat_fail(p, p->i, "'.' is not supported (llama translates it to [^\\x0A\\x0D], which also "
                                   "matches '\"' and '\\' and breaks the JSON string; use a class such as "
                                   "[^\"\\\\\\x00-\\x1F])");
        } else if (ch == '(') {
            ok = pat_group(p, depth, &seq);
        } else if (ch == ')') {
            if (!in_group) ok = pat_fail(p, p->i, "unbalanced ')'");
            p->i++;
            closed = true;
        } else if (ch == '[') {
            ok = pat_class(p, &seq);
        } else if (ch == '|') {
            seq_push(&seq, mu_xstrdup("|"), false, true, 0);
            p->i++;
        } else if (ch == '*' || ch == '+' || ch == '?') {
            ok = pat_simple_quantifier(p, &seq);
        } else if (ch == '{') {
            ok = pat_braces(p, &seq);
        } else if (ch == ']' || ch == '}') {
            ok = pat_fail(p, p->i, "unbalanced bracket");
        } else {
            ok = pat_literal(p, &seq);
        }
    }
    if (ok && in_group && !closed) ok = pat_fail(p, p->i, "unclosed '('");
    if (ok) {
        char *ne;
        bool nullable = seq_nullable(&seq, &ne);
        *out = pat_join(&seq);
        out->nullable = nullable;
        out->ne = ne;
    }
    seq_free(&seq);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Visiting schemas                                                          */

static const char *visit(converter *c, json_t *schema, const char *name, const char *path,
                         const char *type_override, unsigned *types_out);

typedef struct {
    const char *key;
    json_t *schema;
    char *path;
} prop_entry;

typedef struct {
    prop_entry *v;
    size_t n, cap;
} prop_list;

static void props_push(prop_list *l, const char *key, json_t *schema, char *owned_path) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 8;
        l->v = mu_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = (prop_entry){key, schema, owned_path};
}

static void props_free(prop_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].path);
    free(l->v);
    *l = (prop_list){0};
}

/* Key tries for _not_strings, one node per code point. */
typedef struct trie_node {
    char ch[5];
    bool end;
    struct trie_node **kids;
    size_t n_kids;
} trie_node;

static void trie_insert(trie_node *root, const char *key) {
    trie_node *node = root;
    for (size_t i = 0; key[i];) {
        uint32_t cp;
        size_t n = utf8_decode(key + i, &cp);
        trie_node *next = NULL;
        for (size_t k = 0; k < node->n_kids && !next; k++)
            if (strncmp(node->kids[k]->ch, key + i, n) == 0 && node->kids[k]->ch[n] == '\0') next = node->kids[k];
        if (!next) {
            next = mu_xcalloc(1, sizeof *next);
            memcpy(next->ch, key + i, n);
            node->kids = mu_xrealloc(node->kids, (node->n_kids + 1) * sizeof *node->kids);
            node->kids[node->n_kids++] = next;
        }
        node = next;
        i += n;
    }
    node->end = true;
}

static void trie_free(trie_node *node) {
    for (size_t k = 0; k < node->n_kids; k++) {
        trie_free(node->kids[k]);
        free(node->kids[k]);
    }
    free(node->kids);
}

/* UTF-8 byte order is code point order, which is what Python sorts by. */
static int trie_cmp(const void *a, const void *b) {
    return strcmp((*(trie_node *const *)a)->ch, (*(trie_node *const *)b)->ch);
}

static void trie_emit(trie_node *node, mu_buf *out, const char *char_rule) {
    qsort(node->kids, node->n_kids, sizeof *node->kids, trie_cmp);
    mu_buf rejects = {0};
    for (size_t k = 0; k < node->n_kids; k++) {
        trie_node *kid = node->kids[k];
        mu_buf_puts(&rejects, kid->ch);
        if (k) mu_buf_puts(out, " | ");
        mu_buf_appendf(out, "[%s]", kid->ch);
        if (kid->n_kids) {
            mu_buf_puts(out, " (");
            trie_emit(kid, out, char_rule);
            mu_buf_putc(out, ')');
        } else if (kid->end) {
            mu_buf_appendf(out, " %s+", char_rule);
        }
    }
    /* Deliberate difference: llama writes [^"...] here, which lets an extra
     * key start with a raw backslash (escaping the closing quote) or a raw
     * control character, i.e. produce invalid JSON. */
    if (node->n_kids) mu_buf_appendf(out, " | [^\"\\\\\\x7F\\x00-\\x1F%s] %s*", mu_buf_str(&rejects), char_rule);
    mu_buf_free(&rejects);
}

/* llama's key rule nests one group per character of the longest declared
 * name, and the GBNF parser (src/grammar/gbnf_parse.c) refuses groups
 * nested deeper than 256 levels. Up to this many characters the rule is
 * llama's text; beyond it, trie_emit_flat's. */
#define KEY_TRIE_NESTED_MAX 200

static size_t trie_height(const trie_node *node) {
    size_t h = 0;
    for (size_t k = 0; k < node->n_kids; k++) {
        size_t kh = 1 + trie_height(node->kids[k]);
        if (kh > h) h = kh;
    }
    return h;
}

/* The flat key rule: every trie node with children gets a rule matching
 * the rest of a key that has reached it without being a declared name:
 * nothing (unless the node ends a declared name), a child's character and
 * that child's rule, or any other character and anything after it. Rules
 * refer to each other only forward, so no group is nested more than two
 * levels whatever the names' length. Unlike llama's text this also accepts
 * the proper prefixes of declared names and extra keys that begin with an
 * escape sequence, so exactly the declared names are refused (compared as
 * written in the JSON text, as llama does). `number` counts nodes in
 * depth-first order: the node after the first i characters of a single
 * name is rule "<base>-i". */
static void trie_alternatives(converter *c, trie_node *node, const char *base, size_t *number, const char *char_rule,
                              mu_buf *out) {
    qsort(node->kids, node->n_kids, sizeof *node->kids, trie_cmp);
    const char **kid_rules = mu_xcalloc(node->n_kids ? node->n_kids : 1, sizeof *kid_rules);
    for (size_t k = 0; k < node->n_kids; k++) {
        trie_node *kid = node->kids[k];
        if (!kid->n_kids) continue;
        char *name = str_printf("%s-%zu", base, ++*number);
        mu_buf body = {0};
        trie_alternatives(c, kid, base, number, char_rule, &body);
        kid_rules[k] = add_rule(c, name, mu_buf_str(&body));
        mu_buf_free(&body);
        free(name);
    }
    /* GBNF writes the empty alternative as nothing before the first '|' */
    if (!node->end) mu_buf_puts(out, "| ");
    mu_buf rejects = {0};
    bool dash = false;
    for (size_t k = 0; k < node->n_kids; k++) {
        trie_node *kid = node->kids[k];
        if (strcmp(kid->ch, "-") == 0) dash = true;
        else mu_buf_puts(&rejects, kid->ch);
        if (kid_rules[k]) mu_buf_appendf(out, "[%s] %s | ", kid->ch, kid_rules[k]);
        else mu_buf_appendf(out, "[%s] %s+ | ", kid->ch, char_rule);
    }
    /* '-' between two characters of a class would make a range: last */
    if (dash) mu_buf_putc(&rejects, '-');
    mu_buf_appendf(out, "[^\"\\\\\\x7F\\x00-\\x1F%s] %s*", mu_buf_str(&rejects), char_rule);
    mu_buf_appendf(out, " | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4}) %s*", char_rule);
    mu_buf_free(&rejects);
    free(kid_rules);
}

/* A JSON string that is none of `keys` (the additionalProperties key);
 * `rule_name` names the sub-rules of the flat form. */
static char *not_strings(converter *c, const prop_list *props, const char *rule_name) {
    trie_node root = {0};
    for (size_t i = 0; i < props->n; i++) trie_insert(&root, props->v[i].key);
    const char *char_rule = add_builtin(c, "char");
    mu_buf out = {0};
    mu_buf_puts(&out, "[\"] ( ");
    if (trie_height(&root) <= KEY_TRIE_NESTED_MAX) {
        trie_emit(&root, &out, char_rule);
        mu_buf_appendf(&out, " )%s [\"] space", root.end ? "" : "?");
    } else {
        mu_buf alts = {0};
        size_t number = 0;
        trie_alternatives(c, &root, rule_name, &number, char_rule, &alts);
        mu_buf_appendf(&out, "%s ) [\"] space", mu_buf_str(&alts));
        mu_buf_free(&alts);
    }
    trie_free(&root);
    return mu_buf_take(&out);
}

/* Property names the key-exclusion rule can spell: it writes them raw into
 * character classes and compares them with the unescaped JSON text. */
static bool check_excludable_key(converter *c, const prop_entry *prop) {
    const char *bad = NULL;
    if (strcmp(prop->key, "*") == 0) bad = "the name \"*\" (llama's name for the extra keys)";
    for (const unsigned char *s = (const unsigned char *)prop->key; *s && !bad; s++) {
        if (*s == '"') bad = "'\"'";
        else if (*s == '\\') bad = "'\\'";
        else if (*s == ']') bad = "']'";
        else if (*s == '^') bad = "'^'";
        else if (*s < 0x20 || *s == 0x7F) bad = "a control character";
    }
    if (!bad) return true;
    fail(c, "property at %s cannot be combined with additionalProperties: its name contains %s", prop->path, bad);
    return false;
}

/* llama's get_recursive_refs: "kv kv-rest" chains where every later
 * optional property may follow. */
static char *optional_chain(converter *c, const char *name, const strlist *keys, const char *const *kv_names,
                            size_t from, bool first_is_optional) {
    const char *k = keys->v[from], *kv = kv_names[from];
    bool star = strcmp(k, "*") == 0;
    char *comma_ref = str_printf("( \",\" space %s )", kv);
    mu_buf res = {0};
    if (first_is_optional) {
        mu_buf_appendf(&res, "%s%s", comma_ref, star ? "*" : "?");
    } else {
        mu_buf_puts(&res, kv);
        if (star) mu_buf_appendf(&res, " %s*", comma_ref);
    }
    free(comma_ref);
    if (from + 1 < keys->n) {
        char *rest_body = optional_chain(c, name, keys, kv_names, from + 1, true);
        char *base = child_name(name, k);
        char *rest_name = str_printf("%s-rest", base);
        mu_buf_appendf(&res, " %s", add_rule(c, rest_name, rest_body));
        free(rest_body);
        free(base);
        free(rest_name);
    }
    return mu_buf_take(&res);
}

/* The "key": value rule of every property, in schema order. */
static bool property_kv_rules(converter *c, const prop_list *props, const char *name, const char **kv_names) {
    for (size_t i = 0; i < props->n; i++) {
        const prop_entry *pr = &props->v[i];
        if (!name[0] && !pr->key[0])
            return refuse(c, "property at %s: an empty property name is not supported in a top-level object "
                             "(llama would name its rule \"root\")", pr->path);
        char *prop_name = child_name(name, pr->key);
        const char *value_rule = visit(c, pr->schema, prop_name, pr->path, NULL, NULL);
        if (value_rule) {
            mu_buf key = {0}, kv = {0};
            py_dump_string(&key, pr->key, strlen(pr->key));
            add_literal(&kv, mu_buf_str(&key));
            mu_buf_appendf(&kv, " space \":\" space %s", value_rule);
            char *kv_name = str_printf("%s-kv", prop_name);
            kv_names[i] = add_rule(c, kv_name, mu_buf_str(&kv));
            free(kv_name);
            mu_buf_free(&kv);
            mu_buf_free(&key);
        }
        free(prop_name);
        if (!value_rule) return false;
    }
    return true;
}

/* The rule for one extra key and its value. */
static const char *additional_kv_rule(converter *c, const prop_list *props, const char *name, json_t *additional,
                                      const char *additional_path) {
    for (size_t i = 0; i < props->n; i++)
        if (!check_excludable_key(c, &props->v[i])) return NULL;
    char *sub = child_name(name, "additional");
    char *value_name = str_printf("%s-value", sub);
    const char *value_rule = json_is_object(additional)
                                 ? visit(c, additional, value_name, additional_path, NULL, NULL)
                                 : add_builtin(c, "value");
    const char *result = NULL;
    if (value_rule) {
        const char *key_rule;
        if (props->n == 0) {
            key_rule = add_builtin(c, "string");
        } else {
            char *k_name = str_printf("%s-k", sub);
            char *k_body = not_strings(c, props, k_name);
            key_rule = add_rule(c, k_name, k_body);
            free(k_body);
            free(k_name);
        }
        char *kv_body = str_printf("%s \":\" space %s", key_rule, value_rule);
        char *kv_name = str_printf("%s-kv", sub);
        result = add_rule(c, kv_name, kv_body);
        free(kv_body);
        free(kv_name);
    }
    free(value_name);
    free(sub);
    return result;
}

/* "{" required, then optional properties (the extra keys last as "*"). */
static char *object_body(converter *c, const char *name, const strlist *req_kv, const strlist *opt_keys,
                         const char *const *opt_kv) {
    mu_buf rule = {0};
    mu_buf_puts(&rule, "\"{\" space ");
    for (size_t i = 0; i < req_kv->n; i++) {
        if (i) mu_buf_puts(&rule, " \",\" space ");
        mu_buf_puts(&rule, req_kv->v[i]);
    }
    if (opt_keys->n) {
        mu_buf_puts(&rule, " (");
        if (req_kv->n) mu_buf_puts(&rule, " \",\" space ( ");
        for (size_t i = 0; i < opt_keys->n; i++) {
            char *chain = optional_chain(c, name, opt_keys, opt_kv, i, false);
            if (i) mu_buf_puts(&rule, " | ");
            mu_buf_puts(&rule, chain);
            free(chain);
        }
        if (req_kv->n) mu_buf_puts(&rule, " )");
        mu_buf_puts(&rule, " )?");
    }
    mu_buf_puts(&rule, " \"}\" space");
    return mu_buf_take(&rule);
}

/* llama's _build_object_rule (no --prop-order: schema order). */
static const char *object_rule(converter *c, const prop_list *props, const strlist *required, const char *name,
                               json_t *additional, const char *additional_path, const char *rule_name) {
    const char **kv_names = mu_xcalloc(props->n + 1, sizeof *kv_names);
    const char **opt_kv = mu_xcalloc(props->n + 1, sizeof *opt_kv);
    strlist req_kv = {0}, opt_keys = {0};
    const char *result = NULL;
    if (property_kv_rules(c, props, name, kv_names)) {
        for (size_t i = 0; i < props->n; i++) {
            if (sl_find(required, props->v[i].key) >= 0) {
                sl_push(&req_kv, kv_names[i]);
            } else {
                opt_kv[opt_keys.n] = kv_names[i];
                sl_push(&opt_keys, props->v[i].key);
            }
        }
        bool ok = true;
        if (additional && !json_is_false(additional)) {
            opt_kv[opt_keys.n] = additional_kv_rule(c, props, name, additional, additional_path);
            ok = opt_kv[opt_keys.n] != NULL;
            sl_push(&opt_keys, "*");
        }
        if (ok) {
            char *body = object_body(c, name, &req_kv, &opt_keys, opt_kv);
            result = add_rule(c, rule_name, body);
            free(body);
        }
    }
    free(kv_names);
    free(opt_kv);
    sl_free(&req_kv);
    sl_free(&opt_keys);
    return c->failed ? NULL : result;
}

/* ---- $ref ---- */

static ref_entry *find_ref_entry(converter *c, const char *ref) {
    for (size_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref) == 0) return &c->refs[i];
    return NULL;
}

static char *unescape_pointer_token(const char *from, const char *to, bool *ok) {
    mu_buf b = {0};
    *ok = true;
    for (const char *p = from; p < to; p++) {
        if (*p != '~') {
            mu_buf_putc(&b, *p);
        } else if (p + 1 < to && (p[1] == '0' || p[1] == '1')) {
            mu_buf_putc(&b, p[1] == '0' ? '~' : '/');
            p++;
        } else {
            *ok = false;
        }
    }
    return mu_buf_take(&b);
}

/* The schema object a "#/..." pointer names in this document. */
static json_t *resolve_ref(converter *c, const char *ref, const char *at) {
    if (strncmp(ref, "https://", 8) == 0 || strncmp(ref, "http://", 7) == 0)
        return fail(c, "remote $ref \"%s\" at %s is not supported", ref, at);
    if (strncmp(ref, "#/", 2) != 0)
        return fail(c, "unsupported $ref \"%s\" at %s (only \"#/...\" pointers into this document)", ref, at);
    if (strchr(ref + 1, '#') || strchr(ref, '%'))
        return fail(c, "unsupported $ref \"%s\" at %s ('#' or '%%' inside the pointer)", ref, at);
    json_t *node = c->doc;
    for (const char *p = ref + 1; *p == '/';) {
        const char *start = p + 1, *end = strchr(start, '/');
        if (!end) end = start + strlen(start);
        bool ok;
        char *token = unescape_pointer_token(start, end, &ok);
        json_t *next = NULL;
        if (ok && json_is_object(node)) {
            next = json_object_get(node, token);
        } else if (ok && json_is_array(node) && token[0] >= '0' && token[0] <= '9' &&
                   strspn(token, "0123456789") == strlen(token) && (token[0] != '0' || !token[1]) &&
                   strlen(token) < 10) {
            next = json_array_get(node, strtoul(token, NULL, 10));
        }
        if (!ok) {
            fail(c, "$ref \"%s\" at %s: malformed JSON pointer ('~' must be followed by 0 or 1)", ref, at);
            free(token);
            return NULL;
        }
        if (!next) {
            fail(c, "$ref \"%s\" at %s does not resolve: no \"%s\"", ref, at, token);
            free(token);
            return NULL;
        }
        free(token);
        node = next;
        p = end;
    }
    if (!json_is_object(node)) return fail(c, "$ref \"%s\" at %s must point to a schema object", ref, at);
    return node;
}

/* llama's _resolve_ref: the target becomes rule "ref" + pointer, visited
 * once; a reference met while its target is being visited just names it. */
static const char *ref_rule(converter *c, const char *ref, const char *at, unsigned *types) {
    json_t *target = resolve_ref(c, ref, at);
    if (!target) return NULL;
    char *frag_name = sanitize_name(strrchr(ref, '#') + 1);
    char *ref_name = str_printf("ref%s", frag_name);
    free(frag_name);
    ref_entry *e = find_ref_entry(c, ref);
    const char *result = NULL;
    if (e && !e->done) {
        e->used_recursively = true;
        *types = T_ALL;
        result = e->ref_name;
    } else if (find_rule(c, ref_name) >= 0) {
        if (e && e->rule && strcmp(e->rule, ref_name) == 0) {
            *types = e->types;
            result = c->rules[find_rule(c, ref_name)].name;
        } else {
            fail(c, "$ref \"%s\" at %s: its rule name \"%s\" is already taken by another definition or "
                    "property (llama would silently reuse it)", ref, at, ref_name);
        }
    } else {
        if (!e) {
            if (c->n_refs == c->cap_refs) {
                c->cap_refs = c->cap_refs ? c->cap_refs * 2 : 8;
                c->refs = mu_xrealloc(c->refs, c->cap_refs * sizeof *c->refs);
            }
            c->refs[c->n_refs] = (ref_entry){mu_xstrdup(ref), mu_xstrdup(ref_name), NULL, 0, false, false};
            e = &c->refs[c->n_refs++];
        }
        size_t idx = (size_t)(e - c->refs);
        e->done = false;
        unsigned t = 0;
        const char *got = visit(c, target, ref_name, ref + 1, NULL, &t);
        e = &c->refs[idx];
        e->done = true;
        if (got && e->used_recursively && strcmp(got, ref_name) != 0) {
            fail(c, "recursive $ref \"%s\" at %s: its target's rule came out as \"%s\", not \"%s\"", ref, at, got,
                 ref_name);
            got = NULL;
        }
        if (got) {
            free(e->rule);
            e->rule = mu_xstrdup(got);
            e->types = t;
            *types = t;
        }
        result = got;
    }
    free(ref_name);
    return result;
}

static const char *visit_ref(converter *c, json_t *schema, const char *rule_name, const char *path, branch *b) {
    consume(b, "$ref");
    snprintf(b->context, sizeof b->context, "together with \"$ref\"");
    json_t *ref = json_object_get(schema, "$ref");
    char *at = ptr_key(path, "$ref");
    const char *result = NULL;
    if (!json_is_string(ref)) {
        fail(c, "\"$ref\" at %s must be a string", at);
    } else {
        const char *target_rule = ref_rule(c, json_string_value(ref), at, &b->types);
        if (target_rule) result = add_rule(c, rule_name, target_rule);
    }
    free(at);
    return result;
}

/* ---- anyOf / oneOf / type arrays ---- */

static const char *visit_union(converter *c, json_t *schema, const char *name, const char *rule_name,
                               const char *path, branch *b) {
    json_t *one = json_object_get(schema, "oneOf"), *any = json_object_get(schema, "anyOf");
    if (one && any) return fail(c, "\"oneOf\" and \"anyOf\" at %s cannot be combined", where(path));
    const char *kw = one ? "oneOf" : "anyOf";
    json_t *alts = one ? one : any;
    consume(b, kw);
    snprintf(b->context, sizeof b->context, "together with \"%s\"", kw);
    char *at = ptr_key(path, kw);
    if (!json_is_array(alts) || json_array_size(alts) == 0) {
        fail(c, "\"%s\" at %s must be a non-empty array of schemas", kw, at);
        free(at);
        return NULL;
    }
    mu_buf body = {0};
    size_t i;
    json_t *alt;
    b->types = 0;
    json_array_foreach(alts, i, alt) {
        char *alt_name = name[0] ? str_printf("%s-%zu", name, i) : str_printf("alternative-%zu", i);
        char *alt_path = ptr_index(at, i);
        unsigned t = 0;
        const char *r = visit(c, alt, alt_name, alt_path, NULL, &t);
        free(alt_name);
        free(alt_path);
        if (!r) break;
        if (i) mu_buf_puts(&body, " | ");
        mu_buf_puts(&body, r);
        b->types |= t;
    }
    const char *result = c->failed ? NULL : add_rule(c, rule_name, mu_buf_str(&body));
    mu_buf_free(&body);
    free(at);
    return result;
}

/* "type": [...]: one alternative per type, each the whole schema with that
 * type (each checks the schema's keywords itself). */
static const char *visit_type_union(converter *c, json_t *schema, json_t *types, const char *name,
                                    const char *rule_name, const char *path, branch *b) {
    b->checked_by_alternatives = true;
    mu_buf body = {0};
    size_t i;
    json_t *t;
    json_array_foreach(types, i, t) {
        char *alt_name = name[0] ? str_printf("%s-%zu", name, i) : str_printf("alternative-%zu", i);
        unsigned got = 0;
        const char *r = visit(c, schema, alt_name, path, json_string_value(t), &got);
        free(alt_name);
        if (!r) break;
        if (i) mu_buf_puts(&body, " | ");
        mu_buf_puts(&body, r);
        b->types |= got;
    }
    const char *result = c->failed ? NULL : add_rule(c, rule_name, mu_buf_str(&body));
    mu_buf_free(&body);
    return result;
}

/* ---- const / enum ---- */

static const char *visit_const(converter *c, json_t *schema, const char *rule_name, branch *b) {
    json_t *v = json_object_get(schema, "const");
    consume(b, "const");
    snprintf(b->context, sizeof b->context, "together with \"const\"");
    b->types = value_types(v);
    mu_buf body = {0};
    add_constant(&body, v);
    mu_buf_puts(&body, " space");
    const char *result = add_rule(c, rule_name, mu_buf_str(&body));
    mu_buf_free(&body);
    return result;
}

static const char *visit_enum(converter *c, json_t *schema, const char *rule_name, const char *path, branch *b) {
    json_t *values = json_object_get(schema, "enum");
    consume(b, "enum");
    snprintf(b->context, sizeof b->context, "together with \"enum\"");
    if (!json_is_array(values) || json_array_size(values) == 0) {
        char *at = ptr_key(path, "enum");
        fail(c, "\"enum\" at %s must be a non-empty array", at);
        free(at);
        return NULL;
    }
    mu_buf body = {0};
    size_t i;
    json_t *v;
    mu_buf_putc(&body, '(');
    json_array_foreach(values, i, v) {
        if (i) mu_buf_puts(&body, " | ");
        add_constant(&body, v);
        b->types |= value_types(v);
    }
    mu_buf_puts(&body, ") space");
    const char *result = add_rule(c, rule_name, mu_buf_str(&body));
    mu_buf_free(&body);
    return result;
}

/* ---- objects ---- */

static bool collect_properties(converter *c, json_t *schema, const char *path, prop_list *out) {
    json_t *props = json_object_get(schema, "properties");
    if (!props) return true;
    char *at = ptr_key(path, "properties");
    bool ok = json_is_object(props);
    if (!ok) fail(c, "\"properties\" at %s must be an object", at);
    const char *key;
    json_t *val;
    if (ok) {
        json_object_foreach(props, key, val) props_push(out, key, val, ptr_key(at, key));
    }
    free(at);
    return ok;
}

/* "required" as a list; every name must be a declared property, since the
 * grammar can only produce declared ones. */
static bool collect_required(converter *c, json_t *schema, const char *path, const prop_list *props,
                             strlist *out) {
    json_t *req = json_object_get(schema, "required");
    if (!req) return true;
    char *at = ptr_key(path, "required");
    bool ok = json_is_array(req);
    if (!ok) fail(c, "\"required\" at %s must be an array of property names", at);
    size_t i;
    json_t *name;
    if (ok) {
        json_array_foreach(req, i, name) {
            bool declared = false;
            for (size_t k = 0; json_is_string(name) && k < props->n && !declared; k++)
                declared = strcmp(props->v[k].key, json_string_value(name)) == 0;
            if (!json_is_string(name)) {
                ok = refuse(c, "\"required\" at %s: entry %zu is not a string", at, i);
            } else if (!declared) {
                ok = refuse(c, "required property \"%s\" at %s/%zu is not declared in \"properties\"",
                          json_string_value(name), at, i);
            }
            if (!ok) break;
            sl_push(out, json_string_value(name));
        }
    }
    free(at);
    return ok;
}

static const char *visit_object(converter *c, json_t *schema, const char *name, const char *rule_name,
                                const char *path, branch *b) {
    consume(b, "properties");
    consume(b, "required");
    consume(b, "additionalProperties");
    snprintf(b->context, sizeof b->context, "together with \"%s\"",
             json_object_get(schema, "properties") ? "properties" : "additionalProperties");
    b->types = T_OBJ;
    json_t *additional = json_object_get(schema, "additionalProperties");
    char *ap_path = ptr_key(path, "additionalProperties");
    prop_list props = {0};
    strlist required = {0};
    const char *result = NULL;
    if (additional && !json_is_boolean(additional) && !json_is_object(additional))
        fail(c, "\"additionalProperties\" at %s must be a boolean or a schema", ap_path);
    else if (collect_properties(c, schema, path, &props) && collect_required(c, schema, path, &props, &required))
        result = object_rule(c, &props, &required, name, additional, ap_path, rule_name);
    props_free(&props);
    sl_free(&required);
    free(ap_path);
    return result;
}

/* ---- allOf ---- */

typedef struct {
    prop_list props;
    strlist required;
    json_t **enums;
    size_t n_enums;
    bool enum_in_any_of;
} all_of_parts;

/* An object part of allOf: its properties join the merged object, all
 * required unless the part sits inside an anyOf. */
static bool add_all_of_object(converter *c, json_t *comp, bool is_required, const char *cpath,
                              all_of_parts *parts) {
    static const char *const OBJECT_KEYS[] = {"properties", "required", "type"};
    json_t *type = json_object_get(comp, "type");
    prop_list mine = {0};
    strlist req = {0};
    bool ok = only_keys(c, comp, cpath, OBJECT_KEYS, 3) &&
              (!type || (json_is_string(type) && strcmp(json_string_value(type), "object") == 0) ||
               refuse(c, "allOf entry at %s with \"properties\" must have type \"object\"", cpath)) &&
              collect_properties(c, comp, cpath, &mine) && collect_required(c, comp, cpath, &mine, &req);
    if (ok && !is_required && req.n)
        ok = refuse(c, "\"required\" at %s/required inside anyOf within allOf is not supported (llama makes "
                       "these properties optional)", cpath);
    for (size_t i = 0; ok && i < mine.n; i++) {
        for (size_t k = 0; ok && k < parts->props.n; k++)
            if (strcmp(parts->props.v[k].key, mine.v[i].key) == 0)
                ok = refuse(c, "property at %s is declared twice across allOf", mine.v[i].path);
        if (!ok) break;
        props_push(&parts->props, mine.v[i].key, mine.v[i].schema, mine.v[i].path);
        mine.v[i].path = NULL;
        if (is_required) sl_push(&parts->required, mine.v[i].key);
    }
    props_free(&mine);
    sl_free(&req);
    return ok;
}

/* A string-enum part of allOf: the enums are intersected. */
static bool add_all_of_enum(converter *c, json_t *comp, bool is_required, const char *cpath, all_of_parts *parts) {
    static const char *const ENUM_KEYS[] = {"enum", "type"};
    json_t *values = json_object_get(comp, "enum"), *type = json_object_get(comp, "type");
    bool ok = only_keys(c, comp, cpath, ENUM_KEYS, 2) &&
              (!type || (json_is_string(type) && strcmp(json_string_value(type), "string") == 0) ||
               refuse(c, "allOf entry at %s with \"enum\" must have type \"string\"", cpath)) &&
              ((json_is_array(values) && json_array_size(values) > 0) ||
               refuse(c, "\"enum\" at %s/enum must be a non-empty array", cpath));
    size_t i;
    json_t *v;
    json_array_foreach(values, i, v) {
        if (ok && !json_is_string(v))
            ok = refuse(c, "\"enum\" at %s/enum: only string values are supported inside allOf", cpath);
    }
    if (ok) {
        parts->enums = mu_xrealloc(parts->enums, (parts->n_enums + 1) * sizeof *parts->enums);
        parts->enums[parts->n_enums++] = values;
        parts->enum_in_any_of |= !is_required;
    }
    return ok;
}

/* llama's add_component: a part given directly or through one local $ref
 * (which llama does not follow further). */
static bool add_all_of_part(converter *c, json_t *comp, bool is_required, const char *cpath, all_of_parts *parts) {
    static const char *const ONLY_REF[] = {"$ref"};
    if (!json_is_object(comp)) return refuse(c, "allOf entry at %s must be a schema object", cpath);
    json_t *ref = json_object_get(comp, "$ref");
    char *owned_path = NULL;
    if (ref) {
        if (!only_keys(c, comp, cpath, ONLY_REF, 1)) return false;
        char *at = ptr_key(cpath, "$ref");
        json_t *target = json_is_string(ref) ? resolve_ref(c, json_string_value(ref), at)
                                             : fail(c, "\"$ref\" at %s must be a string", at);
        if (target && json_object_get(target, "$ref"))
            target = fail(c, "$ref at %s points to another $ref, which llama does not follow inside allOf", at);
        free(at);
        if (!target) return false;
        owned_path = mu_xstrdup(json_string_value(ref) + 1);
        cpath = owned_path;
        comp = target;
    }
    bool ok;
    if (json_object_get(comp, "properties")) ok = add_all_of_object(c, comp, is_required, cpath, parts);
    else if (json_object_get(comp, "enum")) ok = add_all_of_enum(c, comp, is_required, cpath, parts);
    else ok = refuse(c, "allOf entry at %s must have \"properties\" or \"enum\" (llama ignores anything else)", cpath);
    free(owned_path);
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Strings present in every enum, sorted like Python's sorted(). */
static const char *all_of_enum_rule(converter *c, const all_of_parts *parts, const char *rule_name,
                                    const char *path) {
    strlist common = {0};
    size_t i;
    json_t *v;
    json_array_foreach(parts->enums[0], i, v) {
        const char *s = json_string_value(v);
        bool everywhere = sl_find(&common, s) < 0;
        for (size_t k = 1; k < parts->n_enums && everywhere; k++) {
            bool found = false;
            size_t j;
            json_t *w;
            json_array_foreach(parts->enums[k], j, w) found = found || strcmp(json_string_value(w), s) == 0;
            everywhere = found;
        }
        if (everywhere) sl_push(&common, s);
    }
    const char *result = NULL;
    if (!common.n) {
        fail(c, "the enums of allOf at %s/allOf have no value in common", path);
    } else {
        qsort(common.v, common.n, sizeof *common.v, cmp_str);
        mu_buf body = {0};
        mu_buf_putc(&body, '(');
        for (size_t k = 0; k < common.n; k++) {
            json_t *s = json_string(common.v[k]);
            if (k) mu_buf_puts(&body, " | ");
            add_constant(&body, s);
            json_decref(s);
        }
        mu_buf_puts(&body, ") space");
        result = add_rule(c, rule_name, mu_buf_str(&body));
        mu_buf_free(&body);
    }
    sl_free(&common);
    return result;
}

static bool collect_all_of(converter *c, json_t *all, const char *at, all_of_parts *parts) {
    size_t i;
    json_t *comp;
    json_array_foreach(all, i, comp) {
        char *cpath = ptr_index(at, i);
        json_t *any = json_is_object(comp) ? json_object_get(comp, "anyOf") : NULL;
        static const char *const ONLY_ANY[] = {"anyOf"};
        bool ok;
        if (!any) {
            ok = add_all_of_part(c, comp, true, cpath, parts);
        } else if ((ok = only_keys(c, comp, cpath, ONLY_ANY, 1))) {
            char *any_at = ptr_key(cpath, "anyOf");
            size_t j;
            json_t *alt;
            if (!json_is_array(any) || json_array_size(any) == 0)
                ok = refuse(c, "\"anyOf\" at %s must be a non-empty array of schemas", any_at);
            json_array_foreach(any, j, alt) {
                char *alt_path = ptr_index(any_at, j);
                ok = ok && add_all_of_part(c, alt, false, alt_path, parts);
                free(alt_path);
            }
            free(any_at);
        }
        free(cpath);
        if (!ok) return false;
    }
    return true;
}

static const char *visit_all_of(converter *c, json_t *schema, const char *name, const char *rule_name,
                                const char *path, branch *b) {
    consume(b, "allOf");
    snprintf(b->context, sizeof b->context, "together with \"allOf\"");
    json_t *all = json_object_get(schema, "allOf");
    char *at = ptr_key(path, "allOf");
    all_of_parts parts = {0};
    const char *result = NULL;
    if (!json_is_array(all) || json_array_size(all) == 0) {
        fail(c, "\"allOf\" at %s must be a non-empty array of schemas", at);
    } else if (collect_all_of(c, all, at, &parts)) {
        if (parts.n_enums && parts.props.n) {
            fail(c, "allOf at %s mixes enums and properties", at);
        } else if (parts.enum_in_any_of) {
            fail(c, "allOf at %s: enums inside anyOf are not supported (llama would intersect them)", at);
        } else if (parts.n_enums) {
            b->types = T_STR;
            result = all_of_enum_rule(c, &parts, rule_name, path);
        } else {
            b->types = T_OBJ;
            result = object_rule(c, &parts.props, &parts.required, name, NULL, "", rule_name);
        }
    }
    props_free(&parts.props);
    sl_free(&parts.required);
    free(parts.enums);
    free(at);
    return result;
}

/* ---- arrays ---- */

static const char *tuple_rule(converter *c, json_t *schema, json_t *items, const char *items_at,
                              const char *name, const char *rule_name, const char *path) {
    bool has_min, has_max;
    long min = 0, max = 0;
    size_t n = json_array_size(items);
    if (!read_count(c, schema, path, "minItems", &has_min, &min) ||
        !read_count(c, schema, path, "maxItems", &has_max, &max))
        return NULL;
    if ((has_min && (size_t)min > n) || (has_max && (size_t)max < n))
        return fail(c, "minItems/maxItems at %s contradict the %zu-item tuple (llama ignores them)", where(path), n);
    mu_buf body = {0};
    size_t i;
    json_t *item;
    mu_buf_puts(&body, "\"[\" space ");
    json_array_foreach(items, i, item) {
        char *tuple_name = str_printf("tuple-%zu", i);
        char *item_name = child_name(name, tuple_name);
        char *item_path = ptr_index(items_at, i);
        const char *r = visit(c, item, item_name, item_path, NULL, NULL);
        free(tuple_name);
        free(item_name);
        free(item_path);
        if (!r) break;
        if (i) mu_buf_puts(&body, " \",\" space ");
        mu_buf_puts(&body, r);
    }
    mu_buf_puts(&body, " \"]\" space");
    const char *result = c->failed ? NULL : add_rule(c, rule_name, mu_buf_str(&body));
    mu_buf_free(&body);
    return result;
}

static const char *list_rule(converter *c, json_t *schema, json_t *items, const char *items_at,
                             const char *name, const char *rule_name, const char *path) {
    bool has_min, has_max;
    long min = 0, max = 0;
    if (!read_count(c, schema, path, "minItems", &has_min, &min) ||
        !read_count(c, schema, path, "maxItems", &has_max, &max))
        return NULL;
    if (has_max && min > max) return fail(c, "minItems exceeds maxItems at %s", where(path));
    char *item_name = child_name(name, "item");
    const char *item_rule = visit(c, items, item_name, items_at, NULL, NULL);
    free(item_name);
    if (!item_rule) return NULL;
    char *rep = repetition(item_rule, min, has_max, max, "\",\" space");
    char *body = str_printf("\"[\" space %s \"]\" space", rep);
    const char *result = add_rule(c, rule_name, body);
    free(rep);
    free(body);
    return result;
}

static const char *visit_array(converter *c, json_t *schema, const char *name, const char *rule_name,
                               const char *path, branch *b) {
    json_t *items = json_object_get(schema, "items"), *prefix = json_object_get(schema, "prefixItems");
    b->types = T_ARR;
    consume(b, "additionalItems");
    consume(b, "minItems");
    consume(b, "maxItems");
    snprintf(b->context, sizeof b->context, "together with \"%s\"", items ? "items" : "prefixItems");
    const char *kw = items ? "items" : "prefixItems";
    char *at = ptr_key(path, kw);
    const char *result = NULL;
    consume(b, kw);
    if (items && json_is_array(items)) {
        result = tuple_rule(c, schema, items, at, name, rule_name, path);
    } else if (items && json_is_object(items)) {
        result = list_rule(c, schema, items, at, name, rule_name, path);
    } else if (items && json_is_false(items) && json_is_array(prefix)) {
        /* Deliberate extension: llama crashes on "items": false, which says
         * exactly what its tuple rule means. */
        consume(b, "prefixItems");
        char *prefix_at = ptr_key(path, "prefixItems");
        result = tuple_rule(c, schema, prefix, prefix_at, name, rule_name, path);
        free(prefix_at);
    } else if (items) {
        fail(c, "\"items\" at %s must be a schema object or an array of schemas", at);
    } else if (json_is_array(prefix)) {
        result = tuple_rule(c, schema, prefix, at, name, rule_name, path);
    } else {
        fail(c, "\"prefixItems\" at %s must be an array of schemas", at);
    }
    free(at);
    return result;
}

/* ---- strings ---- */

static const char *visit_pattern(converter *c, json_t *schema, const char *rule_name, const char *path,
                                 branch *b) {
    consume(b, "pattern");
    snprintf(b->context, sizeof b->context, "together with \"pattern\"");
    b->types = T_STR;
    json_t *pat = json_object_get(schema, "pattern");
    char *at = ptr_key(path, "pattern");
    const char *s = json_is_string(pat) ? json_string_value(pat) : NULL;
    size_t len = s ? strlen(s) : 0;
    const char *result = NULL;
    if (!s) {
        fail(c, "\"pattern\" at %s must be a string", at);
    } else if (len < 2 || s[0] != '^' || s[len - 1] != '$') {
        fail(c, "pattern \"%s\" at %s must start with '^' and end with '$' (llama only translates anchored "
                "patterns)", s, at);
    } else {
        pat_ctx p = {.c = c, .pattern = s, .at = at, .rule_name = rule_name, .s = s + 1};
        size_t inner = len - 2;
        p.cp = mu_xmalloc((inner + 1) * sizeof *p.cp);
        p.off = mu_xmalloc((inner + 1) * sizeof *p.off);
        for (size_t o = 0; o < inner;) {
            p.off[p.n] = o;
            o += utf8_decode(p.s + o, &p.cp[p.n]);
            p.n++;
        }
        p.off[p.n] = inner;
        pat_item top;
        if (pat_transform(&p, 0, false, &top)) {
            char *r = to_rule(&top);
            char *body = str_printf("\"\\\"\" (%s) \"\\\"\" space", r);
            result = add_rule(c, rule_name, body);
            free(body);
            free(r);
            free(top.txt);
            free(top.ne);
        }
        free(p.cp);
        free(p.off);
        sl_free(&p.sub_bodies);
        sl_free(&p.sub_names);
    }
    free(at);
    return result;
}

static bool is_uuid_format(const char *f) {
    return strncmp(f, "uuid", 4) == 0 && (!f[4] || (f[4] >= '1' && f[4] <= '5' && !f[5]));
}

static const char *visit_format(converter *c, const char *format, const char *rule_name, branch *b) {
    consume(b, "format");
    snprintf(b->context, sizeof b->context, "together with \"format\"");
    b->types = T_STR;
    if (is_uuid_format(format)) return add_builtin_as(c, strcmp(rule_name, "root") == 0 ? "root" : format, "uuid");
    char *prim = str_printf("%s-string", format);
    const char *result = add_rule(c, rule_name, add_builtin(c, prim));
    free(prim);
    return result;
}

static const char *visit_string_length(converter *c, json_t *schema, const char *rule_name, const char *path,
                                       branch *b) {
    consume(b, "minLength");
    consume(b, "maxLength");
    snprintf(b->context, sizeof b->context, "for type \"string\"");
    b->types = T_STR;
    const char *char_rule = add_builtin(c, "char");
    bool has_min, has_max;
    long min = 0, max = 0;
    if (!read_count(c, schema, path, "minLength", &has_min, &min) ||
        !read_count(c, schema, path, "maxLength", &has_max, &max))
        return NULL;
    if (has_max && min > max) return fail(c, "minLength exceeds maxLength at %s", where(path));
    char *rep = repetition(char_rule, min, has_max, max, NULL);
    char *body = str_printf("\"\\\"\" %s \"\\\"\" space", rep);
    const char *result = add_rule(c, rule_name, body);
    free(rep);
    free(body);
    return result;
}

/* ---- integers ---- */

static bool read_bound(converter *c, json_t *schema, const char *path, const char *key, bool *present,
                       int64_t *out) {
    json_t *v = json_object_get(schema, key);
    *present = v != NULL;
    if (!v) return true;
    if (!json_is_integer(v) || json_integer_value(v) > 10 * INT_LIMIT || json_integer_value(v) < -10 * INT_LIMIT) {
        char *at = ptr_key(path, key);
        fail(c, "\"%s\" at %s must be an integer of at most 16 digits", key, at);
        free(at);
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

static const char *visit_int_range(converter *c, json_t *schema, const char *rule_name, const char *path,
                                   branch *b) {
    static const char *const BOUNDS[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (size_t i = 0; i < 4; i++) consume(b, BOUNDS[i]);
    snprintf(b->context, sizeof b->context, "for type \"integer\"");
    b->types = T_INT;
    bool present[4];
    int64_t v[4] = {0};
    for (size_t i = 0; i < 4; i++)
        if (!read_bound(c, schema, path, BOUNDS[i], &present[i], &v[i])) return NULL;
    if (present[0] && present[1])
        return fail(c, "\"minimum\" and \"exclusiveMinimum\" at %s cannot be combined", where(path));
    if (present[2] && present[3])
        return fail(c, "\"maximum\" and \"exclusiveMaximum\" at %s cannot be combined", where(path));
    bool has_min = present[0] || present[1], has_max = present[2] || present[3];
    int64_t min = present[0] ? v[0] : v[1] + 1, max = present[2] ? v[2] : v[3] - 1;
    if ((has_min && (min > INT_LIMIT || min < -INT_LIMIT)) || (has_max && (max > INT_LIMIT || max < -INT_LIMIT)))
        return fail(c, "integer bounds at %s must lie within +-%" PRId64 " (llama's integers have at most 16 "
                       "digits)", where(path), INT_LIMIT);
    if (has_min && has_max && min > max) return fail(c, "no integer satisfies the bounds at %s", where(path));
    /* Deliberate difference: where llama's one-sided construction is wrong
     * (see llama_min_only_exact; a negative maximum alone allowed "-05"),
     * use its two-sided one up to the 16-digit limit. */
    if (has_min && !has_max && !llama_min_only_exact(min)) {
        has_max = true;
        max = INT_LIMIT;
    }
    if (has_max && !has_min && max < 0) {
        has_min = true;
        min = -INT_LIMIT;
    }
    mu_buf body = {0};
    mu_buf_putc(&body, '(');
    int_range(&body, has_min, min, has_max, max, 16, true);
    mu_buf_puts(&body, ") space");
    const char *result = add_rule(c, rule_name, mu_buf_str(&body));
    mu_buf_free(&body);
    return result;
}

/* ---- the case analysis, in llama's order ---- */

static bool type_is(const char *stype, const char *a, const char *b_, const char *c_) {
    if (!stype) return true;
    return strcmp(stype, a) == 0 || (b_ && strcmp(stype, b_) == 0) || (c_ && strcmp(stype, c_) == 0);
}

static const char *visit_branch(converter *c, json_t *schema, const char *name, const char *rule_name,
                                const char *path, const char *override, branch *b) {
    json_t *type = json_object_get(schema, "type");
    const char *stype = override ? override : json_string_value(type);
    json_t *additional = json_object_get(schema, "additionalProperties");
#define HAS(key) (json_object_get(schema, key) != NULL)
    if (HAS("$ref")) return visit_ref(c, schema, rule_name, path, b);
    if (HAS("oneOf") || HAS("anyOf")) return visit_union(c, schema, name, rule_name, path, b);
    if (!override && json_is_array(type)) return visit_type_union(c, schema, type, name, rule_name, path, b);
    if (HAS("const")) return visit_const(c, schema, rule_name, b);
    if (HAS("enum")) return visit_enum(c, schema, rule_name, path, b);
    if (type_is(stype, "object", NULL, NULL) && (HAS("properties") || (additional && !json_is_true(additional))))
        return visit_object(c, schema, name, rule_name, path, b);
    if (type_is(stype, "object", "string", NULL) && HAS("allOf"))
        return visit_all_of(c, schema, name, rule_name, path, b);
    if (type_is(stype, "array", NULL, NULL) && (HAS("items") || HAS("prefixItems")))
        return visit_array(c, schema, name, rule_name, path, b);
    if (type_is(stype, "string", NULL, NULL) && HAS("pattern")) return visit_pattern(c, schema, rule_name, path, b);
    json_t *format = json_object_get(schema, "format");
    if (format && !json_is_string(format)) {
        char *at = ptr_key(path, "format");
        fail(c, "\"format\" at %s must be a string", at);
        free(at);
        return NULL;
    }
    const char *fmt = json_string_value(format);
    if (type_is(stype, "string", NULL, NULL) && fmt && is_known_format(fmt)) return visit_format(c, fmt, rule_name, b);
    if (stype && strcmp(stype, "string") == 0 && (HAS("minLength") || HAS("maxLength")))
        return visit_string_length(c, schema, rule_name, path, b);
    if (type_is(stype, "integer", NULL, NULL) &&
        (HAS("minimum") || HAS("exclusiveMinimum") || HAS("maximum") || HAS("exclusiveMaximum")))
        return visit_int_range(c, schema, rule_name, path, b);
#undef HAS
    if ((stype && strcmp(stype, "object") == 0) || json_object_size(schema) == 0) {
        snprintf(b->context, sizeof b->context, "for type \"object\"");
        b->types = T_OBJ;
        return add_rule(c, rule_name, add_builtin(c, "object"));
    }
    if (!stype) {
        snprintf(b->context, sizeof b->context, "in a schema without \"type\"");
        b->types = T_ALL;
        return add_rule(c, rule_name, add_builtin(c, "value"));
    }
    snprintf(b->context, sizeof b->context, "for type \"%s\"", stype);
    b->types = type_bits(stype);
    return add_builtin_as(c, strcmp(rule_name, "root") == 0 ? "root" : stype, stype);
}

static const char *visit(converter *c, json_t *schema, const char *name, const char *path,
                         const char *type_override, unsigned *types_out) {
    if (!json_is_object(schema))
        return fail(c, "schema at %s must be a JSON object (boolean schemas are not supported)", where(path));
    unsigned declared;
    if (!declared_types(c, schema, path, &declared)) return NULL;
    char *rule_name = is_reserved_name(name) ? str_printf("%s-", name) : mu_xstrdup(name[0] ? name : "root");
    branch b = {0};
    const char *result = visit_branch(c, schema, name, rule_name, path, type_override, &b);
    if (result && !b.checked_by_alternatives && !check_keywords(c, schema, path, &b)) result = NULL;
    free(rule_name);
    if (result && types_out) *types_out = b.types;
    return c->failed ? NULL : result;
}

/* ------------------------------------------------------------------------ */

static int cmp_rule(const void *a, const void *b) {
    return strcmp(((const gbnf_rule *)a)->name, ((const gbnf_rule *)b)->name);
}

static void converter_free(converter *c) {
    for (size_t i = 0; i < c->n_rules; i++) {
        free(c->rules[i].name);
        free(c->rules[i].body);
    }
    for (size_t i = 0; i < c->n_refs; i++) {
        free(c->refs[i].ref);
        free(c->refs[i].ref_name);
        free(c->refs[i].rule);
    }
    free(c->rules);
    free(c->refs);
}

char *mu_json_schema_to_gbnf(const char *schema_json, size_t len, mu_error *err) {
    json_error_t jerr;
    json_t *doc = json_loadb(schema_json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc) {
        mu_err_set(err, "json schema: invalid JSON at line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(doc)) {
        json_decref(doc);
        mu_err_set(err, "json schema: the document must be a JSON object");
        return NULL;
    }
    converter c = {.doc = doc};
    add_rule(&c, "space", SPACE_RULE);
    visit(&c, doc, "", "", NULL, NULL);
    char *out = NULL;
    if (c.failed) {
        mu_err_set(err, "json schema: %s", c.msg);
    } else {
        qsort(c.rules, c.n_rules, sizeof *c.rules, cmp_rule);
        mu_buf b = {0};
        for (size_t i = 0; i < c.n_rules; i++) mu_buf_appendf(&b, "%s ::= %s\n", c.rules[i].name, c.rules[i].body);
        out = mu_buf_take(&b);
    }
    converter_free(&c);
    json_decref(doc);
    return out;
}
