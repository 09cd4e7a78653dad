/* The two samplers that remember accepted tokens: repetition penalties and
 * DRY, as llama.cpp's "penalties" and "dry". */
#include "sample/sample.h"
#include <math.h>
#include <stdlib.h>

/* Fixed-capacity FIFO of the most recent tokens (llama's ring_buffer). */
typedef struct token_ring {
    int32_t *buf;
    size_t cap, size, first;
} token_ring;

static void ring_init(token_ring *r, size_t cap) {
    r->buf = mu_xcalloc(cap ? cap : 1, sizeof *r->buf);
    r->cap = cap;
    r->size = r->first = 0;
}

/* Pushes `t`; returns the evicted oldest token through *evicted. */
static bool ring_push(token_ring *r, int32_t t, int32_t *evicted) {
    bool full = r->size == r->cap;
    if (full) {
        *evicted = r->buf[r->first];
        r->first = (r->first + 1) % r->cap;
    } else {
        r->size++;
    }
    r->buf[(r->first + r->size - 1) % r->cap] = t;
    return full;
}

/* i-th most recent token (0 = newest), llama's rat(). */
static int32_t ring_rat(const token_ring *r, size_t i) {
    return r->buf[(r->first + r->size - 1 - i) % r->cap];
}

static size_t ring_copy(const token_ring *r, int32_t *out) {
    if (out)
        for (size_t i = 0; i < r->size; i++) out[i] = r->buf[(r->first + i) % r->cap];
    return r->size;
}

/* ------------------------------------------------------------ penalties */

struct mu_penalties {
    int32_t last_n;
    float repeat, freq, present;
    int32_t n_vocab;
    token_ring prev;
    int32_t *count; /* occurrences of each in-vocab id inside `prev` */
};

mu_penalties *mu_penalties_new(int32_t last_n, float repeat, float freq, float present,
                               int32_t n_vocab) {
    mu_penalties *pen = mu_xcalloc(1, sizeof *pen);
    pen->last_n = last_n > 0 ? last_n : 0;
    pen->repeat = repeat;
    pen->freq = freq;
    pen->present = present;
    pen->n_vocab = n_vocab > 0 ? n_vocab : 0;
    ring_init(&pen->prev, (size_t)pen->last_n);
    pen->count = mu_xcalloc(pen->n_vocab ? (size_t)pen->n_vocab : 1, sizeof *pen->count);
    return pen;
}

void mu_penalties_free(mu_penalties *pen) {
    if (!pen) return;
    free(pen->prev.buf);
    free(pen->count);
    free(pen);
}

static bool in_vocab(int32_t t, int32_t n_vocab) { return t >= 0 && t < n_vocab; }

void mu_penalties_accept(mu_penalties *pen, int32_t token) {
    if (pen->last_n == 0) return;
    int32_t old;
    if (ring_push(&pen->prev, token, &old) && in_vocab(old, pen->n_vocab)) pen->count[old]--;
    if (in_vocab(token, pen->n_vocab)) pen->count[token]++;
}

void mu_penalties_apply(const mu_penalties *pen, mu_candidates *c) {
    if (pen->last_n == 0 ||
        (pen->repeat == 1.0f && pen->freq == 0.0f && pen->present == 0.0f))
        return;
    for (size_t i = 0; i < c->size; i++) {
        int32_t id = c->data[i].id;
        if (!in_vocab(id, pen->n_vocab) || pen->count[id] == 0) continue;
        const int count = pen->count[id];
        /* Multiply negative logits, divide positive ones: dividing a negative
         * logit would make the token more likely. */
        if (c->data[i].logit <= 0) c->data[i].logit *= pen->repeat;
        else c->data[i].logit /= pen->repeat;
        c->data[i].logit -= (float)count * pen->freq + (float)(count > 0) * pen->present;
    }
    c->sorted = false;
}

void mu_penalties_reset(mu_penalties *pen) {
    pen->prev.size = pen->prev.first = 0;
    memset(pen->count, 0, (size_t)(pen->n_vocab ? pen->n_vocab : 1) * sizeof *pen->count);
}

size_t mu_penalties_history(const mu_penalties *pen, int32_t *out) {
    return ring_copy(&pen->prev, out);
}

bool mu_penalties_restore(mu_penalties *pen, const int32_t *tok, size_t n) {
    if (n > pen->prev.cap) return false;
    mu_penalties_reset(pen);
    for (size_t i = 0; i < n; i++) mu_penalties_accept(pen, tok[i]);
    return true;
}

/* ------------------------------------------------------------------ DRY */

