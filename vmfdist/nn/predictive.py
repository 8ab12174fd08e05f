r"""The Monte Carlo predictive distribution and the usual metrics.

:func:`predict` evaluates ``num_samples`` weight samples as *one* batch (see
:func:`~vmfdist.nn.sample_forward`) and returns a distribution: for classification a
:class:`PredictiveCategorical` with the averaged probabilities
:math:`\bar p = \frac1S\sum_s \mathrm{softmax}(f_{w_s}(x))` (the ELBO notes, §2), for regression a
mixture over the samples (of Gaussians, or of Student-t's when the noise precision has a
Gamma posterior).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch.distributions import Categorical as _TorchCategorical
from torch.distributions import MixtureSameFamily, Normal, StudentT

from .elbo import Categorical, GammaPrecisionGaussian, Gaussian, Likelihood
from .model import _predictive_forward

__all__ = ["predict", "PredictiveCategorical", "nll", "log_likelihood", "rmse", "accuracy", "ece",
           "calibration_bins", "brier_score", "predictive_entropy", "mutual_information", "ood_auroc"]


class PredictiveCategorical(_TorchCategorical):
    """A ``Categorical`` over the averaged class probabilities that also keeps the per-sample
    probabilities ``sample_probs`` (``(S, B, C)``), for the mutual information."""

    def __init__(self, sample_probs: torch.Tensor, validate_args=None):
        self.sample_probs = sample_probs
        super().__init__(probs=sample_probs.mean(0), validate_args=validate_args)


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, num_samples: int = 32, likelihood: Optional[Likelihood] = None,
            *, samples_per_pass: Optional[int] = None):
    """Monte Carlo predictive of ``model`` at ``x`` from ``num_samples`` weight samples,
    evaluated as one batch.  ``likelihood``: :class:`Categorical` (default; the output is
    logits), :class:`Gaussian` or :class:`GammaPrecisionGaussian` (the output is the mean,
    shape ``(B,)`` or ``(B, 1)``).  The model is evaluated in ``eval()`` mode (restored after).

    ``samples_per_pass`` bounds how many samples are stacked in one pass (memory: a pass holds
    that many copies of every layer's weights and activations).  Default: all of them, except
    on the CPU, where layers whose stacked weight samples would exceed 16 MiB
    (``vmfdist.nn._base.CPU_PASS_BYTES``) take several passes -- faster there, since large
    fresh allocations cost page faults on every call.  The samples are independent either way;
    the random numbers drawn differ between pass sizes.

    The samples are those of :func:`sample_forward`, except in an ``nn.Sequential`` whose first
    Bayesian layer is one of its children: the modules before that layer run once, and the layer
    evaluates all its samples on that shared input -- with the stacked weights (one product
    instead of ``S``), or, for a :class:`MeanFieldLinear` on a batch of vectors, by the local
    reparameterisation (exact per example: see docs/nn.md, "Predictive and metrics").  Every
    example's predictive has the distribution the per-sample loop gives it; only the dependence
    between examples through a shared first-layer weight sample is dropped.

    A non-finite ``x`` is a ``ValueError`` naming its first bad row; non-finite outputs for a
    finite ``x`` a ``FloatingPointError`` (the parameters: :func:`~vmfdist.nn.check_finite`).
    Both are checked with one host read per call, after the forward pass.
    """
    likelihood = Categorical() if likelihood is None else likelihood
    if not (isinstance(num_samples, int) and not isinstance(num_samples, bool) and num_samples >= 1):
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    rows = num_samples * max(x.shape[0] if isinstance(x, torch.Tensor) and x.dim() else 1, 1)  # (an empty x too)
    if rows > 2 ** 31:  # the predictive holds one output row per sample and example
        raise ValueError(f"num_samples x batch = {rows} exceeds 2**31 output rows; use fewer samples or a smaller batch")
    was_training = model.training
    model.eval()
    try:
        out = _predictive_forward(model, x, num_samples, samples_per_pass)
    finally:
        model.train(was_training)
    # one host read for both checks: x finite, and then the outputs of the model
    finite = [torch.isfinite(t).all().to(out.device) if isinstance(t, torch.Tensor) and t.is_floating_point()
              else torch.ones((), dtype=torch.bool, device=out.device) for t in (x, out)]
    x_ok, out_ok = torch.stack(finite).tolist()
    if not x_ok:
        bad = (~torch.isfinite(x)).reshape(x.shape[0], -1).any(1).nonzero()[0, 0] if x.dim() else 0
        raise ValueError(f"x holds NaN or infinite values (first in row {int(bad)})")
    if not out_ok:
        raise FloatingPointError("predict: the model's outputs hold NaN or infinite values for a finite input; check "
                                 "its parameters (vmfdist.nn.check_finite(model) names the non-finite ones)")
    if isinstance(likelihood, Categorical):
        if out.dim() != 3 or out.shape[-1] < 2:
            raise ValueError(f"predict: the default likelihood is Categorical, which needs (batch, classes >= 2) "
                             f"logits per sample, got {tuple(out.shape[1:])}; for regression pass "
                             f"likelihood=Gaussian(...)")
        return PredictiveCategorical(F.softmax(out, dim=-1))
    if out.dim() == 3 and out.shape[-1] == 1:
        out = out.squeeze(-1)
    if out.dim() != 2:
        raise ValueError(f"regression output must be (B,) or (B, 1) per sample, got {tuple(out.shape[1:])}")
    means = out.transpose(0, 1)  # (B, S)
    mix = _TorchCategorical(logits=torch.zeros_like(means))
    if isinstance(likelihood, Gaussian):
        comp = Normal(means, likelihood.sigma.detach().to(means.dtype).expand_as(means))
    elif isinstance(likelihood, GammaPrecisionGaussian):
        a1, b1 = likelihood.log_a1.exp().detach().to(means.dtype), likelihood.log_b1.exp().detach().to(means.dtype)
        comp = StudentT(2 * a1.expand_as(means), means, torch.sqrt(b1 / a1).expand_as(means))
    else:
        raise TypeError(f"likelihood: predict supports Categorical, Gaussian and GammaPrecisionGaussian, got "
                        f"{type(likelihood).__name__}")
    return MixtureSameFamily(mix, comp)


def _probs(pred) -> torch.Tensor:
    """The class probabilities of ``pred``: a ``Categorical`` predictive, or a floating tensor
    ``(..., C)`` of probabilities (finite, in [0, 1], rows summing to 1 -- logits are refused, as
    torchmetrics and scikit-learn refuse them)."""
    if isinstance(pred, _TorchCategorical):
        return pred.probs
    if isinstance(pred, torch.Tensor):
        if not pred.dtype.is_floating_point or pred.dim() < 1 or pred.shape[-1] < 1:
            raise ValueError(f"pred must be floating probabilities of shape (..., classes), got dtype {pred.dtype} "
                             f"and shape {tuple(pred.shape)}")
        if pred.numel():
            tol = 1e-3 if pred.dtype in (torch.float16, torch.bfloat16) else 1e-5
            if not bool(torch.isfinite(pred).all()):
                raise ValueError("pred holds NaN or infinite values; it must be class probabilities")
            if bool((pred < 0).any()) or bool((pred > 1).any()) or \
                    not bool(((pred.sum(-1) - 1).abs() <= tol * pred.shape[-1]).all()):
                raise ValueError("pred must be class probabilities (in [0, 1], each row summing to 1); for logits "
                                 "pass logits.softmax(-1)")
        return pred
    raise TypeError(f"pred must be a Categorical predictive or a tensor of probabilities, got {type(pred).__name__}")


def _labels(probs, y):
    """``y`` as class indices: an integer tensor of ``probs``' batch shape with values in ``[0, C)``."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a tensor of class indices, got {type(y).__name__}")
    if y.shape != probs.shape[:-1]:
        raise ValueError(f"y must have shape {tuple(probs.shape[:-1])}, got {tuple(y.shape)}")
    if y.dtype.is_floating_point or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"y must hold integer class indices, got dtype {y.dtype}")
    k = probs.shape[-1]
    if y.numel() and (bool((y < 0).any()) or bool((y >= k).any())):
        raise ValueError(f"y must hold class indices in [0, {k}), got values from {int(y.min())} to {int(y.max())}")
    return y.long()


