/* The engine's batch invariance: a sequence's logits are bit-identical
 * whether it runs alone or batched with others.
 *  - 8 sequences of different prompt lengths (some past the sliding-window
 *    ring wrap) join an engine at random steps, submit their prompts in
 *    random pieces (prefill chunks of several sizes) while others decode,
 *    then decode teacher-forced tokens; every logits row is compared byte
 *    for byte with the same sequence run alone in its own session.
 *  - inside the batch, one sequence verifies a block under a checkpoint and
 *    rolls back (as speculation does), another snapshots, runs ahead and
 *    restores: both then continue exactly as the solo run.
 *  - forks and truncation: a fork of a prefix, or a session truncated back
 *    to one, continues exactly as the solo run; either is refused when the
 *    ring has already dropped the window before that position.
 * For ref and cpu, every weight format; three engine shapes on cpu, one on ref
 * (against the same solo rows). */
#include <stdlib.h>
#include "testutil.h"
#include "model_fixture.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include <math.h>
#include "muser.h"
#include "model/api_internal.h"

#define N_SEQ 8
#define N_DECODE 6
#define WINDOW 32
#define MAX_PROMPT 96

static const int64_t PROMPT_LEN[N_SEQ] = {5, 17, 33, 48, 70, 3, 90, 40}; /* 33+ pass the window of 32 */
#define SPEC_SEQ 3   /* verifies a 4-row block under a checkpoint at its 3rd decode step */
#define SNAP_SEQ 4   /* snapshots after its prompt, runs 5 junk tokens, restores */

static int32_t token_of(int seq, int64_t i) { return (int32_t)((seq * 977 + i * 131 + 17) % 300); }

typedef struct solo {
    float *rows; /* [1 + N_DECODE][V]: after the prompt, after each decode token */
} solo;

static bool same_row(const float *a, const float *b, int64_t V) { return !memcmp(a, b, (size_t)V * sizeof(float)); }

static void run_solo(muser_model *m, int seq, int64_t V, solo *out) {
    muser_error err;
    muser_session_params sp = {.n_ctx = 256};
    muser_session *s = muser_session_create(m, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) return;
    int32_t toks[MAX_PROMPT + N_DECODE];
    for (int64_t i = 0; i < PROMPT_LEN[seq] + N_DECODE; i++) toks[i] = token_of(seq, i);
    out->rows = malloc((size_t)((1 + N_DECODE) * V) * sizeof(float));
    CHECK_MSG(muser_session_feed(s, toks, PROMPT_LEN[seq], &err), "%s", err.msg);
    memcpy(out->rows, muser_session_logits(s), (size_t)V * sizeof(float));
    for (int d = 0; d < N_DECODE; d++) {
        CHECK_MSG(muser_session_feed(s, &toks[PROMPT_LEN[seq] + d], 1, &err), "%s", err.msg);
        memcpy(out->rows + (d + 1) * V, muser_session_logits(s), (size_t)V * sizeof(float));
    }
    muser_session_free(s);
}

typedef struct live {
    muser_session *s;
    int phase;            /* 0 not started, 1 prompt, 2 decode, 3 done */
    int64_t submitted;    /* prompt tokens submitted so far */
    int d;                /* decode tokens submitted */
    bool outstanding;     /* a submission is queued */
    int what;             /* 0 prompt piece, 1 decode token, 2 verify block, 3 junk after snapshot */
    float *block;         /* verify block rows [4][V] */
    muser_snapshot *snap;
} live;

static int64_t rnd(uint64_t *r, int64_t n) { return (int64_t)(tu_rng_next(r) % (uint64_t)n); }

