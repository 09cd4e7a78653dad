/* The CUDA side of the cuda backend (cuda_kernels.cu), as plain C: device
 * memory, and one launcher per op. Every pointer here is device memory
 * unless marked host. Each function returns true on success; on failure
 * it writes into err a message naming the CUDA call or kernel and the
 * reason. The kernels reproduce the ref backend's bits exactly
 * (docs/numerics.md); the mu_backend glue is cuda_backend.c. */
#ifndef MUSER_CUDA_KERNELS_H
#define MUSER_CUDA_KERNELS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { MUCU_ERR_LEN = 256 };

/* A weight as the kernels see it: rows of row_bytes in the GGUF layout. */
typedef struct mucu_weight {
    uint32_t type;             /* ggml type id (quant.h's enum mu_type) */
    const uint8_t *data;       /* device */
    const uint8_t *scales;     /* device, native NVFP4 only */
    float scale;
    int has_scale;
    float input_scale_inv;
    int64_t n_in, n_out;
    uint64_t row_bytes;
    int q6_split;              /* Q6_K in the device's split layout (mucu_q6k_split) */
    int fp4_split;             /* NVFP4 (ggml, native W4A16) in the device's split layout (mucu_fp4_split) */
} mucu_weight;

/* The tree registers on the device (backend.h mu_tree_regs, tree_reg):
 * node i's parent, depth and ancestors root first (anc[i][0 .. depth[i]];
 * the rest zero), nodes n .. 15 fillers (parent 0, depth 1). */
typedef struct mucu_tree_regs {
    int32_t n;
    int32_t parent[16], depth[16];
    int8_t anc[16][16];
} mucu_tree_regs;

/* One query row of attention: its sequence's planes and key range. */
typedef struct mucu_attn_row {
    const uint16_t *k, *v;     /* device, head-major [n_head_kv][cap][head_dim] */
    int64_t cap;
    int64_t first, pos;        /* keys at logical [first, pos] */
    /* A token tree's row (backend.h mu_attn_tree): the key at logical
     * tbase + t lies at the ring row of tbase + anc[t]; INT64_MAX: a plain
     * row (key p at row p % cap). */
    int64_t tbase;
    int8_t anc[16];
    /* Not NULL: row r is node r of these tree registers, which a kernel
     * before this one writes: after the wait its position is tbase +
     * depth[r], its first key max(first, pos - window + 1) (window 0:
     * none), its ancestors the registers' (attn_row_resolve); pos and first
     * above only bound them (base + r and the cache's first held key). */
    const mucu_tree_regs *treg;
    int64_t window;
} mucu_attn_row;

/* Its fields for a plain row (k_attn_prefill keeps a CTA's in shared memory). */
typedef struct mucu_attn_row_plain {
    const uint16_t *k, *v;
    int64_t cap, first, pos;
} mucu_attn_row_plain;

/* Largest head_dim the attention kernel takes. */
enum { MUCU_MAX_HEAD_DIM = 512 };

bool mucu_device_count(int *n, char *err);
bool mucu_malloc(void **p, size_t bytes, char *err);
bool mucu_free(void *p, char *err);
/* cudaMemcpyDefault: any direction. */
bool mucu_memcpy(void *dst, const void *src, size_t bytes, const char *what, char *err);
bool mucu_memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows, char *err);
bool mucu_memset0(void *dst, size_t bytes, char *err);
/* In the backend's stream: device to device copies and zero fill (no host
 * wait; a forward's copies, capturable into a graph). */
bool mucu_copy_async(void *dst, const void *src, size_t bytes, char *err);
bool mucu_copy2d_async(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows, char *err);
/* backend.h copy2d_many: n copies described in device memory (c), one launch. */
typedef struct mucu_copy2d {
    void *dst;
    size_t dst_stride;
    const void *src;
    size_t src_stride, width;
    int64_t rows;
} mucu_copy2d;
bool mucu_copy2d_many(const mucu_copy2d *c, int n, int64_t max_rows, char *err);
bool mucu_zero_async(void *dst, size_t bytes, char *err);
/* CUDA graphs (cuda_backend.c's decode graphs): capture what the stream is
 * given between begin and end into a graph; chain graphs into one
 * executable; launch it into the stream. Handles are opaque. */
bool mucu_capture_begin(char *err);
bool mucu_capture_end(void **graph, char *err);
/* ring (may be NULL): the argument ring's pinned host and device copies and
 * the bytes the chained forward used from offset 0; a flat chain uploads
 * them with one copy at its head and drops the per-op copies of the ring
 * (MUSER_CUDA_ONE_UPLOAD, cuda_kernels.cu). */
