/* CUDA kernels of the cuda backend, v0: exact first. Each kernel is the
 * device twin of a scalar reference (src/backend/ref/ref_ops.c,
 * src/backend/host_ops.c, src/quant/*.c, src/util/mumath.c) and performs
 * the same operations in the same order (docs/numerics.md). Built with
 * -fmad=false -prec-div=true -prec-sqrt=true -ftz=false (CMakeLists.txt),
 * so every product and sum rounds where the reference rounds and every
 * fused multiply-add is an explicit fmaf/fma. One thread per output (row
 * dot, norm row, attention head): speed is not the goal of v0 (docs/cuda.md). */
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_prefill.h"
#include "backend/cuda/cuda_attn.h"
#include "backend/cuda/cuda_mmt.h"
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Every kernel and copy of a forward goes to one stream, g_s (blocking: it
 * orders with the legacy stream that synchronous copies use), so a forward
 * can be captured into a CUDA graph (cuda_backend.c). Created with the
 * first device query. */
static cudaStream_t g_s;

/* ---------------------------------------------------------------- errors */

static bool cu_ok(cudaError_t e, const char *call, const char *what, char *err) {
    if (e == cudaSuccess) return true;
    snprintf(err, MUCU_ERR_LEN, "%s failed (%s): %s (%s)", call, what, cudaGetErrorString(e), cudaGetErrorName(e));
    return false;
}

/* After a launch: the launch itself (an asynchronous fault surfaces at the
 * next synchronizing call, which names itself; MUSER_CUDA_SYNC=1 makes every
 * launch wait for its kernel so a fault names the kernel that caused it). */
static int sync_each = -1; /* MUSER_CUDA_SYNC=1: synchronize after every kernel (debugging) */
/* MUSER_CUDA_PROF=1: GPU time per kernel name, reported at exit. An event is
 * recorded after every launch without waiting, so the host runs ahead as it
 * does normally; a kernel's time is the interval from the previous event
 * (the previous kernel's end, or the last synchronizing call) to its own,
 * i.e. its run time plus any gap before it. Synchronizing calls (copies to
 * the host) start a new interval after them: the GPU's idle time while
 * the host samples is not booked, the host's time to issue the next kernel
 * is (to that kernel). */
static int prof_on = 0;
enum { PROF_NAMES = 64, PROF_EVENTS = 4096 };
static struct prof_entry {
    const char *name;
    long n;
    double ms;
} prof_tab[PROF_NAMES];
static cudaEvent_t prof_ev[PROF_EVENTS], prof_origin;
static const char *prof_evname[PROF_EVENTS];
static int prof_n, prof_ready;

static void prof_add(const char *name, double ms) {
    int i = 0;
    while (i < PROF_NAMES - 1 && prof_tab[i].name && strcmp(prof_tab[i].name, name)) i++;
    prof_tab[i].name = name;
    prof_tab[i].n++;
    prof_tab[i].ms += ms;
}

/* Wait for the recorded events and book their intervals. */
static void prof_flush(void) {
    if (!prof_ready || !prof_n) return;
    cudaEventSynchronize(prof_ev[prof_n - 1]);
    cudaEvent_t prev = prof_origin;
    for (int i = 0; i < prof_n; i++) {
        float ms = 0;
        cudaEventElapsedTime(&ms, prev, prof_ev[i]);
        prof_add(prof_evname[i], ms);
        prev = prof_ev[i];
    }
    cudaEventRecord(prof_origin, g_s);
    prof_n = 0;
}

/* A synchronizing call happened: book what is pending, restart from now. */
static void prof_mark(void) {
    if (!prof_ready) return;
    prof_flush();
    cudaEventRecord(prof_origin, g_s);
}

static void prof_report(void) {
    prof_flush();
    double total = 0;
    for (int i = 0; i < PROF_NAMES && prof_tab[i].name; i++) total += prof_tab[i].ms;
    fprintf(stderr, "muser: cuda profile (GPU time per kernel, gaps before it included):\n");
    for (int i = 0; i < PROF_NAMES && prof_tab[i].name; i++)
        fprintf(stderr, "  %-26s %9ld calls %10.3f ms %8.2f us/call %5.1f%%\n", prof_tab[i].name, prof_tab[i].n,
                prof_tab[i].ms, 1e3 * prof_tab[i].ms / (double)prof_tab[i].n,
                total > 0 ? 100.0 * prof_tab[i].ms / total : 0.0);
}

static bool launched(const char *kernel, char *err) {
    if (!cu_ok(cudaGetLastError(), "kernel launch", kernel, err)) return false;
    if (sync_each < 0) {
        const char *e = getenv("MUSER_CUDA_SYNC");
        sync_each = e && *e && strcmp(e, "0") ? 1 : 0;
        e = getenv("MUSER_CUDA_PROF");
        prof_on = e && *e && strcmp(e, "0") ? 1 : 0;
        if (prof_on) {
            for (int i = 0; i < PROF_EVENTS; i++) cudaEventCreate(&prof_ev[i]);
            cudaEventCreate(&prof_origin);
            cudaEventRecord(prof_origin, g_s);
            prof_ready = 1;
            atexit(prof_report);
        }
    }
    if (prof_ready) {
        if (prof_n == PROF_EVENTS) prof_flush();
        prof_evname[prof_n] = kernel;
        cudaEventRecord(prof_ev[prof_n++], g_s);
    }
    if (!sync_each) return true;
    return cu_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after kernel", kernel, err);
}

static unsigned grid_for(int64_t n, unsigned block) { return (unsigned)((n + block - 1) / block); }

#define LAUNCH(kernel, n, ...)                                                                                       \
    do {                                                                                                            \
        if ((n) <= 0) return true;                                                                                  \
        kernel<<<grid_for((n), 128), 128, 0, g_s>>>(__VA_ARGS__);                                                           \
        return launched(#kernel, err);                                                                              \
    } while (0)

/* ------------------------------------------------------- memory wrappers */

extern "C" bool mucu_device_count(int *n, char *err) {
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(n);
    if (e != cudaSuccess) {
        snprintf(err, MUCU_ERR_LEN, "no CUDA device: cudaGetDeviceCount returned %d (%s: %s)", (int)e,
                 cudaGetErrorName(e), cudaGetErrorString(e));
        *n = 0;
        return false;
    }
    if (*n == 0) {
        snprintf(err, MUCU_ERR_LEN, "no CUDA device: cudaGetDeviceCount returned 0 devices");
        return false;
    }
    return g_s || cu_ok(cudaStreamCreate(&g_s), "cudaStreamCreate", "the backend's stream", err);
}

extern "C" bool mucu_malloc(void **p, size_t bytes, char *err) {
    *p = NULL;
    if (!cu_ok(cudaMalloc(p, bytes ? bytes : 1), "cudaMalloc", "backend alloc", err)) {
        *p = NULL;
        return false;
    }
    return cu_ok(cudaMemset(*p, 0, bytes ? bytes : 1), "cudaMemset", "zero-filled alloc", err);
}

extern "C" bool mucu_free(void *p, char *err) { return !p || cu_ok(cudaFree(p), "cudaFree", "backend free", err); }

extern "C" bool mucu_memcpy(void *dst, const void *src, size_t bytes, const char *what, char *err) {
    const bool ok = !bytes || cu_ok(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy", what, err);
    prof_mark();
    return ok;
}

extern "C" bool mucu_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                              char *err) {
    if (!rows || !width) return true;
    return cu_ok(cudaMemcpy2D(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault), "cudaMemcpy2D", "copy2d",
                 err);
}

/* Device to device, in the backend's stream (no host wait; capturable). */
extern "C" bool mucu_copy_async(void *dst, const void *src, size_t bytes, char *err) {
    return !bytes || cu_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_s), "cudaMemcpyAsync",
                           "device copy", err);
}

extern "C" bool mucu_copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                                  char *err) {
    if (!rows || !width) return true;
    return cu_ok(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, g_s),
                 "cudaMemcpy2DAsync", "copy2d", err);
}

extern "C" bool mucu_zero_async(void *dst, size_t bytes, char *err) {
    return !bytes || cu_ok(cudaMemsetAsync(dst, 0, bytes, g_s), "cudaMemsetAsync", "zero", err);
}

/* ------------------------------------------------------------- graphs */

extern "C" bool mucu_capture_begin(char *err) {
    return cu_ok(cudaStreamBeginCapture(g_s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture", "graph", err);
}

extern "C" bool mucu_capture_end(void **graph, char *err) {
    cudaGraph_t g = NULL;
    *graph = NULL;
    if (!cu_ok(cudaStreamEndCapture(g_s, &g), "cudaStreamEndCapture", "graph", err)) return false;
    *graph = g;
    return true;
}

/* MUSER_CUDA_PDL: 1 (default) the chained graph is flat and every kernel
 * after a kernel depends on it programmatically (it starts once all of
 * its predecessor's blocks have started, grid_dep_wait in
 * cuda_common.cuh); 2 flat with full dependencies only; 0 the segments as
 * child graphs, one after another. */
static int g_pdl = -1;
/* MUSER_CUDA_PDL_BIG=N (default 1000; 0: none): an ordinary edge into
 * every kernel of N or more CTAs, programmatic edges elsewhere. Why: a
 * programmatic edge cost plain reads 12 % against an ordinary one
 * (test_cuda_backend --bench-chain), and a kernel of many CTAs gains
 * little from starting early: its first wave waits for SMs the kernel
 * before still holds. Full model decode on an H100 with k_mmv6 at 4
 * outputs a unit: 135.7-136.4 tokens/s at 1000 (500: 136.0), 131.2-132.0
 * at 0 and at 3,000 or more; k_mmv4: 125.9 at 1000 against 124.2. */
static int g_pdl_big = -1;
static long g_flat, g_prog, g_merged;
/* MUSER_CUDA_ONE_UPLOAD: 1 a flat chain uploads the argument
 * ring's bytes with one copy at its head instead of one copy node before
 * each op that uploaded arguments (2 per layer of a decode step: the K/V
 * destinations and the attention rows); 0 keeps the per-op copies. Why: a
 * copy node between two kernels is a full dependency on both sides (no
 * programmatic launch across it) plus a copy engine's round trip. The
 * bytes are the same: a graph is launched only after the host has written
 * all of its forward's arguments (cuda_backend.c, forward_end), and no
 * kernel writes the ring. 2 (default): that one upload is a kernel
 * (k_ring_upload) reading the page-locked ring where it lies, not a copy
 * engine's copy: on glimmer-tiny's greedy chain the gap between two steps'
 * graphs went from about 15 to 6 us (H200).
 * Either way the first kernel after it depends on it fully: kernels read
 * uploaded arguments before their grid_dep_wait. */
static int g_one_upload = -1;

__global__ static void k_ring_upload(uint4 *d, const uint4 *h, int64_t n16) {
    grid_dep_wait(); /* a graph's head: no programmatic predecessor, so it returns at once */
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n16) d[i] = __ldcv(h + i); /* host memory: never a cached copy of an earlier step's bytes */
}

/* The ring's upload at the head of a flat chain: a copy node, or with
 * MUSER_CUDA_ONE_UPLOAD=2 a k_ring_upload node (from host copy h). */
static cudaError_t ring_upload_node(cudaGraphNode_t *node, cudaGraph_t g, const mucu_ring *ring, const void *h,
                                    bool set) {
    if (g_one_upload != 2) {
        return set ? cudaGraphMemcpyNodeSetParams1D(*node, ring->d, h, ring->used, cudaMemcpyHostToDevice)
                   : cudaGraphAddMemcpyNode1D(node, g, NULL, 0, ring->d, h, ring->used, cudaMemcpyHostToDevice);
    }
    void *d = ring->d;
    int64_t n16 = (int64_t)(ring->used / 16);
    void *args[] = {&d, (void *)&h, &n16};
    cudaKernelNodeParams p;
    memset(&p, 0, sizeof p);
    p.func = (void *)k_ring_upload;
    p.gridDim = dim3((unsigned)((n16 + 255) / 256));
    p.blockDim = dim3(256);
    p.kernelParams = args;
    return set ? cudaGraphKernelNodeSetParams(*node, &p) : cudaGraphAddKernelNode(node, g, NULL, 0, &p);
}

extern "C" void mucu_graph_chain_stats(long *flat, long *programmatic, long *merged) {
    *flat = g_flat, *programmatic = g_prog, *merged = g_merged;
}

/* The segments' nodes copied into g in order, each depending on the one
 * before. A segment captured from one stream is a chain; anything else
 * (or a node type not copied here) is an error, and the caller falls back
 * to child graphs. */
static bool in_range(const void *p, const void *base, size_t bytes) {
    return base && (const char *)p >= (const char *)base && (const char *)p < (const char *)base + bytes;
}

/* A copy node of the argument ring (host ring -> device ring, 1-D). */
static bool ring_copy(const cudaMemcpy3DParms &p, const mucu_ring *ring) {
    if (!ring || !ring->used || p.extent.height > 1 || p.extent.depth > 1 || p.srcArray || p.dstArray) return false;
    const char *src = (const char *)p.srcPtr.ptr + p.srcPos.x, *dst = (const char *)p.dstPtr.ptr + p.dstPos.x;
    return in_range(src, ring->h, ring->used) && in_range(dst, ring->d, ring->used) &&
           src + p.extent.width <= (const char *)ring->h + ring->used && src - (const char *)ring->h == dst - (const char *)ring->d;
}

static bool chain_flat(cudaGraph_t g, void *const *graphs, int n, bool pdl, const mucu_ring *ring, int *n_prog,
                       int *n_merged, char *err) {
    cudaGraphNode_t prev = NULL;
    bool prev_kernel = false;
    *n_prog = 0;
    *n_merged = 0;
    if (ring && ring->used) { /* the whole ring's used bytes first (MUSER_CUDA_ONE_UPLOAD) */
        bool odd = ring->used % 16 || (uintptr_t)ring->h % 16;
        for (int i = 0; i < MUCU_RING_PARTS - 1; i++) odd |= (uintptr_t)ring->more[i] % 16 != 0;
        if (odd) {
            snprintf(err, MUCU_ERR_LEN, "graph flatten: the argument ring is not in 16-byte pieces");
            return false;
        }
        if (!cu_ok(ring_upload_node(&prev, g, ring, ring->h, false), "the ring's upload node", "graph flatten", err))
            return false;
    }
    for (int i = 0; i < n; i++) {
        cudaGraph_t s = (cudaGraph_t)graphs[i];
        size_t nr = 0;
        if (!cu_ok(cudaGraphGetRootNodes(s, NULL, &nr), "cudaGraphGetRootNodes", "graph flatten", err)) return false;
        if (nr == 0) continue;
        cudaGraphNode_t node = NULL;
        if (nr != 1) {
            snprintf(err, MUCU_ERR_LEN, "graph flatten: segment %d has %zu root nodes, not a chain", i, nr);
            return false;
        }
        if (!cu_ok(cudaGraphGetRootNodes(s, &node, &nr), "cudaGraphGetRootNodes", "graph flatten", err)) return false;
        while (node) {
            cudaGraphNodeType ty;
            cudaGraphNode_t nn = NULL;
            cudaError_t e = cudaGraphNodeGetType(node, &ty);
            const bool kernel = ty == cudaGraphNodeTypeKernel;
            uint64_t ctas = 0;
            if (e == cudaSuccess && kernel) {
                cudaKernelNodeParams p;
                e = cudaGraphKernelNodeGetParams(node, &p);
                ctas = (uint64_t)p.gridDim.x * p.gridDim.y * p.gridDim.z;
                if (e == cudaSuccess) e = cudaGraphAddKernelNode(&nn, g, NULL, 0, &p);
            } else if (e == cudaSuccess && ty == cudaGraphNodeTypeMemcpy) {
                cudaMemcpy3DParms p;
                e = cudaGraphMemcpyNodeGetParams(node, &p);
                if (e == cudaSuccess && ring_copy(p, ring)) (*n_merged)++; /* uploaded at the head: no node */
                else if (e == cudaSuccess) e = cudaGraphAddMemcpyNode(&nn, g, NULL, 0, &p);
            } else if (e == cudaSuccess && ty == cudaGraphNodeTypeMemset) {
                cudaMemsetParams p;
                e = cudaGraphMemsetNodeGetParams(node, &p);
                if (e == cudaSuccess) e = cudaGraphAddMemsetNode(&nn, g, NULL, 0, &p);
            } else if (e == cudaSuccess && ty == cudaGraphNodeTypeEmpty) {
                e = cudaGraphAddEmptyNode(&nn, g, NULL, 0);
            } else if (e == cudaSuccess) {
                snprintf(err, MUCU_ERR_LEN, "graph flatten: segment %d holds a node of type %d", i, (int)ty);
                return false;
            }
            if (!cu_ok(e, "copying a node", "graph flatten", err)) return false;
            if (nn && prev) {
                cudaGraphEdgeData ed;
                memset(&ed, 0, sizeof ed);
                if (pdl && prev_kernel && kernel && !(g_pdl_big > 0 && ctas >= (uint64_t)g_pdl_big)) {
                    ed.from_port = cudaGraphKernelNodePortLaunchCompletion;
                    ed.type = cudaGraphDependencyTypeProgrammatic;
                    (*n_prog)++;
                }
                if (!cu_ok(cudaGraphAddDependencies(g, &prev, &nn, &ed, 1), "cudaGraphAddDependencies", "graph flatten",
                           err))
                    return false;
            }
            if (nn) prev = nn, prev_kernel = kernel;
            size_t nd = 0;
            if (!cu_ok(cudaGraphNodeGetDependentNodes(node, NULL, NULL, &nd), "cudaGraphNodeGetDependentNodes",
                       "graph flatten", err))
                return false;
            if (nd > 1) {
                snprintf(err, MUCU_ERR_LEN, "graph flatten: segment %d branches (%zu dependents)", i, nd);
                return false;
            }
            if (nd == 0) break;
            if (!cu_ok(cudaGraphNodeGetDependentNodes(node, &node, NULL, &nd), "cudaGraphNodeGetDependentNodes",
                       "graph flatten", err))
                return false;
        }
    }
    return true;
}

/* One executable graph running the given graphs one after another. */
extern "C" bool mucu_graph_chain(void *const *graphs, int n, const mucu_ring *ring, void **exec, char *err) {
    cudaGraph_t g = NULL;
    for (int i = 0; i < MUCU_RING_PARTS; i++) exec[i] = NULL;
    env_setting(&g_pdl, "MUSER_CUDA_PDL", 1);
    env_setting(&g_pdl_big, "MUSER_CUDA_PDL_BIG", 1000);
    env_setting(&g_one_upload, "MUSER_CUDA_ONE_UPLOAD", 2);
    bool flat = false;
    if (g_pdl) {
        static int warned;
        int n_prog = 0, n_merged = 0;
        char why[MUCU_ERR_LEN];
        if (!cu_ok(cudaGraphCreate(&g, 0), "cudaGraphCreate", "graph chain", err)) return false;
        flat = chain_flat(g, graphs, n, g_pdl == 1, g_one_upload ? ring : NULL, &n_prog, &n_merged, why);
        if (flat) {
            g_flat++, g_prog += n_prog, g_merged += n_merged;
        } else {
            cudaGraphDestroy(g);
            if (!warned++) fprintf(stderr, "muser: cuda graphs: not flattened (%s); chaining segments\n", why);
        }
    }
    if (!flat) {
        if (!cu_ok(cudaGraphCreate(&g, 0), "cudaGraphCreate", "graph chain", err)) return false;
        cudaGraphNode_t prev = NULL;
        for (int i = 0; i < n; i++) {
            cudaGraphNode_t node;
            if (!cu_ok(cudaGraphAddChildGraphNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, (cudaGraph_t)graphs[i]),
                       "cudaGraphAddChildGraphNode", "graph chain", err)) {
                cudaGraphDestroy(g);
                return false;
            }
            prev = node;
        }
    }
    cudaGraphExec_t e[MUCU_RING_PARTS] = {NULL};
    bool ok = cu_ok(cudaGraphInstantiate(&e[0], g, 0), "cudaGraphInstantiate", "graph chain", err);
    for (int i = 0; ok && flat && g_one_upload && ring && ring->used && i < MUCU_RING_PARTS - 1 && ring->more[i]; i++) {
        /* the head node is the ring's upload (chain_flat): the same graph from another part */
        size_t nr = 0;
        cudaGraphNode_t head = NULL;
        ok = cu_ok(cudaGraphGetRootNodes(g, NULL, &nr), "cudaGraphGetRootNodes", "graph chain", err) && nr == 1 &&
             cu_ok(cudaGraphGetRootNodes(g, &head, &nr), "cudaGraphGetRootNodes", "graph chain", err) &&
             cu_ok(ring_upload_node(&head, g, ring, ring->more[i], true), "the ring's upload node", "graph chain", err) &&
             cu_ok(cudaGraphInstantiate(&e[i + 1], g, 0), "cudaGraphInstantiate", "graph chain", err);
        if (!ok && nr != 1) snprintf(err, MUCU_ERR_LEN, "graph chain: %zu root nodes, not the ring's upload", nr);
    }
    cudaGraphDestroy(g);
    for (int i = 0; i < MUCU_RING_PARTS; i++) {
        if (!ok && e[i]) cudaGraphExecDestroy(e[i]);
        exec[i] = ok ? e[i] : NULL;
    }
    return ok;
}

extern "C" bool mucu_graph_instantiate(void *graph, void **exec, char *err) {
    cudaGraphExec_t e = NULL;
    *exec = NULL;
    if (!cu_ok(cudaGraphInstantiate(&e, (cudaGraph_t)graph, 0), "cudaGraphInstantiate", "graph", err)) return false;
    *exec = e;
    return true;
}

extern "C" bool mucu_graph_launch(void *exec, char *err) {
    return cu_ok(cudaGraphLaunch((cudaGraphExec_t)exec, g_s), "cudaGraphLaunch", "graph", err);
}

extern "C" void mucu_graph_free(void *graph) {
    if (graph) cudaGraphDestroy((cudaGraph_t)graph);
}

extern "C" void mucu_exec_free(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

/* An event after the work enqueued so far, and waiting for it. */
extern "C" bool mucu_mark(void **ev, char *err) {
    if (!*ev) {
        cudaEvent_t e;
        if (!cu_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", "mark", err)) return false;
        *ev = e;
    }
    return cu_ok(cudaEventRecord((cudaEvent_t)*ev, g_s), "cudaEventRecord", "mark", err);
}

/* An event of mucu_mark / mucu_mark_timed, destroyed (NULL: nothing). */
extern "C" void mucu_mark_free(void *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

/* A timing event after the work enqueued so far (MUSER_CUDA_STEP_TIMES),
 * and the ms between two such events once the second has happened. */
extern "C" bool mucu_mark_timed(void **ev, char *err) {
    if (!*ev) {
        cudaEvent_t e;
        if (!cu_ok(cudaEventCreate(&e), "cudaEventCreate", "step timer", err)) return false;
        *ev = e;
    }
    return cu_ok(cudaEventRecord((cudaEvent_t)*ev, g_s), "cudaEventRecord", "step timer", err);
}

extern "C" bool mucu_elapsed_ms(void *e0, void *e1, double *ms, char *err) {
    float f = 0.0f;
    if (!cu_ok(cudaEventSynchronize((cudaEvent_t)e1), "cudaEventSynchronize", "step timer", err) ||
        !cu_ok(cudaEventElapsedTime(&f, (cudaEvent_t)e0, (cudaEvent_t)e1), "cudaEventElapsedTime", "step timer", err))
        return false;
    *ms = f;
    return true;
}

extern "C" bool mucu_mark_wait(void *ev, char *err) {
    return !ev || cu_ok(cudaEventSynchronize((cudaEvent_t)ev), "cudaEventSynchronize", "mark", err);
}

extern "C" bool mucu_memset0(void *dst, size_t bytes, char *err) {
    return !bytes || cu_ok(cudaMemset(dst, 0, bytes), "cudaMemset", "zero", err);
}

extern "C" bool mucu_host_alloc(void **p, size_t bytes, char *err) {
    *p = NULL;
    if (!cu_ok(cudaHostAlloc(p, bytes ? bytes : 1, cudaHostAllocDefault), "cudaHostAlloc", "pinned staging", err)) {
        *p = NULL;
        return false;
    }
    return true;
}

extern "C" bool mucu_host_free(void *p, char *err) {
    return !p || cu_ok(cudaFreeHost(p), "cudaFreeHost", "pinned staging", err);
}

extern "C" bool mucu_upload_async(void *dst, const void *pinned_src, size_t bytes, const char *what, char *err) {
    return !bytes || cu_ok(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, g_s), "cudaMemcpyAsync", what,
                           err);
}

extern "C" bool mucu_sync(const char *what, char *err) {
    const bool ok = cu_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize", what, err);
    prof_mark();
    return ok;
}

extern "C" bool mucu_mem_info(size_t *free_b, size_t *total_b, char *name, size_t name_len, char *err) {
    int dev = 0;
    cudaDeviceProp prop;
    if (!cu_ok(cudaGetDevice(&dev), "cudaGetDevice", "memory info", err)) return false;
    if (!cu_ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties", "memory info", err)) return false;
    snprintf(name, name_len, "%s", prop.name);
    return cu_ok(cudaMemGetInfo(free_b, total_b), "cudaMemGetInfo", "memory info", err);
}

/* Device read bandwidth: a read-only reduction over `bytes` of device
 * memory (bench.c compares decode against it). */
__global__ static void k_read_sum(const uint4 *p, size_t n, unsigned *out) {
    grid_dep_wait();
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *out = acc; /* keeps the loads */
}

extern "C" bool mucu_read_bandwidth(size_t bytes, int reps, double *gbs, char *err) {
    void *buf = NULL, *out = NULL;
    *gbs = 0;
    if (!mucu_malloc(&buf, bytes, err) || !mucu_malloc(&out, 64, err)) {
        (void)cudaGetLastError(); /* an out-of-memory must not surface at the next launch's check */
        if (buf) mucu_free(buf, err);
        return false;
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const size_t n = bytes / 16;
    float best_ms = 1e30f;
    for (int i = 0; i < reps + 1; i++) {
        cudaEventRecord(e0, g_s);
        k_read_sum<<<132 * 16, 512, 0, g_s>>>((const uint4 *)buf, n, (unsigned *)out);
        cudaEventRecord(e1, g_s);
        if (!cu_ok(cudaEventSynchronize(e1), "cudaEventSynchronize", "k_read_sum", err)) return false;
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0 && ms < best_ms) best_ms = ms; /* the first run warms up */
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    *gbs = (double)(n * 16) / (best_ms * 1e-3) / 1e9;
    return mucu_free(buf, err) && mucu_free(out, err);
}

extern "C" bool mucu_is_device(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* ------------------------------------------- bits, halves (util/common.c) */

__device__ static inline double bits_f64(uint64_t u) { return __longlong_as_double((long long)u); }
__device__ static inline uint64_t f64_bits(double d) { return (uint64_t)__double_as_longlong(d); }

__device__ static uint16_t f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7FFFFFFFu;
    if (absx >= 0x7F800000u) {
        if (absx == 0x7F800000u) return sign | 0x7C00;
        return sign | 0x7E00 | (uint16_t)((absx >> 13) & 0x3FF);
    }
    if (absx >= 0x477FF000u) return sign | 0x7C00;
    if (absx < 0x38800000u) {
        if (absx < 0x33000000u) return sign;
        uint32_t exp = absx >> 23;
        uint32_t mant = (absx & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - exp;
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t q = (absx >> 13) - ((127 - 15) << 10);
    uint32_t rem = absx & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return sign | (uint16_t)q;
}

__device__ static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return bits_f32(sign);
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

__device__ static inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
__device__ static inline uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
__device__ static inline float rd_f16(const uint8_t *p) { return f16_to_f32(rd16(p)); }

/* ------------------------------------------------ engine math (mumath.c) */

__device__ static float d_tanhf(float x) {
    if (x != x) return x + x;
    uint32_t bits = f32_bits(x);
    uint32_t sign = bits & 0x80000000u;
    float ax = bits_f32(bits & 0x7FFFFFFFu);
    if (ax == 0.0f) return x;
    if (ax < 0.875f) {
        float x2 = x * x;
        float g = fmaf(0x1.8f3b5ep-13f, x2, -0x1.1621f2p-10f);
        g = fmaf(g, x2, 0x1.b8c95ep-9f);
        g = fmaf(g, x2, -0x1.1fe3f4p-7f);
        g = fmaf(g, x2, 0x1.661216p-6f);
        g = fmaf(g, x2, -0x1.ba18c4p-5f);
        g = fmaf(g, x2, 0x1.11110ap-3f);
        g = fmaf(g, x2, -0x1.555556p-2f);
        return fmaf(x * x2, g, x);
    }
    float t = 1.0f;
    if (ax <= 0x1.233334p+3f) t = 1.0f - 2.0f / (d_expf(2.0f * ax) + 1.0f);
    return bits_f32(f32_bits(t) | sign);
}

__device__ static inline void two_sum(double a, double b, double *s, double *e) {
    double sum = a + b;
    double b_virtual = sum - a;
    double a_virtual = sum - b_virtual;
    *s = sum;
    *e = (a - a_virtual) + (b - b_virtual);
}

__device__ static double sin_kernel(double y, double y_lo) {
    const double S[10] = {
        -0x1.5555555555555p-3, 0x1.1111111111111p-7, -0x1.a01a01a01a01ap-13,
        0x1.71de3a556c734p-19, -0x1.ae64567f544e4p-26, 0x1.6124613a86d09p-33,
        -0x1.ae7f3e733b81fp-41, 0x1.952c77030ad4ap-49, -0x1.2f49b46814157p-57,
        0x1.71b8ef6dcf572p-66,
    };
    double z = y * y;
    double s = S[9];
    for (int i = 8; i >= 0; i--) s = fma(s, z, S[i]);
    return y + (y * z * s + y_lo * (1.0 - 0.5 * z));
}

__device__ static double cos_kernel(double y, double y_lo) {
    const double C[10] = {
        0x1.5555555555555p-5, -0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-16,
        -0x1.27e4fb7789f5cp-22, 0x1.1eed8eff8d898p-29, -0x1.93974a8c07c9dp-37,
        0x1.ae7f3e733b81fp-45, -0x1.6827863b97d97p-53, 0x1.e542ba4020225p-62,
        -0x1.0ce396db7f853p-70,
    };
    double z = y * y, z_err = fma(y, y, -z);
    double c = C[9];
    for (int i = 8; i >= 0; i--) c = fma(c, z, C[i]);
    double hz = 0.5 * z;
    double w = 1.0 - hz;
    double w_err = (1.0 - w) - hz;
    return w + ((w_err - 0.5 * z_err) + (z * z * c - y * y_lo));
}

__device__ static int reduce_pio2(double x, double *y, double *y_lo) {
    const double PIO2_1 = 0x1.921fb54442d18p+0, PIO2_2 = 0x1.1a62633145c07p-54, PIO2_3 = -0x1.f1976b7ed8fbcp-110;
    double n_d = (x * 0x1.45f306dc9c883p-1 + 0x1.8p52) - 0x1.8p52;
    double r1 = fma(-n_d, PIO2_1, x);
    double t = n_d * PIO2_2, t_err = fma(n_d, PIO2_2, -t);
    double hi, lo;
    two_sum(r1, -t, &hi, &lo);
    lo -= t_err + n_d * PIO2_3;
    two_sum(hi, lo, y, y_lo);
    return (int)((int64_t)n_d & 3);
}

__device__ static double d_trig(double x, int want_cos) {
    if (x != x) return x + x;
    uint64_t abs_bits = f64_bits(x) & 0x7FFFFFFFFFFFFFFFull;
    if (abs_bits >= 0x7FF0000000000000ull) return bits_f64(0x7FF8000000000000ull);
    double ax = bits_f64(abs_bits);
    if (ax >= 0x1p30) return bits_f64(0x7FF8000000000000ull);
    if (ax < 0x1p-27) return want_cos ? 1.0 : x;
    double y = x, y_lo = 0.0;
    int quadrant = 0;
    if (ax > 0x1.921fb54442d18p-1) quadrant = reduce_pio2(x, &y, &y_lo);
    quadrant = (quadrant + want_cos) & 3;
    switch (quadrant) {
    case 0: return sin_kernel(y, y_lo);
    case 1: return cos_kernel(y, y_lo);
    case 2: return -sin_kernel(y, y_lo);
    default: return -cos_kernel(y, y_lo);
    }
}

/* ------------------------------------------ minifloats (quant/minifloat.c) */

__device__ static float e2m1_to_f32(uint8_t code) {
    const float V[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return V[code & 0xF];
}

__device__ static int32_t e2m1_q1(uint8_t code) {
    const int32_t Q[8] = {0, 1, 2, 3, 4, 6, 8, 12};
    int32_t m = Q[code & 7];
    return (code & 8) ? -m : m;
}

__device__ static uint8_t e2m1_magnitude_code(float a, float s) {
    if (a <= s * 0.25f) return 0;
    if (a < s * 0.75f) return 1;
    if (a <= s * 1.25f) return 2;
    if (a < s * 1.75f) return 3;
    if (a <= s * 2.5f) return 4;
    if (a < s * 3.5f) return 5;
    if (a <= s * 5.0f) return 6;
    return 7;
}

__device__ static float e4m3_magnitude(uint8_t b) {
    uint32_t e = (b >> 3) & 0xF, m = b & 7;
    if (e == 0) return (float)m * (1.0f / 512.0f);
    return bits_f32(((e + 120) << 23) | (m << 20));
}

__device__ static float e4m3fn_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80) << 24;
    if ((b & 0x7F) == 0x7F) return bits_f32(sign | 0x7FC00000u);
    return bits_f32(sign | f32_bits(e4m3_magnitude(b)));
}

__device__ static int32_t e4m3fn_q9(uint8_t b) {
    int32_t e = (b >> 3) & 0xF, m = b & 7;
    int32_t mag = e == 0 ? m : (8 + m) << (e - 1);
    return (b & 0x80) ? -mag : mag;
}

__device__ static inline int32_t nearest_magic(float v) {
    float t = v + 12582912.0f;
    return (int32_t)(f32_bits(t) & 0x7FFFFF) - 0x400000;
}

__device__ static uint8_t e4m3fn_from_f32(float f) {
    uint32_t bits = f32_bits(f);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    uint32_t abits = bits & 0x7FFFFFFFu;
    if (abits > 0x7F800000u) return 0x7F;
    float a = bits_f32(abits);
    if (a >= 448.0f) return sign | 0x7E;
    if (a < 0.015625f) return sign | (uint8_t)nearest_magic(a * 512.0f);
    uint32_t exp = (abits >> 23) - 127 + 7;
    uint32_t code = (exp << 3) | ((abits >> 20) & 7);
    uint32_t rest = abits & 0xFFFFF, half = 0x80000;
    if (rest > half || (rest == half && (code & 1))) code++;
    return sign | (uint8_t)code;
}

__device__ static float ue4m3_to_f32(uint8_t b) {
    if (b == 0x00 || b == 0x7F) return 0.0f;
    return e4m3_magnitude(b & 0x7F);
}

__device__ static int32_t ue4m3_q9(uint8_t b) {
    if (b == 0x00 || b == 0x7F) return 0;
    int32_t e = (b >> 3) & 0xF, m = b & 7;
    return e == 0 ? m : (8 + m) << (e - 1);
}

/* ----------------------------------------- per-element dequantization */

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30,
    T_NVFP4 = 40, T_NVFP4_NATIVE = 1000,
};

/* K-quant 6-bit scale/min pair j of a Q4_K/Q5_K block (quant_internal.h). */
__device__ static void scale_min_k4(const uint8_t *s, int j, int32_t *sc, int32_t *m) {
    if (j < 4) {
        *sc = s[j] & 0x3F;
        *m = s[j + 4] & 0x3F;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K/Q5_K code of value k (0..255) of a block (kquants.c q4k/q5k_codes). */
__device__ static int32_t q45k_code(const uint8_t *blk, int k, bool q5) {
    int g = k / 64, w = k % 64, l = w % 32, hi = w >= 32;
    const uint8_t *qs = blk + (q5 ? 48 : 16);
    int32_t c = hi ? qs[32 * g + l] >> 4 : qs[32 * g + l] & 0xF;
    if (q5) c |= ((blk[16 + l] >> (2 * g + hi)) & 1) << 4;
    return c;
}

/* Q6_K code (value - 32) of value k of a block (kquants.c q6k_codes). */
__device__ static int32_t q6k_code(const uint8_t *blk, int k) {
    int h = k / 128, w = k % 128, part = w / 32, l = w % 32;
    const uint8_t *L = blk + 64 * h, *H = blk + 128 + 32 * h;
    int32_t c;
    switch (part) {
    case 0: c = (L[l] & 0xF) | (((H[l] >> 0) & 3) << 4); break;
    case 1: c = (L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4); break;
    case 2: c = (L[l] >> 4) | (((H[l] >> 4) & 3) << 4); break;
    default: c = (L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4); break;
    }
    return c - 32;
}

/* Value i of a weight row, as the type's dequantize writes it (before the
 * ggml `.scale` epilogue; native NVFP4 includes scale2). */
__device__ static float dequant_elem(const mucu_weight &w, const uint8_t *row, const uint8_t *srow, int64_t i) {
    switch (w.type) {
    case T_F32: {
        const uint8_t *p = row + 4 * i;
        return bits_f32((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
    }
    case T_F16: return f16_to_f32(rd16(row + 2 * i));
    case T_BF16: return bits_f32((uint32_t)rd16(row + 2 * i) << 16);
    case T_Q4_0: {
        const uint8_t *blk = row + (i / 32) * 18;
        int j = (int)(i % 32);
        int32_t code = j < 16 ? (blk[2 + j] & 0xF) - 8 : (blk[2 + j - 16] >> 4) - 8;
        return (float)code * rd_f16(blk);
    }
    case T_Q8_0: {
        const uint8_t *blk = row + (i / 32) * 34;
        return (float)(int8_t)blk[2 + i % 32] * rd_f16(blk);
    }
    case T_Q4_K:
    case T_Q5_K: {
        bool q5 = w.type == T_Q5_K;
        const uint8_t *blk = row + (i / 256) * (q5 ? 176 : 144);
        int k = (int)(i % 256);
        int32_t sc, m;
        scale_min_k4(blk + 4, k / 32, &sc, &m);
        const float d = rd_f16(blk), dmin = rd_f16(blk + 2);
        const float dj = d * (float)sc, mj = dmin * (float)m;
        return dj * (float)q45k_code(blk, k, q5) - mj;
    }
    case T_Q6_K: {
        const uint8_t *blk = row + (i / 256) * 210;
        int k = (int)(i % 256);
        const float d = rd_f16(blk + 208);
        return (d * (float)(int8_t)blk[192 + k / 16]) * (float)q6k_code(blk, k);
    }
    case T_NVFP4: {
        const uint8_t *blk = row + (i / 64) * 36;
        int k = (int)(i % 64), s = k / 16, t = k % 16;
        uint8_t byte = blk[4 + 8 * s + t % 8];
        return e2m1_to_f32(t < 8 ? byte & 0xF : byte >> 4) * ue4m3_to_f32(blk[s]);
    }
    case T_NVFP4_NATIVE: {
        uint8_t code = (i & 1) ? row[i / 2] >> 4 : row[i / 2] & 0xF;
        return (e2m1_to_f32(code) * e4m3fn_to_f32(srow[i / 16])) * w.scale;
    }
    }
    return __int_as_float(0x7FC00000);
}

/* Element i of token tok's embedding row. */
__device__ static inline float embed_value(const mucu_weight &w, int64_t tok, int64_t i) {
    const bool native = w.type == T_NVFP4_NATIVE;
    const uint8_t *row = w.data + (native ? tok * (w.n_in / 2) : (int64_t)((uint64_t)tok * w.row_bytes));
    const uint8_t *srow = native ? w.scales + tok * (w.n_in / 16) : NULL;
    float v = dequant_elem(w, row, srow, i);
    if (!native && w.has_scale) v = v * w.scale;
    return v;
}

__global__ static void k_embed(mucu_weight w, const int32_t *tokens, int64_t rows, float *x) {
    grid_dep_wait();
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * w.n_in) return;
    x[t] = embed_value(w, tokens[t / w.n_in], t % w.n_in);
}

/* ------------------------------------------------ Q8_K activations (q8k.c) */

struct q8k_block {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};
static_assert(sizeof(q8k_block) == 292, "Q8_K block must match the ggml layout");

__global__ static void k_quantize_q8k(const float *x, q8k_block *y, int64_t n_blocks, bool via_f16) {
    grid_dep_wait();
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const float *src = x + b * 256;
    q8k_block *o = y + b;
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 256; i++) {
        float xi = via_f16 ? round_f16(src[i]) : src[i];
        float a = fabsf(xi);
        if (a > amax) {
            amax = a;
            max = xi;
        }
    }
    if (amax == 0.0f) {
        o->d = 0.0f;
        for (int i = 0; i < 256; i++) o->qs[i] = 0;
        for (int k = 0; k < 16; k++) o->bsums[k] = 0;
        return;
    }
    const float iscale = -127.0f / max;
    for (int i = 0; i < 256; i++) {
        float xi = via_f16 ? round_f16(src[i]) : src[i];
        float t = fmaf(iscale, xi, 12582912.0f);
        int32_t q = (int32_t)(f32_bits(t) & 0x7FFFFF) - 0x400000;
        o->qs[i] = (int8_t)(q < 127 ? q : 127);
    }
    for (int k = 0; k < 16; k++) {
        int32_t s = 0;
        for (int i = 0; i < 16; i++) s += o->qs[16 * k + i];
        o->bsums[k] = (int16_t)s;
    }
    o->d = 1.0f / iscale;
}

/* ---------------------------------------- block dots (legacy, kquants, nvfp4) */

__device__ static float dot_q4_0(const uint8_t *blk, const q8k_block *x) {
    float acc = 0.0f;
    for (int j = 0; j < 8; j++, blk += 18) {
        int32_t isum = 0;
        for (int i = 0; i < 16; i++) {
            isum += ((blk[2 + i] & 0xF) - 8) * x->qs[32 * j + i];
            isum += ((blk[2 + i] >> 4) - 8) * x->qs[32 * j + 16 + i];
        }
        acc = acc + (rd_f16(blk) * x->d) * (float)isum;
    }
    return acc;
}

__device__ static float dot_q8_0(const uint8_t *blk, const q8k_block *x) {
    float acc = 0.0f;
    for (int j = 0; j < 8; j++, blk += 34) {
        int32_t isum = 0;
        for (int i = 0; i < 32; i++) isum += (int8_t)blk[2 + i] * x->qs[32 * j + i];
        acc = acc + (rd_f16(blk) * x->d) * (float)isum;
    }
    return acc;
}

__device__ static float dot_q45_k(const uint8_t *blk, const q8k_block *x, bool q5) {
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        int32_t sc, m, isum = 0;
        scale_min_k4(blk + 4, j, &sc, &m);
        for (int i = 32 * j; i < 32 * j + 32; i++) isum += q45k_code(blk, i, q5) * x->qs[i];
        sumi += sc * isum;
        summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    const float d = rd_f16(blk), dmin = rd_f16(blk + 2);
    return (d * x->d) * (float)sumi - (dmin * x->d) * (float)summ;
}

__device__ static float dot_q6_k(const uint8_t *blk, const q8k_block *x) {
    int32_t sumi = 0;
    for (int s = 0; s < 16; s++) {
        int32_t isum = 0;
        for (int i = 16 * s; i < 16 * s + 16; i++) isum += q6k_code(blk, i) * x->qs[i];
        sumi += (int8_t)blk[192 + s] * isum;
    }
    return (rd_f16(blk + 208) * x->d) * (float)sumi;
}

__device__ static float dot_nvfp4_ggml(const uint8_t *blk, const q8k_block *x) {
    int64_t itotal = 0;
    for (int b = 0; b < 4; b++, blk += 36)
        for (int s = 0; s < 4; s++) {
            const int8_t *q = x->qs + 64 * b + 16 * s;
            int32_t dot = 0;
            for (int j = 0; j < 8; j++) {
                const uint8_t byte = blk[4 + 8 * s + j];
                dot += e2m1_q1(byte & 0xF) * q[j];
                dot += e2m1_q1(byte >> 4) * q[j + 8];
            }
            itotal += (int64_t)dot * ue4m3_q9(blk[s]);
        }
    return ((float)itotal * 0x1p-10f) * x->d;
}

__device__ static float dot_nvfp4_native(const uint8_t *payload, const uint8_t *scales, const q8k_block *x) {
    int64_t itotal = 0;
    for (int g = 0; g < 16; g++) {
        int32_t dot = 0;
        for (int p = 0; p < 8; p++) {
            const uint8_t byte = payload[8 * g + p];
            dot += e2m1_q1(byte & 0xF) * x->qs[16 * g + 2 * p];
            dot += e2m1_q1(byte >> 4) * x->qs[16 * g + 2 * p + 1];
        }
        itotal += (int64_t)dot * e4m3fn_q9(scales[g]);
    }
    return ((float)itotal * 0x1p-10f) * x->d;
}

/* W4A4 (nvfp4.c mu_nvfp4_w4a4_dot): activations quantized per 16 here. */
__device__ static float dot_w4a4(const uint8_t *payload, const uint8_t *scales, float scale2, float inv,
                                 const float *x, int64_t n) {
    int64_t sum = 0;
    for (int64_t g = 0; g < n / 16; g++) {
        float r[16], amax = 0.0f;
        for (int i = 0; i < 16; i++) {
            r[i] = round_f16(x[16 * g + i]);
            amax = fmaxf(amax, fabsf(r[i]));
        }
        const uint8_t asb = e4m3fn_from_f32(fminf((amax * 0x1.555556p-3f) * inv, 448.0f));
        const float s = e4m3fn_to_f32(asb);
        int32_t dot = 0;
        for (int i = 0; i < 16; i++) {
            uint8_t acode = ((f32_bits(r[i]) >> 31) ? 8 : 0) | (s != 0.0f ? e2m1_magnitude_code(fabsf(r[i]) * inv, s) : 0);
            const uint8_t byte = payload[8 * g + i / 2];
            const uint8_t wcode = (i & 1) ? byte >> 4 : byte & 0xF;
            dot += e2m1_q1(wcode) * e2m1_q1(acode);
        }
        sum += (int64_t)dot * e4m3fn_q9(scales[g]) * e4m3fn_q9(asb);
    }
    float s = (float)sum * 0x1p-20f;
    s = s * scale2;
    s = s * (1.0f / inv);
    return round_f16(s);
}

/* mu_weight_dot_row (quant/weight_row.c), one thread per (row, output). */
__global__ static void k_matmul(mucu_weight w, const float *x, const q8k_block *xq, float *y, int64_t rows) {
    grid_dep_wait();
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * w.n_out) return;
    const int64_t r = t / w.n_out, o = t % w.n_out, nb = w.n_in / 256;
    const float *xr = x + r * w.n_in;
    const q8k_block *xqr = xq ? xq + r * nb : NULL;
    if (w.type == T_NVFP4_NATIVE) {
        const uint8_t *payload = w.data + o * (w.n_in / 2), *scales = w.scales + o * (w.n_in / 16);
        if (w.input_scale_inv > 0.0f) {
            y[t] = dot_w4a4(payload, scales, w.scale, w.input_scale_inv, xr, w.n_in);
            return;
        }
        float total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            float f = dot_nvfp4_native(payload + b * 128, scales + b * 16, xqr + b);
            f = f * w.scale;
            total = total + f;
        }
        y[t] = round_f16(total);
        return;
    }
    const uint8_t *row = w.data + (uint64_t)o * w.row_bytes;
    float total;
    if (w.type == T_F32 || w.type == T_F16 || w.type == T_BF16) {
        float p[32];
        for (int l = 0; l < 32; l++) p[l] = 0.0f;
        for (int64_t i = 0; i < w.n_in; i++) p[i % 32] = fmaf(dequant_elem(w, row, NULL, i), xr[i], p[i % 32]);
        for (int h = 16; h >= 1; h /= 2)
            for (int l = 0; l < h; l++) p[l] = p[l] + p[l + h];
        total = p[0];
    } else {
        total = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            float f;
            switch (w.type) {
            case T_Q4_0: f = dot_q4_0(row + b * 8 * 18, xqr + b); break;
            case T_Q8_0: f = dot_q8_0(row + b * 8 * 34, xqr + b); break;
            case T_Q4_K: f = dot_q45_k(row + b * 144, xqr + b, false); break;
            case T_Q5_K: f = dot_q45_k(row + b * 176, xqr + b, true); break;
            case T_Q6_K: f = dot_q6_k(row + b * 210, xqr + b); break;
            default: f = dot_nvfp4_ggml(row + b * 4 * 36, xqr + b); break;
            }
            total = total + f;
        }
    }
    if (w.has_scale) total = total * w.scale;
    y[t] = total;
}

/* --------------------------------------------------- canonical f32 dots */

__global__ static void k_rope_table(const double *inv_freq, int64_t n_pairs, const int64_t *pos, int64_t rows,
                                    const int32_t *depth, float *cs) {
    grid_dep_wait();
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * n_pairs) return;
    int64_t r = t / n_pairs, i = t % n_pairs;
    const int64_t p = depth && r < 16 ? pos[r] - r + depth[r] : pos[r];
    double a = (double)p * inv_freq[i];
    cs[t * 2] = (float)d_trig(a, 1);
    cs[t * 2 + 1] = (float)d_trig(a, 0);
}

__global__ static void k_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs,
                              int64_t rows, bool neox) {
    grid_dep_wait();
    const int64_t half = n_rot / 2;
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * n_heads * half) return;
    int64_t i = t % half, rh = t / half, r = rh / n_heads;
    const float *csr = cs + r * half * 2;
    float *v = x + rh * head_dim;
    float c = csr[2 * i], s = csr[2 * i + 1];
    if (neox) {
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * c - x1 * s;
        v[i + half] = x1 * c + x0 * s;
    } else {
        float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x0 * s + x1 * c;
    }
}

