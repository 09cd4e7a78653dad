#!/usr/bin/python3
"""Golden logits of the PyTorch reference model loaded from a muse-glimmer
F32 GGUF (the converter's transformations undone).

    golden_from_gguf.py MODEL-F32.gguf GOLDEN_TOKENS.json OUT.golden

Used for the shipped K-quant default: `muser quantize` dequantizes
models/glimmer-tiny-q4_k_xl.gguf to F32, this script computes what the
PyTorch model (float64, f16 KV cache, as golden.py) gives with exactly those
weights, and tests/test_golden.c checks the engine's F32 and F16 forward
against it in CI, where the trainer's own F32/F16 files are not available.
"""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Glimmer  # noqa: E402
from gguf_read import Reader  # noqa: E402
import golden  # noqa: E402


def permute_rope(w, n_heads):
    """ggml interleaved row order -> HF rotate_half order (inverse of export_gguf.unpermute_rope)."""
    out_dim = w.shape[0]
    hd = out_dim // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(out_dim, *w.shape[1:])


def config_of(kv):
    p = "muse-glimmer."
    pattern = kv[p + "attention.sliding_window_pattern"]
    period = pattern.index(False) + 1
    return Config(vocab=len(kv["tokenizer.ggml.tokens"]), n_layer=kv[p + "block_count"],
                  n_embd=kv[p + "embedding_length"], n_head=kv[p + "attention.head_count"],
                  n_head_kv=kv[p + "attention.head_count_kv"], head_dim=kv[p + "attention.key_length"],
                  n_ff=kv[p + "feed_forward_length"], sliding_window=kv[p + "attention.sliding_window"],
                  swa_period=period, rope_theta_swa=kv[p + "rope.freq_base_swa"],
                  rope_theta=kv[p + "rope.freq_base"], rms_eps=kv[p + "attention.layer_norm_rms_epsilon"],
                  logit_scale=kv[p + "logit_scale"], softcap=kv[p + "final_logit_softcapping"],
                  context_length=kv[p + "context_length"], kv_round_f16=os.environ.get("GOLDEN_KV_F32") is None)


def state_dict(t, c):
    sd = {"embed_tokens.weight": t["token_embd.weight"], "norm": t["output_norm.weight"],
          "lm_head.weight": t["output.weight"]}
    for il in range(c.n_layer):
        b, h = "blk.%d." % il, "layers.%d." % il
        q_scale = t[b + "attn_q_norm.weight"]
        if not np.all(q_scale == q_scale[0]) or not np.all(t[b + "attn_k_norm.weight"] == 1.0):
            raise SystemExit("%s: q/k norm weights are not the converter's constants" % b)
        c.qk_scale_factor = float(q_scale[0])
        sd.update({
            h + "input_layernorm.weight": t[b + "attn_norm.weight"] - 1,
            h + "self_attn.q_proj.weight": permute_rope(t[b + "attn_q.weight"], c.n_head),
            h + "self_attn.k_proj.weight": permute_rope(t[b + "attn_k.weight"], c.n_head_kv),
            h + "self_attn.v_proj.weight": t[b + "attn_v.weight"],
            h + "self_attn.gate_proj.weight": t[b + "attn_gate.weight"],
            h + "self_attn.o_proj.weight": t[b + "attn_output.weight"],
            h + "post_attention_layernorm.weight": t[b + "post_attention_norm.weight"] - 1,
            h + "pre_feedforward_layernorm.weight": t[b + "ffn_norm.weight"] - 1,
            h + "mlp.gate_proj.weight": t[b + "ffn_gate.weight"],
            h + "mlp.up_proj.weight": t[b + "ffn_up.weight"],
            h + "mlp.down_proj.weight": t[b + "ffn_down.weight"],
            h + "post_feedforward_layernorm.weight": t[b + "post_ffw_norm.weight"] - 1,
        })
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)) for k, v in sd.items()}


def main():
    r = Reader(sys.argv[1])
    c = config_of(r.kv)
    sd = state_dict(r.tensors, c)
    model = Glimmer(c).double()
    model.load_state_dict(sd)
    model.eval()
    with open(sys.argv[2]) as f:
        seqs = json.load(f)["sequences"]
    golden.write(sys.argv[3], model, seqs, c.vocab, rows=4)
    print("wrote %s: %d sequences" % (sys.argv[3], len(seqs)))


if __name__ == "__main__":
    main()
