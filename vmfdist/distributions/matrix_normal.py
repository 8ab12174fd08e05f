r"""Matrix-variate Gaussians: :class:`MatrixNormal` (noisy K-FAC) and
:class:`EigenvalueCorrectedMatrixNormal` (EMVG, noisy EK-FAC).

A random matrix :math:`W` of shape ``(out, in)`` with :math:`\mathrm{vec}` taken
**row-major** (``W.reshape(-1)``), so that :math:`\mathrm{vec}(A X B^T) = (A\otimes B)\,\mathrm{vec}(X)`
with ``torch.kron``'s :math:`\otimes`:

* ``MatrixNormal(M, U, V)``: :math:`W = M + A E B^T`, :math:`U = AA^T` (``out x out``, among
  rows), :math:`V = BB^T` (``in x in``, among columns), :math:`E` standard normal, so
  :math:`\mathrm{Cov}(\mathrm{vec}\,W) = U\otimes V`.
* ``EigenvalueCorrectedMatrixNormal(M, Q_out, Q_in, S)``: :math:`W = M + Q_{out}(E\odot S^{1/2})Q_{in}^T`
  with orthogonal bases, so :math:`\mathrm{Cov}(\mathrm{vec}\,W) = (Q_{out}\otimes Q_{in})\,
  \mathrm{diag}(\mathrm{vec}\,S)\,(Q_{out}\otimes Q_{in})^T` (George et al. 2018; Bae et al.,
  appendix B).

Nothing here forms an ``(out*in) x (out*in)`` matrix.  The identities used, each
tested against dense linear algebra in ``tests/test_kron.py`` (:math:`U` is
:math:`n\times n`, :math:`V` is :math:`m\times m`; here :math:`n` = out, :math:`m` = in):

* :math:`\det(U\otimes V) = \det(U)^m\det(V)^n` (the ELBO notes, §3.3, swap the
  exponents), so :math:`\tfrac12\log\det(U\otimes V) = m\sum_i\log A_{ii} + n\sum_j\log B_{jj}`;
* :math:`(U\otimes V)^{-1} = U^{-1}\otimes V^{-1}` and
  :math:`\mathrm{vec}(D)^T(U\otimes V)^{-1}\mathrm{vec}(D) = \|A^{-1} D B^{-T}\|_F^2`;
* :math:`\mathrm{tr}\big((U_p\otimes V_p)^{-1}(U_q\otimes V_q)\big) = \mathrm{tr}(U_p^{-1}U_q)\,\mathrm{tr}(V_p^{-1}V_q)`,
  :math:`\mathrm{tr}(U_p^{-1}U_q) = \|A_p^{-1}A_q\|_F^2`;
* :math:`\mathrm{diag}(U\otimes V) = \mathrm{vec}(\mathrm{diag}(U)\,\mathrm{diag}(V)^T)`;
* :math:`\mathrm{diag}\big((Q_o\otimes Q_i)\mathrm{diag}(\mathrm{vec}\,S)(Q_o\otimes Q_i)^T\big)
  = \mathrm{vec}\big((Q_o\odot Q_o)\,S\,(Q_i\odot Q_i)^T\big)`;
"""
from __future__ import annotations

from numbers import Real
from typing import Optional

import torch
from torch.distributions import Distribution, constraints
from torch.distributions.utils import lazy_property

from .. import _torch_internals as internals
from ..linalg import kron_eigen_sample
from ._constants import LOG_2PI
from ._validation import as_real_tensor, check_value, validate_params

__all__ = ["MatrixNormal", "EigenvalueCorrectedMatrixNormal", "orthogonal"]



