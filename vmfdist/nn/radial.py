r"""Radial BNN layers (Farquhar, Osborne & Gal, 2020).

The weight tensor :math:`W \in \mathbb R^D` (the whole kernel, all :math:`D` elements) has the
posterior :class:`~vmfdist.distributions.radial.Radial`:

.. math::  W = \mu + \sigma \odot \frac{\epsilon}{\|\epsilon\|}\, r,\qquad
           \epsilon \sim \mathcal N(0, I_D),\ r \sim \mathcal N(0, 1),\ \sigma = \mathrm{softplus}(\rho),

drawn by the fused compiled op :func:`~vmfdist.distributions.kl.radial_sample_kl` (softplus, one
normalisation over the whole tensor per sample, and in a training step the KL below, in one pass;
the same normals as :func:`~vmfdist.distributions.radial.radial_noise`); the bias has its own,
separate Radial posterior.

The KL to a Gaussian prior is the closed form registered for ``Radial || Independent(Normal)``
(entropy of the Radial distribution in closed form, and the Gaussian cross-entropy, which
only needs :math:`E[v_i^2] = 1/D`).  With a :class:`~vmfdist.distributions.radial.Radial` prior there is
no closed form; the layer then uses the unbiased Monte Carlo estimate
:func:`~vmfdist.distributions.radial.kl_radial_radial` evaluated with the exact Radial log-density of
the prior at the sampled weights (not the paper's appendix-C cross-entropy, which lacks the
Jacobian between the two noise spaces).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.distributions import Gamma

from ..distributions import Radial, radial_sample
from ..distributions.kl import kl_radial_normal_softplus, radial_sample_kl
from ._base import (_ConvOps, _LinearOps, _ScaledGaussianLayer, _conv_repr, _conv_setup, _linear_setup,
                    full_precision, kl_to_prior)
from .meanfield import _FusedKL, _fusable, _KLCache

__all__ = ["RadialLinear", "RadialConv2d"]


class _Radial(_FusedKL, _ScaledGaussianLayer):
    def _init_posterior(self, wshape, bias, prior, bias_prior, sigma_init, prior_kl_samples, device, dtype):
        if not (isinstance(sigma_init, (int, float)) and sigma_init > 0 and math.isfinite(sigma_init)):
            raise ValueError(f"sigma_init must be a positive float, got {sigma_init!r}")
        if not isinstance(prior_kl_samples, int) or prior_kl_samples < 1:
            raise ValueError(f"prior_kl_samples must be a positive int, got {prior_kl_samples!r}")
        self._kl_cache = _KLCache()
        self._init_scale_parameters(wshape, bias, sigma_init, prior, bias_prior, prior_kl_samples, device, dtype)

    def _posterior_from(self, loc, scale):
        return Radial(loc, scale, validate_args=False)

    def weight_posterior(self) -> Radial:
        """``Radial(weight_mu, softplus(weight_rho))`` over the whole kernel."""
        return self._posterior_from(self.weight_mu, self.weight_sigma)

    def bias_posterior(self) -> Optional[Radial]:
        return None if self.bias_mu is None else self._posterior_from(self.bias_mu, self.bias_sigma)

    def sample_weights(self, num_samples):
        return self._draw(num_samples)

    def _forward_sample(self, x, num_samples):
        w, b = self._draw(num_samples, self._fused_priors() if self._kl_in_forward() else None)
        return self._apply_samples(x, w, b, num_samples)

    def _draw(self, num_samples, priors=None):
        """(weight, bias) samples from the fused op (softplus inside).  With ``priors`` (of
        :meth:`_fused_priors`) the op also computes the KL in the same pass, and the layer keeps it
        for :meth:`kl_divergence`.  In a training step the normals are kept for the backward pass
        instead of being regenerated."""
        keep = torch.is_grad_enabled() and (self.weight_mu.requires_grad or self.weight_rho.requires_grad)
        n = (num_samples,)
        if priors is None:
            w = radial_sample(self.weight_mu, self.weight_rho, n, save_noise=keep)
            b = None if self.bias_mu is None else radial_sample(self.bias_mu, self.bias_rho, n, save_noise=keep)
            return w, b
        (m, s), (mb, sb) = priors
        w, kl = radial_sample_kl(self.weight_mu, self.weight_rho, m, s, n, save_noise=keep, validate_args=False)
        b = None
        if self.bias_mu is not None:
            b, kl_b = radial_sample_kl(self.bias_mu, self.bias_rho, mb, sb, n, save_noise=keep, validate_args=False)
            kl = kl + kl_b
        self._kl_cache.store(kl, self._kl_inputs())
        return w, b

    def kl_divergence(self):
        """KL(q || prior) summed over weights and bias: for a Gaussian prior with scalar or
        full-shape parameters the closed form of :func:`_radial_gaussian_kl` -- the one the last
        sampling forward pass computed with the weights when nothing it depends on has changed
        since (as the mean-field layers), else one fused pass over mu and rho -- else as
        :meth:`_ScaledGaussianLayer.kl_divergence`."""
        if self._fused_priors() is not None:
            kl = self._kl_cache.take(self._kl_inputs())
            if kl is not None:
                return kl
        kl = _radial_gaussian_kl(self.weight_mu, self.weight_rho, self.prior)
        if kl is None:
            return super().kl_divergence()
        if self.bias_mu is not None:
            kb = _radial_gaussian_kl(self.bias_mu, self.bias_rho, self.bias_prior)
            if kb is None:
                kb = kl_to_prior(self._kl_posterior(self.bias_mu, self.bias_rho), self.bias_prior, self.bias_mu.shape,
                                 self.prior_kl_samples)
            kl = kl + kb
        return kl


def _radial_gaussian_kl(mu, rho, prior):
    r"""KL(Radial(mu, softplus(rho)) || prod_i N(m_i, s_i^2)) for a prior the fused mean-field KL
    takes (None otherwise): :func:`~vmfdist.distributions.kl.kl_radial_normal_softplus`."""
    fused = _fusable(mu, prior)
    if fused is None:
        return None
    up = full_precision  # float16 / bfloat16: the KL in float32
    return kl_radial_normal_softplus(up(mu), up(rho), *(up(t) for t in fused))


class RadialLinear(_LinearOps, _Radial):
    r"""A linear layer with a Radial posterior over its weight matrix (and a separate one
    over its bias).

    Same constructor as :class:`torch.nn.Linear`, plus keyword options:

    Args:
        prior: weight prior: a float ``s`` (:math:`\mathcal N(0, s^2)`, default 1.0), a
            ``torch.distributions`` distribution with a registered KL from ``Radial``
            (e.g. ``Normal``), or a :class:`~vmfdist.distributions.radial.Radial` over the weight shape
            (Monte Carlo KL).  Stored in the ``state_dict``.
        bias_prior: prior of the bias (default: ``prior``; a Radial weight prior needs an
            explicit bias prior of the bias shape).
        sigma_init: initial :math:`\sigma` (default 1e-3; :math:`\mu` is He-initialised).
        prior_kl_samples: samples of the Monte Carlo KL for a Radial prior (default 16).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 prior=1.0, bias_prior=None, sigma_init: float = 1e-3, prior_kl_samples: int = 16):
        super().__init__()
        wshape = _linear_setup(self, in_features, out_features)
        self._init_posterior(wshape, bias, prior, bias_prior, sigma_init, prior_kl_samples, device, dtype)

    #: the per-example draw below: per sample and example, a normal per output, the radius and a
    #: chi-square (a gamma draw counted as eight normals)
    _per_example_draws = 9

    def _sample_per_example(self, x, num_samples):
        r"""Each example's outputs for a batch of vectors ``(B, in)`` drawn exactly from their joint
        distribution under the Radial posterior, independently per sample and example, without
        forming weight samples; ``(num_samples * B, out)``, sample-major.

        For one example :math:`x` the noise part of output :math:`o` is
        :math:`\frac{r}{\|\epsilon\|}\sum_j x_j\sigma_{oj}\epsilon_{oj}`.  The vectors
        :math:`(x_j\sigma_{oj})_j` of different outputs sit on disjoint blocks of :math:`\epsilon`
        (row :math:`o` of the weight), so they are orthogonal: the sums are
        :math:`a_o g_o` with :math:`a_o = \|x \odot \sigma_o\|` and independent
        :math:`g_o \sim \mathcal N(0, 1)`, and :math:`\|\epsilon\|^2 = \sum_o g_o^2 + Q` with
        :math:`Q \sim \chi^2_{D - out}` (the rest of :math:`\epsilon`, independent of the
        :math:`g_o`).  So :math:`y_o = x\mu_o^T + a_o g_o\, r / \sqrt{\sum_o g_o^2 + Q} + b_o`:
        two products with the input instead of ``S``, and ``out + 2`` draws per sample and example
        instead of one normal per weight (the bias is sampled per sample as usual)."""
        self._check_input(x)
        s, bsz, n_out = num_samples, x.shape[0], self.out_features
        # the draws and the norm in float32 at least (torch has no half-precision gamma sampler)
        fk = {"dtype": torch.promote_types(x.dtype, torch.float32), "device": x.device}
        mean = F.linear(x, self.weight_mu)  # (B, out)
        scale = F.linear(x * x, self.weight_sigma.square()).sqrt_()  # a_o = |x * sigma_o|, (B, out)
        g = torch.randn((s, bsz, n_out), **fk)
        sumsq = g.square().sum(-1)  # (S, B)
        rest = self.weight_mu.numel() - n_out  # D - out = out * (in - 1)
        if rest:
            # chi-square(rest) = Gamma(rest / 2, rate 1/2), as torch's Chi2 draws it, with both
            # parameters made on the device: Chi2 copies its Python rate there (a host sync on a GPU)
            half = torch.full((), 0.5, **fk)
            sumsq = sumsq + Gamma(half * rest, half, validate_args=False).sample((s, bsz))
        coef = torch.randn((s, bsz), **fk).mul_(sumsq.rsqrt_())  # r / |eps|
        out = torch.addcmul(mean, scale, g.mul_(coef.unsqueeze(-1)).to(x.dtype))  # (S, B, out)
        if self.bias_mu is not None:
            out += radial_sample(self.bias_mu, self.bias_rho, (s,)).unsqueeze(1)
        return out.reshape(-1, n_out)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias_mu is not None}, mode={self.mode!r}")


class RadialConv2d(_ConvOps, _Radial):
    r"""A 2-d convolution with a Radial posterior over its whole kernel (and a separate one
    over its bias).  Same constructor as :class:`torch.nn.Conv2d` (``padding_mode="zeros"``
    only), plus the keyword options of :class:`RadialLinear`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None, *,
                 prior=1.0, bias_prior=None, sigma_init: float = 1e-3, prior_kl_samples: int = 16):
        super().__init__()
        wshape = _conv_setup(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                             padding_mode)
        self._init_posterior(wshape, bias, prior, bias_prior, sigma_init, prior_kl_samples, device, dtype)

    def extra_repr(self):
        return _conv_repr(self) + f", bias={self.bias_mu is not None}, mode={self.mode!r}"
