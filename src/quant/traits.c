/* The traits table: one entry per ggml type id that types.c knows, with the
 * implementations this module provides. Names and sizes always come from
 * mu_type_name/mu_type_size so the two tables cannot drift apart. */
#include "quant/quant_internal.h"
#include <pthread.h>

/* ---- float types (RNE conversions from util/common.h) ---- */

static void dequant_f32(const void *src, float *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }
static void quant_f32(const float *src, void *dst, int64_t n) { memcpy(dst, src, (size_t)n * 4); }

static void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mu_f16_to_f32(qi_rd16(p + 2 * i));
}
static void quant_f16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) qi_wr16(p + 2 * i, mu_f32_to_f16(src[i]));
}
static void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = mu_bf16_to_f32(qi_rd16(p + 2 * i));
}
static void quant_bf16(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t i = 0; i < n; i++) qi_wr16(p + 2 * i, mu_f32_to_bf16(src[i]));
}

/* ---- Q8_K stored as a tensor (same bytes as mu_block_q8k) ---- */

static void dequant_q8k_bytes(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / MU_QK_K; b++) {
        mu_block_q8k blk;
        memcpy(&blk, p + b * Q8_K_BYTES, sizeof blk);
        mu_dequantize_q8k(&blk, dst + b * MU_QK_K, MU_QK_K);
    }
}
static void quant_q8k_bytes(const float *src, void *dst, int64_t n) {
    uint8_t *p = dst;
    for (int64_t b = 0; b < n / MU_QK_K; b++) {
        mu_block_q8k blk;
        mu_quantize_q8k(src + b * MU_QK_K, &blk, MU_QK_K, false);
        memcpy(p + b * Q8_K_BYTES, &blk, sizeof blk);
    }
}

/* ---- implementations, by id; block sizes must agree with types.c ---- */

typedef struct impl {
    uint32_t id;
    uint32_t block_elems, block_bytes;
    bool is_float;
    void (*dequantize)(const void *, float *, int64_t);
    void (*quantize)(const float *, void *, int64_t);
    float (*dot_q8k)(const void *, const mu_block_q8k *);
} impl;

static const impl IMPLS[] = {
    {MU_TYPE_F32, 1, 4, true, dequant_f32, quant_f32, NULL},
    {MU_TYPE_F16, 1, 2, true, dequant_f16, quant_f16, NULL},
    {MU_TYPE_BF16, 1, 2, true, dequant_bf16, quant_bf16, NULL},
    {MU_TYPE_Q4_0, 32, Q4_0_BYTES, false, qi_dequant_q4_0, qi_quant_q4_0, qi_dot_q4_0},
    {MU_TYPE_Q8_0, 32, Q8_0_BYTES, false, qi_dequant_q8_0, qi_quant_q8_0, qi_dot_q8_0},
    {MU_TYPE_Q4_K, 256, Q4_K_BYTES, false, qi_dequant_q4_k, qi_quant_q4_k, qi_dot_q4_k},
    {MU_TYPE_Q5_K, 256, Q5_K_BYTES, false, qi_dequant_q5_k, qi_quant_q5_k, qi_dot_q5_k},
    {MU_TYPE_Q6_K, 256, Q6_K_BYTES, false, qi_dequant_q6_k, qi_quant_q6_k, qi_dot_q6_k},
    {MU_TYPE_Q8_K, 256, Q8_K_BYTES, false, dequant_q8k_bytes, quant_q8k_bytes, NULL},
    {MU_TYPE_NVFP4, 64, NVFP4G_BYTES, false, qi_dequant_nvfp4_ggml, qi_quant_nvfp4_ggml, qi_dot_nvfp4_ggml},
    /* Native NVFP4 payload alone: codes at unit scale. Its dot needs the
     * companion scales, so it goes through mu_weight_dot_row. */
    {MU_TYPE_NVFP4_E2M1, 2, 1, false, qi_dequant_e2m1_codes, qi_quant_e2m1_codes, NULL},
    {MU_TYPE_F8_E4M3FN, 1, 1, false, qi_dequant_e4m3fn, qi_quant_e4m3fn, NULL},
};

/* Slots: ids 0..63 directly, then 1000 and 1001. */
enum { SLOT_LOW = 64, SLOT_COUNT = 66 };
static mu_type_traits TABLE[SLOT_COUNT];
static mu_type_traits UNKNOWN; /* name NULL, supported false */
static pthread_once_t TABLE_ONCE = PTHREAD_ONCE_INIT;

static int slot_of(uint32_t id) {
    if (id < SLOT_LOW) return (int)id;
    if (id == MU_TYPE_NVFP4_E2M1 || id == MU_TYPE_F8_E4M3FN) return SLOT_LOW + (int)(id - 1000);
    return -1;
}

static void fill_slot(uint32_t id) {
    mu_type_traits *t = &TABLE[slot_of(id)];
    if (!mu_type_size(id, &t->block_elems, &t->block_bytes)) return;
    t->name = mu_type_name(id);
    for (size_t i = 0; i < sizeof IMPLS / sizeof IMPLS[0]; i++) {
        const impl *m = &IMPLS[i];
        /* A size disagreement with types.c leaves the type unsupported. */
        if (m->id != id || m->block_elems != t->block_elems || m->block_bytes != t->block_bytes) continue;
        t->supported = true;
        t->is_float = m->is_float;
        t->dequantize = m->dequantize;
        t->quantize = m->quantize;
        t->dot_q8k = m->dot_q8k;
    }
}

static void build_table(void) {
    for (uint32_t id = 0; id < SLOT_LOW; id++) fill_slot(id);
    fill_slot(MU_TYPE_NVFP4_E2M1);
    fill_slot(MU_TYPE_F8_E4M3FN);
}

const mu_type_traits *mu_type_get(uint32_t type) {
    pthread_once(&TABLE_ONCE, build_table);
    int s = slot_of(type);
    if (s < 0 || !TABLE[s].name) return &UNKNOWN;
    return &TABLE[s];
}

void mu_quantize_row(uint32_t type, const float *src, void *dst, int64_t n) {
    const mu_type_traits *t = mu_type_get(type);
    if (t->supported && n % t->block_elems == 0) t->quantize(src, dst, n);
}
