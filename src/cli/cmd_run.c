/* muser run: prompt (token ids, text or chat) -> streamed generation.
 * Tokens come from the llama.cpp sampler chain (optionally constrained by a
 * grammar or JSON Schema, run_sampling.c has the options). Text is printed
 * as soon as it forms complete UTF-8; generation stops on an
 * end-of-generation token, a --stop string, a finished grammar or -n tokens.
 * --chat keeps a multi-turn conversation rendered with the model's chat
 * template. */
#include "cli.h"
#include "muser.h"
#include "run_sampling.h"
#include "util/common.h"
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOPS 16

typedef struct run_opts {
    const char *model, *draft, *dump, *prompt, *prompt_file, *system;
    const char *stops[MAX_STOPS];
    int n_stops;
    int32_t *tokens;
    int64_t n_tokens, n_predict, threads, ctx, chunk, verify_len;
    run_sampling sampling;
    bool chat, json, verbose, no_draft, spec_always, mlock;
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
            "  --chunk N              prefill rows per forward call (default 512)\n"
            "  --backend NAME         ref | cpu | cuda | auto (default auto)\n"
            "  --mlock                keep the model's pages locked in RAM\n"
            "  --json                 print one JSON object: prompt and generated ids, text, seed, sampler\n"
            "                         chain, timings (and logprobs with --n-probs N)\n"
            "  -v, --verbose          print the sampler parameters and chain to stderr\n"
            "  --dump-logits FILE     write every step's f32 logits (prompt's last row, then each decode step)\n\n"
            "speculative decoding (output identical to plain decoding, only faster or not):\n"
            "  --draft FILE           DFlash assistant GGUF for the model (default without -m: $MUSER_DRAFT,\n"
            "                         else the shipped models/glimmer-tiny-dflash-q4_k_xl.gguf)\n"
            "  --no-draft             decode without the assistant\n"
            "  --verify-len N         proposals per round: 3, 7 or 15 (default 7)\n"
            "  --spec-always          speculate every step (default: an adaptive gate falls back to plain\n"
            "                         steps while speculation is slower or rarely accepted)\n",
            MAX_STOPS);
    run_sampling_usage(f);
}

static int parse(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.n_predict = 128, .verify_len = 7};
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
        else if (!strcmp(a, "--draft")) ok = cli_value("run", argc, argv, &i, &o->draft);
        else if (!strcmp(a, "--no-draft")) o->no_draft = true;
        else if (!strcmp(a, "--spec-always")) o->spec_always = true;
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
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_ids("run", v, &o->tokens, &o->n_tokens);
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 0, 1 << 24, &o->n_predict);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 1024, &o->threads);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 1 << 24, &o->ctx);
        else if (!strcmp(a, "--chunk"))
            ok = cli_value("run", argc, argv, &i, &v) && cli_parse_i64("run", a, v, 1, 65536, &o->chunk);
        else if (!strcmp(a, "--backend")) {
            ok = cli_value("run", argc, argv, &i, &v);
            if (ok && !muser_backend_from_name(v, &o->backend)) {
                fprintf(stderr, "muser run: unknown backend '%s' (ref, cpu, cuda, auto)\n", v);
                ok = false;
            }
        } else {
            fprintf(stderr, "muser run: unknown option '%s' (see muser run --help)\n", a);
            ok = false;
        }
        if (!ok) return 2;
    }
    if (o->draft && o->no_draft) { fprintf(stderr, "muser run: --draft and --no-draft exclude each other\n"); return 2; }
    if (!o->draft && !o->no_draft && !o->model) o->draft = cli_default_draft(); /* the default pair */
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

typedef struct gen_state {
    const run_opts *o;
    muser_model *m;
    muser_session *s;
    muser_model_info info;
    FILE *dump;
    muser_sampler *smp;
    muser_draft *draft;   /* NULL: plain decoding */
    muser_spec *sp;
    int32_t n_probs;      /* logprob alternatives per token (--json only) */
    /* output of the current generation */
    int32_t *out_ids;
    muser_logprob *lp, *lp_top; /* per token: chosen, then n_probs alternatives */
    int64_t n_out, cap_out;
    int32_t *fed;         /* generated tokens the session has been fed */
    int64_t n_fed, cap_fed;
    char *text;           /* all text produced so far (for stop strings and --json) */
    size_t text_len, text_cap, printed;
    bool stopped_by_eog, stopped_by_stop, stopped_by_grammar;
    double t_prefill, t_decode;
    int64_t n_prefill, n_decoded;
} gen_state;

