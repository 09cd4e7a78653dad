#!/usr/bin/python3
"""Acceptance of a DFlash assistant as the engine measures it: `muser
speculate` (greedy, exact) on held-out prompts built as train_dflash.py builds
its measurement prompts (valid split + chat valid, numpy seed 7; the first
--n-select pick checkpoints there, the rest are measured here).

    accept.py [--muser build/muser] [--target T.gguf] --draft D.gguf [--data build/tok]
              [--n-eval 320] [--n-select 64] [--limit N] [--gen 144] [--vl 15,7] [--tree] [-t 2] [-j 1]
              [--write-prompts FILE]

Prints, per verify length, verify steps, tokens and tokens per verify step
over all prompts (a prompt's run stops at an end-of-generation token, where
train_dflash.py's simulation runs on), and the prompt share that ended early.
--write-prompts writes the prompts instead, one `ids:...` line each, for
`muser bench --draft D --spec-prompts FILE` (speed over the same set).
The statistics do not depend on the backend (every backend gives the same
tokens), so a CPU run measures what the GPU will see.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from heldout import prompt_rows  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--muser", default=os.path.join(root, "build", "muser"))
    ap.add_argument("--target", default=os.path.join(root, "models", "glimmer-tiny-q4_k_xl.gguf"))
    ap.add_argument("--draft", required=True)
    ap.add_argument("--data", default=os.path.join(root, "build", "tok"))
    ap.add_argument("--n-eval", type=int, default=320)
    ap.add_argument("--n-select", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--limit", type=int, default=0, help="measure only the first N prompts of each half")
    ap.add_argument("--gen", type=int, default=144)
    ap.add_argument("--vl", default="15,7")
    ap.add_argument("--tree", action="store_true", help="verify token trees (muser speculate --tree)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="prompts run at once")
    ap.add_argument("--write-prompts", metavar="FILE",
                    help="write the measured prompts as `muser bench --spec-prompts` lines (ids:...) and stop")
    args = ap.parse_args()
    ps = prompt_rows(args.data, "valid", args.n_eval, args.prompt, np.random.default_rng(7))
    measured = list(enumerate(ps))[args.n_select:]
    if args.limit:   # keep both halves (plain text, chat) represented
        half = args.n_eval // 2
        measured = [m for m in measured if m[0] < half][:args.limit] + [m for m in measured if m[0] >= half][:args.limit]
    if args.write_prompts:
        with open(args.write_prompts, "w") as f:
            for _, p in measured:
                f.write("ids:" + ",".join(str(int(t)) for t in p) + "\n")
        return
    def run(i, p, vl):
        cmd = [args.muser, "speculate", "-m", args.target, "--draft", args.draft, "--tokens",
               ",".join(str(int(t)) for t in p), "-n", str(args.gen), "--verify-len", str(vl),
               "-t", str(args.threads), "--backend", args.backend, "--json"] + (["--tree"] if args.tree else ["--spec-chain"])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("prompt %d: muser speculate failed (%d): %s" % (i, r.returncode, r.stderr.strip()))
        d = json.loads(r.stdout)
        if not d.get("exact"):
            raise SystemExit("prompt %d: the speculative stream differs from plain greedy" % i)
        return i, d

    for vl in [int(v) for v in args.vl.split(",")]:
        tot = {"plain": [0, 0, 0], "chat": [0, 0, 0]}   # verify steps, tokens, runs ended early
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for i, d in pool.map(lambda m: run(m[0], m[1], vl), measured):
                k = "plain" if i < args.n_eval // 2 else "chat"
                tot[k][0] += d["verify_steps"]
                tot[k][1] += d["verify_steps"] + d["accepted"]   # each step: its accepted drafts + one token
                tot[k][2] += len(d["ids"]) < args.gen
        s = [tot["plain"][j] + tot["chat"][j] for j in range(3)]
        print(json.dumps({"draft": args.draft, "verify_len": vl, "tree": args.tree, "prompts": len(measured),
                          "verify_steps": s[0], "tokens": s[1], "tokens_per_step": round(s[1] / s[0], 4),
                          "plain_text": round(tot["plain"][1] / max(tot["plain"][0], 1), 4),
                          "chat": round(tot["chat"][1] / max(tot["chat"][0], 1), 4),
                          "ended_early": s[2]}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
