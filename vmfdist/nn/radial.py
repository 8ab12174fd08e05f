r"""Radial BNN layers (Farquhar, Osborne & Gal, 2020).

The weight tensor :math:`W \in \mathbb R^D` (the whole kernel, all :math:`D` elements) has the
posterior :class:`~vmfdist.distributions.radial.Radial`:

.. math::  W = \mu + \sigma \odot \frac{\epsilon}{\|\epsilon\|}\, r,\qquad
           \epsilon \sim \mathcal N(0, I_D),\ r \sim \mathcal N(0, 1),\ \sigma = \mathrm{softplus}(\rho),

drawn by the fused compiled op :func:`~vmfdist.distributions.radial.radial_noise` (one normalisation
over the whole tensor per sample); the bias has its own, separate Radial posterior.

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


from ..distributions import Radial, radial_noise
from ._base import _ConvOps, _LinearOps, _ScaledGaussianLayer, _conv_repr, _conv_setup, _linear_setup

__all__ = ["RadialLinear", "RadialConv2d"]


class _Radial(_ScaledGaussianLayer):
    def _init_posterior(self, wshape, bias, prior, bias_prior, sigma_init, prior_kl_samples, device, dtype):
        if not (isinstance(sigma_init, (int, float)) and sigma_init > 0 and math.isfinite(sigma_init)):
            raise ValueError(f"sigma_init must be a positive float, got {sigma_init!r}")
        if not isinstance(prior_kl_samples, int) or prior_kl_samples < 1:
            raise ValueError(f"prior_kl_samples must be a positive int, got {prior_kl_samples!r}")
        self._init_scale_parameters(wshape, bias, sigma_init, prior, bias_prior, prior_kl_samples, device, dtype)

    def weight_posterior(self) -> Radial:
        """``Radial(weight_mu, softplus(weight_rho))`` over the whole kernel."""
        return Radial(self.weight_mu, self.weight_sigma, validate_args=False)

    def bias_posterior(self) -> Optional[Radial]:
        return None if self.bias_mu is None else Radial(self.bias_mu, self.bias_sigma, validate_args=False)

    def sample_weights(self, num_samples):
        w = radial_noise(self.weight_mu, self.weight_sigma, (num_samples,))
        b = None if self.bias_mu is None else radial_noise(self.bias_mu, self.bias_sigma, (num_samples,))
        return w, b


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
