/* muser kvpack: durable KV packs from the command line (docs/kvpack.md).
 *   save     prefill a prompt and store its pack
 *   restore  restore a pack and continue generating from its logits row
 *   ls       list a store: name, tokens, size, identity summary, check result
 *   verify   check every byte of packs (and their identity against -m)
 *   gc       evict least recently used packs down to a size quota
 * A client of the public API (include/muser.h). */
#include "cli.h"
#include "muser.h"
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef struct kv_opts {
    const char *model, *store, *key, *prompt, *prompt_file;
    int32_t *tokens;
    int64_t n_tokens, ctx, chunk, threads, n_predict;
    uint64_t max_bytes;
    bool have_max;
    int zstd_level;
    float temp;
    uint64_t seed;
    const char *args[64];
    int n_args;
} kv_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: muser kvpack <save|restore|ls|verify|gc> [options]\n\n"
            "  muser kvpack save    -m MODEL --store DIR (-p TEXT | -f FILE | --tokens IDS) [-c N] [--chunk N]\n"
            "                       [--compress none|zstd|zstd:LEVEL] [--max-size BYTES[K|M|G]]\n"
            "  muser kvpack restore -m MODEL --store DIR NAME|PATH [-n N] [--temp T] [--seed S] [-c N]\n"
            "  muser kvpack ls      --store DIR [-m MODEL]\n"
            "  muser kvpack verify  [-m MODEL] PATH...\n"
            "  muser kvpack gc      --store DIR --max-size BYTES[K|M|G]\n\n"
            "  --key FILE   HMAC key file (mode 0600; default $MUSER_KVPACK_KEY, else kvpack.key in the\n"
            "               store or the pack's directory; save makes one when there is none)\n"
            "  --compress   zstd: each KV chunk a zstd frame (level 3, or 1..19); none (default): raw\n"
            "  --max-size   with save: evict least recently used packs down to this size afterwards\n"
            "  -t N         threads; -c N context (default: the model's, at most 4096, or what the pack needs)\n"
            "restore continues greedily (--temp 0, the default) or sampled with --temp and --seed.\n"
            "verify and ls exit non-zero when a pack is refused, printing which field or section failed.\n");
}

static bool parse_size(const char *s, uint64_t *out) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || s[0] == '-') return false;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end || v > UINT64_MAX / mul) return false;
    *out = v * mul;
    return true;
}

