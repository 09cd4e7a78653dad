/* Continuous batching (sched.h): one thread, one engine, n_slots sessions.
 *
 * Locking: s->mu guards the waiting queue, the slots, every job's state and
 * event queue, and the statistics. The scheduler thread holds it except
 * during muser_engine_step (the forward), so HTTP threads can submit, read
 * events and cancel while a step runs; whatever they change is seen at the
 * next step. Each job has its own condition variable for its reader. */
#include "server/sched.h"
#include "backend/cpu/cpu_pool.h"
#include "spec/speculate.h"
#include "model/api_internal.h"
#include "util/common.h"
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ERR_CAST(e) ((mu_error *)(e))
#define SRV_PC_QUEUE 8 /* packs waiting for the prompt cache's writer ... */
#define SRV_PC_QUEUE_BYTES ((uint64_t)1 << 30) /* ... and their host memory (one pack alone may exceed it) */

const double srv_hist_bounds[SRV_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1,     2.5,  5,     10,  60};

typedef struct stored_event {
    srv_event_kind kind;
    int32_t token;
    int64_t index;
    char *text;
    size_t text_len;
    bool has_logprob;
    muser_logprob logprob;
    muser_logprob *top;
    int32_t n_top;
    mu_gen_stop stop;
} stored_event;

typedef enum job_state { JOB_WAITING, JOB_RUNNING, JOB_DONE } job_state;

struct srv_job {
    srv_sched *s;
    uint64_t id;
    int refs;                   /* the caller's and the scheduler's */
    job_state state;
    bool cancel;
    mu_gen *g;
    int32_t want_slot;          /* -1: any */
    bool cache_prompt;
    int32_t slot;
    int64_t cached;             /* prompt tokens reused from the slot */
    int64_t fed;                /* prompt tokens in the slot's KV */
    bool prompt_queued;         /* the current piece of the prompt is submitted */
    bool store_checked;         /* the prompt cache store was looked up for this job */
    bool token_queued;          /* `next` is submitted */
    int32_t next;               /* the token to feed next */
    uint32_t seed;
    double t_submit, t_last;    /* mu_now() */
    int64_t n_events;
    pthread_cond_t cond;
    stored_event *ev;           /* queue */
    size_t ev_head, ev_len, ev_cap;
    stored_event current;       /* handed to the reader (its memory lives until the next call) */
    srv_job *next_waiting;
};

typedef struct slot {
    muser_session *sess;
    muser_spec *sp;             /* with an assistant: its context follows every row of sess */
    srv_job *job;               /* NULL: idle */
    bool pinned;                /* idle, but a slot save or restore is using it (no job is admitted) */
    int32_t *toks;              /* tokens in the session's KV */
    int64_t n_toks, cap_toks;
} slot;

struct srv_sched {
    muser_model *m;
    muser_engine *e;
    srv_sched_params p;
    int64_t n_vocab;
    slot *slots;
    srv_job *wait_head, *wait_tail;
    int32_t n_waiting;
    uint64_t next_id;
    pthread_mutex_t mu;
    pthread_cond_t wake;        /* the scheduler: new work, a cancel, shutdown */
    pthread_t thread;
    bool stopping, finish;
    srv_stats st;
    /* --prompt-cache: the scheduler thread's store handle (lookups, restores, captures) and
     * the writer thread's, which publishes captured packs off the scheduler thread so a
     * write never delays a step; a bounded queue between them (a full one drops packs) */
    muser_kvstore *pc, *pc_w;
    pthread_t writer;
    pthread_cond_t pc_cond;
    muser_kvpack_image *pc_q[SRV_PC_QUEUE];
    int pc_len;
    uint64_t pc_bytes;          /* held by the queued packs */
    bool pc_stop, writer_started;
    /* take_rows: the jobs whose rows are drawn this step, and the threads drawing them */
    srv_job **ready;
    const float **ready_row;
    cpu_pool *draw_pool;        /* NULL: the scheduler thread draws alone */
    double chain_tok_s;         /* chain_burst's seconds per token so far (0: none yet) */
};

/* ------------------------------------------------------------------ events */

static void hist_add(srv_hist *h, double v) {
    int b = 0;
    while (b < SRV_HIST_BUCKETS && v > srv_hist_bounds[b]) b++;
    h->count[b]++;
    h->n++;
    h->sum += v;
}

static void push_event(srv_job *j, const stored_event *e) {
    if (j->ev_head + j->ev_len == j->ev_cap) {
        if (j->ev_head > 0) {
            memmove(j->ev, j->ev + j->ev_head, j->ev_len * sizeof *j->ev);
            j->ev_head = 0;
        } else {
            j->ev_cap = j->ev_cap * 2 + 16;
            j->ev = mu_xrealloc(j->ev, j->ev_cap * sizeof *j->ev);
        }
    }
    j->ev[j->ev_head + j->ev_len++] = *e;
    pthread_cond_broadcast(&j->cond);
}

static void free_event(stored_event *e) {
    free(e->text);
    free(e->top);
    memset(e, 0, sizeof *e);
}

/* mu_gen's callback, on the scheduler thread with s->mu held. */
static bool on_gen_event(void *user, const mu_gen_event *ev) {
    srv_job *j = user;
    srv_sched *s = j->s;
    stored_event e = {.kind = SRV_EV_TOKEN, .token = ev->token, .index = ev->index, .text_len = ev->text_len};
    if (ev->text_len) {
        e.text = mu_xmalloc(ev->text_len);
        memcpy(e.text, ev->text, ev->text_len);
    }
    if (ev->logprob) {
        e.has_logprob = true;
        e.logprob = *ev->logprob;
        e.n_top = ev->n_top;
        if (ev->n_top > 0) {
            e.top = mu_xmalloc((size_t)ev->n_top * sizeof *e.top);
            memcpy(e.top, ev->top, (size_t)ev->n_top * sizeof *e.top);
        }
    }
    if (ev->token >= 0) {
        const double now = mu_now();
        if (j->n_events++ == 0) hist_add(&s->st.ttft, now - j->t_submit);
        else hist_add(&s->st.itl, now - j->t_last);
        j->t_last = now;
        s->st.generation_tokens_total++;
    }
    push_event(j, &e);
    return !j->cancel;
}

