r"""The GLM (linearised-network) predictive of the Kronecker-factored Laplace approximations:
the rotated output Jacobians of each block, the link approximations for classification and
Gaussian draws of the logits.  The functional variances themselves are
:class:`~vmfdist.laplace.precision.KroneckerPrecision`'s."""
from __future__ import annotations

import math
from typing import List, Optional

import torch
from torch import nn

from ..curvature import TRANSPOSED_CONVS, check_output, input_patches
from .blocks import Block, Capture, batched_output_grads, block_inputs

__all__ = ["glm_terms", "empty_predictive", "link", "glm_samples", "validation_loss", "PredictiveMixin"]


def glm_terms(model: nn.Module, blocks: List[Block], X: torch.Tensor, enable_backprop: bool = False):
    """One forward pass and one batched backward pass: ``(f(x), terms)`` with, per block, the
    output Jacobians of the layer rotated into the block's Kronecker eigenbasis: ``(u, v)`` with ``u``
    ``(outputs, batch, out)`` and ``v`` ``(batch, in)`` for one location per example, else
    ``(per-example rotated Jacobians (outputs, batch, out, in), None)``.  The ``(outputs x n_params)``
    Jacobian is never formed."""
    with Capture([b.module for b in blocks]) as cap, torch.enable_grad():
        out = check_output(model(X))
    B, K = out.shape
    eye = torch.eye(K, dtype=out.dtype, device=out.device)[:, None, :].expand(K, B, K)
    grads = _backprop(out, cap, eye, create_graph=enable_backprop)
    terms = []
    for b in blocks:
        a, g = grads[id(b.module)]
        q_g, q_a = b.factor.q_g, b.factor.q_a  # (None: the identity, a diagonal posterior)
        u = g if q_g is None else g @ q_g  # (K, B, L, out)
        v = block_inputs(b, a)
        v = v if q_a is None else v @ q_a  # (B, L, in)
        if not enable_backprop:
            u, v = u.detach(), v.detach()
        if u.shape[2] == 1:
            terms.append((u[:, :, 0], v[:, 0]))
        else:
            terms.append((torch.einsum("kblo,blj->kboj", u, v), None))
    f = out if enable_backprop else out.detach()
    return f, terms


def empty_predictive(model: nn.Module, X: torch.Tensor, joint: bool, diagonal_output: bool):
    """``(f_mu, f_var)`` of an empty batch ``X``: ``(0, K)`` and ``(0, K, K)`` (``(0, K)`` diagonal; ``(0,)``
    and ``(0, 0)`` joint), with ``K`` from one forward pass of the empty batch (as laplace-torch)."""
    with torch.no_grad():
        f = check_output(model(X))
    K = f.shape[1]
    if joint:
        return f.reshape(-1), f.new_zeros(0, 0)
    return f, f.new_zeros(0, K) if diagonal_output else f.new_zeros(0, K, K)


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d) + TRANSPOSED_CONVS


def _backprop(out: torch.Tensor, cap: Capture, cols: torch.Tensor, create_graph: bool = False):
    """Gradients of ``<out, cols[c]>`` with respect to every covered layer's recorded
    output(s), for all columns ``c`` in one batched backward pass; per module,
    ``(patches with the appended 1 (B, L, in+1), grads (C, B, L, out))``, the calls of a
    layer used more than once concatenated along the locations."""
    mods = cap.modules
    hs = [h for m in mods for h in cap.outputs.get(id(m), [])]
    if len(hs) == 0:
        raise RuntimeError("no covered layer was called during the forward pass")
    if len(hs) == 1 and len(cap.handed_on) == 1 and cap.handed_on[0] is out:
        # the one covered layer's output (its copy) is the model's: a last-layer Laplace on a network
        # ending in that layer.  The gradient of <out, cols[c]> with respect to it is cols[c]: no
        # backward pass
        gs = [cols]
    elif cols.shape[0] == 1:
        gs = torch.autograd.grad(out, hs, cols[0], allow_unused=True, create_graph=create_graph)
        gs = [None if g is None else g[None] for g in gs]
    elif any(isinstance(m, _CONVS) for m in mods) and not create_graph:
        # one ordinary backward pass per column: vmap over a convolution's backward takes torch's
        # slow im2col batching rule (measured ~15x slower on LeNet-5 at 200 images)
        per_col = [torch.autograd.grad(out, hs, c, allow_unused=True, retain_graph=True) for c in cols]
        gs = [None if per_col[0][i] is None else torch.stack([g[i] for g in per_col]) for i in range(len(hs))]
    else:
        gs = torch.autograd.grad(out, hs, cols, allow_unused=True, is_grads_batched=True,
                                 create_graph=create_graph)
    res = {}
    k = 0
    for m in mods:
        a_list, g_list = [], []
        for x in cap.inputs.get(id(m), []):
            g, h = gs[k], hs[k]
            k += 1
            if g is None:
                g = torch.zeros((cols.shape[0],) + tuple(h.shape), dtype=h.dtype, device=h.device)
            a_list.append(input_patches(m, x))
            g_list.append(batched_output_grads(m, g))
        if a_list:
            res[id(m)] = (torch.cat(a_list, 1) if len(a_list) > 1 else a_list[0],
                          torch.cat(g_list, 2) if len(g_list) > 1 else g_list[0])
    return res