static void append_text(gen_state *g, const char *p, size_t n) {
    if (g->text_len + n + 1 > g->text_cap) {
        g->text_cap = (g->text_len + n + 1) * 2;
        g->text = mu_xrealloc(g->text, g->text_cap);
    }
    memcpy(g->text + g->text_len, p, n);
    g->text_len += n;
    g->text[g->text_len] = 0;
}

/* Print what can no longer become part of a stop string; true if a stop hit. */
static bool emit(gen_state *g, bool final) {
    size_t limit = g->text_len;
    bool hit = false;
    for (int k = 0; k < g->o->n_stops; k++) {
        const char *p = memmem(g->text + g->printed, g->text_len - g->printed, g->o->stops[k], strlen(g->o->stops[k]));
        if (p && (size_t)(p - g->text) < limit) { limit = (size_t)(p - g->text); hit = true; }
    }
    if (!hit && !final) /* hold back a suffix that may still grow into a stop string */
        for (int k = 0; k < g->o->n_stops; k++) {
            size_t sl = strlen(g->o->stops[k]);
            for (size_t keep = sl - 1; keep > 0; keep--)
                if (keep <= g->text_len - g->printed &&
                    !memcmp(g->text + g->text_len - keep, g->o->stops[k], keep)) {
                    if (g->text_len - keep < limit) limit = g->text_len - keep;
                    break;
                }
        }
    if (limit > g->printed) {
        if (!g->o->json) fwrite(g->text + g->printed, 1, limit - g->printed, stdout);
        fflush(stdout);
        g->printed = limit;
    }
    if (hit) { /* the stop string itself is not part of the output */
        g->text_len = limit;
        g->text[limit] = 0;
    }
    return hit;
}

/* Record a drawn token, with its logprobs when asked for. */
static bool push_token(gen_state *g, const float *logits, int32_t tok) {
    if (g->n_out == g->cap_out) {
        g->cap_out = g->cap_out * 2 + 64;
        g->out_ids = mu_xrealloc(g->out_ids, (size_t)g->cap_out * sizeof *g->out_ids);
        if (g->n_probs) {
            g->lp = mu_xrealloc(g->lp, (size_t)g->cap_out * sizeof *g->lp);
            g->lp_top = mu_xrealloc(g->lp_top, (size_t)g->cap_out * (size_t)g->n_probs * sizeof *g->lp_top);
        }
    }
    muser_error err;
    if (g->n_probs && muser_sampler_logprobs(g->smp, logits, tok, &g->lp[g->n_out],
                                             &g->lp_top[g->n_out * g->n_probs], &err) < 0) {
        fprintf(stderr, "\nmuser run: %s\n", err.msg);
        return false;
    }
    g->out_ids[g->n_out++] = tok;
    return true;
}

/* Draw and accept a token from a row: 1, 0 when a finished grammar allows
 * nothing more (a normal stop, also under --ignore-eos), -1 on error. */
static int draw_one(gen_state *g, const float *logits, int32_t *tok, muser_error *err) {
    *tok = muser_sampler_sample(g->smp, logits, err);
    if (*tok < 0 && muser_sampler_grammar_complete(g->smp)) return 0;
    return *tok >= 0 && muser_sampler_accept(g->smp, *tok, err) ? 1 : -1;
}

static void note_fed(gen_state *g, const int32_t *ids, int64_t n) {
    if (g->n_fed + n > g->cap_fed) {
        g->cap_fed = (g->n_fed + n) * 2 + 64;
        g->fed = mu_xrealloc(g->fed, (size_t)g->cap_fed * sizeof *g->fed);
    }
    memcpy(g->fed + g->n_fed, ids, (size_t)n * sizeof *ids);
    g->n_fed += n;
}

/* Feed the pending token and draw what follows: 1..max_out tokens and the
 * rows they were drawn from (one with plain decoding, up to verify length +
 * 1 with the assistant), 0 on a finished grammar, -1 on error. */
