/* Fail-closed loading: each defect of an otherwise valid muse-glimmer file is
 * refused with a message naming the file and the key or tensor at fault. */
#include "testutil.h"
#include "model_fixture.h"
#include "gguf/gguf.h"
#include "model/model.h"

typedef struct edit {
    const char *name;
    const char *drop_key;       /* key to omit */
    const char *drop_tensor;    /* tensor to omit */
    void (*set_keys)(gguf_writer *w);
    const char *mutate_tensor;  /* tensor whose data is copied and mutated */
    void (*mutate)(uint8_t *data, uint64_t n);
    const char *reshape_tensor; /* tensor written with ne[1] + 256 rows of zeros */
    bool add_extra;             /* add an unknown tensor */
    const char *expect;         /* substring of the error */
} edit;

static void set_arch_llama(gguf_writer *w) { gguf_writer_set_str(w, "general.architecture", "llama"); }
static void set_prec_nvfp4(gguf_writer *w) { gguf_writer_set_str(w, "muser.weight_precision", "nvfp4"); }
static void set_prec_unknown(gguf_writer *w) { gguf_writer_set_str(w, "muser.weight_precision", "q3_k_tiny"); }
static void set_kv_heads_3(gguf_writer *w) { gguf_writer_set_u32(w, "muse-glimmer.attention.head_count_kv", 3); }
static void set_window_0(gguf_writer *w) { gguf_writer_set_u32(w, "muse-glimmer.attention.sliding_window", 0); }
static void set_rope_yarn(gguf_writer *w) { gguf_writer_set_str(w, "muse-glimmer.rope.scaling.type", "yarn"); }
static void set_pattern_short(gguf_writer *w) {
    const uint8_t pat[3] = {1, 1, 1};
    gguf_writer_set_arr(w, "muse-glimmer.attention.sliding_window_pattern", GGUF_VT_BOOL, pat, 3);
}
static void set_pattern_str(gguf_writer *w) {
    gguf_writer_set_str(w, "muse-glimmer.attention.sliding_window_pattern", "SSSF");
}
static void set_tokens_short(gguf_writer *w) {
    const char *toks[3] = {"a", "b", "c"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
}
static void set_eps_string(gguf_writer *w) {
    gguf_writer_set_str(w, "muse-glimmer.attention.layer_norm_rms_epsilon", "1e-5");
}
static void bump_second_float(uint8_t *d, uint64_t n) {
    (void)n;
    float f;
    memcpy(&f, d + 4, 4);
    f += 0.5f;
    memcpy(d + 4, &f, 4);
}
static void nan_scale_byte(uint8_t *d, uint64_t n) { d[n / 2] = 0x7F; }
static void zero_scale2(uint8_t *d, uint64_t n) { memset(d, 0, n); }

static const edit KQ_EDITS[] = {
    {.name = "no swa pattern", .drop_key = "muse-glimmer.attention.sliding_window_pattern", .expect = "sliding_window_pattern is missing"},
    {.name = "short swa pattern", .set_keys = set_pattern_short, .expect = "3 entries for 4 layers"},
    {.name = "string swa pattern", .set_keys = set_pattern_str, .expect = "sliding_window_pattern has type"},
    {.name = "no eps", .drop_key = "muse-glimmer.attention.layer_norm_rms_epsilon", .expect = "layer_norm_rms_epsilon is missing"},
    {.name = "eps as string", .set_keys = set_eps_string, .expect = "layer_norm_rms_epsilon"},
    {.name = "no logit scale", .drop_key = "muse-glimmer.logit_scale", .expect = "logit_scale is missing"},
    {.name = "no block count", .drop_key = "muse-glimmer.block_count", .expect = "block_count is missing"},
    {.name = "llama arch", .set_keys = set_arch_llama, .expect = "architecture is 'llama'"},
    {.name = "nvfp4 key without tensors", .set_keys = set_prec_nvfp4, .expect = "holds no NVFP4_E2M1"},
    {.name = "unknown precision", .set_keys = set_prec_unknown, .expect = "'q3_k_tiny' is unknown"},
    {.name = "kv heads", .set_keys = set_kv_heads_3, .expect = "must divide"},
    {.name = "window 0", .set_keys = set_window_0, .expect = "sliding_window is missing or 0"},
    {.name = "yarn", .set_keys = set_rope_yarn, .expect = "'yarn' is not supported"},
    {.name = "tokens", .set_keys = set_tokens_short, .expect = "tokenizer.ggml.tokens has 3 tokens"},
    {.name = "no output", .drop_tensor = "output.weight", .expect = "output.weight is missing"},
    {.name = "no q norm", .drop_tensor = "blk.2.attn_q_norm.weight", .expect = "blk.2.attn_q_norm.weight is missing"},
    {.name = "no gate", .drop_tensor = "blk.1.attn_gate.weight", .expect = "blk.1.attn_gate.weight is missing"},
    {.name = "varying q norm", .mutate_tensor = "blk.0.attn_q_norm.weight", .mutate = bump_second_float, .expect = "non-constant QK-norm"},
    {.name = "varying k norm", .mutate_tensor = "blk.3.attn_k_norm.weight", .mutate = bump_second_float, .expect = "blk.3.attn_k_norm.weight is not a constant"},
    {.name = "wrong shape", .reshape_tensor = "blk.1.attn_q.weight", .expect = "blk.1.attn_q.weight has shape"},
    {.name = "extra tensor", .add_extra = true, .expect = "unexpected tensor extra.weight"},
};

static const edit NV_EDITS[] = {
    {.name = "nvfp4 without key", .drop_key = "muser.weight_precision", .expect = "must be 'nvfp4'"},
    {.name = "nan scale", .mutate_tensor = "blk.0.attn_k.weight.nvfp4_scale", .mutate = nan_scale_byte, .expect = "NaN E4M3FN scale"},
    {.name = "no scale2", .drop_tensor = "blk.1.ffn_up.weight.nvfp4_scale2", .expect = "blk.1.ffn_up.weight.nvfp4_scale2 is missing"},
    {.name = "zero scale2", .mutate_tensor = "blk.2.attn_v.weight.nvfp4_scale2", .mutate = zero_scale2, .expect = "must be finite and > 0"},
    {.name = "no scale", .drop_tensor = "blk.0.ffn_down.weight.nvfp4_scale", .expect = "blk.0.ffn_down.weight.nvfp4_scale is missing"},
};

static bool rewrite(const char *src, const char *dst, const edit *e) {
    mu_error err;
    gguf_file *f = gguf_open(src, &err);
    if (!f) { fprintf(stderr, "%s\n", err.msg); return false; }
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!e->drop_key || strcmp(f->kv[i].key, e->drop_key)) gguf_writer_copy_kv(w, &f->kv[i]);
    if (e->set_keys) e->set_keys(w);
    uint8_t *owned[4] = {0};
    int n_owned = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (e->drop_tensor && !strcmp(t->name, e->drop_tensor)) continue;
        const void *data = t->data;
        uint64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (e->mutate_tensor && !strcmp(t->name, e->mutate_tensor)) {
            uint8_t *d = malloc(t->nbytes);
            memcpy(d, t->data, t->nbytes);
            e->mutate(d, t->nbytes);
            data = owned[n_owned++] = d;
        }
        if (e->reshape_tensor && !strcmp(t->name, e->reshape_tensor)) {
            ne[1] += 256;
            uint64_t bytes = t->nbytes / t->ne[1] * ne[1];
            uint8_t *d = calloc(1, bytes);
            data = owned[n_owned++] = d;
        }
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, data);
    }
    float extra[256] = {1};
    uint64_t extra_ne[1] = {256};
    if (e->add_extra) gguf_writer_add_tensor(w, "extra.weight", 0, 1, extra_ne, extra);
    bool ok = gguf_writer_write_file(w, dst, &err);
    if (!ok) fprintf(stderr, "write: %s\n", err.msg);
    gguf_writer_free(w);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    gguf_close(f);
    return ok;
}