/* Submit this sequence's next input; returns false when it is done. */
static void submit_next(live *L, int seq, uint64_t *rng, int64_t V) {
    muser_error err = {{0}};
    int32_t toks[20];
    bool ok = true;
    if (L->phase == 1) {
        const int64_t left = PROMPT_LEN[seq] - L->submitted;
        int64_t n = 1 + rnd(rng, 20);
        if (n > left) n = left;
        for (int64_t i = 0; i < n; i++) toks[i] = token_of(seq, L->submitted + i);
        /* as a prompt (chunked, budgeted) or plainly (whole when short): the same bits */
        ok = rnd(rng, 2) ? muser_session_submit_prompt(L->s, toks, n, NULL, &err)
                         : muser_session_submit(L->s, toks, n, NULL, &err);
        L->submitted += n;
        L->what = 0;
    } else if (L->phase == 2 && seq == SNAP_SEQ && L->d == 0 && !L->snap) {
        L->snap = muser_session_snapshot(L->s);
        CHECK(L->snap != NULL);
        for (int i = 0; i < 5; i++) toks[i] = (int32_t)(250 + i);
        ok = muser_session_submit(L->s, toks, 5, NULL, &err);
        L->what = 3;
    } else if (L->phase == 2 && seq == SPEC_SEQ && L->d == 2 && !L->block) {
        L->block = malloc((size_t)(4 * V) * sizeof(float));
        toks[0] = token_of(seq, PROMPT_LEN[seq] + L->d);
        toks[1] = 7, toks[2] = 8, toks[3] = 9; /* proposals that will be rejected */
        ok = muser_session_checkpoint(L->s, &err) && muser_session_submit(L->s, toks, 4, L->block, &err);
        L->what = 2;
    } else {
        toks[0] = token_of(seq, PROMPT_LEN[seq] + L->d);
        ok = muser_session_submit(L->s, toks, 1, NULL, &err);
        L->what = 1;
    }
    CHECK_MSG(ok, "seq %d submit: %s", seq, err.msg);
    L->outstanding = ok;
}

/* A submission completed: check what it produced against the solo run. */
static void on_complete(live *L, int seq, const solo *ref, int64_t V, const char *label) {
    muser_error err = {{0}};
    const float *row = muser_session_logits(L->s);
    L->outstanding = false;
    switch (L->what) {
    case 0:
        if (L->submitted == PROMPT_LEN[seq]) {
            CHECK_MSG(row && same_row(row, ref->rows, V), "%s: seq %d prompt logits differ from solo", label, seq);
            L->phase = 2;
        }
        break;
    case 1:
        L->d++;
        CHECK_MSG(row && same_row(row, ref->rows + L->d * V, V), "%s: seq %d decode %d differs from solo", label, seq,
                  L->d);
        break;
    case 2: {
        L->d++;
        CHECK_MSG(same_row(L->block, ref->rows + L->d * V, V), "%s: seq %d verify row differs from solo", label, seq);
        const int64_t keep = muser_session_pos(L->s) - 3;
        CHECK_MSG(muser_session_rollback(L->s, keep, &err), "%s", err.msg);
        muser_session_commit(L->s);
        break;
    }
    case 3:
        CHECK_MSG(muser_session_restore(L->s, L->snap, &err), "%s", err.msg);
        CHECK(muser_session_pos(L->s) == PROMPT_LEN[seq]);
        break;
    }
    if (L->phase == 2 && L->d == N_DECODE) L->phase = 3;
}

