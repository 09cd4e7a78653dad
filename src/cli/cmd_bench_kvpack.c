/* muser bench kvpack: time to first token with and without a kvpack store
 * (docs/kvpack.md, docs/benchmarks.md). For each depth D, with a prompt
 * of D deterministic token ids:
 *   cold   a fresh session prefills all D tokens (no store);
 *   warm   a fresh session restores the stored pack of the whole prompt
 *          (an exact hit: the stored logits row, nothing prefilled);
 *   delta  a fresh session restores the pack of the prompt's first half
 *          (rounded down to a multiple of 256) and prefills the rest;
 * and the pack bytes each reads, and the time the whole prompt's save took
 * (copy out, compress with --compress, write, fsync, publish). With
 * --levels L1,L2,... each depth also gets a table of pack size, save and
 * restore time (medians of -r) of the whole prompt's pack at each
 * compression level, as a named file in the store (the same codec).
 * Time to first token = until the logits row the first token is drawn
 * from is in host memory (the draw itself is the same in all three). The
 * packs are read through the page cache, as a store on a local disk is on
 * its second use. */
#include "cli.h"
#include "muser.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: muser bench kvpack -m MODEL [-d 2048,16384,65536] [--store DIR] [-r N] [-t N] [--chunk N]\n"
            "                          [--no-delta] [--compress none|zstd|zstd:LEVEL] [--levels none,zstd:1,...]\n\n"
            "  time to first token at each depth: cold prefill, warm (the whole prompt's pack restored)\n"
            "  and delta (the first half's pack restored, the rest prefilled), with the pack bytes read;\n"
            "  -r: warm restores per depth (median; default 3); --store: where the packs go (default a\n"
            "  new directory under /tmp, removed at the end); --compress: the packs' KV chunks as zstd frames;\n"
            "  --levels: per depth, pack bytes and save / restore seconds (medians of -r) at each level.\n");
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t file_bytes(const char *dir, const char *id) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s.kvpack", dir, id);
    struct stat sb;
    return stat(p, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

int cmd_bench_kvpack(int argc, char **argv) {
    const char *model = NULL, *store = NULL;
    int32_t *depths = NULL;
    int64_t n_depths = 0, reps = 3, threads = 0, chunk = 0;
    bool delta = true;
    int zstd_level = 0, levels[16], n_levels = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("bench kvpack", argc, argv, &i, &model);
        else if (!strcmp(a, "--store")) ok = cli_value("bench kvpack", argc, argv, &i, &store);
        else if (!strcmp(a, "--no-delta")) delta = false;
        else if (!strcmp(a, "--compress"))
            ok = cli_value("bench kvpack", argc, argv, &i, &v) && cli_parse_compress("bench kvpack", v, &zstd_level);
        else if (!strcmp(a, "--levels")) {
            ok = cli_value("bench kvpack", argc, argv, &i, &v);
            char buf[256];
            snprintf(buf, sizeof buf, "%s", ok ? v : "");
            n_levels = 0;
            for (char *tok = strtok(buf, ","); ok && tok; tok = strtok(NULL, ",")) {
                if (n_levels == 16) { fprintf(stderr, "muser bench kvpack: at most 16 --levels\n"); ok = false; break; }
                ok = cli_parse_compress("bench kvpack", tok, &levels[n_levels++]);
            }
        }
        else if (!strcmp(a, "-d") || !strcmp(a, "--depth")) {
            free(depths);
            ok = cli_value("bench kvpack", argc, argv, &i, &v) && cli_parse_ids("bench kvpack", "--depth", v, &depths, &n_depths);
        } else if (!strcmp(a, "-r") || !strcmp(a, "--reps"))
            ok = cli_value("bench kvpack", argc, argv, &i, &v) && cli_parse_i64("bench kvpack", a, v, 1, 1000, &reps);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("bench kvpack", argc, argv, &i, &v) && cli_parse_i64("bench kvpack", a, v, 1, 1024, &threads);
        else if (!strcmp(a, "--chunk"))
            ok = cli_value("bench kvpack", argc, argv, &i, &v) && cli_parse_i64("bench kvpack", a, v, 1, 65536, &chunk);
        else {
            fprintf(stderr, "muser bench kvpack: unknown option '%s'\n", a);
            ok = false;
        }
        if (!ok) { free(depths); return 2; }
    }
    if (!depths) {
        n_depths = 3;
        depths = malloc(3 * sizeof *depths);
        depths[0] = 2048, depths[1] = 16384, depths[2] = 65536;
    }
    if (!cli_model_or_default("bench kvpack", &model)) { free(depths); return 2; }
    char tmpdir[64] = "";
    if (!store) {
        snprintf(tmpdir, sizeof tmpdir, "/tmp/muser-bench-kvpack-XXXXXX");
        if (!mkdtemp(tmpdir)) { perror("mkdtemp"); free(depths); return 1; }
        store = tmpdir;
    }
    muser_error err;
    muser_model_params mp = {.n_threads = (int)threads};
    muser_model *m = muser_model_load(model, &mp, &err);
    muser_kvstore *st = m ? muser_kvstore_open(m, store, NULL, &err) : NULL;
    int rc = 1;
    if (!st || !muser_kvstore_set_compression(st, zstd_level, &err)) { cli_error("bench kvpack", err.msg); goto out; }
    muser_model_info info;
    muser_model_get_info(m, &info);
    printf("model %s (%s), backend %s, store %s, packs %s (level %d)\n", info.name, info.lane, info.backend, store,
           zstd_level ? "zstd" : "raw", zstd_level);
    printf("%8s %12s %12s %9s %12s %14s %14s %9s %9s\n", "depth", "cold s", "warm s", "cold/warm", "delta s",
           "delta bytes", "full bytes", "delta %", "save s");
    for (int64_t di = 0; di < n_depths; di++) {
        const int64_t D = depths[di];
        if (D < 256) { fprintf(stderr, "muser bench kvpack: depth %lld is below 256\n", (long long)D); goto out; }
        int32_t *t = malloc((size_t)D * sizeof *t);
        uint64_t r = 0x2545F4914F6CDD1Dull ^ (uint64_t)D;
        for (int64_t i = 0; i < D; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            t[i] = (int32_t)(r % (uint64_t)info.n_vocab);
        }
        muser_session_params sp = {.n_ctx = D, .prefill_chunk = chunk};
        /* cold */
        muser_session *s = muser_session_create(m, &sp, &err);
        if (!s) { cli_error("bench kvpack", err.msg); free(t); goto out; }
        char id_full[65], id_half[65];
        bool existed;
        const int64_t half = delta ? D / 2 / 256 * 256 : 0;
        /* cold, in two timed pieces (the logits do not depend on the cut):
         * the first half's pack is stored between them, untimed */
        double t0 = now();
        bool ok = !half || muser_session_feed(s, t, half, &err);
        double cold = now() - t0;
        ok = ok && (!half || muser_kvstore_save(st, s, NULL, id_half, &existed, &err));
        t0 = now();
        ok = ok && muser_session_feed(s, t + half, D - half, &err);
        cold += now() - t0;
        t0 = now();
        ok = ok && muser_kvstore_save(st, s, NULL, id_full, &existed, &err);
        const double save_s = now() - t0;
        if (!ok) { cli_error("bench kvpack", err.msg); free(t); muser_session_free(s); goto out; }
        /* warm: exact hits */
        double *w = malloc((size_t)reps * sizeof *w);
        for (int64_t k = 0; k < reps && ok; k++) {
            muser_session_reset(s);
            t0 = now();
            int64_t reused = 0;
            ok = muser_kvstore_prefill(st, s, t, D, &reused, &err) == 0 && reused == D && muser_session_logits(s);
            w[k] = now() - t0;
        }
        qsort(w, (size_t)reps, sizeof *w, cmp_d);
        const double warm = w[reps / 2];
        free(w);
        double dt = 0;
        uint64_t dbytes = 0;
        if (ok && delta) { /* restore the half, prefill the rest (no new packs: timed without the saves) */
            muser_session_reset(s);
            t0 = now();
            ok = muser_kvstore_restore(st, id_half, s, NULL, &err) && muser_session_feed(s, t + half, D - half, &err);
            dt = now() - t0;
            dbytes = muser_kvstore_bytes_read(st);
        }
        if (!ok) { cli_error("bench kvpack", err.msg); free(t); muser_session_free(s); goto out; }
        const uint64_t full = file_bytes(store, id_full);
        if (delta)
            printf("%8lld %12.3f %12.4f %9.1f %12.3f %14llu %14llu %8.1f%% %9.3f\n", (long long)D, cold, warm,
                   cold / warm, dt, (unsigned long long)dbytes, (unsigned long long)full,
                   100.0 * (double)dbytes / (double)full, save_s);
        else
            printf("%8lld %12.3f %12.4f %9.1f %12s %14s %14llu %9s %9.3f\n", (long long)D, cold, warm, cold / warm, "-",
                   "-", (unsigned long long)full, "-", save_s);
        fflush(stdout);
        if (n_levels) { /* the whole prompt's pack again, at each level, as a named file */
            ok = muser_kvstore_restore(st, id_full, s, NULL, &err);
            printf("  %-9s %14s %8s %10s %10s\n", "level", "pack bytes", "ratio", "save s", "restore s");
            double raw_bytes = 0;
            for (int li = 0; ok && li < n_levels; li++) {
                double *sv = malloc((size_t)reps * sizeof *sv), *rs = malloc((size_t)reps * sizeof *rs);
                uint64_t bytes = 0, rbytes = 0;
                muser_session *r2 = muser_session_create(m, &sp, &err);
                ok = r2 != NULL;
                for (int64_t k = 0; ok && k < reps; k++) {
                    t0 = now();
                    ok = muser_kvpack_save_file(s, NULL, store, "bench-levels.kvpack", NULL, levels[li], &bytes, &err);
                    sv[k] = now() - t0;
                    muser_session_reset(r2);
                    t0 = now();
                    ok = ok && muser_kvpack_restore_file(r2, NULL, store, "bench-levels.kvpack", NULL, &rbytes, &err) &&
                         muser_session_logits(r2);
                    rs[k] = now() - t0;
                }
                if (ok) {
                    qsort(sv, (size_t)reps, sizeof *sv, cmp_d);
                    qsort(rs, (size_t)reps, sizeof *rs, cmp_d);
                    if (li == 0 || !raw_bytes) raw_bytes = levels[li] ? 0 : (double)bytes;
                    char name[16];
                    snprintf(name, sizeof name, levels[li] ? "zstd:%d" : "none", levels[li]);
                    char ratio[16] = "-";
                    if (raw_bytes) snprintf(ratio, sizeof ratio, "%.3fx", raw_bytes / (double)bytes);
                    printf("  %-9s %14llu %8s %10.3f %10.3f\n", name, (unsigned long long)bytes, ratio, sv[reps / 2],
                           rs[reps / 2]);
                    fflush(stdout);
                }
                free(sv);
                free(rs);
                muser_session_free(r2);
            }
            if (!ok) { cli_error("bench kvpack", err.msg); free(t); muser_session_free(s); goto out; }
        }
        muser_session_free(s);
        free(t);
    }
    rc = 0;
out:
    muser_kvstore_close(st);
    muser_model_free(m);
    free(depths);
    if (tmpdir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "muser bench kvpack: could not remove %s\n", tmpdir);
    }
    return rc;
}