/* ------------------------------------------------------------------ jobs */

static void job_unref(srv_job *j) {
    if (--j->refs > 0) return;
    for (size_t i = 0; i < j->ev_len; i++) free_event(&j->ev[j->ev_head + i]);
    free(j->ev);
    free_event(&j->current);
    mu_gen_free(j->g);
    pthread_cond_destroy(&j->cond);
    free(j);
}

/* The job ends (with s->mu held): the DONE event, statistics, the slot. */
static void finish_job(srv_sched *s, srv_job *j) {
    const mu_gen_result *r = mu_gen_get_result(j->g);
    j->state = JOB_DONE;
    push_event(j, &(stored_event){.kind = SRV_EV_DONE, .token = -1, .stop = r->stop});
    hist_add(&s->st.e2e, mu_now() - j->t_submit);
    if (r->stop == MU_GEN_STOP_CANCELLED) s->st.requests_cancelled++;
    else s->st.requests_finished++;
    if (j->slot >= 0 && s->slots[j->slot].job == j) s->slots[j->slot].job = NULL;
    job_unref(j);
}

static void slot_push_tokens(slot *sl, const int32_t *t, int64_t n) {
    if (sl->n_toks + n > sl->cap_toks) {
        sl->cap_toks = (sl->n_toks + n) * 2 + 64;
        sl->toks = mu_xrealloc(sl->toks, (size_t)sl->cap_toks * sizeof *sl->toks);
    }
    memcpy(sl->toks + sl->n_toks, t, (size_t)n * sizeof *t);
    sl->n_toks += n;
}

/* Forget the slot's KV (and its assistant's context). */
static void slot_reset(slot *sl) {
    if (sl->sp) muser_spec_reset(sl->sp);
    else muser_session_reset(sl->sess);
    sl->n_toks = 0;
}

/* End a job with an error; its slot's KV is no longer what its record says. */
static void fail_job(srv_sched *s, slot *sl, srv_job *j, const char *msg) {
    mu_gen_finish(j->g, MU_GEN_STOP_ERROR, msg);
    slot_reset(sl);
    finish_job(s, j);
}

static int64_t common_prefix(const slot *sl, const int32_t *p, int64_t n) {
    int64_t k = 0;
    while (k < sl->n_toks && k < n && sl->toks[k] == p[k]) k++;
    return k;
}

/* Put job j into slot i: keep the longest usable cached prefix (at least
 * one prompt token is always fed, for its logits row). */
static void admit(srv_sched *s, srv_job *j, int32_t i) {
    slot *sl = &s->slots[i];
    int64_t n_prompt;
    const int32_t *prompt = mu_gen_prompt(j->g, &n_prompt);
    int64_t keep = j->cache_prompt ? common_prefix(sl, prompt, n_prompt) : 0;
    if (keep >= n_prompt) keep = n_prompt - 1;
    /* the KV may hold more than sl->toks says: rows of a cancelled input
     * that had already run. An assistant's context cannot be cut back, so
     * with one only an exact extension of the cached tokens is reused. */
    if (keep < muser_session_pos(sl->sess) && (sl->sp || !muser_session_truncate(sl->sess, keep, NULL))) keep = 0;
    if (keep == 0) slot_reset(sl);
    sl->n_toks = keep;
    sl->job = j;
    j->slot = i;
    j->state = JOB_RUNNING;
    j->cached = j->fed = keep;
    s->st.cached_tokens_total += (uint64_t)keep;
    s->st.prompt_tokens_total += (uint64_t)n_prompt;
}

/* A free slot for j: its own when it asked for one, else the free slot
 * sharing the longest prefix with its prompt (the emptiest on ties). */
static int32_t pick_slot(const srv_sched *s, const srv_job *j) {
    if (j->want_slot >= 0) return s->slots[j->want_slot].job || s->slots[j->want_slot].pinned ? -1 : j->want_slot;
    int64_t n_prompt;
    const int32_t *prompt = mu_gen_prompt(j->g, &n_prompt);
    int32_t best = -1;
    int64_t best_common = -1, best_len = 0;
    for (int32_t i = 0; i < s->p.n_slots; i++) {
        const slot *sl = &s->slots[i];
        if (sl->job || sl->pinned) continue;
        const int64_t c = j->cache_prompt ? common_prefix(sl, prompt, n_prompt) : 0;
        if (c > best_common || (c == best_common && sl->n_toks < best_len)) {
            best = i;
            best_common = c;
            best_len = sl->n_toks;
        }
    }
    return best;
}

static void admit_waiting(srv_sched *s) {
    srv_job **pp = &s->wait_head, *prev = NULL;
    while (*pp) {
        srv_job *j = *pp;
        const int32_t i = j->cancel ? -1 : pick_slot(s, j);
        if (!j->cancel && i < 0) {
            prev = j;
            pp = &j->next_waiting;
            continue;
        }
        *pp = j->next_waiting;
        if (s->wait_tail == j) s->wait_tail = prev;
        s->n_waiting--;
        j->next_waiting = NULL;
        if (j->cancel) {
            mu_gen_finish(j->g, MU_GEN_STOP_CANCELLED, NULL);
            finish_job(s, j);
        } else {
            admit(s, j, i);
        }
    }
}

