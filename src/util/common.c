#include "util/common.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void mu_err_set(mu_error *err, const char *fmt, ...) {
    if (!err) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

void mu_err_prefix(mu_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3, m = strnlen(old, room);
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
}

static void oom(size_t n) {
    fprintf(stderr, "muser: out of memory allocating %zu bytes\n", n);
    abort();
}

void *mu_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *mu_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *mu_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *mu_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = mu_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

uint16_t mu_f32_to_f16(float f) {
    uint32_t x = mu_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t absx = x & 0x7FFFFFFFu;
    if (absx >= 0x7F800000u) {                       /* Inf or NaN */
        if (absx == 0x7F800000u) return sign | 0x7C00;
        return sign | 0x7E00 | (uint16_t)((absx >> 13) & 0x3FF);
    }
    if (absx >= 0x477FF000u) return sign | 0x7C00;   /* rounds to >= 65520: Inf */
    if (absx < 0x38800000u) {                        /* result is subnormal or zero */
        if (absx < 0x33000000u) return sign;         /* < 2^-25: rounds to zero */
        uint32_t exp = absx >> 23;
        uint32_t mant = (absx & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - exp;                  /* 14..24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return sign | (uint16_t)q;
    }
    uint32_t q = (absx >> 13) - ((127 - 15) << 10);
    uint32_t rem = absx & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;
    return sign | (uint16_t)q;
}

float mu_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    if (exp == 0x1F) return mu_bits_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        if (mant == 0) return mu_bits_f32(sign);
        /* subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return mu_bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t mu_f32_to_bf16(float f) {
    uint32_t x = mu_f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40);
    uint32_t lsb = (x >> 16) & 1;
    return (uint16_t)((x + 0x7FFF + lsb) >> 16);
}

float mu_bf16_to_f32(uint16_t h) { return mu_bits_f32((uint32_t)h << 16); }

double mu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void mu_sort_doubles(double *v, size_t n) { qsort(v, n, sizeof *v, cmp_double); }

/* Room for n more bytes and the NUL. */
static void buf_reserve(mu_buf *b, size_t n) {
    if (b->cap - b->len > n) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len <= n) cap *= 2;
    b->p = mu_xrealloc(b->p, cap);
    b->cap = cap;
}

/* Whether n more bytes stay within the limit; sets over when not. */
static bool buf_admit(mu_buf *b, size_t n) {
    if (b->over) return false;
    if (b->limit && (n > b->limit || b->len > b->limit - n)) {
        b->over = true;
        return false;
    }
    return true;
}

void mu_buf_append(mu_buf *b, const void *src, size_t n) {
    if (!buf_admit(b, n)) return;
    buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = 0;
}

void mu_buf_appendf(mu_buf *b, const char *fmt, ...) {
    if (b->over) return;
    /* First into the spare room; when that is too small, grow and retry. */
    size_t room = b->cap - b->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0 || !buf_admit(b, (size_t)n)) {
        if (room) b->p[b->len] = 0; /* drop what vsnprintf left there */
        return;
    }
    if ((size_t)n >= room) {
        buf_reserve(b, (size_t)n);
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

const char *mu_buf_str(mu_buf *b) {
    if (!b->p) mu_buf_append(b, "", 0);
    return b->p ? b->p : "";
}

char *mu_buf_take(mu_buf *b) {
    char *p = b->p;
    if (!p) p = mu_xstrdup("");
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void mu_buf_free(mu_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void mu_progress_bar(const char *label, uint64_t done, uint64_t total, double secs, bool last) {
    const int width = 30;
    double frac = total ? (double)done / (double)total : 1.0;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    double mb = (double)done / 1e6, rate = secs > 0 ? mb / secs : 0;
    fprintf(stderr, "\r%s [%s] %5.1f%% %.1f/%.1f MB %.1f MB/s%s", label, bar, 100.0 * frac, mb,
            (double)total / 1e6, rate, last ? "\n" : "");
    fflush(stderr);
}

int64_t mu_first_nonfinite(const float *x, int64_t n) {
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (mu_f32_bits(x[i]) & 0x7F800000u) == 0x7F800000u;
    if (!bad) return n;
    int64_t i = 0;
    while ((mu_f32_bits(x[i]) & 0x7F800000u) != 0x7F800000u) i++;
    return i;
}
