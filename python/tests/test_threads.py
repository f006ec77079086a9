"""Threads: no call waits on a lock with the GIL held where the lock's
holder may need the GIL (a pool holds its lock while its Python upstream
runs, a buffer holds its lock while a resize runs a failure callback), and
two buffers copied into each other from two threads do not deadlock.

A deadlock with the GIL held freezes the whole interpreter, so each case
runs in a child process that must end within a time limit."""

import subprocess
import sys
import textwrap

import pytest

# Each case takes a second or two when nothing hangs.
LIMIT_S = 30


def run_child(code, expect="done"):
    """Runs ``code`` in a child Python; fails the test if it hangs or
    does not print ``expect`` last."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung (no end within {LIMIT_S} s)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(expect), out.stdout + out.stderr


def test_two_buffers_copied_into_each_other_from_two_threads_do_not_deadlock():
    run_child("""
        import threading, memres
        from memres import mr
        h = mr.HostMemoryResource()
        a = memres.DeviceBuffer.to_device(b"a" * (1 << 20), mr=h)
        b = memres.DeviceBuffer.to_device(b"b" * (1 << 20), mr=h)
        def run(x, y):
            for _ in range(20000):
                x.copy_from_device(y)
        ts = [threading.Thread(target=run, args=(a, b)), threading.Thread(target=run, args=(b, a))]
        for t in ts: t.start()
        for t in ts: t.join()
        assert bytes(a.copy_to_host()) == bytes(b.copy_to_host())
        print("done")
    """)


# A thread enters a Python function (`slow`) while memres holds a lock
# (`HOLD`); once it is inside, the main thread does `ACT`, which needs that
# lock. `slow` sleeps with the GIL released, then needs the GIL back: `ACT`
# must wait for the lock without the GIL.
HELD_WHILE_PYTHON_RUNS = """
    import threading, time, memres
    from memres import mr
    inside = threading.Event()
    def slow(nbytes):
        if nbytes > 1 << 20:
            inside.set()
            time.sleep(0.5)
        return False
    SETUP
    def hold():
        try:
            HOLD
        except MemoryError:
            pass
    t = threading.Thread(target=hold)
    t.start()
    inside.wait()
    ACT
    t.join()
    print("done")
"""


def held(setup, hold, act):
    return (HELD_WHILE_PYTHON_RUNS.replace("SETUP", setup).replace("HOLD", hold).replace("ACT", act))


# A pool over a Python callback that grows: the pool's lock is held while
# the callback runs.
POOL_OVER_A_CALLBACK = """
    addrs = iter(range(1 << 40, 1 << 50, 1 << 40))
    def alloc(nbytes):
        slow(nbytes)
        return next(addrs)
    pool = mr.PoolMemoryResource(mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim"),
                                 initial_pool_size=1 << 20)
"""


def test_reading_a_pool_while_its_python_upstream_runs_does_not_freeze():
    run_child(held(POOL_OVER_A_CALLBACK, "pool.allocate(1 << 30)", "pool.pool_size()"))


def test_dropping_a_resource_while_its_upstream_pool_is_in_python_does_not_freeze():
    # A pool over `pool` gives its chunk back to `pool` when collected.
    run_child(held(POOL_OVER_A_CALLBACK + "\n    over = mr.PoolMemoryResource(pool, initial_pool_size=4096)",
                   "pool.allocate(1 << 30)", "del over"))


# A buffer's resize past a limit asks a failure callback, holding the
# buffer's lock.
BUFFER_OVER_A_FAILURE_CALLBACK = """
    lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1 << 20)
    buf = memres.DeviceBuffer(size=100, mr=mr.FailureCallbackResourceAdaptor(lim, slow))