static int parse(int argc, char **argv, kv_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 32;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("kvpack", argc, argv, &i, &o->model);
        else if (!strcmp(a, "--store")) ok = cli_value("kvpack", argc, argv, &i, &o->store);
        else if (!strcmp(a, "--key")) ok = cli_value("kvpack", argc, argv, &i, &o->key);
        else if (!strcmp(a, "--compress"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_compress("kvpack", v, &o->zstd_level);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) ok = cli_value("kvpack", argc, argv, &i, &o->prompt);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) ok = cli_value("kvpack", argc, argv, &i, &o->prompt_file);
        else if (!strcmp(a, "--tokens"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_ids("kvpack", "--tokens", v, &o->tokens, &o->n_tokens);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_i64("kvpack", a, v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--chunk"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_i64("kvpack", a, v, 1, 65536, &o->chunk);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_i64("kvpack", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_i64("kvpack", a, v, 0, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "--temp"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_f32("kvpack", a, v, &o->temp);
        else if (!strcmp(a, "--seed") || !strcmp(a, "-s"))
            ok = cli_value("kvpack", argc, argv, &i, &v) && cli_parse_u64("kvpack", a, v, &o->seed);
        else if (!strcmp(a, "--max-size")) {
            ok = cli_value("kvpack", argc, argv, &i, &v) && parse_size(v, &o->max_bytes);
            if (!ok && v) fprintf(stderr, "muser kvpack: --max-size expects BYTES with an optional K, M or G, got '%s'\n", v);
            o->have_max = ok;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "muser kvpack: unknown option '%s' (see muser kvpack --help)\n", a);
            return 2;
        } else if (o->n_args < 64) o->args[o->n_args++] = a;
        else { fprintf(stderr, "muser kvpack: too many arguments\n"); return 2; }
        if (!ok) return 2;
    }
    return -1;
}

static muser_model *load(kv_opts *o, muser_error *err) {
    if (!cli_model_or_default("kvpack", &o->model)) return NULL;
    muser_model_params mp = {.n_threads = (int)o->threads};
    muser_model *m = muser_model_load(o->model, &mp, err);
    if (!m) cli_error("kvpack", err->msg);
    return m;
}

static int64_t default_ctx(muser_model *m, const kv_opts *o, int64_t need) {
    muser_model_info info;
    muser_model_get_info(m, &info);
    int64_t c = o->ctx ? o->ctx : (info.n_ctx_train < 4096 ? info.n_ctx_train : 4096);
    if (!o->ctx && c < need) c = need;
    return c;
}

static int do_save(kv_opts *o) {
    if (!o->store) { fprintf(stderr, "muser kvpack save: --store DIR is required\n"); return 2; }
    if ((o->prompt != NULL) + (o->prompt_file != NULL) + (o->tokens != NULL) != 1) {
        fprintf(stderr, "muser kvpack save: give one of -p, -f or --tokens\n");
        return 2;
    }
    muser_error err;
    muser_model *m = load(o, &err);
    if (!m) return 1;
    int rc = 1;
    int32_t *ids = o->tokens;
    int64_t n = o->n_tokens;
    char *text = NULL;
    muser_session *s = NULL;
    muser_kvstore *st = NULL;
    if (!ids) {
        size_t len = 0;
        text = o->prompt_file ? cli_read_file("kvpack", o->prompt_file, &len) : strdup(o->prompt);
        if (!text) goto out;
        if (!o->prompt_file) len = strlen(text);
        n = muser_tokenize(m, text, len, true, true, &ids, &err);
        if (n < 0) { cli_error("kvpack save", err.msg); goto out; }
    }
    if (n <= 0) { fprintf(stderr, "muser kvpack save: the prompt has no tokens\n"); goto out; }
    muser_session_params sp = {.n_ctx = default_ctx(m, o, n), .prefill_chunk = o->chunk};
    if (!(s = muser_session_create(m, &sp, &err)) || !(st = muser_kvstore_open(m, o->store, o->key, &err)) ||
        !muser_kvstore_set_compression(st, o->zstd_level, &err) || !muser_session_feed(s, ids, n, &err)) {
        cli_error("kvpack save", err.msg);
        goto out;
    }
    if (o->have_max) muser_kvstore_set_quota(st, o->max_bytes);
    char id[65];
    bool existed = false;
    if (!muser_kvstore_save(st, s, NULL, id, &existed, &err)) { cli_error("kvpack save", err.msg); goto out; }
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.kvpack", o->store, id);
    struct stat sb;
    long long bytes = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
    printf("%s %lld tokens %lld bytes%s\n", id, (long long)n, bytes, existed ? " (already stored)" : "");
    rc = 0;
out:
    if (ids != o->tokens) free(ids);
    free(text);
    muser_kvstore_close(st);
    muser_session_free(s);
    muser_model_free(m);
    return rc;
}

static int do_restore(kv_opts *o) {
    if (!o->store || o->n_args != 1) {
        fprintf(stderr, "muser kvpack restore: --store DIR and one pack NAME or PATH are required\n");
        return 2;
    }
    muser_error err;
    muser_model *m = load(o, &err);
    if (!m) return 1;
    int rc = 1;
    muser_session *s = NULL;
    muser_kvstore *st = NULL;
    muser_sampler *smp = NULL;
    muser_detok *dt = NULL;
    muser_kvpack_info info;
    char path[4200];
    const char *name = o->args[0];
    if (strlen(name) == 64 && !strchr(name, '/')) snprintf(path, sizeof path, "%s/%s.kvpack", o->store, name);
    else snprintf(path, sizeof path, "%s", name);
    if (!(st = muser_kvstore_open(m, o->store, o->key, &err)) || !muser_kvpack_verify(path, o->key, m, &info, &err)) {
        cli_error("kvpack restore", err.msg);
        goto out;
    }
    muser_session_params sp = {.n_ctx = default_ctx(m, o, (int64_t)info.n_tokens + o->n_predict), .prefill_chunk = o->chunk};
    muser_sampling_params spp;
    muser_sampling_params_default(&spp);
    spp.temp = o->temp;
    spp.seed = o->seed ? (uint32_t)o->seed : MUSER_SEED_RANDOM;
    if (!(s = muser_session_create(m, &sp, &err)) || !(smp = muser_sampler_create(m, &spp, &err))) {
        cli_error("kvpack restore", err.msg);
        goto out;
    }
    double t0 = 0;
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t0 = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    }
    if (!muser_kvstore_restore(st, name, s, NULL, &err)) { cli_error("kvpack restore", err.msg); goto out; }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t_restore = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - t0;
    fprintf(stderr, "restored %lld tokens (%llu bytes) in %.3f s\n", (long long)muser_session_pos(s),
            (unsigned long long)info.file_bytes, t_restore);
    dt = muser_model_has_tokenizer(m) ? muser_detok_new(m, false) : NULL;
    for (int64_t i = 0; i < o->n_predict; i++) {
        int32_t t = muser_sampler_sample(smp, muser_session_logits(s), &err);
        if (t < 0 || !muser_sampler_accept(smp, t, &err)) { cli_error("kvpack restore", err.msg); goto out; }
        size_t len = 0;
        const char *piece = dt ? muser_detok_push(dt, t, &len) : NULL;
        if (dt) fwrite(piece, 1, len, stdout);
        else printf("%s%d", i ? " " : "", t);
        fflush(stdout);
        if (muser_token_is_eog(m, t) || muser_session_pos(s) >= muser_session_n_ctx(s)) break;
        if (!muser_session_feed(s, &t, 1, &err)) { cli_error("kvpack restore", err.msg); goto out; }
    }
    if (dt) {
        size_t len = 0;
        const char *tail = muser_detok_flush(dt, &len);
        fwrite(tail, 1, len, stdout);
    }
    printf("\n");
    rc = 0;
out:
    muser_detok_free(dt);
    muser_sampler_free(smp);
    muser_kvstore_close(st);
    muser_session_free(s);
    muser_model_free(m);
    return rc;
}

