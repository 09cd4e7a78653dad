/* mu_expf on 8 lanes (AVX2 + FMA): the same reduction, polynomial and
 * scaling as src/util/mumath.c, specials by mask, so every lane returns
 * mu_expf's bits. Shared by the AVX2 backend (src/backend/cpu/cpu_avx2.c)
 * and mu_sum_expf (src/util/mumath.c); include only after a
 * `#pragma GCC target("avx2,fma...")` line. */
#ifndef MUSER_MUMATH_AVX2_H
#define MUSER_MUMATH_AVX2_H
#include <immintrin.h>
#include <math.h>

static inline __m256 mu_pow2_ps(__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}

static inline __m256 mu_exp_ps(__m256 x) {
    const __m256 magic = _mm256_set1_ps(0x1.8p23f);
    __m256 nf = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(0x1.715476p+0f)), magic), magic);
    __m256i n = _mm256_cvttps_epi32(nf);
    __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(0x1.62e430p-1f), x);
    r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(-0x1.05c610p-29f), r);
    __m256 q = _mm256_fmadd_ps(_mm256_set1_ps(0x1.6da798p-10f), r, _mm256_set1_ps(0x1.123db2p-7f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1.555470p-5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0x1.55547cp-3f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    __m256 p = _mm256_fmadd_ps(r, q, _mm256_set1_ps(1.0f));
    __m256 y = _mm256_mul_ps(p, mu_pow2_ps(n));
    __m256i over = _mm256_cmpgt_epi32(n, _mm256_set1_epi32(127));
    __m256i under = _mm256_cmpgt_epi32(_mm256_set1_epi32(-126), n);
    if (!_mm256_testz_si256(_mm256_or_si256(over, under), _mm256_or_si256(over, under))) {
        __m256 yo = _mm256_mul_ps(_mm256_mul_ps(p, mu_pow2_ps(_mm256_sub_epi32(n, _mm256_set1_epi32(1)))), _mm256_set1_ps(2.0f));
        __m256 yu = _mm256_mul_ps(_mm256_mul_ps(p, mu_pow2_ps(_mm256_add_epi32(n, _mm256_set1_epi32(100)))),
                                  _mm256_set1_ps(0x1p-100f));
        y = _mm256_blendv_ps(y, yo, _mm256_castsi256_ps(over));
        y = _mm256_blendv_ps(y, yu, _mm256_castsi256_ps(under));
    }
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-0x1.9fe368p+6f), _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(0x1.62e42ep+6f), _CMP_GT_OQ));
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

#endif
