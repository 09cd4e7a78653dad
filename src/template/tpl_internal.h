/* Internals of the chat-template interpreter: values, AST, render context. */
#ifndef MUSER_TEMPLATE_INTERNAL_H
#define MUSER_TEMPLATE_INTERNAL_H
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "template/template.h"
#include "util/common.h"

/* ------------------------------------------------------------------ arena */
typedef struct tpl_arena_block tpl_arena_block;
typedef struct tpl_arena {
    tpl_arena_block *head;
} tpl_arena;
void *tpl_arena_alloc(tpl_arena *a, size_t n); /* zeroed */
void tpl_arena_free(tpl_arena *a);

/* Byte buffers are mu_buf (src/util/common.h), limited to the render's
 * max_str where they hold rendered text: {.limit = c->max_str}. */

/* ------------------------------------------------------------------ values */
typedef enum {
    TV_UNDEFINED,
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,
    TV_DICT,
    TV_FUNC,
    TV_NS,
    TV_LOOP
} tv_type;

/* Sequence flavours share one representation; they differ in repr,
 * len(), indexing and truthiness exactly where Python's types differ. */
typedef enum {
    SEQ_LIST,
    SEQ_TUPLE,
    SEQ_GENERATOR, /* map/select/...: always truthy, no len, no index */
    SEQ_REVITER,   /* reversed(list) */
    SEQ_DICT_KEYS,
    SEQ_DICT_VALUES,
    SEQ_DICT_ITEMS /* views: len, no index */
} tv_seq_kind;

#define TV_IMMORTAL UINT32_MAX

typedef struct tv_str tv_str;
typedef struct tv_list tv_list;
typedef struct tv_dict tv_dict;
typedef struct tv_func tv_func;
typedef struct tv_ns tv_ns;
typedef struct tv_loop tv_loop;
typedef struct tv_undef tv_undef;

typedef struct tv_value {
    uint8_t type;
    union {
        bool b;
        int64_t i;
        double f;
        tv_str *s;
        tv_list *l;
        tv_dict *d;
        tv_func *fn;
        tv_ns *ns;
        tv_loop *loop;
        tv_undef *u; /* may be NULL: anonymous undefined */
    } as;
} tv_value;

struct tv_str {
    uint32_t refs;
    uint8_t markup; /* markupsafe.Markup: `+` escapes plain operands */
    uint8_t ascii;
    size_t len; /* bytes */
    char s[];   /* NUL-terminated */
};
struct tv_list {
    uint32_t refs;
    uint8_t kind;
    size_t n, cap;
    tv_value *v;
};
struct tv_dict {
    uint32_t refs;
    size_t n, cap;
    tv_value *k, *v;
    uint32_t *slots; /* open-addressing index (1-based entry ids), NULL while small */
    size_t nslots;
};
struct tv_undef {
    uint32_t refs;
    const char *exc; /* "UndefinedError" or "SecurityError" */
    tv_str *msg;     /* what raising it reports */
};
struct tv_ns {
    uint32_t refs;
    tv_dict *attrs;
    struct tv_ns *next_live; /* render-wide list, to break cycles at the end */
};

struct tpl_ctx;
struct tpl_node;
struct tpl_scope;

typedef struct tpl_args {
    size_t npos, nkw;
    tv_value *pos;
    tv_str **kwname;
    tv_value *kw;
} tpl_args;

typedef bool (*tpl_builtin_fn)(struct tpl_ctx *c, const tv_value *self, const tpl_args *a, tv_value *out);