/* One value of a K/V store: the old bytes to the journal first (jplane
 * set), then the f16 of x. */
__device__ static inline void kv_put(uint16_t *plane, uint16_t *jplane, const mucu_kv_dst &d, int64_t h, int64_t D,
                                     int64_t i, float x) {
    const int64_t at = (h * d.cap + d.physical) * D + i;
    if (jplane) jplane[(h * d.jcap + d.slot) * D + i] = plane[at];
    plane[at] = f32_to_f16(x);
}

/* A thread per stored value; row r's destination (its sequence's planes)
 * is dst[r]. With a journal (jk != NULL) the value's old bytes are saved
 * first, by the thread that then overwrites them. */
__global__ static void k_kv_store(const mucu_kv_dst *dst, int64_t H, int64_t D, const float *k, const float *v,
                                  int64_t rows) {
    grid_dep_wait();
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * H * D) return;
    int64_t i = t % D, h = (t / D) % H, r = t / (D * H);
    const mucu_kv_dst d = dst[r];
    kv_put(d.k, d.jk, d, h, D, i, k[t]);
    kv_put(d.v, d.jk ? d.jv : NULL, d, h, D, i, v[t]);
}

/* ------------------------------------------------------------ elementwise */

__global__ static void k_sigmoid_gate(float *x, const float *g, int64_t n) {
    grid_dep_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * d_sigmoidf(g[i]);
}

__global__ static void k_swiglu(float *gate, const float *up, int64_t n) {
    grid_dep_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gate[i] = d_siluf(gate[i]) * up[i];
}

__global__ static void k_add(float *x, const float *y, int64_t n) {
    grid_dep_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] + y[i];
}

__global__ static void k_logit_tail(float *l, float scale, float cap, int64_t n) {
    grid_dep_wait();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = l[i] * scale;
    l[i] = cap > 0 ? d_tanhf(v / cap) * cap : v;
}

/* One block per row (host_ops.c's formula): the scaling, the maximum and
 * the exponentials in parallel (a maximum is the same in any order; a zero
 * maximum's sign does not change x - max), the sum by one thread in index
 * order, as the host sums. n_valid (device memory, so a replayed launch
 * reads this call's count): entries past it become 0. */
__device__ static void block_softmax(float *s, float scale, int64_t n_all, int64_t n) {
    __shared__ float wmax[32], total;
    float mx = -INFINITY;
    for (int64_t j = n + threadIdx.x; j < n_all; j += blockDim.x) s[j] = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const float v = s[j] * scale;
        s[j] = v;
        if (v > mx) mx = v;
    }
    for (int o = 16; o; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, mx, o);
        if (t > mx) mx = t;
    }
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (unsigned w = 0; w < blockDim.x / 32; w++)
        if (wmax[w] > mx) mx = wmax[w];
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s[j] = d_expf(s[j] - mx);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0;
        for (int64_t j = 0; j < n; j++) sum += s[j];
        total = sum;
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s[j] = s[j] / total;
}

/* block_softmax's operations over n values by one warp (no CTA barrier;
 * nothing past n is written). */
__device__ static void warp_softmax(float *s, float scale, int n, int lane) {
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) {
        const float v = s[j] * scale;
        s[j] = v;
        if (v > mx) mx = v;
    }
    for (int o = 16; o; o >>= 1) {
        const float t = __shfl_xor_sync(FULL_MASK, mx, o);
        if (t > mx) mx = t;
    }
    for (int j = lane; j < n; j += 32) s[j] = d_expf(s[j] - mx);
    __syncwarp();
    float sum = 0.0f;
    if (lane == 0)
        for (int j = 0; j < n; j++) sum += s[j];
    sum = __shfl_sync(FULL_MASK, sum, 0);
    for (int j = lane; j < n; j += 32) s[j] = s[j] / sum;
}

__global__ static void k_softmax(float *x, float scale, int64_t n_all, const int64_t *n_valid) {
    grid_dep_wait();
    block_softmax(x + (int64_t)blockIdx.x * n_all, scale, n_all, *n_valid);
}

/* One block per row. The host's loop (best moves only on a strictly larger
 * value) gives the first index of the maximum over the non-NaN values, or 0
 * when element 0 is NaN; each thread keeps its first maximum, and ties
 * between threads go to the smaller index. */
__global__ static void k_argmax(const float *x, int64_t n, int32_t *out) {
    grid_dep_wait();
    __shared__ float wv[32];
    __shared__ int64_t wi[32];
    const float *l = x + (int64_t)blockIdx.x * n;
    float bv = -INFINITY;
    int64_t bi = -1;
    const int64_t step = blockDim.x;
    int64_t j = threadIdx.x;
    for (; j + 7 * step < n; j += 8 * step) { /* 8 loads in flight, then this thread's scan in index order */
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = l[j + u * step];
#pragma unroll
        for (int u = 0; u < 8; u++)
            if (v[u] == v[u] && (bi < 0 || v[u] > bv)) bv = v[u], bi = j + u * step;
    }
    for (; j < n; j += step) {
        const float v = l[j];
        if (v == v && (bi < 0 || v > bv)) bv = v, bi = j;
    }
    for (int o = 16; o; o >>= 1) {
        const float tv = __shfl_xor_sync(0xffffffffu, bv, o);
        const int64_t ti = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ti >= 0 && (bi < 0 || tv > bv || (tv == bv && ti < bi))) bv = tv, bi = ti;
    }
    if ((threadIdx.x & 31) == 0) wv[threadIdx.x >> 5] = bv, wi[threadIdx.x >> 5] = bi;
    __syncthreads();
    if (threadIdx.x) return; /* thread 0 holds warp 0's result */
    for (unsigned w = 1; w < blockDim.x / 32; w++)
        if (wi[w] >= 0 && (bi < 0 || wv[w] > bv || (wv[w] == bv && wi[w] < bi))) bv = wv[w], bi = wi[w];
    out[blockIdx.x] = l[0] != l[0] || bi < 0 ? 0 : (int32_t)bi;
}

/* backend.h chain_pick. A thread keeps its first maximum, how many of its
 * values equal it (float equality: +0 and -0 tie, as in the sampler) and
 * whether one is not finite; two such summaries merge to the larger value
 * (equal: the smaller index, the counts added), which is associative, so
 * any grouping gives the same result. Each CTA takes CHAIN_SPAN values and
 * leaves its summary in the partials; the last CTA to finish (a counter
 * after a fence) merges them and writes the token to *reg, for the next
 * forward's entry, and to the host slot before its status. */
#define CHAIN_SPAN 4096
#define CHAIN_MAX_CTAS 256
struct chain_sum {
    float v;
    int32_t i, cnt, bad;
};

__device__ static chain_sum chain_merge(chain_sum a, chain_sum b) {
    a.bad |= b.bad;
    if (b.i < 0) return a;
    if (a.i < 0 || b.v > a.v) return {b.v, b.i, b.cnt, a.bad};
    if (b.v == a.v) a.i = b.i < a.i ? b.i : a.i, a.cnt += b.cnt;
    return a;
}

__device__ static chain_sum chain_warp(chain_sum a) {
    for (int o = 16; o; o >>= 1) {
        chain_sum t;
        t.v = __shfl_xor_sync(0xffffffffu, a.v, o);
        t.i = __shfl_xor_sync(0xffffffffu, a.i, o);
        t.cnt = __shfl_xor_sync(0xffffffffu, a.cnt, o);
        t.bad = __shfl_xor_sync(0xffffffffu, a.bad, o);
        a = chain_merge(a, t);
    }
    return a;
}

/* The CTA's summary of x[j] for j = j0 + threadIdx.x, j0 + threadIdx.x +
 * blockDim.x, ... < end (indices as given): each thread's own, then its
 * warp's, then, in threads 0-31, the CTA's (ws: one entry per warp). */
__device__ static chain_sum chain_cta(const float *x, int64_t j0, int64_t end, chain_sum *ws) {
    chain_sum m = {-INFINITY, -1, 0, 0};
#pragma unroll 4
    for (int64_t j = j0 + threadIdx.x; j < end; j += blockDim.x) {
        const float v = x[j];
        m.bad |= (__float_as_uint(v) & 0x7F800000u) == 0x7F800000u;
        if (m.i < 0 || v > m.v) m.v = v, m.i = (int32_t)j, m.cnt = 1;
        else if (v == m.v) m.cnt++;
    }
    m = chain_warp(m);
    if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < blockDim.x / 32 ? ws[threadIdx.x] : chain_sum{-INFINITY, -1, 0, 0};
        m = chain_warp(m);
    }
    return m;
}

__global__ static void __launch_bounds__(1024) k_chain_pick(const float *x, int64_t n, int32_t *reg,
                                                            int32_t *const *slot) {
    grid_dep_wait();
    __shared__ chain_sum ws[32];
    __shared__ bool last;
    unsigned *counter = (unsigned *)(reg + 1);
    chain_sum *part = (chain_sum *)(reg + 4);
    chain_sum m = chain_cta(x, (int64_t)blockIdx.x * CHAIN_SPAN, min(n, (int64_t)(blockIdx.x + 1) * CHAIN_SPAN), ws);
    if (gridDim.x > 1) {
        if (threadIdx.x == 0) {
            part[blockIdx.x] = m;
            __threadfence();
            last = atomicAdd(counter, 1u) == gridDim.x - 1;
        }
        __syncthreads();
        if (!last || threadIdx.x >= 32) return;
        __threadfence();
        m = {-INFINITY, -1, 0, 0};
        for (unsigned b = threadIdx.x; b < gridDim.x; b += 32) /* other CTAs' writes: past L1 */
            m = chain_merge(m, {__ldcg(&part[b].v), __ldcg(&part[b].i), __ldcg(&part[b].cnt), __ldcg(&part[b].bad)});
        m = chain_warp(m);
        if (threadIdx.x == 0) *counter = 0; /* for the next launch (stream order) */
    }
    if (threadIdx.x) return;
    const bool unique = !m.bad && m.i >= 0 && m.cnt == 1;
    const int32_t tok = unique ? m.i : 0;
    *reg = tok;
    volatile int32_t *h = *slot;
    h[0] = tok;
    __threadfence_system();
    h[1] = unique ? 1 : 2;
}

/* backend.h pick_rows: a CTA per row, chain_pick's summary over the whole
 * row (the same merge, so the same pick and status); CTA 0 first copies
 * the token registers after the rows' entries, before its own status. */
__global__ static void __launch_bounds__(1024) k_pick_rows(const float *x, int64_t n, int32_t n_regs,
                                                           const int32_t *regs, int32_t *const *slot) {
    grid_dep_wait();
    __shared__ chain_sum ws[32];
    const chain_sum m = chain_cta(x + (int64_t)blockIdx.x * n, 0, n, ws);
    if (threadIdx.x) return;
    volatile int32_t *h = *slot;
    if (blockIdx.x == 0)
        for (int32_t i = 0; i < n_regs; i++) h[2 * gridDim.x + i] = regs[i];
    const bool unique = !m.bad && m.i >= 0 && m.cnt == 1;
    h[2 * blockIdx.x] = unique ? m.i : 0;
    __threadfence_system();
    h[2 * blockIdx.x + 1] = unique ? 1 : 2;
}

/* ---- token trees built where the draft's rows lie (backend.h tree_reg;
 * src/spec/spec_tree.c mu_spec_row_top / mu_spec_tree_build is the
 * reference, and test_cuda_backend compares the two bit for bit) ---- */
#define TREE_K 8      /* MU_SPEC_TREE_K */
#define TREE_NT 512   /* threads of k_tree_rows */

/* k_tree_rows' results: each draft row's candidates (cnt 0: a non-finite row) */
typedef struct tree_work {
    int32_t cnt[16];
    int32_t tok[16][TREE_K];
    double prob[16][TREE_K];
} tree_work;

/* (v, i) before (w, j): the larger value first, the lower index among equal ones */
__device__ static inline bool tree_before(float v, int32_t i, float w, int32_t j) { return v > w || (v == w && i < j); }

/* floor(e * 2^60) of a float 0 <= e <= 1 from its bits (mumath.c fixed60) */
__device__ static inline unsigned long long tree_fixed60(float e) {
    const unsigned bits = __float_as_uint(e);
    const unsigned long long m = (bits & 0x7FFFFFu) | 0x800000u;
    const int s = (int)(bits >> 23) - 90;
    return s >= 0 ? m << s : s > -64 ? m >> -s : 0ull;
}

#define TREE_VPT 16   /* values a thread of k_tree_rows holds at once (a chunk: TREE_VPT * TREE_NT) */

/* row index of a thread's value j in the chunk at base: in float4 pieces
 * (vec: aligned row, length a multiple of 4) or one by one; either way a
 * thread meets its values in increasing index order */
__device__ static inline int64_t tree_idx(bool vec, int64_t base, int tid, int j) {
    return vec ? base + 4 * ((int64_t)tid + (int64_t)TREE_NT * (j >> 2)) + (j & 3)
               : base + tid + (int64_t)TREE_NT * j;
}

/* a chunk's values into registers (indices past n: never read) */
__device__ static inline void tree_load(const float *__restrict__ l, int64_t n, bool vec, int64_t base, int tid,
                                        float (&r)[TREE_VPT]) {
#pragma unroll
    for (int q = 0; q < TREE_VPT / 4; q++) {
        if (vec) {
            const int64_t i = tree_idx(true, base, tid, 4 * q);
            if (i < n) {
                const float4 f = *(const float4 *)(l + i);
                r[4 * q] = f.x, r[4 * q + 1] = f.y, r[4 * q + 2] = f.z, r[4 * q + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int64_t i = tree_idx(false, base, tid, 4 * q + e);
                if (i < n) r[4 * q + e] = l[i];
            }
        }
    }
}

/* (v, i) lists of TREE_K, best first by tree_before: a's list becomes the
 * best TREE_K of both, best first. The elementwise better of a and b
 * reversed is bitonic and holds the best TREE_K of the two (distinct ids,
 * or equal fillers); a bitonic merge sorts it. */
__device__ static inline void tree_merge(float (&av)[TREE_K], int32_t (&ai)[TREE_K], const float (&bv)[TREE_K],
                                         const int32_t (&bi)[TREE_K]) {
#pragma unroll
    for (int k = 0; k < TREE_K; k++)
        if (tree_before(bv[TREE_K - 1 - k], bi[TREE_K - 1 - k], av[k], ai[k])) av[k] = bv[TREE_K - 1 - k], ai[k] = bi[TREE_K - 1 - k];
#pragma unroll
    for (int d = TREE_K / 2; d; d >>= 1)
#pragma unroll
        for (int k = 0; k < TREE_K; k++)
            if (!(k & d) && tree_before(av[k + d], ai[k + d], av[k], ai[k])) {
                const float v = av[k];
                const int32_t i = ai[k];
                av[k] = av[k + d], ai[k] = ai[k + d], av[k + d] = v, ai[k + d] = i;
            }
}

/* the lanes' lists merged down the butterfly from distance `from`: every lane ends with the best of all */
__device__ static inline void tree_warp_merge(float (&v)[TREE_K], int32_t (&i)[TREE_K], int from) {
    for (int off = from; off; off >>= 1) {
        float ov[TREE_K];
        int32_t oi[TREE_K];
#pragma unroll
        for (int k = 0; k < TREE_K; k++) ov[k] = __shfl_xor_sync(FULL_MASK, v[k], off), oi[k] = __shfl_xor_sync(FULL_MASK, i[k], off);
        tree_merge(v, i, ov, oi);
    }
}

/* A CTA per draft row: its 8 candidates in mu_spec_row_top's order and
 * prob[j] = expf(v_j - v_0) / S with S the reference's mu_sum_expf_fixed.
 * Each thread reads its values a chunk of TREE_VPT at a time into
 * registers (all loads in flight at once) and keeps its best 8; the
 * threads' lists merge down the warp's butterfly, the warps' lists in
 * warp 0 (no CTA barrier per candidate). S: each term's floor(e * 2^60)
 * split at bit 30 and the two parts summed as integers (any order: a
 * thread's values, the butterfly, the warps), the total rounded once to
 * double; a row of one chunk (the shipped vocabulary) sums from the
 * registers, a longer one reads its values again. */
__global__ static void __launch_bounds__(TREE_NT) k_tree_rows(const float *__restrict__ x, int64_t n,
                                                             tree_work *__restrict__ w) {
    grid_dep_wait();
    __shared__ float wv[TREE_NT / 32][TREE_K], top_v[TREE_K];
    __shared__ int32_t wi[TREE_NT / 32][TREE_K], top_i[TREE_K];
    __shared__ unsigned long long sa[TREE_NT / 32], sc[TREE_NT / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, row = blockIdx.x;
    const float *l = x + (int64_t)row * n;
    const bool vec = ((uintptr_t)l & 15) == 0 && (n & 3) == 0;
    const int64_t CH = (int64_t)TREE_VPT * TREE_NT;
    float tv[TREE_K], r[TREE_VPT];
    int32_t ti[TREE_K];
#pragma unroll
    for (int k = 0; k < TREE_K; k++) tv[k] = -INFINITY, ti[k] = INT32_MAX;
    bool bad = false;
    for (int64_t base = 0; base < n; base += CH) {
        tree_load(l, n, vec, base, tid, r);
#pragma unroll
        for (int j = 0; j < TREE_VPT; j++) {
            const int64_t i = tree_idx(vec, base, tid, j);
            if (i >= n) continue;
            const float v = r[j];
            bad |= (__float_as_uint(v) & 0x7F800000u) == 0x7F800000u;
            if (!(v > tv[TREE_K - 1])) continue; /* an equal later value stays out */
#pragma unroll
            for (int k = TREE_K - 1; k >= 0; k--) /* after every value >= v */
                if (v > tv[k]) {
                    if (k > 0 && v > tv[k - 1]) tv[k] = tv[k - 1], ti[k] = ti[k - 1];
                    else tv[k] = v, ti[k] = (int32_t)i;
                }
        }
    }
    if (__syncthreads_or(bad)) { /* no candidates: nothing grows from this row */
        if (tid == 0) w->cnt[row] = 0;
        return;
    }
    tree_warp_merge(tv, ti, 16);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < TREE_K; k++) wv[warp][k] = tv[k], wi[warp][k] = ti[k];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int k = 0; k < TREE_K; k++)
            tv[k] = lane < TREE_NT / 32 ? wv[lane][k] : -INFINITY, ti[k] = lane < TREE_NT / 32 ? wi[lane][k] : INT32_MAX;
        tree_warp_merge(tv, ti, TREE_NT / 64);
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < TREE_K; k++) top_v[k] = tv[k], top_i[k] = ti[k];
    }
    __syncthreads();
    const float shift = top_v[0];
    unsigned long long a = 0, c = 0;
    for (int64_t base = 0; base < n; base += CH) {
        if (n > CH) tree_load(l, n, vec, base, tid, r);
#pragma unroll
        for (int j = 0; j < TREE_VPT; j++)
            if (tree_idx(vec, base, tid, j) < n) {
                const unsigned long long f = tree_fixed60(d_expf(r[j] - shift));
                a += f >> 30, c += f & 0x3FFFFFFFull;
            }
    }
#pragma unroll
    for (int off = 16; off; off >>= 1) a += __shfl_xor_sync(FULL_MASK, a, off), c += __shfl_xor_sync(FULL_MASK, c, off);
    if (lane == 0) sa[warp] = a, sc[warp] = c;
    __syncthreads();
    if (warp) return;
    a = lane < TREE_NT / 32 ? sa[lane] : 0ull, c = lane < TREE_NT / 32 ? sc[lane] : 0ull;
#pragma unroll
    for (int off = 16; off; off >>= 1) a += __shfl_xor_sync(FULL_MASK, a, off), c += __shfl_xor_sync(FULL_MASK, c, off);
    a += c >> 30, c &= 0x3FFFFFFFull; /* mumath.c fixed60_total */
    const double sum = __ull2double_rn(a) * 0x1p-30 + __ull2double_rn(c) * 0x1p-60;
    if (lane < TREE_K && top_i[lane] != INT32_MAX) {
        w->tok[row][lane] = top_i[lane];
        w->prob[row][lane] = (double)d_expf(top_v[lane] - shift) / sum;
    }
    if (lane == 0) {
        int cnt = 0;
        for (int k = 0; k < TREE_K; k++) cnt += top_i[k] != INT32_MAX;
        w->cnt[row] = cnt;
    }
}

/* One warp, lane i holding node i: the best-first tree of
 * mu_spec_tree_build over k_tree_rows' candidates (each round every node
 * offers its next child's score, the largest wins, the earliest node among
 * equal ones), numbered chain of first choices first, then into the tree
 * registers, the token registers and the host slot (backend.h tree_reg). */
__global__ static void __launch_bounds__(32) k_tree_build(const tree_work *__restrict__ w, int32_t rows,
                                                         const int32_t *__restrict__ eog, int32_t n_eog,
                                                         mucu_tree_regs *regs, int32_t *tokregs,
                                                         int32_t *const *slot) {
    grid_dep_wait();
    __shared__ int32_t s_tok[15][TREE_K], s_cnt[15], np[16], nd[16], ntk[16];
    __shared__ double s_prob[15][TREE_K];
    __shared__ bool s_eog[15][TREE_K];
    const int lane = threadIdx.x;
    const int nr = rows < 15 ? rows : 15;
    /* each candidate (lane + 32 q) and whether it ends generation: every
     * load issued before the first use (one latency, not one per candidate
     * and end id); the first 32 end ids go round the warp by shuffles */
    int32_t t[4] = {-1, -1, -1, -1};
    double p[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int e = lane + 32 * q;
        if (e < nr * TREE_K) t[q] = w->tok[e / TREE_K][e % TREE_K], p[q] = w->prob[e / TREE_K][e % TREE_K];
    }
    const int32_t my_eog = lane < n_eog ? eog[lane] : 0, my_cnt = lane < nr ? w->cnt[lane] : 0;
    bool end[4] = {false, false, false, false};
    for (int k = 0; k < n_eog; k++) {
        const int32_t g = k < 32 ? __shfl_sync(FULL_MASK, my_eog, k) : eog[k];
#pragma unroll
        for (int q = 0; q < 4; q++) end[q] |= t[q] == g;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int e = lane + 32 * q;
        if (e < nr * TREE_K)
            s_tok[e / TREE_K][e % TREE_K] = t[q], s_prob[e / TREE_K][e % TREE_K] = p[q], s_eog[e / TREE_K][e % TREE_K] = end[q];
    }
    if (lane < nr) s_cnt[lane] = my_cnt;
    __syncwarp();
    int depth = 0, next = 0, parent = -1, rank = 0, token = -1, gn = 1;
    double score = 1.0;
    bool shut = false; /* an end of generation: nothing grows under it */
    while (gn < nr + 1) {
        double q = -1.0;
        if (lane < gn && depth < nr && next < s_cnt[depth] && !shut) { /* spec_tree.h mu_spec_tree_weight */
            double p = s_prob[depth][next];
            if (next == 0 && depth >= 1) p = 1.0 - (1.0 - p) * 0.75;
            if (rank != 0) p *= next == 0 ? 0.625 : next == 1 ? 1.5 : 1.0;
            q = score * p;
        }
        int bi = lane;
#pragma unroll
        for (int off = 16; off; off >>= 1) {
            const double q2 = __shfl_xor_sync(FULL_MASK, q, off);
            const int i2 = __shfl_xor_sync(FULL_MASK, bi, off);
            if (q2 > q || (q2 == q && i2 < bi)) q = q2, bi = i2;
        }
        if (q < 0.0) break; /* no node has a child left */
        const int bd = __shfl_sync(FULL_MASK, depth, bi), bn = __shfl_sync(FULL_MASK, next, bi);
        if (lane == bi) next++;
        if (lane == gn) {
            parent = bi, depth = bd + 1, rank = bn, token = s_tok[bd][bn], score = q, next = 0;
            shut = s_eog[bd][bn];
        }
        gn++;
    }
    /* the first choices' chain under the root, then the rest in joining order */
    int at = -1, nchain = 0;
    unsigned placed = 0;
    for (int cur = 0;;) {
        if (lane == cur) at = nchain;
        placed |= 1u << cur, nchain++;
        const unsigned m = __ballot_sync(FULL_MASK, lane > cur && lane < gn && parent == cur && rank == 0);
        if (!m) break;
        cur = __ffs(m) - 1;
    }
    if (lane < gn && at < 0) at = nchain + __popc(~placed & ((1u << lane) - 1));
    const int pat = __shfl_sync(FULL_MASK, at, parent < 0 ? 0 : parent);
    if (lane < gn) np[at] = lane ? pat : -1, nd[at] = depth, ntk[at] = token;
    __syncwarp();
    if (lane < 16) {
        const int i = lane, P = i < gn ? np[i] : 0, D = i < gn ? nd[i] : 1;
        regs->parent[i] = P, regs->depth[i] = D;
        int8_t anc[16]; /* static indices only: registers, not a stack frame */
#pragma unroll
        for (int d = 15, a = i; d >= 0; d--) {
            anc[d] = 0;
            if (d <= D) anc[d] = (int8_t)a, a = a < gn ? np[a] : 0;
        }
#pragma unroll
        for (int d = 0; d < 16; d++) regs->anc[i][d] = anc[d];
        if (i < rows) tokregs[i] = i + 1 < gn ? ntk[i + 1] : 0;
        volatile int32_t *h = *slot;
        h[1 + i] = P;
        h[1 + 16 + i] = i == 0 ? -1 : i < gn ? ntk[i] : 0;
        if (i == 0) h[0] = gn, regs->n = gn;
    }
    __threadfence_system();
}

