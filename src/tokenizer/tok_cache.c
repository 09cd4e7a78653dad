/* Per-call word cache: word bytes -> token ids. Keys are not copied: they
 * point into text that outlives the cache (one tokenize call). */
#include "tokenizer/tok_internal.h"
#include <stdlib.h>

typedef struct cache_slot {
    uint64_t hash;
    const char *key; /* NULL = empty */
    uint32_t len, n_ids;
    size_t ids_off;
} cache_slot;

struct tok_word_cache {
    cache_slot *slots;
    size_t mask, count;
    tok_ids ids;
};

enum { CACHE_MAX_ENTRIES = 1 << 20 };

tok_word_cache *tok_word_cache_new(void) {
    return mu_xcalloc(1, sizeof(tok_word_cache));
}

void tok_word_cache_free(tok_word_cache *c) {
    if (!c) return;
    free(c->slots);
    free(c->ids.v);
    free(c);
}

static cache_slot *find(const tok_word_cache *c, const char *w, size_t n, uint64_t h) {
    for (size_t i = h & c->mask;; i = (i + 1) & c->mask) {
        cache_slot *s = &c->slots[i];
        if (!s->key) return s;
        if (s->hash == h && s->len == n && !memcmp(s->key, w, n)) return s;
    }
}

bool tok_word_cache_get(const tok_word_cache *c, const char *w, size_t n, tok_ids *out) {
    if (!c->slots) return false;
    const cache_slot *s = find(c, w, n, tok_hash(w, n));
    if (!s->key) return false;
    for (uint32_t i = 0; i < s->n_ids; i++) tok_ids_push(out, c->ids.v[s->ids_off + i]);
    return true;
}

static void grow(tok_word_cache *c) {
    size_t old_n = c->slots ? c->mask + 1 : 0, n = old_n ? 2 * old_n : 1024;
    cache_slot *old = c->slots;
    c->slots = mu_xcalloc(n, sizeof *c->slots);
    c->mask = n - 1;
    for (size_t i = 0; i < old_n; i++) {
        if (!old[i].key) continue;
        size_t j = old[i].hash & c->mask;
        while (c->slots[j].key) j = (j + 1) & c->mask;
        c->slots[j] = old[i];
    }
    free(old);
}

void tok_word_cache_put(tok_word_cache *c, const char *w, size_t n, const int32_t *ids,
                        size_t k) {
    if (c->count >= CACHE_MAX_ENTRIES || n > UINT32_MAX || k > UINT32_MAX) return;
    if (!c->slots || (c->count + 1) * 2 > c->mask + 1) grow(c);
    uint64_t h = tok_hash(w, n);
    cache_slot *s = find(c, w, n, h);
    if (s->key) return;
    *s = (cache_slot){h, w, (uint32_t)n, (uint32_t)k, c->ids.n};
    for (size_t i = 0; i < k; i++) tok_ids_push(&c->ids, ids[i]);
    c->count++;
}
