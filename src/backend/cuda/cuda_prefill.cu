/* Prefill kernels of the cuda backend (docs/cuda.md, "Prefill"). Same
 * exactness rules as cuda_kernels.cu (docs/numerics.md): integer block
 * sums in any order (exact), f_b by the written float formula, each
 * (row, output) total adds f_b strictly in block order. Compiled with
 * -fmad=false (CMakeLists.txt), so no product is contracted into an fma. */
#include "backend/cuda/cuda_prefill.h"
#include "backend/cuda/cuda_common.cuh"
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ggml type ids (quant.h's enum mu_type), as cuda_kernels.cu names them. */
enum { P_Q4_K = 12, P_Q5_K = 13, P_Q6_K = 14 };

/* =====================================================================
 * k_gemm_kq2: y = x . W^T for Q4_K / Q5_K / split Q6_K weights and split
 * Q8_K activations, int8 tensor cores (mma.sync).
 *
 * A CTA of WM x 2 warps takes BM = 32*WM rows x BN = 128 outputs; warp
 * (wm, wn) takes rows 32wm..+31 (two m16 tiles) and outputs 64wn..+63
 * (eight n8 tiles). The 256-blocks go through a STAGES-deep cp.async ring
 * in shared memory, each stage holding one block of every row (Q8_K codes,
 * d, bsums) and of every output (the weight block's raw bytes). Per block:
 *  1. the weight blocks' scales (and Q4_K/Q5_K mins, d, dmin) are decoded
 *     once into small tables;
 *  2. per 32-value segment j, each thread builds its B fragments straight
 *     from the raw code bytes (nibble masks, Q5_K/Q6_K high bits) in
 *     registers: the k order inside a segment is the block's own value
 *     order, the same for A and B, so the mma's sum is over the right
 *     pairs. Q4_K/Q5_K: one m16n8k32 per sub-block of 32 (one scale);
 *     Q6_K: two m16n8k16 per segment (a scale per 16). Each mma result
 *     times its scale is added to sumi in int32: exact in any order;
 *  3. f_b by the formula of docs/numerics.md, and total = total + f_b, so
 *     the totals see the blocks in order.
 * Rows past `rows` and outputs past n_out are zero-filled in shared memory
 * and never stored.
 * ==================================================================== */

#define G2_BN 128
#define G2_STAGES 3
#define G2_XLD 272 /* activation row stride: 256 + 16, rows 4 banks apart (conflict-free 32-bit loads) */

template <int TYPE> struct g2_fmt {
    /* raw bytes of one weight block in global memory (Q6_K: the ql|qh part
     * of the split layout), its shared-memory row stride (a multiple of 16
     * whose word stride is 4 mod 8 or odd multiples of 4 mod 32, so the 8
     * outputs of an n tile fall in distinct banks), and the offset of the
     * 4-bit codes inside the block. */
    static constexpr int BYTES = TYPE == P_Q4_K ? 144 : (TYPE == P_Q5_K ? 176 : 192);
    static constexpr int LD = TYPE == P_Q4_K ? 144 : (TYPE == P_Q5_K ? 176 : 208);
    static constexpr int QOFF = TYPE == P_Q5_K ? 48 : 16;
};

template <int TYPE, int WM> struct g2_smem {
    static constexpr int BM = 32 * WM;
    static constexpr int X = 0;                                /* int8 [BM][G2_XLD] */
    static constexpr int XD = X + BM * G2_XLD;                  /* f32 [BM] */
    static constexpr int XB = XD + BM * 4;                      /* int16 [BM][16] */
    static constexpr int W = XB + BM * 32;                      /* raw [G2_BN][LD] */
    static constexpr int W6S = W + G2_BN * g2_fmt<TYPE>::LD;    /* Q6_K int8 scales [G2_BN][16] */
    static constexpr int W6D = W6S + G2_BN * 16;                /* Q6_K f16 d (an aligned pair) [G2_BN] */
    static constexpr int STAGE = W6D + G2_BN * 4;
    static constexpr int TSC = G2_STAGES * STAGE;               /* int32 [16][G2_BN]: scales (Q4/5: the first 8) */
    static constexpr int TD = TSC + 16 * G2_BN * 4;             /* f32 [G2_BN] d */
    static constexpr int TDM = TD + G2_BN * 4;                  /* f32 [G2_BN] dmin */
    static constexpr int TMIN = TDM + G2_BN * 4;                /* Q4/5 int8 mins [G2_BN][8] */
    static constexpr int TXB = TMIN + G2_BN * 8;                /* Q4/5 int8 bsum parts [BM][16]: lo_0..7, hi_0..7 */
    static constexpr int TOTAL = TXB + BM * 16;
};

template <int TYPE, int WM>
__global__ static void __launch_bounds__(64 * WM, 1)
    k_gemm_kq2(const uint8_t *__restrict__ Wt, int64_t n_out, int nb, const int8_t *__restrict__ qs,
               const float *__restrict__ xdp, const int16_t *__restrict__ bsp, int64_t rows, float *__restrict__ y,
               int has_scale, float scale, float *__restrict__ part, int bpz) {
    grid_dep_wait();
    typedef g2_fmt<TYPE> F;
    typedef g2_smem<TYPE, WM> S;
    constexpr int BM = S::BM, BN = G2_BN, NT = 64 * WM;
    constexpr bool Q6 = TYPE == P_Q6_K;
    extern __shared__ __align__(16) uint8_t sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    const int xr0 = 32 * wm, wo0 = 64 * wn; /* the warp's first row and output in the tile */
    const int64_t row0 = (int64_t)blockIdx.x * BM, out0 = (int64_t)blockIdx.y * BN;
    const int64_t n_in = (int64_t)nb * 256;
    const int64_t q6_sc = n_out * (int64_t)nb * 192, q6_d = n_out * (int64_t)nb * 208; /* split layout offsets */
    int32_t *tsc = (int32_t *)(sm + S::TSC);
    float *td = (float *)(sm + S::TD), *tdm = (float *)(sm + S::TDM);
    int8_t *tmin = (int8_t *)(sm + S::TMIN), *txb = (int8_t *)(sm + S::TXB);

    /* issue the copies of block b into stage buffer s */
    auto load_stage = [&](int s, int b) {
        uint8_t *st = sm + s * S::STAGE;
        for (int i = tid; i < BM * 16; i += NT) {
            const int r = i >> 4, c = i & 15;
            const int64_t gr = row0 + r;
            const bool v = gr < rows;
            cp16(st + S::X + r * G2_XLD + 16 * c, v ? qs + gr * n_in + (int64_t)b * 256 + 16 * c : qs, v);
        }
        if (tid < BM) {
            const int64_t gr = row0 + tid;
            const bool v = gr < rows;
            cp4(st + S::XD + 4 * tid, v ? xdp + gr * nb + b : xdp, v ? 4 : 0);
            if (!Q6) {
                const int16_t *src = v ? bsp + (gr * nb + b) * 16 : bsp;
                cp16(st + S::XB + 32 * tid, src, v);
                cp16(st + S::XB + 32 * tid + 16, v ? src + 8 : bsp, v);
            }
        }
        constexpr int CH = F::BYTES / 16;
        for (int i = tid; i < BN * CH; i += NT) {
            const int o = i / CH, c = i % CH;
            const int64_t go = out0 + o;
            const bool v = go < n_out;
            cp16(st + S::W + o * F::LD + 16 * c, v ? Wt + (go * nb + b) * F::BYTES + 16 * c : Wt, v);
        }
        if (Q6 && tid < BN) {
            const int64_t go = out0 + tid, item = go * nb + b;
            const bool v = go < n_out;
            cp16(st + S::W6S + 16 * tid, v ? Wt + q6_sc + item * 16 : Wt, v);
            /* d is f16 at q6_d + 2*item: copy the 4-aligned pair holding it
             * (only its first half when it is the array's last, even item) */
            const int64_t pair = item & ~(int64_t)1;
            const int n = !v ? 0 : ((item | 1) < n_out * (int64_t)nb ? 4 : 2);
            cp4(st + S::W6D + 4 * tid, v ? Wt + q6_d + 2 * pair : Wt, n);
        }
    };

    float total[2][8][4];
    int32_t sumi[2][8][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) total[m][n][e] = 0.0f;

    /* blocks kb0 .. kb1-1: all of them, or with `part` this CTA's share of
     * a split over gridDim.z (each block's f_b then goes to `part`, summed
     * in block order by k_gemm_split_sum) */
    const int kb0 = (int)blockIdx.z * bpz, kb1 = min(nb, kb0 + bpz);
#pragma unroll
    for (int s = 0; s < G2_STAGES - 1; s++) {
        if (kb0 + s < kb1) load_stage(s, kb0 + s);
        cp_commit();
    }
    for (int b = kb0; b < kb1; b++) {
        const int s = (b - kb0) % G2_STAGES;
        const uint8_t *st = sm + s * S::STAGE;
        cp_wait<G2_STAGES - 2>(); /* this thread's copies of block b have landed */
        __syncthreads();          /* everyone's have; and block b-1's tables and buffer are free */
        /* 1. decode the weight blocks' scales: a thread per output (words
         * and byte masks: the 12 packed bytes give 8 scales and 8 mins in
         * 8 operations) and, for Q4_K/Q5_K, a thread per row for the
         * bsum split */
        for (int i = tid; i < BN + (Q6 ? 0 : BM); i += NT) {
            if (i < BN) {
                const int o = i;
                if (!Q6) {
                    const uint4 hq = *(const uint4 *)(st + S::W + o * F::LD); /* d, dmin, 12 scale bytes */
                    const kq_scmin k = kq_scales_mins(hq.y, hq.z, hq.w);
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        tsc[j * BN + o] = (int32_t)((k.sc03 >> (8 * j)) & 0xFF);
                        tsc[(j + 4) * BN + o] = (int32_t)((k.sc47 >> (8 * j)) & 0xFF);
                    }
                    *(uint2 *)(tmin + 8 * o) = make_uint2(k.mn03, k.mn47); /* 0..63 each */
                    td[o] = h2f((uint16_t)(hq.x & 0xFFFF));
                    tdm[o] = h2f((uint16_t)(hq.x >> 16));
                } else {
                    const uint4 sq = *(const uint4 *)(st + S::W6S + 16 * o);
                    const uint32_t sw[4] = {sq.x, sq.y, sq.z, sq.w};
#pragma unroll
                    for (int j = 0; j < 16; j++) tsc[j * BN + o] = (int32_t)(int8_t)(sw[j >> 2] >> (8 * (j & 3)));
                    const int64_t item = (out0 + o) * nb + b;
                    const uint16_t *h = (const uint16_t *)(st + S::W6D + 4 * o);
                    td[o] = h2f(h[item & 1]);
                }
            } else {
                /* the rows' sub-block sums split into int8 parts (kq_bsum_split) for summ's two k16 mma (step 3) */
                const int r = i - BN;
                *(uint4 *)(txb + 16 * r) = kq_bsum_split(st + S::XB + 32 * r);
            }
        }
        __syncthreads();
        /* the copies of block b + STAGES - 1 overlap this block's math */
        {
            const int nx = b + G2_STAGES - 1;
            if (nx < kb1) load_stage((nx - kb0) % G2_STAGES, nx);
            cp_commit();
        }
        /* 2. integer sums */
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) sumi[m][n][e] = 0;
        const int8_t *xa = (const int8_t *)(st + S::X) + (xr0 + g) * G2_XLD + 4 * t;
        const uint8_t *wb = st + S::W + (wo0 + g) * F::LD + 4 * t;
#pragma unroll 2
        for (int j = 0; j < 8; j++) { /* 32-value segment j */
            uint32_t a[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                const int8_t *p = xa + 16 * m * G2_XLD + 32 * j;
                a[m][0] = *(const uint32_t *)p;
                a[m][1] = *(const uint32_t *)(p + 8 * G2_XLD);
                a[m][2] = *(const uint32_t *)(p + 16);
                a[m][3] = *(const uint32_t *)(p + 8 * G2_XLD + 16);
            }
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const uint8_t *wr = wb + 8 * n * F::LD;
                const int oc = wo0 + 8 * n + 2 * t; /* this thread's C columns oc, oc + 1 */
                if (!Q6) {
                    /* sub-block j: values 32j + l = nibble (j & 1) of code byte 32(j >> 1) + l */
                    const int sh = 4 * (j & 1);
                    const uint32_t q0 = *(const uint32_t *)(wr + F::QOFF + 32 * (j >> 1));
                    const uint32_t q1 = *(const uint32_t *)(wr + F::QOFF + 32 * (j >> 1) + 16);
                    uint32_t b0 = (q0 >> sh) & 0x0F0F0F0Fu, b1 = (q1 >> sh) & 0x0F0F0F0Fu;
                    if (TYPE == P_Q5_K) { /* bit j of qh[l] is the fifth bit of value 32j + l */
                        const uint32_t h0 = *(const uint32_t *)(wr + 16), h1 = *(const uint32_t *)(wr + 32);
                        b0 |= ((h0 >> j) & 0x01010101u) << 4;
                        b1 |= ((h1 >> j) & 0x01010101u) << 4;
                    }
                    const int2 sc = *(const int2 *)(tsc + j * BN + oc);
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        int32_t c[4];
                        mma_k32(c, a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
                        sumi[m][n][0] += sc.x * c[0];
                        sumi[m][n][1] += sc.y * c[1];
                        sumi[m][n][2] += sc.x * c[2];
                        sumi[m][n][3] += sc.y * c[3];
                    }
                } else {
                    /* segment j = 4h + part: value 128h + 32part + l is the
                     * nibble (part >> 1) of ql[64h + 32(part & 1) + l] with
                     * bits 2part, 2part+1 of qh[32h + l] above it, minus 32 */
                    const int h = j >> 2, part = j & 3, nsh = 4 * (part >> 1), hsh = 2 * part;
                    const uint8_t *ql = wr + 64 * h + 32 * (part & 1), *qh = wr + 128 + 32 * h;
                    const uint32_t q0 = *(const uint32_t *)ql, q1 = *(const uint32_t *)(ql + 16);
                    const uint32_t h0 = *(const uint32_t *)qh, h1 = *(const uint32_t *)(qh + 16);
                    const uint32_t b0 =
                        __vsub4(((q0 >> nsh) & 0x0F0F0F0Fu) | (((h0 >> hsh) & 0x03030303u) << 4), 0x20202020u);
                    const uint32_t b1 =
                        __vsub4(((q1 >> nsh) & 0x0F0F0F0Fu) | (((h1 >> hsh) & 0x03030303u) << 4), 0x20202020u);
                    const int2 s0 = *(const int2 *)(tsc + (2 * j) * BN + oc);
                    const int2 s1 = *(const int2 *)(tsc + (2 * j + 1) * BN + oc);
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        int32_t c[4], d[4];
                        mma_k16(c, a[m][0], a[m][1], b0);
                        mma_k16(d, a[m][2], a[m][3], b1);
                        sumi[m][n][0] += s0.x * c[0] + s1.x * d[0];
                        sumi[m][n][1] += s0.y * c[1] + s1.y * d[1];
                        sumi[m][n][2] += s0.x * c[2] + s1.x * d[2];
                        sumi[m][n][3] += s0.y * c[3] + s1.y * d[3];
                    }
                }
            }
        }
        /* split: this block's f_b of the tile, element (m, n, e) of
         * thread (warp, lane) at (warp * 64 + element) * 32 + lane */
        float *pf = part ? part + (((int64_t)b * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * (NT * 64) +
                               warp * 64 * 32 + lane
                         : nullptr;
        /* 3. f_b and the ordered totals. Thread element e of tile (m, n) is
         * row xr0 + 16m + g + 8(e >> 1), output wo0 + 8n + 2t + (e & 1). */
        /* summ (Q4_K/Q5_K), per n tile, in the same fragment layout as sumi:
         * A row r = [lo_0..7 | hi_0..7], B column o = [m_0..7 | 0] and [0 | m_0..7] */
        uint32_t xa0[2], xa1[2];
        if (!Q6)
#pragma unroll
            for (int m = 0; m < 2; m++) {
                xa0[m] = *(const uint32_t *)(txb + 16 * (xr0 + 16 * m + g) + 4 * t);
                xa1[m] = *(const uint32_t *)(txb + 16 * (xr0 + 16 * m + g + 8) + 4 * t);
            }
        float xd[2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) xd[m][h] = ((const float *)(st + S::XD))[xr0 + 16 * m + g + 8 * h];
#pragma unroll
        for (int n = 0; n < 8; n++) {
            int32_t summ[2][4];
            if (!Q6) {
                const uint32_t mw = *(const uint32_t *)(tmin + 8 * (wo0 + 8 * n + g) + 4 * (t & 1));
                const uint32_t bl = t < 2 ? mw : 0u, bh = t < 2 ? 0u : mw;
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    int32_t cl[4], ch[4];
                    mma_k16(cl, xa0[m], xa1[m], bl);
                    mma_k16(ch, xa0[m], xa1[m], bh);
#pragma unroll
                    for (int e = 0; e < 4; e++) summ[m][e] = cl[e] + 128 * ch[e];
                }
            }
#pragma unroll
            for (int e1 = 0; e1 < 2; e1++) {
                const int ol = wo0 + 8 * n + 2 * t + e1;
                const float d = td[ol], dmin = Q6 ? 0.0f : tdm[ol];
#pragma unroll
                for (int m = 0; m < 2; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int e = 2 * h + e1;
                        float f;
                        if (Q6) f = (d * xd[m][h]) * (float)sumi[m][n][e];
                        else f = (d * xd[m][h]) * (float)sumi[m][n][e] - (dmin * xd[m][h]) * (float)summ[m][e];
                        if (part) pf[((m * 8 + n) * 4 + e) * 32] = f;
                        else total[m][n][e] = total[m][n][e] + f;
                    }
            }
        }
    }
    cp_wait<0>(); /* no copy may still target shared memory at exit */
    if (part) return;
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t r = row0 + xr0 + 16 * m + g + 8 * (e >> 1), o = out0 + wo0 + 8 * n + 2 * t + (e & 1);
                if (r < rows && o < n_out) y[r * n_out + o] = has_scale ? total[m][n][e] * scale : total[m][n][e];
            }
}

