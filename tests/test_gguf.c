/* GGUF reader/writer/hash tests: exact bytes of a tiny file, round trips of
 * every value type, nested and string arrays, tensors of several types and
 * shapes at alignment 32 and 64, the streaming writer, getter semantics,
 * the real llama.cpp vocab files, identity hashes, and robustness against
 * truncation and byte flips of valid files. */
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "testutil.h"
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, fp);
    fclose(fp);
    return b;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    CHECK(fwrite(p, 1, n, fp) == n);
    fclose(fp);
}

static void sha256_hex(const void *p, size_t n, char hex[65]) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dl;
    EVP_Digest(p, n, d, &dl, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", d[i]);
}

static bool str_eq(gguf_str s, const char *c) {
    return s.len == strlen(c) && !memcmp(s.ptr, c, s.len);
}

/* Deep equality of two parsed values (floats by bits). */
static bool values_equal(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case GGUF_VT_STRING:
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
    case GGUF_VT_BOOL: return a->v.b == b->v.b;
    case GGUF_VT_FLOAT32: case GGUF_VT_FLOAT64: return !memcmp(&a->v.f64, &b->v.f64, 8);
    case GGUF_VT_ARRAY: {
        if (a->v.arr.elem_type != b->v.arr.elem_type || a->v.arr.n != b->v.arr.n) return false;
        uint64_t n = a->v.arr.n;
        if (n == 0) return true;
        if (a->v.arr.elem_type == GGUF_VT_STRING) {
            for (uint64_t i = 0; i < n; i++) {
                gguf_str x = a->v.arr.strs[i], y = b->v.arr.strs[i];
                if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len)) return false;
            }
            return true;
        }
        if (a->v.arr.elem_type == GGUF_VT_ARRAY) {
            for (uint64_t i = 0; i < n; i++)
                if (!values_equal(&a->v.arr.items[i], &b->v.arr.items[i])) return false;
            return true;
        }
        static const int sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        return !memcmp(a->v.arr.raw, b->v.arr.raw, n * (uint64_t)sizes[a->v.arr.elem_type]);
    }
    default: return a->v.u64 == b->v.u64;
    }
}

/* ---------------- exact bytes ---------------- */

/* An independent check of the encoding: one u32 key, one F32 tensor. */
static void test_exact_bytes(void) {
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u32(w, "a", 7);
    float vals[3] = {1.5f, -2.0f, 0.25f};
    uint64_t ne[1] = {3};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "t", MU_TYPE_F32, 1, ne, vals), 0);
    mu_error err = {{0}};
    const char *path = tmp_path("exact.gguf");
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    static const uint8_t head[] = {
        'G', 'G', 'U', 'F', 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
        1, 0, 0, 0, 0, 0, 0, 0, 'a', 4, 0, 0, 0, 7, 0, 0, 0,                   /* kv */
        1, 0, 0, 0, 0, 0, 0, 0, 't', 1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,      /* name, n_dims, ne */
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,                                   /* type F32, offset 0 */
    };
    size_t len;
    uint8_t *b = read_file(path, &len);
    CHECK(b != NULL);
    if (!b) return;
    CHECK_EQ_INT(sizeof head, 74);
    CHECK_EQ_INT(len, 96 + 32); /* data at 96, 12 bytes padded to 32 */
    CHECK(!memcmp(b, head, sizeof head));
    for (size_t i = sizeof head; i < 96; i++) CHECK_EQ_INT(b[i], 0);
    CHECK(!memcmp(b + 96, vals, 12));
    for (size_t i = 96 + 12; i < len; i++) CHECK_EQ_INT(b[i], 0);
    free(b);
}

/* ---------------- full round trip ---------------- */

typedef struct tensor_spec {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
} tensor_spec;

static const tensor_spec TENSORS[] = {
    {"token_embd.weight", MU_TYPE_Q4_K, 2, {256, 3, 1, 1}},
    {"blk.0.attn_norm.weight", MU_TYPE_F32, 1, {7, 1, 1, 1}},
    {"blk.0.attn_q.weight", MU_TYPE_Q8_0, 3, {64, 3, 2, 1}},
    {"blk.0.ffn_down.weight", MU_TYPE_Q6_K, 2, {512, 2, 1, 1}},
    {"blk.0.small.f16", MU_TYPE_F16, 4, {5, 1, 2, 3}},
    {"blk.0.q4_0", MU_TYPE_Q4_0, 2, {32, 5, 1, 1}},
    {"output.bf16", MU_TYPE_BF16, 2, {3, 3, 1, 1}},
};
#define N_TENSORS (sizeof TENSORS / sizeof TENSORS[0])

static uint64_t spec_nbytes(const tensor_spec *t) {
    uint64_t row;
    CHECK(mu_type_row_bytes(t->type, t->ne[0], &row));
    return row * t->ne[1] * t->ne[2] * t->ne[3];
}

static uint8_t *random_bytes(uint64_t n, uint64_t *rng) {
    uint8_t *p = malloc(n);
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(tu_rng_next(rng) >> 32);
    return p;
}

typedef struct scalars {
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
    uint64_t u64; int64_t i64; float f32; double f64;
} scalars;

static scalars random_scalars(uint64_t *rng) {
    scalars s;
    s.u8 = (uint8_t)(tu_rng_next(rng) | 0x80);
    s.i8 = (int8_t)(tu_rng_next(rng) | 0x80);          /* negative */
    s.u16 = (uint16_t)(tu_rng_next(rng) | 0x8000);
    s.i16 = (int16_t)(tu_rng_next(rng) | 0x8000);
    s.u32 = (uint32_t)(tu_rng_next(rng) | 0x80000000u);
    s.i32 = (int32_t)(tu_rng_next(rng) | 0x80000000u);
    s.u64 = tu_rng_next(rng) | (1ull << 63);
    s.i64 = (int64_t)(tu_rng_next(rng) | (1ull << 63));
    s.f32 = tu_rng_normal(rng) * 1000.0f;
    s.f64 = (double)tu_rng_normal(rng) / 3.0;
    return s;
}

