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

/* The tree over n_rows (< MU_TREE_MAX) draft rows [n_rows][V] under a root
 * holding `root`: best first by the product of probabilities along the
 * path, at most n_rows + 1 nodes; a node at depth d takes the candidate of
 * its next rank in row d (a node's children are its row's candidates in
 * rank order); the earliest node wins ties of the product; nothing grows
 * under a node whose token is one of eog[0 .. n_eog) (the root aside).
 * Numbered for the verification: the chain of first choices under the root
 * first (a path kept along it moves no rows), then the other nodes in the
 * order they joined; so every parent comes before its children. */
void mu_spec_tree_build(const float *rows, int64_t V, int n_rows, int32_t root, const int32_t *eog, int n_eog,
                        mu_spec_tree *t);

/* The tree registers for tree t (nodes t->n .. MU_TREE_MAX - 1 fillers). */
void mu_spec_tree_regs(const mu_spec_tree *t, mu_tree_regs *r);

#endif
