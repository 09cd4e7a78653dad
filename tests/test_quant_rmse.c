/* Quantization quality: quantize gaussian data, dequantize, report RMSE/std
 * for every format, and check that the searching K-quant quantizers beat a
 * plain min/max rounding quantizer (written here) by a clear margin. */
#include "quant/quant.h"
#include "testutil.h"
#include <math.h>
#include <stdlib.h>

enum { N = 256 * 256 };

static double rmse_over_std(const float *x, const float *y, int64_t n) {
    double se = 0, s2 = 0, mean = 0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        se += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        s2 += ((double)x[i] - mean) * ((double)x[i] - mean);
    }
    return sqrt(se / s2);
}

static double roundtrip(uint32_t type, const float *x, float *y, uint8_t *buf) {
    uint64_t bytes;
    CHECK(mu_type_row_bytes(type, N, &bytes));
    memset(buf, 0xA5, bytes);
    mu_quantize_row(type, x, buf, N);
    mu_type_get(type)->dequantize(buf, y, N);
    return rmse_over_std(x, y, N);
}

/* ------------------------------------------- plain min/max K-quant baseline */

static int nearest(float v, int lo, int hi) {
    float r = rintf(v);
    return r < lo ? lo : r > hi ? hi : (int)r;
}

/* Q4_K/Q5_K from min/max per 32-value sub-block, same 6-bit scale coding. */
static void plain_scale_min_block(const float *x, uint8_t *blk, int nmax, uint8_t *code) {
    float scale[8], offset[8], max_scale = 0, max_offset = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = x[32 * j];
        for (int i = 0; i < 32; i++) lo = fminf(lo, x[32 * j + i]), hi = fmaxf(hi, x[32 * j + i]);
        scale[j] = (hi - lo) / (float)nmax;
        offset[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]);
        max_offset = fmaxf(max_offset, offset[j]);
    }
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)nearest(63.0f / max_scale * scale[j], 0, 63);
        m[j] = (uint8_t)nearest(63.0f / max_offset * offset[j], 0, 63);
    }
    uint16_t d = mu_f32_to_f16(max_scale / 63.0f), dmin = mu_f32_to_f16(max_offset / 63.0f);
    blk[0] = (uint8_t)d, blk[1] = (uint8_t)(d >> 8), blk[2] = (uint8_t)dmin, blk[3] = (uint8_t)(dmin >> 8);
    mu_kquant_pack_scales(blk + 4, sc, m);
    for (int j = 0; j < 8; j++) {
        float dj = mu_f16_to_f32(d) * sc[j], mj = mu_f16_to_f32(dmin) * m[j];
        for (int i = 32 * j; i < 32 * j + 32; i++)
            code[i] = dj > 0 ? (uint8_t)nearest((x[i] + mj) / dj, 0, nmax) : 0;
    }
}

static void plain_q4k(const float *x, uint8_t *out) {
    for (int b = 0; b < N / 256; b++) {
        uint8_t *blk = out + 144 * b, code[256];
        plain_scale_min_block(x + 256 * b, blk, 15, code);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                blk[16 + 32 * g + l] = (uint8_t)(code[64 * g + l] | code[64 * g + 32 + l] << 4);
    }
}

static void plain_q5k(const float *x, uint8_t *out) {
    for (int b = 0; b < N / 256; b++) {
        uint8_t *blk = out + 176 * b, code[256];
        plain_scale_min_block(x + 256 * b, blk, 31, code);
        memset(blk + 16, 0, 32);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                uint8_t lo = code[64 * g + l], hi = code[64 * g + 32 + l];
                blk[48 + 32 * g + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                blk[16 + l] |= (uint8_t)((lo >> 4) << (2 * g) | (hi >> 4) << (2 * g + 1));
            }
    }
}

