/* Speculative decoding with a DFlash assistant (include/muser.h,
 * docs/speculative.md). A round drafts up to verify_len proposals after the
 * pending token, feeds [pending, proposals] to the target as one batch, and
 * then draws tokens from the target's rows in order with the caller's
 * sampler, exactly as plain decoding would draw them: a proposal survives
 * only while the drawn token equals it. The first difference (or the row
 * after the last proposal) yields the target's own token, which becomes the
 * next pending token. The target rolls back to the rows that were kept, and
 * their hidden states go to the assistant's context.
 *
 * Drawing with the target's own chain is the standard acceptance rule (docs/speculative.md)
 * min(1, p/q) with residual max(p - q, 0) for a draft that proposes its
 * argmax (q is one-hot): the proposal is kept with probability p(d), and a
 * rejection draws from p without d, renormalized. Here it also consumes the
 * sampler's random stream exactly as plain decoding does, so the output is
 * token for token the plain output for the same seed.
 *
 * An adaptive gate (a windowed acceptance gate plus a speed check, docs/speculative.md)
 * falls back to one-token steps when speculation does not pay; it changes
 * speed only, never tokens. */
#include "spec/speculate.h"
#include "spec/spec_tree.h"
#include "tokenizer/tokenizer.h"
#include "model/api_internal.h"
#include "model/capture.h"
#include "sample/sample.h"
#include "util/mumath.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct muser_draft {
    mu_dflash *d;
    bool owned;
    const muser_model *target;
};

/* ---------------------------------------------------------------- gate */

#define GATE_WINDOW 8          /* rounds judged together (docs/speculative.md) */
#define GATE_WARMUP 1          /* rounds after (re)opening that are not judged (context catch-up) */
#define GATE_MIN_PROPOSALS 32
#define GATE_MIN_ACCEPTANCE 0.25
#define GATE_FAST_ROUNDS 2     /* rounds enough to close on speed alone ... */
#define GATE_FAST_RATIO 1.25   /* ... when a token costs this many plain steps */
#define GATE_CALIB_SHARE 0.75  /* calibration: a round must pay with this share of its tokens */
#define GATE_PROBE 4           /* plain steps timed before the first round */
#define GATE_COOLDOWN_FIRST 64 /* plain tokens before re-qualifying, doubling ... */
#define GATE_COOLDOWN_MAX 512  /* ... up to this */

typedef struct spec_gate {
    bool always;               /* no gate: every step speculates */
    bool open;
    int warm;                  /* rounds still to skip before judging */
    int64_t plain_left;        /* plain steps before (re)opening */
    int64_t cooldown;          /* the next closure's plain_left */
    int n, head;               /* window ring */
    int64_t prop[GATE_WINDOW], acc[GATE_WINDOW], toks[GATE_WINDOW];
    double secs[GATE_WINDOW];
    double plain_s;            /* running estimate of seconds per plain step; 0 = unknown */
} spec_gate;

static void gate_init(spec_gate *g, bool always) {
    *g = (spec_gate){.always = always, .open = always, .plain_left = always ? 0 : GATE_PROBE,
                     .cooldown = GATE_COOLDOWN_FIRST, .warm = GATE_WARMUP};
}

static void gate_plain_step(spec_gate *g, double secs) {
    g->plain_s = g->plain_s > 0 ? 0.75 * g->plain_s + 0.25 * secs : secs;
    if (!g->open && --g->plain_left <= 0) {
        g->open = true;
        g->warm = GATE_WARMUP;
        g->n = g->head = 0;
    }
}

/* Record a round; returns true when it closed the gate. */
static bool gate_round(spec_gate *g, int64_t proposals, int64_t accepted, int64_t tokens, double secs) {
    if (g->always) return false;
    if (g->warm > 0) {
        g->warm--;
        return false;
    }
    g->prop[g->head] = proposals;
    g->acc[g->head] = accepted;
    g->toks[g->head] = tokens;
    g->secs[g->head] = secs;
    g->head = (g->head + 1) % GATE_WINDOW;
    if (g->n < GATE_WINDOW) g->n++;
    if (g->n < GATE_FAST_ROUNDS) return false;
    int64_t p = 0, a = 0, t = 0;
    double s = 0;
    for (int i = 0; i < g->n; i++) {
        p += g->prop[i];
        a += g->acc[i];
        t += g->toks[i];
        s += g->secs[i];
    }
    /* clearly slower: close early; otherwise judge the full window */
    bool much_slower = g->plain_s > 0 && s > GATE_FAST_RATIO * g->plain_s * (double)t;
    if (!much_slower && g->n < GATE_WINDOW) return false;
    /* a round costs more than plain steps for every token it could ever
     * give (all proposals kept): no acceptance can pay, back off furthest */
    bool hopeless = g->plain_s > 0 && s > g->plain_s * (double)(p + g->n);
    bool low_acceptance = p >= GATE_MIN_PROPOSALS && (double)a < GATE_MIN_ACCEPTANCE * (double)p;
    bool slower = g->plain_s > 0 && s > g->plain_s * (double)t;
    if (!low_acceptance && !slower) {
        g->cooldown = GATE_COOLDOWN_FIRST; /* a full window qualified */
        return false;
    }
    g->open = false;
    if (hopeless) g->cooldown = GATE_COOLDOWN_MAX;
    g->plain_left = g->cooldown;
    g->cooldown = g->cooldown * 2 < GATE_COOLDOWN_MAX ? g->cooldown * 2 : GATE_COOLDOWN_MAX;
    return true;
}

