#!/usr/bin/python3
"""Reference draft logits of the DFlash assistant for the C engine to match
(docs/speculative.md): the PyTorch target computes the hidden states of a
token sequence, the PyTorch draft (tools/train/dflash.py, f32 on the CPU)
drafts a block at a few anchors, and everything is dumped for
muser's draft forward to be compared against.

    dflash_reference.py TARGET_RUN DRAFT_RUN IDS OUT.bin

IDS: comma-separated token ids (e.g. from `muser tokenize --ids`).
Little-endian output:
  char[8] "MUDFREF1"; u32 T, n_feat, A, R (= block_size - 1), V
  i32 tokens[T]; f32 features[T][n_feat]; i32 anchors[A]; f32 logits[A][R][V]
Anchors exercise the sink edge (63, 64, 65) and, once T > 64 + window, the
sliding window.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dflash import Draft, DraftConfig, target_features  # noqa: E402
from train_dflash import load_target  # noqa: E402


def load_draft(run_dir):
    with open(os.path.join(run_dir, "index.json")) as f:
        index = json.load(f)
    blob = b"".join(open(os.path.join(run_dir, p), "rb").read() for p in index["parts"])
    draft = Draft(DraftConfig(**index["config"]))
    sd = {}
    for t in index["tensors"]:
        a = np.frombuffer(blob, dtype="<f2", count=t["nbytes"] // 2, offset=t["offset"]).reshape(t["shape"])
        sd[t["name"]] = torch.from_numpy(a.astype(np.float32))
    draft.load_state_dict(sd)
    return draft.eval()


@torch.no_grad()
def main():
    target_dir, draft_dir, ids, out = sys.argv[1:5]
    torch.manual_seed(0)
    target, _ = load_target(target_dir, "cpu")
    draft = load_draft(draft_dir)
    c = draft.c
    tokens = torch.tensor([[int(x) for x in ids.split(",")]], dtype=torch.long)
    T = tokens.shape[1]
    feats = target_features(target, tokens, c.target_layers)                     # [1, T, n_t*E]
    anchors = [a for a in (1, 5, 63, 64, 65, 150, 330, 331, T - 1) if a < T]
    anchors = sorted(set(anchors))
    logits = draft(target, feats, torch.tensor([anchors]), tokens)[0, :, 1:]    # [A, S-1, V]
    with open(out, "wb") as f:
        f.write(b"MUDFREF1" + struct.pack("<5I", T, feats.shape[2], len(anchors), logits.shape[1], logits.shape[2]))
        f.write(tokens[0].numpy().astype("<i4").tobytes())
        f.write(feats[0].float().numpy().astype("<f4").tobytes())
        f.write(np.asarray(anchors, dtype="<i4").tobytes())
        f.write(logits.float().numpy().astype("<f4").tobytes())
    print("wrote %s: %d tokens, anchors %s" % (out, T, anchors))


if __name__ == "__main__":
    main()
