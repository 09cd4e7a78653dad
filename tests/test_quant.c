/* Block formats: the worked vectors of docs/model.md bit for bit, exhaustive FP8/FP4
 * and f16/bf16 conversions, and the Q8_K quantizer rules. */
#include "quant/quant.h"
#include "testutil.h"
#include <math.h>

/* ------------------------------------------------------------ Q4_K */

static void test_q4k_worked_block(void) {
    const uint8_t sc[8] = {20, 12, 44, 8, 33, 25, 17, 9};
    const uint8_t m[8] = {4, 16, 8, 24, 12, 20, 28, 36};
    const uint8_t want[12] = {0x94, 0x4C, 0x6C, 0x08, 0x04, 0x50, 0x48, 0x98, 0xC1, 0x49, 0xC1, 0x49};
    uint8_t blk[144] = {0};
    blk[0] = 0x00, blk[1] = 0x28; /* d = 0.03125 */
    blk[2] = 0x00, blk[3] = 0x20; /* dmin = 0.0078125 */
    mu_kquant_pack_scales(blk + 4, sc, m);
    for (int i = 0; i < 12; i++) CHECK_EQ_INT(blk[4 + i], want[i]);
    uint8_t sc2[8], m2[8];
    mu_kquant_unpack_scales(blk + 4, sc2, m2);
    for (int j = 0; j < 8; j++) {
        CHECK_EQ_INT(sc2[j], sc[j]);
        CHECK_EQ_INT(m2[j], m[j]);
    }
    blk[16] = 0x5E; /* qs[0] */
    blk[48] = 0x3C; /* qs[32] */
    float y[256];
    const mu_type_traits *t = mu_type_get(MU_TYPE_Q4_K);
    CHECK(t->supported && t->block_elems == 256 && t->block_bytes == 144);
    t->dequantize(blk, y, 256);
    CHECK_BITS_F32(y[0], 8.71875f);
    CHECK_BITS_F32(y[32], 1.75f);
    CHECK_BITS_F32(y[64], 16.4375f);
    /* every element with a zero code decodes to -(dmin*m) of its sub-block */
    for (int i = 0; i < 256; i++)
        if (i != 0 && i != 32 && i != 64 && i != 96) CHECK_BITS_F32(y[i], -(0.0078125f * (float)m[i / 32]));
    CHECK_BITS_F32(y[96], 0.03125f * 8 * 3 - 0.0078125f * 24); /* high nibble of 0x3C */
    /* round trip of arbitrary 6-bit values through the strip */
    uint64_t rng = 0x1234567;
    for (int k = 0; k < 1000; k++) {
        uint8_t a[8], b[8], s[12], a2[8], b2[8];
        for (int j = 0; j < 8; j++) {
            a[j] = (uint8_t)(tu_rng_next(&rng) & 63);
            b[j] = (uint8_t)(tu_rng_next(&rng) & 63);
        }
        mu_kquant_pack_scales(s, a, b);
        mu_kquant_unpack_scales(s, a2, b2);
        CHECK(memcmp(a, a2, 8) == 0 && memcmp(b, b2, 8) == 0);
    }
}

/* ----------------------------------------------------------- NVFP4 */

static void test_nvfp4_fixture(void) {
    const uint8_t payload[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};
    const uint8_t scale = 0x38;
    const float want[16] = {0.0f, 0.125f, 0.25f, 0.375f, 0.5f, 0.75f, 1.0f, 1.5f,
                            -0.0f, -0.125f, -0.25f, -0.375f, -0.5f, -0.75f, -1.0f, -1.5f};
    float y[16];
    mu_nvfp4_dequant_row(payload, &scale, 0.25f, y, 16);
    for (int i = 0; i < 16; i++) CHECK_BITS_F32(y[i], want[i]);
    /* the same through a weight view */
    mu_weight w = {.name = "fixture", .type = MU_TYPE_NVFP4_E2M1, .data = payload,
                   .nvfp4_scales = &scale, .scale = 0.25f, .n_in = 16, .n_out = 1, .row_bytes = 8};
    float z[16];
    mu_weight_dequant_row(&w, 0, z);
    for (int i = 0; i < 16; i++) CHECK_BITS_F32(z[i], want[i]);
    /* quantizing the dequantized row gives back the same bytes */
    uint8_t p2[8], s2;
    mu_nvfp4_quantize_row(want, p2, &s2, 0.25f, 16);
    CHECK_EQ_INT(s2, 0x38);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(p2[i], payload[i]);
}

