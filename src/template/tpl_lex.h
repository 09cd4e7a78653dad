/* Token stream shared by the lexer and the parser. */
#ifndef MUSER_TEMPLATE_LEX_H
#define MUSER_TEMPLATE_LEX_H
#include "template/tpl_internal.h"

typedef enum { T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP, T_EOF } tpl_tok_type;

typedef enum {
    O_ADD,
    O_SUB,
    O_DIV,
    O_FLOORDIV,
    O_MUL,
    O_MOD,
    O_POW,
    O_TILDE,
    O_LBRACKET,
    O_RBRACKET,
    O_LPAREN,
    O_RPAREN,
    O_LBRACE,
    O_RBRACE,
    O_EQ,
    O_NE,
    O_GT,
    O_GTEQ,
    O_LT,
    O_LTEQ,
    O_ASSIGN,
    O_DOT,
    O_COLON,
    O_PIPE,
    O_COMMA,
    O_SEMICOLON
} tpl_tok_op;

typedef struct tpl_token {
    uint8_t type, op;
    uint32_t pos;
    const char *p; /* T_NAME text */
    size_t n;
    tv_str *str; /* T_DATA / T_STRING value (owned by the template) */
    int64_t ival;
    double fval;
} tpl_token;

typedef struct tpl_lexer {
    mu_template *t;
    mu_error *err;
    tpl_token *tok;
    size_t ntok, captok;
    bool line_starting;
} tpl_lexer;

bool tpl_lex(tpl_lexer *L);
const char *tpl_op_text(int op);
tv_str *tpl_intern(mu_template *t, const char *s, size_t n);

#endif
