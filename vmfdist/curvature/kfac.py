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
:math:`1/\text{mc\_samples}`), ``"empirical"`` — :math:`\tilde y_n = y_n`, ``"type-2"`` (alias
``"ggn"``) — the exact GGN: one backward pass per column of the square root of the
Hessian of the loss in the output (:math:`C` passes for :math:`C` outputs).

**Likelihoods**: ``"classification"`` (categorical on logits; :math:`-\log p = ` cross-entropy)
and ``"regression"`` (Gaussian with standard deviation ``sigma_noise``: :math:`-\log p =
\|f-y\|^2/(2\sigma^2) + \text{const}`).

**EK-FAC**: the second moments of the per-example gradients in the Kronecker eigenbasis,
:math:`S = \frac1N\sum_n \big(Q_G^T(\sum_t g_{n,t}a_{n,t}^T)Q_A\big)^{\odot 2}`: for a convolution
the gradient is summed over locations *before* squaring (George et al. 2018).

The entry point for other modules (e.g. ``vmfdist.laplace``) is :func:`compute_kfac`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import nn

from .eigen import check_finite, eigen_basis, kfac_eigenvalues
from .layers import find_layers, input_patches, layer_shape, output_grads

__all__ = ["FISHER_TYPES", "KFAC_APPROX", "LIKELIHOODS", "KFACHooks", "output_gradients", "input_factor",
           "gradient_factor", "per_example_second_moments", "LayerFactors", "KFACResult", "compute_kfac",
           "resolve_loss"]

