/* Fail-closed loading of a muse-glimmer GGUF (keys, tensors and lanes:
 * docs/model.md).
 * Every geometry value comes from the file and is checked against every
 * tensor; anything unexpected is refused with the key or tensor named. */
#include "model/model.h"
#include "model/bind.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define ARCH "muse-glimmer"

typedef struct loader {
    mu_binder b;
    mu_model *m;
} loader;

/* sliding_window_pattern: scalar period (il % p < p - 1 is SWA) or an array
 * of n_layer BOOL/INT32/UINT32 (non-zero = SWA). Missing is an error. */
static bool load_swa_pattern(loader *L, mu_model_config *c) {
    const char *key = ARCH ".attention.sliding_window_pattern";
    const gguf_value *v = gguf_get(L->b.f, key);
    if (!v) return mu_bind_fail(&L->b, "required key %s is missing (refusing to guess the layer pattern)", key);
    c->is_swa = mu_xcalloc((size_t)c->n_layer, sizeof(bool));
    if (v->type == GGUF_VT_UINT32 || v->type == GGUF_VT_INT32) {
        int64_t p = v->type == GGUF_VT_UINT32 ? (int64_t)v->v.u64 : v->v.i64;
        if (p < 0) return mu_bind_fail(&L->b, "key %s has a negative period", key);
        for (int64_t il = 0; il < c->n_layer; il++)
            c->is_swa[il] = p == 0 || il % p < p - 1;
        return true;
    }
    if (v->type != GGUF_VT_ARRAY)
        return mu_bind_fail(&L->b, "key %s has type %s; expected an array or uint32", key, gguf_vtype_name(v->type));
    gguf_vtype et = v->v.arr.elem_type;
    if (et != GGUF_VT_BOOL && et != GGUF_VT_INT32 && et != GGUF_VT_UINT32)
        return mu_bind_fail(&L->b, "key %s has element type %s; expected bool, int32 or uint32", key, gguf_vtype_name(et));
    if (v->v.arr.n != (uint64_t)c->n_layer) {
        char got[64];
        snprintf(got, sizeof got, "%llu entries for %lld layers", (unsigned long long)v->v.arr.n,
                 (long long)c->n_layer);
        return mu_bind_fail(&L->b, "key %s has %s", key, got);
    }
    for (int64_t il = 0; il < c->n_layer; il++) {
        int64_t x = 0;
        if (!gguf_arr_get_i64(v, (uint64_t)il, &x)) return mu_bind_fail(&L->b, "key %s: unreadable element", key);
        c->is_swa[il] = x != 0;
    }
    return true;
}

