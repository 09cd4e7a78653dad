/* Sampler tests. Expected values are either worked out by hand (noted) or
 * were produced once by an out-of-tree oracle: a C++ program compiled with
 * g++ 12 / libstdc++ that (a) drew from std::mt19937 and
 * std::uniform_real_distribution / generate_canonical, and (b) linked the
 * pinned libllama.so (/work/llama-build) and ran llama_sampler_init_* chains
 * built exactly like common_sampler_init, over rows made with this file's
 * generator. Those constants are pasted here; nothing below needs C++. */
#include "sample/sample.h"
#include "testutil.h"
#include <math.h>

#define CHECK_NEAR(a, b, tol) CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g", \
                                        (double)(a), (double)(b))

/* Candidates 0..n-1 with the given logits, unsorted. */
static mu_candidates make(mu_token_data *buf, const float *logit, size_t n) {
    for (size_t i = 0; i < n; i++) buf[i] = (mu_token_data){(int32_t)i, logit[i], 0.0f};
    return (mu_candidates){buf, n, -1, false};
}

/* Same, logits = logf(p). */
static mu_candidates make_p(mu_token_data *buf, const float *p, size_t n) {
    for (size_t i = 0; i < n; i++) buf[i] = (mu_token_data){(int32_t)i, logf(p[i]), 0.0f};
    return (mu_candidates){buf, n, -1, false};
}

static void check_ids(const mu_candidates *c, const int32_t *ids, size_t n, int line) {
    if (c->size != n) {
        fprintf(stderr, "line %d: size %zu, expected %zu\n", line, c->size, n);
        tu_failures++;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (c->data[i].id != ids[i]) {
            fprintf(stderr, "line %d: position %zu holds id %d, expected %d\n", line, i,
                    c->data[i].id, ids[i]);
            tu_failures++;
            return;
        }
    }
}
#define CHECK_IDS(c, ...) do { const int32_t _ids[] = {__VA_ARGS__}; \
    check_ids((c), _ids, sizeof _ids / sizeof *_ids, __LINE__); } while (0)

/* ------------------------------------------------------------------ RNG */

static void test_mt19937(void) {
    mu_mt19937 r;
    mu_mt_seed(&r, 5489); /* std::mt19937's default seed */
    uint32_t x = 0;
    for (int i = 0; i < 10000; i++) x = mu_mt_next(&r);
    CHECK_EQ_INT(x, 4123659995u); /* the C++ standard's required 10000th value */

    const uint32_t seed42[] = {1608637542u, 3421126067u, 4083286876u, 787846414u, 3143890026u};
    mu_mt_seed(&r, 42);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(mu_mt_next(&r), seed42[i]);

    /* libstdc++ uniform_real_distribution<double>(0,1), seed 5489 (oracle). */
    const uint64_t f64[] = {0x3fc1574f7b6848deull, 0x3feab863ef3cfc3full, 0x3fef00f6fbe41047ull,
                            0x3fcc4ad7f0f4e980ull};
    mu_mt_seed(&r, 5489);
    for (int i = 0; i < 4; i++) {
        double d = mu_mt_canonical_f64(&r);
        uint64_t b;
        memcpy(&b, &d, 8);
        CHECK_MSG(b == f64[i], "f64 draw %d: %016llx", i, (unsigned long long)b);
    }
    /* uniform_real_distribution<float>(0,1), seed 5489 (oracle). */
    const uint32_t f32[] = {0x3f5091bbu, 0x3e0aba7cu, 0x3f67e1fbu, 0x3f55c31fu};
    mu_mt_seed(&r, 5489);
    for (int i = 0; i < 4; i++) CHECK_BITS_F32(mu_mt_canonical_f32(&r), mu_bits_f32(f32[i]));
}

static void test_canonical_conversions(void) {
    /* Hand-derivable: first draw is the low word. */
    CHECK(mu_canonical_f64(0, 0) == 0.0);
    CHECK(mu_canonical_f64(1, 0) == ldexp(1.0, -64));
    CHECK(mu_canonical_f64(0, 1) == ldexp(1.0, -32));
    CHECK(mu_canonical_f64(0, 0x80000000u) == 0.5);
    /* 2^64 - 1 rounds to 2^64 in double: clamped to the double below 1. */
    CHECK(mu_canonical_f64(0xFFFFFFFFu, 0xFFFFFFFFu) == nextafter(1.0, 0.0));
    CHECK(mu_canonical_f64(0xFFFFFBFFu, 0xFFFFFFFFu) == nextafter(1.0, 0.0));
    /* libstdc++ generate_canonical<double,53> on engine outputs (oracle). */
    double d = mu_canonical_f64(0x12345678u, 0x9abcdef0u);
    uint64_t b;
    memcpy(&b, &d, 8);
    CHECK_MSG(b == 0x3fe3579bde02468bull, "%016llx", (unsigned long long)b);
    CHECK(mu_canonical_f32(0) == 0.0f);
    CHECK(mu_canonical_f32(0x80000000u) == 0.5f);
    CHECK(mu_canonical_f32(1) == ldexpf(1.0f, -32));
    /* (float)u rounds up to 2^32 from 0xFFFFFF80 on: clamp. */
    CHECK_BITS_F32(mu_canonical_f32(0xFFFFFF80u), mu_bits_f32(0x3f7fffffu));
    CHECK_BITS_F32(mu_canonical_f32(0xFFFFFFFFu), mu_bits_f32(0x3f7fffffu));
    CHECK_BITS_F32(mu_canonical_f32(0xFFFFFF7Fu), mu_bits_f32(0x3f7fffffu));
    CHECK_BITS_F32(mu_canonical_f32(12345678u), mu_bits_f32(0x3b3c614eu));
    CHECK_EQ_INT(mu_seed_resolve(7), 7);
    (void)mu_seed_resolve(MU_SEED_RANDOM);
}

/* ------------------------------------------------------------- ordering */

/* 40 logits in {0,1,2,3}: heavy ties. */
static void tie_row(float *l) {
    uint64_t st = 99;
    for (int i = 0; i < 40; i++) l[i] = (float)(int)((tu_rng_uniform(&st) + 1.0f) * 2.0f);
}

static void test_libstdcxx_tie_order(void) {
    float l[40];
    tie_row(l);
    const float expect_l[40] = {0, 0, 0, 1, 3, 3, 1, 1, 0, 1, 3, 3, 0, 1, 3, 1, 1, 1, 1, 3,
                                0, 3, 3, 3, 2, 1, 3, 2, 1, 3, 0, 1, 2, 3, 1, 2, 2, 2, 0, 2};
    CHECK(memcmp(l, expect_l, sizeof l) == 0);
    mu_token_data buf[40];
    /* std::sort(greater-by-logit) permutation from libstdc++ (oracle). */
    mu_candidates c = make(buf, l, 40);
    mu_cand_std_sort(c.data, 40);
    CHECK_IDS(&c, 33, 19, 14, 21, 22, 11, 10, 23, 26, 5, 4, 29, 24, 27, 32, 35, 39, 36, 37, 18,
              31, 34, 3, 28, 6, 7, 25, 9, 13, 15, 16, 17, 38, 20, 30, 0, 12, 8, 2, 1);
    /* std::partial_sort(first, first+10, last) (oracle); top_k 10 must
     * leave the same ten in the same order. */
    c = make(buf, l, 40);
    mu_sample_work w = {0};
    mu_sample_top_k(&c, 10, &w);
    CHECK(c.sorted);
    CHECK_IDS(&c, 11, 4, 19, 21, 5, 22, 23, 26, 14, 10);
    mu_sample_work_free(&w);
}

/* --------------------------------------------------------- the samplers */

static void test_top_k(void) {
    mu_token_data buf[8];
    mu_sample_work w = {0};
    const float l[] = {1.0f, 3.0f, 2.0f, 0.5f};
    mu_candidates c = make(buf, l, 4);
    mu_sample_top_k(&c, 2, &w); /* by hand */
    CHECK(c.sorted);
    CHECK_IDS(&c, 1, 2);
    c = make(buf, l, 4);
    mu_sample_top_k(&c, 0, &w); /* off: untouched, still unsorted */
    CHECK(!c.sorted);
    CHECK_IDS(&c, 0, 1, 2, 3);
    c = make(buf, l, 4);
    mu_sample_top_k(&c, 10, &w); /* k > size: full sort */
    CHECK_IDS(&c, 1, 2, 0, 3);
    /* Ties: p {.2,.3,.2,.3,.2}, k = 3 -> libstdc++ heap order (oracle). */
    const float p[] = {0.2f, 0.3f, 0.2f, 0.3f, 0.2f};
    c = make_p(buf, p, 5);
    mu_sample_top_k(&c, 3, &w);
    CHECK_IDS(&c, 3, 1, 0);
    mu_sample_work_free(&w);
}

