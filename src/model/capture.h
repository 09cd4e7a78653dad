/* Hidden-state capture on a session (internal): the target side of a DFlash
 * assistant reads the residual stream entering chosen layers for every row
 * it feeds. Off by default; when off a feed does no extra work. */
#ifndef MUSER_CAPTURE_H
#define MUSER_CAPTURE_H
#include "muser.h"
#include "util/common.h"
#include "backend/backend.h"

/* From the next feed on, record for every fed row the residual stream
 * entering each of the n layer boundaries (b = input of layer b, 0-based;
 * b == n_layer = after the last layer), side by side in the given order.
 * n == 0 turns capture off. Refuses out-of-range or repeated boundaries. */
bool mu_session_set_capture(muser_session *s, const int *boundaries, int n, mu_error *err);
/* Rows of the most recent feed / feed_all: [*n_rows][n * n_embd] floats, valid
 * until the next feed; NULL (and *n_rows = 0) when capture is off. The
 * buffer holds at least MU_CAPTURE_MIN_ROWS rows, finite (zeroed or older
 * captures) past the fed ones: a backend that projects a fixed row count
 * reads them (spec/dflash.h mu_dflash_project_fed). */
#define MU_CAPTURE_MIN_ROWS 16
const float *mu_session_captured(const muser_session *s, int64_t *n_rows);
/* The muser_spec bound to the session (set by muser_spec_create, cleared
 * by muser_spec_free), NULL without one: a durable pack of the session
 * carries its assistant's context (src/kvpack/, docs/kvpack.md). */
void mu_session_set_spec(muser_session *s, muser_spec *sp);
/* The logits row of the session's last token, computed elsewhere: a
 * speculative round's verify row of the last token it kept (bit-identical
 * to a one-row feed of it, docs/numerics.md), so the session has its row
 * after the rollback that dropped the rest, and a pack can be made of it. */
void mu_session_set_logits(muser_session *s, const float *row);
muser_spec *mu_session_spec(const muser_session *s);

/* A token tree (docs/speculative.md "Token trees") in one forward: row i
 * (token tokens[i]) is a child of row parent[i] < i, the root (parent -1)
 * continues the session; every row's logits go to out [n][n_vocab] and
 * its K/V to the cache at position pos + i, where pos is the session's
 * position before the call (which then advances by n, as a feed would).
 * Needs a checkpoint (the rows not kept are rolled back) and a backend
 * with `trees`; n <= MU_TREE_MAX. */
bool mu_session_feed_tree(muser_session *s, const int32_t *tokens, const int32_t *parent, int64_t n, float *out,
                          mu_error *err);
/* Keep a root-to-node path of the tree fed at pos0: rows path[0] = 0 <
 * path[1] < ... < path[n-1] move to positions pos0 .. pos0 + n - 1 (where
 * plain decoding stores them), the rest is rolled back, the session's
 * position becomes pos0 + n and its token record the path's tokens. */
bool mu_session_keep_path(muser_session *s, int64_t pos0, const int32_t *tokens, const int32_t *path, int n,
                          mu_error *err);
/* A verification that stays on the backend (speculate.c, greedy rounds):
 * feeds tokens (host ids, or MU_TOKEN_REG(i < n_regs): the draft's
 * proposals where argmax_reg or tree_reg left them) as one forward, n <=
 * 16, every row's logits left on the backend and pick_rows (backend.h)
 * over them into slot ([2 n + n_regs] int32 of host_alloc memory); the
 * session then has no logits row. tree_reg: the rows are the tree
 * registers' tree (backend.h mu_tree_regs, row i node i), stored at pos +
 * i as feed_tree stores a tree (keep a path with mu_session_keep_path).
 * Capture rows as for a feed. false (with err; a failed forward poisons
 * the session) when the backend has no registers or the input is refused. */
bool mu_session_feed_picks(muser_session *s, const int32_t *tokens, int64_t n, int n_regs, bool tree_reg,
                           int32_t *slot, mu_error *err);
/* The most rows feed_picks takes on this session (0: none). */
int64_t mu_session_picks_max(const muser_session *s);
/* The token record from pos0 on with its registers replaced by regs. */
void mu_session_resolve_regs(muser_session *s, int64_t pos0, const int32_t *regs, int n_regs);
/* After feed_picks: its first n logits rows go to out; a non-finite row is
 * refused as a feed refuses it (poisoning the session, err says where). */
bool mu_session_fetch_rows(muser_session *s, int64_t n, float *out, mu_error *err);
/* After feed_picks: its row `row`, which pick_rows found finite, becomes
 * the session's row, downloaded when something first reads it
 * (muser_session_logits, a snapshot, a fork): a greedy round's caller
 * never does, and the next round need not wait for the copy. Any later
 * feed replaces it. */
void mu_session_defer_row(muser_session *s, int64_t row);

#endif
