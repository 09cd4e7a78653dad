/* Speculative decoding with a DFlash assistant (docs/speculative.md): the
 * muser_spec API of include/muser.h lives in speculate.c; the request loop
 * that drives it is src/gen. This header keeps the test hook. */
#ifndef MUSER_SPEC_SPECULATE_H
#define MUSER_SPEC_SPECULATE_H
#include "muser.h"
#include "spec/dflash.h"

/* The session's last input was fed outside muser_spec (a server's batched
 * step) with capture on: hand its n rows to the assistant's context, as
 * muser_spec_feed would have. False when the capture does not hold n rows. */
bool mu_spec_take_fed(muser_spec *sp, int64_t n, mu_error *err);

/* Test hook: project the buffered rows and draft now (the assistant's
 * context is exactly the session's rows). */
void mu_spec_draft_now(muser_spec *sp, int32_t anchor, int n_prop, int32_t *proposals, float *logits);

#endif
