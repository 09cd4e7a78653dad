/* Every op of the cuda backend against the ref backend, bit for bit, on
 * random non-zero inputs of several shapes (docs/cuda.md). Needs a CUDA
 * device: run by tests/cuda/run.sh, not by CTest (CI has no GPU). */
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_mmt.h"
#include "backend/cuda/cuda_prefill.h"
#include "util/common.h"
#include "util/mumath.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static mu_backend *ref, *cu;
static int n_checks, n_fail;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t next_u32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Non-zero, in [-amp, amp]. */
static float rnd(float amp) {
    float v;
    do v = ((float)(next_u32() & 0xFFFFFF) / 8388608.0f - 1.0f) * amp;
    while (v == 0.0f);
    return v;
}

static float *rnd_vec(size_t n, float amp) {
    float *v = mu_xmalloc(n * sizeof *v + 4);
    for (size_t i = 0; i < n; i++) v[i] = rnd(amp);
    return v;
}

/* A device copy of host bytes. */
static void *dev(const void *host, size_t bytes) {
    void *d = cu->alloc(cu, bytes);
    if (!d) {
        fprintf(stderr, "alloc failed\n");
        exit(1);
    }
    cu->upload(cu, d, host, bytes);
    return d;
}

/* Compare device bytes against host reference bytes. */
static void check(const char *what, const void *want, const void *d, size_t bytes) {
    uint8_t *got = mu_xmalloc(bytes + 1);
    cu->download(cu, got, d, bytes);
    n_checks++;
    if (memcmp(got, want, bytes)) {
        n_fail++;
        size_t i = 0;
        while (i < bytes && got[i] == ((const uint8_t *)want)[i]) i++;
        size_t e = i / 4;
        float g, w;
        memcpy(&g, got + 4 * e, 4);
        memcpy(&w, (const uint8_t *)want + 4 * e, 4);
        fprintf(stderr, "MISMATCH %s: first differing byte %zu (f32 #%zu: cuda %.9g, ref %.9g)\n", what, i, e,
                (double)g, (double)w);
    }
    free(got);
}

/* ------------------------------------------------------------- weights */

typedef struct wspec {
    const char *label;
    uint32_t type;
    bool has_scale, w4a4;
} wspec;

static const wspec WSPECS[] = {
    {"F32", MU_TYPE_F32, false, false},     {"F16", MU_TYPE_F16, false, false},
    {"BF16", MU_TYPE_BF16, false, false},   {"Q4_0", MU_TYPE_Q4_0, false, false},
    {"Q8_0", MU_TYPE_Q8_0, false, false},   {"Q4_K", MU_TYPE_Q4_K, false, false},
    {"Q5_K", MU_TYPE_Q5_K, false, false},   {"Q6_K", MU_TYPE_Q6_K, false, false},
    {"NVFP4_ggml", MU_TYPE_NVFP4, false, false}, {"NVFP4_ggml+scale", MU_TYPE_NVFP4, true, false},
    {"Q4_K+scale", MU_TYPE_Q4_K, true, false}, {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false},
    {"NVFP4_native_W4A4", MU_TYPE_NVFP4_E2M1, false, true},
};

/* Host weight bytes (kept alive to the end: the cuda backend caches its
 * uploads by host pointer). */
static mu_weight make_weight(const wspec *s, int64_t n_in, int64_t n_out) {
    mu_weight w = {.name = s->label, .type = s->type, .scale = 1.0f, .n_in = n_in, .n_out = n_out};
    float *src = rnd_vec((size_t)(n_in * n_out), 1.0f);
    if (s->type == MU_TYPE_NVFP4_E2M1) {
        w.row_bytes = (uint64_t)n_in / 2;
        uint8_t *p = mu_xmalloc((size_t)(n_out * n_in / 2)), *sc = mu_xmalloc((size_t)(n_out * n_in / 16));
        w.scale = mu_nvfp4_tensor_scale2(src, n_in * n_out);
        for (int64_t o = 0; o < n_out; o++)
            mu_nvfp4_quantize_row(src + o * n_in, p + o * n_in / 2, sc + o * n_in / 16, w.scale, n_in);
        w.data = p;
        w.nvfp4_scales = sc;
        if (s->w4a4) w.input_scale_inv = 37.5f;
    } else {
        if (!mu_type_row_bytes(s->type, (uint64_t)n_in, &w.row_bytes)) abort();
        uint8_t *p = mu_xmalloc((size_t)(w.row_bytes * (uint64_t)n_out));
        for (int64_t o = 0; o < n_out; o++) mu_quantize_row(s->type, src + o * n_in, p + o * w.row_bytes, n_in);
        w.data = p;
        if (s->has_scale) {
            w.has_scale = true;
            w.scale = 0.8125f;
        }
    }
    free(src);
    mu_error err;
    if (!mu_weight_check(&w, &err)) {
        fprintf(stderr, "bad test weight: %s\n", err.msg);
        exit(1);
    }
    return w;
}

static void test_matmul_embed(void) {
    const int64_t n_ins[] = {256, 768}, n_outs[] = {7, 64}, rowss[] = {1, 5};
    for (size_t t = 0; t < sizeof WSPECS / sizeof *WSPECS; t++)
        for (int a = 0; a < 2; a++)
            for (int c = 0; c < 2; c++) {
                const int64_t n_in = n_ins[a], n_out = n_outs[c];
                mu_weight w = make_weight(&WSPECS[t], n_in, n_out);
                for (int r = 0; r < 2; r++) {
                    const int64_t rows = rowss[r];
                    float *x = rnd_vec((size_t)(rows * n_in), 3.0f), *y = mu_xmalloc((size_t)(rows * n_out) * 4);
                    float *dx = dev(x, (size_t)(rows * n_in) * 4), *dy = cu->alloc(cu, (size_t)(rows * n_out) * 4);
                    ref->matmul(ref, &w, x, y, rows);
                    cu->matmul(cu, &w, dx, dy, rows);
                    char what[128];
                    snprintf(what, sizeof what, "matmul %s n_in=%lld n_out=%lld rows=%lld", w.name, (long long)n_in,
                             (long long)n_out, (long long)rows);
                    check(what, y, dy, (size_t)(rows * n_out) * 4);
                    cu->free(cu, dx, 0);
                    cu->free(cu, dy, 0);
                    free(x);
                    free(y);
                }
                if (WSPECS[t].w4a4) continue; /* embed reads the payload the same way as W4A16 */
                int32_t tok[6];
                for (int i = 0; i < 6; i++) tok[i] = (int32_t)(next_u32() % (uint32_t)n_out);
                float *e = mu_xmalloc((size_t)(6 * n_in) * 4), *de = cu->alloc(cu, (size_t)(6 * n_in) * 4);
                ref->embed(ref, &w, tok, 6, e);
                cu->embed(cu, &w, tok, 6, de);
                char what[128];
                snprintf(what, sizeof what, "embed %s n_in=%lld", w.name, (long long)n_in);
                check(what, e, de, (size_t)(6 * n_in) * 4);
                /* the fused entry (k_embed_norm from 512 values, the three ops below), then a product
                 * that reads h's fused quantization */
                if (c == 1) {
                    /* wh stays allocated: the backend caches uploads by host pointer */
                    float *wh = rnd_vec((size_t)n_in, 2.0f), *h = mu_xmalloc((size_t)(6 * n_in) * 4);
                    float *dh = cu->alloc(cu, (size_t)(6 * n_in) * 4);
                    ref->rmsnorm(ref, e, NULL, 1e-6f, e, n_in, 6);
                    ref->rmsnorm(ref, e, wh, 1e-6f, h, n_in, 6);
                    cu->zero(cu, de, (size_t)(6 * n_in) * 4);
                    cu->embed_norm(cu, &w, tok, 6, 1e-6f, wh, de, dh);
                    snprintf(what, sizeof what, "embed_norm %s n_in=%lld: x", w.name, (long long)n_in);
                    check(what, e, de, (size_t)(6 * n_in) * 4);
                    snprintf(what, sizeof what, "embed_norm %s n_in=%lld: h", w.name, (long long)n_in);
                    check(what, h, dh, (size_t)(6 * n_in) * 4);
                    mu_weight wq = make_weight(&WSPECS[5], n_in, 40);
                    float *y = mu_xmalloc(6 * 40 * 4), *dy = cu->alloc(cu, 6 * 40 * 4);
                    ref->matmul(ref, &wq, h, y, 6);
                    cu->matmul(cu, &wq, dh, dy, 6);
                    snprintf(what, sizeof what, "embed_norm %s n_in=%lld + matmul", w.name, (long long)n_in);
                    check(what, y, dy, 6 * 40 * 4);
                    cu->free(cu, dh, 0), cu->free(cu, dy, 0), free(h), free(y);
                }
                cu->free(cu, de, 0);
                free(e);
            }
    /* float weights of any length (not a multiple of 32) */
    for (int t = 0; t < 3; t++) {
        mu_weight w = make_weight(&WSPECS[t], 77, 9);
        float *x = rnd_vec(3 * 77, 2.0f), y[27];
        float *dx = dev(x, 3 * 77 * 4), *dy = cu->alloc(cu, 27 * 4);
        ref->matmul(ref, &w, x, y, 3);
        cu->matmul(cu, &w, dx, dy, 3);
        check(WSPECS[t].label, y, dy, sizeof y);
        cu->free(cu, dx, 0), cu->free(cu, dy, 0), free(x);
    }
    /* activations as an F32 weight, in backend memory (mu_f32_matrix) */
    float *m = rnd_vec(40 * 70, 1.0f), *x = rnd_vec(2 * 64, 1.0f), y[80];
    float *dm = dev(m, 40 * 70 * 4), *dx = dev(x, 2 * 64 * 4), *dy = cu->alloc(cu, sizeof y);
    mu_weight hw = mu_f32_matrix(m, 64, 40, 70), dw = mu_f32_matrix(dm, 64, 40, 70);
    ref->matmul(ref, &hw, x, y, 2);
    cu->matmul(cu, &dw, dx, dy, 2);
    check("matmul mu_f32_matrix (device activations)", y, dy, sizeof y);
    cu->free(cu, dm, 0), cu->free(cu, dx, 0), cu->free(cu, dy, 0), free(m), free(x);
}

/* y = W x for `rows` rows of x (host, freed here) on ref and on the device,
 * compared byte for byte under the name `what`. */
static void compare_matmul(const mu_weight *w, float *x, int64_t rows, const char *what) {
    const size_t xb = (size_t)(rows * w->n_in) * 4, yb = (size_t)(rows * w->n_out) * 4;
    float *y = mu_xmalloc(yb), *dx = dev(x, xb), *dy = cu->alloc(cu, yb);
    ref->matmul(ref, w, x, y, rows);
    cu->matmul(cu, w, dx, dy, rows);
    check(what, y, dy, yb);
    cu->free(cu, dx, 0), cu->free(cu, dy, 0), free(x), free(y);
}

/* k_mmq's shapes (MUSER_CUDA_MMQ, cuda_mmt.cu mmq_launch): 4 four warps per
 * tile reading the activations from global memory, 5 one warp per tile with
 * them in shared memory, 10 as 5 in CTAs of 8 warps, 12 as 5 with 3 blocks
 * in flight. */
static const int MMQ_SHAPES[] = {4, 5, 10, 12};
enum { N_MMQ_SHAPES = sizeof MMQ_SHAPES / sizeof *MMQ_SHAPES };

/* The weight-streaming kernels: many blocks (n_in 5120, 6656), n_out not a
 * multiple of the 4 outputs of a CTA, 1 to 33 rows (chunks of 16 rows,
 * partial last chunks). */
static void test_matmul_large(void) {
    static const wspec big[] = {
        {"Q4_K", MU_TYPE_Q4_K, false, false}, {"Q5_K", MU_TYPE_Q5_K, false, false},
        {"Q6_K", MU_TYPE_Q6_K, false, false}, {"Q4_K+scale", MU_TYPE_Q4_K, true, false},
        {"Q8_0", MU_TYPE_Q8_0, false, false}, {"F16", MU_TYPE_F16, false, false},
        {"NVFP4_ggml", MU_TYPE_NVFP4, false, false}, {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false},
    };
    const int64_t shapes[][2] = {{5120, 37}, {6656, 130}, {1280, 1}, {19968, 9}};
    const int64_t rowss[] = {1, 2, 3, 4, 7, 8, 9, 16, 17, 32, 33, 100};
    /* every weight-streaming kernel: variant, and for k_mmv3 (7) warps per output and steps (0: by shape);
     * 9: k_mmt (the tensor-core kernel of cuda_mmt.cu) for every row count up to 16; 10: the 1-row kernels
     * before k_mmv4, 11..16: k_mmv4 with 1, 2, 4 warps per slot and 2 or 4 blocks in flight */
    static const int kernels[][3] = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}, {4, 0, 0}, {5, 0, 0}, {7, 1, 1}, {7, 1, 2},
                                     {7, 2, 1}, {7, 2, 2}, {7, 4, 1}, {7, 4, 2}, {7, 0, 0}, {8, 0, 0}, {9, 0, 0},
                                     {10, 0, 0}, {11, 0, 0}, {12, 0, 0}, {13, 0, 0}, {14, 0, 0}, {15, 0, 0},
                                     {16, 0, 0}, {17, 0, 0}, {18, 0, 0}, {19, 0, 0}, {20, 0, 0}, {17, -3, 0}, {18, -2, 0},
                                     {19, -3, 0}, {20, -2, 0}, {3, 0, 0}};
    /* k_mmq by shape (MUSER_CUDA_MMQ=1) and in each of its shapes: n_out with partial tiles, 5 to 78 blocks,
     * 1 to 8 rows (row 2 with an all-zero block, row 1 with a block whose largest magnitude repeats) */
    mucu_mmt_min_rows = 1;
    for (int si = -1; si < N_MMQ_SHAPES; si++) {
        const int mv = si < 0 ? 1 : MMQ_SHAPES[si];
        mucu_mmq_variant = mv;
        static const wspec qs4[] = {{"Q4_K", MU_TYPE_Q4_K, false, false}, {"Q5_K", MU_TYPE_Q5_K, false, false},
                                    {"Q6_K", MU_TYPE_Q6_K, false, false}, {"Q4_K+scale", MU_TYPE_Q4_K, true, false}};
        const int64_t qshapes[][2] = {{6656, 130}, {1280, 37}, {19968, 9}, {4096, 1}};
        for (int t = 0; t < 4; t++)
            for (int s = 0; s < 4; s++) {
                mu_weight w = make_weight(&qs4[t], qshapes[s][0], qshapes[s][1]);
                for (int64_t rows = 1; rows <= 8; rows++) {
                    if (s >= 2 && rows != 3 && rows != 8) continue;
                    const int64_t n_in = qshapes[s][0];
                    float *x = rnd_vec((size_t)(rows * n_in), 3.0f);
                    if (rows >= 3)
                        for (int i = 0; i < 256; i++) x[2 * n_in + i] = 0.0f, x[n_in + 256 + i] = (i % 3) ? 1.5f : -1.5f;
                    char what[128];
                    snprintf(what, sizeof what, "matmul k_mmq %s n_in=%lld n_out=%lld rows=%lld mmq=%d", w.name,
                             (long long)n_in, (long long)qshapes[s][1], (long long)rows, mv);
                    compare_matmul(&w, x, rows, what);
                }
            }
    }
    /* k_mmt with each number of stages (MUSER_CUDA_MMT_ST: 1 the rings' size rule, 2 the default, 3, 4), k_mmq off */
    mucu_mmq_variant = 0;
    for (int st = 1; st <= 4; st++) {
        mucu_mmt_stages = st;
        mucu_mmt_min_rows = 1;
        for (int t = 0; t < 3; t++) {
            const wspec spec = {t == 0 ? "Q4_K" : t == 1 ? "Q5_K" : "Q6_K", t == 0 ? MU_TYPE_Q4_K : t == 1 ? MU_TYPE_Q5_K : MU_TYPE_Q6_K, false, false};
            mu_weight w = make_weight(&spec, 6656, 130);
            const int64_t rs[] = {1, 3, 8, 16, 17, 24, 32}; /* 17 to 32: four 8-row tiles (cuda_kernels.cu mmt_wide) */
            for (int ri = 0; ri < 7; ri++) {
                const int64_t rows = rs[ri];
                char what[96];
                snprintf(what, sizeof what, "matmul k_mmt %s rows=%lld stages=%d", w.name, (long long)rows, st);
                compare_matmul(&w, rnd_vec((size_t)(rows * 6656), 3.0f), rows, what);
            }
        }
    }
    mucu_mmt_stages = 0;
    mucu_mmt_min_rows = -1;
    mucu_mmq_variant = -1;
    const int mmt_saved = mucu_mmt_min_rows_get();
    for (size_t vi = 0; vi < sizeof kernels / sizeof *kernels; vi++) {
    const int variant = kernels[vi][0];
    mucu_set_mmv_variant(variant == 9 ? 3 : variant);
    mucu_mmt_min_rows = variant == 9 ? 1 : variant == 3 ? mmt_saved : 0;
    mucu_set_mmv3(kernels[vi][1] > 0 ? kernels[vi][1] : 0, kernels[vi][2]);
    mucu_mmv6_grid = kernels[vi][1] < 0 ? -kernels[vi][1] : 0; /* k_mmv6: a few CTAs taking many units each */
    for (size_t t = 0; t < sizeof big / sizeof *big; t++)
        for (int s = 0; s < 4; s++) {
            if (s == 3 && ((variant != 7 && variant != 3 && variant < 9) || t > 3)) continue; /* 78 blocks */
            const int64_t n_in = shapes[s][0], n_out = shapes[s][1];
            mu_weight w = make_weight(&big[t], n_in, n_out);
            for (size_t r = 0; r < sizeof rowss / sizeof *rowss; r++) {
                const int64_t rows = rowss[r];
                const bool kq = big[t].type == MU_TYPE_Q4_K || big[t].type == MU_TYPE_Q5_K || big[t].type == MU_TYPE_Q6_K;
                if (!kq && rows != 1 && rows != 17) continue;
                if (variant >= 10 && rows != 1) continue; /* above 1 row these are variant 3 without k_mmt */
                float *x = rnd_vec((size_t)(rows * n_in), 3.0f);
                if (rows == 3) /* an all-zero block and a block whose largest magnitude repeats */
                    for (int i = 0; i < 256; i++) x[n_in + i] = 0.0f, x[2 * n_in + 256 + i] = (i % 3) ? 1.5f : -1.5f;
                char what[128];
                snprintf(what, sizeof what, "matmul %s n_in=%lld n_out=%lld rows=%lld mmv=%d wpr=%d u=%d", w.name,
                         (long long)n_in, (long long)n_out, (long long)rows, variant, kernels[vi][1], kernels[vi][2]);
                compare_matmul(&w, x, rows, what);
            }
        }
    }
    mucu_mmv6_grid = 0;
}

/* NVFP4 (ggml, ggml with .scale, native W4A16) in the split layout (k_mmv4
 * at 1 row, k_mmv2 to 16, k_gemm_fp4 above), Q8_0 and Q4_0 on k_mmv_q0,
 * F16 / BF16 / F32 on k_mmv_float, and all on the kernels before them
 * (MUSER_CUDA_FP4=0),
 * row counts across the 16-row chunks; rows 3 with an all-zero block and a
 * repeated largest magnitude. */
