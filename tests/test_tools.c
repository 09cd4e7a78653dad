/* synth and quantize: every key, tensor name, type and shape of the files
 * they write; determinism across seeds and thread counts; quantize accuracy
 * against the F32 source; fail-closed errors. Tiny preset only. */
#include "testutil.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "tools/tools.h"
#include "tools/tools_internal.h"
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

/* Tiny preset geometry, restated here so the test checks synth against an
 * independent statement of the format. */
enum { L = 4, E = 256, H = 4, HKV = 2, HD = 64, FF = 512, V = 512, CTX = 1024, WIN = 64 };

static char g_dir[256];

static char *path_in_dir(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 512, "%s/%s", g_dir, name);
    return b;
}

static bool synth_file(const char *path, const char *type, uint64_t seed, int threads, mu_error *err) {
    mu_synth_opts o;
    mu_synth_opts_init(&o);
    o.type = type;
    o.seed = seed;
    o.out_path = path;
    o.n_threads = threads;
    return mu_synth(&o, err);
}

/* ---------------- expectations ---------------- */

static bool is_nvfp4_lane(const char *type) {
    return !strcmp(type, "nvfp4") || !strcmp(type, "nvfp4_ggml");
}

/* The type rule of the brief, written independently of target.c. */
static uint32_t expected_type(const char *type, const char *name) {
    bool embd_or_head = !strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight");
    if (!strcmp(type, "nvfp4")) return embd_or_head ? MU_TYPE_F16 : MU_TYPE_NVFP4_E2M1;
    if (!strcmp(type, "nvfp4_ggml")) return embd_or_head ? MU_TYPE_F16 : MU_TYPE_NVFP4;
    if (!strcmp(type, "q4_k_xl")) {
        int il = -1;
        if (!strcmp(name, "output.weight")) return MU_TYPE_Q5_K;
        if (strstr(name, ".attn_v.weight")) return MU_TYPE_Q6_K;
        if (strstr(name, ".ffn_down.weight") && sscanf(name, "blk.%d.", &il) == 1)
            return il % 2 ? MU_TYPE_Q6_K : MU_TYPE_Q4_K;
        return MU_TYPE_Q4_K;
    }
    return (uint32_t)mu_type_from_name(type);
}

typedef struct exp_tensor { char name[96]; uint64_t ne0, ne1; bool vector; } exp_tensor;

static int expected_tensors(exp_tensor *out) {
    int n = 0;
    struct { const char *name; uint64_t n_in, n_out; } mats[] = {
        {"attn_q", E, H * HD}, {"attn_k", E, HKV * HD}, {"attn_v", E, HKV * HD},
        {"attn_gate", E, H * HD}, {"attn_output", H * HD, E}, {"ffn_gate", E, FF},
        {"ffn_up", E, FF}, {"ffn_down", FF, E},
    };
    struct { const char *name; uint64_t n; } vecs[] = {
        {"attn_norm", E}, {"post_attention_norm", E}, {"ffn_norm", E}, {"post_ffw_norm", E},
        {"attn_q_norm", HD}, {"attn_k_norm", HD},
    };
    out[n++] = (exp_tensor){"token_embd.weight", E, V, false};
    out[n++] = (exp_tensor){"output_norm.weight", E, 1, true};
    out[n++] = (exp_tensor){"output.weight", E, V, false};
    for (int il = 0; il < L; il++) {
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            exp_tensor *t = &out[n++];
            snprintf(t->name, sizeof t->name, "blk.%d.%s.weight", il, mats[i].name);
            t->ne0 = mats[i].n_in;
            t->ne1 = mats[i].n_out;
            t->vector = false;
        }
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
            exp_tensor *t = &out[n++];
            snprintf(t->name, sizeof t->name, "blk.%d.%s.weight", il, vecs[i].name);
            t->ne0 = vecs[i].n;
            t->ne1 = 1;
            t->vector = true;
        }
    }
    return n;
}

/* ---------------- helpers over an open file ---------------- */

static const gguf_tensor *companion(const gguf_file *f, const char *name, const char *suffix) {
    char buf[256];
    size_t a = strlen(name), b = strlen(suffix);
    if (a + b >= sizeof buf) return NULL;
    memcpy(buf, name, a);
    memcpy(buf + a, suffix, b + 1);
    return gguf_find_tensor(f, buf);
}

