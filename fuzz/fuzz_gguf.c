/* libFuzzer target for the GGUF reader (CMake target fuzz_gguf in a clang
 * build; `make test-fuzz` runs it briefly, scripts/fuzz_gguf.sh for longer).
 * Parses the input from memory, then walks everything the
 * reader returned through the public lookups, getters and hashes, so any
 * inconsistent pointer, length or index shows up under ASan/UBSan. */
#include "gguf/gguf.h"
#include <stdlib.h>

#define FUZZ_NAME "fuzz-input"

/* Volatile sink so reads of mapped bytes are not optimized away. */
static volatile uint8_t sink;

static void touch(const void *p, uint64_t n) {
    if (n == 0) return;
    const uint8_t *b = p;
    sink ^= b[0];
    sink ^= b[n - 1];
}

static void walk_value(const gguf_value *v, int depth) {
    if (depth > 16) __builtin_trap(); /* the reader limits nesting */
    if (v->type == GGUF_VT_STRING) touch(v->v.str.ptr, v->v.str.len);
    if (v->type != GGUF_VT_ARRAY) return;
    uint64_t n = v->v.arr.n;
    int64_t i64;
    double f64;
    if (n > 0) {
        gguf_arr_get_i64(v, 0, &i64);
        gguf_arr_get_f64(v, n - 1, &f64);
    }
    if (gguf_arr_get_i64(v, n, &i64) || gguf_arr_get_f64(v, n, &f64)) __builtin_trap();
    switch (v->v.arr.elem_type) {
    case GGUF_VT_STRING:
        for (uint64_t i = 0; i < n; i++) touch(v->v.arr.strs[i].ptr, v->v.arr.strs[i].len);
        break;
    case GGUF_VT_ARRAY:
        for (uint64_t i = 0; i < n; i++) walk_value(&v->v.arr.items[i], depth + 1);
        break;
    default:
        if (n > 0) touch(v->v.arr.raw, n); /* at least n bytes for any fixed type */
        break;
    }
}

static void exercise_getters(const gguf_file *f, const char *key) {
    mu_error err;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    char *s = NULL;
    gguf_get_u32(f, key, &u32, &err);
    gguf_get_u64(f, key, &u64, &err);
    gguf_get_i64(f, key, &i64, &err);
    gguf_get_f32(f, key, &f32, &err);
    gguf_get_bool(f, key, &b, &err);
    if (gguf_get_str(f, key, &s, &err) == 1) free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mu_error err;
    err.msg[0] = '\0';
    gguf_file *f = gguf_open_memory(data, size, FUZZ_NAME, &err);
    if (!f) {
        /* Every refusal must carry a message naming the input. */
        if (strncmp(err.msg, FUZZ_NAME ": ", strlen(FUZZ_NAME) + 2)) __builtin_trap();
        return 0;
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        if (gguf_find_key(f, kv->key) != (int64_t)i || gguf_get(f, kv->key) != &kv->val) __builtin_trap();
        walk_value(&kv->val, 0);
        exercise_getters(f, kv->key);
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (gguf_find_tensor(f, t->name) != t) __builtin_trap();
        if (t->offset % f->alignment || t->file_offset + t->nbytes > f->size) __builtin_trap();
        touch(t->data, t->nbytes);
    }
    exercise_getters(f, "general.alignment");
    exercise_getters(f, "no.such.key");
    if (gguf_find_tensor(f, "no.such.tensor")) __builtin_trap();
    char hex[65];
    gguf_sha256_tokenizer(f, hex);
    gguf_sha256_chat_template(f, hex);
    gguf_close(f);
    return 0;
}
