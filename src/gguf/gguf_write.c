/* GGUF v3 writer.
 *
 * Layout written (what llama.cpp expects): header, key/values in insertion
 * order, tensor infos, zero padding to the alignment (= data section start),
 * then each tensor at its offset relative to the data section, every offset
 * a multiple of the alignment and each tensor zero-padded to it, so the
 * file ends on an aligned boundary. The alignment is general.alignment when
 * set (it must be a uint32 power of two), else 32.
 *
 * The file is written to "<path>.tmp.<pid>" and renamed over <path> only by
 * a successful finish: a failed or abandoned write leaves no partial file.
 *
 * Setter misuse (bad key, unknown tensor type, duplicate tensor...) is
 * recorded as a sticky error reported by gguf_writer_write_file/begin. */
#include "gguf/gguf_internal.h"
#include "quant/quant.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Already-encoded GGUF bytes (util/common.h's buffer). */
typedef mu_buf bytes;

typedef struct wkv {
    char *key;
    bytes val; /* value type id (u32) followed by the encoded value */
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t nbytes;
    uint64_t offset; /* relative to the data section, set by layout() */
    const void *data;
} wtensor;

/* ggml refuses tensor names of GGML_MAX_NAME (64) bytes or more; the reader
 * is more lenient (GGUF_MAX_TENSOR_NAME_LEN) but files written here must
 * load in llama.cpp. */
#define GGUF_WRITER_MAX_TENSOR_NAME_LEN 63u

struct gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    gguf_name_index tensor_names;
    char error[768]; /* first misuse, reported at write time */
    /* set by begin */
    int fd;
    char *path, *tmp_path;
    uint64_t alignment, data_offset, total_size;
    bool laid_out; /* offsets valid (after a successful begin) */
};

/* ---------------- encoding ---------------- */

static void put(bytes *b, const void *src, size_t n) { mu_buf_append(b, src, n); }

static void put_u8(bytes *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(bytes *b, uint16_t v) { uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)}; put(b, x, 2); }
static void put_u32(bytes *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    put(b, x, 4);
}
static void put_u64(bytes *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}
static void put_str(bytes *b, const char *s, uint64_t len) {
    put_u64(b, len);
    put(b, s, (size_t)len);
}

static void put_scalar(bytes *b, gguf_vtype t, const gguf_value *v) {
    switch (t) {
    case GGUF_VT_UINT8: put_u8(b, (uint8_t)v->v.u64); break;
    case GGUF_VT_INT8: put_u8(b, (uint8_t)v->v.i64); break;
    case GGUF_VT_UINT16: put_u16(b, (uint16_t)v->v.u64); break;
    case GGUF_VT_INT16: put_u16(b, (uint16_t)v->v.i64); break;
    case GGUF_VT_UINT32: put_u32(b, (uint32_t)v->v.u64); break;
    case GGUF_VT_INT32: put_u32(b, (uint32_t)v->v.i64); break;
    case GGUF_VT_UINT64: put_u64(b, v->v.u64); break;
    case GGUF_VT_INT64: put_u64(b, (uint64_t)v->v.i64); break;
    case GGUF_VT_FLOAT32: put_u32(b, mu_f32_bits((float)v->v.f64)); break;
    case GGUF_VT_FLOAT64: {
        uint64_t u;
        memcpy(&u, &v->v.f64, 8);
        put_u64(b, u);
        break;
    }
    case GGUF_VT_BOOL: put_u8(b, v->v.b ? 1 : 0); break;
    default: break;
    }
}

/* Element type, count and elements of an array value (no leading type id). */
static void put_array_body(bytes *b, const gguf_value *v) {
    gguf_vtype et = v->v.arr.elem_type;
    uint64_t n = v->v.arr.n;
    put_u32(b, et);
    put_u64(b, n);
    if (et == GGUF_VT_STRING) {
        for (uint64_t i = 0; i < n; i++) put_str(b, v->v.arr.strs[i].ptr, v->v.arr.strs[i].len);
    } else if (et == GGUF_VT_ARRAY) {
        for (uint64_t i = 0; i < n; i++) put_array_body(b, &v->v.arr.items[i]);
    } else {
        put(b, v->v.arr.raw, (size_t)(n * gguf_vtype_fixed_size(et)));
    }
}