/* ---------------------------------------------------------------- state */

/* MUSER_SPEC_TIMES=1: where a picks round's wall time goes on the host,
 * printed when the speculation state is freed (the phases of
 * spec_round_picks; "wait" is the host blocked on the backend). */
#define PHASES 6
static const char *const phase_name[PHASES] = {"draft enqueued",         "verification enqueued",
                                               "wait for the picks",     "context rows and gate",
                                               "next draft enqueued",    "rollback"};
/* pick_rows: 16 rows' (pick, flag), then the proposals; then tree_reg's tree */
#define SLOT_PICKS (2 * 16 + MU_TOKEN_REGS)
#define SLOT_INTS (SLOT_PICKS + MU_SPEC_TREE_SLOT)

struct muser_spec {
    muser_model *target;
    muser_session *s;
    const muser_draft *draft;
    mu_dflash_state *ds;
    int verify_len;
    bool tree;                      /* rounds verify a token tree (tree_round) */
    int64_t n_vocab, feat_len;      /* floats per captured row */
    float *logits;                  /* verify rows [verify_len + 1][n_vocab] */
    float *dlogits;                 /* tree rounds: the draft's rows [verify_len][n_vocab] (host) */
    float *feats;                   /* backend memory: captured rows not yet in the assistant's context */
    mu_backend *be;
    int64_t n_feats, cap_feats;
    int32_t *slots;                 /* the backend round's picks and proposals (pick_rows), host_alloc memory */
    bool picks;                     /* greedy rounds may stay on the backend (spec_round_picks) */
    bool tree_picks;                /* ... tree rounds too (the backend builds the tree: tree_reg) */
    bool host_picks;                /* ... and sampled rounds, drawn on the host from there (MUSER_SPEC_HOST_PICKS=0: no) */
    const int32_t *eog;             /* the target's end-of-generation ids (its tokenizer's), n_eog of them */
    int n_eog;
    bool predraft;                  /* picks rounds enqueue the next round's draft (MUSER_SPEC_PREDRAFT=0: no) */
    bool fed_proj;                  /* picks rounds project their fed rows before the wait (MUSER_SPEC_FED_PROJ=1) */
    struct {                        /* that draft: valid for a round of vl after anchor at pos, while no */
        bool on;                    /* other draft has set the registers since (epoch) */
        int32_t anchor;
        int vl;
        int64_t pos;
        uint64_t epoch;
        double cost;                /* seconds its enqueue took: part of the round that uses it */
    } pre;
    bool times;                     /* MUSER_SPEC_TIMES: the host's share of each phase of a picks round */
    double *ph;                     /* seconds in each phase, PHASES a round, ph_rounds rounds */
    int64_t ph_rounds, ph_cap;
    spec_gate gate;
    muser_spec_stats st;
};

/* Rows are buffered and projected into the assistant's context only when a
 * draft needs them (or the buffer is full): rows that drop out of its
 * window before the next draft are then never projected. */
static void flush_feats(muser_spec *sp) {
    if (sp->n_feats) mu_dflash_append_context(sp->ds, sp->feats, sp->n_feats);
    sp->n_feats = 0;
}

/* A switch: NAME set to a number (0 off, else on), dflt when unset or empty. */
static bool env_switch(const char *name, bool dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) != 0 : dflt;
}

/* The buffered rows' count, handed to the draft that comes next: it
 * projects them in its own launches where it can (dflash_forward.c
 * can_merge), else first. */
static int64_t feats_for_draft(muser_spec *sp) {
    const int64_t n = sp->n_feats;
    sp->n_feats = 0;
    return n;
}

/* A full buffer. Sink rows are projected; of the rest only the newest
 * `window` rows can ever be attended again, so older ones are skipped
 * unprojected (a long prompt or a closed gate costs no projection). A
 * buffer smaller than the window is projected whole. */
static void make_room(muser_spec *sp) {
    const int64_t pos0 = mu_dflash_state_rows(sp->ds), window = sp->draft->d->cfg.sliding_window;
    int64_t n_sink = pos0 < MU_DFLASH_SINK ? MU_DFLASH_SINK - pos0 : 0;
    if (n_sink > sp->n_feats) n_sink = sp->n_feats;
    int64_t drop = sp->n_feats - n_sink - window;
    if (drop <= 0) {
        flush_feats(sp);
        return;
    }
    if (n_sink) mu_dflash_append_context(sp->ds, sp->feats, n_sink);
    mu_dflash_skip_context(sp->ds, drop);
    sp->be->copy(sp->be, sp->feats, sp->feats + (n_sink + drop) * sp->feat_len, (size_t)(window * sp->feat_len) * sizeof(float));
    sp->n_feats = window;
}

static void take_feats(muser_spec *sp, const float *rows, int64_t n) {
    while (n > 0) {
        if (sp->n_feats == sp->cap_feats) make_room(sp);
        int64_t m = sp->cap_feats - sp->n_feats < n ? sp->cap_feats - sp->n_feats : n;
        sp->be->copy(sp->be, sp->feats + sp->n_feats * sp->feat_len, rows, (size_t)(m * sp->feat_len) * sizeof(float));
        sp->n_feats += m;
        rows += m * sp->feat_len;
        n -= m;
    }
}

