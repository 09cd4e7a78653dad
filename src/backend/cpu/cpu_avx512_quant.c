/* AVX-512 (F/BW/VL/DQ + VNNI) quantized matmul: the Q8_K activation
 * quantizer and the integer kernels, compiled for that target only and
 * called only after the CPUID check in cpu_backend.c.
 *
 * Exactness: the integer parts are exact in any order; every float
 * operation is the ref's operation in the ref's order, lane-wise. Each
 * (weight row, activation row, 256-block) gets its f_b from the format's
 * formula and each total adds f_b in block order:
 *  - decode (one row): the weight rows are walked as one sequential stream,
 *    16 blocks per step, block sums by maddubs + vpdpwssd and a transposing
 *    horizontal sum (lanes = blocks);
 *  - prefill (9+ rows, K-quants): activation rows in lanes, codes against
 *    the rows' transposed codes by vpdpbusd, per-sub-block accumulators;
 *  - 2-8 rows and the other formats: tiles of 16 (weight, row) pairs. */
#include "backend/cpu/cpu_simd_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include "backend/cpu/cpu_avx512.h"
#include "backend/cpu/cpu_repack.h"

/* lane p of the result = sum of the 16 lanes of a[p] */
static inline __m512i hsum16_epi32(const __m512i *a) {
    __m512i u[8], v[4];
    for (int i = 0; i < 8; i++)
        u[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]),
                                _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        v[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(u[2 * i], u[2 * i + 1]),
                                _mm512_unpackhi_epi64(u[2 * i], u[2 * i + 1]));
    __m512i x01 = _mm512_add_epi32(_mm512_shuffle_i32x4(v[0], v[1], 0x44), _mm512_shuffle_i32x4(v[0], v[1], 0xEE));
    __m512i x23 = _mm512_add_epi32(_mm512_shuffle_i32x4(v[2], v[3], 0x44), _mm512_shuffle_i32x4(v[2], v[3], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(x01, x23, 0x88), _mm512_shuffle_i32x4(x01, x23, 0xDD));
}

/* For four vectors a0..a3: lane 4i + k of the result = sum of the four
 * lanes of 128-bit lane i of a_k. */
static inline __m512i hsum_lanes4(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    __m512i u0 = _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    __m512i u1 = _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(u0, u1), _mm512_unpackhi_epi64(u0, u1));
}

/* 8 sums of a 256-block split in 32-value sub-blocks: a_k holds sub-block
 * 2k in lanes 0-7 and 2k+1 in lanes 8-15; out[j] = sub-block j's sum. */
static inline void hsum_sub32(__m512i a0, __m512i a1, __m512i a2, __m512i a3, int32_t *out) {
    __m512i v = hsum_lanes4(a0, a1, a2, a3);
    __m128i even = _mm_add_epi32(_mm512_extracti32x4_epi32(v, 0), _mm512_extracti32x4_epi32(v, 1));
    __m128i odd = _mm_add_epi32(_mm512_extracti32x4_epi32(v, 2), _mm512_extracti32x4_epi32(v, 3));
    _mm_storeu_si128((__m128i *)out, _mm_unpacklo_epi32(even, odd));
    _mm_storeu_si128((__m128i *)(out + 4), _mm_unpackhi_epi32(even, odd));
}

/* ======================================================== Q8_K quantizer */

static inline __m512 round_f16_ps(__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static void store_codes(const __m512i *q, int8_t *qs, int layout) {
    static const int K4_CHUNK[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    if (layout == ACT_EVEN_ODD) {
        const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
        const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++) {
                __m512i a = q[8 * h + 2 * k], b = q[8 * h + 2 * k + 1];
                _mm_storeu_si128((__m128i *)(qs + 128 * h + 16 * k),
                                 _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(a, even, b)));
                _mm_storeu_si128((__m128i *)(qs + 128 * h + 64 + 16 * k),
                                 _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(a, odd, b)));
            }
        return;
    }
    for (int i = 0; i < 16; i++) {
        int dst = layout == ACT_K4 ? 32 * K4_CHUNK[i / 2] + 16 * (i % 2) : 16 * i;
        _mm_storeu_si128((__m128i *)(qs + dst), _mm512_cvtepi32_epi8(q[i]));
    }
}

/* mu_quantize_q8k for one block: max = first element of largest |x|,
 * iscale = -127/max, q = min(127, bits(fmaf(iscale, x, 1.5*2^23)) - 2^22). */
static void quantize_block(const float *src, mu_block_q8k *y, bool via_f16, int layout) {
    __m512 v[16];
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < 16; i++) {
        v[i] = _mm512_loadu_ps(src + 16 * i);
        if (via_f16) v[i] = round_f16_ps(v[i]);
        amax = _mm512_max_ps(_mm512_abs_ps(v[i]), amax); /* NaN lanes keep amax, as `a > amax` does */
    }
    const float am = _mm512_reduce_max_ps(amax);
    if (am == 0.0f) {
        memset(y, 0, sizeof *y);
        return;
    }
    float max = 0.0f;
    const __m512 amv = _mm512_set1_ps(am);
    for (int i = 0; i < 16; i++) {
        __mmask16 k = _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), amv, _CMP_EQ_OQ);
        if (k) {
            float t[16];
            _mm512_storeu_ps(t, v[i]);
            max = t[__builtin_ctz(k)];
            break;
        }
    }
    const float iscale = -127.0f / max;
    const __m512 is = _mm512_set1_ps(iscale), magic = _mm512_set1_ps(12582912.0f);
    const __m512i mant = _mm512_set1_epi32(0x7FFFFF), bias = _mm512_set1_epi32(0x400000);
    __m512i q[16];
    for (int i = 0; i < 16; i++) {
        __m512i t = _mm512_castps_si512(_mm512_fmadd_ps(is, v[i], magic));
        q[i] = _mm512_min_epi32(_mm512_sub_epi32(_mm512_and_si512(t, mant), bias), _mm512_set1_epi32(127));
        y->bsums[i] = (int16_t)_mm512_reduce_add_epi32(q[i]);
    }
    store_codes(q, y->qs, layout);
    y->d = 1.0f / iscale;
}

static int act_layout(const mu_weight *w) {
    if (cpu_is_native(w)) return ACT_EVEN_ODD;
    if (w->type == MU_TYPE_Q4_K || w->type == MU_TYPE_Q5_K) return ACT_K4;
    return ACT_NATURAL;
}

/* The activation buffer: Q8_K blocks [rows][nb], then side tables that put
 * the rows of a block in lanes (rows padded to a multiple of 16, the pad
 * repeating the last row), for the multi-row tiles:
 *   xd[b][r]     the block's scale d
 *   bp[b][k][r]  int16 pair (bsums[4k] + bsums[4k+1], bsums[4k+2] + bsums[4k+3])
 *   bs[b][k][r]  int16 pair (bsums[2k], bsums[2k+1])
 *   xt           (K-quants) the codes by 16-row group, block, dword, row     */
typedef struct act_side {
    const float *xd;
    const uint32_t *bp, *bs;
    const uint32_t *xt; /* K-quants: xt[r/16][b][j][r%16] = dword j of row r's block b codes */
    int64_t rpad;
} act_side;

static bool wants_xt(const mu_weight *w) {
    return w->type == MU_TYPE_Q4_K || w->type == MU_TYPE_Q5_K || w->type == MU_TYPE_Q6_K;
}

static size_t blocks_bytes(int64_t rows, int64_t nb) { return ((size_t)(rows * nb) * sizeof(mu_block_q8k) + 63) & ~(size_t)63; }

static act_side side_of(const mu_weight *w, const void *act, int64_t rows) {
    const int64_t nb = w->n_in / MU_QK_K, rpad = (rows + 15) & ~(int64_t)15;
    const float *xd = (const float *)((const uint8_t *)act + blocks_bytes(rows, nb));
    const uint32_t *bp = (const uint32_t *)(xd + nb * rpad), *bs = bp + nb * 4 * rpad;
    return (act_side){.xd = xd, .bp = bp, .bs = bs, .xt = wants_xt(w) ? bs + nb * 8 * rpad : NULL, .rpad = rpad};
}

