/* The canonical row dot: the numerical specification every backend (ref,
 * cpu SIMD, cuda) reproduces bit for bit. Written plainly on purpose; each
 * formula below is the contract, operation by operation (f32 arithmetic,
 * no contraction: every fused multiply-add is an explicit fmaf).
 *
 * Float weights (F32, F16, BF16) against f32 activations x, and mu_dot_f32,
 * mu_sumsq_f32:
 *   p[0..31] = +0.0f
 *   for i = 0 .. n-1 ascending: p[i % 32] = fmaf(w[i], x[i], p[i % 32])
 *   for h = 16, 8, 4, 2, 1: for l = 0 .. h-1: p[l] = p[l] + p[l + h]
 *   result = p[0]        (F16/BF16 weights are converted exactly to f32)
 *
 * Q8_K-dotted weights (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, ggml NVFP4), with the
 * activation row quantized by mu_quantize_q8k(via_f16 = false):
 *   total = 0.0f; for each 256-value block b ascending: total = total + f_b
 *   f_b is the format's written formula (legacy.c, kquants.c, nvfp4.c):
 *   exact integer sums inside the block, then a few named f32 operations.
 *
 * Native NVFP4 W4A16 (type 1000, input_scale_inv == 0), activations
 * quantized with via_f16 = true (the order of docs/numerics.md):
 *   total = 0.0f; for each b: total = total + ((((float)itotal_b * 0x1p-10f)
 *           * xd_b) * scale2);  result = f32(f16(total))
 * Native NVFP4 W4A4 (input_scale_inv > 0): mu_nvfp4_w4a4_dot on the f32 x.
 *
 * Epilogue for every non-native type: if has_scale, result = result * scale
 * (ggml's optional `.scale` tensor); without has_scale there is no multiply.
 * n_in must be a multiple of 256 for the Q8_K-dotted types and native W4A16
 * (16 for W4A4); mu_weight_check verifies this and the rest of the view. */
#include "quant/quant_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { LANES = 32 };

static float fold_lanes(float *p) {
    for (int h = LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) p[l] = p[l] + p[l + h];
    return p[0];
}

float mu_dot_f32(const float *a, const float *b, int64_t n) {
    float p[LANES] = {0};
    for (int64_t i = 0; i < n; i++) p[i % LANES] = fmaf(a[i], b[i], p[i % LANES]);
    return fold_lanes(p);
}

float mu_sumsq_f32(const float *a, int64_t n) {
    float p[LANES] = {0};
    for (int64_t i = 0; i < n; i++) p[i % LANES] = fmaf(a[i], a[i], p[i % LANES]);
    return fold_lanes(p);
}

/* Float-weight dot: weights converted 32 at a time (exact), same lanes. */
static float float_weight_dot(const mu_type_traits *t, const uint8_t *w, const float *x, int64_t n) {
    float p[LANES] = {0}, wf[LANES];
    for (int64_t i0 = 0; i0 < n; i0 += LANES) {
        int64_t m = n - i0 < LANES ? n - i0 : LANES;
        t->dequantize(w + i0 * t->block_bytes, wf, m);
        for (int64_t k = 0; k < m; k++) p[k] = fmaf(wf[k], x[i0 + k], p[k]);
    }
    return fold_lanes(p);
}

static bool is_native(const mu_weight *w) { return w->type == MU_TYPE_NVFP4_E2M1; }
static bool is_w4a4(const mu_weight *w) { return is_native(w) && w->input_scale_inv > 0.0f; }

bool mu_weight_uses_q8k(const mu_weight *w, bool *via_f16) {
    bool uses = false, f16 = false;
    if (is_native(w)) {
        uses = !is_w4a4(w);
        f16 = uses;
    } else {
        const mu_type_traits *t = mu_type_get(w->type);
        uses = t->supported && t->dot_q8k != NULL;
    }
    if (via_f16) *via_f16 = f16;
    return uses;
}

static float native_dot_row(const mu_weight *w, int64_t row, const float *x, const mu_block_q8k *xq) {
    const uint8_t *payload = w->data + row * (w->n_in / 2);
    const uint8_t *scales = w->nvfp4_scales + row * (w->n_in / 16);
    if (is_w4a4(w)) return mu_nvfp4_w4a4_dot(payload, scales, w->scale, w->input_scale_inv, x, w->n_in);
    float total = 0.0f;
    for (int64_t b = 0; b < w->n_in / MU_QK_K; b++) {
        float f = mu_nvfp4_dot_q8k(payload + b * (MU_QK_K / 2), scales + b * (MU_QK_K / 16), xq + b);
        f = f * w->scale;
        total = total + f;
    }
    return mu_round_f16(total);
}

