/* AVX-512 VNNI kernel for Q4_K, Q5_K and Q6_K weights in the X16 layout
 * (cpu_repack.h), any number of activation rows in tiles of up to 4. Lane r
 * of every vector is weight row 16g + r; a 512-bit load of the group block
 * gives one dword of 16 rows and `vpdpbusd` against a broadcast activation
 * dword advances 16 row sums at once, so there are no horizontal sums and
 * the weights are one stream.
 *
 * Exactness: every integer sum of a block is exact in int32 (|sumi| < 2^31
 * by the format's ranges), so its order and decomposition are free
 * (docs/numerics.md); then, lane-wise, the reference's formula
 *   Q4_K, Q5_K: f_b = (d*xd)*(float)sumi - (dmin*xd)*(float)summ
 *   Q6_K:       f_b = (d*xd)*(float)sumi
 * added to the row total in block order. Activation codes come in the order
 * cpu_avx512_quant.c's quantizer writes: for Q4_K and Q5_K 32-value chunks
 * in sub-block order 0 2 1 3 4 6 5 7, for Q6_K natural order.
 *
 * What the 4-row tile is bound by on Zen 5 (docs/benchmarks.md): vpdpbusd,
 * vpmulld, vpdpwssd and vmulps share two pipes, vector loads (broadcasts
 * included) two ports; other vector ops have two more pipes. Hence the
 * broadcasts as memory operands, the shuffles below and the int16 pair
 * products for the mins and the Q6_K offset. */
#include "backend/cpu/cpu_simd_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#if !defined(__clang__)
/* The tile loops at 64-byte boundaries: where gcc happened to place the
 * 4-row Q4_K loop, the same code ran 10 % slower. */
#pragma GCC optimize("align-loops=64")
#endif
#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_repack.h"
#include "util/common.h"
#include <stdlib.h>
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

/* One prefetch per line: relying on the adjacent-line prefetcher for every
 * other line halved the single-thread stream on the Zen 5 VM (13 against
 * 26-27 GB/s, docs/benchmarks.md). always_inline: as a call, gcc's
 * local-pure-const pass found a function whose only effect is prefetching
 * "const" and deleted every call. */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *p, int bytes) {
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char *)p + X16_PREFETCH + l, _MM_HINT_T0);
}

static inline __m512i load_dw(const uint8_t *grp, int k) { return _mm512_loadu_si512(grp + 64 * k); }

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

/* acc + w . (the activation dword at p in every lane): `vpdpbusd` with an
 * embedded broadcast operand. gcc 12 turns the intrinsic with
 * _mm512_set1_epi32 into a separate `vpbroadcastd`, which takes a vector
 * slot of its own (288 of the 1,187 instructions of a 4-row Q4_K group
 * block before). */
typedef uint32_t __attribute__((may_alias, aligned(1))) x16_u32;
static inline __attribute__((always_inline)) __m512i dpbusd_b(__m512i acc, __m512i w, const void *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const x16_u32 *)p));
    return acc;
}
/* A zeroed register by the zero idiom of its own (gcc copies one shared
 * zero register into each asm accumulator otherwise). */
static inline __attribute__((always_inline)) __m512i zero_reg(void) {
    __m512i z;
    __asm__ volatile("vpxord %0, %0, %0" : "=v"(z));
    return z;
}
/* Keep v in a register: its users read it there instead of each loading it.
 * On a running sum, it also makes the sum's update happen where the code
 * puts it: without it, gcc 12 deferred the scale multiplies of every
 * sub-block to the end of the group block and kept the raw sums on the
 * stack meanwhile (4-row tiles: 84 stack accesses per Q4_K and Q5_K group
 * block, 138 per Q6_K; with it 26, 28 and 20). */
static inline __attribute__((always_inline)) void in_register(__m512i *v) { __asm__("" : "+v"(*v)); }
/* The same for int16 pairs (`vpdpwssd`). */
static inline __attribute__((always_inline)) __m512i dpwssd_b(__m512i acc, __m512i w, const void *p) {
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const x16_u32 *)p));
    return acc;
}

/* vpshufb control: bytes j and j + 1 of each dword, zero-extended to its two
 * words */
static inline __m512i bytes_to_words(int j) {
    const unsigned base = 0x80008000u | (unsigned)j | (unsigned)(j + 1) << 16;
    return _mm512_broadcast_i32x4(_mm_setr_epi32((int)base, (int)(base + 0x00040004u), (int)(base + 0x00080008u),
                                                 (int)(base + 0x000C000Cu)));
}

/* vpshufb control: bytes j and j + 1 of each dword into the high bytes of its
 * two words (an arithmetic shift by 8 then sign-extends them) */