static void write_all_types(gguf_writer *w, const scalars *s, const int32_t *ai32, const float *af32,
                            const char *const *strs, uint64_t n_strs) {
    gguf_writer_set_str(w, "general.architecture", "muse-glimmer");
    gguf_writer_set_u8(w, "t.u8", s->u8);
    gguf_writer_set_i8(w, "t.i8", s->i8);
    gguf_writer_set_u16(w, "t.u16", s->u16);
    gguf_writer_set_i16(w, "t.i16", s->i16);
    gguf_writer_set_u32(w, "t.u32", s->u32);
    gguf_writer_set_i32(w, "t.i32", s->i32);
    gguf_writer_set_u64(w, "t.u64", s->u64);
    gguf_writer_set_i64(w, "t.i64", s->i64);
    gguf_writer_set_f32(w, "t.f32", s->f32);
    gguf_writer_set_f64(w, "t.f64", s->f64);
    gguf_writer_set_bool(w, "t.bool", true);
    gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo \"world\"\n");
    gguf_writer_set_str(w, "t.empty", "");
    gguf_writer_set_arr(w, "t.arr.i32", GGUF_VT_INT32, ai32, 17);
    gguf_writer_set_arr(w, "t.arr.f32", GGUF_VT_FLOAT32, af32, 9);
    bool bools[5] = {true, false, false, true, true};
    gguf_writer_set_arr(w, "t.arr.bool", GGUF_VT_BOOL, bools, 5);
    uint64_t u64s[2] = {UINT64_MAX, 12345};
    gguf_writer_set_arr(w, "t.arr.u64", GGUF_VT_UINT64, u64s, 2);
    gguf_writer_set_arr(w, "t.arr.empty", GGUF_VT_UINT16, NULL, 0);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", strs, n_strs);
    gguf_writer_set_u32(w, "t.replaced", 1);    /* replaced below: keeps this position */
}

static void check_all_types(const gguf_file *f, const scalars *s, const int32_t *ai32,
                            const float *af32, const char *const *strs, uint64_t n_strs) {
    mu_error err;
    const gguf_value *v;
    CHECK((v = gguf_get(f, "t.u8")) && v->type == GGUF_VT_UINT8 && v->v.u64 == s->u8);
    CHECK((v = gguf_get(f, "t.i8")) && v->type == GGUF_VT_INT8 && v->v.i64 == s->i8);
    CHECK((v = gguf_get(f, "t.u16")) && v->type == GGUF_VT_UINT16 && v->v.u64 == s->u16);
    CHECK((v = gguf_get(f, "t.i16")) && v->type == GGUF_VT_INT16 && v->v.i64 == s->i16);
    CHECK((v = gguf_get(f, "t.u32")) && v->type == GGUF_VT_UINT32 && v->v.u64 == s->u32);
    CHECK((v = gguf_get(f, "t.i32")) && v->type == GGUF_VT_INT32 && v->v.i64 == s->i32);
    CHECK((v = gguf_get(f, "t.u64")) && v->type == GGUF_VT_UINT64 && v->v.u64 == s->u64);
    CHECK((v = gguf_get(f, "t.i64")) && v->type == GGUF_VT_INT64 && v->v.i64 == s->i64);
    CHECK((v = gguf_get(f, "t.f32")) && v->type == GGUF_VT_FLOAT32);
    if (v) CHECK_BITS_F32((float)v->v.f64, s->f32);
    CHECK((v = gguf_get(f, "t.f64")) && v->type == GGUF_VT_FLOAT64 && !memcmp(&v->v.f64, &s->f64, 8));
    CHECK((v = gguf_get(f, "t.bool")) && v->type == GGUF_VT_BOOL && v->v.b);
    CHECK((v = gguf_get(f, "t.str")) && v->type == GGUF_VT_STRING && str_eq(v->v.str, "h\xc3\xa9llo \"world\"\n"));
    CHECK((v = gguf_get(f, "t.empty")) && v->type == GGUF_VT_STRING && v->v.str.len == 0);
    CHECK((v = gguf_get(f, "t.arr.i32")) && v->type == GGUF_VT_ARRAY &&
          v->v.arr.elem_type == GGUF_VT_INT32 && v->v.arr.n == 17);
    for (uint64_t i = 0; v && i < 17; i++) {
        int64_t x = 0;
        CHECK(gguf_arr_get_i64(v, i, &x) && x == ai32[i]);
    }
    int64_t dummy;
    CHECK(v && !gguf_arr_get_i64(v, 17, &dummy)); /* out of range */
    CHECK((v = gguf_get(f, "t.arr.f32")) && v->v.arr.elem_type == GGUF_VT_FLOAT32 && v->v.arr.n == 9);
    for (uint64_t i = 0; v && i < 9; i++) {
        double x = 0;
        CHECK(gguf_arr_get_f64(v, i, &x));
        CHECK_BITS_F32((float)x, af32[i]);
    }
    CHECK((v = gguf_get(f, "t.arr.bool")) && v->v.arr.elem_type == GGUF_VT_BOOL && v->v.arr.n == 5);
    if (v) CHECK(!memcmp(v->v.arr.raw, "\1\0\0\1\1", 5));
    CHECK((v = gguf_get(f, "t.arr.u64")) && v->v.arr.n == 2);
    CHECK(v && !gguf_arr_get_i64(v, 0, &dummy)); /* UINT64_MAX does not fit */
    CHECK(v && gguf_arr_get_i64(v, 1, &dummy) && dummy == 12345);
    CHECK((v = gguf_get(f, "t.arr.empty")) && v->v.arr.elem_type == GGUF_VT_UINT16 && v->v.arr.n == 0);
    CHECK((v = gguf_get(f, "tokenizer.ggml.tokens")) && v->v.arr.elem_type == GGUF_VT_STRING &&
          v->v.arr.n == n_strs);
    for (uint64_t i = 0; v && i < n_strs; i++) CHECK(str_eq(v->v.arr.strs[i], strs[i]));
    uint32_t u32 = 0;
    CHECK_EQ_INT(gguf_get_u32(f, "t.replaced", &u32, &err), 1);
    CHECK_EQ_INT(u32, 2);
    /* Insertion order: the replaced key kept its first position (last). */
    int64_t arch = gguf_find_key(f, "general.architecture");
    CHECK(arch >= 0 && arch + 1 < (int64_t)f->n_kv && !strcmp(f->kv[arch + 1].key, "t.u8"));
    CHECK_EQ_INT(gguf_find_key(f, "t.replaced"), (int64_t)f->n_kv - 1);
}

/* gguf_make_resident: same addresses, same bytes, idempotent; only for
 * mapped files. The mapping starts on a 2 MiB boundary and owns the
 * rounded-up span (huge pages need both). */
