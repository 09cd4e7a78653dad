/* muser run: prefill the prompt tokens, then decode -n tokens. */
#include "cli.h"
#include "muser.h"
#include "util/common.h"
#include "util/mumath.h"
#include <stdlib.h>
#include <string.h>

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: muser run -m MODEL (--tokens 1,2,3 | -p TEXT) [options]\n\n"
            "  -m, --model FILE       Muse Glimmer GGUF\n"
            "  --tokens IDS           prompt as comma-separated token ids\n"
            "  -p, --prompt TEXT      prompt text (needs the tokenizer; not in this build yet)\n"
            "  -n, --n-predict N      tokens to generate (default 16)\n"
            "  --temp T               temperature; 0 = greedy, lowest id wins ties (default 0)\n"
            "  --seed S               sampling seed (default 0)\n"
            "  -t, --threads N        threads (default: all cores)\n"
            "  -c, --ctx-size N       context length (default: model's, capped at 4096)\n"
            "  --chunk N              prefill rows per forward call (default 512)\n"
            "  --backend NAME         ref | cpu | cuda | auto (default auto)\n"
            "  --dump-logits FILE     append every step's f32 logits (prefill last row, then each decode step)\n");
}

typedef struct run_opts {
    const char *model, *dump, *prompt;
    int32_t *tokens;
    int64_t n_tokens, n_predict, threads, ctx, chunk;
    float temp;
    uint64_t seed;
    muser_backend_kind backend;
} run_opts;

static int parse(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.n_predict = 16, .ctx = 0, .chunk = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("run", argc, argv, &i, &o->model);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) ok = cli_value("run", argc, argv, &i, &o->prompt);
        else if (!strcmp(a, "--dump-logits")) ok = cli_value("run", argc, argv, &i, &o->dump);
        else if (!strcmp(a, "--tokens"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_ids("run", v, &o->tokens, &o->n_tokens);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 0, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--chunk"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 65536, &o->chunk);
        else if (!strcmp(a, "--temp"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_f32("run", a, v, &o->temp);
        else if (!strcmp(a, "--seed"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_u64("run", a, v, &o->seed);
        else if (!strcmp(a, "--backend")) {
            ok = cli_value("run", argc, argv, &i, &v);
            if (ok && !muser_backend_from_name(v, &o->backend)) {
                fprintf(stderr, "muser run: unknown backend '%s' (ref, cpu, cuda, auto)\n", v);
                ok = false;
            }
        } else {
            fprintf(stderr, "muser run: unknown option '%s' (see muser run --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (!o->model) { fprintf(stderr, "muser run: -m MODEL is required\n"); return 2; }
    if (o->prompt) {
        fprintf(stderr, "muser run: text prompts need the tokenizer, which this build does not have yet; use --tokens\n");
        return 2;
    }
    if (!o->tokens) { fprintf(stderr, "muser run: give a prompt with --tokens\n"); return 2; }
    return -1;
}

/* Greedy: the highest logit, lowest id on ties. Otherwise a plain softmax draw
 * at temperature (interim sampler until the llama.cpp-compatible chain lands). */
static int32_t pick(const float *logits, int64_t n, float temp, uint64_t *rng) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0) return (int32_t)best;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)mu_expf((logits[i] - logits[best]) / temp);
    /* splitmix64 */
    uint64_t z = (*rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double target = (double)(z >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += (double)mu_expf((logits[i] - logits[best]) / temp);
        if (acc >= target) return (int32_t)i;
    }
    return (int32_t)best;
}

static bool dump(FILE *f, const float *logits, int64_t n) {
    return !f || fwrite(logits, sizeof(float), (size_t)n, f) == (size_t)n;
}

static int generate(const run_opts *o, muser_model *m, muser_session *s, FILE *df) {
    muser_error err;
    muser_model_info info;
    muser_model_get_info(m, &info);
    uint64_t rng = o->seed;
    double t0 = mu_now();
    if (!muser_session_feed(s, o->tokens, o->n_tokens, &err)) {
        fprintf(stderr, "muser run: %s\n", err.msg);
        return 1;
    }
    double t_prefill = mu_now() - t0;
    const float *logits = muser_session_logits(s);
    if (!dump(df, logits, info.n_vocab)) { fprintf(stderr, "muser run: writing logits failed\n"); return 1; }
    double t1 = mu_now();
    int64_t generated = 0;
    for (; generated < o->n_predict; generated++) {
        int32_t tok = pick(logits, info.n_vocab, o->temp, &rng);
        printf("%s%d", generated ? " " : "", tok);
        fflush(stdout);
        if (generated + 1 == o->n_predict) { generated++; break; }
        if (!muser_session_feed(s, &tok, 1, &err)) {
            fprintf(stderr, "\nmuser run: %s\n", err.msg);
            return 1;
        }
        logits = muser_session_logits(s);
        if (!dump(df, logits, info.n_vocab)) { fprintf(stderr, "muser run: writing logits failed\n"); return 1; }
    }
    double t_decode = mu_now() - t1;
    int64_t decoded = generated > 0 ? generated - 1 : 0; /* forward passes after the prefill */
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "prefill: %lld tokens in %.3f s (%.2f tok/s); decode: %lld tokens in %.3f s (%.2f tok/s); backend %s\n",
            (long long)o->n_tokens, t_prefill, (double)o->n_tokens / t_prefill, (long long)decoded, t_decode,
            decoded ? (double)decoded / t_decode : 0.0, info.backend);
    return 0;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) { free(o.tokens); return rc; }
    muser_error err;
    muser_model_params mp = {.backend = o.backend, .n_threads = (int)o.threads};
    muser_model *m = muser_model_load(o.model, &mp, &err);
    if (!m) {
        fprintf(stderr, "muser run: %s\n", err.msg);
        free(o.tokens);
        return 1;
    }
    muser_model_info info;
    muser_model_get_info(m, &info);
    int64_t ctx = o.ctx ? o.ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
    muser_session_params sp = {.n_ctx = ctx, .prefill_chunk = o.chunk};
    muser_session *s = muser_session_create(m, &sp, &err);
    FILE *df = NULL;
    rc = 1;
    if (!s) fprintf(stderr, "muser run: %s\n", err.msg);
    else if (o.dump && !(df = fopen(o.dump, "wb"))) fprintf(stderr, "muser run: cannot open %s for writing\n", o.dump);
    else rc = generate(&o, m, s, df);
    if (df && fclose(df) && rc == 0) { fprintf(stderr, "muser run: writing %s failed\n", o.dump); rc = 1; }
    muser_session_free(s);
    muser_model_free(m);
    free(o.tokens);
    return rc;
}
