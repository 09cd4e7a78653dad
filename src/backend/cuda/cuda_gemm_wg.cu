/* k_gemm_wg: the many-row product for Q4_K / Q5_K weights on Hopper's
 * warpgroup tensor-core instructions (wgmma, sm_90a only: this file is
 * compiled for sm_90a alone, CMakeLists.txt). Same exactness rules as
 * cuda_prefill.cu's k_gemm_kq2 (docs/numerics.md): the integer block sums
 * exact in any order, f_b by the written float formula, each (row, output)
 * total adding f_b strictly in block order; the outputs equal k_gemm_kq2's
 * bit for bit. Compiled with -fmad=false like every .cu file.
 *
 * Why another kernel: k_gemm_kq2 (mma.sync) multiplies every mma result by
 * its sub-block scale on the CUDA cores (an IMAD per result element and
 * 32-value sub-block) and builds its B fragments per warp; with one CTA of 8
 * warps per SM it issues about 2 instructions a cycle and reaches 200-240
 * TOPS. Here the sub-block scale goes into the weights before the tensor
 * cores see them: s (6 bits, 0..63) = 8 s_hi + s_lo with s_hi, s_lo in
 * 0..7, and code * s_hi, code * s_lo (code 0..15, Q5_K 0..31) are at most
 * 217, one unsigned byte each, so the four codes of a 32-bit word times
 * s_hi is one 32-bit multiply (no carry between bytes). Two accumulators
 * per element, hi and lo, sum a whole 256-block in the tensor cores:
 * sumi = 8 hi + lo, exactly sum_j s_j dot_j. The CUDA cores then only do
 * the per-block f_b, once per element and block instead of eight times.
 *
 * A CTA of two warpgroups takes 128 outputs (the wgmma M: 64 a warpgroup)
 * x 128 rows (the wgmma N: one m64n128k32 per sub-block and accumulator;
 * 245-247 registers, one CTA per SM). A is the weights, built in registers
 * (the m16n8k32 A layout per warp: lane (g, t) holds outputs g and g + 8,
 * values 4t..4t+3 and 16+4t..+3 of the sub-block); B is the Q8_K
 * activation codes, read by the
 * tensor cores from shared memory through a matrix descriptor. The
 * 256-blocks go through a 3-deep cp.async ring as in k_gemm_kq2; the
 * activation codes land in the no-swizzle K-major layout of 8-row x
 * 16-byte core matrices (core matrix (row group R, 16-byte chunk c) at
 * (c * NR/8 + R) * 128, row r % 8 at + 16 (r % 8)). summ = sum_j m_j bsum_j
 * comes from two m16n8k16 mma.sync per 8-row tile, as in k_gemm_kq2 (bsum
 * split into int8 lo / hi parts).
 *
 * Measured (H200 and H100): with cp.async copies
 * 1.04-1.09x k_gemm_kq2 on the big Q4_K shapes, 1.16-1.20x on Q5_K; with
 * the copies by TMA (k_gemm_wg_tma, the default) 1.54-1.60x and 1.66-1.69x.
 * With cp.async the kernel was latency-bound, not tensor-bound (ncu: tensor
 * pipe 27 %, 1.63 instructions a cycle, no eligible warp in 59 % of the
 * cycles, the copy loops ~30 % of the instructions): every block runs its
 * copies, scale tables, products and epilogue in lock step between two
 * barriers.
 * Measured slower, same call: 64-row tiles with each block's epilogue
 * interleaved with the next block's wgmma groups (0.81x k_gemm_kq2); two
 * 1-warpgroup CTAs per SM (0.84x); the two warpgroups in opposite order
 * within a block (0.97x). */
#include "backend/cuda/cuda_prefill.h"
#include "backend/cuda/cuda_common.cuh"
#include <cuda.h> /* CUtensorMap and its encoder's type only: the encoder comes through the runtime */
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdint.h>

enum { W_Q4_K = 12, W_Q5_K = 13, W_Q6_K = 14 };


#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_HAVE 1
#else
#define WG_HAVE 0
#endif

template <int TYPE> struct wg_smem {
    static constexpr int BO = 128;                               /* outputs a CTA (64 a warpgroup) */
    static constexpr int NR = 128;                               /* rows a CTA: one m64n128k32 per sub-block */
    static constexpr int ST = 3;                                 /* ring stages */
    static constexpr int LD = TYPE == W_Q4_K ? 144 : 176;        /* raw weight block bytes (and row stride) */
    static constexpr int QOFF = TYPE == W_Q4_K ? 16 : 48;        /* the 4-bit codes inside a block */
    static constexpr int X = 0;                                  /* int8 core matrices, NR x 256 */
    static constexpr int XD = X + NR * 256;                      /* f32 [NR] */
    static constexpr int XB = XD + NR * 4;                       /* int16 [NR][16] */
    static constexpr int W = XB + NR * 32;                       /* raw [BO][LD] */
    static constexpr int STAGE = ((W + BO * LD) + 127) / 128 * 128;
    static constexpr int TS = ST * STAGE;                        /* uint8 [BO][16]: s_hi 0..7, s_lo 0..7 */
    static constexpr int TD = TS + BO * 16;                      /* f32 [BO] d */
    static constexpr int TDM = TD + BO * 4;                      /* f32 [BO] dmin */
    static constexpr int TMIN = TDM + BO * 4;                    /* int8 [BO][8] mins */
    static constexpr int TXB = TMIN + BO * 8;                    /* int8 [NR][16] bsum parts lo_0..7, hi_0..7 */
    static constexpr int TOTAL = TXB + NR * 16;
    static constexpr int BAR = TOTAL;                            /* k_gemm_wg_tma: a stage's mbarrier each */
    static constexpr int TOTAL_TMA = BAR + ST * 8;
};

/* k_gemm_wg_tma (the default; MUSER_CUDA_GEMM_TMA=0 keeps k_gemm_wg): the
 * stage's codes, weight blocks and bsums come by the tensor memory
 * accelerator, 18 copies issued by one thread against an mbarrier, instead
 * of 256 threads' 16-byte cp.async with their address arithmetic (Nsight
 * Compute, thirty-fifth session: the copy loops were about 30 % of the
 * kernel's instructions and stall samples). A layer's Q4_K products at
 * 2,048 rows: 5.197 against k_gemm_wg's 7.486 ms (1.56x k_gemm_kq2 against
 * 1.09x; H100). A box of 128 rows x 16
 * bytes of the codes lands as one core-matrix column of the no-swizzle
 * layout, a box of 128 outputs x LD bytes as the [o][LD] block rows, one of
 * 128 rows x 32 bytes as the bsums; rows and outputs past the end are
 * zero-filled as cp.async's invalid copies are. */
