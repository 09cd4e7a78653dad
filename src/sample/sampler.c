/* The configured chain (common_sampler): logit bias, the ordered stages,
 * then dist - or temp + mirostat - plus llama-server's grammar rejection
 * discipline, history, reset and snapshots. */
#include "sample/sample.h"
#include <math.h>
#include <stdlib.h>

typedef struct stage {
    mu_sampler_kind kind;
    bool active;        /* false: llama's "?name" no-op stage */
    mu_penalties *pen;  /* PENALTIES */
    mu_dry *dry;        /* DRY */
    size_t window;      /* history capacity of pen / dry */
    mu_mt19937 rng;     /* XTC's own stream */
    uint32_t seed_cur;
} stage;

struct mu_sampler {
    mu_sampler_params p; /* pointer members cleared; owned copies below */
    int32_t n_vocab;
    mu_logit_bias *bias;
    size_t n_bias;
    mu_logit_bias *bias_all; /* bias + this call's banned ids */
    size_t bias_all_cap;
    stage stages[MU_SAMPLER_MAX_ORDER];
    size_t n_stages;
    mu_mt19937 rng; /* dist or mirostat */
    uint32_t seed_cur;
    float mu;       /* mirostat target surprise state */
    mu_token_data *cur;
    mu_candidates cand;
    mu_sample_work work;
    uint64_t fingerprint;
    bool greedy; /* greedy_chain(): the draw is skipped, and a unique maximum is taken without the chain */
    bool topk_first; /* topk_first() */
};

/* ------------------------------------------------------------- creation */

static bool resolve_window(int32_t value, int32_t fallback, const char *field, int32_t *out,
                           mu_error *err) {
    if (value < -1) {
        mu_err_set(err, "%s must be >= -1, got %d", field, value);
        return false;
    }
    if (value == -1) {
        if (fallback <= 0) {
            mu_err_set(err, "%s = -1 means the context size, but n_ctx is not set", field);
            return false;
        }
        value = fallback;
    }
    *out = value;
    return true;
}

static bool check_params(const mu_sampler_params *p, int32_t n_vocab, mu_error *err) {
    if (n_vocab <= 0) {
        mu_err_set(err, "sampler: n_vocab must be positive, got %d", n_vocab);
        return false;
    }
    if (p->mirostat < 0 || p->mirostat > 2) {
        mu_err_set(err, "mirostat must be 0, 1 or 2, got %d", p->mirostat);
        return false;
    }
    if (p->min_keep < 0) {
        mu_err_set(err, "min_keep must be >= 0, got %d", p->min_keep);
        return false;
    }
    if (p->n_order > MU_SAMPLER_MAX_ORDER) {
        mu_err_set(err, "sampler order has %zu entries, at most %d", p->n_order, MU_SAMPLER_MAX_ORDER);
        return false;
    }
    for (size_t i = 0; i < p->n_order; i++) {
        if ((unsigned)p->order[i] >= MU_SAMPLER_KIND_COUNT) {
            mu_err_set(err, "sampler order[%zu]: unknown kind %d", i, (int)p->order[i]);
            return false;
        }
    }
    if (p->n_logit_bias && !p->logit_bias) {
        mu_err_set(err, "logit_bias is NULL but n_logit_bias = %zu", p->n_logit_bias);
        return false;
    }
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t < 0 || t >= n_vocab) {
            mu_err_set(err, "logit_bias[%zu]: token %d is outside the vocabulary (0..%d)", i, t,
                       n_vocab - 1);
            return false;
        }
    }
    if (p->n_dry_breakers && !p->dry_breakers) {
        mu_err_set(err, "dry_breakers is NULL but n_dry_breakers = %zu", p->n_dry_breakers);
        return false;
    }
    return true;
}

/* FNV-1a over everything that shapes the sampler's behaviour, so a snapshot
 * is only loaded into an identically configured sampler. */
static void fnv(uint64_t *h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}

