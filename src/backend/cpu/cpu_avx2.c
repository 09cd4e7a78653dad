/* AVX2 + FMA + F16C kernels, compiled for that target only and called
 * only after the CPUID check in cpu_backend.c. The fallback for x86-64
 * CPUs without AVX-512: each 256-value block's f_b is computed like the
 * ref's dot_q8k (integer sums with maddubs/madd, then the written float
 * formula), so its structure mirrors the dot_q8k functions of src/quant.
 *
 * Float dots keep the canonical 32 lanes in four ymm registers (lanes 0-7,
 * 8-15, 16-23, 24-31) and fold them 16, 8, 4, 2, 1; exp/tanh/sigmoid are
 * lane-wise transcriptions of src/util/mumath.c. Activations use the
 * natural Q8_K layout. */
#include "backend/cpu/cpu_simd_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "backend/cpu/cpu_avx2.h"
#include "backend/cpu/cpu_repack.h"
#include "util/mumath_avx2.h"

/* ======================================================== helpers */

static inline float f16_at(const uint8_t *p) { return _cvtsh_ss(qi_rd16(p)); }

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i loadu(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* sum of u8 x s8 products, pairs then quads, as int32 lanes */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

static inline __m256i e2m1_u12(__m256i codes) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)CPU_E2M1_U12));
    return _mm256_shuffle_epi8(lut, codes);
}

/* ======================================================== Q8_K quantizer */

static inline __m256 round_f16_ps(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static void quantize_block(const float *src, mu_block_q8k *y, bool via_f16) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[32];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 32; i++) {
        v[i] = _mm256_loadu_ps(src + 8 * i);
        if (via_f16) v[i] = round_f16_ps(v[i]);
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), amax); /* NaN keeps amax, as `a > amax` */
    }
    float t[8];
    _mm256_storeu_ps(t, amax);
    float am = 0.0f;
    for (int i = 0; i < 8; i++) am = t[i] > am ? t[i] : am;
    if (am == 0.0f) {
        memset(y, 0, sizeof *y);
        return;
    }
    float max = 0.0f;
    const __m256 amv = _mm256_set1_ps(am);
    for (int i = 0; i < 32; i++) {
        int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v[i]), amv, _CMP_EQ_OQ));
        if (k) {
            _mm256_storeu_ps(t, v[i]);
            max = t[__builtin_ctz((unsigned)k)];
            break;
        }
    }
    const float iscale = -127.0f / max;
    const __m256 is = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
    const __m256i mant = _mm256_set1_epi32(0x7FFFFF), bias = _mm256_set1_epi32(0x400000);
    int32_t q[MU_QK_K];
    for (int i = 0; i < 32; i++) {
        __m256i r = _mm256_castps_si256(_mm256_fmadd_ps(is, v[i], magic));
        r = _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(r, mant), bias), _mm256_set1_epi32(127));
        _mm256_storeu_si256((__m256i *)(q + 8 * i), r);
    }
    for (int k = 0; k < 16; k++) {
        int32_t s = 0;
        for (int i = 16 * k; i < 16 * k + 16; i++) {
            y->qs[i] = (int8_t)q[i];
            s += q[i];
        }
        y->bsums[k] = (int16_t)s;
    }
    y->d = 1.0f / iscale;
}

static size_t avx2_act_bytes(const mu_weight *w, int64_t rows) {
    return (size_t)(rows * (w->n_in / MU_QK_K)) * sizeof(mu_block_q8k);
}

static void avx2_quantize_rows(const mu_weight *w, const float *x, int64_t r0, int64_t r1, int64_t rows, void *act) {
    (void)rows;
    bool via_f16 = false;
    mu_weight_uses_q8k(w, &via_f16);
    const int64_t nb = w->n_in / MU_QK_K;
    mu_block_q8k *xq = act;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t b = 0; b < nb; b++) quantize_block(x + r * w->n_in + b * MU_QK_K, xq + r * nb + b, via_f16);
}

/* ======================================================== block dots (f_b) */

