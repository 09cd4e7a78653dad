/* Model-file tools behind `muser synth` and `muser quantize`.
 *
 * synth writes a complete, loadable muse-glimmer GGUF with deterministic
 * random weights (same seed -> same bytes, whatever the thread count).
 * quantize rewrites any muse-glimmer GGUF into another weight type or mix.
 *
 * Weight types and mixes accepted by both (case-insensitive):
 *   F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K  every 2-D tensor in that type
 *   q4_k_xl     attn_v Q6_K, ffn_down Q4_K (even layers) / Q6_K (odd),
 *               output Q5_K, every other 2-D tensor Q4_K
 *   nvfp4       native lane: projections NVFP4_E2M1 + .nvfp4_scale +
 *               .nvfp4_scale2, token_embd and output F16
 *   nvfp4_ggml  projections ggml NVFP4 (type 40) + per-tensor .scale,
 *               token_embd and output F16
 * 1-D tensors (norm vectors) are always F32. */
#ifndef MUSER_TOOLS_H
#define MUSER_TOOLS_H
#include "util/common.h"

typedef struct mu_synth_opts {
    const char *preset;   /* "tiny" | "small" | "full" */
    /* Geometry overrides; -1 keeps the preset value. */
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx, window;
    const char *type;     /* a type or mix named above */
    uint64_t seed;
    const char *out_path;
    int n_threads;        /* 0 = all online cores */
    bool progress;        /* progress bar with MB/s on stderr */
} mu_synth_opts;

/* Defaults: preset "tiny", no overrides, type "F32", seed 0, 0 threads. */
void mu_synth_opts_init(mu_synth_opts *o);

/* Write the model to o->out_path. The GGUF writer fills a temporary file and
 * renames it at the end, so a failure never leaves a partial file. */
bool mu_synth(const mu_synth_opts *o, mu_error *err);

/* Re-type every weight of `in` into `out` (may equal `in`). */
bool mu_quantize_file(const char *in, const char *out, const char *type_or_mix,
                      int n_threads, bool progress, mu_error *err);

/* Comma-separated list of the accepted type/mix names (for help text). */
const char *mu_tools_type_names(void);

#endif
