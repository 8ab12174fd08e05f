"""Natural-gradient variational inference: :class:`NoisyKFAC` and :class:`NoisyEKFAC`.

Built on :mod:`vmfdist.curvature`; never imports :mod:`vmfdist.nn` or :mod:`vmfdist.laplace`.
"""
from .noisy import PRESETS, NoisyEKFAC, NoisyKFAC

__all__ = ["NoisyKFAC", "NoisyEKFAC", "PRESETS"]