struct wg_maps {
    CUtensorMap x, w, aux; /* codes, weight blocks (Q6_K: ql|qh), then bsums (Q6_K: scales) */
};

#if WG_HAVE
__device__ static inline void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ static inline void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ static inline void wg_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving a register's use across a wgmma fence or wait */
__device__ static inline void wg_pin(int32_t &r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ static inline void wg_pin(uint32_t &r) { asm volatile("" : "+r"(r)::"memory"); }

/* Matrix descriptor of a no-swizzle K-major operand: start address,
 * leading byte offset (next core matrix along K), stride byte offset
 * (next 8-row group). */
__device__ static inline uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

/* d[64 x 128] (+)= a[64 x 32] (u8, registers) . b[32 x 128] (s8, shared memory) */
__device__ static inline void wg_mma(int32_t d[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc,
                                     int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p;\n}\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
}

__device__ static inline void wg_mbar_init(uint32_t a, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
__device__ static inline void wg_mbar_expect(uint32_t a, uint32_t bytes) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(a), "r"(bytes)
                 : "memory");
}
/* until the phase of parity `parity` has completed */
__device__ static inline void wg_mbar_wait(uint32_t a, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
/* a 2-D box of the tensor map at (c0 bytes, row c1) into shared memory at dst, counted on mbarrier bar */
__device__ static inline void wg_tma(uint32_t dst, const CUtensorMap *tm, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)tm), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* the ring's ST mbarriers at bar0 (TMA copies), before any copy */
template <int ST> __device__ static inline void wg_bars_init(uint32_t bar0, int tid) {
    if (tid == 0) {
        for (int s = 0; s < ST; s++) wg_mbar_init(bar0 + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
}

/* Block b's NR rows of activation codes (256 each) into the no-swizzle
 * K-major core matrices at x (its shared address xa for TMA: 16 boxes of
 * NR rows x 16 bytes, one core-matrix column each, issued by the calling
 * thread on bar). cp.async: a quarter-warp (8 threads) fills one core
 * matrix (8 rows x 16-byte chunk c: 128 contiguous bytes of shared
 * memory), the warp's four quarters chunks c0..c0+3 of the same 8 rows
 * (64 contiguous bytes of each row: whole 32-byte sectors). Thread i took
 * chunk i % 16 of row i / 16 before, a warp's 16-byte stores 2,048 bytes
 * apart. This, the bsums spread over all threads (wg_gemm) and the loop
 * kept rolled (unrolled, ptxas took 255 registers and spilled) made a
 * layer's Q4_K products 2-3 % faster, each of the first two about half of
 * it (H100). */
template <int NR>
__device__ static inline void wg_codes_tma(uint32_t xa, const CUtensorMap *tm, int b, int64_t row0, uint32_t bar) {
    for (int c = 0; c < 16; c++) wg_tma(xa + c * (NR / 8) * 128, tm, b * 256 + 16 * c, (int)row0, bar);
}
template <int NR>
__device__ static inline void wg_codes_cp(uint8_t *x, const int8_t *__restrict__ qs, int64_t n_in, int b, int64_t row0,
                                          int64_t rows, int tid) {
#pragma unroll 1
    for (int i = tid; i < NR * 16; i += 256) {
        const int l = i & 31, wv = i >> 5;
        const int r = 8 * (wv % (NR / 8)) + (l & 7), c = 4 * (wv / (NR / 8)) + (l >> 3);
        const int64_t gr = row0 + r;
        const bool v = gr < rows;
        cp16(x + (c * (NR / 8) + (r >> 3)) * 128 + 16 * (r & 7), v ? qs + gr * n_in + (int64_t)b * 256 + 16 * c : qs, v);
    }
}

/* block b's activation scales of the NR rows into xd (cp.async, 4 bytes a thread) */
template <int NR>
__device__ static inline void wg_xd_cp(uint8_t *xd, const float *__restrict__ xdp, int nb, int b, int64_t row0,
                                       int64_t rows, int tid) {
    if (tid < NR) {
        const int64_t gr = row0 + tid;
        const bool v = gr < rows;
        cp4(xd + 4 * tid, v ? xdp + gr * nb + b : xdp, v ? 4 : 0);
    }
}

/* the ring's first ST - 1 stages: blocks 0 .. ST - 2 (a commit group each, empty past nb) */
template <int ST, typename L> __device__ static inline void wg_ring_start(int nb, const L &load_stage) {
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nb) load_stage(s, s);
        cp_commit();
    }
}

/* the finished totals of an m64nNk32 fragment (element 4i + e: output o0 +
 * 8 (e >> 1), row 8i + 2t + (e & 1)) into y, after the last copies */
template <int NA>
__device__ static inline void wg_store(const float *total, int64_t row0, int64_t out0, int o0, int t, int64_t rows,
                                       int64_t n_out, float *__restrict__ y, int has_scale, float scale) {
    cp_wait<0>();
#pragma unroll
    for (int i = 0; i < NA / 4; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t r = row0 + 8 * i + 2 * t + (e & 1), o = out0 + o0 + 8 * (e >> 1);
            const float v = total[4 * i + e];
            if (r < rows && o < n_out) y[r * n_out + o] = has_scale ? v * scale : v;
        }
}

/* Block b's stage s has landed (cp.async groups, and with TMA its
 * mbarrier's phase) and every thread may read it; the tensor cores read
 * the activation codes through the async proxy. */
template <int ST, bool TMA> __device__ static inline void wg_stage_ready(uint32_t bar0, int b) {
    cp_wait<ST - 2>();
    if (TMA) wg_mbar_wait(bar0 + 8 * (b % ST), (uint32_t)((b / ST) & 1));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}

