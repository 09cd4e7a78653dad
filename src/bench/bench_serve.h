/* `muser bench serve`: load on an HTTP server that streams completions
 * (muser serve, and llama-server beside it), from C client threads over
 * raw HTTP/1.1 on loopback. Per concurrency level: requests/s, aggregate
 * output tokens/s, time to first token and the gaps between consecutive
 * token chunks (inter-token latency), each as the median and CV over
 * repetitions that alternate between the servers. docs/benchmarks.md. */
#ifndef MUSER_BENCH_SERVE_H
#define MUSER_BENCH_SERVE_H
#include "bench/bench.h"
#include <sys/types.h>

/* A server child process listening on host:port. */
typedef struct bs_server {
    char name[32];      /* "muser", "llama-server" */
    char host[64];
    int port;
    pid_t pid;
    int out_fd;         /* muser's stdout pipe (kept open), else -1 */
    char log_path[256]; /* its stderr (and llama-server's stdout) */
} bs_server;

typedef struct bs_spawn {
    const char *exe;        /* the muser binary, or llama-server */
    const char *model_path;
    const char *host;       /* loopback */
    int n_parallel, n_ctx_per_slot, n_threads; /* n_threads 0: the server's default */
    int prefill_budget;     /* muser serve --prefill-budget; -1: its default */
    int sampling_threads;   /* muser serve --sampling-threads; 0: its default */
} bs_spawn;

/* Start `muser serve` (exe: the muser binary) on port 0 and read the URL it
 * prints; or llama-server on a free port. Both then answer /health 200
 * before these return (timeout_s). */
bool bs_spawn_muser(const bs_spawn *sp, bs_server *s, double timeout_s, mu_error *err);
bool bs_spawn_llama(const bs_spawn *sp, bs_server *s, double timeout_s, mu_error *err);
/* SIGTERM, then SIGKILL after a grace period; removes the log. */
void bs_stop(bs_server *s);
/* The last `max` bytes of the server's log (for error messages). */
void bs_log_tail(const bs_server *s, char *out, size_t max);


typedef struct bs_load {
    bool chat;           /* /v1/chat/completions (else /v1/completions) */
    int concurrency;     /* client threads */
    double duration_s;   /* > 0: start requests until then */
    int n_requests;      /* else: this many requests in all */
    int max_tokens;
    bool logprobs;       /* ask for the chosen token's logprob: a chunk for every token
                            (muser sends none for a token whose text is empty) */
} bs_load;

/* One run of the load against one server. */
typedef struct bs_run {
    int n_ok, n_err;
    int64_t tokens;      /* output tokens (the usage figures, else token chunks) */
    double wall_s;       /* first request sent to last response ended */
    double req_per_s, tok_per_s;
    double ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms;
    /* muser only (its /metrics before and after the run; 0 when unknown):
     * per engine step, ms in the batched forward, ms handing rows to the
     * requests (sampling, detokenizing, events), tokens generated */
    double step_ms, take_ms, tokens_per_step;
    char first_error[256];
} bs_run;

/* muser serve's engine counters (/metrics). */
typedef struct bs_counters {
    double steps, step_s, take_s, tokens;
} bs_counters;
bool bs_engine_counters(const bs_server *s, bs_counters *c);

bool bs_run_load(const bs_server *s, const bs_load *l, bs_run *out);

/* Linear-interpolated percentile (p in [0, 100]) of n values (sorted in place). */
double bs_percentile(double *v, size_t n, double p);

#endif