static float scalar_of(const gguf_tensor *t) {
    float v = NAN;
    if (t && t->type == MU_TYPE_F32 && t->n_elems == 1) memcpy(&v, t->data, 4);
    return v;
}

/* Dequantize row r of tensor t (with its NVFP4 / .scale companions). */
static void dequant_row(const gguf_file *f, const gguf_tensor *t, uint64_t r, float *dst) {
    mu_weight w = {.name = t->name, .type = t->type, .data = t->data, .scale = 1.0f,
                   .n_in = (int64_t)t->ne[0], .n_out = (int64_t)t->ne[1]};
    mu_type_row_bytes(t->type, t->ne[0], &w.row_bytes);
    if (t->type == MU_TYPE_NVFP4_E2M1) {
        w.nvfp4_scales = companion(f, t->name, ".nvfp4_scale")->data;
        w.scale = scalar_of(companion(f, t->name, ".nvfp4_scale2"));
    } else if (companion(f, t->name, ".scale")) {
        w.scale = scalar_of(companion(f, t->name, ".scale"));
        w.has_scale = true;
    }
    mu_weight_dequant_row(&w, (int64_t)r, dst);
}

/* Standard deviation of the whole dequantized tensor. */
static double tensor_std(const gguf_file *f, const gguf_tensor *t) {
    float *row = malloc(t->ne[0] * sizeof *row);
    double s = 0, s2 = 0, n = 0;
    for (uint64_t r = 0; r < t->ne[1]; r++) {
        dequant_row(f, t, r, row);
        for (uint64_t i = 0; i < t->ne[0]; i++) { s += row[i]; s2 += (double)row[i] * row[i]; n++; }
    }
    free(row);
    double mean = s / n;
    return sqrt(s2 / n - mean * mean);
}

static bool str_is(const gguf_file *f, const char *key, const char *want) {
    char *s = NULL;
    mu_error err;
    bool ok = gguf_get_str(f, key, &s, &err) == 1 && !strcmp(s, want);
    free(s);
    return ok;
}

static uint32_t u32_of(const gguf_file *f, const char *key) {
    uint32_t v = 0xFFFFFFFFu;
    mu_error err;
    if (gguf_get_u32(f, key, &v, &err) != 1) return 0xFFFFFFFFu;
    return v;
}

static float f32_of(const gguf_file *f, const char *key) {
    float v = NAN;
    mu_error err;
    if (gguf_get_f32(f, key, &v, &err) != 1) return NAN;
    return v;
}

static bool flag_of(const gguf_file *f, const char *key, bool *v) {
    mu_error err;
    return gguf_get_bool(f, key, v, &err) == 1;
}

/* The string element i of an array key, compared to want. */
static bool arr_str_is(const gguf_value *a, uint64_t i, const char *want) {
    if (!a || a->type != GGUF_VT_ARRAY || a->v.arr.elem_type != GGUF_VT_STRING || i >= a->v.arr.n)
        return false;
    const gguf_str *s = &a->v.arr.strs[i];
    return s->len == strlen(want) && !memcmp(s->ptr, want, s->len);
}

static int64_t token_id(const gguf_value *tokens, const char *s) {
    for (uint64_t i = 0; i < tokens->v.arr.n; i++)
        if (arr_str_is(tokens, i, s)) return (int64_t)i;
    return -1;
}

/* ---------------- checks ---------------- */

