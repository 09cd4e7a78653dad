/* `muser bench serve`: the server processes and the load (bench_serve.h).
 *
 * The clients speak HTTP/1.1 over plain TCP sockets, one connection per
 * request (Connection: close, alike for both servers), and read the
 * response as it comes: the status line and headers, then the body,
 * de-chunked when the server sends Transfer-Encoding: chunked (both
 * libmicrohttpd in src/server/http.c and llama-server stream that way), then
 * split into server-sent-event lines. Every `data:` event with a choice that
 * is not the last one (no finish_reason) is a token chunk, stamped with the time its bytes arrived:
 * the first one gives the time to first token (from the moment the request
 * was sent), the gaps between consecutive ones the inter-token latency.
 * Tokens are counted from the usage object of the last event
 * (stream_options.include_usage), else one per token chunk. */
#include "bench/bench_serve.h"
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

double bs_percentile(double *v, size_t n, double p) {
    if (!n) return 0;
    mu_sort_doubles(v, n);
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)pos;
    if (lo + 1 >= n) return v[n - 1];
    double f = pos - (double)lo;
    return v[lo] * (1 - f) + v[lo + 1] * f;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A connected TCP socket to host:port, or -1. */
static int tcp_connect(const char *host, int port) {
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port_s, &hints, &ai)) return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct timeval tv = {600, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* GET path: the status code (-1 when there is no answer); with buf, the
 * response (headers and body, up to cap - 1 bytes, NUL-terminated). */
static int http_get(const char *host, int port, const char *path, char *buf, size_t cap) {
    int fd = tcp_connect(host, port);
    if (fd < 0) return -1;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[512], line[256];
    if (!buf) buf = line, cap = sizeof line;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", path, host, port);
    int code = -1;
    if (send_all(fd, req, (size_t)n)) {
        size_t got = 0;
        ssize_t r;
        while (got < cap - 1 && (r = recv(fd, buf + got, cap - 1 - got, 0)) > 0) {
            got += (size_t)r;
            buf[got] = 0;
            if (buf == line && strchr(buf, '\n')) break; /* the status line is all that is wanted */
        }
        buf[got] = 0;
        if (!strncmp(buf, "HTTP/1.", 7) && strlen(buf) > 12) code = atoi(buf + 9);
    }
    close(fd);
    return code;
}

static int http_get_status(const char *host, int port, const char *path) { return http_get(host, port, path, NULL, 0); }

/* A counter of muser's /metrics text ("name{labels} value" or "name value"). */
static bool metric_value(const char *text, const char *name, double *v) {
    const size_t len = strlen(name);
    for (const char *p = text; (p = strstr(p, name)); p += len) {
        const bool line_start = p == text || p[-1] == '\n';
        if (!line_start || (p[len] != '{' && p[len] != ' ')) continue;
        const char *e = strchr(p, '\n'), *sp = p;
        for (const char *q = p; *q && q != e; q++)
            if (*q == ' ') sp = q;
        if (sp == p) return false;
        *v = strtod(sp + 1, NULL);
        return true;
    }
    return false;
}

bool bs_engine_counters(const bs_server *s, bs_counters *c) {
    enum { CAP = 1 << 16 };
    char *buf = mu_xmalloc(CAP);
    bool ok = http_get(s->host, s->port, "/metrics", buf, CAP) == 200 &&
              metric_value(buf, "muser_steps_total", &c->steps) &&
              metric_value(buf, "muser_step_seconds_total", &c->step_s) &&
              metric_value(buf, "muser_take_seconds_total", &c->take_s) &&
              metric_value(buf, "muser_generation_tokens_total", &c->tokens);
    free(buf);
    return ok;
}

/* ------------------------------------------------------------ server processes */

static bool child_alive(bs_server *s) {
    if (s->pid <= 0) return false;
    int st;
    pid_t r = waitpid(s->pid, &st, WNOHANG);
    if (r == s->pid) {
        s->pid = 0;
        return false;
    }
    return true;
}

void bs_log_tail(const bs_server *s, char *out, size_t max) {
    out[0] = 0;
    FILE *f = s->log_path[0] ? fopen(s->log_path, "rb") : NULL;
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    long from = len > (long)max - 1 ? len - (long)max + 1 : 0;
    fseek(f, from, SEEK_SET);
    size_t n = fread(out, 1, max - 1, f);
    out[n] = 0;
    fclose(f);
}

static bool fail_with_log(bs_server *s, mu_error *err, const char *what) {
    char tail[600];
    bs_log_tail(s, tail, sizeof tail);
    snprintf(err->msg, sizeof err->msg, "%s %s; its log ends:\n%s", s->name, what, tail);
    bs_stop(s);
    return false;
}

static bool wait_health(bs_server *s, double timeout_s, mu_error *err) {
    double t0 = mu_now();
    while (mu_now() - t0 < timeout_s) {
        if (!child_alive(s)) return fail_with_log(s, err, "exited before it was ready");
        if (http_get_status(s->host, s->port, "/health") == 200) return true;
        sleep_s(0.1);
    }
    return fail_with_log(s, err, "did not answer /health with 200 in time");
}

/* fork + exec with stdout to out_fd (or the log) and stderr to the log; the
 * child gets SIGTERM when this process dies, so no server outlives the bench. */
static bool spawn(bs_server *s, char *const argv[], int out_fd, mu_error *err) {
    snprintf(s->log_path, sizeof s->log_path, "/tmp/muser-bench-serve-XXXXXX");
    int log_fd = mkstemp(s->log_path);
    if (log_fd < 0) {
        snprintf(err->msg, sizeof err->msg, "cannot create a log file in /tmp: %s", strerror(errno));
        s->log_path[0] = 0;
        return false;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err->msg, sizeof err->msg, "fork: %s", strerror(errno));
        close(log_fd);
        return false;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(127);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(out_fd >= 0 ? out_fd : log_fd, 1);
        dup2(log_fd, 2);
        execv(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(log_fd);
    s->pid = pid;
    return true;
}

/* The command line both servers share (llama-server's flag names): -m
 * FILE --host H --port P -np N -c CTX [-t T]; muser's adds "serve" first and
 * its --prefill-budget and --sampling-threads. */
typedef struct bs_argv {
    char *argv[24];
    char np[16], ctx[24], th[16], pb[16], st[16];
} bs_argv;

static void server_args(bs_argv *v, const bs_spawn *sp, bool muser, const char *port, long long ctx) {
    snprintf(v->np, sizeof v->np, "%d", sp->n_parallel);
    snprintf(v->ctx, sizeof v->ctx, "%lld", ctx);
    snprintf(v->th, sizeof v->th, "%d", sp->n_threads);
    snprintf(v->pb, sizeof v->pb, "%d", sp->prefill_budget);
    snprintf(v->st, sizeof v->st, "%d", sp->sampling_threads);
    int a = 0;
    v->argv[a++] = (char *)sp->exe;
    if (muser) v->argv[a++] = "serve";
    v->argv[a++] = "-m";
    v->argv[a++] = (char *)sp->model_path;
    v->argv[a++] = "--host";
    v->argv[a++] = (char *)sp->host;
    v->argv[a++] = "--port";
    v->argv[a++] = (char *)port;
    v->argv[a++] = "-np";
    v->argv[a++] = v->np;
    v->argv[a++] = "-c";
    v->argv[a++] = v->ctx;
    if (sp->n_threads > 0) {
        v->argv[a++] = "-t";
        v->argv[a++] = v->th;
    }
    if (muser && sp->prefill_budget >= 0) {
        v->argv[a++] = "--prefill-budget";
        v->argv[a++] = v->pb;
    }
    if (muser && sp->sampling_threads > 0) {
        v->argv[a++] = "--sampling-threads";
        v->argv[a++] = v->st;
    }
    v->argv[a] = NULL;
}

bool bs_spawn_muser(const bs_spawn *sp, bs_server *s, double timeout_s, mu_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "muser");
    snprintf(s->host, sizeof s->host, "%s", sp->host);
    s->out_fd = -1;
    bs_argv v;
    server_args(&v, sp, true, "0", sp->n_ctx_per_slot);
    char *const *argv = v.argv;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC)) {
        snprintf(err->msg, sizeof err->msg, "pipe: %s", strerror(errno));
        return false;
    }
    /* the child's end must survive exec: dup2 onto 1 clears O_CLOEXEC */
    if (!spawn(s, argv, pfd[1], err)) {
        close(pfd[0]);
        close(pfd[1]);
        return false;
    }
    close(pfd[1]);
    s->out_fd = pfd[0];
    /* "muser serve: listening on http://HOST:PORT/ (...)" (src/server/http.c) */
    char line[1024];
    size_t len = 0;
    double t0 = mu_now();
    while (s->port <= 0) {
        double left = timeout_s - (mu_now() - t0);
        if (left <= 0) return fail_with_log(s, err, "did not print its URL in time");
        struct pollfd p = {.fd = s->out_fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) continue;
        ssize_t r = read(s->out_fd, line + len, sizeof line - 1 - len);
        if (r <= 0) return fail_with_log(s, err, "exited before it was ready");
        len += (size_t)r;
        line[len] = 0;
        char *u = strstr(line, "listening on http://");
        char *nl = u ? strchr(u, '\n') : NULL;
        if (u && nl) {
            *nl = 0;
            char *slash = strchr(u + 20, '/');
            if (slash) *slash = 0;
            char *colon = strrchr(u + 20, ':');
            s->port = colon ? atoi(colon + 1) : 0;
            if (s->port <= 0) return fail_with_log(s, err, "printed a URL without a port");
        } else if (len >= sizeof line - 1) {
            len = 0; /* a long line that is not the URL */
        }
    }
    return wait_health(s, timeout_s, err);
}

