/* Fail-closed loading of a dflash GGUF (docs/speculative.md; the layout of
 * tools/train/export_dflash.py and llama.cpp's converter, docs/glimmer-tiny.md).
 * Every geometry value comes from the file and is
 * checked against every tensor; anything unexpected is refused by name. */
#include "spec/dflash.h"
#include "gguf/gguf_internal.h"
#include "model/bind.h"
#include "model/repack.h"
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>

#define ARCH "dflash"

typedef struct loader {
    mu_binder b;
    mu_dflash *d;
} loader;

/* ---------- metadata ---------- */

/* A required key that must also be > 0. */
static bool req_f32(loader *L, const char *key, float *out) {
    if (!mu_bind_f32(&L->b, key, out, true, 0)) return false;
    if (!(*out > 0)) return mu_bind_fail(&L->b, "key %s must be finite and > 0", key);
    return true;
}

static bool check_arch(loader *L) {
    char *arch = NULL;
    int r = gguf_get_str(L->b.f, "general.architecture", &arch, L->b.err);
    bool ok = r > 0 && !strcmp(arch, ARCH);
    if (r == 0) mu_bind_fail(&L->b, "required key general.architecture is missing");
    else if (r < 0) mu_err_prefix(L->b.err, "%s", L->b.f->path);
    else if (!ok) mu_bind_fail(&L->b, "general.architecture is '%s'; a DFlash assistant must be '" ARCH "'", arch);
    free(arch);
    return ok;
}

/* dflash.target_layers: one-based, non-empty, no zero, no duplicates. */
static bool load_target_layers(loader *L, mu_dflash_config *c) {
    const char *key = ARCH ".target_layers";
    const gguf_value *v = gguf_get(L->b.f, key);
    if (!v) return mu_bind_fail(&L->b, "required key %s is missing", key);
    if (v->type != GGUF_VT_ARRAY || !gguf_vtype_is_int(v->v.arr.elem_type))
        return mu_bind_fail(&L->b, "key %s must be an array of integers", key);
    if (v->v.arr.n == 0 || v->v.arr.n > 256) return mu_bind_fail(&L->b, "key %s must hold 1..256 layers", key);
    c->n_target_layers = (int64_t)v->v.arr.n;
    c->target_layers = mu_xcalloc((size_t)c->n_target_layers, sizeof(int));
    for (int64_t i = 0; i < c->n_target_layers; i++) {
        int64_t x = 0;
        if (!gguf_arr_get_i64(v, (uint64_t)i, &x)) return mu_bind_fail(&L->b, "key %s: element %lld is unreadable", key, (long long)i);
        if (x < 1 || x > 4096)
            return mu_bind_fail(&L->b, "key %s: element %lld is %lld; values are one-based target layers (1..n_layer)", key,
                        (long long)i, (long long)x);
        for (int64_t j = 0; j < i; j++)
            if (c->target_layers[j] == x) return mu_bind_fail(&L->b, "key %s: layer %lld is listed twice", key, (long long)x);
        c->target_layers[i] = (int)x;
    }
    return true;
}

/* Only all-sliding assistants are implemented; a pattern saying otherwise is refused. */
static bool check_swa_pattern(loader *L, const mu_dflash_config *c) {
    const char *key = ARCH ".attention.sliding_window_pattern";
    const gguf_value *v = gguf_get(L->b.f, key);
    if (!v) return true;
    if (v->type != GGUF_VT_ARRAY || v->v.arr.n != (uint64_t)c->n_layer ||
        (v->v.arr.elem_type != GGUF_VT_BOOL && !gguf_vtype_is_int(v->v.arr.elem_type)))
        return mu_bind_fail(&L->b, "key %s must be an array of %lld bools", key, (long long)c->n_layer);
    for (int64_t il = 0; il < c->n_layer; il++) {
        int64_t x = 0;
        if (!gguf_arr_get_i64(v, (uint64_t)il, &x) || x == 0)
            return mu_bind_fail(&L->b, "key %s: layer %lld is not sliding (only all-sliding assistants are supported)", key,
                        (long long)il);
    }
    return true;
}