typedef enum { FN_BUILTIN, FN_MACRO } tv_func_kind;
struct tv_func {
    uint32_t refs;
    uint8_t kind;
    const char *name;
    tpl_builtin_fn fn;            /* FN_BUILTIN */
    const void *data;             /* FN_BUILTIN: passed as ctx->call_data */
    const char *pytype;           /* FN_BUILTIN: Python type name; NULL: builtin_function_or_method */
    const char *pyrepr;           /* FN_BUILTIN: repr() where Python's is deterministic, else NULL */
    tv_value self;                /* bound receiver (methods), else undefined */
    const struct tpl_node *macro; /* FN_MACRO: the macro / call-block node */
    struct tpl_scope *scope;      /* FN_MACRO: defining scope (lives for the render) */
};
struct tv_loop {
    uint32_t refs;
    tv_list *items;
    size_t index0;
    int depth0;
    bool has_changed;
    tv_value last_changed;       /* loop.changed() memory */
    const struct tpl_node *node; /* the for statement (recursive loop calls) */
    struct tpl_scope *scope;     /* its scope; valid only while active */
    bool active;
};

static inline tv_value tv_undef_anon(void) {
    tv_value v = {.type = TV_UNDEFINED};
    v.as.u = NULL;
    return v;
}
static inline tv_value tv_none(void) {
    tv_value v = {.type = TV_NONE};
    v.as.i = 0;
    return v;
}
static inline tv_value tv_bool(bool b) {
    tv_value v = {.type = TV_BOOL};
    v.as.b = b;
    return v;
}
static inline tv_value tv_int(int64_t i) {
    tv_value v = {.type = TV_INT};
    v.as.i = i;
    return v;
}
static inline tv_value tv_float(double f) {
    tv_value v = {.type = TV_FLOAT};
    v.as.f = f;
    return v;
}
static inline bool tv_is_number(tv_value v) { return v.type == TV_INT || v.type == TV_FLOAT || v.type == TV_BOOL; }

tv_value tv_ref(tv_value v);
void tv_unref(tv_value v);
static inline void tv_move(tv_value *dst, tv_value src) {
    tv_unref(*dst);
    *dst = src;
}

/* Strings. Creation never fails: callers check lengths against the
 * render's size limit before building big strings. */
tv_value tv_str_new(const char *s, size_t n);
tv_value tv_str_cstr(const char *s);
tv_value tv_str_markup(tv_value s, bool markup);  /* consumes s */
tv_value tv_str_from_buf(mu_buf *b);              /* takes the buffer's bytes */
tv_str *tv_str_immortal(const char *s, size_t n); /* for the AST; freed by tv_str_free_immortal */
void tv_str_free_immortal(tv_str *s);
size_t tv_str_cplen(const tv_str *s); /* length in code points */
bool tv_str_eq(const tv_str *a, const char *s, size_t n);
static inline bool tv_str_is(const tv_str *a, const char *lit) { return tv_str_eq(a, lit, strlen(lit)); }

/* Lists. */
tv_value tv_list_new(tv_seq_kind kind, size_t cap);
void tv_list_push(tv_list *l, tv_value v); /* steals v */
static inline tv_value tv_list_val(tv_list *l) {
    tv_value v = {.type = TV_LIST};
    v.as.l = l;
    return v;
}

/* Dicts: insertion-ordered, Python key equality (1 == 1.0 == True). */
tv_value tv_dict_new(void);
void tv_dict_set(tv_dict *d, tv_value k, tv_value v); /* steals both */
const tv_value *tv_dict_get(const tv_dict *d, tv_value key);
const tv_value *tv_dict_get_str(const tv_dict *d, const char *s, size_t n);
tv_value tv_dict_copy(const tv_dict *d);
static inline tv_value tv_dict_val(tv_dict *d) {
    tv_value v = {.type = TV_DICT};
    v.as.d = d;
    return v;
}

