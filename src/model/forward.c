/* One forward pass (docs/model.md, "Graph"; each op's order: docs/numerics.md):
 *   x = rmsnorm(embed(tokens))                             (weightless, eps)
 *   h = rmsnorm(x)*attn_norm of layer 0
 *   per layer:  q,k,v,g = W h
 *               q,k = per-head rmsnorm * q_norm/k_norm; RoPE on sliding layers
 *               a = attention(q, K, V) * sigmoid(g); o = Wo a
 *               x += rmsnorm(o, 1e-8) * post_attention_norm; h = rmsnorm(x)*ffn_norm
 *               f = Wdown(silu(Wg h) * (Wu h))
 *               x += rmsnorm(f, 1e-8) * post_ffw_norm; h = rmsnorm(x)*attn_norm of the next layer
 *   logits = softcap(logit_scale * Wout (rmsnorm(x)*output_norm))
 * Every op is row-independent except attention, which reads the keys of the
 * row's own sequence up to the row's own position. A layer stores all rows'
 * K/V first and then attends (the SWA ring's slack keeps the first row's
 * window), so a row's bits depend neither on the batch around it nor on how
 * its prompt was chunked. */
#include "model/forward.h"
#include "util/mumath.h"
#include <math.h>
#include <stdlib.h>

void mu_scratch_init(mu_forward_scratch *s, mu_backend *be, const mu_model_config *c, int64_t rows) {
    size_t R = (size_t)rows, E = (size_t)c->n_embd, Q = (size_t)(c->n_head * c->head_dim);
    size_t KV = (size_t)(c->n_head_kv * c->head_dim), F = (size_t)c->n_ff, CS = (size_t)c->n_rot;
    *s = (mu_forward_scratch){.be = be, .rows = rows};
    /* one allocation, carved: x h o [E], q g att [Q], k v [KV], fg fu [F], cs [n_rot] */
    size_t floats = R * (3 * E + 3 * Q + 2 * KV + 2 * F + CS);
    s->bytes = floats * sizeof(float);
    float *p = mu_backend_xalloc(be, s->bytes, "the activation scratch");
    float **dst[] = {&s->x, &s->h, &s->o, &s->q, &s->g, &s->att, &s->k, &s->v, &s->fg, &s->fu, &s->cs};
    size_t sizes[] = {E, E, E, Q, Q, Q, KV, KV, F, F, CS};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        *dst[i] = p;
        p += R * sizes[i];
    }
    s->kvl = mu_xcalloc(R, sizeof *s->kvl);
    s->kvd = mu_xcalloc(R, sizeof *s->kvd);
}

void mu_scratch_free(mu_forward_scratch *s) {
    if (s->x) s->be->free(s->be, s->x, s->bytes);
    free(s->kvl);
    free(s->kvd);
    memset(s, 0, sizeof *s);
}

/* inv_freq[i] = freq_scale * base^(-2i/n_rot), in double with the engine's own pow. */
double *mu_rope_inv_freq(const mu_model_config *c) {
    int64_t n = c->n_rot / 2;
    double *f = mu_xmalloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        f[i] = (double)c->rope_freq_scale_swa * mu_pow((double)c->rope_base_swa, -2.0 * (double)i / (double)c->n_rot);
    return f;
}

void mu_matmuls(mu_backend *be, int n, const mu_weight *const *w, const float *x, float *const *y, int64_t rows) {
    if (be->matmul_multi) {
        be->matmul_multi(be, n, w, x, y, rows);
        return;
    }
    for (int i = 0; i < n; i++) be->matmul(be, w[i], x, y[i], rows);
}

/* Reserve the batch's K/V rows: each run of a sequence's rows in its
 * cache, their destinations in s->kvd. *n: the rows reserved (a prefix;
 * all of them unless a run is refused, and those are still stored, so
 * every cache holds what its bookkeeping says). */
