/* OpenAI's API: GET /v1/models, POST /v1/completions, POST
 * /v1/chat/completions (docs/server.md). Several choices (n) and several
 * prompts run as separate jobs side by side in the scheduler; a stream
 * interleaves their chunks by choice index. */
#include "server/api.h"
#include "util/common.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OAI_MAX_N 16            /* choices per request */
#define OAI_MAX_JOBS 64         /* prompts x choices */

void srv_openai_models(srv_server *srv, const srv_request *rq) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(srv->model_id));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)(api_created() - (int64_t)(mu_now() - srv->t_start))));
    json_object_set_new(m, "owned_by", json_string("muser"));
    json_t *meta = json_object();
    json_object_set_new(meta, "n_vocab", json_integer(srv->info.n_vocab));
    json_object_set_new(meta, "n_ctx_train", json_integer(srv->info.n_ctx_train));
    json_object_set_new(meta, "n_ctx", json_integer(srv->p.n_ctx));
    json_object_set_new(meta, "lane", json_string(srv->info.lane ? srv->info.lane : ""));
    json_object_set_new(meta, "size", json_integer((json_int_t)srv->info.file_bytes));
    json_object_set_new(m, "meta", meta);
    json_t *data = json_array();
    json_array_append_new(data, m);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", data);
    srv_reply_json(rq, 200, o);
}

/* ------------------------------------------------------------ shared run */

typedef struct oai_run {
    srv_server *srv;
    const srv_request *rq;
    bool chat;
    char id[64];
    int64_t created;
    bool logprobs;              /* chat: logprobs; completions: logprobs given */
    int top_logprobs;
    api_gen *g;
    srv_job *jobs[OAI_MAX_JOBS];
    int n_jobs, n_per_prompt;
} oai_run;

static json_t *usage_json(oai_run *r) {
    int64_t prompt = 0, completion = 0, cached = 0;
    for (int i = 0; i < r->n_jobs; i++) {
        const mu_gen_result *res = srv_job_result(r->jobs[i]);
        if (!res) continue;
        if (i % r->n_per_prompt == 0) {
            prompt += res->n_prompt;
            cached += srv_job_cached(r->jobs[i]);
        }
        completion += res->n_tokens;
    }
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt));
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer(prompt + completion));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

static json_t *envelope(oai_run *r, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(r->created));
    json_object_set_new(o, "model", json_string(r->srv->model_id));
    json_object_set_new(o, "system_fingerprint", json_string("muser-" MUSER_VERSION));
    return o;
}

/* Legacy completions logprobs for tokens [from, to) of a result. */
static json_t *completion_logprobs(oai_run *r, const int32_t *toks, const muser_logprob *lps,
                                   const muser_logprob *top, int32_t n_probs, int64_t n, size_t text_offset) {
    json_t *tokens = json_array(), *lp = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = text_offset;
    for (int64_t i = 0; i < n; i++) {
        json_t *t = api_token_text(r->srv, toks[i]);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += json_string_length(t);
        json_array_append_new(tokens, t);
        json_array_append_new(lp, json_real(isfinite(lps[i].logprob) ? lps[i].logprob : -9999.0));
        json_t *m = json_object();
        for (int k = 0; k < r->top_logprobs && k < n_probs; k++) {
            const muser_logprob *e = &top[i * n_probs + k];
            json_t *s = api_token_text(r->srv, e->id);
            json_object_set_new(m, json_string_value(s), json_real(isfinite(e->logprob) ? e->logprob : -9999.0));
            json_decref(s);
        }
        json_array_append_new(tops, m);
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", lp);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

static json_t *chat_logprobs(oai_run *r, const int32_t *toks, const muser_logprob *lps, const muser_logprob *top,
                             int32_t n_probs, int64_t n) {
    json_t *content = json_array();
    for (int64_t i = 0; i < n; i++) {
        muser_logprob c = {toks[i], lps[i].logprob};
        int32_t k = r->top_logprobs < n_probs ? r->top_logprobs : n_probs;
        json_array_append_new(content, api_logprob(r->srv, &c, top + i * n_probs, k, false));
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", content);
    json_object_set_new(o, "refusal", json_null());
    return o;
}

static void reply_failed(oai_run *r, const mu_gen_result *res) {
    if (res->stop == MU_GEN_STOP_CANCELLED)
        srv_reply_error(r->rq, 503, NULL, "the request was cancelled (server shutting down)");
    else
        srv_reply_error(r->rq, 500, NULL, "generation failed: %s", res->error ? res->error : "engine error");
}

static void run_blocking(oai_run *r) {
    bool done[OAI_MAX_JOBS] = {0};
    int left = r->n_jobs, which;
    srv_event ev;
    while (left) {
        if (!api_next(r->rq, r->jobs, done, r->n_jobs, &ev, &which)) {
            srv_reply_error(r->rq, 400, NULL, "the client closed the connection");
            return;
        }
        if (ev.kind == SRV_EV_DONE) {
            done[which] = true;
            left--;
        }
    }
    json_t *choices = json_array();
    for (int i = 0; i < r->n_jobs; i++) {
        const mu_gen_result *res = srv_job_result(r->jobs[i]);
        if (api_stop_is_error(res->stop)) {
            json_decref(choices);
            reply_failed(r, res);
            return;
        }
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(i));
        if (r->chat) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("assistant"));
            json_object_set_new(m, "content", api_text(res->text, res->text_len));
            json_object_set_new(m, "refusal", json_null());
            json_object_set_new(c, "message", m);
        } else {
            json_object_set_new(c, "text", api_text(res->text, res->text_len));
        }
        json_t *lp = json_null();
        if (r->logprobs && res->logprobs)
            lp = r->chat ? chat_logprobs(r, res->tokens, res->logprobs, res->top, res->n_probs, res->n_tokens)
                         : completion_logprobs(r, res->tokens, res->logprobs, res->top, res->n_probs, res->n_tokens, 0);
        json_object_set_new(c, "logprobs", lp);
        json_object_set_new(c, "finish_reason", json_string(api_finish_reason(res->stop)));
        json_array_append_new(choices, c);
    }
    json_t *o = envelope(r, r->chat ? "chat.completion" : "text_completion");
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage_json(r));
    srv_reply_json(r->rq, 200, o);
}

