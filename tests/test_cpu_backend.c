/* The cpu backend against the ref backend, op by op, bit for bit:
 * every weight format (both NVFP4 layouts, with and without the per-tensor
 * scale), ragged shapes, 1..17 activation rows, thread counts 1, 2, 3, 8 and
 * every ISA level this machine has (scalar, avx2, avx512), and on AVX-512 the
 * load-time X16 layout of Q4_K too. Inputs are random
 * and non-zero, plus edge rows (all zero, sign ties, specials for the
 * transcendental ops). */
#include "testutil.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_repack.h"
#include "kv/kv.h"
#include "quant/quant.h"
#include <math.h>

#define MAX_BACKENDS 12
static mu_backend *cpus[MAX_BACKENDS];
static int n_cpus;
static mu_backend *ref;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static const char *label(const mu_backend *b) {
    static char s[64];
    snprintf(s, sizeof s, "%s/%dt", mu_cpu_isa_name(mu_backend_cpu_isa(b)), b->n_threads);
    return s;
}

static float *rand_vec(int64_t n, float scale) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) v[i] = tu_rng_normal(&rng) * scale;
    return v;
}

/* First mismatching index or -1. */
static int64_t diff_at(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4)) return i;
    return -1;
}

#define EXPECT_SAME(got, want, n, ...) do { int64_t _i = diff_at(got, want, n); if (_i >= 0) { \
    fprintf(stderr, "  mismatch at %lld: %.9g vs ref %.9g: ", (long long)_i, (double)(got)[_i], (double)(want)[_i]); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); tu_failures++; } } while (0)

/* ---------------------------------------------------------------- matmul */

typedef struct test_weight {
    mu_weight w;
    uint8_t *data, *scales;
} test_weight;

/* f16 fields of random-byte blocks get finite random values. */
static void sanitize_f16(uint8_t *p) {
    uint16_t h = mu_f32_to_f16(tu_rng_uniform(&rng) * 0.02f);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static void randomize_bytes(uint32_t type, uint8_t *row, uint64_t bytes) {
    for (uint64_t i = 0; i < bytes; i++) row[i] = (uint8_t)tu_rng_next(&rng);
    switch (type) {
    case MU_TYPE_Q4_0: for (uint64_t o = 0; o < bytes; o += 18) sanitize_f16(row + o); break;
    case MU_TYPE_Q8_0: for (uint64_t o = 0; o < bytes; o += 34) sanitize_f16(row + o); break;
    case MU_TYPE_Q4_K: for (uint64_t o = 0; o < bytes; o += 144) { sanitize_f16(row + o); sanitize_f16(row + o + 2); } break;
    case MU_TYPE_Q5_K: for (uint64_t o = 0; o < bytes; o += 176) { sanitize_f16(row + o); sanitize_f16(row + o + 2); } break;
    case MU_TYPE_Q6_K: for (uint64_t o = 0; o < bytes; o += 210) sanitize_f16(row + o + 208); break;
    case MU_TYPE_F16: for (uint64_t o = 0; o < bytes; o += 2) sanitize_f16(row + o); break;
    case MU_TYPE_BF16: for (uint64_t o = 0; o < bytes; o += 2) { uint16_t h = mu_f32_to_bf16(tu_rng_normal(&rng)); row[o] = (uint8_t)h; row[o + 1] = (uint8_t)(h >> 8); } break;
    case MU_TYPE_F32: for (uint64_t o = 0; o < bytes; o += 4) { float f = tu_rng_normal(&rng); memcpy(row + o, &f, 4); } break;
    default: break; /* NVFP4 payloads and scales: every byte is valid */
    }
}

/* mode 0: quantized from random floats; 1: random bytes; 2: as 0 with the
 * per-tensor scale (ggml `.scale` / native scale2 != 1). */
static bool make_weight(uint32_t type, int64_t n_in, int64_t n_out, int mode, test_weight *tw) {
    memset(tw, 0, sizeof *tw);
    mu_weight *w = &tw->w;
    w->name = "test";
    w->type = type;
    w->n_in = n_in;
    w->n_out = n_out;
    w->scale = 1.0f;
    if (!mu_type_row_bytes(type, (uint64_t)n_in, &w->row_bytes)) return false;
    tw->data = malloc(w->row_bytes * (uint64_t)n_out);
    float *src = rand_vec(n_in * n_out, 0.5f);
    if (type == MU_TYPE_NVFP4_E2M1) {
        tw->scales = malloc((size_t)(n_in / 16 * n_out));
        float scale2 = mu_nvfp4_tensor_scale2(src, n_in * n_out);
        if (mode == 2) scale2 *= 3.0f;
        for (int64_t o = 0; o < n_out; o++)
            mu_nvfp4_quantize_row(src + o * n_in, tw->data + o * (n_in / 2), tw->scales + o * (n_in / 16), scale2, n_in);
        if (mode == 1)
            for (int64_t i = 0; i < n_in / 2 * n_out; i++) tw->data[i] = (uint8_t)tu_rng_next(&rng);
        w->nvfp4_scales = tw->scales;
        w->scale = scale2;
        w->has_scale = true;
    } else {
        for (int64_t o = 0; o < n_out; o++) {
            uint8_t *row = tw->data + (uint64_t)o * w->row_bytes;
            if (mode == 1) randomize_bytes(type, row, w->row_bytes);
            else mu_quantize_row(type, src + o * n_in, row, n_in);
        }
        if (mode == 2) {
            w->has_scale = true;
            w->scale = 0.7f + tu_rng_uniform(&rng) * 0.1f;
        }
    }
    w->data = tw->data;
    free(src);
    mu_error err;
    bool ok = mu_weight_check(w, &err);
    CHECK_MSG(ok, "%s", err.msg);
    return ok;
}

static void free_weight(test_weight *tw) {
    free(tw->data);
    free(tw->scales);
}

/* Activation rows with edge cases mixed in. */
static float *make_acts(int64_t rows, int64_t n) {
    float *x = rand_vec(rows * n, 1.0f);
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * n;
        if (r == 1) memset(xr, 0, (size_t)n * sizeof(float)); /* all-zero Q8_K blocks */
        if (r == 2 && n > 8) { xr[3] = 9.0f; xr[7] = -9.0f; } /* |max| tie: the first one wins */
        if (r == 3) for (int64_t i = 0; i < n; i++) xr[i] *= 1e-3f;
        if (r == 4 && n > 300) for (int64_t i = 256; i < n; i++) xr[i] = 0.0f; /* zero block after a live one */
    }
    return x;
}

