#!/usr/bin/env bash
# Makes target/memres-gpu.tar.gz: the memres wheel, pytest's wheels, the
# Python tests, the README and gpu/run.sh, for a GPU machine with no Rust
# and no network:
#
#   tar xzf memres-gpu.tar.gz && bash memres-gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

out=target/memres-gpu
rm -rf "$out" target/wheels && mkdir -p "$out/wheels"
bash python/build.sh
cp target/wheels/memres-*.whl "$out/wheels/"
python3 -m pip download -q --only-binary=:all: -d "$out/wheels" pytest
cp -r python/tests "$out/tests"
rm -rf "$out/tests/__pycache__"
cp README.md python/gpu/run.sh "$out/"
tar czf target/memres-gpu.tar.gz -C target memres-gpu
echo "target/memres-gpu.tar.gz"
