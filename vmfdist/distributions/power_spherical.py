r"""The power spherical distribution on :math:`S^{d-1}` (De Cao & Aziz 2020, arXiv 2006.04437).

Density with respect to the surface measure of the unit sphere in :math:`\mathbb{R}^d`, with
:math:`\alpha = (d-1)/2 + \kappa` and :math:`\beta = (d-1)/2`:

.. math::

    p(x) = C_d(\kappa)\,(1 + \mu^T x)^\kappa, \qquad
    \log C_d(\kappa) = -(\alpha+\beta)\log 2 - \beta\log\pi - \log\Gamma(\alpha) + \log\Gamma(\alpha+\beta).

The marginal :math:`t = \mu^T x` is :math:`2B - 1` with :math:`B \sim \mathrm{Beta}(\alpha, \beta)`, so
:math:`E[t] = \kappa/(\kappa + d - 1)` and the entropy is
:math:`-\log C_d(\kappa) - \kappa(\log 2 + \psi(\alpha) - \psi(\alpha+\beta))`.

Numerics.  Everything is written with :math:`(1 + \mu^Tx)/2 = \|x + \mu\|^2/4` (accurate next to
:math:`-\mu` too) and with the differences :math:`\log\Gamma(\alpha+\beta) - \log\Gamma(\alpha)` and
:math:`\psi(\alpha+\beta) - \psi(\alpha)` (and :math:`\psi'(\alpha) - \psi'(\alpha+\beta)` for the KL) taken
from Stirling's series for :math:`\alpha \ge 10` (:func:`lgamma_diff`, :func:`digamma_diff`,
:func:`trigamma_diff`), never as differences of two values of size
:math:`\alpha\log\alpha`: so :math:`\log p`, the entropy and the KLs keep their precision for any
:math:`\kappa` (two separate ``lgamma`` calls lose :math:`\kappa\cdot 10^{-16}` in absolute terms,
1e-5 at :math:`\kappa = 10^{10}`).  The constant :math:`(\alpha+\beta)\log 2` is folded into
:math:`\kappa\log(\|x+\mu\|^2/4)` and :math:`\beta\log 4\pi`.

Sampling is one fused compiled op (``torch.ops.vmfdist.power_spherical_sample``; see
``csrc/include/vmfdist/power_spherical.h``): :math:`B = G_1/(G_1+G_2)` from two Gamma variates on the
library's Philox streams (so ``torch.manual_seed`` and ``generator=`` give reproducible samples on any
thread count), a uniform tangent direction, and the vMF sampler's stable reflection taking
:math:`e_1` to :math:`\mu`.  :meth:`PowerSpherical.rsample` is reparameterised and unbiased for both
``loc`` (through the reflection) and ``scale`` (the implicit reparameterisation gradient
:math:`-(\partial F/\partial\kappa)/f` of the Beta marginal, computed by quadrature in
``power_spherical_marginal_grad``; the rejection steps of the Gamma sampler are not differentiated).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch.distributions import Distribution, constraints

from .._ops import lib
from .._ops.random import call_sampler
from ._validation import check_value
from .von_mises_fisher import _direction_and_concentration, sphere

__all__ = ["PowerSpherical", "power_spherical_sample", "power_spherical_entropy", "lgamma_diff", "digamma_diff",
           "trigamma_diff"]

# log Gamma(x) = (x - 1/2) log x - x + log(2 pi)/2 + sum_k B_2k / (2k (2k - 1) x^(2k-1))
_LGAMMA_COEF = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360, 1 / 156, -3617 / 122400)
# psi(x) = log x - 1/(2x) - sum_k B_2k / (2k x^2k)
_DIGAMMA_COEF = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)
_STIRLING_FROM = 10.0  # the first omitted terms are below 1e-16 there


def lgamma_diff(a: torch.Tensor, b) -> torch.Tensor:
    r""":math:`\log\Gamma(a + b) - \log\Gamma(a)` for :math:`a, b > 0` (``b`` a number or a tensor):
    ``lgamma`` for :math:`a < 10`, else Stirling's series for the difference,
    :math:`(a - \tfrac12)\,\mathrm{log1p}(b/a) + b\log(a + b) - b + \sum_k c_k((a+b)^{1-2k} - a^{1-2k})`,
    accurate to a few ulp of the result however large :math:`a` is.  Differentiable."""
    big = a >= _STIRLING_FROM
    ab = torch.where(big, a, torch.full_like(a, _STIRLING_FROM))
    ia, ib = 1.0 / ab, 1.0 / (ab + b)
    ia2, ib2 = ia * ia, ib * ib
    pa, pb, corr = ia, ib, torch.zeros_like(ab)
    for c in _LGAMMA_COEF:
        corr = corr + c * (pb - pa)
        pa, pb = pa * ia2, pb * ib2
    stirling = (ab - 0.5) * torch.log1p(b * ia) + b * torch.log(ab + b) - b + corr
    asmall = torch.where(big, torch.ones_like(a), a)
    return torch.where(big, stirling, torch.lgamma(asmall + b) - torch.lgamma(asmall))


def _shift_up(a: torch.Tensor):
    """(a shifted to at least 10 by adding 10 where a < 10, the mask of those elements)."""
    small = a < _STIRLING_FROM
    return torch.where(small, a + _SHIFT, a), small


_SHIFT = 10.0


def digamma_diff(a: torch.Tensor, b) -> torch.Tensor:
    r""":math:`\psi(a + b) - \psi(a) > 0` for :math:`a, b > 0`, to a few ulp of the result (:math:`\approx b/a` for
    large :math:`a`, where two digammas would cancel): for :math:`a \ge 10`
    :math:`\mathrm{log1p}(b/a) + b/(2a(a+b)) + \sum_k (B_{2k}/2k)(a^{-2k} - (a+b)^{-2k})`, below it the recurrence
    :math:`D(a, b) = D(a + 10, b) + \sum_{k<10} b/((a+k)(a+b+k))`.  The same formula as ``digamma_diff`` in
    ``csrc/include/vmfdist/power_spherical.h`` (which shifts by whole steps until :math:`a \ge 10`).
    Differentiable."""
    ab, small = _shift_up(a)
    ia2, ib = 1.0 / (ab * ab), 1.0 / (ab + b)
    ib2 = ib * ib
    pa, pb, corr = ia2, ib2, torch.zeros_like(ab)
    for c in _DIGAMMA_COEF:
        corr = corr + c * (pa - pb)
        pa, pb = pa * ia2, pb * ib2
    out = torch.log1p(b / ab) + 0.5 * b / ab * ib + corr
    a0 = torch.where(small, a, torch.ones_like(a))
    shift = sum(b / ((a0 + k) * (a0 + b + k)) for k in range(int(_SHIFT)))
    return torch.where(small, out + shift, out)


# psi'(x) = 1/x + 1/(2x^2) + sum_k B_2k / x^(2k+1)
# (to B_22: the difference of two psi' of size 1/a needs the series to 1e-20 at a = 10)
_TRIGAMMA_COEF = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510, 43867 / 798,
                  -174611 / 330, 854513 / 138)


def trigamma_diff(a: torch.Tensor, b) -> torch.Tensor:
    r""":math:`\psi'(a) - \psi'(a + b) > 0` for :math:`a, b > 0`, to a few ulp of the result, as
    :func:`digamma_diff` (for :math:`a \ge 10` the asymptotic series of :math:`\psi'` with each difference of
    the two leading terms written without cancellation, below it
    :math:`\sum_{k<10} (1/(a+k)^2 - 1/(a+b+k)^2)` added).  torch's ``polygamma(1, x)`` is off by up to
    4e-10 relative for :math:`x < 10`, hence this.  Differentiable."""
    ab, small = _shift_up(a)
    ia, ib = 1.0 / ab, 1.0 / (ab + b)
    ia2, ib2 = ia * ia, ib * ib
    lead = b * ia * ib + 0.5 * b * (2.0 * ab + b) * ia2 * ib2
    pa, pb, corr = ia2 * ia, ib2 * ib, torch.zeros_like(ab)
    for c in _TRIGAMMA_COEF:
        corr = corr + c * (pa - pb)
        pa, pb = pa * ia2, pb * ib2
    out = lead + corr
    a0 = torch.where(small, a, torch.ones_like(a))
    shift = sum(b * (2.0 * (a0 + k) + b) / ((a0 + k) ** 2 * (a0 + b + k) ** 2) for k in range(int(_SHIFT)))
    return torch.where(small, out + shift, out)


def _nan_below_zero(value: torch.Tensor, kappa: torch.Tensor) -> torch.Tensor:
    # kappa < 0 (or NaN) is outside the family: NaN, as vmf_log_normalizer does
    return torch.where(kappa >= 0, value, torch.full_like(value, math.nan))


def power_spherical_entropy(scale: torch.Tensor, d: int) -> torch.Tensor:
    r"""The entropy of :math:`\mathrm{PS}(\mu, \kappa)` on :math:`S^{d-1}` (any :math:`\mu`):
    :math:`-\log C_d(\kappa) - \kappa E[\log(1 + t)] = \beta\log 4\pi - (\log\Gamma(\alpha+\beta) -
    \log\Gamma(\alpha)) + \kappa(\psi(\alpha+\beta) - \psi(\alpha))`, :math:`\log S_{d-1}` at
    :math:`\kappa = 0`; NaN for :math:`\kappa < 0`."""
    b = 0.5 * (d - 1)
    k = scale
    h = b * math.log(4 * math.pi) - lgamma_diff(k + b, b) + k * digamma_diff(k + b, b)
    return _nan_below_zero(h, k)


def power_spherical_sample(loc: torch.Tensor, scale: torch.Tensor, sample_shape=torch.Size(),
                           generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Reparameterised draws from :math:`\mathrm{PS}(\mathrm{loc}/\|\mathrm{loc}\|, \kappa)` for a batch of
    directions, without building a distribution: ``loc`` ``(..., d)`` (:math:`d \ge 2`; any non-zero
    vectors: the op normalises them, and its backward differentiates through that), ``scale``
    :math:`\kappa \ge 0` of shape ``loc.shape[:-1]``, one dtype.  Returns ``sample_shape + loc.shape``,
    differentiable in ``loc`` and ``scale``; the same op and the same samples as
    :meth:`PowerSpherical.rsample` for unit ``loc`` (seed drawn inside the op from ``generator``)."""
    if not isinstance(loc, torch.Tensor) or not isinstance(scale, torch.Tensor):
        raise TypeError(f"power_spherical_sample: loc and scale must be tensors, got {type(loc).__name__} and "
                        f"{type(scale).__name__}")
    if loc.dim() < 1 or loc.shape[-1] < 2:
        raise ValueError(f"power_spherical_sample: loc must have shape (..., d) with d >= 2, got {tuple(loc.shape)}")
    if scale.shape != loc.shape[:-1]:
        raise ValueError(f"power_spherical_sample: scale must have shape loc.shape[:-1] = {tuple(loc.shape[:-1])}, "
                         f"got {tuple(scale.shape)}")
    d = loc.shape[-1]
    x, _ = call_sampler("power_spherical_sample", lib.power_spherical_sample, loc.reshape(-1, d), scale.reshape(-1),
                        sample_shape=sample_shape, generator=generator, streams=2, event_shape=loc.shape)
    return x


