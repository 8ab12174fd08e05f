r"""Every KL divergence of vmfdist, registered with :func:`torch.distributions.kl.register_kl`
(as torch keeps its own in ``torch/distributions/kl.py``), so
``torch.distributions.kl_divergence(q, p)`` simply works.

* von Mises--Fisher: vMF||vMF, vMF||HypersphericalUniform, HypersphericalUniform||vMF,
  HypersphericalUniform||HypersphericalUniform
* power spherical: PowerSpherical||HypersphericalUniform, PowerSpherical||vMF
* Radial||Independent(Normal) in closed form (Radial||Radial raises: use
  :func:`~vmfdist.distributions.radial.kl_radial_radial`, a Monte Carlo estimate)
* the matrix normals: MatrixNormal||MatrixNormal, MatrixNormal||Independent(Normal),
  EigenvalueCorrectedMatrixNormal||Independent(Normal), EVMN||EVMN with shared bases, and
  MatrixNormal||EVMN, EVMN||MatrixNormal
* the radius priors of the radial--directional layers, which torch lacks:
  LogNormal||Gamma, LogNormal||InverseGamma, Weibull||Weibull

Radius priors.  Derived here from the densities (torch's parameterisations: ``Gamma(concentration,
rate)``, ``InverseGamma(concentration, rate)`` with density
:math:`\beta^\alpha x^{-\alpha-1}e^{-\beta/x}/\Gamma(\alpha)`, ``Weibull(scale, concentration)``,
``LogNormal(loc, scale)``) and checked against Monte Carlo in ``tests/test_radial.py``.
Oh et al. 2019 (supplement, §6.3--6.5) print three of them with errors: in eq. (50)
(Weibull) the Gamma-function argument must be :math:`k_p/k_q + 1`, not :math:`k_q/k_p + 1`,
and the term is :math:`(k_q - k_p)(\log\lambda_q - \gamma/k_q)`; eqs. (51)--(52) use a scale
parameter for the Gamma and drop the :math:`\log\pi` of the log-normal entropy.  torch's own
Gamma||Gamma agrees with eq. (49) (tested).

With :math:`q = \mathrm{LN}(\mu, \sigma^2)`: :math:`E\log x = \mu`,
:math:`E x^{\pm1} = e^{\pm\mu + \sigma^2/2}`, :math:`H[q] = \mu + \tfrac12\log(2\pi e\sigma^2)`.

Every formula is written once, here, as a function of tensors where the Bayesian layers
(:mod:`vmfdist.nn`) need it without distribution objects, and the registered KL calls that
function: :func:`kl_diag_normal` (a factorised Gaussian to an elementwise Gaussian, summed),
:func:`kl_radial_normal` (``Radial || Independent(Normal)``) and
:func:`kl_radial_normal_softplus` (the same KL from a layer's :math:`(\mu, \rho)`, through the
fused mean-field KL), :func:`kl_vmf_vmf`, :func:`kl_vmf_uniform`, :func:`kl_power_spherical_uniform`,
:func:`kl_power_spherical_vmf`, :func:`kl_lognormal_gamma` and :func:`kl_lognormal_inverse_gamma`.
"""
from __future__ import annotations

import functools
import math

import torch
from torch.distributions import Gamma, Independent, InverseGamma, LogNormal, Normal, Weibull
from torch.distributions.kl import register_kl

from .. import special
from ._constants import EULER_GAMMA
from .matrix_normal import (EigenvalueCorrectedMatrixNormal, MatrixNormal, eigen_marginal_variance,
                            kron_mahalanobis, _tril_trace_ratio)
from .._ops import lib
from .._ops.random import random_kwargs
from .meanfield import _loc_rho, _num_samples, _prior, _shaped, meanfield_kl
from .power_spherical import PowerSpherical, digamma_diff, lgamma_diff, power_spherical_entropy, trigamma_diff
from .radial import Radial
from .von_mises_fisher import HypersphericalUniform, VonMisesFisher, log_sphere_area, vmf_log_normalizer

__all__ = ["kl_diag_normal", "kl_radial_normal", "kl_radial_normal_softplus", "radial_sample_kl", "kl_vmf_vmf", "kl_vmf_uniform",
           "kl_power_spherical_uniform", "kl_power_spherical_vmf", "kl_lognormal_gamma", "kl_lognormal_inverse_gamma",
           "kl_rdp_grouping"]



def _log_prior_terms(a, b):
    """-a log b + log Gamma(a), each of a and b a tensor or a Python float (the radial--directional
    layers pass a = 1/2 and, for the inverse Gamma, b = 1 as floats)."""
    log_b = math.log(b) if isinstance(b, float) else torch.log(b)
    return -a * log_b + (math.lgamma(a) if isinstance(a, float) else torch.lgamma(a))