enum { DRY_MAX_BREAKER_BYTES = 40, DRY_MAX_TAIL_TOKENS = 20, DRY_TOKENIZE_CAP = 256 };

/* A restart ("sequence breaker") sequence: its head token plus the tokens
 * that must follow it. Kept sorted by head for equal_range lookups. */
typedef struct dry_breaker {
    int32_t head;
    uint32_t seq;     /* insertion order, keeps the sort deterministic */
    size_t tail_off;  /* into mu_dry.tails */
    size_t tail_len;
} dry_breaker;

struct mu_dry {
    mu_dry_config cfg;
    bool enabled;
    int32_t n_vocab;
    int32_t total_ctx;
    token_ring last;
    dry_breaker *brk;
    size_t n_brk, brk_cap;
    int32_t *tails;
    size_t n_tails, tails_cap;
    int32_t *repeat_count;  /* scratch, ring capacity */
    int32_t *max_repeat;    /* scratch per id, -1 = none */
    int32_t *touched;       /* ids set in max_repeat */
    size_t n_touched;
};

static bool dry_config_enabled(const mu_dry_config *cfg) {
    return cfg->multiplier != 0.0f && cfg->base >= 1.0f && cfg->last_n != 0;
}

static mu_dry *dry_alloc(const mu_dry_config *cfg, int32_t n_vocab, mu_error *err) {
    if (n_vocab <= 0) {
        mu_err_set(err, "DRY: n_vocab must be positive, got %d", n_vocab);
        return NULL;
    }
    if (cfg->last_n < 0) {
        mu_err_set(err, "DRY: last_n must be resolved to >= 0, got %d", cfg->last_n);
        return NULL;
    }
    mu_dry *d = mu_xcalloc(1, sizeof *d);
    d->cfg = *cfg;
    d->enabled = dry_config_enabled(cfg);
    d->n_vocab = n_vocab;
    d->total_ctx = cfg->n_ctx_train > 0 ? cfg->n_ctx_train : INT32_MAX;
    size_t cap = d->enabled ? (size_t)cfg->last_n : 0;
    ring_init(&d->last, cap);
    d->repeat_count = mu_xcalloc(cap ? cap : 1, sizeof *d->repeat_count);
    d->max_repeat = mu_xmalloc((size_t)n_vocab * sizeof *d->max_repeat);
    for (int32_t i = 0; i < n_vocab; i++) d->max_repeat[i] = -1;
    d->touched = mu_xmalloc((size_t)n_vocab * sizeof *d->touched);
    return d;
}

void mu_dry_free(mu_dry *d) {
    if (!d) return;
    free(d->last.buf);
    free(d->brk);
    free(d->tails);
    free(d->repeat_count);
    free(d->max_repeat);
    free(d->touched);
    free(d);
}

static bool breaker_exists(const mu_dry *d, int32_t head, const int32_t *tail, size_t len) {
    for (size_t i = 0; i < d->n_brk; i++) {
        const dry_breaker *b = &d->brk[i];
        if (b->head == head && b->tail_len == len &&
            (len == 0 || memcmp(d->tails + b->tail_off, tail, len * sizeof *tail) == 0))
            return true;
    }
    return false;
}

static void add_breaker(mu_dry *d, int32_t head, const int32_t *tail, size_t len) {
    if (d->n_brk == d->brk_cap) {
        d->brk_cap = d->brk_cap ? 2 * d->brk_cap : 64;
        d->brk = mu_xrealloc(d->brk, d->brk_cap * sizeof *d->brk);
    }
    if (d->n_tails + len > d->tails_cap) {
        d->tails_cap = (d->n_tails + len) * 2 + 64;
        d->tails = mu_xrealloc(d->tails, d->tails_cap * sizeof *d->tails);
    }
    if (len) memcpy(d->tails + d->n_tails, tail, len * sizeof *tail);
    d->brk[d->n_brk] = (dry_breaker){head, (uint32_t)d->n_brk, d->n_tails, len};
    d->n_brk++;
    d->n_tails += len;
}

static int cmp_breaker(const void *a, const void *b) {
    const dry_breaker *x = a, *y = b;
    if (x->head != y->head) return x->head < y->head ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static void sort_breakers(mu_dry *d) {
    if (d->n_brk) qsort(d->brk, d->n_brk, sizeof *d->brk, cmp_breaker);
}

/* [*lo, *hi) = the breakers whose head is `t`. */
static void breaker_range(const mu_dry *d, int32_t t, size_t *lo, size_t *hi) {
    size_t a = 0, b = d->n_brk;
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (d->brk[m].head < t) a = m + 1;
        else b = m;
    }
    *lo = a;
    while (a < d->n_brk && d->brk[a].head == t) a++;
    *hi = a;
}