/* The generic readers below index GGUF rows; a backend's repacked weight
 * reaching them is a programming error, never a silent wrong answer. */
static void require_rows_layout(const mu_weight *w) {
    if (w->layout == MU_LAYOUT_ROWS) return;
    fprintf(stderr, "muser: internal error: weight %s is in a backend's repacked layout (%d)\n", w->name ? w->name : "?",
            (int)w->layout);
    abort();
}

float mu_weight_dot_row(const mu_weight *w, int64_t row, const float *x, const mu_block_q8k *xq) {
    require_rows_layout(w);
    if (is_native(w)) return native_dot_row(w, row, x, xq);
    const mu_type_traits *t = mu_type_get(w->type);
    const uint8_t *rowp = w->data + (uint64_t)row * w->row_bytes;
    float total;
    if (t->supported && t->is_float) {
        total = float_weight_dot(t, rowp, x, w->n_in);
    } else if (t->supported && t->dot_q8k) {
        const uint64_t bytes_per_256 = (uint64_t)(MU_QK_K / t->block_elems) * t->block_bytes;
        total = 0.0f;
        for (int64_t b = 0; b < w->n_in / MU_QK_K; b++)
            total = total + t->dot_q8k(rowp + (uint64_t)b * bytes_per_256, xq + b);
    } else {
        return NAN; /* unreachable after mu_weight_check */
    }
    if (w->has_scale) total = total * w->scale;
    return total;
}

void mu_weight_dequant_row(const mu_weight *w, int64_t row, float *dst) {
    require_rows_layout(w);
    if (is_native(w)) {
        mu_nvfp4_dequant_row(w->data + row * (w->n_in / 2), w->nvfp4_scales + row * (w->n_in / 16),
                             w->scale, dst, w->n_in);
        return;
    }
    const mu_type_traits *t = mu_type_get(w->type);
    if (!t->supported) {
        for (int64_t i = 0; i < w->n_in; i++) dst[i] = NAN;
        return;
    }
    t->dequantize(w->data + (uint64_t)row * w->row_bytes, dst, w->n_in);
    if (w->has_scale)
        for (int64_t i = 0; i < w->n_in; i++) dst[i] = dst[i] * w->scale;
}

static const char *type_label(uint32_t type) {
    const char *n = mu_type_name(type);
    return n ? n : "unknown";
}

bool mu_weight_check(const mu_weight *w, mu_error *err) {
    const char *name = w->name ? w->name : "(unnamed)";
    const mu_type_traits *t = mu_type_get(w->type);
    const bool native = is_native(w);
    if (!t->supported || !(t->is_float || t->dot_q8k || native)) {
        mu_err_set(err, "tensor %s: type %s (%u) has no matmul implementation", name,
                   type_label(w->type), w->type);
        return false;
    }
    if (w->n_in <= 0 || w->n_out <= 0) {
        mu_err_set(err, "tensor %s: bad shape n_in=%lld n_out=%lld", name, (long long)w->n_in,
                   (long long)w->n_out);
        return false;
    }
    int64_t multiple = t->is_float ? 1 : is_w4a4(w) ? 16 : MU_QK_K;
    if (w->n_in % multiple) {
        mu_err_set(err, "tensor %s: n_in=%lld is not a multiple of %lld, required by type %s", name,
                   (long long)w->n_in, (long long)multiple, type_label(w->type));
        return false;
    }
    uint64_t want;
    if (!mu_type_row_bytes(w->type, (uint64_t)w->n_in, &want) || want != w->row_bytes) {
        mu_err_set(err, "tensor %s: row_bytes=%llu does not match %lld values of type %s", name,
                   (unsigned long long)w->row_bytes, (long long)w->n_in, type_label(w->type));
        return false;
    }
    if (!w->data || (native && !w->nvfp4_scales)) {
        mu_err_set(err, "tensor %s: missing %s", name, w->data ? "NVFP4 scale tensor" : "data");
        return false;
    }
    if (native && !(isfinite(w->scale) && w->scale > 0.0f)) {
        mu_err_set(err, "tensor %s: NVFP4 scale2 %g must be finite and > 0", name, (double)w->scale);
        return false;
    }
    if (!(isfinite(w->input_scale_inv) && w->input_scale_inv >= 0.0f) ||
        (!native && w->input_scale_inv != 0.0f)) {
        mu_err_set(err, "tensor %s: input_scale_inv %g is invalid (native NVFP4 only, finite, > 0)",
                   name, (double)w->input_scale_inv);
        return false;
    }
    if (!native && w->has_scale && !isfinite(w->scale)) {
        mu_err_set(err, "tensor %s: scale %g is not finite", name, (double)w->scale);
        return false;
    }
    return true;
}