def kl_lognormal_gamma(mu, s, a, b):
    r"""KL(LogNormal(mu, s) || Gamma(a, rate b)) from the parameters:
    :math:`-\alpha\log\beta + \log\Gamma(\alpha) - \alpha\mu + \beta e^{\mu+\sigma^2/2} - \tfrac12\log(2\pi e\sigma^2)`."""
    return (_log_prior_terms(a, b) - a * mu + b * torch.exp(mu + 0.5 * s * s)
            - 0.5 * torch.log(2 * math.pi * math.e * s * s))


def kl_lognormal_inverse_gamma(mu, s, a, b):
    r"""KL(LogNormal(mu, s) || InverseGamma(a, b)) from the parameters:
    :math:`-\alpha\log\beta + \log\Gamma(\alpha) + \alpha\mu + \beta e^{-\mu+\sigma^2/2} - \tfrac12\log(2\pi e\sigma^2)`."""
    return (_log_prior_terms(a, b) + a * mu + b * torch.exp(-mu + 0.5 * s * s)
            - 0.5 * torch.log(2 * math.pi * math.e * s * s))


def kl_rdp_grouping(log_kappa, local, glob, prior_kappa, tau_local, tau_global, dim: int, uniform: bool = False):
    r"""The KL of one grouping of a radial--directional layer (:class:`~vmfdist.nn.RDPLinear`) and its
    gradient, by one compiled op (``rdp_kl``, in double whatever the dtype): ``G`` groups of
    dimension ``dim`` with one posterior concentration :math:`\kappa_q = e^{\text{log\_kappa}}`, and
    :math:`G + 1` radius factors whose parameters are the rows :math:`(m_a, m_b, \rho_a, \rho_b)` of
    ``local`` ``(4, G)`` and ``glob`` ``(4,)``:

    .. math::  G\,\mathrm{KL}(\mathrm{vMF}(\kappa_q) \| \mathrm{vMF}(\kappa_p))
               + \sum_j \mathrm{KL}(\mathrm{LogNormal}(m_a, s_a) \| \mathrm{Gamma}(\tfrac12, \tau_j^{-2}))
               + \mathrm{KL}(\mathrm{LogNormal}(m_b, s_b) \| \mathrm{InverseGamma}(\tfrac12, 1)),

    :math:`s = \mathrm{softplus}(\rho)`, :math:`\tau_j` = ``tau_local`` for the local factors and
    ``tau_global`` for the global one, equal mean directions in the vMF KL (``uniform``: the
    uniform distribution on the sphere instead of :math:`\mathrm{vMF}(\kappa_p)`).  Returns
    ``(kl, (d kl/d log_kappa, d kl/d local, d kl/d glob))``; all arguments but ``dim`` and
    ``uniform`` are tensors of one dtype and device (``log_kappa``, ``prior_kappa``, ``tau_*``
    0-dim).  Not differentiable itself: the gradient is returned (the layers wrap it in an autograd
    function).  Outside the domain -- ``tau_local`` or ``tau_global`` <= 0, ``prior_kappa`` < 0
    or infinite, a NaN anywhere -- the KL is NaN (not checked: no host read per training step;
    the layers check their buffers when built); ``dim`` < 2 is an error."""
    kl, g_log_kappa, g_local, g_glob = lib.rdp_kl(log_kappa, local, glob, prior_kappa, tau_local, tau_global,
                                                  int(dim), bool(uniform))
    return kl, (g_log_kappa, g_local, g_glob)


@register_kl(LogNormal, Gamma)
def _kl_lognormal_gamma(q, p):
    r"""See :func:`kl_lognormal_gamma`."""
    return kl_lognormal_gamma(q.loc, q.scale, p.concentration, p.rate)


@register_kl(LogNormal, InverseGamma)
def _kl_lognormal_inverse_gamma(q, p):
    r"""See :func:`kl_lognormal_inverse_gamma`."""
    return kl_lognormal_inverse_gamma(q.loc, q.scale, p.concentration, p.rate)


@register_kl(Weibull, Weibull)
def _kl_weibull_weibull(q, p):
    r""":math:`\log\frac{k_q}{\lambda_q^{k_q}} - \log\frac{k_p}{\lambda_p^{k_p}}
    + (k_q - k_p)(\log\lambda_q - \gamma/k_q) + (\lambda_q/\lambda_p)^{k_p}\Gamma(1 + k_p/k_q) - 1`."""
    lq, kq = q.scale, q.concentration
    lp, kp = p.scale, p.concentration
    return (torch.log(kq) - kq * torch.log(lq) - torch.log(kp) + kp * torch.log(lp)
            + (kq - kp) * (torch.log(lq) - EULER_GAMMA / kq)
            + torch.exp(kp * (torch.log(lq) - torch.log(lp)) + torch.lgamma(1 + kp / kq)) - 1)