static bool load_config(loader *L) {
    mu_model_config *c = &L->m->cfg;
    char *arch = NULL;
    int r = gguf_get_str(L->b.f, "general.architecture", &arch, L->b.err);
    if (r <= 0) {
        if (r == 0) mu_bind_fail(&L->b, "required key general.architecture is missing");
        else mu_err_prefix(L->b.err, "%s", L->b.f->path);
        free(arch);
        return false;
    }
    bool ok = strcmp(arch, ARCH) == 0;
    if (!ok) mu_bind_fail(&L->b, "general.architecture is '%s'; this engine serves '" ARCH "'", arch);
    free(arch);
    if (!ok) return false;

    if (!mu_bind_u32(&L->b, ARCH ".block_count", &c->n_layer, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".embedding_length", &c->n_embd, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".context_length", &c->n_ctx_train, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".attention.head_count", &c->n_head, true, 0) ||
        !mu_bind_u32(&L->b, ARCH ".feed_forward_length", &c->n_ff, true, 0))
        return false;
    if (c->n_layer <= 0 || c->n_layer > 4096) return mu_bind_fail(&L->b, "block_count out of range (1..4096)");
    if (c->n_embd <= 0 || c->n_head <= 0 || c->n_ff <= 0 || c->n_ctx_train <= 0)
        return mu_bind_fail(&L->b, "zero geometry value (embedding_length, head_count, feed_forward_length or context_length)");
    if (!mu_bind_u32(&L->b, ARCH ".attention.head_count_kv", &c->n_head_kv, false, c->n_head)) return false;
    if (c->n_head_kv <= 0 || c->n_head % c->n_head_kv)
        return mu_bind_fail(&L->b, "attention.head_count_kv must divide attention.head_count");
    int64_t kl, vl;
    if (!mu_bind_u32(&L->b, ARCH ".attention.key_length", &kl, false, c->n_embd / c->n_head) ||
        !mu_bind_u32(&L->b, ARCH ".attention.value_length", &vl, false, kl))
        return false;
    if (kl != vl) return mu_bind_fail(&L->b, "attention.key_length != attention.value_length (unsupported)");
    if (kl <= 0 || kl % 2) return mu_bind_fail(&L->b, "attention.key_length must be positive and even");
    c->head_dim = kl;
    if (!mu_bind_u32(&L->b, ARCH ".rope.dimension_count", &c->n_rot, false, kl)) return false;
    if (c->n_rot <= 0 || c->n_rot > kl || c->n_rot % 2)
        return mu_bind_fail(&L->b, "rope.dimension_count must be even and <= key_length");
    if (!mu_bind_u32(&L->b, ARCH ".attention.sliding_window", &c->sliding_window, false, 0)) return false;
    if (!load_swa_pattern(L, c)) return false;
    c->n_swa_layers = 0;
    for (int64_t il = 0; il < c->n_layer; il++) c->n_swa_layers += c->is_swa[il];
    if (c->n_swa_layers > 0 && c->sliding_window <= 0)
        return mu_bind_fail(&L->b, "sliding_window_pattern marks sliding layers but " ARCH ".attention.sliding_window is missing or 0");

    float base;
    if (!mu_bind_f32(&L->b, ARCH ".attention.layer_norm_rms_epsilon", &c->rms_eps, true, 0) ||
        !mu_bind_f32(&L->b, ARCH ".logit_scale", &c->logit_scale, true, 1) ||
        !mu_bind_f32(&L->b, ARCH ".final_logit_softcapping", &c->softcap, false, 30.0f) ||
        !mu_bind_f32(&L->b, ARCH ".rope.freq_base", &base, false, 10000.0f) ||
        !mu_bind_f32(&L->b, ARCH ".rope.freq_base_swa", &c->rope_base_swa, false, base))
        return false;
    if (c->rms_eps <= 0) return mu_bind_fail(&L->b, "attention.layer_norm_rms_epsilon must be > 0");
    if (c->softcap < 0) return mu_bind_fail(&L->b, "final_logit_softcapping must be >= 0");
    if (c->rope_base_swa <= 0) return mu_bind_fail(&L->b, "rope.freq_base_swa must be > 0");
    c->rope_freq_scale_swa = 1.0f;
    char *rtype = NULL;
    r = gguf_get_str(L->b.f, ARCH ".rope.scaling.type", &rtype, L->b.err);
    if (r < 0) { mu_err_prefix(L->b.err, "%s", L->b.f->path); return false; }
    if (r > 0 && strcmp(rtype, "none") && strcmp(rtype, "linear")) {
        mu_bind_fail(&L->b, "rope.scaling.type '%s' is not supported", rtype);
        free(rtype);
        return false;
    }
    free(rtype);
    float factor;
    if (!mu_bind_f32(&L->b, ARCH ".rope.scaling.factor", &factor, false, 1.0f)) return false;
    if (factor <= 0) return mu_bind_fail(&L->b, "rope.scaling.factor must be > 0");
    /* llama.cpp applies the linear factor only to the full-attention base; muse
     * never sets freq_scale_swa, so sliding layers keep 1.0 (docs/model.md). */
    return true;
}

/* ---------- tensors ---------- */

static bool constant_vector(const float *v, int64_t n) {
    for (int64_t i = 1; i < n; i++)
        if (mu_f32_bits(v[i]) != mu_f32_bits(v[0])) return false;
    return true;
}

