r"""The von Mises--Fisher distribution on :math:`S^{d-1}` and the uniform distribution on the sphere.

Density with respect to the surface measure of the unit sphere in :math:`\mathbb{R}^d`:

.. math::

    p(x) = C_d(\kappa)\, e^{\kappa \mu^T x}, \qquad
    \log C_d(\kappa) = (d/2 - 1)\log\kappa - (d/2)\log 2\pi - \log I_{d/2-1}(\kappa).

Everything is computed in the *scaled* form :math:`\log C_d(\kappa) + \kappa` (through
:func:`vmfdist.special.log_bessel_ive`) and with :math:`1 - \mu^T x = \|x - \mu\|^2/2`, so
that no large terms cancel for large :math:`\kappa`; the mean resultant length
:math:`A_d(\kappa) = I_{d/2}(\kappa)/I_{d/2-1}(\kappa)` and its complement come from
:func:`vmfdist.special.bessel_iv_ratio` / ``bessel_iv_ratio_c``.  The derivative of the
log-normaliser is the identity :math:`\tfrac{d}{d\kappa}(\log C_d + \kappa) = 1 - A_d(\kappa)`,
never a derivative of a Bessel series.

Sampling is one fused compiled op (``torch.ops.vmfdist.vmf_sample``; see
``csrc/include/vmfdist/vmf.h``): Wood's rejection sampler for :math:`w = \mu^T x` (the
inverse CDF for :math:`d = 3`), a uniform tangent direction from normalised normals, and a
reflection that maps :math:`e_1` to :math:`\mu`, stable at :math:`\mu = \pm e_1`.
:meth:`VonMisesFisher.rsample` is reparameterised and *unbiased* for both ``loc`` and
``concentration``: the gradient of :math:`w` with respect to :math:`\kappa` is the implicit
reparameterisation gradient :math:`-(\partial F/\partial\kappa)/f` (Figurnov et al. 2018),
computed by quadrature in ``vmf_marginal_grad``.
"""
from __future__ import annotations

import math
from numbers import Number
from typing import Optional

import torch
from torch.distributions import Distribution, constraints

from .. import special
from .._ops import lib
from .._ops.random import call_sampler
from ._validation import as_real_tensor, check_shape, check_value, same_device

__all__ = [
    "VonMisesFisher",
    "HypersphericalUniform",
    "log_sphere_area",
    "vmf_log_normalizer",
    "vmf_sample",
    "fit_vmf",
    "sphere",
]


class _Sphere(constraints.Constraint):
    """Unit vectors along the last dimension (to a tolerance scaled by the dtype)."""

    is_discrete = False
    event_dim = 1

    @staticmethod
    def tolerance(dtype: torch.dtype) -> float:
        r"""The tolerance on :math:`|\|x\| - 1|`: 1e-6 in float64, 1e-4 in float32, 1e-2 otherwise."""
        return {torch.float64: 1e-6, torch.float32: 1e-4}.get(dtype, 1e-2)

    def check(self, value):
        norm = torch.linalg.vector_norm(value, dim=-1)
        return (norm - 1).abs() <= self.tolerance(value.dtype)

    def __repr__(self):
        return "Sphere()"


#: The support of :class:`VonMisesFisher`: unit vectors along the last dimension, so event dimension 1.
sphere = _Sphere()


def log_sphere_area(d, dtype=torch.float64, device=None) -> torch.Tensor:
    r""":math:`\log S_{d-1} = \log 2 + (d/2)\log\pi - \log\Gamma(d/2)`, the log surface area of
    the unit sphere in :math:`\mathbb{R}^d`."""
    if isinstance(d, (int, torch.SymInt)) and not isinstance(d, bool):
        d = torch.full((), d, dtype=dtype, device=device)  # (keeps a symbolic size symbolic under torch.compile)
    else:
        d = torch.as_tensor(d, dtype=dtype, device=device)
    return math.log(2.0) + 0.5 * d * math.log(math.pi) - torch.lgamma(0.5 * d)


