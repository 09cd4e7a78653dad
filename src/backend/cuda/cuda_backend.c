/* The CUDA backend's mu_backend glue (docs/cuda.md): backend memory is
 * device memory; host arrays an op takes (token ids, positions, physical
 * rows, slots, the norm vectors of the model, which are host copies) are
 * uploaded per call; weights (views into the host GGUF mapping) are
 * uploaded once, at load through the wants_repack hook or at first use,
 * and found again through a host pointer -> device pointer map. The
 * kernels are cuda_kernels.cu. A CUDA failure inside an op aborts with a
 * message naming the call or kernel and the reason (an op cannot report
 * an error, and a half-done forward is never a result). Without
 * MUSER_HAVE_CUDA (no nvcc at configure time) creation fails with an error. */
#include "backend/cuda/cuda_backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>

#ifndef MUSER_HAVE_CUDA

mu_backend *mu_backend_cuda_create(int n_threads, mu_error *err) {
    (void)n_threads;
    mu_err_set(err, "backend 'cuda' is not available in this build (configure with nvcc present and -DMUSER_CUDA=ON)");
    return NULL;
}

#else
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_trace.h"

typedef struct dev_copy {
    const void *host; /* NULL: empty slot */
    int kind;         /* 0: the bytes as they are; 1: the matmul layout (Q6_K split) */
    size_t bytes;
    void *dev;
} dev_copy;

typedef struct dev_buf {
    void *p;
    size_t cap;
} dev_buf;

typedef struct cuda_ctx {
    dev_copy *copies; /* uploaded weights and norm vectors: open addressing on (host, kind) */
    size_t n_copies, cap_copies;
    size_t weight_bytes;
    uint8_t *ring_h, *ring_d; /* per-call host arrays: pinned staging -> device, stream-ordered */
    size_t ring_cap, ring_pos;
    /* The pinned staging is `parts` parts of ring_cap bytes (ring_base);
     * ring_h is the one in use. Replays take them in turn, so that the host
     * writes a forward's arguments while the parts - 1 forwards before it
     * still run (forward_begin). */
    uint8_t *ring_base;
    int rpart, parts;          /* parts: MUSER_CUDA_RING_PARTS, 2 (default) to MUCU_RING_PARTS */
    void *part_ev[MUCU_RING_PARTS]; /* after the work that may still read each part */
    int32_t *regs_d;           /* the token registers (backend.h argmax_reg), MU_TOKEN_REGS */
    mucu_tree_regs *treg_d;    /* the tree registers (backend.h tree_reg) */
    bool qk_neox;              /* qk_norm_rope's NeoX kernel path (MUSER_CUDA_QK_NEOX=0: off) */
    bool q8_keep;              /* q8_written_bytes keeps the tag past writes elsewhere (MUSER_CUDA_Q8_KEEP=0:
                                * every such write clears it, as before; measurements) */
    void *tree_work_d;         /* k_tree_rows' candidates (mucu_tree_work_bytes) */
    int32_t *chain_d;          /* the chained token (backend.h chain_pick), then k_chain_pick's
                                * counter and partials (mucu_chain_bytes) */
    dev_buf out;     /* argmax results */
    dev_buf q8;      /* Q8_K activation blocks */
    dev_buf tmp;     /* overlapping copies */
    dev_buf part;    /* attention: per 256-key block partials */
    dev_buf gsplit;  /* many-row products split over their blocks: each block's f_b (mucu_matmul_split_bytes) */
    bool told;       /* footprint printed */
    void *pinned;    /* download staging */
    size_t pinned_cap;
    /* The q8 buffer holds the Q8_K quantization (split layout) of q8_n
     * values at device address q8_x, written by the op that produced them
     * (rmsnorm, residual, gate, swiglu), for the matrix products that read
     * them next. An op that writes device memory either clears it
     * (q8_clear) or, where it knows every byte it writes (copies, zero, the
     * RoPE table and rotation, qk_norm_rope without a K/V store, the
     * assistant's K/V store), clears it when those bytes meet the values
     * (q8_written_bytes), so it never outlives the values it describes. It
     * is cleared at every forward_begin: a bracket's launches, and so its
     * replays, never depend on what came before it. q8_f16: of the values rounded through f16
     * (native NVFP4 W4A16 products, mucu_matmul_f16_acts), which only those
     * products quantize. */
    const float *q8_x;
    int64_t q8_n;
    bool q8_f16;
    /* Decode graphs (docs/cuda.md "Graphs"): see forward_begin below. */
    int gmode;                 /* G_DIRECT, G_CAPTURE, G_REPLAY */
    int graphs;                /* -1 not decided; 0 off; 1 on */
    bool seg_open;             /* CAPTURE: a segment's capture is open */
    struct gentry *cur;        /* CAPTURE/REPLAY: the key's entry */
    int replay_i;              /* REPLAY: ops matched so far */
    struct gentry *cache;      /* [G_CACHE] */
    uint64_t tick;
    void *fwd_done;            /* event after the last forward's work */
    void **deferred;           /* device buffers freed after fwd_done */
    int n_deferred, cap_deferred;
    long n_replayed, n_captured, n_bailed;
    long n_ahead;              /* replays begun while the one before still ran (forward_begin) */
    double ahead_wait;         /* seconds those waited for the replay two back */
    bool skip;                 /* REPLAY: the current op matched; it launches nothing */
    int bail_at;               /* MUSER_CUDA_GRAPH_BAIL_AT=N: replays fail at op N (tests); -1 none */
    /* MUSER_CUDA_STEP_TIMES=1: where a replayed step's time goes (printed at the end) */
    struct {
        bool on;
        void *ev[2];
        long n;
        double t_begin, t_done, walk, launch, gpu, wait, after, period;
    } st;
} cuda_ctx;

enum { G_DIRECT, G_CAPTURE, G_REPLAY, G_CACHE = 32 };

/* A forward shape the engine has run: seen once directly, then captured
 * op by op (one graph segment per op, with the op's signature), then
 * replayed as one chained graph while every op's signature matches. */
typedef struct gentry {
    uint64_t key;
    int state;                 /* 0 empty, 1 seen directly, 2 captured */
    uint64_t used;
    uint64_t *sig;
    void **seg;                /* segment graphs, [n] */
    int n, cap;
    void *exec[MUCU_RING_PARTS]; /* the chain of all segments, uploading from part 0, 1, ... (NULL: none) */
    size_t ring_end;           /* the argument ring's bytes this forward wrote (from 0) */
} gentry;

static void q8_clear(mu_backend *b) {
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    c->q8_x = NULL;
    c->q8_n = 0;
    c->q8_f16 = false;
}

/* A write of bytes at p: the q8 buffer no longer describes the values
 * when the two meet. */
static bool q8_meets(const cuda_ctx *c, const void *p, size_t bytes) {
    const uint8_t *w = p, *x = (const uint8_t *)c->q8_x;
    return x && bytes && w < x + (size_t)c->q8_n * sizeof(float) && x < w + bytes;
}

static void q8_written_bytes(mu_backend *b, const void *p, size_t bytes) {
    const cuda_ctx *c = (const cuda_ctx *)b->ctx;
    if (!c->q8_keep || q8_meets(c, p, bytes)) q8_clear(b);
}

/* The extent of a 2D copy's destination: rows of width bytes, stride apart. */
static size_t extent2d(size_t stride, size_t width, int64_t rows) {
    return rows > 0 ? (size_t)(rows - 1) * stride + width : 0;
}

/* The q8 buffer, sized for n values, to be filled with x's quantization. */
static void *q8_produce(mu_backend *b, const float *x, int64_t n);
static void cuda_add(mu_backend *b, float *x, const float *y, int64_t n);
static void cuda_rope(mu_backend *b, float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs,
                      int64_t rows, bool neox);

static _Noreturn void die(const char *op, const char *msg) {
    fprintf(stderr, "muser: cuda backend: %s: %s\n", op, msg);
    abort();
}

static cuda_ctx *ctx_of(mu_backend *b) { return (cuda_ctx *)b->ctx; }

static void capture_pause(cuda_ctx *c);
static void defer_free(cuda_ctx *c, void *p);

static void *buf_reserve_c(cuda_ctx *c, dev_buf *d, size_t bytes, const char *op) {
    char err[MUCU_ERR_LEN];
    if (bytes <= d->cap && d->p) return d->p;
    size_t cap = d->cap ? d->cap : 4096;
    while (cap < bytes) cap *= 2;
    capture_pause(c); /* allocation is not stream work: never inside a capture */
    if (c->gmode != G_DIRECT) {
        defer_free(c, d->p); /* graph segments of this forward may still read it */
    } else if (d->p && !mucu_free(d->p, err)) { /* cudaFree waits for the kernels using it */
        die(op, err);
    }
    d->p = NULL;
    d->cap = 0;
    if (!mucu_malloc(&d->p, cap, err)) die(op, err);
    d->cap = cap;
    return d->p;
}

/* ------------------------------------------------------------- graphs
 *
 * A decode step is hundreds of small launches; replaying them as one CUDA
 * graph removes the host's per-launch work and most of the gaps between
 * kernels. The engine brackets a forward of at most 16 rows with
 * forward_begin(key) / forward_end, where the key names the batch's shape
 * (rows, sequences, positions' 256-key blocks, logits and capture rows).
 * The first forward of a key runs directly; the second is captured, one
 * graph segment per op, each op remembering a signature of everything
 * that enters its launches (device pointers, sizes, scalars, the argument
 * ring's offset, the Q8_K buffer's state); later forwards replay the chain
 * of segments as one graph. While replaying, ops do all their host work
 * (the argument ring is written at the same offsets) but launch nothing;
 * an op whose signature differs, or an op that must synchronize, ends the
 * replay: the segments of the ops before it are launched one by one and
 * the forward goes on directly (the entry is dropped). So a replay runs
 * exactly the launches a direct run would, or does not happen. */

static void defer_free(cuda_ctx *c, void *p) {
    if (!p) return;
    if (c->n_deferred == c->cap_deferred) {
        c->cap_deferred = c->cap_deferred ? 2 * c->cap_deferred : 16;
        c->deferred = mu_xrealloc(c->deferred, (size_t)c->cap_deferred * sizeof *c->deferred);
    }
    c->deferred[c->n_deferred++] = p;
}

