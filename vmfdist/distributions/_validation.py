"""Argument checks shared by the distributions: every error names the argument at fault.

Private; used by the constructors (``as_real_tensor``, ``same_device``) and by ``log_prob``
(``check_value``), so that wrong input gives a clear error instead of a cast, a bare
size-mismatch ``RuntimeError`` or a failure deep inside a kernel.
"""
from __future__ import annotations

from numbers import Integral
from typing import Optional, Sequence

import torch

from .. import _torch_internals as internals

__all__ = ["as_real_tensor", "same_device", "check_value", "validate_params", "check_shape"]


def as_real_tensor(name: str, x, dtype: Optional[torch.dtype] = None,
                   device: Optional[torch.device] = None) -> torch.Tensor:
    """``x`` as a real floating tensor (integers and bools become the default dtype).

    A tensor keeps its dtype and device; anything else is converted with
    ``torch.as_tensor`` on ``device`` (straight to ``dtype`` if that is given and floating).
    ``None``, strings, complex values and objects torch cannot convert raise a ``TypeError``
    naming ``name``.
    """
    if x is None:
        raise TypeError(f"{name} must be a tensor or a real number, got None")
    if isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be a tensor or a real number, got the string {x!r}")
    if isinstance(x, complex) or (isinstance(x, torch.Tensor) and x.is_complex()):
        dt = x.dtype if isinstance(x, torch.Tensor) else "complex"
        raise TypeError(f"{name} must be real, got a complex value ({dt})")
    if not isinstance(x, torch.Tensor):
        def convert(dt):
            try:
                return torch.as_tensor(x, dtype=dt, device=device)
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"{name} must be a tensor or an array-like of real numbers, got "
                                f"{type(x).__name__} ({e})") from None

        t = convert(None)
        if t.is_complex():
            raise TypeError(f"{name} must be real, got a complex value ({t.dtype})")
        if dtype is not None and dtype.is_floating_point:
            t = convert(dtype)  # from the data again: no rounding to the default dtype first
        x = t
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return x


def same_device(dist: str, named: dict) -> torch.device:
    """The common device of the tensors in ``named`` (a ``ValueError`` naming both arguments
    if they differ: mixing e.g. CPU and ``meta`` tensors is refused, not computed)."""
    items = list(named.items())
    first, dev = items[0][0], items[0][1].device
    for name, t in items[1:]:
        if t.device != dev:
            raise ValueError(f"{dist}: {name} must be on the same device as {first}, got {t.device} and {dev}")
    return dev


def check_value(dist: str, value, batch_shape: torch.Size, event_shape: torch.Size) -> torch.Tensor:
    """Shape check of a ``log_prob`` argument, done whether or not ``validate_args`` is on:
    the trailing dimensions must equal ``event_shape`` and the leading ones must broadcast
    against ``batch_shape``.  Returns ``value`` (a ``ValueError`` otherwise)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{dist}.log_prob: value must be a tensor, got {type(value).__name__}")
    k = len(event_shape)
    if value.dim() < k or tuple(value.shape[value.dim() - k:]) != tuple(event_shape):
        raise ValueError(f"{dist}.log_prob: value must end in the event shape {tuple(event_shape)}, got shape "
                         f"{tuple(value.shape)}")
    try:
        torch.broadcast_shapes(value.shape[:value.dim() - k], batch_shape)
    except RuntimeError:
        raise ValueError(f"{dist}.log_prob: the leading dimensions of value (shape {tuple(value.shape)}) do not "
                         f"broadcast against the batch shape {tuple(batch_shape)}") from None
    return value


def validate_params(dist, values: dict, constraints: dict) -> None:
    """torch's parameter validation (``Distribution.__init__``) for parameters whose
    constructor name differs from the attribute that holds them."""
    for name, constraint in constraints.items():
        value = values[name]
        if not internals.is_all_true(constraint.check(value)):
            raise ValueError(f"Expected parameter {name} ({type(value).__name__} of shape {tuple(value.shape)}) "
                             f"of distribution {dist!r} to satisfy the constraint {constraint!r}, but found "
                             f"invalid values:\n{value}")


def check_shape(name: str, shape) -> torch.Size:
    """A batch shape given by the user: a sequence of non-negative ints (symbolic sizes under
    torch.compile are kept; torch.jit.trace's 0-dim integer size tensors become ints)."""
    if isinstance(shape, Integral) and not isinstance(shape, bool):
        shape = (shape,)
    if isinstance(shape, (Sequence, torch.Size)):
        shape = tuple(int(s) if isinstance(s, torch.Tensor) and s.dim() == 0 and not s.is_floating_point()
                      and s.dtype != torch.bool else s for s in shape)
    if not isinstance(shape, (Sequence, torch.Size)) or not all(
            isinstance(s, (Integral, torch.SymInt)) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"{name} must be a sequence of non-negative ints, got {shape!r}")
    if any(s < 0 for s in shape):
        raise ValueError(f"{name} must be a sequence of non-negative ints, got {tuple(int(s) for s in shape)}")
    return torch.Size([int(s) for s in shape])
