r"""Radial--directional posterior (RDP) layers (Oh, Adamczewski & Park 2019).

A weight matrix :math:`W` (a convolution kernel is viewed as the matrix of its output
channels by ``in_channels * kh * kw``) is split into *groups*: its rows (``"row"``), its
columns (``"column"``: for a convolution, one group per input channel with the
``out_channels * kh * kw`` weights it feeds), or both (``"double"``).  Each group
:math:`g` of dimension :math:`d` is written as radius times direction,

.. math::  w_g = s\, z_g\, x_g, \qquad x_g \sim \mathrm{vMF}(\mu_g, \kappa)\ \text{on } S^{d-1},

with one concentration :math:`\kappa` per layer and grouping, and :math:`\mu_g = v_g/\|v_g\|`
(an unconstrained parameter :math:`v_g`: no projection step is needed, and since
:class:`~vmfdist.distributions.von_mises_fisher.VonMisesFisher` has unbiased reparameterised gradients in
:math:`\mu` and :math:`\kappa`, no correction term either).  The radius factors have
half-Cauchy priors, :math:`z_g \sim \mathcal C^+(\tau_\text{local})` and
:math:`s \sim \mathcal C^+(\tau_\text{global})`, written as scale mixtures:
:math:`z^2 = a\,b` with :math:`a \sim \mathrm{Gamma}(\tfrac12, \text{rate } 1/\tau^2)` and
:math:`b \sim \mathrm{InvGamma}(\tfrac12, 1)`.  (Check: :math:`a = \tau^2 g_1^2/2`,
:math:`b = 2/g_2^2` with :math:`g_i` standard normal, so :math:`z = \tau|g_1/g_2|`, a
half-Cauchy of scale :math:`\tau`.)  Each of :math:`a_g, b_g, s_a, s_b` has a log-normal
posterior; the KLs LogNormal||Gamma and LogNormal||InverseGamma are in closed form
(:mod:`vmfdist.distributions.kl`), and the vMF KL is exact (Bessel ratios, not the paper's
bound average).

Where the paper is wrong or silent, and what is done here:

* The paper writes :math:`\sqrt{\bar z} = \alpha\beta` for the scale mixture; the correct
  identity is :math:`\bar z^2 = \alpha\beta` (:math:`\bar z = \sqrt{\alpha\beta}`), as in the
  authors' code.  It also writes :math:`\mathcal G(\tfrac12, \gamma^2)` without saying
  whether :math:`\gamma^2` is a scale or a rate; the half-Cauchy of scale :math:`\gamma`
  needs *rate* :math:`1/\gamma^2`.
* The direction prior: eq. (11) has a prior mean direction :math:`\mu_{p,g}` among the
  prior parameters :math:`\theta` (fitted by the ELBO).  Its optimum is :math:`\mu_{p,g} = \mu_g`,
  where the vMF KL depends on the concentrations only; that is what is used (as in the
  authors' code).  ``direction_prior="uniform"`` uses the uniform distribution on the sphere.
* The prior concentration: the paper does not state it; its code uses an "epsilon rule"
  :math:`\kappa_p = (\max(4, d) - 3)(1-\epsilon)/(1 - (1-\epsilon)^2)`, an approximation to the
  maximum-likelihood :math:`\kappa` of data with mean resultant length :math:`1 - \epsilon`.
  Here :math:`\kappa_p` solves :math:`A_d(\kappa_p) = 1 - \epsilon` exactly (default
  :math:`\epsilon = 0.1`).
* Double grouping: :math:`W = W^{row} \odot W^{col}` (elementwise product of the row-grouped
  and the column-grouped matrices, as in the authors' code); the KL used is that of the
  latent row and column factors, an upper bound on :math:`\mathrm{KL}(q(W)\|p(W))` (data
  processing inequality), so the objective stays a valid lower bound.
* Pruning statistic: the paper says "the log of the mode of the product of the two local
  log-normals"; the local radius is :math:`z = \sqrt{ab}`, log-normal with location
  :math:`(m_a + m_b)/2` and variance :math:`(\sigma_a^2 + \sigma_b^2)/4`, whose log-mode
  :math:`(m_a + m_b)/2 - (\sigma_a^2 + \sigma_b^2)/4` is used (see :mod:`vmfdist.nn.prune`).
* Posterior mean and mode: ``"mean"`` is :math:`E[W]` (for one grouping
  :math:`E[s z_g] A_d(\kappa)\mu_g`; for double grouping the product of the two factors'
  means, which is :math:`E[W]` by independence); ``"mode"`` uses the mode of the radius
  :math:`s z_g` and the mean direction :math:`\mu_g` (the modal latent configuration).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Distribution, Gamma, Independent, InverseGamma, LogNormal, Normal, constraints

from .. import special
from ..distributions import HypersphericalUniform, VonMisesFisher, meanfield_kl, vmf_sample
from ..distributions.kl import (kl_lognormal_gamma, kl_lognormal_inverse_gamma, kl_rdp_grouping, kl_vmf_uniform,
                                kl_vmf_vmf)
from ._base import (BayesianModule, _ConvOps, _LinearOps, _Prior, _conv_repr, _conv_setup, _linear_setup, full_precision,
                    _softplus_inv, kl_normal_to_prior)
from .meanfield import _fusable

__all__ = ["RDPLinear", "RDPConv2d", "RDPPosterior", "concentration_for_mean_length"]

_GROUPINGS = ("row", "column", "double")


def concentration_for_mean_length(dim: int, mean_length: float) -> float:
    r"""The :math:`\kappa` with :math:`A_d(\kappa) = I_{d/2}(\kappa)/I_{d/2-1}(\kappa) =` ``mean_length``
    (the maximum-likelihood concentration of unit vectors in :math:`\mathbb R^d` whose mean has
    that length), by bisection in :math:`\log\kappa` on the exact Bessel ratio."""
    if not isinstance(dim, int) or dim < 2:
        raise ValueError(f"dim must be an int >= 2, got {dim!r}")
    if not 0.0 < mean_length < 1.0:
        raise ValueError(f"mean_length must lie in (0, 1), got {mean_length!r}")
    half = torch.tensor(dim / 2.0, dtype=torch.float64)
    lo, hi = -40.0, 60.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if float(special.bessel_iv_ratio(half, torch.tensor(math.exp(mid), dtype=torch.float64))) < mean_length:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


# The radius parameters of a grouping are packed: ``local_radius`` (4, G) and ``global_radius``
# (4,) hold, in this order, the location of log a, the location of log b, and the rho of each
# (log-normal scale softplus(rho)).  The former names are views (``local_a_loc`` is
# ``local_radius[0]``, ...), and state dicts with the former keys still load.
_RADIUS_ROWS = ("a_loc", "b_loc", "a_rho", "b_rho")


def _radius_view(packed: str, row: int):
    return property(lambda self: getattr(self, packed)[row],
                    doc=f"``{packed}[{row}]`` (a view; the parameter is ``{packed}``).")


def _factor_kl(log_kappa, local, glob, prior_kappa, tau_local, tau_global, dim: int, uniform: bool):
    r"""The KL of one grouping from torch ops (the reference for ``rdp_kl``, and what a double
    backward differentiates).

    Directions: G times KL(vMF(kappa_q) || vMF(kappa_p)) with the same mean direction
    (:func:`~vmfdist.distributions.kl.kl_vmf_vmf`; uniform prior: ``kl_vmf_uniform``).
    Radii: ``kl_lognormal_gamma`` (a to Gamma(1/2, rate 1/tau^2)) and ``kl_lognormal_inverse_gamma``
    (b to InverseGamma(1/2, 1)) over all G + 1 pairs at once.  Differentiable by autograd (any order)."""
    g = local.shape[-1]
    kq = log_kappa.exp()
    kl_dir = kl_vmf_uniform(kq, dim) if uniform else kl_vmf_vmf(kq, prior_kappa, dim)
    packed = torch.cat([local, glob.unsqueeze(1)], 1)  # (4, G + 1): the global factors last
    s = F.softplus(packed[2:])
    rate_a = torch.cat([tau_local.pow(-2).expand(g), tau_global.pow(-2).reshape(1)])
    kl_radius = (kl_lognormal_gamma(packed[0], s[0], 0.5, rate_a)
                 + kl_lognormal_inverse_gamma(packed[1], s[1], 0.5, 1.0)).sum()
    return g * kl_dir + kl_radius


class _FactorKL(torch.autograd.Function):
    r""":func:`_factor_kl` with its first derivative computed with the value, in one compiled op
    (``rdp_kl``, ``csrc/include/vmfdist/rdp.h``: the same closed forms in double, one call
    instead of some hundred small ops): d/dlog_kappa = :math:`G\kappa_q(\kappa_q - \kappa_p)A_d'(\kappa_q)`
    (uniform prior: :math:`G\kappa_q^2 A_d'(\kappa_q)`); with :math:`E = \beta e^{\pm\mu + s^2/2}` (+ and
    rate :math:`\beta = \tau^{-2}` for a, - and 1 for b) d/dmu = :math:`\pm(E - \tfrac12)`, d/drho =
    :math:`(E s - 1/s)\,\mathrm{sigmoid}(\rho)`.  With create_graph the value of :func:`_factor_kl` is
    differentiated by autograd instead (higher derivatives exact)."""

    @staticmethod
    def forward(ctx, log_kappa, local, glob, prior_kappa, tau_local, tau_global, dim, uniform):
        ctx.dim, ctx.uniform = dim, uniform
        kl, grads = kl_rdp_grouping(log_kappa, local, glob, prior_kappa, tau_local, tau_global, dim, uniform)
        ctx.save_for_backward(log_kappa, local, glob, prior_kappa, tau_local, tau_global, *grads)
        return kl

    @staticmethod
    def backward(ctx, grad):
        log_kappa, local, glob, prior_kappa, tau_local, tau_global, *grads = ctx.saved_tensors
        need = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph: differentiate the value (any order)
            ins = (log_kappa, local, glob)
            with torch.enable_grad():
                val = _factor_kl(*ins, prior_kappa, tau_local, tau_global, ctx.dim, ctx.uniform)
                got = iter(torch.autograd.grad(val, [t for t, n in zip(ins, need) if n], grad, create_graph=True))
            return tuple(next(got) if n else None for n in need) + (None,) * 5
        return tuple(grad * t if n else None for t, n in zip(grads, need)) + (None,) * 5


def _scale_fresh(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``x * factor`` for a freshly drawn ``x``; without autograd (predict) in place: for a large
    layer a second stack of samples costs more in first-touch page faults than the product."""
    return x.mul_(factor) if not torch.is_grad_enabled() else x * factor