/* The split's second pass: y = sum of the blocks' f_b in block order from
 * 0.0f, as k_gemm_kq2's own loop adds them. A thread per element of
 * `part`'s tile layout (lane fastest, so each block's reads are coalesced);
 * the element's (row, output) is the GEMM's fragment map. */
template <int WM>
__global__ static void __launch_bounds__(256)
    k_gemm_split_sum(const float *__restrict__ part, int nb, int gx, int gy, int64_t rows, int64_t n_out,
                     float *__restrict__ y, int has_scale, float scale) {
    grid_dep_wait();
    constexpr int NT = 64 * WM, BM = 32 * WM;
    const int64_t tstride = (int64_t)gx * gy * NT * 64;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tstride) return;
    const int64_t tile = i / (NT * 64);
    const int rem = (int)(i % (NT * 64)), warp = rem >> 11, elem = (rem >> 5) & 63, lane = rem & 31;
    const int g = lane >> 2, t = lane & 3, wm = warp % WM, wn = warp / WM;
    const int m = elem >> 5, n = (elem >> 2) & 7, e = elem & 3;
    const int64_t r = (tile % gx) * BM + 32 * wm + 16 * m + g + 8 * (e >> 1);
    const int64_t o = (tile / gx) * G2_BN + 64 * wn + 8 * n + 2 * t + (e & 1);
    if (r >= rows || o >= n_out) return;
    float total = 0.0f;