static void add_spec_stats(srv_sched *s, const muser_spec_stats *a, const muser_spec_stats *b) {
    s->st.spec_drafted += (uint64_t)(b->drafted - a->drafted);
    s->st.spec_accepted += (uint64_t)(b->accepted - a->accepted);
}

/* A job alone on the server decodes speculatively: muser_spec_next feeds
 * the pending token (and verifies proposals) itself, outside the step. The
 * lock is released meanwhile; the job's reference keeps it alive. */
static void speculate(srv_sched *s, slot *sl, srv_job *j) {
    int32_t out[MU_GEN_MAX_DRAW];
    const float *rows[MU_GEN_MAX_DRAW];
    const int32_t pending = j->next;
    muser_spec_stats before, after;
    muser_spec_get_stats(sl->sp, &before);
    muser_error err = {{0}};
    pthread_mutex_unlock(&s->mu);
    const float **want = mu_gen_needs_rows(j->g) ? rows : NULL; /* none: the rows may stay on the backend */
    const int n = muser_spec_next(sl->sp, pending, mu_gen_sampler(j->g), mu_gen_max_draw(j->g), out, want, &err);
    pthread_mutex_lock(&s->mu);
    if (n < 0) {
        fail_job(s, sl, j, err.msg);
        return;
    }
    muser_spec_get_stats(sl->sp, &after);
    add_spec_stats(s, &before, &after);
    slot_push_tokens(sl, &pending, 1); /* fed: the pending token and every drawn token but the last */
    if (n > 1) slot_push_tokens(sl, out, n - 1);
    const mu_gen_stop st = j->cancel ? MU_GEN_STOP_CANCELLED : mu_gen_take_drawn(j->g, out, want, n, &j->next);
    if (j->cancel) mu_gen_finish(j->g, MU_GEN_STOP_CANCELLED, NULL);
    if (st != MU_GEN_RUNNING) finish_job(s, j);
}

/* A greedy job alone on the server (no assistant) decodes on the greedy
 * chain (docs/cuda.md "The greedy chain"): a burst of tokens outside the
 * step, without s->mu. Its events need s->mu, which the chain's next()
 * must not take (the engine's lock is held there, and other threads take
 * s->mu before the engine's lock), so next() only records the picks
 * (drawing from a row itself where the chain hands one back) and they are
 * taken afterwards; a stop among them cuts the session back to its row. A
 * burst lasts about CHAIN_BURST_S, so a new job, a cancel or a stop string
 * waits no longer than that, and at most that much work past a stop is
 * dropped. */
#define CHAIN_BURST_S 0.002
#define CHAIN_BURST_MAX 16 /* a stop truncates at most this far back: within every ring's slack (kv.h) */

typedef struct burst {
    muser_sampler *smp;
    int32_t tok[CHAIN_BURST_MAX];
    int n;
} burst;

static int32_t burst_next(void *user, int32_t tok, const float *row) {
    burst *b = user;
    if (!row && muser_sampler_bans(b->smp, tok)) return MUSER_CHAIN_ROW;
    if (row) {
        muser_error err;
        tok = muser_sampler_sample(b->smp, row, &err); /* an argmax sampler: no state moves */
        if (tok < 0) return -1; /* the row goes through mu_gen_take_row again, for its error */
    }
    b->tok[b->n++] = tok;
    return b->n < CHAIN_BURST_MAX ? tok : -1;
}

/* The burst's length: at most the tokens left to draw (the last draw ends
 * the job at once), and about CHAIN_BURST_S of forwards; 0 where a burst
 * would not pay.
 * MUSER_CHAIN_BURST=N sets N (tests: the same bursts on any machine). */
static int64_t burst_len(const srv_sched *s, const srv_job *j) {
    const char *e = getenv("MUSER_CHAIN_BURST");
    int64_t n = e && *e ? strtoll(e, NULL, 10) : s->chain_tok_s > 0 ? (int64_t)(CHAIN_BURST_S / s->chain_tok_s) : 4;
    if (n > CHAIN_BURST_MAX) n = CHAIN_BURST_MAX;
    const int64_t left = mu_gen_left(j->g);
    if (left >= 0 && left < n) n = left;
    return n >= 2 ? n : 0;
}

static void chain_burst(srv_sched *s, slot *sl, srv_job *j, int64_t max_feed) {
    burst b = {.smp = mu_gen_sampler(j->g)};
    const int64_t pos0 = muser_session_pos(sl->sess);
    const int32_t first = j->next;
    muser_error err = {{0}};
    pthread_mutex_unlock(&s->mu);
    const double t0 = mu_now();
    const int64_t calls = muser_session_decode_chain(sl->sess, first, max_feed, burst_next, &b, &err);
    const double dt = mu_now() - t0;
    pthread_mutex_lock(&s->mu);
    if (calls < 0) {
        fail_job(s, sl, j, err.msg);
        return;
    }
    if (calls > 0) s->chain_tok_s = s->chain_tok_s > 0 ? 0.8 * s->chain_tok_s + 0.2 * dt / (double)calls : dt / (double)calls;
    const int64_t fed = muser_session_pos(sl->sess) - pos0; /* first, then b.tok[0 .. fed - 1) */
    s->st.steps_total += (uint64_t)calls; /* a forward a row: /metrics' steps stay forwards */
    s->st.step_seconds += dt;
    slot_push_tokens(sl, &first, fed > 0 ? 1 : 0);
    if (fed > 1) slot_push_tokens(sl, b.tok, fed - 1);
    mu_gen_stop st = MU_GEN_RUNNING;
    int i = 0;
    while (i < b.n && st == MU_GEN_RUNNING && !j->cancel) st = mu_gen_take_picked(j->g, b.tok[i++], &j->next);
    s->st.chain_tokens += (uint64_t)i;
    /* the session keeps the tokens up to the last row taken; a fed token whose row was not taken is pending again */
    const int64_t keep = pos0 + (i < fed ? i : fed);
    if (muser_session_pos(sl->sess) > keep) {
        if (!muser_session_truncate(sl->sess, keep, &err)) {
            fail_job(s, sl, j, err.msg);
            return;
        }
        sl->n_toks -= pos0 + fed - keep;
    }
    if (j->cancel && st == MU_GEN_RUNNING) {
        mu_gen_finish(j->g, MU_GEN_STOP_CANCELLED, NULL);
        st = MU_GEN_STOP_CANCELLED;
    }
    if (st != MU_GEN_RUNNING) finish_job(s, j);
}