static void test_matmul_fp4(void) {
    static const wspec fp4[] = {
        {"NVFP4_ggml", MU_TYPE_NVFP4, false, false},
        {"NVFP4_ggml+scale", MU_TYPE_NVFP4, true, false},
        {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false},
        {"Q8_0", MU_TYPE_Q8_0, false, false},
        {"Q4_0", MU_TYPE_Q4_0, false, false},
        {"F16", MU_TYPE_F16, false, false},
        {"BF16", MU_TYPE_BF16, false, false},
        {"F32", MU_TYPE_F32, false, false},
    };
    const int64_t shapes[][2] = {{1536, 37}, {6656, 130}, {512, 1}};
    const int64_t rowss[] = {1, 2, 3, 5, 8, 16, 17, 33, 100};
    /* fast 2: NVFP4's 2-16 rows on k_mmv2 (MUSER_CUDA_FP4_GEMM=0), 3: on k_gemm_fp4 from 2 rows */
    for (int fast = 3; fast >= 0; fast--) {
        mucu_set_fp4(fast != 0);
        mucu_fp4_gemm_rows = fast == 2 ? 0 : fast == 3 ? 2 : -1;
        for (size_t t = 0; t < sizeof fp4 / sizeof *fp4; t++)
            for (int s = 0; s < 3; s++) {
                if (fast >= 2 && t >= 3) continue; /* the NVFP4 routes only */
                const int64_t n_in = shapes[s][0], n_out = shapes[s][1];
                mu_weight w = make_weight(&fp4[t], n_in, n_out);
                for (size_t r = 0; r < sizeof rowss / sizeof *rowss; r++) {
                    const int64_t rows = rowss[r];
                    if (!fast && rows != 1 && rows != 17) continue;
                    if (fast >= 2 && (rows == 1 || rows > 16)) continue;
                    float *x = rnd_vec((size_t)(rows * n_in), 3.0f);
                    if (rows == 3)
                        for (int i = 0; i < 256; i++) x[n_in + i] = 0.0f, x[2 * n_in + i] = (i % 3) ? 1.5f : -1.5f;
                    char what[128];
                    snprintf(what, sizeof what, "matmul %s n_in=%lld n_out=%lld rows=%lld fast=%d", w.name,
                             (long long)n_in, (long long)n_out, (long long)rows, fast);
                    compare_matmul(&w, x, rows, what);
                }
            }
    }
    mucu_set_fp4(1);
    mucu_fp4_gemm_rows = -1;
    /* scale bytes the quantizer does not write: ggml's 0x7F (read as 0), 0xFF and sign bits (ignored); native
     * negative scales and zero; then the split layout's products against ref at 1, 5 and 17 rows */
    for (int nat = 0; nat < 2; nat++) {
        mu_weight w = make_weight(&fp4[nat ? 2 : 0], 1536, 37);
        static const uint8_t gg[] = {0x7F, 0xFF, 0x85, 0x00, 0xB8, 0x3A};
        static const uint8_t nn[] = {0xB8, 0x85, 0x00, 0xC0, 0x01, 0x81};
        uint8_t *p = (uint8_t *)(nat ? w.nvfp4_scales : w.data);
        for (int64_t o = 0; o < 37; o++)
            for (int64_t k = 0; k < 1536 / (nat ? 16 : 64); k++)
                if ((o * 7 + k * 3) % 5 == 0) {
                    if (nat) p[o * 96 + k] = nn[(o + k) % 6];
                    else p[(uint64_t)o * w.row_bytes + k * 36 + (o + k) % 4] = gg[(o + k) % 6];
                }
        for (int64_t rows = 1; rows <= 17; rows += rows == 1 ? 4 : 12) {
            char what[96];
            snprintf(what, sizeof what, "matmul %s edge scales rows=%lld", w.name, (long long)rows);
            compare_matmul(&w, rnd_vec((size_t)(rows * 1536), 3.0f), rows, what);
        }
    }
}

/* --bench-mmv: the weight-streaming kernels (3: the default, k_mmv4 at 1 row, k_mmt above; 9: k_mmt; 10: the
 * 1-row kernels before k_mmv4; 11..16: k_mmv4 with 1, 2, 4 warps per slot, 2 or 4 blocks in flight; 17..20: k_mmv6) on the full model's matrix
 * shapes (q4_k_xl types), GPU time per call by cudaEvents, median of 9
 * timings of 10 calls each, cycling through copies of the weight that
 * together exceed the L2 cache. Weight bytes are random (speed only). */
static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* BENCH_MMV=v,v,...: only these variants (all when unset); BENCH_MMV_SHAPE=name: only that weight (or
 * set); BENCH_MMV_ROWS=n: only that row count (for profilers) */
static bool bench_shape(const char *what, int rows) {
    const char *e = getenv("BENCH_MMV_SHAPE"), *r = getenv("BENCH_MMV_ROWS");
    return (!e || !*e || !strcmp(e, what)) && (!r || !*r || atoi(r) == rows);
}

static bool bench_wants(int v) {
    const char *e = getenv("BENCH_MMV");
    if (!e || !*e) return true;
    for (const char *p = e; *p;) {
        char *end;
        const long x = strtol(p, &end, 10);
        if (end == p) break;
        if (x == v) return true;
        p = *end == ',' ? end + 1 : end;
    }
    return false;
}

static void bench_mmv(void) {
    static const struct { const char *what; uint32_t type; int64_t n_in, n_out; } shapes[] = {
        {"attn_q/gate", MU_TYPE_Q4_K, 6656, 4096}, {"attn_k", MU_TYPE_Q4_K, 6656, 256},
        {"attn_v", MU_TYPE_Q6_K, 6656, 256},      {"attn_output", MU_TYPE_Q4_K, 4096, 6656},
        {"ffn_gate/up", MU_TYPE_Q4_K, 6656, 19968}, {"ffn_down", MU_TYPE_Q4_K, 19968, 6656},
        {"ffn_down", MU_TYPE_Q6_K, 19968, 6656},  {"output/8", MU_TYPE_Q5_K, 6656, 25256},
        {"attn_output", MU_TYPE_NVFP4, 4096, 6656}, {"ffn_gate/up", MU_TYPE_NVFP4, 6656, 19968},
        {"attn_output", MU_TYPE_Q8_0, 4096, 6656}, {"output/8", MU_TYPE_F16, 6656, 25256},
    };
    /* variant, k_mmv3's warps per output and steps (0: by shape) */
    static const int variants[][3] = {{3, 0, 0},  {9, 0, 0},  {10, 0, 0}, {11, 0, 0}, {12, 0, 0}, {13, 0, 0},
                                      {14, 0, 0}, {15, 0, 0}, {16, 0, 0}, {17, 0, 0}, {18, 0, 0}, {19, 0, 0},
                                      {20, 0, 0}, {24, 0, 0}, {25, 0, 0}, {30, 0, 0}, {32, 0, 0}};
    static const int rowss[] = {1, 2, 4, 8, 16};
    char msg[MUCU_ERR_LEN];
    printf("%-12s %-5s %6s %6s %6s %4s %10s %9s\n", "weight", "type", "n_in", "n_out", "mmv", "rows", "us/call", "GB/s");
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        uint64_t rb = 0;
        if (!mu_type_row_bytes(shapes[si].type, (uint64_t)shapes[si].n_in, &rb)) abort();
        const size_t bytes = (size_t)rb * (size_t)shapes[si].n_out;
        int copies = (int)((size_t)(256u << 20) / bytes) + 1;
        if (copies > 64) copies = 64;
        mu_weight *w = mu_xcalloc((size_t)copies, sizeof *w);
        for (int c = 0; c < copies; c++) {
            uint8_t *p = mu_xmalloc(bytes);
            for (size_t i = 0; i < bytes; i += 4) {
                uint32_t v = next_u32() & 0x3BFF3BFFu; /* keeps the f16 d / dmin words finite */
                memcpy(p + i, &v, bytes - i < 4 ? bytes - i : 4);
            }
            w[c] = (mu_weight){.name = shapes[si].what, .type = shapes[si].type, .scale = 1.0f,
                               .n_in = shapes[si].n_in, .n_out = shapes[si].n_out, .row_bytes = rb, .data = p};
        }
        const int64_t n_in = shapes[si].n_in, n_out = shapes[si].n_out;
        float *x = rnd_vec((size_t)(16 * n_in), 2.0f), *dx = dev(x, (size_t)(16 * n_in) * 4);
        float *dy = cu->alloc(cu, (size_t)(16 * n_out) * 4);
        /* NVFP4 split / k_mmv_q0 / k_mmv_float ("fast") against k_matmul_warp / k_matmul_fwarp ("warp") */
        const bool fp4 = shapes[si].type == MU_TYPE_NVFP4 || shapes[si].type == MU_TYPE_Q8_0 || shapes[si].type == MU_TYPE_F16;
        for (size_t vi = 0; vi < sizeof variants / sizeof *variants; vi++)
            for (size_t ri = 0; ri < sizeof rowss / sizeof *rowss; ri++) {
                const int v = variants[vi][0];
                const bool mq = v >= 21; /* 20 + N, N >= 1: k_mmq's shape N (MMQ_SHAPES) */
                mucu_set_mmv_variant(v == 9 || mq ? 3 : v);
                /* 3: the default (k_mmq up to 8 rows, k_mmt above); 9: k_mmt; 10..20: 1-row kernels */
                mucu_mmt_min_rows = v == 9 || mq ? 1 : v == 3 ? -1 : 0;
                mucu_mmq_variant = mq ? v - 20 : v == 9 ? 0 : -1;
                mucu_set_mmv3(variants[vi][1], variants[vi][2]);
                const int rows = rowss[ri];
                if (!bench_wants(v) || !bench_shape(shapes[si].what, rows)) continue;
                if (v >= 10 && v <= 20 && rows != 1) continue;
                if (mq && (rows == 1 || rows > 8)) continue;
                if (fp4 && mq) continue;
                if (fp4 && (vi > 1 || (vi == 1 && rows != 1))) continue;
                mucu_set_fp4(fp4 ? vi == 0 : 1);
                for (int c = 0; c < copies; c++) cu->matmul(cu, &w[c], dx, dy, rows); /* upload + warm-up */
                double t[9];
                for (int k = 0; k < 9; k++) {
                    if (!mucu_timer_begin(msg)) abort();
                    for (int i = 0; i < 10; i++) cu->matmul(cu, &w[(k * 10 + i) % copies], dx, dy, rows);
                    if (!mucu_timer_end(&t[k], msg)) abort();
                    t[k] = t[k] * 1e3 / 10.0;
                }
                qsort(t, 9, sizeof *t, cmp_d);
                char vn[16];
                snprintf(vn, sizeof vn, variants[vi][0] == 7 ? "7/%d/%d" : "%d", variants[vi][variants[vi][0] == 7 ? 1 : 0],
                         variants[vi][2]);
                if (fp4) snprintf(vn, sizeof vn, "%s", vi == 0 ? "fast" : "warp");
                printf("%-12s %-5s %6lld %6lld %6s %4d %10.2f %9.1f\n", shapes[si].what, mu_type_name(shapes[si].type),
                       (long long)n_in, (long long)n_out, vn, rows, t[4], (double)bytes / (t[4] * 1e3));
            }
        if (shapes[si].type == MU_TYPE_Q4_K && !getenv("BENCH_MMV")) { /* the access pattern alone, and a plain read */
            void **dw = mu_xcalloc((size_t)copies, sizeof *dw);
            for (int c = 0; c < copies; c++) dw[c] = dev(w[c].data, bytes);
            void *out = cu->alloc(cu, 64);
            for (int u = 0; u <= 4; u++) {
                if (u == 3) continue;
                double t[9];
                for (int k = 0; k < 9; k++) {
                    if (!mucu_timer_begin(msg)) abort();
                    for (int i = 0; i < 10; i++) {
                        mucu_weight mw = {.type = MU_TYPE_Q4_K, .data = dw[(k * 10 + i) % copies], .n_in = n_in,
                                          .n_out = n_out, .row_bytes = rb};
                        if (!(u ? mucu_bench_loads(&mw, u, dy, msg) : mucu_bench_read(mw.data, bytes, out, msg))) {
                            fprintf(stderr, "bench: %s\n", msg);
                            exit(1);
                        }
                    }
                    if (!mucu_timer_end(&t[k], msg)) abort();
                    t[k] = t[k] * 1e3 / 10.0;
                }
                qsort(t, 9, sizeof *t, cmp_d);
                printf("%-12s %-5s %6lld %6lld %6s %4d %10.2f %9.1f  (%s)\n", shapes[si].what, "Q4_K", (long long)n_in,
                       (long long)n_out, "-", 1, t[4], (double)bytes / (t[4] * 1e3),
                       u ? (u == 1 ? "loads only, U=1" : u == 2 ? "loads only, U=2" : "loads only, U=4")
                         : "plain read");
            }
            for (int c = 0; c < copies; c++) cu->free(cu, dw[c], 0);
            cu->free(cu, out, 0);
            free(dw);
        }
        cu->free(cu, dx, 0), cu->free(cu, dy, 0), free(x);
        /* the host bytes stay alive: the backend keeps their device copies by address until it is destroyed */
    }
    /* the layer's weight sets in one matmul_multi (one launch up to 16 rows) */
    static const struct { const char *what; int n; uint32_t type[4]; int64_t n_in, n_out[4]; } sets[] = {
        {"q+k+v+gate", 4, {MU_TYPE_Q4_K, MU_TYPE_Q4_K, MU_TYPE_Q6_K, MU_TYPE_Q4_K}, 6656, {4096, 256, 256, 4096}},
        {"ffn gate+up", 2, {MU_TYPE_Q4_K, MU_TYPE_Q4_K}, 6656, {19968, 19968}},
    };
    for (size_t si = 0; si < sizeof sets / sizeof *sets; si++) {
        enum { COPIES = 4 };
        mu_weight w[COPIES][4];
        size_t bytes = 0;
        for (int c = 0; c < COPIES; c++)
            for (int i = 0; i < sets[si].n; i++) {
                uint64_t rb = 0;
                if (!mu_type_row_bytes(sets[si].type[i], (uint64_t)sets[si].n_in, &rb)) abort();
                const size_t nbytes = (size_t)rb * (size_t)sets[si].n_out[i];
                uint8_t *p = mu_xmalloc(nbytes);
                for (size_t k = 0; k < nbytes; k += 4) {
                    uint32_t v = next_u32() & 0x3BFF3BFFu;
                    memcpy(p + k, &v, nbytes - k < 4 ? nbytes - k : 4);
                }
                w[c][i] = (mu_weight){.name = sets[si].what, .type = sets[si].type[i], .scale = 1.0f,
                                      .n_in = sets[si].n_in, .n_out = sets[si].n_out[i], .row_bytes = rb, .data = p};
                if (c == 0) bytes += nbytes;
            }
        float *x = rnd_vec((size_t)(16 * sets[si].n_in), 2.0f), *dx = dev(x, (size_t)(16 * sets[si].n_in) * 4);
        float *dy[4];
        for (int i = 0; i < 4; i++) dy[i] = cu->alloc(cu, (size_t)(16 * 19968) * 4);
        for (int ri = 0; ri < 5; ri++) {
            const int rows = rowss[ri];
            for (int setv = 0; setv < 28; setv += setv == 0 ? 5 : 1) { /* one launch (the default), one per
                    weight (MMV 6), k_mmv3_set with 1, 2, 4 warps per output, k_mmt, 1 row: 10..16 (4 + setv),
                    2 to 8 rows: k_mmq's shapes (setv - 11 when in MMQ_SHAPES, bench variants 20 + shape) */
                if (setv > 5 && setv < 13 && rows != 1) continue;
                if (setv >= 13 && setv < 24 && (rows == 1 || rows > 8)) continue;
                if (setv >= 24 && rows != 1) continue; /* k_mmv6 (variants 17, 18) */
                bool kept = setv < 13 || setv >= 24;
                for (int q = 0; q < N_MMQ_SHAPES; q++) kept = kept || MMQ_SHAPES[q] == setv - 11;
                if (!kept) continue;
                const int bv = setv >= 24 ? setv - 7 : setv == 5 ? 9 : setv == 0 ? 3 : setv >= 13 ? setv + 9 : setv > 5 ? 4 + setv : setv == 1 ? 6 : 7;
                if (!bench_wants(bv) || !bench_shape(sets[si].what, rows)) continue;
                mucu_set_mmv_variant(setv >= 24 ? setv - 7 : setv == 0 || setv == 5 || setv >= 13 ? 3 : setv == 1 ? 6 : setv > 5 ? 4 + setv : 7);
                mucu_set_mmv3(setv >= 2 && setv < 5 ? 1 << (setv - 2) : 0, 0);
                mucu_mmt_min_rows = setv >= 24 ? -1 : setv == 5 || setv >= 13 ? 1 : setv == 0 ? -1 : 0;
                mucu_mmq_variant = setv >= 24 ? -1 : setv >= 13 ? setv - 11 : setv == 5 ? 0 : -1;
                for (int c = 0; c < COPIES; c++) {
                    const mu_weight *wp[4] = {&w[c][0], &w[c][1], &w[c][2], &w[c][3]};
                    cu->matmul_multi(cu, sets[si].n, wp, dx, dy, rows);
                }
                double t[9];
                for (int k = 0; k < 9; k++) {
                    if (!mucu_timer_begin(msg)) abort();
                    for (int i = 0; i < 8; i++) {
                        const int c = (k * 8 + i) % COPIES;
                        const mu_weight *wp[4] = {&w[c][0], &w[c][1], &w[c][2], &w[c][3]};
                        cu->matmul_multi(cu, sets[si].n, wp, dx, dy, rows);
                    }
                    if (!mucu_timer_end(&t[k], msg)) abort();
                    t[k] = t[k] * 1e3 / 8.0;
                }
                qsort(t, 9, sizeof *t, cmp_d);
                static const char *const sv[] = {"3",  "6",  "7/1", "7/2", "7/4", "mmt", "10",
                                                 "11", "12", "13",  "14",  "15",  "16",  "q2",
                                                 "q3", "q4", "q5",  "q6",  "q7",  "q8",  "q9",
                                                 "q10", "q11", "q12", "17", "18", "19", "20"};
                printf("%-12s %-5s %6lld %6s %6s %4d %10.2f %9.1f  (%s)\n", sets[si].what, "set",
                       (long long)sets[si].n_in, "-", sv[setv], rows, t[4], (double)bytes / (t[4] * 1e3),
                       setv == 1 ? "a launch per weight" : "one launch");
            }
        }
        cu->free(cu, dx, 0), free(x);
        for (int i = 0; i < 4; i++) cu->free(cu, dy[i], 0);
    }
    mucu_set_mmv_variant(3);
    mucu_set_mmv3(0, 0);
    mucu_mmt_min_rows = -1;
    mucu_mmq_variant = -1;
}

/* matmul_multi: weights of the fast kernel sharing one quantization of x
 * (NVFP4 sets among them: native ones quantize x rounded through f16, and a
 * set mixing kinds quantizes per kind),
 * and a mix that falls back to one matmul each. */
static void test_matmul_multi(void) {
    enum { NS = 6 };
    const wspec specs[NS][3] = {
        {{"Q4_K", MU_TYPE_Q4_K, false, false}, {"Q6_K", MU_TYPE_Q6_K, false, false}, {"Q5_K", MU_TYPE_Q5_K, false, false}},
        {{"Q4_K", MU_TYPE_Q4_K, false, false}, {"Q8_0", MU_TYPE_Q8_0, false, false}, {"F16", MU_TYPE_F16, false, false}},
        {{"Q6_K", MU_TYPE_Q6_K, false, false}, {"Q4_K+scale", MU_TYPE_Q4_K, true, false}, {"Q4_K", MU_TYPE_Q4_K, false, false}},
        {{"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false}, {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false},
         {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false}},
        {{"NVFP4_ggml", MU_TYPE_NVFP4, false, false}, {"NVFP4_ggml+scale", MU_TYPE_NVFP4, true, false},
         {"NVFP4_ggml", MU_TYPE_NVFP4, false, false}},
        {{"NVFP4_ggml", MU_TYPE_NVFP4, false, false}, {"Q4_K", MU_TYPE_Q4_K, false, false},
         {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false}},
    };
    const int64_t n_in = 1536, n_outs[3] = {29, 64, 8};
    /* at 1 row also k_mmv4 with each shape (11..16: 1, 2, 4 warps per slot, 2 or 4 blocks in flight; the
     * weights' slots share CTAs), k_mmv6 (17, 18: 2 and 4 outputs a unit; 19, 20: the same with the next
     * unit's weights in flight; 100 + v: v on 2 CTAs, so each takes units of several weights) and the kernels
     * before it (10) */
    static const int v1[] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 117, 118, 119, 120};
    enum { NV1 = sizeof v1 / sizeof *v1 };
    for (int set = 0; set < NS * 4 + NS * NV1; set++) {
        const int64_t rows = set < NS * 4 ? (int64_t[]){1, 5, 16, 32}[set / NS] : 1; /* one launch for the set up to 16 (K-quants: 32) rows */
        const int variant = set < NS * 4 ? 3 : v1[(set - NS * 4) / NS];
        mucu_set_mmv_variant(variant % 100);
        mucu_mmv6_grid = variant >= 100 ? 2 : 0;
        mu_weight w[3];
        const mu_weight *wp[3];
        float *y[3], *dy[3];
        float *x = rnd_vec((size_t)(rows * n_in), 2.0f), *dx = dev(x, (size_t)(rows * n_in) * 4);
        for (int i = 0; i < 3; i++) {
            w[i] = make_weight(&specs[set % NS][i], n_in, n_outs[i]);
            wp[i] = &w[i];
            y[i] = mu_xmalloc((size_t)(rows * n_outs[i]) * 4);
            dy[i] = cu->alloc(cu, (size_t)(rows * n_outs[i]) * 4);
            ref->matmul(ref, &w[i], x, y[i], rows);
        }
        cu->matmul_multi(cu, 3, wp, dx, dy, rows);
        for (int i = 0; i < 3; i++) {
            char what[96];
            snprintf(what, sizeof what, "matmul_multi set %d rows %lld weight %d (%s) mmv %d mmq %d", set % NS,
                     (long long)rows, i, specs[set % NS][i].label, variant, mucu_mmq_variant);
            check(what, y[i], dy[i], (size_t)(rows * n_outs[i]) * 4);
            cu->free(cu, dy[i], 0), free(y[i]);
        }
        cu->free(cu, dx, 0), free(x);
    }
    mucu_set_mmv_variant(3);
    mucu_mmv6_grid = 0;
}

/* The many-row tensor-core kernels, all of them (k_gemm_kq2 with each of its
 * tile heights; for Q4_K / Q5_K k_gemm_wg and k_gemm_wg_tma, for Q6_K
 * k_gemm_wg6 with both copy paths at each row tile; the first one,
 * MUSER_CUDA_GEMM_KERNEL=0): row counts around the 64- and 128-row tiles, n_out around the 128-output tile (300: two full
 * tiles and a partial one; 130, 37, 1), 1 to 26 blocks (fewer than, as
 * many as and more than the ring's stages); row 3 has an all-zero block
 * and row 5 a block whose largest magnitude repeats. */
