r"""Calibration, selective-classification and OOD tools beside the metrics of :mod:`.predictive`.

* :func:`adaptive_ece` -- expected calibration error over equal-mass bins of the top-label
  confidence (the "adaptive" ECE of torch-uncertainty's ``AdaptiveCalibrationError``).
* :func:`aurc` -- area under the risk--coverage curve (Geifman & El-Yaniv 2017).
* :func:`fpr_at_tpr` -- the false-positive rate of an OOD score at a given true-positive rate
  (FPR\@95), with the sign convention of :func:`~vmfdist.nn.ood_auroc`.
* :class:`TemperatureScaling` -- post-hoc temperature scaling (Guo et al. 2017) fitted by the NLL.
* :func:`reliability_diagram` -- a matplotlib reliability diagram from
  :func:`~vmfdist.nn.calibration_bins`.

``pred`` is validated as in :mod:`.predictive`: a ``Categorical`` predictive or a floating tensor
``(..., classes)`` of probabilities (logits are refused); ``y`` holds integer class indices.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from .predictive import _labels, _probs, _scores, calibration_bins, ece

__all__ = ["adaptive_ece", "aurc", "fpr_at_tpr", "TemperatureScaling", "reliability_diagram"]


def _check_num_bins(num_bins):
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int, got {num_bins!r}")


def _confidence_correct(pred, y):
    """Flattened top-label confidences and 0/1 correctness (float64), and ``pred``'s dtype."""
    p = _probs(pred)
    y = _labels(p, y)
    if y.numel() == 0:
        raise ValueError("pred must hold at least one example")
    conf, guess = p.max(-1)
    return conf.reshape(-1).to(torch.float64), (guess == y).reshape(-1).to(torch.float64), p.dtype


def adaptive_ece(pred, y, num_bins: int = 15) -> torch.Tensor:
    r"""Expected calibration error over ``num_bins`` equal-mass ("adaptive") bins of the top-label
    confidence: :math:`\sum_b \frac{n_b}{n}|\mathrm{acc}_b - \mathrm{conf}_b|`, in [0, 1].

    Binning rule (that of torch-uncertainty's ``AdaptiveCalibrationError``, norm ``"l1"``): the
    ``n`` examples are sorted by confidence (ascending; a stable sort, so tied confidences keep
    their input order) and cut into ``num_bins`` consecutive runs as ``torch.tensor_split`` (and
    ``numpy.array_split``) cut them -- the first ``n % num_bins`` runs hold
    ``n // num_bins + 1`` examples, the others ``n // num_bins``.  A tie may therefore straddle
    two bins.  Bins left empty (``num_bins > n``) contribute nothing.  When every bin holds the
    examples of one equal-width bin of :func:`~vmfdist.nn.ece`, the two agree.

    ``pred``: the :class:`~vmfdist.nn.PredictiveCategorical` of :func:`~vmfdist.nn.predict` (or any
    ``Categorical``), or a floating tensor ``(..., classes)`` of probabilities (logits are
    refused).  ``y``: integer class indices of ``pred``'s batch shape.  ``num_bins``: a positive
    int.  Returns a 0-d tensor of ``pred``'s dtype."""
    _check_num_bins(num_bins)
    conf, correct, dtype = _confidence_correct(pred, y)
    n = conf.numel()
    order = torch.argsort(conf, stable=True)
    conf, correct = conf[order], correct[order]
    size, extra = divmod(n, num_bins)
    counts = torch.full((num_bins,), size, dtype=torch.long, device=conf.device)
    counts[:extra] += 1
    bin_of = torch.repeat_interleave(torch.arange(num_bins, device=conf.device), counts)
    gap = torch.zeros(num_bins, dtype=torch.float64, device=conf.device).index_add_(0, bin_of, correct - conf)
    return (gap.abs().sum() / n).to(dtype)


def aurc(pred, y) -> torch.Tensor:
    r"""Area under the risk--coverage curve of selective classification (Geifman & El-Yaniv 2017),
    with the top-label probability as the confidence and the 0/1 loss of the most probable class.

    Sort the ``n`` examples by decreasing confidence; at coverage :math:`k/n` the classifier keeps
    the first ``k`` and its risk :math:`r_k` is their error rate.  The AURC is the mean
    :math:`\frac1n\sum_{k=1}^n r_k` (a Riemann sum over the coverages :math:`1/n, \dots, 1`), in
    [0, 1]; lower is better.

    Ties: examples of equal confidence have no order, so within each tie block of ``m`` examples
    of which ``e`` are errors the cumulative error count is interpolated linearly (the first
    ``j`` of the block count ``j e / m`` errors).  This is the exact mean of the AURC over all
    orderings of the tied examples (``r_k`` is linear in the error count at fixed ``k``), so the
    value does not depend on the input order.

    ``pred``, ``y``: as for :func:`adaptive_ece`.  Returns a 0-d tensor of ``pred``'s dtype."""
    conf, correct, dtype = _confidence_correct(pred, y)
    n = conf.numel()
    order = torch.argsort(conf, descending=True, stable=True)
    conf, err = conf[order], 1 - correct[order]
    _, block_sizes = torch.unique_consecutive(conf, return_counts=True)
    block = torch.repeat_interleave(torch.arange(block_sizes.numel(), device=conf.device), block_sizes)
    block_err = torch.zeros(block_sizes.numel(), dtype=torch.float64, device=conf.device).index_add_(0, block, err)
    ends = torch.cumsum(block_sizes, 0)
    err_before = torch.cumsum(block_err, 0) - block_err  # errors in the blocks ranked above
    k = torch.arange(1, n + 1, dtype=torch.float64, device=conf.device)
    start = (ends - block_sizes)[block].to(torch.float64)  # examples ranked above this block
    cum_err = err_before[block] + (k - start) * (block_err / block_sizes)[block]
    return ((cum_err / k).sum() / n).to(dtype)