static void test_top_p(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    const float p[] = {0.1f, 0.2f, 0.3f, 0.4f};
    mu_candidates c = make_p(buf, p, 4);
    mu_sample_top_p(&c, 0.65f, 0, &w); /* .4 < .65 <= .7: keep two (hand) */
    CHECK(c.sorted);
    CHECK_IDS(&c, 3, 2);
    CHECK_NEAR(c.data[0].p, 0.4, 1e-6);
    c = make_p(buf, p, 4);
    mu_sample_top_p(&c, 0.65f, 3, &w); /* min_keep 3 */
    CHECK_IDS(&c, 3, 2, 1);
    c = make_p(buf, p, 4);
    mu_sample_top_p(&c, 0.95f, 0, &w); /* .9 < .95: all four */
    CHECK_IDS(&c, 3, 2, 1, 0);
    c = make_p(buf, p, 4);
    mu_sample_top_p(&c, 1.0f, 0, &w); /* off */
    CHECK(!c.sorted);
    CHECK_IDS(&c, 0, 1, 2, 3);

    /* > 1024 unsorted candidates: the bucketed top-256 path. e^10 and e^9
     * against 1998 ones: p = .686 and .252, cumulative .938 >= .9. */
    enum { N = 2000 };
    static mu_token_data big[N];
    static float lb[N];
    for (int i = 0; i < N; i++) lb[i] = 0.0f;
    lb[1500] = 10.0f;
    lb[7] = 9.0f;
    c = make(big, lb, N);
    mu_sample_top_p(&c, 0.9f, 0, &w);
    CHECK(c.sorted);
    CHECK_IDS(&c, 1500, 7);
    CHECK_NEAR(c.data[0].p, expf(10) / (expf(10) + expf(9) + 1998), 1e-5);
    mu_sample_work_free(&w);
}

static void test_min_p(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    const float p[] = {0.5f, 0.1f, 0.3f, 0.2f};
    /* Cut at log(.5 * .3) = log(.15): keeps .5, .3, .2 in place order. */
    mu_candidates c = make_p(buf, p, 4);
    mu_sample_min_p(&c, 0.3f, 0, &w);
    CHECK(!c.sorted);
    CHECK_IDS(&c, 0, 2, 3);
    /* min_keep 4 defeats the filter: sorted path keeps everything. */
    c = make_p(buf, p, 4);
    mu_sample_min_p(&c, 0.3f, 4, &w);
    CHECK(c.sorted);
    CHECK_IDS(&c, 0, 2, 3, 1);
    c = make_p(buf, p, 4);
    mu_sample_min_p(&c, 0.0f, 0, &w);
    CHECK_IDS(&c, 0, 1, 2, 3);
    /* Sorted input takes the sorted path: the first token always stays. */
    c = make_p(buf, p, 4);
    mu_sample_top_k(&c, 4, &w);
    mu_sample_min_p(&c, 0.9f, 0, &w);
    CHECK_IDS(&c, 0);
    mu_sample_work_free(&w);
}

static void test_typical(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    /* H = 0.1677 nats; |-ln .97 - H| = .137 < |-ln .01 - H| = 4.44, and .97
     * alone exceeds .5 (hand). */
    const float p1[] = {0.97f, 0.01f, 0.01f, 0.01f};
    mu_candidates c = make_p(buf, p1, 4);
    mu_sample_typical(&c, 0.5f, 0, &w);
    CHECK(!c.sorted);
    CHECK_IDS(&c, 0);
    /* H = 1.332: the .2 tokens (shift .277) rank before .4 (shift .416);
     * three of them pass .5. Their order is libstdc++'s (oracle). */
    const float p2[] = {0.4f, 0.2f, 0.2f, 0.2f};
    c = make_p(buf, p2, 4);
    mu_sample_typical(&c, 0.5f, 0, &w);
    CHECK_IDS(&c, 1, 3, 2);
    c = make_p(buf, p2, 4);
    mu_sample_typical(&c, 0.5f, 4, &w); /* min_keep 4 */
    CHECK_EQ_INT(c.size, 4);
    mu_sample_work_free(&w);
}

static void test_top_n_sigma(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    /* mean 4, sd sqrt(12.5) = 3.54: only 10 > 10 - 3.54 survives (hand);
     * the masked ones stay as -inf, order after the sort from oracle. */
    const float l[] = {1, 2, 3, 10};
    mu_candidates c = make(buf, l, 4);
    mu_sample_top_n_sigma(&c, 1.0f, &w);
    CHECK(c.sorted);
    CHECK_IDS(&c, 3, 1, 0, 2);
    CHECK(c.data[0].p == 1.0f && c.data[1].logit == -INFINITY && c.data[3].p == 0.0f);
    c = make(buf, l, 4);
    mu_sample_top_n_sigma(&c, 3.0f, &w); /* 10 - 10.6 < 1: nothing masked */
    CHECK(c.data[3].logit == 1.0f);
    /* -inf entries are left out of mean and sd: {1, 3} -> mean 2, sd 1. */
    const float l2[] = {-INFINITY, 1, 3};
    c = make(buf, l2, 3);
    mu_sample_top_n_sigma(&c, 1.0f, &w);
    CHECK(c.data[0].id == 2 && c.data[1].logit == -INFINITY);
    mu_sample_work_free(&w);
}

static void test_temperature(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    const float l[] = {1, 3, 3, 2};
    mu_candidates c = make(buf, l, 4);
    mu_sample_temp(&c, 0.0f); /* greedy: first maximum wins, size kept */
    CHECK_EQ_INT(c.size, 4);
    CHECK(c.data[1].logit == 3 && c.data[0].logit == -INFINITY && c.data[2].logit == -INFINITY &&
          c.data[3].logit == -INFINITY);
    c = make(buf, l, 4);
    mu_sample_temp(&c, 0.5f);
    CHECK(c.data[0].logit == 2.0f && c.data[3].logit == 4.0f);
    /* Dynamic temperature on a flat row: normalised entropy 1 -> the top
     * of the range, 1 + .5 (hand); order from the sort (oracle). */
    const float p[] = {0.25f, 0.25f, 0.25f, 0.25f};
    c = make_p(buf, p, 4);
    mu_sample_temp_ext(&c, 1.0f, 0.5f, 1.0f, &w);
    CHECK_IDS(&c, 1, 3, 0, 2);
    CHECK_BITS_F32(c.data[0].logit, logf(0.25f) / 1.5f);
    c = make(buf, l, 1);
    mu_sample_temp_ext(&c, 1.0f, 0.5f, 1.0f, &w); /* one candidate: untouched */
    CHECK(c.data[0].logit == 1.0f);
    mu_sample_work_free(&w);
}

static void test_xtc(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    mu_mt19937 r, ref;
    const float p[] = {0.4f, 0.3f, 0.2f, 0.1f};
    /* .4 and .3 clear .25: all but the last of them (.3) are cut (hand). */
    mu_candidates c = make_p(buf, p, 4);
    mu_mt_seed(&r, 1);
    mu_sample_xtc(&c, 1.0f, 0.25f, 0, &r, &w);
    CHECK(c.data == buf + 1);
    CHECK_IDS(&c, 1, 2, 3);
    mu_mt_seed(&ref, 1);
    (void)mu_mt_next(&ref);
    CHECK(mu_mt_next(&r) == mu_mt_next(&ref)); /* exactly one draw */
    c = make_p(buf, p, 4);
    mu_sample_xtc(&c, 1.0f, 0.25f, 4, &r, &w); /* min_keep 4: 3 left < 4 */
    CHECK(c.data == buf && c.size == 4);
    /* Seed 5489's first float draw is .8147 > .5: no cut, draw spent. */
    c = make_p(buf, p, 4);
    mu_mt_seed(&r, 5489);
    mu_sample_xtc(&c, 0.5f, 0.25f, 0, &r, &w);
    CHECK(c.data == buf && !c.sorted);
    mu_mt_seed(&ref, 5489);
    (void)mu_mt_next(&ref);
    CHECK(mu_mt_next(&r) == mu_mt_next(&ref));
    /* Disabled (threshold > .5) or one candidate: no draw at all. */
    mu_mt_seed(&r, 3);
    mu_mt_seed(&ref, 3);
    c = make_p(buf, p, 4);
    mu_sample_xtc(&c, 1.0f, 0.6f, 0, &r, &w);
    c = make_p(buf, p, 1);
    mu_sample_xtc(&c, 1.0f, 0.1f, 0, &r, &w);
    CHECK(mu_mt_next(&r) == mu_mt_next(&ref));
    mu_sample_work_free(&w);
}

