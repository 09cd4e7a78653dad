/* AVX-512 kernels for everything but the quantized matmul (float-weight
 * dots, norms, RoPE, the elementwise ops, attention) and the kernel table;
 * compiled for that target only and called only after the CPUID check in
 * cpu_backend.c.
 *
 * Exactness: every float operation is the ref's operation, in the ref's
 * order, lane-wise (IEEE ops are lane-independent):
 *  - float dots keep the 32 strided lanes in two zmm registers (lanes 0-15,
 *    16-31) and fold them 16, 8, 4, 2, 1 as weight_row.c does;
 *  - attention puts 16 keys in lanes, so each lane runs one canonical dot
 *    and fold; softmax and P.V are lane-wise over keys / head dimensions;
 *  - exp/tanh/sigmoid are lane-wise transcriptions of src/util/mumath.c. */
#include "backend/cpu/cpu_simd_common.h"

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
#include "backend/cpu/cpu_avx512.h"
#include "util/mumath_avx512.h"

/* ======================================================== float dots */

/* 16 weights (F32/F16/BF16) widened exactly to f32; lanes outside k are 0. */
static inline __m512 load_w16(const uint8_t *p, uint32_t type, __mmask16 k) {
    if (type == MU_TYPE_F32) return _mm512_maskz_loadu_ps(k, p);
    __m256i h = _mm256_maskz_loadu_epi16(k, p);
    if (type == MU_TYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* p[0..31] in two registers, folded h = 16, 8, 4, 2, 1: p[l] = p[l] + p[l+h] */
static inline float fold32(__m512 p0, __m512 p1) {
    __m512 q = _mm512_add_ps(p0, p1);
    __m256 r = _mm256_add_ps(_mm512_castps512_ps256(q), _mm512_extractf32x8_ps(q, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    __m128 t2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

static float sumsq_f32(const float *a, int64_t n) {
    __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 x0 = _mm512_loadu_ps(a + i), x1 = _mm512_loadu_ps(a + i + 16);
        p0 = _mm512_fmadd_ps(x0, x0, p0);
        p1 = _mm512_fmadd_ps(x1, x1, p1);
    }
    if (i < n) {
        __mmask16 k0 = tail_mask(n - i), k1 = tail_mask(n - i - 16);
        __m512 x0 = _mm512_maskz_loadu_ps(k0, a + i), x1 = _mm512_maskz_loadu_ps(k1, a + i + 16);
        p0 = _mm512_mask3_fmadd_ps(x0, x0, p0, k0);
        p1 = _mm512_mask3_fmadd_ps(x1, x1, p1, k1);
    }
    return fold32(p0, p1);
}

/* Four weight rows against one f32 row, or one weight row against four f32
 * rows (wr[j] / xr[j] for pair j); 8 independent FMA chains. */
static void fdot4(const uint8_t *const *wr, const float *const *xr, uint32_t type, int64_t n, float *out) {
    const int64_t esz = type == MU_TYPE_F32 ? 4 : 2;
    __m512 p0[4], p1[4];
    for (int j = 0; j < 4; j++) p0[j] = p1[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++) {
            __m512 w0 = load_w16(wr[j] + i * esz, type, 0xFFFF), w1 = load_w16(wr[j] + (i + 16) * esz, type, 0xFFFF);
            p0[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr[j] + i), p0[j]);
            p1[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr[j] + i + 16), p1[j]);
        }
    if (i < n) {
        __mmask16 k0 = tail_mask(n - i), k1 = tail_mask(n - i - 16);
        for (int j = 0; j < 4; j++) {
            __m512 w0 = load_w16(wr[j] + i * esz, type, k0), w1 = load_w16(wr[j] + (i + 16) * esz, type, k1);
            p0[j] = _mm512_mask3_fmadd_ps(w0, _mm512_maskz_loadu_ps(k0, xr[j] + i), p0[j], k0);
            p1[j] = _mm512_mask3_fmadd_ps(w1, _mm512_maskz_loadu_ps(k1, xr[j] + i + 16), p1[j], k1);
        }
    }
    for (int j = 0; j < 4; j++) out[j] = fold32(p0[j], p1[j]);
}

static void avx512_fmatmul(const mu_weight *w, int64_t o0, int64_t o1, const float *x, int64_t rows, float *y) {
    const int64_t n = w->n_in;
    for (int64_t r0 = 0; r0 < rows; r0 += rows == 1 ? 1 : 4)
        for (int64_t og = o0; og < o1; og += rows == 1 ? 4 : 1) {
            const uint8_t *wr[4];
            const float *xr[4];
            for (int j = 0; j < 4; j++) {
                int64_t o = rows == 1 ? (og + j < o1 ? og + j : o1 - 1) : og;
                int64_t r = rows == 1 ? r0 : (r0 + j < rows ? r0 + j : rows - 1);
                wr[j] = w->data + (uint64_t)o * w->row_bytes;
                xr[j] = x + r * n;
            }
            float out[4];
            fdot4(wr, xr, w->type, n, out);
            for (int j = 0; j < 4; j++) {
                int64_t o = rows == 1 ? og + j : og, r = rows == 1 ? r0 : r0 + j;
                if (o >= o1 || r >= rows) continue;
                float v = out[j];
                if (w->has_scale) v = v * w->scale;
                y[r * w->n_out + o] = v;
            }
        }
}

/* ======================================================== mumath, lane-wise */

static inline __m512 neg_ps(__m512 x) { return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))); }

