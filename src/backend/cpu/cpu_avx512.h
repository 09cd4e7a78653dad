/* Helpers shared by the two AVX-512 kernel files. Include only after their
 * `#pragma GCC target("avx512f,...")` line: everything here is compiled for
 * that target and may only run after the CPUID check. */
#ifndef MUSER_CPU_AVX512_H
#define MUSER_CPU_AVX512_H
#include "backend/cpu/cpu_simd_common.h"
#include <immintrin.h>

static inline float f16_at(const uint8_t *p) { return _cvtsh_ss(qi_rd16(p)); }

static inline __mmask16 tail_mask(int64_t m) { return m >= 16 ? (__mmask16)0xFFFF : m <= 0 ? 0 : (__mmask16)((1u << m) - 1); }

/* Lane 4i + k <-> lane 4k + i (a 4x4 transpose of lane indices). */
static inline __m512i transpose4_idx(void) {
    return _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
}

/* 16x16 f32 transpose: r[j] lane i -> r[i] lane j. */
static inline void transpose16(__m512 *r) {
    __m512 a[16], b[16];
    for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* b[4i + c], 128-bit lane L: column 4L + c of rows 4i .. 4i+3 */
        b[4 * i] = _mm512_shuffle_ps(a[4 * i], a[4 * i + 2], 0x44);
        b[4 * i + 1] = _mm512_shuffle_ps(a[4 * i], a[4 * i + 2], 0xEE);
        b[4 * i + 2] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
        b[4 * i + 3] = _mm512_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        __m512 y0 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0x44), y1 = _mm512_shuffle_f32x4(b[c], b[4 + c], 0xEE);
        __m512 y2 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0x44), y3 = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], 0xEE);
        r[c] = _mm512_shuffle_f32x4(y0, y2, 0x88);
        r[4 + c] = _mm512_shuffle_f32x4(y0, y2, 0xDD);
        r[8 + c] = _mm512_shuffle_f32x4(y1, y3, 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(y1, y3, 0xDD);
    }
}

static inline void transpose16_epi32(__m512i *r) {
    __m512 f[16];
    for (int i = 0; i < 16; i++) f[i] = _mm512_castsi512_ps(r[i]);
    transpose16(f);
    for (int i = 0; i < 16; i++) r[i] = _mm512_castps_si512(f[i]);
}

/* The quantized-matmul half (cpu_avx512_quant.c). */
bool mu_cpu_avx512_q_supported(const mu_weight *w);
size_t mu_cpu_avx512_act_bytes(const mu_weight *w, int64_t rows);
void mu_cpu_avx512_quantize_rows(const mu_weight *w, const float *x, int64_t r0, int64_t r1, int64_t rows, void *act);
bool mu_cpu_avx512_blocks_only(const mu_weight *w, int64_t rows);
void mu_cpu_avx512_qmatmul(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y);
/* X16 weights (cpu_avx512_x16.c): any number of rows over whole groups [o0, o1). */
void mu_cpu_avx512_x16_matmul(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, int64_t rows, float *y);

#endif