#pragma unroll 8
    for (int b = 0; b < nb; b++) total = total + part[(int64_t)b * tstride + i];
    y[r * n_out + o] = has_scale ? total * scale : total;
}

/* Tiles and split of a k_gemm_kq2 call. 128-row tiles (one CTA of 8 warps
 * per SM: 200+ KiB of shared memory), or 64 when there are at most 64 rows
 * or 128-row tiles would leave a good part of the SMs idle (the 256-output
 * k/v projections: 8 tiles at 512 rows, 32 at 2048). A grid of fewer than
 * 100 tiles is also split over the blocks (gridDim.z = ks, bpz blocks
 * each) when `split` bytes of scratch are at most 256 MiB: each CTA's
 * chain of blocks is what bounds such a call (ncu, 512 rows: the 16 CTAs
 * of the k projection took 133 us against 176 for q's 128 CTAs).
 * MUSER_CUDA_GEMM_SPLIT=0 turns the split off. */
struct g2_plan {
    int wm, gx, gy, ks, bpz;
    size_t split; /* scratch bytes, 0 without a split */
};

static int gemm_split_v = -1;

static g2_plan g2_plan_of(int64_t rows, int64_t n_out, int nb) {
    g2_plan p;
    const int64_t ty = (n_out + G2_BN - 1) / G2_BN, tiles128 = ((rows + 127) / 128) * ty;
    const int k = mucu_gemm_kernel_get(); /* 2, 3: 128- or 64-row tiles forced (tests); 4 as 1 */
    p.wm = (k == 2 || (k != 3 && rows > 64 && tiles128 >= 100)) ? 4 : 2;
    p.gx = (int)((rows + 32 * p.wm - 1) / (32 * p.wm));
    p.gy = (int)ty;
    p.ks = 1;
    p.bpz = nb;
    p.split = 0;
    const int64_t tiles = (int64_t)p.gx * p.gy;
    const int sp = env_setting(&gemm_split_v, "MUSER_CUDA_GEMM_SPLIT", 1);
    if (sp != 0 && nb > 1 && tiles > 0 && (tiles < 100 || sp >= 2)) {
        int ks = sp >= 2 ? sp : (int)((2 * sm_count() + tiles - 1) / tiles);
        if (ks > nb) ks = nb;
        const int bpz = (nb + ks - 1) / ks;
        ks = (nb + bpz - 1) / bpz;
        const size_t bytes = (size_t)nb * (size_t)tiles * (size_t)(64 * p.wm) * 64 * sizeof(float);
        if (ks > 1 && bytes <= ((size_t)256 << 20)) {
            p.ks = ks;
            p.bpz = bpz;
            p.split = bytes;
        }
    }
    return p;
}

