/* `muser synth`: a complete muse-glimmer GGUF with deterministic random
 * weights, in the geometry of a preset (optionally overridden). */
#include "tools/tools.h"
#include "tools/synth_internal.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct geometry {
    const char *preset;
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx, window;
} geometry;

/* Layers come in [SWA, SWA, SWA, FULL] groups; every matrix input width is a
 * multiple of 256 so every K-quant fits. */
static const geometry PRESETS[] = {
    {"tiny", 4, 256, 4, 2, 64, 512, 512, 1024, 64},
    {"small", 24, 3072, 24, 2, 128, 8192, 32768, 8192, 2048},
    {"full", 52, 6656, 32, 2, 128, 19968, 202048, 131072, 2048},
};

/* Hyper-parameters shared by every preset (the real model's values). */
#define SYNTH_RMS_EPS 1e-5f
#define SYNTH_ROPE_BASE 10000.0f
#define SYNTH_ROPE_BASE_SWA 500000.0f
#define SYNTH_LOGIT_SCALE 0.196116f /* 1/sqrt(26) */
#define SYNTH_SOFTCAP 20.0f
#define SYNTH_QK_SCALE 3.87f
#define SYNTH_NORM_NOISE 0.05f
#define SWA_PERIOD 4

void mu_synth_opts_init(mu_synth_opts *o) {
    memset(o, 0, sizeof *o);
    o->preset = "tiny";
    o->n_layer = o->n_embd = o->n_head = o->n_head_kv = o->head_dim = -1;
    o->n_ff = o->n_vocab = o->n_ctx = o->window = -1;
    o->type = "F32";
}

static bool is_swa_layer(int64_t il) {
    return il % SWA_PERIOD != SWA_PERIOD - 1;
}

static bool check_dim(const char *what, int64_t v, int64_t max, mu_error *err) {
    if (v < 1 || v > max) {
        mu_err_set(err, "synth: %s = %lld is out of range (1..%lld)", what, (long long)v, (long long)max);
        return false;
    }
    return true;
}

static bool resolve_geometry(const mu_synth_opts *o, geometry *g, mu_error *err) {
    const char *preset = o->preset ? o->preset : "tiny";
    const geometry *base = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(preset, PRESETS[i].preset)) base = &PRESETS[i];
    if (!base) {
        mu_err_set(err, "synth: unknown preset '%s' (expected tiny, small or full)", preset);
        return false;
    }
    *g = *base;
    int64_t *fields[] = {&g->n_layer, &g->n_embd, &g->n_head, &g->n_head_kv, &g->head_dim,
                         &g->n_ff, &g->n_vocab, &g->n_ctx, &g->window};
    const int64_t overrides[] = {o->n_layer, o->n_embd, o->n_head, o->n_head_kv, o->head_dim,
                                 o->n_ff, o->n_vocab, o->n_ctx, o->window};
    const char *names[] = {"n_layer", "n_embd", "n_head", "n_head_kv", "head_dim",
                           "n_ff", "n_vocab", "n_ctx", "window"};
    for (size_t i = 0; i < 9; i++) {
        if (overrides[i] != -1) *fields[i] = overrides[i];
        /* Limits keep every product (e.g. n_embd * n_vocab * 4) far from overflow. */
        int64_t max = i == 0 ? 4096 : i == 7 ? (int64_t)UINT32_MAX : (1 << 24);
        if (!check_dim(names[i], *fields[i], max, err)) return false;
    }
    if (g->n_layer % SWA_PERIOD) {
        mu_err_set(err, "synth: n_layer = %lld is not a multiple of %d (layers come in "
                   "[SWA, SWA, SWA, FULL] groups)", (long long)g->n_layer, SWA_PERIOD);
        return false;
    }
    if (g->n_head % g->n_head_kv) {
        mu_err_set(err, "synth: n_head = %lld is not a multiple of n_head_kv = %lld",
                   (long long)g->n_head, (long long)g->n_head_kv);
        return false;
    }
    if (g->head_dim % 2) {
        mu_err_set(err, "synth: head_dim = %lld must be even (RoPE rotates pairs)", (long long)g->head_dim);
        return false;
    }
    if (g->window > g->n_ctx) {
        mu_err_set(err, "synth: window = %lld exceeds n_ctx = %lld", (long long)g->window, (long long)g->n_ctx);
        return false;
    }
    return true;
}

