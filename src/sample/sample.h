/* Token sampler: a bit-exact re-implementation of the pinned llama.cpp sampler
 * chain (src/llama-sampler.cpp + common/sampling.cpp), so that a seeded
 * request replays the same tokens in muser and in llama-server.
 *
 * Exactness rests on three things reproduced here, not approximated:
 *  - the RNG: std::mt19937 plus libstdc++'s generate_canonical conversions
 *    (the comparator is a Linux/GCC build, so libstdc++, not libc++);
 *  - the float arithmetic of every sampler, operation for operation (the
 *    build forbids contraction; llama's libllama is built without FMA too);
 *  - the ORDER of candidates after llama's unstable sorts: std::sort and
 *    std::partial_sort are re-implemented move-for-move as libstdc++ does
 *    them, because tie order decides which id a cumulative draw lands on.
 *
 * Layers, bottom up: RNG -> candidate sorting -> individual samplers on a
 * mu_candidates array -> the configured chain (mu_sampler) -> logprobs. */
#ifndef MUSER_SAMPLE_H
#define MUSER_SAMPLE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "util/common.h"

/* ------------------------------------------------------------------ RNG */

/* std::mt19937: 32-bit Mersenne twister, seed-by-integer initialisation. */
typedef struct mu_mt19937 {
    uint32_t x[624];
    uint32_t next; /* index of the next word to temper; 624 = regenerate */
} mu_mt19937;

void mu_mt_seed(mu_mt19937 *r, uint32_t seed);
uint32_t mu_mt_next(mu_mt19937 *r);
/* libstdc++ generate_canonical<double,53>: two draws, first is the low word,
 * sum/2^64 clamped below 1. = uniform_real_distribution<double>(0,1). */
double mu_mt_canonical_f64(mu_mt19937 *r);
/* libstdc++ generate_canonical<float,24>: one draw, (float)u/2^32 clamped
 * below 1. = uniform_real_distribution<float>(0,1) (used by XTC). */
float mu_mt_canonical_f32(mu_mt19937 *r);
/* The same conversions from given engine outputs. */
double mu_canonical_f64(uint32_t lo, uint32_t hi);
float mu_canonical_f32(uint32_t u);

/* LLAMA_DEFAULT_SEED: "pick a random seed". */
#define MU_SEED_RANDOM 0xFFFFFFFFu
/* llama's get_rng_seed: MU_SEED_RANDOM -> fresh OS entropy, else seed. */
uint32_t mu_seed_resolve(uint32_t seed);

/* ----------------------------------------------------------- candidates */

/* Mirrors llama_token_data / llama_token_data_array. `selected` is an index
 * into data (-1 = none); `sorted` means data is in descending logit order. */
typedef struct mu_token_data {
    int32_t id;
    float logit;
    float p;
} mu_token_data;

typedef struct mu_candidates {
    mu_token_data *data;
    size_t size;
    int64_t selected;
    bool sorted;
} mu_candidates;

/* Scratch shared by the samplers; grows on demand, zero-initialise it and
 * release it with mu_sample_work_free. Holds nothing between calls. */
typedef struct mu_sample_work {
    mu_token_data *tok;
    size_t tok_cap;
    int32_t *bucket;
    size_t bucket_cap;
    float *score;
    size_t *order;
    size_t score_cap;
} mu_sample_work;
void mu_sample_work_free(mu_sample_work *w);

/* std::sort / std::partial_sort of token data by descending logit, with the
 * exact element moves of libstdc++ (GCC 12 headers), so ties land where they land
 * in llama.cpp. Exposed for tests. */
void mu_cand_std_sort(mu_token_data *a, size_t n);
void mu_cand_std_partial_sort(mu_token_data *a, size_t middle, size_t n);
/* The first k of tok_partial_sort(k) over the candidates of a logits row
 * (ids 0..n-1, banned ids at -INFINITY), built without the n candidates;
 * k <= n. */
void mu_cand_top_k_of_row(mu_token_data *out, const float *logits, size_t n, size_t k, const int32_t *banned,
                          size_t n_banned);