static void check_matmul(uint32_t type, int64_t n_in, int64_t n_out, int mode, const int64_t *row_counts, int n_rc) {
    test_weight tw;
    if (!make_weight(type, n_in, n_out, mode, &tw)) return;
    int64_t max_rows = 0;
    for (int i = 0; i < n_rc; i++) max_rows = row_counts[i] > max_rows ? row_counts[i] : max_rows;
    float *x = make_acts(max_rows, n_in);
    float *want = malloc((size_t)(max_rows * n_out) * sizeof(float));
    float *got = malloc((size_t)(max_rows * n_out) * sizeof(float));
    /* the load-time packed layout (X16, X8) of the backends that want it (one copy per backend) */
    uint8_t *packed[MAX_BACKENDS] = {0};
    mu_weight pw[MAX_BACKENDS];
    const uint64_t bytes = tw.w.row_bytes * (uint64_t)n_out;
    for (int c = 0; c < n_cpus; c++) {
        if (!cpus[c]->wants_repack || !cpus[c]->wants_repack(cpus[c], &tw.w)) continue;
        packed[c] = malloc(bytes);
        memcpy(packed[c], tw.data, bytes);
        pw[c] = tw.w;
        pw[c].data = packed[c];
        cpus[c]->repack(cpus[c], &pw[c], packed[c]);
        CHECK(pw[c].layout == (mu_backend_cpu_isa(cpus[c]) == MU_CPU_ISA_AVX512 ? MU_LAYOUT_X16 : MU_LAYOUT_X8));
        CHECK(memcmp(packed[c], tw.data, bytes) != 0);
    }
    for (int i = 0; i < n_rc; i++) {
        int64_t rows = row_counts[i];
        ref->matmul(ref, &tw.w, x, want, rows);
        for (int c = 0; c < n_cpus; c++) {
            /* packed first: the activation buffer then holds the previous
             * call's side tables, not this one's (the packed path must
             * write whatever it reads) */
            if (packed[c]) {
                memset(got, 0xFF, (size_t)(rows * n_out) * sizeof(float));
                cpus[c]->matmul(cpus[c], &pw[c], x, got, rows);
                EXPECT_SAME(got, want, rows * n_out, "packed (layout %d) matmul %s mode %d n_in %lld n_out %lld rows %lld on %s",
                            (int)pw[c].layout, mu_type_name(type), mode, (long long)n_in, (long long)n_out, (long long)rows, label(cpus[c]));
            }
            memset(got, 0xFF, (size_t)(rows * n_out) * sizeof(float));
            cpus[c]->matmul(cpus[c], &tw.w, x, got, rows);
            EXPECT_SAME(got, want, rows * n_out, "matmul %s mode %d n_in %lld n_out %lld rows %lld on %s",
                        mu_type_name(type), mode, (long long)n_in, (long long)n_out, (long long)rows, label(cpus[c]));
        }
    }
    for (int c = 0; c < n_cpus; c++) free(packed[c]);
    free(x);
    free(want);
    free(got);
    free_weight(&tw);
}

/* matmul_multi over weights of one type whose activations the cpu
 * backend may or may not share: packed whole (X16: blocks only) and with
 * GGUF tail rows (side tables), in both orders, against the ref's single
 * matmuls. */
static void test_matmul_multi(void) {
    const int64_t n_in = 512, outs[3] = {48, 37, 48};
    test_weight tw[3];
    for (int i = 0; i < 3; i++)
        if (!make_weight(MU_TYPE_Q4_K, n_in, outs[i], 0, &tw[i])) return;
    const int64_t max_rows = 9;
    float *x = make_acts(max_rows, n_in);
    float *want[3], *got[3];
    for (int i = 0; i < 3; i++) {
        want[i] = malloc((size_t)(max_rows * outs[i]) * sizeof(float));
        got[i] = malloc((size_t)(max_rows * outs[i]) * sizeof(float));
    }
    for (int c = 0; c < n_cpus; c++) {
        mu_weight pw[3];
        uint8_t *packed[3] = {0};
        for (int i = 0; i < 3; i++) {
            pw[i] = tw[i].w;
            if (!cpus[c]->wants_repack || !cpus[c]->wants_repack(cpus[c], &tw[i].w)) continue;
            const uint64_t bytes = tw[i].w.row_bytes * (uint64_t)outs[i];
            packed[i] = malloc(bytes);
            memcpy(packed[i], tw[i].data, bytes);
            pw[i].data = packed[i];
            cpus[c]->repack(cpus[c], &pw[i], packed[i]);
        }
        for (int64_t rows = 1; rows <= max_rows; rows++) {
            for (int i = 0; i < 3; i++) ref->matmul(ref, &tw[i].w, x, want[i], rows);
            for (int i = 0; i < 3; i++) memset(got[i], 0xFF, (size_t)(rows * outs[i]) * sizeof(float));
            cpus[c]->matmul_multi(cpus[c], 3, (const mu_weight *[]){&pw[0], &pw[1], &pw[2]}, x, got, rows);
            for (int i = 0; i < 3; i++)
                EXPECT_SAME(got[i], want[i], rows * outs[i], "matmul_multi weight %d (n_out %lld) rows %lld on %s", i,
                            (long long)outs[i], (long long)rows, label(cpus[c]));
        }
        for (int i = 0; i < 3; i++) free(packed[i]);
    }
    for (int i = 0; i < 3; i++) {
        free(want[i]);
        free(got[i]);
        free_weight(&tw[i]);
    }
    free(x);
}

