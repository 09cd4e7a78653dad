/* synth internals: the tokenizer it writes and the random weight rows. */
#ifndef MUSER_SYNTH_INTERNAL_H
#define MUSER_SYNTH_INTERNAL_H
#include "tools/tools_internal.h"

typedef struct mu_synth_vocab {
    char **tokens;
    int32_t *types;     /* 1 normal, 3 control */
    uint64_t n;
    char **merges;
    uint64_t n_merges;
    uint32_t bos, eos, eot, mask;
} mu_synth_vocab;

uint64_t mu_synth_vocab_min_size(void);
bool mu_synth_vocab_build(uint64_t n_vocab, mu_synth_vocab *v, mu_error *err);
void mu_synth_vocab_write(const mu_synth_vocab *v, gguf_writer *w);
void mu_synth_vocab_free(mu_synth_vocab *v);

/* Per-tensor parameters of the random rows. */
typedef struct mu_synth_gen {
    uint64_t key;       /* seed x tensor name */
    uint32_t type;
    float std;          /* target standard deviation of the weights */
    uint16_t d_f16;     /* block super-scale (f16 bits) for K/Q types */
    uint16_t dmin_f16;  /* Q4_K/Q5_K min scale */
    float scale2;       /* NVFP4 per-tensor scale (native scale2 or ggml .scale) */
} mu_synth_gen;

/* Choose block scales so the dequantized values have standard deviation
 * g->std; returns the per-tensor scalar for NVFP4 types in g->scale2. */
void mu_synth_gen_init(mu_synth_gen *g, uint64_t seed, const char *name, uint32_t type, float std);
/* Fill row `row` (n_in values) of a float or block type into dst. */
void mu_synth_row(const mu_synth_gen *g, uint64_t row, uint64_t n_in, uint8_t *dst);
/* Native NVFP4 row: payload (n_in/2 bytes) and E4M3FN scales (n_in/16). */
void mu_synth_nvfp4_row(const mu_synth_gen *g, uint64_t row, uint64_t n_in,
                        uint8_t *payload, uint8_t *scales);
/* Norm vector values: mean + std * noise (std 0: a constant broadcast). */
void mu_synth_vector(uint64_t seed, const char *name, float mean, float std, uint64_t n, float *dst);

#endif
