"""The C functions PyTorch's CUDAPluggableAllocator loads, over the
current resource (here on the simulated backend's module)."""

import ctypes
import inspect
import shutil
import subprocess
import sys
import textwrap
import threading

import pytest

import memres
from memres import _native, mr
from conftest import OddError

MiB = 1 << 20
from test_reentry import FREE_PANICS_ONCE, run_child


def lib(load=ctypes.CDLL):
    """The simulated backend's module with the C functions' signatures, as
    PyTorch calls them (ctypes.PyDLL: with the GIL held)."""
    so = load(_native.sim.__file__)
    so.memres_py_alloc.restype = ctypes.c_void_p
    so.memres_py_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    so.memres_py_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    return so


# The head of a child's code that calls the C functions: `lib` as here.
CHILD_LIB = "import ctypes\nfrom memres import _native, mr\n" + inspect.getsource(lib)


def alloc_and_free_on_each(so, resources, nbytes):
    """Makes each of ``resources`` (device to resource) its device's, and
    allocates and frees ``nbytes`` there through the C functions."""
    for d, r in resources.items():
        mr.set_per_device_resource(d, r)
        p = so.memres_py_alloc(nbytes, d, None)
        assert p, d
        so.memres_py_free(p, nbytes, d, None)


def test_alloc_and_free_go_to_the_current_resource_and_back_to_their_own():
    so = lib()
    first = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    mr.set_current_device_resource(first)
    p = so.memres_py_alloc(1000, 0, None)
    assert p and first.allocation_counts.current_bytes == 1000
    assert _native.sim.c_live_count(0) == 1
    second = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    mr.set_current_device_resource(second)
    q = so.memres_py_alloc(10, 0, None)
    assert second.allocation_counts.current_bytes == 10
    so.memres_py_free(p, 1000, 0, None)  # back to `first`, not the current one
    so.memres_py_free(q, 10, 0, None)
    assert first.allocation_counts.current_bytes == 0
    assert second.allocation_counts.current_bytes == 0
    assert _native.sim.c_live_count(0) == 0


def test_the_reset_function_gives_back_what_every_devices_pools_keep():
    # What torch.cuda.empty_cache() calls once memres is PyTorch's allocator
    # (memres.allocators.torch gives it as the allocator's reset function).
    so = lib()
    res = {0: mr.StackMemoryResource("pool(host, per_stream=true)", backend="sim", device=0),
           1: mr.StackMemoryResource("vpool(sim(1GiB))", backend="sim", device=1)}
    alloc_and_free_on_each(so, res, 8 * MiB)
    assert res[0]._native.pool_size() >= 8 * MiB
    so.memres_py_empty_cache()
    assert res[0]._native.pool_size() == 0
    # The virtual pool's granules were unmapped: nothing is left to give.
    assert res[1].release() == 0
    # Undone, it would have given its 8 MiB back here.
    p = so.memres_py_alloc(8 * MiB, 1, None)
    so.memres_py_free(p, 8 * MiB, 1, None)
    assert res[1].release() == 8 * MiB


def test_the_reset_function_releases_every_device_though_one_refuses(monkeypatch):
    # The first device whose release raised ended it: the devices after it
    # kept what their pools held. As the C library's memres_empty_cache,
    # every device is released and the first error reported at the end.
    so = lib()
    chunks = iter(range(1 << 30, 1 << 40, 1 << 30))

    def refuse(p, n):
        raise RuntimeError("this free is refused")

    res = {0: mr.PoolMemoryResource(mr.CallbackMemoryResource(lambda n: next(chunks), refuse,
                                                              backend="sim", device=0)),
           1: mr.StackMemoryResource("pool(host)", backend="sim", device=1)}
    alloc_and_free_on_each(so, res, 8 * MiB)
    assert list(mr._current)[:2] == [0, 1]  # device 0's release runs first
    assert res[1]._native.pool_size() >= 8 * MiB
    told = []
    monkeypatch.setattr(sys, "unraisablehook", told.append)
    so.memres_py_empty_cache()
    assert res[1]._native.pool_size() == 0
    [said] = told
    assert "this free is refused" in repr(said.exc_value) + repr(said.exc_value.__cause__)


def test_a_device_nobody_gave_a_resource_gets_the_c_librarys_default_stack_for_python_too():
    # Device 41: no other test sets it (what a test sets is forgotten at its end,
    # but a default the C functions made that Python did not take stays).
    import memres.allocators.torch as mt
    so = lib()
    assert _native.sim.C_DEFAULT_STACK == mt.DEFAULT_STACK.replace("pool(cuda,", "pool(host,")
    p = so.memres_py_alloc(1000, 41, None)
    assert p
    res = mr.get_per_device_resource(41)  # the one the C functions made, not another
    assert res.stack == _native.sim.C_DEFAULT_STACK
    assert res._native.statistics()[0][0] == 1000  # bytes in use
    so.memres_py_free(p, 1000, 41, None)
    assert res._native.statistics()[0][0] == 0
    assert mr.get_per_device_resource(41) is res


def test_the_reset_function_reaches_a_default_the_c_functions_made():
    so = lib()
    p = so.memres_py_alloc(8 * MiB, 42, None)
    so.memres_py_free(p, 8 * MiB, 42, None)
    so.memres_py_empty_cache()
    assert 42 in mr._current and mr._current[42].release() == 0


