/* Candidate ordering exactly as llama.cpp's sorts leave it.
 *
 * llama sorts with std::sort / std::partial_sort, which are not stable: the
 * final order of equal logits is whatever libstdc++'s introsort and heap
 * selection produce. The cumulative draw walks candidates in that order, so
 * a tie at the draw point picks a different id if the order differs. The
 * templates below redo libstdc++'s algorithms (stl_algo.h / stl_heap.h of
 * GCC 12, the comparator build's toolchain) move for move. The only
 * additions are bounds guards on the "unguarded" loops; they never fire
 * for a consistent comparator and only keep NaN-poisoned input from running
 * off the array, where libstdc++ itself has undefined behaviour. */
#include "sample/sample.h"
#include <math.h>
#include <stdlib.h>

enum { STL_THRESHOLD = 16 };

static ptrdiff_t floor_log2(size_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

/* Generates NAME_sort(a, n, ctx) and NAME_partial_sort(a, middle, n, ctx).
 * LESS(ctx, pa, pb) is the strict comparator on element pointers. */
#define DEFINE_STL_SORT(NAME, T, LESS)                                                        \
    static void NAME##_push_heap(T *a, ptrdiff_t hole, ptrdiff_t top, T value,            \
                                 const void *ctx) {                                        \
        ptrdiff_t parent = (hole - 1) / 2;                                                 \
        while (hole > top && LESS(ctx, &a[parent], &value)) {                              \
            a[hole] = a[parent];                                                           \
            hole = parent;                                                                 \
            parent = (hole - 1) / 2;                                                       \
        }                                                                                  \
        a[hole] = value;                                                                   \
    }                                                                                      \
    static void NAME##_adjust_heap(T *a, ptrdiff_t hole, ptrdiff_t len, T value,          \
                                   const void *ctx) {                                      \
        const ptrdiff_t top = hole;                                                        \
        ptrdiff_t child = hole;                                                            \
        while (child < (len - 1) / 2) {                                                    \
            child = 2 * (child + 1);                                                       \
            if (LESS(ctx, &a[child], &a[child - 1])) child--;                              \
            a[hole] = a[child];                                                            \
            hole = child;                                                                  \
        }                                                                                  \
        if ((len & 1) == 0 && child == (len - 2) / 2) {                                    \
            child = 2 * (child + 1);                                                       \
            a[hole] = a[child - 1];                                                        \
            hole = child - 1;                                                              \
        }                                                                                  \
        NAME##_push_heap(a, hole, top, value, ctx);                                        \
    }                                                                                      \
    static void NAME##_pop_heap(T *a, ptrdiff_t len, ptrdiff_t result, const void *ctx) { \
        T value = a[result];                                                               \
        a[result] = a[0];                                                                  \
        NAME##_adjust_heap(a, 0, len, value, ctx);                                         \
    }                                                                                      \
    static void NAME##_make_heap(T *a, ptrdiff_t len, const void *ctx) {                   \
        if (len < 2) return;                                                               \
        for (ptrdiff_t parent = (len - 2) / 2;; parent--) {                                \
            NAME##_adjust_heap(a, parent, len, a[parent], ctx);                            \
            if (parent == 0) return;                                                       \
        }                                                                                  \
    }                                                                                      \
    static void NAME##_partial_sort(T *a, size_t middle, size_t n, const void *ctx) {      \
        ptrdiff_t mid = (ptrdiff_t)middle, len = (ptrdiff_t)n;                             \
        NAME##_make_heap(a, mid, ctx);                                                     \
        for (ptrdiff_t i = mid; i < len; i++)                                              \
            if (LESS(ctx, &a[i], &a[0])) NAME##_pop_heap(a, mid, i, ctx);                  \
        for (ptrdiff_t last = mid; last > 1;) {                                            \
            last--;                                                                        \
            NAME##_pop_heap(a, last, last, ctx);                                           \
        }                                                                                  \
    }                                                                                      \
    static void NAME##_move_median_to_first(T *a, ptrdiff_t r, ptrdiff_t x, ptrdiff_t y,  \
                                            ptrdiff_t z, const void *ctx) {                \
        ptrdiff_t pick;                                                                    \
        if (LESS(ctx, &a[x], &a[y])) {                                                     \
            if (LESS(ctx, &a[y], &a[z])) pick = y;                                         \
            else if (LESS(ctx, &a[x], &a[z])) pick = z;                                    \
            else pick = x;                                                                 \
        } else if (LESS(ctx, &a[x], &a[z])) pick = x;                                      \
        else if (LESS(ctx, &a[y], &a[z])) pick = z;                                        \
        else pick = y;                                                                     \
        T t = a[r];                                                                        \
        a[r] = a[pick];                                                                    \
        a[pick] = t;                                                                       \
    }                                                                                      \
    static ptrdiff_t NAME##_partition_pivot(T *a, ptrdiff_t first, ptrdiff_t last,        \
                                            const void *ctx) {                             \
        const ptrdiff_t pivot = first, end = last;                                         \
        NAME##_move_median_to_first(a, first, first + 1, first + (last - first) / 2,       \
                                    last - 1, ctx);                                        \
        first++;                                                                           \
        for (;;) {                                                                         \
            while (first < end && LESS(ctx, &a[first], &a[pivot])) first++;                \
            last--;                                                                        \
            while (last > pivot && LESS(ctx, &a[pivot], &a[last])) last--;                 \
            if (!(first < last)) return first;                                             \
            T t = a[first];                                                                \
            a[first] = a[last];                                                            \
            a[last] = t;                                                                   \
            first++;                                                                       \
        }                                                                                  \
    }                                                                                      \
    static void NAME##_introsort(T *a, ptrdiff_t first, ptrdiff_t last, ptrdiff_t depth,  \
                                 const void *ctx) {                                        \
        while (last - first > STL_THRESHOLD) {                                             \
            if (depth == 0) {                                                              \
                size_t m = (size_t)(last - first);                                         \
                NAME##_partial_sort(a + first, m, m, ctx);                                 \
                return;                                                                    \
            }                                                                              \
            depth--;                                                                       \
            ptrdiff_t cut = NAME##_partition_pivot(a, first, last, ctx);                   \
            NAME##_introsort(a, cut, last, depth, ctx);                                    \
            last = cut;                                                                    \
        }                                                                                  \
    }                                                                                      \
    static void NAME##_linear_insert(T *a, ptrdiff_t last, const void *ctx) {              \
        T value = a[last];                                                                 \
        ptrdiff_t next = last - 1;                                                         \
        while (next >= 0 && LESS(ctx, &value, &a[next])) {                                 \
            a[last] = a[next];                                                             \
            last = next--;                                                                 \
        }                                                                                  \
        a[last] = value;                                                                   \
    }                                                                                      \
    static void NAME##_insertion_sort(T *a, ptrdiff_t first, ptrdiff_t last,              \
                                      const void *ctx) {                                   \
        if (first == last) return;                                                         \
        for (ptrdiff_t i = first + 1; i != last; i++) {                                    \
            if (LESS(ctx, &a[i], &a[first])) {                                             \
                T value = a[i];                                                            \
                memmove(&a[first + 1], &a[first], (size_t)(i - first) * sizeof(T));        \
                a[first] = value;                                                          \
            } else {                                                                       \
                NAME##_linear_insert(a, i, ctx);                                           \
            }                                                                              \
        }                                                                                  \
    }                                                                                      \
    static void NAME##_sort(T *a, size_t n, const void *ctx) {                             \
        if (n == 0) return;                                                                \
        ptrdiff_t len = (ptrdiff_t)n;                                                      \
        NAME##_introsort(a, 0, len, floor_log2(n) * 2, ctx);                               \
        if (len > STL_THRESHOLD) {                                                         \
            NAME##_insertion_sort(a, 0, STL_THRESHOLD, ctx);                               \
            for (ptrdiff_t i = STL_THRESHOLD; i != len; i++) NAME##_linear_insert(a, i, ctx); \
        } else {                                                                           \
            NAME##_insertion_sort(a, 0, len, ctx);                                         \
        }                                                                                  \
    }