/* llama_token_data_array_partial_sort_inplace: keep the top `npartial`,
 * sorted (std::partial_sort for <= 128, else llama's 128-bucket sort). */
void mu_cand_partial_sort_inplace(mu_candidates *c, size_t npartial, mu_sample_work *w);
/* llama_sampler_softmax_impl: optional sort, then float softmax into p. */
void mu_sample_softmax(mu_candidates *c, bool do_sort, mu_sample_work *w);

/* Internals shared by the sampler's own files. */
void mu_sample_work_reserve(mu_sample_work *w, size_t n); /* every buffer >= n */
size_t mu_sample_bucket_sort(const mu_candidates *c, size_t npartial, mu_sample_work *w);
void mu_sample_sort_indices_by_score(size_t *idx, size_t n, const float *score);
int32_t mu_sample_f2i_x86(float v); /* int(v) as x86 SSE truncates: NaN/overflow -> INT32_MIN */

/* ------------------------------------------------------------- samplers */
/* Each function is the `apply` of the llama sampler of the same name, with
 * its edge cases (min_keep, empty/one-element arrays, disabled values).
 * Where llama would abort on an empty array these return unchanged. */

typedef struct mu_logit_bias {
    int32_t token;
    float bias;
} mu_logit_bias;

void mu_sample_logit_bias(mu_candidates *c, const mu_logit_bias *bias, size_t n);
void mu_sample_top_k(mu_candidates *c, int32_t k, mu_sample_work *w);
void mu_sample_top_p(mu_candidates *c, float p, size_t min_keep, mu_sample_work *w);
void mu_sample_min_p(mu_candidates *c, float p, size_t min_keep, mu_sample_work *w);
void mu_sample_typical(mu_candidates *c, float p, size_t min_keep, mu_sample_work *w);
void mu_sample_top_n_sigma(mu_candidates *c, float n, mu_sample_work *w);
/* temp <= 0 keeps only the first maximum (in current order) and sets every
 * other logit to -INFINITY; size is unchanged. */
void mu_sample_temp(mu_candidates *c, float temp);
/* Dynamic temperature (llama temp_ext); delta <= 0 is plain temperature. */
void mu_sample_temp_ext(mu_candidates *c, float temp, float delta, float exponent,
                        mu_sample_work *w);
/* XTC draws one float from its own stream whenever it is enabled and there
 * are >= 2 candidates; it may advance c->data past the removed tokens. */
void mu_sample_xtc(mu_candidates *c, float probability, float threshold, size_t min_keep,
                   mu_mt19937 *rng, mu_sample_work *w);
/* Final draw (llama dist): one f64 draw unless size <= 1 (pinned revision:
 * no draw for a single candidate). Sets c->selected. */
void mu_sample_dist(mu_candidates *c, mu_mt19937 *rng);
/* Mirostat v1 (m = 100 in llama's chain) and v2; both update *mu and draw
 * through libstdc++ std::discrete_distribution (no draw when size < 2). */
void mu_sample_mirostat(mu_candidates *c, int32_t n_vocab, float tau, float eta, int32_t m,
                        float *mu, mu_mt19937 *rng, mu_sample_work *w);
void mu_sample_mirostat_v2(mu_candidates *c, float tau, float eta, float *mu, mu_mt19937 *rng,
                           mu_sample_work *w);
/* libstdc++ std::discrete_distribution<int> over c->data[].p (what llama's
 * mirostat samplers draw with). Returns an index. */
int64_t mu_sample_discrete(const mu_candidates *c, mu_mt19937 *rng);

/* Pure greedy over a logits row: first maximum (lowest id wins ties), ids in
 * `banned` treated as -INFINITY. -1 if nothing is selectable. */
int32_t mu_sample_argmax(const float *logits, size_t n, const int32_t *banned, size_t n_banned);
/* The index of the row's largest value when it is the only one equal to it
 * (+0 and -0 are equal) and every value is finite; -1 otherwise. */
