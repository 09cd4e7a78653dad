/* The server's scheduler: continuous batching of generation jobs over one
 * engine (include/muser.h: muser_engine_step) with n_slots sessions.
 *
 * One scheduler thread owns the engine. Each step it admits waiting jobs
 * into free slots (the slot whose cached tokens share the longest prefix
 * with the job's prompt first, so a request that extends the slot's last
 * prompt prefills only the new tokens), submits every active slot's next
 * input (a prompt chunk, or the one token drawn last), runs one batched
 * forward, and hands each finished row to that job's request loop (src/gen:
 * sampling, grammar, stop strings, logprobs), which raises events. HTTP
 * threads read a job's events with srv_job_next (blocking) and may cancel
 * it at any time: its slot is free for the next step.
 *
 * With a DFlash assistant, a job that runs alone (no other job active or
 * waiting) decodes speculatively (muser_spec_next: exact, the same tokens
 * as plain decoding; its gate falls back to plain steps where drafting does
 * not pay); as soon as another job arrives it goes back to batched steps.
 * Every row a slot's session takes is handed to its assistant's context,
 * either way.
 *
 * Bits: a job's tokens and logprobs do not depend on the jobs beside it
 * (the engine's batch invariance; every job has its own sampler), so at
 * temperature 0, or with a seed, a request replays exactly alone or under
 * load. */
#ifndef MUSER_SERVER_SCHED_H
#define MUSER_SERVER_SCHED_H
#include "gen/gen.h"
#include "muser.h"

typedef struct srv_sched srv_sched;
typedef struct srv_job srv_job;

typedef struct srv_sched_params {
    int32_t n_slots;            /* sessions generating at once (llama-server --parallel); 0 = 4 */
    int64_t n_ctx;              /* context of each slot; 0 = the model's training context */
    int64_t n_batch;            /* most rows in one forward; 0 = 512 */
    int64_t prefill_chunk;      /* most prompt rows of one slot per forward; 0 = 256 */
    int64_t prefill_budget;     /* most prompt rows in a forward with decode rows; 0 = unbounded */
    int32_t max_queue;          /* jobs waiting for a slot beyond which submit refuses; 0 = 64 */
    const muser_draft *draft;   /* DFlash assistant (may be NULL): a job running alone speculates */
    int verify_len;             /* its proposals per round: 3, 7 or 15; 0 = 7 */
    bool spec_always;           /* speculate every step (default: the adaptive gate decides) */
    bool spec_tree;             /* verify token trees (docs/speculative.md) */
    int zstd_level;             /* kvpack files the server writes: 0 raw, 1..19 zstd (docs/kvpack.md) */
    const char *prompt_cache;   /* a kvpack store shared with other processes (docs/kvpack.md), or NULL:
                                 * a new prompt restores its longest stored prefix, prefilled prompts
                                 * publish their packs (by a writer thread) */
    uint64_t prompt_cache_quota; /* its size quota (LRU eviction after each pack written); 0 = none */
    int32_t draw_threads;       /* threads drawing the slots' tokens after a step; 0 = auto (sched.c
                                 * draw_pool_size), 1 = the scheduler thread alone */
} srv_sched_params;

srv_sched *srv_sched_create(muser_model *m, const srv_sched_params *p, muser_error *err);
/* Stop: with finish, running jobs run to their end (new ones are refused);
 * without, every job is cancelled. Then the thread is joined and all freed
 * (jobs still held by callers stay valid until srv_job_free). */
void srv_sched_free(srv_sched *s, bool finish);

/* One generation: the request (prompt, n_predict, stops; its strings are
 * copied) and the sampling parameters (with grammar / JSON Schema text,
 * n_probs for logprobs, seed...; pointers borrowed during the call only). */
typedef struct srv_job_params {
    mu_gen_request req;
    muser_sampling_params sampling;
    int32_t slot;               /* a specific slot (llama.cpp id_slot), -1 = any */
    bool cache_prompt;          /* reuse the slot's cached prefix (llama.cpp cache_prompt; default true) */
} srv_job_params;

/* Outcome of a submit that returned NULL. */
typedef enum srv_refusal {
    SRV_REFUSED_INVALID = 400,  /* bad grammar or schema, prompt longer than the context, bad slot id: err names it */
    SRV_REFUSED_BUSY = 429,     /* the waiting queue is full: retry later */
    SRV_REFUSED_SHUTDOWN = 503, /* the server is stopping */
} srv_refusal;

/* Queue a job; NULL with *refusal and err when it cannot be queued. The
 * prompt is tokenized / rendered and the sampler built here, so every
 * client mistake is reported before anything runs. */
srv_job *srv_sched_submit(srv_sched *s, const srv_job_params *p, srv_refusal *refusal, muser_error *err);

typedef enum srv_event_kind {
    SRV_EV_TOKEN = 1,           /* a drawn token */
    SRV_EV_DONE = 2,            /* the job ended: srv_job_result is final */
} srv_event_kind;

