/* mu_expf on 16 lanes (AVX-512F): the same reduction, polynomial and
 * scaling as src/util/mumath.c, specials by mask, so every lane returns
 * mu_expf's bits. Shared by the AVX-512 backend (src/backend/cpu/cpu_avx512.c)
 * and mu_sum_expf (src/util/mumath.c); include only after a
 * `#pragma GCC target("avx512f,...")` line. */
#ifndef MUSER_MUMATH_AVX512_H
#define MUSER_MUMATH_AVX512_H
#include <immintrin.h>
#include <math.h>

static inline __m512 mu_pow2_ps512(__m512i e) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
}

static inline __m512 mu_exp_ps512(__m512 x) {
    const __m512 magic = _mm512_set1_ps(0x1.8p23f);
    __m512 nf = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(0x1.715476p+0f)), magic), magic);
    __m512i n = _mm512_cvttps_epi32(nf);
    __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(0x1.62e430p-1f), x);
    r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(-0x1.05c610p-29f), r);
    __m512 q = _mm512_fmadd_ps(_mm512_set1_ps(0x1.6da798p-10f), r, _mm512_set1_ps(0x1.123db2p-7f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0x1.555470p-5f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0x1.55547cp-3f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    __m512 p = _mm512_fmadd_ps(r, q, _mm512_set1_ps(1.0f));
    __m512 y = _mm512_mul_ps(p, mu_pow2_ps512(n));
    __mmask16 over = _mm512_cmpgt_epi32_mask(n, _mm512_set1_epi32(127));
    __mmask16 under = _mm512_cmplt_epi32_mask(n, _mm512_set1_epi32(-126));
    if (over | under) {
        __m512 yo = _mm512_mul_ps(_mm512_mul_ps(p, mu_pow2_ps512(_mm512_sub_epi32(n, _mm512_set1_epi32(1)))), _mm512_set1_ps(2.0f));
        __m512 yu = _mm512_mul_ps(_mm512_mul_ps(p, mu_pow2_ps512(_mm512_add_epi32(n, _mm512_set1_epi32(100)))),
                                  _mm512_set1_ps(0x1p-100f));
        y = _mm512_mask_mov_ps(y, over, yo);
        y = _mm512_mask_mov_ps(y, under, yu);
    }
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-0x1.9fe368p+6f), _CMP_LT_OQ), _mm512_setzero_ps());
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(0x1.62e42ep+6f), _CMP_GT_OQ),
                           _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_add_ps(x, x));
}

#endif