size_t mu_cpu_avx512_act_bytes(const mu_weight *w, int64_t rows) {
    const int64_t nb = w->n_in / MU_QK_K, rpad = (rows + 15) & ~(int64_t)15;
    return blocks_bytes(rows, nb) + (size_t)(nb * rpad) * (1 + 4 + 8 + (wants_xt(w) ? 64 : 0)) * 4;
}

static inline uint32_t pack16(int32_t lo, int32_t hi) { return (uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16; }

static void fill_side(const act_side *sd, const mu_block_q8k *x, int64_t b, int64_t r) {
    float *xd = (float *)sd->xd;
    uint32_t *bp = (uint32_t *)sd->bp, *bs = (uint32_t *)sd->bs;
    xd[b * sd->rpad + r] = x->d;
    for (int k = 0; k < 4; k++)
        bp[(b * 4 + k) * sd->rpad + r] = pack16(x->bsums[4 * k] + x->bsums[4 * k + 1], x->bsums[4 * k + 2] + x->bsums[4 * k + 3]);
    for (int k = 0; k < 8; k++) bs[(b * 8 + k) * sd->rpad + r] = pack16(x->bsums[2 * k], x->bsums[2 * k + 1]);
}

/* xt for the 16-row groups inside [r0, r1): 16x16 dword transposes of
 * each block's codes (rows past the end repeat the last row). */
static void fill_xt(const act_side *sd, const mu_block_q8k *xq, int64_t nb, int64_t r0, int64_t r1, int64_t rows) {
    uint32_t *xt = (uint32_t *)sd->xt;
    for (int64_t g = r0; g < r1; g += 16)
        for (int64_t b = 0; b < nb; b++)
            for (int q = 0; q < 4; q++) { /* dwords 16q .. 16q + 15 */
                __m512i r[16];
                for (int i = 0; i < 16; i++) {
                    const int64_t row = g + i < rows ? g + i : rows - 1;
                    r[i] = _mm512_loadu_si512(xq[row * nb + b].qs + 64 * q);
                }
                transpose16_epi32(r);
                for (int j = 0; j < 16; j++) _mm512_storeu_si512(xt + ((g / 16 * nb + b) * 64 + 16 * q + j) * 16, r[j]);
            }
}

/* The single-row kernels and the X16 kernel read the blocks only (a
 * weight packed whole has no GGUF rows left for the GEMMs). */
bool mu_cpu_avx512_blocks_only(const mu_weight *w, int64_t rows) {
    return rows == 1 || (w->layout == MU_LAYOUT_X16 && mu_cpu_pack_rows(w, 16) == w->n_out);
}

/* r0 is a multiple of 16 and r1 one too or rows (cpu_backend.c splits so),
 * unless mu_cpu_avx512_blocks_only. */
void mu_cpu_avx512_quantize_rows(const mu_weight *w, const float *x, int64_t r0, int64_t r1, int64_t rows, void *act) {
    bool via_f16 = false;
    mu_weight_uses_q8k(w, &via_f16);
    const int layout = act_layout(w);
    const int64_t nb = w->n_in / MU_QK_K;
    mu_block_q8k *xq = act;
    const act_side sd = side_of(w, act, rows);
    const bool blocks_only = mu_cpu_avx512_blocks_only(w, rows);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < nb; b++) {
            mu_block_q8k *blk = xq + r * nb + b;
            quantize_block(x + r * w->n_in + b * MU_QK_K, blk, via_f16, layout);
            if (blocks_only) continue;
            fill_side(&sd, blk, b, r);
            if (r == rows - 1)
                for (int64_t pad = rows; pad < sd.rpad; pad++) fill_side(&sd, blk, b, pad);
        }
    if (sd.xt && !blocks_only) fill_xt(&sd, xq, nb, r0, r1, rows); /* the GEMMs read it */
}

/* ======================================================== quantized tiles */

/* A tile step computes f_b of 16 (weight block, activation row) pairs:
 * To weight blocks x Tr activation rows, pair p = oi * Tr + ri, weight block
 * oi at wblk[oi] with block index bidx[oi] (the activation block it meets
 * is xrow[ri] + bidx[oi]). Each weight block is unpacked once for its Tr
 * pairs. Entries past the end repeat the last one and are not used. */
typedef struct qtile {
    const mu_weight *w;
    const act_side *side;
    int64_t r0; /* first activation row of the tile */
    int To, Tr;
    const uint8_t *wblk[16];
    const uint8_t *sblk[16]; /* native NVFP4: the block's 16 scale bytes */
    int64_t bidx[16];
    const mu_block_q8k *xrow[16];
} qtile;

typedef void (*tile_step_fn)(const qtile *t, float *f);

static void pick_tile(int64_t rows, int *To, int *Tr) {
    *Tr = rows >= 9 ? 16 : rows >= 5 ? 8 : rows >= 3 ? 4 : rows == 2 ? 2 : 1;
    *To = 16 / *Tr;
}

static inline float row_epilogue(const mu_weight *w, float total, bool native) {
    if (native) return mu_round_f16(total);
    return w->has_scale ? total * w->scale : total;
}

typedef struct block_addr {
    uint64_t stride, block_bytes, scale_stride;
} block_addr;

static block_addr addr_of(const mu_weight *w) {
    const int64_t nb = w->n_in / MU_QK_K;
    if (cpu_is_native(w)) return (block_addr){(uint64_t)(w->n_in / 2), MU_QK_K / 2, (uint64_t)(w->n_in / 16)};
    return (block_addr){w->row_bytes, w->row_bytes / (uint64_t)nb, 0};
}

static inline void set_block(qtile *t, int i, const block_addr *a, int64_t o, int64_t b) {
    t->wblk[i] = t->w->data + (uint64_t)o * a->stride + (uint64_t)b * a->block_bytes;
    t->sblk[i] = a->scale_stride ? t->w->nvfp4_scales + (uint64_t)o * a->scale_stride + (uint64_t)b * 16 : NULL;
    t->bidx[i] = b;
}

/* One activation row (decode): the rows [o0, o1) are one contiguous byte
 * range, walked as a flat sequence of blocks, 16 per step, so the weights
 * stream through memory in order. Each row's total still adds its f_b in
 * block order. */
static void run_flat(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, float *y, tile_step_fn step) {
    const bool native = cpu_is_native(w);
    const int64_t nb = w->n_in / MU_QK_K;
    const block_addr a = addr_of(w);
    const uint8_t *end = w->data + (uint64_t)o1 * a.stride;
    qtile t = {.w = w, .To = 16, .Tr = 1};
    t.xrow[0] = xq;
    float total = 0.0f;
    int64_t o = o0, b = 0; /* block of the next step's first entry */
    while (o < o1) {
        int n = 0;
        for (int64_t oo = o, bb = b; n < 16; n++) {
            set_block(&t, n, &a, oo < o1 ? oo : o1 - 1, oo < o1 ? bb : nb - 1);
            if (++bb == nb) { bb = 0; oo++; }
        }
        /* the stream is sequential; ask for the next step's bytes early */
        const uint64_t left = (uint64_t)(end - t.wblk[15]);
        for (uint64_t off = a.block_bytes; off < 17 * a.block_bytes && off < left; off += 64)
            _mm_prefetch((const char *)(t.wblk[15] + off), _MM_HINT_T0);
        float f[16];
        step(&t, f);
        for (int i = 0; i < 16 && o < o1; i++) {
            total = total + f[i];
            if (++b == nb) {
                y[o] = row_epilogue(w, total, native);
                total = 0.0f;
                b = 0;
                o++;
            }
        }
    }
}

/* Several activation rows: tiles of To weight rows x Tr activation rows.
 * Loop order keeps the working set in L1: for each group of Tr activation
 * rows and each slice of a few blocks (about 20 KB of activations), every
 * weight row of the task passes over that slice; each tile's running
 * totals live in `totals` between slices. Blocks still reach each total in
 * ascending order. */
