/* GGUF v3 reader: one read-only mmap (or caller memory), validated in full
 * before anything is returned.
 *
 * Memory is bounded by O(file size): every count read from the file is first
 * checked against the bytes that remain (each element needs at least its
 * minimal encoded size), and only then allocated. All allocations of one
 * parse live in an arena freed by gguf_close (or on any error). */
#include "gguf/gguf_internal.h"
#include "quant/quant.h"
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Minimal encoded sizes, used to bound counts before allocating. */
#define MIN_KV_BYTES 14u     /* key len 8 + 1 key byte + type 4 + 1 value byte */
#define MIN_TENSOR_BYTES 33u /* name len 8 + 1 + n_dims 4 + one dim 8 + type 4 + offset 8 */
#define MIN_STRING_BYTES 8u  /* length prefix */
#define MIN_ARRAY_BYTES 12u  /* element type 4 + count 8 */

/* ---------------- arena ---------------- */

struct gguf_arena_block {
    gguf_arena_block *next;
    size_t used, cap;
    max_align_t data[];
};

#define ARENA_BLOCK_BYTES ((size_t)1 << 16)

/* Zeroed, max-aligned storage for n bytes; NULL on allocation failure. */
static void *arena_alloc(gguf_reader_priv *pv, uint64_t n) {
    const size_t align = sizeof(max_align_t);
    if (n > SIZE_MAX / 2) return NULL;
    size_t need = ((size_t)n + align - 1) / align * align;
    gguf_arena_block *b = pv->blocks;
    if (!b || b->cap - b->used < need) {
        size_t cap = need > ARENA_BLOCK_BYTES ? need : ARENA_BLOCK_BYTES;
        b = calloc(1, sizeof *b + cap);
        if (!b) return NULL;
        b->cap = cap;
        if (need >= ARENA_BLOCK_BYTES && pv->blocks) {
            /* A big one-off allocation: keep the current block open. */
            b->next = pv->blocks->next;
            pv->blocks->next = b;
        } else {
            b->next = pv->blocks;
            pv->blocks = b;
        }
    }
    void *p = (char *)b->data + b->used;
    b->used += need;
    return p;
}

static void priv_free(gguf_reader_priv *pv) {
    if (!pv) return;
    for (gguf_arena_block *b = pv->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    gguf_index_free(&pv->keys);
    gguf_index_free(&pv->tensors);
    free(pv);
}

/* ---------------- parser state and errors ---------------- */

typedef struct parser {
    gguf_file *f;
    gguf_reader_priv *pv;
    const uint8_t *base;
    uint64_t size, pos;
    mu_error *err;
    char subject[400]; /* what is being parsed, e.g. "key 'general.name'" */
} parser;

static uint64_t remaining(const parser *p) { return p->size - p->pos; }

/* Every reader error: "<path>: offset <n>: <subject>: <message>". */
__attribute__((format(printf, 3, 4)))
static bool fail_at(parser *p, uint64_t off, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->subject[0])
        mu_err_set(p->err, "%s: offset %" PRIu64 ": %s: %s", p->f->path, off, p->subject, msg);
    else
        mu_err_set(p->err, "%s: offset %" PRIu64 ": %s", p->f->path, off, msg);
    return false;
}

__attribute__((format(printf, 2, 3)))
static void set_subject(parser *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->subject, sizeof p->subject, fmt, ap);
    va_end(ap);
}

static void set_subject_name(parser *p, const char *kind, const char *s, uint64_t len) {
    char esc[300];
    gguf_escape(esc, sizeof esc, s, len, 200);
    set_subject(p, "%s '%s'", kind, esc);
}

static void *alloc_or_fail(parser *p, uint64_t n) {
    void *q = arena_alloc(p->pv, n);
    if (!q) fail_at(p, p->pos, "out of memory allocating %" PRIu64 " bytes", n);
    return q;
}

/* ---------------- primitive reads ---------------- */

/* n more bytes must exist; `what` + `suffix` names the field for the message
 * (two parts so the hot path never formats). */
static bool need2(parser *p, uint64_t n, const char *what, const char *suffix) {
    if (remaining(p) >= n) return true;
    return fail_at(p, p->pos, "truncated file while reading %s%s: needs %" PRIu64
                   " bytes, only %" PRIu64 " remain", what, suffix, n, remaining(p));
}

static bool need(parser *p, uint64_t n, const char *what) { return need2(p, n, what, ""); }

static bool read_u32(parser *p, const char *what, uint32_t *out) {
    if (!need(p, 4, what)) return false;
    *out = gguf_le32(p->base + p->pos);
    p->pos += 4;
    return true;
}

