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
import torch.nn.functional as F
from torch.distributions import Independent, Normal

from .. import _torch_internals as internals
from ..distributions import meanfield_kl, meanfield_sample, meanfield_sample_kl
from ._base import (LOW_PRECISION, _ConvOps, _LinearOps, _ScaledGaussianLayer, _conv_repr, _conv_setup, _linear_setup,
                    full_precision)

__all__ = ["MeanFieldLinear", "MeanFieldConv2d"]

_ESTIMATORS = ("reparam", "local", "flipout")


class _FusedKL:
    """What the layers share whose sampling op can compute the closed-form KL to a Gaussian prior
    in the same pass (mean-field: ``meanfield_sample``; Radial: ``radial_sample``): which priors
    the op takes, what the KL depends on, and when the forward pass computes it (kept in
    ``self._kl_cache``, a :class:`_KLCache`, for :meth:`kl_divergence`)."""

    def _fused_priors(self):
        """``((m, s), (m_b, s_b))``: the priors of weight and bias in the form of the fused ops
        (:func:`_fusable`; ``(None, None)`` for an absent bias), or None if one is not."""
        w = _fusable(self.weight_mu, self.prior)
        if w is None or self.bias_mu is None:
            return None if w is None else (w, (None, None))
        b = _fusable(self.bias_mu, self.bias_prior)
        return None if b is None else (w, b)

    def _kl_inputs(self):
        """What the fused KL depends on: the parameters and the (Normal) priors' buffers."""
        ts = [self.weight_mu, self.weight_rho, self.prior.param_loc, self.prior.param_scale]
        if self.bias_mu is not None:
            ts += [self.bias_mu, self.bias_rho, self.bias_prior.param_loc, self.bias_prior.param_scale]
        return ts

    def _kl_in_forward(self):
        """Whether the sampling forward pass computes the KL too: when it will be differentiated
        (grad mode, trainable rho), outside torch.compile (and for priors the fused op takes)."""
        return torch.is_grad_enabled() and self.weight_rho.requires_grad and not torch.compiler.is_compiling() \
            and self.weight_rho.dtype not in LOW_PRECISION  # (a half-precision KL is computed in float32)


