r"""The Radial posterior of Radial BNNs (Farquhar, Osborne & Gal, 2020).

One Radial distribution covers a whole weight tensor :math:`w \in \mathbb{R}^D`
(event shape ``loc.shape``, batch shape ``()``):

.. math::

    w = \mu + \sigma \odot \frac{\epsilon}{\|\epsilon\|}\, r, \qquad
    \epsilon \sim \mathcal N(0, I_D),\ r \sim \mathcal N(0, 1).

With :math:`v = (w - \mu)/\sigma` the direction :math:`v/\|v\|` is uniform on
:math:`S^{D-1}` and :math:`\|v\| = |r|` is half-normal, so

.. math::

    \log q(w) = \log\big(2\varphi(\|v\|)\big) - \log S_{D-1} - (D-1)\log\|v\| - \sum_i\log\sigma_i,

:math:`S_{D-1} = 2\pi^{D/2}/\Gamma(D/2)`, and the entropy, with
:math:`E\log|r| = -(\gamma + \log 2)/2` and :math:`E\log 2\varphi(|r|) = \log 2 - \tfrac12\log 2\pi - \tfrac12`, is

.. math::

    H[q] = \tfrac12\log 2\pi + \tfrac12 - \log 2 + \log S_{D-1} - \tfrac{D-1}{2}(\gamma + \log 2)
           + \sum_i \log\sigma_i .

(:math:`D = 1` gives the normal entropy :math:`\tfrac12\log 2\pi e\sigma^2`.)  Sampling is the
fused compiled op ``radial_noise`` (one pass to draw and normalise, one to scale and
shift, no temporaries; the scale gradient regenerates :math:`\epsilon` from the Philox
streams instead of storing it).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch.distributions import Distribution, constraints

from .._ops import lib
from .._ops.random import call_sampler
from ._constants import EULER_GAMMA, LOG_2PI
from .von_mises_fisher import log_sphere_area

__all__ = ["Radial", "radial_noise", "kl_radial_radial"]



def radial_noise(loc: torch.Tensor, scale: torch.Tensor, sample_shape=torch.Size(), rowwise: bool = False,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""``loc + scale * eps / |eps| * r`` for each of ``sample_shape`` samples, in one fused op.

    ``|eps|`` is taken over the whole of ``loc.shape`` (one radius per sample), or over the
    last dimension only with ``rowwise=True`` (one radius per row; ``r`` then multiplies a
    uniform direction per row).  Differentiable in ``loc`` and ``scale``; the seed of the
    Philox streams is drawn from ``generator`` (default: the global CPU generator).
    """
    loc, scale = torch.broadcast_tensors(torch.as_tensor(loc), torch.as_tensor(scale))
    dtype = torch.promote_types(loc.dtype, scale.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    loc, scale = loc.to(dtype), scale.to(dtype)
    out, _, _ = call_sampler("radial_noise", lib.radial_noise, loc, scale, sample_shape=sample_shape,
                             generator=generator, streams=2, rowwise=bool(rowwise))
    return out


class Radial(Distribution):
    r"""Radial distribution over a whole tensor (see the module docstring).

    Args:
        loc: :math:`\mu`, any shape (the event shape).
        scale: :math:`\sigma > 0`, broadcastable to ``loc``.

    ``batch_shape`` is ``()``: one distribution per tensor, as in a Radial BNN layer
    (stack layers in a ``list``, not in batch dimensions).  ``mean`` is ``loc`` and
    ``variance`` is ``scale**2 / D`` (:math:`E[v_i^2] = E[r^2]/D`).
    """

    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        loc, scale = torch.broadcast_tensors(torch.as_tensor(loc), torch.as_tensor(scale))
        dtype = torch.promote_types(loc.dtype, scale.dtype)
        if not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        self.loc, self.scale = loc.to(dtype), scale.to(dtype)
        if self.loc.numel() == 0:
            raise ValueError("loc must have at least one element")
        self.arg_constraints = {
            "loc": constraints.independent(constraints.real, self.loc.dim()),
            "scale": constraints.independent(constraints.positive, self.loc.dim()),
        }
        super().__init__(torch.Size(), self.loc.shape, validate_args=validate_args)

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.independent(constraints.real, self.loc.dim())

    @property
    def numel(self) -> int:
        """D, the number of elements of the event."""
        return self.loc.numel()

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != torch.Size():
            raise ValueError("Radial has batch shape (); it cannot be expanded to a batch")
        return self

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return self.scale.pow(2) / self.numel

    def rsample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        return radial_noise(self.loc, self.scale, sample_shape, generator=generator)

    def sample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        with torch.no_grad():
            return self.rsample(sample_shape, generator=generator)

    def _event_dims(self):
        return tuple(range(-self.loc.dim(), 0)) if self.loc.dim() else ()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        d = self.numel
        v = (value - self.loc) / self.scale
        dims = self._event_dims()
        sq = v.pow(2).sum(dims) if dims else v.pow(2)
        log_rho = 0.5 * torch.log(sq)
        log_sigma = self.scale.log().sum() if dims else self.scale.log()
        # a tensor (d may be symbolic under torch.compile), computed in float64 as before
        log_area = log_sphere_area(d, dtype=torch.float64, device=sq.device).to(sq.dtype)
        lp = (math.log(2.0) - 0.5 * LOG_2PI - 0.5 * sq - log_area
              - (d - 1) * log_rho - log_sigma)
        if d == 1:  # (D - 1) log|v| = 0 also at v = 0
            lp = math.log(2.0) - 0.5 * LOG_2PI - 0.5 * sq - log_area - log_sigma
        return lp

    def entropy(self):
        d = self.numel
        const = (0.5 * LOG_2PI + 0.5 - math.log(2.0)
                 + log_sphere_area(d, dtype=torch.float64, device=self.scale.device).to(self.scale.dtype)
                 - 0.5 * (d - 1) * (EULER_GAMMA + math.log(2.0)))
        return const + self.scale.log().sum()


def kl_radial_radial(q: Radial, p: Radial, num_samples: int = 16,
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Unbiased Monte Carlo estimate of KL(q || p) between two Radial distributions:
    :math:`-H[q] - \frac1S\sum_s \log p(w_s)`, :math:`w_s \sim q` (reparameterised, so it can
    be differentiated), with the *exact* Radial log-density of ``p``.

    The cross-entropy in appendix C of the Radial BNN paper misses the Jacobian between the
    two noise spaces (its authors' note says so); here no change of noise space is made:
    :math:`\log p` is evaluated at the weights themselves, which is correct by definition.
    Stochastic (hence not registered with ``kl_divergence``); the standard error falls as
    :math:`1/\sqrt{S}`.
    """
    if q.event_shape != p.event_shape:
        raise ValueError(f"event shapes differ: {tuple(q.event_shape)} and {tuple(p.event_shape)}")
    if num_samples < 1:
        raise ValueError(f"num_samples must be positive, got {num_samples}")
    w = q.rsample((num_samples,), generator=generator)
    return -q.entropy() - p.log_prob(w).mean()
