/* Fail-closed GGUF binding shared by the target and assistant loaders (bind.h). */
#include "model/bind.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void mu_binder_init(mu_binder *B, gguf_file *f, mu_error *err, const char *who, bool native_nvfp4) {
    *B = (mu_binder){.f = f, .err = err, .who = who, .native_nvfp4 = native_nvfp4,
                     .used = mu_xcalloc((size_t)f->n_tensors + 1, sizeof(bool))};
}

void mu_binder_free(mu_binder *B) {
    free(B->used);
    B->used = NULL;
}

char *mu_bind_name(const gguf_file *f) {
    char *name = NULL;
    if (gguf_get_str(f, "general.name", &name, NULL) > 0) return name;
    free(name);
    const char *slash = strrchr(f->path, '/');
    return mu_xstrdup(slash ? slash + 1 : f->path);
}

bool mu_bind_fail(mu_binder *B, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mu_err_set(B->err, "%s: %s", B->f->path, msg);
    return false;
}

/* ---------- metadata ---------- */

bool mu_bind_u32(mu_binder *B, const char *key, int64_t *out, bool required, int64_t dflt) {
    uint32_t v;
    int r = gguf_get_u32(B->f, key, &v, B->err);
    if (r < 0) { mu_err_prefix(B->err, "%s", B->f->path); return false; }
    if (r == 0 && required) return mu_bind_fail(B, "required key %s is missing", key);
    *out = r ? (int64_t)v : dflt;
    return true;
}

bool mu_bind_f32(mu_binder *B, const char *key, float *out, bool required, float dflt) {
    int r = gguf_get_f32(B->f, key, out, B->err);
    if (r < 0) { mu_err_prefix(B->err, "%s", B->f->path); return false; }
    if (r == 0) {
        if (required) return mu_bind_fail(B, "required key %s is missing", key);
        *out = dflt;
    }
    if (!isfinite(*out)) return mu_bind_fail(B, "key %s is not finite", key);
    return true;
}

/* ---------- tensors ---------- */

const gguf_tensor *mu_bind_take(mu_binder *B, const char *name, bool required) {
    const gguf_tensor *t = gguf_find_tensor(B->f, name);
    if (!t) {
        if (required) mu_bind_fail(B, "required tensor %s is missing", name);
        return NULL;
    }
    B->used[t - B->f->tensors] = true;
    return t;
}

