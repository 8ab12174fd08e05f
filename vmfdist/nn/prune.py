r"""Structured pruning of RDP networks (Oh et al. 2019, §3.3 and §5.2), FLOP and parameter counts.

Statistic: the log of the mode of each group's local radius :math:`z_g = \sqrt{a_g b_g}`,
:math:`(m_a + m_b)/2 - (\sigma_a^2 + \sigma_b^2)/4` (:meth:`RDPLinear.log_modes`); the
global factor scales all groups of a layer alike and is left out, as in the paper.
After training these statistics are bimodal (paper, Fig. 7): groups in use sit orders of
magnitude above the pruned ones.  :func:`gap_threshold` splits the sorted values at the gap
with the largest between-class variance (Otsu's criterion) and puts the threshold in the
middle of that gap; it prunes nothing when the two classes' means are less than
``min_separation`` apart (no clear second mode).

:func:`compress` returns a plain ``nn.Sequential`` in which a hidden neuron (an output
channel or unit) is *removed* when its incoming group (its row in the layer that produces
it) and its outgoing group (its column in the next layer; for a convolution followed by
``Flatten``, all the columns its feature map feeds) are both pruned -- when a layer has
only one of the two groupings, that one decides (``rule="both"``, the default).  Pruned
groups that are not removed have their weights set to zero.  Inputs of the first layer and
outputs of the last are never removed.

``rule="either"`` is the authors' count (``nonzero_ratio_lenet5`` and the masked forward of
``compress_lenet_conv_double.py`` in github.com/ChangYong-Oh/RadiusDirectionPosteriors): a
neuron goes when its incoming group *or* its outgoing group is pruned, i.e. the removed
neurons are the union of the pruned rows and the pruned columns.  The function is then
that of the network whose pruned rows mask the layer's output (bias included) and whose
pruned columns mask its input; under ``"both"`` a kept neuron with a pruned row still
passes on its (activated) bias.  After a ``Flatten`` the unit is a feature (channel,
position): a feature goes when its channel's row or its own column is pruned, a channel
when all of its features go; the features that go from a kept channel are dropped by a
:class:`SelectFeatures` module placed right after the ``Flatten``, so that the next layer's
``in_features`` (and the FLOPs and parameters) count the kept features only -- the paper's
"110" in 4-7-110-66 is such a count (not a multiple of the 4x4 map).

FLOPs (paper §5.2): a convolution costs :math:`(K_w K_h C_{in}/g + 1)\,H_{out} W_{out}\, C_{out}`
(the paper writes :math:`H_{out} = I_h + P_h - K_h + 1` with :math:`P_h` the total padding,
which is this for stride 1 and dilation 1; the actual output size is used here, which also
covers strides, dilation and groups :math:`g`), a fully-connected layer
:math:`(I_{in} + 1) I_{out}`.
"""
from __future__ import annotations

import collections.abc
import copy
import math
import numbers
from typing import Dict, Sequence, Union

import torch
from torch import nn

from ._base import BayesianModule
from .convert import to_deterministic
from .model import bayesian_modules, deterministic
from .rdp import _RDP

__all__ = ["log_modes", "gap_threshold", "compress", "count_flops", "count_parameters", "architecture",
           "SelectFeatures"]


def log_modes(model: torch.nn.Module) -> Dict[str, Dict[str, torch.Tensor]]:
    """``{layer name: {"row": log-modes, "column": log-modes}}`` for every RDP layer."""
    return {name: m.log_modes() for name, m in bayesian_modules(model) if isinstance(m, _RDP)}


def gap_threshold(values: torch.Tensor, min_separation: float = 2.0) -> float:
    """The threshold between the two modes of a bimodal set of log-modes: the sorted values are
    split where the between-class variance is largest (Otsu's criterion, evaluated exactly at
    every gap), and the threshold is the middle of that gap.  ``-inf`` (prune nothing) when the
    two classes' means are less than ``min_separation`` apart (no clear second mode) or there
    are fewer than two values."""
    if isinstance(min_separation, bool) or not isinstance(min_separation, numbers.Real) or not min_separation >= 0:
        raise ValueError(f"gap_threshold: min_separation must be a non-negative number, got {min_separation!r}")
    v = torch.as_tensor(values).detach().reshape(-1).to(torch.float64)
    v = v[torch.isfinite(v)]
    n = v.numel()
    if n < 2:
        return -math.inf
    s, _ = torch.sort(v)
    k = torch.arange(1, n, dtype=torch.float64)
    csum = torch.cumsum(s, 0)[:-1]
    m0 = csum / k
    m1 = (s.sum() - csum) / (n - k)
    between = k * (n - k) * (m1 - m0).pow(2)
    i = int(torch.argmax(between))
    if float(m1[i] - m0[i]) < min_separation:
        return -math.inf
    return float(0.5 * (s[i] + s[i + 1]))


