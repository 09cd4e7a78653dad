/* `muser run` sampling options: llama.cpp's flag names and defaults, parsed
 * into a muser_sampling_params. */
#ifndef MUSER_CLI_RUN_SAMPLING_H
#define MUSER_CLI_RUN_SAMPLING_H
#include "muser.h"
#include <stdio.h>

#define RUN_MAX_BREAKERS 32

typedef struct run_sampling {
    muser_sampling_params p;
    muser_logit_bias *bias;    /* owned, p.logit_bias points here */
    const char *breakers[RUN_MAX_BREAKERS];
    size_t n_breakers;
    bool breakers_given;       /* the first --dry-sequence-breaker clears the defaults */
    const char *grammar_arg, *grammar_file, *schema_arg, *schema_file;
    char *grammar_text, *schema_text; /* owned file contents */
} run_sampling;

void run_sampling_init(run_sampling *r);
void run_sampling_free(run_sampling *r);
/* argv[*i] is a sampling option: consume it (and its value). Returns 1 when
 * consumed, 0 when argv[*i] is not a sampling option, -1 after printing an
 * error. */
int run_sampling_option(run_sampling *r, int argc, char **argv, int *i);
/* After all options: read grammar / schema files, check combinations. */
bool run_sampling_finish(run_sampling *r);
/* The option list with every default. */
void run_sampling_usage(FILE *f);

#endif
