/* The request loop library (src/gen/gen.h) on the shipped model and
 * assistant: stop strings split across tokens (held back, never emitted,
 * cut exactly), the context-full stop, logprobs events, the state machine
 * driven by hand against the blocking driver, prefix reuse, speculative
 * against plain decoding, refusals, the messages JSON of arbitrary bytes. */
#include "gen/gen.h"
#include "testutil.h"
#include "util/common.h"
#include <math.h>

static muser_model *model;
static muser_draft *draft;
static char model_path[512], draft_path[512];

/* What the callback saw. */
typedef struct seen {
    int64_t n_events, n_final;       /* token events; text-only events at the end */
    int32_t tokens[2048];
    size_t emitted_after[2048];      /* bytes emitted once token i's event was handled */
    mu_buf text;                 /* every emitted byte */
    bool logprobs_ok;
    int32_t n_probs;
    int64_t cancel_at;               /* return false at this token index (-1: never) */
} seen;

static bool record(void *user, const mu_gen_event *ev) {
    seen *w = user;
    mu_buf_append(&w->text, ev->text, ev->text_len);
    if (ev->token < 0) {
        w->n_final++;
        return true;
    }
    if (ev->index != w->n_events || w->n_events >= 2048) w->logprobs_ok = false;
    else {
        w->tokens[w->n_events] = ev->token;
        w->emitted_after[w->n_events] = w->text.len;
    }
    w->n_events++;
    if (w->n_probs) { /* the event's logprobs are those of the row it was drawn from */
        muser_logprob chosen, top[8];
        bool ok = ev->logprob && ev->n_top == w->n_probs &&
                  muser_logprobs(model, ev->row, ev->token, w->n_probs, &chosen, top, NULL);
        ok = ok && ev->logprob->id == ev->token && chosen.logprob == ev->logprob->logprob;
        for (int32_t k = 0; ok && k < w->n_probs; k++) ok = top[k].id == ev->top[k].id && top[k].logprob == ev->top[k].logprob;
        if (!ok) w->logprobs_ok = false;
    }
    return ev->index != w->cancel_at;
}

static void seen_init(seen *w, int32_t n_probs) {
    free(w->text.p);
    *w = (seen){.logprobs_ok = true, .n_probs = n_probs, .cancel_at = -1};
}