def test_the_c_functions_let_go_of_a_devices_resource_once_the_other_backend_has_the_device():
    # Device 43: no other test sets it. `set_other_backend` is what setting
    # a CUDA resource for the device does to this (simulated) module.
    import gc
    from memres.statistics import get_device_statistics

    def held():
        return get_device_statistics(43, backend="sim").current_bytes

    so = lib()
    base = held()
    mr.set_per_device_resource(43, mr.StackMemoryResource("pool(host, initial=1MiB)", backend="sim", device=43))
    p = so.memres_py_alloc(1000, 43, None)
    mr._current.clear()
    gc.collect()
    assert held() == base + MiB  # the C functions' registry holds it
    _native.sim.set_other_backend(43)
    _native.sim.last_error(clear=True)
    assert so.memres_py_alloc(10, 43, None) is None
    assert "current resource is a CUDA one" in _native.sim.last_error(clear=True)
    assert held() == base + MiB  # its block keeps it
    so.memres_py_free(p, 1000, 43, None)  # back to its own resource, which goes with it
    assert held() == base


def test_a_devices_resource_is_taken_from_the_other_backends_c_functions(monkeypatch):
    import types
    told = []
    monkeypatch.setattr(_native, "_cuda", types.SimpleNamespace(set_other_backend=told.append,
                                                                take_default=lambda device: None))
    mr.set_per_device_resource(44, mr.HostMemoryResource(device=44))
    assert told == [44]


def test_reinitialize_forgets_the_resources_of_the_devices_it_was_not_given():
    # As RMM's, which clears every device's resource first. Device 45: no
    # other test sets it. The resource of device 45 stayed, for Python and
    # for the C functions.
    so = lib()
    memres.reinitialize(devices=[0, 45], stack="stats(pool(host))")
    old = mr.get_per_device_resource(45)
    memres.reinitialize(stack="host")
    assert 45 not in mr._current
    p = so.memres_py_alloc(1000, 45, None)
    assert p and old._native.statistics()[0][0] == 0
    res = mr.get_per_device_resource(45)  # the default the C functions made
    assert res is not old and res.stack == _native.sim.C_DEFAULT_STACK
    so.memres_py_free(p, 1000, 45, None)
    mr._forget(45)


def test_a_default_stack_that_cannot_be_built_says_why():
    # Device 46: no other test sets it. The reason was the registry's fixed
    # text, "the device's default resource could not be built", without
    # the build's error.
    so = lib()
    _native.sim.set_c_default_stack("pool(cuda)")  # no `cuda` leaf on the simulated backend
    try:
        _native.sim.last_error(clear=True)
        assert so.memres_py_alloc(1000, 46, None) is None
        why = _native.sim.last_error(clear=True)
        assert _native.sim.c_live_count(46) == 0
    finally:
        _native.sim.set_c_default_stack(None)
    assert why.startswith("memres_py_alloc(1000 bytes, device 46): "), why
    assert "the device's default resource could not be built: memres: stack `pool(cuda)`: " in why, why
    assert "`cuda`" in why.split("stack `pool(cuda)`: ", 1)[1], why
    # Nothing was made: the next allocation builds the C library's default.
    p = so.memres_py_alloc(1000, 46, None)
    assert p and _native.sim.last_error() is None
    res = mr.get_per_device_resource(46)
    assert res.stack == _native.sim.C_DEFAULT_STACK
    so.memres_py_free(p, 1000, 46, None)
    mr._forget(46)


def test_a_default_stack_failing_on_one_thread_does_not_hang_an_allocation_holding_the_gil():
    # A thread without the GIL (ctypes.CDLL releases it) makes the device's
    # default under its lock, and its build fails; the main thread calls
    # with the GIL held (ctypes.PyDLL, as PyTorch may), and no Python
    # callback was ever built, so it keeps the GIL while it waits for that
    # lock. The failing build took the GIL for its reason under the lock:
    # each waited for the other. In a child: no callback built, and a hang.
    run_child(CHILD_LIB + textwrap.dedent("""
        import sys, threading
        sys.setswitchinterval(0.05)  # the main thread keeps the GIL while it runs
        plain, holding = lib(), lib(ctypes.PyDLL)
        _native.sim.set_c_default_stack("pool(cuda)")  # no `cuda` leaf on the simulated backend
        N = 2000
        def without_gil():
            for _ in range(N):
                assert plain.memres_py_alloc(1000, 0, None) is None
        t = threading.Thread(target=without_gil)
        t.start()
        for _ in range(N):
            assert holding.memres_py_alloc(1000, 0, None) is None
        t.join()
        why = _native.sim.last_error()
        assert "could not be built: memres: stack `pool(cuda)`: " in why, why
        assert _native.sim.c_live_count(0) == 0
        print("done")
    """))


