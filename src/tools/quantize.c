/* `muser quantize`: dequantize every weight of a GGUF to f32 row by row and
 * re-encode it in the target type or mix. Norm vectors become F32; NVFP4
 * companion tensors are recomputed, never copied; metadata is carried over
 * with general.file_type and muser.weight_precision updated. */
#include "tools/tools.h"
#include "tools/tools_internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Where a planned tensor's values come from. */
typedef struct source {
    const gguf_tensor *t;
    const gguf_tensor *fp4_scales;   /* native NVFP4 source: per-16 E4M3FN bytes */
    float scale;                     /* native scale2 or ggml `.scale` */
    bool has_scale;
    uint64_t n_in, row_bytes;
} source;

typedef struct quant_ctx {
    const char *in_path;
    const mu_plan *plan;
    const source *src;               /* per plan index */
    gguf_writer *w;
    const mu_job *jobs;              /* amax pass: job i's result in amax[i] */
    float *amax;
} quant_ctx;

static const char *const COMPANION_SUFFIXES[] = {
    ".nvfp4_scale", ".nvfp4_scale2", ".nvfp4_input_scale_inv", ".scale", ".input_scale",
};

/* Is `name` a companion of another tensor in f (regenerated, not copied)? */
static bool is_companion(const gguf_file *f, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof COMPANION_SUFFIXES / sizeof COMPANION_SUFFIXES[0]; i++) {
        size_t k = strlen(COMPANION_SUFFIXES[i]);
        if (n <= k || strcmp(name + n - k, COMPANION_SUFFIXES[i])) continue;
        char *base = mu_xmalloc(n - k + 1);
        memcpy(base, name, n - k);
        base[n - k] = '\0';
        bool found = gguf_find_tensor(f, base) != NULL;
        free(base);
        if (found) return true;
    }
    return false;
}

static const gguf_tensor *find_suffixed(const gguf_file *f, const char *name, const char *suffix) {
    char buf[512];
    if ((size_t)snprintf(buf, sizeof buf, "%s%s", name, suffix) >= sizeof buf) return NULL;
    return gguf_find_tensor(f, buf);
}

/* A per-tensor F32 scalar companion: one finite value > 0. */
static bool read_scalar(const gguf_tensor *t, float *out, mu_error *err) {
    float v = 0;
    if (t->type != MU_TYPE_F32 || t->n_elems != 1) {
        mu_err_set(err, "tensor %s: expected one F32 value, found %s with %llu elements", t->name,
                   mu_type_name(t->type) ? mu_type_name(t->type) : "?", (unsigned long long)t->n_elems);
        return false;
    }
    memcpy(&v, t->data, 4);
    if (!isfinite(v) || !(v > 0)) {
        mu_err_set(err, "tensor %s: scale %g is not finite and > 0", t->name, (double)v);
        return false;
    }
    *out = v;
    return true;
}

static bool can_dequantize(uint32_t type) {
    if (type == MU_TYPE_F32 || type == MU_TYPE_F16 || type == MU_TYPE_BF16) return true;
    const mu_type_traits *tr = mu_type_get(type);
    return tr->supported && tr->dequantize;
}

static bool resolve_nvfp4_source(const gguf_file *f, const gguf_tensor *t, source *s, mu_error *err) {
    const gguf_tensor *sc = find_suffixed(f, t->name, ".nvfp4_scale");
    const gguf_tensor *s2 = find_suffixed(f, t->name, ".nvfp4_scale2");
    if (!sc || !s2) {
        mu_err_set(err, "tensor %s is NVFP4_E2M1 but its companion %s%s is missing", t->name,
                   t->name, sc ? ".nvfp4_scale2" : ".nvfp4_scale");
        return false;
    }
    if (t->ne[0] % 16 || sc->type != MU_TYPE_F8_E4M3FN || sc->n_dims != 2 ||
        sc->ne[0] != t->ne[0] / 16 || sc->ne[1] != t->ne[1]) {
        mu_err_set(err, "tensor %s: type %s shape [%llu, %llu] does not match its payload "
                   "(needs F8_E4M3FN [%llu, %llu])", sc->name,
                   mu_type_name(sc->type) ? mu_type_name(sc->type) : "?",
                   (unsigned long long)sc->ne[0], (unsigned long long)sc->ne[1],
                   (unsigned long long)(t->ne[0] / 16), (unsigned long long)t->ne[1]);
        return false;
    }
    for (uint64_t i = 0; i < sc->nbytes; i++) {
        if ((sc->data[i] & 0x7F) == 0x7F) {
            mu_err_set(err, "tensor %s: byte %llu is 0x%02X (E4M3FN NaN)", sc->name,
                       (unsigned long long)i, sc->data[i]);
            return false;
        }
    }
    s->fp4_scales = sc;
    s->has_scale = true;
    return read_scalar(s2, &s->scale, err);
}

