/* std::mt19937 and the libstdc++ conversions llama.cpp's samplers draw with. */
#include "sample/sample.h"
#include <math.h>
#include <sys/random.h>
#include <time.h>

enum { MT_N = 624, MT_M = 397 };
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7fffffffu

void mu_mt_seed(mu_mt19937 *r, uint32_t seed) {
    r->x[0] = seed;
    for (uint32_t i = 1; i < MT_N; i++)
        r->x[i] = 1812433253u * (r->x[i - 1] ^ (r->x[i - 1] >> 30)) + i;
    r->next = MT_N;
}

static uint32_t twist(uint32_t hi, uint32_t lo, uint32_t far) {
    uint32_t y = (hi & MT_UPPER) | (lo & MT_LOWER);
    return far ^ (y >> 1) ^ ((y & 1u) ? MT_MATRIX_A : 0u);
}

static void regenerate(mu_mt19937 *r) {
    uint32_t *x = r->x;
    int k = 0;
    for (; k < MT_N - MT_M; k++) x[k] = twist(x[k], x[k + 1], x[k + MT_M]);
    for (; k < MT_N - 1; k++) x[k] = twist(x[k], x[k + 1], x[k + MT_M - MT_N]);
    x[MT_N - 1] = twist(x[MT_N - 1], x[0], x[MT_M - 1]);
    r->next = 0;
}

uint32_t mu_mt_next(mu_mt19937 *r) {
    if (r->next >= MT_N) regenerate(r);
    uint32_t z = r->x[r->next++];
    z ^= z >> 11;
    z ^= (z << 7) & 0x9d2c5680u;
    z ^= (z << 15) & 0xefc60000u;
    z ^= z >> 18;
    return z;
}

/* generate_canonical<double,53> with a 32-bit engine: k = 2 draws,
 * sum = lo + hi * 2^32 (rounded to double), ret = sum / 2^64. */
double mu_canonical_f64(uint32_t lo, uint32_t hi) {
    const double range = 4294967296.0;
    double sum = (double)lo;
    sum += (double)hi * range;
    double ret = sum / (range * range);
    if (ret >= 1.0) ret = nextafter(1.0, 0.0);
    return ret;
}

/* generate_canonical<float,24>: k = 1 draw; (float)u rounds to nearest, so
 * the quotient can reach 1 and is clamped to the float just below it. */
float mu_canonical_f32(uint32_t u) {
    float ret = (float)u / 4294967296.0f;
    if (ret >= 1.0f) ret = nextafterf(1.0f, 0.0f);
    return ret;
}

double mu_mt_canonical_f64(mu_mt19937 *r) {
    uint32_t lo = mu_mt_next(r);
    return mu_canonical_f64(lo, mu_mt_next(r));
}

float mu_mt_canonical_f32(mu_mt19937 *r) { return mu_canonical_f32(mu_mt_next(r)); }

uint32_t mu_seed_resolve(uint32_t seed) {
    if (seed != MU_SEED_RANDOM) return seed;
    uint32_t v;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
    /* llama falls back to the system clock when the device has no entropy. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint32_t)((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}
