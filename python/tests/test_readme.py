"""The README's Python quick start runs as written (on the GPU with CUDA,
here over host memory)."""

import os
import re
import subprocess
import sys

import pytest

import memres
from conftest import need

HERE = os.path.dirname(os.path.abspath(__file__))


def blocks():
    path = os.environ.get("MEMRES_README") or os.path.join(HERE, "..", "..", "README.md")
    text = open(path).read()
    section = text[text.index("## Quick start in Python"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def run(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    assert out.returncode == 0, out.stderr


def test_the_quick_start_runs():
    code = blocks()[0]
    assert "reinitialize" in code and "statistics" in code
    run(code)


def test_pytorch_in_two_lines(gpu):
    need("torch")
    code = blocks()[1]
    assert len(code.strip().splitlines()) == 2
    # The stack counts: PyTorch's tensors came through memres.
    run(code + "import torch\nx = torch.ones(1000, device='cuda')\nassert float(x.sum()) == 1000\n"
        "assert memres.statistics.get_statistics().current_bytes >= 4000\n")