static void run_edits(const char *src, const edit *edits, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char dst[300];
        snprintf(dst, sizeof dst, "%s/edit-%zu.gguf", fx_tmpdir(), i);
        if (!rewrite(src, dst, &edits[i])) { CHECK_MSG(false, "rewrite %s", edits[i].name); continue; }
        mu_error err = {{0}};
        mu_model *m = mu_model_load(dst, &err);
        CHECK_MSG(m == NULL, "%s: accepted a defective file", edits[i].name);
        mu_model_free(m);
        CHECK_MSG(strstr(err.msg, edits[i].expect) != NULL, "%s: message '%s' lacks '%s'", edits[i].name, err.msg,
                  edits[i].expect);
        CHECK_MSG(strstr(err.msg, dst) != NULL, "%s: message '%s' does not name the file", edits[i].name, err.msg);
        remove(dst);
    }
}

int main(void) {
    /* the unedited rewrite must load: the test can tell good from bad */
    const char *kq = fx_synth("q4_k_xl", 5, 64), *nv = fx_synth("nvfp4", 5, 64);
    const edit identity = {.name = "identity"};
    char same[300];
    snprintf(same, sizeof same, "%s/identity.gguf", fx_tmpdir());
    CHECK(rewrite(kq, same, &identity));
    mu_error err;
    mu_model *m = mu_model_load(same, &err);
    CHECK_MSG(m != NULL, "identity rewrite refused: %s", m ? "" : err.msg);
    mu_model_free(m);
    CHECK(rewrite(nv, same, &identity));
    m = mu_model_load(same, &err);
    CHECK_MSG(m != NULL, "nvfp4 identity rewrite refused: %s", m ? "" : err.msg);
    if (m) CHECK(!strcmp(m->lane, "nvfp4"));
    mu_model_free(m);
    run_edits(kq, KQ_EDITS, sizeof KQ_EDITS / sizeof KQ_EDITS[0]);
    run_edits(nv, NV_EDITS, sizeof NV_EDITS / sizeof NV_EDITS[0]);
    fx_cleanup();
    TEST_MAIN_END();
}
