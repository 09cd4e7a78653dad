/* muser perplexity: perplexity of a text file, computed the way llama.cpp's
 * tools/perplexity does by default (non-overlapping n_ctx windows, BOS in
 * each window's first slot, only the second half of each window scored).
 * The method is written out in the --help text and in docs/glimmer-tiny.md,
 * section "Perplexity method". */
#include "cli.h"
#include "muser.h"
#include "util/common.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct ppl_opts {
    const char *model, *file;
    int64_t ctx, batch, chunks, threads;
    bool json;
    muser_backend_kind backend;
} ppl_opts;

/* Running sums over every scored position, in double as llama.cpp keeps them. */
typedef struct ppl_acc {
    double nll, nll2;
    int64_t count;
} ppl_acc;

static void ppl_usage(FILE *f) {
    fprintf(f,
            "usage: muser perplexity -m MODEL -f TEXT [options]\n\n"
            "  -m, --model FILE       Muse Glimmer GGUF (default: $MUSER_MODEL, else the shipped\n"
            "                         models/glimmer-tiny-q4_k_xl.gguf)\n"
            "  -f, --file FILE        text to score\n"
            "  -c, --ctx-size N       window length in tokens (default: the model's training context)\n"
            "  -b, --batch-size N     rows per forward call (default 512); does not change the result\n"
            "  --chunks N             score only the first N windows (default: all)\n"
            "  -t, --threads N        threads (default: all cores)\n"
            "  --backend NAME         ref | cpu | cuda | auto (default auto)\n"
            "  --json                 print one JSON object (running values go to stderr)\n\n"
            "Method (llama.cpp tools/perplexity, default mode):\n"
            "  1. The whole file is tokenized once, BOS added as the model asks, control-token\n"
            "     texts not parsed. It must give at least 2*N_CTX tokens.\n"
            "  2. It is cut into floor(tokens / N_CTX) non-overlapping windows of N_CTX tokens;\n"
            "     a trailing partial window is dropped.\n"
            "  3. Each window is evaluated from an empty cache. If the model adds BOS, the\n"
            "     window's first token is replaced by BOS for the input (not as a target).\n"
            "  4. Only the second half is scored: with first = N_CTX/2, the logits at positions\n"
            "     first .. N_CTX-2 predict tokens first+1 .. N_CTX-1, i.e. N_CTX-first-1 tokens\n"
            "     per window, each with at least first tokens of context.\n"
            "  5. Per scored token, nll = -log_softmax(logits)[target], in double with the\n"
            "     maximum logit subtracted; nll and nll^2 are summed in double.\n"
            "  6. After window i the running value exp(sum nll / count) is printed as\n"
            "     [i]PPL,  and at the end PPL = exp(mean nll) +/- PPL * sqrt(var / (count-1)),\n"
            "     var = mean(nll^2) - mean(nll)^2 (the standard error of the mean nll,\n"
            "     carried to PPL to first order).\n");
}