static void check_arch_keys(const gguf_file *f) {
    CHECK(str_is(f, "general.architecture", "muse-glimmer"));
    CHECK(str_is(f, "general.name", "muse-glimmer-synth-tiny"));
    CHECK_EQ_INT(u32_of(f, "general.alignment"), 32);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.context_length"), CTX);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.embedding_length"), E);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.block_count"), L);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.feed_forward_length"), FF);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.attention.head_count"), H);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.attention.head_count_kv"), HKV);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.attention.key_length"), HD);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.attention.value_length"), HD);
    CHECK_EQ_INT(u32_of(f, "muse-glimmer.attention.sliding_window"), WIN);
    CHECK_BITS_F32(f32_of(f, "muse-glimmer.attention.layer_norm_rms_epsilon"), 1e-5f);
    CHECK_BITS_F32(f32_of(f, "muse-glimmer.rope.freq_base"), 10000.0f);
    CHECK_BITS_F32(f32_of(f, "muse-glimmer.rope.freq_base_swa"), 500000.0f);
    CHECK_BITS_F32(f32_of(f, "muse-glimmer.logit_scale"), 0.196116f);
    CHECK_BITS_F32(f32_of(f, "muse-glimmer.final_logit_softcapping"), 20.0f);
    const gguf_value *pat = gguf_get(f, "muse-glimmer.attention.sliding_window_pattern");
    CHECK(pat && pat->type == GGUF_VT_ARRAY && pat->v.arr.elem_type == GGUF_VT_BOOL && pat->v.arr.n == L);
    if (pat && pat->type == GGUF_VT_ARRAY && pat->v.arr.n == L)
        for (int il = 0; il < L; il++) CHECK_EQ_INT(pat->v.arr.raw[il], il % 4 != 3);
    uint64_t seed = 0;
    mu_error err;
    CHECK(gguf_get_u64(f, "muser.synth.seed", &seed, &err) == 1 && seed == 42);
    CHECK(str_is(f, "muser.synth.preset", "tiny"));
}