def link(f_mu, f_var, link_approx, n_samples=100, generator=None, diagonal_output=False):
    """Class probabilities from the logits' Gaussian ``N(f_mu, f_var)``: ``"probit"``
    (:math:`\\mathrm{softmax}(f/\\sqrt{1+\\frac\\pi8\\mathrm{diag}\\,\\Sigma})`), ``"mc"`` (``n_samples`` draws of
    the logits) or ``"bridge"`` / ``"bridge_norm"`` (the Laplace bridge)."""
    if link_approx == "probit":
        kappa = 1.0 / torch.sqrt(1.0 + math.pi / 8.0 * f_var.diagonal(dim1=-2, dim2=-1))
        return torch.softmax(kappa * f_mu, dim=-1)
    if link_approx == "mc":
        return glm_samples(f_mu, f_var, n_samples, generator, diagonal_output).softmax(-1).mean(0)
    # the Laplace bridge (Hobbhahn et al. 2022), after laplace-torch
    f_mu = f_mu - f_var.sum(-1) * f_mu.sum(-1, keepdim=True) / f_var.sum((-2, -1))[:, None]
    f_var = f_var - torch.einsum("bi,bj->bij", f_var.sum(-1), f_var.sum(-2)) / f_var.sum((-2, -1))[:, None, None]
    K = f_mu.shape[-1]
    f_var_diag = f_var.diagonal(dim1=-2, dim2=-1)
    if link_approx == "bridge_norm":
        m = f_var_diag.mean(-1) / math.sqrt(K / 2)
        f_mu = f_mu / m.sqrt()[:, None]
        f_var_diag = f_var_diag / m[:, None]
    sum_exp = torch.exp(-f_mu).sum(-1, keepdim=True)
    alpha = (1 - 2 / K + f_mu.exp() / K ** 2 * sum_exp) / f_var_diag
    return torch.nan_to_num(alpha / alpha.sum(-1, keepdim=True), nan=1.0)


@staticmethod
def glm_samples(f_mu, f_var, n_samples, generator=None, diagonal_output=False):
    """``n_samples`` draws of the logits from ``N(f_mu, f_var)``, ``(n_samples, batch, outputs)`` (a
    symmetric square root where the output covariance is singular)."""
    eps = torch.randn((n_samples,) + tuple(f_mu.shape), dtype=f_mu.dtype, device=f_mu.device,
                      generator=generator)
    if diagonal_output:
        return f_mu + eps * f_var.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()
    L, info = torch.linalg.cholesky_ex(f_var)
    if bool((info != 0).any()):  # singular output covariance: a symmetric square root
        w, Q = torch.linalg.eigh(f_var)
        L = Q * w.clamp_min(0).sqrt()[..., None, :]
    return f_mu + torch.einsum("bij,sbj->sbi", L, eps)


def validation_loss(preds, ys, loss, sigma_noise):
    """The loss of predictions ``preds`` for targets ``ys`` (lists over batches): ``loss(prediction, y)``
    when given, else the predictive's mean negative log-likelihood (for regression the Gaussian one,
    with variance ``f_var + sigma_noise**2``)."""
    y = torch.cat(ys)
    if isinstance(preds[0], tuple):
        mu = torch.cat([p[0] for p in preds])
        var = torch.cat([p[1] for p in preds])
        if loss is not None:
            return loss((mu, var), y)
        if var.dim() == 3:
            var = var.diagonal(dim1=-2, dim2=-1)
        var = var + sigma_noise.detach().square()
        return (0.5 * (torch.log(2 * math.pi * var) + (y - mu).square() / var)).sum(-1).mean()
    probs = torch.cat(preds)
    if loss is not None:
        return loss(probs, y)
    return -probs.clamp_min(torch.finfo(probs.dtype).tiny).log().gather(1, y[:, None].long()).mean()