/* CAPTURE: close the open segment (its op's launches are recorded). */
static void capture_pause(cuda_ctx *c) {
    if (c->gmode != G_CAPTURE || !c->seg_open) return;
    char err[MUCU_ERR_LEN];
    void *g = NULL;
    if (!mucu_capture_end(&g, err)) die("graph capture", err);
    c->seg_open = false;
    gentry *e = c->cur;
    e->seg[e->n - 1] = g;
}

static void entry_clear(gentry *e) {
    for (int i = 0; i < e->n; i++) mucu_graph_free(e->seg[i]);
    for (int i = 0; i < MUCU_RING_PARTS; i++) mucu_exec_free(e->exec[i]);
    free(e->sig);
    free(e->seg);
    memset(e, 0, sizeof *e);
}

/* Leave CAPTURE or REPLAY: run the launches recorded for this forward so
 * far (the segments of the ops already done), drop the entry, go on
 * directly. */
static void graph_bail(cuda_ctx *c) {
    char err[MUCU_ERR_LEN];
    if (c->gmode == G_DIRECT) return;
    capture_pause(c);
    gentry *e = c->cur;
    const int done = c->gmode == G_REPLAY ? c->replay_i : e->n;
    if (c->rpart != 0) { /* the segments upload from part 0, where their capture wrote */
        if (!mucu_sync("graph bail", err)) die("graph bail", err);
        memcpy(c->ring_base, c->ring_h, c->ring_pos);
        c->rpart = 0;
        c->ring_h = c->ring_base;
    }
    for (int i = 0; i < done; i++) {
        void *x = NULL;
        if (!e->seg[i]) continue;
        if (!mucu_graph_instantiate(e->seg[i], &x, err) || !mucu_graph_launch(x, err)) die("graph bail", err);
        mucu_exec_free(x); /* destroying an executable graph in flight is allowed: it completes */
    }
    entry_clear(e);
    c->gmode = G_DIRECT;
    c->cur = NULL;
    c->skip = false;
    c->n_bailed++;
}

static uint64_t mix64(uint64_t h, uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h * 0xFF51AFD7ED558CCDull;
}

/* Before an op's launches: may it launch (false: replaying, it must not)?
 * sig: the op's own arguments (sig_of); the backend's state is added. */
static bool go(mu_backend *b, uint64_t sig) {
    cuda_ctx *c = ctx_of(b);
    c->skip = false;
    if (c->gmode == G_DIRECT) return true;
    sig = mix64(sig, (uint64_t)c->ring_pos);
    sig = mix64(sig, (uint64_t)(uintptr_t)c->ring_d);
    sig = mix64(sig, (uint64_t)(uintptr_t)c->ring_base); /* either half: the replay uploads from the one in use */
    sig = mix64(sig, (uint64_t)(uintptr_t)c->q8_x);
    sig = mix64(sig, (uint64_t)c->q8_n + ((uint64_t)c->q8_f16 << 63));
    sig = mix64(sig, (uint64_t)(uintptr_t)c->q8.p);
    sig = mix64(sig, (uint64_t)(uintptr_t)c->part.p);
    sig = mix64(sig, (uint64_t)(uintptr_t)c->tmp.p);
    gentry *e = c->cur;
    if (c->gmode == G_REPLAY) {
        if (c->replay_i == c->bail_at) sig ^= 1; /* MUSER_CUDA_GRAPH_BAIL_AT: tests of the way out */
        if (c->replay_i < e->n && e->sig[c->replay_i] == sig) {
            c->replay_i++;
            c->skip = true;
            return false;
        }
        graph_bail(c);
        return true;
    }
    char err[MUCU_ERR_LEN]; /* CAPTURE: this op's segment */
    capture_pause(c);
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 1024;
        e->sig = mu_xrealloc(e->sig, (size_t)e->cap * sizeof *e->sig);
        e->seg = mu_xrealloc(e->seg, (size_t)e->cap * sizeof *e->seg);
    }
    e->sig[e->n] = sig;
    e->seg[e->n++] = NULL;
    if (!mucu_capture_begin(err)) die("graph capture", err);
    c->seg_open = true;
    return true;
}

/* An op that must wait for the device or move host memory synchronously:
 * not inside a graph forward. */
static void graph_sync_point(mu_backend *b) { graph_bail(ctx_of(b)); }

/* sig_of(op, n, a0, ...): the op's name and n argument words. */
static uint64_t sig_of(const char *op, int n, ...) {
    uint64_t h = mix64(0x243F6A8885A308D3ull, (uint64_t)(uintptr_t)op);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) h = mix64(h, va_arg(ap, uint64_t));
    va_end(ap);
    return h;
}
#define P(x) ((uint64_t)(uintptr_t)(x))
#define I(x) ((uint64_t)(int64_t)(x))
static uint64_t F(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Whether the environment variable `name` is "0" (a default path turned off). */
static bool opt_out(const char *name) {
    const char *e = getenv(name);
    return e && !strcmp(e, "0");
}

static void cuda_forward_begin(mu_backend *b, uint64_t key) {
    cuda_ctx *c = ctx_of(b);
    char err[MUCU_ERR_LEN];
    if (c->graphs < 0) {
        const char *p = getenv("MUSER_CUDA_PROF"), *y = getenv("MUSER_CUDA_SYNC");
        const bool prof = (p && *p && strcmp(p, "0")) || (y && *y && strcmp(y, "0"));
        c->graphs = opt_out("MUSER_CUDA_GRAPH") || prof ? 0 : 1;
        const char *stt = getenv("MUSER_CUDA_STEP_TIMES");
        c->st.on = stt && *stt && strcmp(stt, "0");
        const char *ba = getenv("MUSER_CUDA_GRAPH_BAIL_AT");
        c->bail_at = ba && *ba ? atoi(ba) : -1;
        c->cache = mu_xcalloc(G_CACHE, sizeof *c->cache);
    }
    if (c->gmode != G_DIRECT) die("forward_begin", "a forward is already open");
    q8_clear(b); /* a bracket's launches (and their signatures) never depend on what came before */
    if (!c->graphs) return;
    gentry *e = NULL, *lru = &c->cache[0];
    for (int i = 0; i < G_CACHE; i++) {
        if (c->cache[i].state && c->cache[i].key == key) e = &c->cache[i];
        if (c->cache[i].used < lru->used) lru = &c->cache[i];
    }
    c->tick++;
    if (!e) { /* first sight: run directly, remember the key */
        entry_clear(lru);
        lru->key = key, lru->state = 1, lru->used = c->tick;
        return;
    }
    e->used = c->tick;
    if (c->st.on && e->state == 2) { /* a replay: the host's time since the last one ended */
        const double t = mu_now();
        if (c->st.t_done > 0) c->st.after += t - c->st.t_done, c->st.period += t - c->st.t_begin;
        c->st.t_begin = t;
    }
    /* The argument ring restarts at 0. A replay takes the next part once
     * the work that read it (the forward `parts` back) is done, so the host
     * records a forward while the ones before it run: the greedy chain's
     * steps ahead, a speculative round's draft behind its verification and
     * the fed rows' projection (docs/cuda.md "Graphs"). Otherwise all work
     * enqueued so far must be done, and deferred buffers go. */
    if (e->state == 2 && e->exec[c->parts - 1] && !c->n_deferred && !c->st.on) {
        if (!mucu_mark(&c->part_ev[c->rpart], err)) die("forward_begin", err);
        c->rpart = (c->rpart + 1) % c->parts;
        const double t0 = mu_now();
        if (!mucu_mark_wait(c->part_ev[c->rpart], err)) die("forward_begin", err);
        c->ahead_wait += mu_now() - t0;
        c->n_ahead++;
    } else {
        if (!mucu_mark(&c->fwd_done, err) || !mucu_mark_wait(c->fwd_done, err)) die("forward_begin", err);
        for (int i = 0; i < c->n_deferred; i++)
            if (!mucu_free(c->deferred[i], err)) die("forward_begin", err);
        c->n_deferred = 0;
        c->rpart = 0;
    }
    c->ring_h = c->ring_base ? c->ring_base + (size_t)c->rpart * c->ring_cap : NULL;
    c->ring_pos = 0;
    c->cur = e;
    if (e->state == 1) {
        e->state = 2;
        c->gmode = G_CAPTURE;
        c->n_captured++;
    } else {
        c->gmode = G_REPLAY;
        c->replay_i = 0;
    }
}

static void cuda_forward_end(mu_backend *b, bool ok) {
    cuda_ctx *c = ctx_of(b);
    char err[MUCU_ERR_LEN];
    if (c->gmode == G_CAPTURE) {
        capture_pause(c);
        gentry *e = c->cur;
        if (ok) {
            void **segs = mu_xmalloc((size_t)(e->n + 1) * sizeof *segs);
            int k = 0;
            for (int i = 0; i < e->n; i++)
                if (e->seg[i]) segs[k++] = e->seg[i];
            /* captured in part 0 (forward_begin waited for everything) */
            mucu_ring ring = {c->ring_h, c->ring_d, c->ring_pos, {NULL}};
            for (int i = 1; i < c->parts && c->ring_base; i++) ring.more[i - 1] = c->ring_base + (size_t)i * c->ring_cap;
            e->ring_end = c->ring_pos;
            if (!mucu_graph_chain(segs, k, &ring, e->exec, err)) die("graph", err);
            free(segs);
            if (!mucu_graph_launch(e->exec[0], err)) die("graph", err);
            c->gmode = G_DIRECT;
            c->cur = NULL;
        } else {
            graph_bail(c); /* a failed forward: what was recorded still runs, as directly */
        }
    } else if (c->gmode == G_REPLAY) {
        gentry *e = c->cur;
        /* the graph uploads the ring's first ring_end bytes (mucu_graph_chain): this
         * forward must have written exactly those (the ops' signatures hold each
         * one's offset; this also holds the last op's size) */
        if (ok && c->replay_i == e->n && c->ring_pos == e->ring_end) {
            const double t1 = c->st.on ? mu_now() : 0.0;
            if (c->st.on && !mucu_mark_timed(&c->st.ev[0], err)) die("graph", err);
            if (!mucu_graph_launch(e->exec[c->rpart], err)) die("graph", err);
            if (c->st.on) { /* waits for the graph: the download after it then only copies */
                const double t2 = mu_now();
                double ms = 0.0;
                if (!mucu_mark_timed(&c->st.ev[1], err) || !mucu_elapsed_ms(c->st.ev[0], c->st.ev[1], &ms, err))
                    die("graph", err);
                c->st.t_done = mu_now();
                c->st.walk += t1 - c->st.t_begin, c->st.launch += t2 - t1, c->st.gpu += ms / 1e3;
                c->st.wait += c->st.t_done - t2, c->st.n++;
            }
            c->n_replayed++;
            c->gmode = G_DIRECT;
            c->cur = NULL;
        } else {
            graph_bail(c);
        }
    }
    c->skip = false;
}

/* A host array for this call, in device memory: copied into the pinned
 * ring and uploaded in stream order, so the host never waits. The ring is
 * reused from its start only after a synchronize (every 8 MiB or so of
 * arguments), so no upload or kernel still reads what is overwritten. In a
 * graph forward the ring starts at 0 and never wraps (a forward that would
 * wrap it leaves the graph first); replaying, the bytes are written but
 * not uploaded (the graph's copy nodes upload them). */
static void *upload_arg(mu_backend *b, const void *host, size_t bytes, const char *op) {
    cuda_ctx *c = ctx_of(b);
    char err[MUCU_ERR_LEN];
    const size_t n = (bytes + 255) & ~(size_t)255;
    if (c->gmode != G_DIRECT && (n > c->ring_cap || c->ring_pos + n > c->ring_cap)) {
        /* capturing: leave the graph (the current op then runs directly); a replay
         * follows its capture's offsets, which fitted */
        if (c->skip) die(op, "argument ring overflow while replaying a graph");
        graph_bail(c);
    }
    if (n > c->ring_cap || c->ring_pos + n > c->ring_cap) {
        if (c->ring_cap && !mucu_sync("argument ring wrap", err)) die(op, err);
        c->ring_pos = 0;
        if (n > c->ring_cap) {
            size_t cap = c->ring_cap ? c->ring_cap : (size_t)8 << 20;
            while (cap < n) cap *= 2;
            if (!mucu_host_free(c->ring_base, err) || !mucu_free(c->ring_d, err)) die(op, err);
            c->ring_base = c->ring_h = NULL, c->ring_d = NULL, c->ring_cap = 0;
            if (!mucu_host_alloc((void **)&c->ring_base, (size_t)c->parts * cap, err) ||
                !mucu_malloc((void **)&c->ring_d, cap, err))
                die(op, err);
            c->ring_cap = cap;
            c->rpart = 0;
        }
        c->ring_h = c->ring_base + (size_t)c->rpart * c->ring_cap;
    }
    uint8_t *h = c->ring_h + c->ring_pos, *d = c->ring_d + c->ring_pos;
    memcpy(h, host, bytes);
    if (!c->skip && !mucu_upload_async(d, h, bytes, op, err)) die(op, err);
    c->ring_pos += n;
    return d;
}

static size_t copy_slot(const cuda_ctx *c, const void *host, int kind) {
    uint64_t k = (uint64_t)(uintptr_t)host * 0x9E3779B97F4A7C15ull + (uint64_t)kind;
    return (size_t)(k >> 20) & (c->cap_copies - 1);
}

static void copies_put(cuda_ctx *c, dev_copy e) {
    if (2 * (c->n_copies + 1) > c->cap_copies) { /* grow, rehash */
        dev_copy *old = c->copies;
        size_t old_cap = c->cap_copies;
        c->cap_copies = old_cap ? 2 * old_cap : 1024;
        c->copies = mu_xcalloc(c->cap_copies, sizeof *c->copies);
        c->n_copies = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].host) copies_put(c, old[i]);
        free(old);
    }
    size_t i = copy_slot(c, e.host, e.kind);
    while (c->copies[i].host) i = (i + 1) & (c->cap_copies - 1);
    c->copies[i] = e;
    c->n_copies++;
}

