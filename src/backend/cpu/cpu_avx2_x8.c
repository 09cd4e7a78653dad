/* AVX2 kernels for Q4_K, Q5_K and Q6_K weights in the X8 layout
 * (cpu_repack.h), any number of activation rows: decode, verify batches and
 * prefill. Lane r of every vector is weight row 8g + r; a 256-bit load of
 * the group block gives one dword of 8 rows, and `vpmaddubsw` against a
 * broadcast activation dword gives each row's two pair sums of those four
 * values, so there are no horizontal sums and the weights are one stream.
 * Without VNNI, the pair sums stay int16 for as many dwords as cannot
 * overflow (Q4_K 8: 8 x 2 x 15 x 127 = 30480; Q5_K 4: 31496; Q6_K 2:
 * 32004), then one `vpmaddwd` against the sub-block's scale (as an int16
 * pair) widens and scales them at once.
 *
 * Exactness: every integer sum is exact (|sumi| < 2^31 by the formats'
 * ranges) and order-free; the float part is the reference's formula
 *   Q4_K/Q5_K: f_b = (d*xd)*(float)sumi - (dmin*xd)*(float)summ
 *   Q6_K:      f_b = (d*xd)*(float)sumi, sumi = sum_s sc_s*(sum q*x - 32*bsum_s)
 * lane-wise, added to each row total in block order from 0.0f, then the
 * per-tensor scale. Activation codes are in the natural Q8_K order (the
 * AVX2 quantizer's). */
#include "backend/cpu/cpu_simd_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "backend/cpu/cpu_avx2.h"
#include "backend/cpu/cpu_repack.h"

/* Activation rows per register tile. */
#define X8_TILE 4
/* Activation rows whose blocks stay in L2 while a task's groups pass over them. */
#define X8_ROW_PANEL 64
/* Software prefetch distance of the weight stream, in bytes. */
#define X8_PREFETCH 8192
#define Q4K_GROUP_BLOCK 1152 /* 8 x 144 bytes */
#define Q5K_GROUP_BLOCK 1408 /* 8 x 176 bytes */
#define Q6K_GROUP_BLOCK 1680 /* 8 x 210 bytes */

static inline __m256i load_dw(const uint8_t *grp, int k) { return _mm256_loadu_si256((const __m256i *)(grp + 32 * k)); }

static inline __m256i bcast(const int8_t *p) { return _mm256_set1_epi32((int)cpu_rd32((const uint8_t *)p)); }

/* vpshufb control: bytes j0 and j1 of each dword, zero-extended, as its two
 * int16 halves. */
static inline __m256i pair_ctrl(int j0, int j1) {
    const int b = (int)(0x80008000u | (unsigned)j1 << 16 | (unsigned)j0);
    return _mm256_setr_epi32(b, b + 0x00040004, b + 0x00080008, b + 0x000C000C, b, b + 0x00040004, b + 0x00080008,
                             b + 0x000C000C);
}

/* vpshufb control: bytes j0 and j1 of each dword in the high bytes of its
 * two int16 halves (an arithmetic shift by 8 then sign-extends them). */
static inline __m256i high_pair_ctrl(int j0, int j1) {
    const int b = (int)(0x00800080u | (unsigned)j1 << 24 | (unsigned)j0 << 8);
    return _mm256_setr_epi32(b, b + 0x04000400, b + 0x08000800, b + 0x0C000C00, b, b + 0x04000400, b + 0x08000800,
                             b + 0x0C000C00);
}

/* An empty asm that claims to change v: gcc then keeps an accumulator in a
 * register as one chain instead of re-associating the sum into a tree of
 * spilled partial products (integer adds are exact either way). */
static inline __attribute__((always_inline)) void keep_in_register(__m256i *v) { __asm__("" : "+x"(*v)); }

/* One prefetch per line (see cpu_avx512_x16.c on why always_inline). */
static inline __attribute__((always_inline)) void prefetch_block(const uint8_t *p, int bytes) {
    for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char *)p + X8_PREFETCH + l, _MM_HINT_T0);
}

/* The f16 halves of dword 0 of a Q4_K/Q5_K group block: d and dmin of 8 rows. */
static inline void kq_d_dmin(const uint8_t *grp, __m256 *d, __m256 *dmin) {
    const __m256i dd = load_dw(grp, 0);
    const __m256i lo = _mm256_and_si256(dd, _mm256_set1_epi32(0xFFFF)), hi = _mm256_srli_epi32(dd, 16);
    /* packus: [d0-3 dmin0-3 | d4-7 dmin4-7]; qwords 0 2 1 3: [d0-7 | dmin0-7] */
    const __m256i h = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    *d = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *dmin = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* summ = sum_j m_j (bsum[2j] + bsum[2j+1]) for 8 rows: mp[i] holds the int16
 * pair (m_2i, m_2i+1) of every row. */
static inline __m256i kq_summ8(const __m256i *mp, const mu_block_q8k *x) {
    const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x->bsums), _mm_loadu_si128((const __m128i *)(x->bsums + 8)));
    __m256i s = _mm256_madd_epi16(mp[0], _mm256_broadcastd_epi32(pairs));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(mp[1], _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 0x55))));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(mp[2], _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 0xAA))));
    return _mm256_add_epi32(s, _mm256_madd_epi16(mp[3], _mm256_broadcastd_epi32(_mm_shuffle_epi32(pairs, 0xFF))));
}

