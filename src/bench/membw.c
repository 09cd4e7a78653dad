/* Memory read bandwidth: every thread streams its slice of a buffer far
 * larger than the caches with wide loads (AVX-512, AVX2 or 64-bit scalar,
 * by CPUID; on AVX-512 also with a software prefetch); the best of `reps`
 * passes of each loop, timed from a common start barrier to a common end
 * barrier. This is the physical limit decode is compared to. */
#include "bench/bench.h"
#include "backend/cpu/cpu_backend.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef uint64_t (*read_fn)(const uint8_t *p, size_t n);

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(p + i + 32)));
        c = _mm256_xor_si256(c, _mm256_load_si256((const __m256i *)(p + i + 64)));
        d = _mm256_xor_si256(d, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    return (uint64_t)_mm256_extract_epi64(a, 0) ^ (uint64_t)_mm256_extract_epi64(a, 3);
}

/* prefetch: also prefetch every line 8 KiB ahead, as the X16 decode kernel
 * does; on the Intel device host that kernel streamed faster than the plain
 * loop, so the plain loop alone was no ceiling. */
__attribute__((target("avx512f"), always_inline)) static inline uint64_t read_avx512_loop(const uint8_t *p, size_t n,
                                                                                          bool prefetch) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        if (prefetch)
            for (size_t l = 0; l < 256; l += 64) _mm_prefetch((const char *)p + i + 8192 + l, _MM_HINT_T0);
        a = _mm512_xor_si512(a, _mm512_load_si512(p + i));
        b = _mm512_xor_si512(b, _mm512_load_si512(p + i + 64));
        c = _mm512_xor_si512(c, _mm512_load_si512(p + i + 128));
        d = _mm512_xor_si512(d, _mm512_load_si512(p + i + 192));
    }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    return (uint64_t)_mm512_reduce_add_epi64(a);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *p, size_t n) {
    return read_avx512_loop(p, n, false);
}

__attribute__((target("avx512f"))) static uint64_t read_avx512_prefetch(const uint8_t *p, size_t n) {
    return read_avx512_loop(p, n, true);
}
#endif

/* The read loops for this CPU; the figure is the best pass of any of them. */
static int pick_readers(read_fn *out) {
#if defined(__x86_64__)
    mu_cpu_isa isa = mu_cpu_isa_best();
    if (isa == MU_CPU_ISA_AVX512) {
        out[0] = read_avx512;
        out[1] = read_avx512_prefetch;
        return 2;
    }
    if (isa == MU_CPU_ISA_AVX2) {
        out[0] = read_avx2;
        return 1;
    }
#endif
    out[0] = read_scalar;
    return 1;
}

typedef struct membw_job {
    const uint8_t *buf;
    size_t slice;
    int n_threads, reps;
    read_fn fn;
    pthread_barrier_t start, end;
    _Atomic uint64_t sink;
} membw_job;

typedef struct membw_thread {
    membw_job *job;
    int index;
} membw_thread;

static void read_slice(membw_job *j, int index) {
    uint64_t v = j->fn(j->buf + (size_t)index * j->slice, j->slice);
    atomic_fetch_xor(&j->sink, v);
}

static void *membw_worker(void *arg) {
    membw_thread *t = arg;
    for (int r = 0; r < t->job->reps; r++) {
        pthread_barrier_wait(&t->job->start);
        read_slice(t->job, t->index);
        pthread_barrier_wait(&t->job->end);
    }
    return NULL;
}

struct mu_membw {
    int n_threads;
    size_t slice;
    uint8_t *buf;
};

mu_membw *mu_membw_open(int n_threads, size_t bytes) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    size_t slice = bytes / (size_t)n_threads / 4096 * 4096;
    if (slice == 0) return NULL;
    void *buf = NULL;
    if (posix_memalign(&buf, 2 << 20, slice * (size_t)n_threads) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(buf, slice * (size_t)n_threads, MADV_HUGEPAGE);
#endif
    memset(buf, 0x5A, slice * (size_t)n_threads); /* fault every page in before timing */
    mu_membw *m = mu_xcalloc(1, sizeof *m);
    *m = (mu_membw){.n_threads = n_threads, .slice = slice, .buf = buf};
    return m;
}

void mu_membw_close(mu_membw *m) {
    if (!m) return;
    free(m->buf);
    free(m);
}

double mu_membw_measure(mu_membw *m, int reps) {
    if (reps < 1) reps = 1;
    const int n_threads = m->n_threads;
    const size_t slice = m->slice;
    read_fn readers[2];
    const int n_readers = pick_readers(readers);
    membw_job j = {.buf = m->buf, .slice = slice, .n_threads = n_threads, .reps = reps * n_readers, .fn = readers[0]};
    pthread_barrier_init(&j.start, NULL, (unsigned)n_threads);
    pthread_barrier_init(&j.end, NULL, (unsigned)n_threads);
    membw_thread *th = mu_xcalloc((size_t)n_threads, sizeof *th);
    pthread_t *tid = mu_xcalloc((size_t)n_threads, sizeof *tid);
    for (int i = 1; i < n_threads; i++) {
        th[i] = (membw_thread){.job = &j, .index = i};
        pthread_create(&tid[i], NULL, membw_worker, &th[i]);
    }
    double best = 0.0;
    for (int r = 0; r < j.reps; r++) {
        j.fn = readers[r % n_readers]; /* published to the workers by the barrier */
        pthread_barrier_wait(&j.start);
        double t0 = mu_now();
        read_slice(&j, 0);
        pthread_barrier_wait(&j.end);
        double dt = mu_now() - t0;
        double gbs = dt > 0 ? (double)(slice * (size_t)n_threads) / dt / 1e9 : 0.0;
        if (gbs > best) best = gbs;
    }
    for (int i = 1; i < n_threads; i++) pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&j.start);
    pthread_barrier_destroy(&j.end);
    free(th);
    free(tid);
    return best;
}

double mu_bench_membw(int n_threads, size_t bytes, int reps) {
    mu_membw *m = mu_membw_open(n_threads, bytes);
    double gbs = m ? mu_membw_measure(m, reps) : 0.0;
    mu_membw_close(m);
    return gbs;
}
