"""The current device: PyTorch's or CuPy's where one of them is in use,
else the one set with ``memres.set_device`` (0 at first)."""

import sys

_device = 0


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
    return _device


def device_id(device):
    """``device``, checked: a device number (an int from 0), else ValueError."""
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"memres: {device!r} is not a device id (an int from 0)")
    return device


def set_device(device):
    global _device
    _device = device_id(device)