static void run_tiles(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y,
                      tile_step_fn step) {
    const mu_block_q8k *xq = act;
    if (rows == 1) {
        run_flat(w, o0, o1, xq, y, step);
        return;
    }
    const act_side side = side_of(w, act, rows);
    const bool native = cpu_is_native(w);
    const int64_t nb = w->n_in / MU_QK_K;
    const block_addr a = addr_of(w);
    int To, Tr;
    pick_tile(rows, &To, &Tr);
    const int64_t slice = Tr >= 16 ? 4 : 64 / Tr;
    const int64_t n_tiles = (o1 - o0 + To - 1) / To;
    float *totals = mu_xmalloc((size_t)n_tiles * 16 * sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += Tr) {
        qtile t = {.w = w, .side = &side, .r0 = r0, .To = To, .Tr = Tr};
        for (int i = 0; i < Tr; i++) t.xrow[i] = xq + (r0 + i < rows ? r0 + i : rows - 1) * nb;
        memset(totals, 0, (size_t)n_tiles * 16 * sizeof(float));
        for (int64_t b0 = 0; b0 < nb; b0 += slice) {
            const int64_t b1 = b0 + slice < nb ? b0 + slice : nb;
            for (int64_t tile = 0; tile < n_tiles; tile++) {
                const int64_t og = o0 + tile * To;
                float *tot = totals + tile * 16, f[16];
                for (int64_t b = b0; b < b1; b++) {
                    for (int i = 0; i < To; i++) set_block(&t, i, &a, og + i < o1 ? og + i : o1 - 1, b);
                    step(&t, f);
                    _mm512_storeu_ps(tot, _mm512_add_ps(_mm512_loadu_ps(tot), _mm512_loadu_ps(f)));
                }
            }
        }
        for (int64_t tile = 0; tile < n_tiles; tile++) {
            const int64_t og = o0 + tile * To;
            for (int oi = 0; oi < To && og + oi < o1; oi++)
                for (int ri = 0; ri < Tr && r0 + ri < rows; ri++)
                    y[(r0 + ri) * w->n_out + og + oi] = row_epilogue(w, totals[tile * 16 + oi * Tr + ri], native);
        }
    }
    free(totals);
}

/* ---- Q4_K / Q5_K: f_b = (d*xd)*sumi - (dmin*xd)*summ ---- */

/* Word lanes of sub-block pair (a, b): 128-bit lanes 0-1 read scale byte a,
 * lanes 2-3 byte b (vpshufb control; 0x80 zeroes the high byte). */
static inline __m512i scale_pair_ctrl(int a, int b) {
    return _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16((short)(0x8000 | a)), _mm512_set1_epi16((short)(0x8000 | b)));
}

/* Codes of sub-block pairs (0,2) (1,3) (4,6) (5,7), ACT_K4 order. */
static inline void q4k_codes(const uint8_t *qs, __m512i *c) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
    c[0] = _mm512_and_si512(q0, m4);
    c[1] = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
    c[2] = _mm512_and_si512(q1, m4);
    c[3] = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
}

/* Q5_K fifth bits: qh bit 2g (low nibbles) / 2g+1 (high) of group g. */
static inline void q5k_high_bits(const uint8_t *qh, __m512i *c) {
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int k = 0; k < 4; k++) {
        /* c[k] holds groups (g_lo, g_lo + 1) with bits: k=0: 0,2  k=1: 1,3  k=2: 4,6  k=3: 5,7 */
        int bit_lo = (k & 1) + 4 * (k >> 1);
        __m512i sel = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi8((char)(1 << bit_lo)),
                                              _mm512_set1_epi8((char)(1 << (bit_lo + 2))));
        __mmask64 m = _mm512_test_epi8_mask(h, sel);
        c[k] = _mm512_mask_add_epi8(c[k], m, c[k], sixteen);
    }
}

/* Multi-row tiles of Q4_K / Q5_K (kind 4, 5) and Q6_K (kind 6). Lane p =
 * oi * Tr + ri; weight-side values enter their lanes by masked moves,
 * activation-side ones come from the side tables (lane = row), so each
 * lane's f_b is the block formula with no per-pair scalar work:
 *   Q4_K/Q5_K: summ = sum_k (m_2k, m_2k+1) . (bp_2k, bp_2k+1)   (vpdpwssd)
 *   Q6_K: sumi = sum_s sc_s sum u x - 32 sum_s sc_s bsum_s          */
static inline __m512 side_vec(const float *row0, int Tr) {
    __m512 v = _mm512_loadu_ps(row0);
    if (Tr == 16) return v;
    const __m512i idx = _mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(Tr - 1));
    return _mm512_permutexvar_ps(idx, v);
}

static inline __m512i side_veci(const uint32_t *row0, int Tr) {
    return _mm512_castps_si512(side_vec((const float *)row0, Tr));
}

static inline __m512i q6k_codes(const uint8_t *blk, __m512i *c) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    const __m512i sh_lo = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(0), _mm512_set1_epi16(2));
    const __m512i sh_hi = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(4), _mm512_set1_epi16(6));
    for (int h = 0; h < 2; h++) {
        __m512i l = _mm512_loadu_si512(blk + 64 * h);
        __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + Q6_K_QH + 32 * h)));
        c[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, sh_lo), m3), 4));
        c[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                       _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, sh_hi), m3), 4));
    }
    return _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + Q6_K_SC))));
}

static inline __attribute__((always_inline)) void kq_gemm_step(const qtile *t, float *out, int kind) {
    const int To = t->To, Tr = t->Tr;
    const int64_t b = t->bidx[0];
    __m512i acc[16], wm[8];
    __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
    const int n_wm = kind == 6 ? 8 : 4;
    for (int k = 0; k < n_wm; k++) wm[k] = _mm512_setzero_si512();
    for (int oi = 0; oi < To; oi++) {
        const uint8_t *blk = t->wblk[oi];
        const __mmask16 lanes = (__mmask16)(((1u << Tr) - 1) << (oi * Tr));
        __m512i c[4], s[4];
        __m512i pairs; /* the weight-side int16 pairs of the second sum, as 8 or 4 dwords */
        if (kind == 6) {
            const __m512i scz = q6k_codes(blk, c);
            for (int k = 0; k < 4; k++) {
                const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16((short)(4 * k)), _mm512_set_epi16(
                    3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
                s[k] = _mm512_permutexvar_epi16(idx, scz);
            }
            pairs = scz;
            d = _mm512_mask_mov_ps(d, lanes, _mm512_set1_ps(f16_at(blk + Q6_K_D)));
        } else {
            uint64_t sc, mn;
            cpu_kq_scales(blk + QK_SCALES, &sc, &mn);
            const __m512i sv = _mm512_set1_epi64((long long)sc);
            s[0] = _mm512_shuffle_epi8(sv, scale_pair_ctrl(0, 2));
            s[1] = _mm512_shuffle_epi8(sv, scale_pair_ctrl(1, 3));
            s[2] = _mm512_shuffle_epi8(sv, scale_pair_ctrl(4, 6));
            s[3] = _mm512_shuffle_epi8(sv, scale_pair_ctrl(5, 7));
            q4k_codes(blk + (kind == 5 ? Q5_K_QS : Q4_K_QS), c);
            if (kind == 5) q5k_high_bits(blk + Q5_K_QH, c);
            pairs = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn)));
            d = _mm512_mask_mov_ps(d, lanes, _mm512_set1_ps(f16_at(blk)));
            dmin = _mm512_mask_mov_ps(dmin, lanes, _mm512_set1_ps(f16_at(blk + 2)));
        }
        for (int k = 0; k < n_wm; k++)
            wm[k] = _mm512_mask_permutexvar_epi32(wm[k], lanes, _mm512_set1_epi32(k), pairs);
        /* two activation rows at a time, two accumulators each: short
         * dependency chains (vpdpwssd latency) */
        for (int ri = 0; ri < Tr; ri += 2) {
            const int r2 = ri + 1 < Tr ? ri + 1 : ri;
            const int8_t *x0 = (t->xrow[ri] + b)->qs, *x1 = (t->xrow[r2] + b)->qs;
            const __m512i z = _mm512_setzero_si512();
            __m512i a0 = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(c[0], _mm512_loadu_si512(x0)), s[0]);
            __m512i b0 = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(c[0], _mm512_loadu_si512(x1)), s[0]);
            __m512i a1 = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(c[1], _mm512_loadu_si512(x0 + 64)), s[1]);
            __m512i b1 = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(c[1], _mm512_loadu_si512(x1 + 64)), s[1]);
            a0 = _mm512_dpwssd_epi32(a0, _mm512_maddubs_epi16(c[2], _mm512_loadu_si512(x0 + 128)), s[2]);
            b0 = _mm512_dpwssd_epi32(b0, _mm512_maddubs_epi16(c[2], _mm512_loadu_si512(x1 + 128)), s[2]);
            a1 = _mm512_dpwssd_epi32(a1, _mm512_maddubs_epi16(c[3], _mm512_loadu_si512(x0 + 192)), s[3]);
            b1 = _mm512_dpwssd_epi32(b1, _mm512_maddubs_epi16(c[3], _mm512_loadu_si512(x1 + 192)), s[3]);
            acc[oi * Tr + ri] = _mm512_add_epi32(a0, a1);
            if (r2 != ri) acc[oi * Tr + r2] = _mm512_add_epi32(b0, b1);
        }
    }
    const act_side *sd = t->side;
    const __m512 xd = side_vec(sd->xd + b * sd->rpad + t->r0, Tr);
    __m512i second = _mm512_setzero_si512();
    const uint32_t *tab = kind == 6 ? sd->bs + b * 8 * sd->rpad : sd->bp + b * 4 * sd->rpad;
    for (int k = 0; k < n_wm; k++) second = _mm512_dpwssd_epi32(second, wm[k], side_veci(tab + k * sd->rpad + t->r0, Tr));
    __m512i sumi = hsum16_epi32(acc);
    if (kind == 6) sumi = _mm512_sub_epi32(sumi, _mm512_slli_epi32(second, 5));
    __m512 f = _mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(sumi));
    if (kind != 6) f = _mm512_sub_ps(f, _mm512_mul_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(second)));
    _mm512_storeu_ps(out, f);
}