static void check_resident(gguf_file *f, uint8_t **data) {
    const uint64_t huge = (uint64_t)2 << 20;
    CHECK_EQ_INT((uintptr_t)f->base % huge, 0);
    CHECK_EQ_INT(f->span, (f->size + huge - 1) / huge * huge);
    const uint8_t *base = f->base;
    CHECK(!f->resident);
    CHECK(gguf_make_resident(f));
    CHECK(f->resident);
    CHECK(f->base == base);
    for (size_t i = 0; i < N_TENSORS && i < f->n_tensors; i++) {
        CHECK(f->tensors[i].data == f->base + f->tensors[i].file_offset);
        CHECK(!memcmp(f->tensors[i].data, data[i], f->tensors[i].nbytes));
    }
    CHECK(gguf_make_resident(f)); /* already */
    gguf_file *m = gguf_open_memory(f->base, f->size, "copy", &(mu_error){{0}});
    CHECK(m != NULL);
    if (m) {
        CHECK(!gguf_make_resident(m)); /* caller memory stays the caller's */
        CHECK(!m->resident);
        gguf_close(m);
    }
}

static void roundtrip(uint32_t alignment, uint64_t seed) {
    uint64_t rng = seed;
    scalars s = random_scalars(&rng);
    int32_t ai32[17];
    float af32[9];
    for (int i = 0; i < 17; i++) ai32[i] = (int32_t)tu_rng_next(&rng);
    for (int i = 0; i < 9; i++) af32[i] = tu_rng_normal(&rng);
    const char *strs[] = {"<s>", "", "\xe2\x96\x81the", "a b", "\xf0\x9f\x98\x80", "x"};
    uint8_t *data[N_TENSORS];

    gguf_writer *w = gguf_writer_new();
    if (alignment) gguf_writer_set_alignment(w, alignment);
    write_all_types(w, &s, ai32, af32, strs, 6);
    for (size_t i = 0; i < N_TENSORS; i++) {
        data[i] = random_bytes(spec_nbytes(&TENSORS[i]), &rng);
        CHECK_EQ_INT(gguf_writer_add_tensor(w, TENSORS[i].name, TENSORS[i].type, TENSORS[i].n_dims,
                                            TENSORS[i].ne, data[i]), (int64_t)i);
    }
    gguf_writer_set_u32(w, "t.replaced", 2);
    mu_error err = {{0}};
    char name[64];
    snprintf(name, sizeof name, "rt%u.gguf", alignment);
    const char *path = tmp_path(name);
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);

    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) goto out;
    uint64_t align = alignment ? alignment : 32;
    CHECK_EQ_INT(f->version, 3);
    CHECK_EQ_INT(f->alignment, align);
    CHECK_EQ_INT(f->n_kv, 21 + (alignment ? 1 : 0));
    CHECK_EQ_INT(gguf_find_key(f, "general.alignment") >= 0, alignment != 0);
    CHECK(f->mapped);
    CHECK_EQ_INT(f->data_offset % align, 0);
    check_all_types(f, &s, ai32, af32, strs, 6);
    CHECK_EQ_INT(f->n_tensors, N_TENSORS);
    uint64_t expect_offset = 0;
    for (size_t i = 0; i < N_TENSORS && i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const tensor_spec *sp = &TENSORS[i];
        CHECK(gguf_find_tensor(f, sp->name) == t);
        CHECK(!strcmp(t->name, sp->name));
        CHECK_EQ_INT(t->type, sp->type);
        CHECK_EQ_INT(t->n_dims, sp->n_dims);
        for (int d = 0; d < 4; d++) CHECK_EQ_INT(t->ne[d], sp->ne[d]);
        CHECK_EQ_INT(t->n_elems, sp->ne[0] * sp->ne[1] * sp->ne[2] * sp->ne[3]);
        CHECK_EQ_INT(t->nbytes, spec_nbytes(sp));
        CHECK_EQ_INT(t->offset, expect_offset); /* contiguous, in order (llama.cpp requires) */
        CHECK_EQ_INT(t->offset % align, 0);
        CHECK_EQ_INT(t->file_offset, f->data_offset + t->offset);
        CHECK(t->data == f->base + t->file_offset); /* zero-copy view */
        CHECK(!memcmp(t->data, data[i], t->nbytes));
        expect_offset = (t->offset + t->nbytes + align - 1) / align * align;
    }
    CHECK_EQ_INT(f->size, f->data_offset + expect_offset); /* last tensor padded too */
    CHECK(gguf_find_tensor(f, "nope") == NULL);
    CHECK(gguf_get(f, "nope") == NULL);
    check_resident(f, data);
    gguf_close(f);
out:
    for (size_t i = 0; i < N_TENSORS; i++) free(data[i]);
}

/* ---------------- nested arrays and copy_kv ---------------- */

