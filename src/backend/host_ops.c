/* Host-memory ops shared by the ref and cpu backends: memory, embedding
 * lookup, the RoPE table, the KV store and the DFlash assistant's softmax,
 * argmax and head stores. Plain scalar C (compiled with -ffp-contract=off
 * like the rest): for the ops here this is the reference a device backend
 * reproduces (docs/numerics.md). */
#include "backend/backend.h"
#include "sample/sample.h"
#include "spec/spec_tree.h"
#include "util/hugemap.h"
#include "util/mumath.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---------- memory ---------- */

/* At 2 MiB or more: a 2 MiB-aligned anonymous mapping advised
 * MADV_HUGEPAGE. Attention walks a KV plane row by row; in 4 KiB pages
 * every 8 rows of 512 bytes cost a TLB walk (a nested one in a VM). Smaller
 * buffers keep 4 KiB pages, so a small cache does not commit a whole huge
 * page per plane. Sanitizer builds keep calloc: its redzones catch a write
 * past a buffer. */
static bool use_mapping(size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    (void)bytes;
    return false;
#else
    return bytes >= MU_HUGE_PAGE;
#endif
}

static size_t mapped_span(size_t bytes) { return (bytes + MU_HUGE_PAGE - 1) & ~(size_t)(MU_HUGE_PAGE - 1); }

static void *host_alloc(mu_backend *b, size_t bytes) {
    (void)b;
    if (!use_mapping(bytes)) return calloc(1, bytes ? bytes : 1);
    uint8_t *p = mu_map_aligned(mapped_span(bytes), false);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, mapped_span(bytes), MADV_HUGEPAGE);
#endif
    return p;
}

static void host_free(mu_backend *b, void *p, size_t bytes) {
    (void)b;
    if (!p) return;
    if (use_mapping(bytes)) munmap(p, mapped_span(bytes));
    else free(p);
}

static void host_copy(mu_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (bytes) memmove(dst, src, bytes);
}

static void host_copy2d(mu_backend *b, void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t width,
                        int64_t rows) {
    (void)b;
    for (int64_t r = 0; r < rows; r++)
        memcpy((uint8_t *)dst + (size_t)r * dst_stride, (const uint8_t *)src + (size_t)r * src_stride, width);
}

static void host_copy2d_many(mu_backend *b, int n, const mu_copy2d *c) {
    for (int i = 0; i < n; i++) host_copy2d(b, c[i].dst, c[i].dst_stride, c[i].src, c[i].src_stride, c[i].width, c[i].rows);
}

static void host_zero(mu_backend *b, void *dst, size_t bytes) {
    (void)b;
    if (bytes) memset(dst, 0, bytes);
}

void *mu_backend_xalloc(mu_backend *b, size_t bytes, const char *what) {
    void *p = b->alloc(b, bytes);
    if (!p) {
        fprintf(stderr, "muser: out of %s memory: %zu bytes for %s\n", b->name, bytes, what);
        abort();
    }
    return p;
}

/* ---------- ops ---------- */

static void host_embed(mu_backend *b, const mu_weight *w, const int32_t *tokens, int64_t rows, float *x) {
    for (int64_t r = 0; r < rows; r++) {
        const int32_t t = tokens[r];
        mu_weight_dequant_row(w, t == MU_TOKEN_CHAINED ? b->chained : t < 0 ? b->regs[MU_TOKEN_REG(0) - t] : t,
                              x + r * w->n_in);
    }
}

static void host_rope_table(mu_backend *b, const double *inv_freq, int64_t n_pairs, const int64_t *pos, int64_t rows,
                            float *cs, bool tree_reg) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n_pairs; i++) {
            const int64_t p = tree_reg && r < MU_TREE_MAX ? pos[r] - r + b->treg.depth[r] : pos[r];
            double a = (double)p * inv_freq[i];
            cs[(r * n_pairs + i) * 2] = (float)mu_cos(a);
            cs[(r * n_pairs + i) * 2 + 1] = (float)mu_sin(a);
        }
}

