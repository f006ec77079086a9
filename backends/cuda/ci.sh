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

. .ci/cuda-env.sh

cargo fmt -p memres-cuda -p memres-cuda-capi --check
cargo clippy -p memres-cuda -p memres-cuda-capi --all-targets -- -D warnings
# The Python package's CUDA side (memres._cuda); python/test.sh builds it.
cargo clippy -p memres-python --features cuda --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc -p memres-cuda -p memres-cuda-capi --no-deps
cargo test -p memres-cuda -p memres-cuda-capi "$@"