static bool load_window(loader *L, mu_dflash_config *c) {
    if (!mu_bind_u32(&L->b, ARCH ".attention.sliding_window", &c->sliding_window, false, 0)) return false;
    if (c->sliding_window > 0) return true;
    c->sliding_window = MU_DFLASH_DEFAULT_WINDOW;
    c->window_defaulted = true;
    fprintf(stderr,
            "muser: WARNING: %s: " ARCH ".attention.sliding_window is missing or 0; defaulting to %d context rows "
            "after the %d-row sink - draft conditioning may be wrong if the assistant was trained otherwise\n",
            L->b.f->path, MU_DFLASH_DEFAULT_WINDOW, MU_DFLASH_SINK);
    return true;
}

static bool load_tokenizer_keys(loader *L, mu_dflash_config *c) {
    const gguf_value *tok = gguf_get(L->b.f, "tokenizer.ggml.tokens");
    if (!tok) return mu_bind_fail(&L->b, "required key tokenizer.ggml.tokens is missing (the assistant's vocabulary)");
    if (tok->type != GGUF_VT_ARRAY || tok->v.arr.elem_type != GGUF_VT_STRING || tok->v.arr.n == 0 ||
        tok->v.arr.n > (1u << 24))
        return mu_bind_fail(&L->b, "tokenizer.ggml.tokens must be a non-empty array of strings");
    c->n_vocab = (int64_t)tok->v.arr.n;
    int64_t mask = 0, eos = 0;
    if (!mu_bind_u32(&L->b, "tokenizer.ggml.mask_token_id", &mask, true, 0) ||
        !mu_bind_u32(&L->b, "tokenizer.ggml.eos_token_id", &eos, true, 0))
        return false;
    if (mask >= c->n_vocab)
        return mu_bind_fail(&L->b, "tokenizer.ggml.mask_token_id %lld is outside the vocabulary [0, %lld)", (long long)mask,
                    (long long)c->n_vocab);
    if (eos >= c->n_vocab)
        return mu_bind_fail(&L->b, "tokenizer.ggml.eos_token_id %lld is outside the vocabulary [0, %lld)", (long long)eos,
                    (long long)c->n_vocab);
    c->mask_token = (int32_t)mask;
    return true;
}

static bool load_config(loader *L) {
    mu_dflash_config *c = &L->d->cfg;
    int64_t kl = 0, vl = 0, n_rot = 0;
    if (!check_arch(L) ||
        !mu_bind_u32(&L->b, ARCH ".block_count", &c->n_layer, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".embedding_length", &c->n_embd, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".feed_forward_length", &c->n_ff, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".attention.head_count", &c->n_head, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".attention.head_count_kv", &c->n_head_kv, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".attention.key_length", &kl, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".attention.value_length", &vl, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".context_length", &c->n_ctx_train, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".block_size", &c->block_size, true, 0) ||
        !req_f32(L, ARCH ".attention.layer_norm_rms_epsilon", &c->rms_eps) ||
        !req_f32(L, ARCH ".rope.freq_base", &c->rope_base))
        return false;
    if (c->n_layer <= 0 || c->n_layer > 4096) return mu_bind_fail(&L->b, ARCH ".block_count %lld is out of range (1..4096)", (long long)c->n_layer);
    if (c->n_embd <= 0 || c->n_ff <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 || c->n_ctx_train <= 0 ||
        c->n_embd > 65536 || c->n_ff > 1 << 20 || c->n_head > 1024)
        return mu_bind_fail(&L->b, "zero or out-of-range geometry (embedding_length, feed_forward_length, head counts, context_length)");
    if (c->n_head % c->n_head_kv)
        return mu_bind_fail(&L->b, ARCH ".attention.head_count_kv %lld does not divide head_count %lld", (long long)c->n_head_kv,
                    (long long)c->n_head);
    if (kl != vl) return mu_bind_fail(&L->b, ARCH ".attention.key_length %lld != value_length %lld", (long long)kl, (long long)vl);
    if (kl <= 0 || kl % 2 || kl > 1024) return mu_bind_fail(&L->b, ARCH ".attention.key_length must be even, in 2..1024");
    c->head_dim = kl;
    if (!mu_bind_u32(&L->b, ARCH ".rope.dimension_count", &n_rot, false, kl)) return false;
    if (n_rot != kl) return mu_bind_fail(&L->b, ARCH ".rope.dimension_count %lld: only full-head NeoX RoPE is supported", (long long)n_rot);
    if (c->block_size < 2 || c->block_size > 1024)
        return mu_bind_fail(&L->b, ARCH ".block_size %lld is out of range (2..1024)", (long long)c->block_size);
    return load_target_layers(L, c) && check_swa_pattern(L, c) && load_window(L, c) && load_tokenizer_keys(L, c);
}

