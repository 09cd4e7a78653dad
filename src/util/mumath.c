/* The engine's deterministic transcendental functions.
 *
 * Rules that make the results identical under gcc and nvcc:
 *  - only +, -, *, / and explicit fmaf/fma (the build uses -ffp-contract=off,
 *    so no other fusion happens), integer and bit operations;
 *  - no libm calls besides fma/fmaf, which are correctly rounded everywhere;
 *  - constants are hex literals, so no compiler rounds a decimal string.
 * Polynomial coefficients were fitted offline (Remez exchange in 50-digit
 * arithmetic for the f32 kernels, then rounded to f32); truncated Taylor series for the double
 * kernels, which carry enough terms that truncation is below 2^-60). */
#include "util/mumath.h"
#include <math.h> /* fma and fmaf only */
#include <stdint.h>
#include <string.h>

/* ---------- bit helpers ---------- */

static inline uint32_t f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint64_t f64_to_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double bits_to_f64(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

#define F32_INF_BITS 0x7F800000u
#define F64_INF_BITS 0x7FF0000000000000ull
#define F64_QNAN_BITS 0x7FF8000000000000ull

/* 2^e for e in [-126, 127]: a normal float built from its exponent field. */
static inline float pow2f(int32_t e) { return bits_to_f32((uint32_t)(e + 127) << 23); }
/* 2^e for e in [-1022, 1023]. */
static inline double pow2(int64_t e) { return bits_to_f64((uint64_t)(e + 1023) << 52); }

/* p * 2^n with a single rounding, also when the result is subnormal or
 * overflows. p is in [0.7, 1.5]; n in [-150, 128]. */
static float scale_pow2f(float p, int32_t n) {
    if (n > 127) return (p * pow2f(n - 1)) * 2.0f;          /* 2^128 is not a float */
    if (n < -126) return (p * pow2f(n + 100)) * pow2f(-100); /* exact, then one rounding */
    return p * pow2f(n);
}

/* p * 2^n for doubles; n in [-1075, 1024]. */
static double scale_pow2(double p, int64_t n) {
    if (n > 1023) return (p * pow2(n - 1)) * 2.0;
    if (n < -1022) return (p * pow2(n + 600)) * pow2(-600);
    return p * pow2(n);
}

/* Error-free sum: a + b == *s + *e exactly (Knuth's TwoSum, no ordering needed). */
static inline void two_sum(double a, double b, double *s, double *e) {
    double sum = a + b;
    double b_virtual = sum - a;
    double a_virtual = sum - b_virtual;
    *s = sum;
    *e = (a - a_virtual) + (b - b_virtual);
}

/* ---------- f32 exp ---------- */

/* Largest x whose exp rounds to a finite float, smallest whose exp rounds to
 * a non-zero float (computed in 60-digit arithmetic). */
#define EXPF_MAX_ARG 0x1.62e42ep+6f  /*  88.7228317 */
#define EXPF_MIN_ARG -0x1.9fe368p+6f /* -103.972076 */
#define LOG2E_F 0x1.715476p+0f
/* ln2 = LN2_HI_F + LN2_LO_F to 2^-53. With |n| <= 150, x - n*LN2_HI_F is
 * exactly representable, so the first fmaf of the reduction is exact. */
#define LN2_HI_F 0x1.62e430p-1f
#define LN2_LO_F -0x1.05c610p-29f
/* Adding then subtracting 1.5*2^23 rounds a float of magnitude < 2^22 to the
 * nearest integer (ties to even) in the current rounding mode. */
#define ROUND_MAGIC_F 0x1.8p23f

/* q(r) ~ (e^r - 1) / r on |r| <= ln2/2 + 1e-4, minimax for absolute error
 * (1.1e-8, i.e. about 0.03 ulp of the final result); q0 = 1, q1 = 1/2.
 * Written as literals, not a table, so CUDA device code can use them. */
#define EXPF_Q2 0x1.55547cp-3f
#define EXPF_Q3 0x1.555470p-5f
#define EXPF_Q4 0x1.123db2p-7f
#define EXPF_Q5 0x1.6da798p-10f

/* fmaf is one instruction where the CPU has FMA and a libm call elsewhere;
 * both are correctly rounded, so the clones return the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MU_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define MU_FMA_CLONES
#endif

MU_FMA_CLONES float mu_expf(float x) {
    if (x != x) return x + x;                       /* NaN, quieted */
    if (x > EXPF_MAX_ARG) return bits_to_f32(F32_INF_BITS);
    if (x < EXPF_MIN_ARG) return 0.0f;              /* includes -inf */
    float n_f = (x * LOG2E_F + ROUND_MAGIC_F) - ROUND_MAGIC_F;
    int32_t n = (int32_t)n_f;
    float r = fmaf(-n_f, LN2_HI_F, x);              /* exact */
    r = fmaf(-n_f, LN2_LO_F, r);                    /* |r| <= ln2/2 + 6e-6 */
    float q = fmaf(EXPF_Q5, r, EXPF_Q4);
    q = fmaf(q, r, EXPF_Q3);
    q = fmaf(q, r, EXPF_Q2);
    q = fmaf(q, r, 0.5f);
    q = fmaf(q, r, 1.0f);
    float p = fmaf(r, q, 1.0f);                     /* e^r, one rounding at the end */
    return scale_pow2f(p, n);
}

