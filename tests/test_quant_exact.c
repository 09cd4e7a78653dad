/* Deterministic quantizer rules, byte for byte against re-implementations
 * written here: Q8_0, Q4_0, native NVFP4 (ModelOpt recipe), ggml NVFP4
 * (ggml's UE4M3 rounding and nearest-code search), F32 pass-through. */
#include "quant/quant.h"
#include "testutil.h"
#include <math.h>
#include <stdlib.h>

enum { N = 4096 };

static void put_f16(uint8_t *p, float v) {
    uint16_t h = mu_f32_to_f16(v);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

static void gen(float *x, int n, uint64_t *rng) {
    for (int i = 0; i < n; i++) {
        float scale = (i / 64) % 3 == 0 ? 0.01f : (i / 64) % 3 == 1 ? 1.0f : 30.0f;
        x[i] = tu_rng_normal(rng) * scale;
    }
    for (int i = 0; i < 32; i++) x[64 + i] = 0.0f; /* an all-zero block */
}

static void check_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n) {
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (got[i] != want[i]) first = i;
    CHECK_MSG(first == n, "%s: first differing byte %zu: 0x%02x vs 0x%02x", what, first,
              first < n ? got[first] : 0, first < n ? want[first] : 0);
}

static void test_q8_0(const float *x, uint8_t *got, uint8_t *want) {
    mu_quantize_row(MU_TYPE_Q8_0, x, got, N);
    for (int b = 0; b < N / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(want + 34 * b, d);
        for (int i = 0; i < 32; i++) want[34 * b + 2 + i] = (uint8_t)(int8_t)roundf(xb[i] * id);
    }
    check_bytes("Q8_0", got, want, (size_t)N / 32 * 34);
}

static void test_q4_0(const float *x, uint8_t *got, uint8_t *want) {
    mu_quantize_row(MU_TYPE_Q4_0, x, got, N);
    for (int b = 0; b < N / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(xb[i]) > amax) amax = fabsf(xb[i]), max = xb[i];
        float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        put_f16(want + 18 * b, d);
        for (int i = 0; i < 16; i++) {
            int lo = (int)(xb[i] * id + 8.5f), hi = (int)(xb[i + 16] * id + 8.5f);
            lo = lo > 15 ? 15 : lo, hi = hi > 15 ? 15 : hi;
            want[18 * b + 2 + i] = (uint8_t)(lo | hi << 4);
        }
    }
    check_bytes("Q4_0", got, want, (size_t)N / 32 * 18);
}