static json_t *chunk(oai_run *r, int index, json_t *delta_or_text, json_t *logprobs, const char *finish) {
    json_t *o = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(index));
    json_object_set_new(c, r->chat ? "delta" : "text", delta_or_text);
    json_object_set_new(c, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *a = json_array();
    json_array_append_new(a, c);
    json_object_set_new(o, "choices", a);
    if (r->g->include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

static void run_stream(oai_run *r) {
    srv_stream *st = srv_stream_begin(r->rq, 200);
    bool ok = true;
    if (r->chat)
        for (int i = 0; i < r->n_jobs && ok; i++) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            ok = srv_stream_send_json(st, chunk(r, i, d, NULL, NULL));
        }
    bool done[OAI_MAX_JOBS] = {0};
    int left = r->n_jobs, which;
    srv_event ev;
    size_t offset[OAI_MAX_JOBS] = {0};
    while (ok && left) {
        if (!api_next(r->rq, r->jobs, done, r->n_jobs, &ev, &which)) {
            ok = false;
            break;
        }
        if (ev.kind == SRV_EV_DONE) {
            done[which] = true;
            left--;
            const mu_gen_result *res = srv_job_result(r->jobs[which]);
            if (api_stop_is_error(res->stop)) {
                json_t *e = json_object(), *eo = json_object();
                json_object_set_new(e, "message", json_string(res->stop == MU_GEN_STOP_CANCELLED
                                                                  ? "the request was cancelled"
                                                                  : (res->error ? res->error : "generation failed")));
                json_object_set_new(e, "type", json_string("server_error"));
                json_object_set_new(e, "code", json_integer(res->stop == MU_GEN_STOP_CANCELLED ? 503 : 500));
                json_object_set_new(eo, "error", e);
                ok = srv_stream_send_json(st, eo);
                continue;
            }
            json_t *d = r->chat ? json_object() : json_string("");
            ok = srv_stream_send_json(st, chunk(r, which, d, NULL, api_finish_reason(res->stop)));
            continue;
        }
        bool has_lp = r->logprobs && ev.has_logprob && ev.token >= 0;
        if (!ev.text_len && !has_lp) continue;
        json_t *lp = NULL;
        if (has_lp) {
            if (r->chat) lp = chat_logprobs(r, &ev.token, &ev.logprob, ev.top, ev.n_top, 1);
            else lp = completion_logprobs(r, &ev.token, &ev.logprob, ev.top, ev.n_top, 1, offset[which]);
        }
        offset[which] += ev.text_len;
        json_t *text = api_text(ev.text, ev.text_len);
        json_t *d = text;
        if (r->chat) {
            d = json_object();
            json_object_set_new(d, "content", text);
        }
        ok = srv_stream_send_json(st, chunk(r, which, d, lp, NULL));
    }
    if (ok && r->g->include_usage) {
        json_t *o = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(r));
        ok = srv_stream_send_json(st, o);
    }
    if (ok) srv_stream_send(st, "[DONE]", 6);
    srv_stream_end(st);
}