def _log_normalizer_scaled(kappa: torch.Tensor, d) -> torch.Tensor:
    r"""The value of :math:`\log C_d(\kappa) + \kappa` (no derivative of its own: see :class:`_LogNormalizer`)."""
    nu = 0.5 * d - 1.0
    # (only kappa >= 2^-20 reach the general form below; NaN stays NaN)
    safe = kappa.clamp_min(2.0 ** -20)
    val = (nu * torch.log(safe) - 0.5 * d * math.log(2 * math.pi)
           - special.log_bessel_ive(torch.full_like(safe, nu), safe))
    if isinstance(d, int):
        zero = -_log_sphere_area_float(d)
    else:  # a symbolic size under torch.compile
        zero = -log_sphere_area(d, dtype=kappa.dtype, device=kappa.device).expand_as(kappa)
    # Small kappa: log C + kappa = -log S_{d-1} - log sum_k (kappa^2/4)^k / (k! (nu+1)_k) + kappa
    # = -log S_{d-1} + kappa - kappa^2 / (4 (nu + 1)) + O(kappa^4 / nu^3), the O() below 2^-80
    # for kappa < 2^-20.  The general form cancels terms of size nu |log kappa| there (KL between
    # kappa = 5e-324 and kappa = 0 at d = 256 came out 2.1e-11 instead of ~0).
    small = zero + (kappa - kappa * kappa / (4.0 * (nu + 1.0)))
    val = torch.where(kappa < 2.0 ** -20, small, val)
    # kappa < 0 or NaN: NaN (it returned the kappa = 0 value, -1.531 at d = 3, for kappa = -1)
    return torch.where(kappa >= 0, val, math.nan)


def _log_sphere_area_float(d: int) -> float:
    return math.log(2.0) + 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d)


class _LogNormalizer(torch.autograd.Function):
    r""":math:`\log C_d(\kappa)` (or :math:`+\kappa`, ``scaled``) with the exact derivative
    :math:`-A_d(\kappa)` (scaled: :math:`1 - A_d(\kappa)`, from the complemented ratio)."""

    @staticmethod
    def forward(kappa, d, scaled):
        val = _log_normalizer_scaled(kappa, d)
        return val if scaled else val - kappa

    @staticmethod
    def setup_context(ctx, inputs, output):
        kappa, d, scaled = inputs
        ctx.save_for_backward(kappa)
        ctx.d, ctx.scaled = d, scaled

    @staticmethod
    def backward(ctx, grad):
        (kappa,) = ctx.saved_tensors
        half = torch.full_like(kappa, 0.5 * ctx.d)
        if ctx.scaled:
            return grad * special.bessel_iv_ratio_c(half, kappa), None, None
        return -grad * special.bessel_iv_ratio(half, kappa), None, None


def vmf_log_normalizer(concentration: torch.Tensor, d: int, scaled: bool = False) -> torch.Tensor:
    r""":math:`\log C_d(\kappa)` (or :math:`\log C_d(\kappa) + \kappa` with ``scaled=True``),
    finite for every :math:`\kappa \ge 0` (the limit :math:`-\log S_{d-1}` at 0; NaN for
    :math:`\kappa < 0` or NaN), with the
    exact derivative :math:`-A_d(\kappa)` (scaled: :math:`1 - A_d(\kappa)`), differentiable
    to any order."""
    kappa = torch.as_tensor(concentration)
    if not kappa.is_floating_point():
        kappa = kappa.to(torch.get_default_dtype())
    d = _check_dim(d)
    if not (kappa.requires_grad and torch.is_grad_enabled()):  # no graph to record: the value alone
        val = _log_normalizer_scaled(kappa, d)
        return val if scaled else val - kappa
    return _LogNormalizer.apply(kappa, d, bool(scaled))