/* Q6_K with scale = max/-32 per 16 values (max = signed largest magnitude). */
static void plain_q6k(const float *x, uint8_t *out) {
    for (int b = 0; b < N / 256; b++) {
        const float *xb = x + 256 * b;
        uint8_t *blk = out + 210 * b, u[256];
        float scale[16], amax = 0, max_scale = 0;
        for (int s = 0; s < 16; s++) {
            float a = 0, mx = 0;
            for (int i = 0; i < 16; i++)
                if (fabsf(xb[16 * s + i]) > a) a = fabsf(xb[16 * s + i]), mx = xb[16 * s + i];
            scale[s] = mx / -32.0f;
            if (fabsf(scale[s]) > amax) amax = fabsf(scale[s]), max_scale = scale[s];
        }
        float iscale = -128.0f / max_scale;
        for (int s = 0; s < 16; s++) blk[192 + s] = (uint8_t)(int8_t)nearest(iscale * scale[s], -128, 127);
        uint16_t d = mu_f32_to_f16(1.0f / iscale);
        blk[208] = (uint8_t)d, blk[209] = (uint8_t)(d >> 8);
        for (int i = 0; i < 256; i++) {
            float ds = mu_f16_to_f32(d) * (int8_t)blk[192 + i / 16];
            u[i] = (uint8_t)(ds != 0 ? nearest(xb[i] / ds, -32, 31) + 32 : 32);
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *v = u + 128 * h;
                blk[64 * h + l] = (uint8_t)((v[l] & 15) | (v[l + 64] & 15) << 4);
                blk[64 * h + l + 32] = (uint8_t)((v[l + 32] & 15) | (v[l + 96] & 15) << 4);
                blk[128 + 32 * h + l] = (uint8_t)((v[l] >> 4) | (v[l + 32] >> 4) << 2 |
                                                  (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
            }
    }
}

/* ------------------------------------------------------------------ main */

int main(void) {
    uint64_t rng = 0x6A055;
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    uint8_t *buf = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) x[i] = tu_rng_normal(&rng) * 0.02f;

    /* bound = measured value plus about 3 % (deterministic data) */
    const struct { uint32_t type; double bound; } formats[] = {
        {MU_TYPE_F32, 0.0},       {MU_TYPE_F16, 2.2e-4},   {MU_TYPE_BF16, 1.75e-3},
        {MU_TYPE_Q8_0, 0.0055},   {MU_TYPE_Q4_0, 0.088},   {MU_TYPE_Q4_K, 0.072},
        {MU_TYPE_Q5_K, 0.0355},   {MU_TYPE_Q6_K, 0.0172},  {MU_TYPE_NVFP4, 0.106},
    };
    double measured[MU_TYPE_NVFP4 + 1] = {0};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        double r = roundtrip(formats[i].type, x, y, buf);
        measured[formats[i].type] = r;
        printf("%-12s RMSE/std = %.6f (bound %.4g)\n", mu_type_name(formats[i].type), r, formats[i].bound);
        CHECK_MSG(r <= formats[i].bound, "%s RMSE/std %.6f above %.4g", mu_type_name(formats[i].type), r,
                  formats[i].bound);
    }
    CHECK(measured[MU_TYPE_F32] == 0.0);

    /* native NVFP4 with the tensor-wide scale2 */
    uint8_t *scales = malloc(N / 16);
    float scale2 = mu_nvfp4_tensor_scale2(x, N);
    mu_nvfp4_quantize_row(x, buf, scales, scale2, N);
    mu_nvfp4_dequant_row(buf, scales, scale2, y, N);
    double r_native = rmse_over_std(x, y, N);
    printf("%-12s RMSE/std = %.6f (bound 0.098, scale2 %g)\n", "NVFP4_E2M1", r_native, (double)scale2);
    CHECK(r_native <= 0.098);
    /* ggml NVFP4 has no tensor scale: at sigma 0.02 its UE4M3 block scales
     * sit in the subnormal range; at sigma 1 they are normal */
    float *z = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) z[i] = x[i] * 50.0f;
    double r_ggml1 = roundtrip(MU_TYPE_NVFP4, z, y, buf);
    printf("%-12s RMSE/std = %.6f (bound 0.098, sigma 1)\n", "NVFP4", r_ggml1);
    CHECK(r_ggml1 <= 0.098);
    /* payload-only and scale-only traits at unit scale */
    for (int i = 0; i < N; i++) z[i] = x[i] * 100.0f;
    double r_e4m3 = roundtrip(MU_TYPE_F8_E4M3FN, z, y, buf);
    printf("%-12s RMSE/std = %.6f (bound 0.0273, unit scale, sigma 2)\n", "F8_E4M3FN", r_e4m3);
    CHECK(r_e4m3 <= 0.0273);
    double r_e2m1 = roundtrip(MU_TYPE_NVFP4_E2M1, z, y, buf);
    printf("%-12s RMSE/std = %.6f (bound 0.116, payload only at unit scale)\n", "E2M1 codes", r_e2m1);
    CHECK(r_e2m1 <= 0.116);

    /* searched K-quants against plain min/max rounding. The data and the
     * arithmetic are deterministic, so the required gains sit just under the
     * measured ones (10.4 %, 8.9 %, 10.3 %) as a regression guard: dropping
     * the scale search or the final-grid refinement falls below them. */
    const struct { uint32_t type; void (*plain)(const float *, uint8_t *); double min_gain; } kq[] = {
        {MU_TYPE_Q4_K, plain_q4k, 0.102}, {MU_TYPE_Q5_K, plain_q5k, 0.088}, {MU_TYPE_Q6_K, plain_q6k, 0.100},
    };
    for (size_t i = 0; i < sizeof kq / sizeof kq[0]; i++) {
        kq[i].plain(x, buf);
        mu_type_get(kq[i].type)->dequantize(buf, y, N);
        double plain = rmse_over_std(x, y, N), searched = measured[kq[i].type];
        double gain = 1.0 - searched / plain;
        printf("%-12s searched %.6f vs plain min/max %.6f: %.1f%% lower error\n", mu_type_name(kq[i].type),
               searched, plain, 100.0 * gain);
        CHECK_MSG(gain >= kq[i].min_gain, "%s search gains only %.1f%%", mu_type_name(kq[i].type),
                  100 * gain);
    }
    free(x), free(y), free(buf), free(scales), free(z);
    TEST_MAIN_END();
}
