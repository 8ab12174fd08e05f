r"""Transforms onto the unit sphere, registered for the :data:`~vmfdist.distributions.sphere`
constraint so that ``torch.distributions.biject_to(sphere)`` and ``transform_to(sphere)``
work (constrained parameters, Pyro-style guides and HMC over a vMF's support).

* ``transform_to(sphere)`` is :class:`NormalizeTransform`, :math:`x \mapsto x/\|x\|` from
  :math:`\mathbb{R}^d` (not bijective; like torch's ``SoftmaxTransform`` for the simplex): the
  natural map for an unconstrained direction parameter.
* ``biject_to(sphere)`` is :class:`StereographicTransform`, the inverse stereographic
  projection from :math:`\mathbb{R}^{d-1}` onto the sphere without the point :math:`-e_1`
  (a set of measure zero), with the log-Jacobian taken against the *surface measure* of the
  sphere, the measure of :class:`~vmfdist.distributions.VonMisesFisher`'s density.  So
  ``TransformedDistribution(base, StereographicTransform())`` and ``log p(x) + log|J|`` in
  the unconstrained space are exact densities (the tests integrate them to one).

The projection from the pole :math:`-e_1`, with :math:`s = \|y\|^2`:

.. math::

    x = \Big(\frac{1 - s}{1 + s},\ \frac{2y}{1 + s}\Big), \qquad
    y = \frac{x_{1:}}{1 + x_0} = \frac{x_{1:}(1 - x_0)}{\|x_{1:}\|^2},

:math:`y = 0 \mapsto e_1`.  It is conformal with factor :math:`2/(1 + s)`, so the
:math:`(d-1)`-dimensional volume scales by :math:`\log|J| = (d-1)(\log 2 - \log(1 + s))`.
The second form of the inverse (used where :math:`x_0 < 0`) avoids the cancellation in
:math:`1 + x_0` near the pole, and for :math:`\|y\| > 1` the forward map is evaluated in
:math:`1/\|y\|`, so no square overflows.  The pole itself (:math:`\|y\| = \infty`) has no
finite preimage: the inverse returns non-finite values there.
"""
from __future__ import annotations

import math

import torch
from torch.distributions import biject_to, constraints, transform_to
from torch.distributions.transforms import Transform

from .von_mises_fisher import _Sphere, sphere

__all__ = ["NormalizeTransform", "StereographicTransform"]

_LOG2 = math.log(2.0)


def _norm(v: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """The Euclidean norm over the last dimension, scaled by the largest entry so that it
    neither overflows (entries above 1e154) nor underflows (below 1e-154)."""
    m = v.abs().amax(-1, keepdim=True)
    safe = torch.where(m > 0, m, torch.ones_like(m))
    n = torch.linalg.vector_norm(v / safe, dim=-1, keepdim=True) * safe
    return n if keepdim else n.squeeze(-1)


class NormalizeTransform(Transform):
    r""":math:`x \mapsto x/\|x\|` along the last dimension, from :math:`\mathbb{R}^d` onto the
    sphere (the zero vector, where the direction is undefined, maps to :math:`e_1`).  Not
    bijective; its ``inv`` maps a point of the sphere to itself, a right inverse."""

    domain = constraints.real_vector
    codomain = sphere
    bijective = False

    def __eq__(self, other):
        return isinstance(other, NormalizeTransform)

    def _call(self, x):
        norm = _norm(x, keepdim=True)
        pos = norm > 0
        out = x / torch.where(pos, norm, torch.ones_like(norm))
        e1 = torch.zeros_like(x)
        e1[..., 0] = 1.0
        return torch.where(pos, out, e1)

    def _inverse(self, y):
        return y


class StereographicTransform(Transform):
    r"""The inverse stereographic projection :math:`\mathbb{R}^{d-1}\to S^{d-1}\setminus\{-e_1\}`
    (see the module docstring), a bijection with
    :math:`\log|J| = (d-1)(\log 2 - \log(1 + \|y\|^2))` against the surface measure."""

    domain = constraints.real_vector
    codomain = sphere
    bijective = True

    def __eq__(self, other):
        return isinstance(other, StereographicTransform)

    def _call(self, y):
        if y.dim() < 1 or y.shape[-1] < 1:
            raise ValueError(f"StereographicTransform: y must have shape (..., d - 1) with d - 1 >= 1, got "
                             f"{tuple(y.shape)}")
        n = _norm(y, keepdim=True)
        big = n > 1
        # |y| <= 1: s = |y|^2;  |y| > 1: t = 1 / |y|, s = 1 / t^2 (no overflow)
        ys = torch.where(big, torch.zeros_like(y), y)
        s = ys.pow(2).sum(-1, keepdim=True)
        t = 1.0 / torch.where(big, n, torch.ones_like(n))
        x0 = torch.where(big, (t * t - 1) / (t * t + 1), (1 - s) / (1 + s))
        xt = torch.where(big, 2 * (y * t) * t / (1 + t * t), 2 * ys / (1 + s))
        return torch.cat([x0, xt], dim=-1)

    def _inverse(self, x):
        if x.dim() < 1 or x.shape[-1] < 2:
            raise ValueError(f"StereographicTransform: x must have shape (..., d) with d >= 2, got {tuple(x.shape)}")
        x0, xt = x[..., :1], x[..., 1:]
        neg = x0 < 0
        # x0 >= 0: 1 + x0 >= 1;  x0 < 0: 1 + x0 = |xt|^2 / (1 - x0) on the sphere (no cancellation)
        up = xt / torch.where(neg, torch.ones_like(x0), 1 + x0)
        nt = _norm(xt, keepdim=True)
        nt = torch.where(neg, nt, torch.ones_like(nt))
        down = (xt / nt) * ((1 - x0) / nt)  # not through |xt|^2, which underflows near the pole
        return torch.where(neg, down, up)

    def log_abs_det_jacobian(self, y, x):
        n = _norm(y)
        big = n > 1
        small_n = torch.where(big, torch.zeros_like(n), n)
        inv_n = 1.0 / torch.where(big, n, torch.ones_like(n))
        log1p_s = torch.where(big, 2 * torch.log(torch.where(big, n, torch.ones_like(n))) + torch.log1p(inv_n * inv_n),
                              torch.log1p(small_n * small_n))
        return (y.shape[-1]) * (_LOG2 - log1p_s)

    def forward_shape(self, shape):
        if len(shape) < 1:
            raise ValueError("StereographicTransform: too few dimensions on input")
        return shape[:-1] + (shape[-1] + 1,)

    def inverse_shape(self, shape):
        if len(shape) < 1 or shape[-1] < 2:
            raise ValueError("StereographicTransform: the sphere's points need d >= 2 coordinates")
        return shape[:-1] + (shape[-1] - 1,)


@biject_to.register(_Sphere)
def _biject_to_sphere(constraint):
    return StereographicTransform()


@transform_to.register(_Sphere)
def _transform_to_sphere(constraint):
    return NormalizeTransform()
