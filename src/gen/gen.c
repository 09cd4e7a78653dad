/* The per-request generation state machine (gen.h): prompt, sampler,
 * streaming detokenizer, stop strings with hold-back, logprobs, timings. */
#include "gen/gen.h"
#include "tokenizer/tok_internal.h"
#include "util/common.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mu_gen {
    muser_model *m;
    muser_sampler *smp;
    muser_detok *dt;          /* NULL: the model has no tokenizer (ids only) */
    int32_t n_probs;
    mu_gen_callback cb;
    void *user;
    /* the request */
    int64_t n_predict;
    bool speculate;
    bool rows_needed;
    char *stops[MU_GEN_MAX_STOPS];
    int n_stops;
    int32_t *prompt;
    int64_t n_prompt;
    /* output */
    int32_t *out;
    muser_logprob *lp, *top;  /* per token: chosen, then n_probs alternatives */
    int64_t n_out, cap_out;
    mu_buf text;          /* all text so far, cut at a stop string */
    size_t released;          /* bytes of text already emitted */
    bool first_row_taken;     /* later rows imply fed tokens (decode count) */
    double t_start, t_decode0;
    char error[1024];
    mu_gen_result res;
    muser_kvstore *cache;     /* prompt cache, NULL = none */
    /* mu_gen_draw's result for the next mu_gen_take_row with draw_row */
    bool drawn;
    const float *draw_row;
    int32_t draw_tok;
    muser_error draw_err;
    /* and, when logprobs are asked for, those of draw_tok in draw_row (the
     * pass over the vocabulary runs on the drawing thread too) */
    bool draw_has_lp;
    int32_t draw_n_top;   /* -1: failed, draw_lp_err says why */
    muser_logprob draw_lp, *draw_top;
    muser_error draw_lp_err;
};

/* n_predict tokens are out (n_predict < 0: no limit). */
static bool length_reached(const mu_gen *g) { return g->n_predict >= 0 && g->n_out >= g->n_predict; }

const char *mu_gen_stop_name(mu_gen_stop st) {
    switch (st) {
    case MU_GEN_RUNNING: return "running";
    case MU_GEN_STOP_EOG: return "eog";
    case MU_GEN_STOP_STRING: return "stop_string";
    case MU_GEN_STOP_LENGTH: return "length";
    case MU_GEN_STOP_GRAMMAR: return "grammar";
    case MU_GEN_STOP_CONTEXT: return "context";
    case MU_GEN_STOP_CANCELLED: return "cancelled";
    case MU_GEN_STOP_ERROR: return "error";
    }
    return "?";
}

mu_gen *mu_gen_new(muser_model *m, const muser_sampling_params *sp, muser_error *err) {
    muser_sampling_params def;
    if (!sp) {
        muser_sampling_params_default(&def);
        sp = &def;
    }
    muser_sampler *smp = muser_sampler_create(m, sp, err);
    if (!smp) return NULL;
    mu_gen *g = mu_xcalloc(1, sizeof *g);
    g->m = m;
    g->smp = smp;
    g->n_probs = sp->n_probs > 0 ? sp->n_probs : 0;
    g->res.stop = MU_GEN_STOP_ERROR;
    snprintf(g->error, sizeof g->error, "no request started");
    return g;
}

static void clear_request(mu_gen *g) {
    for (int k = 0; k < g->n_stops; k++) free(g->stops[k]);
    g->n_stops = 0;
    free(g->prompt);
    g->prompt = NULL;
    g->n_prompt = 0;
    muser_detok_free(g->dt);
    g->dt = NULL;
    g->drawn = g->draw_has_lp = false;
}

void mu_gen_free(mu_gen *g) {
    if (!g) return;
    clear_request(g);
    muser_sampler_free(g->smp);
    free(g->out);
    free(g->lp);
    free(g->top);
    free(g->draw_top);
    free(g->text.p);
    free(g);
}

muser_sampler *mu_gen_sampler(mu_gen *g) { return g->smp; }

static void set_err(muser_error *err, const char *fmt, const char *arg) {
    if (err) snprintf(err->msg, sizeof err->msg, fmt, arg);
}

/* Rendered chat text: control-token texts parsed, BOS added once if the
 * model asks for one (templates usually write it themselves). */
