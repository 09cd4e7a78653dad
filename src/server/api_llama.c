/* llama.cpp's server API: POST /completion, /tokenize, /detokenize,
 * /apply-template, GET /props, /slots, POST /slots/{id}?action=...,
 * GET /health (docs/server.md). Request and response shapes follow
 * llama-server's; where muser has no counterpart the field is refused
 * (request) or left out (response). */
#include "server/api.h"
#include "model/api_internal.h"
#include "util/common.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A float setting as JSON with the digits it was given (0.95, not
 * 0.94999998807907104). */
static json_t *f32(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)x);
    return json_real(strtod(b, NULL));
}

/* The sampling settings as llama-server reports them (generation_settings). */
static json_t *settings_json(srv_server *srv, const api_gen *g) {
    const muser_sampling_params *sp = &g->jp.sampling;
    json_t *o = json_object();
    json_object_set_new(o, "n_predict", json_integer(g->jp.req.n_predict));
    json_object_set_new(o, "seed", json_integer(sp->seed));
    json_object_set_new(o, "temperature", f32(sp->temp));
    json_object_set_new(o, "dynatemp_range", f32(sp->dynatemp_range));
    json_object_set_new(o, "dynatemp_exponent", f32(sp->dynatemp_exponent));
    json_object_set_new(o, "top_k", json_integer(sp->top_k));
    json_object_set_new(o, "top_p", f32(sp->top_p));
    json_object_set_new(o, "min_p", f32(sp->min_p));
    json_object_set_new(o, "top_n_sigma", f32(sp->top_n_sigma));
    json_object_set_new(o, "xtc_probability", f32(sp->xtc_probability));
    json_object_set_new(o, "xtc_threshold", f32(sp->xtc_threshold));
    json_object_set_new(o, "typical_p", f32(sp->typ_p));
    json_object_set_new(o, "repeat_last_n", json_integer(sp->penalty_last_n));
    json_object_set_new(o, "repeat_penalty", f32(sp->penalty_repeat));
    json_object_set_new(o, "presence_penalty", f32(sp->penalty_present));
    json_object_set_new(o, "frequency_penalty", f32(sp->penalty_freq));
    json_object_set_new(o, "dry_multiplier", f32(sp->dry_multiplier));
    json_object_set_new(o, "dry_base", f32(sp->dry_base));
    json_object_set_new(o, "dry_allowed_length", json_integer(sp->dry_allowed_length));
    json_object_set_new(o, "dry_penalty_last_n", json_integer(sp->dry_penalty_last_n));
    json_object_set_new(o, "mirostat", json_integer(sp->mirostat));
    json_object_set_new(o, "mirostat_tau", f32(sp->mirostat_tau));
    json_object_set_new(o, "mirostat_eta", f32(sp->mirostat_eta));
    json_t *stop = json_array();
    for (int i = 0; i < g->jp.req.n_stops; i++) json_array_append_new(stop, api_text(g->stops[i], strlen(g->stops[i])));
    json_object_set_new(o, "stop", stop);
    json_object_set_new(o, "ignore_eos", json_boolean(sp->ignore_eos));
    json_object_set_new(o, "stream", json_boolean(g->stream));
    json_object_set_new(o, "n_probs", json_integer(sp->n_probs));
    json_object_set_new(o, "min_keep", json_integer(sp->min_keep));
    json_object_set_new(o, "grammar", json_string(sp->grammar ? sp->grammar : ""));
    json_object_set_new(o, "cache_prompt", json_boolean(g->jp.cache_prompt));
    json_object_set_new(o, "id_slot", json_integer(g->jp.slot));
    json_object_set_new(o, "n_ctx", json_integer(srv->p.n_ctx));
    return o;
}

/* ------------------------------------------------------------ /completion */

static const char *stop_type(mu_gen_stop st) {
    switch (st) {
    case MU_GEN_STOP_EOG:
    case MU_GEN_STOP_GRAMMAR: return "eos";
    case MU_GEN_STOP_STRING: return "word";
    case MU_GEN_STOP_LENGTH:
    case MU_GEN_STOP_CONTEXT: return "limit";
    default: return "none";
    }
}