static void run_batched(muser_model *m, const solo *ref, int64_t V, int64_t n_batch, int64_t chunk, int64_t budget,
                        uint64_t seed, const char *label) {
    muser_error err = {{0}};
    muser_engine_params ep = {.n_seq_max = N_SEQ, .n_ctx = 256, .n_batch = n_batch, .prefill_chunk = chunk,
                              .prefill_budget = budget};
    muser_engine *e = muser_engine_create(m, &ep, &err);
    CHECK_MSG(e, "%s", err.msg);
    if (!e) return;
    live L[N_SEQ] = {{0}};
    uint64_t rng = seed;
    int done = 0, steps = 0;
    int64_t mixed = 0; /* steps with prefill and decode rows together */
    while (done < N_SEQ && steps < 10000) {
        for (int i = 0; i < N_SEQ; i++) {
            if (L[i].phase == 0 && rnd(&rng, 4) == 0) {
                L[i].s = muser_engine_session(e, &err);
                CHECK_MSG(L[i].s, "%s", err.msg);
                if (!L[i].s) return;
                L[i].phase = 1;
            }
            if ((L[i].phase == 1 || L[i].phase == 2) && !L[i].outstanding) submit_next(&L[i], i, &rng, V);
        }
        muser_step_info info;
        int32_t rc = muser_engine_step(e, &info, &err);
        CHECK_MSG(rc >= 0, "%s: step: %s", label, err.msg);
        if (rc < 0) break;
        steps++;
        mixed += info.decode_rows > 0 && info.prefill_rows > 0;
        CHECK(info.rows <= n_batch);
        /* the budget holds prompt rows beside decode rows */
        if (budget > 0 && info.decode_rows > 0) CHECK_MSG(info.prefill_rows <= budget, "%s: %lld prompt rows", label, (long long)info.prefill_rows);
        for (int i = 0; i < N_SEQ; i++) {
            if (!L[i].outstanding || muser_session_queued(L[i].s) > 0) continue;
            CHECK_MSG(!muser_session_error(L[i].s)[0], "%s", muser_session_error(L[i].s));
            on_complete(&L[i], i, &ref[i], V, label);
            if (L[i].phase == 3) done++;
        }
    }
    CHECK_MSG(done == N_SEQ, "%s: %d of %d sequences finished in %d steps", label, done, N_SEQ, steps);
    CHECK_MSG(mixed > 0, "%s: no step mixed prefill and decode rows", label);
    CHECK(muser_engine_busy(e) == 0);
    /* An engine that is full refuses another session. */
    CHECK(!muser_engine_session(e, &err) && strstr(err.msg, "in use"));
    for (int i = 0; i < N_SEQ; i++) {
        free(L[i].block);
        muser_snapshot_free(L[i].snap);
    }
    muser_engine_free(e); /* frees the sessions still in it */
}

/* Fork a prefix of sequence 3 (48 tokens) at 40: the fork continues as the
 * solo run; a fork from sequence 6 (90 tokens) at 20 needs ring rows the
 * source has dropped and is refused, leaving the destination untouched. */