/* Returns -1 to go on, else the exit code. */
static int parse(int argc, char **argv, ppl_opts *o) {
    *o = (ppl_opts){.batch = 512};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { ppl_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("perplexity", argc, argv, &i, &o->model);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) ok = cli_value("perplexity", argc, argv, &i, &o->file);
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            /* 3 is the least window that scores a token (first = 1, one target). */
            ok = cli_value("perplexity", argc, argv, &i, &v) && cli_parse_i64("perplexity", a, v, 3, 1 << 24, &o->ctx);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size"))
            ok = cli_value("perplexity", argc, argv, &i, &v) && cli_parse_i64("perplexity", a, v, 1, 65536, &o->batch);
        else if (!strcmp(a, "--chunks"))
            ok = cli_value("perplexity", argc, argv, &i, &v) &&
                 cli_parse_i64("perplexity", a, v, 1, INT32_MAX, &o->chunks);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("perplexity", argc, argv, &i, &v) && cli_parse_i64("perplexity", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "--backend"))
            ok = cli_value("perplexity", argc, argv, &i, &v) && cli_parse_backend("perplexity", v, &o->backend);
        else {
            fprintf(stderr, "muser perplexity: unknown option '%s' (see muser perplexity --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (!cli_model_or_default("perplexity", &o->model)) return 2;
    if (!o->file) { fprintf(stderr, "muser perplexity: -f TEXT is required\n"); return 2; }
    return -1;
}

/* Whether tokenizing with add_special puts BOS in front. A model that also
 * appends EOS is refused: the windowing assumes text tokens only after BOS. */
static bool probe_bos(muser_model *m, bool *add_bos) {
    muser_error err;
    int32_t *ids = NULL;
    int64_t n = muser_tokenize(m, "", 0, true, false, &ids, &err);
    if (n < 0) {
        cli_error("perplexity", err.msg);
        return false;
    }
    int32_t bos = muser_token_bos(m);
    *add_bos = n >= 1 && bos >= 0 && ids[0] == bos;
    free(ids);
    if (n > (*add_bos ? 1 : 0)) {
        fprintf(stderr, "muser perplexity: the model's tokenizer appends EOS; this method needs it not to\n");
        return false;
    }
    return true;
}

static int64_t tokenize_file(muser_model *m, const char *path, int32_t **ids) {
    size_t len = 0;
    char *text = cli_read_file("perplexity", path, &len);
    if (!text) return -1;
    muser_error err;
    double t0 = mu_now();
    int64_t n = muser_tokenize(m, text, len, true, false, ids, &err);
    free(text);
    if (n < 0) fprintf(stderr, "muser perplexity: %s: %s\n", path, err.msg);
    else fprintf(stderr, "muser perplexity: %s: %lld tokens (tokenized in %.3f s)\n", path, (long long)n,
                 mu_now() - t0);
    return n;
}

/* -log softmax(logits)[target] in double, the maximum subtracted first so
 * that exp never overflows. */
static double token_nll(const float *logits, int64_t n_vocab, int32_t target) {
    float max = logits[0];
    for (int64_t i = 1; i < n_vocab; i++)
        if (logits[i] > max) max = logits[i];
    double sum = 0.0;
    for (int64_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - (double)max);
    return -((double)logits[target] - (double)max - log(sum));
}

typedef struct window_eval {
    muser_session *s;
    int64_t n_ctx, batch, n_vocab;
    bool add_bos;
    int32_t bos;
    int32_t *input; /* n_ctx: the window as fed (BOS in slot 0) */
    float *logits;  /* batch x n_vocab */
} window_eval;

/* Evaluate one window from an empty cache and add its scored positions to acc. */
static bool score_window(window_eval *w, const int32_t *window, ppl_acc *acc) {
    muser_error err;
    const int64_t n_ctx = w->n_ctx, first = n_ctx / 2;
    memcpy(w->input, window, (size_t)n_ctx * sizeof(int32_t));
    if (w->add_bos) w->input[0] = w->bos;
    muser_session_reset(w->s);
    /* The first half is context only: its logits are never read. */
    if (!muser_session_feed(w->s, w->input, first, &err)) goto fail;
    for (int64_t pos = first; pos < n_ctx; pos += w->batch) {
        int64_t rows = n_ctx - pos < w->batch ? n_ctx - pos : w->batch;
        if (!muser_session_feed_all(w->s, w->input + pos, rows, w->logits, &err)) goto fail;
        for (int64_t r = 0; r < rows && pos + r <= n_ctx - 2; r++) {
            double v = token_nll(w->logits + r * w->n_vocab, w->n_vocab, window[pos + r + 1]);
            acc->nll += v;
            acc->nll2 += v * v;
            acc->count++;
        }
    }
    return true;
fail:
    fprintf(stderr, "\nmuser perplexity: %s\n", err.msg);
    return false;
}

typedef struct ppl_result {
    double ppl, ppl_err, nll_mean, seconds;
    bool has_err;
    int64_t n_tokens, n_chunks, n_ctx, batch, scored;
    double *chunk_ppl;
} ppl_result;

/* Final estimate from the sums; the error is only defined with a positive
 * variance over at least two scored tokens. */
static void finish(const ppl_acc *acc, ppl_result *r) {
    double mean = acc->nll / (double)acc->count;
    double var = acc->nll2 / (double)acc->count - mean * mean;
    r->nll_mean = mean;
    r->ppl = exp(mean);
    r->scored = acc->count;
    r->has_err = acc->count > 1 && var > 0;
    r->ppl_err = r->has_err ? sqrt(var / (double)(acc->count - 1)) * r->ppl : 0.0;
}

static void print_text(const ppl_result *r, const char *backend) {
    if (r->has_err) printf("Final estimate: PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_err);
    else printf("Final estimate: PPL = %.4f (no uncertainty: variance of nll not positive)\n", r->ppl);
    double evaluated = (double)(r->n_chunks * r->n_ctx);
    printf("%lld windows x %lld tokens = %.0f tokens evaluated, %lld scored, in %.3f s: %.2f tokens/s (backend %s)\n",
           (long long)r->n_chunks, (long long)r->n_ctx, evaluated, (long long)r->scored, r->seconds,
           r->seconds > 0 ? evaluated / r->seconds : 0.0, backend);
}

static void print_json(const ppl_result *r, const ppl_opts *o, const char *backend, bool add_bos) {
    double evaluated = (double)(r->n_chunks * r->n_ctx);
    printf("{\"ppl\":%.17g,\"ppl_err\":", r->ppl);
    if (r->has_err) printf("%.17g", r->ppl_err);
    else printf("null");
    printf(",\"chunks\":%lld,\"n_ctx\":%lld,\"batch\":%lld,\"tokens_total\":%lld,\"tokens_evaluated\":%.0f,"
           "\"tokens_scored\":%lld,\"nll_mean\":%.17g,\"add_bos\":%s,\"seconds\":%.6f,\"tokens_per_s\":%.3f,"
           "\"backend\":\"%s\",\"model\":",
           (long long)r->n_chunks, (long long)r->n_ctx, (long long)r->batch, (long long)r->n_tokens, evaluated,
           (long long)r->scored, r->nll_mean, add_bos ? "true" : "false", r->seconds,
           r->seconds > 0 ? evaluated / r->seconds : 0.0, backend);
    cli_json_str(stdout, o->model);
    printf(",\"chunk_ppl\":[");
    for (int64_t i = 0; i < r->n_chunks; i++) printf("%s%.17g", i ? "," : "", r->chunk_ppl[i]);
    printf("]}\n");
}

/* Score every window, printing the running perplexity after each. */
static bool run_windows(window_eval *w, const int32_t *tokens, ppl_result *r, FILE *running) {
    ppl_acc acc = {0};
    double t0 = mu_now();
    for (int64_t i = 0; i < r->n_chunks; i++) {
        if (!score_window(w, tokens + i * r->n_ctx, &acc)) return false;
        r->chunk_ppl[i] = exp(acc.nll / (double)acc.count);
        if (i == 0)
            fprintf(stderr, "muser perplexity: %.2f s per window, ETA %.2f minutes\n", mu_now() - t0,
                    (mu_now() - t0) * (double)r->n_chunks / 60.0);
        fprintf(running, "[%lld]%.4f,", (long long)(i + 1), r->chunk_ppl[i]);
        fflush(running);
    }
    fputc('\n', running);
    r->seconds = mu_now() - t0;
    finish(&acc, r);
    return true;
}

static int evaluate(const ppl_opts *o, muser_model *m, const muser_model_info *info) {
    bool add_bos;
    if (!probe_bos(m, &add_bos)) return 1;
    int32_t *tokens = NULL;
    int64_t n_tokens = tokenize_file(m, o->file, &tokens);
    if (n_tokens < 0) return 1;
    int64_t n_ctx = o->ctx ? o->ctx : info->n_ctx_train;
    int rc = 1;
    if (n_tokens < 2 * n_ctx) {
        fprintf(stderr, "muser perplexity: you need at least %lld tokens to evaluate perplexity with a context "
                "of %lld; %s tokenizes to only %lld tokens\n", (long long)(2 * n_ctx), (long long)n_ctx, o->file,
                (long long)n_tokens);
        free(tokens);
        return 1;
    }
    if (n_ctx > info->n_ctx_train)
        fprintf(stderr, "muser perplexity: warning: context %lld exceeds the model's training context %lld\n",
                (long long)n_ctx, (long long)info->n_ctx_train);
    ppl_result r = {.n_tokens = n_tokens, .n_ctx = n_ctx, .n_chunks = n_tokens / n_ctx};
    if (o->chunks && o->chunks < r.n_chunks) r.n_chunks = o->chunks;
    r.batch = o->batch < n_ctx ? o->batch : n_ctx;
    muser_error err;
    muser_session_params sp = {.n_ctx = n_ctx, .prefill_chunk = r.batch};
    window_eval w = {.s = muser_session_create(m, &sp, &err), .n_ctx = n_ctx, .batch = r.batch,
                     .n_vocab = info->n_vocab, .add_bos = add_bos, .bos = muser_token_bos(m)};
    if (!w.s) cli_error("perplexity", err.msg);
    else {
        w.input = mu_xmalloc((size_t)n_ctx * sizeof(int32_t));
        w.logits = mu_xmalloc((size_t)r.batch * (size_t)info->n_vocab * sizeof(float));
        r.chunk_ppl = mu_xmalloc((size_t)r.n_chunks * sizeof(double));
        fprintf(stderr, "muser perplexity: %lld windows, n_ctx %lld, batch %lld, %lld scored tokens per window, "
                "BOS %s, backend %s\n", (long long)r.n_chunks, (long long)n_ctx, (long long)r.batch,
                (long long)(n_ctx - n_ctx / 2 - 1), add_bos ? "yes" : "no", info->backend);
        if (run_windows(&w, tokens, &r, o->json ? stderr : stdout)) {
            if (o->json) print_json(&r, o, info->backend, add_bos);
            else print_text(&r, info->backend);
            rc = 0;
        }
    }
    muser_session_free(w.s);
    free(w.input);
    free(w.logits);
    free(r.chunk_ppl);
    free(tokens);
    return rc;
}

int cmd_perplexity(int argc, char **argv) {
    ppl_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) return rc;
    muser_error err;
    muser_model_params mp = {.backend = o.backend, .n_threads = (int)o.threads};
    muser_model *m = muser_model_load(o.model, &mp, &err);
    if (!m) {
        cli_error("perplexity", err.msg);
        return 1;
    }
    muser_model_info info;
    muser_model_get_info(m, &info);
    if (!muser_model_has_tokenizer(m)) {
        fprintf(stderr, "muser perplexity: %s has no tokenizer metadata\n", o.model);
        rc = 1;
    } else rc = evaluate(&o, m, &info);
    muser_model_free(m);
    fflush(stdout);
    return rc;
}