static inline __m512i bytes_to_word_highs(int j) {
    const unsigned base = 0x00800080u | (unsigned)j << 8 | (unsigned)(j + 1) << 24;
    return _mm512_broadcast_i32x4(_mm_setr_epi32((int)base, (int)(base + 0x04000400u), (int)(base + 0x08000800u),
                                                 (int)(base + 0x0C000C00u)));
}

/* Q4_K / Q5_K mins: summ = sum_j m_j (bsum[2j] + bsum[2j+1]) is taken as
 * four int16 pair products (m_2k, m_2k+1) . (s_2k, s_2k+1) with s_j =
 * bsum[2j] + bsum[2j+1] (|s_j| <= 32 * 128 fits an int16). x16_min_pairs
 * writes, for each activation row r and block b, the four dwords
 * s_2k | s_2k+1 << 16 at out[4 (r nb + b) + k]. */
static void x16_min_pairs(const mu_block_q8k *x, int64_t n, uint32_t *out) {
    for (int64_t i = 0; i < n; i++) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)x[i].bsums);
        const __m256i s = _mm256_madd_epi16(bs, _mm256_set1_epi16(1)); /* s_0 .. s_7 as int32 */
        _mm_storeu_si128((__m128i *)(out + 4 * i), _mm256_cvtepi32_epi16(s));
    }
}

/* Q4_K and Q5_K (five): the same scales, mins and activation order; Q5_K
 * adds the qh plane (dwords 4-11, qs at 12-43) and its high nibbles are
 * shifted down rather than used in place (16 * a 5-bit code overflows a
 * byte). Q4_K's high-nibble sums are 16 times the code sums, so its low
 * nibbles' scales are taken times 16 and one accumulator per row holds
 * 16 * sumi (|16 sumi| <= 16 * 8 * 63 * 32 * 15 * 127 < 2^31), shifted down
 * exactly once per block. pairs: x16_min_pairs of these rows. */
