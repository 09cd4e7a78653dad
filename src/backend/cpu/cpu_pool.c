/* Persistent thread pool.
 *
 * One 64-bit atomic word `claim` = generation << 32 | next task index. A
 * thread takes task i of generation g by a compare-and-swap from (g, i) to
 * (g, i + 1), so it can never run a task of a job that has already moved
 * on; the job descriptors are double-buffered by generation parity and a
 * slot is rewritten only two generations later, after every task of its
 * job has finished. The caller waits for `done == n_tasks`, not for the
 * workers: a worker the OS has descheduled simply misses the job (the
 * caller and the others take its share), which keeps dispatch cheap on a
 * busy machine.
 *
 * Idle workers spin for a while (the next op usually follows within
 * microseconds), then sleep. Wake protocol: a sleeper increments
 * `sleepers` and re-reads the generation under the mutex; the dispatcher
 * publishes the generation and then reads `sleepers` (both sequentially
 * consistent), so one of them sees the other. */
#include "backend/cpu/cpu_pool.h"
#include "util/common.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SPIN_NS 300000 /* how long an idle worker spins before sleeping */

typedef struct job_slot {
    _Atomic(cpu_task_fn) fn;
    _Atomic(void *) arg;
    _Atomic int64_t n_tasks;
} job_slot;

typedef struct worker {
    cpu_pool *pool;
    int index;
    pthread_t tid;
} worker;

struct cpu_pool {
    int n_threads;
    bool oversubscribed; /* more threads than cores: never spin */
    worker *workers;     /* n_threads - 1 */
    job_slot slot[2];
    _Atomic uint64_t claim;
    _Atomic int64_t done;
    _Atomic int sleepers;
    _Atomic bool stop;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
};

static inline uint32_t gen_of(uint64_t c) { return (uint32_t)(c >> 32); }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Take and run tasks of generation g until it has none left. */
static void run_claims(cpu_pool *p, uint32_t g, int thread) {
    job_slot *s = &p->slot[g & 1];
    cpu_task_fn fn = atomic_load_explicit(&s->fn, memory_order_acquire);
    void *arg = atomic_load_explicit(&s->arg, memory_order_acquire);
    int64_t n = atomic_load_explicit(&s->n_tasks, memory_order_acquire);
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        if (gen_of(c) != g || (int64_t)(c & 0xFFFFFFFFu) >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
            continue; /* c now holds the current word */
        fn(arg, (int64_t)(c & 0xFFFFFFFFu), thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

/* Wait for a generation other than `seen`; returns it, or seen when stopping. */
static uint32_t wait_for_job(cpu_pool *p, uint32_t seen) {
    if (!p->oversubscribed) {
        int64_t deadline = now_ns() + SPIN_NS;
        for (int i = 1;; i++) {
            uint32_t g = gen_of(atomic_load_explicit(&p->claim, memory_order_acquire));
            if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
            cpu_relax();
            if ((i & 255) == 0 && now_ns() > deadline) break;
        }
    }
    pthread_mutex_lock(&p->mutex);
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t g;
    while ((g = gen_of(atomic_load(&p->claim))) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->wake, &p->mutex);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mutex);
    return g;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    cpu_pool *p = w->pool;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        run_claims(p, g, w->index);
        seen = g;
    }
}

cpu_pool *cpu_pool_create(int n_threads) {
    cpu_pool *p = mu_xcalloc(1, sizeof *p);
    p->n_threads = n_threads > 0 ? n_threads : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    p->oversubscribed = cores > 0 && p->n_threads > cores;
    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = mu_xcalloc((size_t)p->n_threads, sizeof *p->workers);
    for (int i = 1; i < p->n_threads; i++) {
        worker *w = &p->workers[i - 1];
        w->pool = p;
        w->index = i;
        if (pthread_create(&w->tid, NULL, worker_main, w) != 0) {
            p->n_threads = i; /* fewer workers: same results, only slower */
            break;
        }
    }
    return p;
}

static void wake_sleepers(cpu_pool *p) {
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mutex);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mutex);
    }
}

void cpu_pool_destroy(cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    pthread_mutex_lock(&p->mutex);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->workers[i - 1].tid, NULL);
    pthread_mutex_destroy(&p->mutex);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int cpu_pool_threads(const cpu_pool *p) { return p->n_threads; }

void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *arg, int64_t n_tasks) {
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1 || n_tasks > 0xFFFFFFFFll) {
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        return;
    }
    const uint32_t g = gen_of(atomic_load(&p->claim)) + 1;
    job_slot *s = &p->slot[g & 1];
    atomic_store_explicit(&s->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&s->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&s->n_tasks, n_tasks, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store(&p->claim, (uint64_t)g << 32); /* publish (seq_cst) */
    wake_sleepers(p);
    run_claims(p, g, 0);
    for (int i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (p->oversubscribed || (i & 1023) == 0) sched_yield();
        else cpu_relax();
    }
}
