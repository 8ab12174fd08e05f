r"""The ELBO as a criterion, and the likelihoods.

For a data set of :math:`N` points seen in mini-batches of :math:`B`, the negative ELBO per
data point is estimated without bias by

.. math::  \mathcal L = \frac1B\sum_{i \in \text{batch}} -\log p(y_i \mid f_w(x_i))
           + \beta\,\frac{\mathrm{KL}(q \,\|\, p)}{N}, \qquad w \sim q,

(the ELBO notes, §2.1.2: the mean NLL over the batch plus KL/N).  :math:`N` must be the size of
the *whole* training set; using the batch size instead (a common mistake) weights the KL
:math:`N/B` times too much.  Under data parallelism each rank uses the same global
:math:`N`, and the averaged gradient is the gradient of this objective.
"""
from __future__ import annotations

import math
import warnings
from numbers import Number
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Gamma

from .model import bayesian_modules, check_finite, kl_divergence

__all__ = ["ELBO", "Categorical", "Gaussian", "GammaPrecisionGaussian", "Likelihood"]


class Likelihood(nn.Module):
    """Base class: ``nll(output, target)`` returns the per-example expected negative
    log-likelihood (shape: ``output``'s leading dimensions), ``kl()`` the KL of any latent
    variable the likelihood owns (0 by default)."""

    def nll(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def check_target(self, output: torch.Tensor, target: torch.Tensor) -> None:
        """Raise ``ValueError`` naming ``target`` where its values do not fit ``output`` (checks that
        read values back to the host: :meth:`nll` skips them on a GPU and gives NaN instead, and
        :class:`ELBO` calls this when the loss is not finite)."""

    def kl(self) -> Optional[torch.Tensor]:
        return None


class Categorical(Likelihood):
    """Categorical likelihood on logits: ``output`` ``(..., B, C)`` (optionally a leading sample
    dimension), ``target`` ``(B,)`` class indices."""

    def nll(self, output, target):
        if target.dtype.is_floating_point or target.is_complex() or target.dtype == torch.bool:
            raise ValueError(f"target: Categorical needs integer class indices, got dtype {target.dtype}")
        if output.dim() < 2 or output.shape[-2:-1] != target.shape[-1:] or output.dim() - target.dim() not in (1, 2):
            raise ValueError(f"output of shape {tuple(output.shape)} does not fit target of shape "
                             f"{tuple(target.shape)}: Categorical expects logits (B, C) or (S, B, C) for targets (B,)")
        return self._nll(output, target, sync_free=target.device.type != "cpu")

    def _nll(self, output, target, sync_free):
        c = output.shape[-1]
        bad = None
        if not sync_free:
            self.check_target(output, target)
        elif target.numel():
            # no host synchronisation on a GPU: out-of-range targets give NaN (ELBO then names them)
            bad = (target < 0) | (target >= c)
            target = target.masked_fill(bad, 0)
        logp = F.log_softmax(output, dim=-1)
        t = target.long().expand(output.shape[:-1])  # any integer dtype (uint8 labels included)
        nll = -logp.gather(-1, t.unsqueeze(-1)).squeeze(-1)
        return nll if bad is None else nll.masked_fill(bad.expand(nll.shape), math.nan)

    def check_target(self, output, target):
        c = output.shape[-1]
        if target.numel() and (int(target.min()) < 0 or int(target.max()) >= c):
            raise ValueError(f"target: class indices must lie in [0, {c}), got range "
                             f"[{int(target.min())}, {int(target.max())}]")


def _regression_shapes(output, target):
    """Accept output (B,), (B, 1), (S, B), (S, B, 1) or (..., B, D) against target (B,) / (B, D).
    A square (B, B) output against a (B,) target is refused: it may be B samples of one output or
    one sample of B outputs."""
    if output.dim() == 2 and target.dim() == 1 and output.shape[0] == output.shape[1] == target.shape[0] > 1:
        raise ValueError(f"output of shape {tuple(output.shape)} against target of shape {tuple(target.shape)} is "
                         "ambiguous: B samples of one output, or B outputs per example? Give the samples as "
                         "(S, B, 1) (sample_forward of a (B, 1) model) or multi-output targets as (B, D)")
    if output.shape[-target.dim():] == target.shape and output.dim() - target.dim() in (0, 1):
        return output, target
    if target.dim() >= 1 and output.shape[-1] == 1 and output.shape[-1 - target.dim():-1] == target.shape \
            and output.dim() - 1 - target.dim() in (0, 1):
        return output.squeeze(-1), target
    raise ValueError(f"output of shape {tuple(output.shape)} does not fit target of shape {tuple(target.shape)}: "
                     "expected (B,)/(B, 1)/(B, D), optionally with a leading sample dimension")


def _positive(name, val):
    if isinstance(val, bool) or not isinstance(val, Number) or not val > 0 or not math.isfinite(val):
        raise ValueError(f"{name} must be a positive finite number, got {val!r}")
    return float(val)


class Gaussian(Likelihood):
    r"""Gaussian likelihood :math:`\mathcal N(y \mid f(x), \sigma^2)` with fixed noise
    ``sigma`` or, with ``learn_sigma=True``, :math:`\sigma` learned (a parameter
    ``log_sigma``, point-estimated by the ELBO)."""

    def __init__(self, sigma: float = 1.0, learn_sigma: bool = False):
        super().__init__()
        sigma = _positive("sigma", sigma)
        t = torch.tensor(math.log(sigma))
        if learn_sigma:
            self.log_sigma = nn.Parameter(t)
        else:
            self.register_buffer("log_sigma", t)

    @property
    def sigma(self):
        return self.log_sigma.exp()

    def nll(self, output, target):
        output, target = _regression_shapes(output, target)
        ls = self.log_sigma.to(output.dtype)
        return 0.5 * math.log(2 * math.pi) + ls + 0.5 * (target - output).pow(2) * torch.exp(-2 * ls)

    def predictive_scale(self):
        return self.sigma.detach()


class GammaPrecisionGaussian(Likelihood):
    r"""Gaussian likelihood with a Gamma prior on the noise precision :math:`\tau`
    (the UCI protocol: :math:`p(\tau) = \mathrm{Gamma}(a_0, b_0)`, default (6, 6)) and a Gamma
    posterior :math:`q(\tau) = \mathrm{Gamma}(a_1, b_1)` learned with the network.

    Expected NLL: :math:`\tfrac12\log 2\pi - \tfrac12(\psi(a_1) - \log b_1) + \tfrac12\frac{a_1}{b_1}(y - f)^2`;
    ``kl()`` is :math:`\mathrm{KL}(q(\tau)\|p(\tau))`, added to the model's KL by :class:`ELBO`.
    The predictive, integrating :math:`\tau` out, is a Student-t with :math:`2a_1` degrees of
    freedom and scale :math:`\sqrt{b_1/a_1}`.
    """

    def __init__(self, a0: float = 6.0, b0: float = 6.0):
        super().__init__()
        a0, b0 = _positive("a0", a0), _positive("b0", b0)
        self.register_buffer("a0", torch.tensor(a0))
        self.register_buffer("b0", torch.tensor(b0))
        self.log_a1 = nn.Parameter(torch.tensor(math.log(a0)))
        self.log_b1 = nn.Parameter(torch.tensor(math.log(b0)))

    def posterior(self) -> Gamma:
        return Gamma(self.log_a1.exp(), self.log_b1.exp())

    def nll(self, output, target):
        output, target = _regression_shapes(output, target)
        a1, b1 = self.log_a1.exp().to(output.dtype), self.log_b1.exp().to(output.dtype)
        e_log_tau = torch.digamma(a1) - torch.log(b1)
        return 0.5 * math.log(2 * math.pi) - 0.5 * e_log_tau + 0.5 * (a1 / b1) * (target - output).pow(2)

    def kl(self):
        return torch.distributions.kl_divergence(self.posterior(), Gamma(self.a0, self.b0))


class ELBO(nn.Module):
    r"""Negative ELBO per data point, used like a criterion: ``loss = elbo(output, target)``.

    ``loss = mean NLL over the batch (and over samples, when output stacks several along a
    leading dimension, e.g. from sample_forward) + kl_weight * (KL(model) + KL(likelihood)) / num_data``.

    Args:
        model: the network (its Bayesian layers' KL is summed on every call).
        num_data: size of the whole training set :math:`N` (required, positive).
        likelihood: :class:`Categorical` (default), :class:`Gaussian`,
            :class:`GammaPrecisionGaussian` or any :class:`Likelihood`.  It is a submodule:
            pass ``elbo.parameters()`` (or ``likelihood.parameters()``) to the optimizer too
            when it has learnable parameters.
        kl_weight: a float :math:`\beta` or a schedule ``step -> float``; ``step`` counts the
            calls made in training mode (0 on the first).
        check_finite: raise ``FloatingPointError`` when a parameter (e.g. after the previous
            optimizer step) or the loss is not finite (default True).  The check reads one flag
            on the host per call, a synchronisation that on a GPU keeps the CPU from queueing
            the next step's kernels early; pass False there for the fastest step (and call
            :func:`vmfdist.nn.check_finite` every few hundred steps instead).

    After each call ``elbo.nll``, ``elbo.kl`` and ``elbo.kl_weight_value`` hold the parts
    (detached), and ``elbo.step`` the number of training-mode calls.
    """

    def __init__(self, model: torch.nn.Module, num_data: int, likelihood: Optional[Likelihood] = None,
                 kl_weight: Union[float, Callable[[int], float]] = 1.0, check_finite: bool = True):
        super().__init__()
        if num_data is None:
            raise ValueError("num_data is required: the number of training examples N (not the batch size)")
        if isinstance(num_data, bool) or not isinstance(num_data, Number) or not num_data > 0 \
                or not math.isfinite(num_data):
            raise ValueError(f"num_data must be a positive number (the training-set size N), got {num_data!r}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not callable(kl_weight):
            kl_weight = float(_nonneg("kl_weight", kl_weight))
        self._model = [model]  # not a submodule: its parameters are not the criterion's
        self.num_data = float(num_data)
        self.likelihood = Categorical() if likelihood is None else likelihood
        if not isinstance(self.likelihood, Likelihood):
            raise TypeError(f"likelihood must be a vmfdist.nn.Likelihood, got {type(self.likelihood).__name__}")
        self.kl_weight = kl_weight
        self.check_finite = check_finite
        if next(bayesian_modules(model), None) is None and self.likelihood.kl() is None:
            warnings.warn("ELBO: the model has no Bayesian layers (vmfdist.nn), so the KL term is 0 and the ELBO is "
                          "the plain NLL; convert the model with vmfdist.nn.to_bayesian first", UserWarning,
                          stacklevel=2)
        self.step = 0
        self.nll = self.kl = self.kl_weight_value = None

    @property
    def model(self):
        return self._model[0]

    def current_kl_weight(self) -> float:
        if callable(self.kl_weight):
            return _nonneg("kl_weight(step)", self.kl_weight(self.step))
        return self.kl_weight

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The loss (a scalar tensor); the parts are left in ``nll``, ``kl`` and ``kl_weight_value``."""
        nll = self.likelihood.nll(output, target).mean()
        kl = kl_divergence(self.model)
        lk = self.likelihood.kl()
        if lk is not None:
            kl = kl + lk
        beta = self.current_kl_weight()
        loss = nll + beta * kl / self.num_data
        # one host synchronisation for the parameters and the loss together
        if self.check_finite and not check_finite(self.model, self.likelihood, loss=loss):
            self.likelihood.check_target(output, target)  # a bad target is the likelier cause: name it
            raise FloatingPointError(f"the loss is not finite (nll={float(nll)}, kl={float(kl)})")
        self.nll, self.kl, self.kl_weight_value = nll.detach(), kl.detach(), beta
        if self.training:
            self.step += 1
        return loss


def _nonneg(name, val):
    if isinstance(val, bool) or not isinstance(val, Number) or not val >= 0 or not math.isfinite(val):
        raise ValueError(f"{name} must be a non-negative finite number, got {val!r}")
    return float(val)