def _flatten_modules(model: torch.nn.Module):
    if isinstance(model, nn.Sequential):
        out = []
        for m in model:
            out.extend(_flatten_modules(m))
        return out
    return [model]


_WEIGHTED = (nn.Linear, nn.Conv2d)


def _is_weighted(m):
    return isinstance(m, _WEIGHTED) or isinstance(m, BayesianModule)


def _is_conv(m):
    return isinstance(m, nn.Conv2d) or hasattr(m, "in_channels")


def _sizes(m):
    return (m.in_channels, m.out_channels) if _is_conv(m) else (m.in_features, m.out_features)


class SelectFeatures(nn.Module):
    """Keeps the features ``index`` of the last dimension (placed by ``compress(rule="either")``
    after a ``Flatten``); no parameters."""

    def __init__(self, index: torch.Tensor, in_features: int):
        super().__init__()
        self.in_features = int(in_features)
        self.register_buffer("index", torch.as_tensor(index, dtype=torch.long).reshape(-1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(-1, self.index)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.index.numel()}"


def _threshold_value(t, where: str) -> float:
    """A log-mode threshold as a float: a real number or a one-element tensor, not NaN
    (``-inf`` prunes nothing, ``+inf`` everything)."""
    if isinstance(t, bool) or not (isinstance(t, numbers.Real) or (isinstance(t, torch.Tensor) and t.numel() == 1
                                                                     and not t.is_complex())):
        raise TypeError(f"compress: {where} must be a real number, got {type(t).__name__}")
    v = float(t)
    if math.isnan(v):
        raise ValueError(f"compress: {where} is NaN (a log-mode threshold; -inf prunes nothing)")
    return v


def compress(model: torch.nn.Module, threshold: Union[None, float, Dict[str, float]] = None, use: str = "mean",
             min_separation: float = 2.0, rule: str = "both") -> torch.nn.Sequential:
    """A smaller plain ``nn.Sequential`` with the pruned neurons of an RDP model removed.

    Args:
        model: an ``nn.Sequential`` (possibly nested) of layers, activations, pooling,
            dropout, batch norm and ``Flatten``; its RDP layers decide the pruning, other
            Linear/Conv2d layers are kept whole.
        threshold: ``None`` (per layer and grouping, :func:`gap_threshold`), a float (one
            log-mode threshold for all), or a dict ``{"<layer name>.row": t, ...}`` (missing
            entries use the gap rule).  A NaN, a value that is not a real number or a key that
            names no RDP grouping of ``model`` is an error; ``-inf`` prunes nothing.
        use: the weights kept: posterior ``"mean"`` or ``"mode"``.
        min_separation: passed to :func:`gap_threshold`.
        rule: when a hidden neuron is removed: ``"both"`` (default) when its incoming and its
            outgoing groups are both pruned, ``"either"`` (the authors' count) when one of them
            is (module docstring).
    """
    if rule not in ("both", "either"):
        raise ValueError(f"compress: rule must be 'both' or 'either', got {rule!r}")
    if isinstance(threshold, dict):
        threshold = {k: _threshold_value(v, f"threshold[{k!r}]") for k, v in threshold.items()}
    elif threshold is not None:
        threshold = _threshold_value(threshold, "threshold")
    if not isinstance(model, nn.Sequential):
        raise TypeError("compress: model must be an nn.Sequential (the order of its layers defines which neurons "
                        f"connect), got {type(model).__name__}")
    names = {id(m): n for n, m in model.named_modules()}
    mods = _flatten_modules(model)
    weighted = [i for i, m in enumerate(mods) if _is_weighted(m)]
    if not weighted:
        raise ValueError("compress: the model has no Linear/Conv2d layers")
    # keep masks per weighted layer: rows (outputs) and columns (inputs)
    row_keep, col_keep, row_known, col_known = {}, {}, {}, {}
    groupings = []  # the "<layer name>.<side>" keys of the model's RDP groupings
    for i in weighted:
        m = mods[i]
        n_in, n_out = _sizes(m)
        row_keep[i] = torch.ones(n_out, dtype=torch.bool)
        col_keep[i] = torch.ones(n_in, dtype=torch.bool)
        row_known[i] = col_known[i] = False
        if isinstance(m, _RDP):
            for side, lm in m.log_modes().items():
                key = f"{names.get(id(m), '')}.{side}"
                groupings.append(key)
                if isinstance(threshold, dict):
                    t = threshold.get(key, gap_threshold(lm, min_separation))
                elif threshold is None:
                    t = gap_threshold(lm, min_separation)
                else:
                    t = threshold
                keep = (lm > t).cpu()
                if side == "row":
                    row_keep[i], row_known[i] = keep, True
                else:
                    col_keep[i], col_known[i] = keep, True
    if isinstance(threshold, dict) and set(threshold) - set(groupings):
        raise ValueError(f"compress: threshold names no grouping of the model: {sorted(set(threshold) - set(groupings))}"
                         f"; its RDP groupings are {groupings}")
    # plain copies with point weights
    with torch.no_grad():
        plain = [to_deterministic(copy.deepcopy(m), use) if isinstance(m, BayesianModule) else copy.deepcopy(m)
                 for m in mods]
    # neurons removed between consecutive weighted layers
    remove_out = {i: torch.zeros(_sizes(mods[i])[1], dtype=torch.bool) for i in weighted}
    remove_in = {i: torch.zeros(_sizes(mods[i])[0], dtype=torch.bool) for i in weighted}
    select = {}  # index of a Flatten -> the features kept after it (rule="either")
    for a, b in zip(weighted[:-1], weighted[1:]):
        ma, mb = mods[a], mods[b]
        n_out_a = _sizes(ma)[1]
        n_in_b = _sizes(mb)[0]
        if n_in_b % n_out_a:
            continue  # not a channel-to-feature connection we understand: keep everything
        per = n_in_b // n_out_a  # features of b fed by one neuron of a (H*W after Flatten)
        if (_is_conv(ma) and ma.groups != 1) or (_is_conv(mb) and mb.groups != 1):
            continue
        if per > 1 and not any(isinstance(mods[k], nn.Flatten) for k in range(a + 1, b)):
            continue
        if not (row_known[a] or col_known[b]):
            continue
        if rule == "either":
            gone, feat_gone = _either(row_keep[a] if row_known[a] else None, col_keep[b] if col_known[b] else None,
                                      n_out_a, per)
            if bool((feat_gone & ~gone.repeat_interleave(per)).any()):  # features of kept channels go
                flat = next(k for k in range(a + 1, b) if isinstance(mods[k], nn.Flatten))
                select[flat] = SelectFeatures(torch.nonzero(~feat_gone[~gone.repeat_interleave(per)]).reshape(-1),
                                              int((~gone).sum()) * per)
        else:
            out_pruned = ~row_keep[a] if row_known[a] else torch.ones(n_out_a, dtype=torch.bool)
            col_pruned_b = (~col_keep[b]).reshape(n_out_a, per).all(1) if col_known[b] else \
                torch.ones(n_out_a, dtype=torch.bool)
            gone = out_pruned & col_pruned_b
            if bool(gone.all()):  # keep one neuron so that the network stays connected
                gone[0] = False
            feat_gone = gone.repeat_interleave(per)
        remove_out[a] = gone
        remove_in[b] = feat_gone
        if bool(gone.any() or feat_gone.any()):  # per-feature layers between a and b lose the removed features too
            _slice_between(mods, plain, names, a, b, ~gone, ~remove_in[b])
    out = []
    for i, m in enumerate(plain):
        if i in remove_out:
            m = _slice_layer(m, mods[i], row_keep[i], col_keep[i], ~remove_out[i], ~remove_in[i])
        out.append(m)
        if i in select:
            out.append(select[i])
    return nn.Sequential(*out)


def _either(row_keep, col_keep, n_out: int, per: int):
    """``rule="either"`` between two layers: ``(neurons gone (n_out,), features gone (n_out * per,))``;
    a feature goes when its neuron's row or its own column is pruned (``None``: that grouping is
    absent, nothing pruned by it), a neuron when all of its ``per`` features go.  One feature (and
    its neuron) is kept when everything would go, so that the network stays connected."""
    feat = torch.zeros(n_out * per, dtype=torch.bool)
    if row_keep is not None:
        feat |= (~row_keep).repeat_interleave(per)
    if col_keep is not None:
        feat |= ~col_keep
    if bool(feat.all()):
        feat[0] = False
    return feat.reshape(n_out, per).all(1), feat


@torch.no_grad()
def _slice_layer(m, orig, row_keep, col_keep, out_keep, in_keep):
    w = m.weight.detach().clone()
    b = None if m.bias is None else m.bias.detach().clone()
    w[~row_keep] = 0.0
    if _is_conv(m):
        if m.groups == 1:
            w[:, ~col_keep] = 0.0
    else:
        w[:, ~col_keep] = 0.0
    w = w[out_keep][:, in_keep]
    if b is not None:
        b = b[out_keep]
    fk = {"device": w.device, "dtype": w.dtype}
    if _is_conv(m):
        new = nn.Conv2d(int(in_keep.sum()), int(out_keep.sum()), m.kernel_size, stride=m.stride, padding=m.padding,
                        dilation=m.dilation, groups=m.groups, bias=b is not None, **fk)
    else:
        new = nn.Linear(int(in_keep.sum()), int(out_keep.sum()), bias=b is not None, **fk)
    new.weight.copy_(w)
    if b is not None:
        new.bias.copy_(b)
    return new


_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
          nn.BatchNorm3d, nn.SyncBatchNorm, nn.RMSNorm)


