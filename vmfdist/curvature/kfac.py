r"""K-FAC and EK-FAC curvature of ordinary ``nn.Linear`` / ``nn.Conv2d`` layers, collected by
hooks.

**Convention.**  For each supported layer (weight matrix ``[W | b]`` of shape
``(out, in+1)``, see :mod:`vmfdist.curvature.layers`) the curvature *per data point* is
approximated by :math:`G\otimes A` (``torch.kron`` order, row-major ``vec``), with

* :math:`A = \frac1N\sum_n \frac1T\sum_t a_{n,t}a_{n,t}^T` (KFAC-expand, the default) or
  :math:`A = \frac1N\sum_n \bar a_n\bar a_n^T`, :math:`\bar a_n = \frac1T\sum_t a_{n,t}`
  (KFAC-reduce), the inputs with an appended 1 for the bias;
* :math:`G = \frac1N\sum_n\sum_t g_{n,t}g_{n,t}^T` (expand) or
  :math:`G = \frac1N\sum_n (\sum_t g_{n,t})(\sum_t g_{n,t})^T` (reduce), where
  :math:`g_{n,t}` is the gradient of example :math:`n`'s own loss term
  :math:`-\log p(\tilde y_n\mid x_n)` with respect to the layer output at location
  :math:`t` (per example: not divided by the batch size).

:math:`T` is the number of spatial locations (1 for a Linear layer on 2-d input).  So the
Fisher / GGN of the *summed* negative log-likelihood over :math:`N` data is approximated by
:math:`N\,G\otimes A`, and that of the *mean* by :math:`G\otimes A`.  These are curvlinops'
``KFACLinearOperator`` factors (``separate_weight_and_bias=False``) for a mean-reduced loss,
and :math:`1/N` times its gradient factor for a sum-reduced loss (tested to rounding).

**Fisher types** (``fisher_type``, curvlinops' names): ``"mc"`` — :math:`\tilde y_n` sampled from
the model's predictive (the true Fisher, Monte Carlo; ``mc_samples`` draws, each weighted
:math:`1/\text{mc\_samples}`), ``"empirical"`` — :math:`\tilde y_n = y_n`, ``"type-2"`` (aliases
``"ggn"``, ``"type2"``) — the exact GGN: one backward pass per column of the square root of the
Hessian of the loss in the output (:math:`C` passes for :math:`C` outputs).

**Likelihoods**: ``"classification"`` (categorical on logits; :math:`-\log p = ` cross-entropy)
and ``"regression"`` (Gaussian with standard deviation ``sigma_noise``: :math:`-\log p =
\|f-y\|^2/(2\sigma^2) + \text{const}`).

**EK-FAC**: the second moments of the per-example gradients in the Kronecker eigenbasis,
:math:`S = \frac1N\sum_n \big(Q_G^T(\sum_t g_{n,t}a_{n,t}^T)Q_A\big)^{\odot 2}`: for a convolution
the gradient is summed over locations *before* squaring (George et al. 2018).

The entry point for other modules (e.g. ``vmfdist.laplace``) is :func:`compute_kfac`; the recording
itself is :class:`~vmfdist.curvature.KFACCollector`, the value type
:class:`~vmfdist.curvature.KroneckerFactor`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional

import torch
from torch import nn

from .collect import (FISHER_TYPES, KFAC_APPROX, KFACCollector, batch_nll, batch_rows, check_choice, gradient_factor,
                      input_factor, per_example_second_moments, resolve_loss)
from .eigen import require_finite
from .factor import KroneckerFactor
from .layers import find_layers

__all__ = ["KFACResult", "compute_kfac"]


@dataclass
class KFACResult:
    r"""What :func:`compute_kfac` returns: ``layers`` (name -> :class:`~vmfdist.curvature.KroneckerFactor` with the
    factors *per data point*, in model order), ``modules`` (name -> the layer), ``num_data``
    (:math:`N`), ``loss`` (the summed negative log-likelihood of the data seen, without
    constants: cross-entropy, or :math:`\|f-y\|^2/(2\sigma^2)`), ``curvature_scale`` (:math:`N`
    when the caller's loss is a sum over the data, 1 for a mean: the loss curvature is
    ``curvature_scale * kron(G, A)``), and the settings used."""

    layers: Dict[str, KroneckerFactor]
    num_data: int
    likelihood: str
    sigma_noise: float
    fisher_type: str
    kfac_approx: str
    reduction: str = "mean"
    curvature_scale: float = 1.0
    settings: dict = field(default_factory=dict)
    modules: Dict[str, torch.nn.Module] = field(default_factory=dict)
    loss: Optional[torch.Tensor] = None

    def __getitem__(self, name: str) -> KroneckerFactor:
        return self.layers[name]

    def __iter__(self):
        return iter(self.layers.values())


def _check_options(fisher_type, kfac_approx, mc_samples, num_data):
    check_choice("fisher_type", fisher_type, FISHER_TYPES)
    check_choice("kfac_approx", kfac_approx, KFAC_APPROX)
    if not (isinstance(mc_samples, int) and mc_samples >= 1):
        raise ValueError(f"mc_samples must be a positive integer, got {mc_samples!r}")
    if fisher_type != "mc" and mc_samples != 1:
        raise ValueError("mc_samples must be 1 unless fisher_type='mc'")
    if num_data is not None and (not isinstance(num_data, int) or num_data < 1):
        raise ValueError(f"num_data must be a positive integer, got {num_data!r}")


def compute_kfac(model: torch.nn.Module, data: Iterable, likelihood: Optional[str] = None, *, sigma_noise: float = 1.0,
                 fisher_type: str = "type-2", kfac_approx: str = "expand", mc_samples: int = 1,
                 loss_func: Optional[torch.nn.Module] = None, modules=None, num_data: Optional[int] = None,
                 ekfac: bool = False, min_eigenvalue: float = 0.0, generator: Optional[torch.Generator] = None,
                 seed: Optional[int] = None) -> KFACResult:
    """K-FAC (and optionally EK-FAC) factors of every ``nn.Linear`` / ``nn.Conv2d`` of ``model``
    over ``data``.

    Args:
        model: an ordinary module whose output is ``(batch, outputs)`` (logits for
            classification).  Every module with trainable parameters must be a supported
            layer unless ``modules`` selects layers (then the others are ignored).
        data: an iterable of ``(inputs, targets)`` batches (e.g. a ``DataLoader``);
            classification targets are class indices ``(batch,)``, regression targets have the
            output's shape (or ``(batch,)`` for one output).
        likelihood: ``"classification"`` or ``"regression"`` (or give ``loss_func``).
        sigma_noise: the Gaussian likelihood's standard deviation (regression).
        fisher_type: ``"type-2"`` / ``"ggn"`` / ``"type2"`` (exact GGN, the default, as laplace-torch),
            ``"mc"`` (true Fisher by sampled labels) or ``"empirical"``.
        kfac_approx: ``"expand"`` (default) or ``"reduce"`` (Eschenhagen et al. 2023), for
            layers with several locations per example (convolutions).
        mc_samples: label draws per example for ``"mc"``.
        loss_func: instead of ``likelihood``: ``nn.CrossEntropyLoss`` / ``nn.MSELoss``, see
            :func:`~vmfdist.curvature.resolve_loss` (its reduction sets ``curvature_scale``).
        modules: layers to use (modules or names); default all supported layers.
        num_data: the data set size :math:`N` reported (default: the number of examples seen);
            the factors are averages over the examples seen.
        ekfac: also compute the eigenbases and, in a second pass over ``data`` with the same
            labels, the EK-FAC second moments (``KroneckerFactor.moments``).
        min_eigenvalue: clamp for the factors' eigenvalues (``ekfac=True``).
        generator / seed: the random stream for ``"mc"`` labels (``seed`` makes a fresh
            CPU/device generator seeded with it; the EK-FAC pass replays the same labels).

    Returns:
        :class:`KFACResult`; ``result[name].A`` and ``.G`` are float tensors in the model's
        dtype with :math:`G\\otimes A` the curvature per data point.

    Raises:
        ValueError: an unsupported layer (named, with the list of supported ones), a bad
            option or a loss that would mis-scale the Fisher.
        FloatingPointError: a factor that is not finite (the layer is named).
    """
    _check_options(fisher_type, kfac_approx, mc_samples, num_data)
    layers = find_layers(model, modules, allow_other_parameters=modules is not None)
    like, sigma, reduction = resolve_loss(likelihood, sigma_noise, loss_func)
    weights = [m.weight for m in layers.values()]
    saved_flags = [w.requires_grad for w in weights]
    options = dict(likelihood=like, fisher_type=fisher_type, params=weights, sigma_noise=sigma, mc_samples=mc_samples)
    try:
        for w in weights:
            w.requires_grad_(True)
        with KFACCollector(layers) as collector:
            first = _factor_pass(model, data, collector, layers, options, kfac_approx, loss_func, generator, seed)
            seen, factors, loss, (label_state, outputs) = first
            if ekfac:
                for f in factors.values():
                    f.eigen(min_eigenvalue)
                _moments_pass(model, data, collector, factors, options, generator, seed, label_state, seen)
    finally:
        for w, f in zip(weights, saved_flags):
            w.requires_grad_(f)
    n = num_data if num_data is not None else seen
    return KFACResult(factors, n, like, sigma, fisher_type, kfac_approx, reduction,
                      float(n) if reduction == "sum" else 1.0,
                      dict(mc_samples=mc_samples, ekfac=ekfac, min_eigenvalue=min_eigenvalue, num_outputs=outputs),
                      dict(layers), loss)


def _label_generator(generator, seed, X):
    """The generator of the sampled labels: ``generator``, or a fresh one seeded with ``seed`` on
    the data's device."""
    if seed is None:
        return generator
    gen = torch.Generator(device=X.device if isinstance(X, torch.Tensor) else "cpu")
    gen.manual_seed(seed)
    return gen