# ---- von Mises--Fisher -------------------------------------------------------
def kl_vmf_vmf(kq, kp, d, half_sq=None):
    r"""KL(vMF(mu_q, k_q) || vMF(mu_p, k_p)) on :math:`S^{d-1}` from the concentrations and
    ``half_sq`` :math:`= |\mu_p - \mu_q|^2/2` (None: equal mean directions):
    ``[log C(k_q) + k_q] - [log C(k_p) + k_p] - k_q (1 - A_q) + k_p ((1 - A_q) + A_q |mu_p - mu_q|^2 / 2)``,
    the general formula (Oh et al. 2019, suppl. §6.1) written with
    ``1 - A_q mu_p^T mu_q = (1 - A_q) + A_q |mu_p - mu_q|^2/2``.
    Its derivative in k_q is (k_q - k_p) A'(k_q) for equal directions."""
    half = torch.full_like(kq, 0.5 * d)
    c = special.bessel_iv_ratio_c(half, kq)
    if kq.shape == kp.shape and kq.dtype == kp.dtype:  # one call for both
        lq, lp = vmf_log_normalizer(torch.stack([kq, kp]), d, scaled=True).unbind(0)
    else:
        lq, lp = vmf_log_normalizer(kq, d, scaled=True), vmf_log_normalizer(kp, d, scaled=True)
    if half_sq is None:
        return lq - lp - kq * c + kp * c
    a = special.bessel_iv_ratio(half, kq)
    return lq - lp - kq * c + kp * (c + a * half_sq)


def kl_vmf_uniform(k, d):
    r"""KL(vMF(mu, k) || uniform on :math:`S^{d-1}`) = log C(k) + k A + log S_{d-1}
    = [log C(k) + k] - k (1 - A) + log S_{d-1}; 0 at k = 0.  Its derivative is k A'(k)."""
    c = special.bessel_iv_ratio_c(torch.full_like(k, 0.5 * d), k)
    return vmf_log_normalizer(k, d, scaled=True) - k * c + log_sphere_area(d, dtype=k.dtype, device=k.device)


@register_kl(VonMisesFisher, VonMisesFisher)
def _kl_vmf_vmf(q, p):
    r"""KL(q || p) = E_q[log q - log p]: see :func:`kl_vmf_vmf`."""
    if q.dim != p.dim:
        raise ValueError(f"KL(vMF || vMF) needs the same dimension, got {q.dim} and {p.dim}")
    half_sq = 0.5 * (p.loc - q.loc).pow(2).sum(-1)
    return kl_vmf_vmf(q.concentration, p.concentration, q.dim, half_sq)


@register_kl(VonMisesFisher, HypersphericalUniform)
def _kl_vmf_uniform(q, p):
    """KL(vMF || uniform): see :func:`kl_vmf_uniform`."""
    if q.dim != p.dim:
        raise ValueError(f"KL(vMF || uniform) needs the same dimension, got {q.dim} and {p.dim}")
    kl = kl_vmf_uniform(q.concentration, q.dim)
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(HypersphericalUniform, VonMisesFisher)
def _kl_uniform_vmf(q, p):
    r"""KL(uniform || vMF) :math:`= -\log S_{d-1} - \log C_d(\kappa) - \kappa\mu^T E_q[x]
    = -\log S_{d-1} - \log C_d(\kappa)`, since :math:`E_q[x] = 0`.  Independent of :math:`\mu`.

    With :math:`I_\nu(\kappa) = (\kappa/2)^\nu\,{}_0F_1(;\nu+1;\kappa^2/4)/\Gamma(\nu+1)` this is
    :math:`\log{}_0F_1(;d/2;\kappa^2/4)`: for :math:`\kappa^2/4 \le d/8` it is summed as that
    series (12 terms, each at most a quarter of the one before, through ``log1p``), so small
    values (:math:`\approx\kappa^2/(2d)`) keep their relative precision at any d; above, as
    :math:`\kappa - (\log C_d(\kappa) + \kappa) - \log S_{d-1}` with the scaled log-normaliser
    (the value is then at least 0.23, and grows like :math:`\kappa - \tfrac{d-1}{2}\log\kappa`)."""
    if q.dim != p.dim:
        raise ValueError(f"KL(uniform || vMF) needs the same dimension, got {q.dim} and {p.dim}")
    k = p.concentration
    b = 0.5 * p.dim
    x = 0.25 * k * k
    small = x <= 0.25 * b
    xs = torch.where(small, x, torch.zeros_like(x))
    term, total = torch.ones_like(xs), torch.zeros_like(xs)
    for n in range(12):  # 0F1(; b; x) - 1 = sum_{n >= 1} x^n / ((b)_n n!)
        term = term * xs / ((b + n) * (n + 1))
        total = total + term
    series = torch.log1p(total)
    direct = k - p.log_normalizer(scaled=True) - log_sphere_area(p.dim, dtype=k.dtype, device=k.device)
    kl = torch.where(small, series, direct)
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(HypersphericalUniform, HypersphericalUniform)
def _kl_uniform_uniform(q, p):
    if q.dim != p.dim:
        raise ValueError(f"KL(uniform || uniform) needs the same dimension, got {q.dim} and {p.dim}")
    return torch.zeros(torch.broadcast_shapes(q.batch_shape, p.batch_shape), dtype=q._dtype, device=q._device)


