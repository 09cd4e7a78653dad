/* Muse Glimmer: configuration read from GGUF metadata, validated against
 * every tensor shape, and the weight views the forward pass uses. */
#ifndef MUSER_MODEL_H
#define MUSER_MODEL_H
#include "gguf/gguf.h"
#include "quant/quant.h"

#define MU_POST_NORM_EPS 1e-8f /* hard-wired in the graph, not in the GGUF */

typedef struct mu_model_config {
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_rot, n_ff, n_vocab;
    int64_t n_ctx_train;
    int64_t sliding_window;
    bool *is_swa;               /* [n_layer] */
    int64_t n_swa_layers;
    float rms_eps;
    float rope_base_swa;        /* rope.freq_base_swa, else rope.freq_base, else 10000 */
    float rope_freq_scale_swa;  /* 1 unless rope scaling is declared */
    float logit_scale;
    float softcap;              /* 0 disables */
    float qk_scale_factor;      /* the constant in attn_q_norm */
} mu_model_config;

typedef struct mu_layer_weights {
    mu_weight attn_q, attn_k, attn_v, attn_gate, attn_output;
    mu_weight ffn_gate, ffn_up, ffn_down;
    float *attn_norm, *post_attention_norm, *ffn_norm, *post_ffw_norm; /* [n_embd] */
    float *attn_q_norm, *attn_k_norm;                                   /* [head_dim] */
} mu_layer_weights;

typedef struct mu_model {
    gguf_file *gguf;
    mu_model_config cfg;
    char lane[16];              /* "q4_k_xl" (K-quant lane, also plain types) or "nvfp4" */
    char *name;                 /* general.name or file name */
    mu_weight token_embd, output;
    float *output_norm;
    mu_layer_weights *layers;
    uint64_t weight_bytes;      /* bytes of all weight tensors read per token */
} mu_model;

/* Load and validate; NULL with a precise message on any defect. */
mu_model *mu_model_load(const char *path, mu_error *err);
/* Validate an already-open GGUF (takes ownership of f on success and failure). */
mu_model *mu_model_from_gguf(gguf_file *f, mu_error *err);
void mu_model_free(mu_model *m);

#endif
