/* Attention for a batch of query rows: phase 1 computes every (row, KV
 * head, 256-key block) partial (m_b, l_b, acc_b) for all query heads of
 * the group, each K/V row read once for the whole group; phase 2 merges
 * the blocks of each (row, head) in logical order with the ref's formulas:
 *   M' = max(M, m_b); ca = expf(M - M'); cb = expf(m_b - M')
 *   L = L*ca + l_b*cb; A = A*ca + acc_b*cb; out = A / L
 * The rows of a batch share one dispatch per phase (a step of N decode
 * rows would otherwise wait for N short dispatches per layer); a row with
 * a single block finishes inside its phase-1 task (out = acc / l, which is
 * the merge of one block). Every (row, head) is computed whole by one task,
 * so the bits depend neither on the split nor on the rows around it. */
#include "backend/cpu/cpu_attention.h"
#include "util/mumath.h"
#include <stdlib.h>

/* One query row of the batch. */
typedef struct attn_row {
    mu_attn_args a;
    cpu_attn_job job;
    const float *q;
    float *out, *parts;
    int64_t n_blocks;
    int64_t slices, per_slice; /* each group's heads in `slices` runs of per_slice */
    int64_t task0;             /* its first phase-1 task */
    int64_t merge0;            /* its first merge task (rows with 2 or more blocks) */
} attn_row;

typedef struct attn_ctx {
    const cpu_kernels *k;
    attn_row *rows;
    int64_t n_rows, part_floats, scratch_floats, group;
    float *scratch;
} attn_ctx;

static int64_t round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* The partial of (KV head, block) of a row: m and l of the group, then acc. */
static cpu_attn_part part_at(const attn_ctx *c, const attn_row *r, int64_t kvh, int64_t blk) {
    float *p = r->parts + (kvh * r->n_blocks + blk) * c->part_floats;
    const int64_t G = c->group;
    return (cpu_attn_part){.m = p, .l = p + G, .acc = p + round16(2 * G)};
}

/* The row whose tasks (phase 1, or merge) include t: the last row whose
 * first task is at most t (first tasks ascend with the row). */
