/* NVFP4 in its two layouts.
 *
 * Native (types 1000 + 1001, docs/model.md): per row n/2 payload bytes, value 2p
 * in the low nibble of byte p and value 2p+1 in the high nibble; n/16 E4M3FN
 * scale bytes in a companion tensor; one f32 scale2 per tensor.
 *   value = (e2m1(code) * e4m3fn(scale)) * scale2           (pinned order)
 *
 * ggml (type 40): 36-byte blocks of 64 values {d[4] UE4M3, qs[32]}; in
 * sub-block s, qs[8s+j] holds value 16s+j (low nibble) and 16s+j+8 (high).
 *   value = e2m1(code) * ue4m3(d[s])   (UE4M3: sign bit ignored, 0x7F -> 0)
 *
 * Dot with one Q8_K super-block (16 groups of 16 values, exact in int64):
 *   itotal = sum_g (sum_{16} e2m1_q1(code) * q_x) * q9(scale_g)
 *   f_b    = ((float)itotal * 0x1p-10f) * xd     (q1 * q9 units = 2^-10)
 * The per-tensor factors (native scale2, ggml `.scale`) and the f16 output
 * rounding of the native lane are applied by mu_weight_dot_row. */
#include "quant/quant_internal.h"
#include <math.h>

static uint8_t signed_zero_code(float x) { return (mu_f32_bits(x) >> 31) ? 8 : 0; }

static float amax16(const float *x) {
    float a = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > a) a = fabsf(x[i]);
    return a;
}

/* ------------------------------------------------------------- native */

void mu_nvfp4_dequant_row(const uint8_t *payload, const uint8_t *scales, float scale2, float *dst,
                          int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint8_t code = (i & 1) ? payload[i / 2] >> 4 : payload[i / 2] & 0xF;
        dst[i] = (mu_e2m1_to_f32(code) * mu_e4m3fn_to_f32(scales[i / 16])) * scale2;
    }
}

float mu_nvfp4_tensor_scale2(const float *w, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(w[i]) > amax) amax = fabsf(w[i]);
    return amax > 0.0f ? amax / (6.0f * 448.0f) : 1.0f;
}

/* scale byte = e4m3fn_from_f32((amax16 / 6) / scale2);
 * code = e2m1_from_f32(x / (e4m3fn(scale byte) * scale2)), or a signed zero
 * when that denominator is zero (all-zero group, or scale2 not positive). */
void mu_nvfp4_quantize_row(const float *src, uint8_t *payload, uint8_t *scales, float scale2,
                           int64_t n) {
    const bool usable = scale2 > 0.0f && isfinite(scale2);
    for (int64_t g = 0; g < n / 16; g++) {
        const float *x = src + 16 * g;
        const uint8_t sb = usable ? mu_e4m3fn_from_f32((amax16(x) / 6.0f) / scale2) : 0;
        const float denom = usable ? mu_e4m3fn_to_f32(sb) * scale2 : 0.0f;
        scales[g] = sb;
        for (int p = 0; p < 8; p++) {
            uint8_t c[2];
            for (int k = 0; k < 2; k++) {
                float v = x[2 * p + k];
                c[k] = denom > 0.0f ? mu_e2m1_from_f32(v / denom) : signed_zero_code(v);
            }
            payload[8 * g + p] = (uint8_t)(c[0] | (c[1] << 4));
        }
    }
}

float mu_nvfp4_dot_q8k(const uint8_t *payload, const uint8_t *scales, const mu_block_q8k *x) {
    int64_t itotal = 0;
    for (int g = 0; g < 16; g++) {
        int32_t dot = 0;
        for (int p = 0; p < 8; p++) {
            const uint8_t byte = payload[8 * g + p];
            dot += mu_e2m1_q1(byte & 0xF) * x->qs[16 * g + 2 * p];
            dot += mu_e2m1_q1(byte >> 4) * x->qs[16 * g + 2 * p + 1];
        }
        itotal += (int64_t)dot * mu_e4m3fn_q9(scales[g]);
    }
    return ((float)itotal * 0x1p-10f) * x->d;
}

/* W4A4 activation group (the contract docs/numerics.md writes out, which
 * every backend must match): r = f32(f16(x)); amax = max|r|;
 * scale byte = e4m3fn_from_f32(min((amax * 0x1.555556p-3f) * inv, 448)),
 * 0x1.555556p-3f being 1/6 in f32; with s = e4m3fn(scale byte) and
 * t = |r| * inv, the code magnitude follows the E2M1 midpoints scaled by s:
 * t <= .25s -> 0, < .75s -> 1, <= 1.25s -> 2, < 1.75s -> 3, <= 2.5s -> 4,
 * < 3.5s -> 5, <= 5s -> 6, else 7; sign from r. s == 0: signed zeros. */
static uint8_t w4a4_activation_group(const float *x, float inv, uint8_t *code) {
    float r[16], amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        r[i] = mu_round_f16(x[i]);
        amax = fmaxf(amax, fabsf(r[i]));
    }
    const uint8_t sb = mu_e4m3fn_from_f32(fminf((amax * 0x1.555556p-3f) * inv, 448.0f));
    const float s = mu_e4m3fn_to_f32(sb);
    for (int i = 0; i < 16; i++)
        code[i] = signed_zero_code(r[i]) | (s != 0.0f ? qi_e2m1_magnitude_code(fabsf(r[i]) * inv, s) : 0);
    return sb;
}

/* sum(int64) = sum over groups of (sum q1_w * q1_a) * q9_w * q9_a;
 * result = f32(f16((((float)sum * 0x1p-20f) * scale2) * (1.0f / inv))). */