static void test_nvfp4_ggml_block(void) {
    uint8_t blk[36];
    blk[0] = 0x38; /* 1.0 */
    blk[1] = 0xC0; /* sign ignored: 0x40 = 2.0 */
    blk[2] = 0x7F; /* ggml sentinel: 0 */
    blk[3] = 0x01; /* 2^-9 */
    for (int j = 0; j < 32; j++) blk[4 + j] = (uint8_t)((j * 7 + 3) & 0xFF);
    blk[4] = 0x71; /* v[0] = code 1 (0.5), v[8] = code 7 (6.0) */
    float y[64];
    mu_type_get(MU_TYPE_NVFP4)->dequantize(blk, y, 64);
    CHECK_BITS_F32(y[0], 0.5f);
    CHECK_BITS_F32(y[8], 6.0f);
    const float d[4] = {1.0f, 2.0f, 0.0f, 1.0f / 512.0f};
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 8; j++) {
            uint8_t b = blk[4 + 8 * s + j];
            CHECK_BITS_F32(y[16 * s + j], mu_e2m1_to_f32(b & 15) * d[s]);
            CHECK_BITS_F32(y[16 * s + j + 8], mu_e2m1_to_f32(b >> 4) * d[s]);
        }
    CHECK_BITS_F32(mu_ue4m3_to_f32(0x00), 0.0f);
    CHECK_BITS_F32(mu_ue4m3_to_f32(0x80), 0.0f);
    CHECK_BITS_F32(mu_ue4m3_to_f32(0x7F), 0.0f);
    CHECK_BITS_F32(mu_ue4m3_to_f32(0xB8), 1.0f);
    CHECK_BITS_F32(mu_ue4m3_to_f32(0xFF), 480.0f); /* ggml checks 0x7F before masking */
    for (int b = 1; b < 0x7F; b++) CHECK_BITS_F32(mu_ue4m3_to_f32((uint8_t)b), mu_e4m3fn_to_f32((uint8_t)b));
}

/* ------------------------------------------------------------ E4M3FN */

static float e4m3_formula(int b) {
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (float)((b & 0x80) ? -v : v);
}

/* Brute force: nearest finite code by exact distance, ties to even code. */
static uint8_t e4m3_oracle(float f) {
    if (isnan(f)) return 0x7F;
    double a = fabs((double)f);
    if (a > 448.0) a = 448.0;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7E; c++) {
        double dist = fabs(e4m3_formula(c) - a);
        if (dist < bd || (dist == bd && (c & 1) == 0)) {
            bd = dist;
            best = c;
        }
    }
    return (uint8_t)(best | (signbit(f) ? 0x80 : 0));
}

