r"""The one collection pass of K-FAC and EK-FAC statistics: hooks that record each layer's
input and output gradient, the output gradients whose outer products give the chosen
curvature, and the per-batch statistics every consumer builds on.

:func:`~vmfdist.curvature.compute_kfac` (both its passes), the EK-FAC pass of
``vmfdist.laplace`` and the noisy optimizers' statistics steps all record through a
:class:`KFACCollector`; conventions are those of :mod:`vmfdist.curvature.kfac`.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .._torch_internals import grad
from .layers import input_patches, output_grads

__all__ = ["FISHER_TYPES", "KFAC_APPROX", "LIKELIHOODS", "check_choice", "canonical_fisher_type", "resolve_loss",
           "check_targets", "check_output", "batch_rows", "batch_nll", "output_gradients", "KFACCollector", "input_factor", "gradient_factor",
           "factor_rows", "per_example_second_moments"]

#: ``fisher_type`` values (curvlinops' names; ``"ggn"`` and ``"type2"`` are aliases of ``"type-2"``)
FISHER_TYPES = ("mc", "empirical", "type-2", "ggn", "type2")
KFAC_APPROX = ("expand", "reduce")
LIKELIHOODS = ("classification", "regression")


def check_choice(name, value, choices):
    """``ValueError`` naming the argument ``name`` when ``value`` is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


def canonical_fisher_type(fisher_type: str) -> str:
    """``fisher_type`` checked, with its aliases (``"ggn"``, ``"type2"``) spelled ``"type-2"``."""
    check_choice("fisher_type", fisher_type, FISHER_TYPES)
    return "type-2" if fisher_type in ("ggn", "type2") else fisher_type


def resolve_loss(likelihood: Optional[str] = None, sigma_noise: float = 1.0, loss_func: Optional[torch.nn.Module] = None,
                 num_outputs: Optional[int] = None) -> Tuple[str, float, str]:
    """``(likelihood, sigma_noise, reduction)`` from either a likelihood name or a torch loss.

    ``loss_func`` may be ``nn.CrossEntropyLoss`` (reduction ``"mean"`` or ``"sum"``; no class
    weights, no label smoothing) or ``nn.MSELoss`` (:math:`(f-y)^2`, i.e. a Gaussian with
    :math:`\\sigma^2 = 1/2`; reduction ``"sum"``, or ``"mean"`` only for one output).  Anything
    that would mis-scale the Fisher is an error: ``reduction="none"``, a mean over the
    outputs as well as the batch (``MSELoss(reduction="mean")`` with several outputs), class
    weights or label smoothing.  The reduction only says how the caller's loss is scaled
    (``KFACResult.curvature_scale``); the factors are per data point either way.
    """
    if loss_func is None:
        if likelihood is None:
            raise ValueError("give likelihood ('classification' or 'regression') or loss_func")
        check_choice("likelihood", likelihood, LIKELIHOODS)
        if not (isinstance(sigma_noise, (int, float)) and math.isfinite(sigma_noise) and sigma_noise > 0):
            raise ValueError(f"sigma_noise must be a positive finite number, got {sigma_noise!r}")
        return likelihood, float(sigma_noise), "mean"
    red = getattr(loss_func, "reduction", None)
    if red not in ("mean", "sum"):
        raise ValueError(f"loss_func has reduction={red!r}; the Fisher scale needs reduction 'mean' or 'sum'")
    if isinstance(loss_func, nn.CrossEntropyLoss):
        if loss_func.weight is not None or loss_func.label_smoothing != 0.0:
            raise ValueError("loss_func: CrossEntropyLoss with class weights or label smoothing is not a "
                             "categorical log-likelihood; its Fisher would be mis-scaled")
        return "classification", 1.0, red
    if isinstance(loss_func, nn.MSELoss):
        if red == "mean" and num_outputs is not None and num_outputs != 1:
            raise ValueError(f"loss_func: MSELoss(reduction='mean') with {num_outputs} outputs averages over the "
                             "outputs as well as the batch, which would mis-scale the Fisher by 1/outputs; use "
                             "reduction='sum' or likelihood='regression'")
        return "regression", math.sqrt(0.5), red
    raise ValueError(f"loss_func must be nn.CrossEntropyLoss or nn.MSELoss, got {type(loss_func).__name__}")


