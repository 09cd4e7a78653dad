/* The CPU backend's op drivers: pick the kernel table for the ISA level,
 * quantize activations once per matmul, and split every op across the
 * thread pool by output rows (matmul), query-head blocks (attention) or
 * element ranges (elementwise ops). Each output value is computed by one
 * task in the canonical order, so the bits never depend on the split. */
#include "backend/cpu/cpu_attention.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_repack.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct cpu_ctx {
    const cpu_kernels *k;
    cpu_pool *pool;
    pthread_mutex_t lock; /* one op at a time: sessions may share a model */
    void *act;            /* quantized activations (kernel's layout) */
    size_t act_cap;       /* bytes */
    cpu_attn_buffers attn;
} cpu_ctx;

/* ---------- ISA selection ---------- */

bool mu_cpu_isa_supported(mu_cpu_isa isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    switch (isa) {
    case MU_CPU_ISA_SCALAR:
        return true;
    case MU_CPU_ISA_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case MU_CPU_ISA_AVX512:
        return mu_cpu_isa_supported(MU_CPU_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
    }
    return false;
#else
    return isa == MU_CPU_ISA_SCALAR;
#endif
}

mu_cpu_isa mu_cpu_isa_best(void) {
    if (mu_cpu_isa_supported(MU_CPU_ISA_AVX512)) return MU_CPU_ISA_AVX512;
    if (mu_cpu_isa_supported(MU_CPU_ISA_AVX2)) return MU_CPU_ISA_AVX2;
    return MU_CPU_ISA_SCALAR;
}

const char *mu_cpu_isa_name(mu_cpu_isa isa) {
    switch (isa) {
    case MU_CPU_ISA_SCALAR: return "scalar";
    case MU_CPU_ISA_AVX2: return "avx2";
    case MU_CPU_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

mu_cpu_isa mu_cpu_isa_default(void) {
    mu_cpu_isa isa = mu_cpu_isa_best();
    const char *env = getenv("MUSER_CPU_ISA");
    if (env && *env) {
        mu_cpu_isa want = isa;
        if (!strcasecmp(env, "scalar")) want = MU_CPU_ISA_SCALAR;
        else if (!strcasecmp(env, "avx2")) want = MU_CPU_ISA_AVX2;
        else if (!strcasecmp(env, "avx512")) want = MU_CPU_ISA_AVX512;
        if (want < isa) isa = want;
    }
    return isa;
}

static const cpu_kernels *kernels_for(mu_cpu_isa isa) {
    switch (isa) {
    case MU_CPU_ISA_AVX512: return &mu_cpu_kernels_avx512;
    case MU_CPU_ISA_AVX2: return &mu_cpu_kernels_avx2;
    case MU_CPU_ISA_SCALAR: break;
    }
    return &mu_cpu_kernels_scalar;
}

/* ---------- helpers ---------- */

static cpu_ctx *ctx_of(mu_backend *b) { return b->ctx; }

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Elementwise work below this many values stays on the calling thread. */
#define PARALLEL_MIN_ELEMS 32768
#define ELEMWISE_CHUNK 8192
/* Matmuls below this many multiply-adds run as one task (dispatch would cost more). */
#define PARALLEL_MIN_MACS 65536
/* Activation values from which a quantization whose tasks may take any
 * rows is split over the pool (two rows of 3072). */
#define QUANT_SPLIT_MIN 6144

/* ---------- matmul ---------- */

typedef struct matmul_job {
    const cpu_kernels *k;
    const mu_weight *w;
    const float *x;
    void *act;
    float *y;
    int64_t rows, row_chunk, out_chunk;
} matmul_job;

static void quantize_task(void *arg, int64_t t, int thread) {
    (void)thread;
    matmul_job *j = arg;
    int64_t r0 = t * j->row_chunk, r1 = r0 + j->row_chunk < j->rows ? r0 + j->row_chunk : j->rows;
    j->k->quantize_rows(j->w, j->x, r0, r1, j->rows, j->act);
}

static void qmatmul_task(void *arg, int64_t t, int thread) {
    (void)thread;
    matmul_job *j = arg;
    int64_t o0 = t * j->out_chunk, o1 = o0 + j->out_chunk < j->w->n_out ? o0 + j->out_chunk : j->w->n_out;
    j->k->qmatmul(j->w, o0, o1, j->act, j->rows, j->y);
}

static void fmatmul_task(void *arg, int64_t t, int thread) {
    (void)thread;
    matmul_job *j = arg;
    int64_t o0 = t * j->out_chunk, o1 = o0 + j->out_chunk < j->w->n_out ? o0 + j->out_chunk : j->w->n_out;
    j->k->fmatmul(j->w, o0, o1, j->x, j->rows, j->y);
}

/* Activation rows that every packed kernel takes in one pass over the
 * weights (the X16 and X8 tile height): up to this many, a matmul is a
 * decode step's weight stream. */
#define ONE_PASS_ROWS 4

/* Output rows per task: multiples of 16 (the kernels' tile height), enough
 * tasks for load balance. Past one pass, few enough that a task's weight
 * rows stay in cache while every activation row passes over them; in one
 * pass, as long as a 1-row task: each task start waits for the memory
 * latency before its software prefetch runs ahead, and 64-row tasks made
 * the 4-row stream 10-20 % slower than 256-row ones (docs/benchmarks.md). */
static int64_t out_chunk_for(int64_t n_out, int64_t rows, int nt) {
    const bool one_pass = rows <= ONE_PASS_ROWS;
    int64_t per_thread_tasks = one_pass ? 8 : 4;
    int64_t c = ceil_div(n_out, (int64_t)nt * per_thread_tasks);
    int64_t cap = one_pass ? 256 : 64;
    if (c > cap) c = cap;
    return ceil_div(c < 16 ? 16 : c, 16) * 16;
}

static void *act_buffer(cpu_ctx *c, size_t bytes) {
    if (bytes > c->act_cap) {
        free(c->act);
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes) != 0) p = mu_xmalloc(bytes);
        c->act = p;
        c->act_cap = bytes;
    }
    return c->act;
}

/* Several matmuls of the same input rows, one dispatch: task t of the
 * dispatch is chunk t - first[i] of weight i. Weights whose activations
 * would be quantized alike (same kernels, type and mode) share one copy. */
#define MULTI_MAX 8

typedef struct multi_job {
    int n;
    matmul_job job[MULTI_MAX];
    int64_t first[MULTI_MAX + 1];
} multi_job;

static void multi_task(void *arg, int64_t t, int thread) {
    multi_job *m = arg;
    int i = 0;
    while (t >= m->first[i + 1]) i++;
    matmul_job *j = &m->job[i];
    if (j->act) qmatmul_task(j, t - m->first[i], thread);
    else fmatmul_task(j, t - m->first[i], thread);
}

/* (A kernel that writes the blocks only for one weight and side tables
 * for another quantizes them apart.) */
static bool same_activations(const matmul_job *a, const matmul_job *b) {
    return a->k == b->k && a->w->type == b->w->type && a->w->n_in == b->w->n_in &&
           a->w->input_scale_inv == b->w->input_scale_inv &&
           (!a->k->blocks_only || a->k->blocks_only(a->w, a->rows) == a->k->blocks_only(b->w, b->rows));
}

static void check_layout(const cpu_ctx *c, const mu_weight *w) {
    if (w->layout != MU_LAYOUT_ROWS && w->layout != c->k->pack_layout) {
        /* each ISA's kernels read their own packed layout only (cpu_repack.h) */
        fprintf(stderr, "muser: internal error: %s is repacked (layout %d) but the cpu backend runs %s\n",
                w->name ? w->name : "?", (int)w->layout, mu_cpu_isa_name(c->k->isa));
        abort();
    }
}

static void quantize_activations(cpu_ctx *c, matmul_job *j) {
    const int nt = cpu_pool_threads(c->pool);
    if (j->k->blocks_only && j->k->blocks_only(j->w, j->rows) && j->rows > 1 && j->rows * j->w->n_in >= QUANT_SPLIT_MIN) {
        /* any rows per task: a decode step's few rows on every thread */
        j->row_chunk = ceil_div(j->rows, 2 * (int64_t)nt);
        cpu_pool_run(c->pool, quantize_task, j, ceil_div(j->rows, j->row_chunk));
        return;
    }
    /* quantize tasks cover whole 16-row groups (the AVX-512 kernel
     * transposes each group's codes) */
    j->row_chunk = j->rows * j->w->n_in < PARALLEL_MIN_ELEMS ? j->rows : ceil_div(ceil_div(j->rows, 2 * (int64_t)nt), 16) * 16;
    cpu_pool_run(c->pool, quantize_task, j, ceil_div(j->rows, j->row_chunk));
}

static void cpu_matmul_multi(mu_backend *b, int n, const mu_weight *const *w, const float *x, float *const *y,
                             int64_t rows) {
    cpu_ctx *c = ctx_of(b);
    if (n > MULTI_MAX) {
        cpu_matmul_multi(b, MULTI_MAX, w, x, y, rows);
        cpu_matmul_multi(b, n - MULTI_MAX, w + MULTI_MAX, x, y + MULTI_MAX, rows);
        return;
    }
    pthread_mutex_lock(&c->lock);
    const int nt = cpu_pool_threads(c->pool);
    multi_job m = {.n = n};
    size_t act_bytes[MULTI_MAX] = {0}, total = 0;
    int owner[MULTI_MAX]; /* the job whose activations job i reads */
    for (int i = 0; i < n; i++) {
        matmul_job *j = &m.job[i];
        *j = (matmul_job){.k = c->k, .w = w[i], .x = x, .y = y[i], .rows = rows};
        check_layout(c, w[i]);
        const bool small = (double)rows * (double)w[i]->n_out * (double)w[i]->n_in < PARALLEL_MIN_MACS;
        j->out_chunk = small ? w[i]->n_out : out_chunk_for(w[i]->n_out, rows, nt);
        m.first[i + 1] = m.first[i] + ceil_div(w[i]->n_out, j->out_chunk);
        owner[i] = -1;
        if (mu_weight_uses_q8k(w[i], NULL)) {
            if (!c->k->q_supported(w[i])) j->k = &mu_cpu_kernels_scalar;
            owner[i] = i;
            for (int p = 0; p < i; p++)
                if (owner[p] == p && same_activations(&m.job[p], j)) owner[i] = p;
            if (owner[i] == i) {
                act_bytes[i] = (j->k->act_bytes(w[i], rows) + 63) & ~(size_t)63;
                total += act_bytes[i];
            }
        } else if (!mu_type_get(w[i]->type)->is_float) {
            j->k = &mu_cpu_kernels_scalar; /* the native NVFP4 W4A4 mode */
        }
    }
    uint8_t *act = total ? act_buffer(c, total) : NULL;
    for (int i = 0; i < n; i++) {
        if (owner[i] != i) continue;
        m.job[i].act = act;
        act += act_bytes[i];
        quantize_activations(c, &m.job[i]);
    }
    for (int i = 0; i < n; i++)
        if (owner[i] >= 0) m.job[i].act = m.job[owner[i]].act;
    cpu_pool_run(c->pool, multi_task, &m, m.first[n]);
    pthread_mutex_unlock(&c->lock);
}

static void cpu_matmul(mu_backend *b, const mu_weight *w, const float *x, float *y, int64_t rows) {
    cpu_matmul_multi(b, 1, &w, x, &y, rows);
}

/* ---------- row ops: rmsnorm, rope ---------- */

typedef struct rows_job {
    const cpu_kernels *k;
    const float *x, *w, *cs;
    float *y;
    float eps;
    int64_t n, rows, chunk, n_heads, head_dim, n_rot;
} rows_job;

static void rmsnorm_task(void *arg, int64_t t, int thread) {
    (void)thread;
    rows_job *j = arg;
    int64_t r1 = (t + 1) * j->chunk < j->rows ? (t + 1) * j->chunk : j->rows;
    for (int64_t r = t * j->chunk; r < r1; r++) j->k->rmsnorm_row(j->x + r * j->n, j->w, j->eps, j->y + r * j->n, j->n);
}

static void rope_task(void *arg, int64_t t, int thread) {
    (void)thread;
    rows_job *j = arg;
    int64_t r1 = (t + 1) * j->chunk < j->rows ? (t + 1) * j->chunk : j->rows;
    const int64_t stride = j->n_heads * j->head_dim;
    for (int64_t r = t * j->chunk; r < r1; r++)
        j->k->rope_row(j->y + r * stride, j->n_heads, j->head_dim, j->n_rot, j->cs + r * j->n_rot);
}

static void run_rows(cpu_ctx *c, cpu_task_fn fn, rows_job *j, int64_t elems_per_row) {
    const int nt = cpu_pool_threads(c->pool);
    if (j->rows * elems_per_row < PARALLEL_MIN_ELEMS || nt == 1) {
        j->chunk = j->rows;
        fn(j, 0, 0);
        return;
    }
    j->chunk = ceil_div(j->rows, 4 * (int64_t)nt);
    cpu_pool_run(c->pool, fn, j, ceil_div(j->rows, j->chunk));
}

static void cpu_rmsnorm(mu_backend *b, const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows) {
    cpu_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    rows_job j = {.k = c->k, .x = x, .w = w, .eps = eps, .y = y, .n = n, .rows = rows};
    run_rows(c, rmsnorm_task, &j, n);
    pthread_mutex_unlock(&c->lock);
}

static void cpu_rope(mu_backend *b, float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs,
                     int64_t rows, bool neox) {
    if (neox) { /* the DFlash assistant's few rows: the shared scalar rotation */
        mu_host_rope_neox(x, n_heads, head_dim, n_rot, cs, rows);
        return;
    }
    cpu_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    rows_job j = {.k = c->k, .y = x, .cs = cs, .rows = rows, .n_heads = n_heads, .head_dim = head_dim, .n_rot = n_rot};
    run_rows(c, rope_task, &j, n_heads * n_rot);
    pthread_mutex_unlock(&c->lock);
}

/* ---------- the sandwich residual, fused ---------- */

typedef struct residual_job {
    const cpu_kernels *k;
    float *x, *o, *h, *cap;
    const float *w_o, *w_h;
    float eps_o, eps_h;
    int64_t n, rows, chunk, cap_stride;
} residual_job;

/* Per row, the ops the forward would run one by one over all rows (the
 * same kernels, so the same bits): o = rmsnorm(o) * w_o (not without w_o);
 * x += o (and its copy into the capture row); h = rmsnorm(x) * w_h. */
static void residual_task(void *arg, int64_t t, int thread) {
    (void)thread;
    const residual_job *j = arg;
    const int64_t r1 = (t + 1) * j->chunk < j->rows ? (t + 1) * j->chunk : j->rows;
    for (int64_t r = t * j->chunk; r < r1; r++) {
        float *x = j->x + r * j->n, *o = j->o + r * j->n;
        if (j->w_o) j->k->rmsnorm_row(o, j->w_o, j->eps_o, o, j->n);
        j->k->add(x, o, j->n);
        if (j->cap) memcpy(j->cap + r * j->cap_stride, x, (size_t)j->n * sizeof *x);
        if (j->h) j->k->rmsnorm_row(x, j->w_h, j->eps_h, j->h + r * j->n, j->n);
    }
}

/* Rows split over the pool from two rows on: a decode step of a few
 * sequences has a few rows of n_embd each. */
static void cpu_residual_capture(mu_backend *b, float *x, float *o, const float *w_o, float eps_o, float *h,
                                 const float *w_h, float eps_h, int64_t n, int64_t rows, float *cap,
                                 int64_t cap_stride) {
    cpu_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    residual_job j = {.k = c->k, .x = x, .o = o, .h = h, .w_o = w_o, .w_h = w_h, .eps_o = eps_o, .eps_h = eps_h,
                      .n = n, .rows = rows, .cap = cap, .cap_stride = cap_stride};
    const int nt = cpu_pool_threads(c->pool);
    if (rows == 1 || nt == 1) {
        j.chunk = rows;
        residual_task(&j, 0, 0);
    } else {
        j.chunk = ceil_div(rows, 4 * (int64_t)nt);
        cpu_pool_run(c->pool, residual_task, &j, ceil_div(rows, j.chunk));
    }
    pthread_mutex_unlock(&c->lock);
}

static void cpu_residual(mu_backend *b, float *x, float *o, const float *w_o, float eps_o, float *h, const float *w_h,
                         float eps_h, int64_t n, int64_t rows) {
    cpu_residual_capture(b, x, o, w_o, eps_o, h, w_h, eps_h, n, rows, NULL, 0);
}

/* ---------- elementwise ---------- */

typedef enum { EW_GATE, EW_SWIGLU, EW_ADD, EW_TAIL } ew_kind;

typedef struct ew_job {
    const cpu_kernels *k;
    ew_kind kind;
    float *x;
    const float *y;
    float scale, cap;
    int64_t n;
} ew_job;

static void ew_apply(const ew_job *j, int64_t i0, int64_t i1) {
    float *x = j->x + i0;
    const float *y = j->y ? j->y + i0 : NULL;
    int64_t n = i1 - i0;
    switch (j->kind) {
    case EW_GATE: j->k->sigmoid_gate(x, y, n); break;
    case EW_SWIGLU: j->k->swiglu(x, y, n); break;
    case EW_ADD: j->k->add(x, y, n); break;
    case EW_TAIL: j->k->logit_tail(x, j->scale, j->cap, n); break;
    }
}

static void ew_task(void *arg, int64_t t, int thread) {
    (void)thread;
    ew_job *j = arg;
    int64_t i0 = t * ELEMWISE_CHUNK, i1 = i0 + ELEMWISE_CHUNK < j->n ? i0 + ELEMWISE_CHUNK : j->n;
    ew_apply(j, i0, i1);
}

static void run_elementwise(mu_backend *b, ew_job *j) {
    cpu_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    j->k = c->k;
    if (j->n < PARALLEL_MIN_ELEMS || cpu_pool_threads(c->pool) == 1) ew_apply(j, 0, j->n);
    else cpu_pool_run(c->pool, ew_task, j, ceil_div(j->n, ELEMWISE_CHUNK));
    pthread_mutex_unlock(&c->lock);
}

static void cpu_sigmoid_gate(mu_backend *b, float *x, const float *g, int64_t n) {
    run_elementwise(b, &(ew_job){.kind = EW_GATE, .x = x, .y = g, .n = n});
}

static void cpu_swiglu(mu_backend *b, float *gate, const float *up, int64_t n) {
    run_elementwise(b, &(ew_job){.kind = EW_SWIGLU, .x = gate, .y = up, .n = n});
}

static void cpu_add(mu_backend *b, float *x, const float *y, int64_t n) {
    run_elementwise(b, &(ew_job){.kind = EW_ADD, .x = x, .y = y, .n = n});
}

static void cpu_logit_tail(mu_backend *b, float *l, float scale, float cap, int64_t n) {
    run_elementwise(b, &(ew_job){.kind = EW_TAIL, .x = l, .scale = scale, .cap = cap, .n = n});
}

/* ---------- attention ---------- */

static void cpu_attention(mu_backend *b, const mu_attn_batch *ab, const float *q, float *out) {
    cpu_ctx *c = ctx_of(b);
    pthread_mutex_lock(&c->lock);
    cpu_attention_run(c->pool, c->k, &c->attn, ab, q, out);
    pthread_mutex_unlock(&c->lock);
}

/* ---------- KV store ---------- */

/* K and V rows rounded to f16 (the host op's formula, a vector at a time);
 * a decode step stores a few rows, so on the calling thread. */
static void cpu_kv_store(mu_backend *b, int64_t rows, const mu_kv_dst *dst, const float *k, const float *v) {
    cpu_ctx *c = ctx_of(b);
    mu_host_kv_save(rows, dst);
    for (int64_t r = 0; r < rows; r++) {
        const mu_kv_layer *l = dst[r].l;
        const int64_t D = l->head_dim, H = l->n_head;
        for (int64_t h = 0; h < H; h++) {
            const int64_t at = (h * l->cap + dst[r].physical) * D, from = (r * H + h) * D;
            c->k->f16_row(l->k + at, k + from, D);
            c->k->f16_row(l->v + at, v + from, D);
        }
    }
}

/* ---------- load-time repack ---------- */

/* An on/off override from the environment: 1 or 0, -1 when unset (or
 * anything else). */
static int env_switch(const char *name) {
    const char *env = getenv(name);
    if (env && !strcmp(env, "0")) return 0;
    if (env && !strcmp(env, "1")) return 1;
    return -1;
}

/* MUSER_CPU_REPACK=1 / 0 forces the load-time repack (X16 with AVX-512,
 * X8 with AVX2) on / off; it is on by default (with the X16 kernel's weight
 * prefetch, X16 decode is 8-30 % faster on an Intel Xeon too:
 * docs/benchmarks.md, Intel host). */
static bool repack_enabled(void) {
    const int forced = env_switch("MUSER_CPU_REPACK");
    return forced != 0;
}

static bool cpu_wants_repack(mu_backend *b, const mu_weight *w) {
    const cpu_kernels *k = ctx_of(b)->k;
    return k->pack_layout != MU_LAYOUT_ROWS && repack_enabled() && mu_cpu_pack_eligible(w, mu_cpu_pack_width(k->pack_layout));
}

/* MUSER_CPU_HUGEPAGES=1 / 0 forces the resident huge-page copy of the
 * weights (gguf_make_resident) on / off. By default it is on wherever the
 * kernel offers transparent huge pages to madvise: the hardware prefetchers
 * stop at every 4 KiB page and each page costs a TLB walk (a nested one in
 * a VM), so a stream of 2 MiB pages reads faster (docs/benchmarks.md). */
static bool hugepages_enabled(void) {
    const int forced = env_switch("MUSER_CPU_HUGEPAGES");
    if (forced >= 0) return forced;
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char line[128] = {0};
    const bool ok = fgets(line, sizeof line, f) && !strstr(line, "[never]");
    fclose(f);
    return ok;
}

static bool cpu_wants_resident(mu_backend *b) {
    (void)b;
    return hugepages_enabled();
}

typedef struct repack_job {
    const mu_weight *w;
    uint8_t *data;
    int width;
    int64_t groups, per_task;
} repack_job;

static void repack_task(void *arg, int64_t t, int thread) {
    (void)thread;
    const repack_job *j = arg;
    const int64_t g0 = t * j->per_task, g1 = g0 + j->per_task < j->groups ? g0 + j->per_task : j->groups;
    const uint64_t group_bytes = (uint64_t)j->width * j->w->row_bytes;
#ifdef MADV_POPULATE_WRITE
    /* Take this range's private page copies in one call (the pages are a
     * private file mapping made writable): one copy per page instead of a
     * read fault, a write fault and a TLB shootdown each. Optional. */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)(j->data + (uint64_t)g0 * group_bytes) + page - 1) & ~(page - 1);
    const uintptr_t e = (uintptr_t)(j->data + (uint64_t)g1 * group_bytes) & ~(page - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#endif
    mu_cpu_pack_groups(j->w, j->data, j->width, g0, g1);
}