/* The rows of the session's last feed: the first `keep` of them, or with
 * path, rows path[0 .. keep) (a token tree's kept path, ascending). */
static bool take_captured_path(muser_spec *sp, int64_t fed, int64_t keep, const int32_t *path, mu_error *err) {
    int64_t n_rows = 0;
    const float *rows = mu_session_captured(sp->s, &n_rows);
    if (!rows || n_rows != fed) {
        mu_err_set(err, "hidden-state capture returned %lld rows for %lld fed", (long long)n_rows, (long long)fed);
        return false;
    }
    for (int64_t j = 0, j1; j < keep; j = j1) { /* runs of consecutive rows */
        const int64_t r0 = path ? path[j] : j;
        for (j1 = j + 1; j1 < keep && (path ? path[j1] : j1) == r0 + (j1 - j);) j1++;
        take_feats(sp, rows + r0 * sp->feat_len, j1 - j);
    }
    return true;
}

static bool take_captured(muser_spec *sp, int64_t fed, int64_t keep, mu_error *err) {
    return take_captured_path(sp, fed, keep, NULL, err);
}

muser_draft *muser_draft_load(const char *path, const muser_model *target, muser_error *err) {
    mu_dflash *d = mu_dflash_load(path, ERR(err));
    if (!d) return NULL;
    if (!mu_dflash_check_target(d, target->m, ERR(err))) {
        mu_dflash_free(d);
        return NULL;
    }
    mu_dflash_repack(d, target->be); /* its matmuls run on the target's backend */
    muser_draft *dr = mu_xcalloc(1, sizeof *dr);
    *dr = (muser_draft){.d = d, .owned = true, .target = target};
    return dr;
}

void muser_draft_free(muser_draft *d) {
    if (!d) return;
    if (d->owned) mu_dflash_free(d->d);
    free(d);
}

const char *muser_draft_name(const muser_draft *d) { return d->d->name; }

/* Time two plain steps and two rounds on the empty session (dummy tokens,
 * undone afterwards). If the round costs more than plain steps for three
 * quarters of the tokens it could give, even here (no context yet, so the
 * cheapest round there will be), speculation will not pay on this machine:
 * start closed with the longest cooldown. Otherwise start open, the plain cost already known. */
static void gate_calibrate(muser_spec *sp) {
    const int vl = sp->verify_len;
    int32_t toks[16], props[16];
    for (int i = 0; i <= vl; i++) toks[i] = (int32_t)(i + 1) % (int32_t)sp->n_vocab;
    double plain = 0;
    for (int rep = 0; rep < 2; rep++) {
        double t0 = mu_now();
        bool ok = muser_session_feed(sp->s, toks, 1, NULL);
        double t = mu_now() - t0;
        muser_session_reset(sp->s);
        if (!ok) return;
        plain = rep == 0 || t < plain ? t : plain;
    }
    double round = 0; /* the faster of two: the first one also pages the weights in */
    for (int rep = 0; rep < 2; rep++) {
        double t0 = mu_now();
        mu_dflash_draft(sp->ds, NULL, 0, toks[0], vl, props, NULL);
        bool ok = muser_session_feed_all(sp->s, toks, vl + 1, sp->logits, NULL);
        double t = mu_now() - t0;
        muser_spec_reset(sp);
        if (!ok) return;
        round = rep == 0 || t < round ? t : round;
    }
    spec_gate *g = &sp->gate;
    g->plain_s = plain;
    sp->st.calib_round_s = round;
    sp->st.calib_plain_s = plain;
    if (round > GATE_CALIB_SHARE * plain * (double)(vl + 1)) {
        g->open = false;
        g->plain_left = g->cooldown = GATE_COOLDOWN_MAX;
    } else {
        g->open = true;
        g->plain_left = 0;
    }
}

