/* Chat-template renderer: a Jinja2 interpreter that renders
 * `tokenizer.chat_template` byte-for-byte like Hugging Face transformers
 * (jinja2 ImmutableSandboxedEnvironment, trim_blocks + lstrip_blocks,
 * loopcontrols, {% generation %}, HF's tojson / raise_exception /
 * strftime_now). A parsed template is immutable and may be rendered
 * concurrently from several threads. */
#ifndef MUSER_TEMPLATE_TEMPLATE_H
#define MUSER_TEMPLATE_TEMPLATE_H
#include <stdbool.h>
#include <stddef.h>
#include "util/common.h"

typedef struct mu_template mu_template;

/* Parse a template. `name` labels error messages ("name:line:col: msg");
 * NULL means "template". Syntax errors (and invalid UTF-8) fail here with
 * their position. Rendering needs about 1 MiB of stack at the recursion
 * limit (~100 nested macro calls). */
mu_template *mu_template_parse(const char *src, size_t len, const char *name, mu_error *err);
void mu_template_free(mu_template *t);

typedef struct mu_template_inputs {
    const char *messages_json; /* JSON array; NULL: `messages` is not defined */
    const char *tools_json;    /* JSON array; NULL: `tools` is none (as HF passes it) */
    const char *extra_json;    /* JSON object of extra variables (override the others); or NULL */
    bool add_generation_prompt;
    const char *bos_token; /* NULL: not defined */
    const char *eos_token; /* NULL: not defined */
    const char *date;      /* "YYYY-MM-DD" for strftime_now (midnight); NULL = now */
    size_t max_output;     /* bytes; 0 = default (32 MiB). Also caps every string */
    size_t max_steps;      /* evaluation steps; 0 = default (50 million) */
} mu_template_inputs;

/* Why a render failed, in jinja2's terms: the exception class it would
 * raise and str(exception) (for raise_exception(msg): msg itself). */
typedef struct mu_template_failure {
    char exc_type[48];
    char message[1024];
    int line, col; /* 1-based position in the template; 0 if unknown */
} mu_template_failure;

/* Render; returns a malloc'd NUL-terminated string (*out_len bytes, the
 * output may itself contain NUL only if the inputs do), or NULL with
 * err = "name:line:col: message" and, if `fail` is given, the details. */
char *mu_template_render(const mu_template *t, const mu_template_inputs *in, mu_error *err);
char *mu_template_render_ex(const mu_template *t, const mu_template_inputs *in, size_t *out_len,
                            mu_template_failure *fail, mu_error *err);

#endif