static const dev_copy *copies_get(const cuda_ctx *c, const void *host, int kind, size_t bytes) {
    if (!c->cap_copies) return NULL;
    for (size_t i = copy_slot(c, host, kind); c->copies[i].host; i = (i + 1) & (c->cap_copies - 1))
        if (c->copies[i].host == host && c->copies[i].kind == kind && c->copies[i].bytes >= bytes) return &c->copies[i];
    return NULL;
}

enum { KIND_BYTES, KIND_Q6K_SPLIT, KIND_FP4_SPLIT };

/* The device copy of `bytes` host bytes at `host` (uploaded on first use),
 * or host itself when it already is device memory (activations viewed as a
 * weight, mu_f32_matrix). KIND_Q6K_SPLIT: w's Q6_K blocks in the split
 * layout; KIND_FP4_SPLIT: w's NVFP4 rows (and native scales) in the fast
 * kernels' layout, `bytes` of it (mucu_fp4_split). Host bytes seen here
 * must stay alive and unchanged while the backend lives (model weights and
 * norm vectors are). */
static const void *dev_bytes_kind(mu_backend *b, const void *host, size_t bytes, int kind, const mu_weight *w,
                                  const char *what) {
    cuda_ctx *c = ctx_of(b);
    const dev_copy *hit = copies_get(c, host, kind, bytes);
    if (hit) return hit->dev;
    if (mucu_is_device(host)) return host;
    graph_sync_point(b); /* a first use uploads synchronously: not inside a graph forward */
    char err[MUCU_ERR_LEN];
    void *d = NULL;
    /* 16 zero bytes past the end: the tensor-core kernel reads the split
     * Q6_K d array in aligned 4-byte pairs (cuda_prefill.cu) */
    if (!mucu_malloc(&d, bytes + 16, err)) die(what, err);
    if (kind == KIND_Q6K_SPLIT) {
        uint8_t *t = mu_xmalloc(bytes);
        mucu_q6k_split(host, t, w->n_out * (w->n_in / 256));
        if (!mucu_memcpy(d, t, bytes, what, err)) die(what, err);
        free(t);
    } else if (kind == KIND_FP4_SPLIT) { /* the rows as they are, then the kernel that rearranges them */
        const bool native = w->type == MU_TYPE_NVFP4_E2M1;
        const size_t raw = (size_t)w->n_out * (native ? (size_t)w->n_in / 2 : w->row_bytes);
        const size_t sc = native ? (size_t)w->n_out * (size_t)(w->n_in / 16) : 0;
        void *t = NULL;
        if (!mucu_malloc(&t, raw + sc, err) || !mucu_memcpy(t, host, raw, what, err) ||
            (sc && !mucu_memcpy((uint8_t *)t + raw, w->nvfp4_scales, sc, what, err)) ||
            !mucu_fp4_split(t, sc ? (uint8_t *)t + raw : NULL, d, w->n_in, w->n_out, native, err) || !mucu_free(t, err))
            die(what, err);
    } else if (!mucu_memcpy(d, host, bytes, what, err)) {
        die(what, err);
    }
    c->weight_bytes += bytes;
    copies_put(c, (dev_copy){.host = host, .kind = kind, .bytes = bytes, .dev = d});
    return d;
}

static const void *dev_bytes(mu_backend *b, const void *host, size_t bytes, const char *what) {
    return dev_bytes_kind(b, host, bytes, KIND_BYTES, NULL, what);
}

static bool cuda_type_ok(uint32_t t) {
    switch (t) {
    case MU_TYPE_F32: case MU_TYPE_F16: case MU_TYPE_BF16: case MU_TYPE_Q4_0: case MU_TYPE_Q8_0:
    case MU_TYPE_Q4_K: case MU_TYPE_Q5_K: case MU_TYPE_Q6_K: case MU_TYPE_NVFP4: case MU_TYPE_NVFP4_E2M1:
        return true;
    default:
        return false;
    }
}

/* The weight as the kernels see it; for_matmul: Q6_K in the split layout
 * of the fast kernel (embed reads the GGUF layout, a separate copy). */
static mucu_weight dev_weight(mu_backend *b, const mu_weight *w, const char *op, bool for_matmul) {
    const char *name = w->name ? w->name : "(unnamed)";
    if (!cuda_type_ok(w->type)) {
        char msg[256];
        const char *tn = mu_type_name(w->type);
        snprintf(msg, sizeof msg, "weight %s has type %s (%u), which the CUDA kernels do not implement", name,
                 tn ? tn : "unknown", w->type);
        die(op, msg);
    }
    if (w->layout != MU_LAYOUT_ROWS) die(op, "weight in another backend's repacked layout");
    const bool native = w->type == MU_TYPE_NVFP4_E2M1;
    mucu_weight d = {.type = w->type, .scale = w->scale, .has_scale = w->has_scale,
                     .input_scale_inv = w->input_scale_inv, .n_in = w->n_in, .n_out = w->n_out,
                     .row_bytes = w->row_bytes};
    const size_t data_bytes = native ? (size_t)w->n_out * (size_t)(w->n_in / 2) : (size_t)w->n_out * w->row_bytes;
    /* NVFP4 W4A16 / ggml on the fast kernels (MUSER_CUDA_FP4=0: the rows as they are, k_matmul_warp) */
    const bool fp4 = (w->type == MU_TYPE_NVFP4 || (native && !(w->input_scale_inv > 0.0f))) && w->n_in % 256 == 0 &&
                     mucu_fp4_on();
    if (for_matmul && w->type == MU_TYPE_Q6_K) {
        d.data = dev_bytes_kind(b, w->data, data_bytes, KIND_Q6K_SPLIT, w, name);
        d.q6_split = d.data != w->data; /* device activations are never Q6_K; kept for safety */
    } else if (for_matmul && fp4) {
        d.data = dev_bytes_kind(b, w->data, mucu_fp4_split_bytes(w->n_in, w->n_out), KIND_FP4_SPLIT, w, name);
        d.fp4_split = 1;
        return d;
    } else {
        d.data = dev_bytes(b, w->data, data_bytes, name);
    }
    if (native) d.scales = dev_bytes(b, w->nvfp4_scales, (size_t)w->n_out * (size_t)(w->n_in / 16), name);
    return d;
}

/* ---------------------------------------------------------------- memory */

