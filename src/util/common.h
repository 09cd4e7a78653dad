/* Shared plumbing: error reporting, checked arithmetic, half-precision bits. */
#ifndef MUSER_UTIL_COMMON_H
#define MUSER_UTIL_COMMON_H
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>

/* Every fallible function takes an mu_error* and returns false / NULL / -1 on
 * failure after filling it with one precise, human-readable message
 * (file, offset, key or tensor name). err may be NULL. */
typedef struct mu_error {
    char msg[1024];
} mu_error;

void mu_err_set(mu_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix an existing message: "context: old message". */
void mu_err_prefix(mu_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocation that aborts with a message on OOM (only for engine-sized,
 * already-validated sizes; never for sizes read from a file unchecked). */
void *mu_xmalloc(size_t n);
void *mu_xcalloc(size_t count, size_t size);
void *mu_xrealloc(void *p, size_t n);
char *mu_xstrdup(const char *s);

/* The one growable byte buffer: len bytes at p, always followed by a NUL
 * (so text built in it is a C string), grown by doubling. Zero-initialize;
 * free(p) when done. */
typedef struct mu_buf {
    char *p;
    size_t len, cap;
} mu_buf;
void mu_buf_append(mu_buf *b, const void *src, size_t n);

/* Checked arithmetic: return false on overflow. */
static inline bool mu_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline bool mu_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

/* IEEE half <-> single, round-to-nearest-even, NaN/Inf preserved.
 * Bit-exact and identical to F16C (imm 0) and __float2half_rn. */
uint16_t mu_f32_to_f16(float f);
float mu_f16_to_f32(uint16_t h);
/* bfloat16: round-to-nearest-even on conversion, NaN kept quiet. */
uint16_t mu_f32_to_bf16(float f);
float mu_bf16_to_f32(uint16_t h);

static inline uint32_t mu_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float mu_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* Round an f32 through f16 and back (the KV-store and NVFP4 output boundary). */
static inline float mu_round_f16(float f) { return mu_f16_to_f32(mu_f32_to_f16(f)); }

/* Monotonic wall clock in seconds. */
double mu_now(void);

#endif