static void put_value(bytes *b, const gguf_value *v) {
    put_u32(b, v->type);
    if (v->type == GGUF_VT_STRING) put_str(b, v->v.str.ptr, v->v.str.len);
    else if (v->type == GGUF_VT_ARRAY) put_array_body(b, v);
    else put_scalar(b, v->type, v);
}

/* ---------------- keys ---------------- */

__attribute__((format(printf, 2, 3)))
static void misuse(gguf_writer *w, const char *fmt, ...) {
    if (w->error[0]) return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->error, sizeof w->error, fmt, ap);
    va_end(ap);
}

static bool valid_name(const char *s, size_t max) {
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max) return false;
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] < 0x20 || s[i] == 0x7f) return false;
    return true;
}

/* The slot for key (existing one reused: replace in place), value cleared. */
static bytes *key_slot(gguf_writer *w, const char *key) {
    if (w->fd >= 0) {
        misuse(w, "key set after begin");
        return NULL;
    }
    if (!valid_name(key, GGUF_MAX_KEY_LEN)) {
        char esc[200];
        gguf_escape(esc, sizeof esc, key ? key : "", key ? strlen(key) : 0, 100);
        misuse(w, "invalid key '%s' (must be 1..%u bytes without control characters)",
               esc, GGUF_MAX_KEY_LEN);
        return NULL;
    }
    for (size_t i = 0; i < w->n_kv; i++) { /* writers hold tens of keys: linear is fine */
        if (!strcmp(w->kvs[i].key, key)) {
            w->kvs[i].val.len = 0;
            return &w->kvs[i].val;
        }
    }
    if (w->n_kv == w->cap_kv) {
        w->cap_kv = w->cap_kv ? w->cap_kv * 2 : 16;
        w->kvs = mu_xrealloc(w->kvs, w->cap_kv * sizeof *w->kvs);
    }
    wkv *kv = &w->kvs[w->n_kv++];
    kv->key = mu_xstrdup(key);
    kv->val = (bytes){0};
    return &kv->val;
}

static void set_scalar(gguf_writer *w, const char *key, gguf_value v) {
    bytes *b = w ? key_slot(w, key) : NULL;
    if (b) put_value(b, &v);
}

#define SCALAR(t, field, x) ((gguf_value){.type = (t), .v.field = (x)})
void gguf_writer_set_u8(gguf_writer *w, const char *k, uint8_t v) { set_scalar(w, k, SCALAR(GGUF_VT_UINT8, u64, v)); }
void gguf_writer_set_i8(gguf_writer *w, const char *k, int8_t v) { set_scalar(w, k, SCALAR(GGUF_VT_INT8, i64, v)); }
void gguf_writer_set_u16(gguf_writer *w, const char *k, uint16_t v) { set_scalar(w, k, SCALAR(GGUF_VT_UINT16, u64, v)); }
void gguf_writer_set_i16(gguf_writer *w, const char *k, int16_t v) { set_scalar(w, k, SCALAR(GGUF_VT_INT16, i64, v)); }
void gguf_writer_set_u32(gguf_writer *w, const char *k, uint32_t v) { set_scalar(w, k, SCALAR(GGUF_VT_UINT32, u64, v)); }
void gguf_writer_set_i32(gguf_writer *w, const char *k, int32_t v) { set_scalar(w, k, SCALAR(GGUF_VT_INT32, i64, v)); }
void gguf_writer_set_u64(gguf_writer *w, const char *k, uint64_t v) { set_scalar(w, k, SCALAR(GGUF_VT_UINT64, u64, v)); }
void gguf_writer_set_i64(gguf_writer *w, const char *k, int64_t v) { set_scalar(w, k, SCALAR(GGUF_VT_INT64, i64, v)); }
void gguf_writer_set_f32(gguf_writer *w, const char *k, float v) { set_scalar(w, k, SCALAR(GGUF_VT_FLOAT32, f64, v)); }
void gguf_writer_set_f64(gguf_writer *w, const char *k, double v) { set_scalar(w, k, SCALAR(GGUF_VT_FLOAT64, f64, v)); }
void gguf_writer_set_bool(gguf_writer *w, const char *k, bool v) { set_scalar(w, k, SCALAR(GGUF_VT_BOOL, b, v)); }

void gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment) {
    if (!w) return;
    if (alignment == 0 || (alignment & (alignment - 1)))
        misuse(w, "alignment %u is not a non-zero power of two", alignment);
    gguf_writer_set_u32(w, "general.alignment", alignment);
}

void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v) {
    if (!w) return;
    if (!v) {
        misuse(w, "NULL string for key '%s'", key ? key : "(null)");
        return;
    }
    bytes *b = key_slot(w, key);
    if (!b) return;
    put_u32(b, GGUF_VT_STRING);
    put_str(b, v, strlen(v));
}

void gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                         const void *data, uint64_t n) {
    if (!w) return;
    uint32_t size = gguf_vtype_fixed_size(elem_type);
    uint64_t total;
    if (!size || (n && !data) || !mu_mul_u64(n, size, &total) || total > SIZE_MAX / 2) {
        misuse(w, "key '%s': invalid fixed-size array (element type %s, %" PRIu64 " elements)",
               key ? key : "(null)", gguf_vtype_name(elem_type), n);
        return;
    }
    bytes *b = key_slot(w, key);
    if (!b) return;
    put_u32(b, GGUF_VT_ARRAY);
    put_u32(b, elem_type);
    put_u64(b, n);
    /* Host values to little-endian, element by element. */
    const uint8_t *src = data;
    for (uint64_t i = 0; i < n; i++, src += size) {
        uint64_t u = 0;
        switch (size) {
        case 1: put_u8(b, src[0]); break;
        case 2: { uint16_t x; memcpy(&x, src, 2); put_u16(b, x); break; }
        case 4: { uint32_t x; memcpy(&x, src, 4); put_u32(b, x); break; }
        default: memcpy(&u, src, 8); put_u64(b, u); break;
        }
        if (elem_type == GGUF_VT_BOOL && src[0] > 1) b->p[b->len - 1] = 1;
    }
}

void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    if (!w) return;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i]) {
            misuse(w, "key '%s': string array element %" PRIu64 " is NULL", key ? key : "(null)", i);
            return;
        }
    }
    bytes *b = key_slot(w, key);
    if (!b) return;
    put_u32(b, GGUF_VT_ARRAY);
    put_u32(b, GGUF_VT_STRING);
    put_u64(b, n);
    for (uint64_t i = 0; i < n; i++) put_str(b, strs[i], strlen(strs[i]));
}

/* Arrays enclosing the deepest element of v (0 for scalars). */
static int array_depth(const gguf_value *v) {
    if (v->type != GGUF_VT_ARRAY) return 0;
    int deepest = 0;
    if (v->v.arr.elem_type == GGUF_VT_ARRAY)
        for (uint64_t i = 0; i < v->v.arr.n && deepest <= GGUF_MAX_ARRAY_DEPTH; i++) {
            int d = array_depth(&v->v.arr.items[i]);
            if (d > deepest) deepest = d;
        }
    return 1 + deepest;
}

void gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv) {
    if (!w || !kv) return;
    if ((unsigned)kv->val.type >= GGUF_VT_COUNT || array_depth(&kv->val) > GGUF_MAX_ARRAY_DEPTH) {
        misuse(w, "key '%s': invalid type or arrays nested deeper than %d levels",
               kv->key ? kv->key : "(null)", GGUF_MAX_ARRAY_DEPTH);
        return;
    }
    bytes *b = key_slot(w, kv->key);
    if (b) put_value(b, &kv->val);
}

/* ---------------- tensors ---------------- */