#define MUCU_RING_PARTS 4 /* the most parts of the argument ring's host staging (cuda_backend.c) */
typedef struct mucu_ring {
    const void *h;
    void *d;
    size_t used;
    const void *more[MUCU_RING_PARTS - 1]; /* other host copies (NULL: none): exec[1 + i] uploads from more[i] */
} mucu_ring;
/* exec[0]; and exec[1 + i], the same chain uploading from ring->more[i],
 * for each more[i] set when the chain is flat with one upload (else NULL). */
bool mucu_graph_chain(void *const *graphs, int n, const mucu_ring *ring, void **exec, char *err);
/* Chained graphs so far that were flattened, their kernel-to-kernel
 * programmatic dependencies (MUSER_CUDA_PDL) and the per-op ring copies
 * merged into one (MUSER_CUDA_ONE_UPLOAD, cuda_kernels.cu). */
void mucu_graph_chain_stats(long *flat, long *programmatic, long *merged);
bool mucu_graph_instantiate(void *graph, void **exec, char *err);
bool mucu_graph_launch(void *exec, char *err);
void mucu_graph_free(void *graph);
void mucu_exec_free(void *exec);
/* Record an event after the stream's work so far (created on first use);
 * wait for it on the host. */
bool mucu_mark(void **ev, char *err);
bool mucu_mark_wait(void *ev, char *err);
bool mucu_mark_timed(void **ev, char *err);
void mucu_mark_free(void *ev);
bool mucu_elapsed_ms(void *e0, void *e1, double *ms, char *err);
bool mucu_host_alloc(void **p, size_t bytes, char *err); /* pinned */
bool mucu_host_free(void *p, char *err);
/* Stream-ordered upload from pinned memory (no host wait). */
bool mucu_upload_async(void *dst, const void *pinned_src, size_t bytes, const char *what, char *err);
bool mucu_sync(const char *what, char *err);
bool mucu_mem_info(size_t *free_b, size_t *total_b, char *name, size_t name_len, char *err);
/* Device read bandwidth in GB/s (best of reps over `bytes`). */
bool mucu_read_bandwidth(size_t bytes, int reps, double *gbs, char *err);
/* Q6_K blocks (210 bytes each) into the device layout: [n] x 192 bytes of
 * ql|qh, then [n] x 16 scales, then [n] f16 d (same total size). */
size_t mucu_q6k_split_bytes(int64_t n_blocks);
void mucu_q6k_split(const uint8_t *src, uint8_t *dst, int64_t n_blocks);
/* NVFP4 rows (device memory) into the device layout of the fast kernels
 * (device memory, mucu_fp4_split_bytes): per 256 values 144 bytes, 16 of
 * E4M3 group scales (word t: the scales of lane t's four 16-value groups)
 * and 128 of codes in Q4_K's value order, one nibble a code, four
 * consecutive values a half-word (cuda_kernels.cu, load_wq2). native: src
 * the payload (n_in/2 bytes a row) and scales the E4M3FN scales (n_in/16
 * a row); else src ggml type 40 blocks (scales NULL), whose UE4M3 scales
 * become the E4M3FN byte of the same value. n_in % 256 == 0. Synchronizes. */
size_t mucu_fp4_split_bytes(int64_t n_in, int64_t n_out);
bool mucu_fp4_split(const uint8_t *src, const uint8_t *scales, uint8_t *dst, int64_t n_in, int64_t n_out, int native,
                    char *err);
/* Is p device memory (cudaPointerGetAttributes)? */
bool mucu_is_device(const void *p);

bool mucu_embed(const mucu_weight *w, const int32_t *tokens, int64_t rows, float *x, char *err);
/* q8: scratch of rows * n_in/256 Q8_K blocks (mucu_q8k_bytes). */
size_t mucu_q8k_bytes(int64_t n_in, int64_t rows);
/* prequantized (fast-path weights only): q8 already holds x's Q8_K
 * activations from a previous mucu_matmul with the same x, rows and n_in. */
/* split: scratch of mucu_matmul_split_bytes(w, rows) bytes for a many-row
 * product split over its blocks, or NULL (no split). */
bool mucu_matmul(const mucu_weight *w, const float *x, float *y, int64_t rows, void *q8, int prequantized,
                 float *split, char *err);
