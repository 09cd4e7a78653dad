/* The stateless llama.cpp samplers, each reproducing the pinned `apply`
 * operation for operation (float vs double steps included). */
#include "sample/sample.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>

void mu_sample_logit_bias(mu_candidates *c, const mu_logit_bias *bias, size_t n) {
    /* llama first tries the slot whose index equals the id (an untouched
     * row), then searches the array for biases whose slot moved; the first
     * candidate matching a bias ends that bias' search. */
    bool moved = false;
    for (size_t b = 0; b < n; b++) {
        int32_t t = bias[b].token;
        if (t >= 0 && c->size > (size_t)t && c->data[t].id == t) c->data[t].logit += bias[b].bias;
        else moved = true;
    }
    if (!moved) return;
    for (size_t i = 0; i < c->size; i++) {
        for (size_t b = 0; b < n; b++) {
            int32_t t = bias[b].token;
            if (t >= 0 && c->size > (size_t)t && c->data[t].id == t) continue; /* done above */
            if (c->data[i].id == t) {
                c->data[i].logit += bias[b].bias;
                break;
            }
        }
    }
}

void mu_sample_top_k(mu_candidates *c, int32_t k, mu_sample_work *w) {
    if (k <= 0) return;
    size_t kk = (size_t)k < c->size ? (size_t)k : c->size;
    if (!c->sorted) mu_cand_partial_sort_inplace(c, kk, w);
    c->size = kk;
}

void mu_sample_top_p(mu_candidates *c, float p, size_t min_keep, mu_sample_work *w) {
    if (p >= 1.0f || c->size == 0) return;
    mu_sample_softmax(c, false, w);
    size_t k = c->size;
    const mu_token_data *pdata = c->data;
    /* Large unsorted arrays: sort only the top 256 and widen if the nucleus
     * turns out to be bigger. The partial copy lives in w->tok. */
    if (!c->sorted && c->size > 1024) {
        k = c->size < 256 ? c->size : 256;
        mu_sample_bucket_sort(c, k, w);
        pdata = w->tok;
    } else if (!c->sorted) {
        mu_cand_partial_sort_inplace(c, k, w);
    }
    float cum_sum = 0.0f;
    size_t last_idx = c->size;
    for (size_t i = 0; i < c->size; i++) {
        cum_sum += pdata[i].p;
        if (cum_sum >= p && i + 1 >= min_keep) {
            last_idx = i + 1;
            break;
        }
        if (!c->sorted && i == k - 1) {
            k = c->size;
            mu_sample_bucket_sort(c, k, w);
            pdata = w->tok;
        }
    }
    if (!c->sorted) {
        memcpy(c->data, w->tok, last_idx * sizeof *c->data);
        c->sorted = true;
    }
    c->size = last_idx;
}

void mu_sample_min_p(mu_candidates *c, float p, size_t min_keep, mu_sample_work *w) {
    if (p <= 0.0f || c->size == 0) return;
    if (!c->sorted) {
        /* Unsorted path: filter in place order against max + log(p). */
        float max_logit = -FLT_MAX;
        for (size_t i = 0; i < c->size; i++)
            if (max_logit < c->data[i].logit) max_logit = c->data[i].logit;
        const float min_logit = max_logit + logf(p);
        mu_sample_work_reserve(w, c->size);
        size_t kept = 0;
        for (size_t i = 0; i < c->size; i++)
            if (c->data[i].logit >= min_logit) w->tok[kept++] = c->data[i];
        if (kept > 0 && kept >= min_keep) {
            memcpy(c->data, w->tok, kept * sizeof *c->data);
            c->size = kept;
            return;
        }
        mu_cand_partial_sort_inplace(c, c->size, w);
    }
    const float min_logit = c->data[0].logit + logf(p);
    size_t i = 1; /* the first token always stays */
    for (; i < c->size; i++)
        if (c->data[i].logit < min_logit && i >= min_keep) break;
    c->size = i;
}