static void test_dist_and_discrete(void) {
    mu_token_data buf[4];
    mu_mt19937 r, ref;
    /* Seed 5489 f64 draws: .1355, .8350, .9689, .2210. Cumulative p
     * .1/.3/1.0 -> indices 1, 2, 2, 1 (hand). */
    const float p[] = {0.1f, 0.2f, 0.7f};
    const int64_t want[] = {1, 2, 2, 1};
    mu_mt_seed(&r, 5489);
    for (int i = 0; i < 4; i++) {
        mu_candidates c = make_p(buf, p, 3);
        mu_sample_dist(&c, &r);
        CHECK_EQ_INT(c.selected, want[i]);
        CHECK_NEAR(c.data[0].p + c.data[1].p + c.data[2].p, 1.0, 1e-6);
    }
    /* One candidate: selected 0, p = 1, and (pinned revision) no draw. */
    mu_mt_seed(&r, 9);
    mu_mt_seed(&ref, 9);
    mu_candidates c = make_p(buf, p, 1);
    mu_sample_dist(&c, &r);
    CHECK(c.selected == 0 && c.data[0].p == 1.0f && mu_mt_next(&r) == mu_mt_next(&ref));
    c = make_p(buf, p, 0);
    mu_sample_dist(&c, &r);
    CHECK_EQ_INT(c.selected, -1);
    /* std::discrete_distribution: cumulative .25/.5/1 -> 0 then 2 (hand). */
    const float q[] = {0.25f, 0.25f, 0.5f};
    for (int i = 0; i < 3; i++) buf[i] = (mu_token_data){i, 0.0f, q[i]};
    c = (mu_candidates){buf, 3, -1, true};
    mu_mt_seed(&r, 5489);
    CHECK_EQ_INT(mu_sample_discrete(&c, &r), 0);
    CHECK_EQ_INT(mu_sample_discrete(&c, &r), 2);
    /* Fewer than two weights: libstdc++ returns 0 without drawing. */
    mu_mt_seed(&r, 9);
    mu_mt_seed(&ref, 9);
    c.size = 1;
    CHECK_EQ_INT(mu_sample_discrete(&c, &r), 0);
    CHECK(mu_mt_next(&r) == mu_mt_next(&ref));
}

static void test_mirostat_v2_step(void) {
    mu_token_data buf[4];
    mu_sample_work w = {0};
    mu_mt19937 r;
    /* tau 1 -> mu 2; surprises 1,2,3,3 bits: keep two, renormalise to
     * 2/3 and 1/3; draw .1355 -> id 0; mu = 2 - .1 (log2 1.5 - 1) (hand). */
    const float p[] = {0.5f, 0.25f, 0.125f, 0.125f};
    mu_candidates c = make_p(buf, p, 4);
    float mu = 2.0f;
    mu_mt_seed(&r, 5489);
    mu_sample_mirostat_v2(&c, 1.0f, 0.1f, &mu, &r, &w);
    CHECK_IDS(&c, 0, 1);
    CHECK_EQ_INT(c.selected, 0);
    CHECK_NEAR(c.data[0].p, 2.0 / 3.0, 1e-6);
    CHECK_NEAR(mu, 2.0 - 0.1 * (log2(1.5) - 1.0), 1e-5);
    mu_sample_work_free(&w);
}

static void test_penalties(void) {
    mu_token_data buf[4];
    const float l[] = {4, 4, -1, 3};
    /* History 1,1,2; repeat 2, freq .5, presence 1 (hand):
     * id 1: 4/2 - (2*.5 + 1) = 0; id 2: -1*2 - (.5 + 1) = -3.5. */
    mu_penalties *pen = mu_penalties_new(64, 2.0f, 0.5f, 1.0f, 4);
    mu_penalties_accept(pen, 1);
    mu_penalties_accept(pen, 1);
    mu_penalties_accept(pen, 2);
    mu_candidates c = make(buf, l, 4);
    c.sorted = true;
    mu_penalties_apply(pen, &c);
    CHECK(!c.sorted);
    CHECK(c.data[0].logit == 4.0f && c.data[1].logit == 0.0f && c.data[2].logit == -3.5f &&
          c.data[3].logit == 3.0f);
    mu_penalties_free(pen);
    /* Window 2 keeps only the last 1 and the 2: id 1 = 2 - 1.5 = .5. */
    pen = mu_penalties_new(2, 2.0f, 0.5f, 1.0f, 4);
    mu_penalties_accept(pen, 1);
    mu_penalties_accept(pen, 1);
    mu_penalties_accept(pen, 2);
    int32_t hist[2];
    CHECK_EQ_INT(mu_penalties_history(pen, hist), 2);
    CHECK(hist[0] == 1 && hist[1] == 2);
    c = make(buf, l, 4);
    mu_penalties_apply(pen, &c);
    CHECK(c.data[1].logit == 0.5f && c.data[2].logit == -3.5f);
    mu_penalties_reset(pen);
    c = make(buf, l, 4);
    mu_penalties_apply(pen, &c);
    CHECK(c.data[1].logit == 4.0f);
    mu_penalties_free(pen);
}

/* Fake tokenizer for DRY tails: text equal to one piece -> that token.
 * ctx is the NULL-terminated piece list. */
static int32_t fake_tokenize(void *ctx, const char *text, size_t len, int32_t *out, int32_t cap) {
    const char *const *pieces = ctx;
    for (int32_t id = 0; pieces[id]; id++) {
        if (strlen(pieces[id]) == len && !memcmp(pieces[id], text, len) && cap >= 1) {
            out[0] = id;
            return 1;
        }
    }
    return -1;
}

static void test_dry(void) {
    mu_token_data buf[16];
    mu_error err;
    /* No breakers; history 0 1 2 0 1: the trailing "0 1" was followed by 2,
     * so 2 extends a repeat of length 2 = allowed: penalty mult * base^0. */
    mu_dry_config cfg = {1.0f, 1.1f, 2, 5, 4096};
    mu_dry *d = mu_dry_new_tokens(&cfg, 4, NULL, NULL, 0, &err);
    const int32_t h1[] = {0, 1, 2, 0, 1};
    for (int i = 0; i < 5; i++) mu_dry_accept(d, h1[i]);
    const float zero[4] = {0};
    mu_candidates c = make(buf, zero, 4);
    mu_dry_apply(d, &c);
    CHECK(c.data[0].logit == 0 && c.data[1].logit == 0 && c.data[2].logit == -1.0f &&
          c.data[3].logit == 0);
    mu_dry_free(d);

    /* Breakers {0} and {1,2}; history with a restart "1 2" (llama oracle:
     * DRY then top_k 10 then dist seed 19). */
    const int32_t b0[] = {0}, b1[] = {1, 2};
    const int32_t *seq[] = {b0, b1};
    const size_t seq_len[] = {1, 2};
    mu_dry_config cfg2 = {2.0f, 1.75f, 2, 64, 4096};
    d = mu_dry_new_tokens(&cfg2, 16, seq, seq_len, 2, &err);
    const int32_t h2[] = {3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5, 1, 2, 3, 4, 5};
    for (int i = 0; i < 16; i++) mu_dry_accept(d, h2[i]);
    float row[16] = {0};
    row[6] = 2.0f;
    row[7] = 1.9f;
    row[0] = 1.0f;
    row[3] = 1.5f;
    c = make(buf, row, 16);
    mu_dry_apply(d, &c);
    mu_sample_work w = {0};
    mu_sample_top_k(&c, 10, &w);
    CHECK_IDS(&c, 7, 3, 0, 8, 4, 9, 5, 11, 10, 2);
    mu_mt19937 r;
    mu_mt_seed(&r, 19);
    mu_sample_dist(&c, &r);
    CHECK_EQ_INT(c.data[c.selected].id, 3);
    mu_dry_free(d);

    /* The same breakers from token texts: "A" is inside token 0; "BC"
     * starts at the end of token 1 ("B") and its rest "C" tokenizes to [2]. */
    const char *pieces[17] = {"A", "B", "C"};
    char names[16][8];
    for (int i = 3; i < 16; i++) {
        snprintf(names[i], sizeof names[i], "x%d", i);
        pieces[i] = names[i];
    }
    const char *brk[] = {"A", "BC", ""}; /* empty breakers are skipped */
    d = mu_dry_new(&cfg2, 16, pieces, NULL, brk, 3, NULL, NULL, &err);
    CHECK_MSG(d == NULL && strstr(err.msg, "\"BC\"") && strstr(err.msg, "token 1"), "%s", err.msg);
    d = mu_dry_new(&cfg2, 16, pieces, NULL, brk, 3, fake_tokenize, (void *)pieces, &err);
    CHECK_MSG(d != NULL, "%s", err.msg);
    for (int i = 0; i < 16; i++) mu_dry_accept(d, h2[i]);
    c = make(buf, row, 16);
    mu_dry_apply(d, &c);
    mu_sample_top_k(&c, 10, &w);
    CHECK_IDS(&c, 7, 3, 0, 8, 4, 9, 5, 11, 10, 2);
    mu_dry_free(d);

    /* A breaker starting inside one token and ending in the next: "abc" vs
     * "ab" (rest "c" -> [1]) and "xa" (rest "bc" -> [3]); "\n" is token 4.
     * History 1 3 4 2 3 1 3 4 2 3 1 3, allowed 1, base 2 (hand): the scan
     * stops at "2 3" (rep limit 2); "1 3" recurs followed by 4, a one-token
     * breaker, so 4 goes free; "3" recurs followed by 1 (length 1):
     * token 1 loses 1 * 2^0. */
    const char *p3[6] = {"ab", "c", "xa", "bc", "\n", NULL};
    const char *brk3[] = {"abc", "\n"};
    mu_dry_config cfg3 = {1.0f, 2.0f, 1, 32, 4096};
    mu_dry *from_text = mu_dry_new(&cfg3, 5, p3, NULL, brk3, 2, fake_tokenize, (void *)p3, &err);
    const int32_t s0[] = {0, 1}, s1[] = {2, 3}, s2[] = {4};
    const int32_t *seq3[] = {s0, s1, s2};
    const size_t len3[] = {2, 2, 1};
    mu_dry *from_tokens = mu_dry_new_tokens(&cfg3, 5, seq3, len3, 3, &err);
    CHECK(from_text && from_tokens);
    if (!from_text || !from_tokens) return;
    const int32_t h3[] = {1, 3, 4, 2, 3, 1, 3, 4, 2, 3, 1, 3};
    for (int i = 0; i < 12; i++) {
        mu_dry_accept(from_text, h3[i]);
        mu_dry_accept(from_tokens, h3[i]);
    }
    const float z5[5] = {0};
    mu_token_data b5[5];
    c = make(buf, z5, 5);
    mu_candidates c2 = make(b5, z5, 5);
    mu_dry_apply(from_text, &c);
    mu_dry_apply(from_tokens, &c2);
    const float want3[5] = {0, -1.0f, 0, 0, 0};
    for (int i = 0; i < 5; i++) {
        CHECK_BITS_F32(c.data[i].logit, want3[i]);
        CHECK_BITS_F32(c2.data[i].logit, want3[i]);
    }
    mu_dry_free(from_text);
    mu_dry_free(from_tokens);
    mu_sample_work_free(&w);
}

