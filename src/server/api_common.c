/* Shared pieces of the route handlers (api.h). */
#include "server/api.h"
#include "util/common.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long api_next waits on one job before it looks at the client again. */
#define API_WAIT_MS 50

json_t *api_body(const srv_request *rq) {
    if (!rq->body_len) {
        srv_reply_error(rq, 400, NULL, "the request body is empty: a JSON object is required");
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(rq->body, rq->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        srv_reply_error(rq, 400, NULL, "invalid JSON at line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        srv_reply_error(rq, 400, NULL, "the request body must be a JSON object");
        json_decref(o);
        return NULL;
    }
    return o;
}

bool api_check_fields(const srv_request *rq, json_t *o, const char *const *const *lists) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool known = false;
        for (int l = 0; lists[l] && !known; l++)
            for (int i = 0; lists[l][i] && !known; i++) known = !strcmp(lists[l][i], k);
        if (!known) {
            srv_reply_error(rq, 400, k, "unknown field '%s'", k);
            return false;
        }
    }
    return true;
}

bool api_get_int(const srv_request *rq, json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_integer(v)) {
        srv_reply_error(rq, 400, key, "'%s' must be an integer", key);
        return false;
    }
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) {
        srv_reply_error(rq, 400, key, "'%s' is %lld, outside [%lld, %lld]", key, (long long)x, (long long)lo,
                        (long long)hi);
        return false;
    }
    *out = x;
    return true;
}

