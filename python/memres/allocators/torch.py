"""memres as PyTorch's CUDA allocator, as RMM's ``rmm.allocators.torch``:

    from memres.allocators.torch import memres_torch_allocator
    torch.cuda.memory.change_current_allocator(memres_torch_allocator)

or in one call, ``memres.allocators.torch.use()`` (``DEFAULT_STACK``, the C
library's default, unless a resource is set) or ``use(stack=...)``, for a
training loop ``use(stack=TRAINING_STACK)`` with ``step()``. A device
PyTorch allocates on that has no resource gets ``DEFAULT_STACK``, as from
the C library.
Every tensor's memory comes from the current memres resource of its device
(``memres.set_current_device_resource``) through two C functions of the
CUDA native module; ``empty_cache()``, and ``torch.cuda.empty_cache()``
once memres is PyTorch's allocator, give back what the pools keep free, and
``step()`` at the top of each training iteration (or ``step_after(opt)``,
which calls it after each ``opt.step()``) lets a ``planned(...)`` stack lay
the steps out, and ``steps()`` says whether it did.
"""

from .. import _native, mr as _mr
from .._device import current_device, device_id as _device_id

try:
    from torch.cuda.memory import CUDAPluggableAllocator
except ImportError:  # PyTorch is not installed: the allocator is None, as in RMM
    CUDAPluggableAllocator = None


def _make():
    if CUDAPluggableAllocator is None:
        return None
    try:
        path = _native.cuda().__file__
    except Exception:
        return None
    try:
        allocator = CUDAPluggableAllocator(path, "memres_py_alloc", "memres_py_free")
    except (AttributeError, RuntimeError):
        # A PyTorch built without CUDA (no `_cuda_customAllocator`) where
        # the driver is installed: None, as RMM's, not a failed import.
        return None
    _reach_empty_cache(allocator, path)
    return allocator


def _reach_empty_cache(allocator, path):
    """Gives PyTorch the native module's ``memres_py_empty_cache`` as the
    allocator's reset function, which ``torch.cuda.empty_cache()`` calls
    (PyTorch's pluggable allocator does nothing there without one). A
    PyTorch without that hook keeps ``torch.cuda.empty_cache()`` a no-op;
    ``empty_cache()`` here still works."""
    import ctypes
    try:
        fn = ctypes.cast(ctypes.CDLL(path).memres_py_empty_cache, ctypes.c_void_p).value
        allocator.allocator().set_reset_fn(fn)
    except (AttributeError, OSError):
        pass


def _empty_caches():
    """What ``torch.cuda.empty_cache()`` runs through the reset function:
    ``release()`` of every device's current resource (those the C
    functions made included), once every stream of the device is done.
    A device whose release raises does not stop the others': the first
    exception is raised once every device was released, as the C
    library's ``memres_empty_cache`` reports the first error."""
    first = None
    for res in _mr._existing_all().values():
        try:
            res.release()
        except Exception as e:
            if first is None:
                first = e
    if first is not None:
        raise first


memres_torch_allocator = _make()


# What ``use()`` gives a device that has no resource yet, and the C
# functions a device PyTorch allocates on that has none: the C library's
# default stack (its DEFAULT_STACK; a pool per stream over cuMemAlloc,
# docs/cuda.md says why).
DEFAULT_STACK = "stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))"


# The stack that holds least on a training loop that calls ``step()``:
# each repeating step laid out in one region, and what is not laid out
# served by a virtual pool per stream that keeps freed granules mapped up
# to 1 % over the peak in use, and maps a new peak in large handles
# (docs/python.md, "Training loops: the recommended stack", with the runs).
TRAINING_STACK = "stats(planned(vmm(handle_granules=1, per_stream=true, slack=10, large_handles=true)))"