muser_spec *muser_spec_create(muser_session *s, const muser_draft *d, const muser_spec_params *p, muser_error *err) {
    muser_spec_params def = {0};
    if (!p) p = &def;
    int vl = p->verify_len ? p->verify_len : 7;
    muser_model *target = muser_session_model(s);
    if (vl != 3 && vl != 7 && vl != 15) {
        mu_err_set(ERR(err), "verify length %d: must be 3, 7 or 15", vl);
        return NULL;
    }
    if (vl >= d->d->cfg.block_size) {
        mu_err_set(ERR(err), "verify length %d needs a block of at least %d rows; the assistant's is %lld", vl, vl + 1,
                   (long long)d->d->cfg.block_size);
        return NULL;
    }
    if (target != d->target) {
        mu_err_set(ERR(err), "the session's model is not the target the assistant was loaded for");
        return NULL;
    }
    if (p->tree && !target->be->trees) {
        mu_err_set(ERR(err), "token trees: the %s backend's attention does not take tree rows (ref and cpu do)",
                   target->be->name);
        return NULL;
    }
    const mu_dflash_config *c = &d->d->cfg;
    if (!mu_session_set_capture(s, c->target_layers, (int)c->n_target_layers, ERR(err))) return NULL;
    mu_session_lock(s); /* the assistant's state lives on the engine's backend */
    muser_spec *sp = mu_xcalloc(1, sizeof *sp);
    sp->target = target;
    sp->s = s;
    sp->draft = d;
    sp->ds = mu_dflash_state_new(d->d, target->m, target->be);
    sp->verify_len = vl;
    sp->n_vocab = target->m->cfg.n_vocab;
    sp->feat_len = c->n_target_layers * c->n_embd;
    sp->logits = mu_xmalloc((size_t)(vl + 1) * (size_t)sp->n_vocab * sizeof(float));
    sp->tree = p->tree;
    if (p->tree) sp->dlogits = mu_xmalloc((size_t)vl * (size_t)sp->n_vocab * sizeof(float));
    /* room for twice the assistant's context, at most 32 MiB */
    int64_t want = 2 * (MU_DFLASH_SINK + c->sliding_window), fit = ((int64_t)32 << 20) / (sp->feat_len * 4);
    sp->cap_feats = want < fit ? want : fit > 64 ? fit : 64;
    sp->be = target->be;
    /* plus the slack rows a fixed-shape projection reads past the last row (dflash.h), zeroed: finite */
    const size_t feat_bytes = (size_t)((sp->cap_feats + MU_DFLASH_SLACK) * sp->feat_len) * sizeof(float);
    sp->feats = mu_backend_xalloc(sp->be, feat_bytes, "the assistant's feature rows");
    sp->be->zero(sp->be, sp->feats, feat_bytes);
    /* greedy rounds on the backend: proposals and picks stay there (MUSER_SPEC_PICKS=0: through the host) */
    sp->picks = sp->be->argmax_reg && sp->be->pick_rows && sp->be->chain_wait && env_switch("MUSER_SPEC_PICKS", true);
    if (sp->picks) {
        const size_t bytes = SLOT_INTS * sizeof(int32_t);
        sp->slots = sp->be->host_alloc ? sp->be->host_alloc(sp->be, bytes) : mu_xmalloc(bytes);
        sp->picks = sp->slots != NULL;
    }
    sp->n_eog = target->tok ? (int)mu_tokenizer_eog_ids(target->tok, &sp->eog) : 0;
    sp->tree_picks = sp->picks && sp->tree && sp->be->tree_reg && sp->be->trees && sp->n_eog <= MU_SPEC_TREE_EOG_MAX;
    sp->host_picks = env_switch("MUSER_SPEC_HOST_PICKS", true);
    sp->predraft = env_switch("MUSER_SPEC_PREDRAFT", true);
    /* off by default: on an H200 the 64 held-out prompts ran 1.82x plain greedy without it, 1.79x
     * with it (docs/speculative.md "The fed rows projected behind the verification") */
    sp->fed_proj = env_switch("MUSER_SPEC_FED_PROJ", false) && !mu_dflash_state_merges(sp->ds);
    const char *tm = getenv("MUSER_SPEC_TIMES");
    sp->times = tm && *tm && strcmp(tm, "0");
    gate_init(&sp->gate, p->no_gate);
    muser_spec_reset(sp);
    if (!p->no_gate) gate_calibrate(sp);
    mu_session_set_spec(s, sp);
    mu_session_unlock(s);
    return sp;
}

void muser_spec_free(muser_spec *sp) {
    if (!sp) return;
    muser_session *s = sp->s;
    mu_session_lock(s);
    if (sp->times && sp->ph_rounds) { /* medians: a round that captures a graph takes milliseconds */
        fprintf(stderr, "muser: speculative rounds on the picks, host time per round (us, median of %lld):",
                (long long)sp->ph_rounds);
        double *col = mu_xmalloc((size_t)sp->ph_rounds * sizeof *col);
        for (int i = 0; i < PHASES; i++) {
            for (int64_t r = 0; r < sp->ph_rounds; r++) col[r] = sp->ph[r * PHASES + i];
            mu_sort_doubles(col, (size_t)sp->ph_rounds);
            const int64_t h = sp->ph_rounds / 2;
            const double med = sp->ph_rounds % 2 ? col[h] : 0.5 * (col[h - 1] + col[h]);
            fprintf(stderr, "%s %s %.1f", i ? "," : "", phase_name[i], 1e6 * med);
        }
        fputc('\n', stderr);
        free(col);
    }
    free(sp->ph);
    if (mu_session_spec(sp->s) == sp) mu_session_set_spec(sp->s, NULL);
    mu_session_set_capture(sp->s, NULL, 0, NULL);
    mu_dflash_state_free(sp->ds);
    free(sp->logits);
    free(sp->dlogits);
    sp->be->free(sp->be, sp->feats, (size_t)((sp->cap_feats + MU_DFLASH_SLACK) * sp->feat_len) * sizeof(float));
    if (sp->slots) {
        if (sp->be->host_free) sp->be->host_free(sp->be, sp->slots, SLOT_INTS * sizeof(int32_t));
        else free(sp->slots);
    }
    free(sp);
    mu_session_unlock(s);
}

void muser_spec_reset(muser_spec *sp) {
    mu_session_lock(sp->s);
    muser_session_reset(sp->s);
    mu_dflash_state_reset(sp->ds);
    sp->n_feats = 0;
    sp->pre.on = false;
    mu_session_unlock(sp->s);
}

void muser_spec_get_stats(const muser_spec *sp, muser_spec_stats *st) {
    *st = sp->st;
    st->gate_open = sp->gate.open;
}

void muser_spec_reset_stats(muser_spec *sp) {
    sp->st = (muser_spec_stats){.calib_round_s = sp->st.calib_round_s, .calib_plain_s = sp->st.calib_plain_s};
}

