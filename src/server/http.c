/* The HTTP front of `muser serve` over libmicrohttpd (server.h).
 *
 * libmicrohttpd runs a thread per connection. When a request's body is in,
 * the route's handler starts on a thread of its own, and the connection
 * thread waits until the handler either replies (the reply is queued) or
 * begins a stream (a response whose content-reader callback pulls the
 * events the handler sends). The handler may therefore block on a job
 * while the connection thread keeps watching the socket: a client that
 * hangs up is seen at once (POLLRDHUP), srv_client_gone turns true and
 * srv_stream_send returns false, so the handler cancels its job.
 *
 * Everything a client can get wrong before a handler runs is answered
 * here with an OpenAI error object: 401 (API key), 404 (unknown path), 405
 * (method), 413 (body size), 415 (Content-Type). docs/server.md lists it. */
#include "server/server.h"
#include "gen/gen.h"
#include "util/common.h"
#include <errno.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Seconds in-flight requests get to finish after SIGTERM before their jobs
 * are cancelled. */
#define SRV_SHUTDOWN_GRACE_S 10.0
/* How often waiting threads look at the socket and the stop flag. */
#define SRV_POLL_MS 50

typedef enum conn_state { CS_READING, CS_RUNNING, CS_REPLIED, CS_STREAMING } conn_state;

struct srv_conn {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                   /* the connection thread and the handler thread */
    srv_server *srv;
    struct MHD_Connection *mc;
    int fd;
    conn_state state;
    bool gone;                  /* the client hung up */
    bool dispatched;
    /* the request */
    char *method, *path;
    mu_buf body;
    bool too_big;
    srv_request rq;
    srv_handler handler;
    /* a plain reply */
    int status;
    char *ctype;
    char *data;
    size_t len;
    bool retry_after;
    const char *allow;          /* Allow header of a 405 */
    /* a stream */
    mu_buf out;             /* bytes not yet taken by the reader */
    size_t out_pos;
    bool ended;
};

struct srv_stream {
    srv_conn *c;
};

static pthread_mutex_t g_active_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_active;            /* requests with a handler running */

static void conn_unref(srv_conn *c) {
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left) return;
    if (c->dispatched) {
        pthread_mutex_lock(&g_active_mu);
        g_active--;
        pthread_mutex_unlock(&g_active_mu);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->method);
    free(c->path);
    free(c->body.p);
    free(c->ctype);
    free(c->data);
    free(c->out.p);
    free(c);
}

/* ------------------------------------------------------------ the error object */

