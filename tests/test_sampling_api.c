/* The public sampling API (muser_sampler_*, muser_logprobs) end to end, on a
 * synthetic model and on the shipped glimmer-tiny:
 *  - defaults are llama.cpp's; the chain prints as llama logs it;
 *  - with every filter off, each draw equals an independent re-implementation
 *    of llama's dist sampler (MT19937 written here, libstdc++'s canonical
 *    double, expf softmax summed in double, first cumulative >= sum * u);
 *  - seeded generation replays bit-identically, another seed differs, a
 *    random seed replays through the seed it reports;
 *  - a snapshot taken mid-generation (with and without a grammar) resumes
 *    the identical sequence in a fresh sampler; bad snapshots are refused;
 *  - ignore_eos never draws EOG and leaves the logits row untouched;
 *    logit_bias bans and forces;
 *  - bad GBNF / JSON Schema / sampler names are refused with their message;
 *    `<token-text>` terminals resolve through the tokenizer;
 *  - logprobs: order, normalisation, and the chosen logprob against a
 *    log-softmax computed here in double;
 *  - the grammar vocabulary is built once per model and shared: a second
 *    grammar sampler reuses it, and it matches a freshly built one. */
#include "model_fixture.h"
#include "model/api_internal.h"
#include "muser.h"
#include "testutil.h"
#include <math.h>

/* ---------------------------------------------------------------- models */

typedef struct lm {
    muser_model *m;
    muser_session *s;
    int64_t n_vocab;
    int32_t *prompt;
    int64_t n_prompt;
} lm;

static bool lm_open(lm *l, const char *path, const char *prompt_text) {
    muser_error err;
    memset(l, 0, sizeof *l);
    l->m = muser_model_load(path, NULL, &err);
    if (!l->m) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return false;
    }
    muser_model_info info;
    muser_model_get_info(l->m, &info);
    l->n_vocab = info.n_vocab;
    muser_session_params sp = {.n_ctx = 512};
    l->s = muser_session_create(l->m, &sp, &err);
    l->n_prompt = muser_tokenize(l->m, prompt_text, strlen(prompt_text), true, true, &l->prompt, &err);
    return l->s && l->n_prompt > 0;
}

static void lm_close(lm *l) {
    muser_session_free(l->s);
    muser_model_free(l->m);
    free(l->prompt);
}

/* Prefill the prompt into a fresh session; returns the logits row. */
static const float *lm_start(lm *l) {
    muser_error err;
    muser_session_reset(l->s);
    if (!muser_session_feed(l->s, l->prompt, l->n_prompt, &err)) {
        fprintf(stderr, "feed: %s\n", err.msg);
        return NULL;
    }
    return muser_session_logits(l->s);
}

/* Generate up to n tokens with smp (prompt already accepted); stops after
 * an EOG. Returns the count, -1 on an error. */
static int gen(lm *l, muser_sampler *smp, const float *logits, int32_t *out, int n) {
    muser_error err;
    for (int i = 0; i < n; i++) {
        int32_t t = muser_sampler_sample(smp, logits, &err);
        if (t < 0 || !muser_sampler_accept(smp, t, &err)) {
            fprintf(stderr, "step %d: %s\n", i, err.msg);
            return -1;
        }
        out[i] = t;
        if (muser_token_is_eog(l->m, t)) return i + 1;
        if (!muser_session_feed(l->s, &t, 1, &err)) {
            fprintf(stderr, "feed: %s\n", err.msg);
            return -1;
        }
        logits = muser_session_logits(l->s);
    }
    return n;
}

/* A whole generation from the prompt with fresh sampler state. */
static int gen_seeded(lm *l, const muser_sampling_params *p, int32_t *out, int n, uint32_t *seed_used) {
    muser_error err;
    muser_sampler *smp = muser_sampler_create(l->m, p, &err);
    if (!smp) {
        fprintf(stderr, "create: %s\n", err.msg);
        return -1;
    }
    if (seed_used) *seed_used = muser_sampler_seed(smp);
    const float *logits = lm_start(l);
    int r = logits && muser_sampler_accept_prompt(smp, l->prompt, (size_t)l->n_prompt, &err)
                ? gen(l, smp, logits, out, n) : -1;
    muser_sampler_free(smp);
    return r;
}