static json_t *timings_json(const mu_gen_result *r, int64_t cached) {
    json_t *t = json_object();
    double pms = r->t_prefill * 1e3, dms = r->t_decode * 1e3;
    int64_t pn = r->n_prompt - cached;
    json_object_set_new(t, "cache_n", json_integer(cached));
    json_object_set_new(t, "prompt_n", json_integer(pn));
    json_object_set_new(t, "prompt_ms", json_real(pms));
    json_object_set_new(t, "prompt_per_token_ms", json_real(pn > 0 ? pms / (double)pn : 0));
    json_object_set_new(t, "prompt_per_second", json_real(pms > 0 ? 1e3 * (double)pn / pms : 0));
    json_object_set_new(t, "predicted_n", json_integer(r->n_tokens));
    json_object_set_new(t, "predicted_ms", json_real(dms));
    json_object_set_new(t, "predicted_per_token_ms", json_real(r->n_tokens > 0 ? dms / (double)r->n_tokens : 0));
    json_object_set_new(t, "predicted_per_second", json_real(dms > 0 ? 1e3 * (double)r->n_tokens / dms : 0));
    return t;
}

/* The closing object: stop, counts, timings, settings (and, when not
 * streaming, the whole content and probabilities). */
static json_t *final_json(srv_server *srv, const api_gen *g, srv_job *j, bool whole) {
    const mu_gen_result *r = srv_job_result(j);
    int64_t cached = srv_job_cached(j);
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(0));
    json_object_set_new(o, "content", whole ? api_text(r->text, r->text_len) : json_string(""));
    json_t *toks = json_array();
    for (int64_t i = 0; whole && i < r->n_tokens; i++) json_array_append_new(toks, json_integer(r->tokens[i]));
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "id_slot", json_integer(srv_job_slot(j)));
    json_object_set_new(o, "stop", json_true());
    json_object_set_new(o, "model", json_string(srv->model_id));
    json_object_set_new(o, "tokens_predicted", json_integer(r->n_tokens));
    json_object_set_new(o, "tokens_evaluated", json_integer(r->n_prompt));
    api_gen shown = *g;
    shown.jp.sampling.seed = srv_job_seed(j);
    json_object_set_new(o, "generation_settings", settings_json(srv, &shown));
    if (g->text) json_object_set_new(o, "prompt", api_text(g->text, g->jp.req.text_len));
    json_object_set_new(o, "has_new_line", json_boolean(r->text_len && memchr(r->text, '\n', r->text_len)));
    json_object_set_new(o, "truncated", json_false());
    json_object_set_new(o, "stop_type", json_string(stop_type(r->stop)));
    json_object_set_new(o, "stopping_word", json_string(""));
    json_object_set_new(o, "tokens_cached", json_integer(cached));
    json_object_set_new(o, "timings", timings_json(r, cached));
    if (whole && r->logprobs) {
        json_t *a = json_array();
        for (int64_t i = 0; i < r->n_tokens; i++) {
            muser_logprob c = {r->tokens[i], r->logprobs[i].logprob};
            json_array_append_new(a, api_logprob(srv, &c, r->top + i * r->n_probs, r->n_probs, true));
        }
        json_object_set_new(o, "completion_probabilities", a);
    }
    return o;
}

void srv_llama_completion(srv_server *srv, const srv_request *rq) {
    json_t *b = api_body(rq);
    if (!b) return;
    static const char *const own[] = {"prompt", "return_tokens", NULL};
    static const char *const *const lists[] = {own, api_common_fields, NULL};
    api_gen g;
    api_gen_init(&g);
    srv_job *j = NULL;
    bool return_tokens = false;
    if (!api_check_fields(rq, b, lists) || !api_parse_common(srv, rq, b, API_LLAMA, &g) ||
        !api_get_bool(rq, b, "return_tokens", &return_tokens) ||
        !api_parse_prompt(srv, rq, json_object_get(b, "prompt"), "prompt", &g))
        goto out;
    j = api_submit(srv, rq, &g, "prompt");
    if (!j) goto out;
    srv_event ev;
    bool done = false;
    int which;
    if (!g.stream) {
        while (!done) {
            if (!api_next(rq, &j, &done, 1, &ev, &which)) {
                srv_reply_error(rq, 400, NULL, "the client closed the connection");
                goto out;
            }
            done = ev.kind == SRV_EV_DONE;
        }
        const mu_gen_result *r = srv_job_result(j);
        if (r->stop == MU_GEN_STOP_CANCELLED) srv_reply_error(rq, 503, NULL, "the request was cancelled");
        else if (r->stop == MU_GEN_STOP_ERROR) srv_reply_error(rq, 500, NULL, "generation failed: %s", r->error);
        else srv_reply_json(rq, 200, final_json(srv, &g, j, true));
        goto out;
    }
    srv_stream *st = srv_stream_begin(rq, 200);
    bool ok = true;
    while (ok && !done) {
        if (!api_next(rq, &j, &done, 1, &ev, &which)) break;
        if (ev.kind == SRV_EV_DONE) {
            done = true;
            const mu_gen_result *r = srv_job_result(j);
            if (api_stop_is_error(r->stop)) {
                json_t *e = json_pack("{s:{s:s,s:s,s:i}}", "error", "message",
                                      r->stop == MU_GEN_STOP_CANCELLED ? "the request was cancelled"
                                                                       : (r->error ? r->error : "generation failed"),
                                      "type", "server_error", "code", r->stop == MU_GEN_STOP_CANCELLED ? 503 : 500);
                ok = srv_stream_send_json(st, e);
            } else {
                ok = srv_stream_send_json(st, final_json(srv, &g, j, false));
            }
            break;
        }
        json_t *o = json_object();
        json_object_set_new(o, "index", json_integer(0));
        json_object_set_new(o, "content", api_text(ev.text, ev.text_len));
        json_t *toks = json_array();
        if (ev.token >= 0) json_array_append_new(toks, json_integer(ev.token));
        json_object_set_new(o, "tokens", toks);
        json_object_set_new(o, "stop", json_false());
        json_object_set_new(o, "id_slot", json_integer(srv_job_slot(j)));
        json_object_set_new(o, "tokens_predicted", json_integer(ev.token >= 0 ? ev.index + 1 : ev.index));
        if (ev.has_logprob && ev.token >= 0) {
            json_t *a = json_array();
            json_array_append_new(a, api_logprob(srv, &ev.logprob, ev.top, ev.n_top, true));
            json_object_set_new(o, "completion_probabilities", a);
        }
        ok = srv_stream_send_json(st, o);
    }
    srv_stream_end(st);
out:
    if (j) srv_job_free(j);
    api_gen_free(&g);
    json_decref(b);
}

