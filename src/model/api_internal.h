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
    pthread_mutex_t ident_lock;
    unsigned char *kv_identity; /* a durable pack's identity block (src/kvpack/), built once per load */
    size_t kv_identity_len;
    mu_grammar_vocab *gvocab;   /* built by the first grammar sampler, shared by all */
};

/* A session's cache and position, for the benchmark's synthetic depth
 * (engine.c): rows stored straight into the cache, then the position set
 * to match (logits dropped). */
mu_kv_cache *mu_session_kv(muser_session *s);
void mu_session_set_pos(muser_session *s, int64_t pos);

/* Durable packs (src/kvpack/), engine.c. Lock/unlock take the engine's
 * lock (recursive: engine calls inside take it again; speculate.c holds it
 * for a whole round, whose draft runs on the engine's backend outside any
 * engine call); everything below them expects it held. hist: the tokens at
 * [0, *n) (n < the position when some rows came from elsewhere). new_kv
 * makes an empty cache of the session's own geometry (its backend, n_ctx,
 * ring slack): the detached generation a restore fills. install swaps it
 * in as the session's cache (the old one ends up in *staged and is freed),
 * with the position n, its tokens and the last logits row. */
void mu_session_lock(muser_session *s);
void mu_session_unlock(muser_session *s);
const int32_t *mu_session_hist(const muser_session *s, int64_t *n);
bool mu_session_busy(const muser_session *s);
bool mu_session_poisoned(const muser_session *s);
bool mu_session_new_kv(const muser_session *s, mu_kv_cache *out, mu_error *err);
void mu_session_install(muser_session *s, mu_kv_cache *staged, const int32_t *tokens, int64_t n,
                        const float *logits);

/* Rows of a prompt chunk at position pos when a session took its
 * backend's preferred chunk of n rows (engine.c says why the cap). */
int64_t mu_prompt_rows(int64_t n, int64_t pos, int64_t n_ctx);

/* Load tokenizer and chat template of a validated model (api_text.c). */
bool mu_api_load_text(muser_model *mm, mu_error *err);
void mu_api_free_text(muser_model *mm);

/* The model's vocabulary for grammar matching: llama's token pieces with
 * special tokens rendered, EOG flags from the tokenizer (api_sample.c). */
mu_grammar_vocab *mu_api_grammar_vocab(const muser_model *m, mu_error *err);
/* The same, built once per model and kept until muser_model_free (thread-safe). */
const mu_grammar_vocab *mu_api_shared_grammar_vocab(const muser_model *m, mu_error *err);

#endif