bool mu_attn_head_rows(const mu_attn_args *a, int64_t pos, int64_t n, int64_t head, const uint16_t **k,
                       const uint16_t **v) {
    if (!mu_kv_head_rows(a->kv, pos, n, head, k, v)) return false;
    if (!a->tree) return true;
    for (int64_t p = pos > a->tbase ? pos : a->tbase; p < pos + n; p++) {
        const int64_t at = mu_attn_key_pos(a, p);
        k[p - pos] = mu_kv_k(a->kv, at, head);
        v[p - pos] = mu_kv_v(a->kv, at, head);
        if (!k[p - pos]) return false;
    }
    return true;
}

/* The old bytes of the rows a journaled store overwrites (kv_store's save). */
void mu_host_kv_save(int64_t rows, const mu_kv_dst *dst) {
    for (int64_t r = 0; r < rows; r++) {
        const mu_kv_dst *d = &dst[r];
        if (!d->jk) continue;
        const int64_t D = d->l->head_dim;
        for (int64_t h = 0; h < d->l->n_head; h++) {
            const size_t from = (size_t)((h * d->l->cap + d->physical) * D), to = (size_t)((h * d->jcap + d->slot) * D);
            memcpy(d->jk + to, d->l->k + from, (size_t)D * sizeof(uint16_t));
            memcpy(d->jv + to, d->l->v + from, (size_t)D * sizeof(uint16_t));
        }
    }
}

static void host_kv_store(mu_backend *b, int64_t rows, const mu_kv_dst *dst, const float *k, const float *v) {
    (void)b;
    mu_host_kv_save(rows, dst);
    for (int64_t r = 0; r < rows; r++) {
        const mu_kv_layer *l = dst[r].l;
        const int64_t D = l->head_dim, H = l->n_head;
        for (int64_t h = 0; h < H; h++) {
            uint16_t *kd = l->k + (h * l->cap + dst[r].physical) * D, *vd = l->v + (h * l->cap + dst[r].physical) * D;
            const float *ks = k + (r * H + h) * D, *vs = v + (r * H + h) * D;
            for (int64_t i = 0; i < D; i++) {
                kd[i] = mu_f32_to_f16(ks[i]);
                vd[i] = mu_f32_to_f16(vs[i]);
            }
        }
    }
}

static void host_softmax(mu_backend *b, float *x, float scale, int64_t n, int64_t n_valid, int64_t rows) {
    (void)b;
    for (int64_t r = 0; r < rows; r++) {
        float *s = x + r * n, mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < n_valid; j++) {
            s[j] = s[j] * scale;
            if (s[j] > mx) mx = s[j];
        }
        for (int64_t j = 0; j < n_valid; j++) {
            s[j] = mu_expf(s[j] - mx);
            sum += s[j];
        }
        for (int64_t j = 0; j < n_valid; j++) s[j] = s[j] / sum;
        for (int64_t j = n_valid; j < n; j++) s[j] = 0.0f;
    }
}

static void host_argmax(mu_backend *b, const float *x, int64_t n, int64_t rows, int32_t *out) {
    (void)b;
    for (int64_t r = 0; r < rows; r++) {
        const float *l = x + r * n;
        int64_t best = 0;
        for (int64_t i = 1; i < n; i++)
            if (l[i] > l[best]) best = i;
        out[r] = (int32_t)best;
    }
}

/* backend.h chain_pick, at once: the greedy shortcut's own rule
 * (mu_sample_argmax_unique: a unique, finite maximum, or none). */
static void host_chain_pick(mu_backend *b, const float *x, int64_t n, int32_t *slot) {
    const int32_t id = n > 0 ? mu_sample_argmax_unique(x, (size_t)n) : -1;
    b->chained = id >= 0 ? id : 0;
    slot[0] = b->chained;
    slot[1] = id >= 0 ? 1 : 2;
}

static void host_argmax_reg(mu_backend *b, const float *x, int64_t n, int64_t rows) {
    host_argmax(b, x, n, rows, b->regs);
}

static void host_pick_rows(mu_backend *b, const float *x, int64_t n, int64_t rows, int n_regs, int32_t *slot) {
    for (int i = 0; i < n_regs; i++) slot[2 * rows + i] = b->regs[i];
    for (int64_t r = 0; r < rows; r++) {
        const int32_t id = n > 0 ? mu_sample_argmax_unique(x + r * n, (size_t)n) : -1;
        slot[2 * r] = id >= 0 ? id : 0;
        slot[2 * r + 1] = id >= 0 ? 1 : 2;
    }
}