/* In place, split over the pool: on a VM that backs fresh pages lazily the
 * page copies dominate (about 2 s per GB on one thread here) and they
 * scale with threads. */
static void cpu_repack(mu_backend *b, mu_weight *w, uint8_t *data) {
    cpu_ctx *c = ctx_of(b);
    const int width = mu_cpu_pack_width(c->k->pack_layout);
    /* the caller asked wants_repack; packing anything else would corrupt it */
    if (c->k->pack_layout == MU_LAYOUT_ROWS || !mu_cpu_pack_eligible(w, width)) return;
    repack_job j = {.w = w, .data = data, .width = width, .groups = mu_cpu_pack_rows(w, width) / width};
    j.per_task = ceil_div(1 << 20, (int64_t)((uint64_t)width * w->row_bytes)); /* about 1 MiB per task */
    pthread_mutex_lock(&c->lock);
    cpu_pool_run(c->pool, repack_task, &j, ceil_div(j.groups, j.per_task));
    pthread_mutex_unlock(&c->lock);
    w->layout = c->k->pack_layout;
}

/* ---------- lifetime ---------- */

static void cpu_destroy(mu_backend *b) {
    if (!b) return;
    cpu_ctx *c = ctx_of(b);
    cpu_pool_destroy(c->pool);
    pthread_mutex_destroy(&c->lock);
    free(c->act);
    cpu_attn_buffers_free(&c->attn);
    free(c);
    free(b);
}