static void test_e4m3fn(void) {
    int finite = 0;
    for (int b = 0; b < 256; b++) {
        float v = mu_e4m3fn_to_f32((uint8_t)b);
        if ((b & 0x7F) == 0x7F) {
            CHECK_MSG(isnan(v), "code 0x%02x must be NaN", b);
            continue;
        }
        finite++;
        CHECK_BITS_F32(v, e4m3_formula(b));
        CHECK_MSG((double)mu_e4m3fn_q9((uint8_t)b) == (double)v * 512.0, "q9 of 0x%02x", b);
        CHECK_EQ_INT(mu_e4m3fn_from_f32(v), b);
    }
    CHECK_EQ_INT(finite, 254);
    CHECK_BITS_F32(mu_e4m3fn_to_f32(0x00), 0.0f);
    CHECK_BITS_F32(mu_e4m3fn_to_f32(0x80), -0.0f);
    CHECK_BITS_F32(mu_e4m3fn_to_f32(0x01), 1.0f / 512.0f);
    CHECK_BITS_F32(mu_e4m3fn_to_f32(0x38), 1.0f);
    CHECK_BITS_F32(mu_e4m3fn_to_f32(0x7E), 448.0f);
    CHECK_EQ_INT(mu_e4m3fn_q9(0x7E), 229376);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(1000.0f), 0x7E);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(-1000.0f), 0xFE);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(464.0f), 0x7E);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(INFINITY), 0x7E);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(-INFINITY), 0xFE);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(NAN), 0x7F);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(1e-30f), 0x00);
    CHECK_EQ_INT(mu_e4m3fn_from_f32(-1e-30f), 0x80);
    /* every midpoint between neighbouring codes goes to the even code; a
     * nudge either way goes to the nearer code */
    for (int c = 0; c < 0x7E; c++) {
        float lo = mu_e4m3fn_to_f32((uint8_t)c), hi = mu_e4m3fn_to_f32((uint8_t)(c + 1));
        float mid = (lo + hi) * 0.5f; /* exact: both have <= 4 significant bits */
        int even = (c & 1) ? c + 1 : c;
        CHECK_MSG(mu_e4m3fn_from_f32(mid) == even, "midpoint %g of 0x%02x", (double)mid, c);
        CHECK_MSG(mu_e4m3fn_from_f32(-mid) == (even | 0x80), "midpoint %g", (double)-mid);
        CHECK_EQ_INT(mu_e4m3fn_from_f32(nextafterf(mid, 0.0f)), c);
        CHECK_EQ_INT(mu_e4m3fn_from_f32(nextafterf(mid, 1e9f)), c + 1);
    }
    /* random magnitudes over the whole range against the brute-force oracle */
    uint64_t rng = 0xE4E3;
    for (int k = 0; k < 20000; k++) {
        float f = ldexpf(tu_rng_uniform(&rng), (int)(tu_rng_next(&rng) % 24) - 14);
        CHECK_MSG(mu_e4m3fn_from_f32(f) == e4m3_oracle(f), "e4m3 of %a", (double)f);
    }
}

/* -------------------------------------------------------------- E2M1 */

static void test_e2m1(void) {
    const float table[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int c = 0; c < 16; c++) {
        CHECK_BITS_F32(mu_e2m1_to_f32((uint8_t)c), table[c]);
        CHECK_EQ_INT(mu_e2m1_q1((uint8_t)c), (int)(table[c] * 2.0f));
        CHECK_EQ_INT(mu_e2m1_from_f32(table[c]), c);
    }
    CHECK_BITS_F32(mu_e2m1_to_f32(8), -0.0f);
    const struct { float v; int code; } ties[] = {
        {0.25f, 0}, {0.250001f, 1}, {0.75f, 2}, {1.25f, 2}, {1.250001f, 3}, {1.75f, 4},
        {2.5f, 4}, {2.500001f, 5}, {3.5f, 6}, {5.0f, 6}, {5.000001f, 7},
    };
    for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++) {
        CHECK_MSG(mu_e2m1_from_f32(ties[i].v) == ties[i].code, "e2m1(%g)", (double)ties[i].v);
        CHECK_MSG(mu_e2m1_from_f32(-ties[i].v) == (ties[i].code | 8), "e2m1(%g)", (double)-ties[i].v);
    }
    CHECK_EQ_INT(mu_e2m1_from_f32(100.0f), 7);
    CHECK_EQ_INT(mu_e2m1_from_f32(-0.0f), 8);
    CHECK_EQ_INT(mu_e2m1_from_f32(0.7499999f), 1);
}

/* ------------------------------------------------------------- Q8_K */

static int32_t q8k_oracle(float iscale, float x) {
    return (int32_t)fmin(127.0, rint((double)iscale * (double)x));
}