"""


@pytest.mark.parametrize("read", ["buf.size", "buf.ptr", "buf.capacity()", "len(buf)", "buf.nbytes"])
def test_reading_a_buffer_while_it_grows_through_a_failure_callback_does_not_freeze(read):
    run_child(held(BUFFER_OVER_A_FAILURE_CALLBACK, "buf.resize(1 << 21)", f"{read}; assert buf.size == 100"))


def test_a_callback_refused_a_buffer_another_thread_holds_is_told_so():
    # A callback of one resource reads a buffer of another, unrelated one
    # that another thread holds (its resize waits in a failure callback).
    # The refusal said "a re-entrant call from inside a callback under the
    # same resource (its stack is in a call on this thread ...)": neither
    # is so, and the buffer's holder, the other thread, went unsaid.
    run_child("""
    import threading, memres
    from memres import mr
    in_callback, go_on = threading.Event(), threading.Event()
    def on_oom(nbytes):
        in_callback.set()
        go_on.wait()
        return False
    lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1 << 20)
    buf = memres.DeviceBuffer(size=16, mr=mr.FailureCallbackResourceAdaptor(lim, on_oom))
    def grow():
        try:
            buf.resize(4 << 20)
        except memres.OutOfMemory:
            pass
    t = threading.Thread(target=grow)
    t.start()
    in_callback.wait()
    said = []
    def alloc(nbytes):
        try:
            buf.tobytes()
        except memres.MemresError as e:
            said.append(str(e))
        return 1 << 40
    cb = mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="sim")
    cb.deallocate(cb.allocate(256), 256)
    go_on.set()
    t.join()
    assert len(said) == 1, said
    assert "held by another thread" in said[0] and "re-entrant" not in said[0], said[0]
    assert buf.tobytes() == bytes(16)  # nothing changed
    print("done")
""")


def test_dropping_a_buffer_while_its_pool_is_in_a_python_callback_does_not_freeze():
    # The pool's growth fails and asks the failure callback, holding the
    # pool's lock; the buffer's free needs it.
    run_child(held("""
    lim = mr.LimitingResourceAdaptor(mr.HostMemoryResource(), 1 << 20)
    pool = mr.PoolMemoryResource(mr.FailureCallbackResourceAdaptor(lim, slow), initial_pool_size=1 << 16)
    buf = memres.DeviceBuffer(size=64, mr=pool)
""", "pool.allocate(1 << 21)", "del buf"))


def test_daemon_threads_inside_memres_calls_at_exit_end_with_the_process():
    # CPython ends a thread that takes the GIL back during finalization by
    # unwinding it: from inside a memres call that aborted the process
    # (SIGABRT, "exception not rethrown"), in about one exit of five.
    code = textwrap.dedent("""
        import threading, memres
        from memres import mr
        res = mr.HostMemoryResource()
        top = mr.StatisticsResourceAdaptor(mr.FailureCallbackResourceAdaptor(
            mr.PoolMemoryResource(res, initial_pool_size=1 << 20), lambda n: False))
        def spin(resource):
            while True:
                resource.deallocate(resource.allocate(100), 100)
                memres.DeviceBuffer(size=64, mr=resource).tobytes()
        for r in (res, top, res, top):
            threading.Thread(target=spin, args=(r,), daemon=True).start()
        print("done")
    """)
    for _ in range(20):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LIMIT_S)
        assert out.returncode == 0 and out.stdout.strip() == "done", (out.returncode, out.stderr)


def test_a_daemon_thread_blocked_in_a_python_callback_does_not_keep_the_process_alive():
    # The exit waits for the calls that gave the GIL up, but not for ever:
    # a callback that never returns kept the process from ending.
    run_child("""
        import threading, memres
        from memres import mr
        blocked = threading.Event()
        def alloc(nbytes, stream):
            blocked.set()
            threading.Event().wait()
        cb = mr.CallbackMemoryResource(alloc, lambda p, n, s: None, backend="sim")
        threading.Thread(target=lambda: cb.allocate(100), daemon=True).start()
        blocked.wait()
        print("done")
    """)


def test_the_child_of_a_fork_exits_while_a_parent_thread_was_in_a_memres_call():
    # The child has only the thread that forked: the calls other threads
    # of the parent were in are not its to wait for (its exit hung).
    run_child("""
        import os, threading, time, memres
        data = bytes(8 << 20)
        def spin():
            while True:
                memres.DeviceBuffer.to_device(data)
        threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.2)
        for _ in range(5):
            start = time.monotonic()
            pid = os.fork()
            if pid == 0:
                raise SystemExit(0)  # the interpreter's whole exit, its handlers included
            _, status = os.waitpid(pid, 0)
            took = time.monotonic() - start
            assert os.waitstatus_to_exitcode(status) == 0, status
            # Far below the longest wait at exit (5 s), which it reached.
            assert took < 2.5, took
        print("done")
    """)


# The GIL changes hands only where a thread waits (the interval is never
# reached), so that what a thread sees of another's frames tells where that
# thread waits: the main thread gives the GIL up in `_at_exit` only inside
# memres's exit handler, once the exit has begun.
UNTIL_THE_EXIT = """
    import sys, threading, time
    sys.setswitchinterval(1000)
    MAIN = threading.main_thread().ident

    def wait_for(ident, name):
        # Until the thread `ident` waits inside the Python function `name`.
        while sys._current_frames()[ident].f_code.co_name != name:
            time.sleep(0.001)