/* Do w's products read the Q8_K quantization of f16-rounded activations
 * (native NVFP4 W4A16 on the fast path)? Only a quantization made that way
 * may be passed as prequantized to them. */
bool mucu_matmul_f16_acts(const mucu_weight *w);
/* n weights that all take the fast kernels, with the same n_in, reading the
 * same x (one quantization; rows <= 16: one launch for all of them). */
bool mucu_matmul_set(const mucu_weight *const *w, int n, const float *x, float *const *y, int64_t rows, void *q8,
                     int prequantized, float *split, char *err);
/* Does w take the weight-streaming kernels (Q4_K, Q5_K, split Q6_K, split
 * NVFP4)? */
bool mucu_matmul_fast(const mucu_weight *w);
/* The split scratch a mucu_matmul of `rows` needs: 0 unless the call takes
 * the many-row kernel and that splits it (mucu_gemm_split_bytes). */
size_t mucu_matmul_split_bytes(const mucu_weight *w, int64_t rows);
/* 0: NVFP4, Q8_0, Q4_0 and float weights on the generic kernels
 * (k_matmul_warp, k_matmul_fwarp) instead of the fast ones (NVFP4 in its
 * split layout, k_mmv_q0, k_mmv_float) (tests; MUSER_CUDA_FP4 at the first
 * call otherwise). */
void mucu_set_fp4(int v);
/* NVFP4 W4A16 / ggml weights on the fast kernels (their split layout)?
 * MUSER_CUDA_FP4=0 or mucu_set_fp4(0): no, the rows as they are. */
bool mucu_fp4_on(void);
/* >= 0: NVFP4 calls of that many rows (up to 16) on k_gemm_fp4, 0 none;
 * -1: MUSER_CUDA_FP4_GEMM, else a rule by shape (cuda_kernels.cu). */
extern int mucu_fp4_gemm_rows;
/* The weight-streaming kernel for Q4_K/Q5_K/Q6_K calls of <= 16 rows: 3
 * k_mmv2 (default), 0 k_mmv_kq, 1 k_mmv_kq with shared-memory activations,
 * 2 k_mmv_lpb (tests and benchmarks compare them; MUSER_CUDA_MMV sets it). */
void mucu_set_mmv_variant(int v);
/* k_mmv3 (variant 7): warps per output (1, 2, 4) and steps in flight (1, 2); 0: by shape */
void mucu_set_mmv3(int wpr, int u);
/* Tests only: > 0 caps k_mmv6's persistent grid at that many CTAs, so small
 * weights take several units a CTA (its double-buffered loop); 0: as resident. */
extern int mucu_mmv6_grid;
/* Benchmarks only (inexact on purpose): k_mmv2's Q4_K weight loads with no
 * arithmetic (u steps in flight); a plain read of bytes at p. */
bool mucu_bench_loads(const mucu_weight *w, int u, float *y, char *err);
bool mucu_bench_read(const void *p, size_t bytes, void *out, char *err);
/* Benchmarks only: n_read plain reads of bytes[i] one after another (cuda_kernels.cu
 * "a layer's reads in a row"), median GPU ms of reps runs per variant 0..5, bad[v]: reads
 * whose XOR check failed; *grid: the CTAs a read takes. */
bool mucu_bench_chain(const size_t *bytes, int n_read, int reps, double ms[6], int bad[6], int *grid, char *err);
/* GPU time of what the stream runs between begin and end (cudaEvents). */
bool mucu_timer_begin(char *err);
bool mucu_timer_end(double *ms, char *err);
/* q8 (may be NULL): scratch of mucu_q8k_bytes(n, rows); when given and n is
 * a multiple of 256 the output rows are also quantized into it (the split
 * Q8_K layout mucu_matmul reads with prequantized set). The same holds for
 * mucu_residual's h, mucu_sigmoid_gate's x and mucu_swiglu's gate. */
bool mucu_rmsnorm(const float *x, const float *w, float eps, float *y, int64_t n, int64_t rows, void *q8, char *err);
/* x += rmsnorm(o, eps_o) * w_o; then, if h: h = rmsnorm(x, eps_h) * w_h
 * (rows of n; mucu_residual_ok(n) says whether the kernel takes n); if
 * cap, each row of the new x also to cap + r * cap_stride (a capture of the
 * next layer's input, src/model/forward.c). */
