/* k_mmt: the weight-streaming product for calls of 1 to 32 rows on the
 * int8 tensor cores (docs/cuda.md, "Few rows on the tensor cores"). Same
 * exactness rules as the other products (docs/numerics.md): the integer
 * sums of a block in any order (exact), f_b by the written formula, each
 * (row, output) total adds f_b strictly in block order from 0.0f.
 * Compiled with -fmad=false (CMakeLists.txt).
 *
 * Why: k_mmv2 does the integer sums with dp4a, once per activation row, so
 * 4 and 8 rows cost 2.1x and 3.5x one row per weight (compute-bound).
 * Here one mma.sync takes 16 outputs x 8 rows of a 32-value sub-block, so
 * up to 8 rows cost one row's instructions and the call stays bound by
 * the weight stream.
 *
 * Shape: a CTA of 4 warps takes 16 outputs of one weight (set launches
 * number the CTAs across up to 4 weights sharing the activations). Warp w
 * takes the 256-blocks w, w + 4, ...; the 16 outputs' raw blocks stream
 * through a per-warp cp.async ring (2 to 4 stages) in shared memory, with
 * the block's activations.
 * Per block, the weights are the mma's A operand (rows = outputs g and
 * g + 8 of the lane's group), the activations its B operand (columns =
 * rows 0..7, and 8..15, 16..23, 24..31 in further tiles: NT of them):
 *  - Q4_K/Q5_K, m16n8k32 per 32-value sub-block: lane t of a group holds
 *    code bytes 8t..8t+7 of the sub-block pair (values 8t..8t+7 of both),
 *    i.e. mma k 4t+c is value 8t+c and k 16+4t+c is value 8t+4+c, for
 *    weights and activations alike, so the sum pairs the right values;
 *  - Q6_K, m16n8k16 per 16-value group (a scale each), k = value;
 *  - each mma result times its sub-block scale is added in int32 (exact);
 *    Q4_K/Q5_K's summ = sum_j m_j * (bs[2j] + bs[2j+1]) by dp2a;
 *  - f_b by the formula (the same expression as k_mmv2 and k_gemm_kq2).
 * After each round of 4 blocks (one per warp) the CTA meets at a barrier
 * and one thread per (output, row) adds the round's 4 f_b to its total in
 * block order (f_b double-buffered in shared memory). */
#include "backend/cuda/cuda_mmt.h"
#include "backend/cuda/cuda_common.cuh"
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>

enum { M_Q4_K = 12, M_Q5_K = 13, M_Q6_K = 14 }; /* ggml type ids (quant.h) */

#define MMT_NW 4     /* warps per CTA */

/* A weight block's bytes in a stage: BYTES copied (Q6_K: ql|qh of the split
 * layout, then its 16 scales), one output every LD bytes. LD keeps each
 * lane group's shared-memory loads in distinct banks: Q4_K/Q5_K's 8-byte
 * loads per half-warp (4 outputs 8 words apart mod 32: 40 and 44 words),
 * Q6_K's 4-byte loads per warp (8 outputs 4 words apart mod 32: 52). */
template <int TYPE> struct mmt_fmt {
    static constexpr int BYTES = TYPE == M_Q4_K ? 144 : TYPE == M_Q5_K ? 176 : 192;
    static constexpr int LD = TYPE == M_Q4_K ? 160 : TYPE == M_Q5_K ? 176 : 208;
    static constexpr int QOFF = TYPE == M_Q5_K ? 48 : 16;
    static constexpr int STAGE = 16 * LD + (TYPE == M_Q6_K ? 64 : 0); /* Q6_K: + the 16 outputs' d (4 bytes each) */
};

/* The weight bytes of a stage for a type (host and device). */
static inline int mmt_stage_bytes(uint32_t type) {
    return type == M_Q4_K ? mmt_fmt<M_Q4_K>::STAGE : type == M_Q5_K ? mmt_fmt<M_Q5_K>::STAGE : mmt_fmt<M_Q6_K>::STAGE;
}

/* Each stage also holds the block's activations, so a round waits on no
 * global load: the nr rows' codes (a row every XLD bytes: 72 words, 8 apart
 * mod 32, for the 8-byte loads of Q4_K/Q5_K; 68 words for Q6_K's 4-byte
 * loads), then Q4_K/Q5_K's bsums (32 bytes a row), then d (4 bytes a row). */
template <int TYPE> struct mmt_act {
    static constexpr int XLD = TYPE == M_Q6_K ? 272 : 288;
};
#define MMT_XLD_MAX 288
static inline int mmt_act_bytes(int nr) { return nr * (MMT_XLD_MAX + 32) + (nr * 4 + 15) / 16 * 16; }

struct mmt_set {
    const uint8_t *W[MUCU_MMT_SET_MAX];
    float *y[MUCU_MMT_SET_MAX];
    int64_t n_out[MUCU_MMT_SET_MAX];
    int first[MUCU_MMT_SET_MAX + 1]; /* first CTA (16-output tile) of each weight */
    int type[MUCU_MMT_SET_MAX], has_scale[MUCU_MMT_SET_MAX];
    float scale[MUCU_MMT_SET_MAX];
    int n;
};

/* The weight of the set that 16-output tile `tile` belongs to. */
__device__ static inline int mmt_weight_of(const mmt_set &set, int tile) {
    int i = 0;
    while (i + 1 < set.n && tile >= set.first[i + 1]) i++;
    return i;
}

/* A lane's share of a tile's weight copies: chunk i = lane + 32m (m < PER)
 * is output i / CH's 16-byte chunk i % CH; per block only the block's
 * base moves, so the plan holds each chunk's offsets from it (the chunk
 * map is the contiguous one: a warp's copy covers 3-4 whole blocks). */
template <int TYPE> struct mmt_plan {
    static constexpr int CH = mmt_fmt<TYPE>::BYTES / 16, PER = (16 * CH + 31) / 32;
    int goff[PER];  /* from the block of output o0: o * nb * BYTES + 16c */
    int soff[PER];  /* in the stage: o * LD + 16c */
    unsigned valid; /* bit m: chunk m exists and its output is < n_out */
};

template <int TYPE>
__device__ static inline void mmt_plan_init(mmt_plan<TYPE> &pl, int64_t n_out, int nb, int64_t o0, int lane) {
    typedef mmt_fmt<TYPE> F;
    constexpr int CH = mmt_plan<TYPE>::CH;
    pl.valid = 0;
#pragma unroll
    for (int m = 0; m < mmt_plan<TYPE>::PER; m++) {
        const int i = lane + 32 * m, o = i / CH, c = i - o * CH;
        pl.goff[m] = o * nb * F::BYTES + 16 * c;
        pl.soff[m] = o * F::LD + 16 * c;
        if (i < 16 * CH && o0 + o < n_out) pl.valid |= 1u << m;
    }
}

