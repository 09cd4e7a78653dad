/* Lexer: splits a template into data and tag tokens with jinja2's
 * whitespace rules as Hugging Face configures them (trim_blocks and
 * lstrip_blocks on, `-`/`+` modifiers, newlines normalised, one trailing
 * newline dropped). */
#include "template/tpl_lex.h"
#include <stdio.h>
#include <stdlib.h>

static bool lex_fail(tpl_lexer *L, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool lex_fail(tpl_lexer *L, size_t pos, const char *fmt, ...) {
    int line, col;
    tpl_line_col(L->t, pos, &line, &col);
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mu_err_set(L->err, "%s:%d:%d: %s", L->t->name, line, col, msg);
    return false;
}

static tpl_token *push_tok(tpl_lexer *L, int type, size_t pos) {
    if (L->ntok == L->captok) {
        L->captok = L->captok ? L->captok * 2 : 256;
        L->tok = mu_xrealloc(L->tok, L->captok * sizeof *L->tok);
    }
    tpl_token *k = &L->tok[L->ntok++];
    memset(k, 0, sizeof *k);
    k->type = (uint8_t)type;
    k->pos = (uint32_t)pos;
    return k;
}

tv_str *tpl_intern(mu_template *t, const char *s, size_t n) {
    if (t->nimmortals == t->capimmortals) {
        t->capimmortals = t->capimmortals ? t->capimmortals * 2 : 64;
        t->immortals = mu_xrealloc(t->immortals, t->capimmortals * sizeof *t->immortals);
    }
    tv_str *str = tv_str_immortal(s, n);
    t->immortals[t->nimmortals++] = str;
    return str;
}

static void push_data(tpl_lexer *L, size_t pos, const char *s, size_t n) {
    if (!n) return;
    tpl_token *k = push_tok(L, T_DATA, pos);
    k->str = tpl_intern(L->t, s, n);
}

/* Length of the whitespace run (Python \s) starting at i. */
static size_t ws_run(const char *s, size_t n, size_t i) {
    size_t j = i;
    while (j < n) {
        size_t k = j;
        uint32_t cp = tpl_utf8_next(s, n, &k);
        if (!tpl_py_isspace(cp)) break;
        j = k;
    }
    return j - i;
}

/* Length of text after stripping trailing Python whitespace. */
static size_t rstrip_len(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t k = st;
        uint32_t cp = tpl_utf8_next(s, end, &k);
        if (!tpl_py_isspace(cp)) break;
        end = st;
    }
    return end;
}

/* Text before a tag: `-` strips all whitespace; otherwise lstrip_blocks
 * removes spaces between the line start and a block/comment tag. */
static size_t strip_before_tag(tpl_lexer *L, const char *text, size_t n, char sign, bool is_var) {
    if (sign == '-') return rstrip_len(text, n);
    if (sign == '+' || is_var) return n;
    size_t l = n;
    while (l > 0 && text[l - 1] != '\n') l--;
    if (l == 0 && !L->line_starting) return n;
    if (l < n && ws_run(text, n, l) == n - l) return l;
    return n;
}

static bool starts(const char *s, size_t n, size_t i, const char *lit) {
    size_t m = strlen(lit);
    return i + m <= n && memcmp(s + i, lit, m) == 0;
}

/* `{%(-|+|)\s*raw\s*(-%}\s*|%})` at q: returns the end offset or 0. */
static size_t match_raw_begin(const char *s, size_t n, size_t q, const char *word) {
    size_t i = q + 2;
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    i += ws_run(s, n, i);
    if (!starts(s, n, i, word)) return 0;
    i += strlen(word);
    i += ws_run(s, n, i);
    if (starts(s, n, i, "-%}")) return i + 3 + ws_run(s, n, i + 3);
    if (starts(s, n, i, "%}")) return i + 2;
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

/* (\d+_)*\d+ : returns end or start if no match */
static size_t digit_group(const char *s, size_t n, size_t i) {
    if (i >= n || !is_digit(s[i])) return i;
    size_t j = i;
    for (;;) {
        while (j < n && is_digit(s[j])) j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) {
            j++;
            continue;
        }
        return j;
    }
}

