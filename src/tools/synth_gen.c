/* Random weight rows for synth. Every row is a pure function of (seed,
 * tensor name, row), drawn from a counter-based stream, so threads can fill
 * rows in any order and the file bytes never depend on the thread count.
 *
 * Float types get gaussian-ish values. Block types are generated directly
 * as valid random blocks (random codes, fixed sane scales) because
 * quantizing billions of floats would take far longer than writing them;
 * the scales are chosen so the dequantized values have the requested
 * standard deviation. */
#include "tools/synth_internal.h"

static uint64_t row_key(const mu_synth_gen *g, uint64_t row) {
    return mu_mix64(g->key ^ mu_mix64(row ^ 0x5DEECE66Dull));
}

/* Sum of four 16-bit uniforms, centred and scaled to unit variance:
 * close enough to a normal for weights, and exact integer arithmetic. */
static float gauss_from(uint64_t r) {
    uint32_t s = (uint32_t)(r & 0xFFFF) + (uint32_t)((r >> 16) & 0xFFFF) +
                 (uint32_t)((r >> 32) & 0xFFFF) + (uint32_t)(r >> 48);
    return ((float)s - 131070.0f) * (1.0f / 37837.227f);
}

/* Root mean square of the integers lo..hi, each shifted by -centre. */
static double rms_range(int lo, int hi, double centre) {
    double s = 0;
    for (int v = lo; v <= hi; v++) s += (v - centre) * (v - centre);
    return mu_tools_sqrt(s / (hi - lo + 1));
}

/* NVFP4 block scales: E4M3 codes 0x30..0x40 (0.5 .. 2.0), never NaN. */
enum { FP4_SCALE_LO = 0x30, FP4_SCALE_SPAN = 17 };

static double rms_fp4_scale(void) {
    double s = 0;
    for (int b = FP4_SCALE_LO; b < FP4_SCALE_LO + FP4_SCALE_SPAN; b++) {
        double v = mu_tools_e4m3_value((uint8_t)b);
        s += v * v;
    }
    return mu_tools_sqrt(s / FP4_SCALE_SPAN);
}

/* E2M1 magnitudes {0,.5,1,1.5,2,3,4,6}, each code equally likely. */
static double rms_e2m1(void) {
    return mu_tools_sqrt((0 + 0.25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8.0);
}

void mu_synth_gen_init(mu_synth_gen *g, uint64_t seed, const char *name, uint32_t type, float std) {
    memset(g, 0, sizeof *g);
    g->key = mu_mix64(seed ^ mu_hash_str(name));
    g->type = type;
    g->std = std;
    double d = 0, min_per_d = 0;
    switch (type) {
    case MU_TYPE_Q4_K: d = std / (rms_range(32, 63, 0) * rms_range(0, 15, 7.5)); min_per_d = 7.5; break;
    case MU_TYPE_Q5_K: d = std / (rms_range(32, 63, 0) * rms_range(0, 31, 15.5)); min_per_d = 15.5; break;
    case MU_TYPE_Q6_K: d = std / (rms_range(64, 127, 0) * rms_range(0, 63, 32)); break;
    case MU_TYPE_Q8_0: d = std / rms_range(-127, 127, 0); break;
    case MU_TYPE_Q4_0: d = std / rms_range(0, 15, 8); break;
    case MU_TYPE_NVFP4:
    case MU_TYPE_NVFP4_E2M1: g->scale2 = (float)(std / (rms_e2m1() * rms_fp4_scale())); break;
    default: break;
    }
    g->d_f16 = mu_f32_to_f16((float)d);
    /* With m == sc and dmin = c*d, a value is d*sc*(q - c): centred codes. */
    g->dmin_f16 = mu_f32_to_f16((float)(min_per_d * mu_f16_to_f32(g->d_f16)));
}

static void put_f16(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* `n` random bytes from the stream, advancing *ctr. */
static void fill_bytes(uint64_t key, uint64_t *ctr, uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = mu_stream_u64(key, (*ctr)++);
        size_t k = n - i < 8 ? n - i : 8;
        for (size_t j = 0; j < k; j++) dst[i + j] = (uint8_t)(r >> (8 * j));
    }
}

/* 8 sub-block scales (and equal mins) in 32..63, packed the K-quant way. */
static void put_k_scales(uint8_t *scales, uint64_t r) {
    uint8_t sc[8];
    for (int j = 0; j < 8; j++) sc[j] = (uint8_t)(32 + ((r >> (5 * j)) & 31));
    const uint8_t *m = sc;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
}

static void fill_fp4_scales(uint64_t key, uint64_t *ctr, uint8_t *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mu_stream_u64(key, (*ctr)++);
        dst[i] = (uint8_t)(FP4_SCALE_LO + r % FP4_SCALE_SPAN);
    }
}