static void test_fork(muser_model *m, const solo *ref, int64_t V) {
    muser_error err = {{0}};
    muser_engine_params ep = {.n_seq_max = 3, .n_ctx = 256, .n_batch = 16};
    muser_engine *e = muser_engine_create(m, &ep, &err);
    muser_session *a = muser_engine_session(e, &err), *b = muser_engine_session(e, &err), *c = muser_engine_session(e, &err);
    CHECK(a && b && c);
    if (!a || !b || !c) return;
    int32_t toks[MAX_PROMPT + N_DECODE];
    for (int64_t i = 0; i < MAX_PROMPT + N_DECODE; i++) toks[i] = token_of(3, i); /* the solo stream, and on */
    CHECK(muser_session_feed(a, toks, 40, &err));
    CHECK_MSG(muser_session_fork(b, a, 40, &err), "%s", err.msg);
    CHECK(muser_session_logits(b) && same_row(muser_session_logits(b), muser_session_logits(a), V));
    CHECK(muser_session_feed(a, toks + 40, 20, &err)); /* the source runs on */
    /* a copy of the first 52 positions (the ring of 32 + 15 holds [13, 60)),
     * truncated back to 44 (the window before it starts at 13) and fed the
     * rest of the prompt again, gives the solo run too */
    muser_session *t = c;
    CHECK_MSG(muser_session_fork(t, a, 52, &err), "%s", err.msg);
    CHECK(!muser_session_truncate(t, 40, &err) && strstr(err.msg, "no longer holds"));
    CHECK_MSG(muser_session_truncate(t, 44, &err), "%s", err.msg);
    CHECK(muser_session_pos(t) == 44 && !muser_session_logits(t));
    CHECK(muser_session_feed(t, toks + 44, PROMPT_LEN[3] - 44, &err));
    CHECK_MSG(same_row(muser_session_logits(t), ref[3].rows, V), "truncate: prompt logits differ from solo");
    muser_session_reset(t);
    CHECK(muser_session_feed(b, toks + 40, PROMPT_LEN[3] - 40, &err));
    CHECK_MSG(same_row(muser_session_logits(b), ref[3].rows, V), "fork: prompt logits differ from solo");
    CHECK(muser_session_feed(b, toks + PROMPT_LEN[3], 1, &err));
    CHECK_MSG(same_row(muser_session_logits(b), ref[3].rows + V, V), "fork: decode differs from solo");
    /* c holds something; a refused fork must not change it */
    CHECK(muser_session_feed(c, toks, 3, &err));
    for (int64_t i = 0; i < PROMPT_LEN[6]; i++) toks[i] = token_of(6, i);
    muser_session_reset(a);
    CHECK(muser_session_feed(a, toks, PROMPT_LEN[6], &err));
    err.msg[0] = 0;
    CHECK(!muser_session_fork(c, a, 20, &err) && strstr(err.msg, "no longer holds"));
    CHECK(!muser_session_truncate(a, 20, &err) && strstr(err.msg, "no longer holds"));
    CHECK(muser_session_pos(a) == PROMPT_LEN[6]);
    CHECK(muser_session_pos(c) == 3);
    CHECK(!muser_session_fork(c, c, 1, &err));
    CHECK(!muser_session_fork(c, a, PROMPT_LEN[6] + 1, &err));
    muser_engine_free(e);
}

static muser_model *load(const char *type, muser_backend_kind backend) {
    muser_error err;
    muser_model_params mp = {.backend = backend, .n_threads = 2};
    muser_model *m = muser_model_load(fx_synth(type, 11, WINDOW), &mp, &err);
    CHECK_MSG(m, "%s: %s", type, m ? "" : err.msg);
    return m;
}

/* The solo runs come from the cpu backend; ref's batched rows are compared
 * with them too (ref and cpu give the same bits: docs/numerics.md), so the
 * slow scalar spec runs one engine shape and no solo set of its own. */
/* MUSER_TEST_CUDA=1 (tests/cuda/run.sh, on a machine with a GPU): the cuda
 * backend's batched rows against the cpu solo runs, instead of the cpu and
 * ref batch shapes. */
static void run_type_cuda(const char *type) {
    muser_model *cpu = load(type, MUSER_BACKEND_CPU), *cu = load(type, MUSER_BACKEND_CUDA);
    if (cpu && cu) {
        muser_model_info info;
        muser_model_get_info(cpu, &info);
        const int64_t V = info.n_vocab;
        solo want[N_SEQ];
        for (int i = 0; i < N_SEQ; i++) run_solo(cpu, i, V, &want[i]);
        static const int64_t shapes[][3] = {{8, 3, 0}, {24, 7, 5}, {64, 64, 0}}; /* n_batch, chunk, budget */
        char label[96];
        for (size_t k = 0; k < 3; k++) {
            snprintf(label, sizeof label, "%s on cuda, batch %lld chunk %lld budget %lld", type,
                     (long long)shapes[k][0], (long long)shapes[k][1], (long long)shapes[k][2]);
            run_batched(cu, want, V, shapes[k][0], shapes[k][1], shapes[k][2], 0x9E3779B97F4A7C15ull * (k + 1),
                        label);
        }
        for (int i = 0; i < N_SEQ; i++) free(want[i].rows);
    }
    muser_model_free(cpu);
    muser_model_free(cu);
}

