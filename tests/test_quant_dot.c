/* The canonical row dot: bitwise against an independent re-implementation of
 * the written formulas (own byte decoding, own loops), and close to a
 * double-precision dot of the dequantized operands. */
#include "quant/quant.h"
#include "testutil.h"
#include <math.h>
#include <stdlib.h>

enum { N_IN = 1024, N_OUT = 3, NB = N_IN / 256 };

static float f16le(const uint8_t *p) { return mu_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* ------------------------------------------------ independent decoders */

/* get_scale_min_k4 as docs/model.md writes it (K-quants). */
static void scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63, *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Code of value i (0..255) of one super-block. */
static int code_q4k(const uint8_t *b, int i) {
    int g = i / 64, r = i % 64;
    uint8_t byte = b[16 + 32 * g + r % 32];
    return r < 32 ? byte & 15 : byte >> 4;
}
static int code_q5k(const uint8_t *b, int i) {
    int g = i / 64, r = i % 64;
    uint8_t byte = b[48 + 32 * g + r % 32];
    int low = r < 32 ? byte & 15 : byte >> 4;
    int bit = (b[16 + r % 32] >> (2 * g + (r >= 32))) & 1;
    return low | bit << 4;
}
static int code_q6k(const uint8_t *b, int i) {
    int h = i / 128, r = i % 128, k = r / 32, l = r % 32;
    uint8_t byte = b[64 * h + l + 32 * (k & 1)];
    int nib = k < 2 ? byte & 15 : byte >> 4;
    int hb = (b[128 + 32 * h + l] >> (2 * k)) & 3;
    return (nib | hb << 4) - 32;
}
static int code_nvfp4_ggml(const uint8_t *b, int i) { /* b = first of 4 blocks */
    const uint8_t *blk = b + 36 * (i / 64);
    int r = i % 64, s = r / 16, j = r % 16;
    uint8_t byte = blk[4 + 8 * s + j % 8];
    return j < 8 ? byte & 15 : byte >> 4;
}

static int q1(int code) {
    static const int mag[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}
static int64_t q9(uint8_t b, bool ue) {
    if (ue && (b == 0 || b == 0x7F)) return 0;
    int e = (b >> 3) & 15, m = b & 7;
    int64_t v = e == 0 ? m : (int64_t)(8 + m) << (e - 1);
    return (!ue && (b & 0x80)) ? -v : v;
}

/* ------------------------------------------- the formulas, per 256 block */

static float fb_kquant_min(const uint8_t *b, const mu_block_q8k *x, int (*code)(const uint8_t *, int)) {
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m, isum = 0;
        scale_min(b + 4, j, &sc, &m);
        for (int i = 32 * j; i < 32 * j + 32; i++) isum += code(b, i) * x->qs[i];
        sumi += sc * isum;
        summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    float d = f16le(b), dmin = f16le(b + 2);
    return (d * x->d) * (float)sumi - (dmin * x->d) * (float)summ;
}
static float fb_q4k(const uint8_t *b, const mu_block_q8k *x) { return fb_kquant_min(b, x, code_q4k); }
static float fb_q5k(const uint8_t *b, const mu_block_q8k *x) { return fb_kquant_min(b, x, code_q5k); }
static float fb_q6k(const uint8_t *b, const mu_block_q8k *x) {
    int32_t sumi = 0;
    for (int s = 0; s < 16; s++) {
        int isum = 0;
        for (int i = 16 * s; i < 16 * s + 16; i++) isum += code_q6k(b, i) * x->qs[i];
        sumi += (int8_t)b[192 + s] * isum;
    }
    return (f16le(b + 208) * x->d) * (float)sumi;
}
static float fb_q8_0(const uint8_t *b, const mu_block_q8k *x) {
    float acc = 0.0f;
    for (int j = 0; j < 8; j++) {
        const uint8_t *blk = b + 34 * j;
        int isum = 0;
        for (int i = 0; i < 32; i++) isum += (int8_t)blk[2 + i] * x->qs[32 * j + i];
        acc = acc + (f16le(blk) * x->d) * (float)isum;
    }
    return acc;
}
static float fb_q4_0(const uint8_t *b, const mu_block_q8k *x) {
    float acc = 0.0f;
    for (int j = 0; j < 8; j++) {
        const uint8_t *blk = b + 18 * j;
        int isum = 0;
        for (int i = 0; i < 32; i++) {
            int nib = i < 16 ? blk[2 + i] & 15 : blk[2 + i - 16] >> 4;
            isum += (nib - 8) * x->qs[32 * j + i];
        }
        acc = acc + (f16le(blk) * x->d) * (float)isum;
    }
    return acc;
}
static float fb_nvfp4_ggml(const uint8_t *b, const mu_block_q8k *x) {
    int64_t itotal = 0;
    for (int g = 0; g < 16; g++) {
        int dot = 0;
        for (int i = 16 * g; i < 16 * g + 16; i++) dot += q1(code_nvfp4_ggml(b, i)) * x->qs[i];
        itotal += dot * q9(b[36 * (g / 4) + g % 4], true);
    }
    return ((float)itotal * 0x1p-10f) * x->d;
}

typedef float (*fb_fn)(const uint8_t *, const mu_block_q8k *);

/* ------------------------------------------------------ weight fixtures */

/* Random-but-valid bytes: random payload, block scale fields replaced by
 * random finite f16 values so every code path is reached. */
static void randomize_bytes(uint32_t type, uint8_t *data, size_t nbytes, uint64_t *rng) {
    for (size_t i = 0; i < nbytes; i++) data[i] = (uint8_t)tu_rng_next(rng);
    uint32_t be, bb;
    mu_type_size(type, &be, &bb);
    for (size_t off = 0; off < nbytes; off += bb) {
        uint8_t *b = data + off;
        uint16_t h1 = mu_f32_to_f16(tu_rng_uniform(rng) * 0.01f);
        uint16_t h2 = mu_f32_to_f16(tu_rng_uniform(rng) * 0.01f);
        if (type == MU_TYPE_Q6_K) {
            b[208] = (uint8_t)h1, b[209] = (uint8_t)(h1 >> 8);
        } else if (type != MU_TYPE_NVFP4) {
            b[0] = (uint8_t)h1, b[1] = (uint8_t)(h1 >> 8);
            if (type == MU_TYPE_Q4_K || type == MU_TYPE_Q5_K) b[2] = (uint8_t)h2, b[3] = (uint8_t)(h2 >> 8);
        }
    }
}

static void fill_weights(uint32_t type, uint8_t *data, uint64_t row_bytes, bool random_bytes, uint64_t *rng) {
    if (random_bytes) {
        randomize_bytes(type, data, row_bytes * N_OUT, rng);
        return;
    }
    float *w = malloc(sizeof(float) * N_IN);
    for (int r = 0; r < N_OUT; r++) {
        for (int i = 0; i < N_IN; i++) w[i] = tu_rng_normal(rng) * 0.02f;
        mu_quantize_row(type, w, data + r * row_bytes, N_IN);
    }
    free(w);
}

static void fill_activations(float *x, uint64_t *rng) {
    for (int i = 0; i < N_IN; i++) x[i] = tu_rng_normal(rng) * (1.0f + (float)(i % 7));
}

/* Relative closeness to a double dot: |got - ref| <= tol * sum|w*x| + tiny. */
static void check_close(const char *what, double got, const float *w, const float *x, int64_t n, double tol) {
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; i++) {
        ref += (double)w[i] * (double)x[i];
        mag += fabs((double)w[i] * (double)x[i]);
    }
    CHECK_MSG(fabs(got - ref) <= tol * mag + 1e-30, "%s: %.9g vs double %.9g (sum|wx| %.3g)", what, got,
              ref, mag);
}

/* ------------------------------------------------- Q8_K-dotted formats */

static void test_q8k_format(uint32_t type, fb_fn fb, bool with_scale) {
    uint64_t rng = 0xD07 + type;
    uint64_t row_bytes;
    mu_type_row_bytes(type, N_IN, &row_bytes);
    uint8_t *data = malloc(row_bytes * N_OUT);
    float x[N_IN], xd[N_IN], wd[N_IN];
    mu_block_q8k xq[NB];
    for (int variant = 0; variant < 4; variant++) {
        fill_weights(type, data, row_bytes, variant >= 2, &rng);
        fill_activations(x, &rng);
        mu_weight w = {.name = "w", .type = type, .data = data, .scale = 1.0f, .n_in = N_IN,
                       .n_out = N_OUT, .row_bytes = row_bytes};
        if (with_scale && (variant & 1)) w.has_scale = true, w.scale = 0.37f;
        mu_error err;
        CHECK_MSG(mu_weight_check(&w, &err), "%s", err.msg);
        bool via_f16 = true;
        CHECK(mu_weight_uses_q8k(&w, &via_f16) && !via_f16);
        mu_quantize_q8k(x, xq, N_IN, false);
        mu_dequantize_q8k(xq, xd, N_IN);
        for (int r = 0; r < N_OUT; r++) {
            float got = mu_weight_dot_row(&w, r, x, xq);
            float total = 0.0f;
            const uint8_t *row = data + r * row_bytes;
            for (int b = 0; b < NB; b++) total = total + fb(row + b * (row_bytes / NB), &xq[b]);
            if (w.has_scale) total = total * w.scale;
            CHECK_MSG(mu_f32_bits(got) == mu_f32_bits(total), "%s row %d variant %d: %a vs %a",
                      mu_type_name(type), r, variant, (double)got, (double)total);
            CHECK(got != 0.0f);
            mu_weight_dequant_row(&w, r, wd);
            check_close(mu_type_name(type), got, wd, xd, N_IN, 2e-5);
        }
    }
    free(data);
}

/* -------------------------------------------------------- native NVFP4 */

static void nvfp4_native_fixture(uint8_t *payload, uint8_t *scales, float *scale2, uint64_t *rng) {
    float *w = malloc(sizeof(float) * N_IN * N_OUT);
    for (int i = 0; i < N_IN * N_OUT; i++) w[i] = tu_rng_normal(rng) * 0.02f * (1.0f + (float)(i % 5));
    *scale2 = mu_nvfp4_tensor_scale2(w, N_IN * N_OUT);
    for (int r = 0; r < N_OUT; r++)
        mu_nvfp4_quantize_row(w + r * N_IN, payload + r * N_IN / 2, scales + r * N_IN / 16, *scale2, N_IN);
    free(w);
}

static void test_nvfp4_w4a16(void) {
    uint64_t rng = 0xA16;
    uint8_t payload[N_IN / 2 * N_OUT], scales[N_IN / 16 * N_OUT];
    float scale2, x[N_IN], xd[N_IN], wd[N_IN];
    mu_block_q8k xq[NB];
    for (int rep = 0; rep < 3; rep++) {
        nvfp4_native_fixture(payload, scales, &scale2, &rng);
        fill_activations(x, &rng);
        mu_weight w = {.name = "nv", .type = MU_TYPE_NVFP4_E2M1, .data = payload, .nvfp4_scales = scales,
                       .scale = scale2, .n_in = N_IN, .n_out = N_OUT, .row_bytes = N_IN / 2};
        mu_error err;
        CHECK_MSG(mu_weight_check(&w, &err), "%s", err.msg);
        bool via_f16 = false;
        CHECK(mu_weight_uses_q8k(&w, &via_f16) && via_f16);
        mu_quantize_q8k(x, xq, N_IN, true);
        mu_dequantize_q8k(xq, xd, N_IN);
        for (int r = 0; r < N_OUT; r++) {
            const uint8_t *p = payload + r * N_IN / 2, *s = scales + r * N_IN / 16;
            float total = 0.0f;
            for (int b = 0; b < NB; b++) {
                int64_t itotal = 0;
                for (int g = 0; g < 16; g++) {
                    int dot = 0;
                    for (int i = 0; i < 16; i++) {
                        int v = 256 * b + 16 * g + i;
                        dot += q1(v & 1 ? p[v / 2] >> 4 : p[v / 2] & 15) * xq[b].qs[16 * g + i];
                    }
                    itotal += dot * q9(s[16 * b + g], false);
                }
                float c = ((float)itotal * 0x1p-10f) * xq[b].d;
                c = c * scale2;
                total = total + c;
            }
            float want = mu_f16_to_f32(mu_f32_to_f16(total));
            float got = mu_weight_dot_row(&w, r, x, xq);
            CHECK_MSG(mu_f32_bits(got) == mu_f32_bits(want), "NVFP4 W4A16 row %d: %a vs %a", r, (double)got,
                      (double)want);
            CHECK(got != 0.0f);
            mu_weight_dequant_row(&w, r, wd);
            check_close("NVFP4 W4A16", got, wd, xd, N_IN, 1e-3); /* f16 output rounding */
        }
    }
}

/* W4A4 activation quantization per the contract in docs/numerics.md,
 * re-derived here. */
/* divide_by_6 selects the variant amax / 6 (not the contract) for tests
 * that prove they can tell the two apart. */
static uint8_t w4a4_quant_group_v(const float *x, float inv, uint8_t *code, bool divide_by_6) {
    float r[16], amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        r[i] = mu_f16_to_f32(mu_f32_to_f16(x[i]));
        if (fabsf(r[i]) > amax) amax = fabsf(r[i]);
    }
    float norm = divide_by_6 ? amax / 6.0f : amax * (1.0f / 6.0f);
    float v = norm * inv;
    uint8_t sb = mu_e4m3fn_from_f32(v < 448.0f ? v : 448.0f);
    float s = mu_e4m3fn_to_f32(sb);
    for (int i = 0; i < 16; i++) {
        float t = fabsf(r[i]) * inv;
        int c = 0;
        if (s != 0.0f) {
            if (t <= s * 0.25f) c = 0;
            else if (t < s * 0.75f) c = 1;
            else if (t <= s * 1.25f) c = 2;
            else if (t < s * 1.75f) c = 3;
            else if (t <= s * 2.5f) c = 4;
            else if (t < s * 3.5f) c = 5;
            else if (t <= s * 5.0f) c = 6;
            else c = 7;
        }
        code[i] = (uint8_t)((signbit(r[i]) ? 8 : 0) | c);
    }
    return sb;
}