/* backend.h tree_reg: mu_spec_tree_build itself, at once. */
static void host_tree_reg(mu_backend *b, const float *x, int64_t n, int64_t rows, const int32_t *eog, int n_eog,
                          int32_t *slot) {
    mu_spec_tree t;
    mu_spec_tree_build(x, n, (int)rows, -1, eog, n_eog, &t);
    mu_spec_tree_regs(&t, &b->treg);
    for (int64_t i = 0; i < rows && i < MU_TOKEN_REGS; i++) b->regs[i] = i + 1 < t.n ? t.token[i + 1] : 0;
    slot[0] = t.n;
    for (int i = 0; i < MU_TREE_MAX; i++) {
        slot[1 + i] = b->treg.parent[i];
        slot[1 + MU_TREE_MAX + i] = i == 0 ? -1 : i < t.n ? t.token[i] : 0;
    }
}

static bool host_chain_wait(mu_backend *b, volatile int32_t *slot, mu_error *err) {
    (void)b;
    if (slot[1]) return true;
    mu_err_set(err, "chain_wait: the row's pick was never made");
    return false;
}

static int64_t host_first_nonfinite(mu_backend *b, const float *x, int64_t n) {
    (void)b;
    return mu_first_nonfinite(x, n);
}

static void host_store_kv_heads(mu_backend *b, float *kd, float *vd, const int64_t *slots, int64_t S, int64_t D,
                                int64_t n_head, const float *k, const float *v, int64_t rows) {
    (void)b;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < n_head; h++) {
            memcpy(kd + (h * S + slots[r]) * D, k + (r * n_head + h) * D, (size_t)D * sizeof(float));
            const float *s = v + (r * n_head + h) * D;
            float *t = vd + h * D * S + slots[r];
            for (int64_t d = 0; d < D; d++) t[d * S] = s[d];
        }
}

static void host_store_kv_heads_layers(mu_backend *b, float *kd, float *vd, int64_t plane_stride,
                                       const int64_t *slots, int64_t S, int64_t D, int64_t n_head, const float *k,
                                       const float *v, int64_t src_stride, int64_t rows, int64_t n_layers) {
    for (int64_t l = 0; l < n_layers; l++)
        host_store_kv_heads(b, kd + l * plane_stride, vd + l * plane_stride, slots, S, D, n_head, k + l * src_stride,
                            v + l * src_stride, rows);
}

void mu_host_rope_neox(float *x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float *cs, int64_t rows) {
    const int64_t half = n_rot / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *csr = cs + r * half * 2;
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + (r * n_heads + h) * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float c = csr[2 * i], s = csr[2 * i + 1], x0 = v[i], x1 = v[i + half];
                v[i] = x0 * c - x1 * s;
                v[i + half] = x1 * c + x0 * s;
            }
        }
    }
}

void mu_backend_set_host_ops(mu_backend *b) {
    b->alloc = host_alloc;
    b->free = host_free;
    b->copy = host_copy;
    b->copy2d = host_copy2d;
    b->copy2d_many = host_copy2d_many;
    b->upload = host_copy;
    b->download = host_copy;
    b->zero = host_zero;
    b->embed = host_embed;
    b->rope_table = host_rope_table;
    b->kv_store = host_kv_store;
    b->softmax = host_softmax;
    b->argmax = host_argmax;
    b->first_nonfinite = host_first_nonfinite;
    b->store_kv_heads = host_store_kv_heads;
    b->store_kv_heads_layers = host_store_kv_heads_layers;
    b->chain_pick = host_chain_pick;
    b->chain_wait = host_chain_wait;
    b->argmax_reg = host_argmax_reg;
    b->pick_rows = host_pick_rows;
    b->tree_reg = host_tree_reg;
}

mu_weight mu_f32_matrix(const float *data, int64_t n_in, int64_t n_out, int64_t stride) {
    return (mu_weight){.name = "activations", .type = MU_TYPE_F32, .data = (const uint8_t *)data, .scale = 1.0f,
                       .n_in = n_in, .n_out = n_out, .row_bytes = (uint64_t)stride * sizeof(float)};
}
