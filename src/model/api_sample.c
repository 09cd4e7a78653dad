/* The sampling layer of the public API: the llama.cpp chain (sample/), a
 * GBNF grammar or JSON Schema constraint (grammar/) bound to the model's
 * vocabulary, llama-server's selection discipline, snapshots and logprobs. */
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "model/api_internal.h"
#include "sample/sample.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

struct muser_sampler {
    const muser_model *model;
    int32_t n_vocab;
    int32_t n_probs;
    mu_sampler *chain;
    mu_sampler_params params;   /* for printing; pointer members cleared */
    bool has_logit_bias;
    const int32_t *banned;      /* EOG ids under ignore_eos (tokenizer-owned) */
    size_t n_banned;
    /* grammar (all NULL without one) */
    mu_grammar *grammar;
    const mu_grammar_vocab *gvocab; /* the model's, shared */
    mu_grammar_state *gstate;
    uint32_t *mask;             /* (n_vocab + 31) / 32 words */
    int32_t *gtok;              /* tokens the grammar accepted since the last reset */
    size_t n_gtok, cap_gtok;
    bool mask_failed;           /* set by the constraint hook, reported by sample */
    mu_error mask_err;
};

/* ------------------------------------------------------------ params */

void muser_sampling_params_default(muser_sampling_params *p) {
    mu_sampler_params d;
    mu_sampler_params_default(&d);
    *p = (muser_sampling_params){
        .seed = d.seed, .temp = d.temp, .top_k = d.top_k, .top_p = d.top_p, .min_p = d.min_p,
        .typ_p = d.typ_p, .top_n_sigma = d.top_n_sigma, .xtc_probability = d.xtc_probability,
        .xtc_threshold = d.xtc_threshold, .penalty_last_n = d.penalty_last_n,
        .penalty_repeat = d.penalty_repeat, .penalty_freq = d.penalty_freq,
        .penalty_present = d.penalty_present, .dry_multiplier = d.dry_multiplier,
        .dry_base = d.dry_base, .dry_allowed_length = d.dry_allowed_length,
        .dry_penalty_last_n = d.dry_penalty_last_n, .dynatemp_range = d.dynatemp_range,
        .dynatemp_exponent = d.dynatemp_exponent, .mirostat = d.mirostat,
        .mirostat_tau = d.mirostat_tau, .mirostat_eta = d.mirostat_eta, .min_keep = d.min_keep,
    };
}

/* NaN or infinite sampler settings would silently turn the chain into
 * garbage; refuse them by name. */
static bool check_finite(const muser_sampling_params *p, mu_error *err) {
    const struct { const char *name; float v; } f[] = {
        {"temp", p->temp}, {"top_p", p->top_p}, {"min_p", p->min_p}, {"typ_p", p->typ_p},
        {"top_n_sigma", p->top_n_sigma}, {"xtc_probability", p->xtc_probability},
        {"xtc_threshold", p->xtc_threshold}, {"penalty_repeat", p->penalty_repeat},
        {"penalty_freq", p->penalty_freq}, {"penalty_present", p->penalty_present},
        {"dry_multiplier", p->dry_multiplier}, {"dry_base", p->dry_base},
        {"dynatemp_range", p->dynatemp_range}, {"dynatemp_exponent", p->dynatemp_exponent},
        {"mirostat_tau", p->mirostat_tau}, {"mirostat_eta", p->mirostat_eta},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!isfinite(f[i].v)) {
            mu_err_set(err, "sampling: %s must be a finite number", f[i].name);
            return false;
        }
    }
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        float b = p->logit_bias[i].bias;
        if (isnan(b) || b == INFINITY) {
            mu_err_set(err, "sampling: logit_bias[%zu] (token %d) must be finite or -inf", i,
                       p->logit_bias[i].token);
            return false;
        }
    }
    return true;
}

