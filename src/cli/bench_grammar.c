/* `muser bench --grammar`: how long one whole-vocabulary grammar mask takes
 * (the cost of a rejected draw under llama-server's discipline), under
 * json.gbnf at the three states of mu_grammar_bench_mask (object start,
 * inside a string value, after a key). Each repetition is one call of the
 * grammar library's benchmark with a single timed mask (after its warm-up);
 * the repetitions give median, min, max and cv as the throughput bench
 * reports them. */
#include "bench_grammar.h"
#include "bench/bench.h"
#include "cli.h"
#include "grammar/grammar.h"
#include "model/api_internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#define SYNTH_VOCAB 202048

typedef struct vocab_result {
    const char *name;
    int32_t n_vocab;
    size_t trie_nodes;
    const char *state[3];
    int32_t allowed[3];
    mu_bench_stats ms[3];
} vocab_result;

static bool time_vocab(const mu_grammar_vocab *v, const char *name, int reps, vocab_result *out, mu_error *err) {
    double *samples = mu_xmalloc(3 * (size_t)reps * sizeof *samples);
    mu_grammar_bench_result res;
    bool ok = true;
    for (int r = 0; r < reps && ok; r++) {
        ok = mu_grammar_bench_mask(v, 1, &res, err) >= 0;
        for (int k = 0; ok && k < 3; k++) samples[k * reps + r] = res.ms_median[k];
    }
    if (ok) {
        *out = (vocab_result){.name = name, .n_vocab = res.n_vocab, .trie_nodes = res.trie_nodes};
        for (int k = 0; k < 3; k++) {
            out->state[k] = res.state_name[k];
            out->allowed[k] = res.n_allowed[k];
            mu_bench_stats_compute(&out->ms[k], samples + k * reps, reps);
        }
    }
    free(samples);
    return ok;
}

static void print_table(const vocab_result *v, int n, int reps) {
    printf("grammar: json.gbnf; whole-vocabulary mask (mu_grammar_mask_bits), one thread, %d reps\n", reps);
    printf("%-34s %8s %10s  %-10s %8s %9s %9s %9s %7s\n", "vocab", "tokens", "trie nodes", "state", "allowed",
           "median ms", "min ms", "max ms", "cv");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) {
            const mu_bench_stats *s = &v[i].ms[k];
            printf("%-34s %8d %10zu  %-10s %8d %9.3f %9.3f %9.3f %6.2f%%\n", k ? "" : v[i].name, v[i].n_vocab,
                   v[i].trie_nodes, v[i].state[k], v[i].allowed[k], s->median, s->min, s->max, 100.0 * s->cv);
        }
}

static bool write_json(const char *path, const vocab_result *v, int n, int reps, mu_error *err) {
    FILE *f = !strcmp(path, "-") ? stdout : fopen(path, "w");
    if (!f) {
        mu_err_set(err, "cannot write %s: %s", path, strerror(errno));
        return false;
    }
    fprintf(f, "{\n  \"muser_bench_grammar\": 1,\n  \"grammar\": \"json.gbnf\",\n  \"reps\": %d,\n  \"vocabs\": [\n",
            reps);
    for (int i = 0; i < n; i++) {
        fprintf(f, "    {\n      \"name\": ");
        cli_json_str(f, v[i].name);
        fprintf(f, ",\n      \"n_vocab\": %d,\n      \"trie_nodes\": %zu,\n      \"states\": [\n", v[i].n_vocab,
                v[i].trie_nodes);
        for (int k = 0; k < 3; k++) {
            const mu_bench_stats *s = &v[i].ms[k];
            fprintf(f, "        {\"state\": \"%s\", \"allowed\": %d, \"ms\": {\"median\": %.4f, \"min\": %.4f, "
                       "\"max\": %.4f, \"mean\": %.4f, \"cv\": %.6f}}%s\n",
                    v[i].state[k], v[i].allowed[k], s->median, s->min, s->max, s->mean, s->cv, k < 2 ? "," : "");
        }
        fprintf(f, "      ]\n    }%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    /* fflush and fclose report the failure of the buffered writes (a full
     * disk) with errno set; ferror alone does not keep errno. */
    int e = fflush(f) ? errno : 0;
    if (!e && ferror(f)) e = EIO;
    if (f != stdout && fclose(f) && !e) e = errno;
    if (e) mu_err_set(err, "writing %s failed: %s", path, strerror(e));
    return !e;
}

int bench_grammar(const char *model_path, int reps, const char *json_path, bool quiet) {
    vocab_result res[2];
    int n = 0, rc = 1;
    mu_error err;
    char name[300];
    muser_model *m = NULL;
    mu_grammar_vocab *synth = NULL, *real = NULL;
    if (!quiet) fprintf(stderr, "[bench] building the synthetic %d-token vocabulary\n", SYNTH_VOCAB);
    if (!(synth = mu_grammar_bench_vocab(SYNTH_VOCAB, NULL, &err)) ||
        !time_vocab(synth, "synthetic (gbnf_bench.c)", reps, &res[n], &err))
        goto done;
    n++;
    if (model_path) {
        if (!(m = muser_model_load(model_path, NULL, (muser_error *)&err)) || !(real = mu_api_grammar_vocab(m, &err)))
            goto done;
        muser_model_info info;
        muser_model_get_info(m, &info);
        snprintf(name, sizeof name, "%s", info.name && info.name[0] ? info.name : model_path);
        if (!quiet) fprintf(stderr, "[bench] timing %s's vocabulary\n", name);
        if (!time_vocab(real, name, reps, &res[n], &err)) goto done;
        n++;
    }
    print_table(res, n, reps);
    rc = json_path && !write_json(json_path, res, n, reps, &err) ? 1 : 0;
done:
    if (rc) cli_error("bench", err.msg);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) free(res[i].ms[k].samples);
    mu_grammar_vocab_free(real);
    mu_grammar_vocab_free(synth);
    muser_model_free(m);
    return rc;
}