def test_a_configured_default_stack_serves_a_device_nobody_gave_a_resource():
    # Device 47: no other test sets it.
    so = lib()
    _native.sim.set_c_default_stack("stats(pool(host, initial=1MiB))")
    try:
        p = so.memres_py_alloc(1000, 47, None)
    finally:
        _native.sim.set_c_default_stack(None)
    assert p
    res = mr.get_per_device_resource(47)
    assert res.stack == "stats(pool(host, initial=1MiB))"
    assert res._native.statistics()[0][0] == 1000
    so.memres_py_free(p, 1000, 47, None)
    mr._forget(47)


def test_failures_are_null_and_unknown_frees_change_nothing_but_say_why():
    so = lib()
    mr.set_current_device_resource(mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 100))
    assert so.memres_py_alloc(1000, 0, None) is None
    assert so.memres_py_alloc(0, 0, None) is None
    assert so.memres_py_alloc(-5, 0, None) is None
    assert so.memres_py_alloc(10, 999, None) is None
    _native.sim.last_error(clear=True)
    so.memres_py_free(None, 10, 0, None)  # NULL: nothing to free, nothing failed
    assert _native.sim.last_error() is None
    # A free returns nothing to PyTorch: the reason is kept for Python.
    so.memres_py_free(0x1000, 10, 0, None)
    assert _native.sim.c_live_count(0) == 0
    why = _native.sim.last_error(clear=True)
    assert why.startswith("memres_py_free(0x1000, device 0): ") and "not allocated here" in why, why
    mr.set_current_device_resource(mr.HostMemoryResource())
    p = so.memres_py_alloc(64, 0, None)
    so.memres_py_free(p, 64, 0, None)
    assert _native.sim.last_error() is None
    so.memres_py_free(p, 64, 0, None)
    assert "freed already" in _native.sim.last_error(clear=True)


def test_a_failed_allocation_keeps_its_reason_for_python():
    # PyTorch's CUDAPluggableAllocator does not check for NULL: the reason
    # is what Python can learn.
    so = lib()
    _native.sim.last_error(clear=True)
    mr.set_current_device_resource(mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 100))
    assert so.memres_py_alloc(1000, 0, None) is None
    why = _native.sim.last_error()
    assert why.startswith("memres_py_alloc(1000 bytes, device 0): ") and "limit" in why, why
    # An empty tensor's allocation is NULL and no failure: the reason stays.
    assert so.memres_py_alloc(0, 0, None) is None
    assert _native.sim.last_error() == why
    assert so.memres_py_alloc(-5, 0, None) is None
    assert "negative size" in _native.sim.last_error(clear=True)
    assert _native.sim.last_error() is None


def test_a_failure_on_another_thread_is_the_reason_python_reads():
    # PyTorch's backward pass allocates on autograd's threads, and
    # DataParallel's replicas on threads of their own: the reason is one for
    # the process, read on the thread that checks (CUDA's is per thread).
    so = lib()
    _native.sim.last_error(clear=True)
    mr.set_current_device_resource(mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 100))
    t = threading.Thread(target=lambda: so.memres_py_alloc(1000, 0, None))
    t.start()
    t.join()
    why = _native.sim.last_error(clear=True)
    assert why is not None and why.startswith("memres_py_alloc(1000 bytes, device 0): "), why


# OddError: named through PyO3's `Display`, which fails for it, the reason
# was a panic's ("a panic"), and the exception was not said.
@pytest.mark.parametrize("error", [RuntimeError, OddError])
def test_a_failure_callbacks_exception_under_the_c_functions_is_said_and_named_in_the_reason(error):
    # PyTorch raises its own error for NULL: the callback's exception goes to
    # sys.unraisablehook, and the reason names it.
    so = lib()
    _native.sim.last_error(clear=True)

    def on_failure(nbytes):
        raise error("from the callback")

    limited = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 100)
    mr.set_current_device_resource(mr.FailureCallbackResourceAdaptor(limited, on_failure))
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        assert so.memres_py_alloc(1000, 0, None) is None
    finally:
        sys.unraisablehook = hook
    assert [str(e) for e in seen] == ["from the callback"]
    why = _native.sim.last_error(clear=True)
    assert f"the failure callback raised {error.__name__}: from the callback" in why, why
    # Nothing is left for the next call: a plain failure is its own.
    mr.set_current_device_resource(limited)
    assert so.memres_py_alloc(1000, 0, None) is None
    assert "failure callback" not in _native.sim.last_error(clear=True)


def test_a_python_functions_exception_under_the_c_functions_is_said_and_named_in_the_reason():
    # As a failure callback's: the reason said only "allocate_func raised"
    # (or "deallocate_func raised"), and the exception was lost unsaid.
    so = lib()
    _native.sim.last_error(clear=True)
    refuse = [True]

    def allocate(nbytes):
        raise RuntimeError("from allocate_func")

    def deallocate(ptr, nbytes):
        if refuse[0]:
            raise RuntimeError("from deallocate_func")

    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        mr.set_current_device_resource(mr.CallbackMemoryResource(allocate, deallocate, backend="sim"))
        assert so.memres_py_alloc(1000, 0, None) is None
        why_alloc = _native.sim.last_error(clear=True)
        mr.set_current_device_resource(mr.CallbackMemoryResource(lambda n: 1 << 40, deallocate, backend="sim"))
        p = so.memres_py_alloc(1000, 0, None)
        so.memres_py_free(p, 1000, 0, None)
        why_free = _native.sim.last_error(clear=True)
    finally:
        sys.unraisablehook = hook
    assert [str(e) for e in seen] == ["from allocate_func", "from deallocate_func"]
    assert "allocate_func raised (RuntimeError: from allocate_func)" in why_alloc, why_alloc
    assert "deallocate_func raised (RuntimeError: from deallocate_func)" in why_free, why_free
    assert _native.sim.c_live_count(0) == 1  # a refused free changes nothing
    refuse[0] = False
    so.memres_py_free(p, 1000, 0, None)
    assert _native.sim.c_live_count(0) == 0 and _native.sim.last_error() is None


