#!/usr/bin/env bash
# Runs every check of memres as the allocator of PyTorch and CuPy on a
# machine with a GPU, PyTorch and CuPy (no Rust needed), and prints a summary.
#
#   bash backends/cuda/examples/gpu_check.sh path/to/libmemres.so [out-dir]
#
# Build the library where Rust is:
#   cargo build --release -p memres-cuda-capi   # target/release/libmemres.so
#
# out-dir (default /tmp/memres-gpu-check) receives each check's log, the
# JSON results and the RMM-format trace of the logged PyTorch run
# (torch.csv). Exit status 0 when every check passed.
#
# The two-stream check frees a tensor on one stream with a kernel still to
# write it and allocates on another, with PyTorch's allocator, the former
# stream-agnostic default (which must corrupt: else the check proves
# nothing), the library's default and the recommended training stack
# (which must not); with
# compute-sanitizer on the PATH it also runs the default under memcheck's
# stream-ordered race tracking.
#
# The training check runs PyTorch on each memres stack of $TRAIN_STACKS
# (separated by `;`), each against the same two native runs, and prints one
# SUMMARY line per stack. By default: the C library's default stack, and
# a pool per stream over the driver's stream-ordered pool (`async`).
set -u
if [ $# -lt 1 ] || [ ! -f "$1" ]; then
  echo "usage: $0 path/to/libmemres.so [out-dir]" >&2
  exit 2
fi
so=$(realpath "$1")
out=$(realpath -m "${2:-/tmp/memres-gpu-check}")
here=$(dirname "$(realpath "$0")")
py=${PYTHON:-python3}
train_stacks=${TRAIN_STACKS:-"stats(pool(cuda, per_stream=true, growth=32, granule=2MiB));stats(pool(async, per_stream=true))"}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

echo "library: $so"
nm -D --defined-only "$so" 2>/dev/null | awk '$3 ~ /^memres_/ {print "  exports " $3}'
"$py" -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__, "gpu", torch.cuda.get_device_name())' \
  || { echo "PyTorch and CuPy with a GPU are needed" >&2; exit 2; }

names=()
results=()
check() {
  local name=$1
  shift
  echo
  echo "== $name: $*"
  if "$@" >"$out/$name.log" 2>&1; then
    results+=("PASS")
  else
    results+=("FAIL (exit $?)")
    tail -n 40 "$out/$name.log"
  fi
  names+=("$name")
  grep -E '^(SUMMARY [a-z]|memres stack|  )' "$out/$name.log" | grep -v '^SUMMARY {' | head -n 8
}

check pytorch_example "$py" "$here/pytorch_memres.py" "$so"
check cupy_example "$py" "$here/cupy_memres.py" "$so"
stack_args=()
IFS=';' read -ra stacks <<<"$train_stacks"
for s in "${stacks[@]}"; do stack_args+=(--stack "$s"); done
check train_check "$py" "$here/train_check.py" --so "$so" "${stack_args[@]}" --log "$out/torch.csv" --json "$out/train_check.json"
check cupy_check "$py" "$here/cupy_check.py" --so "$so" --json "$out/cupy_check.json"
check two_stream_check "$py" "$here/two_stream_check.py" --so "$so" --json "$out/two_stream_check.json" \
  --ordered 'stats(planned(vmm(handle_granules=1, per_stream=true, slack=10, large_handles=true)))'
if command -v compute-sanitizer >/dev/null; then
  check two_stream_memcheck compute-sanitizer --tool memcheck --track-stream-ordered-races all --error-exitcode 1 \
    "$py" "$here/two_stream_check.py" --worker memres --so "$so" --rounds 1 --sleep-ms 2
fi

echo
echo "== summary"
status=0
for i in "${!names[@]}"; do
  printf '%-16s %s\n' "${names[$i]}" "${results[$i]}"
  [ "${results[$i]}" = PASS ] || status=1
done
[ -f "$out/torch.csv" ] && echo "trace: $out/torch.csv ($(wc -l <"$out/torch.csv") lines)"
echo "logs and JSON: $out"
exit $status