static inline int32_t kq_summ(uint64_t mn, const mu_block_q8k *x) {
    __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)mn));
    __m128i bs = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)x->bsums), _mm_loadu_si128((const __m128i *)(x->bsums + 8)));
    __m128i s = _mm_madd_epi16(mins, bs);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Q4_K (five = false) / Q5_K: f_b = (d*xd)*sumi - (dmin*xd)*summ */
static inline float kq_dot(const uint8_t *blk, const mu_block_q8k *x, bool five) {
    uint64_t sc, mn;
    cpu_kq_scales(blk + QK_SCALES, &sc, &mn);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t *qs = blk + (five ? Q5_K_QS : Q4_K_QS);
    const __m256i qh = five ? loadu(blk + Q5_K_QH) : _mm256_setzero_si256();
    __m256i acc = _mm256_setzero_si256();
    for (int g = 0; g < 4; g++) {
        __m256i q = loadu(qs + 32 * g);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (five) {
            __m256i blo = _mm256_set1_epi8((char)(1 << (2 * g))), bhi = _mm256_set1_epi8((char)(2 << (2 * g)));
            __m256i sixteen = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, blo), blo), sixteen));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bhi), bhi), sixteen));
        }
        __m256i plo = _mm256_maddubs_epi16(lo, loadu(x->qs + 64 * g));
        __m256i phi = _mm256_maddubs_epi16(hi, loadu(x->qs + 64 * g + 32));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_set1_epi16((short)((sc >> (16 * g)) & 0xFF))));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, _mm256_set1_epi16((short)((sc >> (16 * g + 8)) & 0xFF))));
    }
    const int32_t sumi = hsum_epi32(acc), summ = kq_summ(mn, x);
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    return (d * x->d) * (float)sumi - (dmin * x->d) * (float)summ;
}

static float q4k_dot(const uint8_t *blk, const mu_block_q8k *x) { return kq_dot(blk, x, false); }
static float q5k_dot(const uint8_t *blk, const mu_block_q8k *x) { return kq_dot(blk, x, true); }

/* Q6_K: sumi = sum_s sc_s * sum (u - 32) x; f_b = (d*xd)*sumi */
static float q6k_dot(const uint8_t *blk, const mu_block_q8k *x) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    const int8_t *sc = (const int8_t *)(blk + Q6_K_SC);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i l0 = loadu(blk + 64 * h), l1 = loadu(blk + 64 * h + 32), hb = loadu(blk + Q6_K_QH + 32 * h);
        __m256i c[4];
        c[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
        c[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
        c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
        c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
        for (int k = 0; k < 4; k++) {
            const int s = 8 * h + 2 * k; /* sub-blocks s (low 128 bits) and s + 1 */
            __m256i p = _mm256_maddubs_epi16(c[k], loadu(x->qs + 128 * h + 32 * k));
            __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scv));
        }
    }
    __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)), loadu(x->bsums));
    const int32_t sumi = hsum_epi32(acc) - 32 * hsum_epi32(corr);
    return (f16_at(blk + Q6_K_D) * x->d) * (float)sumi;
}

/* Q8_0: acc = sum_j (d_j*xd)*isum_j; signed x signed via |w| and sign(x, w) */
static float q8_0_dot(const uint8_t *blk, const mu_block_q8k *x) {
    float acc = 0.0f;
    for (int j = 0; j < 8; j++, blk += Q8_0_BYTES) {
        __m256i w = loadu(blk + Q8_0_QS), xv = loadu(x->qs + 32 * j);
        int32_t isum = hsum_epi32(dot_u8s8(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)));
        acc = acc + (f16_at(blk) * x->d) * (float)isum;
    }
    return acc;
}

/* Q4_0: codes = nibble - 8, isum = sum(nibble * x) - 8 * sum(x) */
static float q4_0_dot(const uint8_t *blk, const mu_block_q8k *x) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    float acc = 0.0f;
    for (int j = 0; j < 8; j++, blk += Q4_0_BYTES) {
        __m128i q = _mm_loadu_si128((const __m128i *)(blk + Q4_0_QS));
        __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
        int32_t isum = hsum_epi32(dot_u8s8(nib, loadu(x->qs + 32 * j))) - 8 * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
        acc = acc + (f16_at(blk) * x->d) * (float)isum;
    }
    return acc;
}

