"""Laplace approximations from Kronecker factors computed elsewhere -- a trained noisy K-FAC /
EK-FAC optimizer's, or any ``vmfdist.curvature`` result -- with no curvature pass of their own
(a mixin of the Kronecker Laplace classes, :mod:`vmfdist.laplace.kron`)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch

from ..curvature import KroneckerFactor, batch_nll, check_output, require_finite
from .blocks import given_block_moments, given_layer_factor


class FromFactorsMixin:
    """``from_curvature`` and ``from_optimizer`` of the Kronecker Laplace classes."""

    @classmethod
    def from_curvature(cls, model: torch.nn.Module, likelihood: str, curvature, train_loader=None, *,
                       num_data: Optional[int] = None, **kwargs):
        r"""A Laplace approximation from Kronecker factors computed elsewhere, with no
        curvature pass of its own.

        Args:
            model: the network at the MAP estimate.
            likelihood: ``"classification"`` or ``"regression"``.
            curvature: a ``vmfdist.curvature.KFACResult`` (from
                ``compute_kfac``) or a mapping from layer names to
                objects or dicts with ``A`` and ``G``: the curvature *per data point*
                :math:`G\otimes A` in curvature's layout (the bias as an appended input of 1),
                for a Gaussian likelihood of standard deviation ``curvature.sigma_noise`` (1
                for a mapping).  For :class:`EKFACLaplace` also the second moments
                ``eigenvalues`` (or ``S``) in the basis ``q_g``, ``q_a`` (joint blocks only).
            train_loader: the training data, for the log-likelihood term of the evidence (one
                forward pass, no backward).  Without it, :meth:`log_marginal_likelihood` is not
                available, but the posterior, the predictive and ``optimize_prior_precision``
                (marginal likelihood up to the constant log-likelihood) are.
            num_data: :math:`N`; required unless ``curvature`` carries it.
            **kwargs: as for the constructor (``separate_weight_and_bias``, ``prior_precision``,
                ``sigma_noise``, ``temperature``, ...).  Only the layers in ``curvature`` are covered.
        """
        layers = curvature.layers if hasattr(curvature, "layers") else curvature
        if not hasattr(layers, "items") or len(layers) == 0:
            raise ValueError("curvature must be a vmfdist.curvature.KFACResult or a non-empty mapping from layer "
                             "names to factors")
        N = num_data if num_data is not None else getattr(curvature, "num_data", None)
        if N is None:
            raise ValueError("num_data (the number of training examples N) is required: the factors are per data "
                             "point and the posterior precision is N * G (x) A + prior")
        if not (isinstance(N, int) and N >= 1):
            raise ValueError(f"num_data must be a positive int, got {N!r}")
        c_like = getattr(curvature, "likelihood", likelihood)
        if c_like != likelihood:
            raise ValueError(f"likelihood {likelihood!r} does not match the curvature's likelihood {c_like!r}")
        c_sigma2 = float(getattr(curvature, "sigma_noise", 1.0)) ** 2
        kwargs.setdefault("separate_weight_and_bias", False)
        la = cls(model, likelihood, modules=list(layers.keys()), **kwargs)
        sums = {}
        for name, mod in la._layers_dict().items():
            f = given_layer_factor(name, layers[name], mod, la._dtype)
            sums[id(mod)] = KroneckerFactor(f.A * N, f.G * (N * c_sigma2))
        factors = la._block_factors(sums, N)
        if la._ekfac:
            for b, bf in zip(la._blocks, factors):
                bf.q_g, bf.q_a, moments = given_block_moments(b, layers[b.module_name], la._dtype)
                bf.moments = moments * (N * c_sigma2)
                require_finite(b.name, "EK-FAC second moments", bf.moments)
        loss = None
        if train_loader is not None:
            loss, seen = 0.0, 0
            with torch.no_grad():
                for X, y in la._data(train_loader):
                    out = check_output(la.model(X))
                    loss = loss + batch_nll(out, y, la.likelihood)
                    la.n_outputs = out.shape[1]
                    seen += out.shape[0]
            if seen == 0:
                raise ValueError("train_loader yielded no data")
        for b, bf in zip(la._blocks, factors):
            b.factor = bf
        la._sums, la.n_data, la.loss = sums, N, loss
        la.mean = torch.cat([p.detach().reshape(-1) for p in la.params])
        la._fitted = True
        return la

    @classmethod
    def from_optimizer(cls, optimizer, train_loader=None, **kwargs):
        r"""A Laplace approximation that reuses a trained noisy K-FAC / EK-FAC optimizer's
        (``vmfdist.optim``) Kronecker factors: no curvature pass.

        The optimizer's variational posterior has precision
        :math:`\frac N\lambda\,(G\otimes A) + \frac1\eta I` (KL weight :math:`\lambda`, prior
        variance :math:`\eta`), so the defaults are ``prior_precision = 1/prior_var`` and
        ``temperature = kl_weight``, with the optimizer's ``sigma_noise``; any of them can be
        overridden.  The prior is added exactly in the eigenbasis (the optimizer's factored
        damping with :math:`\pi` is not reproduced).  :class:`EKFACLaplace` needs a
        ``NoisyEKFAC`` (its second moments, in its eigenbasis); :class:`KFACLaplace` takes
        either.  ``train_loader`` as for :meth:`from_curvature`."""
        for attr in ("model", "kronecker_factors", "num_data", "likelihood"):
            if not hasattr(optimizer, attr):
                raise TypeError(f"from_optimizer expects a vmfdist.optim NoisyKFAC / NoisyEKFAC optimizer (missing "
                                f"attribute {attr!r}), got {type(optimizer).__name__}")
        hp = getattr(optimizer, "hp", {})
        sigma = float(getattr(optimizer, "sigma_noise", 1.0))
        factors = optimizer.kronecker_factors()
        if cls._ekfac and any(f.moments is None for f in factors.values()):
            raise ValueError("EKFACLaplace.from_optimizer needs a NoisyEKFAC optimizer (second moments in "
                             "the eigenbasis); use KFACLaplace.from_optimizer for NoisyKFAC")
        curv = SimpleNamespace(layers=factors, num_data=optimizer.num_data, likelihood=optimizer.likelihood,
                               sigma_noise=sigma)  # the optimizer's factors, per data point, for its sigma_noise
        if "prior_var" in hp:
            kwargs.setdefault("prior_precision", 1.0 / hp["prior_var"])
        if hp.get("kl_weight", 0) > 0:
            kwargs.setdefault("temperature", float(hp["kl_weight"]))
        if optimizer.likelihood == "regression":
            kwargs.setdefault("sigma_noise", sigma)
        return cls.from_curvature(optimizer.model, optimizer.likelihood, curv, train_loader, **kwargs)