static void *cuda_alloc(mu_backend *b, size_t bytes) {
    graph_sync_point(b);
    q8_clear(b); /* zero-filled without an op: it may reuse the described values' addresses */
    char err[MUCU_ERR_LEN];
    void *p = NULL;
    if (!mucu_malloc(&p, bytes, err)) {
        fprintf(stderr, "muser: cuda backend: alloc of %zu bytes: %s\n", bytes, err);
        return NULL;
    }
    return p;
}

static void cuda_free(mu_backend *b, void *p, size_t bytes) {
    (void)bytes;
    graph_sync_point(b);
    q8_clear(b); /* the next allocation may hand out these addresses, zeroed without an op */
    char err[MUCU_ERR_LEN];
    if (!mucu_free(p, err)) die("free", err);
}

static void cuda_copy(mu_backend *b, void *dst, const void *src, size_t bytes) {
    char err[MUCU_ERR_LEN];
    q8_written_bytes(b, dst, bytes); /* e.g. the capture rows: h's quantization stays for the next product */
    if (!bytes || dst == src) return;
    const uint8_t *d = dst, *s = src;
    if (d < s + bytes && s < d + bytes) { /* overlap: memmove through a scratch copy */
        void *t = buf_reserve_c(ctx_of(b), &ctx_of(b)->tmp, bytes, "copy");
        if (!go(b, sig_of("copy overlap", 3, P(dst), P(src), I(bytes)))) return;
        if (!mucu_copy_async(t, src, bytes, err) || !mucu_copy_async(dst, t, bytes, err)) die("copy", err);
        return;
    }
    if (!go(b, sig_of("copy", 3, P(dst), P(src), I(bytes)))) return;
    if (!mucu_copy_async(dst, src, bytes, err)) die("copy", err);
}

static void cuda_copy2d(mu_backend *b, void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t width,
                        int64_t rows) {
    q8_written_bytes(b, dst, extent2d(dst_stride, width, rows));
    char err[MUCU_ERR_LEN];
    if (rows <= 0 || !go(b, sig_of("copy2d", 6, P(dst), I(dst_stride), P(src), I(src_stride), I(width), I(rows))))
        return;
    if (!mucu_copy2d_async(dst, dst_stride, src, src_stride, width, (size_t)rows, err)) die("copy2d", err);
}

/* One launch for all of them (a rollback's 2 x layers copies), the
 * descriptors through the argument ring. */
static void cuda_copy2d_many(mu_backend *b, int n, const mu_copy2d *c) {
    for (int i = 0; i < n; i++) q8_written_bytes(b, c[i].dst, extent2d(c[i].dst_stride, c[i].width, c[i].rows));
    if (n <= 0) return;
    _Static_assert(sizeof(mu_copy2d) == sizeof(mucu_copy2d), "copy descriptors must match");
    int64_t max_rows = 0;
    uint64_t sig = sig_of("copy2d_many", 1, I(n));
    for (int i = 0; i < n; i++) {
        if (c[i].rows > max_rows) max_rows = c[i].rows;
        sig = mix64(mix64(mix64(sig, P(c[i].dst)), P(c[i].src)), I(c[i].width) ^ ((uint64_t)c[i].rows << 40));
        sig = mix64(mix64(sig, I(c[i].dst_stride)), I(c[i].src_stride));
    }
    const bool launch = go(b, sig);
    const mucu_copy2d *d = upload_arg(b, c, (size_t)n * sizeof *c, "copy2d_many");
    char err[MUCU_ERR_LEN];
    if (launch && !mucu_copy2d_many(d, n, max_rows, err)) die("copy2d_many", err);
}

static void cuda_upload(mu_backend *b, void *dst, const void *host_src, size_t bytes) {
    graph_sync_point(b);
    q8_clear(b);
    char err[MUCU_ERR_LEN];
    if (!mucu_memcpy(dst, host_src, bytes, "upload", err)) die("upload", err);
}

/* Into page-locked memory (host_alloc's: the sessions' logits rows)
 * directly; other downloads of up to 16 MiB (a logits row, a few) through a
 * pinned staging buffer. */
static void cuda_download(mu_backend *b, void *host_dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx_of(b);
    char err[MUCU_ERR_LEN];
    graph_sync_point(b);
    if (bytes > ((size_t)16 << 20) || mucu_is_pinned(host_dst)) {
        if (!mucu_memcpy(host_dst, src, bytes, "download", err)) die("download", err);
        return;
    }
    if (bytes > c->pinned_cap) {
        size_t cap = c->pinned_cap ? c->pinned_cap : 65536;
        while (cap < bytes) cap *= 2;
        if (!mucu_host_free(c->pinned, err)) die("download", err);
        c->pinned = NULL, c->pinned_cap = 0;
        if (!mucu_host_alloc(&c->pinned, cap, err)) die("download", err);
        c->pinned_cap = cap;
    }
    if (!mucu_memcpy(c->pinned, src, bytes, "download", err)) die("download", err);
    memcpy(host_dst, c->pinned, bytes);
}

static void cuda_zero(mu_backend *b, void *dst, size_t bytes) {
    q8_written_bytes(b, dst, bytes);
    char err[MUCU_ERR_LEN];
    if (!bytes || !go(b, sig_of("zero", 2, P(dst), I(bytes)))) return;
    if (!mucu_zero_async(dst, bytes, err)) die("zero", err);
}

static void *q8_produce(mu_backend *b, const float *x, int64_t n) {
    cuda_ctx *c = ctx_of(b);
    q8_clear(b);
    if (n <= 0 || n % 256) return NULL;
    void *q8 = buf_reserve_c(c, &c->q8, mucu_q8k_bytes(n, 1) + 1, "q8");
    c->q8_x = x;
    c->q8_n = n;
    return q8;
}

/* ------------------------------------------------------------------- ops */

#define CHECK(op, call)                                                                                              \
    do {                                                                                                            \
        char err_[MUCU_ERR_LEN];                                                                                    \
        char *err = err_;                                                                                           \
        if (!(call)) die(op, err_);                                                                                 \
    } while (0)

/* Once, at the first forward: the device and what this process holds on it
 * (weights uploaded so far, KV planes, scratch). */
static void tell_footprint(mu_backend *b) {
    cuda_ctx *c = ctx_of(b);
    if (c->told) return;
    c->told = true;
    size_t free_b = 0, total_b = 0;
    char name[128], err[MUCU_ERR_LEN];
    if (!mucu_mem_info(&free_b, &total_b, name, sizeof name, err)) die("memory info", err);
    fprintf(stderr, "muser: cuda: %s: %.2f GiB of %.2f GiB in use (weights and norms %.2f GiB)\n", name,
            (double)(total_b - free_b) / 1073741824.0, (double)total_b / 1073741824.0,
            (double)c->weight_bytes / 1073741824.0);
}

/* Device memory of `bytes` (zero-filled) at *p, allocated on first use
 * outside any graph forward: the registers below. */
static void *on_first_use(mu_backend *b, void **p, size_t bytes, const char *op) {
    char err[MUCU_ERR_LEN];
    if (!*p) {
        graph_sync_point(b);
        if (!mucu_malloc(p, bytes, err)) die(op, err);
    }
    return *p;
}

/* The chained token's device register: k_chain_pick writes it, the next
 * forward's entry reads it. */
static int32_t *chain_reg(mu_backend *b, const char *op) {
    return on_first_use(b, (void **)&ctx_of(b)->chain_d, mucu_chain_bytes(), op);
}

/* The token registers (backend.h argmax_reg). */
static int32_t *regs_reg(mu_backend *b, const char *op) {
    return on_first_use(b, (void **)&ctx_of(b)->regs_d, MU_TOKEN_REGS * sizeof(int32_t), op);
}

/* The tree registers (backend.h tree_reg). */
static mucu_tree_regs *tree_regs(mu_backend *b, const char *op) {
    return on_first_use(b, (void **)&ctx_of(b)->treg_d, sizeof(mucu_tree_regs), op);
}

/* Whether a forward's ids name token registers (MU_TOKEN_REG). */
static bool has_regs(const int32_t *tokens, int64_t rows) {
    for (int64_t r = 0; r < rows; r++)
        if (tokens[r] <= MU_TOKEN_REG(0)) return true;
    return false;
}

/* Such ids on the device, an op of its own before the entry's: uploaded,
 * then completed from the registers (k_tokens_regs). */
static const int32_t *tokens_regs(mu_backend *b, const int32_t *tokens, int64_t rows, const char *op) {
    int32_t *reg = regs_reg(b, op);
    const bool launch = go(b, sig_of("tokens_regs", 2, I(rows), P(reg)));
    int32_t *t = (int32_t *)upload_arg(b, tokens, (size_t)rows * sizeof *tokens, op);
    if (launch) CHECK(op, mucu_tokens_regs(t, rows, reg, err));
    return t;
}

/* A forward of one row whose token is MU_TOKEN_CHAINED reads it from
 * chain_d, where the last chain_pick left it (no upload: the host does not
 * know it yet). */
static bool is_chained(mu_backend *b, const int32_t *tokens, int64_t rows, const char *op) {
    bool any = false;
    for (int64_t r = 0; r < rows; r++) any |= tokens[r] == MU_TOKEN_CHAINED;
    if (!any) return false;
    if (rows != 1) die(op, "a chained token in a forward of more than one row");
    chain_reg(b, op);
    return true;
}

static void cuda_embed(mu_backend *b, const mu_weight *w, const int32_t *tokens, int64_t rows, float *x) {
    q8_clear(b);
    if (rows <= 0) return;
    mucu_weight d = dev_weight(b, w, "embed", false);
    tell_footprint(b);
    const bool chained = is_chained(b, tokens, rows, "embed");
    const int32_t *t = !chained && has_regs(tokens, rows) ? tokens_regs(b, tokens, rows, "embed") : NULL;
    const bool launch = go(b, sig_of("embed", 5, P(d.data), I(rows), P(x), I(chained), P(t)));
    if (!t) t = chained ? ctx_of(b)->chain_d : upload_arg(b, tokens, (size_t)rows * sizeof *tokens, "embed");
    if (launch) CHECK("embed", mucu_embed(&d, t, rows, x, err));
}

static void cuda_rmsnorm(mu_backend *b, const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows);