def nll(pred, y) -> torch.Tensor:
    """Mean negative log predictive density ``-mean log p(y_i | x_i)``: ``pred`` is a predictive
    distribution (from :func:`predict`) or, for classification, a tensor of class probabilities."""
    if isinstance(pred, torch.Tensor):
        p = _probs(pred)
        return -p.gather(-1, _labels(p, y).unsqueeze(-1)).squeeze(-1).log().mean()
    if not hasattr(pred, "log_prob"):
        raise TypeError(f"pred must be a predictive distribution or a tensor of class probabilities, got "
                        f"{type(pred).__name__}")
    return -pred.log_prob(y).mean()


def log_likelihood(pred, y, y_mean: float = 0.0, y_std: float = 1.0) -> torch.Tensor:
    r"""Mean test log-likelihood on the *original* target scale, for a predictive over
    standardised targets :math:`(y - \bar y)/s`: :math:`\log p(y) = \log p_{std}((y - \bar y)/s) - \log s`.
    ``pred``: a regression predictive of :func:`predict`; ``y``: targets of its batch shape;
    ``y_mean``, ``y_std`` (positive): the standardisation."""
    if not y_std > 0:
        raise ValueError(f"y_std must be positive, got {y_std!r}")
    return (pred.log_prob((y - y_mean) / y_std) - math.log(y_std)).mean()


