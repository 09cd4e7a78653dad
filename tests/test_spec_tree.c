/* Token trees over a draft's rows (src/spec/spec_tree.c), the reference
 * every backend's tree_reg reproduces: a row's candidates against a full
 * sort of the row (ties of equal values included), the probabilities
 * against the reference sum, the tree against the properties that define
 * it (best first over rank paths, the chain of first choices numbered
 * first, nothing under an end of generation), the tree registers, and the
 * host backends' tree_reg against the builder. */
#include "testutil.h"
#include "backend/backend.h"
#include "spec/spec_tree.h"
#include "util/mumath.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x5EED7EE5ull;

typedef struct {
    float v;
    int32_t i;
} vi;

static int cmp_vi(const void *a, const void *b) { /* value descending, index ascending */
    const vi *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* n values; `levels` > 0: drawn from that many distinct values (ties). */
static void fill_row(float *l, int64_t n, int levels) {
    for (int64_t i = 0; i < n; i++) {
        const double u = (double)(tu_rng_next(&rng) >> 11) / 9007199254740992.0;
        l[i] = levels ? (float)(int)(u * levels) * 0.75f - 3.0f : (float)(u * 16.0 - 8.0);
    }
}

static void test_row_top(void) {
    static const int64_t ns[] = {1, 5, 8, 9, 100, 8192};
    int checked = 0;
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (int levels = 0; levels <= 12; levels += 3) {
            const int64_t n = ns[a];
            float *l = malloc((size_t)n * sizeof(float));
            vi *all = malloc((size_t)n * sizeof(vi));
            fill_row(l, n, levels);
            for (int64_t i = 0; i < n; i++) all[i] = (vi){l[i], (int32_t)i};
            qsort(all, (size_t)n, sizeof *all, cmp_vi);
            int32_t tok[MU_SPEC_TREE_K];
            double prob[MU_SPEC_TREE_K];
            const int cnt = mu_spec_row_top(l, n, tok, prob);
            const int want = n < MU_SPEC_TREE_K ? (int)n : MU_SPEC_TREE_K;
            CHECK_MSG(cnt == want, "row of %lld: %d candidates, want %d", (long long)n, cnt, want);
            const double sum = mu_sum_expf_fixed_ref(l, (size_t)n, all[0].v);
            for (int j = 0; j < cnt && j < want; j++) {
                CHECK_MSG(tok[j] == all[j].i, "row of %lld (%d levels): rank %d is %d, want %d", (long long)n, levels, j,
                          tok[j], all[j].i);
                const double p = (double)mu_expf(all[j].v - all[0].v) / sum;
                CHECK_MSG(memcmp(&p, &prob[j], sizeof p) == 0, "row of %lld: rank %d's probability", (long long)n, j);
                checked++;
            }
            l[n / 2] = levels % 2 ? NAN : INFINITY; /* a non-finite value: no candidates */
            CHECK(mu_spec_row_top(l, n, tok, prob) == 0);
            free(l);
            free(all);
        }
    CHECK(checked > 100);
}

static bool is_eog_of(int32_t tok, const int32_t *eog, int n_eog) {
    for (int i = 0; i < n_eog; i++)
        if (eog[i] == tok) return true;
    return false;
}

/* spec_tree.h's weight of a candidate of rank k in row d under a node of
 * rank r, spelled out again: first choices past row 0 nearer 1 by a
 * quarter of their distance; under a node that is not a first choice the
 * first choice times 5/8, the second times 3/2. */
static double weight(double p, int d, int k, int r) {
    double w = k == 0 && d > 0 ? 1.0 - (1.0 - p) * 0.75 : p;
    if (r > 0 && k == 0) w *= 0.625;
    if (r > 0 && k == 1) w *= 1.5;
    return w;
}

/* Every property that defines the tree, for rows [n_rows][V]. */
static void check_tree(const float *rows, int64_t V, int n_rows, const int32_t *eog, int n_eog, const char *what) {
    int32_t tok[MU_TREE_MAX][MU_SPEC_TREE_K];
    double prob[MU_TREE_MAX][MU_SPEC_TREE_K];
    int cnt[MU_TREE_MAX];
    for (int d = 0; d < n_rows; d++) cnt[d] = mu_spec_row_top(rows + d * V, V, tok[d], prob[d]);
    mu_spec_tree t;
    mu_spec_tree_build(rows, V, n_rows, 4242, eog, n_eog, &t);
    CHECK_MSG(t.n >= 1 && t.n <= n_rows + 1 && t.token[0] == 4242 && t.parent[0] == -1 && t.depth[0] == 0, "%s", what);
    double score[MU_TREE_MAX];
    int children[MU_TREE_MAX] = {0};
    bool ok = true;
    score[0] = 1.0;
    for (int i = 1; i < t.n; i++) {
        const int p = t.parent[i], d = t.depth[i] - 1;
        ok &= p >= 0 && p < i && t.depth[i] == t.depth[p] + 1 && d < n_rows && t.rank[i] < cnt[d];
        if (!ok) break;
        ok &= t.token[i] == tok[d][t.rank[i]];
        ok &= !(p && is_eog_of(t.token[p], eog, n_eog));
        score[i] = score[p] * weight(prob[d][t.rank[i]], d, t.rank[i], t.rank[p]);
        children[p]++;
    }
    CHECK_MSG(ok, "%s: a node breaks the tree's shape", what);
    if (!ok) return;
    /* a node's children are its row's candidates in rank order */
    for (int i = 0; i < t.n; i++) {
        int seen = 0;
        for (int c = i + 1; c < t.n; c++)
            if (t.parent[c] == i) seen |= 1 << t.rank[c];
        CHECK_MSG(seen == (1 << children[i]) - 1, "%s: node %d's children skip a rank", what, i);
    }
    /* the chain of first choices comes first */
    for (int i = 1, cur = 0; i < t.n; i++) {
        const bool on_chain = t.parent[i] == cur && t.rank[i] == 0;
        if (!on_chain) {
            for (int c = i; c < t.n; c++) CHECK_MSG(!(t.parent[c] == cur && t.rank[c] == 0), "%s: chain not first", what);
            break;
        }
        cur = i;
    }
    /* best first: every node outranks every child that could have joined */
    double least = 2.0, best_out = -1.0;
    for (int i = 1; i < t.n; i++) least = score[i] < least ? score[i] : least;
    for (int i = 0; i < t.n; i++) {
        const int d = t.depth[i];
        if (d >= n_rows || children[i] >= cnt[d] || (i && is_eog_of(t.token[i], eog, n_eog))) continue;
        const double q = score[i] * weight(prob[d][children[i]], d, children[i], t.rank[i]);
        best_out = q > best_out ? q : best_out;
    }
    CHECK_MSG(t.n == n_rows + 1 ? least >= best_out : best_out < 0, "%s: %d nodes, least %.6g, a left-out child %.6g",
              what, t.n, least, best_out);
    /* the registers: ancestors along parents, fillers under the root */
    mu_tree_regs r;
    mu_spec_tree_regs(&t, &r);
    CHECK(r.n == t.n);
    for (int i = 0; i < MU_TREE_MAX; i++) {
        const int p = i < t.n ? t.parent[i] : 0, dep = i < t.n ? t.depth[i] : 1;
        bool good = r.parent[i] == (i ? p : -1) && r.depth[i] == dep && r.node[i].anc[dep] == i && r.node[i].anc[0] == 0;
        for (int d = dep; good && d > 0; d--) good = r.parent[r.node[i].anc[d]] == r.node[i].anc[d - 1];
        CHECK_MSG(good, "%s: tree register %d", what, i);
    }
}

static void test_trees(void) {
    enum { V = 300 };
    float *rows = malloc((size_t)(MU_TREE_MAX * V) * sizeof(float));
    char what[96];
    for (int trial = 0; trial < 60; trial++) {
        const int n_rows = 1 + trial % (MU_TREE_MAX - 1);
        const int levels = trial % 3 == 0 ? 6 : 0;
        for (int d = 0; d < n_rows; d++) fill_row(rows + d * V, V, levels);
        if (trial % 5 == 1) /* a peaked row: the chain runs deep */
            for (int d = 0; d < n_rows; d++) rows[d * V + (d * 37) % V] = 30.0f;
        if (trial % 5 >= 3) /* a few likely candidates a row, as a draft gives: deep and wide at once */
            for (int d = 0; d < n_rows; d++)
                for (int j = 0; j < 3; j++) rows[d * V + (int)(tu_rng_next(&rng) % V)] = 6.0f + 2.0f * (float)(j + d % 3);
        if (trial % 7 == 2) rows[(n_rows / 2) * V + 3] = NAN; /* a row with no candidates */
        int32_t eog[3];
        int n_eog = 0;
        if (trial % 4 == 3) { /* end of generation among the first choices */
            int32_t t0[MU_SPEC_TREE_K];
            double p0[MU_SPEC_TREE_K];
            if (mu_spec_row_top(rows, V, t0, p0)) eog[n_eog++] = t0[1];
            eog[n_eog++] = 7;
        }
        snprintf(what, sizeof what, "trial %d (%d rows, %d levels, %d eog)", trial, n_rows, levels, n_eog);
        check_tree(rows, V, n_rows, eog, n_eog, what);
    }
    /* a vocabulary smaller than the candidates: the tree runs out */
    fill_row(rows, 3, 0);
    fill_row(rows + 3, 3, 0);
    mu_spec_tree t;
    mu_spec_tree_build(rows, 3, 2, 1, NULL, 0, &t);
    CHECK(t.n == 3);
    check_tree(rows, 3, 2, NULL, 0, "V 3, 2 rows");
    check_tree(rows, 3, 1, NULL, 0, "V 3, 1 row");
    free(rows);
}

/* ref and cpu run mu_spec_tree_build itself (host_ops.c); the slot and
 * registers must say what the builder built. */
static void test_host_tree_reg(void) {
    enum { V = 8192, R = 15 };
    mu_backend *be = mu_backend_ref_create(1);
    float *rows = malloc((size_t)(R * V) * sizeof(float));
    for (int d = 0; d < R; d++) fill_row(rows + d * V, V, d % 2 ? 40 : 0);
    const int32_t eog[2] = {11, 4000};
    int32_t slot[MU_SPEC_TREE_SLOT];
    memset(slot, 0x55, sizeof slot);
    for (int n_rows = 1; n_rows <= R; n_rows += 7) {
        be->tree_reg(be, rows, V, n_rows, eog, 2, slot);
        mu_spec_tree t;
        mu_tree_regs r;
        mu_spec_tree_build(rows, V, n_rows, -1, eog, 2, &t);
        mu_spec_tree_regs(&t, &r);
        bool ok = slot[0] == t.n && !memcmp(&r, &be->treg, sizeof r);
        for (int i = 0; i < MU_TREE_MAX; i++) {
            ok &= slot[1 + i] == r.parent[i];
            ok &= slot[1 + MU_TREE_MAX + i] == (i == 0 ? -1 : i < t.n ? t.token[i] : 0);
            if (i < n_rows) ok &= be->regs[i] == (i + 1 < t.n ? t.token[i + 1] : 0);
        }
        CHECK_MSG(ok, "tree_reg over %d rows", n_rows);
    }
    free(rows);
    be->destroy(be);
}

int main(void) {
    test_row_top();
    test_trees();
    test_host_tree_reg();
    TEST_MAIN_END();
}