def _slice_between(mods, plain, names, a, b, keep_out, keep_in) -> None:
    """Slice the batch norms between weighted layers ``a`` and ``b``: over ``a``'s output neurons
    (``keep_out``) before a ``Flatten``, over ``b``'s input features (``keep_in``) after it.  A
    normalisation over several features (LayerNorm, GroupNorm, ...) would change its statistics
    when features are removed, and a batch norm of another size cannot be matched: both are
    refused by name rather than left to crash at first use."""
    flat = False
    for k in range(a + 1, b):
        m, label = mods[k], names.get(id(mods[k]), str(k))
        if isinstance(m, nn.Flatten):
            flat = True
        elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            keep = keep_in if flat else keep_out
            if m.num_features != keep.numel():
                raise ValueError(f"compress: batch norm {label!r} has num_features={m.num_features}, which matches "
                                 f"neither the {keep_out.numel()} pruned neurons before it nor the {keep_in.numel()} "
                                 "features after a Flatten")
            plain[k] = _slice_bn(plain[k], keep)
        elif isinstance(m, _NORMS):
            raise ValueError(f"compress: {type(m).__name__} {label!r} normalises over several features, so removing "
                             "the pruned ones would change its statistics; only per-feature BatchNorm1d/2d layers can "
                             "sit between pruned layers")