# ---- power spherical ---------------------------------------------------------
# 16-point Gauss-Legendre rule on [-1, 1] (csrc/include/vmfdist/gauss_legendre.h): positive nodes, weights
_GL16_NODE = (9.8940093499164993e-1, 9.4457502307323258e-1, 8.6563120238783174e-1, 7.5540440835500303e-1,
              6.1787624440264375e-1, 4.5801677765722739e-1, 2.8160355077925891e-1, 9.501250983763744e-2)
_GL16_WEIGHT = (2.7152459411754095e-2, 6.2253523938647893e-2, 9.5158511682492785e-2, 1.2462897125553387e-1,
                1.4959598881657673e-1, 1.6915651939500254e-1, 1.8260341504492359e-1, 1.894506104550685e-1)


def _gl16_unit(like: torch.Tensor):
    """The 16 Gauss-Legendre nodes u on [0, 1] and the weights times u, in the dtype and device of ``like``."""
    x = torch.tensor(_GL16_NODE, dtype=like.dtype, device=like.device)
    w = torch.tensor(_GL16_WEIGHT, dtype=like.dtype, device=like.device)
    u = torch.cat([0.5 * (1.0 - x), 0.5 * (1.0 + x)])
    w = torch.cat([w, w]) * 0.5
    return u, w * u


def kl_power_spherical_uniform(k, d):
    r"""KL(PS(mu, k) || uniform on :math:`S^{d-1}`) :math:`= -H[\mathrm{PS}] + \log S_{d-1}`.  With
    :math:`\beta = (d-1)/2`, :math:`\alpha = \beta + k` and the duplication formula this is exactly
    :math:`K(k) = [\log\Gamma(\alpha+\beta) - \log\Gamma(\alpha)] - [\log\Gamma(2\beta) - \log\Gamma(\beta)]
    - k(\psi(\alpha+\beta) - \psi(\alpha))`, no constants of order one to cancel; 0 at k = 0.  For
    small :math:`k` its terms of order :math:`k` cancel to a result of order :math:`k^2`, so for
    :math:`k < 2\beta = d - 1`
    :math:`K = \int_0^k s\,T(\beta + s)\,ds = k^2\int_0^1 u\,T(\beta + ku)\,du` with
    :math:`T(a) = \psi'(a) - \psi'(a + \beta) > 0`
    (:func:`~vmfdist.distributions.power_spherical.trigamma_diff`), by 16-point Gauss--Legendre
    (:math:`T(\beta + ku)` is analytic but for a pole at :math:`u = -\beta/k \le -1/2`: the rule is exact to
    rounding, and the closed form above the switch loses at most a few ulp).  Its derivative is
    :math:`k\,T(\alpha)`."""
    b = 0.5 * (d - 1)
    kz = torch.where(k >= 0, k, torch.zeros_like(k))
    a = kz + b
    closed = lgamma_diff(a, b) - lgamma_diff(torch.full_like(kz, b), b) - kz * digamma_diff(a, b)
    small = kz < 2 * b
    ks = torch.where(small, kz, torch.zeros_like(kz))
    u, wu = _gl16_unit(ks)
    integral = (wu * trigamma_diff(b + ks.unsqueeze(-1) * u, b)).sum(-1)
    kl = torch.where(small, ks * ks * integral, closed)
    return torch.where(k >= 0, kl, torch.full_like(kl, math.nan))


def kl_power_spherical_vmf(kq, kp, d, half_sq):
    r"""KL(PS(mu_q, k_q) || vMF(mu_p, k_p)) on :math:`S^{d-1}` from the concentrations and
    ``half_sq`` :math:`= |\mu_p - \mu_q|^2/2`:
    :math:`-H[q] - \log C_d(k_p) - k_p\mu_p^TE_q[x]`, with :math:`E_q[x] = m\mu_q`,
    :math:`m = k_q/(k_q + d - 1)`, written with the scaled vMF log-normaliser as
    ``-H[q] - [log C(k_p) + k_p] + k_p ((1 - m) + m |mu_p - mu_q|^2 / 2)``."""
    one_m = (d - 1) / (kq + (d - 1))
    return (-power_spherical_entropy(kq, d) - vmf_log_normalizer(kp, d, scaled=True)
            + kp * (one_m + (1.0 - one_m) * half_sq))


