/* The CPU backend's load-time weight layout, MU_LAYOUT_X16 (quant.h).
 *
 * Decode streams every weight byte once per token, so its speed is the
 * memory's. The GGUF's row order makes a matrix-vector kernel either sum
 * within a row (a horizontal reduction per 256-block) or read 16 row
 * streams at once. X16 stores each group of 16 rows block by block, with the
 * 16 rows' bytes interleaved a dword at a time, so one 512-bit load holds
 * the same dword of 16 rows: one `vpdpbusd` against a broadcast activation
 * dword advances 16 row dot products, lane r = row r, and the weights are
 * one sequential stream. Layout of group g (rows 16g .. 16g+15), block b, for
 * bb bytes per 256-value block (nd = bb / 4 dwords, rem = bb % 4):
 *
 *   at  (g * nb + b) * 16 * bb:
 *     [0, 64 * nd)              dword k of row r at 64 k + 4 r
 *     [64 nd, 64 nd + 16 rem)   the row's last rem bytes at 64 nd + rem r
 *
 * The group occupies exactly the bytes its 16 GGUF rows did, and rows past
 * the last full group keep their GGUF bytes, so the repack is in place and
 * the weight's memory does not grow. Integer sums are exact in any order and
 * the kernels keep the reference's float order, so the bits do not change. */
#ifndef MUSER_CPU_REPACK_H
#define MUSER_CPU_REPACK_H
#include "quant/quant.h"

/* Is w stored as X16: Q4_K, Q5_K or Q6_K (the formats with an X16 kernel;
 * cpu_avx512_x16.c), GGUF row layout, at least 16 rows, n_in a multiple of
 * 256? Packing and unpacking below work for any block size. */
bool mu_cpu_x16_eligible(const mu_weight *w);
/* Bytes of one 256-value block of a row (Q4_K 144, Q5_K 176, Q6_K 210). */
uint64_t mu_cpu_x16_block_bytes(const mu_weight *w);
/* Rows in X16 groups: 16 * floor(n_out / 16). */
static inline int64_t mu_cpu_x16_rows(const mu_weight *w) { return w->n_out & ~(int64_t)15; }
/* Group g, block b of an X16 weight. */
static inline const uint8_t *mu_cpu_x16_at(const mu_weight *w, uint64_t bb, int64_t g, int64_t b) {
    return w->data + ((uint64_t)g * (uint64_t)(w->n_in / MU_QK_K) + (uint64_t)b) * 16 * bb;
}
/* Rewrite groups [g0, g1) of w's GGUF bytes as X16, in place (`data` is
 * w->data, writable). Groups are independent: threads may take disjoint
 * ranges. The caller sets w->layout once every group is done. */
void mu_cpu_x16_pack_groups(const mu_weight *w, uint8_t *data, int64_t g0, int64_t g1);
/* The reference inverse: the 16 GGUF blocks of the group block at grp
 * (mu_cpu_x16_at) into out[16][bb]. */
void mu_cpu_x16_unpack_ref(const uint8_t *grp, uint64_t bb, uint8_t *out);

#endif