/* 16 groups of 16 codes (natural order, e2m1 + 12) against x: itotal with q9 scales */
static inline int64_t nvfp4_itotal(const __m256i *u, const mu_block_q8k *x, const int32_t *q9) {
    int32_t g[64];
    for (int k = 0; k < 8; k++) _mm256_storeu_si256((__m256i *)(g + 8 * k), dot_u8s8(u[k], loadu(x->qs + 32 * k)));
    int64_t itotal = 0;
    for (int grp = 0; grp < 16; grp++) {
        int32_t dot = g[4 * grp] + g[4 * grp + 1] + g[4 * grp + 2] + g[4 * grp + 3] - 12 * x->bsums[grp];
        itotal += (int64_t)dot * q9[grp];
    }
    return itotal;
}

/* ggml type 40: qs[8s+j] = value 16s+j (low) | 16s+8+j (high) */
static float nvfp4g_dot(const uint8_t *blk, const mu_block_q8k *x) {
    const cpu_scale_tables *tab = cpu_tables();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i u[8];
    int32_t q9[16];
    for (int c = 0; c < 4; c++, blk += NVFP4G_BYTES) {
        __m256i q = loadu(blk + NVFP4G_QS);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        __m256i g02 = _mm256_unpacklo_epi64(lo, hi), g13 = _mm256_unpackhi_epi64(lo, hi);
        u[2 * c] = e2m1_u12(_mm256_permute2x128_si256(g02, g13, 0x20));
        u[2 * c + 1] = e2m1_u12(_mm256_permute2x128_si256(g02, g13, 0x31));
        for (int s = 0; s < 4; s++) q9[4 * c + s] = tab->ue4m3_q9[blk[s]];
    }
    return ((float)nvfp4_itotal(u, x, q9) * 0x1p-10f) * x->d;
}

/* native: byte p = value 2p (low) | 2p+1 (high); f_b without scale2 */
static float nvfp4n_dot(const uint8_t *pay, const uint8_t *scl, const mu_block_q8k *x) {
    const cpu_scale_tables *tab = cpu_tables();
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i u[8];
    int32_t q9[16];
    for (int c = 0; c < 4; c++) {
        __m256i p = loadu(pay + 32 * c);
        __m256i lo = _mm256_and_si256(p, m4), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), m4);
        __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
        u[2 * c] = e2m1_u12(_mm256_permute2x128_si256(a, b, 0x20));
        u[2 * c + 1] = e2m1_u12(_mm256_permute2x128_si256(a, b, 0x31));
    }
    for (int g = 0; g < 16; g++) q9[g] = tab->e4m3_q9[scl[g]];
    return ((float)nvfp4_itotal(u, x, q9) * 0x1p-10f) * x->d;
}

typedef float (*block_dot_fn)(const uint8_t *blk, const mu_block_q8k *x);

static block_dot_fn dot_for(const mu_weight *w) {
    switch (w->type) {
    case MU_TYPE_Q4_K: return q4k_dot;
    case MU_TYPE_Q5_K: return q5k_dot;
    case MU_TYPE_Q6_K: return q6k_dot;
    case MU_TYPE_Q8_0: return q8_0_dot;
    case MU_TYPE_Q4_0: return q4_0_dot;
    case MU_TYPE_NVFP4: return nvfp4g_dot;
    default: return NULL;
    }
}

static bool avx2_q_supported(const mu_weight *w) {
    if (!mu_weight_uses_q8k(w, NULL)) return false;
    return cpu_is_native(w) || dot_for(w) != NULL;
}

/* Weight row outer, activation rows inner: a row is read from memory once
 * and from L1 for the other activation rows. */
