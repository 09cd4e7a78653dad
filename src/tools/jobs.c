/* Worker pool for the tools: threads pull (tensor, row range) jobs in file
 * order and pwrite() their bytes; the calling thread draws the progress bar. */
#include "tools/tools_internal.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct pool {
    const mu_job *jobs;
    size_t n_jobs;
    mu_job_fn fn;
    void *ctx;
    atomic_size_t next;
    atomic_uint_fast64_t bytes_done;
    atomic_bool failed;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int running;
    mu_error err;             /* first failure, under lock */
} pool;

int mu_tools_thread_count(int requested) {
    if (requested > 0) return requested > 256 ? 256 : requested;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

static void *worker(void *arg) {
    pool *p = arg;
    mu_error err = {{0}};
    while (!atomic_load(&p->failed)) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n_jobs) break;
        if (!p->fn(p->ctx, &p->jobs[i], &err)) {
            pthread_mutex_lock(&p->lock);
            if (!atomic_load(&p->failed)) p->err = err;
            atomic_store(&p->failed, true);
            pthread_mutex_unlock(&p->lock);
            break;
        }
        atomic_fetch_add(&p->bytes_done, p->jobs[i].bytes);
    }
    pthread_mutex_lock(&p->lock);
    p->running--;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

static void wait_for_workers(pool *p, bool progress, const char *label, uint64_t total, double t0) {
    pthread_mutex_lock(&p->lock);
    while (p->running > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        int rc = pthread_cond_timedwait(&p->cond, &p->lock, &until);
        if (rc == ETIMEDOUT && progress)
            mu_progress_bar(label, atomic_load(&p->bytes_done), total, mu_now() - t0, false);
    }
    pthread_mutex_unlock(&p->lock);
}

bool mu_run_jobs(const mu_job *jobs, size_t n_jobs, int n_threads, mu_job_fn fn,
                 void *ctx, bool progress, const char *label, uint64_t total_bytes,
                 mu_error *err) {
    pool p = {.jobs = jobs, .n_jobs = n_jobs, .fn = fn, .ctx = ctx};
    atomic_init(&p.next, 0);
    atomic_init(&p.bytes_done, 0);
    atomic_init(&p.failed, false);
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.cond, NULL);
    int n = mu_tools_thread_count(n_threads);
    if ((size_t)n > n_jobs) n = n_jobs ? (int)n_jobs : 1;
    pthread_t *tids = mu_xcalloc((size_t)n, sizeof *tids);
    double t0 = mu_now();
    int started = 0;
    for (; started < n; started++) {
        pthread_mutex_lock(&p.lock);
        p.running++;
        pthread_mutex_unlock(&p.lock);
        if (pthread_create(&tids[started], NULL, worker, &p) != 0) {
            pthread_mutex_lock(&p.lock);
            p.running--;
            pthread_mutex_unlock(&p.lock);
            break;
        }
    }
    if (started == 0) { /* no thread could start: do the work here */
        p.running = 1;
        worker(&p);
    }
    wait_for_workers(&p, progress, label, total_bytes, t0);
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    free(tids);
    bool ok = !atomic_load(&p.failed);
    if (!ok && err) *err = p.err;
    if (ok && progress) mu_progress_bar(label, atomic_load(&p.bytes_done), total_bytes, mu_now() - t0, true);
    pthread_mutex_destroy(&p.lock);
    pthread_cond_destroy(&p.cond);
    return ok;
}