static void test_nvfp4_native(const float *x, uint8_t *got, uint8_t *want) {
    float amax = 0.0f;
    for (int i = 0; i < N; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float scale2 = mu_nvfp4_tensor_scale2(x, N);
    CHECK_BITS_F32(scale2, amax / 2688.0f);
    uint8_t gs[N / 16], ws[N / 16];
    mu_nvfp4_quantize_row(x, got, gs, scale2, N);
    for (int g = 0; g < N / 16; g++) {
        float a = 0.0f;
        for (int i = 0; i < 16; i++) a = fmaxf(a, fabsf(x[16 * g + i]));
        ws[g] = mu_e4m3fn_from_f32(a / 6.0f / scale2);
        float denom = mu_e4m3fn_to_f32(ws[g]) * scale2;
        for (int i = 0; i < 16; i += 2) {
            float v0 = x[16 * g + i], v1 = x[16 * g + i + 1];
            uint8_t c0 = denom > 0 ? mu_e2m1_from_f32(v0 / denom) : (signbit(v0) ? 8 : 0);
            uint8_t c1 = denom > 0 ? mu_e2m1_from_f32(v1 / denom) : (signbit(v1) ? 8 : 0);
            want[8 * g + i / 2] = (uint8_t)(c0 | c1 << 4);
        }
    }
    check_bytes("NVFP4 native payload", got, want, N / 2);
    check_bytes("NVFP4 native scales", gs, ws, N / 16);
    CHECK(mu_nvfp4_tensor_scale2(x + 64, 32) == 1.0f); /* all-zero tensor */
}

/* The recipe divides twice, (amax / 6) / scale2; amax / (6 * scale2)
 * rounds differently. Find scale2 values that put an E4M3 midpoint between
 * the two and check the scale byte follows the recipe. */
static void test_nvfp4_native_order(void) {
    uint64_t rng = 0x0DE2;
    const float mid = (mu_e4m3fn_to_f32(0x50) + mu_e4m3fn_to_f32(0x51)) * 0.5f;
    int found = 0;
    for (int trial = 0; trial < 100000 && found < 4; trial++) {
        const float amax = 0.05f * (1.5f + tu_rng_uniform(&rng));
        float s2 = (amax / 6.0f) / mid;
        for (int k = -3; k <= 3 && found < 4; k++) {
            float t = s2;
            for (int j = 0; j < (k < 0 ? -k : k); j++) t = nextafterf(t, k < 0 ? 0.0f : 1.0f);
            const uint8_t recipe = mu_e4m3fn_from_f32((amax / 6.0f) / t);
            if (recipe == mu_e4m3fn_from_f32(amax / (6.0f * t))) continue;
            float x[16];
            for (int i = 0; i < 16; i++) x[i] = amax * tu_rng_uniform(&rng) * 0.9f;
            x[9] = -amax;
            uint8_t payload[8], sb;
            mu_nvfp4_quantize_row(x, payload, &sb, t, 16);
            CHECK_EQ_INT(sb, recipe);
            found++;
        }
    }
    CHECK_MSG(found == 4, "found only %d scale2 values separating the two division orders", found);
}

/* Rounding ties of the legacy quantizers: Q4_0 truncates v + 8.5 (half up),
 * Q8_0 uses roundf (half away from zero). */
static void test_legacy_ties(void) {
    float x[32] = {0};
    uint8_t blk[34];
    x[0] = -8.0f, x[1] = 2.5f, x[2] = -3.5f, x[3] = 0.5f, x[16] = -0.5f, x[17] = 7.0f;
    mu_quantize_row(MU_TYPE_Q4_0, x, blk, 32);
    CHECK_EQ_INT(blk[0] | blk[1] << 8, 0x3C00); /* d = max / -8 = 1 */
    CHECK_EQ_INT(blk[2], 0 | 8 << 4);           /* -8 -> 0, -0.5 -> 8 */
    CHECK_EQ_INT(blk[3], 11 | 15 << 4);         /* 2.5 -> 11, 7 -> 15 */
    CHECK_EQ_INT(blk[4], 5 | 8 << 4);           /* -3.5 -> 5 */
    CHECK_EQ_INT(blk[5], 9 | 8 << 4);           /* 0.5 -> 9 */
    memset(x, 0, sizeof x);
    x[0] = 127.0f, x[1] = 2.5f, x[2] = -2.5f, x[3] = 0.5f, x[4] = -0.5f, x[5] = -127.0f;
    mu_quantize_row(MU_TYPE_Q8_0, x, blk, 32);
    CHECK_EQ_INT(blk[0] | blk[1] << 8, 0x3C00);
    CHECK_EQ_INT((int8_t)blk[2], 127);
    CHECK_EQ_INT((int8_t)blk[3], 3);
    CHECK_EQ_INT((int8_t)blk[4], -3);
    CHECK_EQ_INT((int8_t)blk[5], 1);
    CHECK_EQ_INT((int8_t)blk[6], -1);
    CHECK_EQ_INT((int8_t)blk[7], -127);
}

/* ggml_fp32_to_ue4m3, re-derived with frexp: nearest with ties rounded up
 * (only the first dropped mantissa bit counts), saturation at 448 = 0x7E,
 * and in the subnormal range man = (int)(x*512 + 0.5) capped at 7. */
static uint8_t ue4m3_ggml(float x) {
    if (!(x > 0.0f)) return 0;
    if (x > 448.0f) x = 448.0f;
    int e2;
    double f = frexp(x, &e2); /* x = f * 2^e2, f in [0.5, 1) */
    int e = e2 - 1 + 7;        /* biased UE4M3 exponent */
    if (e <= 0) {
        int man = (int)(x * 512.0f + 0.5f);
        return (uint8_t)(man > 7 ? 7 : man);
    }
    double frac = f * 2.0 - 1.0;                /* [0, 1) */
    int man = (int)(frac * 8.0);               /* truncated 3 bits */
    int round = (int)(frac * 16.0) & 1;        /* first dropped bit */
    man += round;
    if (man > 7) man = 0, e++;
    if (e >= 15) return 0x7E;
    return (uint8_t)(e << 3 | man);
}

static void test_nvfp4_ggml(const float *x, uint8_t *got, uint8_t *want) {
    mu_quantize_row(MU_TYPE_NVFP4, x, got, N);
    static const float kv[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int b = 0; b < N / 64; b++)
        for (int s = 0; s < 4; s++) {
            const float *xs = x + 64 * b + 16 * s;
            float a = 0.0f;
            for (int i = 0; i < 16; i++) a = fabsf(xs[i]) > a ? fabsf(xs[i]) : a;
            uint8_t ue = ue4m3_ggml(a / 6.0f);
            want[36 * b + s] = ue;
            float d = mu_ue4m3_to_f32(ue);
            for (int j = 0; j < 8; j++) {
                int best[2] = {0, 0};
                for (int k = 0; k < 2; k++) {
                    float v = xs[j + 8 * k], be = fabsf(kv[0] * d - v);
                    for (int c = 1; c < 16; c++)
                        if (fabsf(kv[c] * d - v) < be) be = fabsf(kv[c] * d - v), best[k] = c;
                }
                want[36 * b + 4 + 8 * s + j] = (uint8_t)(best[0] | best[1] << 4);
            }
        }
    check_bytes("NVFP4 ggml", got, want, (size_t)N / 64 * 36);
    /* ggml's scale rounding differs from E4M3FN ties-to-even on purpose */
    float tie[64] = {0};
    tie[0] = 6.0f * 1.0625f; /* amax/6 = 1.0625, halfway 0x38..0x39 */
    tie[16] = 6.0f * (7.6f / 512.0f); /* subnormal range just below 2^-6 */
    tie[32] = 6.0f * 1000.0f;         /* saturates */
    uint8_t blk[36];
    mu_quantize_row(MU_TYPE_NVFP4, tie, blk, 64);
    CHECK_EQ_INT(blk[0], 0x39);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(1.0625f), 0x38);
    CHECK_EQ_INT(blk[1], 0x07);
    CHECK_EQ_INT(blk[2], 0x7E);
    CHECK_EQ_INT(blk[3], 0x00);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(blk[4 + 24 + i], 0); /* all-zero sub-block */
}

static void test_f32_passthrough(void) {
    float x[4] = {-0.0f, mu_bits_f32(0x7FA00001u), 1e-45f, -3.5f}, y[4];
    uint8_t b[16];
    mu_quantize_row(MU_TYPE_F32, x, b, 4);
    mu_type_get(MU_TYPE_F32)->dequantize(b, y, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(mu_f32_bits(y[i]), mu_f32_bits(x[i]));
}

int main(void) {
    uint64_t rng = 0xE8AC7;
    float *x = malloc(sizeof(float) * N);
    uint8_t *got = malloc(N * 2), *want = malloc(N * 2);
    for (int rep = 0; rep < 5; rep++) {
        gen(x, N, &rng);
        test_q8_0(x, got, want);
        test_q4_0(x, got, want);
        test_nvfp4_native(x, got, want);
        test_nvfp4_ggml(x, got, want);
    }
    test_f32_passthrough();
    test_nvfp4_native_order();
    test_legacy_ties();
    free(x), free(got), free(want);
    TEST_MAIN_END();
}