def test_the_c_functions_name_no_exception_of_an_earlier_call():
    # A call that recovered from a function's exception (a failure callback
    # retried) leaves it behind: a later failure of the C functions for a
    # reason of its own must not name it.
    so = lib()
    raise_once = [True]

    def allocate(nbytes):
        if raise_once[0]:
            raise_once[0] = False
            raise MemoryError("once")
        return 1 << 40

    resource = mr.FailureCallbackResourceAdaptor(
        mr.CallbackMemoryResource(allocate, lambda p, n: None, backend="sim"), lambda nbytes: True)
    p = resource.allocate(1000)  # recovered: the retry served it
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        _native.sim.last_error(clear=True)
        so.memres_py_free(0xdead00, 8, 0, None)
        why = _native.sim.last_error(clear=True)
    finally:
        sys.unraisablehook = hook
    assert seen == [] and "MemoryError" not in why, why
    resource.deallocate(p, 1000)


def test_an_address_live_already_is_refused_and_the_new_block_given_back():
    # Two resources of the user's that hand out the same address.
    so = lib()
    _native.sim.last_error(clear=True)

    def same_address():
        return mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: None, backend="sim")

    a = mr.StatisticsResourceAdaptor(same_address())
    mr.set_current_device_resource(a)
    p = so.memres_py_alloc(1000, 0, None)
    b = mr.StatisticsResourceAdaptor(same_address())
    mr.set_current_device_resource(b)
    assert so.memres_py_alloc(1000, 0, None) is None
    assert "a live address" in _native.sim.last_error(clear=True)
    assert b.allocation_counts.current_bytes == 0  # given back
    assert a.allocation_counts.current_bytes == 1000 and _native.sim.c_live_count(0) == 1
    so.memres_py_free(p, 1000, 0, None)  # to `a`, whose block it is
    assert a.allocation_counts.current_bytes == 0 and _native.sim.c_live_count(0) == 0


@pytest.mark.parametrize("reset", ["memres_py_empty_cache", "memres.allocators.torch.empty_cache"])
def test_a_block_refused_back_at_a_live_address_is_kept_for_the_reset_functions(monkeypatch, reset):
    # Its give-back refused, the new block was lost: in neither the table
    # nor anywhere else, live in its stack for good. As the C library's, it
    # is kept, and the reset function (torch.cuda.empty_cache()) gives it
    # back; so does memres.allocators.torch.empty_cache(), which released
    # the pools alone.
    import memres.allocators.torch as mt
    so = lib()
    empty_cache = so.memres_py_empty_cache if reset == "memres_py_empty_cache" else lambda: mt.empty_cache(0)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    _native.sim.last_error(clear=True)
    refusing = [True]

    def dealloc(p, n):
        if refusing[0]:
            raise RuntimeError("this free is refused")

    a = mr.StatisticsResourceAdaptor(
        mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: None, backend="sim"))
    mr.set_current_device_resource(a)
    p = so.memres_py_alloc(1000, 0, None)
    b = mr.StatisticsResourceAdaptor(mr.CallbackMemoryResource(lambda n: 1 << 40, dealloc, backend="sim"))
    mr.set_current_device_resource(b)
    assert so.memres_py_alloc(1000, 0, None) is None
    why = _native.sim.last_error(clear=True)
    assert "a live address" in why and "kept to give back" in why, why
    assert b.allocation_counts.current_bytes == 1000
    empty_cache()  # still refused: kept again, and said
    why = _native.sim.last_error(clear=True)
    assert why and f"{reset}: device 0" in why and "this free is refused" in why, why
    assert b.allocation_counts.current_bytes == 1000
    refusing[0] = False
    empty_cache()
    assert _native.sim.last_error() is None
    assert b.allocation_counts.current_bytes == 0
    so.memres_py_free(p, 1000, 0, None)
    assert a.allocation_counts.current_bytes == 0 and _native.sim.c_live_count(0) == 0


def test_a_free_that_fails_below_leaves_the_block_freeable():
    # As `deallocate`'s: the block left the table for its free and came
    # back only on an error, so one whose free panicked below was never
    # freed.
    run_child(FREE_PANICS_ONCE + CHILD_LIB + textwrap.dedent("""
        so = lib()
        mr.set_current_device_resource(top)
        p = so.memres_py_alloc(4096, 0, None)
        assert p and _native.sim.c_live_count(0) == 1
        so.memres_py_free(p, 4096, 0, None)  # fails: nothing to tell its caller
        assert "memres_py_free" in _native.sim.last_error(clear=True)
        assert top.allocation_counts.current_count == 1  # live in the stack
        assert _native.sim.c_live_count(0) == 1
        so.memres_py_free(p, 4096, 0, None)
        assert top.allocation_counts.current_count == 0 and _native.sim.c_live_count(0) == 0
        print("done")
    """))