/* A Q5_K code vector: the nibbles `nib` and bit `bit` of each qh byte as bit 4
 * (16-bit shifts: the bits that cross a byte are masked off). */
static inline __m256i with_high_bit(__m256i nib, __m256i qh, int bit) {
    const __m256i h = bit < 4 ? _mm256_slli_epi16(qh, 4 - bit) : bit > 4 ? _mm256_srli_epi16(qh, bit - 4) : qh;
    return _mm256_or_si256(nib, _mm256_and_si256(h, _mm256_set1_epi8(0x10)));
}

static inline void store_totals(const __m256 *total, int T, float *y, int64_t ys, const mu_weight *w) {
    for (int t = 0; t < T; t++)
        _mm256_storeu_ps(y + t * ys, w->has_scale ? _mm256_mul_ps(total[t], _mm256_set1_ps(w->scale)) : total[t]);
}

/* Q4_K (five = false) and Q5_K. Group block: dword 0 = (d, dmin), 1-3 =
 * the 12 scale bytes, 4-35 = qs (Q5_K: 4-11 = qh, 12-43 = qs). qs dword
 * 8c + p holds values 64c + 4p .. +3 in its low nibbles (sub-block 2c) and
 * 64c + 32 + 4p .. +3 in its high ones (sub-block 2c + 1). One sub-block at
 * a time, so that only the tile's accumulators are live. */
static inline __attribute__((always_inline)) void q45k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                             int64_t nbx, int T, float *y, int64_t ys,
                                                             const mu_weight *w, bool five) {
    const int group_block = five ? Q5K_GROUP_BLOCK : Q4K_GROUP_BLOCK, qs_dw = five ? 12 : 4;
    const int run = five ? 4 : 8; /* dwords of int16 pair sums before they must widen */
    const __m256i m0f = _mm256_set1_epi8(0x0F), k3f = _mm256_set1_epi32(0x3F3F3F3F), k30 = _mm256_set1_epi32(0x30303030);
    __m256 total[X8_TILE];
    for (int t = 0; t < T; t++) total[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, grp += group_block) {
        prefetch_block(grp, group_block);
        /* the 6-bit scales and mins, as qi_scale_min_k4 unpacks them: bytes
         * 0-3 of sc[0] / mn[0] are sub-blocks 0-3, of sc[1] / mn[1] 4-7 */
        const __m256i s0 = load_dw(grp, 1), s1 = load_dw(grp, 2), s2 = load_dw(grp, 3);
        __m256i sc[2], mn[2];
        sc[0] = _mm256_and_si256(s0, k3f);
        mn[0] = _mm256_and_si256(s1, k3f);
        sc[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s0, 2), k30), _mm256_and_si256(s2, m0f));
        mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s1, 2), k30),
                                _mm256_and_si256(_mm256_srli_epi32(s2, 4), m0f));
        __m256i sumi[X8_TILE];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        /* sub-block j = 2c + h: the low (h = 0) or high nibbles of qs dwords
         * 8c .. 8c + 7, against activation codes 32j .. 32j + 31 */
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int c = j >> 1;
            const __m256i scp = _mm256_shuffle_epi8(sc[j >> 2], pair_ctrl(j & 3, j & 3));
            for (int p0 = 0; p0 < 8; p0 += run) {
                __m256i acc[X8_TILE];
                for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int p = p0; p < p0 + run; p++) {
                    const __m256i q = load_dw(grp, qs_dw + 8 * c + p);
                    __m256i code = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(q, 4) : q, m0f);
                    if (five) code = with_high_bit(code, load_dw(grp, 4 + p), j); /* qh bit j: this sub-block's fifth bits */
                    for (int t = 0; t < T; t++) {
                        acc[t] = _mm256_add_epi16(acc[t], _mm256_maddubs_epi16(code, bcast(x[t * nbx + b].qs + 32 * j + 4 * p)));
                        keep_in_register(&acc[t]);
                    }
                }
                for (int t = 0; t < T; t++) sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(acc[t], scp));
            }
        }
        const __m256i mp[4] = {_mm256_shuffle_epi8(mn[0], pair_ctrl(0, 1)), _mm256_shuffle_epi8(mn[0], pair_ctrl(2, 3)),
                               _mm256_shuffle_epi8(mn[1], pair_ctrl(0, 1)), _mm256_shuffle_epi8(mn[1], pair_ctrl(2, 3))};
        __m256 d, dmin;
        kq_d_dmin(grp, &d, &dmin);
        for (int t = 0; t < T; t++) {
            const mu_block_q8k *xb = x + t * nbx + b;
            const __m256 xd = _mm256_set1_ps(xb->d);
            const __m256 f = _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(d, xd), _mm256_cvtepi32_ps(sumi[t])),
                                           _mm256_mul_ps(_mm256_mul_ps(dmin, xd), _mm256_cvtepi32_ps(kq_summ8(mp, xb))));
            total[t] = _mm256_add_ps(total[t], f);
        }
    }
    store_totals(total, T, y, ys, w);
}