static uint8_t w4a4_quant_group(const float *x, float inv, uint8_t *code) {
    return w4a4_quant_group_v(x, inv, code, false);
}

/* One 16-value W4A4 group by the written contract; variants: amax / 6 in
 * the activation scale, s / inv instead of s * (1 / inv) in the epilogue. */
static float w4a4_group_ref(const uint8_t *p, uint8_t wscale, float scale2, float inv, const float *x,
                            bool divide_by_6, bool divide_by_inv) {
    uint8_t ac[16];
    const uint8_t asb = w4a4_quant_group_v(x, inv, ac, divide_by_6);
    int dot = 0;
    for (int i = 0; i < 16; i++) dot += q1(i & 1 ? p[i / 2] >> 4 : p[i / 2] & 15) * q1(ac[i]);
    float c = (float)((int64_t)dot * q9(wscale, false) * q9(asb, false)) * 0x1p-20f;
    c = c * scale2;
    c = divide_by_inv ? c / inv : c * (1.0f / inv);
    return mu_f16_to_f32(mu_f32_to_f16(c));
}

/* Constructed cases where the contract's operation order is observable. */
static void test_w4a4_order_cases(void) {
    uint64_t rng = 0x0D3;
    uint8_t p[8];
    float x[16];
    /* amax * f32(1/6) vs amax / 6: find an f16 amax where the two differ by
     * one f32 ulp, and an inv that puts an E4M3 midpoint M (tie to the even,
     * lower code) between the two scaled results */
    int found6 = 0;
    const float mid = (mu_e4m3fn_to_f32(0x38) + mu_e4m3fn_to_f32(0x39)) * 0.5f;
    for (int trial = 0; trial < 100000 && found6 < 4; trial++) {
        const float amax = mu_f16_to_f32(mu_f32_to_f16(1.0f + (tu_rng_uniform(&rng) + 1.0f) * 500.0f));
        const float n_div = amax / 6.0f, n_mul = amax * (1.0f / 6.0f);
        if (n_div == n_mul) continue;
        float inv = mid / n_mul;
        for (int k = 0; k < 4 && !(n_div * inv <= mid && n_mul * inv > mid); k++) inv = nextafterf(inv, 1e9f);
        if (!(n_div * inv <= mid && n_mul * inv > mid)) continue;
        for (int i = 0; i < 8; i++) p[i] = (uint8_t)(tu_rng_next(&rng) | 0x11);
        for (int i = 0; i < 16; i++) x[i] = amax * tu_rng_uniform(&rng) * 0.9f;
        x[5] = -amax;
        const float want = w4a4_group_ref(p, 0x38, 1.0f, inv, x, false, false);
        if (want == w4a4_group_ref(p, 0x38, 1.0f, inv, x, true, false)) continue;
        CHECK_BITS_F32(mu_nvfp4_w4a4_dot(p, (const uint8_t[]){0x38}, 1.0f, inv, x, 16), want);
        found6++;
    }
    CHECK_MSG(found6 == 4, "found only %d cases separating amax*(1/6) from amax/6", found6);
    /* s * (1/inv) vs s / inv: random groups until the f16 results differ */
    int found_inv = 0;
    for (int trial = 0; trial < 2000000 && found_inv < 3; trial++) {
        for (int i = 0; i < 8; i++) p[i] = (uint8_t)tu_rng_next(&rng);
        for (int i = 0; i < 16; i++) x[i] = tu_rng_uniform(&rng);
        const uint8_t ws = (uint8_t)(0x30 + tu_rng_next(&rng) % 16);
        const float scale2 = 1.0f + tu_rng_uniform(&rng) * 0.5f, inv = 300.0f * (1.5f + tu_rng_uniform(&rng));
        const float want = w4a4_group_ref(p, ws, scale2, inv, x, false, false);
        if (want == w4a4_group_ref(p, ws, scale2, inv, x, false, true)) continue;
        CHECK_BITS_F32(mu_nvfp4_w4a4_dot(p, &ws, scale2, inv, x, 16), want);
        found_inv++;
    }
    CHECK_MSG(found_inv == 3, "found only %d cases separating s*(1/inv) from s/inv", found_inv);
}

