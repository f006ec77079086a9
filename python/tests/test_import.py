"""`import memres` where no CUDA driver library can be found."""

import ctypes
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, memres
try:
    ctypes.CDLL("libcuda.so.1")
    driver = True
except OSError:
    driver = False
pool = memres.mr.PoolMemoryResource(memres.mr.SimulatedMemoryResource(1 << 30), initial_pool_size=1 << 20)
p = pool.allocate(4096)
pool.deallocate(p, 4096)
if driver:
    print("DRIVER-FOUND")
    raise SystemExit(0)
assert not memres.cuda_available()
try:
    memres.mr.CudaMemoryResource()
except memres.CudaUnavailable as e:
    print("ERROR:", e)
"""


def test_import_works_without_the_driver_library_and_cuda_says_what_is_missing():
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                         cwd="/")
    assert out.returncode == 0, out.stderr
    if "DRIVER-FOUND" in out.stdout:
        pytest.skip("this machine has libcuda.so.1 on the loader's path")
    assert "ERROR:" in out.stdout
    # The loader's own words: the CUDA side is this build's module and
    # failed only for want of the driver library (a module of another
    # build fails otherwise, and would fail so on a GPU too).
    assert "libcuda.so.1: cannot open shared object file" in out.stdout, out.stdout


def test_the_installed_package_is_tested():
    import memres
    # The tests run against the installed wheel, not the source folder.
    assert "site-packages" in memres.__file__ or os.environ.get("MEMRES_TEST_SOURCE") == "1", memres.__file__


def test_the_package_names_the_commit_it_was_built_from_as_rmms():
    import re
    import memres
    commit = memres.__git_commit__
    assert isinstance(commit, str) and re.fullmatch("[0-9a-f]{40}|", commit), commit
    # Built from this checkout (python/test.sh builds, then tests): its HEAD.
    # Only where the tests are in the checkout beside the package's source:
    # a bundle of them (python/gpu/bundle.sh) may be unpacked inside another.
    here = os.path.dirname(__file__)
    if not os.path.isfile(os.path.join(here, "..", "memres", "__init__.py")):
        return
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here)
    if head.returncode == 0:
        assert commit == head.stdout.strip()