/* The assistant's context must hold exactly the session's rows. */
static bool in_step(const muser_spec *sp, mu_error *err) {
    int64_t rows = mu_dflash_state_rows(sp->ds) + sp->n_feats, pos = muser_session_pos(sp->s);
    if (rows == pos) return true;
    mu_err_set(err, "the session was fed outside muser_spec (position %lld, assistant context %lld rows); "
               "use muser_spec_feed or muser_spec_reset", (long long)pos, (long long)rows);
    return false;
}

bool muser_spec_feed(muser_spec *sp, const int32_t *tokens, int64_t n, muser_error *err) {
    mu_session_lock(sp->s);
    sp->pre.on = false;
    const bool ok = in_step(sp, ERR(err)) && muser_session_feed(sp->s, tokens, n, err) && take_captured(sp, n, n, ERR(err));
    mu_session_unlock(sp->s);
    return ok;
}

/* Greedy over a target row (finite: the session refuses anything else). */
static int32_t argmax(const float *l, int64_t n) { return mu_sample_argmax(l, (size_t)n, NULL, 0); }

/* One token from a row: smp's chain (with its grammar), or the argmax with
 * the lowest id winning ties. -1: *complete (grammar finished) or error. */
static int32_t draw(muser_sampler *smp, const float *row, int64_t n_vocab, bool *complete, muser_error *err) {
    if (!smp) return argmax(row, n_vocab);
    int32_t tok = muser_sampler_sample(smp, row, err);
    if (tok < 0 && muser_sampler_grammar_complete(smp)) {
        *complete = true;
        return -1;
    }
    if (tok < 0 || !muser_sampler_accept(smp, tok, err)) return -1;
    return tok;
}

static int plain_step(muser_spec *sp, int32_t pending, muser_sampler *smp, int32_t *out, const float **rows,
                      muser_error *err) {
    double t0 = mu_now();
    sp->pre.on = false;
    if (!muser_session_feed(sp->s, &pending, 1, err) || !take_captured(sp, 1, 1, ERR(err))) return -1;
    const float *row = muser_session_logits(sp->s);
    bool complete = false;
    int32_t tok = draw(smp, row, sp->n_vocab, &complete, err);
    double secs = mu_now() - t0;
    sp->st.plain_steps++;
    sp->st.t_plain += secs;
    gate_plain_step(&sp->gate, secs);
    if (tok < 0) return complete ? 0 : -1;
    out[0] = tok;
    if (rows) rows[0] = row;
    return 1;
}

/* ---------------------------------------------------------------- token trees
 * (docs/speculative.md "Token trees"). The block's rows are drafted in one
 * forward, each without seeing the others' choices, so a tree over them is
 * a set of rank paths: a node at depth d takes the token of rank r in row
 * d. It grows best first by the product of the draft's probabilities along
 * the path, weighted (spec_tree.h mu_spec_tree_weight), up to verify_len
 * nodes under the pending token (the same rows as a chain of that
 * length). Verification draws along the tree exactly as plain decoding
 * draws: from the root's row, then from the row of the child holding the
 * drawn token, while there is one. Which tree is built changes speed
 * only, never tokens. */

/* A round's statistics and the gate's view of it (t0: start, t1: the
 * draft launched or done, t3: end; vl proposals verified); returns n. */
static int round_done(muser_spec *sp, int vl, int n, double t0, double t1, double t3) {
    int64_t accepted = n ? n - 1 : 0;
    sp->st.rounds++;
    sp->st.round_tokens += n;
    sp->st.drafted += vl;
    sp->st.accepted += accepted;
    sp->st.t_draft += t1 - t0;
    sp->st.t_verify += t3 - t1;
    if (gate_round(&sp->gate, vl, accepted, n, t3 - t0)) sp->st.gate_closures++;
    return n;
}

/* A chain: the draft's argmaxes (on the backend), nothing after a proposed
 * end of generation; each node the first choice under the one before. */
static void chain_build(const muser_spec *sp, int64_t nf, int32_t pending, int vl, mu_spec_tree *t) {
    int32_t props[16];
    mu_dflash_draft(sp->ds, sp->feats, nf, pending, vl, props, NULL);
    t->n = 1;
    t->token[0] = pending;
    t->parent[0] = -1;
    for (int i = 0; i < vl; i++) {
        t->token[t->n] = props[i];
        t->parent[t->n] = t->n - 1;
        t->n++;
        if (muser_token_is_eog(sp->target, props[i])) break;
    }
}

/* One round: draft, verify the chain or tree in one forward, draw along it
 * as plain decoding draws, keep the path drawn (moved where plain decoding
 * stores it), roll back the rest. */
