#!/usr/bin/env bash
# Build the CUDA binaries on this machine (nvcc compiles sm_90 without a GPU) and pack them
# for a device call that builds nothing (tests/cuda/device.sh PREBUILT=DIR, docs/cuda.md
# "Short device calls"):
#   tests/cuda/pack.sh [DIR]   (default devbin, git-ignored; BUILD default build-cuda)
# writes DIR/{muser,test_cuda_backend,test_gen,test_engine}.xz, stripped, about 5 MB each.
# The device lacks some of their libraries: carry the .deb files too (DEBS, docs/cuda.md "Tests").
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-devbin}
BUILD=${BUILD:-$SRC/build-cuda}
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DMUSER_CUDA=ON >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target muser test_cuda_backend test_gen test_engine >/dev/null
mkdir -p "$SRC/$DIR"
rm -f "$SRC/$DIR"/*.xz
for b in muser test_cuda_backend test_gen test_engine; do
    strip -o "$BUILD/$b.stripped" "$BUILD/$b"
    xz -T0 -6 -c "$BUILD/$b.stripped" >"$SRC/$DIR/$b.xz"
    rm -f "$BUILD/$b.stripped"
done
ls -l "$SRC/$DIR"
echo "git $(git -C "$SRC" rev-parse --short HEAD)$(git -C "$SRC" diff --quiet HEAD || echo ' (with uncommitted changes)')"