static void test_nested_arrays(void) {
    static const int32_t ints[3] = {1, -2, 3};
    gguf_str s1[2] = {{1, "x"}, {2, "yz"}}, s2[2] = {{0, ""}, {1, "w"}};
    gguf_value strarrs[2], inner[3], deep[1], deeper[1];
    memset(strarrs, 0, sizeof strarrs);
    memset(inner, 0, sizeof inner);
    strarrs[0].type = strarrs[1].type = GGUF_VT_ARRAY;
    strarrs[0].v.arr.elem_type = strarrs[1].v.arr.elem_type = GGUF_VT_STRING;
    strarrs[0].v.arr.n = strarrs[1].v.arr.n = 2;
    strarrs[0].v.arr.strs = s1;
    strarrs[1].v.arr.strs = s2;
    inner[0] = (gguf_value){.type = GGUF_VT_ARRAY, .v.arr = {.elem_type = GGUF_VT_INT32, .n = 3,
                                                             .raw = (const uint8_t *)ints}};
    inner[1] = (gguf_value){.type = GGUF_VT_ARRAY, .v.arr = {.elem_type = GGUF_VT_UINT8, .n = 0}};
    inner[2] = (gguf_value){.type = GGUF_VT_ARRAY, .v.arr = {.elem_type = GGUF_VT_ARRAY, .n = 2,
                                                             .items = strarrs}};
    gguf_kv kv = {.key = "t.nested", .val = {.type = GGUF_VT_ARRAY,
                                             .v.arr = {.elem_type = GGUF_VT_ARRAY, .n = 3, .items = inner}}};
    /* 8 arrays deep: exactly the reader's limit. */
    deeper[0] = inner[0];
    gguf_value *cur = deeper;
    gguf_value levels[7];
    for (int i = 0; i < 7; i++) {
        levels[i] = (gguf_value){.type = GGUF_VT_ARRAY, .v.arr = {.elem_type = GGUF_VT_ARRAY, .n = 1,
                                                                  .items = cur}};
        cur = &levels[i];
    }
    deep[0] = *cur;
    gguf_kv kv_deep = {.key = "t.deep", .val = deep[0]};

    gguf_writer *w = gguf_writer_new();
    gguf_writer_copy_kv(w, &kv);
    gguf_writer_copy_kv(w, &kv_deep);
    mu_error err = {{0}};
    const char *path = tmp_path("nested.gguf");
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;
    const gguf_value *v = gguf_get(f, "t.nested");
    CHECK(v && values_equal(v, &kv.val));
    if (v) {
        CHECK(str_eq(v->v.arr.items[2].v.arr.items[0].v.arr.strs[1], "yz"));
        int64_t x;
        CHECK(gguf_arr_get_i64(&v->v.arr.items[0], 1, &x) && x == -2);
        CHECK(!gguf_arr_get_i64(v, 0, &x)); /* not a fixed-size element array */
    }
    v = gguf_get(f, "t.deep");
    CHECK(v && values_equal(v, &kv_deep.val));
    gguf_close(f);
    /* One more level: the writer refuses what the reader would reject. */
    gguf_value nine = {.type = GGUF_VT_ARRAY, .v.arr = {.elem_type = GGUF_VT_ARRAY, .n = 1, .items = &kv_deep.val}};
    gguf_kv kv_nine = {.key = "t.nine", .val = nine};
    w = gguf_writer_new();
    gguf_writer_copy_kv(w, &kv_nine);
    CHECK(!gguf_writer_write_file(w, tmp_path("nine.gguf"), &err));
    CHECK(strstr(err.msg, "t.nine") != NULL);
    gguf_writer_free(w);
}

/* Key length limit (65535) and tensor name limits, from hand-built bytes. */
static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_name_limits(void) {
    for (uint64_t key_len = 65535; key_len <= 65536; key_len++) {
        size_t n = 24 + 8 + key_len + 4 + 1;
        uint8_t *b = calloc(1, n);
        memcpy(b, "GGUF", 4);
        put_le(b + 4, 3, 4);
        put_le(b + 16, 1, 8);          /* one kv */
        put_le(b + 24, key_len, 8);
        memset(b + 32, 'k', key_len);
        put_le(b + 32 + key_len, GGUF_VT_UINT8, 4);
        b[n - 1] = 7;
        mu_error err = {{0}};
        gguf_file *f = gguf_open_memory(b, n, "longkey", &err);
        if (key_len == 65535) {
            CHECK_MSG(f && f->kv[0].val.v.u64 == 7 && strlen(f->kv[0].key) == 65535, "%s", err.msg);
        } else {
            CHECK(f == NULL);
            CHECK(strstr(err.msg, "longkey: offset 24: kv #0: key length 65536 exceeds the limit of 65535"));
        }
        gguf_close(f);
        free(b);
    }
    /* Writer: names llama.cpp can load (< 64 bytes) only. */
    char name[80];
    memset(name, 'n', sizeof name);
    name[63] = '\0';
    float x[32] = {0};
    uint64_t ne[1] = {32};
    gguf_writer *w = gguf_writer_new();
    CHECK_EQ_INT(gguf_writer_add_tensor(w, name, MU_TYPE_F32, 1, ne, x), 0);
    name[63] = 'n';
    name[64] = '\0';
    CHECK_EQ_INT(gguf_writer_add_tensor(w, name, MU_TYPE_F32, 1, ne, x), -1);
    gguf_writer_free(w);
}

/* Copying every kv of a real file in order reproduces its kv bytes exactly. */
static void test_copy_real(const char *src) {
    mu_error err = {{0}};
    gguf_file *a = gguf_open(src, &err);
    CHECK_MSG(a != NULL, "%s", err.msg);
    if (!a) return;
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < a->n_kv; i++) gguf_writer_copy_kv(w, &a->kv[i]);
    const char *path = tmp_path("copy.gguf");
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    gguf_file *b = gguf_open(path, &err);
    CHECK_MSG(b != NULL, "%s", err.msg);
    if (b && a->n_tensors == 0) {
        CHECK(b->size >= a->size && b->size - a->size < 32);
        CHECK(!memcmp(a->base, b->base, a->size));
        for (uint64_t i = 0; i < a->n_kv; i++) CHECK(values_equal(&a->kv[i].val, &b->kv[i].val));
        char ha[65], hb[65];
        gguf_sha256_tokenizer(a, ha);
        gguf_sha256_tokenizer(b, hb);
        CHECK(!strcmp(ha, hb));
    }
    gguf_close(b);
    gguf_close(a);
}

/* ---------------- streaming writer ---------------- */

