/* `muser bench`: throughput measurement of the forward pass, the machine's
 * memory read bandwidth, and their reports (JSON that diffs, a PNG plot).
 *
 * Prefill and decode are timed on the model's own forward pass
 * (mu_forward) over a private KV cache, so a context depth can be set up
 * either by a real prefill or by synthetic K/V rows (decode cost does not
 * depend on the cache's contents, and a 64k prefill on a small machine takes
 * an hour). Decode is teacher-forced: a fixed token sequence is fed one
 * token at a time, no sampling, as engine-to-engine comparisons need. */
#ifndef MUSER_BENCH_H
#define MUSER_BENCH_H
#include "muser.h"
#include "util/common.h"

/* A speculation prompt: token ids when ids is set, else text. */
typedef struct mu_bench_prompt {
    const char *text;
    const int32_t *ids;
    int64_t n_ids;
} mu_bench_prompt;

typedef struct mu_bench_opts {
    const char *model_path;
    muser_backend_kind backend;
    int n_threads;            /* 0 = all cores */
    bool use_mlock;           /* lock the model's pages in RAM */
    double pause_s;           /* idle before every timed run (burst-credit machines) */
    int64_t n_prompt;         /* prefill test tokens (0 = skip) */
    int64_t n_gen;            /* decode test tokens (0 = skip) */
    const int64_t *depths;    /* context depths to test (NULL: {0}) */
    int n_depths;
    int reps;                 /* timed repetitions per test (>= 1) */
    int warmup;               /* untimed runs before them */
    int64_t chunk;            /* prefill rows per forward call (0 = the session's default: 512, CUDA 2,048) */
    bool chain;               /* decode on the greedy chain (muser_session_decode_chain): the first
                                 token fed, then each row's pick, no host round trip per token */
    bool prefill_depth;       /* fill depth by real prefill (default: synthetic K/V) */
    double membw_gbs;         /* machine read bandwidth for the % figures (0 = unknown) */
    size_t paired_membw_bytes; /* > 0: also a bandwidth pass over a buffer this large right
                                  before and after each timed decode repetition (host memory:
                                  not with a backend that measures its own) */
    bool membw_backend;       /* measure the bandwidth of the backend's own memory when it can
                                 (mu_backend.read_bandwidth: the GPU's), replacing membw_gbs */
    const int64_t *parallel;  /* --parallel: sequence counts to decode together (NULL: none) */
    int n_parallel;
    int64_t parallel_depth;   /* --parallel-depth: synthetic K/V rows before each sequence's prompt */
    bool interleave;          /* --interleave: the counts' steps alternate one by one */
    const char *draft_path;   /* DFlash assistant: also time greedy generation plain vs speculative */
    const char *spec_prompt;  /* its prompt text (NULL: a Genesis verse) */
    const struct mu_bench_prompt *spec_prompts; /* or a set of them (--spec-prompts) */
    int n_spec_prompts;
    int verify_len;           /* 3, 7, 15 (0 = 7) */
    bool spec_tree;           /* --spec-tree: verify token trees (docs/speculative.md) */
    /* progress lines (no newline), or NULL */
    void (*progress)(void *ctx, const char *line);
    void *progress_ctx;
} mu_bench_opts;

typedef struct mu_bench_stats {
    int n;
    double *samples;          /* tokens/s of each repetition */
    double median, min, max, mean, cv;
} mu_bench_stats;

typedef struct mu_bench_depth {
    int64_t depth;
    mu_bench_stats prefill, decode;
    /* with opts.paired_membw_bytes: the GB/s of the reps + 1 passes around
     * the decode repetitions, and each repetition's weight GB/s as a
     * percentage of the mean of the passes just before and after it */
    mu_bench_stats paired_membw, paired_share;
    double fill_seconds;
} mu_bench_depth;

/* Greedy generation of n_gen tokens after a text prompt, plain and
 * speculative; tokens/s of the part after the prompt. */
typedef struct mu_bench_spec {
    bool ran;
    char draft_name[128];
    int verify_len;
    bool tree;                /* token trees (--spec-tree) */
    int64_t n_prompt, n_gen;  /* n_prompt: the first prompt's */
    int n_prompts;            /* prompts in each repetition; a repetition's speed is their tokens over their seconds */
    double ratio_min, ratio_max; /* the last repetition's lowest and highest speculative / plain ratio of one prompt */
    mu_bench_stats plain, spec;
    int64_t rounds, round_tokens, drafted, accepted; /* summed over the timed repetitions */
} mu_bench_spec;

/* n_seq sequences of one engine decoding together: each step is one
 * forward with one row per sequence (teacher-forced, after a distinct
 * 32-token prompt each, at opts.parallel_depth synthetic K/V rows);
 * tokens/s summed over the sequences. */
typedef struct mu_bench_parallel {
    int64_t n_seq;
    mu_bench_stats aggregate; /* tokens/s of all sequences together */
    mu_bench_stats ratio;     /* per repetition: aggregate over the same repetition's one sequence
                                 (when the first count is 1; the counts alternate within a repetition) */
} mu_bench_parallel;

typedef struct mu_bench_result {
    muser_model_info info;
    char model_name[128], lane[32], backend[32], isa[16];
    int n_threads;
    double load_seconds;
    int n_depths;
    mu_bench_depth *depths;
    mu_bench_spec spec;       /* with opts.draft_path */
    int n_parallel;
    mu_bench_parallel *parallel; /* with opts.parallel */
    double membw_gbs;         /* the bandwidth the % figures use: opts.membw_gbs or the backend's */
    const char *membw_of;     /* "host", "device" or "" (none) */
} mu_bench_result;

void mu_bench_opts_init(mu_bench_opts *o);
bool mu_bench_run(const mu_bench_opts *o, mu_bench_result *r, mu_error *err);
void mu_bench_result_free(mu_bench_result *r);
/* Idle before a timed repetition (opts.pause_s). */
void mu_bench_pause(double seconds);
bool mu_bench_spec_run(const mu_bench_opts *o, muser_model *mm, mu_bench_spec *res, mu_error *err);

/* median/min/max/mean/cv of n samples (copied). */
void mu_bench_stats_compute(mu_bench_stats *s, const double *samples, int n);

/* Sustained read bandwidth in GB/s (1e9 B/s): n_threads threads stream a
 * buffer of `bytes` (much larger than the caches) `reps` times; best pass. */
double mu_bench_membw(int n_threads, size_t bytes, int reps);
/* The same with a buffer kept between measurements (NULL when it cannot be
 * allocated), for a pass right next to each timed decode repetition. */
typedef struct mu_membw mu_membw;
mu_membw *mu_membw_open(int n_threads, size_t bytes);
double mu_membw_measure(mu_membw *m, int reps);
void mu_membw_close(mu_membw *m);

/* Reports. The JSON has a fixed key order and no timestamps, so two runs diff. */
bool mu_bench_write_json(const char *path, const mu_bench_opts *o, const mu_bench_result *r, mu_error *err);
/* Tokens/s (decode and prefill, median with min-max bars) against depth. */
bool mu_bench_write_plot(const char *path, const mu_bench_result *r, mu_error *err);

/* Minimal PNG writer: 8-bit palette image, stored (uncompressed) deflate. */
bool mu_png_write_indexed(const char *path, const uint8_t *pixels, int width, int height, const uint8_t *palette_rgb,
                          int n_colors, mu_error *err);

#endif
