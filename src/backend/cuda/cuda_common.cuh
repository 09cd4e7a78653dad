/* Device helpers shared by the backend's .cu files (`static inline`, so a
 * file that does not use one is not warned): float bits, f16, cp.async
 * and the int8 mma, the engine's expf and sigmoid (src/util/mumath.c
 * mu_expf), and the Q8_K activation blocks the products read (q8k.c),
 * compiled with the exactness flags of CMakeLists.txt (-fmad=false: every
 * fma here is an explicit fmaf). */
#ifndef MUSER_CUDA_COMMON_CUH
#define MUSER_CUDA_COMMON_CUH
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include "backend/cuda/cuda_kernels.h"

/* A kernel-choice setting (host side): *slot < 0 until the first call,
 * which reads the environment variable `name` (dflt when unset or empty). */
static inline int env_setting(int *slot, const char *name, int dflt) {
    if (*slot < 0) {
        const char *e = getenv(name);
        *slot = e && *e ? atoi(e) : dflt;
    }
    return *slot;
}

__device__ static inline uint32_t f32_bits(float f) { return __float_as_uint(f); }

/* The ring row of key i of an attention block whose first key is logical
 * `start` (phys0 = start % cap): key p at row p % cap, except a token
 * tree's keys from its base on, read at their ancestors' rows. anc is the
 * row description's own array in global memory (a copy indexed at run time
 * would live in local memory). */
__device__ static inline int64_t attn_key_row(const mucu_attn_row &a, const int8_t *__restrict__ anc, int64_t start,
                                              int64_t phys0, int64_t i) {
    if (start + i >= a.tbase) return (a.tbase + __ldg(anc + (start + i - a.tbase))) % a.cap;
    const int64_t ph = phys0 + i;
    return ph >= a.cap ? ph - a.cap : ph;
}

/* Runs body(row) with row(p) = attn_key_row(a, anc, start, phys0, p) for the
 * keys p < n of one block, the plain case hoisted out of the staging loops:
 * a block wholly before a tree's base (every block of a plain row) is a run
 * of the ring from phys0 that wraps at most once, so a key's row is an int
 * sum (a ring of 2^31 rows would hold 512 GiB of K). Per 16-byte piece,
 * attn_key_row's 64-bit compares and branches were most of the staging
 * loops' instructions. */
template <class F>
__device__ static inline void with_key_rows(const mucu_attn_row &a, const int8_t *anc, int64_t start, int64_t phys0,
                                            int n, F body) {
    if (start + n - 1 >= a.tbase) {
        body([&](int p) { return attn_key_row(a, anc, start, phys0, p); });
    } else {
        const int ph0 = (int)phys0, cap = (int)a.cap;
        body([=](int p) {
            const int ph = ph0 + p;
            return (int64_t)(ph >= cap ? ph - cap : ph);
        });
    }
}

/* Row r's position, first key and ancestors where they come from the tree
 * registers (mucu_attn_row.treg), which the draft's tree_reg wrote: only
 * after grid_dep_wait. Returns the ancestors attn_key_row reads. */
__device__ static inline const int8_t *attn_row_resolve(mucu_attn_row &a, const mucu_attn_row *__restrict__ desc,
                                                        int64_t r) {
    if (!a.treg) return desc[r].anc;
    a.pos = a.tbase + a.treg->depth[r];
    if (a.window > 0 && a.pos - a.window + 1 > a.first) a.first = a.pos - a.window + 1;
    return a.treg->anc[r];
}
__device__ static inline float bits_f32(uint32_t u) { return __uint_as_float(u); }

/* The device's multiprocessors (asked once; an H100's 132 if the runtime
 * cannot say): the persistent and split grids are sized by it. */
static inline int sm_count(void) {
    static int n = 0;
    if (!n) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            n = v;
        else n = 132;
    }
    return n;
}

/* Programmatic dependent launch (docs/cuda.md "Graphs"). In a replayed
 * decode graph every kernel that follows a kernel may be started as soon as
 * all blocks of its predecessor have started, so its blocks are resident
 * and its weight loads in flight while the predecessor drains. Every kernel
 * of this backend therefore calls grid_dep_wait() before it reads anything
 * an earlier kernel wrote or writes anything an earlier kernel reads (only
 * what no kernel writes may be read before it: weights, and the step's
 * arguments, copied in before any kernel of the step starts; a kernel
 * writes nothing before it); the call
 * returns once every earlier grid has completed and its writes are
 * visible. Without a programmatic dependency it returns at once.
 * tests/cuda/pdl_check.py checks that every kernel calls it (or, for kernels
 * that copy weights first, the device function named in its PRE_WAIT). */
__device__ static inline void grid_dep_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* f16 -> f32 by the conversion instruction: exact, like f16_to_f32 (the
 * hot paths: K/V rows and block scales). */
__device__ static inline float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* ------------------------------------------------------------ cp.async */