template <int TYPE, int WM>
static void launch_gemm_kq2(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows,
                            float *y, const g2_plan &p, float *split, cudaStream_t st) {
    typedef g2_smem<TYPE, WM> S;
    static bool attr_set = false; /* once per instance: more than 48 KiB of dynamic shared memory */
    if (!attr_set) {
        if (cudaFuncSetAttribute(k_gemm_kq2<TYPE, WM>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::TOTAL) !=
            cudaSuccess)
            return; /* the error stays for the caller's cudaGetLastError */
        attr_set = true;
    }
    const int nb = (int)(w->n_in / 256);
    const bool sp = p.ks > 1 && split;
    const dim3 grid((unsigned)p.gx, (unsigned)p.gy, sp ? (unsigned)p.ks : 1u);
    k_gemm_kq2<TYPE, WM><<<grid, 64 * WM, S::TOTAL, st>>>(w->data, w->n_out, nb, qs, d, bs, rows, y, w->has_scale,
                                                      w->scale, sp ? split : nullptr, sp ? p.bpz : nb);
    if (sp) {
        const int64_t n = (int64_t)p.gx * p.gy * 64 * WM * 64;
        k_gemm_split_sum<WM><<<(unsigned)((n + 255) / 256), 256, 0, st>>>(split, nb, p.gx, p.gy, rows, w->n_out, y,
                                                                          w->has_scale, w->scale);
    }
}