tv_value tv_func_builtin(const char *name, tpl_builtin_fn fn, tv_value self); /* refs self */
tv_value tv_undef_msg(const char *exc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Python semantics. */
bool tv_truthy(tv_value v);
bool tv_equal(tv_value a, tv_value b);
const char *tv_type_name(tv_value v);             /* type(x).__name__ */
void tv_object_type_repr(mu_buf *b, tv_value v);  /* jinja2.utils.object_type_repr */
void tv_write_str(mu_buf *b, tv_value v);         /* str(x) */
void tv_write_repr(mu_buf *b, tv_value v);        /* repr(x) */
void tv_write_float(mu_buf *b, double f);         /* repr(float) */
void tv_write_pystr_repr(mu_buf *b, const char *s, size_t n);
uint64_t tv_hash(tv_value v);

/* UTF-8 helpers (code points as Python str sees them). */
uint32_t tpl_utf8_next(const char *s, size_t n, size_t *i); /* lenient: bad byte -> U+FFFD */
void tpl_utf8_put(mu_buf *b, uint32_t cp);
bool tpl_py_isspace(uint32_t cp);
size_t tpl_utf8_offset(const char *s, size_t n, size_t cps); /* byte offset of code point #cps */

/* ---------------------------------------------------------------------- AST */
typedef enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_TUPLE,
    N_LIST,
    N_DICT,
    N_GETATTR,
    N_GETITEM,
    N_SLICE,
    N_CALL,
    N_FILTER,
    N_TEST,
    N_BINOP,
    N_CONCAT,
    N_COMPARE,
    N_AND,
    N_OR,
    N_NOT,
    N_NEG,
    N_POS,
    N_COND,
    N_NSREF,
    /* statements */
    S_OUTPUT,
    S_DATA,
    S_FOR,
    S_IF,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_CALLBLOCK,
    S_FILTERBLOCK,
    S_BREAK,
    S_CONTINUE,
    S_WITH,
    S_BODY
} tpl_node_kind;

typedef enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN
} tpl_op;

typedef struct tpl_nodes {
    struct tpl_node **v;
    size_t n;
} tpl_nodes;

/* One node shape for everything; fields are used per kind (see parser). */
typedef struct tpl_node {
    uint8_t kind;
    uint8_t op;
    uint8_t flags;
    uint32_t pos;   /* byte offset in the normalised source */
    tv_value value; /* N_CONST value; names (immortal strings) */
    tv_str *name;   /* N_NAME/N_GETATTR/N_FILTER/N_TEST/N_NSREF attr/S_MACRO */
    struct tpl_node *a, *b, *c, *d;
    tpl_nodes list;   /* items / args / body */
    tpl_nodes list2;  /* dict values / kwarg values / else body */
    tv_str **kwnames; /* N_CALL/N_FILTER/N_TEST kwarg names (list2 holds values) */
    int builtin;      /* N_FILTER/N_TEST: index into the builtin table, -1 unknown */
} tpl_node;

enum {
    NF_SOFT = 1,        /* filter/test in an if: unknown name fails at runtime */
    NF_CALLER = 2,      /* macro body uses `caller` */
    NF_VARARGS = 4,     /* macro body uses `varargs` */
    NF_KWARGS = 8,      /* macro body uses `kwargs` */
    NF_GENERATION = 16, /* S_BODY from {% generation %} */
    NF_CONST = 32,      /* expression jinja2's optimizer could fold at compile time */
    NF_RECURSIVE = 64   /* for ... recursive */
};

struct mu_template {
    tpl_arena arena;
    char *src; /* normalised source (newlines -> \n, one trailing \n dropped) */
    size_t len;
    char *name;
    tpl_node *root;     /* S_BODY */
    tv_str **immortals; /* strings owned by the AST */
    size_t nimmortals, capimmortals;
    tv_str *nm_loop, *nm_caller, *nm_kwargs, *nm_varargs; /* names the runtime binds */
};

/* Lexer + parser (tpl_parse.c). Errors: "name:line:col: message". */
bool tpl_parse(mu_template *t, mu_error *err);
void tpl_line_col(const mu_template *t, size_t pos, int *line, int *col);