class _RDPFactor(nn.Module):
    """One grouping (rows or columns) of an RDP layer: G groups of dimension d."""

    def __init__(self, directions, norms, tau_local, tau_global, prior_eps, init_eps, lognormal_sigma,
                 direction_prior):
        super().__init__()
        g, d = directions.shape
        self.num_groups, self.dim = g, d
        dev, dt = directions.device, directions.dtype
        dirs = directions.detach().clone()
        # a zero row gets the direction e_1 (no data-dependent branch: the meta device has no values)
        e1 = torch.zeros_like(dirs)
        e1[..., 0] = 1.0
        dirs = torch.where((dirs.norm(dim=-1) <= 0).unsqueeze(-1), e1, dirs)
        # contiguous: a column view of a linear weight is a transposed view, and a strided parameter
        # costs a copy in every sampler call and gradient accumulation
        self.direction = nn.Parameter(F.normalize(dirs, dim=-1).contiguous())
        kappa_q = concentration_for_mean_length(d, 1.0 - init_eps)
        kappa_p = concentration_for_mean_length(d, 1.0 - prior_eps)
        self.log_concentration = nn.Parameter(torch.tensor(math.log(kappa_q), device=dev, dtype=dt))
        self.register_buffer("prior_concentration", torch.tensor(kappa_p, device=dev, dtype=dt))
        self.register_buffer("tau_local", torch.tensor(float(tau_local), device=dev, dtype=dt))
        self.register_buffer("tau_global", torch.tensor(float(tau_global), device=dev, dtype=dt))
        self.direction_prior = direction_prior
        rho = _softplus_inv(lognormal_sigma)
        var = lognormal_sigma ** 2  # of log r: (4 sigma^2) / 4
        # kappa_q solves A_d(kappa_q) = 1 - init_eps, so E[direction] = (1 - init_eps) mu
        target = norms.detach().to(dt).clamp_min(1e-20) / (1.0 - init_eps)
        # E[r] = exp(m + var/2) = target; global m_s = 0 (a at its prior scale, b = 1/a),
        # local a at its prior scale tau_local^2, b carries the rest
        m = torch.log(target) - 0.5 * var
        la = torch.full((g,), 2 * math.log(tau_local), device=dev, dtype=dt)
        rhos = torch.full((g,), rho, device=dev, dtype=dt)
        self.local_radius = nn.Parameter(torch.stack([la, 2 * m - la, rhos, rhos]))
        self.global_radius = nn.Parameter(torch.tensor([2 * math.log(tau_global), -2 * math.log(tau_global), rho, rho],
                                                       device=dev, dtype=dt))

    local_a_loc, local_b_loc, local_a_rho, local_b_rho = (_radius_view("local_radius", i) for i in range(4))
    global_a_loc, global_b_loc, global_a_rho, global_b_rho = (_radius_view("global_radius", i) for i in range(4))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # state dicts written before the radius parameters were packed
        for packed in ("local", "global"):
            old = [prefix + f"{packed}_{k}" for k in _RADIUS_ROWS]
            if all(k in state_dict for k in old) and prefix + f"{packed}_radius" not in state_dict:
                state_dict[prefix + f"{packed}_radius"] = torch.stack([state_dict.pop(k) for k in old])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ---- distributions -------------------------------------------------------------
    @property
    def concentration(self):
        return self.log_concentration.exp()

    @property
    def loc(self):
        return F.normalize(self.direction, dim=-1)

    def direction_posterior(self) -> VonMisesFisher:
        return VonMisesFisher(self.loc, self.concentration.expand(self.num_groups), validate_args=False)

    def direction_prior_distribution(self):
        if self.direction_prior == "uniform":
            return HypersphericalUniform(self.dim, (self.num_groups,), dtype=self.direction.dtype,
                                         device=self.direction.device)
        return VonMisesFisher(self.loc.detach(), self.prior_concentration.expand(self.num_groups), validate_args=False)

    def radius_posteriors(self):
        """LogNormal posteriors of (local a, local b, global a, global b)."""
        lr, gr = self.local_radius, self.global_radius
        return (LogNormal(lr[0], F.softplus(lr[2]), validate_args=False),
                LogNormal(lr[1], F.softplus(lr[3]), validate_args=False),
                LogNormal(gr[0], F.softplus(gr[2]), validate_args=False),
                LogNormal(gr[1], F.softplus(gr[3]), validate_args=False))

    def radius_priors(self):
        half = torch.full_like(self.tau_local, 0.5)
        one = torch.ones_like(self.tau_local)
        return (Gamma(half, self.tau_local.pow(-2), validate_args=False), InverseGamma(half, one, validate_args=False),
                Gamma(half, self.tau_global.pow(-2), validate_args=False), InverseGamma(half, one, validate_args=False))

    def _log_radius_moments(self):
        """Location and variance of log r = log(s z) (log-normal)."""
        lr, gr = self.local_radius, self.global_radius
        sl, sg = F.softplus(lr[2:]), F.softplus(gr[2:])
        m = 0.5 * (lr[0] + lr[1] + gr[0] + gr[1])
        v = 0.25 * (sl[0] * sl[0] + sl[1] * sl[1] + sg[0] * sg[0] + sg[1] * sg[1])
        return m, v

    def log_mode_local(self) -> torch.Tensor:
        """Log of the mode of the local radius z_g = sqrt(a_g b_g) (the pruning statistic)."""
        lr = self.local_radius
        sl = F.softplus(lr[2:])
        return 0.5 * (lr[0] + lr[1]) - 0.25 * (sl[0] * sl[0] + sl[1] * sl[1])

    # ---- weights ---------------------------------------------------------------------
    def sample(self, num_samples):
        g = self.num_groups
        # the direction posterior's rsample, without building the distribution: the op
        # normalises the direction itself (and its backward differentiates that)
        x = vmf_sample(self.direction, self.log_concentration.exp().expand(g), (num_samples,))  # (S, G, d)
        lr, gr = self.local_radius, self.global_radius
        eps = torch.randn(4, num_samples, g, device=x.device, dtype=x.dtype)
        # log r = (log a + log b + log s_a + log s_b) / 2, each loc + scale * eps
        local = torch.addcmul(lr[:2].unsqueeze(1), F.softplus(lr[2:]).unsqueeze(1), eps[:2])  # (2, S, G)
        glob = torch.addcmul(gr[:2, None, None], F.softplus(gr[2:])[:, None, None], eps[2:, :, :1])  # (2, S, 1)
        return _scale_fresh(x, (0.5 * (local.sum(0) + glob.sum(0))).exp().unsqueeze(-1))

    def point(self, use):
        m, v = self._log_radius_moments()
        if use == "mean":
            a = special.bessel_iv_ratio(torch.full_like(self.concentration, 0.5 * self.dim), self.concentration)
            return ((m + 0.5 * v).exp() * a).unsqueeze(-1) * self.loc
        return (m - v).exp().unsqueeze(-1) * self.loc

    def kl_divergence(self):
        """KL of the G directions and the four radius factors (closed forms, one fused derivative)."""
        up = full_precision  # float16 / bfloat16: the KL in float32
        return _FactorKL.apply(up(self.log_concentration), up(self.local_radius), up(self.global_radius),
                               up(self.prior_concentration), up(self.tau_local), up(self.tau_global), self.dim,
                               self.direction_prior == "uniform")

    def extra_repr(self):
        return f"groups={self.num_groups}, dim={self.dim}"