class _MeanField(_FusedKL, _ScaledGaussianLayer):
    def _init_posterior(self, wshape, bias, prior, bias_prior, estimator, sigma_init, device, dtype):
        if estimator not in _ESTIMATORS:
            raise ValueError(f"estimator must be one of {_ESTIMATORS}, got {estimator!r}")
        if not (isinstance(sigma_init, (int, float)) and sigma_init > 0 and math.isfinite(sigma_init)):
            raise ValueError(f"sigma_init must be a positive float, got {sigma_init!r}")
        self.estimator = estimator
        self._kl_cache = _KLCache()
        self._init_scale_parameters(wshape, bias, sigma_init, prior, bias_prior, 16, device, dtype)

    # ---- posterior --------------------------------------------------------------
    def _posterior_from(self, loc, scale):
        return Independent(Normal(loc, scale, validate_args=False), loc.dim(), validate_args=False)

    def weight_posterior(self):
        """``Independent(Normal(weight_mu, softplus(weight_rho)), weight.dim())``."""
        return self._posterior_from(self.weight_mu, self.weight_sigma)

    def bias_posterior(self):
        if self.bias_mu is None:
            return None
        return self._posterior_from(self.bias_mu, self.bias_sigma)

    def sample_weights(self, num_samples):
        # the fused op (csrc/include/vmfdist/meanfield.h): mu + softplus(rho) * eps in one pass
        return self._draw(num_samples, with_loc=True)

    def _draw(self, num_samples, with_loc, priors=None):
        """(weight, bias) samples: ``mu + softplus(rho) * eps``, or the perturbations
        ``softplus(rho) * eps`` without ``with_loc``.  With ``priors`` (of :meth:`_fused_priors`;
        needs ``with_loc``) the op also computes the KL in the same pass, and the layer keeps it
        for :meth:`kl_divergence`.  On the CPU the normals are kept for the backward pass when it
        will run (reading them back is cheaper than regenerating them); on a GPU they are
        regenerated from their Philox streams there (less memory traffic)."""
        rho, bias_mu = self.weight_rho, self.bias_mu
        keep = rho.requires_grad and rho.device.type == "cpu" and torch.is_grad_enabled()
        n = (num_samples,)
        if priors is None:
            w = meanfield_sample(self.weight_mu if with_loc else None, rho, n, save_noise=keep)
            b = None if bias_mu is None else meanfield_sample(bias_mu if with_loc else None, self.bias_rho, n,
                                                              save_noise=keep)
            return w, b
        # _fusable checked the priors' shapes and dtypes; no read-back of s > 0 on every step
        (m, s), (mb, sb) = priors
        w, kl = meanfield_sample_kl(self.weight_mu, rho, m, s, n, save_noise=keep, validate_args=False)
        b = None
        if bias_mu is not None:
            b, kl_b = meanfield_sample_kl(bias_mu, self.bias_rho, mb, sb, n, save_noise=keep, validate_args=False)
            kl = kl + kl_b
        self._kl_cache.store(kl, self._kl_inputs())
        return w, b

    def kl_divergence(self):
        """KL(q || prior) summed over weights and bias.  For Gaussian priors whose parameters
        are scalars or of the parameter's shape it is the closed form evaluated by a fused op:
        the one the last sampling forward pass computed together with the weights (one pass
        over mu and rho, one autograd node for both) when nothing it depends on has changed
        since, that forward's graph is still there, and it was not handed out before; else a
        separate one-pass op (``meanfield_kl``).  Other priors: the registered KL."""
        priors = self._fused_priors()
        if priors is None:
            return super().kl_divergence()
        kl = self._kl_cache.take(self._kl_inputs())
        if kl is not None:
            return kl
        (m, s), (mb, sb) = priors
        up = full_precision  # float16 / bfloat16: the KL in float32
        kl = meanfield_kl(up(self.weight_mu), up(self.weight_rho), up(m), up(s), validate_args=False)
        if self.bias_mu is not None:
            kl = kl + meanfield_kl(up(self.bias_mu), up(self.bias_rho), up(mb), up(sb), validate_args=False)
        return kl

    # ---- estimators --------------------------------------------------------------
    def _forward_sample(self, x, num_samples):
        if self.estimator == "reparam":
            w, b = self._draw(num_samples, True, self._fused_priors() if self._kl_in_forward() else None)
            return self._apply_samples(x, w, b, num_samples)
        if self.estimator == "local":
            mean = self._apply_weights(x, self.weight_mu, self.bias_mu)
            var = self._apply_weights(x * x, self.weight_sigma.square(),
                                      None if self.bias_mu is None else self.bias_sigma.square())
            return mean + var.clamp_min(torch.finfo(var.dtype).tiny).sqrt() * torch.randn_like(mean)
        # flipout: the perturbations sigma * eps from the fused op (no loc)
        mean = self._apply_weights(x, self.weight_mu, self.bias_mu)
        s_in = self._signs(x, input_side=True)
        dw, db = self._draw(num_samples, with_loc=False)
        pert = self._apply_samples(x * s_in, dw, None, num_samples)
        out = torch.addcmul(mean, pert, self._signs(mean, input_side=False))
        if db is not None:
            if num_samples == 1:
                out = out + self._bias_view(db.view(db.shape[1:]), out)
            else:
                bsz = out.shape[0] // num_samples
                out = out + self._bias_view(db.repeat_interleave(bsz, dim=0), out, per_row=True)
        return out


