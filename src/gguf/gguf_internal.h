/* Internals shared by the GGUF reader, writer and hashes (not public API). */
#ifndef MUSER_GGUF_INTERNAL_H
#define MUSER_GGUF_INTERNAL_H
#include "gguf/gguf.h"

/* Limits the reader enforces (the writer refuses to produce anything the
 * reader would reject). */
#define GGUF_MAX_KEY_LEN 65535u
#define GGUF_MAX_TENSOR_NAME_LEN 256u
#define GGUF_MAX_ARRAY_DEPTH 8 /* arrays nested inside arrays; bounds recursion */

/* Little-endian loads from possibly unaligned bytes, independent of host order. */
static inline uint16_t gguf_le16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t gguf_le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t gguf_le64(const uint8_t *p) {
    return (uint64_t)gguf_le32(p) | ((uint64_t)gguf_le32(p + 4) << 32);
}

/* Encoded size of one element of a fixed-size value type; 0 for STRING,
 * ARRAY and unknown ids. */
uint32_t gguf_vtype_fixed_size(uint32_t t);
bool gguf_vtype_is_int(uint32_t t);

/* Open path read-only, refusing anything but a regular file: "PATH: is not a
 * regular file (a FIFO)". The type is checked with stat() before open(),
 * because opening a FIFO blocks until a writer appears (`muser info -m fifo`
 * would hang), and again with fstat() on the descriptor (opened
 * O_NONBLOCK) in case the path was swapped in between. Returns the
 * descriptor with *size set, or -1 with err set (strerror(errno) for system
 * errors). */
int gguf_open_regular(const char *path, uint64_t *size, mu_error *err);

/* Map `size` bytes of fd read-only and private at a 2 MiB boundary; *span
 * gets the owned range (size rounded up to 2 MiB, the tail inaccessible). */
const uint8_t *gguf_map_file(int fd, uint64_t size, uint64_t *span, const char *path, mu_error *err);

/* Byte length of a tensor: whole rows of ne[0] values of `type`. False if
 * the type is unknown, ne[0] is not a multiple of its block, a dimension is
 * zero, or the element count exceeds INT64_MAX. */
bool gguf_tensor_nbytes(uint32_t type, uint32_t n_dims, const uint64_t *ne,
                        uint64_t *n_elems, uint64_t *nbytes);

/* Open-addressing string -> index table. Names are borrowed (must outlive
 * the table). Capacity is fixed at creation (>= 2x the expected count). */
typedef struct gguf_name_slot {
    uint64_t hash;
    const char *name;   /* NULL = empty slot */
    int64_t idx;
} gguf_name_slot;

typedef struct gguf_name_index {
    gguf_name_slot *slots;
    uint64_t mask;      /* capacity - 1 */
    uint64_t count;
} gguf_name_index;

/* False on allocation failure. */
bool gguf_index_init(gguf_name_index *ix, uint64_t expected);
void gguf_index_free(gguf_name_index *ix);
/* Insert name -> idx; if the name is already present, inserts nothing and
 * returns the existing index, else -1. Grows when more than half full. */
int64_t gguf_index_insert(gguf_name_index *ix, const char *name, int64_t idx);
int64_t gguf_index_find(const gguf_name_index *ix, const char *name);

/* Reader-private state hung off gguf_file.priv. */
typedef struct gguf_arena_block gguf_arena_block;
typedef struct gguf_reader_priv {
    gguf_arena_block *blocks;   /* every allocation of the parse, freed together */
    gguf_name_index keys;
    gguf_name_index tensors;
    uint64_t *kv_end;           /* file offset just past kv record i */
} gguf_reader_priv;

/* Copy at most `max` bytes of untrusted text into out (cap bytes) with
 * non-printable bytes escaped as \xNN and "..." when cut; for messages. */
void gguf_escape(char *out, size_t cap, const char *s, uint64_t len, size_t max);

#endif
