import contextlib
import os
import threading

import pytest

import memres
from memres import mr


@contextlib.contextmanager
def fresh_state():
    """Within it: no resource set (a default is made on first use), no
    reinitialize hook and this thread's device 0; on the way out, none of
    what was set within is left, in Python or in the native registries,
    and what was set before is back."""
    from memres import _device

    saved = dict(mr._current)
    hooks = list(memres._reinitialize_hooks)
    device = _device._local.__dict__.pop("device", None)
    mr._current.clear()
    memres._reinitialize_hooks.clear()
    try:
        yield
    finally:
        mr._forget_all()  # also the defaults that only the C functions made
        mr._current.update(saved)
        memres._reinitialize_hooks[:] = hooks
        _device._local.__dict__.pop("device", None)
        if device is not None:
            _device._local.device = device


@pytest.fixture(autouse=True)
def fresh_current_resource():
    """Each test runs in a :func:`fresh_state`."""
    with fresh_state():
        yield


def require_gpu():
    """Whether MEMRES_REQUIRE_GPU is set to anything but empty or 0, as the
    Rust tests read it."""
    return os.environ.get("MEMRES_REQUIRE_GPU", "") not in ("", "0")


def need(module):
    """The module, or a skip (a failure with MEMRES_REQUIRE_GPU=1 for the
    libraries the GPU machine has)."""
    try:
        return __import__(module)
    except ImportError:
        if require_gpu() and module in ("numpy", "cupy", "torch"):
            pytest.fail(f"MEMRES_REQUIRE_GPU=1 but {module} is not installed")
        pytest.skip(f"{module} is not installed")


@pytest.fixture
def gpu():
    """Skips without a GPU; fails instead with MEMRES_REQUIRE_GPU=1."""
    if not memres.cuda_available():
        if require_gpu():
            pytest.fail("MEMRES_REQUIRE_GPU=1 but memres's CUDA side sees no GPU")
        pytest.skip("no GPU (set MEMRES_REQUIRE_GPU=1 to make this a failure)")
    memres.set_device(0)


def registry_free_to_another_thread():
    """Whether another thread could take the device registry now (and so
    set a device's resource)."""
    got = []

    def other():
        got.append(mr._REGISTRY.acquire(blocking=False))
        if got[0]:
            mr._REGISTRY.release()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return got[0]


class _NoQualname(type):
    def __getattribute__(cls, name):
        if name == "__qualname__":
            raise RuntimeError("no __qualname__")
        return super().__getattribute__(name)


class OddError(Exception, metaclass=_NoQualname):
    """An exception whose type's ``__qualname__`` raises (its metaclass's
    doing): PyO3's ``Display`` of it fails."""