static mu_gen *new_gen(float temp, uint32_t seed, int32_t n_probs) {
    muser_sampling_params sp;
    muser_sampling_params_default(&sp);
    sp.temp = temp;
    sp.seed = seed;
    sp.n_probs = n_probs;
    muser_error err;
    mu_gen *g = mu_gen_new(model, &sp, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (!g) exit(1);
    return g;
}

static muser_session *new_session(int64_t n_ctx) {
    muser_session_params p = {.n_ctx = n_ctx};
    muser_error err;
    muser_session *s = muser_session_create(model, &p, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) exit(1);
    return s;
}

static const char *P = "And God said, Let there be light: and there was light. And God saw";

/* A stop string made of the last two bytes of one token's text and the
 * first two of the next: held back, never emitted, the text cut before it. */
static void test_stop_across_tokens(void) {
    muser_session *s = new_session(256);
    mu_gen *g = new_gen(0, 1, 0);
    seen w = {0};
    seen_init(&w, 0);
    muser_error err;
    mu_gen_request req = {.text = P, .n_predict = 40, .speculate = false};
    CHECK_MSG(mu_gen_run(g, s, NULL, NULL, &req, record, &w, &err), "%s", err.msg);
    const mu_gen_result *r = mu_gen_get_result(g);
    CHECK(r->stop == MU_GEN_STOP_LENGTH && r->n_tokens == 40 && w.n_events == 40 && w.n_final == 0);
    CHECK(w.text.len == r->text_len && !memcmp(w.text.p, r->text, r->text_len));
    char *full = mu_xstrdup(r->text);
    /* a boundary with two ASCII bytes on either side, the first place its four bytes occur */
    int64_t k = -1;
    size_t b = 0;
    for (int64_t i = 1; i + 1 < w.n_events && k < 0; i++) {
        size_t lo = w.emitted_after[i - 1], at = w.emitted_after[i], hi = w.emitted_after[i + 1];
        if (at - lo < 2 || hi - at < 2) continue;
        bool plain = true;
        for (size_t j = at - 2; j < at + 2; j++) plain &= full[j] >= ' ' && (unsigned char)full[j] < 0x80;
        char stop[5] = {full[at - 2], full[at - 1], full[at], full[at + 1], 0};
        if (plain && strstr(full, stop) == full + at - 2) { k = i; b = at; }
    }
    CHECK_MSG(k >= 0, "no token boundary with two ASCII bytes on both sides in '%s'", full);
    if (k >= 0) {
        char stop[5] = {full[b - 2], full[b - 1], full[b], full[b + 1], 0};
        const char *stops[] = {"never appears in this text", stop};
        req.stops = stops;
        req.n_stops = 2;
        seen_init(&w, 0);
        CHECK_MSG(mu_gen_run(g, s, NULL, NULL, &req, record, &w, &err), "%s", err.msg);
        r = mu_gen_get_result(g);
        CHECK_MSG(r->stop == MU_GEN_STOP_STRING, "stop %s", mu_gen_stop_name(r->stop));
        CHECK_EQ_INT(r->n_tokens, k + 2); /* the token that completes the stop string is the last */
        CHECK_EQ_INT(r->text_len, b - 2);
        CHECK(!memcmp(r->text, full, b - 2) && r->text[b - 2] == 0);
        CHECK(w.text.len == b - 2 && !memcmp(w.text.p, full, b - 2)); /* nothing of the stop was emitted */
        CHECK_EQ_INT(w.emitted_after[k], b - 2); /* the stop's first half was held back */
        CHECK(k == 0 || w.emitted_after[k - 1] <= b - 2);
    }
    free(full);
    free(w.text.p);
    mu_gen_free(g);
    muser_session_free(s);
}

/* No room for the next token: stop "context", the text kept. */
static void test_context_full(void) {
    muser_error err;
    int32_t *ids = NULL;
    int64_t n_prompt = muser_tokenize(model, P, strlen(P), true, true, &ids, &err);
    free(ids);
    muser_session *s = new_session(n_prompt + 5);
    muser_sampling_params sp;
    muser_sampling_params_default(&sp);
    sp.temp = 0;
    sp.ignore_eos = true;
    mu_gen *g = mu_gen_new(model, &sp, &err);
    seen w = {0};
    seen_init(&w, 0);
    mu_gen_request req = {.text = P, .n_predict = -1};
    CHECK_MSG(mu_gen_run(g, s, NULL, NULL, &req, record, &w, &err), "%s", err.msg);
    const mu_gen_result *r = mu_gen_get_result(g);
    CHECK_MSG(r->stop == MU_GEN_STOP_CONTEXT, "stop %s", mu_gen_stop_name(r->stop));
    CHECK_EQ_INT(r->n_tokens, 6); /* 5 fed, the last drawn one has no room */
    CHECK_EQ_INT(r->n_decoded, 5);
    CHECK_EQ_INT(muser_session_pos(s), n_prompt + 5);
    CHECK(r->text_len > 0 && w.text.len == r->text_len && !strcmp(r->text, "") == 0);
    /* a prompt that does not fit at all is an error, not a stop */
    muser_session *tiny = new_session(n_prompt - 1);
    CHECK(!mu_gen_run(g, tiny, NULL, NULL, &req, NULL, NULL, &err) && strstr(err.msg, "does not fit the context"));
    CHECK(mu_gen_get_result(g)->stop == MU_GEN_STOP_ERROR);
    muser_session_free(tiny);
    mu_gen_free(g);
    free(w.text.p);
    muser_session_free(s);
}

/* Drive the state machine by hand, as a server's scheduler would. */
/* draw_ahead: each row's draw (and its logprobs) by mu_gen_draw first, as
 * the server's drawing threads do. */
static void drive_by_hand(mu_gen *g, muser_session *s, const mu_gen_request *req, seen *w, bool draw_ahead) {
    muser_error err;
    CHECK_MSG(mu_gen_start(g, req, record, w, &err), "%s", err.msg);
    int64_t n;
    const int32_t *prompt = mu_gen_prompt(g, &n);
    muser_session_reset(s);
    CHECK_MSG(muser_session_feed(s, prompt, n, &err), "%s", err.msg);
    mu_gen_prefilled(g, n);
    int32_t next;
    if (draw_ahead) mu_gen_draw(g, muser_session_logits(s));
    mu_gen_stop st = mu_gen_take_row(g, muser_session_logits(s), &next);
    while (st == MU_GEN_RUNNING) {
        if (muser_session_pos(s) == muser_session_n_ctx(s)) {
            mu_gen_finish(g, MU_GEN_STOP_CONTEXT, NULL);
            break;
        }
        CHECK_MSG(muser_session_feed(s, &next, 1, &err), "%s", err.msg);
        if (draw_ahead) mu_gen_draw(g, muser_session_logits(s));
        st = mu_gen_take_row(g, muser_session_logits(s), &next);
    }
}

static bool same_result(const mu_gen_result *a, const mu_gen_result *b) {
    bool ok = a->stop == b->stop && a->n_tokens == b->n_tokens && a->text_len == b->text_len &&
              !memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) && !strcmp(a->text, b->text);
    for (int64_t i = 0; ok && a->logprobs && i < a->n_tokens; i++)
        ok = a->logprobs[i].id == b->logprobs[i].id && a->logprobs[i].logprob == b->logprobs[i].logprob;
    return ok;
}