class RDPPosterior(Distribution):
    """The RDP posterior over a layer's weight tensor as a distribution object.

    ``rsample(sample_shape)`` draws weights (reparameterised); ``mean`` is :math:`E[W]`,
    ``mode`` the weight at the modal radius and mean direction.  ``factors`` maps
    ``"row"`` / ``"column"`` to the grouping modules (their ``direction_posterior()`` and
    ``radius_posteriors()`` are the vMF and log-normal factors).  The density of :math:`W`
    itself is not tractable for double grouping and is not provided.
    """

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, layer):
        self._layer = layer
        self.factors = dict(layer._factors())
        super().__init__(torch.Size(), torch.Size(layer.weight_shape), validate_args=False)

    def rsample(self, sample_shape=torch.Size()):
        sample_shape = torch.Size(sample_shape)
        n = sample_shape.numel()
        return self._layer._sample_weight(n).reshape(sample_shape + self.event_shape)

    @property
    def mean(self):
        return self._layer._point_weight("mean")

    @property
    def mode(self):
        return self._layer._point_weight("mode")


class _RDP(BayesianModule):
    def _init_posterior(self, wshape, grouping, bias, tau_local, tau_global, prior_eps, init_eps,
                        lognormal_sigma, direction_prior, bias_prior, sigma_init, device, dtype, conv_groups=1):
        if grouping not in _GROUPINGS:
            raise ValueError(f"grouping must be one of {_GROUPINGS}, got {grouping!r}")
        for name, val in (("tau_local", tau_local), ("tau_global", tau_global), ("sigma_init", sigma_init),
                          ("lognormal_sigma", lognormal_sigma)):
            if not (isinstance(val, (int, float)) and val > 0 and math.isfinite(val)):
                raise ValueError(f"{name} must be a positive float, got {val!r}")
        for name, val in (("prior_eps", prior_eps), ("init_eps", init_eps)):
            if not (isinstance(val, (int, float)) and 0 < val < 1):
                raise ValueError(f"{name} must lie in (0, 1), got {val!r}")
        if direction_prior not in ("vmf", "uniform"):
            raise ValueError(f"direction_prior must be 'vmf' or 'uniform', got {direction_prior!r}")
        if grouping != "row" and conv_groups != 1:
            raise ValueError(f"grouping={grouping!r} needs groups=1 (a column of a grouped convolution is not one "
                             "input channel's weights); use grouping='row'")
        self.grouping = grouping
        self.weight_shape = torch.Size(wshape)
        out, inp = wshape[0], wshape[1]
        k = 1
        for s in wshape[2:]:
            k *= s
        self._k = k
        if grouping in ("row", "double") and inp * k < 2:
            raise ValueError(f"RDP row grouping needs at least 2 weights per row (in_features * kernel size), got "
                             f"{inp * k}: the layer is too small to group; use grouping='column' or a mean-field layer")
        if grouping in ("column", "double") and out * k < 2:
            raise ValueError(f"RDP column grouping needs at least 2 weights per column (out_features * kernel size), "
                             f"got {out * k}: the layer is too small to group; use grouping='row' or a mean-field layer")
        fk = {"device": device, "dtype": dtype}
        w0 = torch.empty(wshape, **fk)
        nn.init.kaiming_normal_(w0, nonlinearity="relu")
        self._hyper = dict(tau_local=tau_local, tau_global=tau_global, prior_eps=prior_eps, init_eps=init_eps,
                           lognormal_sigma=lognormal_sigma, direction_prior=direction_prior)
        self.row = None
        self.column = None
        self._set_factors(w0)
        if bias:
            self.bias_mu = nn.Parameter(torch.zeros(out, **fk))
            self.bias_rho = nn.Parameter(torch.full((out,), _softplus_inv(sigma_init), **fk))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_rho", None)
        self.bias_prior = _Prior(bias_prior, "bias_prior", device=device, dtype=dtype)

    def _set_factors(self, w):
        """(Re)initialise the factors so that the posterior mean of W is ``w``."""
        h = self._hyper
        rows = self._row_view(w)
        cols = self._col_view(w)
        if self.grouping == "row":
            self.row = _RDPFactor(rows, rows.norm(dim=-1), **h)
        elif self.grouping == "column":
            self.column = _RDPFactor(cols, cols.norm(dim=-1), **h)
        else:
            self.row = _RDPFactor(rows, rows.norm(dim=-1), **h)
            ones = torch.ones_like(cols)
            self.column = _RDPFactor(ones, ones.norm(dim=-1), **h)

    def _row_view(self, w):
        return w.reshape(w.shape[0], -1)

    def _col_view(self, w):
        return w.transpose(0, 1).reshape(w.shape[1], -1)

    def _from_cols(self, c, lead):
        # c: lead + (I, O*k) -> lead + weight_shape
        o, i = self.weight_shape[0], self.weight_shape[1]
        c = c.reshape(lead + (i, o) + tuple(self.weight_shape[2:]))
        return c.transpose(len(lead), len(lead) + 1)

    def _factors(self):
        out = []
        if self.row is not None:
            out.append(("row", self.row))
        if self.column is not None:
            out.append(("column", self.column))
        return out

    def _sample_weight(self, n):
        w = None
        if self.row is not None:
            w = self.row.sample(n).reshape((n,) + tuple(self.weight_shape))
        if self.column is not None:
            c = self._from_cols(self.column.sample(n), (n,))
            w = c if w is None else _scale_fresh(w, c)
        return w

    def _point_weight(self, use):
        w = None
        if self.row is not None:
            w = self.row.point(use).reshape(self.weight_shape)
        if self.column is not None:
            c = self._from_cols(self.column.point(use), ())
            w = c if w is None else w * c
        return w

    # ---- BayesianModule API ------------------------------------------------------
    def weight_posterior(self) -> RDPPosterior:
        return RDPPosterior(self)

    def bias_posterior(self):
        if self.bias_mu is None:
            return None
        return Independent(Normal(self.bias_mu, F.softplus(self.bias_rho), validate_args=False), 1,
                           validate_args=False)

    def kl_divergence(self) -> torch.Tensor:
        """Sum of the closed-form KLs: vMF directions, the four log-normal radius factors per
        grouping, and the Gaussian bias."""
        kl = sum(f.kl_divergence() for _, f in self._factors())
        if self.bias_mu is not None:
            mu, rho = full_precision(self.bias_mu), full_precision(self.bias_rho)
            prior = _fusable(mu, self.bias_prior)
            kl = kl + (meanfield_kl(mu, rho, *prior, validate_args=False) if prior is not None
                       else kl_normal_to_prior(mu, F.softplus(rho), self.bias_prior, 16))
        return kl

    def point_weights(self, use):
        return self._point_weight(use), self.bias_mu

    def sample_weights(self, num_samples):
        w = self._sample_weight(num_samples)
        b = None
        if self.bias_mu is not None:
            b = self.bias_mu + F.softplus(self.bias_rho) * torch.randn(
                (num_samples,) + tuple(self.bias_mu.shape), dtype=self.bias_mu.dtype, device=self.bias_mu.device)
        return w, b

    def log_modes(self) -> dict:
        """``{"row": ..., "column": ...}``: log-modes of the local radii per group (detached)."""
        return {name: f.log_mode_local().detach() for name, f in self._factors()}

    @torch.no_grad()
    def init_from_weights(self, weight: torch.Tensor, bias: Optional[torch.Tensor] = None):
        """Initialise the posterior so that its mean is ``weight`` (and the bias mean ``bias``)."""
        if tuple(weight.shape) != tuple(self.weight_shape):
            raise ValueError(f"weight: expected shape {tuple(self.weight_shape)}, got {tuple(weight.shape)}")
        ref = (self.row if self.row is not None else self.column).direction
        self._set_factors(weight.detach().to(device=ref.device, dtype=ref.dtype))
        if bias is not None and self.bias_mu is not None:
            self.bias_mu.copy_(bias)