/* backend.h copy2d_many: CTA (r, i) copies row r of copy i (none when the
 * copy has fewer rows), in 16-byte pieces where its addresses, strides and
 * width allow, else byte by byte. The copies' destinations are apart, so
 * their order does not matter. */
__global__ static void k_copy2d_many(const mucu_copy2d *c) {
    grid_dep_wait();
    const mucu_copy2d d = c[blockIdx.y];
    if ((int64_t)blockIdx.x >= d.rows) return;
    uint8_t *dst = (uint8_t *)d.dst + (size_t)blockIdx.x * d.dst_stride;
    const uint8_t *src = (const uint8_t *)d.src + (size_t)blockIdx.x * d.src_stride;
    if ((((uintptr_t)dst | (uintptr_t)src | d.width) & 15) == 0) {
        for (size_t j = threadIdx.x; j < d.width / 16; j += blockDim.x) ((uint4 *)dst)[j] = ((const uint4 *)src)[j];
    } else {
        for (size_t j = threadIdx.x; j < d.width; j += blockDim.x) dst[j] = src[j];
    }
}

/* Token registers in a forward's uploaded ids (backend.h MU_TOKEN_REG):
 * replaced by the ids the registers hold, before the entry reads them. */
__global__ static void k_tokens_regs(int32_t *t, int64_t rows, const int32_t *regs) {
    grid_dep_wait();
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows && t[r] <= -2) t[r] = regs[-2 - t[r]];
}

/* The first non-finite value of x[0..n): every thread keeps the smallest
 * bad index of its own elements (loads independent of each other: no early
 * exit) and offers n - index with atomicMax to *best, zeroed before; the
 * largest offer is the smallest index. Threads that find nothing (the
 * usual case) make no atomic at all. */
__global__ static void k_first_nonfinite(const float *x, int64_t n, unsigned long long *best) {
    grid_dep_wait();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t mine = n;
    const int64_t n4 = ((uintptr_t)x & 15) ? 0 : n / 4;
    const float4 *x4 = (const float4 *)x;
#pragma unroll 4
    for (int64_t i = t; i < n4; i += stride) {
        const float4 v = x4[i];
        const uint32_t e = 0x7F800000u;
        const bool b0 = (__float_as_uint(v.x) & e) == e, b1 = (__float_as_uint(v.y) & e) == e;
        const bool b2 = (__float_as_uint(v.z) & e) == e, b3 = (__float_as_uint(v.w) & e) == e;
        if ((b0 | b1 | b2 | b3) && 4 * i < mine) mine = 4 * i + (b0 ? 0 : b1 ? 1 : b2 ? 2 : 3);
    }
    for (int64_t i = 4 * n4 + t; i < n; i += stride)
        if ((__float_as_uint(x[i]) & 0x7F800000u) == 0x7F800000u && i < mine) mine = i;
    if (mine < n) atomicMax(best, (unsigned long long)(n - mine));
}

/* backend.h store_kv_heads: the first rows * n_head * D threads store K, the rest V (transposed). */
__global__ static void k_store_kv_heads(float *kd, float *vd, const int64_t *slots, int64_t S, int64_t D,
                                        int64_t n_head, const float *k, const float *v, int64_t rows,
                                        int64_t plane_stride, int64_t src_stride, int64_t n_layers) {
    grid_dep_wait();
    const int64_t n = rows * n_head * D;
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= 2 * n * n_layers) return;
    const int64_t l = t / (2 * n); /* layer l: its planes and rows plane_stride / src_stride further on */
    t -= l * 2 * n;
    kd += l * plane_stride, vd += l * plane_stride, k += l * src_stride, v += l * src_stride;
    const bool is_v = t >= n;
    if (is_v) t -= n;
    const int64_t d = t % D, h = (t / D) % n_head, r = t / (D * n_head);
    if (is_v) vd[h * D * S + slots[r] + d * S] = v[t];
    else kd[(h * S + slots[r]) * D + d] = k[t];
}

/* ======================================================================
 * Fast kernels (docs/cuda.md, "Fast paths"). Same numerics as the twins
 * above: integer inner block sums in any order (exact), the f_b formula as
 * written, the per-row float sum over 256-blocks strictly in block order,
 * float dots in the 32-lane order (one warp: lane l owns i = l mod 32,
 * xor butterfly, lane 0's value is the reference's p[0]).
 * ==================================================================== */

/* The 32-lane fold of docs/numerics.md: lane 0 ends with the reference's
 * p[0] ((p0+p16)+(p8+p24))...; the other lanes' values are discarded. */
__device__ static inline float warp_fold_lane0(float p) {
    for (int h = 16; h >= 1; h /= 2) p = p + __shfl_xor_sync(FULL_MASK, p, h);
    return __shfl_sync(FULL_MASK, p, 0);
}

/* 4 consecutive values from element i0 (zeros past n), one 16-byte access
 * where the address allows; and the store of them (none past n). */
__device__ static inline void ld4(const float *p, int64_t i0, int64_t n, float v[4]) {
    if (i0 + 4 <= n && ((uintptr_t)(p + i0) & 15) == 0) {
        const float4 a = *(const float4 *)(p + i0);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        return;
    }
#pragma unroll
    for (int t = 0; t < 4; t++) v[t] = i0 + t < n ? p[i0 + t] : 0.0f;
}
__device__ static inline void st4(float *p, int64_t i0, int64_t n, const float v[4]) {
    if (i0 + 4 <= n && ((uintptr_t)(p + i0) & 15) == 0) {
        *(float4 *)(p + i0) = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
#pragma unroll
    for (int t = 0; t < 4; t++)
        if (i0 + t < n) p[i0 + t] = v[t];
}

/* Lane l's 8 values of 256-value block b in quantize_block_warp<true>'s
 * layout (half_pos: each access of the warp covers 512 contiguous bytes). */
__device__ static inline int64_t hx(int64_t b, int lane, int t) { return b * 256 + half_pos(lane, t); }
__device__ static inline void ld8h(const float *p, int64_t b, int lane, int64_t n, float v[8]) {
    ld4(p, hx(b, lane, 0), n, v);
    ld4(p, hx(b, lane, 4), n, v + 4);
}
__device__ static inline void st8h(float *p, int64_t b, int lane, int64_t n, const float v[8]) {
    st4(p, hx(b, lane, 0), n, v);
    st4(p, hx(b, lane, 4), n, v + 4);
}

/* One warp per 256-value block; via_f16 (native NVFP4 W4A16): each value
 * rounded through f16 first, as k_quantize_q8k does. */
__global__ static void k_quantize_q8split(const float *x, q8split o, int64_t n_blocks, bool via_f16) {
    grid_dep_wait();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const float *src = x + b * 256 + lane * 8;
    float v[8];
    for (int i = 0; i < 8; i++) v[i] = via_f16 ? round_f16(src[i]) : src[i];
    quantize_block_warp(v, o, b, lane);
}

/* The gate and SwiGLU elementwise ops fused with the Q8_K quantization of
 * their result (the next op is the matrix product that reads it): a warp
 * per 256-value block computes the block exactly as k_sigmoid_gate /
 * k_swiglu do, stores it, and quantizes those same values. */
template <bool SWIGLU>
__global__ static void k_gate_q8(float *x, const float *g, q8split o, int64_t n_blocks) {
    grid_dep_wait();
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    /* all 16 loads first: x may alias g for all the compiler knows, so a
     * store between them made each value wait for its own round trip */
    const int64_t n = n_blocks * 256;
    float xv[8], gv[8], v[8];
    ld8h(x, b, lane, n, xv);
    ld8h(g, b, lane, n, gv);
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = SWIGLU ? d_siluf(xv[i]) * gv[i] : xv[i] * d_sigmoidf(gv[i]);
    st8h(x, b, lane, n, v);
    quantize_block_warp<true>(v, o, b, lane);
}

__device__ static inline uint32_t byte_of3(uint32_t w0, uint32_t w1, uint32_t w2, int k) {
    uint32_t w = k < 4 ? w0 : (k < 8 ? w1 : w2);
    return (w >> (8 * (k & 3))) & 0xFF;
}

__device__ static inline int32_t dp4a4(uint4 a, uint4 b) {
    int32_t s = __dp4a((int)a.x, (int)b.x, 0);
    s = __dp4a((int)a.y, (int)b.y, s);
    s = __dp4a((int)a.z, (int)b.z, s);
    return __dp4a((int)a.w, (int)b.w, s);
}

__device__ static inline int32_t sum8(int32_t v) { /* over the 8 lanes of a group */
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    v += __shfl_xor_sync(FULL_MASK, v, 2);
    v += __shfl_xor_sync(FULL_MASK, v, 4);
    return v;
}

extern "C" size_t mucu_fp4_split_bytes(int64_t n_in, int64_t n_out) { return (size_t)(n_in / 256) * 144 * (size_t)n_out; }

/* The layout is load_wq2's (NVFP4), a thread per (output, 256-value block),
 * on the device (a host loop over a 27.85B-value model took minutes); a
 * ggml UE4M3 scale byte becomes the E4M3FN byte of the same value (0x7F
 * is 0, the sign bit is ignored), so one table serves both. Runs once, at
 * upload: no grid_dep_wait needed, but every kernel calls it. */
__global__ static void k_fp4_split(const uint8_t *src, const uint8_t *scales, uint8_t *dst, int64_t n_in, int64_t n_out,
                                   int native) {
    grid_dep_wait();
    const int64_t nb = n_in / 256, row_bytes = native ? n_in / 2 : n_in / 64 * 36;
    const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= n_out * nb) return;
    const int64_t o = id / nb, b = id % nb;
    const uint8_t *row = src + o * row_bytes;
    auto code = [&](int v) -> uint32_t {
        if (native) return (row[(b * 256 + v) / 2] >> (4 * (v & 1))) & 15;
        const uint8_t *blk = row + (b * 4 + v / 64) * 36;
        const int w = v % 64, r = w % 16;
        const uint8_t q = blk[4 + 8 * (w / 16) + r % 8];
        return r >= 8 ? q >> 4 : q & 15;
    };
    auto scale = [&](int g) -> uint32_t {
        if (native) return scales[o * (n_in / 16) + b * 16 + g];
        const uint8_t u = row[(b * 4 + g / 4) * 36 + g % 4];
        return u == 0x7F ? 0 : u & 0x7F;
    };
    uint32_t *out = (uint32_t *)(dst + id * 144);
    for (int t = 0; t < 4; t++) {
        const int g = 4 * (t >> 1) + (t & 1);
        out[t] = scale(g) | scale(g + 2) << 8 | scale(g + 8) << 16 | scale(g + 10) << 24;
    }
    for (int pc = 0; pc < 8; pc++) {
        const int L = 64 * (pc >> 1) + 16 * (pc & 1);
        for (int k = 0; k < 4; k++) {
            uint32_t wd = 0;
            for (int i = 0; i < 4; i++) wd |= code(L + 4 * k + i) << (4 * i) | code(L + 32 + 4 * k + i) << (16 + 4 * i);
            out[4 + 4 * pc + k] = wd;
        }
    }
}

extern "C" bool mucu_fp4_split(const uint8_t *src, const uint8_t *scales, uint8_t *dst, int64_t n_in, int64_t n_out,
                               int native, char *err) {
    const int64_t n = n_out * (n_in / 256);
    if (n <= 0) return true;
    k_fp4_split<<<(unsigned)((n + 255) / 256), 256, 0, g_s>>>(src, scales, dst, n_in, n_out, native);
    if (!launched("k_fp4_split", err)) return false;
    return mucu_sync("k_fp4_split", err);
}

/* Q6_K on the device: blocks split into ql|qh (192 bytes, 16-aligned),
 * the 16 int8 scales and the f16 d, each array [n_out * nb] (the upload
 * repacks; cuda_backend.c). */
extern "C" size_t mucu_q6k_split_bytes(int64_t n_blocks) { return (size_t)n_blocks * 210; }
extern "C" void mucu_q6k_split(const uint8_t *src, uint8_t *dst, int64_t n_blocks) {
    uint8_t *q = dst, *sc = dst + (size_t)n_blocks * 192, *d = sc + (size_t)n_blocks * 16;
    for (int64_t i = 0; i < n_blocks; i++) {
        memcpy(q + i * 192, src + i * 210, 192);
        memcpy(sc + i * 16, src + i * 210 + 192, 16);
        memcpy(d + i * 2, src + i * 210 + 208, 2);
    }
}

/* One lane's share of a weight block, loaded ahead of its use. */
struct wshare {
    uint4 hdr, q, qh; /* Q4_K/Q5_K: d|dmin|scales, 16 code bytes, (Q5_K) 16 high-bit bytes; Q6_K: -, ql, qh */
    int32_t sc_l, sc_h;
    uint32_t d6;
};

template <int TYPE>
__device__ static inline wshare load_share(const uint8_t *W, const uint8_t *q6sc, const uint16_t *q6d, int64_t ob,
                                           int t) {
    wshare s;
    if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        const bool q5 = TYPE == T_Q5_K;
        const uint8_t *blk = W + ob * (q5 ? 176 : 144);
        s.hdr = __ldg((const uint4 *)blk);
        s.q = __ldg((const uint4 *)(blk + (q5 ? 48 : 16) + 16 * t));
        if (q5) s.qh = __ldg((const uint4 *)(blk + 16 + 16 * (t & 1)));
    } else {
        const uint8_t *blk = W + ob * 192;
        const int h = t >> 2, i0 = 16 * (t & 3), l0 = i0 & 31, part_lo = i0 >= 32 ? 1 : 0;
        s.q = __ldg((const uint4 *)(blk + 16 * t));
        s.qh = __ldg((const uint4 *)(blk + 128 + 32 * h + l0));
        const int k_lo = 128 * h + 32 * part_lo + l0, k_hi = k_lo + 64;
        s.sc_l = (int8_t)__ldg(q6sc + ob * 16 + k_lo / 16);
        s.sc_h = (int8_t)__ldg(q6sc + ob * 16 + k_hi / 16);
        s.d6 = __ldg(q6d + ob);
    }
    return s;
}

/* f_b of block b for rows r < nr (f[r] = 0 for the others), from this
 * lane's share; the integer sums are folded over the 8 lanes of the group. */
template <int TYPE, int R>
__device__ static inline void block_f(const wshare &s, int b, int nb, int t, const q8split &xq, const int8_t *qs, int nr,
                                       float *f) {
    const int64_t n_in = (int64_t)nb * 256;
    if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        const uint4 q = s.q;
        uint4 lo, hi;
        lo.x = q.x & 0x0F0F0F0Fu, lo.y = q.y & 0x0F0F0F0Fu, lo.z = q.z & 0x0F0F0F0Fu, lo.w = q.w & 0x0F0F0F0Fu;
        hi.x = (q.x >> 4) & 0x0F0F0F0Fu, hi.y = (q.y >> 4) & 0x0F0F0F0Fu;
        hi.z = (q.z >> 4) & 0x0F0F0F0Fu, hi.w = (q.w >> 4) & 0x0F0F0F0Fu;
        const int pair = t >> 1;
        if (TYPE == T_Q5_K) {
            const uint4 qh = s.qh;
            const int sl = 2 * pair, sh = 2 * pair + 1;
            lo.x |= ((qh.x >> sl) & 0x01010101u) << 4, lo.y |= ((qh.y >> sl) & 0x01010101u) << 4;
            lo.z |= ((qh.z >> sl) & 0x01010101u) << 4, lo.w |= ((qh.w >> sl) & 0x01010101u) << 4;
            hi.x |= ((qh.x >> sh) & 0x01010101u) << 4, hi.y |= ((qh.y >> sh) & 0x01010101u) << 4;
            hi.z |= ((qh.z >> sh) & 0x01010101u) << 4, hi.w |= ((qh.w >> sh) & 0x01010101u) << 4;
        }
        const int jl = 2 * pair, jh = jl + 1;
        int32_t sc_l, sc_h, m_t;
        {
            const uint32_t w0 = s.hdr.y, w1 = s.hdr.z, w2 = s.hdr.w;
#define SB(k) ((int32_t)byte_of3(w0, w1, w2, (k)))
            sc_l = jl < 4 ? SB(jl) & 63 : (SB(jl + 4) & 0xF) | ((SB(jl - 4) >> 6) << 4);
            sc_h = jh < 4 ? SB(jh) & 63 : (SB(jh + 4) & 0xF) | ((SB(jh - 4) >> 6) << 4);
            m_t = t < 4 ? SB(t + 4) & 63 : (SB(t + 4) >> 4) | ((SB(t) >> 6) << 4);
#undef SB
        }
        const float d = h2f((uint16_t)(s.hdr.x & 0xFFFF)), dmin = h2f((uint16_t)(s.hdr.x >> 16));
        const int base = 64 * pair + 16 * (t & 1);
#pragma unroll
        for (int r = 0; r < R; r++) {
            f[r] = 0.0f;
            if (r < nr) {
                const int8_t *xr = qs + r * n_in + (int64_t)b * 256;
                const uint4 xl = *(const uint4 *)(xr + base), xh = *(const uint4 *)(xr + base + 32);
                const int16_t *bs = xq.bs + ((int64_t)r * nb + b) * 16;
                int32_t sumi = sc_l * dp4a4(lo, xl) + sc_h * dp4a4(hi, xh);
                int32_t summ = m_t * ((int32_t)bs[2 * t] + (int32_t)bs[2 * t + 1]);
                sumi = sum8(sumi);
                summ = sum8(summ);
                const float xd = xq.d[(int64_t)r * nb + b];
                f[r] = (d * xd) * (float)sumi - (dmin * xd) * (float)summ;
            }
        }
    } else { /* Q6_K, split layout */
        const uint4 ql = s.q, qh = s.qh;
        const int h = t >> 2, i0 = 16 * (t & 3), l0 = i0 & 31, part_lo = i0 >= 32 ? 1 : 0, part_hi = part_lo + 2;
        const int sl = 2 * part_lo, sh = 2 * part_hi;
        uint4 lo, hi;
        lo.x = __vsub4((ql.x & 0x0F0F0F0Fu) | (((qh.x >> sl) & 0x03030303u) << 4), 0x20202020u);
        lo.y = __vsub4((ql.y & 0x0F0F0F0Fu) | (((qh.y >> sl) & 0x03030303u) << 4), 0x20202020u);
        lo.z = __vsub4((ql.z & 0x0F0F0F0Fu) | (((qh.z >> sl) & 0x03030303u) << 4), 0x20202020u);
        lo.w = __vsub4((ql.w & 0x0F0F0F0Fu) | (((qh.w >> sl) & 0x03030303u) << 4), 0x20202020u);
        hi.x = __vsub4(((ql.x >> 4) & 0x0F0F0F0Fu) | (((qh.x >> sh) & 0x03030303u) << 4), 0x20202020u);
        hi.y = __vsub4(((ql.y >> 4) & 0x0F0F0F0Fu) | (((qh.y >> sh) & 0x03030303u) << 4), 0x20202020u);
        hi.z = __vsub4(((ql.z >> 4) & 0x0F0F0F0Fu) | (((qh.z >> sh) & 0x03030303u) << 4), 0x20202020u);
        hi.w = __vsub4(((ql.w >> 4) & 0x0F0F0F0Fu) | (((qh.w >> sh) & 0x03030303u) << 4), 0x20202020u);
        const int k_lo = 128 * h + 32 * part_lo + l0, k_hi = 128 * h + 32 * part_hi + l0;
        const float d = h2f((uint16_t)s.d6);
#pragma unroll
        for (int r = 0; r < R; r++) {
            f[r] = 0.0f;
            if (r < nr) {
                const int8_t *xr = qs + r * n_in + (int64_t)b * 256;
                const uint4 xl = *(const uint4 *)(xr + k_lo), xh = *(const uint4 *)(xr + k_hi);
                int32_t sumi = sum8(s.sc_l * dp4a4(lo, xl) + s.sc_h * dp4a4(hi, xh));
                f[r] = (d * xq.d[(int64_t)r * nb + b]) * (float)sumi;
            }
        }
    }
}

/* Weight-streaming matrix-vector product for Q4_K / Q5_K / Q6_K, R rows
 * (nr <= R used) reusing each weight load. A warp per output; its four
 * 8-lane groups take blocks b0+0..3 of a step; lane t of a group takes 16
 * bytes of the block's codes. U steps' weights are loaded before any is
 * used (memory parallelism). The integer partial sums are folded within
 * the group (exact), f_b by the formula, then every lane adds the four f_b
 * of the step to the row totals in block order. */
template <int TYPE, int R, int U, int WPC, bool SMEM>
__global__ static void __launch_bounds__(32 * WPC) k_mmv_kq(const uint8_t *W, int64_t n_out, int nb, q8split xq, int nr,
                                                           float *y, int has_scale, float scale) {
    grid_dep_wait();
    extern __shared__ uint4 xsm[];
    const int lane = threadIdx.x & 31, g = lane >> 3, t = lane & 7;
    const int64_t o = (int64_t)blockIdx.x * WPC + (threadIdx.x >> 5);
    const int64_t n_in = (int64_t)nb * 256;
    const int8_t *qs = xq.qs;
    if (SMEM) { /* the CTA's copy of the quantized rows */
        const uint4 *src = (const uint4 *)xq.qs;
        for (int64_t i = threadIdx.x; i < nr * n_in / 16; i += 32 * WPC) xsm[i] = src[i];
        __syncthreads();
        qs = (const int8_t *)xsm;
    }
    if (o >= n_out) return;
    float total[R];
#pragma unroll
    for (int r = 0; r < R; r++) total[r] = 0.0f;
    const uint8_t *q6sc = W + (size_t)n_out * nb * 192;
    const uint16_t *q6d = (const uint16_t *)(q6sc + (size_t)n_out * nb * 16);
    for (int b0 = 0; b0 < nb; b0 += 4 * U) {
        wshare sh[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int bu = b0 + 4 * u + g;
            const int b = bu < nb ? bu : nb - 1; /* lanes past the end compute a block they drop */
            sh[u] = load_share<TYPE>(W, q6sc, q6d, o * nb + b, t);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int bu = b0 + 4 * u + g;
            float f[R];
            block_f<TYPE, R>(sh[u], bu < nb ? bu : nb - 1, nb, t, xq, qs, nr, f);
            /* the step's blocks in order */
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    const float fj = __shfl_sync(FULL_MASK, f[r], 8 * j);
                    if (b0 + 4 * u + j < nb) total[r] = total[r] + fj;
                }
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) y[r * n_out + o] = has_scale ? total[r] * scale : total[r];
    }
}

/* Weight-streaming matrix-vector product, v2 (the default): 4 lanes per
 * 256-block, so a warp takes 8 blocks of one output per step and U steps'
 * weights are loaded before any is used. Lane t holds 32 code bytes of
 * its block (two 16-byte pieces, each a contiguous 64-byte stretch across
 * the 4 lanes): Q4_K/Q5_K pieces [16t, 16t+16) and [64+16t, 64+16t+16) of
 * qs; Q6_K ql pieces of the two 128-value halves. Each piece gives 16
 * values of one sub-block from its low nibbles and 16 of another from its
 * high nibbles, so a lane's integer sums need 4 sub-block scales. The
 * integer sums are exact in any order (docs/numerics.md): each lane's
 * share, then a fold over its 4 lanes; f_b by the formula; then every lane
 * adds the step's 8 f_b to the row totals in block order. Per 16 bytes of
 * weights this is about half the instructions of k_mmv_kq (8 lanes per
 * block), which was issue-bound well below the device's bandwidth. */
struct wq2 {
    uint4 a, b;   /* code pieces (Q6_K: ql) */
    uint4 h;      /* Q5_K: the 16 qh bytes of the lane's l range; Q6_K: qh of piece a */
    uint4 h2;     /* Q6_K: qh of piece b */
    uint4 hdr;    /* Q4_K/Q5_K: d|dmin|12 scale bytes; Q6_K: the 16 int8 scales */
    uint32_t d6;  /* Q6_K: f16 d */
};

/* NVFP4 (ggml type 40 and native W4A16) in the device's split layout
 * (mucu_fp4_split): 144 bytes per 256 values, Q4_K's block size, so a
 * lane reads what it reads of Q4_K: header word t, the 4 E4M3 scales of
 * its 4 groups of 16 values, and code pieces [16t, 16t+16) and
 * [64+16t, 64+16t+16) (pieces t and t + 4). Piece p holds the values of
 * Q4_K's piece p: word k's low half-word the codes of values L + 4k ..
 * L + 4k + 3 (L = 64(p >> 1) + 16(p & 1)), its high half-word those of
 * L + 32 + 4k ..; one code a nibble, so a half-word is a byte-permute
 * selector as it stands. */
__host__ __device__ constexpr bool is_fp4(int type) { return type == T_NVFP4 || type == T_NVFP4_NATIVE; }

template <int TYPE>
__device__ static inline void load_wq2(const uint8_t *W, const uint8_t *q6sc, const uint16_t *q6d, int64_t item, int t,
                                       wq2 &s) {
    if (is_fp4(TYPE)) {
        const uint8_t *blk = W + item * 144;
        s.hdr.x = __ldg((const uint32_t *)blk + t);
        s.a = __ldg((const uint4 *)(blk + 16 + 16 * t));
        s.b = __ldg((const uint4 *)(blk + 80 + 16 * t));
    } else if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        const bool q5 = TYPE == T_Q5_K;
        const uint8_t *blk = W + item * (q5 ? 176 : 144);
        const uint8_t *qs = blk + (q5 ? 48 : 16);
        s.hdr = __ldg((const uint4 *)blk);
        s.a = __ldg((const uint4 *)(qs + 16 * t));
        s.b = __ldg((const uint4 *)(qs + 64 + 16 * t));
        if (q5) s.h = __ldg((const uint4 *)(blk + 16 + 16 * (t & 1)));
    } else {
        const uint8_t *blk = W + item * 192;
        s.a = __ldg((const uint4 *)(blk + 16 * t));
        s.b = __ldg((const uint4 *)(blk + 64 + 16 * t));
        s.h = __ldg((const uint4 *)(blk + 128 + 16 * (t & 1)));
        s.h2 = __ldg((const uint4 *)(blk + 160 + 16 * (t & 1)));
        s.hdr = __ldg((const uint4 *)(q6sc + item * 16));
        s.d6 = __ldg(q6d + item);
    }
}

__device__ static inline int32_t dp4a_u4(uint4 w, uint4 x, int32_t acc) {
    acc = __dp4a((int)w.x, (int)x.x, acc);
    acc = __dp4a((int)w.y, (int)x.y, acc);
    acc = __dp4a((int)w.z, (int)x.z, acc);
    return __dp4a((int)w.w, (int)x.w, acc);
}

__device__ static inline uint4 nib_lo(uint4 q) {
    return make_uint4(q.x & 0x0F0F0F0Fu, q.y & 0x0F0F0F0Fu, q.z & 0x0F0F0F0Fu, q.w & 0x0F0F0F0Fu);
}
__device__ static inline uint4 nib_hi(uint4 q) {
    return make_uint4((q.x >> 4) & 0x0F0F0F0Fu, (q.y >> 4) & 0x0F0F0F0Fu, (q.z >> 4) & 0x0F0F0F0Fu,
                      (q.w >> 4) & 0x0F0F0F0Fu);
}
/* v | (bit `sh` of each byte of h) << 4 */
__device__ static inline uint4 or_bit5(uint4 v, uint4 h, int sh) {
    return make_uint4(v.x | (((h.x >> sh) & 0x01010101u) << 4), v.y | (((h.y >> sh) & 0x01010101u) << 4),
                      v.z | (((h.z >> sh) & 0x01010101u) << 4), v.w | (((h.w >> sh) & 0x01010101u) << 4));
}
/* Q6_K: (v | (2 bits at `sh` of each byte of h) << 4) - 32, per byte */
__device__ static inline uint4 q6_vals(uint4 v, uint4 h, int sh) {
    return make_uint4(__vsub4(v.x | (((h.x >> sh) & 0x03030303u) << 4), 0x20202020u),
                      __vsub4(v.y | (((h.y >> sh) & 0x03030303u) << 4), 0x20202020u),
                      __vsub4(v.z | (((h.z >> sh) & 0x03030303u) << 4), 0x20202020u),
                      __vsub4(v.w | (((h.w >> sh) & 0x03030303u) << 4), 0x20202020u));
}

/* Eight E2M1 codes (a word of the split layout: nibble i the code of
 * value i) as int8 values x2 (e2m1_q1: 0, 1, 2, 3, 4, 6, 8, 12 and their
 * negatives): lo the values of nibbles 0-3, hi of nibbles 4-7. A byte
 * permute looks up the magnitudes' table and the negated table with each
 * nibble's low 3 bits; a third picks, per byte, the negated one where the
 * nibble's bit 3 is set. Exact: a table lookup. */
__device__ static inline void e2m1x8_q1(uint32_t w, uint32_t &lo, uint32_t &hi) {
    const uint32_t s7 = w & 0x77777777u, sg = ((w >> 1) & 0x44444444u) | 0x32103210u;
    const uint32_t P0 = 0x03020100u, P1 = 0x0C080604u, N0 = 0xFDFEFF00u, N1 = 0xF4F8FAFCu;
    lo = __byte_perm(__byte_perm(P0, P1, s7), __byte_perm(N0, N1, s7), sg);
    const uint32_t s7h = s7 >> 16;
    hi = __byte_perm(__byte_perm(P0, P1, s7h), __byte_perm(N0, N1, s7h), sg >> 16);
}

/* A piece's two 16-value groups against their activations: dot of the low
 * half-words (x16 lo) and of the high ones (x16 hi). */
__device__ static inline void fp4_piece(uint4 q, uint4 xl, uint4 xh, int32_t &dl, int32_t &dh) {
    uint32_t l0, h0, l1, h1, l2, h2, l3, h3;
    e2m1x8_q1(q.x, l0, h0), e2m1x8_q1(q.y, l1, h1), e2m1x8_q1(q.z, l2, h2), e2m1x8_q1(q.w, l3, h3);
    dl = dp4a_u4(make_uint4(l0, l1, l2, l3), xl, 0);
    dh = dp4a_u4(make_uint4(h0, h1, h2, h3), xh, 0);
}

/* e4m3fn_q9 of every byte, for the NVFP4 products' scales: filled by the
 * CTA's threads, then a barrier (every thread must reach it). */
__device__ static inline void fp4_table(int32_t *q9) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) q9[i] = e4m3fn_q9((uint8_t)i);
    __syncthreads();
}

/* The activations of a lane's two code pieces (Q4_K / Q5_K / NVFP4 split):
 * from p = the piece a's first value, values p, p + 32 (piece a's low and
 * high nibbles), p + 128, p + 160 (piece b's), 16 each. */
__device__ static inline void x_pieces(const int8_t *p, uint4 &al, uint4 &ah, uint4 &bl, uint4 &bh) {
    al = __ldg((const uint4 *)p), ah = __ldg((const uint4 *)(p + 32));
    bl = __ldg((const uint4 *)(p + 128)), bh = __ldg((const uint4 *)(p + 160));
}

/* A K-quant block's share of one lane of its 4-lane group (load_wq2's
 * pieces) decoded once, whatever the activations it meets: the 16 code
 * words as values (Q5_K with their fifth bit, Q6_K less 32), the 4
 * sub-block scales and (Q4_K / Q5_K) mins it needs, and d / dmin. Used by
 * k_mmv6. block_f2 below still spells the same arithmetic out: rebuilt on
 * these helpers it compiled to other register counts for k_mmv2/3/4
 * (k_mmv4_set<2, 2>: 79 against 72), a change not yet timed on a GPU. */
struct kq_lane {
    uint4 alo, ahi, blo, bhi;
    int32_t s0, s1, s2, s3; /* the scales of alo, ahi, blo, bhi */
    int32_t m0, m1, m2, m3; /* Q4_K / Q5_K: their mins */
    float d, dmin;
};
/* The activations that meet a lane's share: four 16-value pieces in the
 * order of kq_lane's words, the block's d, and (Q4_K / Q5_K) the bsums of
 * the four sub-blocks (pieces). Which values: x_pieces' (Q4_K / Q5_K) or
 * 16t + 64i (Q6_K). */
struct kq_acts {
    uint4 al, ah, bl, bh;
    int32_t b0, b1, b2, b3;
    float d;
};

template <int TYPE>
__device__ static inline kq_lane kq_lane_unpack(const wq2 &s, int t) {
    kq_lane k;
    if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        /* piece a: qs bytes [16t, 16t+16) = pair ja = t>>1 (sub-blocks 2ja, 2ja+1), l = 16(t&1)..;
         * piece b: the same l in pair ja + 2. Low nibbles: values 64j + l, high: 64j + 32 + l. */
        k.alo = nib_lo(s.a), k.ahi = nib_hi(s.a), k.blo = nib_lo(s.b), k.bhi = nib_hi(s.b);
        const int ja = t >> 1;
        if (TYPE == T_Q5_K) {
            k.alo = or_bit5(k.alo, s.h, 2 * ja), k.ahi = or_bit5(k.ahi, s.h, 2 * ja + 1);
            k.blo = or_bit5(k.blo, s.h, 2 * ja + 4), k.bhi = or_bit5(k.bhi, s.h, 2 * ja + 5);
        }
        /* the 8 scales and mins, unpacked four to a word (scale_min_k4's rule) */
        const kq_scmin m = kq_scales_mins(s.hdr.y, s.hdr.z, s.hdr.w);
        const int sh = 16 * ja;
        k.s0 = (m.sc03 >> sh) & 0xFF, k.s1 = (m.sc03 >> (sh + 8)) & 0xFF;
        k.s2 = (m.sc47 >> sh) & 0xFF, k.s3 = (m.sc47 >> (sh + 8)) & 0xFF;
        k.m0 = (m.mn03 >> sh) & 0xFF, k.m1 = (m.mn03 >> (sh + 8)) & 0xFF;
        k.m2 = (m.mn47 >> sh) & 0xFF, k.m3 = (m.mn47 >> (sh + 8)) & 0xFF;
        k.d = h2f((uint16_t)(s.hdr.x & 0xFFFF)), k.dmin = h2f((uint16_t)(s.hdr.x >> 16));
    } else {
        /* piece a: ql bytes [16t, 16t+16) of half 0, piece b: of half 1; l0 = 16t: low nibbles give
         * values 128h + l0 (sub-block 8h + t), high nibbles 128h + 64 + l0 (sub-block 8h + 4 + t);
         * their 2 high bits sit in qh[32h + (l0 & 31) ...] at bits 2(t>>1) and 4 + 2(t>>1). */
        const int sl = 2 * (t >> 1), shh = 4 + 2 * (t >> 1);
        k.alo = q6_vals(nib_lo(s.a), s.h, sl), k.ahi = q6_vals(nib_hi(s.a), s.h, shh);
        k.blo = q6_vals(nib_lo(s.b), s.h2, sl), k.bhi = q6_vals(nib_hi(s.b), s.h2, shh);
        const int bsh = 8 * t; /* scale k + 4i is byte t of word i */
        k.s0 = (int8_t)(s.hdr.x >> bsh), k.s1 = (int8_t)(s.hdr.y >> bsh);
        k.s2 = (int8_t)(s.hdr.z >> bsh), k.s3 = (int8_t)(s.hdr.w >> bsh);
        k.m0 = k.m1 = k.m2 = k.m3 = 0;
        k.d = h2f((uint16_t)s.d6), k.dmin = 0.0f;
    }
    return k;
}

/* f_b of the block for one row, in every lane of the group: the integer
 * sums (exact in any order) folded over the group's 4 lanes, then the
 * formula of the reference (docs/numerics.md). All 32 lanes must call it. */
template <int TYPE>
__device__ static inline float kq_lane_f(const kq_lane &k, const kq_acts &x) {
    int32_t sumi = k.s0 * dp4a_u4(k.alo, x.al, 0) + k.s1 * dp4a_u4(k.ahi, x.ah, 0) + k.s2 * dp4a_u4(k.blo, x.bl, 0) +
                   k.s3 * dp4a_u4(k.bhi, x.bh, 0);
    if (TYPE == T_Q6_K) {
        sumi += __shfl_xor_sync(FULL_MASK, sumi, 1);
        sumi += __shfl_xor_sync(FULL_MASK, sumi, 2);
        return (k.d * x.d) * (float)sumi;
    }
    int32_t summ = k.m0 * x.b0 + k.m1 * x.b1 + k.m2 * x.b2 + k.m3 * x.b3;
    sumi += __shfl_xor_sync(FULL_MASK, sumi, 1);
    summ += __shfl_xor_sync(FULL_MASK, summ, 1);
    sumi += __shfl_xor_sync(FULL_MASK, sumi, 2);
    summ += __shfl_xor_sync(FULL_MASK, summ, 2);
    return (k.d * x.d) * (float)sumi - (k.dmin * x.d) * (float)summ;
}