bool api_get_num(const srv_request *rq, json_t *o, const char *key, double lo, double hi, double *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_number(v)) {
        srv_reply_error(rq, 400, key, "'%s' must be a number", key);
        return false;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        srv_reply_error(rq, 400, key, "'%s' is %g, outside [%g, %g]", key, x, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

bool api_get_float(const srv_request *rq, json_t *o, const char *key, double lo, double hi, float *out) {
    double d = *out;
    if (!api_get_num(rq, o, key, lo, hi, &d)) return false;
    *out = (float)d;
    return true;
}

bool api_get_bool(const srv_request *rq, json_t *o, const char *key, bool *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        srv_reply_error(rq, 400, key, "'%s' must be true or false", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

bool api_get_str(const srv_request *rq, json_t *o, const char *key, const char **out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_string(v)) {
        srv_reply_error(rq, 400, key, "'%s' must be a string", key);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

/* ------------------------------------------------------------ generation requests */

void api_gen_init(api_gen *g) {
    memset(g, 0, sizeof *g);
    muser_sampling_params_default(&g->jp.sampling);
    g->jp.req.n_predict = -1;
    g->jp.slot = -1;
    g->jp.cache_prompt = true;
    g->n = 1;
}

void api_gen_free(api_gen *g) {
    free(g->bias);
    free(g->schema);
    free(g->samplers);
    free(g->messages);
    free(g->tools);
    free(g->text);
    free(g->tokens);
}

const char *const api_common_fields[] = {
    "stream", "temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "stop",
    "top_k", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "mirostat", "mirostat_tau", "mirostat_eta",
    "samplers", "grammar", "json_schema", "n_probs", "id_slot", "cache_prompt", "ignore_eos", "n_predict",
    "dynatemp_range", "dynatemp_exponent", "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base",
    "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers", "top_n_sigma", "min_keep", NULL,
};

static bool parse_stop(const srv_request *rq, json_t *v, api_gen *g) {
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        if (!json_string_length(v)) {
            srv_reply_error(rq, 400, "stop", "'stop' must not be an empty string");
            return false;
        }
        g->stops[0] = json_string_value(v);
        g->jp.req.n_stops = 1;
        return true;
    }
    if (!json_is_array(v)) {
        srv_reply_error(rq, 400, "stop", "'stop' must be a string or an array of strings");
        return false;
    }
    if (json_array_size(v) > MU_GEN_MAX_STOPS) {
        srv_reply_error(rq, 400, "stop", "'stop' has %zu strings, at most %d are allowed", json_array_size(v),
                        MU_GEN_MAX_STOPS);
        return false;
    }
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || !json_string_length(s)) {
            char p[32];
            snprintf(p, sizeof p, "stop[%zu]", i);
            srv_reply_error(rq, 400, p, "'%s' must be a non-empty string", p);
            return false;
        }
        g->stops[i] = json_string_value(s);
    }
    g->jp.req.n_stops = (int)json_array_size(v);
    return true;
}

/* OpenAI's {"token id": bias} or llama.cpp's [[id, bias | false], ...]. */
static bool parse_logit_bias(srv_server *srv, const srv_request *rq, json_t *v, api_gen *g) {
    if (!v || json_is_null(v)) return true;
    size_t n = json_is_object(v) ? json_object_size(v) : json_is_array(v) ? json_array_size(v) : 0;
    if (!json_is_object(v) && !json_is_array(v)) {
        srv_reply_error(rq, 400, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        return false;
    }
    g->bias = mu_xcalloc(n ? n : 1, sizeof *g->bias);
    size_t k = 0;
    char p[96];
    if (json_is_object(v)) {
        const char *key;
        json_t *b;
        json_object_foreach(v, key, b) {
            snprintf(p, sizeof p, "logit_bias.%.60s", key);
            char *end;
            long long id = strtoll(key, &end, 10);
            if (!key[0] || *end || id < 0 || id >= srv->info.n_vocab) {
                srv_reply_error(rq, 400, p, "'%s': the key must be a token id in [0, %lld)", p,
                                (long long)srv->info.n_vocab);
                return false;
            }
            if (!json_is_number(b) || !isfinite(json_number_value(b))) {
                srv_reply_error(rq, 400, p, "'%s' must be a number", p);
                return false;
            }
            g->bias[k++] = (muser_logit_bias){(int32_t)id, (float)json_number_value(b)};
        }
    } else {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            snprintf(p, sizeof p, "logit_bias[%zu]", i);
            json_t *id = json_array_get(e, 0), *b = json_array_get(e, 1);
            if (!json_is_array(e) || json_array_size(e) != 2 || !json_is_integer(id) ||
                !(json_is_number(b) || json_is_false(b))) {
                srv_reply_error(rq, 400, p, "'%s' must be [token id, bias or false]", p);
                return false;
            }
            if (json_integer_value(id) < 0 || json_integer_value(id) >= srv->info.n_vocab) {
                srv_reply_error(rq, 400, p, "'%s': token id %lld outside [0, %lld)", p,
                                (long long)json_integer_value(id), (long long)srv->info.n_vocab);
                return false;
            }
            float bias = json_is_false(b) ? -INFINITY : (float)json_number_value(b);
            g->bias[k++] = (muser_logit_bias){(int32_t)json_integer_value(id), bias};
        }
    }
    g->jp.sampling.logit_bias = g->bias;
    g->jp.sampling.n_logit_bias = k;
    return true;
}

bool api_set_schema(const srv_request *rq, json_t *v, const char *key, api_gen *g) {
    if (!json_is_object(v) && !json_is_boolean(v)) {
        srv_reply_error(rq, 400, key, "'%s' must be a JSON Schema object", key);
        return false;
    }
    if (g->jp.sampling.grammar) {
        srv_reply_error(rq, 400, key, "'%s' and 'grammar' exclude each other", key);
        return false;
    }
    free(g->schema);
    g->schema = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    g->jp.sampling.json_schema = g->schema;
    g->schema_key = key;
    return true;
}

static bool parse_samplers(const srv_request *rq, json_t *v, api_gen *g) {
    if (!v || json_is_null(v)) return true;
    if (json_is_string(v)) {
        g->jp.sampling.sampling_seq = json_string_value(v);
        return true;
    }
    if (!json_is_array(v)) {
        srv_reply_error(rq, 400, "samplers", "'samplers' must be an array of sampler names or a string of letters");
        return false;
    }
    mu_buf b = {0};
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || !json_string_length(s) || strchr(json_string_value(s), ';')) {
            char p[32];
            snprintf(p, sizeof p, "samplers[%zu]", i);
            srv_reply_error(rq, 400, p, "'%s' must be a sampler name", p);
            free(b.p);
            return false;
        }
        if (i) mu_buf_append(&b, ";", 1);
        mu_buf_append(&b, json_string_value(s), json_string_length(s));
    }
    g->samplers = mu_buf_take(&b);
    g->jp.sampling.samplers = g->samplers;
    return true;
}

