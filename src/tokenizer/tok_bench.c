/* Tokenizer throughput on deterministic English-like prose. */
#include "tokenizer/tok_internal.h"
#include <stdio.h>
#include <stdlib.h>

static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other",
    "its", "may", "these", "what", "them", "than", "some", "him", "time", "into", "only", "do",
    "could", "new", "about", "two", "first", "then", "also", "any", "like", "our", "people",
    "over", "such", "my", "years", "most", "very", "after", "know", "many", "should", "before",
    "through", "between", "however", "government", "development", "information", "important",
    "different", "following", "without", "children", "something", "understand", "question",
    "language", "computer", "mountain", "river", "history", "morning", "remember", "together",
    "although", "beautiful", "especially", "experience", "interesting", "probably", "quickly",
    "tokenizer", "inference", "engine", "memory", "weights", "attention", "village", "library",
    "don't", "it's", "we're", "they've", "I'll", "she'd", "isn't", "couldn't",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

static uint64_t next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Sentences of 5..24 words with commas, capitals and the odd number, in
 * paragraphs of 3..7 sentences. */
static char *make_prose(size_t n) {
    char *buf = mu_xmalloc(n + 64);
    size_t o = 0;
    uint64_t rng = 0x5eed1234abcdull;
    int sentence = 0, word = 0, sent_len = 8, para_len = 4;
    const char *sep = "";
    while (o < n) {
        const char *w = WORDS[next(&rng) % N_WORDS];
        char num[24];
        if (next(&rng) % 40 == 0) {
            snprintf(num, sizeof num, "%llu", (unsigned long long)(1 + next(&rng) % 99999));
            w = num;
        }
        size_t wl = strlen(w), sl = strlen(sep);
        if (o + sl + wl + 4 > n + 60) break;
        memcpy(buf + o, sep, sl);
        o += sl;
        memcpy(buf + o, w, wl);
        if (word == 0 && buf[o] >= 'a' && buf[o] <= 'z') buf[o] = (char)(buf[o] - 32);
        o += wl;
        sep = " ";
        if (++word == sent_len) {
            buf[o++] = next(&rng) % 8 ? '.' : '?';
            word = 0;
            sent_len = 5 + (int)(next(&rng) % 20);
            if (++sentence == para_len) {
                sep = "\n\n";
                sentence = 0;
                para_len = 3 + (int)(next(&rng) % 5);
            }
        } else if (next(&rng) % 12 == 0) {
            buf[o++] = ',';
        }
    }
    buf[o] = '\0';
    return buf;
}

double mu_tokenizer_bench(const mu_tokenizer *t, size_t n_bytes, mu_error *err) {
    if (n_bytes < 1024) n_bytes = 1024;
    char *text = make_prose(n_bytes);
    size_t n = strlen(text);
    int32_t *ids = NULL;
    int64_t k = mu_tokenize(t, text, n / 16, false, false, &ids, err); /* warm-up */
    free(ids);
    double mbs = -1;
    if (k >= 0) {
        double t0 = mu_now();
        k = mu_tokenize(t, text, n, false, false, &ids, err);
        double dt = mu_now() - t0;
        free(ids);
        if (k >= 0) mbs = (double)n / 1e6 / (dt > 1e-9 ? dt : 1e-9);
    }
    free(text);
    return mbs;
}