static void check_tokenizer(const gguf_file *f) {
    CHECK(str_is(f, "tokenizer.ggml.model", "gpt2"));
    CHECK(str_is(f, "tokenizer.ggml.pre", "llama4"));
    const gguf_value *tok = gguf_get(f, "tokenizer.ggml.tokens");
    const gguf_value *typ = gguf_get(f, "tokenizer.ggml.token_type");
    const gguf_value *mer = gguf_get(f, "tokenizer.ggml.merges");
    CHECK(tok && tok->type == GGUF_VT_ARRAY && tok->v.arr.elem_type == GGUF_VT_STRING && tok->v.arr.n == V);
    CHECK(typ && typ->type == GGUF_VT_ARRAY && typ->v.arr.elem_type == GGUF_VT_INT32 && typ->v.arr.n == V);
    CHECK(mer && mer->type == GGUF_VT_ARRAY && mer->v.arr.elem_type == GGUF_VT_STRING);
    if (!tok || !typ || !mer || tok->v.arr.n != V || typ->v.arr.n != V) return;
    /* GPT-2 byte-to-unicode: 0x00 -> U+0100, ' ' -> U+0120, 'A' itself, 0xAD -> U+0143. */
    CHECK(arr_str_is(tok, 0, "\xC4\x80"));
    CHECK(arr_str_is(tok, 32, "\xC4\xA0"));
    CHECK(arr_str_is(tok, 10, "\xC4\x8A"));
    CHECK(arr_str_is(tok, 'A', "A"));
    CHECK(arr_str_is(tok, 0xAD, "\xC5\x83"));
    CHECK(arr_str_is(tok, 0xFF, "\xC3\xBF"));
    CHECK(arr_str_is(mer, 0, "\xC4\xA0 t"));
    CHECK(mer->v.arr.n >= 40 && mer->v.arr.n <= 80);
    /* Every merge joins two existing tokens; its result is token 256 + i. */
    for (uint64_t i = 0; i < mer->v.arr.n; i++) {
        const gguf_str *m = &mer->v.arr.strs[i];
        const char *sp = memchr(m->ptr, ' ', m->len);
        CHECK(sp != NULL);
        if (!sp) continue;
        char left[64] = {0}, right[64] = {0}, joined[128] = {0};
        size_t nl = (size_t)(sp - m->ptr), nr = m->len - nl - 1;
        if (nl >= 64 || nr >= 64) { CHECK(false); continue; }
        memcpy(left, m->ptr, nl);
        memcpy(right, sp + 1, nr);
        snprintf(joined, sizeof joined, "%s%s", left, right);
        int64_t li = token_id(tok, left), ri = token_id(tok, right);
        CHECK(li >= 0 && li < 256 + (int64_t)i);
        CHECK(ri >= 0 && ri < 256 + (int64_t)i);
        CHECK(arr_str_is(tok, 256 + i, joined));
    }
    int64_t bos = token_id(tok, "<|begin_of_text|>"), eos = token_id(tok, "<|end_of_text|>");
    int64_t eot = token_id(tok, "<|eot|>"), mask = token_id(tok, "<|mask|>");
    CHECK(bos > 255 && eos > 255 && eot > 255 && mask > 255);
    CHECK(token_id(tok, "<|header_start|>") > 255 && token_id(tok, "<|header_end|>") > 255);
    CHECK_EQ_INT(u32_of(f, "tokenizer.ggml.bos_token_id"), bos);
    CHECK_EQ_INT(u32_of(f, "tokenizer.ggml.eos_token_id"), eos);
    CHECK_EQ_INT(u32_of(f, "tokenizer.ggml.eot_token_id"), eot);
    CHECK_EQ_INT(u32_of(f, "tokenizer.ggml.mask_token_id"), mask);
    const gguf_str *last = &tok->v.arr.strs[V - 1];
    CHECK(last->len > 26 && !memcmp(last->ptr, "<|reserved_special_token_", 25));
    /* Types: 1 for bytes and merges, 3 from the first special on. */
    int32_t types[V];
    memcpy(types, typ->v.arr.raw, sizeof types);
    for (int i = 0; i < V; i++) CHECK_EQ_INT(types[i], i < bos ? 1 : 3);
    bool add_bos = false, add_eos = true;
    CHECK(flag_of(f, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos);
    CHECK(flag_of(f, "tokenizer.ggml.add_eos_token", &add_eos) && !add_eos);
    char *tmpl = NULL;
    mu_error err;
    CHECK(gguf_get_str(f, "tokenizer.chat_template", &tmpl, &err) == 1);
    CHECK(tmpl && strstr(tmpl, "<|header_start|>") && strstr(tmpl, "<|eot|>") &&
          strstr(tmpl, "add_generation_prompt"));
    free(tmpl);
}

static void check_vectors(const gguf_file *f) {
    for (int il = 0; il < L; il++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", il);
        const gguf_tensor *q = gguf_find_tensor(f, name);
        snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", il);
        const gguf_tensor *k = gguf_find_tensor(f, name);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", il);
        const gguf_tensor *n = gguf_find_tensor(f, name);
        if (!q || !k || !n) { CHECK(false); continue; }
        for (int i = 0; i < HD; i++) {
            float a, b;
            memcpy(&a, q->data + 4 * i, 4);
            memcpy(&b, k->data + 4 * i, 4);
            CHECK_BITS_F32(a, 3.87f);
            CHECK_BITS_F32(b, 1.0f);
        }
        float lo = 10, hi = -10;
        for (int i = 0; i < E; i++) {
            float v;
            memcpy(&v, n->data + 4 * i, 4);
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
        CHECK(lo > 0.7f && hi < 1.3f && hi - lo > 0.01f); /* 1 + small noise, not constant */
    }
}

static void check_weight(const gguf_file *f, const char *type, const exp_tensor *e) {
    const gguf_tensor *t = gguf_find_tensor(f, e->name);
    uint32_t want = expected_type(type, e->name);
    CHECK_EQ_INT(t->type, want);
    CHECK_EQ_INT(t->n_dims, 2);
    CHECK_EQ_INT(t->ne[0], e->ne0);
    CHECK_EQ_INT(t->ne[1], e->ne1);
    if (want == MU_TYPE_NVFP4_E2M1) {
        const gguf_tensor *sc = companion(f, e->name, ".nvfp4_scale");
        const gguf_tensor *s2 = companion(f, e->name, ".nvfp4_scale2");
        CHECK(sc && sc->type == MU_TYPE_F8_E4M3FN && sc->n_dims == 2 && sc->ne[0] == e->ne0 / 16 &&
              sc->ne[1] == e->ne1);
        CHECK(s2 && s2->n_dims == 1 && s2->ne[0] == 1 && isfinite(scalar_of(s2)) && scalar_of(s2) > 0);
        for (uint64_t i = 0; sc && i < sc->nbytes; i++)
            if ((sc->data[i] & 0x7F) == 0x7F) { CHECK_MSG(false, "%s: NaN scale byte", sc->name); break; }
    }
    if (want == MU_TYPE_NVFP4) {
        const gguf_tensor *s = companion(f, e->name, ".scale");
        CHECK(s && s->n_dims == 1 && s->ne[0] == 1 && isfinite(scalar_of(s)) && scalar_of(s) > 0);
    }
    /* Values: std close to the generator's target (1/sqrt(n_in) for
     * projections, 1 for the embedding). */
    double want_std = !strcmp(e->name, "token_embd.weight") ? 1.0
                    : !strcmp(e->name, "output.weight") ? 1.0 / (0.196116 * sqrt((double)E))
                    : 1.0 / sqrt((double)e->ne0);
    double std = tensor_std(f, t);
    CHECK_MSG(std > 0.8 * want_std && std < 1.2 * want_std, "%s (%s): std %g, want %g", e->name,
              type, std, want_std);
}

static void check_synth_file(const char *path, const char *type) {
    mu_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;
    check_arch_keys(f);
    check_tokenizer(f);
    mu_target tgt;
    CHECK(mu_target_parse(type, &tgt, &err));
    CHECK_EQ_INT(u32_of(f, "general.file_type"), mu_target_file_type(&tgt));
    /* Lane key: present exactly for the two lanes that need it. */
    char *prec = NULL;
    int has = gguf_get_str(f, "muser.weight_precision", &prec, &err);
    if (!strcmp(type, "q4_k_xl") || !strcmp(type, "nvfp4")) CHECK(has == 1 && !strcmp(prec, type));
    else CHECK_EQ_INT(has, 0);
    free(prec);
    exp_tensor exp[3 + 14 * L];
    int n = expected_tensors(exp);
    uint64_t companions = 0, native = 0;
    for (int i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, exp[i].name);
        CHECK_MSG(t != NULL, "%s (%s): missing tensor %s", path, type, exp[i].name);
        if (!t) continue;
        if (exp[i].vector) {
            CHECK_EQ_INT(t->type, MU_TYPE_F32);
            CHECK(t->n_dims == 1 && t->ne[0] == exp[i].ne0);
            continue;
        }
        check_weight(f, type, &exp[i]);
        if (t->type == MU_TYPE_NVFP4_E2M1) { native++; companions += 2; }
        if (t->type == MU_TYPE_NVFP4) companions += 1;
    }
    CHECK_EQ_INT(f->n_tensors, (uint64_t)n + companions);
    /* Lane rule (docs/model.md, Lanes): NVFP4_E2M1 tensors iff weight_precision == nvfp4. */
    CHECK_EQ_INT(native > 0, !strcmp(type, "nvfp4"));
    if (is_nvfp4_lane(type)) CHECK_EQ_INT(native > 0 || companions > 0, 1);
    check_vectors(f);
    gguf_close(f);
}

/* ---------------- file comparisons ---------------- */

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, fp);
    fclose(fp);
    return b;
}