/* Builtin tables (tpl_filters.c / tpl_tests.c). */
typedef bool (*tpl_filter_fn)(struct tpl_ctx *c, tv_value in, const tpl_args *a, tv_value *out);
typedef bool (*tpl_test_fn)(struct tpl_ctx *c, tv_value in, const tpl_args *a, bool *out);
int tpl_filter_lookup(const char *name, size_t n); /* -1: jinja2 has no such filter */
int tpl_test_lookup(const char *name, size_t n);
bool tpl_call_filter(struct tpl_ctx *c, int id, tv_value in, const tpl_args *a, tv_value *out);
bool tpl_call_test(struct tpl_ctx *c, int id, tv_value in, const tpl_args *a, bool *out);
bool tpl_call_filter_named(struct tpl_ctx *c, tv_value name, tv_value in, const tpl_args *a, tv_value *out);
bool tpl_call_test_named(struct tpl_ctx *c, tv_value name, tv_value in, const tpl_args *a, bool *out);

/* ------------------------------------------------------------ render state */
typedef struct tpl_var {
    tv_str *name;
    tv_value value;
} tpl_var;

typedef struct tpl_scope {
    struct tpl_scope *parent;
    struct tpl_scope *next_alloc; /* render-wide list of captured scopes */
    bool captured;                /* a macro refers to it: freed at the end */
    tpl_var *vars;
    size_t n, cap;
} tpl_scope;

typedef struct tpl_ctx {
    const mu_template *t;
    mu_buf *out;
    tpl_scope *all_scopes; /* scopes captured by macros */
    tv_ns *live_ns;
    size_t max_str;
    uint64_t steps, max_steps;
    int depth;
    int loop_ctl;          /* 0, 1 break, 2 continue */
    bool const_mode;       /* evaluating like jinja2's compile-time as_const() */
    const void *call_data; /* data of the builtin being called */
    int year, month, day;  /* strftime_now */
    tv_value keep;         /* list keeping runtime-made variable names alive */
    /* first error wins */
    bool failed;
    bool pos_set;
    uint32_t err_pos;
    char exc[48];
    char msg[1024];
} tpl_ctx;