/* ---------- sums of exponentials (log-sum-exp of a logits row) ---------- */

static double fold8(const double *acc) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

double mu_sum_expf_ref(const float *x, size_t n, float shift) {
    double acc[8] = {0};
    for (size_t i = 0; i < n; i++) acc[i % 8] += (double)mu_expf(x[i] - shift);
    return fold8(acc);
}

/* floor(e * 2^60) for a float 0 <= e <= 1 from its bits: mantissa m
 * (the implicit bit set, also for subnormals and zero, which the shift
 * then drops: any e < 2^-60 gives 0) times 2^(biased exponent - 150 + 60).
 * At most 2^60 (e = 1). */
static inline uint64_t fixed60(uint32_t bits) {
    const uint64_t m = (bits & 0x7FFFFFu) | 0x800000u;
    const int s = (int)(bits >> 23) - 90;
    return s >= 0 ? m << s : s > -64 ? m >> -s : 0;
}

/* The exact total a * 2^-30 + c * 2^-60 (a, c < 2^53 after the carry) as
 * one correctly rounded double: both parts are exact doubles, their sum
 * rounds once. */
static inline double fixed60_total(uint64_t a, uint64_t c) {
    a += c >> 30, c &= 0x3FFFFFFFu;
    return (double)a * 0x1p-30 + (double)c * 0x1p-60;
}

/* Each term's floor(e * 2^60) split at bit 30: the high parts (<= 2^30)
 * and the low parts (< 2^30) summed apart, so neither sum can overflow
 * for n < 2^23 and both convert to double exactly. */
double mu_sum_expf_fixed_ref(const float *x, size_t n, float shift) {
    uint64_t a = 0, c = 0;
    for (size_t i = 0; i < n; i++) {
        const float e = mu_expf(x[i] - shift);
        uint32_t bits;
        memcpy(&bits, &e, sizeof bits);
        const uint64_t f = fixed60(bits);
        a += f >> 30, c += f & 0x3FFFFFFFu;
    }
    return fixed60_total(a, c);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "util/mumath_avx2.h"

/* fixed60 of 4 lanes of float bits (as 64-bit lanes), added to the high and low sums */
static inline void fixed60_add_avx2(__m256i bits, __m256i *a, __m256i *c) {
    const __m256i m = _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x7FFFFF)), _mm256_set1_epi64x(0x800000));
    const __m256i s = _mm256_sub_epi64(_mm256_srli_epi64(bits, 23), _mm256_set1_epi64x(90));
    const __m256i zero = _mm256_setzero_si256();
    const __m256i neg = _mm256_cmpgt_epi64(zero, s);
    const __m256i sl = _mm256_andnot_si256(neg, s), sr = _mm256_and_si256(neg, _mm256_sub_epi64(zero, s));
    const __m256i f = _mm256_srlv_epi64(_mm256_sllv_epi64(m, sl), sr); /* counts >= 64 give 0 */
    *a = _mm256_add_epi64(*a, _mm256_srli_epi64(f, 30));
    *c = _mm256_add_epi64(*c, _mm256_and_si256(f, _mm256_set1_epi64x(0x3FFFFFFF)));
}

static uint64_t hsum_epi64_avx2(__m256i v) {
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, v);
    return t[0] + t[1] + t[2] + t[3];
}

/* Integer sums: any lane order gives the reference's total; the tail is
 * padded with -inf (a zero term). */