def test_a_free_of_another_size_than_the_allocations_is_refused():
    # The size was ignored: a free with any size freed the block, where the
    # C library's and `deallocate` refuse it.
    so = lib()
    top = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
    mr.set_current_device_resource(top)
    p = so.memres_py_alloc(1000, 0, None)
    _native.sim.last_error(clear=True)
    so.memres_py_free(p, 5, 0, None)
    why = _native.sim.last_error(clear=True)
    assert why and "freed with size 5, allocated with 1000" in why, why
    assert _native.sim.c_live_count(0) == 1 and top.allocation_counts.current_bytes == 1000
    so.memres_py_free(p, -1, 0, None)  # a negative size is not checked
    assert _native.sim.last_error() is None
    assert _native.sim.c_live_count(0) == 0 and top.allocation_counts.current_bytes == 0


def test_a_free_that_freed_and_then_failed_does_not_put_its_block_back_over_a_newer_one():
    # As `deallocate`'s: the failed free put its block back over the block
    # another thread was handed at the address meanwhile.
    so = lib()
    free, raise_once, newer, freed = [1 << 40], [False], [], []

    def dealloc(p, n):
        free.append(p)
        freed.append(n)
        if raise_once[0]:
            raise_once[0] = False
            t = threading.Thread(target=lambda: newer.append(so.memres_py_alloc(2000, 0, None)))
            t.start()
            t.join()
            raise RuntimeError("failed after freeing")

    mr.set_current_device_resource(mr.CallbackMemoryResource(lambda n: free.pop(), dealloc, backend="sim"))
    p = so.memres_py_alloc(1000, 0, None)
    raise_once[0] = True
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        so.memres_py_free(p, 1000, 0, None)
    finally:
        sys.unraisablehook = hook
    assert [str(e) for e in seen] == ["failed after freeing"]
    assert "deallocate_func raised (RuntimeError: failed after freeing)" in _native.sim.last_error(clear=True)
    assert newer == [p]
    so.memres_py_free(p, 2000, 0, None)
    assert _native.sim.last_error() is None and _native.sim.c_live_count(0) == 0
    assert freed == [1000, 2000], "the newer block's free reached the stack as the older's"


# A pthread key's destructor runs at its thread's exit after the thread's
# Rust locals are gone (glibc runs those first): a C++ `thread_local` or a
# library's key freeing a tensor there.
FREE_AT_THREAD_EXIT = r"""
#include <pthread.h>
#include <sys/types.h>
typedef void (*free_fn)(void *, ssize_t, int, void *);
static pthread_key_t key;
static free_fn fn;
static ssize_t bytes;
static void at_exit(void *p) { fn(p, bytes, 0, 0); }
void free_at_thread_exit(void *p, ssize_t size, free_fn f) {
    fn = f;
    bytes = size;
    pthread_key_create(&key, at_exit);
    pthread_setspecific(key, p);
}
"""


@pytest.mark.parametrize("callbacks", [False, True])
def test_a_free_from_a_threads_exit_frees_its_block(tmp_path, callbacks):
    # It panicked on a thread-local already destroyed (caught, but said on
    # standard error): after the free, as it dropped the stack its last
    # block held, or, with a Python callback anywhere, where it was to
    # note the call, before the free, and the block stayed live.
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "the tests need a C compiler (Rust's linker is one)"
    src, lib_path = tmp_path / "at_exit.c", tmp_path / "libat_exit.so"
    src.write_text(FREE_AT_THREAD_EXIT)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib_path), str(src), "-lpthread"], check=True)
    out = run_child(CHILD_LIB + textwrap.dedent(f"""
        import threading, time
        so = lib()
        at_exit = ctypes.CDLL({str(lib_path)!r})
        at_exit.free_at_thread_exit.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p]
        if {callbacks}:
            keep = mr.CallbackMemoryResource(lambda n: 1 << 40, lambda p, n: None, backend="sim")
        top = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
        mr.set_current_device_resource(top)
        _native.sim.last_error(clear=True)
        armed, go = threading.Event(), threading.Event()
        def worker():
            so.memres_py_free(so.memres_py_alloc(64, 0, None), 64, 0, None)  # its locals in use
            p = so.memres_py_alloc(1000, 0, None)
            at_exit.free_at_thread_exit(p, 1000, ctypes.cast(so.memres_py_free, ctypes.c_void_p).value)
            armed.set()
            go.wait()
        t = threading.Thread(target=worker)
        t.start()
        armed.wait()
        # The block holds the last reference to its stack: its free drops it.
        mr.set_current_device_resource(mr.HostMemoryResource())
        del top
        go.set()
        t.join()
        # The join returns once the thread's Python ends, before its exit.
        for _ in range(500):
            if _native.sim.c_live_count(0) == 0:
                break
            time.sleep(0.01)
        assert _native.sim.c_live_count(0) == 0, "the block stayed live"
        assert _native.sim.last_error() is None, _native.sim.last_error()
        print("done")
    """))
    assert "panicked" not in out.stderr, out.stderr