def use(stack=None, **reinitialize_kwargs):
    """Makes memres PyTorch's allocator: sets the resource of the current
    device (or of ``devices=``, one or several) from ``stack`` (or
    ``memres.reinitialize``'s keywords); with neither, keeps the resource
    of each such device that has one and gives the others
    ``DEFAULT_STACK``. Then changes PyTorch's allocator. A device PyTorch
    allocates on later that has no resource gets ``DEFAULT_STACK`` too
    (the C functions make it, and it is then the device's resource). Call
    it before the first CUDA tensor. Nothing changes when it fails. One
    step for other threads: a resource another thread sets meanwhile is
    kept (it is set before ``use`` looks) or replaced (after)."""
    import torch
    from .. import _device_list, _resources
    allocator = memres_torch_allocator or _make()
    if allocator is None:
        raise RuntimeError("memres: the PyTorch allocator needs PyTorch with CUDA and memres's CUDA side")
    devices = reinitialize_kwargs.pop("devices", None)
    devices = _device_list(current_device() if devices is None else devices)
    # The resources are made first and set only once PyTorch took the
    # allocator: it refuses once its own allocator is initialized (CUDA
    # was used), and then memres's resources stay as they were. One step
    # for other threads (the registry held): none sets a device's resource
    # between the look for one and the set of DEFAULT_STACK.
    with _mr._REGISTRY:
        if stack is not None or reinitialize_kwargs:
            made = _resources(stack=stack, devices=devices, **reinitialize_kwargs)
        else:
            made = _resources(stack=DEFAULT_STACK, devices=[d for d in devices if _mr._existing(d) is None])
        torch.cuda.memory.change_current_allocator(allocator)
        for device, res in made:
            _mr.set_per_device_resource(device, res)
    return allocator


def _resource_of(device):
    """The resource of ``device`` (the current device for None) if it has
    one, else None: ``step``, ``steps`` and ``empty_cache`` make none, so
    that a device PyTorch has not allocated on yet still gets
    ``DEFAULT_STACK`` from the C functions."""
    return _mr._existing(current_device() if device is None else device)


def step(device=None):
    """Marks the start of a training step for the ``planned(...)`` layers of
    ``device``'s resource, on PyTorch's current stream: call it at the top
    of each iteration with a stack that has such a layer, as
    ``TRAINING_STACK`` does.
    Returns how many such layers the resource has (0: it does nothing, as
    on a device that has no resource yet)."""
    import torch

    res = _resource_of(device)
    return 0 if res is None else res.step(torch.cuda.current_stream(device))


def step_after(optimizer=None, device=None):
    """Calls ``step(device)`` after every ``optimizer.step()``, so that a
    ``planned(...)`` stack lays out a loop whose code cannot be changed
    (a trainer library's): the step after an optimizer's step is the next
    iteration. With no optimizer, after the step of every optimizer;
    with several stepped per iteration, pass the one stepped last, else
    each iteration is several steps that differ and none is laid out.
    Returns PyTorch's handle: ``.remove()`` stops the calls."""
    def after_step(*_):
        step(device)

    if optimizer is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook
        return register_optimizer_step_post_hook(after_step)
    return optimizer.register_step_post_hook(after_step)


def steps(device=None):
    """What the ``planned(...)`` layers of ``device``'s resource have done
    (``DeviceMemoryResource.steps``): a training loop is laid out when
    ``followed`` grows with ``steps``; all 0 on a device that has no
    resource yet."""
    res = _resource_of(device)
    return dict.fromkeys(_mr._STEPS_FIELDS, 0) if res is None else res.steps()


def last_error(clear=False):
    """Why the last allocation or free PyTorch asked memres for failed, or
    None. PyTorch's ``CUDAPluggableAllocator`` does not check the pointer
    it gets: out of memory gives it NULL, which it makes a tensor of (no
    ``torch.cuda.OutOfMemoryError``), so check here after an allocation
    that may fail; a free that fails (a pointer memres did not hand out, a
    free the stack refused, whose block stays live) returns nothing to
    PyTorch either. ``clear=True`` forgets it. There is one for the
    process, not one per thread: the backward pass allocates on
    PyTorch's autograd threads, not on the thread that reads this."""
    return _native.cuda().last_error(clear)


def empty_cache(device=None):
    """Gives what the pools of ``device``'s resource keep free back to the
    device (``DeviceMemoryResource.release``): wholly free chunks (pools,
    fixed-size, binning and arena resources), mapped granules no block
    uses, a driver pool's reserve. Returns the bytes
    given back (0 on a device that has no resource yet).
    ``torch.cuda.empty_cache()`` does the same for every device's resource
    once memres is PyTorch's allocator.

    First, as ``torch.cuda.empty_cache()`` does, it gives back the blocks
    the C functions keep for the device (those of the simulated backend's
    module too): blocks a resource handed ``memres_py_alloc`` that it could
    not hand PyTorch (at an address live already, at address 0, of another
    size than asked) and that the resource then refused back. One refused
    again stays kept, and ``last_error()`` says why."""
    device = _device_id(current_device() if device is None else device)
    for module in (_native.sim, _native._cuda):
        if module is not None:
            module.give_back_c_kept(device)
    res = _resource_of(device)
    return 0 if res is None else res.release()