/* A port nobody listens on now (bind port 0, read it back, let go). */
static int free_port(const char *host) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    if (getaddrinfo(host, "0", &hints, &ai)) return -1;
    int port = -1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && !bind(fd, ai->ai_addr, ai->ai_addrlen)) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (!getsockname(fd, (struct sockaddr *)&ss, &sl))
            port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                                           : ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return port;
}

bool bs_spawn_llama(const bs_spawn *sp, bs_server *s, double timeout_s, mu_error *err) {
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "llama-server");
    snprintf(s->host, sizeof s->host, "%s", sp->host);
    s->out_fd = -1;
    s->port = free_port(sp->host);
    if (s->port <= 0) {
        snprintf(err->msg, sizeof err->msg, "no free port on %s", sp->host);
        return false;
    }
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    bs_argv v;
    /* llama-server's -c is the context of all slots together */
    server_args(&v, sp, false, port, (long long)sp->n_parallel * sp->n_ctx_per_slot);
    char *const *argv = v.argv;
    if (!spawn(s, argv, -1, err)) return false;
    return wait_health(s, timeout_s, err);
}

void bs_stop(bs_server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        double t0 = mu_now();
        while (child_alive(s) && mu_now() - t0 < 10) sleep_s(0.02);
        if (s->pid > 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            s->pid = 0;
        }
    }
    if (s->out_fd >= 0) close(s->out_fd);
    s->out_fd = -1;
    if (s->log_path[0]) unlink(s->log_path);
    s->log_path[0] = 0;
}