static int same_bytes(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

static bool dir_has_leftovers(void) {
    DIR *d = opendir(g_dir);
    bool found = false;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) found = true;
    if (d) closedir(d);
    return found;
}

/* ---------------- tests ---------------- */

static void test_type_rules(void) {
    mu_target t;
    mu_error err;
    CHECK(mu_target_parse("Q4_K_XL", &t, &err) && t.kind == MU_TARGET_Q4_K_XL);
    CHECK(mu_target_weight_type(&t, "blk.1.ffn_down.weight") == MU_TYPE_Q6_K);
    CHECK(mu_target_weight_type(&t, "blk.10.ffn_down.weight") == MU_TYPE_Q4_K);
    CHECK(mu_target_weight_type(&t, "blk.11.attn_v.weight") == MU_TYPE_Q6_K);
    CHECK(mu_target_weight_type(&t, "blk.11.attn_k.weight") == MU_TYPE_Q4_K);
    CHECK(mu_target_weight_type(&t, "output.weight") == MU_TYPE_Q5_K);
    CHECK(mu_target_weight_type(&t, "token_embd.weight") == MU_TYPE_Q4_K);
    CHECK(mu_target_weight_type(&t, "blk.x.ffn_down.weight") == MU_TYPE_Q4_K);
    CHECK(mu_target_parse("q8_0", &t, &err) && t.kind == MU_TARGET_SINGLE && t.type == MU_TYPE_Q8_0);
    CHECK(!mu_target_parse("Q2_K", &t, &err) && strstr(err.msg, "unknown weight type 'Q2_K'"));
    CHECK(!mu_target_parse("", &t, &err));
    uint64_t key = 99;
    CHECK(mu_stream_u64(key, 0) != mu_stream_u64(key, 1));
    CHECK(fabs(mu_tools_sqrt(2.0) - sqrt(2.0)) < 1e-15);
    CHECK(fabs(mu_tools_sqrt(1e-9) - sqrt(1e-9)) < 1e-20);
    CHECK(mu_tools_e4m3_value(0x38) == 1.0 && mu_tools_e4m3_value(0x7E) == 448.0 &&
          mu_tools_e4m3_value(0x01) == 1.0 / 512);
}