static uint64_t fingerprint(const mu_sampler *s, const mu_sampler_params *p) {
    uint64_t h = 0xcbf29ce484222325ull;
    const float f[] = {p->temp, p->top_p, p->min_p, p->typ_p, p->top_n_sigma, p->xtc_probability,
                       p->xtc_threshold, p->penalty_repeat, p->penalty_freq, p->penalty_present,
                       p->dry_multiplier, p->dry_base, p->dynatemp_range, p->dynatemp_exponent,
                       p->mirostat_tau, p->mirostat_eta};
    const int32_t i[] = {s->n_vocab, p->top_k, p->dry_allowed_length, p->mirostat, p->min_keep,
                         (int32_t)p->seed, p->n_ctx_train};
    fnv(&h, f, sizeof f);
    fnv(&h, i, sizeof i);
    for (size_t k = 0; k < p->n_order; k++) {
        int32_t kind = (int32_t)p->order[k];
        fnv(&h, &kind, sizeof kind);
    }
    for (size_t k = 0; k < s->n_stages; k++) fnv(&h, &s->stages[k].window, sizeof(size_t));
    for (size_t k = 0; k < p->n_logit_bias; k++) {
        fnv(&h, &p->logit_bias[k].token, sizeof(int32_t));
        fnv(&h, &p->logit_bias[k].bias, sizeof(float));
    }
    for (size_t k = 0; k < p->n_dry_breakers; k++)
        if (p->dry_breakers[k]) fnv(&h, p->dry_breakers[k], strlen(p->dry_breakers[k]) + 1);
    return h;
}

static bool build_stage(mu_sampler *s, stage *st, const mu_sampler_params *p,
                        const char *const *piece, const size_t *piece_len, mu_error *err) {
    st->active = mu_sampler_stage_active(p, st->kind);
    if (!st->active) return true;
    if (st->kind == MU_SAMPLER_PENALTIES) {
        int32_t last_n;
        if (!resolve_window(p->penalty_last_n, p->n_ctx, "repeat_last_n", &last_n, err)) return false;
        st->window = (size_t)last_n;
        st->pen = mu_penalties_new(last_n, p->penalty_repeat, p->penalty_freq, p->penalty_present,
                                   s->n_vocab);
    } else if (st->kind == MU_SAMPLER_DRY) {
        /* llama-server resolves -1 to the slot context; the library to the
         * model's training context. */
        int32_t fallback = p->n_ctx > 0 ? p->n_ctx : p->n_ctx_train;
        int32_t last_n;
        if (!resolve_window(p->dry_penalty_last_n, fallback, "dry_penalty_last_n", &last_n, err))
            return false;
        mu_dry_config cfg = {p->dry_multiplier, p->dry_base, p->dry_allowed_length, last_n,
                             p->n_ctx_train};
        st->window = (size_t)last_n;
        st->dry = mu_dry_new(&cfg, s->n_vocab, piece, piece_len, p->dry_breakers,
                             p->n_dry_breakers, p->dry_tokenize, p->dry_tokenize_ctx, err);
        if (!st->dry) return false;
    } else if (st->kind == MU_SAMPLER_XTC) {
        st->seed_cur = mu_seed_resolve(p->seed);
        mu_mt_seed(&st->rng, st->seed_cur);
    }
    return true;
}

/* Temperature <= 0 (no dynamic range, no mirostat, no logit bias) with
 * only stages that keep a unique maximum (top-k, top-p, min-p): the chain
 * then always ends with that maximum as its one finite candidate, so the
 * token is the row's argmax whenever the maximum is unique and not banned.
 * Such a chain never draws (the draw cannot change a lone candidate), so
 * the fast path and the full chain leave the same state. */