static const char *error_type(int status) {
    if (status == 401) return "authentication_error";
    if (status == 403) return "permission_error";
    if (status == 404) return "not_found_error";
    if (status == 429) return "rate_limit_error";
    if (status == 501) return "not_supported_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

static json_t *error_json(int status, const char *param, const char *msg) {
    json_t *e = json_object();
    json_t *m = json_string(msg);
    json_object_set_new(e, "message", m ? m : json_string("(invalid UTF-8 in message)"));
    json_object_set_new(e, "type", json_string(error_type(status)));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", json_integer(status));
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return o;
}

/* ------------------------------------------------------------ request accessors */

const char *srv_query(const srv_request *rq, const char *key) {
    return MHD_lookup_connection_value(rq->conn->mc, MHD_GET_ARGUMENT_KIND, key);
}

const char *srv_header(const srv_request *rq, const char *name) {
    return MHD_lookup_connection_value(rq->conn->mc, MHD_HEADER_KIND, name);
}

bool srv_client_gone(const srv_request *rq) {
    srv_conn *c = rq->conn;
    pthread_mutex_lock(&c->mu);
    bool g = c->gone;
    pthread_mutex_unlock(&c->mu);
    return g;
}

/* ------------------------------------------------------------ replies (handler thread) */

static void set_reply(srv_conn *c, int status, const char *ctype, char *data, size_t len) {
    pthread_mutex_lock(&c->mu);
    if (c->state != CS_RUNNING) {
        pthread_mutex_unlock(&c->mu);
        fprintf(stderr, "muser serve: %s %s answered twice (reply %d dropped)\n", c->method, c->path, status);
        free(data);
        return;
    }
    c->status = status;
    c->ctype = mu_xstrdup(ctype);
    c->data = data;
    c->len = len;
    c->retry_after = status == 429 || status == 503;
    c->state = CS_REPLIED;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void srv_reply_text(const srv_request *rq, int status, const char *content_type, const char *text, size_t len) {
    char *d = mu_xmalloc(len + 1);
    memcpy(d, text, len);
    d[len] = 0;
    set_reply(rq->conn, status, content_type, d, len);
}

void srv_reply_json(const srv_request *rq, int status, json_t *body) {
    char *d = json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
    json_decref(body);
    if (!d) {
        d = mu_xstrdup("{\"error\":{\"message\":\"reply could not be encoded\",\"type\":\"server_error\","
                       "\"param\":null,\"code\":500}}");
        status = 500;
    }
    set_reply(rq->conn, status, "application/json; charset=utf-8", d, strlen(d));
}

void srv_reply_error(const srv_request *rq, int status, const char *param, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_reply_json(rq, status, error_json(status, param, msg));
}

/* ------------------------------------------------------------ streams (handler thread) */

srv_stream *srv_stream_begin(const srv_request *rq, int status) {
    srv_conn *c = rq->conn;
    srv_stream *st = mu_xcalloc(1, sizeof *st);
    st->c = c;
    pthread_mutex_lock(&c->mu);
    if (c->state == CS_RUNNING) {
        c->status = status;
        c->state = CS_STREAMING;
        pthread_cond_broadcast(&c->cv);
    } else {
        fprintf(stderr, "muser serve: %s %s began a stream after its reply\n", c->method, c->path);
        c->gone = true; /* nothing will read it: sends fail */
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

bool srv_stream_send(srv_stream *st, const char *data, size_t len) {
    srv_conn *c = st->c;
    pthread_mutex_lock(&c->mu);
    bool ok = !c->gone && !c->ended;
    if (ok) {
        mu_buf_append(&c->out, "data: ", 6);
        mu_buf_append(&c->out, data, len);
        mu_buf_append(&c->out, "\n\n", 2);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

bool srv_stream_send_json(srv_stream *st, json_t *obj) {
    char *d = json_dumps(obj, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
    json_decref(obj);
    if (!d) return srv_stream_send(st, "{\"error\":{\"message\":\"event could not be encoded\"}}", 50);
    bool ok = srv_stream_send(st, d, strlen(d));
    free(d);
    return ok;
}

void srv_stream_end(srv_stream *st) {
    if (!st) return;
    srv_conn *c = st->c;
    pthread_mutex_lock(&c->mu);
    c->ended = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    free(st);
}

/* ------------------------------------------------------------ connection thread */

/* The peer closed its end (called with c->mu held; cheap). */
static bool peer_gone(srv_conn *c) {
    if (c->fd < 0) return false;
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void timed_wait(srv_conn *c) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += SRV_POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_conn *c = cls;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        size_t avail = c->out.len - c->out_pos;
        if (avail) {
            size_t n = avail < max ? avail : max;
            memcpy(buf, c->out.p + c->out_pos, n);
            c->out_pos += n;
            if (c->out_pos == c->out.len) c->out.len = c->out_pos = 0;
            pthread_mutex_unlock(&c->mu);
            return (ssize_t)n;
        }
        if (c->ended) {
            pthread_mutex_unlock(&c->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (c->gone || peer_gone(c)) {
            c->gone = true;
            pthread_mutex_unlock(&c->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        timed_wait(c);
    }
}

static void add_common_headers(srv_server *srv, struct MHD_Response *r) {
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Server", "muser/" MUSER_VERSION);
    if (srv->stopping) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
}

static enum MHD_Result queue_buffer(srv_server *srv, struct MHD_Connection *mc, int status, const char *ctype,
                                    const char *data, size_t len, bool retry_after, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after) MHD_add_response_header(r, "Retry-After", "1");
    if (allow) MHD_add_response_header(r, "Allow", allow);
    add_common_headers(srv, r);
    enum MHD_Result ret = MHD_queue_response(mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result queue_error(srv_server *srv, struct MHD_Connection *mc, int status, const char *param,
                                   const char *allow, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result queue_error(srv_server *srv, struct MHD_Connection *mc, int status, const char *param,
                                   const char *allow, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *o = error_json(status, param, msg);
    char *d = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
    json_decref(o);
    enum MHD_Result ret = queue_buffer(srv, mc, status, "application/json; charset=utf-8", d, d ? strlen(d) : 0,
                                       status == 429 || status == 503, allow);
    free(d);
    return ret;
}

/* ------------------------------------------------------------ routing */

typedef struct route {
    const char *method, *path;  /* a path ending in '/' matches that prefix plus one segment */
    srv_handler fn;
    bool json;                  /* a JSON body (Content-Type checked) */
    bool open;                  /* answered without the API key */
} route;

static const route g_routes[] = {
    {"GET", "/", srv_ui, false, true},
    {"GET", "/health", srv_llama_health, false, true},
    {"GET", "/v1/health", srv_llama_health, false, true},
    {"GET", "/v1/models", srv_openai_models, false, false},
    {"GET", "/models", srv_openai_models, false, false},
    {"POST", "/v1/completions", srv_openai_completions, true, false},
    {"POST", "/v1/chat/completions", srv_openai_chat, true, false},
    {"POST", "/chat/completions", srv_openai_chat, true, false},
    {"POST", "/completion", srv_llama_completion, true, false},
    {"POST", "/tokenize", srv_llama_tokenize, true, false},
    {"POST", "/detokenize", srv_llama_detokenize, true, false},
    {"POST", "/apply-template", srv_llama_apply_template, true, false},
    {"GET", "/props", srv_llama_props, false, false},
    {"GET", "/slots", srv_llama_slots, false, false},
    {"POST", "/slots/", srv_llama_slot_action, false, false},
    {"GET", "/metrics", srv_metrics, false, false},
};
#define N_ROUTES (sizeof g_routes / sizeof g_routes[0])

static bool path_matches(const char *pattern, const char *path) {
    size_t n = strlen(pattern);
    if (n > 1 && pattern[n - 1] == '/')
        return !strncmp(pattern, path, n) && path[n] && !strchr(path + n, '/');
    return !strcmp(pattern, path);
}

/* The methods a path answers to ("GET, POST"), "" if none. */
static void allowed_methods(const char *path, char *out, size_t cap) {
    out[0] = 0;
    for (size_t i = 0; i < N_ROUTES; i++)
        if (path_matches(g_routes[i].path, path) && !strstr(out, g_routes[i].method)) {
            if (out[0]) strncat(out, ", ", cap - strlen(out) - 1);
            strncat(out, g_routes[i].method, cap - strlen(out) - 1);
        }
}

/* Compares without an early exit, so timing does not tell how much of a
 * guessed key was right. */
static bool key_equal(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < nb; i++) d |= (unsigned char)(a[i < na ? i : 0] ^ b[i]);
    return d == 0;
}

static bool authorized(srv_server *srv, struct MHD_Connection *mc) {
    if (!srv->p.api_key) return true;
    const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && !strncasecmp(h, "Bearer ", 7)) {
        h += 7;
        while (*h == ' ') h++;
        if (key_equal(h, srv->p.api_key)) return true;
    }
    h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "x-api-key");
    return h && key_equal(h, srv->p.api_key);
}

static bool content_type_json(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "application/json", 16)) return false;
    char t = ct[16];
    return t == 0 || t == ';' || t == ' ';
}

static void *handler_main(void *arg) {
    srv_conn *c = arg;
    c->handler(c->srv, &c->rq);
    pthread_mutex_lock(&c->mu);
    bool silent = c->state == CS_RUNNING;
    bool open_stream = c->state == CS_STREAMING && !c->ended;
    pthread_mutex_unlock(&c->mu);
    if (silent) {
        fprintf(stderr, "muser serve: %s %s gave no reply\n", c->method, c->path);
        srv_reply_error(&c->rq, 500, NULL, "the handler of %s %s gave no reply", c->method, c->path);
    } else if (open_stream) {
        srv_stream st = {c};
        srv_stream *p = mu_xmalloc(sizeof *p);
        *p = st;
        srv_stream_end(p);
    }
    conn_unref(c);
    return NULL;
}

/* Run the handler on its own thread; wait until it replies or begins a
 * stream, then queue that. */
static enum MHD_Result dispatch(srv_server *srv, srv_conn *c) {
    c->rq = (srv_request){
        .method = c->method,
        .path = c->path,
        .content_type = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE),
        .body = c->body.p ? c->body.p : "",
        .body_len = c->body.len,
        .conn = c,
    };
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    c->state = CS_RUNNING;
    c->refs = 2;
    c->dispatched = true;
    pthread_mutex_lock(&g_active_mu);
    g_active++;
    pthread_mutex_unlock(&g_active_mu);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, handler_main, c);
    pthread_attr_destroy(&at);
    if (rc) {
        c->refs = 1;
        return queue_error(srv, c->mc, 503, NULL, NULL, "no thread for the request: %s", strerror(rc));
    }
    pthread_mutex_lock(&c->mu);
    while (c->state == CS_RUNNING) {
        if (!c->gone && peer_gone(c)) c->gone = true;
        timed_wait(c);
    }
    if (c->state == CS_REPLIED) {
        int status = c->status;
        char *ctype = c->ctype, *data = c->data;
        size_t len = c->len;
        bool ra = c->retry_after;
        c->ctype = c->data = NULL;
        pthread_mutex_unlock(&c->mu);
        enum MHD_Result r = queue_buffer(srv, c->mc, status, ctype, data, len, ra, NULL);
        free(ctype);
        free(data);
        return r;
    }
    int status = c->status;
    pthread_mutex_unlock(&c->mu);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, c, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    add_common_headers(srv, r);
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_server *srv = cls;
    srv_conn *c = *con_cls;
    if (!c) {
        /* First call: headers only. Everything decidable now is answered now. */
        c = mu_xcalloc(1, sizeof *c);
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        c->refs = 1;
        c->srv = srv;
        c->mc = mc;
        c->fd = -1;
        c->method = mu_xstrdup(method);
        c->path = mu_xstrdup(url);
        *con_cls = c;
        if (!strcmp(method, "OPTIONS")) {
            /* CORS preflight for browser clients on other origins. */
            struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key");
            MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
            add_common_headers(srv, r);
            enum MHD_Result ret = MHD_queue_response(mc, 204, r);
            MHD_destroy_response(r);
            return ret;
        }
        const route *rt = NULL;
        for (size_t i = 0; i < N_ROUTES && !rt; i++)
            if (!strcmp(g_routes[i].method, method) && path_matches(g_routes[i].path, url)) rt = &g_routes[i];
        if (!rt || !rt->open) {
            if (!authorized(srv, mc))
                return queue_error(srv, mc, 401, NULL, NULL,
                                   "missing or invalid API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
        }
        if (!rt) {
            char allow[64];
            allowed_methods(url, allow, sizeof allow);
            if (allow[0])
                return queue_error(srv, mc, 405, NULL, allow, "method %s is not allowed on %s (allowed: %s)", method,
                                   url, allow);
            return queue_error(srv, mc, 404, NULL, NULL, "no route %s %s", method, url);
        }
        if (srv->stopping) return queue_error(srv, mc, 503, NULL, NULL, "the server is shutting down");
        if (rt->json) {
            const char *ct = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
            if (!content_type_json(ct))
                return queue_error(srv, mc, 415, "Content-Type", NULL,
                                   "%s needs 'Content-Type: application/json' (got %s%s%s)", url, ct ? "'" : "",
                                   ct ? ct : "none", ct ? "'" : "");
        }
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || *end || n > srv->p.max_body)
                return queue_error(srv, mc, 413, NULL, NULL, "request body of %s bytes exceeds the limit of %zu bytes",
                                   cl, srv->p.max_body);
        }
        c->handler = rt->fn;
        return MHD_YES;
    }
    if (c->dispatched) return MHD_NO; /* a second final call cannot happen */
    if (*upload_size) {
        if (c->body.len + *upload_size > srv->p.max_body) c->too_big = true;
        if (!c->too_big) mu_buf_append(&c->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (!c->handler) return MHD_YES; /* a response is queued already */
    if (c->too_big) {
        c->handler = NULL;
        return queue_error(srv, mc, 413, NULL, NULL, "request body exceeds the limit of %zu bytes", srv->p.max_body);
    }
    if (!c->body.p) mu_buf_append(&c->body, "", 0);
    return dispatch(srv, c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)mc;
    srv_conn *c = *con_cls;
    if (!c) return;
    *con_cls = NULL;
    pthread_mutex_lock(&c->mu);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || c->state == CS_RUNNING || (c->state == CS_STREAMING && !c->ended))
        c->gone = true;
    c->fd = -1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    conn_unref(c);
}

/* ------------------------------------------------------------ listening */

static int active_requests(void) {
    pthread_mutex_lock(&g_active_mu);
    int n = g_active;
    pthread_mutex_unlock(&g_active_mu);
    return n;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int srv_http_run(srv_server *srv, muser_error *err) {
    char *cert = NULL, *key = NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (srv->p.ssl_cert_file || srv->p.ssl_key_file) {
        if (!srv->p.ssl_cert_file || !srv->p.ssl_key_file) {
            snprintf(err->msg, sizeof err->msg, "--ssl-cert-file and --ssl-key-file go together");
            return 1;
        }
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            snprintf(err->msg, sizeof err->msg,
                     "this libmicrohttpd was built without TLS: --ssl-cert-file / --ssl-key-file are unavailable");
            return 1;
        }
        const char *files[2] = {srv->p.ssl_cert_file, srv->p.ssl_key_file};
        char **dst[2] = {&cert, &key};
        for (int i = 0; i < 2; i++) {
            FILE *f = fopen(files[i], "rb");
            if (!f) {
                snprintf(err->msg, sizeof err->msg, "%s: %s", files[i], strerror(errno));
                free(cert);
                return 1;
            }
            mu_buf b = {0};
            char buf[4096];
            size_t n;
            while ((n = fread(buf, 1, sizeof buf, f)) > 0 && b.len < (1u << 20)) mu_buf_append(&b, buf, n);
            fclose(f);
            if (!b.len || !strstr(b.p, "-----BEGIN ")) {
                snprintf(err->msg, sizeof err->msg, "%s: not a PEM file", files[i]);
                free(b.p);
                free(cert);
                return 1;
            }
            *dst[i] = b.p;
        }
        flags |= MHD_USE_TLS;
    }

    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", srv->p.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int gai = getaddrinfo(srv->p.host, port_s, &hints, &ai);
    if (gai) {
        snprintf(err->msg, sizeof err->msg, "--host %s: %s", srv->p.host, gai_strerror(gai));
        free(cert);
        free(key);
        return 1;
    }
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d;
    if (cert)
        d = MHD_start_daemon(flags, (uint16_t)srv->p.port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR,
                             ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_HTTPS_MEM_CERT, cert,
                             MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_END);
    else
        d = MHD_start_daemon(flags, (uint16_t)srv->p.port, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR,
                             ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s:%d%s", srv->p.host, srv->p.port,
                 cert ? " (or the TLS certificate / key was refused)" : " (address in use?)");
        free(cert);
        free(key);
        return 1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : srv->p.port;
    bool v6 = strchr(srv->p.host, ':') != NULL;
    printf("muser serve: listening on %s://%s%s%s:%d/ (model %s, %d slots)\n", cert ? "https" : "http",
           v6 ? "[" : "", srv->p.host, v6 ? "]" : "", port, srv->model_id, srv->p.n_parallel);
    fflush(stdout);

    while (!srv->stopping) sleep_ms(100);

    /* Shutdown: no new connections; running requests get a grace period,
     * then their jobs are cancelled and their streams end. */
    fprintf(stderr, "muser serve: stopping (%d requests in flight)\n", active_requests());
    MHD_socket ls = MHD_quiesce_daemon(d);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    double t0 = mu_now();
    while (active_requests() > 0 && mu_now() - t0 < SRV_SHUTDOWN_GRACE_S) sleep_ms(50);
    bool finished = active_requests() == 0;
    if (!finished) fprintf(stderr, "muser serve: grace period over, cancelling %d requests\n", active_requests());
    srv_sched *s = srv->sched;
    srv->sched = NULL;
    if (s) srv_sched_free(s, finished);
    /* The handlers see their jobs end and close their streams. */
    t0 = mu_now();
    while (active_requests() > 0 && mu_now() - t0 < 5.0) sleep_ms(20);
    MHD_stop_daemon(d);
    free(cert);
    free(key);
    return 0;
}

bool srv_host_is_loopback(const char *host) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (!host || getaddrinfo(host, NULL, &hints, &ai)) return false;
    bool all = ai != NULL;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            const struct sockaddr_in *s = (const void *)a->ai_addr;
            all &= (ntohl(s->sin_addr.s_addr) >> 24) == 127;
        } else if (a->ai_family == AF_INET6) {
            const struct sockaddr_in6 *s = (const void *)a->ai_addr;
            all &= memcmp(&s->sin6_addr, &in6addr_loopback, sizeof in6addr_loopback) == 0;
        } else {
            all = false;
        }
    }
    freeaddrinfo(ai);
    return all;
}