static const char *const ALL_TYPES[] = {
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "q4_k_xl", "nvfp4", "nvfp4_ggml",
};

static void test_synth_all_types(void) {
    for (size_t i = 0; i < sizeof ALL_TYPES / sizeof ALL_TYPES[0]; i++) {
        mu_error err = {{0}};
        char *p = path_in_dir("synth.gguf");
        bool ok = synth_file(p, ALL_TYPES[i], 42, 2, &err);
        CHECK_MSG(ok, "synth %s: %s", ALL_TYPES[i], err.msg);
        if (ok) check_synth_file(p, ALL_TYPES[i]);
        unlink(p);
    }
}

static void test_determinism(void) {
    const char *types[] = {"Q4_K", "F32", "nvfp4"};
    for (size_t i = 0; i < 3; i++) {
        mu_error err;
        char *a = path_in_dir("a.gguf"), *b = path_in_dir("b.gguf"), *c = path_in_dir("c.gguf");
        CHECK(synth_file(a, types[i], 7, 1, &err));
        CHECK(synth_file(b, types[i], 7, 3, &err));
        CHECK(synth_file(c, types[i], 8, 2, &err));
        CHECK_MSG(same_bytes(a, b), "%s: 1 vs 3 threads differ", types[i]);
        CHECK_MSG(!same_bytes(a, c), "%s: seeds 7 and 8 give the same file", types[i]);
        if (i == 0) { /* the progress bar (on stderr) does not touch the bytes */
            mu_synth_opts o;
            mu_synth_opts_init(&o);
            o.type = types[i];
            o.seed = 7;
            o.out_path = c;
            o.progress = true;
            CHECK(mu_synth(&o, &err));
            CHECK(same_bytes(a, c));
        }
        unlink(a);
        unlink(b);
        unlink(c);
    }
}

/* Relative RMSE of every 2-D tensor of q against src; vectors bit-exact. */
static void check_quantized(const char *src_path, const char *q_path, const char *type, double bound) {
    mu_error err = {{0}};
    gguf_file *s = gguf_open(src_path, &err), *q = gguf_open(q_path, &err);
    CHECK_MSG(s && q, "%s", err.msg);
    if (!s || !q) { gguf_close(s); gguf_close(q); return; }
    mu_target tgt;
    CHECK(mu_target_parse(type, &tgt, &err));
    CHECK_EQ_INT(u32_of(q, "general.file_type"), mu_target_file_type(&tgt));
    CHECK_EQ_INT(u32_of(q, "muse-glimmer.block_count"), L);
    CHECK(str_is(q, "tokenizer.ggml.pre", "llama4"));
    char *prec = NULL;
    int has = gguf_get_str(q, "muser.weight_precision", &prec, &err);
    const char *want_prec = mu_target_precision(&tgt);
    CHECK(want_prec ? has == 1 && !strcmp(prec, want_prec) : has == 0);
    free(prec);
    double worst = 0;
    for (uint64_t i = 0; i < s->n_tensors; i++) {
        const gguf_tensor *a = &s->tensors[i];
        if (strstr(a->name, ".nvfp4_scale") || strstr(a->name, ".weight.scale")) continue;
        const gguf_tensor *b = gguf_find_tensor(q, a->name);
        CHECK_MSG(b != NULL, "%s: %s missing", q_path, a->name);
        if (!b) continue;
        CHECK(b->ne[0] == a->ne[0] && b->ne[1] == a->ne[1] && b->n_dims == a->n_dims);
        if (a->n_dims == 1) {
            CHECK(b->type == MU_TYPE_F32 && b->nbytes == a->nbytes && !memcmp(a->data, b->data, a->nbytes));
            continue;
        }
        CHECK_EQ_INT(b->type, expected_type(type, a->name));
        float *x = malloc(a->ne[0] * sizeof *x), *y = malloc(a->ne[0] * sizeof *y);
        double num = 0, den = 0;
        for (uint64_t r = 0; r < a->ne[1]; r++) {
            dequant_row(s, a, r, x);
            dequant_row(q, b, r, y);
            for (uint64_t k = 0; k < a->ne[0]; k++) {
                num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
                den += (double)x[k] * x[k];
            }
        }
        free(x);
        free(y);
        double rel = sqrt(num / den);
        if (rel > worst) worst = rel;
        CHECK_MSG(rel < bound, "%s -> %s: %s relative RMSE %g >= %g", src_path, type, a->name, rel, bound);
    }
    printf("quantize -> %-10s worst relative RMSE %.5f (bound %.3f)\n", type, worst, bound);
    gguf_close(s);
    gguf_close(q);
}