/* ------------------------------------------------------------ one request */

/* Varied prompts, so the servers do not answer one prompt over and over;
 * request i takes prompt i mod the count (the same sequence for both). */
static const char *const k_prompts[] = {
    "The history of the printing press begins",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator moves heat from inside to outside.",
    "List five uses of copper and why it suits each.",
    "Once upon a time, in a village at the edge of a great forest,",
    "Describe the water cycle to a ten-year-old.",
    "What are the main differences between a compiler and an interpreter?",
    "The recipe for a simple bread needs flour, water, salt and yeast. First,",
    "Summarize the rules of chess in a few sentences.",
    "A train leaves the station at nine in the morning travelling at sixty miles an hour.",
    "Translate into plain words: the mitochondria is the powerhouse of the cell.",
    "Give three tips for writing clear technical documentation.",
    "In the year 2150, the first city on Mars",
    "Why is the sky blue during the day and red at sunset?",
    "Dear diary, today was the strangest day of my life because",
    "How do bees communicate the location of flowers to the hive?",
};
#define N_PROMPTS (sizeof k_prompts / sizeof *k_prompts)

typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec;

static void dvec_push(dvec *d, double x) {
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 256;
        d->v = mu_xrealloc(d->v, d->cap * sizeof *d->v);
    }
    d->v[d->n++] = x;
}

typedef struct client {
    const bs_server *s;
    const bs_load *l;
    atomic_int *next;
    double t_start, deadline;
    /* results */
    dvec ttft, itl;
    int n_ok, n_err;
    int64_t tokens;
    double t_end;
    char first_error[256];
} client;