def test_a_free_with_the_gil_held_waits_for_the_pool_without_it():
    # PyTorch frees a tensor's storage holding the GIL (ctypes.PyDLL keeps
    # it). Another thread holds the pool's lock inside a Python callback
    # that needs the GIL: the free must not wait for the lock with it.
    code = CHILD_LIB + textwrap.dedent("""
        import threading, time
        so = lib(ctypes.PyDLL)
        inside = threading.Event()
        n = [0]
        def alloc(size):
            n[0] += 1
            if n[0] > 1:
                inside.set()
                time.sleep(0.5)  # the pool's lock is held meanwhile
            return (1 << 40) + (n[0] << 30)
        pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, s: None, backend="sim"),
                                     initial_pool_size=1 << 16)
        mr.set_current_device_resource(pool)
        p = so.memres_py_alloc(256, 0, None)
        t = threading.Thread(target=lambda: pool.allocate(1 << 21))
        t.start()
        inside.wait()
        so.memres_py_free(p, 256, 0, None)
        t.join()
        assert _native.sim.c_live_count(0) == 0
        print("done")
    """)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the free with the GIL held hung")
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stdout + out.stderr


def test_a_call_without_the_gil_begun_once_the_exit_began_runs_no_python():
    # A call from a thread that does not hold the GIL (ctypes.CDLL, as a
    # PyTorch autograd thread's) took the GIL for its stack's Python
    # function once memres's exit handler had run: CPython ends a thread
    # that takes the GIL during the finalization that follows, inside
    # memres's frames, and the process aborts.
    run_child(CHILD_LIB + textwrap.dedent("""
        import threading
        so = lib()
        ran = []
        cb = mr.CallbackMemoryResource(lambda n: ran.append(n) or 1 << 40, lambda p, n: None, backend="sim")
        mr.set_current_device_resource(cb)
        _native.sim.at_exit()  # the exit begins, as memres's exit handler begins it
        got = []
        t = threading.Thread(target=lambda: got.append(so.memres_py_alloc(256, 0, None)))
        t.start()
        t.join()
        assert (got, ran) == ([None], []), (got, ran)
        why = _native.sim.last_error()
        assert "the Python interpreter is being finalized" in why, why
        assert _native.sim.c_live_count(0) == 0
        print("done")
    """))


def test_the_reset_function_called_without_the_gil_once_the_exit_began_runs_no_python():
    # It took the GIL on a thread that did not hold it (ctypes.CDLL, as a
    # native thread's) once memres's exit handler had run: CPython ends a
    # thread that takes the GIL during the finalization that follows,
    # inside memres's frames, and the process aborts. The thread that runs
    # the exit still releases.
    run_child(CHILD_LIB + textwrap.dedent("""
        import threading
        import memres.allocators.torch as torch_allocator
        so = lib()
        ran = []
        torch_allocator._empty_caches = lambda: ran.append(threading.current_thread())
        _native.sim.at_exit()  # the exit begins, as memres's exit handler begins it
        t = threading.Thread(target=so.memres_py_empty_cache)
        t.start()
        t.join()
        assert ran == [], ran
        so.memres_py_empty_cache()
        assert ran == [threading.main_thread()], ran
        print("done")
    """))


def test_the_exit_waits_for_a_call_without_the_gil_begun_before_it():
    # Not waited for, such a call's Python function could take the GIL
    # during the finalization that follows memres's exit handler (which
    # ends the thread inside memres's frames: an abort).
    run_child(CHILD_LIB + textwrap.dedent("""
        import threading, time
        so = lib()
        inside = threading.Event()
        def alloc(n):
            inside.set()
            time.sleep(0.5)
            return 1 << 40
        cb = mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim")
        mr.set_current_device_resource(cb)
        threading.Thread(target=lambda: so.memres_py_alloc(256, 0, None), daemon=True).start()
        inside.wait()
        _native.sim.at_exit()
        assert _native.sim.c_live_count(0) == 1, "the exit did not wait for the call"
        print("done")
    """))


def test_a_call_without_the_gil_that_ends_once_the_exit_began_takes_no_gil_to_name_what_raised():
    # Its reason named the exception its Python function raised, taking
    # the GIL after the call, once the exit handler had stopped waiting for
    # it: the finalization that follows could end the thread there.
    from test_threads import UNTIL_THE_EXIT
    run_child(CHILD_LIB + textwrap.dedent(UNTIL_THE_EXIT + """
    so = lib()
    inside = threading.Event()
    def alloc(n):
        inside.set()
        wait_for(MAIN, "_at_exit")
        raise RuntimeError("raised at exit")
    mr.set_current_device_resource(mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"))
    seen = []
    sys.unraisablehook = seen.append
    t = threading.Thread(target=lambda: so.memres_py_alloc(256, 0, None))
    t.start()
    inside.wait()
    def _at_exit():
        _native.sim.at_exit()
    _at_exit()
    t.join()
    assert seen == [], [str(s.exc_value) for s in seen]
    why = _native.sim.last_error()
    assert why.endswith("(a Python function raised; not said: the interpreter exits)"), why
    print("done")
    """))