static void avx2_qmatmul(const mu_weight *w, int64_t o0, int64_t o1, const void *act, int64_t rows, float *y) {
    const int64_t nb = w->n_in / MU_QK_K;
    const mu_block_q8k *xq = act;
    if (w->layout == MU_LAYOUT_X8) { /* o0 is a multiple of 16 (cpu_backend.c's split) */
        const int64_t split = o1 < mu_cpu_pack_rows(w, 8) ? o1 : mu_cpu_pack_rows(w, 8);
        if (o0 < split) mu_cpu_avx2_x8_matmul(w, o0, split, xq, rows, y);
        if (split >= o1) return;
        o0 = split > o0 ? split : o0; /* the rows past the last group keep the GGUF layout */
    }
    if (cpu_is_native(w)) {
        for (int64_t o = o0; o < o1; o++) {
            const uint8_t *pay = w->data + o * (w->n_in / 2), *scl = w->nvfp4_scales + o * (w->n_in / 16);
            for (int64_t r = 0; r < rows; r++) {
                float total = 0.0f;
                for (int64_t b = 0; b < nb; b++) {
                    float f = nvfp4n_dot(pay + b * (MU_QK_K / 2), scl + b * 16, xq + r * nb + b);
                    f = f * w->scale;
                    total = total + f;
                }
                y[r * w->n_out + o] = mu_round_f16(total);
            }
        }
        return;
    }
    const block_dot_fn dot = dot_for(w);
    const uint64_t bytes_per_256 = w->row_bytes / (uint64_t)nb;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = w->data + (uint64_t)o * w->row_bytes;
        for (int64_t r = 0; r < rows; r++) {
            float total = 0.0f;
            for (int64_t b = 0; b < nb; b++) total = total + dot(row + (uint64_t)b * bytes_per_256, xq + r * nb + b);
            if (w->has_scale) total = total * w->scale;
            y[r * w->n_out + o] = total;
        }
    }
}

/* ======================================================== float dots */

/* p[0..31] in four registers (lanes 0-7, 8-15, 16-23, 24-31), folded
 * h = 16, 8, 4, 2, 1: p[l] = p[l] + p[l+h] */
static inline float fold32(const __m256 *p) {
    __m256 q0 = _mm256_add_ps(p[0], p[2]), q1 = _mm256_add_ps(p[1], p[3]);
    __m256 r = _mm256_add_ps(q0, q1);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    __m128 t2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

static inline __m256 load_w8(const uint8_t *p, uint32_t type) {
    if (type == MU_TYPE_F32) return _mm256_loadu_ps((const float *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (type == MU_TYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* One weight row (F32/F16/BF16 or, with type F32, an f32 vector) against
 * one f32 vector, canonical order. The tail goes through a zero-padded
 * copy and only the live lanes take the FMA. */
static float fdot(const uint8_t *w, uint32_t type, const float *x, int64_t n) {
    const int64_t esz = type == MU_TYPE_F32 ? 4 : 2;
    __m256 p[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            p[k] = _mm256_fmadd_ps(load_w8(w + (i + 8 * k) * esz, type), _mm256_loadu_ps(x + i + 8 * k), p[k]);
    if (i < n) {
        uint8_t wt[128] = {0};
        float xt[32] = {0};
        memcpy(wt, w + i * esz, (size_t)((n - i) * esz));
        memcpy(xt, x + i, (size_t)(n - i) * sizeof(float));
        for (int k = 0; k < 4; k++) {
            __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(8 * k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane));
            __m256 f = _mm256_fmadd_ps(load_w8(wt + 8 * k * esz, type), _mm256_loadu_ps(xt + 8 * k), p[k]);
            p[k] = _mm256_blendv_ps(p[k], f, live);
        }
    }
    return fold32(p);
}

static float dot_f32(const float *a, const float *b, int64_t n) { return fdot((const uint8_t *)a, MU_TYPE_F32, b, n); }

static float sumsq_f32(const float *a, int64_t n) { return fdot((const uint8_t *)a, MU_TYPE_F32, a, n); }

static void avx2_fmatmul(const mu_weight *w, int64_t o0, int64_t o1, const float *x, int64_t rows, float *y) {
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *row = w->data + (uint64_t)o * w->row_bytes;
        for (int64_t r = 0; r < rows; r++) {
            float v = fdot(row, w->type, x + r * w->n_in, w->n_in);
            if (w->has_scale) v = v * w->scale;
            y[r * w->n_out + o] = v;
        }
    }
}

/* ======================================================== mumath, lane-wise */

static inline __m256 neg_ps(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }

static inline __m256 sigmoid_ps(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, mu_exp_ps(neg_ps(x))));
}

static inline __m256 tanh_ps(__m256 x) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 sign = _mm256_and_ps(x, sign_bit), ax = _mm256_andnot_ps(sign_bit, x);
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 g = _mm256_fmadd_ps(_mm256_set1_ps(0x1.8f3b5ep-13f), x2, _mm256_set1_ps(-0x1.1621f2p-10f));
    g = _mm256_fmadd_ps(g, x2, _mm256_set1_ps(0x1.b8c95ep-9f));
    g = _mm256_fmadd_ps(g, x2, _mm256_set1_ps(-0x1.1fe3f4p-7f));
    g = _mm256_fmadd_ps(g, x2, _mm256_set1_ps(0x1.661216p-6f));
    g = _mm256_fmadd_ps(g, x2, _mm256_set1_ps(-0x1.ba18c4p-5f));
    g = _mm256_fmadd_ps(g, x2, _mm256_set1_ps(0x1.11110ap-3f));
    g = _mm256_fmadd_ps(g, x2, _mm256_set1_ps(-0x1.555556p-2f));
    __m256 poly = _mm256_fmadd_ps(_mm256_mul_ps(x, x2), g, x);
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(mu_exp_ps(_mm256_mul_ps(two, ax)), one)));
    t = _mm256_blendv_ps(t, one, _mm256_cmp_ps(ax, _mm256_set1_ps(0x1.233334p+3f), _CMP_GT_OQ));
    __m256 y = _mm256_blendv_ps(_mm256_or_ps(t, sign), poly, _mm256_cmp_ps(ax, _mm256_set1_ps(0.875f), _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(ax, _mm256_setzero_ps(), _CMP_EQ_OQ));
    return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* ======================================================== elementwise ops */

static void avx2_sigmoid_gate(float *x, const float *g, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sigmoid_ps(_mm256_loadu_ps(g + i))));
    if (i < n) {
        float a[8] = {0}, b[8] = {0};
        memcpy(a, x + i, (size_t)(n - i) * 4);
        memcpy(b, g + i, (size_t)(n - i) * 4);
        _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_loadu_ps(a), sigmoid_ps(_mm256_loadu_ps(b))));
        memcpy(x + i, a, (size_t)(n - i) * 4);
    }
}