static int spec_round(muser_spec *sp, int32_t pending, int vl, muser_sampler *smp, int32_t *out, const float **rows,
                      muser_error *err) {
    const int64_t V = sp->n_vocab, P = muser_session_pos(sp->s);
    sp->pre.on = false; /* this round drafts through the host */
    double t0 = mu_now();
    const int64_t nf = feats_for_draft(sp);
    mu_spec_tree t;
    if (sp->tree) {
        int32_t props[16];
        mu_dflash_draft(sp->ds, sp->feats, nf, pending, vl, props, sp->dlogits);
        mu_spec_tree_build(sp->dlogits, V, vl, pending, sp->eog, sp->n_eog, &t);
    } else {
        chain_build(sp, nf, pending, vl, &t);
    }
    double t1 = mu_now();
    if (!muser_session_checkpoint(sp->s, err) ||
        !(sp->tree ? mu_session_feed_tree(sp->s, t.token, t.parent, t.n, sp->logits, ERR(err))
                   : muser_session_feed_all(sp->s, t.token, t.n, sp->logits, err)))
        return -1;
    int32_t path[MU_TREE_MAX] = {0};
    int n = 0, cur = 0;
    bool complete = false;
    for (;;) {
        const float *row = sp->logits + (int64_t)cur * V;
        int32_t tok = draw(smp, row, V, &complete, err);
        if (tok < 0) {
            if (!complete) return -1;
            break;
        }
        out[n] = tok;
        if (rows) rows[n] = row;
        n++;
        if (muser_token_is_eog(sp->target, tok)) break;
        int child = -1;
        for (int i = cur + 1; i < t.n && child < 0; i++)
            if (t.parent[i] == cur && t.token[i] == tok) child = i;
        if (child < 0) break;
        path[n] = child;
        cur = child;
    }
    /* kept rows: the pending token and the nodes drawn after it */
    const int keep = n ? n : 1;
    if (!mu_session_keep_path(sp->s, P, t.token, path, keep, ERR(err)) ||
        !take_captured_path(sp, t.n, keep, path, ERR(err)))
        return -1;
    muser_session_commit(sp->s);
    mu_session_set_logits(sp->s, sp->logits + (int64_t)path[keep - 1] * V); /* the row of the last kept token */
    return round_done(sp, t.n - 1, n, t0, t1, mu_now());
}

/* The round's draft into the backend's registers (a tree: tree_reg builds
 * it there), the buffered context rows projected first. */
static void draft_regs(muser_spec *sp, int32_t anchor, int vl) {
    const int64_t nf = feats_for_draft(sp);
    if (sp->tree) mu_dflash_draft_tree(sp->ds, sp->feats, nf, anchor, vl, sp->eog, sp->n_eog, sp->slots + SLOT_PICKS);
    else mu_dflash_draft(sp->ds, sp->feats, nf, anchor, vl, NULL, NULL);
}

/* The next round's draft, enqueued as soon as a round knows its kept rows
 * and its last token (the next round's pending one, anchor): the backend
 * runs it while the host rolls the target back and the caller takes its
 * tokens. The next round uses it when it comes with that anchor and
 * verify length at that position and no other draft has set the registers
 * since; otherwise it drafts again (the context rows are already
 * projected: the same draft). A draft only proposes, so one that is never
 * used changes nothing but time. */
static void predraft(muser_spec *sp, int32_t anchor, int64_t pos) {
    const int64_t room = muser_session_n_ctx(sp->s) - pos - 1;
    const int vl = room < sp->verify_len ? (int)room : sp->verify_len;
    if (vl < 1) return;
    const double t0 = mu_now();
    draft_regs(sp, anchor, vl);
    sp->pre.cost = mu_now() - t0;
    sp->pre.on = true;
    sp->pre.anchor = anchor;
    sp->pre.vl = vl;
    sp->pre.pos = pos;
    sp->pre.epoch = sp->be->reg_epoch;
}

/* A greedy round that leaves its rows on the backend (smp NULL or an
 * argmax sampler, no rows wanted): the draft's proposals go into the
 * backend's token registers (argmax_reg; a tree round: tree_reg builds the
 * tree there, its shape into the tree registers), the verification feeds
 * them from there and picks every row where it lies (pick_rows), and the
 * host reads back only the picks, the proposals and a tree's shape, one
 * wait per round instead of the draft's round trip and the rows'
 * download. The tokens are the ones spec_round draws: a row's pick is its
 * draw when its maximum is unique and the row finite (chain_pick's rule,
 * docs/sampling.md), and proposals after a proposed end of generation,
 * which spec_round does not verify, never count (the kept run stops at
 * it; a tree grows nothing under one). When any row is not decided that
 * way, or the sampler bans an emitted pick, every row comes to the host
 * and the walk draws there (a non-finite row then poisons the session as
 * a feed would). A round whose draws are not argmax picks (a sampler that
 * is not greedy, a grammar) or whose caller wants the rows (host) takes
 * that walk from the start: it still saves spec_round's download of the
 * draft's rows, its host tree and the wait between draft and verification.
 * The draws are spec_round's: the same tree (tree_reg builds
 * mu_spec_tree_build's), the same rows, the same walk. */
