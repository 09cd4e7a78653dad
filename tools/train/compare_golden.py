#!/usr/bin/python3
"""Compare the engine's logits with the golden file.

    compare_golden.py GOLDEN MODEL.gguf [--muser build/muser] [--threads N] [--all-rows]

For each golden sequence, runs `muser run --tokens <prefix> -n 1 --dump-logits`
on the prefix that ends at each golden row (only the last row unless
--all-rows) and reports max |engine - golden| and that over max |golden| of
the row (the "relative" error the issue's 1e-4 bound refers to).
Exit status 1 if any row exceeds --tol (default 1e-4).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402


def engine_row(muser, model, toks, threads, n_vocab, extra):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.bin")
        cmd = [muser, "run", "-m", model, "--tokens", ",".join(map(str, toks)), "-n", "1",
               "--temp", "0", "-t", str(threads), "--dump-logits", out] + extra
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("muser failed (%d): %s" % (r.returncode, r.stderr.strip()[-2000:]))
        a = np.fromfile(out, dtype="<f4")
        if a.size < n_vocab:
            raise SystemExit("muser dumped %d floats, expected >= %d" % (a.size, n_vocab))
        return a[:n_vocab]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("golden")
    ap.add_argument("model")
    ap.add_argument("--muser", default="build/muser")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--all-rows", action="store_true")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--extra", default="", help="extra muser run arguments")
    args = ap.parse_args()
    worst = 0.0
    for toks, pos, lg in golden.read(args.golden):
        rows = range(len(pos)) if args.all_rows else [len(pos) - 1]
        for r in rows:
            got = engine_row(args.muser, args.model, toks[:pos[r] + 1], args.threads, lg.shape[1],
                             args.extra.split())
            ref = lg[r].astype(np.float64)
            d = np.abs(got - ref)
            rel = d.max() / np.abs(ref).max()
            worst = max(worst, rel)
            print("seq len %4d row pos %4d: max abs %.3e  rel %.3e  argmax %d/%d" % (
                len(toks), pos[r], d.max(), rel, int(got.argmax()), int(ref.argmax())))
    print("worst relative error %.3e (tol %.0e): %s" % (worst, args.tol, "PASS" if worst <= args.tol else "FAIL"))
    sys.exit(0 if worst <= args.tol else 1)


if __name__ == "__main__":
    main()
