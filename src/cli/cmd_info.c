/* muser info: what a GGUF is (geometry, lane, tensor types, byte totals,
 * identity hashes) and whether the engine accepts it. A DFlash assistant
 * (general.architecture "dflash") is validated as one by the assistant
 * loader (src/spec/dflash_load.c) and described as an assistant. */
#include "cli.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "spec/dflash.h"
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

typedef struct info_ctx {
    const char *path;
    bool json, quiet;
    gguf_file *f;
    bool assistant;         /* general.architecture is "dflash" */
    mu_model *m;            /* NULL when validation failed (or an assistant) */
    mu_dflash *d;           /* an assistant that validated */
    mu_error verr;
    char file_sha[65], tok_sha[65], tmpl_sha[65];
    char target_tok_sha[65]; /* assistant: the identity a target's tokenizer must match */
    bool has_tmpl;
} info_ctx;

/* The architecture the assistant loader accepts (ARCH in src/spec/dflash_load.c). */
#define ASSISTANT_ARCH "dflash"

static bool is_assistant(const gguf_file *f) {
    char *arch = NULL;
    bool yes = gguf_get_str(f, "general.architecture", &arch, NULL) > 0 && !strcmp(arch, ASSISTANT_ARCH);
    free(arch);
    return yes;
}

static void print_assistant_text(const info_ctx *c) {
    const mu_dflash_config *g = &c->d->cfg;
    printf("assistant:   %s\narchitecture: " ASSISTANT_ARCH " (a DFlash assistant: it drafts for a target model, "
           "see muser run --draft)\n", c->d->name);
    printf("geometry:    %" PRId64 " layers, hidden %" PRId64 ", heads %" PRId64 "/%" PRId64 " x %" PRId64
           ", ffn %" PRId64 ", vocab %" PRId64 ", context %" PRId64 "\n",
           g->n_layer, g->n_embd, g->n_head, g->n_head_kv, g->head_dim, g->n_ff, g->n_vocab, g->n_ctx_train);
    printf("target layers: ");
    for (int64_t i = 0; i < g->n_target_layers; i++) printf("%s%d", i ? ", " : "", g->target_layers[i]);
    printf(" (one-based)\n");
    printf("drafting:    block size %" PRId64 ", window %" PRId64 "%s after a %d-row sink, mask token %d\n",
           g->block_size, g->sliding_window, g->window_defaulted ? " (key missing: default)" : "", MU_DFLASH_SINK,
           g->mask_token);
    printf("numerics:    rms_eps %g, rope base %g\n", (double)g->rms_eps, (double)g->rope_base);
    printf("validation:  ok\n");
}

static void print_assistant_json(const info_ctx *c) {
    const mu_dflash_config *g = &c->d->cfg;
    printf(",\"kind\":\"assistant\",\"architecture\":\"" ASSISTANT_ARCH "\",\"name\":");
    cli_json_str(stdout, c->d->name);
    printf(",\"geometry\":{\"n_layer\":%" PRId64 ",\"n_embd\":%" PRId64 ",\"n_head\":%" PRId64
           ",\"n_head_kv\":%" PRId64 ",\"head_dim\":%" PRId64 ",\"n_ff\":%" PRId64 ",\"n_vocab\":%" PRId64
           ",\"n_ctx_train\":%" PRId64 "}",
           g->n_layer, g->n_embd, g->n_head, g->n_head_kv, g->head_dim, g->n_ff, g->n_vocab, g->n_ctx_train);
    printf(",\"assistant\":{\"target_layers\":[");
    for (int64_t i = 0; i < g->n_target_layers; i++) printf("%s%d", i ? "," : "", g->target_layers[i]);
    printf("],\"block_size\":%" PRId64 ",\"sliding_window\":%" PRId64 ",\"window_defaulted\":%s,\"sink\":%d"
           ",\"mask_token\":%d,\"rms_eps\":%g,\"rope_base\":%g}",
           g->block_size, g->sliding_window, g->window_defaulted ? "true" : "false", MU_DFLASH_SINK, g->mask_token,
           (double)g->rms_eps, (double)g->rope_base);
}

static double t_hash0;
static void hash_progress(uint64_t done, uint64_t total, void *ctx) {
    (void)ctx;
    if (total >= (256u << 20)) cli_progress("sha256", done, total, t_hash0);
}