@register_kl(PowerSpherical, HypersphericalUniform)
def _kl_power_spherical_uniform(q, p):
    """KL(PS || uniform): see :func:`kl_power_spherical_uniform`."""
    if q.dim != p.dim:
        raise ValueError(f"KL(PowerSpherical || uniform) needs the same dimension, got {q.dim} and {p.dim}")
    kl = kl_power_spherical_uniform(q.scale, q.dim)
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(PowerSpherical, VonMisesFisher)
def _kl_power_spherical_vmf(q, p):
    """KL(PS || vMF): see :func:`kl_power_spherical_vmf`."""
    if q.dim != p.dim:
        raise ValueError(f"KL(PowerSpherical || vMF) needs the same dimension, got {q.dim} and {p.dim}")
    half_sq = 0.5 * (p.loc - q.loc).pow(2).sum(-1)
    shape = torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    return kl_power_spherical_vmf(q.scale.expand(shape), p.concentration.expand(shape), q.dim, half_sq.expand(shape))


# ---- Gaussian ----------------------------------------------------------------
def _prior_tensor(x, like):
    """A prior parameter (tensor or number) in ``like``'s dtype (the layers' prior buffers may be
    float32 under a float64 layer)."""
    if isinstance(x, torch.Tensor):
        return x.to(like.dtype)
    return torch.tensor(x, dtype=like.dtype, device=like.device)


def kl_diag_normal(loc, scale, prior_loc, prior_scale):
    r""":math:`\sum_i \mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2)\,\|\,\mathcal N(m_i, s_i^2))
    = \sum_i \log(s_i/\sigma_i) + (\sigma_i^2 + (\mu_i - m_i)^2)/(2 s_i^2) - \tfrac12`, summed over
    all elements of ``loc`` (a 0-dim tensor), from the tensors: ``loc`` :math:`\mu`, ``scale``
    :math:`\sigma` of one shape; ``prior_loc`` :math:`m` and ``prior_scale`` :math:`s` numbers or
    tensors broadcasting to it, taken in ``loc``'s dtype.  For 0-dim (or number) prior
    parameters the constant terms are summed once (:math:`n(\log s - \tfrac12)`), so the prior is
    never expanded to full size.  The elementwise formula is torch's registered
    ``Normal || Normal``; the mean-field layers use this sum (and, where the prior allows, the
    fused :func:`~vmfdist.distributions.meanfield.meanfield_kl`)."""
    m, s = _prior_tensor(prior_loc, loc), _prior_tensor(prior_scale, loc)
    if m.dim() == 0 and s.dim() == 0:
        return loc.numel() * (torch.log(s) - 0.5) + (torch.addcmul(-scale.log(), scale * scale + (loc - m).square(),
                                                                   0.5 / (s * s))).sum()
    return (torch.log(s / scale) + (scale.square() + (loc - m).square()) / (2 * s * s) - 0.5).sum()


# ---- Radial ------------------------------------------------------------------
def kl_radial_normal(q: Radial, prior_loc, prior_scale) -> torch.Tensor:
    r"""KL(Radial(mu, sigma) || prod_i N(m_i, s_i^2)) in closed form:
    :math:`-H[q] + \sum_i [\tfrac12\log 2\pi s_i^2 + ((\mu_i - m_i)^2 + \sigma_i^2/D)/(2 s_i^2)]`,
    since :math:`E[v_i] = 0`, :math:`E[v_i^2] = 1/D` and the cross terms vanish (:math:`D` the
    event's number of elements).  ``prior_loc`` and ``prior_scale`` (numbers or tensors, taken in
    ``q.loc``'s dtype) broadcast against ``q.loc``; the sum runs over the event, so the result
    has ``q``'s batch shape (broadcast with the prior's leading dimensions).  For 0-dim prior
    parameters and a single Radial (batch shape ``()``) the sums are formed first, without
    expanding the prior to full size."""
    m, s = _prior_tensor(prior_loc, q.loc), _prior_tensor(prior_scale, q.loc)
    d, k = q.numel, q.event_dims
    if m.dim() == 0 and s.dim() == 0 and not q.batch_shape:
        cross = 0.5 * d * torch.log(2 * math.pi * s * s) + ((q.loc - m).square().sum()
                                                            + q.scale.square().sum() / d) / (2 * s * s)
    else:
        cross = 0.5 * torch.log(2 * math.pi * s.pow(2)) + ((q.loc - m).pow(2) + q.scale.pow(2) / d) / (2 * s.pow(2))
        cross = cross.sum(tuple(range(-k, 0))) if k else cross
    return cross - q.entropy()


