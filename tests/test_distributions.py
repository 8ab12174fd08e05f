"""torch.distributions conventions across vmfdist's distributions, and the sphere transforms.

References: torch's own conventions (arg_constraints keyed by constructor arguments, expand,
support checks, as in torch's test_distributions.py), autograd Jacobians (dense), and SciPy
quadrature over the sphere in spherical coordinates (independent of the transforms' formulas).
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from torch.distributions import (Independent, Normal, TransformedDistribution, biject_to, constraints,
                                 transform_to)

from vmfdist.distributions import (EigenvalueCorrectedMatrixNormal, MatrixNormal,
                                   NormalizeTransform, Radial, StereographicTransform, VonMisesFisher, sphere)

F64 = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def unit(d, seed):
    v = torch.randn(d, generator=gen(seed), dtype=F64)
    return v / v.norm()


# ---------------------------------------------------------------------------
# conventions every distribution follows


def examples():
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=gen(1), dtype=F64))
    return [
        (VonMisesFisher, dict(loc=torch.stack([unit(4, 1), unit(4, 2)]), concentration=torch.tensor([1.0, 30.0],
                                                                                                    dtype=F64))),
        (Radial, dict(loc=torch.randn(2, 5, generator=gen(2), dtype=F64),
                      scale=torch.rand(2, 5, generator=gen(3), dtype=F64) + 0.5, event_dims=1)),
        (Radial, dict(loc=torch.randn(2, 5, generator=gen(2), dtype=F64), scale=torch.full((2, 5), 0.7, dtype=F64))),
        (MatrixNormal, dict(loc=torch.randn(2, 3, 2, generator=gen(4), dtype=F64),
                            row_covariance=2.0 * torch.eye(3, dtype=F64))),
        (MatrixNormal, dict(loc=torch.randn(3, 2, generator=gen(4), dtype=F64))),
        (EigenvalueCorrectedMatrixNormal, dict(loc=torch.zeros(2, 3, 2, dtype=F64), q_out=q, q_in=torch.eye(2, dtype=F64),
                                               variance=torch.rand(3, 2, generator=gen(5), dtype=F64) + 0.1)),
    ]


@pytest.mark.parametrize("dist,params", examples(), ids=lambda x: getattr(x, "__name__", ""))
def test_conventions(dist, params):
    d = dist(**params, validate_args=True)
    names = set(inspect.signature(dist.__init__).parameters)
    for name, value in params.items():  # as torch's test_params_constraints
        if name in d.arg_constraints:
            assert bool(d.arg_constraints[name].check(value).all()), name
    assert set(d.arg_constraints) <= names
    x = d.sample((3,), generator=gen(7))
    assert x.shape == (3,) + d.batch_shape + d.event_shape
    assert bool(d.support.check(x).all())
    assert d.support.event_dim == len(d.event_shape)
    assert d.log_prob(x).shape == (3,) + d.batch_shape
    assert d.entropy().shape == d.batch_shape
    e = d.expand((4,) + d.batch_shape)
    assert type(e) is dist and e.batch_shape == (4,) + d.batch_shape and e.event_shape == d.event_shape
    torch.testing.assert_close(e.log_prob(x.unsqueeze(1)), d.log_prob(x).unsqueeze(1).expand(3, 4, *d.batch_shape),
                               rtol=0, atol=0)
    assert e.sample((2,), generator=gen(8)).shape == (2, 4) + d.batch_shape + d.event_shape


# ---------------------------------------------------------------------------
# transform_to(sphere): normalisation


def test_transform_to_sphere_is_on_the_sphere_and_differentiable():
    t = transform_to(sphere)
    assert isinstance(t, NormalizeTransform) and t.codomain is sphere and not t.bijective
    x = torch.randn(6, 5, generator=gen(1), dtype=F64) * torch.tensor([[1e-300], [1e-5], [1.0], [1e5], [1e300],
                                                                        [3.0]], dtype=F64)
    y = t(x)
    torch.testing.assert_close(y.norm(dim=-1), torch.ones(6, dtype=F64), rtol=0, atol=4e-16)
    assert bool(sphere.check(y).all())
    # against torch's normalize on rescaled inputs (whose norm would under/overflow at 1e-300 and 1e300)
    rescaled = x * torch.tensor([[1e300], [1.0], [1.0], [1.0], [1e-300], [1.0]], dtype=F64)
    torch.testing.assert_close(y, torch.nn.functional.normalize(rescaled, dim=-1), rtol=1e-15, atol=1e-16)
    torch.testing.assert_close(t(torch.zeros(2, 3, dtype=F64)), torch.eye(3, dtype=F64)[[0, 0]], rtol=0, atol=0)
    torch.testing.assert_close(t.inv(y), y, rtol=0, atol=0)  # a right inverse
    assert torch.autograd.gradcheck(t, (torch.randn(3, 4, generator=gen(2), dtype=F64, requires_grad=True),))
    # an unconstrained parameter drives a vMF's mean direction (the Pyro-style constrained parameter)
    raw = torch.randn(4, generator=gen(3), dtype=F64, requires_grad=True)
    data = VonMisesFisher(unit(4, 4), 20.0).sample((50,), generator=gen(5))
    loss = -VonMisesFisher(t(raw), 20.0, validate_args=True).log_prob(data).sum()
    (g,) = torch.autograd.grad(loss, raw)
    assert torch.isfinite(g).all() and g.abs().max() > 0
    assert abs(float(g @ raw.detach())) <= 1e-10 * float(g.norm() * raw.detach().norm())  # none along raw


# ---------------------------------------------------------------------------
# biject_to(sphere): the inverse stereographic projection


def _surface_log_jacobian(t, y):
    """(1/2) log det(J^T J) of y -> t(y), J the d x (d - 1) autograd Jacobian (dense reference)."""
    jac = torch.autograd.functional.jacobian(t, y)
    return 0.5 * torch.logdet(jac.mT @ jac)


@pytest.mark.parametrize("d", [2, 3, 6])
def test_biject_to_sphere_roundtrip_and_jacobian(d):
    t = biject_to(sphere)
    assert isinstance(t, StereographicTransform) and t.bijective and t.codomain is sphere
    assert t.domain.event_dim == 1 and t.codomain.event_dim == 1
    scales = torch.tensor([0.0, 1e-10, 0.3, 1.0, 2.5, 1e3, 1e10], dtype=F64)
    y = torch.randn(len(scales), d - 1, generator=gen(d), dtype=F64) * scales.unsqueeze(-1)
    x = t(y)
    assert x.shape == (len(scales), d) and t.forward_shape(y.shape) == x.shape and t.inverse_shape(x.shape) == y.shape
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(len(scales), dtype=F64), rtol=0, atol=4e-16)
    torch.testing.assert_close(x[0], torch.eye(d, dtype=F64)[0], rtol=0, atol=0)  # 0 -> e1
    torch.testing.assert_close(t.inv(x), y, rtol=1e-14, atol=1e-300)
    # the inverse is accurate near the excluded pole -e1 too (no cancellation in 1 + x0)
    xs = torch.stack([unit(d, 10 + i) for i in range(5)])
    torch.testing.assert_close(t(t.inv(xs)), xs, rtol=0, atol=1e-15)
    ladj = t.log_abs_det_jacobian(y, x)
    assert ladj.shape == (len(scales),)
    for i in range(len(scales)):
        assert ladj[i].item() == pytest.approx(_surface_log_jacobian(t, y[i]).item(), rel=1e-12, abs=1e-12)
    assert torch.autograd.gradcheck(t, (torch.randn(3, d - 1, generator=gen(1), dtype=F64, requires_grad=True),))
    assert torch.autograd.gradcheck(t.inv, (torch.stack([unit(d, 2), -unit(d, 3)]).requires_grad_(),))
    # no overflow for huge |y|: the image approaches the pole, the log-Jacobian stays finite
    big = torch.full((d - 1,), 1e200, dtype=F64)
    assert torch.isfinite(t(big)).all() and torch.isfinite(t.log_abs_det_jacobian(big, t(big)))
    assert t(big)[0].item() == -1.0


def _gauss_legendre(a, b, n):
    x, w = np.polynomial.legendre.leggauss(n)
    return (torch.tensor(0.5 * (b - a) * x + 0.5 * (b + a), dtype=F64), torch.tensor(0.5 * (b - a) * w, dtype=F64))


def test_biject_to_sphere_transforms_densities_exactly():
    """A density on R^2 pushed onto S^2 integrates to one over the sphere (spherical coordinates:
    Gauss--Legendre in the polar angle, the periodic trapezoid rule in the azimuth, both
    exponentially convergent for smooth integrands), and a vMF pulled back to R^2 integrates to one
    over the plane (polar coordinates, r = u/(1 - u))."""
    t = StereographicTransform()
    base = Independent(Normal(torch.tensor([0.3, -0.2], dtype=F64), torch.tensor([0.8, 1.5], dtype=F64)), 1)
    pushed = TransformedDistribution(base, [t])
    theta, wt = _gauss_legendre(0.0, math.pi, 200)
    m = 200
    phi = torch.arange(m, dtype=F64) * (2 * math.pi / m)
    th, ph = torch.meshgrid(theta, phi, indexing="ij")
    x = torch.stack([th.cos(), th.sin() * ph.cos(), th.sin() * ph.sin()], -1)
    total = (pushed.log_prob(x).exp() * th.sin() * wt.unsqueeze(-1)).sum() * (2 * math.pi / m)
    assert total.item() == pytest.approx(1.0, abs=1e-10)
    v = VonMisesFisher(unit(3, 1), 4.0)
    u, wu = _gauss_legendre(0.0, 1.0, 400)
    r = u / (1 - u)
    rr, ph = torch.meshgrid(r, phi, indexing="ij")
    y = torch.stack([rr * ph.cos(), rr * ph.sin()], -1)
    lp = v.log_prob(t(y)) + t.log_abs_det_jacobian(y, t(y))
    total = (lp.exp() * rr * (wu / (1 - u) ** 2).unsqueeze(-1)).sum() * (2 * math.pi / m)
    assert total.item() == pytest.approx(1.0, abs=1e-10)
    # samples of the pushed-forward distribution lie on the sphere
    s = pushed.sample((100,))
    assert bool(sphere.check(s).all())


def test_sphere_transforms_errors_and_equality():
    t = StereographicTransform()
    with pytest.raises(ValueError, match="d >= 2"):
        t.inv(torch.ones(3, 1, dtype=F64))
    with pytest.raises(ValueError, match="d - 1 >= 1"):
        t(torch.ones(3, 0, dtype=F64))
    assert t == StereographicTransform() and t != NormalizeTransform()
    assert NormalizeTransform() == transform_to(sphere)
    assert not constraints.is_dependent(sphere)
    np.testing.assert_allclose(sphere.tolerance(torch.float64), 1e-6)