static bool read_u64(parser *p, const char *what, uint64_t *out) {
    if (!need(p, 8, what)) return false;
    *out = gguf_le64(p->base + p->pos);
    p->pos += 8;
    return true;
}

/* A length-prefixed string; the bytes stay in the mapping. */
static bool read_str(parser *p, const char *what, gguf_str *out) {
    uint64_t at = p->pos;
    if (!need2(p, 8, what, " length")) return false;
    uint64_t len = gguf_le64(p->base + p->pos);
    p->pos += 8;
    if (len > remaining(p))
        return fail_at(p, at, "%s length %" PRIu64 " exceeds the %" PRIu64 " bytes remaining",
                       what, len, remaining(p));
    out->len = len;
    out->ptr = (const char *)p->base + p->pos;
    p->pos += len;
    return true;
}

/* Keys and tensor names: non-empty, bounded, no control bytes (they become
 * C strings and appear in messages). */
static bool check_name(parser *p, uint64_t at, const char *kind, gguf_str s, uint64_t max) {
    if (s.len == 0) return fail_at(p, at, "empty %s", kind);
    if (s.len > max)
        return fail_at(p, at, "%s length %" PRIu64 " exceeds the limit of %" PRIu64, kind, s.len, max);
    for (uint64_t i = 0; i < s.len; i++) {
        uint8_t c = (uint8_t)s.ptr[i];
        if (c < 0x20 || c == 0x7f) {
            char esc[300];
            gguf_escape(esc, sizeof esc, s.ptr, s.len, 200);
            return fail_at(p, at, "%s '%s' contains control byte 0x%02x at position %" PRIu64,
                           kind, esc, c, i);
        }
    }
    return true;
}

static char *copy_cstr(parser *p, gguf_str s) {
    char *c = alloc_or_fail(p, s.len + 1);
    if (c) memcpy(c, s.ptr, s.len); /* arena memory is zeroed: NUL-terminated */
    return c;
}

/* ---------------- values ---------------- */

static bool read_array_body(parser *p, gguf_value *v, int depth);

static bool read_scalar(parser *p, gguf_vtype t, gguf_value *v) {
    uint32_t size = gguf_vtype_fixed_size(t);
    if (!need2(p, size, gguf_vtype_name(t), " value")) return false;
    const uint8_t *b = p->base + p->pos;
    switch (t) {
    case GGUF_VT_UINT8: v->v.u64 = b[0]; break;
    case GGUF_VT_INT8: v->v.i64 = (int8_t)b[0]; break;
    case GGUF_VT_UINT16: v->v.u64 = gguf_le16(b); break;
    case GGUF_VT_INT16: v->v.i64 = (int16_t)gguf_le16(b); break;
    case GGUF_VT_UINT32: v->v.u64 = gguf_le32(b); break;
    case GGUF_VT_INT32: v->v.i64 = (int32_t)gguf_le32(b); break;
    case GGUF_VT_UINT64: v->v.u64 = gguf_le64(b); break;
    case GGUF_VT_INT64: v->v.i64 = (int64_t)gguf_le64(b); break;
    case GGUF_VT_FLOAT32: v->v.f64 = mu_bits_f32(gguf_le32(b)); break;
    case GGUF_VT_FLOAT64: {
        uint64_t u = gguf_le64(b);
        memcpy(&v->v.f64, &u, 8);
        break;
    }
    case GGUF_VT_BOOL:
        if (b[0] > 1) return fail_at(p, p->pos, "bool value %u is not 0 or 1", b[0]);
        v->v.b = b[0] == 1;
        break;
    default:
        return fail_at(p, p->pos, "internal: %s is not a scalar type", gguf_vtype_name(t));
    }
    p->pos += size;
    return true;
}

static bool read_value(parser *p, gguf_vtype t, gguf_value *v, int depth) {
    v->type = t;
    if (t == GGUF_VT_STRING) return read_str(p, "string", &v->v.str);
    if (t == GGUF_VT_ARRAY) return read_array_body(p, v, depth);
    return read_scalar(p, t, v);
}

static bool check_bools(parser *p, const uint8_t *b, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (b[i] > 1)
            return fail_at(p, p->pos + i, "bool array element %" PRIu64 " has value %u, not 0 or 1",
                           i, b[i]);
    return true;
}