def test_a_free_that_a_python_function_refuses_as_the_last_block_drops_its_stack_is_said():
    # The C functions' block is the last holder of a stack no longer
    # current: its free drops the stack, whose pool gives its chunk back.
    from test_mr import refusing_free, said_by_drops
    so = lib()
    pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(lambda n: 1 << 40, refusing_free, backend="sim"),
                                 initial_pool_size=MiB)
    mr.set_current_device_resource(pool)
    p = so.memres_py_alloc(100, 0, None)
    assert p
    mr.set_current_device_resource(mr.HostMemoryResource())
    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        del pool
        assert seen == []  # the block holds the stack
        so.memres_py_free(p, 100, 0, None)
    finally:
        sys.unraisablehook = hook
    assert said_by_drops(seen) == [("MemresError", "ValueError", "refused")]
    assert _native.sim.c_live_count(0) == 0


def test_a_stack_that_outlives_the_collection_of_its_python_functions_never_calls_them():
    # The cycle of `Owner` and its resource is collected while a block of
    # the C functions holds the pool built over that resource: the pool's
    # drop, at the block's free, called a function the collector had
    # cleared, and the interpreter crashed (SIGSEGV). Now the free is
    # refused, and said as a drop's.
    run_child(CHILD_LIB + textwrap.dedent("""
        import gc, sys
        so = lib()
        freed = []
        class Owner:
            def __init__(self):
                self.cb = mr.CallbackMemoryResource(self.alloc, self.free, backend="sim")
            def alloc(self, n):
                return 1 << 40
            def free(self, p, n):
                freed.append(p)
        o = Owner()
        pool = mr.PoolMemoryResource(o.cb, initial_pool_size=1 << 20)
        mr.set_current_device_resource(pool)
        p = so.memres_py_alloc(100, 0, None)
        mr.set_current_device_resource(mr.HostMemoryResource())
        del pool, o
        gc.collect()
        seen = []
        sys.unraisablehook = seen.append
        so.memres_py_free(p, 100, 0, None)  # the stack's last holder: it is dropped
        said = [(u.object, str(u.exc_value.__cause__)) for u in seen]
        assert len(said) == 1 and said[0][0] == "memres: the drop of a resource", said
        assert "garbage collector" in said[0][1], said
        assert freed == [], freed
        print("done")
    """))


def test_reinitialize_forgets_a_default_the_c_functions_made_for_another_device():
    so = lib()
    p = so.memres_py_alloc(1000, 1, None)
    so.memres_py_free(p, 1000, 1, None)
    memres.reinitialize(devices=[0])
    # The C functions' next block of device 1 comes from a default made
    # anew, whose counters start at zero: the forgotten one counted one
    # allocation already. (Python takes the C functions' default as the
    # device's resource, on either backend.)
    p = so.memres_py_alloc(1000, 1, None)
    stats = mr.get_per_device_resource(1)._native.statistics()
    so.memres_py_free(p, 1000, 1, None)
    assert stats[1] == (1, 1, 1)