/* A non-finite logit poisons its own session only, with a message naming
 * the token and the position (the engine's one scan of a forward's logits
 * rows, backend.h first_nonfinite, then the host scan of the session that
 * has one). The model: F32 glimmer-tiny weights whose token_embd row of
 * BAD_TOKEN holds +inf, so a row fed that token turns NaN throughout. One
 * engine step decodes three sessions, the middle one fed BAD_TOKEN: the
 * other two complete with their solo runs' logits, the middle one is
 * refused until reset, and after the reset decodes like a fresh session. */
#define BAD_TOKEN 7
static const char *inf_embd_model(void) {
    static char path[320];
    if (path[0]) return path;
    const char *src = fx_synth("F32", 11, WINDOW);
    snprintf(path, sizeof path, "%s/tiny-F32-inf-embd.gguf", fx_tmpdir());
    mu_error err;
    gguf_file *f = gguf_open(src, &err);
    CHECK_MSG(f, "%s", err.msg);
    const gguf_tensor *t = f ? gguf_find_tensor(f, "token_embd.weight") : NULL;
    CHECK(t && t->type == MU_TYPE_F32);
    FILE *out = fopen(path, "wb");
    CHECK(out && t);
    if (out && t) {
        float inf = INFINITY;
        CHECK(fwrite(f->base, 1, f->size, out) == f->size);
        CHECK(!fseek(out, (long)(t->file_offset + ((uint64_t)BAD_TOKEN * t->ne[0] + 3) * sizeof(float)), SEEK_SET));
        CHECK(fwrite(&inf, sizeof inf, 1, out) == 1);
    }
    if (out) fclose(out);
    gguf_close(f);
    return path;
}

static float *solo_logits(muser_model *m, const int32_t *t, int64_t n, int64_t V) {
    muser_error err;
    muser_session_params sp = {.n_ctx = 64};
    muser_session *s = muser_session_create(m, &sp, &err);
    CHECK_MSG(s, "%s", err.msg);
    float *row = calloc((size_t)V, sizeof(float));
    if (s && muser_session_feed(s, t, n, &err)) memcpy(row, muser_session_logits(s), (size_t)V * sizeof(float));
    else CHECK_MSG(false, "solo feed: %s", s ? err.msg : "no session");
    muser_session_free(s);
    return row;
}