static bool reserve_kv(mu_kv_cache *const *kv, const mu_forward_scratch *s, const mu_batch *b, int il, int64_t *n,
                       mu_error *err) {
    int64_t r0 = 0, r1;
    bool ok = true;
    for (; r0 < b->n; r0 = r1) {
        for (r1 = r0 + 1; r1 < b->n && b->seq[r1] == b->seq[r0];) r1++;
        if (!(ok = mu_kv_reserve(kv[b->seq[r0]], il, b->pos[r0], r1 - r0, s->kvd + r0, err))) break;
    }
    *n = r0;
    return ok;
}

/* Where a residual step also writes the capture of the next layer's input
 * (capture_fused): rows to dst + r * stride; dst NULL: none. */
typedef struct cap_dst {
    float *dst;
    int64_t stride;
} cap_dst;

/* x += rmsnorm(o, 1e-8) * w_o (the post-norm), then h = rmsnorm(x) * w_h
 * (the next block's entry norm; none after the last layer); cd.dst: x's
 * rows captured too (only where the backend has residual_capture). */
static void residual(const mu_model_config *c, mu_backend *be, mu_forward_scratch *s, const float *w_o,
                     const float *w_h, int64_t rows, cap_dst cd) {
    float *h = w_h ? s->h : NULL;
    if (cd.dst) {
        be->residual_capture(be, s->x, s->o, w_o, MU_POST_NORM_EPS, h, w_h, c->rms_eps, c->n_embd, rows, cd.dst,
                             cd.stride);
        return;
    }
    if (be->residual) {
        be->residual(be, s->x, s->o, w_o, MU_POST_NORM_EPS, h, w_h, c->rms_eps, c->n_embd, rows);
        return;
    }
    be->rmsnorm(be, s->o, w_o, MU_POST_NORM_EPS, s->o, c->n_embd, rows);
    be->add(be, s->x, s->o, rows * c->n_embd);
    if (h) be->rmsnorm(be, s->x, w_h, c->rms_eps, h, c->n_embd, rows);
}

/* QK norms per head, then RoPE on sliding layers only (the full layers
 * are NoPE), then the K/V store of the n_store rows reserved in s->kvd:
 * one backend call for every sequence of the batch (fused into the norm's
 * launch where the backend has qk_norm_rope). */
static void qk_norm_rope_store(const mu_model_config *c, mu_backend *be, mu_forward_scratch *s,
                               const mu_layer_weights *lw, bool rope, int64_t rows, int64_t n_store) {
    const int64_t D = c->head_dim;
    if (be->qk_norm_rope) {
        const bool all = n_store == rows; /* else the stored prefix goes separately, below */
        be->qk_norm_rope(be, s->q, lw->attn_q_norm, c->n_head, s->k, lw->attn_k_norm, c->n_head_kv, D, c->rms_eps,
                         rope ? s->cs : NULL, c->n_rot, rows, all ? s->kvd : NULL, all ? s->v : NULL, false);
        if (all) return;
    } else {
        be->rmsnorm(be, s->q, lw->attn_q_norm, c->rms_eps, s->q, D, rows * c->n_head);
        be->rmsnorm(be, s->k, lw->attn_k_norm, c->rms_eps, s->k, D, rows * c->n_head_kv);
        if (rope) {
            be->rope(be, s->q, c->n_head, D, c->n_rot, s->cs, rows, false);
            be->rope(be, s->k, c->n_head_kv, D, c->n_rot, s->cs, rows, false);
        }
    }
    if (n_store > 0) be->kv_store(be, n_store, s->kvd, s->k, s->v);
}

