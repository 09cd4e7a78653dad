/* K-quants: Q4_K, Q5_K, Q6_K (256-value super-blocks; docs/model.md).
 *
 * Q4_K (144 B): d f16 | dmin f16 | scales[12] (8 x 6-bit sc, 8 x 6-bit m) | qs[128]
 *   sub-block j (values 32j..32j+31): y = (d*sc_j)*code - dmin*m_j, code 0..15
 *   value 64g+l is the low nibble of qs[32g+l], value 64g+32+l the high nibble.
 * Q5_K (176 B): as Q4_K plus qh[32]: value 64g+l adds 16*bit 2g of qh[l],
 *   value 64g+32+l adds 16*bit 2g+1 of qh[l]; code 0..31.
 * Q6_K (210 B): ql[128] | qh[64] | sc[16] int8 | d f16; sub-block i (16 values):
 *   y = (d*sc_i)*code, code = 6-bit value - 32 (see q6k_codes for the planes).
 *
 * Dot with one Q8_K super-block (xd = x->d, integer sums exact in int32):
 *   Q4_K/Q5_K: sumi = sum_j sc_j * (sum over sub-block j of code*q_x)
 *              summ = sum_j m_j * (bsums[2j] + bsums[2j+1])
 *              f_b  = (d*xd)*(float)sumi - (dmin*xd)*(float)summ
 *   Q6_K:      sumi = sum_i sc_i * (sum over sub-block i of code*q_x)
 *              f_b  = (d*xd)*(float)sumi                                  */
#include "quant/quant_internal.h"
#include <math.h>

/* ---------------------------------------------------------------- layout */

/* Inverse of qi_scale_min_k4 (values 0..63; higher bits are dropped). */
static void pack_scale_min_k4(uint8_t *s, const uint8_t *sc, const uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        const uint8_t lo_sc = sc[j] & 0x3F, hi_sc = sc[j + 4] & 0x3F;
        const uint8_t lo_m = m[j] & 0x3F, hi_m = m[j + 4] & 0x3F;
        s[j] = (uint8_t)(lo_sc | ((hi_sc >> 4) << 6));
        s[j + 4] = (uint8_t)(lo_m | ((hi_m >> 4) << 6));
        s[j + 8] = (uint8_t)((hi_sc & 0xF) | ((hi_m & 0xF) << 4));
    }
}

void mu_kquant_pack_scales(uint8_t scales[12], const uint8_t sc[8], const uint8_t m[8]) {
    pack_scale_min_k4(scales, sc, m);
}

void mu_kquant_unpack_scales(const uint8_t scales[12], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 8; j++) {
        int32_t s, mm;
        qi_scale_min_k4(scales, j, &s, &mm);
        sc[j] = (uint8_t)s;
        m[j] = (uint8_t)mm;
    }
}

static void q4k_codes(const uint8_t *blk, int32_t *code) {
    const uint8_t *qs = blk + Q4_K_QS;
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            code[64 * g + l] = qs[32 * g + l] & 0xF;
            code[64 * g + 32 + l] = qs[32 * g + l] >> 4;
        }
}

static void q5k_codes(const uint8_t *blk, int32_t *code) {
    const uint8_t *qh = blk + Q5_K_QH, *qs = blk + Q5_K_QS;
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            code[64 * g + l] = (qs[32 * g + l] & 0xF) | (((qh[l] >> (2 * g)) & 1) << 4);
            code[64 * g + 32 + l] = (qs[32 * g + l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4);
        }
}

/* Two halves of 128 values; in half h, for l = 0..31, with L = ql + 64h and
 * H = qh + 32h, the 6-bit values are:
 *   128h+l    : L[l] & 15    | (H[l] >> 0 & 3) << 4
 *   128h+l+32 : L[l+32] & 15 | (H[l] >> 2 & 3) << 4
 *   128h+l+64 : L[l] >> 4    | (H[l] >> 4 & 3) << 4
 *   128h+l+96 : L[l+32] >> 4 | (H[l] >> 6 & 3) << 4                       */