/* ------------------------------------------------------------------ prompt cache store */

/* The slot's session holds a prefilled piece of a prompt with its logits
 * row: copy its pack out (under the engine's lock, a copy of the rows) for
 * the writer thread. With s->mu held, on the scheduler thread. */
static void pc_capture(srv_sched *s, slot *sl) {
    if (s->pc_len == SRV_PC_QUEUE) { /* the cache is best effort: never wait for the disk */
        s->st.store_dropped++;
        return;
    }
    char id[65];
    bool existed = false;
    muser_error err = {{0}};
    muser_kvpack_image *im = muser_kvstore_capture(s->pc, sl->sess, NULL, id, &existed, &err);
    if (!im) {
        if (!existed) {
            s->st.store_errors++;
            fprintf(stderr, "muser serve: prompt cache: %s\n", err.msg);
        }
        return;
    }
    const uint64_t bytes = muser_kvpack_image_bytes(im);
    if (s->pc_len && s->pc_bytes + bytes > SRV_PC_QUEUE_BYTES) {
        muser_kvpack_image_free(im);
        s->st.store_dropped++;
        return;
    }
    s->pc_bytes += bytes;
    s->pc_q[s->pc_len++] = im;
    pthread_cond_signal(&s->pc_cond);
}

/* Publishes captured packs until the scheduler is gone and the queue is empty. */
static void *writer_main(void *arg) {
    srv_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->pc_len && !s->pc_stop) pthread_cond_wait(&s->pc_cond, &s->mu);
        if (!s->pc_len) break;
        muser_kvpack_image *im = s->pc_q[0];
        memmove(s->pc_q, s->pc_q + 1, (size_t)--s->pc_len * sizeof *s->pc_q);
        const uint64_t bytes = muser_kvpack_image_bytes(im);
        pthread_mutex_unlock(&s->mu);
        muser_error err = {{0}};
        bool existed = false;
        const bool ok = muser_kvstore_publish(s->pc_w, im, &existed, &err);
        if (!ok) fprintf(stderr, "muser serve: prompt cache: %s\n", err.msg);
        pthread_mutex_lock(&s->mu);
        s->pc_bytes -= bytes;
        if (!ok) s->st.store_errors++;
        else if (!existed) s->st.store_written++;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* A job about to prefill in slot sl: restore the longest stored prefix of
 * its prompt when that is longer than what the slot holds already. s->mu
 * is released meanwhile (the job holds the slot; only this thread uses
 * s->pc). A refused pack leaves the slot as it was (counted, logged). An
 * exact hit has the prompt's logits row: the job draws from it at once.
 * False when the job ended. */
static bool store_restore(srv_sched *s, slot *sl, srv_job *j) {
    int64_t n_prompt;
    const int32_t *prompt = mu_gen_prompt(j->g, &n_prompt);
    char id[65];
    muser_error err = {{0}};
    const int64_t have = j->fed;
    pthread_mutex_unlock(&s->mu);
    const int64_t k = muser_kvstore_lookup_for(s->pc, sl->sess, prompt, n_prompt, id);
    const bool ok = k > have && muser_kvstore_restore(s->pc, id, sl->sess, NULL, &err);
    pthread_mutex_lock(&s->mu);
    if (k > have && !ok) {
        s->st.store_errors++;
        fprintf(stderr, "muser serve: prompt cache: %s\n", err.msg);
    }
    if (!ok) return true;
    sl->n_toks = 0;
    slot_push_tokens(sl, prompt, k);
    s->st.cached_tokens_total += (uint64_t)(k - j->cached);
    s->st.store_hits++;
    s->st.store_tokens += (uint64_t)k;
    j->cached = j->fed = k;
    if (k < n_prompt) return true;
    mu_gen_prefilled(j->g, 0);
    j->prompt_queued = true; /* nothing left to feed */
    const mu_gen_stop st = j->cancel ? MU_GEN_STOP_CANCELLED
                                     : mu_gen_take_row(j->g, muser_session_logits(sl->sess), &j->next);
    if (j->cancel) mu_gen_finish(j->g, MU_GEN_STOP_CANCELLED, NULL);
    if (st == MU_GEN_RUNNING) return true;
    finish_job(s, j);
    return false;
}

/* Queue each running slot's next input (or, for a job alone with an
 * assistant, speculate: *progress); end cancelled jobs and jobs with no
 * room left. Returns the slots with queued input. */
