/* muser run: prompt (token ids, text or chat) -> streamed generation.
 * A thin client of the request loop in src/gen/gen.h (sampling, stop
 * strings, streaming text, logprobs, speculation): this file has the
 * options, the printing and the JSON. Tokens come from the llama.cpp
 * sampler chain (optionally constrained by a grammar or JSON Schema,
 * run_sampling.c has the options). Generation stops on an end-of-generation
 * token, a --stop string, a finished grammar, -n tokens or a full context.
 * --chat keeps a multi-turn conversation rendered with the model's chat
 * template, dropping the oldest turns when the context fills. */
#include "cli.h"
#include "gen/gen.h"
#include "muser.h"
#include "run_sampling.h"
#include "util/common.h"
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOPS MU_GEN_MAX_STOPS

typedef struct run_opts {
    const char *model, *draft, *dump, *prompt, *prompt_file, *system, *prompt_cache;
    const char *stops[MAX_STOPS];
    int n_stops;
    int32_t *tokens;
    int64_t n_tokens, n_predict, threads, ctx, chunk, verify_len;
    int zstd_level;                 /* --compress: the prompt cache's packs */
    uint64_t cache_quota;           /* --prompt-cache-max-size: LRU eviction after each pack (0: none) */
    run_sampling sampling;
    bool chat, json, verbose, no_draft, spec_always, spec_tree, mlock;
    muser_backend_kind backend;
} run_opts;

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: muser run -m MODEL (-p TEXT | -f FILE | --tokens IDS | --chat) [options]\n\n"
            "  -m, --model FILE       Muse Glimmer GGUF (default: $MUSER_MODEL, else the shipped\n"
            "                         models/glimmer-tiny-q4_k_xl.gguf)\n"
            "  -p, --prompt TEXT      prompt text (tokenized with the model's tokenizer, BOS as the model asks)\n"
            "  -f, --file FILE        read the prompt text from FILE\n"
            "  --tokens IDS           prompt as comma-separated token ids\n"
            "  --system TEXT          system message; the prompt then goes through the chat template\n"
            "  --chat                 interactive multi-turn chat with the model's template\n"
            "                         (/exit quits, /reset forgets, Ctrl-C stops the current reply)\n"
            "  -n, --n-predict N      maximum tokens to generate (default 128)\n"
            "  --stop TEXT            stop when the output contains TEXT (repeatable, up to %d)\n"
            "  -t, --threads N        threads (default: all cores)\n"
            "  -c, --ctx-size N       context length (default: model's, capped at 4096)\n"
            "  --chunk N              prefill rows per forward call (default 512; cuda 2048, fewer deep in a context)\n"
            "  --backend NAME         ref | cpu | cuda | auto (default auto)\n"
            "  --mlock                keep the model's pages locked in RAM\n"
            "  --json                 print one JSON object: prompt and generated ids, text, seed, sampler\n"
            "                         chain, timings (and logprobs with --n-probs N)\n"
            "  -v, --verbose          print the sampler parameters and chain to stderr\n"
            "  --dump-logits FILE     write every step's f32 logits (prompt's last row, then each decode step)\n"
            "  --prompt-cache DIR     kvpack store (docs/kvpack.md): restore the longest stored prefix of the\n"
            "                         prompt, prefill only the rest, store packs for later runs; key file\n"
            "                         $MUSER_KVPACK_KEY or DIR/kvpack.key (made on first use); with an assistant\n"
            "                         its context is in the packs too\n"
            "  --compress MODE        packs the prompt cache writes: none (default), zstd or zstd:LEVEL\n"
            "  --prompt-cache-max-size BYTES  evict least recently used packs down to this size after each\n"
            "                         pack written (default: no quota)\n\n"
            "speculative decoding (output identical to plain decoding, only faster or not):\n"
            "  --draft FILE           DFlash assistant GGUF for the model (default without -m: $MUSER_DRAFT,\n"
            "                         else the shipped models/glimmer-tiny-dflash-q4_k_xl.gguf)\n"
            "  --no-draft             decode without the assistant\n"
            "  --verify-len N         proposals per round: 3, 7 or 15 (default 15)\n"
            "  --spec-chain           verify them as one chain (default: a token tree, docs/speculative.md\n"
            "                         \"Token trees\"; --spec-tree)\n"
            "  --spec-always          speculate every step (default: an adaptive gate falls back to plain\n"
            "                         steps while speculation is slower or rarely accepted)\n",
            MAX_STOPS);
    run_sampling_usage(f);
}