/* ---------------- tensors ---------------- */

static bool add_layer(mu_plan *p, const mu_target *t, const geometry *g, int64_t il, mu_error *err) {
    uint64_t E = (uint64_t)g->n_embd, F = (uint64_t)g->n_ff, hd = (uint64_t)g->head_dim;
    uint64_t q = (uint64_t)g->n_head * hd, kv = (uint64_t)g->n_head_kv * hd;
    struct { const char *name; uint64_t n_in, n_out; } mats[] = {
        {"attn_q", E, q}, {"attn_k", E, kv}, {"attn_v", E, kv}, {"attn_gate", E, q},
        {"attn_output", q, E}, {"ffn_gate", E, F}, {"ffn_up", E, F}, {"ffn_down", F, E},
    };
    struct { const char *name; uint64_t n; float mean, std; } vecs[] = {
        {"attn_norm", E, 1.0f, SYNTH_NORM_NOISE},
        {"attn_q_norm", hd, SYNTH_QK_SCALE, 0},   /* converter: full(head_dim, qk_scale_factor) */
        {"attn_k_norm", hd, 1.0f, 0},             /* converter: ones(head_dim) */
        {"post_attention_norm", E, 1.0f, SYNTH_NORM_NOISE},
        {"ffn_norm", E, 1.0f, SYNTH_NORM_NOISE},
        {"post_ffw_norm", E, 1.0f, SYNTH_NORM_NOISE},
    };
    char name[128];
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
        snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)il, vecs[i].name);
        int64_t k = mu_plan_add_vector(p, name, vecs[i].n);
        p->t[k].mean = vecs[i].mean;
        p->t[k].std = vecs[i].std;
    }
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)il, mats[i].name);
        int64_t k = mu_plan_add_weight(p, t, name, mats[i].n_in, mats[i].n_out, err);
        if (k < 0) return false;
        p->t[k].std = (float)(1.0 / mu_tools_sqrt((double)mats[i].n_in));
    }
    return true;
}

static bool build_plan(mu_plan *p, const mu_target *t, const geometry *g, mu_error *err) {
    uint64_t E = (uint64_t)g->n_embd, V = (uint64_t)g->n_vocab;
    int64_t k = mu_plan_add_weight(p, t, "token_embd.weight", E, V, err);
    if (k < 0) return false;
    p->t[k].std = 1.0f; /* the graph RMS-normalises the embedding row first */
    for (int64_t il = 0; il < g->n_layer; il++)
        if (!add_layer(p, t, g, il, err)) return false;
    k = mu_plan_add_vector(p, "output_norm.weight", E);
    p->t[k].std = SYNTH_NORM_NOISE;
    k = mu_plan_add_weight(p, t, "output.weight", E, V, err);
    if (k < 0) return false;
    /* Scaled logits (after logit_scale) come out with unit spread. */
    p->t[k].std = (float)(1.0 / (SYNTH_LOGIT_SCALE * mu_tools_sqrt((double)E)));
    return true;
}

/* ---------------- metadata ---------------- */