static bool check_params(const muser_model *m, const muser_sampling_params *p, int32_t n_vocab,
                         mu_error *err) {
    if (p->n_logit_bias && !p->logit_bias) {
        mu_err_set(err, "sampling: logit_bias is NULL but n_logit_bias = %zu", p->n_logit_bias);
        return false;
    }
    if (!check_finite(p, err)) return false;
    if (p->samplers && p->sampling_seq) {
        mu_err_set(err, "sampling: give the chain order as samplers or sampling_seq, not both");
        return false;
    }
    if (p->grammar && p->json_schema) {
        mu_err_set(err, "sampling: grammar and json_schema are mutually exclusive");
        return false;
    }
    if (p->json_schema && p->grammar_root && strcmp(p->grammar_root, "root")) {
        mu_err_set(err, "sampling: grammar_root \"%s\" does not apply to json_schema (its root is \"root\")",
                   p->grammar_root);
        return false;
    }
    if (p->n_probs < 0 || p->n_probs > n_vocab) {
        mu_err_set(err, "sampling: n_probs must be in [0, %d], got %d", n_vocab, p->n_probs);
        return false;
    }
    if (p->n_ctx < 0) {
        mu_err_set(err, "sampling: n_ctx must be >= 0, got %d", p->n_ctx);
        return false;
    }
    if (!m->tok && (p->grammar || p->json_schema)) {
        mu_err_set(err, "%s has no tokenizer: grammars and JSON schemas need token texts", m->m->gguf->path);
        return false;
    }
    return true;
}

/* DRY splits multi-byte sequence breakers with the model tokenizer (no BOS,
 * no special-token parsing, as llama does). */
static int32_t dry_tokenize(void *ctx, const char *text, size_t len, int32_t *out, int32_t cap) {
    int32_t *ids = NULL;
    int64_t n = mu_tokenize(ctx, text, len, false, false, &ids, NULL);
    if (n < 0 || n > INT32_MAX) {
        free(ids);
        return -1;
    }
    for (int64_t i = 0; i < n && i < cap; i++) out[i] = ids[i];
    free(ids);
    return (int32_t)n;
}

/* Token texts for DRY: llama renders each as detokenize({id}, special=true). */
typedef struct piece_table {
    char **piece;
    size_t *len;
    int32_t n;
} piece_table;

static void piece_table_free(piece_table *t) {
    for (int32_t i = 0; t->piece && i < t->n; i++) free(t->piece[i]);
    free(t->piece);
    free(t->len);
}

static bool dry_pieces(const mu_tokenizer *tok, int32_t n_vocab, piece_table *t, mu_error *err) {
    t->n = n_vocab;
    t->piece = mu_xcalloc((size_t)n_vocab, sizeof *t->piece);
    t->len = mu_xcalloc((size_t)n_vocab, sizeof *t->len);
    for (int32_t id = 0; id < n_vocab; id++) {
        t->piece[id] = mu_detokenize(tok, &id, 1, false, true, &t->len[id], err);
        if (!t->piece[id]) return false;
    }
    return true;
}

