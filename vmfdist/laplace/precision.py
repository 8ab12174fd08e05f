r"""The Kronecker-factored posterior precision of a Laplace approximation: the linear algebra
(eigenvalues, log-determinant, quadratic forms, posterior distributions, samples, functional
variances) with no knowledge of data, likelihoods or the laplace-torch interface.

Block :math:`i` (see :mod:`vmfdist.laplace.blocks`) has the precision

.. math::  P_i = (Q_G\otimes Q_A)\,\mathrm{diag}\big(\mathrm{vec}(h\,\Lambda_i + \delta_i)\big)\,(Q_G\otimes Q_A)^T

with :math:`\Lambda_i = d_G d_A^T` (K-FAC; a bias block's input factor is the number
:math:`d_A`), the EK-FAC second moments, or -- K-FAC with ``damping`` -- the
:math:`\sqrt{\cdot}`-damped Kronecker form with eigenvalues
:math:`(\sqrt h\,d_G + \sqrt{\delta_i})(\sqrt h\,d_A + \sqrt{\delta_i})^T`.  ``h`` (the likelihood
factor :math:`1/(\sigma^2T)`) and the prior precisions ``pp`` (one value, or one per block) are
arguments of every method, so that the caller may change them freely.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from ..distributions import EigenvalueCorrectedMatrixNormal, MatrixNormal
from .blocks import Block, ParameterLayout

__all__ = ["KroneckerPrecision", "checked_prior_precision", "checked_prior_mean", "checked_sigma_noise"]


class KroneckerPrecision:
    """The posterior precision over ``blocks`` (each with its fitted
    :class:`~vmfdist.curvature.KroneckerFactor`), laid out in the parameter vector by ``layout``."""

    def __init__(self, blocks: List[Block], layout: ParameterLayout, ekfac: bool, damping: bool):
        self.blocks = blocks
        self.layout = layout
        self.dim = layout.numel  # the posterior's dimension
        self.ekfac = bool(ekfac)
        self.damping = bool(damping) and not self.ekfac

    def per_parameter(self, pp: torch.Tensor) -> bool:
        """Whether ``pp`` holds one prior precision per parameter (diagonal posteriors only)."""
        return pp.numel() not in (1, len(self.blocks))

    def prior_diag(self, pp: torch.Tensor) -> torch.Tensor:
        """The prior precision of every parameter, ``(n_params,)`` in parameter order."""
        if self.per_parameter(pp):
            return pp
        out = torch.empty(self.dim, device=pp.device, dtype=pp.dtype)
        for i, b in enumerate(self.blocks):
            for p in b.params:
                self.layout.part(p, out)[...] = self.delta(pp, i)
        return out

    def delta(self, pp: torch.Tensor, i: int) -> torch.Tensor:
        """The prior precision of block ``i`` from ``pp``: one value, one per block, or (one per
        parameter) the block's ``(out, in_blk)`` matrix of them."""
        if pp.numel() == 1:
            return pp[0]
        if not self.per_parameter(pp):
            return pp[i]
        return self.layout.block_matrix(self.blocks[i], pp)

    def likelihood_eigenvalues(self, b: Block) -> torch.Tensor:
        """:math:`\\Lambda` of a block (without ``h``), ``(out, in_blk)``; for a bias block ``(out,)``."""
        f = b.factor
        if self.ekfac:
            return f.moments
        if b.kind == "bias":
            return f.d_g * f.d_a[0]
        return torch.outer(f.d_g, f.d_a)

    def eigenvalues(self, i: int, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Eigenvalues of block ``i``'s posterior precision, ``(out, in_blk)``."""
        b = self.blocks[i]
        f = b.factor
        if self.ekfac:
            return h * f.moments + delta
        if b.kind == "bias":  # one factor (laplace-torch's bias block), never sqrt-damped
            return (h * f.d_g * f.d_a[0])[:, None] + delta
        if self.damping:
            sh, sd = h.sqrt(), delta.sqrt()
            return torch.outer(sh * f.d_g + sd, sh * f.d_a + sd)
        return h * torch.outer(f.d_g, f.d_a) + delta

    def all_eigenvalues(self, h: torch.Tensor, pp: torch.Tensor):
        """``eigenvalues(i)`` of every block, in order."""
        return [self.eigenvalues(i, h, self.delta(pp, i)) for i in range(len(self.blocks))]

    # ---- determinants and quadratic forms --------------------------------------------------------------------
    def log_det(self, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`\\log\\det P`."""
        return sum(e.log().sum() for e in self.all_eigenvalues(h, pp))

    def log_det_prior(self, pp: torch.Tensor) -> torch.Tensor:
        """:math:`\\log\\det P_0` of the diagonal prior."""
        if self.per_parameter(pp):
            return pp.log().sum()
        return sum(b.numel * self.delta(pp, i).log() for i, b in enumerate(self.blocks))

    def prior_scatter(self, d: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`d^T P_0 d` for a parameter vector ``d``."""
        if self.per_parameter(pp):
            return (pp * d.square()).sum()
        total = 0.0
        for i, b in enumerate(self.blocks):
            total = total + self.delta(pp, i) * self.layout.block_square_sum(b, d)
        return total

    def square_norm(self, d: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`d^T P d` for ``d`` ``(..., n_params)``."""
        total = 0.0
        for r, eig in self._in_eigenbasis(d, h, pp):
            total = total + (r.square() * eig).sum((-2, -1))
        return total

    def _in_eigenbasis(self, vec: torch.Tensor, h: torch.Tensor, pp: torch.Tensor):
        """Per block: ``vec[..., n_params]``'s block matrices in the Kronecker eigenbasis,
        :math:`Q_G^T V Q_A`, and the block's precision eigenvalues."""
        for i, b in enumerate(self.blocks):
            f = b.factor
            m = self.layout.block_matrix(b, vec)
            if f.q_g is not None:  # (None: the identity basis of a diagonal posterior)
                m = f.q_g.T @ m @ f.q_a
            yield m, self.eigenvalues(i, h, self.delta(pp, i))

    def prior_objective(self, h: torch.Tensor, d: torch.Tensor):
        """``pp -> (log det P - log det P0 + d^T P0 d) / 2`` for the fixed likelihood factor ``h`` and
        offset ``d = mean - prior_mean``.  Without the sqrt-damped form, all likelihood eigenvalues
        are concatenated once, so each evaluation is a few vector operations instead of a loop over
        the blocks."""
        if self.damping:
            def general(pp):
                return 0.5 * (self.log_det(h, pp) - self.log_det_prior(pp) + self.prior_scatter(d, pp))
            return general
        lam, idx, sq, n = [], [], [], []
        for i, b in enumerate(self.blocks):
            ev = self.likelihood_eigenvalues(b)
            lam.append(h * ev.reshape(-1))
            idx.append(torch.full((ev.numel(),), i, dtype=torch.long, device=ev.device))
            sq.append(self.layout.block_square_sum(b, d))
            n.append(float(b.numel))
        lam, idx = torch.cat(lam), torch.cat(idx)
        sq = torch.stack(sq).detach()
        n = torch.tensor(n, dtype=lam.dtype, device=lam.device)
        n_blocks = len(self.blocks)
        d_sq = d.detach().square()
        n_all, sq_all = float(n.sum()), sq.sum()

        def fast(pp):
            if self.per_parameter(pp):  # lam is in block-matrix order: so are the prior precisions
                delta = torch.cat([self.layout.block_matrix(b, pp).reshape(-1) for b in self.blocks])
                return 0.5 * (torch.log(lam + delta).sum() - pp.log().sum() + (pp * d_sq).sum())
            if pp.numel() == 1:  # one prior precision (the default): no gather, whose backward is a scatter
                return 0.5 * (torch.log(lam + pp).sum() - n_all * pp.log().sum() + (pp * sq_all).sum())
            delta = pp.expand(n_blocks)
            return 0.5 * (torch.log(lam + delta[idx]).sum() - (n * delta.log()).sum() + (delta * sq).sum())
        return fast

    # ---- distributions and samples ---------------------------------------------------------------------------
    def posterior(self, mean: torch.Tensor, h: torch.Tensor, pp: torch.Tensor
                  ) -> Dict[str, torch.distributions.Distribution]:
        """Each block's posterior over its ``(out, in_blk)`` matrix, by block name:
        :class:`~vmfdist.distributions.matrix_normal.EigenvalueCorrectedMatrixNormal` with bases
        :math:`Q_G, Q_A` and variances ``1 / eigenvalues``, or, for the sqrt-damped K-FAC form, the
        :class:`~vmfdist.distributions.matrix_normal.MatrixNormal` with
        :math:`U = (\\sqrt h G + \\sqrt\\delta I)^{-1}`, :math:`V = (\\sqrt h A + \\sqrt\\delta I)^{-1}`."""
        out = {}
        for i, b in enumerate(self.blocks):
            f = b.factor
            loc = self.layout.block_matrix(b, mean)
            delta = self.delta(pp, i)
            if self.damping and b.kind != "bias":
                sd = delta.sqrt()
                U = (f.q_g / (h.sqrt() * f.d_g + sd)) @ f.q_g.T
                V = (f.q_a / (h.sqrt() * f.d_a + sd)) @ f.q_a.T
                out[b.name] = MatrixNormal(loc, row_covariance=0.5 * (U + U.T), column_covariance=0.5 * (V + V.T))
            else:
                var = 1.0 / self.eigenvalues(i, h, delta)
                q_g, q_a = f.q_g, f.q_a
                if q_g is None:  # a diagonal posterior: the identity bases
                    q_g = torch.eye(b.out_dim, dtype=loc.dtype, device=loc.device)
                    q_a = torch.eye(b.in_dim, dtype=loc.dtype, device=loc.device)
                out[b.name] = EigenvalueCorrectedMatrixNormal(loc, q_g, q_a, var)
        return out

    def sample(self, n_samples: int, mean: torch.Tensor, h: torch.Tensor, pp: torch.Tensor,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(n_samples, n_params)`` draws, each block by its posterior distribution (the compiled
        Kronecker-eigenbasis sampler, never a dense Cholesky)."""
        out = torch.empty((n_samples, self.layout.numel), dtype=mean.dtype, device=mean.device)
        if all(b.factor.q_g is None for b in self.blocks):  # diagonal: mean + eps / sqrt(precision)
            for i, b in enumerate(self.blocks):
                sd = self.eigenvalues(i, h, self.delta(pp, i)).rsqrt()
                eps = torch.randn((n_samples,) + tuple(sd.shape), dtype=sd.dtype, device=sd.device,
                                  generator=generator)
                self.layout.scatter(b, self.layout.block_matrix(b, mean) + eps * sd, out)
            return out
        for b, d in zip(self.blocks, self.posterior(mean, h, pp).values()):
            self.layout.scatter(b, d.sample((n_samples,), generator=generator), out)
        return out

    # ---- functional variances -------------------------------------------------------------------------------
    def functional_variance(self, Js: torch.Tensor, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """:math:`J P^{-1} J^T` for Jacobians ``(batch, outputs, n_params)``."""
        f_var = 0.0
        for r, eig in self._in_eigenbasis(Js, h, pp):
            f_var = f_var + torch.einsum("bkoj,bloj->bkl", r, r / eig)
        return f_var

    def glm_variance(self, f: torch.Tensor, terms, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """``(batch, outputs, outputs)`` functional variances from the rotated output Jacobians
        ``terms`` (one ``(u, v)`` per block, see ``KFACLaplace._glm_terms``)."""
        B, K = f.shape
        f_var = torch.zeros((B, K, K), dtype=f.dtype, device=f.device)
        for i, (u, v) in enumerate(terms):
            d = 1.0 / self.eigenvalues(i, h, self.delta(pp, i))
            if v is not None:  # u (K, B, out), v (B, in): J_{nk} = (Q_G^T d_{nk}) (Q_A^T a_n)^T
                c = v.square() @ d.T  # (B, out)
                f_var = f_var + torch.einsum("kbo,lbo->bkl", u, u * c)
            else:
                f_var = f_var + torch.einsum("kboj,lboj->bkl", u, u * d)
        return f_var

    def glm_covariance(self, f: torch.Tensor, terms, h: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        """The joint ``(batch * outputs)`` square functional covariance."""
        B, K = f.shape
        cov = torch.zeros((B, K, B, K), dtype=f.dtype, device=f.device)
        for i, (u, v) in enumerate(terms):
            d = 1.0 / self.eigenvalues(i, h, self.delta(pp, i))
            J = torch.einsum("kbo,bj->kboj", u, v) if v is not None else u
            cov = cov + torch.einsum("kboj,lmoj->bkml", J, J * d)
        return cov.reshape(B * K, B * K)


# ---- the hyper-parameters, checked ------------------------------------------------------------------------------
def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def checked_prior_precision(value, block_names: List[str], device, dtype, n_params: Optional[int] = None
                            ) -> torch.Tensor:
    """``prior_precision`` as a 1-d tensor of one value, one per block or (``n_params`` given: a
    diagonal posterior) one per parameter, finite and positive."""
    name, n_blocks = "prior_precision", len(block_names)
    if isinstance(value, torch.Tensor):
        pp = value.to(device=device, dtype=dtype)
        if pp.dim() == 0:
            pp = pp.reshape(1)
        elif pp.dim() != 1:
            raise ValueError(f"{name} must be a scalar or a 1-d tensor, got shape {tuple(pp.shape)}")
    elif _number(value):
        pp = torch.tensor([float(value)], device=device, dtype=dtype)
    else:
        raise ValueError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    if pp.numel() not in (1, n_blocks) and (n_params is None or pp.numel() != n_params):
        per_param = "" if n_params is None else f" or one per parameter ({n_params})"
        raise ValueError(f"{name} must hold 1 value or one per block ({n_blocks} blocks: {block_names}){per_param}, "
                         f"got {pp.numel()} values")
    if not bool(torch.isfinite(pp).all()) or not bool((pp > 0).all()):
        raise ValueError(f"{name} must be finite and positive, got {pp.detach().cpu().tolist()}")
    return pp


def checked_prior_mean(value, n_params: int, device, dtype) -> torch.Tensor:
    """``prior_mean`` as a scalar tensor or an ``(n_params,)`` vector."""
    if isinstance(value, torch.Tensor):
        pm = value.to(device=device, dtype=dtype)
        if pm.dim() > 1 or (pm.dim() == 1 and pm.numel() not in (1, n_params)):
            raise ValueError(f"prior_mean must be a scalar or a vector of length n_params = {n_params}, got shape "
                             f"{tuple(pm.shape)}")
        return pm
    if _number(value):
        return torch.tensor(float(value), device=device, dtype=dtype)
    raise ValueError(f"prior_mean must be a number or a tensor, got {type(value).__name__}")


def checked_sigma_noise(value, likelihood: str, device, dtype) -> torch.Tensor:
    """``sigma_noise`` as a finite positive 0-dim tensor (1 unless ``likelihood`` is regression)."""
    if isinstance(value, torch.Tensor):
        s = value.to(device=device, dtype=dtype)
        if s.numel() != 1 or s.dim() > 1:
            raise ValueError(f"sigma_noise must be a scalar (homoscedastic noise), got shape {tuple(s.shape)}")
        s = s.reshape(())
    elif _number(value):
        s = torch.tensor(float(value), device=device, dtype=dtype)
    else:
        raise ValueError(f"sigma_noise must be a number or a tensor, got {type(value).__name__}")
    if not bool(torch.isfinite(s)) or not bool(s > 0):
        raise ValueError(f"sigma_noise must be finite and positive, got {float(s)}")
    if likelihood != "regression" and float(s) != 1.0:
        raise ValueError("sigma_noise != 1 is only available for regression")
    return s
