/* AVX-512 VNNI kernel for Q4_K weights in the X16 layout (cpu_repack.h),
 * 1-8 activation rows: decode and short verify batches. Lane r of every
 * vector is weight row 16g + r; a 512-bit load of the group block gives one
 * dword of 16 rows and `vpdpbusd` against a broadcast activation dword
 * advances 16 row sums at once, so there are no horizontal sums and the
 * weights are one stream.
 *
 * Exactness: each sub-block sum is an int32 computed exactly, scaled and
 * summed in int32 (exact: |sumi| < 2^31 by the format's ranges), then
 *   f_b = (d*xd)*(float)sumi - (dmin*xd)*(float)summ
 * lane-wise, the reference's formula, added to the row total in block
 * order. The high nibbles are used in place (byte & 0xF0 = 16 * code):
 * their scaled sums are exact multiples of 16, shifted down once per block.
 * Activation codes come in the order cpu_avx512_quant.c's quantizer writes
 * for Q4_K (32-value chunks in sub-block order 0 2 1 3 4 6 5 7).
 *
 * Q6_K: the 6-bit codes are rebuilt per dword from the low-nibble and
 * high-bit planes (four code dwords per qh dword), summed per 16-value
 * sub-block, offset by -32 * bsum and scaled in int32 (exact), then
 * f_b = (d*xd)*(float)sumi, the reference's formula. Activation codes are in
 * natural order for Q6_K. Q5_K is Q4_K plus the qh plane: each code dword
 * takes its fifth bit from the qh dword of the same values. */
#include "backend/cpu/cpu_simd_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_repack.h"
#include <string.h>

/* Rows per activation tile: 4 rows keep every accumulator in registers. */
#define X16_TILE 4
/* Software prefetch distance of the weight stream, in bytes (three Q4_K
 * group blocks, two of Q6_K: enough to cover DRAM latency). */
#define X16_PREFETCH 6912
#define Q4K_GROUP_BLOCK 2304 /* 16 x 144 bytes */
#define Q5K_GROUP_BLOCK 2816 /* 16 x 176 bytes */
#define Q6K_GROUP_BLOCK 3360 /* 16 x 210 bytes */

/* vpshufb control: byte j of each dword, zero-extended to the dword */
static inline __m512i byte_to_dword(int j) {
    const unsigned base = 0x80808000u | (unsigned)j;
    return _mm512_broadcast_i32x4(_mm_setr_epi32((int)base, (int)(base + 4), (int)(base + 8), (int)(base + 12)));
}

/* vpshufb control: byte j of each dword into the top bytes of both its
 * words (shifted down: the int16 pair (b_j, b_j)) */
static inline __m512i byte_to_word_pair(int j) {
    const unsigned base = 0x00800080u | (unsigned)j << 8 | (unsigned)j << 24;
    return _mm512_broadcast_i32x4(_mm_setr_epi32((int)base, (int)(base + 0x04000400u), (int)(base + 0x08000800u),
                                                 (int)(base + 0x0C000C00u)));
}

/* One prefetch per line: relying on the adjacent-line prefetcher for every
 * other line halved the single-thread stream on the Zen 5 VM (13 against
 * 26-27 GB/s, docs/benchmarks.md). always_inline: as a call, gcc's
 * local-pure-const pass found a function whose only effect is prefetching
 * "const" and deleted every call. */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *p, int bytes) {
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char *)p + X16_PREFETCH + l, _MM_HINT_T0);
}

static inline __m512i load_dw(const uint8_t *grp, int k) { return _mm512_loadu_si512(grp + 64 * k); }

static inline __m512i bcast(const int8_t *p) { return _mm512_set1_epi32((int)cpu_rd32((const uint8_t *)p)); }

/* Group block: dword 0 = (d, dmin), 1-3 = the 12 scale bytes, 4-35 = qs
 * (Q5_K: 4-11 = qh, 12-43 = qs). */
static const int K4_SLOT[8] = {0, 2, 1, 3, 4, 6, 5, 7}; /* sub-block -> 32-code slot of the activation */