static int advance(gen_state *g, int32_t pending, int max_out, int32_t *out, const float **rows) {
    muser_error err;
    int n;
    if (g->sp) n = muser_spec_next(g->sp, pending, g->smp, max_out, out, rows, &err);
    else if (!muser_session_feed(g->s, &pending, 1, &err)) n = -1;
    else n = draw_one(g, rows[0] = muser_session_logits(g->s), out, &err);
    if (n < 0) {
        fprintf(stderr, "\nmuser run: %s\n", err.msg);
        return -1;
    }
    note_fed(g, &pending, 1);
    if (n > 1) note_fed(g, out, n - 1);
    return n;
}

/* llama-server restarts the sampler for every request (reseeded, grammar
 * from the start) and feeds the whole prompt into the penalty history. */
static bool start_sampler(gen_state *g, const int32_t *prompt, int64_t n_prompt) {
    muser_error err;
    muser_sampler_reset(g->smp);
    if (muser_sampler_accept_prompt(g->smp, prompt, (size_t)n_prompt, &err)) return true;
    fprintf(stderr, "muser run: %s\n", err.msg);
    return false;
}

static bool dump_logits(gen_state *g, const float *logits) {
    if (!g->dump || fwrite(logits, sizeof(float), (size_t)g->info.n_vocab, g->dump) == (size_t)g->info.n_vocab)
        return true;
    fprintf(stderr, "muser run: writing logits failed\n");
    return false;
}

/* Handle one drawn token: record, print, check stops. false = stop. */
static bool take_token(gen_state *g, muser_detok *dt, const float *row, int32_t tok, bool *ok) {
    if (!push_token(g, row, tok)) return *ok = false;
    if (muser_token_is_eog(g->m, tok)) { g->stopped_by_eog = true; return false; }
    if (dt) {
        size_t len;
        const char *piece = muser_detok_push(dt, tok, &len);
        append_text(g, piece, len);
        if (emit(g, false)) { g->stopped_by_stop = true; return false; }
    } else if (!g->o->json) {
        printf("%s%d", g->n_out > 1 ? " " : "", tok);
        fflush(stdout);
    }
    return g->n_out < g->o->n_predict;
}

/* Feed prompt (already in the session's context after this) and generate. */
static bool generate(gen_state *g, const int32_t *prompt, int64_t n_prompt) {
    muser_error err;
    g->n_out = g->n_fed = 0;
    g->text_len = g->printed = 0;
    g->stopped_by_eog = g->stopped_by_stop = g->stopped_by_grammar = false;
    double t0 = mu_now();
    if (g->sp ? !muser_spec_feed(g->sp, prompt, n_prompt, &err) : !muser_session_feed(g->s, prompt, n_prompt, &err)) {
        fprintf(stderr, "muser run: %s\n", err.msg);
        return false;
    }
    g->t_prefill = mu_now() - t0;
    g->n_prefill = n_prompt;
    if (g->sp) muser_spec_reset_stats(g->sp);
    const float *logits = muser_session_logits(g->s);
    if (!dump_logits(g, logits)) return false;
    muser_detok *dt = muser_detok_new(g->m, false);
    double t1 = mu_now();
    bool ok = true;
    g_interrupted = 0;
    int32_t q[16];        /* drawn tokens not handled yet; the last one is pending (not fed) */
    const float *rows[16];
    int nq = 0, iq = 0;
    if (g->o->n_predict > 0) {
        rows[0] = logits;
        nq = draw_one(g, logits, &q[0], &err);
        if (nq < 0) { fprintf(stderr, "\nmuser run: %s\n", err.msg); ok = false; }
    }
    while (ok && nq > 0 && !g_interrupted) {
        if (iq == nq) {
            int64_t left = g->o->n_predict - g->n_out;
            nq = advance(g, q[nq - 1], left < 16 ? (int)left : 16, q, rows);
            iq = 0;
            if (nq < 0) ok = false;
            if (nq <= 0) break;
        }
        if (g->n_out && !(ok = dump_logits(g, rows[iq]))) break; /* the prompt's row went out above */
        if (!take_token(g, dt, rows[iq], q[iq], &ok)) break;
        iq++;
    }
    g->stopped_by_grammar = ok && nq == 0 && g->o->n_predict > 0 && !g_interrupted;
    if (dt && !g->stopped_by_stop) {
        size_t len;
        const char *rest = muser_detok_flush(dt, &len);
        append_text(g, rest, len);
        g->stopped_by_stop = emit(g, true);
    }
    muser_detok_free(dt);
    g->n_decoded = g->n_fed;
    g->t_decode = mu_now() - t1;
    return ok;
}

