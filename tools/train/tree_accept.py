#!/usr/bin/python3
"""How many tokens a verify step would keep if the verification checked a
token tree instead of one chain: the assistant's block rows at every anchor of
the target's greedy continuations of the held-out prompts, then greedy
speculative decoding simulated for a chain and for trees of the same row
count (PyTorch, float32, the dequantized GGUFs).

    tree_accept.py --target T.gguf --draft D.gguf [--data build/tok] [--limit N] [--nodes 3,7,15,31]
                   [--threads N] [--save STATS.npz]

A tree of N nodes is verified in N + 1 rows (the bonus token's row first), as
a chain of verify length N. The DFlash block predicts each row's token without
seeing the earlier rows' choices, so a tree is built from the rows'
distributions: best first by the product of the draft's probabilities along
the path (a node is a path of ranks, one per row). A verify step keeps the
deepest tree path that equals the target's greedy tokens, plus the bonus.
"""
import argparse
import os
import sys
import time
import heapq

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dflash import Draft, DraftConfig, greedy_generate, target_features  # noqa: E402
from heldout import prompt_rows  # noqa: E402
from train_dflash import draft_from_gguf, load_target  # noqa: E402

K = 8   # ranks kept per row


@torch.no_grad()
def block_stats(draft, target, seqs, feats, start, batch):
    """For every sequence and anchor p in [start, T - S]: the rank of the true
    token in each block row 1..S-1 (clamped to K) and the top-K probabilities."""
    B, T = seqs.shape
    S = draft.c.block_size
    anchors = torch.arange(start, T - S + 1)
    ranks = np.zeros((B, len(anchors), S - 1), np.int16)
    probs = np.zeros((B, len(anchors), S - 1, K), np.float32)
    for a0 in range(0, len(anchors), batch):
        a = anchors[a0:a0 + batch]
        an = a[None, :].expand(B, len(a))
        logits = draft(target, feats, an, seqs)[:, :, 1:].float()          # [B, A, S-1, V]
        truth = seqs.gather(1, (an[:, :, None] + torch.arange(1, S)).reshape(B, -1)).view(B, len(a), S - 1)
        tl = logits.gather(3, truth[..., None])
        idx = torch.arange(logits.shape[-1])
        better = (logits > tl) | ((logits == tl) & (idx < truth[..., None]))
        ranks[:, a0:a0 + len(a)] = better.sum(-1).clamp(max=K).numpy()
        probs[:, a0:a0 + len(a)] = logits.softmax(-1).topk(K, dim=-1).values.numpy()
    return ranks, probs


def build_tree(p, n):
    """Best-first tree of n nodes over rows with top-K probabilities p [S-1, K]:
    a set of rank paths (tuples)."""
    tree = set()
    heap = [(-p[0, 0], (0,))]
    while heap and len(tree) < n:
        negq, path = heapq.heappop(heap)
        tree.add(path)
        d = len(path)
        if path[-1] + 1 < K:   # the next sibling
            heapq.heappush(heap, (negq / p[d - 1, path[-1]] * p[d - 1, path[-1] + 1], path[:-1] + (path[-1] + 1,)))
        if d < p.shape[0]:     # the first child
            heapq.heappush(heap, (negq * p[d, 0], path + (0,)))
    return tree


def simulate(ranks, probs, policy, arg):
    """Verify steps and tokens of greedy speculative decoding from the first
    anchor of every sequence until a whole block no longer fits."""
    B, A, _ = ranks.shape
    steps = tokens = 0
    for b in range(B):
        a = 0
        while a < A:
            r = ranks[b, a]
            if policy == "chain":
                k = 0
                while k < min(arg, len(r)) and r[k] == 0:
                    k += 1
            else:
                tree = build_tree(probs[b, a], arg)
                k = 0
                while k < len(r) and r[k] < K and tuple(int(x) for x in r[:k + 1]) in tree:
                    k += 1
            steps += 1
            tokens += k + 1
            a += k + 1
    return steps, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "tok"))
    ap.add_argument("--n-eval", type=int, default=320)
    ap.add_argument("--n-select", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts of each half")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--gen", type=int, default=144)
    ap.add_argument("--nodes", default="3,7,15,31")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--save", help="write the ranks and top-K probabilities here (.npz)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    target, tcfg = load_target(args.target, "cpu")
    c = DraftConfig(vocab=tcfg.vocab, n_embd=tcfg.n_embd, head_dim=tcfg.head_dim,
                    context_length=tcfg.context_length)
    draft = Draft(c)
    draft.load_state_dict(draft_from_gguf(args.draft, c))
    draft.eval()
    ps = prompt_rows(args.data, "valid", args.n_eval, args.prompt, np.random.default_rng(7))
    idx = list(range(args.n_select, args.n_eval))
    if args.limit:
        half = args.n_eval // 2
        idx = [i for i in idx if i < half][:args.limit] + [i for i in idx if i >= half][:args.limit]
    p = torch.tensor(np.stack([ps[i] for i in idx]))
    seqs = torch.cat([greedy_generate(target, p[i:i + 64], args.gen) for i in range(0, len(p), 64)])
    feats = torch.cat([target_features(target, seqs[i:i + 32], c.target_layers) for i in range(0, len(seqs), 32)])
    print("%d sequences of %d tokens, %.0f s" % (len(seqs), seqs.shape[1], time.time() - t0), flush=True)
    ranks, probs = [], []
    for i in range(0, len(seqs), 16):
        r, q = block_stats(draft, target, seqs[i:i + 16], feats[i:i + 16], args.prompt, 16)
        ranks.append(r)
        probs.append(q)
    ranks, probs = np.concatenate(ranks), np.concatenate(probs)
    print("draft rows at every anchor, %.0f s" % (time.time() - t0), flush=True)
    if args.save:   # for other tree policies: simulate(ranks, probs, ...) over the saved arrays
        np.savez_compressed(args.save, ranks=ranks, probs=probs, idx=np.array(idx))
    r1 = ranks[:, :, 0].ravel()
    print("row 1: truth at rank 0 %.3f, 1 %.3f, 2-3 %.3f, >= %d %.3f" % (
        (r1 == 0).mean(), (r1 == 1).mean(), ((r1 >= 2) & (r1 < 4)).mean(), K, (r1 >= K).mean()))
    half = args.n_eval // 2
    plain = np.array([i < half for i in idx])
    for name, sel in (("all", slice(None)), ("plain", plain), ("chat", ~plain)):
        for n in [int(x) for x in args.nodes.split(",")]:
            for pol in ("chain", "tree"):
                st, tk = simulate(ranks[sel], probs[sel], pol, n)
                print("%-5s %-5s %2d nodes (%2d rows): %6d steps %6d tokens  %.3f tokens/step" % (
                    name, pol, n, n + 1, st, tk, tk / st), flush=True)


if __name__ == "__main__":
    main()