/* The row totals of T activation rows, times the per-tensor scale if any. */
static inline __attribute__((always_inline)) void store_totals(const __m512 *total, int T, float *y, int64_t ys,
                                                                bool has_scale, float scale) {
    for (int t = 0; t < T; t++)
        _mm512_storeu_ps(y + t * ys, has_scale ? _mm512_mul_ps(total[t], _mm512_set1_ps(scale)) : total[t]);
}

/* A Q5_K code dword: the nibbles `nib` (low 4 bits of each byte) and bit
 * `bit` of each byte of the qh dword as bit 4. */
static inline __attribute__((always_inline)) __m512i with_high_bit(__m512i nib, __m512i qh, int bit, __m512i m0f, __m512i m10) {
    const __m512i h = bit < 4 ? _mm512_slli_epi32(qh, 4 - bit) : bit > 4 ? _mm512_srli_epi32(qh, bit - 4) : qh;
    return _mm512_ternarylogic_epi32(nib, _mm512_and_si512(h, m10), m0f, 0xE4); /* 0xE4: C ? A : B */
}

/* Q4_K and Q5_K (five): the same scales, mins and activation order; Q5_K
 * adds the qh plane (dwords 4-11, qs at 12-43) and its high nibbles are
 * shifted down rather than used in place (16 * a 5-bit code overflows a
 * byte). */
static inline __attribute__((always_inline)) void q45k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                             int64_t nbx, int T, float *y, int64_t ys,
                                                             bool has_scale, float scale, bool five) {
    const int group_block = five ? Q5K_GROUP_BLOCK : Q4K_GROUP_BLOCK, qs_dw = five ? 12 : 4;
    const __m512i m0f = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8((char)0xF0), m10 = _mm512_set1_epi8(0x10);
    const __m512i k3f = _mm512_set1_epi32(0x3F3F3F3F), k30 = _mm512_set1_epi32(0x30303030);
    __m512 total[X16_TILE];
    for (int t = 0; t < T; t++) total[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, grp += group_block) {
        prefetch_block(grp, group_block);
        /* the 6-bit scales and mins of 16 rows, as qi_scale_min_k4 unpacks them:
         * bytes 0-3 of sc[0] / mn[0] are those of sub-blocks 0-3, of sc[1] / mn[1] 4-7 */
        const __m512i s0 = load_dw(grp, 1), s1 = load_dw(grp, 2), s2 = load_dw(grp, 3);
        __m512i sc[2], mn[2];
        sc[0] = _mm512_and_si512(s0, k3f);
        mn[0] = _mm512_and_si512(s1, k3f);
        /* bits 4-5 from the high bits of bytes 0-3 / 4-7, bits 0-3 from bytes 8-11 (0xE4: C ? A : B) */
        sc[1] = _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(s0, 2), s2, k30, 0xE4), k3f);
        mn[1] = _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_srli_epi32(s1, 2), _mm512_srli_epi32(s2, 4), k30, 0xE4), k3f);
        __m512i slo[X16_TILE], shi[X16_TILE];
        for (int t = 0; t < T; t++) slo[t] = shi[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) { /* qs chunk c: sub-blocks 2c (low nibbles), 2c+1 (high) */
            const int off_lo = 32 * K4_SLOT[2 * c], off_hi = 32 * K4_SLOT[2 * c + 1];
            __m512i al[X16_TILE], ah[X16_TILE];
            for (int t = 0; t < T; t++) al[t] = ah[t] = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i lo[4], hi[4];
                for (int p = 0; p < 4; p++) {
                    const __m512i q = load_dw(grp, qs_dw + 8 * c + 4 * h + p);
                    if (five) {
                        const __m512i qh = load_dw(grp, 4 + 4 * h + p); /* bits 2c, 2c + 1: this chunk's codes */
                        lo[p] = with_high_bit(q, qh, 2 * c, m0f, m10);
                        hi[p] = with_high_bit(_mm512_srli_epi32(q, 4), qh, 2 * c + 1, m0f, m10);
                    } else {
                        lo[p] = _mm512_and_si512(q, m0f);
                        hi[p] = _mm512_and_si512(q, mf0); /* 16 * code */
                    }
                }
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[t * nbx + b].qs + 16 * h;
                    for (int p = 0; p < 4; p++) {
                        al[t] = _mm512_dpbusd_epi32(al[t], lo[p], bcast(xq + off_lo + 4 * p));
                        ah[t] = _mm512_dpbusd_epi32(ah[t], hi[p], bcast(xq + off_hi + 4 * p));
                    }
                }
            }
            const __m512i sl = _mm512_shuffle_epi8(sc[c >> 1], byte_to_dword((2 * c) & 3));
            const __m512i sh = _mm512_shuffle_epi8(sc[c >> 1], byte_to_dword((2 * c + 1) & 3));
            for (int t = 0; t < T; t++) {
                slo[t] = _mm512_add_epi32(slo[t], _mm512_mullo_epi32(al[t], sl));
                shi[t] = _mm512_add_epi32(shi[t], _mm512_mullo_epi32(ah[t], sh));
            }
        }
        /* summ = sum_j m_j (bsums[2j] + bsums[2j+1]): pairs (m_j, m_j) . (bsums[2j], bsums[2j+1]) */
        __m512i mp[8];
        for (int j = 0; j < 8; j++) mp[j] = _mm512_srli_epi16(_mm512_shuffle_epi8(mn[j >> 2], byte_to_word_pair(j & 3)), 8);
        const __m512i dd = load_dw(grp, 0);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        for (int t = 0; t < T; t++) {
            const mu_block_q8k *xb = x + t * nbx + b;
            __m512i summ = _mm512_setzero_si512();
            for (int j = 0; j < 8; j++) summ = _mm512_dpwssd_epi32(summ, mp[j], bcast((const int8_t *)(xb->bsums + 2 * j)));
            const __m512i sumi = _mm512_add_epi32(slo[t], five ? shi[t] : _mm512_srai_epi32(shi[t], 4));
            const __m512 xd = _mm512_set1_ps(xb->d);
            const __m512 f = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(sumi)),
                                           _mm512_mul_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(summ)));
            total[t] = _mm512_add_ps(total[t], f);
        }
    }
    store_totals(total, T, y, ys, has_scale, scale);
}