static void print_timings(const gen_state *g) {
    fprintf(stderr, "\nprefill: %lld tokens in %.3f s (%.2f tok/s); decode: %lld tokens in %.3f s (%.2f tok/s); backend %s\n",
            (long long)g->n_prefill, g->t_prefill, g->t_prefill > 0 ? (double)g->n_prefill / g->t_prefill : 0.0,
            (long long)g->n_decoded, g->t_decode, g->n_decoded ? (double)g->n_decoded / g->t_decode : 0.0,
            g->info.backend);
    if (!g->sp) return;
    muser_spec_stats st;
    muser_spec_get_stats(g->sp, &st);
    if (!st.rounds && !st.gate_open) {
        fprintf(stderr, "speculative: gate closed, %lld plain steps (calibration: a %lld-proposal round %.2f ms, "
                "a plain step %.2f ms)\n", (long long)st.plain_steps, (long long)g->o->verify_len,
                st.calib_round_s * 1e3, st.calib_plain_s * 1e3);
        return;
    }
    fprintf(stderr, "speculative: %lld rounds (%.2f tokens each, %lld of %lld proposals accepted), %lld plain steps, "
            "gate closed %lld times\n",
            (long long)st.rounds, st.rounds ? (double)st.round_tokens / (double)st.rounds : 0.0, (long long)st.accepted,
            (long long)st.drafted, (long long)st.plain_steps, (long long)st.gate_closures);
}

static void print_spec_json(const gen_state *g) {
    muser_spec_stats st;
    muser_spec_get_stats(g->sp, &st);
    printf(",\"speculative\":{\"draft\":");
    cli_json_str(stdout, muser_draft_name(g->draft));
    printf(",\"verify_len\":%lld,\"rounds\":%lld,\"round_tokens\":%lld,\"drafted\":%lld,\"accepted\":%lld,"
           "\"plain_steps\":%lld,\"gate_closures\":%lld,\"gate_open\":%s,\"draft_s\":%.6f,\"verify_s\":%.6f,"
           "\"plain_s\":%.6f,\"calibration_round_s\":%.6f,\"calibration_plain_s\":%.6f}",
           (long long)g->o->verify_len, (long long)st.rounds, (long long)st.round_tokens, (long long)st.drafted,
           (long long)st.accepted, (long long)st.plain_steps, (long long)st.gate_closures,
           st.gate_open ? "true" : "false", st.t_draft, st.t_verify, st.t_plain, st.calib_round_s, st.calib_plain_s);
}

/* A token's bytes as a JSON string: valid UTF-8 kept, every byte of an
 * invalid or cut-off sequence as U+FFFD (the exact bytes go to "bytes"). */
static void json_piece(const char *p, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
        bool valid = len && i + len <= n;
        for (size_t k = 1; valid && k < len; k++) valid = ((unsigned char)p[i + k] & 0xC0) == 0x80;
        if (valid && len == 3) { /* no overlongs, no surrogates */
            unsigned char d = (unsigned char)p[i + 1];
            valid = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d >= 0xA0);
        } else if (valid && len == 4) {
            unsigned char d = (unsigned char)p[i + 1];
            valid = !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d >= 0x90);
        }
        if (!valid) { fputs("\\ufffd", stdout); i++; continue; }
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7F) printf("\\u%04x", c);
        else fwrite(p + i, 1, len, stdout);
        i += len;
    }
    putchar('"');
}

static void json_token(const gen_state *g, int32_t id, float logprob) {
    char buf[256];
    size_t n = muser_token_piece(g->m, id, true, buf, sizeof buf);
    if (n > sizeof buf) n = sizeof buf;
    printf("\"id\":%d,\"text\":", id);
    json_piece(buf, n);
    printf(",\"bytes\":[");
    for (size_t i = 0; i < n; i++) printf("%s%u", i ? "," : "", (unsigned char)buf[i]);
    if (isfinite(logprob)) printf("],\"logprob\":%.9g", (double)logprob);
    else printf("],\"logprob\":null");
}