/* ------------------------------------------------------------ request fields */

static const char *const chat_fields[] = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens", "n",
    "stream_options", "logprobs", "top_logprobs", "response_format", "user", NULL,
};
static const char *const completion_fields[] = {
    "model", "prompt", "max_tokens", "n", "stream_options", "logprobs", "echo", "best_of", "suffix", "user",
    "response_format", NULL,
};

/* Fields both OpenAI routes share beyond api_parse_common. */
static bool parse_openai(oai_run *r, json_t *b) {
    const srv_request *rq = r->rq;
    api_gen *g = r->g;
    const char *model = NULL;
    if (!api_get_str(rq, b, "model", &model) || !api_get_str(rq, b, "user", &model)) return false;
    int64_t n = 1, max_tokens = -1;
    if (!api_get_int(rq, b, "n", 1, OAI_MAX_N, &n)) return false;
    g->n = (int)n;
    if (!api_get_int(rq, b, "max_tokens", 1, INT32_MAX, &max_tokens)) return false;
    if (r->chat && !api_get_int(rq, b, "max_completion_tokens", 1, INT32_MAX, &max_tokens)) return false;
    if (max_tokens > 0) g->jp.req.n_predict = max_tokens;
    json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            srv_reply_error(rq, 400, "stream_options", "'stream_options' must be an object");
            return false;
        }
        if (!g->stream) {
            srv_reply_error(rq, 400, "stream_options", "'stream_options' is only allowed with \"stream\": true");
            return false;
        }
        static const char *const so_fields[] = {"include_usage", NULL};
        static const char *const *const lists[] = {so_fields, NULL};
        json_t *iu = json_object_get(so, "include_usage");
        if (!api_check_fields(rq, so, lists)) return false;
        if (iu && !json_is_null(iu) && !json_is_boolean(iu)) {
            srv_reply_error(rq, 400, "stream_options.include_usage", "'stream_options.include_usage' must be true or false");
            return false;
        }
        g->include_usage = json_is_true(iu);
    }
    json_t *rf = json_object_get(b, "response_format");
    if (rf && !json_is_null(rf)) {
        json_t *type = json_object_get(rf, "type");
        if (!json_is_object(rf) || !json_is_string(type)) {
            srv_reply_error(rq, 400, "response_format", "'response_format' must be an object with a 'type'");
            return false;
        }
        const char *t = json_string_value(type);
        if (!strcmp(t, "text")) {
        } else if (!strcmp(t, "json_object")) {
            json_t *schema = json_object_get(rf, "schema"); /* llama.cpp's extension */
            json_t *any = json_pack("{s:s}", "type", "object");
            bool ok = api_set_schema(rq, schema && !json_is_null(schema) ? schema : any, "response_format", g);
            json_decref(any);
            if (!ok) return false;
        } else if (!strcmp(t, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            json_t *schema = json_object_get(js, "schema");
            if (!json_is_object(js) || !schema) {
                srv_reply_error(rq, 400, "response_format.json_schema.schema",
                                "'response_format.json_schema.schema' is required with type json_schema");
                return false;
            }
            if (!api_set_schema(rq, schema, "response_format.json_schema.schema", g)) return false;
        } else {
            srv_reply_error(rq, 400, "response_format.type",
                            "'response_format.type' is '%s': expected text, json_object or json_schema", t);
            return false;
        }
    }
    return true;
}