/* x [rows][n_in] through w on every many-row kernel (k_gemm_kq2 unsplit,
 * split as the default plans it and split 3 ways: shares of 1-3 blocks, the
 * last one short; k_gemm_wg for Q4_K / Q5_K on a 9.0 device) against ref. */
static void gemm_kernels_check(const mu_weight *w, const float *x, int64_t rows, const char *label) {
    const int64_t n_in = w->n_in, n_out = w->n_out;
    float *y = mu_xmalloc((size_t)(rows * n_out) * 4);
    float *dx = dev(x, (size_t)(rows * n_in) * 4), *dy = cu->alloc(cu, (size_t)(rows * n_out) * 4);
    ref->matmul(ref, w, x, y, rows);
    static const char *const kname[6] = {"k_gemm_kq",           "k_gemm_kq2",          "k_gemm_kq2 128-row tiles",
                                         "k_gemm_kq2 64-row tiles", "k_gemm_wg / k_gemm_wg6", "k_gemm_wg_tma"};
    static const int splits[3] = {0, 1, 3};
    for (int sp = 0; sp < 3; sp++)
        for (int k = 5; k >= 0; k--) {
            if (k == 1 || (k == 0 && sp > 0)) continue; /* the automatic choice is one of 2, 3 and 4 */
            if (k >= 4 && (sp > 0 || (w->type != MU_TYPE_Q4_K && w->type != MU_TYPE_Q5_K && w->type != MU_TYPE_Q6_K) ||
                           !mucu_gemm_wg_device()))
                continue; /* k_gemm_wg (k_gemm_wg6 for Q6_K): on a 9.0 device, never split */
            /* 5: k_gemm_wg_tma (the default's copies), 4: k_gemm_wg (cp.async) */
            mucu_set_gemm_tma(k == 5);
            mucu_set_gemm_wg6(k >= 4);
            mucu_gemm_kernel = k == 5 ? 4 : k;
            mucu_set_gemm_split(splits[sp]);
            /* k_gemm_wg6: each of its row tiles (96, 80, 64) */
            const int n_tiles = k >= 4 && w->type == MU_TYPE_Q6_K ? 3 : 1;
            for (int ti = 0; ti < n_tiles; ti++) {
                static const int wg6_rows[3] = {96, 80, 64};
                mucu_set_wg6_rows(wg6_rows[ti]);
                cu->zero(cu, dy, (size_t)(rows * n_out) * 4);
                cu->matmul(cu, w, dx, dy, rows);
                char tile[24] = "", what[200];
                if (n_tiles > 1) snprintf(tile, sizeof tile, " %d rows", wg6_rows[ti]);
                snprintf(what, sizeof what, "gemm (%s%s, split %d) %s%s n_in=%lld n_out=%lld rows=%lld", kname[k], tile,
                         splits[sp], w->name, label, (long long)n_in, (long long)n_out, (long long)rows);
                check(what, y, dy, (size_t)(rows * n_out) * 4);
            }
        }
    mucu_set_wg6_rows(-1);
    mucu_set_gemm_split(-1);
    mucu_set_gemm_tma(-1);
    mucu_set_gemm_wg6(-1);
    cu->free(cu, dx, 0), cu->free(cu, dy, 0), free(y);
}

static void test_gemm_tiles(void) {
    static const wspec big[] = {
        {"Q4_K", MU_TYPE_Q4_K, false, false}, {"Q5_K", MU_TYPE_Q5_K, false, false},
        {"Q6_K", MU_TYPE_Q6_K, false, false}, {"Q4_K+scale", MU_TYPE_Q4_K, true, false},
    };
    const int64_t shapes[][2] = {{2560, 300}, {6656, 130}, {768, 37}, {1280, 1}, {256, 130}, {512, 37}};
    const int64_t rowss[] = {16, 64, 65, 129, 257};
    const int saved = mucu_gemm_kernel_get();
    for (size_t t = 0; t < sizeof big / sizeof *big; t++)
        for (int s = 0; s < (int)(sizeof shapes / sizeof *shapes); s++) {
            const int64_t n_in = shapes[s][0], n_out = shapes[s][1];
            mu_weight w = make_weight(&big[t], n_in, n_out);
            for (size_t r = 0; r < sizeof rowss / sizeof *rowss; r++) {
                const int64_t rows = rowss[r];
                if (n_in == 6656 && rows == 257) continue; /* keeps the scalar reference's time down */
                float *x = rnd_vec((size_t)(rows * n_in), 3.0f);
                for (int i = 0; i < 256; i++)
                    x[3 * n_in + 256 + i] = 0.0f, x[5 * n_in + 512 + i] = (i % 5) ? 0.75f : -0.75f;
                gemm_kernels_check(&w, x, rows, "");
                free(x);
            }
        }
    /* Block sums past 2^22 (large for the epilogues' int32 -> f32
     * conversion, which must stay exact): weights of one sign with their
     * codes near the top, every other activation row one positive value
     * (codes 127). */
    for (size_t t = 0; t < 3; t++) {
        const int64_t n_in = 2560, n_out = 300, rows = 129;
        mu_weight w = make_weight(&big[t], n_in, n_out);
        float *src = mu_xmalloc((size_t)(n_in * n_out) * 4);
        for (int64_t i = 0; i < n_in * n_out; i++) src[i] = 1.0f + 0.125f * fabsf(rnd(1.0f));
        for (int64_t o = 0; o < n_out; o++)
            mu_quantize_row(w.type, src + o * n_in, (uint8_t *)w.data + o * w.row_bytes, n_in);
        float *x = rnd_vec((size_t)(rows * n_in), 3.0f);
        for (int64_t r = 0; r < rows; r += 2)
            for (int64_t i = 0; i < n_in; i++) x[r * n_in + i] = 2.5f;
        gemm_kernels_check(&w, x, rows, " (block sums past 2^22)");
        free(x), free(src);
    }
    mucu_gemm_kernel = saved;
    /* the k_gemm_wg_tma checks above took the TMA path (its launches
     * counted; none is a failure: the checks would have tested k_gemm_wg's
     * fallback twice) */
    if (mucu_gemm_wg_device()) {
        printf("k_gemm_wg_tma: %ld launches checked\n", mucu_gemm_tma_launches);
        if (!mucu_gemm_tma_launches)
            n_fail++, fprintf(stderr, "MISMATCH k_gemm_wg_tma never launched (no tensor-map encoder, or misaligned "
                                      "buffers)\n");
    }
}

/* ------------------------------------------------------------ row ops */

static void test_rmsnorm(void) {
    const int64_t ns[] = {64, 256, 512, 1000, 6656};
    for (int i = 0; i < 5; i++)
        for (int weighted = 0; weighted < 2; weighted++) {
            const int64_t n = ns[i], rows = 3;
            float *x = rnd_vec((size_t)(n * rows), 4.0f), *w = rnd_vec((size_t)n, 2.0f), *y = mu_xmalloc((size_t)(n * rows) * 4);
            float *dx = dev(x, (size_t)(n * rows) * 4);
            ref->rmsnorm(ref, x, weighted ? w : NULL, 1e-6f, y, n, rows);
            cu->rmsnorm(cu, dx, weighted ? w : NULL, 1e-6f, dx, n, rows); /* in place, host weight */
            char what[64];
            snprintf(what, sizeof what, "rmsnorm n=%lld weighted=%d", (long long)n, weighted);
            check(what, y, dx, (size_t)(n * rows) * 4);
            cu->free(cu, dx, 0), free(x), free(y); /* w stays alive: the backend caches norm vectors by address */
        }
}

static void test_rope(void) {
    const int64_t n_pairs = 32, rows = 4, n_heads = 3, head_dim = 80, n_rot = 64;
    double inv_freq[32];
    for (int i = 0; i < n_pairs; i++) inv_freq[i] = mu_pow(10000.0, -2.0 * i / 64.0);
    int64_t pos[4] = {0, 17, 4095, 131071};
    float cs[4 * 64];
    float *dcs = cu->alloc(cu, sizeof cs);
    ref->rope_table(ref, inv_freq, n_pairs, pos, rows, cs, false);
    cu->rope_table(cu, inv_freq, n_pairs, pos, rows, dcs, false);
    check("rope_table", cs, dcs, sizeof cs);
    for (int neox = 0; neox < 2; neox++) {
        size_t n = (size_t)(rows * n_heads * head_dim);
        float *x = rnd_vec(n, 2.0f), *dx = dev(x, n * 4);
        ref->rope(ref, x, n_heads, head_dim, n_rot, cs, rows, neox);
        cu->rope(cu, dx, n_heads, head_dim, n_rot, dcs, rows, neox);
        check(neox ? "rope neox" : "rope interleaved", x, dx, n * 4);
        cu->free(cu, dx, 0), free(x);
    }
    cu->free(cu, dcs, 0);
}

/* Attention of batch a (host planes) on ref against the cuda backend over
 * the device planes dk, under each (mucu_attn_kernel, mucu_attn_dec_hg) of
 * kern/hgs (a head group that does not divide the GQA group is skipped);
 * q is random; the settings are restored. Each variant also runs gated
 * (attention_gate against ref's attention then sigmoid_gate; the decode
 * kernels fuse it where a CTA holds whole Q8_K blocks), then, where the
 * rows are whole blocks, a Q4_K product that reads the fused quantization. */
static void check_attention(mu_attn_batch a, const mu_kv_layer **dk, const int *kern, const int *hgs, int nv,
                            const char *label) {
    const int64_t n_in = a.n_head * a.head_dim, n_out = 24;
    const size_t n = (size_t)(a.rows * n_in), ny = (size_t)(a.rows * n_out);
    float *q = rnd_vec(n, 2.0f), *o = mu_xmalloc(n * 4), *g = rnd_vec(n, 6.0f), *og = mu_xmalloc(n * 4);
    float *y = mu_xmalloc(ny * 4);
    float *dq = dev(q, n * 4), *dg = dev(g, n * 4), *dout = cu->alloc(cu, n * 4), *dy = cu->alloc(cu, ny * 4);
    ref->attention(ref, &a, q, o);
    memcpy(og, o, n * 4);
    ref->sigmoid_gate(ref, og, g, (int64_t)n);
    const bool product = n_in % 256 == 0;
    mu_weight w = product ? make_weight(&WSPECS[5], n_in, n_out) : (mu_weight){0};
    if (product) ref->matmul(ref, &w, og, y, a.rows);
    a.kv = dk;
    const int saved = mucu_attn_kernel_get(), saved_hg = mucu_attn_dec_hg, saved_kst = mucu_attn_dec_kst,
              saved_cl = mucu_attn_dec_cl, saved_fl = mucu_attn_dec_fl, saved_fl_rows = mucu_attn_dec_fl_rows;
    /* each variant plainly, with the settled keys' K staged early (kst), with the calls that write partials on
     * k_attn_dcl (cl), and on k_attn_dfl at any row count, with the settled keys staged early (fl) */
    static const char *const mode[4] = {"", " kst", " cl", " fl"};
    for (int vk = 0; vk < 4 * nv; vk++) {
        const int v = vk % nv, m = vk / nv;
        if (hgs[v] && (a.n_head / a.n_head_kv) % hgs[v]) continue;
        if (m && kern[v] != 1 && kern[v] != 3) continue; /* kst, cl and fl change only k_attn_dec's calls */
        if (m == 3 && hgs[v] > 1) continue;              /* k_attn_dfl takes every head of a KV head */
        mucu_attn_kernel = kern[v], mucu_attn_dec_hg = hgs[v], mucu_attn_dec_kst = m == 1 || m == 3,
        mucu_attn_dec_cl = m == 2, mucu_attn_dec_fl = m == 3, mucu_attn_dec_fl_rows = 65535;
        const char *tag = mode[m];
        cu->zero(cu, dout, n * 4);
        cu->attention(cu, &a, dq, dout);
        char what[224];
        snprintf(what, sizeof what, "%s, kernel %d hg %d%s", label, kern[v], hgs[v], tag);
        check(what, o, dout, n * 4);
        cu->zero(cu, dout, n * 4);
        cu->attention_gate(cu, &a, dq, dg, dout);
        snprintf(what, sizeof what, "%s, kernel %d hg %d%s, gated", label, kern[v], hgs[v], tag);
        check(what, og, dout, n * 4);
        if (product) {
            cu->matmul(cu, &w, dout, dy, a.rows);
            snprintf(what, sizeof what, "%s, kernel %d hg %d%s, gated + matmul", label, kern[v], hgs[v], tag);
            check(what, y, dy, ny * 4);
        }
    }
    mucu_attn_kernel = saved, mucu_attn_dec_hg = saved_hg, mucu_attn_dec_kst = saved_kst, mucu_attn_dec_cl = saved_cl,
    mucu_attn_dec_fl = saved_fl, mucu_attn_dec_fl_rows = saved_fl_rows;
    cu->free(cu, dq, 0), cu->free(cu, dg, 0), cu->free(cu, dout, 0), cu->free(cu, dy, 0);
    free(q), free(o), free(g), free(og), free(y);
}

/* kv_store into a ring, then attention over it (GQA, windows, several
 * 256-key blocks, a ring whose origin has moved). */