/* llama's get_overlapping_token_sequences for one breaker string: every
 * token containing it is a one-token breaker; every token that ends with a
 * proper prefix of it becomes the head of a breaker whose tail is the
 * tokenization of the rest. */
static bool split_breaker(mu_dry *d, const char *str, size_t str_len, const char *const *piece,
                          const size_t *piece_len, mu_tokenize_fn tokenize, void *tctx,
                          mu_error *err) {
    int32_t toks[DRY_TOKENIZE_CAP];
    for (int32_t id = 0; id < d->n_vocab; id++) {
        const char *word = piece[id] ? piece[id] : "";
        size_t word_len = piece_len ? piece_len[id] : strlen(word);
        if (word_len >= str_len && memmem(word, word_len, str, str_len)) {
            add_breaker(d, id, NULL, 0);
            continue;
        }
        for (size_t pos = 0; pos < word_len; pos++) {
            if (word[pos] != str[0]) continue;
            size_t i = 1;
            bool match = true;
            for (; i < str_len && i + pos < word_len; i++) {
                if (word[pos + i] != str[i]) {
                    match = false;
                    break;
                }
            }
            if (!match) continue;
            if (!tokenize) {
                mu_err_set(err, "DRY sequence breaker \"%.*s\": token %d ends with a part of it, "
                           "and splitting the rest needs a tokenizer (dry_tokenize)",
                           (int)str_len, str, id);
                return false;
            }
            int32_t n = tokenize(tctx, str + i, str_len - i, toks, DRY_TOKENIZE_CAP);
            if (n < 0 || n > DRY_TOKENIZE_CAP) {
                mu_err_set(err, "DRY sequence breaker \"%.*s\": tokenizing \"%.*s\" failed",
                           (int)str_len, str, (int)(str_len - i), str + i);
                return false;
            }
            size_t len = (size_t)n < DRY_MAX_TAIL_TOKENS ? (size_t)n : DRY_MAX_TAIL_TOKENS;
            if (!breaker_exists(d, id, toks, len)) add_breaker(d, id, toks, len);
        }
    }
    return true;
}

mu_dry *mu_dry_new(const mu_dry_config *cfg, int32_t n_vocab, const char *const *piece,
                   const size_t *piece_len, const char *const *breakers, size_t n_breakers,
                   mu_tokenize_fn tokenize, void *tokenize_ctx, mu_error *err) {
    mu_dry *d = dry_alloc(cfg, n_vocab, err);
    if (!d) return NULL;
    if (d->enabled && n_breakers > 0 && !piece) {
        mu_err_set(err, "DRY: sequence breakers need the vocabulary's token pieces");
        mu_dry_free(d);
        return NULL;
    }
    for (size_t b = 0; d->enabled && b < n_breakers; b++) {
        if (!breakers[b] || !breakers[b][0]) continue; /* llama skips empty breakers */
        size_t len = strlen(breakers[b]);
        if (len > DRY_MAX_BREAKER_BYTES) len = DRY_MAX_BREAKER_BYTES;
        if (!split_breaker(d, breakers[b], len, piece, piece_len, tokenize, tokenize_ctx, err)) {
            mu_dry_free(d);
            return NULL;
        }
    }
    sort_breakers(d);
    return d;
}

mu_dry *mu_dry_new_tokens(const mu_dry_config *cfg, int32_t n_vocab, const int32_t *const *seq,
                          const size_t *seq_len, size_t n_seq, mu_error *err) {
    mu_dry *d = dry_alloc(cfg, n_vocab, err);
    if (!d) return NULL;
    for (size_t i = 0; i < n_seq; i++)
        if (seq_len[i] > 0) add_breaker(d, seq[i][0], seq[i] + 1, seq_len[i] - 1);
    sort_breakers(d);
    return d;
}

void mu_dry_accept(mu_dry *d, int32_t token) {
    if (!d->enabled) return;
    int32_t evicted;
    ring_push(&d->last, token, &evicted);
}

void mu_dry_reset(mu_dry *d) { d->last.size = d->last.first = 0; }

size_t mu_dry_history(const mu_dry *d, int32_t *out) { return ring_copy(&d->last, out); }

bool mu_dry_restore(mu_dry *d, const int32_t *tok, size_t n) {
    if (n > d->last.cap) return false;
    mu_dry_reset(d);
    for (size_t i = 0; i < n; i++) mu_dry_accept(d, tok[i]);
    return true;
}

/* Step 1: scanning back from the newest token, the first breaker found caps
 * how far a repetition may reach. */