static void test_matmul(void) {
    static const uint32_t qtypes[] = {MU_TYPE_Q4_K, MU_TYPE_Q5_K, MU_TYPE_Q6_K, MU_TYPE_Q8_0,
                                      MU_TYPE_Q4_0, MU_TYPE_NVFP4, MU_TYPE_NVFP4_E2M1};
    static const int64_t all_rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
    static const int64_t few_rows[] = {1, 2, 5, 17};
    for (size_t t = 0; t < sizeof qtypes / sizeof qtypes[0]; t++)
        for (int mode = 0; mode < 3; mode++) {
            check_matmul(qtypes[t], 512, 37, mode, all_rows, 17);
            check_matmul(qtypes[t], 256, 1, mode, few_rows, 4);
            check_matmul(qtypes[t], 768, 16, mode, few_rows, 4);
            check_matmul(qtypes[t], 512, 48, mode, all_rows, 17); /* packed whole: no GGUF rows left */
        }
    check_matmul(MU_TYPE_Q4_K, 1024, 130, 0, few_rows, 4); /* several tasks per thread */
    check_matmul(MU_TYPE_Q5_K, 8448, 9, 0, few_rows, 4);   /* 33 blocks: past the X8 decode's broadcast buffer */
    /* prefill-sized: activation quantization split over tasks of 16-row groups */
    static const int64_t many_rows[] = {33, 40, 70}; /* 70: past the X8 kernel's 64-row panel */
    check_matmul(MU_TYPE_Q4_K, 1024, 40, 0, many_rows, 3);
    check_matmul(MU_TYPE_Q5_K, 1024, 24, 1, many_rows, 3);
    check_matmul(MU_TYPE_Q6_K, 1024, 40, 2, many_rows, 3);
    check_matmul(MU_TYPE_NVFP4_E2M1, 1024, 20, 0, many_rows, 2);
    /* the X16 kernel's Q4_K / Q5_K min pairs: rows in chunks (70 rows x 33 blocks
     * past its stack buffer), and on the heap (513 blocks: not even 4 rows fit) */
    static const int64_t chunk_rows[] = {70}, heap_rows[] = {5};
    check_matmul(MU_TYPE_Q4_K, 8448, 32, 0, chunk_rows, 1);
    check_matmul(MU_TYPE_Q5_K, 131328, 16, 0, heap_rows, 1);
    static const uint32_t ftypes[] = {MU_TYPE_F32, MU_TYPE_F16, MU_TYPE_BF16};
    static const int64_t ragged[] = {1, 15, 16, 31, 33, 100, 256};
    for (size_t t = 0; t < 3; t++)
        for (size_t k = 0; k < sizeof ragged / sizeof ragged[0]; k++) {
            check_matmul(ftypes[t], ragged[k], 7, 1, few_rows, 4);
            check_matmul(ftypes[t], ragged[k], 18, 2, all_rows, 17);
        }
}

/* Packing (X16 and X8) is a permutation: the reference inverse gives back
 * every GGUF block, and rows past the last group are untouched (any block
 * size: Q5_K and Q6_K exercise the odd-size tail of a block). */
static void test_pack_roundtrip(void) {
    static const uint32_t types[] = {MU_TYPE_Q4_K, MU_TYPE_Q5_K, MU_TYPE_Q6_K};
    static const int widths[] = {16, 8};
    for (int wi = 0; wi < 2; wi++)
        for (int t = 0; t < 3; t++) {
            const int W = widths[wi];
            test_weight tw;
            if (!make_weight(types[t], 768, 37, 1, &tw)) return;
            CHECK(mu_cpu_pack_eligible(&tw.w, W));
            const int64_t groups = 37 / W;
            const uint64_t bytes = tw.w.row_bytes * 37, bb = mu_cpu_pack_block_bytes(&tw.w);
            uint8_t *p = malloc(bytes), *blocks = malloc((size_t)W * bb);
            memcpy(p, tw.data, bytes);
            mu_cpu_pack_groups(&tw.w, p, W, 0, groups);
            mu_weight pw = tw.w;
            pw.data = p;
            for (int64_t g = 0; g < groups; g++)
                for (int64_t b = 0; b < 3; b++) {
                    mu_cpu_unpack_ref(mu_cpu_pack_at(&pw, bb, W, g, b), bb, W, blocks);
                    for (int r = 0; r < W; r++)
                        CHECK_MSG(!memcmp(blocks + r * bb, tw.data + (uint64_t)(W * g + r) * tw.w.row_bytes + b * bb, bb),
                                  "%s width %d group %lld block %lld row %d", mu_type_name(types[t]), W, (long long)g,
                                  (long long)b, r);
                }
            const uint64_t packed_bytes = (uint64_t)(groups * W) * tw.w.row_bytes;
            CHECK(memcmp(p, tw.data, packed_bytes) != 0);
            CHECK(!memcmp(p + packed_bytes, tw.data + packed_bytes, bytes - packed_bytes));
            free(p);
            free(blocks);
            free_weight(&tw);
        }
}

/* Native NVFP4 W4A4 mode runs the scalar kernel on every ISA. */
static void test_w4a4(void) {
    test_weight tw;
    if (!make_weight(MU_TYPE_NVFP4_E2M1, 256, 9, 0, &tw)) return;
    tw.w.input_scale_inv = 1.5f;
    float *x = make_acts(3, 256), want[27], got[27];
    ref->matmul(ref, &tw.w, x, want, 3);
    for (int c = 0; c < n_cpus; c++) {
        cpus[c]->matmul(cpus[c], &tw.w, x, got, 3);
        EXPECT_SAME(got, want, 27, "W4A4 on %s", label(cpus[c]));
    }
    free(x);
    free_weight(&tw);
}

/* ---------------------------------------------------------------- row ops */

static void test_rmsnorm(void) {
    static const int64_t ns[] = {1, 15, 33, 128, 1000};
    static const int64_t rows_list[] = {1, 3, 40};
    for (size_t i = 0; i < 5; i++)
        for (size_t j = 0; j < 3; j++)
            for (int with_w = 0; with_w < 2; with_w++) {
                int64_t n = ns[i], rows = rows_list[j];
                float *x = rand_vec(n * rows, 3.0f), *w = with_w ? rand_vec(n, 1.0f) : NULL;
                float *want = malloc((size_t)(n * rows) * sizeof(float)), *got = malloc((size_t)(n * rows) * sizeof(float));
                ref->rmsnorm(ref, x, w, 1e-5f, want, n, rows);
                for (int c = 0; c < n_cpus; c++) {
                    cpus[c]->rmsnorm(cpus[c], x, w, 1e-5f, got, n, rows);
                    EXPECT_SAME(got, want, n * rows, "rmsnorm n %lld rows %lld w %d on %s", (long long)n, (long long)rows,
                                with_w, label(cpus[c]));
                    memcpy(got, x, (size_t)(n * rows) * sizeof(float)); /* in place, as the forward pass does */
                    cpus[c]->rmsnorm(cpus[c], got, w, 1e-5f, got, n, rows);
                    EXPECT_SAME(got, want, n * rows, "in-place rmsnorm n %lld on %s", (long long)n, label(cpus[c]));
                }
                free(x); free(w); free(want); free(got);
            }
}

