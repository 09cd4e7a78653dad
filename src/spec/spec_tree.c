/* Token trees over a draft's rows (spec_tree.h): the host's builder, the
 * reference for every backend's tree_reg. */
#include "spec/spec_tree.h"
#include "util/common.h"
#include "util/mumath.h"
#include <string.h>

int mu_spec_row_top(const float *l, int64_t n, int32_t *tok, double *prob) {
    if (n <= 0 || mu_first_nonfinite(l, n) < n) return 0;
    float val[MU_SPEC_TREE_K] = {0};
    int cnt = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v = l[i];
        if (cnt == MU_SPEC_TREE_K && !(v > val[cnt - 1])) continue; /* an equal later value stays out */
        int j = cnt < MU_SPEC_TREE_K ? cnt++ : cnt - 1;
        for (; j > 0 && v > val[j - 1]; j--) { /* after every value >= v: the lower index first */
            val[j] = val[j - 1];
            tok[j] = tok[j - 1];
        }
        val[j] = v;
        tok[j] = (int32_t)i;
    }
    const double sum = mu_sum_expf_fixed(l, (size_t)n, val[0]);
    for (int j = 0; j < cnt; j++) prob[j] = (double)mu_expf(val[j] - val[0]) / sum;
    return cnt;
}

static bool is_eog(int32_t tok, const int32_t *eog, int n_eog) {
    for (int i = 0; i < n_eog; i++)
        if (eog[i] == tok) return true;
    return false;
}

void mu_spec_tree_build(const float *rows, int64_t V, int n_rows, int32_t root, const int32_t *eog, int n_eog,
                        mu_spec_tree *t) {
    int32_t tok[MU_TREE_MAX][MU_SPEC_TREE_K];
    double prob[MU_TREE_MAX][MU_SPEC_TREE_K], score[MU_TREE_MAX];
    int cnt[MU_TREE_MAX], next[MU_TREE_MAX];
    if (n_rows > MU_TREE_MAX - 1) n_rows = MU_TREE_MAX - 1;
    for (int d = 0; d < n_rows; d++) cnt[d] = mu_spec_row_top(rows + (int64_t)d * V, V, tok[d], prob[d]);
    mu_spec_tree g = {.n = 1, .token = {root}, .parent = {-1}};
    next[0] = 0;
    score[0] = 1.0;
    while (g.n < n_rows + 1) {
        int best = -1;
        double best_q = -1;
        for (int i = 0; i < g.n; i++) { /* each node's next child; the earliest node wins ties */
            const int d = g.depth[i];
            if (d >= n_rows || next[i] >= cnt[d] || (i && is_eog(g.token[i], eog, n_eog))) continue;
            const double q = score[i] * mu_spec_tree_weight(prob[d][next[i]], d, next[i], g.rank[i]);
            if (q > best_q) {
                best_q = q;
                best = i;
            }
        }
        if (best < 0) break;
        const int i = g.n++, d = g.depth[best];
        g.parent[i] = best;
        g.depth[i] = (int8_t)(d + 1);
        g.rank[i] = (int8_t)next[best]++;
        g.token[i] = tok[d][g.rank[i]];
        next[i] = 0;
        score[i] = best_q;
    }
    /* the first choices' chain, then the rest in joining order */
    int order[MU_TREE_MAX], at[MU_TREE_MAX], n = 0;
    bool placed[MU_TREE_MAX] = {false};
    for (int cur = 0, i = 1; cur >= 0; cur = i < g.n ? i : -1) {
        order[n++] = cur, placed[cur] = true;
        for (i = cur + 1; i < g.n && !(g.parent[i] == cur && g.rank[i] == 0); i++) {}
    }
    for (int i = 0; i < g.n; i++)
        if (!placed[i]) order[n++] = i;
    for (int j = 0; j < g.n; j++) at[order[j]] = j;
    memset(t, 0, sizeof *t);
    t->n = g.n;
    for (int j = 0; j < g.n; j++) {
        const int i = order[j];
        t->token[j] = g.token[i], t->depth[j] = g.depth[i], t->rank[j] = g.rank[i];
        t->parent[j] = i ? at[g.parent[i]] : -1;
    }
}

void mu_spec_tree_regs(const mu_spec_tree *t, mu_tree_regs *r) {
    memset(r, 0, sizeof *r);
    r->n = t->n;
    for (int i = 0; i < MU_TREE_MAX; i++) {
        r->parent[i] = i >= t->n ? 0 : t->parent[i];
        r->depth[i] = i >= t->n ? 1 : t->depth[i];
    }
    for (int i = 0; i < MU_TREE_MAX; i++)
        for (int a = i, d = r->depth[i]; d >= 0; a = r->parent[a], d--) r->node[i].anc[d] = a;
}