@torch.no_grad()
def _slice_bn(bn, keep):
    ref = bn.weight if bn.affine else bn.running_mean
    kw = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
    new = type(bn)(int(keep.sum()), eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                   track_running_stats=bn.track_running_stats, **kw)
    if bn.affine:
        new.weight.copy_(bn.weight[keep])
        new.bias.copy_(bn.bias[keep])
    if bn.track_running_stats:
        new.running_mean.copy_(bn.running_mean[keep])
        new.running_var.copy_(bn.running_var[keep])
        new.num_batches_tracked.copy_(bn.num_batches_tracked)
    return new


def count_parameters(model: torch.nn.Module) -> int:
    """Number of weights and biases of the Linear/Conv2d layers (Bayesian layers count their
    weight tensor and bias, not their variational parameters)."""
    total = 0
    for m in model.modules():
        if isinstance(m, BayesianModule):
            w, b = m.point_weights("mean")
            total += w.numel() + (0 if b is None else b.numel())
        elif isinstance(m, _WEIGHTED):
            total += m.weight.numel() + (0 if m.bias is None else m.bias.numel())
    return total


@torch.no_grad()
def count_flops(model: torch.nn.Module, input_shape: Sequence[int]) -> int:
    """FLOPs of one forward pass of one example of shape ``input_shape`` (no batch
    dimension), with the paper's formulas (module docstring)."""
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, collections.abc.Sequence) or not all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in input_shape):
        raise ValueError(f"count_flops: input_shape must be a sequence of positive ints (one example's shape, "
                         f"no batch dimension), got {input_shape!r}")
    total = [0]

    def hook(m, inp, out):
        if _is_conv(m):
            kh, kw = m.kernel_size
            total[0] += (kh * kw * m.in_channels // m.groups + 1) * out.shape[-2] * out.shape[-1] * m.out_channels
        else:
            lead = out.numel() // out.shape[-1]  # 1 for (1, features)
            total[0] += (m.in_features + 1) * m.out_features * lead

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, _WEIGHTED) or isinstance(m, BayesianModule)]
    p = next(model.parameters(), None)
    x = torch.zeros((1,) + tuple(input_shape), dtype=None if p is None else p.dtype,
                    device=None if p is None else p.device)
    was = model.training
    model.eval()
    try:
        with deterministic(model, "mean"):
            model(x)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return int(total[0])


def architecture(model: torch.nn.Module) -> str:
    """Layer widths as in the paper's tables (LeNet-5: ``"20-50-800-500"``): output channels
    of each convolution, then the inputs of the first fully-connected layer and the outputs
    of each fully-connected layer but the last."""
    layers = [m for m in model.modules() if isinstance(m, _WEIGHTED) or isinstance(m, BayesianModule)]
    parts, seen_linear = [], False
    for k, m in enumerate(layers):
        if _is_conv(m):
            parts.append(m.out_channels)
        else:
            if not seen_linear:
                parts.append(m.in_features)
                seen_linear = True
            if k != len(layers) - 1:
                parts.append(m.out_features)
    return "-".join(str(p) for p in parts)
