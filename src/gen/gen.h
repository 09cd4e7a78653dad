/* The request loop as library code: one generation request from prompt to
 * stop, written only against the public API of include/muser.h.
 *
 * Two layers:
 *
 * 1. mu_gen, a per-request state machine over logits rows. It never calls
 *    the forward pass, so a server whose scheduler batches the forward
 *    passes of many requests can drive one mu_gen per request:
 *
 *      mu_gen *g = mu_gen_new(model, &sampling_params, &err);   // sampler built once
 *      mu_gen_start(g, &request, on_event, user, &err);         // prompt tokens, sampler reset
 *      prompt = mu_gen_prompt(g, &n);  ... the scheduler prefills it ...
 *      mu_gen_prefilled(g, n_fed);                              // timing only
 *      int32_t next;
 *      mu_gen_stop st = mu_gen_take_row(g, last_row, &next);
 *      while (st == MU_GEN_RUNNING) {
 *          if (no room for one more token) { mu_gen_finish(g, MU_GEN_STOP_CONTEXT, NULL); break; }
 *          ... the scheduler feeds `next` and gets its row ...
 *          st = mu_gen_take_row(g, row, &next);
 *      }
 *      const mu_gen_result *r = mu_gen_get_result(g);
 *
 *    With speculation, muser_spec_next draws the tokens itself with
 *    mu_gen_sampler(g) (at most mu_gen_max_draw(g) of them); its result goes
 *    to mu_gen_take_drawn unchanged (n = 0 included).
 *    Each drawn token raises one event: the token, the logits row, its
 *    logprobs (sampling n_probs > 0) and the text bytes that became final.
 *    Text that could still grow into a stop string is held back and only
 *    released when it no longer can; a stop string and what follows it are
 *    never emitted.
 *
 * 2. mu_gen_run, the blocking driver of `muser run`, `muser speculate` and
 *    `muser bench --draft`: it feeds the prompt (reusing the common prefix
 *    of the tokens already in the session, mu_gen_seq), then feeds and
 *    takes rows (or speculates) until a stop. A full context is a stop
 *    reason ("context"), not a failure.
 *
 * Threads: one mu_gen per request, used by one thread at a time; a mu_gen
 * owns its sampler and detokenizer. The model may be shared (read-only); a
 * session and its muser_spec belong to one request at a time. The callback
 * runs on the thread that calls take/finish/run. */
#ifndef MUSER_GEN_H
#define MUSER_GEN_H
#include "muser.h"
#include "util/common.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MU_GEN_MAX_STOPS 16
#define MU_GEN_MAX_DRAW 16 /* tokens one speculative step may return (muser_spec_next's max_out) */

typedef enum mu_gen_stop {
    MU_GEN_RUNNING = 0,
    MU_GEN_STOP_EOG,       /* an end-of-generation token (it is the last token) */
    MU_GEN_STOP_STRING,    /* a stop string: the text ends right before it */
    MU_GEN_STOP_LENGTH,    /* n_predict tokens */
    MU_GEN_STOP_GRAMMAR,   /* the grammar is complete and nothing else may follow (also under ignore_eos) */
    MU_GEN_STOP_CONTEXT,   /* no room in the session for the next token */
    MU_GEN_STOP_CANCELLED, /* the callback returned false */
    MU_GEN_STOP_ERROR,     /* result->error says why */
} mu_gen_stop;

/* "eog", "stop_string", "length", "grammar", "context", "cancelled", "error" ("running"). */
const char *mu_gen_stop_name(mu_gen_stop st);

typedef struct mu_gen_request {
    /* The prompt: exactly one of text, tokens, messages_json. */
    const char *text;            /* raw text: BOS as the model asks, control-token texts parsed */
    size_t text_len;             /* 0 = strlen(text) */
    const int32_t *tokens;
    int64_t n_tokens;
    const char *messages_json;   /* OpenAI-style array, rendered with the model's chat template */
    const char *tools_json;      /* optional, with messages_json */
    int64_t n_predict;           /* most tokens to draw; < 0: no limit */
    const char *const *stops;    /* non-empty strings, at most MU_GEN_MAX_STOPS */
    int n_stops;
    bool speculate;              /* mu_gen_run: use the muser_spec it is given */
    bool rows_needed;            /* the callback reads ev->row: mu_gen_run never uses the greedy chain */
} mu_gen_request;

/* One drawn token (token >= 0), or the text released at the end (token -1).
 * Pointers are valid during the callback only. */