static bool build_chain(muser_sampler *s, const muser_sampling_params *p, mu_error *err) {
    mu_sampler_params q;
    mu_sampler_params_default(&q);
    q.seed = p->seed;
    q.temp = p->temp;
    q.top_k = p->top_k;
    q.top_p = p->top_p;
    q.min_p = p->min_p;
    q.typ_p = p->typ_p;
    q.top_n_sigma = p->top_n_sigma;
    q.xtc_probability = p->xtc_probability;
    q.xtc_threshold = p->xtc_threshold;
    q.penalty_last_n = p->penalty_last_n;
    q.penalty_repeat = p->penalty_repeat;
    q.penalty_freq = p->penalty_freq;
    q.penalty_present = p->penalty_present;
    q.dry_multiplier = p->dry_multiplier;
    q.dry_base = p->dry_base;
    q.dry_allowed_length = p->dry_allowed_length;
    q.dry_penalty_last_n = p->dry_penalty_last_n;
    if (p->dry_sequence_breakers || p->n_dry_sequence_breakers) {
        q.dry_breakers = p->dry_sequence_breakers;
        q.n_dry_breakers = p->n_dry_sequence_breakers;
    }
    q.dynatemp_range = p->dynatemp_range;
    q.dynatemp_exponent = p->dynatemp_exponent;
    q.mirostat = p->mirostat;
    q.mirostat_tau = p->mirostat_tau;
    q.mirostat_eta = p->mirostat_eta;
    q.min_keep = p->min_keep;
    if (p->samplers && !mu_sampler_parse_names(p->samplers, q.order, &q.n_order, err)) return false;
    if (p->sampling_seq && !mu_sampler_parse_chars(p->sampling_seq, q.order, &q.n_order, err))
        return false;
    mu_logit_bias *bias = mu_xmalloc((p->n_logit_bias ? p->n_logit_bias : 1) * sizeof *bias);
    for (size_t i = 0; i < p->n_logit_bias; i++)
        bias[i] = (mu_logit_bias){p->logit_bias[i].token, p->logit_bias[i].bias};
    q.logit_bias = bias;
    q.n_logit_bias = p->n_logit_bias;
    const mu_model_config *cfg = &s->model->m->cfg;
    q.n_ctx_train = cfg->n_ctx_train > INT32_MAX ? INT32_MAX : (int32_t)cfg->n_ctx_train;
    q.n_ctx = p->n_ctx > 0 ? p->n_ctx : q.n_ctx_train;
    const mu_tokenizer *tok = s->model->tok;
    q.dry_tokenize = tok ? dry_tokenize : NULL;
    q.dry_tokenize_ctx = (void *)tok;
    piece_table pieces = {0};
    bool need_pieces = mu_sampler_stage_active(&q, MU_SAMPLER_DRY) && q.n_dry_breakers && q.mirostat == 0;
    bool ok = true;
    if (need_pieces && !tok) {
        mu_err_set(err, "%s has no tokenizer: DRY sequence breakers need token texts", s->model->m->gguf->path);
        ok = false;
    } else if (need_pieces) {
        ok = dry_pieces(tok, s->n_vocab, &pieces, err);
    }
    if (ok) {
        s->chain = mu_sampler_new(&q, s->n_vocab, (const char *const *)pieces.piece, pieces.len, err);
        ok = s->chain != NULL;
    }
    piece_table_free(&pieces);
    free(bias);
    s->params = q;
    s->params.logit_bias = NULL;
    s->params.dry_breakers = NULL;
    s->params.n_dry_breakers = 0;
    s->params.dry_tokenize = NULL;
    s->params.dry_tokenize_ctx = NULL;
    s->has_logit_bias = p->n_logit_bias > 0;
    return ok;
}

/* ----------------------------------------------------------- grammar */

mu_grammar_vocab *mu_api_grammar_vocab(const muser_model *m, mu_error *err) {
    if (!m->tok) {
        mu_err_set(err, "%s has no tokenizer: no token texts for a grammar vocabulary", m->m->gguf->path);
        return NULL;
    }
    int32_t n = (int32_t)m->m->cfg.n_vocab;
    size_t *len = mu_xmalloc((size_t)n * sizeof *len);
    size_t *off = mu_xmalloc((size_t)n * sizeof *off);
    size_t total = 0, cap = (size_t)n * 8 + 64;
    char *bytes = mu_xmalloc(cap);
    /* Grammar pieces are llama_token_to_piece(special = true) (llama's cache). */
    for (int32_t id = 0; id < n; id++) {
        size_t need = mu_token_to_piece(m->tok, id, true, NULL, 0);
        if (total + need > cap) bytes = mu_xrealloc(bytes, cap = (total + need) * 2);
        mu_token_to_piece(m->tok, id, true, bytes + total, need);
        off[id] = total;
        len[id] = need;
        total += need;
    }
    const char **piece = mu_xmalloc((size_t)n * sizeof *piece);
    bool *is_eog = mu_xcalloc((size_t)n, sizeof *is_eog);
    for (int32_t id = 0; id < n; id++) {
        piece[id] = bytes + off[id];
        is_eog[id] = mu_token_is_eog(m->tok, id);
    }
    mu_grammar_vocab *v = mu_grammar_vocab_new(n, piece, len, is_eog, err);
    free(is_eog);
    free(piece);
    free(bytes);
    free(off);
    free(len);
    return v;
}