/* OpenAI-style: per token its logprob and the likeliest alternatives. */
static void print_logprobs(const gen_state *g) {
    printf(",\"logprobs\":[");
    for (int64_t i = 0; i < g->n_out; i++) {
        printf("%s{", i ? "," : "");
        json_token(g, g->out_ids[i], g->lp[i].logprob);
        printf(",\"top_logprobs\":[");
        for (int32_t k = 0; k < g->n_probs; k++) {
            const muser_logprob *t = &g->lp_top[i * g->n_probs + k];
            printf("%s{", k ? "," : "");
            json_token(g, t->id, t->logprob);
            printf("}");
        }
        printf("]}");
    }
    printf("]");
}

static void print_json(const gen_state *g, const int32_t *prompt, int64_t n_prompt) {
    printf("{\"prompt_tokens\":[");
    for (int64_t i = 0; i < n_prompt; i++) printf("%s%d", i ? "," : "", prompt[i]);
    printf("],\"tokens\":[");
    for (int64_t i = 0; i < g->n_out; i++) printf("%s%d", i ? "," : "", g->out_ids[i]);
    printf("],\"text\":");
    cli_json_str(stdout, g->text ? g->text : "");
    char chain[512];
    muser_sampler_chain_str(g->smp, chain, sizeof chain);
    printf(",\"seed\":%u,\"sampler_chain\":", muser_sampler_seed(g->smp));
    cli_json_str(stdout, chain);
    if (g->n_probs) print_logprobs(g);
    printf(",\"stop\":\"%s\",\"timings\":{\"prefill_tokens\":%lld,\"prefill_s\":%.6f,\"prefill_tok_s\":%.3f,"
           "\"decode_tokens\":%lld,\"decode_s\":%.6f,\"decode_tok_s\":%.3f}",
           g->stopped_by_eog ? "eog" : g->stopped_by_stop ? "stop_string" : g->stopped_by_grammar ? "grammar" : "length", (long long)g->n_prefill,
           g->t_prefill, g->t_prefill > 0 ? (double)g->n_prefill / g->t_prefill : 0.0, (long long)g->n_decoded,
           g->t_decode, g->n_decoded ? (double)g->n_decoded / g->t_decode : 0.0);
    if (g->sp) print_spec_json(g);
    printf(",\"backend\":\"%s\"}\n", g->info.backend);
}

/* ---------------- prompts ---------------- */

static void json_append(char **buf, size_t *len, const char *s) {
    size_t n = strlen(s);
    *buf = mu_xrealloc(*buf, *len + n + 1);
    memcpy(*buf + *len, s, n + 1);
    *len += n;
}

/* Append {"role":..,"content":..} to a JSON array under construction. */
static void add_message(char **arr, size_t *len, const char *role, const char *content, size_t clen) {
    json_append(arr, len, *len > 1 ? ",{\"role\":\"" : "{\"role\":\"");
    json_append(arr, len, role);
    json_append(arr, len, "\",\"content\":\"");
    char esc[8];
    for (size_t i = 0; i < clen; i++) {
        unsigned char c = (unsigned char)content[i];
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; esc[2] = 0; }
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else { esc[0] = (char)c; esc[1] = 0; }
        json_append(arr, len, esc);
    }
    json_append(arr, len, "\"}");
}

/* Tokenize rendered chat text: specials parsed, BOS added once if the model wants it. */
static int64_t tokenize_chat(muser_model *m, const char *text, int32_t **ids, muser_error *err) {
    int64_t n = muser_tokenize(m, text, strlen(text), false, true, ids, err);
    int32_t bos = muser_token_bos(m);
    int32_t *probe = NULL;
    muser_error e2;
    bool wants_bos = muser_tokenize(m, "", 0, true, false, &probe, &e2) > 0;
    free(probe);
    if (n >= 0 && wants_bos && bos >= 0 && (n == 0 || (*ids)[0] != bos)) {
        *ids = mu_xrealloc(*ids, (size_t)(n + 1) * sizeof(int32_t));
        memmove(*ids + 1, *ids, (size_t)n * sizeof(int32_t));
        (*ids)[0] = bos;
        n++;
    }
    return n;
}