static void write_metadata(gguf_writer *w, const geometry *g, const mu_target *t,
                           const mu_synth_opts *o, const mu_synth_vocab *v) {
    char name[64];
    snprintf(name, sizeof name, "muse-glimmer-synth-%s", g->preset);
    gguf_writer_set_str(w, "general.architecture", "muse-glimmer");
    gguf_writer_set_str(w, "general.name", name);
    gguf_writer_set_alignment(w, GGUF_DEFAULT_ALIGNMENT);
    gguf_writer_set_u32(w, "general.file_type", mu_target_file_type(t));
    gguf_writer_set_u32(w, "muse-glimmer.context_length", (uint32_t)g->n_ctx);
    gguf_writer_set_u32(w, "muse-glimmer.embedding_length", (uint32_t)g->n_embd);
    gguf_writer_set_u32(w, "muse-glimmer.block_count", (uint32_t)g->n_layer);
    gguf_writer_set_u32(w, "muse-glimmer.feed_forward_length", (uint32_t)g->n_ff);
    gguf_writer_set_u32(w, "muse-glimmer.attention.head_count", (uint32_t)g->n_head);
    gguf_writer_set_u32(w, "muse-glimmer.attention.head_count_kv", (uint32_t)g->n_head_kv);
    gguf_writer_set_u32(w, "muse-glimmer.attention.key_length", (uint32_t)g->head_dim);
    gguf_writer_set_u32(w, "muse-glimmer.attention.value_length", (uint32_t)g->head_dim);
    gguf_writer_set_f32(w, "muse-glimmer.attention.layer_norm_rms_epsilon", SYNTH_RMS_EPS);
    gguf_writer_set_u32(w, "muse-glimmer.attention.sliding_window", (uint32_t)g->window);
    uint8_t *pattern = mu_xmalloc((size_t)g->n_layer); /* GGUF BOOL = one byte, true = SWA */
    for (int64_t il = 0; il < g->n_layer; il++) pattern[il] = is_swa_layer(il);
    gguf_writer_set_arr(w, "muse-glimmer.attention.sliding_window_pattern", GGUF_VT_BOOL,
                        pattern, (uint64_t)g->n_layer);
    free(pattern);
    gguf_writer_set_f32(w, "muse-glimmer.rope.freq_base", SYNTH_ROPE_BASE);
    gguf_writer_set_f32(w, "muse-glimmer.rope.freq_base_swa", SYNTH_ROPE_BASE_SWA);
    gguf_writer_set_f32(w, "muse-glimmer.logit_scale", SYNTH_LOGIT_SCALE);
    gguf_writer_set_f32(w, "muse-glimmer.final_logit_softcapping", SYNTH_SOFTCAP);
    const char *precision = mu_target_precision(t);
    if (precision) gguf_writer_set_str(w, "muser.weight_precision", precision);
    gguf_writer_set_u64(w, "muser.synth.seed", o->seed);
    gguf_writer_set_str(w, "muser.synth.preset", g->preset);
    mu_synth_vocab_write(v, w);
}

/* ---------------- data ---------------- */

typedef struct synth_ctx {
    const mu_plan *plan;
    const mu_synth_gen *gens;   /* per plan index (weights only) */
    gguf_writer *w;
    uint64_t seed;
} synth_ctx;

static bool synth_job(void *vctx, const mu_job *job, mu_error *err) {
    const synth_ctx *c = vctx;
    const mu_out_tensor *t = &c->plan->t[job->tensor];
    const mu_synth_gen *g = &c->gens[job->tensor];
    uint64_t rows = job->row1 - job->row0;
    uint8_t *buf = mu_xmalloc(rows * t->row_bytes);
    uint8_t *scales = NULL;
    uint64_t scale_row = 0;
    if (t->kind == MU_OUT_VECTOR) {
        mu_synth_vector(c->seed, t->name, t->mean, t->std, t->n_in, (float *)(void *)buf);
    } else if (t->kind == MU_OUT_NVFP4) {
        scale_row = c->plan->t[t->companion].row_bytes;
        scales = mu_xmalloc(rows * scale_row);
        for (uint64_t r = 0; r < rows; r++)
            mu_synth_nvfp4_row(g, job->row0 + r, t->n_in, buf + r * t->row_bytes, scales + r * scale_row);
    } else {
        for (uint64_t r = 0; r < rows; r++)
            mu_synth_row(g, job->row0 + r, t->n_in, buf + r * t->row_bytes);
    }
    int fd = gguf_writer_fd(c->w);
    bool ok = mu_pwrite_all(fd, buf, rows * t->row_bytes,
                            gguf_writer_tensor_file_offset(c->w, t->writer_idx) + job->row0 * t->row_bytes,
                            t->name, err);
    if (ok && scales) {
        const mu_out_tensor *s = &c->plan->t[t->companion];
        ok = mu_pwrite_all(fd, scales, rows * scale_row,
                           gguf_writer_tensor_file_offset(c->w, s->writer_idx) + job->row0 * scale_row,
                           s->name, err);
    }
    free(buf);
    free(scales);
    return ok;
}