typedef struct srv_event {
    srv_event_kind kind;
    /* SRV_EV_TOKEN, or the text released at the end (token -1): */
    int32_t token;
    int64_t index;              /* the token's index in the output */
    const char *text;           /* bytes that became final with this event (not NUL-terminated) */
    size_t text_len;
    bool has_logprob;           /* sampling n_probs > 0 */
    muser_logprob logprob;      /* of the drawn token */
    const muser_logprob *top;   /* n_top alternatives */
    int32_t n_top;
    /* SRV_EV_DONE: */
    mu_gen_stop stop;
} srv_event;

/* The next event of the job, blocking up to timeout_ms (-1: forever);
 * false on timeout. Pointers in *ev stay valid until the next call. After
 * SRV_EV_DONE it returns SRV_EV_DONE again at once. */
bool srv_job_next(srv_job *j, srv_event *ev, int timeout_ms);
/* The client went away (or asked to stop): the job ends with stop
 * "cancelled" at the next step and its slot is released. */
void srv_job_cancel(srv_job *j);
/* Valid after SRV_EV_DONE until srv_job_free: the request loop's result
 * (prompt tokens, drawn tokens, text, logprobs, stop, timings). */
const mu_gen_result *srv_job_result(const srv_job *j);
/* Prompt tokens taken from the slot's cache instead of prefilled. */
int64_t srv_job_cached(const srv_job *j);
/* The slot the job ran in (-1 before it was admitted). */
int32_t srv_job_slot(const srv_job *j);
/* The sampler's seed (the resolved one when random). */
uint32_t srv_job_seed(const srv_job *j);
/* Cancels a running job, then frees it. */
void srv_job_free(srv_job *j);

/* ------------------------------------------------ state for /metrics, /slots, /props */

#define SRV_HIST_BUCKETS 14     /* upper bounds in seconds: srv_hist_bounds */
extern const double srv_hist_bounds[SRV_HIST_BUCKETS];

typedef struct srv_hist {
    uint64_t count[SRV_HIST_BUCKETS + 1]; /* per bucket, the last one +Inf (not cumulative) */
    uint64_t n;
    double sum;
} srv_hist;

typedef struct srv_stats {
    int32_t n_slots, running, waiting;
    double kv_usage;            /* held KV positions over all slots' capacity, 0..1 */
    int64_t n_ctx;              /* per slot */
    uint64_t requests_total, requests_finished, requests_cancelled, requests_refused;
    uint64_t prompt_tokens_total, cached_tokens_total, generation_tokens_total;
    uint64_t steps_total;
    double step_seconds;        /* in the engine's steps (the forwards) */
    double take_seconds;        /* after them, handing the rows to the jobs (the draws, detokenizing, events) */
    srv_hist ttft, itl, e2e;    /* time to first token, inter-token latency, request latency (s) */
    uint64_t spec_drafted, spec_accepted; /* speculative proposals (0 without an assistant) */
    uint64_t chain_tokens;      /* tokens a lone greedy job decoded on the greedy chain (sched.c chain_burst) */
    /* --prompt-cache: prompts that restored a stored prefix, the tokens restored, packs
     * written, packs not written (the writer's queue full), restores or writes refused */
    uint64_t store_hits, store_tokens, store_written, store_dropped, store_errors;
} srv_stats;
void srv_sched_stats(srv_sched *s, srv_stats *st);

typedef struct srv_slot_info {
    int32_t id;
    bool busy;
    int64_t n_ctx;
    int64_t n_cached;           /* tokens held in the slot's KV */
    int64_t n_prompt, n_decoded; /* of the running job */
    uint64_t job_id;            /* 0 when idle */
} srv_slot_info;
/* Fills up to cap slots, returns n_slots. */
int32_t srv_sched_slots(srv_sched *s, srv_slot_info *out, int32_t cap);
/* A slot's KV as a kvpack file DIR/name (docs/kvpack.md; llama.cpp's
 * slot save/restore): refused while the slot runs a job. The slot is
 * pinned meanwhile (no job is admitted into it), so the other slots keep
 * stepping while the file is written or read. With an
 * assistant the file carries its context too, and a restore needs one made
 * with the same assistant. A refused restore leaves the slot as it was. *n gets the tokens, *bytes the file's size. */
bool srv_sched_slot_save(srv_sched *s, int32_t slot, const char *dir, const char *name, int64_t *n, uint64_t *bytes,
                         muser_error *err);
bool srv_sched_slot_restore(srv_sched *s, int32_t slot, const char *dir, const char *name, int64_t *n,
                            uint64_t *bytes, muser_error *err);
/* Forget a slot's cached tokens; refused while it runs a job. */
bool srv_sched_slot_erase(srv_sched *s, int32_t slot, muser_error *err);

#endif
