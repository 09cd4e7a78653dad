/* muser: an inference engine for Muse Glimmer GGUF models.
 *
 * Embedding API. A model is loaded once (read-only mmap, validated
 * fail-closed) and shared by any number of engines and sessions; a session
 * owns a KV cache and a position, an engine runs the rows of many sessions
 * in one batched forward. Every fallible call takes a muser_error* (may be
 * NULL) and reports one precise message on failure. The thread-safety
 * contract is stated with the engine calls below.
 *
 *   muser_error err;
 *   muser_model *m = muser_model_load("model.gguf", NULL, &err);
 *   muser_session *s = muser_session_create(m, NULL, &err);
 *   int32_t toks[] = {1, 2, 3};
 *   muser_session_feed(s, toks, 3, &err);           // prefill
 *   const float *logits = muser_session_logits(s);  // last row, n_vocab floats
 *   ...
 *   muser_session_free(s); muser_model_free(m);
 */
#ifndef MUSER_H
#define MUSER_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MUSER_VERSION "0.1.0"

typedef struct muser_model muser_model;
typedef struct muser_session muser_session;
typedef struct muser_snapshot muser_snapshot;

typedef struct muser_error {
    char msg[1024];
} muser_error;

typedef enum muser_backend_kind {
    MUSER_BACKEND_DEFAULT = 0, /* best available */
    MUSER_BACKEND_REF = 1,     /* scalar reference: the numerical specification */
    MUSER_BACKEND_CPU = 2,     /* SIMD CPU backend, bit-identical to ref */
    MUSER_BACKEND_CUDA = 3,
} muser_backend_kind;

typedef struct muser_model_params {
    muser_backend_kind backend;
    int n_threads;              /* 0 = all cores */
    bool use_mlock;             /* lock the file's pages in RAM (refused if the OS will not) */
} muser_model_params;

typedef struct muser_model_info {
    const char *architecture;   /* "muse-glimmer" */
    const char *name;
    const char *lane;           /* "q4_k_xl" or "nvfp4" */
    const char *backend;        /* resolved backend name */
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx_train;
    int64_t sliding_window, n_swa_layers;
    uint64_t file_bytes;
    uint64_t weight_bytes_per_token; /* weights streamed per decoded token */
} muser_model_info;

muser_model *muser_model_load(const char *path, const muser_model_params *params, muser_error *err);
void muser_model_free(muser_model *m);
void muser_model_get_info(const muser_model *m, muser_model_info *info);
/* Resolve a backend name ("ref", "cpu", "cuda", "auto"); false if unknown. */
bool muser_backend_from_name(const char *name, muser_backend_kind *out);

/* ---------------- engines, sessions and the step function ----------------
 * A session is one sequence: its KV cache (sliding-window rings and NoPE
 * planes), its position and its last logits. Sessions live in an engine,
 * which owns the backend memory they share (activation scratch sized by
 * the largest batch, logits rows) and runs their rows through the model
 * together: one forward takes rows of any number of sessions, every op runs
 * once over all of them, and each row attends only to its own session's
 * keys. A session's logits are bit-identical whether it runs alone or
 * batched with others, and however its input was chunked.
 *
 *   muser_engine_params ep = {.n_seq_max = 8, .n_ctx = 4096};
 *   muser_engine *e = muser_engine_create(m, &ep, &err);
 *   muser_session *a = muser_engine_session(e, &err), *b = ...;
 *   muser_session_submit(a, prompt_a, n_a, NULL, &err);   // queue input
 *   muser_session_submit(b, prompt_b, n_b, NULL, &err);
 *   while (muser_engine_step(e, NULL, &err) > 0 || muser_engine_busy(e)) {
 *       // sessions whose input is consumed have logits: sample, submit the next token
 *   }
 *
 * muser_session_create makes a one-sequence engine owned by the session
 * (the classic single-stream API).
 *
 * Thread safety: a muser_model is read-only after loading and may be
 * shared by any number of engines and threads. Every call on an engine or
 * on any of its sessions takes the engine's lock, so they may come from
 * different threads; they run one at a time. A logits pointer returned for
 * a session stays valid until that session's next feed, step row, reset,
 * rollback or restore. Samplers, detokenizers and speculation states are
 * not locked: use each from one thread at a time. */
typedef struct muser_engine muser_engine;