def kl_radial_normal_softplus(loc, rho, prior_loc, prior_scale) -> torch.Tensor:
    r""":func:`kl_radial_normal` for ``Radial(loc, softplus(rho))`` (one distribution over the whole
    tensor, :math:`D` elements) from the parameters the Radial layers store, evaluated with the
    fused one-pass :func:`~vmfdist.distributions.meanfield.meanfield_kl` (no softplus, log and
    sums as separate torch ops).  With :math:`H[q] = C(D) + \sum_i\log\sigma_i` the closed form
    equals the mean-field KL to :math:`\mathcal N(m_i, D s_i^2)` plus
    :math:`(1 - 1/D)\sum_i(\mu_i - m_i)^2/(2s_i^2)` plus
    :math:`D(\tfrac12\log 2\pi - \tfrac12\log D + \tfrac12) - C(D)`.  ``prior_loc`` and
    ``prior_scale`` are tensors of ``loc``'s dtype with one element or ``loc``'s shape (what
    :func:`~vmfdist.distributions.meanfield.meanfield_kl` takes; not checked for positivity)."""
    m, s = prior_loc, prior_scale
    d = loc.numel()
    kl = meanfield_kl(loc, rho, m, s * math.sqrt(d), validate_args=False)
    if d > 1:
        if s.numel() == 1:  # one fused pass (mse_loss) for sum (mu - m)^2
            sq = torch.nn.functional.mse_loss(loc, m.expand_as(loc), reduction="sum") / (2 * s * s).reshape(())
        else:
            sq = ((loc - m).square() / (2 * s * s)).sum()
        kl = kl + (1.0 - 1.0 / d) * sq
    return kl + _radial_kl_const(d)


def radial_sample_kl(loc: torch.Tensor, rho: torch.Tensor, prior_loc=0.0, prior_scale=1.0,
                     sample_shape=torch.Size(), generator=None, *, save_noise: bool = False,
                     validate_args: bool = True):
    r"""``(samples, kl)``: ``sample_shape`` draws of ``Radial(loc, softplus(rho))`` over the whole
    tensor (:func:`~vmfdist.distributions.radial.radial_noise` with ``scale = softplus(rho)``:
    the same normals and radii for the same seed) and
    :func:`kl_radial_normal_softplus` ``(loc, rho, prior_loc, prior_scale)``, in one fused op
    (the compiled ``radial_sample``: the scale, the samples and the KL's sums in one pass over
    ``loc`` and ``rho``) with one autograd node for both -- what the Radial layers train with.
    ``prior_loc`` and ``prior_scale`` are numbers, one-element tensors or tensors of ``rho``'s
    shape; ``save_noise`` as in :func:`~vmfdist.distributions.radial.radial_noise`;
    ``validate_args=False`` skips the check ``prior_scale > 0`` (a read-back from the device).
    Differentiable in ``loc`` and ``rho``, not in the prior."""
    loc, rho = _loc_rho("radial_sample_kl", loc, rho)
    if loc is None:
        raise TypeError("radial_sample_kl: loc must be a tensor, got None")
    m, s = _prior("radial_sample_kl", rho, prior_loc, prior_scale, validate_args)
    shape, n = _num_samples("radial_sample_kl", sample_shape)
    # the constant inside the op: the KL is then the op's own autograd node (the layers' KL cache
    # checks that node's graph)
    out, _, _, _, kl = lib.radial_sample(loc, rho, m, s, n, bool(save_noise), _radial_kl_const(rho.numel()),
                                         **random_kwargs("radial_sample_kl", generator, streams=2))
    return _shaped(out, shape, rho), kl


def _radial_kl_const(d):
    r""":math:`K(D) = D(\tfrac12\log 2\pi - \tfrac12\log D + \tfrac12) - C(D)`, the part of
    :func:`kl_radial_normal_softplus` that depends on :math:`D` alone (0 for an empty tensor)."""
    if d == 0:
        return 0.0
    return d * (0.5 * math.log(2 * math.pi) - 0.5 * math.log(d) + 0.5) - float(_radial_entropy_const(d))


@functools.lru_cache(maxsize=64)
def _radial_entropy_const(d):
    """C(D) of the Radial entropy H[q] = C(D) + sum_i log sigma_i (the same constant as
    :meth:`Radial.entropy`)."""
    return Radial(torch.zeros(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64)).entropy()


@register_kl(Radial, Independent)
def _kl_radial_normal(q, p):
    r"""KL(Radial || Independent(Normal)) over the same event: :func:`kl_radial_normal`.  Batch
    shapes broadcast."""
    if not isinstance(p.base_dist, Normal):
        raise NotImplementedError(f"KL(Radial || Independent) is implemented for Independent(Normal(...), "
                                  f"event_dims) over the same event shape, got a base distribution "
                                  f"{type(p.base_dist).__name__}")
    if tuple(p.event_shape) != tuple(q.event_shape):
        raise ValueError(f"KL(Radial || Independent(Normal)): event shapes must match, got {tuple(q.event_shape)} "
                         f"and {tuple(p.event_shape)} (p = Independent(Normal(loc, scale), "
                         f"reinterpreted_batch_ndims) must reinterpret the Radial's event_dims = {q.event_dims} "
                         f"dimensions)")
    batch = torch.broadcast_shapes(q.batch_shape, p.batch_shape)
    return kl_radial_normal(q, p.base_dist.loc, p.base_dist.scale).expand(batch)