def _rademacher(shape, dtype, device):
    """Independent random signs (+-1 with probability 1/2 each) of the given shape: the 32 bits
    of uniform 32-bit words from the default generator (``bernoulli_`` draws a word per sign,
    ~20 times slower)."""
    n = math.prod(shape)
    words = torch.randint(0, 2 ** 32, ((n + 31) // 32, 1), dtype=torch.int64, device=device)
    bits = (words >> torch.arange(32, device=device)) & 1
    return bits.reshape(-1)[:n].reshape(shape).to(dtype).mul_(2).sub_(1)


class _KLCache:
    """The KL a sampling forward pass computed, until :meth:`take` hands it out (once).

    It is handed out only if every tensor it depends on is the same object at the same version
    (an in-place update, e.g. an optimizer step, invalidates it), grad mode is on (it carries a
    graph), and that graph has not been freed by a backward pass (its saved tensors are still
    there): in every other case the caller recomputes the KL, so the result is always what a
    fresh evaluation would give.  (A change made through ``.data`` bypasses version counting;
    do not edit parameters that way between a forward pass and ``kl_divergence()``.)  Not copied
    by ``copy.deepcopy`` or pickling.  The version counters and the graph checks are torch
    internals (:mod:`vmfdist._torch_internals`); with ``VMFDIST_NO_TORCH_INTERNALS=1`` nothing is
    cached and the KL is always recomputed."""

    __slots__ = ("kl", "key")

    def __init__(self):
        self.kl, self.key = None, None

    def store(self, kl, inputs):
        if internals.versions_available():
            self.kl, self.key = kl, [(t, internals.version(t)) for t in inputs]

    def take(self, inputs):
        kl, key = self.kl, self.key
        if kl is None:
            return None
        self.kl, self.key = None, None
        if not torch.is_grad_enabled() or torch.compiler.is_compiling() or len(inputs) != len(key):
            return None
        if any(t is not k or internals.version(t) != v for t, (k, v) in zip(inputs, key)):
            return None
        # kl_w + kl_b: the weight's op node, whose saved tensors a backward pass frees
        if not internals.graph_alive(internals.first_addend(kl.grad_fn)):
            return None
        return kl

    def __reduce__(self):  # copies and pickles start empty
        return (_KLCache, ())


def _fusable(mu, prior):
    """``(loc, scale)`` of an elementwise Normal prior whose parameters have one element or
    ``mu``'s shape, in ``mu``'s dtype (what ``meanfield_kl`` takes); None for any other prior."""
    if prior._module is not None or prior._cls is not Normal or prior._ndims:
        return None
    m, s = prior.param_loc, prior.param_scale
    if (m.numel() != 1 and m.shape != mu.shape) or (s.numel() != 1 and s.shape != mu.shape):
        return None
    if m.dtype != mu.dtype:  # the prior's buffers may be float32 under a float64 layer
        m, s = m.to(mu.dtype), s.to(mu.dtype)
    return m, s


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
        return _rademacher(t.shape, t.dtype, t.device)

    def _bias_view(self, b, out, per_row=False):
        if per_row:
            return b.reshape((b.shape[0],) + (1,) * (out.dim() - 2) + (b.shape[-1],))
        return b

    #: the local reparameterisation: one normal per output, nothing else
    _per_example_draws = 0

    def _sample_per_example(self, x, num_samples):
        r"""The local reparameterisation on a batch of vectors ``(B, in)``, drawn independently per
        sample and example -- for one example each weight enters its pre-activations once, so they
        are exactly :math:`\mathcal N(x\mu^T + \mu_b, x^2\sigma^{2T} + \sigma_b^2)`, independent
        across output units: the same distribution as with sampled weights.  Two products with the
        input instead of ``S``, normals per output instead of per weight."""
        self._check_input(x)
        mean = F.linear(x, self.weight_mu, self.bias_mu)
        var = F.linear(x * x, self.weight_sigma.square(), None if self.bias_mu is None else self.bias_sigma.square())
        std = var.clamp_min(torch.finfo(var.dtype).tiny).sqrt_()
        eps = torch.randn((num_samples,) + tuple(mean.shape), dtype=mean.dtype, device=mean.device)
        return torch.addcmul(mean, std, eps).reshape((-1, self.out_features))

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
        return _rademacher(t.shape[:-2] + (1, 1), t.dtype, t.device)

    def _bias_view(self, b, out, per_row=False):
        if per_row:
            return b.reshape(b.shape[0], -1, 1, 1)
        return b.reshape(-1, 1, 1)

    def extra_repr(self):
        return (_conv_repr(self) + f", bias={self.bias_mu is not None}, estimator={self.estimator!r}, "
                f"mode={self.mode!r}")
