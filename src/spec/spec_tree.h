/* Token trees for speculative verification (docs/speculative.md "Token
 * trees"): the tree over a draft's rows, built by the host for a round that
 * draws on the host and by a backend's tree_reg op (backend.h) for a greedy
 * round that stays on the backend. Both build the same tree from the same
 * rows; mu_spec_tree_build is the reference. */
#ifndef MUSER_SPEC_TREE_H
#define MUSER_SPEC_TREE_H
#include <stdbool.h>
#include <stdint.h>
#include "backend/backend.h"

#define MU_SPEC_TREE_K 8        /* candidates per draft row */
#define MU_SPEC_TREE_EOG_MAX 16 /* end-of-generation ids a backend's tree_reg takes */
#define MU_SPEC_TREE_SLOT (1 + 2 * MU_TREE_MAX) /* int32 of tree_reg's host slot */

typedef struct mu_spec_tree {
    int n; /* nodes, the root included */
    int32_t token[MU_TREE_MAX], parent[MU_TREE_MAX];
    int8_t depth[MU_TREE_MAX], rank[MU_TREE_MAX];
} mu_spec_tree;

/* A draft row's candidates: its MU_SPEC_TREE_K largest values (fewer when
 * n is smaller), larger first, the lower index first among equal values;
 * prob[j] = mu_expf(l[tok[j]] - l[tok[0]]) / mu_sum_expf_fixed(l, n,
 * l[tok[0]]) in double (the engine's exp and its order-free sum,
 * src/util/mumath.c).
 * Returns the count: 0 for a row holding a non-finite value (no
 * candidates: nothing grows from it). */
int mu_spec_row_top(const float *l, int64_t n, int32_t *tok, double *prob);

/* The weight of a node's child at draft row d (its depth d + 1) of rank k
 * in that row, its probability there p, under a node of rank r (the root:
 * 0), in double, exact binary constants and no contraction so that every
 * backend computes the same bits. The block's rows are marginals, each
 * predicted without the earlier rows' choices, and over held-out rounds of
 * the shipped pair (docs/speculative.md "Token trees") they are
 * miscalibrated in two ways the product of plain probabilities ignores:
 * first choices past the first row are kept more often than p says (their
 * distance to 1 shrunk by 3/4), and under a node that is not a first
 * choice the row's first choice is kept less often (x 5/8) and its second
 * more often (x 3/2): the block's rows follow the first choices' path.
 * Every weight stays <= 1, so a child never outscores its parent. */
static inline double mu_spec_tree_weight(double p, int d, int k, int r) {
    if (k == 0 && d >= 1) p = 1.0 - (1.0 - p) * 0.75;
    if (r != 0) p *= k == 0 ? 0.625 : k == 1 ? 1.5 : 1.0;
    return p;
}

/* The tree over n_rows (< MU_TREE_MAX) draft rows [n_rows][V] under a root
 * holding `root`: best first by the product of the weights
 * (mu_spec_tree_weight) along the path, at most n_rows + 1 nodes; a node
 * at depth d takes the candidate of its next rank in row d (a node's
 * children are its row's candidates in rank order); the earliest node
 * wins ties of the product; nothing grows under a node whose token is one
 * of eog[0 .. n_eog) (the root aside).
 * Numbered for the verification: the chain of first choices under the root
 * first (a path kept along it moves no rows), then the other nodes in the
 * order they joined; so every parent comes before its children. */
void mu_spec_tree_build(const float *rows, int64_t V, int n_rows, int32_t root, const int32_t *eog, int n_eog,
                        mu_spec_tree *t);

/* The tree registers for tree t (nodes t->n .. MU_TREE_MAX - 1 fillers). */
void mu_spec_tree_regs(const mu_spec_tree *t, mu_tree_regs *r);

#endif
