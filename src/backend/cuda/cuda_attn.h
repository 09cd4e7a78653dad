/* Decode attention of the cuda backend (cuda_attn.cu), as plain C: the
 * per-block pass for calls of a few rows (k_attn_dec: a CTA per (row, KV
 * head, 256-key block, group of query heads), the K block staged once for
 * the group) and the in-order merge of the blocks with its running maximum
 * computed by a scan (k_attn_merge_scan). Same partials contract as
 * mucu_attention (cuda_kernels.cu), same bits as the reference
 * (docs/numerics.md, "Attention"). Pointers are device memory. Only
 * launches, on `stream` (a cudaStream_t); the caller checks the launch. */
#ifndef MUSER_CUDA_ATTN_H
#define MUSER_CUDA_ATTN_H
#include "backend/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Query heads per k_attn_dec CTA: 0 (the default) by the grid's size
 * (mucu_attn_dec), or 1, 2, 4, 8, 16 forced (tests, benchmarks; from
 * MUSER_CUDA_ATTN_HG when first read). -1 until first read. */
extern int mucu_attn_dec_hg;
/* 1: k_attn_dec stages the K of keys written by earlier steps before its
 * grid_dep_wait (from MUSER_CUDA_ATTN_KST when first read; default 1). */
extern int mucu_attn_dec_kst;
/* N > 0: calls that write per-block partials over N or more 256-key blocks
 * take k_attn_dcl, a cluster of 8 CTAs per block (from MUSER_CUDA_ATTN_CL
 * when first read; default 0: never). */
extern int mucu_attn_dec_cl;
/* N > 0: calls of at most mucu_attn_dec_fl_rows rows that write per-block
 * partials over N or more (row, KV head, 256-key block) units take
 * k_attn_dfl, one CTA per SM walking the units, before the cluster kernel
 * (from MUSER_CUDA_ATTN_FL and MUSER_CUDA_ATTN_FL_ROWS when first read;
 * defaults 96 and 8). */
extern int mucu_attn_dec_fl, mucu_attn_dec_fl_rows;
/* Does mucu_attention take k_attn_dec for this call (mucu_attn_kernel 1
 * below 64 rows, or 3)? head_dim 64, 128 or 256, whole GQA groups. */
bool mucu_attn_dec_takes(int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim);
/* With gate and final_out (one block): out = attention * sigmoid(gate),
 * and with q8 its Q8_K quantization (split layout over rows * n_head *
 * head_dim values), where the head group allows (whole Q8_K blocks per
 * CTA); true when it did. */
bool mucu_attn_dec(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                   float scale, const float *q, float *part, int64_t nbmax, float *final_out, const float *gate,
                   void *q8, void *stream);
/* Benchmarks only: 1 launches only the per-block pass of mucu_attention,
 * 2 only the merge (over the partials an earlier call left); 0 both. */
extern int mucu_attn_bench_pass;
/* Does the merge take k_attn_merge_scan (every kernel choice but 0 and 4)? */
bool mucu_attn_merge_scan_takes(int64_t head_dim, int64_t nbmax);
/* With gate: gated (and quantized into q8) as mucu_attn_dec, where 256 /
 * head_dim heads fit a CTA; true when it did. */
bool mucu_attn_merge_scan(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t head_dim,
                          const float *part, int64_t nbmax, float *out, const float *gate, void *q8, void *stream);

#ifdef __cplusplus
}
#endif
#endif