template <int TYPE>
static void launch_gemm_kq2_t(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows,
                              float *y, float *split, cudaStream_t st) {
    const g2_plan p = g2_plan_of(rows, w->n_out, (int)(w->n_in / 256));
    if (p.wm == 4) launch_gemm_kq2<TYPE, 4>(w, qs, d, bs, rows, y, p, split, st);
    else launch_gemm_kq2<TYPE, 2>(w, qs, d, bs, rows, y, p, split, st);
}

extern "C" {
int mucu_gemm_kernel = -1;
}

extern "C" int mucu_gemm_kernel_get(void) { return env_setting(&mucu_gemm_kernel, "MUSER_CUDA_GEMM_KERNEL", 1); }

extern "C" void mucu_set_gemm_split(int v) { gemm_split_v = v; }

extern "C" bool mucu_gemm_kq2_takes(int64_t rows) {
    const int k = mucu_gemm_kernel_get();
    (void)rows;
    return k >= 1;
}

static int gemm_wg_v = -1, gemm_wg6_v = -1;
extern "C" void mucu_set_gemm_wg(int v) { gemm_wg_v = v; }
extern "C" void mucu_set_gemm_wg6(int v) { gemm_wg6_v = v; }

extern "C" bool mucu_gemm_wg_takes(const mucu_weight *w, int64_t rows) {
    const bool typed = w->type == P_Q4_K || w->type == P_Q5_K ||
                       (w->type == P_Q6_K && env_setting(&gemm_wg6_v, "MUSER_CUDA_GEMM_WG6", 1));
    if (!typed || !env_setting(&gemm_wg_v, "MUSER_CUDA_GEMM_WG", 1) || !mucu_gemm_wg_device()) return false;
    const int k = mucu_gemm_kernel_get();
    if (k == 4) return true;
    const int64_t tiles = ((rows + 63) / 64) * ((w->n_out + 127) / 128); /* its 64-row x 128-output tiles */
    return k == 1 && rows > 64 && tiles >= 100;
}

extern "C" size_t mucu_gemm_split_bytes(const mucu_weight *w, int64_t rows) {
    if (mucu_gemm_wg_takes(w, rows)) return 0;
    return g2_plan_of(rows, w->n_out, (int)(w->n_in / 256)).split;
}

extern "C" void mucu_gemm_kq2(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows,
                              float *y, float *split, void *stream) {
    const cudaStream_t st = (cudaStream_t)stream;
    if (mucu_gemm_wg_takes(w, rows)) {
        mucu_gemm_wg(w, qs, d, bs, rows, y, stream); /* cuda_gemm_wg.cu */
        return;
    }
    if (w->type == P_Q4_K) launch_gemm_kq2_t<P_Q4_K>(w, qs, d, bs, rows, y, split, st);
    else if (w->type == P_Q5_K) launch_gemm_kq2_t<P_Q5_K>(w, qs, d, bs, rows, y, split, st);
    else launch_gemm_kq2_t<P_Q6_K>(w, qs, d, bs, rows, y, split, st);
}

/* ---------------------------------------------------------------- timer */


/* =====================================================================
 * k_attn_prefill: attention for many query rows of the same sequences
 * (prefill chunks), exact to the reference (docs/numerics.md,
 * "Attention"). A CTA takes one 256-key block j of up to 64 (row, head)
 * pairs: RPC = 64 / G consecutive rows x the G query heads of one KV head.
 * Rows that share their planes and `first` (one sequence, full attention)
 * share the block's keys, which are staged in shared memory once, 128
 * keys at a time (K's halves for the scores, then V's over them for the
 * sums: 98.5 KB at head_dim 128, so two CTAs share an SM and one's loads
 * and barriers overlap the other's arithmetic); otherwise the CTA takes
 * its rows one at a time. Per block:
 *  - s_p: a warp computes 4 pairs x 8 keys at once, lane l owning the
 *    chain p[l] of the 32-lane dot (fmaf over d = l, l+32, ... in order);
 *    the 32 chains of each of the 32 dots are then folded across lanes by
 *    a transposing butterfly whose additions are exactly the reference's
 *    p[l] = p[l] + p[l+h] (h = 16..1), leaving dot L in lane L;
 *  - m_b by the reference's scan in key order, e_p = mu_expf(s_p - m_b),
 *    l_b summed in key order (a thread per pair);
 *  - acc_b[d] = fmaf(e_p, v_p[d], acc_b[d]) over the keys in order, a
 *    thread per (4 pairs or fewer, 8 dims).
 * The block's (m_b, l_b, acc_b) go to the same partials as k_attn_blocks
 * (cuda_kernels.cu), merged by k_attn_merge; with one block per row the
 * output is acc_b / l_b directly.
 * ==================================================================== */

#define PA_PMAX 64
#define PA_SLD 260 /* score row stride: pairs 4 apart fall 16 banks apart */
#define PA_NT 256
#define PA_HALF 128 /* keys staged at a time: 98.5 KB of shared memory (D 128), two CTAs per SM */

template <int DC, bool SC = false> struct pa_smem {
    static constexpr int D = 32 * DC;
    static constexpr int KSTR = SC ? D + 16 : D;     /* SC: K's rows chain-major, 32 bytes apart more (banks) */
    static constexpr int KV = 0;                     /* f16 [PA_HALF][KSTR]: half a block of K, then of V ([D]) */
    static constexpr int S = KV + PA_HALF * KSTR * 2; /* f32 [PA_PMAX][PA_SLD] */
    static constexpr int TOTAL = S + PA_PMAX * PA_SLD * 4;
};

/* One step of the transposing fold (k_attn_prefill): v[0 .. 2H-1] are
 * this lane's partials of 2H dots; it keeps dots H.. (bit H set) or ..H-1
 * and adds the xor-H partner's partial of the same dot. */
template <int H> __device__ static inline void fold_step(float *v, int lane) {
    const bool up = (lane & H) != 0;
#pragma unroll
    for (int i = 0; i < H; i++) {
        const float send = up ? v[i] : v[i + H], keep = up ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, H);
    }
}