/* Raise a Python-style exception. Always returns false. */
bool tpl_fail(tpl_ctx *c, const char *exc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool tpl_fail_undefined(tpl_ctx *c, tv_value undef); /* raise the error an Undefined carries */
bool tpl_check_len(tpl_ctx *c, size_t n);            /* string/list size limit */
/* End a rendering into b: on ok (and within the size limit) *out takes b's
 * bytes as a string; otherwise b is freed and false returned (failure set). */
bool tpl_buf_finish(tpl_ctx *c, mu_buf *b, bool ok, tv_value *out);

/* Evaluator (tpl_eval.c). */
bool tpl_exec_root(tpl_ctx *c, tpl_scope *s);
tpl_scope *tpl_scope_new(tpl_ctx *c, tpl_scope *parent);
void tpl_scope_end(tpl_scope *s);                                  /* free now unless captured by a macro */
void tpl_scope_set_global(tpl_scope *s, tv_str *name, tv_value v); /* steals v; name must outlive s */
void tpl_scopes_free(tpl_ctx *c);
bool tpl_call_value(tpl_ctx *c, tv_value fn, const tpl_args *a, tv_value *out);

/* Operations with Python semantics, shared with the builtins (tpl_ops.c). */
bool tpl_getattr(tpl_ctx *c, tv_value obj, tv_value name, tv_value *out);
bool tpl_getitem(tpl_ctx *c, tv_value obj, tv_value key, tv_value *out);
bool tpl_slice(tpl_ctx *c, tv_value obj, tv_value parts[3], tv_value *out); /* obj[a:b:c]; parts none when absent */
bool tpl_iterate(tpl_ctx *c, tv_value v, tv_value *out_list);               /* list(v) as a new SEQ_LIST */
bool tpl_compare(tpl_ctx *c, int op, tv_value a, tv_value b, bool *out);
bool tpl_contains(tpl_ctx *c, tv_value container, tv_value item, bool *out);
bool tpl_binop(tpl_ctx *c, int op, tv_value a, tv_value b, tv_value *out);
bool tpl_to_str(tpl_ctx *c, tv_value v, tv_value *out);                          /* str(v) as a new string value */
bool tpl_length(tpl_ctx *c, tv_value v, int64_t *out);                           /* len(v) */
bool tpl_require_hashable(tpl_ctx *c, tv_value v);                               /* TypeError: unhashable type */
bool tpl_format_percent(tpl_ctx *c, tv_value fmt, tv_value args, tv_value *out); /* str % args (tpl_format.c) */

/* Methods of builtin types and template globals (tpl_methods.c). */
bool tpl_method_lookup(tpl_ctx *c, tv_value obj, const tv_str *name, tv_value *out, bool *found);
bool tpl_global_lookup(const char *name, size_t n, tv_value *out);
bool tpl_call_method0(tpl_ctx *c, tv_value obj, const char *name, tv_value *out); /* obj.name() */
tv_value tpl_loop_attr(tpl_ctx *c, tv_loop *l, const tv_str *name, bool *found);
bool tpl_sort_values(tpl_ctx *c, tv_value *keys, tv_value *vals, size_t n, bool reverse);

/* JSON (tpl_json.c). */
bool tpl_json_parse(tpl_ctx *c, const char *json, const char *what, tv_value *out);
typedef struct tpl_json_opts {
    bool ensure_ascii, sort_keys;
    bool has_indent;
    const char *indent;
    size_t indent_len;
    const char *item_sep;
    size_t item_sep_len;
    const char *key_sep;
    size_t key_sep_len;
} tpl_json_opts;
bool tpl_json_dump(tpl_ctx *c, mu_buf *b, tv_value v, const tpl_json_opts *o, int depth);

/* Argument binding for builtins: maps positional + keyword args onto
 * `names` (NULL-terminated) as Python binds `fname(<hidden>, *names)` with
 * the first `nreq` names required; unset ones stay anonymous-undefined
 * with given[i] = false. Errors carry CPython's wording. */
bool tpl_bind(tpl_ctx *c, const char *fname, int hidden, int nreq, const tpl_args *a, const char *const *names,
              tv_value *slots, bool *given);
bool tpl_bind_builtin1(tpl_ctx *c, const char *fname, const tpl_args *a); /* f(x) C builtin */

/* Markup escaping (markupsafe.escape). */
void tpl_html_escape(mu_buf *b, const char *s, size_t n);

/* Builtin methods: arity as CPython words its errors (tpl_methods.c). */
enum { ST_AT, ST_EXPECTED, ST_ONE, ST_NONE, ST_ANY };
typedef struct tpl_method {
    const char *name;
    tpl_builtin_fn fn; /* NULL: exists but blocked by the immutable sandbox */
    uint8_t min, max, style;
    const char *kw; /* accepted keyword names ("sep,maxsplit"), NULL: none */
} tpl_method;
extern const tpl_method tpl_str_methods[]; /* tpl_strings.c */
bool tpl_arg_str(tpl_ctx *c, const char *what, tv_value v);
bool tpl_arg_int(tpl_ctx *c, tv_value v, int64_t *out);

/* Python str helpers shared by filters and methods. */
bool tpl_str_of(tpl_ctx *c, tv_value v, tv_value *out); /* soft_str: str stays, else str(v) */
tv_value tpl_str_case(tv_value s, int mode);            /* 0 lower, 1 upper, 2 capitalize, 3 title, 4 swapcase */
tv_value tpl_str_strip(tv_value s, const tv_str *chars, bool left, bool right);
bool tpl_str_split(tpl_ctx *c, tv_value s, tv_value sep, int64_t maxsplit, bool right, tv_value *out);
bool tpl_str_replace(tpl_ctx *c, tv_value s, tv_value old, tv_value nw, int64_t count, tv_value *out);
uint32_t tpl_cp_lower(uint32_t cp);
uint32_t tpl_cp_upper(uint32_t cp);
bool tpl_cp_isalpha(uint32_t cp);
bool tpl_cp_isdigit(uint32_t cp);

#endif
