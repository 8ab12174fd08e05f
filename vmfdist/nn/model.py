"""Model-level helpers: the KL of a whole model, putting a model in a mode, evaluating several
weight samples as one batch, and detecting non-finite parameters."""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Tuple

import torch
from torch import nn

from ._base import BayesianModule, _check_mode, _pass_sizes

__all__ = ["bayesian_modules", "kl_divergence", "deterministic", "sample_forward", "check_finite"]


def bayesian_modules(model: torch.nn.Module) -> Iterator[Tuple[str, BayesianModule]]:
    """``(name, layer)`` for every Bayesian layer of ``model`` (itself included)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    for name, m in model.named_modules():
        if isinstance(m, BayesianModule):
            yield name, m


def kl_divergence(model: torch.nn.Module) -> torch.Tensor:
    """Sum of :meth:`kl_divergence` over all Bayesian layers of ``model`` (a scalar tensor;
    0 for a model without Bayesian layers)."""
    total = None
    for _, m in bayesian_modules(model):
        kl = m.kl_divergence()
        total = kl if total is None else total + kl
    if total is None:
        p = next(model.parameters(), None)
        return torch.zeros((), dtype=torch.get_default_dtype() if p is None else p.dtype,
                           device=None if p is None else p.device)
    return total


@contextlib.contextmanager
def deterministic(model: torch.nn.Module, use: str = "mean"):
    """``with deterministic(model, use="mean" | "mode"):`` every Bayesian layer uses its
    posterior mean (or mode) instead of sampling; the previous modes are restored on exit."""
    if use not in ("mean", "mode"):
        raise ValueError(f"use must be 'mean' or 'mode', got {use!r}")
    layers = list(bayesian_modules(model))
    old = [m.mode for _, m in layers]
    try:
        for _, m in layers:
            m.set_mode(use)
        yield model
    finally:
        for (_, m), mode in zip(layers, old):
            m.set_mode(mode)


def set_mode(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Put every Bayesian layer of ``model`` in ``mode`` (``"sample"``, ``"mean"``, ``"mode"``)."""
    _check_mode(mode)
    for _, m in bayesian_modules(model):
        m.set_mode(mode)
    return model


@contextlib.contextmanager
def _folded(model: torch.nn.Module, num_samples: int):
    layers = [m for _, m in bayesian_modules(model)]
    old = [m._num_samples for m in layers]
    try:
        for m in layers:
            m._num_samples = num_samples
        yield
    finally:
        for m, n in zip(layers, old):
            m._num_samples = n


def _check_positive_int(name: str, value, allowed: str = "a positive int") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _check_sample_args(x, num_samples, samples_per_pass=None) -> None:
    _check_positive_int("num_samples", num_samples)
    if samples_per_pass is not None:
        _check_positive_int("samples_per_pass", samples_per_pass, "a positive int or None")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor with a batch dimension")


def _unfold(out: torch.Tensor, num_samples: int, b: int) -> torch.Tensor:
    """``(num_samples * b, ...)`` sample-major outputs as ``(num_samples, b, ...)``."""
    if out.shape[0] != num_samples * b:
        raise ValueError(f"model output has leading dimension {out.shape[0]}, expected num_samples * batch = "
                         f"{num_samples * b}: the model must keep the batch in dimension 0")
    return out.reshape((num_samples, b) + tuple(out.shape[1:]))