typedef struct resp {
    /* raw bytes not yet consumed */
    char *raw;
    size_t raw_len, raw_cap;
    bool in_body, chunked, done;
    int status;
    int64_t chunk_left; /* bytes left in the current chunk; -1: a size line is next */
    bool chunk_crlf;    /* a CRLF after chunk data is next */
    mu_buf body;        /* de-chunked body not yet split into lines */
    size_t body_off;
    /* the event stream */
    double t0, t_last;
    int64_t chunks, usage_tokens;
    bool seen_token;
    char err[256];
} resp;

static void set_err(resp *r, const char *fmt, const char *arg) {
    if (!r->err[0]) snprintf(r->err, sizeof r->err, fmt, arg);
}

/* One `data:` payload that arrived at time t. */
static void on_event(client *c, resp *r, const char *data, size_t n, double t) {
    if (n == 6 && !memcmp(data, "[DONE]", 6)) {
        r->done = true;
        return;
    }
    json_error_t je;
    json_t *o = json_loadb(data, n, 0, &je);
    if (!o) {
        set_err(r, "an event that is not JSON: %.200s", data);
        return;
    }
    json_t *e = json_object_get(o, "error");
    if (e) {
        json_t *m = json_object_get(e, "message");
        set_err(r, "error event: %.200s", json_is_string(m) ? json_string_value(m) : "?");
    }
    json_t *ch = json_object_get(o, "choices");
    size_t i;
    json_t *choice;
    bool text = false;
    json_array_foreach(ch, i, choice) {
        /* a token's chunk: not the last one (finish_reason set), and in chat
         * not the opening role-only delta; its text may be empty (a token that
         * renders as nothing: llama-server still sends its chunk) */
        json_t *fr = json_object_get(choice, "finish_reason");
        if (fr && !json_is_null(fr)) continue;
        if (c->l->chat) {
            json_t *d = json_object_get(choice, "delta");
            json_t *v = json_object_get(d, "content");
            if (json_object_get(d, "role") && !(json_is_string(v) && json_string_length(v))) continue;
        }
        text = true;
    }
    if (text) {
        if (!r->seen_token) dvec_push(&c->ttft, t - r->t0);
        else dvec_push(&c->itl, t - r->t_last);
        r->seen_token = true;
        r->t_last = t;
        r->chunks++;
    }
    json_t *u = json_object_get(o, "usage");
    json_t *ct = json_object_get(u, "completion_tokens");
    if (json_is_integer(ct)) r->usage_tokens = json_integer_value(ct);
    json_decref(o);
}

/* Split the de-chunked body into lines; `data:` ones are events. */
static void body_lines(client *c, resp *r, double t) {
    for (;;) {
        char *p = r->body.p + r->body_off, *end = r->body.p + r->body.len;
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) break;
        size_t n = (size_t)(nl - p);
        if (n && p[n - 1] == '\r') n--;
        if (r->status == 200 && n >= 5 && !memcmp(p, "data:", 5)) {
            const char *d = p + 5;
            size_t dn = n - 5;
            if (dn && *d == ' ') d++, dn--;
            on_event(c, r, d, dn, t);
        }
        r->body_off = (size_t)(nl + 1 - r->body.p);
    }
    if (r->body_off > 65536) { /* drop what is consumed */
        memmove(r->body.p, r->body.p + r->body_off, r->body.len - r->body_off);
        r->body.len -= r->body_off;
        r->body_off = 0;
    }
}

static void body_append(client *c, resp *r, const char *p, size_t n, double t) {
    mu_buf_append(&r->body, p, n);
    body_lines(c, r, t);
}