/* This lane's f_b share for rows r < nr: integer sums folded over the 4
 * lanes of the block, then the formula (every lane of the group holds it).
 * NVFP4 (is_fp4): q9 is fp4_table's table in shared memory; native: the
 * block's f_b times s2 (scale2), as dot_nvfp4_native's caller does. */
template <int TYPE, int R>
__device__ static inline void block_f2(const wq2 &s, int b, int nb, int t, const q8split &xq, int nr, float *f,
                                       const int32_t *q9 = nullptr, float s2 = 1.0f) {
    const int64_t n_in = (int64_t)nb * 256;
    if (is_fp4(TYPE)) {
        /* lane t: groups of values offa .. +15 (piece a low), offa + 32 (a high), offa + 128, offa + 160 (b) */
        const int offa = 64 * (t >> 1) + 16 * (t & 1);
        const uint32_t sc = s.hdr.x;
        const int32_t qa = q9[sc & 0xFF], qb = q9[(sc >> 8) & 0xFF], qc = q9[(sc >> 16) & 0xFF], qd = q9[sc >> 24];
#pragma unroll
        for (int r = 0; r < R; r++) {
            f[r] = 0.0f;
            if (r < nr) {
                uint4 xal, xah, xbl, xbh;
                x_pieces(xq.qs + r * n_in + (int64_t)b * 256 + offa, xal, xah, xbl, xbh);
                int32_t da, db, dc, dd;
                fp4_piece(s.a, xal, xah, da, db);
                fp4_piece(s.b, xbl, xbh, dc, dd);
                /* |dot| <= 16 * 12 * 127 and q9 <= 15 << 14: each product needs 64 bits (docs/numerics.md) */
                long long it = (long long)da * qa + (long long)db * qb + (long long)dc * qc + (long long)dd * qd;
                it += __shfl_xor_sync(FULL_MASK, it, 1);
                it += __shfl_xor_sync(FULL_MASK, it, 2);
                f[r] = ((float)it * 0x1p-10f) * __ldg(xq.d + (int64_t)r * nb + b);
                if (TYPE == T_NVFP4_NATIVE) f[r] = f[r] * s2;
            }
        }
    } else if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        /* piece a: qs bytes [16t, 16t+16) = pair ja = t>>1 (sub-blocks 2ja, 2ja+1), l = 16(t&1)..;
         * piece b: the same l in pair ja + 2. Low nibbles: values 64j + l, high: 64j + 32 + l. */
        uint4 alo = nib_lo(s.a), ahi = nib_hi(s.a), blo = nib_lo(s.b), bhi = nib_hi(s.b);
        const int ja = t >> 1;
        if (TYPE == T_Q5_K) {
            alo = or_bit5(alo, s.h, 2 * ja), ahi = or_bit5(ahi, s.h, 2 * ja + 1);
            blo = or_bit5(blo, s.h, 2 * ja + 4), bhi = or_bit5(bhi, s.h, 2 * ja + 5);
        }
        /* the 8 scales and mins, unpacked four to a word (scale_min_k4's rule) */
        const kq_scmin k = kq_scales_mins(s.hdr.y, s.hdr.z, s.hdr.w);
        const int sh = 16 * ja;
        const int32_t sa_l = (k.sc03 >> sh) & 0xFF, sa_h = (k.sc03 >> (sh + 8)) & 0xFF;
        const int32_t sb_l = (k.sc47 >> sh) & 0xFF, sb_h = (k.sc47 >> (sh + 8)) & 0xFF;
        const int32_t ma_l = (k.mn03 >> sh) & 0xFF, ma_h = (k.mn03 >> (sh + 8)) & 0xFF;
        const int32_t mb_l = (k.mn47 >> sh) & 0xFF, mb_h = (k.mn47 >> (sh + 8)) & 0xFF;
        const float d = h2f((uint16_t)(s.hdr.x & 0xFFFF)), dmin = h2f((uint16_t)(s.hdr.x >> 16));
        const int offa = 64 * ja + 16 * (t & 1); /* values of piece a's low nibbles */
#pragma unroll
        for (int r = 0; r < R; r++) {
            f[r] = 0.0f;
            if (r < nr) {
                uint4 xal, xah, xbl, xbh;
                x_pieces(xq.qs + r * n_in + (int64_t)b * 256 + offa, xal, xah, xbl, xbh);
                const int16_t *bs = xq.bs + ((int64_t)r * nb + b) * 16 + offa / 16;
                int32_t sumi = sa_l * dp4a_u4(alo, xal, 0) + sa_h * dp4a_u4(ahi, xah, 0) +
                               sb_l * dp4a_u4(blo, xbl, 0) + sb_h * dp4a_u4(bhi, xbh, 0);
                int32_t summ = ma_l * (int32_t)__ldg(bs) + ma_h * (int32_t)__ldg(bs + 2) + mb_l * (int32_t)__ldg(bs + 8) +
                               mb_h * (int32_t)__ldg(bs + 10);
                sumi += __shfl_xor_sync(FULL_MASK, sumi, 1);
                summ += __shfl_xor_sync(FULL_MASK, summ, 1);
                sumi += __shfl_xor_sync(FULL_MASK, sumi, 2);
                summ += __shfl_xor_sync(FULL_MASK, summ, 2);
                const float xd = __ldg(xq.d + (int64_t)r * nb + b);
                f[r] = (d * xd) * (float)sumi - (dmin * xd) * (float)summ;
            }
        }
    } else { /* Q6_K split layout */
        /* piece a: ql bytes [16t, 16t+16) of half 0, piece b: of half 1; l0 = 16t: low nibbles give
         * values 128h + l0 (sub-block 8h + t), high nibbles 128h + 64 + l0 (sub-block 8h + 4 + t);
         * their 2 high bits sit in qh[32h + (l0 & 31) ...] at bits 2(t>>1) and 4 + 2(t>>1). */
        const int sl = 2 * (t >> 1), shh = 4 + 2 * (t >> 1);
        const uint4 alo = q6_vals(nib_lo(s.a), s.h, sl), ahi = q6_vals(nib_hi(s.a), s.h, shh);
        const uint4 blo = q6_vals(nib_lo(s.b), s.h2, sl), bhi = q6_vals(nib_hi(s.b), s.h2, shh);
        const int bsh = 8 * t; /* scale k + 4i is byte t of word i */
        const int32_t s0 = (int8_t)(s.hdr.x >> bsh), s1 = (int8_t)(s.hdr.y >> bsh);
        const int32_t s2 = (int8_t)(s.hdr.z >> bsh), s3 = (int8_t)(s.hdr.w >> bsh);
        const float d = h2f((uint16_t)s.d6);
        const int l0 = 16 * t;
#pragma unroll
        for (int r = 0; r < R; r++) {
            f[r] = 0.0f;
            if (r < nr) {
                const int8_t *xr = xq.qs + r * n_in + (int64_t)b * 256;
                const uint4 xal = __ldg((const uint4 *)(xr + l0)), xah = __ldg((const uint4 *)(xr + 64 + l0));
                const uint4 xbl = __ldg((const uint4 *)(xr + 128 + l0)), xbh = __ldg((const uint4 *)(xr + 192 + l0));
                int32_t sumi = s0 * dp4a_u4(alo, xal, 0) + s1 * dp4a_u4(ahi, xah, 0) + s2 * dp4a_u4(blo, xbl, 0) +
                               s3 * dp4a_u4(bhi, xbh, 0);
                sumi += __shfl_xor_sync(FULL_MASK, sumi, 1);
                sumi += __shfl_xor_sync(FULL_MASK, sumi, 2);
                f[r] = (d * __ldg(xq.d + (int64_t)r * nb + b)) * (float)sumi;
            }
        }
    }
}

/* A row total as a product of the weight-streaming kernels writes it:
 * native NVFP4 rounds it through f16 (its f_b carry scale2), the others
 * apply the optional per-tensor scale. */
__device__ static inline float row_out(int type, float total, int has_scale, float scale) {
    if (type == T_NVFP4_NATIVE) return round_f16(total);
    return has_scale ? total * scale : total;
}

/* One output o of one weight, by one warp. The first step's weights are
 * loaded before grid_dep_wait (they are never written), so in a replayed
 * graph they are in flight while the previous kernels finish. Each step's
 * 8 f_b per row reach the row's total in block order: at 1 row by
 * broadcast shuffles (every lane keeps the total); at R >= 2 rows the group
 * leaders put them in shared memory and lane r adds row r's eight (8 loads
 * and adds per lane instead of 8 R shuffles and adds in every lane). */
template <int TYPE, int R, int U>
__device__ static inline void mmv2_out(const uint8_t *W, int64_t n_out, int nb, const q8split &xq, int nr, int64_t o,
                                       float *y, int has_scale, float scale, const int32_t *q9 = nullptr) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    __shared__ float fs[4][8][R > 1 ? R : 1]; /* [warp][group][row]: blockDim 128 */
    float (*fw)[R > 1 ? R : 1] = fs[threadIdx.x >> 5];
    float total[R], mine = 0.0f; /* mine: row `lane`'s total (R >= 2) */
#pragma unroll
    for (int r = 0; r < R; r++) total[r] = 0.0f;
    const uint8_t *q6sc = W + (size_t)n_out * nb * 192;
    const uint16_t *q6d = (const uint16_t *)(q6sc + (size_t)n_out * nb * 16);
    wq2 sh[U];
    auto load_step = [&](int b0) { /* the U steps of 8 blocks from block b0 (past the end: the last block) */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int bu = b0 + 8 * u + g;
            load_wq2<TYPE>(W, q6sc, q6d, o * nb + (bu < nb ? bu : nb - 1), t, sh[u]);
        }
    };
    load_step(0);
    grid_dep_wait();
    for (int b0 = 0; b0 < nb; b0 += 8 * U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int bu = b0 + 8 * u + g;
            float f[R];
            block_f2<TYPE, R>(sh[u], bu < nb ? bu : nb - 1, nb, t, xq, nr, f, q9, scale);
            if (R == 1) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float fj = __shfl_sync(FULL_MASK, f[0], 4 * j);
                    if (b0 + 8 * u + j < nb) total[0] = total[0] + fj;
                }
            } else {
                if (t == 0) {
#pragma unroll
                    for (int r = 0; r < R; r++) fw[g][r] = f[r];
                }
                __syncwarp();
                if (lane < R) {
#pragma unroll
                    for (int j = 0; j < 8; j++)
                        if (b0 + 8 * u + j < nb) mine = mine + fw[j][lane];
                }
                __syncwarp(); /* read before the next step writes */
            }
        }
        if (b0 + 8 * U < nb) load_step(b0 + 8 * U);
    }
    if (R == 1) {
        if (lane == 0) y[o] = row_out(TYPE, total[0], has_scale, scale);
    } else if (lane < nr && lane < R) {
        y[lane * n_out + o] = row_out(TYPE, mine, has_scale, scale);
    }
}

template <int TYPE, int R, int U>
__global__ static void __launch_bounds__(128) k_mmv2(const uint8_t *W, int64_t n_out, int nb, q8split xq, int nr,
                                                    float *y, int has_scale, float scale) {
    __shared__ int32_t q9[is_fp4(TYPE) ? 256 : 1];
    if (is_fp4(TYPE)) fp4_table(q9);
    const int64_t o = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (o >= n_out) return; /* touches nothing: no grid_dep_wait needed */
    mmv2_out<TYPE, R, U>(W, n_out, nb, xq, nr, o, y, has_scale, scale, q9);
}

/* Several weights reading the same activations (q/k/v/gate, ffn gate/up)
 * in one launch: the warps are numbered across the weights, each warp one
 * output of one weight (of any of the three types), so the small k/v
 * products no longer pay a launch and a memory ramp of their own. */
enum { MMV_SET_MAX = 4 };
struct mmv_set {
    const uint8_t *W[MMV_SET_MAX];
    float *y[MMV_SET_MAX];
    int64_t n_out[MMV_SET_MAX];
    int64_t first[MMV_SET_MAX + 1]; /* first unit of each weight: warp, output (k_mmv3_set) or 8-output slot (k_mmv4_set) */
    int type[MMV_SET_MAX], has_scale[MMV_SET_MAX];
    float scale[MMV_SET_MAX];
    int n;
};

/* The set's description, each weight's units (first[]) of `per` outputs. */
static mmv_set mmv_set_of(const mucu_weight *const *w, int n, float *const *y, int per) {
    mmv_set set = {};
    set.n = n;
    for (int i = 0; i < n; i++) {
        set.W[i] = w[i]->data, set.y[i] = y[i], set.n_out[i] = w[i]->n_out, set.type[i] = (int)w[i]->type;
        set.has_scale[i] = w[i]->has_scale, set.scale[i] = w[i]->scale;
        set.first[i + 1] = set.first[i] + (w[i]->n_out + per - 1) / per;
    }
    return set;
}

/* Which of a set's n weights unit v (a warp, output or slot, numbered
 * across the weights from first[0] = 0) belongs to. */
__device__ static inline int set_weight(const int64_t *first, int n, int64_t v) {
    int i = 0;
    while (i + 1 < n && v >= first[i + 1]) i++;
    return i;
}

template <int R, int U>
__global__ static void __launch_bounds__(128) k_mmv2_set(mmv_set set, int nb, q8split xq, int nr) {
    const int64_t wg = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int i = set_weight(set.first, set.n, wg);
    const int64_t o = wg - set.first[i];
    if (o >= set.n_out[i]) return; /* touches nothing: no grid_dep_wait needed */
    if (set.type[i] == T_Q4_K) mmv2_out<T_Q4_K, R, U>(set.W[i], set.n_out[i], nb, xq, nr, o, set.y[i], set.has_scale[i], set.scale[i]);
    else if (set.type[i] == T_Q5_K) mmv2_out<T_Q5_K, R, U>(set.W[i], set.n_out[i], nb, xq, nr, o, set.y[i], set.has_scale[i], set.scale[i]);
    else mmv2_out<T_Q6_K, R, U>(set.W[i], set.n_out[i], nb, xq, nr, o, set.y[i], set.has_scale[i], set.scale[i]);
}

/* v3: WPR warps per output (1, 2 or 4), so a row of many blocks (ffn_down:
 * 78) is read by several warps at once and a CTA of 4 warps holds 4/WPR
 * outputs; the grid has WPR times more warps for the same matrix, which
 * evens out the last wave. Warp wi of an output takes the 8-block steps
 * wi, wi + WPR, ... (U of them in flight); lane group g's f_b goes to
 * shared memory, and after the CTA's barrier one thread per (output, row)
 * adds that output's f_b in block order, from 0.0f as k_mmv2 does: the
 * same bits (docs/numerics.md). */
template <int TYPE, int R, int U, int WPR>
__device__ static inline void mmv3_part(const uint8_t *W, int64_t n_out, int nb, const q8split &xq, int nr, int64_t o,
                                        int wi, float *fs) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint8_t *q6sc = W + (size_t)n_out * nb * 192;
    const uint16_t *q6d = (const uint16_t *)(q6sc + (size_t)n_out * nb * 16);
    const int nsteps = (nb + 7) / 8;
    wq2 sh[U];
    auto load_round = [&](int k) { /* this warp's U steps of round k (past the end: the last block) */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int bu = 8 * (wi + WPR * (U * k + u)) + g;
            load_wq2<TYPE>(W, q6sc, q6d, o * nb + (bu < nb ? bu : nb - 1), t, sh[u]);
        }
    };
    load_round(0);
    grid_dep_wait();
    for (int k = 0; wi + WPR * U * k < nsteps; k++) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int st = wi + WPR * (U * k + u), bu = 8 * st + g;
            if (st < nsteps) { /* the same for the whole warp: block_f2's shuffles see every lane */
                float f[R];
                block_f2<TYPE, R>(sh[u], bu < nb ? bu : nb - 1, nb, t, xq, nr, f);
                if (t == 0 && bu < nb) {
#pragma unroll
                    for (int r = 0; r < R; r++) fs[r * nb + bu] = f[r];
                }
            }
        }
        if (wi + WPR * U * (k + 1) < nsteps) load_round(k + 1);
    }
}

/* after the barrier: thread (output l, row r) sums its f_b in block order */
template <int R, int WPR>
__device__ static inline void mmv3_sum(const float *fsm, int nb, int nr, int64_t o0, int64_t o_end, const int64_t *first,
                                       float *const *ys, const int64_t *n_outs, const int *has_scales,
                                       const float *scales, int nw) {
    const int tid = threadIdx.x;
    if (tid >= (4 / WPR) * R) return;
    const int l = tid / R, r = tid % R;
    const int64_t o = o0 + l; /* global output number (across the set's weights) */
    if (o >= o_end || r >= nr) return;
    const int i = set_weight(first, nw, o);
    const float *p = fsm + (l * R + r) * nb;
    float total = 0.0f;
    for (int b = 0; b < nb; b++) total = total + p[b];
    ys[i][r * n_outs[i] + (o - first[i])] = has_scales[i] ? total * scales[i] : total;
}

template <int TYPE, int R, int U, int WPR>
__global__ static void __launch_bounds__(128) k_mmv3(const uint8_t *W, int64_t n_out, int nb, q8split xq, int nr,
                                                    float *y, int has_scale, float scale) {
    extern __shared__ float fsm[]; /* [4 / WPR][R][nb] */
    const int warp = threadIdx.x >> 5, l = warp / WPR;
    const int64_t o0 = (int64_t)blockIdx.x * (4 / WPR), o = o0 + l;
    if (o < n_out) mmv3_part<TYPE, R, U, WPR>(W, n_out, nb, xq, nr, o, warp % WPR, fsm + l * R * nb);
    else grid_dep_wait();
    __syncthreads();
    const int64_t first[1] = {0};
    float *const ys[1] = {y};
    const int64_t n_outs[1] = {n_out};
    const int hs[1] = {has_scale};
    const float sc[1] = {scale};
    mmv3_sum<R, WPR>(fsm, nb, nr, o0, n_out, first, ys, n_outs, hs, sc, 1);
}

template <int R, int U, int WPR>
__global__ static void __launch_bounds__(128) k_mmv3_set(mmv_set set, int nb, q8split xq, int nr) {
    extern __shared__ float fsm[]; /* [4 / WPR][R][nb] */
    const int warp = threadIdx.x >> 5, l = warp / WPR, wi = warp % WPR;
    const int64_t o0 = (int64_t)blockIdx.x * (4 / WPR), wg = o0 + l;
    const int i = set_weight(set.first, set.n, wg);
    const int64_t o = wg - set.first[i];
    float *fs = fsm + l * R * nb;
    if (o >= set.n_out[i]) grid_dep_wait();
    else if (set.type[i] == T_Q4_K) mmv3_part<T_Q4_K, R, U, WPR>(set.W[i], set.n_out[i], nb, xq, nr, o, wi, fs);
    else if (set.type[i] == T_Q5_K) mmv3_part<T_Q5_K, R, U, WPR>(set.W[i], set.n_out[i], nb, xq, nr, o, wi, fs);
    else mmv3_part<T_Q6_K, R, U, WPR>(set.W[i], set.n_out[i], nb, xq, nr, o, wi, fs);
    __syncthreads();
    mmv3_sum<R, WPR>(fsm, nb, nr, o0, set.first[set.n], set.first, set.y, set.n_out, set.has_scale, set.scale, set.n);
}

/* v4, one activation row: a warp takes 8 outputs (lane group g output
 * 8s + g of slot s) and at each step every group reads the same block b of
 * its own output. Why: under Nsight Compute k_mmv2 at 1 row was bound by
 * L1 wavefronts, not DRAM (ffn gate+up: 83 % L1/TEX throughput at 2.1 TB/s):
 * its 8 groups read 8 consecutive blocks, so each of a lane's activation
 * loads touched 8 cache lines; here the 8 groups' activation loads are the
 * same 64 bytes per lane (one line per load), and each group adds its own
 * f_b to its own total, with no broadcast of the step's f_b. WPR = 1, 2 or
 * 4 warps share a slot (warp wi takes blocks wi, wi + WPR, ...; U of them
 * in flight, a slot's load reissued as soon as its block is used); with
 * WPR > 1 each block's f_b goes to shared memory and, after the CTA's
 * barrier, a thread per output adds them in block order from 0.0f, as the
 * reference does. Slots are numbered across the weights of a set. */
template <int TYPE, int U, int WPR>
__device__ static inline float mmv4_part(const uint8_t *W, int64_t n_out, int nb, const q8split &xq, int64_t o, int wi,
                                         float *fs, const int32_t *q9 = nullptr, float s2 = 1.0f) {
    const int t = threadIdx.x & 3;
    const int64_t oc = o < n_out ? o : n_out - 1; /* past the end: load a real row, store nothing */
    const uint8_t *q6sc = W + (size_t)n_out * nb * 192;
    const uint16_t *q6d = (const uint16_t *)(q6sc + (size_t)n_out * nb * 16);
    const int K = (nb - wi + WPR - 1) / WPR; /* this warp's blocks */
    wq2 sh[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int b = wi + WPR * u;
        load_wq2<TYPE>(W, q6sc, q6d, oc * nb + (b < nb ? b : nb - 1), t, sh[u]);
    }
    grid_dep_wait();
    float total = 0.0f;
    for (int k0 = 0; k0 < K; k0 += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = k0 + u;
            if (k < K) { /* the same for the whole warp: block_f2's shuffles see every lane */
                const int b = wi + WPR * k;
                float f[1];
                block_f2<TYPE, 1>(sh[u], b, nb, t, xq, 1, f, q9, s2);
                if (WPR == 1) total = total + f[0];
                else if (t == 0) fs[b] = f[0];
                if (k + U < K) load_wq2<TYPE>(W, q6sc, q6d, oc * nb + wi + WPR * (k + U), t, sh[u]);
            }
        }
    }
    return total;
}

/* set.first: the first slot (8 outputs) of each weight. FP4: every weight
 * of the set is NVFP4 in the split layout (ggml or native), else every
 * one a K-quant. */
template <int U, int WPR, bool FP4>
__global__ static void __launch_bounds__(128) k_mmv4_set(mmv_set set, int nb, q8split xq) {
    extern __shared__ float fsm[]; /* WPR > 1: [4 / WPR slots][8 outputs][nb] */
    __shared__ int32_t q9[FP4 ? 256 : 1];
    if (FP4) fp4_table(q9);
    const int warp = threadIdx.x >> 5, g = (threadIdx.x >> 2) & 7, sl = warp / WPR;
    const int64_t slot = (int64_t)blockIdx.x * (4 / WPR) + sl;
    const int i = set_weight(set.first, set.n, slot);
    const int64_t o = (slot - set.first[i]) * 8 + g;
    float *fs = fsm + (sl * 8 + g) * nb;
    float total = 0.0f;
    if (slot >= set.first[set.n]) {
        if (WPR == 1) return; /* touches nothing: no grid_dep_wait needed */
        grid_dep_wait();
    } else if (FP4) {
        if (set.type[i] == T_NVFP4_NATIVE)
            total = mmv4_part<T_NVFP4_NATIVE, U, WPR>(set.W[i], set.n_out[i], nb, xq, o, warp % WPR, fs, q9, set.scale[i]);
        else total = mmv4_part<T_NVFP4, U, WPR>(set.W[i], set.n_out[i], nb, xq, o, warp % WPR, fs, q9);
    } else if (set.type[i] == T_Q4_K) total = mmv4_part<T_Q4_K, U, WPR>(set.W[i], set.n_out[i], nb, xq, o, warp % WPR, fs);
    else if (set.type[i] == T_Q5_K) total = mmv4_part<T_Q5_K, U, WPR>(set.W[i], set.n_out[i], nb, xq, o, warp % WPR, fs);
    else total = mmv4_part<T_Q6_K, U, WPR>(set.W[i], set.n_out[i], nb, xq, o, warp % WPR, fs);
    if (WPR == 1) {
        if ((threadIdx.x & 3) == 0 && slot < set.first[set.n] && o < set.n_out[i])
            set.y[i][o] = row_out(set.type[i], total, set.has_scale[i], set.scale[i]);
        return;
    }
    __syncthreads();
    /* thread l < 32 / WPR: output l % 8 of the CTA's slot l / 8 */
    const int l = threadIdx.x;
    if (l >= 32 / WPR) return;
    const int64_t s2 = (int64_t)blockIdx.x * (4 / WPR) + l / 8;
    if (s2 >= set.first[set.n]) return;
    const int j = set_weight(set.first, set.n, s2);
    const int64_t o2 = (s2 - set.first[j]) * 8 + l % 8;
    if (o2 >= set.n_out[j]) return;
    const float *p = fsm + l * nb;
    float sum = 0.0f;
    for (int b = 0; b < nb; b++) sum = sum + p[b];
    set.y[j][o2] = row_out(set.type[j], sum, set.has_scale[j], set.scale[j]);
}

/* v6, one activation row, the activations in registers: a CTA has a
 * 4-lane group per 256-block of the row (ceil(nb / 8) warps; groups past
 * nb repeat the last block and store nothing), and group j keeps the
 * pieces of block j's activations it meets for the whole launch. The CTA
 * takes units of U outputs (numbered across the set's weights, first[]
 * counting units), grid-stride: every group loads block j of the unit's U
 * outputs, so a warp's loads cover 8 consecutive blocks of a weight row
 * (whole sectors, no activation loads beside them), and puts f_j in shared
 * memory; after the CTA's barrier one lane per output adds its nb f_b in
 * block order from 0.0f, as the reference does (docs/numerics.md), while
 * the next unit's loads are in flight. Why: k_mmv4 stayed 25-30 % below a
 * plain read with its L1 busy with the activations' broadcast loads
 * (docs/benchmarks.md "Kernels alone"). TM: the set's types (1
 * Q4_K, 2 Q5_K, 4 Q6_K, 5 Q4_K and Q6_K, 7 any), so each instance holds
 * only the registers its types need. AL 0: the Q4_K / Q5_K pieces stay
 * (a Q6_K weight among them loads its own, as block_f2 does); AL 1
 * (every weight Q6_K): the Q6_K pieces stay. P: units whose weights sit
 * in registers at once (2: the next unit's loads issued before this
 * unit's arithmetic; measured slower, the registers cost occupancy). */
enum { MMV6_MAX_NB = 80 }; /* 10 warps: ffn_down's 78 blocks */
template <int TYPE, int U>
__device__ static inline void mmv6_load(const mmv_set &set, int i, int64_t o0, int nb, int j, int t, wq2 *sh) {
    const uint8_t *W = set.W[i];
    const int64_t n_out = set.n_out[i];
    const uint8_t *q6sc = W + (size_t)n_out * nb * 192;
    const uint16_t *q6d = (const uint16_t *)(q6sc + (size_t)n_out * nb * 16);
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int64_t o = o0 + u < n_out ? o0 + u : n_out - 1; /* past the end: a real row, stored nowhere */
        load_wq2<TYPE>(W, q6sc, q6d, o * nb + j, t, sh[u]);
    }
}

template <int TYPE, int U, int AL>
__device__ static inline void mmv6_f(const wq2 *sh, const kq_acts &x, int nb, int j, int t, const q8split &xq,
                                     float *fs) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        float f;
        if (AL == 0 && TYPE == T_Q6_K) block_f2<T_Q6_K, 1>(sh[u], j, nb, t, xq, 1, &f);
        else f = kq_lane_f<TYPE>(kq_lane_unpack<TYPE>(sh[u], t), x);
        if (t == 0 && (int)(threadIdx.x >> 2) < nb) fs[u * nb + j] = f;
    }
}

/* Which of the set's types weight i has, as TM allows (a macro: the
 * template arguments differ by type). */
#define MMV6_TYPES(M)                                                                                               \
    do {                                                                                                            \
        if (TM == 1) M(T_Q4_K);                                                                                     \
        else if (TM == 2) M(T_Q5_K);                                                                                \
        else if (TM == 4) M(T_Q6_K);                                                                                \
        else if ((TM & 1) && set.type[i] == T_Q4_K) M(T_Q4_K);                                                      \
        else if ((TM & 2) && set.type[i] == T_Q5_K) M(T_Q5_K);                                                      \
        else M(T_Q6_K);                                                                                             \
    } while (0)
#define MMV6_LOAD(T) mmv6_load<T, U>(set, i, o0, nb, j, t, sh)
#define MMV6_LOAD_INTO_1(T) mmv6_load<T, U>(set, i, o0, nb, j, t, sh[P - 1])

/* The first unit's weights (before the wait: nothing writes them), then
 * group j's activations of block j (after it). */
template <int U, int TM>
__device__ static inline void mmv6_first(const mmv_set &set, int i, int64_t o0, int nb, int j, int t, wq2 *sh,
                                         const q8split &xq, kq_acts &x) {
    MMV6_TYPES(MMV6_LOAD);
    grid_dep_wait();
    if (TM != 4) {
        const int offa = 64 * (t >> 1) + 16 * (t & 1);
        x_pieces(xq.qs + (int64_t)j * 256 + offa, x.al, x.ah, x.bl, x.bh);
        const int16_t *bs = xq.bs + (int64_t)j * 16 + offa / 16;
        x.b0 = __ldg(bs), x.b1 = __ldg(bs + 2), x.b2 = __ldg(bs + 8), x.b3 = __ldg(bs + 10);
    } else {
        const int8_t *xr = xq.qs + (int64_t)j * 256 + 16 * t;
        x.al = __ldg((const uint4 *)xr), x.ah = __ldg((const uint4 *)(xr + 64));
        x.bl = __ldg((const uint4 *)(xr + 128)), x.bh = __ldg((const uint4 *)(xr + 192));
        x.b0 = x.b1 = x.b2 = x.b3 = 0;
    }
    x.d = __ldg(xq.d + j);
}

template <int U, int TM, int P>
__global__ static void __launch_bounds__(32 * ((MMV6_MAX_NB + 7) / 8)) k_mmv6_set(mmv_set set, int nb, q8split xq) {
    constexpr int AL = TM == 4 ? 1 : 0;
    extern __shared__ float fsm[]; /* [2][U][nb]: a unit's f_b, double-buffered */
    const int t = threadIdx.x & 3, j = (int)(threadIdx.x >> 2) < nb ? (int)(threadIdx.x >> 2) : nb - 1;
    const int64_t units = set.first[set.n], step = gridDim.x;
    int64_t unit = blockIdx.x;
    int i = set_weight(set.first, set.n, unit);
    int64_t o0 = (unit - set.first[i]) * U;
    wq2 sh[P][U]; /* P = 2: the next unit's weights in flight while this one's are used */
    kq_acts x;
    mmv6_first<U, TM>(set, i, o0, nb, j, t, sh[0], xq, x);
    if (P == 2 && unit + step < units) {
        i = set_weight(set.first, set.n, unit + step);
        o0 = (unit + step - set.first[i]) * U;
        MMV6_TYPES(MMV6_LOAD_INTO_1);
    }
    const int warps = (int)(blockDim.x >> 5), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int buf = 0;
    /* unit `unit` from registers c; then the unit P steps on into them */
    auto one = [&](wq2 *c) {
        i = set_weight(set.first, set.n, unit);
        o0 = (unit - set.first[i]) * U;
        float *fs = fsm + buf * U * nb;
#define MMV6_F(T) mmv6_f<T, U, AL>(c, x, nb, j, t, xq, fs)
        MMV6_TYPES(MMV6_F);
#undef MMV6_F
        const int ci = i;
        const int64_t co0 = o0;
        if (unit + P * step < units) {
            i = set_weight(set.first, set.n, unit + P * step);
            o0 = (unit + P * step - set.first[i]) * U;
            wq2 *sh0 = c;
#define MMV6_LOAD_C(T) mmv6_load<T, U>(set, i, o0, nb, j, t, sh0)
            MMV6_TYPES(MMV6_LOAD_C);
#undef MMV6_LOAD_C
        }
        __syncthreads();
        /* output u of the unit: lane 0 of warp u % warps */
        if (lane == 0)
            for (int u = warp; u < U; u += warps) {
                if (co0 + u >= set.n_out[ci]) break;
                const float *p = fs + u * nb;
                float total = 0.0f;
                for (int b = 0; b < nb; b++) total = total + p[b];
                set.y[ci][co0 + u] = row_out(set.type[ci], total, set.has_scale[ci], set.scale[ci]);
            }
        unit += step;
        buf ^= 1;
    };
    while (unit < units) {
        one(sh[0]);
        if (P == 2 && unit < units) one(sh[P - 1]);
    }
}
#undef MMV6_LOAD_INTO_1
#undef MMV6_LOAD
#undef MMV6_TYPES

/* Benchmarks only (test_cuda_backend --bench-mmv): k_mmv2's Q4_K weight
 * loads with no arithmetic, to see what its access pattern alone reaches. */
template <int U>
__global__ static void __launch_bounds__(128) k_mmv2_loads(const uint8_t *W, int64_t n_out, int nb, float *y) {
    grid_dep_wait();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t o = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (o >= n_out) return;
    uint32_t acc = 0;
    for (int b0 = 0; b0 < nb; b0 += 8 * U) {
        wq2 sh[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int bu = b0 + 8 * u + g;
            load_wq2<T_Q4_K>(W, NULL, NULL, o * nb + (bu < nb ? bu : nb - 1), t, sh[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            acc ^= sh[u].a.x ^ sh[u].a.w ^ sh[u].b.y ^ sh[u].b.z ^ sh[u].hdr.x ^ sh[u].hdr.w;
    }
    if (acc == 0x12345678u) y[o] = 1.0f;
}

extern "C" bool mucu_bench_loads(const mucu_weight *w, int u, float *y, char *err) {
    const unsigned grid = grid_for(w->n_out, 4);
    const int nb = (int)(w->n_in / 256);
    if (u >= 4) k_mmv2_loads<4><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nb, y);
    else if (u >= 2) k_mmv2_loads<2><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nb, y);
    else k_mmv2_loads<1><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nb, y);
    return launched("k_mmv2_loads", err);
}

/* Benchmarks only: a plain coalesced read of `bytes` at p. */
extern "C" bool mucu_bench_read(const void *p, size_t bytes, void *out, char *err) {
    k_read_sum<<<132 * 16, 512, 0, g_s>>>((const uint4 *)p, bytes / 16, (unsigned *)out);
    return launched("k_read_sum", err);
}

/* ------------------------------------------------ a layer's reads in a row
 * Benchmarks only (test_cuda_backend --bench-chain): how fast a decode
 * layer's four weight reads (q/k/v/gate, o, gate+up, down) can stream one
 * after another when nothing but the reading is done, so that the products'
 * own losses can be told from what any sequence of kernels loses between
 * them. Variants: 1 one kernel per read, ordinary graph edges; 2 the same
 * with programmatic edges (the decode graphs' kind) and every load after
 * the wait; 3 the first loads of each CTA before the wait (as the products
 * issue theirs); 4 one persistent kernel, a grid barrier between reads; 5
 * the same with each CTA's first loads of the next read issued before the
 * barrier. Each CTA writes the XOR of the words it read (out[read * grid +
 * CTA]), so the host can check that every byte was read once. */
__device__ static inline uint4 chain_ld(const uint4 *p, size_t i, size_t n) {
    return i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
}
__device__ static inline void chain_put(unsigned acc, unsigned *out) {
    acc = __reduce_xor_sync(FULL_MASK, acc);
    __shared__ unsigned w[32];
    if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned a = 0;
        for (unsigned i = 0; i < blockDim.x / 32; i++) a ^= w[i];
        out[blockIdx.x] = a;
    }
    __syncthreads();
}
enum { CHAIN_U = 4 }; /* 16-byte loads a thread keeps in flight */
/* The CTA's first CHAIN_U loads of p[0, n), before the wait when PRE. */
template <bool PRE> __device__ static inline void chain_first(const uint4 *p, size_t n, uint4 v[CHAIN_U]) {
    const size_t b = (size_t)blockIdx.x * blockDim.x * CHAIN_U + threadIdx.x;
    if (PRE)
#pragma unroll
        for (int u = 0; u < CHAIN_U; u++) v[u] = chain_ld(p, b + u * blockDim.x, n);
    grid_dep_wait();
    if (!PRE)
#pragma unroll
        for (int u = 0; u < CHAIN_U; u++) v[u] = chain_ld(p, b + u * blockDim.x, n);
}
/* XOR of the CTA's share of p[0, n), its first loads already in v */
__device__ static inline unsigned chain_rest(const uint4 *p, size_t n, uint4 v[CHAIN_U]) {
    const size_t step = (size_t)gridDim.x * blockDim.x * CHAIN_U;
    unsigned acc = 0;
    for (size_t b = (size_t)blockIdx.x * blockDim.x * CHAIN_U + threadIdx.x;;) {
#pragma unroll
        for (int u = 0; u < CHAIN_U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        b += step;
        if (b >= n) break;
#pragma unroll
        for (int u = 0; u < CHAIN_U; u++) v[u] = chain_ld(p, b + u * blockDim.x, n);
    }
    return acc;
}
template <bool PRE>
__global__ static void __launch_bounds__(512) k_chain_read(const uint4 *p, size_t n, unsigned *out) {
    uint4 v[CHAIN_U];
    chain_first<PRE>(p, n, v);
    chain_put(chain_rest(p, n, v), out);
}
template <bool PRE>
__global__ static void __launch_bounds__(512)
    k_chain_persist(const uint4 *p, const unsigned long long *off, int n_read, unsigned *ctr, unsigned *out) {
    grid_dep_wait();
    uint4 v[CHAIN_U];
    const size_t b0 = (size_t)blockIdx.x * blockDim.x * CHAIN_U + threadIdx.x;
#pragma unroll
    for (int u = 0; u < CHAIN_U; u++) v[u] = chain_ld(p, b0 + u * blockDim.x, off[1]);
    for (int r = 0; r < n_read; r++) {
        const uint4 *q = p + off[r];
        chain_put(chain_rest(q, off[r + 1] - off[r], v), out + (size_t)r * gridDim.x);
        if (r + 1 == n_read) break;
        const uint4 *nq = p + off[r + 1];
        const size_t nn = off[r + 2] - off[r + 1];
        if (PRE)
#pragma unroll
            for (int u = 0; u < CHAIN_U; u++) v[u] = chain_ld(nq, b0 + u * blockDim.x, nn);
        /* grid barrier: the arrivals count up over the whole launch */
        if (threadIdx.x == 0) {
            atomicAdd(ctr, 1u);
            const unsigned target = (unsigned)(r + 1) * gridDim.x;
            unsigned c;
            do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(c) : "l"(ctr) : "memory");
            while (c < target);
        }
        __syncthreads();
        if (!PRE)
#pragma unroll
            for (int u = 0; u < CHAIN_U; u++) v[u] = chain_ld(nq, b0 + u * blockDim.x, nn);
    }
}