const mu_grammar_vocab *mu_api_shared_grammar_vocab(const muser_model *m, mu_error *err) {
    muser_model *mm = (muser_model *)m; /* the cache is the only mutable part, under its lock */
    pthread_mutex_lock(&mm->gvocab_lock);
    if (!mm->gvocab) mm->gvocab = mu_api_grammar_vocab(m, err);
    const mu_grammar_vocab *v = mm->gvocab;
    pthread_mutex_unlock(&mm->gvocab_lock);
    return v;
}

/* `<token-text>` terminals: llama tokenizes the text with special-token
 * parsing and requires exactly one token. */
static int32_t lookup_token(void *ctx, const char *text, size_t len) {
    int32_t *ids = NULL;
    int64_t n = mu_tokenize(ctx, text, len, false, true, &ids, NULL);
    int32_t id = n == 1 ? ids[0] : -1;
    free(ids);
    return id;
}

static bool build_grammar(muser_sampler *s, const muser_sampling_params *p, mu_error *err) {
    char *schema_gbnf = NULL;
    const char *text = p->grammar;
    if (p->json_schema) {
        schema_gbnf = mu_json_schema_to_gbnf(p->json_schema, strlen(p->json_schema), err);
        if (!schema_gbnf) return false;
        text = schema_gbnf;
    }
    const mu_tokenizer *tok = s->model->tok;
    s->grammar = mu_grammar_parse_ex(text, strlen(text), p->json_schema ? NULL : p->grammar_root,
                                     lookup_token, (void *)tok, s->n_vocab, err);
    if (!s->grammar && p->json_schema) mu_err_prefix(err, "json schema: generated");
    free(schema_gbnf);
    if (!s->grammar) return false;
    s->gvocab = mu_api_shared_grammar_vocab(s->model, err);
    if (!s->gvocab) return false;
    s->gstate = mu_grammar_state_new(s->grammar, err);
    if (!s->gstate) return false;
    s->mask = mu_xmalloc(((size_t)s->n_vocab + 31) / 32 * sizeof *s->mask);
    return true;
}

/* ---------------------------------------------------------- lifecycle */

muser_sampler *muser_sampler_create(const muser_model *m, const muser_sampling_params *p, muser_error *err) {
    if (!m || !p) {
        mu_err_set(ERR(err), "muser_sampler_create: model and params are required");
        return NULL;
    }
    int32_t n_vocab = (int32_t)m->m->cfg.n_vocab;
    if (!check_params(m, p, n_vocab, ERR(err))) return NULL;
    muser_sampler *s = mu_xcalloc(1, sizeof *s);
    s->model = m;
    s->n_vocab = n_vocab;
    s->n_probs = p->n_probs;
    bool ok = build_chain(s, p, ERR(err));
    if (ok && (p->grammar || p->json_schema)) ok = build_grammar(s, p, ERR(err));
    if (!ok) {
        muser_sampler_free(s);
        return NULL;
    }
    if (p->ignore_eos && m->tok) s->n_banned = mu_tokenizer_eog_ids(m->tok, &s->banned);
    return s;
}

void muser_sampler_free(muser_sampler *s) {
    if (!s) return;
    mu_sampler_free(s->chain);
    mu_grammar_state_free(s->gstate);
    mu_grammar_free(s->grammar);
    free(s->mask);
    free(s->gtok);
    free(s);
}