/* ---------- tensors ---------- */

static bool bind_layer(loader *L, int il) {
    const mu_dflash_config *c = &L->d->cfg;
    mu_dflash_layer *lw = &L->d->layers[il];
    const int64_t E = c->n_embd, Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim, F = c->n_ff;
    char n[64];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    return mu_bind_vector(&L->b, T("attn_norm.weight"), E, &lw->attn_norm) &&
           mu_bind_weight(&L->b, T("attn_q.weight"), E, Q, &lw->q) &&
           mu_bind_weight(&L->b, T("attn_k.weight"), E, KV, &lw->k) &&
           mu_bind_weight(&L->b, T("attn_v.weight"), E, KV, &lw->v) &&
           mu_bind_weight(&L->b, T("attn_output.weight"), Q, E, &lw->o) &&
           mu_bind_vector(&L->b, T("attn_q_norm.weight"), c->head_dim, &lw->q_norm) &&
           mu_bind_vector(&L->b, T("attn_k_norm.weight"), c->head_dim, &lw->k_norm) &&
           mu_bind_vector(&L->b, T("ffn_norm.weight"), E, &lw->ffn_norm) &&
           mu_bind_weight(&L->b, T("ffn_gate.weight"), E, F, &lw->gate) &&
           mu_bind_weight(&L->b, T("ffn_up.weight"), E, F, &lw->up) &&
           mu_bind_weight(&L->b, T("ffn_down.weight"), F, E, &lw->down);
#undef T
}

static bool bind_all(loader *L) {
    mu_dflash *d = L->d;
    const mu_dflash_config *c = &d->cfg;
    if (!load_config(L)) return false;
    if (!mu_bind_weight(&L->b, "fc.weight", c->n_target_layers * c->n_embd, c->n_embd, &d->fc) ||
        !mu_bind_vector(&L->b, "enc.output_norm.weight", c->n_embd, &d->hidden_norm) ||
        !mu_bind_vector(&L->b, "output_norm.weight", c->n_embd, &d->output_norm))
        return false;
    d->layers = mu_xcalloc((size_t)c->n_layer, sizeof *d->layers);
    for (int il = 0; il < c->n_layer; il++)
        if (!bind_layer(L, il)) return false;
    for (uint64_t i = 0; i < L->b.f->n_tensors; i++) {
        if (L->b.used[i]) continue;
        const char *tn = L->b.f->tensors[i].name;
        if (!strcmp(tn, "token_embd.weight") || !strcmp(tn, "output.weight"))
            return mu_bind_fail(&L->b, "tensor %s: an assistant with its own embedding or head is not supported "
                           "(it must share the target's)", tn);
        return mu_bind_fail(&L->b, "unexpected tensor %s (not part of a DFlash assistant this engine runs)", tn);
    }
    return true;
}

/* ---------- identity ---------- */

static bool is_identity_key(const char *key) {
    static const char prefix[] = "tokenizer.", tmpl[] = "tokenizer.chat_template";
    return !strncmp(key, prefix, sizeof prefix - 1) && strncmp(key, tmpl, sizeof tmpl - 1) &&
           strcmp(key, "tokenizer.ggml.mask_token_id");
}

/* The records hashed exactly as gguf_sha256_tokenizer hashes them (same tag,
 * file order, raw record bytes), minus the mask key only an assistant has. */
void mu_dflash_tokenizer_sha(const gguf_file *f, char hex[65]) {
    static const char tag[] = "muser-c.gguf-tokenizer.v1";
    const gguf_reader_priv *pv = f ? f->priv : NULL;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_MD_CTX *ctx = pv ? EVP_MD_CTX_new() : NULL;
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) && EVP_DigestUpdate(ctx, tag, sizeof tag);
    for (uint64_t i = 0; ok && i < f->n_kv; i++)
        if (is_identity_key(f->kv[i].key))
            ok = EVP_DigestUpdate(ctx, f->base + f->kv[i].offset, (size_t)(pv->kv_end[i] - f->kv[i].offset));
    ok = ok && EVP_DigestFinal_ex(ctx, md, &len) && len == 32;
    EVP_MD_CTX_free(ctx);
    memset(hex, 0, 65);
    for (unsigned i = 0; ok && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
}