/* The fused residual step against the ref's ops one by one (x += rmsnorm(o,
 * 1e-8) * w_o, or x += o without w_o (the DFlash assistant's); h =
 * rmsnorm(x) * w_h, or no h after the last layer); residual_capture: the
 * same, and the new x in rows of a wider capture buffer (the bytes around
 * them untouched). */
static void test_residual(void) {
    static const int64_t ns[] = {33, 3072, 512};
    static const int64_t rows_list[] = {1, 2, 3, 4, 9, 40};
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 6; j++)
            for (int with_h = 0; with_h < 2; with_h++)
            for (int plain = 0; plain < 2; plain++) {
                const int64_t n = ns[i], rows = rows_list[j], N = n * rows;
                const size_t bytes = (size_t)N * sizeof(float);
                float *x = rand_vec(N, 2.0f), *o = rand_vec(N, 0.01f), *w_o = rand_vec(n, 1.0f), *w_h = rand_vec(n, 1.0f);
                float *want_x = malloc(bytes), *want_o = malloc(bytes), *want_h = malloc(bytes);
                float *got_x = malloc(bytes), *got_o = malloc(bytes), *got_h = malloc(bytes);
                memcpy(want_x, x, bytes);
                memcpy(want_o, o, bytes);
                if (!plain) ref->rmsnorm(ref, want_o, w_o, 1e-8f, want_o, n, rows);
                ref->add(ref, want_x, want_o, N);
                if (with_h) ref->rmsnorm(ref, want_x, w_h, 1e-5f, want_h, n, rows);
                for (int c = 0; c < n_cpus; c++) {
                    memcpy(got_x, x, bytes);
                    memcpy(got_o, o, bytes);
                    cpus[c]->residual(cpus[c], got_x, got_o, plain ? NULL : w_o, 1e-8f, with_h ? got_h : NULL,
                                      with_h ? w_h : NULL, 1e-5f, n, rows);
                    EXPECT_SAME(got_x, want_x, N, "residual%s x n %lld rows %lld on %s", plain ? " (plain)" : "",
                                (long long)n, (long long)rows, label(cpus[c]));
                    if (with_h)
                        EXPECT_SAME(got_h, want_h, N, "residual%s h n %lld rows %lld on %s", plain ? " (plain)" : "",
                                    (long long)n, (long long)rows, label(cpus[c]));
                    const int64_t stride = 3 * n + 5, cn = rows * stride;
                    float *cap = rand_vec(cn, 1.0f), *want_cap = malloc((size_t)cn * sizeof(float));
                    memcpy(want_cap, cap, (size_t)cn * sizeof(float));
                    for (int64_t r = 0; r < rows; r++)
                        memcpy(want_cap + r * stride + n + 2, want_x + r * n, (size_t)n * sizeof(float));
                    memcpy(got_x, x, bytes);
                    memcpy(got_o, o, bytes);
                    cpus[c]->residual_capture(cpus[c], got_x, got_o, plain ? NULL : w_o, 1e-8f, with_h ? got_h : NULL,
                                              with_h ? w_h : NULL, 1e-5f, n, rows, cap + n + 2, stride);
                    EXPECT_SAME(got_x, want_x, N, "residual_capture x n %lld rows %lld on %s", (long long)n,
                                (long long)rows, label(cpus[c]));
                    EXPECT_SAME(cap, want_cap, cn, "residual_capture rows n %lld rows %lld on %s", (long long)n,
                                (long long)rows, label(cpus[c]));
                    if (with_h)
                        EXPECT_SAME(got_h, want_h, N, "residual_capture h n %lld rows %lld on %s", (long long)n,
                                    (long long)rows, label(cpus[c]));
                    free(cap);
                    free(want_cap);
                }
                free(x); free(o); free(w_o); free(w_h);
                free(want_x); free(want_o); free(want_h); free(got_x); free(got_o); free(got_h);
            }
}

static void test_rope(void) {
    static const int64_t dims[][2] = {{8, 8}, {64, 64}, {40, 16}, {128, 34}, {64, 2}};
    for (size_t i = 0; i < 5; i++)
        for (int64_t rows = 1; rows <= 41; rows += 20)
            for (int neox = 0; neox < 2; neox++) {
            const int64_t H = 3, D = dims[i][0], R = dims[i][1], n = rows * H * D;
            float *x = rand_vec(n, 2.0f), *cs = rand_vec(rows * R, 1.0f);
            float *want = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
            memcpy(want, x, (size_t)n * sizeof(float));
            ref->rope(ref, want, H, D, R, cs, rows, neox);
            CHECK(memcmp(want, x, (size_t)n * sizeof(float)) != 0); /* it rotated something */
            for (int c = 0; c < n_cpus; c++) {
                memcpy(got, x, (size_t)n * sizeof(float));
                cpus[c]->rope(cpus[c], got, H, D, R, cs, rows, neox);
                EXPECT_SAME(got, want, n, "rope%s D %lld n_rot %lld rows %lld on %s", neox ? " neox" : "", (long long)D,
                            (long long)R, (long long)rows, label(cpus[c]));
            }
            free(x); free(cs); free(want); free(got);
        }
}

/* ---------------------------------------------------------------- elementwise */

/* Wide-range values with the specials every branch of mu_expf/mu_tanhf sees.
 * No NaN inputs: which NaN payload survives a commutative op depends on the
 * compiler's operand order, even between two builds of the ref. */