static void test_streaming(void) {
    uint64_t rng = 0x5eed5eed12345ull;
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_alignment(w, 64);
    gguf_writer_set_str(w, "general.name", "stream");
    uint8_t *data[N_TENSORS];
    for (size_t i = 0; i < N_TENSORS; i++)
        CHECK_EQ_INT(gguf_writer_add_tensor(w, TENSORS[i].name, TENSORS[i].type, TENSORS[i].n_dims,
                                            TENSORS[i].ne, NULL), (int64_t)i);
    mu_error err = {{0}};
    const char *path = tmp_path("stream.gguf");
    unlink(path);
    CHECK(!gguf_writer_write_file(w, path, &err)); /* no data given */
    CHECK(strstr(err.msg, "has no data") != NULL);
    CHECK_MSG(gguf_writer_begin(w, path, &err), "%s", err.msg);
    CHECK(gguf_writer_fd(w) >= 0);
    CHECK(access(path, F_OK) != 0); /* appears only at finish */
    /* Producers write in any order. */
    for (size_t k = N_TENSORS; k-- > 0;) {
        uint64_t off = gguf_writer_tensor_file_offset(w, (int64_t)k);
        uint64_t n = gguf_writer_tensor_nbytes(w, (int64_t)k);
        CHECK_EQ_INT(n, spec_nbytes(&TENSORS[k]));
        CHECK_EQ_INT(off % 64, 0);
        data[k] = random_bytes(n, &rng);
        CHECK(pwrite(gguf_writer_fd(w), data[k], n, (off_t)off) == (ssize_t)n);
    }
    CHECK_EQ_INT(gguf_writer_tensor_file_offset(w, N_TENSORS), UINT64_MAX);
    CHECK_MSG(gguf_writer_finish(w, &err), "%s", err.msg);
    uint64_t off0 = gguf_writer_tensor_file_offset(w, 0);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        CHECK_EQ_INT(f->alignment, 64);
        CHECK_EQ_INT(f->tensors[0].file_offset, off0);
        for (size_t i = 0; i < N_TENSORS; i++)
            CHECK(!memcmp(f->tensors[i].data, data[i], f->tensors[i].nbytes));
        CHECK_EQ_INT(f->size % 64, 0);
        gguf_close(f);
    }
    for (size_t i = 0; i < N_TENSORS; i++) free(data[i]);
    /* Abandoned after begin: nothing left behind. */
    w = gguf_writer_new();
    uint64_t ne[1] = {32};
    gguf_writer_add_tensor(w, "x", MU_TYPE_F32, 1, ne, NULL);
    const char *gone = tmp_path("abandoned.gguf");
    CHECK(gguf_writer_begin(w, gone, &err));
    gguf_writer_free(w);
    CHECK(access(gone, F_OK) != 0);
    DIR *d = opendir(tmpdir);
    for (struct dirent *e; d && (e = readdir(d));) CHECK_MSG(!strstr(e->d_name, ".tmp."), "%s", e->d_name);
    if (d) closedir(d);
}

static void expect_write_error(gguf_writer *w, const char *substring) {
    mu_error err = {{0}};
    const char *path = tmp_path("bad.gguf");
    CHECK(!gguf_writer_write_file(w, path, &err));
    CHECK_MSG(strstr(err.msg, substring) != NULL, "'%s' lacks '%s'", err.msg, substring);
    CHECK(access(path, F_OK) != 0);
    gguf_writer_free(w);
}

static void test_writer_misuse(void) {
    uint64_t ne[2] = {33, 2};
    gguf_writer *w = gguf_writer_new();
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "q", MU_TYPE_Q4_0, 2, ne, "x"), -1); /* 33 % 32 */
    expect_write_error(w, "tensor 'q'");
    w = gguf_writer_new();
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "u", 77, 1, ne, "x"), -1);
    expect_write_error(w, "tensor 'u'");
    w = gguf_writer_new();
    float x[33 * 2] = {0};
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "d", MU_TYPE_F32, 2, ne, x), 0);
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "d", MU_TYPE_F32, 2, ne, x), -1);
    expect_write_error(w, "added twice");
    w = gguf_writer_new();
    gguf_writer_set_alignment(w, 3);
    expect_write_error(w, "power of two");
    w = gguf_writer_new();
    gguf_writer_set_u64(w, "general.alignment", 64);
    expect_write_error(w, "general.alignment");
    w = gguf_writer_new();
    gguf_writer_set_u32(w, "", 1);
    expect_write_error(w, "invalid key");
    w = gguf_writer_new();
    gguf_writer_set_u32(w, "bad\nkey", 1);
    expect_write_error(w, "invalid key");
    uint64_t zero[1] = {0};
    w = gguf_writer_new();
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "z", MU_TYPE_F32, 1, zero, x), -1);
    expect_write_error(w, "tensor 'z'");
    w = gguf_writer_new();
    CHECK_EQ_INT(gguf_writer_add_tensor(w, "n5", MU_TYPE_F32, 5, ne, x), -1);
    expect_write_error(w, "n_dims 5");
}

/* ---------------- getters ---------------- */

static void test_getters(void) {
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u8(w, "u8", 200);
    gguf_writer_set_i32(w, "neg", -5);
    gguf_writer_set_u64(w, "big", UINT64_MAX - 1);
    gguf_writer_set_u64(w, "mid", 5000000000ull);
    gguf_writer_set_i64(w, "i64", -7000000000ll);
    gguf_writer_set_f32(w, "f32", -0.0f);
    gguf_writer_set_f64(w, "f64ok", 0.375);
    gguf_writer_set_f64(w, "f64inexact", 0.1);
    gguf_writer_set_bool(w, "b", true);
    gguf_writer_set_str(w, "s", "hello");
    int16_t arr[2] = {-3, 4};
    gguf_writer_set_arr(w, "arr", GGUF_VT_INT16, arr, 2);
    mu_error err = {{0}};
    const char *path = tmp_path("getters.gguf");
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;
    uint32_t u32 = 99;
    uint64_t u64 = 99;
    int64_t i64 = 99;
    float f32 = 99;
    bool b = false;
    char *s = NULL;
    /* missing: 0, output untouched */
    CHECK_EQ_INT(gguf_get_u32(f, "missing", &u32, &err), 0);
    CHECK_EQ_INT(u32, 99);
    CHECK_EQ_INT(gguf_get_str(f, "missing", &s, &err), 0);
    CHECK(s == NULL);
    /* widening and range checks */
    CHECK_EQ_INT(gguf_get_u32(f, "u8", &u32, &err), 1);
    CHECK_EQ_INT(u32, 200);
    CHECK_EQ_INT(gguf_get_i64(f, "u8", &i64, &err), 1);
    CHECK_EQ_INT(i64, 200);
    CHECK_EQ_INT(gguf_get_i64(f, "neg", &i64, &err), 1);
    CHECK_EQ_INT(i64, -5);
    u32 = 99;
    CHECK_EQ_INT(gguf_get_u32(f, "neg", &u32, &err), -1);
    CHECK_EQ_INT(u32, 99);
    CHECK(strstr(err.msg, "'neg'") && strstr(err.msg, "int32") && strstr(err.msg, "uint32"));
    CHECK(strstr(err.msg, path) != NULL);
    CHECK_EQ_INT(gguf_get_u64(f, "neg", &u64, &err), -1);
    CHECK_EQ_INT(gguf_get_u32(f, "mid", &u32, &err), -1);
    CHECK_EQ_INT(gguf_get_u64(f, "mid", &u64, &err), 1);
    CHECK_EQ_INT(u64, 5000000000ull);
    CHECK_EQ_INT(gguf_get_u64(f, "big", &u64, &err), 1);
    CHECK(u64 == UINT64_MAX - 1);
    CHECK_EQ_INT(gguf_get_i64(f, "big", &i64, &err), -1);
    CHECK_EQ_INT(gguf_get_i64(f, "i64", &i64, &err), 1);
    CHECK_EQ_INT(i64, -7000000000ll);
    /* wrong types */
    CHECK_EQ_INT(gguf_get_u32(f, "s", &u32, &err), -1);
    CHECK(strstr(err.msg, "'s'") && strstr(err.msg, "string") && strstr(err.msg, "uint32"));
    CHECK_EQ_INT(gguf_get_u32(f, "b", &u32, &err), -1);
    CHECK_EQ_INT(gguf_get_u32(f, "f32", &u32, &err), -1);
    CHECK_EQ_INT(gguf_get_bool(f, "u8", &b, &err), -1);
    CHECK(strstr(err.msg, "uint8") && strstr(err.msg, "bool"));
    CHECK_EQ_INT(gguf_get_str(f, "u8", &s, &err), -1);
    CHECK_EQ_INT(gguf_get_f32(f, "u8", &f32, &err), -1);
    CHECK_EQ_INT(gguf_get_u32(f, "arr", &u32, &err), -1);
    CHECK(strstr(err.msg, "array") != NULL);
    /* floats, bool, string */
    CHECK_EQ_INT(gguf_get_f32(f, "f32", &f32, &err), 1);
    CHECK_BITS_F32(f32, -0.0f);
    CHECK_EQ_INT(gguf_get_f32(f, "f64ok", &f32, &err), 1);
    CHECK_BITS_F32(f32, 0.375f);
    CHECK_EQ_INT(gguf_get_f32(f, "f64inexact", &f32, &err), -1);
    CHECK(strstr(err.msg, "f64inexact") != NULL);
    CHECK_EQ_INT(gguf_get_bool(f, "b", &b, &err), 1);
    CHECK(b);
    CHECK_EQ_INT(gguf_get_str(f, "s", &s, &err), 1);
    CHECK(s && !strcmp(s, "hello"));
    free(s);
    const gguf_value *a = gguf_get(f, "arr");
    int64_t x;
    double d;
    CHECK(a && gguf_arr_get_i64(a, 0, &x) && x == -3);
    CHECK(a && gguf_arr_get_f64(a, 1, &d) && d == 4.0);
    CHECK(a && !gguf_arr_get_i64(a, 2, &x));
    CHECK(!gguf_arr_get_i64(gguf_get(f, "s"), 0, &x));
    CHECK(!gguf_arr_get_f64(NULL, 0, &d));
    CHECK_EQ_INT(gguf_find_key(f, "arr"), 10);
    CHECK_EQ_INT(gguf_find_key(f, NULL), -1);
    gguf_close(f);
}