typedef struct muser_engine_params {
    int32_t n_seq_max;          /* sessions the engine can hold; 0 = 1 */
    int64_t n_ctx;              /* context of each session; 0 = the model's training context */
    int64_t n_batch;            /* most rows in one forward; 0 = 512 */
    int64_t prefill_chunk;      /* most rows of one session in one forward; 0 = n_batch */
    int64_t prefill_budget;     /* most prompt rows in a forward that also carries decode or
                                 * verification rows (bounds the inter-token latency of generating
                                 * sessions while others prefill); 0 = no bound beyond n_batch */
} muser_engine_params;

muser_engine *muser_engine_create(muser_model *m, const muser_engine_params *params, muser_error *err);
/* Frees the engine and every session still in it. */
void muser_engine_free(muser_engine *e);
/* A new, empty session (sequence) of the engine; NULL when it holds
 * n_seq_max already. Free it with muser_session_free. */
muser_session *muser_engine_session(muser_engine *e, muser_error *err);
/* Sessions with queued input. */
int32_t muser_engine_busy(muser_engine *e);

typedef struct muser_step_info {
    int64_t rows;               /* rows in the forward */
    int64_t decode_rows;        /* rows of sessions with at most 16 queued (decode, verification) */
    int64_t prefill_rows;       /* rows of prompt chunks */
    int32_t sessions;           /* sessions with rows in it */
    int32_t completed;          /* sessions whose queued input is now consumed */
} muser_step_info;

/* One batched forward: every session whose queued input is at most 16 rows
 * (a decode token or a verification block) contributes all of it, then
 * queued prompts contribute chunks (oldest submission first) up to n_batch
 * rows in all and prefill_chunk per session, so a long prompt never stalls
 * the others; when decode rows are present, prompt rows are capped at
 * prefill_budget. Returns the number of sessions whose input completed (their
 * logits are ready), 0 when nothing was queued, -1 on an engine error. A
 * session whose own rows fail (a non-finite logit) is poisoned and keeps
 * its message in muser_session_error; the others go on. */
int32_t muser_engine_step(muser_engine *e, muser_step_info *info, muser_error *err);

typedef struct muser_session_params {
    int64_t n_ctx;              /* 0 = the model's training context */
    int64_t prefill_chunk;      /* rows per forward call during prefill; 0 = the backend's choice: 512,
                                   on CUDA 2,048 capped by depth (fewer past ~30k of a 131,072 context) */
} muser_session_params;

muser_session *muser_session_create(muser_model *m, const muser_session_params *params, muser_error *err);
void muser_session_free(muser_session *s);
/* Forget everything (position 0, queued input dropped). */
void muser_session_reset(muser_session *s);
int64_t muser_session_pos(const muser_session *s);
int64_t muser_session_n_ctx(const muser_session *s);
muser_model *muser_session_model(const muser_session *s);
muser_engine *muser_session_engine(const muser_session *s);

/* Feed tokens at the current position, now, in forwards of this session's
 * rows alone. On success the logits of the last token are available from
 * muser_session_logits (n_vocab floats). Prefill of N tokens gives
 * bit-identical logits to feeding them one at a time. Fails (state
 * unchanged) on an invalid token id, a full context or queued input; a
 * non-finite logit is an error that poisons the session until
 * muser_session_reset. */
bool muser_session_feed(muser_session *s, const int32_t *tokens, int64_t n, muser_error *err);
/* As feed, but writes every row's logits to out[n][n_vocab] (speculative verify). */
bool muser_session_feed_all(muser_session *s, const int32_t *tokens, int64_t n, float *out, muser_error *err);
const float *muser_session_logits(const muser_session *s);
/* Greedy decoding with the tokens chosen where the logits lie (a GPU keeps
 * them there; docs/cuda.md "The greedy chain"): feeds `first`, then each
 * new row's first maximum, several forwards ahead of the host, at most
 * max_feed tokens in all (< 0: no limit; no forward runs past it). For every
 * row, in order, next(user, token, row) is called with the backend's pick
 * (row NULL), or, when that row's maximum is not unique or a value is not
 * finite, with token -1 and the row itself (host memory, as feed leaves
 * it). It returns the token to feed next, -1 to stop, or, given a pick,
 * MUSER_CHAIN_ROW to be called again for that row with the row itself
 * (e.g. for a pick the sampler bans). The session then
 * holds exactly the tokens fed up to that row (`first` and every token
 * next returned before the stop; rows computed past it are dropped), as a
 * loop of feed calls would leave it, with the same bits. Also stops when
 * the context is full (the last next() value is then not fed). Returns the
 * number of next() calls, -1 with err (a failed forward, a non-finite row:
 * the session is poisoned as feed would); after max_feed tokens, the
 * last next() value is not fed either. Needs a backend that has a
 * chain (muser_session_can_chain), no checkpoint and no capture. next runs
 * with the engine's lock held: it must not call into the engine. */