static size_t match_float(const char *s, size_t n, size_t i) {
    if (i > 0 && s[i - 1] == '.') return 0;
    size_t j = digit_group(s, n, i);
    if (j == i) return 0;
    size_t frac = 0;
    if (j < n && s[j] == '.') {
        size_t k = digit_group(s, n, j + 1);
        if (k > j + 1) frac = k;
    }
    size_t e = frac ? frac : j;
    if (e < n && (s[e] == 'e' || s[e] == 'E')) {
        size_t k = e + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        size_t m = digit_group(s, n, k);
        if (m > k) return m;
    }
    return frac;
}

static int digit_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return 99;
}

/* integer_re; returns end (0 = no match) and the value. */
static size_t match_int(tpl_lexer *L, const char *s, size_t n, size_t i, int64_t *val, bool *ok) {
    int base = 10;
    size_t j = i;
    *ok = true;
    if (s[i] == '0' && i + 2 < n) {
        char p = s[i + 1] | 0x20;
        base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 10;
        if (base != 10) {
            size_t k = i + 2;
            size_t last = 0;
            while (k < n) {
                size_t d = k + (s[k] == '_' ? 1 : 0);
                if (d < n && digit_val(s[d]) < base) {
                    k = d + 1;
                    last = k;
                } else
                    break;
            }
            if (last)
                j = last;
            else
                base = 10;
        }
    }
    if (base == 10) {
        if (!is_digit(s[i])) return 0;
        j = i + 1;
        bool zero = s[i] == '0';
        while (j < n) {
            size_t d = j + (s[j] == '_' ? 1 : 0);
            if (d < n && is_digit(s[d]) && (!zero || s[d] == '0'))
                j = d + 1;
            else
                break;
        }
    }
    uint64_t v = 0;
    size_t k = (base == 10) ? i : i + 2;
    for (; k < j; k++) {
        if (s[k] == '_') continue;
        uint64_t d = (uint64_t)digit_val(s[k]);
        if (v > (UINT64_MAX - d) / (uint64_t)base) {
            *ok = lex_fail(L, i, "integer literal too large");
            return j;
        }
        v = v * (uint64_t)base + d;
    }
    if (v > (uint64_t)INT64_MAX) {
        *ok = lex_fail(L, i, "integer literal too large");
        return j;
    }
    *val = (int64_t)v;
    return j;
}

static int hexval_n(const char *s, size_t n, size_t i, int digits, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        if (i + (size_t)k >= n || digit_val(s[i + (size_t)k]) > 15) return 0;
        v = v * 16 + (uint32_t)digit_val(s[i + (size_t)k]);
    }
    *out = v;
    return 1;
}

/* Decode a string literal body the way Python's unicode-escape does. */
static bool decode_string(tpl_lexer *L, size_t at, const char *s, size_t n, mu_buf *out) {
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) {
            mu_buf_putc(out, s[i++]);
            continue;
        }
        char c = s[i + 1];
        i += 2;
        uint32_t cp;
        switch (c) {
        case '\n': break;
        case '\\': mu_buf_putc(out, '\\'); break;
        case '\'': mu_buf_putc(out, '\''); break;
        case '"': mu_buf_putc(out, '"'); break;
        case 'a': mu_buf_putc(out, '\a'); break;
        case 'b': mu_buf_putc(out, '\b'); break;
        case 'f': mu_buf_putc(out, '\f'); break;
        case 'n': mu_buf_putc(out, '\n'); break;
        case 'r': mu_buf_putc(out, '\r'); break;
        case 't': mu_buf_putc(out, '\t'); break;
        case 'v': mu_buf_putc(out, '\v'); break;
        case 'x':
            if (!hexval_n(s, n, i, 2, &cp)) return lex_fail(L, at, "truncated \\xXX escape");
            tpl_utf8_put(out, cp);
            i += 2;
            break;
        case 'u':
            if (!hexval_n(s, n, i, 4, &cp)) return lex_fail(L, at, "truncated \\uXXXX escape");
            tpl_utf8_put(out, cp);
            i += 4;
            break;
        case 'U':
            if (!hexval_n(s, n, i, 8, &cp)) return lex_fail(L, at, "truncated \\UXXXXXXXX escape");
            if (cp > 0x10FFFF) return lex_fail(L, at, "illegal Unicode character");
            tpl_utf8_put(out, cp);
            i += 8;
            break;
        case 'N': return lex_fail(L, at, "\\N{...} escapes are not supported");
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                tpl_utf8_put(out, cp);
            } else {
                mu_buf_putc(out, '\\');
                mu_buf_putc(out, c);
            }
        }
    }
    return true;
}

