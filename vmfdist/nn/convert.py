r"""Converting plain networks to Bayesian ones and back.

``to_bayesian(model, kind="meanfield" | "radial" | "rdp")`` replaces ``nn.Linear`` and
``nn.Conv2d`` modules (found recursively by ``isinstance``) by the corresponding Bayesian
layers with the same ``in/out`` sizes, kernel size, stride, padding, dilation, groups and
bias.  With ``init="from_weights"`` the posterior is centred on the trained weights (MOPED,
Krishnan et al. 2020): :math:`\mu = w`, :math:`\sigma = \delta|w|` (floored at
``sigma_min``); in ``mean`` mode the converted model computes what the original did.
"""
from __future__ import annotations

import copy
import fnmatch
import math
import warnings
from typing import Optional, Sequence

import torch
from torch import nn

from ._base import BayesianModule
from .meanfield import MeanFieldConv2d, MeanFieldLinear
from .radial import RadialConv2d, RadialLinear
from .rdp import RDPConv2d, RDPLinear

__all__ = ["to_bayesian", "to_deterministic"]

_KINDS = {
    "meanfield": (MeanFieldLinear, MeanFieldConv2d),
    "radial": (RadialLinear, RadialConv2d),
    "rdp": (RDPLinear, RDPConv2d),
}


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def to_bayesian(model: torch.nn.Module, kind: str = "meanfield", *, include: Optional[Sequence[str]] = None,
                exclude: Sequence[str] = (), last_layer_only: bool = False, init: str = "default",
                delta: float = 0.1, sigma_min: float = 1e-6, inplace: bool = False, **layer_options) -> torch.nn.Module:
    """Replace ``nn.Linear`` / ``nn.Conv2d`` modules by Bayesian layers.

    Args:
        model: the network (copied unless ``inplace=True``).
        kind: ``"meanfield"``, ``"radial"`` or ``"rdp"``.
        include: qualified module names (``fnmatch`` patterns, as in ``model.named_modules()``)
            to convert; default all Linear/Conv2d.  A name that matches no module, or names a
            module that is not Linear/Conv2d, is an error.
        exclude: patterns of names to leave alone.
        last_layer_only: convert only the last eligible module (in ``named_modules`` order).
        init: ``"default"`` (fresh initialisation, only the shapes are copied) or
            ``"from_weights"`` (posterior mean = the trained weights, MOPED scales
            ``sigma = delta * |w|``).
        delta, sigma_min: MOPED scale factor and floor of ``sigma``.
        **layer_options: keyword options of the Bayesian layers (``prior=``, ``estimator=``,
            ``grouping=``, ...).
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {tuple(_KINDS)}, got {kind!r}")
    if init not in ("default", "from_weights"):
        raise ValueError(f"init must be 'default' or 'from_weights', got {init!r}")
    if not (delta > 0 and math.isfinite(delta)) or not (sigma_min > 0):
        raise ValueError(f"delta and sigma_min must be positive, got {delta!r}, {sigma_min!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    named = dict(model.named_modules())
    if include is not None:
        include = [include] if isinstance(include, str) else list(include)
        for pat in include:
            hits = [n for n in named if fnmatch.fnmatchcase(n, pat)]
            if not hits:
                raise ValueError(f"include: no module named {pat!r} in the model")
            if not any(isinstance(named[n], (nn.Linear, nn.Conv2d)) for n in hits):
                raise ValueError(f"include: module {hits[0]!r} is a {type(named[hits[0]]).__name__}; only nn.Linear "
                                 "and nn.Conv2d can be converted (use a pattern such as 'features.*' for a container)")
    exclude = [exclude] if isinstance(exclude, str) else list(exclude)
    targets = [n for n, m in named.items() if type(m) in (nn.Linear, nn.Conv2d) and n
               and (include is None or _matches(n, include)) and not _matches(n, exclude)]
    if isinstance(model, (nn.Linear, nn.Conv2d)):
        raise ValueError("model: pass a container module; a bare nn.Linear/nn.Conv2d cannot be replaced in place")
    if include is None:
        _warn_unconverted(named, targets, exclude)
    if last_layer_only:
        targets = targets[-1:]
    lin_cls, conv_cls = _KINDS[kind]
    for name in targets:
        old = named[name]
        p = old.weight
        fk = {"device": p.device, "dtype": p.dtype}
        if isinstance(old, nn.Linear):
            new = lin_cls(old.in_features, old.out_features, bias=old.bias is not None, **fk, **layer_options)
        else:
            if old.padding_mode != "zeros":
                raise ValueError(f"module {name!r}: padding_mode={old.padding_mode!r} is not supported")
            new = conv_cls(old.in_channels, old.out_channels, old.kernel_size, stride=old.stride,
                           padding=old.padding, dilation=old.dilation, groups=old.groups,
                           bias=old.bias is not None, **fk, **layer_options)
        if init == "from_weights":
            _init_from(new, old, delta, sigma_min)
        new.train(old.training)
        parent_name, _, child = name.rpartition(".")
        parent = named[parent_name] if parent_name else model
        setattr(parent, child, new)
    return model


#: weight-bearing layers that to_bayesian leaves alone without being asked to: it says so
_NOT_CONVERTED = (nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.RNNBase,
                  nn.RNNCellBase, nn.Embedding, nn.EmbeddingBag, nn.Bilinear, nn.MultiheadAttention)


def _warn_unconverted(named, targets, exclude) -> None:
    """A warning naming the layers with weights that stay deterministic (Conv1d, LSTM, subclasses
    of nn.Linear, ...), and one when nothing at all is converted: both used to pass silently."""
    converted = set(targets)
    # an attention block's own projections are part of it (named once, as the block)
    inside_attention = {f"{t}.{c}" if t else c for t, m in named.items() if isinstance(m, nn.MultiheadAttention)
                        for c, _ in m.named_modules() if c}
    left = [f"{n or 'the model'!r} ({type(m).__name__})" for n, m in named.items()
            if n not in inside_attention and not _matches(n, exclude) and not isinstance(m, BayesianModule)
            and (isinstance(m, _NOT_CONVERTED) or (n and isinstance(m, (nn.Linear, nn.Conv2d)) and n not in converted))]
    if left:
        warnings.warn(f"to_bayesian: {len(left)} layer(s) with weights stay deterministic, since only nn.Linear and "
                      f"nn.Conv2d (exactly those types) are converted: {', '.join(left[:8])}"
                      f"{', ...' if len(left) > 8 else ''}", UserWarning, stacklevel=3)
    elif not targets:
        warnings.warn("to_bayesian: the model has no nn.Linear or nn.Conv2d to convert; it is returned unchanged",
                      UserWarning, stacklevel=3)


@torch.no_grad()
def _init_from(new: BayesianModule, old: torch.nn.Module, delta: float, sigma_min: float):
    w = old.weight.detach()
    b = None if old.bias is None else old.bias.detach()
    if isinstance(new, (RDPLinear, RDPConv2d)):
        new.init_from_weights(w, b)
        return
    new.weight_mu.copy_(w)
    new.weight_rho.copy_(_rho(delta * w.abs(), sigma_min))
    if b is not None:
        new.bias_mu.copy_(b)
        new.bias_rho.copy_(_rho(delta * b.abs(), sigma_min))


def _rho(sigma, sigma_min):
    s = sigma.clamp_min(sigma_min)
    return s + torch.log(-torch.expm1(-s))  # softplus^-1


def to_deterministic(model: torch.nn.Module, use: str = "mean", inplace: bool = False) -> torch.nn.Module:
    """Replace every Bayesian layer by a plain ``nn.Linear`` / ``nn.Conv2d`` holding its
    posterior mean (``use="mean"``) or mode (``"mode"``)."""
    if use not in ("mean", "mode"):
        raise ValueError(f"use must be 'mean' or 'mode', got {use!r}")
    if not inplace:
        model = copy.deepcopy(model)
    if isinstance(model, BayesianModule):
        return _plain(model, use)
    named = dict(model.named_modules())
    for name, m in list(named.items()):
        if isinstance(m, BayesianModule) and name:
            parent_name, _, child = name.rpartition(".")
            parent = named[parent_name] if parent_name else model
            setattr(parent, child, _plain(m, use))
    return model


@torch.no_grad()
def _plain(m: BayesianModule, use: str) -> torch.nn.Module:
    w, b = m.point_weights(use)
    fk = {"device": w.device, "dtype": w.dtype}
    if hasattr(m, "in_features"):
        new = nn.Linear(m.in_features, m.out_features, bias=b is not None, **fk)
    else:
        new = nn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride, padding=m.padding,
                        dilation=m.dilation, groups=m.groups, bias=b is not None, **fk)
    new.weight.copy_(w.detach())
    if b is not None:
        new.bias.copy_(b.detach())
    new.train(m.training)
    return new