static void test_nvfp4_w4a4(void) {
    uint64_t rng = 0xA4A4;
    uint8_t payload[N_IN / 2 * N_OUT], scales[N_IN / 16 * N_OUT];
    float scale2, x[N_IN], wd[N_IN], xa[N_IN];
    for (int rep = 0; rep < 3; rep++) {
        nvfp4_native_fixture(payload, scales, &scale2, &rng);
        fill_activations(x, &rng);
        for (int i = 0; i < 16; i++) x[32 + i] = 0.0f; /* one all-zero group: zero scale path */
        float amax = 0;
        for (int i = 0; i < N_IN; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float inv = (6.0f * 448.0f) / amax * (rep == 2 ? 1e-3f : 1.0f);
        mu_weight w = {.name = "nv", .type = MU_TYPE_NVFP4_E2M1, .data = payload, .nvfp4_scales = scales,
                       .scale = scale2, .input_scale_inv = inv, .n_in = N_IN, .n_out = N_OUT,
                       .row_bytes = N_IN / 2};
        mu_error err;
        CHECK_MSG(mu_weight_check(&w, &err), "%s", err.msg);
        CHECK(!mu_weight_uses_q8k(&w, NULL));
        for (int r = 0; r < N_OUT; r++) {
            const uint8_t *p = payload + r * N_IN / 2, *s = scales + r * N_IN / 16;
            int64_t sum = 0;
            for (int g = 0; g < N_IN / 16; g++) {
                uint8_t ac[16];
                uint8_t asb = w4a4_quant_group(x + 16 * g, inv, ac);
                int dot = 0;
                for (int i = 0; i < 16; i++) {
                    int v = 16 * g + i;
                    int wc = v & 1 ? p[v / 2] >> 4 : p[v / 2] & 15;
                    dot += q1(wc) * q1(ac[i]);
                    xa[v] = mu_e2m1_to_f32(ac[i]) * mu_e4m3fn_to_f32(asb) / inv;
                }
                sum += (int64_t)dot * q9(s[g], false) * q9(asb, false);
            }
            float c = (float)sum * 0x1p-20f;
            c = c * scale2;
            c = c * (1.0f / inv);
            float want = mu_f16_to_f32(mu_f32_to_f16(c));
            float got = mu_weight_dot_row(&w, r, x, NULL);
            CHECK_MSG(mu_f32_bits(got) == mu_f32_bits(want), "W4A4 row %d: %a vs %a", r, (double)got,
                      (double)want);
            CHECK(got != 0.0f);
            mu_weight_dequant_row(&w, r, wd);
            check_close("NVFP4 W4A4", got, wd, xa, N_IN, 1e-3);
        }
    }
}

/* ------------------------------------------- dequantization, bitwise */

static float ue4m3_ref(uint8_t b) { /* ggml: 0x00 and 0x7F are zero, bit 7 ignored */
    if (b == 0 || b == 0x7F) return 0.0f;
    int e = (b >> 3) & 15, m = b & 7;
    return (float)(e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10));
}
static float e2m1_ref(int code) { return (float)q1(code) * 0.5f * ((code == 8) ? -1.0f : 1.0f); }

