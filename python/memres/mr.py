"""Memory resources, as RMM's ``rmm.mr``: every class is a stack of the
Rust side over the objects it is given (an adaptor wraps the very object
passed as its upstream), with ``allocate(nbytes, stream=None)`` and
``deallocate(ptr, nbytes, stream=None)``. A ``stream`` is None (the
default stream), a ``memres.Stream`` or a framework's stream object; a bare
int is a ``TypeError`` (``memres.Stream.from_handle`` wraps a raw handle).

Leaves: CudaMemoryResource, CudaAsyncMemoryResource,
CudaAsyncViewMemoryResource, ManagedMemoryResource, PinnedHostMemoryResource,
VirtualMemoryResource (CUDA); SimulatedMemoryResource, HostMemoryResource (no
GPU needed); CallbackMemoryResource. Algorithms: PoolMemoryResource,
ArenaMemoryResource, BinningMemoryResource, FixedSizeMemoryResource.
Adaptors: StatisticsResourceAdaptor, TrackingResourceAdaptor,
LoggingResourceAdaptor, LimitingResourceAdaptor,
FailureCallbackResourceAdaptor, PrefetchResourceAdaptor (CUDA).
StackMemoryResource builds any stack string.
"""

import atexit
import fractions
import gc
import os
import re
import sys
import threading
import types
import weakref

from . import _native
from ._device import current_device, device_id as _device_id
from ._errors import CudaUnavailable, InvalidArgument
from ._integer import integer
from ._stream import Stream, as_handle

# Matched whole (`fullmatch`): `$` also matches before a final newline.
_WORD = re.compile(r"[^,()=\s]+")
# The figures of `DeviceMemoryResource.steps`, in the order the native side gives them.
_STEPS_FIELDS = ("steps", "followed", "plans", "planned_allocations", "region", "carry_region")

# Every resource built, so that the buffers of their logs are written out
# when the interpreter exits: a resource still current then (or held by a
# module) is never dropped, and its log would lose its last lines.
_BUILT = weakref.WeakSet()


@atexit.register
def _flush_logs_at_exit():
    for r in list(_BUILT):
        try:
            # Rows logged after this (PyTorch's frees at finalization) are
            # then written at once.
            r._native.flush(write_through=True)
        except Exception as e:  # noqa: BLE001 (at exit: say it, do not raise)
            print(f"memres: at exit: {e}", file=sys.stderr)


# What `_lock_before_fork` locked, let go of after the fork in both
# processes, and whether the collector ran before it.
_LOCKED_AT_FORK = []
_COLLECTING_AT_FORK = []


def _lock_before_fork():
    """Keeps what the package locks process-wide locked across ``os.fork``:
    the registry of devices' resources, every built resource's log (written
    out first), and the table of live host allocations. A child that
    inherited one held by another thread of the parent would wait for it
    for ever (its first ``get_current_device_resource()``, its first
    ``HostMemoryResource`` allocation), and its exit would write the rows
    buffered at the fork a second time. The registry first: a thread that
    holds it may drop a resource, which flushes its log. The collector
    waits until after the fork: a buffer it freed in between (an
    allocation of this code, or of a hook that runs after it, sets it off)
    would wait for ever for the host table this thread holds."""
    _COLLECTING_AT_FORK.append(gc.isenabled())
    gc.disable()
    _REGISTRY.acquire()
    natives = [r._native for r in list(_BUILT)]
    for module in (_native.sim, _native._cuda):
        if module is not None:
            natives_of = [n for n in natives if isinstance(n, module.NativeResource)]
            _LOCKED_AT_FORK.append(module.lock_for_fork(natives_of))


def _unlock_after_fork():
    _LOCKED_AT_FORK.clear()
    _REGISTRY.release()
    if _COLLECTING_AT_FORK.pop():
        gc.enable()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_lock_before_fork, after_in_parent=_unlock_after_fork,
                        after_in_child=_unlock_after_fork)


def _word(value, what):
    text = str(value)
    if not _WORD.fullmatch(text):
        raise ValueError(f"memres: {what} {text!r} may not hold spaces, commas, '=' or parentheses")
    return text


