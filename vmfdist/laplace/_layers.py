"""Which parameters a Kronecker-factored Laplace approximation covers, and how it sees a
layer's input and output during a forward pass.

The Laplace classes cover every parameter that requires a gradient.  Each such parameter
must belong to a supported layer (``torch.nn.Linear`` or an ungrouped, zero-padded
``torch.nn.Conv2d``); anything else is refused by name.  Freeze a parameter
(``requires_grad_(False)``) to leave it out of the posterior: it then stays at its trained
value, as in laplace-torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from torch import nn

SUPPORTED = (nn.Linear, nn.Conv2d)
SUPPORTED_NAMES = "torch.nn.Linear, torch.nn.Conv2d (groups=1, padding_mode='zeros')"


@dataclass
class Block:
    """One Kronecker-factored block of the posterior precision.

    ``kind`` is ``"weight"`` (the weight matrix of a layer, ``(out, in)`` with ``in`` the
    flattened fan-in), ``"bias"`` (a bias vector, seen as an ``(out, 1)`` matrix whose input
    factor is the number 1) or ``"joint"`` (weight and bias together, ``(out, in + 1)``, the
    bias as an appended input of 1).
    """

    name: str
    module: nn.Module
    module_name: str
    kind: str
    params: List[nn.Parameter]
    out_dim: int
    in_dim: int
    # filled by fit(): G (out x out, summed over the data), A (in x in, averaged over the data)
    G: Optional[torch.Tensor] = None
    A: Optional[torch.Tensor] = None
    # eigendecomposition of the factors and (EK-FAC) the second moments in that basis
    q_out: Optional[torch.Tensor] = None
    eig_out: Optional[torch.Tensor] = None
    q_in: Optional[torch.Tensor] = None
    eig_in: Optional[torch.Tensor] = None
    scales: Optional[torch.Tensor] = None
    extra: Dict = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return self.out_dim * self.in_dim

    def mean_matrix(self) -> torch.Tensor:
        """The trained parameters of the block as an ``(out, in)`` matrix."""
        if self.kind == "weight":
            return self.params[0].detach().reshape(self.out_dim, -1)
        if self.kind == "bias":
            return self.params[0].detach().reshape(self.out_dim, 1)
        w, b = self.params
        return torch.cat([w.detach().reshape(self.out_dim, -1), b.detach().reshape(self.out_dim, 1)], dim=1)


def check_module(name: str, module: nn.Module, owner: str) -> None:
    if isinstance(module, nn.Conv2d):
        if module.groups != 1:
            raise ValueError(f"{owner}: layer '{name}' is a grouped Conv2d (groups={module.groups}); grouped "
                             f"convolutions are not supported. Supported layers: {SUPPORTED_NAMES}")
        if module.padding_mode != "zeros":
            raise ValueError(f"{owner}: layer '{name}' is a Conv2d with padding_mode='{module.padding_mode}'; only "
                             f"padding_mode='zeros' is supported. Supported layers: {SUPPORTED_NAMES}")
        if isinstance(module.padding, str) and module.padding not in ("valid", "same"):
            raise ValueError(f"{owner}: layer '{name}' has unsupported padding {module.padding!r}")
        return
    if isinstance(module, nn.Linear):
        return
    kind = type(module).__module__ + "." + type(module).__name__
    hint = " (transposed convolutions are not supported)" if isinstance(module, nn.modules.conv._ConvTransposeNd) \
        else ""
    raise ValueError(f"{owner}: layer '{name}' ({kind}){hint} has trainable parameters but is not a supported "
                     f"layer. Supported layers: {SUPPORTED_NAMES}. Freeze its parameters with "
                     f"requires_grad_(False) to leave them out of the Laplace approximation.")


def find_blocks(model: nn.Module, separate_weight_and_bias: bool, owner: str) -> List[Block]:
    """The blocks of the posterior, in the order of ``model.parameters()`` (the order of
    laplace-torch's parameter vector and per-layer prior precisions)."""
    owner_of: Dict[int, tuple] = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            if id(p) in owner_of:
                raise ValueError(f"{owner}: parameter '{mname}.{pname}' is shared with "
                                 f"'{owner_of[id(p)][0] or '<model>'}.{owner_of[id(p)][2]}'; shared (tied) "
                                 f"parameters are not supported")
            owner_of[id(p)] = (mname, mod, pname)
    blocks: List[Block] = []
    seen_modules = set()
    for p in model.parameters():
        if not p.requires_grad:
            continue
        mname, mod, pname = owner_of[id(p)]
        check_module(mname or "<model>", mod, owner)
        out_dim = mod.weight.shape[0]
        in_dim = mod.weight[0].numel()
        if separate_weight_and_bias or pname == "bias" and not mod.weight.requires_grad \
                or pname == "weight" and (mod.bias is None or not mod.bias.requires_grad):
            if pname == "weight":
                blocks.append(Block(f"{mname}.weight" if mname else "weight", mod, mname, "weight", [p], out_dim,
                                    in_dim))
            else:
                blocks.append(Block(f"{mname}.bias" if mname else "bias", mod, mname, "bias", [p], out_dim, 1))
        else:
            if id(mod) in seen_modules:
                continue
            seen_modules.add(id(mod))
            blocks.append(Block(mname or "<model>", mod, mname, "joint", [mod.weight, mod.bias], out_dim, in_dim + 1))
    if not blocks:
        raise ValueError(f"{owner}: the model has no parameters that require a gradient")
    return blocks


# ---------------------------------------------------------------------------------------------
# inputs and outputs of the layers during one forward pass
def layer_inputs(module: nn.Module, x: torch.Tensor, kfac_approx: str = "expand") -> torch.Tensor:
    """The layer's input as ``(batch, locations, fan_in)``: a Linear layer's features (all
    leading dimensions after the batch are locations), a Conv2d layer's patches by unfold."""
    if isinstance(module, nn.Conv2d):
        if isinstance(module.padding, str):
            if module.padding == "valid":
                pad = 0
            else:  # 'same': torch pads symmetrically when the total is even, else extra on the right
                total = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
                if any(t % 2 for t in total):
                    x = nn.functional.pad(x, [total[1] // 2, total[1] - total[1] // 2,
                                              total[0] // 2, total[0] - total[0] // 2])
                    pad = 0
                else:
                    pad = tuple(t // 2 for t in total)
        else:
            pad = module.padding
        patches = nn.functional.unfold(x, module.kernel_size, dilation=module.dilation, padding=pad,
                                       stride=module.stride)  # (B, C*kh*kw, L)
        return patches.transpose(1, 2)
    return x.reshape(x.shape[0], -1, x.shape[-1])


def layer_output_grads(module: nn.Module, g: torch.Tensor) -> torch.Tensor:
    """Gradients with respect to the layer's output, ``(C, batch, *out_shape)`` with ``C``
    backpropagated columns, as ``(C, batch, locations, out)``."""
    if isinstance(module, nn.Conv2d):
        return g.flatten(-2).transpose(-1, -2)  # (C, B, C_out, L) -> (C, B, L, C_out)
    return g.reshape(g.shape[0], g.shape[1], -1, g.shape[-1])


class Capture:
    """Forward hooks that record each covered layer's input and output for one forward
    pass.  The recorded output is the tensor autograd differentiates against; the layer
    hands a copy on, so an in-place activation after it cannot modify the recorded one."""

    def __init__(self, modules: List[nn.Module]):
        self.modules = []
        for m in modules:
            if all(m is not k for k in self.modules):
                self.modules.append(m)
        self.inputs: Dict[int, List[torch.Tensor]] = {}
        self.outputs: Dict[int, List[torch.Tensor]] = {}
        self._handles = []

    def _hook(self, module, inputs, output):
        if len(inputs) != 1:
            raise ValueError(f"layer {type(module).__name__} was called with {len(inputs)} positional inputs; "
                             f"one is supported")
        self.inputs.setdefault(id(module), []).append(inputs[0].detach())
        self.outputs.setdefault(id(module), []).append(output)
        return output.clone()

    def __enter__(self):
        self.inputs.clear()
        self.outputs.clear()
        self._handles = [m.register_forward_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False