static void test_q8k_rules(void) {
    uint64_t rng = 0x5151;
    float x[256];
    mu_block_q8k b;
    for (int i = 0; i < 256; i++) x[i] = tu_rng_uniform(&rng) * 0.5f;
    /* equal magnitudes: the first one sets the sign of d */
    x[3] = -2.0f, x[7] = 2.0f;
    mu_quantize_q8k(x, &b, 256, false);
    CHECK_BITS_F32(b.d, 1.0f / 63.5f);
    CHECK_EQ_INT(b.qs[3], -127);
    CHECK_EQ_INT(b.qs[7], 127);
    x[3] = 2.0f, x[7] = -2.0f;
    mu_quantize_q8k(x, &b, 256, false);
    CHECK_BITS_F32(b.d, 1.0f / -63.5f);
    CHECK_EQ_INT(b.qs[3], -127);
    CHECK_EQ_INT(b.qs[7], 127); /* -max maps to +127, never -128 */
    /* every code against an exact-product oracle; bsums; range */
    for (int rep = 0; rep < 200; rep++) {
        float scale = ldexpf(1.0f, (int)(tu_rng_next(&rng) % 20) - 10);
        for (int i = 0; i < 256; i++) x[i] = tu_rng_normal(&rng) * scale;
        mu_quantize_q8k(x, &b, 256, false);
        float amax = 0, max = 0;
        for (int i = 0; i < 256; i++)
            if (fabsf(x[i]) > amax) amax = fabsf(x[i]), max = x[i];
        float iscale = -127.0f / max;
        CHECK_BITS_F32(b.d, 1.0f / iscale);
        for (int i = 0; i < 256; i++) {
            CHECK_MSG(b.qs[i] == q8k_oracle(iscale, x[i]), "rep %d i %d", rep, i);
            CHECK(b.qs[i] >= -127);
        }
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += b.qs[16 * k + i];
            CHECK_EQ_INT(b.bsums[k], s);
        }
    }
    /* ties go to even: max = -127 makes iscale exactly 1 */
    for (int i = 0; i < 256; i++) x[i] = 0.0f;
    x[0] = -127.0f, x[1] = 2.5f, x[2] = 3.5f, x[3] = -2.5f, x[4] = 0.5f, x[5] = 126.5f;
    mu_quantize_q8k(x, &b, 256, false);
    CHECK_BITS_F32(b.d, 1.0f);
    CHECK_EQ_INT(b.qs[0], -127);
    CHECK_EQ_INT(b.qs[1], 2);
    CHECK_EQ_INT(b.qs[2], 4);
    CHECK_EQ_INT(b.qs[3], -2);
    CHECK_EQ_INT(b.qs[4], 0);
    CHECK_EQ_INT(b.qs[5], 126);
    /* single rounding: x close to (k + 0.5) / iscale where the rounded
     * product iscale*x is exactly k + 0.5 but the exact product is not;
     * rounding the rounded product would differ from the fmaf rule */
    int found = 0;
    for (int k = 0; k < 100000 && found < 5; k++) {
        const float max = -1.0f - (tu_rng_uniform(&rng) + 1.0f) * 0.5f; /* [-2, -1) */
        const float iscale = -127.0f / max;
        const float half = (float)(tu_rng_next(&rng) % 120) + 0.5f;
        float xi = half / iscale;
        if (k & 1) xi = nextafterf(xi, (k & 2) ? 0.0f : 1e9f);
        if (iscale * xi != half || rintf(iscale * xi) == (float)q8k_oracle(iscale, xi)) continue;
        for (int i = 0; i < 256; i++) x[i] = 0.0f;
        x[0] = max, x[1] = xi;
        mu_quantize_q8k(x, &b, 256, false);
        CHECK_EQ_INT(b.qs[1], q8k_oracle(iscale, xi));
        found++;
    }
    CHECK_MSG(found == 5, "only %d double-rounding cases found to exercise the fmaf rule", found);
    /* all-zero (and all negative-zero) block */
    for (int i = 0; i < 256; i++) x[i] = (i & 1) ? -0.0f : 0.0f;
    memset(&b, 0x55, sizeof b);
    mu_quantize_q8k(x, &b, 256, false);
    CHECK_BITS_F32(b.d, 0.0f);
    for (int i = 0; i < 256; i++) CHECK_EQ_INT(b.qs[i], 0);
    for (int k = 0; k < 16; k++) CHECK_EQ_INT(b.bsums[k], 0);
    /* via_f16 equals quantizing f16-rounded inputs, and it matters */
    float xr[256];
    int differs = 0;
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < 256; i++) {
            x[i] = tu_rng_normal(&rng);
            xr[i] = mu_round_f16(x[i]);
        }
        mu_block_q8k a, c;
        mu_quantize_q8k(x, &b, 256, true);
        mu_quantize_q8k(xr, &a, 256, false);
        mu_quantize_q8k(x, &c, 256, false);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        differs += memcmp(&b, &c, sizeof b) != 0;
    }
    CHECK(differs > 0);
    /* dequantize is d * q */
    float y[256];
    mu_dequantize_q8k(&b, y, 256);
    for (int i = 0; i < 256; i++) CHECK_BITS_F32(y[i], b.d * (float)b.qs[i]);
}