static void q6k_codes(const uint8_t *blk, int32_t *code) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = blk + 64 * h, *H = blk + Q6_K_QH + 32 * h;
        int32_t *c = code + 128 * h;
        for (int l = 0; l < 32; l++) {
            c[l] = ((L[l] & 0xF) | (((H[l] >> 0) & 3) << 4)) - 32;
            c[l + 32] = ((L[l + 32] & 0xF) | (((H[l] >> 2) & 3) << 4)) - 32;
            c[l + 64] = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
            c[l + 96] = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
        }
    }
}

/* Inverse of q6k_codes; u holds the unsigned 6-bit values (code + 32). */
static void q6k_pack(uint8_t *blk, const uint8_t *u) {
    for (int h = 0; h < 2; h++) {
        uint8_t *L = blk + 64 * h, *H = blk + Q6_K_QH + 32 * h;
        const uint8_t *v = u + 128 * h;
        for (int l = 0; l < 32; l++) {
            L[l] = (uint8_t)((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
            L[l + 32] = (uint8_t)((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
            H[l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                             ((v[l + 96] >> 4) << 6));
        }
    }
}

/* Q4_K/Q5_K payload packing from codes (0..15 or 0..31). */
static void q4k_pack_codes(uint8_t *blk, const uint8_t *code) {
    uint8_t *qs = blk + Q4_K_QS;
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++)
            qs[32 * g + l] = (uint8_t)(code[64 * g + l] | (code[64 * g + 32 + l] << 4));
}

static void q5k_pack_codes(uint8_t *blk, const uint8_t *code) {
    uint8_t *qh = blk + Q5_K_QH, *qs = blk + Q5_K_QS;
    memset(qh, 0, 32);
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            uint8_t lo = code[64 * g + l], hi = code[64 * g + 32 + l];
            qs[32 * g + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
            qh[l] |= (uint8_t)(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
        }
}

/* ------------------------------------------------------------ dequantize */

static void dequant_scale_min(const uint8_t *blk, const int32_t *code, float *y) {
    const float d = qi_rd_f16(blk), dmin = qi_rd_f16(blk + 2);
    for (int j = 0; j < 8; j++) {
        int32_t sc, m;
        qi_scale_min_k4(blk + QK_SCALES, j, &sc, &m);
        const float dj = d * (float)sc, mj = dmin * (float)m;
        for (int i = 32 * j; i < 32 * j + 32; i++) y[i] = dj * (float)code[i] - mj;
    }
}

void qi_dequant_q4_k(const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    for (int64_t b = 0; b < n / MU_QK_K; b++, blk += Q4_K_BYTES) {
        int32_t code[MU_QK_K];
        q4k_codes(blk, code);
        dequant_scale_min(blk, code, dst + b * MU_QK_K);
    }
}

void qi_dequant_q5_k(const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    for (int64_t b = 0; b < n / MU_QK_K; b++, blk += Q5_K_BYTES) {
        int32_t code[MU_QK_K];
        q5k_codes(blk, code);
        dequant_scale_min(blk, code, dst + b * MU_QK_K);
    }
}

void qi_dequant_q6_k(const void *src, float *dst, int64_t n) {
    const uint8_t *blk = src;
    for (int64_t b = 0; b < n / MU_QK_K; b++, blk += Q6_K_BYTES) {
        int32_t code[MU_QK_K];
        q6k_codes(blk, code);
        const float d = qi_rd_f16(blk + Q6_K_D);
        float *y = dst + b * MU_QK_K;
        for (int i = 0; i < MU_QK_K; i++)
            y[i] = (d * (float)(int8_t)blk[Q6_K_SC + i / 16]) * (float)code[i];
    }
}

/* ------------------------------------------------------------------- dot */

static float dot_scale_min(const uint8_t *blk, const int32_t *code, const mu_block_q8k *x) {
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        int32_t sc, m, isum = 0;
        qi_scale_min_k4(blk + QK_SCALES, j, &sc, &m);
        for (int i = 32 * j; i < 32 * j + 32; i++) isum += code[i] * x->qs[i];
        sumi += sc * isum;
        summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    const float d = qi_rd_f16(blk), dmin = qi_rd_f16(blk + 2);
    return (d * x->d) * (float)sumi - (dmin * x->d) * (float)summ;
}

float qi_dot_q4_k(const void *w, const mu_block_q8k *x) {
    int32_t code[MU_QK_K];
    q4k_codes(w, code);
    return dot_scale_min(w, code, x);
}

float qi_dot_q5_k(const void *w, const mu_block_q8k *x) {
    int32_t code[MU_QK_K];
    q5k_codes(w, code);
    return dot_scale_min(w, code, x);
}

float qi_dot_q6_k(const void *w, const mu_block_q8k *x) {
    const uint8_t *blk = w;
    int32_t code[MU_QK_K], sumi = 0;
    q6k_codes(blk, code);
    for (int s = 0; s < 16; s++) {
        int32_t isum = 0;
        for (int i = 16 * s; i < 16 * s + 16; i++) isum += code[i] * x->qs[i];
        sumi += (int8_t)blk[Q6_K_SC + s] * isum;
    }
    return (qi_rd_f16(blk + Q6_K_D) * x->d) * (float)sumi;
}

/* -------------------------------------------------------------- quantize */

/* Candidate inverse scales of the sub-block search: (nmax + rmin + rdelta*k)
 * / (max - min) for k = 0..nstep. */
typedef struct fit_params {
    float rmin, rdelta;
    int nstep;
} fit_params;

static float fit_error(int n, const float *x, const float *w, const uint8_t *q, float scale, float min) {
    float err = 0.0f;
    for (int i = 0; i < n; i++) {
        float diff = scale * (float)q[i] + min - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* Fit x[0..n) ~ scale*q - offset (n <= 32) with q in 0..nmax and offset >= 0
 * by weighted least squares (llama.cpp's make_qkx2 idea): start from the
 * min/max grid, then for each candidate inverse scale round the codes and
 * refit scale and min in closed form; keep the fit with the lowest weighted
 * squared error. Returns scale and writes offset (= -min) and the codes. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *q,
                           float *offset, fit_params p) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
    }
    if (lo > 0.0f) lo = 0.0f;
    if (hi == lo) {
        memset(q, 0, (size_t)n);
        *offset = -lo;
        return 0.0f;
    }
    float sw = 0.0f, sx = 0.0f;
    for (int i = 0; i < n; i++) {
        sw += w[i];
        sx += w[i] * x[i];
    }
    float iscale = (float)nmax / (hi - lo);
    float best_scale = 1.0f / iscale, best_min = lo;
    for (int i = 0; i < n; i++) q[i] = (uint8_t)qi_round_clamp(iscale * (x[i] - lo), 0, nmax);
    float best_err = fit_error(n, x, w, q, best_scale, best_min);

    uint8_t cand[32];
    for (int k = 0; k <= p.nstep; k++) {
        iscale = (p.rmin + p.rdelta * (float)k + (float)nmax) / (hi - lo);
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; i++) {
            cand[i] = (uint8_t)qi_round_clamp(iscale * (x[i] - lo), 0, nmax);
            float l = (float)cand[i];
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0.0f)) continue;
        float scale = (sw * sxl - sx * sl) / det;
        float min = (sl2 * sx - sl * sxl) / det;
        if (min > 0.0f) {
            min = 0.0f;
            scale = sxl / sl2;
        }
        float err = fit_error(n, x, w, cand, scale, min);
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
            best_min = min;
            memcpy(q, cand, (size_t)n);
        }
    }
    *offset = -best_min;
    return best_scale;
}

/* A Q4_K/Q5_K super-block header being chosen: value = (d*sc_j)*q - dmin*m_j. */
typedef struct scale_min_header {
    float d, dmin; /* already rounded through f16 */
    uint8_t sc[8], m[8];
} scale_min_header;

/* Round the codes of sub-block j against its decoded scale and min and
 * return the weighted squared error of the decoded values. */
static float sub_block_codes(const float *x, const float *w, float d, float dmin, int sc, int m,
                             int nmax, uint8_t *code) {
    const float dj = d * (float)sc, mj = dmin * (float)m;
    float err = 0.0f;
    for (int i = 0; i < 32; i++) {
        code[i] = dj > 0.0f ? (uint8_t)qi_round_clamp((x[i] + mj) / dj, 0, nmax) : 0;
        const float diff = dj * (float)code[i] - mj - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* With d and dmin fixed, move each sub-block's 6-bit scale and min by up to
 * one step if that lowers its error (the rounding to 6 bits was done on the
 * float fit, not on the final grid). Returns the block's total error. */
static float settle_sub_blocks(const float *x, const float *w, int nmax, scale_min_header *h,
                               uint8_t *code) {
    float total = 0.0f;
    uint8_t cand[32];
    for (int j = 0; j < 8; j++) {
        const int sc0 = h->sc[j], m0 = h->m[j];
        float best = sub_block_codes(x + 32 * j, w + 32 * j, h->d, h->dmin, sc0, m0, nmax, code + 32 * j);
        for (int sc = sc0 - 1; sc <= sc0 + 1; sc++)
            for (int m = m0 - 1; m <= m0 + 1; m++) {
                if (sc < 0 || sc > 63 || m < 0 || m > 63 || (sc == sc0 && m == m0)) continue;
                const float err = sub_block_codes(x + 32 * j, w + 32 * j, h->d, h->dmin, sc, m, nmax, cand);
                if (err < best) {
                    best = err;
                    h->sc[j] = (uint8_t)sc;
                    h->m[j] = (uint8_t)m;
                    memcpy(code + 32 * j, cand, 32);
                }
            }
        total += best;
    }
    return total;
}

/* With all integers fixed, refit d and dmin by weighted least squares:
 * x ~ d*A - dmin*B with A = sc_j*q, B = m_j (dmin >= 0). False if singular. */
static bool refit_super_scales(const float *x, const float *w, const uint8_t *code,
                               const scale_min_header *h, float *d, float *dmin) {
    float saa = 0.0f, sab = 0.0f, sbb = 0.0f, sax = 0.0f, sbx = 0.0f;
    for (int i = 0; i < MU_QK_K; i++) {
        const float a = (float)(h->sc[i / 32] * code[i]), b = (float)h->m[i / 32];
        saa += w[i] * a * a;
        sab += w[i] * a * b;
        sbb += w[i] * b * b;
        sax += w[i] * a * x[i];
        sbx += w[i] * b * x[i];
    }
    const float det = saa * sbb - sab * sab;
    if (!(det > 0.0f)) return false;
    *d = (sax * sbb - sbx * sab) / det;
    *dmin = -(saa * sbx - sab * sax) / det;
    if (*dmin < 0.0f) {
        *dmin = 0.0f;
        *d = sax / saa;
    }
    return *d > 0.0f;
}

/* One Q4_K/Q5_K super-block: fit each 32-value sub-block (weights
 * sqrt(mean x^2) + |x|, as llama.cpp), quantize the eight scales and eight
 * mins to 6 bits against d = max_scale/63 and dmin = max_min/63 (f16), then
 * alternate two refinements while the error drops: settle the 6-bit values
 * on the final grid, and refit d/dmin by least squares. */
static void quant_scale_min_block(const float *x, uint8_t *blk, int nmax, fit_params p,
                                  uint8_t *code) {
    float scale[8], offset[8], weight[MU_QK_K];
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum2 = 0.0f;
        for (int i = 0; i < 32; i++) sum2 += xs[i] * xs[i];
        const float av = sqrtf(sum2 / 32.0f);
        for (int i = 0; i < 32; i++) weight[32 * j + i] = av + fabsf(xs[i]);
        scale[j] = fit_scale_min(32, nmax, xs, weight + 32 * j, code + 32 * j, &offset[j], p);
    }
    float max_scale = 0.0f, max_offset = 0.0f;
    for (int j = 0; j < 8; j++) {
        max_scale = fmaxf(max_scale, scale[j]);
        max_offset = fmaxf(max_offset, offset[j]);
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_offset = max_offset > 0.0f ? 63.0f / max_offset : 0.0f;
    scale_min_header h;
    for (int j = 0; j < 8; j++) {
        h.sc[j] = (uint8_t)qi_round_clamp(inv_scale * scale[j], 0, 63);
        h.m[j] = (uint8_t)qi_round_clamp(inv_offset * offset[j], 0, 63);
    }
    h.d = mu_round_f16(max_scale / 63.0f);
    h.dmin = mu_round_f16(max_offset / 63.0f);

    float err = settle_sub_blocks(x, weight, nmax, &h, code);
    for (int round = 0; round < 4; round++) {
        scale_min_header t = h;
        uint8_t tcode[MU_QK_K];
        if (!refit_super_scales(x, weight, code, &h, &t.d, &t.dmin)) break;
        t.d = mu_round_f16(t.d);
        t.dmin = mu_round_f16(t.dmin);
        const float terr = settle_sub_blocks(x, weight, nmax, &t, tcode);
        if (!(terr < err)) break;
        err = terr;
        h = t;
        memcpy(code, tcode, sizeof tcode);
    }
    qi_wr16(blk, mu_f32_to_f16(h.d));
    qi_wr16(blk + 2, mu_f32_to_f16(h.dmin));
    pack_scale_min_k4(blk + QK_SCALES, h.sc, h.m);
}

void qi_quant_q4_k(const float *src, void *dst, int64_t n) {
    const fit_params p = {-1.0f, 0.1f, 20};
    uint8_t *blk = dst, code[MU_QK_K];
    for (int64_t b = 0; b < n / MU_QK_K; b++, blk += Q4_K_BYTES) {
        quant_scale_min_block(src + b * MU_QK_K, blk, 15, p, code);
        q4k_pack_codes(blk, code);
    }
}

void qi_quant_q5_k(const float *src, void *dst, int64_t n) {
    const fit_params p = {-0.5f, 0.1f, 15};
    uint8_t *blk = dst, code[MU_QK_K];
    for (int64_t b = 0; b < n / MU_QK_K; b++, blk += Q5_K_BYTES) {
        quant_scale_min_block(src + b * MU_QK_K, blk, 31, p, code);
        q5k_pack_codes(blk, code);
    }
}

/* Q6_K sub-block scale search: the largest-magnitude value sits on the grid
 * end (-32 or +31 steps) or a little inside it; for each candidate inverse
 * scale round the codes to -32..31, refit the scale by least squares
 * (sum x*q / sum q*q) and keep the lowest squared error. Returns the signed
 * scale s with x ~ s*q. */
static float q6k_fit_scale(const float *x) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 16; i++)
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    if (amax == 0.0f) return 0.0f;
    float best_scale = 0.0f, best_err = INFINITY;
    for (int k = -12; k <= 12; k++) {
        for (int end = 0; end < 2; end++) {
            const float steps = end == 0 ? -32.0f : 31.0f;
            const float iscale = (steps + (end == 0 ? -0.1f : 0.1f) * (float)k) / max;
            float sxq = 0.0f, sqq = 0.0f;
            float q[16];
            for (int i = 0; i < 16; i++) {
                q[i] = (float)qi_round_clamp(iscale * x[i], -32, 31);
                sxq += x[i] * q[i];
                sqq += q[i] * q[i];
            }
            if (!(sqq > 0.0f)) continue;
            const float scale = sxq / sqq;
            float err = 0.0f;
            for (int i = 0; i < 16; i++) {
                float diff = scale * q[i] - x[i];
                err += diff * diff;
            }
            if (err < best_err) {
                best_err = err;
                best_scale = scale;
            }
        }
    }
    return best_scale;
}

/* Codes (stored unsigned, code + 32) of one 16-value Q6_K sub-block against
 * its decoded scale d*sc, and the squared error of the decoded values. */
static float q6k_sub_codes(const float *x, float d, int sc, uint8_t *u) {
    const float ds = d * (float)sc;
    float err = 0.0f;
    for (int i = 0; i < 16; i++) {
        const int32_t q = ds != 0.0f ? qi_round_clamp(x[i] / ds, -32, 31) : 0;
        u[i] = (uint8_t)(q + 32);
        const float diff = ds * (float)q - x[i];
        err += diff * diff;
    }
    return err;
}

/* With d fixed, move each int8 sub-block scale by one step where that
 * lowers the error; returns the block's total error. */
static float q6k_settle(const float *x, float d, int8_t *sc, uint8_t *u) {
    float total = 0.0f;
    uint8_t cand[16];
    for (int s = 0; s < 16; s++) {
        const int sc0 = sc[s];
        float best = q6k_sub_codes(x + 16 * s, d, sc0, u + 16 * s);
        for (int c = sc0 - 1; c <= sc0 + 1; c += 2) {
            if (c < -128 || c > 127) continue;
            const float err = q6k_sub_codes(x + 16 * s, d, c, cand);
            if (err < best) {
                best = err;
                sc[s] = (int8_t)c;
                memcpy(u + 16 * s, cand, 16);
            }
        }
        total += best;
    }
    return total;
}

/* One Q6_K super-block: 16 searched sub-block scales, quantized to int8
 * against d = 1/iscale with iscale = -128/max_scale (max_scale = signed
 * scale of largest magnitude); then, while the error drops, settle the int8
 * scales on the final grid and refit d = sum(a*x)/sum(a*a), a = sc*q. */
static void quant_q6k_block(const float *x, uint8_t *blk) {
    float scale[16], amax = 0.0f, max_scale = 0.0f;
    for (int s = 0; s < 16; s++) {
        scale[s] = q6k_fit_scale(x + 16 * s);
        if (fabsf(scale[s]) > amax) {
            amax = fabsf(scale[s]);
            max_scale = scale[s];
        }
    }
    uint8_t u[MU_QK_K];
    int8_t sc[16] = {0};
    float d = 0.0f;
    memset(u, 32, sizeof u);
    if (amax > 0.0f) {
        const float iscale = -128.0f / max_scale;
        for (int s = 0; s < 16; s++) sc[s] = (int8_t)qi_round_clamp(iscale * scale[s], -128, 127);
        d = mu_round_f16(1.0f / iscale);
        float err = q6k_settle(x, d, sc, u);
        for (int round = 0; round < 4; round++) {
            float sax = 0.0f, saa = 0.0f;
            for (int i = 0; i < MU_QK_K; i++) {
                const float a = (float)(sc[i / 16] * ((int32_t)u[i] - 32));
                sax += a * x[i];
                saa += a * a;
            }
            if (!(saa > 0.0f)) break;
            const float td = mu_round_f16(sax / saa);
            int8_t tsc[16];
            uint8_t tu[MU_QK_K];
            memcpy(tsc, sc, sizeof tsc);
            const float terr = q6k_settle(x, td, tsc, tu);
            if (!(terr < err)) break;
            err = terr;
            d = td;
            memcpy(sc, tsc, sizeof sc);
            memcpy(u, tu, sizeof u);
        }
    }
    memset(blk, 0, Q6_K_BYTES);
    for (int s = 0; s < 16; s++) blk[Q6_K_SC + s] = (uint8_t)sc[s];
    qi_wr16(blk + Q6_K_D, mu_f32_to_f16(d));
    q6k_pack(blk, u);
}

void qi_quant_q6_k(const float *src, void *dst, int64_t n) {
    uint8_t *blk = dst;
    for (int64_t b = 0; b < n / MU_QK_K; b++, blk += Q6_K_BYTES) quant_q6k_block(src + b * MU_QK_K, blk);
}
