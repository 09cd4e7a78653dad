/* MU_LAYOUT_X16 / MU_LAYOUT_X8: the in-place load-time repack and its
 * reference inverse (cpu_repack.h has the layout). Plain C: it runs once
 * per weight at load. */
#include "backend/cpu/cpu_repack.h"
#include "util/common.h"
#include <stdlib.h>
#include <string.h>

bool mu_cpu_pack_eligible(const mu_weight *w, int width) {
    const bool kquant = w->type == MU_TYPE_Q4_K || w->type == MU_TYPE_Q5_K || w->type == MU_TYPE_Q6_K;
    return kquant && w->layout == MU_LAYOUT_ROWS && !w->nvfp4_scales && w->n_out >= width && w->n_in > 0 &&
           w->n_in % MU_QK_K == 0;
}

uint64_t mu_cpu_pack_block_bytes(const mu_weight *w) { return w->row_bytes / (uint64_t)(w->n_in / MU_QK_K); }

/* One group-block: W GGUF blocks (row r at rows + r * stride) interleaved. */
static void pack_block(const uint8_t *rows, uint64_t stride, uint64_t bb, uint64_t W, uint8_t *out) {
    const uint64_t nd = bb / 4, rem = bb % 4;
    for (uint64_t r = 0; r < W; r++) {
        const uint8_t *src = rows + r * stride;
        for (uint64_t k = 0; k < nd; k++) memcpy(out + 4 * W * k + 4 * r, src + 4 * k, 4);
        for (uint64_t i = 0; i < rem; i++) out[4 * W * nd + rem * r + i] = src[4 * nd + i];
    }
}

void mu_cpu_unpack_ref(const uint8_t *grp, uint64_t bb, int width, uint8_t *out) {
    const uint64_t nd = bb / 4, rem = bb % 4, W = (uint64_t)width;
    for (uint64_t r = 0; r < W; r++) {
        uint8_t *dst = out + r * bb;
        for (uint64_t k = 0; k < nd; k++) memcpy(dst + 4 * k, grp + 4 * W * k + 4 * r, 4);
        for (uint64_t i = 0; i < rem; i++) dst[4 * nd + i] = grp[4 * W * nd + rem * r + i];
    }
}

void mu_cpu_pack_groups(const mu_weight *w, uint8_t *data, int width, int64_t g0, int64_t g1) {
    const int64_t nb = w->n_in / MU_QK_K;
    const uint64_t W = (uint64_t)width, bb = mu_cpu_pack_block_bytes(w), group_bytes = W * w->row_bytes; /* a multiple of 16 */
    uint8_t *tmp = mu_xmalloc(group_bytes);
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *grp = data + (uint64_t)g * group_bytes;
        /* fixed-size copies on purpose: glibc's `rep movsb` for one large
         * memcpy ran at 0.4 GB/s here between these page-aliased buffers */
        for (uint64_t i = 0; i < group_bytes; i += 16) memcpy(tmp + i, grp + i, 16);
        for (int64_t b = 0; b < nb; b++) pack_block(tmp + (uint64_t)b * bb, w->row_bytes, bb, W, grp + (uint64_t)b * W * bb);
    }
    free(tmp);
}