static inline __attribute__((always_inline)) void q45k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                             int64_t nbx, const uint32_t *pairs, int T, float *y,
                                                             int64_t ys, bool has_scale, float scale, bool five) {
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
        __m512i acc[X16_TILE];
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) { /* qs chunk c: sub-blocks 2c (low nibbles), 2c+1 (high) */
            const int off_lo = 32 * K4_SLOT[2 * c], off_hi = 32 * K4_SLOT[2 * c + 1];
            __m512i al[X16_TILE], ah[X16_TILE];
            for (int t = 0; t < T; t++) al[t] = zero_reg(), ah[t] = zero_reg();
#pragma GCC unroll 2
            for (int kq = 0; kq < 2; kq++) { /* code dwords 4kq .. 4kq+3 of the chunk: values 16kq .. 16kq+15 */
                __m512i lo[4], hi[4];
                for (int k = 0; k < 4; k++) {
                    __m512i q = load_dw(grp, qs_dw + 8 * c + 4 * kq + k);
                    if (five) {
                        const __m512i qh = load_dw(grp, 4 + 4 * kq + k); /* bits 2c, 2c + 1: this chunk's codes */
                        lo[k] = with_high_bit(q, qh, 2 * c, m0f, m10);
                        hi[k] = with_high_bit(_mm512_srli_epi32(q, 4), qh, 2 * c + 1, m0f, m10);
                    } else {
                        in_register(&q); /* one load for both nibbles */
                        lo[k] = _mm512_and_si512(q, m0f);
                        hi[k] = _mm512_and_si512(q, mf0); /* 16 * code */
                    }
                }
                for (int t = 0; t < T; t++) {
                    const int8_t *xq = x[t * nbx + b].qs + 16 * kq;
                    if (!five && T > 1) { /* the low nibbles' four activation dwords from one load */
                        const __m512i x4 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xq + off_lo)));
                        al[t] = _mm512_dpbusd_epi32(al[t], lo[0], _mm512_shuffle_epi32(x4, 0x00));
                        al[t] = _mm512_dpbusd_epi32(al[t], lo[1], _mm512_shuffle_epi32(x4, 0x55));
                        al[t] = _mm512_dpbusd_epi32(al[t], lo[2], _mm512_shuffle_epi32(x4, 0xAA));
                        al[t] = _mm512_dpbusd_epi32(al[t], lo[3], _mm512_shuffle_epi32(x4, 0xFF));
                    } else {
                        for (int k = 0; k < 4; k++) al[t] = dpbusd_b(al[t], lo[k], xq + off_lo + 4 * k);
                    }
                    for (int k = 0; k < 4; k++) ah[t] = dpbusd_b(ah[t], hi[k], xq + off_hi + 4 * k);
                }
            }
            __m512i sl = _mm512_shuffle_epi8(sc[c >> 1], byte_to_dword((2 * c) & 3));
            const __m512i sh = _mm512_shuffle_epi8(sc[c >> 1], byte_to_dword((2 * c + 1) & 3));
            if (!five) sl = _mm512_slli_epi32(sl, 4);
            for (int t = 0; t < T; t++) {
                acc[t] = _mm512_add_epi32(acc[t], _mm512_add_epi32(_mm512_mullo_epi32(al[t], sl), _mm512_mullo_epi32(ah[t], sh)));
                in_register(&acc[t]); /* scaled now, see above */
            }
        }
        __m512i mw[4]; /* (m_2k, m_2k+1) */
        for (int k = 0; k < 4; k++) mw[k] = _mm512_shuffle_epi8(mn[k >> 1], bytes_to_words(2 * (k & 1)));
        const __m512i dd = load_dw(grp, 0);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
        for (int t = 0; t < T; t++) {
            const uint32_t *pr = pairs + 4 * (t * nbx + b);
            __m512i summ = zero_reg();
            for (int k = 0; k < 4; k++) summ = dpwssd_b(summ, mw[k], pr + k);
            const __m512i sumi = five ? acc[t] : _mm512_srai_epi32(acc[t], 4);
            const __m512 xd = _mm512_set1_ps(x[t * nbx + b].d);
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
 * which lie in sub-block 8n + 2k + i / 4. The codes q are summed unsigned:
 *   sumi = sum_sb sc_sb (sum q x) - 32 sum_sb sc_sb bsum_sb
 * (the second sum as int16 pairs (sc_2j, sc_2j+1) . (bsum_2j, bsum_2j+1),
 * the bsums' own dwords; every partial sum below 2^31). Each quarter (n,
 * i / 4) runs in two passes, A's codes (k = 0, 2) then B's (k = 1, 3), to
 * keep 2 T accumulators in registers. */
static inline __attribute__((always_inline)) void q6k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                            int64_t nbx, int T, float *y, int64_t ys,
                                                            bool has_scale, float scale) {
    const __m512i m0f = _mm512_set1_epi8(0x0F), m33 = _mm512_set1_epi8(0x33), mcc = _mm512_set1_epi8((char)0xCC);
    __m512 total[X16_TILE];
    for (int t = 0; t < T; t++) total[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, grp += Q6K_GROUP_BLOCK) {
        prefetch_block(grp, Q6K_GROUP_BLOCK);
        __m512i sumi[X16_TILE];
        for (int t = 0; t < T; t++) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++)
#pragma GCC unroll 2
            for (int ih = 0; ih < 2; ih++)
#pragma GCC unroll 2
                for (int p = 0; p < 2; p++) { /* ql dwords A (p = 0) or B (p = 1): codes k = p and p + 2 */
                    __m512i acc[X16_TILE][2];
                    for (int t = 0; t < T; t++) acc[t][0] = zero_reg(), acc[t][1] = zero_reg();
#pragma GCC unroll 4
                    for (int i = 4 * ih; i < 4 * ih + 4; i++) {
                        __m512i q = load_dw(grp, 16 * n + 8 * p + i);
                        in_register(&q); /* one load for both codes */
                        /* qh bits 0-1 and 4-5 (A) or 2-3 and 6-7 (B): shifted to bits 4-5,
                         * the bits above them are zero (0xE4: C ? A : B, low nibble from ql) */
                        const __m512i hm = _mm512_and_si512(load_dw(grp, 32 + 8 * n + i), p ? mcc : m33);
                        const __m512i lo = _mm512_ternarylogic_epi32(q, _mm512_slli_epi32(hm, 4 - 2 * p), m0f, 0xE4);
                        const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi32(q, 4), p ? _mm512_srli_epi32(hm, 2) : hm, m0f, 0xE4);
                        for (int t = 0; t < T; t++) {
                            const int8_t *xq = x[t * nbx + b].qs + 128 * n + 4 * i;
                            acc[t][0] = dpbusd_b(acc[t][0], lo, xq + 32 * p);
                            acc[t][1] = dpbusd_b(acc[t][1], hi, xq + 32 * (p + 2));
                        }
                    }
#pragma GCC unroll 2
                    for (int j = 0; j < 2; j++) {
                        const int sb = 8 * n + 2 * (p + 2 * j) + ih; /* its scale: byte sb % 4 of dword 48 + sb / 4 */
                        const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(load_dw(grp, 48 + sb / 4), 24 - 8 * (sb % 4)), 24);
                        for (int t = 0; t < T; t++) {
                            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(acc[t][j], sc));
                            in_register(&sumi[t]); /* scaled now (q45k_tile) */
                        }
                    }
                }
        __m512i off[X16_TILE]; /* sum_sb sc_sb bsum_sb */
        for (int t = 0; t < T; t++) off[t] = zero_reg();
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i sw = _mm512_srai_epi16(_mm512_shuffle_epi8(load_dw(grp, 48 + j / 2), bytes_to_word_highs(2 * (j & 1))), 8);
            for (int t = 0; t < T; t++) off[t] = dpwssd_b(off[t], sw, x[t * nbx + b].bsums + 2 * j);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp + 64 * 52)));
        for (int t = 0; t < T; t++) {
            const __m512i si = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32(off[t], 5));
            const __m512 xd = _mm512_set1_ps(x[t * nbx + b].d);
            total[t] = _mm512_add_ps(total[t], _mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(si)));
        }
    }
    store_totals(total, T, y, ys, has_scale, scale);
}

