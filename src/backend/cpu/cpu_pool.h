/* A persistent pthread pool for the CPU backend. Workers spin briefly after
 * each job (the next op usually follows within microseconds), then sleep on
 * a condition variable. Tasks are claimed dynamically; every task computes a
 * fixed set of outputs in the canonical order, so results never depend on
 * which thread ran what or on the thread count. */
#ifndef MUSER_CPU_POOL_H
#define MUSER_CPU_POOL_H
#include <stdint.h>

typedef struct cpu_pool cpu_pool;
/* fn(arg, task, thread): thread is 0 for the caller, 1..n-1 for workers. */
typedef void (*cpu_task_fn)(void *arg, int64_t task, int thread);

cpu_pool *cpu_pool_create(int n_threads);
void cpu_pool_destroy(cpu_pool *p);
int cpu_pool_threads(const cpu_pool *p);
/* Run tasks [0, n_tasks) on all threads; returns when every task is done.
 * Not reentrant: callers serialize (the backend holds its lock). */
void cpu_pool_run(cpu_pool *p, cpu_task_fn fn, void *arg, int64_t n_tasks);

#endif
