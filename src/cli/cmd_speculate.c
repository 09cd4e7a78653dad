/* muser speculate: exact greedy speculative decoding with a DFlash
 * assistant (docs/speculative.md). Runs plain greedy decoding first, then
 * the speculative loop on the same prompt, checks that both token streams
 * are identical and reports acceptance and speed. Exit 1 if they differ. */
#include "cli.h"
#include "gen/gen.h"
#include "muser.h"
#include "spec/dflash.h"
#include "util/common.h"
#include <stdlib.h>
#include <string.h>

typedef struct spec_opts {
    const char *model, *draft, *prompt;
    int32_t *tokens;
    int64_t n_tokens, n_predict, verify_len, threads, ctx;
    muser_backend_kind backend;
    bool json, tree;
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
            "  --verify-len N         proposals verified per step: 3, 7 or 15 (default 15)\n"
            "  --spec-chain           verify them as one chain (default: a token tree, docs/speculative.md\n"
            "                         \"Token trees\"; --tree)\n"
            "  -t, --threads N        threads (default: all cores)\n"
            "  --backend NAME         ref | cpu | cuda | auto (default auto)\n"
            "  -c, --ctx-size N       context length (default: model's, capped at 4096)\n"
            "  --json                 print one JSON object (ids, text, statistics)\n");
}

