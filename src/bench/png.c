/* A minimal PNG writer: 8-bit indexed color, one zlib stream of stored
 * (uncompressed) deflate blocks, CRC-32 per chunk and Adler-32 per stream
 * computed here, so the plot needs no compression library. */
#include "bench/bench.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[n] = c;
    }
}

static uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc;
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static bool write_chunk(FILE *f, const char *type, const uint8_t *data, size_t n) {
    uint8_t hdr[8], tail[4];
    put_be32(hdr, (uint32_t)n);
    memcpy(hdr + 4, type, 4);
    uint32_t crc = crc_update(0xFFFFFFFFu, hdr + 4, 4);
    crc = crc_update(crc, data, n) ^ 0xFFFFFFFFu;
    put_be32(tail, crc);
    return fwrite(hdr, 1, 8, f) == 8 && (n == 0 || fwrite(data, 1, n, f) == n) && fwrite(tail, 1, 4, f) == 4;
}

/* zlib stream (RFC 1950) of stored deflate blocks (RFC 1951 BTYPE 00). */
static uint8_t *zlib_stored(const uint8_t *raw, size_t n, size_t *out_n) {
    const size_t max_block = 65535, blocks = n / max_block + 1;
    uint8_t *z = mu_xmalloc(2 + n + blocks * 5 + 4), *p = z;
    *p++ = 0x78;
    *p++ = 0x01;
    size_t off = 0;
    do {
        size_t len = n - off < max_block ? n - off : max_block;
        *p++ = off + len == n ? 1 : 0;
        p[0] = (uint8_t)len;
        p[1] = (uint8_t)(len >> 8);
        p[2] = (uint8_t)~len;
        p[3] = (uint8_t)(~len >> 8);
        p += 4;
        memcpy(p, raw + off, len);
        p += len;
        off += len;
    } while (off < n);
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + raw[i]) % 65521;
        b = (b + a) % 65521;
    }
    put_be32(p, b << 16 | a);
    *out_n = (size_t)(p + 4 - z);
    return z;
}

bool mu_png_write_indexed(const char *path, const uint8_t *pixels, int width, int height, const uint8_t *palette_rgb,
                          int n_colors, mu_error *err) {
    if (width <= 0 || height <= 0 || n_colors < 1 || n_colors > 256) {
        mu_err_set(err, "png %s: bad geometry %dx%d or %d colors", path, width, height, n_colors);
        return false;
    }
    crc_init();
    const size_t row = (size_t)width + 1, raw_n = row * (size_t)height;
    uint8_t *raw = mu_xmalloc(raw_n);
    for (int y = 0; y < height; y++) {
        raw[(size_t)y * row] = 0; /* filter: none */
        memcpy(raw + (size_t)y * row + 1, pixels + (size_t)y * (size_t)width, (size_t)width);
    }
    size_t z_n;
    uint8_t *z = zlib_stored(raw, raw_n, &z_n);
    free(raw);
    uint8_t ihdr[13];
    put_be32(ihdr, (uint32_t)width);
    put_be32(ihdr + 4, (uint32_t)height);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 3;  /* palette */
    ihdr[10] = ihdr[11] = ihdr[12] = 0;
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(sig, 1, 8, f) == 8 && write_chunk(f, "IHDR", ihdr, 13) &&
              write_chunk(f, "PLTE", palette_rgb, (size_t)n_colors * 3) && write_chunk(f, "IDAT", z, z_n) &&
              write_chunk(f, "IEND", NULL, 0);
    if (f && fclose(f) != 0) ok = false;
    if (!ok) mu_err_set(err, "png %s: %s", path, f ? "write failed" : strerror(errno));
    free(z);
    return ok;
}
