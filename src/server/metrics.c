/* GET /metrics: Prometheus text exposition (version 0.0.4) of the
 * scheduler's counters (srv_sched_stats), under muser's own names and,
 * for routers and dashboards built for vLLM, under vLLM's names with a
 * model_name label (docs/server.md lists both). */
#include "server/api.h"
#include "util/common.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct prom {
    mu_buf b;
    char labels[512];           /* model_name="..." */
} prom;

static void head(prom *p, const char *name, const char *type, const char *help) {
    mu_buf_appendf(&p->b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(prom *p, const char *name, const char *help, double v) {
    head(p, name, "counter", help);
    mu_buf_appendf(&p->b, "%s{%s} %.17g\n", name, p->labels, v);
}

static void gauge(prom *p, const char *name, const char *help, double v) {
    head(p, name, "gauge", help);
    mu_buf_appendf(&p->b, "%s{%s} %.17g\n", name, p->labels, v);
}

static void histogram(prom *p, const char *name, const char *help, const srv_hist *h) {
    head(p, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < SRV_HIST_BUCKETS; i++) {
        cum += h->count[i];
        mu_buf_appendf(&p->b, "%s_bucket{%s,le=\"%g\"} %llu\n", name, p->labels, srv_hist_bounds[i], (unsigned long long)cum);
    }
    cum += h->count[SRV_HIST_BUCKETS];
    mu_buf_appendf(&p->b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name, p->labels, (unsigned long long)cum);
    mu_buf_appendf(&p->b, "%s_sum{%s} %.17g\n", name, p->labels, h->sum);
    mu_buf_appendf(&p->b, "%s_count{%s} %llu\n", name, p->labels, (unsigned long long)h->n);
}

/* A label value: backslash, quote and newline escaped. */
static void label_value(char *dst, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') dst[k++] = '\\', dst[k++] = *s;
        else if (*s == '\n') dst[k++] = '\\', dst[k++] = 'n';
        else dst[k++] = *s;
    }
    dst[k] = 0;
}

void srv_metrics(srv_server *srv, const srv_request *rq) {
    srv_sched *s = srv->sched;
    if (!s) {
        srv_reply_error(rq, 503, NULL, "the server is shutting down");
        return;
    }
    srv_stats st;
    memset(&st, 0, sizeof st);
    srv_sched_stats(s, &st);
    prom p = {0};
    char name[256];
    label_value(name, sizeof name, srv->model_id);
    snprintf(p.labels, sizeof p.labels, "model_name=\"%s\"", name);
    double spec_rate = st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0;

    /* muser's own names */
    counter(&p, "muser_requests_total", "Generation jobs submitted.", (double)st.requests_total);
    counter(&p, "muser_requests_finished_total", "Generation jobs that ran to a stop.", (double)st.requests_finished);
    counter(&p, "muser_requests_cancelled_total", "Generation jobs cancelled (client gone or shutdown).",
            (double)st.requests_cancelled);
    counter(&p, "muser_requests_refused_total", "Generation jobs refused (invalid, queue full, shutdown).",
            (double)st.requests_refused);
    counter(&p, "muser_prompt_tokens_total", "Prompt tokens of all jobs (cached ones included).",
            (double)st.prompt_tokens_total);
    counter(&p, "muser_prompt_tokens_cached_total", "Prompt tokens taken from a slot's cache instead of prefilled.",
            (double)st.cached_tokens_total);
    counter(&p, "muser_generation_tokens_total", "Tokens generated.", (double)st.generation_tokens_total);
    counter(&p, "muser_steps_total", "Batched forward steps of the engine.", (double)st.steps_total);
    counter(&p, "muser_step_seconds_total", "Time in the engine's batched forward steps.", st.step_seconds);
    counter(&p, "muser_take_seconds_total",
            "Time after the steps handing rows to requests: sampling, detokenizing, events.", st.take_seconds);
    gauge(&p, "muser_slots_total", "Slots (sequences generating at once).", st.n_slots);
    gauge(&p, "muser_slots_busy", "Slots running a job.", st.running);
    gauge(&p, "muser_slot_occupancy_ratio", "Busy slots over all slots.", st.n_slots ? (double)st.running / st.n_slots : 0);
    gauge(&p, "muser_requests_waiting", "Jobs waiting for a slot.", st.waiting);
    gauge(&p, "muser_kv_cache_usage_ratio", "KV positions held over the capacity of all slots.", st.kv_usage);
    gauge(&p, "muser_slot_context_tokens", "Context of each slot in tokens.", (double)st.n_ctx);
    histogram(&p, "muser_time_to_first_token_seconds", "Time from submission to the first token.", &st.ttft);
    histogram(&p, "muser_inter_token_latency_seconds", "Time between consecutive tokens of a job.", &st.itl);
    histogram(&p, "muser_request_latency_seconds", "Time from submission to the end of a job.", &st.e2e);
    counter(&p, "muser_spec_drafted_tokens_total", "Tokens proposed by the speculative assistant.",
            (double)st.spec_drafted);
    counter(&p, "muser_spec_accepted_tokens_total", "Proposed tokens the target accepted.", (double)st.spec_accepted);
    counter(&p, "muser_chain_tokens_total", "Tokens a lone greedy request decoded on the greedy chain.",
            (double)st.chain_tokens);
    gauge(&p, "muser_spec_acceptance_ratio", "Accepted over proposed speculative tokens (0 without proposals).",
          spec_rate);
    counter(&p, "muser_prompt_cache_store_hits_total",
            "Prompts that restored a prefix from the --prompt-cache store instead of prefilling it.", (double)st.store_hits);
    counter(&p, "muser_prompt_cache_store_tokens_total", "Prompt tokens restored from the --prompt-cache store.",
            (double)st.store_tokens);
    counter(&p, "muser_prompt_cache_store_packs_written_total", "Packs the server published to its --prompt-cache store.",
            (double)st.store_written);
    counter(&p, "muser_prompt_cache_store_packs_dropped_total",
            "Packs not written because the writer's queue was full.", (double)st.store_dropped);
    counter(&p, "muser_prompt_cache_store_errors_total", "Store packs refused on restore, or that failed to be written.",
            (double)st.store_errors);
    gauge(&p, "muser_uptime_seconds", "Seconds since the server started.", mu_now() - srv->t_start);

    /* vLLM's names, for routers that balance replicas by them */
    gauge(&p, "vllm:num_requests_running", "Number of requests in model execution batches.", st.running);
    gauge(&p, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", st.waiting);
    gauge(&p, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.kv_usage);
    gauge(&p, "vllm:gpu_cache_usage_perc", "KV-cache usage (older name). 1 means 100 percent usage.", st.kv_usage);
    head(&p, "vllm:cache_config_info", "gauge", "Information of the KV cache configuration (one block per token).");
    mu_buf_appendf(&p.b, "vllm:cache_config_info{%s,block_size=\"1\",num_gpu_blocks=\"%lld\",num_cpu_blocks=\"0\","
                         "cache_dtype=\"f16\",enable_prefix_caching=\"True\",num_slots=\"%d\"} 1\n",
        p.labels, (long long)(st.n_ctx * st.n_slots), st.n_slots);
    counter(&p, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", (double)st.prompt_tokens_total);
    counter(&p, "vllm:generation_tokens_total", "Number of generation tokens processed.",
            (double)st.generation_tokens_total);
    counter(&p, "vllm:request_success_total", "Count of successfully processed requests.",
            (double)st.requests_finished);
    histogram(&p, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", &st.ttft);
    histogram(&p, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", &st.itl);
    histogram(&p, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", &st.itl);
    histogram(&p, "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", &st.e2e);
    counter(&p, "vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", (double)st.spec_drafted);
    counter(&p, "vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", (double)st.spec_accepted);

    srv_reply_text(rq, 200, "text/plain; version=0.0.4; charset=utf-8", p.b.p ? p.b.p : "", p.b.len);
    free(p.b.p);
}
