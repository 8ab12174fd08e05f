"""The compiled operator library and the helpers every op family's registrations share.

Importing this module loads the extension ``vmfdist._C``, whose static
``TORCH_LIBRARY(vmfdist, m)`` block (``csrc/ops.cpp``) declares every schema and whose
backend files register the CPU and CUDA kernels.  :data:`lib` is that operator library,
``torch.ops.vmfdist``.
"""
from __future__ import annotations

import torch

from .. import _C  # noqa: F401  (loading the library runs the TORCH_LIBRARY registrations)

#: The ``vmfdist`` operator library (``torch.ops.vmfdist``), declared in ``csrc/ops.cpp``.
lib = torch.ops.vmfdist


def _check_same_device(op: str, **tensors: torch.Tensor) -> None:
    """All ``tensors`` (keyword: argument name) on one device, as the C++ kernels require.

    A fake kernel must make this check itself: a tensor on ``meta`` sends the whole call
    here instead of to the CPU or CUDA kernel, which would have refused it.
    """
    (first, t0), *rest = tensors.items()
    for name, t in rest:
        torch._check(t.device == t0.device,
                     lambda: f"{op}: {name} must be on the same device as {first}, got {name} on {t.device} "
                             f"and {first} on {t0.device}")


def _binary_result(nu: torch.Tensor, z: torch.Tensor, op: str = "vmfdist", names=("nu", "z")) -> torch.Tensor:
    """The output of an elementwise op (``csrc/include/vmfdist/elementwise.h``): the broadcast
    shape, contiguous, in the promoted floating dtype, on the inputs' common device."""
    _check_same_device(op, **{names[0]: nu, names[1]: z})
    dt = torch.result_type(nu, z)
    if not dt.is_floating_point:
        dt = torch.get_default_dtype()
    shape = torch.broadcast_shapes(nu.shape, z.shape)
    return nu.new_empty(shape, dtype=dt)


def _sum_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reduce a broadcast gradient back to the shape (and dtype) of ``like``."""
    if grad.shape != like.shape:
        lead = grad.dim() - like.dim()
        if lead > 0:
            grad = grad.sum(dim=tuple(range(lead)))
        dims = tuple(i for i, s in enumerate(like.shape) if s == 1 and grad.shape[i] != 1)
        if dims:
            grad = grad.sum(dim=dims, keepdim=True)
    return grad.to(like.dtype) if like.is_floating_point() else grad


def _once_differentiable(op: str, wrt: str) -> None:
    """Raise a clear error when a backward formula that is not itself differentiable runs with
    grad mode on (``create_graph=True``, i.e. a double backward is being built), instead of
    silently returning a first derivative whose own derivative is 0 or missing."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{op} is differentiable only once with respect to {wrt}: its second derivative is not "
                           f"implemented, so backward with create_graph=True (double backward, Hessians, gradient "
                           f"penalties) through it is refused rather than silently wrong")
