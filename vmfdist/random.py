r"""Counter-based random numbers (Philox4x32-10) that follow ``torch.Generator``.

Every random op of vmfdist is a pure function of ``(seed, offset, index)``: the
compiled kernels run the project's own Philox4x32-10
(``csrc/include/vmfdist/philox.h``) keyed by ``seed``, with the output element's
index and ``offset`` in the counter.  So the same ``(seed, offset)`` gives the
same tensor on any number of threads and on CPU or GPU (bit-identical uniforms;
normals may differ in the last bit, since host and device ``log``/``cos``
differ).

The seed is drawn from a :class:`torch.Generator` by :func:`draw_seed_offset`:
one 63-bit integer per call, so ``torch.manual_seed`` (or seeding the generator
you pass) makes results reproducible and successive calls give fresh samples.

Which generator: the one you pass (on any device; a CUDA generator costs a
device synchronisation, since the seed must reach the host as a Python int), or
else the default CPU generator ``torch.default_generator`` *whatever the output
device*.  Drawing the seed on the host avoids a GPU synchronisation per call and
makes ``torch.manual_seed(s)`` give the very same samples on CPU and CUDA.
(``torch.cuda.manual_seed`` alone therefore does not affect these functions.)

Variates:

* :func:`philox_uniform` -- uniform on the open interval (0, 1), never 0 or 1:
  for a dtype with a ``P``-bit significand (float64 53, float32 24, float16 11,
  bfloat16 8) the values are the odd multiples of ``2**-P``, exactly
  representable and symmetric under ``u -> 1 - u``.
* :func:`philox_normal` -- standard normal by Box-Muller in float64 from two
  float64 uniforms, rounded once to the output dtype (``|z| <= 8.57``).
"""
from __future__ import annotations

from numbers import Integral
from typing import Optional, Sequence, Union

import torch

from ._ops import lib
from ._ops.random import MAX_OFFSET, draw_seed_offset

__all__ = ["draw_seed_offset", "philox_uniform", "philox_normal", "MAX_OFFSET"]

def _normalise_size(name: str, size) -> list:
    if isinstance(size, Integral):
        size = (size,)
    if isinstance(size, torch.Size):
        size = tuple(size)
    if not isinstance(size, Sequence) or not all(isinstance(s, Integral) for s in size):
        raise TypeError(f"{name}: size must be an int or a sequence of ints, got {size!r}")
    if any(s < 0 for s in size):
        raise ValueError(f"{name}: size must be non-negative, got {tuple(size)}")
    return [int(s) for s in size]


def _factory(name: str, op, size, generator, dtype, device) -> torch.Tensor:
    shape = _normalise_size(name, size)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{name}: dtype must be float16, bfloat16, float32 or float64, got {dtype}")
    device = torch.get_default_device() if device is None else torch.device(device)
    seed, offset = draw_seed_offset(generator, device)
    return op(shape, seed, offset, dtype=dtype, device=device)


def philox_uniform(size, *, generator: Optional[torch.Generator] = None, dtype: Optional[torch.dtype] = None,
                   device: Optional[Union[torch.device, str]] = None) -> torch.Tensor:
    """Uniform variates on the open interval (0, 1), like :func:`torch.rand`.

    ``size`` is an int or a sequence of ints; ``dtype`` defaults to the default
    dtype and ``device`` to the default device.  The seed is drawn from
    ``generator`` (default: ``torch.default_generator``) by
    :func:`draw_seed_offset`.  Element ``i`` (row-major) is the first uniform of
    the Philox stream ``(seed, 0, i)``.
    """
    return _factory("philox_uniform", lib.philox_uniform, size, generator, dtype, device)


def philox_normal(size, *, generator: Optional[torch.Generator] = None, dtype: Optional[torch.dtype] = None,
                  device: Optional[Union[torch.device, str]] = None) -> torch.Tensor:
    """Standard normal variates, like :func:`torch.randn` (see :func:`philox_uniform`).

    Element ``i`` is the first Box-Muller variate of the Philox stream
    ``(seed, 0, i)``, computed in float64 and rounded to ``dtype``.
    """
    return _factory("philox_normal", lib.philox_normal, size, generator, dtype, device)