static bool resolve_source(const gguf_file *f, const gguf_tensor *t, source *s, mu_error *err) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->n_in = t->ne[0];
    s->scale = 1.0f;
    if (t->n_dims > 2 || t->ne[2] * t->ne[3] > 1) {
        mu_err_set(err, "tensor %s has %u dimensions; quantize handles 1-D and 2-D tensors only",
                   t->name, t->n_dims);
        return false;
    }
    mu_type_row_bytes(t->type, s->n_in, &s->row_bytes);
    if (t->type == MU_TYPE_NVFP4_E2M1) return resolve_nvfp4_source(f, t, s, err);
    if (!can_dequantize(t->type)) {
        mu_err_set(err, "tensor %s has type %s, which quantize cannot read", t->name,
                   mu_type_name(t->type) ? mu_type_name(t->type) : "(unknown)");
        return false;
    }
    const gguf_tensor *sc = find_suffixed(f, t->name, ".scale");
    if (sc) {
        s->has_scale = true;
        return read_scalar(sc, &s->scale, err);
    }
    return true;
}

static bool build_plan(const gguf_file *f, const mu_target *target, mu_plan *p, source **srcs,
                       mu_error *err) {
    int64_t have = 0; /* entries allocated in *srcs */
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (is_companion(f, t->name)) continue;
        source s;
        if (!resolve_source(f, t, &s, err)) return false;
        int64_t k = t->n_dims == 1 ? mu_plan_add_vector(p, t->name, t->ne[0])
                                   : mu_plan_add_weight(p, target, t->name, t->ne[0], t->ne[1], err);
        if (k < 0) return false;
        if (p->cap > have) { /* companions get zeroed, unused entries */
            *srcs = mu_xrealloc(*srcs, (size_t)p->cap * sizeof **srcs);
            memset(*srcs + have, 0, (size_t)(p->cap - have) * sizeof **srcs);
            have = p->cap;
        }
        (*srcs)[k] = s;
        p->t[k].src = (int64_t)i;
    }
    return true;
}

/* The quantizers this build has for the planned output types. */
static bool check_encoders(const mu_plan *p, mu_error *err) {
    for (int64_t i = 0; i < p->n; i++) {
        uint32_t type = p->t[i].type;
        if (p->t[i].kind != MU_OUT_MATRIX || type == MU_TYPE_F32 || type == MU_TYPE_F16 ||
            type == MU_TYPE_BF16)
            continue;
        const mu_type_traits *tr = mu_type_get(type);
        if (!tr->supported || !tr->quantize) {
            mu_err_set(err, "tensor %s: this build has no %s quantizer", p->t[i].name, mu_type_name(type));
            return false;
        }
    }
    return true;
}

/* ---------------- rows ---------------- */

