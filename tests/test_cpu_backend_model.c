/* End to end through the public API: logits of --backend cpu equal
 * --backend ref bit for bit, for every weight format, thread counts 1, 2, 3
 * and 8, prefill chunk sizes 1, 7, 64 and 512, and batched rows
 * (feed_all over chunks) vs single rows (one token per feed); on synthetic
 * tiny models (rings wrap: 40 tokens, window 32) and, when present, on
 * glimmer-tiny (the shipped default, and the F16 export when built). The AVX2 and
 * scalar levels run a subset via MUSER_CPU_ISA. */
#include "testutil.h"
#include "model_fixture.h"
#include "backend/cpu/cpu_backend.h"
#include "muser.h"

#define PROMPT_LEN 40
#define WINDOW 32

static int32_t prompt[PROMPT_LEN];

static muser_model *load(const char *path, muser_backend_kind kind, int threads) {
    muser_error err;
    muser_model_params mp = {.backend = kind, .n_threads = threads};
    muser_model *m = muser_model_load(path, &mp, &err);
    CHECK_MSG(m != NULL, "load %s: %s", path, m ? "" : err.msg);
    return m;
}

/* Every row's logits of the prompt, fed with feed_all in chunks of `chunk`
 * (chunk 0: one muser_session_feed per token, keeping each step's logits). */
static float *run_prompt(muser_model *m, int64_t chunk, int64_t n_tok) {
    muser_model_info info;
    muser_model_get_info(m, &info);
    const int64_t V = info.n_vocab;
    muser_error err;
    muser_session_params sp = {.n_ctx = 256, .prefill_chunk = chunk > 0 ? chunk : 1};
    muser_session *s = muser_session_create(m, &sp, &err);
    CHECK_MSG(s != NULL, "session: %s", s ? "" : err.msg);
    float *out = calloc((size_t)(n_tok * V), sizeof(float));
    if (!s) return out;
    if (chunk > 0) {
        CHECK_MSG(muser_session_feed_all(s, prompt, n_tok, out, &err), "feed_all: %s", err.msg);
    } else {
        for (int64_t i = 0; i < n_tok; i++) {
            CHECK_MSG(muser_session_feed(s, prompt + i, 1, &err), "feed: %s", err.msg);
            const float *l = muser_session_logits(s);
            if (l) memcpy(out + i * V, l, (size_t)V * sizeof(float));
        }
    }
    muser_session_free(s);
    return out;
}

static int64_t vocab_of(muser_model *m) {
    muser_model_info info;
    muser_model_get_info(m, &info);
    return info.n_vocab;
}

/* chunk 0 in a plan: one muser_session_feed per token */
typedef struct run_plan {
    int threads;
    int n_chunks;
    int64_t chunks[5];
} run_plan;

/* Every row's logits from the ref backend (the oracle), or NULL. */
static float *ref_logits(const char *path, int64_t n_tok, int64_t *V) {
    muser_model *rm = load(path, MUSER_BACKEND_REF, 1);
    if (!rm) return NULL;
    *V = vocab_of(rm);
    float *want = run_prompt(rm, 7, n_tok);
    muser_model_free(rm);
    return want;
}

static void compare_model(const char *name, const char *path, const float *want, int64_t V, const run_plan *plans,
                          int n_plans, int64_t n_tok) {
    if (!want) return;
    for (int t = 0; t < n_plans; t++) {
        muser_model *cm = load(path, MUSER_BACKEND_CPU, plans[t].threads);
        if (!cm) continue;
        for (int c = 0; c < plans[t].n_chunks; c++) {
            const int64_t chunk = plans[t].chunks[c];
            float *got = run_prompt(cm, chunk, n_tok);
            for (int64_t r = 0; r < n_tok; r++)
                if (memcmp(got + r * V, want + r * V, (size_t)V * sizeof(float))) {
                    CHECK_MSG(false, "%s (%s): %d threads, chunk %lld: logits of row %lld differ from ref", name,
                              getenv("MUSER_CPU_ISA") ? getenv("MUSER_CPU_ISA") : "best", plans[t].threads,
                              (long long)chunk, (long long)r);
                    break;
                }
            free(got);
        }
        muser_model_free(cm);
    }
}

