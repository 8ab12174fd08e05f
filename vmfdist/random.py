r"""Counter-based random numbers (Philox4x32-10) that follow ``torch.Generator``.

Every random op of vmfdist is a pure function of ``(seed, offset, index)``: the
compiled kernels run the project's own Philox4x32-10
(``csrc/include/vmfdist/philox.h``) keyed by ``seed``, with the output element's
index and ``offset`` in the counter.  So the same ``(seed, offset)`` gives the same
tensor on any number of threads.

Where the seed comes from (every sampler of the library: these functions,
``VonMisesFisher``, ``HypersphericalUniform``, ``Radial``, the matrix normals, and
:func:`vmfdist.linalg.kron_eigen_sample`) -- the way torch's own random ops work:

* by default the op draws it *inside the compiled kernel's host code* from the
  default generator of the output's device: on the CPU one draw of
  ``torch.default_generator`` (the seed; offset 0), on CUDA the Philox seed and
  offset of the current device's default CUDA generator (``torch.cuda.manual_seed``,
  read on the device, so CUDA-graph capture works).  ``torch.manual_seed(s)`` seeds
  both, so it makes every sampler reproducible; successive calls give fresh samples.
* ``generator=g`` uses ``g`` instead (it must be on the output's device, as for
  :func:`torch.randn`).
* ``seed=s, offset=o`` (ints, ``0 <= s < 2**63``, ``0 <= o < 2**48``) gives exactly the
  streams ``(s, o, index)``: deterministic, for tests and reproducibility.

Because the seed is drawn inside the op (tagged ``nondeterministic_seeded``), code
compiled with ``torch.compile`` (``fullgraph=True``, dynamic shapes included), traced
with ``torch.jit.trace`` or captured in a CUDA graph draws fresh samples on every call,
and the compiled code gives the same samples as eager code after the same
``torch.manual_seed``.  Nothing is read back to the host.

What is reproduced where: the same ``(seed, offset)`` gives the same tensor for any
number of threads (tested), and the raw Philox words and the uniforms are bit-identical
on CPU and CUDA (checked by the CUDA tests, which need a GPU).  Anything computed through
transcendental functions -- the float64 normals (Box-Muller through ``log``, ``cos``,
``sin``), the vMF marginal and the radial radius -- may differ in the last bits between
the host's libm and CUDA's, and the GPU reduces the vMF and radial sums in a different
order; CPU and CUDA samples for the same ``(seed, offset)`` agree to a few ulp, not
bitwise.  With the default generators the two devices draw different seeds, so their
samples are unrelated.

Variates:

* :func:`philox_uniform` -- uniform on the open interval (0, 1), never 0 or 1:
  for a dtype with a ``P``-bit significand (float64 53, float32 24, float16 11,
  bfloat16 8) the values are the odd multiples of ``2**-P``, exactly
  representable and symmetric under ``u -> 1 - u``.
* :func:`philox_normal` -- standard normal by Box-Muller in float64 from two
  float64 uniforms, rounded once to the output dtype (``|z| <= 8.57``).

For code that calls a compiled random op itself (e.g. the overloads in :mod:`vmfdist.linalg`),
:func:`random_kwargs` turns ``generator`` / ``seed`` / ``offset`` into the op's keyword
arguments, validated with messages that name the caller: ``{}`` (the op draws from the device's
default generator), ``{"generator": g}``, or ``{"seed": s, "offset": o}``.
"""
from __future__ import annotations

from numbers import Integral
from typing import Optional, Sequence, Union

import torch

from ._ops import lib
from ._ops.random import MAX_OFFSET, MAX_SEED, random_kwargs

__all__ = ["philox_uniform", "philox_normal", "random_kwargs", "MAX_SEED", "MAX_OFFSET"]


def _normalise_size(name: str, size) -> list:
    if isinstance(size, Integral):
        size = (size,)
    if isinstance(size, torch.Size):
        size = tuple(size)
    if not isinstance(size, Sequence) or not all(isinstance(s, Integral) for s in size):
        raise TypeError(f"{name}: size must be an int or a sequence of ints, got {size!r}")
    if any(s < 0 for s in size):
        raise ValueError(f"{name}: size must be non-negative, got {tuple(size)}")
    numel = 1
    for s in size:
        numel *= int(s)
    if numel >= MAX_OFFSET:
        raise ValueError(f"{name}: size must have fewer than 2**48 elements, got {tuple(size)}")
    return [int(s) for s in size]


def _factory(name: str, op, size, generator, seed, offset, dtype, device) -> torch.Tensor:
    shape = _normalise_size(name, size)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{name}: dtype must be float16, bfloat16, float32 or float64, got {dtype}")
    if device is None:  # (Dynamo cannot trace get_default_device; a 0-element tensor lands on it)
        device = torch.empty(0).device if torch.compiler.is_compiling() else torch.get_default_device()
    else:
        device = torch.device(device)
    return op(shape, dtype=dtype, device=device, **random_kwargs(name, generator, seed, offset))


def philox_uniform(size, *, generator: Optional[torch.Generator] = None, dtype: Optional[torch.dtype] = None,
                   device: Optional[Union[torch.device, str]] = None, seed: Optional[int] = None,
                   offset: Optional[int] = None) -> torch.Tensor:
    """Uniform variates on the open interval (0, 1), like :func:`torch.rand`.

    ``size`` is an int or a sequence of ints; ``dtype`` defaults to the default
    dtype and ``device`` to the default device.  The seed comes from ``generator``
    (default: the default generator of ``device``), or is ``seed`` (with ``offset``,
    default 0); see the module docstring.  Element ``i`` (row-major) is the first
    uniform of the Philox stream ``(seed, offset, i)``.
    """
    return _factory("philox_uniform", lib.philox_uniform, size, generator, seed, offset, dtype, device)


def philox_normal(size, *, generator: Optional[torch.Generator] = None, dtype: Optional[torch.dtype] = None,
                  device: Optional[Union[torch.device, str]] = None, seed: Optional[int] = None,
                  offset: Optional[int] = None) -> torch.Tensor:
    """Standard normal variates, like :func:`torch.randn` (see :func:`philox_uniform`).

    Element ``i`` is the first Box-Muller variate of the Philox stream
    ``(seed, offset, i)``, computed in float64 and rounded to ``dtype``.
    """
    return _factory("philox_normal", lib.philox_normal, size, generator, seed, offset, dtype, device)