static double sum_expf_fixed_avx2(const float *x, size_t n, float shift) {
    const __m256 s = _mm256_set1_ps(shift);
    __m256i a = _mm256_setzero_si256(), c = _mm256_setzero_si256();
    for (size_t i = 0; i < n; i += 8) {
        __m256 v;
        if (i + 8 <= n) v = _mm256_loadu_ps(x + i);
        else {
            float t[8];
            for (size_t j = 0; j < 8; j++) t[j] = i + j < n ? x[i + j] : -INFINITY;
            v = _mm256_loadu_ps(t);
        }
        const __m256i e = _mm256_castps_si256(mu_exp_ps(_mm256_sub_ps(v, s)));
        fixed60_add_avx2(_mm256_cvtepu32_epi64(_mm256_castsi256_si128(e)), &a, &c);
        fixed60_add_avx2(_mm256_cvtepu32_epi64(_mm256_extracti128_si256(e, 1)), &a, &c);
    }
    return fixed60_total(hsum_epi64_avx2(a), hsum_epi64_avx2(c));
}

/* Lane j of each 8-value step is lane j of the reference; the tail is one
 * more step padded with -inf (mu_expf(-inf) = 0 adds +0.0, which changes
 * no sum). */
static double sum_expf_avx2(const float *x, size_t n, float shift) {
    const __m256 s = _mm256_set1_ps(shift);
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = mu_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    if (i < n) {
        float t[8];
        for (size_t j = 0; j < 8; j++) t[j] = i + j < n ? x[i + j] : -INFINITY;
        const __m256 e = mu_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(t), s));
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double acc[8];
    _mm256_storeu_pd(acc, lo);
    _mm256_storeu_pd(acc + 4, hi);
    return fold8(acc);
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
#include "util/mumath_avx512.h"

/* 16 values a step: the low 8 are lanes 0-7 of the reference, the high 8
 * the next 8 values of the same lanes, added after them (as the reference
 * adds element i + 8 after element i); the tail masked in as -inf. */
static double sum_expf_avx512(const float *x, size_t n, float shift) {
    const __m512 s = _mm512_set1_ps(shift);
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = mu_exp_ps512(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
        const __m512 e = mu_exp_ps512(_mm512_sub_ps(v, s));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        if (n - i > 8) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    double a[8];
    _mm512_storeu_pd(a, acc);
    return fold8(a);
}

/* fixed60 of 8 lanes of float bits (as 64-bit lanes), added to the high and low sums */
static inline void fixed60_add_avx512(__m512i bits, __m512i *a, __m512i *c) {
    const __m512i m = _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi64(0x7FFFFF)), _mm512_set1_epi64(0x800000));
    const __m512i s = _mm512_sub_epi64(_mm512_srli_epi64(bits, 23), _mm512_set1_epi64(90));
    const __m512i zero = _mm512_setzero_si512();
    const __m512i sl = _mm512_max_epi64(s, zero), sr = _mm512_max_epi64(_mm512_sub_epi64(zero, s), zero);
    const __m512i f = _mm512_srlv_epi64(_mm512_sllv_epi64(m, sl), sr); /* counts >= 64 give 0 */
    *a = _mm512_add_epi64(*a, _mm512_srli_epi64(f, 30));
    *c = _mm512_add_epi64(*c, _mm512_and_si512(f, _mm512_set1_epi64(0x3FFFFFFF)));
}

static double sum_expf_fixed_avx512(const float *x, size_t n, float shift) {
    const __m512 s = _mm512_set1_ps(shift);
    __m512i a = _mm512_setzero_si512(), c = _mm512_setzero_si512();
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);
        const __m512i e = _mm512_castps_si512(mu_exp_ps512(_mm512_sub_ps(v, s)));
        fixed60_add_avx512(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(e)), &a, &c);
        fixed60_add_avx512(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(e, 1)), &a, &c);
    }
    return fixed60_total((uint64_t)_mm512_reduce_add_epi64(a), (uint64_t)_mm512_reduce_add_epi64(c));
}
#pragma GCC pop_options

