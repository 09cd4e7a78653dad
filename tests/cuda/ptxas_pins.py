#!/usr/bin/env python3
"""The decode and prefill paths' hot kernels keep the registers, stack frame
and spills ptxas gave them when they were last timed on a GPU
(tests/cuda/ptxas_pins.txt).

Why: a source change that leaves every result bit the same can still make
ptxas allocate a kernel otherwise, and that can cost more than the change
was worth. ee18a49 raised a loop bound in mmt_load_act for its new 32-row
tiles; ptxas then compiled the 8- and 16-row k_mmt with 96 and 118
registers instead of 128 and 112, and 4 sequences decoded at 2.80x one
instead of 3.35x on an H100 for four sessions before a bisection found it
(docs/cuda.md "Tests"); unrolled, the thirty-fifth
session's copy loop in k_gemm_wg took 255 registers and spilled. No GPU is
needed to see such a change: this compiles the kernels' sources for sm_90
(cuda_gemm_wg.cu for sm_90a, as CMakeLists.txt builds it) with the build's flags
(`-Xptxas -v`) and compares each pinned kernel with its line in the pins
file. A difference fails with the kernel, the old and the new figures; the
fix is to time the change on the device (docs/cuda.md "Tests") and then
rewrite the pins with the flags the ctest passes:

    MUSER_PTXAS_PINS_UPDATE=1 ctest -R '^cuda_ptxas_pins$'   (in the build folder)

Usage (ctest, CMakeLists.txt): ptxas_pins.py --nvcc NVCC --src DIR
[--pins FILE] [--update] [-- nvcc flags...]; MUSER_PTXAS_PINS_UPDATE=1 in
the environment is --update; --self-test checks the comparison on canned
ptxas output (no nvcc)."""
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

# The sources (and the architecture each is built for) and the kernels of
# the decode, speculation and prefill paths in them (docs/cuda.md "Speed"):
# every instance of these names is pinned.
FILES = [("cuda_mmt.cu", "sm_90"), ("cuda_kernels.cu", "sm_90"), ("cuda_attn.cu", "sm_90"),
         ("cuda_prefill.cu", "sm_90"), ("cuda_gemm_wg.cu", "sm_90a")]
HOT = ["k_mmt", "k_mmq", "k_mmv4_set", "k_mmv6_set", "k_mmv3", "k_mmv3_set", "k_residual", "k_residual_w", "k_attn_dec", "k_attn_dfl", "k_attn_merge_scan",
       "k_gate_q8", "k_qk_norm_rope", "k_embed_norm", "k_dense_attn", "k_dense_attn2", "k_tree_rows", "k_tree_build",
       "k_ring_upload", "k_logit_tail", "k_gemm_kq2", "k_gemm_wg", "k_gemm_wg_tma", "k_gemm_wg6", "k_attn_prefill",
       "k_attn_dcl"]


def base_name(mangled):
    """k_mmt from _Z5k_mmtILi1ELi2EEv...: the Itanium length-prefixed name."""
    m = re.match(r"_Z(\d+)", mangled)
    return mangled[m.end():m.end() + int(m.group(1))] if m else mangled


