"""Calls into a stack from a Python callback under it, on the same thread:
a `pool`, `fixed` or `arena` holds its spin lock while its upstream runs,
so such a call would spin for ever. An allocation (a step, a release, a
look at a pool) is refused with a MemresError and changes nothing; a free
(a collected DeviceBuffer, `deallocate`) is checked at once and applied
once the outermost call returns.

Before the fix these hung, so each case runs in a child process that must
end within a time limit."""

import subprocess
import sys
import textwrap

import pytest

LIMIT_S = 60


def run_child(code):
    """Runs ``code`` in a child Python; fails the test if it hangs or does
    not print ``done``."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung (no end within {LIMIT_S} s)")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("done"), out.stdout + out.stderr
    return out


# The head of a child that needs PyO3's PanicException, the class a Rust
# panic becomes in Python: the native module makes it the first time it
# fetches an exception. PyO3 turns one that Python code raises back into a
# panic wherever it fetches it.
PANIC_EXCEPTION = textwrap.dedent("""
    import memres
    from memres import mr
    try:
        mr.CallbackMemoryResource(lambda n: 1 // 0, lambda p, n: None, backend="sim").allocate(1)
    except memres.MemresError:
        pass
    PE = next(c for c in BaseException.__subclasses__() if c.__name__ == "PanicException")
""")

# `top`: statistics over a callback resource whose first free raises PE.
FREE_PANICS_ONCE = PANIC_EXCEPTION + textwrap.dedent("""
    fail = [True]
    def dealloc(p, n):
        if fail[0]:
            fail[0] = False
            raise PE("deallocate_func")
    top = mr.StatisticsResourceAdaptor(mr.CallbackMemoryResource(lambda n: 1 << 40, dealloc, backend="sim"))
""")


def test_a_failure_callback_that_collects_a_buffer_of_the_pool_frees_it_once_the_allocation_returns():
    # RMM's usual failure callback: collect garbage and retry. The garbage
    # holds a buffer of the very pool that is growing.
    run_child("""
        import gc, memres
        from memres import mr
        gc.disable()  # the collection happens in the callback, nowhere else
        state = {"in_callback": False, "collected_in_callback": None}
        def on_oom(nbytes):
            state["in_callback"] = True
            gc.collect()
            state["in_callback"] = False
            return True
        limit = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1 << 20)
        pool = mr.PoolMemoryResource(mr.FailureCallbackResourceAdaptor(limit, on_oom),
                                     initial_pool_size=1 << 20)
        top = mr.StatisticsResourceAdaptor(pool)
        class Cycle:
            def __init__(self):
                self.buf = memres.DeviceBuffer(size=1 << 19, mr=top)
                self.me = self
            def __del__(self):
                state["collected_in_callback"] = state["in_callback"]
        Cycle()
        try:
            memres.DeviceBuffer(size=1 << 20, mr=top)  # the pool must grow past the limit
            raise SystemExit("allocated past the limit")
        except MemoryError:
            pass
        assert state["collected_in_callback"] is True, state
        counts = top.allocation_counts
        assert counts.current_count == 0 and counts.current_bytes == 0, counts
        # The collected buffer's memory is the pool's again: the whole chunk fits.
        b = memres.DeviceBuffer(size=1 << 20, mr=top)
        del b
        counts = top.allocation_counts
        assert counts.current_count == 0 and counts.current_bytes == 0, counts
        assert counts.total_count == 2, counts
        assert pool.pool_size() == 1 << 20 and pool.release() == 1 << 20 and pool.pool_size() == 0
        print("done")
    """)


REENTER_FROM_ALLOCATE_FUNC = """
    import memres
    from memres import mr
    state = {"n": 0, "errors": [], "inside": False}
    def alloc(n):
        state["n"] += 1
        top = state.get("top")
        if top is not None and not state["inside"]:
            state["inside"] = True
            for call in (lambda: top.allocate(64), lambda: top.release(), lambda: top.step(),
                         lambda: top._native.pool_size(), lambda: top.steps()):
                try:
                    call()
                    state["errors"].append(None)
                except memres.MemresError as e:
                    state["errors"].append(str(e))
        return (1 << 40) + (state["n"] << 30)
    cb = mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim")
    top = TOP
    state["top"] = top
    p = top.allocate(SIZE)
    assert len(state["errors"]) == 5, state
    assert all(e and "re-entrant call from inside a callback under the same resource" in e
               for e in state["errors"]), state["errors"]
    assert top._native.live_count() == 1
    top.deallocate(p, SIZE)
    assert top._native.live_count() == 0
    print("done")