void muser_sampler_reset(muser_sampler *s) {
    mu_sampler_reset(s->chain);
    if (s->grammar) {
        mu_grammar_state *fresh = mu_grammar_state_new(s->grammar, NULL);
        if (fresh) { /* cannot fail for a grammar whose first state was built */
            mu_grammar_state_free(s->gstate);
            s->gstate = fresh;
        }
        s->n_gtok = 0;
    }
}

uint32_t muser_sampler_seed(const muser_sampler *s) { return mu_sampler_seed(s->chain); }

bool muser_sampler_grammar_complete(const muser_sampler *s) {
    return !s->gstate || mu_grammar_is_complete(s->gstate);
}

bool muser_sampler_is_argmax(const muser_sampler *s) {
    return s && !s->gstate && !s->has_logit_bias && mu_sampler_is_greedy(s->chain);
}

bool muser_sampler_bans(const muser_sampler *s, int32_t token) {
    for (size_t i = 0; i < s->n_banned; i++)
        if (s->banned[i] == token) return true;
    return false;
}

/* ------------------------------------------------------- sample/accept */

static bool check_token(const muser_sampler *s, int32_t token, mu_error *err) {
    if (token >= 0 && token < s->n_vocab) return true;
    mu_err_set(err, "sampler: token %d is outside the vocabulary (0..%d)", token, s->n_vocab - 1);
    return false;
}

bool muser_sampler_accept_prompt(muser_sampler *s, const int32_t *tokens, size_t n, muser_error *err) {
    for (size_t i = 0; i < n; i++)
        if (!check_token(s, tokens[i], ERR(err))) return false;
    for (size_t i = 0; i < n; i++) mu_sampler_accept(s->chain, tokens[i]);
    return true;
}

static bool grammar_accepts(void *ctx, int32_t token) {
    const muser_sampler *s = ctx;
    return mu_grammar_allows(s->gstate, s->gvocab, token);
}

/* Candidates arrive as the fresh full row, but nothing below relies on it. */
static void grammar_apply(void *ctx, mu_candidates *c) {
    muser_sampler *s = ctx;
    if (!mu_grammar_mask_bits(s->gstate, s->gvocab, s->mask, &s->mask_err)) s->mask_failed = true;
    for (size_t i = 0; i < c->size; i++) {
        uint32_t id = (uint32_t)c->data[i].id;
        if (!(s->mask[id >> 5] >> (id & 31) & 1u)) c->data[i].logit = -INFINITY;
    }
}

int32_t muser_sampler_sample(muser_sampler *s, const float *logits, muser_error *err) {
    mu_sample_constraint c = {s, grammar_accepts, grammar_apply};
    s->mask_failed = false;
    int32_t id = mu_sampler_sample(s->chain, logits, s->banned, s->n_banned, s->gstate ? &c : NULL, ERR(err));
    if (s->mask_failed) {
        mu_err_set(ERR(err), "grammar: %s", s->mask_err.msg);
        return -1;
    }
    if (id < 0 && s->gstate && s->n_banned && mu_grammar_is_complete(s->gstate))
        mu_err_set(ERR(err), "grammar is complete: only end-of-generation can follow, and ignore_eos bans it");
    return id;
}

static void describe_token(const muser_sampler *s, int32_t token, char *buf, size_t cap) {
    char piece[64];
    size_t n = s->model->tok ? mu_token_to_piece(s->model->tok, token, true, piece, sizeof piece - 1) : 0;
    if (n > sizeof piece - 1) n = sizeof piece - 1;
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) { /* printable ASCII as is, the rest escaped */
        unsigned char ch = (unsigned char)piece[i];
        o += (size_t)snprintf(buf + o, cap - o, ch >= 0x20 && ch < 0x7F && ch != '"' ? "%c" : "\\x%02X", ch);
    }
    buf[o < cap ? o : cap - 1] = '\0';
}

