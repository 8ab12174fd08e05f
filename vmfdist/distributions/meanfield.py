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
  pass, summed in double precision;
* :func:`meanfield_sample_kl`: both in the same pass (what a mean-field layer's training step
  needs: one read of :math:`\mu` and :math:`\rho`, one autograd node).

Both are compiled ops (``csrc/include/vmfdist/meanfield.h``); the normals come from the
project's Philox streams (element ``j`` of sample ``s`` is normal ``j`` of stream
``(seed, offset, s)``), with the seed drawn inside the op from ``generator`` or the default
generator, as for every random op of the library (:mod:`vmfdist.random`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._ops import lib
from .._ops.random import MAX_SEED, check_sample_shape, random_kwargs
from ._validation import as_real_tensor, same_device

__all__ = ["meanfield_sample", "meanfield_kl", "meanfield_sample_kl"]


def _like(t, rho, same_shape=True) -> bool:
    """Whether ``t`` is a tensor of ``rho``'s dtype and device (and shape, or one element): the
    arguments of a layer's every step, for which the checks below are skipped (they cost about
    as much as the op on a small layer)."""
    return (isinstance(t, torch.Tensor) and t.dtype == rho.dtype and t.device == rho.device
            and (t.shape == rho.shape or (not same_shape and t.numel() == 1)))


def _loc_rho(name, loc, rho):
    if isinstance(rho, torch.Tensor) and rho.is_floating_point() and (loc is None or _like(loc, rho)):
        return loc, rho
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


def _num_samples(name, sample_shape):
    """``(shape, n)``: ``sample_shape`` checked and its number of elements; ``shape`` is None for
    ``(n,)`` (the op's own output shape: no reshape needed)."""
    if (type(sample_shape) is tuple and len(sample_shape) == 1 and type(sample_shape[0]) is int
            and 0 <= sample_shape[0] < MAX_SEED):
        return None, sample_shape[0]  # (what the layers pass, every step)
    shape = check_sample_shape(name, sample_shape)
    n = 1
    for s in shape:
        n *= s
    return shape, n


def _shaped(out, shape, rho):
    """The op's ``(n, *rho.shape)`` output as ``shape + rho.shape``."""
    return out if shape is None else out.reshape(shape + rho.shape)


def _prior(name, rho, prior_loc, prior_scale, validate_args):
    """``(m, s)`` as tensors of ``rho``'s dtype and device, each with one element or ``rho``'s
    shape; ``s > 0`` checked with ``validate_args`` (a read-back of the device's result)."""
    if _like(prior_loc, rho, False) and _like(prior_scale, rho, False):
        if validate_args and not bool((prior_scale > 0).all()):
            raise ValueError(f"{name}: prior_scale must be positive")
        return prior_loc, prior_scale
    m = as_real_tensor(f"{name}: prior_loc", prior_loc, dtype=rho.dtype, device=rho.device).to(rho.dtype)
    s = as_real_tensor(f"{name}: prior_scale", prior_scale, dtype=rho.dtype, device=rho.device).to(rho.dtype)
    same_device(name, {"rho": rho, "prior_loc": m, "prior_scale": s})
    for arg, p in (("prior_loc", m), ("prior_scale", s)):
        if p.numel() != 1 and p.shape != rho.shape:
            raise ValueError(f"{name}: {arg} must be a number, a one-element tensor or have rho's shape "
                             f"{tuple(rho.shape)}, got {tuple(p.shape)}")
    if validate_args and not bool((s > 0).all()):
        raise ValueError(f"{name}: prior_scale must be positive")
    return m, s


def meanfield_sample(loc: Optional[torch.Tensor], rho: torch.Tensor, sample_shape=torch.Size(),
                     generator: Optional[torch.Generator] = None, *, save_noise: bool = False) -> torch.Tensor:
    r"""``loc + softplus(rho) * eps`` with ``eps`` standard normal, for each of ``sample_shape``
    samples (shape ``sample_shape + rho.shape``), in one fused pass; ``loc=None`` draws the
    zero-mean ``softplus(rho) * eps``.  Differentiable in ``loc`` and ``rho`` (reparameterised);
    the backward pass regenerates ``eps`` from its Philox streams, or with ``save_noise=True``
    reads them back from the forward pass (one more tensor of the output's size held until the
    backward; faster on the CPU, the same values).  ``loc`` and ``rho`` have one shape (no
    broadcasting: they are one parameter tensor's mean and scale)."""
    loc, rho = _loc_rho("meanfield_sample", loc, rho)
    shape, n = _num_samples("meanfield_sample", sample_shape)
    out = lib.meanfield_sample(loc, rho, None, None, n, bool(save_noise),
                               **random_kwargs("meanfield_sample", generator))[0]
    return _shaped(out, shape, rho)


def meanfield_kl(loc: torch.Tensor, rho: torch.Tensor, prior_loc=0.0, prior_scale=1.0, *,
                 validate_args: bool = True) -> torch.Tensor:
    r""":math:`\sum_i \mathrm{KL}\big(\mathcal N(\mu_i, \mathrm{softplus}(\rho_i)^2)\,\|\,
    \mathcal N(m_i, s_i^2)\big)` over all elements, a 0-dim tensor; ``prior_loc`` :math:`m` and
    ``prior_scale`` :math:`s > 0` are numbers, one-element tensors or tensors of ``rho``'s shape.
    Differentiable in all four.  ``validate_args=False`` skips the check :math:`s > 0` (the only
    one that reads a value back from the device; types, shapes and devices are always checked),
    for callers that hold a validated prior and call this every step."""
    loc, rho = _loc_rho("meanfield_kl", loc, rho)
    if loc is None:
        raise TypeError("meanfield_kl: loc must be a tensor, got None")
    m, s = _prior("meanfield_kl", rho, prior_loc, prior_scale, validate_args)
    return lib.meanfield_kl(loc, rho, m, s)


def meanfield_sample_kl(loc: torch.Tensor, rho: torch.Tensor, prior_loc=0.0, prior_scale=1.0,
                        sample_shape=torch.Size(), generator: Optional[torch.Generator] = None, *,
                        save_noise: bool = False, validate_args: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""``(meanfield_sample(loc, rho, sample_shape, generator), meanfield_kl(loc, rho, prior_loc,
    prior_scale))`` in one fused pass over ``loc`` and ``rho`` (the same samples and the same KL,
    summed in the same order), with one autograd node for both; ``save_noise`` as in
    :func:`meanfield_sample`, ``validate_args`` as in :func:`meanfield_kl`.  ``loc`` is required
    (the KL needs it)."""
    loc, rho = _loc_rho("meanfield_sample_kl", loc, rho)
    if loc is None:
        raise TypeError("meanfield_sample_kl: loc must be a tensor, got None")
    m, s = _prior("meanfield_sample_kl", rho, prior_loc, prior_scale, validate_args)
    shape, n = _num_samples("meanfield_sample_kl", sample_shape)
    out, _, kl, _ = lib.meanfield_sample(loc, rho, m, s, n, bool(save_noise),
                                         **random_kwargs("meanfield_sample_kl", generator))
    return _shaped(out, shape, rho), kl
