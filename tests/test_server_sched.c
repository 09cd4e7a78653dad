/* The server's scheduler (src/server/sched.h) on the shipped glimmer-tiny:
 *  - 8 greedy jobs with logprobs over 4 slots give exactly the tokens,
 *    text and logprobs of each prompt run alone through mu_gen_run;
 *  - a seeded sampled job replays identically alone and under load;
 *  - a prompt extending a finished one reuses the slot's cached prefix and
 *    still gives the solo result;
 *  - a cancelled job ends "cancelled" and frees its slot at once;
 *  - a full queue refuses with 429, bad input with 400;
 *  - a greedy job alone decodes on the greedy chain with the same output. */
#include "testutil.h"
#include "server/sched.h"
#include <unistd.h>

#define N_CTX 512

static muser_model *model;

static const char *PROMPTS[8] = {
    "And it came to pass, when the king",
    "In the beginning God created",
    "The committee met on Tuesday to discuss",
    "What is a hacker?",
    "Once upon a time there was a",
    "The Lord is my shepherd;",
    "A unit of computing power",
    "And God said, Let there be light:",
};

typedef struct outcome {
    int32_t toks[64];
    float lp[64];
    int64_t n;
    char text[1024];
    mu_gen_stop stop;
} outcome;

static muser_sampling_params params(float temp, uint32_t seed, int n_probs) {
    muser_sampling_params sp;
    muser_sampling_params_default(&sp);
    sp.temp = temp;
    sp.seed = seed;
    sp.n_probs = n_probs;
    return sp;
}

/* The reference: the prompt alone on a fresh session (with a stop string
 * or none; plain: with the greedy chain off, MUSER_CHAIN=0); *pos, when
 * asked, the session's length at the end. */
static void solo_run(const char *prompt, const muser_sampling_params *sp, int64_t n_predict, const char *stop,
                     bool plain, outcome *o, int64_t *pos) {
    if (plain) setenv("MUSER_CHAIN", "0", 1);
    muser_error err;
    muser_session_params ps = {.n_ctx = N_CTX};
    muser_session *s = muser_session_create(model, &ps, &err);
    mu_gen *g = mu_gen_new(model, sp, &err);
    const char *stops[] = {stop};
    mu_gen_request req = {.text = prompt, .n_predict = n_predict, .stops = stops, .n_stops = stop != NULL};
    CHECK_MSG(s && g && mu_gen_run(g, s, NULL, NULL, &req, NULL, NULL, &err), "%s", err.msg);
    const mu_gen_result *r = mu_gen_get_result(g);
    memset(o, 0, sizeof *o);
    o->n = r->n_tokens;
    for (int64_t i = 0; i < r->n_tokens && i < 64; i++) {
        o->toks[i] = r->tokens[i];
        o->lp[i] = r->logprobs ? r->logprobs[i].logprob : 0;
    }
    snprintf(o->text, sizeof o->text, "%s", r->text);
    o->stop = r->stop;
    if (pos) *pos = muser_session_pos(s);
    mu_gen_free(g);
    muser_session_free(s);
    if (plain) unsetenv("MUSER_CHAIN");
}

static void solo(const char *prompt, const muser_sampling_params *sp, int64_t n_predict, outcome *o) {
    solo_run(prompt, sp, n_predict, NULL, false, o, NULL);
}

static srv_job *submit(srv_sched *s, const char *prompt, const muser_sampling_params *sp, int64_t n_predict) {
    srv_job_params p = {.req = {.text = prompt, .n_predict = n_predict}, .sampling = *sp, .slot = -1,
                        .cache_prompt = true};
    srv_refusal why;
    muser_error err;
    srv_job *j = srv_sched_submit(s, &p, &why, &err);
    CHECK_MSG(j, "submit: %d %s", (int)why, err.msg);
    return j;
}

/* Read a job's events to the end; its outcome from the events themselves. */
static void collect(srv_job *j, outcome *o) {
    memset(o, 0, sizeof *o);
    size_t len = 0;
    srv_event ev;
    for (;;) {
        CHECK(srv_job_next(j, &ev, 30000));
        if (ev.kind == SRV_EV_DONE) break;
        if (ev.token >= 0 && o->n < 64) {
            CHECK(ev.index == o->n);
            o->toks[o->n] = ev.token;
            o->lp[o->n] = ev.has_logprob ? ev.logprob.logprob : 0;
            o->n++;
        }
        if (ev.text_len && len + ev.text_len < sizeof o->text) {
            memcpy(o->text + len, ev.text, ev.text_len);
            len += ev.text_len;
        }
    }
    o->stop = ev.stop;
    CHECK(srv_job_result(j)->stop == ev.stop);
}