static bool has_avx2(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
static bool has_avx512(void) { return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"); }
static bool isa_here(int isa) { return isa == 1 ? has_avx2() : isa == 2 && has_avx512(); }
static int isa_best(void) { return has_avx512() ? 2 : has_avx2() ? 1 : 0; }
#define SUM_VECTOR(f) f
#else
static bool isa_here(int isa) { return (void)isa, false; }
static int isa_best(void) { return 0; }
#define SUM_VECTOR(f) NULL
#endif

typedef double (*sum_fn)(const float *x, size_t n, float shift);
/* [which][isa]: which 0 the 8 lanes' sum, 1 the fixed-point one; isa 0
 * scalar, 1 AVX2, 2 AVX-512 */
static const sum_fn sum_fns[2][3] = {
    {mu_sum_expf_ref, SUM_VECTOR(sum_expf_avx2), SUM_VECTOR(sum_expf_avx512)},
    {mu_sum_expf_fixed_ref, SUM_VECTOR(sum_expf_fixed_avx2), SUM_VECTOR(sum_expf_fixed_avx512)},
};

static bool sum_isa(int which, int isa, const float *x, size_t n, float shift, double *out) {
    if (isa < 1 || isa > 2 || !isa_here(isa)) return false;
    *out = sum_fns[which][isa](x, n, shift);
    return true;
}

bool mu_sum_expf_isa(int isa, const float *x, size_t n, float shift, double *out) {
    return sum_isa(0, isa, x, n, shift, out);
}
double mu_sum_expf(const float *x, size_t n, float shift) { return sum_fns[0][isa_best()](x, n, shift); }
bool mu_sum_expf_fixed_isa(int isa, const float *x, size_t n, float shift, double *out) {
    return sum_isa(1, isa, x, n, shift, out);
}
double mu_sum_expf_fixed(const float *x, size_t n, float shift) { return sum_fns[1][isa_best()](x, n, shift); }

/* ---------- f32 tanh, sigmoid, silu ---------- */

/* Below 0.875 the odd polynomial; above it 1 - 2/(e^2x + 1), whose error
 * shrinks as x grows (measured: <= 1.02 ulp from 0.875 up, 1.8 ulp near 0.55). */
#define TANH_POLY_LIMIT 0.875f
#define TANH_SATURATE 0x1.233334p+3f /* 9.1: tanh rounds to 1 above 9.011 */

/* g(t) ~ (tanh(x) - x) / x^3 with t = x^2 on [0, 0.885^2]; minimax for
 * absolute error (2.9e-10 before rounding the coefficients to f32). */
#define TANH_G0 -0x1.555556p-2f
#define TANH_G1 0x1.11110ap-3f
#define TANH_G2 -0x1.ba18c4p-5f
#define TANH_G3 0x1.661216p-6f
#define TANH_G4 -0x1.1fe3f4p-7f
#define TANH_G5 0x1.b8c95ep-9f
#define TANH_G6 -0x1.1621f2p-10f
#define TANH_G7 0x1.8f3b5ep-13f

float mu_tanhf(float x) {
    if (x != x) return x + x;
    uint32_t bits = f32_to_bits(x);
    uint32_t sign = bits & 0x80000000u;
    float ax = bits_to_f32(bits & 0x7FFFFFFFu);
    if (ax == 0.0f) return x;                       /* keeps the sign of zero */
    if (ax < TANH_POLY_LIMIT) {
        float x2 = x * x;
        float g = fmaf(TANH_G7, x2, TANH_G6);
        g = fmaf(g, x2, TANH_G5);
        g = fmaf(g, x2, TANH_G4);
        g = fmaf(g, x2, TANH_G3);
        g = fmaf(g, x2, TANH_G2);
        g = fmaf(g, x2, TANH_G1);
        g = fmaf(g, x2, TANH_G0);
        return fmaf(x * x2, g, x);                  /* odd: RNE is sign-symmetric */
    }
    float t = 1.0f;
    if (ax <= TANH_SATURATE) t = 1.0f - 2.0f / (mu_expf(2.0f * ax) + 1.0f);
    return bits_to_f32(f32_to_bits(t) | sign);
}

float mu_sigmoidf(float x) { return 1.0f / (1.0f + mu_expf(-x)); }

float mu_siluf(float x) { return x * mu_sigmoidf(x); }

/* ---------- double exp and log ---------- */

#define EXP_MAX_ARG 0x1.62e42fefa39efp+9   /*  709.782712893384 */
#define EXP_MIN_ARG -0x1.74910d52d3051p+9  /* -745.133219101941 */
#define LOG2E 0x1.71547652b82fep+0
/* ln2 = LN2 + LN2_LO to 2^-110; x - n*LN2 is exact for |n| <= 1075. */
#define LN2 0x1.62e42fefa39efp-1
#define LN2_LO 0x1.abc9e3b39803fp-56
#define ROUND_MAGIC 0x1.8p52

double mu_exp(double x) {
    /* 1/(k+1)!: q(r) = (e^r - 1)/r to 14 terms (truncation < 2^-60 at |r| = ln2/2) */
    const double EXP_Q[14] = {
        0x1.0000000000000p+0, 0x1.0000000000000p-1, 0x1.5555555555555p-3,
        0x1.5555555555555p-5, 0x1.1111111111111p-7, 0x1.6c16c16c16c17p-10,
        0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16, 0x1.71de3a556c734p-19,
        0x1.27e4fb7789f5cp-22, 0x1.ae64567f544e4p-26, 0x1.1eed8eff8d898p-29,
        0x1.6124613a86d09p-33, 0x1.93974a8c07c9dp-37,
    };
    if (x != x) return x + x;
    if (x > EXP_MAX_ARG) return bits_to_f64(F64_INF_BITS);
    if (x < EXP_MIN_ARG) return 0.0;
    double n_d = (x * LOG2E + ROUND_MAGIC) - ROUND_MAGIC;
    int64_t n = (int64_t)n_d;
    double r_hi = fma(-n_d, LN2, x);                /* exact */
    /* r = r_hi - n*LN2_LO carried as r + r_lo */
    double t = n_d * LN2_LO, t_err = fma(n_d, LN2_LO, -t);
    double r, r_lo;
    two_sum(r_hi, -t, &r, &r_lo);
    r_lo -= t_err;
    double q = EXP_Q[13];
    for (int i = 12; i >= 0; i--) q = fma(q, r, EXP_Q[i]);
    /* e^(r + r_lo) = 1 + r*q + r_lo*e^r; sum the parts with their errors */
    double u = r * q, u_err = fma(r, q, -u);
    double s = 1.0 + u;
    double s_err = (1.0 - s) + u;                   /* exact: |u| < 1 */
    double p = s + (s_err + (u_err + r_lo * (1.0 + r)));
    return scale_pow2(p, n);
}

#define SQRT2 0x1.6a09e667f3bcdp+0
/* ln2 split with a 41-bit head so k*LN2_HI42 is exact for |k| <= 1075. */
#define LN2_HI42 0x1.62e42fefa3800p-1
#define LN2_LO42 0x1.ef35793c76730p-45

double mu_log(double x) {
    /* 2/(2k+1), k = 1..11: log((1+s)/(1-s)) = 2s + s*R(s^2), R(z) = sum of
     * 2 z^k/(2k+1). With |s| <= 0.1716, z <= 0.0295, truncation < 2^-60. */
    const double LOG_R[11] = {
        0x1.5555555555555p-1, 0x1.999999999999ap-2, 0x1.2492492492492p-2,
        0x1.c71c71c71c71cp-3, 0x1.745d1745d1746p-3, 0x1.3b13b13b13b14p-3,
        0x1.1111111111111p-3, 0x1.e1e1e1e1e1e1ep-4, 0x1.af286bca1af28p-4,
        0x1.8618618618618p-4, 0x1.642c8590b2164p-4,
    };
    if (x != x) return x + x;
    if (x < 0.0) return bits_to_f64(F64_QNAN_BITS);
    if (x == 0.0) return -bits_to_f64(F64_INF_BITS);
    uint64_t bits = f64_to_bits(x);
    if (bits == F64_INF_BITS) return x;
    int64_t k = 0;
    if (bits < 0x0010000000000000ull) {             /* subnormal: normalize */
        x *= 0x1p54;
        bits = f64_to_bits(x);
        k = -54;
    }
    k += (int64_t)(bits >> 52) - 1023;
    double m = bits_to_f64((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
    if (m > SQRT2) { m *= 0.5; k += 1; }           /* m in (sqrt2/2, sqrt2] */
    /* log(1+f) = f - (hfsq - s*(hfsq + R)), s = f/(2+f), hfsq = f^2/2 */
    double f = m - 1.0;                             /* exact (Sterbenz) */
    double hfsq = 0.5 * f * f;
    double s = f / (2.0 + f);
    double z = s * s;
    double R = LOG_R[10];
    for (int i = 9; i >= 0; i--) R = fma(R, z, LOG_R[i]);
    R = R * z;
    double kd = (double)k;
    return kd * LN2_HI42 - ((hfsq - (s * (hfsq + R) + kd * LN2_LO42)) - f);
}

double mu_pow(double base, double e) { return mu_exp(e * mu_log(base)); }

/* ---------- double sin and cos ---------- */

#define TWO_OVER_PI 0x1.45f306dc9c883p-1
/* pi/2 = PIO2_1 + PIO2_2 + PIO2_3 to 2^-163. x - n*PIO2_1 is exact. */
#define PIO2_1 0x1.921fb54442d18p+0
#define PIO2_2 0x1.1a62633145c07p-54
#define PIO2_3 -0x1.f1976b7ed8fbcp-110
/* Supported domain |x| < 2^30: there n*PIO2_1 leaves an exactly
 * representable remainder and the reduced argument stays within
 * pi/4 + 2^-21. Larger arguments (never needed for RoPE tables) give NaN. */
#define TRIG_MAX_ARG 0x1p30

/* Kernels for the reduced range |y| <= pi/4 + 2^-21, where the Taylor
 * series below ((-1)^k/(2k+1)!, k = 1..10; (-1)^k/(2k)!, k = 2..11)
 * truncate below 2^-70. */

/* sin(y + y_lo), |y_lo| <= ulp(y). */
static double sin_kernel(double y, double y_lo) {
    const double SIN_S[10] = {
        -0x1.5555555555555p-3, 0x1.1111111111111p-7, -0x1.a01a01a01a01ap-13,
        0x1.71de3a556c734p-19, -0x1.ae64567f544e4p-26, 0x1.6124613a86d09p-33,
        -0x1.ae7f3e733b81fp-41, 0x1.952c77030ad4ap-49, -0x1.2f49b46814157p-57,
        0x1.71b8ef6dcf572p-66,
    };
    double z = y * y;
    double S = SIN_S[9];
    for (int i = 8; i >= 0; i--) S = fma(S, z, SIN_S[i]);
    /* sin(y + y_lo) ~ y + y^3 S(z) + y_lo (1 - z/2) */
    return y + (y * z * S + y_lo * (1.0 - 0.5 * z));
}

/* cos(y + y_lo), with the rounding error of 1 - y^2/2 recovered. */
static double cos_kernel(double y, double y_lo) {
    const double COS_C[10] = {
        0x1.5555555555555p-5, -0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-16,
        -0x1.27e4fb7789f5cp-22, 0x1.1eed8eff8d898p-29, -0x1.93974a8c07c9dp-37,
        0x1.ae7f3e733b81fp-45, -0x1.6827863b97d97p-53, 0x1.e542ba4020225p-62,
        -0x1.0ce396db7f853p-70,
    };
    double z = y * y, z_err = fma(y, y, -z);
    double C = COS_C[9];
    for (int i = 8; i >= 0; i--) C = fma(C, z, COS_C[i]);
    double hz = 0.5 * z;
    double w = 1.0 - hz;
    double w_err = (1.0 - w) - hz;                  /* exact: w in [0.5, 1] */
    return w + ((w_err - 0.5 * z_err) + (z * z * C - y * y_lo));
}

/* x = n*pi/2 + (*y + *y_lo), returns n mod 4. Needs |x| < TRIG_MAX_ARG. */
static int reduce_pio2(double x, double *y, double *y_lo) {
    double n_d = (x * TWO_OVER_PI + ROUND_MAGIC) - ROUND_MAGIC;
    double r1 = fma(-n_d, PIO2_1, x);               /* exact */
    double t = n_d * PIO2_2, t_err = fma(n_d, PIO2_2, -t);
    double hi, lo;
    two_sum(r1, -t, &hi, &lo);
    lo -= t_err + n_d * PIO2_3;
    two_sum(hi, lo, y, y_lo);
    return (int)((int64_t)n_d & 3);
}

static double trig(double x, int want_cos) {
    if (x != x) return x + x;
    uint64_t abs_bits = f64_to_bits(x) & 0x7FFFFFFFFFFFFFFFull;
    if (abs_bits >= F64_INF_BITS) return bits_to_f64(F64_QNAN_BITS);
    double ax = bits_to_f64(abs_bits);
    if (ax >= TRIG_MAX_ARG) return bits_to_f64(F64_QNAN_BITS); /* outside the supported domain */
    if (ax < 0x1p-27) return want_cos ? 1.0 : x;    /* keeps sin(-0) = -0 */
    double y = x, y_lo = 0.0;
    int quadrant = 0;
    if (ax > 0x1.921fb54442d18p-1) quadrant = reduce_pio2(x, &y, &y_lo); /* pi/4 */
    quadrant = (quadrant + want_cos) & 3;           /* cos x = sin(x + pi/2) */
    switch (quadrant) {
    case 0: return sin_kernel(y, y_lo);
    case 1: return cos_kernel(y, y_lo);
    case 2: return -sin_kernel(y, y_lo);
    default: return -cos_kernel(y, y_lo);
    }
}

double mu_sin(double x) { return trig(x, 0); }
double mu_cos(double x) { return trig(x, 1); }
