/* MUSER_CUDA_TRACE=1: every kernel's start and end as the GPU saw them
 * (CUPTI's activity records, kernels inside replayed graphs included), and
 * at exit a table per kernel: calls, time, the gap before it (from the
 * end of everything that started earlier; negative where a programmatic
 * launch overlapped its predecessor), and the time it adds (how far its end
 * lies past the end of everything that started earlier: its share of the
 * time the GPU was busy, the table's order). MUSER_CUDA_TRACE_CSV=path also writes
 * one line per kernel (start_ns,end_ns,graph_id,name) for a timeline.
 * Why: the device machine has no Nsight Systems, and Nsight Compute times
 * each kernel alone with cold caches and fixed clocks; this shows where a
 * decode step's time goes with graphs and programmatic launches on
 * (docs/cuda.md "Tests"). libcupti is opened at run time (MUSER_CUPTI_LIB
 * names it where the default paths do not find it), so nothing links
 * against it and builds without its header simply have no tracer. */
#ifdef MUSER_HAVE_CUDA
#include "backend/cuda/cuda_trace.h"
#include "util/common.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MUSER_HAVE_CUPTI
#include <cupti_activity.h>
#include <dlfcn.h>

typedef CUptiResult (*fn_register)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*fn_enable)(CUpti_ActivityKind);
typedef CUptiResult (*fn_flush)(uint32_t);
typedef CUptiResult (*fn_next)(uint8_t *, size_t, CUpti_Activity **);

typedef struct krec {
    uint64_t start, end;
    uint32_t graph, name; /* name: index into names */
} krec;

static struct {
    bool on;
    fn_next next;
    fn_flush flush;
    krec *rec;
    size_t n, cap;
    const char **names; /* interned kernel names (CUPTI's strings, copied) */
    const char **keys;  /* CUPTI's pointers, for the lookup */
    size_t n_names, cap_names;
} T;

enum { BUF_BYTES = 8 << 20, REC_MAX = 1 << 24 };

static uint32_t name_id(const char *p) {
    for (size_t i = T.n_names; i-- > 0;)
        if (T.keys[i] == p) return (uint32_t)i;
    if (T.n_names == T.cap_names) {
        T.cap_names = T.cap_names ? 2 * T.cap_names : 256;
        T.names = mu_xrealloc(T.names, T.cap_names * sizeof *T.names);
        T.keys = mu_xrealloc(T.keys, T.cap_names * sizeof *T.keys);
    }
    T.keys[T.n_names] = p;
    T.names[T.n_names] = mu_xstrdup(p ? p : "?");
    return (uint32_t)T.n_names++;
}

static void CUPTIAPI buf_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUF_BYTES);
    *size = *buffer ? BUF_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (T.next(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || T.n >= REC_MAX) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (T.n == T.cap) {
            T.cap = T.cap ? 2 * T.cap : 65536;
            T.rec = mu_xrealloc(T.rec, T.cap * sizeof *T.rec);
        }
        T.rec[T.n++] = (krec){.start = k->start, .end = k->end, .graph = k->graphId, .name = name_id(k->name)};
    }
    free(buffer);
}

