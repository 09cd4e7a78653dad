/* muser bench serve: starts `muser serve` (this binary) and, with
 * --llama-server, llama-server on the same GGUF, both on loopback, and puts
 * streaming load on them at each concurrency level: warm-up, then
 * repetitions that alternate between the servers (muser, llama-server,
 * muser, ...) so a drifting machine weighs on both alike. Per server and
 * level: requests/s, aggregate output tokens/s, TTFT and inter-token
 * latency p50/p99, as the median and CV over the repetitions
 * (src/bench/bench_serve.c, docs/benchmarks.md). */
#include "bench/bench_serve.h"
#include "server/server.h"
#include "cli.h"
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: muser bench serve [-m MODEL] [options]\n\n"
            "  -m, --model FILE       GGUF to serve (default: $MUSER_MODEL, else the shipped model)\n"
            "  --concurrency N[,N..]  concurrent streams (client threads) per level (default 1,4,8,16)\n"
            "  --duration S           seconds of load per level and repetition (default 10)\n"
            "  --requests N           instead: this many requests per level and repetition\n"
            "  --max-tokens N         tokens per request (ignore_eos: exactly N; default 128)\n"
            "  --parallel P           server slots (default: the largest concurrency)\n"
            "  -c, --ctx-size N       context of each slot, the same for both servers (default 1024;\n"
            "                         llama-server gets -c P*N, its -c being the total)\n"
            "  --llama-server PATH    also run llama-server on the same file, alternating with muser\n"
            "  --endpoint NAME        completions (/v1/completions, default) or chat (/v1/chat/completions)\n"
            "  --logprobs             ask both servers for the chosen token's logprob, so every token has\n"
            "                         a chunk (muser sends none for a token whose text is empty)\n"
            "  -r, --reps N           timed repetitions per level and server (default 3)\n"
            "  --warmup N             untimed requests per stream before each level (default 1)\n"
            "  --pause SECONDS        idle before each timed repetition (VMs that throttle sustained load)\n"
            "  -t, --threads N        threads of each server (default: theirs, all cores)\n"
            "  --prefill-budget N     muser serve's --prefill-budget (default: its own)\n"
            "  --sampling-threads N   muser serve's --sampling-threads (default: its own)\n"
            "  --host ADDR            loopback address to serve on (default 127.0.0.1)\n"
            "  --json FILE            write the results as JSON ('-' = stdout)\n"
            "  -q, --quiet            no progress lines\n");
}

typedef struct opts {
    const char *model, *llama, *json, *host;
    int32_t *conc;
    int64_t n_conc;
    int64_t duration, requests, max_tokens, parallel, ctx, reps, warmup, threads, budget, sampling_threads;
    double pause;
    bool chat, quiet, duration_given, logprobs;
} opts;

typedef struct level_result {
    int concurrency;
    bs_run *runs; /* reps */
    int n_ok, n_err;
    char first_error[256];
    mu_bench_stats req_s, tok_s, ttft50, ttft99, itl50, itl99, step_ms, take_ms, tok_step;
} level_result;

