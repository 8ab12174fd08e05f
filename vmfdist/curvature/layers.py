r"""Which layers carry Kronecker factors, and how their inputs and output gradients are
laid out.

Every supported layer is seen as one matrix product per example and spatial location:
``z[n, t] = W_full @ a[n, t]`` with ``W_full = [W | b]`` of shape ``(out, in + 1)`` (the
bias as the last column, multiplying an appended 1) and

* ``nn.Linear``: ``a[n, t]`` is the input row, ``t`` runs over any extra leading
  dimensions (a single location for 2-d input);
* ``nn.Conv2d``: ``a[n, t]`` is the flattened input patch at output location ``t``
  (``F.unfold`` order: channel, kernel row, kernel column, which is the order of
  ``weight.reshape(out, -1)``).

Supported: ``nn.Linear`` and ``nn.Conv2d`` with ``groups == 1`` and ``padding_mode ==
"zeros"``.  Transposed and grouped convolutions are refused by name.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SUPPORTED_LAYERS", "TRANSPOSED_CONVS", "find_layers", "check_layer", "input_patches", "output_grads",
           "weight_matrix", "set_weight_matrix", "layer_shape"]

#: The layer types that have Kronecker factors.
SUPPORTED_LAYERS: Tuple[type, ...] = (nn.Linear, nn.Conv2d)
#: Transposed convolutions (refused by name; the lazy variants subclass these)
TRANSPOSED_CONVS: Tuple[type, ...] = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_SUPPORTED_NAMES = "nn.Linear, nn.Conv2d (groups=1, padding_mode='zeros')"


def check_layer(name: str, module: torch.nn.Module) -> None:
    """Raise a ``ValueError`` naming ``name`` when ``module`` cannot carry Kronecker factors."""
    if isinstance(module, TRANSPOSED_CONVS):
        raise ValueError(f"layer {name!r} is a transposed convolution ({type(module).__name__}), which is not "
                         f"supported; supported layers: {_SUPPORTED_NAMES}")
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            raise ValueError(f"layer {name!r} is a grouped convolution (groups={module.groups}), which is not "
                             f"supported; supported layers: {_SUPPORTED_NAMES}")
        if module.padding_mode != "zeros":
            raise ValueError(f"layer {name!r} uses padding_mode={module.padding_mode!r}, which is not supported; "
                             f"supported layers: {_SUPPORTED_NAMES}")
        return
    if isinstance(module, nn.Linear):
        return
    raise ValueError(f"layer {name!r} of type {type(module).__name__} is not supported; supported layers: "
                     f"{_SUPPORTED_NAMES}")


def find_layers(model: torch.nn.Module, modules: Optional[Iterable] = None, allow_other_parameters: bool = False
                ) -> Dict[str, torch.nn.Module]:
    """The layers of ``model`` that get Kronecker factors, as an ordered ``{name: module}``.

    Args:
        model: an ordinary ``nn.Module``.
        modules: ``None`` (every ``nn.Linear`` / ``nn.Conv2d`` in ``model``), or an iterable
            of submodules or their qualified names; each must be supported.
        allow_other_parameters: when ``False`` (the default), a module outside the selection
            that holds trainable parameters of its own (e.g. a ``BatchNorm2d``, an
            ``nn.Conv1d``) is an error naming it, because its curvature would silently be
            missing; when ``True`` such parameters are the caller's business (the optimizers
            give them Adam or SGD).

    Transposed and grouped convolutions are always an error naming the layer.
    """
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError("model is a DistributedDataParallel wrapper; pass model.module (vmfdist.curvature and "
                        "vmfdist.optim do their own averaging across ranks)")
    named = dict(model.named_modules())
    by_id = {id(m): n for n, m in named.items()}
    if modules is None:
        chosen = {}
        for n, m in named.items():
            if isinstance(m, TRANSPOSED_CONVS) or (isinstance(m, nn.Conv2d) and m.groups != 1):
                check_layer(n or "<model>", m)  # raises with the name
            if isinstance(m, SUPPORTED_LAYERS):
                check_layer(n or "<model>", m)
                chosen[n] = m
    else:
        chosen = {}
        for item in modules:
            if isinstance(item, str):
                if item not in named:
                    raise ValueError(f"modules: {item!r} is not a submodule of model")
                n, m = item, named[item]
            elif isinstance(item, nn.Module):
                if id(item) not in by_id:
                    raise ValueError(f"modules: {type(item).__name__} object is not a submodule of model")
                n, m = by_id[id(item)], item
            else:
                raise TypeError(f"modules must hold nn.Module objects or their names, got {type(item).__name__}")
            check_layer(n or "<model>", m)
            chosen[n] = m
    if not allow_other_parameters:
        for n, m in named.items():
            if n in chosen:
                continue
            own = [p for p in m.parameters(recurse=False) if p.requires_grad]
            if own:
                raise ValueError(f"module {n or '<model>'!r} of type {type(m).__name__} has trainable parameters but "
                                 f"no Kronecker factors; supported layers: {_SUPPORTED_NAMES} (select layers with "
                                 f"modules=..., or freeze these parameters)")
    if not chosen:
        raise ValueError(f"model has no supported layers; supported layers: {_SUPPORTED_NAMES}")
    return chosen


def layer_shape(module: torch.nn.Module) -> Tuple[int, int]:
    """``(out, in + has_bias)``: the shape of the layer's weight matrix with the bias column."""
    w = module.weight
    return w.shape[0], w[0].numel() + (module.bias is not None)