void mu_sample_typical(mu_candidates *c, float p, size_t min_keep, mu_sample_work *w) {
    if (p >= 1.0f || c->size == 0) return;
    mu_sample_softmax(c, true, w);
    const size_t n = c->size;
    float entropy = 0.0f;
    for (size_t i = 0; i < n; i++) entropy += -c->data[i].p * logf(c->data[i].p);
    mu_sample_work_reserve(w, n);
    for (size_t i = 0; i < n; i++) {
        w->score[i] = fabsf(-logf(c->data[i].p) - entropy);
        w->order[i] = i;
    }
    /* The locally-typical order (std::sort by shifted score, ties as
     * libstdc++ leaves them) is the new candidate order. */
    mu_sample_sort_indices_by_score(w->order, n, w->score);
    float cum_sum = 0.0f;
    size_t last_idx = n;
    for (size_t i = 0; i < n; i++) {
        cum_sum += c->data[w->order[i]].p;
        if (cum_sum > p && (min_keep == 0 || i >= min_keep - 1)) {
            last_idx = i + 1;
            break;
        }
    }
    for (size_t i = 0; i < last_idx; i++) w->tok[i] = c->data[w->order[i]];
    memcpy(c->data, w->tok, last_idx * sizeof *c->data);
    c->size = last_idx;
    c->sorted = false;
}

void mu_sample_top_n_sigma(mu_candidates *c, float n, mu_sample_work *w) {
    if (n <= 0.0f || c->size <= 1) return;
    float max = c->data[0].logit, logits_sum = 0.0f;
    size_t valid = 0;
    for (size_t i = 0; i < c->size; i++) {
        float l = c->data[i].logit;
        if (l == -INFINITY) continue;
        if (max < l) max = l;
        logits_sum += l;
        valid++;
    }
    float mean = valid > 0 ? logits_sum / (float)valid : 0.0f;
    /* llama: float acc += pow(float, 2), i.e. the square is a double. */
    float acc = 0.0f;
    for (size_t i = 0; i < c->size; i++) {
        if (c->data[i].logit == -INFINITY) continue;
        double d = (double)(c->data[i].logit - mean);
        acc = (float)((double)acc + d * d);
    }
    float sd = valid > 0 ? sqrtf(acc / (float)valid) : 0.0f;
    for (size_t i = 0; i < c->size; i++)
        if (c->data[i].logit < max - n * sd) c->data[i].logit = -INFINITY;
    mu_sample_softmax(c, true, w);
}

void mu_sample_temp(mu_candidates *c, float temp) {
    if (c->size == 0) return;
    if (temp <= 0.0f) {
        /* Greedy: the maximum survives. Among equal maxima the lowest token id
         * wins (the engine's first-maximum rule, docs/sampling.md, which every
         * argmax in the engine and a GPU reduction share). llama.cpp keeps the first in candidate
         * order instead; the two differ only on exact ties. */
        size_t max_i = 0;
        float max_l = c->data[0].logit;
        for (size_t i = 1; i < c->size; i++) {
            if (c->data[i].logit > max_l ||
                (c->data[i].logit == max_l && c->data[i].id < c->data[max_i].id)) {
                c->data[max_i].logit = -INFINITY;
                max_i = i;
                max_l = c->data[i].logit;
            } else {
                c->data[i].logit = -INFINITY;
            }
        }
        /* A sorted list whose head lost a tie is no longer sorted (the draw
         * reads the head as the maximum). Without ties max_i is 0 here. */
        if (max_i != 0) c->sorted = false;
        return;
    }
    for (size_t i = 0; i < c->size; i++) c->data[i].logit /= temp;
}

void mu_sample_temp_ext(mu_candidates *c, float temp, float delta, float exponent,
                        mu_sample_work *w) {
    if (!(delta > 0.0f)) {
        mu_sample_temp(c, temp);
        return;
    }
    const float min_temp = temp - delta > 0.0f ? temp - delta : 0.0f;
    const float max_temp = temp + delta;
    if (c->size <= 1) return;
    const float max_entropy = -logf(1.0f / (float)c->size);
    mu_sample_softmax(c, true, w);
    float entropy = 0.0f;
    for (size_t i = 0; i < c->size; i++) {
        float prob = c->data[i].p;
        if (prob > 0.0f) entropy -= prob * logf(prob);
    }
    const float normalized = entropy / max_entropy;
    const float dyn_temp = min_temp + (max_temp - min_temp) * powf(normalized, exponent);
    mu_sample_temp(c, dyn_temp);
    /* llama renormalises in double here; p is recomputed by the draw anyway. */
    const double max_l = c->data[0].logit;
    double cum = 0.0;
    for (size_t i = 0; i < c->size; i++) {
        double p = exp((double)c->data[i].logit - max_l);
        c->data[i].p = (float)p;
        cum += p;
    }
    for (size_t i = 0; i < c->size; i++) c->data[i].p = (float)((double)c->data[i].p / cum);
}