static void test_quantize(void) {
    mu_error err = {{0}};
    char *src = path_in_dir("src_f32.gguf"), *out = path_in_dir("q.gguf");
    CHECK_MSG(synth_file(src, "F32", 11, 2, &err), "%s", err.msg);
    struct { const char *type; double bound; } cases[] = {
        {"F16", 1e-3}, {"Q8_0", 0.01}, {"Q6_K", 0.03}, {"Q4_K", 0.12}, {"q4_k_xl", 0.12},
        {"nvfp4", 0.15}, {"nvfp4_ggml", 0.15},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = mu_quantize_file(src, out, cases[i].type, 2, false, &err);
        CHECK_MSG(ok, "quantize %s: %s", cases[i].type, err.msg);
        if (ok) check_quantized(src, out, cases[i].type, cases[i].bound);
    }
    /* Thread count never changes the bytes. */
    char *a = path_in_dir("q1.gguf"), *b = path_in_dir("q3.gguf");
    CHECK(mu_quantize_file(src, a, "q4_k_xl", 1, false, &err));
    CHECK(mu_quantize_file(src, b, "q4_k_xl", 3, false, &err));
    CHECK(same_bytes(a, b));
    /* Native NVFP4 (with companions) as input: re-encoding to Q8_0 stays
     * close to the NVFP4 values it read. */
    char *nv = path_in_dir("nv.gguf");
    CHECK(mu_quantize_file(src, nv, "nvfp4", 2, false, &err));
    CHECK_MSG(mu_quantize_file(nv, out, "Q8_0", 2, false, &err), "%s", err.msg);
    check_quantized(nv, out, "Q8_0", 0.01);
    /* Block input dequantized exactly: Q4_K -> F32 reproduces the Q4_K values,
     * and a synth (random-block) file reads back through quantize. */
    char *k4 = path_in_dir("k4.gguf");
    CHECK(synth_file(k4, "q4_k_xl", 5, 2, &err));
    CHECK_MSG(mu_quantize_file(k4, out, "F32", 2, false, &err), "%s", err.msg);
    check_quantized(k4, out, "F32", 1e-30);
    /* In place: input and output the same path. */
    CHECK_MSG(mu_quantize_file(nv, nv, "nvfp4_ggml", 2, false, &err), "%s", err.msg);
    check_quantized(src, nv, "nvfp4_ggml", 0.2);
    /* ggml NVFP4 (type 40 + .scale) as input. */
    CHECK_MSG(mu_quantize_file(nv, out, "Q8_0", 2, false, &err), "%s", err.msg);
    check_quantized(nv, out, "Q8_0", 0.01);
    unlink(src); unlink(out); unlink(a); unlink(b); unlink(nv); unlink(k4);
}

static bool fails_with(bool ok, const mu_error *err, const char *needle) {
    if (ok) return false;
    if (!strstr(err->msg, needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", err->msg, needle);
        return false;
    }
    return true;
}

/* A small hand-built GGUF holding one native NVFP4 weight. */
static void write_nvfp4_file(const char *path, bool with_scale2, uint8_t scale_byte) {
    uint8_t payload[32 * 4], scales[2 * 4];
    for (size_t i = 0; i < sizeof payload; i++) payload[i] = (uint8_t)(i * 37 + 1);
    memset(scales, 0x38, sizeof scales);
    scales[5] = scale_byte;
    float s2 = 0.5f;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "muse-glimmer");
    uint64_t ne[2] = {32, 4}, ne_s[2] = {2, 4}, one = 1;
    gguf_writer_add_tensor(w, "w.weight", MU_TYPE_NVFP4_E2M1, 2, ne, payload);
    gguf_writer_add_tensor(w, "w.weight.nvfp4_scale", MU_TYPE_F8_E4M3FN, 2, ne_s, scales);
    if (with_scale2) gguf_writer_add_tensor(w, "w.weight.nvfp4_scale2", MU_TYPE_F32, 1, &one, &s2);
    mu_error err;
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
}