static const struct {
    const char *s;
    int op;
} OPS[] = {
    {"//", O_FLOORDIV}, {"**", O_POW},      {"==", O_EQ},    {"!=", O_NE},    {">=", O_GTEQ},  {"<=", O_LTEQ},
    {"+", O_ADD},       {"-", O_SUB},       {"/", O_DIV},    {"*", O_MUL},    {"%", O_MOD},    {"~", O_TILDE},
    {"[", O_LBRACKET},  {"]", O_RBRACKET},  {"(", O_LPAREN}, {")", O_RPAREN}, {"{", O_LBRACE}, {"}", O_RBRACE},
    {">", O_GT},        {"<", O_LT},        {"=", O_ASSIGN}, {".", O_DOT},    {":", O_COLON},  {"|", O_PIPE},
    {",", O_COMMA},     {";", O_SEMICOLON},
};

const char *tpl_op_text(int op) {
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++)
        if (OPS[i].op == op) return OPS[i].s;
    return "?";
}

/* One token inside a tag; returns false on error. */
static bool lex_tag_token(tpl_lexer *L, size_t *pi, char *stack, int *depth) {
    const char *s = L->t->src;
    size_t n = L->t->len, i = *pi;
    size_t e;
    if ((e = match_float(s, n, i))) {
        tpl_token *k = push_tok(L, T_FLOAT, i);
        char tmp[512];
        size_t m = 0;
        for (size_t j = i; j < e && m < sizeof tmp - 1; j++)
            if (s[j] != '_') tmp[m++] = s[j];
        tmp[m] = '\0';
        k->fval = strtod(tmp, NULL);
        *pi = e;
        return true;
    }
    if (is_digit(s[i])) {
        int64_t v = 0;
        bool ok;
        e = match_int(L, s, n, i, &v, &ok);
        if (!ok) return false;
        tpl_token *k = push_tok(L, T_INT, i);
        k->ival = v;
        *pi = e;
        return true;
    }
    if (is_name_start(s[i])) {
        e = i;
        while (e < n && is_name_char(s[e])) e++;
        tpl_token *k = push_tok(L, T_NAME, i);
        k->p = s + i;
        k->n = e - i;
        *pi = e;
        return true;
    }
    if (s[i] == '\'' || s[i] == '"') {
        char q = s[i];
        size_t j = i + 1;
        while (j < n && s[j] != q) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
        if (j < n) {
            mu_buf b = {0};
            if (!decode_string(L, i, s + i + 1, j - i - 1, &b)) {
                mu_buf_free(&b);
                return false;
            }
            tpl_token *k = push_tok(L, T_STRING, i);
            k->str = tpl_intern(L->t, b.p ? b.p : "", b.len);
            mu_buf_free(&b);
            *pi = j + 1;
            return true;
        }
    }
    for (size_t o = 0; o < sizeof OPS / sizeof OPS[0]; o++) {
        if (!starts(s, n, i, OPS[o].s)) continue;
        int op = OPS[o].op;
        if (op == O_LBRACE || op == O_LPAREN || op == O_LBRACKET) {
            if (*depth >= 256) return lex_fail(L, i, "brackets nested too deeply");
            stack[(*depth)++] = op == O_LBRACE ? '}' : op == O_LPAREN ? ')' : ']';
        } else if (op == O_RBRACE || op == O_RPAREN || op == O_RBRACKET) {
            char ch = OPS[o].s[0];
            if (*depth == 0) return lex_fail(L, i, "unexpected '%c'", ch);
            char want = stack[--(*depth)];
            if (want != ch) return lex_fail(L, i, "unexpected '%c', expected '%c'", ch, want);
        }
        tpl_token *k = push_tok(L, T_OP, i);
        k->op = (uint8_t)op;
        *pi = i + strlen(OPS[o].s);
        return true;
    }
    size_t k = i;
    tpl_utf8_next(s, n, &k);
    mu_buf b = {0};
    tv_write_pystr_repr(&b, s + i, k - i);
    bool r = lex_fail(L, i, "unexpected char %s at %zu", b.p, i);
    mu_buf_free(&b);
    return r;
}