#define MUSER_CHAIN_ROW (-2)
int64_t muser_session_decode_chain(muser_session *s, int32_t first, int64_t max_feed,
                                   int32_t (*next)(void *user, int32_t token, const float *row), void *user,
                                   muser_error *err);
/* Whether the session's backend can run muser_session_decode_chain. */
bool muser_session_can_chain(const muser_session *s);
/* Queue tokens for muser_engine_step (checked now as feed checks them;
 * all_out as in feed_all, or NULL for the last row's logits only; it must
 * stay valid until the input completes). One submission at a time. */
bool muser_session_submit(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, muser_error *err);
/* As submit, for prompt text: the step treats it as a prompt at any length
 * (chunked, and within prefill_budget beside decode rows), where a plain
 * submission of at most 16 rows runs whole as a decode or verification
 * block. The logits are the same bits either way. */
bool muser_session_submit_prompt(muser_session *s, const int32_t *tokens, int64_t n, float *all_out, muser_error *err);
/* Queued rows not yet run. */
int64_t muser_session_queued(const muser_session *s);
/* The message that poisoned the session ("" when it is healthy). */
const char *muser_session_error(const muser_session *s);

/* Keep only the first n tokens (llama.cpp's sequence removal of [n, end)):
 * the logits are dropped. Fails (nothing changed) when a sliding-window
 * ring no longer holds the window before n, during a checkpoint or with
 * queued input. n >= the position is a no-op. */
bool muser_session_truncate(muser_session *s, int64_t n, muser_error *err);
/* Drop the queued input that has not run yet (rows already run stay in
 * the KV: the position says how far it got). */
void muser_session_cancel_queued(muser_session *s);

/* Make dst (another session of the same engine) continue from src's
 * first n tokens: the KV of every position attention can still read is
 * copied, dst's own content is dropped. With n == src's position dst also
 * gets src's logits. Fails when src's sliding-window rings no longer hold
 * the window before n. */
bool muser_session_fork(muser_session *dst, const muser_session *src, int64_t n, muser_error *err);

/* Rollback window: checkpoint now, feed up to 16 tokens, roll back to any
 * position in between (exact: ring rows restored), or commit. */
bool muser_session_checkpoint(muser_session *s, muser_error *err);
bool muser_session_rollback(muser_session *s, int64_t pos, muser_error *err);
void muser_session_commit(muser_session *s);

/* Full in-memory snapshots of KV, position, tokens and the last logits
 * row (restore onto a session of the same engine geometry; the restored
 * session has the logits row again, so it can draw without re-feeding).
 * For durable, verified packs that restore anywhere, see kvpack below. */
muser_snapshot *muser_session_snapshot(const muser_session *s);
bool muser_session_restore(muser_session *s, const muser_snapshot *snap, muser_error *err);
void muser_snapshot_free(muser_snapshot *snap);

/* ---------------- text layer ----------------
 * Available when the GGUF carries tokenizer metadata (tokenizer.ggml.*).
 * Strings returned by muser_* allocation functions are freed with free(). */
bool muser_model_has_tokenizer(const muser_model *m);
/* Token ids for text (count >= 0, *out malloc'd) or -1 with err.
 * add_special: BOS/EOS as the model asks; parse_special: match control-token texts. */
int64_t muser_tokenize(const muser_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t **out, muser_error *err);
/* Whole-sequence text (NUL-terminated, *len excludes it) or NULL with err. */
char *muser_detokenize(const muser_model *m, const int32_t *ids, size_t n, bool render_special, size_t *len,
                       muser_error *err);
/* Raw vocabulary text of one token (NULL if out of range). */
const char *muser_token_text(const muser_model *m, int32_t id);
bool muser_token_is_eog(const muser_model *m, int32_t id);
int32_t muser_token_bos(const muser_model *m);

/* Streaming detokenizer: each push returns only complete UTF-8 (valid until
 * the next call); flush ends the stream. */