static int64_t tokenize_chat(muser_model *m, const char *text, int32_t **ids, muser_error *err) {
    int64_t n = muser_tokenize(m, text, strlen(text), false, true, ids, err);
    int32_t bos = muser_token_bos(m), *probe = NULL;
    bool wants_bos = muser_tokenize(m, "", 0, true, false, &probe, NULL) > 0;
    free(probe);
    if (n >= 0 && wants_bos && bos >= 0 && (n == 0 || (*ids)[0] != bos)) {
        *ids = mu_xrealloc(*ids, (size_t)(n + 1) * sizeof(int32_t));
        memmove(*ids + 1, *ids, (size_t)n * sizeof(int32_t));
        (*ids)[0] = bos;
        n++;
    }
    return n;
}

static int64_t build_prompt(mu_gen *g, const mu_gen_request *req, muser_error *err) {
    int sources = (req->text != NULL) + (req->tokens != NULL) + (req->messages_json != NULL);
    if (sources != 1) {
        set_err(err, "%s", "request: give exactly one of text, tokens or messages_json");
        return -1;
    }
    if (req->tokens) {
        if (req->n_tokens < 0) return set_err(err, "%s", "request: n_tokens is negative"), -1;
        g->prompt = mu_xmalloc((size_t)(req->n_tokens ? req->n_tokens : 1) * sizeof(int32_t));
        memcpy(g->prompt, req->tokens, (size_t)req->n_tokens * sizeof(int32_t));
        return req->n_tokens;
    }
    if (!muser_model_has_tokenizer(g->m)) {
        set_err(err, "%s", "the model has no tokenizer; give the prompt as token ids");
        return -1;
    }
    if (req->text) {
        size_t len = req->text_len ? req->text_len : strlen(req->text);
        return muser_tokenize(g->m, req->text, len, true, true, &g->prompt, err);
    }
    muser_chat_params cp = {.messages_json = req->messages_json, .tools_json = req->tools_json,
                            .add_generation_prompt = true};
    char *rendered = muser_chat_render(g->m, &cp, err);
    if (!rendered) return -1;
    int64_t n = tokenize_chat(g->m, rendered, &g->prompt, err);
    free(rendered);
    return n;
}

bool mu_gen_start(mu_gen *g, const mu_gen_request *req, mu_gen_callback cb, void *user, muser_error *err) {
    clear_request(g);
    g->n_out = 0;
    g->text.len = g->released = 0;
    mu_buf_append(&g->text, "", 0); /* never NULL: the stop search reads it */
    g->first_row_taken = false;
    g->error[0] = 0;
    g->res = (mu_gen_result){.stop = MU_GEN_STOP_ERROR, .error = g->error};
    if (req->n_stops < 0 || req->n_stops > MU_GEN_MAX_STOPS) {
        if (err) snprintf(err->msg, sizeof err->msg, "request: %d stop strings (at most %d)", req->n_stops,
                          MU_GEN_MAX_STOPS);
        return false;
    }
    for (int k = 0; k < req->n_stops; k++)
        if (!req->stops[k] || !req->stops[k][0]) {
            set_err(err, "%s", "request: a stop string is empty");
            return false;
        }
    int64_t n = build_prompt(g, req, err);
    if (n == 0) set_err(err, "%s", "the prompt is empty");
    if (n <= 0) {
        free(g->prompt);
        g->prompt = NULL;
        return false;
    }
    muser_sampler_reset(g->smp);
    if (!muser_sampler_accept_prompt(g->smp, g->prompt, (size_t)n, err)) {
        free(g->prompt);
        g->prompt = NULL;
        return false;
    }
    for (int k = 0; k < req->n_stops; k++) g->stops[k] = mu_xstrdup(req->stops[k]);
    g->n_stops = req->n_stops;
    g->n_prompt = n;
    g->n_predict = req->n_predict;
    g->speculate = req->speculate;
    g->rows_needed = req->rows_needed;
    g->cb = cb;
    g->user = user;
    g->dt = muser_model_has_tokenizer(g->m) ? muser_detok_new(g->m, false) : NULL;
    g->res.stop = MU_GEN_RUNNING;
    g->drawn = false; /* a draw of an earlier request never carries over (rows are reused buffers) */
    g->t_start = g->t_decode0 = mu_now();
    return true;
}

const int32_t *mu_gen_prompt(const mu_gen *g, int64_t *n) {
    *n = g->n_prompt;
    return g->prompt;
}

void mu_gen_prefilled(mu_gen *g, int64_t n) {
    g->t_decode0 = mu_now();
    g->res.n_prefill = n;
    g->res.t_prefill = g->t_decode0 - g->t_start;
}

bool mu_gen_speculates(const mu_gen *g) { return g->speculate; }