typedef struct mu_gen_event {
    int32_t token;
    int64_t index;               /* the token's index in the output */
    const float *row;            /* the logits row it was drawn from (NULL with token -1) */
    const char *text;            /* bytes that became final with this event (not NUL-terminated) */
    size_t text_len;
    const muser_logprob *logprob; /* NULL unless sampling n_probs > 0 */
    const muser_logprob *top;    /* n_top most likely tokens of the row */
    int32_t n_top;
} mu_gen_event;
/* false cancels the request (stop "cancelled" after this event). */
typedef bool (*mu_gen_callback)(void *user, const mu_gen_event *ev);

typedef struct mu_gen_result {
    mu_gen_stop stop;
    const char *error;           /* with MU_GEN_STOP_ERROR */
    const int32_t *prompt;       /* the prompt's tokens */
    int64_t n_prompt;
    const int32_t *tokens;       /* drawn tokens (an end-of-generation token included) */
    int64_t n_tokens;
    const char *text;            /* their text, cut before a stop string; NUL-terminated */
    size_t text_len;
    const muser_logprob *logprobs; /* per token (sampling n_probs > 0), else NULL */
    const muser_logprob *top;    /* per token n_probs alternatives */
    int32_t n_probs;
    int64_t n_prefill, n_decoded; /* tokens fed for the prompt / after it */
    int64_t n_reused;            /* prompt tokens restored from the prompt cache (mu_gen_set_prompt_cache) */
    double t_prefill, t_decode;  /* seconds */
} mu_gen_result;

typedef struct mu_gen mu_gen;

/* A generation state for `m` with a sampler built from sp (NULL: llama.cpp's
 * defaults); grammar and schema errors are reported here. */
mu_gen *mu_gen_new(muser_model *m, const muser_sampling_params *sp, muser_error *err);
void mu_gen_free(mu_gen *g);
/* The request's sampler: seed and chain, and muser_spec_next's draws. */
muser_sampler *mu_gen_sampler(mu_gen *g);

/* Begin a request: tokenize / render the prompt, restart the sampler
 * (reseeded, grammar from the start) and put the prompt into its penalty
 * history, as llama-server does. Copies what it needs from req. */
bool mu_gen_start(mu_gen *g, const mu_gen_request *req, mu_gen_callback cb, void *user, muser_error *err);
const int32_t *mu_gen_prompt(const mu_gen *g, int64_t *n);
/* The caller fed n prompt tokens (a reused prefix not counted): closes the
 * prefill timing, opens the decode timing. */
void mu_gen_prefilled(mu_gen *g, int64_t n);
/* Draw a token from the row of the last fed token (the prompt's last one
 * first) and handle it. MU_GEN_RUNNING: feed *next and call again with its
 * row; anything else: the request is finished. */
mu_gen_stop mu_gen_take_row(mu_gen *g, const float *row, int32_t *next);
/* The draw of the mu_gen_take_row(g, row, ...) that must come next, done
 * ahead (nothing when that call would not draw): it touches only g's
 * sampler, so a caller holding rows of several requests draws them on
 * several threads, one thread per mu_gen, then takes the rows in any order
 * (src/server/sched.c). The same token and sampler state as drawing inside
 * mu_gen_take_row. */
void mu_gen_draw(mu_gen *g, const float *row);
/* mu_gen_take_row for a token drawn elsewhere from a row the host does not
 * hold (muser_session_decode_chain's pick, valid only under
 * muser_sampler_is_argmax): the same checks, events (row NULL) and state. */
mu_gen_stop mu_gen_take_picked(mu_gen *g, int32_t tok, int32_t *next);
/* Whether mu_gen_run may decode on the session's greedy chain: the sampler
 * is an argmax (muser_sampler_is_argmax), no logprobs are asked, the
 * request does not need rows or speculation, and the backend has one
 * (MUSER_CHAIN=0 turns it off). */
bool mu_gen_can_chain(const mu_gen *g, const muser_session *s);
/* Tokens the request may still draw (n_predict minus those out), -1: no limit. */
int64_t mu_gen_left(const mu_gen *g);
/* muser_spec_next's result as is: n tokens it drew with mu_gen_sampler(g)
 * from rows[i] (the pending token and toks[0..n-1) are fed), or n = 0 when
 * the grammar is complete (the pending token fed). *next as above. */