/* One tile of T rows, each shape a function of its own (inlined into one
 * function, gcc unrolled them unevenly). */
typedef void (*x16_tile_fn)(const uint8_t *grp, int64_t nb, const mu_block_q8k *x, const uint32_t *pairs, float *y,
                            int64_t ys, bool has_scale, float scale);
#define X16_TILE_FN(name, T, kind)                                                                              \
    static __attribute__((noinline)) void name(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,          \
                                               const uint32_t *pairs, float *y, int64_t ys, bool has_scale,     \
                                               float scale) {                                                   \
        if (kind == 6) {                                                                                        \
            (void)pairs;                                                                                        \
            q6k_tile(grp, nb, x, nb, T, y, ys, has_scale, scale);                                               \
        } else {                                                                                                \
            q45k_tile(grp, nb, x, nb, pairs, T, y, ys, has_scale, scale, kind == 5);                            \
        }                                                                                                       \
    }
X16_TILE_FN(q4k_t1, 1, 4) X16_TILE_FN(q4k_t2, 2, 4) X16_TILE_FN(q4k_t3, 3, 4) X16_TILE_FN(q4k_t4, 4, 4)
X16_TILE_FN(q5k_t1, 1, 5) X16_TILE_FN(q5k_t2, 2, 5) X16_TILE_FN(q5k_t3, 3, 5) X16_TILE_FN(q5k_t4, 4, 5)
X16_TILE_FN(q6k_t1, 1, 6) X16_TILE_FN(q6k_t2, 2, 6) X16_TILE_FN(q6k_t3, 3, 6) X16_TILE_FN(q6k_t4, 4, 6)
/* [Q4_K, Q5_K, Q6_K][T - 1] */
static const x16_tile_fn X16_TILES[3][X16_TILE] = {
    {q4k_t1, q4k_t2, q4k_t3, q4k_t4}, {q5k_t1, q5k_t2, q5k_t3, q5k_t4}, {q6k_t1, q6k_t2, q6k_t3, q6k_t4}};

/* Output rows [o0, o1) (multiples of 16, inside the X16 groups) of a Q4_K,
 * Q5_K or Q6_K weight for `rows` activation rows: the rows in chunks whose
 * min pairs (Q4_K, Q5_K) fit a stack buffer, each chunk group by group, so
 * a group's weights stay in cache across its 4-row tiles. */
void mu_cpu_avx512_x16_matmul(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, int64_t rows, float *y) {
    const int64_t nb = w->n_in / MU_QK_K;
    const uint64_t bb = mu_cpu_pack_block_bytes(w);
    const int kind = w->type == MU_TYPE_Q4_K ? 0 : w->type == MU_TYPE_Q5_K ? 1 : 2;
    enum { PAIRS_BYTES = 32768 };
    uint32_t stack_pairs[PAIRS_BYTES / 4] __attribute__((aligned(64)));
    const bool mins = kind != 2;
    int64_t chunk = rows;
    if (mins && (uint64_t)rows * (uint64_t)nb * 16 > PAIRS_BYTES) {
        chunk = PAIRS_BYTES / 16 / nb / X16_TILE * X16_TILE;
        if (chunk < X16_TILE) chunk = X16_TILE;
    }
    uint32_t *pairs = !mins || (uint64_t)chunk * (uint64_t)nb * 16 <= PAIRS_BYTES ? stack_pairs
                                                                                 : mu_xmalloc((size_t)chunk * (size_t)nb * 16);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t r1 = rows - r0 < chunk ? rows : r0 + chunk;
        if (mins) x16_min_pairs(xq + r0 * nb, (r1 - r0) * nb, pairs);
        for (int64_t g = o0 / 16; g < o1 / 16; g++)
            for (int64_t r = r0; r < r1; r += X16_TILE) {
                const int T = r1 - r < X16_TILE ? (int)(r1 - r) : X16_TILE;
                X16_TILES[kind][T - 1](mu_cpu_pack_at(w, bb, 16, g, 0), nb, xq + r * nb, pairs + 4 * (r - r0) * nb,
                                       y + r * w->n_out + 16 * g, w->n_out, w->has_scale, w->scale);
            }
    }
    if (pairs != stack_pairs) free(pairs);
}

#pragma GCC pop_options
#endif
