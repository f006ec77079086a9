#!/usr/bin/env bash
# On the GPU machine (PyTorch and CuPy installed, no network): installs the
# carried wheel into a virtual environment that sees the system's packages,
# runs every Python test with the GPU required, and benches/viz's snapshot
# checks (PyTorch reading the snapshots), then trains the same network with
# PyTorch's allocator and with memres's and prints both. Exits with pytest's
# status, or failing that the snapshot checks'.
set -euo pipefail
cd "$(dirname "$0")"

# MEMRES_PYTHON: the interpreter whose packages (PyTorch, CuPy) the tests
# use, itself perhaps a virtual environment; the new one sees its packages.
py="${MEMRES_PYTHON:-python3}"
"$py" -m venv --system-site-packages venv
base=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
here=$(venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$base" > "$here/memres-base-packages.pth"
venv/bin/python -m pip install -q --no-index --find-links wheels memres pytest
status=0
MEMRES_REQUIRE_GPU=1 MEMRES_README="$PWD/README.md" venv/bin/python -m pytest -v -p no:cacheprovider tests || status=$?
echo "== snapshots as PyTorch reads them (benches/viz)"
MEMRES_REQUIRE_GPU=1 MEMRES="$PWD/bin/memres" venv/bin/python -m unittest discover -v -s benches/viz ||
  { [ "$status" != 0 ] || status=1; }

echo "== PyTorch training: native allocator vs memres (median step, peak device bytes)"
for a in native memres native memres; do
  venv/bin/python tests/gpu_train.py --allocator "$a" --steps 200 --width 4096 |
    venv/bin/python -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r["allocator"], "step_ms=%.3f" % r["step_ms"], "peak_bytes=%d" % r["peak_device_bytes"], "last_loss=%r" % r["losses"][-1])'
done
exit "$status"