static int32_t queue_inputs(srv_sched *s, bool *progress) {
    int32_t active = 0, running = 0;
    *progress = false;
    for (int32_t i = 0; i < s->p.n_slots; i++) running += s->slots[i].job != NULL;
    const bool alone = running == 1 && s->n_waiting == 0;
    for (int32_t i = 0; i < s->p.n_slots; i++) {
        slot *sl = &s->slots[i];
        srv_job *j = sl->job;
        if (j && j->cancel) { /* at once, even in the middle of a prompt */
            muser_session_cancel_queued(sl->sess);
            if (sl->sp) slot_reset(sl); /* rows that ran never reached the assistant */
            mu_gen_finish(j->g, MU_GEN_STOP_CANCELLED, NULL);
            finish_job(s, j);
            continue;
        }
        if (!j || muser_session_queued(sl->sess) > 0) {
            active += j != NULL;
            continue;
        }
        muser_error err;
        int64_t n_prompt;
        const int32_t *prompt = mu_gen_prompt(j->g, &n_prompt);
        bool ok = true;
        if (!j->store_checked && s->pc && j->cache_prompt) {
            j->store_checked = true;
            if (!store_restore(s, sl, j)) continue;
        }
        if (!j->prompt_queued) {
            /* with a store, the prompt stops first at its last multiple of 256 (the packs a
             * longer prompt sharing this prefix can find: docs/kvpack.md, "Prompt cache") */
            int64_t end = n_prompt;
            const int64_t b = n_prompt / 256 * 256;
            if (s->pc && j->cache_prompt && b > j->fed && b < n_prompt) end = b;
            ok = muser_session_submit_prompt(sl->sess, prompt + j->fed, end - j->fed, NULL, &err);
            j->prompt_queued = ok;
        } else if (!j->token_queued) {
            if (muser_session_pos(sl->sess) >= muser_session_n_ctx(sl->sess)) {
                mu_gen_finish(j->g, MU_GEN_STOP_CONTEXT, NULL);
                finish_job(s, j);
                continue;
            }
            if (sl->sp && alone && !j->cancel) {
                speculate(s, sl, j);
                *progress = true;
                continue;
            }
            const int64_t burst = !sl->sp && alone && !j->cancel && mu_gen_can_chain(j->g, sl->sess) ? burst_len(s, j) : 0;
            if (burst) {
                chain_burst(s, sl, j, burst);
                *progress = true;
                continue;
            }
            ok = muser_session_submit(sl->sess, &j->next, 1, NULL, &err);
            j->token_queued = ok;
        }
        if (!ok) {
            mu_gen_finish(j->g, MU_GEN_STOP_ERROR, err.msg);
            finish_job(s, j);
            continue;
        }
        active++;
    }
    return active;
}

static void draw_task(void *arg, int64_t k, int thread) {
    (void)thread;
    srv_sched *s = arg;
    mu_gen_draw(s->ready[k]->g, s->ready_row[k]);
}

/* After a step: hand every completed input's logits row to its job. The
 * jobs' draws (the sampler chains over their rows) come first, on the draw
 * pool when there are several: each touches only its own job's sampler
 * (gen.h mu_gen_draw), so the tokens are those of drawing one job after
 * another; then each job takes its row in slot order (detokenizing, stop
 * strings, events). */
static void take_rows(srv_sched *s) {
    int32_t n_ready = 0;
    for (int32_t i = 0; i < s->p.n_slots; i++) {
        slot *sl = &s->slots[i];
        srv_job *j = sl->job;
        if (!j || muser_session_queued(sl->sess) > 0 || !(j->prompt_queued || j->token_queued)) continue;
        if (muser_session_error(sl->sess)[0]) {
            fail_job(s, sl, j, muser_session_error(sl->sess));
            continue;
        }
        const float *row = muser_session_logits(sl->sess);
        if (!row) continue; /* not this slot's step */
        int64_t n_rows, n_prompt = 0;
        bool prompt_rows = false;
        if (j->token_queued) {
            slot_push_tokens(sl, &j->next, 1);
            j->token_queued = false;
            n_rows = 1;
        } else if (j->fed < muser_session_pos(sl->sess)) { /* a piece of the prompt, or its rest */
            const int32_t *prompt = mu_gen_prompt(j->g, &n_prompt);
            n_rows = muser_session_pos(sl->sess) - j->fed;
            slot_push_tokens(sl, prompt + j->fed, n_rows);
            j->fed += n_rows;
            prompt_rows = true;
        } else {
            continue;
        }
        mu_error serr;
        if (sl->sp && !mu_spec_take_fed(sl->sp, n_rows, &serr)) {
            fail_job(s, sl, j, serr.msg);
            continue;
        }
        if (prompt_rows) {
            if (s->pc && j->cache_prompt) pc_capture(s, sl); /* after the assistant took the rows */
            if (j->fed < n_prompt) { /* a block-aligned piece: queue_inputs submits the rest */
                j->prompt_queued = false;
                continue;
            }
            mu_gen_prefilled(j->g, n_prompt - j->cached);
        }
        if (j->cancel) {
            mu_gen_finish(j->g, MU_GEN_STOP_CANCELLED, NULL);
            finish_job(s, j);
            continue;
        }
        s->ready[n_ready] = j;
        s->ready_row[n_ready++] = row;
    }
    if (s->draw_pool && n_ready > 1) cpu_pool_run(s->draw_pool, draw_task, s, n_ready);
    for (int32_t k = 0; k < n_ready; k++) {
        srv_job *j = s->ready[k];
        if (mu_gen_take_row(j->g, s->ready_row[k], &j->next) != MU_GEN_RUNNING) finish_job(s, j);
    }
}