class PowerSpherical(Distribution):
    r"""Power spherical distribution :math:`\mathrm{PS}(\mu, \kappa)` on the unit sphere
    :math:`S^{d-1} \subset \mathbb{R}^d`, density :math:`\propto (1 + \mu^Tx)^\kappa`.

    Args:
        loc: mean direction, unit vectors of shape ``(..., d)``, ``d >= 2``.
        scale: the concentration :math:`\kappa \ge 0` (called scale in the paper and in the
            ``power_spherical`` package), shape broadcastable with ``loc.shape[:-1]``;
            :math:`\kappa = 0` is exactly the uniform distribution.
        validate_args: as in :mod:`torch.distributions` (checks that ``loc`` is a unit vector to a
            dtype-dependent tolerance and that ``scale >= 0``).

    ``batch_shape`` is the broadcast of ``loc.shape[:-1]`` and ``scale.shape``; ``event_shape`` is
    ``(d,)``.  :meth:`rsample` is reparameterised and unbiased for both parameters (see the module
    docstring); :meth:`sample` and :meth:`rsample` take an optional ``generator``.
    """

    arg_constraints = {"loc": sphere, "scale": constraints.nonnegative}
    support = sphere
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale, self._dim = _direction_and_concentration("PowerSpherical", loc, scale, "scale")
        super().__init__(self.scale.shape, torch.Size((self._dim,)), validate_args=validate_args)

    @property
    def dim(self) -> int:
        """d, the dimension of the ambient space."""
        return self._dim

    @property
    def concentration(self) -> torch.Tensor:
        r"""The same tensor as ``scale`` (:math:`\kappa`), under
        :class:`~vmfdist.distributions.von_mises_fisher.VonMisesFisher`'s name."""
        return self.scale

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(PowerSpherical, _instance)
        batch_shape = torch.Size(batch_shape)
        new._dim = self._dim
        new.loc = self.loc.expand(batch_shape + (self._dim,))
        new.scale = self.scale.expand(batch_shape)
        super(PowerSpherical, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def _beta(self) -> float:
        return 0.5 * (self._dim - 1)

    # ---- moments -------------------------------------------------------------
    @property
    def mean_t(self) -> torch.Tensor:
        r""":math:`E[\mu^Tx] = \kappa/(\kappa + d - 1)`, written :math:`1 - (d-1)/(\kappa + d - 1)` (1 at
        :math:`\kappa = \infty`)."""
        return 1.0 - (self._dim - 1) / (self.scale + (self._dim - 1))

    @property
    def mean(self) -> torch.Tensor:
        return self.mean_t.unsqueeze(-1) * self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    def _moment_terms(self):
        r"""(:math:`E[1 - t^2]/(d-1)`, :math:`\mathrm{Var}(t)`): the covariance's eigenvalues across
        :math:`\mu` (multiplicity :math:`d - 1`) and along it.  With :math:`s = \alpha + \beta` and
        :math:`r = \alpha/s = 1 - \beta/s`: :math:`\mathrm{Var}(t) = 4\beta r/(s(s+1))` and
        :math:`E[1-t^2]/(d-1) = 2r/(s+1)` (0 at :math:`\kappa = \infty`)."""
        b = self._beta
        s = self.scale + 2 * b
        r = 1.0 - b / s
        return 2.0 * r / (s + 1.0), 4.0 * b * r / (s * (s + 1.0))

    @property
    def covariance_matrix(self) -> torch.Tensor:
        r""":math:`\mathrm{Cov}[x] = \frac{E[1-t^2]}{d-1}(I - \mu\mu^T) + \mathrm{Var}(t)\,\mu\mu^T`,
        of shape ``batch_shape + (d, d)``; :math:`I/d` at :math:`\kappa = 0`."""
        across, along = self._moment_terms()
        mu = self.loc
        outer = mu.unsqueeze(-1) * mu.unsqueeze(-2)
        eye = torch.eye(self._dim, dtype=mu.dtype, device=mu.device)
        return across[..., None, None] * (eye - outer) + along[..., None, None] * outer

    @property
    def variance(self) -> torch.Tensor:
        r"""The diagonal of :attr:`covariance_matrix`."""
        across, along = self._moment_terms()
        mu2 = self.loc * self.loc
        return across.unsqueeze(-1) * (1.0 - mu2) + along.unsqueeze(-1) * mu2

    # ---- densities -----------------------------------------------------------
    def _lg(self) -> torch.Tensor:
        b = self._beta
        return lgamma_diff(self.scale + b, b)

    def log_normalizer(self) -> torch.Tensor:
        r""":math:`\log C_d(\kappa) = \log\Gamma(\alpha+\beta) - \log\Gamma(\alpha) - \kappa\log 2 -
        \beta\log 4\pi` (:math:`-\log S_{d-1}` at :math:`\kappa = 0`)."""
        b = self._beta
        k = self.scale
        return _nan_below_zero(self._lg() - k * math.log(2.0) - b * math.log(4 * math.pi), k)

    def log_prob(self, value):
        r""":math:`\log\Gamma(\alpha+\beta) - \log\Gamma(\alpha) - \beta\log 4\pi +
        \kappa\log(\|x + \mu\|^2/4)`, equal to :math:`\log C_d(\kappa) + \kappa\log(1 + \mu^Tx)` on the
        sphere (0 times :math:`\log 0` is 0 at :math:`\kappa = 0`)."""
        check_value("PowerSpherical", value, self.batch_shape, self.event_shape)
        if self._validate_args:
            self._validate_sample(value)
        quarter = 0.25 * (value + self.loc).pow(2).sum(-1)
        k = self.scale
        lp = self._lg() - self._beta * math.log(4 * math.pi) + torch.xlogy(k, quarter)
        return _nan_below_zero(lp, k)

    def entropy(self):
        """See :func:`power_spherical_entropy`."""
        return power_spherical_entropy(self.scale, self._dim)

    # ---- sampling ------------------------------------------------------------
    def rsample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        d = self._dim
        x, _ = call_sampler("PowerSpherical.rsample", lib.power_spherical_sample, self.loc.reshape(-1, d),
                            self.scale.reshape(-1), sample_shape=sample_shape, generator=generator, streams=2,
                            event_shape=self.batch_shape + (d,))
        return x

    def sample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        with torch.no_grad():
            return self.rsample(sample_shape, generator=generator)