static bool same(const outcome *a, const outcome *b) {
    return a->n == b->n && !memcmp(a->toks, b->toks, (size_t)a->n * sizeof(int32_t)) &&
           !memcmp(a->lp, b->lp, (size_t)a->n * sizeof(float)) && !strcmp(a->text, b->text) && a->stop == b->stop;
}

/* Cancel job j after its first k tokens: it ends "cancelled". */
static void cancel_after(srv_job *j, int k) {
    srv_event ev;
    for (int i = 0; i < k; i++) CHECK(srv_job_next(j, &ev, 30000) && ev.kind == SRV_EV_TOKEN);
    srv_job_cancel(j);
    do CHECK(srv_job_next(j, &ev, 30000)); while (ev.kind != SRV_EV_DONE);
    CHECK(ev.stop == MU_GEN_STOP_CANCELLED);
}

/* draw_threads: 0 the default (on the CPU backend the scheduler thread
 * draws alone), 4 the draws of the slots on four threads: the same tokens
 * either way (sched.c take_rows). Jobs 8-11 sample (seeded), so each
 * slot's random stream matters. */
static void test_batched_equals_solo(int32_t draw_threads) {
    muser_error err;
    srv_sched_params sp = {.n_slots = 4, .n_ctx = N_CTX, .prefill_chunk = 8, .draw_threads = draw_threads};
    srv_sched *s = srv_sched_create(model, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) return;
    enum { NJ = 12 };
    const muser_sampling_params greedy = params(0, 1, 3);
    outcome want[NJ], got[NJ];
    muser_sampling_params seeded[4];
    for (int i = 0; i < 4; i++) seeded[i] = params(0.8f, 42 + 7 * (uint32_t)i, 2);
    for (int i = 0; i < 8; i++) solo(PROMPTS[i], &greedy, 24 + 3 * i, &want[i]);
    for (int i = 0; i < 4; i++) solo(PROMPTS[2 * i], &seeded[i], 32, &want[8 + i]);
    srv_job *jobs[NJ];
    for (int i = 0; i < 8; i++) jobs[i] = submit(s, PROMPTS[i], &greedy, 24 + 3 * i);
    for (int i = 0; i < 4; i++) jobs[8 + i] = submit(s, PROMPTS[2 * i], &seeded[i], 32);
    for (int i = 0; i < NJ; i++) {
        if (!jobs[i]) continue;
        collect(jobs[i], &got[i]);
        CHECK_MSG(same(&got[i], &want[i]), "draw threads %d, job %d: %lld tokens '%s' against solo %lld '%s'",
                  draw_threads, i, (long long)got[i].n, got[i].text, (long long)want[i].n, want[i].text);
        srv_job_free(jobs[i]);
    }
    srv_stats st;
    srv_sched_stats(s, &st);
    CHECK(st.requests_finished == NJ && st.running == 0 && st.waiting == 0 && st.ttft.n == NJ);
    CHECK(st.generation_tokens_total > 0 && st.steps_total > 0 && st.step_seconds > 0 && st.take_seconds > 0);
    if (draw_threads > 1) {
        srv_sched_free(s, true);
        return;
    }

    /* a prompt that extends a finished one: the slot's prefix is reused */
    char longer[256];
    snprintf(longer, sizeof longer, "%s and the queen", PROMPTS[0]);
    outcome w, g;
    solo(longer, &greedy, 16, &w);
    srv_job *j = submit(s, longer, &greedy, 16);
    if (j) {
        collect(j, &g);
        CHECK_MSG(srv_job_cached(j) >= 8, "cached %lld", (long long)srv_job_cached(j));
        CHECK(same(&g, &w));
        srv_job_free(j);
    }

    /* cancel a long job after a few tokens: its slot is free again */
    muser_sampling_params forever = greedy;
    forever.ignore_eos = true;
    j = submit(s, PROMPTS[1], &forever, 400);
    if (j) {
        cancel_after(j, 3);
        srv_job_free(j);
        srv_slot_info slots[4];
        CHECK(srv_sched_slots(s, slots, 4) == 4);
        for (int k = 0; k < 4; k++) CHECK(!slots[k].busy);
        CHECK(srv_sched_slot_erase(s, 0, &err));
        CHECK(!srv_sched_slot_erase(s, 9, &err) && strstr(err.msg, "slot 9"));
    }
    /* refusals: prompt past the context, bad grammar, bad slot */
    srv_refusal why;
    char *huge = malloc(20000);
    for (int k = 0; k < 19999; k++) huge[k] = k % 5 ? 'a' + k % 23 : ' ';
    huge[19999] = 0;
    srv_job_params bad = {.req = {.text = huge, .n_predict = 4}, .sampling = greedy, .slot = -1};
    CHECK(!srv_sched_submit(s, &bad, &why, &err) && why == SRV_REFUSED_INVALID && strstr(err.msg, "context"));
    free(huge);
    bad.req.text = "hi";
    bad.sampling.grammar = "root ::= (";
    CHECK(!srv_sched_submit(s, &bad, &why, &err) && why == SRV_REFUSED_INVALID);
    bad.sampling.grammar = NULL;
    bad.slot = 7;
    CHECK(!srv_sched_submit(s, &bad, &why, &err) && why == SRV_REFUSED_INVALID && strstr(err.msg, "id_slot"));
    srv_sched_free(s, true);
}