static char *render_chat(muser_model *m, const char *messages, muser_error *err) {
    muser_chat_params p = {.messages_json = messages, .add_generation_prompt = true};
    return muser_chat_render(m, &p, err);
}

static int64_t build_prompt(const run_opts *o, muser_model *m, int32_t **ids) {
    muser_error err;
    if (o->tokens) {
        *ids = mu_xmalloc((size_t)o->n_tokens * sizeof(int32_t));
        memcpy(*ids, o->tokens, (size_t)o->n_tokens * sizeof(int32_t));
        return o->n_tokens;
    }
    size_t len = 0;
    char *text = o->prompt_file ? cli_read_file("run", o->prompt_file, &len) : mu_xstrdup(o->prompt);
    if (!text) return -1;
    if (!o->prompt_file) len = strlen(text);
    int64_t n;
    if (o->system) {
        char *msgs = mu_xstrdup("[");
        size_t ml = 1;
        add_message(&msgs, &ml, "system", o->system, strlen(o->system));
        add_message(&msgs, &ml, "user", text, len);
        json_append(&msgs, &ml, "]");
        char *rendered = render_chat(m, msgs, &err);
        n = rendered ? tokenize_chat(m, rendered, ids, &err) : -1;
        free(rendered);
        free(msgs);
    } else {
        n = muser_tokenize(m, text, len, true, true, ids, &err);
    }
    free(text);
    if (n < 0) fprintf(stderr, "muser run: %s\n", err.msg);
    else if (n == 0) { fprintf(stderr, "muser run: the prompt is empty\n"); free(*ids); n = -1; }
    return n;
}

/* ---------------- chat ---------------- */

static void reset_session(gen_state *g) {
    if (g->sp) muser_spec_reset(g->sp);
    else muser_session_reset(g->s);
}

static int chat_loop(gen_state *g) {
    char *msgs = mu_xstrdup("[");
    size_t ml = 1;
    if (g->o->system) add_message(&msgs, &ml, "system", g->o->system, strlen(g->o->system));
    int32_t *hist = NULL; /* tokens in the session */
    int64_t n_hist = 0;
    char line[65536];
    fprintf(stderr, "chat with %s (/exit to quit, /reset to forget, Ctrl-C stops a reply)\n", g->info.name);
    for (;;) {
        fprintf(stderr, "\n> ");
        if (!fgets(line, sizeof line, stdin)) break; /* EOF or Ctrl-C at the prompt */
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            msgs[1] = 0;
            ml = 1;
            if (g->o->system) add_message(&msgs, &ml, "system", g->o->system, strlen(g->o->system));
            reset_session(g);
            n_hist = 0;
            fprintf(stderr, "(conversation forgotten)\n");
            continue;
        }
        if (!n) continue;
        add_message(&msgs, &ml, "user", line, n);
        json_append(&msgs, &ml, "]");
        muser_error err;
        char *rendered = render_chat(g->m, msgs, &err);
        msgs[--ml] = 0; /* drop the closing bracket again */
        int32_t *ids = NULL;
        int64_t n_ids = rendered ? tokenize_chat(g->m, rendered, &ids, &err) : -1;
        free(rendered);
        if (n_ids < 0) { fprintf(stderr, "muser run: %s\n", err.msg); break; }
        /* Reuse the KV of the common prefix; otherwise start over. */
        int64_t common = 0;
        while (common < n_hist && common < n_ids && hist[common] == ids[common]) common++;
        if (common < n_hist || common == n_ids) { reset_session(g); common = 0; }
        if (!start_sampler(g, ids, n_ids) || !generate(g, ids + common, n_ids - common)) { free(ids); break; }
        if (g_interrupted) fprintf(stderr, "\n(interrupted)");
        print_timings(g);
        hist = mu_xrealloc(hist, (size_t)(n_ids + g->n_out) * sizeof(int32_t));
        memcpy(hist, ids, (size_t)n_ids * sizeof(int32_t));
        int64_t fed = g->n_fed; /* generated tokens the session has seen */
        memcpy(hist + n_ids, g->fed, (size_t)fed * sizeof(int32_t));
        n_hist = n_ids + fed;
        free(ids);
        add_message(&msgs, &ml, "assistant", g->text ? g->text : "", g->text ? g->text_len : 0);
    }
    free(hist);
    free(msgs);
    return 0;
}

