/* Plain against speculative greedy decoding of one prompt (gen.h): both
 * through mu_gen_run, so the exactness check covers the library's loop. */
#include "gen/gen.h"
#include "util/common.h"
#include <stdlib.h>

/* One greedy run; the tokens are copied out (the mu_gen is reused). */
static bool run_greedy(mu_gen *g, muser_session *s, muser_spec *sp, const mu_gen_request *req, int32_t **out,
                       int64_t *n, double *t_decode, muser_error *err) {
    if (!mu_gen_run(g, s, sp, NULL, req, NULL, NULL, err)) return false;
    const mu_gen_result *r = mu_gen_get_result(g);
    free(*out);
    *out = mu_xmalloc((size_t)(r->n_tokens ? r->n_tokens : 1) * sizeof(int32_t));
    if (r->n_tokens) memcpy(*out, r->tokens, (size_t)r->n_tokens * sizeof(int32_t));
    *n = r->n_tokens;
    *t_decode = r->t_decode;
    return true;
}

bool mu_gen_greedy(muser_session *s, const muser_draft *d, const muser_spec_params *spp, const int32_t *prompt,
                   int64_t n_prompt, int64_t n_predict, mu_gen_pair *p, muser_error *err) {
    muser_sampling_params greedy;
    muser_sampling_params_default(&greedy);
    greedy.temp = 0; /* argmax, lowest id on ties */
    mu_gen *g = mu_gen_new(muser_session_model(s), &greedy, err);
    if (!g) return false;
    /* the plain run is plain greedy decoding at its fastest: on the session's
     * greedy chain where the backend has one (mu_gen_can_chain) */
    mu_gen_request req = {.tokens = prompt, .n_tokens = n_prompt, .n_predict = n_predict, .speculate = d != NULL};
    /* the assistant exists only for its run: bound to s, it would capture the plain run's rows */
    muser_spec_params sp_params = spp ? *spp : (muser_spec_params){0};
    sp_params.no_gate = true;
    muser_spec *sp = d ? muser_spec_create(s, d, &sp_params, err) : NULL;
    bool ok = (!d || sp) && run_greedy(g, s, sp, &req, d ? &p->spec : &p->plain, d ? &p->n_spec : &p->n_plain,
                                        d ? &p->t_spec : &p->t_plain, err);
    if (ok && sp) muser_spec_get_stats(sp, &p->st);
    muser_spec_free(sp);
    mu_gen_free(g);
    return ok;
}

void mu_gen_pair_free(mu_gen_pair *p) {
    free(p->plain);
    free(p->spec);
    p->plain = p->spec = NULL;
}

int64_t mu_gen_pair_diff(const mu_gen_pair *p) {
    int64_t n = p->n_plain < p->n_spec ? p->n_plain : p->n_spec;
    for (int64_t i = 0; i < n; i++)
        if (p->plain[i] != p->spec[i]) return i;
    return p->n_plain == p->n_spec ? -1 : n;
}

double mu_gen_rate(int64_t n, double seconds) { return n > 1 && seconds > 0 ? (double)(n - 1) / seconds : 0; }