/* glimmer-tiny: $MUSER_GLIMMER_TINY (a file), the shipped default
 * (models/glimmer-tiny-q4_k_xl.gguf) and, when the trainer's export is in the
 * build tree, its F16 file; every one that exists is compared. */
static void test_glimmer_tiny(void) {
    const char *env = getenv("MUSER_GLIMMER_TINY"), *src = getenv("MUSER_SOURCE_DIR");
    char paths[3][512];
    snprintf(paths[0], sizeof paths[0], "%s", env ? env : "/nonexistent");
    snprintf(paths[1], sizeof paths[1], "%s/models/glimmer-tiny-q4_k_xl.gguf", src ? src : "/nonexistent");
    snprintf(paths[2], sizeof paths[2], "%s/build/glimmer/glimmer-tiny-f16.gguf", src ? src : "/nonexistent");
    static const run_plan plans[] = {{2, 2, {0, 7}}, {3, 1, {64}}};
    int found = 0;
    for (int k = 0; k < 3; k++) {
        FILE *f = fopen(paths[k], "rb");
        if (!f) continue;
        fclose(f);
        int64_t V = 0;
        float *want = ref_logits(paths[k], 16, &V);
        compare_model("glimmer-tiny", paths[k], want, V, plans, 2, 16);
        free(want);
        printf("glimmer-tiny: compared %s\n", paths[k]);
        found++;
    }
    if (!found) printf("glimmer-tiny not present: skipped\n");
}

int main(void) {
    setenv("MUSER_CPU_REPACK", "1", 1); /* the X16 layout whatever the caller's environment says */
    setenv("MUSER_CPU_HUGEPAGES", "1", 1); /* the resident copy even where THP is off */
    for (int i = 0; i < PROMPT_LEN; i++) prompt[i] = (int32_t)((i * 37 + 11) % 500);
    static const char *types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K",
                                  "q4_k_xl", "nvfp4", "nvfp4_ggml"};
    /* Every chunk size and single rows at 2 threads (this machine's cores),
     * one each at 1, 3, 8 (tests/test_cpu_backend.c crosses thread counts
     * with row counts op by op). */
    static const run_plan plans[] = {{2, 5, {0, 1, 7, 64, 512}}, {1, 1, {64}}, {3, 1, {7}}, {8, 1, {1}}};
    const size_t n_types = sizeof types / sizeof types[0];
    float *want[sizeof types / sizeof types[0]];
    int64_t V = 0;
    for (size_t i = 0; i < n_types; i++) {
        const char *path = fx_synth(types[i], 5, WINDOW);
        want[i] = ref_logits(path, PROMPT_LEN, &V);
        compare_model(types[i], path, want[i], V, plans, 4, PROMPT_LEN);
    }
    /* Lower ISA levels through the environment override (the scalar level
     * runs the ref's own functions). */
    static const run_plan lower_plans[] = {{3, 1, {7}}};
    for (int l = 0; l < 2; l++) {
        if (!mu_cpu_isa_supported(l == 0 ? MU_CPU_ISA_AVX2 : MU_CPU_ISA_SCALAR)) continue;
        setenv("MUSER_CPU_ISA", l == 0 ? "avx2" : "scalar", 1);
        for (size_t i = 0; i < n_types; i++)
            /* avx2: the mixes cover Q4_K/Q5_K/Q6_K/F16; scalar: one lane */
            if ((l == 0 && (i < 5 || i > 7) && i != 1) || (l == 1 && i == 8))
                compare_model(types[i], fx_synth(types[i], 5, WINDOW), want[i], V, lower_plans, 1, PROMPT_LEN);
        unsetenv("MUSER_CPU_ISA");
    }
    /* Without the resident copy: the repack then works on the file mapping's
     * copy-on-write pages, one weight at a time. */
    setenv("MUSER_CPU_HUGEPAGES", "0", 1);
    for (size_t i = 0; i < n_types; i++)
        if (!strcmp(types[i], "Q4_K") || !strcmp(types[i], "q4_k_xl"))
            compare_model(types[i], fx_synth(types[i], 5, WINDOW), want[i], V, lower_plans, 1, PROMPT_LEN);
    setenv("MUSER_CPU_HUGEPAGES", "1", 1);
    for (size_t i = 0; i < n_types; i++) free(want[i]);
    test_glimmer_tiny();
    fx_cleanup();
    TEST_MAIN_END();
}