_PRED_TYPES = ("glm", "nn")
_LINK_APPROX = ("probit", "mc", "bridge", "bridge_norm")


class PredictiveMixin:
    """The predictive half of every Laplace class (``vmfdist.laplace.kron._BaseLaplace``): the GLM
    predictive through the posterior's ``_precision`` (the structure's variances), the sampled
    network predictive, and laplace-torch's ``__call__`` / ``predictive`` / ``functional_samples``
    / ``predictive_samples`` / ``functional_variance``."""

    def _glm_terms(self, X: torch.Tensor):
        return glm_terms(self.model, self._blocks, X, self.enable_backprop)

    def _glm_variance(self, cache) -> torch.Tensor:
        f, terms = cache
        return self._precision.glm_variance(f, terms, self._H_factor, self.prior_precision)

    def _glm_covariance(self, cache) -> torch.Tensor:
        f, terms = cache
        return self._precision.glm_covariance(f, terms, self._H_factor, self.prior_precision)

    #: largest number of entries of the per-example rotated Jacobians of a weight-sharing
    #: layer (outputs x batch x out x in) held at once; larger batches are split
    glm_chunk_elements = 2 ** 24

    def _glm_predictive_distribution(self, X: torch.Tensor, joint: bool = False, diagonal_output: bool = False):
        self._check_fitted()
        X = X.to(self._device)
        if X.shape[0] == 0:  # an empty batch: empty predictions (as laplace-torch), no Jacobians
            return empty_predictive(self.model, X, joint, diagonal_output)
        if joint:
            cache = self._glm_terms(X)
            return cache[0].reshape(-1), self._glm_covariance(cache)
        # convolutions keep a (outputs, batch, out, in) Jacobian per layer: bound its size
        per_example = max([max(self.n_outputs, 1) * b.out_dim * b.in_dim for b in self._blocks
                           if isinstance(b.module, nn.Conv2d)] or [0])
        chunk = X.shape[0] if per_example == 0 else max(1, self.glm_chunk_elements // per_example)
        mus, vars_ = [], []
        for i in range(0, X.shape[0], chunk):
            cache = self._glm_terms(X[i:i + chunk])
            mus.append(cache[0])
            vars_.append(self._glm_variance(cache))
        f_mu = mus[0] if len(mus) == 1 else torch.cat(mus)
        f_var = vars_[0] if len(vars_) == 1 else torch.cat(vars_)
        if diagonal_output:
            f_var = f_var.diagonal(dim1=-2, dim2=-1)
        return f_mu, f_var

    def functional_variance(self, Js: torch.Tensor) -> torch.Tensor:
        """:math:`J P^{-1} J^T` for Jacobians ``Js`` ``(batch, outputs, n_params)`` (as
        laplace-torch's ``functional_variance``)."""
        self._check_fitted()
        d = self._precision.dim
        if Js.dim() != 3 or Js.shape[-1] != d:
            raise ValueError(f"Js must have shape (batch, outputs, {d}) (the posterior's coordinates), got "
                             f"{tuple(Js.shape)}")
        return self._precision.functional_variance(Js, self._H_factor, self.prior_precision)

    def __call__(self, x: torch.Tensor, pred_type: str = "glm", joint: bool = False, link_approx: str = "probit",
                 n_samples: int = 100, diagonal_output: bool = False, generator: Optional[torch.Generator] = None,
                 fitting: bool = False, **model_kwargs):
        """The posterior predictive at ``x``, as laplace-torch's: class probabilities
        ``(batch, classes)`` for classification; for regression the mean ``(batch, outputs)``
        and the functional variance ``(batch, outputs, outputs)`` (the diagonal with
        ``diagonal_output=True``; the joint ``(batch*outputs)^2`` covariance with
        ``joint=True``), which, as in laplace-torch, does not include ``sigma_noise**2``.

        ``pred_type="glm"``: the linearised network, :math:`f(x)` and :math:`J P^{-1} J^T`
        computed per layer in the Kronecker eigenbasis from the layer's output Jacobians
        (one batched backward pass; the ``(outputs x n_params)`` Jacobian is never formed),
        with ``link_approx`` ``"probit"`` (:math:`\\mathrm{softmax}(f/\\sqrt{1+\\frac\\pi8
        \\mathrm{diag}\\,\\Sigma})`), ``"mc"`` (``n_samples`` Gaussian draws of the logits), or
        ``"bridge"``/``"bridge_norm"``.  ``pred_type="nn"``: ``n_samples`` weight draws from
        the posterior pushed through the network (``link_approx`` must be ``"mc"``)."""
        self._check_fitted()
        if pred_type not in _PRED_TYPES:
            raise ValueError(f"pred_type must be one of {_PRED_TYPES}, got {pred_type!r}")
        if link_approx not in _LINK_APPROX:
            raise ValueError(f"link_approx must be one of {_LINK_APPROX}, got {link_approx!r}")
        if pred_type == "nn" and link_approx != "mc":
            raise ValueError("pred_type='nn' supports link_approx='mc' only")
        if not (isinstance(n_samples, int) and n_samples >= 1):
            raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
        if generator is not None and (not isinstance(generator, torch.Generator) or generator.device != self._device):
            raise ValueError("generator must be a torch.Generator on the model's device")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if pred_type == "glm":
            f_mu, f_var = self._glm_predictive_distribution(x, joint=joint and self.likelihood == "regression")
            if self.likelihood == "regression":
                if diagonal_output and not joint:
                    f_var = f_var.diagonal(dim1=-2, dim2=-1)
                return f_mu, f_var
            return link(f_mu, f_var, link_approx, n_samples, generator, diagonal_output)
        fs = self._nn_functional_samples(x, n_samples, generator, **model_kwargs)
        if self.likelihood == "regression":
            return fs.mean(0), fs.var(0)
        return fs.softmax(-1).mean(0)

    def predictive(self, x, pred_type="glm", link_approx="probit", n_samples=100):
        return self(x, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples)

    #: The sampled networks' inputs (samples x input elements) that one batched forward pass of
    #: ``_nn_functional_samples`` may hold: beyond it the samples go in chunks, and where a chunk
    #: would be a single sample the plain loop runs.
    NN_BATCH_ELEMENTS = 2 ** 22

    @torch.no_grad()
    def _nn_functional_samples(self, x, n_samples, generator=None, **model_kwargs) -> torch.Tensor:
        thetas = self.sample(n_samples, generator)
        x = x.to(self._device)
        fs = self._batched_forward(x, thetas, model_kwargs)
        return fs if fs is not None else self._looped_forward(x, thetas, model_kwargs)

    @torch.no_grad()
    def _batched_forward(self, x, thetas, model_kwargs) -> Optional[torch.Tensor]:
        """The forward passes of all sampled networks as batched calls: ``torch.func.vmap`` over
        ``functional_call`` with the sampled parameters stacked (for a small network the loop's
        per-sample Python and copies cost more than the arithmetic); None where the model cannot
        be run that way (a module vmap does not support, randomness in the forward pass, a
        parameter that is not the model's own) or a chunk would hold one sample."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        if any(id(p) not in names for p in self.params):
            return None
        chunk = min(thetas.shape[0], self.NN_BATCH_ELEMENTS // max(x.numel(), 1))
        if chunk < 2:
            return None
        from torch.func import functional_call, vmap

        def one(params):
            return functional_call(self.model, params, (x,), model_kwargs)

        outs = []
        try:
            for t in thetas.split(chunk):
                stacked = {names[id(p)]: self._layout.part(p, t).reshape((t.shape[0],) + tuple(p.shape))
                           for p in self.params}
                outs.append(vmap(one, randomness="error")(stacked).detach())
        except Exception:  # not vmappable: the loop gives the same draws
            return None
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @torch.no_grad()
    def _looped_forward(self, x, thetas, model_kwargs) -> torch.Tensor:
        saved = [p.detach().clone() for p in self.params]
        fs = []
        try:
            for theta in thetas:
                for p in self.params:
                    p.copy_(self._layout.part(p, theta).reshape(p.shape))
                fs.append(self.model(x, **model_kwargs).detach())
        finally:
            for p, s in zip(self.params, saved):
                p.copy_(s)
        return torch.stack(fs)

    def functional_samples(self, x, pred_type="glm", n_samples=100, diagonal_output=False, generator=None):
        """``n_samples`` draws of the network output at ``x``: ``(n_samples, batch, outputs)``."""
        self._check_fitted()
        if pred_type == "glm":
            f_mu, f_var = self._glm_predictive_distribution(x)
            return glm_samples(f_mu, f_var, n_samples, generator, diagonal_output)
        if pred_type == "nn":
            return self._nn_functional_samples(x, n_samples, generator)
        raise ValueError(f"pred_type must be one of {_PRED_TYPES}, got {pred_type!r}")

    def predictive_samples(self, x, pred_type="glm", n_samples=100, diagonal_output=False, generator=None):
        """As :meth:`functional_samples`, with the softmax applied for classification."""
        fs = self.functional_samples(x, pred_type, n_samples, diagonal_output, generator)
        return fs if self.likelihood == "regression" else fs.softmax(-1)
