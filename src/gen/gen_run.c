/* The blocking driver (gen.h): prompt with prefix reuse, then feed and take
 * rows (or speculate) until a stop; a full context ends the request. */
#include "gen/gen.h"
#include "util/common.h"
#include <stdio.h>
#include <stdlib.h>

void mu_gen_seq_clear(mu_gen_seq *q) { q->n = 0; }

void mu_gen_seq_free(mu_gen_seq *q) {
    free(q->ids);
    *q = (mu_gen_seq){0};
}

static void seq_push(mu_gen_seq *q, const int32_t *ids, int64_t n) {
    if (!q || n <= 0) return;
    if (q->n + n > q->cap) {
        q->cap = (q->n + n) * 2 + 64;
        q->ids = mu_xrealloc(q->ids, (size_t)q->cap * sizeof *q->ids);
    }
    memcpy(q->ids + q->n, ids, (size_t)n * sizeof *ids);
    q->n += n;
}

static bool failed(mu_gen *g, const char *msg, muser_error *err) {
    mu_gen_finish(g, MU_GEN_STOP_ERROR, msg);
    if (err) snprintf(err->msg, sizeof err->msg, "%s", msg);
    return false;
}

/* Feed the prompt, skipping the prefix the session already holds; the
 * number of tokens fed, -1 with err. */
static int64_t feed_prompt(muser_session *s, muser_spec *sp, mu_gen_seq *seq, const int32_t *ids, int64_t n,
                           muser_error *err) {
    int64_t common = 0;
    if (seq && muser_session_pos(s) == seq->n)
        while (common < seq->n && common < n && seq->ids[common] == ids[common]) common++;
    /* nothing past the prefix may stay, and the last prompt row must be fresh */
    if (!seq || common < seq->n || common == n) {
        if (sp) muser_spec_reset(sp);
        else muser_session_reset(s);
        common = 0;
        if (seq) mu_gen_seq_clear(seq);
    }
    if (n > muser_session_n_ctx(s)) {
        if (err) snprintf(err->msg, sizeof err->msg, "the prompt (%lld tokens) does not fit the context (%lld tokens)",
                          (long long)n, (long long)muser_session_n_ctx(s));
        return -1;
    }
    bool ok = sp ? muser_spec_feed(sp, ids + common, n - common, err)
                 : muser_session_feed(s, ids + common, n - common, err);
    if (!ok) return -1;
    seq_push(seq, ids + common, n - common);
    return n - common;
}

/* The rows of a greedy request on the session's chain
 * (muser_session_decode_chain): each pick goes through mu_gen_take_picked
 * (a row the backend left undecided, through mu_gen_take_row), and the
 * token it says comes next is what the chain feeds. On return the request
 * has stopped, or is still running with a full context (the caller's loop
 * then finishes it). */
typedef struct chain_ctx {
    mu_gen *g;
    int32_t *fed;             /* every token next() returned, in order */
    int64_t n, cap;
} chain_ctx;

static int32_t chain_next(void *user, int32_t tok, const float *row) {
    chain_ctx *c = user;
    if (!row && muser_sampler_bans(mu_gen_sampler(c->g), tok)) return MUSER_CHAIN_ROW; /* the chain decides */
    int32_t next;
    const mu_gen_stop st = row ? mu_gen_take_row(c->g, row, &next) : mu_gen_take_picked(c->g, tok, &next);
    if (st != MU_GEN_RUNNING) return -1;
    if (c->n == c->cap) {
        c->cap = c->cap * 2 + 64;
        c->fed = mu_xrealloc(c->fed, (size_t)c->cap * sizeof *c->fed);
    }
    c->fed[c->n++] = next;
    return next;
}

