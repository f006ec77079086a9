"""memres: a GPU memory manager written in Rust, with RMM's Python API.

``import memres`` works without a GPU and without the CUDA driver: the
simulated device and host memory (``memres.mr.SimulatedMemoryResource``,
``HostMemoryResource``) need neither, and the CUDA side loads only when a
CUDA resource is first made. See docs/python.md in the repository for
RMM's names beside memres's.
"""

from . import _native
from ._buffer import DeviceBuffer
from ._device import current_device, device_id as _device_id, set_device
from ._errors import CudaUnavailable, InvalidArgument, MemresError, OutOfMemory, RMMError
from ._stream import (CudaStreamFlags, CudaStreamPool, DEFAULT_STREAM, LEGACY_DEFAULT_STREAM,
                      PER_THREAD_DEFAULT_STREAM, Stream)
from . import logger, mr, snapshot, statistics
from .logger import (flush_logger, get_flush_level, get_logging_level, level_enum, set_flush_level,
                     set_logging_level, should_log)
from .mr import (
    disable_logging,
    enable_logging,
    get_current_device_resource,
    get_log_filenames,
    get_per_device_resource,
    is_initialized,
    set_current_device_resource,
    set_per_device_resource,
)

__version__ = "0.1.0"
# The commit the package was built from ("" outside a git checkout), as RMM's.
__git_commit__ = _native.sim.GIT_COMMIT

_cuda_ok = None


def cuda_available():
    """Whether the CUDA side loads and sees a device."""
    global _cuda_ok
    if _cuda_ok is None:
        try:
            _native.cuda().NativeResource.build("cuda", [], 0)
            _cuda_ok = True
        except (MemresError, ValueError):
            _cuda_ok = False
    return _cuda_ok


# The resources of the simulated backend that a stack names (its leaves,
# and the virtual pool over a simulated space): a stack with one is built there.
_SIM_NAMES = frozenset({"sim", "host", "vpool"})

# `(func, args, kwargs)` run before each `reinitialize`, last registered first.
_reinitialize_hooks = []


def register_reinitialize_hook(func, *args, **kwargs):
    """Has ``reinitialize`` call ``func(*args, **kwargs)`` first (to free
    what holds memory of the resources it replaces), as RMM's: the hooks
    run in the reverse order of their registration. Returns ``func``."""
    _reinitialize_hooks.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func):
    """Removes every registration of ``func``."""
    _reinitialize_hooks[:] = [h for h in _reinitialize_hooks if h[0] != func]


def reinitialize(pool_allocator=False, managed_memory=False, initial_pool_size=None,
                 maximum_pool_size=None, devices=0, logging=False, log_file_name=None,
                 stack=None):
    """Sets the resource of each of ``devices``, as RMM's
    ``rmm.reinitialize``: memory from the device (managed memory with
    ``managed_memory``), under a pool with ``pool_allocator``, logged with
    ``logging`` (to ``log_file_name``, else ``$MEMRES_LOG_FILE``, each
    device to its own file, ``x.dev1.csv`` for device 1 of ``x.csv``).
    ``stack`` names any stack instead, such as ``"stats(pool(async))"``.
    Without CUDA the device is host memory. As RMM's, the pool sizes are
    ignored without ``pool_allocator``, ``devices=None`` is device 0, and
    every other device's resource is forgotten (its default is made on
    next use). A call refused for want of memory lets every device's
    resource go and tries again, as RMM's clears them before it makes the
    new ones: a pool of the same size as the one it replaces fits. So does
    a call that logs to a file that a resource it replaces logs to.
    The hooks of ``register_reinitialize_hook`` run first, once the
    arguments are checked: a call refused for them runs none."""
    devices = _checked(pool_allocator, managed_memory, initial_pool_size, maximum_pool_size, devices, stack)
    # Over the hooks registered when it began, as RMM's: a hook that
    # unregisters another neither skips one nor runs one twice.
    for func, args, kwargs in reversed(list(_reinitialize_hooks)):
        func(*args, **kwargs)
    keywords = (pool_allocator, managed_memory, initial_pool_size, maximum_pool_size, devices, logging,
                log_file_name, stack)
    if logging:
        # Two logs of one process never write one file: a resource being
        # replaced whose log writes a file a new one is to write goes first,
        # as RMM's clears every device's resource before it makes the new
        # ones (which then both write the file).
        files = {mr._log_file(log_file_name, device) for device in devices}
        if files.intersection(mr.get_log_filenames().values()):
            _let_every_resource_go()
    try:
        made = _resources(*keywords)
    except OutOfMemory:
        # Out of the handler: its traceback holds what the attempt made.
        made = None
    if made is None:
        # The resources being replaced may hold what the new ones need
        # (a pool's initial size, twice): as RMM's, which clears every
        # device's resource before it makes the new ones, they go first,
        # their memory with them unless something else holds them, and the
        # new ones are made again. A failure now leaves every device its
        # default, as RMM's.
        _let_every_resource_go()
        made = _resources(*keywords)
    # Only once every device's resource could be made: a failure changes
    # nothing. One step for other threads.
    with mr._REGISTRY:
        replaced = [set_per_device_resource(device, res) for device, res in made]
        # As RMM's, which clears every device's resource first: the others
        # get their default on next use.
        replaced += mr._forget_all(but=[device for device, _ in made])
    # Dropped once the registry is let go: the drop of a pool over a
    # CallbackMemoryResource waits for that resource's lock, whose holder
    # may be in a callback that waits for the registry (the two hung).
    del replaced


