#!/usr/bin/env bash
# Prints the shell exports that let the CUDA backend link on a machine with
# no GPU and no CUDA toolkit (a CI runner, a laptop):
#
#   eval "$(bash .ci/libcuda.sh)"
#
# `cust`'s build script wants a directory holding `lib64/libcuda.so`, named
# by CUDA_LIBRARY_PATH. On Debian the driver library ships in the non-free
# package `libcuda1`; this script fetches that package from the mirror the
# system's apt sources already name, unpacks the library into a cache
# directory (nothing is installed), and prints:
#
#   export CUDA_LIBRARY_PATH=<cache>
#   export LD_LIBRARY_PATH=<cache>/lib64:...
#
# With that library loaded and no GPU present, `cuInit` fails with
# CUDA_ERROR_NO_DEVICE and every GPU test reports itself skipped.
#
# The cache is the first argument, else $MEMRES_LIBCUDA_DIR, else
# ~/.cache/memres-libcuda. On systems other than Debian, point
# CUDA_LIBRARY_PATH at a directory with lib64/libcuda.so yourself.
set -euo pipefail

cache="${1:-${MEMRES_LIBCUDA_DIR:-$HOME/.cache/memres-libcuda}}"
lib="$cache/lib64"

if [ ! -e "$lib/libcuda.so" ]; then
  fail() { echo "libcuda.sh: $*" >&2; exit 1; }
  command -v apt-get >/dev/null || fail "apt-get not found (Debian only; set CUDA_LIBRARY_PATH by hand)"

  # The mirror: a deb822 source's URIs field, else a one-line `deb` source.
  mirror=""
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    mirror=$(awk '/^URIs:/ {print $2; exit}' "$f")
    [ -n "$mirror" ] && break
  done
  if [ -z "$mirror" ] && [ -r /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  fi
  [ -n "$mirror" ] || fail "no Debian mirror named in the apt sources"
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || fail "no VERSION_CODENAME in /etc/os-release"

  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch/lists/partial"
  echo "deb $mirror $codename non-free" >"$scratch/sources.list"
  # A private source list and package index: the system's apt state is untouched.
  apt_opts=(
    -o "Dir::Etc::sourcelist=$scratch/sources.list"
    -o "Dir::Etc::sourceparts=/dev/null"
    -o "Dir::State::Lists=$scratch/lists"
    -o "APT::Sandbox::User=$(id -un)"
  )
  apt-get -qq "${apt_opts[@]}" update >&2
  (cd "$scratch" && apt-get -qq "${apt_opts[@]}" download libcuda1 >&2)
  dpkg-deb -x "$scratch"/libcuda1_*.deb "$scratch/pkg"
  real=$(find "$scratch/pkg" -name 'libcuda.so.*.*' -type f | head -n 1)
  [ -n "$real" ] || fail "libcuda1 holds no libcuda.so.*"
  mkdir -p "$lib"
  cp "$real" "$lib/"
  ln -sf "$(basename "$real")" "$lib/libcuda.so.1"
  ln -sf libcuda.so.1 "$lib/libcuda.so"
fi

echo "export CUDA_LIBRARY_PATH=$cache"
echo "export LD_LIBRARY_PATH=$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