static bool greedy_chain(const mu_sampler *s) {
    if (s->p.mirostat != 0 || s->n_bias || !(s->p.temp <= 0.0f) || s->p.dynatemp_range > 0.0f) return false;
    bool temp = false;
    for (size_t i = 0; i < s->n_stages; i++) {
        if (!s->stages[i].active) continue;
        switch (s->stages[i].kind) {
        case MU_SAMPLER_TOP_K:
        case MU_SAMPLER_TOP_P:
        case MU_SAMPLER_MIN_P: break;
        case MU_SAMPLER_TEMPERATURE: temp = true; break;
        default: return false;
        }
    }
    return temp;
}

/* No logit bias, and the first active stage is top-k with k <= 128 (the
 * std::partial_sort of mu_cand_partial_sort_inplace; larger k take llama's
 * bucket sort) below the vocabulary: run_pass builds only its k candidates. */
static bool topk_first(const mu_sampler *s) {
    if (s->n_bias || s->p.mirostat != 0) return false;
    for (size_t i = 0; i < s->n_stages; i++)
        if (s->stages[i].active)
            return s->stages[i].kind == MU_SAMPLER_TOP_K && s->p.top_k <= 128 && s->p.top_k < s->n_vocab;
    return false;
}

mu_sampler *mu_sampler_new(const mu_sampler_params *p, int32_t n_vocab, const char *const *piece,
                           const size_t *piece_len, mu_error *err) {
    if (!p) {
        mu_err_set(err, "sampler: params is NULL");
        return NULL;
    }
    if (!check_params(p, n_vocab, err)) return NULL;
    mu_sampler *s = mu_xcalloc(1, sizeof *s);
    s->n_vocab = n_vocab;
    if (p->mirostat == 0) {
        s->n_stages = p->n_order;
        for (size_t i = 0; i < s->n_stages; i++) {
            s->stages[i].kind = p->order[i];
            if (!build_stage(s, &s->stages[i], p, piece, piece_len, err)) {
                mu_err_prefix(err, "sampler %s", mu_sampler_kind_name(p->order[i]));
                mu_sampler_free(s);
                return NULL;
            }
        }
    }
    s->fingerprint = fingerprint(s, p);
    s->p = *p;
    s->p.dry_breakers = NULL;
    s->p.n_dry_breakers = 0;
    s->p.dry_tokenize = NULL;
    s->p.dry_tokenize_ctx = NULL;
    s->n_bias = p->n_logit_bias;
    s->bias = mu_xmalloc((s->n_bias ? s->n_bias : 1) * sizeof *s->bias);
    if (s->n_bias) memcpy(s->bias, p->logit_bias, s->n_bias * sizeof *s->bias);
    s->p.logit_bias = s->bias;
    s->seed_cur = mu_seed_resolve(p->seed);
    mu_mt_seed(&s->rng, s->seed_cur);
    s->mu = 2.0f * p->mirostat_tau;
    s->cur = mu_xmalloc((size_t)n_vocab * sizeof *s->cur);
    s->cand = (mu_candidates){s->cur, 0, -1, false};
    s->greedy = greedy_chain(s);
    s->topk_first = topk_first(s);
    return s;
}

void mu_sampler_free(mu_sampler *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_stages; i++) {
        mu_penalties_free(s->stages[i].pen);
        mu_dry_free(s->stages[i].dry);
    }
    free(s->bias);
    free(s->bias_all);
    free(s->cur);
    mu_sample_work_free(&s->work);
    free(s);
}

/* --------------------------------------------------------------- sample */

