#!/usr/bin/python3
"""A speculative run's kernel trace, round by round.

    tools/cuda_trace_rounds.py TRACE.csv [--skip 20] [--top 12]

TRACE.csv: the CUPTI timeline MUSER_CUDA_TRACE_CSV writes (start_ns, end_ns,
graph_id, name; tests/cuda/device.sh's spec stage leaves it as
trace-spec.csv in the device call's $OUT). A round is what lies between two
k_tree_build launches (trees on the registers: the draft's last kernel).
After --skip rounds (the first captures), prints the medians of a round's
span (tree build to tree build), the union of its kernels' intervals (the
time the GPU ran a kernel) and its launch count per graph, then the idle
gaps summed per round by the kernel pair around them, and the busy time each
kernel adds (how far its end lies past every earlier kernel's). Kernels launched
with programmatic dependence start before the one ahead ends, so their
own durations overlap: the union and the gaps are the figures to compare.
"""
import argparse
import collections
import csv
import re
import statistics


def short(name):
    m = re.match(r"_Z(\d+)", name)  # an Itanium-mangled name: its length prefix
    return name[m.end():m.end() + int(m.group(1))] if m else name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--skip", type=int, default=20, help="rounds left out at the start")
    ap.add_argument("--top", type=int, default=12, help="gap kinds printed")
    a = ap.parse_args()
    ks = sorted((int(r["start_ns"]), int(r["end_ns"]), int(r["graph_id"]), short(r["name"]))
                for r in csv.DictReader(open(a.csv)))
    ends = [i for i, k in enumerate(ks) if k[3] == "k_tree_build"]
    if len(ends) < a.skip + 2:
        raise SystemExit("%s: %d tree builds, fewer than --skip %d + 2" % (a.csv, len(ends), a.skip))
    spans, busy, counts, gaps = [], [], collections.defaultdict(list), collections.Counter()
    added = collections.Counter()  # the busy time each kernel adds past the ones before it
    for i0, i1 in zip(ends[a.skip:-1], ends[a.skip + 1:]):
        t = ks[i0][1]
        u, end, prev = 0, t, ks[i0]
        per_graph = collections.Counter()
        for k in ks[i0 + 1:i1 + 1]:
            if k[0] > end:
                gaps[(prev[3], k[3])] += k[0] - end
            u += max(0, k[1] - max(k[0], end))
            added[k[3]] += max(0, k[1] - max(k[0], end))
            end, prev = max(end, k[1]), k
            per_graph[k[2]] += 1
        spans.append(ks[i1][1] - t)
        busy.append(u)
        for g, n in per_graph.items():
            counts[g].append(n)
    n = len(spans)
    print("%d rounds: span %.1f us, kernels busy %.1f us (medians)" % (n, statistics.median(spans) / 1e3,
                                                                       statistics.median(busy) / 1e3))
    print("launches a round by graph (0: outside graphs): " +
          ", ".join("%d: %g" % (g, statistics.median(v)) for g, v in sorted(counts.items())))
    print("busy time added by each kernel (its end past every earlier kernel's), us a round:")
    for k, v in added.most_common(a.top):
        print("  %7.2f  %s" % (v / n / 1e3, k))
    print("idle gaps, us a round, by the kernels around them:")
    for (k0, k1), v in gaps.most_common(a.top):
        print("  %7.2f  %s -> %s" % (v / n / 1e3, k0, k1))


if __name__ == "__main__":
    main()
