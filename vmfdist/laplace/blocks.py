"""The blocks of a Kronecker-factored Laplace posterior: which parameters it covers, how
they sit in the parameter vector, and how it sees a layer's input and output during a
forward pass.

The Laplace classes cover every parameter that requires a gradient.  Each such parameter
must belong to a supported layer (``torch.nn.Linear`` or an ungrouped, zero-padded
``torch.nn.Conv2d``); anything else is refused by name.  Freeze a parameter
(``requires_grad_(False)``) to leave it out of the posterior: it then stays at its trained
value, as in laplace-torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..curvature import (TRANSPOSED_CONVS, KFACCollector, KroneckerFactor, batch_nll, batch_rows, check_layer, output_grads, per_example_second_moments,
                         require_finite)

SUPPORTED = (nn.Linear, nn.Conv2d)
#: laplace-torch's ``subset_of_weights``: every trainable layer, the last one, or chosen layers
SUBSETS = ("all", "last_layer", "subnetwork")
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
    # filled by fit(): the block's Kronecker factor -- G summed over the data, A averaged over it
    # (N E[gg^T] (x) E[aa^T]) --, its eigenbases and, for EK-FAC, the second moments in that basis
    # (summed over the data)
    factor: Optional[KroneckerFactor] = None

    @property
    def numel(self) -> int:
        return self.out_dim * self.in_dim


def check_module(name: str, module: nn.Module, owner: str) -> None:
    """Supported layers pass (curvature's ``check_layer`` refuses
    grouped, transposed and non-zero-padded convolutions by name); any other module with
    trainable parameters is an error naming it."""
    if isinstance(module, SUPPORTED) or isinstance(module, TRANSPOSED_CONVS):
        try:
            check_layer(name, module)
        except ValueError as e:
            raise ValueError(f"{owner}: {e}") from None
        return
    kind = type(module).__module__ + "." + type(module).__name__
    raise ValueError(f"{owner}: layer '{name}' ({kind}) has trainable parameters but is not a supported "
                     f"layer. Supported layers: {SUPPORTED_NAMES}. Freeze its parameters with "
                     f"requires_grad_(False) to leave them out of the Laplace approximation.")


def find_blocks(model: nn.Module, separate_weight_and_bias: bool, owner: str, modules=None) -> List[Block]:
    """The blocks of the posterior, in the order of ``model.parameters()`` (the order of
    laplace-torch's parameter vector and per-layer prior precisions).  With ``modules`` (layers
    or their names), only those layers' trainable parameters are covered; the model's other
    parameters are held at their values."""
    named = dict(model.named_modules())
    chosen = None
    if modules is not None:
        by_id = {id(m): n for n, m in named.items()}
        chosen = set()
        for item in modules:
            if isinstance(item, str):
                if item not in named:
                    raise ValueError(f"{owner}: modules: {item!r} is not a submodule of the model")
                item = named[item]
            if not isinstance(item, nn.Module) or id(item) not in by_id:
                raise ValueError(f"{owner}: modules must hold submodules of the model or their names, got "
                                 f"{type(item).__name__}")
            check_module(by_id[id(item)] or "<model>", item, owner)
            chosen.add(id(item))
        if not chosen:
            raise ValueError(f"{owner}: modules is empty")
    owner_of: Dict[int, tuple] = {}
    for mname, mod in model.named_modules():
        if chosen is not None and id(mod) not in chosen:
            continue
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
        if not p.requires_grad or id(p) not in owner_of:
            continue
        mname, mod, pname = owner_of[id(p)]
        check_module(mname or "<model>", mod, owner)
        if p.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"{owner}: parameter '{mname}.{pname}' has dtype {p.dtype}; the Kronecker factors and their "
                             "eigenbases need float32 or float64 (fit the approximation on model.float())")
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


def _trainable_leaves(model: nn.Module):
    """``(name, module)`` of the leaf modules that own a parameter requiring a gradient."""
    for name, mod in model.named_modules():
        if not any(True for _ in mod.children()) and any(p.requires_grad for p in mod.parameters(recurse=False)):
            yield name, mod


def last_registered_layer(model: nn.Module, owner: str) -> str:
    """The name of the last leaf module with trainable parameters in registration order: the
    last layer before a forward pass has shown the order of execution."""
    names = [n for n, _ in _trainable_leaves(model)]
    if not names:
        raise ValueError(f"{owner}: the model has no parameters that require a gradient")
    return names[-1]


def last_executed_layer(model: nn.Module, X, owner: str) -> str:
    """laplace-torch's last layer: the last leaf module (here: with trainable parameters) that a
    forward pass on ``X`` runs."""
    leaves = dict(_trainable_leaves(model))
    order: List[str] = []
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: order.append(n)) for n, m in leaves.items()]
    try:
        with torch.no_grad():
            model(X)
    finally:
        for h in handles:
            h.remove()
    if not order:
        raise ValueError(f"{owner}: no layer with trainable parameters ran in the forward pass, so there is no last "
                         f"layer; give last_layer_name=...")
    return order[-1]


# ---------------------------------------------------------------------------------------------
# fitting under torch.distributed: every rank passes its shard of the data
def ranks(distributed: bool, owner: str) -> int:
    """The number of ranks to reduce over: 1 unless ``distributed``, which needs an initialised
    ``torch.distributed`` process group."""
    if not distributed:
        return 1
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{owner}.fit: distributed=True needs an initialised torch.distributed process group "
                         f"(torch.distributed.init_process_group); without one, fit on all the data in one process")
    return dist.get_world_size()


def all_sum(value, world: int):
    """``value`` (a tensor or a number) summed over the ranks (itself when ``world`` is 1)."""
    if world == 1:
        return value
    if isinstance(value, torch.Tensor):
        t = value.detach().clone().contiguous()
        dist.all_reduce(t)
        return t
    t = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
    dist.all_reduce(t)
    return t.item()


def broadcast(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Rank 0's ``t`` on every rank."""
    if t is None:
        return None
    t = t.contiguous()
    dist.broadcast(t, 0)
    return t


