/* Q4_0 and Q8_0: 32-value blocks with one f16 scale.
 *   Q4_0 (18 B): d | qs[16]; y[i] = (qs[i] & 15) - 8) * d, y[i+16] = ((qs[i] >> 4) - 8) * d
 *   Q8_0 (34 B): d | qs[32] int8; y[i] = qs[i] * d
 * Dot with a Q8_K super-block (8 blocks of 32 per 256 values):
 *   isum_j = sum over block j of code * q_x   (Q4_0 code = nibble - 8)
 *   acc = 0; for j = 0..7: acc = acc + (d_j * xd) * (float)isum_j          */
#include "quant/quant_internal.h"
#include <math.h>

/* ---- Q4_0 ---- */

static void q4_0_codes(const uint8_t *blk, int32_t *code) {
    for (int i = 0; i < 16; i++) {
        code[i] = (blk[Q4_0_QS + i] & 0xF) - 8;
        code[i + 16] = (blk[Q4_0_QS + i] >> 4) - 8;
    }
}

void qi_dequant_q4_0(const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    for (int64_t b = 0; b < n / 32; b++, blk += Q4_0_BYTES) {
        int32_t code[32];
        q4_0_codes(blk, code);
        float d = qi_rd_f16(blk);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)code[i] * d;
    }
}

/* Code of a value already divided by d: truncate(v + 8.5), i.e. round half
 * up, clamped to 0..15 before any conversion. */
static int32_t q4_0_code(float v) {
    float t = v + 8.5f;
    if (!(t > 0.0f)) return 0;
    return t >= 15.0f ? 15 : (int32_t)t;
}

/* ggml's rule: max = signed value of largest magnitude, d = max / -8, so the
 * extreme value lands exactly on code 0 and the grid extends to +7 d. */
void qi_quant_q4_0(const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    for (int64_t b = 0; b < n / 32; b++, blk += Q4_0_BYTES) {
        const float *x = src + 32 * b;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                max = x[i];
            }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        qi_wr16(blk, mu_f32_to_f16(d));
        for (int i = 0; i < 16; i++)
            blk[Q4_0_QS + i] = (uint8_t)(q4_0_code(x[i] * id) | (q4_0_code(x[i + 16] * id) << 4));
    }
}

float qi_dot_q4_0(const void *w, const mu_block_q8k *x) {
    const uint8_t *blk = w;
    float acc = 0.0f;
    for (int j = 0; j < 8; j++, blk += Q4_0_BYTES) {
        int32_t code[32], isum = 0;
        q4_0_codes(blk, code);
        for (int i = 0; i < 32; i++) isum += code[i] * x->qs[32 * j + i];
        acc = acc + (qi_rd_f16(blk) * x->d) * (float)isum;
    }
    return acc;
}

/* ---- Q8_0 ---- */

void qi_dequant_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    for (int64_t b = 0; b < n / 32; b++, blk += Q8_0_BYTES) {
        float d = qi_rd_f16(blk);
        for (int i = 0; i < 32; i++) dst[32 * b + i] = (float)(int8_t)blk[Q8_0_QS + i] * d;
    }
}

/* ggml's rule: d = amax / 127, q = round-half-away(x / d). */
void qi_quant_q8_0(const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    for (int64_t b = 0; b < n / 32; b++, blk += Q8_0_BYTES) {
        const float *x = src + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        qi_wr16(blk, mu_f32_to_f16(d));
        for (int i = 0; i < 32; i++) {
            float v = x[i] * id;
            int32_t q = v >= 127.0f ? 127 : !(v > -127.0f) ? -127 : (int32_t)roundf(v);
            blk[Q8_0_QS + i] = (uint8_t)(int8_t)q;
        }
    }
}

float qi_dot_q8_0(const void *w, const mu_block_q8k *x) {
    const uint8_t *blk = w;
    float acc = 0.0f;
    for (int j = 0; j < 8; j++, blk += Q8_0_BYTES) {
        int32_t isum = 0;
        for (int i = 0; i < 32; i++) isum += (int8_t)blk[Q8_0_QS + i] * x->qs[32 * j + i];
        acc = acc + (qi_rd_f16(blk) * x->d) * (float)isum;
    }
    return acc;
}
