"""vmfdist: directional and structured distributions for PyTorch.

Floors of the house (data flows downward, nothing imports from a floor above its own):

* ``vmfdist.experiments`` -- the papers' experiments as commands (``python -m vmfdist.experiments``)
* ``vmfdist.laplace``     -- K-FAC / EK-FAC Laplace approximations (laplace-torch's interface)
* ``vmfdist.optim``       -- noisy K-FAC / noisy EK-FAC (natural-gradient VI)
* :mod:`vmfdist.nn`       -- Bayesian layers, the ELBO, conversion, predictive, RDP pruning
* ``vmfdist.curvature``   -- K-FAC / EK-FAC Kronecker factors of ordinary layers
* :mod:`vmfdist.distributions` -- von Mises-Fisher and friends (torch.distributions API)
* :mod:`vmfdist.special`  -- Bessel ratios, log-Bessel functions, bounds, approximations
* :mod:`vmfdist.random`   -- counter-based (Philox4x32-10) uniforms and normals
* :mod:`vmfdist.linalg`   -- Kronecker-eigenbasis products and samples, the vMF reflection
* ``vmfdist._ops``        -- (private) fake kernels and autograd of the compiled operators
* ``vmfdist._C``          -- the C++/CUDA extension (csrc/)
"""
from . import _ops  # noqa: F401  (loads the extension; registers fake kernels and autograd)
from . import distributions, linalg, random, special  # noqa: F401
from . import nn  # noqa: F401,E402  (after distributions: the layers are built on them)

__version__ = "0.1.0"
__all__ = ["distributions", "linalg", "nn", "random", "special", "__version__"]