static void apply_stage(mu_sampler *s, stage *st, mu_candidates *c) {
    const mu_sampler_params *p = &s->p;
    const size_t min_keep = (size_t)p->min_keep;
    switch (st->kind) {
    case MU_SAMPLER_PENALTIES: mu_penalties_apply(st->pen, c); break;
    case MU_SAMPLER_DRY: mu_dry_apply(st->dry, c); break;
    case MU_SAMPLER_TOP_N_SIGMA: mu_sample_top_n_sigma(c, p->top_n_sigma, &s->work); break;
    case MU_SAMPLER_TOP_K: mu_sample_top_k(c, p->top_k, &s->work); break;
    case MU_SAMPLER_TYPICAL_P: mu_sample_typical(c, p->typ_p, min_keep, &s->work); break;
    case MU_SAMPLER_TOP_P: mu_sample_top_p(c, p->top_p, min_keep, &s->work); break;
    case MU_SAMPLER_MIN_P: mu_sample_min_p(c, p->min_p, min_keep, &s->work); break;
    case MU_SAMPLER_XTC:
        mu_sample_xtc(c, p->xtc_probability, p->xtc_threshold, min_keep, &st->rng, &s->work);
        break;
    case MU_SAMPLER_TEMPERATURE:
        mu_sample_temp_ext(c, p->temp, p->dynatemp_range, p->dynatemp_exponent, &s->work);
        break;
    default: break;
    }
}

/* The logit-bias stage: the configured biases, then ignore-eos style -INF
 * entries for the banned ids (llama-server appends those to the list). */
static void apply_bias(mu_sampler *s, mu_candidates *c, const int32_t *banned, size_t n_banned) {
    size_t n = s->n_bias + n_banned;
    if (n == 0) return;
    if (n > s->bias_all_cap) {
        s->bias_all = mu_xrealloc(s->bias_all, n * sizeof *s->bias_all);
        s->bias_all_cap = n;
    }
    if (s->n_bias) memcpy(s->bias_all, s->bias, s->n_bias * sizeof *s->bias);
    for (size_t i = 0; i < n_banned; i++)
        s->bias_all[s->n_bias + i] = (mu_logit_bias){banned[i], -INFINITY};
    mu_sample_logit_bias(c, s->bias_all, n);
}

int mu_sample_fast_greedy = -1, mu_sample_fuse_top_k = -1;

/* A shortcut's switch: on unless MUSER_SAMPLE_SHORTCUTS=0 (A/B runs), or as a test set it. */
static bool shortcut_on(int *v) {
    if (*v < 0) {
        const char *e = getenv("MUSER_SAMPLE_SHORTCUTS");
        *v = !(e && *e && atoi(e) == 0);
    }
    return *v != 0;
}

/* One pass of common_sampler_sample: fresh candidates from the logits,
 * optional constraint mask first, then the chain. Returns the candidate
 * array with `selected` set. */
static mu_candidates *run_pass(mu_sampler *s, const float *logits, const int32_t *banned,
                               size_t n_banned, const mu_sample_constraint *mask) {
    mu_candidates *c = &s->cand;
    if (s->topk_first && !(mask && mask->apply) && shortcut_on(&mu_sample_fuse_top_k)) {
        /* the top-k stage first: its k candidates straight from the row (the rest is never read) */
        const size_t k = (size_t)s->p.top_k;
        mu_cand_top_k_of_row(s->cur, logits, (size_t)s->n_vocab, k, banned, n_banned);
        *c = (mu_candidates){s->cur, k, -1, true};
    } else {
        for (int32_t i = 0; i < s->n_vocab; i++) s->cur[i] = (mu_token_data){i, logits[i], 0.0f};
        *c = (mu_candidates){s->cur, (size_t)s->n_vocab, -1, false};
        if (mask && mask->apply) mask->apply(mask->ctx, c);
        apply_bias(s, c, banned, n_banned);
    }
    if (s->p.mirostat == 0) {
        for (size_t i = 0; i < s->n_stages; i++)
            if (s->stages[i].active) apply_stage(s, &s->stages[i], c);
        if (s->greedy) { /* the temperature stage left one finite candidate (or none) */
            c->selected = -1;
            for (size_t i = 0; i < c->size && c->selected < 0; i++)
                if (c->data[i].logit > -INFINITY) c->selected = (int64_t)i;
            return c;
        }
        mu_sample_dist(c, &s->rng);
        return c;
    }
    if (s->p.temp != 1.0f) mu_sample_temp(c, s->p.temp);
    if (s->p.mirostat == 1)
        mu_sample_mirostat(c, s->n_vocab, s->p.mirostat_tau, s->p.mirostat_eta, 100, &s->mu,
                           &s->rng, &s->work);
    else
        mu_sample_mirostat_v2(c, s->p.mirostat_tau, s->p.mirostat_eta, &s->mu, &s->rng, &s->work);
    return c;
}

