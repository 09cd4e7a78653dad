/* Byte arena and the two open-addressing hash maps behind vocabulary and
 * merge lookups (the hot path of tokenization). */
#include "tokenizer/tok_internal.h"
#include <stdlib.h>

uint32_t tok_arena_add(tok_arena *a, const void *s, size_t n) {
    uint32_t off = (uint32_t)a->len;
    tok_arena_append(a, s, n);
    tok_arena_append(a, "", 1);
    return off;
}

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    if (n) memcpy(&v, s, n);
    return mix((h ^ v) * 0x9e3779b97f4a7c15ull);
}

static size_t table_size(size_t expected) {
    size_t n = 16;
    while (n < expected * 2) n *= 2; /* load factor <= 0.5 */
    return n;
}

void tok_map_init(tok_map *m, const tok_arena *a, size_t expected) {
    size_t n = table_size(expected);
    m->slots = mu_xcalloc(n, sizeof *m->slots);
    for (size_t i = 0; i < n; i++) m->slots[i].val = -1;
    m->mask = n - 1;
    m->count = 0;
    m->arena = a;
}

void tok_map_free(tok_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int32_t tok_map_get(const tok_map *m, const void *key, size_t len) {
    uint64_t h = tok_hash(key, len);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const tok_slot *s = &m->slots[i];
        if (s->val < 0) return -1;
        if (s->hash == h && s->len == len && !memcmp(m->arena->p + s->off, key, len))
            return s->val;
    }
}

static void map_grow(tok_map *m) {
    tok_slot *old = m->slots;
    size_t old_n = m->mask + 1, n = old_n * 2;
    m->slots = mu_xcalloc(n, sizeof *m->slots);
    for (size_t i = 0; i < n; i++) m->slots[i].val = -1;
    m->mask = n - 1;
    for (size_t i = 0; i < old_n; i++) {
        if (old[i].val < 0) continue;
        size_t j = old[i].hash & m->mask;
        while (m->slots[j].val >= 0) j = (j + 1) & m->mask;
        m->slots[j] = old[i];
    }
    free(old);
}

int32_t tok_map_put(tok_map *m, uint32_t off, uint32_t len, int32_t val) {
    if ((m->count + 1) * 2 > m->mask + 1) map_grow(m);
    const char *key = m->arena->p + off;
    uint64_t h = tok_hash(key, len);
    size_t i = h & m->mask;
    for (;; i = (i + 1) & m->mask) {
        tok_slot *s = &m->slots[i];
        if (s->val < 0) break;
        if (s->hash == h && s->len == len && !memcmp(m->arena->p + s->off, key, len))
            return s->val;
    }
    m->slots[i] = (tok_slot){h, off, len, val};
    m->count++;
    return -1;
}

/* ---------------- pair map ---------------- */

#define PAIR_EMPTY UINT64_MAX

void tok_pairmap_init(tok_pairmap *m, size_t expected) {
    size_t n = table_size(expected);
    m->slots = mu_xmalloc(n * sizeof *m->slots);
    for (size_t i = 0; i < n; i++) m->slots[i].key = PAIR_EMPTY;
    m->mask = n - 1;
    m->count = 0;
}

void tok_pairmap_free(tok_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static inline uint64_t pair_key(uint32_t a, uint32_t b) {
    return (uint64_t)a << 32 | b;
}

const tok_pair_slot *tok_pairmap_get(const tok_pairmap *m, uint32_t a, uint32_t b) {
    uint64_t k = pair_key(a, b);
    for (size_t i = mix(k * 0x9e3779b97f4a7c15ull) & m->mask;; i = (i + 1) & m->mask) {
        const tok_pair_slot *s = &m->slots[i];
        if (s->key == k) return s;
        if (s->key == PAIR_EMPTY) return NULL;
    }
}

bool tok_pairmap_put(tok_pairmap *m, uint32_t a, uint32_t b, int32_t rank, int32_t result) {
    if ((m->count + 1) * 2 > m->mask + 1) {
        tok_pair_slot *old = m->slots;
        size_t old_n = m->mask + 1;
        tok_pairmap_init(m, old_n); /* doubles: table_size(old_n) == 2 * old_n */
        for (size_t i = 0; i < old_n; i++)
            if (old[i].key != PAIR_EMPTY)
                tok_pairmap_put(m, (uint32_t)(old[i].key >> 32), (uint32_t)old[i].key,
                                old[i].rank, old[i].result);
        free(old);
    }
    uint64_t k = pair_key(a, b);
    size_t i = mix(k * 0x9e3779b97f4a7c15ull) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        if (m->slots[i].key == k) return false;
        if (m->slots[i].key == PAIR_EMPTY) break;
    }
    m->slots[i] = (tok_pair_slot){k, rank, result};
    m->count++;
    return true;
}