/* Issue the copies of block b of outputs o0..o0+15 into stage st (lanes of one warp). */
template <int TYPE>
__device__ static inline void mmt_load(uint8_t *st, const mmt_plan<TYPE> &pl, const uint8_t *W, int64_t n_out, int nb,
                                       int64_t o0, int b, int lane) {
    typedef mmt_fmt<TYPE> F;
    const uint8_t *base = W + (o0 * nb + b) * F::BYTES;
#pragma unroll
    for (int m = 0; m < mmt_plan<TYPE>::PER; m++) {
        if (lane + 32 * m >= 16 * mmt_plan<TYPE>::CH) break; /* the same for every block */
        const bool v = (pl.valid >> m) & 1u;
        cp16(st + pl.soff[m], v ? base + pl.goff[m] : W, v);
    }
    if (TYPE == M_Q6_K && lane < 16) {
        const int64_t total = n_out * (int64_t)nb, item = (o0 + lane) * nb + b;
        const bool v = o0 + lane < n_out;
        const uint8_t *sc = W + total * 192, *dd = W + total * 208;
        cp16(st + lane * F::LD + 192, v ? sc + item * 16 : W, v);
        /* d is f16 at dd + 2*item: copy the 4-aligned pair holding it (only
         * its first half when it is the array's last, even item) */
        const int64_t pair = item & ~(int64_t)1;
        const int n = !v ? 0 : ((item | 1) < total ? 4 : 2);
        cp4(st + 16 * F::LD + 4 * lane, v ? dd + 2 * pair : W, n);
    }
}

/* Issue the copies of block b's activations (nr rows) into the stage's
 * activation area sa (lanes of one warp). */
template <int TYPE, int NT>
__device__ static inline void mmt_load_act(uint8_t *sa, int nr, int b, int nb, const int8_t *qs, const float *xd,
                                           const int16_t *bs, int lane) {
    constexpr int XLD = mmt_act<TYPE>::XLD;
    /* rows up to 16 (NT <= 2) or 32 (NT = 4): with 32 for every tile count
     * ptxas compiled the one- and two-tile kernels otherwise (k_mmt<1, 2>
     * 96 registers instead of 128, k_mmt<2, 2> 118 instead of 112), and on
     * an H100 4 sequences decoded at 2.80x one instead of 3.35x and
     * speculation ran at 1.82x-1.85x plain instead of 1.88x-1.92x
     * (tests/cuda/ptxas_pins.py pins them since); with this bound their
     * PTX is again the one before the 32-row tiles */
    constexpr int M = NT > 2 ? 16 : 8;
    const int64_t n_in = (int64_t)nb * 256;
    /* chunk i = lane + 32m: row (lane >> 4) + 2m, chunk lane & 15 */
    const int r0 = lane >> 4, c = lane & 15;
    const int8_t *src = qs + r0 * n_in + (int64_t)b * 256 + 16 * c;
    uint8_t *dst = sa + r0 * XLD + 16 * c;
#pragma unroll
    for (int m = 0; m < M; m++) {
        if (r0 + 2 * m >= nr) break;
        cp16(dst + 2 * m * XLD, src + 2 * m * n_in, true);
    }
    uint8_t *sb = sa + nr * MMT_XLD_MAX;
    if (TYPE != M_Q6_K)
        for (int i = lane; i < nr * 2; i += 32) {
            const int r = i >> 1, h = i & 1;
            cp16(sb + 32 * r + 16 * h, bs + ((int64_t)r * nb + b) * 16 + 8 * h, true);
        }
    if (lane < nr) cp4(sb + 32 * nr + 4 * lane, xd + (int64_t)lane * nb + b, 4);
}

/* The arithmetic k_mmt and k_mmq share (the same expressions, so the same
 * bits). A Q4_K/Q5_K header (d|dmin|12 scale bytes) unpacked: d, dmin, and
 * the 8 scales and the 8 mins four to a word (kq_scales_mins). */
__device__ static inline void kq_header(uint4 hd, float &d, float &dmin, uint32_t sc[2], uint32_t mn[2]) {
    d = h2f((uint16_t)(hd.x & 0xFFFF));
    dmin = h2f((uint16_t)(hd.x >> 16));
    const kq_scmin k = kq_scales_mins(hd.y, hd.z, hd.w); /* cuda_common.cuh */
    sc[0] = k.sc03, sc[1] = k.sc47, mn[0] = k.mn03, mn[1] = k.mn47;
}

/* The mins as dp2a operands: mp[k] holds bytes (m_2k, m_2k, m_2k+1, m_2k+1). */
__device__ static inline void kq_min_pairs(const uint32_t mn[2], uint32_t mp[4]) {
    mp[0] = __byte_perm(mn[0], 0, 0x1100);
    mp[1] = __byte_perm(mn[0], 0, 0x3322);
    mp[2] = __byte_perm(mn[1], 0, 0x1100);
    mp[3] = __byte_perm(mn[1], 0, 0x3322);
}

/* Q4_K/Q5_K f_b of one (output, row): summ = sum_j m_j * (bs[2j] + bs[2j+1])
 * by dp2a (word j of the row's bsums w0|w1 holds bs[2j], bs[2j+1]), then
 * the formula. */
__device__ static inline float kq_fb(float d, float dmin, float xdv, int32_t sumi, uint4 w0, uint4 w1,
                                     const uint32_t mp[4]) {
    int32_t s = 0;
    s = __dp2a_lo((int)w0.x, (int)mp[0], s);
    s = __dp2a_hi((int)w0.y, (int)mp[0], s);
    s = __dp2a_lo((int)w0.z, (int)mp[1], s);
    s = __dp2a_hi((int)w0.w, (int)mp[1], s);
    s = __dp2a_lo((int)w1.x, (int)mp[2], s);
    s = __dp2a_hi((int)w1.y, (int)mp[2], s);
    s = __dp2a_lo((int)w1.z, (int)mp[3], s);
    s = __dp2a_hi((int)w1.w, (int)mp[3], s);
    return (d * xdv) * (float)sumi - (dmin * xdv) * (float)s;
}

/* Q4_K/Q5_K: 4 codes of nibble half sh of word q, with Q5_K's fifth bits
 * (bit j of each byte of qh) */
template <int TYPE> __device__ static inline uint32_t kq_codes(uint32_t q, int sh, uint32_t qh, int j) {
    uint32_t a = (q >> sh) & 0x0F0F0F0Fu;
    if (TYPE == M_Q5_K) a |= ((qh >> j) & 0x01010101u) << 4;
    return a;
}

