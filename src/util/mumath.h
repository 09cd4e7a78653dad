/* The engine's own transcendental functions. libm (and CUDA's math library)
 * are not correctly rounded and differ between implementations, so every
 * numerics path uses these: fixed range reduction, fixed polynomial, every
 * fused multiply-add written as fmaf/fma (compiled with -ffp-contract=off).
 * The same source compiles for CUDA device code later. */
#ifndef MUSER_MUMATH_H
#define MUSER_MUMATH_H
#include <stdbool.h>
#include <stddef.h>

/* exp(x) for f32; < 2 ulp over the finite range; exp(-inf) = 0, overflow -> inf, NaN -> NaN. */
float mu_expf(float x);
/* sum over i of (double)mu_expf(x[i] - shift), in 8 double lanes (lane
 * i mod 8, each in index order) folded (0+4, 2+6), (1+5, 3+7) at the end.
 * Vectorized where the CPU has AVX-512 or AVX2 and FMA; mu_sum_expf_ref is
 * the scalar twin, the same bits (tests/test_mumath.c). */
double mu_sum_expf(const float *x, size_t n, float shift);
double mu_sum_expf_ref(const float *x, size_t n, float shift);
/* One vector path alone (tests): isa 1 AVX2+FMA, 2 AVX-512; false where
 * this CPU or build has none. */
bool mu_sum_expf_isa(int isa, const float *x, size_t n, float shift, double *out);
/* The same sum with every term mu_expf(x[i] - shift) cut down to a
 * multiple of 2^-60 (its integer part in units of 2^-60) and the terms
 * added as integers, exactly, the total rounded once to double (mumath.c
 * fixed60, fixed60_total): one result whatever the order of the additions, so a
 * GPU adds it as a tree and a CPU in lanes (the token trees' row sums,
 * src/spec/spec_tree.c). Needs every term <= 1 (shift >= max x[i]) and
 * n < 2^23. _ref is the scalar twin; _isa one vector path, as above. */
double mu_sum_expf_fixed(const float *x, size_t n, float shift);
double mu_sum_expf_fixed_ref(const float *x, size_t n, float shift);
bool mu_sum_expf_fixed_isa(int isa, const float *x, size_t n, float shift, double *out);
/* tanh via mu_expf with a small-|x| polynomial branch; odd, |result| <= 1. */
float mu_tanhf(float x);
/* 1 / (1 + mu_expf(-x)). */
float mu_sigmoidf(float x);
/* x * mu_sigmoidf(x). */
float mu_siluf(float x);
/* Double-precision sin/cos/exp/log used only to build tables on the CPU
 * (RoPE frequencies and angles); results rounded to f32 by the caller.
 * About 1 ulp; mu_sin/mu_cos support |x| < 2^30 and return NaN beyond. */
double mu_sin(double x);
double mu_cos(double x);
double mu_exp(double x);
double mu_log(double x);
/* base^e for base > 0 via mu_exp(e * mu_log(base)). */
double mu_pow(double base, double e);

#endif
