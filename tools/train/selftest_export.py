#!/usr/bin/python3
"""CPU check of the export path without a GPU: a random-weight glimmer-tiny
(norm weights random too, so the +1 and Q/K permutation matter), rounded to
f16, written in train.py's run-directory format with its golden file.

    selftest_export.py TOK_DIR OUT_DIR [--layers N]
Then: export_gguf.py OUT_DIR TOKENIZER.json x.gguf; compare_golden.py OUT_DIR/golden.bin x.gguf
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Glimmer  # noqa: E402
import golden  # noqa: E402
from train import write_shards  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("tok_dir")
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=8)
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
torch.manual_seed(7)
cfg = Config(n_layer=args.layers)
model = Glimmer(cfg)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name == "norm" else 0.0))
        else:
            p.mul_(3.0)   # larger than init so attention is far from uniform
    for p in model.state_dict().values():
        p.copy_(p.to(torch.float16).to(p.dtype))
entries, parts, nbytes = write_shards(model, args.out)
with open(os.path.join(args.tok_dir, "golden_tokens.json")) as f:
    seqs = json.load(f)["sequences"]
cfg.kv_round_f16 = True   # the engine's f16 KV cache (shared cfg object)
m64 = model.double().eval()
golden.write(os.path.join(args.out, "golden.bin"), m64, seqs, cfg.vocab, rows=2)
with open(os.path.join(args.out, "index.json"), "w") as f:
    json.dump({"config": cfg.to_dict(), "tensors": entries, "parts": parts, "nbytes": nbytes,
               "dtype": "float16"}, f, indent=1)
print("random model written to", args.out)