/* A block's tables (k_gemm_wg): for output o (o >= 0) its
 * scales split into s_hi / s_lo, its mins, d and dmin; for row r (r >= 0)
 * the bsum split (as k_gemm_kq2) into txb. st: the block's stage, sm: the
 * shared memory (its output tables). */
template <int TYPE>
__device__ static __forceinline__ void wg_table(const uint8_t *st, uint8_t *sm, int o, int r, uint8_t *txb) {
    typedef wg_smem<TYPE> S;
    if (o >= 0) {
        const uint4 hq = *(const uint4 *)(st + S::W + o * S::LD);
        const kq_scmin k = kq_scales_mins(hq.y, hq.z, hq.w);
        *(uint4 *)(sm + S::TS + 16 * o) = make_uint4((k.sc03 >> 3) & 0x07070707u, (k.sc47 >> 3) & 0x07070707u,
                                                     k.sc03 & 0x07070707u, k.sc47 & 0x07070707u);
        *(uint2 *)(sm + S::TMIN + 8 * o) = make_uint2(k.mn03, k.mn47);
        ((float *)(sm + S::TD))[o] = h2f((uint16_t)(hq.x & 0xFFFF));
        ((float *)(sm + S::TDM))[o] = h2f((uint16_t)(hq.x >> 16));
    } else {
        *(uint4 *)(txb + 16 * r) = kq_bsum_split(st + S::XB + 32 * r);
    }
}

/* The integer sums of a block (a warpgroup's 64 outputs x NR rows): per
 * 32-value sub-block j, A = codes x s_hi and codes x s_lo of outputs o0,
 * o0 + 8, one wgmma each over all rows; returns with the last group still
 * in flight (the caller's wg_wait<0> ends it). xs: the stage's codes. */
template <int TYPE>
__device__ static __forceinline__ void wg_products(const uint8_t *st, const uint8_t *sm, int o0, int t, uint32_t xs,
                                                   int32_t hi[64], int32_t lo[64]) {
    typedef wg_smem<TYPE> S;
    constexpr int NR = S::NR, LD = S::LD;
    const uint4 sc0 = *(const uint4 *)(sm + S::TS + 16 * o0), sc1 = *(const uint4 *)(sm + S::TS + 16 * (o0 + 8));
    const uint8_t *wr0 = st + S::W + o0 * LD + 4 * t, *wr1 = wr0 + 8 * LD;
    uint32_t qh00 = 0, qh01 = 0, qh10 = 0, qh11 = 0;
    if (TYPE == W_Q5_K) {
        qh00 = *(const uint32_t *)(wr0 + 16), qh01 = *(const uint32_t *)(wr0 + 32);
        qh10 = *(const uint32_t *)(wr1 + 16), qh11 = *(const uint32_t *)(wr1 + 32);
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int p = j >> 1, sh = 4 * (j & 1);
        uint32_t c00 = (*(const uint32_t *)(wr0 + S::QOFF + 32 * p) >> sh) & 0x0F0F0F0Fu;
        uint32_t c10 = (*(const uint32_t *)(wr1 + S::QOFF + 32 * p) >> sh) & 0x0F0F0F0Fu;
        uint32_t c01 = (*(const uint32_t *)(wr0 + S::QOFF + 32 * p + 16) >> sh) & 0x0F0F0F0Fu;
        uint32_t c11 = (*(const uint32_t *)(wr1 + S::QOFF + 32 * p + 16) >> sh) & 0x0F0F0F0Fu;
        if (TYPE == W_Q5_K) { /* bit j of qh[l]: the fifth bit of value 32j + l */
            c00 |= ((qh00 >> j) & 0x01010101u) << 4;
            c01 |= ((qh01 >> j) & 0x01010101u) << 4;
            c10 |= ((qh10 >> j) & 0x01010101u) << 4;
            c11 |= ((qh11 >> j) & 0x01010101u) << 4;
        }
        const uint32_t h0 = ((j < 4 ? sc0.x : sc0.y) >> (8 * (j & 3))) & 0xFF;
        const uint32_t h1 = ((j < 4 ? sc1.x : sc1.y) >> (8 * (j & 3))) & 0xFF;
        const uint32_t l0 = ((j < 4 ? sc0.z : sc0.w) >> (8 * (j & 3))) & 0xFF;
        const uint32_t l1 = ((j < 4 ? sc1.z : sc1.w) >> (8 * (j & 3))) & 0xFF;
        uint32_t ah[4] = {c00 * h0, c10 * h1, c01 * h0, c11 * h1}, al[4] = {c00 * l0, c10 * l1, c01 * l0, c11 * l1};
#pragma unroll
        for (int k = 0; k < 4; k++) wg_pin(ah[k]), wg_pin(al[k]);
        wg_fence();
        /* all NR rows (NR / 8 row groups 128 bytes apart), chunks 2j, 2j + 1 */
        const uint64_t desc = wg_desc(xs + (uint32_t)(2 * j * (NR / 8) * 128), (NR / 8) * 128, 128);
        wg_mma(hi, ah[0], ah[1], ah[2], ah[3], desc, j > 0);
        wg_mma(lo, al[0], al[1], al[2], al[3], desc, j > 0);
        wg_commit();
        wg_wait<1>();
    }
}

/* f_b and the ordered totals of a block, after its products have landed.
 * Element 4i + e of this thread: output o0 + 8 (e >> 1), row 8i + 2t +
 * (e & 1). summ by two k16 mma per 8-row tile: A row o = [m_0..7 | 0] and
 * [0 | m_0..7], B column r = [lo_0..7 | hi_0..7] (txb) */
