/* The DFlash assistant and exact greedy speculative decoding, on the shipped
 * pair (models/glimmer-tiny-q4_k_xl.gguf + its dflash assistant):
 *  - loader refusals: tampered copies written with the GGUF writer are
 *    refused with the key or tensor named; compatibility with the target
 *    (vocabulary, layers, tokenizer identity) is checked;
 *  - hidden-state capture: off/on gives bit-identical logits, boundary 0 is
 *    the normed embedding and boundary n_layer reproduces the logits through
 *    the output head, chunked prefill captures the same rows;
 *  - the draft forward agrees with an independent double-precision forward
 *    written from tools/train/dflash.py (weights read by tensor name, the
 *    whole context recomputed with the reference's sink + window mask);
 *  - speculative output == plain greedy output at verify lengths 3, 7, 15,
 *    with more than one token per verify step;
 *  - through the public API (muser_spec): sampled output (several
 *    temperatures, seeds, a repetition penalty, a JSON Schema grammar) ==
 *    plain sampled output, with the gate and without; misuse is refused. */
#include "testutil.h"
#include "model_fixture.h"
#include "gguf/gguf.h"
#include "model/api_internal.h"
#include "model/capture.h"
#include "spec/dflash.h"
#include "spec/speculate.h"
#include "gen/gen.h"
#include "sample/sample.h"
#include <math.h>
#include <pthread.h>

static char target_path[512], draft_path[512];
static muser_model *target;

/* ---------------------------------------------------------------- loader */

typedef struct edit {
    const char *name;
    const char *drop_key, *drop_tensor;
    void (*set_keys)(gguf_writer *w, const gguf_file *src);
    const char *halve_tensor;   /* written with ne[1] / 2 rows */
    const char *q8k_tensor;     /* written as zero Q8_K blocks of the same shape */
    const char *extra_tensor;   /* an added F32 [n_embd] tensor */
    const char *expect_load;    /* substring of the load error; NULL = it loads... */
    const char *expect_target;  /* ...and the target check fails with this (NULL = passes) */
} edit;

static void set_layers(gguf_writer *w, const int32_t *v) {
    gguf_writer_set_arr(w, "dflash.target_layers", GGUF_VT_INT32, v, 5);
}
static void set_arch(gguf_writer *w, const gguf_file *f) { (void)f; gguf_writer_set_str(w, "general.architecture", "muse-glimmer"); }
static void set_layer_zero(gguf_writer *w, const gguf_file *f) { (void)f; set_layers(w, (const int32_t[]){0, 2, 4, 5, 7}); }
static void set_layer_dup(gguf_writer *w, const gguf_file *f) { (void)f; set_layers(w, (const int32_t[]){1, 2, 4, 4, 7}); }
static void set_layer_nine(gguf_writer *w, const gguf_file *f) { (void)f; set_layers(w, (const int32_t[]){1, 2, 4, 5, 9}); }
static void set_block_1(gguf_writer *w, const gguf_file *f) { (void)f; gguf_writer_set_u32(w, "dflash.block_size", 1); }
static void set_value_len(gguf_writer *w, const gguf_file *f) { (void)f; gguf_writer_set_u32(w, "dflash.attention.value_length", 32); }
static void set_mask_big(gguf_writer *w, const gguf_file *f) { (void)f; gguf_writer_set_u32(w, "tokenizer.ggml.mask_token_id", 9000); }
static void set_pre(gguf_writer *w, const gguf_file *f) { (void)f; gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe"); }
static void set_pattern_full(gguf_writer *w, const gguf_file *f) {
    (void)f;
    const uint8_t pat[5] = {1, 1, 0, 1, 1};
    gguf_writer_set_arr(w, "dflash.attention.sliding_window_pattern", GGUF_VT_BOOL, pat, 5);
}
/* The same vocabulary minus its last token. */
static void set_tokens_short(gguf_writer *w, const gguf_file *f) {
    const gguf_value *v = gguf_get(f, "tokenizer.ggml.tokens");
    uint64_t n = v->v.arr.n - 1;
    char **s = malloc(n * sizeof *s);
    for (uint64_t i = 0; i < n; i++) {
        s[i] = malloc(v->v.arr.strs[i].len + 1);
        memcpy(s[i], v->v.arr.strs[i].ptr, v->v.arr.strs[i].len);
        s[i][v->v.arr.strs[i].len] = 0;
    }
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)s, n);
    for (uint64_t i = 0; i < n; i++) free(s[i]);
    free(s);
}

static const edit EDITS[] = {
    {.name = "identity"},
    {.name = "arch", .set_keys = set_arch, .expect_load = "general.architecture is 'muse-glimmer'"},
    {.name = "no block size", .drop_key = "dflash.block_size", .expect_load = "key dflash.block_size is missing"},
    {.name = "block size 1", .set_keys = set_block_1, .expect_load = "dflash.block_size 1 is out of range"},
    {.name = "no target layers", .drop_key = "dflash.target_layers", .expect_load = "key dflash.target_layers is missing"},
    {.name = "target layer 0", .set_keys = set_layer_zero, .expect_load = "dflash.target_layers: element 0 is 0"},
    {.name = "duplicate layer", .set_keys = set_layer_dup, .expect_load = "layer 4 is listed twice"},
    {.name = "no rope base", .drop_key = "dflash.rope.freq_base", .expect_load = "key dflash.rope.freq_base is missing"},
    {.name = "no eps", .drop_key = "dflash.attention.layer_norm_rms_epsilon", .expect_load = "layer_norm_rms_epsilon is missing"},
    {.name = "no kv heads", .drop_key = "dflash.attention.head_count_kv", .expect_load = "head_count_kv is missing"},
    {.name = "k != v", .set_keys = set_value_len, .expect_load = "key_length 64 != value_length 32"},
    {.name = "no mask", .drop_key = "tokenizer.ggml.mask_token_id", .expect_load = "mask_token_id is missing"},
    {.name = "mask range", .set_keys = set_mask_big, .expect_load = "mask_token_id 9000 is outside the vocabulary"},
    {.name = "full layer", .set_keys = set_pattern_full, .expect_load = "layer 2 is not sliding"},
    {.name = "shape", .halve_tensor = "blk.2.attn_k.weight", .expect_load = "tensor blk.2.attn_k.weight has shape [512, 64, 1, 1]; expected [512, 128]"},
    {.name = "fc shape", .halve_tensor = "fc.weight", .expect_load = "tensor fc.weight has shape"},
    {.name = "type", .q8k_tensor = "blk.0.attn_q.weight", .expect_load = "blk.0.attn_q.weight has type Q8_K"},
    {.name = "missing tensor", .drop_tensor = "blk.4.ffn_down.weight", .expect_load = "required tensor blk.4.ffn_down.weight is missing"},
    {.name = "own head", .extra_tensor = "output.weight", .expect_load = "output.weight: an assistant with its own"},
    {.name = "extra", .extra_tensor = "blk.0.attn_sinks", .expect_load = "unexpected tensor blk.0.attn_sinks"},
    {.name = "vocab", .set_keys = set_tokens_short, .expect_target = "vocabulary of 8191 tokens does not match"},
    {.name = "layer 9", .set_keys = set_layer_nine, .expect_target = "target_layers[4] = 9 exceeds the target's 8 layers"},
    {.name = "tokenizer", .set_keys = set_pre, .expect_target = "tokenizer identity"},
};

static bool rewrite(const gguf_file *f, const char *dst, const edit *e) {
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!e->drop_key || strcmp(f->kv[i].key, e->drop_key)) gguf_writer_copy_kv(w, &f->kv[i]);
    if (e->set_keys) e->set_keys(w, f);
    void *owned = NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
        uint64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t type = t->type;
        const void *data = t->data;
        if (e->halve_tensor && !strcmp(t->name, e->halve_tensor)) ne[1] /= 2;
        if (e->q8k_tensor && !strcmp(t->name, e->q8k_tensor)) {
            type = MU_TYPE_Q8_K;
            data = owned = calloc(1, (size_t)(ne[0] / 256 * 292 * ne[1]));
        }
        gguf_writer_add_tensor(w, t->name, type, t->n_dims, ne, data);
    }
    static const float extra[512] = {1};
    const uint64_t extra_ne[1] = {512};
    if (e->extra_tensor) gguf_writer_add_tensor(w, e->extra_tensor, MU_TYPE_F32, 1, extra_ne, extra);
    mu_error err;
    bool ok = gguf_writer_write_file(w, dst, &err);
    if (!ok) fprintf(stderr, "write %s: %s\n", dst, err.msg);
    gguf_writer_free(w);
    free(owned);
    return ok;
}