def test_racing_first_allocations_on_a_device_give_python_the_stack_that_serves_them():
    # Each thread's first use asks for the device's default: one stack must
    # serve all four, and be the one Python takes as the device's resource.
    so = lib()
    wrong = []
    for d in range(_native.sim.MAX_DEVICES):
        go, ptrs = threading.Barrier(4), []

        def alloc():
            go.wait()
            ptrs.append(so.memres_py_alloc(1000, d, None))  # ctypes releases the GIL

        ts = [threading.Thread(target=alloc) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        stats = mr.get_per_device_resource(d)._native.statistics()  # None: not the C functions' stack
        live = None if stats is None else stats[1][0]
        if live != 4:
            wrong.append((d, live))
        for p in ptrs:
            so.memres_py_free(p, 1000, d, None)
    assert not wrong, f"(device, blocks live per Python's resource) where 4 C blocks are live: {wrong}"


def test_logging_and_is_initialized_see_a_resource_the_c_functions_made(tmp_path):
    # PyTorch's allocations reached device 0 first, and device 1 while
    # device 0 had a resource set: each device has a resource.
    so = lib()
    p = so.memres_py_alloc(1000, 0, None)
    assert memres.is_initialized()
    made = mr.get_per_device_resource(0)
    assert made.stack == _native.sim.C_DEFAULT_STACK
    so.memres_py_free(p, 1000, 0, None)
    mr.set_per_device_resource(0, mr.HostMemoryResource(device=0))
    q = so.memres_py_alloc(1000, 1, None)
    assert memres.get_log_filenames() == {0: None, 1: None}
    memres.enable_logging(log_file_name=tmp_path / "x.csv")
    assert memres.get_log_filenames() == {d: str(tmp_path / f"x.dev{d}.csv") for d in (0, 1)}
    logged = mr.get_per_device_resource(1)
    assert logged.upstream_mr.stack == _native.sim.C_DEFAULT_STACK
    so.memres_py_free(q, 1000, 1, None)  # to the stack that served it
    assert logged.upstream_mr._native.statistics()[0][0] == 0


# How long a thread inside the registry waits for the other thread to come
# in beside it: it never does once the two are serialized, and the wait
# then ends in BrokenBarrierError and goes on (the outcome does not depend
# on it; before the registry was serialized the other came in at once).
BESIDE_S = 2


def test_two_threads_setting_a_devices_resource_leave_one_for_python_and_the_c_functions(monkeypatch):
    # Each set gives the GIL up in the native registry. The set of `a` is
    # made to reach the native registry first and end last: Python then
    # named `a` while the C functions served `b`.
    so = lib()
    a, b = (mr.StatisticsResourceAdaptor(mr.HostMemoryResource()) for _ in range(2))
    real = _native.sim
    beside = threading.Barrier(2, timeout=BESIDE_S)
    a_set, b_done = threading.Event(), threading.Event()

    class Sim:
        def __getattr__(self, name):
            return getattr(real, name)

        def set_per_device_resource(self, device, native):
            try:
                beside.wait()
            except threading.BrokenBarrierError:
                return real.set_per_device_resource(device, native)
            if native is a._native:
                real.set_per_device_resource(device, native)
                a_set.set()
                b_done.wait()
            else:
                a_set.wait()
                real.set_per_device_resource(device, native)

    monkeypatch.setattr(_native, "sim", Sim())

    def set_b():
        mr.set_per_device_resource(0, b)
        b_done.set()

    ts = [threading.Thread(target=mr.set_per_device_resource, args=(0, a)), threading.Thread(target=set_b)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    monkeypatch.setattr(_native, "sim", real)
    res = mr.get_per_device_resource(0)
    p = so.memres_py_alloc(1000, 0, None)
    served = res.allocation_counts.current_bytes
    so.memres_py_free(p, 1000, 0, None)
    assert served == 1000, f"Python's resource of device 0 is {'a' if res is a else 'b'}, the C functions' the other"


def test_two_threads_first_using_a_device_get_one_default(monkeypatch):
    made, beside = [], threading.Barrier(2, timeout=BESIDE_S)
    real = mr._default_resource

    def default(device):
        try:
            beside.wait()
        except threading.BrokenBarrierError:
            pass
        made.append(real(device))
        return made[-1]

    monkeypatch.setattr(mr, "_default_resource", default)
    got = []
    ts = [threading.Thread(target=lambda: got.append(mr.get_per_device_resource(0))) for _ in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(made) == 1 and got == made * 2 and mr.get_per_device_resource(0) is made[0]


def test_the_torch_helpers_make_no_resource_for_a_device_pytorch_has_not_used(monkeypatch):
    # `empty_cache(5)`, `step(5)` or `steps(5)` before any tensor of device
    # 5 made its default: a bare HostMemoryResource here (a bare
    # CudaMemoryResource with CUDA), which PyTorch's allocations there then
    # got instead of DEFAULT_STACK.
    import types
    import memres.allocators.torch as mt
    cuda = types.SimpleNamespace(is_initialized=lambda: False, current_stream=lambda device=None: None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    so = lib()
    assert mt.empty_cache(5) == 0 and mt.step(5) == 0 and mt.steps(5) == dict.fromkeys(mr._STEPS_FIELDS, 0)
    assert not memres.get_log_filenames()  # no device has a resource
    p = so.memres_py_alloc(1000, 5, None)
    assert mr.get_per_device_resource(5).stack == _native.sim.C_DEFAULT_STACK
    so.memres_py_free(p, 1000, 5, None)


def test_a_pytorch_without_cuda_leaves_the_allocator_none(monkeypatch):
    # Its CUDAPluggableAllocator has no `_cuda_customAllocator` to call:
    # the AttributeError failed the import of memres.allocators.torch,
    # where RMM's module sets its allocator to None.
    import types
    import memres.allocators.torch as mt

    class CpuOnly:
        def __init__(self, *args):
            raise AttributeError("module 'torch._C' has no attribute '_cuda_customAllocator'")

    monkeypatch.setattr(mt, "CUDAPluggableAllocator", CpuOnly)
    monkeypatch.setattr(mt, "_native", types.SimpleNamespace(cuda=lambda: types.SimpleNamespace(__file__="x.so")))
    assert mt._make() is None


def test_a_c_free_from_an_exception_a_retry_replaced_does_not_abort():
    # A failure callback's retry raised again: keeping the second exception
    # dropped the first, whose frame held the last reference to a block of
    # the C functions (a tensor, as PyTorch's). Its free, run by that drop,
    # found the record of raised exceptions borrowed: a panic inside
    # memres_py_free, and the process aborted.
    run_child(CHILD_LIB + textwrap.dedent("""
        import memres
        so = lib()
        mr.set_current_device_resource(mr.HostMemoryResource())

        class Tensor:
            def __init__(self):
                self.p = so.memres_py_alloc(256, 0, None)

            def __del__(self):
                so.memres_py_free(self.p, 256, 0, None)

        def alloc(n):
            scratch = Tensor()  # held by this frame only, which the exception holds
            raise MemoryError

        asked = []
        top = mr.FailureCallbackResourceAdaptor(
            mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"),
            lambda n: asked.append(n) or len(asked) == 1)
        try:
            top.allocate(256)
        except memres.OutOfMemory:
            pass
        assert len(asked) == 2, asked
        assert _native.sim.c_live_count(0) == 0, "every tensor freed"
        print("done")
    """))