/* One launch for the forward's entry (mucu_embed_norm), where the rows fit
 * the row kernels; else the three ops. */
static void cuda_embed_norm(mu_backend *b, const mu_weight *w, const int32_t *tokens, int64_t rows, float eps,
                            const float *w_h, float *x, float *h) {
    const int64_t n = w->n_in;
    if (rows <= 0 || !mucu_residual_ok(n)) {
        cuda_embed(b, w, tokens, rows, x);
        cuda_rmsnorm(b, x, NULL, eps, x, n, rows);
        cuda_rmsnorm(b, x, w_h, eps, h, n, rows);
        return;
    }
    mucu_weight d = dev_weight(b, w, "embed", false);
    tell_footprint(b);
    const float *dwh = dev_bytes(b, w_h, (size_t)n * sizeof *w_h, "embed_norm: norm weight");
    void *q8 = n % 256 == 0 ? q8_produce(b, h, n * rows) : (q8_clear(b), NULL);
    const bool chained = is_chained(b, tokens, rows, "embed_norm");
    /* register ids are looked up by the kernel itself (no k_tokens_regs launch before it) */
    const int32_t *reg = !chained && has_regs(tokens, rows) ? regs_reg(b, "embed_norm") : NULL;
    const bool launch =
        go(b, sig_of("embed_norm", 8, P(d.data), I(rows), F(eps), P(dwh), P(x), P(h), I(chained), P(reg)));
    const int32_t *t =
        chained ? ctx_of(b)->chain_d : upload_arg(b, tokens, (size_t)rows * sizeof *tokens, "embed_norm");
    if (launch) CHECK("embed_norm", mucu_embed_norm(&d, t, reg, rows, eps, x, dwh, h, q8, err));
}

/* After a product wrote y (n floats): the tag no longer holds if y overlaps its values. */
static void q8_written(mu_backend *b, const float *y, int64_t n) {
    if (n > 0 && q8_meets(ctx_of(b), y, (size_t)n * sizeof *y)) q8_clear(b);
}

/* Is the q8 buffer x's quantization, for rows of n_in, of the values as
 * they are or (f16) rounded through f16? */
static bool q8_holds(mu_backend *b, const float *x, int64_t n_in, int64_t rows, bool f16) {
    const cuda_ctx *c = ctx_of(b);
    return c->q8_x && c->q8_x == x && c->q8_n == n_in * rows && c->q8_f16 == f16;
}

/* After a product quantized x itself (rows of n_in): the buffer holds it. */
static void q8_tag(mu_backend *b, const float *x, int64_t n, bool f16) {
    cuda_ctx *c = ctx_of(b);
    c->q8_x = x, c->q8_n = n, c->q8_f16 = f16;
}

/* The scratch of the products that split over their blocks (the largest
 * any of the n weights needs), or NULL when none does. */
static float *gemm_split(mu_backend *b, const mucu_weight *const *d, int n, int64_t rows) {
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        const size_t s = mucu_matmul_split_bytes(d[i], rows);
        if (s > need) need = s;
    }
    return need ? (float *)buf_reserve_c(ctx_of(b), &ctx_of(b)->gsplit, need, "matmul") : NULL;
}

static void cuda_matmul(mu_backend *b, const mu_weight *w, const float *x, float *y, int64_t rows) {
    if (rows <= 0) return;
    mucu_weight d = dev_weight(b, w, "matmul", true);
    const mucu_weight *dp = &d;
    float *sp = gemm_split(b, &dp, 1, rows);
    const bool f16 = mucu_matmul_f16_acts(&d);
    if (mucu_matmul_fast(&d) && q8_holds(b, x, w->n_in, rows, f16)) {
        if (go(b, sig_of("matmul q8", 6, P(d.data), P(x), P(y), I(rows), I(w->n_in), P(sp))))
            CHECK("matmul", mucu_matmul(&d, x, y, rows, ctx_of(b)->q8.p, 1, sp, err));
        q8_written(b, y, rows * w->n_out);
        return;
    }
    q8_clear(b);
    void *q8 = buf_reserve_c(ctx_of(b), &ctx_of(b)->q8, mucu_q8k_bytes(w->n_in, rows) + 1, "matmul");
    if (go(b, sig_of("matmul", 6, P(d.data), P(x), P(y), I(rows), I(w->n_in), P(sp))))
        CHECK("matmul", mucu_matmul(&d, x, y, rows, q8, 0, sp, err));
    if (mucu_matmul_fast(&d)) { /* the buffer now holds x's split quantization */
        q8_tag(b, x, w->n_in * rows, f16);
        q8_written(b, y, rows * w->n_out);
    }
}

/* Weights that read the same rows: the activations are quantized once when
 * every weight takes the fast kernel with the same n_in. */
static void cuda_matmul_multi(mu_backend *b, int n, const mu_weight *const *w, const float *x, float *const *y,
                              int64_t rows) {
    if (rows <= 0) return;
    if (n > 8) { /* a set launch takes 8: the rest reads the quantization the first left */
        cuda_matmul_multi(b, 8, w, x, y, rows);
        cuda_matmul_multi(b, n - 8, w + 8, x, y + 8, rows);
        return;
    }
    bool shared = n > 1;
    mucu_weight d[8];
    for (int i = 0; i < n && shared; i++) {
        if (w[i]->n_in != w[0]->n_in || !cuda_type_ok(w[i]->type)) {
            shared = false;
            break;
        }
        d[i] = dev_weight(b, w[i], "matmul", true);
        /* one quantization for all: the same kind of fast weight (K-quant, NVFP4 ggml, NVFP4 native) */
        shared = mucu_matmul_fast(&d[i]) && mucu_matmul_f16_acts(&d[i]) == mucu_matmul_f16_acts(&d[0]) &&
                 (d[i].fp4_split != 0) == (d[0].fp4_split != 0);
    }
    if (!shared) {
        for (int i = 0; i < n; i++) cuda_matmul(b, w[i], x, y[i], rows);
        return;
    }
    const bool f16 = mucu_matmul_f16_acts(&d[0]);
    const bool have = q8_holds(b, x, w[0]->n_in, rows, f16);
    if (!have) q8_clear(b);
    void *q8 = buf_reserve_c(ctx_of(b), &ctx_of(b)->q8, mucu_q8k_bytes(w[0]->n_in, rows) + 1, "matmul");
    uint64_t sig = sig_of("matmul_multi", 4, P(x), I(rows), I(n), I(have));
    for (int i = 0; i < n; i++) sig = mix64(mix64(sig, P(d[i].data)), P(y[i]));
    const mucu_weight *dp[8];
    for (int i = 0; i < n; i++) dp[i] = &d[i];
    float *sp = gemm_split(b, dp, n, rows);
    sig = mix64(sig, P(sp));
    if (go(b, sig)) CHECK("matmul", mucu_matmul_set(dp, n, x, y, rows, q8, have, sp, err));
    q8_tag(b, x, w[0]->n_in * rows, f16);
    for (int i = 0; i < n; i++) q8_written(b, y[i], rows * w[i]->n_out);
}

static void cuda_rmsnorm(mu_backend *b, const float *x, const float *w, float eps, float *y, int64_t n,
                         int64_t rows) {
    if (rows <= 0) return;
    const float *dw = NULL;
    if (w) dw = dev_bytes(b, w, (size_t)n * sizeof *w, "rmsnorm weight");
    /* the row kernel quantizes rows of whole blocks (mucu_rmsnorm) */
    void *q8 = n % 256 == 0 && mucu_residual_ok(n) ? q8_produce(b, y, n * rows) : (q8_clear(b), NULL);
    if (go(b, sig_of("rmsnorm", 6, P(x), P(dw), F(eps), P(y), I(n), I(rows))))
        CHECK("rmsnorm", mucu_rmsnorm(x, dw, eps, y, n, rows, q8, err));
}

static void cuda_residual_capture(mu_backend *b, float *x, float *o, const float *w_o, float eps_o, float *h,
                                  const float *w_h, float eps_h, int64_t n, int64_t rows, float *cap,
                                  int64_t cap_stride) {
    if (rows <= 0) return;
    if (!mucu_residual_ok(n)) { /* the ops one by one */
        if (w_o) cuda_rmsnorm(b, o, w_o, eps_o, o, n, rows);
        cuda_add(b, x, o, rows * n);
        if (cap) cuda_copy2d(b, cap, (size_t)cap_stride * sizeof *cap, x, (size_t)n * sizeof *x, (size_t)n * sizeof *x, rows);
        if (h) cuda_rmsnorm(b, x, w_h, eps_h, h, n, rows);
        return;
    }
    const float *dwo = w_o ? dev_bytes(b, w_o, (size_t)n * sizeof *w_o, "residual: post-norm weight") : NULL;
    const float *dwh = h ? dev_bytes(b, w_h, (size_t)n * sizeof *w_h, "residual: norm weight") : NULL;
    void *q8 = h && n % 256 == 0 ? q8_produce(b, h, n * rows) : (q8_clear(b), NULL);
    if (go(b, sig_of("residual", 11, P(x), P(o), P(dwo), F(eps_o), P(h), P(dwh), F(eps_h), I(n), I(rows), P(cap),
                     I(cap_stride))))
        CHECK("residual", mucu_residual(x, o, dwo, eps_o, h, dwh, eps_h, n, rows, q8, cap, cap_stride, err));
}

static void cuda_residual(mu_backend *b, float *x, float *o, const float *w_o, float eps_o, float *h, const float *w_h,
                          float eps_h, int64_t n, int64_t rows) {
    cuda_residual_capture(b, x, o, w_o, eps_o, h, w_h, eps_h, n, rows, NULL, 0);
}

static void cuda_kv_store(mu_backend *b, int64_t rows, const mu_kv_dst *dst, const float *k, const float *v);

/* The rows' store destinations as device descriptors, through the argument
 * ring (the planes, rows and slots are data: a replayed graph stores where
 * this step says). */
