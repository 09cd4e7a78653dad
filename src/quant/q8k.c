/* Q8_K activation quantizer: the integer side of every quantized weight dot.
 * Rule (ggml quantize_row_q8_K_ref, with the rounding written as one fmaf):
 *   max  = signed value of the first element whose |x| is strictly largest
 *   all-zero block: d = 0, qs = 0, bsums = 0
 *   iscale = -127 / max
 *   q[i] = min(127, (bits(fmaf(iscale, x[i], 0x1.8p23)) & 0x7FFFFF) - 0x400000)
 *   d = 1 / iscale; bsums[k] = sum of q[16k .. 16k+15]
 * via_f16 first replaces every x[i] by f32(f16(x[i])) (native NVFP4 W4A16).
 * Inputs must be finite and a non-zero max must be above ~4e-37 (so that
 * iscale is finite); activations always are. */
#include "quant/quant_internal.h"
#include <math.h>

_Static_assert(sizeof(mu_block_q8k) == Q8_K_BYTES, "Q8_K block must match the ggml layout");

static void quantize_block(const float *src, mu_block_q8k *y, bool via_f16) {
    float x[MU_QK_K];
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < MU_QK_K; i++) {
        x[i] = via_f16 ? mu_round_f16(src[i]) : src[i];
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            max = x[i];
        }
    }
    memset(y, 0, sizeof *y);
    if (amax == 0.0f) return;
    const float iscale = -127.0f / max;
    for (int i = 0; i < MU_QK_K; i++) {
        float t = fmaf(iscale, x[i], 12582912.0f);
        int32_t q = (int32_t)(mu_f32_bits(t) & 0x7FFFFF) - 0x400000;
        y->qs[i] = (int8_t)(q < 127 ? q : 127);
    }
    for (int k = 0; k < MU_QK_K / 16; k++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++) s += y->qs[16 * k + i];
        y->bsums[k] = (int16_t)s;
    }
    y->d = 1.0f / iscale;
}

void mu_quantize_q8k(const float *x, mu_block_q8k *y, int64_t n, bool via_f16) {
    for (int64_t b = 0; b < n / MU_QK_K; b++) quantize_block(x + b * MU_QK_K, y + b, via_f16);
}

void mu_dequantize_q8k(const mu_block_q8k *x, float *y, int64_t n) {
    for (int64_t b = 0; b < n / MU_QK_K; b++)
        for (int i = 0; i < MU_QK_K; i++) y[b * MU_QK_K + i] = x[b].d * (float)x[b].qs[i];
}