static void *sched_main(void *arg) {
    srv_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stopping && !s->finish) { /* cancel everything */
            for (srv_job *j = s->wait_head; j; j = j->next_waiting) j->cancel = true;
            for (int32_t i = 0; i < s->p.n_slots; i++)
                if (s->slots[i].job) s->slots[i].job->cancel = true;
        }
        admit_waiting(s);
        bool progress;
        const int32_t active = queue_inputs(s, &progress);
        if (!active && progress) continue;
        if (!active) {
            if (s->stopping && !s->n_waiting) break;
            pthread_cond_wait(&s->wake, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        muser_error err = {{0}};
        const double t0 = mu_now();
        const int32_t rc = muser_engine_step(s->e, NULL, &err);
        const double t1 = mu_now();
        pthread_mutex_lock(&s->mu);
        s->st.steps_total++;
        (void)rc; /* a failed forward poisons the sessions in it: take_rows ends their jobs */
        take_rows(s);
        s->st.step_seconds += t1 - t0;
        s->st.take_seconds += mu_now() - t1;
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ------------------------------------------------------------------ public */

/* The prompt-cache writer publishes what is queued, then ends. */
static void writer_stop(srv_sched *s) {
    if (!s->writer_started) return;
    pthread_mutex_lock(&s->mu);
    s->pc_stop = true;
    pthread_cond_signal(&s->pc_cond);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->writer, NULL);
    s->writer_started = false;
}

/* srv_sched's creation failed after the slots exist: undo it all (the
 * writer, when it started, finishes first). */
static srv_sched *create_failed(srv_sched *s, muser_engine *e) {
    writer_stop(s);
    cpu_pool_destroy(s->draw_pool);
    free(s->ready);
    free(s->ready_row);
    muser_kvstore_close(s->pc);
    muser_kvstore_close(s->pc_w);
    for (int32_t i = 0; i < s->p.n_slots; i++) muser_spec_free(s->slots[i].sp);
    muser_engine_free(e);
    free(s->slots);
    free(s);
    return NULL;
}

/* Threads drawing the slots' tokens: draw_threads when set; else, on the
 * GPU with rows of at least 64 Ki logits, one per slot up to the cores (at
 * most 8): the host's cores are idle during the forward, and a step of 8
 * slots otherwise waits for 8 sampler chains over 202,048 logits one after
 * another (0.06-0.08 ms each on a Zen 5, docs/sampling.md). Shorter rows
 * (glimmer-tiny's 8,192) draw in microseconds, less than waking a thread.
 * On the CPU backends the scheduler thread draws alone: the cores are the
 * forward's, and the pool's workers spin a while after each batch. */
static int32_t draw_pool_size(const srv_sched_params *p, const char *backend, int64_t n_vocab) {
    if (p->draw_threads > 0) return p->draw_threads < p->n_slots ? p->draw_threads : p->n_slots;
    if (!backend || strcmp(backend, "cuda") || n_vocab < 65536) return 1;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int32_t n = p->n_slots < 8 ? p->n_slots : 8;
    if (cores >= 1 && n > cores) n = (int32_t)cores;
    return n;
}

srv_sched *srv_sched_create(muser_model *m, const srv_sched_params *params, muser_error *err) {
    srv_sched_params p = params ? *params : (srv_sched_params){0};
    if (p.n_slots <= 0) p.n_slots = 4;
    if (p.max_queue <= 0) p.max_queue = 64;
    if (p.n_batch <= 0) p.n_batch = 512;
    if (p.prefill_chunk <= 0) p.prefill_chunk = 256;
    if (p.prefill_chunk > p.n_batch) p.prefill_chunk = p.n_batch;
    if (p.prefill_budget < 0 || p.prefill_budget > p.n_batch) p.prefill_budget = p.n_batch;
    muser_engine_params ep = {.n_seq_max = p.n_slots, .n_ctx = p.n_ctx, .n_batch = p.n_batch,
                              .prefill_chunk = p.prefill_chunk, .prefill_budget = p.prefill_budget};
    muser_engine *e = muser_engine_create(m, &ep, err);
    if (!e) return NULL;
    srv_sched *s = mu_xcalloc(1, sizeof *s);
    s->m = m;
    s->e = e;
    s->slots = mu_xcalloc((size_t)p.n_slots, sizeof *s->slots);
    for (int32_t i = 0; i < p.n_slots; i++) {
        s->slots[i].sess = muser_engine_session(e, err);
        const muser_spec_params spp = {.verify_len = p.verify_len, .no_gate = p.spec_always, .tree = p.spec_tree};
        if (s->slots[i].sess && p.draft && !(s->slots[i].sp = muser_spec_create(s->slots[i].sess, p.draft, &spp, err))) {
            for (int32_t k = 0; k < i; k++) muser_spec_free(s->slots[k].sp);
            s->slots[i].sess = NULL;
        }
        if (!s->slots[i].sess) {
            muser_engine_free(e);
            free(s->slots);
            free(s);
            return NULL;
        }
    }
    muser_model_info info;
    muser_model_get_info(m, &info);
    s->n_vocab = info.n_vocab;
    s->ready = mu_xcalloc((size_t)p.n_slots, sizeof *s->ready);
    s->ready_row = mu_xcalloc((size_t)p.n_slots, sizeof *s->ready_row);
    const int32_t nd = draw_pool_size(&p, info.backend, info.n_vocab);
    if (nd > 1 && !(s->draw_pool = cpu_pool_create(nd))) {
        mu_err_set(ERR_CAST(err), "scheduler: cannot start %d drawing threads", nd);
        return create_failed(s, e);
    }
    if (!p.n_ctx) p.n_ctx = muser_session_n_ctx(s->slots[0].sess);
    s->p = p;
    s->st.n_slots = p.n_slots;
    s->st.n_ctx = p.n_ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->pc_cond, NULL);
    if (p.prompt_cache) {
        if (!(s->pc = muser_kvstore_open(m, p.prompt_cache, NULL, err)) ||
            !(s->pc_w = muser_kvstore_open(m, p.prompt_cache, NULL, err)) ||
            !muser_kvstore_set_compression(s->pc_w, p.zstd_level, err))
            return create_failed(s, e);
        muser_kvstore_set_quota(s->pc_w, p.prompt_cache_quota);
        if (pthread_create(&s->writer, NULL, writer_main, s) != 0) {
            mu_err_set(ERR_CAST(err), "prompt cache: cannot start its writer thread: %s", strerror(errno));
            return create_failed(s, e);
        }
        s->writer_started = true;
    }
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        mu_err_set(ERR_CAST(err), "scheduler: cannot start its thread: %s", strerror(errno));
        return create_failed(s, e);
    }
    return s;
}