__host__ __device__ static inline uint32_t chain_word(uint64_t i) { /* the buffer's word i (splitmix64's finalizer) */
    uint64_t z = i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}
__global__ static void k_chain_fill(uint32_t *p, size_t n) {
    grid_dep_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = chain_word(i);
}

static float chain_median(float *t, int n) { /* insertion sort, then the middle one */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            const float x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    return t[n / 2];
}

extern "C" bool mucu_bench_chain(const size_t *bytes, int n_read, int reps, double ms[6], int bad[6], int *grid_out,
                                 char *err) {
    /* reads of whole 16-byte words; offsets in words of 16 bytes */
    unsigned long long *off = (unsigned long long *)calloc((size_t)n_read + 2, sizeof *off);
    for (int r = 0; r < n_read; r++) off[r + 1] = off[r] + bytes[r] / 16;
    off[n_read + 1] = off[n_read];
    const size_t total = (size_t)off[n_read];
    const int nr = reps < 1 ? 1 : reps > 63 ? 63 : reps; /* timed runs of each variant */
    const int sms = sm_count();
    int occ_r = 0, occ_p = 0;
    if (!cu_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_r, k_chain_read<false>, 512, 0), "occupancy",
               "k_chain_read", err) ||
        !cu_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_p, k_chain_persist<true>, 512, 0), "occupancy",
               "k_chain_persist", err)) {
        free(off);
        return false;
    }
    const int grid = sms * (occ_r < occ_p ? occ_r : occ_p);
    *grid_out = grid;
    void *buf = NULL, *out = NULL, *doff = NULL, *ctr = NULL;
    bool ok = mucu_malloc(&buf, total * 16, err) && mucu_malloc(&out, (size_t)n_read * grid * 4, err) &&
              mucu_malloc(&doff, ((size_t)n_read + 2) * 8, err) && mucu_malloc(&ctr, 4, err);
    cudaGraph_t g[4] = {0};
    cudaGraphExec_t ge[4] = {0};
    unsigned *host = (unsigned *)malloc((size_t)n_read * grid * 4);
    unsigned *want = (unsigned *)calloc((size_t)n_read, 4);
    if (ok) {
        k_chain_fill<<<sms * 8, 512, 0, g_s>>>((uint32_t *)buf, total * 4);
        ok = launched("k_chain_fill", err) &&
             cu_ok(cudaMemcpyAsync(doff, off, ((size_t)n_read + 2) * 8, cudaMemcpyHostToDevice, g_s), "cudaMemcpyAsync",
                   "chain offsets", err);
    }
    for (int r = 0; r < n_read; r++)
        for (uint64_t i = off[r] * 4; i < off[r + 1] * 4; i++) want[r] ^= chain_word(i);
    /* variants 1-3: a graph of n_read kernel nodes */
    for (int gv = 1; ok && gv <= 3; gv++) {
        ok = cu_ok(cudaGraphCreate(&g[gv], 0), "cudaGraphCreate", "chain", err);
        cudaGraphNode_t prev = NULL;
        for (int r = 0; ok && r < n_read; r++) {
            const uint4 *p = (const uint4 *)buf + off[r];
            size_t n = (size_t)(off[r + 1] - off[r]);
            unsigned *o = (unsigned *)out + (size_t)r * grid;
            void *args[] = {(void *)&p, (void *)&n, (void *)&o};
            cudaKernelNodeParams kp;
            memset(&kp, 0, sizeof kp);
            kp.func = gv == 3 ? (void *)k_chain_read<true> : (void *)k_chain_read<false>;
            kp.gridDim = dim3((unsigned)grid), kp.blockDim = dim3(512), kp.kernelParams = args;
            cudaGraphNode_t nn = NULL;
            ok = cu_ok(cudaGraphAddKernelNode(&nn, g[gv], NULL, 0, &kp), "cudaGraphAddKernelNode", "chain", err);
            if (ok && prev) {
                cudaGraphEdgeData ed;
                memset(&ed, 0, sizeof ed);
                if (gv >= 2) ed.from_port = cudaGraphKernelNodePortLaunchCompletion, ed.type = cudaGraphDependencyTypeProgrammatic;
                ok = cu_ok(cudaGraphAddDependencies(g[gv], &prev, &nn, &ed, 1), "cudaGraphAddDependencies", "chain", err);
            }
            prev = nn;
        }
        ok = ok && cu_ok(cudaGraphInstantiate(&ge[gv], g[gv], 0), "cudaGraphInstantiate", "chain", err);
    }
    for (int v = 1; ok && v <= 5; v++) {
        float t[64];
        bad[v] = 0;
        for (int k = 0; ok && k <= nr; k++) { /* k = 0 warms up */
            ok = cu_ok(cudaMemsetAsync(out, 0, (size_t)n_read * grid * 4, g_s), "cudaMemsetAsync", "chain", err) &&
                 cu_ok(cudaMemsetAsync(ctr, 0, 4, g_s), "cudaMemsetAsync", "chain", err) && mucu_timer_begin(err);
            if (!ok) break;
            if (v <= 3)
                ok = cu_ok(cudaGraphLaunch(ge[v], g_s), "cudaGraphLaunch", "chain", err);
            else {
                const uint4 *p = (const uint4 *)buf;
                const unsigned long long *po = (const unsigned long long *)doff;
                unsigned *pc = (unsigned *)ctr, *o = (unsigned *)out;
                int nrd = n_read;
                void *args[] = {(void *)&p, (void *)&po, (void *)&nrd, (void *)&pc, (void *)&o};
                ok = cu_ok(cudaLaunchCooperativeKernel(v == 5 ? (const void *)k_chain_persist<true>
                                                              : (const void *)k_chain_persist<false>,
                                                       dim3((unsigned)grid), dim3(512), args, 0, g_s),
                           "cudaLaunchCooperativeKernel", "k_chain_persist", err);
            }
            double tm = 0;
            ok = ok && mucu_timer_end(&tm, err);
            if (k > 0) t[k - 1] = (float)tm;
        }
        if (!ok) break;
        ms[v] = chain_median(t, nr);
        ok = cu_ok(cudaMemcpy(host, out, (size_t)n_read * grid * 4, cudaMemcpyDeviceToHost), "cudaMemcpy", "chain", err);
        for (int r = 0; ok && r < n_read; r++) {
            unsigned x = 0;
            for (int c = 0; c < grid; c++) x ^= host[(size_t)r * grid + c];
            if (x != want[r]) bad[v]++;
        }
    }
    /* variant 0: one kernel over all of it (the ceiling) */
    if (ok) {
        float t[64];
        const uint4 *p = (const uint4 *)buf;
        for (int k = 0; ok && k <= nr; k++) {
            double tm = 0;
            ok = mucu_timer_begin(err);
            if (ok) k_chain_read<false><<<grid, 512, 0, g_s>>>(p, total, (unsigned *)out);
            ok = ok && launched("k_chain_read", err) && mucu_timer_end(&tm, err);
            if (k > 0) t[k - 1] = (float)tm;
        }
        ms[0] = chain_median(t, nr);
        bad[0] = 0;
        ok = ok && cu_ok(cudaMemcpy(host, out, (size_t)grid * 4, cudaMemcpyDeviceToHost), "cudaMemcpy", "chain", err);
        unsigned x = 0, w = 0;
        for (int c = 0; ok && c < grid; c++) x ^= host[c];
        for (int r = 0; r < n_read; r++) w ^= want[r];
        if (ok && x != w) bad[0] = 1;
    }
    for (int i = 1; i <= 3; i++) {
        if (ge[i]) cudaGraphExecDestroy(ge[i]);
        if (g[i]) cudaGraphDestroy(g[i]);
    }
    free(off), free(host), free(want);
    char e2[MUCU_ERR_LEN];
    if (buf) mucu_free(buf, e2);
    if (out) mucu_free(out, e2);
    if (doff) mucu_free(doff, e2);
    if (ctr) mucu_free(ctr, e2);
    return ok;
}

/* The lane-per-block variant (default): a thread computes whole blocks'
 * integer sums (no shuffles), f_b by the formula into shared memory; the
 * CTA takes RPC consecutive output rows (their blocks are contiguous), so
 * its threads stream one contiguous stretch of the weight; then one thread
 * per (row, output) adds that output's f_b in block order. */
template <int TYPE>
__device__ static inline void whole_block_f(const uint8_t *W, int64_t n_out, int64_t item, int b, int nb,
                                            const int8_t *qs, const q8split &xq, int r, float *f_out) {
    const int64_t n_in = (int64_t)nb * 256;
    const uint4 *x4 = (const uint4 *)(qs + r * n_in + (int64_t)b * 256);
    const float xd = xq.d[(int64_t)r * nb + b];
    if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
        const bool q5 = TYPE == T_Q5_K;
        const uint8_t *blk = W + item * (q5 ? 176 : 144);
        const uint4 hdr = __ldg((const uint4 *)blk);
        const uint4 *q4 = (const uint4 *)(blk + (q5 ? 48 : 16));
        uint4 qh0 = make_uint4(0, 0, 0, 0), qh1 = qh0;
        if (q5) qh0 = __ldg((const uint4 *)(blk + 16)), qh1 = __ldg((const uint4 *)(blk + 32));
        const uint32_t qhw[8] = {qh0.x, qh0.y, qh0.z, qh0.w, qh1.x, qh1.y, qh1.z, qh1.w};
        const int16_t *bs = xq.bs + ((int64_t)r * nb + b) * 16;
        int32_t sumi = 0, summ = 0;
        const uint32_t w0 = hdr.y, w1 = hdr.z, w2 = hdr.w;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const uint4 qa = __ldg(q4 + 2 * g), qb = __ldg(q4 + 2 * g + 1);
            const uint32_t qw[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
            const uint4 xa = x4[4 * g], xb = x4[4 * g + 1], xc = x4[4 * g + 2], xe = x4[4 * g + 3];
            const uint32_t xl[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
            const uint32_t xh[8] = {xc.x, xc.y, xc.z, xc.w, xe.x, xe.y, xe.z, xe.w};
            int32_t il = 0, ih = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                uint32_t lo = qw[k] & 0x0F0F0F0Fu, hi = (qw[k] >> 4) & 0x0F0F0F0Fu;
                if (q5) {
                    lo |= ((qhw[k] >> (2 * g)) & 0x01010101u) << 4;
                    hi |= ((qhw[k] >> (2 * g + 1)) & 0x01010101u) << 4;
                }
                il = __dp4a((int)lo, (int)xl[k], il);
                ih = __dp4a((int)hi, (int)xh[k], ih);
            }
            const int jl = 2 * g, jh = 2 * g + 1;
#define SB(k) ((int32_t)byte_of3(w0, w1, w2, (k)))
            const int32_t sc_l = jl < 4 ? SB(jl) & 63 : (SB(jl + 4) & 0xF) | ((SB(jl - 4) >> 6) << 4);
            const int32_t sc_h = jh < 4 ? SB(jh) & 63 : (SB(jh + 4) & 0xF) | ((SB(jh - 4) >> 6) << 4);
            const int32_t m_l = jl < 4 ? SB(jl + 4) & 63 : (SB(jl + 4) >> 4) | ((SB(jl) >> 6) << 4);
            const int32_t m_h = jh < 4 ? SB(jh + 4) & 63 : (SB(jh + 4) >> 4) | ((SB(jh) >> 6) << 4);
#undef SB
            sumi += sc_l * il + sc_h * ih;
            summ += m_l * ((int32_t)bs[2 * jl] + (int32_t)bs[2 * jl + 1]) + m_h * ((int32_t)bs[2 * jh] + (int32_t)bs[2 * jh + 1]);
        }
        const float d = h2f((uint16_t)(hdr.x & 0xFFFF)), dmin = h2f((uint16_t)(hdr.x >> 16));
        *f_out = (d * xd) * (float)sumi - (dmin * xd) * (float)summ;
    } else { /* Q6_K split layout */
        const uint4 *q4 = (const uint4 *)(W + item * 192);
        const uint8_t *scb = W + (size_t)n_out * nb * 192 + item * 16;
        const uint16_t *dp = (const uint16_t *)(W + (size_t)n_out * nb * 208) + item;
        int32_t sumi = 0;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 qh0 = __ldg(q4 + 8 + 2 * h), qh1 = __ldg(q4 + 9 + 2 * h);
            const uint32_t qhw[8] = {qh0.x, qh0.y, qh0.z, qh0.w, qh1.x, qh1.y, qh1.z, qh1.w};
#pragma unroll
            for (int half32 = 0; half32 < 2; half32++) { /* ql bytes 64h + 32*half32 + l: parts half32 and half32+2 */
                const uint4 qa = __ldg(q4 + 4 * h + 2 * half32), qb = __ldg(q4 + 4 * h + 2 * half32 + 1);
                const uint32_t qw[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int hi_part = 0; hi_part < 2; hi_part++) {
                    const int part = half32 + 2 * hi_part, sh = 2 * part;
                    const int k0 = 128 * h + 32 * part; /* value index of l = 0 */
                    const uint4 xa = x4[k0 / 16], xb = x4[k0 / 16 + 1];
                    const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
                    int32_t i0 = 0, i1 = 0;
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        const uint32_t nib = hi_part ? (qw[k] >> 4) & 0x0F0F0F0Fu : qw[k] & 0x0F0F0F0Fu;
                        const uint32_t c = __vsub4(nib | (((qhw[k] >> sh) & 0x03030303u) << 4), 0x20202020u);
                        if (k < 4) i0 = __dp4a((int)c, (int)xw[k], i0);
                        else i1 = __dp4a((int)c, (int)xw[k], i1);
                    }
                    sumi += (int32_t)(int8_t)__ldg(scb + k0 / 16) * i0 + (int32_t)(int8_t)__ldg(scb + k0 / 16 + 1) * i1;
                }
            }
        }
        *f_out = (h2f(__ldg(dp)) * xd) * (float)sumi;
    }
}

template <int TYPE, int R>
__global__ static void __launch_bounds__(128) k_mmv_lpb(const uint8_t *W, int64_t n_out, int nb, q8split xq, int nr,
                                                       int rpc, float *y, int has_scale, float scale) {
    grid_dep_wait();
    extern __shared__ float fsm[]; /* [R][rpc * nb] */
    const int64_t o0 = (int64_t)blockIdx.x * rpc;
    const int items = rpc * nb;
    for (int it = threadIdx.x; it < items; it += 128) {
        const int64_t o = o0 + it / nb;
        if (o >= n_out) break;
        const int b = it % nb;
#pragma unroll
        for (int r = 0; r < R; r++)
            if (r < nr) whole_block_f<TYPE>(W, n_out, o * nb + b, b, nb, xq.qs, xq, r, &fsm[r * items + it]);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < nr * rpc; k += 128) {
        const int r = k / rpc, ol = k % rpc;
        const int64_t o = o0 + ol;
        if (o >= n_out) continue;
        const float *fr = fsm + r * items + ol * nb;
        float total = 0.0f;
        for (int b = 0; b < nb; b++) total = total + fr[b];
        y[r * n_out + o] = has_scale ? total * scale : total;
    }
}

/* Prefill / many rows: int8 tensor-core tiles (mma.sync m16n8k16 s8).
 * A CTA (4 warps) takes 64 rows x 64 outputs; per 256-block it stages the
 * rows' Q8_K codes and the outputs' weight codes (unpacked to int8) in
 * shared memory; warp w takes rows 16w..16w+15 and all 64 outputs (8 n
 * tiles). Each k16 step's mma gives exact integer sums over 16 values; they
 * are scaled by the sub-block scale and summed in int32 (sumi, exact in any
 * order), then f_b by the formula, and each thread adds f_b to its
 * (row, output) totals in block order. */
#define GT_M 64
#define GT_N 64
#define GT_LD 272 /* 256 + 16: rows 4 banks apart */

__device__ static inline void mma_s8_16816(int32_t c[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

template <int TYPE>
__global__ static void __launch_bounds__(128) k_gemm_kq(const uint8_t *W, int64_t n_out, int nb, q8split xq, int64_t rows,
                                                       float *y, int has_scale, float scale) {
    grid_dep_wait();
    __shared__ __align__(16) int8_t xs[GT_M * GT_LD];
    __shared__ __align__(16) int8_t ws[GT_N * GT_LD];
    __shared__ int32_t wsc[GT_N][16]; /* sub-block scales per 16 values (Q4_K/Q5_K: sc_j twice) */
    __shared__ int32_t wm[GT_N][8];   /* Q4_K/Q5_K mins */
    __shared__ float wd[GT_N][2];     /* d, dmin */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int64_t row0 = (int64_t)blockIdx.x * GT_M, out0 = (int64_t)blockIdx.y * GT_N;
    const int64_t n_in = (int64_t)nb * 256;
    float total[8][4];
    int32_t sumi[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) total[n][e] = 0.0f;
    for (int b = 0; b < nb; b++) {
        /* stage the rows' codes: 64 rows x 16 uint4 */
        for (int i = tid; i < GT_M * 16; i += 128) {
            const int r = i >> 4, c = i & 15;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (row0 + r < rows) v = *(const uint4 *)(xq.qs + (row0 + r) * n_in + (int64_t)b * 256 + 16 * c);
            *(uint4 *)(xs + r * GT_LD + 16 * c) = v;
        }
        /* unpack the outputs' weight codes: 2 threads per output */
        {
            const int o = tid >> 1, half = tid & 1;
            const int64_t oo = out0 + o;
            int8_t *dst = ws + o * GT_LD;
            if (oo >= n_out) {
                for (int k = 0; k < 128; k += 16) *(uint4 *)(dst + 128 * half + k) = make_uint4(0, 0, 0, 0);
                if (!half) {
                    for (int j = 0; j < 16; j++) wsc[o][j] = 0;
                    for (int j = 0; j < 8; j++) wm[o][j] = 0;
                    wd[o][0] = wd[o][1] = 0.0f;
                }
            } else if (TYPE == T_Q4_K || TYPE == T_Q5_K) {
                const bool q5 = TYPE == T_Q5_K;
                const uint8_t *blk = W + (oo * nb + b) * (q5 ? 176 : 144);
                const uint8_t *qs = blk + (q5 ? 48 : 16);
                /* this half: pairs gp = 2*half, 2*half+1 (bytes 32gp..32gp+31 -> values 64gp..64gp+63) */
                for (int gp = 2 * half; gp < 2 * half + 2; gp++)
                    for (int l4 = 0; l4 < 32; l4 += 4) {
                        uint32_t q = *(const uint32_t *)(qs + 32 * gp + l4);
                        uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
                        if (q5) {
                            const uint32_t qh = *(const uint32_t *)(blk + 16 + l4);
                            lo |= ((qh >> (2 * gp)) & 0x01010101u) << 4;
                            hi |= ((qh >> (2 * gp + 1)) & 0x01010101u) << 4;
                        }
                        *(uint32_t *)(dst + 64 * gp + l4) = lo;
                        *(uint32_t *)(dst + 64 * gp + 32 + l4) = hi;
                    }
                if (!half) {
                    for (int j = 0; j < 8; j++) {
                        int32_t sc, m;
                        scale_min_k4(blk + 4, j, &sc, &m);
                        wsc[o][2 * j] = wsc[o][2 * j + 1] = sc;
                        wm[o][j] = m;
                    }
                    wd[o][0] = rd_f16(blk);
                    wd[o][1] = rd_f16(blk + 2);
                }
            } else { /* Q6_K split layout */
                const int64_t item = oo * nb + b;
                const uint8_t *blk = W + item * 192;
                const uint8_t *scb = W + (size_t)n_out * nb * 192 + item * 16;
                const int h = half; /* values 128h .. 128h+127 */
                for (int l4 = 0; l4 < 32; l4 += 4) {
                    const uint32_t qa = *(const uint32_t *)(blk + 64 * h + l4);
                    const uint32_t qb = *(const uint32_t *)(blk + 64 * h + 32 + l4);
                    const uint32_t qh = *(const uint32_t *)(blk + 128 + 32 * h + l4);
                    const uint32_t c0 = (qa & 0x0F0F0F0Fu) | ((qh & 0x03030303u) << 4);
                    const uint32_t c1 = (qb & 0x0F0F0F0Fu) | (((qh >> 2) & 0x03030303u) << 4);
                    const uint32_t c2 = ((qa >> 4) & 0x0F0F0F0Fu) | (((qh >> 4) & 0x03030303u) << 4);
                    const uint32_t c3 = ((qb >> 4) & 0x0F0F0F0Fu) | (((qh >> 6) & 0x03030303u) << 4);
                    *(uint32_t *)(dst + 128 * h + l4) = __vsub4(c0, 0x20202020u);
                    *(uint32_t *)(dst + 128 * h + 32 + l4) = __vsub4(c1, 0x20202020u);
                    *(uint32_t *)(dst + 128 * h + 64 + l4) = __vsub4(c2, 0x20202020u);
                    *(uint32_t *)(dst + 128 * h + 96 + l4) = __vsub4(c3, 0x20202020u);
                }
                for (int j = 8 * h; j < 8 * h + 8; j++) wsc[o][j] = (int8_t)scb[j];
                if (!half) {
                    wd[o][0] = rd_f16(W + (size_t)n_out * nb * 208 + 2 * item);
                    wd[o][1] = 0.0f;
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sumi[n][e] = 0;
        const int8_t *xa = xs + (16 * warp + g) * GT_LD + 4 * t;
#pragma unroll 2
        for (int ks = 0; ks < 16; ks++) { /* 16 values: one scale per (output, ks) */
            const uint32_t a0 = *(const uint32_t *)(xa + 16 * ks), a1 = *(const uint32_t *)(xa + 8 * GT_LD + 16 * ks);
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const uint32_t b0 = *(const uint32_t *)(ws + (8 * n + g) * GT_LD + 16 * ks + 4 * t);
                int32_t c[4] = {0, 0, 0, 0};
                mma_s8_16816(c, a0, a1, b0);
                const int32_t s0 = wsc[8 * n + 2 * t][ks], s1 = wsc[8 * n + 2 * t + 1][ks];
                sumi[n][0] += s0 * c[0];
                sumi[n][1] += s1 * c[1];
                sumi[n][2] += s0 * c[2];
                sumi[n][3] += s1 * c[3];
            }
        }
        /* f_b and the ordered row totals */
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int64_t r = row0 + 16 * warp + g + 8 * e2;
            const bool live = r < rows;
            const float xd = live ? xq.d[r * nb + b] : 0.0f;
            int32_t bsum[8];
            if (TYPE != T_Q6_K) {
                const int16_t *bs = xq.bs + (live ? r * nb + b : 0) * 16;
#pragma unroll
                for (int j = 0; j < 8; j++) bsum[j] = (int32_t)bs[2 * j] + (int32_t)bs[2 * j + 1];
            }
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e1 = 0; e1 < 2; e1++) {
                    const int o = 8 * n + 2 * t + e1, e = 2 * e2 + e1;
                    float f;
                    if (TYPE == T_Q6_K) {
                        f = (wd[o][0] * xd) * (float)sumi[n][e];
                    } else {
                        int32_t summ = 0;
#pragma unroll
                        for (int j = 0; j < 8; j++) summ += wm[o][j] * bsum[j];
                        f = (wd[o][0] * xd) * (float)sumi[n][e] - (wd[o][1] * xd) * (float)summ;
                    }
                    total[n][e] = total[n][e] + f;
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t r = row0 + 16 * warp + g + 8 * (e >> 1), o = out0 + 8 * n + 2 * t + (e & 1);
            if (r < rows && o < n_out) y[r * n_out + o] = has_scale ? total[n][e] * scale : total[n][e];
        }
}

/* The other Q8_K types (Q4_0, Q8_0, NVFP4 ggml and native W4A16): a warp
 * per (row, output); lane l computes f_b for blocks b = l mod 32 with the
 * scalar block dots above, then the row total adds them in block order. */
__global__ static void k_matmul_warp(mucu_weight w, const q8k_block *xq, float *y, int64_t rows) {
    grid_dep_wait();
    const int64_t wid = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (wid >= rows * w.n_out) return;
    const int64_t r = wid / w.n_out, o = wid % w.n_out, nb = w.n_in / 256;
    const q8k_block *xqr = xq + r * nb;
    const bool native = w.type == T_NVFP4_NATIVE;
    const uint8_t *row = native ? w.data + o * (w.n_in / 2) : w.data + (uint64_t)o * w.row_bytes;
    const uint8_t *srow = native ? w.scales + o * (w.n_in / 16) : NULL;
    float total = 0.0f;
    for (int64_t b0 = 0; b0 < nb; b0 += 32) {
        const int64_t b = b0 + lane;
        float f = 0.0f;
        if (b < nb) {
            switch (w.type) {
            case T_Q4_0: f = dot_q4_0(row + b * 8 * 18, xqr + b); break;
            case T_Q8_0: f = dot_q8_0(row + b * 8 * 34, xqr + b); break;
            case T_Q4_K: f = dot_q45_k(row + b * 144, xqr + b, false); break;
            case T_Q5_K: f = dot_q45_k(row + b * 176, xqr + b, true); break;
            case T_NVFP4_NATIVE: f = dot_nvfp4_native(row + b * 128, srow + b * 16, xqr + b) * w.scale; break;
            default: f = dot_nvfp4_ggml(row + b * 4 * 36, xqr + b); break;
            }
        }
        for (int j = 0; j < 32; j++) {
            const float fj = __shfl_sync(FULL_MASK, f, j);
            if (b0 + j < nb) total = total + fj;
        }
    }
    if (lane) return;
    if (native) y[wid] = round_f16(total);
    else y[wid] = w.has_scale ? total * w.scale : total;
}

/* Q8_0 and Q4_0 (ggml's 32-value blocks) up to R rows: a warp takes 8
 * outputs (lane group g = lane / 4, output 8 * warp + g) and steps over the
 * 256-value blocks in order, a lane group of 4 per 256-value block, lane t the 32-value
 * blocks 2t and 2t + 1 (Q8_0: 68 bytes, Q4_0: 36 bytes, 4-byte aligned
 * since a row is a whole number of 256-value groups; the codes sit 2 bytes
 * past the word boundary after each f16 d, realigned by a funnel shift).
 * isum_j by dp4a (exact); then the reference's float chain in j order
 * (dot_q8_0 / dot_q4_0: acc = acc + (d_j * xd) * isum_j), each lane's two
 * terms gathered by lane 0 of the group, and the row total in block
 * order. */
template <int TYPE, int R>
__global__ static void __launch_bounds__(128) k_mmv_q0(mucu_weight w, const q8k_block *xq, float *y, int nr) {
    grid_dep_wait();
    constexpr int NW = TYPE == T_Q8_0 ? 17 : 9; /* words per lane */
    const int lane = threadIdx.x & 31, t = lane & 3, g0 = lane & ~3;
    const int64_t o = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * 8 + lane / 4;
    const int64_t oc = o < w.n_out ? o : w.n_out - 1;
    const int64_t nb = w.n_in / 256;
    float total[R];
#pragma unroll
    for (int r = 0; r < R; r++) total[r] = 0.0f;
    const uint32_t *row = (const uint32_t *)(w.data + (uint64_t)oc * w.row_bytes);
    uint32_t v[NW];
#pragma unroll
    for (int i = 0; i < NW; i++) v[i] = __ldg(row + NW * t + i);
    for (int64_t b = 0; b < nb; b++) {
        /* the next block's words in flight while this one is used (the last step reloads its own) */
        const int64_t bn = b + 1 < nb ? b + 1 : b;
        uint32_t nx[NW];
#pragma unroll
        for (int i = 0; i < NW; i++) nx[i] = __ldg(row + bn * 4 * NW + NW * t + i);
        /* the two blocks' scales and codes (codes as int8 words in the activations' order) */
        float d[2];
        uint32_t c[2][8];
        if (TYPE == T_Q8_0) {
            d[0] = h2f((uint16_t)(v[0] & 0xFFFF)), d[1] = h2f((uint16_t)(v[8] >> 16));
#pragma unroll
            for (int k = 0; k < 8; k++) c[0][k] = __funnelshift_r(v[k], v[k + 1], 16), c[1][k] = v[9 + k];
        } else {
            d[0] = h2f((uint16_t)(v[0] & 0xFFFF)), d[1] = h2f((uint16_t)(v[4] >> 16));
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const uint32_t q0 = __funnelshift_r(v[k], v[k + 1], 16), q1 = v[5 + k];
                c[0][k] = __vsub4(q0 & 0x0F0F0F0Fu, 0x08080808u), c[0][4 + k] = __vsub4((q0 >> 4) & 0x0F0F0F0Fu, 0x08080808u);
                c[1][k] = __vsub4(q1 & 0x0F0F0F0Fu, 0x08080808u), c[1][4 + k] = __vsub4((q1 >> 4) & 0x0F0F0F0Fu, 0x08080808u);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            const q8k_block *xb = xq + (int64_t)r * nb + b;
            const uint32_t *xa = (const uint32_t *)(xb->qs + 64 * t);
            const float xd = __ldg(&xb->d);
            float p[2];
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int isum = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) isum = __dp4a((int)c[j][k], (int)__ldg(xa + 8 * j + k), isum);
                p[j] = (d[j] * xd) * (float)isum;
            }
            /* acc over j = 0..7 in order: lane t holds j = 2t, 2t + 1 */
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float a = __shfl_sync(FULL_MASK, p[0], g0 + k), bq = __shfl_sync(FULL_MASK, p[1], g0 + k);
                acc = acc + a;
                acc = acc + bq;
            }
            total[r] = total[r] + acc;
        }
#pragma unroll
        for (int i = 0; i < NW; i++) v[i] = nx[i];
    }
    if (t || o >= w.n_out) return;
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r >= nr) break;
        y[(int64_t)r * w.n_out + o] = w.has_scale ? total[r] * w.scale : total[r];
    }
}

/* Float weights (F32, F16, BF16, activations as a matrix): a warp per
 * (row, output), the 32-lane order. */
__global__ static void k_matmul_fwarp(mucu_weight w, const float *x, float *y, int64_t rows) {
    grid_dep_wait();
    const int64_t wid = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (wid >= rows * w.n_out) return;
    const int64_t r = wid / w.n_out, o = wid % w.n_out;
    const float *xr = x + r * w.n_in;
    const uint8_t *row = w.data + (uint64_t)o * w.row_bytes;
    float p = 0.0f;
    if (w.type == T_F32) {
        const float *wr = (const float *)row;
        for (int64_t i = lane; i < w.n_in; i += 32) p = fmaf(wr[i], xr[i], p);
    } else if (w.type == T_F16) {
        const uint16_t *wr = (const uint16_t *)row;
        for (int64_t i = lane; i < w.n_in; i += 32) p = fmaf(f16_to_f32(wr[i]), xr[i], p);
    } else {
        const uint16_t *wr = (const uint16_t *)row;
        for (int64_t i = lane; i < w.n_in; i += 32) p = fmaf(bits_f32((uint32_t)wr[i] << 16), xr[i], p);
    }
    p = warp_fold_lane0(p);
    if (lane == 0) y[wid] = w.has_scale ? p * w.scale : p;
}

/* Float weights with rows of whole 32-value chunks, up to R activation
 * rows: k_mmv4's shape. A warp takes 8 outputs (lane group g = lane / 4);
 * lane t of a group runs the 32-lane order's chains l = 8t .. 8t + 7 of
 * its output (fmaf over chunks k = 0, 1, ... in order, one 16-byte load of
 * 8 f16 / bf16 or two of 4 f32 a chunk, 4 chunks in flight), then the
 * fold's steps h = 16 and 8 take a partner lane's chains (xor 2, xor 1)
 * and h = 4, 2, 1 the lane's own: each addition is k_matmul_fwarp's
 * p[l] + p[l + h]. Why: k_matmul_fwarp's lanes read 2 bytes each, 64
 * bytes a warp load, and the nvfp4 lane's F16 output matrix (2.7 GB) is
 * read once a token. Half-precision weights are loaded before the wait
 * (never written); f32 ones may be activations viewed as a matrix. */
template <int TYPE>
__device__ static inline void mmvf_load(const uint8_t *row, int64_t k, int t, float v[8]) {
    if (TYPE == T_F32) {
        const float4 a = __ldg((const float4 *)row + 8 * k + 2 * t), b = __ldg((const float4 *)row + 8 * k + 2 * t + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const uint4 q = __ldg((const uint4 *)row + 4 * k + t);
        const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (TYPE == T_F16) v[2 * i] = h2f((uint16_t)(u[i] & 0xFFFF)), v[2 * i + 1] = h2f((uint16_t)(u[i] >> 16));
            else v[2 * i] = bits_f32(u[i] << 16), v[2 * i + 1] = bits_f32(u[i] & 0xFFFF0000u);
        }
    }
}

template <int TYPE>
__device__ static inline void mmvf_first(const uint8_t *row, int64_t nk, int t, float v[4][8]) {
    if (TYPE != T_F32)
#pragma unroll
        for (int u = 0; u < 4; u++) mmvf_load<TYPE>(row, u < nk ? u : nk - 1, t, v[u]);
    grid_dep_wait();
    if (TYPE == T_F32)
#pragma unroll
        for (int u = 0; u < 4; u++) mmvf_load<TYPE>(row, u < nk ? u : nk - 1, t, v[u]);
}

template <int TYPE, int R>
__global__ static void __launch_bounds__(128) k_mmv_float(mucu_weight w, const float *x, float *y, int nr) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const int64_t o = ((int64_t)blockIdx.x * 4 + threadIdx.x / 32) * 8 + lane / 4;
    const int64_t oc = o < w.n_out ? o : w.n_out - 1, nk = w.n_in / 32;
    const uint8_t *row = w.data + (uint64_t)oc * w.row_bytes;
    float acc[R][8], v[4][8];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[r][j] = 0.0f;
    mmvf_first<TYPE>(row, nk, t, v);
    for (int64_t k0 = 0; k0 < nk; k0 += 4) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int64_t k = k0 + u;
            if (k < nk) {
#pragma unroll
                for (int r = 0; r < R; r++) {
                    if (r < nr) {
                        const float4 *xr = (const float4 *)(x + (int64_t)r * w.n_in + 32 * k + 8 * t);
                        const float4 a = xr[0], b = xr[1];
                        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[r][j] = fmaf(v[u][j], xv[j], acc[r][j]);
                    }
                }
                if (k + 4 < nk) mmvf_load<TYPE>(row, k + 4, t, v[u]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float p[8];
#pragma unroll
        for (int j = 0; j < 8; j++) p[j] = acc[r][j] + __shfl_xor_sync(FULL_MASK, acc[r][j], 2); /* h = 16 */
#pragma unroll
        for (int j = 0; j < 8; j++) p[j] = p[j] + __shfl_xor_sync(FULL_MASK, p[j], 1); /* h = 8 */
        const float a0 = p[0] + p[4], a1 = p[1] + p[5], a2 = p[2] + p[6], a3 = p[3] + p[7]; /* h = 4 */
        const float tot = (a0 + a2) + (a1 + a3);                                             /* h = 2, 1 */
        if (t == 0 && r < nr && o < w.n_out) y[(int64_t)r * w.n_out + o] = w.has_scale ? tot * w.scale : tot;
    }
}

/* The DFlash assistant's attention (backend.h dense_attention), a CTA per
 * (query row, head): the scores as k_matmul_fwarp computes them (a warp per
 * key, the 32-lane order), the softmax of k_softmax, then P V as
 * k_matmul_fwarp (a warp per output dimension), the row and its
 * probabilities in shared memory. Only the n_valid keys (device memory:
 * the launch stays the same from round to round) enter the products: the
 * same terms as over the valid keys alone, so not even a zero's sign can
 * differ from the host's loop. A warp takes DA_KU keys (DA_VU outputs) at
 * a time, each with its own lane chain and fold: every key's dot product
 * is the one above, but their loads are in flight together (one key after
 * another, a CTA was a chain of dependent round trips: 25 us a call at 16
 * rows over 336 keys). 24 keys a warp (the shipped assistant's 336 keys in
 * one pass of the 16 warps instead of three) made speculation slower on an
 * H100 (1.82x plain against 1.88x: docs/cuda.md "Measured and not
 * taken"). */