/* ---------------- real llama.cpp vocab files ---------------- */

typedef struct known_vocab { const char *file, *model; uint64_t n_tokens; bool merges; } known_vocab;
static const known_vocab KNOWN[] = {
    {"ggml-vocab-deepseek-coder.gguf", "gpt2", 32256, true},
    {"ggml-vocab-falcon.gguf", "gpt2", 65024, true},
    {"ggml-vocab-gpt-2.gguf", "gpt2", 50257, true},
    {"ggml-vocab-llama-spm.gguf", "llama", 32000, false},
    {"ggml-vocab-phi-3.gguf", "llama", 32064, false},
    {"ggml-vocab-starcoder.gguf", "gpt2", 49152, true},
};

static void check_real_file(const char *dir, const char *name, int *n_known) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    mu_error err = {{0}};
    gguf_file *f = gguf_open(path, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (!f) return;
    char *model = NULL;
    CHECK_EQ_INT(gguf_get_str(f, "tokenizer.ggml.model", &model, &err), 1);
    const gguf_value *tok = gguf_get(f, "tokenizer.ggml.tokens");
    CHECK(tok && tok->type == GGUF_VT_ARRAY && tok->v.arr.elem_type == GGUF_VT_STRING && tok->v.arr.n > 1000);
    const gguf_value *tt = gguf_get(f, "tokenizer.ggml.token_type");
    CHECK(tt && tok && tt->v.arr.n == tok->v.arr.n);
    uint32_t bos = 0;
    if (tok && gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos, &err) == 1) CHECK(bos < tok->v.arr.n);
    uint32_t vocab = 0;
    char *arch = NULL;
    CHECK_EQ_INT(gguf_get_str(f, "general.architecture", &arch, &err), 1);
    if (arch && tok) {
        char key[128];
        snprintf(key, sizeof key, "%s.vocab_size", arch);
        if (gguf_get_u32(f, key, &vocab, &err) == 1) CHECK_EQ_INT(vocab, tok->v.arr.n);
    }
    for (size_t k = 0; k < sizeof KNOWN / sizeof KNOWN[0]; k++) {
        if (strcmp(name, KNOWN[k].file)) continue;
        (*n_known)++;
        CHECK(model && !strcmp(model, KNOWN[k].model));
        CHECK(tok && tok->v.arr.n == KNOWN[k].n_tokens);
        const gguf_value *m = gguf_get(f, "tokenizer.ggml.merges");
        CHECK((m != NULL) == KNOWN[k].merges);
        if (m) CHECK(m->v.arr.n > 1000 && memchr(m->v.arr.strs[0].ptr, ' ', m->v.arr.strs[0].len));
        if (model && tok && !strcmp(model, "llama")) { /* SPM: scores per token, and <s> is token 1 */
            const gguf_value *sc = gguf_get(f, "tokenizer.ggml.scores");
            CHECK(sc && sc->v.arr.elem_type == GGUF_VT_FLOAT32 && sc->v.arr.n == tok->v.arr.n);
            CHECK(str_eq(tok->v.arr.strs[1], "<s>"));
        }
    }
    free(model);
    free(arch);
    gguf_close(f);
}

static void test_real_files(void) {
    const char *src = getenv("MUSER_SOURCE_DIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/tokenizer", src ? src : ".");
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "cannot open %s", dir);
    if (!d) return;
    int n_files = 0, n_known = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 5, ".gguf")) continue;
        n_files++;
        check_real_file(dir, e->d_name, &n_known);
    }
    closedir(d);
    CHECK(n_files >= 6);
    CHECK_EQ_INT(n_known, 6);
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml-vocab-llama-spm.gguf", dir);
    test_copy_real(path);
    snprintf(path, sizeof path, "%s/ggml-vocab-phi-3.gguf", dir);
    test_copy_real(path);
}

/* ---------------- hashes ---------------- */

