/* Hidden-state capture on a session (internal): the target side of a DFlash
 * assistant reads the residual stream entering chosen layers for every row
 * it feeds. Off by default; when off a feed does no extra work. */
#ifndef MUSER_CAPTURE_H
#define MUSER_CAPTURE_H
#include "muser.h"
#include "util/common.h"

/* From the next feed on, record for every fed row the residual stream
 * entering each of the n layer boundaries (b = input of layer b, 0-based;
 * b == n_layer = after the last layer), side by side in the given order.
 * n == 0 turns capture off. Refuses out-of-range or repeated boundaries. */
bool mu_session_set_capture(muser_session *s, const int *boundaries, int n, mu_error *err);
/* Rows of the most recent feed / feed_all: [*n_rows][n * n_embd] floats, valid
 * until the next feed; NULL (and *n_rows = 0) when capture is off. */
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

#endif