#define DA_THREADS 512
#define DA_KU 8
#define DA_VU 4
__global__ static void __launch_bounds__(DA_THREADS) k_dense_attn(const float *q, int64_t H, int64_t Hkv, int64_t D,
                                                                 const float *k, const float *v, int64_t slots,
                                                                 const int64_t *n_valid, float scale, float *out) {
    grid_dep_wait();
    extern __shared__ float sm[];
    float *qs = sm, *ps = sm + D;
    const int64_t rh = blockIdx.x, h = rh % H, g = h / (H / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) qs[i] = q[rh * D + i];
    __syncthreads();
    const float *kg = k + g * slots * D, *vg = v + g * D * slots;
    const int64_t nv = *n_valid;
    for (int64_t j0 = (int64_t)warp * DA_KU; j0 < nv; j0 += (int64_t)nw * DA_KU) {
        float p[DA_KU];
#pragma unroll
        for (int u = 0; u < DA_KU; u++) p[u] = 0.0f;
        for (int64_t i = lane; i < D; i += 32) {
            const float qi = qs[i];
#pragma unroll
            for (int u = 0; u < DA_KU; u++)
                if (j0 + u < nv) p[u] = fmaf(kg[(j0 + u) * D + i], qi, p[u]);
        }
#pragma unroll
        for (int u = 0; u < DA_KU; u++) p[u] = warp_fold_lane0(p[u]);
        if (lane == 0)
#pragma unroll
            for (int u = 0; u < DA_KU; u++)
                if (j0 + u < nv) ps[j0 + u] = p[u];
    }
    __syncthreads();
    block_softmax(ps, scale, nv, nv);
    __syncthreads();
    for (int64_t d0 = (int64_t)warp * DA_VU; d0 < D; d0 += (int64_t)nw * DA_VU) {
        float a[DA_VU];
#pragma unroll
        for (int u = 0; u < DA_VU; u++) a[u] = 0.0f;
#pragma unroll 4
        for (int64_t j = lane; j < nv; j += 32) {
            const float pj = ps[j];
#pragma unroll
            for (int u = 0; u < DA_VU; u++)
                if (d0 + u < D) a[u] = fmaf(vg[(d0 + u) * slots + j], pj, a[u]);
        }
#pragma unroll
        for (int u = 0; u < DA_VU; u++) a[u] = warp_fold_lane0(a[u]);
        if (lane == 0)
#pragma unroll
            for (int u = 0; u < DA_VU; u++)
                if (d0 + u < D) out[rh * D + d0 + u] = a[u];
    }
}

/* c ? a : b as a register select (a C conditional between two array
 * elements may become a select of their addresses, the array then local
 * memory). */
__device__ static inline float fsel(bool c, float a, float b) {
    float r;
    asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %3, 0;\n\tselp.f32 %0, %1, %2, q;\n\t}" : "=f"(r) : "f"(a), "f"(b), "r"((unsigned)c));
    return r;
}

/* One halving step of warp_fold_many: C values of 2 C kept, at distance H. */
template <int C, int H, int N> __device__ static inline void fold_halve(float (&p)[N], int lane) {
    const bool up = lane & H;
#pragma unroll
    for (int i = 0; i < C; i++) {
        const float send = fsel(up, p[i], p[i + C]), keep = fsel(up, p[i + C], p[i]);
        p[i] = keep + __shfl_xor_sync(FULL_MASK, send, H);
    }
    if constexpr (C > 1) fold_halve<C / 2, H / 2, N>(p, lane);
}

/* The 32-lane fold of N values at once (N = 2^k <= 32; p[u] is this lane's
 * chain of value u): the first k steps of the fold (h = 16, 8, ...) halve
 * the values a lane holds, lane l keeping the upper half where bit h of l
 * is set and adding its partner's partial of the same value, so one
 * shuffle does the step for two values; the remaining steps are the plain
 * xor fold. Each value is then the reference's fold (every step adds the
 * partials at distance h; addition is commutative): value
 * (l >> (5 - k)) on lane l, in p[0]. N folds cost N - 1 + 5 - k shuffles
 * instead of 5 N. */
template <int N> __device__ static inline float warp_fold_many(float (&p)[N], int lane) {
    constexpr int K = N == 32 ? 5 : N == 16 ? 4 : N == 8 ? 3 : N == 4 ? 2 : N == 2 ? 1 : 0;
    static_assert(N == 1 << K, "N: a power of 2 up to 32");
    if constexpr (N > 1) fold_halve<N / 2, 16, N>(p, lane);
#pragma unroll
    for (int s = K; s < 5; s++) p[0] = p[0] + __shfl_xor_sync(FULL_MASK, p[0], 16 >> s);
    return p[0];
}

/* k_dense_attn2: the same arithmetic as k_dense_attn with the loads of a
 * call in flight at once (k_dense_attn waited on one round trip after
 * another: q, the key count, K pass by pass, V pass by pass; Nsight Compute
 * found it latency-bound, 75 % of the cycles without an eligible warp, 5 %
 * of the L2's throughput). A CTA per (query row, HPC heads of one KV
 * group): the key count is the step's argument (read before the wait);
 * V's valid rows are copied into shared memory (cp.async) while the scores
 * run; a warp takes DA2_KB keys of one head, each lane's chains l (dims l,
 * l + 32, ... in order, from +0) for all of them from registers, folded
 * together (warp_fold_many); one warp per head runs the softmax
 * (warp_softmax: block_softmax's operations, the sum by one lane in index
 * order) with no CTA barrier; then a warp per
 * (head, 8 output dims) runs the 32-lane chains of P V from shared memory
 * and folds them together. D = 32 DC, NT threads. With o.qs (HPC D a
 * multiple of 256: the CTA holds whole Q8_K blocks) the output is also
 * quantized for the product that reads it (k_quantize_q8split's blocks). */
#define DA2_KB 16
/* The key count (the step's argument, uploaded before its first kernel,
 * so read before the wait), at most n_keys; then the wait. */
__device__ static inline int da2_begin(const int64_t *__restrict__ n_valid, int64_t n_keys) {
    const int64_t nv = *n_valid;
    grid_dep_wait();
    return (int)(nv < n_keys ? nv : n_keys);
}
template <int DC, int HPC, int NT>
__global__ static void __launch_bounds__(NT)
    k_dense_attn2(const float *__restrict__ q, int64_t H, int64_t Hkv, const float *__restrict__ k,
                  const float *__restrict__ v, int64_t slots, int64_t n_keys, const int64_t *__restrict__ n_valid,
                  float scale, float *__restrict__ out, q8split o) {
    constexpr int D = 32 * DC, NW = NT / 32;
    const int nv = da2_begin(n_valid, n_keys);
    const int vss = ((int)n_keys + 3) & ~3; /* a V row's stride in shared memory */
    extern __shared__ __align__(16) float da2_sm[];
    /* V [D][vss], the scores [HPC][n_keys], the output [HPC][D] (o.qs) */
    float *vs = da2_sm, *ps = da2_sm + (size_t)D * vss, *os = ps + (size_t)HPC * n_keys;
    const int64_t hq0 = (int64_t)blockIdx.x * HPC;       /* (row, head) index of the CTA's first head */
    const int64_t g = (hq0 % H) / (H / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *kg = k + g * slots * D, *vg = v + g * D * slots;
    const int nv4 = (nv + 3) >> 2; /* 4 nv4 <= slots: slots % 4 == 0 (mucu_dense_attention) */
    for (int i = threadIdx.x; i < D * nv4; i += NT) {
        const int d = i / nv4, c = i - d * nv4;
        cp16(vs + d * vss + 4 * c, vg + (int64_t)d * slots + 4 * c, true);
    }
    cp_commit();
    /* scores: task t = (key block t / HPC, head t % HPC) */
    const int nkb = (nv + DA2_KB - 1) / DA2_KB;
    for (int t = warp; t < nkb * HPC; t += NW) {
        const int hh = t % HPC, j0 = (t / HPC) * DA2_KB;
        const float *qh = q + (hq0 + hh) * D;
        float qv[DC], kv[DA2_KB][DC], p[DA2_KB];
#pragma unroll
        for (int c = 0; c < DC; c++) qv[c] = qh[lane + 32 * c];
#pragma unroll
        for (int u = 0; u < DA2_KB; u++)
#pragma unroll
            for (int c = 0; c < DC; c++) kv[u][c] = j0 + u < nv ? kg[(int64_t)(j0 + u) * D + lane + 32 * c] : 0.0f;
#pragma unroll
        for (int u = 0; u < DA2_KB; u++) {
            float a = 0.0f;
#pragma unroll
            for (int c = 0; c < DC; c++) a = fmaf(kv[u][c], qv[c], a);
            p[u] = a;
        }
        const float sc = warp_fold_many<DA2_KB>(p, lane);
        const int j = j0 + (lane >> 1); /* value lane >> (5 - 4) */
        if (!(lane & 1) && j < nv) ps[hh * n_keys + j] = sc;
    }
    __syncthreads();
    if (warp < HPC) warp_softmax(ps + warp * n_keys, scale, nv, lane);
    cp_wait<0>();
    __syncthreads();
    /* P V: task t = (8 dims t / HPC, head t % HPC) */
    for (int t = warp; t < HPC * (D / 8); t += NW) {
        const int hh = t % HPC, d0 = (t / HPC) * 8;
        const float *pr = ps + hh * n_keys;
        float a[8];
#pragma unroll
        for (int u = 0; u < 8; u++) a[u] = 0.0f;
#pragma unroll 2
        for (int j = lane; j < nv; j += 32) {
            const float pj = pr[j];
#pragma unroll
            for (int u = 0; u < 8; u++) a[u] = fmaf(vs[(d0 + u) * vss + j], pj, a[u]);
        }
        const float y = warp_fold_many<8>(a, lane);
        if (!(lane & 3)) { /* value lane >> (5 - 3) */
            out[(hq0 + hh) * D + d0 + (lane >> 2)] = y;
            if (o.qs) os[hh * D + d0 + (lane >> 2)] = y;
        }
    }
    if (o.qs) {
        __syncthreads();
        for (int b = warp; b < HPC * D / 256; b += NW) {
            float w[8];
#pragma unroll
            for (int i = 0; i < 8; i++) w[i] = os[b * 256 + lane * 8 + i];
            quantize_block_warp(w, o, hq0 * D / 256 + b, lane);
        }
    }
}

/* RMSNorm: a warp per row, the 32-lane sumsq order. */
__global__ static void k_rmsnorm_warp(const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows) {
    grid_dep_wait();
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    float p = 0.0f;
    for (int64_t i = lane; i < n; i += 32) p = fmaf(xr[i], xr[i], p);
    const float mean = warp_fold_lane0(p) / (float)n;
    const float inv = 1.0f / sqrtf(mean + eps);
    if (w)
        for (int64_t i = lane; i < n; i += 32) yr[i] = (xr[i] * inv) * w[i];
    else
        for (int64_t i = lane; i < n; i += 32) yr[i] = xr[i] * inv;
}

/* Lane l's values of 256-value block g of a row in shared memory: l + 32 t
 * for t < 8 (the 32-lane sum's order), and their squares added to p. */
__device__ static inline void rms_group_load(const float *xs, int lane, int g, float v[8]) {
#pragma unroll
    for (int t = 0; t < 8; t++) v[t] = xs[256 * g + lane + 32 * t];
}
__device__ static inline float rms_group_fma(const float v[8], float p) {
#pragma unroll
    for (int t = 0; t < 8; t++) p = fmaf(v[t], v[t], p);
    return p;
}

/* The 32-lane sum of squares of a row held in shared memory, by warp 0;
 * every thread gets inv = 1/sqrt(mean + eps). The row is zero-padded to a
 * multiple of 256 values, so each lane runs whole blocks of 8 values: a +0
 * term leaves a lane's sum as it is (the sum starts at +0 and adds squares,
 * so it is never -0). The chain of n/32 dependent FMAs is what the step
 * waits for, so no FMA may wait on its load: three register buffers rotate,
 * each block's loads issued two blocks before its FMAs, in a loop kept
 * rolled (unrolled, nvcc may place loads right before their FMAs). */
__device__ static inline float cta_inv_rms(const float *xs, int64_t n, float eps, float *inv_s) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, G = (int)((n + 255) / 256);
        float a[8], b[8], c[8], p = 0.0f;
        rms_group_load(xs, lane, 0, a);
        if (G > 1) rms_group_load(xs, lane, 1, b);
#pragma unroll 1
        for (int g = 0; g < G; g += 3) {
            if (g + 2 < G) rms_group_load(xs, lane, g + 2, c);
            p = rms_group_fma(a, p);
            if (g + 1 >= G) break;
            if (g + 3 < G) rms_group_load(xs, lane, g + 3, a);
            p = rms_group_fma(b, p);
            if (g + 2 >= G) break;
            if (g + 4 < G) rms_group_load(xs, lane, g + 4, b);
            p = rms_group_fma(c, p);
        }
        const float mean = warp_fold_lane0(p) / (float)n;
        if (lane == 0) *inv_s = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    return *inv_s;
}

/* Shared memory of a CTA that holds one row for cta_inv_rms. */
static size_t cta_row_bytes(int64_t n) { return (size_t)((n + 255) / 256 * 256) * sizeof(float); }

/* The residual step's row in shared memory, transposed for the 32-lane sum
 * (MUSER_CUDA_RES_T): value i sits in 128-value row i >> 7, 16-byte chunk
 * tr_chunk(i & 31), word (i >> 5) & 3, so lane l of the summing warp reads
 * its values l + 32k four at a time (k ascending in each float4) with one
 * 16-byte load where the natural layout takes four 4-byte ones. The chunk
 * is rotated by (c >> 3) within its group of 8 so that neither the
 * writers (a lane's values 4l..4l+3 of a half block) nor the reader (a
 * chunk a lane) meet bank conflicts. */
__device__ static inline int tr_chunk(int c) { return (c & ~7) | ((c + (c >> 3)) & 7); }
__device__ static inline int tr_pos(int i) { return (i & ~127) + 4 * tr_chunk(i & 31) + ((i >> 5) & 3); }

/* cta_inv_rms over the transposed row: the same FMAs in the same order
 * (lane l: values l + 32k, k ascending; the row zero-padded to whole
 * blocks), each block's 8 values of a lane from two 16-byte loads, the
 * loads two blocks ahead of their FMAs (three buffers, as cta_inv_rms). */
__device__ static inline float cta_inv_rms_t(const float *xs, int64_t n, float eps, float *inv_s) {
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, G = (int)((n + 255) / 256);
        const float4 *q = (const float4 *)xs + tr_chunk(lane); /* + 32 per 128-value row */
        float4 a[3][2];
        float p = 0.0f;
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (k < G) a[k][0] = q[64 * k], a[k][1] = q[64 * k + 32];
#pragma unroll 1
        for (int g = 0; g < G; g += 3) {
#pragma unroll
            for (int k = 0; k < 3; k++) {
                if (g + k >= G) break;
                if (g + k + 2 < G) a[(k + 2) % 3][0] = q[64 * (g + k + 2)], a[(k + 2) % 3][1] = q[64 * (g + k + 2) + 32];
                const float4 u = a[k][0], w = a[k][1];
                p = fmaf(u.x, u.x, p), p = fmaf(u.y, u.y, p), p = fmaf(u.z, u.z, p), p = fmaf(u.w, u.w, p);
                p = fmaf(w.x, w.x, p), p = fmaf(w.y, w.y, p), p = fmaf(w.z, w.z, p), p = fmaf(w.w, w.w, p);
            }
        }
        const float mean = warp_fold_lane0(p) / (float)n;
        if (lane == 0) *inv_s = 1.0f / sqrtf(mean + eps);
    }
    __syncthreads();
    return *inv_s;
}

/* The row's values (in shared memory) quantized to Q8_K blocks, a warp
 * per block; row r's blocks are r * n/256 .. in the split layout. */
__device__ static inline void cta_quantize_row(const float *vs, int64_t n, int64_t r, q8split o) {
    const int lane = threadIdx.x & 31, nw = blockDim.x / 32;
    const int64_t nb = n / 256;
    for (int64_t b = threadIdx.x / 32; b < nb; b += nw) {
        float v[8];
        for (int i = 0; i < 8; i++) v[i] = vs[b * 256 + lane * 8 + i];
        quantize_block_warp(v, o, r * nb + b, lane);
    }
}

/* RMSNorm of long rows: a CTA per row stages it in shared memory (all
 * loads in flight at once), warp 0 takes the 32-lane sumsq, all threads
 * write; with QUANT, the output row is also quantized to Q8_K (for the
 * matrix product that reads it next). */
template <bool QUANT>
__global__ static void __launch_bounds__(1024) k_rmsnorm_cta(const float *x, const float *w, float eps, float *y,
                                                           int64_t n, int64_t rows, q8split o) {
    grid_dep_wait();
    extern __shared__ float xs[];
    __shared__ float inv_s;
    const int64_t r = blockIdx.x;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    const int64_t npad = (n + 255) / 256 * 256;
    for (int64_t i = threadIdx.x; i < npad; i += blockDim.x) xs[i] = i < n ? xr[i] : 0.0f;
    __syncthreads();
    const float inv = cta_inv_rms(xs, n, eps, &inv_s);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = w ? (xs[i] * inv) * w[i] : xs[i] * inv;
        yr[i] = v;
        if (QUANT) xs[i] = v;
    }
    if (QUANT) {
        __syncthreads();
        cta_quantize_row(xs, n, r, o);
    }
}

/* The forward's entry, a CTA per row: x = rmsnorm(embed(token), eps)
 * (weightless), h = rmsnorm(x, eps) * w_h, quantized to Q8_K with QUANT:
 * k_embed, k_rmsnorm_cta and k_rmsnorm_cta's operations in one launch (and
 * k_tokens_regs' lookup: with regs, an id -2 - i is register i's). */
template <bool QUANT>
__global__ static void __launch_bounds__(1024) k_embed_norm(mucu_weight w, const int32_t *tokens, const int32_t *regs,
                                                          float eps, float *x, const float *w_h, float *h, int64_t n,
                                                          q8split o) {
    grid_dep_wait();
    extern __shared__ float xs[];
    __shared__ float inv_s[2];
    const int64_t r = blockIdx.x, id = tokens[r], tok = regs && id <= -2 ? regs[-2 - id] : id;
    const int64_t npad = (n + 255) / 256 * 256;
    for (int64_t i = threadIdx.x; i < npad; i += blockDim.x) xs[i] = i < n ? embed_value(w, tok, i) : 0.0f;
    __syncthreads();
    const float inv = cta_inv_rms(xs, n, eps, &inv_s[0]);
    /* each thread rewrites only its own elements (warp 0's reads ended at cta_inv_rms's barrier) */
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = xs[i] * inv;
        x[r * n + i] = v;
        xs[i] = v;
    }
    __syncthreads();
    const float inv_h = cta_inv_rms(xs, n, eps, &inv_s[1]);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = (xs[i] * inv_h) * w_h[i];
        h[r * n + i] = v;
        if (QUANT) xs[i] = v;
    }
    if (QUANT) {
        __syncthreads();
        cta_quantize_row(xs, n, r, o);
    }
}

/* A lane's 8 values of a block in the HALVES layout from p = the block's
 * start + 4 lane (16-byte aligned): 4 at p, 4 at p + 128; and their places
 * in a shared row (k_residual_w: pos[t] for value t, +128 for t + 4; TR:
 * tr_pos's scattered words, else two 16-byte stores). */
__device__ static inline void ld8w(const float *p, float v[8]) {
    const float4 a = *(const float4 *)p, c = *(const float4 *)(p + 128);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = c.x, v[5] = c.y, v[6] = c.z, v[7] = c.w;
}
__device__ static inline void st8w(float *p, const float v[8]) {
    *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4 *)(p + 128) = make_float4(v[4], v[5], v[6], v[7]);
}
template <bool TR> __device__ static inline void st8s(float *xs, const int pos[4], const float v[8]) {
    if (TR) {
#pragma unroll
        for (int t = 0; t < 4; t++) xs[pos[t]] = v[t], xs[pos[t] + 128] = v[t + 4];
    } else {
        st8w(xs + pos[0], v);
    }
}

/* The residual step's norm weights (no kernel writes them, so they are read
 * before the wait, while the kernel before this one drains), then the wait. */
template <int RB>
__device__ static inline void res_weights(const float *w_o, const float *w_h, int64_t n, int64_t nb, float wo[RB][8],
                                          float wh[RB][8]) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int k = 0; k < RB; k++) {
        const int64_t b = wid + (int64_t)nw * k;
        if (b < nb) {
            if (w_o) ld8h(w_o, b, lane, n, wo[k]);
            if (w_h) ld8h(w_h, b, lane, n, wh[k]);
        }
    }
    grid_dep_wait();
}

/* The sandwich residual step, a CTA per row: x += rmsnorm(o, eps_o) * w_o
 * (w_o NULL: x += o; cap: the new x also to row r * cap_stride of cap), then
 * (h != NULL) h = rmsnorm(x, eps_h) * w_h, quantized to Q8_K with QUANT. The same operations in the same order as rmsnorm, add, rmsnorm.
 * Lane l of warp w holds elements hx(b, l, 0..7) of the blocks b = w + k *
 * warps (k < RB): quantize_block_warp<true>'s layout, so the quantization
 * reads registers and every 16-byte access of a warp covers 512 contiguous
 * bytes: one SM sends the whole row to L2, so its stores must fill whole
 * sectors. Shared memory holds the row for the two 32-lane sums
 * (cta_inv_rms), zero-padded to whole blocks; with TR transposed
 * (tr_pos, cta_inv_rms_t). */
enum { RES_T_WARPS = 26 }; /* the transposed layout's CTAs: at most 26 warps (78 registers a thread) */
template <bool QUANT, int RB, bool TR = false>
__global__ static void __launch_bounds__(TR ? 32 * RES_T_WARPS : RB >= 4 ? 512 : 1024)
    k_residual(float *x, const float *o, const float *w_o, float eps_o, float *h, const float *w_h, float eps_h,
               int64_t n, q8split q8, float *cap, int64_t cap_stride) {
    float wo[RB][8], wh[RB][8], xv[RB][8];
    const int64_t nb = (n + 255) / 256;
    res_weights<RB>(w_o, h ? w_h : NULL, n, nb, wo, wh);
    extern __shared__ __align__(16) float res_xs[];
    float *xs = res_xs;
    __shared__ float inv_s[2];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t r = blockIdx.x;
    float *xr = x + r * n;
    const float *orow = o + r * n;
#pragma unroll
    for (int k = 0; k < RB; k++) {
        const int64_t b = wid + (int64_t)nw * k;
        if (b < nb) {
            float ov[8];
            ld8h(orow, b, lane, n, ov);
            ld8h(xr, b, lane, n, xv[k]);
            if (TR) {
#pragma unroll
                for (int t = 0; t < 8; t++) xs[tr_pos((int)hx(b, lane, t))] = ov[t];
            } else {
                *(float4 *)(xs + hx(b, lane, 0)) = make_float4(ov[0], ov[1], ov[2], ov[3]);
                *(float4 *)(xs + hx(b, lane, 4)) = make_float4(ov[4], ov[5], ov[6], ov[7]);
            }
        }
    }
    __syncthreads();
    const float inv_o = !w_o ? 1.0f /* w_o: uniform over the CTA */
                        : TR ? cta_inv_rms_t(xs, n, eps_o, &inv_s[0]) : cta_inv_rms(xs, n, eps_o, &inv_s[0]);
    /* each thread reads and rewrites only its own elements of xs (warp 0's
     * reads ended at cta_inv_rms's barrier) */
#pragma unroll
    for (int k = 0; k < RB; k++) {
        const int64_t b = wid + (int64_t)nw * k;
        if (b < nb) {
            /* 16-byte accesses, as the row was stored (8 scalar ones at an
             * 8-value stride were 8-way bank conflicts each; TR's scalar
             * ones meet none, tr_chunk) */
            float ov[8];
            if (TR) {
#pragma unroll
                for (int t = 0; t < 8; t++) ov[t] = xs[tr_pos((int)hx(b, lane, t))];
            } else {
                const float4 a = *(const float4 *)(xs + hx(b, lane, 0)), c = *(const float4 *)(xs + hx(b, lane, 4));
                ov[0] = a.x, ov[1] = a.y, ov[2] = a.z, ov[3] = a.w, ov[4] = c.x, ov[5] = c.y, ov[6] = c.z, ov[7] = c.w;
            }
#pragma unroll
            for (int t = 0; t < 8; t++)
                xv[k][t] = hx(b, lane, t) < n ? xv[k][t] + (w_o ? (ov[t] * inv_o) * wo[k][t] : ov[t]) : 0.0f;
            if (TR) {
#pragma unroll
                for (int t = 0; t < 8; t++) xs[tr_pos((int)hx(b, lane, t))] = xv[k][t];
            } else {
                *(float4 *)(xs + hx(b, lane, 0)) = make_float4(xv[k][0], xv[k][1], xv[k][2], xv[k][3]);
                *(float4 *)(xs + hx(b, lane, 4)) = make_float4(xv[k][4], xv[k][5], xv[k][6], xv[k][7]);
            }
            st8h(xr, b, lane, n, xv[k]);
            if (cap) st8h(cap + r * cap_stride, b, lane, n, xv[k]);
        }
    }
    if (!h) return;
    __syncthreads();
    const float inv_h = TR ? cta_inv_rms_t(xs, n, eps_h, &inv_s[1]) : cta_inv_rms(xs, n, eps_h, &inv_s[1]);
    float *hr = h + r * n;
#pragma unroll
    for (int k = 0; k < RB; k++) {
        const int64_t b = wid + (int64_t)nw * k;
        if (b < nb) {
#pragma unroll
            for (int t = 0; t < 8; t++) xv[k][t] = (xv[k][t] * inv_h) * wh[k][t];
            st8h(hr, b, lane, n, xv[k]);
            if (QUANT) quantize_block_warp<true>(xv[k], q8, r * nb + b, lane);
        }
    }
}

/* k_residual_w's norm weights, read before the wait as res_weights reads
 * k_residual's, then the wait. */
__device__ static inline void res_w_weights(const float *w_o, const float *w_h, int e0, float wo[8], float wh[8]) {
    if (w_o) ld8w(w_o + e0, wo);
    if (w_h) ld8w(w_h + e0, wh);
    grid_dep_wait();
}

/* k_residual for the common rows (mucu_residual picks it): whole 256-value
 * blocks, one a warp (at most 32; TR: at most RES_T_WARPS), every row
 * 16-byte aligned. The same operations in the same order and layouts, with
 * 32-bit offsets, no bounds or alignment checks, and each lane's o kept in
 * registers rather than read back from shared memory. Why: the CTA runs on
 * one SM while the rest of the GPU waits, and in k_residual the index
 * arithmetic and checks were about two thirds of its 20,900 warp
 * instructions (Nsight Compute source counters, docs/benchmarks.md
 * "Profiles"): the SM spent its time issuing them, not waiting on the sums. */
template <bool QUANT, bool TR>
__global__ static void __launch_bounds__(TR ? 32 * RES_T_WARPS : 1024)
    k_residual_w(float *x, const float *o, const float *w_o, float eps_o, float *h, const float *w_h, float eps_h,
                 int n, q8split q8, float *cap, int64_t cap_stride) {
    const int lane = threadIdx.x & 31, b = threadIdx.x >> 5, e0 = b * 256 + lane * 4; /* hx(b, lane, 0); +128: t 4 */
    float wo[8], wh[8], ov[8], xv[8];
    res_w_weights(w_o, h ? w_h : NULL, e0, wo, wh);
    extern __shared__ __align__(16) float res_xs[];
    float *xs = res_xs;
    __shared__ float inv_s[2];
    const int64_t r = blockIdx.x;
    float *xr = x + r * n + e0;
    ld8w(o + r * n + e0, ov);
    ld8w(xr, xv);
    int pos[4]; /* where value t and t + 4 (+128) sit in xs */
#pragma unroll
    for (int t = 0; t < 4; t++) pos[t] = TR ? tr_pos(e0 + t) : e0 + t;
    st8s<TR>(xs, pos, ov);
    __syncthreads();
    const float inv_o = !w_o ? 1.0f /* w_o: uniform over the CTA */
                        : TR ? cta_inv_rms_t(xs, n, eps_o, &inv_s[0]) : cta_inv_rms(xs, n, eps_o, &inv_s[0]);
#pragma unroll
    for (int t = 0; t < 8; t++) xv[t] = xv[t] + (w_o ? (ov[t] * inv_o) * wo[t] : ov[t]);
    st8s<TR>(xs, pos, xv); /* each thread rewrites only its own values (warp 0's reads ended at the barrier) */
    st8w(xr, xv);
    if (cap) st8w(cap + r * cap_stride + e0, xv);
    if (!h) return;
    __syncthreads();
    const float inv_h = TR ? cta_inv_rms_t(xs, n, eps_h, &inv_s[1]) : cta_inv_rms(xs, n, eps_h, &inv_s[1]);
#pragma unroll
    for (int t = 0; t < 8; t++) xv[t] = (xv[t] * inv_h) * wh[t];
    st8w(h + r * n + e0, xv);
    if (QUANT) quantize_block_warp<true>(xv, q8, r * (n / 256) + b, lane);
}

/* Per-head q and k RMSNorm, then (cs != NULL) the interleaved rotation of
 * the first n_rot dims: a warp per (row, head), q heads first. Lane l holds
 * dims l + 32k (the 32-lane sumsq order); a pair's partner is the next
 * lane. The same operations as rmsnorm then rope. */
/* The q/k norm weights of this warp's head (no kernel writes them, so they
 * are read before the wait, while the kernel before this one drains), then
 * the wait. Warps of V heads and past the end read none. */
template <int K>
__device__ static inline void qkn_weights(const float *wq, int64_t nq, const float *wk, int64_t nk, int64_t rows,
                                          bool with_v, float wv[K]) {
    const int64_t wid = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const int64_t per_row = nq + nk + (with_v ? nk : 0), hh = wid % per_row;
    if (wid < rows * per_row && hh < nq + nk) {
        const float *w = hh < nq ? wq : wk;
#pragma unroll
        for (int j = 0; j < K; j++) wv[j] = w[lane + 32 * j];
    }
    grid_dep_wait();
}

template <int K>
__global__ static void k_qk_norm_rope(float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk,
                                      float eps, const float *cs, int64_t n_rot, int64_t rows,
                                      const mucu_kv_dst *dst, const float *vsrc, bool neox, mucu_heads_dst hd) {
    float wv[K];
    const bool store = dst != nullptr || hd.kd != nullptr; /* dst: the target's cache; hd: the assistant's planes */
    qkn_weights<K>(wq, nq, wk, nk, rows, store, wv);
    const int64_t wid = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    const int64_t per_row = nq + nk + (store ? nk : 0); /* storing, a warp per V head too */
    const bool live = wid < rows * per_row;
    const int64_t r = wid / per_row, hh = wid % per_row;
    const bool is_q = hh < nq, is_v = hh >= nq + nk;
    if (!live) return;
    if (is_v) { /* V head hh - nq - nk of row r: stored as given */
        const int64_t hv = hh - nq - nk;
        const float *vr = vsrc + (r * nk + hv) * (32 * K);
        if (hd.kd) { /* store_kv_heads' transposed V plane: value d of the slot at hv * D * S + slot + d * S */
            float *vt = hd.vd + hv * (32 * K) * hd.S + hd.slots[r];
#pragma unroll
            for (int j = 0; j < K; j++) vt[(int64_t)(lane + 32 * j) * hd.S] = vr[lane + 32 * j];
            return;
        }
        const mucu_kv_dst d = dst[r];
#pragma unroll
        for (int j = 0; j < K; j++) kv_put(d.v, d.jk ? d.jv : NULL, d, hv, 32 * K, lane + 32 * j, vr[lane + 32 * j]);
        return;
    }
    float *v = is_q ? q + (r * nq + hh) * (32 * K) : k + (r * nk + (hh - nq)) * (32 * K);
    float x[K], c[K], sn[K];
#pragma unroll
    for (int j = 0; j < K; j++) x[j] = v[lane + 32 * j];
    mucu_kv_dst d; /* a K head's cache destination, asked for with x */
    if (dst && !is_q) d = dst[r];
    if (cs) { /* the row's angles, loaded with x (lanes past n_rot read pair 0 and ignore it; NeoX,
               * n_rot the head: dims e and e + 16K are pair e's, one lane's values j and j + K/2) */
        const float *csr = cs + r * n_rot;
#pragma unroll
        for (int j = 0; j < K; j++) {
            const int e = lane + 32 * j;
            const int pe = neox ? 2 * (j < K / 2 ? e : e - 16 * K) : e < n_rot ? 2 * (e / 2) : 0;
            c[j] = csr[pe];
            sn[j] = csr[pe + 1];
        }
    }
    float p = 0.0f;
#pragma unroll
    for (int j = 0; j < K; j++) p = fmaf(x[j], x[j], p);
    const float mean = warp_fold_lane0(p) / (float)(32 * K);
    const float inv = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < K; j++) x[j] = (x[j] * inv) * wv[j];
    if (cs && neox) { /* k_rope's NeoX: x0 c - x1 s and x1 c + x0 s */
        float y[K];
#pragma unroll
        for (int j = 0; j < K; j++)
            y[j] = j < K / 2 ? x[j] * c[j] - x[j + K / 2] * sn[j] : x[j] * c[j] + x[j - K / 2] * sn[j];
#pragma unroll
        for (int j = 0; j < K; j++) x[j] = y[j];
    } else if (cs) {
#pragma unroll
        for (int j = 0; j < K; j++) {
            const int e = lane + 32 * j;
            const float other = __shfl_xor_sync(FULL_MASK, x[j], 1);
            if (e < n_rot) x[j] = (e & 1) ? other * sn[j] + x[j] * c[j] : x[j] * c[j] - other * sn[j];
        }
    }
#pragma unroll
    for (int j = 0; j < K; j++) v[lane + 32 * j] = x[j];
    if (dst && !is_q) { /* K head hh - nq of row r into the cache */
#pragma unroll
        for (int j = 0; j < K; j++) kv_put(d.k, d.jk, d, hh - nq, 32 * K, lane + 32 * j, x[j]);
    }
    if (hd.kd && !is_q) { /* K head hh - nq of row r into its plane's slot row (store_kv_heads) */
        float *kr = hd.kd + ((hh - nq) * hd.S + hd.slots[r]) * (32 * K);
#pragma unroll
        for (int j = 0; j < K; j++) kr[lane + 32 * j] = x[j];
    }
}

/* Attention, split over 256-key blocks: a warp per (row, head, block)
 * writes the block's (m_b, l_b, acc_b[D]); k_attn_merge then merges a
 * row's blocks in block order with the reference formula. Lane l owns
 * dims d = l + 32k. */
/* A CTA of 128 threads per (row, head, block). Scores: thread i takes keys
 * i, i+128 of the block, each a whole dot in the 32-lane order (partial l
 * over d = l mod 32, then the fold). m_b: the reference's scan in key
 * order. Then e_p, and thread i accumulates dims i + 128k over the keys in
 * order (acc_b, l_b). */
template <int DPT>
__global__ static void __launch_bounds__(128) k_attn_blocks(const mucu_attn_row *desc, int64_t rows, int64_t n_head,
                                                           int64_t n_head_kv, int64_t D, float scale, const float *q,
                                                           float *part, int64_t nbmax, float *final_out) {
    grid_dep_wait();
    __shared__ float es[256];
    __shared__ float qsh[128 * DPT];
    const int tid = threadIdx.x;
    const int64_t wid = blockIdx.x;
    const int64_t rh = wid / nbmax, j = wid % nbmax, r = rh / n_head, h = rh % n_head;
    const int64_t kv_head = h / (n_head / n_head_kv);
    mucu_attn_row a = desc[r];
    const int8_t *anc = attn_row_resolve(a, desc, r);
    const int64_t start = a.first + 256 * j;
    if (start > a.pos) return;
    const int64_t end = start + 255 < a.pos ? start + 255 : a.pos;
    const int nk = (int)(end - start + 1);
    const float *qh = q + rh * D;
    for (int d = tid; d < 128 * DPT; d += 128) qsh[d] = d < D ? qh[d] : 0.0f;
    __syncthreads();
    const uint16_t *kbase = a.k + kv_head * a.cap * D, *vbase = a.v + kv_head * a.cap * D;
    const int64_t phys0 = start % a.cap;
    for (int p = tid; p < nk; p += 128) {
        const uint16_t *kp = kbase + attn_key_row(a, anc, start, phys0, p) * D;
        float pp[32];
#pragma unroll
        for (int l = 0; l < 32; l++) pp[l] = 0.0f;
        if (D % 32 == 0) {
            for (int c = 0; c < D / 32; c++) {
                const uint4 *k4 = (const uint4 *)(kp + 32 * c);
                uint4 kk[4];
#pragma unroll
                for (int u = 0; u < 4; u++) kk[u] = k4[u];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint32_t wv[4] = {kk[u].x, kk[u].y, kk[u].z, kk[u].w};
#pragma unroll
                    for (int e = 0; e < 8; e++) {
                        const int l = 8 * u + e;
                        const uint16_t hb = (uint16_t)(e & 1 ? wv[e >> 1] >> 16 : wv[e >> 1] & 0xFFFF);
                        pp[l] = fmaf(qsh[32 * c + l], h2f(hb), pp[l]);
                    }
                }
            }
        } else {
            for (int c = 0; 32 * c < D; c++)
#pragma unroll
                for (int l = 0; l < 32; l++)
                    if (32 * c + l < D) pp[l] = fmaf(qsh[32 * c + l], h2f(kp[32 * c + l]), pp[l]);
        }
#pragma unroll
        for (int hh = 16; hh >= 1; hh /= 2)
#pragma unroll
            for (int l = 0; l < hh; l++) pp[l] = pp[l] + pp[l + hh];
        es[p] = pp[0] * scale;
    }
    __syncthreads();
    float m_b = -INFINITY;
    for (int p = 0; p < nk; p++) {
        const float sv = es[p];
        if (sv > m_b) m_b = sv;
    }
    __syncthreads();
    for (int p = tid; p < nk; p += 128) es[p] = d_expf(es[p] - m_b);
    __syncthreads();
    float l_b = 0.0f, acc[DPT];