/* The 8 f16 values of a V row at p (16 bytes of shared memory) as floats. */
__device__ static inline void v8_of(const uint16_t *p, float *vf) {
    const uint4 raw = *(const uint4 *)p;
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int d = 0; d < 8; d++) vf[d] = h2f((uint16_t)(d & 1 ? w[d >> 1] >> 16 : w[d >> 1] & 0xFFFF));
}

/* SC (the default; MUSER_CUDA_ATTN_SC=0: the 32 lanes a dot before it): the scores with 8 lanes a dot instead of 32.
 * K's half block is staged chain-major (key row: chain l's DC values, dims
 * l, l + 32, ..., at l DC), and a warp's 32 dots (4 pairs x 8 keys) go to
 * its 4 groups of 8 lanes, group gi keys gi and gi + 4 of the eight: lane j
 * runs chains j, j + 8, j + 16, j + 24 of its group's 8 dots (fmaf over
 * their dims in order, from 0), adds h = 16 and h = 8 of the fold in its
 * registers (p[j] + p[j + 16], p[j + 8] + p[j + 24], then their sum) and
 * h = 4, 2, 1 by the transposing butterfly over its group (fold_step),
 * leaving dot j in lane j: every addition the reference's p[l] + p[l + h].
 * Per dot about 1.6 warp instructions of fold against 3.9, 16 conversions
 * of K's values per lane and 2 keys. */