def _let_every_resource_go():
    """Forgets every device's resource, as RMM's ``reinitialize`` does
    first: each goes, its memory and its log's file with it, unless
    something else holds it."""
    with mr._REGISTRY:
        forgotten = mr._forget_all()
    # Dropped once the registry is let go, as in ``reinitialize``.
    del forgotten


def _device_list(devices):
    """``devices`` (one device, or several; None is device 0, as RMM's
    ``reinitialize`` takes it) as a list of device ids, each once."""
    if devices is None:
        return [0]
    if isinstance(devices, str) or not hasattr(devices, "__iter__"):
        devices = [devices]
    return list(dict.fromkeys(_device_id(d) for d in devices))


def _checked(pool_allocator, managed_memory, initial_pool_size, maximum_pool_size, devices, stack):
    """The device list of ``reinitialize``'s arguments, once they are
    checked: the devices, stack= against RMM's keywords, the stack's text
    (that it parses)."""
    devices = _device_list(devices)
    if stack is not None and (pool_allocator or managed_memory or initial_pool_size is not None
                              or maximum_pool_size is not None):
        raise ValueError("memres: reinitialize takes stack= or RMM's keywords, not both")
    if stack is not None:
        _native.sim.stack_names(mr._stack(stack))
    return devices


def _resources(pool_allocator=False, managed_memory=False, initial_pool_size=None,
               maximum_pool_size=None, devices=0, logging=False, log_file_name=None, stack=None):
    """``(device, resource)`` for each device, as ``reinitialize`` makes
    them, setting nothing."""
    devices = _checked(pool_allocator, managed_memory, initial_pool_size, maximum_pool_size, devices, stack)
    made = []
    for device in devices:
        if stack is not None:
            # From the parsed stack: the text's words matched a log's path too.
            backend = "sim" if _SIM_NAMES.intersection(_native.sim.stack_names(stack)) else "cuda"
            res = mr.StackMemoryResource(stack, backend=backend, device=device)
        else:
            if managed_memory:
                res = mr.ManagedMemoryResource(device=device)
            elif cuda_available():
                res = mr.CudaMemoryResource(device=device)
            else:
                res = mr.HostMemoryResource(device=device)
            if pool_allocator:
                res = mr.PoolMemoryResource(res, initial_pool_size=initial_pool_size,
                                            maximum_pool_size=maximum_pool_size)
        if logging:
            res = mr.LoggingResourceAdaptor(res, log_file_name=log_file_name)
        made.append((device, res))
    return made


__all__ = [
    "DEFAULT_STREAM", "LEGACY_DEFAULT_STREAM", "PER_THREAD_DEFAULT_STREAM", "CudaStreamFlags", "CudaStreamPool",
    "CudaUnavailable", "DeviceBuffer",
    "InvalidArgument", "MemresError", "OutOfMemory", "RMMError", "Stream",
    "cuda_available", "current_device", "disable_logging", "enable_logging", "flush_logger",
    "get_flush_level", "get_logging_level", "level_enum", "logger", "set_flush_level", "set_logging_level",
    "should_log",
    "get_current_device_resource", "get_log_filenames", "get_per_device_resource", "is_initialized",
    "mr", "register_reinitialize_hook", "reinitialize", "set_current_device_resource", "set_device",
    "set_per_device_resource", "snapshot", "statistics", "unregister_reinitialize_hook",
]
