"""Natural-gradient variational inference: ``NoisyKFAC`` and ``NoisyEKFAC``
(:mod:`vmfdist.optim.noisy`), and ``BatchedNoisyKFAC`` / ``BatchedNoisyEKFAC`` for many copies of one
MLP trained as one batched model (:mod:`vmfdist.optim.batched`).

Built on :mod:`vmfdist.curvature`; never imports ``vmfdist.nn`` or ``vmfdist.laplace``.
"""
from .noisy import PRESETS, NoisyEKFAC, NoisyKFAC
from .batched import BatchedNoisyEKFAC, BatchedNoisyKFAC

__all__ = ["NoisyKFAC", "NoisyEKFAC", "BatchedNoisyKFAC", "BatchedNoisyEKFAC", "PRESETS"]
