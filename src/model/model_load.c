/* Fail-closed loading of a muse-glimmer GGUF (book Ch 9, digest §2.1).
 * Every geometry value comes from the file and is checked against every
 * tensor; anything unexpected is refused with the key or tensor named. */
#include "model/model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define ARCH "muse-glimmer"

typedef struct loader {
    gguf_file *f;
    mu_model *m;
    mu_error *err;
    bool *used;                 /* [n_tensors]: consumed by the model */
} loader;

#include <stdarg.h>
__attribute__((format(printf, 2, 3)))
static bool fail(loader *L, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mu_err_set(L->err, "%s: %s", L->f->path, msg);
    return false;
}

/* ---------- metadata ---------- */

static bool req_u32(loader *L, const char *key, int64_t *out) {
    uint32_t v;
    int r = gguf_get_u32(L->f, key, &v, L->err);
    if (r < 0) { mu_err_prefix(L->err, "%s", L->f->path); return false; }
    if (r == 0) return fail(L, "required key %s is missing", key);
    *out = v;
    return true;
}

static bool opt_u32(loader *L, const char *key, int64_t *out, int64_t dflt) {
    uint32_t v;
    int r = gguf_get_u32(L->f, key, &v, L->err);
    if (r < 0) { mu_err_prefix(L->err, "%s", L->f->path); return false; }
    *out = r ? (int64_t)v : dflt;
    return true;
}

static bool opt_f32(loader *L, const char *key, float *out, float dflt, bool required) {
    int r = gguf_get_f32(L->f, key, out, L->err);
    if (r < 0) { mu_err_prefix(L->err, "%s", L->f->path); return false; }
    if (r == 0) {
        if (required) return fail(L, "required key %s is missing", key);
        *out = dflt;
    }
    if (!isfinite(*out)) return fail(L, "key %s is not finite", key);
    return true;
}

/* sliding_window_pattern: scalar period (il % p < p - 1 is SWA) or an array
 * of n_layer BOOL/INT32/UINT32 (non-zero = SWA). Missing is an error. */
static bool load_swa_pattern(loader *L, mu_model_config *c) {
    const char *key = ARCH ".attention.sliding_window_pattern";
    const gguf_value *v = gguf_get(L->f, key);
    if (!v) return fail(L, "required key %s is missing (refusing to guess the layer pattern)", key);
    c->is_swa = mu_xcalloc((size_t)c->n_layer, sizeof(bool));
    if (v->type == GGUF_VT_UINT32 || v->type == GGUF_VT_INT32) {
        int64_t p = v->type == GGUF_VT_UINT32 ? (int64_t)v->v.u64 : v->v.i64;
        if (p < 0) return fail(L, "key %s has a negative period", key);
        for (int64_t il = 0; il < c->n_layer; il++)
            c->is_swa[il] = p == 0 || il % p < p - 1;
        return true;
    }
    if (v->type != GGUF_VT_ARRAY)
        return fail(L, "key %s has type %s; expected an array or uint32", key, gguf_vtype_name(v->type));
    gguf_vtype et = v->v.arr.elem_type;
    if (et != GGUF_VT_BOOL && et != GGUF_VT_INT32 && et != GGUF_VT_UINT32)
        return fail(L, "key %s has element type %s; expected bool, int32 or uint32", key, gguf_vtype_name(et));
    if (v->v.arr.n != (uint64_t)c->n_layer) {
        char got[64];
        snprintf(got, sizeof got, "%llu entries for %lld layers", (unsigned long long)v->v.arr.n,
                 (long long)c->n_layer);
        return fail(L, "key %s has %s", key, got);
    }
    for (int64_t il = 0; il < c->n_layer; il++) {
        int64_t x = 0;
        if (!gguf_arr_get_i64(v, (uint64_t)il, &x)) return fail(L, "key %s: unreadable element", key);
        c->is_swa[il] = x != 0;
    }
    return true;
}

