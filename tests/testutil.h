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
/* Whole file as a NUL-terminated malloc'd buffer (*len, if len is not NULL,
 * excludes the NUL); NULL if it cannot be read. */
static inline char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!buf) return NULL;
    buf[got] = '\0';
    if (len) *len = got;
    return buf;
}

/* tests/data/<sub> of the source tree: $MUSER_SOURCE_DIR (set by CMake), else
 * the folder of the test's own source file (__FILE__ is absolute there). */
static inline void tu_data_dir(char *buf, size_t cap, const char *sub, const char *this_file) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    if (src && *src) {
        snprintf(buf, cap, "%s/tests/data/%s", src, sub);
        return;
    }
    const char *slash = strrchr(this_file, '/');
    int n = slash ? (int)(slash - this_file) : 1;
    snprintf(buf, cap, "%.*s/data/%s", n, slash ? this_file : ".", sub);
}
#endif