/* backend.h qk_norm_rope_heads as the ops it stands for (the same calls a
 * backend without it gets from src/spec/dflash_forward.c): here so that
 * the assistant's fused call is made, and checked, on the cpu too. */
static void cpu_qk_norm_rope_heads(mu_backend *b, float *q, const float *wq, int64_t nq, float *k, const float *wk,
                                   int64_t nk, int64_t head_dim, float eps, const float *cs, int64_t n_rot,
                                   int64_t rows, bool neox, float *kd, float *vd, const int64_t *slots, int64_t S,
                                   const float *v) {
    if (nq) {
        b->rmsnorm(b, q, wq, eps, q, head_dim, rows * nq);
        if (cs) b->rope(b, q, nq, head_dim, n_rot, cs, rows, neox);
    }
    b->rmsnorm(b, k, wk, eps, k, head_dim, rows * nk);
    if (cs) b->rope(b, k, nk, head_dim, n_rot, cs, rows, neox);
    b->store_kv_heads(b, kd, vd, slots, S, head_dim, nk, k, v, rows);
}

mu_backend *mu_backend_cpu_create_isa(int n_threads, mu_cpu_isa isa) {
    if (!mu_cpu_isa_supported(isa)) return NULL;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    cpu_ctx *c = mu_xcalloc(1, sizeof *c);
    c->k = kernels_for(isa);
    c->pool = cpu_pool_create(n_threads);
    pthread_mutex_init(&c->lock, NULL);
    mu_backend *b = mu_xcalloc(1, sizeof *b);
    b->name = "cpu";
    b->ctx = c;
    b->n_threads = cpu_pool_threads(c->pool);
    b->destroy = cpu_destroy;
    mu_backend_set_host_ops(b);
    b->matmul = cpu_matmul;
    b->matmul_multi = cpu_matmul_multi;
    b->rmsnorm = cpu_rmsnorm;
    b->residual = cpu_residual;
    b->residual_capture = cpu_residual_capture;
    b->rope = cpu_rope;
    b->attention = cpu_attention;
    b->trees = true;
    b->kv_store = cpu_kv_store;
    b->sigmoid_gate = cpu_sigmoid_gate;
    b->swiglu = cpu_swiglu;
    b->add = cpu_add;
    b->logit_tail = cpu_logit_tail;
    b->qk_norm_rope_heads = cpu_qk_norm_rope_heads;
    b->wants_resident = cpu_wants_resident;
    b->wants_repack = cpu_wants_repack;
    b->repack = cpu_repack;
    return b;
}

mu_backend *mu_backend_cpu_create(int n_threads) {
    return mu_backend_cpu_create_isa(n_threads, mu_cpu_isa_default());
}

mu_cpu_isa mu_backend_cpu_isa(const mu_backend *b) { return ((const cpu_ctx *)b->ctx)->k->isa; }