static bool load_config(loader *L) {
    mu_model_config *c = &L->m->cfg;
    char *arch = NULL;
    int r = gguf_get_str(L->f, "general.architecture", &arch, L->err);
    if (r <= 0) {
        if (r == 0) fail(L, "required key general.architecture is missing");
        else mu_err_prefix(L->err, "%s", L->f->path);
        free(arch);
        return false;
    }
    bool ok = strcmp(arch, ARCH) == 0;
    if (!ok) fail(L, "general.architecture is '%s'; this engine serves '" ARCH "'", arch);
    free(arch);
    if (!ok) return false;

    if (!req_u32(L, ARCH ".block_count", &c->n_layer) ||
        !req_u32(L, ARCH ".embedding_length", &c->n_embd) ||
        !req_u32(L, ARCH ".context_length", &c->n_ctx_train) ||
        !req_u32(L, ARCH ".attention.head_count", &c->n_head) ||
        !req_u32(L, ARCH ".feed_forward_length", &c->n_ff))
        return false;
    if (c->n_layer <= 0 || c->n_layer > 4096) return fail(L, "block_count out of range (1..4096)");
    if (c->n_embd <= 0 || c->n_head <= 0 || c->n_ff <= 0 || c->n_ctx_train <= 0)
        return fail(L, "zero geometry value (embedding_length, head_count, feed_forward_length or context_length)");
    if (!opt_u32(L, ARCH ".attention.head_count_kv", &c->n_head_kv, c->n_head)) return false;
    if (c->n_head_kv <= 0 || c->n_head % c->n_head_kv)
        return fail(L, "attention.head_count_kv must divide attention.head_count");
    int64_t kl, vl;
    if (!opt_u32(L, ARCH ".attention.key_length", &kl, c->n_embd / c->n_head) ||
        !opt_u32(L, ARCH ".attention.value_length", &vl, kl))
        return false;
    if (kl != vl) return fail(L, "attention.key_length != attention.value_length (unsupported)");
    if (kl <= 0 || kl % 2) return fail(L, "attention.key_length must be positive and even");
    c->head_dim = kl;
    if (!opt_u32(L, ARCH ".rope.dimension_count", &c->n_rot, kl)) return false;
    if (c->n_rot <= 0 || c->n_rot > kl || c->n_rot % 2)
        return fail(L, "rope.dimension_count must be even and <= key_length");
    if (!opt_u32(L, ARCH ".attention.sliding_window", &c->sliding_window, 0)) return false;
    if (!load_swa_pattern(L, c)) return false;
    c->n_swa_layers = 0;
    for (int64_t il = 0; il < c->n_layer; il++) c->n_swa_layers += c->is_swa[il];
    if (c->n_swa_layers > 0 && c->sliding_window <= 0)
        return fail(L, "sliding_window_pattern marks sliding layers but " ARCH ".attention.sliding_window is missing or 0");

    float base;
    if (!opt_f32(L, ARCH ".attention.layer_norm_rms_epsilon", &c->rms_eps, 0, true) ||
        !opt_f32(L, ARCH ".logit_scale", &c->logit_scale, 1, true) ||
        !opt_f32(L, ARCH ".final_logit_softcapping", &c->softcap, 30.0f, false) ||
        !opt_f32(L, ARCH ".rope.freq_base", &base, 10000.0f, false) ||
        !opt_f32(L, ARCH ".rope.freq_base_swa", &c->rope_base_swa, base, false))
        return false;
    if (c->rms_eps <= 0) return fail(L, "attention.layer_norm_rms_epsilon must be > 0");
    if (c->softcap < 0) return fail(L, "final_logit_softcapping must be >= 0");
    if (c->rope_base_swa <= 0) return fail(L, "rope.freq_base_swa must be > 0");
    c->rope_freq_scale_swa = 1.0f;
    char *rtype = NULL;
    r = gguf_get_str(L->f, ARCH ".rope.scaling.type", &rtype, L->err);
    if (r < 0) { mu_err_prefix(L->err, "%s", L->f->path); return false; }
    if (r > 0 && strcmp(rtype, "none") && strcmp(rtype, "linear")) {
        fail(L, "rope.scaling.type '%s' is not supported", rtype);
        free(rtype);
        return false;
    }
    free(rtype);
    float factor;
    if (!opt_f32(L, ARCH ".rope.scaling.factor", &factor, 1.0f, false)) return false;
    if (factor <= 0) return fail(L, "rope.scaling.factor must be > 0");
    /* llama.cpp applies the linear factor only to the full-attention base; muse
     * never sets freq_scale_swa, so sliding layers keep 1.0 (spec §2). */
    return true;
}

/* ---------- tensors ---------- */

static const gguf_tensor *take(loader *L, const char *name, bool required) {
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t) {
        if (required) fail(L, "required tensor %s is missing", name);
        return NULL;
    }
    L->used[t - L->f->tensors] = true;
    return t;
}