static inline __m256 swiglu_ps(__m256 g, __m256 u) { return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid_ps(g)), u); }

static void avx2_swiglu(float *gate, const float *up, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(gate + i, swiglu_ps(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
    if (i < n) {
        float a[8] = {0}, b[8] = {0};
        memcpy(a, gate + i, (size_t)(n - i) * 4);
        memcpy(b, up + i, (size_t)(n - i) * 4);
        _mm256_storeu_ps(a, swiglu_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b)));
        memcpy(gate + i, a, (size_t)(n - i) * 4);
    }
}

static void avx2_add(float *x, const float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) x[i] = x[i] + y[i];
}

static inline __m256 tail_ps(__m256 v, __m256 s, __m256 c, bool capped) {
    v = _mm256_mul_ps(v, s);
    return capped ? _mm256_mul_ps(tanh_ps(_mm256_div_ps(v, c)), c) : v;
}

static void avx2_logit_tail(float *l, float scale, float cap, int64_t n) {
    const __m256 s = _mm256_set1_ps(scale), c = _mm256_set1_ps(cap);
    const bool capped = cap > 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(l + i, tail_ps(_mm256_loadu_ps(l + i), s, c, capped));
    if (i < n) {
        float a[8] = {0};
        memcpy(a, l + i, (size_t)(n - i) * 4);
        _mm256_storeu_ps(a, tail_ps(_mm256_loadu_ps(a), s, c, capped));
        memcpy(l + i, a, (size_t)(n - i) * 4);
    }
}

static void avx2_rmsnorm_row(const float *x, const float *w, float eps, float *y, int64_t n) {
    float mean = sumsq_f32(x, n) / (float)n;
    const float inv = 1.0f / sqrtf(mean + eps);
    const __m256 iv = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), iv);
        if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
        _mm256_storeu_ps(y + i, v);
    }
    for (; i < n; i++) y[i] = w ? (x[i] * inv) * w[i] : x[i] * inv;
}