/* 16 bytes global -> shared, bypassing L1; valid false: 16 zero bytes (the
 * source is not read). */
__device__ static inline void cp16(void *sdst, const void *gsrc, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gsrc), "r"(n) : "memory");
}
/* 4 bytes global -> shared, of which the first n are read (the rest zero). */
__device__ static inline void cp4(void *sdst, const void *gsrc, int n) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gsrc), "r"(n) : "memory");
}
__device__ static inline void cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ static inline void cp_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---------------------------------------------------------------- mma */

/* d = a . b over 32 int8 values (16 rows x 8 columns), exact int32. */
__device__ static inline void mma_k32(int32_t d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
/* d = a . b over 16 int8 values. */
__device__ static inline void mma_k16(int32_t d[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

/* ------------------------------------- K-quant tables of the GEMMs */

/* A Q4_K / Q5_K block's 12 packed scale bytes q (header words w0, w1, w2
 * after d and dmin) as its 8 six-bit scales and 8 mins, a byte each, in 8
 * mask-and-shift operations on whole words (scale_min_k4's rule): sc0..3 =
 * q[0..3] & 63, m0..3 = q[4..7] & 63, sc4..7 = (q[8..11] & 15) | (q[0..3]
 * >> 6) << 4, m4..7 = (q[8..11] >> 4) | (q[4..7] >> 6) << 4. Every K-quant
 * product kernel decodes its headers here. */
struct kq_scmin {
    uint32_t sc03, sc47, mn03, mn47;
};
__device__ static inline kq_scmin kq_scales_mins(uint32_t w0, uint32_t w1, uint32_t w2) {
    kq_scmin r;
    r.sc03 = w0 & 0x3F3F3F3Fu, r.mn03 = w1 & 0x3F3F3F3Fu;
    r.sc47 = (w2 & 0x0F0F0F0Fu) | ((w0 >> 2) & 0x30303030u);
    r.mn47 = ((w2 >> 4) & 0x0F0F0F0Fu) | ((w1 >> 2) & 0x30303030u);
    return r;
}

/* A row's 16 int16 bsums of a 256-block (32 bytes at xb, 16-aligned) as
 * its sub-block sums bsum_j = bs[2j] + bs[2j+1] (|bsum_j| <= 32*128) split
 * into int8 lo_j = bsum_j & 127 and hi_j = bsum_j >> 7 (floor): bsum_j =
 * 128 hi_j + lo_j, so summ = sum_j m_j lo_j + 128 sum_j m_j hi_j comes
 * exactly from two k16 mma. Returns the bytes lo_0..7, hi_0..7. */
__device__ static inline uint4 kq_bsum_split(const uint8_t *xb) {
    const uint4 u0 = ((const uint4 *)xb)[0], u1 = ((const uint4 *)xb)[1];
    const uint32_t bw[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
    uint32_t lo[2] = {0, 0}, hi[2] = {0, 0};
#pragma unroll
    for (int jj = 0; jj < 8; jj++) {
        const int32_t v = (int32_t)(int16_t)(bw[jj] & 0xFFFF) + ((int32_t)bw[jj] >> 16);
        lo[jj >> 2] |= (uint32_t)(v & 127) << (8 * (jj & 3));
        hi[jj >> 2] |= ((uint32_t)(v >> 7) & 0xFF) << (8 * (jj & 3));
    }
    return make_uint4(lo[0], lo[1], hi[0], hi[1]);
}

/* ------------------------------------------------ engine math (mumath.c) */

__device__ static inline float pow2f(int32_t e) { return bits_f32((uint32_t)(e + 127) << 23); }

__device__ static inline float scale_pow2f(float p, int32_t n) {
    if (n > 127) return (p * pow2f(n - 1)) * 2.0f;
    if (n < -126) return (p * pow2f(n + 100)) * pow2f(-100);
    return p * pow2f(n);
}

__device__ static inline float d_expf(float x) {
    if (x != x) return x + x;
    if (x > 0x1.62e42ep+6f) return bits_f32(0x7F800000u);
    if (x < -0x1.9fe368p+6f) return 0.0f;
    float n_f = (x * 0x1.715476p+0f + 0x1.8p23f) - 0x1.8p23f;
    int32_t n = (int32_t)n_f;
    float r = fmaf(-n_f, 0x1.62e430p-1f, x);
    r = fmaf(-n_f, -0x1.05c610p-29f, r);
    float q = fmaf(0x1.6da798p-10f, r, 0x1.123db2p-7f);
    q = fmaf(q, r, 0x1.555470p-5f);
    q = fmaf(q, r, 0x1.55547cp-3f);
    q = fmaf(q, r, 0.5f);
    q = fmaf(q, r, 1.0f);
    float p = fmaf(r, q, 1.0f);
    return scale_pow2f(p, n);
}

__device__ static inline float d_sigmoidf(float x) { return 1.0f / (1.0f + d_expf(-x)); }
__device__ static inline float d_siluf(float x) { return x * d_sigmoidf(x); }

/* ------------------------------------------------ Q8_K activations (q8k.c) */

#define FULL_MASK 0xFFFFFFFFu

/* Q8_K activations in a split layout (the same values as q8k_block): qs
 * [rows][n_in] int8, d [rows][nb] f32, bsums [rows][nb][16] int16. */
static inline size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }
struct q8split {
    int8_t *qs;
    float *d;
    int16_t *bs;
};
static inline q8split q8split_at(void *base, int64_t n_in, int64_t rows) {
    const int64_t nb = n_in / 256;
    q8split s;
    s.qs = (int8_t *)base;
    s.d = (float *)((uint8_t *)base + al256((size_t)(rows * n_in)));
    s.bs = (int16_t *)((uint8_t *)s.d + al256((size_t)(rows * nb) * 4));
    return s;
}

/* The block position of lane l's value i (0..7) in the HALVES layout below:
 * 4l + i, then 128 + 4l + i - 4 (the one definition: k_residual and the
 * gate kernels load and store their rows by it too, cuda_kernels.cu hx). */
__host__ __device__ static inline int half_pos(int lane, int i) { return lane * 4 + (i < 4 ? i : 124 + i); }

/* One 256-value block by one warp: ggml's Q8_K rule (q8k.c) exactly, into
 * block b of the split layout. Lane l holds in v values 8l..8l+7, or with
 * HALVES values 4l..4l+3 and 128+4l..128+4l+3: then each 16-byte access of
 * the warp to the block covers 512 contiguous bytes (whole sectors), where 8
 * consecutive values a lane make each access touch 32 half-filled sectors. */
template <bool HALVES = false>
__device__ static inline void quantize_block_warp(const float v[8], q8split o, int64_t b, int lane) {
    float amax = 0.0f, mx = 0.0f;
    int idx = 0x7FFFFFFF;
    for (int i = 0; i < 8; i++) {
        float a = fabsf(v[i]);
        if (a > amax) { /* first (lowest index) element of largest magnitude */
            amax = a;
            mx = v[i];
            idx = HALVES ? half_pos(lane, i) : lane * 8 + i;
        }
    }
    for (int h = 16; h >= 1; h /= 2) {
        float oa = __shfl_xor_sync(FULL_MASK, amax, h), om = __shfl_xor_sync(FULL_MASK, mx, h);
        int oi = __shfl_xor_sync(FULL_MASK, idx, h);
        if (oa > amax || (oa == amax && oi < idx)) {
            amax = oa;
            mx = om;
            idx = oi;
        }
    }
    int8_t *qs = o.qs + b * 256;
    if (amax == 0.0f) {
        if (HALVES) {
            *(int *)(qs + half_pos(lane, 0)) = 0;
            *(int *)(qs + half_pos(lane, 4)) = 0;
            if ((lane & 3) == 0) o.bs[b * 16 + lane / 4] = o.bs[b * 16 + 8 + lane / 4] = 0;
        } else {
            *(int2 *)(qs + lane * 8) = make_int2(0, 0);
            if ((lane & 1) == 0) o.bs[b * 16 + lane / 2] = 0;
        }
        if (lane == 0) o.d[b] = 0.0f;
        return;
    }
    const float iscale = -127.0f / mx;
    int32_t s[2] = {0, 0};
    uint32_t packed[2] = {0, 0};
    for (int i = 0; i < 8; i++) {
        float t = fmaf(iscale, v[i], 12582912.0f);
        int32_t q = (int32_t)(f32_bits(t) & 0x7FFFFF) - 0x400000;
        q = q < 127 ? q : 127;
        s[HALVES ? i / 4 : 0] += q;
        packed[i / 4] |= ((uint32_t)q & 0xFF) << (8 * (i % 4));
    }
    /* the 16-value sums: over lane pairs, or (HALVES) over 4 lanes for each half */
    if (HALVES) {
        *(int *)(qs + half_pos(lane, 0)) = (int)packed[0];
        *(int *)(qs + half_pos(lane, 4)) = (int)packed[1];
        for (int k = 0; k < 2; k++) {
            s[k] += __shfl_xor_sync(FULL_MASK, s[k], 1);
            s[k] += __shfl_xor_sync(FULL_MASK, s[k], 2);
        }
        if ((lane & 3) == 0) {
            o.bs[b * 16 + lane / 4] = (int16_t)s[0];
            o.bs[b * 16 + 8 + lane / 4] = (int16_t)s[1];
        }
    } else {
        *(int2 *)(qs + lane * 8) = make_int2((int)packed[0], (int)packed[1]);
        s[0] += __shfl_xor_sync(FULL_MASK, s[0], 1);
        if ((lane & 1) == 0) o.bs[b * 16 + lane / 2] = (int16_t)s[0];
    }
    if (lane == 0) o.d[b] = 1.0f / iscale;
}

#endif