static void shape_str(const gguf_tensor *t, char *buf, size_t n) {
    int k = snprintf(buf, n, "[");
    for (uint32_t d = 0; d < t->n_dims && k < (int)n; d++)
        k += snprintf(buf + k, n - (size_t)k, "%s%" PRIu64, d ? ", " : "", t->ne[d]);
    if (k < (int)n) snprintf(buf + k, n - (size_t)k, "]");
}

typedef struct type_total { uint32_t type; uint64_t count, bytes, elems; } type_total;

static int totals_by_type(const gguf_file *f, type_total *out, int cap) {
    int n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        int j = 0;
        while (j < n && out[j].type != t->type) j++;
        if (j == n) {
            if (n == cap) continue;
            out[n++] = (type_total){.type = t->type};
        }
        out[j].count++;
        out[j].bytes += t->nbytes;
        out[j].elems += t->n_elems;
    }
    return n;
}

static const char *tname(uint32_t type) {
    const char *s = mu_type_name(type);
    return s ? s : "unknown";
}

static void print_text(const info_ctx *c) {
    const gguf_file *f = c->f;
    printf("file:        %s (%" PRIu64 " bytes, GGUF v%u, %" PRIu64 " keys, %" PRIu64 " tensors)\n", c->path,
           f->size, f->version, f->n_kv, f->n_tensors);
    if (c->d) {
        print_assistant_text(c);
    } else if (c->m) {
        const mu_model_config *g = &c->m->cfg;
        printf("model:       %s\narchitecture: muse-glimmer\nlane:        %s\n", c->m->name, c->m->lane);
        printf("geometry:    %" PRId64 " layers (%" PRId64 " sliding, window %" PRId64 "), hidden %" PRId64
               ", heads %" PRId64 "/%" PRId64 " x %" PRId64 ", ffn %" PRId64 ", vocab %" PRId64 ", context %" PRId64 "\n",
               g->n_layer, g->n_swa_layers, g->sliding_window, g->n_embd, g->n_head, g->n_head_kv, g->head_dim,
               g->n_ff, g->n_vocab, g->n_ctx_train);
        printf("numerics:    rms_eps %g, post-norm eps 1e-8, rope base (swa) %g, logit_scale %g, softcap %g, qk_scale %g\n",
               (double)g->rms_eps, (double)g->rope_base_swa, (double)g->logit_scale, (double)g->softcap,
               (double)g->qk_scale_factor);
        printf("weights/token: %" PRIu64 " bytes\n", c->m->weight_bytes);
        printf("validation:  ok\n");
    } else {
        if (c->assistant) printf("architecture: " ASSISTANT_ARCH " (a DFlash assistant)\n");
        printf("validation:  REFUSED: %s\n", c->verr.msg);
    }
    printf("sha256:      file %s\n             tokenizer %s\n             chat_template %s\n", c->file_sha,
           c->tok_sha, c->has_tmpl ? c->tmpl_sha : "(none)");
    if (c->d) printf("             target tokenizer %s (what the target's tokenizer hash must be)\n", c->target_tok_sha);
    type_total tt[64];
    int nt = totals_by_type(f, tt, 64);
    uint64_t total = 0;
    printf("types:\n");
    for (int i = 0; i < nt; i++) {
        printf("  %-11s %6" PRIu64 " tensors %16" PRIu64 " bytes %16" PRIu64 " values\n", tname(tt[i].type),
               tt[i].count, tt[i].bytes, tt[i].elems);
        total += tt[i].bytes;
    }
    printf("  %-11s %6" PRIu64 " tensors %16" PRIu64 " bytes\n", "total", f->n_tensors, total);
    if (c->quiet) return;
    printf("tensors:\n");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char shape[96];
        shape_str(t, shape, sizeof shape);
        printf("  %-40s %-11s %-22s %12" PRIu64 "\n", t->name, tname(t->type), shape, t->nbytes);
    }
}

