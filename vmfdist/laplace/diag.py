"""The diagonal Laplace approximation (laplace-torch's ``DiagLaplace`` / ``DiagLLLaplace``): the exact
diagonal of the GGN, from the Kronecker classes' collection pass (:mod:`vmfdist.laplace.kron`)."""
from __future__ import annotations

import torch

from ..curvature import KroneckerFactor
from .blocks import all_sum, collect_block_moments
from .kron import _BaseLaplace

__all__ = ["DiagLaplace", "DiagLLLaplace"]


class DiagLaplace(_BaseLaplace):
    r"""Diagonal Laplace approximation (laplace-torch's ``DiagLaplace``): the likelihood term is
    the exact diagonal of the GGN, :math:`\sum_n\sum_c (\nabla_\theta \ell_{n,c})^{\odot 2}` over
    the backpropagated columns of the loss-Hessian square root -- EK-FAC's second moments in the
    identity basis, from the same collection pass (per-layer inputs and output gradients; no
    per-example Jacobians), so it costs one pass and scales as K-FAC does.  The prior precision may
    also be one value per parameter (laplace-torch's ``prior_structure="diag"``).  Same arguments as
    :class:`KFACLaplace` (no ``damping``); ``fit(override=False)`` adds data."""

    _ekfac = True  # the precision's eigenvalues are the moments, in a basis (here the identity)
    _diag = True
    _prior_structures = ("scalar", "layerwise", "diag")

    def _fit_diagonal(self, train_loader, fresh: bool, world: int = 1) -> None:
        """:class:`DiagLaplace`'s fit: the exact diagonal of the GGN (the EK-FAC second moments in the
        identity basis), in one pass over the data."""
        owner = type(self).__name__
        layers = self._layers_dict()
        factors = [KroneckerFactor(None, None) for _ in self._blocks]  # bases None: the identity
        seen, loss, outputs = collect_block_moments(self.model, self._blocks, factors, layers, self._data(train_loader),
                                                    self.likelihood, self._collector_fisher, self.mc_samples,
                                                    self._label_generator())
        if seen == 0:
            raise ValueError(f"{owner}.fit: train_loader yielded no data" + (" on this rank" if world > 1 else ""))
        seen, loss = all_sum(seen, world), all_sum(loss, world)
        for f in factors:
            f.moments = all_sum(f.moments, world)
        if not fresh:
            for b, f in zip(self._blocks, factors):
                f.moments = f.moments + b.factor.moments
        for b, f in zip(self._blocks, factors):
            b.factor = f
        self._sums = {}
        self.n_data = seen if fresh else self.n_data + seen
        self.loss = loss if fresh else self.loss + loss
        self.n_outputs = outputs
        self.mean = torch.cat([p.detach().reshape(-1) for p in self.params])
        self._fitted = True

    @classmethod
    def from_curvature(cls, *args, **kwargs):
        raise ValueError("DiagLaplace has no Kronecker factors to take over: fit it on the data "
                         "(one pass, the exact GGN diagonal)")

    @classmethod
    def from_optimizer(cls, *args, **kwargs):
        raise ValueError("DiagLaplace has no Kronecker factors to take over: fit it on the data "
                         "(one pass, the exact GGN diagonal)")



class DiagLLLaplace(DiagLaplace):
    """laplace-torch's ``DiagLLLaplace``: :class:`DiagLaplace` over the last layer (as
    :class:`KronLLLaplace`)."""

    _default_subset = "last_layer"