int64_t gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne, const void *data) {
    if (!w) return -1;
    if (w->fd >= 0) {
        misuse(w, "tensor added after begin");
        return -1;
    }
    char esc[300];
    gguf_escape(esc, sizeof esc, name ? name : "", name ? strlen(name) : 0, 200);
    if (!valid_name(name, GGUF_WRITER_MAX_TENSOR_NAME_LEN)) {
        misuse(w, "invalid tensor name '%s' (must be 1..%u bytes without control characters)",
               esc, GGUF_WRITER_MAX_TENSOR_NAME_LEN);
        return -1;
    }
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t n_elems;
    if (!ne || n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        misuse(w, "tensor '%s': n_dims %u is outside 1..%d", esc, n_dims, GGUF_MAX_DIMS);
        return -1;
    }
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t.ne[d] = d < n_dims ? ne[d] : 1;
    if (!gguf_tensor_nbytes(type, n_dims, t.ne, &n_elems, &t.nbytes)) {
        misuse(w, "tensor '%s': type %u with shape [%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64
               "] is invalid (unknown type, zero dimension, row not a multiple of the block, or overflow)",
               esc, type, t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
        return -1;
    }
    t.name = mu_xstrdup(name);
    int64_t idx = (int64_t)w->n_tensors;
    int64_t prev = gguf_index_insert(&w->tensor_names, t.name, idx);
    if (prev != -1) {
        misuse(w, "tensor '%s' added twice", esc);
        free(t.name);
        return -1;
    }
    if (w->n_tensors == w->cap_tensors) {
        w->cap_tensors = w->cap_tensors ? w->cap_tensors * 2 : 64;
        w->tensors = mu_xrealloc(w->tensors, w->cap_tensors * sizeof *w->tensors);
    }
    w->tensors[w->n_tensors++] = t;
    return idx;
}

/* ---------------- output ---------------- */

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = mu_xcalloc(1, sizeof *w);
    if (!gguf_index_init(&w->tensor_names, 64)) {
        free(w);
        return NULL;
    }
    w->fd = -1;
    return w;
}

static void abandon_output(gguf_writer *w) {
    if (w->fd >= 0) close(w->fd);
    if (w->tmp_path) unlink(w->tmp_path);
    w->fd = -1;
    free(w->tmp_path);
    free(w->path);
    w->tmp_path = w->path = NULL;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    abandon_output(w);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val.p);
    }
    free(w->kvs);
    for (size_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    gguf_index_free(&w->tensor_names);
    free(w);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Alignment from general.alignment (uint32 power of two) or the default. */
static bool resolve_alignment(gguf_writer *w, mu_error *err) {
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment")) continue;
        const bytes *v = &w->kvs[i].val;
        uint32_t a = v->len == 8 ? gguf_le32((const uint8_t *)v->p + 4) : 0;
        if (gguf_le32((const uint8_t *)v->p) != GGUF_VT_UINT32 || a == 0 || (a & (a - 1))) {
            mu_err_set(err, "general.alignment must be a uint32 non-zero power of two");
            return false;
        }
        w->alignment = a;
    }
    return true;
}

/* Header, key/values and tensor infos, padded to the data section; assigns
 * tensor offsets. */
static void encode_metadata(gguf_writer *w, bytes *out) {
    put_u32(out, GGUF_MAGIC);
    put_u32(out, GGUF_VERSION);
    put_u64(out, w->n_tensors);
    put_u64(out, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(out, w->kvs[i].key, strlen(w->kvs[i].key));
        put(out, w->kvs[i].val.p, w->kvs[i].val.len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = offset;
        offset = align_up(offset + t->nbytes, w->alignment);
        put_str(out, t->name, strlen(t->name));
        put_u32(out, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(out, t->ne[d]);
        put_u32(out, t->type);
        put_u64(out, t->offset);
    }
    static const uint8_t zeros[256];
    w->data_offset = align_up(out->len, w->alignment);
    while (out->len < w->data_offset) {
        uint64_t n = w->data_offset - out->len;
        put(out, zeros, n < sizeof zeros ? (size_t)n : sizeof zeros);
    }
    w->total_size = w->data_offset + offset;
}

/* Sum of padded tensor sizes must not overflow (shapes are user-controlled). */
static bool check_data_size(gguf_writer *w, mu_error *err) {
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        uint64_t end;
        if (!mu_add_u64(offset, w->tensors[i].nbytes, &end) || end > (UINT64_MAX >> 2)) {
            mu_err_set(err, "tensor data size overflows at tensor '%s'", w->tensors[i].name);
            return false;
        }
        offset = align_up(end, w->alignment);
    }
    return true;
}

static bool write_all(int fd, const void *buf, uint64_t n, uint64_t offset) {
    const uint8_t *p = buf;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)n;
        ssize_t r = pwrite(fd, p, chunk, (off_t)offset);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) errno = EIO; /* no progress and no errno: the callers print strerror(errno) */
        if (r <= 0) return false;
        p += r;
        n -= (uint64_t)r;
        offset += (uint64_t)r;
    }
    return true;
}

