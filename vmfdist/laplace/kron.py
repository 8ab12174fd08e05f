r"""K-FAC and EK-FAC Laplace approximations (Ritter, Botev & Barber 2018; George et al. 2018),
with laplace-torch's interface.

For a trained network with parameters :math:`\theta_*` (the MAP estimate), the Laplace
approximation is :math:`q(\theta) = \mathcal N(\theta_*, P^{-1})` with the posterior
precision

.. math::  P = \frac{1}{\sigma^2 T}\,\mathrm{GGN}(\theta_*) + P_0,

where :math:`\sigma` is the observation noise (regression; 1 for classification),
:math:`T` the temperature and :math:`P_0 = \delta I` the prior precision (one
:math:`\delta` for all, or one per block).  Per layer block the GGN is approximated by a
Kronecker product :math:`G\otimes A` with :math:`G = \sum_n g_n g_n^T` (backpropagated
output-gradient columns of the loss-Hessian square root, summed over the :math:`N` training
examples) and :math:`A = \frac1N\sum_n a_na_n^T` (layer inputs, averaged), i.e.
:math:`N\,\mathbb E[gg^T]\otimes\mathbb E[aa^T]`.  With the eigendecompositions
:math:`G = Q_G\,\mathrm{diag}(\lambda)\,Q_G^T`, :math:`A = Q_A\,\mathrm{diag}(\mu)\,Q_A^T`,
the prior is added *exactly* in the Kronecker eigenbasis:

.. math::  P_{\text{block}} = (Q_G\otimes Q_A)\,\mathrm{diag}\big(\mathrm{vec}(h\,\lambda\mu^T + \delta)\big)\,(Q_G\otimes Q_A)^T,
   \qquad h = \frac{1}{\sigma^2T}.

``damping=True`` gives Ritter et al. 2018's :math:`\sqrt{\cdot}`-damped form
:math:`(\sqrt h\,G + \sqrt\delta\,I)\otimes(\sqrt h\,A + \sqrt\delta\,I)` (eigenvalues
:math:`(\sqrt h\lambda_i + \sqrt\delta)(\sqrt h\mu_j + \sqrt\delta)`), a true Kronecker
product whose posterior is a :class:`~vmfdist.distributions.matrix_normal.MatrixNormal`.
:class:`EKFACLaplace` replaces :math:`\lambda_i\mu_j` by the EK-FAC second moments
:math:`s_{ij} = \sum_n\sum_c\big[(Q_G^T\,\nabla_{W}\ell_{n,c}\,Q_A)_{ij}\big]^2`, the exact
diagonal of the block's GGN in the K-FAC eigenbasis.

Everything here follows laplace-torch's ``KronLaplace`` (weights and biases in separate
blocks, per-block prior precisions in ``model.parameters()`` order, the log marginal
likelihood, the GLM predictive with the probit approximation) so that code written for
laplace-torch switches by changing one import.  See ``docs/laplace.md``.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Union

import torch
from torch import nn

from ..curvature import KFAC_APPROX, LIKELIHOODS, KroneckerFactor, canonical_fisher_type, check_choice, compute_kfac
from .blocks import (SUBSETS, Block, ParameterLayout, all_sum, broadcast, collect_block_moments, find_blocks,
                     last_executed_layer, last_registered_layer, ranks, unpack_batch)
from .precision import KroneckerPrecision, checked_prior_mean, checked_prior_precision, checked_sigma_noise
from .predictive import _PRED_TYPES, PredictiveMixin, link, validation_loss
from .reuse import FromFactorsMixin
from .saving import SavingMixin

__all__ = ["KFACLaplace", "EKFACLaplace", "KronLaplace", "KronLLLaplace", "EKFACLLLaplace"]

class _BaseLaplace(PredictiveMixin, FromFactorsMixin, SavingMixin):
    """What :class:`KFACLaplace` and :class:`EKFACLaplace` share (everything but the
    eigenvalues of the likelihood term)."""

    _ekfac = False
    _diag = False
    #: the prior precisions offered: one, one per block, and (diagonal and full posteriors) one per parameter
    _prior_structures = ("scalar", "layerwise")

    def __init__(self, model: torch.nn.Module, likelihood: str, sigma_noise: Union[float, torch.Tensor] = 1.0,
                 prior_precision: Union[float, torch.Tensor] = 1.0, prior_mean: Union[float, torch.Tensor] = 0.0,
                 temperature: float = 1.0, enable_backprop: bool = False, *, damping: bool = False,
                 fisher_type: str = "ggn", kfac_approx: str = "expand", separate_weight_and_bias: bool = True,
                 mc_samples: int = 1, generator: Optional[torch.Generator] = None, modules=None,
                 subset_of_weights: Optional[str] = None, last_layer_name: Optional[str] = None):
        owner = type(self).__name__
        if not isinstance(model, nn.Module):
            raise TypeError(f"{owner}: model must be a torch.nn.Module, got {type(model).__name__}")
        try:  # the option names of vmfdist.curvature (curvlinops'), checked once there
            check_choice("likelihood", likelihood, LIKELIHOODS)
            fisher_type = canonical_fisher_type(fisher_type)
            check_choice("kfac_approx", kfac_approx, KFAC_APPROX)
        except ValueError as e:
            raise ValueError(f"{owner}: {e}") from None
        if not (isinstance(mc_samples, int) and mc_samples >= 1):
            raise ValueError(f"{owner}: mc_samples must be a positive int, got {mc_samples!r}")
        if damping and self._ekfac:
            raise ValueError(f"{owner}: damping (the sqrt-damped Kronecker form) applies to KFACLaplace only; "
                             f"EK-FAC has no Kronecker factors to damp")
        if isinstance(model, nn.parallel.DistributedDataParallel):  # its hooks would wait for a backward
            model = model.module
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"{owner}: temperature must be a finite positive number, got {temperature!r}")
        self.model = model
        self.likelihood = likelihood
        self.damping = bool(damping)
        self.fisher_type = "ggn" if fisher_type == "type-2" else fisher_type  # laplace-torch's name
        self.kfac_approx = kfac_approx
        self.separate_weight_and_bias = bool(separate_weight_and_bias)
        self.mc_samples = mc_samples
        self.generator = generator
        self.enable_backprop = bool(enable_backprop)
        self.temperature = float(temperature)
        subset = self._default_subset if subset_of_weights is None else subset_of_weights
        try:
            check_choice("subset_of_weights", subset, SUBSETS)
        except ValueError as e:
            raise ValueError(f"{owner}: {e}") from None
        self.subset_of_weights = subset
        self._last_layer_found = True
        if subset == "last_layer":
            if modules is not None:
                raise ValueError(f"{owner}: subset_of_weights='last_layer' covers one layer; give last_layer_name=... "
                                 f"(or use subset_of_weights='subnetwork' with modules=[...]), not modules")
            if last_layer_name is None:
                last_layer_name = last_registered_layer(model, owner)
                self._last_layer_found = False  # confirmed by the first forward pass of fit (laplace-torch's rule)
            modules = [last_layer_name]
        elif last_layer_name is not None:
            raise ValueError(f"{owner}: last_layer_name is for subset_of_weights='last_layer', got "
                             f"subset_of_weights={subset!r}")
        elif subset == "subnetwork" and modules is None:
            raise ValueError(f"{owner}: subset_of_weights='subnetwork' needs modules=[...] (module names or modules); "
                             f"a parameter mask (laplace-torch's subnetwork_indices) needs hessian_structure='full'")
        self.last_layer_name = last_layer_name
        self._setup_blocks(modules)
        if sigma_noise != 1 and likelihood != "regression":
            raise ValueError(f"{owner}: sigma_noise != 1 is only available for regression")
        self.sigma_noise = sigma_noise
        self.prior_precision = prior_precision
        self.prior_mean = prior_mean
        self.loss: Union[float, torch.Tensor] = 0.0
        self.n_data = 0
        self.n_outputs = 0
        self.mean: Optional[torch.Tensor] = None
        self._sums: Optional[Dict[int, KroneckerFactor]] = None  # per layer: A and G summed over the data
        self._fitted = False

    #: ``subset_of_weights`` when none is given: all weights (laplace-torch's ``KronLaplace``);
    #: the ``*LLLaplace`` classes and the :func:`~vmfdist.laplace.Laplace` factory use ``"last_layer"``
    _default_subset = "all"

    def _setup_blocks(self, modules) -> None:
        """The blocks, parameters and precision structure over ``modules`` (None: every layer)."""
        owner = type(self).__name__
        self._blocks: List[Block] = find_blocks(self.model, self.separate_weight_and_bias, owner, modules)
        covered = {id(p) for b in self._blocks for p in b.params}
        self.params: List[nn.Parameter] = [p for p in self.model.parameters() if id(p) in covered]
        self.n_params = sum(p.numel() for p in self.params)
        self.n_layers = len(self._blocks)
        self._layout = ParameterLayout(self.params)
        self._precision = KroneckerPrecision(self._blocks, self._layout, self._ekfac, self.damping)

    def _find_last_layer(self, train_loader) -> None:
        """laplace-torch's rule: the last layer is the last leaf module the forward pass runs (here:
        the last with trainable parameters), found on the first batch; the blocks move to it if the
        guess from the registration order was another."""
        owner = type(self).__name__
        for batch in train_loader:
            X, _ = unpack_batch(batch, "train_loader")
            name = last_executed_layer(self.model, X.to(self._device), owner)
            break
        else:
            return  # no data: fit reports it
        if name != self.last_layer_name:
            pp, pm = self._prior_precision, self._prior_mean
            self._setup_blocks([name])
            self.last_layer_name = name
            self.prior_precision, self.prior_mean = pp, pm  # checked again for the new layer
        self._last_layer_found = True

    # ------------------------------------------------------------------------ properties
    @property
    def _device(self) -> torch.device:
        return self.params[0].device

    @property
    def _dtype(self) -> torch.dtype:
        return self.params[0].dtype

    @property
    def blocks(self) -> list:
        """The Kronecker blocks (name, layer, kind, factors, eigenbases), in parameter order."""
        return self._blocks

    @property
    def prior_precision(self) -> torch.Tensor:
        return self._prior_precision

    @prior_precision.setter
    def prior_precision(self, prior_precision) -> None:
        self._prior_precision = checked_prior_precision(prior_precision, [b.name for b in self._blocks],
                                                        self._device, self._dtype,
                                                        self._precision.dim if "diag" in self._prior_structures
                                                        else None)

    @property
    def prior_mean(self) -> torch.Tensor:
        return self._prior_mean

    @prior_mean.setter
    def prior_mean(self, prior_mean) -> None:
        self._prior_mean = checked_prior_mean(prior_mean, self.n_params, self._device, self._dtype)

    @property
    def sigma_noise(self) -> torch.Tensor:
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, sigma_noise) -> None:
        self._sigma_noise = checked_sigma_noise(sigma_noise, self.likelihood, self._device, self._dtype)

    @property
    def _H_factor(self) -> torch.Tensor:
        """:math:`h = 1/(\\sigma^2 T)`, the factor of the likelihood curvature."""
        return 1.0 / self.sigma_noise.square() / self.temperature

    def _delta(self, i: int) -> torch.Tensor:
        return self._precision.delta(self.prior_precision, i)

    @property
    def prior_precision_diag(self) -> torch.Tensor:
        """The prior precision of every posterior coordinate, ``(n_params,)`` in parameter order."""
        return self._precision.prior_diag(self.prior_precision).clone()

    # ------------------------------------------------------------------------ fitting
    def _check_fitted(self):
        if not self._fitted:
            raise RuntimeError(f"{type(self).__name__} is not fitted: call fit(train_loader) first")

    def _data(self, loader):
        """``loader``'s ``(X, y)`` batches, checked to be pairs and moved to the model's device."""
        for batch in loader:
            X, y = unpack_batch(batch, "train_loader")
            yield X.to(self._device), y.to(self._device)

    def _layers_dict(self) -> Dict[str, nn.Module]:
        out = {}
        for b in self._blocks:
            out.setdefault(b.module_name, b.module)
        return out

    def fit(self, train_loader, override: bool = True, progress_bar: bool = False, distributed: bool = False) -> None:
        """Collect the Kronecker factors over ``train_loader`` (``(X, y)`` batches) at the
        model's current parameters (the MAP estimate) with
        ``vmfdist.curvature.compute_kfac``, eigendecompose them, and (EK-FAC) collect the
        second moments in the eigenbasis in a second pass over the data.

        ``override=False`` adds the data to the factors of the previous ``fit`` (K-FAC and the diagonal; not EK-FAC).
        The number of examples :math:`N` is counted from the batches.  For
        ``fisher_type="mc"`` the EK-FAC pass replays the labels of the first pass when the
        loader yields the batches in the same order.

        ``distributed=True`` (under an initialised ``torch.distributed`` process group): each rank
        passes its own shard of the data (e.g. through a ``DistributedSampler``); the sums of the
        factors, the EK-FAC / diagonal moments, the loss and :math:`N` are all-reduced, and the
        eigenbases are computed on rank 0 and broadcast, so that every rank holds the
        approximation of the whole data -- equal to rounding to one process fitting it all (for
        ``fisher_type="mc"`` each rank draws its own labels)."""
        owner = type(self).__name__
        world = ranks(distributed, owner)
        if not override and self._ekfac and not self._diag and self._fitted:
            raise ValueError(f"{owner}.fit(override=False) is not supported: the EK-FAC second moments of earlier "
                             f"data cannot be moved to the new eigenbasis; fit on all the data at once")
        if train_loader is None:
            raise ValueError(f"{owner}.fit: train_loader is None; pass an iterable of (inputs, targets) batches")
        self.model.eval()
        if not self._last_layer_found:
            self._find_last_layer(train_loader)
        fresh = override or self._sums is None
        if self._diag:
            return self._fit_diagonal(train_loader, fresh, world)
        layers = self._layers_dict()
        gen, fisher = self._label_generator(), self._collector_fisher
        gen_state = None if gen is None else gen.get_state()
        try:
            res = compute_kfac(self.model, self._data(train_loader), self.likelihood, sigma_noise=1.0,
                               fisher_type=fisher, kfac_approx=self.kfac_approx, mc_samples=self.mc_samples,
                               modules=list(layers.values()), generator=gen)
        except ValueError as e:
            if "yielded no batches" in str(e):
                raise ValueError(f"{owner}.fit: train_loader yielded no data") from None
            raise
        # nothing of the approximation changes before the new curvature is complete
        N_shard = res.num_data
        N_new = all_sum(N_shard, world)
        sums = {}
        for name, mod in layers.items():
            lf, old = res[name], None if fresh else self._sums[id(mod)]
            A, G = all_sum(lf.A * N_shard, world), all_sum(lf.G * N_shard, world)  # sums over the data
            sums[id(mod)] = KroneckerFactor(A, G) if old is None else KroneckerFactor(old.A + A, old.G + G)
        n_data = N_new if fresh else self.n_data + N_new
        factors = self._block_factors(sums, n_data)
        if world > 1:  # one eigenbasis for all ranks: rank 0's
            for f in factors:
                for k in ("d_a", "q_a", "d_g", "q_g"):
                    setattr(f, k, broadcast(getattr(f, k)))
        if self._ekfac:
            if gen is not None:
                gen.set_state(gen_state)
            collect_block_moments(self.model, self._blocks, factors, layers, self._data(train_loader),
                                  self.likelihood, fisher, self.mc_samples, gen)
            for f in factors:
                f.moments = all_sum(f.moments, world)
        loss = all_sum(res.loss, world)
        self._sums, self.n_data = sums, n_data
        self.loss = loss if fresh else self.loss + loss
        self.n_outputs = res.settings["num_outputs"]
        for b, f in zip(self._blocks, factors):
            b.factor = f
        self.mean = torch.cat([p.detach().reshape(-1) for p in self.params])
        self._fitted = True

    def _label_generator(self) -> Optional[torch.Generator]:
        """The generator of ``fisher_type="mc"``'s labels: the user's, or one seeded from torch's."""
        gen = self.generator
        if gen is None and self.fisher_type == "mc":
            gen = torch.Generator(device=self._device)
            gen.manual_seed(int(torch.randint(0, 2 ** 62, (1,))))
        return gen

    @property
    def _collector_fisher(self) -> str:
        """``fisher_type`` in vmfdist.curvature's naming (laplace-torch's "ggn" is its "type-2")."""
        return "type-2" if self.fisher_type == "ggn" else self.fisher_type

    def _block_factors(self, sums: Dict[int, KroneckerFactor], n_data: int) -> List[KroneckerFactor]:
        """Each block's factor -- ``G`` summed over the data, ``A`` averaged -- from the layers'
        summed factors (joint weight-and-bias layout, as ``vmfdist.curvature`` computes them),
        with its eigenbases."""
        out = []
        for b in self._blocks:
            s = sums[id(b.module)]
            kind = "joint" if b.kind == "weight" and b.module.bias is None else b.kind  # no bias column in A
            out.append(KroneckerFactor(s.A / n_data, s.G).block(kind).eigen())
        return out

    # ------------------------------------------------------------------------ the posterior
    def posterior(self) -> Dict[str, torch.distributions.Distribution]:
        """The posterior of each block as a distribution over its ``(out, in)`` parameter
        matrix (a bias is an ``(out, 1)`` matrix; a joint block's last column is the bias):
        :class:`~vmfdist.distributions.matrix_normal.EigenvalueCorrectedMatrixNormal` with bases
        :math:`Q_G, Q_A` and variances ``1 / (precision eigenvalues)``, or, for K-FAC with
        ``damping=True``, the :class:`~vmfdist.distributions.matrix_normal.MatrixNormal` with
        :math:`U = (\\sqrt h G + \\sqrt\\delta I)^{-1}` and :math:`V = (\\sqrt h A + \\sqrt\\delta I)^{-1}`."""
        self._check_fitted()
        return self._precision.posterior(self.mean, self._H_factor.detach(), self.prior_precision.detach())

    def sample(self, n_samples: int = 100, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``n_samples`` draws :math:`\\theta\\sim\\mathcal N(\\theta_*, P^{-1})`, shape
        ``(n_samples, n_params)`` in parameter order; each block is drawn by its posterior
        distribution (the compiled Kronecker-eigenbasis sampler, never a dense Cholesky)."""
        self._check_fitted()
        if not (isinstance(n_samples, int) and n_samples >= 1):
            raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
        return self._precision.sample(n_samples, self.mean, self._H_factor.detach(), self.prior_precision.detach(),
                                      generator)

    # ------------------------------------------------------------------------ marginal likelihood
    @property
    def log_likelihood(self) -> torch.Tensor:
        """:math:`\\log p(\\mathcal D\\mid\\theta_*)` at temperature :math:`T`:
        :math:`-\\sum_n \\mathrm{CE}_n / T` (classification) or
        :math:`-\\frac{1}{2\\sigma^2T}\\sum_n\\|f_n - y_n\\|^2 - NK\\log(\\sigma\\sqrt{2\\pi})` (regression)."""
        self._check_fitted()
        if self.loss is None:
            raise ValueError("the log-likelihood needs the training loss: pass train_loader to from_curvature / "
                             "from_optimizer (or use fit)")
        factor = -self._H_factor
        if self.likelihood == "regression":
            c = self.n_data * self.n_outputs * torch.log(self.sigma_noise * math.sqrt(2 * math.pi))
            return factor * self.loss - c
        return factor * self.loss

    @property
    def scatter(self) -> torch.Tensor:
        """:math:`(\\theta_* - \\mu_0)^T P_0 (\\theta_* - \\mu_0)`."""
        self._check_fitted()
        return self._precision.prior_scatter(self.mean - self.prior_mean, self.prior_precision)

    @property
    def log_det_prior_precision(self) -> torch.Tensor:
        return self._precision.log_det_prior(self.prior_precision)

    @property
    def log_det_posterior_precision(self) -> torch.Tensor:
        self._check_fitted()
        return self._precision.log_det(self._H_factor, self.prior_precision)

    @property
    def log_det_ratio(self) -> torch.Tensor:
        return self.log_det_posterior_precision - self.log_det_prior_precision

    def log_marginal_likelihood(self, prior_precision: Optional[torch.Tensor] = None,
                                sigma_noise: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Laplace's approximation of the log evidence,
        :math:`\\log p(\\mathcal D\\mid\\theta_*) - \\tfrac12\\big(\\log\\det P - \\log\\det P_0
        + (\\theta_*-\\mu_0)^TP_0(\\theta_*-\\mu_0)\\big)`, differentiable in ``prior_precision``
        and ``sigma_noise`` (which, when given, replace the current values, as in laplace-torch)."""
        self._check_fitted()
        if prior_precision is not None:
            self.prior_precision = prior_precision
        if sigma_noise is not None:
            if self.likelihood != "regression":
                raise ValueError("sigma_noise can only be changed for regression")
            self.sigma_noise = sigma_noise
        return self.log_likelihood - 0.5 * (self.log_det_ratio + self.scatter)

    def square_norm(self, value: torch.Tensor) -> torch.Tensor:
        """:math:`(\\theta - \\theta_*)^T P (\\theta - \\theta_*)` for ``value`` ``(..., n_params)``."""
        self._check_fitted()
        return self._precision.square_norm(value - self.mean, self._H_factor, self.prior_precision)

    def log_prob(self, value: torch.Tensor, normalized: bool = True) -> torch.Tensor:
        """Log density of the Laplace posterior at ``value`` ``(..., n_params)``."""
        if not normalized:
            return -0.5 * self.square_norm(value)
        return (-0.5 * self._precision.dim * math.log(2 * math.pi) + 0.5 * self.log_det_posterior_precision
                - 0.5 * self.square_norm(value))

    # ------------------------------------------------------------------------ prior precision
    def optimize_prior_precision(self, pred_type: str = "glm", method: str = "marglik", n_steps: int = 100,
                                 lr: float = 1e-1, init_prior_prec: Union[float, torch.Tensor] = 1.0,
                                 prior_structure: str = "scalar", val_loader=None,
                                 loss: Optional[Callable] = None, log_prior_prec_min: float = -4,
                                 log_prior_prec_max: float = 4, grid_size: int = 100, link_approx: str = "probit",
                                 n_samples: int = 100, verbose: bool = False, progress_bar: bool = False,
                                 log_prior_prec_base: float = 10.0) -> None:
        """Choose the prior precision, as laplace-torch does.

        ``method="marglik"``: ``n_steps`` Adam steps (learning rate ``lr``) on
        :math:`\\log\\delta` maximising :meth:`log_marginal_likelihood`, from
        ``init_prior_prec`` with ``prior_structure`` ``"scalar"`` or ``"layerwise"`` (one per
        block).  ``method="gridsearch"``: the value on a log grid
        (``log_prior_prec_base ** linspace(min, max, grid_size)``) minimising a loss on
        ``val_loader``: by default the predictive's negative log-likelihood (for regression
        the Gaussian one, with variance ``f_var + sigma_noise**2``; laplace-torch's default
        there, the MSE of the mean, does not depend on the prior precision under the GLM
        predictive), or ``loss(prediction, y)``."""
        self._check_fitted()
        if pred_type not in _PRED_TYPES:
            raise ValueError(f"pred_type must be one of {_PRED_TYPES}, got {pred_type!r}")
        if method == "marglik":
            structures = self._prior_structures
            if prior_structure not in structures:
                raise ValueError(f"prior_structure must be one of {structures} for {type(self).__name__}, got "
                                 f"{prior_structure!r}" + ("" if "diag" in structures else " ('diag', one per "
                                                          "parameter, needs a diagonal or full posterior)"))
            init = init_prior_prec if isinstance(init_prior_prec, torch.Tensor) else torch.tensor(init_prior_prec)
            before = self.prior_precision
            self.prior_precision = init
            if self.prior_precision.numel() == 1 and prior_structure == "layerwise":
                self.prior_precision = self.prior_precision.expand(self.n_layers).clone()
            elif self.prior_precision.numel() == 1 and prior_structure == "diag":
                self.prior_precision = self.prior_precision.expand(self._precision.dim).clone()
            log_pp = self.prior_precision.log().detach().clone().requires_grad_(True)
            opt = torch.optim.Adam([log_pp], lr=lr)
            # the part of the negative log evidence that depends on the prior precision, for values of
            # the stored one's shape: not checked per step, the result is (by the setter, below)
            objective = self._precision.prior_objective(self._H_factor.detach(), self.mean - self.prior_mean)
            for _ in range(n_steps):
                opt.zero_grad()
                neg = objective(log_pp.exp())
                neg.backward()
                opt.step()
            found = log_pp.detach().exp()
            try:
                self.prior_precision = found
            except ValueError as e:  # not finite and positive
                self.prior_precision = before
                raise ValueError(f"optimize_prior_precision: the marginal-likelihood optimisation diverged (prior "
                                 f"precision {found.tolist()[:4]} after {n_steps} Adam steps of lr={lr}); try a "
                                 f"smaller lr") from e
        elif method == "gridsearch":
            if val_loader is None:
                raise ValueError("method='gridsearch' needs val_loader (an iterable of (inputs, targets) batches)")
            grid = torch.logspace(log_prior_prec_min, log_prior_prec_max, grid_size, base=log_prior_prec_base)
            self.prior_precision = self._gridsearch(grid, val_loader, pred_type, link_approx, n_samples, loss)
        else:
            raise ValueError(f"method must be 'marglik' or 'gridsearch', got {method!r}")
        if verbose:
            print(f"Optimized prior precision is {self.prior_precision}.")

    def _gridsearch(self, grid, val_loader, pred_type, link_approx, n_samples, loss):
        data = [unpack_batch(b, "val_loader") for b in val_loader]
        if not data:
            raise ValueError("val_loader yielded no data")
        # the Jacobian projections do not depend on the prior precision: compute them once
        cache = None
        if pred_type == "glm":
            cache = [self._glm_terms(X.to(self._device)) for X, _ in data]
        results = []
        for pp in grid:
            self.prior_precision = pp
            try:
                preds, ys = [], []
                for j, (X, y) in enumerate(data):
                    if cache is not None:
                        f_mu, f_var = cache[j][0], self._glm_variance(cache[j])
                        pred = (f_mu, f_var) if self.likelihood == "regression" else link(f_mu, f_var, link_approx,
                                                                                           n_samples)
                    else:
                        pred = self(X, pred_type=pred_type, link_approx=link_approx, n_samples=n_samples)
                    preds.append(pred)
                    ys.append(y.to(self._device))
                results.append(float(validation_loss(preds, ys, loss, self.sigma_noise)))
            except (torch.linalg.LinAlgError, ValueError):
                results.append(math.inf)
        best = min(range(len(results)), key=lambda k: (not math.isfinite(results[k]), results[k]))
        return grid[best]


class KFACLaplace(_BaseLaplace):
    """K-FAC Laplace approximation (Ritter et al. 2018) with laplace-torch's interface.

    Args:
        model: the trained network (its current parameters are the MAP estimate).  Every
            parameter that requires a gradient is covered and must belong to a
            ``torch.nn.Linear`` or ``torch.nn.Conv2d`` layer.
        likelihood: ``"classification"`` (cross-entropy on logits) or ``"regression"``
            (Gaussian with standard deviation ``sigma_noise``).
        sigma_noise: observation noise (regression only).
        prior_precision: :math:`\\delta`, a number or a tensor with one value or one per
            block (blocks in ``model.parameters()`` order; see :attr:`blocks`).
        prior_mean: a number or an ``(n_params,)`` vector.
        temperature: likelihood temperature :math:`T` (curvature and log-likelihood / T).
        enable_backprop: keep the graph of the GLM predictive (gradients to ``x``).
        damping: the sqrt-damped form :math:`(\\sqrt hG+\\sqrt\\delta I)\\otimes(\\sqrt hA+\\sqrt\\delta I)`
            (laplace-torch's ``damping``) instead of the exact prior in the eigenbasis.
        fisher_type: ``"ggn"`` (exact GGN factors, the default, as laplace-torch), ``"mc"``
            (true Fisher, ``mc_samples`` targets drawn from the model with ``generator``) or
            ``"empirical"``.
        kfac_approx: ``"expand"`` (default) or ``"reduce"`` for layers with weight sharing
            (convolutions, sequences).
        separate_weight_and_bias: weights and biases in separate blocks (default, as
            laplace-torch); ``False`` gives one block per layer with the bias as an appended
            input of 1 (Ritter et al.).
        modules: the layers covered (modules or names); the other parameters stay at their values.
        subset_of_weights: laplace-torch's choice of parameters: ``"all"`` (the default here;
            every trainable layer, or ``modules``), ``"last_layer"`` (the last layer with trainable
            parameters that the forward pass runs, found on the first batch of ``fit``; the
            default of :class:`KronLLLaplace` and of :func:`~vmfdist.laplace.Laplace`) or
            ``"subnetwork"`` (``modules`` required).
        last_layer_name: the last layer's module name (``subset_of_weights="last_layer"``),
            instead of finding it from the forward pass.

    Supported: ``nn.Linear`` / ``nn.Conv2d`` (groups 1, zero padding) parameters in float32 or
    float64; tied parameters, other trainable modules and float16 are refused by name.  ``fit``
    takes ``(inputs, targets)`` batches (class indices in ``[0, outputs)``, or targets of the
    output's shape); empty batches are skipped; a fit that raises changes nothing.
    """


class EKFACLaplace(_BaseLaplace):
    """EK-FAC Laplace approximation: the K-FAC eigenbasis with the eigenvalues
    :math:`\\lambda_i\\mu_j` replaced by the second moments of the per-example gradients
    (GGN columns for ``fisher_type="ggn"``) in that basis (George et al. 2018), so that
    the likelihood term is the exact diagonal of each block's curvature in the basis.
    Same arguments as :class:`KFACLaplace` (no ``damping``); ``fit`` makes a second pass
    over the data."""

    _ekfac = True


#: laplace-torch's name for the all-weights K-FAC Laplace
KronLaplace = KFACLaplace


class KronLLLaplace(KFACLaplace):
    """laplace-torch's ``KronLLLaplace``: :class:`KFACLaplace` over the last layer (the last layer
    with trainable parameters that the forward pass runs, found on the first batch of ``fit``
    unless ``last_layer_name`` is given)."""

    _default_subset = "last_layer"


class EKFACLLLaplace(EKFACLaplace):
    """:class:`EKFACLaplace` over the last layer (as :class:`KronLLLaplace`)."""

    _default_subset = "last_layer"
