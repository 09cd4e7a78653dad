/* Internals shared by synth and quantize: the type/mix rules, the output
 * tensor plan, and the parallel pwrite() job runner with its progress bar. */
#ifndef MUSER_TOOLS_INTERNAL_H
#define MUSER_TOOLS_INTERNAL_H
#include "gguf/gguf.h"
#include "quant/quant.h"

/* ---- target type or mix ---- */
typedef enum mu_target_kind {
    MU_TARGET_SINGLE,      /* one type for every 2-D tensor */
    MU_TARGET_Q4_K_XL,
    MU_TARGET_NVFP4,       /* native: payload + .nvfp4_scale + .nvfp4_scale2 */
    MU_TARGET_NVFP4_GGML,  /* type 40 + .scale */
} mu_target_kind;

typedef struct mu_target {
    mu_target_kind kind;
    uint32_t type;         /* MU_TARGET_SINGLE only */
    const char *name;      /* canonical spelling */
} mu_target;

bool mu_target_parse(const char *s, mu_target *t, mu_error *err);
/* Type of the 2-D tensor `name` under the target. */
uint32_t mu_target_weight_type(const mu_target *t, const char *name);
/* llama_ftype value for general.file_type. */
uint32_t mu_target_file_type(const mu_target *t);
/* Value of muser.weight_precision, or NULL when the key must be absent. */
const char *mu_target_precision(const mu_target *t);

/* ---- output plan ---- */
typedef enum mu_out_kind {
    MU_OUT_VECTOR,       /* 1-D F32 */
    MU_OUT_MATRIX,       /* payload only (float or block type, incl. type 40) */
    MU_OUT_NVFP4,        /* native payload; scales go to `companion` */
    MU_OUT_SCALES,       /* .nvfp4_scale, filled by its payload's jobs */
    MU_OUT_SCALAR,       /* one F32 written after the jobs (.nvfp4_scale2, .scale) */
} mu_out_kind;

typedef struct mu_out_tensor {
    char *name;
    mu_out_kind kind;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[2];
    uint64_t n_in, n_rows;      /* row view: ne[0] values per row, ne[1] rows */
    uint64_t row_bytes;         /* payload bytes per row */
    int64_t companion;          /* MU_OUT_NVFP4: its scales; else -1 */
    int64_t scalar;             /* plan index of the F32 scalar companion, or -1 */
    float scalar_value;         /* MU_OUT_SCALAR: the value written */
    int64_t writer_idx;
    /* Filled by the producer (synth: std dev; quantize: source tensor). */
    float std;                  /* synth: weight std dev; vectors: noise std dev */
    float mean;                 /* synth vectors: mean value */
    int64_t src;                /* quantize: source tensor index */
} mu_out_tensor;

typedef struct mu_plan {
    mu_out_tensor *t;
    int64_t n, cap;
} mu_plan;

void mu_plan_free(mu_plan *p);
/* Add a 1-D F32 tensor. Returns its index. */
int64_t mu_plan_add_vector(mu_plan *p, const char *name, uint64_t n);
/* Add a 2-D weight [n_in, n_rows] of the target's type for `name`, plus the
 * companions that type needs. Fails when n_in is not a whole number of
 * blocks. Returns the payload's index or -1. */
int64_t mu_plan_add_weight(mu_plan *p, const mu_target *t, const char *name,
                           uint64_t n_in, uint64_t n_rows, mu_error *err);
/* Register every planned tensor with the writer (in plan order). */
void mu_plan_add_to_writer(mu_plan *p, gguf_writer *w);
/* Sum of payload bytes. */
uint64_t mu_plan_bytes(const mu_plan *p);

/* ---- jobs: one tensor, a range of rows ---- */
typedef struct mu_job {
    int64_t tensor;             /* plan index */
    uint64_t row0, row1;
    uint64_t bytes;             /* for progress */
} mu_job;

/* Jobs over every tensor for which want(tensor) holds, in plan order, about
 * `chunk_bytes` of payload each. Caller frees. */
mu_job *mu_plan_jobs(const mu_plan *p, bool (*want)(const mu_out_tensor *t),
                     uint64_t chunk_bytes, size_t *n_jobs, uint64_t *total_bytes);

typedef bool (*mu_job_fn)(void *ctx, const mu_job *job, mu_error *err);

/* Run jobs on n_threads workers (0 = all cores); the first failure stops
 * the rest and is returned. label/total_bytes drive the progress bar. */
bool mu_run_jobs(const mu_job *jobs, size_t n_jobs, int n_threads, mu_job_fn fn,
                 void *ctx, bool progress, const char *label, uint64_t total_bytes,
                 mu_error *err);
int mu_tools_thread_count(int requested);

/* pwrite the whole buffer (retrying short writes) or fail naming `what`. */
bool mu_pwrite_all(int fd, const void *buf, uint64_t n, uint64_t offset,
                   const char *what, mu_error *err);
/* Write the plan's scalar companions. */
bool mu_plan_write_scalars(const mu_plan *p, gguf_writer *w, const char *path, mu_error *err);

/* ---- small numerics ---- */
/* Square root for positive finite x (Newton; only used to pick scales). */
double mu_tools_sqrt(double x);
/* E4M3FN decode for finite codes (local, used to size random scales). */
double mu_tools_e4m3_value(uint8_t b);

/* Counter-based generator: u64 number `i` of the stream `key`. */
static inline uint64_t mu_mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}
static inline uint64_t mu_stream_u64(uint64_t key, uint64_t i) {
    return mu_mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
}
uint64_t mu_hash_str(const char *s);

#endif