def rmse(pred, y, y_mean: float = 0.0, y_std: float = 1.0) -> torch.Tensor:
    """Root mean squared error of the predictive mean, on the original scale.  ``pred``: a
    regression predictive of :func:`predict`; ``y``: targets of its batch shape; ``y_mean``,
    ``y_std``: the standardisation of the targets the predictive is over."""
    return ((pred.mean * y_std + y_mean - y).pow(2).mean()).sqrt()


def accuracy(pred, y) -> torch.Tensor:
    """Fraction of examples whose most probable class is ``y``.  ``pred``: the :class:`PredictiveCategorical` of :func:`predict` (or any ``Categorical``), or a
    floating tensor ``(..., classes)`` of probabilities (finite, in [0, 1], rows summing to 1; logits
    are refused).  ``y``: integer class indices of ``pred``'s batch shape, in ``[0, classes)``."""
    p = _probs(pred)
    return (p.argmax(-1) == _labels(p, y)).to(p.dtype).mean()


def calibration_bins(pred, y, num_bins: int = 15):
    """``(confidence, accuracy, count)`` per equal-width confidence bin on [0, 1] (empty bins
    have confidence and accuracy 0): the data of a reliability diagram.  ``pred``: the :class:`PredictiveCategorical` of :func:`predict` (or any ``Categorical``), or a
    floating tensor ``(..., classes)`` of probabilities (finite, in [0, 1], rows summing to 1; logits
    are refused).  ``y``: integer class indices of ``pred``'s batch shape, in ``[0, classes)``.
    ``num_bins``: a positive int."""
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int, got {num_bins!r}")
    p = _probs(pred)
    y = _labels(p, y)
    conf, guess = p.max(-1)
    correct = (guess == y).to(p.dtype)
    idx = (conf * num_bins).long().clamp(0, num_bins - 1)
    count = torch.zeros(num_bins, dtype=p.dtype, device=p.device).index_add_(0, idx, torch.ones_like(conf))
    sconf = torch.zeros_like(count).index_add_(0, idx, conf)
    sacc = torch.zeros_like(count).index_add_(0, idx, correct)
    safe = count.clamp_min(1)
    return sconf / safe, sacc / safe, count