class _Orthogonal(constraints.Constraint):
    r"""Square matrices with :math:`Q^TQ = I` to a tolerance scaled by the dtype
    (:math:`10^{-8}` in float64, :math:`10^{-3}` in float32, :math:`10^{-2}` otherwise, on
    the largest entry of :math:`Q^TQ - I`)."""

    is_discrete = False
    event_dim = 2

    def check(self, value):
        if value.shape[-1] != value.shape[-2]:
            return torch.zeros(value.shape[:-2], dtype=torch.bool, device=value.device)
        tol = {torch.float64: 1e-8, torch.float32: 1e-3}.get(value.dtype, 1e-2)
        v = value.to(torch.promote_types(value.dtype, torch.float32))
        eye = torch.eye(v.shape[-1], dtype=v.dtype, device=v.device)
        return ((v.mT @ v - eye).abs().amax(dim=(-2, -1)) <= tol) if v.shape[-1] > 0 else torch.ones(
            v.shape[:-2], dtype=torch.bool, device=v.device)

    def __repr__(self):
        return "Orthogonal()"


#: The constraint on the bases of :class:`EigenvalueCorrectedMatrixNormal`: orthogonal square matrices, event dimension 2.
orthogonal = _Orthogonal()

_real_matrix = constraints.independent(constraints.real, 2)
_positive_matrix = constraints.independent(constraints.positive, 2)


def _as_float(name: str, x, like: Optional[torch.Tensor] = None) -> torch.Tensor:
    return as_real_tensor(name, x, dtype=None if like is None else like.dtype,
                          device=None if like is None else like.device)


def _check_trailing(name: str, t: torch.Tensor, rows: int, cols: int, what: str) -> None:
    if t.dim() < 2:
        raise ValueError(f"{name} must have at least 2 dimensions ({what}), got shape {tuple(t.shape)}")
    if tuple(t.shape[-2:]) != (rows, cols):
        raise ValueError(f"{name} must have trailing shape ({rows}, {cols}) ({what}), got shape {tuple(t.shape)}")


def _common(named: dict):
    """Common floating dtype, the common device (an error naming the odd argument) and
    the broadcast batch shape (an error naming the arguments)."""
    items = list(named.items())
    dev = items[0][1].device
    for name, t in items:
        if t.device != dev:
            raise ValueError(f"{name} must be on the same device as {items[0][0]}, got {t.device} and {dev}")
    dt = items[0][1].dtype
    for _, t in items[1:]:
        dt = torch.promote_types(dt, t.dtype)
    try:
        batch = torch.broadcast_shapes(*(t.shape[:-2] for _, t in items))
    except RuntimeError:
        shapes = ", ".join(f"{k} {tuple(t.shape[:-2])}" for k, t in items)
        raise ValueError(f"the batch shapes of the arguments do not broadcast: {shapes}") from None
    return dt, dev, batch


def _cholesky(name: str, cov: torch.Tensor) -> torch.Tensor:
    tril, info = torch.linalg.cholesky_ex(cov)
    msg = f"{name} is not positive definite (its Cholesky factorisation failed)"
    if torch.compiler.is_compiling():  # a data-dependent branch cannot be traced: check inside the graph
        internals.assert_async((info == 0).all(), msg)
    elif bool((info != 0).any()):
        raise ValueError(msg)
    return tril


def _tril_half_logdet(tril: torch.Tensor) -> torch.Tensor:
    """:math:`\\tfrac12\\log\\det(LL^T) = \\sum_i \\log L_{ii}`."""
    return tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)


def kron_half_logdet(row_tril: torch.Tensor, column_tril: torch.Tensor) -> torch.Tensor:
    r""":math:`\tfrac12\log\det(U\otimes V) = m\sum_i\log A_{ii} + n\sum_j\log B_{jj}` for
    :math:`U = AA^T` (:math:`n\times n`) and :math:`V = BB^T` (:math:`m\times m`), from
    :math:`\det(U\otimes V) = \det(U)^m\det(V)^n`."""
    n, m = row_tril.shape[-1], column_tril.shape[-1]
    return m * _tril_half_logdet(row_tril) + n * _tril_half_logdet(column_tril)