/* ---------------------------------------------------------- f16/bf16 */

static double f16_formula(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? m * ldexp(1.0, -24) : (1.0 + m / 1024.0) * ldexp(1.0, e - 15);
    return (h & 0x8000) ? -v : v;
}

static void test_half_conversions(void) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mu_f16_to_f32((uint16_t)h);
        uint16_t back = mu_f32_to_f16(f);
        bool nan = ((h >> 10) & 31) == 31 && (h & 1023);
        if (nan) {
            CHECK_MSG(isnan(f) && back == (h | 0x0200), "f16 NaN 0x%04x -> 0x%04x", h, back);
        } else {
            CHECK_MSG(back == h, "f16 0x%04x -> 0x%04x", h, back);
            if (((h >> 10) & 31) != 31) CHECK((double)f == f16_formula((uint16_t)h));
        }
        float g = mu_bf16_to_f32((uint16_t)h);
        uint16_t gb = mu_f32_to_bf16(g);
        bool bnan = ((h >> 7) & 255) == 255 && (h & 127);
        CHECK_MSG(bnan ? (isnan(g) && gb == (h | 0x40)) : gb == h, "bf16 0x%04x -> 0x%04x", h, gb);
    }
    /* round-to-nearest-even ties */
    CHECK_EQ_INT(mu_f32_to_f16(1.0f + 0x1p-11f), 0x3C00);
    CHECK_EQ_INT(mu_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
    CHECK_EQ_INT(mu_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
    CHECK_EQ_INT(mu_f32_to_f16(65519.0f), 0x7BFF);
    CHECK_EQ_INT(mu_f32_to_f16(65520.0f), 0x7C00);
    CHECK_EQ_INT(mu_f32_to_f16(0x1p-25f), 0x0000);
    CHECK_EQ_INT(mu_f32_to_f16(3 * 0x1p-25f), 0x0002);
    CHECK_EQ_INT(mu_f32_to_f16(0x1p-25f + 0x1p-40f), 0x0001);
    CHECK_EQ_INT(mu_f32_to_f16(-0.0f), 0x8000);
    CHECK_EQ_INT(mu_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);
    CHECK_EQ_INT(mu_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);
    CHECK_EQ_INT(mu_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
    /* the F16/BF16 traits use these conversions */
    uint64_t rng = 0xF16;
    float src[64], back[64];
    uint8_t bytes[128];
    for (int i = 0; i < 64; i++) src[i] = tu_rng_normal(&rng) * 100.0f;
    mu_quantize_row(MU_TYPE_F16, src, bytes, 64);
    mu_type_get(MU_TYPE_F16)->dequantize(bytes, back, 64);
    for (int i = 0; i < 64; i++) CHECK_BITS_F32(back[i], mu_round_f16(src[i]));
    mu_quantize_row(MU_TYPE_BF16, src, bytes, 64);
    mu_type_get(MU_TYPE_BF16)->dequantize(bytes, back, 64);
    for (int i = 0; i < 64; i++) CHECK_BITS_F32(back[i], mu_bf16_to_f32(mu_f32_to_bf16(src[i])));
}

/* ------------------------------------------------------------ traits */

static void test_traits(void) {
    const uint32_t ids[] = {MU_TYPE_F32, MU_TYPE_F16, MU_TYPE_BF16, MU_TYPE_Q8_0, MU_TYPE_Q4_0,
                            MU_TYPE_Q4_K, MU_TYPE_Q5_K, MU_TYPE_Q6_K, MU_TYPE_Q8_K, MU_TYPE_NVFP4,
                            MU_TYPE_NVFP4_E2M1, MU_TYPE_F8_E4M3FN};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        const mu_type_traits *t = mu_type_get(ids[i]);
        uint32_t be = 0, bb = 0;
        CHECK(mu_type_size(ids[i], &be, &bb));
        CHECK_MSG(t->supported && t->dequantize && t->quantize, "type %u", ids[i]);
        CHECK(t->block_elems == be && t->block_bytes == bb);
        CHECK(t->name && strcmp(t->name, mu_type_name(ids[i])) == 0);
    }
    CHECK(mu_type_get(MU_TYPE_F16)->is_float && !mu_type_get(MU_TYPE_Q4_K)->is_float);
    CHECK(mu_type_get(MU_TYPE_Q4_K)->dot_q8k && mu_type_get(MU_TYPE_NVFP4)->dot_q8k);
    const mu_type_traits *q2k = mu_type_get(MU_TYPE_Q2_K);
    CHECK(!q2k->supported && q2k->name && strcmp(q2k->name, "Q2_K") == 0 && q2k->block_bytes == 84);
    CHECK(!mu_type_get(12345)->supported && mu_type_get(12345)->name == NULL);
    CHECK(!mu_type_get(999)->supported);
    /* weight-view validation fails closed with the tensor name */
    uint8_t data[144] = {0};
    mu_weight w = {.name = "blk.0.attn_q.weight", .type = MU_TYPE_Q4_K, .data = data, .scale = 1.0f,
                   .n_in = 256, .n_out = 1, .row_bytes = 144};
    mu_error err = {{0}};
    CHECK(mu_weight_check(&w, &err));
    w.n_in = 512;
    CHECK(!mu_weight_check(&w, &err) && strstr(err.msg, "blk.0.attn_q.weight"));
    w.type = MU_TYPE_Q8_0, w.n_in = 32, w.row_bytes = 34;
    CHECK(!mu_weight_check(&w, &err) && strstr(err.msg, "multiple of 256"));
    w.type = MU_TYPE_Q2_K, w.n_in = 256, w.row_bytes = 84;
    CHECK(!mu_weight_check(&w, &err) && strstr(err.msg, "Q2_K"));
    mu_weight n = {.name = "nv", .type = MU_TYPE_NVFP4_E2M1, .data = data, .nvfp4_scales = NULL,
                   .scale = 0.5f, .n_in = 256, .n_out = 1, .row_bytes = 128};
    CHECK(!mu_weight_check(&n, &err) && strstr(err.msg, "scale tensor"));
    n.nvfp4_scales = data;
    CHECK(mu_weight_check(&n, &err));
    n.scale = -1.0f;
    CHECK(!mu_weight_check(&n, &err) && strstr(err.msg, "scale2"));
    n.scale = 0.5f, n.input_scale_inv = 2.0f, n.n_in = 16, n.row_bytes = 8;
    CHECK(mu_weight_check(&n, &err));
    n.input_scale_inv = 0.0f;
    CHECK(!mu_weight_check(&n, &err));
}

int main(void) {
    test_q4k_worked_block();
    test_nvfp4_fixture();
    test_nvfp4_ggml_block();
    test_e4m3fn();
    test_e2m1();
    test_q8k_rules();
    test_half_conversions();
    test_traits();
    TEST_MAIN_END();
}
