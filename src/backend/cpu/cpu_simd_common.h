/* Shared pieces of the SIMD kernel files (included by cpu_avx2.c and
 * cpu_avx512.c only): constant tables of the block formats and the
 * activation-layout permutations. The permutations reorder a Q8_K block's
 * 256 codes so that they pair with the weight nibbles as loaded; integer
 * sums are exact, so only which code meets which weight matters. */
#ifndef MUSER_CPU_SIMD_COMMON_H
#define MUSER_CPU_SIMD_COMMON_H
#include "backend/cpu/cpu_internal.h"
#include "quant/quant_internal.h"
#include "util/mumath.h"
#include <math.h>
#include <pthread.h>

/* Activation layouts. */
enum {
    ACT_NATURAL = 0,
    ACT_K4 = 1,       /* swap 32-code chunks 1<->2 and 5<->6 (Q4_K/Q5_K nibble planes in 64-byte loads) */
    ACT_EVEN_ODD = 2, /* per 128 codes: the 64 even ones, then the 64 odd ones (native NVFP4) */
};

/* E2M1 code -> value*2 + 12 (0..24): unsigned, so the dot is
 * sum(u * x) - 12 * sum(x) over each 16-group (bsums). */
static const int8_t CPU_E2M1_U12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

/* Exact integer scale tables (from the quant module's own functions). */
typedef struct cpu_scale_tables {
    int32_t ue4m3_q9[256]; /* ggml NVFP4 block scale x 512 */
    int32_t e4m3_q9[256];  /* native NVFP4 E4M3FN scale x 512 (signed) */
} cpu_scale_tables;

static cpu_scale_tables CPU_TABLES;
static pthread_once_t CPU_TABLES_ONCE = PTHREAD_ONCE_INIT;

static void cpu_tables_build(void) {
    for (int b = 0; b < 256; b++) {
        CPU_TABLES.ue4m3_q9[b] = qi_ue4m3_q9((uint8_t)b);
        CPU_TABLES.e4m3_q9[b] = mu_e4m3fn_q9((uint8_t)b);
    }
}

static inline const cpu_scale_tables *cpu_tables(void) {
    pthread_once(&CPU_TABLES_ONCE, cpu_tables_build);
    return &CPU_TABLES;
}

static inline bool cpu_is_native(const mu_weight *w) { return w->type == MU_TYPE_NVFP4_E2M1; }

static inline uint32_t cpu_rd32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t cpu_rd64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Q4_K/Q5_K 12-byte strip -> 8 six-bit scales and 8 six-bit mins, one byte
 * each (the bit layout of qi_scale_min_k4, four sub-blocks at a time). */
static inline void cpu_kq_scales(const uint8_t *s, uint64_t *sc, uint64_t *m) {
    const uint32_t a = cpu_rd32(s), b = cpu_rd32(s + 4), c = cpu_rd32(s + 8);
    const uint32_t sc_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4);
    const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | (((b >> 6) & 0x03030303u) << 4);
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *m = m_lo | (uint64_t)m_hi << 32;
}

#endif