def block_inputs(b: Block, a_full: torch.Tensor) -> torch.Tensor:
    """The block's input columns ``(B, L, in_blk)`` from the layer's patches with the
    appended 1 (curvature's :func:`~vmfdist.curvature.input_patches`): the layer input, the
    1 (bias), or both (joint)."""
    has_bias = b.module.bias is not None
    if b.kind == "weight":
        return a_full[..., :-1] if has_bias else a_full
    if b.kind == "bias":
        return a_full[..., -1:]
    return a_full


def batched_output_grads(module: nn.Module, g: torch.Tensor) -> torch.Tensor:
    """``(C, batch, *out_shape)`` output gradients as ``(C, batch, locations, out)``."""
    C, B = g.shape[:2]
    r = output_grads(module, g.reshape((C * B,) + tuple(g.shape[2:])))
    return r.reshape(C, B, r.shape[1], r.shape[2])


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
        self.handed_on: List[torch.Tensor] = []  # the copies passed on, in call order
        self._handles = []

    def _hook(self, module, inputs, output):
        if len(inputs) != 1:
            raise ValueError(f"layer {type(module).__name__} was called with {len(inputs)} positional inputs; "
                             f"one is supported")
        self.inputs.setdefault(id(module), []).append(inputs[0])
        self.outputs.setdefault(id(module), []).append(output)
        copy = output.clone()
        self.handed_on.append(copy)
        return copy

    def __enter__(self):
        self.inputs.clear()
        self.outputs.clear()
        self.handed_on.clear()
        self._handles = [m.register_forward_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False


class ParameterLayout:
    """Where each block's parameters sit in the flat parameter vector (``model.parameters()``
    order, as laplace-torch), and the moves between that vector and the blocks' ``(out, in)``
    matrices."""

    def __init__(self, params: List[nn.Parameter]):
        self.offsets: Dict[int, int] = {}
        off = 0
        for p in params:
            self.offsets[id(p)] = off
            off += p.numel()
        self.numel = off

    def part(self, p: nn.Parameter, vec: torch.Tensor) -> torch.Tensor:
        """``vec[..., slice of p]``."""
        o = self.offsets[id(p)]
        return vec[..., o:o + p.numel()]

    def block_matrix(self, b: Block, vec: torch.Tensor) -> torch.Tensor:
        """``vec[..., n_params]`` -> the block's ``(..., out, in_blk)`` matrices (a joint block's last
        column is the bias)."""
        parts = [self.part(p, vec) for p in b.params]
        lead = vec.shape[:-1]
        if b.kind == "joint":
            return torch.cat([parts[0].reshape(lead + (b.out_dim, -1)), parts[1].reshape(lead + (b.out_dim, 1))], -1)
        return parts[0].reshape(lead + (b.out_dim, b.in_dim))

    def scatter(self, b: Block, mat: torch.Tensor, vec: torch.Tensor) -> None:
        """Write the block's ``(..., out, in_blk)`` matrices into ``vec[..., n_params]``."""
        lead = mat.shape[:-2]
        if b.kind == "joint":
            w, bias = b.params
            self.part(w, vec)[...] = mat[..., :-1].reshape(lead + (-1,))
            self.part(bias, vec)[...] = mat[..., -1]
        else:
            self.part(b.params[0], vec)[...] = mat.reshape(lead + (-1,))

    def block_square_sum(self, b: Block, vec: torch.Tensor) -> torch.Tensor:
        """The sum of squares of the block's entries of ``vec``."""
        return sum(self.part(p, vec).square().sum() for p in b.params)


# ---- factors computed elsewhere (from_curvature, from_optimizer) -------------------------------------------------
def _field(f, *names):
    """The first of ``names`` that ``f`` (a dict or an object) holds, or ``None``."""
    for n in names:
        v = f.get(n) if isinstance(f, dict) else getattr(f, n, None)
        if v is not None:
            return v
    return None


def given_layer_factor(name: str, f, module: nn.Module, dtype: torch.dtype) -> KroneckerFactor:
    """A layer's ``A`` and ``G`` from ``f`` (a :class:`~vmfdist.curvature.KroneckerFactor`, an object or a
    dict with ``A`` and ``G`` in curvature's joint layout), checked against the layer and for
    finiteness, detached, in ``dtype``."""
    A, G = _field(f, "A"), _field(f, "G")
    if A is None or G is None:
        raise ValueError(f"curvature[{name!r}] has no A or G factor")
    n_in = module.weight[0].numel() + (module.bias is not None)
    if tuple(A.shape) != (n_in, n_in) or tuple(G.shape) != (module.weight.shape[0],) * 2:
        raise ValueError(f"curvature[{name!r}]: A must be {n_in} x {n_in} (inputs with an appended 1 for the bias) "
                         f"and G {module.weight.shape[0]} square, got {tuple(A.shape)} and {tuple(G.shape)}")
    require_finite(name, "input factor A", A)
    require_finite(name, "gradient factor G", G)
    return KroneckerFactor(A.detach().to(dtype), G.detach().to(dtype))


def given_block_moments(b: Block, f, dtype: torch.dtype):
    """``(q_g, q_a, moments)`` of a joint block from ``f`` (EK-FAC second ``moments``, also read as
    ``eigenvalues`` or ``S``, in the basis ``q_g``, ``q_a``), detached, in ``dtype``."""
    S, q_a, q_g = _field(f, "moments", "eigenvalues", "S"), _field(f, "q_a"), _field(f, "q_g")
    if S is None or q_a is None or q_g is None:
        raise ValueError(f"EKFACLaplace.from_curvature: curvature[{b.module_name!r}] needs the EK-FAC second moments "
                         f"(moments) and the bases q_a, q_g")
    if b.kind == "bias" or (b.kind == "weight" and b.module.bias is not None):
        raise ValueError("EKFACLaplace.from_curvature needs separate_weight_and_bias=False: the second moments are "
                         "given in the joint weight-and-bias eigenbasis")
    return q_g.detach().to(dtype), q_a.detach().to(dtype), S.detach().to(dtype)


def unpack_batch(batch, what: str):
    """``(inputs, targets)`` from one batch of the loader ``what``, or a ``ValueError`` naming it."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(f"{what} must yield (inputs, targets) pairs, got a batch of type {type(batch).__name__}"
                     + (f" with {len(batch)} entries" if isinstance(batch, (tuple, list)) else ""))


def collect_block_moments(model: nn.Module, blocks: List[Block], factors: List[KroneckerFactor],
                          layers: Dict[str, nn.Module], batches, likelihood: str, fisher_type: str, mc_samples: int,
                          generator: Optional[torch.Generator]):
    r"""The EK-FAC pass of the Laplace: :math:`s = \sum_n\sum_c (Q_G^T\,\nabla_W\ell_{n,c}\,Q_A)^{\odot 2}`
    per block, in each block's own eigenbasis, into ``factors[i].moments`` (curvature's collector over
    ``batches`` of ``(X, y)``); with identity bases, the exact diagonal of the GGN.  Returns
    ``(examples seen, summed negative log-likelihood (sigma 1), number of outputs)``."""
    for b, f in zip(blocks, factors):
        p0 = b.params[0]
        f.moments = torch.zeros(b.out_dim, b.in_dim, dtype=p0.dtype, device=p0.device)
    params = [p for b in blocks for p in b.params]
    by_name = {}
    for b, f in zip(blocks, factors):
        by_name.setdefault(b.module_name, []).append((b, f))
    seen, loss, outputs = 0, 0.0, 0
    with KFACCollector(layers) as collector, torch.enable_grad():
        for X, y in batches:
            if batch_rows(X, y) == 0:
                continue
            out, stats = collector.collect(model, X, y, likelihood, fisher_type, params, mc_samples=mc_samples,
                                           generator=generator)
            with torch.no_grad():
                loss = loss + batch_nll(out.detach(), y, likelihood)
            seen, outputs = seen + out.shape[0], out.shape[1]
            for name, (a_full, gs) in stats.items():
                for b, f in by_name[name]:
                    a = block_inputs(b, a_full)
                    f.moments += sum(per_example_second_moments(a, g, f.q_a, f.q_g) for g in gs)
    for b, f in zip(blocks, factors):
        require_finite(b.name, "EK-FAC second moments", f.moments)
    return seen, loss, outputs