void srv_sched_free(srv_sched *s, bool finish) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    s->finish = finish;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu); /* a slot save or restore still running uses its session */
    for (int32_t i = 0; i < s->p.n_slots; i++)
        while (s->slots[i].pinned) pthread_cond_wait(&s->wake, &s->mu);
    pthread_mutex_unlock(&s->mu);
    writer_stop(s);
    muser_kvstore_close(s->pc);
    muser_kvstore_close(s->pc_w);
    pthread_cond_destroy(&s->pc_cond);
    for (int32_t i = 0; i < s->p.n_slots; i++) {
        muser_spec_free(s->slots[i].sp);
        free(s->slots[i].toks);
    }
    muser_engine_free(s->e);
    cpu_pool_destroy(s->draw_pool);
    free(s->ready);
    free(s->ready_row);
    free(s->slots);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    free(s);
}

srv_job *srv_sched_submit(srv_sched *s, const srv_job_params *p, srv_refusal *refusal, muser_error *err) {
    srv_refusal dummy;
    if (!refusal) refusal = &dummy;
    *refusal = SRV_REFUSED_INVALID;
    if (p->slot < -1 || p->slot >= s->p.n_slots) {
        mu_err_set(ERR_CAST(err), "id_slot %d: the server has slots 0 to %d", p->slot, s->p.n_slots - 1);
        return NULL;
    }
    mu_gen *g = mu_gen_new(s->m, &p->sampling, err);
    if (!g) return NULL;
    srv_job *j = mu_xcalloc(1, sizeof *j);
    j->s = s;
    j->g = g;
    j->refs = 2;
    j->want_slot = p->slot;
    j->slot = -1;
    j->cache_prompt = p->cache_prompt;
    pthread_cond_init(&j->cond, NULL);
    if (!mu_gen_start(g, &p->req, on_gen_event, j, err)) {
        j->refs = 1;
        job_unref(j);
        return NULL;
    }
    int64_t n_prompt;
    mu_gen_prompt(g, &n_prompt);
    if (n_prompt < 1 || n_prompt >= s->p.n_ctx) {
        mu_err_set(ERR_CAST(err), n_prompt < 1 ? "the prompt is empty"
                                               : "the prompt is %lld tokens; the context of a slot holds %lld (one more "
                                                 "is needed for the first generated token)",
                   (long long)n_prompt, (long long)s->p.n_ctx - 1);
        j->refs = 1;
        job_unref(j);
        return NULL;
    }
    j->seed = muser_sampler_seed(mu_gen_sampler(g));
    pthread_mutex_lock(&s->mu);
    /* Jobs the scheduler thread has not yet moved into free slots are not waiting for
     * a slot: without counting those slots, a burst at an idle server got 429s while
     * slots were free (the thread may be inside a step when the burst arrives). */
    int32_t free_slots = 0;
    for (int32_t i = 0; i < s->p.n_slots; i++) free_slots += !s->slots[i].job;
    if (s->stopping || s->n_waiting >= s->p.max_queue + free_slots) {
        const bool stopping = s->stopping;
        s->st.requests_refused++;
        pthread_mutex_unlock(&s->mu);
        *refusal = stopping ? SRV_REFUSED_SHUTDOWN : SRV_REFUSED_BUSY;
        mu_err_set(ERR_CAST(err), stopping ? "the server is shutting down"
                                           : "%d requests are already waiting for a slot; retry later",
                   s->p.max_queue);
        j->refs = 1;
        job_unref(j);
        return NULL;
    }
    j->id = ++s->next_id;
    j->t_submit = mu_now();
    if (s->wait_tail) s->wait_tail->next_waiting = j;
    else s->wait_head = j;
    s->wait_tail = j;
    s->n_waiting++;
    s->st.requests_total++;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    return j;
}

static bool wait_until(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *deadline) {
    return deadline ? pthread_cond_timedwait(c, m, deadline) != ETIMEDOUT : (pthread_cond_wait(c, m), true);
}

bool srv_job_next(srv_job *j, srv_event *ev, int timeout_ms) {
    srv_sched *s = j->s;
    struct timespec deadline;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&s->mu);
    while (j->ev_len == 0 && j->current.kind != SRV_EV_DONE) {
        if (!wait_until(&j->cond, &s->mu, timeout_ms >= 0 ? &deadline : NULL) && j->ev_len == 0) {
            pthread_mutex_unlock(&s->mu);
            return false;
        }
    }
    if (j->ev_len > 0) {
        free_event(&j->current);
        j->current = j->ev[j->ev_head++];
        j->ev_len--;
    }
    const stored_event *c = &j->current;
    *ev = (srv_event){.kind = c->kind, .token = c->token, .index = c->index, .text = c->text,
                      .text_len = c->text_len, .has_logprob = c->has_logprob, .logprob = c->logprob, .top = c->top,
                      .n_top = c->n_top, .stop = c->stop};
    pthread_mutex_unlock(&s->mu);
    return true;
}