/* Group block: dwords 0-31 = ql, 32-47 = qh, 48-51 = the 16 int8 scales,
 * then the 16 rows' f16 d at byte 3328 (the X16 tail, 2 bytes per row).
 * In half n, l-dword i (values 4i..4i+3) with qh dword H, ql dwords A (ql[l])
 * and B (ql[l + 32]) gives the codes of values 128n + 32k + 4i, k = 0..3:
 *   k=0: A & 15 | (H << 4) & 48    k=1: B & 15 | (H << 2) & 48
 *   k=2: A >> 4 | H & 48           k=3: B >> 4 | (H >> 2) & 48
 * which lie in sub-block 8n + 2k + i / 4. */
static inline __attribute__((always_inline)) void q6k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                            int64_t nbx, int T, float *y, int64_t ys,
                                                            bool has_scale, float scale) {
    const __m512i m0f = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 total[X16_TILE];
    for (int t = 0; t < T; t++) total[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, grp += Q6K_GROUP_BLOCK) {
        prefetch_block(grp, Q6K_GROUP_BLOCK);
        __m512i sumi[X16_TILE];
        for (int t = 0; t < T; t++) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++)
#pragma GCC unroll 2
            for (int ih = 0; ih < 2; ih++) {
                __m512i acc[X16_TILE][4];
                for (int t = 0; t < T; t++)
                    for (int k = 0; k < 4; k++) acc[t][k] = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int i = 4 * ih; i < 4 * ih + 4; i++) {
                    const __m512i h = load_dw(grp, 32 + 8 * n + i), a = load_dw(grp, 16 * n + i), bq = load_dw(grp, 16 * n + 8 + i);
                    __m512i c[4]; /* 0xE4: C ? A : B, low nibble from ql, bits 4-5 from qh */
                    c[0] = _mm512_ternarylogic_epi32(a, _mm512_and_si512(_mm512_slli_epi32(h, 4), m30), m0f, 0xE4);
                    c[1] = _mm512_ternarylogic_epi32(bq, _mm512_and_si512(_mm512_slli_epi32(h, 2), m30), m0f, 0xE4);
                    c[2] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(a, 4), _mm512_and_si512(h, m30), m0f, 0xE4);
                    c[3] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(bq, 4), _mm512_and_si512(_mm512_srli_epi32(h, 2), m30), m0f, 0xE4);
                    for (int t = 0; t < T; t++) {
                        const int8_t *xq = x[t * nbx + b].qs + 128 * n + 4 * i;
                        for (int k = 0; k < 4; k++) acc[t][k] = _mm512_dpbusd_epi32(acc[t][k], c[k], bcast(xq + 32 * k));
                    }
                }
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const int sb = 8 * n + 2 * k + ih; /* sub-block; its scale is byte sb % 4 of dword 48 + sb / 4 */
                    const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(load_dw(grp, 48 + sb / 4), 24 - 8 * (sb % 4)), 24);
                    for (int t = 0; t < T; t++) {
                        const __m512i isum = _mm512_sub_epi32(acc[t][k], _mm512_set1_epi32(32 * x[t * nbx + b].bsums[sb]));
                        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(isum, sc));
                    }
                }
            }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp + 64 * 52)));
        for (int t = 0; t < T; t++) {
            const __m512 xd = _mm512_set1_ps(x[t * nbx + b].d);
            total[t] = _mm512_add_ps(total[t], _mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(sumi[t])));
        }
    }
    store_totals(total, T, y, ys, has_scale, scale);
}