static void test_loader(void) {
    mu_error err = {{0}};
    gguf_file *f = gguf_open(draft_path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;
    for (size_t i = 0; i < sizeof EDITS / sizeof EDITS[0]; i++) {
        const edit *e = &EDITS[i];
        char dst[300];
        snprintf(dst, sizeof dst, "%s/dflash-edit-%zu.gguf", fx_tmpdir(), i);
        if (!rewrite(f, dst, e)) { CHECK_MSG(false, "rewrite %s", e->name); continue; }
        err.msg[0] = 0;
        mu_dflash *d = mu_dflash_load(dst, &err);
        if (e->expect_load) {
            CHECK_MSG(d == NULL, "%s: accepted a defective file", e->name);
            CHECK_MSG(strstr(err.msg, e->expect_load) && strstr(err.msg, dst), "%s: message '%s' lacks '%s' or the path",
                      e->name, err.msg, e->expect_load);
        } else {
            CHECK_MSG(d != NULL, "%s: refused: %s", e->name, err.msg);
            bool ok = d && mu_dflash_check_target(d, target->m, &err);
            if (e->expect_target) {
                CHECK_MSG(d && !ok, "%s: target check passed", e->name);
                CHECK_MSG(!d || strstr(err.msg, e->expect_target), "%s: message '%s' lacks '%s'", e->name, err.msg,
                          e->expect_target);
            } else {
                CHECK_MSG(ok, "%s: target check failed: %s", e->name, err.msg);
            }
        }
        mu_dflash_free(d);
        remove(dst);
    }
    /* A missing window loads (with a warning) at the default 2048 (docs/speculative.md). */
    const edit no_window = {.name = "no window", .drop_key = "dflash.attention.sliding_window"};
    char dst[300];
    snprintf(dst, sizeof dst, "%s/dflash-no-window.gguf", fx_tmpdir());
    CHECK(rewrite(f, dst, &no_window));
    mu_dflash *d = mu_dflash_load(dst, &err);
    CHECK_MSG(d && d->cfg.window_defaulted && d->cfg.sliding_window == 2048, "no window: %s", d ? "wrong default" : err.msg);
    mu_dflash_free(d);
    remove(dst);
    gguf_close(f);

    /* The shipped pair: the geometry of docs/glimmer-tiny.md, matching identities. */
    d = mu_dflash_load(draft_path, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    const mu_dflash_config *c = &d->cfg;
    CHECK(c->n_layer == 5 && c->n_embd == 512 && c->n_head == 8 && c->n_head_kv == 2 && c->head_dim == 64);
    CHECK(c->block_size == 16 && c->sliding_window == 256 && !c->window_defaulted && c->mask_token == 8190);
    CHECK(c->n_target_layers == 5 && c->target_layers[0] == 1 && c->target_layers[2] == 4 && c->target_layers[4] == 7);
    CHECK_MSG(mu_dflash_check_target(d, target->m, &err), "%s", err.msg);
    char official[65], mine[65];
    gguf_sha256_tokenizer(target->m->gguf, official); /* the target has no mask key: the two hashes coincide */
    mu_dflash_tokenizer_sha(target->m->gguf, mine);
    CHECK(!strcmp(official, mine) && !strcmp(mine, d->tokenizer_sha));
    /* a different model is refused by hidden size */
    mu_model *synth = mu_model_load(fx_synth("q4_k_xl", 3, 32), &err);
    CHECK(synth && !mu_dflash_check_target(d, synth, &err) && strstr(err.msg, "embedding_length 512 does not match"));
    mu_model_free(synth);
    mu_dflash_free(d);
}

/* --------------------------------------------------------------- capture */

static int32_t *random_tokens(int64_t n, uint64_t seed) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++) t[i] = (int32_t)(tu_rng_next(&seed) % 8184); /* no control tokens */
    return t;
}

static void test_capture(void) {
    const mu_model *m = target->m;
    const int64_t E = m->cfg.n_embd, V = m->cfg.n_vocab, L = m->cfg.n_layer, N = 40;
    mu_backend *be = target->be;
    muser_error err;
    int32_t *toks = random_tokens(N, 11);
    muser_session_params one = {.n_ctx = 256}, chunked = {.n_ctx = 256, .prefill_chunk = 7};
    muser_session *s = muser_session_create(target, &one, &err), *s7 = muser_session_create(target, &chunked, &err);
    float *plain = malloc((size_t)(N * V) * sizeof(float)), *with = malloc((size_t)(N * V) * sizeof(float));
    CHECK(muser_session_feed_all(s, toks, N, plain, &err));
    int64_t rows;
    CHECK(mu_session_captured(s, &rows) == NULL && rows == 0);
    const int bounds[3] = {(int)L, 0, 3};
    muser_session_reset(s);
    CHECK(mu_session_set_capture(s, bounds, 3, (mu_error *)&err) && mu_session_set_capture(s7, bounds, 3, (mu_error *)&err));
    CHECK(muser_session_feed_all(s, toks, N, with, &err));
    CHECK_MSG(!memcmp(plain, with, (size_t)(N * V) * sizeof(float)), "capture changed the logits");
    const float *cap = mu_session_captured(s, &rows);
    CHECK_EQ_INT(rows, N);
    /* boundary 0 = the weightless-normed embedding */
    float *x = malloc((size_t)(N * E) * sizeof(float)), *y = malloc((size_t)(N * E) * sizeof(float));
    for (int64_t r = 0; r < N; r++) mu_weight_dequant_row(&m->token_embd, toks[r], x + r * E);
    be->rmsnorm(be, x, NULL, m->cfg.rms_eps, x, E, N);
    int bad0 = 0, badL = 0;
    for (int64_t r = 0; r < N; r++) bad0 += memcmp(cap + (r * 3 + 1) * E, x + r * E, (size_t)E * sizeof(float)) != 0;
    /* boundary n_layer through output norm, head and tail = the logits */
    for (int64_t r = 0; r < N; r++) memcpy(x + r * E, cap + r * 3 * E, (size_t)E * sizeof(float));
    float *l = malloc((size_t)(N * V) * sizeof(float));
    be->rmsnorm(be, x, m->output_norm, m->cfg.rms_eps, y, E, N);
    be->matmul(be, &m->output, y, l, N);
    be->logit_tail(be, l, m->cfg.logit_scale, m->cfg.softcap, N * V);
    for (int64_t r = 0; r < N; r++) badL += memcmp(l + r * V, plain + r * V, (size_t)V * sizeof(float)) != 0;
    CHECK_MSG(bad0 == 0 && badL == 0, "boundary 0: %d rows differ, boundary %lld: %d rows differ", bad0, (long long)L, badL);
    /* chunked prefill (7 rows per forward) captures the same bits */
    CHECK(muser_session_feed(s7, toks, N, &err));
    const float *cap7 = mu_session_captured(s7, &rows);
    CHECK(rows == N && !memcmp(cap, cap7, (size_t)(N * 3 * E) * sizeof(float)));
    CHECK(!mu_session_set_capture(s, (const int[]){1, 1}, 2, NULL));
    CHECK(!mu_session_set_capture(s, (const int[]){(int)L + 1}, 1, NULL));
    free(x); free(y); free(l); free(plain); free(with); free(toks);
    muser_session_free(s);
    muser_session_free(s7);
}

/* ------------------------------------------------------ double oracle */

typedef struct oracle {
    const gguf_file *f;         /* the assistant, read by tensor name */
    const mu_dflash_config *c;
    const mu_model *t;
} oracle;

/* Tensor `name` (any type) dequantized to doubles; n_out rows of n_in. */
static double *dq(const oracle *o, const char *name, int64_t *n_in, int64_t *n_out) {
    const gguf_tensor *t = gguf_find_tensor(o->f, name);
    if (!t) { fprintf(stderr, "oracle: no tensor %s\n", name); exit(2); }
    *n_in = (int64_t)t->ne[0];
    *n_out = (int64_t)t->ne[1];
    float *tmp = malloc(t->n_elems * sizeof(float));
    mu_type_get(t->type)->dequantize(t->data, tmp, (int64_t)t->n_elems);
    double *w = malloc(t->n_elems * sizeof(double));
    for (uint64_t i = 0; i < t->n_elems; i++) w[i] = tmp[i];
    free(tmp);
    return w;
}

