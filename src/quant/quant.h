/* Block formats: one traits entry per ggml type id (sizes, dequantize,
 * quantize, reference dot against Q8_K activations), plus the weight-row
 * contract every backend reproduces bit for bit (docs/numerics.md). */
#ifndef MUSER_QUANT_H
#define MUSER_QUANT_H
#include "util/common.h"

enum mu_type {
    MU_TYPE_F32 = 0,
    MU_TYPE_F16 = 1,
    MU_TYPE_Q4_0 = 2,
    MU_TYPE_Q4_1 = 3,
    MU_TYPE_Q5_0 = 6,
    MU_TYPE_Q5_1 = 7,
    MU_TYPE_Q8_0 = 8,
    MU_TYPE_Q8_1 = 9,
    MU_TYPE_Q2_K = 10,
    MU_TYPE_Q3_K = 11,
    MU_TYPE_Q4_K = 12,
    MU_TYPE_Q5_K = 13,
    MU_TYPE_Q6_K = 14,
    MU_TYPE_Q8_K = 15,
    MU_TYPE_BF16 = 30,
    MU_TYPE_NVFP4 = 40,          /* llama.cpp GGML_TYPE_NVFP4: 64 values, 4 UE4M3 scales, 36 B */
    MU_TYPE_NVFP4_E2M1 = 1000,   /* native NVFP4 payload: 2 codes per byte, low nibble = even index (docs/model.md) */
    MU_TYPE_F8_E4M3FN = 1001,    /* native NVFP4 per-16 scales */
};

#define MU_QK_K 256

/* Q8_K activation block: 256 int8 codes, one f32 scale, 16 group sums. */
typedef struct mu_block_q8k {
    float d;
    int8_t qs[MU_QK_K];
    int16_t bsums[MU_QK_K / 16];
} mu_block_q8k;

typedef struct mu_type_traits {
    const char *name;          /* "Q4_K", ... ; NULL for unknown ids */
    uint32_t block_elems;      /* values per block */
    uint32_t block_bytes;      /* bytes per block */
    bool supported;            /* dequantize/quantize/dot implemented */
    bool is_float;             /* F32/F16/BF16: float dot against f32 activations */
    /* n is a multiple of block_elems. */
    void (*dequantize)(const void *src, float *dst, int64_t n);
    void (*quantize)(const float *src, void *dst, int64_t n);
    /* Contribution of one 256-value super-block (Q8_K-dotted formats only):
     * w points at the weight bytes covering those 256 values. */
    float (*dot_q8k)(const void *w, const mu_block_q8k *x);
} mu_type_traits;

/* Sizes of every ggml type id the GGUF container may carry (src/quant/types.c;
 * used by the GGUF reader). false for unknown ids. */
bool mu_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);
/* Canonical upper-case name ("Q4_K"), or NULL for unknown ids. */
const char *mu_type_name(uint32_t type);
/* Traits with implementations (src/quant/traits.c). Never NULL: unknown or
 * unimplemented ids get an entry with supported == false. */
const mu_type_traits *mu_type_get(uint32_t type);
/* Parse a type name ("q4_k", "F16", "nvfp4" = native, "nvfp4_ggml" = type 40). -1 if unknown. */
int64_t mu_type_from_name(const char *name);
/* Bytes for n values of type, false if n is not a multiple of the block or overflow. */
bool mu_type_row_bytes(uint32_t type, uint64_t n, uint64_t *out);

/* Q8_K quantizer (ggml rule): max = signed value of the first element with
 * the largest magnitude; iscale = -127/max; q = min(127, nearest(iscale*x));
 * d = 1/iscale; an all-zero block has d = 0. via_f16 rounds each input
 * through f16 first (the native NVFP4 W4A16 contract). n % 256 == 0. */
void mu_quantize_q8k(const float *x, mu_block_q8k *y, int64_t n, bool via_f16);
void mu_dequantize_q8k(const mu_block_q8k *x, float *y, int64_t n);

/* FP8/FP4 helpers (formats: docs/model.md, Minifloats). */
float mu_e4m3fn_to_f32(uint8_t b);         /* NaN for 0x7F/0xFF */
uint8_t mu_e4m3fn_from_f32(float f);       /* nearest, ties to even code, saturate 448, NaN->0x7F */
float mu_ue4m3_to_f32(uint8_t b);          /* ggml NVFP4 block scale: sign bit ignored */
float mu_e2m1_to_f32(uint8_t code);        /* 16-entry codebook, code 8 = -0.0 */
uint8_t mu_e2m1_from_f32(float f);         /* ModelOpt ties-to-even midpoints */
int32_t mu_e2m1_q1(uint8_t code);          /* value * 2 as integer */
int32_t mu_e4m3fn_q9(uint8_t b);           /* value * 512 as integer (finite codes) */

