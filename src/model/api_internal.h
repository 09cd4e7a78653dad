/* Private layout of the public handles (include/muser.h). */
#ifndef MUSER_API_INTERNAL_H
#define MUSER_API_INTERNAL_H
#include "muser.h"
#include "model/forward.h"
#include "tokenizer/tokenizer.h"

#define ERR(e) ((mu_error *)(e))

struct muser_model {
    mu_model *m;
    mu_backend *be;
    mu_tokenizer *tok;          /* NULL when the file has no tokenizer */
    char *chat_template;        /* tokenizer.chat_template or NULL */
    char chat_template_sha[65];
};

/* Load tokenizer and chat template of a validated model (api_text.c). */
bool mu_api_load_text(muser_model *mm, mu_error *err);
void mu_api_free_text(muser_model *mm);

#endif