/* Q6_K: 4 values, nibble at nsh of ql word q with 2 bits at hsh of qh word h above it, minus 32. */
__device__ static inline uint32_t q6_codes(uint32_t q, uint32_t h, int nsh, int hsh) {
    return __vsub4(((q >> nsh) & 0x0F0F0F0Fu) | (((h >> hsh) & 0x03030303u) << 4), 0x20202020u);
}

/* f[nt][e] for this lane's elements of block b: output g + 8 (e >> 1), row
 * 8 nt + 2t + (e & 1). Rows >= nr give unused values. */
template <int TYPE, int NT>
__device__ static inline void mmt_block(const uint8_t *st, const uint8_t *sa, int b, int nb, int64_t o0, int nr,
                                        int g, int t, float f[NT][4]) {
    typedef mmt_fmt<TYPE> F;
    constexpr int XLD = mmt_act<TYPE>::XLD;
    const uint8_t *sbs = sa + nr * MMT_XLD_MAX;
    const float *sxd = (const float *)(sbs + 32 * nr);
    const uint8_t *pa = st + g * F::LD, *pb = st + (g + 8) * F::LD;
    int32_t sumi[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) sumi[nt][e] = 0;
    float d[2], dmin[2] = {0.0f, 0.0f};
    if (TYPE != M_Q6_K) {
        /* scales and mins of outputs g (h = 0) and g + 8 (h = 1) */
        uint32_t sc[2][2], mn[2][2];
        uint2 qh[2] = {make_uint2(0, 0), make_uint2(0, 0)};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t *p = h ? pb : pa;
            /* one 16-byte load: at 4 bytes, outputs g and g + 4 share banks */
            kq_header(*(const uint4 *)p, d[h], dmin[h], sc[h], mn[h]);
            if (TYPE == M_Q5_K) qh[h] = *(const uint2 *)(p + 16 + 8 * t); /* bit j of qh[l]: value 32j + l */
        }
        /* activation codes of row 8 nt + g: values 8t..8t+7 of each sub-block */
        uint2 xv[NT][8];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = 8 * nt + g;
            const uint8_t *xr = sa + (r < nr ? r : 0) * XLD + 8 * t;
#pragma unroll
            for (int j = 0; j < 8; j++) xv[nt][j] = r < nr ? *(const uint2 *)(xr + 32 * j) : make_uint2(0, 0);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint2 qa = *(const uint2 *)(pa + F::QOFF + 32 * i + 8 * t);
            const uint2 qb = *(const uint2 *)(pb + F::QOFF + 32 * i + 8 * t);
#pragma unroll
            for (int hb = 0; hb < 2; hb++) {
                const int j = 2 * i + hb, sh = 4 * hb;
                const uint32_t a0 = kq_codes<TYPE>(qa.x, sh, qh[0].x, j), a2 = kq_codes<TYPE>(qa.y, sh, qh[0].y, j);
                const uint32_t a1 = kq_codes<TYPE>(qb.x, sh, qh[1].x, j), a3 = kq_codes<TYPE>(qb.y, sh, qh[1].y, j);
                const int32_t sa = (int32_t)((sc[0][j >> 2] >> (8 * (j & 3))) & 0xFF);
                const int32_t sb = (int32_t)((sc[1][j >> 2] >> (8 * (j & 3))) & 0xFF);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    int32_t c[4];
                    mma_k32(c, a0, a1, a2, a3, xv[nt][j].x, xv[nt][j].y);
                    sumi[nt][0] += sa * c[0];
                    sumi[nt][1] += sa * c[1];
                    sumi[nt][2] += sb * c[2];
                    sumi[nt][3] += sb * c[3];
                }
            }
        }
        uint32_t mp[2][4];
        kq_min_pairs(mn[0], mp[0]);
        kq_min_pairs(mn[1], mp[1]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int r = 8 * nt + 2 * t + rr;
                const float xdv = r < nr ? sxd[r] : 0.0f;
                uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
                if (r < nr) {
                    const uint4 *bp = (const uint4 *)(sbs + 32 * r);
                    w0 = bp[0];
                    w1 = bp[1];
                }
#pragma unroll
                for (int h = 0; h < 2; h++)
                    f[nt][2 * h + rr] = kq_fb(d[h], dmin[h], xdv, sumi[nt][2 * h + rr], w0, w1, mp[h]);
            }
    } else {
        /* Q6_K: group s (values 16s..16s+15, scale s), value 128h + lv (h = s >> 3,
         * lv = 16 (s & 7) + c) is the nibble (lv >= 64) of ql[64h + lv % 64] with bits
         * 2 (lv >> 5), +1 of qh[32h + lv % 32] above it, minus 32; lane t takes c = 4t..4t+3 */
        const uint4 s4a = *(const uint4 *)(pa + 192), s4b = *(const uint4 *)(pb + 192);
        const uint32_t sca[4] = {s4a.x, s4a.y, s4a.z, s4a.w}, scb[4] = {s4b.x, s4b.y, s4b.z, s4b.w};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t item = (o0 + g + 8 * h) * nb + b;
            const uint16_t *dp = (const uint16_t *)(st + 16 * F::LD + 4 * (g + 8 * h));
            d[h] = h2f(dp[item & 1]);
        }
        uint32_t xv[NT][16];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int r = 8 * nt + g;
            const uint8_t *xr = sa + (r < nr ? r : 0) * XLD + 4 * t;
#pragma unroll
            for (int s = 0; s < 16; s++) xv[nt][s] = r < nr ? *(const uint32_t *)(xr + 16 * s) : 0u;
        }
#pragma unroll
        for (int s = 0; s < 16; s++) {
            const int h = s >> 3, l0 = 16 * (s & 7);
            const int qlo = 64 * h + (l0 & 63) + 4 * t, qho = 128 + 32 * h + (l0 & 31) + 4 * t;
            const int nsh = l0 >= 64 ? 4 : 0, hsh = 2 * (l0 >> 5);
            const uint32_t qa = *(const uint32_t *)(pa + qlo), ha = *(const uint32_t *)(pa + qho);
            const uint32_t qb = *(const uint32_t *)(pb + qlo), hb = *(const uint32_t *)(pb + qho);
            const uint32_t a0 = q6_codes(qa, ha, nsh, hsh), a1 = q6_codes(qb, hb, nsh, hsh);
            const int32_t sa = (int32_t)(int8_t)(sca[s >> 2] >> (8 * (s & 3)));
            const int32_t sb = (int32_t)(int8_t)(scb[s >> 2] >> (8 * (s & 3)));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int32_t c[4];
                mma_k16(c, a0, a1, xv[nt][s]);
                sumi[nt][0] += sa * c[0];
                sumi[nt][1] += sa * c[1];
                sumi[nt][2] += sb * c[2];
                sumi[nt][3] += sb * c[3];
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                const int r = 8 * nt + 2 * t + rr;
                const float xdv = r < nr ? sxd[r] : 0.0f;
#pragma unroll
                for (int h = 0; h < 2; h++) f[nt][2 * h + rr] = (d[h] * xdv) * (float)sumi[nt][2 * h + rr];
            }
    }
}