/* ------------------------------------------------------------ text */

void srv_llama_tokenize(srv_server *srv, const srv_request *rq) {
    json_t *b = api_body(rq);
    if (!b) return;
    static const char *const own[] = {"content", "add_special", "parse_special", "with_pieces", NULL};
    static const char *const *const lists[] = {own, NULL};
    const char *content = NULL;
    bool add_special = false, parse_special = true, with_pieces = false;
    int32_t *ids = NULL;
    if (!api_check_fields(rq, b, lists) || !api_get_str(rq, b, "content", &content) ||
        !api_get_bool(rq, b, "add_special", &add_special) || !api_get_bool(rq, b, "parse_special", &parse_special) ||
        !api_get_bool(rq, b, "with_pieces", &with_pieces))
        goto out;
    if (!content) {
        srv_reply_error(rq, 400, "content", "'content' is required");
        goto out;
    }
    muser_error err = {{0}};
    int64_t n = muser_tokenize(srv->model, content, json_string_length(json_object_get(b, "content")), add_special,
                               parse_special, &ids, &err);
    if (n < 0) {
        srv_reply_error(rq, 400, "content", "%s", err.msg);
        goto out;
    }
    json_t *a = json_array();
    for (int64_t i = 0; i < n; i++) {
        if (!with_pieces) {
            json_array_append_new(a, json_integer(ids[i]));
            continue;
        }
        char buf[256];
        size_t len = muser_token_piece(srv->model, ids[i], true, buf, sizeof buf);
        if (len > sizeof buf) len = sizeof buf;
        json_t *piece = json_stringn(buf, len);
        if (!piece) piece = api_token_bytes(srv, ids[i]); /* not UTF-8 alone: its bytes, as llama-server */
        json_array_append_new(a, json_pack("{s:i,s:o}", "id", ids[i], "piece", piece));
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", a);
    srv_reply_json(rq, 200, o);
out:
    free(ids);
    json_decref(b);
}

void srv_llama_detokenize(srv_server *srv, const srv_request *rq) {
    json_t *b = api_body(rq);
    if (!b) return;
    static const char *const own[] = {"tokens", NULL};
    static const char *const *const lists[] = {own, NULL};
    api_gen g;
    api_gen_init(&g);
    if (!api_check_fields(rq, b, lists)) goto out;
    json_t *t = json_object_get(b, "tokens");
    if (json_is_array(t) && !json_array_size(t)) {
        srv_reply_json(rq, 200, json_pack("{s:s}", "content", ""));
        goto out;
    }
    if (!api_parse_prompt(srv, rq, t, "tokens", &g)) goto out;
    if (!g.tokens) {
        srv_reply_error(rq, 400, "tokens", "'tokens' must be an array of token ids");
        goto out;
    }
    muser_error err = {{0}};
    size_t len = 0;
    char *text = muser_detokenize(srv->model, g.tokens, (size_t)g.jp.req.n_tokens, false, &len, &err);
    if (!text) {
        srv_reply_error(rq, 400, "tokens", "%s", err.msg);
        goto out;
    }
    json_t *o = json_object();
    json_object_set_new(o, "content", api_text(text, len));
    free(text);
    srv_reply_json(rq, 200, o);
out:
    api_gen_free(&g);
    json_decref(b);
}

void srv_llama_apply_template(srv_server *srv, const srv_request *rq) {
    json_t *b = api_body(rq);
    if (!b) return;
    static const char *const own[] = {"messages", "tools", "add_generation_prompt", NULL};
    static const char *const *const lists[] = {own, NULL};
    json_t *msgs = NULL;
    char *mj = NULL, *tj = NULL;
    bool agp = true;
    if (!api_check_fields(rq, b, lists) || !api_get_bool(rq, b, "add_generation_prompt", &agp)) goto out;
    json_t *tools = json_object_get(b, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        srv_reply_error(rq, 400, "tools", "'tools' must be an array");
        goto out;
    }
    msgs = api_messages(rq, json_object_get(b, "messages"));
    if (!msgs) goto out;
    mj = json_dumps(msgs, JSON_COMPACT);
    if (json_is_array(tools) && json_array_size(tools)) tj = json_dumps(tools, JSON_COMPACT);
    muser_chat_params cp = {.messages_json = mj, .tools_json = tj, .add_generation_prompt = agp};
    muser_error err = {{0}};
    char *prompt = muser_chat_render(srv->model, &cp, &err);
    if (!prompt) {
        srv_reply_error(rq, 400, "messages", "%s", err.msg);
        goto out;
    }
    json_t *o = json_object();
    json_object_set_new(o, "prompt", api_text(prompt, strlen(prompt)));
    free(prompt);
    srv_reply_json(rq, 200, o);
out:
    free(mj);
    free(tj);
    json_decref(msgs);
    json_decref(b);
}

/* ------------------------------------------------------------ state */

void srv_llama_props(srv_server *srv, const srv_request *rq) {
    api_gen g;
    api_gen_init(&g);
    json_t *d = json_object();
    json_object_set_new(d, "id", json_integer(0));
    json_object_set_new(d, "id_task", json_integer(-1));
    json_object_set_new(d, "n_ctx", json_integer(srv->p.n_ctx));
    json_object_set_new(d, "speculative", json_boolean(srv->p.draft_path != NULL));
    json_object_set_new(d, "is_processing", json_false());
    json_object_set_new(d, "params", settings_json(srv, &g));
    json_object_set_new(d, "n_predict", json_integer(-1));
    json_t *o = json_object();
    json_object_set_new(o, "default_generation_settings", d);
    json_object_set_new(o, "total_slots", json_integer(srv->p.n_parallel));
    json_object_set_new(o, "model_path", json_string(srv->p.model_path));
    json_object_set_new(o, "model_alias", json_string(srv->model_id));
    const char *tpl = srv->model->chat_template;
    json_object_set_new(o, "chat_template", tpl ? api_text(tpl, strlen(tpl)) : json_string(""));
    json_object_set_new(o, "chat_template_sha256", json_string(muser_chat_template_sha256(srv->model)));
    int32_t bos = muser_token_bos(srv->model);
    json_object_set_new(o, "bos_token", bos >= 0 ? api_token_text(srv, bos) : json_string(""));
    json_object_set_new(o, "modalities", json_pack("{s:b,s:b}", "vision", 0, "audio", 0));
    json_object_set_new(o, "build_info", json_string("muser " MUSER_VERSION));
    json_object_set_new(o, "backend", json_string(srv->info.backend ? srv->info.backend : ""));
    srv_reply_json(rq, 200, o);
    api_gen_free(&g);
}

#define MAX_SLOTS 1024

void srv_llama_slots(srv_server *srv, const srv_request *rq) {
    srv_sched *s = srv->sched;
    if (!s) {
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
        return;
    }
    srv_slot_info *info = mu_xcalloc(MAX_SLOTS, sizeof *info);
    int32_t n = srv_sched_slots(s, info, MAX_SLOTS);
    json_t *a = json_array();
    for (int32_t i = 0; i < n && i < MAX_SLOTS; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer(info[i].id));
        json_object_set_new(o, "id_task", json_integer(info[i].busy ? (json_int_t)info[i].job_id : -1));
        json_object_set_new(o, "n_ctx", json_integer(info[i].n_ctx));
        json_object_set_new(o, "speculative", json_boolean(srv->p.draft_path != NULL));
        json_object_set_new(o, "is_processing", json_boolean(info[i].busy));
        json_object_set_new(o, "n_cached", json_integer(info[i].n_cached));
        json_object_set_new(o, "n_prompt_tokens", json_integer(info[i].n_prompt));
        json_object_set_new(o, "next_token", json_pack("{s:b,s:I}", "has_next_token", info[i].busy, "n_decoded",
                                                       (json_int_t)info[i].n_decoded));
        json_array_append_new(a, o);
    }
    free(info);
    srv_reply_json(rq, 200, a);
}