/* Sampled, with logprobs and a stop string: by hand == mu_gen_run. */
static void test_state_machine_and_logprobs(void) {
    muser_session *s = new_session(512);
    mu_gen *a = new_gen(0.9f, 7, 3), *b = new_gen(0.9f, 7, 3);
    const char *stops[] = {"Moses"};
    mu_gen_request req = {.text = P, .n_predict = 64, .stops = stops, .n_stops = 1};
    seen wa = {0}, wb = {0};
    seen_init(&wa, 3);
    seen_init(&wb, 3);
    drive_by_hand(a, s, &req, &wa, false);
    muser_error err;
    CHECK_MSG(mu_gen_run(b, s, NULL, NULL, &req, record, &wb, &err), "%s", err.msg);
    const mu_gen_result *ra = mu_gen_get_result(a), *rb = mu_gen_get_result(b);
    CHECK(ra->n_tokens > 0 && same_result(ra, rb));
    /* drawn ahead (the logprobs computed with the draw): the same tokens,
     * logprobs and alternatives (record compares each event's) */
    mu_gen *c = new_gen(0.9f, 7, 3);
    seen wc = {0};
    seen_init(&wc, 3);
    drive_by_hand(c, s, &req, &wc, true);
    const mu_gen_result *rc = mu_gen_get_result(c);
    CHECK(same_result(ra, rc) && wc.logprobs_ok && wc.n_events == ra->n_tokens);
    CHECK(!memcmp(ra->top, rc->top, (size_t)ra->n_tokens * 3 * sizeof *ra->top));
    free(wc.text.p);
    mu_gen_free(c);
    CHECK(wa.logprobs_ok && wb.logprobs_ok && wa.n_events == ra->n_tokens);
    for (int64_t i = 0; i < ra->n_tokens && i < 2048; i++) CHECK(ra->logprobs[i].id == ra->tokens[i]);
    CHECK(ra->logprobs[0].logprob <= 0 && ra->top[0].logprob >= ra->top[1].logprob);
    CHECK(ra->n_prefill > 0 && ra->n_decoded == ra->n_tokens - 1 + (ra->stop == MU_GEN_STOP_GRAMMAR));
    /* cancelling from the callback stops after that token */
    seen_init(&wb, 3);
    wb.cancel_at = 3;
    req.n_stops = 0;
    CHECK_MSG(mu_gen_run(b, s, NULL, NULL, &req, record, &wb, &err), "%s", err.msg);
    rb = mu_gen_get_result(b);
    CHECK(rb->stop == MU_GEN_STOP_CANCELLED && rb->n_tokens == 4);
    /* a finished request takes nothing more */
    int32_t next;
    CHECK(mu_gen_take_row(b, muser_session_logits(s), &next) == MU_GEN_STOP_CANCELLED && rb->n_tokens == 4);
    free(wa.text.p);
    free(wb.text.p);
    mu_gen_free(a);
    mu_gen_free(b);
    muser_session_free(s);
}

/* A second request that extends the first reuses its tokens in the session
 * and gives what a fresh session gives. */