static int spec_round_picks(muser_spec *sp, int32_t pending, int vl, muser_sampler *smp, int32_t *out,
                            const float **rows, bool host, muser_error *err) {
    const int64_t V = sp->n_vocab, P = muser_session_pos(sp->s);
    mu_backend *be = sp->be;
    const bool tree = sp->tree;
    const int32_t *tslot = sp->slots + SLOT_PICKS;
    int32_t block[16];
    block[0] = pending;
    for (int i = 0; i < vl; i++) block[i + 1] = MU_TOKEN_REG(i);
    double tp[PHASES + 1];
    tp[0] = mu_now();
    /* the draft the round before enqueued, when it is this round's */
    const bool pre = sp->pre.on && sp->pre.anchor == pending && sp->pre.vl == vl && sp->pre.pos == P &&
                     sp->pre.epoch == be->reg_epoch && sp->n_feats == 0;
    const double t0 = pre ? tp[0] - sp->pre.cost : tp[0]; /* the gate's view: a round costs its draft's enqueue too */
    sp->pre.on = false;
    if (!pre) draft_regs(sp, pending, vl);
    sp->st.predrafted += pre;
    double t1 = tp[1] = mu_now();
    if (!muser_session_checkpoint(sp->s, err) ||
        !mu_session_feed_picks(sp->s, block, vl + 1, vl, tree, sp->slots, ERR(err)))
        return -1;
    /* the fed rows' context projection, enqueued behind the verification:
     * the backend runs it while the host waits, walks and enqueues the next
     * draft (mu_dflash_project_fed; the kept ones committed below) */
    _Static_assert(MU_DFLASH_CTX_PAD <= MU_CAPTURE_MIN_ROWS, "a padded projection of the fed rows reads the capture");
    const bool fed = sp->fed_proj && sp->n_feats == 0;
    if (fed) {
        int64_t n_cap = 0;
        const float *cap = mu_session_captured(sp->s, &n_cap);
        if (!cap || n_cap != vl + 1) {
            mu_err_set(ERR(err), "hidden-state capture returned %lld rows for %d fed", (long long)n_cap, vl + 1);
            return -1;
        }
        mu_dflash_project_fed(sp->ds, cap, vl + 1, tree);
    }
    tp[2] = sp->times ? mu_now() : 0.0;
    for (int r = 0; r <= vl; r++)
        if (!be->chain_wait(be, sp->slots + 2 * r, ERR(err))) return -1;
    tp[3] = sp->times ? mu_now() : 0.0;
    const int32_t *props = sp->slots + 2 * (vl + 1);
    mu_session_resolve_regs(sp->s, P, props, vl);
    /* the verified rows as a tree (a chain: each row the child of the one before) */
    int tn = vl + 1;
    int32_t parent[MU_TREE_MAX];
    for (int i = 0; i < vl; i++) block[i + 1] = props[i];
    for (int i = 0; i <= vl; i++) parent[i] = i - 1;
    if (tree) {
        tn = tslot[0];
        if (tn < 1 || tn > vl + 1) {
            mu_err_set(ERR(err), "speculative round: the backend's tree has %d nodes (1 to %d expected)", tn, vl + 1);
            return -1;
        }
        for (int i = 1; i < tn; i++) parent[i] = tslot[1 + i];
    }
    /* draw along it: from the root's row, then from the row of the child
     * holding the drawn token, while there is one */
    bool on_host = host, complete = false;
    int n = 0;
    int32_t path[MU_TREE_MAX] = {0};
    /* a tree's rows past its nodes are fillers no walk reaches (backend.h tree_reg) */
    for (int r = 0; r < tn && !on_host; r++) on_host = sp->slots[2 * r + 1] != 1;
    if (on_host && !mu_session_fetch_rows(sp->s, tn, sp->logits, ERR(err))) return -1;
    for (int cur = 0;;) {
        int32_t tok = sp->slots[2 * cur];
        if (on_host) {
            tok = draw(smp, sp->logits + (int64_t)cur * V, V, &complete, err);
            if (tok < 0) {
                if (!complete) return -1;
                break;
            }
            if (rows) rows[n] = sp->logits + (int64_t)cur * V;
        } else if (smp && muser_sampler_bans(smp, tok)) { /* start again on the host */
            if (!mu_session_fetch_rows(sp->s, tn, sp->logits, ERR(err))) return -1;
            on_host = true;
            n = 0;
            cur = 0;
            continue;
        }
        out[n++] = tok;
        if (muser_token_is_eog(sp->target, tok)) break;
        int child = -1;
        for (int i = cur + 1; i < tn && child < 0; i++)
            if (parent[i] == cur && block[i] == tok) child = i;
        if (child < 0) break;
        path[n] = child;
        cur = child;
    }
    sp->st.picked_rounds += !on_host;
    sp->st.backend_rounds++;
    if (!on_host)
        for (int i = 0; i < n; i++)
            if (smp && !muser_sampler_accept(smp, out[i], err)) return -1;
    /* kept rows: the pending token and the nodes drawn after it; their
     * features first, then the next round's draft (it needs them, not the
     * target's rollback), so the backend drafts while the host rolls back
     * and returns to its caller */
    const int keep = n ? n : 1;
    if (fed) mu_dflash_keep_fed(sp->ds, tree ? path : NULL, keep);
    else if (!take_captured_path(sp, vl + 1, keep, tree ? path : NULL, ERR(err))) return -1;
    const double t3 = tp[4] = mu_now();
    const int32_t next = n ? out[n - 1] : -1;
    n = round_done(sp, tree ? tn - 1 : vl, n, t0, t1, t3);
    if (next >= 0 && sp->predraft && sp->gate.open && !muser_token_is_eog(sp->target, next)) predraft(sp, next, P + keep);
    tp[5] = sp->times ? mu_now() : 0.0;
    if (tree ? !mu_session_keep_path(sp->s, P, block, path, keep, ERR(err)) : !muser_session_rollback(sp->s, P + keep, err))
        return -1;
    muser_session_commit(sp->s);
    const int last = path[keep - 1]; /* the row of the last kept token */
    if (on_host) mu_session_set_logits(sp->s, sp->logits + (int64_t)last * V);
    else mu_session_defer_row(sp->s, last); /* pick_rows found it finite; a greedy caller never reads it */
    if (sp->times) {
        tp[6] = mu_now();
        if (sp->ph_rounds == sp->ph_cap) {
            sp->ph_cap = sp->ph_cap ? 2 * sp->ph_cap : 256;
            sp->ph = mu_xrealloc(sp->ph, (size_t)(sp->ph_cap * PHASES) * sizeof *sp->ph);
        }
        for (int i = 0; i < PHASES; i++) sp->ph[sp->ph_rounds * PHASES + i] = tp[i + 1] - tp[i];
        sp->ph_rounds++;
    }
    return n;
}

