/* Size table for every ggml type id a GGUF file may carry. Sizes are facts of
 * the ggml format; the GGUF reader needs them even for types the engine does
 * not compute with, so it can validate (and refuse precisely) any file. */
#include "quant/quant.h"
#include <strings.h>

typedef struct type_size {
    uint32_t id;
    const char *name;
    uint32_t block_elems, block_bytes;
} type_size;

static const type_size TYPE_SIZES[] = {
    {0, "F32", 1, 4},        {1, "F16", 1, 2},
    {2, "Q4_0", 32, 18},     {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},     {9, "Q8_1", 32, 36},
    {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},
    {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},
    {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74},
    {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110},
    {22, "IQ2_S", 256, 82},  {23, "IQ4_XS", 256, 136},
    {24, "I8", 1, 1},        {25, "I16", 1, 2},
    {26, "I32", 1, 4},       {27, "I64", 1, 8},
    {28, "F64", 1, 8},       {29, "IQ1_M", 256, 56},
    {30, "BF16", 1, 2},
    {34, "TQ1_0", 256, 54},  {35, "TQ2_0", 256, 66},
    {39, "MXFP4", 32, 17},   {40, "NVFP4", 64, 36},
    {1000, "NVFP4_E2M1", 2, 1}, {1001, "F8_E4M3FN", 1, 1},
};

static const type_size *find(uint32_t type) {
    for (size_t i = 0; i < sizeof TYPE_SIZES / sizeof TYPE_SIZES[0]; i++)
        if (TYPE_SIZES[i].id == type) return &TYPE_SIZES[i];
    return NULL;
}

bool mu_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes) {
    const type_size *t = find(type);
    if (!t) return false;
    if (block_elems) *block_elems = t->block_elems;
    if (block_bytes) *block_bytes = t->block_bytes;
    return true;
}

const char *mu_type_name(uint32_t type) {
    const type_size *t = find(type);
    return t ? t->name : NULL;
}

int64_t mu_type_from_name(const char *name) {
    if (!strcasecmp(name, "nvfp4")) return MU_TYPE_NVFP4_E2M1;
    if (!strcasecmp(name, "nvfp4_ggml")) return MU_TYPE_NVFP4;
    for (size_t i = 0; i < sizeof TYPE_SIZES / sizeof TYPE_SIZES[0]; i++)
        if (!strcasecmp(TYPE_SIZES[i].name, name)) return TYPE_SIZES[i].id;
    return -1;
}

bool mu_type_row_bytes(uint32_t type, uint64_t n, uint64_t *out) {
    uint32_t be, bb;
    if (!mu_type_size(type, &be, &bb) || n % be) return false;
    return mu_mul_u64(n / be, bb, out);
}
