/* muser tokenize / detokenize / chat-template: the text layer for debugging. */
#include "cli.h"
#include "muser.h"
#include "template/template.h"
#include "util/common.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>

static muser_model *load(const char *cmd, const char *path) {
    muser_error err;
    muser_model_params mp = {.backend = MUSER_BACKEND_REF};
    muser_model *m = muser_model_load(path, &mp, &err);
    if (!m) cli_error(cmd, err.msg);
    else if (!muser_model_has_tokenizer(m)) {
        fprintf(stderr, "muser %s: %s has no tokenizer metadata\n", cmd, path);
        muser_model_free(m);
        m = NULL;
    }
    return m;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool ids_only = false, add_special = true, parse_special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: muser tokenize [-m MODEL] TEXT [--ids] [--no-bos] [--no-parse-special]\n\n"
                   "Prints one line per token: id and its text (quoted, escaped); --ids prints\n"
                   "a comma-separated id list instead. Control-token texts in TEXT are parsed as\n"
                   "those tokens unless --no-parse-special; BOS is added as the model asks unless --no-bos.\n"
                   "MODEL defaults to $MUSER_MODEL, else the shipped model (as for muser run).\n");
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!cli_value("tokenize", argc, argv, &i, &model)) return 2;
        } else if (!strcmp(a, "--ids")) ids_only = true;
        else if (!strcmp(a, "--no-bos")) add_special = false;
        else if (!strcmp(a, "--no-parse-special")) parse_special = false;
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "muser tokenize: unknown option '%s'\n", a); return 2; }
        else if (!text) text = a;
        else { fprintf(stderr, "muser tokenize: one TEXT argument expected (quote it)\n"); return 2; }
    }
    if (!text) { fprintf(stderr, "muser tokenize: usage: muser tokenize [-m MODEL] TEXT\n"); return 2; }
    if (!cli_model_or_default("tokenize", &model)) return 2;
    muser_model *m = load("tokenize", model);
    if (!m) return 1;
    muser_error err;
    int32_t *ids = NULL;
    int64_t n = muser_tokenize(m, text, strlen(text), add_special, parse_special, &ids, &err);
    int rc = 0;
    if (n < 0) { cli_error("tokenize", err.msg); rc = 1; }
    for (int64_t i = 0; i < n; i++) {
        if (ids_only) { printf("%s%d", i ? "," : "", ids[i]); continue; }
        printf("%6d ", ids[i]);
        cli_json_str(stdout, muser_token_text(m, ids[i]));
        printf("\n");
    }
    if (ids_only && n >= 0) printf("\n");
    free(ids);
    muser_model_free(m);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *list = NULL;
    bool special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: muser detokenize [-m MODEL] 1,2,3 [--no-special]\n\n"
                   "Prints the text the ids stand for (control tokens rendered unless --no-special).\n"
                   "MODEL defaults to $MUSER_MODEL, else the shipped model (as for muser run).\n");
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!cli_value("detokenize", argc, argv, &i, &model)) return 2;
        } else if (!strcmp(a, "--no-special")) special = false;
        else if (a[0] == '-' && a[1]) { fprintf(stderr, "muser detokenize: unknown option '%s'\n", a); return 2; }
        else list = a;
    }
    if (!list) { fprintf(stderr, "muser detokenize: usage: muser detokenize [-m MODEL] 1,2,3\n"); return 2; }
    if (!cli_model_or_default("detokenize", &model)) return 2;
    int32_t *ids;
    int64_t n;
    if (!cli_parse_ids("detokenize", "the id list", list, &ids, &n)) return 2;
    muser_model *m = load("detokenize", model);
    if (!m) { free(ids); return 1; }
    muser_error err;
    size_t len;
    char *text = muser_detokenize(m, ids, (size_t)n, special, &len, &err);
    int rc = 0;
    if (!text) { cli_error("detokenize", err.msg); rc = 1; }
    else { fwrite(text, 1, len, stdout); printf("\n"); }
    free(text);
    free(ids);
    muser_model_free(m);
    return rc;
}