bool mucu_residual_ok(int64_t n);
/* The residual step's most warps a CTA: 32 (the default), or 8 or 16 (2-4
 * blocks a warp; measurements); from MUSER_CUDA_RES_WARPS when first read,
 * -1 until then. */
extern int mucu_res_warps;
/* The residual step's row transposed in shared memory for its 32-lane sums
 * (the same bits): 2 for rows of 16 to 26 blocks (the default), 1 for any
 * row of at most 26 blocks, 0 never; from MUSER_CUDA_RES_T when first
 * read, -1 until then. */
extern int mucu_res_t;
/* k_residual_w for rows of whole blocks, a warp each, 16-byte aligned (the
 * same bits): 1 (the default) or 0 never; from MUSER_CUDA_RES_W when first
 * read, -1 until then. */
extern int mucu_res_w;
bool mucu_residual(float *x, const float *o, const float *w_o, float eps_o, float *h, const float *w_h, float eps_h,
                   int64_t n, int64_t rows, void *q8, float *cap, int64_t cap_stride, char *err);
/* Per-head RMSNorm of q (nq heads) and k (nk heads) with the weights wq, wk
 * (head_dim values), then, if cs, the interleaved rotation of the first
 * n_rot dims with cs [rows][n_rot/2] (cos, sin). */
/* whether mucu_qk_norm_rope takes these heads (NeoX: n_rot the whole head) */
bool mucu_qk_norm_rope_ok(int64_t head_dim, int64_t n_rot, bool neox);
/* Where kv_store writes row r (kv.h mu_kv_dst, resolved to device planes):
 * physical row `physical` of the head-major planes k, v of cap rows; with
 * jk, the old bytes first to row `slot` of the journal planes of jcap rows. */
typedef struct mucu_kv_dst {
    uint16_t *k, *v;
    int64_t cap, physical;
    uint16_t *jk, *jv;
    int64_t jcap, slot;
} mucu_kv_dst;
/* dst (device [rows], may be NULL): also store k's result and v's rows there (kv_store) */
bool mucu_qk_norm_rope(float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk, int64_t head_dim,
                       float eps, const float *cs, int64_t n_rot, int64_t rows, const mucu_kv_dst *dst,
                       const float *v, bool neox, char *err);
/* The per-head slot planes of mucu_store_kv_heads_layers, as a destination of
 * mucu_qk_norm_rope_heads. */
typedef struct mucu_heads_dst {
    float *kd, *vd;
    const int64_t *slots; /* device [rows] */
    int64_t S;
} mucu_heads_dst;
/* mucu_qk_norm_rope (no dst), then k's result and v's rows into hd's
 * planes as store_kv_heads stores them: one launch. */
bool mucu_qk_norm_rope_heads(float *q, const float *wq, int64_t nq, float *k, const float *wk, int64_t nk,
                             int64_t head_dim, float eps, const float *cs, int64_t n_rot, int64_t rows,
                             mucu_heads_dst hd, const float *v, bool neox, char *err);
/* depth (device, or NULL): the tree registers' depths; row r < 16 then
 * stands at pos[r] - r + depth[r] (backend.h rope_table's tree_reg). */
bool mucu_rope_table(const double *inv_freq, int64_t n_pairs, const int64_t *pos, int64_t rows, const int32_t *depth,
                     float *cs, char *err);
/* x = rmsnorm(embed(tokens), eps) (weightless), h = rmsnorm(x, eps) * w_h
 * (and h's Q8_K quantization into q8, where not NULL), rows of w->n_in
 * values (mucu_residual_ok). regs: an id -2 - i (backend.h MU_TOKEN_REG(i))
 * is register i's id (NULL: no such ids). */
bool mucu_embed_norm(const mucu_weight *w, const int32_t *tokens, const int32_t *regs, int64_t rows, float eps,
                     float *x, const float *w_h, float *h, void *q8, char *err);
bool mucu_rope(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs, int64_t rows, bool neox,
               char *err);
/* dst: device [rows]; every row n_head x head_dim */
bool mucu_kv_store(const mucu_kv_dst *dst, int64_t rows, int64_t n_head, int64_t head_dim, const float *k,
                   const float *v, char *err);
/* part: scratch of mucu_attn_part_bytes for the most 256-key blocks of
 * any row (nbmax). */
size_t mucu_attn_part_bytes(int64_t rows, int64_t n_head, int64_t head_dim, int64_t nbmax);
/* With gate (device [rows][n_head * head_dim]): out = attention *
 * sigmoid(gate), as mucu_sigmoid_gate after it, q8 likewise (fused into
 * the decode kernels where they allow, else that launch). */
