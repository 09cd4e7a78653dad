#!/usr/bin/env bash
# The SASS of the CUDA kernels as the build compiles them, without a GPU and without CUDA 13's
# disassembler (the toolkit here has nvcc and ptxas but neither cuobjdump nor nvdisasm):
#   tests/cuda/sass.sh FILE.cu                 instructions per kernel (static count), sorted by name
#   tests/cuda/sass.sh FILE.cu REGEX [OUT]     the SASS of the kernels whose mangled name matches REGEX
#                                              (to OUT, default stdout)
# FILE.cu is compiled to a cubin with the build's flags (-O2, MUSER_CUDA_EXACT; sm_90, cuda_gemm_wg.cu sm_90a). nvcc 13 writes
# the cubin's ELF header in the encoding CUDA 12.8 introduced (OS/ABI 0x41, ABI version 8, the
# architecture in bits 8-15 of e_flags); the disassembler of Debian's nvidia-cuda-toolkit 11.8 (bookworm
# non-free) reads the same sections once the header is set back to the old encoding (OS/ABI 0x33, ABI
# version 7, e_flags 0x5a055a: sm_90, virtual sm_90, 64-bit, unified textures), which this does on a
# copy. What it shows is a guide (docs/cuda.md "Tests"): which loads a loop issues ahead, where a store
# holds the next loads back, which values spill; not time.
# NVDISASM: the disassembler (default: found on PATH, else in $CACHE, else fetched there with
# `apt-get download nvidia-cuda-toolkit` when apt knows bookworm's non-free component).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,6p' "$0" >&2; exit 2; }
FILE=$1
REGEX=${2:-}
OUT=${3:-/dev/stdout}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
CACHE=${CACHE:-$HOME/.cache/muser-nvdisasm}
arch=sm_90
case "$FILE" in *cuda_gemm_wg.cu) arch=sm_90a ;; esac

nvdisasm=${NVDISASM:-$(command -v nvdisasm || true)}
if [ -z "$nvdisasm" ]; then
    nvdisasm=$CACHE/usr/bin/nvdisasm
    if [ ! -x "$nvdisasm" ]; then
        mkdir -p "$CACHE"
        if ! (cd "$CACHE" && apt-get download nvidia-cuda-toolkit >/dev/null 2>&1); then
            echo "sass.sh: no nvdisasm: set NVDISASM, or let apt see Debian bookworm's non-free component" >&2
            echo "  (a deb822 entry with Components: non-free) and rerun; it fetches nvidia-cuda-toolkit 11.8 into $CACHE" >&2
            exit 1
        fi
        dpkg -x "$CACHE"/nvidia-cuda-toolkit_*.deb "$CACHE"
        rm -f "$CACHE"/nvidia-cuda-toolkit_*.deb
    fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the build's exactness flags (CMakeLists.txt's MUSER_CUDA_EXACT: no contraction into FMA, IEEE division and
# square root, no flush to zero), read from there so that the listing is the build's code
exact=$(sed -n 's/^ *set(MUSER_CUDA_EXACT "\([^"]*\)").*/\1/p' "$SRC/CMakeLists.txt" | tr ';' ' ')
[ -n "$exact" ] || { echo "sass.sh: MUSER_CUDA_EXACT not found in CMakeLists.txt" >&2; exit 1; }
# shellcheck disable=SC2086
"$NVCC" -O2 -DNDEBUG -DMUSER_HAVE_CUDA $exact -arch=$arch -cubin -I"$SRC/include" -I"$SRC/src" -o "$tmp/k.cubin" "$FILE"
[ -s "$tmp/k.cubin" ] || { echo "sass.sh: nvcc wrote no cubin for $FILE (not a .cu file?)" >&2; exit 1; }
python3 - "$tmp/k.cubin" <<'PY'
import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
if b[:4] != b"\x7fELF" or b[4] != 2:
    sys.exit("sass.sh: %s is not a 64-bit ELF file" % p)
if b[7] == 0x41:  # the new encoding: set the old one (see the header of this script)
    sm = (struct.unpack_from("<I", b, 0x30)[0] >> 8) & 0xFF
    b[7], b[8] = 0x33, 7
    struct.pack_into("<I", b, 0x30, sm | 0x500 | (sm << 16))
open(p, "wb").write(b)
PY
"$nvdisasm" -c "$tmp/k.cubin" >"$tmp/k.sass"
if [ -z "$REGEX" ]; then
    awk '/^\/\/-+ \.text\./ { name = $2; sub(/^\.text\./, "", name) }
         /^ *\/\*[0-9a-f]+\*\/ / { n[name]++ }
         END { for (k in n) print n[k], k }' "$tmp/k.sass" | sort -k2 | (c++filt 2>/dev/null || cat)
else
    awk -v re="$REGEX" '/^\/\/-+ \.text\./ { name = $2; sub(/^\.text\./, "", name); on = name ~ re }
                        on' "$tmp/k.sass" >"$OUT"
fi