int32_t mu_sample_argmax_unique(const float *x, size_t n);
/* One pass over x[0..n), n >= 1, vectorized (integer maxima over the
 * floats' order in 64-value blocks): the index of the first largest value
 * (-0 counts below +0 here; meaningless when a NaN is present), how many
 * values have exactly its bits, and whether any value is NaN or +inf, or
 * -inf. */
typedef struct mu_row_scan {
    size_t at, n_at;
    bool nan_or_posinf, neginf;
} mu_row_scan;
void mu_sample_scan(const float *x, size_t n, mu_row_scan *out);

/* Repetition penalties over the last `last_n` accepted tokens (llama
 * "penalties"). last_n must be >= 0; 0 disables. */
typedef struct mu_penalties mu_penalties;
mu_penalties *mu_penalties_new(int32_t last_n, float repeat, float freq, float present,
                               int32_t n_vocab);
void mu_penalties_free(mu_penalties *pen);
void mu_penalties_accept(mu_penalties *pen, int32_t token);
void mu_penalties_apply(const mu_penalties *pen, mu_candidates *c);
void mu_penalties_reset(mu_penalties *pen);

/* DRY ("don't repeat yourself"). Sequence breakers are byte strings; llama
 * splits them against the vocabulary's token texts (pieces, as llama's
 * detokenize({id}, special=true) renders them) and tokenizes any remainder
 * with the model tokenizer (no BOS, no special parsing). */
typedef int32_t (*mu_tokenize_fn)(void *ctx, const char *text, size_t len, int32_t *out,
                                  int32_t cap); /* count, or < 0 on failure */
typedef struct mu_dry_config {
    float multiplier, base;
    int32_t allowed_length;
    int32_t last_n;       /* resolved window (> 0), or 0 = disabled */
    int32_t n_ctx_train;  /* llama clamps the scan to the model context */
} mu_dry_config;
typedef struct mu_dry mu_dry;
mu_dry *mu_dry_new(const mu_dry_config *cfg, int32_t n_vocab, const char *const *piece,
                   const size_t *piece_len, const char *const *breakers, size_t n_breakers,
                   mu_tokenize_fn tokenize, void *tokenize_ctx, mu_error *err);
/* Breakers given directly as token sequences (llama's dry_testing entry). */
mu_dry *mu_dry_new_tokens(const mu_dry_config *cfg, int32_t n_vocab, const int32_t *const *seq,
                          const size_t *seq_len, size_t n_seq, mu_error *err);
void mu_dry_free(mu_dry *dry);
void mu_dry_accept(mu_dry *dry, int32_t token);
void mu_dry_apply(mu_dry *dry, mu_candidates *c);
void mu_dry_reset(mu_dry *dry);
/* History, oldest first (out NULL = just count), and its restore (for
 * sampler snapshots). Restore fails if n exceeds the window. */
size_t mu_penalties_history(const mu_penalties *pen, int32_t *out);
bool mu_penalties_restore(mu_penalties *pen, const int32_t *tok, size_t n);
size_t mu_dry_history(const mu_dry *dry, int32_t *out);
bool mu_dry_restore(mu_dry *dry, const int32_t *tok, size_t n);

/* ---------------------------------------------------------------- chain */

typedef enum mu_sampler_kind {
    MU_SAMPLER_PENALTIES,
    MU_SAMPLER_DRY,
    MU_SAMPLER_TOP_N_SIGMA,
    MU_SAMPLER_TOP_K,
    MU_SAMPLER_TYPICAL_P,
    MU_SAMPLER_TOP_P,
    MU_SAMPLER_MIN_P,
    MU_SAMPLER_XTC,
    MU_SAMPLER_TEMPERATURE,
    MU_SAMPLER_KIND_COUNT
} mu_sampler_kind;

#define MU_SAMPLER_MAX_ORDER 32

/* common_params_sampling, with the pinned llama.cpp defaults. Pointers are
 * borrowed by mu_sampler_new, which copies what they point to. */