template <int DC, bool SC>
__global__ static void __launch_bounds__(PA_NT, 2)
    k_attn_prefill(const mucu_attn_row *__restrict__ desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                   float scale, const float *__restrict__ q, float *__restrict__ part, int64_t nbmax,
                   float *__restrict__ final_out, int pv4) {
    grid_dep_wait();
    typedef pa_smem<DC, SC> SM;
    constexpr int D = SM::D;
    constexpr int DG = D / 8, PG = PA_NT / DG, PPT = PA_PMAX / PG; /* PV: dim groups, pair groups, pairs/thread */
    extern __shared__ __align__(16) uint8_t sm[];
    uint16_t *kv = (uint16_t *)(sm + SM::KV);
    float *S = (float *)(sm + SM::S);
    __shared__ mucu_attn_row_plain rd[PA_PMAX]; /* never a tree's rows (mucu_attention) */
    __shared__ float m_s[PA_PMAX], l_s[PA_PMAX];
    __shared__ int nk_s[PA_PMAX];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int G = (int)(n_head / n_head_kv), RPC = PA_PMAX / G;
    const int64_t j = blockIdx.x, kh = blockIdx.y, r0 = (int64_t)blockIdx.z * RPC;
    const int nr = (int)(rows - r0 < RPC ? rows - r0 : RPC);
    if (tid < nr) {
        const mucu_attn_row &d = desc[r0 + tid];
        rd[tid] = (mucu_attn_row_plain){d.k, d.v, d.cap, d.first, d.pos};
    }
    __syncthreads();
    bool uniform = true;
    for (int i = 1; i < nr; i++)
        uniform = uniform && rd[i].k == rd[0].k && rd[i].v == rd[0].v && rd[i].cap == rd[0].cap &&
                  rd[i].first == rd[0].first;
    const int run_len = uniform ? nr : 1;
    for (int rs = 0; rs < nr; rs += run_len) {
        const mucu_attn_row_plain a = rd[rs];
        const int64_t start = a.first + 256 * j;
        const int P = run_len * G;
        int nkmax = 0;
        for (int i = 0; i < run_len; i++) {
            const int64_t pos = rd[rs + i].pos;
            const int nk = start > pos ? 0 : (int)(pos - start + 1 < 256 ? pos - start + 1 : 256);
            nkmax = nk > nkmax ? nk : nkmax;
        }
        if (nkmax == 0) continue; /* the same for every thread */
        for (int pi = tid; pi < P; pi += PA_NT) {
            const int64_t pos = rd[rs + pi / G].pos;
            nk_s[pi] = start > pos ? 0 : (int)(pos - start + 1 < 256 ? pos - start + 1 : 256);
        }
        /* K by halves of the block (keys start + 128h .. by logical
         * position), each half's scores before the next half is staged */
        const uint16_t *kbase = a.k + kh * a.cap * D, *vbase = a.v + kh * a.cap * D;
        const int64_t phys0 = start % a.cap;
        auto stage = [&](const uint16_t *base, int k0, int nkh) {
            for (int i = tid; i < nkh * DG; i += PA_NT) {
                const int p = i / DG, c = i % DG;
                int64_t phys = phys0 + k0 + p;
                if (phys >= a.cap) phys -= a.cap;
                *(uint4 *)(kv + p * D + 8 * c) = __ldg((const uint4 *)(base + phys * D) + c);
            }
        };
        const int quads = (P + 3) / 4;
        for (int k0 = 0; k0 < nkmax; k0 += PA_HALF) {
            const int nkh = nkmax - k0 < PA_HALF ? nkmax - k0 : PA_HALF;
            if (k0 > 0) __syncthreads(); /* the previous half's scores are done with kv */
            if constexpr (SC) {
                const int octs = (nkh + 7) / 8;
                /* K chain-major: dims 8c .. 8c + 7 (m = c / 4, chains 8 (c % 4) ..) to l DC + m */
                for (int i = tid; i < nkh * DG; i += PA_NT) {
                    const int p = i / DG, c = i % DG;
                    int64_t phys = phys0 + k0 + p;
                    if (phys >= a.cap) phys -= a.cap;
                    const uint4 raw = __ldg((const uint4 *)(kbase + phys * D) + c);
                    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
                    uint16_t *dst = kv + p * SM::KSTR + 8 * (c % 4) * DC + c / 4;
#pragma unroll
                    for (int e = 0; e < 8; e++) dst[e * DC] = (uint16_t)(e & 1 ? w[e >> 1] >> 16 : w[e >> 1] & 0xFFFF);
                }
                __syncthreads();
                const int gi = lane >> 3, jl = lane & 7;
                for (int pq = warp; pq < quads; pq += PA_NT / 32) {
                    float qv[4][4][DC];
#pragma unroll
                    for (int pi = 0; pi < 4; pi++) {
                        const int pair = 4 * pq + pi;
                        const int64_t rh = (r0 + rs + pair / G) * n_head + kh * G + pair % G;
#pragma unroll
                        for (int i = 0; i < 4; i++)
#pragma unroll
                            for (int m = 0; m < DC; m++)
                                qv[pi][i][m] = pair < P ? q[rh * D + jl + 8 * i + 32 * m] : 0.0f;
                    }
                    for (int ko = 0; ko < octs; ko++) {
                        float v[8]; /* dot 2 pi + kk: pair 4 pq + pi, key 8 ko + gi + 4 kk */
#pragma unroll
                        for (int kk = 0; kk < 2; kk++) {
                            const uint16_t *kr = kv + (8 * ko + gi + 4 * kk) * SM::KSTR + jl * DC;
                            float kf[4][DC];
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                const uint16_t *kc = kr + 8 * i * DC;
                                if constexpr (DC == 4) {
                                    const uint2 r = *(const uint2 *)kc;
                                    kf[i][0] = h2f((uint16_t)(r.x & 0xFFFF)), kf[i][1] = h2f((uint16_t)(r.x >> 16));
                                    kf[i][2 % DC] = h2f((uint16_t)(r.y & 0xFFFF)), kf[i][3 % DC] = h2f((uint16_t)(r.y >> 16));
                                } else if constexpr (DC == 2) {
                                    const uint32_t r = *(const uint32_t *)kc;
                                    kf[i][0] = h2f((uint16_t)(r & 0xFFFF)), kf[i][1 % DC] = h2f((uint16_t)(r >> 16));
                                } else {
                                    kf[i][0] = h2f(kc[0]);
                                }
                            }
#pragma unroll
                            for (int pi = 0; pi < 4; pi++) {
                                float c4[4];
#pragma unroll
                                for (int i = 0; i < 4; i++) {
                                    float acc = 0.0f;
#pragma unroll
                                    for (int m = 0; m < DC; m++) acc = fmaf(qv[pi][i][m], kf[i][m], acc);
                                    c4[i] = acc; /* chain jl + 8 i */
                                }
                                v[2 * pi + kk] = (c4[0] + c4[2]) + (c4[1] + c4[3]); /* h = 16, then h = 8 */
                            }
                        }
                        fold_step<4>(v, lane);
                        fold_step<2>(v, lane);
                        fold_step<1>(v, lane);
                        const int pair = 4 * pq + (jl >> 1), key = k0 + 8 * ko + gi + 4 * (jl & 1);
                        if (pair < P) S[pair * PA_SLD + key] = v[0] * scale;
                    }
                }
                continue;
            }
            stage(kbase, k0, nkh);
            __syncthreads();
            const int octs = (nkh + 7) / 8;
            for (int pq = warp; pq < quads; pq += PA_NT / 32) {
                float qv[4][DC];
#pragma unroll
                for (int pi = 0; pi < 4; pi++) {
                    const int pair = 4 * pq + pi;
                    const int64_t rh = (r0 + rs + pair / G) * n_head + kh * G + pair % G;
#pragma unroll
                    for (int c = 0; c < DC; c++) qv[pi][c] = pair < P ? q[rh * D + 32 * c + lane] : 0.0f;
                }
                for (int ko = 0; ko < octs; ko++) {
                    float v[32];
#pragma unroll
                    for (int i = 0; i < 32; i++) v[i] = 0.0f;
#pragma unroll
                    for (int c = 0; c < DC; c++) {
                        float kf[8];
#pragma unroll
                        for (int k = 0; k < 8; k++) kf[k] = h2f(kv[(8 * ko + k) * D + 32 * c + lane]);
#pragma unroll
                        for (int pi = 0; pi < 4; pi++)
#pragma unroll
                            for (int k = 0; k < 8; k++) v[8 * pi + k] = fmaf(qv[pi][c], kf[k], v[8 * pi + k]);
                    }
                    /* the fold: at step h a lane keeps the half of its dots
                     * selected by its bit h, adding the partner's chain-h partial */
                    fold_step<16>(v, lane);
                    fold_step<8>(v, lane);
                    fold_step<4>(v, lane);
                    fold_step<2>(v, lane);
                    fold_step<1>(v, lane);
                    const int pair = 4 * pq + (lane >> 3), key = k0 + 8 * ko + (lane & 7);
                    if (pair < P) S[pair * PA_SLD + key] = v[0] * scale;
                }
            }
        }
        __syncthreads();
        /* m_b (scan in key order) */
        for (int pi = tid; pi < P; pi += PA_NT) {
            float m = -INFINITY;
            const float *sp = S + pi * PA_SLD;
            for (int p = 0; p < nk_s[pi]; p++) {
                const float sv = sp[p];
                if (sv > m) m = sv;
            }
            m_s[pi] = m;
        }
        __syncthreads();
        for (int i = tid; i < P * 256; i += PA_NT) {
            const int pi = i >> 8, p = i & 255;
            if (p < nk_s[pi]) S[pi * PA_SLD + p] = d_expf(S[pi * PA_SLD + p] - m_s[pi]);
        }
        __syncthreads();
        for (int pi = tid; pi < P; pi += PA_NT) {
            float l = 0.0f;
            const float *sp = S + pi * PA_SLD;
            for (int p = 0; p < nk_s[pi]; p++) l = l + sp[p];
            l_s[pi] = l;
        }
        /* acc_b: this thread's pairs pg*PPT + i and dims 8dg .. 8dg+7 */
        {
            const int dg = tid % DG, pg = tid / DG;
            float acc[PPT][8];
            int nk[PPT], kmax = 0;
#pragma unroll
            for (int i = 0; i < PPT; i++) {
                const int pair = pg * PPT + i;
                nk[i] = pair < P ? nk_s[pair] : 0;
                kmax = nk[i] > kmax ? nk[i] : kmax;
#pragma unroll
                for (int d = 0; d < 8; d++) acc[i][d] = 0.0f;
            }
            /* keys below every real pair's count need no per-pair test
             * (pairs past P compute unused sums), 4 at a time with each
             * pair's 4 weights in one load; the rest one by one */
            int kmin = pv4 ? kmax : 0;
#pragma unroll
            for (int i = 0; i < PPT; i++)
                if (pg * PPT + i < P && nk[i] < kmin) kmin = nk[i];
            /* V by halves of the block, like K; each thread's keys in order */
            for (int k0 = 0; k0 < nkmax; k0 += PA_HALF) {
                const int nkh = nkmax - k0 < PA_HALF ? nkmax - k0 : PA_HALF;
                __syncthreads(); /* kv is free: the scores are done, or the previous half's sums */
                stage(vbase, k0, nkh);
                __syncthreads();
                const int hi = kmax < k0 + nkh ? kmax : k0 + nkh, hu = kmin < hi ? kmin : hi;
                int p = k0;
                for (; p + 4 <= hu; p += 4) {
                    float4 e4[PPT];
#pragma unroll
                    for (int i = 0; i < PPT; i++) e4[i] = *(const float4 *)(S + (pg * PPT + i) * PA_SLD + p);
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        float vf[8];
                        v8_of(kv + (p - k0 + u) * D + 8 * dg, vf);
#pragma unroll
                        for (int i = 0; i < PPT; i++) {
                            const float e = u == 0 ? e4[i].x : u == 1 ? e4[i].y : u == 2 ? e4[i].z : e4[i].w;
#pragma unroll
                            for (int d = 0; d < 8; d++) acc[i][d] = fmaf(e, vf[d], acc[i][d]);
                        }
                    }
                }
                for (; p < hi; p++) {
                    float vf[8];
                    v8_of(kv + (p - k0) * D + 8 * dg, vf);
#pragma unroll
                    for (int i = 0; i < PPT; i++)
                        if (p < nk[i]) {
                            const float e = S[(pg * PPT + i) * PA_SLD + p];
#pragma unroll
                            for (int d = 0; d < 8; d++) acc[i][d] = fmaf(e, vf[d], acc[i][d]);
                        }
                }
            }
            __syncthreads(); /* l_s is complete */
#pragma unroll
            for (int i = 0; i < PPT; i++) {
                const int pair = pg * PPT + i;
                if (nk[i] == 0) continue;
                const int64_t rh = (r0 + rs + pair / G) * n_head + kh * G + pair % G;
                if (final_out) {
#pragma unroll
                    for (int d = 0; d < 8; d++) final_out[rh * D + 8 * dg + d] = acc[i][d] / l_s[pair];
                } else {
                    float *pb = part + (rh * nbmax + j) * (D + 2);
                    if (dg == 0) pb[0] = m_s[pair], pb[1] = l_s[pair];
#pragma unroll
                    for (int d = 0; d < 8; d++) pb[2 + 8 * dg + d] = acc[i][d];
                }
            }
        }
        __syncthreads(); /* before the next run reuses shared memory */
    }
}