/* One CTA: 16 outputs from o0 of weight W, every block, every row. A
 * stage is stage_bytes: the weights, then from xoff the activations. */
template <int TYPE, int NT, int ST>
__device__ static inline void mmt_tile(uint8_t *sm, int stage_bytes, int xoff, const uint8_t *W, int64_t n_out,
                                       int64_t o0, int nb, const int8_t *qs, const float *xd, const int16_t *bs,
                                       int nr, float *y, int has_scale, float scale) {
    constexpr int R = 8 * NT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    uint8_t *ring = sm + warp * ST * stage_bytes;
    float *fb = (float *)(sm + MMT_NW * ST * stage_bytes); /* [2][MMT_NW][16][R] */
    const int rounds = (nb + MMT_NW - 1) / MMT_NW;
    mmt_plan<TYPE> pl;
    mmt_plan_init<TYPE>(pl, n_out, nb, o0, lane);
    /* Stages 0..ST-2: their weights before grid_dep_wait (weights are never
     * written), their activations after it; stage k's copies are complete
     * once commit group k is (the weights went into group 0). */
#pragma unroll
    for (int k = 0; k < ST - 1; k++) {
        const int b = warp + MMT_NW * k;
        if (k < rounds && b < nb) mmt_load<TYPE>(ring + k * stage_bytes, pl, W, n_out, nb, o0, b, lane);
    }
    grid_dep_wait();
#pragma unroll
    for (int k = 0; k < ST - 1; k++) {
        const int b = warp + MMT_NW * k;
        if (k < rounds && b < nb) mmt_load_act<TYPE, NT>(ring + k * stage_bytes + xoff, nr, b, nb, qs, xd, bs, lane);
        cp_commit();
    }
    float total[NT];
#pragma unroll
    for (int q = 0; q < NT; q++) total[q] = 0.0f;
    for (int k = 0; k < rounds; k++) {
        { /* round k + ST - 1 into the stage read in round k - 1 (before the barrier) */
            const int kn = k + ST - 1, b = warp + MMT_NW * kn;
            uint8_t *stn = ring + (kn % ST) * stage_bytes;
            if (kn < rounds && b < nb) {
                mmt_load<TYPE>(stn, pl, W, n_out, nb, o0, b, lane);
                mmt_load_act<TYPE, NT>(stn + xoff, nr, b, nb, qs, xd, bs, lane);
            }
            cp_commit();
        }
        cp_wait<ST - 1>(); /* this lane's copies of round k have landed */
        __syncwarp();     /* and every lane's */
        const int b = warp + MMT_NW * k;
        float *fr = fb + ((k & 1) * MMT_NW + warp) * 16 * R;
        if (b < nb) {
            const uint8_t *st = ring + (k % ST) * stage_bytes;
            float f[NT][4];
            mmt_block<TYPE, NT>(st, st + xoff, b, nb, o0, nr, g, t, f);
            /* rows 2t and 2t + 1 side by side: one 8-byte store (at 4 bytes, g and g + 4 share banks) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2 *)&fr[(g + 8 * h) * R + 8 * nt + 2 * t] = make_float2(f[nt][2 * h], f[nt][2 * h + 1]);
        }
        __syncthreads();
        /* thread p = (output p / R, row p % R) adds the round's f_b in block order */
        const float *fk = fb + (k & 1) * MMT_NW * 16 * R;
#pragma unroll
        for (int q = 0; q < NT; q++) {
            const int p = tid + 128 * q;
#pragma unroll
            for (int w = 0; w < MMT_NW; w++)
                if (w + MMT_NW * k < nb) total[q] = total[q] + fk[w * 16 * R + p];
        }
    }
    cp_wait<0>(); /* no copy may still target shared memory at exit */
#pragma unroll
    for (int q = 0; q < NT; q++) {
        const int p = tid + 128 * q, o = p / R, r = p % R;
        if (r < nr && o0 + o < n_out) y[(int64_t)r * n_out + o0 + o] = has_scale ? total[q] * scale : total[q];
    }
}

template <int NT, int ST>
__global__ static void __launch_bounds__(128) k_mmt(mmt_set set, int nb, int stage_bytes, int xoff,
                                                   const int8_t *__restrict__ qs, const float *__restrict__ xd,
                                                   const int16_t *__restrict__ bs, int nr) {
    extern __shared__ __align__(16) uint8_t sm[];
    const int i = mmt_weight_of(set, (int)blockIdx.x);
    const int64_t o0 = 16 * (int64_t)((int)blockIdx.x - set.first[i]);
    if (set.type[i] == M_Q4_K)
        mmt_tile<M_Q4_K, NT, ST>(sm, stage_bytes, xoff, set.W[i], set.n_out[i], o0, nb, qs, xd, bs, nr, set.y[i],
                                 set.has_scale[i], set.scale[i]);
    else if (set.type[i] == M_Q5_K)
        mmt_tile<M_Q5_K, NT, ST>(sm, stage_bytes, xoff, set.W[i], set.n_out[i], o0, nb, qs, xd, bs, nr, set.y[i],
                                 set.has_scale[i], set.scale[i]);
    else
        mmt_tile<M_Q6_K, NT, ST>(sm, stage_bytes, xoff, set.W[i], set.n_out[i], o0, nb, qs, xd, bs, nr, set.y[i],
                                 set.has_scale[i], set.scale[i]);
}

/* Raise a kernel's dynamic shared memory limit to smem when *allowed (the
 * limit set so far, 48 KiB at first) is below it; false: CUDA refused (the
 * error stays for the caller's cudaGetLastError). */
static bool smem_allow(const void *fn, size_t smem, size_t *allowed) {
    if (smem <= *allowed) return true;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) return false;
    *allowed = smem;
    return true;
}

/* ------------------------------------------------------------------ k_mmq
 * The same products for up to 8 rows (by default 2 to 4: mmq_launch) with
 * k_mmv4's weight stream (docs/cuda.md "2 to 4 rows: k_mmq"): no cp.async ring and no
 * barrier in the block loop. A warp owns a 16-output tile; each lane loads
 * its own A fragments of the tile's outputs g and g + 8 straight from
 * global memory into registers (U blocks in flight, the first before
 * grid_dep_wait, since weights are never written), builds the B fragments
 * of activation row g from global memory (XS = 0) or from a copy of all
 * of the call's activations in shared memory (XS = 1, made once per CTA),
 * and runs the same mma and f_b arithmetic as mmt_block. WPR = 1, 2 or 4
 * warps share a tile (warp wi takes blocks wi, wi + WPR, ...). With WPR =
 * 1 a lane adds its four f_b (outputs g, g + 8; rows 2t, 2t + 1) to its
 * totals in block order; with WPR > 1 every block's f_b goes to shared
 * memory and, after one barrier, a thread per (output, row) adds them in
 * block order from 0.0f. Why: k_mmt at 4 to 8 rows streamed weights at
 * 1.2-1.8 TB/s (per-warp rings and a barrier per round of 4 blocks, few
 * eligible warps), against 3.2 TB/s for k_mmv4 at 1 row. */