/* Quantized weights meet activations rounded to Q8_K (the engine's
 * contract, docs/numerics.md): the same rounding, then exact products. */
static void q8k_round(const double *x, double *out, int64_t n, bool via_f16) {
    float *f = calloc((size_t)n, sizeof(float));
    mu_block_q8k *b = malloc((size_t)(n / MU_QK_K) * sizeof *b);
    for (int64_t i = 0; i < n; i++) f[i] = (float)x[i];
    mu_quantize_q8k(f, b, n, via_f16);
    mu_dequantize_q8k(b, f, n);
    for (int64_t i = 0; i < n; i++) out[i] = f[i];
    free(f);
    free(b);
}

static void lin(const oracle *o, const char *name, const double *x, double *y, int64_t rows) {
    int64_t n_in, n_out;
    double *w = dq(o, name, &n_in, &n_out);
    const bool q8 = !mu_type_get(gguf_find_tensor(o->f, name)->type)->is_float;
    double *xr = malloc((size_t)n_in * sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        if (q8) q8k_round(x + r * n_in, xr, n_in, false);
        else memcpy(xr, x + r * n_in, (size_t)n_in * sizeof(double));
        for (int64_t j = 0; j < n_out; j++) {
            double acc = 0;
            for (int64_t i = 0; i < n_in; i++) acc += w[j * n_in + i] * xr[i];
            y[r * n_out + j] = acc;
        }
    }
    free(xr);
    free(w);
}

static void norm(const oracle *o, const char *name, double *x, int64_t n, int64_t rows) {
    int64_t a, b;
    double *w = name ? dq(o, name, &a, &b) : NULL;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += x[r * n + i] * x[r * n + i];
        double inv = 1.0 / sqrt(ss / (double)n + (double)o->c->rms_eps);
        for (int64_t i = 0; i < n; i++) x[r * n + i] = x[r * n + i] * inv * (w ? w[i] : 1.0);
    }
    free(w);
}

/* Per-head norm then NeoX rotation of each row at position pos0 + r. */
static void qk_prep(const oracle *o, const char *norm_name, double *x, int64_t heads, int64_t rows, int64_t pos0) {
    const int64_t D = o->c->head_dim, half = D / 2;
    norm(o, norm_name, x, D, rows * heads);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t h = 0; h < heads; h++) {
            double *v = x + (r * heads + h) * D;
            for (int64_t i = 0; i < half; i++) {
                double ang = (double)(pos0 + r) * pow((double)o->c->rope_base, -2.0 * (double)i / (double)D);
                double a = v[i], b = v[i + half];
                v[i] = a * cos(ang) - b * sin(ang);
                v[i + half] = b * cos(ang) + a * sin(ang);
            }
        }
}

/* Logits of block rows 1..R at anchor p, context = features of rows < p
 * allowed by the reference mask (j < 64 or j >= p - window). */
static void oracle_draft(const oracle *o, const float *features, int64_t p, int32_t anchor, int R, double *logits) {
    const mu_dflash_config *c = o->c;
    const int64_t E = c->n_embd, D = c->head_dim, H = c->n_head, Hkv = c->n_head_kv, B = c->block_size;
    const int64_t NF = c->n_target_layers * E, KV = Hkv * D, Q = H * D, F = c->n_ff, V = o->t->cfg.n_vocab;
    int64_t *rows = malloc((size_t)(p + 1) * sizeof *rows), nc = 0;
    for (int64_t j = 0; j < p; j++)
        if (j < MU_DFLASH_SINK || j >= p - c->sliding_window) rows[nc++] = j;
    double *feat = malloc((size_t)(nc * NF) * sizeof(double)), *ctx = malloc((size_t)(nc * E) * sizeof(double));
    for (int64_t i = 0; i < nc; i++)
        for (int64_t k = 0; k < NF; k++) feat[i * NF + k] = features[rows[i] * NF + k];
    lin(o, "fc.weight", feat, ctx, nc);
    norm(o, "enc.output_norm.weight", ctx, E, nc);
    double *h = malloc((size_t)(B * E) * sizeof(double)), *a = malloc((size_t)(B * E) * sizeof(double));
    double *q = malloc((size_t)(B * Q) * sizeof(double)), *att = malloc((size_t)(B * Q) * sizeof(double));
    double *k = malloc((size_t)((nc + B) * KV) * sizeof(double)), *v = malloc((size_t)((nc + B) * KV) * sizeof(double));
    double *g = malloc((size_t)(B * F) * sizeof(double)), *u = malloc((size_t)(B * F) * sizeof(double));
    double *s = malloc((size_t)(nc + B) * sizeof(double)), *tmp = malloc((size_t)(B * E) * sizeof(double));
    float *row = malloc((size_t)E * sizeof(float));
    for (int64_t r = 0; r < B; r++) {
        mu_weight_dequant_row(&o->t->token_embd, r ? c->mask_token : anchor, row);
        for (int64_t i = 0; i < E; i++) h[r * E + i] = row[i];
    }
    char n[64];
#define NM(fmt) (snprintf(n, sizeof n, "blk.%d." fmt, il), n)
    for (int il = 0; il < c->n_layer; il++) {
        memcpy(a, h, (size_t)(B * E) * sizeof(double));
        norm(o, NM("attn_norm.weight"), a, E, B);
        lin(o, NM("attn_q.weight"), a, q, B);
        qk_prep(o, NM("attn_q_norm.weight"), q, H, B, p);
        lin(o, NM("attn_k.weight"), ctx, k, nc); /* context keys at their positions, one row at a time */
        for (int64_t i = 0; i < nc; i++) qk_prep(o, NM("attn_k_norm.weight"), k + i * KV, Hkv, 1, rows[i]);
        lin(o, NM("attn_v.weight"), ctx, v, nc);
        lin(o, NM("attn_k.weight"), a, k + nc * KV, B);
        qk_prep(o, NM("attn_k_norm.weight"), k + nc * KV, Hkv, B, p);
        lin(o, NM("attn_v.weight"), a, v + nc * KV, B);
        for (int64_t r = 0; r < B; r++)
            for (int64_t hh = 0; hh < H; hh++) {
                const int64_t kvh = hh / (H / Hkv);
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < nc + B; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += q[r * Q + hh * D + d] * k[j * KV + kvh * D + d];
                    s[j] = dot / sqrt((double)D);
                    if (s[j] > mx) mx = s[j];
                }
                for (int64_t j = 0; j < nc + B; j++) sum += s[j] = exp(s[j] - mx);
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j < nc + B; j++) acc += s[j] * v[j * KV + kvh * D + d];
                    att[r * Q + hh * D + d] = acc / sum;
                }
            }
        lin(o, NM("attn_output.weight"), att, tmp, B);
        for (int64_t i = 0; i < B * E; i++) h[i] += tmp[i];
        memcpy(a, h, (size_t)(B * E) * sizeof(double));
        norm(o, NM("ffn_norm.weight"), a, E, B);
        lin(o, NM("ffn_gate.weight"), a, g, B);
        lin(o, NM("ffn_up.weight"), a, u, B);
        for (int64_t i = 0; i < B * F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        lin(o, NM("ffn_down.weight"), g, tmp, B);
        for (int64_t i = 0; i < B * E; i++) h[i] += tmp[i];
    }
#undef NM
    norm(o, "output_norm.weight", h + E, E, R);
    bool via_f16 = false, q8 = mu_weight_uses_q8k(&o->t->output, &via_f16);
    for (int r = 0; r < R; r++) {
        if (q8) q8k_round(h + (1 + r) * E, tmp, E, via_f16);
        else memcpy(tmp, h + (1 + r) * E, (size_t)E * sizeof(double));
        for (int64_t t = 0; t < V; t++) {
            mu_weight_dequant_row(&o->t->output, t, row);
            double acc = 0;
            for (int64_t i = 0; i < E; i++) acc += (double)row[i] * tmp[i];
            logits[r * V + t] = acc;
        }
    }
    free(rows); free(feat); free(ctx); free(h); free(a); free(q); free(att); free(k); free(v);
    free(g); free(u); free(s); free(tmp); free(row);
}