/* Expected value i of a 256-value block at b under the written formulas. */
static float dequant_ref(uint32_t type, const uint8_t *b, int i) {
    int sc, m;
    switch (type) {
    case MU_TYPE_Q4_K:
    case MU_TYPE_Q5_K:
        scale_min(b + 4, i / 32, &sc, &m);
        return (f16le(b) * (float)sc) * (float)(type == MU_TYPE_Q4_K ? code_q4k(b, i) : code_q5k(b, i)) -
               f16le(b + 2) * (float)m;
    case MU_TYPE_Q6_K:
        return (f16le(b + 208) * (float)(int8_t)b[192 + i / 16]) * (float)code_q6k(b, i);
    case MU_TYPE_Q8_0:
        return (float)(int8_t)b[34 * (i / 32) + 2 + i % 32] * f16le(b + 34 * (i / 32));
    case MU_TYPE_Q4_0: {
        const uint8_t *blk = b + 18 * (i / 32);
        int r = i % 32, nib = r < 16 ? blk[2 + r] & 15 : blk[2 + r - 16] >> 4;
        return (float)(nib - 8) * f16le(blk);
    }
    default: /* ggml NVFP4 */
        return e2m1_ref(code_nvfp4_ggml(b, i)) * ue4m3_ref(b[36 * (i / 64) + (i % 64) / 16]);
    }
}