/* Element type, count, elements. depth counts enclosing arrays. */
static bool read_array_body(parser *p, gguf_value *v, int depth) {
    uint64_t at = p->pos;
    uint32_t et;
    uint64_t n;
    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return fail_at(p, at, "arrays nested deeper than %d levels", GGUF_MAX_ARRAY_DEPTH);
    if (!read_u32(p, "array element type", &et)) return false;
    if (et >= GGUF_VT_COUNT) return fail_at(p, at, "unknown array element type %u", et);
    if (!read_u64(p, "array length", &n)) return false;
    uint32_t fixed = gguf_vtype_fixed_size(et);
    uint64_t min_elem = fixed ? fixed : et == GGUF_VT_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES;
    if (n > remaining(p) / min_elem)
        return fail_at(p, at + 4, "array length %" PRIu64 " of %s needs at least %" PRIu64
                       " bytes per element but only %" PRIu64 " bytes remain",
                       n, gguf_vtype_name(et), min_elem, remaining(p));
    v->v.arr.elem_type = et;
    v->v.arr.n = n;
    if (fixed) {
        v->v.arr.raw = p->base + p->pos;
        if (et == GGUF_VT_BOOL && !check_bools(p, v->v.arr.raw, n)) return false;
        p->pos += n * fixed;
        return true;
    }
    if (et == GGUF_VT_STRING) {
        gguf_str *strs = alloc_or_fail(p, n * sizeof *strs);
        if (!strs) return false;
        v->v.arr.strs = strs;
        for (uint64_t i = 0; i < n; i++)
            if (!read_str(p, "array string", &strs[i])) return false;
        return true;
    }
    gguf_value *items = alloc_or_fail(p, n * sizeof *items);
    if (!items) return false;
    v->v.arr.items = items;
    for (uint64_t i = 0; i < n; i++) {
        items[i].type = GGUF_VT_ARRAY;
        if (!read_array_body(p, &items[i], depth + 1)) return false;
    }
    return true;
}

/* ---------------- key/value section ---------------- */

static bool read_kv(parser *p, uint64_t i) {
    gguf_kv *kv = &p->f->kv[i];
    kv->offset = p->pos;
    set_subject(p, "kv #%" PRIu64, i);
    gguf_str key;
    if (!read_str(p, "key", &key)) return false;
    if (!check_name(p, kv->offset, "key", key, GGUF_MAX_KEY_LEN)) return false;
    if (!(kv->key = copy_cstr(p, key))) return false;
    set_subject_name(p, "key", key.ptr, key.len);
    int64_t prev = gguf_index_insert(&p->pv->keys, kv->key, (int64_t)i);
    if (prev == -2) return fail_at(p, kv->offset, "out of memory indexing keys");
    if (prev >= 0)
        return fail_at(p, kv->offset, "duplicate key (first defined at offset %" PRIu64 ")",
                       p->f->kv[prev].offset);
    uint64_t type_at = p->pos;
    uint32_t t;
    if (!read_u32(p, "value type", &t)) return false;
    if (t >= GGUF_VT_COUNT) return fail_at(p, type_at, "unknown value type %u", t);
    if (!read_value(p, (gguf_vtype)t, &kv->val, 0)) return false;
    p->pv->kv_end[i] = p->pos;
    return true;
}

static bool apply_alignment(parser *p) {
    p->f->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_index_find(&p->pv->keys, "general.alignment");
    if (i < 0) return true;
    const gguf_kv *kv = &p->f->kv[i];
    set_subject(p, "key 'general.alignment'");
    if (kv->val.type != GGUF_VT_UINT32)
        return fail_at(p, kv->offset, "must be of type uint32, found %s",
                       gguf_vtype_name(kv->val.type));
    uint64_t a = kv->val.v.u64;
    if (a == 0 || (a & (a - 1)))
        return fail_at(p, kv->offset, "alignment %" PRIu64 " is not a non-zero power of two", a);
    p->f->alignment = a;
    return true;
}

/* ---------------- tensor infos ---------------- */

static bool read_tensor_shape(parser *p, gguf_tensor *t) {
    uint64_t at = p->pos;
    if (!read_u32(p, "n_dims", &t->n_dims)) return false;
    if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
        return fail_at(p, at, "n_dims %u is outside 1..%d", t->n_dims, GGUF_MAX_DIMS);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = p->pos;
        if (!read_u64(p, "dimension", &t->ne[d])) return false;
        if (t->ne[d] == 0) return fail_at(p, at, "dimension %u is zero", d);
        if (!mu_mul_u64(elems, t->ne[d], &elems) || elems > (uint64_t)INT64_MAX)
            return fail_at(p, at, "element count overflows at dimension %u (%" PRIu64 ")",
                           d, t->ne[d]);
    }
    t->n_elems = elems;
    return true;
}

