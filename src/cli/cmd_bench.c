/* muser bench: prefill and decode throughput (median, min, max, CV over
 * repetitions after warm-up), achieved weight-read GB/s against the
 * machine's measured read bandwidth, at one or more context depths;
 * muser bench --membw measures that bandwidth alone, muser bench --grammar
 * the grammar engine's whole-vocabulary mask (bench_grammar.c), muser bench
 * serve an HTTP server under streaming load (cmd_bench_serve.c). */
#include "bench/bench.h"
#include "bench_grammar.h"
#include "cli.h"
#include "muser.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: muser bench -m MODEL [options]\n"
            "       muser bench --membw [-t N] [-r N] [--size MB] [--json FILE]\n"
            "       muser bench --grammar [-m MODEL] [-r N] [--json FILE]\n"
            "       muser bench serve [-m MODEL] [--concurrency 1,4,8,16] [--llama-server PATH] ... (--help)\n"
            "       muser bench kvpack [-m MODEL] [-d 2048,16384,65536] ... (time to first token, cold and warm; --help)\n\n"
            "  -m, --model FILE       Muse Glimmer GGUF (default: $MUSER_MODEL, else the shipped model)\n"
            "  -p, --n-prompt N       prefill test tokens (default 512; 0 skips)\n"
            "  -n, --n-gen N          teacher-forced decode test tokens (default 128; 0 skips)\n"
            "  -d, --depth D[,D...]   context depths to test at (default 0), e.g. 0,2048,16384,65536\n"
            "  -r, --reps N           timed repetitions per test (default 5)\n"
            "  --warmup N             untimed runs first (default 1)\n"
            "  -t, --threads N        threads (default: all cores)\n"
            "  --backend NAME         ref | cpu | cuda | auto (default auto)\n"
            "  --mlock                keep the model's pages locked in RAM (no page-outs during the runs)\n"
            "  --pause SECONDS        idle before each timed repetition (VMs that throttle sustained load;\n"
            "                         docs/benchmarks.md)\n"
            "  --chunk N              prefill rows per forward call (default 512; cuda 2048, fewer deep in a context)\n"
            "  --chain                decode on the greedy chain: the first token fed, then each row's\n"
            "                         first maximum, picked where the logits lie (no host round trip)\n"
            "  --draft FILE           also time greedy generation of -n tokens after a text prompt, plain\n"
            "                         and speculative with this DFlash assistant (outputs must match)\n"
            "  --spec-prompt TEXT     that prompt (default: Genesis 1:1)\n"
            "  --spec-prompts FILE    or each prompt of FILE, one a line: text, or ids:1,2,3 (token ids);\n"
            "                         a repetition's speed is all their tokens over all their seconds\n"
            "  --verify-len N         proposals per round: 3, 7 or 15 (default 15)\n"
            "  --spec-chain           verify them as one chain (default: a token tree; --spec-tree)\n"
            "  --prefill-depth        fill the depth by real prefill (default: synthetic K/V rows)\n"
            "  --parallel N[,N...]    also decode -n tokens with N sequences of one engine together (one\n"
            "                         batched forward per step, after a 32-token prompt each); aggregate\n"
            "                         tokens/s, e.g. 1,2,4,8 (with -p 0 -n 0... only this test runs if -p 0)\n"
            "  --parallel-depth D     with --parallel: D synthetic K/V rows before each sequence's prompt\n"
            "                         (filled once; later repetitions restore a snapshot of it)\n"
            "  --interleave           with --parallel: the counts' steps take turns one by one within a\n"
            "                         repetition (each count timed over its own steps), so that a machine\n"
            "                         slowing down for a while weighs on every count alike\n"
            "  --membw-gbs X          use X GB/s as the read bandwidth instead of measuring it (by default\n"
            "                         host memory, or with the cuda backend the GPU's over 16 GiB)\n"
            "  --no-membw             skip the bandwidth measurements\n"
            "  --no-paired-membw      skip the bandwidth passes right before and after each decode\n"
            "                         repetition (by default each one's share is also taken against them)\n"
            "  --size MB              bandwidth test buffer (default 1024; the paired pass uses at most 256)\n"
            "  --grammar              time one whole-vocabulary json.gbnf mask at 3 states, on the synthetic\n"
            "                         202,048-token vocabulary and with -m on the model's (-r default 21)\n"
            "  --json FILE            write the results as JSON ('-' = stdout)\n"
            "  --plot FILE.png        plot tokens/s against depth\n"
            "  -q, --quiet            no progress lines\n");
}

