/* The fast CPU backend: SIMD kernels chosen at run time from CPUID
 * (AVX-512 F/BW/VL/VNNI, AVX2+FMA+F16C, or the scalar reference), a
 * persistent thread pool, weights read in place from the GGUF mapping
 * (by default a private copy of it on huge pages, gguf_make_resident). Its
 * results are bit-identical to the ref backend (docs/numerics.md) for every
 * ISA level, thread count and batch size. */
#ifndef MUSER_CPU_BACKEND_H
#define MUSER_CPU_BACKEND_H
#include "backend/backend.h"

typedef enum mu_cpu_isa {
    MU_CPU_ISA_SCALAR = 0, /* the ref kernels, threaded */
    MU_CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    MU_CPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + VNNI */
} mu_cpu_isa;

/* Best level this CPU supports. */
mu_cpu_isa mu_cpu_isa_best(void);
/* Level a plain mu_backend_cpu_create uses: the best, lowered by the
 * environment variable MUSER_CPU_ISA=scalar|avx2|avx512 (a level the CPU
 * lacks falls back to the best one below it). */
mu_cpu_isa mu_cpu_isa_default(void);
bool mu_cpu_isa_supported(mu_cpu_isa isa);
const char *mu_cpu_isa_name(mu_cpu_isa isa);

/* n_threads <= 0: all online cores. Never NULL. */
mu_backend *mu_backend_cpu_create(int n_threads);
/* A specific level (tests, benchmarks); NULL if the CPU lacks it. */
mu_backend *mu_backend_cpu_create_isa(int n_threads, mu_cpu_isa isa);
/* The level a cpu backend runs (b must come from the two functions above). */
mu_cpu_isa mu_backend_cpu_isa(const mu_backend *b);

#endif