static void *open_cupti(void) {
    const char *env = getenv("MUSER_CUPTI_LIB");
    const char *paths[] = {env, "libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                           "/usr/local/cuda/lib64/libcupti.so", "/usr/local/cuda/lib/libcupti.so"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        if (!paths[i] || !*paths[i]) continue;
        void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

void mucu_trace_begin(void) {
    const char *e = getenv("MUSER_CUDA_TRACE");
    if (T.on || !e || !*e || !strcmp(e, "0")) return;
    void *h = open_cupti();
    fn_register reg = h ? (fn_register)dlsym(h, "cuptiActivityRegisterCallbacks") : NULL;
    fn_enable en = h ? (fn_enable)dlsym(h, "cuptiActivityEnable") : NULL;
    T.flush = h ? (fn_flush)dlsym(h, "cuptiActivityFlushAll") : NULL;
    T.next = h ? (fn_next)dlsym(h, "cuptiActivityGetNextRecord") : NULL;
    if (!reg || !en || !T.flush || !T.next) {
        fprintf(stderr, "muser: cuda trace: libcupti not found or incomplete (%s); set MUSER_CUPTI_LIB\n",
                h ? "missing functions" : dlerror());
        return;
    }
    if (reg(buf_requested, buf_completed) != CUPTI_SUCCESS ||
        en(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "muser: cuda trace: CUPTI refused the kernel activity records\n");
        return;
    }
    T.on = true;
}

static int by_start(const void *a, const void *b) {
    const krec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

typedef struct kstat {
    uint32_t name;
    uint64_t calls;
    double busy, gap, adds; /* ns */
} kstat;

static int by_adds(const void *a, const void *b) {
    const kstat *x = a, *y = b;
    return x->adds < y->adds ? 1 : x->adds > y->adds ? -1 : 0;
}

void mucu_trace_end(void) {
    if (!T.on) return;
    T.on = false;
    T.flush(1); /* CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: the buffers not yet full too */
    if (!T.n) {
        fprintf(stderr, "muser: cuda trace: no kernel records\n");
        return;
    }
    qsort(T.rec, T.n, sizeof *T.rec, by_start);
    const char *csv = getenv("MUSER_CUDA_TRACE_CSV");
    FILE *f = csv && *csv ? fopen(csv, "w") : NULL;
    if (csv && *csv && !f) fprintf(stderr, "muser: cuda trace: cannot write %s\n", csv);
    if (f) fprintf(f, "start_ns,end_ns,graph_id,name\n");
    kstat *st = mu_xcalloc(T.n_names, sizeof *st);
    uint64_t horizon = T.rec[0].start, busy_union = 0;
    double gaps = 0;
    for (size_t i = 0; i < T.n; i++) {
        const krec *r = &T.rec[i];
        kstat *s = &st[r->name];
        s->name = r->name;
        s->calls++;
        s->busy += (double)(r->end - r->start);
        const double gap = (double)r->start - (double)horizon; /* from the end of all that started before */
        if (i) s->gap += gap;
        if (i && gap > 0) gaps += gap;
        const uint64_t from = r->start > horizon ? r->start : horizon;
        if (r->end > from) busy_union += r->end - from, s->adds += (double)(r->end - from);
        if (r->end > horizon) horizon = r->end;
        if (f) fprintf(f, "%llu,%llu,%u,%s\n", (unsigned long long)r->start, (unsigned long long)r->end, r->graph,
                       T.names[r->name]);
    }
    if (f) fclose(f);
    const double span = (double)(horizon - T.rec[0].start);
    fprintf(stderr,
            "muser: cuda trace: %zu kernels over %.3f ms: the GPU ran some kernel %.3f ms, none %.3f ms (gaps)\n"
            "%-56s %8s %10s %9s %11s %12s\n",
            T.n, span / 1e6, (double)busy_union / 1e6, gaps / 1e6, "kernel", "calls", "total ms", "mean us",
            "gap mean us", "adds mean us");
    qsort(st, T.n_names, sizeof *st, by_adds);
    for (size_t i = 0; i < T.n_names && st[i].calls; i++)
        fprintf(stderr, "%-56.56s %8llu %10.3f %9.2f %11.2f %12.2f\n", T.names[st[i].name],
                (unsigned long long)st[i].calls, st[i].busy / 1e6, st[i].busy / 1e3 / (double)st[i].calls,
                st[i].gap / 1e3 / (double)st[i].calls, st[i].adds / 1e3 / (double)st[i].calls);
    free(st);
}

#else /* no CUPTI header at build time */
void mucu_trace_begin(void) {
    const char *e = getenv("MUSER_CUDA_TRACE");
    if (e && *e && strcmp(e, "0"))
        fprintf(stderr, "muser: cuda trace: this build has no CUPTI (cupti_activity.h was not found)\n");
}
void mucu_trace_end(void) {}
#endif
#endif