mu_gen_stop mu_gen_take_drawn(mu_gen *g, const int32_t *toks, const float *const *rows, int n, int32_t *next);
/* Tokens a speculative step may draw now: min(MU_GEN_MAX_DRAW, tokens left). */
int mu_gen_max_draw(const mu_gen *g);
/* Prompt cache (a kvpack store, include/muser.h): mu_gen_drive then makes
 * the session hold the prompt with muser_kvstore_prefill - the longest
 * stored prefix restored, only the rest fed, packs stored for later
 * prompts. NULL turns it off. With speculation the packs carry the
 * assistant's context too (the muser_spec is bound to the session). */
void mu_gen_set_prompt_cache(mu_gen *g, muser_kvstore *st);
muser_kvstore *mu_gen_prompt_cache(const mu_gen *g);
/* The tokens restored for this request's prompt (mu_gen_drive). */
void mu_gen_set_reused(mu_gen *g, int64_t n);
/* Whether the started request reads the logits rows of its tokens
 * (rows_needed or logprobs); if not, mu_gen_take_drawn takes rows NULL. */
bool mu_gen_needs_rows(const mu_gen *g);
/* The started request's `speculate`. */
bool mu_gen_speculates(const mu_gen *g);
/* End a running request from outside (context full, cancelled, error with
 * msg): the detokenizer is flushed and held-back text released. */
void mu_gen_finish(mu_gen *g, mu_gen_stop why, const char *msg);
/* The result so far (final once stop != MU_GEN_RUNNING); valid until the next start. */
const mu_gen_result *mu_gen_get_result(const mu_gen *g);

/* ---------------------------------------------------------- blocking driver */

/* The tokens a session holds, for prefix reuse across requests. */
typedef struct mu_gen_seq {
    int32_t *ids;
    int64_t n, cap;
} mu_gen_seq;
void mu_gen_seq_clear(mu_gen_seq *q);  /* forget (the session must be reset too) */
void mu_gen_seq_free(mu_gen_seq *q);

/* Run a request on session s to its end. sp (may be NULL) is the muser_spec
 * bound to s: the session is then fed only through it, and req->speculate
 * decides whether it proposes. seq (may be NULL: the session is reset) holds
 * the tokens in s; on return it holds what s holds. False with err on an
 * error (result stop "error"); a full context is a normal stop. */
bool mu_gen_run(mu_gen *g, muser_session *s, muser_spec *sp, mu_gen_seq *seq, const mu_gen_request *req,
                mu_gen_callback cb, void *user, muser_error *err);
/* The same in two halves, for a caller that looks at the prompt first (a
 * chat that drops old turns when the prompt does not fit): mu_gen_start,
 * then mu_gen_drive runs the started request to its end. */
bool mu_gen_drive(mu_gen *g, muser_session *s, muser_spec *sp, mu_gen_seq *seq, muser_error *err);

/* ---------------------------------------------------------- exactness pair */

/* Greedy decoding of one prompt on s, plain and speculative (every step
 * speculates, no gate), each through mu_gen_run; the two streams must be
 * identical (`muser speculate`, `muser bench --draft`). */
typedef struct mu_gen_pair {
    int32_t *plain, *spec;       /* the two token streams */
    int64_t n_plain, n_spec;
    double t_plain, t_spec;      /* decode seconds after the prompt */
    muser_spec_stats st;         /* of the speculative run */
} mu_gen_pair;
/* One run into p: plain when d is NULL, else speculative with d and spp
 * (verify length, token trees; every step speculates). */
bool mu_gen_greedy(muser_session *s, const muser_draft *d, const muser_spec_params *spp, const int32_t *prompt,
                   int64_t n_prompt, int64_t n_predict, mu_gen_pair *p, muser_error *err);
void mu_gen_pair_free(mu_gen_pair *p);
/* Tokens per second after the first one (which comes from the prompt's row). */
double mu_gen_rate(int64_t n, double seconds);
/* Index of the first difference, -1 if the streams are identical. */
int64_t mu_gen_pair_diff(const mu_gen_pair *p);

/* ---------------------------------------------------------- text helpers */

/* A JSON string literal of p[0..n): quotes, backslash and control bytes
 * escaped; every byte of invalid or cut-off UTF-8 becomes U+FFFD, so user
 * text of any bytes makes valid JSON. */
void mu_gen_json_string(mu_buf *b, const char *p, size_t n);
/* Append {"role":ROLE,"content":CONTENT} to a JSON array under
 * construction (a comma first unless b ends with '['). */
void mu_gen_json_message(mu_buf *b, const char *role, const char *content, size_t n);

#endif