def vmf_sample(loc: torch.Tensor, concentration: torch.Tensor, sample_shape=torch.Size(),
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Reparameterised draws from :math:`\mathrm{vMF}(\mathrm{loc}/\|\mathrm{loc}\|, \kappa)` for a batch
    of directions, without building a distribution: ``loc`` ``(..., d)`` (:math:`d \ge 2`; any
    non-zero vectors: the op normalises them, and its backward differentiates through that),
    ``concentration`` :math:`\kappa \ge 0` of shape ``loc.shape[:-1]``, one dtype.  Returns
    ``sample_shape + loc.shape``, differentiable in ``loc`` and ``concentration`` (the implicit
    reparameterisation of :meth:`VonMisesFisher.rsample`, the same op and the same samples for
    unit ``loc``); the seed is drawn inside the op from ``generator`` (default: the default
    generator of ``loc``'s device; see :mod:`vmfdist.random`)."""
    if not isinstance(loc, torch.Tensor) or not isinstance(concentration, torch.Tensor):
        raise TypeError(f"vmf_sample: loc and concentration must be tensors, got {type(loc).__name__} and "
                        f"{type(concentration).__name__}")
    if loc.dim() < 1 or loc.shape[-1] < 2:
        raise ValueError(f"vmf_sample: loc must have shape (..., d) with d >= 2, got {tuple(loc.shape)}")
    if concentration.shape != loc.shape[:-1]:
        raise ValueError(f"vmf_sample: concentration must have shape loc.shape[:-1] = {tuple(loc.shape[:-1])}, got "
                         f"{tuple(concentration.shape)}")
    d = loc.shape[-1]
    x, _ = call_sampler("vmf_sample", lib.vmf_sample, loc.reshape(-1, d), concentration.reshape(-1),
                        sample_shape=sample_shape, generator=generator, streams=2, event_shape=loc.shape)
    return x


def _direction_and_concentration(owner: str, loc, conc, name: str):
    """The arguments of a distribution on the sphere given by a mean direction ``loc`` (..., d) and a
    concentration ``conc`` (named ``name``): checked, promoted to one dtype and broadcast to one batch
    shape; returns ``(loc, conc, d)``."""
    loc = as_real_tensor("loc", loc)
    if loc.dim() < 1:
        raise ValueError("loc must have at least one dimension (the event dimension d)")
    d = _check_dim(loc.shape[-1])
    conc = as_real_tensor(name, conc, dtype=loc.dtype, device=loc.device)
    same_device(owner, {"loc": loc, name: conc})
    dtype = torch.promote_types(loc.dtype, conc.dtype)
    loc, conc = loc.to(dtype), conc.to(dtype)
    try:
        batch_shape = torch.broadcast_shapes(loc.shape[:-1], conc.shape)
    except RuntimeError as e:
        raise ValueError(f"loc (shape {tuple(loc.shape)}) and {name} (shape {tuple(conc.shape)}) have "
                         f"incompatible batch shapes: {e}") from None
    return loc.expand(batch_shape + (d,)), conc.expand(batch_shape), d


def _check_dim(d) -> int:
    # torch.jit.trace records sizes as 0-dim integer tensors (the trace fixes them anyway)
    if isinstance(d, torch.Tensor) and d.dim() == 0 and not d.is_floating_point() and d.dtype != torch.bool:
        d = int(d)
    if isinstance(d, torch.SymInt):  # torch.compile with dynamic shapes: keep it symbolic
        torch._check(d >= 2, lambda: f"dim must be at least 2 (the sphere S^(d-1) in R^d), got {d}")
        return d
    if isinstance(d, bool) or not (isinstance(d, int) or (isinstance(d, Number) and float(d).is_integer())):
        raise TypeError(f"dim must be an integer, got {d!r}")
    d = int(d)
    if d < 2:
        raise ValueError(f"dim must be at least 2 (the sphere S^(d-1) in R^d), got {d}")
    return d


class VonMisesFisher(Distribution):
    r"""von Mises--Fisher distribution :math:`\mathrm{vMF}(\mu, \kappa)` on the unit sphere
    :math:`S^{d-1} \subset \mathbb{R}^d`.

    Args:
        loc: mean direction, unit vectors of shape ``(..., d)``, ``d >= 2``.
        concentration: :math:`\kappa \ge 0`, shape broadcastable with ``loc.shape[:-1]``
            (:math:`\kappa = 0` is exactly the uniform distribution).
        validate_args: as in :mod:`torch.distributions` (checks that ``loc`` is a unit
            vector to a dtype-dependent tolerance and that ``concentration >= 0``).

    ``batch_shape`` is the broadcast of ``loc.shape[:-1]`` and ``concentration.shape``;
    ``event_shape`` is ``(d,)``.  :meth:`rsample` is reparameterised and unbiased for both
    parameters (see the module docstring); :meth:`sample` and :meth:`rsample` take an
    optional ``generator`` (the seed of the Philox streams is drawn from it).
    """

    arg_constraints = {"loc": sphere, "concentration": constraints.nonnegative}
    support = sphere
    has_rsample = True

    def __init__(self, loc, concentration, validate_args=None):
        self.loc, self.concentration, self._dim = _direction_and_concentration(
            "VonMisesFisher", loc, concentration, "concentration")
        super().__init__(self.concentration.shape, torch.Size((self._dim,)), validate_args=validate_args)

    @property
    def dim(self) -> int:
        """d, the dimension of the ambient space."""
        return self._dim

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(VonMisesFisher, _instance)
        batch_shape = torch.Size(batch_shape)
        new._dim = self._dim
        new.loc = self.loc.expand(batch_shape + (self._dim,))
        new.concentration = self.concentration.expand(batch_shape)
        super(VonMisesFisher, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    # ---- moments -------------------------------------------------------------
    @property
    def mean_resultant_length(self) -> torch.Tensor:
        r""":math:`A_d(\kappa) = I_{d/2}(\kappa)/I_{d/2-1}(\kappa) = \|E[x]\|`."""
        k = self.concentration
        return special.bessel_iv_ratio(torch.full_like(k, 0.5 * self._dim), k)

    @property
    def mean(self) -> torch.Tensor:
        return self.mean_resultant_length.unsqueeze(-1) * self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    def _moment_terms(self):
        r"""(:math:`A/\kappa`, :math:`\mathrm{Var}(\mu^Tx) = A'(\kappa)`), the two eigenvalues of the
        covariance: :math:`A/\kappa` (multiplicity :math:`d - 1`, across :math:`\mu`) and
        :math:`A' = 1 - A^2 - (d-1)A/\kappa` (along :math:`\mu`).  :math:`A'` is of order
        :math:`1/\kappa^2` for large :math:`\kappa`, so it is not formed from that difference of
        order-one terms (all digits lost by :math:`\kappa \approx 10^8`) but taken from
        :func:`~vmfdist.special.bessel_iv_ratio_grad`, the derivative of the ratio from its continued fraction
        (within 10 ulp of mpmath over the whole range, ``tests/test_special.py``).
        :math:`A/\kappa \to 1/d` and :math:`A' \to 1/d` as :math:`\kappa \to 0`."""
        k = self.concentration
        half = torch.full_like(k, 0.5 * self._dim)
        a = special.bessel_iv_ratio(half, k)
        # A / kappa = 1/d (1 - kappa^2 / (d (d + 2)) + ...): below sqrt(tiny) (1.5e-154 in float64,
        # 1.1e-19 in float32) the correction is far below rounding, while A ~ kappa / d could be
        # subnormal, its quotient inexact
        tiny = k < math.sqrt(torch.finfo(k.dtype).tiny)
        safe = torch.where(tiny, torch.ones_like(k), k)
        a_over_k = torch.where(tiny, torch.full_like(k, 1.0 / self._dim), a / safe)
        var_w = special.bessel_iv_ratio_grad(half, k)
        return a_over_k, var_w

    @property
    def covariance_matrix(self) -> torch.Tensor:
        r""":math:`\mathrm{Cov}[x] = (A/\kappa)(I - \mu\mu^T) + A'(\kappa)\,\mu\mu^T`, of shape
        ``batch_shape + (d, d)``; equal to :math:`(A/\kappa)I + (1 - dA/\kappa - A^2)\mu\mu^T`
        (with :math:`A' = 1 - A^2 - (d-1)A/\kappa`) but written so that the component along
        :math:`\mu`, of order :math:`1/\kappa^2`, keeps its precision (see ``_moment_terms``);
        :math:`I/d` at :math:`\kappa = 0`."""
        a_over_k, var_w = self._moment_terms()
        mu = self.loc
        outer = mu.unsqueeze(-1) * mu.unsqueeze(-2)
        eye = torch.eye(self._dim, dtype=mu.dtype, device=mu.device)
        return a_over_k[..., None, None] * (eye - outer) + var_w[..., None, None] * outer

    @property
    def variance(self) -> torch.Tensor:
        r"""The diagonal of :attr:`covariance_matrix`:
        :math:`(A/\kappa)(1 - \mu_i^2) + A'(\kappa)\mu_i^2`."""
        a_over_k, var_w = self._moment_terms()
        mu2 = self.loc * self.loc
        return a_over_k.unsqueeze(-1) * (1.0 - mu2) + var_w.unsqueeze(-1) * mu2

    # ---- densities -----------------------------------------------------------
    def log_normalizer(self, scaled: bool = False) -> torch.Tensor:
        r""":math:`\log C_d(\kappa)` (``scaled``: :math:`+\kappa`); see :func:`vmf_log_normalizer`."""
        return vmf_log_normalizer(self.concentration, self._dim, scaled=scaled)

    def log_prob(self, value):
        r""":math:`\log C_d(\kappa) + \kappa - \kappa\|x - \mu\|^2/2` (equal to
        :math:`\log C_d(\kappa) + \kappa\mu^Tx` on the sphere, without cancellation)."""
        check_value("VonMisesFisher", value, self.batch_shape, self.event_shape)
        if self._validate_args:
            self._validate_sample(value)
        half_sq = 0.5 * (value - self.loc).pow(2).sum(-1)
        return self.log_normalizer(scaled=True) - self.concentration * half_sq

    def entropy(self):
        r""":math:`-\log C_d(\kappa) - \kappa A_d(\kappa) = -(\log C_d + \kappa) + \kappa(1 - A_d)`."""
        k = self.concentration
        c = special.bessel_iv_ratio_c(torch.full_like(k, 0.5 * self._dim), k)
        return -self.log_normalizer(scaled=True) + k * c

    # ---- sampling ------------------------------------------------------------
    def rsample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        d = self._dim
        x, _ = call_sampler("VonMisesFisher.rsample", lib.vmf_sample, self.loc.reshape(-1, d),
                            self.concentration.reshape(-1), sample_shape=sample_shape, generator=generator,
                            streams=2, event_shape=self.batch_shape + (d,))
        return x

    def sample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        with torch.no_grad():
            return self.rsample(sample_shape, generator=generator)

    # ---- fitting -------------------------------------------------------------
    @classmethod
    def fit(cls, x, weights=None, validate_args=None) -> "VonMisesFisher":
        """Maximum-likelihood fit; see :func:`fit_vmf`."""
        loc, kappa = fit_vmf(x, weights)
        return cls(loc, kappa, validate_args=validate_args)


class HypersphericalUniform(Distribution):
    r"""The uniform distribution on :math:`S^{d-1} \subset \mathbb{R}^d`.

    Args:
        dim: d >= 2.
        batch_shape: optional batch shape.
        dtype, device: of samples and densities (default dtype / CPU).
    """

    arg_constraints = {}
    support = sphere
    has_rsample = False

    def __init__(self, dim, batch_shape=torch.Size(), dtype=None, device=None, validate_args=None):
        self._dim = _check_dim(dim)
        batch_shape = check_shape("batch_shape", batch_shape)
        if dtype is None:
            dtype = torch.get_default_dtype()
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype (float16, bfloat16, float32 or float64), "
                            f"got {dtype!r}")
        self._dtype = dtype
        try:
            self._device = torch.device("cpu") if device is None else torch.device(device)
        except (TypeError, RuntimeError) as e:
            raise ValueError(f"device must be a torch.device or a device string, got {device!r} ({e})") from None
        super().__init__(batch_shape, torch.Size((self._dim,)), validate_args=validate_args)

    @property
    def dim(self) -> int:
        return self._dim

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(HypersphericalUniform, _instance)
        new._dim, new._dtype, new._device = self._dim, self._dtype, self._device
        super(HypersphericalUniform, new).__init__(torch.Size(batch_shape), self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return torch.zeros(self._extended_shape(), dtype=self._dtype, device=self._device)

    @property
    def variance(self):
        return torch.full(self._extended_shape(), 1.0 / self._dim, dtype=self._dtype, device=self._device)

    @property
    def covariance_matrix(self):
        """:math:`I/d`, of shape ``batch_shape + (d, d)``."""
        eye = torch.eye(self._dim, dtype=self._dtype, device=self._device) / self._dim
        return eye.expand(self.batch_shape + (self._dim, self._dim))

    def log_prob(self, value):
        check_value("HypersphericalUniform", value, self.batch_shape, self.event_shape)
        if self._validate_args:
            self._validate_sample(value)
        lp = -log_sphere_area(self._dim, dtype=value.dtype, device=value.device)
        return lp.expand(torch.broadcast_shapes(value.shape[:-1], self.batch_shape))

    def entropy(self):
        return log_sphere_area(self._dim, dtype=self._dtype, device=self._device).expand(self.batch_shape)

    def sample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        """Exactly uniform: the vMF sampler at kappa = 0 (Wood's proposal is then exact)."""
        b = math.prod(self.batch_shape)
        loc = torch.zeros(b, self._dim, dtype=self._dtype, device=self._device)
        loc[:, 0] = 1.0
        kappa = torch.zeros(b, dtype=self._dtype, device=self._device)
        with torch.no_grad():
            x, _ = call_sampler("HypersphericalUniform.sample", lib.vmf_sample, loc, kappa,
                                sample_shape=sample_shape, generator=generator, streams=2,
                                event_shape=self.batch_shape + (self._dim,))
        return x


# ---- maximum likelihood ------------------------------------------------------
def _solve_kappa(rbar: torch.Tensor, one_m_rbar: torch.Tensor, d: int, iters: int = 40) -> torch.Tensor:
    r"""Solve :math:`A_d(\kappa) = \bar r` (batched).  Banerjee et al.'s guess
    :math:`\bar r(d - \bar r^2)/(1 - \bar r^2)`, then Newton steps on
    :math:`A_d(\kappa) - \bar r` for :math:`\bar r < 1/2` and on
    :math:`\log(1 - A_d(\kappa)) - \log(1 - \bar r)` in :math:`\log\kappa` otherwise, with
    :math:`A' = 1 - A^2 - (d-1)A/\kappa`; both use the exact ratio and its complement."""
    half = torch.full_like(rbar, 0.5 * d)
    kappa = rbar * (d - rbar * rbar) / (one_m_rbar * (1.0 + rbar))
    kappa = torch.where(torch.isfinite(kappa) & (kappa > 0), kappa, torch.ones_like(kappa))
    low = rbar < 0.5
    log_target = torch.log(one_m_rbar)
    for _ in range(iters):
        a = special.bessel_iv_ratio(half, kappa)
        c = special.bessel_iv_ratio_c(half, kappa)
        da = (c * (1.0 + a)) - (d - 1) * a / kappa  # 1 - A^2 - (d - 1) A / kappa
        # low: kappa <- kappa - (A - r) / A'
        k_low = kappa - (a - rbar) / da
        k_low = torch.where(k_low > 0, k_low, 0.5 * kappa)
        # high: t = log kappa, f = log C - log(1 - r), df/dt = -kappa A' / C
        # (for huge kappa A' cancels; the slope of log C in log kappa tends to -1 there)
        slope = -kappa * da / c
        slope = torch.where(torch.isfinite(slope) & (slope < -1e-3), slope, torch.full_like(slope, -1.0))
        step = (torch.log(c) - log_target) / slope
        k_high = kappa * torch.exp(-step.clamp(-5.0, 5.0))
        kappa = torch.where(low, k_low, k_high)
    return kappa


def fit_vmf(x, weights=None):
    r"""Maximum-likelihood :math:`(\hat\mu, \hat\kappa)` of a vMF from unit vectors ``x`` of shape
    ``(..., n, d)`` (optional non-negative ``weights`` ``(..., n)``), batched over ``...``.

    :math:`\hat\mu = \bar x/\|\bar x\|` and :math:`\hat\kappa` solves :math:`A_d(\kappa) = \bar r
    = \|\bar x\|`.  :math:`1 - \bar r` is computed as the weighted mean of
    :math:`\|x_i - \hat\mu\|^2/2` (no cancellation for concentrated data).  :math:`\bar r = 0`
    gives :math:`\hat\kappa = 0` and :math:`\bar r = 1` (all points equal) :math:`+\infty`.
    Returns ``(loc, concentration)``.
    """
    x = as_real_tensor("x", x)
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., n, d), got {tuple(x.shape)}")
    d = _check_dim(x.shape[-1])
    if x.shape[-2] == 0:
        raise ValueError("x must contain at least one point (x.shape[-2] > 0)")
    on_sphere = sphere.check(x)
    if not bool(on_sphere.all()):
        norm = torch.linalg.vector_norm(x, dim=-1)
        bad = norm[~on_sphere]
        raise ValueError(f"x must hold unit vectors along its last dimension (norm 1 to within "
                         f"{sphere.tolerance(x.dtype):g} in {x.dtype}); {bad.numel()} of {norm.numel()} are not, "
                         f"e.g. norm {bad.reshape(-1)[0].item():.17g} (normalise with "
                         f"torch.nn.functional.normalize(x, dim=-1))")
    if weights is None:
        weights = torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)
    weights = as_real_tensor("weights", weights, dtype=x.dtype, device=x.device).to(device=x.device, dtype=x.dtype)
    if weights.shape != x.shape[:-1]:
        try:
            weights = weights.expand(x.shape[:-1])
        except RuntimeError:
            raise ValueError(f"weights must have shape {tuple(x.shape[:-1])}, got {tuple(weights.shape)}") from None
    if bool((weights < 0).any()):
        raise ValueError("weights must be non-negative")
    wsum = weights.sum(-1, keepdim=True)
    if bool((wsum <= 0).any()):
        raise ValueError("weights must have a positive sum")
    wn = weights / wsum
    xbar = (wn.unsqueeze(-1) * x).sum(-2)
    rbar = torch.linalg.vector_norm(xbar, dim=-1)
    safe = torch.where(rbar > 0, rbar, torch.ones_like(rbar))
    e1 = torch.zeros_like(xbar)
    e1[..., 0] = 1.0
    loc = torch.where((rbar > 0).unsqueeze(-1), xbar / safe.unsqueeze(-1), e1)
    one_m = (wn * 0.5 * (x - loc.unsqueeze(-2)).pow(2).sum(-1)).sum(-1)
    one_m = one_m.clamp(0.0, 1.0)
    with torch.no_grad():
        kappa = _solve_kappa(rbar.clamp(min=1e-300), one_m.clamp(min=1e-300), d)
    kappa = torch.where(rbar <= 0, torch.zeros_like(kappa), kappa)
    kappa = torch.where(one_m <= 0, torch.full_like(kappa, math.inf), kappa)
    return loc, kappa