bool muser_sampler_accept(muser_sampler *s, int32_t token, muser_error *err) {
    if (!check_token(s, token, ERR(err))) return false;
    if (s->gstate) {
        mu_error gerr;
        if (!mu_grammar_accept_token(s->gstate, s->gvocab, token, &gerr)) {
            char text[160];
            describe_token(s, token, text, sizeof text);
            mu_err_set(ERR(err), "grammar refuses token %d (\"%s\"): %s", token, text, gerr.msg);
            return false;
        }
        if (s->n_gtok == s->cap_gtok)
            s->gtok = mu_xrealloc(s->gtok, (s->cap_gtok = s->cap_gtok * 2 + 64) * sizeof *s->gtok);
        s->gtok[s->n_gtok++] = token;
    }
    mu_sampler_accept(s->chain, token);
    return true;
}

/* ---------------------------------------------------------- snapshots */
/* Layout, little-endian: "MUSAMPL1", u32 has_grammar, u32 chain bytes, the
 * chain snapshot (sample.h), u32 n, n x i32 tokens the grammar accepted.
 * The grammar position is restored by replaying those tokens. */

static const char STATE_MAGIC[8] = {'M', 'U', 'S', 'A', 'M', 'P', 'L', '1'};

size_t muser_sampler_state_size(const muser_sampler *s) {
    return sizeof STATE_MAGIC + 8 + mu_sampler_state_size(s->chain) + 4 + 4 * s->n_gtok;
}

static uint8_t *put_u32(uint8_t *o, uint32_t v) {
    for (int i = 0; i < 4; i++) o[i] = (uint8_t)(v >> (8 * i));
    return o + 4;
}

static uint32_t get_u32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

bool muser_sampler_state_save(const muser_sampler *s, void *buf, size_t cap, muser_error *err) {
    size_t need = muser_sampler_state_size(s), chain = mu_sampler_state_size(s->chain);
    if (!buf || cap < need) {
        mu_err_set(ERR(err), "sampler state needs %zu bytes, the buffer has %zu", need, buf ? cap : 0);
        return false;
    }
    uint8_t *o = buf;
    memcpy(o, STATE_MAGIC, sizeof STATE_MAGIC);
    o = put_u32(o + sizeof STATE_MAGIC, s->grammar != NULL);
    o = put_u32(o, (uint32_t)chain);
    if (!mu_sampler_state_save(s->chain, o, chain)) {
        mu_err_set(ERR(err), "sampler state: chain snapshot failed");
        return false;
    }
    o = put_u32(o + chain, (uint32_t)s->n_gtok);
    for (size_t i = 0; i < s->n_gtok; i++) o = put_u32(o, (uint32_t)s->gtok[i]);
    return true;
}

/* Replays the grammar tokens into a fresh state; NULL + err on refusal. */
static mu_grammar_state *replay_grammar(const muser_sampler *s, const uint8_t *at, uint32_t n, mu_error *err) {
    mu_grammar_state *st = mu_grammar_state_new(s->grammar, err);
    for (uint32_t i = 0; st && i < n; i++) {
        int32_t t = (int32_t)get_u32(at + 4 * (size_t)i);
        if (!check_token(s, t, err) || !mu_grammar_accept_token(st, s->gvocab, t, err)) {
            mu_err_prefix(err, "sampler state: grammar token %u of %u", i + 1, n);
            mu_grammar_state_free(st);
            st = NULL;
        }
    }
    return st;
}

