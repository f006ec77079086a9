#!/usr/bin/env bash
# Builds the memres wheel into target/wheels/: the CUDA side
# (memres/_cuda.abi3.so, the crate with feature `cuda`, linked against the
# driver library, or against .ci/libcuda.sh's copy where no CUDA is
# installed), then the wheel with maturin, which adds memres._memres (no
# CUDA). Arguments go to `maturin build` (default: --release).
set -euo pipefail
cd "$(dirname "$0")/.."

have_cuda() {
  [ -n "${CUDA_LIBRARY_PATH:-}" ] && return 0
  for d in /opt/cuda /usr/local/cuda /usr/local/cuda-*; do
    [ -e "$d/lib64/libcuda.so" ] || [ -e "$d/lib64/stubs/libcuda.so" ] && return 0
  done
  return 1
}
if ! have_cuda; then
  eval "$(bash .ci/libcuda.sh)"
fi

profile=release
cargo build --release -p memres-python --features cuda --lib
cp "target/$profile/libmemres_native.so" python/memres/_cuda.abi3.so
maturin build --manifest-path python/Cargo.toml --out target/wheels "${@:---release}"
