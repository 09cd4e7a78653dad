/* UTF-8 validation and the GPT-2 byte-level alphabet. */
#include "tokenizer/tok_internal.h"

/* Second-byte range for a lead byte (Unicode Table 3-7); lo > hi = invalid
 * lead. Later continuation bytes are always 80..BF. */
static void lead_info(uint8_t c, size_t *len, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) *len = 1;
    else if (c >= 0xC2 && c <= 0xDF) *len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        *len = 3;
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *len = 4;
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
    } else {
        *len = 0;
    }
}

size_t tok_utf8_valid_len(const uint8_t *s, size_t n) {
    size_t len;
    uint8_t lo, hi;
    if (!n) return 0;
    lead_info(s[0], &len, &lo, &hi);
    if (!len || len > n) return 0;
    if (len > 1 && (s[1] < lo || s[1] > hi)) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

bool tok_utf8_is_valid_prefix(const uint8_t *s, size_t n) {
    size_t len;
    uint8_t lo, hi;
    if (!n) return true;
    lead_info(s[0], &len, &lo, &hi);
    if (!len || n >= len) return false; /* invalid lead, or not a proper prefix */
    if (n > 1 && (s[1] < lo || s[1] > hi)) return false;
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return false;
    return true;
}

size_t tok_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's table: the printable Latin-1 bytes stand for themselves, the other
 * 68 bytes map to U+0100.. in byte order (space -> U+0120). */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

/* The 68 remapped bytes are 00..20, 7F..A0 and AD, in that order. */
uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 33 + (b - 0x7Fu);
    return 0x100 + 67; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(0x7F + (cp - 0x121));
    if (cp == 0x143) return 0xAD;
    return -1;
}

int64_t tok_bytelevel_decode(const char *s, size_t n, char *out) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        if (u[i] < 0x80) {
            cp = u[i++];
        } else if (i + 1 < n && u[i] >= 0xC2 && u[i] <= 0xC5 && (u[i + 1] & 0xC0) == 0x80) {
            cp = (uint32_t)(u[i] & 0x1F) << 6 | (u[i + 1] & 0x3F);
            i += 2;
        } else {
            return -1; /* every table code point is below U+0180 */
        }
        int b = tok_cp_to_byte(cp);
        if (b < 0) return -1;
        out[o++] = (char)b;
    }
    return (int64_t)o;
}