static void test_prefix_reuse(void) {
    muser_session *s = new_session(512), *fresh = new_session(512);
    mu_gen *g = new_gen(0.8f, 3, 0), *h = new_gen(0.8f, 3, 0);
    mu_gen_seq seq = {0};
    muser_error err;
    mu_gen_request req = {.text = P, .n_predict = 16};
    CHECK_MSG(mu_gen_run(g, s, NULL, &seq, &req, NULL, NULL, &err), "%s", err.msg);
    CHECK_EQ_INT(seq.n, muser_session_pos(s));
    int64_t n_first = seq.n;
    int32_t *more = mu_xmalloc((size_t)(seq.n + 3) * sizeof(int32_t));
    memcpy(more, seq.ids, (size_t)seq.n * sizeof(int32_t));
    more[seq.n] = more[seq.n + 1] = more[seq.n + 2] = 5;
    mu_gen_request req2 = {.tokens = more, .n_tokens = n_first + 3, .n_predict = 16};
    CHECK_MSG(mu_gen_run(g, s, NULL, &seq, &req2, NULL, NULL, &err), "%s", err.msg);
    CHECK_EQ_INT(mu_gen_get_result(g)->n_prefill, 3);
    CHECK_MSG(mu_gen_run(h, fresh, NULL, NULL, &req2, NULL, NULL, &err), "%s", err.msg);
    CHECK(same_result(mu_gen_get_result(g), mu_gen_get_result(h)));
    CHECK_EQ_INT(mu_gen_get_result(h)->n_prefill, n_first + 3);
    free(more);
    mu_gen_seq_free(&seq);
    mu_gen_free(g);
    mu_gen_free(h);
    muser_session_free(s);
    muser_session_free(fresh);
}

/* Speculative decoding gives plain decoding's tokens, text, stop and
 * logprobs (several tokens per take, stop strings inside a batch). */
static void test_speculative_equals_plain(void) {
    static const struct { float temp; uint32_t seed; const char *stop; int64_t n; } cases[] = {
        {0.0f, 1, NULL, 64}, {0.8f, 11, NULL, 64}, {0.0f, 1, "said", 48}, {1.2f, 5, "the", 48}, {0.0f, 1, NULL, 1},
    };
    muser_session *s = new_session(512);
    muser_error err;
    int string_stops = 0;
    for (int vl = 3; vl <= 7; vl += 4) {
        muser_spec_params p = {.verify_len = vl, .no_gate = true};
        muser_spec *sp = muser_spec_create(s, draft, &p, &err);
        CHECK_MSG(sp != NULL, "%s", err.msg);
        if (!sp) return;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            mu_gen *a = new_gen(cases[c].temp, cases[c].seed, 2), *b = new_gen(cases[c].temp, cases[c].seed, 2);
            const char *stops[] = {cases[c].stop};
            mu_gen_request req = {.text = P, .n_predict = cases[c].n, .stops = stops, .n_stops = cases[c].stop != NULL};
            seen wa = {0}, wb = {0};
            seen_init(&wa, 2);
            seen_init(&wb, 2);
            muser_session *plain_s = new_session(512);
            CHECK_MSG(mu_gen_run(a, plain_s, NULL, NULL, &req, record, &wa, &err), "%s", err.msg);
            req.speculate = true;
            CHECK_MSG(mu_gen_run(b, s, sp, NULL, &req, record, &wb, &err), "%s", err.msg);
            const mu_gen_result *ra = mu_gen_get_result(a), *rb = mu_gen_get_result(b);
            CHECK_MSG(same_result(ra, rb), "verify length %d case %zu: speculative (%lld tokens, %s) != plain (%lld, %s)",
                      vl, c, (long long)rb->n_tokens, mu_gen_stop_name(rb->stop), (long long)ra->n_tokens,
                      mu_gen_stop_name(ra->stop));
            CHECK(wa.logprobs_ok && wb.logprobs_ok && wa.text.len == wb.text.len);
            string_stops += ra->stop == MU_GEN_STOP_STRING;
            muser_spec_stats st;
            muser_spec_get_stats(sp, &st);
            CHECK(cases[c].n == 1 || st.rounds > 0);
            free(wa.text.p);
            free(wb.text.p);
            muser_session_free(plain_s);
            mu_gen_free(a);
            mu_gen_free(b);
        }
        muser_spec_free(sp);
    }
    CHECK_MSG(string_stops >= 2, "only %d runs stopped at a stop string", string_stops);
    /* the greedy pair of muser speculate / bench --draft */
    int32_t *ids = NULL;
    int64_t n = muser_tokenize(model, P, strlen(P), true, true, &ids, &err);
    mu_gen_pair pr = {0};
    CHECK(mu_gen_greedy(s, NULL, NULL, ids, n, 40, &pr, &err) &&
          mu_gen_greedy(s, draft, &(muser_spec_params){.verify_len = 7}, ids, n, 40, &pr, &err));
    CHECK(pr.n_plain == 40 && mu_gen_pair_diff(&pr) == -1 && pr.st.rounds > 0);
    pr.spec[5] ^= 1;
    CHECK_EQ_INT(mu_gen_pair_diff(&pr), 5);
    mu_gen_pair_free(&pr);
    free(ids);
    muser_session_free(s);
}