static void test_failures(void) {
    mu_error err = {{0}};
    mu_synth_opts o;
    char *p = path_in_dir("bad.gguf"), *src = path_in_dir("w320.gguf");

    mu_synth_opts_init(&o);
    o.out_path = p;
    o.type = "Q3_X";
    CHECK(fails_with(mu_synth(&o, &err), &err, "unknown weight type 'Q3_X'"));
    o.type = "F32";
    o.preset = "huge";
    CHECK(fails_with(mu_synth(&o, &err), &err, "unknown preset 'huge'"));
    o.preset = "tiny";
    o.n_layer = 6;
    CHECK(fails_with(mu_synth(&o, &err), &err, "n_layer = 6 is not a multiple of 4"));
    o.n_layer = -1;
    o.n_head_kv = 3;
    CHECK(fails_with(mu_synth(&o, &err), &err, "not a multiple of n_head_kv"));
    o.n_head_kv = -1;
    o.n_vocab = 100;
    CHECK(fails_with(mu_synth(&o, &err), &err, "vocab size 100 is out of range"));
    o.n_vocab = -1;
    o.n_embd = 320;
    o.type = "Q4_K";
    CHECK(fails_with(mu_synth(&o, &err), &err,
                     "token_embd.weight: row width 320 is not a multiple of the Q4_K block (256 values)"));
    o.out_path = NULL;
    CHECK(fails_with(mu_synth(&o, &err), &err, "no output path"));
    o.out_path = "/nonexistent-dir/x.gguf";
    o.type = "F32";
    CHECK(fails_with(mu_synth(&o, &err), &err, "/nonexistent-dir/x.gguf"));

    /* An F32 model 320 wide: Q8_0 fits (blocks of 32), Q4_K does not. */
    o.out_path = src;
    CHECK_MSG(mu_synth(&o, &err), "%s", err.msg);
    CHECK(fails_with(mu_quantize_file(src, p, "Q4_K", 2, false, &err), &err,
                     "token_embd.weight: row width 320 is not a multiple of the Q4_K block"));
    CHECK(access(p, F_OK) != 0);
    CHECK_MSG(mu_quantize_file(src, p, "Q8_0", 2, false, &err), "%s", err.msg);
    CHECK(fails_with(mu_quantize_file(src, p, "q5", 2, false, &err), &err, "unknown weight type 'q5'"));
    char *missing = path_in_dir("missing.gguf");
    CHECK(fails_with(mu_quantize_file(missing, p, "Q8_0", 2, false, &err), &err, missing));

    /* Native NVFP4 input: companions are required and validated. */
    char *nv = path_in_dir("nv_small.gguf");
    write_nvfp4_file(nv, true, 0x38);
    CHECK_MSG(mu_quantize_file(nv, p, "F32", 1, false, &err), "%s", err.msg);
    write_nvfp4_file(nv, false, 0x38);
    CHECK(fails_with(mu_quantize_file(nv, p, "F32", 1, false, &err), &err,
                     "companion w.weight.nvfp4_scale2 is missing"));
    write_nvfp4_file(nv, true, 0x7F);
    CHECK(fails_with(mu_quantize_file(nv, p, "F32", 1, false, &err), &err,
                     "w.weight.nvfp4_scale: byte 5 is 0x7F"));
    /* 32 wide: fits Q8_0 and native NVFP4, not Q4_K. */
    write_nvfp4_file(nv, true, 0x38);
    CHECK(fails_with(mu_quantize_file(nv, p, "Q4_K", 1, false, &err), &err, "row width 32"));
    CHECK_MSG(mu_quantize_file(nv, p, "nvfp4", 1, false, &err), "%s", err.msg);
    CHECK(!dir_has_leftovers());
    unlink(p);
    unlink(src);
    unlink(nv);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/muser_test_tools_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    double t0 = mu_now();
    test_type_rules();
    test_synth_all_types();
    test_determinism();
    test_quantize();
    test_failures();
    rmdir(g_dir);
    printf("test_tools: %.2f s\n", mu_now() - t0);
    TEST_MAIN_END();
}
