r"""Full-GGN Laplace approximation (laplace-torch's ``FullLaplace``) and subnetwork Laplace
(laplace-torch's ``SubnetLaplace`` with ``hessian_structure="full"``, Daxberger et al. 2021).

The posterior precision over the covered coordinates -- every covered parameter, or the
subnetwork chosen by ``subnetwork_indices`` -- is dense:

.. math::  P = h\,H + \mathrm{diag}(p_0),\qquad H = \sum_n J_n^T\Lambda_n J_n,\qquad h = \frac{1}{\sigma^2 T},

with :math:`J_n` the Jacobian of the network output in the covered coordinates at the trained
weights, :math:`\Lambda_n` the Hessian of the per-example loss in the output (the softmax
covariance :math:`\mathrm{diag}(p) - pp^T` for classification, :math:`I` for regression, the
:math:`1/\sigma^2` being in :math:`h`), :math:`T` the temperature and :math:`p_0` the prior
precision: one value, one per block (parameter tensor) or one per covered coordinate.  All the
algebra goes through one Cholesky factor :math:`P = LL^T`: :math:`\log\det P = 2\sum\log L_{ii}`,
samples :math:`\theta_* + L^{-T}z`, GLM variances :math:`\|L^{-1}J^T\|^2`.

The per-example Jacobians come from one forward pass and one batched backward pass to the
covered layers' outputs (:class:`~vmfdist.laplace.blocks.Capture`), the rows
:math:`\Lambda_n^{1/2\,T} J_n` of all examples of a chunk are stacked and :math:`H` gains their
Gram matrix.  :class:`FullLaplace` reuses :class:`~vmfdist.laplace.kron._BaseLaplace` for
everything that is not dense algebra (the evidence, the prior optimisation, the predictives,
the link approximations); ``FullPrecision`` has the methods of
:class:`~vmfdist.laplace.precision.KroneckerPrecision`.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Union

import torch

from ..curvature import batch_nll, batch_rows, check_output, output_gradients
from .blocks import Capture, all_sum, block_inputs, ranks
from .kron import _BaseLaplace
from .predictive import _backprop, empty_predictive

__all__ = ["FullLaplace", "FullPrecision", "DEFAULT_MAX_SIZE"]

#: the largest number of covered parameters :class:`FullLaplace` accepts by default: the dense
#: ``P x P`` precision then takes 3.2 GB in float64 (1.6 GB in float32), and ``fit`` holds about
#: two such matrices and the Cholesky factor; ``max_size=None`` lifts the limit
DEFAULT_MAX_SIZE = 20_000


class FullPrecision:
    """The dense posterior precision :math:`hH + \\mathrm{diag}(p_0)` over ``dim`` covered
    coordinates (all of ``layout``'s parameter vector, or the entries ``indices`` of it, in that
    order), with the methods of :class:`~vmfdist.laplace.precision.KroneckerPrecision`.  Vectors
    handed in (``mean``, ``d``) are full parameter vectors; ``Js`` and the GLM terms already hold
    the covered columns only.  The Cholesky factor of the last ``(h, pp)`` is kept."""

    def __init__(self, blocks, layout, indices: Optional[torch.Tensor], device=None):
        self.blocks = blocks
        self.layout = layout
        owner = torch.empty(layout.numel, dtype=torch.long, device=device)
        for i, b in enumerate(blocks):
            for p in b.params:
                layout.part(p, owner)[...] = i
        self.indices = indices
        #: the block of each covered coordinate
        self.block_index = owner if indices is None else owner[indices]
        self.dim = layout.numel if indices is None else int(indices.numel())
        self.H: Optional[torch.Tensor] = None
        self._chol = None  # (h, pp, L) of the last factorisation without a graph
        self._eig = None  # (h, eigenvalues of hH) for the scalar-prior evidence

    # ---- coordinates and the prior ---------------------------------------------------------------------------
    def take(self, vec: torch.Tensor) -> torch.Tensor:
        """The covered entries ``vec[..., indices]`` of full parameter vectors ``vec[..., n_params]``."""
        return vec if self.indices is None else vec[..., self.indices]

    def set_curvature(self, H: torch.Tensor) -> None:
        """The summed GGN ``H`` ``(dim, dim)`` (without ``h``)."""
        self.H = H
        self._chol = self._eig = None

    def per_parameter(self, pp: torch.Tensor) -> bool:
        """Whether ``pp`` holds one prior precision per covered coordinate (this precedes one per block when
        the two counts coincide, as in laplace-torch)."""
        return pp.numel() == self.dim

    def prior_diag(self, pp: torch.Tensor) -> torch.Tensor:
        """The prior precision of every covered coordinate, ``(dim,)``."""
        if pp.numel() == 1:
            return pp.reshape(1).expand(self.dim)
        if self.per_parameter(pp):
            return pp
        if pp.numel() == len(self.blocks):
            return pp[self.block_index]
        raise ValueError(f"prior_precision must hold 1 value, one per block ({len(self.blocks)}) or one per covered "
                         f"parameter ({self.dim}), got {pp.numel()} values")

    def delta(self, pp: torch.Tensor, i: int) -> torch.Tensor:
        """The prior precision of block ``i``: one value, or (one per coordinate) its covered entries."""
        if pp.numel() == 1:
            return pp[0]
        if self.per_parameter(pp):
            return pp[self.block_index == i]
        return pp[i]

    # ---- the factorisation -----------------------------------------------------------------------------------
    def precision(self, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`P = hH + \\mathrm{diag}(p_0)`, ``(dim, dim)``."""
        if self.H is None:
            raise RuntimeError("FullPrecision has no curvature: fit first")
        return h * self.H + torch.diag(self.prior_diag(pp))

    def cholesky(self, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """The lower Cholesky factor of :math:`P` (differentiable in ``h`` and ``pp``; cached when
        neither needs a gradient)."""
        graph = torch.is_grad_enabled() and (h.requires_grad or pp.requires_grad)
        if not graph and self._chol is not None:
            h0, pp0, L = self._chol
            if h0 == float(h) and pp0.shape == pp.shape and torch.equal(pp0, pp):
                return L
        L, info = torch.linalg.cholesky_ex(self.precision(h, pp))
        if int(info) != 0:
            raise torch.linalg.LinAlgError(f"the posterior precision is not positive definite (leading minor {int(info)} "
                                           f"of {self.dim}); increase the prior precision")
        if not graph:
            self._chol = (float(h), pp.detach().clone(), L)
        return L

    def scale(self, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """The lower-triangular :math:`S` with :math:`SS^T = P^{-1}` (laplace-torch's ``posterior_scale``),
        from the Cholesky factor of the reversed :math:`P`."""
        P = self.precision(h, pp)
        Lf = torch.linalg.cholesky(P.flip(-2, -1))
        eye = torch.eye(self.dim, dtype=P.dtype, device=P.device)
        return torch.linalg.solve_triangular(Lf.flip(-2, -1).mT, eye, upper=False)

    def covariance(self, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`P^{-1}`."""
        return torch.cholesky_inverse(self.cholesky(h, pp))

    # ---- determinants and quadratic forms --------------------------------------------------------------------
    def log_det(self, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`\\log\\det P`."""
        return 2.0 * self.cholesky(h, pp).diagonal().log().sum()

    def log_det_prior(self, pp: torch.Tensor) -> torch.Tensor:
        """:math:`\\log\\det P_0` over the covered coordinates."""
        return self.prior_diag(pp).log().sum()

    def prior_scatter(self, d: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`d^T P_0 d` over the covered entries of the parameter vector ``d``."""
        ds = self.take(d)
        return (ds * self.prior_diag(pp)) @ ds

    def square_norm(self, d: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`d^T P d` over the covered entries of ``d`` ``(..., n_params)``."""
        ds = self.take(d)
        return ((ds @ self.precision(h, pp)) * ds).sum(-1)

    def prior_objective(self, h: torch.Tensor, d: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """``pp -> (log det P - log det P0 + d^T P0 d) / 2`` for fixed ``h`` and ``d``.  A scalar prior
        uses the eigenvalues of :math:`hH` (computed once): :math:`\\sum_i\\log(h\\lambda_i + \\delta)`;
        other priors factorise :math:`P` at every call."""
        d2 = self.take(d).detach().square()

        def objective(pp):
            if pp.numel() != 1:
                return 0.5 * (self.log_det(h, pp) - self.log_det_prior(pp) + (self.prior_diag(pp) * d2).sum())
            if self._eig is None or self._eig[0] != float(h):
                self._eig = (float(h), torch.linalg.eigvalsh(h.detach() * self.H))
            delta = pp.reshape(())
            return 0.5 * (torch.log(self._eig[1] + delta).sum() - self.dim * delta.log() + delta * d2.sum())
        return objective

    # ---- distributions and samples ---------------------------------------------------------------------------
    def posterior(self, mean: torch.Tensor, h: torch.Tensor, pp: torch.Tensor
                  ) -> Dict[str, torch.distributions.Distribution]:
        """``{"all" | "subnetwork": MultivariateNormal}`` over the covered coordinates (in the order of
        the indices)."""
        name = "all" if self.indices is None else "subnetwork"
        return {name: torch.distributions.MultivariateNormal(self.take(mean), scale_tril=self.scale(h, pp))}

    def sample(self, n_samples: int, mean: torch.Tensor, h: torch.Tensor, pp: torch.Tensor,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(n_samples, n_params)`` draws :math:`\\theta_* + L^{-T}z`; the coordinates outside the
        subnetwork stay at ``mean``."""
        L = self.cholesky(h, pp)
        z = torch.randn((self.dim, n_samples), dtype=mean.dtype, device=mean.device, generator=generator)
        x = torch.linalg.solve_triangular(L.mT, z, upper=True).mT  # covariance L^-T L^-1 = P^-1
        out = mean.expand(n_samples, -1).clone()
        if self.indices is None:
            return out + x
        out[:, self.indices] += x
        return out

    # ---- functional variances -------------------------------------------------------------------------------
    def _whitened(self, Js: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`L^{-1}J^T` for ``Js`` ``(batch, outputs, dim)``, shape ``(dim, batch * outputs)``."""
        return torch.linalg.solve_triangular(self.cholesky(h, pp), Js.reshape(-1, self.dim).mT, upper=False)

    def functional_variance(self, Js: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`J P^{-1} J^T` for Jacobians ``(batch, outputs, dim)``: ``(batch, outputs, outputs)``."""
        B, K = Js.shape[:2]
        W = self._whitened(Js, h, pp).reshape(self.dim, B, K).permute(1, 2, 0)
        return W @ W.mT

    def glm_variance(self, f: torch.Tensor, Js: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """As :meth:`functional_variance` (the GLM terms of a full posterior are the Jacobians)."""
        return self.functional_variance(Js, h, pp)

    def glm_covariance(self, f: torch.Tensor, Js: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """The joint ``(batch * outputs)`` square functional covariance."""
        W = self._whitened(Js, h, pp)
        return W.mT @ W


def checked_subnetwork_indices(indices, n_params: int, owner: str, device) -> Optional[torch.Tensor]:
    """``subnetwork_indices`` as a 1-d int64 tensor of distinct entries in ``[0, n_params)`` (or ``None``)."""
    if indices is None:
        return None
    name = f"{owner}: subnetwork_indices"
    if not isinstance(indices, torch.Tensor):
        raise ValueError(f"{name} must be a 1-d integer tensor (a torch.LongTensor), got {type(indices).__name__}")
    if indices.dtype.is_floating_point or indices.is_complex() or indices.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer indices, got dtype {indices.dtype}")
    if indices.dim() != 1 or indices.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-d tensor, got shape {tuple(indices.shape)}")
    idx = indices.to(device=device, dtype=torch.long)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= n_params:
        raise ValueError(f"{name} must lie in [0, n_params = {n_params}), got values from {lo} to {hi}")
    if int(idx.unique().numel()) != idx.numel():
        raise ValueError(f"{name} must not contain duplicates ({idx.numel() - int(idx.unique().numel())} repeated)")
    return idx


class FullLaplace(_BaseLaplace):
    """Laplace approximation with the full (dense) GGN, laplace-torch's ``FullLaplace``, or, with
    ``subnetwork_indices``, its subnetwork Laplace (``SubnetLaplace``, ``hessian_structure="full"``).

    Args:
        model: the trained network (its current parameters are the MAP estimate); its trainable
            parameters must belong to ``torch.nn.Linear`` / ``torch.nn.Conv2d`` layers (or pick
            layers with ``modules``).
        likelihood: ``"classification"`` (cross-entropy on logits) or ``"regression"``
            (Gaussian with standard deviation ``sigma_noise``).
        sigma_noise, prior_mean, temperature, enable_backprop: as :class:`~vmfdist.laplace.KFACLaplace`
            (``prior_mean`` a number or a vector over all ``n_params`` covered parameters).
        prior_precision: a number, one value per block (parameter tensor, ``model.parameters()``
            order, laplace-torch's "layerwise"), or one per posterior coordinate
            (:attr:`n_params_subnet` values; laplace-torch's "diag").  When two of these counts
            coincide, one per coordinate is meant.
        modules: the layers covered (modules or names); the others stay at their values.
        subset_of_weights, last_layer_name: laplace-torch's ``"all"`` (default), ``"last_layer"``
            (the last layer the forward pass runs, or ``last_layer_name``; its ``FullLLLaplace``) or
            ``"subnetwork"`` (with ``subnetwork_indices``, or ``modules``), as in
            :class:`~vmfdist.laplace.KFACLaplace`.
        subnetwork_indices: a 1-d integer tensor of distinct indices into the vector of the
            covered parameters, ``parameters_to_vector(la.params)`` -- which is
            ``parameters_to_vector(model.parameters())`` when every parameter is trainable and
            ``modules`` is not given (laplace-torch's convention indexes the trainable
            parameters).  Only those coordinates are in the posterior, in the order given; the
            rest stay at their trained values.
        max_size: the largest number of posterior coordinates accepted (default
            ``DEFAULT_MAX_SIZE`` = 20,000); a larger posterior raises a ``ValueError`` naming the size
            and the bytes of its precision matrix before anything is allocated.  ``None``: no limit.

    The GGN is exact (``fisher_type="ggn"``); the evidence, its prior optimisation
    (``prior_structure`` ``"scalar"``, ``"layerwise"`` or ``"diag"``), the GLM predictive (probit,
    bridge, mc), ``sample``, ``functional_variance`` and ``log_prob`` are those of the Kronecker
    classes with the dense algebra of ``FullPrecision``.
    """

    _prior_structures = ("scalar", "layerwise", "diag")

    def __init__(self, model: torch.nn.Module, likelihood: str, sigma_noise: Union[float, torch.Tensor] = 1.0,
                 prior_precision: Union[float, torch.Tensor] = 1.0, prior_mean: Union[float, torch.Tensor] = 0.0,
                 temperature: float = 1.0, enable_backprop: bool = False, *, modules=None,
                 subnetwork_indices: Optional[torch.Tensor] = None, max_size: Optional[int] = DEFAULT_MAX_SIZE,
                 subset_of_weights: Optional[str] = None, last_layer_name: Optional[str] = None):
        owner = type(self).__name__
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1):
            raise ValueError(f"{owner}: max_size must be a positive int or None, got {max_size!r}")
        self.max_size = max_size
        self._subnetwork_arg = subnetwork_indices
        by_mask = subset_of_weights == "subnetwork" and modules is None
        if by_mask and subnetwork_indices is None:
            raise ValueError(f"{owner}: subset_of_weights='subnetwork' needs subnetwork_indices=... (a parameter "
                             f"mask) or modules=[...] (layers)")
        super().__init__(model, likelihood, sigma_noise, prior_precision, prior_mean, temperature, enable_backprop,
                         modules=modules, subset_of_weights="all" if by_mask else subset_of_weights,
                         last_layer_name=last_layer_name)
        if by_mask:
            self.subset_of_weights = "subnetwork"

    def _setup_blocks(self, modules) -> None:
        """The base class's blocks and parameter layout, the subnetwork checked against them, the size
        limit, and a dense ``FullPrecision`` in place of the Kronecker one."""
        super()._setup_blocks(modules)
        owner = type(self).__name__
        idx = checked_subnetwork_indices(self._subnetwork_arg, self.n_params, owner, self._device)
        dim = self.n_params if idx is None else idx.numel()
        if self.max_size is not None and dim > self.max_size:
            size = dim * dim * torch.empty((), dtype=self._dtype).element_size()
            raise ValueError(f"{owner}: the posterior covers P = {dim} parameters; its dense P x P precision needs "
                             f"{size} bytes ({size / 2 ** 30:.1f} GiB), and P exceeds max_size = {self.max_size}. "
                             f"Cover fewer parameters (subnetwork_indices=..., modules=...), use KFACLaplace, or "
                             f"pass a larger max_size (None: no limit)")
        self.subnetwork_indices = idx
        self._precision = FullPrecision(self._blocks, self._layout, idx, self._device)
        used = set(self._precision.block_index.unique().tolist())
        self._jac_blocks = [b for i, b in enumerate(self._blocks) if i in used]

    @classmethod
    def from_curvature(cls, *args, **kwargs):
        raise NotImplementedError(f"{cls.__name__} has no Kronecker factors to take: call fit(train_loader)")

    @classmethod
    def from_optimizer(cls, *args, **kwargs):
        raise NotImplementedError(f"{cls.__name__} has no Kronecker factors to take: call fit(train_loader)")

    # ------------------------------------------------------------------------ properties
    @property
    def n_params_subnet(self) -> int:
        """The number of posterior coordinates (``n_params`` without a subnetwork)."""
        return self._precision.dim

    @property
    def mean_subnet(self) -> torch.Tensor:
        self._check_fitted()
        return self._precision.take(self.mean)

    @property
    def H(self) -> torch.Tensor:
        """The summed GGN :math:`\\sum_n J_n^T\\Lambda_n J_n` over the posterior coordinates (laplace-torch's ``H``)."""
        self._check_fitted()
        return self._precision.H

    @property
    def posterior_precision(self) -> torch.Tensor:
        """:math:`P = H/(\\sigma^2T) + \\mathrm{diag}(p_0)`, ``(n_params_subnet, n_params_subnet)``."""
        self._check_fitted()
        return self._precision.precision(self._H_factor, self.prior_precision)

    @property
    def posterior_covariance(self) -> torch.Tensor:
        """:math:`P^{-1}`."""
        self._check_fitted()
        return self._precision.covariance(self._H_factor, self.prior_precision)

    @property
    def posterior_scale(self) -> torch.Tensor:
        """The lower-triangular Cholesky factor of :math:`P^{-1}` (laplace-torch's ``posterior_scale``)."""
        self._check_fitted()
        return self._precision.scale(self._H_factor, self.prior_precision)

    # ------------------------------------------------------------------------ fitting
    def _rows(self, X: torch.Tensor, columns: Callable[[torch.Tensor], torch.Tensor], create_graph: bool = False):
        """One forward pass and one batched backward pass: ``(f (B, K), R (C, B, dim))`` with
        ``R[c, n] = columns(f)[c, n] @ J_n``, ``J_n`` the output Jacobian in the posterior coordinates."""
        with Capture([b.module for b in self._jac_blocks]) as cap, torch.enable_grad():
            out = check_output(self.model(X))
        cols = columns(out.detach())
        grads = _backprop(out, cap, cols, create_graph=create_graph)
        R = out.new_zeros((cols.shape[0], out.shape[0], self.n_params))
        for b in self._jac_blocks:
            a, g = grads[id(b.module)]  # a (B, L, in + 1), g (C, B, L, out)
            if not create_graph:
                a = a.detach()
            self._layout.scatter(b, torch.einsum("cblo,bli->cboi", g, block_inputs(b, a)), R)
        return out, self._precision.take(R)

    def _chunk(self, n_outputs: int) -> int:
        """Examples per Jacobian pass: ``outputs x n_params`` entries each, at most
        ``glm_chunk_elements`` in all."""
        return max(1, self.glm_chunk_elements // (max(n_outputs, 1) * self.n_params))

    def fit(self, train_loader, override: bool = True, progress_bar: bool = False, distributed: bool = False) -> None:
        """The exact GGN :math:`\\sum_n J_n^T\\Lambda_n J_n` over ``train_loader``'s ``(X, y)``
        batches at the model's current parameters, and the training loss.  ``override=False``
        adds the data to the previous fit (laplace-torch's semantics: the curvature, the loss
        and :math:`N` accumulate, the mean moves to the current parameters).  Nothing changes
        unless the whole pass succeeds.  ``distributed=True`` (an initialised
        ``torch.distributed`` process group): each rank passes its shard of the data and the GGN,
        the loss and :math:`N` are all-reduced, so every rank holds the fit of all the data."""
        owner = type(self).__name__
        world = ranks(distributed, owner)
        if train_loader is None:
            raise ValueError(f"{owner}.fit: train_loader is None; pass an iterable of (inputs, targets) batches")
        fresh = override or not self._fitted
        self.model.eval()
        dim, lik = self._precision.dim, self.likelihood
        H, loss, seen, n_out = None, 0.0, 0, 0

        def loss_hessian_roots(f, y):
            nonlocal loss
            loss = loss + batch_nll(f, y, lik)  # checks the targets before the backward pass
            return torch.stack(output_gradients(f, None, lik, "type-2"))

        for X, y in self._data(train_loader):
            B = batch_rows(X, y)
            if B == 0:
                continue
            if H is None:
                H = torch.zeros(dim, dim, dtype=self._dtype, device=self._device)
                with torch.no_grad():
                    n_out = check_output(self.model(X[:1])).shape[1]
            step = self._chunk(n_out)
            for i in range(0, B, step):
                yc = y[i:i + step]
                out, R = self._rows(X[i:i + step], lambda f, yc=yc: loss_hessian_roots(f, yc))
                R = R.reshape(-1, dim)
                H.addmm_(R.mT, R)
                seen, n_out = seen + out.shape[0], out.shape[1]
        if seen == 0:
            raise ValueError(f"{owner}.fit: train_loader yielded no data" + (" on this rank" if world > 1 else ""))
        H, loss, seen = all_sum(H, world), all_sum(loss, world), all_sum(seen, world)
        H = 0.5 * (H + H.mT)
        bad = ~torch.isfinite(H).all(1)
        if bool(bad.any()):
            b = self._blocks[int(self._precision.block_index[bad.nonzero()[0, 0]])]
            raise FloatingPointError(f"{owner}.fit: the GGN of parameter '{b.name}' is not finite (non-finite "
                                     f"inputs, outputs or weights)")
        if not fresh:
            if n_out != self.n_outputs:
                raise ValueError(f"{owner}.fit(override=False): the model now has {n_out} outputs, the earlier fit "
                                 f"{self.n_outputs}")
            H = self._precision.H + H
        self._precision.set_curvature(H)
        self.n_data = seen if fresh else self.n_data + seen
        self.loss = loss if fresh else self.loss + loss
        self.n_outputs = n_out
        self.mean = torch.cat([p.detach().reshape(-1) for p in self.params])
        self._fitted = True

    # ------------------------------------------------------------------------ saving
    def state_dict(self) -> dict:
        """The fit -- the summed GGN, the mean, the loss and data counts -- and the hyper-parameters, for
        ``torch.save`` (the model is not included, as in laplace-torch)."""
        self._check_fitted()
        return {"cls_name": type(self).__name__, "likelihood": self.likelihood,
                "blocks": [b.name for b in self._blocks], "subnetwork_indices": self.subnetwork_indices,
                "H": self._precision.H, "mean": self.mean, "loss": self.loss, "n_data": self.n_data,
                "n_outputs": self.n_outputs, "prior_mean": self.prior_mean, "prior_precision": self.prior_precision,
                "sigma_noise": self.sigma_noise, "temperature": self.temperature,
                "enable_backprop": self.enable_backprop}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore a fit saved by :meth:`state_dict` into an approximation of the same class, likelihood,
        layers and subnetwork over the same model."""
        owner = type(self).__name__
        if not isinstance(state_dict, dict) or state_dict.get("cls_name") != owner:
            raise ValueError(f"{owner}.load_state_dict: state_dict must be a dict from {owner}.state_dict()")
        if state_dict["likelihood"] != self.likelihood:
            raise ValueError(f"{owner}.load_state_dict: likelihood is {self.likelihood!r} here but "
                             f"{state_dict['likelihood']!r} in the state")
        if [b.name for b in self._blocks] != state_dict["blocks"]:
            raise ValueError(f"{owner}.load_state_dict: the blocks here {[b.name for b in self._blocks]} differ "
                             f"from the state's {state_dict['blocks']}")
        mine, theirs = self.subnetwork_indices, state_dict["subnetwork_indices"]
        if (mine is None) != (theirs is None) or (mine is not None and not torch.equal(mine.cpu(), theirs.cpu())):
            raise ValueError(f"{owner}.load_state_dict: subnetwork_indices differ from the state's")
        d, H, mean = self._precision.dim, state_dict["H"], state_dict["mean"]
        if tuple(H.shape) != (d, d) or tuple(mean.shape) != (self.n_params,):
            raise ValueError(f"{owner}.load_state_dict: the state's GGN {tuple(H.shape)} / mean {tuple(mean.shape)} "
                             f"do not fit {d} posterior coordinates of {self.n_params} parameters")
        dev, dt = self._device, self._dtype
        self._precision.set_curvature(H.to(device=dev, dtype=dt))
        self.mean = mean.to(device=dev, dtype=dt)
        loss = state_dict["loss"]
        self.loss = loss.to(device=dev, dtype=dt) if isinstance(loss, torch.Tensor) else loss
        self.temperature, self.enable_backprop = state_dict["temperature"], state_dict["enable_backprop"]
        self.sigma_noise = state_dict["sigma_noise"]
        self.prior_precision = state_dict["prior_precision"]
        self.prior_mean = state_dict["prior_mean"]
        self.n_data, self.n_outputs = state_dict["n_data"], state_dict["n_outputs"]
        self._fitted = True

    # ------------------------------------------------------------------------ predictive
    def _glm_terms(self, X: torch.Tensor):
        """``(f (B, K), J (B, K, n_params_subnet))``: the output Jacobians in the posterior coordinates."""
        def identity(f):
            K = f.shape[1]
            return torch.eye(K, dtype=f.dtype, device=f.device)[:, None, :].expand(K, f.shape[0], K)

        f, R = self._rows(X, identity, create_graph=self.enable_backprop)
        J = R.transpose(0, 1)
        return (f, J) if self.enable_backprop else (f.detach(), J.detach())

    def _glm_predictive_distribution(self, X: torch.Tensor, joint: bool = False, diagonal_output: bool = False):
        self._check_fitted()
        X = X.to(self._device)
        if X.shape[0] == 0:
            return empty_predictive(self.model, X, joint, diagonal_output)
        if joint:
            cache = self._glm_terms(X)
            return cache[0].reshape(-1), self._glm_covariance(cache)
        step = self._chunk(self.n_outputs)
        mus, vars_ = [], []
        for i in range(0, X.shape[0], step):  # the (chunk, outputs, n_params) Jacobians, bounded
            cache = self._glm_terms(X[i:i + step])
            mus.append(cache[0])
            vars_.append(self._glm_variance(cache))
        f_mu, f_var = torch.cat(mus), torch.cat(vars_)
        if diagonal_output:
            f_var = f_var.diagonal(dim1=-2, dim2=-1)
        return f_mu, f_var

    def functional_covariance(self, Js: torch.Tensor) -> torch.Tensor:
        """The joint ``(batch * outputs)`` square covariance :math:`J P^{-1} J^T` (laplace-torch's
        ``functional_covariance``)."""
        self._check_fitted()
        d = self._precision.dim
        if Js.dim() != 3 or Js.shape[-1] != d:
            raise ValueError(f"Js must have shape (batch, outputs, n_params_subnet={d}), got {tuple(Js.shape)}")
        return self._precision.glm_covariance(None, Js, self._H_factor, self.prior_precision)


class FullLLLaplace(FullLaplace):
    """laplace-torch's ``FullLLLaplace``: :class:`FullLaplace` over the last layer (as
    :class:`~vmfdist.laplace.KronLLLaplace`)."""

    _default_subset = "last_layer"
