# Sourced (`. .ci/cuda-env.sh`) by the scripts that link the CUDA backend:
# with a CUDA toolkit (or CUDA_LIBRARY_PATH) it does nothing, `cust` links
# against that; without one it fetches the driver library with
# .ci/libcuda.sh and exports where it is.
have_cuda() {
  [ -n "${CUDA_LIBRARY_PATH:-}" ] && return 0
  for d in /opt/cuda /usr/local/cuda /usr/local/cuda-*; do
    [ -e "$d/lib64/libcuda.so" ] || [ -e "$d/lib64/stubs/libcuda.so" ] && return 0
  done
  return 1
}
if ! have_cuda; then
  eval "$(bash .ci/libcuda.sh)"
fi