def check_targets(output: torch.Tensor, target: torch.Tensor, likelihood: str) -> torch.Tensor:
    """``target`` checked against the model output ``(batch, k)``: class indices ``(batch,)`` for
    classification; for regression the output's shape (a ``(batch,)`` target is accepted for one
    output), in the output's dtype.  A mismatch raises ``ValueError`` naming both shapes."""
    if likelihood == "classification":
        if target.shape != output.shape[:1]:
            raise ValueError(f"classification targets must have shape (batch,) = {tuple(output.shape[:1])}, got "
                             f"{tuple(target.shape)}")
        if target.dtype.is_floating_point or target.is_complex() or target.dtype == torch.bool:
            raise ValueError(f"classification targets must be integer class indices, got dtype {target.dtype}")
        return target
    if target.dim() == 1 and output.shape[1] == 1:
        target = target.unsqueeze(1)
    if target.shape != output.shape:
        raise ValueError(f"regression targets must have the model output's shape {tuple(output.shape)}, got "
                         f"{tuple(target.shape)}")
    return target.to(output.dtype)


def output_gradients(output: torch.Tensor, target: Optional[torch.Tensor], likelihood: str, fisher_type: str,
                     sigma_noise: float = 1.0, mc_samples: int = 1,
                     generator: Optional[torch.Generator] = None) -> List[torch.Tensor]:
    r"""The gradients :math:`e` of the per-example losses in the network output whose outer
    products sum to the chosen curvature in the output: :math:`\sum_k e_k e_k^T` is, per
    example, :math:`\nabla\ell\nabla\ell^T` at a sampled label (``"mc"``, averaged over
    ``mc_samples`` via a :math:`1/\sqrt{\text{mc\_samples}}` weight), at the true label
    (``"empirical"``), or the Hessian of the loss in the output (``"type-2"``/``"ggn"``: the
    columns of its square root, :math:`\sqrt{p_c}(e_c - p)` for the categorical,
    :math:`e_c/\sigma` for the Gaussian).  A list of ``(batch, C)`` tensors.

    Labels for ``"mc"`` are drawn as curvlinops draws them (``multinomial`` on the softmax,
    ``randn`` of the output's shape), from ``generator``.
    """
    f = check_output(output).detach()
    if fisher_type in ("type-2", "ggn", "type2"):
        if likelihood == "classification":
            p = f.softmax(-1)
            sp = p.sqrt()
            eye = torch.eye(f.shape[1], dtype=f.dtype, device=f.device)
            return [sp[:, c:c + 1] * (eye[c] - p) for c in range(f.shape[1])]
        eye = torch.eye(f.shape[1], dtype=f.dtype, device=f.device)
        return [eye[c].expand_as(f) / sigma_noise for c in range(f.shape[1])]
    if fisher_type == "empirical":
        if target is None:
            raise ValueError("fisher_type='empirical' needs the targets")
        y = check_targets(f, target, likelihood)
        if likelihood == "classification":
            return [f.softmax(-1) - torch.nn.functional.one_hot(y.long(), f.shape[1]).to(f.dtype)]
        return [(f - y) / sigma_noise ** 2]
    if fisher_type != "mc":
        check_choice("fisher_type", fisher_type, FISHER_TYPES)
    w = 1.0 / math.sqrt(mc_samples)
    out = []
    for _ in range(mc_samples):
        if likelihood == "classification":
            p = f.softmax(-1)
            if not bool(torch.isfinite(p).all()):
                raise FloatingPointError("non-finite model output: cannot sample labels from the predictive")
            y = p.multinomial(1, generator=generator).squeeze(-1)
            out.append(w * (p - torch.nn.functional.one_hot(y, f.shape[1]).to(f.dtype)))
        else:
            eps = torch.randn(f.shape, dtype=f.dtype, device=f.device, generator=generator)
            out.append((-w / sigma_noise) * eps)
    return out


def check_output(output) -> torch.Tensor:
    """``ValueError`` unless the model output is a ``(batch, outputs)`` tensor; returns it."""
    if not isinstance(output, torch.Tensor) or output.dim() != 2:
        shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise ValueError(f"the model must return a (batch, outputs) tensor, got {shape}")
    return output


def batch_rows(inputs, targets) -> int:
    """The number of examples of a batch, with ``targets`` (if a tensor) checked to hold one row per
    example (``ValueError`` naming ``targets`` otherwise)."""
    B = inputs.shape[0] if isinstance(inputs, torch.Tensor) and inputs.dim() > 0 else None
    if B is not None and isinstance(targets, torch.Tensor) and (targets.dim() == 0 or targets.shape[0] != B):
        raise ValueError(f"targets must hold one row per example: the inputs have {B}, the targets have shape "
                         f"{tuple(targets.shape)}")
    return B