static void test_logit_bias(void) {
    mu_token_data buf[4];
    const float z[4] = {0};
    const mu_logit_bias b[] = {{1, 2.0f}, {3, -INFINITY}, {1, 1.0f}};
    mu_candidates c = make(buf, z, 4);
    mu_sample_logit_bias(&c, b, 3); /* slots in place: every entry applies */
    CHECK(c.data[1].logit == 3.0f && c.data[3].logit == -INFINITY && c.data[0].logit == 0);
    /* Moved slots: llama searches, and only the first matching entry per
     * candidate applies (id 1 gets +2, not +3). */
    for (int i = 0; i < 4; i++) buf[i] = (mu_token_data){3 - i, 0.0f, 0.0f};
    c = (mu_candidates){buf, 4, -1, false};
    mu_sample_logit_bias(&c, b, 3);
    CHECK(buf[2].id == 1 && buf[2].logit == 2.0f && buf[0].logit == -INFINITY);
}

static void test_argmax(void) {
    const float l[] = {1, 5, 5, 2};
    CHECK_EQ_INT(mu_sample_argmax(l, 4, NULL, 0), 1);
    const int32_t ban[] = {1};
    CHECK_EQ_INT(mu_sample_argmax(l, 4, ban, 1), 2);
    const float inf[] = {-INFINITY, -INFINITY};
    CHECK_EQ_INT(mu_sample_argmax(inf, 2, NULL, 0), -1);
    /* mu_sample_argmax_unique over rows of 1 to 300 values (the 64-value blocks, a partial last one):
     * the maximum at each end and inside, negative rows, a tie, +0 against -0, a NaN or an infinity */
    float r[300];
    uint64_t st = 5;
    for (int n = 1; n <= 300; n += n < 70 ? 1 : 23) {
        for (int where = 0; where < 3; where++) {
            for (int i = 0; i < n; i++) r[i] = -100.0f - (float)(tu_rng_next(&st) % 1000) / 8.0f;
            const int at = where == 0 ? 0 : where == 1 ? n - 1 : n / 2;
            r[at] = -3.5f;
            CHECK_MSG(mu_sample_argmax_unique(r, (size_t)n) == at, "argmax_unique n %d at %d", n, at);
            if (n > 1) {
                const int other = (at + 1 + (int)(tu_rng_next(&st) % (uint64_t)(n - 1))) % n;
                r[other] = -3.5f;
                CHECK_MSG(mu_sample_argmax_unique(r, (size_t)n) == -1, "argmax_unique tie n %d", n);
                r[other] = -4.0f;
                r[other] = NAN;
                CHECK_EQ_INT(mu_sample_argmax_unique(r, (size_t)n), -1);
                r[other] = -INFINITY;
                CHECK_EQ_INT(mu_sample_argmax_unique(r, (size_t)n), -1);
                r[other] = -4.0f;
                r[at] = 0.0f, r[other] = -0.0f;
                CHECK_EQ_INT(mu_sample_argmax_unique(r, (size_t)n), -1);
                r[other] = -4.0f;
                CHECK_EQ_INT(mu_sample_argmax_unique(r, (size_t)n), at);
            }
        }
    }
    /* mu_sample_scan against brute force on tie-heavy rows of 1 to 300 values drawn from a few
     * values (+0 and -0 among them), with -inf, +inf or NaN in some */
    const float pool[] = {-2.0f, -0.0f, 0.0f, 1.5f, 1.5f, -7.25f, 3.0f, -INFINITY};
    for (int n = 1; n <= 300; n += n < 70 ? 1 : 17)
        for (int v = 0; v < 4; v++) {
            for (int i = 0; i < n; i++) r[i] = pool[tu_rng_next(&st) % 8] - (v == 1 ? 10.0f : 0.0f);
            if (v == 2) r[tu_rng_next(&st) % (uint64_t)n] = INFINITY;
            if (v == 3) r[tu_rng_next(&st) % (uint64_t)n] = NAN;
            mu_row_scan sc;
            mu_sample_scan(r, (size_t)n, &sc);
            bool nan_pinf = false, ninf = false;
            for (int i = 0; i < n; i++) nan_pinf |= isnan(r[i]) || r[i] == INFINITY, ninf |= r[i] == -INFINITY;
            CHECK_MSG(sc.nan_or_posinf == nan_pinf && sc.neginf == ninf, "scan flags n %d v %d", n, v);
            if (v == 3) continue;
            int at = 0; /* the first largest in the order with -0 below +0 */
            for (int i = 1; i < n; i++)
                if (r[i] > r[at] || (r[i] == 0.0f && r[at] == 0.0f && !signbit(r[i]) && signbit(r[at]))) at = i;
            size_t same = 0;
            for (int i = 0; i < n; i++) same += !memcmp(&r[i], &r[at], sizeof r[i]);
            CHECK_MSG(sc.at == (size_t)at && sc.n_at == same, "scan n %d v %d: at %zu (%d), %zu (%zu) alike", n, v,
                      sc.at, at, sc.n_at, same);
        }
}

/* ------------------------------------------------------ order and print */

