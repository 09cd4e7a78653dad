/* Lookups and typed getters over a parsed GGUF file. */
#include "gguf/gguf_internal.h"
#include <inttypes.h>
#include <stdlib.h>

static const gguf_reader_priv *priv_of(const gguf_file *f) {
    return f ? (const gguf_reader_priv *)f->priv : NULL;
}

int64_t gguf_find_key(const gguf_file *f, const char *key) {
    const gguf_reader_priv *pv = priv_of(f);
    return pv && key ? gguf_index_find(&pv->keys, key) : -1;
}

const gguf_value *gguf_get(const gguf_file *f, const char *key) {
    int64_t i = gguf_find_key(f, key);
    return i < 0 ? NULL : &f->kv[i].val;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    const gguf_reader_priv *pv = priv_of(f);
    int64_t i = pv && name ? gguf_index_find(&pv->tensors, name) : -1;
    return i < 0 ? NULL : &f->tensors[i];
}

/* ---- typed getters ---- */

static bool is_unsigned(gguf_vtype t) {
    return t == GGUF_VT_UINT8 || t == GGUF_VT_UINT16 || t == GGUF_VT_UINT32 || t == GGUF_VT_UINT64;
}

static int wrong_type(const gguf_file *f, const char *key, const gguf_value *v,
                      const char *wanted, mu_error *err) {
    mu_err_set(err, "%s: key '%s' has type %s, which cannot be read as %s",
               f->path, key, gguf_vtype_name(v->type), wanted);
    return -1;
}

/* Integer value as a sign flag plus magnitude bits, for range checks. */
static int get_int(const gguf_file *f, const char *key, const char *wanted,
                   uint64_t max, int64_t min, bool *negative, uint64_t *bits, mu_error *err) {
    const gguf_value *v = gguf_get(f, key);
    if (!v) return 0;
    if (!gguf_vtype_is_int(v->type)) return wrong_type(f, key, v, wanted, err);
    *negative = !is_unsigned(v->type) && v->v.i64 < 0;
    *bits = v->v.u64;
    bool fits = *negative ? v->v.i64 >= min : v->v.u64 <= max;
    if (!fits) {
        if (*negative)
            mu_err_set(err, "%s: key '%s' (%s) value %" PRId64 " does not fit in %s",
                       f->path, key, gguf_vtype_name(v->type), v->v.i64, wanted);
        else
            mu_err_set(err, "%s: key '%s' (%s) value %" PRIu64 " does not fit in %s",
                       f->path, key, gguf_vtype_name(v->type), v->v.u64, wanted);
        return -1;
    }
    return 1;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, mu_error *err) {
    bool neg;
    uint64_t bits;
    int r = get_int(f, key, "uint32", UINT32_MAX, 0, &neg, &bits, err);
    if (r == 1) *out = (uint32_t)bits;
    return r;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, mu_error *err) {
    bool neg;
    uint64_t bits;
    int r = get_int(f, key, "uint64", UINT64_MAX, 0, &neg, &bits, err);
    if (r == 1) *out = bits;
    return r;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, mu_error *err) {
    bool neg;
    uint64_t bits;
    int r = get_int(f, key, "int64", INT64_MAX, INT64_MIN, &neg, &bits, err);
    if (r == 1) *out = (int64_t)bits;
    return r;
}

/* FLOAT32, or FLOAT64 whose value is exactly representable in f32. */
int gguf_get_f32(const gguf_file *f, const char *key, float *out, mu_error *err) {
    const gguf_value *v = gguf_get(f, key);
    if (!v) return 0;
    if (v->type != GGUF_VT_FLOAT32 && v->type != GGUF_VT_FLOAT64)
        return wrong_type(f, key, v, "float32", err);
    float x = (float)v->v.f64;
    if (v->type == GGUF_VT_FLOAT64 && (double)x != v->v.f64 && x == x) {
        mu_err_set(err, "%s: key '%s' (float64) value %.17g is not exactly representable as float32",
                   f->path, key, v->v.f64);
        return -1;
    }
    *out = x;
    return 1;
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, mu_error *err) {
    const gguf_value *v = gguf_get(f, key);
    if (!v) return 0;
    if (v->type != GGUF_VT_BOOL) return wrong_type(f, key, v, "bool", err);
    *out = v->v.b;
    return 1;
}

/* A string with an embedded NUL cannot be a C string: refused, not cut. */
int gguf_get_str(const gguf_file *f, const char *key, char **out, mu_error *err) {
    const gguf_value *v = gguf_get(f, key);
    if (!v) return 0;
    if (v->type != GGUF_VT_STRING) return wrong_type(f, key, v, "string", err);
    if (memchr(v->v.str.ptr, 0, v->v.str.len)) {
        mu_err_set(err, "%s: key '%s' string contains a NUL byte", f->path, key);
        return -1;
    }
    char *s = mu_xmalloc(v->v.str.len + 1);
    memcpy(s, v->v.str.ptr, v->v.str.len);
    s[v->v.str.len] = '\0';
    *out = s;
    return 1;
}

/* ---- array elements ---- */

static const uint8_t *fixed_elem(const gguf_value *arr, uint64_t idx) {
    if (!arr || arr->type != GGUF_VT_ARRAY || idx >= arr->v.arr.n) return NULL;
    uint32_t size = gguf_vtype_fixed_size(arr->v.arr.elem_type);
    return size ? arr->v.arr.raw + idx * size : NULL;
}

/* Integer and bool elements; false for other types, idx out of range, or a
 * uint64 beyond INT64_MAX. */
bool gguf_arr_get_i64(const gguf_value *arr, uint64_t idx, int64_t *out) {
    const uint8_t *b = fixed_elem(arr, idx);
    if (!b) return false;
    switch (arr->v.arr.elem_type) {
    case GGUF_VT_UINT8: case GGUF_VT_BOOL: *out = b[0]; return true;
    case GGUF_VT_INT8: *out = (int8_t)b[0]; return true;
    case GGUF_VT_UINT16: *out = gguf_le16(b); return true;
    case GGUF_VT_INT16: *out = (int16_t)gguf_le16(b); return true;
    case GGUF_VT_UINT32: *out = gguf_le32(b); return true;
    case GGUF_VT_INT32: *out = (int32_t)gguf_le32(b); return true;
    case GGUF_VT_INT64: *out = (int64_t)gguf_le64(b); return true;
    case GGUF_VT_UINT64: {
        uint64_t u = gguf_le64(b);
        if (u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)u;
        return true;
    }
    default: return false;
    }
}

/* Float elements (exact), and integer elements converted to double. */
bool gguf_arr_get_f64(const gguf_value *arr, uint64_t idx, double *out) {
    const uint8_t *b = fixed_elem(arr, idx);
    if (!b) return false;
    switch (arr->v.arr.elem_type) {
    case GGUF_VT_FLOAT32: *out = mu_bits_f32(gguf_le32(b)); return true;
    case GGUF_VT_FLOAT64: {
        uint64_t u = gguf_le64(b);
        memcpy(out, &u, 8);
        return true;
    }
    case GGUF_VT_UINT64: *out = (double)gguf_le64(b); return true;
    case GGUF_VT_BOOL: return false;
    default: {
        int64_t i;
        if (!gguf_arr_get_i64(arr, idx, &i)) return false;
        *out = (double)i;
        return true;
    }
    }
}
