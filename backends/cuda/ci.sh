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

. .ci/cuda-env.sh

crates=(-p memres-cuda -p memres-cuda-capi -p memres --features memres/cuda)
cargo fmt -p memres-cuda -p memres-cuda-capi -p memres --check
cargo clippy "${crates[@]}" --all-targets -- -D warnings
# The Python package's CUDA side (memres._cuda); python/test.sh builds it.
cargo clippy -p memres-python --features cuda --all-targets -- -D warnings
# Documented apart: the C library's lib is named `memres` too (libmemres.so).
RUSTDOCFLAGS="-D warnings" cargo doc -p memres-cuda -p memres-cuda-capi --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc -p memres-cuda -p memres-cuda-capi --no-deps --document-private-items
RUSTDOCFLAGS="-D warnings" cargo doc -p memres --features cuda --no-deps
cargo test "${crates[@]}" "$@"