static const mucu_kv_dst *kv_dst_upload(mu_backend *b, int64_t rows, const mu_kv_dst *dst, const char *op) {
    const int64_t H = dst[0].l->n_head, D = dst[0].l->head_dim;
    mucu_kv_dst one, *desc = rows == 1 ? &one : mu_xmalloc((size_t)rows * sizeof *desc);
    for (int64_t r = 0; r < rows; r++) {
        const mu_kv_dst *d = &dst[r];
        if (d->l->n_head != H || d->l->head_dim != D) die(op, "the rows of one store have different head counts or sizes");
        desc[r] = (mucu_kv_dst){.k = d->l->k, .v = d->l->v, .cap = d->l->cap, .physical = d->physical,
                                .jk = d->jk, .jv = d->jv, .jcap = d->jcap, .slot = d->slot};
    }
    const mucu_kv_dst *p = upload_arg(b, desc, (size_t)rows * sizeof *desc, op);
    if (desc != &one) free(desc);
    return p;
}

static void cuda_qk_norm_rope(mu_backend *b, float *q, const float *wq, int64_t nq, float *k, const float *wk,
                              int64_t nk, int64_t head_dim, float eps, const float *cs, int64_t n_rot, int64_t rows,
                              const mu_kv_dst *dst, const float *v, bool neox) {
    if (dst) { /* the target's K/V store: its planes are never a product's activations, but stay on the safe side */
        q8_clear(b);
    } else if (rows > 0) { /* q and k in place */
        q8_written_bytes(b, q, (size_t)(rows * nq * head_dim) * sizeof *q);
        q8_written_bytes(b, k, (size_t)(rows * nk * head_dim) * sizeof *k);
    }
    if (rows <= 0) return;
    if (!mucu_qk_norm_rope_ok(head_dim, n_rot, neox) || (neox && !ctx_of(b)->qk_neox)) {
        if (nq) cuda_rmsnorm(b, q, wq, eps, q, head_dim, rows * nq);
        cuda_rmsnorm(b, k, wk, eps, k, head_dim, rows * nk);
        if (cs) {
            if (nq) cuda_rope(b, q, nq, head_dim, n_rot, cs, rows, neox);
            cuda_rope(b, k, nk, head_dim, n_rot, cs, rows, neox);
        }
        if (dst) cuda_kv_store(b, rows, dst, k, v);
        return;
    }
    if (dst && (dst[0].l->n_head != nk || dst[0].l->head_dim != head_dim))
        die("qk_norm_rope", "the K/V store's heads differ from k's");
    const float *dq = nq ? dev_bytes(b, wq, (size_t)head_dim * sizeof *wq, "qk_norm_rope: q norm weight") : NULL;
    const float *dk = dev_bytes(b, wk, (size_t)head_dim * sizeof *wk, "qk_norm_rope: k norm weight");
    const bool launch = go(b, sig_of("qk_norm_rope", 14, P(q), P(dq), I(nq), P(k), P(dk), I(nk), I(head_dim), F(eps),
                                     P(cs), I(n_rot), I(rows), P(dst ? v : NULL), I(dst != NULL), I(neox)));
    const mucu_kv_dst *dd = dst ? kv_dst_upload(b, rows, dst, "qk_norm_rope") : NULL;
    if (launch)
        CHECK("qk_norm_rope",
              mucu_qk_norm_rope(q, dq, nq, k, dk, nk, head_dim, eps, cs, n_rot, rows, dd, v, neox, err));
}

static void cuda_rope_table(mu_backend *b, const double *inv_freq, int64_t n_pairs, const int64_t *pos, int64_t rows,
                            float *cs, bool tree_reg) {
    q8_written_bytes(b, cs, rows > 0 && n_pairs > 0 ? (size_t)(rows * n_pairs * 2) * sizeof *cs : 0);
    if (rows <= 0 || n_pairs <= 0) return;
    const int32_t *depth = tree_reg ? tree_regs(b, "rope_table")->depth : NULL;
    const bool launch = go(b, sig_of("rope_table", 4, I(n_pairs), I(rows), P(cs), P(depth)));
    const double *f = upload_arg(b, inv_freq, (size_t)n_pairs * sizeof *inv_freq, "rope_table");
    const int64_t *p = upload_arg(b, pos, (size_t)rows * sizeof *pos, "rope_table");
    if (launch) CHECK("rope_table", mucu_rope_table(f, n_pairs, p, rows, depth, cs, err));
}

static void cuda_rope(mu_backend *b, float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs,
                      int64_t rows, bool neox) {
    q8_written_bytes(b, x, rows > 0 ? (size_t)(rows * n_heads * head_dim) * sizeof *x : 0);
    if (go(b, sig_of("rope", 7, P(x), I(n_heads), I(head_dim), I(n_rot), P(cs), I(rows), I(neox))))
        CHECK("rope", mucu_rope(x, n_heads, head_dim, n_rot, cs, rows, neox, err));
}

/* Each row's destination (planes, physical row, journal slot) travels as a
 * descriptor (kv_dst_upload), so one launch serves rows of several caches. */
static void cuda_kv_store(mu_backend *b, int64_t rows, const mu_kv_dst *dst, const float *k, const float *v) {
    q8_clear(b);
    if (rows <= 0) return;
    const int64_t H = dst[0].l->n_head, D = dst[0].l->head_dim;
    const bool launch = go(b, sig_of("kv_store", 5, I(rows), I(H), I(D), P(k), P(v)));
    const mucu_kv_dst *p = kv_dst_upload(b, rows, dst, "kv_store");
    if (launch) CHECK("kv_store", mucu_kv_store(p, rows, H, D, k, v, err));
}

/* out = attention(q); with g, times sigmoid(g), quantized for the product
 * that reads it next (mucu_attention fuses both into the decode kernels). */
static void attention_op(mu_backend *b, const mu_attn_batch *ab, const float *q, const float *g, float *out) {
    const int64_t n = ab->rows * ab->n_head * ab->head_dim;
    void *q8 = g && n > 0 && n % 256 == 0 ? q8_produce(b, out, n) : (q8_clear(b), NULL);
    if (ab->rows <= 0) return;
    mucu_attn_row one, *desc = ab->rows == 1 ? &one : mu_xmalloc((size_t)ab->rows * sizeof *desc);
    int64_t nbmax = 0;
    bool tree = false;
    const mucu_tree_regs *treg = ab->treg ? tree_regs(b, "attention") : NULL;
    for (int64_t r = 0; r < ab->rows; r++) {
        const mu_kv_layer *l = ab->kv[r];
        int64_t first = mu_kv_first(l);
        const bool reg_row = treg && ab->tree && ab->tree[r].base >= 0;
        if (reg_row && r >= MU_TREE_MAX) die("attention", "a tree register row past the registers");
        if (!reg_row && ab->window > 0 && ab->pos[r] - ab->window + 1 > first) first = ab->pos[r] - ab->window + 1;
        desc[r] = (mucu_attn_row){.k = l->k, .v = l->v, .cap = l->cap, .first = first, .pos = ab->pos[r],
                                  .tbase = INT64_MAX};
        if (reg_row) { /* pos and first only bound the row's keys: the kernels resolve them (mucu_attn_row.treg) */
            desc[r].tbase = ab->tree[r].base;
            desc[r].treg = treg;
            desc[r].window = ab->window;
            tree = true;
        }
        const mu_attn_args row = reg_row ? (mu_attn_args){0} : mu_attn_row(ab, r);
        if (row.tree) { /* its keys past the tree's base: the ancestors', in logical terms (kv.h: row p % cap) */
            desc[r].tbase = row.tree->base;
            for (int64_t t = 0; t <= ab->pos[r] - row.tree->base; t++) desc[r].anc[t] = (int8_t)row.tree->anc[t];
            tree = true;
        }
        const int64_t nb = ab->pos[r] >= first ? (ab->pos[r] - first) / 256 + 1 : 0;
        if (nb > nbmax) nbmax = nb;
    }
    float *part = buf_reserve_c(ctx_of(b), &ctx_of(b)->part,
                                mucu_attn_part_bytes(ab->rows, ab->n_head, ab->head_dim, nbmax) + 16, "attention");
    const bool launch = go(b, sig_of("attention", 11, I(ab->rows), I(ab->n_head), I(ab->n_head_kv), I(ab->head_dim),
                                     F(ab->scale), P(q), P(out), I(nbmax), P(g), I(tree), P(treg)));
    const mucu_attn_row *d = upload_arg(b, desc, (size_t)ab->rows * sizeof *desc, "attention");
    if (desc != &one) free(desc);
    if (launch)
        CHECK("attention", mucu_attention(d, ab->rows, ab->n_head, ab->n_head_kv, ab->head_dim, ab->scale, q, out, part,
                                          nbmax, g, q8, tree, err));
}

static void cuda_attention(mu_backend *b, const mu_attn_batch *ab, const float *q, float *out) {
    attention_op(b, ab, q, NULL, out);
}

static void cuda_attention_gate(mu_backend *b, const mu_attn_batch *ab, const float *q, const float *g, float *out) {
    attention_op(b, ab, q, g, out);
}

static bool cuda_read_bandwidth(mu_backend *b, size_t bytes, int reps, double *gbs) {
    (void)b;
    char msg[MUCU_ERR_LEN];
    return mucu_read_bandwidth(bytes, reps, gbs, msg);
}

static void cuda_sigmoid_gate(mu_backend *b, float *x, const float *g, int64_t n) {
    void *q8 = q8_produce(b, x, n);
    if (go(b, sig_of("sigmoid_gate", 3, P(x), P(g), I(n)))) CHECK("sigmoid_gate", mucu_sigmoid_gate(x, g, n, q8, err));
}

static void cuda_swiglu(mu_backend *b, float *gate, const float *up, int64_t n) {
    void *q8 = q8_produce(b, gate, n);
    if (go(b, sig_of("swiglu", 3, P(gate), P(up), I(n)))) CHECK("swiglu", mucu_swiglu(gate, up, n, q8, err));
}

static void cuda_add(mu_backend *b, float *x, const float *y, int64_t n) {
    q8_clear(b);
    (void)b;
    if (go(b, sig_of("add", 3, P(x), P(y), I(n)))) CHECK("add", mucu_add(x, y, n, err));
}

static void cuda_logit_tail(mu_backend *b, float *logits, float scale, float cap, int64_t n) {
    q8_clear(b);
    (void)b;
    if (go(b, sig_of("logit_tail", 4, P(logits), F(scale), F(cap), I(n))))
        CHECK("logit_tail", mucu_logit_tail(logits, scale, cap, n, err));
}