/* One lane's weights of one block: outputs g (h = 0) and g + 8 (h = 1).
 * Q4_K/Q5_K: hd = d|dmin|12 scale bytes, c[h][2i..2i+1] = code bytes
 * 8t..8t+7 of pair i, Q5_K c[h][8..9] = qh bytes 8t..8t+7. Q6_K (split
 * layout): hd = the 16 int8 scales, c[h][4hb+m] = ql word 64hb + 16m + 4t,
 * c[h][8 + 2hb + p] = qh word 128 + 32hb + 16p + 4t, d6 = the two f16 d. */
struct mqw {
    uint4 hd[2];
    uint32_t c[2][12];
    uint32_t d6;
};

template <int TYPE>
__device__ static inline void mq_load(const uint8_t *W, int64_t n_out, int nb, int64_t oa, int64_t ob, int b, int t,
                                      mqw &w) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t item = (h ? ob : oa) * nb + b;
        if (TYPE != M_Q6_K) {
            typedef mmt_fmt<TYPE> F;
            const uint8_t *blk = W + item * F::BYTES;
            w.hd[h] = __ldg((const uint4 *)blk);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const uint2 q = __ldg((const uint2 *)(blk + F::QOFF + 32 * i + 8 * t));
                w.c[h][2 * i] = q.x, w.c[h][2 * i + 1] = q.y;
            }
            if (TYPE == M_Q5_K) {
                const uint2 q = __ldg((const uint2 *)(blk + 16 + 8 * t));
                w.c[h][8] = q.x, w.c[h][9] = q.y;
            }
        } else {
            const int64_t total = n_out * (int64_t)nb;
            const uint8_t *blk = W + item * 192;
#pragma unroll
            for (int hb = 0; hb < 2; hb++) {
#pragma unroll
                for (int m = 0; m < 4; m++) w.c[h][4 * hb + m] = __ldg((const uint32_t *)(blk + 64 * hb + 16 * m + 4 * t));
#pragma unroll
                for (int p = 0; p < 2; p++)
                    w.c[h][8 + 2 * hb + p] = __ldg((const uint32_t *)(blk + 128 + 32 * hb + 16 * p + 4 * t));
            }
            w.hd[h] = __ldg((const uint4 *)(W + total * 192 + item * 16));
            const uint32_t dv = __ldg((const uint16_t *)(W + total * 208) + item);
            w.d6 = h ? (w.d6 | dv << 16) : dv;
        }
    }
}

/* A load of activation bytes: from shared memory (XS = 1) or through the
 * read-only path (XS = 0). */
template <int XS, typename T> __device__ static inline T mq_x(const void *p) {
    return XS ? *(const T *)p : __ldg((const T *)p);
}

/* Where one block's activations are: xg = row g's codes of the block (NULL
 * when g >= nr), bsr[rr] / xd[rr] = row 2t + rr's 16 bsums and d (row >= nr:
 * unused). */
struct mqx {
    const int8_t *xg;
    const int16_t *bsr[2];
    float xd[2];
};

/* f[e]: output g + 8 (e >> 1), row 2t + (e & 1) of this block; the
 * arithmetic of mmt_block (the same expressions, so the same bits). */
template <int TYPE, int XS>
__device__ static inline void mq_block(const mqw &w, const mqx &x, int t, int nr, float f[4]) {
    int32_t sumi[4] = {0, 0, 0, 0};
    if (TYPE != M_Q6_K) {
        float d[2], dmin[2];
        uint32_t sc[2][2], mn[2][2];
#pragma unroll
        for (int h = 0; h < 2; h++) kq_header(w.hd[h], d[h], dmin[h], sc[h], mn[h]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* activation codes of row g, values 8t..8t+7 of sub-blocks 2i and 2i + 1 */
            const uint2 x0 = x.xg ? mq_x<XS, uint2>(x.xg + 64 * i) : make_uint2(0, 0);
            const uint2 x1 = x.xg ? mq_x<XS, uint2>(x.xg + 64 * i + 32) : make_uint2(0, 0);
#pragma unroll
            for (int hb = 0; hb < 2; hb++) {
                const int j = 2 * i + hb, sh = 4 * hb;
                const uint32_t a0 = kq_codes<TYPE>(w.c[0][2 * i], sh, w.c[0][8], j);
                const uint32_t a2 = kq_codes<TYPE>(w.c[0][2 * i + 1], sh, w.c[0][9], j);
                const uint32_t a1 = kq_codes<TYPE>(w.c[1][2 * i], sh, w.c[1][8], j);
                const uint32_t a3 = kq_codes<TYPE>(w.c[1][2 * i + 1], sh, w.c[1][9], j);
                const int32_t sa = (int32_t)((sc[0][j >> 2] >> (8 * (j & 3))) & 0xFF);
                const int32_t sb = (int32_t)((sc[1][j >> 2] >> (8 * (j & 3))) & 0xFF);
                const uint2 xv = hb ? x1 : x0;
                int32_t c[4];
                mma_k32(c, a0, a1, a2, a3, xv.x, xv.y);
                sumi[0] += sa * c[0];
                sumi[1] += sa * c[1];
                sumi[2] += sb * c[2];
                sumi[3] += sb * c[3];
            }
        }
        uint32_t mp[2][4];
        kq_min_pairs(mn[0], mp[0]);
        kq_min_pairs(mn[1], mp[1]);
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const bool in = 2 * t + rr < nr;
            const float xdv = in ? x.xd[rr] : 0.0f;
            uint4 w0 = make_uint4(0, 0, 0, 0), w1 = w0;
            if (in) {
                w0 = mq_x<XS, uint4>(x.bsr[rr]);
                w1 = mq_x<XS, uint4>(x.bsr[rr] + 8);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) f[2 * h + rr] = kq_fb(d[h], dmin[h], xdv, sumi[2 * h + rr], w0, w1, mp[h]);
        }
    } else {
        const uint32_t sca[4] = {w.hd[0].x, w.hd[0].y, w.hd[0].z, w.hd[0].w};
        const uint32_t scb[4] = {w.hd[1].x, w.hd[1].y, w.hd[1].z, w.hd[1].w};
        const float d[2] = {h2f((uint16_t)(w.d6 & 0xFFFF)), h2f((uint16_t)(w.d6 >> 16))};
#pragma unroll
        for (int s = 0; s < 16; s++) {
            /* group s: values 16s..16s+15 (scale s); lane t takes 16s + 4t..4t+3, i.e. the
             * nibble (s & 7 >= 4: high) of ql word 4hb + (s & 3) and 2 bits at 2 ((s & 7) >> 1)
             * of qh word 8 + 2hb + (s & 1) (hb = s >> 3), minus 32 */
            const int hb = s >> 3, m = s & 3, nsh = (s & 7) >= 4 ? 4 : 0, hsh = 2 * ((s & 7) >> 1);
            const uint32_t qa = w.c[0][4 * hb + m], ha = w.c[0][8 + 2 * hb + (s & 1)];
            const uint32_t qb = w.c[1][4 * hb + m], hbw = w.c[1][8 + 2 * hb + (s & 1)];
            const uint32_t a0 = q6_codes(qa, ha, nsh, hsh), a1 = q6_codes(qb, hbw, nsh, hsh);
            const int32_t sa = (int32_t)(int8_t)(sca[s >> 2] >> (8 * (s & 3)));
            const int32_t sb = (int32_t)(int8_t)(scb[s >> 2] >> (8 * (s & 3)));
            const uint32_t xv = x.xg ? mq_x<XS, uint32_t>(x.xg + 16 * s) : 0u;
            int32_t c[4];
            mma_k16(c, a0, a1, xv);
            sumi[0] += sa * c[0];
            sumi[1] += sa * c[1];
            sumi[2] += sb * c[2];
            sumi[3] += sb * c[3];
        }
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const float xdv = 2 * t + rr < nr ? x.xd[rr] : 0.0f;
#pragma unroll
            for (int h = 0; h < 2; h++) f[2 * h + rr] = (d[h] * xdv) * (float)sumi[2 * h + rr];
        }
    }
}

