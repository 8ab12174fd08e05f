"""Test helpers shared by the test suite and downstream users (as in pytorch_scatter).

``devices``/``cpu_and_cuda()`` parametrise tests over the available devices (CUDA
cases are kept but skipped on machines without a GPU, so the test ids are the same
everywhere), ``float_dtypes``/``dtypes`` over floating types.
"""
from __future__ import annotations

from typing import List

import pytest
import torch

__all__ = ["float_dtypes", "dtypes", "grad_dtypes", "devices", "cpu_and_cuda", "needs_cuda", "tensor"]

float_dtypes: List[torch.dtype] = [torch.float32, torch.float64]
dtypes: List[torch.dtype] = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
grad_dtypes: List[torch.dtype] = [torch.float64]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


def cpu_and_cuda():
    """``pytest.mark.parametrize("device", cpu_and_cuda())``: CPU always, CUDA skipped without a GPU."""
    return ("cpu", pytest.param("cuda", marks=needs_cuda))


devices: List[torch.device] = [torch.device("cpu")] + (
    [torch.device("cuda")] if torch.cuda.is_available() else []
)


def tensor(x, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.tensor(x)`` with the given dtype and device (None passes through)."""
    return None if x is None else torch.tensor(x, dtype=dtype, device=device)