/* The greedy chain (muser_session_decode_chain) against feeding one token
 * at a time: the same tokens, stops and session (the next row's logits
 * bits), with every row handed back undecided now and then
 * (MUSER_CHAIN_UNDECIDED) and with next() going its own way. */
typedef struct chain_rec {
    int64_t calls, undecided, stop_at, deviate_at, row_at;
    int32_t out[256];
} chain_rec;

static int32_t n_vocab(void) {
    muser_model_info info;
    muser_model_get_info(model, &info);
    return (int32_t)info.n_vocab;
}

static int32_t first_max(const float *row) {
    const int32_t V = n_vocab();
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (row[i] > row[best]) best = i;
    return best;
}

static int32_t chain_decide(chain_rec *c, int32_t tok) {
    const int64_t i = c->calls++;
    if (i == c->stop_at) return -1;
    if (i == c->deviate_at) tok = (tok + 1) % n_vocab();
    c->out[i] = tok;
    return tok;
}

static int32_t chain_next(void *user, int32_t tok, const float *row) {
    chain_rec *c = user;
    if (!row && c->calls == c->row_at) {
        c->row_at = -1; /* asked once: next comes the row */
        return MUSER_CHAIN_ROW;
    }
    if (row) c->undecided++, tok = first_max(row);
    return chain_decide(c, tok);
}