static bool is_synth_job(const mu_out_tensor *t) {
    return t->kind == MU_OUT_VECTOR || t->kind == MU_OUT_MATRIX || t->kind == MU_OUT_NVFP4;
}

static mu_synth_gen *make_generators(mu_plan *p, uint64_t seed) {
    mu_synth_gen *gens = mu_xcalloc((size_t)p->n, sizeof *gens);
    for (int64_t i = 0; i < p->n; i++) {
        mu_out_tensor *t = &p->t[i];
        if (t->kind != MU_OUT_MATRIX && t->kind != MU_OUT_NVFP4) continue;
        mu_synth_gen_init(&gens[i], seed, t->name, t->type, t->std);
        if (t->scalar >= 0) p->t[t->scalar].scalar_value = gens[i].scale2;
    }
    return gens;
}

static bool write_data(mu_plan *p, gguf_writer *w, const char *path, const mu_synth_opts *o, mu_error *err) {
    mu_synth_gen *gens = make_generators(p, o->seed);
    synth_ctx ctx = {p, gens, w, o->seed};
    size_t n_jobs = 0;
    uint64_t total = 0;
    mu_job *jobs = mu_plan_jobs(p, is_synth_job, 4u << 20, &n_jobs, &total);
    bool ok = mu_run_jobs(jobs, n_jobs, o->n_threads, synth_job, &ctx, o->progress, "synth", total, err);
    if (!ok) mu_err_prefix(err, "%s", path);
    ok = ok && mu_plan_write_scalars(p, w, path, err);
    free(jobs);
    free(gens);
    return ok;
}

bool mu_synth(const mu_synth_opts *o, mu_error *err) {
    if (!o->out_path || !*o->out_path) {
        mu_err_set(err, "synth: no output path given");
        return false;
    }
    geometry g;
    mu_target target;
    if (!resolve_geometry(o, &g, err)) return false;
    if (!mu_target_parse(o->type, &target, err)) {
        mu_err_prefix(err, "synth");
        return false;
    }
    mu_plan plan = {0};
    mu_synth_vocab vocab;
    if (!build_plan(&plan, &target, &g, err)) {
        mu_err_prefix(err, "synth");
        mu_plan_free(&plan);
        return false;
    }
    if (!mu_synth_vocab_build((uint64_t)g.n_vocab, &vocab, err)) {
        mu_err_prefix(err, "synth");
        mu_plan_free(&plan);
        return false;
    }
    double t0 = mu_now();
    gguf_writer *w = gguf_writer_new();
    write_metadata(w, &g, &target, o, &vocab);
    mu_plan_add_to_writer(&plan, w);
    /* The writer fills a temporary file and renames it on finish; freeing
     * it after a failure removes the temporary: no partial output. */
    bool ok = gguf_writer_begin(w, o->out_path, err) && write_data(&plan, w, o->out_path, o, err) &&
              gguf_writer_finish(w, err);
    gguf_writer_free(w);
    if (ok && o->progress) {
        double secs = mu_now() - t0, mb = (double)mu_plan_bytes(&plan) / 1e6;
        fprintf(stderr, "synth: wrote %s (%s, %.1f MB of tensors) in %.2f s, %.1f MB/s\n",
                o->out_path, target.name, mb, secs, secs > 0 ? mb / secs : 0);
    }
    mu_synth_vocab_free(&vocab);
    mu_plan_free(&plan);
    return ok;
}