static void test_kv_attention(int64_t D) {
    const int64_t H = 4, Hkv = 2, cap = 700, base = 333, n = 700;
    mu_kv_layer hl = {.swa = true, .cap = cap, .n_head = Hkv, .head_dim = D, .row_elems = Hkv * D,
                      .origin_logical = base, .origin_physical = base % cap, .len = n};
    mu_kv_layer dl = hl;
    size_t plane = (size_t)(Hkv * cap * D) * 2;
    hl.k = calloc(1, plane), hl.v = calloc(1, plane);
    dl.k = cu->alloc(cu, plane), dl.v = cu->alloc(cu, plane);
    /* store logical base..base+n-1 in chunks of 50 rows, then 50 of them
     * again journaled (old bytes saved to scattered slots of a journal) */
    const int64_t jcap = 64;
    const size_t jplane = (size_t)(Hkv * jcap * D) * 2;
    uint16_t *hjk = calloc(1, jplane), *hjv = calloc(1, jplane), *djk = cu->alloc(cu, jplane), *djv = cu->alloc(cu, jplane);
    cu->zero(cu, djk, jplane), cu->zero(cu, djv, jplane);
    for (int64_t p0 = base; p0 < base + n + 50; p0 += 50) {
        int64_t phys[50], slot[50];
        for (int i = 0; i < 50; i++) phys[i] = (p0 + i) % cap, slot[i] = (i * 7 + 3) % jcap;
        const bool journal = p0 >= base + n;
        mu_kv_dst hd[50], dd[50];
        for (int i = 0; i < 50; i++) {
            hd[i] = (mu_kv_dst){.l = &hl, .physical = phys[i], .slot = -1};
            dd[i] = (mu_kv_dst){.l = &dl, .physical = phys[i], .slot = -1};
            if (journal) {
                hd[i].jk = hjk, hd[i].jv = hjv, hd[i].jcap = jcap, hd[i].slot = slot[i];
                dd[i].jk = djk, dd[i].jv = djv, dd[i].jcap = jcap, dd[i].slot = slot[i];
            }
        }
        float *k = rnd_vec((size_t)(50 * Hkv * D), 3.0f), *v = rnd_vec((size_t)(50 * Hkv * D), 3.0f);
        float *dk = dev(k, (size_t)(50 * Hkv * D) * 4), *dv = dev(v, (size_t)(50 * Hkv * D) * 4);
        ref->kv_store(ref, 50, hd, k, v);
        cu->kv_store(cu, 50, dd, dk, dv);
        cu->free(cu, dk, 0), cu->free(cu, dv, 0), free(k), free(v);
    }
    check("kv_store K", hl.k, dl.k, plane);
    check("kv_store V", hl.v, dl.v, plane);
    check("kv_store journal K", hjk, djk, jplane);
    check("kv_store journal V", hjv, djv, jplane);
    size_t nz = 0;
    for (size_t i = 0; i < jplane / 2; i++) nz += hjk[i] != 0;
    n_checks++;
    if (nz < jplane / 4) {
        n_fail++;
        fprintf(stderr, "MISMATCH kv_store journal: the ref saved only %zu nonzero values\n", nz);
    }
    free(hjk), free(hjv), cu->free(cu, djk, 0), cu->free(cu, djv, 0);
    const int64_t rows = 5;
    int64_t pos[5] = {base, base + 1, base + 255, base + 256, base + n - 1};
    const mu_kv_layer *hk[5], *dk[5];
    for (int r = 0; r < 5; r++) hk[r] = &hl, dk[r] = &dl;
    const int64_t windows[] = {0, 100, 512};
    for (int wi = 0; wi < 3; wi++) {
        mu_attn_batch a = {.rows = rows, .kv = hk, .pos = pos, .window = windows[wi], .n_head = H, .n_head_kv = Hkv,
                           .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
        /* the default (k_attn_dec where it takes D), k_attn_blocks, k_attn_dec with 1 and 2 heads per CTA */
        const int kern[4] = {1, 0, 3, 3}, hg[4] = {0, 0, 1, 2};
        char what[96];
        snprintf(what, sizeof what, "attention D=%lld window=%lld", (long long)D, (long long)windows[wi]);
        check_attention(a, dk, kern, hg, 4, what);
    }
    free(hl.k), free(hl.v);
    cu->free(cu, dl.k, 0), cu->free(cu, dl.v, 0);
}

/* One store whose rows go to two caches (a batch of two sequences): rows
 * alternate between a 300-row plane and a 70-row ring, journaled, on both
 * backends; planes and journals compared. */
static void test_kv_store_two(void) {
    const int64_t H = 2, D = 128, caps[2] = {300, 70}, jcap = 40, rows = 9;
    mu_kv_layer hl[2], dl[2];
    uint16_t *hj[2], *dj[2];
    const size_t jplane = (size_t)(H * jcap * D) * 2;
    for (int i = 0; i < 2; i++) {
        hl[i] = (mu_kv_layer){.cap = caps[i], .n_head = H, .head_dim = D, .row_elems = H * D};
        dl[i] = hl[i];
        const size_t plane = (size_t)(H * caps[i] * D) * 2;
        hl[i].k = calloc(1, plane), hl[i].v = calloc(1, plane);
        for (size_t e = 0; e < plane / 2; e++) /* old bytes worth saving (finite f16: bit 14 clear) */
            hl[i].k[e] = (uint16_t)(next_u32() & 0xBFFFu), hl[i].v[e] = (uint16_t)(next_u32() & 0xBFFFu);
        dl[i].k = dev(hl[i].k, plane), dl[i].v = dev(hl[i].v, plane);
        hj[i] = calloc(1, jplane), dj[i] = cu->alloc(cu, jplane);
        cu->zero(cu, dj[i], jplane);
    }
    mu_kv_dst hd[9], dd[9];
    for (int r = 0; r < rows; r++) {
        const int i = r & 1;
        const int64_t phys = i ? (r * 13) % caps[1] : (r * 37 + 5) % caps[0], slot = (r * 7 + 2) % jcap;
        hd[r] = (mu_kv_dst){.l = &hl[i], .physical = phys, .jk = hj[0], .jv = hj[1], .jcap = jcap, .slot = slot};
        dd[r] = (mu_kv_dst){.l = &dl[i], .physical = phys, .jk = dj[0], .jv = dj[1], .jcap = jcap, .slot = slot};
    }
    float *k = rnd_vec((size_t)(rows * H * D), 3.0f), *v = rnd_vec((size_t)(rows * H * D), 3.0f);
    float *dk = dev(k, (size_t)(rows * H * D) * 4), *dv = dev(v, (size_t)(rows * H * D) * 4);
    ref->kv_store(ref, rows, hd, k, v);
    cu->kv_store(cu, rows, dd, dk, dv);
    for (int i = 0; i < 2; i++) {
        const size_t plane = (size_t)(H * caps[i] * D) * 2;
        check(i ? "kv_store two caches: ring K" : "kv_store two caches: plane K", hl[i].k, dl[i].k, plane);
        check(i ? "kv_store two caches: ring V" : "kv_store two caches: plane V", hl[i].v, dl[i].v, plane);
        check(i ? "kv_store two caches: journal V" : "kv_store two caches: journal K", hj[i], dj[i], jplane);
    }
    cu->free(cu, dk, 0), cu->free(cu, dv, 0), free(k), free(v);
    for (int i = 0; i < 2; i++) {
        free(hl[i].k), free(hl[i].v), free(hj[i]);
        cu->free(cu, dl[i].k, 0), cu->free(cu, dl[i].v, 0), cu->free(cu, dj[i], 0);
    }
}

/* A layer's K/V ring (cap rows holding logical base .. base+n-1) on both
 * backends, filled by kv_store in chunks of 50 rows. */
static void kv_fill(mu_kv_layer *hl, mu_kv_layer *dl, int64_t Hkv, int64_t D, int64_t cap, int64_t base, int64_t n) {
    *hl = (mu_kv_layer){.swa = true, .cap = cap, .n_head = Hkv, .head_dim = D, .row_elems = Hkv * D,
                        .origin_logical = base, .origin_physical = base % cap, .len = n};
    *dl = *hl;
    const size_t plane = (size_t)(Hkv * cap * D) * 2;
    hl->k = calloc(1, plane), hl->v = calloc(1, plane);
    dl->k = cu->alloc(cu, plane), dl->v = cu->alloc(cu, plane);
    for (int64_t p0 = base; p0 < base + n; p0 += 50) {
        int64_t phys[50];
        const int64_t m = base + n - p0 < 50 ? base + n - p0 : 50;
        for (int i = 0; i < m; i++) phys[i] = (p0 + i) % cap;
        mu_kv_dst hd[50], dd[50];
        for (int i = 0; i < m; i++)
            hd[i] = (mu_kv_dst){.l = hl, .physical = phys[i], .slot = -1},
            dd[i] = (mu_kv_dst){.l = dl, .physical = phys[i], .slot = -1};
        float *k = rnd_vec((size_t)(m * Hkv * D), 3.0f), *v = rnd_vec((size_t)(m * Hkv * D), 3.0f);
        float *dk = dev(k, (size_t)(m * Hkv * D) * 4), *dv = dev(v, (size_t)(m * Hkv * D) * 4);
        ref->kv_store(ref, m, hd, k, v);
        cu->kv_store(cu, m, dd, dk, dv);
        cu->free(cu, dk, 0), cu->free(cu, dv, 0), free(k), free(v);
    }
}

/* The many-row attention kernels, both (k_attn_prefill, the default, and
 * k_attn_blocks, MUSER_CUDA_ATTN=0), against ref: prefill chunks of one
 * sequence (rows sharing keys: 70 rows over 5 blocks; 37 rows inside the
 * first block, the one-block shortcut), sliding windows (each row its own
 * first key), and a batch alternating between two sequences, at the full
 * model's heads (32 over 2, D 128) and at 8 over 2, D 64. */
/* Token-tree rows (backend.h mu_attn_tree) against ref: 16 rows with
 * random parents stored at the ring's last 16 positions, each standing at
 * the tree's base + its depth and reading its ancestors' keys; plain
 * planes and windowed rings, the tree across a 256-key block edge, every
 * kernel choice (2, the many-row kernel, is not taken for trees: the
 * default's choice runs instead). tests/test_cpu_backend.c checks that the
 * ref's tree row equals a plain row over its path. */
static void test_tree_attention(void) {
    const int64_t cfg[4][6] = {/* H, Hkv, D, window, base0, n */
                               {8, 2, 64, 0, 0, 266}, {32, 2, 128, 0, 0, 530}, {8, 2, 64, 128, 400, 143},
                               {16, 1, 256, 0, 100, 180}};
    for (int ci = 0; ci < 4; ci++) {
        const int64_t H = cfg[ci][0], Hkv = cfg[ci][1], D = cfg[ci][2], window = cfg[ci][3];
        const int64_t base0 = cfg[ci][4], n = cfg[ci][5], tbase = base0 + n - 16;
        mu_kv_layer h, d;
        kv_fill(&h, &d, Hkv, D, n, base0, n);
        mu_attn_tree tree[16];
        int64_t pos[16];
        int depth[16], parent[16];
        const mu_kv_layer *hk[16], *dk[16];
        for (int i = 0; i < 16; i++) {
            parent[i] = i ? (int)(next_u32() % (uint32_t)i) : -1;
            depth[i] = i ? depth[parent[i]] + 1 : 0;
            tree[i].base = tbase;
            for (int r = i, t = depth[i]; t >= 0; r = parent[r], t--) tree[i].anc[t] = r;
            pos[i] = tbase + depth[i];
            hk[i] = &h, dk[i] = &d;
        }
        mu_attn_batch a = {.rows = 16, .kv = hk, .pos = pos, .window = window, .n_head = H, .n_head_kv = Hkv,
                           .head_dim = D, .scale = 1.0f / sqrtf((float)D), .tree = tree};
        const int kern[6] = {1, 0, 3, 3, 3, 2}, hgs[6] = {0, 0, 1, 2, 4, 0};
        char what[128];
        snprintf(what, sizeof what, "tree attention H=%lld/%lld D=%lld window=%lld base %lld", (long long)H,
                 (long long)Hkv, (long long)D, (long long)window, (long long)tbase);
        check_attention(a, dk, kern, hgs, 6, what);
        free(h.k), free(h.v);
        cu->free(cu, d.k, 0), cu->free(cu, d.v, 0);
    }
}

static void test_attn_prefill(void) {
    const int64_t cfg[3][3] = {{32, 2, 128}, {8, 2, 64}, {16, 1, 256}};
    for (int ci = 0; ci < 3; ci++) {
        const int64_t H = cfg[ci][0], Hkv = cfg[ci][1], D = cfg[ci][2];
        mu_kv_layer h1, d1, h2, d2;
        kv_fill(&h1, &d1, Hkv, D, 1100, 0, 1100);
        kv_fill(&h2, &d2, Hkv, D, 600, 250, 600); /* a ring whose origin has moved */
        for (int cs = 0; cs < 4; cs++) {
            const int64_t rows = cs == 1 ? 37 : 70, window = cs == 2 ? 300 : 0;
            int64_t *pos = mu_xmalloc((size_t)rows * sizeof *pos);
            const mu_kv_layer **hk = mu_xmalloc((size_t)rows * sizeof *hk), **dk = mu_xmalloc((size_t)rows * sizeof *dk);
            for (int64_t r = 0; r < rows; r++) {
                const bool second = cs == 3 && (r & 1);
                hk[r] = second ? &h2 : &h1, dk[r] = second ? &d2 : &d1;
                pos[r] = cs == 1 ? 3 + r : (second ? 250 + 530 + r : 1030 + r);
            }
            mu_attn_batch a = {.rows = rows, .kv = hk, .pos = pos, .window = window, .n_head = H, .n_head_kv = Hkv,
                               .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
            /* 2: k_attn_prefill at any row count; 0: k_attn_blocks; 3: k_attn_dec at any row count, with
             * 16, 8, 4, 2 and 1 query heads per CTA where they divide the group */
            const int kern[7] = {2, 0, 3, 3, 3, 3, 3}, hgs[7] = {0, 0, 16, 8, 4, 2, 1};
            char what[128];
            snprintf(what, sizeof what, "attention H=%lld/%lld D=%lld case %d rows=%lld window=%lld", (long long)H,
                     (long long)Hkv, (long long)D, cs, (long long)rows, (long long)window);
            check_attention(a, dk, kern, hgs, 7, what);
            /* k_attn_prefill's weighted sum with every key tested per pair (MUSER_CUDA_ATTN_PV4=0) */
            mucu_set_attn_pv4(0);
            strncat(what, ", PV4 off", sizeof what - strlen(what) - 1);
            check_attention(a, dk, kern, hgs, 1, what);
            mucu_set_attn_pv4(-1);
            /* its scores with 32 lanes a dot (MUSER_CUDA_ATTN_SC=0; the default takes 8) */
            mucu_set_attn_sc(0);
            strncat(what, ", SC off", sizeof what - strlen(what) - 1);
            check_attention(a, dk, kern, hgs, 1, what);
            mucu_set_attn_sc(-1);
            free(pos), free(hk), free(dk);
        }
        free(h1.k), free(h1.v), free(h2.k), free(h2.v);
        cu->free(cu, d1.k, 0), cu->free(cu, d1.v, 0), cu->free(cu, d2.k, 0), cu->free(cu, d2.v, 0);
    }
}

/* Decode at depth: 1, 3 and 16 rows (a verification of 16 rows of one
 * sequence) over a 9,300-key plane (37 blocks: the merge's scan over more
 * than one chunk of 32) and a 2,100-row ring whose origin has moved, full
 * attention and a 2,048-key window, the full model's heads (32 over 2, D
 * 128), with the default choice, k_attn_dec at every head group, and the
 * kernels before it (MUSER_CUDA_ATTN=4), against ref. */
static void test_attn_decode(void) {
    const int64_t H = 32, Hkv = 2, D = 128;
    mu_kv_layer hp, dp, hr, dr;
    kv_fill(&hp, &dp, Hkv, D, 9300, 0, 9300);
    kv_fill(&hr, &dr, Hkv, D, 2100, 7000, 2100);
    for (int cs = 0; cs < 5; cs++) {
        const int64_t rows = cs == 0 ? 1 : cs == 1 ? 3 : 16, window = cs >= 3 ? 2048 : 0;
        int64_t pos[16];
        const mu_kv_layer *hk[16], *dk[16];
        for (int64_t r = 0; r < rows; r++) {
            const bool ring = cs == 4;
            hk[r] = ring ? &hr : &hp, dk[r] = ring ? &dr : &dp;
            pos[r] = ring ? 9099 - (rows - 1 - r) : cs == 1 ? (int64_t[]){9299, 5000, 257}[r] : 9299 - (rows - 1 - r);
        }
        mu_attn_batch a = {.rows = rows, .kv = hk, .pos = pos, .window = window, .n_head = H, .n_head_kv = Hkv,
                           .head_dim = D, .scale = 1.0f / sqrtf((float)D)};
        const int kern[7] = {1, 3, 3, 3, 3, 3, 4}, hgs[7] = {0, 16, 8, 4, 2, 1, 0};
        char what[128];
        snprintf(what, sizeof what, "decode attention case %d rows=%lld window=%lld", cs, (long long)rows,
                 (long long)window);
        check_attention(a, dk, kern, hgs, 7, what);
    }
    free(hp.k), free(hp.v), free(hr.k), free(hr.v);
    cu->free(cu, dp.k, 0), cu->free(cu, dp.v, 0), cu->free(cu, dr.k, 0), cu->free(cu, dr.v, 0);
}

static void test_elementwise(void) {
    const int64_t n = 5000;
    for (int op = 0; op < 5; op++) {
        float *x = rnd_vec((size_t)n, op >= 3 ? 40.0f : 12.0f), *y = rnd_vec((size_t)n, 12.0f);
        float *dx = dev(x, (size_t)n * 4), *dy = dev(y, (size_t)n * 4);
        const char *what = "";
        switch (op) {
        case 0: ref->sigmoid_gate(ref, x, y, n), cu->sigmoid_gate(cu, dx, dy, n), what = "sigmoid_gate"; break;
        case 1: ref->swiglu(ref, x, y, n), cu->swiglu(cu, dx, dy, n), what = "swiglu"; break;
        case 2: ref->add(ref, x, y, n), cu->add(cu, dx, dy, n), what = "add"; break;
        case 3: ref->logit_tail(ref, x, 0.75f, 30.0f, n), cu->logit_tail(cu, dx, 0.75f, 30.0f, n), what = "logit_tail cap"; break;
        default: ref->logit_tail(ref, x, 0.75f, 0.0f, n), cu->logit_tail(cu, dx, 0.75f, 0.0f, n), what = "logit_tail"; break;
        }
        check(what, x, dx, (size_t)n * 4);
        cu->free(cu, dx, 0), cu->free(cu, dy, 0), free(x), free(y);
    }
    /* softmax and argmax (with ties: the lowest index wins) */
    const int64_t m = 333, rows = 4;
    float *x = rnd_vec((size_t)(m * rows), 8.0f);
    x[10] = x[200] = 50.0f;
    x[m + 5] = x[m + 6] = 51.0f;
    float *dx = dev(x, (size_t)(m * rows) * 4);
    int32_t am[4], dam[4];
    ref->argmax(ref, x, m, rows, am);
    cu->argmax(cu, dx, m, rows, dam);
    n_checks++;
    if (memcmp(am, dam, sizeof am)) n_fail++, fprintf(stderr, "MISMATCH argmax\n");
    ref->softmax(ref, x, 0.7f, m, m, rows - 1);
    cu->softmax(cu, dx, 0.7f, m, m, rows - 1);
    ref->softmax(ref, x + (rows - 1) * m, 0.7f, m, 200, 1); /* the last row: 200 entries, zeros after */
    cu->softmax(cu, dx + (rows - 1) * m, 0.7f, m, 200, 1);
    check("softmax", x, dx, (size_t)(m * rows) * 4);
    cu->free(cu, dx, 0), free(x);
    /* a vocabulary-wide row: repeated maxima far apart, NaN at element 0 and
     * elsewhere, all -inf, signed zeros as the maximum; softmax on rows
     * without NaN */
    const int64_t V = 8193, R = 6;
    float *w = rnd_vec((size_t)(V * R), 8.0f);
    w[100] = w[7000] = 60.0f;
    w[V] = NAN, w[V + 9] = 90.0f;
    for (int64_t i = 1; i < V; i += 97) w[2 * V + i] = NAN;
    w[2 * V + V - 1] = 70.0f;
    for (int64_t i = 0; i < V; i++) w[3 * V + i] = -INFINITY, w[4 * V + i] = -1.0f - (float)(i % 5);
    w[4 * V + 50] = -0.0f, w[4 * V + 20] = 0.0f, w[4 * V + 4000] = -0.0f;
    w[5 * V] = -INFINITY;
    for (int64_t i = 1; i < V; i++) w[5 * V + i] = NAN;
    float *dw = dev(w, (size_t)(V * R) * 4);
    int32_t wm[6], dwm[6];
    ref->argmax(ref, w, V, R, wm);
    cu->argmax(cu, dw, V, R, dwm);
    n_checks++;
    if (memcmp(wm, dwm, sizeof wm) || wm[0] != 100 || wm[1] != 0 || wm[2] != V - 1 || wm[4] != 20)
        n_fail++, fprintf(stderr, "MISMATCH argmax (vocabulary rows): ref %d %d %d %d %d %d, cuda %d %d %d %d %d %d\n", wm[0],
                          wm[1], wm[2], wm[3], wm[4], wm[5], dwm[0], dwm[1], dwm[2], dwm[3], dwm[4], dwm[5]);
    ref->softmax(ref, w + 4 * V, 0.3f, V, V, 1); /* the signed zeros as the maximum */
    cu->softmax(cu, dw + 4 * V, 0.3f, V, V, 1);
    ref->softmax(ref, w, 0.3f, 300, 300, 1);
    cu->softmax(cu, dw, 0.3f, 300, 300, 1);
    check("softmax (vocabulary rows)", w, dw, (size_t)(V * R) * 4);
    cu->free(cu, dw, 0), free(w);
}

/* dense_attention against the DFlash assistant's loop on ref over the
 * valid keys (per KV head: the head group's query rows, Q K^T as an F32
 * matmul, softmax, P V with V transposed), with the launch's key bound at
 * or above the valid count: the shipped assistant's geometry (16 rows,
 * heads 8/2 x 64, 336 slots) and others whose key and output counts are
 * not multiples of a warp's keys or outputs per pass. */
static void dense_attention_case(int64_t rows, int64_t H, int64_t Hkv, int64_t D, int64_t slots, int64_t n_keys,
                                 int64_t n_valid) {
    const int64_t group = H / Hkv, nq = rows * group;
    float *q = rnd_vec((size_t)(rows * H * D), 2.0f), *k = rnd_vec((size_t)(Hkv * slots * D), 2.0f);
    float *v = rnd_vec((size_t)(Hkv * D * slots), 3.0f);
    float *dq = dev(q, (size_t)(rows * H * D) * 4), *dk = dev(k, (size_t)(Hkv * slots * D) * 4);
    float *dv = dev(v, (size_t)(Hkv * D * slots) * 4), *dout = cu->alloc(cu, (size_t)(rows * H * D) * 4);
    float *out = mu_xmalloc((size_t)(rows * H * D) * 4), *qh = mu_xmalloc((size_t)(nq * D) * 4);
    float *p = mu_xmalloc((size_t)(nq * slots) * 4), *oh = mu_xmalloc((size_t)(nq * D) * 4);
    const float scale = 1.0f / sqrtf((float)D);
    const size_t head_rows = (size_t)(group * D) * 4, q_row = (size_t)(H * D) * 4;
    for (int64_t g = 0; g < Hkv; g++) {
        ref->copy2d(ref, qh, head_rows, q + g * group * D, q_row, head_rows, rows);
        mu_weight kw = mu_f32_matrix(k + g * slots * D, D, n_valid, D);
        ref->matmul(ref, &kw, qh, p, nq);
        ref->softmax(ref, p, scale, n_valid, n_valid, nq);
        mu_weight vw = mu_f32_matrix(v + g * D * slots, n_valid, D, slots);
        ref->matmul(ref, &vw, p, oh, nq);
        ref->copy2d(ref, out + g * group * D, q_row, oh, head_rows, head_rows, rows);
    }
    cu->dense_attention(cu, dq, rows, H, Hkv, D, dk, dv, slots, n_keys, n_valid, scale, dout);
    char what[120];
    snprintf(what, sizeof what, "dense_attention (DA %d) rows %lld heads %lld/%lld x %lld keys %lld valid %lld",
             mucu_dense_attn_mode, (long long)rows, (long long)H, (long long)Hkv, (long long)D, (long long)n_keys,
             (long long)n_valid);
    check(what, out, dout, (size_t)(rows * H * D) * 4);
    if ((H * D) % 256 == 0) { /* the product after it, which may read the kernel's own quantization */
        static const wspec q4 = {"Q4_K", MU_TYPE_Q4_K, false, false};
        const int64_t n_out = 40;
        mu_weight w = make_weight(&q4, H * D, n_out);
        float *y = mu_xmalloc((size_t)(rows * n_out) * 4), *dy = cu->alloc(cu, (size_t)(rows * n_out) * 4);
        ref->matmul(ref, &w, out, y, rows);
        cu->matmul(cu, &w, dout, dy, rows);
        snprintf(what, sizeof what, "dense_attention (DA %d) + matmul rows %lld heads %lld/%lld x %lld keys %lld",
                 mucu_dense_attn_mode, (long long)rows, (long long)H, (long long)Hkv, (long long)D, (long long)n_keys);
        check(what, y, dy, (size_t)(rows * n_out) * 4);
        cu->free(cu, dy, 0), free(y);
    }
    cu->free(cu, dq, 0), cu->free(cu, dk, 0), cu->free(cu, dv, 0), cu->free(cu, dout, 0);
    free(q), free(k), free(v), free(out), free(qh), free(p), free(oh);
}

/* Under each MUSER_CUDA_DA setting (mucu_dense_attn_mode): k_dense_attn,
 * and k_dense_attn2 with up to 1, 2 and 4 heads a CTA (fewer where they do
 * not divide the group; 4 heads of 64 dims and 2 or 4 of 128 quantize their
 * output for the product after it); head_dim 40 and 129 slots take
 * k_dense_attn whatever the setting. */
static void test_dense_attention(void) {
    const struct { int64_t n_keys, n_valid; } cases[] = {{336, 336}, {336, 201}, {100, 100}, {37, 20}, {336, 1}, {336, 7}};
    const int modes[] = {0, 1, 2, 4}, saved = mucu_dense_attn_mode;
    for (int m = 0; m < 4; m++) {
        mucu_dense_attn_mode = modes[m];
        for (int c = 0; c < 6; c++) dense_attention_case(16, 8, 2, 64, 336, cases[c].n_keys, cases[c].n_valid);
        dense_attention_case(3, 16, 4, 128, 300, 300, 293);
        dense_attention_case(2, 8, 2, 96, 132, 131, 130);
        dense_attention_case(4, 8, 8, 32, 64, 64, 17);
        dense_attention_case(5, 6, 3, 96, 129, 129, 129);
        dense_attention_case(1, 4, 1, 40, 50, 45, 33);
    }
    mucu_dense_attn_mode = saved;
}

/* The fused ops against the ops they stand for, and the matrix product
 * that reads their Q8_K quantization right after them (prequantized). */
static void test_fused_one(void) {
    static const wspec q4 = {"Q4_K", MU_TYPE_Q4_K, false, false}, q6 = {"Q6_K", MU_TYPE_Q6_K, false, false};
    /* 1001: rows that start off 16-byte alignment; 8448 and 12032: two blocks a warp */
    const int64_t ns[] = {6656, 1024, 12288, 1000, 768, 512, 1001, 8448, 12032}, rows = 3;
    for (int i = 0; i < 9; i++)
        for (int with_h = 0; with_h < 2; with_h++)
        for (int plain = 0; plain < 2; plain++) { /* plain: no w_o, x += o (the DFlash assistant's step) */
            const int64_t n = ns[i], N = n * rows;
            float *x = rnd_vec((size_t)N, 3.0f), *o = rnd_vec((size_t)N, 5.0f), *h = mu_xmalloc((size_t)N * 4);
            float *wo = rnd_vec((size_t)n, 2.0f), *wh = rnd_vec((size_t)n, 2.0f);
            float *dx = dev(x, (size_t)N * 4), *dox = dev(o, (size_t)N * 4), *dh = cu->alloc(cu, (size_t)N * 4);
            if (!plain) ref->rmsnorm(ref, o, wo, 1e-8f, o, n, rows);
            ref->add(ref, x, o, N);
            if (with_h) ref->rmsnorm(ref, x, wh, 1e-6f, h, n, rows);
            /* every other case with a capture of the new x into rows of a wider buffer: with w_o
             * 16-byte aligned (stride 2n + 4, offset 4: k_residual_w takes them), plain not (odd
             * stride, offset 2) */
            const bool capt = (i + with_h + plain) % 2;
            const int64_t cstride = 2 * n + (plain ? 3 : 4), coff = plain ? 2 : 4, cn = rows * cstride;
            float *capb = rnd_vec((size_t)cn, 1.0f), *dcap = dev(capb, (size_t)cn * 4);
            if (capt) {
                cu->residual_capture(cu, dx, dox, plain ? NULL : wo, 1e-8f, with_h ? dh : NULL, wh, 1e-6f, n, rows,
                                     dcap + coff, cstride);
                for (int64_t r = 0; r < rows; r++) memcpy(capb + coff + r * cstride, x + r * n, (size_t)n * 4);
            } else {
                cu->residual(cu, dx, dox, plain ? NULL : wo, 1e-8f, with_h ? dh : NULL, wh, 1e-6f, n, rows);
            }
            char what[96];
            snprintf(what, sizeof what, "residual%s x n=%lld h=%d plain=%d", capt ? "_capture" : "", (long long)n,
                     with_h, plain);
            check(what, x, dx, (size_t)N * 4);
            snprintf(what, sizeof what, "residual%s capture rows n=%lld h=%d plain=%d", capt ? "_capture" : "",
                     (long long)n, with_h, plain);
            check(what, capb, dcap, (size_t)cn * 4);
            cu->free(cu, dcap, 0), free(capb);
            if (with_h) {
                snprintf(what, sizeof what, "residual h n=%lld plain=%d", (long long)n, plain);
                check(what, h, dh, (size_t)N * 4);
                if (n % 256 == 0) { /* the product right after reads the fused quantization */
                    mu_weight w[2] = {make_weight(&q4, n, 40), make_weight(&q6, n, 24)};
                    const mu_weight *wp[2] = {&w[0], &w[1]};
                    float *y0 = mu_xmalloc((size_t)(rows * 40) * 4), *y1 = mu_xmalloc((size_t)(rows * 24) * 4);
                    float *dy0 = cu->alloc(cu, (size_t)(rows * 40) * 4), *dy1 = cu->alloc(cu, (size_t)(rows * 24) * 4);
                    ref->matmul(ref, &w[0], h, y0, rows);
                    ref->matmul(ref, &w[1], h, y1, rows);
                    cu->matmul_multi(cu, 2, wp, dh, (float *[]){dy0, dy1}, rows);
                    snprintf(what, sizeof what, "residual + matmul_multi n=%lld plain=%d", (long long)n, plain);
                    check(what, y0, dy0, (size_t)(rows * 40) * 4);
                    check(what, y1, dy1, (size_t)(rows * 24) * 4);
                    if (plain) { /* the rest does not depend on the residual step */
                        cu->free(cu, dy0, 0), cu->free(cu, dy1, 0), free(y0), free(y1);
                        goto next;
                    }
                    /* rmsnorm's fused quantization, then a single product */
                    ref->rmsnorm(ref, x, wh, 1e-5f, h, n, rows);
                    cu->rmsnorm(cu, dx, wh, 1e-5f, dh, n, rows);
                    ref->matmul(ref, &w[0], h, y0, rows);
                    cu->matmul(cu, &w[0], dh, dy0, rows);
                    snprintf(what, sizeof what, "rmsnorm + matmul n=%lld", (long long)n);
                    check(what, y0, dy0, (size_t)(rows * 40) * 4);
                    /* native NVFP4 after the fused quantization (it must quantize h rounded through f16
                     * itself), a native set reading that, then Q4_K again (the values as they are) */
                    static const wspec nat = {"NVFP4_native_W4A16", MU_TYPE_NVFP4_E2M1, false, false};
                    mu_weight wn[2] = {make_weight(&nat, n, 40), make_weight(&nat, n, 24)};
                    const mu_weight *wnp[2] = {&wn[0], &wn[1]};
                    ref->matmul(ref, &wn[0], h, y0, rows);
                    cu->matmul(cu, &wn[0], dh, dy0, rows);
                    snprintf(what, sizeof what, "rmsnorm + matmul NVFP4 native n=%lld", (long long)n);
                    check(what, y0, dy0, (size_t)(rows * 40) * 4);
                    ref->matmul(ref, &wn[1], h, y1, rows);
                    cu->matmul_multi(cu, 2, wnp, dh, (float *[]){dy0, dy1}, rows);
                    snprintf(what, sizeof what, "rmsnorm + matmul NVFP4 native + set n=%lld", (long long)n);
                    check(what, y0, dy0, (size_t)(rows * 40) * 4);
                    check(what, y1, dy1, (size_t)(rows * 24) * 4);
                    ref->matmul(ref, &w[0], h, y0, rows);
                    cu->matmul(cu, &w[0], dh, dy0, rows);
                    snprintf(what, sizeof what, "rmsnorm + matmul NVFP4 native + Q4_K n=%lld", (long long)n);
                    check(what, y0, dy0, (size_t)(rows * 40) * 4);
                    cu->free(cu, dy0, 0), cu->free(cu, dy1, 0), free(y0), free(y1);
                }
            }
        next:
            cu->free(cu, dx, 0), cu->free(cu, dox, 0), cu->free(cu, dh, 0), free(x), free(o), free(h);
        }
    /* gate and swiglu with their fused quantization, then the product */
    for (int op = 0; op < 2; op++) {
        const int64_t n_in = 1536, rows = 2, N = n_in * rows;
        float *x = rnd_vec((size_t)N, 12.0f), *g = rnd_vec((size_t)N, 12.0f), *y = mu_xmalloc((size_t)(rows * 33) * 4);
        float *dx = dev(x, (size_t)N * 4), *dg = dev(g, (size_t)N * 4), *dy = cu->alloc(cu, (size_t)(rows * 33) * 4);
        mu_weight w = make_weight(&q4, n_in, 33);
        if (op) ref->swiglu(ref, x, g, N), cu->swiglu(cu, dx, dg, N);
        else ref->sigmoid_gate(ref, x, g, N), cu->sigmoid_gate(cu, dx, dg, N);
        check(op ? "swiglu (fused q8)" : "sigmoid_gate (fused q8)", x, dx, (size_t)N * 4);
        ref->matmul(ref, &w, x, y, rows);
        cu->matmul(cu, &w, dx, dy, rows);
        check(op ? "swiglu + matmul" : "sigmoid_gate + matmul", y, dy, (size_t)(rows * 33) * 4);
        cu->free(cu, dx, 0), cu->free(cu, dg, 0), cu->free(cu, dy, 0), free(x), free(g), free(y);
    }
    /* per-head q/k norm + rope, without the rotation, interleaved (rot 1) and NeoX over the whole head
     * (rot 2: the DFlash assistant's), kernel and fallback head sizes */
    const int64_t Ds[] = {128, 64, 256, 80};
    for (int i = 0; i < 4; i++)
        for (int rot = 0; rot < 3; rot++) {
            const bool neox = rot == 2;
            const int64_t D = Ds[i], nq = 4, nk = 2, n_rot = D == 80 && !neox ? 64 : D, rows2 = 3;
            float *q = rnd_vec((size_t)(rows2 * nq * D), 3.0f), *k = rnd_vec((size_t)(rows2 * nk * D), 3.0f);
            float *wq = rnd_vec((size_t)D, 2.0f), *wk = rnd_vec((size_t)D, 2.0f);
            double inv_freq[128];
            for (int64_t j = 0; j < n_rot / 2; j++) inv_freq[j] = pow(10000.0, -2.0 * (double)j / (double)n_rot);
            const int64_t pos[3] = {5, 700, 131000};
            float *cs = mu_xmalloc((size_t)(rows2 * n_rot) * 4), *dcs = cu->alloc(cu, (size_t)(rows2 * n_rot) * 4);
            ref->rope_table(ref, inv_freq, n_rot / 2, pos, rows2, cs, false);
            cu->rope_table(cu, inv_freq, n_rot / 2, pos, rows2, dcs, false);
            float *dq = dev(q, (size_t)(rows2 * nq * D) * 4), *dk = dev(k, (size_t)(rows2 * nk * D) * 4);
            float *dq2 = dev(q, (size_t)(rows2 * nq * D) * 4), *dk2 = dev(k, (size_t)(rows2 * nk * D) * 4);
            float *k0 = mu_xmalloc((size_t)(rows2 * nk * D) * 4);
            memcpy(k0, k, (size_t)(rows2 * nk * D) * 4);
            ref->rmsnorm(ref, q, wq, 1e-6f, q, D, rows2 * nq);
            ref->rmsnorm(ref, k, wk, 1e-6f, k, D, rows2 * nk);
            if (rot) {
                ref->rope(ref, q, nq, D, n_rot, cs, rows2, neox);
                ref->rope(ref, k, nk, D, n_rot, cs, rows2, neox);
            }
            cu->qk_norm_rope(cu, dq, wq, nq, dk, wk, nk, D, 1e-6f, rot ? dcs : NULL, n_rot, rows2, NULL, NULL, neox);
            char what[80];
            snprintf(what, sizeof what, "qk_norm_rope q D=%lld rope=%d", (long long)D, rot);
            check(what, q, dq, (size_t)(rows2 * nq * D) * 4);
            snprintf(what, sizeof what, "qk_norm_rope k D=%lld rope=%d", (long long)D, rot);
            check(what, k, dk, (size_t)(rows2 * nk * D) * 4);
            /* with the K/V store fused: rows 0 and 2 into a 9-row plane, row 1 into a 5-row ring, journaled;
             * against ref's separate kv_store of its results */
            const int64_t caps[2] = {9, 5}, jcap = 6;
            mu_kv_layer hl[2], dl[2];
            uint16_t *hj[2], *dj[2];
            const size_t jplane = (size_t)(nk * jcap * D) * 2;
            for (int c = 0; c < 2; c++) {
                const size_t plane = (size_t)(nk * caps[c] * D) * 2;
                hl[c] = (mu_kv_layer){.cap = caps[c], .n_head = nk, .head_dim = D, .row_elems = nk * D};
                dl[c] = hl[c];
                hl[c].k = malloc(plane), hl[c].v = malloc(plane);
                for (size_t e = 0; e < plane / 2; e++)
                    hl[c].k[e] = (uint16_t)(next_u32() & 0xBFFFu), hl[c].v[e] = (uint16_t)(next_u32() & 0xBFFFu);
                dl[c].k = dev(hl[c].k, plane), dl[c].v = dev(hl[c].v, plane);
                hj[c] = calloc(1, jplane), dj[c] = cu->alloc(cu, jplane);
                cu->zero(cu, dj[c], jplane);
            }
            mu_kv_dst hd[3], dd[3];
            for (int r = 0; r < 3; r++) {
                const int c = r == 1;
                const int64_t phys = c ? 3 : (r ? 8 : 2), slot = (r * 5 + 1) % jcap;
                hd[r] = (mu_kv_dst){.l = &hl[c], .physical = phys, .jk = hj[0], .jv = hj[1], .jcap = jcap, .slot = slot};
                dd[r] = (mu_kv_dst){.l = &dl[c], .physical = phys, .jk = dj[0], .jv = dj[1], .jcap = jcap, .slot = slot};
            }
            float *v = rnd_vec((size_t)(rows2 * nk * D), 3.0f), *dv = dev(v, (size_t)(rows2 * nk * D) * 4);
            ref->kv_store(ref, rows2, hd, k, v);
            cu->qk_norm_rope(cu, dq2, wq, nq, dk2, wk, nk, D, 1e-6f, rot ? dcs : NULL, n_rot, rows2, dd, dv, neox);
            if (neox && D == 128) { /* k heads alone (nq 0: the assistant's context projection) */
                float *dk3 = dev(k0, (size_t)(rows2 * nk * D) * 4);
                cu->qk_norm_rope(cu, NULL, NULL, 0, dk3, wk, nk, D, 1e-6f, dcs, n_rot, rows2, NULL, NULL, true);
                check("qk_norm_rope NeoX, k heads alone", k, dk3, (size_t)(rows2 * nk * D) * 4);
                cu->free(cu, dk3, 0);
            }
            snprintf(what, sizeof what, "qk_norm_rope + kv_store k D=%lld rope=%d", (long long)D, rot);
            check(what, k, dk2, (size_t)(rows2 * nk * D) * 4);
            for (int c = 0; c < 2; c++) {
                const size_t plane = (size_t)(nk * caps[c] * D) * 2;
                snprintf(what, sizeof what, "qk_norm_rope + kv_store D=%lld rope=%d: cache %d K", (long long)D, rot, c);
                check(what, hl[c].k, dl[c].k, plane);
                snprintf(what, sizeof what, "qk_norm_rope + kv_store D=%lld rope=%d: cache %d V", (long long)D, rot, c);
                check(what, hl[c].v, dl[c].v, plane);
                snprintf(what, sizeof what, "qk_norm_rope + kv_store D=%lld rope=%d: journal %c", (long long)D, rot,
                         c ? 'V' : 'K');
                check(what, hj[c], dj[c], jplane);
                free(hl[c].k), free(hl[c].v), free(hj[c]);
                cu->free(cu, dl[c].k, 0), cu->free(cu, dl[c].v, 0), cu->free(cu, dj[c], 0);
            }
            cu->free(cu, dv, 0), free(v), cu->free(cu, dq2, 0), cu->free(cu, dk2, 0);
            cu->free(cu, dq, 0), cu->free(cu, dk, 0), cu->free(cu, dcs, 0), free(q), free(k), free(cs), free(k0);
        }
}

/* test_fused_one with the residual step's row in both shared-memory
 * layouts (mucu_res_t: natural, transposed), each by k_residual_w where
 * it takes the row (mucu_res_w 1) and by k_residual (0). */
static void test_fused(void) {
    const int saved = mucu_res_t, saved_w = mucu_res_w;
    for (int tr = 0; tr < 2; tr++)
        for (int w = 0; w < 2; w++) {
            mucu_res_t = tr, mucu_res_w = w;
            test_fused_one();
        }
    mucu_res_t = saved, mucu_res_w = saved_w;
}

static void test_store_heads_and_memory(void) {
    const int64_t Ss[2] = {11, 336}, Ds[2] = {24, 128}, Hs[2] = {3, 4}, rowss[2] = {4, 16};
    for (int c = 0; c < 2; c++) {
        const int64_t S = Ss[c], D = Ds[c], H = Hs[c], rows = rowss[c];
        int64_t slots[16];
        for (int r = 0; r < rows; r++) slots[r] = (r * 7 + 3) % S;
        const size_t dst_bytes = (size_t)(H * S * D) * 4, src_bytes = (size_t)(rows * H * D) * 4;
        float *k = rnd_vec((size_t)(rows * H * D), 1.0f), *v = rnd_vec((size_t)(rows * H * D), 1.0f);
        float *kd = rnd_vec((size_t)(H * S * D), 1.0f), *vd = rnd_vec((size_t)(H * S * D), 1.0f);
        float *dk = dev(k, src_bytes), *dv = dev(v, src_bytes), *dkd = dev(kd, dst_bytes), *dvd = dev(vd, dst_bytes);
        ref->store_kv_heads(ref, kd, vd, slots, S, D, H, k, v, rows);
        cu->store_kv_heads(cu, dkd, dvd, slots, S, D, H, dk, dv, rows);
        check("store_kv_heads K", kd, dkd, dst_bytes);
        check("store_kv_heads V (transposed)", vd, dvd, dst_bytes);
        cu->free(cu, dk, 0), cu->free(cu, dv, 0), cu->free(cu, dkd, 0), cu->free(cu, dvd, 0);
        free(k), free(v), free(kd), free(vd);
    }
    /* every layer of the assistant's state in one store: 5 layers, planes and rows evenly apart (the
     * gaps between them untouched) */
    {
        const int64_t S = 336, D = 64, H = 2, rows = 16, L = 5, ps = 2 * S * H * D + 7, ss = 2 * 64 * H * D;
        int64_t slots[16];
        for (int r = 0; r < rows; r++) slots[r] = r % 3 ? 200 + r : (r * 13) % 64;
        const size_t pn = (size_t)(L * ps), sn = (size_t)(L * ss);
        float *kd = rnd_vec(pn, 1.0f), *k = rnd_vec(sn, 1.0f);
        float *dkd = dev(kd, pn * 4), *dk = dev(k, sn * 4);
        ref->store_kv_heads_layers(ref, kd, kd + S * H * D, ps, slots, S, D, H, k, k + ss / 2, ss, rows, L);
        cu->store_kv_heads_layers(cu, dkd, dkd + S * H * D, ps, slots, S, D, H, dk, dk + ss / 2, ss, rows, L);
        check("store_kv_heads_layers (5 layers)", kd, dkd, pn * 4);
        cu->free(cu, dkd, 0), cu->free(cu, dk, 0), free(kd), free(k);
    }
    /* overlapping copy (memmove), copy2d, zero, zero-filled alloc */
    float *h = rnd_vec(1000, 1.0f), *d = dev(h, 4000);
    ref->copy(ref, h + 10, h, 900 * 4);
    cu->copy(cu, d + 10, d, 900 * 4);
    check("copy (overlapping, forward)", h, d, 4000);
    ref->copy(ref, h, h + 7, 900 * 4);
    cu->copy(cu, d, d + 7, 900 * 4);
    check("copy (overlapping, backward)", h, d, 4000);
    float h2[300] = {0};
    float *d2 = cu->alloc(cu, sizeof h2);
    check("alloc is zero-filled", h2, d2, sizeof h2);
    ref->copy2d(ref, h2, 40, h, 100, 24, 7);
    cu->copy2d(cu, d2, 40, d, 100, 24, 7);
    check("copy2d", h2, d2, sizeof h2);
    ref->zero(ref, h2 + 5, 80);
    cu->zero(cu, d2 + 5, 80);
    check("zero", h2, d2, sizeof h2);
    cu->free(cu, d, 0), cu->free(cu, d2, 0), free(h);
}

/* first_nonfinite against the host scan (ref's): none, one NaN / +inf /
 * -inf / NaN with a payload or the sign set at element 0, the last element,
 * the scalar tail and inside the float4 part, two bad values (the first
 * wins), finite extremes (FLT_MAX, subnormals, -0) that must not count;
 * aligned and unaligned starts, lengths 1 to 5 and a vocabulary's 8 rows.
 * Then download into host_alloc's page-locked memory (copied directly) and
 * into malloc'd memory (through the staging buffer). */
static void test_first_nonfinite(void) {
    const int64_t N = 8 * 202048 + 3;
    float *x = rnd_vec((size_t)N + 1, 30.0f);
    x[5] = FLT_MAX, x[6] = -FLT_MAX, x[7] = 1e-42f, x[8] = -0.0f, x[N - 2] = -1e-45f;
    float *dx = dev(x, (size_t)(N + 1) * 4);
    const uint32_t bads[5] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x7F800001u, 0xFFC12345u};
    for (int start = 0; start < 2; start++) {
        const int64_t n = N - start, at[7] = {0, 1, 2, 1000003, n / 2 + 1, n - 2, n - 1};
        const float *xs = x + start;
        const float *dxs = dx + start;
        n_checks++;
        int64_t want = ref->first_nonfinite(ref, xs, n), got = cu->first_nonfinite(cu, dxs, n);
        if (want != n || got != want)
            n_fail++, fprintf(stderr, "MISMATCH first_nonfinite (none, start %d): ref %lld cuda %lld\n", start,
                              (long long)want, (long long)got);
        for (int k = 0; k < 7; k++)
            for (int v = 0; v < 5; v++) {
                const int64_t i = at[k], j = at[(k + 3) % 7];
                float bad, keep_i = xs[i], keep_j = xs[j];
                memcpy(&bad, &bads[v], 4);
                /* one bad value at i; with v odd a second one at j too */
                cu->upload(cu, (float *)dxs + i, &bad, 4);
                ((float *)xs)[i] = bad;
                if (v & 1) {
                    cu->upload(cu, (float *)dxs + j, &bad, 4);
                    ((float *)xs)[j] = bad;
                }
                want = ref->first_nonfinite(ref, xs, n), got = cu->first_nonfinite(cu, dxs, n);
                const int64_t expect = (v & 1) && j < i ? j : i;
                n_checks++;
                if (got != want || want != expect)
                    n_fail++, fprintf(stderr, "MISMATCH first_nonfinite (bad 0x%08X at %lld%s, start %d): ref %lld cuda %lld\n",
                                      bads[v], (long long)i, v & 1 ? " and another" : "", start, (long long)want,
                                      (long long)got);
                ((float *)xs)[i] = keep_i, ((float *)xs)[j] = keep_j;
                cu->upload(cu, (float *)dxs + i, &keep_i, 4);
                cu->upload(cu, (float *)dxs + j, &keep_j, 4);
            }
    }
    /* short lengths: the op leaves them to the host (-1); the kernel itself answers exactly */
    unsigned long long *dbest = cu->alloc(cu, 8);
    char msg[MUCU_ERR_LEN];
    for (int64_t n = 1; n <= 5; n++) {
        float nan = NAN;
        cu->upload(cu, dx + 1 + (n - 1), &nan, 4);
        unsigned long long v[2] = {0, 0};
        for (int k = 0; k < 2; k++)
            if (!mucu_first_nonfinite(dx + 1, n - k, dbest, msg) || !mucu_memcpy(&v[k], dbest, 8, "test", msg))
                fprintf(stderr, "test_first_nonfinite: %s\n", msg), exit(1);
        n_checks++;
        if ((int64_t)(n - v[0]) != n - 1 || (n > 1 && (int64_t)(n - 1 - v[1]) != n - 1) || cu->first_nonfinite(cu, dx + 1, n) != -1)
            n_fail++, fprintf(stderr, "MISMATCH first_nonfinite (length %lld): %lld, without the last %lld\n",
                              (long long)n, (long long)(n - v[0]), (long long)(n - 1 - v[1]));
        cu->upload(cu, dx + 1 + (n - 1), x + 1 + (n - 1), 4);
    }
    cu->free(cu, dbest, 8);
    /* downloads: page-locked (direct) and malloc'd (staged), whole and offset */
    const size_t bytes = (size_t)202048 * 4;
    float *pin = cu->host_alloc ? cu->host_alloc(cu, bytes + 64) : NULL, *plain = mu_xmalloc(bytes + 64);
    n_checks++;
    if (!pin) n_fail++, fprintf(stderr, "MISMATCH host_alloc gave no memory\n");
    for (int k = 0; pin && k < 2; k++) {
        memset(pin, 0, bytes + 64), memset(plain, 0, bytes + 64);
        cu->download(cu, pin + k, dx + 3 * k, bytes);
        cu->download(cu, plain + k, dx + 3 * k, bytes);
        n_checks++;
        if (memcmp(pin + k, x + 3 * k, bytes) || memcmp(plain + k, x + 3 * k, bytes))
            n_fail++, fprintf(stderr, "MISMATCH download into %s memory (offset %d)\n", "page-locked or malloc'd", k);
    }
    if (pin) cu->host_free(cu, pin, bytes + 64);
    free(plain);
    cu->free(cu, dx, 0), free(x);
}

/* chain_pick against the host's (ref's), slot and chained token: random
 * rows of 1 to 262,144 values (one CTA and up to 64, a partial last CTA),
 * with the maximum unique, tied at a later and at an earlier index (in
 * another CTA), +0 against -0 as the only maximum, a NaN / inf anywhere;
 * then the chained token into embed (MU_TOKEN_CHAINED) against ref's embed
 * of the same id. */
static void test_chain_pick(void) {
    static const int64_t lens[] = {1, 7, 1000, 4096, 4097, 12289, 202048, 262144};
    int32_t *hs = cu->host_alloc(cu, 8), rs[2];
    if (!hs) fprintf(stderr, "test_chain_pick: no page-locked memory\n"), exit(1);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        const int64_t n = lens[li];
        float *x = rnd_vec((size_t)n, 20.0f);
        for (int v = 0; v < 7; v++) {
            float *y = mu_xmalloc((size_t)n * 4);
            memcpy(y, x, (size_t)n * 4);
            int64_t best = 0;
            for (int64_t i = 1; i < n; i++)
                if (y[i] > y[best]) best = i;
            const int64_t other = (best + n / 2 + 1) % n;
            if (v == 1 && n > 1) y[other] = y[best];                       /* a tie (later or earlier) */
            if (v == 2 && n > 1) y[(best + 4097) % n] = y[best];           /* a tie across CTAs */
            if (v == 3) {                                                   /* +0 and -0 the maxima */
                for (int64_t i = 0; i < n; i++) y[i] = -fabsf(y[i]) - 1.0f;
                y[n / 3] = 0.0f;
                if (n > 1) y[n - 1] = -0.0f;
            }
            if (v == 4) y[n - 1] = NAN;
            if (v == 5) y[n / 2] = INFINITY;
            if (v == 6) y[0] = -INFINITY;
            float *dy = dev(y, (size_t)n * 4);
            ref->chain_pick(ref, y, n, rs);
            hs[1] = 0;
            cu->chain_pick(cu, dy, n, hs);
            mu_error err;
            n_checks++;
            if (!cu->chain_wait(cu, hs, &err)) n_fail++, fprintf(stderr, "MISMATCH chain_wait: %s\n", err.msg);
            else if (hs[0] != rs[0] || hs[1] != rs[1])
                n_fail++, fprintf(stderr, "MISMATCH chain_pick (%lld values, variant %d): ref {%d, %d} cuda {%d, %d}\n",
                                  (long long)n, v, rs[0], rs[1], hs[0], hs[1]);
            cu->free(cu, dy, 0);
            free(y);
        }
        free(x);
    }
    /* the chained token enters embed as the id it stands for */
    const wspec *ws = &WSPECS[0];
    mu_weight w = make_weight(ws, 256, 300);
    float *x = rnd_vec(300, 5.0f);
    x[123] = 99.0f;
    float *dx = dev(x, 300 * 4), want[256];
    hs[1] = 0;
    cu->chain_pick(cu, dx, 300, hs);
    mu_error err;
    const int32_t id = 123, chained = MU_TOKEN_CHAINED;
    ref->embed(ref, &w, &id, 1, want);
    float *dout = cu->alloc(cu, 256 * 4);
    cu->embed(cu, &w, &chained, 1, dout);
    n_checks++;
    if (!cu->chain_wait(cu, hs, &err) || hs[0] != 123 || hs[1] != 1)
        n_fail++, fprintf(stderr, "MISMATCH chain_pick before embed: {%d, %d}\n", hs[0], hs[1]);
    check("embed of the chained token", want, dout, 256 * 4);
    cu->free(cu, dout, 0), cu->free(cu, dx, 0), free(x);
    cu->host_free(cu, hs, 8);
}