static void cuda_softmax(mu_backend *b, float *x, float scale, int64_t n, int64_t n_valid, int64_t rows) {
    q8_clear(b);
    (void)b;
    const bool launch = go(b, sig_of("softmax", 4, P(x), F(scale), I(n), I(rows)));
    const int64_t *nv = upload_arg(b, &n_valid, sizeof n_valid, "softmax"); /* data, not part of the launch */
    if (launch) CHECK("softmax", mucu_softmax(x, scale, n, nv, rows, err));
}

static void cuda_argmax(mu_backend *b, const float *x, int64_t n, int64_t rows, int32_t *out) {
    q8_clear(b);
    if (rows <= 0) return;
    graph_sync_point(b); /* the result goes to the host */
    int32_t *d = buf_reserve_c(ctx_of(b), &ctx_of(b)->out, (size_t)rows * sizeof *out, "argmax");
    CHECK("argmax", mucu_argmax(x, n, rows, d, err));
    CHECK("argmax", mucu_memcpy(out, d, (size_t)rows * sizeof *out, "argmax result", err));
}

static void cuda_chain_pick(mu_backend *b, const float *x, int64_t n, int32_t *slot) {
    q8_clear(b);
    if (!mucu_is_pinned(slot)) die("chain_pick", "the slot is not page-locked memory (host_alloc)");
    int32_t *reg = chain_reg(b, "chain_pick");
    const bool launch = go(b, sig_of("chain_pick", 3, P(x), I(n), P(reg)));
    int32_t *const *dslot = upload_arg(b, &slot, sizeof slot, "chain_pick"); /* data: a replay writes its own */
    if (launch) CHECK("chain_pick", mucu_chain_pick(x, n, reg, dslot, err));
}

static void cuda_argmax_reg(mu_backend *b, const float *x, int64_t n, int64_t rows) {
    q8_clear(b);
    if (rows <= 0) return;
    if (rows > MU_TOKEN_REGS) die("argmax_reg", "more rows than token registers");
    int32_t *reg = regs_reg(b, "argmax_reg");
    if (go(b, sig_of("argmax_reg", 4, P(x), I(n), I(rows), P(reg)))) CHECK("argmax_reg", mucu_argmax(x, n, rows, reg, err));
}

static void cuda_pick_rows(mu_backend *b, const float *x, int64_t n, int64_t rows, int n_regs, int32_t *slot) {
    q8_clear(b);
    if (!mucu_is_pinned(slot)) die("pick_rows", "the slot is not page-locked memory (host_alloc)");
    if (n_regs < 0 || n_regs > MU_TOKEN_REGS) die("pick_rows", "more registers than there are");
    int32_t *reg = regs_reg(b, "pick_rows");
    const bool launch = go(b, sig_of("pick_rows", 5, P(x), I(n), I(rows), I(n_regs), P(reg)));
    int32_t *const *dslot = upload_arg(b, &slot, sizeof slot, "pick_rows"); /* data: a replay writes its own */
    if (launch) CHECK("pick_rows", mucu_pick_rows(x, n, rows, n_regs, reg, dslot, err));
}

static void cuda_tree_reg(mu_backend *b, const float *x, int64_t n, int64_t rows, const int32_t *eog, int n_eog,
                          int32_t *slot) {
    q8_clear(b);
    if (!mucu_is_pinned(slot)) die("tree_reg", "the slot is not page-locked memory (host_alloc)");
    if (rows < 0 || rows >= MU_TREE_MAX) die("tree_reg", "more draft rows than a tree takes");
    if (n_eog < 0 || n_eog > 16) die("tree_reg", "more end-of-generation ids than it takes");
    mucu_tree_regs *treg = tree_regs(b, "tree_reg");
    int32_t *reg = regs_reg(b, "tree_reg");
    void *work = on_first_use(b, &ctx_of(b)->tree_work_d, mucu_tree_work_bytes(), "tree_reg");
    const bool launch = go(b, sig_of("tree_reg", 5, P(x), I(n), I(rows), I(n_eog), P(treg)));
    const int32_t eog0 = 0; /* the kernels' pointer stays valid with no ids */
    const int32_t *e = upload_arg(b, n_eog ? eog : &eog0, (size_t)(n_eog ? n_eog : 1) * sizeof *eog, "tree_reg");
    int32_t *const *dslot = upload_arg(b, &slot, sizeof slot, "tree_reg"); /* data: a replay writes its own */
    if (launch) CHECK("tree_reg", mucu_tree_reg(x, n, rows, e, n_eog, work, treg, reg, dslot, err));
}

/* The kernel writes the slot straight into page-locked memory; the host
 * polls it, and asks the stream now and then whether it failed or ended
 * without writing (never a silent hang). */
static bool cuda_chain_wait(mu_backend *b, volatile int32_t *slot, mu_error *err) {
    (void)b;
    char msg[MUCU_ERR_LEN];
    for (unsigned long spin = 0;; spin++) {
        if (slot[1]) return true;
        if (spin % 4096 != 4095) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            continue;
        }
        const int st = mucu_stream_state(msg);
        if (st < 0) {
            mu_err_set(err, "chain_wait: %s", msg);
            return false;
        }
        if (st == 1 && !slot[1]) {
            mu_err_set(err, "chain_wait: the device finished its work without writing the pick");
            return false;
        }
    }
}

/* Below 128 Ki values (glimmer-tiny's 8,192-token rows, up to 16 of them)
 * the host scans what it downloads: a memset, a launch and a round trip
 * for 8 bytes cost more than that (H200: glimmer-tiny tg256 3,506-3,698
 * against 3,747-3,761 tokens/s with every scan here).
 * MUSER_CUDA_SCAN_MIN=N moves the bound (read at every call: the engine
 * test runs its non-finite case with 1, so on the small test model too the
 * scan happens here). */
static int64_t first_nonfinite_min(void) {
    const char *e = getenv("MUSER_CUDA_SCAN_MIN");
    return e && *e ? strtoll(e, NULL, 10) : (int64_t)1 << 17;
}

static int64_t cuda_first_nonfinite(mu_backend *b, const float *x, int64_t n) {
    q8_clear(b);
    if (n <= 0) return n < 0 ? 0 : n;
    if (n < first_nonfinite_min()) return -1;
    graph_sync_point(b); /* the result goes to the host */
    unsigned long long *d = buf_reserve_c(ctx_of(b), &ctx_of(b)->out, sizeof *d, "first_nonfinite");
    unsigned long long v = 0;
    CHECK("first_nonfinite", mucu_first_nonfinite(x, n, d, err));
    CHECK("first_nonfinite", mucu_memcpy(&v, d, sizeof v, "first_nonfinite result", err));
    return n - (int64_t)v;
}

/* Page-locked host memory: download copies into it directly. */
static void *cuda_host_alloc(mu_backend *b, size_t bytes) {
    (void)b;
    void *p = NULL;
    char err[MUCU_ERR_LEN];
    return mucu_host_alloc(&p, bytes, err) ? p : NULL;
}

static void cuda_host_free(mu_backend *b, void *p, size_t bytes) {
    (void)b, (void)bytes;
    CHECK("host_free", mucu_host_free(p, err));
}

static void cuda_store_kv_heads(mu_backend *b, float *kd, float *vd, const int64_t *slots, int64_t S, int64_t D,
                                int64_t n_head, const float *k, const float *v, int64_t rows);

/* One launch where qk_norm_rope's kernel takes the heads (else the two ops). */
static void cuda_qk_norm_rope_heads(mu_backend *b, float *q, const float *wq, int64_t nq, float *k, const float *wk,
                                    int64_t nk, int64_t head_dim, float eps, const float *cs, int64_t n_rot,
                                    int64_t rows, bool neox, float *kd, float *vd, const int64_t *slots, int64_t S,
                                    const float *v) {
    if (rows <= 0) return;
    if (!mucu_qk_norm_rope_ok(head_dim, n_rot, neox) || (neox && !ctx_of(b)->qk_neox)) {
        cuda_qk_norm_rope(b, q, wq, nq, k, wk, nk, head_dim, eps, cs, n_rot, rows, NULL, NULL, neox);
        cuda_store_kv_heads(b, kd, vd, slots, S, head_dim, nk, k, v, rows);
        return;
    }
    const size_t plane = (size_t)(nk * S * head_dim) * sizeof(float);
    q8_written_bytes(b, q, (size_t)(rows * nq * head_dim) * sizeof *q);
    q8_written_bytes(b, k, (size_t)(rows * nk * head_dim) * sizeof *k);
    q8_written_bytes(b, kd, plane);
    q8_written_bytes(b, vd, plane);
    const float *dq = nq ? dev_bytes(b, wq, (size_t)head_dim * sizeof *wq, "qk_norm_rope: q norm weight") : NULL;
    const float *dk = dev_bytes(b, wk, (size_t)head_dim * sizeof *wk, "qk_norm_rope: k norm weight");
    const bool launch = go(b, sig_of("qk_norm_rope_heads", 16, P(q), P(dq), I(nq), P(k), P(dk), I(nk), I(head_dim),
                                     F(eps), P(cs), I(n_rot), I(rows), P(v), I(neox), P(kd), P(vd), I(S)));
    const int64_t *s = upload_arg(b, slots, (size_t)rows * sizeof *slots, "qk_norm_rope_heads");
    const mucu_heads_dst hd = {kd, vd, s, S};
    if (launch)
        CHECK("qk_norm_rope_heads",
              mucu_qk_norm_rope_heads(q, dq, nq, k, dk, nk, head_dim, eps, cs, n_rot, rows, hd, v, neox, err));
}

static void cuda_store_kv_heads_layers(mu_backend *b, float *kd, float *vd, int64_t plane_stride,
                                       const int64_t *slots, int64_t S, int64_t D, int64_t n_head, const float *k,
                                       const float *v, int64_t src_stride, int64_t rows, int64_t n_layers) {
    const size_t plane = (size_t)(n_head * S * D) * sizeof(float);
    for (int64_t l = 0; l < n_layers; l++) {
        q8_written_bytes(b, kd + l * plane_stride, plane);
        q8_written_bytes(b, vd + l * plane_stride, plane);
    }
    if (rows <= 0 || n_layers <= 0) return;
    const bool launch = go(b, sig_of("store_kv_heads_layers", 11, P(kd), P(vd), I(plane_stride), I(S), I(D),
                                     I(n_head), P(k), P(v), I(src_stride), I(rows), I(n_layers)));
    const int64_t *s = upload_arg(b, slots, (size_t)rows * sizeof *slots, "store_kv_heads_layers");
    if (launch)
        CHECK("store_kv_heads_layers", mucu_store_kv_heads_layers(kd, vd, plane_stride, s, S, D, n_head, k, v,
                                                                  src_stride, rows, n_layers, err));
}