static void run(oai_run *r, json_t *prompts, bool chat_messages) {
    int n_prompts = chat_messages ? 1 : (int)json_array_size(prompts);
    if (n_prompts * r->g->n > OAI_MAX_JOBS) {
        srv_reply_error(r->rq, 400, "n", "%d prompts x n = %d choices: at most %d are allowed", n_prompts, r->g->n,
                        OAI_MAX_JOBS);
        return;
    }
    r->n_per_prompt = r->g->n;
    for (int p = 0; p < n_prompts; p++) {
        api_gen pg = *r->g;
        pg.text = NULL;
        pg.tokens = NULL;
        if (!chat_messages) {
            char key[32];
            snprintf(key, sizeof key, "prompt[%d]", p);
            if (!api_parse_prompt(r->srv, r->rq, json_array_get(prompts, p), n_prompts > 1 ? key : "prompt", &pg)) {
                free(pg.text);
                free(pg.tokens);
                return;
            }
        }
        for (int k = 0; k < r->g->n; k++) {
            /* n choices of one prompt are n samples: a given seed seeds the
             * first, the others take the next seeds (a random seed stays
             * random, each job drawing its own) */
            api_gen cg = pg;
            if (pg.jp.sampling.seed != MUSER_SEED_RANDOM) cg.jp.sampling.seed = pg.jp.sampling.seed + (uint32_t)k;
            if (cg.jp.sampling.seed == MUSER_SEED_RANDOM) cg.jp.sampling.seed = 0; /* wrapped onto the sentinel */
            srv_job *j = api_submit(r->srv, r->rq, &cg, chat_messages ? "messages" : "prompt");
            if (!j) {
                free(pg.text);
                free(pg.tokens);
                return;
            }
            r->jobs[r->n_jobs++] = j;
        }
        free(pg.text);
        free(pg.tokens);
    }
    if (r->g->stream) run_stream(r);
    else run_blocking(r);
}

static void finish(oai_run *r) {
    for (int i = 0; i < r->n_jobs; i++) srv_job_free(r->jobs[i]);
}

/* ------------------------------------------------------------ chat */

/* The messages as the chat template expects them: content parts of type
 * "text" joined into one string; "developer" read as "system". */
json_t *api_messages(const srv_request *rq, json_t *msgs) {
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        srv_reply_error(rq, 400, "messages", "'messages' must be a non-empty array of messages");
        return NULL;
    }
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function", NULL};
    static const char *const msg_fields[] = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal",
                                             "reasoning_content", "function_call", NULL};
    static const char *const *const lists[] = {msg_fields, NULL};
    json_t *out = json_array();
    size_t i;
    json_t *m;
    char p[64];
    json_array_foreach(msgs, i, m) {
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(m)) {
            srv_reply_error(rq, 400, p, "'%s' must be an object", p);
            goto fail;
        }
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            bool known = false;
            for (int f = 0; msg_fields[f]; f++) known |= !strcmp(msg_fields[f], k);
            if (!known) {
                char q[128];
                snprintf(q, sizeof q, "%s.%s", p, k);
                srv_reply_error(rq, 400, q, "unknown field '%s'", q);
                goto fail;
            }
        }
        (void)lists;
        json_t *role = json_object_get(m, "role");
        int r = -1;
        for (int k2 = 0; json_is_string(role) && roles[k2]; k2++)
            if (!strcmp(roles[k2], json_string_value(role))) r = k2;
        if (r < 0) {
            snprintf(p + strlen(p), sizeof p - strlen(p), ".role");
            srv_reply_error(rq, 400, p, "'%s' must be one of system, developer, user, assistant, tool", p);
            goto fail;
        }
        json_t *c = json_object_get(m, "content");
        json_t *nm = json_deep_copy(m);
        if (r == 1) json_object_set_new(nm, "role", json_string("system"));
        if (json_is_array(c)) {
            mu_buf b = {0};
            size_t j;
            json_t *part;
            json_array_foreach(c, j, part) {
                json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
                    !json_is_string(text)) {
                    char q[96];
                    snprintf(q, sizeof q, "%s.content[%zu]", p, j);
                    srv_reply_error(rq, 400, q, "'%s' must be {\"type\": \"text\", \"text\": ...} (only text is supported)", q);
                    free(b.p);
                    json_decref(nm);
                    goto fail;
                }
                if (b.len) mu_buf_append(&b, "\n", 1);
                mu_buf_append(&b, json_string_value(text), json_string_length(text));
            }
            json_object_set_new(nm, "content", json_stringn(b.p ? b.p : "", b.len));
            free(b.p);
        } else if (c && !json_is_string(c) && !json_is_null(c)) {
            char q[96];
            snprintf(q, sizeof q, "%s.content", p);
            srv_reply_error(rq, 400, q, "'%s' must be a string or an array of text parts", q);
            json_decref(nm);
            goto fail;
        } else if (!c && r != 3) {
            char q[96];
            snprintf(q, sizeof q, "%s.content", p);
            srv_reply_error(rq, 400, q, "'%s' is required", q);
            json_decref(nm);
            goto fail;
        }
        json_array_append_new(out, nm);
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

