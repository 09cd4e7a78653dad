/* Attention driver of the CPU backend: split-K over whole 256-key blocks
 * (any thread may compute any block), then the canonical sequential merge
 * of the blocks in logical order per head (docs/numerics.md). */
#ifndef MUSER_CPU_ATTENTION_H
#define MUSER_CPU_ATTENTION_H
#include "backend/cpu/cpu_internal.h"

typedef struct cpu_attn_buffers {
    void *rows;            /* the rows of one dispatch (cpu_attention.c) */
    size_t rows_cap;       /* rows */
    float *parts;          /* block partials */
    size_t parts_cap;      /* floats */
    float *thread_scratch; /* n_threads * per-thread scratch */
    size_t scratch_cap;    /* floats */
} cpu_attn_buffers;

/* Every row of the batch: q and out are [rows][n_head][head_dim]. */
void cpu_attention_run(cpu_pool *pool, const cpu_kernels *k, cpu_attn_buffers *buf, const mu_attn_batch *ab,
                       const float *q, float *out);
void cpu_attn_buffers_free(cpu_attn_buffers *buf);

#endif
