"""Natural-gradient variational inference: ``NoisyKFAC`` and ``NoisyEKFAC``
(:mod:`vmfdist.optim.noisy`).

Built on :mod:`vmfdist.curvature`; never imports ``vmfdist.nn`` or ``vmfdist.laplace``.
"""
from .noisy import PRESETS, NoisyEKFAC, NoisyKFAC

__all__ = ["NoisyKFAC", "NoisyEKFAC", "PRESETS"]
