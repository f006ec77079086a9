#!/usr/bin/env bash
# Runs the `resources` test binary over and over in several modes, the
# modes interleaved run by run, and counts the runs that passed, hung (ran
# past 15 s) or ended otherwise: the loop behind the figures on its
# intermittent hang in docs/verification.md. Needs a GPU and, for the modes
# `late` and `raw`, a C compiler (no Rust); `raw` also the CUDA headers
# (CUDA_HOME, default /usr/local/cuda).
#
#   bash backends/cuda/examples/hang_loop.sh path/to/resources-binary [rounds] [seconds] [modes]
#
# Build the binary where Rust is:
#   cargo test --release --no-run -p memres-cuda --test resources
#
# rounds (default 100) and seconds (default 300) bound the loop; modes
# (default "par one"), separated by spaces:
#   par     libtest's threads (every test at once on a large host)
#   one     one test at a time (--test-threads=1)
#   two     two at a time (--test-threads=2)
#   eager   libtest's threads, every module loaded at start (CUDA_MODULE_LOADING=EAGER)
#   late    libtest's threads, each held back 2 s after its test returns (hang_late_exit.c)
#   device  the five tests of device memory and the driver's pools alone
#   host    the four tests of managed and pinned memory alone
#   four    the four tests that suffice: a pool's attributes, the default
#           pool, the legacy stream, a pool from another thread
#   raw     those four tests' driver calls without memres (hang_pools.c)
set -u
if [ $# -lt 1 ] || [ ! -x "$1" ]; then
  sed -n '2,25p' "$0"
  exit 2
fi
bin=$1; rounds=${2:-100}; seconds=${3:-300}; modes=${4:-"par one"}
here=$(cd "$(dirname "$0")" && pwd)
export MEMRES_REQUIRE_GPU=1
case " $modes " in
  *" late "*)
    late=$(mktemp -d)/late_exit.so
    gcc -shared -fPIC -O1 -o "$late" "$here/hang_late_exit.c" -ldl || exit 1;;
esac
case " $modes " in
  *" raw "*)
    raw=$(mktemp -d)/hang_pools
    cc -O1 -pthread -o "$raw" "$here/hang_pools.c" -I"${CUDA_HOME:-/usr/local/cuda}/include" \
      -L"${CUDA_HOME:-/usr/local/cuda}/lib64/stubs" -lcuda || exit 1;;
esac
declare -A ok hung other
for m in $modes; do ok[$m]=0; hung[$m]=0; other[$m]=0; done
start=$(date +%s)
for i in $(seq "$rounds"); do
  for m in $modes; do
    case $m in
      par) cmd=("$bin");;
      one) cmd=("$bin" --test-threads=1);;
      two) cmd=("$bin" --test-threads=2);;
      eager) cmd=(env CUDA_MODULE_LOADING=EAGER "$bin");;
      late) cmd=(env LD_PRELOAD="$late" "$bin");;
      device) cmd=("$bin" device_memory default_pool async_memory any_thread);;
      host) cmd=("$bin" managed pinned clones);;
      four) cmd=("$bin" --exact async_memory_round_trip_and_pool_attributes default_pool_view_leaves_the_pool_alive
                 async_memory_on_the_legacy_stream any_thread_without_setup_gets_the_primary_context_bound);;
      raw) cmd=("$raw");;
      *) echo "unknown mode $m"; exit 2;;
    esac
    timeout 15 "${cmd[@]}" > /dev/null 2>&1
    case $? in
      0) ok[$m]=$((ok[$m] + 1));;
      124) hung[$m]=$((hung[$m] + 1));;
      *) other[$m]=$((other[$m] + 1));;
    esac
  done
  if [ $(($(date +%s) - start)) -gt "$seconds" ]; then echo "stopped after $i rounds"; break; fi
done
for m in $modes; do echo "$m: passed ${ok[$m]}, hung ${hung[$m]}, other ${other[$m]}"; done