/* The round under the engine's lock: the draft and the registers it
 * leaves on the backend are not engine calls, and another session's round
 * must not come between them and this round's verification (two sessions
 * of one engine may speculate from two threads: include/muser.h). */
static int spec_next(muser_spec *sp, int32_t pending, muser_sampler *smp, int max_out, int32_t *out,
                     const float **rows, muser_error *err);

int muser_spec_next(muser_spec *sp, int32_t pending, muser_sampler *smp, int max_out, int32_t *out,
                    const float **rows, muser_error *err) {
    mu_session_lock(sp->s);
    const int n = spec_next(sp, pending, smp, max_out, out, rows, err);
    mu_session_unlock(sp->s);
    return n;
}

static int spec_next(muser_spec *sp, int32_t pending, muser_sampler *smp, int max_out, int32_t *out,
                     const float **rows, muser_error *err) {
    if (err) err->msg[0] = 0;
    if (max_out < 1) {
        mu_err_set(ERR(err), "muser_spec_next: max_out must be at least 1");
        return -1;
    }
    if (pending < 0 || pending >= sp->n_vocab) {
        mu_err_set(ERR(err), "pending token %d is outside the vocabulary (0..%lld)", pending, (long long)sp->n_vocab - 1);
        return -1;
    }
    if (!in_step(sp, ERR(err))) return -1;
    int64_t vl = sp->verify_len, room = muser_session_n_ctx(sp->s) - muser_session_pos(sp->s) - 1;
    if (vl > max_out - 1) vl = max_out - 1; /* never draw past max_out */
    if (vl > room) vl = room;
    if (!sp->gate.open || vl < 1) return plain_step(sp, pending, smp, out, rows, err);
    const bool host = rows || (smp && !muser_sampler_is_argmax(smp)); /* draws on the host's rows */
    if (sp->picks && (!sp->tree || sp->tree_picks) && (!host || sp->host_picks) &&
        vl + 1 <= mu_session_picks_max(sp->s))
        return spec_round_picks(sp, pending, (int)vl, smp, out, rows, host, err);
    return spec_round(sp, pending, (int)vl, smp, out, rows, err);
}

bool mu_spec_take_fed(muser_spec *sp, int64_t n, mu_error *err) {
    mu_session_lock(sp->s);
    sp->pre.on = false;
    const bool ok = take_captured(sp, n, n, err);
    mu_session_unlock(sp->s);
    return ok;
}

void mu_spec_draft_now(muser_spec *sp, int32_t anchor, int n_prop, int32_t *proposals, float *logits) {
    mu_session_lock(sp->s);
    sp->pre.on = false;
    mu_dflash_draft(sp->ds, sp->feats, feats_for_draft(sp), anchor, n_prop, proposals, logits);
    mu_session_unlock(sp->s);
}

/* ---------------------------------------------------------------- durable state */

void mu_spec_geometry(const muser_spec *sp, mu_spec_geom *g) {
    const mu_dflash_config *c = &sp->draft->d->cfg;
    *g = (mu_spec_geom){.path = sp->draft->d->gguf->path, .n_layer = c->n_layer, .n_head_kv = c->n_head_kv,
                        .head_dim = c->head_dim, .sink = MU_DFLASH_SINK, .window = c->sliding_window,
                        .feat_floats = sp->feat_len, .feat_rows = sp->cap_feats};
}

/* The assistant's context and the buffered rows behind it, as bytes:
 * every held cache slot (mu_dflash_state_export), then the n_feats rows
 * not yet projected. Needs the assistant in step with the session. */
bool mu_spec_export(const muser_spec *sp, int64_t *rows, unsigned char **out, uint64_t *len, mu_error *err) {
    mu_session_lock(sp->s);
    if (!in_step(sp, err)) {
        mu_session_unlock(sp->s);
        return false;
    }
    const uint64_t ctx = mu_dflash_state_bytes(sp->draft->d, mu_dflash_state_rows(sp->ds));
    const uint64_t feats = (uint64_t)(sp->n_feats * sp->feat_len) * sizeof(float);
    unsigned char *p = mu_xmalloc((size_t)(ctx + feats) ? (size_t)(ctx + feats) : 1);
    mu_dflash_state_export(sp->ds, (float *)p);
    if (feats) sp->be->download(sp->be, p + ctx, sp->feats, (size_t)feats);
    *rows = mu_dflash_state_rows(sp->ds);
    *out = p;
    *len = ctx + feats;
    mu_session_unlock(sp->s);
    return true;
}

void mu_spec_import(muser_spec *sp, int64_t rows, int64_t n_feats, const unsigned char *data) {
    mu_session_lock(sp->s);
    const uint64_t ctx = mu_dflash_state_bytes(sp->draft->d, rows);
    mu_dflash_state_import(sp->ds, rows, (const float *)data);
    sp->pre.on = false;
    sp->n_feats = n_feats;
    if (n_feats) sp->be->upload(sp->be, sp->feats, data + ctx, (size_t)(n_feats * sp->feat_len) * sizeof(float));
    mu_session_unlock(sp->s);
}
