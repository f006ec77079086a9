#!/usr/bin/env bash
# Builds, lints, documents and tests memres-cuda and memres-cuda-capi (libmemres.so).
# Arguments go to `cargo test`.
#
# With a CUDA toolkit (or CUDA_LIBRARY_PATH) it links against that; without
# one it fetches the driver library with .ci/libcuda.sh. On a machine with no
# GPU every GPU test prints SKIPPED and passes having tested nothing; set
# MEMRES_REQUIRE_GPU=1 to make a missing GPU a failure instead.
set -euo pipefail
cd "$(dirname "$0")/../.."

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

cargo fmt -p memres-cuda -p memres-cuda-capi --check
cargo clippy -p memres-cuda -p memres-cuda-capi --all-targets -- -D warnings
# The Python package's CUDA side (memres._cuda); python/test.sh builds it.
cargo clippy -p memres-python --features cuda --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc -p memres-cuda -p memres-cuda-capi --no-deps
cargo test -p memres-cuda -p memres-cuda-capi "$@"
