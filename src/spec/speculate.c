/* Greedy speculative decoding: draft a block with the DFlash assistant,
 * verify it with one batched target feed, keep the agreeing prefix plus the
 * target's own next token, roll the target back to that length and hand the
 * kept rows' hidden states to the assistant's context (speculate.h). */
#include "spec/speculate.h"
#include "model/api_internal.h"
#include "model/capture.h"
#include <stdlib.h>

static int32_t argmax(const float *l, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

int64_t mu_greedy_generate(muser_model *target, muser_session *s, const int32_t *prompt, int64_t n_prompt,
                           int64_t n_predict, int32_t *out, double *t_decode, mu_error *err) {
    const int64_t V = target->m->cfg.n_vocab;
    muser_session_reset(s);
    if (n_predict <= 0) return 0;
    if (!muser_session_feed(s, prompt, n_prompt, (muser_error *)err)) return -1;
    double t0 = mu_now();
    int64_t n = 0;
    out[n++] = argmax(muser_session_logits(s), V);
    while (n < n_predict && !muser_token_is_eog(target, out[n - 1])) {
        if (!muser_session_feed(s, &out[n - 1], 1, (muser_error *)err)) return -1;
        out[n++] = argmax(muser_session_logits(s), V);
    }
    if (t_decode) *t_decode = mu_now() - t0;
    return n;
}

typedef struct spec_run {
    muser_model *target;
    muser_session *s;
    mu_dflash_state *draft;
    int verify_len;
    int64_t n_predict, n;       /* wanted, produced */
    int32_t *out;
    float *logits;              /* [verify_len + 1][n_vocab] */
    mu_spec_stats *st;
} spec_run;

/* Proposals worth verifying: at most vl, none past a proposed end-of-generation. */
static int cut_at_eog(const spec_run *r, const int32_t *prop, int vl) {
    for (int i = 0; i < vl; i++)
        if (muser_token_is_eog(r->target, prop[i])) return i + 1;
    return vl;
}

/* Emit one token; false once the stream is complete. */
static bool emit(spec_run *r, int32_t tok) {
    r->out[r->n++] = tok;
    return r->n < r->n_predict && !muser_token_is_eog(r->target, tok);
}

/* One draft + verify round at the anchor. false: stream complete or error
 * (*failed says which). */
static bool spec_step(spec_run *r, int32_t *anchor, bool *failed, mu_error *err) {
    const int64_t V = r->target->m->cfg.n_vocab;
    const int64_t P = muser_session_pos(r->s);
    int64_t room = muser_session_n_ctx(r->s) - P - 1;
    int64_t vl = r->verify_len;
    if (vl > r->n_predict - r->n - 1) vl = r->n_predict - r->n - 1; /* never verify past n_predict */
    if (vl > room) vl = room;
    if (room < 0) {
        mu_err_set(err, "context full at position %lld (n_ctx %lld)", (long long)P, (long long)muser_session_n_ctx(r->s));
        *failed = true;
        return false;
    }
    int32_t block[16];
    block[0] = *anchor;
    double t0 = mu_now();
    if (vl > 0) {
        mu_dflash_draft(r->draft, *anchor, (int)vl, block + 1, NULL);
        vl = cut_at_eog(r, block + 1, (int)vl);
    }
    double t1 = mu_now();
    bool ok = muser_session_checkpoint(r->s, (muser_error *)err) &&
              muser_session_feed_all(r->s, block, vl + 1, r->logits, (muser_error *)err);
    int64_t k = 0;
    while (ok && k < vl && block[k + 1] == argmax(r->logits + k * V, V)) k++;
    int32_t next = ok ? argmax(r->logits + k * V, V) : 0;
    int64_t n_rows = 0;
    const float *feats = ok ? mu_session_captured(r->s, &n_rows) : NULL;
    ok = ok && n_rows == vl + 1 && muser_session_rollback(r->s, P + k + 1, (muser_error *)err);
    if (!ok) {
        if (!err->msg[0]) mu_err_set(err, "hidden-state capture returned %lld rows for %lld fed", (long long)n_rows,
                                     (long long)vl + 1);
        *failed = true;
        return false;
    }
    muser_session_commit(r->s);
    double t2 = mu_now();
    mu_dflash_append_context(r->draft, feats, k + 1);
    r->st->t_draft += (t1 - t0) + (mu_now() - t2);
    r->st->t_verify += t2 - t1;
    r->st->verify_steps++;
    r->st->step_tokens += k + 1;
    r->st->drafted += vl;
    r->st->accepted += k;
    for (int64_t i = 0; i < k; i++)
        if (!emit(r, block[i + 1])) return false;
    *anchor = next;
    return emit(r, next);
}

int64_t mu_speculate_greedy(muser_model *target, const mu_dflash *d, muser_session *s, const int32_t *prompt,
                            int64_t n_prompt, int verify_len, int64_t n_predict, int32_t *out, mu_spec_stats *stats,
                            mu_error *err) {
    mu_spec_stats local;
    mu_spec_stats *st = stats ? stats : &local;
    *st = (mu_spec_stats){0};
    if (err) err->msg[0] = 0;
    mu_error scratch_err = {{0}};
    if (!err) err = &scratch_err;
    if (verify_len != 3 && verify_len != 7 && verify_len != 15) {
        mu_err_set(err, "verify length %d: must be 3, 7 or 15", verify_len);
        return -1;
    }
    if (verify_len >= d->cfg.block_size) {
        mu_err_set(err, "verify length %d needs a block of at least %d rows; the assistant's is %lld", verify_len,
                   verify_len + 1, (long long)d->cfg.block_size);
        return -1;
    }
    if (!mu_dflash_check_target(d, target->m, err)) return -1;
    muser_session_reset(s);
    if (n_predict <= 0) return 0;
    double t0 = mu_now();
    if (!mu_session_set_capture(s, d->cfg.target_layers, (int)d->cfg.n_target_layers, err)) return -1;
    spec_run r = {
        .target = target, .s = s, .verify_len = verify_len, .n_predict = n_predict, .out = out, .st = st,
        .draft = mu_dflash_state_new(d, target->m, target->be),
        .logits = mu_xmalloc((size_t)(verify_len + 1) * (size_t)target->m->cfg.n_vocab * sizeof(float)),
    };
    bool failed = !muser_session_feed(s, prompt, n_prompt, (muser_error *)err);
    int64_t n_rows = 0;
    const float *feats = failed ? NULL : mu_session_captured(s, &n_rows);
    if (!failed) {
        mu_dflash_append_context(r.draft, feats, n_rows);
        int32_t anchor = argmax(muser_session_logits(s), target->m->cfg.n_vocab);
        st->t_prefill = mu_now() - t0;
        if (emit(&r, anchor))
            while (spec_step(&r, &anchor, &failed, err)) {}
    }
    mu_session_set_capture(s, NULL, 0, NULL);
    mu_dflash_state_free(r.draft);
    free(r.logits);
    st->n_generated = r.n;
    st->t_total = mu_now() - t0;
    return failed ? -1 : r.n;
}
