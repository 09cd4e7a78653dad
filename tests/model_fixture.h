/* Shared test fixture: synthesize tiny models into a temp dir. */
#ifndef MUSER_MODEL_FIXTURE_H
#define MUSER_MODEL_FIXTURE_H
#include "tools/tools.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* mkdtemp-based scratch dir; returns a static path buffer. */
static const char *fx_tmpdir(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/muser-test-XXXXXX");
        if (!mkdtemp(dir)) { perror("mkdtemp"); exit(2); }
    }
    return dir;
}

/* Synthesize preset tiny of `type` (seed) into the temp dir; returns path (static ring of buffers). */
static const char *fx_synth(const char *type, uint64_t seed, int64_t window) {
    static char paths[16][256];
    static int next;
    char *p = paths[next++ % 16];
    snprintf(p, 256, "%s/tiny-%s-%llu-%lld.gguf", fx_tmpdir(), type, (unsigned long long)seed, (long long)window);
    if (access(p, R_OK) == 0) return p;
    mu_synth_opts o;
    mu_synth_opts_init(&o);
    o.preset = "tiny";
    o.type = type;
    o.seed = seed;
    o.out_path = p;
    o.window = window;
    o.n_threads = 2;
    o.progress = false;
    mu_error err;
    if (!mu_synth(&o, &err)) {
        fprintf(stderr, "synth %s failed: %s\n", type, err.msg);
        exit(2);
    }
    return p;
}

static void fx_cleanup(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fx_tmpdir());
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
}
#endif
