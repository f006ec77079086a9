"""The two native modules: ``_memres`` (simulated device and host memory,
always there) and ``_cuda`` (the CUDA backend), loaded only when a CUDA
resource is first made, because it needs the driver library
(``libcuda.so.1``) to load at all."""

import atexit
import os

from . import _memres
from ._errors import CudaUnavailable

sim = _memres
_cuda = None
_cuda_error = None


@atexit.register
def _at_exit():
    """Before finalization: no memres call gives the GIL up any more, and
    those that did are waited for, so that no thread takes it back inside
    one (CPython ends such a thread mid-call, which aborted the process).
    Registered first, so it runs after every other exit handler."""
    sim.at_exit()
    if _cuda is not None:
        _cuda.at_exit()


def _after_fork_in_child():
    """The child of a fork has only the thread that forked, which was in no
    memres call: the calls the parent's other threads were in are not the
    child's to wait for at exit."""
    sim.after_fork_in_child()
    if _cuda is not None:
        _cuda.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def cuda():
    """The CUDA native module, or CudaUnavailable naming what is missing."""
    global _cuda, _cuda_error
    if _cuda is not None:
        return _cuda
    if _cuda_error is None:
        here = os.path.dirname(__file__)
        if not any(f.startswith("_cuda") for f in os.listdir(here)):
            _cuda_error = ("this memres wheel was built without its CUDA side "
                           "(memres/_cuda*.so); build it with python/build.sh")
        else:
            try:
                from . import _cuda as module
            except ImportError as e:
                if "libcuda" in str(e):
                    _cuda_error = (f"the CUDA side of memres cannot load: {e}. It needs the "
                                   "NVIDIA driver library libcuda.so.1 (installed with the GPU "
                                   "driver); the simulated device (memres.mr.SimulatedMemoryResource, "
                                   "HostMemoryResource) works without it")
                else:
                    # Not the driver: a module of another build (python/build.sh
                    # makes both sides of one wheel).
                    _cuda_error = (f"the CUDA side of memres cannot load: {e}. It is not "
                                   "this package's build of memres/_cuda*.so; rebuild the "
                                   "wheel with python/build.sh")
            else:
                # Each asks the other, without the GIL, whether its thread
                # is inside a call of the other's (see gil.rs).
                module.link_other(sim.running_a_call_capsule())
                sim.link_other(module.running_a_call_capsule())
                # A device whose resource is simulated has none for the
                # CUDA side's C functions (`mr.set_per_device_resource`):
                # marked with the registry held, so that no device is set
                # between the marks and `_cuda` (where a set marks it).
                from . import mr
                with mr._REGISTRY:
                    for device, res in mr._current.items():
                        if res._backend == "sim":
                            module.set_other_backend(device)
                    _cuda = module
                return _cuda
    raise CudaUnavailable(_cuda_error)


def backend(name):
    """The native module of backend ``name``: "cuda" or "sim"."""
    if name == "cuda":
        return cuda()
    if name == "sim":
        return sim
    raise ValueError(f"memres: backend {name!r}: \"cuda\" or \"sim\"")