static int parse(int argc, char **argv, spec_opts *o) {
    *o = (spec_opts){.n_predict = 128, .verify_len = MUSER_SPEC_VERIFY_LEN_DEFAULT, .tree = MUSER_SPEC_TREE_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { spec_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("speculate", argc, argv, &i, &o->model);
        else if (!strcmp(a, "--draft")) ok = cli_value("speculate", argc, argv, &i, &o->draft);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) ok = cli_value("speculate", argc, argv, &i, &o->prompt);
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--tree") || !strcmp(a, "--spec-tree")) o->tree = true;
        else if (!strcmp(a, "--spec-chain")) o->tree = false;
        else if (!strcmp(a, "--tokens"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_ids("speculate", "--tokens", v, &o->tokens, &o->n_tokens);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_i64("speculate", a, v, 1, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "--verify-len"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_verify_len("speculate", v, &o->verify_len);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_i64("speculate", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_i64("speculate", a, v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--backend"))
            ok = cli_value("speculate", argc, argv, &i, &v) && cli_parse_backend("speculate", v, &o->backend);
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

static void print_stats(const spec_opts *o, const mu_dflash *d, const mu_gen_pair *r, int64_t n_prompt,
                        const char *text, bool exact) {
    const muser_spec_stats *st = &r->st;
    /* a plain step (no room to draft) counts as a verify step of one token */
    int64_t verify_steps = st->rounds + st->plain_steps, step_tokens = st->round_tokens + st->plain_steps;
    double steps = verify_steps ? (double)verify_steps : 1, t_verify = st->t_verify + st->t_plain;
    double plain = mu_gen_rate(r->n_plain, r->t_plain), spec = mu_gen_rate(r->n_spec, r->t_spec);
    if (o->json) {
        printf("{\"prompt_tokens\": %lld, \"verify_len\": %lld, \"tree\": %s, \"draft_sink\": %d, \"draft_window\": %lld, "
               "\"ids\": [", (long long)n_prompt, (long long)o->verify_len, o->tree ? "true" : "false", MU_DFLASH_SINK,
               (long long)d->cfg.sliding_window);
        for (int64_t i = 0; i < r->n_spec; i++) printf("%s%d", i ? ", " : "", r->spec[i]);
        printf("], \"text\": ");
        cli_json_str(stdout, text ? text : "");
        printf(", \"verify_steps\": %lld, \"tokens_per_step\": %.4f, \"drafted\": %lld, \"accepted\": %lld, "
               "\"acceptance\": %.4f, \"plain_tokens_per_s\": %.2f, \"spec_tokens_per_s\": %.2f, \"speedup\": %.4f, "
               "\"draft_s\": %.4f, \"verify_s\": %.4f, \"picked_rounds\": %lld, \"exact\": %s}\n",
               (long long)verify_steps, (double)step_tokens / steps, (long long)st->drafted,
               (long long)st->accepted, st->drafted ? (double)st->accepted / (double)st->drafted : 0, plain, spec,
               plain > 0 ? spec / plain : 0, st->t_draft, t_verify, (long long)st->picked_rounds, exact ? "true" : "false");
        return;
    }
    printf("\n\nprompt %lld tokens, generated %lld; draft %s (sink %d + window %lld), verify length %lld%s\n",
           (long long)n_prompt, (long long)r->n_spec, d->name, MU_DFLASH_SINK, (long long)d->cfg.sliding_window,
           (long long)o->verify_len, o->tree ? " (a token tree)" : "");
    printf("verify steps: %lld, tokens per verify step: %.2f, accepted drafts per step: %.2f, acceptance: %.1f%% "
           "(%lld / %lld)\n",
           (long long)verify_steps, (double)step_tokens / steps, (double)st->accepted / steps,
           st->drafted ? 100.0 * (double)st->accepted / (double)st->drafted : 0.0, (long long)st->accepted,
           (long long)st->drafted);
    printf("plain greedy: %.1f tokens/s; speculative: %.1f tokens/s (draft %.3f s, verify %.3f s); speed ratio %.2fx\n",
           plain, spec, st->t_draft, t_verify, plain > 0 ? spec / plain : 0.0);
    printf("exact: %s\n", exact ? "yes" : "NO");
}

static int64_t build_prompt(const spec_opts *o, muser_model *m, int32_t **ids) {
    if (o->tokens) {
        *ids = mu_xmalloc((size_t)o->n_tokens * sizeof(int32_t));
        memcpy(*ids, o->tokens, (size_t)o->n_tokens * sizeof(int32_t));
        return o->n_tokens;
    }
    muser_error err;
    int64_t n = muser_tokenize(m, o->prompt, strlen(o->prompt), true, true, ids, &err);
    if (n < 0) cli_error("speculate", err.msg);
    else if (n == 0) { fprintf(stderr, "muser speculate: the prompt is empty\n"); free(*ids); n = -1; }
    return n;
}

int cmd_speculate(int argc, char **argv) {
    spec_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) { free(o.tokens); return rc; }
    muser_error err;
    muser_model_params mp = {.backend = o.backend, .n_threads = (int)o.threads};
    muser_model *m = muser_model_load(o.model, &mp, &err);
    /* the assistant runs through the public API; its file's geometry is printed from the loader's view */
    muser_draft *draft = m ? muser_draft_load(o.draft, m, &err) : NULL;
    mu_dflash *d = draft ? mu_dflash_load(o.draft, (mu_error *)&err) : NULL;
    muser_session *s = NULL;
    rc = 1;
    if (!d) cli_error("speculate", err.msg);
    else {
        muser_model_info info;
        muser_model_get_info(m, &info);
        int64_t ctx = o.ctx ? o.ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
        muser_session_params sp = {.n_ctx = ctx};
        s = muser_session_create(m, &sp, &err);
        if (!s) cli_error("speculate", err.msg);
    }
    int32_t *prompt = NULL;
    int64_t n_prompt = s ? build_prompt(&o, m, &prompt) : -1;
    mu_gen_pair r = {0};
    const muser_spec_params spp = {.verify_len = (int)o.verify_len, .tree = o.tree};
    if (n_prompt > 0 && !(mu_gen_greedy(s, NULL, NULL, prompt, n_prompt, o.n_predict, &r, &err) &&
                          mu_gen_greedy(s, draft, &spp, prompt, n_prompt, o.n_predict, &r, &err)))
        cli_error("speculate", err.msg);
    else if (n_prompt > 0) {
        char *text = muser_model_has_tokenizer(m) ? muser_detokenize(m, r.spec, (size_t)r.n_spec, false, NULL, &err)
                                                  : NULL;
        int64_t diff = mu_gen_pair_diff(&r);
        if (!o.json && text) fputs(text, stdout);
        print_stats(&o, d, &r, n_prompt, text, diff < 0);
        if (diff >= 0)
            fprintf(stderr, "muser speculate: token streams differ at index %lld (plain %lld tokens, speculative %lld)\n",
                    (long long)diff, (long long)r.n_plain, (long long)r.n_spec);
        rc = diff < 0 ? 0 : 1;
        free(text);
    }
    mu_gen_pair_free(&r);
    free(prompt);
    muser_session_free(s);
    mu_dflash_free(d);
    muser_draft_free(draft);
    muser_model_free(m);
    free(o.tokens);
    return rc;
}