static void q4k_step(const qtile *t, float *f) { kq_gemm_step(t, f, 4); }
static void q5k_step(const qtile *t, float *f) { kq_gemm_step(t, f, 5); }
static void q6k_step(const qtile *t, float *f) { kq_gemm_step(t, f, 6); }

/* ---- Q8_0 / Q4_0: acc = sum_j (d_j*xd)*isum_j over 8 sub-blocks; f_b = acc ---- */

static inline void legacy_step(const qtile *t, float *out, bool q8) {
    const uint64_t sub_bytes = q8 ? Q8_0_BYTES : Q4_0_BYTES;
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    const __m256i m4 = _mm256_set1_epi8(0x0F), nib_shift = _mm256_set_epi64x(0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
    for (int oi = 0; oi < t->To; oi++) {
        const uint8_t *blk = t->wblk[oi];
        const int64_t b = t->bidx[oi];
        float dj[8];
        __m512i z[4];
        for (int j = 0; j < 8; j++) dj[j] = f16_at(blk + j * sub_bytes);
        for (int k = 0; k < 4; k++) {
            __m256i u[2];
            for (int h = 0; h < 2; h++) {
                const uint8_t *qs = blk + (2 * k + h) * sub_bytes + 2;
                if (q8) {
                    u[h] = _mm256_loadu_si256((const __m256i *)qs);
                } else { /* low nibbles = values 0-15, high = 16-31 */
                    __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
                    u[h] = _mm256_and_si256(_mm256_srlv_epi16(q, nib_shift), m4);
                }
            }
            z[k] = _mm512_inserti64x4(_mm512_castsi256_si512(u[0]), u[1], 1);
            if (q8) z[k] = _mm512_xor_si512(z[k], flip); /* w + 128, unsigned */
        }
        const int32_t offset = q8 ? 128 : 8;
        for (int ri = 0; ri < t->Tr; ri++) {
            const mu_block_q8k *x = t->xrow[ri] + b;
            __m512i a[4];
            for (int k = 0; k < 4; k++)
                a[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), z[k], _mm512_loadu_si512(x->qs + 64 * k));
            int32_t s[8];
            hsum_sub32(a[0], a[1], a[2], a[3], s);
            float acc = 0.0f;
            for (int j = 0; j < 8; j++) {
                int32_t isum = s[j] - offset * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
                acc = acc + (dj[j] * x->d) * (float)isum;
            }
            out[oi * t->Tr + ri] = acc;
        }
    }
}

static void q8_0_step(const qtile *t, float *f) { legacy_step(t, f, true); }
static void q4_0_step(const qtile *t, float *f) { legacy_step(t, f, false); }

/* ---- NVFP4: itotal = sum_g (sum q1*x) * q9_g (int64); f_b = ((float)itotal * 2^-10) * xd ---- */

static inline __m512i e2m1_u12(__m512i codes) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)CPU_E2M1_U12));
    return _mm512_shuffle_epi8(lut, codes);
}

/* sum over lanes of dot * q9 (both int32 per lane), exact in int64 */
static inline int64_t dot_q9_sum(__m512i dot, __m512i q9) {
    __m512i even = _mm512_mul_epi32(dot, q9);
    __m512i odd = _mm512_mul_epi32(_mm512_srli_epi64(dot, 32), _mm512_srli_epi64(q9, 32));
    return _mm512_reduce_add_epi64(_mm512_add_epi64(even, odd));
}

/* ggml type 40: 4 blocks of 36 bytes {d[4] UE4M3, qs[32]}; in sub-block s,
 * qs[8s+j] holds value 16s+j (low nibble) and 16s+8+j (high). */
static void nvfp4g_step(const qtile *t, float *out) {
    const cpu_scale_tables *tab = cpu_tables();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m512i tr = transpose4_idx();
    for (int oi = 0; oi < t->To; oi++) {
        const uint8_t *blk = t->wblk[oi];
        const int64_t b = t->bidx[oi];
        __m512i u[4];
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(blk + c * NVFP4G_BYTES + NVFP4G_QS));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            /* [g0 g2] and [g1 g3] in natural value order, then [g0 g1 g2 g3] */
            __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_unpacklo_epi64(lo, hi)),
                                           _mm256_unpackhi_epi64(lo, hi), 1);
            u[c] = e2m1_u12(_mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)));
        }
        /* scale of group 4c + i sits at lane 4i + c, like the sums below */
        __m128i sb = _mm_set_epi32((int)cpu_rd32(blk + 3 * NVFP4G_BYTES), (int)cpu_rd32(blk + 2 * NVFP4G_BYTES),
                                   (int)cpu_rd32(blk + NVFP4G_BYTES), (int)cpu_rd32(blk));
        __m512i q9 = _mm512_i32gather_epi32(_mm512_cvtepu8_epi32(sb), tab->ue4m3_q9, 4);
        q9 = _mm512_permutexvar_epi32(tr, q9);
        for (int ri = 0; ri < t->Tr; ri++) {
            const mu_block_q8k *x = t->xrow[ri] + b;
            __m512i a[4];
            for (int c = 0; c < 4; c++)
                a[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[c], _mm512_loadu_si512(x->qs + 64 * c));
            __m512i dot = hsum_lanes4(a[0], a[1], a[2], a[3]);
            __m512i bs = _mm512_permutexvar_epi32(tr, _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)x->bsums)));
            dot = _mm512_sub_epi32(dot, _mm512_mullo_epi32(bs, _mm512_set1_epi32(12)));
            const int64_t itotal = dot_q9_sum(dot, q9);
            out[oi * t->Tr + ri] = ((float)itotal * 0x1p-10f) * x->d;
        }
    }
}

/* Native (type 1000): byte p of a row holds value 2p (low) and 2p+1 (high);
 * the E4M3 scale of group g (16 values) is in the companion tensor. The
 * activations come in ACT_EVEN_ODD order; per block f = f_b * scale2. */
