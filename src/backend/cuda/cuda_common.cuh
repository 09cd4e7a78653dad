/* Device helpers shared by cuda_kernels.cu and cuda_prefill.cu (moved
 * from cuda_kernels.cu unchanged but for `inline`, so a file that does
 * not use one is not warned): float bits and the engine's expf
 * (src/util/mumath.c mu_expf), compiled with the exactness flags of
 * CMakeLists.txt (-fmad=false: every fma here is an explicit fmaf). */
#ifndef MUSER_CUDA_COMMON_CUH
#define MUSER_CUDA_COMMON_CUH
#include <stdint.h>

__device__ static inline uint32_t f32_bits(float f) { return __float_as_uint(f); }
__device__ static inline float bits_f32(uint32_t u) { return __uint_as_float(u); }

/* Programmatic dependent launch (docs/cuda.md "Graphs"). In a replayed
 * decode graph every kernel that follows a kernel may be started as soon as
 * all blocks of its predecessor have started, so its blocks are resident
 * and its weight loads in flight while the predecessor drains. Every kernel
 * of this backend therefore calls grid_dep_wait() before it reads anything
 * an earlier kernel wrote or writes anything an earlier kernel reads (only
 * weights, which no kernel writes, may be touched before it); the call
 * returns once every earlier grid has completed and its writes are
 * visible. Without a programmatic dependency it returns at once.
 * tests/cuda/pdl_check.py checks that every kernel calls it (or, for kernels
 * that copy weights first, the device function named in its PRE_WAIT). */
__device__ static inline void grid_dep_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
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

#endif