static bool any_candidate_left(const mu_candidates *c) {
    if (c->selected < 0 || (size_t)c->selected >= c->size) return false;
    for (size_t i = 0; i < c->size; i++)
        if (c->data[i].logit > -INFINITY) return true;
    return false;
}

/* The greedy chain's token when the row's maximum is unique, finite and
 * not banned (-1 otherwise: the full chain decides). */
static int32_t greedy_pick(const mu_sampler *s, const float *logits, const int32_t *banned, size_t n_banned) {
    const int32_t id = mu_sample_argmax_unique(logits, (size_t)s->n_vocab);
    for (size_t i = 0; i < n_banned && id >= 0; i++)
        if (banned[i] == id) return -1;
    return id;
}

int32_t mu_sampler_sample(mu_sampler *s, const float *logits, const int32_t *banned,
                          size_t n_banned, const mu_sample_constraint *c, mu_error *err) {
    for (size_t i = 0; i < n_banned; i++) {
        if (banned[i] < 0 || banned[i] >= s->n_vocab) {
            mu_err_set(err, "sampler: banned[%zu] = %d is outside the vocabulary (0..%d)", i,
                       banned[i], s->n_vocab - 1);
            return -1;
        }
    }
    mu_candidates *cand;
    if (s->greedy && shortcut_on(&mu_sample_fast_greedy)) {
        const int32_t id = greedy_pick(s, logits, banned, n_banned);
        if (id >= 0) {
            if (!c || !c->accepts || c->accepts(c->ctx, id)) return id;
            goto masked; /* the chain without the mask would pick id again, and a greedy chain draws nothing */
        }
        /* ties, a banned maximum or a non-finite value: the full chain */
    }
    cand = run_pass(s, logits, banned, n_banned, NULL);
    if (!any_candidate_left(cand)) {
        mu_err_set(err, "sampler: every token is masked (all logits -inf)");
        return -1;
    }
    int32_t id = cand->data[cand->selected].id;
    if (!c || !c->accepts || c->accepts(c->ctx, id)) return id;
    /* Rejected: rerun with the constraint applied first. The rejected pass
     * already advanced the RNG streams (and mirostat's mu), as in llama. */
masked:
    cand = run_pass(s, logits, banned, n_banned, c);
    if (!any_candidate_left(cand)) {
        mu_err_set(err, "sampler: the constraint rejects every remaining token");
        return -1;
    }
    return cand->data[cand->selected].id;
}

void mu_sampler_accept(mu_sampler *s, int32_t token) {
    for (size_t i = 0; i < s->n_stages; i++) {
        stage *st = &s->stages[i];
        if (st->pen) mu_penalties_accept(st->pen, token);
        if (st->dry) mu_dry_accept(st->dry, token);
    }
}

void mu_sampler_reset(mu_sampler *s) {
    for (size_t i = 0; i < s->n_stages; i++) {
        stage *st = &s->stages[i];
        if (st->pen) mu_penalties_reset(st->pen);
        if (st->dry) mu_dry_reset(st->dry);
        if (st->active && st->kind == MU_SAMPLER_XTC) {
            st->seed_cur = mu_seed_resolve(s->p.seed);
            mu_mt_seed(&st->rng, st->seed_cur);
        }
    }
    s->seed_cur = mu_seed_resolve(s->p.seed);
    mu_mt_seed(&s->rng, s->seed_cur);
    s->mu = 2.0f * s->p.mirostat_tau;
}

uint32_t mu_sampler_seed(const mu_sampler *s) { return s->seed_cur; }
bool mu_sampler_is_greedy(const mu_sampler *s) { return s->greedy; }