/* llama's startup lines: seed, parameters, chain. */
static void print_sampler(const muser_sampler *smp) {
    char params[1024], chain[512];
    muser_sampler_params_str(smp, params, sizeof params);
    muser_sampler_chain_str(smp, chain, sizeof chain);
    fprintf(stderr, "sampler seed: %u\nsampler params:\n%s\nsampler chain: %s\n", muser_sampler_seed(smp), params, chain);
}

/* Load the assistant and bind it to the session. */
static bool start_spec(gen_state *g, muser_error *err) {
    const run_opts *o = g->o;
    g->draft = muser_draft_load(o->draft, g->m, err);
    if (!g->draft) return false;
    muser_spec_params p = {.verify_len = (int)o->verify_len, .no_gate = o->spec_always};
    g->sp = muser_spec_create(g->s, g->draft, &p, err);
    if (g->sp && o->verbose) fprintf(stderr, "speculative decoding with %s (verify length %lld%s)\n",
                                     muser_draft_name(g->draft), (long long)o->verify_len,
                                     o->spec_always ? ", every step" : ", adaptive gate");
    return g->sp != NULL;
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
    muser_model *m = muser_model_load(o.model, &mp, &err);
    if (!m) {
        fprintf(stderr, "muser run: %s\n", err.msg);
        free(o.tokens);
        run_sampling_free(&o.sampling);
        return 1;
    }
    gen_state g = {.o = &o, .m = m, .n_probs = o.sampling.p.n_probs};
    muser_model_get_info(m, &g.info);
    if ((o.prompt || o.prompt_file || o.chat) && !muser_model_has_tokenizer(m)) {
        fprintf(stderr, "muser run: %s has no tokenizer; use --tokens\n", o.model);
        muser_model_free(m);
        free(o.tokens);
        run_sampling_free(&o.sampling);
        return 1;
    }
    int64_t ctx = o.ctx ? o.ctx : (g.info.n_ctx_train < 4096 ? g.info.n_ctx_train : 4096);
    muser_session_params sp = {.n_ctx = ctx, .prefill_chunk = o.chunk};
    g.s = muser_session_create(m, &sp, &err);
    o.sampling.p.n_ctx = (int32_t)(ctx < INT32_MAX ? ctx : INT32_MAX);
    if (g.s && !(g.smp = muser_sampler_create(m, &o.sampling.p, &err))) {
        muser_session_free(g.s);
        g.s = NULL;
    }
    if (g.smp && o.verbose) print_sampler(g.smp);
    if (g.smp && o.draft && !start_spec(&g, &err)) {
        muser_sampler_free(g.smp);
        g.smp = NULL;
        muser_session_free(g.s);
        g.s = NULL;
    }
    rc = 1;
    struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: Ctrl-C at the prompt ends fgets */
    sigemptyset(&sa.sa_mask);
    if (!g.s) fprintf(stderr, "muser run: %s\n", err.msg);
    else if (o.dump && !(g.dump = fopen(o.dump, "wb"))) fprintf(stderr, "muser run: cannot open %s for writing\n", o.dump);
    else if (o.chat) {
        sigaction(SIGINT, &sa, NULL);
        rc = chat_loop(&g);
    } else {
        int32_t *prompt = NULL;
        int64_t n_prompt = build_prompt(&o, m, &prompt);
        if (n_prompt > 0) {
            sigaction(SIGINT, &sa, NULL);
            if (start_sampler(&g, prompt, n_prompt) && generate(&g, prompt, n_prompt)) {
                rc = 0;
                if (o.json) print_json(&g, prompt, n_prompt);
                else {
                    printf("\n");
                    fflush(stdout);
                    print_timings(&g);
                }
            }
        }
        free(prompt);
    }
    if (g.dump && fclose(g.dump) && rc == 0) { fprintf(stderr, "muser run: writing %s failed\n", o.dump); rc = 1; }
    muser_spec_free(g.sp);
    muser_draft_free(g.draft);
    muser_sampler_free(g.smp);
    muser_session_free(g.s);
    muser_model_free(m);
    free(g.out_ids);
    free(g.fed);
    free(g.lp);
    free(g.lp_top);
    free(g.text);
    free(o.tokens);
    run_sampling_free(&o.sampling);
    return rc;
}