static bool parse_breakers(const srv_request *rq, json_t *v, api_gen *g) {
    if (!v || json_is_null(v)) return true;
    size_t cap = sizeof g->breakers / sizeof g->breakers[0];
    if (!json_is_array(v) || json_array_size(v) > cap) {
        srv_reply_error(rq, 400, "dry_sequence_breakers", "'dry_sequence_breakers' must be an array of at most %zu strings",
                        cap);
        return false;
    }
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) {
        if (!json_is_string(s) || !json_string_length(s)) {
            char p[48];
            snprintf(p, sizeof p, "dry_sequence_breakers[%zu]", i);
            srv_reply_error(rq, 400, p, "'%s' must be a non-empty string", p);
            return false;
        }
        g->breakers[i] = json_string_value(s);
    }
    g->jp.sampling.dry_sequence_breakers = g->breakers;
    g->jp.sampling.n_dry_sequence_breakers = json_array_size(v);
    return true;
}

bool api_parse_common(srv_server *srv, const srv_request *rq, json_t *o, int flavour, api_gen *g) {
    muser_sampling_params *sp = &g->jp.sampling;
    int64_t i64;
    bool ok = api_get_bool(rq, o, "stream", &g->stream) &&
              api_get_float(rq, o, "temperature", 0, flavour == API_OPENAI ? 2 : 1e6, &sp->temp) &&
              api_get_float(rq, o, "top_p", 0, 1, &sp->top_p) && api_get_float(rq, o, "min_p", 0, 1, &sp->min_p) &&
              api_get_float(rq, o, "typical_p", 0, 1, &sp->typ_p) &&
              api_get_float(rq, o, "presence_penalty", -2, 2, &sp->penalty_present) &&
              api_get_float(rq, o, "frequency_penalty", -2, 2, &sp->penalty_freq) &&
              api_get_float(rq, o, "repeat_penalty", 0, 1e6, &sp->penalty_repeat) &&
              api_get_float(rq, o, "mirostat_tau", 0, 1e6, &sp->mirostat_tau) &&
              api_get_float(rq, o, "mirostat_eta", 0, 1e6, &sp->mirostat_eta) &&
              api_get_float(rq, o, "dynatemp_range", 0, 1e6, &sp->dynatemp_range) &&
              api_get_float(rq, o, "dynatemp_exponent", 0, 1e6, &sp->dynatemp_exponent) &&
              api_get_float(rq, o, "xtc_probability", 0, 1, &sp->xtc_probability) &&
              api_get_float(rq, o, "xtc_threshold", 0, 1, &sp->xtc_threshold) &&
              api_get_float(rq, o, "dry_multiplier", 0, 1e6, &sp->dry_multiplier) &&
              api_get_float(rq, o, "dry_base", 0, 1e6, &sp->dry_base) &&
              api_get_float(rq, o, "top_n_sigma", -1, 1e6, &sp->top_n_sigma) &&
              api_get_bool(rq, o, "ignore_eos", &sp->ignore_eos) &&
              api_get_bool(rq, o, "cache_prompt", &g->jp.cache_prompt);
    if (!ok) return false;
    i64 = sp->top_k;
    if (!api_get_int(rq, o, "top_k", -1, INT32_MAX, &i64)) return false;
    sp->top_k = (int32_t)i64;
    i64 = sp->penalty_last_n;
    if (!api_get_int(rq, o, "repeat_last_n", -1, INT32_MAX, &i64)) return false;
    sp->penalty_last_n = (int32_t)i64;
    i64 = sp->mirostat;
    if (!api_get_int(rq, o, "mirostat", 0, 2, &i64)) return false;
    sp->mirostat = (int32_t)i64;
    i64 = sp->dry_allowed_length;
    if (!api_get_int(rq, o, "dry_allowed_length", 0, INT32_MAX, &i64)) return false;
    sp->dry_allowed_length = (int32_t)i64;
    i64 = sp->dry_penalty_last_n;
    if (!api_get_int(rq, o, "dry_penalty_last_n", -1, INT32_MAX, &i64)) return false;
    sp->dry_penalty_last_n = (int32_t)i64;
    i64 = sp->min_keep;
    if (!api_get_int(rq, o, "min_keep", 0, INT32_MAX, &i64)) return false;
    sp->min_keep = (int32_t)i64;
    i64 = sp->n_probs;
    if (!api_get_int(rq, o, "n_probs", 0, 100, &i64)) return false;
    sp->n_probs = (int32_t)i64;
    i64 = g->jp.slot;
    if (!api_get_int(rq, o, "id_slot", -1, srv->p.n_parallel - 1, &i64)) return false;
    g->jp.slot = (int32_t)i64;
    i64 = -1;
    if (!api_get_int(rq, o, "seed", -1, UINT32_MAX, &i64)) return false;
    sp->seed = i64 < 0 ? MUSER_SEED_RANDOM : (uint32_t)i64;
    i64 = g->jp.req.n_predict;
    if (!api_get_int(rq, o, "n_predict", -1, INT32_MAX, &i64)) return false;
    g->jp.req.n_predict = i64;
    const char *grammar = NULL;
    if (!api_get_str(rq, o, "grammar", &grammar)) return false;
    if (grammar && grammar[0]) sp->grammar = grammar;
    json_t *schema = json_object_get(o, "json_schema");
    if (schema && !json_is_null(schema) && !api_set_schema(rq, schema, "json_schema", g)) return false;
    return parse_stop(rq, json_object_get(o, "stop"), g) && parse_logit_bias(srv, rq, json_object_get(o, "logit_bias"), g) &&
           parse_samplers(rq, json_object_get(o, "samplers"), g) &&
           parse_breakers(rq, json_object_get(o, "dry_sequence_breakers"), g);
}