static bool read_tensor_info(parser *p, uint64_t i) {
    gguf_tensor *t = &p->f->tensors[i];
    t->info_offset = p->pos;
    set_subject(p, "tensor #%" PRIu64, i);
    gguf_str name;
    if (!read_str(p, "tensor name", &name)) return false;
    if (!check_name(p, t->info_offset, "tensor name", name, GGUF_MAX_TENSOR_NAME_LEN)) return false;
    if (!(t->name = copy_cstr(p, name))) return false;
    set_subject_name(p, "tensor", name.ptr, name.len);
    int64_t prev = gguf_index_insert(&p->pv->tensors, t->name, (int64_t)i);
    if (prev == -2) return fail_at(p, t->info_offset, "out of memory indexing tensors");
    if (prev >= 0)
        return fail_at(p, t->info_offset, "duplicate tensor name (first defined at offset %" PRIu64 ")",
                       p->f->tensors[prev].info_offset);
    if (!read_tensor_shape(p, t)) return false;
    uint64_t at = p->pos;
    uint32_t be;
    if (!read_u32(p, "tensor type", &t->type)) return false;
    if (!mu_type_size(t->type, &be, NULL)) return fail_at(p, at, "unknown tensor type id %u", t->type);
    if (t->ne[0] % be)
        return fail_at(p, at, "row length %" PRIu64 " is not a multiple of the %s block size %u",
                       t->ne[0], mu_type_name(t->type), be);
    if (!gguf_tensor_nbytes(t->type, t->n_dims, t->ne, &t->n_elems, &t->nbytes))
        return fail_at(p, at, "byte size of %" PRIu64 " %s elements overflows",
                       t->n_elems, mu_type_name(t->type));
    return read_u64(p, "tensor data offset", &t->offset);
}

/* Places every tensor in the data section: aligned, inside the file. */
static bool place_tensors(parser *p) {
    gguf_file *f = p->f;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        set_subject_name(p, "tensor", t->name, strlen(t->name));
        if (t->offset % f->alignment)
            return fail_at(p, t->info_offset, "data offset %" PRIu64
                           " is not a multiple of the alignment %" PRIu64, t->offset, f->alignment);
        uint64_t end;
        if (!mu_add_u64(f->data_offset, t->offset, &t->file_offset) ||
            !mu_add_u64(t->file_offset, t->nbytes, &end) || end > f->size)
            return fail_at(p, t->info_offset, "tensor data (%" PRIu64 " bytes at data offset %" PRIu64
                           ") extends past the end of the file (data section starts at %" PRIu64
                           ", file size %" PRIu64 ")",
                           t->nbytes, t->offset, f->data_offset, f->size);
        t->data = f->base + t->file_offset;
    }
    return true;
}

