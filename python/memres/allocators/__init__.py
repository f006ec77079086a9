"""Allocators that put memres under PyTorch (``torch``), CuPy (``cupy``)
and Numba (``numba``). Each submodule imports its framework only when
used."""