static char *read_file(const char *cmd, const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "muser %s: cannot open %s: %s\n", cmd, path, strerror(errno)); return NULL; }
    mu_buf b = {0};
    char chunk[4096];
    for (size_t r; (r = fread(chunk, 1, sizeof chunk, f)) > 0;) mu_buf_append(&b, chunk, r);
    /* errno still holds fread's failure (a directory gives EISDIR): read it
     * before fclose can change it (EIO if the C library left it 0). */
    int e = ferror(f) ? (errno ? errno : EIO) : 0;
    fclose(f);
    if (e) { fprintf(stderr, "muser %s: reading %s failed: %s\n", cmd, path, strerror(e)); free(b.p); return NULL; }
    if (len) *len = b.len;
    return mu_buf_take(&b);
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) { return read_file(cmd, path, len); }

int cmd_chat_template(int argc, char **argv) {
    const char *model = NULL, *tpl_path = NULL, *msgs_path = NULL, *tools_path = NULL;
    const char *bos = "", *eos = "", *date = NULL;
    bool gen_prompt = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: muser chat-template (-m MODEL | --template FILE) --messages FILE.json\n"
                   "                           [--tools FILE.json] [--no-generation-prompt]\n"
                   "                           [--bos TEXT] [--eos TEXT] [--date YYYY-MM-DD]\n\n"
                   "Prints the rendered prompt exactly (no trailing newline added). The messages file is\n"
                   "an OpenAI-style JSON array. With --template, --bos/--eos/--date supply what a model\n"
                   "file would (bos_token, eos_token, strftime_now's date).\n");
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) ok = cli_value("chat-template", argc, argv, &i, &model);
        else if (!strcmp(a, "--template")) ok = cli_value("chat-template", argc, argv, &i, &tpl_path);
        else if (!strcmp(a, "--messages")) ok = cli_value("chat-template", argc, argv, &i, &msgs_path);
        else if (!strcmp(a, "--tools")) ok = cli_value("chat-template", argc, argv, &i, &tools_path);
        else if (!strcmp(a, "--bos")) ok = cli_value("chat-template", argc, argv, &i, &bos);
        else if (!strcmp(a, "--eos")) ok = cli_value("chat-template", argc, argv, &i, &eos);
        else if (!strcmp(a, "--date")) ok = cli_value("chat-template", argc, argv, &i, &date);
        else if (!strcmp(a, "--no-generation-prompt")) gen_prompt = false;
        else { fprintf(stderr, "muser chat-template: unknown option '%s'\n", a); ok = false; }
        if (!ok) return 2;
    }
    if ((!model) == (!tpl_path) || !msgs_path) {
        fprintf(stderr, "muser chat-template: give exactly one of -m MODEL or --template FILE, and --messages FILE\n");
        return 2;
    }
    char *msgs = read_file("chat-template", msgs_path, NULL), *tools = NULL, *out = NULL;
    if (!msgs || (tools_path && !(tools = read_file("chat-template", tools_path, NULL)))) {
        free(msgs);
        return 1;
    }
    muser_error err;
    size_t out_len = 0;
    if (model) {
        muser_model *m = load("chat-template", model);
        if (m) {
            muser_chat_params p = {.messages_json = msgs, .tools_json = tools, .add_generation_prompt = gen_prompt, .date = date};
            out = muser_chat_render(m, &p, &err);
            if (out) out_len = strlen(out);
            muser_model_free(m);
        } else err.msg[0] = 0;
    } else {
        size_t tlen;
        char *src = read_file("chat-template", tpl_path, &tlen);
        mu_template *t = src ? mu_template_parse(src, tlen, tpl_path, (mu_error *)&err) : NULL;
        if (!src) err.msg[0] = 0;
        if (t) {
            mu_template_inputs in = {.messages_json = msgs, .tools_json = tools, .add_generation_prompt = gen_prompt,
                                     .bos_token = bos, .eos_token = eos, .date = date};
            out = mu_template_render_ex(t, &in, &out_len, NULL, (mu_error *)&err);
            mu_template_free(t);
        }
        free(src);
    }
    free(msgs);
    free(tools);
    if (!out) {
        if (err.msg[0]) cli_error("chat-template", err.msg);
        return 1;
    }
    fwrite(out, 1, out_len, stdout);
    free(out);
    return 0;
}