_RDP_DOC_OPTIONS = r"""
    Args:
        grouping: ``"row"`` (default), ``"column"`` or ``"double"`` (paper §3.3).
        tau_local, tau_global: half-Cauchy scales of the local and global radius factors
            (defaults 1e-2 and 1e-3, the paper's).
        prior_eps: the prior concentration solves :math:`A_d(\kappa_p) = 1 - \epsilon` (default 0.1).
        init_eps: the initial posterior concentration solves :math:`A_d(\kappa) = 1 - \epsilon`
            (default 1e-3: nearly deterministic directions at the start).
        lognormal_sigma: initial scale of the four log-normal radius factors (default 0.01).
        direction_prior: ``"vmf"`` (default; prior mean direction fitted, see the module docs)
            or ``"uniform"``.
        bias_prior: prior of the (mean-field Gaussian) bias: float = N(0, s^2) (default 1.0).
        sigma_init: initial standard deviation of the bias (default 1e-3).
"""


class RDPLinear(_LinearOps, _RDP):
    __doc__ = r"""A linear layer with the radial--directional posterior (module docstring).

    Same constructor as :class:`torch.nn.Linear`.
    """ + _RDP_DOC_OPTIONS

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 grouping: str = "row", tau_local: float = 1e-2, tau_global: float = 1e-3, prior_eps: float = 0.1,
                 init_eps: float = 1e-3, lognormal_sigma: float = 0.01, direction_prior: str = "vmf",
                 bias_prior=1.0, sigma_init: float = 1e-3):
        super().__init__()
        wshape = _linear_setup(self, in_features, out_features)
        self._init_posterior(wshape, grouping, bias, tau_local, tau_global, prior_eps, init_eps, lognormal_sigma,
                             direction_prior, bias_prior, sigma_init, device, dtype)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias_mu is not None}, grouping={self.grouping!r}, mode={self.mode!r}")