/* llama's comparator everywhere: a.logit > b.logit. */
#define LOGIT_GREATER(ctx, x, y) ((void)(ctx), (x)->logit > (y)->logit)
DEFINE_STL_SORT(tok, mu_token_data, LOGIT_GREATER)

/* typical_p sorts indices by ascending shifted score. */
#define SCORE_LESS(ctx, x, y) (((const float *)(ctx))[*(x)] < ((const float *)(ctx))[*(y)])
DEFINE_STL_SORT(idx, size_t, SCORE_LESS)

void mu_cand_std_sort(mu_token_data *a, size_t n) { tok_sort(a, n, NULL); }

void mu_cand_std_partial_sort(mu_token_data *a, size_t middle, size_t n) {
    tok_partial_sort(a, middle, n, NULL);
}

/* tok_partial_sort(a, k, n) of the fresh candidates of a logits row, with
 * `banned` ids at logit + -INFINITY (the logit-bias stage's arithmetic),
 * without building the n candidates: the partial sort reads element i only
 * to compare it with the heap's top, and only an element that passes moves
 * into the first k (the tail it writes is never read again). So the row is
 * scanned 16 values at a time against the top (a loop the compiler
 * vectorizes), and only passing values are made candidates, in index order,
 * with the same heap moves: out[0..k) ends exactly as tok_partial_sort
 * leaves a[0..k). */
