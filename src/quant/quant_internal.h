/* Internals shared by the block-format sources of src/quant/. Weight bytes
 * come straight from a file mapping, so every multi-byte field is read with
 * explicit little-endian byte loads (no struct casts, no alignment needs). */
#ifndef MUSER_QUANT_INTERNAL_H
#define MUSER_QUANT_INTERNAL_H
#include "quant/quant.h"

/* Byte layouts (offsets inside one block). */
enum {
    Q4_0_BYTES = 18, Q4_0_QS = 2,                 /* d f16 | qs[16] */
    Q8_0_BYTES = 34, Q8_0_QS = 2,                 /* d f16 | qs[32] int8 */
    QK_SCALES = 4, QK_SCALE_BYTES = 12,           /* Q4_K/Q5_K: d | dmin | scales[12] */
    Q4_K_BYTES = 144, Q4_K_QS = 16,
    Q5_K_BYTES = 176, Q5_K_QH = 16, Q5_K_QS = 48,
    Q6_K_BYTES = 210, Q6_K_QH = 128, Q6_K_SC = 192, Q6_K_D = 208,
    Q8_K_BYTES = 292,
    NVFP4G_BYTES = 36, NVFP4G_ELEMS = 64, NVFP4G_QS = 4, /* d[4] UE4M3 | qs[32] */
};

static inline uint16_t qi_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void qi_wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline float qi_rd_f16(const uint8_t *p) { return mu_f16_to_f32(qi_rd16(p)); }

/* Round to nearest, ties to even, by the magic-number trick (|v| < 2^22):
 * adding 1.5*2^23 leaves the rounded integer in the low mantissa bits. */
static inline int32_t qi_nearest(float v) {
    float t = v + 12582912.0f;
    return (int32_t)(mu_f32_bits(t) & 0x7FFFFF) - 0x400000;
}
static inline int32_t qi_clamp(int32_t v, int32_t lo, int32_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}
/* Nearest integer in [lo, hi] for any float (NaN gives lo); the clamp comes
 * first so qi_nearest never sees a value outside its range. */
static inline int32_t qi_round_clamp(float v, int32_t lo, int32_t hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    return qi_nearest(v);
}

/* Q4_K/Q5_K 6-bit scale/min pair of sub-block j (0..7). */
static inline void qi_scale_min_k4(const uint8_t *s, int j, int32_t *sc, int32_t *m) {
    if (j < 4) {
        *sc = s[j] & 0x3F;
        *m = s[j + 4] & 0x3F;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* E2M1 magnitude code of a >= 0 against the midpoints scaled by s > 0. */
uint8_t qi_e2m1_magnitude_code(float a, float s);
/* UE4M3 (ggml NVFP4 block scale) as an exact integer in units of 2^-9. */
int32_t qi_ue4m3_q9(uint8_t b);

/* Per-format kernels (256-value super-block dots return that block's f_b). */
void qi_dequant_q4_0(const void *src, float *dst, int64_t n);
void qi_quant_q4_0(const float *src, void *dst, int64_t n);
float qi_dot_q4_0(const void *w, const mu_block_q8k *x);
void qi_dequant_q8_0(const void *src, float *dst, int64_t n);
void qi_quant_q8_0(const float *src, void *dst, int64_t n);
float qi_dot_q8_0(const void *w, const mu_block_q8k *x);

void qi_dequant_q4_k(const void *src, float *dst, int64_t n);
void qi_quant_q4_k(const float *src, void *dst, int64_t n);
float qi_dot_q4_k(const void *w, const mu_block_q8k *x);
void qi_dequant_q5_k(const void *src, float *dst, int64_t n);
void qi_quant_q5_k(const float *src, void *dst, int64_t n);
float qi_dot_q5_k(const void *w, const mu_block_q8k *x);
void qi_dequant_q6_k(const void *src, float *dst, int64_t n);
void qi_quant_q6_k(const float *src, void *dst, int64_t n);
float qi_dot_q6_k(const void *w, const mu_block_q8k *x);

void qi_dequant_nvfp4_ggml(const void *src, float *dst, int64_t n);
void qi_quant_nvfp4_ggml(const float *src, void *dst, int64_t n);
float qi_dot_nvfp4_ggml(const void *w, const mu_block_q8k *x);
void qi_dequant_e2m1_codes(const void *src, float *dst, int64_t n);
void qi_quant_e2m1_codes(const float *src, void *dst, int64_t n);
void qi_dequant_e4m3fn(const void *src, float *dst, int64_t n);
void qi_quant_e4m3fn(const float *src, void *dst, int64_t n);

#endif
