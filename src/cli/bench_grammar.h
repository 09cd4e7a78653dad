/* `muser bench --grammar`: whole-vocabulary grammar mask timing. */
#ifndef MUSER_CLI_BENCH_GRAMMAR_H
#define MUSER_CLI_BENCH_GRAMMAR_H
#include <stdbool.h>

/* Times the json.gbnf mask on the synthetic 202,048-token vocabulary and,
 * with model_path, on the model's own vocabulary; prints a table and, with
 * json_path ('-' = stdout), a JSON report. Returns the exit code. */
int bench_grammar(const char *model_path, int reps, const char *json_path, bool quiet);

#endif
