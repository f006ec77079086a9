#!/usr/bin/env bash
# Builds the memres wheel, installs it into a fresh virtual environment
# (target/python-venv) with what python/requirements-dev.txt names, and runs
# the Python tests against the installed package. Without a GPU the GPU
# tests skip; MEMRES_REQUIRE_GPU=1 makes a missing GPU a failure.
# Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q -r python/requirements-dev.txt
PATH="$PWD/$venv/bin:$PATH" bash python/build.sh
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps target/wheels/memres-*.whl
# From the tests' folder, so that `import memres` is the installed wheel.
cd python/tests
exec "../../$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
