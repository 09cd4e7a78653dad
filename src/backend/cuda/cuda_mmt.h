/* k_mmt (cuda_mmt.cu), as plain C: the product for calls of 1 to 16 rows
 * of Q4_K, Q5_K and split Q6_K weights on the int8 tensor cores, up to
 * MUCU_MMT_SET_MAX weights reading the same activations in one launch.
 * Pointers are device memory. Exactness as in cuda_kernels.h
 * (docs/numerics.md). */
#ifndef MUSER_CUDA_MMT_H
#define MUSER_CUDA_MMT_H
#include "backend/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MUCU_MMT_SET_MAX = 4 };

/* Calls of at least this many rows (and at most 16) take k_mmt; 0: none.
 * -1 until first read from MUSER_CUDA_MMT; tests may set it directly. */
extern int mucu_mmt_min_rows;
/* MUSER_CUDA_MMT_ST: cp.async stages per warp; 0 or unset: 2 (the default), 1: by the rings' size (the
 * rule before), 3 or 4 forced */
extern int mucu_mmt_stages;
int mucu_mmt_min_rows_get(void);
/* MUSER_CUDA_MMQ: k_mmq (the weight stream straight into registers) for
 * calls of few rows: 0 off (k_mmt), 1 (the default) shaped by the grid for
 * calls of up to MUSER_CUDA_MMQ_ROWS rows (mucu_mmq_rows, default 4, at
 * most 8), 4, 5, 10 or 12 a shape forced for every call of up to 8 rows
 * (cuda_mmt.cu mmq_launch); -1 until first read */
extern int mucu_mmq_variant;
extern int mucu_mmq_rows;
int mucu_mmq_variant_get(void);

/* y[i][rows][n_out_i] = x . w[i]^T for n weights of the same n_in, from x's
 * split Q8_K activations (codes qs [rows][n_in], d [rows][nb], bsums
 * [rows][nb][16]); 1 <= rows <= 32 (k_mmq takes the calls mmq_launch picks,
 * k_mmt the rest). Only launches, on `stream` (a
 * cudaStream_t); the caller checks the launch (cudaGetLastError). */
void mucu_mmt(const mucu_weight *const *w, int n, float *const *y, const int8_t *qs, const float *d,
              const int16_t *bs, int rows, void *stream);

#ifdef __cplusplus
}
#endif
#endif