void srv_openai_chat(srv_server *srv, const srv_request *rq) {
    json_t *b = api_body(rq);
    if (!b) return;
    static const char *const *const lists[] = {chat_fields, api_common_fields, NULL};
    api_gen g;
    api_gen_init(&g);
    oai_run r = {.srv = srv, .rq = rq, .chat = true, .g = &g, .created = api_created()};
    api_new_id("chatcmpl", r.id, sizeof r.id);
    json_t *msgs = NULL;
    if (!api_check_fields(rq, b, lists) || !api_parse_common(srv, rq, b, API_OPENAI, &g) || !parse_openai(&r, b))
        goto out;
    int64_t top = 0;
    if (!api_get_bool(rq, b, "logprobs", &r.logprobs) || !api_get_int(rq, b, "top_logprobs", 0, 20, &top)) goto out;
    if (top && !r.logprobs) {
        srv_reply_error(rq, 400, "top_logprobs", "'top_logprobs' needs \"logprobs\": true");
        goto out;
    }
    r.top_logprobs = (int)top;
    if (r.logprobs && g.jp.sampling.n_probs < (top ? top : 1)) g.jp.sampling.n_probs = (int32_t)(top ? top : 1);
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) {
            srv_reply_error(rq, 400, "tools", "'tools' must be an array");
            goto out;
        }
        if (json_array_size(tools)) {
            g.tools = json_dumps(tools, JSON_COMPACT);
            g.jp.req.tools_json = g.tools;
        }
    }
    json_t *tc = json_object_get(b, "tool_choice");
    if (tc && !json_is_null(tc) && !json_is_string(tc) && !json_is_object(tc)) {
        srv_reply_error(rq, 400, "tool_choice", "'tool_choice' must be a string or an object");
        goto out;
    }
    bool ptc = false;
    if (!api_get_bool(rq, b, "parallel_tool_calls", &ptc)) goto out;
    msgs = api_messages(rq, json_object_get(b, "messages"));
    if (!msgs) goto out;
    g.messages = json_dumps(msgs, JSON_COMPACT);
    g.jp.req.messages_json = g.messages;
    run(&r, NULL, true);
out:
    finish(&r);
    json_decref(msgs);
    api_gen_free(&g);
    json_decref(b);
}

/* ------------------------------------------------------------ completions */

void srv_openai_completions(srv_server *srv, const srv_request *rq) {
    json_t *b = api_body(rq);
    if (!b) return;
    static const char *const *const lists[] = {completion_fields, api_common_fields, NULL};
    api_gen g;
    api_gen_init(&g);
    g.jp.req.n_predict = 16; /* OpenAI's default max_tokens for completions */
    oai_run r = {.srv = srv, .rq = rq, .chat = false, .g = &g, .created = api_created()};
    api_new_id("cmpl", r.id, sizeof r.id);
    json_t *prompts = NULL;
    if (!api_check_fields(rq, b, lists) || !api_parse_common(srv, rq, b, API_OPENAI, &g) || !parse_openai(&r, b))
        goto out;
    int64_t lp = -1, best_of = 1;
    bool echo = false;
    if (!api_get_int(rq, b, "logprobs", 0, 20, &lp) || !api_get_bool(rq, b, "echo", &echo) ||
        !api_get_int(rq, b, "best_of", 1, OAI_MAX_N, &best_of))
        goto out;
    if (echo) {
        srv_reply_error(rq, 400, "echo", "'echo' is not supported");
        goto out;
    }
    if (best_of != 1 && best_of != g.n) {
        srv_reply_error(rq, 400, "best_of", "'best_of' other than 1 or n is not supported");
        goto out;
    }
    json_t *suffix = json_object_get(b, "suffix");
    if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && !json_string_length(suffix))) {
        srv_reply_error(rq, 400, "suffix", "'suffix' is not supported");
        goto out;
    }
    if (lp >= 0) {
        r.logprobs = true;
        r.top_logprobs = (int)lp;
        if (g.jp.sampling.n_probs < (lp ? lp : 1)) g.jp.sampling.n_probs = (int32_t)(lp ? lp : 1);
    }
    /* prompt: "text", [ids], ["text", ...] or [[ids], ...] */
    json_t *p = json_object_get(b, "prompt");
    if (!p || json_is_null(p)) {
        srv_reply_error(rq, 400, "prompt", "'prompt' is required");
        goto out;
    }
    json_t *first = json_array_get(p, 0);
    if (json_is_array(p) && (json_is_string(first) || json_is_array(first))) {
        prompts = json_incref(p);
    } else {
        prompts = json_array();
        json_array_append(prompts, p);
    }
    run(&r, prompts, false);
out:
    finish(&r);
    json_decref(prompts);
    api_gen_free(&g);
    json_decref(b);
}
