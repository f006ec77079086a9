#!/usr/bin/env bash
# Makes target/memres-gpu.tar.gz: the memres wheel, pytest's wheels, the
# Python tests, the README and gpu/run.sh, and the snapshot checks of
# benches/viz with the `memres` tool and the trace they replay (PyTorch
# reads the snapshots there), for a GPU machine with no Rust and no network:
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
# benches/viz's tests find the trace from their folder, as in the repository.
cargo build --release -p memres-bench --bin memres
mkdir -p "$out/bin" "$out/benches/viz" "$out/benches/data"
cp "${CARGO_TARGET_DIR:-target}/release/memres" "$out/bin/"
strip "$out/bin/memres"  # its debug info is most of its size
cp benches/viz/test_viz.py benches/viz/check_snapshot.py "$out/benches/viz/"
cp benches/data/resnet_train.csv.gz "$out/benches/data/"
tar czf target/memres-gpu.tar.gz -C target memres-gpu
echo "target/memres-gpu.tar.gz"