static inline __m512 sigmoid_ps(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, mu_exp_ps512(neg_ps(x))));
}

/* mu_tanhf: odd polynomial below 0.875, 1 - 2/(e^2|x| + 1) up to 9.1, then 1. */
static inline __m512 tanh_ps(__m512 x) {
    const __m512i sign_bit = _mm512_set1_epi32((int)0x80000000u);
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), sign_bit);
    const __m512 ax = _mm512_abs_ps(x);
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 g = _mm512_fmadd_ps(_mm512_set1_ps(0x1.8f3b5ep-13f), x2, _mm512_set1_ps(-0x1.1621f2p-10f));
    g = _mm512_fmadd_ps(g, x2, _mm512_set1_ps(0x1.b8c95ep-9f));
    g = _mm512_fmadd_ps(g, x2, _mm512_set1_ps(-0x1.1fe3f4p-7f));
    g = _mm512_fmadd_ps(g, x2, _mm512_set1_ps(0x1.661216p-6f));
    g = _mm512_fmadd_ps(g, x2, _mm512_set1_ps(-0x1.ba18c4p-5f));
    g = _mm512_fmadd_ps(g, x2, _mm512_set1_ps(0x1.11110ap-3f));
    g = _mm512_fmadd_ps(g, x2, _mm512_set1_ps(-0x1.555556p-2f));
    __m512 poly = _mm512_fmadd_ps(_mm512_mul_ps(x, x2), g, x);
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    __m512 t = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(mu_exp_ps512(_mm512_mul_ps(two, ax)), one)));
    t = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0x1.233334p+3f), _CMP_GT_OQ), one);
    __m512 big = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
    __m512 y = _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.875f), _CMP_LT_OQ), poly);
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(ax, _mm512_setzero_ps(), _CMP_EQ_OQ), x);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_add_ps(x, x));
}

/* ======================================================== elementwise ops */

static void avx512_sigmoid_gate(float *x, const float *g, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i), s = sigmoid_ps(_mm512_maskz_loadu_ps(k, g + i));
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(v, s));
    }
}

static void avx512_swiglu(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
        __m512 silu = _mm512_mul_ps(g, sigmoid_ps(g));
        _mm512_mask_storeu_ps(gate + i, k, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(k, up + i)));
    }
}

static void avx512_add(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(x + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, y + i)));
    }
}

static void avx512_logit_tail(float *l, float scale, float cap, int64_t n) {
    const __m512 s = _mm512_set1_ps(scale), c = _mm512_set1_ps(cap);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, l + i), s);
        if (cap > 0) v = _mm512_mul_ps(tanh_ps(_mm512_div_ps(v, c)), c);
        _mm512_mask_storeu_ps(l + i, k, v);
    }
}

