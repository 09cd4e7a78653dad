/* Shared helpers for the muser subcommands. */
#ifndef MUSER_CLI_H
#define MUSER_CLI_H
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "muser.h"

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* muser bench serve (cmd_bench_serve.c), reached through cmd_bench. */
int cmd_bench_serve(int argc, char **argv);
/* muser bench kvpack (cmd_bench_kvpack.c): time to first token, cold and from a kvpack store. */
int cmd_bench_kvpack(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_speculate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_kvpack(int argc, char **argv);
/* The model to use: *model if set, else $MUSER_MODEL, else the shipped default
 * of this build; false with a message when there is none. */
const char *cli_default_draft(void);
bool cli_parse_verify_len(const char *cmd, const char *v, int64_t *out);
/* --backend NAME: ref, cpu, cuda or auto. */
bool cli_parse_backend(const char *cmd, const char *v, muser_backend_kind *out);
bool cli_model_or_default(const char *cmd, const char **model);
/* Whole file as a NUL-terminated malloc'd buffer; NULL with a message. */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

/* Print "muser CMD: MSG" for a library message, with one prefix only: the
 * tools and the tokenizer name themselves ("synth: ...", "quantize: ...",
 * "detokenize: ..."), so a MSG that already starts with "CMD: " loses that
 * copy (src/tools/synth.c, src/tokenizer/tok_decode.c). */
void cli_error(const char *cmd, const char *msg);

/* Argument helpers: print "muser <cmd>: ..." on error and return false. */
bool cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
bool cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
bool cli_parse_f32(const char *cmd, const char *flag, const char *s, float *out);
/* --compress: "none" (0), "zstd" (level 3) or "zstd:N" (N in 1..19), the
 * zstd level of the kvpack chunks written (docs/kvpack.md). */
bool cli_parse_compress(const char *cmd, const char *s, int *level);
/* Fetch the value after a flag (argv[*i+1]); false with a message if absent. */
bool cli_value(const char *cmd, int argc, char **argv, int *i, const char **out);
/* Parse "1,2,3" into a malloc'd array; a refusal names `what` (the flag or item). */
bool cli_parse_ids(const char *cmd, const char *what, const char *s, int32_t **ids, int64_t *n);
/* JSON string literal with escaping. */
void cli_json_str(FILE *f, const char *s);
/* Progress bar on stderr: label, done/total bytes, rate (redrawn on a
 * terminal; otherwise only the final line). */
void cli_progress(const char *label, uint64_t done, uint64_t total, double t0);

#endif
