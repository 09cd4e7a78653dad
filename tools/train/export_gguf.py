#!/usr/bin/python3
"""Export trained glimmer-tiny weights to a muse-glimmer GGUF, laid out as
llama.cpp's muse-glimmer converter lays it out.

    export_gguf.py RUN_DIR TOKENIZER.json OUT.gguf [--type f32|f16]

RUN_DIR holds what train.py wrote (index.json + weights.partNN).  The
converter's transformations (spec muse-glimmer-gguf.md sections 4-7):
  * the four per-layer norms are written as w + 1, the final norm as w;
  * Q/K rows are permuted from HF rotate_half order to ggml's interleaved
    (NORM) order: within each head, new row 2i+j = old row j*(hd/2)+i;
  * attn_q_norm = full(head_dim, qk_scale_factor), attn_k_norm = ones;
  * 2-D tensors [out, in] become ggml [in, out]; 1-D tensors stay F32.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as G  # noqa: E402

ARCH = "muse-glimmer"

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|header_start|>' + message['role'] + '<|header_end|>\\n\\n' + message['content'] | trim + '<|eot|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif %}"
)


def load_run(run_dir):
    with open(os.path.join(run_dir, "index.json")) as f:
        index = json.load(f)
    blob = b"".join(open(os.path.join(run_dir, p), "rb").read() for p in index["parts"])
    if len(blob) != index["nbytes"]:
        raise SystemExit("%s: weight parts hold %d bytes, index says %d" % (run_dir, len(blob), index["nbytes"]))
    dt = np.dtype(index.get("dtype", "float16")).newbyteorder("<")
    weights = {}
    for t in index["tensors"]:
        a = np.frombuffer(blob, dtype=dt, count=t["nbytes"] // dt.itemsize, offset=t["offset"])
        weights[t["name"]] = a.reshape(t["shape"]).astype(np.float32)
    return index, weights


def unpermute_rope(w, n_heads):
    """HF rotate_half row order -> ggml interleaved row order (per head)."""
    out_dim = w.shape[0]
    hd = out_dim // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, hd // 2, *rest).swapaxes(1, 2).reshape(out_dim, *rest)


def add_tokenizer(g, tok):
    tokens = tok["tokens"]
    sp = tok["specials"]
    g.add("tokenizer.ggml.model", G.STRING, "gpt2")
    g.add("tokenizer.ggml.pre", G.STRING, tok["pre"])
    g.add_array("tokenizer.ggml.tokens", G.STRING, tokens)
    special_ids = set(sp.values())
    g.add_array("tokenizer.ggml.token_type", G.INT32, [3 if i in special_ids else 1 for i in range(len(tokens))])
    g.add_array("tokenizer.ggml.merges", G.STRING, tok["merges"])
    g.add("tokenizer.ggml.bos_token_id", G.UINT32, sp["<|begin_of_text|>"])
    g.add("tokenizer.ggml.eos_token_id", G.UINT32, sp["<|end_of_text|>"])
    g.add("tokenizer.ggml.eot_token_id", G.UINT32, sp["<|eot|>"])
    g.add("tokenizer.ggml.eom_token_id", G.UINT32, sp["<|eom|>"])
    g.add("tokenizer.ggml.padding_token_id", G.UINT32, sp["<|pad|>"])
    g.add("tokenizer.ggml.add_bos_token", G.BOOL, True)
    g.add("tokenizer.ggml.add_eos_token", G.BOOL, False)
    g.add("tokenizer.chat_template", G.STRING, CHAT_TEMPLATE)


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
    g.add(p + "rope.freq_base", G.FLOAT32, c["rope_theta"])
    g.add(p + "rope.freq_base_swa", G.FLOAT32, c["rope_theta_swa"])
    g.add(p + "attention.layer_norm_rms_epsilon", G.FLOAT32, c["rms_eps"])
    g.add(p + "attention.key_length", G.UINT32, c["head_dim"])
    g.add(p + "attention.value_length", G.UINT32, c["head_dim"])
    g.add(p + "final_logit_softcapping", G.FLOAT32, c["softcap"])
    g.add(p + "logit_scale", G.FLOAT32, c["logit_scale"])
    g.add(p + "attention.sliding_window", G.UINT32, c["sliding_window"])
    period = c["swa_period"]
    g.add_array(p + "attention.sliding_window_pattern", G.BOOL,
                [il % period < period - 1 for il in range(c["n_layer"])])


def add_tensors(g, c, w, mat_type):
    one = np.float32(1.0)
    g.add_tensor("token_embd.weight", w["embed_tokens.weight"], mat_type)
    for il in range(c["n_layer"]):
        h = "layers.%d." % il
        b = "blk.%d." % il
        g.add_tensor(b + "attn_norm.weight", w[h + "input_layernorm.weight"] + one, G.GGML_F32)
        g.add_tensor(b + "attn_q.weight", unpermute_rope(w[h + "self_attn.q_proj.weight"], c["n_head"]), mat_type)
        g.add_tensor(b + "attn_k.weight", unpermute_rope(w[h + "self_attn.k_proj.weight"], c["n_head_kv"]), mat_type)
        g.add_tensor(b + "attn_v.weight", w[h + "self_attn.v_proj.weight"], mat_type)
        g.add_tensor(b + "attn_gate.weight", w[h + "self_attn.gate_proj.weight"], mat_type)
        g.add_tensor(b + "attn_q_norm.weight", np.full(c["head_dim"], c["qk_scale_factor"], np.float32), G.GGML_F32)
        g.add_tensor(b + "attn_k_norm.weight", np.ones(c["head_dim"], np.float32), G.GGML_F32)
        g.add_tensor(b + "attn_output.weight", w[h + "self_attn.o_proj.weight"], mat_type)
        g.add_tensor(b + "post_attention_norm.weight", w[h + "post_attention_layernorm.weight"] + one, G.GGML_F32)
        g.add_tensor(b + "ffn_norm.weight", w[h + "pre_feedforward_layernorm.weight"] + one, G.GGML_F32)
        g.add_tensor(b + "ffn_gate.weight", w[h + "mlp.gate_proj.weight"], mat_type)
        g.add_tensor(b + "ffn_up.weight", w[h + "mlp.up_proj.weight"], mat_type)
        g.add_tensor(b + "ffn_down.weight", w[h + "mlp.down_proj.weight"], mat_type)
        g.add_tensor(b + "post_ffw_norm.weight", w[h + "post_feedforward_layernorm.weight"] + one, G.GGML_F32)
    g.add_tensor("output_norm.weight", w["norm"], G.GGML_F32)
    g.add_tensor("output.weight", w["lm_head.weight"], mat_type)


def export(default_name, add_hparams, add_tensors, owned, check=None, extra_keys=None):
    """The exporters' shared command line: RUN_DIR TOKENIZER.json OUT [--type f32|f16] [--name N].
    owned(w) names the run's weights the exporter consumes; any other is refused.
    check(c, tok) may refuse a run; extra_keys(g, c) adds keys after the tokenizer's."""
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--type", choices=["f32", "f16"], default="f32")
    ap.add_argument("--name", default=default_name)
    args = ap.parse_args()
    index, w = load_run(args.run_dir)
    with open(args.tokenizer, encoding="utf-8") as f:
        tok = json.load(f)
    c = index["config"]
    if len(tok["tokens"]) != c["vocab"]:
        raise SystemExit("tokenizer has %d tokens, the run's vocab is %d" % (len(tok["tokens"]), c["vocab"]))
    if check:
        check(c, tok)
    g = G.GGUFWriter()
    mat_type = G.GGML_F16 if args.type == "f16" else G.GGML_F32
    add_hparams(g, c, args.name, 1 if args.type == "f16" else 0)
    add_tokenizer(g, tok)
    if extra_keys:
        extra_keys(g, c)
    add_tensors(g, c, w, mat_type)
    if set(w) != owned(w):
        raise SystemExit("unexpected weights: %s" % sorted(set(w) - owned(w)))
    g.write(args.out)
    print("wrote %s (%s, %d tensors, %d KV)" % (args.out, args.type, len(g.tensors), len(g.kv)))


def main():
    export("glimmer-tiny", add_hparams, add_tensors,
           lambda w: {"embed_tokens.weight", "norm", "lm_head.weight"} | {n for n in w if n.startswith("layers.")})


if __name__ == "__main__":
    main()