#pragma unroll
    for (int k = 0; k < DPT; k++) acc[k] = 0.0f;
#pragma unroll 8
    for (int p = 0; p < nk; p++) {
        const float e = es[p];
        l_b = l_b + e;
        const uint16_t *vp = vbase + attn_key_row(a, anc, start, phys0, p) * D;
#pragma unroll
        for (int k = 0; k < DPT; k++)
            if (tid + 128 * k < D) acc[k] = fmaf(e, h2f(vp[tid + 128 * k]), acc[k]);
    }
    if (final_out) { /* every row has one block: the merge is out = acc_b / l_b */
#pragma unroll
        for (int k = 0; k < DPT; k++)
            if (tid + 128 * k < D) final_out[rh * D + tid + 128 * k] = acc[k] / l_b;
        return;
    }
    float *out = part + wid * (D + 2);
    if (tid == 0) out[0] = m_b, out[1] = l_b;
#pragma unroll
    for (int k = 0; k < DPT; k++)
        if (tid + 128 * k < D) out[2 + tid + 128 * k] = acc[k];
}

template <int DPL>
__global__ static void __launch_bounds__(128) k_attn_merge(const mucu_attn_row *desc, int64_t rows, int64_t n_head,
                                                          int64_t D, const float *part, int64_t nbmax, float *out) {
    grid_dep_wait();
    const int lane = threadIdx.x & 31;
    const int64_t rh = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (rh >= rows * n_head) return;
    mucu_attn_row a = desc[rh / n_head];
    (void)attn_row_resolve(a, desc, rh / n_head);
    const int64_t nbr = a.pos >= a.first ? (a.pos - a.first) / 256 + 1 : 0;
    float M = 0.0f, L = 0.0f, A[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++) A[k] = 0.0f;
    for (int64_t j = 0; j < nbr; j++) {
        const float *pb = part + (rh * nbmax + j) * (D + 2);
        const float m_b = pb[0], l_b = pb[1];
        if (j == 0) {
            M = m_b, L = l_b;
#pragma unroll
            for (int k = 0; k < DPL; k++)
                if (lane + 32 * k < D) A[k] = pb[2 + lane + 32 * k];
            continue;
        }
        const float M2 = m_b > M ? m_b : M;
        const float ca = d_expf(M - M2), cb = d_expf(m_b - M2);
        L = L * ca + l_b * cb;
#pragma unroll
        for (int k = 0; k < DPL; k++)
            if (lane + 32 * k < D) A[k] = A[k] * ca + pb[2 + lane + 32 * k] * cb;
        M = M2;
    }
    float *o = out + rh * D;
#pragma unroll
    for (int k = 0; k < DPL; k++)
        if (lane + 32 * k < D) o[lane + 32 * k] = A[k] / L;
}

/* -------------------------------------------------------------- launchers */

extern "C" bool mucu_embed(const mucu_weight *w, const int32_t *tokens, int64_t rows, float *x, char *err) {
    LAUNCH(k_embed, rows * w->n_in, *w, tokens, rows, x);
}

extern "C" size_t mucu_q8k_bytes(int64_t n_in, int64_t rows) {
    const size_t blocks = (size_t)(n_in / 256) * (size_t)rows * sizeof(q8k_block);
    const size_t split = al256((size_t)(rows * n_in)) + al256((size_t)(rows * (n_in / 256)) * 4) +
                         al256((size_t)(rows * (n_in / 256)) * 32);
    return (blocks > split ? blocks : split) + 256;
}

/* The default kernel choice (variant 3), from test_cuda_backend --bench-mmv
 * on the H200: k_mmv3 with 4 warps per output
 * for rows of 8 or more steps (ffn_down, 78 blocks: 29.5 against 36.4 us
 * at 1 row, Q4_K; Q6_K at every row count, Q4_K up to 4 rows), with 2 for
 * rows of 2-3 steps (attn_output, 16 blocks: 9.4 against 10.6 us); sets:
 * k_mmv3_set for rows of 4 or more steps (the full model's 26), with 1
 * warp per output at 3-4 rows, 2 from 5 rows on. The
 * rest stays on k_mmv2. Returns k_mmv3's warps per output, 0 for k_mmv2. */
static int mmv3_pick(int nb, int nr, int type, bool set, int *u) {
    const int steps = (nb + 7) / 8;
    *u = 1;
    if (set) return steps < 4 ? 0 : nr > 4 ? 2 : nr > 2 ? 1 : 0; /* measured on 26-block rows only */
    if (steps >= 8) return nr <= 4 || type == T_Q6_K ? 4 : 0;
    return steps >= 2 && steps <= 3 ? 2 : 0;
}

/* Variant 7 (k_mmv3 everywhere): mucu_set_mmv3 (tests, benchmarks) or
 * MUSER_CUDA_WPR / MUSER_CUDA_MMV_U force the warps per output and steps
 * in flight; else mmv3_pick's, with 1 warp and 2 steps where it picks k_mmv2. */
static int mmv3_wpr = -1, mmv3_u = -1;

extern "C" void mucu_set_mmv3(int wpr, int u) { mmv3_wpr = wpr, mmv3_u = u; }

static void mmv3_shape(int nb, int nr, int type, bool set, int *wpr, int *u) {
    if (mmv3_wpr < 0) {
        const char *e = getenv("MUSER_CUDA_WPR"), *f = getenv("MUSER_CUDA_MMV_U");
        mmv3_wpr = e && *e ? atoi(e) : 0;
        mmv3_u = f && *f ? atoi(f) : 0;
    }
    int pu, pw = mmv3_pick(nb, nr, type, set, &pu);
    if (!pw) pw = 1, pu = nr <= 2 ? 2 : 1;
    *wpr = mmv3_wpr == 1 || mmv3_wpr == 2 || mmv3_wpr == 4 ? mmv3_wpr : pw;
    *u = nr > 2 ? 1 : mmv3_u == 1 || mmv3_u == 2 ? mmv3_u : pu;
}

/* M(T) for the weight-streaming kernels' three types (Q6_K: the split layout). */
#define KQ_SWITCH(type, M)                                                                                          \
    do {                                                                                                            \
        if ((type) == T_Q4_K) M(T_Q4_K);                                                                            \
        else if ((type) == T_Q5_K) M(T_Q5_K);                                                                       \
        else M(T_Q6_K);                                                                                             \
    } while (0)

/* M(A, R) at the row bucket R (1, 2, 4, 8 or 16 rows) that holds nr rows:
 * the row-count templates of the weight-streaming launches. */
#define ROW_BUCKET(nr, M, A)                                                                                        \
    do {                                                                                                            \
        if ((nr) <= 1) M(A, 1);                                                                                     \
        else if ((nr) <= 2) M(A, 2);                                                                                \
        else if ((nr) <= 4) M(A, 4);                                                                                \
        else if ((nr) <= 8) M(A, 8);                                                                                \
        else M(A, 16);                                                                                              \
    } while (0)

static int mmv_variant = -1; /* MUSER_CUDA_MMV: 3 (default) k_mmv4 at 1 row, else k_mmv2 and k_mmv3 by shape
                                 (mmv3_pick); 10: as 3 without k_mmv4; 11, 12, 13: k_mmv4 at 1 row with 1, 2, 4
                                 warps per slot and 2 blocks in flight, 14, 15, 16: the same with 4; 17, 18:
                                 k_mmv6 at 1 row, 2 and 4 outputs a unit, 19, 20: the same with the next
                                 unit's weights in flight (4 and 5: other
                                 numbers of steps in flight); 0: 8-lane groups per
                                 block (k_mmv_kq); 1: the same, rows <= 2 staged in shared memory; 2: lane per
                                 block (k_mmv_lpb); 7: several warps per output (k_mmv3) everywhere; 8: k_mmv2
                                 everywhere (3 before k_mmv3). All exact (docs/cuda.md). */

extern "C" void mucu_set_mmv_variant(int v) { mmv_variant = v; }

/* The variants that choose by shape like the default (10..16 differ only at 1 row). */
static bool v3like(int v) { return v == 3 || (v >= 10 && v <= 20); }

/* The profile's name for a weight-streaming launch: the kernel and the
 * weight's type and shape (interned: the profile keys on the string). */
static const char *mmv_name(const mucu_weight *w) {
    static struct { uint32_t type; int64_t n_in, n_out; char name[48]; } tab[64];
    static int n;
    if (!prof_on) return "k_mmv2";
    for (int i = 0; i < n; i++)
        if (tab[i].type == w->type && tab[i].n_in == w->n_in && tab[i].n_out == w->n_out) return tab[i].name;
    if (n == 64) return "k_mm* (other)";
    tab[n].type = w->type, tab[n].n_in = w->n_in, tab[n].n_out = w->n_out;
    snprintf(tab[n].name, sizeof tab[n].name, "k_mm* t%u %lldx%lld", (unsigned)w->type, (long long)w->n_in,
             (long long)w->n_out); /* any row count: k_mmv4 at 1 row, k_mmt from 2 */
    return tab[n++].name;
}

/* k_mmv4's warps per slot (test_cuda_backend --bench-mmv, H200): the
 * fewest (1, 2, 4) that give 2,048 warps while each warp keeps at least 4
 * blocks (attn_output and ffn_down get 4: 9.1 and 25.7 us against 9.3 and
 * 29.8 before k_mmv4; the q/k/v/gate set 2: 15.8 against 17.9); grids of
 * 4,096 slots or more 2 (the ffn gate+up set, 4,992 slots: 46.0 us, 50.9
 * with 1, 58.0 before); the rest 1 (the output, 3,157 slots: 38.9 against
 * 42.1). */
static int mmv4_pick(int nb, int64_t slots) {
    int wpr = 1;
    while (wpr < 4 && slots * wpr < 2048 && nb / (2 * wpr) >= 4) wpr *= 2;
    if (wpr == 1 && slots >= 4096 && nb >= 16) wpr = 2;
    return wpr;
}

/* MUSER_CUDA_MMV6: 1 (default) the default variant takes k_mmv6 at 1 row
 * for the K-quants from 16 blocks (n_in 4096) to MMV6_MAX_NB, 4 outputs a
 * unit where a Q4_K weight of 24 blocks or more is in the set, else 2
 * (test_cuda_backend --bench-mmv, H100: the ffn gate+up set 54.86 us
 * against 57.43 on k_mmv4, q/k/v/gate 16.08 against 17.37, ffn_down Q4_K
 * 30.02 against 31.69 at 4; attn_output 9.88 against 10.15, the output
 * (Q5_K) 43.44 against 48.36, ffn_down Q6_K 41.16 against 41.73 at 2);
 * below 16 blocks (glimmer-tiny: 2 to 4) k_mmv4, whose grids are not
 * persistent (the tiny model decoded 19 % slower on k_mmv6 at 4, about
 * as fast at 2); 0: k_mmv4 as before (docs/cuda.md "Fast paths"). */
static int mmv6_on = -1;

extern "C" int mucu_mmv6_grid = 0;

/* One row through k_mmv6 (u = 2 or 4 outputs a unit, pf = 1 or 2 units'
 * weights in flight; variants 17..20 force it): a persistent grid, as many
 * CTAs as stay resident. */
static bool launch_mmv6(const mucu_weight *const *w, int n, float *const *y, q8split xq, int nb, int u, int pf,
                        char *err) {
    int tm = 0;
    for (int i = 0; i < n; i++) tm |= w[i]->type == T_Q4_K ? 1 : w[i]->type == T_Q5_K ? 2 : 4;
    if (tm != 1 && tm != 2 && tm != 4 && tm != 5) tm = 7;
    const mmv_set set = mmv_set_of(w, n, y, u);
    const int threads = 32 * ((nb + 7) / 8);
    const size_t sm = (size_t)2 * u * nb * 4;
    const void *fn = NULL;
#define MMV6_FN(UU, PP)                                                                                             \
    do {                                                                                                            \
        if (tm == 1) fn = (const void *)k_mmv6_set<UU, 1, PP>;                                                      \
        else if (tm == 2) fn = (const void *)k_mmv6_set<UU, 2, PP>;                                                 \
        else if (tm == 4) fn = (const void *)k_mmv6_set<UU, 4, PP>;                                                 \
        else if (tm == 5) fn = (const void *)k_mmv6_set<UU, 5, PP>;                                                 \
        else fn = (const void *)k_mmv6_set<UU, 7, PP>;                                                              \
    } while (0)
    if (u == 4) { if (pf == 2) MMV6_FN(4, 2); else MMV6_FN(4, 1); }
    else { if (pf == 2) MMV6_FN(2, 2); else MMV6_FN(2, 1); }
#undef MMV6_FN
    /* CTAs that stay resident, per instance and CTA size (the largest nb's shared memory) */
    static struct { const void *fn; int threads, per_sm; } occ[32];
    static int n_occ;
    int per_sm = 0;
    for (int k = 0; k < n_occ; k++)
        if (occ[k].fn == fn && occ[k].threads == threads) per_sm = occ[k].per_sm;
    if (!per_sm) {
        if (!cu_ok(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, (size_t)2 * u * MMV6_MAX_NB * 4),
                   "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "k_mmv6_set", err))
            return false;
        if (per_sm < 1) per_sm = 1;
        if (n_occ < 32) occ[n_occ++] = {fn, threads, per_sm};
    }
    const int64_t units = set.first[n];
    int64_t cap = (int64_t)sm_count() * per_sm;
    if (mucu_mmv6_grid > 0) cap = mucu_mmv6_grid;
    const unsigned grid = (unsigned)(units < cap ? units : cap);
    void *args[] = {(void *)&set, (void *)&nb, (void *)&xq};
    return cu_ok(cudaLaunchKernel(fn, dim3(grid), dim3(threads), args, sm, g_s), "cudaLaunchKernel", "k_mmv6_set",
                 err) &&
           launched(prof_on && n == 1 ? mmv_name(w[0]) : "k_mmv6_set", err);
}

/* One row through k_mmv6 (mmv6_on, variants 17..20) or k_mmv4 (variant 3
 * and 11..16): n weights of the fast types sharing the activations; *taken
 * false when the variant does not take it. A lone Q6_K weight that k_mmv6
 * does not take stays on k_mmv2/k_mmv3 under the default: its scales and d
 * lie apart from the codes (the split layout), so k_mmv4's 8 outputs'
 * blocks at once touch 8 more lines each (ffn_down Q6_K: 51.3 us against
 * 35.3 on k_mmv3). */
static bool launch_mmv4(const mucu_weight *const *w, int n, float *const *y, q8split xq, int nr, bool *taken,
                        char *err) {
    *taken = false;
    const bool fp4 = is_fp4((int)w[0]->type); /* NVFP4 takes k_mmv4 at 1 row under every variant */
    if (nr != 1 || !(fp4 || mmv_variant == 3 || (mmv_variant >= 11 && mmv_variant <= 20)) || n > MMV_SET_MAX) return true;
    const int nb = (int)(w[0]->n_in / 256);
    if (!fp4 && nb <= MMV6_MAX_NB && mmv_variant >= 17 && mmv_variant <= 20) {
        *taken = true;
        return launch_mmv6(w, n, y, xq, nb, mmv_variant % 2 ? 2 : 4, mmv_variant >= 19 ? 2 : 1, err);
    }
    env_setting(&mmv6_on, "MUSER_CUDA_MMV6", 1);
    if (!fp4 && mmv_variant == 3 && mmv6_on && nb >= 16 && nb <= MMV6_MAX_NB) {
        bool q4 = false;
        for (int i = 0; i < n; i++) q4 = q4 || w[i]->type == T_Q4_K;
        *taken = true;
        return launch_mmv6(w, n, y, xq, nb, q4 && nb >= 24 ? 4 : 2, 1, err);
    }
    if (mmv_variant == 3 && n == 1 && w[0]->type == T_Q6_K) return true;
    const mmv_set set = mmv_set_of(w, n, y, 8);
    const bool v11 = mmv_variant >= 11 && mmv_variant <= 16;
    int wpr = v11 ? 1 << ((mmv_variant - 11) % 3) : mmv4_pick(nb, set.first[n]);
    if ((size_t)(4 / wpr) * 8 * nb * 4 > 48 * 1024) wpr = 1;
    const bool u4 = v11 && mmv_variant >= 14;
    const unsigned grid = grid_for(set.first[n], 4 / wpr);
    const size_t sm = wpr > 1 ? (size_t)(4 / wpr) * 8 * nb * 4 : 0;
#define MMV4F(UU, WW, F) k_mmv4_set<UU, WW, F><<<grid, 128, sm, g_s>>>(set, nb, xq)
#define MMV4(UU, WW)                                                                                                \
    do {                                                                                                            \
        if (fp4) MMV4F(UU, WW, true);                                                                               \
        else MMV4F(UU, WW, false);                                                                                  \
    } while (0)
    if (wpr == 4) { if (u4) MMV4(4, 4); else MMV4(2, 4); }
    else if (wpr == 2) { if (u4) MMV4(4, 2); else MMV4(2, 2); }
    else { if (u4) MMV4(4, 1); else MMV4(2, 1); }
#undef MMV4
#undef MMV4F
    *taken = true;
    return launched(prof_on && n == 1 ? mmv_name(w[0]) : "k_mmv4_set", err);
}

static bool gemm_fp4(const mucu_weight *w, q8split xq, int64_t rows, float *y, char *err);
static bool fp4_gemm_takes(int64_t rows, int64_t n_out);

static bool launch_mmv(const mucu_weight *w, q8split xq, int64_t r0, int nr, float *y, char *err) {
    env_setting(&mmv_variant, "MUSER_CUDA_MMV", 3);
    const int nb = (int)(w->n_in / 256);
    q8split x = xq;
    x.qs += r0 * w->n_in, x.d += r0 * nb, x.bs += r0 * nb * 16;
    float *yr = y + r0 * w->n_out;
    if (is_fp4((int)w->type)) { /* NVFP4 in the split layout: k_mmv4 at 1 row, k_gemm_fp4 or k_mmv2 above */
        if (nr == 1) {
            bool taken;
            const mucu_weight *one[1] = {w};
            float *ys[1] = {yr};
            return launch_mmv4(one, 1, ys, x, nr, &taken, err);
        }
        if (fp4_gemm_takes(nr, w->n_out)) return gemm_fp4(w, x, nr, yr, err);
        const unsigned grid = grid_for(w->n_out, 4);
#define FP4(T, R) k_mmv2<T, R, 1><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nb, x, nr, yr, w->has_scale, w->scale)
        if (w->type == T_NVFP4_NATIVE) ROW_BUCKET(nr, FP4, T_NVFP4_NATIVE);
        else ROW_BUCKET(nr, FP4, T_NVFP4);
#undef FP4
        return launched(mmv_name(w), err);
    }
    const int mmt = mucu_mmt_min_rows_get();
    if (mmt > 0 && nr >= mmt && mmv_variant >= 3) { /* cuda_mmt.cu */
        const mucu_weight *one[1] = {w};
        float *ys[1] = {yr};
        mucu_mmt(one, 1, ys, x.qs, x.d, x.bs, nr, g_s);
        return launched(prof_on ? mmv_name(w) : "k_mmt", err);
    }
    {
        const mucu_weight *one[1] = {w};
        float *ys[1] = {yr};
        bool taken;
        if (!launch_mmv4(one, 1, ys, x, nr, &taken, err)) return false;
        if (taken) return true;
    }
    int wpr = 0, u = 1;
    if (mmv_variant == 7) mmv3_shape(nb, nr, (int)w->type, false, &wpr, &u);
    else if (v3like(mmv_variant)) wpr = mmv3_pick(nb, nr, (int)w->type, false, &u);
    if (wpr) {
        const unsigned grid = grid_for(w->n_out, 4 / wpr);
        const int R = nr <= 1 ? 1 : nr <= 2 ? 2 : nr <= 4 ? 4 : nr <= 8 ? 8 : 16;
        const size_t sm = (size_t)(4 / wpr) * R * nb * 4;
        if (sm <= 48 * 1024) {
#define MMV3U(T, RR, UU, WW) k_mmv3<T, RR, UU, WW><<<grid, 128, sm, g_s>>>(w->data, w->n_out, nb, x, nr, yr, w->has_scale, w->scale)
#define MMV3W(T, RR, UU)                                                                                            \
    do {                                                                                                            \
        if (wpr == 4) MMV3U(T, RR, UU, 4);                                                                          \
        else if (wpr == 2) MMV3U(T, RR, UU, 2);                                                                     \
        else MMV3U(T, RR, UU, 1);                                                                                   \
    } while (0)
#define MMV3(T)                                                                                                     \
    do {                                                                                                            \
        if (R == 1) { if (u == 2) MMV3W(T, 1, 2); else MMV3W(T, 1, 1); }                                            \
        else if (R == 2) { if (u == 2) MMV3W(T, 2, 2); else MMV3W(T, 2, 1); }                                       \
        else if (R == 4) MMV3W(T, 4, 1);                                                                            \
        else if (R == 8) MMV3W(T, 8, 1);                                                                            \
        else MMV3W(T, 16, 1);                                                                                       \
    } while (0)
            KQ_SWITCH(w->type, MMV3);
#undef MMV3
#undef MMV3W
#undef MMV3U
            return launched(mmv_name(w), err);
        }
    }
    if (mmv_variant >= 3) {
        /* steps in flight (H200, test_cuda_backend --bench-mmv): 3 (default) 2 for 1-2 rows, 1 for more
         * (4 steps at 1 row and 2 at 4 rows measured slower); 4: 4 for 1-2 rows; 5: 1; 6: as 3, but
         * mucu_matmul_set launches per weight */
        const int v = mmv_variant;
        const unsigned grid = grid_for(w->n_out, 4);
#define MMV2U(T, R, U) k_mmv2<T, R, U><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nb, x, nr, yr, w->has_scale, w->scale)
#define MMV2(T, R)                                                                                                  \
    do {                                                                                                            \
        if ((v3like(v) || v == 6 || v == 8) && R <= 2) MMV2U(T, R, 2);                                                 \
        else if (v == 4 && R <= 2) MMV2U(T, R, 4);                                                                  \
        else MMV2U(T, R, 1);                                                                                        \
    } while (0)
#define MMV2_R(T) ROW_BUCKET(nr, MMV2, T)
        KQ_SWITCH(w->type, MMV2_R);
#undef MMV2_R
#undef MMV2
#undef MMV2U
        return launched(mmv_name(w), err);
    }
    if (mmv_variant == 2) {
        const int R = nr <= 1 ? 1 : nr <= 2 ? 2 : nr <= 4 ? 4 : nr <= 8 ? 8 : 16;
        int rpc = (int)((128 + nb - 1) / nb); /* about one block per thread */
        if (rpc < 1) rpc = 1;
        while (rpc > 1 && (size_t)R * rpc * nb * 4 > 48 * 1024) rpc--;
        if ((size_t)R * rpc * nb * 4 <= 48 * 1024) {
            const unsigned grid = (unsigned)((w->n_out + rpc - 1) / rpc);
            const size_t sm = (size_t)R * rpc * nb * 4;
#define LPB(T, RR) k_mmv_lpb<T, RR><<<grid, 128, sm, g_s>>>(w->data, w->n_out, nb, x, nr, rpc, yr, w->has_scale, w->scale)
#define LPB_R(T)                                                                                                    \
    do {                                                                                                            \
        if (R == 1) LPB(T, 1);                                                                                      \
        else if (R == 2) LPB(T, 2);                                                                                 \
        else if (R == 4) LPB(T, 4);                                                                                 \
        else if (R == 8) LPB(T, 8);                                                                                 \
        else LPB(T, 16);                                                                                            \
    } while (0)
            KQ_SWITCH(w->type, LPB_R);
#undef LPB_R
#undef LPB
            return launched("k_mmv_lpb", err);
        }
    }
    const size_t smem = (size_t)nr * (size_t)w->n_in;
    if (mmv_variant == 1 && nr <= 2 && smem <= 48 * 1024) {
        const unsigned grid = grid_for(w->n_out, 8);
#define MMVS(T, R) k_mmv_kq<T, R, 4, 8, true><<<grid, 256, smem, g_s>>>(w->data, w->n_out, nb, x, nr, yr, w->has_scale, w->scale)
        switch (w->type) {
        case T_Q4_K: if (nr == 1) MMVS(T_Q4_K, 1); else MMVS(T_Q4_K, 2); break;
        case T_Q5_K: if (nr == 1) MMVS(T_Q5_K, 1); else MMVS(T_Q5_K, 2); break;
        default: if (nr == 1) MMVS(T_Q6_K, 1); else MMVS(T_Q6_K, 2); break;
        }
#undef MMVS
        return launched("k_mmv_kq(smem)", err);
    }
    const unsigned grid = grid_for(w->n_out, 4);
#define MMV(T, R) k_mmv_kq<T, R, (R <= 2 ? 4 : (R <= 4 ? 2 : 1)), 4, false><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nb, x, nr, yr, w->has_scale, w->scale)
#define MMV_R(T) ROW_BUCKET(nr, MMV, T)
    KQ_SWITCH(w->type, MMV_R);
#undef MMV_R
#undef MMV
    return launched("k_mmv_kq", err);
}

/* MUSER_CUDA_GEMM=N: the tensor-core kernels for calls of >= N rows (0: off,
 * the weight-streaming kernel for every row count). Default 17: a 16-row
 * call (verification at --verify-len 15, the DFlash block, 16 streams) on
 * the weight-streaming kernel ran 2.75x faster than on k_gemm_kq (full
 * model, prefill in 16-row chunks, H200). */
static int gemm_min_rows_v = -1;
static int gemm_min_rows(void) { return env_setting(&gemm_min_rows_v, "MUSER_CUDA_GEMM", 17); }

/* Q4_K/Q5_K/Q6_K calls of 17 to MUSER_CUDA_MMT_MAX rows (default 32; 16:
 * none) stay on k_mmt (four 8-row tiles), not the GEMM, whose tiles are
 * made for many rows: a 24-token prompt of the full model prefilled at
 * 1,106 against 611 tokens/s on an H100 (docs/benchmarks.md "Switches and
 * what they are worth"). */
static int mmt_max_v = -1;
static bool mmt_wide(int type, int64_t rows) {
    if (rows <= 16 || is_fp4(type)) return false;
    const int mx = env_setting(&mmt_max_v, "MUSER_CUDA_MMT_MAX", 32), mmt = mucu_mmt_min_rows_get();
    env_setting(&mmv_variant, "MUSER_CUDA_MMV", 3);
    return rows <= (mx < 32 ? mx : 32) && mmt > 0 && mmv_variant >= 3;
}

/* n fast-path weights with the same n_in reading x's quantization (already
 * in q8 when prequantized): rows <= 16 with the default kernel in one
 * k_mmv2_set launch, else one product per weight. */
extern "C" bool mucu_matmul_set(const mucu_weight *const *w, int n, const float *x, float *const *y, int64_t rows,
                                void *q8, int prequantized, float *split, char *err) {
    if (rows <= 0) return true;
    env_setting(&mmv_variant, "MUSER_CUDA_MMV", 3);
    const int gmin = gemm_min_rows();
    /* NVFP4 (every weight of a set is, or none: cuda_backend.c): one k_mmv4 launch at 1 row, else per weight */
    const bool fp4 = is_fp4((int)w[0]->type);
    const bool wide = mmt_wide((int)w[0]->type, rows);
    const bool one = n <= MMV_SET_MAX && (rows <= 16 || wide) &&
                     (fp4 ? rows == 1
                          : (v3like(mmv_variant) || mmv_variant == 7 || mmv_variant == 8) &&
                                !(gmin > 0 && rows >= gmin && !wide));
    if (!one) {
        for (int i = 0; i < n; i++)
            if (!mucu_matmul(w[i], x, y[i], rows, q8, prequantized || i > 0, split, err)) return false;
        return true;
    }
    const int64_t n_in = w[0]->n_in, nb = rows * (n_in / 256);
    q8split xq = q8split_at(q8, n_in, rows);
    if (nb > 0 && !prequantized) {
        k_quantize_q8split<<<grid_for(nb, 4), 128, 0, g_s>>>(x, xq, nb, mucu_matmul_f16_acts(w[0]));
        if (!launched("k_quantize_q8split", err)) return false;
    }
    const mmv_set set = mmv_set_of(w, n, y, 1);
    const int nr = (int)rows, kb = (int)(n_in / 256);
    const int mmt = mucu_mmt_min_rows_get();
    if (!fp4 && mmt > 0 && nr >= mmt) { /* cuda_mmt.cu */
        mucu_mmt(w, n, y, xq.qs, xq.d, xq.bs, nr, g_s);
        return launched("k_mmt_set", err);
    }
    bool taken;
    if (!launch_mmv4(w, n, y, xq, nr, &taken, err)) return false;
    if (taken) return true;
    int wpr = 0, u = 1;
    if (mmv_variant == 7) mmv3_shape(kb, nr, 0, true, &wpr, &u);
    else if (v3like(mmv_variant)) wpr = mmv3_pick(kb, nr, 0, true, &u);
    if (wpr) {
        const int R = nr <= 1 ? 1 : nr <= 2 ? 2 : nr <= 4 ? 4 : nr <= 8 ? 8 : 16;
        const size_t sm = (size_t)(4 / wpr) * R * kb * 4;
        const unsigned g3 = grid_for(set.first[n], 4 / wpr);
        if (sm <= 48 * 1024) {
#define S3(RR, UU, WW) k_mmv3_set<RR, UU, WW><<<g3, 128, sm, g_s>>>(set, kb, xq, nr)
#define S3W(RR, UU)                                                                                                 \
    do {                                                                                                            \
        if (wpr == 4) S3(RR, UU, 4);                                                                                \
        else if (wpr == 2) S3(RR, UU, 2);                                                                           \
        else S3(RR, UU, 1);                                                                                         \
    } while (0)
            if (R == 1) { if (u == 2) S3W(1, 2); else S3W(1, 1); }
            else if (R == 2) { if (u == 2) S3W(2, 2); else S3W(2, 1); }
            else if (R == 4) S3W(4, 1);
            else if (R == 8) S3W(8, 1);
            else S3W(16, 1);
#undef S3W
#undef S3
            return launched("k_mmv3_set", err);
        }
    }
    const unsigned grid = grid_for(set.first[n], 4);
    if (nr <= 1) k_mmv2_set<1, 2><<<grid, 128, 0, g_s>>>(set, kb, xq, nr);
    else if (nr <= 2) k_mmv2_set<2, 2><<<grid, 128, 0, g_s>>>(set, kb, xq, nr);
    else if (nr <= 4) k_mmv2_set<4, 1><<<grid, 128, 0, g_s>>>(set, kb, xq, nr);
    else if (nr <= 8) k_mmv2_set<8, 1><<<grid, 128, 0, g_s>>>(set, kb, xq, nr);
    else k_mmv2_set<16, 1><<<grid, 128, 0, g_s>>>(set, kb, xq, nr);
    return launched("k_mmv2_set", err);
}

/* NVFP4 (split layout) for many rows: int8 tensor cores, m16n8k16 per
 * 16-value group (its own E4M3 scale). A CTA of 4 warps takes 64 outputs
 * (warp w: outputs 16w .. 16w + 15) x RT = 8 NT rows; per 256-block the
 * rows' Q8_K codes and d go through a 2-stage cp.async ring in shared
 * memory (rows 68 words apart: a warp's B-fragment loads hit 32 banks),
 * while each lane loads the weights' A fragments itself, the next block's
 * during this one's mma: lane (g, t) reads word t of the 8 code pieces and
 * the 16-byte header of outputs g and g + 8 (word t of a piece holds
 * values 4t .. 4t + 3 of its two groups, the mma's k = 4t .. 4t + 3 for
 * A and B alike). Each group's mma result (an exact int32 over 16 values)
 * times the group's e4m3fn_q9 is added in int64 (|dot| <= 16 * 12 * 127,
 * q9 <= 15 << 14), exact in any order, as dot_nvfp4_* sum; then f_b by
 * their formula and each (row, output) total adds f_b in block order. */
struct fp4_wfr {
    uint4 h;       /* the block's header: 16 E4M3 scales */
    uint32_t w[8]; /* word t of each code piece */
};

/* Lane t's share of output o's block b (weights are never written). */
__device__ static inline void fp4_wload(const uint8_t *W, int64_t o, int nb, int b, int t, fp4_wfr &f) {
    const uint8_t *blk = W + (o * nb + b) * 144;
    f.h = __ldg((const uint4 *)blk);
#pragma unroll
    for (int p = 0; p < 8; p++) f.w[p] = __ldg((const uint32_t *)(blk + 16 + 16 * p) + t);
}

/* The first block's weights of outputs oa and ob, then the wait. */
__device__ static inline void fp4_first(const uint8_t *W, int64_t oa, int64_t ob, int nb, int t, fp4_wfr &a, fp4_wfr &b) {
    fp4_wload(W, oa, nb, 0, t, a);
    fp4_wload(W, ob, nb, 0, t, b);
    grid_dep_wait();
}

template <int TYPE, int NT>
__global__ static void __launch_bounds__(128) k_gemm_fp4(const uint8_t *W, int64_t n_out, int nb, q8split xq,
                                                        int64_t rows, float *y, int has_scale, float scale) {
    constexpr int RT = 8 * NT, LD = 272;
    __shared__ int32_t q9[256];
    __shared__ __align__(16) int8_t xs[2][RT * LD];
    __shared__ float xd[2][RT];
    fp4_table(q9);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t r0 = (int64_t)blockIdx.x * RT, o0 = (int64_t)blockIdx.y * 64 + warp * 16;
    const int64_t oa = o0 + g < n_out ? o0 + g : n_out - 1, ob = o0 + g + 8 < n_out ? o0 + g + 8 : n_out - 1;
    const int64_t n_in = (int64_t)nb * 256;
    auto xload = [&](int b, int buf) { /* rows past the call's: zeros */
        for (int i = threadIdx.x; i < RT * 16; i += 128) {
            const int r = i >> 4, c = i & 15;
            const bool ok = r0 + r < rows;
            cp16(&xs[buf][r * LD + c * 16], xq.qs + (ok ? (r0 + r) * n_in + (int64_t)b * 256 + c * 16 : 0), ok);
        }
        for (int i = threadIdx.x; i < RT; i += 128) {
            const bool ok = r0 + i < rows;
            cp4(&xd[buf][i], xq.d + (ok ? (r0 + i) * nb + b : 0), ok ? 4 : 0);
        }
        cp_commit();
    };
    fp4_wfr A0, B0, A1, B1; /* outputs g and g + 8, two stages (named: no local-memory arrays) */
    fp4_first(W, oa, ob, nb, t, A0, B0);
    xload(0, 0);
    float tot[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[n][i] = 0.0f;
    /* block b from stage cur (fa, fb), the next block's weights into (na, nbw) */
    auto step = [&](int b, int cur, const fp4_wfr &fa, const fp4_wfr &fb, fp4_wfr &na, fp4_wfr &nbw) {
        if (b + 1 < nb) {
            xload(b + 1, cur ^ 1);
            fp4_wload(W, oa, nb, b + 1, t, na);
            fp4_wload(W, ob, nb, b + 1, t, nbw);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        long long acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[n][i] = 0;
#pragma unroll
        for (int p = 0; p < 8; p++) {
            /* piece p: groups G (low half-words) and G + 2 (high); their scales: header word p & 3, bytes
             * 0, 1 (p < 4) or 2, 3 (mucu_fp4_split) */
            uint32_t al, ah, bl, bh;
            e2m1x8_q1(fa.w[p], al, ah);
            e2m1x8_q1(fb.w[p], bl, bh);
            const uint32_t ha = (p & 3) == 0 ? fa.h.x : (p & 3) == 1 ? fa.h.y : (p & 3) == 2 ? fa.h.z : fa.h.w;
            const uint32_t hb = (p & 3) == 0 ? fb.h.x : (p & 3) == 1 ? fb.h.y : (p & 3) == 2 ? fb.h.z : fb.h.w;
            const int sh = p < 4 ? 0 : 16, G = 4 * (p >> 1) + (p & 1);
            const int32_t qal = q9[(ha >> sh) & 0xFF], qah = q9[(ha >> (sh + 8)) & 0xFF];
            const int32_t qbl = q9[(hb >> sh) & 0xFF], qbh = q9[(hb >> (sh + 8)) & 0xFF];
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const int8_t *xr = &xs[cur][(n * 8 + g) * LD + 16 * G + 4 * t];
                const uint32_t xl = *(const uint32_t *)xr, xh = *(const uint32_t *)(xr + 32);
                int32_t c[4];
                mma_k16(c, al, bl, xl);
                acc[n][0] += (long long)c[0] * qal, acc[n][1] += (long long)c[1] * qal;
                acc[n][2] += (long long)c[2] * qbl, acc[n][3] += (long long)c[3] * qbl;
                mma_k16(c, ah, bh, xh);
                acc[n][0] += (long long)c[0] * qah, acc[n][1] += (long long)c[1] * qah;
                acc[n][2] += (long long)c[2] * qbh, acc[n][3] += (long long)c[3] * qbh;
            }
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float f = ((float)acc[n][i] * 0x1p-10f) * xd[cur][n * 8 + 2 * t + (i & 1)];
                if (TYPE == T_NVFP4_NATIVE) f = f * scale;
                tot[n][i] = tot[n][i] + f;
            }
        __syncthreads(); /* this stage's buffers are read: the next round's copies may overwrite them */
    };
    for (int b = 0; b < nb; b += 2) {
        step(b, 0, A0, B0, A1, B1);
        if (b + 1 < nb) step(b + 1, 1, A1, B1, A0, B0);
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int64_t r = r0 + n * 8 + 2 * t + (i & 1), o = o0 + g + (i >= 2 ? 8 : 0);
            if (r < rows && o < n_out) y[r * n_out + o] = row_out(TYPE, tot[n][i], has_scale, scale);
        }
}

/* NVFP4 calls of 2-16 rows: k_gemm_fp4 where it measured faster than
 * k_mmv2 (test_cuda_backend --bench-mmv, H200): its
 * grid is n_out / 64 CTAs, so narrow weights stay on k_mmv2 (the k/v
 * products: 4 CTAs), and k_mmv2's cost grows with the rows (a dp4a per
 * row): ffn gate/up (19,968 outputs) at 4 rows 62.86 against 104.53 us,
 * attn_output (6,656) at 8 rows 28.92 against 37.24 but at 4 rows 28.85
 * against 21.61. MUSER_CUDA_FP4_GEMM=N: every call of N to 16 rows (0:
 * none); mucu_fp4_gemm_rows (tests) overrides both when >= 0. Calls of 17
 * rows or more always take it (unless MUSER_CUDA_GEMM=0). */
extern "C" int mucu_fp4_gemm_rows = -1;
static int fp4_gemm_v = -1;
static bool fp4_gemm_takes(int64_t rows, int64_t n_out) {
    const int n = mucu_fp4_gemm_rows >= 0 ? mucu_fp4_gemm_rows : env_setting(&fp4_gemm_v, "MUSER_CUDA_FP4_GEMM", -1);
    if (n >= 0) return n > 0 && rows >= n;
    return (rows >= 8 && n_out >= 2048) || (rows >= 4 && n_out >= 16384);
}

static bool gemm_fp4(const mucu_weight *w, q8split xq, int64_t rows, float *y, char *err) {
    const int nb = (int)(w->n_in / 256);
    const unsigned gy = (unsigned)((w->n_out + 63) / 64);
#define GF(T, NTT)                                                                                                   \
    k_gemm_fp4<T, NTT><<<dim3((unsigned)((rows + 8 * NTT - 1) / (8 * NTT)), gy), 128, 0, g_s>>>(                     \
        w->data, w->n_out, nb, xq, rows, y, w->has_scale, w->scale)
#define GF_R(T)                                                                                                     \
    do {                                                                                                            \
        if (rows > 32) GF(T, 8);                                                                                    \
        else if (rows > 16) GF(T, 4);                                                                               \
        else if (rows > 8) GF(T, 2);                                                                                \
        else GF(T, 1);                                                                                              \
    } while (0)
    if (w->type == T_NVFP4_NATIVE) GF_R(T_NVFP4_NATIVE);
    else GF_R(T_NVFP4);
#undef GF_R
#undef GF
    return launched("k_gemm_fp4", err);
}

extern "C" bool mucu_matmul_fast(const mucu_weight *w) {
    return w->type == T_Q4_K || w->type == T_Q5_K || (w->type == T_Q6_K && w->q6_split) ||
           (is_fp4((int)w->type) && w->fp4_split);
}

extern "C" bool mucu_matmul_f16_acts(const mucu_weight *w) { return w->type == T_NVFP4_NATIVE && w->fp4_split; }

extern "C" size_t mucu_matmul_split_bytes(const mucu_weight *w, int64_t rows) {
    const int gmin = gemm_min_rows();
    if (!mucu_matmul_fast(w) || is_fp4((int)w->type) || gmin <= 0 || rows < gmin || !mucu_gemm_kq2_takes(rows)) return 0;
    return mucu_gemm_split_bytes(w, rows); /* cuda_prefill.cu */
}

/* MUSER_CUDA_FP4=0: NVFP4, Q8_0 and Q4_0 weights on k_matmul_warp and float
 * weights on k_matmul_fwarp (the kernels before the split NVFP4 layout,
 * k_mmv_q0 and k_mmv_float). */
static int fp4_v = -1;
static bool fp4_fast(void) { return env_setting(&fp4_v, "MUSER_CUDA_FP4", 1) != 0; }
extern "C" void mucu_set_fp4(int v) { fp4_v = v; }
extern "C" bool mucu_fp4_on(void) { return fp4_fast(); }

extern "C" bool mucu_matmul(const mucu_weight *w, const float *x, float *y, int64_t rows, void *q8, int prequantized,
                            float *split, char *err) {
    if (rows <= 0 || w->n_out <= 0) return true;
    const bool native = w->type == T_NVFP4_NATIVE;
    const bool is_float = w->type == T_F32 || w->type == T_F16 || w->type == T_BF16;
    const bool uses_q8 = native ? !(w->input_scale_inv > 0.0f) : !is_float;
    const bool kq = mucu_matmul_fast(w), fp4s = kq && is_fp4((int)w->type);
    const int64_t nb = rows * (w->n_in / 256);
    if (kq) { /* the fast path: split Q8_K activations, weight-streaming kernel */
        q8split xq = q8split_at(q8, w->n_in, rows);
        if (nb > 0 && !prequantized) {
            k_quantize_q8split<<<grid_for(nb, 4), 128, 0, g_s>>>(x, xq, nb, mucu_matmul_f16_acts(w));
            if (!launched("k_quantize_q8split", err)) return false;
        }
        const int gmin = gemm_min_rows();
        const bool wide = mmt_wide((int)w->type, rows), many = gmin > 0 && rows >= gmin && !wide;
        if (many && fp4s) return gemm_fp4(w, xq, rows, y, err);
        if (many && mucu_gemm_kq2_takes(rows)) {
            mucu_gemm_kq2(w, xq.qs, xq.d, xq.bs, rows, y, split, g_s); /* cuda_prefill.cu */
            return launched("k_gemm_kq2", err);
        }
        if (many) {
            const dim3 grid((unsigned)((rows + GT_M - 1) / GT_M), (unsigned)((w->n_out + GT_N - 1) / GT_N));
            const int nbk = (int)(w->n_in / 256);
            if (w->type == T_Q4_K) k_gemm_kq<T_Q4_K><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nbk, xq, rows, y, w->has_scale, w->scale);
            else if (w->type == T_Q5_K) k_gemm_kq<T_Q5_K><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nbk, xq, rows, y, w->has_scale, w->scale);
            else k_gemm_kq<T_Q6_K><<<grid, 128, 0, g_s>>>(w->data, w->n_out, nbk, xq, rows, y, w->has_scale, w->scale);
            return launched("k_gemm_kq", err);
        }
        if (wide) return launch_mmv(w, xq, 0, (int)rows, y, err); /* k_mmt */
        for (int64_t r0 = 0; r0 < rows; r0 += 16)
            if (!launch_mmv(w, xq, r0, (int)(rows - r0 < 16 ? rows - r0 : 16), y, err)) return false;
        return true;
    }
    if (is_float && w->n_in % 32 == 0 && ((uintptr_t)w->data & 15) == 0 && ((uintptr_t)x & 15) == 0 &&
        (w->row_bytes & 15) == 0 && fp4_fast()) { /* k_mmv_float, 8 rows a launch */
        const unsigned grid = grid_for(w->n_out, 32);
        for (int64_t r0 = 0; r0 < rows; r0 += 8) {
            const int nr = (int)(rows - r0 < 8 ? rows - r0 : 8);
            const float *xr = x + r0 * w->n_in;
            float *yr = y + r0 * w->n_out;
#define MF(T, RR) k_mmv_float<T, RR><<<grid, 128, 0, g_s>>>(*w, xr, yr, nr)
#define MF_R(T)                                                                                                     \
    do {                                                                                                            \
        if (nr <= 1) MF(T, 1);                                                                                      \
        else if (nr <= 2) MF(T, 2);                                                                                 \
        else if (nr <= 4) MF(T, 4);                                                                                 \
        else MF(T, 8);                                                                                              \
    } while (0)
            if (w->type == T_F16) MF_R(T_F16);
            else if (w->type == T_BF16) MF_R(T_BF16);
            else MF_R(T_F32);
#undef MF_R
#undef MF
            if (!launched("k_mmv_float", err)) return false;
        }
        return true;
    }
    if (is_float) {
        k_matmul_fwarp<<<grid_for(rows * w->n_out, 4), 128, 0, g_s>>>(*w, x, y, rows);
        return launched("k_matmul_fwarp", err);
    }
    q8k_block *xq = uses_q8 ? (q8k_block *)q8 : NULL;
    if (uses_q8 && nb > 0) {
        k_quantize_q8k<<<grid_for(nb, 128), 128, 0, g_s>>>(x, xq, nb, native);
        if (!launched("k_quantize_q8k", err)) return false;
    }
    const bool q0 = w->type == T_Q8_0 || w->type == T_Q4_0;
    if (uses_q8 && q0 && fp4_fast() && w->n_in % 256 == 0) { /* k_mmv_q0: 16 rows a launch */
        const unsigned grid = grid_for(w->n_out, 32);
        for (int64_t r0 = 0; r0 < rows; r0 += 16) {
            const int nr = (int)(rows - r0 < 16 ? rows - r0 : 16);
            const q8k_block *xr = xq + r0 * (w->n_in / 256);
            float *yr = y + r0 * w->n_out;
#define Q0(T, RR) k_mmv_q0<T, RR><<<grid, 128, 0, g_s>>>(*w, xr, yr, nr)
            if (w->type == T_Q8_0) ROW_BUCKET(nr, Q0, T_Q8_0);
            else ROW_BUCKET(nr, Q0, T_Q4_0);
#undef Q0
            if (!launched("k_mmv_q0", err)) return false;
        }
        return true;
    }
    if (uses_q8 && w->type != T_Q6_K) {
        k_matmul_warp<<<grid_for(rows * w->n_out, 4), 128, 0, g_s>>>(*w, xq, y, rows);
        return launched("k_matmul_warp", err);
    }
    LAUNCH(k_matmul, rows * w->n_out, *w, x, xq, y, rows); /* W4A4, GGUF-layout Q6_K */
}