bool mu_bind_shape(mu_binder *B, const gguf_tensor *t, int64_t ne0, int64_t ne1) {
    if (t->ne[0] == (uint64_t)ne0 && t->ne[1] == (uint64_t)ne1 && t->ne[2] == 1 && t->ne[3] == 1 &&
        (ne1 > 1 || t->n_dims <= 2))
        return true;
    return mu_bind_fail(B, "tensor %s has shape [%llu, %llu, %llu, %llu]; expected [%lld, %lld]", t->name,
                        (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                        (unsigned long long)t->ne[3], (long long)ne0, (long long)ne1);
}

bool mu_bind_scalar_f32(mu_binder *B, const char *name, float *out, bool positive) {
    const gguf_tensor *t = mu_bind_take(B, name, true);
    if (!t) return false;
    if (t->type != MU_TYPE_F32 || t->n_elems != 1) return mu_bind_fail(B, "tensor %s must be a single F32 value", name);
    memcpy(out, t->data, 4);
    if (!isfinite(*out) || (positive && !(*out > 0))) return mu_bind_fail(B, "tensor %s must be finite and > 0", name);
    return true;
}

/* Native NVFP4 companions: .nvfp4_scale (E4M3FN [n_in/16, n_out], no NaN
 * codes), .nvfp4_scale2 (F32 [1] > 0), optional .nvfp4_input_scale_inv. */
static bool bind_nvfp4_native(mu_binder *B, const char *name, mu_weight *w) {
    char cname[300];
    snprintf(cname, sizeof cname, "%s.nvfp4_scale", name);
    const gguf_tensor *s = mu_bind_take(B, cname, true);
    if (!s) return false;
    if (s->type != MU_TYPE_F8_E4M3FN) return mu_bind_fail(B, "tensor %s must have type F8_E4M3FN (1001)", cname);
    if (!mu_bind_shape(B, s, w->n_in / 16, w->n_out)) return false;
    for (uint64_t i = 0; i < s->nbytes; i++)
        if ((s->data[i] & 0x7F) == 0x7F)
            return mu_bind_fail(B, "tensor %s holds a NaN E4M3FN scale (0x7F/0xFF) at byte %llu", cname,
                                (unsigned long long)i);
    w->nvfp4_scales = s->data;
    snprintf(cname, sizeof cname, "%s.nvfp4_scale2", name);
    if (!mu_bind_scalar_f32(B, cname, &w->scale, true)) return false;
    w->has_scale = true;
    snprintf(cname, sizeof cname, "%s.nvfp4_input_scale_inv", name);
    if (gguf_find_tensor(B->f, cname) && !mu_bind_scalar_f32(B, cname, &w->input_scale_inv, true)) return false;
    return true;
}

bool mu_bind_weight(mu_binder *B, const char *name, int64_t n_in, int64_t n_out, mu_weight *w) {
    const gguf_tensor *t = mu_bind_take(B, name, true);
    if (!t || !mu_bind_shape(B, t, n_in, n_out)) return false;
    const mu_type_traits *tr = mu_type_get(t->type);
    const char *tn = mu_type_name(t->type) ? mu_type_name(t->type) : "unknown";
    const bool native = t->type == MU_TYPE_NVFP4_E2M1;
    if ((native && !B->native_nvfp4) ||
        (!native && (!tr->supported || t->type == MU_TYPE_Q8_K || t->type == MU_TYPE_F8_E4M3FN)))
        return mu_bind_fail(B, "tensor %s has type %s, which %s cannot compute with", name, tn, B->who);
    *w = (mu_weight){.name = t->name, .type = t->type, .data = t->data, .scale = 1.0f, .n_in = n_in, .n_out = n_out};
    if (!mu_type_row_bytes(t->type, (uint64_t)n_in, &w->row_bytes))
        return mu_bind_fail(B, "tensor %s: row length %lld is not a multiple of the %s block", name, (long long)n_in, tn);
    if (native) {
        if (n_in % 16) return mu_bind_fail(B, "tensor %s: NVFP4 rows must be a multiple of 16", name);
        if (!bind_nvfp4_native(B, name, w)) return false;
    } else if (t->type == MU_TYPE_NVFP4) {
        char cname[300];
        snprintf(cname, sizeof cname, "%s.scale", name);
        if (gguf_find_tensor(B->f, cname)) {
            if (!mu_bind_scalar_f32(B, cname, &w->scale, false)) return false;
            w->has_scale = true;
        }
    }
    bool via_f16;
    if (mu_weight_uses_q8k(w, &via_f16) && n_in % MU_QK_K)
        return mu_bind_fail(B, "tensor %s: %s rows must be a multiple of 256 values (Q8_K activations)", name, tn);
    mu_error werr;
    if (!mu_weight_check(w, &werr)) return mu_bind_fail(B, "%s", werr.msg);
    B->bound_bytes += t->nbytes;
    return true;
}

bool mu_bind_vector(mu_binder *B, const char *name, int64_t n, float **out) {
    const gguf_tensor *t = mu_bind_take(B, name, true);
    if (!t || !mu_bind_shape(B, t, n, 1)) return false;
    if (t->type != MU_TYPE_F32 && t->type != MU_TYPE_F16 && t->type != MU_TYPE_BF16)
        return mu_bind_fail(B, "norm tensor %s must be F32, F16 or BF16 (has %s)", name,
                            mu_type_name(t->type) ? mu_type_name(t->type) : "unknown");
    float *v = mu_xmalloc((size_t)n * sizeof(float));
    *out = v;
    mu_type_get(t->type)->dequantize(t->data, v, n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return mu_bind_fail(B, "norm tensor %s holds a non-finite value at %lld", name, (long long)i);
    B->bound_bytes += t->nbytes;
    return true;
}
