#!/usr/bin/env bash
# Builds, lints, documents and tests memres-cuda, memres-cuda-capi (libmemres.so)
# and the facade crate `memres` with its feature `cuda`.
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

crates=(-p memres-cuda -p memres-cuda-capi -p memres --features memres/cuda)
cargo fmt -p memres-cuda -p memres-cuda-capi -p memres --check
cargo clippy "${crates[@]}" --all-targets -- -D warnings
# Documented apart: the C library's lib is named `memres` too (libmemres.so).
RUSTDOCFLAGS="-D warnings" cargo doc -p memres-cuda -p memres-cuda-capi --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc -p memres --features cuda --no-deps
cargo test "${crates[@]}" "$@"