static void test_queue_full(void) {
    muser_error err;
    srv_sched_params sp = {.n_slots = 1, .n_ctx = N_CTX, .max_queue = 1};
    srv_sched *s = srv_sched_create(model, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) return;
    muser_sampling_params forever = params(0, 1, 0);
    forever.ignore_eos = true;
    srv_job_params p = {.req = {.text = "In the beginning", .n_predict = 300}, .sampling = forever, .slot = -1};
    srv_job *jobs[4];
    int refused = 0;
    for (int i = 0; i < 4; i++) {
        srv_refusal why = 0;
        jobs[i] = srv_sched_submit(s, &p, &why, &err);
        if (!jobs[i]) {
            refused++;
            CHECK(why == SRV_REFUSED_BUSY && strstr(err.msg, "retry"));
        }
    }
    CHECK_MSG(refused >= 2, "%d of 4 refused with one slot and a queue of one", refused);
    srv_sched_free(s, false); /* cancels the rest */
    for (int i = 0; i < 4; i++) {
        if (!jobs[i]) continue;
        srv_event ev;
        do CHECK(srv_job_next(jobs[i], &ev, 30000)); while (ev.kind != SRV_EV_DONE);
        CHECK(ev.stop == MU_GEN_STOP_CANCELLED || ev.stop == MU_GEN_STOP_LENGTH);
        srv_job_free(jobs[i]);
    }
}

/* With an assistant: a job alone speculates (every step here), jobs side by
 * side go back to batched steps; either way the tokens, text and logprobs
 * are those of the plain solo run. */
