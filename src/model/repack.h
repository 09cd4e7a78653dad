/* Load-time weight layouts: hand each matrix of a model (or an assistant)
 * to its backend once, before any op reads it, so the backend can store
 * it in the layout its kernels stream fastest (backend.h: wants_repack). */
#ifndef MUSER_REPACK_H
#define MUSER_REPACK_H
#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/model.h"

/* If the backend wants it, first make f's mapping resident (gguf.h:
 * anonymous huge-page memory at the same addresses). Then repack the
 * weights ws[0..n) that live in f's mapping, in place: the pages are made
 * writable (private copy-on-write pages of the mapping, so the
 * file is never written and memory stays the file's size), rewritten and
 * made read-only again. Weights outside a mapping (caller memory) and
 * backends without a repack are left as they are. */
void mu_repack_weights(gguf_file *f, mu_backend *be, mu_weight *const *ws, size_t n);
/* The vectors vs[0..k) of n floats each (norms; NULL ones skipped) to a
 * backend that holds them (backend.h: hold; others: nothing). */
void mu_hold_vectors(mu_backend *be, const float *const *vs, size_t k, int64_t n);
/* Every matrix of m that goes through mu_backend.matmul (the embedding,
 * read one row at a time by the generic reader, stays), then its norm
 * vectors (mu_hold_vectors). */
void mu_model_repack(mu_model *m, mu_backend *be);

#endif