static bool drive_chain(mu_gen *g, muser_session *s, mu_gen_seq *seq, int32_t first, muser_error *err) {
    if (muser_session_pos(s) >= muser_session_n_ctx(s)) return true; /* the caller's loop stops it ("context") */
    const int64_t pos0 = muser_session_pos(s);
    chain_ctx c = {.g = g};
    /* as many tokens as are left to draw are fed: the last draw ends the request at once (mu_gen's length stop) */
    const int64_t calls = muser_session_decode_chain(s, first, mu_gen_left(g), chain_next, &c, err);
    if (calls >= 0) { /* the session holds first and the returned tokens it had room for */
        const int64_t fed = muser_session_pos(s) - pos0;
        seq_push(seq, &first, fed > 0 ? 1 : 0);
        seq_push(seq, c.fed, fed - 1);
    }
    free(c.fed);
    return calls >= 0;
}

bool mu_gen_run(mu_gen *g, muser_session *s, muser_spec *sp, mu_gen_seq *seq, const mu_gen_request *req,
                mu_gen_callback cb, void *user, muser_error *err) {
    return mu_gen_start(g, req, cb, user, err) && mu_gen_drive(g, s, sp, seq, err);
}

bool mu_gen_drive(mu_gen *g, muser_session *s, muser_spec *sp, mu_gen_seq *seq, muser_error *err) {
    muser_error e;
    if (mu_gen_get_result(g)->stop != MU_GEN_RUNNING) {
        if (err) snprintf(err->msg, sizeof err->msg, "mu_gen_drive: no request started");
        return false;
    }
    int64_t n_prompt;
    const int32_t *prompt = mu_gen_prompt(g, &n_prompt);
    int64_t fed;
    muser_kvstore *cache = mu_gen_prompt_cache(g);
    if (cache) { /* the store restores the longest prefix it has and feeds the rest */
        int64_t reused = 0;
        fed = muser_kvstore_prefill(cache, s, prompt, n_prompt, &reused, &e);
        mu_gen_set_reused(g, reused);
        if (seq && fed >= 0) {
            mu_gen_seq_clear(seq);
            seq_push(seq, prompt, n_prompt);
        }
    } else {
        fed = feed_prompt(s, sp, seq, prompt, n_prompt, &e);
    }
    if (fed < 0) {
        if (seq) mu_gen_seq_clear(seq); /* a failed feed leaves the session unknown to us */
        return failed(g, e.msg, err);
    }
    mu_gen_prefilled(g, fed);
    if (sp) muser_spec_reset_stats(sp); /* statistics of this request's decoding only */
    int32_t next;
    mu_gen_stop st = mu_gen_take_row(g, muser_session_logits(s), &next);
    if (st == MU_GEN_RUNNING && !sp && mu_gen_can_chain(g, s)) {
        if (!drive_chain(g, s, seq, next, &e)) return failed(g, e.msg, err);
        st = mu_gen_get_result(g)->stop;
    }
    while (st == MU_GEN_RUNNING) {
        if (muser_session_pos(s) >= muser_session_n_ctx(s)) {
            mu_gen_finish(g, MU_GEN_STOP_CONTEXT, NULL);
            break;
        }
        if (sp) { /* the assistant must see every row, even when it does not propose */
            int32_t out[MU_GEN_MAX_DRAW];
            const float *rows[MU_GEN_MAX_DRAW];
            const float **want = mu_gen_needs_rows(g) ? rows : NULL; /* none: the rows may stay on the backend */
            int n = muser_spec_next(sp, next, mu_gen_sampler(g), mu_gen_speculates(g) ? mu_gen_max_draw(g) : 1, out, want,
                                    &e);
            if (n < 0) return failed(g, e.msg, err);
            seq_push(seq, &next, 1);
            seq_push(seq, out, n - 1);
            st = mu_gen_take_drawn(g, out, want, n, &next);
        } else {
            if (!muser_session_feed(s, &next, 1, &e)) return failed(g, e.msg, err);
            seq_push(seq, &next, 1);
            st = mu_gen_take_row(g, muser_session_logits(s), &next);
        }
    }
    if (seq && seq->n != muser_session_pos(s))
        return failed(g, "mu_gen_run: the token record and the session disagree", err);
    if (st == MU_GEN_STOP_ERROR) {
        if (err) snprintf(err->msg, sizeof err->msg, "%s", mu_gen_get_result(g)->error);
        return false;
    }
    return true;
}
