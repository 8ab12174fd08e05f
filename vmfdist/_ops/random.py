"""Fake kernels of the counter-based random ops (``csrc/include/vmfdist/philox.h``), and
:func:`draw_seed_offset`, which every random op uses to take its seed from a ``torch.Generator``.

Integer or random outputs, so no autograd formulas here.
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

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


def _philox_factory_fake(size, seed, offset, *, dtype, device):
    return torch.empty(size, dtype=dtype, device=device)


torch.library.register_fake("vmfdist::philox_uniform")(_philox_factory_fake)
torch.library.register_fake("vmfdist::philox_normal")(_philox_factory_fake)


#: Exclusive upper bound of ``offset`` (and of the number of elements of one call).
MAX_OFFSET = 2 ** 48

_SEED_HIGH = 2 ** 63 - 1  # seeds are drawn uniformly from [0, 2**63 - 1)


def draw_seed_offset(generator: Optional[torch.Generator] = None,
                     device: Optional[Union[torch.device, str]] = None) -> Tuple[int, int]:
    """Draw ``(seed, offset)`` for a vmfdist random op from ``generator``.

    ``seed`` is a uniform 63-bit integer drawn from ``generator`` (one draw, so
    the generator advances and successive calls differ); if ``generator`` is
    None, the default CPU generator is used whatever ``device`` is (see the
    module docstring; ``device`` is accepted so callers can pass the output
    device, and is only checked).  ``offset`` is 0: it is left to ops that want
    several independent tensors from one seed, which use offsets 0, 1, 2, ...
    (and, within an element, the stream's block counter; see ``philox.h``).
    """
    if device is not None:
        torch.device(device)  # validates the argument
    if generator is None:
        generator = torch.default_generator
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    seed = torch.randint(0, _SEED_HIGH, (), generator=generator, device=generator.device, dtype=torch.int64)
    return int(seed.item()), 0
