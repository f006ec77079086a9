"""Streams from every framework become handles; what is not a stream (a bare
int included) is a TypeError, and Stream.from_handle wraps a raw handle."""

import copy
import ctypes
import gc
import pickle
import types
import weakref

import pytest

import memres
from memres import mr
from memres._stream import as_handle


class TorchLike:
    __module__ = "torch.cuda.streams"
    cuda_stream = 0x1234


class CupyLike:
    __module__ = "cupy.cuda.stream"
    ptr = 0x5678


class NumbaLike:
    __module__ = "numba.cuda.cudadrv.driver"
    handle = ctypes.c_void_p(0x9ABC)


class CUstream:
    """cuda-python's driver handle type, as numba-cuda's streams hold it."""
    __module__ = "cuda.bindings.driver"

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value


class NumbaBindingLike:
    __module__ = "numba.cuda.cudadrv.driver"
    handle = CUstream(0x7A5C)


class Protocol:
    def __cuda_stream__(self):
        return (0, 0xDEF0)


def test_handles():
    assert as_handle(None) == 0
    assert as_handle(memres.Stream.from_handle(9)) == 9
    assert as_handle(TorchLike()) == 0x1234
    assert as_handle(CupyLike()) == 0x5678
    assert as_handle(NumbaLike()) == 0x9ABC
    assert as_handle(NumbaBindingLike()) == 0x7A5C
    assert as_handle(Protocol()) == 0xDEF0
    assert memres.DEFAULT_STREAM == memres.Stream.from_handle(0)
    assert memres.Stream(CupyLike()) == memres.Stream.from_handle(0x5678)
    assert memres.Stream(memres.Stream(Protocol())).handle == 0xDEF0
    assert int(memres.Stream.from_handle(0x10)) == 0x10


@pytest.mark.parametrize("bad", [0, 7, -1, 1 << 64, True, False, "s", 1.0, object()])
def test_what_is_not_a_stream_is_a_type_error_that_says_what_to_pass(bad):
    # As RMM: its Stream(obj) raises TypeError for an int, and its methods
    # take a Stream. A bare int would be handed to the driver as a handle.
    for make in (as_handle, memres.Stream):
        with pytest.raises(TypeError, match=r"memres\.Stream.*__cuda_stream__.*None.*from_handle"):
            make(bad)


def test_an_address_is_not_a_stream_whatever_its_attribute():
    # A framework's attribute counts on that framework's streams only: a
    # buffer's `ptr` is an address, which memres would have handed to the
    # driver as a stream.
    buf = memres.DeviceBuffer.to_device(b"abc", mr=mr.HostMemoryResource())
    others = [buf, types.SimpleNamespace(ptr=0x5678), types.SimpleNamespace(cuda_stream=0x1234),
              types.SimpleNamespace(handle=ctypes.c_void_p(0x9ABC))]
    for bad in others:
        for make in (as_handle, memres.Stream):
            with pytest.raises(TypeError, match="is not a stream"):
                make(bad)
    with pytest.raises(TypeError, match="is not a stream"):
        memres.DeviceBuffer(size=10, stream=buf, mr=mr.HostMemoryResource())


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (1 << 64, ValueError), (True, TypeError),
                                        ("7", TypeError), (7.0, TypeError), (None, TypeError)])
def test_from_handle_takes_an_int_a_handle_can_be(bad, error):
    with pytest.raises(error):
        memres.Stream.from_handle(bad)


@pytest.mark.parametrize("value", [-1, 1 << 64, "7", None, 1.5])
def test_a_framework_handle_that_cannot_be_one_is_refused(value):
    class Odd:
        def __cuda_stream__(self):
            return (0, value)

    with pytest.raises((TypeError, ValueError)):
        as_handle(Odd())


@pytest.mark.parametrize("value", [(), (0,), (0, 5, 6)])
def test_a_stream_protocol_tuple_of_another_length_is_a_clear_error(value):
    # It was unpacked as it came: "not enough values to unpack".
    class Odd:
        def __cuda_stream__(self):
            return value

    with pytest.raises(ValueError, match=r"memres: __cuda_stream__\(\) must return \(version, handle\)"):
        as_handle(Odd())