/* The shipped assistant with every matrix dequantized to F32. */
static bool write_f32_copy(const char *dst) {
    mu_error err;
    gguf_file *f = gguf_open(draft_path, &err);
    if (!f) return false;
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, "muser.weight_precision")) gguf_writer_copy_kv(w, &f->kv[i]);
    float **owned = calloc(f->n_tensors, sizeof *owned);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        owned[i] = malloc(t->n_elems * sizeof(float));
        mu_type_get(t->type)->dequantize(t->data, owned[i], (int64_t)t->n_elems);
        gguf_writer_add_tensor(w, t->name, MU_TYPE_F32, t->n_dims, t->ne, owned[i]);
    }
    bool ok = gguf_writer_write_file(w, dst, &err);
    gguf_writer_free(w);
    for (uint64_t i = 0; i < f->n_tensors; i++) free(owned[i]);
    free(owned);
    gguf_close(f);
    return ok;
}

/* Anchors grow through the sink edge and past sink + window (ring wrap). */
#define ORACLE_T 346
static const int64_t ANCHORS[] = {1, 64, 65, 200, 345};
#define N_ANCHORS 5
#define R_ROWS 7

/* Largest |engine - oracle| over the anchors, drafting incrementally. */
static double compare_with_oracle(const mu_dflash *d, const float *features, const int32_t *toks, double *const *ref,
                                  int *argmax_agree, float *last_logits) {
    const int64_t NF = d->cfg.n_target_layers * d->cfg.n_embd, V = target->m->cfg.n_vocab;
    mu_dflash_state *st = mu_dflash_state_new(d, target->m, target->be);
    float *l = malloc((size_t)(R_ROWS * V) * sizeof(float));
    int32_t prop[R_ROWS];
    double worst = 0;
    *argmax_agree = 0;
    for (int a = 0; a < N_ANCHORS; a++) {
        int64_t have = mu_dflash_state_rows(st);
        mu_dflash_append_context(st, features + have * NF, ANCHORS[a] - have);
        mu_dflash_draft(st, NULL, 0, toks[ANCHORS[a]], R_ROWS, prop, l);
        for (int r = 0; r < R_ROWS; r++) {
            int64_t best = 0;
            for (int64_t i = 0; i < V; i++) {
                double diff = fabs((double)l[r * V + i] - ref[a][r * V + i]);
                if (diff > worst || isnan(diff)) worst = isnan(diff) ? INFINITY : diff;
                if (ref[a][r * V + i] > ref[a][r * V + best]) best = i;
            }
            *argmax_agree += prop[r] == best;
        }
    }
    memcpy(last_logits, l, (size_t)(R_ROWS * V) * sizeof(float));
    free(l);
    mu_dflash_state_free(st);
    return worst;
}

static void test_forward_oracle(void) {
    const int64_t V = target->m->cfg.n_vocab;
    mu_error err;
    char f32_path[300];
    snprintf(f32_path, sizeof f32_path, "%s/dflash-f32.gguf", fx_tmpdir());
    CHECK(write_f32_copy(f32_path));
    mu_dflash *d32 = mu_dflash_load(f32_path, &err), *dq4 = mu_dflash_load(draft_path, &err);
    CHECK_MSG(d32 && dq4, "%s", err.msg);
    if (!d32 || !dq4) { mu_dflash_free(d32); mu_dflash_free(dq4); return; }
    /* context features: the target's own hidden states for a token sequence */
    int32_t *toks = random_tokens(ORACLE_T, 5);
    muser_session_params sp = {.n_ctx = 512};
    muser_session *s = muser_session_create(target, &sp, NULL);
    CHECK(mu_session_set_capture(s, d32->cfg.target_layers, (int)d32->cfg.n_target_layers, &err));
    CHECK(muser_session_feed(s, toks, ORACLE_T, NULL));
    int64_t rows;
    const float *features = mu_session_captured(s, &rows);
    CHECK_EQ_INT(rows, ORACLE_T);

    /* one oracle per weight file: F32 copy (exact activations) and the
     * shipped Q4_K/Q6_K file (activations rounded to Q8_K, as the engine) */
    const mu_dflash *ds[2] = {d32, dq4};
    double *ref[2][N_ANCHORS], worst[2], scale = 0;
    int agree[2];
    float *last[2];
    /* the oracle reads the target's embedding and LM head with the generic
     * row readers: its own load, in the GGUF layout (the session's copy may
     * be in the cpu backend's X16 layout) */
    mu_model *canon = mu_model_load(target_path, &err);
    CHECK_MSG(canon != NULL, "%s", err.msg);
    if (!canon) return;
    for (int w = 0; w < 2; w++) {
        oracle o = {ds[w]->gguf, &ds[w]->cfg, canon};
        for (int a = 0; a < N_ANCHORS; a++) {
            ref[w][a] = malloc((size_t)(R_ROWS * V) * sizeof(double));
            oracle_draft(&o, features, ANCHORS[a], toks[ANCHORS[a]], R_ROWS, ref[w][a]);
            for (int64_t i = 0; i < R_ROWS * V; i++) scale = fmax(scale, fabs(ref[w][a][i]));
        }
        last[w] = malloc((size_t)(R_ROWS * V) * sizeof(float));
        worst[w] = compare_with_oracle(ds[w], features, toks, ref[w], &agree[w], last[w]);
        for (int a = 0; a < N_ANCHORS; a++) free(ref[w][a]);
    }
    printf("draft forward vs double oracle (|logit| up to %.2f): F32 weights max |diff| %.3g, argmax %d/%d; "
           "shipped Q4_K/Q6_K weights max |diff| %.3g, argmax %d/%d\n",
           scale, worst[0], agree[0], N_ANCHORS * R_ROWS, worst[1], agree[1], N_ANCHORS * R_ROWS);
    CHECK(scale > 5);                    /* real logits, not zeros */
    /* F32: only f32-vs-double rounding (measured 4.9e-6). Q4_K: once one
     * Q8_K code rounds differently the codes downstream decorrelate, so the
     * gap is the activation quantization noise itself (measured 0.21). */
    CHECK_MSG(worst[0] < 1e-4 && worst[1] < 0.5, "draft forward differs from the oracle by %g (F32), %g (Q4_K)",
              worst[0], worst[1]);
    CHECK_MSG(agree[0] >= N_ANCHORS * R_ROWS - 1 && agree[1] >= N_ANCHORS * R_ROWS - 1, "argmax agrees %d, %d times",
              agree[0], agree[1]);
    /* one big append (prompt longer than sink + window) gives the same bits as growing it */
    mu_dflash_state *st = mu_dflash_state_new(d32, target->m, target->be);
    mu_dflash_append_context(st, features, ANCHORS[N_ANCHORS - 1]);
    int32_t prop[R_ROWS];
    float *l = malloc((size_t)(R_ROWS * V) * sizeof(float));
    mu_dflash_draft(st, NULL, 0, toks[ANCHORS[N_ANCHORS - 1]], R_ROWS, prop, l);
    CHECK_MSG(!memcmp(l, last[0], (size_t)(R_ROWS * V) * sizeof(float)), "one-shot context differs from incremental");
    mu_dflash_state_free(st);
    free(l); free(last[0]); free(last[1]); free(toks);
    muser_session_free(s);
    mu_dflash_free(d32);
    mu_dflash_free(dq4);
    mu_model_free(canon);
    remove(f32_path);
}

/* A backend that replays launches (forward_begin set) projects the context
 * in fixed row counts, padding rows stored into scratch slots
 * (dflash_forward.c project_context), and a draft projects a round's rows
 * in its own launches (can_merge). Padded, merged and both must give the
 * drafts and the durable state of the plain unpadded appends bit for bit:
 * the same cpu backend with no-op brackets, appends of 1..16 rows and one
 * of 40, through the sink edge and around the ring, a draft after each. */
static void no_bracket_begin(mu_backend *b, uint64_t key) { (void)b, (void)key; }
static void no_bracket_end(mu_backend *b, bool ok) { (void)b, (void)ok; }