typedef struct mu_sampler_params {
    uint32_t seed;              /* MU_SEED_RANDOM (default) = random */
    float temp;                 /* 0.80; <= 0 greedy */
    int32_t top_k;              /* 40; <= 0 off */
    float top_p;                /* 0.95; >= 1 off */
    float min_p;                /* 0.05; <= 0 off */
    float typ_p;                /* 1.00 = off */
    float top_n_sigma;          /* -1 = off */
    float xtc_probability;      /* 0.00 = off */
    float xtc_threshold;        /* 0.10; > 0.5 off */
    int32_t penalty_last_n;     /* 64; 0 off, -1 = n_ctx */
    float penalty_repeat;       /* 1.00 */
    float penalty_freq;         /* 0.00 */
    float penalty_present;      /* 0.00 */
    float dry_multiplier;       /* 0.00 = off */
    float dry_base;             /* 1.75 */
    int32_t dry_allowed_length; /* 2 */
    int32_t dry_penalty_last_n; /* -1 = n_ctx (llama.cpp's coded default, not the 64 its docs list; docs/sampling.md) */
    const char *const *dry_breakers; /* default "\n" ":" "\"" "*" */
    size_t n_dry_breakers;
    float dynatemp_range;       /* 0.00 = off */
    float dynatemp_exponent;    /* 1.00 */
    int32_t mirostat;           /* 0 off, 1, 2 */
    float mirostat_tau;         /* 5.00 (ent) */
    float mirostat_eta;         /* 0.10 (lr) */
    int32_t min_keep;           /* 0 */
    const mu_logit_bias *logit_bias;
    size_t n_logit_bias;
    mu_sampler_kind order[MU_SAMPLER_MAX_ORDER];
    size_t n_order;             /* default: penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature */
    int32_t n_ctx;              /* resolves -1 windows like llama-server (slot context); 0 = unknown */
    int32_t n_ctx_train;        /* DRY's scan clamp (model context); 0 = unbounded */
    mu_tokenize_fn dry_tokenize;/* needed only for multi-byte DRY breakers */
    void *dry_tokenize_ctx;
} mu_sampler_params;

void mu_sampler_params_default(mu_sampler_params *p);

/* "penalties;dry;top_k" (llama --samplers: case-insensitive, with llama's
 * aliases top-k/topk, nucleus, temp, typ, ...) and "edskypmxt" (llama
 * --sampling-seq). Unknown entries are refused, all named in err. */
bool mu_sampler_parse_names(const char *text, mu_sampler_kind *order, size_t *n_order,
                            mu_error *err);
bool mu_sampler_parse_chars(const char *text, mu_sampler_kind *order, size_t *n_order,
                            mu_error *err);
const char *mu_sampler_kind_name(mu_sampler_kind k); /* canonical, e.g. "typ_p" */
/* Whether llama would build a working stage for k (else "?name", a no-op). */
bool mu_sampler_stage_active(const mu_sampler_params *p, mu_sampler_kind k);
char mu_sampler_kind_char(mu_sampler_kind k);         /* e.g. 'y' */
/* Order as names joined by ';' / as one-letter chars. Return chars needed. */
size_t mu_sampler_order_names(const mu_sampler_kind *order, size_t n, char *buf, size_t cap);
size_t mu_sampler_order_chars(const mu_sampler_kind *order, size_t n, char *buf, size_t cap);
/* llama's common_params_sampling::print() text and common_sampler_print()
 * chain ("logits -> ?penalties -> ... -> dist "; '?' = inactive stage).
 * Return the length the full text needs (snprintf-style). */
size_t mu_sampler_params_print(const mu_sampler_params *p, char *buf, size_t cap);
size_t mu_sampler_chain_print(const mu_sampler_params *p, char *buf, size_t cap);

/* Grammar hook. accepts(): may `token` come next? apply(): set logit =
 * -INFINITY for every candidate the constraint rejects. */
typedef struct mu_sample_constraint {
    void *ctx;
    bool (*accepts)(void *ctx, int32_t token);
    void (*apply)(void *ctx, mu_candidates *cands);
} mu_sample_constraint;

typedef struct mu_sampler mu_sampler;

/* piece/piece_len: token texts, needed only when DRY is active (piece_len
 * NULL = NUL-terminated pieces). */