static void block_row(const mu_synth_gen *g, uint64_t key, uint64_t n_blocks, uint8_t *dst) {
    uint64_t ctr = 0;
    for (uint64_t b = 0; b < n_blocks; b++) {
        switch (g->type) {
        case MU_TYPE_Q4_K: {
            uint8_t *blk = dst + b * 144;
            put_f16(blk, g->d_f16);
            put_f16(blk + 2, g->dmin_f16);
            put_k_scales(blk + 4, mu_stream_u64(key, ctr++));
            fill_bytes(key, &ctr, blk + 16, 128);
            break;
        }
        case MU_TYPE_Q5_K: {
            uint8_t *blk = dst + b * 176;
            put_f16(blk, g->d_f16);
            put_f16(blk + 2, g->dmin_f16);
            put_k_scales(blk + 4, mu_stream_u64(key, ctr++));
            fill_bytes(key, &ctr, blk + 16, 32 + 128);
            break;
        }
        case MU_TYPE_Q6_K: {
            uint8_t *blk = dst + b * 210;
            fill_bytes(key, &ctr, blk, 128 + 64 + 16);
            for (int i = 0; i < 16; i++) blk[192 + i] = (uint8_t)(64 + (blk[192 + i] & 63));
            put_f16(blk + 208, g->d_f16);
            break;
        }
        case MU_TYPE_Q8_0: {
            uint8_t *blk = dst + b * 34;
            put_f16(blk, g->d_f16);
            fill_bytes(key, &ctr, blk + 2, 32);
            for (int i = 0; i < 32; i++) blk[2 + i] = (uint8_t)(int8_t)(blk[2 + i] % 255 - 127);
            break;
        }
        case MU_TYPE_Q4_0: {
            uint8_t *blk = dst + b * 18;
            put_f16(blk, g->d_f16);
            fill_bytes(key, &ctr, blk + 2, 16);
            break;
        }
        case MU_TYPE_NVFP4: {
            uint8_t *blk = dst + b * 36;
            fill_fp4_scales(key, &ctr, blk, 4);
            fill_bytes(key, &ctr, blk + 4, 32);
            break;
        }
        default:
            break;
        }
    }
}

void mu_synth_row(const mu_synth_gen *g, uint64_t row, uint64_t n_in, uint8_t *dst) {
    uint64_t key = row_key(g, row);
    switch (g->type) {
    case MU_TYPE_F32:
        for (uint64_t i = 0; i < n_in; i++) {
            float v = g->std * gauss_from(mu_stream_u64(key, i));
            memcpy(dst + 4 * i, &v, 4);
        }
        return;
    case MU_TYPE_F16:
    case MU_TYPE_BF16:
        for (uint64_t i = 0; i < n_in; i++) {
            float v = g->std * gauss_from(mu_stream_u64(key, i));
            put_f16(dst + 2 * i, g->type == MU_TYPE_F16 ? mu_f32_to_f16(v) : mu_f32_to_bf16(v));
        }
        return;
    default: {
        uint32_t be = 1, bb = 0;
        mu_type_size(g->type, &be, &bb);
        block_row(g, key, n_in / be, dst);
        return;
    }
    }
}

void mu_synth_nvfp4_row(const mu_synth_gen *g, uint64_t row, uint64_t n_in,
                        uint8_t *payload, uint8_t *scales) {
    uint64_t key = row_key(g, row), ctr = 0;
    fill_bytes(key, &ctr, payload, n_in / 2);
    fill_fp4_scales(key, &ctr, scales, n_in / 16);
}

void mu_synth_vector(uint64_t seed, const char *name, float mean, float std, uint64_t n, float *dst) {
    uint64_t key = mu_mix64(seed ^ mu_hash_str(name));
    for (uint64_t i = 0; i < n; i++)
        dst[i] = std > 0 ? mean + std * gauss_from(mu_stream_u64(key, i)) : mean;
}