extern "C" {
int mucu_attn_kernel = -1;
}

extern "C" int mucu_attn_kernel_get(void) { return env_setting(&mucu_attn_kernel, "MUSER_CUDA_ATTN", 1); }

/* k_attn_prefill's scores with 8 lanes a dot (SC above; the default, 1.0-2.9 % on a prompt of the full
 * model, docs/benchmarks.md "Switches and what they are worth"); MUSER_CUDA_ATTN_SC=0: 32 lanes a dot. */
static int sc_v = -1;
extern "C" void mucu_set_attn_sc(int v) { sc_v = v; }

extern "C" bool mucu_attn_prefill_takes(int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim) {
    const int k = mucu_attn_kernel_get();
    return (k == 2 || ((k == 1 || k == 4) && rows >= 64)) && n_head_kv > 0 && n_head % n_head_kv == 0 &&
           n_head / n_head_kv <= PA_PMAX && (head_dim == 32 || head_dim == 64 || head_dim == 128);
}

/* MUSER_CUDA_ATTN_PV4=0: k_attn_prefill's weighted sum tests every pair
 * at every key (the loop before the 4-key one; A/B and tests). */
static int pv4_v = -1;
extern "C" void mucu_set_attn_pv4(int v) { pv4_v = v; }

template <int DC, bool SC>
static void launch_attn_prefill_sc(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                                   float scale, const float *q, float *part, int64_t nbmax, float *final_out,
                                   cudaStream_t st) {
    static bool attr_set = false;
    if (!attr_set) {
        /* the largest shared-memory carveout, so that two CTAs fit on an SM */
        if (cudaFuncSetAttribute(k_attn_prefill<DC, SC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 pa_smem<DC, SC>::TOTAL) != cudaSuccess ||
            cudaFuncSetAttribute(k_attn_prefill<DC, SC>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 (int)cudaSharedmemCarveoutMaxShared) != cudaSuccess)
            return;
        attr_set = true;
    }
    const int64_t rpc = PA_PMAX / (n_head / n_head_kv);
    const dim3 grid((unsigned)nbmax, (unsigned)n_head_kv, (unsigned)((rows + rpc - 1) / rpc));
    k_attn_prefill<DC, SC><<<grid, PA_NT, pa_smem<DC, SC>::TOTAL, st>>>(
        desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, env_setting(&pv4_v, "MUSER_CUDA_ATTN_PV4", 1));
}

template <int DC>
static void launch_attn_prefill(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                                float scale, const float *q, float *part, int64_t nbmax, float *final_out,
                                cudaStream_t st) {
    if (env_setting(&sc_v, "MUSER_CUDA_ATTN_SC", 1))
        launch_attn_prefill_sc<DC, true>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, st);
    else
        launch_attn_prefill_sc<DC, false>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, st);
}

extern "C" void mucu_attn_prefill(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                                  int64_t head_dim, float scale, const float *q, float *part, int64_t nbmax,
                                  float *final_out, void *stream) {
    const cudaStream_t st = (cudaStream_t)stream;
    if (head_dim == 32) launch_attn_prefill<1>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, st);
    else if (head_dim == 64) launch_attn_prefill<2>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, st);
    else launch_attn_prefill<4>(desc, rows, n_head, n_head_kv, scale, q, part, nbmax, final_out, st);
}
