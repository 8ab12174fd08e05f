"""vmfdist: directional and structured distributions for PyTorch.

Layers (data flows downward, nothing imports upward):

* :mod:`vmfdist.distributions` -- von Mises-Fisher and friends (torch.distributions API)
* :mod:`vmfdist.special`  -- Bessel ratios, log-Bessel functions, bounds, approximations
* :mod:`vmfdist.random`   -- counter-based (Philox4x32-10) uniforms and normals
* :mod:`vmfdist.ops`      -- the compiled operators (``torch.ops.vmfdist``) with their
  fake kernels and autograd formulas
* ``vmfdist._C``          -- the C++/CUDA extension (csrc/)
"""
from . import ops, random, special  # noqa: F401  (ops registers fake kernels and autograd)
from . import distributions  # noqa: F401,E402

__version__ = "0.1.0"
__all__ = ["distributions", "ops", "random", "special", "__version__"]