typedef struct bench_cli {
    mu_bench_opts o;
    int64_t *depths, *parallel;
    char *spec_file;          /* --spec-prompts: the file's bytes, its text lines in place */
    mu_bench_prompt *spec;    /* the file's prompts; ids: lines parsed (owned) */
    int n_spec;
    int64_t threads, reps, warmup, size_mb;
    const char *json, *plot;
    bool membw_only, no_membw, no_paired, quiet, grammar, reps_given;
    float membw_gbs;
} bench_cli;

static void spec_free(bench_cli *c) {
    for (int k = 0; k < c->n_spec; k++) free((int32_t *)c->spec[k].ids);
    free(c->spec);
    free(c->spec_file);
    c->spec = NULL, c->spec_file = NULL, c->n_spec = 0;
}

static void cli_free(bench_cli *c) {
    free(c->depths);
    free(c->parallel);
    spec_free(c);
}

/* --spec-prompts FILE: its non-empty lines (a trailing '\r' dropped), each
 * text or "ids:1,2,3" */
static bool spec_prompts(bench_cli *c, const char *path) {
    size_t len = 0;
    char *t = cli_read_file("bench", path, &len);
    if (!t) return false;
    spec_free(c);
    c->spec_file = t;
    int cap = 0, line = 0;
    for (char *p = t, *nl; p < t + len; p = nl + 1) {
        nl = memchr(p, '\n', (size_t)(t + len - p));
        if (!nl) nl = t + len;
        *nl = 0;
        line++;
        if (nl > p && nl[-1] == '\r') nl[-1] = 0;
        if (!*p) continue;
        if (c->n_spec == cap) c->spec = mu_xrealloc(c->spec, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *c->spec);
        mu_bench_prompt *q = &c->spec[c->n_spec++];
        *q = (mu_bench_prompt){.text = p};
        if (!strncmp(p, "ids:", 4)) {
            char what[64];
            snprintf(what, sizeof what, "--spec-prompts line %d", line);
            int32_t *ids = NULL;
            if (!cli_parse_ids("bench", what, p + 4, &ids, &q->n_ids)) return false;
            q->ids = ids;
        }
    }
    if (!c->n_spec) {
        fprintf(stderr, "muser bench: --spec-prompts %s: no prompt in it\n", path);
        return false;
    }
    c->o.spec_prompts = c->spec;
    c->o.n_spec_prompts = c->n_spec;
    return true;
}

/* "a,b,c" into a list of at most 64 values. */
static bool parse_list(const char *flag, const char *s, int64_t **out, int *n_out) {
    int32_t *ids = NULL;
    int64_t n = 0;
    if (!cli_parse_ids("bench", flag, s, &ids, &n) || n <= 0 || n > 64) {
        if (n > 64) fprintf(stderr, "muser bench: %s takes at most 64 values\n", flag);
        free(ids);
        return false;
    }
    free(*out);
    *out = mu_xmalloc((size_t)n * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) (*out)[i] = ids[i];
    *n_out = (int)n;
    free(ids);
    return true;
}

static bool parse_depths(const char *s, bench_cli *c) {
    if (!parse_list("--depth", s, &c->depths, &c->o.n_depths)) return false;
    c->o.depths = c->depths;
    return true;
}

