/* Small pieces shared by the GGUF reader and writer: value-type facts,
 * tensor byte lengths, the name index, and escaping untrusted text. */
#include "gguf/gguf_internal.h"
#include "quant/quant.h"
#include <stdio.h>
#include <stdlib.h>

static const char *const VTYPE_NAMES[GGUF_VT_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
    "string", "array", "uint64", "int64", "float64",
};

const char *gguf_vtype_name(gguf_vtype t) {
    return (unsigned)t < GGUF_VT_COUNT ? VTYPE_NAMES[t] : "unknown";
}

uint32_t gguf_vtype_fixed_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

bool gguf_vtype_is_int(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_UINT16: case GGUF_VT_INT16:
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_UINT64: case GGUF_VT_INT64:
        return true;
    default:
        return false;
    }
}

bool gguf_tensor_nbytes(uint32_t type, uint32_t n_dims, const uint64_t *ne,
                        uint64_t *n_elems, uint64_t *nbytes) {
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) return false;
    uint64_t elems = 1, rows = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || !mu_mul_u64(elems, ne[d], &elems) || elems > (uint64_t)INT64_MAX)
            return false;
        if (d > 0) rows *= ne[d]; /* rows <= elems: cannot overflow */
    }
    uint64_t row_bytes;
    if (!mu_type_row_bytes(type, ne[0], &row_bytes)) return false;
    if (!mu_mul_u64(row_bytes, rows, nbytes)) return false;
    *n_elems = elems;
    return true;
}

/* ---- name index ---- */

static uint64_t name_hash(const char *s) { /* FNV-1a, 64-bit */
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

bool gguf_index_init(gguf_name_index *ix, uint64_t expected) {
    uint64_t cap = 16;
    while (cap < expected * 2 && cap < ((uint64_t)1 << 62)) cap <<= 1;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    ix->count = 0;
    return ix->slots != NULL;
}

void gguf_index_free(gguf_name_index *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->mask = ix->count = 0;
}

static gguf_name_slot *probe(const gguf_name_index *ix, const char *name, uint64_t h) {
    for (uint64_t i = h & ix->mask;; i = (i + 1) & ix->mask) {
        gguf_name_slot *s = &ix->slots[i];
        if (!s->name || (s->hash == h && !strcmp(s->name, name))) return s;
    }
}

static bool grow(gguf_name_index *ix) {
    gguf_name_index bigger;
    if (!gguf_index_init(&bigger, (ix->mask + 1))) return false;
    for (uint64_t i = 0; i <= ix->mask; i++) {
        if (ix->slots[i].name) *probe(&bigger, ix->slots[i].name, ix->slots[i].hash) = ix->slots[i];
    }
    bigger.count = ix->count;
    free(ix->slots);
    *ix = bigger;
    return true;
}

int64_t gguf_index_insert(gguf_name_index *ix, const char *name, int64_t idx) {
    if ((ix->count + 1) * 2 > ix->mask + 1 && !grow(ix)) return -2;
    uint64_t h = name_hash(name);
    gguf_name_slot *s = probe(ix, name, h);
    if (s->name) return s->idx;
    s->hash = h;
    s->name = name;
    s->idx = idx;
    ix->count++;
    return -1;
}

int64_t gguf_index_find(const gguf_name_index *ix, const char *name) {
    if (!ix->slots || !name) return -1;
    gguf_name_slot *s = probe(ix, name, name_hash(name));
    return s->name ? s->idx : -1;
}

void gguf_escape(char *out, size_t cap, const char *s, uint64_t len, size_t max) {
    size_t o = 0;
    if (cap == 0) return;
    for (uint64_t i = 0; i < len; i++) {
        uint8_t c = (uint8_t)s[i];
        char tmp[5];
        int n = (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')
                    ? snprintf(tmp, sizeof tmp, "%c", c)
                    : snprintf(tmp, sizeof tmp, "\\x%02x", c);
        if (i >= max || o + (size_t)n + 4 > cap) { /* keep room for "..." */
            if (o + 4 <= cap) { memcpy(out + o, "...", 3); o += 3; }
            break;
        }
        memcpy(out + o, tmp, (size_t)n);
        o += (size_t)n;
    }
    out[o] = '\0';
}