static void avx512_rmsnorm_row(const float *x, const float *w, float eps, float *y, int64_t n) {
    float mean = sumsq_f32(x, n) / (float)n;
    const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(mean + eps));
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), inv);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + i));
        _mm512_mask_storeu_ps(y + i, k, v);
    }
}

/* Pairs (x0, x1) with (c, s): even lane x0*c - x1*s, odd lane x0*s + x1*c. */
static void avx512_rope_row(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs) {
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * head_dim;
        for (int64_t i = 0; i < n_rot; i += 16) {
            __mmask16 k = tail_mask(n_rot - i);
            __m512 a = _mm512_maskz_loadu_ps(k, v + i), t = _mm512_maskz_loadu_ps(k, cs + i);
            __m512 c = _mm512_moveldup_ps(t), s = _mm512_movehdup_ps(t);
            __m512 sw = _mm512_permute_ps(a, 0xB1); /* (x1, x0) */
            __m512 ac = _mm512_mul_ps(a, c), ss = _mm512_mul_ps(sw, s);
            __m512 r = _mm512_mask_add_ps(_mm512_sub_ps(ac, ss), 0xAAAA, ss, ac);
            _mm512_mask_storeu_ps(v + i, k, r);
        }
    }
}

/* ======================================================== attention */

static inline void f16_row_to_f32(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, src + i)));
    }
}

/* K of up to 16 keys as kt[i][key] (f32, D x 16); keys past n repeat the last. */
static void keys_transposed(const uint16_t *const *krow, int64_t n, int64_t D, float *kt) {
    for (int64_t i0 = 0; i0 < D; i0 += 16) {
        const __mmask16 m = tail_mask(D - i0);
        __m512 r[16];
        for (int j = 0; j < 16; j++) r[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, krow[j < n ? j : n - 1] + i0));
        transpose16(r);
        for (int c = 0; c < 16 && i0 + c < D; c++) _mm512_storeu_ps(kt + (i0 + c) * 16, r[c]);
    }
}

/* Scores of 16 keys (lanes) for 4 heads: each lane runs the canonical
 * dot -- p[l] = fmaf(q[i], k[i], p[l]) over i = l, l + 32, ... -- and the
 * fold h = 16, 8, 4, 2, 1 evaluated depth first: the leaves in the order
 * below, each pair of equal subtrees summed (earlier + later) as soon as
 * both exist, which is exactly p[l] + p[l + h] at every level. */
static inline __attribute__((always_inline)) void qk_tile4(const float *kt, const float *const *q, int64_t D, __m512 *out) {
    static const int LEAF[32] = {0, 16, 8, 24, 4, 20, 12, 28, 2, 18, 10, 26, 6, 22, 14, 30,
                                 1, 17, 9, 25, 5, 21, 13, 29, 3, 19, 11, 27, 7, 23, 15, 31};
    __m512 st[6][4];
    int sp = 0;
#pragma GCC unroll 32
    for (int leaf = 0; leaf < 32; leaf++) {
        const int l = LEAF[leaf];
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = l; i < D; i += 32) {
            const __m512 k = _mm512_loadu_ps(kt + i * 16);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q[0][i]), k, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q[1][i]), k, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q[2][i]), k, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(q[3][i]), k, a3);
        }
        st[sp][0] = a0;
        st[sp][1] = a1;
        st[sp][2] = a2;
        st[sp][3] = a3;
        sp++;
#pragma GCC unroll 6
        for (int t = leaf; t & 1; t >>= 1, sp--)
            for (int h = 0; h < 4; h++) st[sp - 2][h] = _mm512_add_ps(st[sp - 2][h], st[sp - 1][h]);
    }
    for (int h = 0; h < 4; h++) out[h] = st[0][h];
}

/* P.V for up to H heads (H = 8 or 16 accumulators in registers), one
 * 16-wide slice of the head dimension at a time: acc[g][d] = fmaf(e_p[g],
 * v_p[d], acc[g][d]), keys ascending. e holds [head][key] weights. Keys go
 * in passes of PV_PASS, each pass continuing the accumulators it stored:
 * the pass's V rows (64 x 256 bytes at head_dim 128) stay in L1 over all
 * the slices, where a whole 256-key block did not fit. */