/* Consume what can be consumed of r->raw; false on a malformed response. */
static bool consume(client *c, resp *r, double t) {
    size_t off = 0;
    if (!r->in_body) {
        char *hend = NULL;
        for (size_t i = 0; i + 3 < r->raw_len; i++)
            if (!memcmp(r->raw + i, "\r\n\r\n", 4)) {
                hend = r->raw + i;
                break;
            }
        if (!hend) return r->raw_len < 65536;
        *hend = 0;
        if (strncmp(r->raw, "HTTP/1.", 7) || strlen(r->raw) < 12) return false;
        r->status = atoi(r->raw + 9);
        for (char *h = strstr(r->raw, "\r\n"); h; h = strstr(h + 2, "\r\n")) {
            char name[32];
            size_t k = 0;
            const char *q = h + 2;
            while (q[k] && q[k] != ':' && k < sizeof name - 1) {
                name[k] = (char)tolower((unsigned char)q[k]);
                k++;
            }
            name[k] = 0;
            if (!strcmp(name, "transfer-encoding") && strstr(q, "chunked")) {
                const char *eol = strstr(q, "\r\n");
                const char *ck = strstr(q, "chunked");
                if (!eol || ck < eol) r->chunked = true;
            }
        }
        r->in_body = true;
        r->chunk_left = -1;
        off = (size_t)(hend + 4 - r->raw);
    }
    while (off < r->raw_len) {
        if (!r->chunked) {
            body_append(c, r, r->raw + off, r->raw_len - off, t);
            off = r->raw_len;
            break;
        }
        if (r->chunk_crlf) {
            if (r->raw_len - off < 2) break;
            off += 2;
            r->chunk_crlf = false;
            continue;
        }
        if (r->chunk_left < 0) {
            char *nl = memchr(r->raw + off, '\n', r->raw_len - off);
            if (!nl) break;
            r->chunk_left = (int64_t)strtoll(r->raw + off, NULL, 16);
            off = (size_t)(nl + 1 - r->raw);
            if (r->chunk_left == 0) {
                r->done = true;
                off = r->raw_len;
                break;
            }
            continue;
        }
        size_t take = r->raw_len - off;
        if ((int64_t)take > r->chunk_left) take = (size_t)r->chunk_left;
        body_append(c, r, r->raw + off, take, t);
        off += take;
        r->chunk_left -= (int64_t)take;
        if (r->chunk_left == 0) {
            r->chunk_left = -1;
            r->chunk_crlf = true;
        }
    }
    memmove(r->raw, r->raw + off, r->raw_len - off);
    r->raw_len -= off;
    return true;
}