template <int TYPE>
__device__ static __forceinline__ void wg_epilogue(const uint8_t *st, const uint8_t *sm, const uint8_t *txb, int o0,
                                                   int g, int t, int32_t hi[64], int32_t lo[64], float total[64]) {
    typedef wg_smem<TYPE> S;
#pragma unroll
    for (int e = 0; e < 64; e++) wg_pin(hi[e]), wg_pin(lo[e]);
    const uint8_t *tmin = sm + S::TMIN;
    const float *td = (const float *)(sm + S::TD), *tdm = (const float *)(sm + S::TDM);
    const uint32_t mw0 = *(const uint32_t *)(tmin + 8 * o0 + 4 * (t & 1));
    const uint32_t mw1 = *(const uint32_t *)(tmin + 8 * (o0 + 8) + 4 * (t & 1));
    const uint32_t al0 = t < 2 ? mw0 : 0u, al1 = t < 2 ? mw1 : 0u, ah0 = t < 2 ? 0u : mw0, ah1 = t < 2 ? 0u : mw1;
    const float d0 = td[o0], d1 = td[o0 + 8], dm0 = tdm[o0], dm1 = tdm[o0 + 8];
    const float *xdv = (const float *)(st + S::XD);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t bx = *(const uint32_t *)(txb + 16 * (8 * i + g) + 4 * t);
        int32_t cl[4], ch[4];
        mma_k16(cl, al0, al1, bx);
        mma_k16(ch, ah0, ah1, bx);
        const float2 xd = *(const float2 *)(xdv + 8 * i + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int32_t sumi = 8 * hi[4 * i + e] + lo[4 * i + e];
            const int32_t summ = cl[e] + 128 * ch[e];
            const float d = (e >> 1) ? d1 : d0, dmin = (e >> 1) ? dm1 : dm0;
            const float x = (e & 1) ? xd.y : xd.x;
            const float f = (d * x) * (float)sumi - (dmin * x) * (float)summ;
            total[4 * i + e] = total[4 * i + e] + f;
        }
    }
}
#endif

/* The product's body; maps: the tensor maps of k_gemm_wg_tma's copies (TMA). */
template <int TYPE, bool TMA>
__device__ static inline void wg_gemm(const uint8_t *__restrict__ Wt, int64_t n_out, int nb,
                                      const int8_t *__restrict__ qs, const float *__restrict__ xdp,
                                      const int16_t *__restrict__ bsp, int64_t rows, float *__restrict__ y,
                                      int has_scale, float scale, const wg_maps *maps) {
#if WG_HAVE
    typedef wg_smem<TYPE> S;
    constexpr int NR = S::NR, LD = S::LD, NT = 256, BO = S::BO;
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int o0 = 16 * warp + g; /* this thread's outputs o0, o0 + 8 in the tile (warpgroup warp >> 2) */
    const int64_t row0 = (int64_t)blockIdx.x * NR, out0 = (int64_t)blockIdx.y * BO;
    const int64_t n_in = (int64_t)nb * 256;
    uint8_t *txb = sm + S::TXB;
    const uint32_t sm_base = (uint32_t)__cvta_generic_to_shared(sm), bar0 = sm_base + S::BAR;
    if (TMA) wg_bars_init<S::ST>(bar0, tid);

    auto load_stage = [&](int s, int b) {
        uint8_t *st = sm + s * S::STAGE;
        if constexpr (TMA) {
            wg_xd_cp<NR>(st + S::XD, xdp, nb, b, row0, rows, tid);
            if (tid == 0) { /* every thread's reads of this stage ended at the last barrier */
                const uint32_t bar = bar0 + 8 * s, dst = sm_base + (uint32_t)(s * S::STAGE);
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                wg_mbar_expect(bar, NR * 256 + BO * LD + NR * 32);
                wg_codes_tma<NR>(dst + S::X, &maps->x, b, row0, bar);
                wg_tma(dst + S::W, &maps->w, b * LD, (int)out0, bar);
                wg_tma(dst + S::XB, &maps->aux, b * 32, (int)row0, bar);
            }
        } else {
            wg_codes_cp<NR>(st + S::X, qs, n_in, b, row0, rows, tid);
            wg_xd_cp<NR>(st + S::XD, xdp, nb, b, row0, rows, tid);
            for (int i = tid; i < 2 * NR; i += NT) { /* the bsums, 16 bytes a thread: contiguous in shared memory */
                const int64_t gr = row0 + (i >> 1);
                const bool v = gr < rows;
                cp16(st + S::XB + 16 * i, v ? bsp + (gr * nb + b) * 16 + 8 * (i & 1) : bsp, v);
            }
            constexpr int CH = LD / 16;
            for (int i = tid; i < BO * CH; i += NT) {
                const int o = i / CH, c = i % CH;
                const int64_t go = out0 + o;
                const bool v = go < n_out;
                cp16(st + S::W + o * LD + 16 * c, v ? Wt + (go * nb + b) * LD + 16 * c : Wt, v);
            }
        }
    };

    int32_t hi[64], lo[64];
    float total[64];
#pragma unroll
    for (int e = 0; e < 64; e++) total[e] = 0.0f, hi[e] = 0, lo[e] = 0;

    wg_ring_start<S::ST>(nb, load_stage);
    for (int b = 0; b < nb; b++) {
        const int s = b % S::ST;
        const uint8_t *st = sm + s * S::STAGE;
        wg_stage_ready<S::ST, TMA>(bar0, b);
        for (int i = tid; i < BO + NR; i += NT) wg_table<TYPE>(st, sm, i < BO ? i : -1, i - BO, txb);
        __syncthreads();
        {
            const int nx = b + S::ST - 1;
            if (nx < nb) load_stage(nx % S::ST, nx);
            cp_commit();
        }
        wg_products<TYPE>(st, sm, o0, t, sm_base + (uint32_t)(s * S::STAGE + S::X), hi, lo);
        wg_wait<0>();
        wg_epilogue<TYPE>(st, sm, txb, o0, g, t, hi, lo, total);
    }
    wg_store<64>(total, row0, out0, o0, t, rows, n_out, y, has_scale, scale);
#endif
}

template <int TYPE>
__global__ static void __launch_bounds__(256, 1)
    k_gemm_wg(const uint8_t *__restrict__ Wt, int64_t n_out, int nb, const int8_t *__restrict__ qs,
              const float *__restrict__ xdp, const int16_t *__restrict__ bsp, int64_t rows, float *__restrict__ y,
              int has_scale, float scale) {
    grid_dep_wait();
    wg_gemm<TYPE, false>(Wt, n_out, nb, qs, xdp, bsp, rows, y, has_scale, scale, nullptr);
}

/* The same with the copies by TMA (MUSER_CUDA_GEMM_TMA=1; wg_maps says why). */
template <int TYPE>
__global__ static void __launch_bounds__(256, 1)
    k_gemm_wg_tma(const uint8_t *__restrict__ Wt, int64_t n_out, int nb, const int8_t *__restrict__ qs,
                  const float *__restrict__ xdp, const int16_t *__restrict__ bsp, int64_t rows, float *__restrict__ y,
                  int has_scale, float scale, const __grid_constant__ wg_maps maps) {
    grid_dep_wait();
    wg_gemm<TYPE, true>(Wt, n_out, nb, qs, xdp, bsp, rows, y, has_scale, scale, &maps);
}



