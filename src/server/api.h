/* Helpers shared by the route handlers (api_openai.c, api_llama.c,
 * metrics.c, ui.c): strict JSON input (every field named in its error),
 * the sampling fields common to the OpenAI and llama.cpp routes, running
 * jobs, and the JSON pieces of the replies (logprobs, usage). Every
 * function that can fail has replied with the error when it returns
 * false / NULL, so a handler just returns. */
#ifndef MUSER_SERVER_API_H
#define MUSER_SERVER_API_H
#include "server/server.h"

/* The request body as a JSON object (400 naming line and column otherwise). */
json_t *api_body(const srv_request *rq);
/* Every key of o must be in one of the NULL-terminated lists (400 naming the first that is not). */
bool api_check_fields(const srv_request *rq, json_t *o, const char *const *const *lists);

/* Typed fields: absent or null leaves *out as it is; a wrong type or a value
 * outside [lo, hi] is a 400 naming the field. */
bool api_get_int(const srv_request *rq, json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out);
bool api_get_num(const srv_request *rq, json_t *o, const char *key, double lo, double hi, double *out);
bool api_get_float(const srv_request *rq, json_t *o, const char *key, double lo, double hi, float *out);
bool api_get_bool(const srv_request *rq, json_t *o, const char *key, bool *out);
bool api_get_str(const srv_request *rq, json_t *o, const char *key, const char **out);

/* A generation request as the routes build it. */
typedef struct api_gen {
    srv_job_params jp;
    bool stream, include_usage;
    int n;                      /* choices (OpenAI n) */
    /* owned storage that jp points into */
    muser_logit_bias *bias;
    char *schema, *samplers, *messages, *tools, *text;
    const char *schema_key;     /* the field the schema came from (for errors) */
    int32_t *tokens;
    const char *stops[MU_GEN_MAX_STOPS];
    const char *breakers[32];
} api_gen;

/* Flavours of the common fields. */
#define API_OPENAI 1            /* OpenAI ranges (temperature <= 2, ...) */
#define API_LLAMA 2

/* Defaults (llama.cpp's sampling, cache_prompt on, any slot, n = 1). */
void api_gen_init(api_gen *g);
void api_gen_free(api_gen *g);
/* The sampling / stop / slot fields both APIs share (api_common_fields). */
extern const char *const api_common_fields[];
bool api_parse_common(srv_server *srv, const srv_request *rq, json_t *body, int flavour, api_gen *g);
/* A prompt given as a string or an array of token ids; `key` names it. */
bool api_parse_prompt(srv_server *srv, const srv_request *rq, json_t *v, const char *key, api_gen *g);
/* A JSON value (object or string) as JSON Schema text into g->schema; key names it. */
bool api_set_schema(const srv_request *rq, json_t *v, const char *key, api_gen *g);

/* OpenAI messages checked and made ready for the chat template (text
 * parts joined, "developer" as "system"); NULL after a 400 naming the field. */
json_t *api_messages(const srv_request *rq, json_t *msgs);

/* Submit; NULL after replying 400 / 429 / 503 (prompt_key names the prompt). */
srv_job *api_submit(srv_server *srv, const srv_request *rq, const api_gen *g, const char *prompt_key);
/* Next event of one of the jobs not yet done (done[i] marks them): false
 * when the client went away (the jobs are cancelled). */
bool api_next(const srv_request *rq, srv_job **jobs, const bool *done, int n, srv_event *ev, int *which);

/* Text of a token / of bytes as a JSON string (invalid UTF-8 becomes U+FFFD). */
json_t *api_text(const char *p, size_t n);
json_t *api_token_text(srv_server *srv, int32_t id);
json_t *api_token_bytes(srv_server *srv, int32_t id);
/* One token's logprob entry: {token, logprob, bytes, top_logprobs: [...]}
 * (with_id adds "id" everywhere: llama.cpp's completion_probabilities). */
json_t *api_logprob(srv_server *srv, const muser_logprob *chosen, const muser_logprob *top, int32_t n_top,
                    bool with_id);
/* "stop" / "length" (OpenAI finish_reason) for a stop reason. */
const char *api_finish_reason(mu_gen_stop st);
/* A job that ended in an error or was cancelled: reply / report it. */
bool api_stop_is_error(mu_gen_stop st);

/* Unix seconds and a fresh id ("chatcmpl-...", "cmpl-..."). */
int64_t api_created(void);
void api_new_id(const char *prefix, char *out, size_t cap);

#endif