/* The inside of {{ }} or {% %} up to the closing delimiter. */
static bool lex_tag(tpl_lexer *L, size_t *pi, bool is_block) {
    const char *s = L->t->src;
    size_t n = L->t->len, i = *pi;
    char stack[256];
    int depth = 0;
    for (;;) {
        if (i >= n)
            return lex_fail(L, n, "unexpected end of template, expected '%s'.",
                            is_block ? "end of statement block" : "end of print statement");
        if (depth == 0) {
            const char *close = is_block ? "%}" : "}}";
            if (is_block && starts(s, n, i, "+%}")) {
                push_tok(L, T_BEND, i);
                L->line_starting = false;
                *pi = i + 3;
                return true;
            }
            if (s[i] == '-' && starts(s, n, i + 1, close)) {
                push_tok(L, is_block ? T_BEND : T_VEND, i);
                size_t w = ws_run(s, n, i + 3);
                L->line_starting = w ? s[i + 3 + w - 1] == '\n' : false;
                *pi = i + 3 + w;
                return true;
            }
            if (starts(s, n, i, close)) {
                push_tok(L, is_block ? T_BEND : T_VEND, i);
                i += 2;
                L->line_starting = false;
                if (is_block && i < n && s[i] == '\n') {
                    i++;
                    L->line_starting = true;
                }
                *pi = i;
                return true;
            }
        }
        size_t w = ws_run(s, n, i);
        if (w) {
            i += w;
            continue;
        }
        if (!lex_tag_token(L, &i, stack, &depth)) return false;
    }
}

/* {# ... #}: the comment ends at the first `#}`, `-#}` or `+#}`. */
static bool lex_comment(tpl_lexer *L, size_t start, size_t *pi) {
    const char *s = L->t->src;
    size_t n = L->t->len, i = *pi;
    for (size_t q = i; q + 1 < n; q++) {
        if (s[q] == '#' && s[q + 1] == '}') {
            char sign = q > i ? s[q - 1] : 0;
            size_t end = q + 2;
            if (sign == '-')
                end += ws_run(s, n, end);
            else if (sign != '+' && end < n && s[end] == '\n')
                end++;
            L->line_starting = s[end - 1] == '\n';
            *pi = end;
            return true;
        }
    }
    return lex_fail(L, start, "Missing end of comment tag");
}

/* {% raw %}...{% endraw %}: body is data, with the endraw tag's strip rules. */
static bool lex_raw(tpl_lexer *L, size_t start, size_t *pi) {
    const char *s = L->t->src;
    size_t n = L->t->len, i = *pi;
    for (size_t q = i; q + 1 < n; q++) {
        if (s[q] != '{' || s[q + 1] != '%') continue;
        size_t j = q + 2;
        char sign = 0;
        if (j < n && (s[j] == '-' || s[j] == '+')) sign = s[j++];
        j += ws_run(s, n, j);
        if (!starts(s, n, j, "endraw")) continue;
        j += 6;
        j += ws_run(s, n, j);
        size_t end;
        if (starts(s, n, j, "+%}"))
            end = j + 3;
        else if (starts(s, n, j, "-%}"))
            end = j + 3 + ws_run(s, n, j + 3);
        else if (starts(s, n, j, "%}"))
            end = j + 2 + (j + 2 < n && s[j + 2] == '\n');
        else
            continue;
        size_t keep = strip_before_tag(L, s + i, q - i, sign, false);
        push_data(L, i, s + i, keep);
        L->line_starting = s[end - 1] == '\n';
        *pi = end;
        return true;
    }
    return lex_fail(L, start, "Missing end of raw directive");
}

bool tpl_lex(tpl_lexer *L) {
    const char *s = L->t->src;
    size_t n = L->t->len, pos = 0;
    L->line_starting = true;
    while (pos < n) {
        size_t q = pos;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= n) {
            push_data(L, pos, s + pos, n - pos);
            break;
        }
        char kind = s[q + 1];
        char sign = (q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+')) ? s[q + 2] : 0;
        size_t raw_end = kind == '%' ? match_raw_begin(s, n, q, "raw") : 0;
        size_t keep = strip_before_tag(L, s + pos, q - pos, sign, kind == '{');
        push_data(L, pos, s + pos, keep);
        size_t i = q + 2 + (sign ? 1 : 0);
        if (raw_end) {
            L->line_starting = s[raw_end - 1] == '\n';
            pos = raw_end;
            if (!lex_raw(L, q, &pos)) return false;
            continue;
        }
        L->line_starting = false;
        if (kind == '#') {
            if (!lex_comment(L, q, &i)) return false;
        } else {
            push_tok(L, kind == '%' ? T_BBEGIN : T_VBEGIN, q);
            if (!lex_tag(L, &i, kind == '%')) return false;
        }
        pos = i;
    }
    push_tok(L, T_EOF, n);
    return true;
}