mu_sampler *mu_sampler_new(const mu_sampler_params *p, int32_t n_vocab, const char *const *piece,
                           const size_t *piece_len, mu_error *err);
void mu_sampler_free(mu_sampler *s);

/* Run the chain over a full logits row (n_vocab floats, never modified) and
 * return the chosen id. `banned` ids are masked to -INFINITY inside the
 * candidate copy, exactly where llama-server puts ignore-eos (a -INF logit
 * bias). With c != NULL: common_sampler_sample's rejection discipline - run
 * the chain; if c->accepts(winner) done; else rebuild from the logits, apply
 * c->apply first, and run the whole chain again (the rejected pass has
 * already advanced every RNG stream and mirostat's mu, as in llama).
 * Returns -1 (err set) for a banned id out of range, or when no candidate
 * survives (every logit -INFINITY), where llama would emit an arbitrary id. */
int32_t mu_sampler_sample(mu_sampler *s, const float *logits, const int32_t *banned,
                          size_t n_banned, const mu_sample_constraint *c, mu_error *err);
/* A greedy chain (temperature <= 0 with only top-k, top-p and min-p beside
 * it, no bias, no mirostat) never draws: its lone survivor is taken. With
 * this true (the default) such a chain's step skips the chain when the
 * row's maximum is unique, finite and not banned, and returns that argmax,
 * the token the chain returns then (the candidate array is left as the last
 * full pass made it). */
extern int mu_sample_fast_greedy;
/* A chain whose first active stage is top-k (k <= 128, no logit bias) gets
 * its k candidates from the row by mu_cand_top_k_of_row instead of building
 * n_vocab candidates first (the same candidates, in the same order).
 * Both shortcuts: -1 (the default) on unless MUSER_SAMPLE_SHORTCUTS=0;
 * tests set 0 or 1 to compare. */
extern int mu_sample_fuse_top_k;
/* Feed an accepted token (prompt or generated) to penalties and DRY history,
 * like common_sampler_accept. Mirostat's mu moves inside sample, as in llama. */
void mu_sampler_accept(mu_sampler *s, int32_t token);
/* llama_sampler_reset: clear histories, reseed every stream from the
 * configured seed (a new random seed each time when MU_SEED_RANDOM), reset mu. */
void mu_sampler_reset(mu_sampler *s);
/* Seed actually used by the final draw (dist or mirostat stream). */
uint32_t mu_sampler_seed(const mu_sampler *s);
/* A greedy chain (greedy_chain in sampler.c): every draw is the row's
 * maximum when it is unique and finite, and no draw reads the history. */
bool mu_sampler_is_greedy(const mu_sampler *s);
/* The candidate array of the last pass (after the chain), like
 * common_sampler_get_candidates without sorting. Valid until the next call. */
const mu_candidates *mu_sampler_candidates(const mu_sampler *s);

/* Snapshot of all mutable state: every RNG stream (+ its resolved seed),
 * mirostat mu, penalty and DRY histories. A sampler built with the same
 * params and vocabulary, loaded from it, continues the identical sequence.
 * The size depends on the current history length. */
size_t mu_sampler_state_size(const mu_sampler *s);
bool mu_sampler_state_save(const mu_sampler *s, void *buf, size_t cap);
bool mu_sampler_state_load(mu_sampler *s, const void *buf, size_t len, mu_error *err);

/* ------------------------------------------------------------- logprobs */

typedef struct mu_token_logprob {
    int32_t id;
    float logprob;
} mu_token_logprob;

/* OpenAI-style logprobs from a raw logits row: log-softmax with max
 * subtraction and double accumulation. Fills *chosen_out for `chosen` and
 * top[0..n_top) with the n_top most likely tokens, logprob descending, ties
 * by lower id (n_top <= n_vocab; any size). Fails on NaN / +inf logits or a
 * row with no finite logit. */
bool mu_logprobs(const float *logits, size_t n_vocab, int32_t chosen,
                 mu_token_logprob *chosen_out, size_t n_top, mu_token_logprob *top,
                 mu_error *err);

#endif