def fpr_at_tpr(score_in: torch.Tensor, score_out: torch.Tensor, tpr: float = 0.95) -> torch.Tensor:
    r"""False-positive rate of an OOD detector at true-positive rate ``tpr`` (FPR\@95 by default).

    Sign convention of :func:`~vmfdist.nn.ood_auroc`: the score should be *higher* out of
    distribution (e.g. the predictive entropy), the out-of-distribution inputs (``score_out``) are
    the positives and an input is flagged when its score is ``>=`` the threshold.  The threshold
    is the largest ``t`` whose true-positive rate :math:`\#\{s_{out} \ge t\}/n_{out}` is at least
    ``tpr``, i.e. the ``k``-th largest out-of-distribution score with ``k`` the least integer with
    :math:`k/n_{out} \ge` ``tpr``; the result is :math:`\#\{s_{in} \ge t\}/n_{in}`.  No
    interpolation: this is the FPR of the first point of scikit-learn's ``roc_curve(...,
    drop_intermediate=False)`` whose TPR reaches ``tpr``.  Ties between in- and
    out-of-distribution scores at ``t`` count as flagged.

    ``score_in``, ``score_out``: non-empty real tensors (any shape; flattened; no NaN).
    ``tpr``: in (0, 1].  Returns a 0-d float64 tensor."""
    score_in, score_out = _scores(score_in, "score_in"), _scores(score_out, "score_out")
    if isinstance(tpr, bool) or not isinstance(tpr, (int, float)) or not 0 < tpr <= 1:
        raise ValueError(f"tpr must be a number in (0, 1], got {tpr!r}")
    n_out = score_out.numel()
    k = min(max(math.ceil(tpr * n_out), 1), n_out)
    while k > 1 and (k - 1) / n_out >= tpr:  # the least k with k / n_out >= tpr in floating point
        k -= 1
    while k < n_out and k / n_out < tpr:
        k += 1
    threshold = torch.sort(score_out, descending=True).values[k - 1]
    return (score_in >= threshold).to(torch.float64).mean()