static void progress_cb(uint64_t done, uint64_t total, void *ctx) {
    uint64_t *calls = ctx;
    CHECK(done <= total && done > calls[1]);
    calls[0]++;
    calls[1] = done;
}

static void test_file_hash(void) {
    const char *small = tmp_path("small.bin");
    const char *msg = "muser gguf hash test vector\n";
    write_bytes(small, msg, strlen(msg));
    char hex[65];
    mu_error err = {{0}};
    CHECK_MSG(gguf_sha256_file(small, hex, NULL, NULL, &err), "%s", err.msg);
    /* sha256sum of the same bytes, computed when this test was written */
    CHECK(!strcmp(hex, "75291708126638730ee19b7c231a6af3f5474dc75a52b6a481387e21e0316828"));
    /* Larger than one 16 MiB chunk. */
    size_t n = 17 * 1024 * 1024 + 123;
    uint8_t *big = malloc(n);
    for (size_t i = 0; i < n; i++) big[i] = (uint8_t)((i * 31 + 7) % 251);
    const char *bigp = tmp_path("big.bin");
    write_bytes(bigp, big, n);
    free(big);
    uint64_t calls[2] = {0, 0};
    CHECK_MSG(gguf_sha256_file(bigp, hex, progress_cb, calls, &err), "%s", err.msg);
    CHECK(!strcmp(hex, "b0d9e3c62f59dd02af826fd1bfd5b7fd91fb75e7f39811b019f8a116496003a4"));
    CHECK(calls[0] >= 2 && calls[1] == n);
    unlink(bigp);
    CHECK(!gguf_sha256_file(tmp_path("does-not-exist"), hex, NULL, NULL, &err));
    CHECK(strstr(err.msg, "does-not-exist") != NULL);
    CHECK_EQ_INT(hex[0], 0);
}

typedef struct tok_variant {
    const char *name, *model, *token1, *tmpl;
    bool tok_as_i32, extra_tensor;
    uint32_t alignment;
} tok_variant;

static gguf_file *write_tokenizer_file(const tok_variant *v, mu_error *err) {
    gguf_writer *w = gguf_writer_new();
    if (v->alignment) gguf_writer_set_alignment(w, v->alignment);
    gguf_writer_set_str(w, "general.name", v->name);
    gguf_writer_set_str(w, "tokenizer.ggml.model", v->model);
    const char *toks[3] = {"<s>", v->token1, "c"};
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    if (v->tok_as_i32) gguf_writer_set_i32(w, "tokenizer.ggml.bos_token_id", 0);
    else gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 0);
    if (v->tmpl) gguf_writer_set_str(w, "tokenizer.chat_template", v->tmpl);
    gguf_writer_set_str(w, "tokenizer.chat_template.tool_use", v->name);
    float data[32] = {1};
    uint64_t ne[1] = {32};
    if (v->extra_tensor) gguf_writer_add_tensor(w, "x", MU_TYPE_F32, 1, ne, data);
    const char *path = tmp_path("tok.gguf");
    bool ok = gguf_writer_write_file(w, path, err);
    gguf_writer_free(w);
    return ok ? gguf_open(path, err) : NULL;
}

static void tokenizer_hashes(const tok_variant *v, char tok[65], char tmpl[65], bool *has_tmpl) {
    mu_error err = {{0}};
    gguf_file *f = write_tokenizer_file(v, &err);
    CHECK_MSG(f != NULL, "%s", err.msg);
    memset(tok, 'x', 65);
    memset(tmpl, 'x', 65);
    if (!f) return;
    gguf_sha256_tokenizer(f, tok);
    *has_tmpl = gguf_sha256_chat_template(f, tmpl);
    gguf_close(f);
}

/* The canonical serialization rebuilt by hand: tag, then the GGUF records. */
static void expected_tokenizer_hash(char hex[65]) {
    uint8_t buf[512];
    size_t n = 0;
#define PUT(p, len) (memcpy(buf + n, (p), (len)), n += (len))
#define PUT_U32(x) do { uint32_t _v = (x); PUT(&_v, 4); } while (0)
#define PUT_U64(x) do { uint64_t _v = (x); PUT(&_v, 8); } while (0)
#define PUT_STR(s) do { PUT_U64(strlen(s)); PUT((s), strlen(s)); } while (0)
    PUT("muser-c.gguf-tokenizer.v1", 26);
    PUT_STR("tokenizer.ggml.model");
    PUT_U32(GGUF_VT_STRING);
    PUT_STR("gpt2");
    PUT_STR("tokenizer.ggml.tokens");
    PUT_U32(GGUF_VT_ARRAY);
    PUT_U32(GGUF_VT_STRING);
    PUT_U64(3);
    PUT_STR("<s>");
    PUT_STR("b");
    PUT_STR("c");
    PUT_STR("tokenizer.ggml.bos_token_id");
    PUT_U32(GGUF_VT_UINT32);
    PUT_U32(0);
    sha256_hex(buf, n, hex);
}

static void test_tokenizer_hash(void) {
    const char *tmpl = "{% for m in messages %}{{ m.content }}{% endfor %}";
    tok_variant base = {"one", "gpt2", "b", tmpl, false, false, 0};
    char h0[65], t0[65], h[65], t[65], expect[65];
    bool has0 = false, has = false;
    tokenizer_hashes(&base, h0, t0, &has0);
    expected_tokenizer_hash(expect);
    CHECK_MSG(!strcmp(h0, expect), "%s vs %s", h0, expect);
    CHECK(has0);
    CHECK(!strcmp(t0, "2f3f666573313d2b0849e1037ccb379ce3a75eb687eccf69f077257e055b93bd"));

    tok_variant v = base; /* unrelated key, tool_use template, tensors and alignment */
    v.name = "two";
    v.extra_tensor = true;
    v.alignment = 64;
    tokenizer_hashes(&v, h, t, &has);
    CHECK(!strcmp(h, h0));
    CHECK(!strcmp(t, t0));

    v = base; /* chat template: template hash changes, tokenizer hash does not */
    v.tmpl = "{{ other }}";
    tokenizer_hashes(&v, h, t, &has);
    CHECK(!strcmp(h, h0));
    CHECK(strcmp(t, t0) != 0);

    v = base;
    v.tmpl = NULL;
    tokenizer_hashes(&v, h, t, &has);
    CHECK(!strcmp(h, h0));
    CHECK(!has);
    CHECK_EQ_INT(t[0], 0);

    v = base; /* a token string */
    v.token1 = "B";
    tokenizer_hashes(&v, h, t, &has);
    CHECK(strcmp(h, h0) != 0);

    v = base; /* tokenizer.ggml.model */
    v.model = "llama";
    tokenizer_hashes(&v, h, t, &has);
    CHECK(strcmp(h, h0) != 0);

    v = base; /* same value, different type */
    v.tok_as_i32 = true;
    tokenizer_hashes(&v, h, t, &has);
    CHECK(strcmp(h, h0) != 0);
}