/* ------------------------------------------- an independent dist sampler */

typedef struct tmt {
    uint32_t x[624];
    int i;
} tmt;

static void tmt_seed(tmt *r, uint32_t s) {
    r->x[0] = s;
    for (uint32_t i = 1; i < 624; i++) r->x[i] = 1812433253u * (r->x[i - 1] ^ (r->x[i - 1] >> 30)) + i;
    r->i = 624;
}

static uint32_t tmt_next(tmt *r) {
    if (r->i >= 624) {
        for (int k = 0; k < 624; k++) {
            uint32_t y = (r->x[k] & 0x80000000u) | (r->x[(k + 1) % 624] & 0x7fffffffu);
            r->x[k] = r->x[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
        }
        r->i = 0;
    }
    uint32_t y = r->x[r->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

/* libstdc++ generate_canonical<double, 53> over a 32-bit engine: two calls,
 * the first is the low word, divided by 2^64, clamped below 1. */
static double tmt_canonical(tmt *r) {
    double lo = tmt_next(r), hi = tmt_next(r);
    double v = (lo + hi * 4294967296.0) / 18446744073709551616.0;
    return v >= 1.0 ? nextafter(1.0, 0.0) : v;
}

/* llama's dist over the untouched row (id order). */
static int32_t ref_dist(const float *logits, int64_t n, tmt *r) {
    float mx = logits[0];
    for (int64_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += expf(logits[i] - mx);
    double target = sum * tmt_canonical(r), run = 0;
    for (int64_t i = 0; i < n; i++) {
        run += expf(logits[i] - mx);
        if (run >= target) return (int32_t)i;
    }
    return (int32_t)(n - 1);
}

static void test_reference_mt(void) {
    tmt r;
    tmt_seed(&r, 5489);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = tmt_next(&r);
    CHECK_EQ_INT(v, 4123659995u); /* the C++ standard's check value for mt19937 */
}

static void test_dist_matches_reference(lm *l, uint32_t seed) {
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.seed = seed;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.temp = 1.0f; /* every stage inactive: the chain is logits -> dist */
    muser_error err;
    muser_sampler *smp = muser_sampler_create(l->m, &p, &err);
    CHECK_MSG(smp, "%s", err.msg);
    if (!smp) return;
    char chain[256];
    muser_sampler_chain_str(smp, chain, sizeof chain);
    CHECK_MSG(!strcmp(chain, "logits -> ?penalties -> ?dry -> ?top-n-sigma -> ?top-k -> ?typical -> ?top-p "
                             "-> ?min-p -> ?xtc -> ?temp-ext -> dist "), "%s", chain);
    tmt r;
    tmt_seed(&r, seed);
    const float *logits = lm_start(l);
    int same = 0, distinct = 0;
    int32_t first = -1;
    for (int i = 0; i < 40 && logits; i++) {
        int32_t want = ref_dist(logits, l->n_vocab, &r);
        int32_t got = muser_sampler_sample(smp, logits, &err);
        CHECK_MSG(got == want, "seed %u step %d: sampler %d, reference %d", seed, i, got, want);
        if (got != want) break;
        same++;
        if (first < 0) first = got;
        distinct += got != first;
        if (!muser_sampler_accept(smp, got, &err) || !muser_session_feed(l->s, &got, 1, &err)) break;
        logits = muser_session_logits(l->s);
    }
    CHECK_EQ_INT(same, 40);
    CHECK(distinct > 0); /* a real draw, not a constant */
    muser_sampler_free(smp);
}

/* ------------------------------------------------------------- replays */

static void test_defaults(void) {
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    CHECK_EQ_INT(p.seed, 0xFFFFFFFFu);
    CHECK(p.temp == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f);
    CHECK(p.typ_p == 1.0f && p.top_n_sigma == -1.0f && p.xtc_probability == 0.0f && p.xtc_threshold == 0.1f);
    CHECK(p.penalty_last_n == 64 && p.penalty_repeat == 1.0f && p.penalty_freq == 0.0f && p.penalty_present == 0.0f);
    CHECK(p.dry_multiplier == 0.0f && p.dry_base == 1.75f && p.dry_allowed_length == 2 && p.dry_penalty_last_n == -1);
    CHECK(p.dynatemp_range == 0.0f && p.dynatemp_exponent == 1.0f);
    CHECK(p.mirostat == 0 && p.mirostat_tau == 5.0f && p.mirostat_eta == 0.1f && p.min_keep == 0);
    CHECK(!p.samplers && !p.sampling_seq && !p.grammar && !p.json_schema && !p.ignore_eos && p.n_probs == 0);
}

static void test_replay(lm *l, const char *what) {
    enum { N = 48 };
    int32_t a[N], b[N], c[N], d[N];
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.seed = 7;
    p.ignore_eos = true; /* full-length sequences */
    int na = gen_seeded(l, &p, a, N, NULL), nb = gen_seeded(l, &p, b, N, NULL);
    CHECK_MSG(na == N && nb == N && !memcmp(a, b, sizeof a), "%s: seed 7 does not replay", what);
    p.seed = 8;
    int nc = gen_seeded(l, &p, c, N, NULL);
    CHECK_MSG(nc == N && memcmp(a, c, sizeof a), "%s: seeds 7 and 8 gave the same sequence", what);
    /* a random seed is reported and replays through that value */
    p.seed = MUSER_SEED_RANDOM;
    uint32_t used = 0;
    int nd = gen_seeded(l, &p, d, N, &used);
    CHECK(nd == N);
    if (used != MUSER_SEED_RANDOM) {
        p.seed = used;
        int ne = gen_seeded(l, &p, c, N, NULL);
        CHECK_MSG(ne == N && !memcmp(c, d, sizeof c), "%s: random seed %u does not replay", what, used);
    }
    /* the one-letter order equals the same order by name */
    p.seed = 7;
    p.sampling_seq = "edskypmxt";
    nb = gen_seeded(l, &p, b, N, NULL);
    CHECK_MSG(nb == N && !memcmp(a, b, sizeof a), "%s: --sampling-seq default differs from the default", what);
    p.sampling_seq = NULL;
    p.samplers = "top_k;temperature"; /* drops top_p / min_p: a different sequence */
    nb = gen_seeded(l, &p, b, N, NULL);
    CHECK_MSG(nb == N && memcmp(a, b, sizeof a), "%s: a different chain order gave the same sequence", what);
}

/* Snapshot after k tokens; a fresh sampler loaded from it continues the
 * same draws as the original one. */
static void test_snapshot(lm *l, const char *schema) {
    enum { K = 10, N = 30 };
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.seed = 99;
    p.penalty_repeat = 1.1f; /* a history that the snapshot has to carry */
    p.xtc_probability = 0.5f; /* and a second RNG stream */
    p.json_schema = schema;
    p.ignore_eos = !schema;
    muser_error err;
    muser_sampler *a = muser_sampler_create(l->m, &p, &err);
    CHECK_MSG(a, "%s", err.msg);
    if (!a) return;
    CHECK(muser_sampler_accept_prompt(a, l->prompt, (size_t)l->n_prompt, &err));
    const float *logits = lm_start(l);
    int32_t head[K], tail_a[N], tail_b[N];
    CHECK_EQ_INT(gen(l, a, logits, head, K), K);
    size_t size = muser_sampler_state_size(a);
    uint8_t *state = malloc(size);
    CHECK(muser_sampler_state_save(a, state, size, &err));
    CHECK(!muser_sampler_state_save(a, state, size - 1, &err) && strstr(err.msg, "needs"));
    muser_snapshot *kv = muser_session_snapshot(l->s);
    float *row = malloc((size_t)l->n_vocab * sizeof *row);
    memcpy(row, muser_session_logits(l->s), (size_t)l->n_vocab * sizeof *row);
    int na = gen(l, a, row, tail_a, N);

    muser_sampler *b = muser_sampler_create(l->m, &p, &err);
    CHECK(b && muser_sampler_state_load(b, state, size, &err));
    CHECK(muser_session_restore(l->s, kv, &err));
    int nb = gen(l, b, row, tail_b, N);
    CHECK_MSG(na > 0 && na == nb && !memcmp(tail_a, tail_b, (size_t)na * sizeof(int32_t)),
              "snapshot (%s) does not resume the sequence (%d vs %d tokens)", schema ? "schema" : "plain", na, nb);
    /* refusals leave the sampler usable */
    CHECK(!muser_sampler_state_load(b, state, size - 3, &err));
    state[0] ^= 1;
    CHECK(!muser_sampler_state_load(b, state, size, &err) && strstr(err.msg, "magic"));
    state[0] ^= 1;
    muser_sampling_params q = p;
    q.top_k = 41;
    muser_sampler *c = muser_sampler_create(l->m, &q, &err);
    CHECK(c && !muser_sampler_state_load(c, state, size, &err) && strstr(err.msg, "configuration"));
    muser_sampler_free(c);
    muser_sampler_free(a);
    muser_sampler_free(b);
    muser_snapshot_free(kv);
    free(row);
    free(state);
}

/* ------------------------------------------------------- EOG and biases */

static void test_ignore_eos(lm *l) {
    int32_t eog = -1;
    for (int32_t i = 0; i < l->n_vocab && eog < 0; i++)
        if (muser_token_is_eog(l->m, i)) eog = i;
    CHECK(eog >= 0);
    if (eog < 0) return;
    float *row = malloc((size_t)l->n_vocab * sizeof *row), *copy = malloc((size_t)l->n_vocab * sizeof *copy);
    memcpy(row, lm_start(l), (size_t)l->n_vocab * sizeof *row);
    for (int32_t i = 0; i < l->n_vocab; i++)
        if (muser_token_is_eog(l->m, i)) row[i] = 40.0f; /* every EOG far ahead */
    memcpy(copy, row, (size_t)l->n_vocab * sizeof *row);
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    muser_error err;
    for (int pass = 0; pass < 2; pass++) {
        p.ignore_eos = pass == 1;
        for (uint32_t seed = 1; seed <= 20; seed++) {
            p.seed = seed;
            muser_sampler *smp = muser_sampler_create(l->m, &p, &err);
            int32_t t = smp ? muser_sampler_sample(smp, row, &err) : -1;
            CHECK_MSG(t >= 0, "%s", err.msg);
            if (pass == 0) CHECK_MSG(muser_token_is_eog(l->m, t), "seed %u drew %d instead of an EOG", seed, t);
            else CHECK_MSG(t >= 0 && !muser_token_is_eog(l->m, t), "ignore_eos drew EOG %d", t);
            muser_sampler_free(smp);
        }
    }
    CHECK(!memcmp(row, copy, (size_t)l->n_vocab * sizeof *row));
    char chain[256];
    muser_sampler *smp = muser_sampler_create(l->m, &p, &err);
    muser_sampler_chain_str(smp, chain, sizeof chain);
    CHECK_MSG(!strncmp(chain, "logits -> logit-bias -> ", 24), "%s", chain);
    muser_sampler_free(smp);
    free(row);
    free(copy);
}

static int32_t argmax(const float *v, int64_t n, int32_t skip) {
    int32_t best = skip == 0 ? 1 : 0;
    for (int32_t i = 0; i < n; i++)
        if (i != skip && v[i] > v[best]) best = i;
    return best;
}

static void test_logit_bias(lm *l) {
    const float *row = lm_start(l);
    int32_t top = argmax(row, l->n_vocab, -1), second = argmax(row, l->n_vocab, top);
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.temp = 0.0f; /* greedy */
    muser_error err;
    muser_sampler *smp = muser_sampler_create(l->m, &p, &err);
    CHECK_EQ_INT(muser_sampler_sample(smp, row, &err), top);
    muser_sampler_free(smp);
    muser_logit_bias ban = {top, -INFINITY};
    p.logit_bias = &ban;
    p.n_logit_bias = 1;
    smp = muser_sampler_create(l->m, &p, &err);
    CHECK_EQ_INT(muser_sampler_sample(smp, row, &err), second);
    muser_sampler_free(smp);
    int32_t low = argmax(row, l->n_vocab, -1) == 5 ? 6 : 5;
    muser_logit_bias force = {low, 1000.0f};
    p.logit_bias = &force;
    smp = muser_sampler_create(l->m, &p, &err);
    CHECK_EQ_INT(muser_sampler_sample(smp, row, &err), low);
    muser_sampler_free(smp);
    muser_logit_bias bad = {(int32_t)l->n_vocab, 1.0f};
    p.logit_bias = &bad;
    CHECK(!muser_sampler_create(l->m, &p, &err) && strstr(err.msg, "outside the vocabulary"));
    muser_logit_bias nan_bias = {1, NAN};
    p.logit_bias = &nan_bias;
    CHECK(!muser_sampler_create(l->m, &p, &err) && strstr(err.msg, "logit_bias[0]"));
}

/* ------------------------------------------------------------ refusals */

static void expect_refused(const muser_model *m, const muser_sampling_params *p, const char *want) {
    muser_error err = {{0}};
    muser_sampler *s = muser_sampler_create(m, p, &err);
    CHECK_MSG(!s && strstr(err.msg, want), "want '%s', got '%s'", want, s ? "(created)" : err.msg);
    muser_sampler_free(s);
}

static void test_refusals(lm *l) {
    muser_sampling_params p, d;
    muser_sampling_params_default(&d);
    p = d, p.grammar = "root ::= foo\n";
    expect_refused(l->m, &p, "line 1, column 10: undefined rule 'foo'");
    p = d, p.grammar = "root ::= \"a\" (\"b\"\n";
    expect_refused(l->m, &p, "expected ')' to close the group opened at line 1, column 14");
    p = d, p.grammar = "item ::= \"a\"\n";
    expect_refused(l->m, &p, "no rule named 'root'");
    p = d, p.grammar = "item ::= \"a\"\n", p.grammar_root = "nope";
    expect_refused(l->m, &p, "no rule named 'nope'");
    p = d, p.grammar = "root ::= <not-one-token>\n";
    expect_refused(l->m, &p, "<not-one-token> is not exactly one token");
    p = d, p.json_schema = "{\"type\":\"integer\",\"multipleOf\":3}";
    expect_refused(l->m, &p, "unsupported keyword \"multipleOf\" at /multipleOf");
    p = d, p.json_schema = "{\"type\":";
    expect_refused(l->m, &p, "json schema: invalid JSON at line 1");
    p = d, p.json_schema = "{}", p.grammar = "root ::= \"a\"";
    expect_refused(l->m, &p, "mutually exclusive");
    p = d, p.samplers = "top_k;bogus";
    expect_refused(l->m, &p, "unknown sampler name 'bogus'");
    p = d, p.sampling_seq = "kq";
    expect_refused(l->m, &p, "unknown sampler letter 'q' at 1");
    p = d, p.samplers = "top_k", p.sampling_seq = "k";
    expect_refused(l->m, &p, "not both");
    p = d, p.temp = NAN;
    expect_refused(l->m, &p, "temp must be a finite number");
    p = d, p.mirostat = 3;
    expect_refused(l->m, &p, "mirostat must be 0, 1 or 2");
    p = d, p.n_probs = (int32_t)l->n_vocab + 1;
    expect_refused(l->m, &p, "n_probs must be in");
    muser_error err;
    muser_sampler *s = muser_sampler_create(l->m, &d, &err);
    int32_t bad = (int32_t)l->n_vocab;
    CHECK(!muser_sampler_accept_prompt(s, &bad, 1, &err) && strstr(err.msg, "outside the vocabulary"));
    CHECK(!muser_sampler_accept(s, -1, &err));
    muser_sampler_free(s);
}

/* A grammar with a token terminal: "a" then exactly <|header_start|>, then
 * end of generation. Drawn greedily from real logits. */
static void test_token_terminal(lm *l) {
    int32_t *ids = NULL;
    muser_error err;
    int64_t n = muser_tokenize(l->m, "<|header_start|>", 16, false, true, &ids, &err);
    CHECK_EQ_INT(n, 1);
    int32_t header = n == 1 ? ids[0] : -1;
    free(ids);
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.seed = 3;
    p.grammar = "root ::= \"a\" <|header_start|>\n";
    muser_sampler *s = muser_sampler_create(l->m, &p, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) return;
    const float *row = lm_start(l);
    int32_t t1 = muser_sampler_sample(s, row, &err);
    char piece[8];
    CHECK(t1 >= 0 && muser_token_piece(l->m, t1, true, piece, sizeof piece) == 1 && piece[0] == 'a');
    CHECK(!muser_sampler_accept(s, header, &err) && strstr(err.msg, "grammar refuses token"));
    CHECK(muser_sampler_accept(s, t1, &err));
    CHECK(!muser_sampler_grammar_complete(s));
    CHECK_EQ_INT(muser_sampler_sample(s, row, &err), header);
    CHECK(muser_sampler_accept(s, header, &err));
    CHECK(muser_sampler_grammar_complete(s));
    int32_t t3 = muser_sampler_sample(s, row, &err);
    CHECK_MSG(t3 >= 0 && muser_token_is_eog(l->m, t3), "after the grammar completes: %d", t3);
    /* complete + ignore_eos: nothing can follow, reported as such */
    p.ignore_eos = true;
    muser_sampler *q = muser_sampler_create(l->m, &p, &err);
    CHECK(q && muser_sampler_accept(q, t1, &err) && muser_sampler_accept(q, header, &err));
    CHECK(q && muser_sampler_sample(q, row, &err) < 0 && strstr(err.msg, "ignore_eos"));
    /* reset restarts the grammar */
    muser_sampler_reset(s);
    CHECK(!muser_sampler_grammar_complete(s) && !muser_sampler_accept(s, header, &err));
    muser_sampler_free(q);
    muser_sampler_free(s);
}

/* ------------------------------------------------------------ logprobs */

static void test_logprobs(lm *l) {
    const float *row = lm_start(l);
    int64_t n = l->n_vocab;
    double mx = row[0];
    for (int64_t i = 1; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)row[i] - mx);
    double log_z = mx + log(sum);
    muser_logprob *top = malloc((size_t)n * sizeof *top), chosen;
    muser_error err;
    int32_t pick = (int32_t)(n / 3);
    CHECK(muser_logprobs(l->m, row, pick, (int32_t)n, &chosen, top, &err));
    CHECK_EQ_INT(chosen.id, pick);
    CHECK_MSG(fabs(chosen.logprob - ((double)row[pick] - log_z)) < 1e-5, "%.9g vs %.9g", (double)chosen.logprob,
              (double)row[pick] - log_z);
    double total = 0;
    bool ordered = true, all_ids = true;
    char *seen = calloc((size_t)n, 1);
    for (int64_t i = 0; i < n; i++) {
        total += exp((double)top[i].logprob);
        if (i && (top[i].logprob > top[i - 1].logprob || row[top[i].id] > row[top[i - 1].id] ||
                  (row[top[i].id] == row[top[i - 1].id] && top[i].id < top[i - 1].id)))
            ordered = false; /* by logit, ties by lower id */
        if (top[i].id < 0 || top[i].id >= n || seen[top[i].id]++) all_ids = false;
        if (fabs(top[i].logprob - ((double)row[top[i].id] - log_z)) > 1e-5) all_ids = false;
    }
    CHECK(ordered && all_ids);
    CHECK_MSG(fabs(total - 1.0) < 1e-4, "probabilities sum to %.9g", total);
    CHECK_EQ_INT(top[0].id, argmax(row, n, -1));
    /* through a sampler: n_probs alternatives */
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.n_probs = 5;
    muser_sampler *s = muser_sampler_create(l->m, &p, &err);
    muser_logprob five[5], c2;
    CHECK_EQ_INT(muser_sampler_logprobs(s, row, pick, &c2, five, &err), 5);
    CHECK(c2.id == pick && c2.logprob == chosen.logprob);
    for (int i = 0; i < 5; i++) CHECK(five[i].id == top[i].id && five[i].logprob == top[i].logprob);
    muser_sampler_free(s);
    CHECK(!muser_logprobs(l->m, row, (int32_t)n, 0, &chosen, NULL, &err));
    float *bad = malloc((size_t)n * sizeof *bad);
    memcpy(bad, row, (size_t)n * sizeof *bad);
    bad[1] = NAN;
    CHECK(!muser_logprobs(l->m, bad, 0, 0, &chosen, NULL, &err));
    free(bad);
    free(seen);
    free(top);
}

static void test_shared_vocab(lm *l) {
    mu_error err;
    muser_sampling_params p;
    muser_sampling_params_default(&p);
    p.grammar = "root ::= [a-z]+";
    muser_sampler *a = muser_sampler_create(l->m, &p, NULL), *b = muser_sampler_create(l->m, &p, NULL);
    const mu_grammar_vocab *v1 = mu_api_shared_grammar_vocab(l->m, &err);
    CHECK(a && b && v1 && v1 == mu_api_shared_grammar_vocab(l->m, &err));
    mu_grammar_vocab *fresh = mu_api_grammar_vocab(l->m, &err);
    CHECK(fresh && mu_grammar_vocab_size(fresh) == mu_grammar_vocab_size(v1));
    for (int32_t id = 0; fresh && id < mu_grammar_vocab_size(fresh); id += 97) {
        char buf[256];
        size_t n = muser_token_piece(l->m, id, true, buf, sizeof buf);
        if (n == 0 || n > sizeof buf) continue;
        CHECK(mu_grammar_vocab_find(v1, buf, n) == mu_grammar_vocab_find(fresh, buf, n));
    }
    mu_grammar_vocab_free(fresh);
    muser_sampler_free(a);
    muser_sampler_free(b);
}

int main(void) {
    test_reference_mt();
    test_defaults();
    lm synth;
    if (!lm_open(&synth, fx_synth("q4_k_xl", 11, 32), "Once upon a time")) return 1;
    test_dist_matches_reference(&synth, 1234);
    test_replay(&synth, "synthetic");
    test_snapshot(&synth, NULL);
    test_ignore_eos(&synth);
    test_logit_bias(&synth);
    lm_close(&synth);

    const char *src = getenv("MUSER_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/glimmer-tiny-q4_k_xl.gguf", src ? src : ".");
    lm g;
    if (!lm_open(&g, path, "And it came to pass, when the king")) return 1;
    test_dist_matches_reference(&g, 42);
    test_replay(&g, "glimmer-tiny");
    test_snapshot(&g, NULL);
    test_snapshot(&g, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":40},"
                      "\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}");
    test_ignore_eos(&g);
    test_logit_bias(&g);
    test_refusals(&g);
    test_token_terminal(&g);
    test_logprobs(&g);
    test_shared_vocab(&g);
    lm_close(&g);
    fx_cleanup();
    TEST_MAIN_END();
}