static float *special_vec(int64_t n) {
    static const float specials[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.874f, 0.875f, 9.0f, 9.2f, -9.2f,
                                     88.7f, 89.0f, -87.5f, -103.0f, -104.0f, -150.0f, 200.0f, INFINITY, -INFINITY, -88.0f};
    float *v = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        float u = tu_rng_uniform(&rng);
        v[i] = i % 7 == 0 ? specials[(i / 7) % 20] : i % 3 == 0 ? u * 120.0f : u * 4.0f;
    }
    return v;
}

static void test_elementwise(void) {
    static const int64_t ns[] = {1, 17, 100, 70001};
    for (size_t i = 0; i < 4; i++) {
        const int64_t n = ns[i];
        float *a = special_vec(n), *b = special_vec(n);
        float *want = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
        for (int op = 0; op < 5; op++) {
            memcpy(want, a, (size_t)n * sizeof(float));
            switch (op) {
            case 0: ref->sigmoid_gate(ref, want, b, n); break;
            case 1: ref->swiglu(ref, want, b, n); break;
            case 2: ref->add(ref, want, b, n); break;
            case 3: ref->logit_tail(ref, want, 0.196116f, 20.0f, n); break;
            case 4: ref->logit_tail(ref, want, 0.5f, 0.0f, n); break;
            }
            for (int c = 0; c < n_cpus; c++) {
                mu_backend *be = cpus[c];
                memcpy(got, a, (size_t)n * sizeof(float));
                switch (op) {
                case 0: be->sigmoid_gate(be, got, b, n); break;
                case 1: be->swiglu(be, got, b, n); break;
                case 2: be->add(be, got, b, n); break;
                case 3: be->logit_tail(be, got, 0.196116f, 20.0f, n); break;
                case 4: be->logit_tail(be, got, 0.5f, 0.0f, n); break;
                }
                EXPECT_SAME(got, want, n, "elementwise op %d n %lld on %s", op, (long long)n, label(be));
            }
        }
        free(a); free(b); free(want); free(got);
    }
}

/* ---------------------------------------------------------------- kv store */

/* kv_store's destinations: row r at phys[r] of the layer lays[r % n_lay],
 * journal slot slot[r] in jk/jv (NULL: none). */
static void kv_dsts(mu_kv_dst *d, int64_t rows, mu_kv_layer *const *lays, int n_lay, const int64_t *phys,
                    uint16_t *jk, uint16_t *jv, int64_t jcap, const int64_t *slot) {
    for (int64_t r = 0; r < rows; r++)
        d[r] = (mu_kv_dst){.l = lays[r % n_lay], .physical = phys[r], .jk = jk, .jv = jv, .jcap = jcap,
                           .slot = jk ? slot[r] : -1};
}

/* f16 rounding of the stored K/V rows against the ref: ties, the
 * overflow edge, subnormals, zeros, infinities and NaNs among normal
 * values, head_dim 40 (a vector tail) and 128, rows in scattered slots;
 * then rows of one store going to two caches (alternating), journaled. */