/* ---------------------------------------------------------------- Q6_K
 * k_gemm_wg6: the same product for Q6_K weights (split layout: the
 * 192-byte ql|qh part per block, then the int8 scales, then the f16 d;
 * docs/cuda.md). A Q6_K sub-block is 16 values with a signed scale sc in
 * -128..127 and codes q - 32 in -32..31 (docs/numerics.md: sumi =
 * sum_j sc_j sum((q - 32) x)). The scale goes into the weights as for
 * Q4_K, in three digits: sc = g0 + 8 g1 + 64 g2 with every g in -3..4
 * (g0 = ((sc + 3) & 7) - 3, then the same of (sc - g0) / 8, whose third
 * digit is in -2..2), so (q - 32) g is in -128..124: one signed byte. Three
 * accumulators (s8 x s8 wgmma) sum a whole block; sumi = a0 + 8 a1 + 64 a2
 * exactly, and f_b = (d x) (float)sumi as k_gemm_kq2 forms it. The -32
 * stays inside the bytes, so no block sums and no mins are needed.
 *
 * A byte (q - 32) g without carries between bytes: the even and odd bytes
 * go to 16-bit lanes, each lane (q - 32) g + 256 (in 128..380: one
 * multiply-add of the lanes' (q - 32) by g plus 0x01000100, exact mod
 * 2^32 since every lane stays in 0..65535), and one byte permute takes the
 * four low bytes back. Three accumulators of NR/2 registers each: NR rows a
 * CTA (96; 80 for calls of up to 512 rows; MUSER_CUDA_WG6_ROWS forces 64, 80 or 96) instead of 128. With
 * the TMA copies (the default) 1.28x / 1.50x k_gemm_kq2 on the q / down
 * shapes at 2,048 rows (80 rows: 1.19x / 1.32x, 64: 1.14x / 1.22x); with
 * cp.async 1.02x / 1.17x, and the whole model was slower than with
 * k_gemm_kq2 (H100; docs/cuda.md "Measured and not taken"). */
template <int NR, bool TMA> struct wg6_smem {
    static constexpr int BO = 128;                 /* outputs a CTA */
    static constexpr int ST = 3;                   /* ring stages */
    static constexpr int LD = 208;                 /* cp.async: [ql|qh 192][scales 16], 52 words: 8 outputs in distinct banks */
    static constexpr int X = 0;                    /* int8 core matrices, NR x 256 */
    static constexpr int XD = X + NR * 256;        /* f32 [NR] */
    /* TMA: three [BO][64] boxes of ql|qh (bytes 0-63, 64-127, 128-191) in
     * the 64-byte swizzle, 1024-aligned, then the scales [BO][16] */
    static constexpr int W = TMA ? (XD + NR * 4 + 1023) / 1024 * 1024 : XD + NR * 4;
    static constexpr int WS = TMA ? W + 3 * BO * 64 : W + 192;
    static constexpr int WD = TMA ? WS + BO * 16 : W + BO * LD; /* f16 d, the aligned pair holding it [BO] */
    static constexpr int STAGE = (WD + BO * 4 + 1023) / 1024 * 1024;
    static constexpr int TGL = 272;                /* digit table row: 16 x int4 + 16 (rows 4 banks apart) */
    static constexpr int TG = ST * STAGE;          /* int4 [BO][16] (g0, g1, g2, 0) per sub-block */
    static constexpr int TD = TG + BO * TGL;       /* f32 [BO] d */
    static constexpr int TOTAL = TD + BO * 4;
    static constexpr int BAR = TOTAL;              /* TMA: a stage's mbarrier each */
    static constexpr int TOTAL_TMA = BAR + ST * 8;
};

#if WG_HAVE
/* d[64 x N] (+)= a[64 x 32] (s8, registers) . b[32 x N] (s8, shared memory) */
template <int N>
__device__ static inline void wg_mma_ss(int32_t *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc,
                                        int acc) {
    if constexpr (N == 64)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
    if constexpr (N == 80)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %45, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n80k32.s32.s8.s8 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39}, {%40,%41,%42,%43}, %44, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
    if constexpr (N == 96)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n96k32.s32.s8.s8 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47}, {%48,%49,%50,%51}, %52, p;\n}\n"
                     : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
}

/* the bytes (q - 32) g of the four codes q (0..63) of a word, from its even
 * and odd bytes' lanes (q - 32 each, as q6_lanes makes them) */
__device__ static inline uint32_t q6_digit(uint32_t ev, uint32_t od, int32_t gd) {
    const uint32_t e = ev * (uint32_t)gd + 0x01000100u, o = od * (uint32_t)gd + 0x01000100u;
    return __byte_perm(e, o, 0x6240);
}
__device__ static inline void q6_lanes(uint32_t q, uint32_t &ev, uint32_t &od) {
    ev = __byte_perm(q, 0, 0x4240) - 0x00200020u;
    od = __byte_perm(q, 0, 0x4341) - 0x00200020u;
}

/* k_gemm_wg6's digit table of output o (in the tile), half hf of its 16
 * scales (and d with hf 0), for block b in stage st */
template <int NR, bool TMA>
__device__ static __forceinline__ void wg6_table(const uint8_t *st, uint8_t *sm, int o, int hf, int64_t out0, int nb,
                                                 int b) {
    typedef wg6_smem<NR, TMA> S;
    uint8_t *tg = sm + S::TG;
    const uint2 sw = *(const uint2 *)(st + S::WS + o * (TMA ? 16 : S::LD) + 8 * hf);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int sc = (int)(int8_t)((k < 4 ? sw.x : sw.y) >> (8 * (k & 3)));
        const int g0 = ((sc + 3) & 7) - 3, s1 = (sc - g0) >> 3;
        const int g1 = ((s1 + 3) & 7) - 3, g2 = (s1 - g1) >> 3;
        *(int4 *)(tg + o * S::TGL + 16 * (8 * hf + k)) = make_int4(g0, g1, g2, 0);
    }
    if (!hf) {
        const int64_t item = (out0 + o) * nb + b;
        ((float *)(sm + S::TD))[o] = h2f(((const uint16_t *)(st + S::WD + 4 * o))[item & 1]);
    }
}