static void test_order_parsing(void) {
    mu_sampler_kind o[MU_SAMPLER_MAX_ORDER];
    size_t n;
    mu_error err;
    mu_sampler_params def;
    mu_sampler_params_default(&def);
    CHECK(mu_sampler_parse_names("penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature",
                                 o, &n, &err));
    CHECK(n == def.n_order && !memcmp(o, def.order, n * sizeof *o));
    CHECK(mu_sampler_parse_chars("edskypmxt", o, &n, &err));
    CHECK(n == def.n_order && !memcmp(o, def.order, n * sizeof *o));
    CHECK(mu_sampler_parse_names("Top-K;nucleus;TEMP;typ;minp;top-n-sigma;topp", o, &n, &err));
    const mu_sampler_kind want[] = {MU_SAMPLER_TOP_K, MU_SAMPLER_TOP_P, MU_SAMPLER_TEMPERATURE,
                                    MU_SAMPLER_TYPICAL_P, MU_SAMPLER_MIN_P, MU_SAMPLER_TOP_N_SIGMA,
                                    MU_SAMPLER_TOP_P};
    CHECK(n == 7 && !memcmp(o, want, sizeof want));
    CHECK(!mu_sampler_parse_names("top_k;bogus;min_p;zzz", o, &n, &err));
    CHECK_MSG(strstr(err.msg, "'bogus'") && strstr(err.msg, "'zzz'") && n == 0, "%s", err.msg);
    CHECK(!mu_sampler_parse_names("infill", o, &n, &err));
    CHECK_MSG(strstr(err.msg, "not implemented"), "%s", err.msg);
    CHECK(!mu_sampler_parse_names("top_k;;min_p", o, &n, &err));
    CHECK_MSG(strstr(err.msg, "''"), "%s", err.msg);
    CHECK(mu_sampler_parse_names("", o, &n, &err) && n == 0);
    CHECK(!mu_sampler_parse_chars("kqmZ", o, &n, &err));
    CHECK_MSG(strstr(err.msg, "'q' at 1") && strstr(err.msg, "'Z' at 3"), "%s", err.msg);

    char buf[256];
    mu_sampler_order_names(def.order, def.n_order, buf, sizeof buf);
    CHECK(!strcmp(buf, "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"));
    CHECK_EQ_INT(mu_sampler_order_chars(def.order, def.n_order, buf, sizeof buf), 9);
    CHECK(!strcmp(buf, "edskypmxt"));

    size_t need = mu_sampler_chain_print(&def, buf, sizeof buf);
    const char *chain = "logits -> ?penalties -> ?dry -> ?top-n-sigma -> top-k -> ?typical -> "
                        "top-p -> min-p -> ?xtc -> temp-ext -> dist ";
    CHECK_MSG(!strcmp(buf, chain), "%s", buf);
    CHECK_EQ_INT(need, strlen(chain));
    char tiny[8];
    CHECK_EQ_INT(mu_sampler_chain_print(&def, tiny, sizeof tiny), strlen(chain));
    CHECK(!strcmp(tiny, "logits "));
    mu_sampler_params m = def;
    const mu_logit_bias lb[] = {{3, 1.0f}};
    m.mirostat = 2;
    m.logit_bias = lb;
    m.n_logit_bias = 1;
    mu_sampler_chain_print(&m, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "logits -> logit-bias -> temp -> mirostat-v2 "), "%s", buf);
    char pbuf[1024];
    CHECK(mu_sampler_params_print(&def, pbuf, sizeof pbuf) < sizeof pbuf);
    const char *line1 = "\trepeat_last_n = 64, repeat_penalty = 1.000, frequency_penalty = 0.000, "
                        "presence_penalty = 0.000\n";
    CHECK_MSG(!strncmp(pbuf, line1, strlen(line1)), "%s", pbuf);
    CHECK(strstr(pbuf, "top_k = 40, top_p = 0.950, min_p = 0.050, xtc_probability = 0.000, "
                      "xtc_threshold = 0.100, typical_p = 1.000, top_n_sigma = -1.000, temp = 0.800"));
    CHECK(strstr(pbuf, "mirostat = 0, mirostat_lr = 0.100, mirostat_ent = 5.000"));
}

static void test_new_refusals(void) {
    mu_sampler_params p;
    mu_error err;
    mu_sampler_params_default(&p);
    p.mirostat = 3;
    CHECK(!mu_sampler_new(&p, 10, NULL, NULL, &err) && strstr(err.msg, "mirostat"));
    mu_sampler_params_default(&p);
    const mu_logit_bias lb[] = {{2, 1.0f}, {10, 1.0f}};
    p.logit_bias = lb;
    p.n_logit_bias = 2;
    CHECK(!mu_sampler_new(&p, 10, NULL, NULL, &err));
    CHECK_MSG(strstr(err.msg, "logit_bias[1]") && strstr(err.msg, "token 10"), "%s", err.msg);
    mu_sampler_params_default(&p);
    p.penalty_repeat = 1.1f;
    p.penalty_last_n = -1;
    CHECK(!mu_sampler_new(&p, 10, NULL, NULL, &err));
    CHECK_MSG(strstr(err.msg, "repeat_last_n") && strstr(err.msg, "n_ctx"), "%s", err.msg);
    p.n_ctx = 128; /* -1 = the context, as llama-server resolves it */
    mu_sampler *s = mu_sampler_new(&p, 10, NULL, NULL, &err);
    CHECK(s != NULL);
    mu_sampler_free(s);
    mu_sampler_params_default(&p);
    p.dry_multiplier = 0.8f;
    CHECK(!mu_sampler_new(&p, 10, NULL, NULL, &err));
    CHECK_MSG(strstr(err.msg, "dry_penalty_last_n"), "%s", err.msg);
    p.dry_penalty_last_n = 16;
    CHECK(!mu_sampler_new(&p, 10, NULL, NULL, &err)); /* breakers need pieces */
    CHECK_MSG(strstr(err.msg, "pieces"), "%s", err.msg);
    mu_sampler_params_default(&p);
    p.min_keep = -1;
    CHECK(!mu_sampler_new(&p, 10, NULL, NULL, &err) && strstr(err.msg, "min_keep"));
}

/* ------------------------------------------------- chains vs llama.cpp */

enum { V = 8192 };

static void fill_row(float *row, uint64_t *st, float scale, float q) {
    for (int i = 0; i < V; i++) {
        float y = tu_rng_normal(st) * scale;
        row[i] = q > 0 ? roundf(y * q) / q : y;
    }
}

typedef struct fake_grammar {
    int mod, rem;
    int n_accepts, n_applies;
} fake_grammar;

static bool fg_accepts(void *ctx, int32_t t) {
    fake_grammar *g = ctx;
    g->n_accepts++;
    return t % g->mod == g->rem;
}

static void fg_apply(void *ctx, mu_candidates *c) {
    fake_grammar *g = ctx;
    g->n_applies++;
    for (size_t i = 0; i < c->size; i++)
        if (c->data[i].id % g->mod != g->rem) c->data[i].logit = -INFINITY;
}

/* Runs `steps` sample+accept rounds over fresh rows and compares ids. */
static void run_chain(const char *name, const mu_sampler_params *p, uint64_t row_seed, float scale,
                      float q, const int32_t *want, int steps, const int32_t *banned,
                      size_t n_banned, fake_grammar *g) {
    mu_error err;
    mu_sampler *s = mu_sampler_new(p, V, NULL, NULL, &err);
    CHECK_MSG(s, "%s: %s", name, err.msg);
    if (!s) return;
    float *row = malloc(V * sizeof *row);
    mu_sample_constraint con = {g, fg_accepts, fg_apply};
    uint64_t st = row_seed;
    for (int t = 0; t < steps; t++) {
        fill_row(row, &st, scale, q);
        int32_t id = mu_sampler_sample(s, row, banned, n_banned, g ? &con : NULL, &err);
        if (id != want[t]) {
            fprintf(stderr, "%s: step %d chose %d, llama.cpp chose %d %s\n", name, t, id, want[t],
                    id < 0 ? err.msg : "");
            tu_failures++;
            break;
        }
        mu_sampler_accept(s, id);
    }
    free(row);
    mu_sampler_free(s);
}