def test_a_stream_keeps_the_framework_stream_it_wraps_alive():
    import gc
    import weakref
    s = CupyLike()  # cupy's Stream destroys its handle when collected
    alive = weakref.ref(s)
    wrapped = memres.Stream(s)
    del s
    gc.collect()
    assert alive() is not None
    del wrapped
    gc.collect()
    assert alive() is None


def test_resources_take_stream_objects():
    pool = memres.mr.PoolMemoryResource(memres.mr.SimulatedMemoryResource(1 << 30))
    p = pool.allocate(100, stream=TorchLike())
    pool.deallocate(p, 100, stream=CupyLike())
    p = pool.allocate(100, stream=memres.Stream.from_handle(0x1234))
    pool.deallocate(p, 100, stream=memres.Stream(NumbaLike()))
    with pytest.raises(TypeError):
        pool.allocate(100, stream="default")


def _setup():
    """A tracked, counted pool of host memory with a buffer and a block of
    it: what the entry points below are called on."""
    stats = mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(mr.HostMemoryResource()))
    t = mr.TrackingResourceAdaptor(stats)
    return types.SimpleNamespace(t=t, stats=stats, pool=stats.upstream_mr,
                                 buf=memres.DeviceBuffer.to_device(b"abcd", mr=t),
                                 src=memres.DeviceBuffer.to_device(b"xy", mr=t),
                                 block=t.allocate(100))


def _state(c):
    """What a refused call must leave as it was."""
    return (c.t.get_outstanding_count(), c.t.get_allocated_bytes(), c.stats.allocation_counts,
            c.pool.pool_size(), c.t.steps(), c.buf.size, c.buf.capacity(), bytes(c.buf.copy_to_host()))


# Every public entry point that takes ``stream=``, each given the stream ``s``.
ENTRY_POINTS = {
    "DeviceBuffer": lambda c, s: memres.DeviceBuffer(size=10, stream=s, mr=c.t),
    "DeviceBuffer.to_device": lambda c, s: memres.DeviceBuffer.to_device(b"abc", stream=s, mr=c.t),
    "DeviceBuffer.resize": lambda c, s: c.buf.resize(64, stream=s),
    "DeviceBuffer.reserve": lambda c, s: c.buf.reserve(1000, stream=s),
    "DeviceBuffer.copy_to_host": lambda c, s: c.buf.copy_to_host(stream=s),
    "DeviceBuffer.tobytes": lambda c, s: c.buf.tobytes(stream=s),
    "DeviceBuffer.copy_from_host": lambda c, s: c.buf.copy_from_host(b"xy", stream=s),
    "DeviceBuffer.copy_from_device": lambda c, s: c.buf.copy_from_device(c.src, stream=s),
    "DeviceBuffer.prefetch": lambda c, s: c.buf.prefetch(device=0, stream=s),
    "allocate": lambda c, s: c.t.allocate(100, stream=s),
    "deallocate": lambda c, s: c.t.deallocate(c.block, 100, stream=s),
    "step": lambda c, s: c.t.step(stream=s),
    "release": lambda c, s: c.t.release(stream=s),
}


@pytest.mark.parametrize("bad", [12345, 0, True])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_stream_parameter_refuses_a_bare_int_and_changes_nothing(entry, bad):
    c = _setup()
    before = _state(c)
    with pytest.raises(TypeError, match="from_handle"):
        ENTRY_POINTS[entry](c, bad)
    assert _state(c) == before
    c.t.deallocate(c.block, 100)  # still outstanding: the refused call did not free it


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_stream_parameter_takes_a_wrapped_handle(entry):
    c = _setup()
    made = ENTRY_POINTS[entry](c, memres.Stream.from_handle(0x1234))
    outstanding = 3 + (entry in ("DeviceBuffer", "DeviceBuffer.to_device", "allocate"))
    assert c.t.get_outstanding_count() == outstanding - (entry == "deallocate")
    assert bytes(c.buf.copy_to_host())[:2] == (b"xy" if entry.startswith("DeviceBuffer.copy_from") else b"ab")
    if entry == "allocate":
        c.t.deallocate(made, 100, stream=memres.Stream.from_handle(0x1234))


