/* muser synth / muser quantize: thin argument front-ends to src/tools. */
#include "cli.h"
#include "tools/tools.h"
#include <stdlib.h>
#include <string.h>

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: muser synth --preset tiny|small|full --type TYPE [--seed S] -o OUT.gguf [overrides]\n\n"
            "Writes a deterministic random-weight Muse Glimmer GGUF (llama.cpp-valid metadata and a\n"
            "byte-level tokenizer). Same seed, same bytes, whatever the thread count.\n\n"
            "  --preset NAME     tiny (4 layers, 256 hidden), small (~1.5 GB at q4_k_xl), full (52 layers, 6656 hidden)\n"
            "  --type TYPE       %s\n"
            "  --seed S          default 0\n"
            "  -o, --output FILE\n"
            "  -t, --threads N   default: all cores\n"
            "  --no-progress\n"
            "  overrides: --layers N --embd N --heads N --heads-kv N --head-dim N --ff N --vocab N --ctx N --window N\n",
            mu_tools_type_names());
}

int cmd_synth(int argc, char **argv) {
    mu_synth_opts o;
    mu_synth_opts_init(&o);
    o.progress = true;
    int64_t threads = 0;
    static const char *override_flags[] = {"--layers", "--embd", "--heads", "--heads-kv", "--head-dim",
                                           "--ff", "--vocab", "--ctx", "--window"};
    int64_t *override_fields[] = {&o.n_layer, &o.n_embd, &o.n_head, &o.n_head_kv, &o.head_dim,
                                  &o.n_ff, &o.n_vocab, &o.n_ctx, &o.window};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true, matched = false;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { synth_usage(stdout); return 0; }
        for (size_t k = 0; k < sizeof override_flags / sizeof override_flags[0]; k++)
            if (!strcmp(a, override_flags[k])) {
                matched = true;
                ok = cli_value("synth", argc, argv, &i, &v) && cli_parse_i64("synth", a, v, 1, 1 << 30, override_fields[k]);
            }
        if (matched) { if (!ok) return 2; continue; }
        if (!strcmp(a, "--preset")) ok = cli_value("synth", argc, argv, &i, &o.preset);
        else if (!strcmp(a, "--type")) ok = cli_value("synth", argc, argv, &i, &o.type);
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) ok = cli_value("synth", argc, argv, &i, &o.out_path);
        else if (!strcmp(a, "--seed")) ok = cli_value("synth", argc, argv, &i, &v) && cli_parse_u64("synth", a, v, &o.seed);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("synth", argc, argv, &i, &v) && cli_parse_i64("synth", a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--no-progress")) o.progress = false;
        else {
            fprintf(stderr, "muser synth: unknown option '%s' (see muser synth --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (!o.out_path) { fprintf(stderr, "muser synth: -o OUT.gguf is required\n"); return 2; }
    o.n_threads = (int)threads;
    mu_error err;
    if (!mu_synth(&o, &err)) {
        cli_error("synth", err.msg);
        return 1;
    }
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {0};
    int npos = 0;
    int64_t threads = 0;
    bool progress = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: muser quantize IN.gguf OUT.gguf TYPE|MIX [-t N] [--no-progress]\n\n"
                   "  TYPE|MIX: %s\n"
                   "Norm vectors stay F32; NVFP4 companions are regenerated; metadata is copied.\n",
                   mu_tools_type_names());
            return 0;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_value("quantize", argc, argv, &i, &v) || !cli_parse_i64("quantize", a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--no-progress")) progress = false;
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "muser quantize: unknown option '%s'\n", a);
            return 2;
        } else if (npos < 3) pos[npos++] = a;
        else {
            fprintf(stderr, "muser quantize: too many arguments ('%s')\n", a);
            return 2;
        }
    }
    if (npos != 3) {
        fprintf(stderr, "muser quantize: expected IN OUT TYPE (see muser quantize --help)\n");
        return 2;
    }
    mu_error err;
    if (!mu_quantize_file(pos[0], pos[1], pos[2], (int)threads, progress, &err)) {
        cli_error("quantize", err.msg);
        return 1;
    }
    return 0;
}