bool api_parse_prompt(srv_server *srv, const srv_request *rq, json_t *v, const char *key, api_gen *g) {
    if (!v || json_is_null(v)) {
        srv_reply_error(rq, 400, key, "'%s' is required", key);
        return false;
    }
    if (json_is_string(v)) {
        g->text = mu_xmalloc(json_string_length(v) + 1);
        memcpy(g->text, json_string_value(v), json_string_length(v) + 1);
        g->jp.req.text = g->text;
        g->jp.req.text_len = json_string_length(v);
        if (!g->jp.req.text_len) {
            srv_reply_error(rq, 400, key, "'%s' is empty", key);
            return false;
        }
        return true;
    }
    if (!json_is_array(v) || !json_array_size(v)) {
        srv_reply_error(rq, 400, key, "'%s' must be a string or a non-empty array of token ids", key);
        return false;
    }
    size_t n = json_array_size(v), i;
    json_t *t;
    g->tokens = mu_xmalloc(n * sizeof *g->tokens);
    json_array_foreach(v, i, t) {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= srv->info.n_vocab) {
            char p[64];
            snprintf(p, sizeof p, "%s[%zu]", key, i);
            srv_reply_error(rq, 400, p, "'%s' must be a token id in [0, %lld)", p, (long long)srv->info.n_vocab);
            return false;
        }
        g->tokens[i] = (int32_t)json_integer_value(t);
    }
    g->jp.req.tokens = g->tokens;
    g->jp.req.n_tokens = (int64_t)n;
    return true;
}

/* The field a scheduler refusal is about, from its message. */
static const char *refusal_param(const api_gen *g, const char *msg, const char *prompt_key) {
    if (strstr(msg, "prompt") || strstr(msg, "context")) return prompt_key;
    if (strstr(msg, "slot")) return "id_slot";
    const char *schema = g->schema_key ? g->schema_key : "json_schema";
    if (strstr(msg, "grammar") || strstr(msg, "GBNF")) return g->jp.sampling.json_schema ? schema : "grammar";
    if (strstr(msg, "schema")) return schema;
    if (strstr(msg, "sampler") || strstr(msg, "sampling")) return "samplers";
    if (strstr(msg, "logit_bias") || strstr(msg, "bias")) return "logit_bias";
    return prompt_key;
}

