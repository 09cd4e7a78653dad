/* The CPU backend's load-time weight layouts, MU_LAYOUT_X16 and
 * MU_LAYOUT_X8 (quant.h): the same interleave for groups of W = 16 rows
 * (AVX-512: a zmm holds one dword of 16 rows) or W = 8 rows (AVX2: a ymm).
 *
 * Decode streams every weight byte once per token, so its speed is the
 * memory's. The GGUF's row order makes a matrix-vector kernel either sum
 * within a row (a horizontal reduction per 256-block) or read W row
 * streams at once. The packed layout stores each group of W rows block by
 * block, with the W rows' bytes interleaved a dword at a time, so one vector
 * load holds the same dword of W rows: one integer dot (`vpdpbusd`, or
 * `vpmaddubsw` + `vpmaddwd`) against a broadcast activation dword advances W
 * row dot products, lane r = row r, and the weights are one sequential
 * stream. Layout of group g (rows W g .. W g + W - 1), block b, for bb bytes
 * per 256-value block (nd = bb / 4 dwords, rem = bb % 4):
 *
 *   at  (g * nb + b) * W * bb:
 *     [0, 4 W nd)               dword k of row r at 4 W k + 4 r
 *     [4 W nd, 4 W nd + W rem)  the row's last rem bytes at 4 W nd + rem r
 *
 * The group occupies exactly the bytes its W GGUF rows did, and rows past
 * the last full group keep their GGUF bytes, so the repack is in place and
 * the weight's memory does not grow. Integer sums are exact in any order and
 * the kernels keep the reference's float order, so the bits do not change. */
#ifndef MUSER_CPU_REPACK_H
#define MUSER_CPU_REPACK_H
#include "quant/quant.h"

/* Rows per group of a layout: 16 (X16), 8 (X8), 1 (GGUF rows). */
static inline int mu_cpu_pack_width(uint8_t layout) {
    return layout == MU_LAYOUT_X16 ? 16 : layout == MU_LAYOUT_X8 ? 8 : 1;
}
/* Can w be packed in groups of `width` rows: Q4_K, Q5_K or Q6_K (the
 * formats with packed kernels: cpu_avx512_x16.c, cpu_avx2_x8.c), GGUF row
 * layout, at least `width` rows, n_in a multiple of 256? Packing and
 * unpacking below work for any block size. */
bool mu_cpu_pack_eligible(const mu_weight *w, int width);
/* Bytes of one 256-value block of a row (Q4_K 144, Q5_K 176, Q6_K 210). */
uint64_t mu_cpu_pack_block_bytes(const mu_weight *w);
/* Rows in packed groups: width * floor(n_out / width). */
static inline int64_t mu_cpu_pack_rows(const mu_weight *w, int width) { return w->n_out / width * width; }
/* Group g, block b of a weight packed in groups of `width`. */
static inline const uint8_t *mu_cpu_pack_at(const mu_weight *w, uint64_t bb, int width, int64_t g, int64_t b) {
    return w->data + ((uint64_t)g * (uint64_t)(w->n_in / MU_QK_K) + (uint64_t)b) * (uint64_t)width * bb;
}
/* Rewrite groups [g0, g1) of w's GGUF bytes in groups of `width`, in place
 * (`data` is w->data, writable). Groups are independent: threads may take
 * disjoint ranges. The caller sets w->layout once every group is done. */
void mu_cpu_pack_groups(const mu_weight *w, uint8_t *data, int width, int64_t g0, int64_t g1);
/* The reference inverse: the `width` GGUF blocks of the group block at grp
 * (mu_cpu_pack_at) into out[width][bb]. */
void mu_cpu_unpack_ref(const uint8_t *grp, uint64_t bb, int width, uint8_t *out);

#endif
