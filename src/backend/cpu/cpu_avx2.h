/* Between the two AVX2 kernel files. Include only after their
 * `#pragma GCC target("avx2,...")` line. */
#ifndef MUSER_CPU_AVX2_H
#define MUSER_CPU_AVX2_H
#include "backend/cpu/cpu_simd_common.h"
#include <immintrin.h>

/* X8 weights (cpu_avx2_x8.c): Q4_K, Q5_K, Q6_K, output rows [o0, o1) inside
 * whole groups, any number of activation rows in the natural Q8_K layout. */
void mu_cpu_avx2_x8_matmul(const mu_weight *w, int64_t o0, int64_t o1, const mu_block_q8k *xq, int64_t rows, float *y);

#endif