static void print_info(const char *name, const muser_kvpack_info *in) {
    printf("%s  %8llu tokens  %12llu bytes  %s  model %.16s  tokenizer %.16s  %lld layers x %lld kv heads x %lld, "
           "window %lld%s",
           name, (unsigned long long)in->n_tokens, (unsigned long long)in->file_bytes, in->lane, in->model_sha256,
           in->tokenizer_sha256, (long long)in->n_layer, (long long)in->n_head_kv, (long long)in->head_dim,
           (long long)in->sliding_window, in->has_sampler ? ", sampler state" : "");
    if (in->has_dflash) printf(", DFlash context (assistant %.16s)", in->assistant_sha256);
    if (in->zstd)
        printf(", zstd: kv %llu of %llu bytes (%.2fx)", (unsigned long long)in->kv_stored_bytes,
               (unsigned long long)in->kv_raw_bytes,
               in->kv_stored_bytes ? (double)in->kv_raw_bytes / (double)in->kv_stored_bytes : 0.0);
    printf("\n");
}

static int do_verify(kv_opts *o) {
    if (!o->n_args) { fprintf(stderr, "muser kvpack verify: give pack paths\n"); return 2; }
    muser_error err;
    muser_model *m = NULL;
    if (o->model && !(m = load(o, &err))) return 1;
    int bad = 0;
    for (int i = 0; i < o->n_args; i++) {
        muser_kvpack_info info;
        if (muser_kvpack_verify(o->args[i], o->key, m, &info, &err)) {
            printf("ok %s\n", o->args[i]);
            print_info("  ", &info);
        } else {
            printf("REFUSED %s\n", o->args[i]);
            fprintf(stderr, "muser kvpack verify: %s\n", err.msg);
            bad++;
        }
    }
    muser_model_free(m);
    return bad ? 1 : 0;
}

static int do_ls(kv_opts *o) {
    if (!o->store) { fprintf(stderr, "muser kvpack ls: --store DIR is required\n"); return 2; }
    muser_error err;
    muser_model *m = NULL;
    if (o->model && !(m = load(o, &err))) return 1;
    DIR *d = opendir(o->store);
    if (!d) {
        fprintf(stderr, "muser kvpack ls: cannot open %s\n", o->store);
        muser_model_free(m);
        return 1;
    }
    int bad = 0, n = 0;
    struct dirent *de;
    uint64_t total = 0;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l != 64 + 7 || strcmp(de->d_name + 64, ".kvpack")) continue;
        char path[4400], name[65];
        snprintf(path, sizeof path, "%s/%s", o->store, de->d_name);
        memcpy(name, de->d_name, 64);
        name[64] = 0;
        muser_kvpack_info info;
        n++;
        if (muser_kvpack_verify(path, o->key, m, &info, &err)) {
            print_info(name, &info);
            total += info.file_bytes;
        } else {
            printf("%s  REFUSED: %s\n", name, err.msg);
            bad++;
        }
    }
    closedir(d);
    printf("%d packs, %llu bytes%s\n", n, (unsigned long long)total, m ? " (identity checked against the model)" : "");
    muser_model_free(m);
    return bad ? 1 : 0;
}

static int do_gc(kv_opts *o) {
    if (!o->store || !o->have_max) { fprintf(stderr, "muser kvpack gc: --store DIR and --max-size are required\n"); return 2; }
    muser_error err;
    muser_kvstore_gc_stats g;
    if (!muser_kvstore_gc(o->store, o->max_bytes, &g, &err)) { cli_error("kvpack gc", err.msg); return 1; }
    printf("%lld packs, %llu bytes; removed %lld (least recently used first) and %lld temporary files; %llu bytes left\n",
           (long long)g.packs, (unsigned long long)g.bytes_before, (long long)g.removed, (long long)g.temp_removed,
           (unsigned long long)g.bytes_after);
    return 0;
}

int cmd_kvpack(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    const char *sub = argv[1];
    if (!strcmp(sub, "-h") || !strcmp(sub, "--help")) { usage(stdout); return 0; }
    kv_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) { free(o.tokens); return rc; }
    if (!strcmp(sub, "save")) rc = do_save(&o);
    else if (!strcmp(sub, "restore")) rc = do_restore(&o);
    else if (!strcmp(sub, "ls")) rc = do_ls(&o);
    else if (!strcmp(sub, "verify")) rc = do_verify(&o);
    else if (!strcmp(sub, "gc")) rc = do_gc(&o);
    else {
        fprintf(stderr, "muser kvpack: unknown subcommand '%s' (save, restore, ls, verify, gc)\n", sub);
        rc = 2;
    }
    free(o.tokens);
    return rc;
}