static bool bind_layer(loader *L, int il) {
    const mu_model_config *c = &L->m->cfg;
    mu_layer_weights *lw = &L->m->layers[il];
    int64_t E = c->n_embd, Q = c->n_head * c->head_dim, KV = c->n_head_kv * c->head_dim, F = c->n_ff;
    char n[128];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    if (gguf_find_tensor(L->b.f, T("attn_qkv.weight")))
        return mu_bind_fail(&L->b, "tensor %s (fused QKV) is not supported; expected separate attn_q/k/v", n);
    const char *biases[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "blk.%d.%s", il, biases[i]);
        if (gguf_find_tensor(L->b.f, n)) return mu_bind_fail(&L->b, "tensor %s: projection biases are not part of muse-glimmer", n);
    }
    bool ok = mu_bind_vector(&L->b, T("attn_norm.weight"), E, &lw->attn_norm) &&
              mu_bind_weight(&L->b, T("attn_q.weight"), E, Q, &lw->attn_q) &&
              mu_bind_weight(&L->b, T("attn_k.weight"), E, KV, &lw->attn_k) &&
              mu_bind_weight(&L->b, T("attn_v.weight"), E, KV, &lw->attn_v) &&
              mu_bind_weight(&L->b, T("attn_gate.weight"), E, Q, &lw->attn_gate) &&
              mu_bind_vector(&L->b, T("attn_q_norm.weight"), c->head_dim, &lw->attn_q_norm) &&
              mu_bind_vector(&L->b, T("attn_k_norm.weight"), c->head_dim, &lw->attn_k_norm) &&
              mu_bind_weight(&L->b, T("attn_output.weight"), Q, E, &lw->attn_output) &&
              mu_bind_vector(&L->b, T("post_attention_norm.weight"), E, &lw->post_attention_norm) &&
              mu_bind_vector(&L->b, T("ffn_norm.weight"), E, &lw->ffn_norm) &&
              mu_bind_weight(&L->b, T("ffn_gate.weight"), E, F, &lw->ffn_gate) &&
              mu_bind_weight(&L->b, T("ffn_up.weight"), E, F, &lw->ffn_up) &&
              mu_bind_weight(&L->b, T("ffn_down.weight"), F, E, &lw->ffn_down) &&
              mu_bind_vector(&L->b, T("post_ffw_norm.weight"), E, &lw->post_ffw_norm);
    if (!ok) return false;
    /* The converter synthesizes q_norm = qk_scale_factor and k_norm = 1; a
     * varying vector means a different model, so refuse it (docs/model.md). */
    if (!constant_vector(lw->attn_q_norm, c->head_dim))
        return mu_bind_fail(&L->b, "tensor %s is not a constant broadcast (non-constant QK-norm)", T("attn_q_norm.weight"));
    if (!constant_vector(lw->attn_k_norm, c->head_dim))
        return mu_bind_fail(&L->b, "tensor %s is not a constant broadcast (non-constant QK-norm)", T("attn_k_norm.weight"));
#undef T
    return true;
}

/* Lane selection is fail-closed in both directions (docs/model.md, Lanes). */
static bool select_lane(loader *L) {
    bool has_native = false;
    for (uint64_t i = 0; i < L->b.f->n_tensors; i++)
        if (L->b.f->tensors[i].type == MU_TYPE_NVFP4_E2M1) has_native = true;
    char *prec = NULL;
    int r = gguf_get_str(L->b.f, "muser.weight_precision", &prec, L->b.err);
    if (r < 0) { mu_err_prefix(L->b.err, "%s", L->b.f->path); return false; }
    bool ok = true;
    if (has_native && (!prec || strcmp(prec, "nvfp4")))
        ok = mu_bind_fail(&L->b, "NVFP4_E2M1 tensors present but muser.weight_precision is '%s' (must be 'nvfp4')", prec ? prec : "absent");
    else if (!has_native && prec && !strcmp(prec, "nvfp4"))
        ok = mu_bind_fail(&L->b, "muser.weight_precision is 'nvfp4' but the file holds no NVFP4_E2M1 tensors");
    else if (prec && strcmp(prec, "nvfp4") && strcmp(prec, "q4_k_xl"))
        ok = mu_bind_fail(&L->b, "muser.weight_precision '%s' is unknown (expected 'q4_k_xl' or 'nvfp4')", prec);
    snprintf(L->m->lane, sizeof L->m->lane, "%s", has_native ? "nvfp4" : "q4_k_xl");
    free(prec);
    if (!ok) return false;
    char *act = NULL;
    r = gguf_get_str(L->b.f, "muser.activation_precision", &act, L->b.err);
    if (r < 0) { mu_err_prefix(L->b.err, "%s", L->b.f->path); return false; }
    bool w4a4 = act && !strcmp(act, "nvfp4");
    if (act && !w4a4 && strcmp(act, "f16")) ok = mu_bind_fail(&L->b, "muser.activation_precision '%s' is unknown", act);
    free(act);
    if (!ok) return false;
    for (uint64_t i = 0; i < L->b.f->n_tensors; i++) {
        const char *tn = L->b.f->tensors[i].name;
        size_t len = strlen(tn), sl = strlen(".nvfp4_input_scale_inv");
        bool is_isi = len > sl && !strcmp(tn + len - sl, ".nvfp4_input_scale_inv");
        if (is_isi != w4a4 && (is_isi || L->b.f->tensors[i].type == MU_TYPE_NVFP4_E2M1)) {
            if (is_isi) return mu_bind_fail(&L->b, "tensor %s present but muser.activation_precision is not 'nvfp4'", tn);
            char isi[300];
            snprintf(isi, sizeof isi, "%s.nvfp4_input_scale_inv", tn);
            if (!gguf_find_tensor(L->b.f, isi))
                return mu_bind_fail(&L->b, "muser.activation_precision is 'nvfp4' but tensor %s has no %s", tn, isi);
        }
    }
    return true;
}

