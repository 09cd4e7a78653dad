/* `muser serve`: the pieces of the HTTP server and the contract between
 * them.
 *   http.c        the HTTP front over libmicrohttpd: listening, TLS, API key,
 *                 body limits, routing, replies and SSE streams (below)
 *   api_openai.c  /v1/models, /v1/completions, /v1/chat/completions
 *   api_llama.c   /completion, /tokenize, /detokenize, /apply-template,
 *                 /props, /slots, /health
 *   metrics.c     /metrics (Prometheus text, vLLM's gauge names)
 *   ui.c          GET /: the chat page built into the binary
 *   sched.c       continuous batching over one engine (sched.h)
 * A route handler runs on its connection's own thread and may block (on
 * srv_job_next); it answers exactly once, with one srv_reply_* call or a
 * stream (srv_stream_begin, sends, srv_stream_end). */
#ifndef MUSER_SERVER_H
#define MUSER_SERVER_H
#include "muser.h"
#include "server/sched.h"
#include <jansson.h>
#include <stdarg.h>

typedef struct srv_params {
    const char *model_path;
    const char *draft_path;     /* DFlash assistant (optional) */
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* default 8080; 0 = any free port (printed) */
    const char *api_key;        /* --api-key, or the first line of --api-key-file */
    const char *ssl_cert_file, *ssl_key_file;
    const char *alias;          /* model id reported by /v1/models (default: the file name) */
    int32_t n_parallel;         /* slots (default 4) */
    int64_t n_ctx;              /* per slot (default: the model's training context) */
    int64_t n_batch;            /* rows per forward (default 512) */
    int64_t prefill_budget;     /* prompt rows beside decode rows per forward; -1 = by backend */
    int32_t max_queue;          /* waiting jobs before 429 (default 64) */
    size_t max_body;            /* bytes of a request body before 413 (default 8 MiB) */
    muser_backend_kind backend;
    int n_threads;
    int32_t sampling_threads;   /* --sampling-threads: threads drawing the slots' tokens, 0 = by backend */
    const char *slot_save_path; /* --slot-save-path: kvpack files of POST /slots/{id}?action=save|restore */
    const char *prompt_cache;   /* --prompt-cache: a kvpack store of prompt prefixes (docs/kvpack.md) */
    uint64_t prompt_cache_quota; /* --prompt-cache-max-size, 0 = none */
} srv_params;

typedef struct srv_server {
    srv_params p;
    muser_model *model;
    muser_model_info info;
    srv_sched *sched;
    char model_id[256];
    double t_start;             /* mu_now() at start */
    volatile int stopping;      /* set by SIGTERM / SIGINT */
} srv_server;

/* One HTTP request as a route sees it. */
typedef struct srv_conn srv_conn;
typedef struct srv_request {
    const char *method;         /* "GET", "POST", ... */
    const char *path;           /* without the query string */
    const char *content_type;   /* NULL when absent */
    const char *body;           /* NUL-terminated copy, body_len bytes */
    size_t body_len;
    srv_conn *conn;
} srv_request;

/* A query-string argument ("?action=save"), NULL when absent. */
const char *srv_query(const srv_request *rq, const char *key);
/* A request header (case-insensitive name), NULL when absent. */
const char *srv_header(const srv_request *rq, const char *name);

/* True once the client has closed its connection: a handler that waits for
 * a job without streaming polls this to cancel it (docs/server.md). */
bool srv_client_gone(const srv_request *rq);

/* Replies (exactly one per request). */
void srv_reply_json(const srv_request *rq, int status, json_t *body); /* takes the reference */
void srv_reply_text(const srv_request *rq, int status, const char *content_type, const char *text, size_t len);
/* OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
 * type: "invalid_request_error" (4xx), "authentication_error" (401),
 * "not_found_error" (404), "server_error" (5xx); param names the field (or
 * NULL). A 429 / 503 also carries Retry-After. */
void srv_reply_error(const srv_request *rq, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Server-sent events: headers go out with begin; each send is one
 * `data: ...\n\n` event (the text as given); false once the client has gone
 * away (then cancel the job and end the stream). */
typedef struct srv_stream srv_stream;
srv_stream *srv_stream_begin(const srv_request *rq, int status);
bool srv_stream_send(srv_stream *st, const char *data, size_t len);
bool srv_stream_send_json(srv_stream *st, json_t *obj); /* takes the reference */
void srv_stream_end(srv_stream *st);

/* Route handlers. */
typedef void (*srv_handler)(srv_server *srv, const srv_request *rq);
void srv_openai_models(srv_server *srv, const srv_request *rq);
void srv_openai_completions(srv_server *srv, const srv_request *rq);
void srv_openai_chat(srv_server *srv, const srv_request *rq);
void srv_llama_completion(srv_server *srv, const srv_request *rq);
void srv_llama_tokenize(srv_server *srv, const srv_request *rq);
void srv_llama_detokenize(srv_server *srv, const srv_request *rq);
void srv_llama_apply_template(srv_server *srv, const srv_request *rq);
void srv_llama_props(srv_server *srv, const srv_request *rq);
void srv_llama_slots(srv_server *srv, const srv_request *rq);        /* GET /slots */
void srv_llama_slot_action(srv_server *srv, const srv_request *rq);  /* POST /slots/{id}?action=... */
void srv_llama_health(srv_server *srv, const srv_request *rq);
void srv_metrics(srv_server *srv, const srv_request *rq);
void srv_ui(srv_server *srv, const srv_request *rq);

/* Every address the host name resolves to is a loopback one (binding
 * elsewhere needs an API key; `muser bench serve` stays on loopback). */
bool srv_host_is_loopback(const char *host);

/* Start listening and serve until srv->stopping; 0 on a clean shutdown.
 * On the way out it stops accepting, lets running jobs finish for a grace
 * period (then cancels them), frees srv->sched and sets it to NULL. */
int srv_http_run(srv_server *srv, muser_error *err);

#endif
