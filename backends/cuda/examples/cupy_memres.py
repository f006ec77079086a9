"""CuPy on memres: every CuPy allocation goes through memres_alloc, and is freed
with memres_free when CuPy lets go of it.

    python3 cupy_memres.py path/to/libmemres.so [--stack 'stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))']

`use_memres(lib)` is the whole adapter: CuPy's `set_allocator` takes a
function from a size to a `MemoryPointer`; the memory is wrapped in
`UnownedMemory` whose owner frees it when the last reference goes.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memres_ctypes import Memres, MemresError, print_stats  # noqa: E402


class _Block:
    """Owns one memres block; frees it when CuPy drops the memory."""

    __slots__ = ("lib", "ptr", "size", "device", "stream")

    def __init__(self, lib, ptr, size, device, stream):
        self.lib, self.ptr, self.size, self.device, self.stream = lib, ptr, size, device, stream

    def __del__(self):
        try:
            self.lib.free(self.ptr, self.size, self.device, self.stream)
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def use_memres(lib):
    """Makes CuPy allocate device memory through memres."""
    import cupy

    def malloc(size):
        device = cupy.cuda.runtime.getDevice()
        stream = cupy.cuda.get_current_stream().ptr
        if size == 0:
            return cupy.cuda.MemoryPointer(cupy.cuda.memory.UnownedMemory(0, 0, None, device), 0)
        try:
            ptr = lib.alloc(size, device, stream)
        except MemresError as e:
            try:
                err = cupy.cuda.memory.OutOfMemoryError(size, 0, 0)
            except Exception:
                err = MemoryError(str(e))
            raise err from e
        owner = _Block(lib, ptr, size, device, stream)
        return cupy.cuda.MemoryPointer(cupy.cuda.memory.UnownedMemory(ptr, size, owner, device), 0)

    cupy.cuda.set_allocator(malloc)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("so", help="path of libmemres.so")
    p.add_argument("--stack", help="memres stack description (default: MEMRES_STACK or the library's default, stats(pool(cuda, per_stream=true, growth=32, granule=2MiB)))")
    args = p.parse_args()

    lib = Memres(args.so)
    if args.stack:
        lib.configure(args.stack)
    import cupy

    use_memres(lib)
    rs = cupy.random.RandomState(0)
    a = rs.standard_normal((2048, 2048), dtype=cupy.float32)
    b = rs.standard_normal((2048, 2048), dtype=cupy.float32)
    c = a @ b
    spectrum = cupy.fft.rfft(c, axis=1)
    total = float(cupy.abs(spectrum).sum())
    parts = [cupy.arange(1 + 313 * i, dtype=cupy.float64).sum() for i in range(300)]
    print(f"sum |rfft(a @ b)| = {total:.6e}; {len(parts)} arange sums, last {float(parts[-1]):.0f}")
    del a, b, c, spectrum, parts
    cupy.cuda.runtime.deviceSynchronize()

    device = cupy.cuda.runtime.getDevice()
    print_stats(lib, device)


if __name__ == "__main__":
    main()
