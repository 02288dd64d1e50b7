"""Whether this machine can run PyTorch on an NVIDIA GPU, and if not why: the GPU tests skip and
the GPU benchmarks print the reason with it (one wording for all of them)."""

from __future__ import annotations

import glob
import importlib


def why_no_torch_gpu() -> str | None:
    """None when a GPU device node exists and PyTorch sees a CUDA device; else the reason."""
    if not glob.glob("/dev/nvidia[0-9]*"):
        return "no NVIDIA GPU on this machine (/dev/nvidia0 missing)"
    try:
        torch = importlib.import_module("torch")  # by name: mypy need not find PyTorch's stubs
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch has no CUDA device"
    return None