float mu_nvfp4_w4a4_dot(const uint8_t *payload, const uint8_t *scales, float scale2,
                        float input_scale_inv, const float *x, int64_t n) {
    int64_t sum = 0;
    for (int64_t g = 0; g < n / 16; g++) {
        uint8_t acode[16];
        const uint8_t asb = w4a4_activation_group(x + 16 * g, input_scale_inv, acode);
        int32_t dot = 0;
        for (int i = 0; i < 16; i++) {
            const uint8_t byte = payload[8 * g + i / 2];
            const uint8_t wcode = (i & 1) ? byte >> 4 : byte & 0xF;
            dot += mu_e2m1_q1(wcode) * mu_e2m1_q1(acode[i]);
        }
        sum += (int64_t)dot * mu_e4m3fn_q9(scales[g]) * mu_e4m3fn_q9(asb);
    }
    float s = (float)sum * 0x1p-20f;
    s = s * scale2;
    s = s * (1.0f / input_scale_inv);
    return mu_round_f16(s);
}

/* Payload-only traits of type 1000 (unit scale) and the scale type 1001. */
void qi_dequant_e2m1_codes(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mu_e2m1_to_f32((i & 1) ? p[i / 2] >> 4 : p[i / 2] & 0xF);
}

void qi_quant_e2m1_codes(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i + 1 < n; i += 2)
        p[i / 2] = (uint8_t)(mu_e2m1_from_f32(src[i]) | (mu_e2m1_from_f32(src[i + 1]) << 4));
}

void qi_dequant_e4m3fn(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mu_e4m3fn_to_f32(p[i]);
}

void qi_quant_e4m3fn(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) p[i] = mu_e4m3fn_from_f32(src[i]);
}

/* ---------------------------------------------------------------- ggml */

void qi_dequant_nvfp4_ggml(const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    for (int64_t b = 0; b < n / NVFP4G_ELEMS; b++, blk += NVFP4G_BYTES) {
        float *y = dst + b * NVFP4G_ELEMS;
        for (int s = 0; s < 4; s++) {
            const float d = mu_ue4m3_to_f32(blk[s]);
            for (int j = 0; j < 8; j++) {
                const uint8_t byte = blk[NVFP4G_QS + 8 * s + j];
                y[16 * s + j] = mu_e2m1_to_f32(byte & 0xF) * d;
                y[16 * s + j + 8] = mu_e2m1_to_f32(byte >> 4) * d;
            }
        }
    }
}

/* ggml's UE4M3 rounding (ggml_fp32_to_ue4m3) so our files match
 * llama-quantize byte for byte: non-positive -> 0, clamp at 448; normal
 * range keeps 3 mantissa bits rounding half up on bit 19 only; subnormal
 * range rounds x*512 half up and caps the mantissa at 7. */
static uint8_t ue4m3_from_f32_ggml(float x) {
    if (!(x > 0.0f)) return 0;
    if (x > 448.0f) x = 448.0f;
    const uint32_t bits = mu_f32_bits(x);
    int exp = (int)((bits >> 23) & 0xFF) - 127 + 7;
    if (exp <= 0) {
        int man = (int)(x * 512.0f + 0.5f);
        return (uint8_t)(man > 7 ? 7 : man);
    }
    int man = (int)((bits >> 20) & 7) + (int)((bits >> 19) & 1);
    if (man > 7) {
        man = 0;
        exp++;
    }
    if (exp >= 15) return 0x7E;
    return (uint8_t)((exp << 3) | man);
}

/* Nearest code by |e2m1(c) * d - x| over c = 0..15, first minimum wins. */
static uint8_t nearest_e2m1_code(float x, float d) {
    uint8_t best = 0;
    float best_err = fabsf(mu_e2m1_to_f32(0) * d - x);
    for (uint8_t c = 1; c < 16; c++) {
        const float err = fabsf(mu_e2m1_to_f32(c) * d - x);
        if (err < best_err) {
            best_err = err;
            best = c;
        }
    }
    return best;
}

void qi_quant_nvfp4_ggml(const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    for (int64_t b = 0; b < n / NVFP4G_ELEMS; b++, blk += NVFP4G_BYTES) {
        for (int s = 0; s < 4; s++) {
            const float *x = src + b * NVFP4G_ELEMS + 16 * s;
            const uint8_t ue = ue4m3_from_f32_ggml(amax16(x) / 6.0f);
            const float d = mu_ue4m3_to_f32(ue);
            blk[s] = ue;
            for (int j = 0; j < 8; j++)
                blk[NVFP4G_QS + 8 * s + j] =
                    (uint8_t)(nearest_e2m1_code(x[j], d) | (nearest_e2m1_code(x[j + 8], d) << 4));
        }
    }
}

float qi_dot_nvfp4_ggml(const void *w, const mu_block_q8k *x) {
    const uint8_t *blk = w;
    int64_t itotal = 0;
    for (int b = 0; b < MU_QK_K / NVFP4G_ELEMS; b++, blk += NVFP4G_BYTES) {
        for (int s = 0; s < 4; s++) {
            const int8_t *q = x->qs + NVFP4G_ELEMS * b + 16 * s;
            int32_t dot = 0;
            for (int j = 0; j < 8; j++) {
                const uint8_t byte = blk[NVFP4G_QS + 8 * s + j];
                dot += mu_e2m1_q1(byte & 0xF) * q[j];
                dot += mu_e2m1_q1(byte >> 4) * q[j + 8];
            }
            itotal += (int64_t)dot * qi_ue4m3_q9(blk[s]);
        }
    }
    return ((float)itotal * 0x1p-10f) * x->d;
}