def _size(value, what, align=None):
    """A size argument of a stack (an int, or a string such as ``"2 GiB"``
    or ``"500MB"``, as RMM's ``parse_bytes`` reads it), as its text;
    ``align="up"`` or ``"down"`` rounds it to a multiple of 256, as RMM
    does where its resource needs one."""
    if isinstance(value, str):
        value = _parse_bytes(value, what)
    n = _nbytes(value, what)
    if align == "up":
        n = min(-(-n // 256) * 256, (1 << 64) - 256)
    elif align == "down":
        n = n // 256 * 256
    return str(n)


# The units RMM's sizes take, case aside: bytes, decimal (kb..pb) and
# binary (kib..pib) prefixes, each ending in "b".
_UNITS = {"": 1, "b": 1, **{prefix + middle + "b": base ** power
                           for power, prefix in enumerate("kmgtp", start=1)
                           for middle, base in (("", 1000), ("i", 1024))}}
# What RMM's parse_bytes reads: digits, perhaps a fraction, spaces or tabs,
# perhaps a unit; nothing before or after but one newline at the end, which
# the `$` ending its pattern lets through.
_BYTES = re.compile(r"([0-9]+(?:\.[0-9]*)?)[\t ]*([a-z]*)\n?", re.IGNORECASE)


def _parse_bytes(text, what):
    """``"1.5 GiB"`` as 1610612736, as RMM's ``parse_bytes`` reads sizes
    (but exactly: not through a float, which loses a large size's last
    digits); ValueError naming ``what`` for text that is no size,
    OverflowError for a size of 2**64 bytes or more."""
    m = _BYTES.fullmatch(text)
    unit = m and _UNITS.get(m.group(2).lower())
    if unit is None:
        raise ValueError(f"memres: {what}: Could not parse {text!r} as a byte specification "
                         "(such as 1000000, '500MB' or '2 GiB')")
    # More than 20 digits is past 2**64 whatever the unit, and more than
    # 4300 are past what `int` converts (its ValueError named no argument):
    # the leading zeros go, and the fraction's digits past the 100th, which
    # change no whole byte (a unit's fractions, k / 2**n or k / 10**n with
    # n <= 50, end before them, so a fraction cut there stays on the same
    # side of each).
    whole, _, fraction = m.group(1).partition(".")
    whole, fraction = whole.lstrip("0"), fraction[:100]
    n = 1 << 64
    if len(whole) <= 20:
        exact = int(whole or "0") + fractions.Fraction(int(fraction or "0"), 10 ** len(fraction))
        n = int(exact * unit)
    if n >> 64:
        raise OverflowError(f"memres: {what}: {text!r} is more than 2**64 - 1 bytes")
    return n


def _path(value, what):
    """A path argument (a str, bytes or an ``os.PathLike``, as ``open``
    takes) as a str; TypeError naming ``what`` for anything else."""
    try:
        return os.fsdecode(value)
    except TypeError:
        raise TypeError(f"memres: {what} must be a path (str, bytes or os.PathLike), "
                        f"not {type(value).__name__}") from None


def _stack(stack):
    """``stack`` if it is a stack string; TypeError for anything else (the
    native side's would name its own argument)."""
    if not isinstance(stack, str):
        raise TypeError("memres: stack must be a str (a stack string such as 'stats(pool(cuda))'), "
                        f"not {type(stack).__name__}")
    return stack


def _bin(exponent, what):
    """RMM's bin exponent as the stack's bin size in bytes (``min_bin=``,
    ``max_bin=``), at least 256: RMM's bins below it hand out blocks of 256
    bytes (a fixed-size resource rounds its block size up to 256)."""
    if isinstance(exponent, bool) or not isinstance(exponent, int) or not 0 <= exponent < 64:
        raise ValueError(f"memres: {what} must be an int from 0 to 63, not {exponent!r}")
    return str(max(1 << exponent, 256))


def _args(positional, **keys):
    parts = list(positional)
    parts += [f"{k}={v}" for k, v in keys.items() if v is not None]
    return ", ".join(parts)


class DeviceMemoryResource:
    """Base of every resource: a stack built on the Rust side."""

    def __init__(self, *args, **kwargs):
        raise TypeError("memres: DeviceMemoryResource is abstract; use a resource of memres.mr")

    def _build(self, name, args, upstreams=(), backend=None, device=None, callbacks=None,
               positional_upstreams=None, **keys):
        # Set only once built: a failed rebuild (`add_bin`) changes nothing.
        self._native, self._backend = self._stack_of(name, args, upstreams, backend, device, callbacks,
                                                     positional_upstreams, **keys)
        self._upstreams = tuple(upstreams)
        _BUILT.add(self)

    @staticmethod
    def _stack_of(name, args, upstreams=(), backend=None, device=None, callbacks=None,
                  positional_upstreams=None, **keys):
        """The native stack ``name(args, keys)`` over ``upstreams``, and its
        backend."""
        # The first `positional_upstreams` are the stack's upstreams; `args`
        # may name the others.
        refs = [f"up{i}" for i in range(len(upstreams))][:positional_upstreams]
        text = f"{name}({_args(refs + list(args), **keys)})" if refs or args or any(
            v is not None for v in keys.values()) else name
        return DeviceMemoryResource._native_of(text, upstreams, backend, device, callbacks)

    @staticmethod
    def _native_of(text, upstreams, backend, device, callbacks=None, what="upstream_mr"):
        """The native stack of ``text`` over ``upstreams`` (its ``up0``,
        ``up1``, ...), and its backend: theirs, where there are any (a
        ``backend`` named too must be it), else ``backend``."""
        for u in upstreams:
            if not isinstance(u, DeviceMemoryResource):
                raise TypeError(f"memres: {what} must be a memres.mr resource, not {type(u).__name__}")
        if upstreams:
            if backend not in (None, upstreams[0]._backend):
                raise ValueError(f"memres: backend={backend!r} over upstreams of the {upstreams[0]._backend!r} backend")
            backend = upstreams[0]._backend
            device = upstreams[0].device_id if device is None else device
            if any(u._backend != backend for u in upstreams):
                raise ValueError("memres: upstreams of different backends (CUDA and simulated)")
        native = _native.backend(backend).NativeResource.build(
            text, [u._native for u in upstreams],
            current_device() if device is None else _device_id(device), callbacks)
        return native, backend

    @property
    def device_id(self):
        return self._native.device

    @property
    def stack(self):
        """The stack string this resource was built from (``upN``: the
        upstream objects)."""
        return self._native.stack

    def allocate(self, nbytes, stream=None):
        """Allocates ``nbytes`` on ``stream``; returns the address (0 for 0
        bytes, which reach no layer: no statistics count them, no log
        writes a row, where RMM's do)."""
        # The size first: a call refused for it keeps no stream, nor does
        # one the stack never sees (0 bytes, a size no resource serves).
        nbytes = _nbytes(nbytes, "nbytes")
        handle = as_handle(stream)
        if 0 < nbytes <= _native.sim.MAX_REQUEST:
            self._keep(handle, stream)
        return self._native.allocate(nbytes, handle)

    def deallocate(self, ptr, nbytes, stream=None):
        """Frees ``ptr`` (from ``allocate`` of this object, ``nbytes``
        long) on ``stream``; a refused free raises and changes nothing."""
        # The sizes first: a call refused for them keeps no stream, nor
        # does a free of no live block of this object, which the stack
        # never sees (one freed meanwhile by another thread is refused
        # after its stream was kept, which is harmless).
        ptr, nbytes = _nbytes(ptr, "ptr"), _nbytes(nbytes, "nbytes")
        handle = as_handle(stream)
        if self._native.holds(ptr, nbytes):
            self._keep(handle, stream)
        # The object keeps the handle valid for a free deferred from a callback.
        self._native.deallocate(ptr, nbytes, handle, stream)

    def _keep(self, handle, stream):
        """Keeps the Python object of every stream this stack has been
        given alive as long as the stack (its native side, which the device
        registry or blocks PyTorch has not freed yet may hold after this
        object is gone): stream-ordered layers remember a stream after the
        call, and a ``torch.cuda.Stream`` or ``cupy.cuda.Stream`` destroys
        its handle when collected. One entry per distinct stream, in each
        stack of the chain that remembers streams; nothing where none
        does (``keeps_streams``)."""
        if stream is None or handle == 0 or not self._native.keeps_streams:
            return
        if self._native.keep(handle, stream):
            for u in getattr(self, "_upstreams", ()):
                u._keep(handle, stream)

    def step(self, stream=None):
        """Marks the start of a step (one iteration of a training loop) on
        ``stream`` for the stack's ``planned(...)`` layers, and those of the
        resources it is built over (a planned stack under
        ``enable_statistics()`` or ``enable_logging()``): each lays the
        coming steps out once a step asks for what the step before it
        asked for, and serves them from one region. Returns how many such
        layers it stepped (0: it does nothing, and keeps no stream; nor does
        a step refused before any layer, such as one re-entering the stack
        from a callback under it)."""
        handle = as_handle(stream)
        # A step refused before the layers (re-entrant) raises here: no
        # layer saw the stream. Every layer steps, those after one that
        # failed too, so a layer's failure comes back to raise below.
        n, failed = self._native.step(handle)
        # Only a planned layer remembers the stream of a step: kept once
        # one has, failed or not (this call's reference holds it until then).
        if n:
            self._keep(handle, stream)
        if failed is not None:
            raise failed
        return n

    def steps(self):
        """What the ``planned(...)`` layers ``step`` steps have done, summed
        over them, as a dict: ``steps`` (calls of ``step``), ``followed`` (steps
        served from a plan from start to end), ``plans`` (plans made),
        ``planned_allocations`` (allocations served from the plans'
        regions), ``region`` and ``carry_region`` (bytes of the regions
        held now). All 0 without such layers."""
        return dict(zip(_STEPS_FIELDS, self._native.steps()))

    def release(self, stream=None):
        """Gives back to the device what this stack's pools keep free, then
        what those of the resources it is built over keep (so
        ``empty_cache()`` reaches the pool under ``enable_statistics()``),
        once every stream of the device is done: the wholly free chunks of
        pools and of the fixed-size, binning and arena resources, a virtual
        pool's mapped granules that no block uses (``vmm``, ``vpool``), the
        driver pool's reserve beyond what is in use (``async``), the regions
        of ``planned`` that no block lives in, once the step's region is free
        (its plan goes, and the next steps are laid out afresh; gradients
        kept between steps keep the carry region). Returns the
        bytes given back to the device (or the host), each counted once: a
        pool's chunk that a virtual pool under it then unmaps is counted
        when it is unmapped.

        First it gives back the blocks ``allocate`` kept: one the stack
        handed out that the call could not take (at an address live
        already, at address 0, of another size than asked) and that the
        stack then refused back (its Python function raised). One refused again stays kept, and ``MemresError`` is
        raised once the pools gave back. A kept block counts as use
        (``add_bin`` refuses)."""
        return self._native.release(as_handle(stream))

    def __repr__(self):
        return f"<memres.mr.{type(self).__name__} {self.stack!r} on device {self.device_id}>"


class UpstreamResourceAdaptor(DeviceMemoryResource):
    """Base of every resource built over another (the algorithms and the
    adaptors), as RMM's: ``upstream_mr`` is the object it was given."""

    @property
    def upstream_mr(self):
        return self._upstreams[0]

    def get_upstream(self):
        return self.upstream_mr


def _nbytes(n, what):
    """``n`` as the native side takes a size or an address: an int of 0 to
    2**64 - 1, or an integer of another type (NumPy's: ``np.prod(shape)``)
    that says its value (``__index__``). As RMM's ``size_t`` arguments:
    TypeError for what is no integer (a bool included), OverflowError for
    one out of range; each names ``what``."""
    number = integer(n)
    if number is None:
        raise TypeError(f"memres: {what} must be an int from 0 to 2**64 - 1, not {n!r}")
    n = number
    if not 0 <= n < 1 << 64:
        raise OverflowError(f"memres: {what} must be an int from 0 to 2**64 - 1, not {n!r}")
    return n


class StackMemoryResource(DeviceMemoryResource):
    """Any stack string, such as ``"stats(pool(cuda, per_stream=true))"``
    (``backend``: "cuda", the default, or "sim"), over the resource
    objects ``upstreams``, which the string names ``up0``, ``up1``, ...
    (``"planned(up0)"``): the stack's backend and device are then theirs,
    and each must be named."""

    def __init__(self, stack, backend=None, device=None, upstreams=()):
        if isinstance(upstreams, (DeviceMemoryResource, str)) or not hasattr(upstreams, "__iter__"):
            raise TypeError("memres: upstreams must be a list of memres.mr resources (the stack's up0, up1, ...), "
                            f"not {type(upstreams).__name__}")
        upstreams = tuple(upstreams)
        if not upstreams and backend is None:
            backend = "cuda"
        native, backend = self._native_of(_stack(stack), upstreams, backend, device, what="an upstream")
        self._adopt(native, backend)
        self._upstreams = upstreams

    def _adopt(self, native, backend):
        self._backend, self._upstreams, self._native = backend, (), native
        _BUILT.add(self)


# Leaves ------------------------------------------------------------------

class CudaMemoryResource(DeviceMemoryResource):
    """``cuMemAlloc`` / ``cuMemFree`` (synchronous)."""

    def __init__(self, device=None):
        self._build("cuda", [], backend="cuda", device=device)


class ManagedMemoryResource(DeviceMemoryResource):
    """Unified memory (``cuMemAllocManaged``)."""

    def __init__(self, device=None):
        self._build("managed", [], backend="cuda", device=device)


class PinnedHostMemoryResource(DeviceMemoryResource):
    """Page-locked host memory."""

    def __init__(self, device=None):
        self._build("pinned", [], backend="cuda", device=device)


class CudaAsyncMemoryResource(DeviceMemoryResource):
    """The driver's stream-ordered allocator on a pool of its own; with
    ``enable_ipc=True`` its memory can be exported to other processes as
    POSIX file descriptors, with ``enable_fabric=True`` as fabric handles
    (the driver refuses what the system cannot do)."""

    def __init__(self, initial_pool_size=None, release_threshold=None, enable_ipc=False, enable_fabric=False,
                 device=None):
        if enable_ipc and enable_fabric:
            raise InvalidArgument("memres: enable_ipc and enable_fabric at once are not supported: choose one")
        ipc = "posix_fd" if enable_ipc else "fabric" if enable_fabric else None
        self._build("async", [], backend="cuda", device=device, ipc=ipc,
                    initial=None if initial_pool_size is None else _size(initial_pool_size, "initial_pool_size"),
                    release_threshold=None if release_threshold is None
                    else _size(release_threshold, "release_threshold"))


class CudaAsyncViewMemoryResource(DeviceMemoryResource):
    """The driver's stream-ordered allocator on the device's default pool
    (``cudaDeviceGetDefaultMemPool``), as RMM's view of an existing pool:
    the pool is the driver's, left as it is and never destroyed.
    ``pool_handle`` is that pool's handle (an int, or an object ``int()``
    takes, such as cuda-python's ``cudaMemPool_t``); None means it. A pool
    made elsewhere is refused with ValueError: memres cannot tell how long
    it lives."""

    def __init__(self, pool_handle=None, device=None):
        from . import cuda_available
        device = current_device() if device is None else _device_id(device)
        if not cuda_available():
            raise CudaUnavailable("memres: CudaAsyncViewMemoryResource needs CUDA and a device")
        default = _native.cuda().default_memory_pool(device)
        if pool_handle is not None:
            handle = _nbytes(_pool_int(pool_handle), "pool_handle")
            if handle != default:
                raise ValueError(f"memres: pool_handle {handle:#x} is not device {device}'s default memory "
                                 f"pool ({default:#x}); memres views only that pool, whose life it knows")
        self._pool_handle = default
        self._build("async", [], backend="cuda", device=device, pool="default")

    def pool_handle(self):
        """The driver's handle of the pool viewed."""
        return self._pool_handle


class CudaAsyncManagedMemoryResource(DeviceMemoryResource):
    """The driver's stream-ordered allocator on the device's default pool
    of managed memory (``cudaMemGetDefaultMemPool`` for managed memory,
    CUDA 13 and later), as RMM's ``rmm.mr.experimental`` resource of that
    name: blocks valid on the host and on every device, usable in the order
    of their stream; the pool is the driver's, left as it is."""

    def __init__(self, device=None):
        from . import cuda_available
        device = current_device() if device is None else _device_id(device)
        if not cuda_available():
            raise CudaUnavailable("memres: CudaAsyncManagedMemoryResource needs CUDA and a device")
        self._pool_handle = _native.cuda().default_memory_pool(device, managed=True)
        self._build("async", [], backend="cuda", device=device, pool="managed")

    def pool_handle(self):
        """The driver's handle of the pool of managed memory."""
        return self._pool_handle


# RMM's `rmm.mr.experimental`: `memres.mr.experimental` (importable too).
experimental = types.ModuleType(__name__ + ".experimental", "RMM's experimental resources: "
                                "CudaAsyncManagedMemoryResource.")
experimental.CudaAsyncManagedMemoryResource = CudaAsyncManagedMemoryResource
sys.modules[experimental.__name__] = experimental


def _pool_int(handle):
    """A pool handle as an int: cuda-python's handle types convert with
    ``int()``; a bool is no handle."""
    if isinstance(handle, bool) or not hasattr(handle, "__int__"):
        raise TypeError(f"memres: pool_handle must be an int or a driver pool handle, not {handle!r}")
    return int(handle)


class VirtualMemoryResource(DeviceMemoryResource):
    """A pool over reserved address ranges (one of ``reserve`` bytes; over
    CUDA another as large when one is full, up to 4) that maps physical
    memory only under live blocks: CUDA VMM (the ``vmm`` leaf), or with
    ``simulated_capacity=N`` the same pool over a simulated address space
    of N physical bytes (``vpool``). ``per_stream=True``: a pool per
    stream, each in a reservation of its own, stream-ordered."""

    def __init__(self, reserve=None, device=None, simulated_capacity=None, per_stream=False):
        reserve = None if reserve is None else _size(reserve, "reserve")
        per_stream = "true" if per_stream else None
        if simulated_capacity is None:
            self._build("vmm", [], backend="cuda", device=device, reserve=reserve, per_stream=per_stream)
        else:
            space = f"sim({_size(simulated_capacity, 'simulated_capacity')})"
            self._build("vpool", [space], backend="sim", device=device, reserve=reserve, per_stream=per_stream)


class SimulatedMemoryResource(DeviceMemoryResource):
    """A simulated device of ``capacity`` bytes: addresses with no bytes
    behind them, for trying allocation strategies without a GPU."""

    def __init__(self, capacity=80 << 30, device=None):
        self._build("sim", [_size(capacity, "capacity")], backend="sim", device=device)


class HostMemoryResource(DeviceMemoryResource):
    """Host memory standing in for a device without a GPU (real bytes, so
    DeviceBuffer contents work)."""

    def __init__(self, device=None):
        self._build("host", [], backend="sim", device=device)


class CallbackMemoryResource(DeviceMemoryResource):
    """Memory from Python functions, as RMM's: ``allocate_func(nbytes,
    stream) -> int`` and ``deallocate_func(ptr, nbytes, stream)``, the
    stream a ``memres.Stream``. Functions that take one argument fewer
    (``allocate_func(nbytes)``, ``deallocate_func(ptr, nbytes)``) are
    called without it."""

    def __init__(self, allocate_func, deallocate_func, backend="cuda", device=None):
        for name, f in (("allocate_func", allocate_func), ("deallocate_func", deallocate_func)):
            if not callable(f):
                raise TypeError(f"memres: {name} must be callable, not {type(f).__name__}")
        self._build("callback", [], backend=backend, device=device,
                    callbacks=(_given_a_stream(allocate_func, 2), _given_a_stream(deallocate_func, 3), None))


def _given_a_stream(f, arity):
    """``f`` as the native side calls it, with the stream's raw handle
    last: RMM's form (``arity`` arguments, the stream a ``memres.Stream``)
    when ``f`` takes that many positional arguments or any number of them
    (or its signature cannot be read), else called without the stream."""
    import inspect
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        takes_stream = True
    else:
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        takes_stream = len(positional) >= arity or any(p.kind == p.VAR_POSITIONAL for p in params)
    return _Function(f, takes_stream)


class _Function:
    """A Python function of a resource, as its stack holds and calls it:
    with the stream's raw handle last, given to ``f`` as a ``memres.Stream``
    (``stream`` true), left out (false), or no stream at all (None: a
    failure callback).

    Its finalizer runs when the garbage collector finds it garbage (a cycle
    through a bound method of an object that holds the resource), before
    the collector clears anything of the cycle. A ``deallocate_func``'s
    first has the pools over its resource give back what they keep free
    through it, and the blocks ``allocate`` kept over it (refused back:
    ``release``), through ``give_back``, which the native side sets, while
    what it uses is whole; from then on the native side never calls it (``dead``,
    also once the collector cleared its slots). A stack that outlives the
    collection (a block of the C functions holds it) called a function the
    collector had cleared, and the interpreter crashed."""

    __slots__ = ("f", "stream", "give_back", "dead")

    def __init__(self, f, stream):
        self.f, self.stream, self.give_back, self.dead = f, stream, None, False

    def __call__(self, *args):
        if self.stream is None:
            return self.f(*args)
        if self.stream:
            return self.f(*args[:-1], Stream.from_handle(args[-1]))
        return self.f(*args[:-1])

    def __del__(self):
        try:
            if self.give_back is not None:
                self.give_back()
        finally:
            self.dead = True


# Algorithms ----------------------------------------------------------------

class PoolMemoryResource(UpstreamResourceAdaptor):
    """The coalescing pool. Without ``initial_pool_size`` it starts empty
    and grows in chunks of at least 1/8 of what it holds, in 32 MiB steps
    (RMM's starts at half the device's free memory). ``per_stream=True``:
    a pool per stream, stream-ordered as PyTorch's allocator (no
    ``maximum_pool_size``)."""

    def __init__(self, upstream_mr, initial_pool_size=None, maximum_pool_size=None, per_stream=False):
        initial = None if initial_pool_size is None else _size(initial_pool_size, "initial_pool_size")
        maximum = None if maximum_pool_size is None else _size(maximum_pool_size, "maximum_pool_size")
        if initial is not None and maximum is not None and int(initial) > int(maximum):
            # RMM's words, which its tests match (the pool refuses it too).
            raise InvalidArgument(f"memres: Initial pool size exceeds the maximum pool size "
                                  f"({initial_pool_size!r} > {maximum_pool_size!r})")
        self._build("pool", [], [upstream_mr], initial=initial, max=maximum,
                    per_stream="true" if per_stream else None)

    def pool_size(self):
        """Bytes held from the upstream (RMM's ``pool_size``)."""
        return self._native.pool_size()


class ArenaMemoryResource(UpstreamResourceAdaptor):
    """Global arena of superblocks with per-thread and per-stream arenas.
    ``arena_size`` (the global arena's initial size) is rounded down to 256
    and must then be at least 1 MiB, RMM's smallest superblock
    (``InvalidArgument`` below)."""

    def __init__(self, upstream_mr, arena_size=None, dump_log_on_failure=False):
        # Rounded down to 256, then at least a superblock, as RMM's global
        # arena (below, 0 would silently mean no arena size at all).
        initial = None if arena_size is None else _size(arena_size, "arena_size", align="down")
        if initial is not None and int(initial) < _MIN_ARENA:
            raise InvalidArgument(f"memres: arena_size {arena_size!r} is below a superblock: it "
                                  "must be at least 1 MiB once rounded down to 256, as RMM's")
        self._build("arena", [], [upstream_mr], initial=initial)


# RMM's minimum superblock size, the smallest arena it takes.
_MIN_ARENA = 1 << 20


class BinningMemoryResource(UpstreamResourceAdaptor):
    """Power-of-two bins from ``2**min_size_exponent`` to
    ``2**max_size_exponent`` (none unless both are given, as RMM's) and the
    bins of ``add_bin``; other sizes from the upstream."""

    def __init__(self, upstream_mr, min_size_exponent=None, max_size_exponent=None):
        powers = dict(
            min_bin=None if min_size_exponent in (None, -1) else _bin(min_size_exponent, "min_size_exponent"),
            max_bin=None if max_size_exponent in (None, -1) else _bin(max_size_exponent, "max_size_exponent"))
        # Without both exponents no bins, as RMM's: every size goes
        # upstream until bins are added.
        self._powers = powers if all(v is not None for v in powers.values()) else dict(powers="false")
        self._bins = {}  # size: the resource given, or None for a fixed-size bin
        self._bin_mrs = []
        self._build("binning", [], [upstream_mr], **self._powers)

    def add_bin(self, allocation_size, bin_resource=None):
        """Adds a bin of ``allocation_size`` bytes, rounded up to 256 as
        RMM's: requests up to that size that no smaller bin takes go to
        ``bin_resource`` or, without one, to a fixed-size resource over the
        upstream. A bin given a resource replaces one of that size (a power
        of two of the constructor's, or one added before); without one, a
        bin of that size stays as it is, as in RMM. Bins are added before
        the resource is used: while it has live blocks, is a device's
        resource, a buffer's or another resource's upstream, ``add_bin``
        raises ``InvalidArgument`` and changes nothing. An ``allocate`` of
        another thread that ends on the stack ``add_bin`` replaced raises
        ``InvalidArgument`` (allocate again), its block given back. Of two
        ``add_bin`` at once, one may raise ``InvalidArgument`` (add the bin
        again); none loses the other's bin."""
        from ._errors import InvalidArgument
        size = _nbytes(allocation_size, "allocation_size")
        if size == 0:
            raise InvalidArgument("memres: add_bin: allocation_size must be at least 1 byte")
        # Past the last multiple of 256 below 2**64 it stays there, where the
        # stack refuses it as too large (rounded to 2**64 it was no number).
        size = min((size + 255) // 256 * 256, (1 << 64) - 256)
        if bin_resource is not None and not isinstance(bin_resource, DeviceMemoryResource):
            raise TypeError(f"memres: bin_resource must be a memres.mr resource, not {type(bin_resource).__name__}")
        if bin_resource is None and (size in self._bins or size in self._power_sizes()):
            return
        in_use = InvalidArgument(
            "memres: add_bin on a resource in use (live blocks, a device's resource, a buffer's "
            "or another resource's upstream): add its bins before it is used")
        # The stack the bins below are read with: only it is replaced.
        old = self._native
        if old.in_use():
            raise in_use
        bins = {**self._bins, size: bin_resource}
        given = list({id(r): r for r in bins.values() if r is not None}.values())
        ref = {id(r): f"up{i}" for i, r in enumerate(given, start=1)}
        args = [f"bin({s})" if r is None else f"bin({s}, {ref[id(r)]})" for s, r in sorted(bins.items())]
        upstreams = (self.upstream_mr, *given)
        # The GIL is released while it builds: another thread may use the
        # old stack meanwhile. Retiring it checks again, and refuses the
        # allocations that end on it from then on; the new stack, unused,
        # is dropped if it is in use, or if another add_bin retired it
        # first (that one's bin is kept: this one read the bins before it).
        try:
            native, _ = self._stack_of("binning", args, upstreams, positional_upstreams=1, **self._powers)
        except InvalidArgument:
            raise
        except ValueError as e:
            # What the stack refuses of the bin (a size too large for one,
            # said at its value as every value of a stack string) is the
            # resource's refusal of the argument here, as RMM's.
            raise InvalidArgument(str(e)) from None
        if not old.retire():
            raise in_use
        self._native, self._upstreams = native, upstreams
        self._bins = bins
        if bin_resource is not None:
            self._bin_mrs.append(bin_resource)

    @property
    def bin_mrs(self):
        """The resources given to ``add_bin``, in order (RMM's)."""
        return list(self._bin_mrs)

    def _power_sizes(self):
        """The sizes of the power-of-two bins the stack keeps: none without
        both exponents, else from ``min_bin`` to ``max_bin``."""
        if "powers" in self._powers:
            return set()
        low, high = int(self._powers["min_bin"]), int(self._powers["max_bin"])
        return {1 << e for e in range(low.bit_length() - 1, high.bit_length())}


class FixedSizeMemoryResource(UpstreamResourceAdaptor):
    """Blocks of one size, ``blocks_to_preallocate`` per upstream chunk."""

    def __init__(self, upstream_mr, block_size=1 << 20, blocks_to_preallocate=128):
        blocks = int(_size(blocks_to_preallocate, "blocks_to_preallocate"))
        # The stack counts blocks in 32 bits, the top counts kept by the
        # core: a count past them is asked as the largest, which the core
        # refuses with its own word on the maximum.
        try:
            # Rounded up to 256, as RMM's.
            self._build("fixed", [], [upstream_mr], size=_size(block_size, "block_size", align="up"),
                        blocks=str(min(blocks, (1 << 32) - 1)))
        except InvalidArgument as e:
            if blocks < 1 << 32:
                raise
            raise InvalidArgument(f"memres: blocks_to_preallocate {blocks} is too large ({e})") from None


# Adaptors ------------------------------------------------------------------

class StatisticsResourceAdaptor(UpstreamResourceAdaptor):
    """Counts bytes and allocations: now, peak and total, in a stack of
    levels (``push_counters`` / ``pop_counters``)."""

    def __init__(self, upstream_mr):
        self._build("stats", [], [upstream_mr])

    @property
    def allocation_counts(self):
        return _counts(self._native.statistics())

    def push_counters(self):
        """Starts a new level; returns the counts of the level left."""
        return _counts(self._native.push_statistics())

    def pop_counters(self):
        """Ends the newest level; returns its counts."""
        return _counts(self._native.pop_statistics())


def _counts(figures):
    """The native side's figures as ``memres.statistics.Statistics`` (RMM's
    type of ``allocation_counts``)."""
    from .statistics import Statistics
    (b_now, b_peak, b_total), (c_now, c_peak, c_total) = figures
    return Statistics(current_bytes=b_now, current_count=c_now, peak_bytes=b_peak,
                      peak_count=c_peak, total_bytes=b_total, total_count=c_total)


class TrackingResourceAdaptor(UpstreamResourceAdaptor):
    """Keeps every outstanding allocation; with ``capture_stacks=True`` the
    (native) backtrace of each too."""

    def __init__(self, upstream_mr, capture_stacks=False):
        # Dropped with allocations outstanding, it says nothing, as RMM's.
        self._build("track", [], [upstream_mr], backtraces="true" if capture_stacks else None,
                    report_leaks="false")

    def get_allocated_bytes(self):
        return self._native.outstanding()[1]

    def get_outstanding_count(self):
        return self._native.outstanding()[0]

    def get_outstanding_allocations_str(self):
        """The outstanding allocations, a line of their count and bytes,
        then one line each (address and size), with its backtrace when
        ``capture_stacks=True``; ``""`` when there are none, as RMM's."""
        return self._native.outstanding_report() if self.get_outstanding_count() else ""

    def log_outstanding_allocations(self):
        """Logs ``get_outstanding_allocations_str()`` at debug level to the
        ``memres`` logger (RMM's goes to its debug log): passed on once
        ``memres.set_logging_level(memres.level_enum.debug)``, or a
        ``logging`` setting, lets debug records through, and shown by a
        handler that takes them (``logging.basicConfig(level=logging.DEBUG)``;
        with none, Python's last resort shows warnings and above only)."""
        from .logger import level_enum, log
        log(level_enum.debug, "Outstanding allocations: %s", self.get_outstanding_allocations_str())


def _log_file(log_file_name, device):
    """The absolute path that a ``LoggingResourceAdaptor`` of
    ``log_file_name`` writes for ``device`` (None: a resource of no
    device)."""
    # As RMM's: the environment names the file only where no name is
    # given (an empty one, or one that is no path, is an error).
    if log_file_name is None:
        name = os.environ.get("MEMRES_LOG_FILE")
    else:
        name = _path(log_file_name, "log_file_name")
    if not name:
        raise ValueError("memres: LoggingResourceAdaptor needs log_file_name or MEMRES_LOG_FILE")
    if device is not None:
        name = _native.sim.log_file_of_device(name, device) or name
    return os.path.abspath(name)


class LoggingResourceAdaptor(UpstreamResourceAdaptor):
    """Logs every call in RMM's CSV format to ``log_file_name`` (a str,
    bytes or ``os.PathLike`` path; else ``$MEMRES_LOG_FILE``) with the device's number before the extension, as
    RMM's (``x.csv`` is ``x.dev0.csv`` for device 0), a path taken from the
    working directory when the adaptor is made; ``get_file_name()`` gives
    it absolute, as RMM's."""

    def __init__(self, upstream_mr, log_file_name=None):
        device = upstream_mr.device_id if isinstance(upstream_mr, DeviceMemoryResource) else None
        self._build("log", [], [upstream_mr], file=_word(_log_file(log_file_name, device), "log_file_name"))

    def get_file_name(self):
        return self._native.log_file

    def flush(self):
        self._native.flush()


class LimitingResourceAdaptor(UpstreamResourceAdaptor):
    """Refuses allocations past ``allocation_limit`` bytes in use."""

    def __init__(self, upstream_mr, allocation_limit):
        self._limit = int(_size(allocation_limit, "allocation_limit"))
        self._build("limit", [str(self._limit)], [upstream_mr])

    def get_allocation_limit(self):
        return self._limit

    def get_allocated_bytes(self):
        """Bytes counted against the limit: the live blocks, each rounded up
        as the adaptor counts it, as RMM's."""
        return self._native.limited_bytes()


class FailureCallbackResourceAdaptor(UpstreamResourceAdaptor):
    """Calls ``callback(nbytes) -> bool`` when the upstream is out of
    memory; a true answer retries the allocation."""

    def __init__(self, upstream_mr, callback):
        if not callable(callback):
            raise TypeError("memres: callback must be callable")
        self._build("on_failure", [], [upstream_mr], callbacks=(None, None, _Function(callback, None)))


class PrefetchResourceAdaptor(UpstreamResourceAdaptor):
    """Prefetches every block it hands out to the resource's device, on
    the allocation's stream (``cuMemPrefetchAsync``), as RMM's: meant over
    ManagedMemoryResource; memory that does not migrate is handed out as it
    is. The CUDA backend only (the simulated one has no memory to move)."""

    def __init__(self, upstream_mr):
        if isinstance(upstream_mr, DeviceMemoryResource) and upstream_mr._backend != "cuda":
            raise ValueError("memres: PrefetchResourceAdaptor needs an upstream of the CUDA backend "
                             "(the simulated backend has no memory to prefetch)")
        self._build("prefetch", [], [upstream_mr])


# The current resource --------------------------------------------------------

_current = {}
# Held while a device's resource is looked up, made or changed: the native
# registries' calls give the GIL up, so without it two threads that set a
# device's resource at once could leave `_current` naming one and the C
# functions serving the other, and two first uses could each make a default.
# Re-entrant: a Python callback under a resource dropped or built meanwhile
# (on this thread) may ask for a device's resource again.
_REGISTRY = threading.RLock()


def _default_resource(device):
    from . import cuda_available
    return CudaMemoryResource(device=device) if cuda_available() else HostMemoryResource(device=device)


def _made_for_c(device):
    """The resource the C functions (PyTorch's allocations) made for
    ``device``, which had none, as a resource object; None if they made
    none."""
    for backend, module in (("cuda", _native._cuda), ("sim", _native.sim)):
        native = None if module is None else module.take_default(device)
        if native is not None:
            res = StackMemoryResource.__new__(StackMemoryResource)
            res._adopt(native, backend)
            return res
    return None


def _existing(device):
    """The resource of ``device`` if it has one: the one set, or the one
    the C functions made (which becomes the one set); else None."""
    device = _device_id(device)
    with _REGISTRY:
        if device not in _current:
            made = _made_for_c(device)
            if made is None:
                return None
            set_per_device_resource(device, made)
        return _current[device]


def _backend_of(device):
    """The backend (``"cuda"`` or ``"sim"``) of ``device``'s resource, or
    where it has none yet, of the default it would get: looked up without
    making one, which would be the device's resource from then on
    (PyTorch's allocations served by it, not by ``DEFAULT_STACK``)."""
    from . import cuda_available
    res = _existing(device)
    return res._backend if res is not None else "cuda" if cuda_available() else "sim"


def _existing_all():
    """``{device: resource}`` of every device that has one, as ``_existing``
    finds it: those whose default only the C functions made (PyTorch's
    allocations) included, which then become the ones set."""
    for device in range(_native.sim.MAX_DEVICES):
        _existing(device)
    return dict(_current)


def get_per_device_resource(device):
    """The resource of ``device``, made on first use: CudaMemoryResource
    (RMM's default), or HostMemoryResource where CUDA is not available;
    where PyTorch's allocations (the C functions) reached the device first,
    the C library's default stack they made for it."""
    with _REGISTRY:
        res = _existing(device)
        if res is None:
            device = _device_id(device)
            set_per_device_resource(device, _default_resource(device))
            res = _current[device]
        return res


def set_per_device_resource(device, mr):
    """Makes ``mr`` the resource of ``device``; returns the previous one.
    A device has one resource: the C functions of the other backend's
    module (simulated or CUDA) let go of the one they had for it, and
    refuse to allocate there (PyTorch's allocations on a device whose
    resource is simulated fail, and ``last_error()`` says why)."""
    if not isinstance(mr, DeviceMemoryResource):
        raise TypeError(f"memres: {type(mr).__name__} is not a memres.mr resource")
    device = _device_id(device)
    if mr.device_id != device:
        raise ValueError(f"memres: a resource of device {mr.device_id} set for device {device}")
    with _REGISTRY:
        _native.backend(mr._backend).set_per_device_resource(device, mr._native)
        other = _native._cuda if mr._backend == "sim" else _native.sim
        if other is not None:  # else marked when it loads (`_native.cuda`)
            other.set_other_backend(device)
        previous = _current.get(device)
        _current[device] = mr
        return previous


def _forget(device):
    """Forgets the resource of ``device`` everywhere, as though none had
    been set: the next use gets the device's default (Python's
    ``get_per_device_resource``, or the C functions' ``DEFAULT_STACK``).
    Returns the resource forgotten (or None), for the caller to drop once
    it has let the registry go: the drop of a pool over a
    ``CallbackMemoryResource`` waits for that resource's lock, whose holder
    may be in a callback that waits for the registry."""
    with _REGISTRY:
        for module in (_native.sim, _native._cuda):
            if module is not None:
                module.forget_per_device_resource(device)
        return _current.pop(device, None)


def _forget_all(but=()):
    """Forgets the resource of every device but those in ``but``, as
    ``_forget``: also of a device whose default only the C functions made
    (PyTorch's allocations), which is not in ``_current``. Returns those
    forgotten, as ``_forget``."""
    with _REGISTRY:
        return [_forget(device) for device in range(_native.sim.MAX_DEVICES) if device not in but]


def get_current_device_resource():
    return get_per_device_resource(current_device())


def set_current_device_resource(mr):
    return set_per_device_resource(current_device(), mr)


def get_current_device_resource_type():
    return type(get_current_device_resource())


def get_per_device_resource_type(device):
    return type(get_per_device_resource(device))


def available_device_memory(device=None):
    """``(free, total)`` bytes of ``device`` (the current one) as the driver
    tells them now, as RMM's; ``memres.CudaUnavailable`` without CUDA."""
    from . import cuda_available
    device = current_device() if device is None else _device_id(device)
    if not cuda_available():
        raise CudaUnavailable("memres: available_device_memory needs CUDA and a device")
    return _native.cuda().memory_info(device)


def enable_logging(log_file_name=None):
    """Puts a LoggingResourceAdaptor over the resource of every device that
    has one (device 0 if none has) and does not log outermost already (a
    LoggingResourceAdaptor, or a stack string with ``log`` outermost), as
    RMM's ``rmm.enable_logging``: to
    ``log_file_name``, else ``$MEMRES_LOG_FILE``, each device to its own
    file (``x.dev1.csv`` for device 1 of ``x.csv``). A device whose
    resource the C functions made (PyTorch's allocations reached it first)
    has one. Every log is made before any is set: one that cannot be made
    (its file written by another live log) raises, and no device's resource
    changes. One step for other threads (the registry held): none sets a
    device's resource between its log's making and its setting."""
    with _REGISTRY:
        made = []
        for device in sorted(_existing_all()) or [0]:
            res = get_per_device_resource(device)
            if res._native.log_file is None:
                made.append((device, LoggingResourceAdaptor(res, log_file_name=log_file_name)))
        for device, res in made:
            set_per_device_resource(device, res)


def disable_logging():
    """Takes the LoggingResourceAdaptor off each device's resource where it
    is outermost, once every such log is written out: one that cannot be
    (its flush raises) raises, and no device's resource changes, as
    ``enable_logging``, and as it one step for other threads. A stack
    string's own ``log`` is part of the stack it names, and stays."""
    with _REGISTRY:
        logged = [(device, res) for device, res in _current.items()
                  if isinstance(res, LoggingResourceAdaptor)]
        for _, res in logged:
            res.flush()
        for device, res in logged:
            set_per_device_resource(device, res.upstream_mr)


def get_log_filenames():
    """``{device: the log file of its resource}`` for every device that has
    one (as ``enable_logging`` finds them), None where its resource does
    not log outermost (a LoggingResourceAdaptor, or a stack string with
    ``log`` outermost)."""
    return {device: res._native.log_file for device, res in _existing_all().items()}


def _flush_logs():
    """Writes out the log of each device's resource that is a
    ``LoggingResourceAdaptor``, as RMM's private function of that name
    (which RMM's tests call)."""
    for res in _existing_all().values():
        if isinstance(res, LoggingResourceAdaptor):
            res.flush()


def is_initialized():
    """Whether the current device has a resource: one set, or the default
    made on first use, by Python or by the C functions."""
    return _existing(current_device()) is not None