static void test_chains_vs_llama(void) {
    mu_error err_ties;
    mu_sampler_params p;
    mu_sampler_params_default(&p);
    p.seed = 42;
    const int32_t w1[] = {7373, 7556, 5122, 5792, 1767, 3873, 5365, 5265,
                          4625, 7539, 5394, 1141, 7596, 7020, 1475, 2820};
    run_chain("defaults", &p, 1, 3, 0, w1, 16, NULL, 0, NULL);

    mu_sampler_params_default(&p);
    p.seed = 7;
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 0.9f;
    p.min_p = 0.0f;
    p.xtc_probability = 0.5f;
    p.penalty_last_n = 32;
    p.penalty_repeat = 1.1f;
    const int32_t w2[] = {528, 777, 7187, 918, 1066, 5156, 1578, 3662,
                          1276, 6087, 182, 2637, 4506, 6629, 6519, 5610};
    run_chain("top_p/xtc/penalties", &p, 2, 2, 0, w2, 16, NULL, 0, NULL);

    mu_sampler_params_default(&p);
    p.seed = 9;
    p.temp = 0.7f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.02f;
    p.typ_p = 0.9f;
    p.top_n_sigma = 2.0f;
    p.penalty_freq = 0.2f;
    p.penalty_present = 0.3f;
    p.dynatemp_range = 0.4f;
    p.dynatemp_exponent = 1.5f;
    p.min_keep = 3;
    const int32_t w3[] = {2297, 1830, 4369, 1398, 7087, 3912, 2939, 1498,
                          2677, 2474, 5199, 4683, 4837, 7939, 7664, 8172};
    run_chain("typical/sigma/dynatemp", &p, 3, 2, 4, w3, 16, NULL, 0, NULL);

    mu_sampler_params_default(&p);
    p.seed = 3;
    p.temp = 0.9f;
    p.mirostat = 1;
    const int32_t w4[] = {1917, 7492, 6854, 4615, 7937, 7584, 3875, 3428,
                          1751, 2625, 264, 611, 1501, 2821, 2631, 2260};
    run_chain("mirostat 1", &p, 4, 2, 0, w4, 16, NULL, 0, NULL);

    mu_sampler_params_default(&p);
    p.seed = 5;
    p.temp = 1.0f;
    p.mirostat = 2;
    p.mirostat_tau = 4.0f;
    p.mirostat_eta = 0.2f;
    const int32_t w5[] = {7207, 2864, 2772, 7527, 1166, 7327, 4520, 1733,
                          4823, 6974, 1479, 6479, 1631, 2697, 2954, 7048};
    run_chain("mirostat 2", &p, 5, 2, 0, w5, 16, NULL, 0, NULL);

    /* Grammar rejection resampling plus ignore-eos style bans (llama side:
     * a -INF logit bias for 5 and 7). */
    mu_sampler_params_default(&p);
    p.seed = 11;
    fake_grammar g = {3, 1, 0, 0};
    const int32_t banned[] = {5, 7};
    const int32_t w6[] = {223, 6166, 391, 6502, 1708, 6367, 592, 5458,
                          6598, 2971, 4159, 4387, 859, 1834, 6490, 421};
    run_chain("grammar+banned", &p, 6, 3, 0, w6, 16, banned, 2, &g);
    CHECK(g.n_applies > 0 && g.n_applies < g.n_accepts); /* some rerolls, not all */

    /* temp 0 on integer logits (heavy ties at the maximum): a deliberate
     * difference from llama.cpp, which keeps the first maximum in candidate
     * order; muser keeps the lowest token id (docs/sampling.md). With
     * top-k off every tied maximum survives, so the winner must be the row's
     * lowest-id maximum; with the default top-k 40 it must at least be a maximum. */
    for (int topk = 0; topk < 2; topk++) {
        mu_sampler_params_default(&p);
        p.seed = 13;
        p.temp = 0.0f;
        p.top_k = topk ? 40 : 0;
        mu_sampler *s = mu_sampler_new(&p, V, NULL, NULL, &err_ties);
        CHECK(s != NULL);
        float *row = malloc(V * sizeof *row);
        uint64_t st = 7;
        for (int t = 0; s && t < 8; t++) {
            fill_row(row, &st, 2, 1);
            int32_t lowest = 0;
            for (int32_t i = 1; i < V; i++)
                if (row[i] > row[lowest]) lowest = i;
            int32_t id = mu_sampler_sample(s, row, NULL, 0, NULL, &err_ties);
            CHECK_MSG(id >= 0 && row[id] == row[lowest], "greedy ties (top-k %d): %d (%g) is not a maximum (%d: %g)", p.top_k, id, id >= 0 ? row[id] : 0.0, lowest, row[lowest]);
            if (!topk) CHECK_MSG(id == lowest, "greedy ties: chose %d, lowest-id maximum is %d", id, lowest);
            mu_sampler_accept(s, id);
        }
        free(row);
        mu_sampler_free(s);
    }

    mu_sampler_params_default(&p);
    p.seed = 17;
    const int32_t w8[] = {2175, 4926, 3556, 5979, 588, 6378, 4228, 4006,
                          5433, 2173, 6771, 2734, 5352, 1089, 2728, 2157};
    run_chain("ties q=2", &p, 8, 1.5f, 2, w8, 16, NULL, 0, NULL);
}

static void test_banned_leaves_logits(void) {
    mu_sampler_params p;
    mu_sampler_params_default(&p);
    p.seed = 1;
    mu_error err;
    mu_sampler *s = mu_sampler_new(&p, V, NULL, NULL, &err);
    float *row = malloc(V * sizeof *row), *copy = malloc(V * sizeof *copy);
    uint64_t st = 77;
    fill_row(row, &st, 2, 0);
    row[9] = 50.0f; /* overwhelming */
    memcpy(copy, row, V * sizeof *row);
    const int32_t ban[] = {9};
    int32_t id = mu_sampler_sample(s, row, ban, 1, NULL, &err);
    CHECK(id >= 0 && id != 9);
    CHECK(memcmp(row, copy, V * sizeof *row) == 0);
    CHECK_EQ_INT(mu_sampler_sample(s, row, NULL, 0, NULL, &err), 9);
    const int32_t bad[] = {V};
    CHECK_EQ_INT(mu_sampler_sample(s, row, bad, 1, NULL, &err), -1);
    CHECK_MSG(strstr(err.msg, "banned[0]"), "%s", err.msg);
    mu_sampler_free(s);
    /* Everything banned: refused instead of emitting an arbitrary id. */
    s = mu_sampler_new(&p, 3, NULL, NULL, &err);
    const int32_t all[] = {0, 1, 2};
    CHECK_EQ_INT(mu_sampler_sample(s, row, all, 3, NULL, &err), -1);
    CHECK_MSG(strstr(err.msg, "masked"), "%s", err.msg);
    mu_sampler_free(s);
    free(row);
    free(copy);
}

static void test_constraint_calls(void) {
    mu_sampler_params p;
    mu_sampler_params_default(&p);
    p.seed = 2;
    p.temp = 0.0f;
    mu_error err;
    mu_sampler *s = mu_sampler_new(&p, 6, NULL, NULL, &err);
    const float row[6] = {0, 1, 5, 2, 4, 3};
    fake_grammar g = {2, 0, 0, 0}; /* even ids only */
    mu_sample_constraint con = {&g, fg_accepts, fg_apply};
    CHECK_EQ_INT(mu_sampler_sample(s, row, NULL, 0, &con, &err), 2); /* winner allowed */
    CHECK(g.n_accepts == 1 && g.n_applies == 0);
    g.rem = 1; /* odd ids: 2 rejected, mask then rerun -> 5 (id 5, logit 3) */
    CHECK_EQ_INT(mu_sampler_sample(s, row, NULL, 0, &con, &err), 5);
    CHECK(g.n_accepts == 2 && g.n_applies == 1);
    g.mod = 7;
    g.rem = 6; /* nothing allowed */
    CHECK_EQ_INT(mu_sampler_sample(s, row, NULL, 0, &con, &err), -1);
    CHECK_MSG(strstr(err.msg, "constraint"), "%s", err.msg);
    mu_sampler_free(s);
}

/* --------------------------------------------------- replay and snapshot */

static const char *const *test_pieces(void) {
    static char names[V][8];
    static const char *pieces[V];
    for (int i = 0; i < V; i++) {
        snprintf(names[i], sizeof names[i], i % 97 == 0 ? "\n%d" : "t%d", i);
        pieces[i] = names[i];
    }
    return pieces;
}

static void snapshot_params(mu_sampler_params *p, int mirostat) {
    mu_sampler_params_default(p);
    p->seed = 1234;
    p->mirostat = mirostat;
    p->penalty_repeat = 1.1f;
    p->penalty_last_n = 16;
    p->dry_multiplier = 0.8f;
    p->dry_penalty_last_n = 32;
    p->n_ctx_train = 4096;
    p->xtc_probability = 0.5f;
    p->top_k = 0;
    p->top_p = 0.98f;
    p->min_p = 0.0f;
}

/* Samples `n` tokens (accepting each), appending ids to out. Rows repeat
 * token patterns so penalties and DRY have something to do. */
static void draw(mu_sampler *s, uint64_t *st, int n, int32_t *out) {
    static float row[V];
    mu_error err;
    for (int t = 0; t < n; t++) {
        fill_row(row, st, 1.0f, 0);
        for (int i = 0; i < 8; i++) row[i * 11] += 4.0f;
        out[t] = mu_sampler_sample(s, row, NULL, 0, NULL, &err);
        mu_sampler_accept(s, out[t]);
    }
}