static void test_speculation(const char *draft_path) {
    muser_error err;
    muser_draft *d = muser_draft_load(draft_path, model, &err);
    CHECK_MSG(d, "%s", err.msg);
    if (!d) return;
    srv_sched_params sp = {.n_slots = 2, .n_ctx = N_CTX, .draft = d, .verify_len = 7, .spec_always = true};
    srv_sched *s = srv_sched_create(model, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) {
        muser_draft_free(d);
        return;
    }
    const muser_sampling_params greedy = params(0, 1, 2), seeded = params(0.8f, 9, 2);
    outcome want, got;
    for (int i = 0; i < 3; i++) { /* one at a time: alone, so speculating */
        const muser_sampling_params *smp = i == 2 ? &seeded : &greedy;
        solo(PROMPTS[i], smp, 40, &want);
        srv_job *j = submit(s, PROMPTS[i], smp, 40);
        if (!j) continue;
        collect(j, &got);
        CHECK_MSG(same(&got, &want), "speculative job %d: '%s' against plain '%s'", i, got.text, want.text);
        srv_job_free(j);
    }
    srv_stats st;
    srv_sched_stats(s, &st);
    CHECK_MSG(st.spec_drafted > 0 && st.spec_accepted <= st.spec_drafted, "drafted %llu, accepted %llu",
              (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
    /* side by side (batched), then the survivor alone (speculating) */
    outcome w2[2], g2[2];
    srv_job *jobs[2];
    for (int i = 0; i < 2; i++) {
        solo(PROMPTS[3 + i], &greedy, 20 + 20 * i, &w2[i]);
        jobs[i] = submit(s, PROMPTS[3 + i], &greedy, 20 + 20 * i);
    }
    for (int i = 0; i < 2; i++) {
        if (!jobs[i]) continue;
        collect(jobs[i], &g2[i]);
        CHECK_MSG(same(&g2[i], &w2[i]), "job %d beside another: '%s' against '%s'", i, g2[i].text, w2[i].text);
        srv_job_free(jobs[i]);
    }
    srv_sched_free(s, true);
    muser_draft_free(d);
}

/* A greedy job alone (no logprobs) decodes on the greedy chain in bursts
 * (sched.c chain_burst): the same tokens, text and stop as the prompt run
 * alone with the chain off (MUSER_CHAIN=0), for a length, a stop string
 * (a burst cut back), ignore_eos; then a prompt extending the stopped
 * one's text reuses the slot's cached tokens and still matches (the
 * slot's record of its tokens stayed the session's); a cancel ends one. */
static void test_chain_alone(void) {
    muser_error err;
    srv_sched_params sp = {.n_slots = 2, .n_ctx = N_CTX, .prefill_chunk = 8};
    srv_sched *s = srv_sched_create(model, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) return;
    muser_sampling_params greedy = params(0, 1, 0), no_eos = greedy;
    no_eos.ignore_eos = true;
    static const struct { int prompt; int64_t n; const char *stop; bool no_eos; } cases[] = {
        {0, 40, NULL, false}, {7, 60, " the", false}, {1, 48, NULL, true}, {3, 1, NULL, false}, {5, 30, "of", false},
    };
    setenv("MUSER_CHAIN_BURST", "5", 1); /* bursts of 5 here, whatever this machine's speed */
    char last_prompt[2048] = "";
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const muser_sampling_params *smp = cases[c].no_eos ? &no_eos : &greedy;
        outcome want, got;
        int64_t want_pos;
        solo_run(PROMPTS[cases[c].prompt], smp, cases[c].n, cases[c].stop, true, &want, &want_pos);
        const char *stops[] = {cases[c].stop};
        srv_job_params p = {.req = {.text = PROMPTS[cases[c].prompt], .n_predict = cases[c].n, .stops = stops,
                                    .n_stops = cases[c].stop != NULL},
                            .sampling = *smp, .slot = 0, .cache_prompt = true};
        srv_refusal why;
        srv_job *j = srv_sched_submit(s, &p, &why, &err);
        CHECK_MSG(j, "submit: %s", err.msg);
        if (!j) continue;
        collect(j, &got);
        CHECK_MSG(same(&got, &want), "case %zu: %lld tokens '%s' (%s) against %lld '%s' (%s)", c, (long long)got.n,
                  got.text, mu_gen_stop_name(got.stop), (long long)want.n, want.text, mu_gen_stop_name(want.stop));
        if (c == 1) CHECK_MSG(got.stop == MU_GEN_STOP_STRING, "case %zu: stop %s", c, mu_gen_stop_name(got.stop));
        srv_slot_info si[2]; /* the slot holds what the loop of feeds left: no token past the stop */
        CHECK(srv_sched_slots(s, si, 2) == 2);
        CHECK_MSG(si[0].n_cached == want_pos, "case %zu: the slot holds %lld tokens, the solo session %lld", c,
                  (long long)si[0].n_cached, (long long)want_pos);
        if (c == 1) snprintf(last_prompt, sizeof last_prompt, "%s%s and", PROMPTS[cases[c].prompt], got.text);
        srv_job_free(j);
        if (c == 1) { /* the slot holds the stopped job's tokens: extend them */
            outcome w2, g2;
            solo_run(last_prompt, &greedy, 24, NULL, true, &w2, NULL);
            srv_job_params p2 = {.req = {.text = last_prompt, .n_predict = 24}, .sampling = greedy, .slot = 0,
                                 .cache_prompt = true};
            srv_job *j2 = srv_sched_submit(s, &p2, &why, &err);
            CHECK_MSG(j2, "submit: %s", err.msg);
            if (!j2) continue;
            collect(j2, &g2);
            CHECK_MSG(srv_job_cached(j2) > 8, "cached %lld", (long long)srv_job_cached(j2));
            CHECK_MSG(same(&g2, &w2), "after the stop: '%s' against '%s'", g2.text, w2.text);
            srv_job_free(j2);
        }
    }
    srv_stats st;
    srv_sched_stats(s, &st);
    CHECK_MSG(st.chain_tokens > 100, "%llu tokens on the chain", (unsigned long long)st.chain_tokens);
    /* a cancel in the middle of bursts */
    srv_job *j = submit(s, PROMPTS[2], &no_eos, 400);
    if (j) {
        cancel_after(j, 20);
        srv_job_free(j);
    }
    unsetenv("MUSER_CHAIN_BURST");
    srv_sched_free(s, true);
}

int main(void) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/models/glimmer-tiny-q4_k_xl.gguf", src ? src : ".");
    muser_error err;
    muser_model_params mp = {.n_threads = 2};
    model = muser_model_load(path, &mp, &err);
    CHECK_MSG(model, "%s", err.msg);
    if (!model) TEST_MAIN_END();
    test_batched_equals_solo(0);
    test_batched_equals_solo(4);
    test_queue_full();
    test_chain_alone();
    snprintf(path, sizeof path, "%s/models/glimmer-tiny-dflash-q4_k_xl.gguf", src ? src : ".");
    test_speculation(path);
    muser_model_free(model);
    TEST_MAIN_END();
}
