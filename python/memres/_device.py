"""The current device: PyTorch's or CuPy's where one of them is in use,
else the one this thread set with ``memres.set_device`` (0 at first), per
thread as CUDA's current device."""

import sys
import threading

from . import _native
from ._integer import integer

_local = threading.local()


def current_device():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            return cupy.cuda.runtime.getDevice()
        except Exception:
            pass
    return getattr(_local, "device", 0)


def device_id(device):
    """``device``, checked: a device number (an int from 0 to
    ``MAX_DEVICES - 1``, the devices memres serves, or an integer of another
    type that says its value, NumPy's, as RMM takes), as an int, else
    ValueError. Every ``device=`` goes through it: the native side takes a
    32-bit number, and one past that was an OverflowError
    (``set_device``'s, at every later call)."""
    limit = _native.sim.MAX_DEVICES
    number = integer(device)
    if number is not None and 0 <= number < limit:
        return number
    raise ValueError(f"memres: {device!r} is not a device id (an int from 0 to {limit - 1})")


def set_device(device):
    """Makes ``device`` the calling thread's current device (where neither
    PyTorch nor CuPy is in use); other threads keep theirs."""
    _local.device = device_id(device)