static void nvfp4n_step(const qtile *t, float *out) {
    const cpu_scale_tables *tab = cpu_tables();
    const mu_weight *w = t->w;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int oi = 0; oi < t->To; oi++) {
        const uint8_t *pay = t->wblk[oi], *scl = t->sblk[oi];
        const int64_t b = t->bidx[oi];
        __m512i ue[2], uo[2], q9[2];
        for (int h = 0; h < 2; h++) {
            __m512i p = _mm512_loadu_si512(pay + 64 * h);
            ue[h] = e2m1_u12(_mm512_and_si512(p, m4));
            uo[h] = e2m1_u12(_mm512_and_si512(_mm512_srli_epi16(p, 4), m4));
        }
        __m512i q = _mm512_i32gather_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)scl)), tab->e4m3_q9, 4);
        q9[0] = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(q, 0));
        q9[1] = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(q, 1));
        for (int ri = 0; ri < t->Tr; ri++) {
            const mu_block_q8k *x = t->xrow[ri] + b;
            __m512i prod = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                __m512i a = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ue[h], _mm512_loadu_si512(x->qs + 128 * h));
                a = _mm512_dpbusd_epi32(a, uo[h], _mm512_loadu_si512(x->qs + 128 * h + 64));
                /* lanes 2g, 2g+1 -> qword g, sign-extended */
                __m512i g = _mm512_add_epi32(a, _mm512_srli_epi64(a, 32));
                g = _mm512_srai_epi64(_mm512_slli_epi64(g, 32), 32);
                __m512i bs = _mm512_cvtepi16_epi64(_mm_loadu_si128((const __m128i *)(x->bsums + 8 * h)));
                g = _mm512_sub_epi64(g, _mm512_add_epi64(_mm512_slli_epi64(bs, 3), _mm512_slli_epi64(bs, 2)));
                prod = _mm512_add_epi64(prod, _mm512_mul_epi32(g, q9[h]));
            }
            const int64_t itotal = _mm512_reduce_add_epi64(prod);
            float f = ((float)itotal * 0x1p-10f) * x->d;
            out[oi * t->Tr + ri] = f * w->scale;
        }
    }
}

/* ---- single-row (decode) kernels for the K-quants ----
 * The weight rows [o0, o1) are one contiguous byte range: walk it block
 * by block (a single sequential stream, prefetched ahead), 16 blocks per
 * step, whatever rows they belong to. Each block's integer sums go to its
 * own lane by the 16-way transposing sum, its f_b is computed lane-wise,
 * and every row's total adds its f_b in block order. */

/* Per-call tables of the activation row, indexed by block with the first
 * 16 blocks repeated at the end, so 16 consecutive weight blocks (which
 * may wrap into the next row) index them without wrapping. */
typedef struct act_tables {
    const mu_block_q8k **x; /* block pointers */
    float *d;               /* Q8_K scales */
    /* bsum pairs bp_j = bsums[2j] + bsums[2j+1] split as 128 * h_j + l_j
     * (l_j in 0..127, h_j in -32..31), four int8 per u32: tables
     * lo_l (l_0..l_3), lo_h, hi_l (l_4..l_7), hi_h (Q4_K/Q5_K mins) */
    uint32_t *lo_l, *lo_h, *hi_l, *hi_h;
    void *mem;
} act_tables;

static void act_tables_init(act_tables *t, const mu_block_q8k *xq, int64_t nb) {
    const size_t n = (size_t)nb + 16;
    t->mem = mu_xmalloc(n * (sizeof(void *) + sizeof(float) + 4 * sizeof(uint32_t)));
    t->x = (const mu_block_q8k **)t->mem;
    t->d = (float *)(t->x + n);
    t->lo_l = (uint32_t *)(t->d + n);
    t->lo_h = t->lo_l + n;
    t->hi_l = t->lo_h + n;
    t->hi_h = t->hi_l + n;
    for (size_t i = 0; i < n; i++) {
        const mu_block_q8k *x = xq + i % (size_t)nb;
        t->x[i] = x;
        t->d[i] = x->d;
        uint8_t l[8], h[8];
        for (int j = 0; j < 8; j++) {
            int32_t bp = x->bsums[2 * j] + x->bsums[2 * j + 1];
            int32_t hj = bp >> 7; /* floor(bp / 128) */
            h[j] = (uint8_t)(int8_t)hj;
            l[j] = (uint8_t)(bp - 128 * hj);
        }
        t->lo_l[i] = cpu_rd32(l);
        t->hi_l[i] = cpu_rd32(l + 4);
        t->lo_h[i] = cpu_rd32(h);
        t->hi_h[i] = cpu_rd32(h + 4);
    }
}

/* int32 partials of sumi of one Q4_K/Q5_K block, given its eight 6-bit scales */
static inline __attribute__((always_inline)) __m512i q45k_block(const uint8_t *blk, const mu_block_q8k *x,
                                                                 __m512i s, bool five) {
    const __m512i c02 = scale_pair_ctrl(0, 2), c13 = scale_pair_ctrl(1, 3);
    const __m512i c46 = scale_pair_ctrl(4, 6), c57 = scale_pair_ctrl(5, 7);
    __m512i c[4];
    q4k_codes(blk + (five ? Q5_K_QS : Q4_K_QS), c);
    if (five) q5k_high_bits(blk + Q5_K_QH, c);
    /* two short accumulation chains (vpdpwssd latency), summed at the end */
    const __m512i z = _mm512_setzero_si512();
    __m512i a = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(c[0], _mm512_loadu_si512(x->qs)), _mm512_shuffle_epi8(s, c02));
    __m512i a2 = _mm512_dpwssd_epi32(z, _mm512_maddubs_epi16(c[1], _mm512_loadu_si512(x->qs + 64)), _mm512_shuffle_epi8(s, c13));
    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(c[2], _mm512_loadu_si512(x->qs + 128)), _mm512_shuffle_epi8(s, c46));
    a2 = _mm512_dpwssd_epi32(a2, _mm512_maddubs_epi16(c[3], _mm512_loadu_si512(x->qs + 192)), _mm512_shuffle_epi8(s, c57));
    return _mm512_add_epi32(a, a2);
}

/* The scale strips of 16 blocks (u32 words a = bytes 0-3, b = 4-7, c = 8-11
 * of each, lane = block) unpacked as qi_scale_min_k4 does: the eight 6-bit
 * scales of block i as u64 lane i % 8 of sc[i / 8], the mins in lane form. */
static inline void kq_scales16(__m512i a, __m512i b, __m512i c, __m512i *sc, __m512i *m_lo, __m512i *m_hi) {
    const __m512i k3f = _mm512_set1_epi32(0x3F3F3F3F), k0f = _mm512_set1_epi32(0x0F0F0F0F), k03 = _mm512_set1_epi32(0x03030303);
    const __m512i sc_lo = _mm512_and_si512(a, k3f);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(c, k0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), k03), 4));
    *m_lo = _mm512_and_si512(b, k3f);
    *m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), k0f), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(b, 6), k03), 4));
    const __m512i i0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i i1 = _mm512_add_epi32(i0, _mm512_set1_epi32(8));
    sc[0] = _mm512_permutex2var_epi32(sc_lo, i0, sc_hi);
    sc[1] = _mm512_permutex2var_epi32(sc_lo, i1, sc_hi);
}