@register_kl(Radial, Radial)
def _kl_radial_radial_unregistered(q, p):
    raise NotImplementedError(
        "KL(Radial || Radial) has no closed form; kl_divergence stays deterministic, so use "
        "vmfdist.distributions.kl_radial_radial(q, p, num_samples, generator) for an unbiased Monte Carlo estimate")


# ---- matrix normals ------------------------------------------------------------
def _check_events(q, p, name):
    if q.event_shape != p.event_shape:
        raise ValueError(f"KL({name}): event shapes differ: {tuple(q.event_shape)} and {tuple(p.event_shape)}")


def _diag_normal_target(p, name):
    """(mean, variance, 1/2 log det) of an Independent(Normal, 2) target."""
    if not isinstance(p.base_dist, Normal) or p.reinterpreted_batch_ndims != 2:
        raise NotImplementedError(f"KL({name} || Independent) is implemented for Independent(Normal(loc, scale), 2) "
                                  f"(the matrix event of shape (out, in)), got {p!r} with reinterpreted_batch_ndims = "
                                  f"{p.reinterpreted_batch_ndims}")
    scale = p.base_dist.scale
    return p.base_dist.loc, scale.pow(2), scale.log().sum((-2, -1))


@register_kl(MatrixNormal, MatrixNormal)
def _kl_matrix_normal_matrix_normal(q, p):
    r""":math:`\tfrac12\big[\mathrm{tr}(U_p^{-1}U_q)\,\mathrm{tr}(V_p^{-1}V_q) + \|A_p^{-1}(M_q-M_p)B_p^{-T}\|_F^2 - nm\big]
    + \tfrac12\log\det(U_p\otimes V_p) - \tfrac12\log\det(U_q\otimes V_q)`."""
    _check_events(q, p, "MatrixNormal || MatrixNormal")
    k = q.event_shape[0] * q.event_shape[1]
    tr = _tril_trace_ratio(p._row_tril, q._row_tril) * _tril_trace_ratio(p._col_tril, q._col_tril)
    maha = kron_mahalanobis(p._row_tril, p._col_tril, q.loc - p.loc)
    kl = 0.5 * (tr + maha - k) + p._half_logdet() - q._half_logdet()
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(MatrixNormal, Independent)
def _kl_matrix_normal_diag(q, p):
    r"""To :math:`\mathcal N(\mu_p, \mathrm{diag}\,\sigma_p^2)`: :math:`\mathrm{tr} = \sum_{ij}U_{ii}V_{jj}/\sigma_{p,ij}^2`."""
    mu_p, var_p, half_logdet_p = _diag_normal_target(p, "MatrixNormal")
    _check_events(q, p, "MatrixNormal || Independent(Normal)")
    k = q.event_shape[0] * q.event_shape[1]
    du = q._row_tril.pow(2).sum(-1).unsqueeze(-1)
    dv = q._col_tril.pow(2).sum(-1).unsqueeze(-2)
    tr = (du * dv / var_p).sum((-2, -1))
    maha = ((q.loc - mu_p).pow(2) / var_p).sum((-2, -1))
    kl = 0.5 * (tr + maha - k) + half_logdet_p - q._half_logdet()
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(EigenvalueCorrectedMatrixNormal, Independent)
def _kl_emvg_diag(q, p):
    r"""To :math:`\mathcal N(\mu_p, \mathrm{diag}\,\sigma_p^2)`: the trace term is
    :math:`\sum_{ij}\mathrm{Var}_q(W_{ij})/\sigma_{p,ij}^2` with the marginal variance
    :math:`(Q_o\odot Q_o)S(Q_i\odot Q_i)^T`."""
    mu_p, var_p, half_logdet_p = _diag_normal_target(p, "EigenvalueCorrectedMatrixNormal")
    _check_events(q, p, "EigenvalueCorrectedMatrixNormal || Independent(Normal)")
    k = q.event_shape[0] * q.event_shape[1]
    tr = (eigen_marginal_variance(q._q_out, q._q_in, q._s) / var_p).sum((-2, -1))
    maha = ((q.loc - mu_p).pow(2) / var_p).sum((-2, -1))
    kl = 0.5 * (tr + maha - k) + half_logdet_p - q._half_logdet()
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    try:
        a, b = torch.broadcast_tensors(a, b)
    except RuntimeError:
        return False
    return bool(torch.equal(a, b))