static void test_chain_equals_plain(void) {
    muser_error err;
    int32_t *ids = NULL;
    const int64_t n_prompt = muser_tokenize(model, P, strlen(P), true, true, &ids, &err);
    const int32_t V = n_vocab();
    static const struct { int64_t stop_at, deviate_at, n_ctx; const char *undecided; int64_t max_feed; } cases[] = {
        {40, -1, 512, NULL, -1}, {40, 7, 512, NULL, -1}, {0, -1, 512, NULL, -1}, {1, 0, 512, "2", -1},
        {30, 11, 512, "3", -1},  {100, -1, 0, NULL, -1}, {100, 2, 0, "4", -1},  {100, -1, 512, NULL, 10},
        {100, 3, 512, "3", 7},   {100, -1, 512, NULL, 1},  {20, -1, 512, NULL, -1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n_ctx = cases[c].n_ctx ? cases[c].n_ctx : n_prompt + 6; /* 0: the context fills first */
        muser_session *a = new_session(n_ctx), *b = new_session(n_ctx);
        CHECK(muser_session_can_chain(b));
        CHECK_MSG(muser_session_feed(a, ids, n_prompt, &err) && muser_session_feed(b, ids, n_prompt, &err), "%s",
                  err.msg);
        /* by hand: feed, look at the row, decide */
        chain_rec ra = {.stop_at = cases[c].stop_at, .deviate_at = cases[c].deviate_at, .row_at = -1};
        int32_t t = first_max(muser_session_logits(a)), first = t;
        for (int64_t fed = 1;; fed++) {
            CHECK_MSG(muser_session_feed(a, &t, 1, &err), "%s", err.msg);
            t = chain_decide(&ra, first_max(muser_session_logits(a)));
            if (t < 0 || muser_session_pos(a) == n_ctx || fed == cases[c].max_feed) break;
        }
        if (cases[c].undecided) setenv("MUSER_CHAIN_UNDECIDED", cases[c].undecided, 1);
        const bool last = c + 1 == sizeof cases / sizeof cases[0]; /* and next() asks for row 9 itself */
        chain_rec rb = {.stop_at = cases[c].stop_at, .deviate_at = cases[c].deviate_at, .row_at = last ? 9 : -1};
        const int64_t calls = muser_session_decode_chain(b, first, cases[c].max_feed, chain_next, &rb, &err);
        unsetenv("MUSER_CHAIN_UNDECIDED");
        CHECK_MSG(calls == ra.calls && calls == rb.calls, "case %zu: %lld calls, by hand %lld (%s)", c,
                  (long long)calls, (long long)ra.calls, calls < 0 ? err.msg : "");
        CHECK_MSG(!memcmp(ra.out, rb.out, (size_t)(ra.calls < 256 ? ra.calls : 256) * sizeof(int32_t)),
                  "case %zu: other tokens", c);
        CHECK_MSG(muser_session_pos(a) == muser_session_pos(b), "case %zu: position %lld, by hand %lld", c,
                  (long long)muser_session_pos(b), (long long)muser_session_pos(a));
        if (cases[c].undecided) CHECK_MSG(rb.undecided > 0, "case %zu: no row was handed back", c);
        else CHECK_EQ_INT(rb.undecided, last ? 1 : 0);
        CHECK(muser_session_logits(b) == NULL);
        if (muser_session_pos(a) < n_ctx) { /* the same session: the next row's bits */
            const int32_t x = 5 % V;
            CHECK_MSG(muser_session_feed(a, &x, 1, &err) && muser_session_feed(b, &x, 1, &err), "%s", err.msg);
            CHECK_MSG(!memcmp(muser_session_logits(a), muser_session_logits(b), (size_t)V * sizeof(float)),
                      "case %zu: the next row differs", c);
        }
        muser_session_free(a);
        muser_session_free(b);
    }
    /* refusals: a token outside the vocabulary, a full context */
    muser_session *s = new_session(n_prompt + 1);
    chain_rec r = {.stop_at = 5, .deviate_at = -1, .row_at = -1};
    CHECK(muser_session_decode_chain(s, V, -1, chain_next, &r, &err) < 0 && strstr(err.msg, "outside the vocabulary"));
    CHECK(muser_session_feed(s, ids, n_prompt, &err) && muser_session_decode_chain(s, 1, -1, chain_next, &r, &err) == 1);
    CHECK(muser_session_decode_chain(s, 1, -1, chain_next, &r, &err) < 0 && strstr(err.msg, "context full"));
    muser_session_free(s);
    free(ids);
    /* mu_gen_run on the chain (greedy: the default here) against MUSER_CHAIN=0 */
    static const struct { const char *stop; int64_t n, n_ctx; bool ignore_eos; } runs[] = {
        {NULL, 48, 512, false}, {"said", 64, 512, false}, {NULL, 1, 512, false}, {NULL, -1, 0, false},
        {NULL, 200, 512, true},
    };
    for (size_t c = 0; c < sizeof runs / sizeof runs[0]; c++) {
        const int64_t n_ctx = runs[c].n_ctx ? runs[c].n_ctx : n_prompt + 7;
        muser_session *sa = new_session(n_ctx), *sb = new_session(n_ctx);
        muser_sampling_params sp;
        muser_sampling_params_default(&sp);
        sp.temp = 0;
        sp.ignore_eos = runs[c].ignore_eos;
        mu_gen *a = mu_gen_new(model, &sp, &err), *b = mu_gen_new(model, &sp, &err);
        const char *stops[] = {runs[c].stop};
        mu_gen_request req = {.text = P, .n_predict = runs[c].n, .stops = stops, .n_stops = runs[c].stop != NULL};
        setenv("MUSER_CHAIN", "0", 1);
        CHECK(!mu_gen_can_chain(a, sa));
        CHECK_MSG(mu_gen_run(a, sa, NULL, NULL, &req, NULL, NULL, &err), "%s", err.msg);
        unsetenv("MUSER_CHAIN");
        CHECK(mu_gen_can_chain(b, sb));
        CHECK_MSG(mu_gen_run(b, sb, NULL, NULL, &req, NULL, NULL, &err), "%s", err.msg);
        const mu_gen_result *ra = mu_gen_get_result(a), *rb = mu_gen_get_result(b);
        CHECK_MSG(same_result(ra, rb) && ra->n_decoded == rb->n_decoded &&
                      muser_session_pos(sa) == muser_session_pos(sb),
                  "run %zu: chain (%lld tokens, %s, position %lld) != plain (%lld, %s, %lld)", c,
                  (long long)rb->n_tokens, mu_gen_stop_name(rb->stop), (long long)muser_session_pos(sb),
                  (long long)ra->n_tokens, mu_gen_stop_name(ra->stop), (long long)muser_session_pos(sa));
        mu_gen_free(a);
        mu_gen_free(b);
        muser_session_free(sa);
        muser_session_free(sb);
    }
    /* not for a sampler that is not an argmax */
    muser_session *s2 = new_session(64);
    mu_gen *hot = new_gen(0.8f, 1, 0), *lp = new_gen(0.0f, 1, 2);
    CHECK(!mu_gen_can_chain(hot, s2) && !mu_gen_can_chain(lp, s2));
    mu_gen_free(hot);
    mu_gen_free(lp);
    muser_session_free(s2);
}

static void test_refusals_and_messages(void) {
    mu_gen *g = new_gen(0, 1, 0);
    muser_error err;
    int32_t one = 5;
    mu_gen_request two = {.text = "x", .tokens = &one, .n_tokens = 1};
    CHECK(!mu_gen_start(g, &two, NULL, NULL, &err) && strstr(err.msg, "exactly one of"));
    const char *empty[] = {""};
    mu_gen_request e = {.text = "x", .stops = empty, .n_stops = 1};
    CHECK(!mu_gen_start(g, &e, NULL, NULL, &err) && strstr(err.msg, "stop string is empty"));
    mu_gen_request bad = {.tokens = (const int32_t[]){1, 99999}, .n_tokens = 2};
    CHECK(!mu_gen_start(g, &bad, NULL, NULL, &err) && strstr(err.msg, "outside the vocabulary"));
    int32_t next;
    CHECK(mu_gen_take_row(g, NULL, &next) == MU_GEN_STOP_ERROR); /* nothing started */
    /* user bytes of any kind make valid messages JSON, rendered by the template */
    mu_buf m = {0};
    mu_buf_append(&m, "[", 1);
    mu_gen_json_message(&m, "system", "\xff", 1);
    mu_gen_json_message(&m, "user", "caf\xe9 \"q\"\n\x01\xe2\x82\xac", 13);
    mu_buf_append(&m, "]", 1);
    CHECK_MSG(!strcmp(m.p, "[{\"role\":\"system\",\"content\":\"\\ufffd\"},"
                           "{\"role\":\"user\",\"content\":\"caf\\ufffd \\\"q\\\"\\n\\u0001\xe2\x82\xac\"}]"),
              "%s", m.p);
    mu_gen_request chat = {.messages_json = m.p, .n_predict = 2};
    CHECK_MSG(mu_gen_start(g, &chat, NULL, NULL, &err), "%s", err.msg);
    int64_t n;
    CHECK(mu_gen_prompt(g, &n) && n > 4);
    mu_gen_finish(g, MU_GEN_STOP_CANCELLED, NULL);
    CHECK(mu_gen_get_result(g)->stop == MU_GEN_STOP_CANCELLED);
    free(m.p);
    CHECK(!strcmp(mu_gen_stop_name(MU_GEN_STOP_CONTEXT), "context") &&
          !strcmp(mu_gen_stop_name(MU_GEN_STOP_STRING), "stop_string"));
    mu_gen_free(g);
}

int main(void) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    snprintf(model_path, sizeof model_path, "%s/models/glimmer-tiny-q4_k_xl.gguf", src ? src : ".");
    snprintf(draft_path, sizeof draft_path, "%s/models/glimmer-tiny-dflash-q4_k_xl.gguf", src ? src : ".");
    muser_error err;
    model = muser_model_load(model_path, NULL, &err);
    draft = model ? muser_draft_load(draft_path, model, &err) : NULL;
    if (!draft) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    test_stop_across_tokens();
    test_context_full();
    test_state_machine_and_logprobs();
    test_prefix_reuse();
    test_speculative_equals_plain();
    test_refusals_and_messages();
    test_chain_equals_plain();
    muser_draft_free(draft);
    muser_model_free(model);
    TEST_MAIN_END();
}
