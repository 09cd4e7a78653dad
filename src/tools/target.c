/* Type/mix names and the rule that picks each 2-D tensor's type. */
#include "tools/tools_internal.h"
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

typedef struct target_name {
    const char *name;
    mu_target_kind kind;
    uint32_t type;
    uint32_t file_type;   /* llama_ftype */
} target_name;

/* llama_ftype: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q8_0 7, Q4_K_S 14,
 * Q4_K_M 15, Q5_K_S 16, Q6_K 18, BF16 32, NVFP4 39. q4_k_xl reports
 * Q4_K_M, as mixed "XL" K-quant files do. */
static const target_name TARGETS[] = {
    {"F32", MU_TARGET_SINGLE, MU_TYPE_F32, 0},
    {"F16", MU_TARGET_SINGLE, MU_TYPE_F16, 1},
    {"BF16", MU_TARGET_SINGLE, MU_TYPE_BF16, 32},
    {"Q8_0", MU_TARGET_SINGLE, MU_TYPE_Q8_0, 7},
    {"Q4_0", MU_TARGET_SINGLE, MU_TYPE_Q4_0, 2},
    {"Q4_K", MU_TARGET_SINGLE, MU_TYPE_Q4_K, 14},
    {"Q5_K", MU_TARGET_SINGLE, MU_TYPE_Q5_K, 16},
    {"Q6_K", MU_TARGET_SINGLE, MU_TYPE_Q6_K, 18},
    {"q4_k_xl", MU_TARGET_Q4_K_XL, MU_TYPE_Q4_K, 15},
    {"nvfp4", MU_TARGET_NVFP4, MU_TYPE_NVFP4_E2M1, 39},
    {"nvfp4_ggml", MU_TARGET_NVFP4_GGML, MU_TYPE_NVFP4, 39},
};
#define N_TARGETS (sizeof TARGETS / sizeof TARGETS[0])

const char *mu_tools_type_names(void) {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, q4_k_xl, nvfp4, nvfp4_ggml";
}

static const target_name *find_target(const mu_target *t) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (TARGETS[i].kind == t->kind && (t->kind != MU_TARGET_SINGLE || TARGETS[i].type == t->type))
            return &TARGETS[i];
    return &TARGETS[0];
}

bool mu_target_parse(const char *s, mu_target *t, mu_error *err) {
    if (!s || !*s) {
        mu_err_set(err, "no weight type given (expected one of: %s)", mu_tools_type_names());
        return false;
    }
    for (size_t i = 0; i < N_TARGETS; i++) {
        if (strcasecmp(s, TARGETS[i].name)) continue;
        t->kind = TARGETS[i].kind;
        t->type = TARGETS[i].type;
        t->name = TARGETS[i].name;
        return true;
    }
    mu_err_set(err, "unknown weight type '%s' (expected one of: %s)", s, mu_tools_type_names());
    return false;
}

/* Layer number of "blk.N.<rest>" with <rest> == suffix, else -1. */
static long layer_of(const char *name, const char *suffix) {
    if (strncmp(name, "blk.", 4)) return -1;
    char *end;
    long il = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || il < 0 || strcmp(end + 1, suffix)) return -1;
    return il;
}

static bool is_embedding_or_head(const char *name) {
    return !strcmp(name, "token_embd.weight") || !strcmp(name, "output.weight");
}

uint32_t mu_target_weight_type(const mu_target *t, const char *name) {
    switch (t->kind) {
    case MU_TARGET_SINGLE:
        return t->type;
    case MU_TARGET_NVFP4:
    case MU_TARGET_NVFP4_GGML:
        return is_embedding_or_head(name) ? MU_TYPE_F16
             : t->kind == MU_TARGET_NVFP4 ? MU_TYPE_NVFP4_E2M1 : MU_TYPE_NVFP4;
    case MU_TARGET_Q4_K_XL:
        if (!strcmp(name, "output.weight")) return MU_TYPE_Q5_K;
        if (layer_of(name, "attn_v.weight") >= 0) return MU_TYPE_Q6_K;
        long il = layer_of(name, "ffn_down.weight");
        if (il >= 0) return il % 2 ? MU_TYPE_Q6_K : MU_TYPE_Q4_K;
        return MU_TYPE_Q4_K;
    }
    return t->type;
}

uint32_t mu_target_file_type(const mu_target *t) {
    return find_target(t)->file_type;
}

const char *mu_target_precision(const mu_target *t) {
    if (t->kind == MU_TARGET_Q4_K_XL) return "q4_k_xl";
    if (t->kind == MU_TARGET_NVFP4) return "nvfp4";
    return NULL;
}