srv_job *api_submit(srv_server *srv, const srv_request *rq, const api_gen *g, const char *prompt_key) {
    srv_sched *s = srv->sched;
    if (!s || srv->stopping) {
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
        return NULL;
    }
    srv_job_params jp = g->jp;
    jp.req.stops = g->stops;
    srv_refusal why = SRV_REFUSED_INVALID;
    muser_error err = {{0}};
    srv_job *j = srv_sched_submit(s, &jp, &why, &err);
    if (j) return j;
    if (why == SRV_REFUSED_BUSY)
        srv_reply_error(rq, 429, NULL, "too many requests are waiting: %s", err.msg[0] ? err.msg : "retry later");
    else if (why == SRV_REFUSED_SHUTDOWN)
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
    else
        srv_reply_error(rq, 400, refusal_param(g, err.msg, prompt_key), "%s", err.msg[0] ? err.msg : "invalid request");
    return NULL;
}

bool api_next(const srv_request *rq, srv_job **jobs, const bool *done, int n, srv_event *ev, int *which) {
    for (;;) {
        /* Checked before every event too: a busy job never times out. */
        if (srv_client_gone(rq)) {
            for (int i = 0; i < n; i++)
                if (!done[i]) srv_job_cancel(jobs[i]);
            return false;
        }
        int live = 0;
        for (int i = 0; i < n; i++) {
            if (done[i]) continue;
            live++;
            if (srv_job_next(jobs[i], ev, n == 1 ? API_WAIT_MS : 2)) {
                *which = i;
                return true;
            }
        }
        if (!live) return false;
    }
}

/* ------------------------------------------------------------ reply pieces */

json_t *api_text(const char *p, size_t n) {
    json_t *s = json_stringn(p ? p : "", p ? n : 0);
    if (s) return s;
    /* Not UTF-8 (a token that is part of a character): the same text with
     * U+FFFD for the bad bytes, through the request loop's encoder. */
    mu_buf b = {0};
    mu_gen_json_string(&b, p, n);
    s = json_loadb(b.p, b.len, JSON_DECODE_ANY, NULL);
    free(b.p);
    return s ? s : json_string("");
}

json_t *api_token_text(srv_server *srv, int32_t id) {
    char buf[256];
    size_t n = muser_token_piece(srv->model, id, true, buf, sizeof buf);
    return api_text(buf, n < sizeof buf ? n : sizeof buf);
}

json_t *api_token_bytes(srv_server *srv, int32_t id) {
    char buf[256];
    size_t n = muser_token_piece(srv->model, id, true, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)buf[i]));
    return a;
}

static json_t *logprob_one(srv_server *srv, const muser_logprob *lp, bool with_id) {
    json_t *o = json_object();
    if (with_id) json_object_set_new(o, "id", json_integer(lp->id));
    json_object_set_new(o, "token", api_token_text(srv, lp->id));
    json_object_set_new(o, "logprob", json_real(isfinite(lp->logprob) ? lp->logprob : -9999.0));
    json_object_set_new(o, "bytes", api_token_bytes(srv, lp->id));
    return o;
}

json_t *api_logprob(srv_server *srv, const muser_logprob *chosen, const muser_logprob *top, int32_t n_top,
                    bool with_id) {
    json_t *o = logprob_one(srv, chosen, with_id);
    json_t *a = json_array();
    for (int32_t i = 0; i < n_top; i++) json_array_append_new(a, logprob_one(srv, &top[i], with_id));
    json_object_set_new(o, "top_logprobs", a);
    return o;
}

const char *api_finish_reason(mu_gen_stop st) {
    return st == MU_GEN_STOP_LENGTH || st == MU_GEN_STOP_CONTEXT ? "length" : "stop";
}

bool api_stop_is_error(mu_gen_stop st) { return st == MU_GEN_STOP_ERROR || st == MU_GEN_STOP_CANCELLED; }

int64_t api_created(void) { return (int64_t)time(NULL); }

void api_new_id(const char *prefix, char *out, size_t cap) {
    static uint64_t counter;
    uint64_t c = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec * 1000000007ull) ^ ((uint64_t)ts.tv_nsec << 20) ^ (c * 0x9E3779B97F4A7C15ull);
    snprintf(out, cap, "%s-%016llx", prefix, (unsigned long long)x);
}
