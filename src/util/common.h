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
 * once anything was appended (so text built in it is a C string), grown by
 * doubling. Zero-initialize; mu_buf_free (or free(p)) when done.
 * A nonzero limit caps len: an append that would pass it appends nothing
 * and sets over, and every append after that is dropped too (the template
 * renderer's size limit, src/template/tpl_internal.h). */
typedef struct mu_buf {
    char *p;
    size_t len, cap;
    size_t limit; /* max bytes, 0 = none */
    bool over;    /* an append was dropped for the limit */
} mu_buf;
void mu_buf_append(mu_buf *b, const void *src, size_t n);
/* printf into the buffer, any length. */
void mu_buf_appendf(mu_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void mu_buf_puts(mu_buf *b, const char *s) { mu_buf_append(b, s, strlen(s)); }
static inline void mu_buf_putc(mu_buf *b, char c) { mu_buf_append(b, &c, 1); }
/* The text so far, never NULL; the buffer keeps it. */
const char *mu_buf_str(mu_buf *b);
/* Hands the text (never NULL, free() it) to the caller and empties the buffer. */
char *mu_buf_take(mu_buf *b);
/* Frees the bytes and empties the buffer (limit and over stay). */
void mu_buf_free(mu_buf *b);

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
/* A float's bits as an int32 in the floats' order (-0 just below +0, -inf
 * lowest, NaN outside it), so that a maximum over floats is an integer
 * maximum the compiler vectorizes. */
static inline int32_t mu_f32_order_key(float f) {
    const uint32_t b = mu_f32_bits(f);
    return (int32_t)(b ^ ((uint32_t)((int32_t)b >> 31) & 0x7FFFFFFFu));
}

/* Index of the first non-finite value of x[0..n), n when every one is
 * finite: one pass over the exponent bits without an early exit (the
 * compiler vectorizes it; the row checks of a 202,048-token decode step
 * stand on it), the index searched only when something was found. */
int64_t mu_first_nonfinite(const float *x, int64_t n);

/* Round an f32 through f16 and back (the KV-store and NVFP4 output boundary). */
static inline float mu_round_f16(float f) { return mu_f16_to_f32(mu_f32_to_f16(f)); }

/* Monotonic wall clock in seconds. */
double mu_now(void);
/* v[0 .. n) in ascending order (timings: no NaN). */
void mu_sort_doubles(double *v, size_t n);
/* "\rLABEL [####....]  42.0% 123.4/456.7 MB 89.0 MB/s" on stderr (a newline
 * after it when last): the progress of long byte-counted work. */
void mu_progress_bar(const char *label, uint64_t done, uint64_t total, double secs, bool last);

#endif