static int64_t row_of(const attn_ctx *c, int64_t t, bool merge) {
    int64_t lo = 0, hi = c->n_rows - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if ((merge ? c->rows[mid].merge0 : c->rows[mid].task0) <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Task t: block blk of KV head kvh of one row, for one slice of its
 * group's heads. Within a row, blocks are the outer index, KV heads inner.
 * Each head's plane is its own contiguous range (kv.h), so either order
 * streams; this one measured faster with two threads at 64k (49-50 against
 * 55-56 ns per key and KV head, head-outer), about even at one thread. */
static void block_task(void *arg, int64_t t, int thread) {
    attn_ctx *c = arg;
    const attn_row *r = &c->rows[row_of(c, t, false)];
    t -= r->task0;
    const int64_t n_kv = r->a.n_head_kv;
    const int64_t kvh = t % n_kv, slice = t / n_kv % r->slices, blk = t / n_kv / r->slices;
    int64_t start = r->job.first + blk * CPU_ATTN_BLOCK, end = start + CPU_ATTN_BLOCK - 1;
    if (end > r->a.pos) end = r->a.pos;
    cpu_attn_job job = r->job;
    job.g0 = slice * r->per_slice;
    job.n_g = job.group - job.g0 < r->per_slice ? job.group - job.g0 : r->per_slice;
    cpu_attn_part part = part_at(c, r, kvh, blk);
    part.m += job.g0;
    part.l += job.g0;
    part.acc += job.g0 * r->a.head_dim;
    c->k->attn_block(&job, kvh, start, end, &part, c->scratch + thread * c->scratch_floats);
    if (r->n_blocks == 1) { /* the merge of one block: out = acc / l */
        const int64_t D = r->a.head_dim;
        for (int64_t g = 0; g < job.n_g; g++) {
            float *out = r->out + (kvh * job.group + job.g0 + g) * D;
            memcpy(out, part.acc + g * D, (size_t)D * sizeof(float));
            c->k->div_scalar(out, part.l[g], D);
        }
    }
}

static void merge_head(const attn_ctx *c, const attn_row *r, int64_t h) {
    const int64_t G = c->group, D = r->a.head_dim, kvh = h / G, g = h % G;
    float *out = r->out + h * D;
    cpu_attn_part p = part_at(c, r, kvh, 0);
    float M = p.m[g], L = p.l[g];
    memcpy(out, p.acc + g * D, (size_t)D * sizeof(float));
    for (int64_t blk = 1; blk < r->n_blocks; blk++) {
        p = part_at(c, r, kvh, blk);
        float m_b = p.m[g];
        float M2 = m_b > M ? m_b : M;
        float ca = mu_expf(M - M2), cb = mu_expf(m_b - M2);
        L = L * ca + p.l[g] * cb;
        c->k->scale_add2(out, p.acc + g * D, ca, cb, D);
        M = M2;
    }
    c->k->div_scalar(out, L, D);
}

/* Task t: head t - merge0 of a row with two or more blocks. */
static void merge_task(void *arg, int64_t t, int thread) {
    (void)thread;
    attn_ctx *c = arg;
    const attn_row *r = &c->rows[row_of(c, t, true)];
    merge_head(c, r, t - r->merge0);
}

static void *grow(void *p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return p;
    free(p);
    void *q = NULL;
    if (posix_memalign(&q, 64, need * size) != 0) q = mu_xmalloc(need * size);
    *cap = need;
    return q;
}

/* Rows of one dispatch at most, and the partials they may hold together
 * (floats; one row at any depth is always taken: 64k keys of 2 KV heads
 * are 0.8 M floats at head_dim 128, group 12). */
#define SPAN_ROWS 256
#define SPAN_PART_FLOATS ((int64_t)1 << 22)

/* Rows [r0, r1) of the batch in one dispatch per phase. */
static void run_span(cpu_pool *pool, const cpu_kernels *k, cpu_attn_buffers *buf, const mu_attn_batch *ab,
                     const float *q, float *out, int64_t r0, int64_t r1) {
    const int64_t G = ab->n_head / ab->n_head_kv, D = ab->head_dim, Q = ab->n_head * D;
    const int nt = cpu_pool_threads(pool);
    attn_ctx c = {.k = k, .n_rows = r1 - r0, .group = G};
    c.part_floats = round16(2 * G) + round16(G * D);
    c.scratch_floats = round16(CPU_ATTN_SCRATCH(D, G));
    buf->rows = grow(buf->rows, &buf->rows_cap, (size_t)c.n_rows, sizeof(attn_row));
    c.rows = buf->rows;
    int64_t pairs = 0, part_floats = 0;
    for (int64_t i = 0; i < c.n_rows; i++) {
        attn_row *r = &c.rows[i];
        *r = (attn_row){.a = mu_attn_row(ab, r0 + i), .q = q + (r0 + i) * Q, .out = out + (r0 + i) * Q};
        r->job = (cpu_attn_job){.a = &r->a, .q = r->q, .group = G, .n_g = G}; /* g0 = 0: the whole group */
        r->job.first = mu_kv_first(r->a.kv);
        if (r->a.window > 0 && r->a.pos - r->a.window + 1 > r->job.first) r->job.first = r->a.pos - r->a.window + 1;
        r->n_blocks = (r->a.pos - r->job.first) / CPU_ATTN_BLOCK + 1;
        pairs += ab->n_head_kv * r->n_blocks;
        part_floats += ab->n_head_kv * r->n_blocks * c.part_floats;
    }
    buf->parts = grow(buf->parts, &buf->parts_cap, (size_t)part_floats, sizeof(float));
    buf->thread_scratch = grow(buf->thread_scratch, &buf->scratch_cap, (size_t)(nt * c.scratch_floats), sizeof(float));
    c.scratch = buf->thread_scratch;
    /* Fewer (row, KV head, block) triples than threads (one short row):
     * split each group's query heads too. Every head is still computed
     * whole by one task; K/V rows are then read once per slice. */
    int64_t slices = 1;
    if (pairs < nt) slices = (nt + pairs - 1) / pairs < G ? (nt + pairs - 1) / pairs : G;
    const int64_t per_slice = (G + slices - 1) / slices;
    slices = (G + per_slice - 1) / per_slice;
    int64_t tasks = 0, merges = 0, merge_work = 0;
    float *parts = buf->parts;
    for (int64_t i = 0; i < c.n_rows; i++) {
        attn_row *r = &c.rows[i];
        r->slices = slices;
        r->per_slice = per_slice;
        r->parts = parts;
        parts += ab->n_head_kv * r->n_blocks * c.part_floats;
        r->task0 = tasks;
        tasks += ab->n_head_kv * r->n_blocks * slices;
        r->merge0 = merges;
        if (r->n_blocks > 1) {
            merges += ab->n_head;
            merge_work += ab->n_head * (r->n_blocks - 1);
        }
    }
    cpu_pool_run(pool, block_task, &c, tasks);
    if (!merges) return;
    if (merge_work >= 2 * ab->n_head) { /* more than one row of two blocks: worth a dispatch */
        cpu_pool_run(pool, merge_task, &c, merges);
        return;
    }
    for (int64_t i = 0; i < c.n_rows; i++)
        if (c.rows[i].n_blocks > 1)
            for (int64_t h = 0; h < ab->n_head; h++) merge_head(&c, &c.rows[i], h);
}

void cpu_attention_run(cpu_pool *pool, const cpu_kernels *k, cpu_attn_buffers *buf, const mu_attn_batch *ab,
                       const float *q, float *out) {
    const int64_t G = ab->n_head / ab->n_head_kv;
    const int64_t part_floats = round16(2 * G) + round16(G * ab->head_dim);
    for (int64_t r0 = 0, r1; r0 < ab->rows; r0 = r1) {
        int64_t floats = 0;
        for (r1 = r0; r1 < ab->rows && r1 - r0 < SPAN_ROWS; r1++) {
            const mu_attn_args a = mu_attn_row(ab, r1);
            int64_t first = mu_kv_first(a.kv);
            if (a.window > 0 && a.pos - a.window + 1 > first) first = a.pos - a.window + 1;
            const int64_t f = ab->n_head_kv * ((a.pos - first) / CPU_ATTN_BLOCK + 1) * part_floats;
            if (r1 > r0 && floats + f > SPAN_PART_FLOATS) break;
            floats += f;
        }
        run_span(pool, k, buf, ab, q, out, r0, r1);
    }
}

void cpu_attn_buffers_free(cpu_attn_buffers *buf) {
    free(buf->rows);
    free(buf->parts);
    free(buf->thread_scratch);
    memset(buf, 0, sizeof *buf);
}