/* argmax_reg and pick_rows against the host's (ref's): rows of random
 * values with ties, signed zeros and non-finite values in some of them,
 * the registers read back through pick_rows' copy, and embed / embed_norm
 * of ids that are token registers (MU_TOKEN_REG). */
static void test_pick_rows(void) {
    static const int64_t lens[] = {7, 8192, 202048};
    static const int64_t nrows[] = {1, 3, 16};
    const size_t slot_bytes = (2 * 16 + MU_TOKEN_REGS) * sizeof(int32_t);
    int32_t *hs = cu->host_alloc(cu, slot_bytes), rs[2 * 16 + MU_TOKEN_REGS];
    if (!hs) fprintf(stderr, "test_pick_rows: no page-locked memory\n"), exit(1);
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
        for (size_t ri = 0; ri < sizeof nrows / sizeof *nrows; ri++) {
            const int64_t n = lens[li], rows = nrows[ri];
            float *y = rnd_vec((size_t)(n * rows), 20.0f);
            for (int64_t r = 0; r < rows; r++) {
                float *l = y + r * n;
                int64_t best = 0;
                for (int64_t i = 1; i < n; i++)
                    if (l[i] > l[best]) best = i;
                switch (r % 6) {
                case 1: l[(best + n / 2 + 1) % n] = l[best]; break; /* a tie */
                case 2: l[n - 1] = NAN; break;
                case 3: l[n / 2] = INFINITY; break;
                case 4: for (int64_t i = 0; i < n; i++) l[i] = -fabsf(l[i]) - 1.0f;
                        l[n / 3] = 0.0f, l[n - 1] = -0.0f; break;      /* +0 and -0 the maxima */
                default: break;
                }
            }
            float *dy = dev(y, (size_t)(n * rows) * 4);
            const int n_regs = (int)(rows < MU_TOKEN_REGS ? rows : MU_TOKEN_REGS);
            ref->argmax_reg(ref, y, n, n_regs);
            ref->pick_rows(ref, y, n, rows, n_regs, rs);
            cu->argmax_reg(cu, dy, n, n_regs);
            for (int64_t r = 0; r < rows; r++) hs[2 * r + 1] = 0;
            cu->pick_rows(cu, dy, n, rows, n_regs, hs);
            mu_error err;
            bool ok = true;
            for (int64_t r = 0; r < rows && ok; r++) ok = cu->chain_wait(cu, hs + 2 * r, &err);
            n_checks++;
            if (!ok) n_fail++, fprintf(stderr, "MISMATCH pick_rows wait: %s\n", err.msg);
            else if (memcmp(hs, rs, (size_t)(2 * rows + n_regs) * sizeof(int32_t))) {
                n_fail++;
                fprintf(stderr, "MISMATCH pick_rows (%lld rows of %lld values):", (long long)rows, (long long)n);
                for (int64_t i = 0; i < 2 * rows + n_regs; i++) fprintf(stderr, " %d/%d", rs[i], hs[i]);
                fprintf(stderr, "\n");
            }
            cu->free(cu, dy, 0);
            free(y);
        }
    /* ids from the registers: rows whose maxima sit at known places */
    const wspec *ws = &WSPECS[0];
    mu_weight w = make_weight(ws, 256, 300);
    float *x = rnd_vec(3 * 300, 5.0f);
    x[0 * 300 + 123] = 99.0f, x[1 * 300 + 7] = 99.0f, x[2 * 300 + 299] = 99.0f;
    float *dx = dev(x, 3 * 300 * 4);
    cu->argmax_reg(cu, dx, 300, 3);
    const int32_t ids[5] = {5, 7, 123, 299, 7}, toks[5] = {5, MU_TOKEN_REG(1), MU_TOKEN_REG(0), MU_TOKEN_REG(2), 7};
    float want[5 * 256], want_h[5 * 256], *g = rnd_vec(256, 1.0f);
    ref->embed(ref, &w, ids, 5, want);
    float *dout = cu->alloc(cu, 5 * 256 * 4), *dh = cu->alloc(cu, 5 * 256 * 4), *dg = dev(g, 256 * 4);
    cu->embed(cu, &w, toks, 5, dout);
    check("embed of token registers", want, dout, 5 * 256 * 4);
    memcpy(want_h, want, sizeof want);
    ref->rmsnorm(ref, want, NULL, 1e-6f, want, 256, 5);
    ref->rmsnorm(ref, want, g, 1e-6f, want_h, 256, 5);
    if (cu->embed_norm) {
        cu->embed_norm(cu, &w, toks, 5, 1e-6f, dg, dout, dh);
        check("embed_norm of token registers (x)", want, dout, 5 * 256 * 4);
        check("embed_norm of token registers (h)", want_h, dh, 5 * 256 * 4);
    }
    cu->free(cu, dout, 0), cu->free(cu, dh, 0), cu->free(cu, dg, 0), cu->free(cu, dx, 0);
    free(x), free(g);
    cu->host_free(cu, hs, slot_bytes);
}