def test_a_stack_keeps_its_stream_objects_alive_as_long_as_it_lives():
    class Handle:  # a stream object as torch's or cupy's: its handle dies with it
        def __init__(self, handle):
            self.handle_value = handle

        def __cuda_stream__(self):
            return (0, self.handle_value)

    import gc
    import weakref
    s = Handle(7)
    alive = weakref.ref(s)
    res = mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True)  # a pool per stream remembers it
    res.allocate(100, stream=s)
    mr.set_current_device_resource(res)
    del s
    mr._current.clear()  # the Python side lets go; the device registry still holds the stack
    del res
    gc.collect()
    assert alive() is not None
    mr.set_current_device_resource(mr.HostMemoryResource())  # and now the registry too
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("call", ["allocate", "deallocate nbytes", "deallocate ptr"])
def test_a_call_refused_for_its_size_keeps_no_stream(call):
    # The stream was kept (for the stack's life) before the size was checked.
    res = mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True)  # a stack that keeps streams
    p = res.allocate(100)

    def refused(s):
        with pytest.raises(OverflowError, match="must be an int"):
            if call == "allocate":
                res.allocate(-1, stream=s)
            elif call == "deallocate nbytes":
                res.deallocate(p, -1, stream=s)
            else:
                res.deallocate(-1, 100, stream=s)

    assert not kept_after(refused)
    res.deallocate(p, 100)
    assert res._native.live_count() == 0


class FrameworkStream:
    """A stream object as torch's or cupy's: its handle dies with it."""

    def __init__(self, handle):
        self.handle_value = handle

    def __cuda_stream__(self):
        return (0, self.handle_value)


def kept_after(call, handle=7):
    """Whether the stream object ``call`` is given (a new
    ``FrameworkStream`` of ``handle``) outlives the call once the caller
    lets it go: a stack kept it."""
    s = FrameworkStream(handle)
    alive = weakref.ref(s)
    call(s)
    del s
    gc.collect()
    return alive() is not None


@pytest.mark.parametrize("call", ["allocate too large", "deallocate unknown", "deallocate other size",
                                  "buffer too large", "buffer without bytes"])
def test_a_call_refused_before_the_stack_keeps_no_stream(call):
    # Refused before the stack saw the stream (a size past what any
    # resource serves, a free of no live block, a buffer of a resource with
    # no bytes), the call still kept its stream object for the stack's life.
    upstream = mr.SimulatedMemoryResource() if call == "buffer without bytes" else mr.HostMemoryResource()
    res = mr.PoolMemoryResource(upstream, per_stream=True)  # a stack that keeps streams
    p = res.allocate(100)

    def refused(s):
        with pytest.raises((memres.OutOfMemory, memres.InvalidArgument, ValueError)):
            if call == "allocate too large":
                res.allocate(1 << 63, stream=s)
            elif call == "deallocate unknown":
                res.deallocate(p + 4096, 100, stream=s)
            elif call == "deallocate other size":
                res.deallocate(p, 99, stream=s)
            elif call == "buffer too large":
                memres.DeviceBuffer(size=1 << 63, stream=s, mr=res)
            else:
                memres.DeviceBuffer(size=10, stream=s, mr=res)

    assert not kept_after(refused)
    res.deallocate(p, 100)
    assert res._native.live_count() == 0


@pytest.mark.parametrize("make", ["size 0", "no bytes"])
def test_an_empty_buffer_keeps_no_stream(make):
    # An empty buffer reaches no resource, as allocate(0); it kept its
    # stream object for the stack's life.
    res = mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True)  # a stack that keeps streams

    def empty(s):
        if make == "size 0":
            memres.DeviceBuffer(size=0, stream=s, mr=res)
        else:
            memres.DeviceBuffer.to_device(b"", stream=s, mr=res)

    assert not kept_after(empty)
    assert kept_after(lambda s: memres.DeviceBuffer(size=10, stream=s, mr=res)), "a buffer with bytes keeps it"


@pytest.mark.parametrize("grow", ["resize", "reserve"])
def test_an_empty_buffer_that_grows_keeps_its_stream(grow):
    # Made empty, the buffer kept no stream; its growth is the stack's
    # first sight of it, and a pool per stream remembers it from then on.
    res = mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True)  # a stack that keeps streams

    def grown(s):
        b = memres.DeviceBuffer(size=0, stream=s, mr=res)
        getattr(b, grow)(10)
        assert b.capacity() >= 10

    assert kept_after(grown)
    assert res._native.live_count() == 0, "the buffer freed its block"


