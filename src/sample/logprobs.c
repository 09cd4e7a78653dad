/* OpenAI-style logprobs straight from the raw logits row. */
#include "sample/sample.h"
#include <math.h>

/* a ranks before b: higher logit, then lower id. */
static bool ranks_before(const mu_token_logprob *a, const mu_token_logprob *b) {
    return a->logprob > b->logprob || (a->logprob == b->logprob && a->id < b->id);
}

/* Min-heap on rank: the root is the weakest of the kept tokens. */
static void sift_down(mu_token_logprob *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_before(&h[m], &h[l])) m = l;
        if (r < n && ranks_before(&h[m], &h[r])) m = r;
        if (m == i) return;
        mu_token_logprob t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void sift_up(mu_token_logprob *h, size_t i) {
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!ranks_before(&h[parent], &h[i])) return;
        mu_token_logprob t = h[i];
        h[i] = h[parent];
        h[parent] = t;
        i = parent;
    }
}

/* Keeps the n best (logit, id) in top[] as a heap, holding raw logits in
 * .logprob, then sorts them best first. O(V log n). */
static void select_top(const float *logits, size_t n_vocab, size_t n, mu_token_logprob *top) {
    size_t have = 0;
    for (size_t i = 0; i < n_vocab; i++) {
        mu_token_logprob t = {(int32_t)i, logits[i]};
        if (have < n) {
            top[have] = t;
            sift_up(top, have++);
        } else if (ranks_before(&t, &top[0])) {
            top[0] = t;
            sift_down(top, n, 0);
        }
    }
    for (size_t end = have; end > 1; end--) { /* heap sort: weakest moves to the back */
        mu_token_logprob t = top[0];
        top[0] = top[end - 1];
        top[end - 1] = t;
        sift_down(top, end - 1, 0);
    }
}

bool mu_logprobs(const float *logits, size_t n_vocab, int32_t chosen,
                 mu_token_logprob *chosen_out, size_t n_top, mu_token_logprob *top,
                 mu_error *err) {
    if (n_vocab == 0 || chosen < 0 || (size_t)chosen >= n_vocab) {
        mu_err_set(err, "logprobs: chosen token %d outside the vocabulary of %zu", chosen, n_vocab);
        return false;
    }
    if (n_top > n_vocab || (n_top && !top)) {
        mu_err_set(err, "logprobs: asked for %zu alternatives from a vocabulary of %zu", n_top,
                   n_vocab);
        return false;
    }
    float max = -INFINITY;
    for (size_t i = 0; i < n_vocab; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY) {
            mu_err_set(err, "logprobs: logit of token %zu is %s", i, isnan(logits[i]) ? "NaN" : "+inf");
            return false;
        }
        if (logits[i] > max) max = logits[i];
    }
    if (max == -INFINITY) {
        mu_err_set(err, "logprobs: every logit is -inf");
        return false;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - (double)max);
    const double log_z = (double)max + log(sum);
    chosen_out->id = chosen;
    chosen_out->logprob = (float)((double)logits[chosen] - log_z);
    if (n_top == 0) return true;
    select_top(logits, n_vocab, n_top, top);
    for (size_t i = 0; i < n_top; i++) top[i].logprob = (float)((double)top[i].logprob - log_z);
    return true;
}