static bool shape_is(loader *L, const gguf_tensor *t, int64_t ne0, int64_t ne1) {
    bool ok = t->ne[0] == (uint64_t)ne0 && t->ne[1] == (uint64_t)ne1 && t->ne[2] == 1 && t->ne[3] == 1 &&
              (ne1 > 1 || t->n_dims <= 2);
    if (!ok) {
        char want[160];
        snprintf(want, sizeof want, "[%llu, %llu, %llu, %llu] (expected [%lld, %lld])",
                 (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                 (unsigned long long)t->ne[3], (long long)ne0, (long long)ne1);
        return fail(L, "tensor %s has shape %s", t->name, want);
    }
    return true;
}

static bool scalar_f32(loader *L, const char *name, float *out, bool positive) {
    const gguf_tensor *t = take(L, name, true);
    if (!t) return false;
    if (t->type != MU_TYPE_F32 || t->n_elems != 1) return fail(L, "tensor %s must be a single F32 value", name);
    memcpy(out, t->data, 4);
    if (!isfinite(*out) || (positive && !(*out > 0))) return fail(L, "tensor %s must be finite and > 0", name);
    return true;
}

/* Native NVFP4 companions: .nvfp4_scale (E4M3FN [n_in/16, n_out], no NaN
 * codes), .nvfp4_scale2 (F32 [1] > 0), optional .nvfp4_input_scale_inv. */
static bool bind_nvfp4_native(loader *L, const char *name, mu_weight *w) {
    char cname[300];
    snprintf(cname, sizeof cname, "%s.nvfp4_scale", name);
    const gguf_tensor *s = take(L, cname, true);
    if (!s) return false;
    if (s->type != MU_TYPE_F8_E4M3FN) return fail(L, "tensor %s must have type F8_E4M3FN (1001)", cname);
    if (!shape_is(L, s, w->n_in / 16, w->n_out)) return false;
    for (uint64_t i = 0; i < s->nbytes; i++)
        if ((s->data[i] & 0x7F) == 0x7F) {
            char at[64];
            snprintf(at, sizeof at, "%llu", (unsigned long long)i);
            return fail(L, "tensor %s holds a NaN E4M3FN scale (0x7F/0xFF) at byte %s", cname, at);
        }
    w->nvfp4_scales = s->data;
    snprintf(cname, sizeof cname, "%s.nvfp4_scale2", name);
    if (!scalar_f32(L, cname, &w->scale, true)) return false;
    w->has_scale = true;
    snprintf(cname, sizeof cname, "%s.nvfp4_input_scale_inv", name);
    if (gguf_find_tensor(L->f, cname) && !scalar_f32(L, cname, &w->input_scale_inv, true)) return false;
    return true;
}

static bool bind_weight(loader *L, const char *name, int64_t n_in, int64_t n_out, mu_weight *w) {
    const gguf_tensor *t = take(L, name, true);
    if (!t || !shape_is(L, t, n_in, n_out)) return false;
    const mu_type_traits *tr = mu_type_get(t->type);
    bool native = t->type == MU_TYPE_NVFP4_E2M1;
    if (!native && (!tr->supported || t->type == MU_TYPE_Q8_K || t->type == MU_TYPE_F8_E4M3FN))
        return fail(L, "tensor %s has type %s, which this engine does not compute with", name,
                    mu_type_name(t->type) ? mu_type_name(t->type) : "unknown");
    memset(w, 0, sizeof *w);
    w->name = t->name;
    w->type = t->type;
    w->data = t->data;
    w->scale = 1.0f;
    w->n_in = n_in;
    w->n_out = n_out;
    if (!mu_type_row_bytes(t->type, (uint64_t)n_in, &w->row_bytes))
        return fail(L, "tensor %s: row length is not a multiple of the %s block", name, mu_type_name(t->type));
    bool via_f16;
    if (native) {
        if (n_in % 16) return fail(L, "tensor %s: NVFP4 rows must be a multiple of 16", name);
        if (!bind_nvfp4_native(L, name, w)) return false;
    } else if (t->type == MU_TYPE_NVFP4) {
        char cname[300];
        snprintf(cname, sizeof cname, "%s.scale", name);
        if (gguf_find_tensor(L->f, cname)) {
            if (!scalar_f32(L, cname, &w->scale, false)) return false;
            w->has_scale = true;
        }
    }
    if (mu_weight_uses_q8k(w, &via_f16) && n_in % MU_QK_K)
        return fail(L, "tensor %s: quantized rows must be a multiple of 256 values (Q8_K activations)", name);
    mu_error werr;
    if (!mu_weight_check(w, &werr)) return fail(L, "%s", werr.msg);
    L->m->weight_bytes += t->nbytes;
    return true;
}

static bool bind_vector(loader *L, const char *name, int64_t n, float **out) {
    const gguf_tensor *t = take(L, name, true);
    if (!t || !shape_is(L, t, n, 1)) return false;
    if (t->type != MU_TYPE_F32 && t->type != MU_TYPE_F16 && t->type != MU_TYPE_BF16)
        return fail(L, "norm tensor %s must be F32, F16 or BF16 (has %s)", name,
                    mu_type_name(t->type) ? mu_type_name(t->type) : "unknown");
    float *v = mu_xmalloc((size_t)n * sizeof(float));
    mu_type_get(t->type)->dequantize(t->data, v, n);
    *out = v;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return fail(L, "norm tensor %s holds a non-finite value", name);
    L->m->weight_bytes += t->nbytes;
    return true;
}

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
    if (gguf_find_tensor(L->f, T("attn_qkv.weight")))
        return fail(L, "tensor %s (fused QKV) is not supported; expected separate attn_q/k/v", n);
    const char *biases[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.bias"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "blk.%d.%s", il, biases[i]);
        if (gguf_find_tensor(L->f, n)) return fail(L, "tensor %s: projection biases are not part of muse-glimmer", n);
    }
    bool ok = bind_vector(L, T("attn_norm.weight"), E, &lw->attn_norm) &&
              bind_weight(L, T("attn_q.weight"), E, Q, &lw->attn_q) &&
              bind_weight(L, T("attn_k.weight"), E, KV, &lw->attn_k) &&
              bind_weight(L, T("attn_v.weight"), E, KV, &lw->attn_v) &&
              bind_weight(L, T("attn_gate.weight"), E, Q, &lw->attn_gate) &&
              bind_vector(L, T("attn_q_norm.weight"), c->head_dim, &lw->attn_q_norm) &&
              bind_vector(L, T("attn_k_norm.weight"), c->head_dim, &lw->attn_k_norm) &&
              bind_weight(L, T("attn_output.weight"), Q, E, &lw->attn_output) &&
              bind_vector(L, T("post_attention_norm.weight"), E, &lw->post_attention_norm) &&
              bind_vector(L, T("ffn_norm.weight"), E, &lw->ffn_norm) &&
              bind_weight(L, T("ffn_gate.weight"), E, F, &lw->ffn_gate) &&
              bind_weight(L, T("ffn_up.weight"), E, F, &lw->ffn_up) &&
              bind_weight(L, T("ffn_down.weight"), F, E, &lw->ffn_down) &&
              bind_vector(L, T("post_ffw_norm.weight"), E, &lw->post_ffw_norm);
    if (!ok) return false;
    /* The converter synthesizes q_norm = qk_scale_factor and k_norm = 1; a
     * varying vector means a different model (book Ch 9: refuse). */
    if (!constant_vector(lw->attn_q_norm, c->head_dim))
        return fail(L, "tensor %s is not a constant broadcast (non-constant QK-norm)", T("attn_q_norm.weight"));
    if (!constant_vector(lw->attn_k_norm, c->head_dim))
        return fail(L, "tensor %s is not a constant broadcast (non-constant QK-norm)", T("attn_k_norm.weight"));
#undef T
    return true;
}