def sample_forward(model: torch.nn.Module, x: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Outputs of ``num_samples`` independent weight samples, evaluated as one batch:
    ``x`` (batch first) is repeated ``num_samples`` times along dimension 0, every Bayesian
    layer draws ``num_samples`` weight tensors at once and applies sample ``s`` to copy
    ``s`` (one batched matmul or grouped convolution), and the result is returned with shape
    ``(num_samples, batch, ...)``.  Differentiable (use it for a multi-sample ELBO).

    The model must treat dimension 0 of every intermediate tensor as the batch (as
    ``nn.Sequential`` models of layers, activations, pooling and ``Flatten`` do); layers in
    ``mean`` / ``mode`` give the same output for every sample.
    """
    _check_sample_args(x, num_samples)
    b = x.shape[0]
    xs = x.unsqueeze(0).expand((num_samples,) + tuple(x.shape)).reshape((num_samples * b,) + tuple(x.shape[1:]))
    with _folded(model, num_samples):
        out = model(xs)
    return _unfold(out, num_samples, b)


def _shared_prefix(model: torch.nn.Module):
    """``(k, layer)`` when ``model`` is an ``nn.Sequential`` whose first child containing a
    Bayesian layer, child ``k``, is itself one: the children before it see no weight sample,
    so its input is the same for every sample.  None otherwise."""
    if not isinstance(model, nn.Sequential):
        return None
    for k, child in enumerate(model):
        if isinstance(child, BayesianModule):
            return k, child
        if any(isinstance(m, BayesianModule) for m in child.modules()):
            return None
    return None


def _max_sample_bytes(module: torch.nn.Module) -> int:
    """Bytes of the largest weight sample among the sampling Bayesian layers of ``module``."""
    return max((m._sample_bytes() for _, m in bayesian_modules(module) if m.mode == "sample"), default=0)


def _predictive_forward(model: torch.nn.Module, x: torch.Tensor, num_samples: int,
                        samples_per_pass: Optional[int] = None) -> torch.Tensor:
    """The outputs of ``num_samples`` weight samples, ``(num_samples, batch, ...)``, for the
    predictive: like :func:`sample_forward`, except that in an ``nn.Sequential`` the modules
    before the first Bayesian layer run once on ``x`` and that layer evaluates its samples on
    the shared input (:meth:`BayesianModule._forward_shared`), and that the samples go through
    the (rest of the) model in passes of at most ``samples_per_pass`` (default: by the size of
    the stacked weights, :func:`~vmfdist.nn._base._pass_sizes`).  Each example's outputs have the
    distribution they have under :func:`sample_forward`; for use without gradients, in eval mode
    (where the modules before the first Bayesian layer are deterministic)."""
    _check_sample_args(x, num_samples, samples_per_pass)
    found = _shared_prefix(model)
    if found is None:
        passes = _pass_sizes(num_samples, _max_sample_bytes(model), x.device, samples_per_pass)
        outs = [sample_forward(model, x, c) for c in passes]
        return outs[0] if len(outs) == 1 else torch.cat(outs)
    k, layer = found
    b = x.shape[0]
    h = model[:k](x) if k else x
    if h.shape[0] != b:
        raise ValueError(f"the modules before the first Bayesian layer changed the batch size from {b} to "
                         f"{h.shape[0]}: the model must keep the batch in dimension 0")
    h = layer._forward_shared(h, num_samples, samples_per_pass)
    rest = model[k + 1:]
    outs, start = [], 0
    for c in _pass_sizes(num_samples, _max_sample_bytes(rest), x.device, samples_per_pass):
        with _folded(rest, c):
            outs.append(_unfold(rest(h[start * b:(start + c) * b]), c, b))
        start += c
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def check_finite(*modules: torch.nn.Module, loss: Optional[torch.Tensor] = None) -> bool:
    """Raise ``FloatingPointError`` naming the parameters of ``modules`` that hold a NaN or an
    infinity, with one device synchronisation for all of them.  With ``loss`` (a tensor) its
    finiteness is read in the same synchronisation and returned (True: finite); the caller
    decides what a non-finite loss means."""
    params = [(n, p) for m in modules for n, p in m.named_parameters()]
    flags = [torch.isfinite(p).all() for _, p in params]
    if loss is not None:
        flags.append(torch.isfinite(loss).all())
    if not flags:
        return True
    flags = torch.stack([f.to(flags[0].device) for f in flags])
    if bool(flags.all()):
        return True
    ok = flags.tolist()
    bad = [n for (n, _), good in zip(params, ok) if not good]
    if not bad:
        return False
    raise FloatingPointError(f"non-finite values in parameter(s) {', '.join(bad)} (after the last optimizer step?): "
                             "lower the learning rate, check the data, or clip gradients")