static inline __attribute__((always_inline)) void q4k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                            int64_t nbx, int T, float *y, int64_t ys,
                                                            bool has_scale, float scale) {
    q45k_tile(grp, nb, x, nbx, T, y, ys, has_scale, scale, false);
}

static inline __attribute__((always_inline)) void q5k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                            int64_t nbx, int T, float *y, int64_t ys,
                                                            bool has_scale, float scale) {
    q45k_tile(grp, nb, x, nbx, T, y, ys, has_scale, scale, true);
}

#define TILE_CASES(fn)                                                                                          \
    switch (T) {                                                                                                \
    case 1: fn(grp, nb, xr, nb, 1, yr, w->n_out, w->has_scale, w->scale); break;                              \
    case 2: fn(grp, nb, xr, nb, 2, yr, w->n_out, w->has_scale, w->scale); break;                              \
    case 3: fn(grp, nb, xr, nb, 3, yr, w->n_out, w->has_scale, w->scale); break;                              \
    default: fn(grp, nb, xr, nb, 4, yr, w->n_out, w->has_scale, w->scale); break;                             \
    }

/* Output rows [o0, o1) (multiples of 16, inside the X16 groups) of a Q4_K,
 * Q5_K or Q6_K weight for `rows` activation rows. */
void mu_cpu_avx512_x16_matmul(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, int64_t rows, float *y) {
    const int64_t nb = w->n_in / MU_QK_K;
    const uint64_t bb = mu_cpu_pack_block_bytes(w);
    for (int64_t g = o0 / 16; g < o1 / 16; g++)
        for (int64_t r = 0; r < rows; r += X16_TILE) {
            const int T = rows - r < X16_TILE ? (int)(rows - r) : X16_TILE;
            const uint8_t *grp = mu_cpu_pack_at(w, bb, 16, g, 0);
            const mu_block_q8k *xr = xq + r * nb;
            float *yr = y + r * w->n_out + 16 * g;
            if (w->type == MU_TYPE_Q6_K) TILE_CASES(q6k_tile)
            else if (w->type == MU_TYPE_Q5_K) TILE_CASES(q5k_tile)
            else TILE_CASES(q4k_tile)
        }
}

#pragma GCC pop_options
#endif