typedef struct muser_detok muser_detok;
muser_detok *muser_detok_new(const muser_model *m, bool render_special);
const char *muser_detok_push(muser_detok *d, int32_t id, size_t *len);
const char *muser_detok_flush(muser_detok *d, size_t *len);
void muser_detok_free(muser_detok *d);

/* Render the model's tokenizer.chat_template (Jinja, as Hugging Face does)
 * for an OpenAI-style JSON array of messages. Returns malloc'd text or NULL
 * with err (template syntax errors name line and column). */
typedef struct muser_chat_params {
    const char *messages_json;   /* required: JSON array */
    const char *tools_json;      /* optional JSON array */
    bool add_generation_prompt;
    const char *date;            /* "YYYY-MM-DD" for strftime_now; NULL = today */
} muser_chat_params;
char *muser_chat_render(const muser_model *m, const muser_chat_params *p, muser_error *err);
/* SHA-256 (hex) of tokenizer.chat_template, "" if none: part of the identity. */
const char *muser_chat_template_sha256(const muser_model *m);

/* ---------------- sampling ----------------
 * The llama.cpp sampler chain, reproduced bit for bit (docs/sampling.md): a
 * seeded request draws the same tokens as llama-server does from the same
 * logits. Optional constraints: a GBNF grammar or a JSON Schema (converted
 * to GBNF as llama.cpp does). A sampler belongs to one generation stream:
 *
 *   muser_sampling_params sp;
 *   muser_sampling_params_default(&sp);
 *   sp.seed = 42;
 *   muser_sampler *smp = muser_sampler_create(m, &sp, &err);
 *   muser_sampler_accept_prompt(smp, prompt, n_prompt, &err); // penalty history
 *   for (;;) {
 *       int32_t t = muser_sampler_sample(smp, muser_session_logits(s), &err);
 *       if (t < 0 || !muser_sampler_accept(smp, t, &err)) break;
 *       if (muser_token_is_eog(m, t)) break;
 *       muser_session_feed(s, &t, 1, &err);
 *   }
 */
typedef struct muser_sampler muser_sampler;

#define MUSER_SEED_RANDOM 0xFFFFFFFFu /* a fresh random seed (llama's LLAMA_DEFAULT_SEED) */

typedef struct muser_logit_bias {
    int32_t token;
    float bias;                 /* added to the logit; -INFINITY bans the token */
} muser_logit_bias;

/* llama.cpp's common_params_sampling; muser_sampling_params_default gives
 * llama.cpp's defaults (in brackets). Pointers are borrowed during
 * muser_sampler_create only. */
typedef struct muser_sampling_params {
    uint32_t seed;              /* [MUSER_SEED_RANDOM] */
    float temp;                 /* [0.8]; <= 0: greedy, lowest id wins ties */
    int32_t top_k;              /* [40]; <= 0 off */
    float top_p;                /* [0.95]; >= 1 off */
    float min_p;                /* [0.05]; <= 0 off */
    float typ_p;                /* [1.0] = off */
    float top_n_sigma;          /* [-1] = off */
    float xtc_probability;      /* [0.0] = off */
    float xtc_threshold;        /* [0.1]; > 0.5 off */
    int32_t penalty_last_n;     /* [64]; 0 off, -1 = n_ctx */
    float penalty_repeat;       /* [1.0] = off */
    float penalty_freq;         /* [0.0] */
    float penalty_present;      /* [0.0] */
    float dry_multiplier;       /* [0.0] = off */
    float dry_base;             /* [1.75] */
    int32_t dry_allowed_length; /* [2] */
    int32_t dry_penalty_last_n; /* [-1] = n_ctx */
    const char *const *dry_sequence_breakers; /* [NULL = "\n" ":" "\"" "*"] */
    size_t n_dry_sequence_breakers;           /* with a non-NULL list; 0 = none */
    float dynatemp_range;       /* [0.0] = off */
    float dynatemp_exponent;    /* [1.0] */
    int32_t mirostat;           /* [0] off, 1 or 2 (replaces the chain's tail) */
    float mirostat_tau;         /* [5.0] target entropy (llama --mirostat-ent) */
    float mirostat_eta;         /* [0.1] learning rate (llama --mirostat-lr) */
    int32_t min_keep;           /* [0] */
    /* Chain order: names joined by ';' (llama --samplers, e.g.
     * "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature",
     * the default) or letters (llama --sampling-seq, e.g. "edskypmxt"). At
     * most one of the two; NULL = default. */
    const char *samplers;
    const char *sampling_seq;
    const muser_logit_bias *logit_bias; /* [none] */
    size_t n_logit_bias;
    bool ignore_eos;            /* [false] end-of-generation tokens are never drawn
                                   (masked inside selection; logits are untouched) */
    const char *grammar;        /* GBNF text [NULL] */
    const char *grammar_root;   /* start rule [NULL = "root"] */
    const char *json_schema;    /* JSON Schema text [NULL]; not together with grammar */
    int32_t n_probs;            /* [0] alternatives muser_sampler_logprobs reports */
    int32_t n_ctx;              /* resolves the -1 windows [0 = the model's training context] */
} muser_sampling_params;