void mu_sample_xtc(mu_candidates *c, float probability, float threshold, size_t min_keep,
                   mu_mt19937 *rng, mu_sample_work *w) {
    if (probability <= 0.0f || threshold > 0.5f || c->size < 2) return;
    float chance = mu_mt_canonical_f32(rng);
    if (chance > probability) return;
    mu_sample_softmax(c, true, w);
    size_t pos_last = 0;
    for (size_t i = 0; i < c->size; i++) {
        if (c->data[i].p >= threshold) pos_last = i;
        else break;
    }
    if (c->size - pos_last >= min_keep && pos_last > 0) {
        c->data += pos_last;
        c->size -= pos_last;
    }
}

void mu_sample_dist(mu_candidates *c, mu_mt19937 *rng) {
    if (c->size == 0) {
        c->selected = -1;
        return;
    }
    c->selected = 0;
    if (c->size == 1) {
        c->data[0].p = 1.0f; /* pinned revision: no draw here */
        return;
    }
    float max_l = c->data[0].logit;
    if (!c->sorted)
        for (size_t i = 1; i < c->size; i++)
            if (max_l < c->data[i].logit) max_l = c->data[i].logit;
    double sum_cum = 0.0;
    for (size_t i = 0; i < c->size; i++) {
        float p = expf(c->data[i].logit - max_l);
        c->data[i].p = p;
        sum_cum += p;
    }
    /* One pass: find the target while normalising, as llama does. */
    const double rnd = mu_mt_canonical_f64(rng);
    const double sum_tgt = sum_cum * rnd;
    double sum_run = 0.0;
    bool found = false;
    for (size_t i = 0; i < c->size; i++) {
        if (!found) {
            sum_run += c->data[i].p;
            if (sum_run >= sum_tgt) {
                c->selected = (int64_t)i;
                found = true;
            }
        }
        c->data[i].p = (float)((double)c->data[i].p / sum_cum);
    }
    if (!found) c->selected = (int64_t)c->size - 1;
}

/* libstdc++ discrete_distribution: weights as doubles, normalised by their
 * double sum, running partial sums with the last forced to 1, one f64 draw,
 * lower_bound. Fewer than two weights: index 0 and no draw. */
int64_t mu_sample_discrete(const mu_candidates *c, mu_mt19937 *rng) {
    const size_t n = c->size;
    if (n < 2) return 0;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)c->data[i].p;
    const double u = mu_mt_canonical_f64(rng);
    /* lower_bound over cp[i] = sum_{j<=i} p_j/sum with cp[n-1] forced to 1. */
    double *cp = mu_xmalloc(n * sizeof *cp);
    double run = 0.0;
    for (size_t i = 0; i < n; i++) {
        run += (double)c->data[i].p / sum;
        cp[i] = run;
    }
    cp[n - 1] = 1.0;
    size_t first = 0, len = n;
    while (len > 0) {
        size_t half = len >> 1;
        if (cp[first + half] < u) {
            first += half + 1;
            len -= half + 1;
        } else {
            len = half;
        }
    }
    free(cp);
    return (int64_t)first;
}

static float surprise_update(float mu, float tau, float eta, float p) {
    float observed = -log2f(p);
    float e = observed - tau;
    return mu - eta * e;
}

