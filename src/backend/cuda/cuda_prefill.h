/* Prefill kernels of the cuda backend (cuda_prefill.cu), as plain C: the
 * many-row int8 tensor-core product for Q4_K, Q5_K and split Q6_K weights
 * (k_gemm_kq2), the many-row attention (k_attn_prefill), their selection,
 * and a cudaEvent timer for
 * tests/cuda/test_cuda_backend.c's benchmark mode. Pointers are device
 * memory. Exactness as in cuda_kernels.h (docs/numerics.md). */
#ifndef MUSER_CUDA_PREFILL_H
#define MUSER_CUDA_PREFILL_H
#include "backend/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which many-row kernel mucu_matmul uses: 0 the first one (k_gemm_kq in
 * cuda_kernels.cu), 1 (the default) k_gemm_kq2 with its tiles picked by
 * shape (a layer's products at 32 rows: 1.090 ms against k_gemm_kq's 1.906,
 * H200), 2 and 3 k_gemm_kq2 with its 128- or 64-row tiles
 * forced (tests, benchmarks), 4 k_gemm_wg forced where it applies (below). -1
 * until first read from MUSER_CUDA_GEMM_KERNEL; tests may set it directly. */
extern int mucu_gemm_kernel;
int mucu_gemm_kernel_get(void);
/* k_gemm_wg and k_gemm_wg6 (cuda_gemm_wg.cu, built for sm_90a alone): the
 * many-row products for Q4_K / Q5_K and for Q6_K on wgmma, bit for bit
 * k_gemm_kq2's outputs. mucu_gemm_kq2 hands them the calls they take
 * (mucu_gemm_wg_takes): with mucu_gemm_kernel 1 (the default) the calls of
 * more than 64 rows whose 64-row x 128-output tiles number at least 100
 * (smaller grids keep k_gemm_kq2 and its split), with mucu_gemm_kernel 4
 * every call of these types (tests); only on a compute capability 9.0
 * device, and not with mucu_set_gemm_wg(0) (MUSER_CUDA_GEMM_WG=0; -1 until
 * read from it). */
bool mucu_gemm_wg_device(void);
bool mucu_gemm_wg_takes(const mucu_weight *w, int64_t rows);
void mucu_set_gemm_wg(int v);
/* Q6_K to k_gemm_wg6: on by default; MUSER_CUDA_GEMM_WG6=0 or
 * mucu_set_gemm_wg6(0) keeps Q6_K on k_gemm_kq2 (-1 reads the variable
 * again). */
void mucu_set_gemm_wg6(int v);
/* k_gemm_wg6's rows a CTA: 96, 80 or 64 (MUSER_CUDA_WG6_ROWS; by default
 * 80 for calls of up to 512 rows, 96 above; -1 reads the variable again) */
void mucu_set_wg6_rows(int v);
/* Launches with the copies by the tensor memory accelerator (k_gemm_wg_tma,
 * k_gemm_wg6<NR, true>; the default: MUSER_CUDA_GEMM_TMA=0 or
 * mucu_set_gemm_tma(0) keeps the cp.async copies, -1 reads the variable
 * again; cuda_gemm_wg.cu says why): tests see that the TMA path took the
 * calls. */
extern long mucu_gemm_tma_launches;
void mucu_set_gemm_tma(int v);
void mucu_gemm_wg(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows, float *y,
                  void *stream);
/* Does a call of `rows` (>= MUSER_CUDA_GEMM) take k_gemm_kq2? */
bool mucu_gemm_kq2_takes(int64_t rows);

/* y[rows][n_out] = x . w^T for Q4_K, Q5_K or split Q6_K w, from x's split
 * Q8_K activations (codes qs [rows][n_in], d [rows][nb], bsums
 * [rows][nb][16]). Only launches, on `stream` (a cudaStream_t: the
 * backend's, cuda_kernels.cu); the caller checks the launch
 * (cudaGetLastError). */
void mucu_gemm_kq2(const mucu_weight *w, const int8_t *qs, const float *d, const int16_t *bs, int64_t rows, float *y,
                   float *split, void *stream);
/* Bytes of scratch a k_gemm_kq2 call of `rows` of w (a weight it takes)
 * splits over its 256-blocks with (each CTA a share of the blocks, every
 * block's f_b kept, then summed in block order by a second kernel: bit for
 * bit the unsplit sums), or 0 when it does not split (grids of 100 tiles or
 * more, MUSER_CUDA_GEMM_SPLIT=0). Without scratch (split NULL)
 * mucu_gemm_kq2 does not split. Callers outside this file ask
 * mucu_matmul_split_bytes (cuda_kernels.h), which first checks that the
 * call takes this kernel. */
size_t mucu_gemm_split_bytes(const mucu_weight *w, int64_t rows);
/* 0: no split; 1 (the default): split grids of fewer than 100 tiles; N >= 2:
 * split every call N ways (tests). -1 until read from MUSER_CUDA_GEMM_SPLIT. */
void mucu_set_gemm_split(int v);

/* Which attention kernels mucu_attention uses: 0 the per-(row, head, block)
 * k_attn_blocks (cuda_kernels.cu) and its one-warp merge k_attn_merge;
 * 1 (the default) k_attn_prefill for calls of >= 64 rows (prefill chunks)
 * and k_attn_dec below (cuda_attn.cu: decode batches, verification), both
 * merged by k_attn_merge_scan; 2 k_attn_prefill at any row count; 3
 * k_attn_dec at any row count (tests); 4 the kernels before k_attn_dec
 * (k_attn_prefill from 64 rows, k_attn_blocks below, k_attn_merge;
 * benchmarks). k_attn_prefill only takes head_dim 32, 64 or 128 and at
 * most 64 query heads per KV head, k_attn_dec head_dim 64, 128 or 256;
 * other shapes take k_attn_blocks. -1 until first read from
 * MUSER_CUDA_ATTN; tests may set it directly. */
extern int mucu_attn_kernel;
int mucu_attn_kernel_get(void);
bool mucu_attn_prefill_takes(int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim);
/* 0: k_attn_prefill's weighted sum tests every pair at every key (the loop
 * before the 4-key one); 1 (the default) runs the keys below every pair's
 * count 4 at a time untested. -1 until read from MUSER_CUDA_ATTN_PV4. */
void mucu_set_attn_pv4(int v);
/* k_attn_prefill's scores with 8 lanes a dot (1, the default) or 32 (0;
 * MUSER_CUDA_ATTN_SC; -1 reads the variable again). */
void mucu_set_attn_sc(int v);
/* The per-block pass of mucu_attention (its part / nbmax / final_out
 * contract, cuda_kernels.cu): writes the partials of every (row, head,
 * block), or the output when final_out (nbmax 1). Only launches, on
 * `stream` (a cudaStream_t). */
void mucu_attn_prefill(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                       float scale, const float *q, float *part, int64_t nbmax, float *final_out, void *stream);


#ifdef __cplusplus
}
#endif
#endif