static int parse(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.n_predict = 128, .verify_len = MUSER_SPEC_VERIFY_LEN_DEFAULT, .spec_tree = MUSER_SPEC_TREE_DEFAULT};
    run_sampling_init(&o->sampling);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        int taken = run_sampling_option(&o->sampling, argc, argv, &i);
        if (taken < 0) return 2;
        if (taken) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { run_usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("run", argc, argv, &i, &o->model);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) ok = cli_value("run", argc, argv, &i, &o->prompt);
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) ok = cli_value("run", argc, argv, &i, &o->prompt_file);
        else if (!strcmp(a, "--system")) ok = cli_value("run", argc, argv, &i, &o->system);
        else if (!strcmp(a, "--dump-logits")) ok = cli_value("run", argc, argv, &i, &o->dump);
        else if (!strcmp(a, "--prompt-cache")) ok = cli_value("run", argc, argv, &i, &o->prompt_cache);
        else if (!strcmp(a, "--compress"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_compress("run", v, &o->zstd_level);
        else if (!strcmp(a, "--prompt-cache-max-size"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_u64("run", a, v, &o->cache_quota);
        else if (!strcmp(a, "--draft")) ok = cli_value("run", argc, argv, &i, &o->draft);
        else if (!strcmp(a, "--no-draft")) o->no_draft = true;
        else if (!strcmp(a, "--spec-always")) o->spec_always = true;
        else if (!strcmp(a, "--spec-tree")) o->spec_tree = true;
        else if (!strcmp(a, "--spec-chain")) o->spec_tree = false;
        else if (!strcmp(a, "--verify-len"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_verify_len("run", v, &o->verify_len);
        else if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--mlock")) o->mlock = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o->verbose = true;
        else if (!strcmp(a, "--stop")) {
            ok = cli_value("run", argc, argv, &i, &v);
            if (ok && (o->n_stops == MAX_STOPS || !v[0])) {
                fprintf(stderr, "muser run: --stop needs non-empty text, at most %d times\n", MAX_STOPS);
                ok = false;
            } else if (ok) o->stops[o->n_stops++] = v;
        } else if (!strcmp(a, "--tokens"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_ids("run", "--tokens", v, &o->tokens, &o->n_tokens);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 0, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--chunk"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 65536, &o->chunk);
        else if (!strcmp(a, "--backend"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_backend("run", v, &o->backend);
        else {
            fprintf(stderr, "muser run: unknown option '%s' (see muser run --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (o->draft && o->no_draft) { fprintf(stderr, "muser run: --draft and --no-draft exclude each other\n"); return 2; }
    /* the default pair (a prompt cache then stores the assistant's context in its packs too) */
    if (!o->draft && !o->no_draft && !o->model) o->draft = cli_default_draft();
    if (!cli_model_or_default("run", &o->model)) return 2;
    int sources = (o->prompt != NULL) + (o->prompt_file != NULL) + (o->tokens != NULL);
    if (sources > 1 || (o->chat && sources)) {
        fprintf(stderr, "muser run: give one of -p, -f, --tokens or --chat\n");
        return 2;
    }
    if (!sources && !o->chat) { fprintf(stderr, "muser run: give a prompt (-p, -f, --tokens) or --chat\n"); return 2; }
    if (o->chat && o->json) { fprintf(stderr, "muser run: --json does not combine with --chat\n"); return 2; }
    if (!run_sampling_finish(&o->sampling)) return 2;
    return -1;
}

/* ---------------- one generation ---------------- */

static volatile sig_atomic_t g_interrupted;
static void on_sigint(int sig) { (void)sig; g_interrupted = 1; }

typedef struct run_state {
    const run_opts *o;
    muser_model *m;
    muser_session *s;
    muser_model_info info;
    mu_gen *gen;
    muser_draft *draft;   /* NULL: plain decoding */
    muser_kvstore *cache; /* --prompt-cache */
    muser_spec *sp;
    mu_gen_seq seq;       /* tokens in the session (the chat reuses their prefix) */
    FILE *dump;
    bool dump_failed;
} run_state;

/* Each drawn token: its row to --dump-logits, its final text (or its id,
 * for a model without tokenizer) to stdout. false stops the request. */
static bool on_event(void *user, const mu_gen_event *ev) {
    run_state *r = user;
    if (ev->row && r->dump && !r->dump_failed &&
        fwrite(ev->row, sizeof(float), (size_t)r->info.n_vocab, r->dump) != (size_t)r->info.n_vocab)
        r->dump_failed = true;
    if (!r->o->json) {
        if (ev->text_len) fwrite(ev->text, 1, ev->text_len, stdout);
        else if (ev->token >= 0 && !muser_model_has_tokenizer(r->m) && !muser_token_is_eog(r->m, ev->token))
            printf("%s%d", ev->index ? " " : "", ev->token);
        fflush(stdout);
    }
    return !g_interrupted && !r->dump_failed;
}

/* Run a started request; false (message printed) on an error. */
static bool drive(run_state *r) {
    muser_error err;
    g_interrupted = 0;
    bool ok = mu_gen_drive(r->gen, r->s, r->sp, &r->seq, &err);
    if (r->dump_failed) fprintf(stderr, "\nmuser run: writing logits failed\n");
    else if (!ok) fprintf(stderr, "\nmuser run: %s\n", err.msg);
    return ok && !r->dump_failed;
}

static void print_timings(const run_state *r) {
    const mu_gen_result *g = mu_gen_get_result(r->gen);
    if (r->cache)
        fprintf(stderr, "prompt cache: reused %lld of %lld prompt tokens (%.1f KiB of packs read), prefilled %lld\n",
                (long long)g->n_reused, (long long)g->n_prompt,
                g->n_reused ? (double)muser_kvstore_bytes_read(r->cache) / 1024.0 : 0.0, (long long)g->n_prefill);
    fprintf(stderr, "prefill: %lld tokens in %.3f s (%.2f tok/s); decode: %lld tokens in %.3f s (%.2f tok/s); backend %s\n",
            (long long)g->n_prefill, g->t_prefill, g->t_prefill > 0 ? (double)g->n_prefill / g->t_prefill : 0.0,
            (long long)g->n_decoded, g->t_decode, g->n_decoded ? (double)g->n_decoded / g->t_decode : 0.0,
            r->info.backend);
    if (!r->sp) return;
    muser_spec_stats st;
    muser_spec_get_stats(r->sp, &st);
    if (!st.rounds && !st.gate_open) {
        fprintf(stderr, "speculative: gate closed, %lld plain steps (calibration: a %lld-proposal round %.2f ms, "
                "a plain step %.2f ms)\n", (long long)st.plain_steps, (long long)r->o->verify_len,
                st.calib_round_s * 1e3, st.calib_plain_s * 1e3);
        return;
    }
    fprintf(stderr, "speculative: %lld rounds (%.2f tokens each, %lld of %lld proposals accepted), %lld plain steps, "
            "gate closed %lld times\n",
            (long long)st.rounds, st.rounds ? (double)st.round_tokens / (double)st.rounds : 0.0, (long long)st.accepted,
            (long long)st.drafted, (long long)st.plain_steps, (long long)st.gate_closures);
}

/* Why a reply ended early, on stderr (a full context or Ctrl-C are normal ends). */
static void print_end_note(const run_state *r) {
    const mu_gen_result *g = mu_gen_get_result(r->gen);
    if (g->stop == MU_GEN_STOP_CANCELLED) fprintf(stderr, "(interrupted)\n");
    else if (g->stop == MU_GEN_STOP_CONTEXT)
        fprintf(stderr, "(context full: the %lld-token context ended the reply after %lld tokens)\n",
                (long long)muser_session_n_ctx(r->s), (long long)g->n_tokens);
}

static void print_spec_json(const run_state *r) {
    muser_spec_stats st;
    muser_spec_get_stats(r->sp, &st);
    printf(",\"speculative\":{\"draft\":");
    cli_json_str(stdout, muser_draft_name(r->draft));
    printf(",\"verify_len\":%lld,\"tree\":%s,\"rounds\":%lld,\"round_tokens\":%lld,\"drafted\":%lld,\"accepted\":%lld,"
           "\"plain_steps\":%lld,\"gate_closures\":%lld,\"gate_open\":%s,\"draft_s\":%.6f,\"verify_s\":%.6f,"
           "\"plain_s\":%.6f,\"calibration_round_s\":%.6f,\"calibration_plain_s\":%.6f}",
           (long long)r->o->verify_len, r->o->spec_tree ? "true" : "false", (long long)st.rounds, (long long)st.round_tokens, (long long)st.drafted,
           (long long)st.accepted, (long long)st.plain_steps, (long long)st.gate_closures,
           st.gate_open ? "true" : "false", st.t_draft, st.t_verify, st.t_plain, st.calib_round_s, st.calib_plain_s);
}

/* A token as {"id","text","bytes","logprob"}: the text as valid JSON (bytes
 * of invalid UTF-8 as U+FFFD), the exact bytes in "bytes". */
static void json_token(const run_state *r, int32_t id, float logprob) {
    char buf[256];
    size_t n = muser_token_piece(r->m, id, true, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    mu_buf text = {0};
    mu_gen_json_string(&text, buf, n);
    printf("\"id\":%d,\"text\":%s,\"bytes\":[", id, text.p);
    free(text.p);
    for (size_t i = 0; i < n; i++) printf("%s%u", i ? "," : "", (unsigned char)buf[i]);
    if (isfinite(logprob)) printf("],\"logprob\":%.9g", (double)logprob);
    else printf("],\"logprob\":null");
}

/* OpenAI-style: per token its logprob and the likeliest alternatives. */
static void print_logprobs(const run_state *r, const mu_gen_result *g) {
    printf(",\"logprobs\":[");
    for (int64_t i = 0; i < g->n_tokens; i++) {
        printf("%s{", i ? "," : "");
        json_token(r, g->tokens[i], g->logprobs[i].logprob);
        printf(",\"top_logprobs\":[");
        for (int32_t k = 0; k < g->n_probs; k++) {
            const muser_logprob *t = &g->top[i * g->n_probs + k];
            printf("%s{", k ? "," : "");
            json_token(r, t->id, t->logprob);
            printf("}");
        }
        printf("]}");
    }
    printf("]");
}

static void print_json(const run_state *r) {
    const mu_gen_result *g = mu_gen_get_result(r->gen);
    printf("{\"prompt_tokens\":[");
    for (int64_t i = 0; i < g->n_prompt; i++) printf("%s%d", i ? "," : "", g->prompt[i]);
    printf("],\"tokens\":[");
    for (int64_t i = 0; i < g->n_tokens; i++) printf("%s%d", i ? "," : "", g->tokens[i]);
    printf("],\"text\":");
    cli_json_str(stdout, g->text);
    char chain[512];
    muser_sampler *smp = mu_gen_sampler(r->gen);
    muser_sampler_chain_str(smp, chain, sizeof chain);
    printf(",\"seed\":%u,\"sampler_chain\":", muser_sampler_seed(smp));
    cli_json_str(stdout, chain);
    if (g->n_probs) print_logprobs(r, g);
    printf(",\"stop\":\"%s\",\"timings\":{\"reused_tokens\":%lld,\"prefill_tokens\":%lld,\"prefill_s\":%.6f,\"prefill_tok_s\":%.3f,"
           "\"decode_tokens\":%lld,\"decode_s\":%.6f,\"decode_tok_s\":%.3f}",
           mu_gen_stop_name(g->stop), (long long)g->n_reused, (long long)g->n_prefill, g->t_prefill,
           g->t_prefill > 0 ? (double)g->n_prefill / g->t_prefill : 0.0, (long long)g->n_decoded, g->t_decode,
           g->n_decoded ? (double)g->n_decoded / g->t_decode : 0.0);
    if (r->sp) print_spec_json(r);
    printf(",\"backend\":\"%s\"}\n", r->info.backend);
}

/* ---------------- one prompt (-p, -f, --tokens) ---------------- */

static int run_once(run_state *r) {
    const run_opts *o = r->o;
    mu_gen_request req = {.n_predict = o->n_predict, .stops = o->stops, .n_stops = o->n_stops,
                          .speculate = r->sp != NULL, .rows_needed = r->dump != NULL};
    mu_buf msgs = {0};
    char *text = NULL;
    if (o->tokens) {
        req.tokens = o->tokens;
        req.n_tokens = o->n_tokens;
    } else {
        size_t len = 0;
        text = o->prompt_file ? cli_read_file("run", o->prompt_file, &len) : mu_xstrdup(o->prompt);
        if (!text) return 1;
        if (!o->prompt_file) len = strlen(text);
        if (o->system) { /* through the chat template, the same messages as --chat builds */
            mu_buf_append(&msgs, "[", 1);
            mu_gen_json_message(&msgs, "system", o->system, strlen(o->system));
            mu_gen_json_message(&msgs, "user", text, len);
            mu_buf_append(&msgs, "]", 1);
            req.messages_json = msgs.p;
        } else {
            req.text = text;
            req.text_len = len;
        }
    }
    muser_error err;
    int rc = 1;
    bool started = mu_gen_start(r->gen, &req, on_event, r, &err);
    free(msgs.p);
    free(text);
    if (!started) cli_error("run", err.msg);
    else if (drive(r)) {
        rc = 0;
        if (o->json) print_json(r);
        else {
            printf("\n");
            fflush(stdout);
            print_end_note(r);
            print_timings(r);
        }
    }
    return rc;
}

/* ---------------- chat ---------------- */

typedef struct chat_turn {
    char *user, *reply;
    size_t user_len, reply_len;
} chat_turn;

typedef struct chat_state {
    chat_turn *turns;
    int n_turns, cap_turns;
} chat_state;

static void drop_turns(chat_state *c, int n) {
    if (n <= 0) return;
    for (int i = 0; i < n; i++) {
        free(c->turns[i].user);
        free(c->turns[i].reply);
    }
    memmove(c->turns, c->turns + n, (size_t)(c->n_turns - n) * sizeof *c->turns);
    c->n_turns -= n;
}

/* Messages: the system message, turns[first..], the new user line. */
static char *chat_messages(const run_opts *o, const chat_state *c, int first, const char *line, size_t n) {
    mu_buf b = {0};
    mu_buf_append(&b, "[", 1);
    if (o->system) mu_gen_json_message(&b, "system", o->system, strlen(o->system));
    for (int i = first; i < c->n_turns; i++) {
        mu_gen_json_message(&b, "user", c->turns[i].user, c->turns[i].user_len);
        mu_gen_json_message(&b, "assistant", c->turns[i].reply, c->turns[i].reply_len);
    }
    mu_gen_json_message(&b, "user", line, n);
    mu_buf_append(&b, "]", 1);
    return b.p;
}

/* Start the request for a new line, dropping the oldest turns until the
 * prompt leaves room for a reply (a quarter of the context, or -n if less).
 * false (said on stderr) when it cannot start: the line is then not kept. */
static bool chat_start(run_state *r, chat_state *c, const char *line, size_t n) {
    const run_opts *o = r->o;
    const int64_t n_ctx = muser_session_n_ctx(r->s);
    int64_t room = n_ctx / 4 < o->n_predict ? n_ctx / 4 : o->n_predict;
    if (room < 1) room = 1;
    mu_gen_request req = {.n_predict = o->n_predict, .stops = o->stops, .n_stops = o->n_stops,
                          .speculate = r->sp != NULL, .rows_needed = r->dump != NULL};
    for (int first = 0;; first++) {
        char *msgs = chat_messages(o, c, first, line, n);
        req.messages_json = msgs;
        muser_error err;
        bool ok = mu_gen_start(r->gen, &req, on_event, r, &err);
        free(msgs);
        if (!ok) {
            cli_error("run", err.msg);
            return false;
        }
        int64_t n_prompt;
        mu_gen_prompt(r->gen, &n_prompt);
        if (n_prompt + room <= n_ctx || (first == c->n_turns && n_prompt < n_ctx)) {
            if (first) fprintf(stderr, "(context full: dropped the %d oldest turn%s)\n", first, first > 1 ? "s" : "");
            drop_turns(c, first);
            return true;
        }
        if (first == c->n_turns) {
            fprintf(stderr, "(this message needs %lld tokens with the template%s, the context holds %lld: "
                    "shorten it%s)\n", (long long)n_prompt, c->n_turns ? " even without earlier turns" : "",
                    (long long)n_ctx, c->n_turns ? " or /reset" : "");
            mu_gen_finish(r->gen, MU_GEN_STOP_CANCELLED, NULL);
            return false;
        }
    }
}

static void reset_session(run_state *r) {
    if (r->sp) muser_spec_reset(r->sp);
    else muser_session_reset(r->s);
    mu_gen_seq_clear(&r->seq);
}

static int chat_loop(run_state *r) {
    chat_state c = {0};
    char line[65536];
    int rc = 0;
    fprintf(stderr, "chat with %s (/exit to quit, /reset to forget, Ctrl-C stops a reply)\n", r->info.name);
    for (;;) {
        fprintf(stderr, "\n> ");
        if (!fgets(line, sizeof line, stdin)) break; /* EOF or Ctrl-C at the prompt */
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            drop_turns(&c, c.n_turns);
            reset_session(r);
            fprintf(stderr, "(conversation forgotten)\n");
            continue;
        }
        if (!n || !chat_start(r, &c, line, n)) continue;
        if (!drive(r)) {
            rc = 1;
            break;
        }
        printf("\n"); /* the reply's end, on the same stream as the reply */
        fflush(stdout);
        print_end_note(r);
        print_timings(r);
        const mu_gen_result *g = mu_gen_get_result(r->gen);
        if (c.n_turns == c.cap_turns) {
            c.cap_turns = c.cap_turns * 2 + 8;
            c.turns = mu_xrealloc(c.turns, (size_t)c.cap_turns * sizeof *c.turns);
        }
        chat_turn *t = &c.turns[c.n_turns++];
        t->user = mu_xstrdup(line);
        t->user_len = n;
        t->reply = mu_xstrdup(g->text);
        t->reply_len = g->text_len;
    }
    drop_turns(&c, c.n_turns);
    free(c.turns);
    return rc;
}

/* llama's startup lines: seed, parameters, chain. */
static void print_sampler(const muser_sampler *smp) {
    char params[1024], chain[512];
    muser_sampler_params_str(smp, params, sizeof params);
    muser_sampler_chain_str(smp, chain, sizeof chain);
    fprintf(stderr, "sampler seed: %u\nsampler params:\n%s\nsampler chain: %s\n", muser_sampler_seed(smp), params, chain);
}

/* Load the assistant and bind it to the session. */
static bool start_spec(run_state *r, muser_error *err) {
    const run_opts *o = r->o;
    r->draft = muser_draft_load(o->draft, r->m, err);
    if (!r->draft) return false;
    muser_spec_params p = {.verify_len = (int)o->verify_len, .no_gate = o->spec_always, .tree = o->spec_tree};
    r->sp = muser_spec_create(r->s, r->draft, &p, err);
    if (r->sp && o->verbose) fprintf(stderr, "speculative decoding with %s (verify length %lld%s)\n",
                                     muser_draft_name(r->draft), (long long)o->verify_len,
                                     o->spec_always ? ", every step" : ", adaptive gate");
    return r->sp != NULL;
}

/* Model, session, generation state, assistant; false with err. */
static bool set_up(run_state *r, run_opts *o, muser_error *err) {
    muser_model_get_info(r->m, &r->info);
    if ((o->prompt || o->prompt_file || o->chat) && !muser_model_has_tokenizer(r->m)) {
        snprintf(err->msg, sizeof err->msg, "%s has no tokenizer; use --tokens", o->model);
        return false;
    }
    int64_t ctx = o->ctx ? o->ctx : (r->info.n_ctx_train < 4096 ? r->info.n_ctx_train : 4096);
    if (ctx > r->info.n_ctx_train) /* allowed (no RoPE scaling is applied), but rarely what was meant */
        fprintf(stderr, "muser run: warning: a context of %lld tokens exceeds the %lld the model was trained on; "
                "output past that is unreliable\n", (long long)ctx, (long long)r->info.n_ctx_train);
    muser_session_params sp = {.n_ctx = ctx, .prefill_chunk = o->chunk};
    if (!(r->s = muser_session_create(r->m, &sp, err))) return false;
    o->sampling.p.n_ctx = (int32_t)(ctx < INT32_MAX ? ctx : INT32_MAX);
    if (!(r->gen = mu_gen_new(r->m, &o->sampling.p, err))) return false;
    if (o->verbose) print_sampler(mu_gen_sampler(r->gen));
    if (o->prompt_cache) {
        if (!(r->cache = muser_kvstore_open(r->m, o->prompt_cache, NULL, err)) ||
            !muser_kvstore_set_compression(r->cache, o->zstd_level, err))
            return false;
        muser_kvstore_set_quota(r->cache, o->cache_quota);
        mu_gen_set_prompt_cache(r->gen, r->cache);
    }
    if (o->draft && !start_spec(r, err)) return false;
    if (o->dump && !(r->dump = fopen(o->dump, "wb"))) {
        snprintf(err->msg, sizeof err->msg, "cannot open %s for writing", o->dump);
        return false;
    }
    return true;
}

int cmd_run(int argc, char **argv) {
    run_opts o;
    int rc = parse(argc, argv, &o);
    if (rc >= 0) {
        free(o.tokens);
        run_sampling_free(&o.sampling);
        return rc;
    }
    muser_error err;
    muser_model_params mp = {.backend = o.backend, .n_threads = (int)o.threads, .use_mlock = o.mlock};
    run_state r = {.o = &o, .m = muser_model_load(o.model, &mp, &err)};
    rc = 1;
    if (!r.m || !set_up(&r, &o, &err)) cli_error("run", err.msg);
    else {
        struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: Ctrl-C at the prompt ends fgets */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        rc = o.chat ? chat_loop(&r) : run_once(&r);
    }
    if (r.dump && fclose(r.dump) && rc == 0) { fprintf(stderr, "muser run: writing %s failed\n", o.dump); rc = 1; }
    muser_spec_free(r.sp);
    muser_draft_free(r.draft);
    muser_kvstore_close(r.cache);
    mu_gen_free(r.gen);
    mu_gen_seq_free(&r.seq);
    muser_session_free(r.s);
    muser_model_free(r.m);
    free(o.tokens);
    run_sampling_free(&o.sampling);
    return rc;
}