/* Lane selection is fail-closed in both directions (digest §2.1). */
static bool select_lane(loader *L) {
    bool has_native = false;
    for (uint64_t i = 0; i < L->f->n_tensors; i++)
        if (L->f->tensors[i].type == MU_TYPE_NVFP4_E2M1) has_native = true;
    char *prec = NULL;
    int r = gguf_get_str(L->f, "muser.weight_precision", &prec, L->err);
    if (r < 0) { mu_err_prefix(L->err, "%s", L->f->path); return false; }
    bool ok = true;
    if (has_native && (!prec || strcmp(prec, "nvfp4")))
        ok = fail(L, "NVFP4_E2M1 tensors present but muser.weight_precision is '%s' (must be 'nvfp4')", prec ? prec : "absent");
    else if (!has_native && prec && !strcmp(prec, "nvfp4"))
        ok = fail(L, "muser.weight_precision is 'nvfp4' but the file holds no NVFP4_E2M1 tensors");
    else if (prec && strcmp(prec, "nvfp4") && strcmp(prec, "q4_k_xl"))
        ok = fail(L, "muser.weight_precision '%s' is unknown (expected 'q4_k_xl' or 'nvfp4')", prec);
    snprintf(L->m->lane, sizeof L->m->lane, "%s", has_native ? "nvfp4" : "q4_k_xl");
    free(prec);
    if (!ok) return false;
    char *act = NULL;
    r = gguf_get_str(L->f, "muser.activation_precision", &act, L->err);
    if (r < 0) { mu_err_prefix(L->err, "%s", L->f->path); return false; }
    bool w4a4 = act && !strcmp(act, "nvfp4");
    if (act && !w4a4 && strcmp(act, "f16")) ok = fail(L, "muser.activation_precision '%s' is unknown", act);
    free(act);
    if (!ok) return false;
    for (uint64_t i = 0; i < L->f->n_tensors; i++) {
        const char *tn = L->f->tensors[i].name;
        size_t len = strlen(tn), sl = strlen(".nvfp4_input_scale_inv");
        bool is_isi = len > sl && !strcmp(tn + len - sl, ".nvfp4_input_scale_inv");
        if (is_isi != w4a4 && (is_isi || L->f->tensors[i].type == MU_TYPE_NVFP4_E2M1)) {
            if (is_isi) return fail(L, "tensor %s present but muser.activation_precision is not 'nvfp4'", tn);
            char isi[300];
            snprintf(isi, sizeof isi, "%s.nvfp4_input_scale_inv", tn);
            if (!gguf_find_tensor(L->f, isi))
                return fail(L, "muser.activation_precision is 'nvfp4' but tensor %s has no %s", tn, isi);
        }
    }
    return true;
}