class TemperatureScaling(torch.nn.Module):
    r"""Temperature scaling (Guo et al. 2017): calibrated probabilities
    :math:`\mathrm{softmax}(z / T)` with one temperature :math:`T > 0` fitted on held-out logits.

    :meth:`fit` minimises the mean NLL :math:`\frac1n\sum_i [\log\sum_c e^{z_{ic}/T} - z_{iy_i}/T]`
    over ``T`` in ``bounds``.  As a function of :math:`\beta = 1/T` it is convex, with derivative
    :math:`\frac1n\sum_i (E_{\mathrm{softmax}(\beta z_i)}[z_i] - z_{iy_i})` non-decreasing in
    :math:`\beta`; the fit bisects the sign of that derivative in :math:`\log\beta` (in float64) to
    a relative width of 1e-12 -- no step size, so it cannot diverge.  When the NLL still decreases
    at a bound (separable data: it falls towards ``T -> 0``; logits carrying no or the wrong
    information: ``T -> inf``) the bound is returned with a warning.  If the NLL does not depend on
    ``T`` (every row of logits constant), ``T = 1``.

    ``temperature``: a 0-d float64 buffer (1 before fitting; saved in the ``state_dict``).
    Calling the module on logits ``(..., classes)`` returns ``softmax(logits / T)`` in the
    logits' dtype."""

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or \
                not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
        self.register_buffer("temperature", torch.tensor(float(temperature), dtype=torch.float64))

    @staticmethod
    def _check_logits(logits):
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a tensor, got {type(logits).__name__}")
        if not logits.dtype.is_floating_point or logits.dim() < 1 or logits.shape[-1] < 2:
            raise ValueError(f"logits must be floating with shape (..., classes >= 2), got dtype {logits.dtype} "
                             f"and shape {tuple(logits.shape)}")
        if logits.numel() and not bool(torch.isfinite(logits).all()):
            raise ValueError("logits holds NaN or infinite values")

    @torch.no_grad()
    def fit(self, logits: torch.Tensor, y: torch.Tensor, bounds=(1e-2, 1e2)) -> TemperatureScaling:
        """Fit the temperature on held-out ``logits`` ``(n, classes)`` and labels ``y`` ``(n,)``
        (integer class indices); ``bounds``: ``(low, high)`` with ``0 < low < high < inf``.  The
        logits must be logits (or log-probabilities), not probabilities.  Returns ``self``."""
        self._check_logits(logits)
        if logits.dim() != 2 or logits.shape[0] == 0:
            raise ValueError(f"logits must have shape (n >= 1, classes) to fit, got {tuple(logits.shape)}")
        y = _labels(logits, y)
        try:
            low, high = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise ValueError(f"bounds must be a pair (low, high) of numbers, got {bounds!r}") from None
        if not (0 < low < high < math.inf):
            raise ValueError(f"bounds must satisfy 0 < low < high < inf, got {bounds!r}")
        z = logits.detach().to(torch.float64)
        if torch.all(z.sum(-1).sub(1).abs() <= 1e-5 * z.shape[-1]) and bool((z >= 0).all()) and bool((z <= 1).all()):
            raise ValueError("logits look like probabilities (in [0, 1], rows summing to 1); temperature scaling "
                             "acts on logits: pass the logits, or probs.log()")
        z = z - z.mean(-1, keepdim=True)  # softmax is shift invariant; keeps the scale of z honest
        z_y = z.gather(-1, y.unsqueeze(-1)).squeeze(-1)

        def slope(log_beta):  # d NLL / d beta at beta = exp(log_beta)
            p = F.softmax(z * math.exp(log_beta), dim=-1)
            return float(((p * z).sum(-1) - z_y).mean())

        if float(z.abs().max()) == 0:
            self.temperature.fill_(1.0)
            return self
        lo, hi = -math.log(high), -math.log(low)  # log beta range
        if slope(hi) <= 0:
            warnings.warn(f"TemperatureScaling.fit: the NLL still decreases at T = {low:g} (the lower bound); "
                          f"the held-out data look separable", RuntimeWarning, stacklevel=2)
            self.temperature.fill_(low)
            return self
        if slope(lo) >= 0:
            warnings.warn(f"TemperatureScaling.fit: the NLL still decreases at T = {high:g} (the upper bound); "
                          f"the logits carry little or no information about the labels", RuntimeWarning, stacklevel=2)
            self.temperature.fill_(high)
            return self
        while hi - lo > 1e-12 * max(1.0, abs(lo), abs(hi)):
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            if slope(mid) > 0:
                hi = mid
            else:
                lo = mid
        self.temperature.fill_(math.exp(-0.5 * (lo + hi)))
        return self

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """``softmax(logits / T)`` over the last dimension, in the logits' dtype."""
        self._check_logits(logits)
        return F.softmax(logits / self.temperature.to(device=logits.device, dtype=logits.dtype), dim=-1)

    def extra_repr(self) -> str:
        return f"temperature={float(self.temperature):.6g}"


def reliability_diagram(pred, y, num_bins: int = 15, ax=None):
    """Draw a reliability diagram with matplotlib and return the axes.

    One bar per non-empty equal-width confidence bin of :func:`~vmfdist.nn.calibration_bins`
    (so at most ``num_bins`` bars), of height the bin's accuracy, over the diagonal of perfect
    calibration, with each bin's mean confidence marked; the title gives the :func:`~vmfdist.nn.ece`.
    ``pred``, ``y``, ``num_bins``: as for :func:`~vmfdist.nn.calibration_bins`.  ``ax``: a
    matplotlib ``Axes`` to draw on (default: a new figure's).  matplotlib is imported only here."""
    conf, acc, count = calibration_bins(pred, y, num_bins)
    if float(count.sum()) == 0:
        raise ValueError("pred must hold at least one example")
    if ax is None:
        try:
            import matplotlib.pyplot as plt
        except ImportError as exc:
            raise ImportError("reliability_diagram needs matplotlib: pip install matplotlib") from exc
        _, ax = plt.subplots(figsize=(4, 4))
    keep = count > 0
    width = 1.0 / num_bins
    centers = (torch.arange(num_bins, dtype=torch.float64) + 0.5) * width
    k = keep.cpu()
    ax.bar(centers[k].tolist(), acc.detach().cpu()[k].tolist(), width=width, edgecolor="black",
           color="tab:blue", alpha=0.8, label="accuracy")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    ax.plot(conf.detach().cpu()[k].tolist(), acc.detach().cpu()[k].tolist(), "o", color="tab:red",
            markersize=3, label="mean confidence")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(f"ECE = {float(ece(pred, y, num_bins)):.4f}")
    ax.legend(loc="upper left")
    return ax
