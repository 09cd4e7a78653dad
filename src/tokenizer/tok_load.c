/* Building a tokenizer from GGUF metadata, following llama.cpp's
 * llama_vocab::impl::load: model defaults, pre-tokenizer flags, tokens and
 * their attributes, special ids, the text-based detection of EOT / EOM / FIM
 * tokens, the end-of-generation set and the per-model attribute quirks. */
#include "tokenizer/tok_internal.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>

#define LIST_END NULL
static const char *const EOT_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>", LIST_END};
static const char *const EOM_TEXTS[] = {"<|eom_id|>", LIST_END};
static const char *const FIM_PRE_TEXTS[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", LIST_END};
static const char *const FIM_SUF_TEXTS[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>", LIST_END};
static const char *const FIM_MID_TEXTS[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
    "<|code_middle|>", "<|middle|>", LIST_END};
static const char *const FIM_PAD_TEXTS[] = {
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", LIST_END};
static const char *const FIM_REP_TEXTS[] = {
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", LIST_END};
static const char *const FIM_SEP_TEXTS[] = {"<|file_sep|>", LIST_END};
/* Texts that end generation (llama.cpp's list, plus Llama-4's "<|eot|>"). */
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "<|eot|>", LIST_END};

static int32_t find_str(const mu_tokenizer *t, const char *s) {
    return tok_map_get(&t->by_text, s, strlen(s));
}

static uint16_t attr_from_type(int64_t type) {
    switch (type) {
    case 1: return MU_TOKEN_ATTR_NORMAL;
    case 2: return MU_TOKEN_ATTR_UNKNOWN;
    case 3: return MU_TOKEN_ATTR_CONTROL;
    case 4: return MU_TOKEN_ATTR_USER_DEFINED;
    case 5: return MU_TOKEN_ATTR_UNUSED;
    case 6: return MU_TOKEN_ATTR_BYTE;
    default: return MU_TOKEN_ATTR_UNDEFINED;
    }
}

/* ---------------- tokens ---------------- */

static const gguf_value *get_array(const gguf_file *f, const char *key, uint64_t min_n,
                                   bool strings, mu_error *err) {
    const gguf_value *v = gguf_get(f, key);
    if (!v) return NULL;
    if (v->type != GGUF_VT_ARRAY || (strings != (v->v.arr.elem_type == GGUF_VT_STRING)) ||
        v->v.arr.elem_type == GGUF_VT_ARRAY) {
        mu_err_set(err, "%s must be an array of %s, found %s", key, strings ? "strings" : "numbers",
                   gguf_vtype_name(v->type == GGUF_VT_ARRAY ? v->v.arr.elem_type : v->type));
        return (const gguf_value *)-1;
    }
    if (v->v.arr.n < min_n) {
        mu_err_set(err, "%s has %llu entries, fewer than the %llu tokens", key,
                   (unsigned long long)v->v.arr.n, (unsigned long long)min_n);
        return (const gguf_value *)-1;
    }
    return v;
}
#define BAD_ARRAY ((const gguf_value *)-1)

static bool load_tokens(mu_tokenizer *t, const gguf_file *f, mu_error *err) {
    const gguf_value *tokens = get_array(f, "tokenizer.ggml.tokens", 1, true, err);
    if (!tokens) mu_err_set(err, "tokenizer.ggml.tokens is missing");
    if (!tokens || tokens == BAD_ARRAY) return false;
    if (tokens->v.arr.n > INT32_MAX) {
        mu_err_set(err, "tokenizer.ggml.tokens has %llu entries (limit %d)",
                   (unsigned long long)tokens->v.arr.n, INT32_MAX);
        return false;
    }
    int64_t n = (int64_t)tokens->v.arr.n;
    const gguf_value *scores = get_array(f, "tokenizer.ggml.scores", (uint64_t)n, false, err);
    const gguf_value *types = get_array(f, "tokenizer.ggml.token_type", (uint64_t)n, false, err);
    if (scores == BAD_ARRAY || types == BAD_ARRAY) return false;
    t->n_vocab = n;
    t->text_off = mu_xmalloc((size_t)n * sizeof *t->text_off);
    t->text_len = mu_xmalloc((size_t)n * sizeof *t->text_len);
    t->scores = mu_xcalloc((size_t)n, sizeof *t->scores);
    t->attr = mu_xmalloc((size_t)n * sizeof *t->attr);
    tok_map_init(&t->by_text, &t->text, (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        const gguf_str *s = &tokens->v.arr.strs[i];
        char empty[32];
        const char *p = s->ptr;
        size_t len = s->len;
        if (len == 0) { /* llama.cpp's placeholder for empty entries */
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%lld]", (long long)i);
            p = empty;
        }
        if (len > TOK_MAX_TOKEN_LEN || t->text.len + len + 1 > TOK_ARENA_LIMIT) {
            mu_err_set(err, "tokenizer.ggml.tokens[%lld] is %zu bytes long (limit %d, %u total)",
                       (long long)i, len, TOK_MAX_TOKEN_LEN, TOK_ARENA_LIMIT);
            return false;
        }
        t->text_off[i] = tok_arena_add(&t->text, p, len);
        t->text_len[i] = (uint32_t)len;
        int32_t dup = tok_map_put(&t->by_text, t->text_off[i], (uint32_t)len, (int32_t)i);
        if (dup >= 0) {
            mu_err_set(err, "tokenizer.ggml.tokens[%lld] repeats token %d '%.*s'", (long long)i,
                       dup, (int)(len > 64 ? 64 : len), p);
            return false;
        }
        double score = 0;
        int64_t type = 1;
        if (scores && !gguf_arr_get_f64(scores, (uint64_t)i, &score)) score = 0;
        if (types && !gguf_arr_get_i64(types, (uint64_t)i, &type)) type = 0;
        t->scores[i] = (float)score;
        t->attr[i] = types ? attr_from_type(type) : MU_TOKEN_ATTR_NORMAL;
    }
    return true;
}

/* ---------------- special ids ---------------- */

static bool load_special_ids(mu_tokenizer *t, const gguf_file *f, mu_error *err) {
    const struct { const char *key; int32_t *dst; } keys[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},
        {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.eot_token_id", &t->eot},
        {"tokenizer.ggml.eom_token_id", &t->eom},
        {"tokenizer.ggml.unknown_token_id", &t->unk},
        {"tokenizer.ggml.seperator_token_id", &t->sep},
        {"tokenizer.ggml.padding_token_id", &t->pad},
        {"tokenizer.ggml.mask_token_id", &t->mask},
        {"tokenizer.ggml.fim_pre_token_id", &t->fim_pre},
        {"tokenizer.ggml.fim_suf_token_id", &t->fim_suf},
        {"tokenizer.ggml.fim_mid_token_id", &t->fim_mid},
        {"tokenizer.ggml.fim_pad_token_id", &t->fim_pad},
        {"tokenizer.ggml.fim_rep_token_id", &t->fim_rep},
        {"tokenizer.ggml.fim_sep_token_id", &t->fim_sep},
        {"tokenizer.ggml.prefix_token_id", &t->fim_pre}, /* deprecated names */
        {"tokenizer.ggml.suffix_token_id", &t->fim_suf},
        {"tokenizer.ggml.middle_token_id", &t->fim_mid},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        uint32_t v;
        int r = gguf_get_u32(f, keys[i].key, &v, err);
        if (r < 0) return false;
        if (r == 0) continue;
        if (v >= t->n_vocab) {
            mu_err_set(err, "%s = %u is outside the vocabulary (%lld tokens)", keys[i].key, v,
                       (long long)t->n_vocab);
            return false;
        }
        *keys[i].dst = (int32_t)v;
    }
    const struct { const char *key; bool *dst; } flags[] = {
        {"tokenizer.ggml.add_bos_token", &t->add_bos},
        {"tokenizer.ggml.add_eos_token", &t->add_eos},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (gguf_get_bool(f, flags[i].key, flags[i].dst, err) < 0) return false;
    /* model defaults that do not exist in a small vocabulary */
    int32_t *defaults[] = {&t->bos, &t->eos, &t->unk};
    for (size_t i = 0; i < 3; i++)
        if (*defaults[i] >= t->n_vocab) *defaults[i] = -1;
    return true;
}

/* When the id is not set by a key, the first text of the list that is in
 * the vocabulary gives the token, which becomes a control token. */
static void detect_by_text(mu_tokenizer *t, int32_t *dst, const char *const *texts) {
    for (size_t i = 0; *dst < 0 && texts[i]; i++) *dst = find_str(t, texts[i]);
    if (*dst >= 0) t->attr[*dst] |= MU_TOKEN_ATTR_CONTROL;
}

static void eog_add(mu_tokenizer *t, int32_t id) {
    if (id < 0) return;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    t->eog = mu_xrealloc(t->eog, (t->n_eog + 1) * sizeof *t->eog);
    t->eog[t->n_eog++] = id;
}

static void eog_remove(mu_tokenizer *t, int32_t id) {
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) t->eog[i] = t->eog[--t->n_eog];
}

static bool eog_has_text(const mu_tokenizer *t, const char *s, int32_t *id) {
    for (size_t i = 0; i < t->n_eog; i++) {
        int32_t e = t->eog[i];
        if (t->text_len[e] == strlen(s) && !memcmp(t->text.p + t->text_off[e], s, strlen(s))) {
            if (id) *id = e;
            return true;
        }
    }
    return false;
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void build_eog(mu_tokenizer *t) {
    detect_by_text(t, &t->eot, EOT_TEXTS);
    detect_by_text(t, &t->eom, EOM_TEXTS);
    detect_by_text(t, &t->fim_pre, FIM_PRE_TEXTS);
    detect_by_text(t, &t->fim_suf, FIM_SUF_TEXTS);
    detect_by_text(t, &t->fim_mid, FIM_MID_TEXTS);
    detect_by_text(t, &t->fim_pad, FIM_PAD_TEXTS);
    detect_by_text(t, &t->fim_rep, FIM_REP_TEXTS);
    detect_by_text(t, &t->fim_sep, FIM_SEP_TEXTS);
    eog_add(t, t->fim_pad);
    eog_add(t, t->fim_rep);
    eog_add(t, t->fim_sep);
    for (size_t i = 0; EOG_TEXTS[i]; i++) {
        int32_t id = find_str(t, EOG_TEXTS[i]);
        if (id < 0) continue;
        eog_add(t, id);
        t->attr[id] |= MU_TOKEN_ATTR_CONTROL;
    }
    /* gpt-oss: these always render, as user-defined tokens */
    static const char *const harmony_user[] = {"<|channel|>", "<|message|>", "<|start|>",
                                               "<|constrain|>"};
    for (size_t i = 0; i < 4; i++) {
        int32_t id = find_str(t, harmony_user[i]);
        if (id >= 0) t->attr[id] = MU_TOKEN_ATTR_USER_DEFINED;
    }
    /* the eos / eot / eom keys always end generation: Muse Glimmer's two
     * end tokens are eos and eot */
    eog_add(t, t->eos);
    eog_add(t, t->eot);
    eog_add(t, t->eom);
    /* o200k_harmony / solar-open: "<|end|>" ends a message, not generation */
    int32_t end_id;
    bool has_return = eog_has_text(t, "<|return|>", NULL);
    bool has_call = eog_has_text(t, "<|call|>", NULL) || eog_has_text(t, "<|calls|>", NULL);
    bool has_flush = eog_has_text(t, "<|flush|>", NULL);
    if (eog_has_text(t, "<|end|>", &end_id) && has_call && (has_return || has_flush)) {
        eog_remove(t, end_id);
        t->attr[end_id] = MU_TOKEN_ATTR_USER_DEFINED;
    }
    /* gemma4 / paddleocr: "</s>" is not an end token next to "<|tool_response>" */
    int32_t s_id;
    if (eog_has_text(t, "<|tool_response>", NULL) && eog_has_text(t, "</s>", &s_id)) {
        eog_remove(t, s_id);
        t->attr[s_id] = MU_TOKEN_ATTR_NORMAL;
    }
    qsort(t->eog, t->n_eog, sizeof *t->eog, cmp_id);
}

/* Attribute quirks llama.cpp applies by model or pre-tokenizer name. */
static void apply_name_quirks(mu_tokenizer *t, const gguf_file *f, const char *pre) {
    char *name = NULL, *arch = NULL;
    gguf_get_str(f, "general.name", &name, NULL);
    gguf_get_str(f, "general.architecture", &arch, NULL);
    for (char *c = name; c && *c; c++) *c = (char)tolower((unsigned char)*c);
    bool jina = pre && (strstr(pre, "jina-v2-de") || strstr(pre, "jina-v2-es") ||
                        strstr(pre, "jina-v2-code"));
    jina = jina || (arch && (strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")));
    int32_t id;
    if (jina) {
        if ((id = find_str(t, "<mask>")) >= 0) t->attr[id] |= MU_TOKEN_ATTR_LSTRIP;
    } else if (name && (strstr(name, "phi-3") || strstr(name, "phi3"))) {
        for (int64_t i = 0; i < t->n_vocab; i++)
            if (t->attr[i] & (MU_TOKEN_ATTR_CONTROL | MU_TOKEN_ATTR_USER_DEFINED |
                              MU_TOKEN_ATTR_UNKNOWN))
                t->attr[i] |= MU_TOKEN_ATTR_RSTRIP;
        if ((id = find_str(t, "</s>")) >= 0) t->attr[id] |= MU_TOKEN_ATTR_RSTRIP;
        static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
        for (size_t i = 0; i < 3; i++)
            if ((id = find_str(t, keep[i])) >= 0) t->attr[id] &= (uint16_t)~MU_TOKEN_ATTR_RSTRIP;
    } else if (name && strstr(name, "modern-bert")) {
        if ((id = find_str(t, "[MASK]")) >= 0) t->attr[id] |= MU_TOKEN_ATTR_LSTRIP;
    }
    free(name);
    free(arch);
}

/* ---------------- load ---------------- */

static bool set_model(mu_tokenizer *t, const gguf_file *f, char *pre, mu_error *err) {
    char *model = NULL;
    int r = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
    if (r == 0) mu_err_set(err, "tokenizer.ggml.model is missing: the file has no tokenizer");
    if (r <= 0) return false;
    bool ok = true;
    t->bos = t->eos = t->eot = t->eom = t->unk = t->sep = t->pad = t->mask = -1;
    t->fim_pre = t->fim_suf = t->fim_mid = t->fim_pad = t->fim_rep = t->fim_sep = -1;
    if (!strcmp(model, "llama")) {
        t->kind = TOK_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_space_prefix = true;
        t->add_bos = true;
    } else if (!strcmp(model, "gpt2")) {
        t->kind = TOK_BPE;
        t->bos = t->eos = 11; /* llama.cpp's BPE defaults */
        tok_pre_flags fl = {0};
        t->pre = tok_pre_new(pre, &fl, err);
        ok = t->pre != NULL;
        t->clean_spaces = fl.clean_spaces;
        t->ignore_merges = fl.ignore_merges;
        t->add_bos = fl.add_bos_default;
        if (fl.no_bos) t->bos = -1;
    } else {
        mu_err_set(err, "unsupported tokenizer: tokenizer.ggml.model = '%s' (supported: gpt2, "
                   "llama)", model);
        ok = false;
    }
    if (ok) snprintf(t->model, sizeof t->model, "%s", model);
    free(model);
    return ok &&
           gguf_get_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err) >= 0;
}

mu_tokenizer *mu_tokenizer_load(const gguf_file *f, mu_error *err) {
    mu_tokenizer *t = mu_xcalloc(1, sizeof *t);
    char *pre = NULL;
    bool ok = gguf_get_str(f, "tokenizer.ggml.pre", &pre, err) >= 0 &&
              set_model(t, f, pre, err) && load_tokens(t, f, err);
    if (ok && t->kind == TOK_BPE) {
        const gguf_value *merges = gguf_get(f, "tokenizer.ggml.merges");
        if (!merges) mu_err_set(err, "tokenizer.ggml.merges is missing (required by gpt2)");
        ok = merges && tok_bpe_build(t, merges, err);
    }
    if (ok && t->kind == TOK_SPM) tok_spm_build(t);
    ok = ok && load_special_ids(t, f, err);
    if (ok) {
        build_eog(t);
        apply_name_quirks(t, f, pre);
        tok_special_build(t);
        ok = tok_pieces_build(t, err);
    }
    free(pre);
    if (!ok) {
        mu_err_prefix(err, "tokenizer of %s", f->path ? f->path : "(memory)");
        mu_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void mu_tokenizer_free(mu_tokenizer *t) {
    if (!t) return;
    tok_pre_free(t->pre);
    free(t->text.p);
    free(t->text_off);
    free(t->text_len);
    free(t->pieces.p);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->attr);
    tok_map_free(&t->by_text);
    free(t->sym_text.p);
    tok_map_free(&t->sym_map);
    free(t->sym_tok);
    tok_pairmap_free(&t->merges);
    free(t->eog);
    free(t->special_prio);
    free(t->trie);
    free(t);
}

/* ---------------- accessors ---------------- */

int64_t mu_tokenizer_n_vocab(const mu_tokenizer *t) { return t->n_vocab; }
const char *mu_tokenizer_model(const mu_tokenizer *t) { return t->model; }
const char *mu_tokenizer_pre(const mu_tokenizer *t) {
    return t->pre ? tok_pre_name(t->pre) : "default";
}

int32_t mu_tokenizer_find(const mu_tokenizer *t, const char *text, size_t len) {
    return tok_map_get(&t->by_text, text, len);
}

const char *mu_token_text_n(const mu_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->text_len[id];
    return t->text.p + t->text_off[id];
}

const char *mu_token_text(const mu_tokenizer *t, int32_t id) {
    return mu_token_text_n(t, id, NULL);
}

uint32_t mu_token_attr(const mu_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab ? t->attr[id] : 0;
}

bool mu_token_is_control(const mu_tokenizer *t, int32_t id) {
    return mu_token_attr(t, id) & MU_TOKEN_ATTR_CONTROL;
}

bool mu_token_is_eog(const mu_tokenizer *t, int32_t id) {
    return id >= 0 && bsearch(&id, t->eog, t->n_eog, sizeof *t->eog, cmp_id) != NULL;
}

size_t mu_tokenizer_eog_ids(const mu_tokenizer *t, const int32_t **ids) {
    *ids = t->eog;
    return t->n_eog;
}

int32_t mu_token_bos(const mu_tokenizer *t) { return t->bos; }
int32_t mu_token_eos(const mu_tokenizer *t) { return t->eos; }
int32_t mu_token_eot(const mu_tokenizer *t) { return t->eot; }
int32_t mu_token_eom(const mu_tokenizer *t) { return t->eom; }
int32_t mu_token_unk(const mu_tokenizer *t) { return t->unk; }
int32_t mu_token_pad(const mu_tokenizer *t) { return t->pad; }
int32_t mu_token_mask(const mu_tokenizer *t) { return t->mask; }
bool mu_tokenizer_add_bos(const mu_tokenizer *t) { return t->add_bos; }
bool mu_tokenizer_add_eos(const mu_tokenizer *t) { return t->add_eos; }