static void test_padded_projection(void) {
    const int64_t V = target->m->cfg.n_vocab;
    mu_error err;
    mu_dflash *d = mu_dflash_load(draft_path, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    const int64_t NF = d->cfg.n_target_layers * d->cfg.n_embd, T = 420;
    int32_t *toks = random_tokens(T, 11);
    muser_session_params sp = {.n_ctx = 512};
    muser_session *s = muser_session_create(target, &sp, NULL);
    CHECK(mu_session_set_capture(s, d->cfg.target_layers, (int)d->cfg.n_target_layers, &err));
    CHECK(muser_session_feed(s, toks, T, NULL));
    int64_t rows;
    const float *captured = mu_session_captured(s, &rows);
    CHECK_EQ_INT(rows, T);
    /* the caller's slack rows (dflash.h): finite, here zeros */
    float *features = calloc((size_t)((T + MU_DFLASH_SLACK) * NF), sizeof(float));
    memcpy(features, captured, (size_t)(T * NF) * sizeof(float));
    mu_backend replaying = *target->be;
    replaying.forward_begin = no_bracket_begin;
    replaying.forward_end = no_bracket_end;
    /* 0: plain appends; 1: padded appends; 2: merged into the draft; 3: padded and merged */
    mu_dflash_state *st[4];
    for (int i = 0; i < 4; i++) {
        setenv("MUSER_DFLASH_MERGE", i < 2 ? "0" : "1", 1); /* read when a state is made */
        st[i] = mu_dflash_state_new(d, target->m, i & 1 ? &replaying : target->be);
    }
    unsetenv("MUSER_DFLASH_MERGE");
    float *lp = malloc((size_t)(7 * V) * sizeof(float)), *lq = malloc((size_t)(7 * V) * sizeof(float));
    int32_t pp[7], pq[7];
    int64_t have = 0, step = 0, drafts = 0, differ[4] = {0};
    while (have < T - 16) {
        const int64_t n = step == 0 ? 40 : 1 + (step * 7) % 16; /* 40 (a 64-row projection), then 1..16 */
        for (int i = 0; i < 2; i++) mu_dflash_append_context(st[i], features + have * NF, n);
        const int64_t at = have;
        have += n, step++;
        mu_dflash_draft(st[0], NULL, 0, toks[have], 7, pp, lp);
        for (int i = 1; i < 4; i++) {
            if (i < 2) mu_dflash_draft(st[i], NULL, 0, toks[have], 7, pq, lq);
            else mu_dflash_draft(st[i], features + at * NF, n, toks[have], 7, pq, lq);
            differ[i] += memcmp(lp, lq, (size_t)(7 * V) * sizeof(float)) != 0 || memcmp(pp, pq, sizeof pp) != 0;
        }
        drafts++;
    }
    static const char *what[4] = {"", "padded projection", "merged projection", "padded merged projection"};
    for (int i = 1; i < 4; i++)
        CHECK_MSG(differ[i] == 0, "%s: %lld of %lld drafts differ from plain appends", what[i], (long long)differ[i],
                  (long long)drafts);
    CHECK(have > 64 + 256); /* past the sink and around the ring */
    const uint64_t bytes = mu_dflash_state_bytes(d, have);
    float *ep = malloc(bytes), *eq = malloc(bytes);
    mu_dflash_state_export(st[0], ep);
    for (int i = 1; i < 4; i++) {
        mu_dflash_state_export(st[i], eq);
        CHECK_MSG(!memcmp(ep, eq, bytes), "%s: the held context differs", what[i]);
    }
    free(ep), free(eq), free(lp), free(lq), free(features), free(toks);
    for (int i = 0; i < 4; i++) mu_dflash_state_free(st[i]);
    muser_session_free(s);
    mu_dflash_free(d);
}

/* ------------------------------------------------------ speculation */

static int32_t *prompt_tokens(const char *text, int repeat, int64_t *n) {
    size_t len = strlen(text) * (size_t)repeat + 1;
    char *buf = malloc(len);
    buf[0] = 0;
    for (int i = 0; i < repeat; i++) strcat(buf, text);
    int32_t *ids = NULL;
    muser_error err;
    *n = muser_tokenize(target, buf, strlen(buf), true, true, &ids, &err);
    free(buf);
    return ids;
}

static void test_speculation(void) {
    static const struct { const char *text; int repeat; int64_t n; } prompts[] = {
        {"In the beginning God created the heaven and the earth.", 1, 64},
        {"<|header_start|>user<|header_end|>\n\nWhat is a hacker?<|eot|><|header_start|>assistant<|header_end|>\n\n", 1, 64},
        {"The quick brown fox jumps over the lazy dog, and the dog sleeps on. ", 24, 64}, /* > sink + window */
        {"And God said,", 1, 2},
        {"And God said,", 1, 1},
    };
    muser_error err;
    muser_draft *d = muser_draft_load(draft_path, target, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    muser_session_params sp = {.n_ctx = 1024};
    muser_session *s = muser_session_create(target, &sp, NULL);
    const int vls[3] = {3, 7, 15};
    bool saw_eog = false;
    for (int v = 0; v < 6; v++) { /* VL 3, 7, 15 as chains, then as token trees */
        const muser_spec_params spp = {.verify_len = vls[v % 3], .tree = v >= 3};
        int64_t steps = 0, tokens = 0;
        for (size_t p = 0; p < sizeof prompts / sizeof prompts[0]; p++) {
            int64_t n_prompt;
            int32_t *ids = prompt_tokens(prompts[p].text, prompts[p].repeat, &n_prompt);
            mu_gen_pair pair = {0};
            bool ok = mu_gen_greedy(s, NULL, NULL, ids, n_prompt, prompts[p].n, &pair, &err) &&
                      mu_gen_greedy(s, d, &spp, ids, n_prompt, prompts[p].n, &pair, &err);
            const int64_t ng = pair.n_plain, ns = pair.n_spec;
            CHECK_MSG(ok && ng > 0 && mu_gen_pair_diff(&pair) < 0,
                      "VL %d%s prompt %zu: speculative output (%lld tokens) != greedy (%lld): %s", vls[v % 3],
                      spp.tree ? " tree" : "", p, (long long)ns, (long long)ng, ok ? "" : err.msg);
            const muser_spec_stats *st = &pair.st;
            const int64_t verify_steps = st->rounds + st->plain_steps, step_tokens = st->round_tokens + st->plain_steps;
            CHECK(st->accepted <= st->drafted && st->accepted == step_tokens - verify_steps);
            CHECK(ns <= 1 + step_tokens && st->drafted <= (int64_t)vls[v % 3] * verify_steps);
            saw_eog |= ng > 0 && ng < prompts[p].n && muser_token_is_eog(target, pair.plain[ng - 1]);
            int64_t none;
            CHECK(mu_session_captured(s, &none) == NULL); /* capture is off again */
            steps += verify_steps;
            tokens += step_tokens;
            mu_gen_pair_free(&pair);
            free(ids);
        }
        double per_step = (double)tokens / (double)steps;
        printf("VL %2d%s: %lld verify steps, %.2f tokens per verify step\n", vls[v % 3], spp.tree ? " tree" : "",
               (long long)steps, per_step);
        CHECK_MSG(per_step > 1.5, "VL %d: only %.2f tokens per verify step", vls[v % 3], per_step);
    }
    CHECK_MSG(saw_eog, "no prompt stopped at an end-of-generation token");
    int32_t one = 5;
    mu_gen_pair pair = {0};
    CHECK(!mu_gen_greedy(s, d, &(muser_spec_params){.verify_len = 5}, &one, 1, 8, &pair, &err) &&
          strstr(err.msg, "3, 7 or 15"));
    target->be->trees = false; /* a backend whose attention takes no tree rows: trees refused up front */
    CHECK(!muser_spec_create(s, d, &(muser_spec_params){.tree = true}, &err) && strstr(err.msg, "does not take tree rows"));
    target->be->trees = true;
    mu_gen_pair_free(&pair);
    muser_session_free(s);
    muser_draft_free(d);
}


/* ------------------------------------------ speculation through the public API */

/* Plain decoding with a sampler: the reference stream. */
static int64_t plain_sampled(muser_session *s, muser_sampler *smp, const int32_t *prompt, int64_t n_prompt, int64_t n,
                             int32_t *out) {
    muser_error err;
    muser_session_reset(s);
    muser_sampler_reset(smp);
    if (!muser_sampler_accept_prompt(smp, prompt, (size_t)n_prompt, &err) ||
        !muser_session_feed(s, prompt, n_prompt, &err))
        return -1;
    int64_t k = 0;
    while (k < n) {
        int32_t t = muser_sampler_sample(smp, muser_session_logits(s), &err);
        if (t < 0) return muser_sampler_grammar_complete(smp) ? k : -1;
        if (!muser_sampler_accept(smp, t, &err)) return -1;
        out[k++] = t;
        if (muser_token_is_eog(target, t) || k == n) break;
        if (!muser_session_feed(s, &t, 1, &err)) return -1;
    }
    return k;
}

/* The same through muser_spec; every drawn row must be the plain row's bits. */
static int64_t spec_sampled(muser_spec *sp, muser_session *s, muser_sampler *smp, const int32_t *prompt,
                            int64_t n_prompt, int64_t n, int32_t *out) {
    muser_error err;
    muser_spec_reset(sp);
    muser_sampler_reset(smp);
    if (!muser_sampler_accept_prompt(smp, prompt, (size_t)n_prompt, &err) || !muser_spec_feed(sp, prompt, n_prompt, &err))
        return -1;
    int32_t t = muser_sampler_sample(smp, muser_session_logits(s), &err);
    if (t < 0) return muser_sampler_grammar_complete(smp) ? 0 : -1;
    if (!muser_sampler_accept(smp, t, &err)) return -1;
    int64_t k = 0;
    out[k++] = t;
    while (k < n && !muser_token_is_eog(target, out[k - 1])) {
        const float *rows[16];
        int max = n - k < 16 ? (int)(n - k) : 16;
        int got = muser_spec_next(sp, out[k - 1], smp, max, out + k, rows, &err);
        if (got < 0) {
            fprintf(stderr, "muser_spec_next: %s\n", err.msg);
            return -1;
        }
        if (got == 0) break;
        for (int i = 0; i < got; i++)
            if (!rows[i]) return -1;
        k += got;
    }
    return k;
}

static void test_spec_api(void) {
    muser_error err;
    muser_draft *d = muser_draft_load(draft_path, target, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    CHECK(!strcmp(muser_draft_name(d), "glimmer-tiny-dflash"));
    muser_session_params spp = {.n_ctx = 1024};
    muser_session *s = muser_session_create(target, &spp, NULL);
    static const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                                "\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}";
    static const struct { float temp; int seeds; bool schema; float penalty; } modes[] = {
        {0.0f, 1, false, 1.0f}, {0.8f, 6, false, 1.0f}, {1.2f, 3, false, 1.3f}, {0.8f, 3, true, 1.0f},
    };
    int64_t n_prompt;
    int32_t *prompt = prompt_tokens("And God said, Let there be light: and there was light. And God saw", 1, &n_prompt);
    int32_t plain[96], spec[96];
    int64_t rounds = 0, plain_steps = 0, closures = 0;
    for (int cfg = 0; cfg < 3; cfg++) { /* every step VL 3; gated VL 7; every step, a token tree of 15 */
        const int gate = cfg == 1;
        muser_spec_params p = {.verify_len = cfg == 0 ? 3 : cfg == 1 ? 7 : 15, .no_gate = !gate, .tree = cfg == 2};
        muser_spec *sp = muser_spec_create(s, d, &p, &err);
        CHECK_MSG(sp != NULL, "%s", err.msg);
        if (!sp) continue;
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
            for (int seed = 1; seed <= modes[m].seeds; seed++) {
                muser_sampling_params sa;
                muser_sampling_params_default(&sa);
                sa.seed = (uint32_t)seed;
                sa.temp = modes[m].temp;
                sa.penalty_repeat = modes[m].penalty;
                sa.json_schema = modes[m].schema ? schema : NULL;
                muser_sampler *smp = muser_sampler_create(target, &sa, &err);
                CHECK_MSG(smp != NULL, "%s", err.msg);
                if (!smp) continue;
                int64_t np = plain_sampled(s, smp, prompt, n_prompt, 96, plain);
                int64_t ns = spec_sampled(sp, s, smp, prompt, n_prompt, 96, spec);
                CHECK_MSG(np > 0 && ns == np && !memcmp(plain, spec, (size_t)np * sizeof(int32_t)),
                          "config %d temp %.1f seed %d schema %d: speculative %lld tokens != plain %lld", cfg,
                          (double)modes[m].temp, seed, modes[m].schema, (long long)ns, (long long)np);
                muser_sampler_free(smp);
            }
        muser_spec_stats st;
        muser_spec_get_stats(sp, &st);
        CHECK(st.accepted <= st.drafted && st.round_tokens >= st.rounds);
        if (!gate) CHECK(st.plain_steps == 0 || st.rounds > 0);
        rounds += st.rounds;
        plain_steps += gate ? st.plain_steps : 0;
        closures += gate ? st.gate_closures : 0;
        /* misuse is refused, the state is left alone */
        int32_t one = 5, out[4];
        CHECK(muser_spec_feed(sp, &one, 1, &err));
        CHECK(muser_session_feed(s, &one, 1, &err)); /* behind the assistant's back */
        CHECK(muser_spec_next(sp, one, NULL, 4, out, NULL, &err) < 0 && strstr(err.msg, "outside muser_spec"));
        muser_spec_reset(sp);
        CHECK(muser_spec_feed(sp, &one, 1, &err));
        CHECK(muser_spec_next(sp, 99999, NULL, 4, out, NULL, &err) < 0 && strstr(err.msg, "outside the vocabulary"));
        CHECK(muser_spec_next(sp, one, NULL, 0, out, NULL, &err) < 0 && strstr(err.msg, "max_out"));
        CHECK(muser_spec_next(sp, one, NULL, 1, out, NULL, &err) == 1); /* no room to draft: a plain step */
        muser_spec_free(sp);
        int64_t none;
        CHECK(mu_session_captured(s, &none) == NULL); /* capture is off again */
    }
    printf("spec API: %lld rounds; gated: %lld plain steps, %lld closures\n", (long long)rounds,
           (long long)plain_steps, (long long)closures);
    CHECK(rounds > 0);
    /* a prompt longer than the row buffer (2 x (sink + window)): skipped rows
     * must leave the same context as projecting every row */
    int64_t n_long;
    int32_t *lp = prompt_tokens("The quick brown fox jumps over the lazy dog, and the dog sleeps on. ", 44, &n_long);
    muser_spec_params ng = {.no_gate = true};
    muser_spec *sp = muser_spec_create(s, d, &ng, &err);
    CHECK_MSG(n_long > 700 && n_long < 1020 && sp && muser_spec_feed(sp, lp, n_long, &err), "%lld tokens: %s", (long long)n_long, err.msg);
    const int64_t V = target->m->cfg.n_vocab;
    float *la = malloc((size_t)(7 * V) * sizeof(float)), *lb = malloc((size_t)(7 * V) * sizeof(float));
    int32_t pa[7], pb[7];
    mu_spec_draft_now(sp, lp[n_long - 1], 7, pa, la);
    muser_spec_free(sp);
    mu_error e2;
    muser_session *s2 = muser_session_create(target, &spp, NULL);
    mu_dflash *dd = mu_dflash_load(draft_path, &e2);
    CHECK_MSG(dd != NULL, "%s", e2.msg);
    if (!dd) return;
    CHECK(mu_session_set_capture(s2, dd->cfg.target_layers, (int)dd->cfg.n_target_layers, &e2));
    CHECK(muser_session_feed(s2, lp, n_long, &err));
    int64_t n_rows;
    const float *feats = mu_session_captured(s2, &n_rows);
    mu_dflash_state *ref = mu_dflash_state_new(dd, target->m, target->be);
    mu_dflash_append_context(ref, feats, n_rows);
    mu_dflash_draft(ref, NULL, 0, lp[n_long - 1], 7, pb, lb);
    CHECK_MSG(n_rows == n_long && !memcmp(pa, pb, sizeof pa) && !memcmp(la, lb, (size_t)(7 * V) * sizeof(float)),
              "draft after skipped rows differs from the fully projected context");
    mu_dflash_state_free(ref);
    mu_dflash_free(dd);
    muser_session_free(s2);
    free(la);
    free(lb);
    free(lp);
    muser_spec_params bad = {.verify_len = 5};
    CHECK(muser_spec_create(s, d, &bad, &err) == NULL && strstr(err.msg, "3, 7 or 15"));
    free(prompt);
    muser_session_free(s);
    muser_draft_free(d);
}

/* A token tree fed in one forward and its kept path moved into place
 * (capture.h) leave the session exactly as feeding the path plainly does:
 * the path rows' logits, every byte of the K/V planes (the rows not kept
 * rolled back, the ring's unheld rows zero) and the next row's logits. */
static void test_tree_feed(void) {
    enum { T = MU_TREE_MAX };
    muser_error err;
    muser_session_params spp = {.n_ctx = 512};
    muser_session *a = muser_session_create(target, &spp, &err), *b = muser_session_create(target, &spp, &err);
    const int64_t V = target->m->cfg.n_vocab;
    int32_t prompt[150], tok[T], parent[T];
    uint64_t x = 12345;
    for (int i = 0; i < 150; i++) prompt[i] = (int32_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 8000;
    for (int i = 0; i < T; i++) {
        tok[i] = (int32_t)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 8000;
        parent[i] = i ? (int32_t)((x >> 40) % (uint64_t)i) : -1;
    }
    parent[5] = 3, parent[3] = 1, parent[1] = 0, parent[9] = 5, parent[14] = 9; /* the kept path: 0 1 3 5 9 14 */
    const int32_t path[6] = {0, 1, 3, 5, 9, 14};
    float *ta = malloc((size_t)(T * V) * sizeof(float)), *pb = malloc((size_t)(6 * V) * sizeof(float));
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    CHECK(muser_session_feed(a, prompt, 150, &err) && muser_session_feed(b, prompt, 150, &err));
    /* refused: a bad parent, a backend without tree rows, a path that skips back */
    int32_t bad[3] = {-1, 0, 2};
    CHECK(muser_session_checkpoint(a, &err));
    CHECK(!mu_session_feed_tree(a, tok, bad, 3, ta, ERR(&err)) && strstr(err.msg, "row 2's parent 2"));
    target->be->trees = false;
    CHECK(!mu_session_feed_tree(a, tok, parent, T, ta, ERR(&err)) && strstr(err.msg, "does not take tree rows"));
    target->be->trees = true;
    /* a verification on tree registers the backend lacks: refused before any row is fed */
    int32_t *pslot = malloc((2 * 16 + MU_TOKEN_REGS) * sizeof(int32_t));
    void (*tree_reg)(mu_backend *, const float *, int64_t, int64_t, const int32_t *, int, int32_t *) = target->be->tree_reg;
    target->be->tree_reg = NULL;
    CHECK(!mu_session_feed_picks(a, tok, 4, 0, true, pslot, ERR(&err)) && strstr(err.msg, "no tree registers") &&
          muser_session_pos(a) == 150);
    target->be->tree_reg = tree_reg;
    free(pslot);
    CHECK_MSG(mu_session_feed_tree(a, tok, parent, T, ta, ERR(&err)), "%s", err.msg);
    CHECK(muser_session_pos(a) == 150 + T);
    const int32_t back[3] = {0, 3, 1};
    CHECK(!mu_session_keep_path(a, 150, tok, back, 3, ERR(&err)) && strstr(err.msg, "ascend"));
    CHECK_MSG(mu_session_keep_path(a, 150, tok, path, 6, ERR(&err)), "%s", err.msg);
    muser_session_commit(a);
    CHECK(muser_session_pos(a) == 156);
    int32_t ptoks[6];
    for (int j = 0; j < 6; j++) ptoks[j] = tok[path[j]];
    CHECK(muser_session_feed_all(b, ptoks, 6, pb, &err));
    for (int j = 0; j < 6; j++)
        CHECK_MSG(!memcmp(ta + (int64_t)path[j] * V, pb + (int64_t)j * V, (size_t)V * sizeof(float)),
                  "tree row %d: logits differ from the plain row at depth %d", path[j], j);
    const mu_kv_cache *ka = mu_session_kv(a), *kb = mu_session_kv(b);
    for (int il = 0; il < ka->n_layers; il++) {
        const mu_kv_layer *p = &ka->layers[il], *q = &kb->layers[il];
        const size_t bytes = (size_t)(p->n_head * p->cap * p->head_dim) * sizeof(uint16_t);
        CHECK_MSG(p->cap == q->cap && p->origin_logical == q->origin_logical && p->origin_physical == q->origin_physical &&
                      p->len == q->len && !memcmp(p->k, q->k, bytes) && !memcmp(p->v, q->v, bytes),
                  "layer %d (%s): K/V planes after the kept path differ from plain feeding", il, p->swa ? "ring" : "plane");
    }
    int64_t na = 0, nb = 0;
    const int32_t *ha = mu_session_hist(a, &na), *hb = mu_session_hist(b, &nb);
    CHECK(na == nb && na == 156 && !memcmp(ha, hb, (size_t)na * sizeof *ha));
    const int32_t next = 77;
    CHECK(muser_session_feed_all(a, &next, 1, la, &err) && muser_session_feed_all(b, &next, 1, lb, &err));
    CHECK_MSG(!memcmp(la, lb, (size_t)V * sizeof(float)), "the row after the kept path differs");
    muser_session_free(a);
    muser_session_free(b);
    free(ta); free(pb); free(la); free(lb);
}

/* Greedy rounds whose rows stay on the backend (speculate.c
 * spec_round_picks) against the same rounds through the host
 * (MUSER_SPEC_PICKS=0): the same tokens every round, the same statistics,
 * the same logits row left in the session, at verify lengths 3, 7 and 15;
 * with no sampler, and with an argmax sampler that bans end of generation
 * (ignore_eos: a banned pick sends the round to the host); chains, and
 * token trees built on the backend (tree_reg: its tree registers feed the
 * verification's positions and attention) against trees built and drawn
 * on the host, with every byte of the caches and the token record equal
 * at the end. */
static void test_spec_picks(void) {
    muser_error err;
    muser_draft *d = muser_draft_load(draft_path, target, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    if (!d) return;
    const int64_t V = target->m->cfg.n_vocab;
    muser_session_params spp = {.n_ctx = 512};
    muser_session *s[2] = {muser_session_create(target, &spp, NULL), muser_session_create(target, &spp, NULL)};
    static const char *texts[] = {"And it came to pass, when the king",
                                  "<|header_start|>user<|header_end|>\n\nWho are you?<|eot|>"
                                  "<|header_start|>assistant<|header_end|>\n\n"};
    int64_t picked = 0, host_rounds = 0, picked_trees = 0, sampled_on_backend = 0, predrafted = 0;
    for (int vi = 0; vi < 5; vi++) /* chains at VL 3, 7, 15; trees at 7, 15 */
        for (int ti = 0; ti < 2; ti++)
            for (int with_smp = 0; with_smp < 3; with_smp++) { /* none, greedy, seeded temperature 0.8 */
                const bool tree = vi >= 3;
                muser_spec_params p = {.verify_len = vi == 0 ? 3 : vi % 2 ? 7 : 15, .no_gate = true, .tree = tree};
                muser_spec *sp[2];
                muser_sampler *smp[2] = {NULL, NULL};
                /* the registers' rounds with the fed rows projected behind the verification
                 * (MUSER_SPEC_FED_PROJ=1) in every other case, the kept rows projected apart in the rest */
                const bool fed = (vi + ti + with_smp) % 2 == 0;
                for (int k = 0; k < 2; k++) {
                    if (k) setenv("MUSER_SPEC_PICKS", "0", 1);
                    if (!k && fed) setenv("MUSER_SPEC_FED_PROJ", "1", 1);
                    sp[k] = muser_spec_create(s[k], d, &p, &err);
                    unsetenv("MUSER_SPEC_PICKS");
                    unsetenv("MUSER_SPEC_FED_PROJ");
                    if (with_smp) {
                        muser_sampling_params sa;
                        muser_sampling_params_default(&sa);
                        sa.temp = with_smp == 2 ? 0.8f : 0;
                        sa.seed = 1234 + (uint32_t)(vi * 2 + ti);
                        sa.ignore_eos = true;
                        smp[k] = muser_sampler_create(target, &sa, &err);
                    }
                }
                CHECK_MSG(sp[0] && sp[1] && (!with_smp || (smp[0] && smp[1])), "%s", err.msg);
                if (!sp[0] || !sp[1]) return;
                int64_t n_prompt;
                int32_t *prompt = prompt_tokens(texts[ti], 1, &n_prompt);
                int32_t pend[2];
                for (int k = 0; k < 2; k++) {
                    CHECK_MSG(muser_spec_feed(sp[k], prompt, n_prompt, &err), "%s", err.msg);
                    pend[k] = mu_sample_argmax(muser_session_logits(s[k]), (size_t)V, NULL, 0);
                    if (smp[k]) CHECK(muser_sampler_accept(smp[k], pend[k], &err));
                }
                int total = 0;
                for (int r = 0; r < 40 && total < 160; r++) {
                    int32_t out[2][16];
                    int n[2];
                    for (int k = 0; k < 2; k++) n[k] = muser_spec_next(sp[k], pend[k], smp[k], 16, out[k], NULL, &err);
                    CHECK_MSG(n[0] > 0 && n[0] == n[1] && !memcmp(out[0], out[1], (size_t)n[0] * sizeof(int32_t)) &&
                                  muser_session_pos(s[0]) == muser_session_pos(s[1]) &&
                                  !memcmp(muser_session_logits(s[0]), muser_session_logits(s[1]), (size_t)V * sizeof(float)),
                              "VL %d text %d sampler %d round %d: %d / %d tokens (%s)", p.verify_len, ti, with_smp, r, n[0],
                              n[1], err.msg);
                    if (n[0] <= 0 || n[0] != n[1]) break;
                    total += n[0];
                    pend[0] = out[0][n[0] - 1];
                    pend[1] = out[1][n[1] - 1];
                    if (!with_smp && muser_token_is_eog(target, pend[0])) break;
                }
                muser_spec_stats st[2];
                for (int k = 0; k < 2; k++) muser_spec_get_stats(sp[k], &st[k]);
                CHECK_MSG(st[0].rounds == st[1].rounds && st[0].accepted == st[1].accepted &&
                              st[0].round_tokens == st[1].round_tokens && st[1].backend_rounds == 0 &&
                              st[0].backend_rounds == st[0].rounds,
                          "VL %d text %d: rounds %lld / %lld, accepted %lld / %lld", p.verify_len, ti,
                          (long long)st[0].rounds, (long long)st[1].rounds, (long long)st[0].accepted,
                          (long long)st[1].accepted);
                const mu_kv_cache *ka = mu_session_kv(s[0]), *kb = mu_session_kv(s[1]);
                for (int il = 0; il < ka->n_layers; il++) {
                    const mu_kv_layer *la = &ka->layers[il], *lb = &kb->layers[il];
                    const size_t bytes = (size_t)(la->n_head * la->cap * la->head_dim) * sizeof(uint16_t);
                    CHECK_MSG(la->len == lb->len && !memcmp(la->k, lb->k, bytes) && !memcmp(la->v, lb->v, bytes),
                              "VL %d%s text %d: layer %d's K/V planes differ", p.verify_len, tree ? " tree" : "", ti, il);
                }
                int64_t na = 0, nb = 0;
                const int32_t *ha = mu_session_hist(s[0], &na), *hb = mu_session_hist(s[1], &nb);
                CHECK(na == nb && !memcmp(ha, hb, (size_t)na * sizeof *ha));
                /* the assistant's context: projected right after each verification on the registers' rounds
                 * (mu_dflash_project_fed / keep_fed), from the buffered rows on the host's; every byte alike
                 * once the buffered rows are projected too */
                unsigned char *ctx[2] = {NULL, NULL};
                uint64_t ctx_len[2] = {0, 0};
                int64_t ctx_rows[2] = {0, 0};
                for (int k = 0; k < 2; k++) {
                    int32_t props[16];
                    mu_error xe = {{0}};
                    mu_spec_draft_now(sp[k], pend[k], 3, props, NULL);
                    CHECK_MSG(mu_spec_export(sp[k], &ctx_rows[k], &ctx[k], &ctx_len[k], &xe), "%s", xe.msg);
                }
                CHECK_MSG(ctx_rows[0] == ctx_rows[1] && ctx_len[0] == ctx_len[1] && ctx[0] && ctx[1] &&
                              !memcmp(ctx[0], ctx[1], (size_t)ctx_len[0]),
                          "VL %d%s text %d sampler %d: the assistant's context differs (%lld / %lld rows)",
                          p.verify_len, tree ? " tree" : "", ti, with_smp, (long long)ctx_rows[0],
                          (long long)ctx_rows[1]);
                free(ctx[0]), free(ctx[1]);
                picked += st[0].picked_rounds;
                predrafted += st[0].predrafted;
                if (with_smp == 2) sampled_on_backend += st[0].backend_rounds - st[0].picked_rounds;
                if (tree) picked_trees += st[0].picked_rounds;
                host_rounds += st[0].rounds - st[0].picked_rounds;
                free(prompt);
                for (int k = 0; k < 2; k++) {
                    muser_spec_free(sp[k]);
                    muser_sampler_free(smp[k]);
                }
            }
    printf("rounds on the backend: %lld picked there (%lld of them trees), %lld drawn on the host (%lld sampled); "
           "%lld on the draft the round before enqueued\n", (long long)picked, (long long)picked_trees,
           (long long)host_rounds, (long long)sampled_on_backend, (long long)predrafted);
    CHECK(picked > 0 && picked_trees > 0 && sampled_on_backend > 0 && predrafted > 0);
    muser_session_free(s[0]);
    muser_session_free(s[1]);
    muser_draft_free(d);
}

/* Two sessions of one engine speculating from two threads at once (token
 * trees on the backend's registers, which both sessions' rounds share):
 * each must give the tokens it gives alone. A round holds the engine's
 * lock from its draft to its verification (speculate.c spec_next). */
typedef struct spec_job {
    muser_session *s;
    const muser_draft *d;
    const char *text;
    int32_t out[128];
    int n;
    bool ok;
} spec_job;

static void *spec_job_run(void *arg) {
    spec_job *j = arg;
    muser_error err;
    muser_spec_params p = {.verify_len = 15, .no_gate = true, .tree = true};
    muser_spec *sp = muser_spec_create(j->s, j->d, &p, &err);
    int64_t n_prompt;
    int32_t *prompt = prompt_tokens(j->text, 1, &n_prompt);
    j->n = 0;
    j->ok = sp && muser_spec_feed(sp, prompt, n_prompt, &err);
    int32_t pend = j->ok ? mu_sample_argmax(muser_session_logits(j->s), (size_t)target->m->cfg.n_vocab, NULL, 0) : 0;
    while (j->ok && j->n + 16 <= 128) {
        const int n = muser_spec_next(sp, pend, NULL, 16, j->out + j->n, NULL, &err);
        j->ok = n > 0;
        if (n <= 0) break;
        j->n += n;
        pend = j->out[j->n - 1];
        if (muser_token_is_eog(target, pend)) break;
    }
    muser_spec_reset(sp);
    muser_spec_free(sp);
    free(prompt);
    return NULL;
}

static void test_spec_threads(void) {
    muser_error err;
    muser_draft *d = muser_draft_load(draft_path, target, &err);
    muser_engine *e = muser_engine_create(target, &(muser_engine_params){.n_seq_max = 2, .n_ctx = 512}, &err);
    CHECK_MSG(d && e, "%s", err.msg);
    if (!d || !e) return;
    static const char *texts[2] = {"And it came to pass, when the king", "The history of the"};
    spec_job alone[2], both[2];
    for (int i = 0; i < 2; i++) { /* alone: one after the other */
        alone[i] = (spec_job){.s = muser_engine_session(e, &err), .d = d, .text = texts[i]};
        spec_job_run(&alone[i]);
        muser_session_free(alone[i].s);
    }
    for (int round = 0; round < 3; round++) {
        pthread_t th[2];
        for (int i = 0; i < 2; i++) {
            both[i] = (spec_job){.s = muser_engine_session(e, &err), .d = d, .text = texts[i]};
            CHECK(pthread_create(&th[i], NULL, spec_job_run, &both[i]) == 0);
        }
        for (int i = 0; i < 2; i++) {
            pthread_join(th[i], NULL);
            CHECK_MSG(alone[i].ok && both[i].ok && alone[i].n > 0 && both[i].n == alone[i].n &&
                          !memcmp(both[i].out, alone[i].out, (size_t)alone[i].n * sizeof(int32_t)),
                      "thread %d (run %d): %d tokens, %d alone, or they differ", i, round, both[i].n, alone[i].n);
            muser_session_free(both[i].s);
        }
    }
    muser_engine_free(e);
    muser_draft_free(d);
}

int main(void) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    snprintf(target_path, sizeof target_path, "%s/models/glimmer-tiny-q4_k_xl.gguf", src ? src : ".");
    snprintf(draft_path, sizeof draft_path, "%s/models/glimmer-tiny-dflash-q4_k_xl.gguf", src ? src : ".");
    muser_error err;
    target = muser_model_load(target_path, NULL, &err);
    if (!target) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t0 = mu_now();
    test_loader();
    test_capture();
    test_forward_oracle();
    test_padded_projection();
    test_tree_feed();
    double t1 = mu_now();
    test_speculation();
    test_spec_api();
    test_spec_picks();
    test_spec_threads();
    printf("checks %.1f s, speculation %.1f s\n", t1 - t0, mu_now() - t1);
    muser_model_free(target);
    fx_cleanup();
    TEST_MAIN_END();
}