static char *request_body(const bs_load *l, int idx) {
    json_t *b = json_object();
    const char *prompt = k_prompts[(size_t)idx % N_PROMPTS];
    if (l->chat) {
        json_t *m = json_pack("[{s:s,s:s}]", "role", "user", "content", prompt);
        json_object_set_new(b, "messages", m);
    } else {
        json_object_set_new(b, "prompt", json_string(prompt));
    }
    json_object_set_new(b, "max_tokens", json_integer(l->max_tokens));
    if (l->logprobs && l->chat) {
        json_object_set_new(b, "logprobs", json_true());
        json_object_set_new(b, "top_logprobs", json_integer(1));
    } else if (l->logprobs) {
        json_object_set_new(b, "logprobs", json_integer(1));
    }
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(b, "temperature", json_real(0.0));
    json_object_set_new(b, "seed", json_integer(1234));
    /* exactly max_tokens tokens from both servers, and a full prefill each time */
    json_object_set_new(b, "ignore_eos", json_true());
    json_object_set_new(b, "cache_prompt", json_false());
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void one_request(client *c, int idx) {
    char *body = request_body(c->l, idx);
    size_t blen = strlen(body);
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                      "Accept: text/event-stream\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                      c->l->chat ? "/v1/chat/completions" : "/v1/completions", c->s->host, c->s->port, blen);
    resp r = {0};
    r.raw_cap = 16384;
    r.raw = mu_xmalloc(r.raw_cap);
    int fd = tcp_connect(c->s->host, c->s->port);
    r.t0 = mu_now();
    bool ok = fd >= 0;
    if (!ok) set_err(&r, "cannot connect%s", "");
    if (ok) {
        mu_buf req = {0};
        mu_buf_append(&req, head, (size_t)hn);
        mu_buf_append(&req, body, blen);
        ok = send_all(fd, req.p, req.len);
        free(req.p);
        if (!ok) set_err(&r, "send failed%s", "");
    }
    while (ok && !r.done) {
        if (r.raw_cap - r.raw_len < 8192) {
            r.raw_cap *= 2;
            r.raw = mu_xrealloc(r.raw, r.raw_cap);
        }
        ssize_t n = recv(fd, r.raw + r.raw_len, r.raw_cap - r.raw_len - 1, 0);
        if (n < 0 && errno == EINTR) continue;
        double t = mu_now();
        if (n <= 0) {
            if (n < 0) set_err(&r, "recv: %s", strerror(errno));
            break;
        }
        r.raw_len += (size_t)n;
        if (!consume(c, &r, t)) {
            set_err(&r, "a malformed HTTP response%s", "");
            ok = false;
        }
    }
    if (fd >= 0) close(fd);
    double t_end = mu_now();
    if (r.status != 200 && !r.err[0]) {
        char excerpt[160] = {0};
        if (r.body.len) snprintf(excerpt, sizeof excerpt, "%.*s", (int)(r.body.len < 150 ? r.body.len : 150), r.body.p);
        snprintf(r.err, sizeof r.err, "HTTP %d: %s", r.status, excerpt);
    }
    if (!r.err[0] && !r.seen_token) snprintf(r.err, sizeof r.err, "the stream had no token");
    if (r.err[0]) {
        c->n_err++;
        if (!c->first_error[0]) snprintf(c->first_error, sizeof c->first_error, "%s", r.err);
    } else {
        c->n_ok++;
        c->tokens += r.usage_tokens > 0 ? r.usage_tokens : r.chunks;
    }
    if (t_end > c->t_end) c->t_end = t_end;
    free(r.raw);
    free(r.body.p);
    free(body);
}

static void *client_main(void *arg) {
    client *c = arg;
    for (;;) {
        if (c->l->duration_s > 0 && mu_now() >= c->deadline) break;
        int idx = atomic_fetch_add(c->next, 1);
        if (c->l->duration_s <= 0 && idx >= c->l->n_requests) break;
        one_request(c, idx);
    }
    return NULL;
}

bool bs_run_load(const bs_server *s, const bs_load *l, bs_run *out) {
    memset(out, 0, sizeof *out);
    bs_counters c0 = {0}, c1 = {0};
    const bool counted = !strcmp(s->name, "muser") && bs_engine_counters(s, &c0);
    int nc = l->concurrency > 0 ? l->concurrency : 1;
    client *cs = mu_xcalloc((size_t)nc, sizeof *cs);
    pthread_t *th = mu_xcalloc((size_t)nc, sizeof *th);
    atomic_int next = 0;
    double t_start = mu_now();
    int started = 0;
    for (int i = 0; i < nc; i++) {
        cs[i] = (client){.s = s, .l = l, .next = &next, .t_start = t_start, .deadline = t_start + l->duration_s};
        if (pthread_create(&th[i], NULL, client_main, &cs[i])) break;
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    dvec ttft = {0}, itl = {0};
    double t_end = t_start;
    for (int i = 0; i < started; i++) {
        client *c = &cs[i];
        out->n_ok += c->n_ok;
        out->n_err += c->n_err;
        out->tokens += c->tokens;
        if (c->t_end > t_end) t_end = c->t_end;
        if (c->first_error[0] && !out->first_error[0]) snprintf(out->first_error, sizeof out->first_error, "%s", c->first_error);
        for (size_t k = 0; k < c->ttft.n; k++) dvec_push(&ttft, c->ttft.v[k]);
        for (size_t k = 0; k < c->itl.n; k++) dvec_push(&itl, c->itl.v[k]);
        free(c->ttft.v);
        free(c->itl.v);
    }
    out->wall_s = t_end - t_start;
    if (out->wall_s > 0) {
        out->req_per_s = out->n_ok / out->wall_s;
        out->tok_per_s = (double)out->tokens / out->wall_s;
    }
    if (counted && bs_engine_counters(s, &c1) && c1.steps > c0.steps) {
        const double steps = c1.steps - c0.steps;
        out->step_ms = 1e3 * (c1.step_s - c0.step_s) / steps;
        out->take_ms = 1e3 * (c1.take_s - c0.take_s) / steps;
        out->tokens_per_step = (c1.tokens - c0.tokens) / steps;
    }
    out->ttft_p50_ms = 1e3 * bs_percentile(ttft.v, ttft.n, 50);
    out->ttft_p99_ms = 1e3 * bs_percentile(ttft.v, ttft.n, 99);
    out->itl_p50_ms = 1e3 * bs_percentile(itl.v, itl.n, 50);
    out->itl_p99_ms = 1e3 * bs_percentile(itl.v, itl.n, 99);
    free(ttft.v);
    free(itl.v);
    free(cs);
    free(th);
    if (started < nc && !out->first_error[0]) snprintf(out->first_error, sizeof out->first_error, "pthread_create failed");
    return started == nc && out->n_err == 0 && out->n_ok > 0;
}