static void test_dequant_bitwise(void) {
    const uint32_t types[] = {MU_TYPE_Q4_K, MU_TYPE_Q5_K, MU_TYPE_Q6_K,
                              MU_TYPE_Q8_0, MU_TYPE_Q4_0, MU_TYPE_NVFP4};
    uint64_t rng = 0xDE0;
    float y[N_IN];
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint64_t row_bytes;
        mu_type_row_bytes(types[t], N_IN, &row_bytes);
        uint8_t *data = malloc(row_bytes * N_OUT);
        for (int rep = 0; rep < 20; rep++) {
            randomize_bytes(types[t], data, row_bytes * N_OUT, &rng);
            mu_type_get(types[t])->dequantize(data, y, N_IN);
            int bad = 0;
            for (int i = 0; i < N_IN; i++) {
                const uint8_t *blk = data + (i / 256) * (row_bytes / NB);
                bad += mu_f32_bits(y[i]) != mu_f32_bits(dequant_ref(types[t], blk, i % 256));
            }
            CHECK_MSG(bad == 0, "%s: %d values differ from the written formula", mu_type_name(types[t]), bad);
        }
        free(data);
    }
    /* native: (e2m1 * e4m3fn) * scale2 with a scale2 that is not a power of two */
    uint8_t payload[N_IN / 2], scales[N_IN / 16];
    for (int rep = 0; rep < 20; rep++) {
        for (int i = 0; i < N_IN / 2; i++) payload[i] = (uint8_t)tu_rng_next(&rng);
        for (int i = 0; i < N_IN / 16; i++) {
            scales[i] = (uint8_t)tu_rng_next(&rng);
            if ((scales[i] & 0x7F) == 0x7F) scales[i] = 0x38;
        }
        const float scale2 = 0.0137f * (1.0f + tu_rng_uniform(&rng) * 0.5f);
        mu_nvfp4_dequant_row(payload, scales, scale2, y, N_IN);
        int bad = 0;
        for (int i = 0; i < N_IN; i++) {
            int code = i & 1 ? payload[i / 2] >> 4 : payload[i / 2] & 15;
            float mag = (float)(q9(scales[i / 16] & 0x7F, false) * ldexp(1.0, -9));
            float s = (scales[i / 16] & 0x80) ? -mag : mag; /* 0x80 is -0.0 */
            float want = (e2m1_ref(code) * s) * scale2;
            bad += mu_f32_bits(y[i]) != mu_f32_bits(want);
        }
        CHECK_MSG(bad == 0, "native NVFP4: %d values differ from (e2m1 * e4m3) * scale2", bad);
    }
}

