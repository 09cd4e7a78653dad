/* Binding GGUF metadata and tensors to engine structures, fail-closed: the
 * shared half of model_load.c (the target) and spec/dflash_load.c (the
 * assistant). Every refusal names the file and the key or tensor. */
#ifndef MUSER_MODEL_BIND_H
#define MUSER_MODEL_BIND_H
#include "gguf/gguf.h"
#include "quant/quant.h"

typedef struct mu_binder {
    gguf_file *f;
    mu_error *err;
    bool *used;                 /* [n_tensors]: tensors consumed so far */
    uint64_t bound_bytes;       /* bytes of the weights and vectors bound */
    const char *who;            /* "this engine", "the assistant": who refuses a type */
    bool native_nvfp4;          /* NVFP4_E2M1 weights (with companions) allowed */
} mu_binder;

void mu_binder_init(mu_binder *B, gguf_file *f, mu_error *err, const char *who, bool native_nvfp4);
void mu_binder_free(mu_binder *B);

/* general.name, else the file's base name (a new string). */
char *mu_bind_name(const gguf_file *f);

/* Set err to "<path>: <message>"; always false. */
__attribute__((format(printf, 2, 3))) bool mu_bind_fail(mu_binder *B, const char *fmt, ...);

/* uint32 key: required (missing = refusal) or dflt. */
bool mu_bind_u32(mu_binder *B, const char *key, int64_t *out, bool required, int64_t dflt);
/* f32 key, finite: required (missing = refusal) or dflt. */
bool mu_bind_f32(mu_binder *B, const char *key, float *out, bool required, float dflt);

/* Mark a tensor used; NULL (and, if required, a refusal) when absent. */
const gguf_tensor *mu_bind_take(mu_binder *B, const char *name, bool required);
bool mu_bind_shape(mu_binder *B, const gguf_tensor *t, int64_t ne0, int64_t ne1);
/* A single F32 value, finite (and > 0 if positive). */
bool mu_bind_scalar_f32(mu_binder *B, const char *name, float *out, bool positive);
/* A [n_in, n_out] matrix the backends compute with. */
bool mu_bind_weight(mu_binder *B, const char *name, int64_t n_in, int64_t n_out, mu_weight *w);
/* An [n] F32/F16/BF16 vector, dequantized into a new array, all finite. */
bool mu_bind_vector(mu_binder *B, const char *name, int64_t n, float **out);

#endif