/* Entered with h = rmsnorm(x) * attn_norm; leaves h = rmsnorm(x) * ffn_norm. */
static bool attention_block(const mu_model *m, mu_backend *be, mu_kv_cache *const *kv, mu_forward_scratch *s,
                            const mu_batch *b, int il, mu_error *err) {
    const mu_model_config *c = &m->cfg;
    const mu_layer_weights *lw = &m->layers[il];
    const int64_t D = c->head_dim, Q = c->n_head * D, rows = b->n;
    mu_matmuls(be, 4, (const mu_weight *[]){&lw->attn_q, &lw->attn_k, &lw->attn_v, &lw->attn_gate}, s->h,
            (float *[]){s->q, s->k, s->v, s->g}, rows);
    int64_t n_store;
    const bool stored = reserve_kv(kv, s, b, il, &n_store, err);
    qk_norm_rope_store(c, be, s, lw, c->is_swa[il], rows, n_store);
    if (!stored) return false;
    for (int64_t r = 0; r < rows; r++) s->kvl[r] = &kv[b->seq[r]]->layers[il];
    mu_attn_batch a = {
        .rows = rows, .kv = s->kvl, .pos = b->tpos ? b->tpos : b->pos, .tree = b->tree, .window = c->is_swa[il] ? c->sliding_window : 0,
        .treg = b->tree && b->tree_reg ? &be->treg : NULL,
        .n_head = c->n_head, .n_head_kv = c->n_head_kv, .head_dim = D, .scale = 1.0f / sqrtf((float)D),
    };
    if (be->attention_gate) be->attention_gate(be, &a, s->q, s->g, s->att);
    else {
        be->attention(be, &a, s->q, s->att);
        be->sigmoid_gate(be, s->att, s->g, rows * Q);
    }
    be->matmul(be, &lw->attn_output, s->att, s->o, rows);
    residual(c, be, s, lw->post_attention_norm, lw->ffn_norm, rows, (cap_dst){0});
    return true;
}

/* Leaves h = rmsnorm(x) * the next layer's attn_norm; after the last
 * layer, rmsnorm(x) * last_norm (the output norm, when every row wants
 * logits: the residual step's second norm is the same operation, so the
 * logits need no launch of their own for it), or nothing. */
static void ffn_block(const mu_model *m, mu_backend *be, mu_forward_scratch *s, int il, int64_t rows,
                      const float *last_norm, cap_dst cd) {
    const mu_model_config *c = &m->cfg;
    const mu_layer_weights *lw = &m->layers[il];
    mu_matmuls(be, 2, (const mu_weight *[]){&lw->ffn_gate, &lw->ffn_up}, s->h, (float *[]){s->fg, s->fu}, rows);
    be->swiglu(be, s->fg, s->fu, rows * c->n_ff);
    be->matmul(be, &lw->ffn_down, s->fg, s->o, rows);
    residual(c, be, s, lw->post_ffw_norm, il + 1 < c->n_layer ? m->layers[il + 1].attn_norm : last_norm, rows, cd);
}

/* Boundary il's capture rows when the residual step before it can write
 * them (capture_fused): every row of the batch captured, consecutively,
 * and a backend with residual_capture; else dst NULL (capture_boundary
 * copies them). */
static cap_dst capture_fused(mu_backend *be, const mu_capture *cap, const mu_batch *b, int il, int64_t E) {
    if (!cap || !be->residual_capture || cap->slot[il] < 0 || b->cap_row[0] < 0) return (cap_dst){0};
    for (int64_t r = 1; r < b->n; r++)
        if (b->cap_row[r] != b->cap_row[0] + r) return (cap_dst){0};
    return (cap_dst){cap->rows + b->cap_row[0] * cap->n * E + cap->slot[il] * E, cap->n * E};
}

/* Copy the residual rows entering layer il into their capture rows. */
static void capture_boundary(mu_backend *be, const mu_capture *cap, const mu_batch *b, int il, const float *x,
                             int64_t E) {
    const int slot = cap->slot[il];
    if (slot < 0) return;
    const size_t stride = (size_t)(cap->n * E) * sizeof(float);
    for (int64_t r0 = 0, r1; r0 < b->n; r0 = r1) { /* runs of consecutive capture rows */
        for (r1 = r0 + 1; r1 < b->n && b->cap_row[r0] >= 0 && b->cap_row[r1] == b->cap_row[r1 - 1] + 1;) r1++;
        if (b->cap_row[r0] < 0) continue;
        be->copy2d(be, cap->rows + b->cap_row[r0] * cap->n * E + slot * E, stride, x + r0 * E,
                   (size_t)E * sizeof(float), (size_t)E * sizeof(float), r1 - r0);
    }
}