void mu_sample_mirostat(mu_candidates *c, int32_t n_vocab, float tau, float eta, int32_t m,
                        float *mu, mu_mt19937 *rng, mu_sample_work *w) {
    if (c->size == 0) {
        c->selected = -1;
        return;
    }
    mu_sample_softmax(c, true, w);
    /* Estimate the Zipf exponent s_hat from the top m probabilities. */
    float sum_ti_bi = 0.0f, sum_ti_sq = 0.0f;
    for (size_t i = 0; i < (size_t)(m - 1) && i < c->size - 1; i++) {
        float t_i = logf((float)(i + 2) / (float)(i + 1));
        float b_i = logf(c->data[i].p / c->data[i + 1].p);
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
    }
    float s_hat = sum_ti_bi / sum_ti_sq;
    float epsilon_hat = s_hat - 1;
    float k = powf((epsilon_hat * powf(2.0f, *mu)) / (1 - powf((float)n_vocab, -epsilon_hat)),
                   1 / s_hat);
    int32_t ki = mu_sample_f2i_x86(k);
    mu_sample_top_k(c, ki > 1 ? ki : 1, w);
    mu_sample_softmax(c, true, w);
    int64_t idx = mu_sample_discrete(c, rng);
    c->selected = idx;
    *mu = surprise_update(*mu, tau, eta, c->data[idx].p);
}

void mu_sample_mirostat_v2(mu_candidates *c, float tau, float eta, float *mu, mu_mt19937 *rng,
                           mu_sample_work *w) {
    if (c->size == 0) {
        c->selected = -1;
        return;
    }
    mu_sample_softmax(c, true, w);
    size_t keep = 0;
    while (keep < c->size && !(-log2f(c->data[keep].p) > *mu)) keep++;
    c->size = keep ? keep : 1;
    mu_sample_softmax(c, true, w);
    int64_t idx = mu_sample_discrete(c, rng);
    c->selected = idx;
    *mu = surprise_update(*mu, tau, eta, c->data[idx].p);
}

/* Integer maxima and flags: the same answer from any vector width, so the
 * AVX2 clone (8 lanes where the build's baseline has 4) is chosen at load
 * time where the CPU has it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void mu_sample_scan(const float *x, size_t n, mu_row_scan *out) {
    enum { BLK = 64 };
    int32_t best = INT32_MIN;
    size_t best_blk = 0, n_best = 0;
    uint32_t nan_posinf = 0, neginf = 0;
    for (size_t b0 = 0; b0 < n; b0 += BLK) { /* block maxima; the first block holding the largest */
        const size_t e = b0 + BLK < n ? b0 + BLK : n;
        int32_t m = INT32_MIN;
        for (size_t i = b0; i < e; i++) {
            const uint32_t u = mu_f32_bits(x[i]);
            nan_posinf |= ((u & 0x7FFFFFFFu) > 0x7F800000u) | (u == 0x7F800000u);
            neginf |= u == 0xFF800000u;
            const int32_t k = mu_f32_order_key(x[i]);
            m = k > m ? k : m;
        }
        if (m < best) continue;
        size_t c = 0; /* the block's values at its maximum (it is in L1 now) */
        for (size_t i = b0; i < e; i++) c += mu_f32_order_key(x[i]) == m;
        if (m > best) best = m, best_blk = b0, n_best = c;
        else n_best += c;
    }
    size_t id = best_blk;
    while (id + 1 < n && mu_f32_order_key(x[id]) != best) id++;
    *out = (mu_row_scan){.at = id, .n_at = n_best, .nan_or_posinf = nan_posinf != 0, .neginf = neginf != 0};
}

int32_t mu_sample_argmax_unique(const float *x, size_t n) {
    if (n == 0) return -1;
    mu_row_scan sc; /* one pass: finiteness, the first maximum and how many share its bits */
    mu_sample_scan(x, n, &sc);
    if (sc.nan_or_posinf || sc.neginf) return -1;
    const float top = x[sc.at];
    size_t eq = sc.n_at;
    if (top == 0.0f) { /* float equality: +0 and -0 tie, as in the chain */
        eq = 0;
        for (size_t i = 0; i < n; i++) eq += x[i] == top;
    }
    if (eq != 1) return -1;
    return (int32_t)sc.at;
}

int32_t mu_sample_argmax(const float *logits, size_t n, const int32_t *banned, size_t n_banned) {
    int32_t best = -1;
    float best_l = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        if (!(logits[i] > best_l)) continue;
        bool is_banned = false;
        for (size_t b = 0; b < n_banned && !is_banned; b++) is_banned = banned[b] == (int32_t)i;
        if (is_banned) continue;
        best = (int32_t)i;
        best_l = logits[i];
    }
    return best;
}