/* The row kernels keep a row in shared memory: n * 4 bytes plus their few
 * static bytes within the default 48 KiB. From 512 values (glimmer-tiny's
 * rows: the fused residual and norm+quantization save launches there);
 * shorter rows (per-head norms) stay a warp per row. No more threads than
 * the row has values, rounded up to a warp. */
static bool cta_row_ok(int64_t n) { return n >= 512 && n <= 12032; }
static unsigned cta_cap(unsigned t, int64_t n) { return n < (int64_t)t ? (unsigned)((n + 31) / 32 * 32) : t; }
static unsigned cta_threads(int64_t rows, int64_t n) { return cta_cap(rows <= 8 ? 1024 : 256, n); }

extern "C" bool mucu_rmsnorm(const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows, void *q8,
                             char *err) {
    if (rows <= 0) return true;
    if (cta_row_ok(n)) {
        const size_t sm = cta_row_bytes(n);
        if (q8 && n % 256 == 0) {
            k_rmsnorm_cta<true><<<(unsigned)rows, cta_threads(rows, n), sm, g_s>>>(x, w, eps, y, n, rows, q8split_at(q8, n, rows));
            return launched("k_rmsnorm_cta+q8", err);
        }
        k_rmsnorm_cta<false><<<(unsigned)rows, cta_threads(rows, n), sm, g_s>>>(x, w, eps, y, n, rows, q8split{});
        return launched("k_rmsnorm_cta", err);
    }
    k_rmsnorm_warp<<<grid_for(rows, 4), 128, 0, g_s>>>(x, w, eps, y, n, rows);
    return launched("k_rmsnorm_warp", err);
}

extern "C" bool mucu_residual_ok(int64_t n) { return cta_row_ok(n); }

extern "C" bool mucu_embed_norm(const mucu_weight *w, const int32_t *tokens, const int32_t *regs, int64_t rows,
                                float eps, float *x, const float *w_h, float *h, void *q8, char *err) {
    if (rows <= 0) return true;
    const int64_t n = w->n_in;
    if (!cta_row_ok(n)) {
        snprintf(err, MUCU_ERR_LEN, "k_embed_norm: rows of %lld values (mucu_residual_ok)", (long long)n);
        return false;
    }
    const size_t sm = cta_row_bytes(n);
    if (q8 && n % 256 == 0) {
        k_embed_norm<true><<<(unsigned)rows, cta_threads(rows, n), sm, g_s>>>(*w, tokens, regs, eps, x, w_h, h, n,
                                                                            q8split_at(q8, n, rows));
        return launched("k_embed_norm+q8", err);
    }
    k_embed_norm<false><<<(unsigned)rows, cta_threads(rows, n), sm, g_s>>>(*w, tokens, regs, eps, x, w_h, h, n,
                                                                         q8split{});
    return launched("k_embed_norm", err);
}

extern "C" int mucu_res_warps = -1;
extern "C" int mucu_res_t = -1;
extern "C" int mucu_res_w = -1;

extern "C" bool mucu_residual(float *x, const float *o, const float *w_o, float eps_o, float *h, const float *w_h,
                              float eps_h, int64_t n, int64_t rows, void *q8, float *cap, int64_t cap_stride,
                              char *err) {
    if (rows <= 0) return true;
    const size_t sm = cta_row_bytes(n);
    /* a warp per 256-value block, at most 32 warps (mucu_res_warps: at most 8 or 16, for
     * measurements): RB blocks a warp */
    const int wcap = env_setting(&mucu_res_warps, "MUSER_CUDA_RES_WARPS", 32);
    const int64_t wmax = wcap == 8 ? 8 : wcap == 16 ? 16 : 32;
    const int64_t nb = (n + 255) / 256, w0 = nb < wmax ? nb : wmax, warps = nb > 4 * w0 ? (nb + 3) / 4 : w0;
    const int64_t rb = (nb + warps - 1) / warps;
    const unsigned t = (unsigned)(32 * warps);
    const bool quant = h && q8 && n % 256 == 0;
    const q8split o8 = quant ? q8split_at(q8, n, rows) : q8split{};
    /* the transposed row (cta_inv_rms_t): 2 (default) from 16 blocks, 1 any row of at most 26 warps, 0 never */
    const int trs = env_setting(&mucu_res_t, "MUSER_CUDA_RES_T", 2);
    const bool tr = trs == 1 || (trs == 2 && nb >= 16);
#define RES(RBV, TRV)                                                                                                \
    (quant ? k_residual<true, RBV, TRV><<<(unsigned)rows, t, sm, g_s>>>(x, o, w_o, eps_o, h, w_h, eps_h, n, o8, cap, \
                                                                        cap_stride)                                  \
           : k_residual<false, RBV, TRV><<<(unsigned)rows, t, sm, g_s>>>(x, o, w_o, eps_o, h, w_h, eps_h, n, o8,     \
                                                                         cap, cap_stride))
    /* k_residual_w (MUSER_CUDA_RES_W=0: never): whole blocks, a warp each (warps == nb, so at most 32
     * blocks: its int offsets hold), 16-byte aligned rows */
    const int wm = env_setting(&mucu_res_w, "MUSER_CUDA_RES_W", 1);
    const bool a16 = (((uintptr_t)x | (uintptr_t)o | (uintptr_t)w_o | (uintptr_t)h | (uintptr_t)w_h |
                       (uintptr_t)cap) & 15) == 0 && cap_stride % 4 == 0;
    if (wm && n % 256 == 0 && warps == nb && a16) {
        const bool trw = tr && warps <= RES_T_WARPS;
#define RESW(Q, TRV) k_residual_w<Q, TRV><<<(unsigned)rows, t, sm, g_s>>>(x, o, w_o, eps_o, h, w_h, eps_h, (int)n, o8, \
                                                                          cap, cap_stride)
        if (trw) quant ? RESW(true, true) : RESW(false, true);
        else quant ? RESW(true, false) : RESW(false, false);
#undef RESW
        return launched(quant ? "k_residual_w+q8" : "k_residual_w", err);
    }
    if (rb <= 1 && tr && warps <= RES_T_WARPS) RES(1, true);
    else if (rb <= 1) RES(1, false);
    else if (rb <= 2) RES(2, false);
    else RES(4, false);
#undef RES
    return launched(quant ? "k_residual+q8" : "k_residual", err);
}

extern "C" bool mucu_qk_norm_rope_ok(int64_t head_dim, int64_t n_rot, bool neox) {
    return (head_dim == 64 || head_dim == 128 || head_dim == 256) && (!neox || n_rot == head_dim);
}

/* k_qk_norm_rope with the heads' width as its template argument; storing
 * (dst or hd.kd), a warp per V head too. */
static bool qkn_launch(float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk, int64_t head_dim,
                       float eps, const float *cs, int64_t n_rot, int64_t rows, const mucu_kv_dst *dst,
                       const float *v, bool neox, mucu_heads_dst hd, const char *name, char *err) {
    const int64_t warps = rows * (nq + nk + (dst || hd.kd ? nk : 0));
    if (warps <= 0) return true;
    const unsigned grid = grid_for(warps, 4);
#define QKN(KK) k_qk_norm_rope<KK><<<grid, 128, 0, g_s>>>(q, wq, nq, k, wk, nk, eps, cs, n_rot, rows, dst, v, neox, hd)
    if (head_dim == 64) QKN(2);
    else if (head_dim == 128) QKN(4);
    else QKN(8);
#undef QKN
    return launched(name, err);
}

extern "C" bool mucu_qk_norm_rope(float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk,
                                  int64_t head_dim, float eps, const float *cs, int64_t n_rot, int64_t rows,
                                  const mucu_kv_dst *dst, const float *v, bool neox, char *err) {
    return qkn_launch(q, wq, nq, k, wk, nk, head_dim, eps, cs, n_rot, rows, dst, v, neox, mucu_heads_dst{},
                      "k_qk_norm_rope", err);
}

extern "C" bool mucu_qk_norm_rope_heads(float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk,
                                        int64_t head_dim, float eps, const float *cs, int64_t n_rot, int64_t rows,
                                        mucu_heads_dst hd, const float *v, bool neox, char *err) {
    return qkn_launch(q, wq, nq, k, wk, nk, head_dim, eps, cs, n_rot, rows, nullptr, v, neox, hd,
                      "k_qk_norm_rope+heads", err);
}

extern "C" bool mucu_rope_table(const double *inv_freq, int64_t n_pairs, const int64_t *pos, int64_t rows,
                                const int32_t *depth, float *cs, char *err) {
    LAUNCH(k_rope_table, rows * n_pairs, inv_freq, n_pairs, pos, rows, depth, cs);
}

extern "C" bool mucu_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs, int64_t rows,
                          bool neox, char *err) {
    LAUNCH(k_rope, rows * n_heads * (n_rot / 2), x, n_heads, head_dim, n_rot, cs, rows, neox);
}

extern "C" bool mucu_kv_store(const mucu_kv_dst *dst, int64_t rows, int64_t n_head, int64_t head_dim, const float *k,
                              const float *v, char *err) {
    LAUNCH(k_kv_store, rows * n_head * head_dim, dst, n_head, head_dim, k, v, rows);
}

extern "C" size_t mucu_attn_part_bytes(int64_t rows, int64_t n_head, int64_t head_dim, int64_t nbmax) {
    return (size_t)(rows * n_head * nbmax) * (size_t)(head_dim + 2) * sizeof(float);
}

extern "C" bool mucu_attention(const mucu_attn_row *desc, int64_t rows, int64_t n_head, int64_t n_head_kv,
                               int64_t head_dim, float scale, const float *q, float *out, float *part, int64_t nbmax,
                               const float *gate, void *q8, bool tree, char *err) {
    if (head_dim > MUCU_MAX_HEAD_DIM) {
        snprintf(err, MUCU_ERR_LEN, "k_attn_blocks: head_dim %lld exceeds %d", (long long)head_dim, MUCU_MAX_HEAD_DIM);
        return false;
    }
    if (rows <= 0 || n_head <= 0) return true;
    const int64_t D = head_dim, rh = rows * n_head;
    /* the gate (and q8's quantization) where no kernel below took it */
#define GATE_AFTER() (gate ? mucu_sigmoid_gate(out, gate, rh * D, q8, err) : true)
    if (nbmax > 0 && mucu_attn_bench_pass != 2) {
        const unsigned g1 = (unsigned)(rh * nbmax);
        float *fin = nbmax == 1 ? out : NULL;
        bool gated = false;
        if (!tree && mucu_attn_prefill_takes(rows, n_head, n_head_kv, D)) { /* cuda_prefill.cu */
            mucu_attn_prefill(desc, rows, n_head, n_head_kv, D, scale, q, part, nbmax, fin, g_s);
            if (!launched("k_attn_prefill", err)) return false;
        } else if (mucu_attn_dec_takes(rows, n_head, n_head_kv, D)) { /* cuda_attn.cu */
            gated = mucu_attn_dec(desc, rows, n_head, n_head_kv, D, scale, q, part, nbmax, fin, gate, q8, g_s);
            if (!launched("k_attn_dec", err)) return false;
        } else {
            if (D <= 128) k_attn_blocks<1><<<g1, 128, 0, g_s>>>(desc, rows, n_head, n_head_kv, D, scale, q, part, nbmax, fin);
            else if (D <= 256) k_attn_blocks<2><<<g1, 128, 0, g_s>>>(desc, rows, n_head, n_head_kv, D, scale, q, part, nbmax, fin);
            else k_attn_blocks<4><<<g1, 128, 0, g_s>>>(desc, rows, n_head, n_head_kv, D, scale, q, part, nbmax, fin);
            if (!launched("k_attn_blocks", err)) return false;
        }
        if (fin) return gated || GATE_AFTER();
    }
    if (mucu_attn_bench_pass == 1) return true;
    if (mucu_attn_merge_scan_takes(D, nbmax)) {
        const bool gated = mucu_attn_merge_scan(desc, rows, n_head, D, part, nbmax, out, gate, q8, g_s);
        return launched("k_attn_merge_scan", err) && (gated || GATE_AFTER());
    }
    const unsigned g2 = grid_for(rh, 4);
    if (D <= 32) k_attn_merge<1><<<g2, 128, 0, g_s>>>(desc, rows, n_head, D, part, nbmax, out);
    else if (D <= 64) k_attn_merge<2><<<g2, 128, 0, g_s>>>(desc, rows, n_head, D, part, nbmax, out);
    else if (D <= 128) k_attn_merge<4><<<g2, 128, 0, g_s>>>(desc, rows, n_head, D, part, nbmax, out);
    else if (D <= 256) k_attn_merge<8><<<g2, 128, 0, g_s>>>(desc, rows, n_head, D, part, nbmax, out);
    else k_attn_merge<16><<<g2, 128, 0, g_s>>>(desc, rows, n_head, D, part, nbmax, out);
    return launched("k_attn_merge", err) && GATE_AFTER();
#undef GATE_AFTER
}

/* With q8 (n a multiple of 256): also the Q8_K quantization of the result. */
extern "C" bool mucu_sigmoid_gate(float *x, const float *g, int64_t n, void *q8, char *err) {
    if (q8 && n > 0 && n % 256 == 0) {
        k_gate_q8<false><<<grid_for(n / 256, 4), 128, 0, g_s>>>(x, g, q8split_at(q8, n, 1), n / 256);
        return launched("k_gate_q8", err);
    }
    LAUNCH(k_sigmoid_gate, n, x, g, n);
}
extern "C" bool mucu_swiglu(float *gate, const float *up, int64_t n, void *q8, char *err) {
    if (q8 && n > 0 && n % 256 == 0) {
        k_gate_q8<true><<<grid_for(n / 256, 4), 128, 0, g_s>>>(gate, up, q8split_at(q8, n, 1), n / 256);
        return launched("k_swiglu_q8", err);
    }
    LAUNCH(k_swiglu, n, gate, up, n);
}
extern "C" bool mucu_add(float *x, const float *y, int64_t n, char *err) { LAUNCH(k_add, n, x, y, n); }
extern "C" bool mucu_logit_tail(float *l, float scale, float cap, int64_t n, char *err) {
    LAUNCH(k_logit_tail, n, l, scale, cap, n);
}
extern "C" bool mucu_softmax(float *x, float scale, int64_t n, const int64_t *n_valid, int64_t rows, char *err) {
    if (rows <= 0) return true;
    k_softmax<<<(unsigned)rows, 128, 0, g_s>>>(x, scale, n, n_valid);
    return launched("k_softmax", err);
}
extern "C" bool mucu_argmax(const float *x, int64_t n, int64_t rows, int32_t *out, char *err) {
    if (rows <= 0) return true;
    k_argmax<<<(unsigned)rows, 256, 0, g_s>>>(x, n, out);
    return launched("k_argmax", err);
}
extern "C" bool mucu_chain_pick(const float *x, int64_t n, int32_t *reg, int32_t *const *slot, char *err) {
    if (n <= 0) {
        snprintf(err, MUCU_ERR_LEN, "k_chain_pick: an empty row");
        return false;
    }
    const int64_t ctas = (n + CHAIN_SPAN - 1) / CHAIN_SPAN;
    if (ctas > CHAIN_MAX_CTAS) {
        snprintf(err, MUCU_ERR_LEN, "k_chain_pick: a row of %lld values (at most %d)", (long long)n,
                 CHAIN_SPAN * CHAIN_MAX_CTAS);
        return false;
    }
    k_chain_pick<<<(unsigned)ctas, 1024, 0, g_s>>>(x, n, reg, slot);
    return launched("k_chain_pick", err);
}
extern "C" bool mucu_pick_rows(const float *x, int64_t n, int64_t rows, int32_t n_regs, const int32_t *regs,
                               int32_t *const *slot, char *err) {
    if (n <= 0 || rows <= 0 || rows > 65535) {
        snprintf(err, MUCU_ERR_LEN, "k_pick_rows: %lld rows of %lld values", (long long)rows, (long long)n);
        return false;
    }
    k_pick_rows<<<(unsigned)rows, 1024, 0, g_s>>>(x, n, n_regs, regs, slot);
    return launched("k_pick_rows", err);
}
extern "C" size_t mucu_tree_work_bytes(void) { return sizeof(tree_work); }
extern "C" bool mucu_tree_reg(const float *x, int64_t n, int64_t rows, const int32_t *eog, int n_eog, void *work,
                              mucu_tree_regs *regs, int32_t *tokregs, int32_t *const *slot, char *err) {
    if (rows < 0 || rows > 15 || n <= 0 || n > INT32_MAX || n_eog < 0) {
        snprintf(err, MUCU_ERR_LEN, "k_tree_rows: %lld rows of %lld values (at most 15 rows)", (long long)rows,
                 (long long)n);
        return false;
    }
    if (rows > 0) {
        k_tree_rows<<<(unsigned)rows, TREE_NT, 0, g_s>>>(x, n, (tree_work *)work);
        if (!launched("k_tree_rows", err)) return false;
    }
    k_tree_build<<<1, 32, 0, g_s>>>((const tree_work *)work, (int32_t)rows, eog, n_eog, regs, tokregs, slot);
    return launched("k_tree_build", err);
}
extern "C" bool mucu_copy2d_many(const mucu_copy2d *c, int n, int64_t max_rows, char *err) {
    if (n <= 0 || max_rows <= 0) return true;
    if (n > 65535 || max_rows > 0x7fffffff) {
        snprintf(err, MUCU_ERR_LEN, "k_copy2d_many: %d copies of up to %lld rows", n, (long long)max_rows);
        return false;
    }
    k_copy2d_many<<<dim3((unsigned)max_rows, (unsigned)n), 256, 0, g_s>>>(c);
    return launched("k_copy2d_many", err);
}
extern "C" bool mucu_tokens_regs(int32_t *t, int64_t rows, const int32_t *regs, char *err) {
    LAUNCH(k_tokens_regs, rows, t, rows, regs);
}
extern "C" size_t mucu_chain_bytes(void) { return 16 + CHAIN_MAX_CTAS * sizeof(chain_sum); }
extern "C" int mucu_stream_state(char *err) {
    const cudaError_t e = cudaStreamQuery(g_s);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error: nothing may report it later */
        return 0;
    }
    cu_ok(e, "cudaStreamQuery", "the backend's stream", err);
    return -1;
}
extern "C" bool mucu_first_nonfinite(const float *x, int64_t n, unsigned long long *best, char *err) {
    if (n <= 0) return true;
    if (!cu_ok(cudaMemsetAsync(best, 0, sizeof *best, g_s), "cudaMemsetAsync", "first_nonfinite", err)) return false;
    const int64_t want = (n / 4 + 255) / 256;
    k_first_nonfinite<<<(unsigned)(want < 1 ? 1 : want > 1056 ? 1056 : want), 256, 0, g_s>>>(x, n, best);
    return launched("k_first_nonfinite", err);
}
extern "C" bool mucu_is_pinned(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* a plain host pointer on an old runtime: not an error worth keeping */
        return false;
    }
    return a.type == cudaMemoryTypeHost;
}
extern "C" {
int mucu_dense_attn_mode = -1;
}

/* Threads of a k_dense_attn2 CTA: 1,024 for 4 heads of up to 64 dims (the
 * work of four one-head CTAs at once), else 512. */
#define DA2_NT(DC, HPC) ((HPC) == 4 && (DC) <= 2 ? 1024 : 512)
template <int DC, int HPC>
static bool launch_dense2(const float *q, int64_t rows, int64_t n_head, int64_t n_head_kv, const float *k,
                          const float *v, int64_t slots, int64_t n_keys, const int64_t *n_valid, float scale, float *out,
                          void *q8, size_t sm, char *err) {
    constexpr int NT = DA2_NT(DC, HPC);
    static size_t attr = 0; /* the dynamic shared memory opted into so far */
    if (sm > attr) {
        if (!cu_ok(cudaFuncSetAttribute(k_dense_attn2<DC, HPC, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)sm),
                   "cudaFuncSetAttribute", "k_dense_attn2", err))
            return false;
        attr = sm;
    }
    const q8split o = q8 && (HPC * DC * 32) % 256 == 0 ? q8split_at(q8, rows * n_head * DC * 32, 1)
                                                        : q8split{NULL, NULL, NULL};
    k_dense_attn2<DC, HPC, NT><<<(unsigned)(rows * n_head / HPC), NT, sm, g_s>>>(q, n_head, n_head_kv, k, v, slots,
                                                                                 n_keys, n_valid, scale, out, o);
    return launched("k_dense_attn2", err);
}

/* k_dense_attn2's shared memory: V's rows, the scores and the output. */
static size_t da2_smem(int64_t D, int64_t n_keys, int hpc) {
    return ((size_t)D * (size_t)((n_keys + 3) & ~3) + (size_t)hpc * (size_t)(n_keys + D)) * sizeof(float);
}

/* Heads a k_dense_attn2 CTA takes for this call, 0 for k_dense_attn
 * (mucu_dense_attention's choice, for the launch and for the caller's q8):
 * the most, up to the setting, that divide a KV group. */
static int dense2_heads(int64_t n_head, int64_t n_head_kv, int64_t D, const float *v, int64_t slots, int64_t n_keys) {
    int hpc = env_setting(&mucu_dense_attn_mode, "MUSER_CUDA_DA", 4);
    if (!(hpc == 1 || hpc == 2 || hpc == 4) || n_head_kv <= 0 || n_head % n_head_kv || D % 32 || D > 128 ||
        slots % 4 || ((uintptr_t)v & 15) || n_keys > slots)
        return 0;
    while ((n_head / n_head_kv) % hpc) hpc /= 2;
    return da2_smem(D, n_keys, hpc) <= 200 * 1024 ? hpc : 0;
}

extern "C" bool mucu_dense_attention_quantizes(int64_t n_head, int64_t n_head_kv, int64_t D, const float *v,
                                               int64_t slots, int64_t n_keys) {
    const int hpc = dense2_heads(n_head, n_head_kv, D, v, slots, n_keys);
    return hpc > 0 && (hpc * D) % 256 == 0;
}

/* MUSER_CUDA_DA (mucu_dense_attn_mode): 0 k_dense_attn; 1, 2, 4 k_dense_attn2
 * with up to that many heads a CTA (default 4; fewer where they do not
 * divide a KV group), where it applies: head_dim a multiple of 32 up to
 * 128, slots a multiple of 4 (16-byte V rows), V, the scores and the
 * output within 200 KB of shared memory; else k_dense_attn. q8 (where
 * mucu_dense_attention_quantizes): the output's Q8_K blocks too. On an
 * H100 the shipped assistant (16 rows, 8 heads over 2, D 64) speculated at
 * 2.06x-2.07x plain greedy with 4 heads a CTA and the fused quantization,
 * 2.01x-2.02x with 1, 1.96x on k_dense_attn (docs/benchmarks.md "Switches
 * and what they are worth"). */
extern "C" bool mucu_dense_attention(const float *q, int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t D,
                                     const float *k, const float *v, int64_t slots, int64_t n_keys,
                                     const int64_t *n_valid, float scale, float *out, void *q8, char *err) {
    if (rows <= 0 || n_head <= 0) return true;
    if (n_head_kv <= 0 || n_head % n_head_kv || n_keys > slots) {
        snprintf(err, MUCU_ERR_LEN, "k_dense_attn: %lld keys of %lld slots, %lld/%lld heads: unsupported",
                 (long long)n_keys, (long long)slots, (long long)n_head, (long long)n_head_kv);
        return false;
    }
    const int hpc = dense2_heads(n_head, n_head_kv, D, v, slots, n_keys);
    if (hpc) {
        const size_t sm = da2_smem(D, n_keys, hpc);
#define DA2_ARGS q, rows, n_head, n_head_kv, k, v, slots, n_keys, n_valid, scale, out, q8, sm, err
#define DA2_HPC(DC)                                                                                                    \
    return hpc == 1 ? launch_dense2<DC, 1>(DA2_ARGS) : hpc == 2 ? launch_dense2<DC, 2>(DA2_ARGS)                      \
                                                                : launch_dense2<DC, 4>(DA2_ARGS)
        switch (D / 32) {
        case 1: DA2_HPC(1);
        case 2: DA2_HPC(2);
        case 3: DA2_HPC(3);
        default: DA2_HPC(4);
        }
#undef DA2_HPC
#undef DA2_ARGS
    }
    const size_t sm = (size_t)(D + n_keys) * sizeof(float);
    if (sm > 48 * 1024) {
        snprintf(err, MUCU_ERR_LEN, "k_dense_attn: %lld keys of %lld dims, %lld/%lld heads: unsupported",
                 (long long)n_keys, (long long)D, (long long)n_head, (long long)n_head_kv);
        return false;
    }
    /* shared memory for n_keys >= n_valid scores */
    k_dense_attn<<<(unsigned)(rows * n_head), DA_THREADS, sm, g_s>>>(q, n_head, n_head_kv, D, k, v, slots, n_valid, scale, out);
    return launched("k_dense_attn", err);
}

extern "C" bool mucu_store_kv_heads_layers(float *kd, float *vd, int64_t plane_stride, const int64_t *slots, int64_t S,
                                           int64_t D, int64_t n_head, const float *k, const float *v,
                                           int64_t src_stride, int64_t rows, int64_t n_layers, char *err) {
    LAUNCH(k_store_kv_heads, 2 * rows * n_head * D * n_layers, kd, vd, slots, S, D, n_head, k, v, rows, plane_stride,
           src_stride, n_layers);
}

/* ---------------------------------------------------------------- timing */

static cudaEvent_t timer_ev[2];

extern "C" bool mucu_timer_begin(char *err) {
    if (!timer_ev[0] && (!cu_ok(cudaEventCreate(&timer_ev[0]), "cudaEventCreate", "timer", err) ||
                         !cu_ok(cudaEventCreate(&timer_ev[1]), "cudaEventCreate", "timer", err)))
        return false;
    return cu_ok(cudaEventRecord(timer_ev[0], g_s), "cudaEventRecord", "timer", err);
}

extern "C" bool mucu_timer_end(double *ms, char *err) {
    float f = 0;
    if (!cu_ok(cudaEventRecord(timer_ev[1], g_s), "cudaEventRecord", "timer", err) ||
        !cu_ok(cudaEventSynchronize(timer_ev[1]), "cudaEventSynchronize", "timer", err) ||
        !cu_ok(cudaEventElapsedTime(&f, timer_ev[0], timer_ev[1]), "cudaEventElapsedTime", "timer", err))
        return false;
    *ms = f;
    return true;
}