/* One layer: the layers' kernel with n_layers 1. */
static void cuda_store_kv_heads(mu_backend *b, float *kd, float *vd, const int64_t *slots, int64_t S, int64_t D,
                                int64_t n_head, const float *k, const float *v, int64_t rows) {
    cuda_store_kv_heads_layers(b, kd, vd, 0, slots, S, D, n_head, k, v, 0, rows, 1);
}

static void cuda_dense_attention(mu_backend *b, const float *q, int64_t rows, int64_t n_head, int64_t n_head_kv,
                                 int64_t D, const float *k, const float *v, int64_t slots, int64_t n_keys,
                                 int64_t n_valid, float scale, float *out) {
    const int64_t n = rows * n_head * D;
    /* the output quantized for the product after it, where the kernel does it */
    void *q8 = n > 0 && mucu_dense_attention_quantizes(n_head, n_head_kv, D, v, slots, n_keys) ? q8_produce(b, out, n)
                                                                                              : (q8_clear(b), NULL);
    if (rows <= 0) return;
    const bool launch = go(b, sig_of("dense_attention", 11, P(q), I(rows), I(n_head), I(n_head_kv), I(D), P(k), P(v),
                                     I(slots), I(n_keys), F(scale), P(out)));
    const int64_t *nv = upload_arg(b, &n_valid, sizeof n_valid, "dense_attention"); /* data, not part of the launch */
    if (launch)
        CHECK("dense_attention",
              mucu_dense_attention(q, rows, n_head, n_head_kv, D, k, v, slots, n_keys, nv, scale, out, q8, err));
}

/* Load time: upload each weight once (the host bytes stay as they are). */
static bool cuda_wants_repack(mu_backend *b, const mu_weight *w) {
    if (cuda_type_ok(w->type) && w->layout == MU_LAYOUT_ROWS) (void)dev_weight(b, w, "load", true);
    return false;
}

/* Load time: each norm vector once too (backend.h: hold). */
static void cuda_hold(mu_backend *b, const float *v, int64_t n) {
    (void)dev_bytes(b, v, (size_t)n * sizeof *v, "load: norm vector");
}

/* Never reached: cuda_wants_repack always answers false. */
static void cuda_repack(mu_backend *b, mu_weight *w, uint8_t *data) { (void)b, (void)w, (void)data; }

static void cuda_destroy(mu_backend *b) {
    cuda_ctx *c = ctx_of(b);
    char err[MUCU_ERR_LEN];
    for (size_t i = 0; i < c->cap_copies; i++)
        if (c->copies[i].host) (void)mucu_free(c->copies[i].dev, err);
    (void)mucu_host_free(c->ring_base, err);
    (void)mucu_free(c->chain_d, err);
    (void)mucu_free(c->regs_d, err);
    (void)mucu_free(c->treg_d, err);
    (void)mucu_free(c->tree_work_d, err);
    (void)mucu_host_free(c->pinned, err);
    (void)mucu_free(c->ring_d, err);
    (void)mucu_free(c->out.p, err);
    (void)mucu_free(c->part.p, err);
    (void)mucu_free(c->gsplit.p, err);
    (void)mucu_free(c->q8.p, err);
    (void)mucu_free(c->tmp.p, err);
    if (c->cache)
        for (int i = 0; i < G_CACHE; i++) entry_clear(&c->cache[i]);
    free(c->cache);
    for (int i = 0; i < c->n_deferred; i++) (void)mucu_free(c->deferred[i], err);
    free(c->deferred);
    for (int i = 0; i < MUCU_RING_PARTS; i++) mucu_mark_free(c->part_ev[i]);
    mucu_mark_free(c->fwd_done);
    mucu_mark_free(c->st.ev[0]), mucu_mark_free(c->st.ev[1]);
    if (c->st.on && c->st.n > 1) {
        const double k = 1e6 / (double)c->st.n, k1 = 1e6 / (double)(c->st.n - 1);
        fprintf(stderr,
                "muser: cuda step times, %ld replays (us a step): period %.1f = host before the launch %.1f + "
                "launch call %.1f + waiting for the graph %.1f + host after it %.1f; the graph on the GPU "
                "(events around it) %.1f\n",
                c->st.n, c->st.period * k1, c->st.walk * k, c->st.launch * k, c->st.wait * k, c->st.after * k1,
                c->st.gpu * k);
    }
    if (getenv("MUSER_CUDA_GRAPH_STATS")) {
        long flat = 0, prog = 0, merged = 0;
        mucu_graph_chain_stats(&flat, &prog, &merged);
        fprintf(stderr,
                "muser: cuda graphs: %ld captured, %ld replayed, %ld left (replay mismatch or sync); %ld flat, "
                "%ld programmatic kernel edges, %ld argument copies merged; %ld forwards began with the one before "
                "in flight (%.1f us each waiting for the one before that)\n",
                c->n_captured, c->n_replayed, c->n_bailed, flat, prog, merged, c->n_ahead,
                c->n_ahead ? c->ahead_wait * 1e6 / (double)c->n_ahead : 0.0);
    }
    free(c->copies);
    free(c);
    free(b);
    mucu_trace_end();
}

mu_backend *mu_backend_cuda_create(int n_threads, mu_error *err) {
    (void)n_threads;
    char msg[MUCU_ERR_LEN];
    int n = 0;
    if (!mucu_device_count(&n, msg)) {
        mu_err_set(err, "%s", msg);
        return NULL;
    }
    mucu_trace_begin(); /* MUSER_CUDA_TRACE: before the first launch */
    mu_backend *b = mu_xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->ctx = mu_xcalloc(1, sizeof(cuda_ctx));
    ((cuda_ctx *)b->ctx)->graphs = -1; /* decided at the first forward (environment) */
    ((cuda_ctx *)b->ctx)->bail_at = -1;
    b->n_threads = 1;
    b->destroy = cuda_destroy;
    b->alloc = cuda_alloc;
    b->free = cuda_free;
    b->copy = cuda_copy;
    b->copy2d = cuda_copy2d;
    b->upload = cuda_upload;
    b->download = cuda_download;
    b->zero = cuda_zero;
    b->embed = cuda_embed;
    b->matmul = cuda_matmul;
    b->matmul_multi = cuda_matmul_multi;
    b->rmsnorm = cuda_rmsnorm;
    b->rope_table = cuda_rope_table;
    b->rope = cuda_rope;
    b->kv_store = cuda_kv_store;
    b->attention = cuda_attention;
    b->trees = true;
    /* 2,048-row prompt chunks: pp2048 4,679 against 4,121-4,144 tokens/s in 512-row chunks (H100;
     * docs/benchmarks.md "Switches and what they are worth"): the products' grids fill more waves */
    b->prefill_rows = 2048;
    b->sigmoid_gate = cuda_sigmoid_gate;
    b->swiglu = cuda_swiglu;
    b->add = cuda_add;
    b->logit_tail = cuda_logit_tail;
    b->softmax = cuda_softmax;
    b->argmax = cuda_argmax;
    b->first_nonfinite = cuda_first_nonfinite;
    b->host_alloc = cuda_host_alloc;
    b->host_free = cuda_host_free;
    b->store_kv_heads = cuda_store_kv_heads;
    b->store_kv_heads_layers = cuda_store_kv_heads_layers;
    b->chain_pick = cuda_chain_pick;
    b->chain_wait = cuda_chain_wait;
    b->argmax_reg = cuda_argmax_reg;
    b->copy2d_many = cuda_copy2d_many;
    b->pick_rows = cuda_pick_rows;
    /* MUSER_CUDA_TREE_REG=0: token trees drawn on the host; MUSER_CUDA_QK_NEOX=0:
     * the assistant's q/k norms and NeoX rotations as separate launches
     * (comparisons: docs/cuda.md "Speculative decoding on the GPU") */
    if (!opt_out("MUSER_CUDA_TREE_REG")) b->tree_reg = cuda_tree_reg;
    ctx_of(b)->qk_neox = !opt_out("MUSER_CUDA_QK_NEOX");
    const char *rp = getenv("MUSER_CUDA_RING_PARTS");
    const int parts = rp && *rp ? atoi(rp) : 2; /* 4: the greedy chain +0.7 %, speculation -1 % (docs/cuda.md) */
    ctx_of(b)->parts = parts < 2 ? 2 : parts > MUCU_RING_PARTS ? MUCU_RING_PARTS : parts;
    ctx_of(b)->q8_keep = !opt_out("MUSER_CUDA_Q8_KEEP");
    b->residual = cuda_residual;
    /* MUSER_CUDA_FUSED_CAPTURE=0: captures copied after the residual step (measurements) */
    if (!opt_out("MUSER_CUDA_FUSED_CAPTURE")) b->residual_capture = cuda_residual_capture;
    b->qk_norm_rope = cuda_qk_norm_rope;
    /* MUSER_CUDA_QK_HEADS=0: the assistant's norms and K/V stores as two launches (measurements) */
    if (!opt_out("MUSER_CUDA_QK_HEADS")) b->qk_norm_rope_heads = cuda_qk_norm_rope_heads;
    /* MUSER_CUDA_FUSE=0: the forward's entry and the gate as separate ops (measurements) */
    if (!opt_out("MUSER_CUDA_FUSE")) {
        b->attention_gate = cuda_attention_gate;
        b->embed_norm = cuda_embed_norm;
    }
    b->dense_attention = cuda_dense_attention;
    b->read_bandwidth = cuda_read_bandwidth;
    b->forward_begin = cuda_forward_begin;
    b->forward_end = cuda_forward_end;
    b->wants_repack = cuda_wants_repack;
    b->repack = cuda_repack; /* mu_repack_weights asks wants_repack only when both are set */
    b->hold = cuda_hold;
    return b;
}

#endif
