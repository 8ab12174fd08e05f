r"""The Radial posterior of Radial BNNs (Farquhar, Osborne & Gal, 2020).

One Radial distribution covers a whole weight tensor :math:`w \in \mathbb{R}^D`
(by default event shape ``loc.shape`` and batch shape ``()``; ``event_dims`` makes the
leading dimensions a batch of independent Radials):

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
from .._ops.random import call_sampler, random_kwargs
from ._constants import EULER_GAMMA, LOG_2PI
from ._validation import as_real_tensor, check_value, same_device
from .meanfield import _loc_rho, _num_samples, _shaped
from .von_mises_fisher import log_sphere_area

__all__ = ["Radial", "radial_noise", "radial_sample", "kl_radial_radial"]



def radial_noise(loc: torch.Tensor, scale: torch.Tensor, sample_shape=torch.Size(), rowwise: bool = False,
                 generator: Optional[torch.Generator] = None, save_noise: bool = False) -> torch.Tensor:
    r"""``loc + scale * eps / |eps| * r`` for each of ``sample_shape`` samples, in one fused op.

    ``|eps|`` is taken over the whole of ``loc.shape`` (one radius per sample), or over the
    last dimension only with ``rowwise=True`` (one radius per row; ``r`` then multiplies a
    uniform direction per row).  Differentiable in ``loc`` and ``scale``; the seed of the
    Philox streams is drawn inside the op from ``generator`` (default: the default generator of
    ``loc``'s device; see :mod:`vmfdist.random`).  The backward pass regenerates the normals
    from the streams; with ``save_noise=True`` they are kept from the forward pass instead (one
    more tensor of the output's size held until the backward; a faster backward, the same values).
    """
    loc, scale = torch.broadcast_tensors(torch.as_tensor(loc), torch.as_tensor(scale))
    dtype = torch.promote_types(loc.dtype, scale.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    loc, scale = loc.to(dtype), scale.to(dtype)
    out, _, _, _ = call_sampler("radial_noise", lib.radial_noise, loc, scale, sample_shape=sample_shape,
                                generator=generator, streams=2, rowwise=bool(rowwise), save_noise=bool(save_noise))
    return out


def radial_sample(loc: torch.Tensor, rho: torch.Tensor, sample_shape=torch.Size(),
                  generator: Optional[torch.Generator] = None, *, save_noise: bool = False) -> torch.Tensor:
    r""":func:`radial_noise` over the whole tensor with ``scale = softplus(rho)`` computed inside the
    op (the parameterisation of the Radial layers; the same normals and radii for the same seed),
    differentiable in ``loc`` and ``rho``.  ``loc`` and ``rho`` have one shape.  With the KL to a
    Gaussian prior in the same pass: :func:`~vmfdist.distributions.kl.radial_sample_kl`."""
    loc, rho = _loc_rho("radial_sample", loc, rho)
    if loc is None:
        raise TypeError("radial_sample: loc must be a tensor, got None")
    shape, n = _num_samples("radial_sample", sample_shape)
    out = lib.radial_sample(loc, rho, None, None, n, bool(save_noise),
                            **random_kwargs("radial_sample", generator, streams=2))[0]
    return _shaped(out, shape, rho)


class Radial(Distribution):
    r"""Radial distribution over a tensor (see the module docstring), or a batch of them.

    Args:
        loc: :math:`\mu`, of shape ``batch_shape + event_shape``.
        scale: :math:`\sigma > 0`, broadcastable with ``loc``.
        event_dims: how many trailing dimensions of (the broadcast) ``loc`` form one Radial
            distribution, :math:`0 \le k \le` ``loc.dim()``; the leading ones are the batch.
            Default: all of them, i.e. one distribution over the whole tensor (batch shape
            ``()``), as in a Radial BNN layer.  With :math:`k = 0` every element is its own
            :math:`D = 1` Radial, which is :math:`\mathcal N(\mu, \sigma^2)`.
        validate_args: as in :mod:`torch.distributions`.

    ``event_shape`` is ``loc.shape[-k:]`` with :math:`D` (:attr:`numel`) elements, at least
    one.  ``mean`` is ``loc`` and ``variance`` is ``scale**2 / D`` (:math:`E[v_i^2] = E[r^2]/D`).
    Batched samples draw one radius and one direction per event (the fused op's ``rowwise``
    mode over ``(batch, D)`` rows).
    """

    has_rsample = True
    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}

    def __init__(self, loc, scale, event_dims: Optional[int] = None, validate_args=None):
        loc, scale = as_real_tensor("loc", loc), as_real_tensor("scale", scale)
        same_device("Radial", {"loc": loc, "scale": scale})
        try:
            loc, scale = torch.broadcast_tensors(loc, scale)
        except RuntimeError:
            raise ValueError(f"Radial: loc (shape {tuple(loc.shape)}) and scale (shape {tuple(scale.shape)}) do not "
                             f"broadcast") from None
        dtype = torch.promote_types(loc.dtype, scale.dtype)
        self.loc, self.scale = loc.to(dtype), scale.to(dtype)
        if event_dims is None:
            event_dims = self.loc.dim()
        if isinstance(event_dims, bool) or not isinstance(event_dims, int):
            raise TypeError(f"event_dims must be an int or None, got {event_dims!r}")
        if not 0 <= event_dims <= self.loc.dim():
            raise ValueError(f"event_dims must be between 0 and loc.dim() = {self.loc.dim()} (the broadcast shape "
                             f"of loc and scale is {tuple(self.loc.shape)}), got {event_dims}")
        split = self.loc.dim() - event_dims
        batch_shape, event_shape = self.loc.shape[:split], self.loc.shape[split:]
        if event_shape.numel() == 0:
            raise ValueError(f"the event (the last event_dims = {event_dims} dimensions of loc) must have at least one "
                             f"element, got event shape {tuple(event_shape)}")
        self._set_event_dims(event_dims)
        super().__init__(batch_shape, event_shape, validate_args=validate_args)

    def _set_event_dims(self, k: int) -> None:
        self._event_dims = k
        self.arg_constraints = {"loc": constraints.independent(constraints.real, k),
                                "scale": constraints.independent(constraints.positive, k)}

    @constraints.dependent_property(is_discrete=False)
    def support(self):
        """The support, ``independent(real, event_dims)`` on an instance (real tensors of the event
        shape); on the class a dependent constraint, since its event dimension depends on ``event_dims``."""
        return constraints.independent(constraints.real, self._event_dims)

    @property
    def numel(self) -> int:
        """D, the number of elements of one event."""
        return self.event_shape.numel()

    @property
    def event_dims(self) -> int:
        """The number of trailing dimensions of ``loc`` that form one event."""
        return self._event_dims

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Radial, _instance)
        batch_shape = torch.Size(batch_shape)
        new.loc = self.loc.expand(batch_shape + self.event_shape)
        new.scale = self.scale.expand(batch_shape + self.event_shape)
        new._set_event_dims(self._event_dims)
        super(Radial, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

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
        sample_shape = torch.Size(sample_shape)
        if not self.batch_shape and self._event_dims > 0:
            return radial_noise(self.loc, self.scale, sample_shape, generator=generator)
        # a batch (or k = 0): one row of D elements per event, normalised per row
        rows = (self.batch_shape.numel(), self.numel)
        w = radial_noise(self.loc.reshape(rows), self.scale.reshape(rows), sample_shape, rowwise=True,
                         generator=generator)
        return w.reshape(self._extended_shape(sample_shape))

    def sample(self, sample_shape=torch.Size(), generator: Optional[torch.Generator] = None):
        with torch.no_grad():
            return self.rsample(sample_shape, generator=generator)

    def _event_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the event dimensions (the last ``event_dims``)."""
        k = self._event_dims
        return x.sum(tuple(range(-k, 0))) if k else x

    def log_prob(self, value):
        check_value("Radial", value, self.batch_shape, self.event_shape)
        if self._validate_args:
            self._validate_sample(value)
        d = self.numel
        v = (value - self.loc) / self.scale
        sq = self._event_sum(v.pow(2))
        # a tensor (d may be symbolic under torch.compile), computed in float64 and rounded once
        log_area = log_sphere_area(d, dtype=torch.float64, device=sq.device).to(sq.dtype)
        const = math.log(2.0) - 0.5 * LOG_2PI - log_area
        lp = const - 0.5 * sq - self._event_sum(self.scale.log())
        if d > 1:  # (D - 1) log|v|, and 0 for D = 1 also at v = 0
            lp = lp - (d - 1) * (0.5 * torch.log(sq))
        return lp

    def entropy(self):
        d = self.numel
        const = (0.5 * LOG_2PI + 0.5 - math.log(2.0)
                 + log_sphere_area(d, dtype=torch.float64, device=self.scale.device).to(self.scale.dtype)
                 - 0.5 * (d - 1) * (EULER_GAMMA + math.log(2.0)))
        return const + self._event_sum(self.scale.log())


def kl_radial_radial(q: Radial, p: Radial, num_samples: int = 16,
                     generator: Optional[torch.Generator] = None) -> torch.Tensor:
    r"""Unbiased Monte Carlo estimate of KL(q || p) between two Radial distributions:
    :math:`-H[q] - \frac1S\sum_s \log p(w_s)`, :math:`w_s \sim q` (reparameterised, so it can
    be differentiated), with the *exact* Radial log-density of ``p``.

    The cross-entropy in appendix C of the Radial BNN paper misses the Jacobian between the
    two noise spaces (its authors' note says so); here no change of noise space is made:
    :math:`\log p` is evaluated at the weights themselves, which is correct by definition.
    Stochastic (hence not registered with ``kl_divergence``); the standard error falls as
    :math:`1/\sqrt{S}`.  Batched: one estimate per element of the broadcast batch shape.
    """
    if q.event_shape != p.event_shape:
        raise ValueError(f"event shapes differ: {tuple(q.event_shape)} and {tuple(p.event_shape)}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    w = q.rsample((num_samples,), generator=generator)
    return -q.entropy() - p.log_prob(w).mean(0)
