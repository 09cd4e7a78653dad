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

/* The assistant's geometry as a durable pack records it (docs/kvpack.md,
 * "Identity": the assistant extension). */
typedef struct mu_spec_geom {
    const char *path;           /* the assistant's GGUF */
    int64_t n_layer, n_head_kv, head_dim, sink, window;
    int64_t feat_floats;        /* floats per captured target row */
    int64_t feat_rows;          /* captured rows the spec buffers at most */
} mu_spec_geom;
void mu_spec_geometry(const muser_spec *sp, mu_spec_geom *g);
/* The assistant's state as a pack's DFlash section payload: *rows its
 * committed context rows, then the held cache slots and the buffered rows
 * (the session's position minus *rows of them). Refused when the
 * assistant is not in step with the session. */
bool mu_spec_export(const muser_spec *sp, int64_t *rows, unsigned char **out, uint64_t *len, mu_error *err);
/* Make the assistant hold exactly an exported state (its payload checked
 * by the caller against this geometry). */
void mu_spec_import(muser_spec *sp, int64_t rows, int64_t n_feats, const unsigned char *data);

/* Test hook: project the buffered rows and draft now (the assistant's
 * context is exactly the session's rows). */
void mu_spec_draft_now(muser_spec *sp, int32_t anchor, int n_prop, int32_t *proposals, float *logits);

#endif