static inline __attribute__((always_inline)) uint32_t q6k_block(const uint8_t *blk, const mu_block_q8k *x, __m512i *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    const __m512i sh_lo = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(0), _mm512_set1_epi16(2));
    const __m512i sh_hi = _mm512_mask_blend_epi64(0xF0, _mm512_set1_epi16(4), _mm512_set1_epi16(6));
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + Q6_K_SC)));
    const __m512i scz = _mm512_castsi256_si512(sc16);
    __m512i a = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        __m512i q = _mm512_loadu_si512(blk + 64 * h);
        __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + Q6_K_QH + 32 * h)));
        __m512i lo = _mm512_or_si512(_mm512_and_si512(q, m4), _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, sh_lo), m3), 4));
        __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), m4),
                                     _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, sh_hi), m3), 4));
        /* word j of the scale vector of sub-blocks 8h + 4k .. 8h + 4k + 3 */
        const __m512i i0 = _mm512_add_epi16(_mm512_set1_epi16((short)(8 * h)), _mm512_set_epi16(
            3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0));
        const __m512i i1 = _mm512_add_epi16(i0, _mm512_set1_epi16(4));
        a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(lo, _mm512_loadu_si512(x->qs + 128 * h)), _mm512_permutexvar_epi16(i0, scz));
        a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(hi, _mm512_loadu_si512(x->qs + 128 * h + 64)), _mm512_permutexvar_epi16(i1, scz));
    }
    __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x->bsums));
    *acc = _mm512_sub_epi32(a, _mm512_zextsi256_si512(_mm256_slli_epi32(corr, 5)));
    return qi_rd16(blk + Q6_K_D);
}

/* f_b of 16 consecutive blocks starting at p (block index b0 of its row);
 * n < 16 only for the last step (entries past it repeat the last block). */
static inline __attribute__((always_inline)) __m512 kq_step16(const uint8_t *p, uint64_t bb, int n, int64_t b0,
                                                               const act_tables *at, int kind) {
    __m512i acc[16];
    if (kind == 6) {
        uint32_t dm[16];
        for (int i = 0; i < 16; i++) {
            const int k = i < n ? i : n - 1;
            dm[i] = q6k_block(p + (uint64_t)k * bb, at->x[b0 + k], &acc[i]);
        }
        const __m512 xd = _mm512_loadu_ps(at->d + b0); /* lanes past n are not used */
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_loadu_si512(dm)));
        return _mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(hsum16_epi32(acc)));
    } else {
        /* lane i: byte offset of block i (the last one repeated past n) */
        const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
        const __m512i off = _mm512_mullo_epi32(_mm512_min_epi32(lane, _mm512_set1_epi32(n - 1)), _mm512_set1_epi32((int)bb));
        const __m512i dmv = _mm512_i32gather_epi32(off, p, 1);
        __m512i sc[2], m_lo, m_hi;
        kq_scales16(_mm512_i32gather_epi32(off, p + QK_SCALES, 1), _mm512_i32gather_epi32(off, p + QK_SCALES + 4, 1),
                    _mm512_i32gather_epi32(off, p + QK_SCALES + 8, 1), sc, &m_lo, &m_hi);
        for (int i = 0; i < 16; i++) {
            const int k = i < n ? i : n - 1;
            const __m512i s = _mm512_permutexvar_epi64(_mm512_set1_epi64(i % 8), sc[i / 8]);
            acc[i] = q45k_block(p + (uint64_t)k * bb, at->x[b0 + k], s, kind == 5);
        }
        /* summ per lane: sum_j m_j * (128 h_j + l_j), u8 x s8 quads */
        const __m512i z = _mm512_setzero_si512();
        __m512i sh = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, m_lo, _mm512_loadu_si512(at->lo_h + b0)), m_hi,
                                         _mm512_loadu_si512(at->hi_h + b0));
        __m512i sl = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, m_lo, _mm512_loadu_si512(at->lo_l + b0)), m_hi,
                                         _mm512_loadu_si512(at->hi_l + b0));
        const __m512i summ = _mm512_add_epi32(_mm512_slli_epi32(sh, 7), sl);
        const __m512 xd = _mm512_loadu_ps(at->d + b0);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dmv));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dmv, 16)));
        return _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(d, xd), _mm512_cvtepi32_ps(hsum16_epi32(acc))),
                             _mm512_mul_ps(_mm512_mul_ps(dmin, xd), _mm512_cvtepi32_ps(summ)));
    }
}

/* Software prefetch distance of the decode stream, in blocks. */
#define PF_AHEAD 16
/* kind: 4 = Q4_K, 5 = Q5_K, 6 = Q6_K */
static inline __attribute__((always_inline)) void kq_decode(const mu_weight *w, int64_t o0, int64_t o1,
                                                             const mu_block_q8k *xq, float *y, int kind) {
    const int64_t nb = w->n_in / MU_QK_K;
    const uint64_t bb = w->row_bytes / (uint64_t)nb;
    const uint8_t *p = w->data + (uint64_t)o0 * w->row_bytes, *end = w->data + (uint64_t)o1 * w->row_bytes;
    act_tables at;
    act_tables_init(&at, xq, nb);
    int64_t o = o0, b = 0; /* row and block index of p */
    float total = 0.0f;
    while (p < end) {
        const int n = (uint64_t)(end - p) >= 16 * bb ? 16 : (int)((uint64_t)(end - p) / bb);
        const uint8_t *pf = p + (uint64_t)PF_AHEAD * bb, *pf_end = pf + 16 * bb;
        if (pf_end > end) pf_end = end;
        for (; pf < pf_end; pf += 64) _mm_prefetch((const char *)pf, _MM_HINT_T0);
        float fl[16];
        _mm512_storeu_ps(fl, n == 16 ? kq_step16(p, bb, 16, b, &at, kind) : kq_step16(p, bb, n, b, &at, kind));
        for (int i = 0; i < n; i++) {
            total = total + fl[i];
            if (++b == nb) {
                y[o++] = w->has_scale ? total * w->scale : total;
                total = 0.0f;
                b = 0;
            }
        }
        p += (uint64_t)n * bb;
    }
    free(at.mem);
}

static void q4k_decode(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, float *y) { kq_decode(w, o0, o1, xq, y, 4); }
static void q5k_decode(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, float *y) { kq_decode(w, o0, o1, xq, y, 5); }
static void q6k_decode(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, float *y) { kq_decode(w, o0, o1, xq, y, 6); }

/* ---- prefill GEMM for the K-quants: activation rows in lanes ----
 * 16 activation rows per lane group; for each weight block the codes are
 * unpacked once into 256 bytes (the activation layout's order) and every
 * code dword j meets the 16 rows' dword j (xt) in one vpdpbusd, into one
 * accumulator per sub-block. Then, lane-wise and exact in int32:
 *   sumi = sum_s sc_s * acc_s   (Q6_K: - 32 sum_s sc_s bsum_s via bs)
 *   summ = sum_j m_j * bp_j     (Q4_K/Q5_K, via bp)
 * and f_b by the block formula; no horizontal sums at all. */

typedef struct kq_wblock {
    uint8_t codes[256];
    int32_t sc[16];   /* sub-block scales (Q4_K/Q5_K: 8) */
    uint32_t mpair[4]; /* Q4_K/Q5_K mins as int16 pairs */
    float d, dmin;
} kq_wblock;

static inline __attribute__((always_inline)) void kq_unpack(const uint8_t *blk, kq_wblock *wb, int kind) {
    __m512i c[4];
    if (kind == 6) {
        q6k_codes(blk, c);
        for (int s = 0; s < 16; s++) wb->sc[s] = (int8_t)blk[Q6_K_SC + s];
        wb->d = f16_at(blk + Q6_K_D);
    } else {
        uint64_t sc, mn;
        cpu_kq_scales(blk + QK_SCALES, &sc, &mn);
        for (int s = 0; s < 8; s++) wb->sc[s] = (int32_t)((sc >> (8 * s)) & 0xFF);
        for (int k = 0; k < 4; k++)
            wb->mpair[k] = (uint32_t)((mn >> (16 * k)) & 0xFF) | (uint32_t)((mn >> (16 * k + 8)) & 0xFF) << 16;
        q4k_codes(blk + (kind == 5 ? Q5_K_QS : Q4_K_QS), c);
        if (kind == 5) q5k_high_bits(blk + Q5_K_QH, c);
        wb->d = f16_at(blk);
        wb->dmin = f16_at(blk + 2);
    }
    for (int k = 0; k < 4; k++) _mm512_storeu_si512(wb->codes + 64 * k, c[k]);
    /* make the dwords be re-read from memory, as embedded broadcasts, rather
     * than extracted from the registers with shuffles */
    __asm__ volatile("" ::: "memory");
}