void mu_gen_set_prompt_cache(mu_gen *g, muser_kvstore *st) { g->cache = st; }
muser_kvstore *mu_gen_prompt_cache(const mu_gen *g) { return g->cache; }
void mu_gen_set_reused(mu_gen *g, int64_t n) { g->res.n_reused = n; }

int mu_gen_max_draw(const mu_gen *g) {
    int64_t left = g->n_predict < 0 ? MU_GEN_MAX_DRAW : g->n_predict - g->n_out;
    return left < MU_GEN_MAX_DRAW ? (int)(left > 0 ? left : 0) : MU_GEN_MAX_DRAW;
}

/* The end of text that is final: before the first stop string (*hit), and
 * unless `final`, before a suffix that could still grow into one. */
static size_t releasable(const mu_gen *g, bool final, bool *hit) {
    const char *t = g->text.p;
    size_t limit = g->text.len;
    *hit = false;
    for (int k = 0; k < g->n_stops; k++) { /* a stop string may start in held-back text */
        const char *p = memmem(t + g->released, g->text.len - g->released, g->stops[k], strlen(g->stops[k]));
        if (p && (size_t)(p - t) < limit) {
            limit = (size_t)(p - t);
            *hit = true;
        }
    }
    if (*hit || final) return limit;
    for (int k = 0; k < g->n_stops; k++) {
        size_t sl = strlen(g->stops[k]);
        for (size_t keep = sl - 1; keep > 0; keep--) /* longest suffix that is a prefix of the stop */
            if (keep <= g->text.len - g->released && !memcmp(t + g->text.len - keep, g->stops[k], keep)) {
                if (g->text.len - keep < limit) limit = g->text.len - keep;
                break;
            }
    }
    return limit;
}

/* Release what became final; true if a stop string hit (text cut there). */
static bool release(mu_gen *g, bool final, const char **p, size_t *n) {
    bool hit;
    size_t limit = releasable(g, final, &hit);
    *p = g->text.p ? g->text.p + g->released : "";
    *n = limit > g->released ? limit - g->released : 0;
    if (limit > g->released) g->released = limit;
    if (hit) { /* the stop string and what follows are not part of the output */
        g->text.len = limit;
        g->text.p[limit] = 0;
    }
    return hit;
}

static void fail(mu_gen *g, const char *msg) {
    snprintf(g->error, sizeof g->error, "%s", msg);
    g->res.stop = MU_GEN_STOP_ERROR;
}

static void close_timing(mu_gen *g) { g->res.t_decode = mu_now() - g->t_decode0; }

void mu_gen_finish(mu_gen *g, mu_gen_stop why, const char *msg) {
    if (g->res.stop != MU_GEN_RUNNING) return;
    if (why == MU_GEN_RUNNING) why = MU_GEN_STOP_ERROR;
    if (why == MU_GEN_STOP_ERROR) {
        fail(g, msg ? msg : "error");
        close_timing(g);
        return;
    }
    if (g->dt && why != MU_GEN_STOP_STRING) {
        size_t len;
        const char *rest = muser_detok_flush(g->dt, &len);
        mu_buf_append(&g->text, rest, len);
        const char *p;
        size_t n;
        /* the flushed tail may complete a stop string (eog still names the stop) */
        if (release(g, true, &p, &n) && why != MU_GEN_STOP_EOG) why = MU_GEN_STOP_STRING;
        if (n && g->cb) {
            mu_gen_event ev = {.token = -1, .index = g->n_out, .text = p, .text_len = n};
            g->cb(g->user, &ev);
        }
    }
    g->res.stop = why;
    close_timing(g);
}