/* k_gemm_wg6's integer sums of a block (a warpgroup's 64 outputs x NR
 * rows), the last group left in flight: step j takes values 32j..32j+31,
 * sub-blocks 2j (a fragment's first 16 values) and 2j + 1. Value 128h +
 * 32p + l is nibble (p >> 1) of ql[64h + 32(p & 1) + l] with bits 2p,
 * 2p + 1 of qh[32h + l] above it. sbase: the stage's shared address. */
template <int NR, bool TMA>
__device__ static __forceinline__ void wg6_products(const uint8_t *st, const uint8_t *sm, int o0, int t, uint32_t sbase,
                                                    int32_t *a0, int32_t *a1, int32_t *a2) {
    typedef wg6_smem<NR, TMA> S;
    constexpr int LD = S::LD, BO = S::BO;
    const uint8_t *wr0 = st + S::W + o0 * LD + 4 * t, *wr1 = wr0 + 8 * LD;
    /* TMA: output o's row of box r at W + 8192 r + 64 o, chunk c at 16 (c ^ sw) */
    const uint8_t *tw0 = st + S::W + o0 * 64 + 4 * t, *tw1 = tw0 + 8 * 64;
    const uint32_t sw0 = ((sbase + (uint32_t)(S::W + o0 * 64)) >> 7) & 3;
    const uint32_t sw1 = ((sbase + (uint32_t)(S::W + (o0 + 8) * 64)) >> 7) & 3;
    const uint8_t *tg0 = sm + S::TG + o0 * S::TGL, *tg1 = tg0 + 8 * S::TGL;
    const uint32_t xs = sbase + (uint32_t)S::X;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int h = j >> 2, p = j & 3, nsh = 4 * (p >> 1), hsh = 2 * p;
        const int ql = 64 * h + 32 * (p & 1), qh = 128 + 32 * h;
        /* codes: [output o0 / o0 + 8][values 4t.. / 16 + 4t..] */
        uint32_t q[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t wl, wh;
            if (TMA) { /* ql: box h, chunk 2 (p & 1) + (k >> 1); qh: box 2, chunk 2h + (k >> 1) */
                const uint8_t *tw = (k & 1) ? tw1 : tw0;
                const uint32_t sw = (k & 1) ? sw1 : sw0;
                wl = *(const uint32_t *)(tw + BO * 64 * h + 16 * ((uint32_t)(2 * (p & 1) + (k >> 1)) ^ sw));
                wh = *(const uint32_t *)(tw + BO * 64 * 2 + 16 * ((uint32_t)(2 * h + (k >> 1)) ^ sw));
            } else {
                const uint8_t *wr = (k & 1) ? wr1 : wr0;
                const int off = 16 * (k >> 1);
                wl = *(const uint32_t *)(wr + ql + off), wh = *(const uint32_t *)(wr + qh + off);
            }
            q[k] = ((wl >> nsh) & 0x0F0F0F0Fu) | (((wh >> hsh) & 0x03030303u) << 4);
        }
        uint32_t ev[4], od[4];
#pragma unroll
        for (int k = 0; k < 4; k++) q6_lanes(q[k], ev[k], od[k]);
        const int4 d00 = *(const int4 *)(tg0 + 16 * (2 * j)), d10 = *(const int4 *)(tg1 + 16 * (2 * j));
        const int4 d01 = *(const int4 *)(tg0 + 16 * (2 * j + 1)), d11 = *(const int4 *)(tg1 + 16 * (2 * j + 1));
        uint32_t A[3][4] = {{q6_digit(ev[0], od[0], d00.x), q6_digit(ev[1], od[1], d10.x),
                             q6_digit(ev[2], od[2], d01.x), q6_digit(ev[3], od[3], d11.x)},
                            {q6_digit(ev[0], od[0], d00.y), q6_digit(ev[1], od[1], d10.y),
                             q6_digit(ev[2], od[2], d01.y), q6_digit(ev[3], od[3], d11.y)},
                            {q6_digit(ev[0], od[0], d00.z), q6_digit(ev[1], od[1], d10.z),
                             q6_digit(ev[2], od[2], d01.z), q6_digit(ev[3], od[3], d11.z)}};
#pragma unroll
        for (int k = 0; k < 4; k++) wg_pin(A[0][k]), wg_pin(A[1][k]), wg_pin(A[2][k]);
        wg_fence();
        const uint64_t desc = wg_desc(xs + (uint32_t)(2 * j * (NR / 8) * 128), (NR / 8) * 128, 128);
        wg_mma_ss<NR>(a0, A[0][0], A[0][1], A[0][2], A[0][3], desc, j > 0);
        wg_mma_ss<NR>(a1, A[1][0], A[1][1], A[1][2], A[1][3], desc, j > 0);
        wg_mma_ss<NR>(a2, A[2][0], A[2][1], A[2][2], A[2][3], desc, j > 0);
        wg_commit();
        wg_wait<1>();
    }
}

/* k_gemm_wg6's f_b and ordered totals of a block after its products:
 * element 4i + e is output o0 + 8 (e >> 1), row 8i + 2t + (e & 1) */
template <int NR, bool TMA>
__device__ static __forceinline__ void wg6_epilogue(const uint8_t *st, const uint8_t *sm, int o0, int t, int32_t *a0,
                                                    int32_t *a1, int32_t *a2, float *total) {
    typedef wg6_smem<NR, TMA> S;
#pragma unroll
    for (int e = 0; e < NR / 2; e++) wg_pin(a0[e]), wg_pin(a1[e]), wg_pin(a2[e]);
    const float *td = (const float *)(sm + S::TD);
    const float dv0 = td[o0], dv1 = td[o0 + 8];
    const float *xdv = (const float *)(st + S::XD);
#pragma unroll
    for (int i = 0; i < NR / 8; i++) {
        const float2 xd = *(const float2 *)(xdv + 8 * i + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int32_t sumi = a0[4 * i + e] + 8 * a1[4 * i + e] + 64 * a2[4 * i + e];
            const float d = (e >> 1) ? dv1 : dv0, x = (e & 1) ? xd.y : xd.x;
            total[4 * i + e] = total[4 * i + e] + (d * x) * (float)sumi;
        }
    }
}
#endif