/* save / restore: llama-server's {"filename"} body and reply shapes, the
 * file being a kvpack (docs/kvpack.md) in --slot-save-path. */
static void slot_file_action(srv_server *srv, const srv_request *rq, int32_t id, bool save) {
    if (!srv->p.slot_save_path) {
        srv_reply_error(rq, 501, "action", "slot %s needs the server started with --slot-save-path DIR",
                        save ? "save" : "restore");
        return;
    }
    if (!srv->sched) {
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
        return;
    }
    json_t *o = api_body(rq);
    if (!o) return;
    const char *name = json_string_value(json_object_get(o, "filename"));
    if (!name) {
        srv_reply_error(rq, 400, "filename", "'filename' (a string) is required");
        json_decref(o);
        return;
    }
    muser_error err = {{0}};
    int64_t n = 0;
    uint64_t bytes = 0;
    const double t0 = mu_now();
    const bool ok = save ? srv_sched_slot_save(srv->sched, id, srv->p.slot_save_path, name, &n, &bytes, &err)
                         : srv_sched_slot_restore(srv->sched, id, srv->p.slot_save_path, name, &n, &bytes, &err);
    const double ms = (mu_now() - t0) * 1e3;
    if (!ok) {
        /* a busy slot is a conflict; anything about the file or its checks is the request's */
        const int code = strstr(err.msg, "running a request") ? 409 : strstr(err.msg, "No such file") ? 404 : 400;
        srv_reply_error(rq, code, code == 409 ? "id_slot" : "filename", "%s", err.msg);
    } else if (save) {
        srv_reply_json(rq, 200, json_pack("{s:i,s:s,s:I,s:I,s:{s:f}}", "id_slot", (int)id, "filename", name, "n_saved",
                                          (json_int_t)n, "n_written", (json_int_t)bytes, "timings", "save_ms", ms));
    } else {
        srv_reply_json(rq, 200, json_pack("{s:i,s:s,s:I,s:I,s:{s:f}}", "id_slot", (int)id, "filename", name,
                                          "n_restored", (json_int_t)n, "n_read", (json_int_t)bytes, "timings",
                                          "restore_ms", ms));
    }
    json_decref(o);
}