void muser_sampling_params_default(muser_sampling_params *p);

/* Builds the chain for m's vocabulary, compiles the grammar or schema
 * (errors name line:column or the JSON pointer), resolves `<token-text>`
 * terminals with the tokenizer. Grammars, schemas and DRY need a model with
 * a tokenizer. */
muser_sampler *muser_sampler_create(const muser_model *m, const muser_sampling_params *p, muser_error *err);
void muser_sampler_free(muser_sampler *s);

/* Prompt tokens enter the penalty / DRY history (not the grammar), as
 * llama-server does before generating. False on an id outside the vocabulary. */
bool muser_sampler_accept_prompt(muser_sampler *s, const int32_t *tokens, size_t n, muser_error *err);
/* Draw the next token from a logits row (n_vocab floats, never modified).
 * With a grammar: llama-server's discipline - run the chain; if the grammar
 * refuses the winner, mask every candidate with the grammar and run the
 * chain again. End-of-generation is allowed only when the grammar is
 * complete. -1 with err when nothing can be drawn (e.g. a complete grammar
 * under ignore_eos). Does not advance the grammar: call muser_sampler_accept. */
int32_t muser_sampler_sample(muser_sampler *s, const float *logits, muser_error *err);
/* A generated token: penalty / DRY history and the grammar advance. A token
 * the grammar refuses is an error (nothing changes). */
bool muser_sampler_accept(muser_sampler *s, int32_t token, muser_error *err);
/* True when no grammar is set or the grammar's root rule is complete. */
bool muser_sampler_grammar_complete(const muser_sampler *s);
/* True when every draw is the row's maximum whenever that maximum is unique,
 * the row finite and the maximum not banned (a greedy chain: temperature
 * <= 0 with only top-k, top-p, min-p beside it; no logit bias, grammar,
 * mirostat, penalties or DRY; ignore_eos allowed), and accepting a token
 * changes no later draw: what muser_session_decode_chain needs to choose
 * tokens on the backend. */
bool muser_sampler_is_argmax(const muser_sampler *s);
/* Whether the sampler never draws this token (end-of-generation ids under
 * ignore_eos). */
bool muser_sampler_bans(const muser_sampler *s, int32_t token);
/* Start over: clear histories, restart the grammar, reseed every stream
 * from the configured seed (a new random one under MUSER_SEED_RANDOM). */
void muser_sampler_reset(muser_sampler *s);
/* The seed in use by the final draw (the resolved one when random). */
uint32_t muser_sampler_seed(const muser_sampler *s);

/* Snapshot of the whole mutable state (RNG streams, mirostat mu,
 * histories, grammar position). Loading it into a sampler created with the
 * same model and params continues the identical draw sequence. */
size_t muser_sampler_state_size(const muser_sampler *s);
bool muser_sampler_state_save(const muser_sampler *s, void *buf, size_t cap, muser_error *err);
bool muser_sampler_state_load(muser_sampler *s, const void *buf, size_t len, muser_error *err);

/* The chain as llama.cpp logs it ("logits -> ?penalties -> ... -> dist",
 * '?' = inactive) and the parameters (llama's print). snprintf-style:
 * return the length the whole text needs. */
size_t muser_sampler_chain_str(const muser_sampler *s, char *buf, size_t cap);
size_t muser_sampler_params_str(const muser_sampler *s, char *buf, size_t cap);

/* Bytes one token stands for (llama_token_to_piece): control tokens render
 * their text only with render_special. Copies min(length, cap) bytes, no
 * NUL, and returns the full length (0 for an id out of range). */
size_t muser_token_piece(const muser_model *m, int32_t id, bool render_special, char *buf, size_t cap);