typedef struct span { uint64_t begin, end, idx; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static bool check_overlaps(parser *p) {
    gguf_file *f = p->f;
    if (f->n_tensors < 2) return true;
    span *s = malloc(f->n_tensors * sizeof *s);
    if (!s) return fail_at(p, f->data_offset, "out of memory checking tensor overlap");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        s[i] = (span){f->tensors[i].offset, f->tensors[i].offset + f->tensors[i].nbytes, i};
    qsort(s, f->n_tensors, sizeof *s, span_cmp);
    bool ok = true;
    for (uint64_t i = 1; i < f->n_tensors && ok; i++) {
        if (s[i].begin >= s[i - 1].end) continue;
        const gguf_tensor *a = &f->tensors[s[i - 1].idx], *b = &f->tensors[s[i].idx];
        set_subject_name(p, "tensor", b->name, strlen(b->name));
        char other[300];
        gguf_escape(other, sizeof other, a->name, strlen(a->name), 200);
        ok = fail_at(p, b->info_offset, "data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' [%"
                     PRIu64 ", %" PRIu64 ")", b->offset, b->offset + b->nbytes, other,
                     a->offset, a->offset + a->nbytes);
    }
    free(s);
    return ok;
}

/* ---------------- top level ---------------- */

static bool read_header(parser *p) {
    gguf_file *f = p->f;
    uint32_t magic;
    if (!read_u32(p, "magic", &magic)) return false;
    if (magic != GGUF_MAGIC) {
        char esc[32];
        gguf_escape(esc, sizeof esc, (const char *)p->base, 4, 4);
        return fail_at(p, 0, "bad magic '%s' (0x%08x), expected 'GGUF'", esc, magic);
    }
    if (!read_u32(p, "version", &f->version)) return false;
    if (f->version != GGUF_VERSION)
        return fail_at(p, 4, "unsupported GGUF version %u (0x%08x); only version %d is supported%s",
                       f->version, f->version, GGUF_VERSION,
                       f->version == 0x03000000u ? " (this looks like a big-endian file)" : "");
    if (!read_u64(p, "tensor count", &f->n_tensors)) return false;
    if (!read_u64(p, "key/value count", &f->n_kv)) return false;
    /* Both counts against the rest of the file before anything is allocated. */
    if (f->n_kv > remaining(p) / MIN_KV_BYTES)
        return fail_at(p, 16, "key/value count %" PRIu64 " cannot fit in the %" PRIu64
                       " bytes remaining (each needs at least %u)", f->n_kv, remaining(p), MIN_KV_BYTES);
    if (f->n_tensors > remaining(p) / MIN_TENSOR_BYTES)
        return fail_at(p, 8, "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                       " bytes remaining (each needs at least %u)", f->n_tensors, remaining(p),
                       MIN_TENSOR_BYTES);
    if (f->n_kv * MIN_KV_BYTES + f->n_tensors * MIN_TENSOR_BYTES > remaining(p)) /* each term <= remaining */
        return fail_at(p, 8, "tensor count %" PRIu64 " and key/value count %" PRIu64
                       " together cannot fit in the %" PRIu64 " bytes remaining",
                       f->n_tensors, f->n_kv, remaining(p));
    return true;
}

static bool parse(parser *p) {
    gguf_file *f = p->f;
    if (!read_header(p)) return false;
    f->kv = alloc_or_fail(p, f->n_kv * sizeof *f->kv);
    f->tensors = alloc_or_fail(p, f->n_tensors * sizeof *f->tensors);
    p->pv->kv_end = alloc_or_fail(p, f->n_kv * sizeof *p->pv->kv_end);
    if (!f->kv || !f->tensors || !p->pv->kv_end) return false;
    if (!gguf_index_init(&p->pv->keys, f->n_kv) || !gguf_index_init(&p->pv->tensors, f->n_tensors))
        return fail_at(p, p->pos, "out of memory creating lookup tables");
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!read_kv(p, i)) return false;
    if (!apply_alignment(p)) return false;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (!read_tensor_info(p, i)) return false;
    p->subject[0] = '\0';
    uint64_t pad = (f->alignment - p->pos % f->alignment) % f->alignment;
    if (!mu_add_u64(p->pos, pad, &f->data_offset))
        return fail_at(p, p->pos, "data section offset overflows");
    return place_tensors(p) && check_overlaps(p);
}

static gguf_file *parse_or_free(gguf_file *f, mu_error *err) {
    parser p = {.f = f, .base = f->base, .size = f->size, .err = err};
    p.pv = calloc(1, sizeof *p.pv);
    f->priv = p.pv;
    if (!p.pv) {
        mu_err_set(err, "%s: out of memory", f->path);
        gguf_close(f);
        return NULL;
    }
    if (!parse(&p)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

static gguf_file *new_file(const char *name, mu_error *err) {
    gguf_file *f = calloc(1, sizeof *f);
    char *path = name ? strdup(name) : strdup("<memory>");
    if (!f || !path) {
        free(f);
        free(path);
        mu_err_set(err, "%s: out of memory", name ? name : "<memory>");
        return NULL;
    }
    f->path = path;
    return f;
}

gguf_file *gguf_open_memory(const void *buf, uint64_t len, const char *name, mu_error *err) {
    gguf_file *f = new_file(name, err);
    if (!f) return NULL;
    f->base = buf;
    f->size = buf ? len : 0;
    return parse_or_free(f, err);
}

gguf_file *gguf_open(const char *path, mu_error *err) {
    gguf_file *f = new_file(path, err);
    if (!f) return NULL;
    int fd = gguf_open_regular(path, &f->size, err);
    if (fd < 0) {
        gguf_close(f);
        return NULL;
    }
    if (f->size > 0) {
        const uint8_t *m = gguf_map_file(fd, f->size, &f->span, path, err);
        if (!m) {
            close(fd);
            gguf_close(f);
            return NULL;
        }
        f->base = m;
        f->mapped = true;
    }
    close(fd); /* the mapping keeps the file alive */
    return parse_or_free(f, err);
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->mapped) munmap((void *)f->base, (size_t)f->span);
    priv_free(f->priv);
    free(f->path);
    free(f);
}