const mu_candidates *mu_sampler_candidates(const mu_sampler *s) { return &s->cand; }

/* ------------------------------------------------------------- snapshot */
/* Layout, little-endian: magic[8], u64 fingerprint, u32 n_stages, final
 * stream (u32 seed, 624 u32 state, u32 index, f32 mu), then per stage: XTC
 * stream (u32 seed, state, index) or history (u32 n, n x i32) or nothing. */

static const char SNAP_MAGIC[8] = {'M', 'U', 'S', 'M', 'P', 'L', 'R', '1'};
enum { RNG_BYTES = 4 + 624 * 4 + 4 };

static size_t stage_bytes(const stage *st) {
    if (st->pen) return 4 + 4 * mu_penalties_history(st->pen, NULL);
    if (st->dry) return 4 + 4 * mu_dry_history(st->dry, NULL);
    if (st->active && st->kind == MU_SAMPLER_XTC) return RNG_BYTES;
    return 0;
}

size_t mu_sampler_state_size(const mu_sampler *s) {
    size_t n = sizeof SNAP_MAGIC + 8 + 4 + RNG_BYTES + 4;
    for (size_t i = 0; i < s->n_stages; i++) n += stage_bytes(&s->stages[i]);
    return n;
}

static uint8_t *put_u32(uint8_t *o, uint32_t v) {
    for (int i = 0; i < 4; i++) o[i] = (uint8_t)(v >> (8 * i));
    return o + 4;
}

