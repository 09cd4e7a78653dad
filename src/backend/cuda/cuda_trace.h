/* Kernel timings from CUPTI's activity records (cuda_trace.c): begin when
 * MUSER_CUDA_TRACE is set (at the backend's creation), end prints the table
 * (at its destruction). Both do nothing otherwise. */
#ifndef MUSER_CUDA_TRACE_H
#define MUSER_CUDA_TRACE_H
#ifdef __cplusplus
extern "C" {
#endif
void mucu_trace_begin(void);
void mucu_trace_end(void);
#ifdef __cplusplus
}
#endif
#endif
