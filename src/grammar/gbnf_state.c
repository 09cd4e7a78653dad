/* Matching state: the live stacks plus a half-read code point. Every
 * accept works on copies and commits only on success, so a refused byte or
 * token leaves the state as it was. */
#include "grammar/gbnf_internal.h"
#include <stdio.h>
#include <stdlib.h>

mu_grammar_state *mu_grammar_state_new(const mu_grammar *g, mu_error *err) {
    mu_grammar_state *s = mu_xcalloc(1, sizeof *s);
    s->g = g;
    gbnf_pool_init(&s->pool);
    if (!gbnf_initial(g, &s->pool, &s->cfg, err)) {
        mu_grammar_state_free(s);
        return NULL;
    }
    gbnf_pool_compact(&s->pool, &s->cfg);
    return s;
}

static void vec_copy(gbnf_vec *dst, const gbnf_vec *src) {
    memset(dst, 0, sizeof *dst);
    gbnf_vec_reserve(dst, src->n ? src->n : 1);
    memcpy(dst->v, src->v, src->n * sizeof *dst->v);
    dst->n = src->n;
}

mu_grammar_state *mu_grammar_state_clone(const mu_grammar_state *s) {
    mu_grammar_state *c = mu_xcalloc(1, sizeof *c);
    c->g = s->g;
    gbnf_pool_copy(&c->pool, &s->pool);
    vec_copy(&c->cfg, &s->cfg);
    c->part = s->part;
    return c;
}

void mu_grammar_state_free(mu_grammar_state *s) {
    if (!s) return;
    gbnf_pool_free(&s->pool);
    gbnf_vec_free(&s->cfg);
    free(s);
}

bool mu_grammar_is_complete(const mu_grammar_state *s) {
    return s->part.remain == 0 && s->cfg.n > 0 && s->cfg.v[0] == GBNF_NIL;
}

size_t mu_grammar_state_n_stacks(const mu_grammar_state *s) {
    return s->cfg.n;
}

/* ---------------- consuming bytes ---------------- */

enum { EAT_OK, EAT_REJECT, EAT_LIMIT };

typedef struct eat_fail {
    size_t at;       /* byte offset of the refusal */
    uint32_t cp;     /* refused code point, or UINT32_MAX for bad UTF-8 / a dead tail */
    bool bad_utf8;
} eat_fail;

/* Run bytes through *cfg / *u in place (tmp is scratch). On EAT_REJECT
 * *cfg and *u are meaningless. */
static int eat(const mu_grammar *g, gbnf_pool *p, gbnf_vec *cfg, gbnf_vec *tmp, gbnf_utf8 *u,
               const char *bytes, size_t n, eat_fail *why, mu_error *err) {
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        int r = gbnf_utf8_feed(u, (uint8_t)bytes[i], &cp);
        if (r == GBNF_U8_MORE) continue;
        if (r == GBNF_U8_BAD) {
            *why = (eat_fail){i, UINT32_MAX, true};
            return EAT_REJECT;
        }
        if (!gbnf_step_cp(g, p, cfg->v, cfg->n, cp, tmp, err)) return EAT_LIMIT;
        if (tmp->n == 0) {
            *why = (eat_fail){i, cp, false};
            return EAT_REJECT;
        }
        gbnf_vec t = *cfg;
        *cfg = *tmp;
        *tmp = t;
    }
    if (u->remain && !gbnf_partial_viable(g, p, cfg->v, cfg->n, u)) {
        *why = (eat_fail){n, UINT32_MAX, false};
        return EAT_REJECT;
    }
    return EAT_OK;
}

static void describe_fail(const eat_fail *f, const char *what, mu_error *err) {
    if (f->bad_utf8)
        mu_err_set(err, "grammar: %s: invalid UTF-8 at byte %zu", what, f->at);
    else if (f->cp == UINT32_MAX)
        mu_err_set(err, "grammar: %s: ends inside a code point that cannot continue the grammar",
                   what);
    else if (f->cp >= 0x20 && f->cp < 0x7F)
        mu_err_set(err, "grammar: %s: '%c' (byte %zu) is not allowed here", what, (char)f->cp,
                   f->at);
    else
        mu_err_set(err, "grammar: %s: U+%04X (byte %zu) is not allowed here", what, f->cp, f->at);
}

bool mu_grammar_accept_bytes(mu_grammar_state *s, const char *bytes, size_t len, mu_error *err) {
    if (!len) return true;
    gbnf_vec cfg, tmp = {0};
    vec_copy(&cfg, &s->cfg);
    gbnf_utf8 u = s->part;
    eat_fail why;
    int r = eat(s->g, &s->pool, &cfg, &tmp, &u, bytes, len, &why, err);
    gbnf_vec_free(&tmp);
    if (r != EAT_OK) {
        if (r == EAT_REJECT) describe_fail(&why, "text", err);
        gbnf_vec_free(&cfg);
        return false;
    }
    gbnf_vec_free(&s->cfg);
    s->cfg = cfg;
    s->part = u;
    gbnf_pool_compact(&s->pool, &s->cfg);
    return true;
}

