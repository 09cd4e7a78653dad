#!/usr/bin/python3
"""Export a trained DFlash assistant to a `dflash` GGUF laid out as llama.cpp's
converter (MuseGlimmerAssistantModel) lays it out (spec muse-glimmer-gguf.md s9).

    export_dflash.py DRAFT_RUN_DIR TOKENIZER.json OUT.gguf [--type f32|f16]

  * general.architecture = "dflash", keys under "dflash.";
  * dflash.target_layers are one-based (the input of that target layer), which
    is what train_dflash.py records; dflash.block_size = 16;
  * all layers sliding (dflash.attention.sliding_window + BOOL pattern);
  * no token_embd / output: the assistant uses the target's;
  * norms are stored as trained (applied as w), RoPE is NeoX so Q/K rows are
    not permuted; tokenizer as in the target plus tokenizer.ggml.mask_token_id.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as G  # noqa: E402
from export_gguf import export  # noqa: E402

ARCH = "dflash"


def add_hparams(g, c, name, file_type):
    g.add("general.architecture", G.STRING, ARCH)
    g.add("general.name", G.STRING, name)
    g.add("general.file_type", G.UINT32, file_type)
    p = ARCH + "."
    g.add(p + "block_count", G.UINT32, c["n_layer"])
    g.add(p + "context_length", G.UINT32, c["context_length"])
    g.add(p + "embedding_length", G.UINT32, c["n_embd"])
    g.add(p + "feed_forward_length", G.UINT32, c["n_ff"])
    g.add(p + "attention.head_count", G.UINT32, c["n_head"])
    g.add(p + "attention.head_count_kv", G.UINT32, c["n_head_kv"])
    g.add(p + "attention.key_length", G.UINT32, c["head_dim"])
    g.add(p + "attention.value_length", G.UINT32, c["head_dim"])
    g.add(p + "rope.freq_base", G.FLOAT32, c["rope_theta"])
    g.add(p + "attention.layer_norm_rms_epsilon", G.FLOAT32, c["rms_eps"])
    g.add(p + "block_size", G.UINT32, c["block_size"])
    g.add_array(p + "target_layers", G.INT32, list(c["target_layers"]))
    g.add(p + "attention.sliding_window", G.UINT32, c["sliding_window"])
    g.add_array(p + "attention.sliding_window_pattern", G.BOOL, [True] * c["n_layer"])


def add_tensors(g, c, w, mat_type):
    g.add_tensor("fc.weight", w["fc.weight"], mat_type)
    g.add_tensor("enc.output_norm.weight", w["hidden_norm.weight"], G.GGML_F32)
    for il in range(c["n_layer"]):
        h, b = "layers.%d." % il, "blk.%d." % il
        g.add_tensor(b + "attn_norm.weight", w[h + "input_layernorm.weight"], G.GGML_F32)
        g.add_tensor(b + "attn_q.weight", w[h + "q_proj.weight"], mat_type)
        g.add_tensor(b + "attn_k.weight", w[h + "k_proj.weight"], mat_type)
        g.add_tensor(b + "attn_v.weight", w[h + "v_proj.weight"], mat_type)
        g.add_tensor(b + "attn_output.weight", w[h + "o_proj.weight"], mat_type)
        g.add_tensor(b + "attn_q_norm.weight", w[h + "q_norm.weight"], G.GGML_F32)
        g.add_tensor(b + "attn_k_norm.weight", w[h + "k_norm.weight"], G.GGML_F32)
        g.add_tensor(b + "ffn_norm.weight", w[h + "post_attention_layernorm.weight"], G.GGML_F32)
        g.add_tensor(b + "ffn_gate.weight", w[h + "gate_proj.weight"], mat_type)
        g.add_tensor(b + "ffn_up.weight", w[h + "up_proj.weight"], mat_type)
        g.add_tensor(b + "ffn_down.weight", w[h + "down_proj.weight"], mat_type)
    g.add_tensor("output_norm.weight", w["norm.weight"], G.GGML_F32)


def check_mask(c, tok):
    if tok["specials"]["<|mask|>"] != c["mask_token"]:
        raise SystemExit("draft mask token %d is not the tokenizer's <|mask|>" % c["mask_token"])


def main():
    export("glimmer-tiny-dflash", add_hparams, add_tensors,
           lambda w: {"fc.weight", "hidden_norm.weight", "norm.weight"} | {n for n in w if n.startswith("layers.")},
           check=check_mask,
           extra_keys=lambda g, c: g.add("tokenizer.ggml.mask_token_id", G.UINT32, c["mask_token"]))


if __name__ == "__main__":
    main()
