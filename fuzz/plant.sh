#!/usr/bin/env bash
# Proof that the fuzz oracles bite: builds a fuzz target with a known bug
# planted in memres-core (`--cfg memres_plant="BUG"`), runs it from an empty
# corpus for up to 60 seconds, and prints how long it took to be caught.
#
#   fuzz/plant.sh skip_coalesce      # free does not merge with the next range
#   fuzz/plant.sh split_off_by_one   # the tail of a split starts one granule early
#   fuzz/plant.sh missing_wait       # stream layer: reuse across streams without the event wait
#   fuzz/plant.sh tally_frees_size   # binning: a counted free takes the size off, not the footprint
#   fuzz/plant.sh forget_checked_free # tracking: a block checked is forgotten before the upstream frees it
#
# An optional second argument names the target (default: the one the bug is
# in). With MEMRES_FUZZ_ORACLE=model in the environment the resources' own
# invariant checkers are skipped: only the model and LiveBlocks judge.
# Exit status 0 if the bug was caught, 1 if not.
set -u
bug=${1:?usage: fuzz/plant.sh BUG [TARGET]}
case $bug in
  skip_coalesce | split_off_by_one) target=${2:-index} ;;
  missing_wait) target=${2:-stream} ;;
  tally_frees_size) target=${2:-binning_counted} ;;
  forget_checked_free) target=${2:-device_stack} ;;
  *) echo "unknown bug $bug (skip_coalesce, split_off_by_one, missing_wait, tally_frees_size, forget_checked_free)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.." || exit 2
# A build of its own, so that the clean fuzz build stays as it is.
export CARGO_TARGET_DIR=${PLANT_TARGET_DIR:-$PWD/target/plant-$bug}
export RUSTFLAGS="${RUSTFLAGS:-} --cfg memres_plant=\"$bug\""
cargo +nightly fuzz build -s none --no-trace-compares "$target" || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus"
start=$(date +%s.%N)
cargo +nightly fuzz run -s none --no-trace-compares "$target" "$work/corpus" -- \
  -max_total_time=60 -artifact_prefix="$work/" -print_final_stats=1 >"$work/log" 2>&1
status=$?
end=$(date +%s.%N)
secs=$(printf "%.2f" "$(echo "$end - $start" | bc)")
runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$')
if [ $status -ne 0 ] && grep -q 'fuzz oracle\|panicked' "$work/log"; then
  echo "plant $bug: caught by target $target after ${secs} s (${runs:-?} executions):"
  grep -m1 -A1 'fuzz oracle\|panicked' "$work/log"
  exit 0
fi
echo "plant $bug: NOT caught by target $target in ${secs} s (${runs:-?} executions; status $status)"
tail -5 "$work/log"
exit 1
