/* GGUF v3 reader (one read-only mmap, zero-copy views) and writer.
 *
 * The reader validates everything before returning: magic/version, every
 * length against the bytes that remain, duplicate keys and tensor names,
 * known tensor types, shape/byte-length agreement, alignment, tensor data
 * within the file and non-overlapping. Any failure yields NULL and one
 * precise message (file, byte offset, key or tensor name). */
#ifndef MUSER_GGUF_H
#define MUSER_GGUF_H
#include "util/common.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_VERSION 3
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef enum gguf_vtype {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT
} gguf_vtype;

const char *gguf_vtype_name(gguf_vtype t);

/* A string inside the mapping: not NUL-terminated. */
typedef struct gguf_str {
    uint64_t len;
    const char *ptr;
} gguf_str;

typedef struct gguf_value gguf_value;
struct gguf_value {
    gguf_vtype type;
    union {
        uint64_t u64;   /* UINT8/16/32/64 widened */
        int64_t i64;    /* INT8/16/32/64 widened */
        double f64;     /* FLOAT32/64 widened (FLOAT32 exact) */
        bool b;
        gguf_str str;
        struct {
            gguf_vtype elem_type;
            uint64_t n;
            const uint8_t *raw;       /* fixed-size element types: n * size bytes in the map */
            const gguf_str *strs;     /* elem_type STRING: n entries (allocated) */
            const gguf_value *items;  /* elem_type ARRAY: n nested values (allocated) */
        } arr;
    } v;
};

typedef struct gguf_kv {
    char *key;              /* NUL-terminated copy */
    uint64_t offset;        /* file offset of the key record */
    gguf_value val;
} gguf_kv;

typedef struct gguf_tensor {
    char *name;             /* NUL-terminated copy */
    uint32_t type;          /* ggml type id (see quant/quant.h) */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous (input) dimension; unused dims are 1 */
    uint64_t n_elems;
    uint64_t offset;        /* relative to the data section */
    uint64_t file_offset;   /* absolute */
    uint64_t nbytes;
    const uint8_t *data;    /* pointer into the mapping */
    uint64_t info_offset;   /* file offset of the tensor-info record (for errors) */
} gguf_tensor;

typedef struct gguf_file {
    char *path;
    const uint8_t *base;    /* whole file: a read-only private mapping (or caller memory) */
    uint64_t size;
    bool mapped;
    bool resident;          /* gguf_make_resident swapped in an anonymous copy */
    uint64_t span;          /* mapped: the owned address range, size rounded up to 2 MiB */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    void *priv;             /* reader-owned allocations, lookup tables */
} gguf_file;

gguf_file *gguf_open(const char *path, mu_error *err);
/* Parse caller memory (fuzzing, tests). buf must outlive the result. */
gguf_file *gguf_open_memory(const void *buf, uint64_t len, const char *name, mu_error *err);
void gguf_close(gguf_file *f);
/* Replace a mapped file's pages by a private anonymous copy at the same
 * addresses, on transparent huge pages where the kernel grants them (one
 * TLB entry per 2 MiB instead of per 4 KiB for the weight streams), read-only
 * like the mapping. The process then holds the file's size in anonymous
 * memory rather than sharing the page cache. False (nothing changed) if the
 * file is not mapped, if it would not fit in MemAvailable with 1/8 (at
 * least 512 MiB) to spare, or if the kernel refuses; true if already
 * resident. */
bool gguf_make_resident(gguf_file *f);

/* Lookup: index or -1. */
int64_t gguf_find_key(const gguf_file *f, const char *key);
const gguf_value *gguf_get(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters. Return 1 found (and *out set), 0 missing, -1 present with a
 * type that cannot represent the request (err names key and both types).
 * Integer getters accept any integer type whose value fits. */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, mu_error *err);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, mu_error *err);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, mu_error *err);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, mu_error *err);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, mu_error *err);
/* String as a NUL-terminated heap copy the caller frees. */
int gguf_get_str(const gguf_file *f, const char *key, char **out, mu_error *err);
/* Array element accessors (no bounds assumptions: idx < arr.n checked). */
bool gguf_arr_get_i64(const gguf_value *arr, uint64_t idx, int64_t *out);
bool gguf_arr_get_f64(const gguf_value *arr, uint64_t idx, double *out);

/* Identity hashes (SHA-256, lowercase hex, 65 bytes incl. NUL).
 * file: streamed over the whole file; progress(done,total,ctx) may be NULL.
 * tokenizer: over a canonical serialization of every tokenizer.* key except
 *   tokenizer.chat_template* (key name, type, value bytes in file order).
 * chat_template: over the raw bytes of tokenizer.chat_template (all zeros
 *   hex "" if absent: returns false). */
bool gguf_sha256_file(const char *path, char hex[65],
                      void (*progress)(uint64_t done, uint64_t total, void *ctx), void *ctx,
                      mu_error *err);
void gguf_sha256_tokenizer(const gguf_file *f, char hex[65]);
bool gguf_sha256_chat_template(const gguf_file *f, char hex[65]);

/* ---------------- writer ----------------
 * Usage: w = gguf_writer_new(); set keys; add tensor infos; then either
 * gguf_writer_write_file() with every tensor's data pointer given, or the
 * streaming form: gguf_writer_begin() writes header + infos + pads, returns
 * each tensor's absolute file offset (gguf_writer_tensor_file_offset) so
 * producers may pwrite() data in parallel, and gguf_writer_finish() sets the
 * final size. Keys are written in insertion order; setting a key twice
 * replaces the value in place. */
typedef struct gguf_writer gguf_writer;

gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);
void gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment); /* also writes general.alignment */
void gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
void gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
void gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
void gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
void gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
void gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
void gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
void gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (elem_type not STRING/ARRAY); data copied. */
void gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                         const void *data, uint64_t n);
void gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Copy one key/value (any type, nested arrays included) from a reader. */
void gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv);
/* Returns the tensor index. data may be NULL for the streaming form.
 * Byte length is derived from type and shape (quant/quant.h traits). */
int64_t gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne, const void *data);
bool gguf_writer_write_file(gguf_writer *w, const char *path, mu_error *err);
bool gguf_writer_begin(gguf_writer *w, const char *path, mu_error *err);
uint64_t gguf_writer_tensor_file_offset(const gguf_writer *w, int64_t idx);
uint64_t gguf_writer_tensor_nbytes(const gguf_writer *w, int64_t idx);
int gguf_writer_fd(const gguf_writer *w); /* open fd after begin, for pwrite */
bool gguf_writer_finish(gguf_writer *w, mu_error *err);

#endif