/* Draft row r of a tree_reg case (V values) in shape sh: random; peaked
 * (two leaders); ties inside the top 8; ties across the 8th place (the
 * lower ids must win); NaN, +inf or -inf somewhere (no candidates); +0 and
 * -0 the maxima; 12 equal maxima; a copy of row 0 (equal rows: products
 * tie between nodes, the earliest node must win). */
static void tree_row(float *y, int64_t V, int r, int sh) {
    float *l = y + (int64_t)r * V;
    for (int64_t i = 0; i < V; i++) l[i] = rnd(4.0f);
    const int64_t a = (int64_t)(next_u32() % (uint32_t)V), b = (a + V / 2 + 1) % V, c = (a * 7 + 3) % V;
    switch (sh) {
    case 1: l[a] = 11.0f, l[b] = 10.25f; break;
    case 2: l[a] = l[b] = 9.0f, l[c] = 8.5f; break;
    case 3: for (int k = 0; k < 12; k++) l[(a + k * 5) % V] = 7.0f; l[c] = 9.0f; break;
    case 4: l[b] = NAN; break;
    case 5: l[c] = INFINITY; break;
    case 6: l[a] = -INFINITY; break;
    case 7: for (int64_t i = 0; i < V; i++) l[i] = -fabsf(l[i]) - 1.0f;
            l[a] = 0.0f, l[b] = -0.0f; break;
    case 8: for (int k = 0; k < 12; k++) l[(a + k * 3) % V] = 6.5f; break;
    case 9: if (r > 0) memcpy(l, y, (size_t)V * sizeof *l); break;
    default: break;
    }
}

/* Builds the same tree on ref (mu_spec_tree_build) and cuda from draft
 * rows y [rows][V] (dy: a device copy) and compares the host slots, the
 * token registers (read back through pick_rows' register copy) and the
 * depths (through rope_table on the registers). */
static bool tree_reg_case(const float *y, const float *dy, int64_t V, int rows, const int32_t *eog, int n_eog,
                          int32_t *hs, int32_t *hp, const char *label) {
    int32_t want[1 + 2 * MU_TREE_MAX];
    ref->tree_reg(ref, y, V, rows, eog, n_eog, want);
    memset(hs, 0x55, sizeof want);
    cu->tree_reg(cu, dy, V, rows, eog, n_eog, hs);
    int32_t sync;
    cu->download(cu, &sync, dy, sizeof sync); /* the stream's work is done */
    bool ok = true;
    n_checks++;
    if (memcmp(hs, want, sizeof want)) {
        ok = false, n_fail++;
        fprintf(stderr, "MISMATCH tree_reg slot (%s):", label);
        for (int i = 0; i < 1 + 2 * MU_TREE_MAX; i++) fprintf(stderr, " %d/%d", want[i], hs[i]);
        fprintf(stderr, "\n");
    }
    if (rows > 0) {
        hp[1] = 0;
        cu->pick_rows(cu, dy, V, 1, rows, hp);
        mu_error err;
        n_checks++;
        if (!cu->chain_wait(cu, hp, &err)) {
            ok = false, n_fail++;
            fprintf(stderr, "MISMATCH tree_reg token registers (%s): %s\n", label, err.msg);
        } else if (memcmp(hp + 2, ref->regs, (size_t)rows * sizeof(int32_t))) {
            ok = false, n_fail++;
            fprintf(stderr, "MISMATCH tree_reg token registers (%s):", label);
            for (int i = 0; i < rows; i++) fprintf(stderr, " %d/%d", ref->regs[i], hp[2 + i]);
            fprintf(stderr, "\n");
        }
    }
    double inv_freq[4] = {1.0, 0.25, 1.0 / 64, 1e-4};
    int64_t pos[MU_TREE_MAX];
    for (int r = 0; r < MU_TREE_MAX; r++) pos[r] = 4093 + r;
    float cs[MU_TREE_MAX * 8], *dcs = cu->alloc(cu, sizeof cs);
    ref->rope_table(ref, inv_freq, 4, pos, MU_TREE_MAX, cs, true);
    cu->rope_table(cu, inv_freq, 4, pos, MU_TREE_MAX, dcs, true);
    char what[160];
    snprintf(what, sizeof what, "rope_table on the tree registers (%s)", label);
    const int before = n_fail;
    check(what, cs, dcs, sizeof cs);
    cu->free(cu, dcs, 0);
    return ok && n_fail == before;
}

/* tree_reg (backend.h; k_tree_rows + k_tree_build) against the reference
 * builder: vocabularies of 1 to 150,000 ids (aligned float4 rows and odd
 * ones, one chunk of registers or several), 0 to 15 draft rows, every row
 * shape of tree_row alone and mixed, with and without end-of-generation
 * ids (the leaders of some rows, so that subtrees must stop under them). */
static void test_tree_reg(void) {
    static const int64_t vs[] = {8192, 5, 150000, 1, 9, 4100, 10007};
    static const int nrows[] = {0, 1, 4, 15};
    const size_t slot_bytes = (1 + 2 * MU_TREE_MAX) * sizeof(int32_t), pick_bytes = (2 + MU_TOKEN_REGS) * sizeof(int32_t);
    int32_t *hs = cu->host_alloc(cu, slot_bytes), *hp = cu->host_alloc(cu, pick_bytes);
    if (!hs || !hp) fprintf(stderr, "test_tree_reg: no page-locked memory\n"), exit(1);
    int cases = 0, bad = 0, deep = 0;
    for (size_t vi = 0; vi < sizeof vs / sizeof *vs; vi++)
        for (size_t ri = 0; ri < sizeof nrows / sizeof *nrows; ri++)
            for (int sh = 0; sh <= 10; sh++)
                for (int with_eog = 0; with_eog < 2; with_eog++) {
                    const int64_t V = vs[vi];
                    const int rows = nrows[ri];
                    if (V > 10000 && sh % 3 != 0 && sh != 10) continue; /* the long rows: fewer shapes */
                    float *y = mu_xmalloc((size_t)(V * (rows ? rows : 1)) * sizeof *y);
                    for (int r = 0; r < rows; r++) tree_row(y, V, r, sh == 10 ? r % 10 : sh);
                    if (!rows) y[0] = 1.0f;
                    int32_t eog[16];
                    int n_eog = 0;
                    for (int r = 0; with_eog && r < rows && n_eog < 16; r += 2) { /* row r's first maximum */
                        int64_t best = 0;
                        for (int64_t i = 1; i < V; i++)
                            if (y[(int64_t)r * V + i] > y[(int64_t)r * V + best]) best = i;
                        eog[n_eog++] = (int32_t)best;
                    }
                    if (with_eog && n_eog == 0) eog[n_eog++] = 3;
                    float *dy = dev(y, (size_t)(V * (rows ? rows : 1)) * sizeof *y);
                    char label[96];
                    snprintf(label, sizeof label, "V %lld, %d rows, shape %d, %d eog", (long long)V, rows, sh, n_eog);
                    cases++;
                    bad += !tree_reg_case(y, dy, V, rows, eog, n_eog, hs, hp, label);
                    for (int i = 1; i < MU_TREE_MAX; i++) deep += ref->treg.depth[i] > 2 && i < ref->treg.n;
                    cu->free(cu, dy, 0);
                    free(y);
                }
    printf("tree_reg: %d cases, %d differ (%d nodes deeper than 2)\n", cases, bad, deep);
    cu->host_free(cu, hs, slot_bytes), cu->host_free(cu, hp, pick_bytes);
}

/* Attention whose tree rows come from the tree registers (mu_attn_batch.treg:
 * row r is node r at base + depth[r], the host's positions only bound
 * them) against ref's registers holding the same tree: trees of 15, 7 and
 * 0 draft rows over peaked and tied rows (fillers included: 16 rows; or
 * fewer rows than nodes), planes and windowed rings, the tree across a
 * 256-key block edge, every kernel choice. */
static void test_tree_reg_attention(void) {
    const int64_t cfg[5][6] = {/* H, Hkv, D, window, base0, n */
                               {8, 2, 64, 0, 0, 266},    {32, 2, 128, 0, 0, 530}, {8, 2, 64, 128, 400, 143},
                               {16, 1, 256, 0, 100, 180}, {16, 4, 128, 200, 250, 600}};
    const size_t slot_bytes = (1 + 2 * MU_TREE_MAX) * sizeof(int32_t);
    int32_t *hs = cu->host_alloc(cu, slot_bytes), want[1 + 2 * MU_TREE_MAX];
    if (!hs) fprintf(stderr, "test_tree_reg_attention: no page-locked memory\n"), exit(1);
    const int64_t V = 64;
    for (int ci = 0; ci < 5; ci++)
        for (int ti = 0; ti < 3; ti++) {
            const int drows = ti == 0 ? 15 : ti == 1 ? 7 : 0, vrows = ti == 1 ? 5 : 16;
            float *y = mu_xmalloc((size_t)(V * 16) * sizeof *y);
            for (int r = 0; r < drows; r++) tree_row(y, V, r, ti == 0 ? (r % 3 ? 1 : 2) : 9);
            float *dy = dev(y, (size_t)(V * 16) * sizeof *y);
            ref->tree_reg(ref, y, V, drows, NULL, 0, want);
            cu->tree_reg(cu, dy, V, drows, NULL, 0, hs);
            const int64_t H = cfg[ci][0], Hkv = cfg[ci][1], D = cfg[ci][2], window = cfg[ci][3];
            const int64_t base0 = cfg[ci][4], n = cfg[ci][5], tbase = base0 + n - vrows;
            mu_kv_layer h, d;
            kv_fill(&h, &d, Hkv, D, n, base0, n);
            mu_attn_tree tree[16];
            int64_t pos[16];
            const mu_kv_layer *hk[16], *dk[16];
            for (int i = 0; i < vrows; i++) tree[i].base = tbase, pos[i] = tbase + i, hk[i] = &h, dk[i] = &d;
            mu_attn_batch a = {.rows = vrows, .kv = hk, .pos = pos, .window = window, .n_head = H, .n_head_kv = Hkv,
                               .head_dim = D, .scale = 1.0f / sqrtf((float)D), .tree = tree, .treg = &ref->treg};
            const int kern[6] = {1, 0, 3, 3, 3, 2}, hgs[6] = {0, 0, 1, 2, 4, 0};
            char what[160];
            snprintf(what, sizeof what, "tree register attention (%d nodes, %d rows) H=%lld/%lld D=%lld window=%lld base %lld",
                     ref->treg.n, vrows, (long long)H, (long long)Hkv, (long long)D, (long long)window, (long long)tbase);
            check_attention(a, dk, kern, hgs, 6, what);
            free(h.k), free(h.v), free(y);
            cu->free(cu, d.k, 0), cu->free(cu, d.v, 0), cu->free(cu, dy, 0);
        }
    cu->host_free(cu, hs, slot_bytes);
}

/* copy2d_many against the host's: strided copies between random bytes,
 * destinations apart, in 16-byte pieces and (odd offsets or widths) byte
 * by byte; the rollback of a KV journal makes 2 x layers of them. */