def _factor_pass(model, data, collector, layers, options, kfac_approx, loss_func, generator, seed):
    """First pass: the factors averaged over the examples; returns ``(examples seen, {name:
    KroneckerFactor}, summed loss, (the label generator's state at the start, number of outputs))``."""
    A = {n: None for n in layers}
    G = {n: None for n in layers}
    seen, loss, gen, state, outputs = 0, None, None, None, None
    for X, y in data:
        if batch_rows(X, y) == 0:
            continue  # an empty batch adds nothing
        if gen is None:
            gen = _label_generator(generator, seed, X)
            state = None if gen is None else gen.get_state()
        out, stats = collector.collect(model, X, y, generator=gen, **options)
        if loss_func is not None and isinstance(loss_func, nn.MSELoss):
            resolve_loss(None, 1.0, loss_func, num_outputs=out.shape[1])
        nll = batch_nll(out, y, options["likelihood"], options["sigma_noise"])
        loss = nll if loss is None else loss + nll
        for name, (a, gs) in stats.items():
            fa = input_factor(a, kfac_approx)
            fg = sum(gradient_factor(g, kfac_approx) for g in gs)
            A[name] = fa if A[name] is None else A[name] + fa
            G[name] = fg if G[name] is None else G[name] + fg
        seen += out.shape[0]
        outputs = out.shape[1]
    if seen == 0:
        raise ValueError("data yielded no batches")
    factors = {}
    for name in layers:
        a_f, g_f = A[name] / seen, G[name] / seen
        require_finite(name, "input factor A", a_f)
        require_finite(name, "gradient factor G", g_f)
        factors[name] = KroneckerFactor(a_f, g_f)
    return seen, factors, loss, (state, outputs)


def _moments_pass(model, data, collector, factors, options, generator, seed, label_state, seen):
    """Second pass (EK-FAC): the second moments of the per-example gradients in each factor's
    eigenbasis, with the labels of the first pass (the generator's state is replayed)."""
    S = {n: None for n in factors}
    gen = None
    for X, y in data:
        if batch_rows(X, y) == 0:
            continue
        if gen is None:
            gen = _label_generator(generator, seed, X)
            if gen is not None and label_state is not None:
                gen.set_state(label_state)
        _, stats = collector.collect(model, X, y, generator=gen, **options)
        for name, (a, gs) in stats.items():
            f = factors[name]
            s = sum(per_example_second_moments(a, g, f.q_a, f.q_g) for g in gs)
            S[name] = s if S[name] is None else S[name] + s
    for name, f in factors.items():
        s = S[name] / seen
        require_finite(name, "EK-FAC second moments", s)
        f.moments = s