static bool parse_parallel(const char *s, bench_cli *c) {
    if (!parse_list("--parallel", s, &c->parallel, &c->o.n_parallel)) return false;
    for (int i = 0; i < c->o.n_parallel; i++)
        if (c->parallel[i] < 1 || c->parallel[i] > 4096) {
            fprintf(stderr, "muser bench: --parallel %lld: sequence counts are 1 to 4096\n", (long long)c->parallel[i]);
            return false;
        }
    c->o.parallel = c->parallel;
    return true;
}

static int parse(int argc, char **argv, bench_cli *c) {
    mu_bench_opts_init(&c->o);
    c->o.verify_len = MUSER_SPEC_VERIFY_LEN_DEFAULT;
    c->o.spec_tree = MUSER_SPEC_TREE_DEFAULT;
    c->reps = 5;
    c->warmup = 1;
    c->size_mb = 1024;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { bench_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("bench", argc, argv, &i, &c->o.model_path);
        else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_i64("bench", a, v, 0, 1 << 20, &c->o.n_prompt);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_i64("bench", a, v, 0, 1 << 20, &c->o.n_gen);
        else if (!strcmp(a, "-d") || !strcmp(a, "--depth"))
            ok = cli_value("bench", argc, argv, &i, &v) && parse_depths(v, c);
        else if (!strcmp(a, "--parallel"))
            ok = cli_value("bench", argc, argv, &i, &v) && parse_parallel(v, c);
        else if (!strcmp(a, "--parallel-depth"))
            ok = cli_value("bench", argc, argv, &i, &v) &&
                 cli_parse_i64("bench", a, v, 0, (int64_t)1 << 24, &c->o.parallel_depth);
        else if (!strcmp(a, "-r") || !strcmp(a, "--reps"))
            ok = (c->reps_given = true) && cli_value("bench", argc, argv, &i, &v) &&
                 cli_parse_i64("bench", a, v, 1, 1000, &c->reps);
        else if (!strcmp(a, "--warmup"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_i64("bench", a, v, 0, 100, &c->warmup);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_i64("bench", a, v, 1, 1024, &c->threads);
        else if (!strcmp(a, "--chunk"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_i64("bench", a, v, 1, 65536, &c->o.chunk);
        else if (!strcmp(a, "--size"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_i64("bench", a, v, 16, 1 << 20, &c->size_mb);
        else if (!strcmp(a, "--membw-gbs"))
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_f32("bench", a, v, &c->membw_gbs);
        else if (!strcmp(a, "--json")) ok = cli_value("bench", argc, argv, &i, &c->json);
        else if (!strcmp(a, "--plot")) ok = cli_value("bench", argc, argv, &i, &c->plot);
        else if (!strcmp(a, "--membw")) c->membw_only = true;
        else if (!strcmp(a, "--grammar")) c->grammar = true;
        else if (!strcmp(a, "--no-membw")) c->no_membw = true;
        else if (!strcmp(a, "--chain")) c->o.chain = true;
        else if (!strcmp(a, "--no-paired-membw")) c->no_paired = true;
        else if (!strcmp(a, "--prefill-depth")) c->o.prefill_depth = true;
        else if (!strcmp(a, "--interleave")) c->o.interleave = true;
        else if (!strcmp(a, "--spec-tree")) c->o.spec_tree = true;
        else if (!strcmp(a, "--spec-chain")) c->o.spec_tree = false;
        else if (!strcmp(a, "--mlock")) c->o.use_mlock = true;
        else if (!strcmp(a, "--draft")) ok = cli_value("bench", argc, argv, &i, &c->o.draft_path);
        else if (!strcmp(a, "--spec-prompt")) ok = cli_value("bench", argc, argv, &i, &c->o.spec_prompt);
        else if (!strcmp(a, "--spec-prompts")) ok = cli_value("bench", argc, argv, &i, &v) && spec_prompts(c, v);
        else if (!strcmp(a, "--verify-len")) {
            int64_t vl = 0;
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_verify_len("bench", v, &vl);
            c->o.verify_len = (int)vl;
        }
        else if (!strcmp(a, "--pause")) {
            float secs = 0;
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_f32("bench", a, v, &secs);
            if (ok && (secs < 0 || secs > 600)) {
                fprintf(stderr, "muser bench: --pause must be in [0, 600] seconds, got %s\n", v);
                ok = false;
            }
            c->o.pause_s = secs;
        }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) c->quiet = true;
        else if (!strcmp(a, "--backend")) {
            ok = cli_value("bench", argc, argv, &i, &v) && cli_parse_backend("bench", v, &c->o.backend);
        } else {
            fprintf(stderr, "muser bench: unknown option '%s' (see muser bench --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    c->o.n_threads = (int)c->threads;
    c->o.reps = (int)c->reps;
    c->o.warmup = (int)c->warmup;
    if (c->grammar && c->membw_only) {
        fprintf(stderr, "muser bench: --grammar and --membw are separate benchmarks\n");
        return 2;
    }
    if (c->o.parallel_depth > 0 && !c->o.n_parallel) {
        fprintf(stderr, "muser bench: --parallel-depth needs --parallel\n");
        return 2;
    }
    if (c->o.interleave && c->o.n_parallel < 2) {
        fprintf(stderr, "muser bench: --interleave needs --parallel with at least two sequence counts\n");
        return 2;
    }
    if (!c->membw_only && !c->grammar && !cli_model_or_default("bench", &c->o.model_path)) return 2;
    if (c->membw_gbs < 0) {
        fprintf(stderr, "muser bench: --membw-gbs must be positive\n");
        return 2;
    }
    return -1;
}

static void print_progress(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "[bench] %s\n", line);
}

static double measure_membw(const bench_cli *c) {
    if (!c->quiet) fprintf(stderr, "[bench] measuring memory read bandwidth (%lld MiB, %d threads)\n", (long long)c->size_mb,
                           c->o.n_threads > 0 ? c->o.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN));
    return mu_bench_membw(c->o.n_threads, (size_t)c->size_mb << 20, c->o.reps > 3 ? c->o.reps : 3);
}

static int membw_only(const bench_cli *c) {
    double gbs = measure_membw(c);
    if (gbs <= 0) {
        fprintf(stderr, "muser bench: bandwidth measurement failed (out of memory?)\n");
        return 1;
    }
    int threads = c->o.n_threads > 0 ? c->o.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    printf("memory read bandwidth: %.2f GB/s (%d threads, %lld MiB buffer, best of %d per read loop)\n", gbs, threads,
           (long long)c->size_mb, c->o.reps > 3 ? c->o.reps : 3);
    if (c->json) {
        FILE *f = !strcmp(c->json, "-") ? stdout : fopen(c->json, "w");
        if (!f) {
            fprintf(stderr, "muser bench: cannot write %s\n", c->json);
            return 1;
        }
        fprintf(f, "{\n  \"muser_bench_membw\": 1,\n  \"threads\": %d,\n  \"buffer_mib\": %lld,\n  \"membw_gbs\": %.3f\n}\n",
                threads, (long long)c->size_mb, gbs);
        if (f != stdout) fclose(f);
    }
    return 0;
}

static void print_row(int64_t depth, const char *test, int64_t n, const mu_bench_stats *s, double bytes_per_tok,
                      double membw) {
    char name[64];
    snprintf(name, sizeof name, "%s%lld", test, (long long)n);
    printf("%8lld  %-10s %10.2f %10.2f %10.2f %7.2f%%", (long long)depth, name, s->median, s->min, s->max, 100.0 * s->cv);
    if (bytes_per_tok > 0) {
        double gbs = s->median * bytes_per_tok / 1e9;
        printf(" %8.2f", gbs);
        if (membw > 0) printf(" %7.1f%%", 100.0 * gbs / membw);
    }
    printf("\n");
}

/* Issue #5's depth target, per decoded token: the time attention adds over
 * depth 0 against the time to read the full-attention (NoPE) layers' K and V
 * once at the measured bandwidth. */
static void print_depth_costs(const mu_bench_result *r) {
    const mu_bench_depth *d0 = NULL;
    for (int i = 0; i < r->n_depths; i++)
        if (r->depths[i].depth == 0 && r->depths[i].decode.n) d0 = &r->depths[i];
    if (!d0 || r->membw_gbs <= 0) return;
    const muser_model_info *m = &r->info;
    const double bytes_per_pos = (double)(m->n_layer - m->n_swa_layers) * (double)(m->n_head_kv * m->head_dim) * 2 * 2;
    for (int i = 0; i < r->n_depths; i++) {
        const mu_bench_depth *d = &r->depths[i];
        if (d->depth <= 0 || !d->decode.n) continue;
        const double extra_ms = 1e3 / d->decode.median - 1e3 / d0->decode.median;
        const double bytes = bytes_per_pos * (double)d->depth, read_ms = bytes / (r->membw_gbs * 1e9) * 1e3;
        printf("depth %lld: attention adds %.2f ms per token; reading the NoPE planes once (%.1f MB) takes %.2f ms "
               "(%.1fx)\n",
               (long long)d->depth, extra_ms, bytes / 1e6, read_ms, read_ms > 0 ? extra_ms / read_ms : 0.0);
    }
}

/* Decode against the bandwidth passes run just before and after each
 * repetition: on a shared machine whose bandwidth drifts within seconds,
 * a figure taken minutes earlier is a poor yardstick. */
static void print_paired(const mu_bench_result *r) {
    for (int i = 0; i < r->n_depths; i++) {
        const mu_bench_depth *d = &r->depths[i];
        if (!d->paired_share.n) continue;
        printf("depth %lld: decode read %.1f%% (median; %.1f-%.1f%%) of the bandwidth measured around each "
               "repetition (passes: median %.2f GB/s, %.2f-%.2f)\n",
               (long long)d->depth, d->paired_share.median, d->paired_share.min, d->paired_share.max,
               d->paired_membw.median, d->paired_membw.min, d->paired_membw.max);
    }
}

static void print_table(const bench_cli *c, const mu_bench_result *r) {
    printf("model:   %s (%s), %.2f GB file, %.2f GB of weights read per token\n", r->model_name, r->lane,
           (double)r->info.file_bytes / 1e9, (double)r->info.weight_bytes_per_token / 1e9);
    printf("backend: %s%s%s%s", r->backend, strcmp(r->isa, "-") ? " (" : "", strcmp(r->isa, "-") ? r->isa : "",
           strcmp(r->isa, "-") ? ")" : "");
    if (strcmp(r->backend, "cuda")) printf(", %d threads", r->n_threads); /* host threads mean nothing on the GPU */
    if (r->membw_gbs > 0) printf("; %s read bandwidth %.2f GB/s", !strcmp(r->membw_of, "device") ? "device" : "memory", r->membw_gbs);
    printf("\n%8s  %-10s %10s %10s %10s %8s %8s %8s\n", "depth", "test", "tok/s", "min", "max", "cv", "GB/s", "%bw");
    for (int i = 0; i < r->n_depths; i++) {
        const mu_bench_depth *d = &r->depths[i];
        if (d->prefill.n) print_row(d->depth, "pp", c->o.n_prompt, &d->prefill, 0, 0);
        if (d->decode.n)
            print_row(d->depth, c->o.chain ? "chain" : "tg", c->o.n_gen, &d->decode,
                      (double)r->info.weight_bytes_per_token, r->membw_gbs);
    }
    for (int i = 0; i < r->n_parallel; i++) {
        const mu_bench_parallel *p = &r->parallel[i];
        char name[24];
        snprintf(name, sizeof name, "par%d", (int)p->n_seq);
        print_row(c->o.parallel_depth, name, c->o.n_gen > 0 ? c->o.n_gen : 128, &p->aggregate, 0, 0);
    }
    for (int i = 0; i < r->n_parallel && r->parallel[0].n_seq == 1; i++) {
        const mu_bench_parallel *p = &r->parallel[i];
        printf("parallel %lld: %.2f tok/s together (%.2f per sequence), %.2fx one sequence (median of the "
               "repetitions' ratios, %.2f-%.2f)\n", (long long)p->n_seq, p->aggregate.median,
               p->aggregate.median / (double)p->n_seq, p->ratio.median, p->ratio.min, p->ratio.max);
    }
    const mu_bench_spec *sp = &r->spec;
    if (!sp->ran) return;
    print_row(0, "greedy", sp->n_gen, &sp->plain, 0, 0);
    print_row(0, "spec", sp->n_gen, &sp->spec, 0, 0);
    char prompts[96];
    if (sp->n_prompts > 1)
        snprintf(prompts, sizeof prompts, "%d prompts, one prompt's ratio %.2fx-%.2fx in the last repetition",
                 sp->n_prompts, sp->ratio_min, sp->ratio_max);
    else snprintf(prompts, sizeof prompts, "%lld-token prompt", (long long)sp->n_prompt);
    printf("speculative (%s, verify length %d%s, %s): %.2fx plain greedy, %.2f tokens per round, "
           "acceptance %.1f%%, identical output\n",
           sp->draft_name, sp->verify_len, sp->tree ? " as a tree" : "", prompts,
           sp->plain.median > 0 ? sp->spec.median / sp->plain.median : 0.0,
           sp->rounds ? (double)sp->round_tokens / (double)sp->rounds : 0.0,
           sp->drafted ? 100.0 * (double)sp->accepted / (double)sp->drafted : 0.0);
}

int cmd_bench(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "serve")) return cmd_bench_serve(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "kvpack")) return cmd_bench_kvpack(argc - 1, argv + 1);
    bench_cli c = {0};
    int rc = parse(argc, argv, &c);
    if (rc >= 0) {
        cli_free(&c);
        return rc;
    }
    if (c.grammar) {
        rc = bench_grammar(c.o.model_path, c.reps_given ? (int)c.reps : 21, c.json, c.quiet);
        cli_free(&c);
        return rc;
    }
    if (c.membw_only) {
        rc = membw_only(&c);
        cli_free(&c);
        return rc;
    }
    if (c.membw_gbs > 0) c.o.membw_gbs = c.membw_gbs;
    else if (!c.no_membw) {
        /* a backend with memory of its own (cuda) measures that after loading; host memory is measured here,
         * before the model takes its share, unless the backend is known to be the GPU */
        c.o.membw_backend = true;
        if (c.o.backend != MUSER_BACKEND_CUDA) c.o.membw_gbs = measure_membw(&c);
    }
    if (!c.no_membw && !c.no_paired) c.o.paired_membw_bytes = (size_t)(c.size_mb < 256 ? c.size_mb : 256) << 20;
    if (!c.quiet) c.o.progress = print_progress;
    mu_bench_result r;
    mu_error err;
    if (!mu_bench_run(&c.o, &r, &err)) {
        cli_error("bench", err.msg);
        cli_free(&c);
        return 1;
    }
    print_table(&c, &r);
    print_paired(&r);
    print_depth_costs(&r);
    rc = 0;
    if (c.json && !mu_bench_write_json(c.json, &c.o, &r, &err)) {
        cli_error("bench", err.msg);
        rc = 1;
    }
    if (c.plot && !mu_bench_write_plot(c.plot, &r, &err)) {
        cli_error("bench", err.msg);
        rc = 1;
    }
    mu_bench_result_free(&r);
    cli_free(&c);
    return rc;
}