static void test_snapshot_and_reset(void) {
    const char *const *pieces = test_pieces();
    for (int mirostat = 0; mirostat <= 2; mirostat++) {
        mu_sampler_params p;
        snapshot_params(&p, mirostat);
        mu_error err;
        mu_sampler *a = mu_sampler_new(&p, V, pieces, NULL, &err);
        CHECK_MSG(a, "%s", err.msg);
        if (!a) return;
        uint64_t st = 5;
        int32_t first[20], cont_a[20], cont_b[20];
        draw(a, &st, 20, first);
        size_t n = mu_sampler_state_size(a);
        uint8_t *snap = malloc(n);
        CHECK(!mu_sampler_state_save(a, snap, n - 1));
        CHECK(mu_sampler_state_save(a, snap, n));
        uint64_t st_b = st;
        draw(a, &st, 20, cont_a);

        mu_sampler *b = mu_sampler_new(&p, V, pieces, NULL, &err);
        CHECK(mu_sampler_state_load(b, snap, n, &err));
        draw(b, &st_b, 20, cont_b);
        CHECK_MSG(!memcmp(cont_a, cont_b, sizeof cont_a), "mirostat %d: restored sampler diverged",
                  mirostat);

        /* Corrupt or foreign snapshots are refused, leaving b intact. */
        CHECK(!mu_sampler_state_load(b, snap, n - 3, &err));
        uint8_t *bad = malloc(n);
        memcpy(bad, snap, n);
        memset(bad + 24 + 4 * 624, 0xFF, 4); /* final stream index > 624 */
        CHECK(!mu_sampler_state_load(b, bad, n, &err));
        CHECK_MSG(strstr(err.msg, "index"), "%s", err.msg);
        free(bad);
        mu_sampler_params other = p;
        other.top_p = 0.5f;
        mu_sampler *c = mu_sampler_new(&other, V, pieces, NULL, &err);
        CHECK(!mu_sampler_state_load(c, snap, n, &err));
        CHECK_MSG(strstr(err.msg, "different sampler configuration"), "%s", err.msg);
        mu_sampler_free(c);

        /* reset = a fresh sampler: same seed, empty history, mu = 2 tau. */
        mu_sampler_reset(a);
        mu_sampler *fresh = mu_sampler_new(&p, V, pieces, NULL, &err);
        uint64_t s1 = 9, s2 = 9;
        int32_t x[12], y[12];
        draw(a, &s1, 12, x);
        draw(fresh, &s2, 12, y);
        CHECK(!memcmp(x, y, sizeof x));
        CHECK_EQ_INT(mu_sampler_seed(a), 1234);
        mu_sampler_free(fresh);
        free(snap);
        mu_sampler_free(a);
        mu_sampler_free(b);
    }
}

static void test_replay_8192(void) {
    /* Same seed, same rows: identical sequences; another seed differs. */
    mu_sampler_params p;
    mu_sampler_params_default(&p);
    p.top_k = 0;
    p.top_p = 0.99f;
    p.temp = 1.2f;
    int32_t r[3][32];
    for (int k = 0; k < 3; k++) {
        p.seed = k < 2 ? 99 : 100;
        mu_error err;
        mu_sampler *s = mu_sampler_new(&p, V, NULL, NULL, &err);
        uint64_t st = 31;
        draw(s, &st, 32, r[k]);
        mu_sampler_free(s);
    }
    CHECK(!memcmp(r[0], r[1], sizeof r[0]));
    CHECK(memcmp(r[0], r[2], sizeof r[0]) != 0);
}

/* ------------------------------------------------------------- logprobs */

static void test_logprobs(void) {
    mu_error err;
    /* p = 1/6, 2/6, 2/6, 1/6 (hand). */
    const float l[] = {0.0f, logf(2.0f), logf(2.0f), 0.0f};
    mu_token_logprob chosen, top[4];
    CHECK(mu_logprobs(l, 4, 3, &chosen, 3, top, &err));
    CHECK(chosen.id == 3);
    CHECK_NEAR(chosen.logprob, log(1.0 / 6.0), 1e-6);
    CHECK(top[0].id == 1 && top[1].id == 2 && top[2].id == 0); /* ties: lower id first */
    CHECK_NEAR(top[0].logprob, log(2.0 / 6.0), 1e-6);
    CHECK_NEAR(top[2].logprob, log(1.0 / 6.0), 1e-6);
    CHECK(!mu_logprobs(l, 4, 3, &chosen, 5, top, &err));
    CHECK(!mu_logprobs(l, 4, 4, &chosen, 0, NULL, &err));
    const float nan_row[] = {0.0f, NAN};
    CHECK(!mu_logprobs(nan_row, 2, 0, &chosen, 0, NULL, &err) && strstr(err.msg, "NaN"));
    const float dead[] = {-INFINITY, -INFINITY};
    CHECK(!mu_logprobs(dead, 2, 0, &chosen, 0, NULL, &err));

    /* 50 of 1000 tie-heavy logits against a brute-force ranking; the full
     * distribution sums to 1. */
    enum { N = 1000, K = 50 };
    static float row[N];
    static mu_token_logprob all[N], best[K];
    uint64_t st = 4;
    for (int i = 0; i < N; i++) row[i] = roundf(tu_rng_normal(&st) * 4.0f) / 2.0f;
    row[17] = -INFINITY;
    CHECK(mu_logprobs(row, N, 17, &chosen, K, best, &err));
    CHECK(chosen.logprob == -INFINITY);
    bool used[N] = {false};
    for (int k = 0; k < K; k++) {
        int pick = -1;
        for (int i = 0; i < N; i++)
            if (!used[i] && (pick < 0 || row[i] > row[pick])) pick = i;
        used[pick] = true;
        CHECK_MSG(best[k].id == pick, "rank %d: %d vs %d", k, best[k].id, pick);
    }
    CHECK(mu_logprobs(row, N, 0, &chosen, N, all, &err));
    double sum = 0;
    for (int i = 0; i < N; i++) sum += exp((double)all[i].logprob);
    CHECK_NEAR(sum, 1.0, 1e-5);
    CHECK(all[N - 1].id == 17);

    /* Every n_top against the brute-force ranking on rows of heavy ties,
     * +0 beside -0 as the largest value, -inf and whole 64-value blocks
     * that tie the weakest kept token (skipped blocks must lose ties). */
    enum { M = 4099 };
    static float big[M];
    static mu_token_logprob got[64];
    const int tops[] = {1, 2, 5, 20, 64};
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < M; i++) big[i] = roundf(tu_rng_normal(&st) * 3.0f) / 2.0f - (v == 1 ? 20.0f : 0.0f);
        if (v == 1) big[700] = -0.0f, big[2100] = 0.0f, big[3000] = -0.0f; /* the largest: a tie of zeros */
        if (v == 2) for (int i = 0; i < M; i++) big[i] = i % 5 == 0 ? -INFINITY : (float)(i % 7 == 0) - 1.0f;
        for (int t = 0; t < 5; t++) {
            const int K2 = tops[t];
            CHECK(mu_logprobs(big, M, 5, &chosen, (size_t)K2, got, &err));
            bool used2[M];
            memset(used2, 0, sizeof used2);
            for (int k = 0; k < K2; k++) {
                int pick = -1;
                for (int i = 0; i < M; i++)
                    if (!used2[i] && (pick < 0 || big[i] > big[pick])) pick = i;
                used2[pick] = true;
                CHECK_MSG(got[k].id == pick, "variant %d n_top %d rank %d: %d vs %d", v, K2, k, got[k].id, pick);
            }
        }
    }
    CHECK(mu_logprobs(big, M, 5, &chosen, 1, got, &err) && got[0].id == 7);

    /* A full-vocabulary row against libm in double: the chosen and the top
     * logprobs within a few float ulps of log-probabilities near -10. */
    enum { NV = 202048 };
    float *wide = malloc(NV * sizeof *wide);
    for (int i = 0; i < NV; i++) wide[i] = 20.0f * tanhf(tu_rng_normal(&st) * 0.15f);
    wide[4242] = -INFINITY;
    float mx = -INFINITY;
    for (int i = 0; i < NV; i++) mx = wide[i] > mx ? wide[i] : mx;
    double z = 0.0;
    for (int i = 0; i < NV; i++) z += exp((double)wide[i] - (double)mx);
    const double log_z = (double)mx + log(z);
    CHECK(mu_logprobs(wide, NV, 99, &chosen, 5, got, &err));
    CHECK_NEAR(chosen.logprob, (double)wide[99] - log_z, 4e-6);
    for (int k = 0; k < 5; k++) CHECK_NEAR(got[k].logprob, (double)wide[got[k].id] - log_z, 4e-6);
    CHECK(got[0].logprob >= got[1].logprob && wide[got[0].id] == mx);
    CHECK(mu_logprobs(wide, NV, 4242, &chosen, 0, NULL, &err) && chosen.logprob == -INFINITY);
    wide[150000] = INFINITY;
    CHECK(!mu_logprobs(wide, NV, 0, &chosen, 1, got, &err) && strstr(err.msg, "token 150000 is +inf"));
    wide[150000] = 0.0f, wide[201999] = -NAN;
    CHECK(!mu_logprobs(wide, NV, 0, &chosen, 1, got, &err) && strstr(err.msg, "token 201999 is NaN"));
    free(wide);
}

/* ----------------------------------------------------------- full vocab */

static void test_full_vocab_speed(void) {
    enum { NV = 202048 };
    float *row = malloc(NV * sizeof *row);
    uint64_t st = 3;
    for (int i = 0; i < NV; i++) row[i] = 20.0f * tanhf(tu_rng_normal(&st) * 0.15f);
    mu_sampler_params p;
    mu_sampler_params_default(&p);
    p.seed = 8;
    mu_error err;
    mu_sampler *s = mu_sampler_new(&p, NV, NULL, NULL, &err);
    (void)mu_sampler_sample(s, row, NULL, 0, NULL, &err); /* first touch of buffers */
    double t0 = mu_now();
    for (int i = 0; i < 10; i++) {
        int32_t id = mu_sampler_sample(s, row, NULL, 0, NULL, &err);
        CHECK(id >= 0 && id < NV);
    }
    double ms = (mu_now() - t0) * 100.0;
    printf("default chain over %d candidates: %.3f ms/token\n", NV, ms);
    CHECK_MSG(ms < 50.0, "%.3f ms per token", ms); /* ~0.3 ms in Release */
    mu_sampler_free(s);
    free(row);
}