/* TMA: the codes, ql|qh and scales by the tensor memory accelerator (as
 * wg_gemm's); the 64-byte swizzle (16-byte chunk c of a 64-byte row at
 * shared address a lands at chunk c ^ ((a >> 7) & 3)) puts the 8 outputs
 * a warp reads at one time in distinct banks, as LD = 208 does for cp.async. */
template <int NR, bool TMA>
__global__ static void __launch_bounds__(256, 1)
    k_gemm_wg6(const uint8_t *__restrict__ Wt, int64_t n_out, int nb, const int8_t *__restrict__ qs,
               const float *__restrict__ xdp, int64_t rows, float *__restrict__ y, int has_scale, float scale,
               const __grid_constant__ wg_maps maps) {
    grid_dep_wait();
#if WG_HAVE
    typedef wg6_smem<NR, TMA> S;
    constexpr int LD = S::LD, NT = 256, BO = S::BO, NA = NR / 2;
    extern __shared__ __align__(128) uint8_t sm[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int o0 = 16 * warp + g; /* this thread's outputs o0, o0 + 8 (warpgroup warp >> 2) */
    const int64_t row0 = (int64_t)blockIdx.x * NR, out0 = (int64_t)blockIdx.y * BO;
    const int64_t n_in = (int64_t)nb * 256, items = n_out * (int64_t)nb;
    const int64_t q6_sc = items * 192, q6_d = items * 208; /* the split layout's scales and d */
    const uint32_t sm_base = (uint32_t)__cvta_generic_to_shared(sm), bar0 = sm_base + S::BAR;
    if (TMA) wg_bars_init<S::ST>(bar0, tid);

    auto load_stage = [&](int s, int b) {
        uint8_t *st = sm + s * S::STAGE;
        wg_xd_cp<NR>(st + S::XD, xdp, nb, b, row0, rows, tid);
        if (tid < BO) { /* d: the 4-aligned pair holding it (only its first half for the array's last, even item) */
            const int64_t item = (out0 + tid) * nb + b, pair = item & ~(int64_t)1;
            const bool v = out0 + tid < n_out;
            const int n = !v ? 0 : ((item | 1) < items ? 4 : 2);
            cp4(st + S::WD + 4 * tid, v ? Wt + q6_d + 2 * pair : Wt, n);
        }
        if constexpr (TMA) {
            if (tid == 0) { /* every thread's reads of this stage ended at the last barrier */
                const uint32_t bar = bar0 + 8 * s, dst = sm_base + (uint32_t)(s * S::STAGE);
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                wg_mbar_expect(bar, NR * 256 + 3 * BO * 64 + BO * 16);
                wg_codes_tma<NR>(dst + S::X, &maps.x, b, row0, bar);
                for (int r = 0; r < 3; r++) wg_tma(dst + S::W + r * BO * 64, &maps.w, b * 192 + 64 * r, (int)out0, bar);
                wg_tma(dst + S::WS, &maps.aux, b * 16, (int)out0, bar);
            }
        } else {
            wg_codes_cp<NR>(st + S::X, qs, n_in, b, row0, rows, tid);
#pragma unroll 1
            for (int i = tid; i < BO * 13; i += NT) { /* 12 chunks of ql|qh, then the scales */
                const int o = i / 13, c = i % 13;
                const int64_t go = out0 + o, item = go * nb + b;
                const bool v = go < n_out;
                const uint8_t *src = c < 12 ? Wt + item * 192 + 16 * c : Wt + q6_sc + item * 16;
                cp16(st + S::W + o * LD + 16 * c, v ? src : Wt, v);
            }
        }
    };

    int32_t a0[NA], a1[NA], a2[NA];
    float total[NA];
#pragma unroll
    for (int e = 0; e < NA; e++) total[e] = 0.0f, a0[e] = 0, a1[e] = 0, a2[e] = 0;

    wg_ring_start<S::ST>(nb, load_stage);
    for (int b = 0; b < nb; b++) {
        const int s = b % S::ST;
        const uint8_t *st = sm + s * S::STAGE;
        wg_stage_ready<S::ST, TMA>(bar0, b);
        wg6_table<NR, TMA>(st, sm, tid >> 1, tid & 1, out0, nb, b);
        __syncthreads();
        {
            const int nx = b + S::ST - 1;
            if (nx < nb) load_stage(nx % S::ST, nx);
            cp_commit();
        }
        wg6_products<NR, TMA>(st, sm, o0, t, sm_base + (uint32_t)(s * S::STAGE), a0, a1, a2);
        wg_wait<0>();
        wg6_epilogue<NR, TMA>(st, sm, o0, t, a0, a1, a2, total);
    }
    wg_store<NA>(total, row0, out0, o0, t, rows, n_out, y, has_scale, scale);
#endif
}

/* ---------------------------------------------------------------- launch */

static int wg_dev_ok = -1; /* compute capability 9.0 (wgmma) */

extern "C" bool mucu_gemm_wg_device(void) {
    if (wg_dev_ok < 0) {
        int dev = 0, ma = 0, mi = 0;
        wg_dev_ok = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && ma == 9 &&
                    mi == 0;
    }
    return wg_dev_ok == 1;
}

/* The driver's tensor-map encoder through the runtime (no link to libcuda);
 * NULL where the driver has none. */
static PFN_cuTensorMapEncodeTiled_v12000 tma_encoder(void) {
    static int state = 0; /* 0 not asked, 1 found, -1 none */
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (state == 0) {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess && p)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        else
            (void)cudaGetLastError(); /* a failed lookup leaves no error behind: the caller falls back */
        state = fn ? 1 : -1;
    }
    return fn;
}

/* A 2-D byte tensor of `rows` rows of `row_bytes` at p, read in boxes of
 * box_rows x box_bytes; false where the encoder refuses it (alignment). */