static bool check_tokenizer(loader *L) {
    const gguf_value *tok = gguf_get(L->f, "tokenizer.ggml.tokens");
    if (!tok) return true; /* token-id-only use is allowed; the tokenizer issue adds text */
    if (tok->type != GGUF_VT_ARRAY || tok->v.arr.elem_type != GGUF_VT_STRING)
        return fail(L, "tokenizer.ggml.tokens must be an array of strings");
    if (tok->v.arr.n != (uint64_t)L->m->cfg.n_vocab) {
        char msg[96];
        snprintf(msg, sizeof msg, "%llu tokens but the model has %lld vocabulary rows",
                 (unsigned long long)tok->v.arr.n, (long long)L->m->cfg.n_vocab);
        return fail(L, "tokenizer.ggml.tokens has %s", msg);
    }
    return true;
}

static bool bind_all(loader *L) {
    mu_model *m = L->m;
    mu_model_config *c = &m->cfg;
    if (!load_config(L) || !select_lane(L)) return false;
    const gguf_tensor *emb = take(L, "token_embd.weight", true);
    if (!emb) return false;
    if (emb->n_dims != 2 || emb->ne[0] != (uint64_t)c->n_embd || emb->ne[1] == 0 || emb->ne[1] > (1u << 24))
        return fail(L, "tensor token_embd.weight must be [embedding_length, n_vocab]");
    c->n_vocab = (int64_t)emb->ne[1];
    if (!bind_weight(L, "token_embd.weight", c->n_embd, c->n_vocab, &m->token_embd)) return false;
    if (m->token_embd.nvfp4_scales || m->token_embd.has_scale)
        return fail(L, "tensor token_embd.weight: scaled NVFP4 embeddings are not supported (use F16)");
    m->weight_bytes -= m->token_embd.row_bytes * (uint64_t)c->n_vocab; /* one row read per token */
    m->weight_bytes += m->token_embd.row_bytes;
    if (!gguf_find_tensor(L->f, "output.weight"))
        return fail(L, "required tensor output.weight is missing (muse-glimmer has untied embeddings)");
    if (!bind_weight(L, "output.weight", c->n_embd, c->n_vocab, &m->output) ||
        !bind_vector(L, "output_norm.weight", c->n_embd, &m->output_norm))
        return false;
    m->layers = mu_xcalloc((size_t)c->n_layer, sizeof *m->layers);
    for (int il = 0; il < c->n_layer; il++)
        if (!bind_layer(L, il)) return false;
    c->qk_scale_factor = m->layers[0].attn_q_norm[0];
    if (!check_tokenizer(L)) return false;
    for (uint64_t i = 0; i < L->f->n_tensors; i++)
        if (!L->used[i]) return fail(L, "unexpected tensor %s (not part of muse-glimmer)", L->f->tensors[i].name);
    return true;
}

mu_model *mu_model_from_gguf(gguf_file *f, mu_error *err) {
    mu_model *m = mu_xcalloc(1, sizeof *m);
    m->gguf = f;
    loader L = {f, m, err, mu_xcalloc((size_t)f->n_tensors + 1, sizeof(bool))};
    bool ok = bind_all(&L);
    free(L.used);
    if (!ok) {
        mu_model_free(m);
        return NULL;
    }
    char *name = NULL;
    if (gguf_get_str(f, "general.name", &name, NULL) <= 0) {
        free(name);
        const char *slash = strrchr(f->path, '/');
        name = mu_xstrdup(slash ? slash + 1 : f->path);
    }
    m->name = name;
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