bool mu_dflash_check_target(const mu_dflash *d, const mu_model *t, mu_error *err) {
    const mu_dflash_config *c = &d->cfg;
    const char *dp = d->gguf->path, *tp = t->gguf->path;
    if (c->n_embd != t->cfg.n_embd) {
        mu_err_set(err, "%s: embedding_length %lld does not match the target %s (%lld)", dp, (long long)c->n_embd, tp,
                   (long long)t->cfg.n_embd);
        return false;
    }
    if (c->n_vocab != t->cfg.n_vocab) {
        mu_err_set(err, "%s: vocabulary of %lld tokens does not match the target %s (%lld)", dp,
                   (long long)c->n_vocab, tp, (long long)t->cfg.n_vocab);
        return false;
    }
    for (int64_t i = 0; i < c->n_target_layers; i++)
        if (c->target_layers[i] > t->cfg.n_layer) {
            mu_err_set(err, "%s: " ARCH ".target_layers[%lld] = %d exceeds the target's %lld layers", dp, (long long)i,
                       c->target_layers[i], (long long)t->cfg.n_layer);
            return false;
        }
    if (!gguf_get(t->gguf, "tokenizer.ggml.tokens")) {
        mu_err_set(err, "target %s has no tokenizer; the assistant's tokenizer identity cannot be checked", tp);
        return false;
    }
    char tsha[65];
    mu_dflash_tokenizer_sha(t->gguf, tsha);
    if (strcmp(tsha, d->tokenizer_sha)) {
        mu_err_set(err, "%s: tokenizer identity %.16s... differs from the target %s (%.16s...)", dp, d->tokenizer_sha, tp,
                   tsha);
        return false;
    }
    return true;
}

/* ---------- lifetime ---------- */

mu_dflash *mu_dflash_from_gguf(gguf_file *f, mu_error *err) {
    mu_dflash *d = mu_xcalloc(1, sizeof *d);
    d->gguf = f;
    loader L = {.d = d};
    mu_binder_init(&L.b, f, err, "the assistant", false);
    bool ok = bind_all(&L);
    mu_binder_free(&L.b);
    if (!ok) {
        mu_dflash_free(d);
        return NULL;
    }
    mu_dflash_tokenizer_sha(f, d->tokenizer_sha);
    d->name = mu_bind_name(f);
    return d;
}

mu_dflash *mu_dflash_load(const char *path, mu_error *err) {
    gguf_file *f = gguf_open(path, err);
    return f ? mu_dflash_from_gguf(f, err) : NULL;
}

void mu_dflash_free(mu_dflash *d) {
    if (!d) return;
    if (d->layers)
        for (int64_t il = 0; il < d->cfg.n_layer; il++) {
            mu_dflash_layer *lw = &d->layers[il];
            free(lw->attn_norm); free(lw->ffn_norm); free(lw->q_norm); free(lw->k_norm);
        }
    free(d->layers);
    free(d->hidden_norm);
    free(d->output_norm);
    free(d->cfg.target_layers);
    free(d->name);
    gguf_close(d->gguf);
    free(d);
}

void mu_dflash_repack(mu_dflash *d, mu_backend *be) {
    const int64_t n = d->cfg.n_layer;
    mu_weight **ws = mu_xcalloc((size_t)n * 7 + 1, sizeof *ws);
    size_t k = 0;
    ws[k++] = &d->fc;
    for (int64_t il = 0; il < n; il++) {
        mu_dflash_layer *l = &d->layers[il];
        mu_weight *lw[] = {&l->q, &l->k, &l->v, &l->o, &l->gate, &l->up, &l->down};
        for (size_t i = 0; i < 7; i++) ws[k++] = lw[i];
    }
    mu_repack_weights(d->gguf, be, ws, k);
    free(ws);
    for (int64_t il = 0; il < n; il++) { /* the norm vectors */
        const mu_dflash_layer *l = &d->layers[il];
        mu_hold_vectors(be, (const float *[]){l->attn_norm, l->ffn_norm}, 2, d->cfg.n_embd);
        mu_hold_vectors(be, (const float *[]){l->q_norm, l->k_norm}, 2, d->cfg.head_dim);
    }
    mu_hold_vectors(be, (const float *[]){d->hidden_norm, d->output_norm}, 2, d->cfg.n_embd);
}