"""


def test_a_call_begun_at_exit_beside_a_callback_holding_a_pools_lock_does_not_hang():
    # Once the exit had begun, a daemon thread's new call ran holding the
    # GIL: it waited for the pool's lock, which a thread inside the pool's
    # Python callback held while that one waited for the GIL, and the exit
    # waited for the GIL too: the process hung for ever.
    run_child(UNTIL_THE_EXIT + """
    from memres import mr
    inside, go, ident = threading.Event(), threading.Event(), {}
    def free(p, n):
        inside.set()
        wait_for(MAIN, "_at_exit")
        go.set()
        # Until the other thread is inside its release, which waits for
        # this one's pool lock (before the fix, with the GIL held: no
        # thread ran again).
        wait_for(ident["late"], "release")
    cb = mr.CallbackMemoryResource(lambda n: 1 << 40, free, backend="sim")
    pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
    threading.Thread(target=pool.release, daemon=True).start()
    def late():
        go.wait()
        pool.release()
    t = threading.Thread(target=late, daemon=True)
    t.start()
    ident["late"] = t.ident
    inside.wait()
    print("done")
    """)


@pytest.mark.parametrize("backend", ["sim", "cuda"])
def test_a_call_from_a_callback_at_exit_still_runs(backend, request):
    # A call from a Python callback under a memres call on its thread runs
    # once the exit has begun (with the GIL held): parked, its outer call
    # would keep the pool's lock, and the exit would wait for it in vain.
    # The call is the simulated module's; under a CUDA stack, the module
    # asks the other whether its thread is inside a call of the other's.
    if backend == "cuda":
        request.getfixturevalue("gpu")
    run_child(UNTIL_THE_EXIT + f"""
    from memres import mr
    other = mr.HostMemoryResource()
    def alloc(n):
        wait_for(MAIN, "_at_exit")
        other.deallocate(other.allocate(100), 100)
        print("the call from the callback ran", flush=True)
        return 1 << 40
    cb = mr.CallbackMemoryResource(alloc, lambda p, n: None, backend="{backend}")
    started = threading.Event()
    def grow():
        started.set()
        mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
    threading.Thread(target=grow, daemon=True).start()
    started.wait()
    print("done")
    """, expect="done\nthe call from the callback ran")


@pytest.mark.parametrize("backend", ["sim", "cuda"])
def test_a_call_from_a_callback_that_ends_once_the_exit_began_lets_its_outer_call_end(backend, request):
    # A call from a Python callback under a memres call, begun before the
    # exit and ended after it began, slept until the process ended, and its
    # outer call with it, holding the pool's lock: an exit handler that
    # ran later and freed into the pool spun for ever. Under a CUDA stack
    # the call from the callback is the other module's.
    if backend == "cuda":
        request.getfixturevalue("gpu")
    run_child("""
    import atexit
    def after():
        # Runs after memres's exit handler (registered before it).
        pool.deallocate(buf, 1000)
        print("freed", flush=True)
    atexit.register(after)
    """ + UNTIL_THE_EXIT + f"""
    from memres import mr
    addr = [1 << 40]
    def inner_alloc(n):
        wait_for(MAIN, "_at_exit")
        addr[0] += 1 << 30
        return addr[0]
    inner = mr.CallbackMemoryResource(inner_alloc, lambda p, n: None, backend="sim")
    inside = threading.Event()
    def outer_alloc(n):
        if threading.current_thread().name == "grow":
            inside.set()
            inner.allocate(256)
        addr[0] += 1 << 30
        return addr[0]
    cb = mr.CallbackMemoryResource(outer_alloc, lambda p, n: None, backend="{backend}")
    pool = mr.PoolMemoryResource(cb, initial_pool_size=1 << 20)
    buf = pool.allocate(1000)
    threading.Thread(target=lambda: pool.allocate(1 << 30), name="grow", daemon=True).start()
    inside.wait()
    print("done")
    """, expect="done\nfreed")