/* Byte order of a weight's data. MU_LAYOUT_ROWS is the GGUF's (n_out rows
 * of row_bytes, what every generic reader here expects). MU_LAYOUT_X16 and
 * MU_LAYOUT_X8 are the CPU backend's load-time repacks (cpu_repack.h): each
 * group of 16 (AVX-512) or 8 (AVX2) rows stored block by block with the
 * rows' dwords interleaved; rows past the last full group keep their GGUF
 * bytes and offsets. Only that backend reads them. */
enum { MU_LAYOUT_ROWS = 0, MU_LAYOUT_X16 = 1, MU_LAYOUT_X8 = 2 };

/* A weight matrix as the forward pass sees it: n_out rows of n_in values.
 * All pointers are views into the GGUF mapping. */
typedef struct mu_weight {
    const char *name;
    uint32_t type;
    const uint8_t *data;
    const uint8_t *nvfp4_scales; /* native NVFP4 only: n_in/16 E4M3FN bytes per row */
    float scale;                 /* native NVFP4 scale2, ggml `.scale` tensor, else 1.0f */
    bool has_scale;              /* apply `scale` (false: exactly no multiply) */
    float input_scale_inv;       /* native NVFP4 W4A4 mode when > 0 */
    int64_t n_in, n_out;
    uint64_t row_bytes;
    uint8_t layout;              /* MU_LAYOUT_*; a backend's repack sets it */
} mu_weight;

/* Does this weight consume Q8_K activations (and with the f16 pre-round)? */
bool mu_weight_uses_q8k(const mu_weight *w, bool *via_f16);

/* The canonical row dot (the numerical specification):
 *  - float types: 32 strided partials p[i%32] = fmaf(w[i], x[i], p[i%32]),
 *    i ascending, then pairwise fold p[l] += p[l+h] for h = 16,8,4,2,1.
 *  - Q8_K-dotted types: total = 0; for each 256-block b in order:
 *    total += f_b (traits dot_q8k); then the per-tensor epilogue.
 * xq must hold n_in/256 blocks quantized as mu_weight_uses_q8k says
 * (ignored for float types); x is the f32 activation row (used by float types
 * and by NVFP4 W4A4). */
float mu_weight_dot_row(const mu_weight *w, int64_t row, const float *x, const mu_block_q8k *xq);
/* Dequantize one row to f32 (embedding lookup, tests). */
void mu_weight_dequant_row(const mu_weight *w, int64_t row, float *dst);

/* Canonical f32 dot (the float-type rule above), shared by norms, attention. */
float mu_dot_f32(const float *a, const float *b, int64_t n);
/* Canonical sum of squares (same 32-lane structure with fmaf(x, x, p)). */
float mu_sumsq_f32(const float *a, int64_t n);

/* Quantize one f32 row into `type` (payload only). For native NVFP4 use
 * mu_nvfp4_quantize_row which also produces the scale bytes given scale2. */
void mu_quantize_row(uint32_t type, const float *src, void *dst, int64_t n);
/* Native NVFP4: global scale2 = amax(|W|)/(6*448) over the whole tensor
 * (caller computes it); per 16 values scale = e4m3(amax16/6/scale2). */
void mu_nvfp4_quantize_row(const float *src, uint8_t *payload, uint8_t *scales, float scale2, int64_t n);
void mu_nvfp4_dequant_row(const uint8_t *payload, const uint8_t *scales, float scale2, float *dst, int64_t n);

/* Additions (src/quant/nvfp4.c, src/quant/weight_row.c). */
/* scale2 = amax(|w|)/(6*448) over n values; 1.0f for an all-zero tensor. */
float mu_nvfp4_tensor_scale2(const float *w, int64_t n);
/* Native NVFP4 f_b for one 256-value block (128 payload bytes, 16 scale
 * bytes): ((float)itotal * 2^-10) * x->d, without scale2. */
float mu_nvfp4_dot_q8k(const uint8_t *payload, const uint8_t *scales, const mu_block_q8k *x);
/* Native NVFP4 W4A4 row dot (order: docs/numerics.md), f16-rounded result; n % 16 == 0. */
float mu_nvfp4_w4a4_dot(const uint8_t *payload, const uint8_t *scales, float scale2,
                        float input_scale_inv, const float *x, int64_t n);
/* Validate a weight view before any dot: supported matmul type, n_in
 * multiple required by the type (256 for Q8_K-dotted types and native
 * W4A16, 16 for W4A4), row_bytes, companions, finite positive scale2. */
bool mu_weight_check(const mu_weight *w, mu_error *err);
/* Q4_K/Q5_K 12-byte scale strip: 8 six-bit scales and 8 six-bit mins. */
void mu_kquant_pack_scales(uint8_t scales[12], const uint8_t sc[8], const uint8_t m[8]);
void mu_kquant_unpack_scales(const uint8_t scales[12], uint8_t sc[8], uint8_t m[8]);

#endif