static void test_nonfinite(muser_backend_kind backend, const char *label) {
    muser_error err;
    muser_model_params mp = {.backend = backend, .n_threads = 2};
    muser_model *m = muser_model_load(inf_embd_model(), &mp, &err);
    CHECK_MSG(m, "%s: %s", label, m ? "" : err.msg);
    if (!m) return;
    muser_model_info info;
    muser_model_get_info(m, &info);
    const int64_t V = info.n_vocab;
    const int32_t pa[6] = {1, 2, 3, 4, 5, 11}, pb[5] = {9, 8, 6, 5, BAD_TOKEN}, pc[7] = {3, 3, 1, 20, 21, 22, 12};
    float *want_a = solo_logits(m, pa, 6, V), *want_c = solo_logits(m, pc, 7, V), *want_b = solo_logits(m, pb, 4, V);
    muser_engine_params ep = {.n_seq_max = 3, .n_ctx = 64, .n_batch = 16};
    muser_engine *e = muser_engine_create(m, &ep, &err);
    CHECK_MSG(e, "%s", err.msg);
    muser_session *s[3] = {0};
    for (int i = 0; e && i < 3; i++) CHECK_MSG((s[i] = muser_engine_session(e, &err)), "%s", err.msg);
    if (e && s[0] && s[1] && s[2]) {
        CHECK_MSG(muser_session_feed(s[0], pa, 5, &err), "%s", err.msg);
        CHECK_MSG(muser_session_feed(s[1], pb, 4, &err), "%s", err.msg);
        CHECK_MSG(muser_session_feed(s[2], pc, 6, &err), "%s", err.msg);
        CHECK(muser_session_submit(s[0], &pa[5], 1, NULL, &err));
        CHECK(muser_session_submit(s[1], &pb[4], 1, NULL, &err));
        CHECK(muser_session_submit(s[2], &pc[6], 1, NULL, &err));
        muser_step_info si;
        const int32_t done = muser_engine_step(e, &si, &err);
        CHECK_MSG(done == 2 && si.rows == 3, "%s: step completed %d of 3 rows %lld", label, done, (long long)si.rows);
        const float *la = muser_session_logits(s[0]), *lc = muser_session_logits(s[2]);
        CHECK_MSG(la && !memcmp(la, want_a, (size_t)V * sizeof(float)), "%s: session 0's logits beside a NaN row", label);
        CHECK_MSG(lc && !memcmp(lc, want_c, (size_t)V * sizeof(float)), "%s: session 2's logits beside a NaN row", label);
        CHECK_MSG(!muser_session_logits(s[1]), "%s: the poisoned session still offers logits", label);
        const char *msg = muser_session_error(s[1]);
        CHECK_MSG(!strncmp(msg, "non-finite logit ", 17) && strstr(msg, " for token 0 at position 4 (refusing to sample)"),
                  "%s: message '%s'", label, msg);
        CHECK_MSG(!muser_session_submit(s[1], pa, 1, NULL, &err) && strstr(err.msg, "poisoned"),
                  "%s: a poisoned session took input (%s)", label, err.msg);
        muser_session_reset(s[1]);
        CHECK_MSG(muser_session_feed(s[1], pb, 4, &err), "%s: after reset: %s", label, err.msg);
        const float *lb = muser_session_logits(s[1]);
        CHECK_MSG(lb && !memcmp(lb, want_b, (size_t)V * sizeof(float)), "%s: logits after the reset", label);
    }
    muser_engine_free(e);
    free(want_a), free(want_b), free(want_c);
    muser_model_free(m);
}

static void run_type(const char *type) {
    if (getenv("MUSER_TEST_CUDA")) {
        run_type_cuda(type);
        return;
    }
    muser_model *cpu = load(type, MUSER_BACKEND_CPU), *ref = load(type, MUSER_BACKEND_REF);
    if (!cpu || !ref) {
        muser_model_free(cpu);
        muser_model_free(ref);
        return;
    }
    muser_model_info info;
    muser_model_get_info(cpu, &info);
    const int64_t V = info.n_vocab;
    solo want[N_SEQ];
    for (int i = 0; i < N_SEQ; i++) run_solo(cpu, i, V, &want[i]);
    static const int64_t shapes[][3] = {{8, 3, 0}, {24, 7, 5}, {64, 64, 0}}; /* n_batch, prefill_chunk, budget */
    char label[96];
    for (size_t k = 0; k < 3; k++) {
        snprintf(label, sizeof label, "%s on cpu, batch %lld chunk %lld budget %lld", type, (long long)shapes[k][0],
                 (long long)shapes[k][1], (long long)shapes[k][2]);
        run_batched(cpu, want, V, shapes[k][0], shapes[k][1], shapes[k][2], 0x9E3779B97F4A7C15ull * (k + 1), label);
    }
    snprintf(label, sizeof label, "%s on ref, batch 24 chunk 7", type);
    run_batched(ref, want, V, 24, 7, 0, 0xC2B2AE3D27D4EB4Full, label);
    test_fork(cpu, want, V);
    for (int i = 0; i < N_SEQ; i++) free(want[i].rows);
    muser_model_free(cpu);
    muser_model_free(ref);
}

/* The backend's preferred prompt chunk (mu_backend.prefill_rows; CUDA
 * 2,048): a session that asks for no chunk takes it, capped by depth so
 * that rows x 256-key blocks stay within what 512-row chunks reach at the
 * context's end (mu_prompt_rows), and its logits are those of 512-row
 * chunks. */