/* OpenAI logprobs: log-softmax of the model's raw logits row (max
 * subtracted, accumulated in double), independent of the sampler chain.
 * *chosen_out gets `chosen`; top[0..n_top) the n_top most likely tokens,
 * logprob descending, ties by lower id. False on a non-finite row or a bad
 * id / count. */
typedef struct muser_logprob {
    int32_t id;
    float logprob;
} muser_logprob;
bool muser_logprobs(const muser_model *m, const float *logits, int32_t chosen, int32_t n_top,
                    muser_logprob *chosen_out, muser_logprob *top, muser_error *err);
/* The same with n_top = the sampler's n_probs; returns how many top entries
 * were written (top needs n_probs slots), -1 with err. */
int32_t muser_sampler_logprobs(const muser_sampler *s, const float *logits, int32_t chosen,
                               muser_logprob *chosen_out, muser_logprob *top, muser_error *err);


/* ---------------- speculative decoding (DFlash assistant) ----------------
 * A DFlash assistant proposes up to verify_len tokens; the target checks them
 * in one batched feed and every token is still drawn from the target's own
 * logits, by the same sampler, in the same order as plain decoding: the
 * output is token for token what plain decoding produces (same seed, same
 * grammar), only the speed differs (docs/speculative.md).
 *
 *   muser_draft *d = muser_draft_load("assistant.gguf", m, &err);
 *   muser_spec *sp = muser_spec_create(s, d, NULL, &err);
 *   muser_spec_feed(sp, prompt, n_prompt, &err);
 *   int32_t tok = muser_sampler_sample(smp, muser_session_logits(s), &err);
 *   muser_sampler_accept(smp, tok, &err);
 *   int32_t out[16]; const float *rows[16];
 *   int n = muser_spec_next(sp, tok, smp, 16, out, rows, &err); // out[n-1] is the next pending token
 */
typedef struct muser_draft muser_draft;
typedef struct muser_spec muser_spec;

/* Load an assistant GGUF (general.architecture = dflash) for this target;
 * refuses a file that does not match the target (hidden size, vocabulary,
 * tokenizer, target layers). The target must outlive the draft. */
muser_draft *muser_draft_load(const char *path, const muser_model *target, muser_error *err);
void muser_draft_free(muser_draft *d);
const char *muser_draft_name(const muser_draft *d);

typedef struct muser_spec_params {
    int verify_len;             /* proposals per round: 3, 7 or 15; 0 = 7 */
    bool no_gate;               /* speculate every step (default: the adaptive gate decides) */
    bool tree;                  /* verify a token tree of verify_len proposals instead of one chain
                                 * (docs/speculative.md "Token trees"; every backend) */
} muser_spec_params;

/* What muser run, speculate, bench and serve use unless told otherwise: token
 * trees of 15 proposals, the fastest shape measured on the cpu and cuda
 * backends with the shipped pair (docs/speculative.md "Defaults"). */
#define MUSER_SPEC_VERIFY_LEN_DEFAULT 15
#define MUSER_SPEC_TREE_DEFAULT true

typedef struct muser_spec_stats {
    int64_t rounds;             /* draft + batched verify rounds */
    int64_t round_tokens;       /* tokens those rounds produced (accepted + the target's own) */
    int64_t drafted, accepted;  /* proposals verified / kept */
    int64_t plain_steps;        /* one-token steps (gate closed, probing, or no room to draft) */
    int64_t gate_closures;      /* times the gate stopped speculation */
    int64_t picked_rounds;      /* rounds whose rows stayed on the backend (greedy, no rows wanted) */
    int64_t backend_rounds;     /* rounds drafted into the backend's registers and verified from there:
                                 * the picked ones and those drawn on the host from the fetched rows */
    int64_t predrafted;         /* rounds whose draft the round before had enqueued (speculate.c predraft) */
    double t_draft, t_verify, t_plain; /* seconds */
    bool gate_open;             /* speculating now */
    double calib_round_s, calib_plain_s; /* the gate's calibration (0 without gate) */
} muser_spec_stats;

/* Speculation state bound to a session of the draft's target. While it
 * exists, feed the session only through muser_spec_feed / muser_spec_next
 * (the assistant's context must see every row). */
