"""Fake kernels of the counter-based random ops (``csrc/include/vmfdist/philox.h``), and the
one path every sampler takes to its op: :func:`random_kwargs` (validate ``generator`` /
``seed`` / ``offset``) and :func:`call_sampler` (call the op with ``num_samples`` and reshape
its first output to ``sample_shape``).

Randomness flows the way torch's own random ops do: each random op takes
``generator=None, seed=None, offset=None`` (keyword-only) and, without an explicit seed,
draws it *inside the op* from ``generator`` or the device's default generator
(``csrc/host/random_state.h``).  The ops are tagged ``nondeterministic_seeded``, so
``torch.compile`` keeps them in the graph (and never recomputes them in the backward),
``torch.jit.trace`` records a call that draws afresh each time, and on CUDA the seed and
offset are read on the device (CUDA-graph capture needs no host read-back).

Integer or random outputs, so no autograd formulas here.
"""
from __future__ import annotations

import math
from numbers import Integral
from typing import Optional

import torch


__all__ = ["MAX_SEED", "MAX_OFFSET", "random_kwargs", "check_sample_shape", "call_sampler"]

#: Exclusive upper bound of an explicit ``seed``.
MAX_SEED = 2 ** 63
#: Exclusive upper bound of ``offset`` (and of the number of Philox streams of one call).
MAX_OFFSET = 2 ** 48


@torch.library.register_fake("vmfdist::philox4x32")
def _(counter, key, rounds=10):
    torch._check(counter.dtype == torch.int64, lambda: f"philox4x32: counter must have dtype int64, got {counter.dtype}")
    torch._check(key.dtype == torch.int64, lambda: f"philox4x32: key must have dtype int64, got {key.dtype}")
    torch._check(counter.dim() == 2 and counter.shape[1] == 4,
                 lambda: f"philox4x32: counter must have shape (n, 4), got {tuple(counter.shape)}")
    torch._check(key.dim() == 2 and key.shape[1] == 2,
                 lambda: f"philox4x32: key must have shape (n, 2), got {tuple(key.shape)}")
    torch._check(counter.shape[0] == key.shape[0],
                 lambda: "philox4x32: counter and key must have the same number of rows")
    return counter.new_empty((counter.shape[0], 4))


def _philox_factory_fake(size, *, dtype, device, generator=None, seed=None, offset=None):
    return torch.empty(size, dtype=dtype, device=device)


torch.library.register_fake("vmfdist::philox_uniform")(_philox_factory_fake)
torch.library.register_fake("vmfdist::philox_normal")(_philox_factory_fake)


def _check_int(name: str, arg: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name}: {arg} must be an int, got {type(value).__name__}")
    if not low <= value < high:
        raise ValueError(f"{name}: {arg} must be in [{low}, {high}), got {value}")
    return int(value)


def random_kwargs(name: str, generator: Optional[torch.Generator] = None, seed: Optional[int] = None,
                  offset: Optional[int] = None, streams: int = 1) -> dict:
    """The keyword arguments of a vmfdist random op, validated with messages naming ``name``.

    Without ``seed`` the op draws its seed from ``generator`` (default: the default generator
    of the output's device); with ``seed`` (an int in ``[0, 2**63)``) it uses ``seed`` and
    ``offset`` (default 0; an op that uses ``streams`` consecutive offsets needs
    ``offset + streams <= 2**48``), and ``generator`` must be None."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{name}: generator must be a torch.Generator or None, got {type(generator).__name__}")
    if seed is None:
        if offset is not None:
            raise ValueError(f"{name}: offset needs an explicit seed (pass seed=... too)")
        return {} if generator is None else {"generator": generator}
    if generator is not None:
        raise ValueError(f"{name}: pass either generator or seed, not both")
    seed = _check_int(name, "seed", seed, 0, MAX_SEED)
    offset = _check_int(name, "offset", 0 if offset is None else offset, 0, MAX_OFFSET - streams + 1)
    return {"seed": seed, "offset": offset}


def check_sample_shape(name: str, sample_shape) -> torch.Size:
    """``sample_shape`` as a ``torch.Size`` of non-negative sizes (ints or symbolic ints)."""
    if isinstance(sample_shape, (Integral, torch.SymInt)) and not isinstance(sample_shape, bool):
        sample_shape = (sample_shape,)
    try:
        shape = torch.Size(sample_shape)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: sample_shape must be a sequence of ints, got {sample_shape!r}") from None
    for s in shape:
        if isinstance(s, int) and not 0 <= s < MAX_SEED:
            raise ValueError(f"{name}: sample_shape must hold sizes in [0, 2**63), got {tuple(shape)}")
    return shape


def call_sampler(name: str, op, *args, sample_shape=torch.Size(), generator=None, seed=None, offset=None,
                 streams: int = 1, event_shape=None, **kwargs):
    """The one path from a sampler to its op.

    Calls ``op(*args, num_samples, **kwargs, <randomness>)`` with ``num_samples`` the number
    of elements of ``sample_shape`` and the randomness of :func:`random_kwargs`, and returns
    the op's outputs with the first, of shape ``(num_samples, *rest)``, reshaped to
    ``sample_shape + event_shape`` (default ``rest``)."""
    shape = check_sample_shape(name, sample_shape)
    rng = random_kwargs(name, generator, seed, offset, streams)
    outs = op(*args, math.prod(shape), **kwargs, **rng)
    first, rest = (outs[0], tuple(outs[1:])) if isinstance(outs, (tuple, list)) else (outs, ())
    tail = first.shape[1:] if event_shape is None else torch.Size(event_shape)
    return (first.reshape(shape + tail),) + rest