static void print_json(const info_ctx *c) {
    const gguf_file *f = c->f;
    printf("{\"file\":");
    cli_json_str(stdout, c->path);
    printf(",\"bytes\":%" PRIu64 ",\"gguf_version\":%u,\"n_kv\":%" PRIu64 ",\"n_tensors\":%" PRIu64, f->size,
           f->version, f->n_kv, f->n_tensors);
    printf(",\"valid\":%s", c->m || c->d ? "true" : "false");
    if (c->d) {
        print_assistant_json(c);
    } else if (!c->m) {
        if (c->assistant) printf(",\"kind\":\"assistant\",\"architecture\":\"" ASSISTANT_ARCH "\"");
        printf(",\"error\":");
        cli_json_str(stdout, c->verr.msg);
    } else {
        printf(",\"kind\":\"model\"");
        const mu_model_config *g = &c->m->cfg;
        printf(",\"architecture\":\"muse-glimmer\",\"name\":");
        cli_json_str(stdout, c->m->name);
        printf(",\"lane\":\"%s\",\"geometry\":{\"n_layer\":%" PRId64 ",\"n_swa_layers\":%" PRId64
               ",\"sliding_window\":%" PRId64 ",\"n_embd\":%" PRId64 ",\"n_head\":%" PRId64 ",\"n_head_kv\":%" PRId64
               ",\"head_dim\":%" PRId64 ",\"n_ff\":%" PRId64 ",\"n_vocab\":%" PRId64 ",\"n_ctx_train\":%" PRId64 "}",
               c->m->lane, g->n_layer, g->n_swa_layers, g->sliding_window, g->n_embd, g->n_head, g->n_head_kv,
               g->head_dim, g->n_ff, g->n_vocab, g->n_ctx_train);
        printf(",\"weight_bytes_per_token\":%" PRIu64, c->m->weight_bytes);
    }
    printf(",\"sha256\":{\"file\":\"%s\",\"tokenizer\":\"%s\",\"chat_template\":", c->file_sha, c->tok_sha);
    if (c->has_tmpl) printf("\"%s\"", c->tmpl_sha);
    else printf("null");
    if (c->d) printf(",\"target_tokenizer\":\"%s\"", c->target_tok_sha);
    printf("}");
    type_total tt[64];
    int nt = totals_by_type(f, tt, 64);
    printf(",\"types\":[");
    for (int i = 0; i < nt; i++)
        printf("%s{\"type\":\"%s\",\"tensors\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", i ? "," : "", tname(tt[i].type),
               tt[i].count, tt[i].bytes);
    printf("],\"tensors\":[");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        printf("%s{\"name\":", i ? "," : "");
        cli_json_str(stdout, t->name);
        printf(",\"type\":\"%s\",\"shape\":[", tname(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%" PRIu64, d ? "," : "", t->ne[d]);
        printf("],\"bytes\":%" PRIu64 ",\"offset\":%" PRIu64 "}", t->nbytes, t->file_offset);
    }
    printf("]}\n");
}

int cmd_info(int argc, char **argv) {
    info_ctx c = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: muser info -m MODEL [--json] [--no-tensors]\n\n"
                   "Prints architecture, geometry, lane, per-tensor types and byte totals, whether the\n"
                   "engine accepts the file (and why not), and SHA-256 of the file, of the tokenizer\n"
                   "metadata and of tokenizer.chat_template. A DFlash assistant (general.architecture\n"
                   "dflash) is validated and described as one: target layers, block size, window, mask\n"
                   "token. Exit status 3: readable but refused.\n");
            return 0;
        } else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) {
            if (!cli_value("info", argc, argv, &i, &c.path)) return 2;
        } else if (!strcmp(argv[i], "--json")) c.json = true;
        else if (!strcmp(argv[i], "--no-tensors")) c.quiet = true;
        else {
            fprintf(stderr, "muser info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!c.path) { fprintf(stderr, "muser info: -m MODEL is required\n"); return 2; }
    mu_error err;
    c.f = gguf_open(c.path, &err);
    if (!c.f) { cli_error("info", err.msg); return 1; }
    t_hash0 = mu_now();
    if (!gguf_sha256_file(c.path, c.file_sha, hash_progress, NULL, &err)) {
        cli_error("info", err.msg);
        gguf_close(c.f);
        return 1;
    }
    gguf_sha256_tokenizer(c.f, c.tok_sha);
    c.has_tmpl = gguf_sha256_chat_template(c.f, c.tmpl_sha);
    /* Validate with a second, independent open: mu_model / mu_dflash take
     * ownership of theirs. */
    c.assistant = is_assistant(c.f);
    if (c.assistant) {
        c.d = mu_dflash_load(c.path, &c.verr);
        if (c.d) memcpy(c.target_tok_sha, c.d->tokenizer_sha, sizeof c.target_tok_sha);
    } else {
        c.m = mu_model_load(c.path, &c.verr);
    }
    if (c.json) print_json(&c);
    else print_text(&c);
    int rc = c.m || c.d ? 0 : 3; /* readable but refused by the engine */
    mu_model_free(c.m);
    mu_dflash_free(c.d);
    gguf_close(c.f);
    return rc;
}