/* The activations copied to shared memory (XS = 1): codes of row r at
 * r * (n_in + 32) (the pad puts rows g = 0..3 of a half-warp's 8-byte
 * loads 8 words apart), then the bsums [nr][nb][16], then d [nr][nb]. */
__host__ __device__ static inline size_t mq_xs_bytes(int nr, int nb) {
    return (size_t)nr * ((size_t)nb * 256 + 32) + (size_t)nr * nb * 32 + (size_t)nr * nb * 4;
}

/* This block's activation addresses for lane (g, t). */
template <int TYPE, int XS>
__device__ static inline mqx mq_where(const uint8_t *xs_sm, int b, int nb, const int8_t *qs, const float *xd,
                                      const int16_t *bs, int nr, int g, int t) {
    mqx x;
    const int64_t n_in = (int64_t)nb * 256;
    const int lo = TYPE == M_Q6_K ? 4 * t : 8 * t;
    const int r0 = 2 * t < nr ? 2 * t : 0, r1 = 2 * t + 1 < nr ? 2 * t + 1 : 0;
    if (XS) {
        const int8_t *c = (const int8_t *)xs_sm;
        const int16_t *sbs = (const int16_t *)(xs_sm + (size_t)nr * (n_in + 32));
        const float *sxd = (const float *)(xs_sm + (size_t)nr * (n_in + 32) + (size_t)nr * nb * 32);
        x.xg = g < nr ? c + g * (n_in + 32) + b * 256 + lo : nullptr;
        x.bsr[0] = sbs + ((int64_t)r0 * nb + b) * 16, x.bsr[1] = sbs + ((int64_t)r1 * nb + b) * 16;
        x.xd[0] = sxd[r0 * nb + b], x.xd[1] = sxd[r1 * nb + b];
    } else {
        x.xg = g < nr ? qs + g * n_in + b * 256 + lo : nullptr;
        x.bsr[0] = bs + ((int64_t)r0 * nb + b) * 16, x.bsr[1] = bs + ((int64_t)r1 * nb + b) * 16;
        x.xd[0] = __ldg(xd + (int64_t)r0 * nb + b), x.xd[1] = __ldg(xd + (int64_t)r1 * nb + b);
    }
    return x;
}

/* The outputs whose weights lane group g loads: o0 + g and o0 + g + 8, or
 * past the end the last output (loaded, never stored). */
__device__ static inline void mq_outs(int64_t o0, int64_t n_out, int g, int64_t &oa, int64_t &ob) {
    oa = o0 + g < n_out ? o0 + g : n_out - 1;
    ob = o0 + g + 8 < n_out ? o0 + g + 8 : n_out - 1;
}

/* The first U blocks of a warp's share (blocks wi, wi + WPR, ...) into w,
 * before the kernel waits for its predecessors (weights are never written). */
template <int TYPE, int U, int WPR>
__device__ static inline void mq_first(const uint8_t *W, int64_t n_out, int nb, int64_t o0, int wi, mqw w[U]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int64_t oa, ob;
    mq_outs(o0, n_out, g, oa, ob);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int b = wi + WPR * u;
        mq_load<TYPE>(W, n_out, nb, oa, ob, b < nb ? b : nb - 1, t, w[u]);
    }
}

/* The rest of a warp's share, from mq_first's registers: WPR = 1: the
 * totals (in block order) in tot; else each block's f_b into fs ([nb][16][8]
 * floats). */
template <int TYPE, int U, int WPR, int XS>
__device__ static inline void mq_part(const uint8_t *W, int64_t n_out, int nb, int64_t o0, int wi, mqw w[U],
                                      const uint8_t *xs_sm, const int8_t *qs, const float *xd, const int16_t *bs,
                                      int nr, float *fs, float tot[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int64_t oa, ob;
    mq_outs(o0, n_out, g, oa, ob);
    const int K = (nb - wi + WPR - 1) / WPR;
    for (int k0 = 0; k0 < K; k0 += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u;
            if (k < K) {
                const int b = wi + WPR * k;
                const mqx x = mq_where<TYPE, XS>(xs_sm, b, nb, qs, xd, bs, nr, g, t);
                float f[4];
                mq_block<TYPE, XS>(w[u], x, t, nr, f);
                if (k + U < K) mq_load<TYPE>(W, n_out, nb, oa, ob, wi + WPR * (k + U), t, w[u]);
                if (WPR == 1) {
#pragma unroll
                    for (int e = 0; e < 4; e++) tot[e] = tot[e] + f[e];
                } else {
                    float *p = fs + (size_t)b * 128;
                    *(float2 *)&p[g * 8 + 2 * t] = make_float2(f[0], f[1]);
                    *(float2 *)&p[(g + 8) * 8 + 2 * t] = make_float2(f[2], f[3]);
                }
            }
        }
    }
}