"""


@pytest.mark.parametrize("top, size", [
    ("mr.PoolMemoryResource(cb, initial_pool_size=1 << 16)", 1 << 21),
    ("mr.PoolMemoryResource(cb, initial_pool_size=4096, per_stream=True)", 8192),
    ("mr.FixedSizeMemoryResource(cb, block_size=4096, blocks_to_preallocate=2)", 4096),
    ("mr.ArenaMemoryResource(cb, arena_size=1 << 20)", 8192),
], ids=["pool", "pool_per_stream", "fixed", "arena"])
def test_a_call_into_the_stack_from_its_allocate_func_is_refused(top, size):
    run_child(REENTER_FROM_ALLOCATE_FUNC.replace("TOP", top).replace("SIZE", str(size)))


def test_a_free_from_a_finalizer_run_inside_a_callback_is_checked_at_once_and_applied_after():
    run_child("""
        import gc, memres
        from memres import mr
        gc.disable()
        base = [1 << 40]
        def alloc(n):
            base[0] += 1 << 30
            gc.collect()  # any Python code may start a collection
            return base[0]
        pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"),
                                     initial_pool_size=1 << 16)
        top = mr.StatisticsResourceAdaptor(pool)
        seen = {}
        class Holder:
            def __init__(self):
                self.p = top.allocate(256)
                self.me = self
            def __del__(self):
                try:
                    top.deallocate(self.p, 255)
                except ValueError as e:
                    seen["wrong size"] = str(e)
                top.deallocate(self.p, 256)
                seen["freed"] = top.allocation_counts.current_count
        Holder()
        q = top.allocate(1 << 21)  # grows: alloc runs under the pool's lock
        assert "allocated with 256 bytes" in seen["wrong size"], seen
        assert seen["freed"] == 1, seen  # queued: not freed yet inside the callback
        counts = top.allocation_counts
        assert counts.current_count == 1 and counts.current_bytes == 1 << 21, counts
        assert top._native.live_count() == 1
        top.deallocate(q, 1 << 21)
        assert top.allocation_counts.current_bytes == 0
        print("done")
    """)


def test_a_failure_callback_that_calls_its_own_adaptor_is_refused_not_recursed():
    # Recursion Python -> Rust -> Python crashed threads with small stacks.
    run_child("""
        import threading, memres
        from memres import mr
        lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 100)
        calls, nested, outer = [], [], []
        def cb(n):
            calls.append(n)
            try:
                fc.allocate(n)
            except memres.MemresError as e:
                nested.append(str(e))
            return False
        fc = mr.FailureCallbackResourceAdaptor(lim, cb)
        def run():
            try:
                fc.allocate(1000)
            except MemoryError as e:
                outer.append(e)
        threading.stack_size(256 << 10)
        t = threading.Thread(target=run)
        t.start()
        t.join()
        assert calls == [1000], len(calls)
        assert len(nested) == 1 and "re-entrant" in nested[0], nested
        assert len(outer) == 1 and isinstance(outer[0], memres.OutOfMemory), outer
        print("done")
    """)


def test_a_call_into_another_stack_from_a_callback_is_served():
    run_child("""
        import memres
        from memres import mr
        other = mr.StatisticsResourceAdaptor(mr.HostMemoryResource())
        got = []
        def alloc(n):
            p = other.allocate(64)
            other.deallocate(p, 64)
            got.append(p)
            return (1 << 40) + (len(got) << 30)
        pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"),
                                     initial_pool_size=1 << 16)
        p = pool.allocate(1 << 21)
        assert len(got) == 2 and all(got), got
        assert other.allocation_counts.total_count == 2
        pool.deallocate(p, 1 << 21)
        print("done")
    """)


def test_a_resource_collected_inside_a_callback_under_its_upstream_pool_gives_its_chunks_back_after_the_call():
    # The collected pool gives its chunk back to `stats(pool)`, whose pool's
    # lock the growing allocation holds while the callback runs.
    run_child("""
        import gc, memres
        from memres import mr
        gc.disable()
        state = {"collect": False, "collected_in_callback": None, "in_callback": False}
        base = [1 << 40]
        def alloc(n):
            base[0] += 1 << 30
            if state["collect"]:
                state["in_callback"] = True
                gc.collect()
                state["in_callback"] = False
            return base[0]
        pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"),
                                     initial_pool_size=1 << 20)
        stats = mr.StatisticsResourceAdaptor(pool)
        class Cycle:
            def __init__(self):
                self.over = mr.PoolMemoryResource(stats, initial_pool_size=1 << 16)
                self.me = self
            def __del__(self):
                state["collected_in_callback"] = state["in_callback"]
        Cycle()
        assert stats.allocation_counts.current_bytes == 1 << 16
        state["collect"] = True
        p = pool.allocate(1 << 22)  # past the pool's chunk: it grows, calling `alloc`
        state["collect"] = False
        assert state["collected_in_callback"] is True, state
        assert stats.allocation_counts.current_bytes == 0, stats.allocation_counts
        pool.deallocate(p, 1 << 22)
        print("done")
    """)


def test_a_free_refused_as_a_resource_collected_inside_a_callback_is_dropped_after_the_call_is_said():
    # Collected inside `alloc`, the pool over `cb` is dropped once the
    # growing allocation returns; its chunk goes back to `cb`, whose
    # function refuses it: said on sys.unraisablehook, as a drop's.
    run_child("""
        import gc, sys
        from memres import mr
        gc.disable()
        state = {"collect": False}
        base = [1 << 40]
        def alloc(n):
            base[0] += 1 << 30
            if state["collect"]:
                gc.collect()
            return base[0]
        def free(p, n):
            raise ValueError("refused")
        cb = mr.CallbackMemoryResource(alloc, free, backend="sim")
        pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
        class Cycle:
            def __init__(self):
                self.over = mr.PoolMemoryResource(cb, initial_pool_size=1 << 16)
                self.me = self
        Cycle()
        seen = []
        sys.unraisablehook = seen.append
        state["collect"] = True
        p = pool.allocate(1 << 22)  # past the pool's chunk: it grows, calling `alloc`
        state["collect"] = False
        said = [(u.object, type(u.exc_value).__name__, repr(u.exc_value.__cause__)) for u in seen]
        assert said == [("memres: the drop of a resource", "MemresError", "ValueError('refused')")], said
        print("done")
    """)


def test_a_callback_under_a_buffers_resize_that_uses_that_buffer_is_refused_and_changes_nothing():
    # A buffer holds its own lock while its resource grows it; the failure
    # callback reached from there waited for ever on that lock.
    run_child("""
        import memres
        from memres import mr
        buf = None
        seen = []
        def on_oom(nbytes):
            assert (buf.size, buf.ptr, buf.capacity()) == (1024, ptr, 1024)
            uses = (lambda: buf.size, lambda: buf.ptr, lambda: buf.capacity(),
                    lambda: buf.tobytes(), lambda: buf.copy_from_host(b"x"), lambda: buf.resize(1))
            for use in uses:
                try:
                    use()
                    seen.append(None)
                except memres.MemresError as e:
                    seen.append(str(e))
            return False
        limit = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1 << 20)
        top = mr.StatisticsResourceAdaptor(mr.FailureCallbackResourceAdaptor(limit, on_oom))
        buf = memres.DeviceBuffer(size=1024, mr=top)
        buf.copy_from_host(b"\\x07" * 1024)
        ptr = buf.ptr
        try:
            buf.resize(2 << 20)
            raise SystemExit("resized past the limit")
        except MemoryError:
            pass
        # Its figures are read with no lock (as RMM's): the buffer as it was.
        assert seen[:3] == [None, None, None], seen
        assert all(e and "re-entrant" in e for e in seen[3:]), seen
        assert "DeviceBuffer.copy_to_host" in seen[3] and "DeviceBuffer.resize" in seen[5], seen
        # Unchanged, and usable from outside the callback.
        assert buf.size == 1024 and buf.ptr == ptr and buf.tobytes() == b"\\x07" * 1024
        buf.resize(4096)
        assert buf.size == 4096 and buf.tobytes()[:1024] == b"\\x07" * 1024
        counts = top.allocation_counts
        assert counts.current_count == 1 and counts.current_bytes == 4096, counts
        del buf
        assert top.allocation_counts.current_bytes == 0
        print("done")
    """)


def test_a_callback_that_uses_a_buffer_another_thread_holds_while_it_waits_for_the_pool_does_not_hang():
    # Thread A grows x in a pool and runs the failure callback under the
    # pool's lock; thread B holds y while it waits for that lock. A callback
    # that waited for y's lock (its size, a copy) waited for ever.
    run_child("""
        import threading, time, memres
        from memres import mr
        limit = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 4 << 20)
        out = {}
        def on_oom(nbytes):
            if "y" not in globals():  # the pool's first growth, for x
                return False
            b = threading.Thread(target=lambda: y.resize(512 << 10))
            b.start()
            out["b"] = b
            time.sleep(0.5)  # B takes y's lock and waits for the pool's
            out["size"] = y.size
            try:
                out["bytes"] = len(y.tobytes())
            except memres.MemresError as e:
                out["error"] = str(e)
            return False
        pool = mr.PoolMemoryResource(mr.FailureCallbackResourceAdaptor(limit, on_oom))
        x = memres.DeviceBuffer(size=1 << 20, mr=pool)
        y = memres.DeviceBuffer(size=1024, mr=pool)
        try:
            x.resize(8 << 20)
            raise SystemExit("grown past the limit")
        except MemoryError:
            pass
        out["b"].join()
        assert out["size"] in (1024, 512 << 10), out
        assert out.get("bytes") == 1024 or "held by another thread" in out.get("error", ""), out
        assert y.size == 512 << 10 and x.size == 1 << 20
        print("done")
    """)


def test_a_free_deferred_by_a_callback_that_raises_a_panic_exception_does_not_abort_when_its_own_callback_does():
    # The callback's PanicException became a panic inside the stack's call,
    # which ran the free it deferred while the thread unwound: that free's
    # callback raising one too aborted the process ("panic in a destructor
    # during cleanup", exit code -6).
    # A free into the object whose callback runs is applied at once (its
    # root holds no lock): the free that waits is one through a binning
    # layer above it, which passes large blocks straight to it.
    out = run_child(PANIC_EXCEPTION + textwrap.dedent("""
        state = {"next": 1 << 40}
        def alloc(n):
            if n == 16 << 20:
                B.deallocate(state["q"], 8 << 20)  # re-entrant: applied once B.allocate returns
                raise PE("allocate_func")
            state["next"] += 1 << 30
            return state["next"]
        def dealloc(p, n):
            if p == state["q"]:
                raise PE("deallocate_func")
        C = mr.CallbackMemoryResource(alloc, dealloc, backend="sim")
        B = mr.BinningMemoryResource(C)
        state["q"] = B.allocate(8 << 20)
        try:
            B.allocate(16 << 20)
            raise SystemExit("allocated")
        except memres.MemresError as e:
            assert "allocate_func raised" in str(e), e
            # Its cause is its own callback's, not the deferred free's.
            assert isinstance(e.__cause__, PE) and "allocate_func" in str(e.__cause__), e.__cause__
        assert B._native.live_count() == 0  # q's free was taken, and said to succeed
        # The thread is usable, and nothing stays queued.
        B.deallocate(B.allocate(64), 64)
        print("done")
    """))
    assert out.stderr.count("deferred from a call inside a callback, failed") == 1, out.stderr


def test_a_panic_exception_from_a_callback_is_the_error_of_a_callback_that_raised():
    # Anything Python runs for a callback: the function, the repr of what it
    # returned, the truth of a failure callback's answer. Each PanicException
    # unwound through the stack (holding a pool's lock) to the caller.
    run_child(PANIC_EXCEPTION + textwrap.dedent("""
        def panics(*args):
            raise PE("a callback")
        class Unprintable(int):
            def __str__(self):
                raise PE("str")
            __repr__ = __str__
        class NoTruth:
            def __bool__(self):
                raise PE("bool")
        def raises(call, error, says):
            try:
                call()
            except error as e:
                assert says in str(e) and isinstance(e.__cause__, PE), (e, e.__cause__)
                return
            raise SystemExit(f"no {error.__name__}")

        cb = mr.CallbackMemoryResource(panics, lambda p, n: None, backend="sim")
        raises(lambda: cb.allocate(10), memres.MemresError, "allocate_func raised")
        cb = mr.CallbackMemoryResource(lambda n: Unprintable(1 << 64), lambda p, n: None, backend="sim")
        raises(lambda: cb.allocate(10), memres.MemresError, "allocate_func returned no int address")
        cb = mr.CallbackMemoryResource(lambda n: 1 << 40, panics, backend="sim")
        p = cb.allocate(10)
        raises(lambda: cb.deallocate(p, 10), memres.MemresError, "deallocate_func raised")
        assert cb._native.live_count() == 1  # a refused free changes nothing

        # Under a pool, which holds its lock while it grows: usable after.
        n = [0]
        def grow(size):
            n[0] += 1
            if n[0] == 2:
                raise PE("grow")
            return (1 << 40) + (n[0] << 30)
        pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(grow, lambda p, s: None, backend="sim"),
                                     initial_pool_size=1 << 16)
        raises(lambda: pool.allocate(1 << 21), memres.MemresError, "allocate_func raised")
        p = pool.allocate(1 << 21)
        pool.deallocate(p, 1 << 21)

        # A failure callback: what it raised is what the call raises (RMM's
        # rule), not retried; the adaptor is usable after.
        for on_oom, says in ((panics, "a callback"), (lambda n: NoTruth(), "bool")):
            fc = mr.FailureCallbackResourceAdaptor(mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 4096), on_oom)
            try:
                fc.allocate(8192)
                raise SystemExit("allocated past the limit")
            except PE as e:
                assert str(e) == says, e
            fc.deallocate(fc.allocate(100), 100)
        print("done")
    """))


def test_an_exception_whose_str_raises_a_panic_exception_is_still_said():
    # Saying a function's exception fetched its str() and its type's name
    # through PyO3, which turns a PanicException raised there into a panic:
    # the call raised that PanicException, the function's exception lost.
    run_child(PANIC_EXCEPTION + textwrap.dedent("""
        class Unsayable(Exception):
            def __str__(self):
                raise PE("str")
        class Meta(type):
            def __getattribute__(cls, name):
                if name == "__qualname__":
                    raise PE("qualname")
                return super().__getattribute__(name)
        class Unnamed(Exception, metaclass=Meta):
            pass
        for error, says in ((Unsayable, "Unsayable: <exception str() failed>"), (Unnamed, "Unnamed: ")):
            def alloc(n):
                raise error()
            cb = mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim")
            try:
                cb.allocate(10)
                raise SystemExit("allocated")
            except memres.MemresError as e:
                assert says in str(e) and isinstance(e.__cause__, error), (e, e.__cause__)
            assert cb._native.live_count() == 0
            cb.deallocate(cb.allocate(0), 0)
        print("done")
    """))


def test_a_refused_free_whose_exception_runs_a_finalizer_freeing_into_the_resource():
    # The refusal's exception was made under the lock of the resource's
    # table of live blocks: making it ran Python code (here the collector,
    # on a threshold of 1), whose finalizer freed a block of the same
    # resource and waited for that lock for ever, the GIL held.
    run_child("""
        import gc
        import memres
        from memres import mr
        r = mr.HostMemoryResource()
        p = r.allocate(256)

        class Holder:
            def __del__(self):
                r.deallocate(p, 256)

        h = Holder()
        h.cycle = h
        del h
        gc.set_threshold(1)
        try:
            r.deallocate(0x1000, 8)  # no block there
        except memres.InvalidArgument:
            pass
        gc.set_threshold(700)
        gc.collect()
        assert r._native.live_count() == 0, "the finalizer's free went through"
        print("done")
    """)


def test_greenlets_switched_inside_callbacks_end_their_calls_in_any_order():
    # As gevent does: a callback switches to a greenlet that begins a call
    # into another stack and switches back from that call's callback, so
    # the first call ends while the second is in progress. Before, the
    # first call's end took out the second's: the first stayed in progress
    # and refused every call into its stack, and a call into the pool the
    # second holds locked spun for ever.
    pytest.importorskip("greenlet")
    run_child("""
        import greenlet, memres
        from memres import mr
        main = greenlet.getcurrent()
        addrs = iter(range(1 << 40, 1 << 41, 1 << 24))
        first = {"a": True, "b": True}
        def to_b(n):
            if first.pop("a", False):
                g_b.switch()
            return next(addrs)
        def to_main(n):
            if first.pop("b", False):
                main.switch()
            return next(addrs)
        a = mr.CallbackMemoryResource(to_b, lambda p, n: None, backend="sim")
        b = mr.PoolMemoryResource(mr.CallbackMemoryResource(to_main, lambda p, n: None, backend="sim"))
        def run_b():
            # The pool grows: its upstream's callback switches back to main.
            return b.allocate(1 << 20)
        g_b = greenlet.greenlet(run_b)
        a.allocate(256)
        assert not g_b.dead
        # a's call ended; b's is in progress, holding the pool's lock.
        a.allocate(256)
        try:
            b.allocate(256)
        except memres.MemresError as e:
            assert "re-entrant" in str(e).lower() or "reentrant" in str(e).lower(), e
        else:
            raise AssertionError("a call into the pool in progress was let in")
        b.deallocate(g_b.switch(), 1 << 20)
        assert g_b.dead
        b.deallocate(b.allocate(256), 256)
        print("done")
    """)