/* Record, detokenize and announce one drawn token; the stop it causes. */
static mu_gen_stop take_token(mu_gen *g, const float *row, int32_t tok) {
    if (g->n_out == g->cap_out) {
        g->cap_out = g->cap_out * 2 + 64;
        g->out = mu_xrealloc(g->out, (size_t)g->cap_out * sizeof *g->out);
        if (g->n_probs) {
            g->lp = mu_xrealloc(g->lp, (size_t)g->cap_out * sizeof *g->lp);
            g->top = mu_xrealloc(g->top, (size_t)g->cap_out * (size_t)g->n_probs * sizeof *g->top);
        }
    }
    mu_gen_event ev = {.token = tok, .index = g->n_out, .row = row, .text = ""};
    if (g->n_probs) {
        muser_error err;
        muser_logprob *lp = &g->lp[g->n_out], *top = &g->top[g->n_out * g->n_probs];
        ev.logprob = lp;
        ev.top = top;
        if (g->draw_has_lp && g->draw_row == row && g->draw_tok == tok) { /* computed by mu_gen_draw */
            ev.n_top = g->draw_n_top;
            err = g->draw_lp_err;
            if (ev.n_top >= 0) {
                *lp = g->draw_lp;
                memcpy(top, g->draw_top, (size_t)ev.n_top * sizeof *top);
            }
        } else
            ev.n_top = muser_sampler_logprobs(g->smp, row, tok, lp, top, &err);
        g->draw_has_lp = false;
        if (ev.n_top < 0) {
            fail(g, err.msg);
            return MU_GEN_STOP_ERROR;
        }
    }
    g->out[g->n_out++] = tok;
    mu_gen_stop st = MU_GEN_RUNNING;
    if (muser_token_is_eog(g->m, tok)) st = MU_GEN_STOP_EOG;
    else if (g->dt) {
        size_t len;
        const char *piece = muser_detok_push(g->dt, tok, &len);
        mu_buf_append(&g->text, piece, len);
        if (release(g, false, &ev.text, &ev.text_len)) st = MU_GEN_STOP_STRING;
    }
    bool go_on = !g->cb || g->cb(g->user, &ev);
    if (st == MU_GEN_RUNNING && length_reached(g)) st = MU_GEN_STOP_LENGTH;
    if (st == MU_GEN_RUNNING && !go_on) st = MU_GEN_STOP_CANCELLED;
    return st;
}

/* Shared tail of both takes: run the tokens through take_token. */
static mu_gen_stop take_all(mu_gen *g, const int32_t *toks, const float *const *rows, int n, int32_t *next) {
    mu_gen_stop st = MU_GEN_RUNNING;
    for (int i = 0; i < n && st == MU_GEN_RUNNING; i++) st = take_token(g, rows[i], toks[i]);
    if (st == MU_GEN_STOP_ERROR) close_timing(g);
    else if (st != MU_GEN_RUNNING) mu_gen_finish(g, st, NULL);
    else *next = toks[n - 1];
    return g->res.stop;
}

/* Whether mu_gen_take_row would draw (the checks it makes before it does). */
static bool will_draw(const mu_gen *g) {
    return g->res.stop == MU_GEN_RUNNING && !length_reached(g);
}

void mu_gen_draw(mu_gen *g, const float *row) {
    g->drawn = false;
    if (!will_draw(g)) return;
    g->draw_tok = muser_sampler_sample(g->smp, row, &g->draw_err);
    g->draw_row = row;
    g->drawn = true;
    g->draw_has_lp = false;
    if (g->n_probs && g->draw_tok >= 0) {
        if (!g->draw_top) g->draw_top = mu_xmalloc((size_t)g->n_probs * sizeof *g->draw_top);
        g->draw_n_top = muser_sampler_logprobs(g->smp, row, g->draw_tok, &g->draw_lp, g->draw_top, &g->draw_lp_err);
        g->draw_has_lp = true;
    }
}

/* mu_gen_take_row, or with picked >= 0 mu_gen_take_picked. */
static mu_gen_stop take_one(mu_gen *g, const float *row, int32_t picked, int32_t *next) {
    const bool drawn = picked < 0 && g->drawn && g->draw_row == row;
    g->drawn = false;
    if (g->res.stop != MU_GEN_RUNNING) return g->res.stop;
    if (g->first_row_taken) g->res.n_decoded++; /* the previous pending token was fed */
    g->first_row_taken = true;
    if (length_reached(g)) {
        mu_gen_finish(g, MU_GEN_STOP_LENGTH, NULL);
        return g->res.stop;
    }
    muser_error err;
    int32_t tok;
    if (picked >= 0) tok = picked;
    else if (drawn) tok = g->draw_tok, err = g->draw_err;
    else tok = muser_sampler_sample(g->smp, row, &err);
    if (tok < 0 && muser_sampler_grammar_complete(g->smp)) {
        mu_gen_finish(g, MU_GEN_STOP_GRAMMAR, NULL);
        return g->res.stop;
    }
    if (tok < 0 || !muser_sampler_accept(g->smp, tok, &err)) {
        mu_gen_finish(g, MU_GEN_STOP_ERROR, err.msg);
        return g->res.stop;
    }
    return take_all(g, &tok, &row, 1, next);
}

mu_gen_stop mu_gen_take_row(mu_gen *g, const float *row, int32_t *next) { return take_one(g, row, -1, next); }

