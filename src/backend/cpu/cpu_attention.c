/* Attention for one query row: phase 1 computes every (KV head, 256-key
 * block) partial (m_b, l_b, acc_b) for all query heads of the group, each
 * K/V row read once for the whole group; phase 2 merges the blocks of each
 * head in logical order with the ref's formulas:
 *   M' = max(M, m_b); ca = expf(M - M'); cb = expf(m_b - M')
 *   L = L*ca + l_b*cb; A = A*ca + acc_b*cb; out = A / L                   */
#include "backend/cpu/cpu_attention.h"
#include "util/mumath.h"
#include <stdlib.h>

typedef struct attn_ctx {
    const cpu_kernels *k;
    cpu_attn_job job;
    int64_t n_blocks, part_floats, scratch_floats;
    int64_t slices, per_slice; /* each group's heads in `slices` runs of per_slice */
    float *parts, *scratch, *out;
} attn_ctx;

static int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

static cpu_attn_part part_at(const attn_ctx *c, int64_t kvh, int64_t blk) {
    float *p = c->parts + (kvh * c->n_blocks + blk) * c->part_floats;
    int64_t G = c->job.group;
    return (cpu_attn_part){.m = p, .l = p + G, .acc = p + round16(2 * G)};
}

/* Task t: block blk of KV head kvh for one slice of its group's heads.
 * Blocks are the outer index, KV heads inner. Each head's plane is its own
 * contiguous range (kv.h), so either order streams; this one measured
 * faster with two threads at 64k (49-50 against 55-56 ns per key and KV
 * head, head-outer), about even at one thread. */
static void block_task(void *arg, int64_t t, int thread) {
    attn_ctx *c = arg;
    const int64_t n_kv = c->job.a->n_head_kv;
    const int64_t kvh = t % n_kv, slice = t / n_kv % c->slices, blk = t / n_kv / c->slices;
    int64_t start = c->job.first + blk * CPU_ATTN_BLOCK, end = start + CPU_ATTN_BLOCK - 1;
    if (end > c->job.a->pos) end = c->job.a->pos;
    cpu_attn_job job = c->job;
    job.g0 = slice * c->per_slice;
    job.n_g = job.group - job.g0 < c->per_slice ? job.group - job.g0 : c->per_slice;
    cpu_attn_part part = part_at(c, kvh, blk);
    part.m += job.g0;
    part.l += job.g0;
    part.acc += job.g0 * job.a->head_dim;
    c->k->attn_block(&job, kvh, start, end, &part, c->scratch + thread * c->scratch_floats);
}

static void merge_task(void *arg, int64_t h, int thread) {
    (void)thread;
    attn_ctx *c = arg;
    const int64_t G = c->job.group, D = c->job.a->head_dim, kvh = h / G, g = h % G;
    float *out = c->out + h * D;
    cpu_attn_part p = part_at(c, kvh, 0);
    float M = p.m[g], L = p.l[g];
    memcpy(out, p.acc + g * D, (size_t)D * sizeof(float));
    for (int64_t blk = 1; blk < c->n_blocks; blk++) {
        p = part_at(c, kvh, blk);
        float m_b = p.m[g];
        float M2 = m_b > M ? m_b : M;
        float ca = mu_expf(M - M2), cb = mu_expf(m_b - M2);
        L = L * ca + p.l[g] * cb;
        c->k->scale_add2(out, p.acc + g * D, ca, cb, D);
        M = M2;
    }
    c->k->div_scalar(out, L, D);
}

static void *grow(float *p, size_t *cap, size_t need) {
    if (need <= *cap) return p;
    free(p);
    void *q = NULL;
    if (posix_memalign(&q, 64, need * sizeof(float)) != 0) q = mu_xmalloc(need * sizeof(float));
    *cap = need;
    return q;
}

void cpu_attention_run(cpu_pool *pool, const cpu_kernels *k, cpu_attn_buffers *buf, const mu_attn_args *a,
                       const float *q, float *out) {
    attn_ctx c = {.k = k, .out = out};
    c.job.a = a;
    c.job.q = q;
    c.job.group = a->n_head / a->n_head_kv;
    c.job.n_g = c.job.group; /* g0 = 0: the whole group */
    c.job.first = mu_kv_first(a->kv);
    if (a->window > 0 && a->pos - a->window + 1 > c.job.first) c.job.first = a->pos - a->window + 1;
    const int64_t G = c.job.group, D = a->head_dim;
    c.n_blocks = (a->pos - c.job.first) / CPU_ATTN_BLOCK + 1;
    c.part_floats = round16(2 * G) + round16(G * D);
    c.scratch_floats = round16(CPU_ATTN_SCRATCH(D, G));
    const int nt = cpu_pool_threads(pool);
    buf->parts = grow(buf->parts, &buf->parts_cap, (size_t)(a->n_head_kv * c.n_blocks * c.part_floats));
    buf->thread_scratch = grow(buf->thread_scratch, &buf->scratch_cap, (size_t)(nt * c.scratch_floats));
    c.parts = buf->parts;
    c.scratch = buf->thread_scratch;
    /* Fewer (KV head, block) pairs than threads (short contexts, prefill's
     * early rows): split each group's query heads too. Every head is still
     * computed whole by one task; K/V rows are then read once per slice. */
    c.slices = 1;
    const int64_t pairs = a->n_head_kv * c.n_blocks;
    if (pairs < nt) c.slices = (nt + pairs - 1) / pairs < G ? (nt + pairs - 1) / pairs : G;
    c.per_slice = (G + c.slices - 1) / c.slices;
    c.slices = (G + c.per_slice - 1) / c.per_slice;
    cpu_pool_run(pool, block_task, &c, pairs * c.slices);
    if (c.n_blocks > 2) {
        cpu_pool_run(pool, merge_task, &c, a->n_head);
    } else {
        for (int64_t h = 0; h < a->n_head; h++) merge_task(&c, h, 0);
    }
}

void cpu_attn_buffers_free(cpu_attn_buffers *buf) {
    free(buf->parts);
    free(buf->thread_scratch);
    memset(buf, 0, sizeof *buf);
}