static void avx2_rope_row(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs) {
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        int64_t i = 0;
        for (; i + 8 <= n_rot; i += 8) {
            __m256 a = _mm256_loadu_ps(v + i), t = _mm256_loadu_ps(cs + i);
            __m256 c = _mm256_moveldup_ps(t), s = _mm256_movehdup_ps(t);
            __m256 ac = _mm256_mul_ps(a, c), ss = _mm256_mul_ps(_mm256_permute_ps(a, 0xB1), s);
            _mm256_storeu_ps(v + i, _mm256_blend_ps(_mm256_sub_ps(ac, ss), _mm256_add_ps(ss, ac), 0xAA));
        }
        for (; i < n_rot; i += 2) {
            float c = cs[i], s = cs[i + 1], x0 = v[i], x1 = v[i + 1];
            v[i] = x0 * c - x1 * s;
            v[i + 1] = x0 * s + x1 * c;
        }
    }
}

/* ======================================================== attention */

static inline void f16_row_to_f32(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

/* Two keys' scores for one head (n a multiple of 32): fdot's canonical
 * order for both at once, each q load shared. */
static inline void dot2_f32(const float *q, const float *k0, const float *k1, int64_t n, float *s0, float *s1) {
    __m256 a[4], b[4];
    for (int k = 0; k < 4; k++) a[k] = b[k] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 32)
        for (int k = 0; k < 4; k++) {
            const __m256 qv = _mm256_loadu_ps(q + i + 8 * k);
            a[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i + 8 * k), a[k]);
            b[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + i + 8 * k), b[k]);
        }
    *s0 = fold32(a);
    *s1 = fold32(b);
}

/* P.V: acc[g][d] = fmaf(e_p[g], v_p[d], acc[g][d]) with keys ascending,
 * as the reference, but with the accumulators in registers: one 8-wide
 * slice of the head dimension for up to PV_HEADS heads at a time, keys in
 * passes of PV_PASS that continue the stored accumulators (a pass's V rows,
 * 64 x 256 bytes at head_dim 128, stay in L1 over all the slices). */
#define PV_PASS 64
#define PV_HEADS 8
static void pv_passes(const uint16_t *const *vrows, int64_t n, const float *e, int64_t ss, int64_t G, int64_t D,
                      float *acc) {
    for (int64_t p0 = 0; p0 < n; p0 += PV_PASS) {
        const int64_t np = n - p0 < PV_PASS ? n - p0 : PV_PASS;
        const uint16_t *const *vrow = vrows + p0;
        for (int64_t g0 = 0; g0 < G; g0 += PV_HEADS) {
            const int64_t gc = G - g0 < PV_HEADS ? G - g0 : PV_HEADS;
            int64_t d0 = 0;
            for (; d0 + 8 <= D; d0 += 8) {
                __m256 r[PV_HEADS];
#pragma GCC unroll 8
                for (int g = 0; g < PV_HEADS; g++)
                    r[g] = p0 == 0 || g >= gc ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (g0 + g) * D + d0);
                for (int64_t p = 0; p < np; p++) {
                    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vrow[p] + d0)));
                    const float *ep = e + g0 * ss + p0 + p;
#pragma GCC unroll 8
                    for (int g = 0; g < PV_HEADS; g++)
                        r[g] = _mm256_fmadd_ps(_mm256_set1_ps(ep[(g < gc ? g : 0) * ss]), v, r[g]);
                }
#pragma GCC unroll 8
                for (int g = 0; g < PV_HEADS; g++)
                    if (g < gc) _mm256_storeu_ps(acc + (g0 + g) * D + d0, r[g]);
            }
            for (; d0 < D; d0++) /* a head_dim that is not a multiple of 8 */
                for (int64_t g = g0; g < g0 + gc; g++) {
                    float t = p0 == 0 ? 0.0f : acc[g * D + d0];
                    for (int64_t p = 0; p < np; p++) t = fmaf(e[g * ss + p0 + p], _cvtsh_ss(vrow[p][d0]), t);
                    acc[g * D + d0] = t;
                }
        }
    }
}

