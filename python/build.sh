#!/usr/bin/env bash
# Builds the memres wheel into target/wheels/: the CUDA side
# (memres/_cuda.abi3.so, the crate with feature `cuda`, linked against the
# driver library, or against .ci/libcuda.sh's copy where no CUDA is
# installed), then the wheel with maturin, which adds memres._memres (no
# CUDA). Arguments go to `maturin build` (default: --release).
set -euo pipefail
cd "$(dirname "$0")/.."

. .ci/cuda-env.sh

cargo build --release -p memres-python --features cuda --lib
# From where cargo put it: with CARGO_TARGET_DIR (or a configured
# target-dir) target/release holds another build's library, or none.
target_dir=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
cp "$target_dir/release/libmemres_native.so" python/memres/_cuda.abi3.so
maturin build --manifest-path python/Cargo.toml --out target/wheels "${@:---release}"