void srv_job_cancel(srv_job *j) {
    srv_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (j->state != JOB_DONE) {
        j->cancel = true;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
}

const mu_gen_result *srv_job_result(const srv_job *j) { return mu_gen_get_result(j->g); }
int64_t srv_job_cached(const srv_job *j) { return j->cached; }
int32_t srv_job_slot(const srv_job *j) { return j->slot; }
uint32_t srv_job_seed(const srv_job *j) { return j->seed; }

void srv_job_free(srv_job *j) {
    if (!j) return;
    srv_sched *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (j->state != JOB_DONE) {
        j->cancel = true;
        pthread_cond_signal(&s->wake);
    }
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
}

void srv_sched_stats(srv_sched *s, srv_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->st;
    st->waiting = s->n_waiting;
    st->running = 0;
    int64_t held = 0;
    for (int32_t i = 0; i < s->p.n_slots; i++) {
        st->running += s->slots[i].job != NULL;
        held += muser_session_pos(s->slots[i].sess);
    }
    st->kv_usage = (double)held / ((double)s->p.n_slots * (double)s->p.n_ctx);
    pthread_mutex_unlock(&s->mu);
}

int32_t srv_sched_slots(srv_sched *s, srv_slot_info *out, int32_t cap) {
    pthread_mutex_lock(&s->mu);
    for (int32_t i = 0; i < s->p.n_slots && i < cap; i++) {
        const slot *sl = &s->slots[i];
        const srv_job *j = sl->job;
        int64_t n_prompt = 0;
        if (j) mu_gen_prompt(j->g, &n_prompt);
        out[i] = (srv_slot_info){.id = i, .busy = j != NULL, .n_ctx = s->p.n_ctx,
                                 .n_cached = muser_session_pos(sl->sess), .n_prompt = n_prompt,
                                 .n_decoded = j ? mu_gen_get_result(j->g)->n_tokens : 0, .job_id = j ? j->id : 0};
    }
    const int32_t n = s->p.n_slots;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* An idle slot i, pinned for a save or restore: the scheduler admits no
 * job into it, so s->mu need not be held while the file is written or
 * read and checked (the steps of the other slots go on meanwhile; the
 * save holds the engine's lock only to copy the rows out). Unpin after. */
static slot *pin_slot(srv_sched *s, int32_t i, muser_error *err) {
    if (i < 0 || i >= s->p.n_slots) {
        mu_err_set(ERR_CAST(err), "slot %d: the server has slots 0 to %d", i, s->p.n_slots - 1);
        return NULL;
    }
    pthread_mutex_lock(&s->mu);
    slot *sl = &s->slots[i];
    if (sl->job || sl->pinned) {
        const bool pinned = sl->pinned;
        pthread_mutex_unlock(&s->mu);
        mu_err_set(ERR_CAST(err), "slot %d is running a request%s", i, pinned ? " (a slot save or restore)" : "");
        return NULL;
    }
    sl->pinned = true;
    pthread_mutex_unlock(&s->mu);
    return sl;
}

static void unpin_slot(srv_sched *s, slot *sl) {
    pthread_mutex_lock(&s->mu);
    sl->pinned = false;
    pthread_cond_broadcast(&s->wake); /* a job may wait for this slot, or srv_sched_free for the save */
    pthread_mutex_unlock(&s->mu);
}

bool srv_sched_slot_save(srv_sched *s, int32_t i, const char *dir, const char *name, int64_t *n, uint64_t *bytes,
                         muser_error *err) {
    slot *sl = pin_slot(s, i, err);
    if (!sl) return false;
    *n = sl->n_toks;
    bool ok = sl->n_toks > 0 && muser_session_pos(sl->sess) == sl->n_toks;
    if (!ok) mu_err_set(ERR_CAST(err), "slot %d holds no finished prompt to save", i);
    /* a request decoded on the greedy chain (chain_burst) left its last row on the backend: the
     * pack needs it on the host, so the last token is fed again (the same bits: docs/numerics.md).
     * Never under an assistant: such a slot does not take the chain. */
    if (ok && !muser_session_logits(sl->sess))
        ok = muser_session_truncate(sl->sess, sl->n_toks - 1, err) &&
             muser_session_feed(sl->sess, &sl->toks[sl->n_toks - 1], 1, err);
    ok = ok && muser_kvpack_save_file(sl->sess, NULL, dir, name, NULL, s->p.zstd_level, bytes, err);
    unpin_slot(s, sl);
    return ok;
}

bool srv_sched_slot_restore(srv_sched *s, int32_t i, const char *dir, const char *name, int64_t *n,
                            uint64_t *bytes, muser_error *err) {
    slot *sl = pin_slot(s, i, err);
    if (!sl) return false;
    /* with an assistant the pack must carry its context (the slot's muser_spec is bound to the session) */
    bool ok = muser_kvpack_restore_file(sl->sess, NULL, dir, name, NULL, bytes, err);
    pthread_mutex_lock(&s->mu);
    if (ok) { /* the slot's record of its tokens is the pack's */
        int64_t k;
        const int32_t *t = mu_session_hist(sl->sess, &k);
        if (k > sl->cap_toks) {
            sl->cap_toks = k;
            sl->toks = mu_xrealloc(sl->toks, (size_t)k * sizeof *sl->toks);
        }
        memcpy(sl->toks, t, (size_t)k * sizeof *t);
        sl->n_toks = k;
        *n = k;
    }
    pthread_mutex_unlock(&s->mu);
    unpin_slot(s, sl);
    return ok;
}

bool srv_sched_slot_erase(srv_sched *s, int32_t i, muser_error *err) {
    if (i < 0 || i >= s->p.n_slots) {
        mu_err_set(ERR_CAST(err), "slot %d: the server has slots 0 to %d", i, s->p.n_slots - 1);
        return false;
    }
    pthread_mutex_lock(&s->mu);
    const bool busy = s->slots[i].job != NULL || s->slots[i].pinned;
    if (!busy) slot_reset(&s->slots[i]);
    pthread_mutex_unlock(&s->mu);
    if (busy) mu_err_set(ERR_CAST(err), "slot %d is running a request", i);
    return !busy;
}