static int dry_rep_limit(const mu_dry *d, int last_n_repeat) {
    for (int i = 0; i < last_n_repeat; i++) {
        size_t lo, hi;
        breaker_range(d, ring_rat(&d->last, (size_t)i), &lo, &hi);
        if (lo == hi) continue;
        int longest = -1;
        for (size_t b = lo; b < hi; b++) {
            int seq_len = (int)d->brk[b].tail_len;
            if (seq_len <= longest || seq_len > i) continue;
            const int32_t *tail = d->tails + d->brk[b].tail_off;
            bool match = true;
            for (int off = 0; off < seq_len && match; off++)
                match = tail[off] == ring_rat(&d->last, (size_t)(i - off - 1));
            if (match) longest = seq_len;
        }
        if (longest >= 0) return i - longest;
    }
    return last_n_repeat;
}

static int imin(int a, int b) { return a < b ? a : b; }

/* Step 2: reverse Z-algorithm. repeat_count[last - k] = length of the
 * longest suffix of the context that also ends k tokens earlier. */
static void dry_repeat_counts(mu_dry *d, int n, int rep_limit) {
    const token_ring *r = &d->last;
    int32_t *rc = d->repeat_count;
    const int last = n - 1;
    int rt = 0, lt = 0;
    for (int k = 1; k < n; k++) {
        if (k > rt) {
            int len = 0;
            while (len + k < n && ring_rat(r, (size_t)len) == ring_rat(r, (size_t)(len + k))) len++;
            rc[last - k] = imin(len, rep_limit);
            if (len > 0) {
                lt = k;
                rt = k + len - 1;
            }
        } else {
            int p = k - lt, right_part_len = rt - k + 1;
            if (rc[last - p] < right_part_len) {
                rc[last - k] = imin(rc[last - p], rep_limit);
            } else {
                int i = rt + 1;
                while (i < n && ring_rat(r, (size_t)i) == ring_rat(r, (size_t)(i - k))) i++;
                rc[last - k] = imin(i - k, rep_limit);
                lt = k;
                rt = i - 1;
            }
        }
    }
}

static bool is_single_token_breaker(const mu_dry *d, int32_t id) {
    size_t lo, hi;
    breaker_range(d, id, &lo, &hi);
    for (size_t b = lo; b < hi; b++)
        if (d->brk[b].tail_len == 0) return true;
    return false;
}

void mu_dry_apply(mu_dry *d, mu_candidates *c) {
    if (!d->enabled) return;
    int last_n_repeat = imin(imin((int)d->last.size, d->cfg.last_n), d->total_ctx);
    if (last_n_repeat <= d->cfg.allowed_length) return;
    memset(d->repeat_count, 0, (size_t)last_n_repeat * sizeof *d->repeat_count);
    for (size_t i = 0; i < d->n_touched; i++) d->max_repeat[d->touched[i]] = -1;
    d->n_touched = 0;

    int rep_limit = dry_rep_limit(d, last_n_repeat);
    if (rep_limit < d->cfg.allowed_length) return;
    dry_repeat_counts(d, last_n_repeat, rep_limit);

    /* Step 3: a repeat ending at position i would be extended by the token
     * that followed it; remember the longest such repeat per token. */
    for (int i = 0; i < last_n_repeat - 1; i++) {
        int repeat_len = d->repeat_count[i];
        if (repeat_len < d->cfg.allowed_length) continue;
        int32_t t = ring_rat(&d->last, (size_t)(last_n_repeat - 2 - i));
        if (!in_vocab(t, d->n_vocab)) continue; /* never a candidate */
        if (d->max_repeat[t] < 0) d->touched[d->n_touched++] = t;
        if (d->max_repeat[t] < repeat_len) d->max_repeat[t] = repeat_len;
    }

    /* Step 4: penalty multiplier * base^(len - allowed), exponent clamped so
     * the power stays below FLT_MAX. llama computes the power in double. */
    int max_exponent = 0;
    if (d->cfg.base > 1.000001f) max_exponent = mu_sample_f2i_x86(88.7228391f / logf(d->cfg.base));
    for (size_t i = 0; i < c->size; i++) {
        int32_t id = c->data[i].id;
        if (!in_vocab(id, d->n_vocab) || d->max_repeat[id] < 0) continue;
        if (is_single_token_breaker(d, id)) continue;
        int repeat_exp = d->max_repeat[id] - d->cfg.allowed_length;
        if (max_exponent > 0 && repeat_exp > max_exponent) repeat_exp = max_exponent;
        float penalty = (float)((double)d->cfg.multiplier * pow((double)d->cfg.base, repeat_exp));
        c->data[i].logit -= penalty;
    }
    c->sorted = false;
}
