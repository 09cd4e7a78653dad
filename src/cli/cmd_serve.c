/* muser serve: the OpenAI- and llama.cpp-compatible HTTP server
 * (src/server/server.h, docs/server.md). This file has the options
 * (llama-server's names), the loopback rule for API keys, loading and the
 * signals; src/server does the rest. */
#include "cli.h"
#include "muser.h"
#include "server/server.h"
#include "util/common.h"
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: muser serve [-m MODEL] [options]\n\n"
            "  -m, --model FILE        Muse Glimmer GGUF (default: $MUSER_MODEL, else the shipped\n"
            "                          models/glimmer-tiny-q4_k_xl.gguf)\n"
            "  --host ADDR             address to listen on (default 127.0.0.1); any other than a\n"
            "                          loopback address needs an API key\n"
            "  --port N                port (default 8080; 0 = any free port, printed)\n"
            "  -np, --parallel N       slots: requests generating at once (default 4)\n"
            "  -c, --ctx-size N        context of each slot (default: the model's training context)\n"
            "  -b, --batch-size N      most rows in one batched forward (default 512)\n"
            "  --prefill-budget N      most prompt rows in a forward that also decodes for other\n"
            "                          requests: bounds their inter-token latency while a prompt is\n"
            "                          prefilled (0 = no bound; default 16 on CPU, 0 on CUDA)\n"
            "  --max-queue N           requests waiting for a slot before 429 (default 64)\n"
            "  --max-body BYTES        largest request body before 413 (default 8388608)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' (or 'x-api-key: KEY')\n"
            "  --api-key-file FILE     the same, the key being the first line of FILE\n"
            "  --ssl-cert-file FILE    serve HTTPS with this PEM certificate (with --ssl-key-file)\n"
            "  --ssl-key-file FILE     PEM private key of the certificate\n"
            "  -a, --alias NAME        model id reported by /v1/models (default: the file name)\n"
            "  --draft FILE            DFlash assistant GGUF: a request running alone decodes speculatively\n"
            "                          (the same tokens as plain decoding; an adaptive gate keeps it only\n"
            "                          where it pays); requests side by side go through batched steps\n"
            "  --verify-len N          proposals per speculative round: 3, 7 or 15 (default 15; --draft-max)\n"
            "  --spec-always           speculate every step of a lone request (no gate)\n"
            "  --spec-chain            verify the proposals as one chain (default: a token tree; --spec-tree)\n"
            "  --backend NAME          ref | cpu | cuda | auto (default auto)\n"
            "  -t, --threads N         threads (default: all cores)\n"
            "  --sampling-threads N    threads drawing the slots' tokens after each step (default: on\n"
            "                          CUDA with rows of 65,536+ logits one per slot up to the cores\n"
            "                          and 8; else 1)\n"
            "  --slot-save-path DIR    where POST /slots/{id}?action=save|restore keep slot files: kvpack\n"
            "                          packs (docs/kvpack.md; key $MUSER_KVPACK_KEY or DIR/kvpack.key)\n"
            "  --prompt-cache DIR      kvpack store of prompt prefixes shared across restarts and processes:\n"
            "                          a new prompt restores its longest stored prefix (its whole self, or a\n"
            "                          multiple of 256 tokens) instead of prefilling it; prefilled prompts\n"
            "                          publish their packs (docs/kvpack.md)\n"
            "  --prompt-cache-max-size BYTES  evict least recently used packs down to this size (default: none)\n"
            "  --compress MODE         kvpack files the server writes: none (default), zstd or zstd:LEVEL\n\n"
            "Routes: GET / (chat page), /health, /v1/models, /props, /slots, /metrics;\n"
            "POST /v1/completions, /v1/chat/completions, /completion, /tokenize, /detokenize,\n"
            "/apply-template, /slots/{id}?action=erase|save|restore. SIGTERM / SIGINT stop gracefully.\n");
}