static bool source_row(const source *s, uint64_t row, float *dst, mu_error *err) {
    const uint8_t *p = s->t->data + row * s->row_bytes;
    uint64_t n = s->n_in;
    switch (s->t->type) {
    case MU_TYPE_F32: memcpy(dst, p, n * 4); break;
    case MU_TYPE_F16:
        for (uint64_t i = 0; i < n; i++) dst[i] = mu_f16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    case MU_TYPE_BF16:
        for (uint64_t i = 0; i < n; i++) dst[i] = mu_bf16_to_f32((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
        break;
    case MU_TYPE_NVFP4_E2M1:
        mu_nvfp4_dequant_row(p, s->fp4_scales->data + row * (n / 16), s->scale, dst, (int64_t)n);
        break;
    default: mu_type_get(s->t->type)->dequantize(p, dst, (int64_t)n); break;
    }
    if (s->has_scale && s->t->type != MU_TYPE_NVFP4_E2M1)
        for (uint64_t i = 0; i < n; i++) dst[i] *= s->scale;
    for (uint64_t i = 0; i < n; i++) {
        if (!isfinite(dst[i])) {
            mu_err_set(err, "tensor %s row %llu column %llu: non-finite value", s->t->name,
                       (unsigned long long)row, (unsigned long long)i);
            return false;
        }
    }
    return true;
}

static void encode_row(const mu_out_tensor *t, float *x, uint8_t *dst, uint8_t *scales) {
    int64_t n = (int64_t)t->n_in;
    switch (t->type) {
    case MU_TYPE_F32: memcpy(dst, x, (size_t)n * 4); return;
    case MU_TYPE_F16:
    case MU_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = t->type == MU_TYPE_F16 ? mu_f32_to_f16(x[i]) : mu_f32_to_bf16(x[i]);
            dst[2 * i] = (uint8_t)h;
            dst[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return;
    case MU_TYPE_NVFP4_E2M1:
        mu_nvfp4_quantize_row(x, dst, scales, t->scalar_value, n);
        return;
    case MU_TYPE_NVFP4: /* ggml NVFP4 blocks hold x / scale; `.scale` restores it */
        for (int64_t i = 0; i < n; i++) x[i] = x[i] / t->scalar_value;
        mu_quantize_row(t->type, x, dst, n);
        return;
    default: mu_quantize_row(t->type, x, dst, n); return;
    }
}

static bool quant_job(void *vctx, const mu_job *job, mu_error *err) {
    const quant_ctx *c = vctx;
    const mu_out_tensor *t = &c->plan->t[job->tensor];
    const source *s = &c->src[job->tensor];
    const mu_out_tensor *sc = t->companion >= 0 ? &c->plan->t[t->companion] : NULL;
    uint64_t rows = job->row1 - job->row0, sc_row = sc ? sc->row_bytes : 0;
    float *x = mu_xmalloc(t->n_in * sizeof *x);
    uint8_t *out = mu_xmalloc(rows * t->row_bytes), *scales = sc ? mu_xmalloc(rows * sc_row) : NULL;
    bool ok = true;
    for (uint64_t r = 0; ok && r < rows; r++) {
        ok = source_row(s, job->row0 + r, x, err);
        if (ok) encode_row(t, x, out + r * t->row_bytes, scales ? scales + r * sc_row : NULL);
    }
    int fd = gguf_writer_fd(c->w);
    ok = ok && mu_pwrite_all(fd, out, rows * t->row_bytes,
                             gguf_writer_tensor_file_offset(c->w, t->writer_idx) + job->row0 * t->row_bytes,
                             t->name, err);
    if (ok && sc)
        ok = mu_pwrite_all(fd, scales, rows * sc_row,
                           gguf_writer_tensor_file_offset(c->w, sc->writer_idx) + job->row0 * sc_row,
                           sc->name, err);
    free(x);
    free(out);
    free(scales);
    return ok;
}

static bool amax_job(void *vctx, const mu_job *job, mu_error *err) {
    const quant_ctx *c = vctx;
    const mu_out_tensor *t = &c->plan->t[job->tensor];
    float *x = mu_xmalloc(t->n_in * sizeof *x), amax = 0;
    bool ok = true;
    for (uint64_t r = job->row0; ok && r < job->row1; r++) {
        ok = source_row(&c->src[job->tensor], r, x, err);
        for (uint64_t i = 0; ok && i < t->n_in; i++) {
            float a = fabsf(x[i]);
            if (a > amax) amax = a;
        }
    }
    c->amax[job - c->jobs] = amax;
    free(x);
    return ok;
}

static bool is_write_job(const mu_out_tensor *t) {
    return t->kind == MU_OUT_VECTOR || t->kind == MU_OUT_MATRIX || t->kind == MU_OUT_NVFP4;
}

static bool needs_amax(const mu_out_tensor *t) {
    return t->kind == MU_OUT_NVFP4 || (t->kind == MU_OUT_MATRIX && t->type == MU_TYPE_NVFP4);
}

/* Per-tensor NVFP4 global scale: amax(|W|) / (6 * 448), 1 for an all-zero tensor. */
static bool compute_global_scales(quant_ctx *c, mu_plan *p, int n_threads, bool progress, mu_error *err) {
    size_t n_jobs = 0;
    uint64_t total = 0;
    mu_job *jobs = mu_plan_jobs(p, needs_amax, 4u << 20, &n_jobs, &total);
    if (n_jobs == 0) {
        free(jobs);
        return true;
    }
    c->jobs = jobs;
    c->amax = mu_xcalloc(n_jobs, sizeof *c->amax);
    bool ok = mu_run_jobs(jobs, n_jobs, n_threads, amax_job, c, progress, "scan", total, err);
    for (size_t i = 0; ok && i < n_jobs; i++) {
        mu_out_tensor *t = &p->t[jobs[i].tensor];
        if (c->amax[i] > t->scalar_value) t->scalar_value = c->amax[i]; /* running max, then scaled */
    }
    for (int64_t i = 0; ok && i < p->n; i++) {
        mu_out_tensor *t = &p->t[i];
        if (!needs_amax(t)) continue;
        t->scalar_value = t->scalar_value > 0 ? t->scalar_value / (6.0f * 448.0f) : 1.0f;
        p->t[t->scalar].scalar_value = t->scalar_value;
    }
    free(jobs);
    free(c->amax);
    c->jobs = NULL;
    c->amax = NULL;
    return ok;
}

/* ---------------- metadata ---------------- */

static void copy_metadata(const gguf_file *f, const mu_target *target, gguf_writer *w) {
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const char *key = f->kv[i].key;
        /* The output is never W4A4 and its lane key is rewritten below. */
        if (!strcmp(key, "muser.weight_precision") || !strcmp(key, "muser.activation_precision"))
            continue;
        gguf_writer_copy_kv(w, &f->kv[i]);
    }
    gguf_writer_set_alignment(w, GGUF_DEFAULT_ALIGNMENT);
    gguf_writer_set_u32(w, "general.file_type", mu_target_file_type(target));
    const char *precision = mu_target_precision(target);
    if (precision) gguf_writer_set_str(w, "muser.weight_precision", precision);
}

static bool write_output(quant_ctx *c, mu_plan *p, const char *out, int n_threads, bool progress,
                         mu_error *err) {
    if (!gguf_writer_begin(c->w, out, err)) return false;
    size_t n_jobs = 0;
    uint64_t total = 0;
    mu_job *jobs = mu_plan_jobs(p, is_write_job, 4u << 20, &n_jobs, &total);
    bool ok = mu_run_jobs(jobs, n_jobs, n_threads, quant_job, c, progress, "quantize", total, err);
    free(jobs);
    if (!ok) mu_err_prefix(err, "%s", c->in_path);
    return ok && mu_plan_write_scalars(p, c->w, out, err) && gguf_writer_finish(c->w, err);
}

bool mu_quantize_file(const char *in, const char *out, const char *type_or_mix,
                      int n_threads, bool progress, mu_error *err) {
    mu_target target;
    if (!mu_target_parse(type_or_mix, &target, err)) {
        mu_err_prefix(err, "quantize");
        return false;
    }
    if (!in || !out || !*in || !*out) {
        mu_err_set(err, "quantize: input and output paths are required");
        return false;
    }
    gguf_file *f = gguf_open(in, err);
    if (!f) return false;
    mu_plan plan = {0};
    source *srcs = NULL;
    bool ok = build_plan(f, &target, &plan, &srcs, err) && check_encoders(&plan, err);
    if (!ok) mu_err_prefix(err, "%s", in);
    quant_ctx ctx = {.in_path = in, .plan = &plan, .src = srcs};
    ok = ok && compute_global_scales(&ctx, &plan, n_threads, progress, err);
    if (ok) {
        double t0 = mu_now();
        ctx.w = gguf_writer_new();
        copy_metadata(f, &target, ctx.w);
        mu_plan_add_to_writer(&plan, ctx.w);
        ok = write_output(&ctx, &plan, out, n_threads, progress, err);
        gguf_writer_free(ctx.w); /* after a failure this removes the temporary file */
        if (ok && progress) {
            double secs = mu_now() - t0, mb = (double)mu_plan_bytes(&plan) / 1e6;
            fprintf(stderr, "quantize: wrote %s (%s, %.1f MB of tensors) in %.2f s\n", out,
                    target.name, mb, secs);
        }
    }
    free(srcs);
    mu_plan_free(&plan);
    gguf_close(f);
    return ok;
}