FISHER_TYPES = ("mc", "empirical", "type-2", "ggn")
KFAC_APPROX = ("expand", "reduce")
LIKELIHOODS = ("classification", "regression")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")


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
        _check_choice("likelihood", likelihood, LIKELIHOODS)
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
        return target
    if target.dim() == 1 and output.shape[1] == 1:
        target = target.unsqueeze(1)
    if target.shape != output.shape:
        raise ValueError(f"regression targets must have the output's shape {tuple(output.shape)}, got "
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
    f = output.detach()
    if f.dim() != 2:
        raise ValueError(f"the model output must have shape (batch, outputs), got {tuple(f.shape)}")
    if fisher_type in ("type-2", "ggn"):
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
        _check_choice("fisher_type", fisher_type, FISHER_TYPES)
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


class KFACHooks:
    """Forward pre-hooks keep each layer's input; forward hooks put a tensor hook on each
    layer's output that keeps its gradient (a list, one entry per backward pass) while
    ``record_grads`` is true.  Tensor hooks see the gradient of the layer output even
    when an in-place activation follows.  Use as a context manager or call ``remove()``.

    With ``capture_outputs=True`` the forward hook instead keeps the layer output in
    ``outputs`` and hands a copy on to the rest of the model (so that in-place operations
    downstream modify the copy), while ``record_grads`` is true; the caller then takes
    ``torch.autograd.grad`` with respect to ``outputs`` (no weight gradients are formed,
    and nothing is registered on forward passes that record nothing).
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

    def clear(self):
        self.inputs.clear()
        self.outputs.clear()
        for v in self.grads.values():
            v.clear()

    def remove(self):
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
    over the batch): the per-example gradient is summed over locations before squaring."""
    if a.shape[1] == 1:
        return (g[:, 0] @ q_g).square_().mT @ (a[:, 0] @ q_a).square_()
    gp = g @ q_g  # (B, T, out)
    ap = a @ q_a  # (B, T, in)
    per = gp.mT @ ap  # (B, out, in)
    return per.pow(2).sum(0)


@dataclass
class LayerFactors:
    """One layer's curvature: ``A`` (``in+1`` square), ``G`` (``out`` square), so that the
    per-data-point curvature is :math:`G\\otimes A`; ``eigenvalues`` (``(out, in+1)``, EK-FAC
    second moments in the basis ``q_g``, ``q_a``) when requested."""

    name: str
    module: torch.nn.Module
    A: torch.Tensor
    G: torch.Tensor
    num_data: int
    q_a: Optional[torch.Tensor] = None
    q_g: Optional[torch.Tensor] = None
    d_a: Optional[torch.Tensor] = None
    d_g: Optional[torch.Tensor] = None
    eigenvalues: Optional[torch.Tensor] = None

    @property
    def shape(self) -> Tuple[int, int]:
        return layer_shape(self.module)

    def eigen(self, min_eigenvalue: float = 0.0):
        """Compute (and keep) the eigenbases of ``A`` and ``G``; returns ``(d_g, q_g, d_a, q_a)``."""
        self.d_a, self.q_a = eigen_basis(self.A, min_eigenvalue)
        self.d_g, self.q_g = eigen_basis(self.G, min_eigenvalue)
        return self.d_g, self.q_g, self.d_a, self.q_a

    def kfac_eigenvalues(self) -> torch.Tensor:
        """``outer(d_G, d_A)``: the K-FAC eigenvalues in the Kronecker eigenbasis."""
        if self.d_a is None:
            self.eigen()
        return kfac_eigenvalues(self.d_g, self.d_a)

    def dense(self) -> torch.Tensor:
        """:math:`G\\otimes A` as a dense matrix (for tests and small layers only)."""
        return torch.kron(self.G, self.A)


@dataclass
class KFACResult:
    """What :func:`compute_kfac` returns: ``layers`` (name -> :class:`LayerFactors`, in model
    order), ``num_data`` (:math:`N`), ``curvature_scale`` (:math:`N` when the caller's loss is a sum
    over the data, 1 for a mean: the loss curvature is ``curvature_scale * kron(G, A)``), and
    the settings used."""

    layers: Dict[str, LayerFactors]
    num_data: int
    likelihood: str
    sigma_noise: float
    fisher_type: str
    kfac_approx: str
    reduction: str = "mean"
    curvature_scale: float = 1.0
    settings: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> LayerFactors:
        return self.layers[name]

    def __iter__(self):
        return iter(self.layers.values())


def _layer_params(layers):
    ps = []
    for m in layers.values():
        ps.append(m.weight)
    return ps


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
        fisher_type: ``"type-2"`` / ``"ggn"`` (exact GGN, the default, as laplace-torch),
            ``"mc"`` (true Fisher by sampled labels) or ``"empirical"``.
        kfac_approx: ``"expand"`` (default) or ``"reduce"`` (Eschenhagen et al. 2023), for
            layers with several locations per example (convolutions).
        mc_samples: label draws per example for ``"mc"``.
        loss_func: instead of ``likelihood``: ``nn.CrossEntropyLoss`` / ``nn.MSELoss``, see
            :func:`resolve_loss` (its reduction sets ``curvature_scale``).
        modules: layers to use (modules or names); default all supported layers.
        num_data: the data set size :math:`N` reported (default: the number of examples seen);
            the factors are averages over the examples seen.
        ekfac: also compute the eigenbases and, in a second pass over ``data`` with the same
            labels, the EK-FAC second moments (``LayerFactors.eigenvalues``).
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
    _check_choice("fisher_type", fisher_type, FISHER_TYPES)
    _check_choice("kfac_approx", kfac_approx, KFAC_APPROX)
    if not (isinstance(mc_samples, int) and mc_samples >= 1):
        raise ValueError(f"mc_samples must be a positive integer, got {mc_samples!r}")
    if fisher_type != "mc" and mc_samples != 1:
        raise ValueError("mc_samples must be 1 unless fisher_type='mc'")
    layers = find_layers(model, modules, allow_other_parameters=modules is not None)
    like, sigma, reduction = resolve_loss(likelihood, sigma_noise, loss_func)
    weights = _layer_params(layers)
    saved_flags = [w.requires_grad for w in weights]

    def make_gen(device):
        if seed is None:
            return generator
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        return gen

    A = {n: None for n in layers}
    G = {n: None for n in layers}
    S = {n: None for n in layers}
    seen = 0
    passes = 2 if ekfac else 1
    result_layers = {}
    try:
        for w in weights:
            w.requires_grad_(True)
        with KFACHooks(layers) as hooks:
            for pass_no in range(passes):
                gen = None
                state = None
                for X, y in data:
                    if gen is None:
                        gen = make_gen(X.device if isinstance(X, torch.Tensor) else "cpu")
                        if pass_no == 0 and gen is not None:
                            state = gen.get_state()
                        elif pass_no == 1 and gen is not None and first_state is not None:
                            gen.set_state(first_state)
                    hooks.clear()
                    out = model(X)
                    if out.dim() != 2:
                        raise ValueError(f"the model output must have shape (batch, outputs), got {tuple(out.shape)}")
                    if loss_func is not None and isinstance(loss_func, nn.MSELoss):
                        resolve_loss(None, 1.0, loss_func, num_outputs=out.shape[1])
                    es = output_gradients(out, y, like, fisher_type, sigma, mc_samples, gen)
                    hooks.record_grads = True
                    for i, e in enumerate(es):
                        torch.autograd.grad(out, weights, grad_outputs=e.to(out.dtype), retain_graph=i < len(es) - 1,
                                            allow_unused=True)
                    hooks.record_grads = False
                    for name, mod in layers.items():
                        if name not in hooks.inputs or len(hooks.grads[name]) != len(es):
                            raise RuntimeError(f"layer {name!r} was not used in the forward pass (or its output does "
                                               "not reach the model output)")
                        a = input_patches(mod, hooks.inputs[name])
                        gs = [output_grads(mod, g) for g in hooks.grads[name]]
                        if pass_no == 0:
                            fa = input_factor(a, kfac_approx)
                            fg = sum(gradient_factor(g, kfac_approx) for g in gs)
                            A[name] = fa if A[name] is None else A[name] + fa
                            G[name] = fg if G[name] is None else G[name] + fg
                        else:
                            lf = result_layers[name]
                            s = sum(per_example_second_moments(a, g, lf.q_a, lf.q_g) for g in gs)
                            S[name] = s if S[name] is None else S[name] + s
                    if pass_no == 0:
                        seen += out.shape[0]
                    hooks.clear()
                if pass_no == 0:
                    first_state = state
                    if seen == 0:
                        raise ValueError("data yielded no batches")
                    for name, mod in layers.items():
                        a_f, g_f = A[name] / seen, G[name] / seen
                        check_finite(name, "input factor A", a_f)
                        check_finite(name, "gradient factor G", g_f)
                        lf = LayerFactors(name, mod, a_f, g_f, num_data if num_data is not None else seen)
                        if ekfac:
                            lf.eigen(min_eigenvalue)
                        result_layers[name] = lf
                else:
                    for name in layers:
                        s = S[name] / seen
                        check_finite(name, "EK-FAC second moments", s)
                        result_layers[name].eigenvalues = s
    finally:
        for w, f in zip(weights, saved_flags):
            w.requires_grad_(f)
    n = num_data if num_data is not None else seen
    if num_data is not None and (not isinstance(num_data, int) or num_data < 1):
        raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
    return KFACResult(result_layers, n, like, sigma, fisher_type, kfac_approx, reduction,
                      float(n) if reduction == "sum" else 1.0,
                      dict(mc_samples=mc_samples, ekfac=ekfac, min_eigenvalue=min_eigenvalue))