def kron_mahalanobis(row_tril: torch.Tensor, column_tril: torch.Tensor, diff: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{vec}(D)^T(U\otimes V)^{-1}\mathrm{vec}(D) = \|A^{-1}DB^{-T}\|_F^2` (two
    triangular solves; batch dimensions broadcast)."""
    y = torch.linalg.solve_triangular(row_tril, diff, upper=False)
    z = torch.linalg.solve_triangular(column_tril.mT, y, upper=True, left=False)
    return z.pow(2).sum((-2, -1))


def _tril_trace_ratio(p_tril: torch.Tensor, q_tril: torch.Tensor) -> torch.Tensor:
    """tr((L_p L_p^T)^{-1} L_q L_q^T) = |L_p^{-1} L_q|_F^2."""
    return torch.linalg.solve_triangular(p_tril, q_tril, upper=False).pow(2).sum((-2, -1))


def eigen_marginal_variance(q_out: torch.Tensor, q_in: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    r"""The diagonal of :math:`(Q_o\otimes Q_i)\,\mathrm{diag}(\mathrm{vec}\,S)\,(Q_o\otimes Q_i)^T`
    as an ``(out, in)`` matrix: :math:`(Q_o\odot Q_o)\,S\,(Q_i\odot Q_i)^T`."""
    return (q_out * q_out) @ variance @ (q_in * q_in).mT


def _factor_argument(side: str, cov, tril, n: int, loc: torch.Tensor, what: str):
    """One side's covariance argument of :class:`MatrixNormal` as ``(name, matrix, tril)``:
    the name given (``{side}_covariance`` or ``{side}_scale_tril``; the identity is reported
    as a ``scale_tril``), the matrix to store under that name, and its lower Cholesky factor
    when it is known without a factorisation (a scale_tril, a scalar, the identity), else None."""
    cov_name, tril_name = f"{side}_covariance", f"{side}_scale_tril"
    if cov is not None and tril is not None:
        raise ValueError(f"at most one of {cov_name} or {tril_name} may be given (neither means the identity)")
    if cov is None and tril is None:
        eye = torch.eye(n, dtype=loc.dtype, device=loc.device)
        return tril_name, eye, eye
    name = cov_name if tril is None else tril_name
    value = cov if tril is None else tril
    t = _as_float(name, value, loc)
    if t.dim() == 0:  # a scalar c: U = c I, factor sqrt(c) I (a scale_tril s: A = s I)
        # a Python number is checked on the host value (no device read-back, nothing for
        # torch.compile to break on); a 0-dim tensor as the Cholesky check of a matrix would be
        positive = value > 0 if isinstance(value, Real) else (t.device.type == "meta" or bool(t > 0))
        if not positive:
            raise ValueError(f"{name} given as a scalar must be positive, got {float(value)}")
        eye = torch.eye(n, dtype=t.dtype, device=t.device)
        return name, t * eye, (t.sqrt() if tril is None else t) * eye
    _check_trailing(name, t, n, n, what)
    return name, t, t if tril is not None else None


# ---------------------------------------------------------------------------------
class _KroneckerGaussian(Distribution):
    """What the two matrix-variate Gaussians share: mean and mode ``loc``; the density
    from the subclass's Mahalanobis term and half log-determinant; entropy; sampling
    through the subclass's ``rsample``."""

    support = _real_matrix
    has_rsample = True

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    def _half_logdet(self) -> torch.Tensor:  # 0.5 log det Cov(vec W), batch-shaped
        raise NotImplementedError

    def _mahalanobis(self, diff: torch.Tensor) -> torch.Tensor:  # vec(diff)^T Cov^{-1} vec(diff)
        raise NotImplementedError

    def _event_size(self) -> int:
        return self.event_shape[0] * self.event_shape[1]

    def log_prob(self, value):
        r""":math:`-\tfrac12\big(nm\log 2\pi + \log\det\mathrm{Cov} + \text{Mahalanobis term}\big)`."""
        check_value(type(self).__name__, value, self.batch_shape, self.event_shape)
        if self._validate_args:
            self._validate_sample(value)
        return -0.5 * (self._event_size() * LOG_2PI + self._mahalanobis(value - self.loc)) - self._half_logdet()

    def entropy(self):
        r""":math:`\tfrac{nm}{2}(1 + \log 2\pi) + \tfrac12\log\det\mathrm{Cov}(\mathrm{vec}\,W)`."""
        return (0.5 * self._event_size() * (1.0 + LOG_2PI) + self._half_logdet()).expand(self.batch_shape)

    def sample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        with torch.no_grad():
            return self.rsample(sample_shape, generator=generator)


# ---------------------------------------------------------------------------------
class MatrixNormal(_KroneckerGaussian):
    r"""Matrix normal distribution :math:`\mathcal{MN}(M, U, V)` of ``(out, in)`` matrices:
    :math:`W = M + AEB^T`, :math:`U = AA^T`, :math:`V = BB^T`,
    :math:`\mathrm{Cov}(\mathrm{vec}\,W) = U\otimes V` (row-major vec).

    Args:
        loc: the mean :math:`M`, shape ``(..., out, in)``.
        row_covariance: :math:`U`, ``(..., out, out)``, positive definite (among rows), or a
            positive scalar :math:`c` for :math:`U = cI`.
        column_covariance: :math:`V`, ``(..., in, in)``, positive definite (among columns), or
            a positive scalar :math:`c` for :math:`V = cI`.
        row_scale_tril: :math:`A`, the lower Cholesky factor of :math:`U` (positive diagonal),
            instead of ``row_covariance``; a scalar :math:`s` means :math:`A = sI`.
        column_scale_tril: :math:`B`, instead of ``column_covariance`` (a scalar likewise).
        validate_args: as in :mod:`torch.distributions` (checks positive definiteness or the
            lower-Cholesky structure, and samples passed to :meth:`log_prob`).

    At most one of ``row_covariance`` / ``row_scale_tril`` and at most one of
    ``column_covariance`` / ``column_scale_tril`` may be given; where neither is, that
    covariance is the identity (``MatrixNormal(loc)`` has i.i.d. standard normal entries
    around ``loc``).  ``batch_shape`` is the broadcast of the arguments' leading dimensions,
    ``event_shape`` is ``(out, in)``.  :meth:`rsample` is reparameterised (one call of the
    compiled ``kron_eigen_sample`` op with the Cholesky factors as bases), and takes an
    optional ``generator``.
    """

    arg_constraints = {
        "loc": _real_matrix,
        "row_covariance": constraints.positive_definite,
        "column_covariance": constraints.positive_definite,
        "row_scale_tril": constraints.lower_cholesky,
        "column_scale_tril": constraints.lower_cholesky,
    }

    def __init__(self, loc, row_covariance=None, column_covariance=None, row_scale_tril=None, column_scale_tril=None,
                 validate_args=None):
        loc = _as_float("loc", loc)
        if loc.dim() < 2:
            raise ValueError(f"loc must have shape (..., out, in), got shape {tuple(loc.shape)}")
        out, inn = loc.shape[-2:]
        # (the messages name the sizes only when raised: formatting a symbolic size here would
        # specialise it under torch.compile)
        row_name, row, row_tril = _factor_argument("row", row_covariance, row_scale_tril, out, loc,
                                                   "out x out with out = loc.size(-2)")
        col_name, col, col_tril = _factor_argument("column", column_covariance, column_scale_tril, inn, loc,
                                                   "in x in with in = loc.size(-1)")
        dt, _, batch = _common({"loc": loc, row_name: row, col_name: col})
        loc, row, col = loc.to(dt), row.to(dt), col.to(dt)
        self.loc = loc.expand(batch + (out, inn))
        setattr(self, row_name, row.expand(batch + (out, out)))
        setattr(self, col_name, col.expand(batch + (inn, inn)))
        super().__init__(batch, torch.Size((out, inn)), validate_args=validate_args)
        # unbroadcast factors (as MultivariateNormal keeps _unbroadcasted_scale_tril)
        self._row_tril = row_tril.to(dt) if row_tril is not None else _cholesky(row_name, row)
        self._col_tril = col_tril.to(dt) if col_tril is not None else _cholesky(col_name, col)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(MatrixNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new._row_tril, new._col_tril = self._row_tril, self._col_tril
        for name in ("row_covariance", "row_scale_tril", "column_covariance", "column_scale_tril"):
            if name in self.__dict__:
                t = self.__dict__[name]
                setattr(new, name, t.expand(batch_shape + t.shape[-2:]))
        super(MatrixNormal, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    # ---- parameters --------------------------------------------------------------
    @lazy_property
    def row_scale_tril(self) -> torch.Tensor:
        return self._row_tril.expand(self.batch_shape + self._row_tril.shape[-2:])

    @lazy_property
    def column_scale_tril(self) -> torch.Tensor:
        return self._col_tril.expand(self.batch_shape + self._col_tril.shape[-2:])

    @lazy_property
    def row_covariance(self) -> torch.Tensor:
        return (self._row_tril @ self._row_tril.mT).expand(self.batch_shape + self._row_tril.shape[-2:])

    @lazy_property
    def column_covariance(self) -> torch.Tensor:
        return (self._col_tril @ self._col_tril.mT).expand(self.batch_shape + self._col_tril.shape[-2:])

    # ---- moments -------------------------------------------------------------------
    @property
    def variance(self) -> torch.Tensor:
        r""":math:`\mathrm{Var}(W_{ij}) = U_{ii}V_{jj}` (the diagonal of :math:`U\otimes V`)."""
        du = self._row_tril.pow(2).sum(-1)  # diag(A A^T)
        dv = self._col_tril.pow(2).sum(-1)
        return (du.unsqueeze(-1) * dv.unsqueeze(-2)).expand(self.batch_shape + self.event_shape)

    # ---- densities -----------------------------------------------------------------
    def _half_logdet(self) -> torch.Tensor:
        r""":math:`\tfrac12\log\det(U\otimes V) = \tfrac12(m\log\det U + n\log\det V)`."""
        return kron_half_logdet(self._row_tril, self._col_tril)

    def _mahalanobis(self, diff: torch.Tensor) -> torch.Tensor:
        r""":math:`\|A^{-1}(W-M)B^{-T}\|_F^2`."""
        return kron_mahalanobis(self._row_tril, self._col_tril, diff)

    # ---- sampling ------------------------------------------------------------------
    def rsample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        ones = torch.ones((1, 1), dtype=self.loc.dtype, device=self.loc.device)
        w = kron_eigen_sample(self.loc, self._row_tril, self._col_tril, ones, sample_shape, generator=generator)
        return w.expand(self._extended_shape(torch.Size(sample_shape)))


# ---------------------------------------------------------------------------------
class EigenvalueCorrectedMatrixNormal(_KroneckerGaussian):
    r"""Eigenvalue-corrected matrix-variate Gaussian (EMVG) of ``(out, in)`` matrices:
    :math:`W = M + Q_{out}(E\odot S^{1/2})Q_{in}^T`, i.e.
    :math:`\mathrm{Cov}(\mathrm{vec}\,W) = (Q_{out}\otimes Q_{in})\,\mathrm{diag}(\mathrm{vec}\,S)\,(Q_{out}\otimes Q_{in})^T`.

    Args:
        loc: the mean :math:`M`, ``(..., out, in)``.
        q_out: orthogonal ``(..., out, out)`` (e.g. the eigenvectors of the K-FAC output factor).
        q_in: orthogonal ``(..., in, in)``.
        variance: :math:`S > 0`, ``(..., out, in)``: the variances in the Kronecker eigenbasis,
            which are the eigenvalues of :math:`\mathrm{Cov}(\mathrm{vec}\,W)`.  Stored as the
            attribute ``eigenvalues``, because ``variance`` is, as everywhere in
            :mod:`torch.distributions`, the marginal variance of :math:`W`; ``arg_constraints``
            is keyed by the constructor's name, ``variance``, and validation checks the
            argument (not the marginal variance).
        validate_args: checks orthogonality (to a dtype-dependent tolerance, see
            :data:`orthogonal`), :math:`S > 0` and samples.

    :meth:`rsample` is one call of the compiled ``kron_eigen_sample`` op
    (reparameterised in ``loc``, ``variance`` and the bases).
    """

    arg_constraints = {"loc": _real_matrix, "q_out": orthogonal, "q_in": orthogonal, "variance": _positive_matrix}

    def __init__(self, loc, q_out, q_in, variance, validate_args=None):
        loc = _as_float("loc", loc)
        if loc.dim() < 2:
            raise ValueError(f"loc must have shape (..., out, in), got shape {tuple(loc.shape)}")
        out, inn = loc.shape[-2:]
        q_out, q_in, variance = (_as_float(n, x, loc) for n, x in (("q_out", q_out), ("q_in", q_in),
                                                                    ("variance", variance)))
        _check_trailing("q_out", q_out, out, out, "out x out with out = loc.size(-2)")
        _check_trailing("q_in", q_in, inn, inn, "in x in with in = loc.size(-1)")
        _check_trailing("variance", variance, out, inn, "like loc")
        dt, _, batch = _common({"loc": loc, "q_out": q_out, "q_in": q_in, "variance": variance})
        self._q_out, self._q_in, self._s = q_out.to(dt), q_in.to(dt), variance.to(dt)
        self.loc = loc.to(dt).expand(batch + (out, inn))
        self.q_out = self._q_out.expand(batch + (out, out))
        self.q_in = self._q_in.expand(batch + (inn, inn))
        self.eigenvalues = self._s.expand(batch + (out, inn))
        # torch's validation reads each arg_constraints key as an attribute, and the attribute
        # ``variance`` is the marginal variance: validate the constructor's arguments here
        super().__init__(batch, torch.Size((out, inn)), validate_args=False)
        if validate_args is not None:
            self._validate_args = validate_args
        if self._validate_args:
            validate_params(self, {"loc": self.loc, "q_out": self.q_out, "q_in": self.q_in,
                                   "variance": self.eigenvalues}, self.arg_constraints)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(EigenvalueCorrectedMatrixNormal, _instance)
        batch_shape = torch.Size(batch_shape)
        out, inn = self.event_shape
        new._q_out, new._q_in, new._s = self._q_out, self._q_in, self._s
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new.q_out = self._q_out.expand(batch_shape + (out, out))
        new.q_in = self._q_in.expand(batch_shape + (inn, inn))
        new.eigenvalues = self._s.expand(batch_shape + (out, inn))
        super(EigenvalueCorrectedMatrixNormal, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def variance(self) -> torch.Tensor:
        r"""Marginal :math:`\mathrm{Var}(W_{ij}) = [(Q_o\odot Q_o)\,S\,(Q_i\odot Q_i)^T]_{ij}`."""
        return eigen_marginal_variance(self._q_out, self._q_in, self._s).expand(self.batch_shape + self.event_shape)

    def _half_logdet(self) -> torch.Tensor:
        r""":math:`\tfrac12\sum\log S`."""
        return 0.5 * self._s.log().sum((-2, -1))

    def _mahalanobis(self, diff: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum (Q_o^T(W-M)Q_i)^2/S`."""
        proj = self._q_out.mT @ diff @ self._q_in
        return (proj.pow(2) / self._s).sum((-2, -1))

    def rsample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        w = kron_eigen_sample(self.loc, self._q_out, self._q_in, self._s, sample_shape, generator=generator)
        return w.expand(self._extended_shape(torch.Size(sample_shape)))