static bool check_tokenizer(loader *L) {
    const gguf_value *tok = gguf_get(L->b.f, "tokenizer.ggml.tokens");
    if (!tok) return true; /* token-id-only use is allowed; the tokenizer issue adds text */
    if (tok->type != GGUF_VT_ARRAY || tok->v.arr.elem_type != GGUF_VT_STRING)
        return mu_bind_fail(&L->b, "tokenizer.ggml.tokens must be an array of strings");
    if (tok->v.arr.n != (uint64_t)L->m->cfg.n_vocab) {
        char msg[96];
        snprintf(msg, sizeof msg, "%llu tokens but the model has %lld vocabulary rows",
                 (unsigned long long)tok->v.arr.n, (long long)L->m->cfg.n_vocab);
        return mu_bind_fail(&L->b, "tokenizer.ggml.tokens has %s", msg);
    }
    return true;
}

static bool bind_all(loader *L) {
    mu_model *m = L->m;
    mu_model_config *c = &m->cfg;
    if (!load_config(L) || !select_lane(L)) return false;
    const gguf_tensor *emb = mu_bind_take(&L->b, "token_embd.weight", true);
    if (!emb) return false;
    if (emb->n_dims != 2 || emb->ne[0] != (uint64_t)c->n_embd || emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return mu_bind_fail(&L->b, "tensor token_embd.weight must be [embedding_length, n_vocab]");
    c->n_vocab = (int64_t)emb->ne[1];
    if (!mu_bind_weight(&L->b, "token_embd.weight", c->n_embd, c->n_vocab, &m->token_embd)) return false;
    if (m->token_embd.nvfp4_scales || m->token_embd.has_scale)
        return mu_bind_fail(&L->b, "tensor token_embd.weight: scaled NVFP4 embeddings are not supported (use F16)");
    if (!gguf_find_tensor(L->b.f, "output.weight"))
        return mu_bind_fail(&L->b, "required tensor output.weight is missing (muse-glimmer has untied embeddings)");
    if (!mu_bind_weight(&L->b, "output.weight", c->n_embd, c->n_vocab, &m->output) ||
        !mu_bind_vector(&L->b, "output_norm.weight", c->n_embd, &m->output_norm))
        return false;
    m->layers = mu_xcalloc((size_t)c->n_layer, sizeof *m->layers);
    for (int il = 0; il < c->n_layer; il++)
        if (!bind_layer(L, il)) return false;
    c->qk_scale_factor = m->layers[0].attn_q_norm[0];
    if (!check_tokenizer(L)) return false;
    for (uint64_t i = 0; i < L->b.f->n_tensors; i++)
        if (!L->b.used[i]) return mu_bind_fail(&L->b, "unexpected tensor %s (not part of muse-glimmer)", L->b.f->tensors[i].name);
    /* the embedding is one row read per token */
    m->weight_bytes = L->b.bound_bytes - m->token_embd.row_bytes * (uint64_t)(c->n_vocab - 1);
    return true;
}

mu_model *mu_model_from_gguf(gguf_file *f, mu_error *err) {
    mu_model *m = mu_xcalloc(1, sizeof *m);
    m->gguf = f;
    loader L = {.m = m};
    mu_binder_init(&L.b, f, err, "this engine", true);
    bool ok = bind_all(&L);
    mu_binder_free(&L.b);
    if (!ok) {
        mu_model_free(m);
        return NULL;
    }
    m->name = mu_bind_name(f);
    return m;
}

mu_model *mu_model_load(const char *path, mu_error *err) {
    gguf_file *f = gguf_open(path, err);
    if (!f) return NULL;
    return mu_model_from_gguf(f, err);
}

void mu_model_free(mu_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int64_t il = 0; il < m->cfg.n_layer; il++) {
            mu_layer_weights *lw = &m->layers[il];
            free(lw->attn_norm); free(lw->post_attention_norm); free(lw->ffn_norm);
            free(lw->post_ffw_norm); free(lw->attn_q_norm); free(lw->attn_k_norm);
        }
        free(m->layers);
    }
    free(m->output_norm);
    free(m->cfg.is_swa);
    free(m->name);
    gguf_close(m->gguf);
    free(m);
}