static int parse(int argc, char **argv, opts *o) {
    o->duration = 10;
    o->max_tokens = 128;
    o->ctx = 1024;
    o->reps = 3;
    o->warmup = 1;
    o->budget = -1;
    o->host = "127.0.0.1";
    const char *conc = "1,4,8,16", *v = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("bench serve", argc, argv, &i, &o->model);
        else if (!strcmp(a, "--concurrency")) ok = cli_value("bench serve", argc, argv, &i, &conc);
        else if (!strcmp(a, "--duration"))
            ok = (o->duration_given = true) && cli_value("bench serve", argc, argv, &i, &v) &&
                 cli_parse_i64("bench serve", a, v, 1, 3600, &o->duration);
        else if (!strcmp(a, "--requests"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 1, 1000000, &o->requests);
        else if (!strcmp(a, "--max-tokens"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 1, 1 << 20, &o->max_tokens);
        else if (!strcmp(a, "--parallel") || !strcmp(a, "-np"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 1, 4096, &o->parallel);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 16, 1 << 24, &o->ctx);
        else if (!strcmp(a, "-r") || !strcmp(a, "--reps"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 1, 1000, &o->reps);
        else if (!strcmp(a, "--warmup"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 0, 100, &o->warmup);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--prefill-budget"))
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_i64("bench serve", a, v, 0, 65536, &o->budget);
        else if (!strcmp(a, "--sampling-threads"))
            ok = cli_value("bench serve", argc, argv, &i, &v) &&
                 cli_parse_i64("bench serve", a, v, 1, 256, &o->sampling_threads);
        else if (!strcmp(a, "--pause")) {
            float secs = 0;
            ok = cli_value("bench serve", argc, argv, &i, &v) && cli_parse_f32("bench serve", a, v, &secs);
            if (ok && (secs < 0 || secs > 600)) {
                fprintf(stderr, "muser bench serve: --pause must be in [0, 600] seconds, got %s\n", v);
                ok = false;
            }
            o->pause = secs;
        } else if (!strcmp(a, "--llama-server")) ok = cli_value("bench serve", argc, argv, &i, &o->llama);
        else if (!strcmp(a, "--json")) ok = cli_value("bench serve", argc, argv, &i, &o->json);
        else if (!strcmp(a, "--host")) ok = cli_value("bench serve", argc, argv, &i, &o->host);
        else if (!strcmp(a, "--endpoint")) {
            ok = cli_value("bench serve", argc, argv, &i, &v);
            if (ok && !strcmp(v, "chat")) o->chat = true;
            else if (ok && strcmp(v, "completions")) {
                fprintf(stderr, "muser bench serve: --endpoint is completions or chat, not '%s'\n", v);
                ok = false;
            }
        } else if (!strcmp(a, "--logprobs")) o->logprobs = true;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = true;
        else {
            fprintf(stderr, "muser bench serve: unknown option '%s' (see muser bench serve --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (!cli_parse_ids("bench serve", "--concurrency", conc, &o->conc, &o->n_conc) || o->n_conc < 1 || o->n_conc > 32) {
        if (o->n_conc > 32) fprintf(stderr, "muser bench serve: --concurrency takes at most 32 levels\n");
        return 2;
    }
    int64_t max_c = 0;
    for (int64_t i = 0; i < o->n_conc; i++) {
        if (o->conc[i] < 1 || o->conc[i] > 1024) {
            fprintf(stderr, "muser bench serve: --concurrency %d: levels are 1 to 1024 streams\n", o->conc[i]);
            return 2;
        }
        if (o->conc[i] > max_c) max_c = o->conc[i];
    }
    if (o->requests && o->duration_given) {
        fprintf(stderr, "muser bench serve: give --duration or --requests, not both\n");
        return 2;
    }
    if (o->requests) o->duration = 0;
    if (!o->parallel) o->parallel = max_c;
    if (o->max_tokens + 64 > o->ctx) {
        fprintf(stderr,
                "muser bench serve: --max-tokens %lld does not fit a %lld-token slot with the prompt (raise -c)\n",
                (long long)o->max_tokens, (long long)o->ctx);
        return 2;
    }
    if (!srv_host_is_loopback(o->host)) {
        fprintf(stderr, "muser bench serve: --host %s is not a loopback address: the benchmark runs on this machine "
                        "only (127.0.0.1 or ::1)\n", o->host);
        return 2;
    }
    if (o->llama && access(o->llama, X_OK)) {
        fprintf(stderr, "muser bench serve: --llama-server %s is not an executable file\n", o->llama);
        return 2;
    }
    if (!cli_model_or_default("bench serve", &o->model)) return 2;
    if (access(o->model, R_OK)) {
        fprintf(stderr, "muser bench serve: cannot read %s\n", o->model);
        return 2;
    }
    return -1;
}

static void stats_of(mu_bench_stats *s, const bs_run *runs, int n, size_t field_off) {
    double v[1000];
    for (int i = 0; i < n; i++) v[i] = *(const double *)((const char *)&runs[i] + field_off);
    mu_bench_stats_compute(s, v, n);
}

static void finish_level(level_result *lr, int reps) {
    stats_of(&lr->req_s, lr->runs, reps, offsetof(bs_run, req_per_s));
    stats_of(&lr->tok_s, lr->runs, reps, offsetof(bs_run, tok_per_s));
    stats_of(&lr->ttft50, lr->runs, reps, offsetof(bs_run, ttft_p50_ms));
    stats_of(&lr->ttft99, lr->runs, reps, offsetof(bs_run, ttft_p99_ms));
    stats_of(&lr->itl50, lr->runs, reps, offsetof(bs_run, itl_p50_ms));
    stats_of(&lr->itl99, lr->runs, reps, offsetof(bs_run, itl_p99_ms));
    stats_of(&lr->step_ms, lr->runs, reps, offsetof(bs_run, step_ms));
    stats_of(&lr->take_ms, lr->runs, reps, offsetof(bs_run, take_ms));
    stats_of(&lr->tok_step, lr->runs, reps, offsetof(bs_run, tokens_per_step));
}

static void json_stats(FILE *f, const char *key, const mu_bench_stats *s, bool last) {
    fprintf(f, "        \"%s\": {\"median\": %.4f, \"cv\": %.4f, \"min\": %.4f, \"max\": %.4f, \"samples\": [", key,
            s->median, s->cv, s->min, s->max);
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%.4f", i ? ", " : "", s->samples[i]);
    fprintf(f, "]}%s\n", last ? "" : ",");
}

static bool write_json(const opts *o, const char *const *names, int n_srv, level_result *res[2], const char *llama_ver) {
    FILE *f = !strcmp(o->json, "-") ? stdout : fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "muser bench serve: cannot write %s\n", o->json);
        return false;
    }
    fprintf(f, "{\n  \"muser_bench_serve\": 1,\n  \"model\": ");
    cli_json_str(f, o->model);
    fprintf(f, ",\n  \"endpoint\": \"%s\",\n", o->chat ? "/v1/chat/completions" : "/v1/completions");
    fprintf(f, "  \"max_tokens\": %lld,\n  \"duration_s\": %lld,\n  \"requests\": %lld,\n", (long long)o->max_tokens,
            (long long)o->duration, (long long)o->requests);
    fprintf(f, "  \"reps\": %lld,\n  \"warmup\": %lld,\n  \"threads\": %lld,\n  \"parallel\": %lld,\n  \"ctx_per_slot\": %lld,\n",
            (long long)o->reps, (long long)o->warmup, (long long)o->threads, (long long)o->parallel, (long long)o->ctx);
    fprintf(f, "  \"logprobs\": %s,\n", o->logprobs ? "true" : "false");
    fprintf(f, "  \"prefill_budget\": %lld,\n", (long long)o->budget);
    fprintf(f, "  \"sampling_threads\": %lld,\n", (long long)o->sampling_threads);
    fprintf(f, "  \"pause_s\": %.3f,\n  \"llama_server\": ", o->pause);
    if (o->llama) cli_json_str(f, o->llama);
    else fprintf(f, "null");
    fprintf(f, ",\n  \"llama_server_version\": ");
    if (llama_ver && llama_ver[0]) cli_json_str(f, llama_ver);
    else fprintf(f, "null");
    fprintf(f, ",\n  \"results\": [\n");
    for (int64_t li = 0; li < o->n_conc; li++)
        for (int s = 0; s < n_srv; s++) {
            const level_result *lr = &res[s][li];
            fprintf(f, "    {\n      \"server\": \"%s\",\n      \"concurrency\": %d,\n", names[s], lr->concurrency);
            fprintf(f, "      \"requests_ok\": %d,\n      \"errors\": %d,\n", lr->n_ok, lr->n_err);
            fprintf(f, "      \"metrics\": {\n");
            json_stats(f, "requests_per_s", &lr->req_s, false);
            json_stats(f, "tokens_per_s", &lr->tok_s, false);
            json_stats(f, "ttft_p50_ms", &lr->ttft50, false);
            json_stats(f, "ttft_p99_ms", &lr->ttft99, false);
            json_stats(f, "itl_p50_ms", &lr->itl50, false);
            const bool eng = lr->step_ms.median > 0;
            json_stats(f, "itl_p99_ms", &lr->itl99, !eng);
            if (eng) {
                json_stats(f, "engine_step_ms", &lr->step_ms, false);
                json_stats(f, "engine_take_ms", &lr->take_ms, false);
                json_stats(f, "engine_tokens_per_step", &lr->tok_step, true);
            }
            fprintf(f, "      }\n    }%s\n", li == o->n_conc - 1 && s == n_srv - 1 ? "" : ",");
        }
    fprintf(f, "  ]\n}\n");
    if (f != stdout) fclose(f);
    return true;
}

/* The first line of `llama-server --version` (its build number and commit). */
static void llama_version(const char *exe, char *out, size_t max) {
    out[0] = 0;
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "'%s' --version 2>&1", exe);
    if (strchr(exe, '\'')) return;
    FILE *p = popen(cmd, "r");
    if (!p) return;
    char line[512];
    while (fgets(line, sizeof line, p))
        if (!out[0] && strstr(line, "version")) {
            line[strcspn(line, "\r\n")] = 0;
            size_t n = strlen(line) < max - 1 ? strlen(line) : max - 1;
            memcpy(out, line, n);
            out[n] = 0;
        }
    pclose(p);
}

int cmd_bench_serve(int argc, char **argv) {
    opts o = {0};
    int rc = parse(argc, argv, &o);
    if (rc >= 0) {
        free(o.conc);
        return rc;
    }
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "muser bench serve: cannot find this binary (/proc/self/exe)\n");
        free(o.conc);
        return 1;
    }
    self[sl] = 0;
    const int n_srv = o.llama ? 2 : 1;
    const char *names[2] = {"muser", "llama-server"};
    char llama_ver[256] = {0};
    if (o.llama) llama_version(o.llama, llama_ver, sizeof llama_ver);

    if (!o.quiet) {
        if (o.duration > 0) {
            double est = (double)o.n_conc * (double)n_srv * (double)o.reps * ((double)o.duration + o.pause);
            fprintf(stderr,
                    "[bench serve] estimate: about %.0f s of timed load (%lld levels x %d servers x %lld reps x %lld s + pause), "
                    "plus start-up, warm-up and the streams in flight at each deadline\n",
                    est, (long long)o.n_conc, n_srv, (long long)o.reps, (long long)o.duration);
        } else {
            fprintf(stderr,
                    "[bench serve] estimate: %lld levels x %d servers x %lld reps x %lld requests of %lld tokens "
                    "(the time is what the servers take)\n",
                    (long long)o.n_conc, n_srv, (long long)o.reps, (long long)o.requests, (long long)o.max_tokens);
        }
    }

    bs_server srv[2];
    memset(srv, 0, sizeof srv);
    for (int s = 0; s < 2; s++) srv[s].out_fd = -1;
    bs_spawn sp = {.model_path = o.model, .host = o.host, .n_parallel = (int)o.parallel,
                   .n_ctx_per_slot = (int)o.ctx, .n_threads = (int)o.threads,
                   .prefill_budget = (int)o.budget, .sampling_threads = (int)o.sampling_threads};
    mu_error err = {{0}};
    sp.exe = self;
    if (!o.quiet) fprintf(stderr, "[bench serve] starting muser serve (%lld slots of %lld tokens)\n", (long long)o.parallel, (long long)o.ctx);
    if (!bs_spawn_muser(&sp, &srv[0], 300, &err)) {
        cli_error("bench serve", err.msg);
        free(o.conc);
        return 1;
    }
    if (o.llama) {
        sp.exe = o.llama;
        if (!o.quiet) fprintf(stderr, "[bench serve] starting %s (-np %lld -c %lld)\n", o.llama, (long long)o.parallel,
                              (long long)(o.parallel * o.ctx));
        if (!bs_spawn_llama(&sp, &srv[1], 300, &err)) {
            cli_error("bench serve", err.msg);
            bs_stop(&srv[0]);
            free(o.conc);
            return 1;
        }
    }

    level_result *res[2] = {NULL, NULL};
    for (int s = 0; s < n_srv; s++) {
        res[s] = mu_xcalloc((size_t)o.n_conc, sizeof(level_result));
        for (int64_t li = 0; li < o.n_conc; li++) {
            res[s][li].concurrency = o.conc[li];
            res[s][li].runs = mu_xcalloc((size_t)o.reps, sizeof(bs_run));
        }
    }
    rc = 0;
    for (int64_t li = 0; li < o.n_conc && !rc; li++) {
        int c = o.conc[li];
        bs_load load = {.chat = o.chat, .concurrency = c, .duration_s = (double)o.duration,
                        .n_requests = (int)o.requests, .max_tokens = (int)o.max_tokens,
                        .logprobs = o.logprobs};
        if (o.warmup > 0)
            for (int s = 0; s < n_srv && !rc; s++) {
                bs_load w = load;
                w.duration_s = 0;
                w.n_requests = (int)(o.warmup * c);
                bs_run r;
                if (!o.quiet) fprintf(stderr, "[bench serve] %s, %d streams: warm-up (%d requests)\n", names[s], c, w.n_requests);
                if (!bs_run_load(&srv[s], &w, &r)) {
                    /* a failed request is counted in the timed runs; only a server
                     * that completes nothing stops the benchmark */
                    fprintf(stderr, "muser bench serve: %s, warm-up at %d streams: %d of %d requests failed: %s\n",
                            names[s], c, r.n_err, r.n_err + r.n_ok, r.first_error[0] ? r.first_error : "none completed");
                    if (!r.n_ok) rc = 1;
                }
            }
        for (int64_t rep = 0; rep < o.reps && !rc; rep++)
            for (int s = 0; s < n_srv && !rc; s++) {
                level_result *lr = &res[s][li];
                bs_run *r = &lr->runs[rep];
                if (o.pause > 0) mu_bench_pause(o.pause);
                bool ok = bs_run_load(&srv[s], &load, r);
                lr->n_ok += r->n_ok;
                lr->n_err += r->n_err;
                if (r->first_error[0] && !lr->first_error[0])
                    snprintf(lr->first_error, sizeof lr->first_error, "%s", r->first_error);
                if (!o.quiet)
                    fprintf(stderr,
                            "[bench serve] %s, %d streams, rep %lld/%lld: %d requests in %.2f s, %.2f req/s, %.2f tok/s, "
                            "TTFT p50 %.1f ms p99 %.1f ms, ITL p50 %.2f ms p99 %.2f ms%s%s\n",
                            names[s], c, (long long)rep + 1, (long long)o.reps, r->n_ok, r->wall_s, r->req_per_s,
                            r->tok_per_s, r->ttft_p50_ms, r->ttft_p99_ms, r->itl_p50_ms, r->itl_p99_ms,
                            r->n_err ? ", errors: " : "", r->n_err ? r->first_error : "");
                if (!o.quiet && r->step_ms > 0)
                    fprintf(stderr, "[bench serve] %s engine: %.2f ms a step in the forward, %.2f ms handing rows out, "
                            "%.2f tokens a step\n", names[s], r->step_ms, r->take_ms, r->tokens_per_step);
                if (!ok && !r->n_ok) {
                    fprintf(stderr, "muser bench serve: %s at %d streams: %s\n", names[s], c,
                            r->first_error[0] ? r->first_error : "no request completed");
                    rc = 1;
                }
            }
    }
    for (int s = 0; s < n_srv; s++) bs_stop(&srv[s]);

    if (!rc) {
        for (int s = 0; s < n_srv; s++)
            for (int64_t li = 0; li < o.n_conc; li++) finish_level(&res[s][li], (int)o.reps);
        printf("model: %s; %s, %lld tokens per request (ignore_eos), %lld slots of %lld tokens, %lld reps "
               "(median, CV), warm-up %lld requests per stream\n",
               o.model, o.chat ? "/v1/chat/completions" : "/v1/completions", (long long)o.max_tokens,
               (long long)o.parallel, (long long)o.ctx, (long long)o.reps, (long long)o.warmup);
        if (o.duration > 0) printf("load: %lld s per level and repetition", (long long)o.duration);
        else printf("load: %lld requests per level and repetition", (long long)o.requests);
        if (o.threads) printf("; server threads: %lld\n", (long long)o.threads);
        else printf("; server threads: each server's default\n");
        if (llama_ver[0]) printf("llama-server: %s\n", llama_ver);
        printf("%-13s %4s %9s %6s %9s %6s %9s %9s %8s %8s %5s\n", "server", "conc", "req/s", "cv", "tok/s", "cv",
               "TTFTp50ms", "TTFTp99ms", "ITLp50ms", "ITLp99ms", "err");
        for (int64_t li = 0; li < o.n_conc; li++)
            for (int s = 0; s < n_srv; s++) {
                const level_result *lr = &res[s][li];
                printf("%-13s %4d %9.3f %5.1f%% %9.2f %5.1f%% %9.1f %9.1f %8.2f %8.2f %5d\n", names[s], lr->concurrency,
                       lr->req_s.median, 100 * lr->req_s.cv, lr->tok_s.median, 100 * lr->tok_s.cv, lr->ttft50.median,
                       lr->ttft99.median, lr->itl50.median, lr->itl99.median, lr->n_err);
            }
        for (int64_t li = 0; li < o.n_conc; li++) {
            const level_result *m = &res[0][li];
            if (m->step_ms.median > 0)
                printf("muser engine, %d streams (its /metrics, medians): %.2f ms a step in the batched forward, "
                       "%.2f ms handing rows to requests, %.2f tokens a step\n",
                       m->concurrency, m->step_ms.median, m->take_ms.median, m->tok_step.median);
        }
        if (n_srv == 2)
            for (int64_t li = 0; li < o.n_conc; li++) {
                const level_result *m = &res[0][li], *l = &res[1][li];
                printf("%d streams: muser/llama-server tokens/s %.3fx (%.2f vs %.2f), p99 ITL %.2f vs %.2f ms%s\n",
                       m->concurrency, l->tok_s.median > 0 ? m->tok_s.median / l->tok_s.median : 0.0, m->tok_s.median,
                       l->tok_s.median, m->itl99.median, l->itl99.median,
                       m->concurrency == 8 ? (m->tok_s.median >= l->tok_s.median && m->itl99.median <= l->itl99.median
                                                  ? "; target (tokens/s >=, p99 ITL <=) met"
                                                  : "; target (tokens/s >=, p99 ITL <=) NOT met")
                                           : "");
            }
        if (o.json && !write_json(&o, names, n_srv, res, llama_ver)) rc = 1;
    }
    for (int s = 0; s < n_srv; s++) {
        for (int64_t li = 0; li < o.n_conc; li++) {
            level_result *lr = &res[s][li];
            free(lr->req_s.samples);
            free(lr->tok_s.samples);
            free(lr->ttft50.samples);
            free(lr->ttft99.samples);
            free(lr->itl50.samples);
            free(lr->itl99.samples);
            free(lr->step_ms.samples);
            free(lr->take_ms.samples);
            free(lr->tok_step.samples);
            free(lr->runs);
        }
        free(res[s]);
    }
    free(o.conc);
    return rc;
}
