/* muser speculate: exact greedy speculative decoding with a DFlash
 * assistant (docs/speculative.md). Runs plain greedy decoding first, then
 * the speculative loop on the same prompt, checks that both token streams
 * are identical and reports acceptance and speed. Exit 1 if they differ. */
#include "cli.h"
#include "muser.h"
#include "spec/speculate.h"
#include "util/common.h"
#include <stdlib.h>
#include <string.h>

typedef struct spec_opts {
    const char *model, *draft, *prompt;
    int32_t *tokens;
    int64_t n_tokens, n_predict, verify_len, threads, ctx;
    bool json;
} spec_opts;

static void spec_usage(FILE *f) {
    fprintf(f,
            "usage: muser speculate -m TARGET [--draft FILE] (-p TEXT | --tokens IDS) [options]\n\n"
            "Greedy decoding sped up by a DFlash assistant, token-for-token identical to plain\n"
            "greedy decoding: plain greedy runs first, both streams are compared ('exact: yes').\n\n"
            "  -m, --model FILE       target Muse Glimmer GGUF (default: $MUSER_MODEL, else the shipped\n"
            "                         models/glimmer-tiny-q4_k_xl.gguf)\n"
            "  --draft FILE           dflash assistant GGUF (default: $MUSER_DRAFT, else the shipped\n"
            "                         models/glimmer-tiny-dflash-q4_k_xl.gguf)\n"
            "  -p, --prompt TEXT      prompt text (tokenized with the target's tokenizer)\n"
            "  --tokens IDS           prompt as comma-separated token ids\n"
            "  -n, --n-predict N      maximum tokens to generate (default 128)\n"
            "  --verify-len N         proposals verified per step: 3, 7 or 15 (default 7)\n"
            "  -t, --threads N        threads (default: all cores)\n"
            "  -c, --ctx-size N       context length (default: model's, capped at 4096)\n"
            "  --json                 print one JSON object (ids, text, statistics)\n");
}