bool gguf_writer_begin(gguf_writer *w, const char *path, mu_error *err) {
    if (!w || !path) {
        mu_err_set(err, "gguf writer: NULL writer or path");
        return false;
    }
    if (w->fd >= 0) {
        mu_err_set(err, "%s: gguf writer already begun", path);
        return false;
    }
    if (w->error[0]) {
        mu_err_set(err, "%s: %s", path, w->error);
        return false;
    }
    if (!resolve_alignment(w, err) || !check_data_size(w, err)) {
        mu_err_prefix(err, "%s", path);
        return false;
    }
    bytes meta = {0};
    w->laid_out = false;
    encode_metadata(w, &meta);
    w->path = mu_xstrdup(path);
    size_t tlen = strlen(path) + 32;
    w->tmp_path = mu_xmalloc(tlen);
    snprintf(w->tmp_path, tlen, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        mu_err_set(err, "%s: cannot create: %s", w->tmp_path, strerror(errno));
        free(meta.p);
        abandon_output(w);
        return false;
    }
    bool ok = write_all(w->fd, meta.p, meta.len, 0);
    free(meta.p);
    w->laid_out = ok;
    if (!ok) {
        mu_err_set(err, "%s: write failed: %s", w->tmp_path, strerror(errno));
        abandon_output(w);
    }
    return ok;
}

uint64_t gguf_writer_tensor_file_offset(const gguf_writer *w, int64_t idx) {
    if (!w || !w->laid_out || idx < 0 || (uint64_t)idx >= w->n_tensors) return UINT64_MAX;
    return w->data_offset + w->tensors[idx].offset;
}

uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int64_t idx) {
    if (!w || idx < 0 || (uint64_t)idx >= w->n_tensors) return 0;
    return w->tensors[idx].nbytes;
}

int gguf_writer_fd(const gguf_writer *w) { return w ? w->fd : -1; }

bool gguf_writer_finish(gguf_writer *w, mu_error *err) {
    if (!w || w->fd < 0) {
        mu_err_set(err, "gguf writer: finish without a successful begin");
        return false;
    }
    if (w->error[0]) {
        mu_err_set(err, "%s: %s", w->path, w->error);
        abandon_output(w);
        return false;
    }
    /* Extending to the final size zero-fills the padding after the last tensor. */
    if (ftruncate(w->fd, (off_t)w->total_size) != 0 || fsync(w->fd) != 0) {
        mu_err_set(err, "%s: cannot finalize: %s", w->tmp_path, strerror(errno));
        abandon_output(w);
        return false;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        mu_err_set(err, "%s: cannot close: %s", w->tmp_path, strerror(errno));
        abandon_output(w);
        return false;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        mu_err_set(err, "%s: cannot move into place: %s", w->path, strerror(errno));
        abandon_output(w);
        return false;
    }
    free(w->tmp_path);
    w->tmp_path = NULL;
    free(w->path);
    w->path = NULL;
    return true;
}

bool gguf_writer_write_file(gguf_writer *w, const char *path, mu_error *err) {
    if (!w) {
        mu_err_set(err, "gguf writer: NULL writer");
        return false;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (!w->tensors[i].data) {
            mu_err_set(err, "%s: tensor '%s' has no data (use the streaming form)", path,
                       w->tensors[i].name);
            return false;
        }
    }
    if (!gguf_writer_begin(w, path, err)) return false;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if (!write_all(w->fd, t->data, t->nbytes, w->data_offset + t->offset)) {
            mu_err_set(err, "%s: writing tensor '%s' failed: %s", w->tmp_path, t->name, strerror(errno));
            abandon_output(w);
            return false;
        }
    }
    return gguf_writer_finish(w, err);
}
