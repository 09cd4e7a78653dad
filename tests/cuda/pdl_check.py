#!/usr/bin/env python3
"""Every kernel of the CUDA backend waits for its predecessors (the rule in
src/backend/cuda/cuda_common.cuh): a replayed graph starts a kernel while
the kernel before it still runs, so a kernel whose first statement is not
grid_dep_wait() could read stale activations. Kernels that touch only
weights first name the device function that waits for them (PRE_WAIT).
Run on the sources, without a GPU: python3 pdl_check.py DIR; --self-test
checks that the checker itself catches a kernel without the wait."""
import os
import re
import sys

PRE_WAIT = {"k_mmv2": "mmv2_out", "k_mmv2_set": "mmv2_out", "k_mmv3": "mmv3_part", "k_mmv3_set": "mmv3_part",
            "k_mmt": "mmt_tile", "k_mmv4_set": "mmv4_part", "k_mmv6_set": "mmv6_first",
            "k_mmq": "mq_wait_x", "k_residual": "res_weights", "k_residual_w": "res_w_weights", "k_qk_norm_rope": "qkn_weights",
            "k_attn_dec": "ad_begin", "k_dense_attn2": "da2_begin", "k_gemm_fp4": "fp4_first", "k_mmv_float": "mmvf_first", "k_attn_merge_scan": "merge_begin",
            "k_attn_dcl": "cl_begin", "k_attn_dfl": "fl_begin", "k_chain_read": "chain_first"}


def body_at(text, open_at):
    """The text inside the braces that open at open_at."""
    depth, i = 0, open_at
    while True:
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1:i]
        i += 1


def bodies(text):
    """(name, body) of every __global__ function."""
    out = []
    for m in re.finditer(r"__global__", text):
        open_at = text.index("{", m.end())
        name = re.findall(r"(k_\w+)\s*\(", text[m.end():open_at])
        out.append((name[0] if name else "?", body_at(text, open_at)))
    return out


def waits(text, fname):
    """Does the definition of device function fname call grid_dep_wait()?"""
    m = re.search(r"__device__[^;{]*\b%s\s*\([^;{]*\{" % fname, text)
    return bool(m) and "grid_dep_wait()" in body_at(text, m.end() - 1)


def check(text, where):
    bad = []
    for name, body in bodies(text):
        first = body.strip().split(";")[0].strip()
        if first == "grid_dep_wait()":
            continue
        helper = PRE_WAIT.get(name)
        if helper and re.search(r"\b%s\s*[<(]" % helper, body) and waits(text, helper):
            continue
        bad.append("%s: kernel %s does not start with grid_dep_wait()" % (where, name))
    return bad


def main():
    if sys.argv[1:] == ["--self-test"]:
        good = "__global__ static void k_a(float *x) {\n    grid_dep_wait();\n    x[0] = 1;\n}\n"
        bad = "__global__ static void k_b(float *x) {\n    x[0] = 1;\n    grid_dep_wait();\n}\n"
        pre = ("__device__ static inline void w_a(float *x) {\n    if (x) { x[1] = 0; }\n    grid_dep_wait();\n}\n"
               "__global__ static void k_mmv2(float *x) {\n    w_a<1>(x);\n}\n")
        PRE_WAIT["k_mmv2"] = "w_a"
        ok = (not check(good, "good") and len(check(good + bad, "bad")) == 1 and not check(pre, "pre") and
              len(check(pre.replace("grid_dep_wait();", ""), "pre")) == 1)
        print("self-test", "ok" if ok else "FAILED")
        return 0 if ok else 1
    src = sys.argv[1]
    bad, n = [], 0
    for f in sorted(os.listdir(src)):
        if f.endswith(".cu"):
            text = open(os.path.join(src, f)).read()
            n += len(bodies(text))
            bad += check(text, f)
    for b in bad:
        print(b)
    print("%d kernels, %d without the wait" % (n, len(bad)))
    return 1 if bad or n == 0 else 0


sys.exit(main())
