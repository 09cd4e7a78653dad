#!/usr/bin/python3
"""dflash.greedy_generate (K/V cache) against greedy_generate_recompute (the
whole sequence every step) on a muse-glimmer GGUF target, float32 on the CPU:
every step's logits from the cache within 1e-4 of the whole sequence's, and the
same tokens. Prompts longer than the sliding window exercise its mask.

    selftest_greedy.py TARGET-F32.gguf [--prompts 4] [--new 12]
(`muser quantize models/glimmer-tiny-q4_k_xl.gguf T.gguf f32` makes one)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dflash import _cached_rows, greedy_generate, greedy_generate_recompute  # noqa: E402
from train_dflash import load_target  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=12)
    ap.add_argument("--len", type=int, default=40)
    args = ap.parse_args()
    torch.manual_seed(1)
    torch.set_num_threads(os.cpu_count() or 1)
    target, cfg = load_target(args.target, "cpu")
    p = torch.randint(0, 8184, (args.prompts, args.len))
    a = greedy_generate_recompute(target, p, args.new)
    b = greedy_generate(target, p, args.new)
    same = bool((a == b).all())
    caches, diff, pos0, ids = [None] * cfg.n_layer, 0.0, 0, p   # each step's logits, fed a's tokens
    with torch.no_grad():
        for t in range(args.new):
            lc = _cached_rows(target, ids, pos0, caches)[:, -1]
            pos0 += ids.shape[1]
            lr = target(a[:, :args.len + t], last_only=True)[:, -1]
            diff = max(diff, float((lc - lr).abs().max()))
            ids = a[:, args.len + t:args.len + t + 1]
    print("tokens identical: %s; logits max difference over %d steps %.3g" % (same, args.new, diff))
    if not same or diff > 1e-4:
        sys.exit(1)

if __name__ == "__main__":
    main()