bool muser_sampler_state_load(muser_sampler *s, const void *buf, size_t len, muser_error *err) {
    const uint8_t *b = buf;
    if (!buf || len < sizeof STATE_MAGIC + 8 || memcmp(b, STATE_MAGIC, sizeof STATE_MAGIC)) {
        mu_err_set(ERR(err), "sampler state: bad magic or too short (%zu bytes)", len);
        return false;
    }
    bool has_grammar = get_u32(b + 8) != 0;
    size_t chain = get_u32(b + 12), at = sizeof STATE_MAGIC + 8;
    if (has_grammar != (s->grammar != NULL)) {
        mu_err_set(ERR(err), "sampler state: saved %s a grammar, this sampler has %s", has_grammar ? "with" : "without",
                   s->grammar ? "one" : "none");
        return false;
    }
    if (chain > len - at || len - at - chain < 4) {
        mu_err_set(ERR(err), "sampler state: truncated (%zu bytes)", len);
        return false;
    }
    uint32_t n = get_u32(b + at + chain);
    size_t tail = len - at - chain - 4;
    if (tail != 4 * (size_t)n) {
        mu_err_set(ERR(err), "sampler state: %zu bytes of grammar tokens, expected %zu", tail, 4 * (size_t)n);
        return false;
    }
    if (n && !has_grammar) {
        mu_err_set(ERR(err), "sampler state: grammar tokens without a grammar");
        return false;
    }
    mu_grammar_state *st = NULL;
    if (has_grammar && !(st = replay_grammar(s, b + at + chain + 4, n, ERR(err)))) return false;
    if (!mu_sampler_state_load(s->chain, b + at, chain, ERR(err))) {
        mu_grammar_state_free(st);
        return false;
    }
    if (has_grammar) {
        mu_grammar_state_free(s->gstate);
        s->gstate = st;
        if (n > s->cap_gtok) s->gtok = mu_xrealloc(s->gtok, (s->cap_gtok = n) * sizeof *s->gtok);
        for (uint32_t i = 0; i < n; i++) s->gtok[i] = (int32_t)get_u32(b + at + chain + 4 + 4 * (size_t)i);
        s->n_gtok = n;
    }
    return true;
}

/* ------------------------------------------------------------ printing */

size_t muser_sampler_chain_str(const muser_sampler *s, char *buf, size_t cap) {
    mu_sampler_params p = s->params;
    /* the printer only counts the bias list, and llama-server counts the
     * ignore-eos entries in it */
    static const mu_logit_bias one = {0, 0.0f};
    p.logit_bias = &one;
    p.n_logit_bias = s->has_logit_bias || s->n_banned ? 1 : 0;
    return mu_sampler_chain_print(&p, buf, cap);
}

size_t muser_sampler_params_str(const muser_sampler *s, char *buf, size_t cap) {
    return mu_sampler_params_print(&s->params, buf, cap);
}

/* ------------------------------------------------------------ logprobs */

size_t muser_token_piece(const muser_model *m, int32_t id, bool render_special, char *buf, size_t cap) {
    return m->tok ? mu_token_to_piece(m->tok, id, render_special, buf, cap) : 0;
}

bool muser_logprobs(const muser_model *m, const float *logits, int32_t chosen, int32_t n_top,
                    muser_logprob *chosen_out, muser_logprob *top, muser_error *err) {
    int64_t n_vocab = m->m->cfg.n_vocab;
    if (chosen < 0 || chosen >= n_vocab || n_top < 0 || n_top > n_vocab || (n_top && !top) || !chosen_out) {
        mu_err_set(ERR(err), "logprobs: chosen %d must be in [0, %lld) and n_top %d in [0, %lld] with room for it",
                   chosen, (long long)n_vocab, n_top, (long long)n_vocab);
        return false;
    }
    mu_token_logprob c, *t = mu_xmalloc((size_t)(n_top ? n_top : 1) * sizeof *t);
    bool ok = mu_logprobs(logits, (size_t)n_vocab, chosen, &c, (size_t)n_top, t, ERR(err));
    if (ok) {
        *chosen_out = (muser_logprob){c.id, c.logprob};
        for (int32_t i = 0; i < n_top; i++) top[i] = (muser_logprob){t[i].id, t[i].logprob};
    }
    free(t);
    return ok;
}

int32_t muser_sampler_logprobs(const muser_sampler *s, const float *logits, int32_t chosen,
                               muser_logprob *chosen_out, muser_logprob *top, muser_error *err) {
    return muser_logprobs(s->model, logits, chosen, s->n_probs, chosen_out, top, err) ? s->n_probs : -1;
}