static void test_copy2d_many(void) {
    const size_t bytes = 1 << 20;
    uint8_t *hd = mu_xmalloc(bytes), *hs = mu_xmalloc(bytes);
    for (size_t i = 0; i < bytes; i++) hd[i] = (uint8_t)(next_u32() >> 7), hs[i] = (uint8_t)(next_u32() >> 11);
    uint8_t *dd = dev(hd, bytes), *ds = dev(hs, bytes);
    for (int variant = 0; variant < 3; variant++) {
        mu_copy2d hc[48], dc[48];
        const int n = variant == 0 ? 1 : variant == 1 ? 16 : 48;
        for (int i = 0; i < n; i++) {
            /* copy i owns destination span [i * 20000, (i + 1) * 20000): rows within it */
            const bool odd = variant == 2 && i % 3 == 1;
            const size_t width = odd ? 1 + next_u32() % 700 : 16 * (1 + next_u32() % 40);
            const int64_t rows = 1 + (int64_t)(next_u32() % 8);
            const size_t dstride = width + (odd ? 3 : 16) * (next_u32() % 4), sstride = width + 16 * (next_u32() % 5);
            const size_t doff = (size_t)i * 20000 + (odd ? 1 + next_u32() % 7 : 16 * (next_u32() % 8));
            const size_t soff = (odd ? 5 : 0) + 16 * (next_u32() % 4000);
            hc[i] = (mu_copy2d){hd + doff, dstride, hs + soff, sstride, width, rows};
            dc[i] = (mu_copy2d){dd + doff, dstride, ds + soff, sstride, width, rows};
        }
        ref->copy2d_many(ref, n, hc);
        cu->copy2d_many(cu, n, dc);
        char what[64];
        snprintf(what, sizeof what, "copy2d_many (%d copies, variant %d)", n, variant);
        check(what, hd, dd, bytes);
    }
    cu->free(cu, dd, 0), cu->free(cu, ds, 0);
    free(hd), free(hs);
}

/* The assistant's fused norm, NeoX rotation and K/V store
 * (qk_norm_rope_heads) against ref's rmsnorm, rope and store_kv_heads: q
 * and k in place and both planes, with and without q heads, 64- and
 * 128-wide heads, a few rows and a block's. */
static void test_qk_norm_rope_heads(void) {
    if (!cu->qk_norm_rope_heads) return;
    static const int64_t shapes[4][4] = {{64, 8, 16, 336}, {64, 0, 16, 336}, {128, 4, 3, 40}, {64, 8, 1, 20}};
    for (int c = 0; c < 4; c++) {
        const int64_t D = shapes[c][0], nq = shapes[c][1], rows = shapes[c][2], S = shapes[c][3], nk = 2;
        int64_t slots[16];
        for (int r = 0; r < rows; r++) slots[r] = (r * 11 + 5) % S;
        const size_t qn = (size_t)(rows * nq * D), kn = (size_t)(rows * nk * D), pn = (size_t)(nk * S * D);
        float *q = rnd_vec(qn + 1, 3.0f), *k = rnd_vec(kn, 3.0f), *v = rnd_vec(kn, 2.0f);
        float *wq = rnd_vec((size_t)D, 1.5f), *wk = rnd_vec((size_t)D, 1.5f);
        float *kd = rnd_vec(pn, 1.0f), *vd = rnd_vec(pn, 1.0f), *cs = mu_xmalloc((size_t)(rows * D) * 4);
        double inv_freq[64];
        for (int i = 0; i < D / 2; i++) inv_freq[i] = 1.0 / pow(500000.0, 2.0 * i / (double)D);
        int64_t pos[16];
        for (int r = 0; r < rows; r++) pos[r] = 70 + 3 * r;
        ref->rope_table(ref, inv_freq, D / 2, pos, rows, cs, false);
        float *dq = dev(q, (qn + 1) * 4), *dk = dev(k, kn * 4), *dv = dev(v, kn * 4), *dkd = dev(kd, pn * 4),
              *dvd = dev(vd, pn * 4), *dcs = dev(cs, (size_t)(rows * D) * 4);
        if (nq) {
            ref->rmsnorm(ref, q, wq, 1e-5f, q, D, rows * nq);
            ref->rope(ref, q, nq, D, D, cs, rows, true);
        }
        ref->rmsnorm(ref, k, wk, 1e-5f, k, D, rows * nk);
        ref->rope(ref, k, nk, D, D, cs, rows, true);
        ref->store_kv_heads(ref, kd, vd, slots, S, D, nk, k, v, rows);
        /* the norm weights as device copies: the backend keeps its copy of a host array by its
         * address, and this test frees its arrays, whose addresses a later case may get again */
        float *dwq = dev(wq, (size_t)D * 4), *dwk = dev(wk, (size_t)D * 4);
        cu->qk_norm_rope_heads(cu, nq ? dq : NULL, dwq, nq, dk, dwk, nk, D, 1e-5f, dcs, D, rows, true, dkd, dvd, slots,
                               S, dv);
        char what[96];
        snprintf(what, sizeof what, "qk_norm_rope_heads D=%lld nq=%lld rows=%lld", (long long)D, (long long)nq,
                 (long long)rows);
        if (nq) check(what, q, dq, qn * 4);
        check(what, k, dk, kn * 4);
        check(what, kd, dkd, pn * 4);
        check(what, vd, dvd, pn * 4);
        cu->free(cu, dq, 0), cu->free(cu, dk, 0), cu->free(cu, dv, 0), cu->free(cu, dkd, 0), cu->free(cu, dvd, 0);
        cu->free(cu, dcs, 0), cu->free(cu, dwq, 0), cu->free(cu, dwk, 0);
        free(q), free(k), free(v), free(wq), free(wk), free(kd), free(vd), free(cs);
    }
}

/* The quantization a residual step leaves for the next product (q8 in
 * src/backend/cuda/cuda_backend.c) outlives writes elsewhere (copies, a
 * zero, the RoPE table and rotation, qk_norm_rope without a store, the
 * assistant's K/V store: the product after them must give ref's bits) and
 * dies with a write into the values it describes, by each of those ops
 * (the product must read the new values: a quantization kept too long
 * gives the old ones' bits). Then a set of 10 products (two launches). */
static void test_q8_tag(void) {
    static const wspec q4 = {"Q4_K", MU_TYPE_Q4_K, false, false}, q6 = {"Q6_K", MU_TYPE_Q6_K, false, false};
    const int64_t n = 512, rows = 3, N = n * rows, D = 64, H = n / D, S = 8;
    mu_weight w[2] = {make_weight(&q4, n, 40), make_weight(&q6, n, 24)};
    const mu_weight *wp[2] = {&w[0], &w[1]};
    float *wo = rnd_vec((size_t)n, 2.0f), *wh = rnd_vec((size_t)n, 2.0f), *wk = rnd_vec((size_t)D, 1.5f);
    double inv_freq[32];
    for (int i = 0; i < 32; i++) inv_freq[i] = 1.0 / pow(10000.0, 2.0 * i / (double)D);
    const int64_t pos[3] = {5, 17, 300}, slots[3] = {2, 5, 7};
    float *cs = mu_xmalloc((size_t)(rows * D) * 4);
    ref->rope_table(ref, inv_freq, D / 2, pos, rows, cs, false);
    for (int mode = 0; mode < 14; mode++) {
        /* 0: none; 1-7: a write elsewhere; 8-13: into h by copy, copy2d, copy2d_many, zero, rope, qk_norm_rope */
        float *x = rnd_vec((size_t)N, 3.0f), *o = rnd_vec((size_t)N, 5.0f), *h = mu_xmalloc((size_t)N * 4);
        float *other = rnd_vec((size_t)N, 1.0f), *src = rnd_vec((size_t)N, 2.0f);
        float *kd = rnd_vec((size_t)(S * D), 1.0f), *vd = rnd_vec((size_t)(S * D), 1.0f);
        float *dx = dev(x, (size_t)N * 4), *dox = dev(o, (size_t)N * 4), *dh = cu->alloc(cu, (size_t)N * 4);
        float *dother = dev(other, (size_t)N * 4), *dsrc = dev(src, (size_t)N * 4), *dcs = dev(cs, (size_t)(rows * D) * 4);
        float *dkd = dev(kd, (size_t)(S * D) * 4), *dvd = dev(vd, (size_t)(S * D) * 4);
        float *y0 = mu_xmalloc((size_t)(rows * 40) * 4), *y1 = mu_xmalloc((size_t)(rows * 24) * 4);
        float *dy0 = cu->alloc(cu, (size_t)(rows * 40) * 4), *dy1 = cu->alloc(cu, (size_t)(rows * 24) * 4);
        ref->rmsnorm(ref, o, wo, 1e-8f, o, n, rows);
        ref->add(ref, x, o, N);
        ref->rmsnorm(ref, x, wh, 1e-6f, h, n, rows);
        cu->residual(cu, dx, dox, wo, 1e-8f, dh, wh, 1e-6f, n, rows); /* leaves h's quantization */
        const bool into = mode >= 8;
        float *hw = into ? h : other, *dw = into ? dh : dother; /* the written buffer, host and device */
        switch (mode) {
        case 1: case 8:
            ref->copy(ref, hw + 100, src, 700 * 4), cu->copy(cu, dw + 100, dsrc, 700 * 4);
            break;
        case 2: case 9:
            ref->copy2d(ref, hw + 513, 64, src, 40, 24, 5), cu->copy2d(cu, dw + 513, 64, dsrc, 40, 24, 5);
            break;
        case 3: case 10: {
            const mu_copy2d hc[2] = {{hw + 7, 256, src, 16, 12, 3}, {hw + 1400, 8, src + 50, 8, 4, 1}};
            const mu_copy2d dc[2] = {{dw + 7, 256, dsrc, 16, 12, 3}, {dw + 1400, 8, dsrc + 50, 8, 4, 1}};
            ref->copy2d_many(ref, 2, hc), cu->copy2d_many(cu, 2, dc);
            break;
        }
        case 4: case 11:
            ref->zero(ref, hw + 1000, 12), cu->zero(cu, dw + 1000, 12);
            break;
        case 5: case 12:
            ref->rope(ref, hw, H, D, D, cs, rows, true), cu->rope(cu, dw, H, D, D, dcs, rows, true);
            break;
        case 6: case 13: /* k = the written rows (H heads), no q, no store */
            ref->rmsnorm(ref, hw, wk, 1e-6f, hw, D, rows * H);
            ref->rope(ref, hw, H, D, D, cs, rows, true);
            cu->qk_norm_rope(cu, NULL, NULL, 0, dw, wk, H, D, 1e-6f, dcs, D, rows, NULL, NULL, true);
            break;
        case 7: /* the assistant's store (elsewhere only: its planes are never a product's input) and the table */
            ref->store_kv_heads(ref, kd, vd, slots, S, D, 1, src, src + N / 2, rows);
            cu->store_kv_heads(cu, dkd, dvd, slots, S, D, 1, dsrc, dsrc + N / 2, rows);
            cu->rope_table(cu, inv_freq, D / 2, pos, rows, dother, false);
            break;
        }
        ref->matmul(ref, &w[0], h, y0, rows);
        ref->matmul(ref, &w[1], h, y1, rows);
        cu->matmul_multi(cu, 2, wp, dh, (float *[]){dy0, dy1}, rows);
        char what[96];
        snprintf(what, sizeof what, "residual, %s write %d, matmul_multi", into ? "a" : "no", mode);
        check(what, y0, dy0, (size_t)(rows * 40) * 4);
        check(what, y1, dy1, (size_t)(rows * 24) * 4);
        if (mode >= 1 && mode <= 6) check("the write elsewhere", other, dother, (size_t)N * 4);
        if (mode == 7) check("store_kv_heads K", kd, dkd, (size_t)(S * D) * 4);
        cu->free(cu, dx, 0), cu->free(cu, dox, 0), cu->free(cu, dh, 0), cu->free(cu, dother, 0), cu->free(cu, dsrc, 0);
        cu->free(cu, dcs, 0), cu->free(cu, dkd, 0), cu->free(cu, dvd, 0), cu->free(cu, dy0, 0), cu->free(cu, dy1, 0);
        free(x), free(o), free(h), free(other), free(src), free(kd), free(vd), free(y0), free(y1);
    }
    /* 10 products of one input: 8 in one launch, 2 reading its quantization */
    mu_weight w10[10];
    const mu_weight *wp10[10];
    float *x = rnd_vec((size_t)N, 2.0f), *dx = dev(x, (size_t)N * 4), *y[10], *dy[10];
    for (int i = 0; i < 10; i++) {
        w10[i] = make_weight(i % 2 ? &q6 : &q4, n, 16 + 8 * i);
        wp10[i] = &w10[i];
        y[i] = mu_xmalloc((size_t)(rows * w10[i].n_out) * 4);
        dy[i] = cu->alloc(cu, (size_t)(rows * w10[i].n_out) * 4);
        ref->matmul(ref, &w10[i], x, y[i], rows);
    }
    cu->matmul_multi(cu, 10, wp10, dx, dy, rows);
    for (int i = 0; i < 10; i++) {
        check("matmul_multi of 10", y[i], dy[i], (size_t)(rows * w10[i].n_out) * 4);
        cu->free(cu, dy[i], 0), free(y[i]);
    }
    cu->free(cu, dx, 0), free(x), free(cs), free(wo), free(wh), free(wk);
}

/* ------------------------------------------------------- benchmarks */

static void *dev_raw(const void *host, size_t bytes) {
    char msg[MUCU_ERR_LEN];
    void *d = NULL;
    if (!mucu_malloc(&d, bytes, msg) || (host && !mucu_memcpy(d, host, bytes, "bench upload", msg))) {
        fprintf(stderr, "bench: %s\n", msg);
        exit(1);
    }
    return d;
}

/* Random weight bytes of a full-model shape in the device layout (split
 * Q6_K), block scales d/dmin kept in a sane range. */
static mucu_weight bench_weight(uint32_t type, int64_t n_in, int64_t n_out) {
    const int64_t nb = n_in / 256, n = nb * n_out;
    const size_t bb = type == MU_TYPE_Q4_K ? 144 : (type == MU_TYPE_Q5_K ? 176 : 210);
    uint8_t *h = mu_xmalloc((size_t)n * bb);
    for (size_t i = 0; i < (size_t)n * bb; i++) h[i] = (uint8_t)next_u32();
    const uint16_t dh = mu_f32_to_f16(0.0123f), mh = mu_f32_to_f16(0.0071f);
    for (int64_t i = 0; i < n; i++) {
        if (type == MU_TYPE_Q6_K) {
            memcpy(h + (size_t)n * 208 + 2 * (size_t)i, &dh, 2); /* split layout: d after codes and scales */
        } else {
            memcpy(h + (size_t)i * bb, &dh, 2);
            memcpy(h + (size_t)i * bb + 2, &mh, 2);
        }
    }
    mucu_weight w = {.type = type, .scale = 1.0f, .n_in = n_in, .n_out = n_out, .row_bytes = (uint64_t)(nb * (int64_t)bb),
                     .q6_split = type == MU_TYPE_Q6_K};
    w.data = dev_raw(h, (size_t)n * bb);
    free(h);
    return w;
}

/* Median device time (ms) of one mucu_matmul on prequantized activations. */
static double time_matmul(const mucu_weight *w, const float *dx, float *dy, int64_t rows, void *q8, float *split,
                          int reps) {
    char msg[MUCU_ERR_LEN];
    double t[64];
    if (reps > 64) reps = 64;
    for (int i = -2; i < reps; i++) {
        double ms = 0;
        if (!mucu_timer_begin(msg) || !mucu_matmul(w, dx, dy, rows, q8, 1, split, msg) || !mucu_timer_end(&ms, msg)) {
            fprintf(stderr, "bench: %s\n", msg);
            exit(1);
        }
        if (i >= 0) t[i] = ms;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    return t[reps / 2];
}

/* --bench-gemm: k_gemm_kq2 ("kq2", MUSER_CUDA_GEMM_WG=0) against the
 * default ("new": k_gemm_wg where it takes the call) on the full model's
 * shapes (hidden 6656, q 4096, k/v 256, ffn 19968), 32 (batched decode;
 * k_gemm_kq2 with 64-row tiles forced), 512 and 2048 rows; the two
 * outputs are also compared bit for bit. */
static int bench_gemm(int reps) {
    char msg[MUCU_ERR_LEN];
    static const struct {
        const char *name;
        int64_t n_in, n_out;
        int layer_count; /* times per layer */
    } shapes[] = {{"q", 6656, 4096, 1}, {"k/v", 6656, 256, 2}, {"o", 4096, 6656, 1},
                  {"gate/up", 6656, 19968, 2}, {"down", 19968, 6656, 1}};
    static const struct {
        const char *name;
        uint32_t type;
    } types[] = {{"Q4_K", MU_TYPE_Q4_K}, {"Q5_K", MU_TYPE_Q5_K}, {"Q6_K", MU_TYPE_Q6_K}};
    const int64_t rowss[] = {32, 512, 2048};
    const int saved = mucu_gemm_kernel_get();
    int bad = 0;
    printf("gemm benchmark: median of %d (after 2 warm-up), device time per call (cudaEvents), activations "
           "prequantized\n",
           reps);
    for (int ri = 0; ri < 3; ri++) {
        const int64_t rows = rowss[ri];
        const int knew = rows <= 64 ? 3 : 1; /* the default takes k_gemm_kq2 above 64 rows: force it below */
        double layer[2] = {0, 0};
        for (size_t ti = 0; ti < 3; ti++)
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
                if (ti > 0 && si != 0 && si != 4) continue; /* Q5_K/Q6_K: q and down only */
                const int64_t n_in = shapes[si].n_in, n_out = shapes[si].n_out;
                mucu_weight w = bench_weight(types[ti].type, n_in, n_out);
                float *x = rnd_vec((size_t)(rows * n_in), 2.0f);
                float *dx = dev_raw(x, (size_t)(rows * n_in) * 4);
                float *dy[2] = {dev_raw(NULL, (size_t)(rows * n_out) * 4), dev_raw(NULL, (size_t)(rows * n_out) * 4)};
                void *q8 = dev_raw(NULL, mucu_q8k_bytes(n_in, rows) + 1);
                mucu_gemm_kernel = knew;
                const size_t sb = mucu_matmul_split_bytes(&w, rows);
                float *dsp = sb ? dev_raw(NULL, sb) : NULL;
                if (!mucu_matmul(&w, dx, dy[1], rows, q8, 0, dsp, msg)) { /* quantizes x into q8 */
                    fprintf(stderr, "bench: %s\n", msg);
                    return 1;
                }
                double ms[2];
                for (int k = 0; k < 2; k++) {
                    mucu_gemm_kernel = knew;
                    mucu_set_gemm_wg(k); /* old: k_gemm_kq2; new: the default (k_gemm_wg where it takes) */
                    ms[k] = time_matmul(&w, dx, dy[k], rows, q8, dsp, reps);
                }
                mucu_set_gemm_wg(-1);
                const size_t yb = (size_t)(rows * n_out) * 4;
                uint8_t *h0 = mu_xmalloc(yb), *h1 = mu_xmalloc(yb);
                if (!mucu_memcpy(h0, dy[0], yb, "bench download", msg) || !mucu_memcpy(h1, dy[1], yb, "bench download", msg)) {
                    fprintf(stderr, "bench: %s\n", msg);
                    return 1;
                }
                const bool same = !memcmp(h0, h1, yb);
                bad += !same;
                const double ops = 2.0 * (double)rows * (double)n_in * (double)n_out;
                const double wbytes = (double)w.row_bytes * (double)n_out;
                printf("gemm %-4s %-7s %5lld->%-5lld rows %4lld: kq2 %8.3f ms %6.1f TOPS | new %8.3f ms %6.1f TOPS "
                       "%6.0f GB/s weights | %.2fx %s\n",
                       types[ti].name, shapes[si].name, (long long)n_in, (long long)n_out, (long long)rows, ms[0],
                       ops / ms[0] * 1e-9, ms[1], ops / ms[1] * 1e-9, wbytes / ms[1] * 1e-6, ms[0] / ms[1],
                       same ? "identical" : "OUTPUTS DIFFER");
                if (ti == 0)
                    for (int k = 0; k < 2; k++) layer[k] += ms[k] * shapes[si].layer_count;
                free(h0), free(h1), free(x);
                mucu_free(dx, msg), mucu_free(dy[0], msg), mucu_free(dy[1], msg), mucu_free(q8, msg), mucu_free(dsp, msg);
                mucu_free((void *)w.data, msg);
            }
        printf("gemm layer (all Q4_K: q k v o gate up down), rows %lld: kq2 %.3f ms, new %.3f ms; 52 layers' "
               "products alone: kq2 %.0f tok/s, new %.0f tok/s\n",
               (long long)rows, layer[0], layer[1], (double)rows / (52.0 * layer[0] * 1e-3),
               (double)rows / (52.0 * layer[1] * 1e-3));
    }
    mucu_gemm_kernel = saved;
    printf("gemm benchmark: %s\n", bad ? "OUTPUTS DIFFER between the kernels" : "kq2 and new outputs identical");
    return bad ? 1 : 0;
}

/* A device plane of n random f16 values (|v| < 1). */
static uint16_t *rnd_plane(size_t n) {
    uint16_t *h = mu_xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = mu_f32_to_f16(rnd(1.0f));
    uint16_t *d = dev_raw(h, n * 2);
    free(h);
    return d;
}