class RDPConv2d(_ConvOps, _RDP):
    __doc__ = r"""A 2-d convolution with the radial--directional posterior: rows are output
    channels (``in_channels/groups * kh * kw`` weights each), columns are input channels
    (``out_channels * kh * kw`` weights each; needs ``groups=1``).

    Same constructor as :class:`torch.nn.Conv2d` (``padding_mode="zeros"`` only).
    """ + _RDP_DOC_OPTIONS

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None, *,
                 grouping: str = "row", tau_local: float = 1e-2, tau_global: float = 1e-3, prior_eps: float = 0.1,
                 init_eps: float = 1e-3, lognormal_sigma: float = 0.01, direction_prior: str = "vmf",
                 bias_prior=1.0, sigma_init: float = 1e-3):
        super().__init__()
        wshape = _conv_setup(self, in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                             padding_mode)
        self._init_posterior(wshape, grouping, bias, tau_local, tau_global, prior_eps, init_eps, lognormal_sigma,
                             direction_prior, bias_prior, sigma_init, device, dtype, conv_groups=groups)

    def extra_repr(self):
        return _conv_repr(self) + f", bias={self.bias_mu is not None}, grouping={self.grouping!r}, mode={self.mode!r}"


def param_groups(model: nn.Module, radius_lr: float = 1e-2) -> list:
    r"""Optimizer parameter groups that give the RDP radius parameters (the log-normal local and
    global scales of every :class:`RDPLinear` / :class:`RDPConv2d`) their own learning rate:

    ``torch.optim.Adam(vmfdist.nn.param_groups(model, radius_lr=1e-2), lr=1e-3)``

    The first group holds every other parameter and takes the optimizer's ``lr``.  With one
    learning rate of 1e-3 for everything, Adam moves a log-radius by at most about 1e-3 a step,
    so a run of a few thousand steps cannot shrink a group's radius by the orders of magnitude
    that pruning needs: a 64-100-100-10 MLP on scikit-learn's digits trained 60 epochs kept every
    neuron (log-modes all near 0.3, no gap).  With ``radius_lr=1e-2`` the same run pruned 20 %
    of the hidden neurons (2.8 % test error against 2.3 %), and 3e-2 about a third (docs/nn.md).  The
    authors' MNIST runs use 1e-3 for everything, over 120,000 steps."""
    if not (isinstance(radius_lr, (int, float)) and math.isfinite(radius_lr) and radius_lr > 0):
        raise ValueError(f"param_groups: radius_lr must be a finite positive number, got {radius_lr!r}")
    radius_ids = {id(m.local_radius) for m in model.modules() if isinstance(m, _RDPFactor)}
    radius_ids |= {id(m.global_radius) for m in model.modules() if isinstance(m, _RDPFactor)}
    radius = [p for p in model.parameters() if id(p) in radius_ids]
    rest = [p for p in model.parameters() if id(p) not in radius_ids]
    if not radius:
        raise ValueError("param_groups: the model has no RDP layers (use vmfdist.nn.to_bayesian(model, 'rdp'))")
    return [{"params": rest}, {"params": radius, "lr": float(radius_lr)}]