muser_spec *muser_spec_create(muser_session *s, const muser_draft *d, const muser_spec_params *p, muser_error *err);
void muser_spec_free(muser_spec *sp);
/* Reset the session and the assistant's context. */
void muser_spec_reset(muser_spec *sp);
/* muser_session_feed that also hands the rows' hidden states to the assistant. */
bool muser_spec_feed(muser_spec *sp, const int32_t *tokens, int64_t n, muser_error *err);
/* Feed the pending token (drawn but not yet fed) and draw what follows:
 * 1 to max_out tokens, each from its own target logits row by smp (NULL:
 * greedy, lowest id on ties), stopping after an end-of-generation token.
 * rows[i] (may be NULL) points at the logits out[i] was drawn from, valid
 * until the next call. out[n-1] is the new pending token; all before it are
 * fed. Returns n, 0 when smp's grammar is complete (nothing may follow;
 * the pending token is fed), -1 on error. */
int muser_spec_next(muser_spec *sp, int32_t pending, muser_sampler *smp, int max_out, int32_t *out,
                    const float **rows, muser_error *err);
void muser_spec_get_stats(const muser_spec *sp, muser_spec_stats *st);
void muser_spec_reset_stats(muser_spec *sp);

/* ---------------- kvpack: durable KV packs (docs/kvpack.md) ----------------
 * A pack is a session's whole state at a position - its tokens, the KV
 * every later position can read (full planes whole, sliding rings as the
 * window's logical tail), the last logits row and optionally a sampler's
 * state - bound to the model's identity (file, tokenizer, template,
 * weight types, geometry, numerics ABI), SHA-256 per section and over the
 * header, and sealed with HMAC-SHA256 under a 32-byte key file of mode
 * 0600. Restoring checks every byte into a detached KV generation and
 * swaps it in only when all of it checked out: a refused restore leaves
 * the session as it was. A pack restores into any session of an engine
 * whose context holds its tokens; generation then continues with logits
 * bit-identical to a run that never stopped.
 *
 * A store is a directory of packs named by a keyed hash of identity and
 * tokens (so the names are the on-disk prefix index), published crash
 * safe (temporary file, fsync, link, fsync of the directory), immutable,
 * one writer per pack at a time. Key file: key_file, else
 * $MUSER_KVPACK_KEY, else DIR/kvpack.key, made (0600) on the first save. */
typedef struct muser_kvstore muser_kvstore;

/* A store handle belongs to one thread at a time (any number of handles,
 * in any number of processes, may share a directory). Open (creating the directory, mode 0700, if it is missing) a store of
 * packs for model m; hashes the model file once per load (cached in
 * DIR/models/ by path, inode, size, mtime and ctime). */
muser_kvstore *muser_kvstore_open(muser_model *m, const char *dir, const char *key_file, muser_error *err);
void muser_kvstore_close(muser_kvstore *st);

/* Store the session's pack (smp: its sampler's state too, or NULL). id
 * gets the pack's name (64 hex digits); *existed (may be NULL) says it was
 * already there (packs are immutable: nothing is written). Fails closed
 * when another writer is storing the same pack. The session needs its
 * last logits row and the tokens of every position (rows it was fed). */
bool muser_kvstore_save(muser_kvstore *st, muser_session *s, const muser_sampler *smp, char id[65], bool *existed,
                        muser_error *err);
/* muser_kvstore_save in two halves, for a caller that must not wait for
 * the write (a server's scheduler): capture copies the session's pack out
 * under the engine's lock (a copy of its rows; no file is touched) and
 * names it (id); NULL when the store has that pack already (*existed) or
 * on error (err; *existed false). publish compresses, writes and publishes
 * it, from any thread, through a handle of the same store directory (its
 * own handle per thread), then applies that handle's quota; it frees img
 * either way. */
typedef struct muser_kvpack_image muser_kvpack_image;
muser_kvpack_image *muser_kvstore_capture(muser_kvstore *st, muser_session *s, const muser_sampler *smp, char id[65],
                                          bool *existed, muser_error *err);
bool muser_kvstore_publish(muser_kvstore *st, muser_kvpack_image *img, bool *existed, muser_error *err);
void muser_kvpack_image_free(muser_kvpack_image *img);
/* The bytes of KV rows an image holds in memory (for a caller's bound). */
uint64_t muser_kvpack_image_bytes(const muser_kvpack_image *img);
/* The session's identity-keyed lookup: as muser_kvstore_lookup, for the
 * packs session s would write (with its assistant's context when a
 * muser_spec is bound to it; those packs have names of their own). */