void mu_cand_top_k_of_row(mu_token_data *out, const float *logits, size_t n, size_t k, const int32_t *banned,
                          size_t n_banned) {
    for (size_t i = 0; i < k; i++) out[i] = (mu_token_data){(int32_t)i, logits[i], 0.0f};
    for (size_t b = 0; b < n_banned; b++)
        if ((size_t)banned[b] < k) out[banned[b]].logit += -INFINITY;
    const ptrdiff_t mid = (ptrdiff_t)k;
    tok_make_heap(out, mid, NULL);
    size_t i = k;
    while (i < n) {
        const float top = out[0].logit;
        if (i + 16 <= n) { /* the common case: nothing in the next 16 beats the top */
            int any = 0;
            for (int j = 0; j < 16; j++) any |= logits[i + j] > top;
            if (!any) {
                i += 16;
                continue;
            }
        }
        const size_t e = i + 16 < n ? i + 16 : n;
        for (; i < e; i++) {
            mu_token_data v = {(int32_t)i, logits[i], 0.0f};
            for (size_t b = 0; b < n_banned; b++)
                if ((size_t)banned[b] == i) v.logit += -INFINITY;
            if (v.logit > out[0].logit) tok_adjust_heap(out, 0, mid, v, NULL); /* tok_pop_heap(a, k, i) */
        }
    }
    for (ptrdiff_t last = mid; last > 1;) {
        last--;
        tok_pop_heap(out, last, last, NULL);
    }
}

void mu_sample_sort_indices_by_score(size_t *idx, size_t n, const float *score) {
    idx_sort(idx, n, score);
}

void mu_sample_work_free(mu_sample_work *w) {
    free(w->tok);
    free(w->bucket);
    free(w->score);
    free(w->order);
    memset(w, 0, sizeof *w);
}

void mu_sample_work_reserve(mu_sample_work *w, size_t n) {
    if (n == 0) n = 1;
    if (w->tok_cap < n) {
        w->tok = mu_xrealloc(w->tok, n * sizeof *w->tok);
        w->tok_cap = n;
    }
    if (w->bucket_cap < n) {
        w->bucket = mu_xrealloc(w->bucket, n * sizeof *w->bucket);
        w->bucket_cap = n;
    }
    if (w->score_cap < n) {
        w->score = mu_xrealloc(w->score, n * sizeof *w->score);
        w->order = mu_xrealloc(w->order, n * sizeof *w->order);
        w->score_cap = n;
    }
}