mu_gen_stop mu_gen_take_picked(mu_gen *g, int32_t tok, int32_t *next) {
    if (tok < 0 && g->res.stop == MU_GEN_RUNNING) {
        mu_gen_finish(g, MU_GEN_STOP_ERROR, "mu_gen_take_picked: no token");
        return g->res.stop;
    }
    return take_one(g, NULL, tok, next);
}

int64_t mu_gen_left(const mu_gen *g) { return g->n_predict < 0 ? -1 : g->n_predict - g->n_out; }

bool mu_gen_can_chain(const mu_gen *g, const muser_session *s) {
    const char *e = getenv("MUSER_CHAIN");
    return !(e && *e && atoi(e) == 0) && !g->speculate && !g->rows_needed && !g->n_probs && muser_sampler_is_argmax(g->smp) &&
           muser_session_can_chain(s);
}

bool mu_gen_needs_rows(const mu_gen *g) { return g->rows_needed || g->n_probs; }

mu_gen_stop mu_gen_take_drawn(mu_gen *g, const int32_t *toks, const float *const *rows, int n, int32_t *next) {
    if (g->res.stop != MU_GEN_RUNNING) return g->res.stop;
    if (n < 0 || n > MU_GEN_MAX_DRAW || (n && (!toks || (!rows && mu_gen_needs_rows(g))))) {
        mu_gen_finish(g, MU_GEN_STOP_ERROR, "mu_gen_take_drawn: bad token count or no rows");
        return g->res.stop;
    }
    static const float *const none[MU_GEN_MAX_DRAW];
    if (!rows) rows = none; /* nothing reads them (mu_gen_needs_rows) */
    for (int i = 0; i < n && rows != none; i++)
        if (!rows[i]) {
            mu_gen_finish(g, MU_GEN_STOP_ERROR, "mu_gen_take_drawn: a token without its logits row");
            return g->res.stop;
        }
    if (!g->first_row_taken) {
        mu_gen_finish(g, MU_GEN_STOP_ERROR, "mu_gen_take_drawn: the prompt's row goes through mu_gen_take_row");
        return g->res.stop;
    }
    g->res.n_decoded += n ? n : 1; /* the pending token and all but the last drawn one were fed */
    if (n > mu_gen_max_draw(g)) {
        mu_gen_finish(g, MU_GEN_STOP_ERROR, "mu_gen_take_drawn: more tokens than mu_gen_max_draw allows");
        return g->res.stop;
    }
    if (!n) {
        mu_gen_finish(g, MU_GEN_STOP_GRAMMAR, NULL);
        return g->res.stop;
    }
    return take_all(g, toks, rows, n, next);
}

const mu_gen_result *mu_gen_get_result(const mu_gen *g) {
    mu_gen_result *r = (mu_gen_result *)&g->res; /* the views below follow the buffers */
    r->prompt = g->prompt;
    r->n_prompt = g->n_prompt;
    r->tokens = g->out;
    r->n_tokens = g->n_out;
    r->text = g->text.p ? g->text.p : "";
    r->text_len = g->text.len;
    r->logprobs = g->n_probs ? g->lp : NULL;
    r->top = g->n_probs ? g->top : NULL;
    r->n_probs = g->n_probs;
    r->error = g->error;
    return r;
}

/* ---------------------------------------------------------- text helpers */

void mu_gen_json_string(mu_buf *b, const char *p, size_t n) {
    mu_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t len = tok_utf8_valid_len((const uint8_t *)p + i, n - i);
        const char *rep = NULL;
        if (!len) {
            rep = "\\ufffd"; /* one per invalid byte, as the streaming detokenizer does */
            len = 1;
        } else if (c == '"') rep = "\\\"";
        else if (c == '\\') rep = "\\\\";
        else if (c == '\n') rep = "\\n";
        else if (c == '\t') rep = "\\t";
        else if (c == '\r') rep = "\\r";
        char esc[8];
        if (rep) mu_buf_append(b, rep, strlen(rep));
        else if (c < 0x20 || c == 0x7F) mu_buf_append(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", c));
        else mu_buf_append(b, p + i, len);
        i += len;
    }
    mu_buf_append(b, "\"", 1);
}

void mu_gen_json_message(mu_buf *b, const char *role, const char *content, size_t n) {
    if (b->len && b->p[b->len - 1] != '[') mu_buf_append(b, ",", 1);
    mu_buf_append(b, "{\"role\":", 8);
    mu_gen_json_string(b, role, strlen(role));
    mu_buf_append(b, ",\"content\":", 11);
    mu_gen_json_string(b, content, n);
    mu_buf_append(b, "}", 1);
}