/* The rows that want logits, *n of them: x itself when every row does,
 * else dst with the runs of consecutive rows gathered. */
static const float *logit_rows(mu_backend *be, const mu_batch *b, const float *x, float *dst, int64_t E, int64_t *n) {
    *n = 0;
    for (int64_t r0 = 0, r1; r0 < b->n; r0 = r1) {
        for (r1 = r0 + 1; r1 < b->n && b->logits[r1] == b->logits[r0];) r1++;
        if (!b->logits[r0]) continue;
        if (r1 - r0 == b->n) {
            *n = b->n;
            return x;
        }
        be->copy(be, dst + *n * E, x + r0 * E, (size_t)((r1 - r0) * E) * sizeof(float));
        *n += r1 - r0;
    }
    return dst;
}

bool mu_forward(const mu_model *m, mu_backend *be, mu_kv_cache *const *kv, mu_forward_scratch *s,
                const double *inv_freq, const mu_batch *b, float *logits, mu_capture *cap, mu_error *err) {
    const mu_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, rows = b->n;
    if (rows < 1 || rows > s->rows) {
        mu_err_set(err, "forward: %lld rows; the scratch holds 1 to %lld", (long long)rows, (long long)s->rows);
        return false;
    }
    if (cap && (cap->n == 0 || !b->cap_row)) cap = NULL;
    if (b->tree && !be->trees) {
        mu_err_set(err, "forward: the %s backend cannot run token-tree rows", be->name);
        return false;
    }
    if (b->tree_reg && (!b->tree || !b->tpos || !be->tree_reg || rows > MU_TREE_MAX)) {
        mu_err_set(err, "forward: a tree of the %s backend's tree registers needs tree rows (at most %d)%s", be->name,
                   MU_TREE_MAX, be->tree_reg ? "" : ", and it has no tree registers");
        return false;
    }
    if (c->n_swa_layers)
        be->rope_table(be, inv_freq, c->n_rot / 2, b->tpos ? b->tpos : b->pos, rows, s->cs, b->tree && b->tree_reg);
    if (be->embed_norm)
        be->embed_norm(be, &m->token_embd, b->token, rows, c->rms_eps, m->layers[0].attn_norm, s->x, s->h);
    else {
        be->embed(be, &m->token_embd, b->token, rows, s->x);
        be->rmsnorm(be, s->x, NULL, c->rms_eps, s->x, E, rows);
        be->rmsnorm(be, s->x, m->layers[0].attn_norm, c->rms_eps, s->h, E, rows);
    }
    bool all_logits = logits && b->logits; /* decode, verification: the output norm inside the last residual step */
    for (int64_t r = 0; all_logits && r < rows; r++) all_logits = b->logits[r];
    bool fused = false; /* boundary il's capture written by the residual step before it */
    for (int il = 0; il < c->n_layer; il++) {
        if (cap && !fused) capture_boundary(be, cap, b, il, s->x, E);
        if (!attention_block(m, be, kv, s, b, il, err)) return false;
        const cap_dst cd = capture_fused(be, cap, b, il + 1, E);
        ffn_block(m, be, s, il, rows, all_logits ? m->output_norm : NULL, cd);
        fused = cd.dst != NULL;
    }
    if (cap && !fused) capture_boundary(be, cap, b, (int)c->n_layer, s->x, E);
    if (!logits || !b->logits) return true;
    int64_t n_logits = rows;
    if (!all_logits) {
        const float *xl = logit_rows(be, b, s->x, s->o, E, &n_logits);
        if (!n_logits) return true;
        be->rmsnorm(be, xl, m->output_norm, c->rms_eps, s->h, E, n_logits);
    }
    be->matmul(be, &m->output, s->h, logits, n_logits);
    be->logit_tail(be, logits, c->logit_scale, c->softcap, n_logits * c->n_vocab);
    return true;
}