/* The greedy fast path (mu_sample_fast_greedy) against the full chain:
 * two samplers with the same seed see the same rows (continuous, integer
 * with ties at the maximum, 100 tied maxima, a banned maximum, a -inf entry), with and
 * without a constraint; the ids, the constraint's calls and the snapshots
 * must be equal. A chain that is not greedy (penalties on) must not change
 * either. The fast path must have been taken: it leaves the candidate array
 * as it was (empty on a fresh sampler). */
static void test_fast_greedy(void) {
    for (int cfg = 0; cfg < 6; cfg++) {
        mu_sampler_params p;
        mu_sampler_params_default(&p);
        p.seed = 21 + (uint32_t)cfg;
        p.temp = 0.0f;
        if (cfg == 1) p.top_k = 0;
        if (cfg == 2) p.top_p = 0.5f, p.min_p = 0.2f;
        if (cfg == 3) p.penalty_repeat = 1.1f; /* not greedy: the full chain in both */
        mu_error err;
        mu_sampler *a = mu_sampler_new(&p, V, NULL, NULL, &err), *b = mu_sampler_new(&p, V, NULL, NULL, &err);
        CHECK(a && b);
        if (!a || !b) return;
        float *row = malloc(V * sizeof *row);
        uint64_t st = 100 + (uint64_t)cfg;
        fake_grammar ga = {2, 0, 0, 0}, gb = ga;
        mu_sample_constraint ca = {&ga, fg_accepts, fg_apply}, cb = {&gb, fg_accepts, fg_apply};
        const bool constrained = cfg == 4;
        const int32_t banned[] = {3, 11};
        const size_t n_banned = cfg == 5 ? 2 : 0;
        for (int t = 0; t < 40; t++) {
            fill_row(row, &st, 2.0f, t % 4 == 1 ? 1.0f : 0.0f); /* every 4th row: integer logits, ties */
            if (t % 4 == 2) row[11] = 40.0f;                     /* a maximum that cfg 5 bans */
            if (t % 8 == 3) row[5] = -INFINITY;
            if (t % 8 == 7) /* 100 tied maxima: top-k 40 keeps 40 of them in heap order */
                for (int i = 0; i < 100; i++) row[(i * 79 + 3000) % V] = 60.0f;
            mu_sample_fast_greedy = 1;
            const int32_t ia = mu_sampler_sample(a, row, banned, n_banned, constrained ? &ca : NULL, &err);
            if (t == 0 && cfg != 3 && cfg != 4) /* cfg 4: the constraint may refuse the argmax */
                CHECK_MSG(mu_sampler_candidates(a)->size == 0, "cfg %d: the fast path was not taken", cfg);
            mu_sample_fast_greedy = 0;
            const int32_t ib = mu_sampler_sample(b, row, banned, n_banned, constrained ? &cb : NULL, &err);
            CHECK_MSG(ia == ib && ia >= 0, "cfg %d step %d: fast %d, chain %d", cfg, t, ia, ib);
            if (ia >= 0) mu_sampler_accept(a, ia);
            if (ib >= 0) mu_sampler_accept(b, ib);
        }
        mu_sample_fast_greedy = 1;
        CHECK(ga.n_accepts == gb.n_accepts && ga.n_applies == gb.n_applies);
        if (constrained) CHECK(ga.n_applies > 0);
        const size_t n = mu_sampler_state_size(a);
        CHECK(n == mu_sampler_state_size(b));
        uint8_t *sa = malloc(n), *sb = malloc(n);
        CHECK(mu_sampler_state_save(a, sa, n) && mu_sampler_state_save(b, sb, n));
        CHECK_MSG(memcmp(sa, sb, n) == 0, "cfg %d: snapshots differ", cfg);
        free(sa), free(sb), free(row);
        mu_sampler_free(a), mu_sampler_free(b);
    }
}

/* mu_cand_top_k_of_row against the candidates built, biased and partially
 * sorted (the chain's way), element for element (ids and logit bits), and
 * the fused top-k chain against the unfused one (ids and snapshots, random
 * draws at temp 0.8): rows of continuous values, integer values (ties),
 * a NaN, +/-inf, banned ids inside and beyond the first k. */
static void test_fused_top_k(void) {
    enum { N = 3000 };
    static float row[N];
    static mu_token_data ref[N], got[128];
    uint64_t st = 9;
    const size_t ks[] = {1, 2, 7, 40, 128};
    for (int kind = 0; kind < 5; kind++)
        for (size_t ki = 0; ki < 5; ki++) {
            const size_t n = kind == 4 ? 150 : N, k = ks[ki];
            for (size_t i = 0; i < n; i++) {
                const float y = tu_rng_normal(&st) * 3.0f;
                row[i] = kind == 1 || kind == 4 ? roundf(y) : y;
            }
            if (kind == 2) row[n / 3] = NAN, row[5] = INFINITY, row[n - 1] = -INFINITY;
            const int32_t banned[] = {0, 3, (int32_t)(n / 2), (int32_t)(n - 2), 3};
            const size_t n_banned = kind == 3 ? 5 : 0;
            if (kind == 3) row[n / 2] = 100.0f; /* a banned maximum */
            for (size_t i = 0; i < n; i++) ref[i] = (mu_token_data){(int32_t)i, row[i], 0.0f};
            for (size_t b = 0; b < n_banned; b++) ref[banned[b]].logit += -INFINITY;
            mu_cand_std_partial_sort(ref, k, n);
            mu_cand_top_k_of_row(got, row, n, k, banned, n_banned);
            bool same = true;
            for (size_t i = 0; i < k; i++)
                same &= ref[i].id == got[i].id && !memcmp(&ref[i].logit, &got[i].logit, 4);
            CHECK_MSG(same, "top_k_of_row kind %d k %zu", kind, k);
        }
    /* whole chains, fused and not */
    for (int cfg = 0; cfg < 4; cfg++) {
        mu_sampler_params p;
        mu_sampler_params_default(&p);
        p.seed = 31 + (uint32_t)cfg;
        if (cfg == 1) p.top_k = 128;
        if (cfg == 2) p.top_k = 1;
        if (cfg == 3) p.temp = 0.0f; /* greedy: the full chain (fused) runs on ties */
        mu_error err;
        mu_sampler *a = mu_sampler_new(&p, V, NULL, NULL, &err), *b = mu_sampler_new(&p, V, NULL, NULL, &err);
        CHECK(a && b);
        if (!a || !b) return;
        float *r = malloc(V * sizeof *r);
        const int32_t banned[] = {1, 4000};
        for (int t = 0; t < 60; t++) {
            fill_row(r, &st, 2.0f, t % 3 == 1 ? 1.0f : 0.0f);
            mu_sample_fuse_top_k = 1;
            const int32_t ia = mu_sampler_sample(a, r, banned, t % 2 ? 2 : 0, NULL, &err);
            mu_sample_fuse_top_k = 0;
            const int32_t ib = mu_sampler_sample(b, r, banned, t % 2 ? 2 : 0, NULL, &err);
            CHECK_MSG(ia == ib && ia >= 0, "fused top-k cfg %d step %d: %d against %d", cfg, t, ia, ib);
            mu_sampler_accept(a, ia), mu_sampler_accept(b, ib);
        }
        mu_sample_fuse_top_k = 1;
        const size_t n = mu_sampler_state_size(a);
        uint8_t *sa = malloc(n), *sb = malloc(n);
        CHECK(mu_sampler_state_save(a, sa, n) && mu_sampler_state_save(b, sb, n) && !memcmp(sa, sb, n));
        free(sa), free(sb), free(r);
        mu_sampler_free(a), mu_sampler_free(b);
    }
}

int main(void) {
    test_mt19937();
    test_canonical_conversions();
    test_libstdcxx_tie_order();
    test_top_k();
    test_top_p();
    test_min_p();
    test_typical();
    test_top_n_sigma();
    test_temperature();
    test_xtc();
    test_dist_and_discrete();
    test_mirostat_v2_step();
    test_penalties();
    test_dry();
    test_logit_bias();
    test_argmax();
    test_order_parsing();
    test_new_refusals();
    test_chains_vs_llama();
    test_banned_leaves_logits();
    test_constraint_calls();
    test_fast_greedy();
    test_fused_top_k();
    test_snapshot_and_reset();
    test_replay_8192();
    test_logprobs();
    test_full_vocab_speed();
    TEST_MAIN_END();
}