/* ---------------- robustness of valid files ---------------- */

static void test_truncation_and_flips(void) {
    size_t len;
    uint8_t *b = read_file(tmp_path("rt64.gguf"), &len);
    CHECK(b != NULL);
    if (!b) return;
    mu_error err;
    gguf_file *f = gguf_open_memory(b, len, "rt64", &err);
    CHECK(f != NULL);
    uint64_t data_end = 0, meta_end = f ? f->data_offset : len;
    for (uint64_t i = 0; f && i < f->n_tensors; i++) {
        uint64_t e = f->tensors[i].file_offset + f->tensors[i].nbytes;
        if (e > data_end) data_end = e;
    }
    gguf_close(f);
    /* Every prefix that cuts metadata or tensor data must be refused. */
    int refused = 0;
    for (size_t n = 0; n < data_end; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan catches overreads */
        memcpy(copy, b, n);
        gguf_file *g = gguf_open_memory(copy, n, "prefix", &err);
        refused += g == NULL;
        if (!g) CHECK(strstr(err.msg, "prefix: offset ") == err.msg);
        gguf_close(g);
        free(copy);
    }
    CHECK_EQ_INT(refused, (int)data_end);
    /* Random byte flips must never crash; whatever opens is self-consistent. */
    uint64_t rng = 0xf11b5ull;
    uint8_t *copy = malloc(len);
    for (int it = 0; it < 3000; it++) {
        memcpy(copy, b, len);
        int flips = 1 + (int)(tu_rng_next(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t pos = (size_t)(tu_rng_next(&rng) % meta_end); /* mostly metadata */
            copy[pos] ^= (uint8_t)(1u << (tu_rng_next(&rng) % 8));
        }
        gguf_file *g = gguf_open_memory(copy, len, "flip", &err);
        for (uint64_t i = 0; g && i < g->n_tensors; i++) {
            const gguf_tensor *t = &g->tensors[i];
            CHECK(t->file_offset + t->nbytes <= len && t->offset % g->alignment == 0);
            CHECK(gguf_find_tensor(g, t->name) == t);
        }
        for (uint64_t i = 0; g && i < g->n_kv; i++) CHECK_EQ_INT(gguf_find_key(g, g->kv[i].key), (int64_t)i);
        char h[65];
        if (g) gguf_sha256_tokenizer(g, h);
        gguf_close(g);
    }
    free(copy);
    free(b);
}

/* A model-sized vocabulary and tensor count parse quickly (no O(n^2)). */
static void test_large_vocab_speed(void) {
    enum { N_TOK = 202048, N_T = 730 };
    uint64_t rng = 0xb16b16ull;
    char **toks = malloc(N_TOK * sizeof *toks);
    for (int i = 0; i < N_TOK; i++) {
        toks[i] = malloc(24);
        snprintf(toks[i], 24, "t%d_%u", i, (unsigned)(tu_rng_next(&rng) % 100000));
    }
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, N_TOK);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)toks, N_TOK);
    static float one[32];
    uint64_t ne[1] = {32};
    char name[64];
    for (int i = 0; i < N_T; i++) {
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", i);
        gguf_writer_add_tensor(w, name, MU_TYPE_F32, 1, ne, one);
    }
    mu_error err = {{0}};
    const char *path = tmp_path("vocab.gguf");
    CHECK_MSG(gguf_writer_write_file(w, path, &err), "%s", err.msg);
    gguf_writer_free(w);
    double t0 = mu_now();
    gguf_file *f = gguf_open(path, &err);
    double t1 = mu_now();
    CHECK_MSG(f != NULL, "%s", err.msg);
    if (f) {
        const gguf_value *v = gguf_get(f, "tokenizer.ggml.tokens");
        CHECK(v && v->v.arr.n == N_TOK && str_eq(v->v.arr.strs[N_TOK - 1], toks[N_TOK - 1]));
        CHECK(gguf_find_tensor(f, "blk.729.attn_q.weight") == &f->tensors[729]);
        char h[65];
        double t2 = mu_now();
        gguf_sha256_tokenizer(f, h);
        printf("parse of %d tokens x2 + %d tensors (%" PRIu64 " bytes): %.2f ms; tokenizer hash %.2f ms\n",
               N_TOK, N_T, f->size, (t1 - t0) * 1e3, (mu_now() - t2) * 1e3);
        CHECK(t1 - t0 < 2.0); /* generous: ~10 ms optimized, more under ASan */
    }
    gguf_close(f);
    for (int i = 0; i < N_TOK; i++) free(toks[i]);
    free(toks);
    unlink(path);
}

static void test_open_errors(void) {
    mu_error err = {{0}};
    CHECK(gguf_open(tmp_path("missing.gguf"), &err) == NULL);
    CHECK(strstr(err.msg, "missing.gguf") != NULL);
    CHECK(gguf_open(tmpdir, &err) == NULL); /* a directory */
    CHECK(strstr(err.msg, tmpdir) != NULL);
    CHECK(gguf_open_memory(NULL, 0, "null", &err) == NULL);
    CHECK(strstr(err.msg, "null: offset 0: truncated") != NULL);
    gguf_close(NULL);
}

static void remove_tmpdir(void) {
    DIR *d = opendir(tmpdir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        unlink(tmp_path(e->d_name));
    }
    if (d) closedir(d);
    rmdir(tmpdir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/muser_test_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_exact_bytes();
    roundtrip(0, 0x1234567ull);
    roundtrip(32, 0xabcdefull);
    roundtrip(64, 0x7777777ull);
    test_nested_arrays();
    test_name_limits();
    test_streaming();
    test_writer_misuse();
    test_getters();
    test_real_files();
    test_file_hash();
    test_tokenizer_hash();
    test_truncation_and_flips();
    test_large_vocab_speed();
    test_open_errors();
    remove_tmpdir();
    TEST_MAIN_END();
}
