r"""Mean-field Gaussian layers: :math:`q(w) = \prod_i \mathcal N(w_i \mid \mu_i, \sigma_i^2)`,
:math:`\sigma = \mathrm{softplus}(\rho)`.

Three estimators of the forward pass (all unbiased for the expected log-likelihood):

* ``"reparam"``: draw :math:`w = \mu + \sigma\odot\epsilon` once per forward (per sample).
* ``"local"`` (local reparameterisation, Kingma et al. 2015): the pre-activation of each
  example is Gaussian with mean :math:`f(x, \mu) + \mu_b` and variance
  :math:`f(x^2, \sigma^2) + \sigma_b^2`; it is drawn directly, independently per example
  (and per output pixel for convolutions, which is what makes it an estimator of the same
  expectation rather than the same weight sample across pixels).
* ``"flipout"`` (Wen et al. 2018): :math:`f(x, \mu) + f(x\odot s_{in}, \Delta w)\odot s_{out}`
  with one :math:`\Delta w = \sigma\odot\epsilon` per forward and random signs per example
  (per channel for convolutions); valid because the perturbation is symmetric.
"""
from __future__ import annotations

import math

import torch
from torch.distributions import Independent, Normal

from ._base import _ConvOps, _LinearOps, _ScaledGaussianLayer, _conv_repr, _conv_setup, _linear_setup

__all__ = ["MeanFieldLinear", "MeanFieldConv2d"]

_ESTIMATORS = ("reparam", "local", "flipout")


class _MeanField(_ScaledGaussianLayer):
    def _init_posterior(self, wshape, bias, prior, bias_prior, estimator, sigma_init, device, dtype):
        if estimator not in _ESTIMATORS:
            raise ValueError(f"estimator must be one of {_ESTIMATORS}, got {estimator!r}")
        if not (isinstance(sigma_init, (int, float)) and sigma_init > 0 and math.isfinite(sigma_init)):
            raise ValueError(f"sigma_init must be a positive float, got {sigma_init!r}")
        self.estimator = estimator
        self._init_scale_parameters(wshape, bias, sigma_init, prior, bias_prior, 16, device, dtype)

    # ---- posterior --------------------------------------------------------------
    def weight_posterior(self):
        """``Independent(Normal(weight_mu, softplus(weight_rho)), weight.dim())``."""
        return Independent(Normal(self.weight_mu, self.weight_sigma, validate_args=False), self.weight_mu.dim(),
                           validate_args=False)

    def bias_posterior(self):
        if self.bias_mu is None:
            return None
        return Independent(Normal(self.bias_mu, self.bias_sigma, validate_args=False), 1, validate_args=False)

    def sample_weights(self, num_samples):
        shape = (num_samples,) + tuple(self.weight_mu.shape)
        w = torch.addcmul(self.weight_mu, self.weight_sigma, torch.randn(shape, dtype=self.weight_mu.dtype,
                                                                         device=self.weight_mu.device))
        b = None
        if self.bias_mu is not None:
            b = torch.addcmul(self.bias_mu, self.bias_sigma,
                              torch.randn((num_samples,) + tuple(self.bias_mu.shape), dtype=self.bias_mu.dtype,
                                          device=self.bias_mu.device))
        return w, b

    # ---- estimators --------------------------------------------------------------
    def _forward_sample(self, x, num_samples):
        if self.estimator == "reparam":
            return super()._forward_sample(x, num_samples)
        if self.estimator == "local":
            mean = self._apply_weights(x, self.weight_mu, self.bias_mu)
            var = self._apply_weights(x * x, self.weight_sigma.square(),
                                      None if self.bias_mu is None else self.bias_sigma.square())
            return mean + var.clamp_min(torch.finfo(var.dtype).tiny).sqrt() * torch.randn_like(mean)
        # flipout
        mean = self._apply_weights(x, self.weight_mu, self.bias_mu)
        s_in = self._signs(x, input_side=True)
        dw = self.weight_sigma * torch.randn((num_samples,) + tuple(self.weight_mu.shape),
                                             dtype=self.weight_mu.dtype, device=self.weight_mu.device)
        db = None
        if self.bias_mu is not None:
            db = self.bias_sigma * torch.randn((num_samples,) + tuple(self.bias_mu.shape),
                                               dtype=self.bias_mu.dtype, device=self.bias_mu.device)
        if num_samples == 1:
            pert = self._apply_weights(x * s_in, dw[0], None)
            if db is not None:
                pert_b = db[0]
        else:
            pert = self._apply_folded(x * s_in, dw, None, num_samples)
        pert = pert * self._signs(mean, input_side=False)
        out = mean + pert
        if db is not None:
            if num_samples == 1:
                out = out + self._bias_view(pert_b, out)
            else:
                bsz = out.shape[0] // num_samples
                out = out + self._bias_view(db.repeat_interleave(bsz, dim=0), out, per_row=True)
        return out


class MeanFieldLinear(_LinearOps, _MeanField):
    r"""A linear layer with a factorised Gaussian posterior over its weight and bias.

    Same constructor as :class:`torch.nn.Linear`, plus keyword options:

    Args:
        prior: prior of the weight: a float ``s`` (:math:`\mathcal N(0, s^2)`, default 1.0), any
            ``torch.distributions`` distribution with a registered KL from ``Normal`` (broadcast
            to the weight shape), or an ``nn.Module`` returning one.  Stored in the
            ``state_dict``.
        bias_prior: prior of the bias (default: ``prior``).
        estimator: ``"reparam"`` (default), ``"local"`` or ``"flipout"`` (module docstring).
        sigma_init: initial :math:`\sigma` (default 1e-3; :math:`\mu` gets He (Kaiming-normal)
            initialisation, the bias mean zeros).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 prior=1.0, bias_prior=None, estimator: str = "reparam", sigma_init: float = 1e-3):
        super().__init__()
        wshape = _linear_setup(self, in_features, out_features)
        self._init_posterior(wshape, bias, prior, bias_prior, estimator, sigma_init, device, dtype)

    def _signs(self, t, input_side):
        return torch.empty_like(t).bernoulli_(0.5).mul_(2).sub_(1)

    def _bias_view(self, b, out, per_row=False):
        if per_row:
            return b.reshape((b.shape[0],) + (1,) * (out.dim() - 2) + (b.shape[-1],))
        return b

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias_mu is not None}, estimator={self.estimator!r}, mode={self.mode!r}")


class MeanFieldConv2d(_ConvOps, _MeanField):
    r"""A 2-d convolution with a factorised Gaussian posterior over its kernel and bias.

    Same constructor as :class:`torch.nn.Conv2d` (``padding_mode="zeros"`` only), plus the
    keyword options of :class:`MeanFieldLinear`.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None, *,
                 prior=1.0, bias_prior=None, estimator: str = "reparam", sigma_init: float = 1e-3):
        super().__init__()
        wshape = _conv_setup(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                             padding_mode)
        self._init_posterior(wshape, bias, prior, bias_prior, estimator, sigma_init, device, dtype)

    def _signs(self, t, input_side):
        shape = t.shape[:-2] + (1, 1)
        return torch.empty(shape, dtype=t.dtype, device=t.device).bernoulli_(0.5).mul_(2).sub_(1)

    def _bias_view(self, b, out, per_row=False):
        if per_row:
            return b.reshape(b.shape[0], -1, 1, 1)
        return b.reshape(-1, 1, 1)

    def extra_repr(self):
        return (_conv_repr(self) + f", bias={self.bias_mu is not None}, estimator={self.estimator!r}, "
                f"mode={self.mode!r}")