def ece(pred, y, num_bins: int = 15) -> torch.Tensor:
    r"""Expected calibration error with ``num_bins`` equal-width bins (default 15):
    :math:`\sum_b \frac{n_b}{n}|\mathrm{acc}_b - \mathrm{conf}_b|`, in [0, 1].  ``pred``: the :class:`PredictiveCategorical` of :func:`predict` (or any ``Categorical``), or a
    floating tensor ``(..., classes)`` of probabilities (finite, in [0, 1], rows summing to 1; logits
    are refused).  ``y``: integer class indices of ``pred``'s batch shape, in ``[0, classes)``."""
    conf, acc, count = calibration_bins(pred, y, num_bins)
    return ((acc - conf).abs() * count).sum() / count.sum()


def brier_score(pred, y) -> torch.Tensor:
    r"""Mean over examples of :math:`\sum_c (p_c - 1[y = c])^2`, in [0, 2].  ``pred``: the :class:`PredictiveCategorical` of :func:`predict` (or any ``Categorical``), or a
    floating tensor ``(..., classes)`` of probabilities (finite, in [0, 1], rows summing to 1; logits
    are refused).  ``y``: integer class indices of ``pred``'s batch shape, in ``[0, classes)``."""
    p = _probs(pred)
    onehot = F.one_hot(_labels(p, y), p.shape[-1]).to(p.dtype)
    return (p - onehot).pow(2).sum(-1).mean()


def _entropy(p):
    return -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(-1)


def predictive_entropy(pred) -> torch.Tensor:
    """Entropy of the averaged class probabilities, per example (nats).  ``pred``: as for
    :func:`accuracy`."""
    return _entropy(_probs(pred))


def mutual_information(pred: PredictiveCategorical) -> torch.Tensor:
    r"""Mutual information between the label and the weights (BALD), per example:
    :math:`H[\bar p] - \frac1S\sum_s H[p_s]`.  ``pred``: the :class:`PredictiveCategorical` of
    :func:`predict` (it keeps the per-sample probabilities)."""
    if not isinstance(pred, PredictiveCategorical):
        raise TypeError("mutual_information needs the per-sample probabilities: pass the result of predict()")
    return _entropy(pred.probs) - _entropy(pred.sample_probs).mean(0)


def _scores(s, name):
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of scores, got {type(s).__name__}")
    if s.is_complex() or s.dtype == torch.bool:
        raise ValueError(f"{name} must hold real scores, got dtype {s.dtype}")
    if s.numel() == 0:
        raise ValueError(f"{name} must be non-empty")
    s = s.detach().reshape(-1).to(torch.float64)
    if bool(torch.isnan(s).any()):
        raise ValueError(f"{name} holds NaN values")
    return s


def ood_auroc(score_in: torch.Tensor, score_out: torch.Tensor) -> torch.Tensor:
    r"""Area under the ROC curve for telling out-of-distribution inputs (``score_out``) from
    in-distribution ones (``score_in``) by a score that should be higher out of distribution
    (e.g. the predictive entropy): :math:`P(s_{out} > s_{in}) + \tfrac12 P(s_{out} = s_{in})`,
    from the Mann--Whitney rank statistic with average ranks for ties.  ``score_in``,
    ``score_out``: non-empty real tensors (any shape; flattened; no NaN, which has no rank)."""
    score_in, score_out = _scores(score_in, "score_in"), _scores(score_out, "score_out")
    n_in, n_out = score_in.numel(), score_out.numel()
    allv = torch.cat([score_in, score_out])
    order = torch.argsort(allv, stable=True)
    sorted_v = allv[order]
    _, inverse, counts = torch.unique_consecutive(sorted_v, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    avg_rank = ends - (counts.to(torch.float64) - 1) / 2  # 1-based average rank of each tie block
    ranks = torch.empty_like(allv)
    ranks[order] = avg_rank[inverse]
    r_out = ranks[n_in:].sum()
    return (r_out - n_out * (n_out + 1) / 2) / (n_in * n_out)