@register_kl(EigenvalueCorrectedMatrixNormal, EigenvalueCorrectedMatrixNormal)
def _kl_emvg_emvg(q, p):
    r"""With shared bases (the case of noisy EK-FAC, whose prior and posterior share the
    K-FAC eigenbasis): :math:`\tfrac12\big[\sum S_q/S_p + \sum(Q_o^T(M_q - M_p)Q_i)^2/S_p - nm
    + \sum\log S_p - \sum\log S_q\big]`.  The bases must be equal (the same tensors, or
    equal values); otherwise a ``ValueError`` is raised."""
    _check_events(q, p, "EigenvalueCorrectedMatrixNormal || EigenvalueCorrectedMatrixNormal")
    if not (_same_tensor(q._q_out, p._q_out) and _same_tensor(q._q_in, p._q_in)):
        raise ValueError("KL(EigenvalueCorrectedMatrixNormal || EigenvalueCorrectedMatrixNormal) is implemented for "
                         "shared eigenbases only: q.q_out must equal p.q_out and q.q_in must equal p.q_in, but the "
                         "bases differ")
    k = q.event_shape[0] * q.event_shape[1]
    sq, sp = q._s, p._s
    proj = p._q_out.mT @ (q.loc - p.loc) @ p._q_in
    kl = 0.5 * ((sq / sp).sum((-2, -1)) + (proj.pow(2) / sp).sum((-2, -1)) - k) + p._half_logdet() - q._half_logdet()
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(MatrixNormal, EigenvalueCorrectedMatrixNormal)
def _kl_matrix_normal_emvg(q, p):
    r"""KL(:math:`\mathcal{MN}(M_q, U, V)` || EMVG(:math:`M_p, Q_o, Q_i, S`)).  In the target's
    eigenbasis :math:`(Q_o\otimes Q_i)^T(U\otimes V)(Q_o\otimes Q_i) = (Q_o^TUQ_o)\otimes(Q_i^TVQ_i)`,
    so the trace term is :math:`\sum_{ij}[Q_o^TUQ_o]_{ii}[Q_i^TVQ_i]_{jj}/S_{ij}`, with
    :math:`[Q_o^TUQ_o]_{ii} = \|(A^TQ_o)_{:,i}\|^2` for :math:`U = AA^T`:

    :math:`\tfrac12\big[\sum_{ij}\frac{u_iv_j}{S_{ij}} + \sum\frac{(Q_o^T\Delta Q_i)^2}{S} - nm\big]
    + \tfrac12\sum\log S - \tfrac12\log\det(U\otimes V)`, :math:`\Delta = M_q - M_p`.
    The bases are taken as orthogonal (as the EMVG's density does)."""
    _check_events(q, p, "MatrixNormal || EigenvalueCorrectedMatrixNormal")
    k = q.event_shape[0] * q.event_shape[1]
    u = (q._row_tril.mT @ p._q_out).pow(2).sum(-2)  # diag(Q_o^T U Q_o), (..., out)
    v = (q._col_tril.mT @ p._q_in).pow(2).sum(-2)  # diag(Q_i^T V Q_i), (..., in)
    tr = (u.unsqueeze(-1) * v.unsqueeze(-2) / p._s).sum((-2, -1))
    maha = p._mahalanobis(q.loc - p.loc)
    kl = 0.5 * (tr + maha - k) + p._half_logdet() - q._half_logdet()
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))


@register_kl(EigenvalueCorrectedMatrixNormal, MatrixNormal)
def _kl_emvg_matrix_normal(q, p):
    r"""KL(EMVG(:math:`M_q, Q_o, Q_i, S`) || :math:`\mathcal{MN}(M_p, U, V)`).  With
    :math:`\Sigma_q = (Q_o\otimes Q_i)\,\mathrm{diag}(\mathrm{vec}\,S)(Q_o\otimes Q_i)^T`,
    :math:`\mathrm{tr}((U^{-1}\otimes V^{-1})\Sigma_q) = \sum_{ij} S_{ij}[Q_o^TU^{-1}Q_o]_{ii}[Q_i^TV^{-1}Q_i]_{jj}`
    and :math:`[Q_o^TU^{-1}Q_o]_{ii} = \|(A^{-1}Q_o)_{:,i}\|^2` (a triangular solve):

    :math:`\tfrac12\big[\sum_{ij}S_{ij}a_ib_j + \|A^{-1}\Delta B^{-T}\|_F^2 - nm\big]
    + \tfrac12\log\det(U\otimes V) - \tfrac12\sum\log S`."""
    _check_events(q, p, "EigenvalueCorrectedMatrixNormal || MatrixNormal")
    k = q.event_shape[0] * q.event_shape[1]
    a = torch.linalg.solve_triangular(p._row_tril, q._q_out, upper=False).pow(2).sum(-2)  # (..., out)
    b = torch.linalg.solve_triangular(p._col_tril, q._q_in, upper=False).pow(2).sum(-2)  # (..., in)
    tr = (q._s * a.unsqueeze(-1) * b.unsqueeze(-2)).sum((-2, -1))
    maha = p._mahalanobis(q.loc - p.loc)
    kl = 0.5 * (tr + maha - k) + p._half_logdet() - q._half_logdet()
    return kl.expand(torch.broadcast_shapes(q.batch_shape, p.batch_shape))