void srv_llama_slot_action(srv_server *srv, const srv_request *rq) {
    const char *idp = rq->path + strlen("/slots/");
    char *end;
    long id = strtol(idp, &end, 10);
    if (!idp[0] || *end || id < 0 || id >= srv->p.n_parallel) {
        srv_reply_error(rq, 400, "id_slot", "slot '%s' does not exist (slots 0..%d)", idp, srv->p.n_parallel - 1);
        return;
    }
    const char *action = srv_query(rq, "action");
    if (!action) {
        srv_reply_error(rq, 400, "action", "'action' is required: ?action=save, restore or erase");
        return;
    }
    if (!strcmp(action, "save") || !strcmp(action, "restore")) {
        slot_file_action(srv, rq, (int32_t)id, !strcmp(action, "save"));
        return;
    }
    if (strcmp(action, "erase")) {
        srv_reply_error(rq, 400, "action", "unknown action '%s': expected save, restore or erase", action);
        return;
    }
    srv_sched *s = srv->sched;
    if (!s) {
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
        return;
    }
    srv_slot_info *info = mu_xcalloc(MAX_SLOTS, sizeof *info);
    int32_t n = srv_sched_slots(s, info, MAX_SLOTS);
    int64_t cached = id < n && id < MAX_SLOTS ? info[id].n_cached : 0;
    free(info);
    muser_error err = {{0}};
    if (!srv_sched_slot_erase(s, (int32_t)id, &err)) {
        srv_reply_error(rq, 409, "id_slot", "%s", err.msg[0] ? err.msg : "the slot is busy");
        return;
    }
    srv_reply_json(rq, 200, json_pack("{s:i,s:I}", "id_slot", (int)id, "n_erased", (json_int_t)cached));
}

void srv_llama_health(srv_server *srv, const srv_request *rq) {
    if (srv->stopping || !srv->sched) {
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
        return;
    }
    srv_reply_json(rq, 200, json_pack("{s:s}", "status", "ok"));
}