static void test_backend_chunk(void) {
    CHECK(mu_prompt_rows(2048, 0, 131072) == 2048);
    CHECK(mu_prompt_rows(2048, 30000, 131072) == 2048);  /* 2048 x 126 blocks <= 512 x 512 */
    CHECK(mu_prompt_rows(2048, 31000, 131072) == 1792);  /* 2048 x 130 is past it, 1792 x 129 is not */
    CHECK(mu_prompt_rows(2048, 100000, 131072) == 512);  /* never fewer than 512 */
    CHECK(mu_prompt_rows(2048, 2048, 4096) == 2048);     /* small contexts: at least 2048 x 32 */
    CHECK(mu_prompt_rows(300, 100000, 131072) == 300);
    static const int64_t ctxs[] = {1024, 4096, 32768, 131072, 1 << 20};
    for (size_t c = 0; c < sizeof ctxs / sizeof *ctxs; c++)
        for (int64_t pos = 0; pos < ctxs[c]; pos += ctxs[c] / 64 + 37)
            for (int64_t n = 1; n <= 4096; n = 2 * n + 1) {
                const int64_t r = mu_prompt_rows(n, pos, ctxs[c]), blocks = (ctxs[c] + 255) / 256;
                const int64_t budget = 512 * blocks > 2048 * 32 ? 512 * blocks : 2048 * 32;
                CHECK_MSG(r <= n && r >= (n < 512 ? n : 512) && (r <= 512 || r * ((pos + r + 255) / 256) <= budget),
                          "mu_prompt_rows(%lld, %lld, %lld) = %lld", (long long)n, (long long)pos, (long long)ctxs[c],
                          (long long)r);
            }
    muser_model *m = load("F32", MUSER_BACKEND_CPU);
    if (!m) return;
    muser_model_info info;
    muser_model_get_info(m, &info);
    const int64_t V = info.n_vocab, n = 900;
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    for (int64_t i = 0; i < n; i++) toks[i] = (int32_t)((i * 7 + 3) % V);
    m->be->prefill_rows = 768; /* as a backend that prefers 768-row chunks */
    float *rows[2];
    for (int k = 0; k < 2; k++) {
        muser_error err;
        muser_session_params sp = {.n_ctx = 1024, .prefill_chunk = k ? 512 : 0};
        muser_session *s = muser_session_create(m, &sp, &err);
        CHECK_MSG(s, "%s", err.msg);
        rows[k] = calloc((size_t)V, sizeof(float));
        if (s && muser_session_feed(s, toks, n, &err)) memcpy(rows[k], muser_session_logits(s), (size_t)V * sizeof(float));
        else CHECK_MSG(false, "feed: %s", s ? err.msg : "no session");
        muser_session_free(s);
    }
    CHECK_MSG(!memcmp(rows[0], rows[1], (size_t)V * sizeof(float)), "768-row chunks differ from 512-row chunks");
    m->be->prefill_rows = 0;
    free(rows[0]), free(rows[1]), free(toks);
    muser_model_free(m);
}

int main(void) {
    const char *types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "q4_k_xl", "nvfp4", "nvfp4_ggml"};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) run_type(types[i]);
    if (getenv("MUSER_TEST_CUDA")) {
        /* short rows: the host scans them (cuda_backend.c first_nonfinite_min); then on the device */
        test_nonfinite(MUSER_BACKEND_CUDA, "cuda, scan on the host");
        setenv("MUSER_CUDA_SCAN_MIN", "1", 1);
        test_nonfinite(MUSER_BACKEND_CUDA, "cuda, scan on the device");
        unsetenv("MUSER_CUDA_SCAN_MIN");
    }
    else test_nonfinite(MUSER_BACKEND_CPU, "cpu"), test_nonfinite(MUSER_BACKEND_REF, "ref");
    test_backend_chunk();
    fx_cleanup();
    TEST_MAIN_END();
}