static void test_kv_store(void) {
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7FBFFFFFu,
        0x477FEFFFu, 0x477FF000u, 0xC77FF000u, 0x47800000u, 0x38800000u, 0x387FFFFFu, 0x33000000u, 0x33000001u,
        0x32FFFFFFu, 0x00000001u, 0x3F801000u, 0x3F803000u, 0x3F800FFFu, 0x3F801001u, 0x35800000u, 0xB5C00000u};
    const int64_t dims[] = {40, 128};
    for (int di = 0; di < 2; di++) {
        const int64_t D = dims[di], H = 3, cap = 11, rows = 5;
        const int64_t phys[5] = {7, 0, 10, 3, 4};
        mu_kv_dst dst[5];
        float *k = rand_vec(rows * H * D, 4.0f), *v = rand_vec(rows * H * D, 0.001f);
        for (int64_t i = 0; i < rows * H * D; i += 3) {
            uint32_t bits = special[(i / 3) % (sizeof special / sizeof *special)];
            memcpy(i % 2 ? &k[i] : &v[i], &bits, 4);
        }
        const size_t bytes = (size_t)(H * cap * D) * sizeof(uint16_t);
        uint16_t *want_k = calloc(1, bytes), *want_v = calloc(1, bytes), *got_k = malloc(bytes), *got_v = malloc(bytes);
        mu_kv_layer l = {.cap = cap, .n_head = H, .head_dim = D, .row_elems = H * D, .k = want_k, .v = want_v};
        mu_kv_layer *lp = &l;
        kv_dsts(dst, rows, &lp, 1, phys, NULL, NULL, 0, NULL);
        ref->kv_store(ref, rows, dst, k, v);
        for (int c = 0; c < n_cpus; c++) {
            memset(got_k, 0, bytes);
            memset(got_v, 0, bytes);
            l.k = got_k;
            l.v = got_v;
            cpus[c]->kv_store(cpus[c], rows, dst, k, v);
            CHECK_MSG(!memcmp(got_k, want_k, bytes) && !memcmp(got_v, want_v, bytes), "kv_store D %lld on %s",
                      (long long)D, label(cpus[c]));
        }
        /* journaled: the rows written now (want_k/v) are overwritten by new
         * values; each row's old bytes go to a scattered journal slot */
        const int64_t jcap = 9, slot[5] = {8, 2, 0, 5, 6};
        const size_t jbytes = (size_t)(H * jcap * D) * sizeof(uint16_t);
        uint16_t *old_k = malloc(bytes), *old_v = malloc(bytes), *jk = calloc(1, jbytes), *jv = calloc(1, jbytes);
        uint16_t *gjk = malloc(jbytes), *gjv = malloc(jbytes);
        memcpy(old_k, want_k, bytes), memcpy(old_v, want_v, bytes);
        float *k2 = rand_vec(rows * H * D, 2.0f), *v2 = rand_vec(rows * H * D, 2.0f);
        l.k = want_k, l.v = want_v;
        kv_dsts(dst, rows, &lp, 1, phys, jk, jv, jcap, slot);
        ref->kv_store(ref, rows, dst, k2, v2);
        int saved_ok = 1;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t h = 0; h < H; h++)
                saved_ok &= !memcmp(jk + (h * jcap + slot[r]) * D, old_k + (h * cap + phys[r]) * D, (size_t)D * 2) &&
                            !memcmp(jv + (h * jcap + slot[r]) * D, old_v + (h * cap + phys[r]) * D, (size_t)D * 2);
        CHECK_MSG(saved_ok, "kv_store D %lld on ref: the journal holds the overwritten rows", (long long)D);
        for (int c = 0; c < n_cpus; c++) {
            memcpy(got_k, old_k, bytes), memcpy(got_v, old_v, bytes);
            memset(gjk, 0, jbytes), memset(gjv, 0, jbytes);
            l.k = got_k, l.v = got_v;
            kv_dsts(dst, rows, &lp, 1, phys, gjk, gjv, jcap, slot);
            cpus[c]->kv_store(cpus[c], rows, dst, k2, v2);
            CHECK_MSG(!memcmp(got_k, want_k, bytes) && !memcmp(got_v, want_v, bytes) && !memcmp(gjk, jk, jbytes) &&
                          !memcmp(gjv, jv, jbytes),
                      "journaled kv_store D %lld on %s", (long long)D, label(cpus[c]));
        }
        /* two caches in one store: rows 0, 2, 4 into l (cap 11), rows 1, 3 into m (cap 7), journaled */
        const int64_t cap2 = 7, phys2[5] = {7, 6, 10, 0, 4};
        const size_t bytes2 = (size_t)(H * cap2 * D) * sizeof(uint16_t);
        uint16_t *mk = calloc(1, bytes2), *mv = calloc(1, bytes2), *gmk = malloc(bytes2), *gmv = malloc(bytes2);
        mu_kv_layer m = {.cap = cap2, .n_head = H, .head_dim = D, .row_elems = H * D, .k = mk, .v = mv};
        mu_kv_layer *two[2] = {&l, &m};
        memcpy(want_k, old_k, bytes), memcpy(want_v, old_v, bytes);
        l.k = want_k, l.v = want_v;
        memset(jk, 0, jbytes), memset(jv, 0, jbytes);
        kv_dsts(dst, rows, two, 2, phys2, jk, jv, jcap, slot);
        ref->kv_store(ref, rows, dst, k2, v2);
        for (int c = 0; c < n_cpus; c++) {
            memcpy(got_k, old_k, bytes), memcpy(got_v, old_v, bytes);
            memset(gmk, 0, bytes2), memset(gmv, 0, bytes2), memset(gjk, 0, jbytes), memset(gjv, 0, jbytes);
            l.k = got_k, l.v = got_v, m.k = gmk, m.v = gmv;
            kv_dsts(dst, rows, two, 2, phys2, gjk, gjv, jcap, slot);
            cpus[c]->kv_store(cpus[c], rows, dst, k2, v2);
            CHECK_MSG(!memcmp(got_k, want_k, bytes) && !memcmp(got_v, want_v, bytes) && !memcmp(gmk, mk, bytes2) &&
                          !memcmp(gmv, mv, bytes2) && !memcmp(gjk, jk, jbytes) && !memcmp(gjv, jv, jbytes),
                      "kv_store into two caches, D %lld on %s", (long long)D, label(cpus[c]));
            m.k = mk, m.v = mv;
        }
        int nz = 0;
        for (size_t i = 0; i < bytes2 / 2; i++) nz += mk[i] != 0;
        CHECK_MSG(nz > 0, "kv_store into two caches, D %lld: the ref wrote the second cache", (long long)D);
        free(mk); free(mv); free(gmk); free(gmv);
        free(k2); free(v2); free(old_k); free(old_v); free(jk); free(jv); free(gjk); free(gjv);
        free(k); free(v); free(want_k); free(want_v); free(got_k); free(got_v);
    }
}

/* ---------------------------------------------------------------- attention */