/* tree: some row is a token tree's (rows_desc[r].tbase): the many-row
 * kernel, which shares one sequence's keys between its rows, is not taken. */
bool mucu_attention(const mucu_attn_row *rows_desc, int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                    float scale, const float *q, float *out, float *part, int64_t nbmax, const float *gate, void *q8,
                    bool tree, char *err);
bool mucu_sigmoid_gate(float *x, const float *g, int64_t n, void *q8, char *err);
bool mucu_swiglu(float *gate, const float *up, int64_t n, void *q8, char *err);
bool mucu_add(float *x, const float *y, int64_t n, char *err);
bool mucu_logit_tail(float *l, float scale, float cap, int64_t n, char *err);
bool mucu_softmax(float *x, float scale, int64_t n, const int64_t *n_valid, int64_t rows, char *err);
bool mucu_argmax(const float *x, int64_t n, int64_t rows, int32_t *out, char *err);
/* backend.h chain_pick: the first maximum of x[0..n) into *reg and, with
 * its status, into the host slot whose address is at *slot (device memory:
 * an uploaded argument). reg is the start of mucu_chain_bytes() of device
 * memory, zero-filled at allocation (the kernel's counter and partials). */
bool mucu_chain_pick(const float *x, int64_t n, int32_t *reg, int32_t *const *slot, char *err);
/* backend.h pick_rows (k_pick_rows, a CTA per row) and the token registers
 * of a forward's uploaded ids (k_tokens_regs, MU_TOKEN_REG). */
bool mucu_pick_rows(const float *x, int64_t n, int64_t rows, int32_t n_regs, const int32_t *regs,
                    int32_t *const *slot, char *err);
bool mucu_tokens_regs(int32_t *t, int64_t rows, const int32_t *regs, char *err);
size_t mucu_chain_bytes(void);
/* backend.h tree_reg (src/spec/spec_tree.c is the reference): k_tree_rows
 * (a CTA per draft row of x [rows][n]: its 8 candidates and their
 * probabilities into *work) then k_tree_build (one warp: the tree into regs,
 * the token registers tokregs[0 .. rows) and the host slot at *slot).
 * eog: device [n_eog]; work: mucu_tree_work_bytes() of device memory. */
bool mucu_tree_reg(const float *x, int64_t n, int64_t rows, const int32_t *eog, int n_eog, void *work,
                   mucu_tree_regs *regs, int32_t *tokregs, int32_t *const *slot, char *err);
size_t mucu_tree_work_bytes(void);
/* The stream's state: 1 all work done, 0 still running, -1 failed (err). */
int mucu_stream_state(char *err);
/* *best = n - (index of the first non-finite value of x[0..n)), 0 when none (device memory). */
bool mucu_first_nonfinite(const float *x, int64_t n, unsigned long long *best, char *err);
/* Whether p is page-locked host memory (cudaHostAlloc or registered). */
bool mucu_is_pinned(const void *p);
/* backend.h store_kv_heads for n_layers layers in one launch: layer l's
 * planes at kd / vd + l * plane_stride, its rows at k / v + l * src_stride
 * (floats). */
bool mucu_store_kv_heads_layers(float *kd, float *vd, int64_t plane_stride, const int64_t *slots, int64_t S, int64_t D,
                                int64_t n_head, const float *k, const float *v, int64_t src_stride, int64_t rows,
                                int64_t n_layers, char *err);
/* backend.h dense_attention; n_valid in device memory (the step's arguments).
 * mucu_dense_attn_mode: MUSER_CUDA_DA (-1 until read): 0 k_dense_attn, 1 / 2 / 4
 * k_dense_attn2 with up to that many heads a CTA (default 4) where it
 * applies. q8: a Q8_K
 * buffer for the rows * n_head * D outputs, filled where
 * mucu_dense_attention_quantizes says so for the same arguments (else unused). */
extern int mucu_dense_attn_mode;
bool mucu_dense_attention_quantizes(int64_t n_head, int64_t n_head_kv, int64_t D, const float *v, int64_t slots,
                                    int64_t n_keys);
bool mucu_dense_attention(const float *q, int64_t rows, int64_t n_head, int64_t n_head_kv, int64_t D, const float *k,
                          const float *v, int64_t slots, int64_t n_keys, const int64_t *n_valid, float scale, float *out,
                          void *q8, char *err);

#ifdef __cplusplus
}
#endif
#endif
