/* FP8 E4M3FN, ggml's UE4M3 and FP4 E2M1 (docs/model.md): decode tables,
 * rounding rules and the exact integer twins used by the NVFP4 dots. */
#include "quant/quant_internal.h"
#include <math.h>

static const float E2M1_VALUES[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};
/* |value| * 2 for the 8 magnitudes. */
static const int32_t E2M1_Q1[8] = {0, 1, 2, 3, 4, 6, 8, 12};

float mu_e2m1_to_f32(uint8_t code) { return E2M1_VALUES[code & 0xF]; }

int32_t mu_e2m1_q1(uint8_t code) {
    int32_t m = E2M1_Q1[code & 7];
    return (code & 8) ? -m : m;
}

/* ModelOpt midpoints scaled by s; the inclusive/exclusive pattern is
 * ties-to-even (codes 0, 2, 4, 6 have an even mantissa). NaN gives 7, as in
 * the reference (no comparison holds). */
uint8_t qi_e2m1_magnitude_code(float a, float s) {
    if (a <= s * 0.25f) return 0;
    if (a < s * 0.75f) return 1;
    if (a <= s * 1.25f) return 2;
    if (a < s * 1.75f) return 3;
    if (a <= s * 2.5f) return 4;
    if (a < s * 3.5f) return 5;
    if (a <= s * 5.0f) return 6;
    return 7;
}

/* The sign comes from the sign bit, so -0.0 maps to code 8. */
uint8_t mu_e2m1_from_f32(float f) {
    uint8_t sign = (mu_f32_bits(f) >> 31) ? 8 : 0;
    return sign | qi_e2m1_magnitude_code(fabsf(f), 1.0f);
}

/* Magnitude of E4M3 bits 0..6 (exponent field e, mantissa m, bias 7):
 * e == 0: m * 2^-9; else (8 + m) * 2^(e - 10). Built from bits, exact. */
static float e4m3_magnitude(uint8_t b) {
    uint32_t e = (b >> 3) & 0xF, m = b & 7;
    if (e == 0) return (float)m * (1.0f / 512.0f);
    return mu_bits_f32(((e + 120) << 23) | (m << 20));
}

float mu_e4m3fn_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80) << 24;
    if ((b & 0x7F) == 0x7F) return mu_bits_f32(sign | 0x7FC00000u);
    return mu_bits_f32(sign | mu_f32_bits(e4m3_magnitude(b)));
}

int32_t mu_e4m3fn_q9(uint8_t b) {
    int32_t e = (b >> 3) & 0xF, m = b & 7;
    int32_t mag = e == 0 ? m : (8 + m) << (e - 1);
    return (b & 0x80) ? -mag : mag;
}

/* Nearest finite E4M3FN code, ties to the even code, saturating at 448.
 * Subnormal range (< 2^-6): code = RNE(|f| * 512) (0..8; 8 is 2^-6, the
 * first normal code). Normal range: keep 3 mantissa bits of the f32 with
 * RNE on the dropped 20 bits; a mantissa carry bumps the exponent, which is
 * exactly the next code. The code's low bit is the mantissa's low bit, so
 * "even mantissa" is "even code". */
uint8_t mu_e4m3fn_from_f32(float f) {
    uint32_t bits = mu_f32_bits(f);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    uint32_t abits = bits & 0x7FFFFFFFu;
    if (abits > 0x7F800000u) return 0x7F;
    float a = mu_bits_f32(abits);
    if (a >= 448.0f) return sign | 0x7E;
    if (a < 0.015625f) {
        float scaled = a * 512.0f;          /* exact: power-of-two scaling */
        return sign | (uint8_t)qi_nearest(scaled);
    }
    uint32_t exp = (abits >> 23) - 127 + 7;  /* 1..15 */
    uint32_t code = (exp << 3) | ((abits >> 20) & 7);
    uint32_t rest = abits & 0xFFFFF, half = 0x80000;
    if (rest > half || (rest == half && (code & 1))) code++;
    return sign | (uint8_t)code;
}

/* ggml's UE4M3 decode (ggml_ue4m3_to_fp32 times 2, since our E2M1 table is
 * not doubled): bytes 0x00 and 0x7F decode to 0; otherwise bit 7 is ignored
 * and the E4M3 formula applies (so 0xFF gives 480, exactly as ggml). */
float mu_ue4m3_to_f32(uint8_t b) {
    if (b == 0x00 || b == 0x7F) return 0.0f;
    return e4m3_magnitude(b & 0x7F);
}

int32_t qi_ue4m3_q9(uint8_t b) {
    if (b == 0x00 || b == 0x7F) return 0;
    int32_t e = (b >> 3) & 0xF, m = b & 7;
    return e == 0 ? m : (8 + m) << (e - 1);
}
