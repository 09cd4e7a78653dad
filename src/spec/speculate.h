/* Exact greedy speculative decoding with a DFlash assistant (docs/speculative.md).
 *
 * Contract: the returned tokens are exactly the target's plain greedy
 * continuation (argmax, lowest id on ties, stopping after an end-of-
 * generation token or n_predict tokens). The assistant only proposes; the
 * target verifies [anchor, d1..dVL] in one batched feed (bit-identical to
 * one-row decode), the longest agreeing prefix plus the target's own next
 * token are kept, and the target KV is rolled back to that length. */
#ifndef MUSER_SPEC_SPECULATE_H
#define MUSER_SPEC_SPECULATE_H
#include "muser.h"
#include "spec/dflash.h"

typedef struct mu_spec_stats {
    int64_t n_generated;        /* tokens returned */
    int64_t verify_steps;       /* batched target feeds after the prompt */
    int64_t step_tokens;        /* tokens those steps committed (accepted + the target's own) */
    int64_t drafted;            /* proposals sent to verification */
    int64_t accepted;           /* proposals the target agreed with */
    double t_prefill, t_draft, t_verify, t_total; /* seconds */
} mu_spec_stats;

/* verify_len: proposals per step, 3, 7 or 15 (and < the block size).
 * Resets s (a session of target) and uses it; out holds n_predict ids.
 * Returns the number of tokens written, or -1 with err. */
int64_t mu_speculate_greedy(muser_model *target, const mu_dflash *d, muser_session *s, const int32_t *prompt,
                            int64_t n_prompt, int verify_len, int64_t n_predict, int32_t *out, mu_spec_stats *stats,
                            mu_error *err);

/* The reference: plain greedy decode, one token per feed, same stopping
 * rule. Resets s. Returns the count or -1; *t_decode (may be NULL) gets the
 * seconds spent after the prompt. */
int64_t mu_greedy_generate(muser_model *target, muser_session *s, const int32_t *prompt, int64_t n_prompt,
                           int64_t n_predict, int32_t *out, double *t_decode, mu_error *err);

/* Test hook: project the buffered rows and draft now (the assistant's
 * context is exactly the session's rows). */
void mu_spec_draft_now(muser_spec *sp, int32_t anchor, int n_prop, int32_t *proposals, float *logits);

#endif