/* sub-block of code dword j: Q4_K/Q5_K in ACT_K4 order (32-code chunks
 * 0, 2, 1, 3, 4, 6, 5, 7), Q6_K natural (16 codes = 4 dwords each) */
static inline int kq_sub_of(int j, int kind) {
    static const int K4[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    return kind == 6 ? j / 4 : K4[j / 8];
}

/* The i-th dword to issue: round robin over the sub-blocks (8 for Q4_K and
 * Q5_K, 16 for Q6_K), so consecutive vpdpbusd feed different accumulators
 * and never wait on each other's latency. Integer sums: any order gives
 * the same bits. */
static inline int kq_dword_at(int i, int kind) {
    static const int K4[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    if (kind == 6) return (i % 16) * 4 + i / 16;
    const int c = K4[i % 8]; /* sub-block i % 8 is code chunk c: dwords 8c .. 8c + 7 */
    return c * 8 + i / 8;
}

/* f_b of the 16 rows r0 .. r0 + 15 from their per-sub-block sums acc. */
static inline __attribute__((always_inline)) __m512 kq_fb_epilogue(const kq_wblock *wb, const __m512i *acc,
                                                                   const act_side *sd, int64_t b, int64_t r0, int kind) {
    const int n_sub = kind == 6 ? 16 : 8;
    const int64_t rpad = sd->rpad;
    __m512i sumi = _mm512_mullo_epi32(acc[0], _mm512_set1_epi32(wb->sc[0]));
#pragma GCC unroll 16
    for (int s = 1; s < n_sub; s++) sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(acc[s], _mm512_set1_epi32(wb->sc[s])));
    const __m512 xd = _mm512_loadu_ps(sd->xd + b * rpad + r0);
    if (kind == 6) {
        __m512i corr = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++)
            corr = _mm512_dpwssd_epi32(corr, _mm512_set1_epi32((int)pack16(wb->sc[2 * k], wb->sc[2 * k + 1])),
                                       _mm512_loadu_si512(sd->bs + (b * 8 + k) * rpad + r0));
        sumi = _mm512_sub_epi32(sumi, _mm512_slli_epi32(corr, 5));
        return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(wb->d), xd), _mm512_cvtepi32_ps(sumi));
    }
    __m512i summ = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++)
        summ = _mm512_dpwssd_epi32(summ, _mm512_set1_epi32((int)wb->mpair[k]), _mm512_loadu_si512(sd->bp + (b * 4 + k) * rpad + r0));
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(wb->d), xd), _mm512_cvtepi32_ps(sumi)),
                         _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(wb->dmin), xd), _mm512_cvtepi32_ps(summ)));
}

/* The xt codes of block b for the 16-row group starting at r0. */
static inline const uint32_t *kq_xt_at(const act_side *sd, int64_t nb, int64_t b, int64_t r0) {
    return sd->xt + (r0 / 16 * nb + b) * 64 * 16;
}

static inline __attribute__((always_inline)) __m512 kq_lanes_fb(const kq_wblock *wb, const act_side *sd, int64_t nb,
                                                                int64_t b, int64_t r0, int kind) {
    const uint32_t *xt = kq_xt_at(sd, nb, b, r0);
    __m512i acc[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; s++) acc[s] = _mm512_setzero_si512();
#pragma GCC unroll 64
    for (int i = 0; i < 64; i++) {
        const int j = kq_dword_at(i, kind), s = kq_sub_of(j, kind);
        acc[s] = _mm512_dpbusd_epi32(acc[s], _mm512_set1_epi32((int)cpu_rd32(wb->codes + 4 * j)),
                                     _mm512_loadu_si512(xt + j * 16));
    }
    return kq_fb_epilogue(wb, acc, sd, b, r0, kind);
}

#define KQ_GROUPS 2

/* Q4_K/Q5_K, G = KQ_GROUPS 16-row groups (rows r0 .. r0 + 16G - 1) at once: each
 * code dword is broadcast once for all groups' vpdpbusd and the block is
 * unpacked once per 16G rows (8G accumulators; Q6_K's 16 sub-blocks would
 * need 32 for two groups). Each lane's f_b is kq_lanes_fb's. G = 3 measured
 * 6-8 % slower than 2 on the Intel host (not investigated) and no faster on
 * Zen 5, so KQ_GROUPS is 2. */
static inline __attribute__((always_inline)) void kq_lanes_fbg(const kq_wblock *wb, const act_side *sd, int64_t nb,
                                                               int64_t b, int64_t r0, int kind, __m512 *f) {
    enum { G = KQ_GROUPS };
    const uint32_t *xt[G];
    __m512i acc[G][8];
    for (int g = 0; g < G; g++) {
        xt[g] = kq_xt_at(sd, nb, b, r0 + 16 * g);
        for (int s = 0; s < 8; s++) acc[g][s] = _mm512_setzero_si512();
    }
#pragma GCC unroll 64
    for (int i = 0; i < 64; i++) {
        const int j = kq_dword_at(i, 4), s = i % 8; /* Q4_K and Q5_K order alike: sub-block i % 8 */
        const __m512i wv = _mm512_set1_epi32((int)cpu_rd32(wb->codes + 4 * j));
        for (int g = 0; g < G; g++) acc[g][s] = _mm512_dpbusd_epi32(acc[g][s], wv, _mm512_loadu_si512(xt[g] + j * 16));
    }
    for (int g = 0; g < G; g++) f[g] = kq_fb_epilogue(wb, acc[g], sd, b, r0 + 16 * g, kind);
}

/* rows_o0: the GGUF bytes of row o0 (w->data's, or a copy: the X16 path).
 * Passes of 16 KQ_GROUPS activation rows (Q6_K: 16) over the task's weight rows. */
static inline __attribute__((always_inline)) void kq_gemm16(const mu_weight *w, const uint8_t *rows_o0, int64_t o0,
                                                             int64_t o1, const void *act, int64_t rows, float *y, int kind) {
    const act_side sd = side_of(w, act, rows);
    const int64_t nb = w->n_in / MU_QK_K, slice = 4, step = kind == 6 ? 16 : 16 * KQ_GROUPS;
    const uint64_t bb = w->row_bytes / (uint64_t)nb;
    float *totals = mu_xmalloc((size_t)(o1 - o0) * 16 * KQ_GROUPS * sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
        const int64_t left = (rows - r0 + 15) / 16;
        const int groups = (int)(left < step / 16 ? left : step / 16);
        memset(totals, 0, (size_t)(o1 - o0) * 16 * KQ_GROUPS * sizeof(float));
        for (int64_t b0 = 0; b0 < nb; b0 += slice) {
            const int64_t b1 = b0 + slice < nb ? b0 + slice : nb;
            for (int64_t o = o0; o < o1; o++) {
                const uint8_t *row = rows_o0 + (uint64_t)(o - o0) * w->row_bytes;
                float *tot = totals + (o - o0) * 16 * KQ_GROUPS;
                for (int64_t b = b0; b < b1; b++) {
                    kq_wblock wb;
                    kq_unpack(row + (uint64_t)b * bb, &wb, kind);
                    __m512 f[KQ_GROUPS];
                    if (groups == KQ_GROUPS) kq_lanes_fbg(&wb, &sd, nb, b, r0, kind, f);
                    else f[0] = kq_lanes_fb(&wb, &sd, nb, b, r0, kind);
                    for (int g = 0; g < groups; g++)
                        _mm512_storeu_ps(tot + 16 * g, _mm512_add_ps(_mm512_loadu_ps(tot + 16 * g), f[g]));
                }
            }
        }
        /* 16 x 16 blocks of (output, row) transposed into row-major stores */
        for (int g = 0; g < groups; g++)
            for (int64_t og = o0; og < o1; og += 16) {
                const int64_t rg = r0 + 16 * g;
                __m512 t[16];
                for (int i = 0; i < 16; i++) t[i] = _mm512_loadu_ps(totals + (og + i < o1 ? og + i - o0 : 0) * 16 * KQ_GROUPS + 16 * g);
                transpose16(t);
                const __mmask16 m = tail_mask(o1 - og);
                for (int64_t ri = 0; ri < 16 && rg + ri < rows; ri++) {
                    __m512 v = w->has_scale ? _mm512_mul_ps(t[ri], _mm512_set1_ps(w->scale)) : t[ri];
                    _mm512_mask_storeu_ps(y + (rg + ri) * w->n_out + og, m, v);
                }
            }
    }
    free(totals);
}