def batch_nll(output: torch.Tensor, target: torch.Tensor, likelihood: str, sigma_noise: float = 1.0) -> torch.Tensor:
    r"""The summed negative log-likelihood of one batch, without constants and without a graph:
    the cross-entropy for classification (class indices checked to lie in ``[0, outputs)``),
    :math:`\|f - y\|^2 / (2\sigma^2)` for regression."""
    f = output.detach()
    y = check_targets(f, target, likelihood)
    if likelihood == "classification":
        k = f.shape[1]
        if bool((y < 0).any()) or bool((y >= k).any()):
            raise ValueError(f"classification targets must lie in [0, {k}) (the model has {k} outputs)")
        return -f.log_softmax(-1).gather(1, y[:, None].long()).sum()
    nll = 0.5 * (f - y).square().sum()
    return nll if sigma_noise == 1.0 else nll / sigma_noise ** 2


class KFACCollector:
    """Records, per layer, the input of a forward pass and the gradients with respect to
    the layer output of one or more backward passes: the raw material of every K-FAC and
    EK-FAC statistic.  Use as a context manager (the hooks are removed on exit) or call
    :meth:`remove`.

    Two ways of reaching the output gradients:

    * default: a forward pre-hook keeps each layer's input and a tensor hook on its output
      keeps the gradient of every backward pass taken while ``record_grads`` is true (tensor
      hooks see the gradient even when an in-place activation follows).  :meth:`collect`
      runs forward, output gradients and backward for one batch.
    * ``capture_outputs=True``: the forward hook keeps the layer output itself in ``outputs``
      and hands a copy on (so in-place operations downstream modify the copy), while
      ``record_grads`` is true; :meth:`backward_to_outputs` then differentiates with respect to
      the kept outputs directly (no weight gradients are formed, and nothing is registered on
      forward passes that record nothing).
    """

    def __init__(self, layers: Dict[str, torch.nn.Module], capture_outputs: bool = False):
        self.layers = dict(layers)
        self.inputs: Dict[str, torch.Tensor] = {}
        self.outputs: Dict[str, torch.Tensor] = {}
        self.grads: Dict[str, List[torch.Tensor]] = {n: [] for n in self.layers}
        self.record_inputs = True
        self.record_grads = False
        self.capture_outputs = bool(capture_outputs)
        self._handles = []
        for name, mod in self.layers.items():
            if not self.capture_outputs:  # (with captured outputs the forward hook records the input too)
                self._handles.append(mod.register_forward_pre_hook(self._pre_hook(name)))
            self._handles.append(mod.register_forward_hook(self._fwd_hook(name)))

    # ---- the hooks ------------------------------------------------------------------------------------------
    def _record_input(self, name, inputs):
        if self.record_inputs:
            if name in self.inputs:
                raise RuntimeError(f"layer {name!r} was called twice in one forward pass; K-FAC needs one call "
                                   "per layer and forward pass (call clear() between passes)")
            if len(inputs) != 1:
                raise ValueError(f"layer {name!r} got {len(inputs)} inputs; one is supported")
            self.inputs[name] = inputs[0].detach()

    def _pre_hook(self, name):
        def hook(module, inputs):
            self._record_input(name, inputs)
        return hook

    def _fwd_hook(self, name):
        def grad_hook(g):
            if self.record_grads:
                self.grads[name].append(g.detach())

        def hook(module, inputs, output):
            if self.capture_outputs:
                self._record_input(name, inputs)
                if self.record_grads and output.requires_grad:
                    self.outputs[name] = output
                    return output.clone()
                return None
            if output.requires_grad:
                output.register_hook(grad_hook)
        return hook

    # ---- one batch ------------------------------------------------------------------------------------------
    def collect(self, model: torch.nn.Module, inputs: torch.Tensor, targets: Optional[torch.Tensor], likelihood: str,
                fisher_type: str, params: Sequence[torch.Tensor], sigma_noise: float = 1.0, mc_samples: int = 1,
                generator: Optional[torch.Generator] = None):
        """Forward ``inputs``, the output gradients of :func:`output_gradients` and one backward
        pass per gradient (to ``params``, through which the hooks see every layer output).
        Returns ``(output, {name: (patches (B, T, in+1), [output gradients (B, T, out)])})``;
        the recorded tensors are cleared."""
        self.clear()
        out = check_output(model(inputs))
        es = output_gradients(out, targets, likelihood, fisher_type, sigma_noise, mc_samples, generator)
        self.record_grads = True
        try:
            for i, e in enumerate(es):
                torch.autograd.grad(out, params, grad_outputs=e.to(out.dtype), retain_graph=i < len(es) - 1,
                                    allow_unused=True)
        finally:
            self.record_grads = False
        stats = {}
        for name, mod in self.layers.items():
            if name not in self.inputs or len(self.grads[name]) != len(es):
                raise RuntimeError(f"layer {name!r} was not used in the forward pass (or its output does not reach "
                                   "the model output)")
            stats[name] = (input_patches(mod, self.inputs[name]), [output_grads(mod, g) for g in self.grads[name]])
        self.clear()
        return out, stats

    def backward_to_outputs(self, out: torch.Tensor, grad_out: torch.Tensor, retain: bool) -> None:
        """(``capture_outputs=True``) The gradients of ``out``, weighted by ``grad_out``, with respect
        to every layer's captured output, appended to ``grads`` (by ``vmfdist._torch_internals.grad``: the
        autograd engine directly on the CPU, ``torch.autograd.grad`` elsewhere)."""
        outputs = self.outputs
        if len(outputs) != len(self.layers):
            missing = [n for n in self.layers if n not in outputs]
            raise RuntimeError(f"layer {missing[0]!r} was not called in the forward pass")
        gs = grad(out, tuple(outputs[n] for n in self.layers), grad_out, retain)
        for (n, g), grads in zip(zip(self.layers, gs), self.grads.values()):
            if g is None:
                raise RuntimeError(f"the output of layer {n!r} does not reach the model output")
            grads.append(g)

    def first_non_finite_input(self) -> Optional[str]:
        """The name of the first layer whose recorded input holds a NaN or an infinity, or ``None``."""
        for n in self.layers:
            x = self.inputs.get(n)
            if x is not None and not bool(torch.isfinite(x).all()):
                return n
        return None

    def clear(self):
        """Forget the recorded inputs, outputs and gradients (the hooks stay)."""
        self.inputs.clear()
        self.outputs.clear()
        for v in self.grads.values():
            v.clear()

    def remove(self):
        """Remove the hooks from the layers."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def input_factor(a: torch.Tensor, kfac_approx: str = "expand") -> torch.Tensor:
    """:math:`\\sum_n \\frac1T\\sum_t a a^T` (expand) or :math:`\\sum_n \\bar a_n\\bar a_n^T` (reduce) from
    patches ``(batch, T, in)``: a *sum* over the batch."""
    if a.shape[1] == 1:
        return a[:, 0].mT @ a[:, 0]
    if kfac_approx == "expand":
        flat = a.reshape(-1, a.shape[-1])
        return (flat.mT @ flat) / a.shape[1]
    m = a.mean(1)
    return m.mT @ m


def gradient_factor(g: torch.Tensor, kfac_approx: str = "expand") -> torch.Tensor:
    """:math:`\\sum_n\\sum_t g g^T` (expand) or :math:`\\sum_n (\\sum_t g)(\\sum_t g)^T` (reduce) from
    ``(batch, T, out)``: a sum over the batch."""
    if g.shape[1] == 1:
        return g[:, 0].mT @ g[:, 0]
    if kfac_approx == "expand":
        flat = g.reshape(-1, g.shape[-1])
        return flat.mT @ flat
    s = g.sum(1)
    return s.mT @ s


def per_example_second_moments(a: torch.Tensor, g: torch.Tensor, q_a: torch.Tensor, q_g: torch.Tensor
                               ) -> torch.Tensor:
    r""":math:`\sum_n \big(Q_G^T(\sum_t g_{n,t}a_{n,t}^T)Q_A\big)^{\odot 2}`, an ``(out, in)`` matrix (a sum
    over the batch): the per-example gradient is summed over locations before squaring.  ``None``
    bases are the identity (the diagonal of the GGN)."""
    if a.shape[1] == 1:
        gp, ap = g[:, 0], a[:, 0]
        gp = gp.square() if q_g is None else (gp @ q_g).square_()
        ap = ap.square() if q_a is None else (ap @ q_a).square_()
        return gp.mT @ ap
    gp = g if q_g is None else g @ q_g  # (B, T, out)
    ap = a if q_a is None else a @ q_a  # (B, T, in)
    per = gp.mT @ ap  # (B, out, in)
    return per.pow(2).sum(0)


def factor_rows(a: torch.Tensor, gs: Sequence[torch.Tensor], kfac_approx: str = "expand"
                ) -> Tuple[torch.Tensor, float, List[torch.Tensor]]:
    """One batch's factors as row matrices: ``(R_A, c, [R_G, ...])`` with
    :func:`input_factor` ``= c R_A^T R_A`` and :func:`gradient_factor` ``= R_G^T R_G`` (summed over
    the output gradients ``gs``), from patches ``(B, T, in)`` and output gradients ``(B, T, out)``.
    Row form lets a running average take one ``addmm`` (and ranks average ``R^T R``)."""
    locs = a.shape[1]
    if locs == 1 or kfac_approx == "expand":  # sum_n (1/T) sum_t a a^T, sum_n sum_t g g^T
        return a.flatten(0, 1), 1.0 / locs, [g.flatten(0, 1) for g in gs]
    return a.mean(1), 1.0, [g.sum(1) for g in gs]  # sum_n mean_t(a) mean_t(a)^T, sum_n sum_t(g) sum_t(g)^T