/* Many short rows: the f16 output boundary hides most single-ulp slips of
 * the epilogue, so only volume exposes a wrong operation order. */
static void test_nvfp4_epilogue_volume(void) {
    enum { ROWS = 30000 };
    uint64_t rng = 0xE91;
    uint8_t *payload = malloc(ROWS * 128), *scales = malloc(ROWS * 16);
    float w[256], x[256];
    int bad4 = 0, bad16 = 0;
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < 256; i++) w[i] = tu_rng_uniform(&rng) * tu_rng_uniform(&rng);
        for (int i = 0; i < 256; i++) x[i] = tu_rng_uniform(&rng) * 3.0f;
        const float scale2 = mu_nvfp4_tensor_scale2(w, 256) * (1.0f + tu_rng_uniform(&rng) * 0.3f);
        mu_nvfp4_quantize_row(w, payload + 128 * r, scales + 16 * r, scale2, 256);
        const float inv = 100.0f * (1.5f + tu_rng_uniform(&rng));
        const uint8_t *p = payload + 128 * r, *s = scales + 16 * r;
        /* W4A4 over the first 16 values */
        uint8_t ac[16];
        uint8_t asb = w4a4_quant_group(x, inv, ac);
        int dot = 0;
        for (int i = 0; i < 16; i++) dot += q1(i & 1 ? p[i / 2] >> 4 : p[i / 2] & 15) * q1(ac[i]);
        float c = (float)((int64_t)dot * q9(s[0], false) * q9(asb, false)) * 0x1p-20f;
        c = c * scale2;
        c = c * (1.0f / inv);
        bad4 += mu_f32_bits(mu_nvfp4_w4a4_dot(p, s, scale2, inv, x, 16)) != mu_f32_bits(mu_round_f16(c));
        /* W4A16 over one block */
        mu_block_q8k xq;
        mu_quantize_q8k(x, &xq, 256, true);
        int64_t itotal = 0;
        for (int g = 0; g < 16; g++) {
            int gd = 0;
            for (int i = 16 * g; i < 16 * g + 16; i++)
                gd += q1(i & 1 ? p[i / 2] >> 4 : p[i / 2] & 15) * xq.qs[i];
            itotal += gd * q9(s[g], false);
        }
        float f = (((float)itotal * 0x1p-10f) * xq.d) * scale2;
        mu_weight wv = {.name = "v", .type = MU_TYPE_NVFP4_E2M1, .data = p, .nvfp4_scales = s,
                        .scale = scale2, .n_in = 256, .n_out = 1, .row_bytes = 128};
        bad16 += mu_f32_bits(mu_weight_dot_row(&wv, 0, x, &xq)) != mu_f32_bits(mu_round_f16(0.0f + f));
    }
    CHECK_MSG(bad4 == 0, "W4A4: %d of %d rows differ", bad4, ROWS);
    CHECK_MSG(bad16 == 0, "W4A16: %d of %d rows differ", bad16, ROWS);
    free(payload), free(scales);
}