/* Q6_K. Group block: dwords 0-31 = ql, 32-47 = qh, 48-51 = the 16 int8
 * scales, then the 8 rows' f16 d at byte 1664. In half n, l-dword i
 * (values 4i .. 4i+3) with qh dword H, ql dwords A (ql[l]) and B (ql[l+32])
 * gives the codes of values 128n + 32k + 4i, k = 0..3:
 *   k=0: A & 15 | (H << 4) & 48    k=1: B & 15 | (H << 2) & 48
 *   k=2: A >> 4 | H & 48           k=3: B >> 4 | (H >> 2) & 48
 * which lie in sub-block 8n + 2k + i / 4. */
static inline __m256i q6k_codes(const uint8_t *grp, int n, int i, int k) {
    const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i h = load_dw(grp, 32 + 8 * n + i), l = load_dw(grp, 16 * n + 8 * (k & 1) + i);
    const __m256i lo = k < 2 ? _mm256_and_si256(l, m0f) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m0f);
    const __m256i hb = k == 0 ? _mm256_slli_epi16(h, 4) : k == 1 ? _mm256_slli_epi16(h, 2) : k == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hb, m30));
}

/* The int16 pair (sc[s0], sc[s1]) of every row, sign-extended: two of a
 * Q6_K group block's int8 scales (dwords 48-51), s0 and s1 in one dword. */
static inline __m256i q6k_scale_pair(const uint8_t *grp, int s0, int s1) {
    return _mm256_srai_epi16(_mm256_shuffle_epi8(load_dw(grp, 48 + s0 / 4), high_pair_ctrl(s0 % 4, s1 % 4)), 8);
}

/* sumi[t] (before the -32 offset) one sub-block at a time: only the tile's
 * accumulators are live, for tiles of 3+ rows. */
static inline __attribute__((always_inline)) void q6k_sums_by_sub_block(const uint8_t *grp, const mu_block_q8k *x,
                                                                         int64_t nbx, int64_t b, int T, __m256i *sumi) {
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
#pragma GCC unroll 2
            for (int ih = 0; ih < 2; ih++) {
                const int sb = 8 * n + 2 * k + ih;
                const __m256i scp = q6k_scale_pair(grp, sb, sb);
#pragma GCC unroll 2
                for (int i0 = 4 * ih; i0 < 4 * ih + 4; i0 += 2) {
                    const __m256i c0 = q6k_codes(grp, n, i0, k), c1 = q6k_codes(grp, n, i0 + 1, k);
                    for (int t = 0; t < T; t++) {
                        const int8_t *xq = x[t * nbx + b].qs + 128 * n + 32 * k + 4 * i0;
                        const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(c0, bcast(xq)),
                                                           _mm256_maddubs_epi16(c1, bcast(xq + 4)));
                        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(a, scp));
                        keep_in_register(&sumi[t]);
                    }
                }
            }
}

/* The same sums one l-dword at a time: its ql and qh dwords are loaded once
 * for the four sub-blocks they feed, for tiles of 1-2 rows (decode). */
static inline __attribute__((always_inline)) void q6k_sums_by_dword(const uint8_t *grp, const mu_block_q8k *x,
                                                                     int64_t nbx, int64_t b, int T, __m256i *sumi) {
#pragma GCC unroll 2
    for (int n = 0; n < 2; n++)
#pragma GCC unroll 4
        for (int i0 = 0; i0 < 8; i0 += 2) {
            __m256i acc[2][4];
            for (int t = 0; t < T; t++)
                for (int k = 0; k < 4; k++) acc[t][k] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int i = i0; i < i0 + 2; i++)
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const __m256i c = q6k_codes(grp, n, i, k);
                    for (int t = 0; t < T; t++)
                        acc[t][k] = _mm256_add_epi16(acc[t][k], _mm256_maddubs_epi16(c, bcast(x[t * nbx + b].qs + 128 * n + 32 * k + 4 * i)));
                }
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int sb = 8 * n + 2 * k + i0 / 4;
                const __m256i scp = q6k_scale_pair(grp, sb, sb);
                for (int t = 0; t < T; t++) sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(acc[t][k], scp));
            }
        }
}