/* Median device time in ms of mucu_attention over reps calls after 2
 * warm-up calls (cudaEvents); false (message printed) on a failed call. */
static bool time_attention(const mucu_attn_row *dd, int64_t rows, int64_t H, int64_t Hkv, int64_t D, const float *dq,
                           float *dout, float *part, int64_t nbmax, int reps, double *median_ms) {
    char msg[MUCU_ERR_LEN];
    double t[64];
    for (int i = -2; i < reps; i++) {
        double ms = 0;
        if (!mucu_timer_begin(msg) ||
            !mucu_attention(dd, rows, H, Hkv, D, 1.0f / sqrtf((float)D), dq, dout, part, nbmax, NULL, NULL, false, msg) ||
            !mucu_timer_end(&ms, msg)) {
            fprintf(stderr, "bench: %s\n", msg);
            return false;
        }
        if (i >= 0) t[i] = ms;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    *median_ms = t[reps / 2];
    return true;
}

/* --bench-attn: mucu_attention, k_attn_blocks (old) against
 * k_attn_prefill (new), for one prefill chunk of `rows` rows at the end of
 * a context of ctx keys (causal, first 0), 32 query heads over 2 KV heads,
 * head_dim 128 (the full model's shape); outputs compared bit for bit. */
static int bench_attn(int reps) {
    char msg[MUCU_ERR_LEN];
    const int64_t H = 32, Hkv = 2, D = 128;
    const int64_t ctxs[] = {2048, 8192}, rowss[] = {512, 2048};
    const int saved = mucu_attn_kernel_get();
    int bad = 0;
    if (reps > 64) reps = 64;
    printf("attention benchmark: median of %d (after 2 warm-up), device time per call (cudaEvents)\n", reps);
    for (int ci = 0; ci < 2; ci++)
        for (int ri = 0; ri < 2; ri++) {
            const int64_t ctx = ctxs[ci], rows = rowss[ri], cap = ctx;
            const size_t plane = (size_t)(Hkv * cap * D);
            uint16_t *dk = rnd_plane(plane), *dv = rnd_plane(plane);
            mucu_attn_row *hd = mu_xmalloc((size_t)rows * sizeof *hd);
            double keys = 0;
            for (int64_t r = 0; r < rows; r++) {
                hd[r] = (mucu_attn_row){.k = dk, .v = dv, .cap = cap, .first = 0, .pos = ctx - rows + r, .tbase = INT64_MAX};
                keys += (double)(ctx - rows + r + 1);
            }
            mucu_attn_row *dd = dev_raw(hd, (size_t)rows * sizeof *hd);
            float *hq = rnd_vec((size_t)(rows * H * D), 1.0f);
            const size_t ob = (size_t)(rows * H * D) * 4;
            float *dq = dev_raw(hq, ob), *dout[2] = {dev_raw(NULL, ob), dev_raw(NULL, ob)};
            const int64_t nbmax = (ctx + 255) / 256;
            float *part = dev_raw(NULL, mucu_attn_part_bytes(rows, H, D, nbmax) + 16);
            double med[2];
            for (int k = 0; k < 2; k++) {
                mucu_attn_kernel = k ? 2 : 0;
                if (!time_attention(dd, rows, H, Hkv, D, dq, dout[k], part, nbmax, reps, &med[k])) return 1;
            }
            uint8_t *o0 = mu_xmalloc(ob), *o1 = mu_xmalloc(ob);
            if (!mucu_memcpy(o0, dout[0], ob, "bench download", msg) || !mucu_memcpy(o1, dout[1], ob, "bench download", msg)) {
                fprintf(stderr, "bench: %s\n", msg);
                return 1;
            }
            const bool same = !memcmp(o0, o1, ob);
            bad += !same;
            const double flops = 4.0 * keys * (double)H * (double)D; /* q.k and e.v, one fma = 2 flops */
            printf("attn ctx %5lld rows %4lld (32/2 heads, D 128): old %8.3f ms %6.2f TFLOP/s | new %8.3f ms %6.2f "
                   "TFLOP/s | %.2fx %s\n",
                   (long long)ctx, (long long)rows, med[0], flops / med[0] * 1e-9, med[1], flops / med[1] * 1e-9,
                   med[0] / med[1], same ? "identical" : "OUTPUTS DIFFER");
            mucu_free(dk, msg), mucu_free(dv, msg), mucu_free(dd, msg), mucu_free(dq, msg);
            mucu_free(dout[0], msg), mucu_free(dout[1], msg), mucu_free(part, msg);
            free(hd), free(hq), free(o0), free(o1);
        }
    mucu_attn_kernel = saved;
    printf("attention benchmark: %s\n", bad ? "OUTPUTS DIFFER between the kernels" : "old and new outputs identical");
    return bad ? 1 : 0;
}

/* --bench-res: mucu_residual (with h and its quantization) alone at
 * glimmer-tiny's and the full model's rows (512 and 6,656 values; 1 and 8
 * rows): the default (k_residual_w), then k_residual (MUSER_CUDA_RES_W=0)
 * with at most 32, 16 and 8 warps a CTA: us per call (median of reps after
 * 2 warm-up calls, cudaEvents; x grows call by call, which the timing does
 * not see), and one call from the same inputs under each setting compared
 * bit for bit with the default's x and h. */
static int bench_res(int reps) {
    char msg[MUCU_ERR_LEN];
    const int64_t ns[2] = {512, 6656}, rowss[2] = {1, 8};
    const int warps[4] = {32, 32, 16, 8}, wmode[4] = {1, 0, 0, 0};
    const int saved = mucu_res_warps, saved_w = mucu_res_w;
    int bad = 0;
    if (reps < 1 || reps > 64) reps = 21;
    printf("%-22s %10s %10s %10s %10s\n", "residual step", "default", "32 warps", "16", "8");
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            const int64_t n = ns[a], rows = rowss[b], N = n * rows;
            const size_t bytes = (size_t)N * 4;
            float *x = rnd_vec((size_t)N, 3.0f), *o = rnd_vec((size_t)N, 5.0f);
            float *wo = rnd_vec((size_t)n, 2.0f), *wh = rnd_vec((size_t)n, 2.0f);
            float *gx[4], *gh[4];
            float *dx = dev_raw(NULL, bytes), *dox = dev_raw(NULL, bytes), *dh = dev_raw(NULL, bytes);
            float *dwo = dev_raw(wo, (size_t)n * 4), *dwh = dev_raw(wh, (size_t)n * 4);
            void *q8 = dev_raw(NULL, mucu_q8k_bytes(n, rows) + 1);
            double med[4];
            for (int v = 0; v < 4; v++) {
                mucu_res_warps = warps[v], mucu_res_w = wmode[v];
                gx[v] = mu_xmalloc(bytes), gh[v] = mu_xmalloc(bytes);
                if (!mucu_memcpy(dx, x, bytes, "bench upload", msg) || !mucu_memcpy(dox, o, bytes, "bench upload", msg) ||
                    !mucu_residual(dx, dox, dwo, 1e-8f, dh, dwh, 1e-6f, n, rows, q8, NULL, 0, msg)) {
                    fprintf(stderr, "bench: %s\n", msg);
                    return 1;
                }
                cu->download(cu, gx[v], dx, bytes);
                cu->download(cu, gh[v], dh, bytes);
                if (v && (memcmp(gx[v], gx[0], bytes) || memcmp(gh[v], gh[0], bytes))) {
                    fprintf(stderr, "MISMATCH residual n=%lld rows=%lld: setting %d against the default\n",
                            (long long)n, (long long)rows, v);
                    bad = 1;
                }
                double t[64];
                for (int i = -2; i < reps; i++) {
                    double ms = 0;
                    if (!mucu_timer_begin(msg) || !mucu_residual(dx, dox, dwo, 1e-8f, dh, dwh, 1e-6f, n, rows, q8, NULL, 0, msg) ||
                        !mucu_timer_end(&ms, msg)) {
                        fprintf(stderr, "bench: %s\n", msg);
                        return 1;
                    }
                    if (i >= 0) t[i] = ms;
                }
                qsort(t, (size_t)reps, sizeof *t, cmp_d);
                med[v] = t[reps / 2] * 1e3;
            }
            char what[64];
            snprintf(what, sizeof what, "n=%lld rows=%lld", (long long)n, (long long)rows);
            printf("%-22s %10.2f %10.2f %10.2f %10.2f\n", what, med[0], med[1], med[2], med[3]);
            for (int v = 0; v < 4; v++) free(gx[v]), free(gh[v]);
            mucu_free(dx, msg), mucu_free(dox, msg), mucu_free(dh, msg), mucu_free(dwo, msg), mucu_free(dwh, msg);
            mucu_free(q8, msg);
            free(x), free(o), free(wo), free(wh);
        }
    mucu_res_warps = saved, mucu_res_w = saved_w;
    return bad;
}

/* --bench-chain [layers]: a decode layer's four weight reads (bytes of the
 * full q4_k_xl model: q/k/v/gate 33.0 MB, o 15.3, gate+up 150, down 75)
 * over `layers` layers, as plain reads one after another in six ways
 * (cuda_kernels.cu "a layer's reads in a row"): what separate kernels lose
 * between reads against one persistent kernel, the products' arithmetic
 * left out. */
static int bench_chain(int layers) {
    static const size_t layer[4] = {33027072, 15335424, 149520384, 74760192};
    static const char *names[6] = {"one kernel, all reads", "a kernel a read, graph", "a kernel a read, programmatic",
                                   "the same, first loads before the wait", "persistent, grid barriers",
                                   "persistent, next loads before the barrier"};
    if (layers < 1 || layers > 64) layers = 16;
    size_t *b = mu_xcalloc((size_t)layers * 4, sizeof *b), total = 0;
    for (int i = 0; i < layers * 4; i++) total += b[i] = layer[i % 4];
    double ms[6] = {0};
    int bad[6] = {0}, grid = 0;
    char msg[MUCU_ERR_LEN];
    if (!mucu_bench_chain(b, layers * 4, 9, ms, bad, &grid, msg)) {
        fprintf(stderr, "bench-chain: %s\n", msg);
        free(b);
        return 1;
    }
    printf("%d layers, %.2f GB, %d CTAs of 512 threads a read; median of 9\n", layers, total / 1e9, grid);
    int fails = 0;
    for (int v = 0; v < 6; v++) {
        printf("%d %-42s %9.3f ms %8.2f us/layer %7.0f GB/s%s\n", v, names[v], ms[v], 1e3 * ms[v] / layers,
               total / (ms[v] * 1e-3) / 1e9, bad[v] ? "  XOR MISMATCH" : "");
        fails += bad[v];
    }
    free(b);
    return fails ? 1 : 0;
}

/* --bench-attn-dec: mucu_attention (the per-block pass and the merge) for
 * decode shapes of the full model (32 query heads over 2 KV heads, D 128):
 * 1 row under a 2,048-key window (a sliding layer), 1 row over 2k, 16k
 * and 64k keys of a plane (a NoPE layer at depth), 4 rows over 16k (4
 * sequences; here one plane) and 16 consecutive rows (a verification).
 * Columns: the kernels before k_attn_dec (MUSER_CUDA_ATTN=4), the default,
 * k_attn_dfl for every call that writes partials, at any row count (fl), the default without
 * it (cl: k_attn_dcl from 64 blocks), k_attn_dec alone (dec: neither), and
 * k_attn_dec with 16 and 2 heads a CTA. Outputs compared bit for bit. */
static int bench_attn_dec(int reps) {
    char msg[MUCU_ERR_LEN];
    const int64_t H = 32, Hkv = 2, D = 128, cap = 65536;
    const size_t plane = (size_t)(Hkv * cap * D);
    uint16_t *dk = rnd_plane(plane), *dv = rnd_plane(plane);
    const struct { const char *name; int64_t rows, ctx, window; } cs[] = {
        {"sliding, 1 row, window 2048", 1, 16384, 2048}, {"full, 1 row, 2k keys", 1, 2048, 0},
        {"full, 1 row, 16k keys", 1, 16384, 0},          {"full, 1 row, 64k keys", 1, 65536, 0},
        {"full, 4 rows, 16k keys", 4, 16384, 0},         {"full, 16 rows, 16k keys", 16, 16384, 0},
        {"sliding, 16 rows, window 2048", 16, 16384, 2048}};
    enum { NV = 7 };
    const int kern[NV] = {4, 1, 1, 1, 1, 3, 3}, hgs[NV] = {0, 0, 0, 0, 0, 16, 2};
    const int fls[NV] = {0, -1, 1, 0, 0, 0, 0}, cls[NV] = {0, -1, -1, -1, 0, 0, 0};
    const int saved = mucu_attn_kernel_get(), saved_hg = mucu_attn_dec_hg, saved_fl = mucu_attn_dec_fl,
              saved_cl = mucu_attn_dec_cl;
    int bad = 0;
    if (reps > 64) reps = 64;
    printf("decode attention benchmark: median of %d (after 2 warm-up), us per call (cudaEvents); 32/2 heads, D 128\n",
           reps);
    printf("%-32s %10s %10s %8s %8s %8s %8s %8s  %s\n", "case", "before", "default", "fl", "cl", "dec", "hg16",
           "hg2", "");
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int64_t rows = cs[ci].rows;
        mucu_attn_row hd[16];
        int64_t nbmax = 0;
        for (int64_t r = 0; r < rows; r++) {
            const int64_t pos = cs[ci].ctx - rows + r, first = cs[ci].window ? pos - cs[ci].window + 1 : 0;
            hd[r] = (mucu_attn_row){.k = dk, .v = dv, .cap = cap, .first = first < 0 ? 0 : first, .pos = pos, .tbase = INT64_MAX};
            const int64_t nb = (pos - hd[r].first) / 256 + 1;
            nbmax = nb > nbmax ? nb : nbmax;
        }
        mucu_attn_row *dd = dev_raw(hd, (size_t)rows * sizeof *hd);
        float *hq = rnd_vec((size_t)(rows * H * D), 1.0f);
        const size_t ob = (size_t)(rows * H * D) * 4;
        float *dq = dev_raw(hq, ob), *dout = dev_raw(NULL, ob);
        float *part = dev_raw(NULL, mucu_attn_part_bytes(rows, H, D, nbmax) + 16);
        uint8_t *o0 = mu_xmalloc(ob), *o1 = mu_xmalloc(ob);
        double med[NV];
        bool same = true;
        for (int v = 0; v < NV; v++) {
            mucu_attn_kernel = kern[v], mucu_attn_dec_hg = hgs[v], mucu_attn_dec_fl = fls[v], mucu_attn_dec_cl = cls[v];
            mucu_attn_dec_fl_rows = fls[v] == 1 ? 65535 : -1;
            if (!time_attention(dd, rows, H, Hkv, D, dq, dout, part, nbmax, reps, &med[v])) return 1;
            med[v] *= 1e3;
            if (!mucu_memcpy(v ? o1 : o0, dout, ob, "bench download", msg)) {
                fprintf(stderr, "bench: %s\n", msg);
                return 1;
            }
            if (v) same = same && !memcmp(o0, o1, ob);
        }
        bad += !same;
        /* the default's two passes alone (the partials of the last call stay in part) */
        double pass_us[2] = {0, 0};
        mucu_attn_kernel = 1, mucu_attn_dec_hg = 0, mucu_attn_dec_fl = -1, mucu_attn_dec_cl = -1;
        for (int ps = 1; ps <= 2 && nbmax > 1; ps++) {
            mucu_attn_bench_pass = ps;
            if (!time_attention(dd, rows, H, Hkv, D, dq, dout, part, nbmax, reps, &pass_us[ps - 1])) return 1;
            pass_us[ps - 1] *= 1e3;
        }
        mucu_attn_bench_pass = 0;
        printf("%-32s %10.2f %10.2f %8.2f %8.2f %8.2f %8.2f %8.2f  %.2fx %s (default: blocks %.2f, merge %.2f)\n",
               cs[ci].name, med[0], med[1], med[2], med[3], med[4], med[5], med[6], med[0] / med[1],
               same ? "identical" : "OUTPUTS DIFFER", pass_us[0], pass_us[1]);
        mucu_free(dd, msg), mucu_free(dq, msg), mucu_free(dout, msg), mucu_free(part, msg);
        free(hq), free(o0), free(o1);
    }
    mucu_free(dk, msg), mucu_free(dv, msg);
    mucu_attn_kernel = saved, mucu_attn_dec_hg = saved_hg, mucu_attn_dec_fl = saved_fl, mucu_attn_dec_cl = saved_cl;
    mucu_attn_dec_fl_rows = -1;
    printf("decode attention benchmark: %s\n", bad ? "OUTPUTS DIFFER between the kernels" : "all outputs identical");
    return bad ? 1 : 0;
}

/* The summary line; both backends freed; the exit status. */
static int finish(const char *what) {
    printf("%s: %d checks, %d mismatches\n", what, n_checks, n_fail);
    cu->destroy(cu);
    ref->destroy(ref);
    return n_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    mu_error err;
    if (argc == 3 && !strcmp(argv[1], "--membw")) { /* device read bandwidth over argv[2] GiB */
        char msg[MUCU_ERR_LEN];
        double gbs = 0;
        if (!mucu_read_bandwidth((size_t)atoll(argv[2]) << 30, 5, &gbs, msg)) {
            fprintf(stderr, "membw: %s\n", msg);
            return 1;
        }
        printf("device read bandwidth: %.1f GB/s (best of 5 read-only passes over %s GiB)\n", gbs, argv[2]);
        return 0;
    }
    ref = mu_backend_ref_create(1);
    cu = mu_backend_cuda_create(1, &err);
    if (!cu) {
        fprintf(stderr, "test_cuda_backend: %s\n", err.msg);
        return 1;
    }
    /* the benchmarks after the backend exists: its stream is the kernels' (cuda_kernels.cu) */
    if (argc >= 2 && !strcmp(argv[1], "--bench-gemm")) return bench_gemm(argc >= 3 ? atoi(argv[2]) : 9);
    if (argc >= 2 && !strcmp(argv[1], "--bench-attn")) return bench_attn(argc >= 3 ? atoi(argv[2]) : 9);
    if (argc >= 2 && !strcmp(argv[1], "--bench-attn-dec")) return bench_attn_dec(argc >= 3 ? atoi(argv[2]) : 9);
    if (argc >= 2 && !strcmp(argv[1], "--bench-chain")) return bench_chain(argc >= 3 ? atoi(argv[2]) : 16);
    if (argc >= 2 && !strcmp(argv[1], "--bench-res")) return bench_res(argc >= 3 ? atoi(argv[2]) : 21);
    if (argc == 2 && !strcmp(argv[1], "--bench-mmv")) {
        bench_mmv();
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--attn")) { /* the decode attention tests alone */
        test_kv_attention(64);
        test_kv_attention(128);
        test_kv_attention(256);
        test_kv_attention(80);
        test_tree_attention();
        test_attn_decode();
        return finish("test_cuda_backend --attn");
    }
    if (argc == 2 && !strcmp(argv[1], "--gemm")) { /* the many-row products alone */
        test_gemm_tiles();
        return finish("test_cuda_backend --gemm");
    }
    if (argc == 2 && !strcmp(argv[1], "--mmv")) { /* the weight-streaming products alone */
        test_matmul_large();
        test_matmul_multi();
        return finish("test_cuda_backend --mmv");
    }
    if (argc == 2 && !strcmp(argv[1], "--new")) { /* a short run: the most recent kernels' tests (tree registers, fused launches, stores, GEMM tiles, prefill attention) */
        test_tree_reg();
        test_tree_reg_attention();
        test_fused();
        test_store_heads_and_memory();
        test_q8_tag();
        test_qk_norm_rope_heads();
        test_dense_attention();
        test_elementwise();
        test_gemm_tiles();
        test_attn_prefill();
        return finish("test_cuda_backend --new");
    }
    test_matmul_embed();
    test_matmul_fp4();
    test_matmul_large();
    const int mmt_saved = mucu_mmt_min_rows_get();
    /* k_mmv3_set: 1, 2, 4 warps per output; k_mmt (k_mmq off); then the default; then k_mmq's shapes */
    for (int k = 0; k < 5 + N_MMQ_SHAPES; k++) {
        mucu_set_mmv_variant(k < 3 ? 7 : 3);
        mucu_set_mmv3(k < 3 ? 1 << k : 0, 0);
        mucu_mmt_min_rows = k == 3 ? 1 : k >= 4 ? mmt_saved : 0;
        mucu_mmq_variant = k == 3 ? 0 : k >= 5 ? MMQ_SHAPES[k - 5] : -1;
        test_matmul_multi();
    }
    mucu_mmq_variant = -1;
    test_gemm_tiles();
    test_rmsnorm();
    test_rope();
    test_kv_attention(64);
    test_kv_store_two();
    test_kv_attention(128);
    test_kv_attention(256);
    test_kv_attention(80);
    test_attn_prefill();
    test_tree_attention();
    test_attn_decode();
    test_elementwise();
    test_fused();
    test_dense_attention();
    test_store_heads_and_memory();
    test_q8_tag();
    test_qk_norm_rope_heads();
    test_first_nonfinite();
    test_chain_pick();
    test_pick_rows();
    test_tree_reg();
    test_tree_reg_attention();
    test_copy2d_many();
    return finish("test_cuda_backend");
}