struct mq_args {
    mmt_set set;
    int nb, nr;
    const int8_t *qs;
    const float *xd;
    const int16_t *bs;
};

/* Every thread of the CTA, once: wait for the predecessors, then (XS = 1)
 * copy all rows' activations into shared memory (mq_xs_bytes' layout). */
template <int XS> __device__ static inline void mq_wait_x(const mq_args &a, uint8_t *sm) {
    const int nt = (int)blockDim.x;
    grid_dep_wait();
    if (!XS) return;
    const int nb = a.nb, nr = a.nr;
    const int64_t n_in = (int64_t)nb * 256;
    const int per_row = (int)(n_in / 16);
    for (int p = threadIdx.x; p < nr * per_row; p += nt) {
        const int r = p / per_row, c = p - r * per_row;
        *(uint4 *)(sm + r * (n_in + 32) + 16 * c) = __ldg((const uint4 *)(a.qs + r * n_in) + c);
    }
    uint4 *sbs = (uint4 *)(sm + (size_t)nr * (n_in + 32));
    for (int p = threadIdx.x; p < nr * nb * 2; p += nt) sbs[p] = __ldg((const uint4 *)a.bs + p);
    float *sxd = (float *)(sm + (size_t)nr * (n_in + 32) + (size_t)nr * nb * 32);
    for (int p = threadIdx.x; p < nr * nb; p += nt) sxd[p] = __ldg(a.xd + p);
    __syncthreads();
}

/* A CTA of NW warps: NW / WPR tiles (numbered across the set's weights,
 * set.first in tiles; NW = 8 only with WPR = 1: half the activation copies
 * per tile). Dynamic shared memory: XS's activation copy, then (WPR > 1)
 * [4 / WPR][nb][16][8] floats of f_b. Registers capped at 128 (U = 2). */
template <int U, int WPR, int XS, int NW>
__global__ static void __launch_bounds__(32 * NW, (U == 2 ? 16 : 12) / NW) k_mmq(mq_args a) {
    static_assert(NW == 4 || (NW == 8 && WPR == 1), "8-warp CTAs only with a warp per tile");
    extern __shared__ __align__(16) uint8_t sm[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nb = a.nb, nr = a.nr;
    const size_t xsb = XS ? (mq_xs_bytes(nr, nb) + 15) / 16 * 16 : 0;
    float *fsm = (float *)(sm + xsb);
    const int tl = warp / WPR, wi = warp % WPR;
    const int tile = (int)blockIdx.x * (NW / WPR) + tl;
    const int n_tiles = a.set.first[a.set.n];
    const int i = mmt_weight_of(a.set, tile);
    const int64_t o0 = 16 * (int64_t)(tile - a.set.first[i]);
    const int ty = a.set.type[i];
    const uint8_t *W = a.set.W[i];
    const int64_t n_out = a.set.n_out[i];
    mqw w[U];
    if (tile < n_tiles) {
        if (ty == M_Q4_K) mq_first<M_Q4_K, U, WPR>(W, n_out, nb, o0, wi, w);
        else if (ty == M_Q5_K) mq_first<M_Q5_K, U, WPR>(W, n_out, nb, o0, wi, w);
        else mq_first<M_Q6_K, U, WPR>(W, n_out, nb, o0, wi, w);
    }
    mq_wait_x<XS>(a, sm);
    float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float *fs = fsm + (size_t)tl * nb * 128;
    if (tile < n_tiles) {
        if (ty == M_Q4_K) mq_part<M_Q4_K, U, WPR, XS>(W, n_out, nb, o0, wi, w, sm, a.qs, a.xd, a.bs, nr, fs, tot);
        else if (ty == M_Q5_K) mq_part<M_Q5_K, U, WPR, XS>(W, n_out, nb, o0, wi, w, sm, a.qs, a.xd, a.bs, nr, fs, tot);
        else mq_part<M_Q6_K, U, WPR, XS>(W, n_out, nb, o0, wi, w, sm, a.qs, a.xd, a.bs, nr, fs, tot);
    }
    if (WPR == 1) {
        if (tile >= n_tiles) return;
        float *y = a.set.y[i];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = 2 * t + (e & 1);
            const int64_t o = o0 + g + 8 * (e >> 1);
            if (r < nr && o < n_out) y[(int64_t)r * n_out + o] = a.set.has_scale[i] ? tot[e] * a.set.scale[i] : tot[e];
        }
        return;
    }
    __syncthreads();
    /* thread q: (output q / 8, row q % 8) of each of the CTA's tiles */
    const int q = threadIdx.x, oq = q >> 3, r = q & 7;
    if (r >= nr) return;
#pragma unroll
    for (int s = 0; s < NW / WPR; s++) {
        const int tile2 = (int)blockIdx.x * (NW / WPR) + s;
        if (tile2 >= n_tiles) break;
        const int j = mmt_weight_of(a.set, tile2);
        const int64_t o = 16 * (int64_t)(tile2 - a.set.first[j]) + oq;
        if (o >= a.set.n_out[j]) continue;
        const float *p = fsm + (size_t)s * nb * 128 + q;
        float sum = 0.0f;
        for (int b = 0; b < nb; b++) sum = sum + p[(size_t)b * 128];
        a.set.y[j][(int64_t)r * a.set.n_out[j] + o] = a.set.has_scale[j] ? sum * a.set.scale[j] : sum;
    }
}

extern "C" {
int mucu_mmq_variant = -1;
}

extern "C" int mucu_mmq_variant_get(void) { return env_setting(&mucu_mmq_variant, "MUSER_CUDA_MMQ", 1); }

template <int U, int WPR, int XS, int NW = 4>
static bool launch_mmq(const mq_args &a, cudaStream_t st) {
    const int tpc = NW / WPR, n_tiles = a.set.first[a.set.n];
    const size_t xsb = XS ? (mq_xs_bytes(a.nr, a.nb) + 15) / 16 * 16 : 0;
    const size_t smem = xsb + (WPR > 1 ? (size_t)tpc * a.nb * 128 * 4 : 0);
    if (smem > 227 * 1024) return false;
    static size_t allowed = 48 * 1024; /* per instance: the dynamic shared memory allowed so far */
    if (!smem_allow((const void *)k_mmq<U, WPR, XS, NW>, smem, &allowed))
        return true; /* the error stays for the caller's cudaGetLastError */
    k_mmq<U, WPR, XS, NW><<<(n_tiles + tpc - 1) / tpc, 32 * NW, smem, st>>>(a);
    return true;
}

