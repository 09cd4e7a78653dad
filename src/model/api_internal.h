/* Private layout of the public handles (include/muser.h). */
#ifndef MUSER_API_INTERNAL_H
#define MUSER_API_INTERNAL_H
#include "muser.h"
#include <pthread.h>
#include "model/forward.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

#define ERR(e) ((mu_error *)(e))

struct muser_model {
    mu_model *m;
    mu_backend *be;
    mu_tokenizer *tok;          /* NULL when the file has no tokenizer */
    char *chat_template;        /* tokenizer.chat_template or NULL */
    char chat_template_sha[65];
    bool locked;                /* the file's pages are mlock()ed */
    pthread_mutex_t gvocab_lock;
    mu_grammar_vocab *gvocab;   /* built by the first grammar sampler, shared by all */
};

/* A session's cache and position, for the benchmark's synthetic depth
 * (engine.c): rows stored straight into the cache, then the position set
 * to match (logits dropped). */
mu_kv_cache *mu_session_kv(muser_session *s);
void mu_session_set_pos(muser_session *s, int64_t pos);

/* Load tokenizer and chat template of a validated model (api_text.c). */
bool mu_api_load_text(muser_model *mm, mu_error *err);
void mu_api_free_text(muser_model *mm);

/* The model's vocabulary for grammar matching: llama's token pieces with
 * special tokens rendered, EOG flags from the tokenizer (api_sample.c). */
mu_grammar_vocab *mu_api_grammar_vocab(const muser_model *m, mu_error *err);
/* The same, built once per model and kept until muser_model_free (thread-safe). */
const mu_grammar_vocab *mu_api_shared_grammar_vocab(const muser_model *m, mu_error *err);

#endif