/* ---------------- consuming a token ---------------- */

typedef struct token_result {
    gbnf_vec cfg;
    gbnf_utf8 part;
} token_result;

/* Why a token is never allowed before looking at the grammar, or NULL. */
static const char *token_refusal(const mu_grammar_state *s, const mu_grammar_vocab *v, int32_t id) {
    if (!v || id < 0 || id >= v->n_vocab) return "out of range";
    if (v->flag[id] & GV_EOG) return mu_grammar_is_complete(s) ? NULL : "end of generation "
                                                                 "before the grammar is complete";
    if (v->flag[id] & GV_NEVER) return "an empty piece (or one starting with NUL), never allowed";
    return NULL;
}

/* The stacks after token id (p is modified: new nodes). Token terminals
 * match the whole token when no code point is half-read; the piece's bytes
 * feed the character terminals. When both match, the two results are
 * merged; if the byte path ends inside a code point, the token-terminal
 * result alone is kept (one state holds one half-read code point). */
static int run_token(const mu_grammar_state *s, gbnf_pool *p, const mu_grammar_vocab *v,
                     int32_t id, token_result *res, eat_fail *why, mu_error *err) {
    const mu_grammar *g = s->g;
    gbnf_vec by_token = {0}, tmp = {0};
    vec_copy(&res->cfg, &s->cfg);
    res->part = s->part;
    if (s->part.remain == 0 && gbnf_token_matches(g, p, s->cfg.v, s->cfg.n, id) &&
        !gbnf_step_token(g, p, s->cfg.v, s->cfg.n, id, &by_token, err)) {
        gbnf_vec_free(&by_token);
        return EAT_LIMIT;
    }
    size_t len;
    const char *piece = gbnf_piece(v, id, &len);
    int r = eat(g, p, &res->cfg, &tmp, &res->part, piece, len, why, err);
    gbnf_vec_free(&tmp);
    if (r == EAT_LIMIT || (r == EAT_REJECT && !by_token.n)) {
        gbnf_vec_free(&by_token);
        return r;
    }
    if (by_token.n && (r == EAT_REJECT || res->part.remain)) {
        gbnf_vec_free(&res->cfg);
        res->cfg = by_token;
        res->part = (gbnf_utf8){0, 0, 0};
        return EAT_OK;
    }
    for (size_t i = 0; i < by_token.n; i++) gbnf_vec_push(&res->cfg, by_token.v[i]);
    gbnf_vec_free(&by_token);
    if (res->cfg.n > 1) { /* sort + unique the union */
        gbnf_vec *c = &res->cfg;
        for (size_t i = 1; i < c->n; i++) {
            uint32_t x = c->v[i];
            size_t j = i;
            for (; j && c->v[j - 1] > x; j--) c->v[j] = c->v[j - 1];
            c->v[j] = x;
        }
        size_t m = 1;
        for (size_t i = 1; i < c->n; i++)
            if (c->v[i] != c->v[m - 1]) c->v[m++] = c->v[i];
        c->n = m;
    }
    return EAT_OK;
}

bool mu_grammar_accept_token(mu_grammar_state *s, const mu_grammar_vocab *v, int32_t id,
                             mu_error *err) {
    const char *refusal = token_refusal(s, v, id);
    if (refusal) {
        mu_err_set(err, "grammar: token %d: %s", id, refusal);
        return false;
    }
    if (v->flag[id] & GV_EOG) return true;
    token_result res;
    eat_fail why;
    int r = run_token(s, &s->pool, v, id, &res, &why, err);
    if (r != EAT_OK) {
        if (r == EAT_REJECT) {
            char what[64];
            snprintf(what, sizeof what, "token %d", id);
            describe_fail(&why, what, err);
        }
        gbnf_vec_free(&res.cfg);
        return false;
    }
    gbnf_vec_free(&s->cfg);
    s->cfg = res.cfg;
    s->part = res.part;
    gbnf_pool_compact(&s->pool, &s->cfg);
    return true;
}

bool mu_grammar_allows(const mu_grammar_state *s, const mu_grammar_vocab *v, int32_t id) {
    if (token_refusal(s, v, id)) return false;
    if (v->flag[id] & GV_EOG) return true;
    gbnf_pool p;
    gbnf_pool_copy(&p, &s->pool);
    token_result res;
    eat_fail why;
    mu_error err;
    int r = run_token(s, &p, v, id, &res, &why, &err);
    gbnf_vec_free(&res.cfg);
    gbnf_pool_free(&p);
    return r == EAT_OK;
}