def _conv_padding(module: nn.Conv2d):
    pad = module.padding
    if isinstance(pad, str):
        if pad == "valid":
            return (0, 0)
        # 'same' (stride 1): total padding d*(k-1) per dimension, split evenly
        out = []
        for k, d in zip(module.kernel_size, module.dilation):
            total = d * (k - 1)
            if total % 2:
                raise ValueError(f"Conv2d with padding='same' and an even effective kernel size "
                                 f"(kernel_size={module.kernel_size}, dilation={module.dilation}) pads unequally, "
                                 "which is not supported")
            out.append(total // 2)
        return tuple(out)
    return pad


def input_patches(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer inputs as ``(batch, locations, in + has_bias)`` (ones appended for the bias)."""
    if isinstance(module, nn.Conv2d):
        if x.dim() == 3:
            x = x.unsqueeze(0)
        a = F.unfold(x, module.kernel_size, dilation=module.dilation, padding=_conv_padding(module),
                     stride=module.stride).transpose(1, 2)
    else:
        a = x.reshape(x.shape[0], -1, x.shape[-1])
    if module.bias is not None:
        a = F.pad(a, (0, 1), value=1.0)  # the appended 1, in one op
    return a


def output_grads(module: torch.nn.Module, g: torch.Tensor) -> torch.Tensor:
    """Gradients with respect to the layer output as ``(batch, locations, out)``."""
    if isinstance(module, nn.Conv2d):
        if g.dim() == 3:
            g = g.unsqueeze(0)
        return g.flatten(2).transpose(1, 2)
    return g.reshape(g.shape[0], -1, g.shape[-1])


def weight_matrix(module: torch.nn.Module) -> torch.Tensor:
    """``[W | b]`` as an ``(out, in + has_bias)`` matrix (a new tensor)."""
    w = module.weight.detach().reshape(module.weight.shape[0], -1)
    if module.bias is not None:
        w = torch.cat([w, module.bias.detach().unsqueeze(1)], dim=1)
    return w


def set_weight_matrix(module: torch.nn.Module, mat: torch.Tensor) -> None:
    """Copy an ``(out, in + has_bias)`` matrix into the layer's weight (and bias), in place."""
    n_w = module.weight[0].numel()
    with torch.no_grad():
        module.weight.copy_(mat[:, :n_w].reshape(module.weight.shape))
        if module.bias is not None:
            module.bias.copy_(mat[:, n_w])


def grad_matrix(module: torch.nn.Module) -> torch.Tensor:
    """The layer's ``.grad`` as an ``(out, in + has_bias)`` matrix (zeros where missing)."""
    w = module.weight
    gw = w.grad if w.grad is not None else torch.zeros_like(w)
    g = gw.reshape(w.shape[0], -1)
    if module.bias is not None:
        gb = module.bias.grad if module.bias.grad is not None else torch.zeros_like(module.bias)
        g = torch.cat([g, gb.unsqueeze(1)], dim=1)
    return g