int64_t muser_kvstore_lookup_for(muser_kvstore *st, muser_session *s, const int32_t *tokens, int64_t n, char id[65]);
/* Longest prefix of tokens[0..n) with a pack: n (an exact hit), or the
 * largest multiple of 256 below n, or 0; id gets its name. */
int64_t muser_kvstore_lookup(muser_kvstore *st, const int32_t *tokens, int64_t n, char id[65]);
/* Restore pack id into s (smp: load the pack's sampler state when it has
 * one). On failure s is untouched and err names what was refused. */
bool muser_kvstore_restore(muser_kvstore *st, const char *id, muser_session *s, muser_sampler *smp, muser_error *err);
/* Prompt cache: make s hold tokens[0..n) with its logits, restoring the
 * longest stored prefix and feeding only the rest; stores the packs at
 * the last multiple of 256 and at n for later prompts. Returns the tokens
 * fed (0 on an exact hit), -1 with err; *reused (may be NULL) gets the
 * restored prefix's length. */
int64_t muser_kvstore_prefill(muser_kvstore *st, muser_session *s, const int32_t *tokens, int64_t n, int64_t *reused,
                              muser_error *err);
/* Packs this handle writes from now on: 0 raw (the default), 1..19 every
 * KV chunk compressed on its own with zstd at that level (docs/kvpack.md).
 * Reading needs no setting: a pack says how it was written. */
bool muser_kvstore_set_compression(muser_kvstore *st, int zstd_level, muser_error *err);
/* A size quota (0: none): after each pack this handle writes, packs are
 * evicted least recently used first (muser_kvstore_gc) until the store
 * holds at most max_bytes; the pack just written is kept. */
void muser_kvstore_set_quota(muser_kvstore *st, uint64_t max_bytes);
/* Bytes of the pack read by the last restore of this store. */
uint64_t muser_kvstore_bytes_read(const muser_kvstore *st);
/* A restore polls *flag (NULL: none) between sections and, once it is
 * non-zero, stops with "restore cancelled": the session stays as it was. */
void muser_kvstore_set_cancel(muser_kvstore *st, const volatile int *flag);

/* A pack as a named file DIR/name (llama.cpp's slot files): the same
 * format and checks; saving replaces an existing file of that name
 * atomically (rename), one writer at a time. name is a plain file name;
 * zstd_level as muser_kvstore_set_compression. *bytes (may be NULL) gets
 * the bytes written or read. */
bool muser_kvpack_save_file(muser_session *s, const muser_sampler *smp, const char *dir, const char *name,
                            const char *key_file, int zstd_level, uint64_t *bytes, muser_error *err);
bool muser_kvpack_restore_file(muser_session *s, muser_sampler *smp, const char *dir, const char *name,
                               const char *key_file, uint64_t *bytes, muser_error *err);

typedef struct muser_kvpack_info {
    uint64_t file_bytes, n_tokens;
    bool has_sampler;
    bool zstd;                  /* KV chunks are zstd frames */
    bool has_dflash;            /* carries a DFlash assistant's context */
    char assistant_sha256[65];  /* that assistant file's SHA-256 ("" without) */
    uint64_t kv_stored_bytes, kv_raw_bytes; /* KV payloads as stored, and decompressed */
    char model_sha256[65], tokenizer_sha256[65], chat_template_sha256[65];
    char lane[17];
    int64_t n_layer, n_head_kv, head_dim, n_vocab, sliding_window;
    uint32_t numerics_abi;
} muser_kvpack_info;

/* Check every byte of the pack at path against the key (key_file as for
 * a store, DIR being the pack's directory) and, with m, its identity.
 * Never writes. info (may be NULL) gets its summary. */
bool muser_kvpack_verify(const char *path, const char *key_file, muser_model *m, muser_kvpack_info *info,
                         muser_error *err);

typedef struct muser_kvstore_gc_stats {
    int64_t packs, removed, temp_removed;
    uint64_t bytes_before, bytes_after;
} muser_kvstore_gc_stats;
/* Evict least recently used packs (restores refresh a pack's access
 * time) until the store holds at most max_bytes of packs, and remove
 * temporary files of writers that died. */
bool muser_kvstore_gc(const char *dir, uint64_t max_bytes, muser_kvstore_gc_stats *st, muser_error *err);

#ifdef __cplusplus
}
#endif
#endif