static inline __attribute__((always_inline)) void q6k_tile(const uint8_t *grp, int64_t nb, const mu_block_q8k *x,
                                                            int64_t nbx, int T, float *y, int64_t ys, const mu_weight *w) {
    __m256 total[X8_TILE];
    for (int t = 0; t < T; t++) total[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, grp += Q6K_GROUP_BLOCK) {
        prefetch_block(grp, Q6K_GROUP_BLOCK);
        __m256i sumi[X8_TILE];
        for (int t = 0; t < T; t++) sumi[t] = _mm256_setzero_si256();
        if (T <= 2) q6k_sums_by_dword(grp, x, nbx, b, T, sumi);
        else q6k_sums_by_sub_block(grp, x, nbx, b, T, sumi);
        /* the -32 offset: sum_s sc_s * bsum_s, sub-blocks in int16 pairs */
        __m256i scp2[8];
        for (int i = 0; i < 8; i++) scp2[i] = q6k_scale_pair(grp, 2 * i, 2 * i + 1);
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 32 * 52)));
        for (int t = 0; t < T; t++) {
            const mu_block_q8k *xb = x + t * nbx + b;
            __m256i corr = _mm256_setzero_si256();
            for (int i = 0; i < 8; i++) corr = _mm256_add_epi32(corr, _mm256_madd_epi16(scp2[i], bcast((const int8_t *)(xb->bsums + 2 * i))));
            const __m256i s = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(corr, 5));
            total[t] = _mm256_add_ps(total[t], _mm256_mul_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(s)));
        }
    }
    store_totals(total, T, y, ys, w);
}

/* One tile of T (1-4) activation rows: T as a constant in every kernel. */
#define X8_CASES(call)                                                                                          \
    switch (T) {                                                                                                \
    case 1: call(1); break;                                                                                     \
    case 2: call(2); break;                                                                                     \
    case 3: call(3); break;                                                                                     \
    default: call(4); break;                                                                                    \
    }
#define Q4K_TILE(n) q45k_tile(grp, nb, x, nb, n, y, w->n_out, w, false)
#define Q5K_TILE(n) q45k_tile(grp, nb, x, nb, n, y, w->n_out, w, true)
#define Q6K_TILE(n) q6k_tile(grp, nb, x, nb, n, y, w->n_out, w)

/* One function per format keeps each one's code (four tile sizes inlined)
 * small enough for gcc's debug-info tracking in RelWithDebInfo builds. */
static void q4k_tiles(const mu_weight *w, const uint8_t *grp, int64_t nb, const mu_block_q8k *x, int T, float *y) { X8_CASES(Q4K_TILE) }
static void q5k_tiles(const mu_weight *w, const uint8_t *grp, int64_t nb, const mu_block_q8k *x, int T, float *y) { X8_CASES(Q5K_TILE) }
static void q6k_tiles(const mu_weight *w, const uint8_t *grp, int64_t nb, const mu_block_q8k *x, int T, float *y) { X8_CASES(Q6K_TILE) }

static void x8_tile(const mu_weight *w, const uint8_t *grp, int64_t nb, const mu_block_q8k *x, int T, float *y) {
    if (w->type == MU_TYPE_Q6_K) q6k_tiles(w, grp, nb, x, T, y);
    else if (w->type == MU_TYPE_Q5_K) q5k_tiles(w, grp, nb, x, T, y);
    else q4k_tiles(w, grp, nb, x, T, y);
}

/* Output rows [o0, o1) (multiples of 8, inside the X8 groups) for `rows`
 * activation rows: panels of X8_ROW_PANEL rows, each passing over all the
 * task's groups, so both stay in cache while a tile of X8_TILE rows runs. */
void mu_cpu_avx2_x8_matmul(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, int64_t rows, float *y) {
    const int64_t nb = w->n_in / MU_QK_K;
    const uint64_t bb = mu_cpu_pack_block_bytes(w);
    for (int64_t r0 = 0; r0 < rows; r0 += X8_ROW_PANEL) {
        const int64_t r1 = r0 + X8_ROW_PANEL < rows ? r0 + X8_ROW_PANEL : rows;
        for (int64_t g = o0 / 8; g < o1 / 8; g++)
            for (int64_t r = r0; r < r1; r += X8_TILE) {
                const int T = r1 - r < X8_TILE ? (int)(r1 - r) : X8_TILE;
                const uint8_t *grp = mu_cpu_pack_at(w, bb, 8, g, 0);
                const mu_block_q8k *xr = xq + r * nb;
                float *yr = y + r * w->n_out + 8 * g;
                x8_tile(w, grp, nb, xr, T, yr);
            }
    }
}

#pragma GCC pop_options
#endif