def parse(text):
    """{mangled: (registers, stack frame, spill stores, spill loads)} from ptxas -v output."""
    out, cur, props = {}, None, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            cur, props = m.group(1), None
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur:
            props = tuple(int(g) for g in m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and cur and props is not None:
            out[cur] = (int(m.group(1)),) + props
            cur = None
    return out


def compile_one(nvcc, src, name, arch, flags, tmp):
    cmd = [nvcc, "-arch=" + arch, "-cubin", "-Xptxas", "-v", "-I", os.path.join(src, "..", "..", "..", "include"),
           "-I", os.path.join(src, "..", ".."), *flags, "-o", os.path.join(tmp, name + ".cubin"),
           os.path.join(src, name)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("ptxas_pins: %s failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stderr[-3000:]))
    return r.stderr + r.stdout


def usage_of(nvcc, src, flags):
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(len(FILES)) as ex:
        texts = list(ex.map(lambda f: compile_one(nvcc, src, f[0], f[1], flags, tmp), FILES))
    got = {}
    for t in texts:
        got.update(parse(t))
    return {k: v for k, v in got.items() if base_name(k) in HOT}


def nvcc_version(nvcc):
    """V13.0.88 from `nvcc --version` (the pins hold for one ptxas)."""
    r = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    m = re.search(r"\bV(\d+\.\d+\.\d+)", r.stdout)
    return "V" + m.group(1) if m else "unknown"


def pins_version(path):
    for line in open(path):
        m = re.match(r"#\s*nvcc:\s*(\S+)", line)
        if m:
            return m.group(1)
    return "unknown"


def read_pins(path):
    pins = {}
    for n, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) != 5:
            raise SystemExit("ptxas_pins: %s line %d: want NAME REGS STACK SPILL_ST SPILL_LD" % (path, n))
        pins[line[0]] = tuple(int(x) for x in line[1:])
    return pins


def write_pins(path, got, version):
    with open(path, "w") as f:
        f.write("# tests/cuda/ptxas_pins.py: ptxas -v of the hot kernels for sm_90 (cuda_gemm_wg.cu: sm_90a)\n"
                "# at the build's flags (registers, stack frame, spill store and load bytes). Rewrite them\n"
                "# (MUSER_PTXAS_PINS_UPDATE=1 ctest -R cuda_ptxas_pins) only after timing the change\n"
                "# on a GPU (docs/cuda.md \"Tests\").\n"
                "# nvcc: %s\n" % version)
        for k in sorted(got, key=lambda k: (base_name(k), k)):
            f.write("%s %d %d %d %d\n" % ((k,) + got[k]))


def compare(pins, got):
    """The differences, one message each (empty: none)."""
    what = ("registers", "bytes of stack frame", "bytes of spill stores", "bytes of spill loads")
    msgs = []
    for k in sorted(set(pins) | set(got)):
        if k not in got:
            msgs.append("%s: pinned, but no longer compiled" % k)
        elif k not in pins:
            msgs.append("%s: a new instance of a hot kernel, not pinned (%d registers)" % (k, got[k][0]))
        elif pins[k] != got[k]:
            d = ", ".join("%s %d -> %d" % (w, a, b) for w, a, b in zip(what, pins[k], got[k]) if a != b)
            msgs.append("%s: %s" % (k, d))
    return msgs


SAMPLE = """ptxas info    : Compiling entry function '_Z5k_mmtILi1ELi2EEv7mmt_setiiiPKaPKfPKsi' for 'sm_90'
ptxas info    : Function properties for _Z5k_mmtILi1ELi2EEv7mmt_setiiiPKaPKfPKsi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 560 bytes cmem[0]
ptxas info    : Compiling entry function '_Z8k_unusedv' for 'sm_90'
ptxas info    : Function properties for _Z8k_unusedv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, 352 bytes cmem[0]
ptxas info    : Compiling entry function '_Z10k_residualILb1ELi1EEvPf' for 'sm_90'
ptxas info    : Function properties for _Z10k_residualILb1ELi1EEvPf
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, 400 bytes cmem[0]
"""


def self_test():
    got = {k: v for k, v in parse(SAMPLE).items() if base_name(k) in HOT}
    assert got == {"_Z5k_mmtILi1ELi2EEv7mmt_setiiiPKaPKfPKsi": (128, 0, 0, 0),
                   "_Z10k_residualILb1ELi1EEvPf": (40, 8, 4, 4)}, got
    assert compare(dict(got), got) == []
    changed = dict(got)
    changed["_Z5k_mmtILi1ELi2EEv7mmt_setiiiPKaPKfPKsi"] = (96, 0, 0, 0)
    m = compare(changed, got)
    assert len(m) == 1 and "registers 96 -> 128" in m[0], m
    gone = dict(got)
    gone["_Z5k_mmtILi4ELi2EEv7mmt_setiiiPKaPKfPKsi"] = (128, 0, 0, 0)
    assert any("no longer compiled" in x for x in compare(gone, got))
    fewer = dict(got)
    del fewer["_Z10k_residualILb1ELi1EEvPf"]
    assert any("not pinned" in x for x in compare(fewer, got))
    spill = dict(got)
    spill["_Z10k_residualILb1ELi1EEvPf"] = (40, 0, 0, 0)
    m = compare(spill, got)
    assert len(m) == 1 and "stack frame 0 -> 8" in m[0] and "spill stores 0 -> 4" in m[0], m
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "pins.txt")
        write_pins(p, got, "V0.0.1")
        assert read_pins(p) == got and pins_version(p) == "V0.0.1"
    print("ptxas_pins self-test: ok")


def main(argv):
    if "--self-test" in argv:
        self_test()
        return 0
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    opts = argv[:argv.index("--")] if "--" in argv else argv
    here = os.path.dirname(os.path.abspath(__file__))
    nvcc, src, pins_path = "nvcc", None, os.path.join(here, "ptxas_pins.txt")
    update = os.environ.get("MUSER_PTXAS_PINS_UPDATE", "") not in ("", "0")
    i = 0
    while i < len(opts):
        if opts[i] in ("--nvcc", "--src", "--pins") and i + 1 < len(opts):
            if opts[i] == "--nvcc":
                nvcc = opts[i + 1]
            elif opts[i] == "--src":
                src = opts[i + 1]
            else:
                pins_path = opts[i + 1]
            i += 2
        elif opts[i] == "--update":
            update, i = True, i + 1
        else:
            raise SystemExit("ptxas_pins: unknown argument %r (see the file's docstring)" % opts[i])
    if src is None:
        src = os.path.join(here, "..", "..", "src", "backend", "cuda")
    got = usage_of(nvcc, src, flags)
    if not got:
        raise SystemExit("ptxas_pins: no hot kernel in the ptxas output (nvcc %s)" % nvcc)
    version = nvcc_version(nvcc)
    if update:
        write_pins(pins_path, got, version)
        print("ptxas_pins: wrote %d kernels to %s" % (len(got), pins_path))
        return 0
    msgs = compare(read_pins(pins_path), got)
    for m in msgs:
        print("ptxas_pins: " + m)
    if msgs and pins_version(pins_path) != version:
        print("ptxas_pins: the pins come from nvcc %s, this is nvcc %s: ptxas itself may allocate otherwise"
              % (pins_version(pins_path), version))
    if msgs:
        print("ptxas_pins: %d of the hot kernels compile otherwise than pinned in %s: time the change on a GPU "
              "(docs/cuda.md \"Tests\"), then rewrite the pins (MUSER_PTXAS_PINS_UPDATE=1 ctest -R '^cuda_ptxas_pins$')" % (len(msgs), pins_path))
        return 1
    print("ptxas_pins: %d hot kernels as pinned" % len(got))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