def test_a_step_that_steps_nothing_keeps_no_stream():
    # step() kept its stream for the stack's life even where no planned
    # layer is in the chain (a pool per stream alone): one stream held per
    # handle for nothing.
    res = mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True)  # a stack that keeps streams
    assert not kept_after(lambda s: res.step(stream=s))
    # A planned stack remembers the stream of its step: that one is kept.
    planned = mr.StackMemoryResource("planned(pool(sim(1GiB)))", backend="sim")
    assert kept_after(lambda s: planned.step(stream=s), handle=8)


def test_a_step_refused_before_the_layers_keeps_no_stream():
    # A step() that raised kept its stream for the stack's life, though it
    # was refused before any planned layer saw it: here a step re-entering
    # the stack from a Python function under it.
    planned = mr.StackMemoryResource("planned(pool(sim(1GiB)))", backend="sim")
    stepping, refused = [], []

    def alloc(n):
        try:
            top.step(stream=stepping[0])
        except memres.MemresError as e:
            refused.append(str(e))
        return 1 << 40

    top = mr.BinningMemoryResource(planned)  # keeps streams: its planned layer does
    top.add_bin(4096, mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"))

    def allocate_stepping_on(s):
        stepping.append(s)
        p = top.allocate(4096)
        stepping.clear()
        top.deallocate(p, 4096)

    assert not kept_after(allocate_stepping_on)
    assert len(refused) == 1 and "re-entrant" in refused[0], refused
    # One that reaches the layers keeps it.
    assert kept_after(lambda s: top.step(stream=s), handle=8)


def test_a_stream_does_not_pickle_but_the_default_streams_do():
    # A handle is valid only in the process that has it (RMM's Stream does
    # not pickle); the default streams are every process's.
    class FrameworkStream:
        def __cuda_stream__(self):
            return (0, 0x5555DEADBEEF)

    for s in (memres.Stream.from_handle(5), memres.Stream(FrameworkStream()), memres.Stream()):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(s)
        assert copy.copy(s) is s and copy.deepcopy(s) is s
    for default in (memres.DEFAULT_STREAM, memres.LEGACY_DEFAULT_STREAM, memres.PER_THREAD_DEFAULT_STREAM):
        for s in (default, memres.Stream.from_handle(default.handle)):
            assert pickle.loads(pickle.dumps(s)) is default  # not a new stream


def test_stream_makes_a_new_stream_as_rmms():
    # RMM's `Stream()` and `Stream(None)` make a stream; here, without CUDA,
    # one of the simulated device: a handle no other stream has.
    a, b = memres.Stream(), memres.Stream(None)
    assert a.handle not in (0, 1, 2, b.handle) and not a.is_default() and not b.is_default()
    assert a != memres.DEFAULT_STREAM and a == memres.Stream(a) and memres.Stream(a).handle == a.handle
    res = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    buf = memres.DeviceBuffer.to_device(b"on a made stream", stream=a, mr=res)
    ptr = res.allocate(100, stream=b)
    res.deallocate(ptr, 100, stream=b)
    a.synchronize()
    assert buf.tobytes() == b"on a made stream" and res.allocation_counts.current_count == 1


def test_a_made_stream_lives_as_long_as_what_uses_it():
    import gc
    import weakref
    s = memres.Stream()
    made = weakref.ref(s._owner)
    wrapped = memres.Stream(s)
    res = mr.PoolMemoryResource(mr.HostMemoryResource(), per_stream=True)
    buf = memres.DeviceBuffer(size=8, stream=s, mr=res)
    del s
    gc.collect()
    assert made() is not None  # the wrapping Stream and the buffer hold it
    del wrapped, buf
    gc.collect()
    assert made() is not None  # the resource, given it, holds it
    del res
    gc.collect()
    assert made() is None


@pytest.mark.parametrize("kind", ["host", "pool", "stats(pool)", "binning", "per-stream pool", "arena",
                                  "pool over a per-stream pool", "callback"])
def test_only_a_stack_that_remembers_streams_keeps_their_objects(kind):
    # A stream made per call (as RMM's examples do) is let go when nothing
    # remembers it: only stream-ordered layers (a pool per stream, the
    # arena) and Python callbacks keep their streams' objects.
    import gc
    import weakref
    host = mr.HostMemoryResource()
    res = {
        "host": lambda: host,
        "pool": lambda: mr.PoolMemoryResource(host),
        "stats(pool)": lambda: mr.StatisticsResourceAdaptor(mr.PoolMemoryResource(host)),
        "binning": lambda: mr.BinningMemoryResource(mr.PoolMemoryResource(host), 8, 12),
        "per-stream pool": lambda: mr.PoolMemoryResource(host, per_stream=True),
        "arena": lambda: mr.ArenaMemoryResource(host),
        "pool over a per-stream pool": lambda: mr.PoolMemoryResource(mr.PoolMemoryResource(host, per_stream=True)),
        "callback": lambda: mr.CallbackMemoryResource(host.allocate, host.deallocate, backend="sim"),
    }[kind]()
    made = []
    for _ in range(20):
        s = memres.Stream()
        made.append(weakref.ref(s._owner))
        res.deallocate(res.allocate(1000, stream=s), 1000, stream=s)
        buf = memres.DeviceBuffer(size=10, stream=s, mr=res) if kind != "callback" else None
        del s, buf
    gc.collect()
    kept = sum(m() is not None for m in made)
    remembers = kind in ("per-stream pool", "arena", "pool over a per-stream pool", "callback")
    assert kept == (20 if remembers else 0), kind
    assert res._native.keeps_streams == remembers, "a chain that keeps none is not asked"
    del res
    gc.collect()
    assert all(m() is None for m in made), "every stream goes with the stack that kept it"


def deferred_frees_on_streams_made_for_them(A, stream_of, bin_backend):
    """Frees into ``A`` deferred from inside a callback (a binning layer
    over ``A`` holds its call while its bin's ``allocate_func`` runs): a
    collected buffer's, and a ``deallocate`` on a stream made for the call.
    Returns ``A``'s bytes in use when each stream's object died."""
    bytes_when_dead = []

    class OwnStream:  # as a cupy.cuda.Stream or memres.Stream(): its handle dies with it
        def __init__(self):
            self.made = stream_of()

        def __cuda_stream__(self):
            return self.made.__cuda_stream__()

        def __del__(self):
            bytes_when_dead.append(A.allocation_counts.current_bytes)

    p = A.allocate(100)
    holder = [memres.DeviceBuffer(size=100, mr=A, stream=OwnStream())]

    def alloc(n, stream):
        holder.clear()                              # the buffer collected here
        A.deallocate(p, 100, stream=OwnStream())    # a stream made for the call
        return 0x10000

    T = mr.BinningMemoryResource(A)
    T.add_bin(256, mr.CallbackMemoryResource(alloc, lambda p, n, s: None, backend=bin_backend))
    T.allocate(200)
    assert A.allocation_counts.current_bytes == 0  # both frees applied once the call returned
    return bytes_when_dead


def test_a_deferred_free_keeps_its_streams_object_until_it_is_applied():
    # Over a stack that forgets streams nothing but the free keeps the
    # stream's object; each died, and its handle with it, while its block
    # was still to be freed on it.
    A = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    assert not A._native.keeps_streams
    assert deferred_frees_on_streams_made_for_them(A, memres.Stream, "sim") == [0, 0]


def test_a_deferred_free_on_a_stream_made_for_it_is_queued_on_the_live_stream(gpu, capfd):
    # `cuMemFreeAsync` on the handle of a destroyed stream, or of a new one
    # that took its handle.
    A = mr.StatisticsResourceAdaptor(mr.CudaAsyncMemoryResource())
    assert deferred_frees_on_streams_made_for_them(A, memres.Stream, "cuda") == [0, 0]
    assert "failed" not in capfd.readouterr().err


class Model:
    """A garbage cycle (through its bound method, as a model's hook) that
    holds a MiB buffer of ``res`` and the stream ``s`` it is on."""

    def __init__(self, s, res):
        self.stream = s
        self.buf = memres.DeviceBuffer(size=1 << 20, stream=s, mr=res)
        self.hook = self.forward

    def forward(self):
        pass


def test_a_buffer_in_a_cycle_through_its_stream_is_collected_after_its_block_is_freed():
    # The collector clears a cycle's objects in no set order: clearing the
    # `Stream` destroyed the stream it made while the buffer's block was
    # still to be freed on it.
    import gc
    import weakref
    stats = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    bytes_when_destroyed = []

    class Keeper(memres.Stream):  # a stream that keeps what is made on it
        def __init__(self):
            super().__init__()
            self.buffers = []

    def collected(cycle):
        """The bytes in use when the stream of the garbage cycle that
        ``cycle()`` makes (returning the cycle's stream) was destroyed."""
        s = cycle()
        weakref.finalize(s._owner, lambda: bytes_when_destroyed.append(stats.allocation_counts.current_bytes))
        del s
        gc.collect()
        assert stats.allocation_counts.current_bytes == 0 and len(bytes_when_destroyed) == 1
        return bytes_when_destroyed.pop()

    def keeper():
        k = Keeper()
        k.buffers.append(memres.DeviceBuffer(size=100, mr=stats, stream=k))
        return k

    def model():
        s = memres.Stream()
        Model(s, stats)
        return s

    assert collected(keeper) == 0
    assert collected(model) == 0


def test_a_foreign_stream_object_is_finalized_only_after_the_buffers_block_is_freed():
    # A framework's stream destroys its handle in its finalizer, which the
    # collector ran while a buffer's block was still to be freed on it.
    import gc
    import weakref
    stats = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    bytes_when_dead = []

    class Foreign:  # as a cupy.cuda.Stream: its handle dies with it
        def __init__(self):
            self.made = memres.Stream()
            self.buffers = []

        def __cuda_stream__(self):
            return self.made.__cuda_stream__()

        def __del__(self):
            bytes_when_dead.append(stats.allocation_counts.current_bytes)

    # A cycle that holds a buffer and its stream: collected, the stream after.
    for wrap in (lambda f: f, memres.Stream):
        m = Model(wrap(Foreign()), stats)
        del m
        gc.collect()
        assert bytes_when_dead == [0] and stats.allocation_counts.current_bytes == 0
        bytes_when_dead.clear()
    # A cycle through the stream object itself is not collected (a leak,
    # where collecting it could destroy the stream first) until broken.
    f = Foreign()
    f.buffers.append(memres.DeviceBuffer(size=100, mr=stats, stream=f))
    alive = weakref.ref(f)
    del f
    gc.collect()
    assert alive() is not None and bytes_when_dead == []
    assert stats.allocation_counts.current_bytes == 100
    alive().buffers.clear()
    gc.collect()
    assert alive() is None and bytes_when_dead == [0]


def test_a_stream_pool_hands_out_its_streams_in_turn_as_rmms():
    pool = memres.CudaStreamPool(3)
    assert pool.get_pool_size() == 3
    taken = [pool.get_stream() for _ in range(7)]
    handles = [s.handle for s in taken]
    assert len(set(handles)) == 3 and handles[3:6] == handles[:3] and handles[6] == handles[0]
    assert not any(s.is_default() for s in taken)
    assert [pool.get_stream(i).handle for i in range(3)] == handles[:3]
    assert memres.CudaStreamPool().get_pool_size() == 16  # RMM's default
    # Any id, taken modulo the pool's size, as RMM's (which refused none:
    # an id of a task, `get_stream(task)`, was refused from 3 on).
    assert [pool.get_stream(i).handle for i in (3, 4, 2**64 + 2)] == [handles[0], handles[1], handles[(2**64 + 2) % 3]]
    for bad, error in ((-1, ValueError), (1.0, TypeError), (True, TypeError), ("1", TypeError)):
        with pytest.raises(error):
            pool.get_stream(bad)
    for size, error in ((0, ValueError), (-2, ValueError), (2.5, TypeError)):
        with pytest.raises(error):
            memres.CudaStreamPool(size)
    with pytest.raises(ValueError, match="CudaStreamFlags"):
        memres.CudaStreamPool(2, flags=7)
    # As RMM's: flags are for a stream memres makes.
    assert not memres.Stream(flags=memres.CudaStreamFlags.NON_BLOCKING).is_default()
    with pytest.raises(ValueError, match="flags may only be specified when obj is None"):
        memres.Stream(memres.Stream(), flags=memres.CudaStreamFlags.NON_BLOCKING)
    # Its streams serve buffers, and live while a buffer holds one.
    res = mr.HostMemoryResource()
    buf = memres.DeviceBuffer.to_device(b"pooled", stream=pool.get_stream(1), mr=res)
    del pool, taken
    assert buf.tobytes() == b"pooled"


def test_a_stream_speaks_rmms_methods_and_the_stream_protocol():
    assert memres.DEFAULT_STREAM.is_default() and memres.LEGACY_DEFAULT_STREAM.is_default()
    # As RMM's built without per-thread default streams, as its wheels are
    # (`cuda_stream_view::is_default`): the per-thread stream is not the
    # default (it said it was).
    assert not memres.PER_THREAD_DEFAULT_STREAM.is_default()
    assert (memres.LEGACY_DEFAULT_STREAM.handle, memres.PER_THREAD_DEFAULT_STREAM.handle) == (1, 2)
    other = memres.Stream.from_handle(0x1234)
    assert not other.is_default()
    assert other.__cuda_stream__() == (0, 0x1234)
    # A consumer of the protocol reads the handle from it.
    assert as_handle(types.SimpleNamespace(__cuda_stream__=other.__cuda_stream__)) == 0x1234


def test_the_default_streams_serve_allocations(gpu):
    res = mr.CudaMemoryResource()
    for stream in (memres.DEFAULT_STREAM, memres.LEGACY_DEFAULT_STREAM, memres.PER_THREAD_DEFAULT_STREAM):
        buf = memres.DeviceBuffer.to_device(b"on a default stream", stream=stream, mr=res)
        stream.synchronize()
        assert buf.tobytes() == b"on a default stream"


def test_stream_makes_a_cuda_stream_that_the_driver_and_frameworks_see(gpu):
    import gc
    import weakref
    cuda = ctypes.CDLL("libcuda.so.1")
    s = memres.Stream()
    assert not s.is_default() and s.handle not in (0, 1, 2)
    # A live stream of the driver, made blocking (flags 0) as RMM's.
    flags = ctypes.c_uint(99)
    assert cuda.cuStreamGetFlags(ctypes.c_void_p(s.handle), ctypes.byref(flags)) == 0 and flags.value == 0
    res = mr.PoolMemoryResource(mr.CudaMemoryResource(), per_stream=True)
    buf = memres.DeviceBuffer.to_device(b"on a made stream" * 1000, stream=s, mr=res)
    made = weakref.ref(s._owner)
    handle = s.handle
    del s
    gc.collect()
    assert made() is not None
    # The buffer keeps the stream: its handle still names a live stream,
    # which CuPy and PyTorch can order work on.
    assert cuda.cuStreamQuery(ctypes.c_void_p(handle)) in (0, 600)  # done or not ready
    try:
        import cupy
        with cupy.cuda.ExternalStream(handle):
            doubled = cupy.arange(4) * 2
        cupy.cuda.ExternalStream(handle).synchronize()
        assert doubled.tolist() == [0, 2, 4, 6]
    except ImportError:
        pass
    assert buf.tobytes() == b"on a made stream" * 1000
    memres.Stream.from_handle(handle).synchronize()


def test_a_stream_pool_makes_streams_with_rmms_flags(gpu):
    cuda = ctypes.CDLL("libcuda.so.1")

    def flags_of(stream):
        flags = ctypes.c_uint(99)
        assert cuda.cuStreamGetFlags(ctypes.c_void_p(stream.handle), ctypes.byref(flags)) == 0
        return flags.value

    for flags in memres.CudaStreamFlags:
        pool = memres.CudaStreamPool(2, flags)
        assert [flags_of(pool.get_stream(i)) for i in range(2)] == [int(flags)] * 2
    assert flags_of(memres.Stream()) == 0
    assert flags_of(memres.Stream(flags=memres.CudaStreamFlags.NON_BLOCKING)) == 1


def test_a_later_version_of_the_stream_protocol_is_refused_as_rmms():
    class V1:
        def __cuda_stream__(self):
            return (1, 2)

    with pytest.raises(NotImplementedError, match="version: '1'"):
        memres.Stream(V1())