/* 2-8 activation rows (speculative verify, draft heads): kq_lanes_fb on
 * 256-bit vectors, the rows in lanes 0-7 of the 16-row group. Zen 4 runs a
 * 256-bit vpdpbusd at twice the rate of a 512-bit one, so eight rows cost
 * half of a 16-lane pass with half its lanes idle. Same f_b formula, same
 * block order: the same bits as kq_gemm16 and the reference. */
static inline __attribute__((always_inline)) __m256 kq_lanes_fb8(const kq_wblock *wb, const uint32_t *xt, int64_t rpad,
                                                                 const act_side *sd, int64_t b, int kind) {
    const int n_sub = kind == 6 ? 16 : 8;
    __m256i acc[16];
#pragma GCC unroll 16
    for (int s = 0; s < 16; s++) acc[s] = _mm256_setzero_si256();
#pragma GCC unroll 64
    for (int i = 0; i < 64; i++) {
        const int j = kq_dword_at(i, kind), s = kq_sub_of(j, kind);
        acc[s] = _mm256_dpbusd_epi32(acc[s], _mm256_set1_epi32((int)cpu_rd32(wb->codes + 4 * j)),
                                     _mm256_loadu_si256((const __m256i *)(xt + j * 16)));
    }
    __m256i sumi = _mm256_mullo_epi32(acc[0], _mm256_set1_epi32(wb->sc[0]));
#pragma GCC unroll 16
    for (int s = 1; s < n_sub; s++) sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(acc[s], _mm256_set1_epi32(wb->sc[s])));
    const __m256 xd = _mm256_loadu_ps(sd->xd + b * rpad);
    if (kind == 6) {
        __m256i corr = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++)
            corr = _mm256_dpwssd_epi32(corr, _mm256_set1_epi32((int)pack16(wb->sc[2 * k], wb->sc[2 * k + 1])),
                                       _mm256_loadu_si256((const __m256i *)(sd->bs + (b * 8 + k) * rpad)));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wb->d), xd), _mm256_cvtepi32_ps(sumi));
    }
    __m256i summ = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++)
        summ = _mm256_dpwssd_epi32(summ, _mm256_set1_epi32((int)wb->mpair[k]),
                                   _mm256_loadu_si256((const __m256i *)(sd->bp + (b * 4 + k) * rpad)));
    return _mm256_sub_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wb->d), xd), _mm256_cvtepi32_ps(sumi)),
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wb->dmin), xd), _mm256_cvtepi32_ps(summ)));
}

static inline __attribute__((always_inline)) void kq_gemm8(const mu_weight *w, int64_t o0, int64_t o1, const void *act,
                                                            int64_t rows, float *y, int kind) {
    const act_side sd = side_of(w, act, rows);
    const int64_t nb = w->n_in / MU_QK_K;
    const uint64_t bb = w->row_bytes / (uint64_t)nb;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = w->data + (uint64_t)o * w->row_bytes;
        __m256 t = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            kq_wblock wb;
            kq_unpack(row + (uint64_t)b * bb, &wb, kind);
            t = _mm256_add_ps(t, kq_lanes_fb8(&wb, sd.xt + b * 64 * 16, sd.rpad, &sd, b, kind));
        }
        if (w->has_scale) t = _mm256_mul_ps(t, _mm256_set1_ps(w->scale));
        float f[8];
        _mm256_storeu_ps(f, t);
        for (int64_t r = 0; r < rows; r++) y[r * w->n_out + o] = f[r];
    }
}

static void q4k_gemm8(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) { kq_gemm8(w, o0, o1, act, rows, y, 4); }
static void q5k_gemm8(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) { kq_gemm8(w, o0, o1, act, rows, y, 5); }
static void q6k_gemm8(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) { kq_gemm8(w, o0, o1, act, rows, y, 6); }

static void q4k_gemm16(const mu_weight *w, const uint8_t *r, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) { kq_gemm16(w, r, o0, o1, act, rows, y, 4); }
static void q5k_gemm16(const mu_weight *w, const uint8_t *r, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) { kq_gemm16(w, r, o0, o1, act, rows, y, 5); }
static void q6k_gemm16(const mu_weight *w, const uint8_t *r, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) { kq_gemm16(w, r, o0, o1, act, rows, y, 6); }

static void kq_gemm16_any(const mu_weight *w, const uint8_t *r, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) {
    switch (w->type) {
    case MU_TYPE_Q4_K: q4k_gemm16(w, r, o0, o1, act, rows, y); break;
    case MU_TYPE_Q5_K: q5k_gemm16(w, r, o0, o1, act, rows, y); break;
    default: q6k_gemm16(w, r, o0, o1, act, rows, y); break;
    }
}

static tile_step_fn step_for(const mu_weight *w) {
    if (!mu_weight_uses_q8k(w, NULL)) return NULL;
    switch (w->type) {
    case MU_TYPE_Q4_K: return q4k_step;
    case MU_TYPE_Q5_K: return q5k_step;
    case MU_TYPE_Q6_K: return q6k_step;
    case MU_TYPE_Q8_0: return q8_0_step;
    case MU_TYPE_Q4_0: return q4_0_step;
    case MU_TYPE_NVFP4: return nvfp4g_step;
    case MU_TYPE_NVFP4_E2M1: return nvfp4n_step;
    default: return NULL;
    }
}

bool mu_cpu_avx512_q_supported(const mu_weight *w) { return step_for(w) != NULL; }

void mu_cpu_avx512_qmatmul(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) {
    const mu_block_q8k *xq = act;
    if (w->layout == MU_LAYOUT_X16) { /* o0 is a multiple of 16 (cpu_backend.c's split) */
        const int64_t split = o1 < mu_cpu_pack_rows(w, 16) ? o1 : mu_cpu_pack_rows(w, 16);
        /* The X16 kernel at every row count: each group's weights stay in cache across its
         * 4-row tiles, which beats turning the groups back into GGUF rows for the GEMM
         * (that unpack rewrote the whole model once per forward: ~200 ms a step on the
         * small model, so 9-16 rows cost 3x 8; pp512 94.8 -> 114.6 tokens/s). */
        if (o0 < split) mu_cpu_avx512_x16_matmul(w, o0, split, xq, rows, y);
        if (split >= o1) return;
        o0 = split > o0 ? split : o0; /* the rows past the last group keep the GGUF layout */
    }
    if (rows == 1) {
        switch (w->type) {
        case MU_TYPE_Q4_K: q4k_decode(w, o0, o1, xq, y); return;
        case MU_TYPE_Q5_K: q5k_decode(w, o0, o1, xq, y); return;
        case MU_TYPE_Q6_K: q6k_decode(w, o0, o1, xq, y); return;
        default: break;
        }
    }
    if (rows >= 5 && rows <= 8) {
        switch (w->type) {
        case MU_TYPE_Q4_K: q4k_gemm8(w, o0, o1, act, rows, y); return;
        case MU_TYPE_Q5_K: q5k_gemm8(w, o0, o1, act, rows, y); return;
        case MU_TYPE_Q6_K: q6k_gemm8(w, o0, o1, act, rows, y); return;
        default: break;
        }
    }
    if (rows >= 9 && (w->type == MU_TYPE_Q4_K || w->type == MU_TYPE_Q5_K || w->type == MU_TYPE_Q6_K)) {
        kq_gemm16_any(w, w->data + (uint64_t)o0 * w->row_bytes, o0, o1, act, rows, y);
        return;
    }
    run_tiles(w, o0, o1, act, rows, y, step_for(w));
}

#pragma GCC pop_options
#endif