static void check_attention_at(const mu_kv_cache *kv, int64_t pos, int64_t window, int64_t H, int64_t Hkv, int64_t D) {
    const mu_kv_layer *layer = &kv->layers[0];
    mu_attn_batch a = {.rows = 1, .kv = &layer, .pos = &pos, .window = window, .n_head = H, .n_head_kv = Hkv,
                       .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
    float *q = rand_vec(H * D, 1.5f);
    float *want = malloc((size_t)(H * D) * sizeof(float)), *got = malloc((size_t)(H * D) * sizeof(float));
    ref->attention(ref, &a, q, want);
    for (int c = 0; c < n_cpus; c++) {
        cpus[c]->attention(cpus[c], &a, q, got);
        EXPECT_SAME(got, want, H * D, "attention pos %lld window %lld H %lld/%lld D %lld on %s", (long long)pos,
                    (long long)window, (long long)H, (long long)Hkv, (long long)D, label(cpus[c]));
    }
    free(q); free(want); free(got);
}

static void test_attention_case(bool swa, int64_t window, int64_t n_ctx, int64_t H, int64_t Hkv, int64_t D,
                                int64_t n_pos) {
    mu_kv_cache kv;
    mu_error err;
    bool is_swa[1] = {swa};
    if (!mu_kv_init(&kv, NULL, 1, is_swa, window, 0, n_ctx, Hkv, D, &err)) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    float *k = malloc((size_t)(Hkv * D) * sizeof(float)), *v = malloc((size_t)(Hkv * D) * sizeof(float));
    for (int64_t p = 0; p < n_pos; p++) {
        for (int64_t i = 0; i < Hkv * D; i++) {
            k[i] = tu_rng_normal(&rng) * (p % 97 == 5 ? 6.0f : 1.0f); /* a few dominant keys */
            v[i] = tu_rng_normal(&rng);
        }
        CHECK(mu_kv_append(&kv, 0, p, k, v, &err));
        /* every position early, then a sample including block edges */
        if (p < 20 || p % 61 == 0 || p % 256 == 255 || p % 256 == 0 || p == n_pos - 1)
            check_attention_at(&kv, p, swa ? window : 0, H, Hkv, D);
    }
    if (!swa) check_attention_at(&kv, n_pos / 3, 0, H, Hkv, D); /* an earlier query over a longer plane */
    free(k);
    free(v);
    mu_kv_free(&kv);
}

/* A batch of rows from several sequences (one cache each) at mixed
 * positions: one, two and three 256-key blocks, and more rows than one
 * dispatch of the cpu driver takes (cpu_attention.c), against the ref. */
static void test_attention_batch(bool swa, int64_t window, int64_t H, int64_t Hkv, int64_t D, int64_t rows) {
    enum { SEQS = 3 };
    const int64_t n_ctx = 700, n_pos = 650;
    mu_kv_cache kv[SEQS];
    mu_error err;
    bool is_swa[1] = {swa};
    float *k = malloc((size_t)(Hkv * D) * sizeof(float)), *v = malloc((size_t)(Hkv * D) * sizeof(float));
    for (int s = 0; s < SEQS; s++) {
        if (!mu_kv_init(&kv[s], NULL, 1, is_swa, window, 0, n_ctx, Hkv, D, &err)) {
            CHECK_MSG(false, "%s", err.msg);
            return;
        }
        for (int64_t p = 0; p < n_pos; p++) {
            for (int64_t i = 0; i < Hkv * D; i++) {
                k[i] = tu_rng_normal(&rng) * (p % 89 == 3 ? 5.0f : 1.0f);
                v[i] = tu_rng_normal(&rng);
            }
            CHECK(mu_kv_append(&kv[s], 0, p, k, v, &err));
        }
    }
    const mu_kv_layer **layers = malloc((size_t)rows * sizeof *layers);
    int64_t *pos = malloc((size_t)rows * sizeof *pos);
    for (int64_t r = 0; r < rows; r++) {
        layers[r] = &kv[(r * 7 + r / 5) % SEQS].layers[0];
        /* the oldest held position up to the last (a ring keeps the window) */
        const int64_t lo = swa ? n_pos - window : 0;
        pos[r] = r % 4 == 0 ? n_pos - 1 : lo + (int64_t)(tu_rng_next(&rng) % (uint64_t)(n_pos - lo));
    }
    mu_attn_batch a = {.rows = rows, .kv = layers, .pos = pos, .window = window, .n_head = H, .n_head_kv = Hkv,
                       .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
    float *q = rand_vec(rows * H * D, 1.5f);
    float *want = malloc((size_t)(rows * H * D) * sizeof(float)), *got = malloc((size_t)(rows * H * D) * sizeof(float));
    ref->attention(ref, &a, q, want);
    for (int c = 0; c < n_cpus; c++) {
        memset(got, 0, (size_t)(rows * H * D) * sizeof(float));
        cpus[c]->attention(cpus[c], &a, q, got);
        EXPECT_SAME(got, want, rows * H * D, "attention batch of %lld rows, window %lld, H %lld/%lld D %lld on %s",
                    (long long)rows, (long long)window, (long long)H, (long long)Hkv, (long long)D, label(cpus[c]));
    }
    for (int s = 0; s < SEQS; s++) mu_kv_free(&kv[s]);
    free(q); free(want); free(got); free(layers); free(pos); free(k); free(v);
}

/* Rows [0, n) of k / v into a one-layer cache, in stores of 16 rows (a ring's slack). */
static bool store_rows(mu_kv_cache *c, const float *k, const float *v, int64_t n, int64_t row, mu_error *err) {
    for (int64_t p = 0; p < n; p += 16)
        if (!mu_kv_store(c, 0, p, n - p < 16 ? n - p : 16, k + p * row, v + p * row, err)) return false;
    return true;
}

/* Token-tree rows (backend.h mu_attn_tree): 16 rows with random parents
 * stored after n0 committed keys. Each row must give the bits of a plain
 * row at its own position in a cache holding the committed keys and then
 * its ancestors' keys in depth order (what plain decoding stores), on the
 * ref; and the cpu backends the ref's bits for the whole tree batch. */
static void test_attention_tree(bool swa, int64_t window, int64_t n0, int64_t H, int64_t Hkv, int64_t D) {
    enum { T = MU_TREE_MAX };
    const int64_t KV = Hkv * D, n_ctx = n0 + T + 8;
    mu_error err;
    bool is_swa[1] = {swa};
    float *k = rand_vec((n0 + T) * KV, 1.0f), *v = rand_vec((n0 + T) * KV, 1.0f); /* prefix, then the rows */
    for (int64_t i = 0; i < KV; i++) k[(n0 + 5) * KV + i] *= 6.0f; /* a dominant key in the tree */
    int32_t parent[T], depth[T];
    mu_attn_tree tree[T];
    int64_t tpos[T];
    for (int i = 0; i < T; i++) {
        parent[i] = i ? (int32_t)(tu_rng_next(&rng) % (uint64_t)i) : -1;
        if (i == 3) parent[i] = 2; /* at least one deep path */
        depth[i] = i ? depth[parent[i]] + 1 : 0;
        tree[i].base = n0;
        for (int32_t r = i, d = depth[i]; d >= 0; r = parent[r], d--) tree[i].anc[d] = r;
        tpos[i] = n0 + depth[i];
    }
    mu_kv_cache kv;
    if (!mu_kv_init(&kv, NULL, 1, is_swa, window, T - 1, n_ctx, Hkv, D, &err)) {
        CHECK_MSG(false, "%s", err.msg);
        return;
    }
    CHECK(store_rows(&kv, k, v, n0, KV, &err) && mu_kv_store(&kv, 0, n0, T, k + n0 * KV, v + n0 * KV, &err));
    const mu_kv_layer *layers[T];
    for (int i = 0; i < T; i++) layers[i] = &kv.layers[0];
    float *q = rand_vec(T * H * D, 1.5f);
    float *want = malloc((size_t)(T * H * D) * sizeof(float)), *got = malloc((size_t)(T * H * D) * sizeof(float));
    mu_attn_batch a = {.rows = T, .kv = layers, .pos = tpos, .window = swa ? window : 0, .n_head = H,
                       .n_head_kv = Hkv, .head_dim = D, .scale = 1.0f / sqrtf((float)D), .tree = tree};
    ref->attention(ref, &a, q, want);
    for (int i = 0; i < T; i++) { /* row i against a plain row over its path */
        mu_kv_cache pk;
        if (!mu_kv_init(&pk, NULL, 1, is_swa, window, T - 1, n_ctx, Hkv, D, &err)) {
            CHECK_MSG(false, "%s", err.msg);
            break;
        }
        CHECK(store_rows(&pk, k, v, n0, KV, &err));
        for (int d = 1; d <= depth[i]; d++) /* the root first, as in the tree */
            CHECK(mu_kv_store(&pk, 0, n0 + d - 1, 1, k + (n0 + tree[i].anc[d - 1]) * KV,
                              v + (n0 + tree[i].anc[d - 1]) * KV, &err));
        CHECK(mu_kv_store(&pk, 0, n0 + depth[i], 1, k + (n0 + i) * KV, v + (n0 + i) * KV, &err));
        const mu_kv_layer *pl = &pk.layers[0];
        mu_attn_batch b = {.rows = 1, .kv = &pl, .pos = &tpos[i], .window = a.window, .n_head = H, .n_head_kv = Hkv,
                           .head_dim = D, .scale = a.scale};
        ref->attention(ref, &b, q + i * H * D, got);
        EXPECT_SAME(got, want + i * H * D, H * D, "tree row %d (depth %d) against its plain row, n0 %lld window %lld",
                    i, depth[i], (long long)n0, (long long)window);
        mu_kv_free(&pk);
    }
    for (int c = 0; c < n_cpus; c++) {
        memset(got, 0, (size_t)(T * H * D) * sizeof(float));
        cpus[c]->attention(cpus[c], &a, q, got);
        EXPECT_SAME(got, want, T * H * D, "tree attention, n0 %lld window %lld H %lld/%lld D %lld on %s", (long long)n0,
                    (long long)window, (long long)H, (long long)Hkv, (long long)D, label(cpus[c]));
    }
    /* The same tree in the tree registers (backend.h mu_tree_regs): the
     * batch bounds each row's position by base + r and the registers give
     * its depth and ancestors; RoPE's table reads the depths too. */
    mu_tree_regs tr = {.n = T};
    int64_t bound[T];
    mu_attn_tree rbase[T];
    for (int i = 0; i < T; i++) {
        tr.parent[i] = parent[i];
        tr.depth[i] = depth[i];
        tr.node[i] = tree[i];
        tr.node[i].base = -7; /* unused: the batch's base counts */
        rbase[i] = (mu_attn_tree){.base = n0};
        bound[i] = n0 + i;
    }
    mu_attn_batch ar = a;
    ar.pos = bound;
    ar.tree = rbase;
    for (int c = -1; c < n_cpus; c++) {
        mu_backend *be = c < 0 ? ref : cpus[c];
        be->treg = tr;
        ar.treg = &be->treg;
        memset(got, 0, (size_t)(T * H * D) * sizeof(float));
        be->attention(be, &ar, q, got);
        EXPECT_SAME(got, want, T * H * D, "tree-register attention, n0 %lld window %lld on %s", (long long)n0,
                    (long long)window, c < 0 ? "ref" : label(cpus[c]));
        const double inv_freq[3] = {1.0, 0.01, 1e-4};
        float cs_want[T * 6], cs_got[T * 6];
        be->rope_table(be, inv_freq, 3, tpos, T, cs_want, false);
        be->rope_table(be, inv_freq, 3, bound, T, cs_got, true);
        CHECK_MSG(!memcmp(cs_want, cs_got, sizeof cs_want), "rope_table on the tree registers' depths, n0 %lld",
                  (long long)n0);
        memset(&be->treg, 0, sizeof be->treg);
    }
    mu_kv_free(&kv);
    free(q); free(want); free(got); free(k); free(v);
}

static void test_attention(void) {
    test_attention_tree(false, 0, 250, 24, 2, 128);  /* the tree crosses a 256-key block edge */
    test_attention_tree(true, 300, 700, 24, 2, 128); /* a wrapped ring, the window cuts the prefix */
    test_attention_tree(true, 64, 3, 6, 3, 40);      /* a short prefix, ragged head_dim */
    test_attention_tree(false, 0, 510, 8, 1, 64);
    test_attention_case(false, 0, 700, 4, 2, 64, 600);   /* full plane, 3 blocks */
    test_attention_case(true, 300, 1000, 6, 2, 128, 650); /* ring of 300 wraps twice */
    test_attention_case(true, 64, 256, 3, 3, 40, 200);    /* no GQA, ragged head_dim */
    test_attention_case(false, 0, 300, 16, 1, 128, 280);  /* 16 query heads per KV head */
    test_attention_case(true, 200, 400, 24, 2, 128, 300); /* 12 per KV head (the small preset) */
    test_attention_case(false, 0, 300, 20, 1, 64, 270);   /* more than 16 per KV head */
    for (int64_t rows = 1; rows <= 9; rows++) test_attention_batch(false, 0, 24, 2, 128, rows); /* decode steps */
    test_attention_batch(true, 300, 24, 2, 128, 5);
    test_attention_batch(false, 0, 4, 2, 64, 300); /* more rows than one dispatch takes */
}

int main(void) {
    setenv("MUSER_CPU_REPACK", "1", 1); /* the packed layouts whatever the caller's environment says */
    ref = mu_backend_ref_create(1);
    static const int threads[] = {1, 2, 3, 8};
    for (int isa = MU_CPU_ISA_SCALAR; isa <= MU_CPU_ISA_AVX512; isa++) {
        if (getenv("SKIP_AVX2") && isa == MU_CPU_ISA_AVX2) continue;
        if (!mu_cpu_isa_supported((mu_cpu_isa)isa)) {
            printf("isa %s: not supported here, skipped\n", mu_cpu_isa_name((mu_cpu_isa)isa));
            continue;
        }
        for (int t = 0; t < 4; t++) cpus[n_cpus++] = mu_backend_cpu_create_isa(threads[t], (mu_cpu_isa)isa);
    }
    CHECK(n_cpus >= 4);
    test_matmul();
    test_matmul_multi();
    test_pack_roundtrip();
    test_w4a4();
    test_rmsnorm();
    test_residual();
    test_rope();
    test_elementwise();
    test_kv_store();
    test_attention();
    for (int c = 0; c < n_cpus; c++) cpus[c]->destroy(cpus[c]);
    ref->destroy(ref);
    TEST_MAIN_END();
}