/* k_mmq's shape for a call (MUSER_CUDA_MMQ: 0 off; 1 by shape; forced, for calls of up to 8 rows: 4 four
 * warps per tile with the activations from global memory, 5 one warp per tile with them in shared memory,
 * 10 as 5 in CTAs of 8 warps, 12 as 5 with 3 blocks in flight; the numbers are those of the measurements
 * in which the other shapes lost, where this rule sends calls, to k_mmt or to these and were removed). By shape
 * (test_cuda_backend --bench-mmv and the whole model, H200; docs/cuda.md "Measured and not taken"): calls
 * of up to MUSER_CUDA_MMQ_ROWS rows (default 4: at 8 sequences the whole model decoded slower with k_mmq,
 * 4.46x-4.59x one sequence against 4.96x-4.99x, though most products alone were as fast or faster); a set with a
 * Q6_K weight stays on k_mmt (k_mmq's Q6_K lanes make 28 loads a block: ffn_down Q6_K at 4 rows 60.91 us
 * against 55.07); grids of >= 1,500 tiles (the ffn gate+up set, the output matrix) take a warp per tile,
 * 3 blocks in flight, the activations in shared memory (the gate+up set at 2 / 4 rows 54.19 / 60.55 us
 * against k_mmt's 71.40 / 74.10), the rest 4 warps per tile reading the activations from global memory
 * (ffn_down Q4_K at 4 rows 36.17 against 45.29, attn_output 11.71 against 14.10). false: k_mmt's call. */
extern "C" {
int mucu_mmq_rows = -1;
}

static bool mmq_launch(const mq_args &a, cudaStream_t st) {
    const int v = mucu_mmq_variant_get();
    if (v <= 0 || a.nr > 8) return false;
    int code = v;
    if (v == 1) {
        if (a.nr > env_setting(&mucu_mmq_rows, "MUSER_CUDA_MMQ_ROWS", 4)) return false;
        for (int i = 0; i < a.set.n; i++)
            if (a.set.type[i] == M_Q6_K) return false;
        const int n_tiles = a.set.first[a.set.n];
        code = n_tiles >= 1500 && mq_xs_bytes(a.nr, a.nb) <= 100 * 1024 ? 12 : 4;
    }
    switch (code) {
    case 4: return launch_mmq<2, 4, 0>(a, st);
    case 5: return launch_mmq<2, 1, 1>(a, st);
    case 10: return launch_mmq<2, 1, 1, 8>(a, st);
    case 12: return launch_mmq<3, 1, 1>(a, st);
    default: return false;
    }
}

extern "C" {
int mucu_mmt_min_rows = -1;
int mucu_mmt_stages = -1;
}

extern "C" int mucu_mmt_min_rows_get(void) { return env_setting(&mucu_mmt_min_rows, "MUSER_CUDA_MMT", 2); }

template <int NT, int ST>
static void launch_mmt(const mmt_set &set, int nb, int sb, int xoff, const int8_t *qs, const float *d,
                       const int16_t *bs, int rows, cudaStream_t st) {
    const size_t smem = (size_t)MMT_NW * ST * sb + (size_t)2 * MMT_NW * 16 * 8 * NT * 4;
    static size_t allowed = 48 * 1024; /* per instance */
    if (!smem_allow((const void *)k_mmt<NT, ST>, smem, &allowed)) return;
    k_mmt<NT, ST><<<set.first[set.n], 128, smem, st>>>(set, nb, sb, xoff, qs, d, bs, rows);
}

extern "C" void mucu_mmt(const mucu_weight *const *w, int n, float *const *y, const int8_t *qs, const float *d,
                         const int16_t *bs, int rows, void *stream) {
    mmt_set set = {};
    set.n = n;
    int xoff = 0;
    for (int i = 0; i < n; i++) {
        set.W[i] = w[i]->data, set.y[i] = y[i], set.n_out[i] = w[i]->n_out, set.type[i] = (int)w[i]->type;
        set.has_scale[i] = w[i]->has_scale, set.scale[i] = w[i]->scale;
        set.first[i + 1] = set.first[i] + (int)((w[i]->n_out + 15) / 16);
        const int s = mmt_stage_bytes(w[i]->type);
        if (s > xoff) xoff = s;
    }
    const int nb = (int)(w[0]->n_in / 256);
    const cudaStream_t st = (cudaStream_t)stream;
    const mq_args ma = {set, nb, rows, qs, d, bs};
    if (mmq_launch(ma, st)) return;
    const int sb = xoff + mmt_act_bytes(rows);
    /* stages in flight per warp: 2 (the default: fewer stages, more CTAs per SM; Nsight Compute had shown
     * 12 warps per SM at 8 rows, bound by shared memory; H200, full model, one call each way against the
     * rule below: 4 / 8 sequences 2.58x / 4.61-4.65x one against 2.42x / 4.48-4.51x, 16-row prefill
     * chunks 1,130-1,134 against 1,051-1,054 tokens/s); MUSER_CUDA_MMT_ST=1 the rule before it (4 while
     * the CTA's rings fit in 64 KiB, else fewer), =3 or =4 forced */
    const int stf = env_setting(&mucu_mmt_stages, "MUSER_CUDA_MMT_ST", 0);
    if (stf != 1) {
#define MMT_ST(NT) (stf == 4 ? launch_mmt<NT, 4>(set, nb, sb, xoff, qs, d, bs, rows, st)                             \
                    : stf == 3 ? launch_mmt<NT, 3>(set, nb, sb, xoff, qs, d, bs, rows, st)                          \
                               : launch_mmt<NT, 2>(set, nb, sb, xoff, qs, d, bs, rows, st))
        if (rows <= 8) MMT_ST(1);
        else if (rows <= 16) MMT_ST(2);
        else if (stf >= 3) launch_mmt<4, 3>(set, nb, sb, xoff, qs, d, bs, rows, st); /* 4 stages of 32 rows: 235 KB */
        else launch_mmt<4, 2>(set, nb, sb, xoff, qs, d, bs, rows, st);
#undef MMT_ST
        return;
    }
    const int ring4 = MMT_NW * 4 * sb;
    if (rows <= 8) {
        if (ring4 <= 64 * 1024) launch_mmt<1, 4>(set, nb, sb, xoff, qs, d, bs, rows, st);
        else launch_mmt<1, 3>(set, nb, sb, xoff, qs, d, bs, rows, st);
    } else if (rows > 16) {
        launch_mmt<4, 2>(set, nb, sb, xoff, qs, d, bs, rows, st);
    } else {
        if (ring4 <= 64 * 1024) launch_mmt<2, 4>(set, nb, sb, xoff, qs, d, bs, rows, st);
        else if (ring4 / 4 * 3 <= 96 * 1024) launch_mmt<2, 3>(set, nb, sb, xoff, qs, d, bs, rows, st);
        else launch_mmt<2, 2>(set, nb, sb, xoff, qs, d, bs, rows, st);
    }
}