#define E_STRIDE (CPU_ATTN_BLOCK + 16)
#define PV_PASS 64
static inline __attribute__((always_inline)) void pv_slices(const uint16_t *const *vrow, int64_t n, const float *e,
                                                             int64_t D, int64_t G, float *acc, const int H) {
    for (int64_t p0 = 0; p0 < n; p0 += PV_PASS) {
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
            const __mmask16 m = tail_mask(D - d0);
            __m512 a[16];
#pragma GCC unroll 16
            for (int g = 0; g < H; g++)
                a[g] = p0 == 0 || g >= G ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, acc + g * D + d0);
            for (int64_t p = p0; p < n && p < p0 + PV_PASS; p++) {
                const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, vrow[p] + d0));
#pragma GCC unroll 16
                for (int g = 0; g < H; g++) a[g] = _mm512_fmadd_ps(_mm512_set1_ps(e[(g < G ? g : 0) * E_STRIDE + p]), v, a[g]);
            }
#pragma GCC unroll 16
            for (int g = 0; g < H; g++)
                if (g < G) _mm512_mask_storeu_ps(acc + g * D + d0, m, a[g]);
        }
    }
}

static void pv_slices16(const uint16_t *const *vrow, int64_t n, const float *e, int64_t D, int64_t G, float *acc) {
    pv_slices(vrow, n, e, D, G, acc, 16);
}

static void pv_slices4(const uint16_t *const *vrow, int64_t n, const float *e, int64_t D, int64_t G, float *acc) {
    pv_slices(vrow, n, e, D, G, acc, 4);
}

/* l[g] = the sum of e[g][p], p ascending from 0.0f: one sequential sum per
 * head, as the reference adds them, but 16 heads at a time in lanes (the
 * weights transposed 16 keys at a time) instead of one latency-bound
 * scalar chain per head. */
static void block_sums(const float *e, int64_t n, int64_t G, float *l) {
    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        const int64_t gc = G - g0 < 16 ? G - g0 : 16;
        __m512 sum = _mm512_setzero_ps();
        for (int64_t p0 = 0; p0 < n; p0 += 16) {
            const __mmask16 k = tail_mask(n - p0);
            __m512 r[16];
            for (int j = 0; j < 16; j++) r[j] = j < gc ? _mm512_maskz_loadu_ps(k, e + (g0 + j) * E_STRIDE + p0) : _mm512_setzero_ps();
            transpose16(r);
            const int pc = n - p0 < 16 ? (int)(n - p0) : 16;
            for (int j = 0; j < pc; j++) sum = _mm512_add_ps(sum, r[j]);
        }
        float t[16];
        _mm512_storeu_ps(t, sum);
        for (int64_t j = 0; j < gc; j++) l[g0 + j] = t[j];
    }
}

/* One 256-key block for all G query heads of a KV head: scores (keys in
 * lanes, 16 at a time), the block max, e = expf(s - m_b), l_b = sum e
 * (keys ascending), then P.V, 16 heads at a time. */