static bool tma_map(CUtensorMap *m, const void *p, uint64_t row_bytes, uint64_t rows, uint32_t box_bytes,
                    uint32_t box_rows, CUtensorMapSwizzle swz) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tma_encoder();
    if (!enc || ((uintptr_t)p & 15) || (row_bytes & 15)) return false;
    const cuuint64_t dim[2] = {row_bytes, rows}, stride[1] = {row_bytes};
    const cuuint32_t box[2] = {box_bytes, box_rows}, es[2] = {1, 1};
    return enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
               swz, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static int gemm_tma = -1; /* MUSER_CUDA_GEMM_TMA (default 1), read once */
extern "C" long mucu_gemm_tma_launches = 0;
extern "C" void mucu_set_gemm_tma(int v) { gemm_tma = v; }

/* A kernel's dynamic shared memory raised to `bytes` once (*done); false:
 * the error stays for the caller's cudaGetLastError. */
template <typename K> static bool smem_once(K kernel, int bytes, bool *done) {
    if (!*done && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess)
        return false;
    return *done = true;
}

template <int TYPE>
static void launch_wg(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows, float *y,
                      cudaStream_t st) {
    typedef wg_smem<TYPE> S;
    const dim3 grid((unsigned)((rows + S::NR - 1) / S::NR), (unsigned)((w->n_out + S::BO - 1) / S::BO));
    const int nb = (int)(w->n_in / 256);
    static wg_maps maps; /* a kernel argument (by value): static only to keep 384 bytes off the stack */
    static bool attr_set = false, tma_attr = false;
    if (env_setting(&gemm_tma, "MUSER_CUDA_GEMM_TMA", 1) &&
        tma_map(&maps.x, qs, (uint64_t)w->n_in, (uint64_t)rows, 16, S::NR, CU_TENSOR_MAP_SWIZZLE_NONE) &&
        tma_map(&maps.w, w->data, (uint64_t)nb * S::LD, (uint64_t)w->n_out, S::LD, S::BO, CU_TENSOR_MAP_SWIZZLE_NONE) &&
        tma_map(&maps.aux, bs, (uint64_t)nb * 32, (uint64_t)rows, 32, S::NR,
                CU_TENSOR_MAP_SWIZZLE_NONE)) {
        if (!smem_once(k_gemm_wg_tma<TYPE>, S::TOTAL_TMA, &tma_attr)) return;
        k_gemm_wg_tma<TYPE><<<grid, 256, S::TOTAL_TMA, st>>>(w->data, w->n_out, nb, qs, d, bs, rows, y, w->has_scale,
                                                             w->scale, maps);
        mucu_gemm_tma_launches++;
        return;
    }
    if (!smem_once(k_gemm_wg<TYPE>, S::TOTAL, &attr_set)) return;
    k_gemm_wg<TYPE><<<grid, 256, S::TOTAL, st>>>(w->data, w->n_out, nb, qs, d, bs, rows, y, w->has_scale, w->scale);
}

static int wg6_rows = -1; /* MUSER_CUDA_WG6_ROWS: k_gemm_wg6's rows a CTA (64, 80, 96; 0: by the rows) */
extern "C" void mucu_set_wg6_rows(int v) { wg6_rows = v; }

template <int NR>
static void launch_wg6(const mucu_weight *w, const int8_t *qs, const float *d, int64_t rows, float *y, cudaStream_t st) {
    typedef wg6_smem<NR, false> S;
    typedef wg6_smem<NR, true> ST;
    const int nb = (int)(w->n_in / 256);
    const dim3 grid((unsigned)((rows + NR - 1) / NR), (unsigned)((w->n_out + S::BO - 1) / S::BO));
    static wg_maps maps;
    static bool attr_set = false, tma_attr = false;
    const uint8_t *wd = (const uint8_t *)w->data;
    const uint64_t items = (uint64_t)w->n_out * (uint64_t)nb;
    if (env_setting(&gemm_tma, "MUSER_CUDA_GEMM_TMA", 1) &&
        tma_map(&maps.x, qs, (uint64_t)w->n_in, (uint64_t)rows, 16, NR, CU_TENSOR_MAP_SWIZZLE_NONE) &&
        tma_map(&maps.w, wd, (uint64_t)nb * 192, (uint64_t)w->n_out, 64, S::BO, CU_TENSOR_MAP_SWIZZLE_64B) &&
        tma_map(&maps.aux, wd + items * 192, (uint64_t)nb * 16, (uint64_t)w->n_out, 16, S::BO,
                CU_TENSOR_MAP_SWIZZLE_NONE)) {
        if (!smem_once(k_gemm_wg6<NR, true>, ST::TOTAL_TMA, &tma_attr)) return;
        k_gemm_wg6<NR, true><<<grid, 256, ST::TOTAL_TMA, st>>>(w->data, w->n_out, nb, qs, d, rows, y, w->has_scale,
                                                               w->scale, maps);
        mucu_gemm_tma_launches++;
        return;
    }
    if (!smem_once(k_gemm_wg6<NR, false>, S::TOTAL, &attr_set)) return;
    k_gemm_wg6<NR, false><<<grid, 256, S::TOTAL, st>>>(w->data, w->n_out, nb, qs, d, rows, y, w->has_scale, w->scale,
                                                       maps);
}

extern "C" void mucu_gemm_wg(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows,
                             float *y, void *stream) {
    const cudaStream_t st = (cudaStream_t)stream;
    if (w->type == W_Q4_K) launch_wg<W_Q4_K>(w, qs, d, bs, rows, y, st);
    else if (w->type == W_Q5_K) launch_wg<W_Q5_K>(w, qs, d, bs, rows, y, st);
    else {
        /* 80 rows up to 512 (the default prefill chunk: ffn_down's 52 x 7 CTAs
         * fill the 132 SMs' third wave where 52 x 6 of 96 rows leave most
         * of it idle; 0.737 against 0.812 ms, pp512 +1.6 %), 96 above
         * (2,048 rows: 2.354 against 2.679 ms; H100) */
        int nr = env_setting(&wg6_rows, "MUSER_CUDA_WG6_ROWS", 0);
        if (nr != 64 && nr != 80 && nr != 96) nr = rows <= 512 ? 80 : 96;
        if (nr == 64) launch_wg6<64>(w, qs, d, rows, y, st);
        else if (nr == 80) launch_wg6<80>(w, qs, d, rows, y, st);
        else launch_wg6<96>(w, qs, d, rows, y, st);
    }
}
