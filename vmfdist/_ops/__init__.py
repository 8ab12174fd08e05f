"""Private: registrations for the compiled operators, one module per op family.

Every operator is declared once in ``csrc/ops.cpp`` (namespace ``vmfdist``) and implemented
by ``csrc/cpu/*_cpu.cpp`` and ``csrc/cuda/*_cuda.cu``.  Importing this package loads the
extension (:mod:`._lib`, which also holds :data:`lib`, the ``torch.ops.vmfdist`` namespace)
and registers, per family, the fake (meta) kernels that ``torch.compile`` and meta tensors
need and the autograd formulas:

* :mod:`.special` -- Bessel ratios, log-Bessel functions, bounds, approximations
* :mod:`.random`  -- Philox uniforms and normals; :func:`.random.call_sampler`, the one path
  from every sampler to its op (seed drawn inside the op, as torch's random ops do)
* :mod:`.vmf`     -- the von Mises--Fisher sampler (implicit reparameterisation)
* :mod:`.power_spherical` -- the power spherical sampler (the vMF reflection, a Beta marginal)
* :mod:`.radial`  -- the fused radial noise
* :mod:`.meanfield` -- mean-field Gaussian sampling (softplus scale) and its KL to a Gaussian prior
* :mod:`.rdp`     -- the KL of a radial--directional layer's grouping, with its gradient
* :mod:`.kron`    -- the Kronecker-eigenbasis products and noise

The public functions over these ops live in the modules of their area
(:mod:`vmfdist.special`, :mod:`vmfdist.random`, :mod:`vmfdist.linalg`,
:mod:`vmfdist.distributions`).
"""
from . import kron, meanfield, power_spherical, radial, random, rdp, special, vmf  # noqa: F401  (registrations)
from ._lib import lib

__all__ = ["lib"]