static void avx512_attn_block(const cpu_attn_job *job, int64_t kvh, int64_t start, int64_t end, cpu_attn_part *part,
                              float *scratch) {
    const mu_attn_args *a = job->a;
    const int64_t D = a->head_dim, G = job->n_g, n = end - start + 1;
    const float *q = cpu_attn_q(job, kvh);
    float *kt = scratch, *e = scratch + 16 * ((D + 15) & ~(int64_t)15);
    const uint16_t **krow = (const uint16_t **)(e + G * E_STRIDE), **vrow = krow + CPU_ATTN_BLOCK;
    mu_attn_head_rows(a, start, n, kvh, krow, vrow); /* held: the driver takes [first, pos] from the layer */
    const __m512 scale = _mm512_set1_ps(a->scale);
    for (int64_t p0 = 0; p0 < n; p0 += 16) {
        for (int64_t p = p0 + 16; p < p0 + 32 && p < n; p++) /* next tile's keys, this tile's values */
            for (int64_t o = 0; o < 2 * D; o += 64) _mm_prefetch((const char *)krow[p] + o, _MM_HINT_T0);
        for (int64_t p = p0; p < p0 + 16 && p < n; p++)
            for (int64_t o = 0; o < 2 * D; o += 64) _mm_prefetch((const char *)vrow[p] + o, _MM_HINT_T1);
        keys_transposed(krow + p0, n - p0, D, kt);
        const __mmask16 live = tail_mask(n - p0);
        for (int64_t h0 = 0; h0 < G; h0 += 4) {
            const float *qs[4];
            for (int h = 0; h < 4; h++) qs[h] = q + (h0 + h < G ? h0 + h : h0) * D;
            __m512 sc[4];
            qk_tile4(kt, qs, D, sc);
            for (int h = 0; h < 4 && h0 + h < G; h++)
                _mm512_mask_storeu_ps(e + (h0 + h) * E_STRIDE + p0, live, _mm512_mul_ps(sc[h], scale));
        }
    }
    for (int64_t g = 0; g < G; g++) {
        float *s = e + g * E_STRIDE;
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int64_t p = 0; p < n; p += 16)
            mv = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(n - p), s + p), mv);
        const float m_b = _mm512_reduce_max_ps(mv);
        const __m512 m = _mm512_set1_ps(m_b);
        for (int64_t p = 0; p < n; p += 16) {
            __mmask16 k = tail_mask(n - p);
            _mm512_mask_storeu_ps(s + p, k, mu_exp_ps512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + p), m)));
        }
        part->m[g] = m_b;
    }
    block_sums(e, n, G, part->l);
    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        const int64_t gc = G - g0 < 16 ? G - g0 : 16;
        if (gc > 4) pv_slices16(vrow, n, e + g0 * E_STRIDE, D, gc, part->acc + g0 * D);
        else pv_slices4(vrow, n, e + g0 * E_STRIDE, D, gc, part->acc + g0 * D);
    }
}

static void avx512_scale_add2(float *out, const float *in, float ca, float cb, int64_t n) {
    const __m512 a = _mm512_set1_ps(ca), b = _mm512_set1_ps(cb);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, out + i), a), _mm512_mul_ps(_mm512_maskz_loadu_ps(k, in + i), b));
        _mm512_mask_storeu_ps(out + i, k, v);
    }
}

static void avx512_div_scalar(float *out, float l, int64_t n) {
    const __m512 d = _mm512_set1_ps(l);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_storeu_ps(out + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, out + i), d));
    }
}

/* vcvtps2ph with imm 0 rounds to nearest even, NaNs quieted with their
 * payload's top bits: mu_f32_to_f16 bit for bit (docs/numerics.md). */
static void avx512_f16_row(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = tail_mask(n - i);
        _mm256_mask_storeu_epi16(dst + i, k, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), 0));
    }
}

const cpu_kernels mu_cpu_kernels_avx512 = {
    .isa = MU_CPU_ISA_AVX512,
    .pack_layout = MU_LAYOUT_X16,
    .q_supported = mu_cpu_avx512_q_supported,
    .act_bytes = mu_cpu_avx512_act_bytes,
    .quantize_rows = mu_cpu_avx512_quantize_rows,
    .blocks_only = mu_cpu_avx512_blocks_only,
    .qmatmul = mu_cpu_avx512_qmatmul,
    .fmatmul = avx512_fmatmul,
    .rmsnorm_row = avx512_rmsnorm_row,
    .rope_row = avx512_rope_row,
    .sigmoid_gate = avx512_sigmoid_gate,
    .swiglu = avx512_swiglu,
    .add = avx512_add,
    .logit_tail = avx512_logit_tail,
    .attn_block = avx512_attn_block,
    .scale_add2 = avx512_scale_add2,
    .div_scalar = avx512_div_scalar,
    .f16_row = avx512_f16_row,
};

#pragma GCC pop_options
#else
const cpu_kernels mu_cpu_kernels_avx512 = {.isa = MU_CPU_ISA_AVX512};
#endif
