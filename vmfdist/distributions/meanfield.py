r"""Fused operations on a factorised (mean-field) Gaussian with a softplus scale,
:math:`q(w) = \prod_i \mathcal N(w_i \mid \mu_i, \sigma_i^2)`, :math:`\sigma = \mathrm{softplus}(\rho)
= \log(1 + e^\rho)` -- the posterior of the mean-field Bayesian layers
(:class:`vmfdist.nn.MeanFieldLinear`, :class:`vmfdist.nn.MeanFieldConv2d`), parameterised by
:math:`\rho` as they store it.

* :func:`meanfield_sample`: :math:`w = \mu + \mathrm{softplus}(\rho)\odot\epsilon` in one pass
  (``torch.distributions.Normal(mu, softplus(rho)).rsample`` takes three), with
  reparameterised gradients in :math:`\mu` and :math:`\rho`;
* :func:`meanfield_kl`: :math:`\sum_i \mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2)\,\|\,\mathcal N(m_i, s_i^2))
  = \sum_i \log\frac{s_i}{\sigma_i} + \frac{\sigma_i^2 + (\mu_i - m_i)^2}{2 s_i^2} - \frac12` in one
  pass, summed in double precision.

Both are compiled ops (``csrc/include/vmfdist/meanfield.h``); the normals come from the
project's Philox streams (element ``j`` of sample ``s`` is normal ``j`` of stream
``(seed, offset, s)``), with the seed drawn inside the op from ``generator`` or the default
generator, as for every random op of the library (:mod:`vmfdist.random`).
"""
from __future__ import annotations

from typing import Optional

import torch

from .._ops import lib
from .._ops.random import check_sample_shape, random_kwargs
from ._validation import as_real_tensor, same_device

__all__ = ["meanfield_sample", "meanfield_kl"]


def _loc_rho(name, loc, rho):
    rho = as_real_tensor(f"{name}: rho", rho)
    if not rho.dtype.is_floating_point:
        rho = rho.to(torch.get_default_dtype())
    if loc is not None:
        loc = as_real_tensor(f"{name}: loc", loc, dtype=rho.dtype, device=rho.device)
        same_device(name, {"rho": rho, "loc": loc})
        if loc.shape != rho.shape:
            raise ValueError(f"{name}: loc and rho must have the same shape, got {tuple(loc.shape)} and "
                             f"{tuple(rho.shape)}")
        loc = loc.to(rho.dtype)
    return loc, rho


def meanfield_sample(loc: Optional[torch.Tensor], rho: torch.Tensor, sample_shape=torch.Size(),
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""``loc + softplus(rho) * eps`` with ``eps`` standard normal, for each of ``sample_shape``
    samples (shape ``sample_shape + rho.shape``), in one fused pass; ``loc=None`` draws the
    zero-mean ``softplus(rho) * eps``.  Differentiable in ``loc`` and ``rho`` (reparameterised);
    the backward pass regenerates ``eps`` from its Philox streams.  ``loc`` and ``rho`` have one
    shape (no broadcasting: they are one parameter tensor's mean and scale)."""
    loc, rho = _loc_rho("meanfield_sample", loc, rho)
    shape = check_sample_shape("meanfield_sample", sample_shape)
    n = 1
    for s in shape:
        n *= s
    out = lib.meanfield_sample(loc, rho, None, None, n, False, **random_kwargs("meanfield_sample", generator))[0]
    return out.reshape(shape + rho.shape)


def meanfield_kl(loc: torch.Tensor, rho: torch.Tensor, prior_loc=0.0, prior_scale=1.0) -> torch.Tensor:
    r""":math:`\sum_i \mathrm{KL}\big(\mathcal N(\mu_i, \mathrm{softplus}(\rho_i)^2)\,\|\,
    \mathcal N(m_i, s_i^2)\big)` over all elements, a 0-dim tensor; ``prior_loc`` :math:`m` and
    ``prior_scale`` :math:`s > 0` are numbers, one-element tensors or tensors of ``rho``'s shape.
    Differentiable in all four."""
    loc, rho = _loc_rho("meanfield_kl", loc, rho)
    if loc is None:
        raise TypeError("meanfield_kl: loc must be a tensor, got None")
    m = as_real_tensor("meanfield_kl: prior_loc", prior_loc, dtype=rho.dtype, device=rho.device).to(rho.dtype)
    s = as_real_tensor("meanfield_kl: prior_scale", prior_scale, dtype=rho.dtype, device=rho.device).to(rho.dtype)
    same_device("meanfield_kl", {"rho": rho, "prior_loc": m, "prior_scale": s})
    for name, p in (("prior_loc", m), ("prior_scale", s)):
        if p.numel() != 1 and p.shape != rho.shape:
            raise ValueError(f"meanfield_kl: {name} must be a number, a one-element tensor or have rho's shape "
                             f"{tuple(rho.shape)}, got {tuple(p.shape)}")
    if not bool((s > 0).all()):
        raise ValueError("meanfield_kl: prior_scale must be positive")
    return lib.meanfield_kl(loc, rho, m, s)
