/* OpenAI-style logprobs straight from the raw logits row. */
#include "sample/sample.h"
#include "util/mumath.h"
#include <math.h>
#include <stdint.h>

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
 * .logprob, then sorts them best first. O(V log n). Once the heap is full,
 * a 64-value block whose largest value does not beat the weakest kept one
 * is skipped whole (its tokens come later, so a tie loses too; its maximum
 * is an integer maximum that vectorizes). */
static void select_top(const float *logits, size_t n_vocab, size_t n, mu_token_logprob *top) {
    enum { BLK = 64 };
    if (n == 0) return;
    size_t have = 0;
    for (size_t b0 = 0; b0 < n_vocab; b0 += BLK) {
        const size_t e = b0 + BLK < n_vocab ? b0 + BLK : n_vocab;
        if (have == n) {
            int32_t m = INT32_MIN;
            for (size_t i = b0; i < e; i++) {
                const int32_t k = mu_f32_order_key(logits[i]);
                m = k > m ? k : m;
            }
            if (m <= mu_f32_order_key(top[0].logprob)) continue;
        }
        for (size_t i = b0; i < e; i++) {
            mu_token_logprob t = {(int32_t)i, logits[i]};
            if (have < n) {
                top[have] = t;
                sift_up(top, have++);
            } else if (ranks_before(&t, &top[0])) {
                top[0] = t;
                sift_down(top, n, 0);
            }
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
    mu_row_scan sc; /* NaN and +inf, and the maximum, in one pass; the culprit only when there is one */
    mu_sample_scan(logits, n_vocab, &sc);
    if (sc.nan_or_posinf)
        for (size_t i = 0; i < n_vocab; i++)
            if (isnan(logits[i]) || logits[i] == INFINITY) {
                mu_err_set(err, "logprobs: logit of token %zu is %s", i, isnan(logits[i]) ? "NaN" : "+inf");
                return false;
            }
    const size_t at_max = sc.at;
    const float max = logits[at_max];
    if (max == -INFINITY) {
        mu_err_set(err, "logprobs: every logit is -inf");
        return false;
    }
    /* log Z = max + log(sum e^(x - max)); mu_expf through mu_sum_expf (vector
     * lanes), not libm's double exp, which a server computing logprobs for
     * 8 streams paid on every logit of every row, every step */
    const double log_z = (double)max + log(mu_sum_expf(logits, n_vocab, max));
    chosen_out->id = chosen;
    chosen_out->logprob = (float)((double)logits[chosen] - log_z);
    if (n_top == 0) return true;
    if (n_top == 1) { /* a request's logprobs without alternatives: the first largest */
        size_t i = at_max;
        if (max == 0.0f) /* +0 and -0 tie here, not in the scan's order */
            for (i = 0; logits[i] != max;) i++;
        top[0] = (mu_token_logprob){(int32_t)i, max};
    } else
        select_top(logits, n_vocab, n_top, top);
    for (size_t i = 0; i < n_top; i++) top[i].logprob = (float)((double)top[i].logprob - log_z);
    return true;
}