static uint32_t get_u32(const uint8_t **in) {
    const uint8_t *b = *in;
    *in += 4;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint8_t *put_rng(uint8_t *o, uint32_t seed, const mu_mt19937 *r) {
    o = put_u32(o, seed);
    for (int i = 0; i < 624; i++) o = put_u32(o, r->x[i]);
    return put_u32(o, r->next);
}

static uint8_t *put_history(uint8_t *o, const int32_t *tok, size_t n) {
    o = put_u32(o, (uint32_t)n);
    for (size_t i = 0; i < n; i++) o = put_u32(o, (uint32_t)tok[i]);
    return o;
}

bool mu_sampler_state_save(const mu_sampler *s, void *buf, size_t cap) {
    if (!buf || cap < mu_sampler_state_size(s)) return false;
    uint8_t *o = buf;
    memcpy(o, SNAP_MAGIC, sizeof SNAP_MAGIC);
    o += sizeof SNAP_MAGIC;
    o = put_u32(o, (uint32_t)s->fingerprint);
    o = put_u32(o, (uint32_t)(s->fingerprint >> 32));
    o = put_u32(o, (uint32_t)s->n_stages);
    o = put_rng(o, s->seed_cur, &s->rng);
    o = put_u32(o, mu_f32_bits(s->mu));
    for (size_t i = 0; i < s->n_stages; i++) {
        const stage *st = &s->stages[i];
        if (st->pen || st->dry) {
            size_t n = st->pen ? mu_penalties_history(st->pen, NULL) : mu_dry_history(st->dry, NULL);
            int32_t *tok = mu_xmalloc((n ? n : 1) * sizeof *tok);
            if (st->pen) mu_penalties_history(st->pen, tok);
            else mu_dry_history(st->dry, tok);
            o = put_history(o, tok, n);
            free(tok);
        } else if (st->active && st->kind == MU_SAMPLER_XTC) {
            o = put_rng(o, st->seed_cur, &st->rng);
        }
    }
    return true;
}

/* Bounds-checked reader over the snapshot. */
typedef struct reader {
    const uint8_t *at, *end;
} reader;

static bool take(reader *r, size_t n) { return (size_t)(r->end - r->at) >= n; }

static bool read_rng(reader *r, uint32_t *seed, mu_mt19937 *out, const char *what, mu_error *err) {
    if (!take(r, RNG_BYTES)) {
        mu_err_set(err, "sampler snapshot: truncated in the %s stream", what);
        return false;
    }
    *seed = get_u32(&r->at);
    for (int i = 0; i < 624; i++) out->x[i] = get_u32(&r->at);
    out->next = get_u32(&r->at);
    if (out->next > 624) {
        mu_err_set(err, "sampler snapshot: %s stream index %u exceeds 624", what, out->next);
        return false;
    }
    return true;
}

/* Parses and validates everything before touching the sampler, so a failed
 * load leaves it as it was. */
bool mu_sampler_state_load(mu_sampler *s, const void *buf, size_t len, mu_error *err) {
    reader r = {buf, (const uint8_t *)buf + len};
    if (!buf || !take(&r, sizeof SNAP_MAGIC + 12) || memcmp(r.at, SNAP_MAGIC, sizeof SNAP_MAGIC)) {
        mu_err_set(err, "sampler snapshot: bad magic or too short (%zu bytes)", len);
        return false;
    }
    r.at += sizeof SNAP_MAGIC;
    uint64_t fp = get_u32(&r.at);
    fp |= (uint64_t)get_u32(&r.at) << 32;
    uint32_t n_stages = get_u32(&r.at);
    if (fp != s->fingerprint || n_stages != s->n_stages) {
        mu_err_set(err, "sampler snapshot: taken with a different sampler configuration");
        return false;
    }
    uint32_t seed;
    mu_mt19937 rng;
    if (!read_rng(&r, &seed, &rng, "final draw", err)) return false;
    if (!take(&r, 4)) {
        mu_err_set(err, "sampler snapshot: truncated before mirostat mu");
        return false;
    }
    float mu = mu_bits_f32(get_u32(&r.at));
    uint32_t xtc_seed[MU_SAMPLER_MAX_ORDER];
    mu_mt19937 *xtc_rng = mu_xmalloc(MU_SAMPLER_MAX_ORDER * sizeof *xtc_rng);
    const uint8_t *hist[MU_SAMPLER_MAX_ORDER];
    uint32_t hist_n[MU_SAMPLER_MAX_ORDER];
    bool ok = true;
    for (size_t i = 0; ok && i < s->n_stages; i++) {
        const stage *st = &s->stages[i];
        if (st->pen || st->dry) {
            uint32_t n = take(&r, 4) ? get_u32(&r.at) : UINT32_MAX;
            if (n == UINT32_MAX || n > st->window || !take(&r, (size_t)n * 4)) {
                mu_err_set(err, "sampler snapshot: stage %zu (%s) history is truncated or longer "
                           "than its window of %zu", i, mu_sampler_kind_name(st->kind), st->window);
                ok = false;
                break;
            }
            hist[i] = r.at;
            hist_n[i] = n;
            r.at += (size_t)n * 4;
        } else if (st->active && st->kind == MU_SAMPLER_XTC) {
            ok = read_rng(&r, &xtc_seed[i], &xtc_rng[i], "XTC", err);
        }
    }
    if (ok && r.at != r.end) {
        mu_err_set(err, "sampler snapshot: %zu trailing bytes", (size_t)(r.end - r.at));
        ok = false;
    }
    if (ok) {
        s->seed_cur = seed;
        s->rng = rng;
        s->mu = mu;
        int32_t *tok = mu_xmalloc((len / 4 + 1) * sizeof *tok);
        for (size_t i = 0; i < s->n_stages; i++) {
            stage *st = &s->stages[i];
            if (st->pen || st->dry) {
                const uint8_t *at = hist[i];
                for (uint32_t k = 0; k < hist_n[i]; k++) tok[k] = (int32_t)get_u32(&at);
                if (st->pen) mu_penalties_restore(st->pen, tok, hist_n[i]);
                else mu_dry_restore(st->dry, tok, hist_n[i]);
            } else if (st->active && st->kind == MU_SAMPLER_XTC) {
                st->seed_cur = xtc_seed[i];
                st->rng = xtc_rng[i];
            }
        }
        free(tok);
    }
    free(xtc_rng);
    return ok;
}
