/* The text layer of the public API: tokenizer, streaming detokenizer and
 * chat templates over the model's GGUF metadata. */
#include "model/api_internal.h"
#include "template/template.h"
#include <stdlib.h>

bool mu_api_load_text(muser_model *mm, mu_error *err) {
    const gguf_file *f = mm->m->gguf;
    if (!gguf_get(f, "tokenizer.ggml.model")) return true; /* token ids only */
    mm->tok = mu_tokenizer_load(f, err);
    if (!mm->tok) {
        mu_err_prefix(err, "%s", f->path);
        return false;
    }
    if (mu_tokenizer_n_vocab(mm->tok) != mm->m->cfg.n_vocab) {
        mu_err_set(err, "%s: tokenizer has %lld tokens but the model has %lld vocabulary rows", f->path,
                   (long long)mu_tokenizer_n_vocab(mm->tok), (long long)mm->m->cfg.n_vocab);
        return false;
    }
    int r = gguf_get_str(f, "tokenizer.chat_template", &mm->chat_template, err);
    if (r < 0) {
        mu_err_prefix(err, "%s", f->path);
        return false;
    }
    if (!gguf_sha256_chat_template(f, mm->chat_template_sha)) mm->chat_template_sha[0] = 0;
    return true;
}

void mu_api_free_text(muser_model *mm) {
    mu_tokenizer_free(mm->tok);
    free(mm->chat_template);
}

static bool need_tokenizer(const muser_model *m, mu_error *err) {
    if (m->tok) return true;
    mu_err_set(err, "%s has no tokenizer metadata (tokenizer.ggml.*); use token ids", m->m->gguf->path);
    return false;
}

bool muser_model_has_tokenizer(const muser_model *m) { return m->tok != NULL; }

int64_t muser_tokenize(const muser_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                       int32_t **out, muser_error *err) {
    if (!need_tokenizer(m, ERR(err))) return -1;
    return mu_tokenize(m->tok, text, len, add_special, parse_special, out, ERR(err));
}

char *muser_detokenize(const muser_model *m, const int32_t *ids, size_t n, bool render_special, size_t *len,
                       muser_error *err) {
    if (!need_tokenizer(m, ERR(err))) return NULL;
    return mu_detokenize(m->tok, ids, n, false, render_special, len, ERR(err));
}

const char *muser_token_text(const muser_model *m, int32_t id) { return m->tok ? mu_token_text(m->tok, id) : NULL; }
bool muser_token_is_eog(const muser_model *m, int32_t id) { return m->tok && mu_token_is_eog(m->tok, id); }
int32_t muser_token_bos(const muser_model *m) { return m->tok ? mu_token_bos(m->tok) : -1; }

struct muser_detok {
    mu_detok d;
};

muser_detok *muser_detok_new(const muser_model *m, bool render_special) {
    if (!m->tok) return NULL;
    muser_detok *d = mu_xcalloc(1, sizeof *d);
    mu_detok_init(&d->d, m->tok, (render_special ? MU_DETOK_SPECIAL : 0) | MU_DETOK_SEQ_START);
    return d;
}

const char *muser_detok_push(muser_detok *d, int32_t id, size_t *len) { return mu_detok_push(&d->d, id, len); }
const char *muser_detok_flush(muser_detok *d, size_t *len) { return mu_detok_flush(&d->d, len); }

void muser_detok_free(muser_detok *d) {
    if (!d) return;
    mu_detok_free(&d->d);
    free(d);
}

char *muser_chat_render(const muser_model *m, const muser_chat_params *p, muser_error *err) {
    if (!need_tokenizer(m, ERR(err))) return NULL;
    if (!m->chat_template || !m->chat_template[0]) {
        mu_err_set(ERR(err), "%s has no tokenizer.chat_template", m->m->gguf->path);
        return NULL;
    }
    mu_template *t = mu_template_parse(m->chat_template, strlen(m->chat_template), "tokenizer.chat_template", ERR(err));
    if (!t) return NULL;
    int32_t bos = mu_token_bos(m->tok), eos = mu_token_eos(m->tok);
    mu_template_inputs in = {
        .messages_json = p->messages_json, .tools_json = p->tools_json,
        .add_generation_prompt = p->add_generation_prompt,
        .bos_token = bos >= 0 ? mu_token_text(m->tok, bos) : "",
        .eos_token = eos >= 0 ? mu_token_text(m->tok, eos) : "",
        .date = p->date,
    };
    char *out = mu_template_render(t, &in, ERR(err));
    mu_template_free(t);
    return out;
}

const char *muser_chat_template_sha256(const muser_model *m) { return m->chat_template_sha; }