static void avx2_attn_block(const cpu_attn_job *job, int64_t kvh, int64_t start, int64_t end, cpu_attn_part *part,
                            float *scratch) {
    const mu_attn_args *a = job->a;
    const int64_t D = a->head_dim, G = job->n_g, n = end - start + 1;
    const int64_t ss = CPU_ATTN_BLOCK + 16;
    float *row = scratch, *scores = scratch + 2 * (D + 16);
    const uint16_t **krow = (const uint16_t **)(scores + G * ss), **vrow = krow + CPU_ATTN_BLOCK;
    mu_attn_head_rows(a, start, n, kvh, krow, vrow); /* held: the driver takes [first, pos] from the layer */
    const float *q = cpu_attn_q(job, kvh);
    int64_t p = 0;
    if (D % 32 == 0)
        for (; p + 2 <= n; p += 2) {
            f16_row_to_f32(krow[p], row, D);
            f16_row_to_f32(krow[p + 1], row + D + 16, D);
            for (int64_t g = 0; g < G; g++) {
                float s0, s1;
                dot2_f32(q + g * D, row, row + D + 16, D, &s0, &s1);
                scores[g * ss + p] = s0 * a->scale;
                scores[g * ss + p + 1] = s1 * a->scale;
            }
        }
    for (; p < n; p++) {
        f16_row_to_f32(krow[p], row, D);
        for (int64_t g = 0; g < G; g++) scores[g * ss + p] = dot_f32(q + g * D, row, D) * a->scale;
    }
    for (int64_t g = 0; g < G; g++) {
        float *s = scores + g * ss, m_b = -INFINITY;
        for (int64_t p = 0; p < n; p++) m_b = s[p] > m_b ? s[p] : m_b;
        const __m256 m = _mm256_set1_ps(m_b);
        int64_t p = 0;
        for (; p + 8 <= n; p += 8) _mm256_storeu_ps(s + p, mu_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + p), m)));
        if (p < n) {
            float t[8] = {0};
            memcpy(t, s + p, (size_t)(n - p) * 4);
            _mm256_storeu_ps(t, mu_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(t), m)));
            memcpy(s + p, t, (size_t)(n - p) * 4);
        }
        float l_b = 0.0f;
        for (p = 0; p < n; p++) l_b = l_b + s[p];
        part->m[g] = m_b;
        part->l[g] = l_b;
    }
    pv_passes(vrow, n, scores, ss, G, D, part->acc);
}

static void avx2_scale_add2(float *out, const float *in, float ca, float cb, int64_t n) {
    const __m256 a = _mm256_set1_ps(ca), b = _mm256_set1_ps(cb);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(out + i), a), _mm256_mul_ps(_mm256_loadu_ps(in + i), b)));
    for (; i < n; i++) out[i] = out[i] * ca + in[i] * cb;
}

static void avx2_div_scalar(float *out, float l, int64_t n) {
    const __m256 d = _mm256_set1_ps(l);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_loadu_ps(out + i), d));
    for (; i < n; i++) out[i] = out[i] / l;
}

/* F16C with imm 0 rounds to nearest even, NaNs quieted with their payload's
 * top bits: mu_f32_to_f16 bit for bit (docs/numerics.md). */
static void avx2_f16_row(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
    for (; i < n; i++) dst[i] = mu_f32_to_f16(src[i]);
}

const cpu_kernels mu_cpu_kernels_avx2 = {
    .isa = MU_CPU_ISA_AVX2,
    .pack_layout = MU_LAYOUT_X8,
    .q_supported = avx2_q_supported,
    .act_bytes = avx2_act_bytes,
    .quantize_rows = avx2_quantize_rows,
    .qmatmul = avx2_qmatmul,
    .fmatmul = avx2_fmatmul,
    .rmsnorm_row = avx2_rmsnorm_row,
    .rope_row = avx2_rope_row,
    .sigmoid_gate = avx2_sigmoid_gate,
    .swiglu = avx2_swiglu,
    .add = avx2_add,
    .logit_tail = avx2_logit_tail,
    .attn_block = avx2_attn_block,
    .scale_add2 = avx2_scale_add2,
    .div_scalar = avx2_div_scalar,
    .f16_row = avx2_f16_row,
};

#pragma GCC pop_options
#else
const cpu_kernels mu_cpu_kernels_avx2 = {.isa = MU_CPU_ISA_AVX2};
#endif