/* int(float) as x86-64 SSE truncation does it: NaN and out-of-range values
 * become INT32_MIN (C leaves that undefined; llama's int(x) casts run on x86). */
int32_t mu_sample_f2i_x86(float v) {
    if (!(v > -2147483904.0f && v < 2147483648.0f)) return INT32_MIN;
    return (int32_t)v;
}

enum { N_BUCKETS = 128 };

/* llama_token_data_array_partial_sort: bucket candidates by logit over
 * [-10, 10) into 128 bins, keep the bins from the top down to the one that
 * completes `npartial`, std::sort the full bins and std::partial_sort the
 * last. Writes into w->tok; returns how many candidates it holds (>=
 * npartial; only the first npartial are ordered). */
size_t mu_sample_bucket_sort(const mu_candidates *c, size_t npartial, mu_sample_work *w) {
    const float scale = (float)N_BUCKETS / (10.0f - -10.0f);
    const float inter = 10.0f * scale;
    size_t histo[N_BUCKETS] = {0};
    mu_sample_work_reserve(w, c->size);
    for (size_t i = 0; i < c->size; i++) {
        int32_t ib = mu_sample_f2i_x86(scale * c->data[i].logit + inter);
        if (ib < 0) ib = 0;
        if (ib > N_BUCKETS - 1) ib = N_BUCKETS - 1;
        w->bucket[i] = ib;
        histo[ib]++;
    }
    size_t nhave = 0;
    int ib = N_BUCKETS - 1;
    for (; ib >= 0; ib--) {
        nhave += histo[ib];
        if (nhave >= npartial) break;
    }
    if (ib < 0) ib = 0; /* npartial > size: llama never asks for that */
    size_t start[N_BUCKETS];
    size_t at = 0;
    for (int j = N_BUCKETS - 1; j >= ib; j--) {
        start[j] = at;
        at += histo[j];
    }
    for (size_t i = 0; i < c->size; i++) {
        int j = w->bucket[i];
        if (j >= ib) w->tok[start[j]++] = c->data[i];
    }
    mu_token_data *p = w->tok;
    size_t done = 0;
    for (int j = N_BUCKETS - 1; j > ib; j--) {
        tok_sort(p, histo[j], NULL);
        p += histo[j];
        done += histo[j];
    }
    if (npartial > done) {
        size_t mid = npartial - done;
        if (mid > histo[ib]) mid = histo[ib];
        tok_partial_sort(p, mid, histo[ib], NULL);
    }
    return nhave;
}

void mu_cand_partial_sort_inplace(mu_candidates *c, size_t npartial, mu_sample_work *w) {
    if (npartial <= 128) {
        tok_partial_sort(c->data, npartial, c->size, NULL);
    } else {
        mu_sample_bucket_sort(c, npartial, w);
        memcpy(c->data, w->tok, npartial * sizeof *c->data);
    }
    c->size = npartial;
    c->sorted = true;
}

void mu_sample_softmax(mu_candidates *c, bool do_sort, mu_sample_work *w) {
    if (c->size == 0) return; /* llama asserts */
    if (do_sort && !c->sorted) mu_cand_partial_sort_inplace(c, c->size, w);
    float max_l = c->data[0].logit;
    if (!c->sorted)
        for (size_t i = 1; i < c->size; i++)
            if (max_l < c->data[i].logit) max_l = c->data[i].logit; /* std::max */
    float cum_sum = 0.0f;
    for (size_t i = 0; i < c->size; i++) {
        float p = expf(c->data[i].logit - max_l);
        c->data[i].p = p;
        cum_sum += p;
    }
    for (size_t i = 0; i < c->size; i++) c->data[i].p /= cum_sum;
}