/* --------------------------------------------------------- float types */

static float written_32_lane(const float *a, const float *b, int64_t n) {
    float p[32];
    for (int l = 0; l < 32; l++) p[l] = 0.0f;
    for (int64_t i = 0; i < n; i++) p[i % 32] = fmaf(a[i], b[i], p[i % 32]);
    for (int h = 16; h > 0; h >>= 1)
        for (int l = 0; l < h; l++) p[l] = p[l] + p[l + h];
    return p[0];
}

static void test_float_types(void) {
    uint64_t rng = 0xF10A7;
    const uint32_t types[3] = {MU_TYPE_F32, MU_TYPE_F16, MU_TYPE_BF16};
    const int64_t lens[4] = {N_IN, 1000, 37, 5};
    float x[N_IN], wsrc[N_IN], wd[N_IN];
    uint8_t data[N_IN * 4 * N_OUT];
    for (int t = 0; t < 3; t++)
        for (int li = 0; li < 4; li++) {
            const int64_t n = lens[li];
            const uint64_t row_bytes = (uint64_t)n * mu_type_get(types[t])->block_bytes;
            for (int r = 0; r < N_OUT; r++) {
                for (int i = 0; i < n; i++) wsrc[i] = tu_rng_normal(&rng) * 0.05f;
                mu_quantize_row(types[t], wsrc, data + r * row_bytes, n);
            }
            fill_activations(x, &rng);
            mu_weight w = {.name = "f", .type = types[t], .data = data, .scale = 1.0f, .n_in = n,
                           .n_out = N_OUT, .row_bytes = row_bytes};
            mu_error err;
            CHECK_MSG(mu_weight_check(&w, &err), "%s", err.msg);
            CHECK(!mu_weight_uses_q8k(&w, NULL));
            for (int r = 0; r < N_OUT; r++) {
                mu_weight_dequant_row(&w, r, wd);
                float got = mu_weight_dot_row(&w, r, x, NULL);
                float want = written_32_lane(wd, x, n);
                CHECK_MSG(mu_f32_bits(got) == mu_f32_bits(want), "%s n=%lld row %d: %a vs %a",
                          mu_type_name(types[t]), (long long)n, r, (double)got, (double)want);
                check_close(mu_type_name(types[t]), got, wd, x, n, 1e-6);
                w.has_scale = true, w.scale = 3.0f;
                CHECK_BITS_F32(mu_weight_dot_row(&w, r, x, NULL), want * 3.0f);
                w.has_scale = false, w.scale = 1.0f;
            }
        }
    /* the shared helpers follow the same order */
    for (int li = 0; li < 4; li++) {
        const int64_t n = lens[li];
        for (int i = 0; i < n; i++) wsrc[i] = tu_rng_normal(&rng);
        fill_activations(x, &rng);
        CHECK_BITS_F32(mu_dot_f32(wsrc, x, n), written_32_lane(wsrc, x, n));
        CHECK_BITS_F32(mu_sumsq_f32(x, n), written_32_lane(x, x, n));
        check_close("mu_dot_f32", mu_dot_f32(wsrc, x, n), wsrc, x, n, 1e-6);
    }
    /* a plain sequential sum is a different order, and usually different bits */
    int differs = 0;
    for (int rep = 0; rep < 20; rep++) {
        fill_activations(x, &rng);
        float seq = 0.0f;
        for (int i = 0; i < N_IN; i++) seq = fmaf(x[i], x[i], seq);
        differs += mu_f32_bits(seq) != mu_f32_bits(mu_sumsq_f32(x, N_IN));
    }
    CHECK(differs > 0);
}

int main(void) {
    test_q8k_format(MU_TYPE_Q4_K, fb_q4k, false);
    test_q8k_format(MU_TYPE_Q5_K, fb_q5k, true);
    test_q8k_format(MU_TYPE_Q6_K, fb_q6k, false);
    test_q8k_format(MU_TYPE_Q8_0, fb_q8_0, false);
    test_q8k_format(MU_TYPE_Q4_0, fb_q4_0, false);
    test_q8k_format(MU_TYPE_NVFP4, fb_nvfp4_ggml, true);
    test_nvfp4_w4a16();
    test_nvfp4_w4a4();
    test_w4a4_order_cases();
    test_dequant_bitwise();
    test_nvfp4_epilogue_volume();
    test_float_types();
    TEST_MAIN_END();
}
