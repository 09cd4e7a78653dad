/* Minimal test harness: plain executables under ctest. A failed CHECK prints
 * file:line and the expression, counts the failure, and the test exits 1. */
#ifndef MUSER_TESTUTIL_H
#define MUSER_TESTUTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

static int tu_failures = 0;

#define CHECK(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    tu_failures++; } } while (0)

#define CHECK_MSG(cond, ...) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); tu_failures++; } } while (0)

#define CHECK_EQ_INT(a, b) do { long long _a = (long long)(a), _b = (long long)(b); \
    if (_a != _b) { fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", \
        __FILE__, __LINE__, #a, #b, _a, _b); tu_failures++; } } while (0)

/* Bitwise float equality (distinguishes -0.0 from 0.0, compares NaN payloads). */
#define CHECK_BITS_F32(a, b) do { float _a = (a), _b = (b); uint32_t _ua, _ub; \
    memcpy(&_ua, &_a, 4); memcpy(&_ub, &_b, 4); if (_ua != _ub) { \
    fprintf(stderr, "%s:%d: bits(%s) != bits(%s): %.9g (0x%08x) vs %.9g (0x%08x)\n", \
        __FILE__, __LINE__, #a, #b, _a, _ua, _b, _ub); tu_failures++; } } while (0)

#define TEST_MAIN_END() do { if (tu_failures) { \
    fprintf(stderr, "%d check(s) failed\n", tu_failures); return 1; } \
    printf("ok\n"); return 0; } while (0)

/* Deterministic xorshift RNG for tests (never test on zeros). */
static inline uint64_t tu_rng_next(uint64_t *s) {
    uint64_t x = *s; x ^= x << 13; x ^= x >> 7; x ^= x << 17; return *s = x;
}
static inline float tu_rng_uniform(uint64_t *s) { /* [-1, 1) */
    return (float)((tu_rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static inline float tu_rng_normal(uint64_t *s) { /* Irwin-Hall approx of N(0,1) */
    float a = 0; for (int i = 0; i < 12; i++) a += (tu_rng_uniform(s) + 1.0f) * 0.5f;
    return a - 6.0f;
}
#endif
