"""Threads: two buffers copied into each other from two threads do not
deadlock.

A deadlock can freeze the whole interpreter, so each case runs in a child
process that must end within a time limit."""

import subprocess
import sys
import textwrap

import pytest

# Each case takes a second or two when nothing hangs.
LIMIT_S = 30


def run_child(code):
    """Runs ``code`` in a child Python; fails the test if it hangs or
    does not print ``done``."""
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung (no end within {LIMIT_S} s)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("done"), out.stdout + out.stderr


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
        assert a.copy_to_host() == b.copy_to_host()
        print("done")
    """)