static srv_server *g_srv;
static void on_signal(int sig) {
    (void)sig;
    if (g_srv) g_srv->stopping = 1;
}


int cmd_serve(int argc, char **argv) {
    srv_params p = {.host = "127.0.0.1", .port = 8080, .n_parallel = 4, .n_batch = 512, .prefill_budget = -1,
                    .max_queue = 64,
                    .max_body = 8u << 20};
    const char *key_file = NULL;
    char *key_buf = NULL;
    int64_t verify_len = MUSER_SPEC_VERIFY_LEN_DEFAULT;
    bool spec_always = false, spec_tree = MUSER_SPEC_TREE_DEFAULT;
    int zstd_level = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int64_t x = 0;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { serve_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("serve", argc, argv, &i, &p.model_path);
        else if (!strcmp(a, "--host")) ok = cli_value("serve", argc, argv, &i, &p.host);
        else if (!strcmp(a, "--port")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 0, 65535, &x);
            p.port = (int)x;
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 1, 256, &x);
            p.n_parallel = (int32_t)x;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 0, 1 << 24, &p.n_ctx);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size"))
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 1, 65536, &p.n_batch);
        else if (!strcmp(a, "--prefill-budget"))
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 0, 65536, &p.prefill_budget);
        else if (!strcmp(a, "--max-queue")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 1, 1 << 20, &x);
            p.max_queue = (int32_t)x;
        } else if (!strcmp(a, "--max-body")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 1024, (int64_t)1 << 32, &x);
            p.max_body = (size_t)x;
        } else if (!strcmp(a, "--api-key")) ok = cli_value("serve", argc, argv, &i, &p.api_key);
        else if (!strcmp(a, "--api-key-file")) ok = cli_value("serve", argc, argv, &i, &key_file);
        else if (!strcmp(a, "--ssl-cert-file")) ok = cli_value("serve", argc, argv, &i, &p.ssl_cert_file);
        else if (!strcmp(a, "--ssl-key-file")) ok = cli_value("serve", argc, argv, &i, &p.ssl_key_file);
        else if (!strcmp(a, "-a") || !strcmp(a, "--alias")) ok = cli_value("serve", argc, argv, &i, &p.alias);
        else if (!strcmp(a, "--draft") || !strcmp(a, "-md") || !strcmp(a, "--model-draft"))
            ok = cli_value("serve", argc, argv, &i, &p.draft_path);
        else if (!strcmp(a, "--verify-len") || !strcmp(a, "--draft-max"))
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_verify_len("serve", v, &verify_len);
        else if (!strcmp(a, "--spec-always")) spec_always = true;
        else if (!strcmp(a, "--spec-tree")) spec_tree = true;
        else if (!strcmp(a, "--spec-chain")) spec_tree = false;
        else if (!strcmp(a, "--slot-save-path")) ok = cli_value("serve", argc, argv, &i, &p.slot_save_path);
        else if (!strcmp(a, "--prompt-cache")) ok = cli_value("serve", argc, argv, &i, &p.prompt_cache);
        else if (!strcmp(a, "--prompt-cache-max-size"))
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_u64("serve", a, v, &p.prompt_cache_quota);
        else if (!strcmp(a, "--compress"))
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_compress("serve", v, &zstd_level);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 1, 1024, &x);
            p.n_threads = (int)x;
        } else if (!strcmp(a, "--sampling-threads")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_i64("serve", a, v, 1, 256, &x);
            p.sampling_threads = (int32_t)x;
        } else if (!strcmp(a, "--backend")) {
            ok = cli_value("serve", argc, argv, &i, &v) && cli_parse_backend("serve", v, &p.backend);
        } else {
            fprintf(stderr, "muser serve: unknown option '%s' (see muser serve --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (p.api_key && key_file) {
        fprintf(stderr, "muser serve: give --api-key or --api-key-file, not both\n");
        return 2;
    }
    if (key_file) {
        size_t len = 0;
        key_buf = cli_read_file("serve", key_file, &len);
        if (!key_buf) return 2;
        key_buf[strcspn(key_buf, "\r\n")] = 0;
        p.api_key = key_buf;
    }
    if (p.api_key && !p.api_key[0]) {
        fprintf(stderr, "muser serve: the API key is empty\n");
        free(key_buf);
        return 2;
    }
    if (!!p.ssl_cert_file != !!p.ssl_key_file) {
        fprintf(stderr, "muser serve: --ssl-cert-file and --ssl-key-file go together\n");
        free(key_buf);
        return 2;
    }
    if (!p.api_key && !srv_host_is_loopback(p.host)) {
        fprintf(stderr,
                "muser serve: refusing to listen on %s without an API key: anyone who can reach it could use the "
                "server (give --api-key or --api-key-file, or --host 127.0.0.1)\n",
                p.host);
        free(key_buf);
        return 2;
    }
    if (!cli_model_or_default("serve", &p.model_path)) {
        free(key_buf);
        return 2;
    }

    srv_server srv = {.p = p, .t_start = mu_now()};
    muser_error err = {{0}};
    muser_model_params mp = {.backend = p.backend, .n_threads = p.n_threads};
    srv.model = muser_model_load(p.model_path, &mp, &err);
    if (!srv.model) {
        cli_error("serve", err.msg);
        free(key_buf);
        return 1;
    }
    muser_model_get_info(srv.model, &srv.info);
    if (!muser_model_has_tokenizer(srv.model)) {
        fprintf(stderr, "muser serve: %s has no tokenizer: the server needs one\n", p.model_path);
        muser_model_free(srv.model);
        free(key_buf);
        return 1;
    }
    muser_draft *draft = NULL;
    if (p.draft_path && !(draft = muser_draft_load(p.draft_path, srv.model, &err))) {
        cli_error("serve", err.msg);
        muser_model_free(srv.model);
        free(key_buf);
        return 1;
    }
    if (!srv.p.n_ctx || srv.p.n_ctx > srv.info.n_ctx_train) srv.p.n_ctx = srv.info.n_ctx_train;
    const char *base = strrchr(p.model_path, '/');
    base = base ? base + 1 : p.model_path;
    snprintf(srv.model_id, sizeof srv.model_id, "%s", p.alias ? p.alias : base);

    /* On a CPU every prompt row costs about what a decode row does, so a 200-token prompt
     * in one forward would stall every generating stream for that long; a GPU's forward
     * costs nearly the same at 16 rows as at 512, and bounding it only delays the prompt. */
    if (srv.p.prefill_budget < 0) srv.p.prefill_budget = strcmp(srv.info.backend, "cuda") ? 16 : 0;
    srv_sched_params sp = {.n_slots = srv.p.n_parallel, .n_ctx = srv.p.n_ctx, .n_batch = srv.p.n_batch,
                           .prefill_budget = srv.p.prefill_budget,
                           .max_queue = srv.p.max_queue, .draft = draft, .verify_len = (int)verify_len,
                           .spec_always = spec_always, .spec_tree = spec_tree, .zstd_level = zstd_level,
                           .prompt_cache = srv.p.prompt_cache, .prompt_cache_quota = srv.p.prompt_cache_quota,
                           .draw_threads = srv.p.sampling_threads};
    srv.sched = srv_sched_create(srv.model, &sp, &err);
    if (!srv.sched) {
        cli_error("serve", err.msg);
        muser_draft_free(draft);
        muser_model_free(srv.model);
        free(key_buf);
        return 1;
    }
    g_srv = &srv;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = srv_http_run(&srv, &err);
    if (rc) cli_error("serve", err.msg);
    g_srv = NULL;
    if (srv.sched) srv_sched_free(srv.sched, false);
    muser_draft_free(draft);
    muser_model_free(srv.model);
    free(key_buf);
    if (!rc) fprintf(stderr, "muser serve: stopped\n");
    return rc;
}