static int parse(int argc, char **argv, spec_opts *o) {
    *o = (spec_opts){.n_predict = 128, .verify_len = 7};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { spec_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("speculate", argc, argv, &i, &o->model);
        else if (!strcmp(a, "--draft")) ok = cli_value("speculate", argc, argv, &i, &o->draft);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) ok = cli_value("speculate", argc, argv, &i, &o->prompt);
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--tokens"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_ids("speculate", v, &o->tokens, &o->n_tokens);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_i64("speculate", a, v, 1, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "--verify-len"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_verify_len("speculate", v, &o->verify_len);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_i64("speculate", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_i64("speculate", a, v, 1, 1 << 24, &o->ctx);
        else {
            fprintf(stderr, "muser speculate: unknown option '%s' (see muser speculate --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (!cli_model_or_default("speculate", &o->model)) return 2;
    if (!o->draft) o->draft = cli_default_draft();
    if (!o->model || !o->draft) { fprintf(stderr, "muser speculate: -m TARGET and --draft FILE are required\n"); return 2; }
    if (!o->prompt == !o->tokens) { fprintf(stderr, "muser speculate: give one of -p TEXT or --tokens IDS\n"); return 2; }
    return -1;
}

typedef struct spec_result {
    int32_t *plain, *spec;
    int64_t n_plain, n_spec, n_prompt;
    double t_plain;             /* plain decode seconds after the prompt */
    mu_spec_stats st;
    char *text;
} spec_result;

/* Tokens per second after the first token (which both get from the prompt). */
static double rate(int64_t n, double seconds) { return n > 1 && seconds > 0 ? (double)(n - 1) / seconds : 0; }

static int64_t first_difference(const spec_result *r) {
    int64_t n = r->n_plain < r->n_spec ? r->n_plain : r->n_spec;
    for (int64_t i = 0; i < n; i++)
        if (r->plain[i] != r->spec[i]) return i;
    return r->n_plain == r->n_spec ? -1 : n;
}

static void print_stats(const spec_opts *o, const mu_dflash *d, const spec_result *r, bool exact) {
    const mu_spec_stats *st = &r->st;
    double steps = st->verify_steps ? (double)st->verify_steps : 1;
    double plain = rate(r->n_plain, r->t_plain), spec = rate(r->n_spec, st->t_total - st->t_prefill);
    if (o->json) {
        printf("{\"prompt_tokens\": %lld, \"verify_len\": %lld, \"draft_sink\": %d, \"draft_window\": %lld, \"ids\": [",
               (long long)r->n_prompt, (long long)o->verify_len, MU_DFLASH_SINK, (long long)d->cfg.sliding_window);
        for (int64_t i = 0; i < r->n_spec; i++) printf("%s%d", i ? ", " : "", r->spec[i]);
        printf("], \"text\": ");
        cli_json_str(stdout, r->text ? r->text : "");
        printf(", \"verify_steps\": %lld, \"tokens_per_step\": %.4f, \"drafted\": %lld, \"accepted\": %lld, "
               "\"acceptance\": %.4f, \"plain_tokens_per_s\": %.2f, \"spec_tokens_per_s\": %.2f, \"speedup\": %.4f, "
               "\"draft_s\": %.4f, \"verify_s\": %.4f, \"exact\": %s}\n",
               (long long)st->verify_steps, (double)st->step_tokens / steps, (long long)st->drafted,
               (long long)st->accepted, st->drafted ? (double)st->accepted / (double)st->drafted : 0, plain, spec,
               plain > 0 ? spec / plain : 0, st->t_draft, st->t_verify, exact ? "true" : "false");
        return;
    }
    printf("\n\nprompt %lld tokens, generated %lld; draft %s (sink %d + window %lld), verify length %lld\n",
           (long long)r->n_prompt, (long long)r->n_spec, d->name, MU_DFLASH_SINK, (long long)d->cfg.sliding_window,
           (long long)o->verify_len);
    printf("verify steps: %lld, tokens per verify step: %.2f, accepted drafts per step: %.2f, acceptance: %.1f%% "
           "(%lld / %lld)\n",
           (long long)st->verify_steps, (double)st->step_tokens / steps, (double)st->accepted / steps,
           st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0, (long long)st->accepted,
           (long long)st->drafted);
    printf("plain greedy: %.1f tokens/s; speculative: %.1f tokens/s (draft %.3f s, verify %.3f s); speed ratio %.2fx\n",
           plain, spec, st->t_draft, st->t_verify, plain > 0 ? spec / plain : 0.0);
    printf("exact: %s\n", exact ? "yes" : "NO");
}

static bool run_both(const spec_opts *o, muser_model *m, const mu_dflash *d, muser_session *s, const int32_t *prompt,
                     spec_result *r) {
    muser_error err;
    r->plain = mu_xmalloc((size_t)o->n_predict * sizeof(int32_t));
    r->spec = mu_xmalloc((size_t)o->n_predict * sizeof(int32_t));
    r->n_plain = mu_greedy_generate(m, s, prompt, r->n_prompt, o->n_predict, r->plain, &r->t_plain, (mu_error *)&err);
    if (r->n_plain < 0) { fprintf(stderr, "muser speculate: plain greedy: %s\n", err.msg); return false; }
    r->n_spec = mu_speculate_greedy(m, d, s, prompt, r->n_prompt, (int)o->verify_len, o->n_predict, r->spec, &r->st,
                                    (mu_error *)&err);
    if (r->n_spec < 0) { fprintf(stderr, "muser speculate: %s\n", err.msg); return false; }
    if (muser_model_has_tokenizer(m)) r->text = muser_detokenize(m, r->spec, (size_t)r->n_spec, false, NULL, &err);
    return true;
}

static int64_t build_prompt(const spec_opts *o, muser_model *m, int32_t **ids) {
    if (o->tokens) {
        *ids = mu_xmalloc((size_t)o->n_tokens * sizeof(int32_t));
        memcpy(*ids, o->tokens, (size_t)o->n_tokens * sizeof(int32_t));
        return o->n_tokens;
    }
    muser_error err;
    int64_t n = muser_tokenize(m, o->prompt, strlen(o->prompt), true, true, ids, &err);
    if (n < 0) fprintf(stderr, "muser speculate: %s\n", err.msg);
    else if (n == 0) { fprintf(stderr, "muser speculate: the prompt is empty\n"); free(*ids); n = -1; }
    return n;
}

int cmd_speculate(int argc, char **argv) {
    spec_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) { free(o.tokens); return rc; }
    muser_error err;
    muser_model_params mp = {.n_threads = (int)o.threads};
    muser_model *m = muser_model_load(o.model, &mp, &err);
    mu_dflash *d = m ? mu_dflash_load(o.draft, (mu_error *)&err) : NULL;
    muser_session *s = NULL;
    spec_result r = {0};
    rc = 1;
    if (!d) fprintf(stderr, "muser speculate: %s\n", err.msg);
    else {
        muser_model_info info;
        muser_model_get_info(m, &info);
        int64_t ctx = o.ctx ? o.ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
        muser_session_params sp = {.n_ctx = ctx};
        s = muser_session_create(m, &sp, &err);
        if (!s) fprintf(stderr, "muser speculate: %s\n", err.msg);
    }
    int32_t *prompt = NULL;
    if (s && (r.n_prompt = build_prompt(&o, m, &prompt)) > 0 && run_both(&o, m, d, s, prompt, &r)) {
        int64_t diff = first_difference(&r);
        if (!o.json && r.text) fputs(r.text, stdout);
        print_stats(&o, d, &r, diff < 0);
        if (diff >= 0)
            fprintf(stderr, "muser speculate: token streams differ at index %lld (plain %lld tokens, speculative %lld)\n",
                    (long long)diff, (long long)r.n_plain, (long long)r.n_spec);
        rc = diff < 0 ? 0 : 1;
    }
    free(prompt);
    free(r.plain);
    free(r.spec);
    free(r.text);
    muser_session_free(s);
    mu_dflash_free(d);
    muser_model_free(m);
    free(o.tokens);
    return rc;
}
