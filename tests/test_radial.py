"""Tests of the Radial distribution, the fused radial noise op and the radius-prior KLs.

References: SciPy quadrature (normalisation, entropy, KL for small D), closed forms,
and Monte Carlo with tolerances from standard errors.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special
import scipy.stats
import torch
from torch.distributions import (Gamma, Independent, InverseGamma, LogNormal, Normal, Weibull, constraints,
                                 kl_divergence)

from vmfdist.distributions import Radial, kl_radial_radial, radial_noise
from vmfdist._ops.random import random_kwargs
from vmfdist._ops import lib
from vmfdist.testing import cpu_and_cuda

F64 = torch.float64
Z = 4.5  # standard errors allowed


def radial(shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(shape, generator=g, dtype=F64)
    scale = torch.rand(shape, generator=g, dtype=F64) + 0.3
    return Radial(loc.to(dtype), scale.to(dtype))


def _density(q, w):
    return math.exp(q.log_prob(torch.tensor(w, dtype=F64).reshape(q.event_shape)).item())


# ---------------------------------------------------------------------------
# the density


def test_log_prob_integrates_to_one_d1():
    q = radial((1,), 1)
    m, s = q.loc.item(), q.scale.item()
    total = scipy.integrate.quad(lambda w: _density(q, [w]), -math.inf, math.inf, points=None)[0]
    assert total == pytest.approx(1.0, abs=1e-9)
    # D = 1 is the normal distribution
    for w in (-1.0, 0.3, 2.0):
        assert q.log_prob(torch.tensor([w], dtype=F64)).item() == pytest.approx(
            scipy.stats.norm(m, s).logpdf(w), rel=1e-13)


def test_log_prob_integrates_to_one_d2():
    q = radial((2,), 2)
    mu, sg = q.loc.numpy(), q.scale.numpy()

    def f(theta, rho):  # w = mu + sigma * rho (cos, sin); dw = s1 s2 rho drho dtheta
        w = mu + sg * rho * np.array([math.cos(theta), math.sin(theta)])
        return _density(q, w) * sg.prod() * rho

    total = scipy.integrate.dblquad(f, 0, 12, 0, 2 * math.pi, epsabs=1e-11, epsrel=1e-10)[0]
    assert total == pytest.approx(1.0, abs=1e-8)


def test_log_prob_integrates_to_one_d3():
    q = radial((3,), 3)
    mu, sg = q.loc.numpy(), q.scale.numpy()

    def f(phi, theta, rho):  # spherical coordinates, dw = prod(sigma) rho^2 sin(theta)
        u = rho * np.array([math.sin(theta) * math.cos(phi), math.sin(theta) * math.sin(phi), math.cos(theta)])
        return _density(q, mu + sg * u) * sg.prod() * rho * rho * math.sin(theta)

    total = scipy.integrate.tplquad(f, 0, 10, 0, math.pi, 0, 2 * math.pi, epsabs=1e-8, epsrel=1e-7)[0]
    assert total == pytest.approx(1.0, abs=1e-6)


def test_entropy_quadrature_d2_and_monte_carlo():
    q = radial((2,), 4)
    mu, sg = q.loc.numpy(), q.scale.numpy()

    def f(theta, rho):
        w = torch.tensor(mu + sg * rho * np.array([math.cos(theta), math.sin(theta)]), dtype=F64)
        lp = q.log_prob(w).item()
        return -math.exp(lp) * lp * sg.prod() * rho

    h = scipy.integrate.dblquad(f, 1e-300, 12, 0, 2 * math.pi, epsabs=1e-10, epsrel=1e-9)[0]
    assert q.entropy().item() == pytest.approx(h, abs=1e-7)
    for shape in [(1,), (5,), (3, 7), (40, 50)]:
        q = radial(shape, 5)
        lp = q.log_prob(q.sample((20000,), generator=torch.Generator().manual_seed(1)))
        assert abs(-lp.mean().item() - q.entropy().item()) <= Z * lp.std().item() / math.sqrt(len(lp))
    # D = 1: the normal entropy
    q = radial((1,), 6)
    assert q.entropy().item() == pytest.approx(0.5 * math.log(2 * math.pi * math.e * q.scale.item() ** 2), rel=1e-14)


def test_kl_to_normal_closed_form_vs_monte_carlo_and_quadrature():
    for shape in [(1,), (2,), (6,), (4, 5)]:
        q = radial(shape, 7)
        g = torch.Generator().manual_seed(3)
        p = Independent(Normal(torch.randn(shape, generator=g, dtype=F64),
                               torch.rand(shape, generator=g, dtype=F64) + 0.5), len(shape))
        kl = kl_divergence(q, p).item()
        w = q.sample((40000,), generator=torch.Generator().manual_seed(2))
        lr = q.log_prob(w) - p.log_prob(w)
        assert abs(lr.mean().item() - kl) <= Z * lr.std().item() / math.sqrt(len(lr))
        if shape == (1,):  # D = 1: KL between two normals
            ref = kl_divergence(Normal(q.loc, q.scale), p.base_dist).sum().item()
            assert kl == pytest.approx(ref, rel=1e-13)


def test_kl_radial_radial_monte_carlo_vs_quadrature():
    q, p = radial((2,), 8), radial((2,), 9)
    mu, sg = q.loc.numpy(), q.scale.numpy()

    def f(theta, rho):
        w = torch.tensor(mu + sg * rho * np.array([math.cos(theta), math.sin(theta)]), dtype=F64)
        lq, lp = q.log_prob(w).item(), p.log_prob(w).item()
        return math.exp(lq) * (lq - lp) * sg.prod() * rho

    exact = scipy.integrate.dblquad(f, 1e-300, 12, 0, 2 * math.pi, epsabs=1e-9, epsrel=1e-8)[0]
    ests = torch.stack([kl_radial_radial(q, p, 2000, generator=torch.Generator().manual_seed(s)) for s in range(10)])
    assert abs(ests.mean().item() - exact) <= Z * ests.std().item() / math.sqrt(10)
    with pytest.raises(NotImplementedError, match="kl_radial_radial"):
        kl_divergence(q, p)


def test_gradcheck_log_prob_entropy_kl():
    loc = torch.randn(2, 3, dtype=F64, requires_grad=True)
    scale = (torch.rand(2, 3, dtype=F64) + 0.5).requires_grad_(True)
    w = torch.randn(4, 2, 3, dtype=F64)
    pl, ps = torch.randn(2, 3, dtype=F64), torch.rand(2, 3, dtype=F64) + 0.5

    def f(loc, scale):
        q = Radial(loc, scale)
        return q.log_prob(w), q.entropy(), kl_divergence(q, Independent(Normal(pl, ps), 2))

    assert torch.autograd.gradcheck(f, (loc, scale))


# ---------------------------------------------------------------------------
# the fused op


@pytest.mark.parametrize("rowwise", [False, True])
def test_radial_noise_gradcheck(rowwise):
    loc = torch.randn(3, 5, dtype=F64, requires_grad=True)
    scale = (torch.rand(3, 5, dtype=F64) + 0.2).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda l, s: lib.radial_noise(l, s, 4, rowwise, seed=99, offset=0)[0],
                                    (loc, scale))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_radial_noise_distribution(dtype):
    """v = (w - mu)/sigma: |v| is half-normal, v/|v| uniform on the sphere."""
    d, n = 37, 20000
    loc = torch.randn(d, dtype=dtype)
    scale = torch.rand(d, dtype=dtype) + 0.1
    w = radial_noise(loc, scale, (n,), generator=torch.Generator().manual_seed(1))
    v = ((w - loc) / scale).double()
    rho = v.norm(dim=-1).numpy()
    assert scipy.stats.kstest(rho, scipy.stats.halfnorm.cdf).pvalue > 1e-4
    u = v / v.norm(dim=-1, keepdim=True)
    assert (u.mean(0).abs() <= Z / math.sqrt(d * n)).all()
    u2 = (u * u).numpy()
    assert np.all(np.abs(u2.mean(0) - 1 / d) <= Z * u2.std(0) / math.sqrt(n))
    # rowwise: every row has its own half-normal radius
    w = radial_noise(loc.expand(4, d), scale.expand(4, d), (n // 4,), rowwise=True,
                     generator=torch.Generator().manual_seed(2))
    rho = ((w - loc) / scale).double().norm(dim=-1).reshape(-1).numpy()
    assert scipy.stats.kstest(rho, scipy.stats.halfnorm.cdf).pvalue > 1e-4


def test_radial_noise_deterministic_and_chunked():
    """Events longer than one chunk (4096) and any thread count give the same tensor."""
    loc = torch.zeros(3, 3, 33, 47)
    scale = torch.ones(3, 3, 33, 47)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = radial_noise(loc, scale, (3,), generator=torch.Generator().manual_seed(5))
        torch.set_num_threads(max(2, threads))
        b = radial_noise(loc, scale, (3,), generator=torch.Generator().manual_seed(5))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])
    # the norm over the whole event is |r|, a half-normal draw per sample (same for float64)
    a64 = radial_noise(loc.double(), scale.double(), (3,), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(a64.float(), a, rtol=2e-5, atol=2e-6)


def test_radial_noise_errors_and_opcheck():
    loc = torch.randn(2, 3, dtype=F64)
    with pytest.raises(RuntimeError, match="same shape"):
        lib.radial_noise(loc, torch.ones(3, 2, dtype=F64), 1, seed=0, offset=0)
    with pytest.raises(RuntimeError, match="num_samples must be non-negative"):
        lib.radial_noise(loc, torch.ones_like(loc), -1, seed=0, offset=0)
    with pytest.raises(ValueError):
        Radial(loc, -torch.ones_like(loc), validate_args=True)
    torch.library.opcheck(lib.radial_noise, (loc, torch.ones_like(loc) * 0.5, 3, False), {"seed": 7, "offset": 0})
    torch.library.opcheck(lib.radial_noise, (loc, torch.ones_like(loc) * 0.5, 3, True), {"seed": 7, "offset": 0})
    torch.library.opcheck(lib.radial_noise, (loc, torch.ones_like(loc) * 0.5, 3, False, True), {"seed": 7, "offset": 0})
    g = torch.randn(3, 2, 3, dtype=F64)
    so = torch.tensor([7, 0])
    torch.library.opcheck(lib.radial_noise_scale_grad, (g, torch.randn(3, dtype=F64), so, False))
    torch.library.opcheck(lib.radial_noise_scale_grad, (g, torch.randn(3, dtype=F64), so, False, torch.randn_like(g)))
    with pytest.raises(RuntimeError, match="noise must have the shape of grad"):
        lib.radial_noise_scale_grad(g, torch.randn(3, dtype=F64), so, False, torch.randn(2, 2, 3, dtype=F64))
    with pytest.raises(RuntimeError, match="noise must have grad's dtype"):
        lib.radial_noise_scale_grad(g, torch.randn(3, dtype=F64), so, False, torch.randn(3, 2, 3))


def test_radial_noise_seed_offset_ranges():
    """Issue 14: offsets whose second stream (offset + 1) overflows were accepted (offset + 1 < 2^48 overflowed
    at 2^63 - 1) and reused other offsets' streams; out-of-range seeds and offsets are refused."""
    loc, scale = torch.zeros(2, 3, dtype=F64), torch.ones(2, 3, dtype=F64)
    for off in (2 ** 63 - 1, 2 ** 48 - 1, 2 ** 48, -1):
        with pytest.raises(RuntimeError, match=r"radial_noise: offset must be in \[0, 2\^48 - 2\]"):
            lib.radial_noise(loc, scale, 1, seed=1, offset=off)
    with pytest.raises(RuntimeError, match=r"radial_noise: seed must be in \[0, 2\^63\)"):
        lib.radial_noise(loc, scale, 1, seed=-1)
    out, coef, so, _ = lib.radial_noise(loc, scale, 2, seed=5, offset=2 ** 48 - 2)  # the last valid offset
    assert so.tolist() == [5, 2 ** 48 - 2] and so.dtype == torch.int64
    # the Python side (integers >= 2^63 never reach the dispatcher)
    with pytest.raises(ValueError, match=r"radial_noise: offset must be in \[0, 281474976710655\)"):
        random_kwargs("radial_noise", None, 1, 2 ** 63 - 1, streams=2)
    with pytest.raises(ValueError, match=r"radial_noise: seed must be in \[0, 9223372036854775808\)"):
        random_kwargs("radial_noise", None, 2 ** 63, 0, streams=2)
    with pytest.raises(RuntimeError, match="seed_offset must be an int64 tensor of shape"):
        lib.radial_noise_scale_grad(torch.ones(2, 2, 3, dtype=F64), coef, so.double())


def test_radial_noise_fake_matches_op():
    """Issue 14: the fake (meta) kernel gives the op's shapes -- rowwise with a last dimension of 0 gives coef
    (S, 0), and a 0-dim loc with rowwise raises in both."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    cases = [((3, 0), True), ((0, 4), True), ((2, 3), True), ((2, 3), False), ((), False), ((5,), True)]
    for (shape, rowwise), save in zip(cases, [False, True] * 3):
        loc = torch.zeros(shape, dtype=F64)
        real = lib.radial_noise(loc, torch.ones_like(loc), 3, rowwise, save, seed=1)
        with FakeTensorMode() as mode:
            fl = mode.from_tensor(loc)
            fake = lib.radial_noise(fl, torch.ones_like(fl), 3, rowwise, save)
        assert [tuple(t.shape) for t in fake] == [tuple(t.shape) for t in real], (shape, rowwise)
        assert [t.dtype for t in fake] == [t.dtype for t in real]
    loc0 = torch.zeros((), dtype=F64)
    with pytest.raises(RuntimeError, match="rowwise needs loc with at least one dimension"):
        lib.radial_noise(loc0, torch.ones_like(loc0), 3, True, seed=1)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="rowwise needs loc with at least one dimension"):
        fl = mode.from_tensor(loc0)
        lib.radial_noise(fl, torch.ones_like(fl), 3, True)


def test_radial_double_backward():
    """Issue 14: d2/dscale2 through Radial.rsample was silently 0.  The loc part is exact (a sum), the
    scale part refuses a second derivative with a clear error."""
    loc = torch.randn(4, dtype=F64, requires_grad=True)
    scale = torch.full((4,), 0.5, dtype=F64, requires_grad=True)
    torch.manual_seed(0)
    w = Radial(loc, scale).rsample((3,))
    (g,) = torch.autograd.grad(w.pow(2).sum(), scale, create_graph=False)
    assert g.abs().sum() > 0
    w = Radial(loc, scale).rsample((3,))
    with pytest.raises(RuntimeError, match="differentiable only once with respect to scale"):
        torch.autograd.grad(w.pow(2).sum(), scale, create_graph=True)
    # loc only: d2/dloc2 of sum(w^2) over 3 samples is 2 * 3 per element, exactly
    w = Radial(loc, scale.detach()).rsample((3,))
    (gl,) = torch.autograd.grad(w.pow(2).sum(), loc, create_graph=True)
    (h,) = torch.autograd.grad(gl.sum(), loc)
    torch.testing.assert_close(h, torch.full((4,), 6.0, dtype=F64), rtol=0, atol=0)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("rowwise", [False, True])
def test_devices_agree(device, dtype, tol, rowwise):
    """The same (seed, offset) on another device: the same noise up to the rounding of the transcendental
    functions (host libm vs CUDA) and of the summation order, for events shorter and longer than one chunk;
    the scale gradient regenerated on the device from the seed_offset tensor the forward left there."""
    for shape in [(3, 5), (2, 3, 4100)]:
        g = torch.Generator().manual_seed(3)
        loc = torch.randn(shape, generator=g, dtype=F64).to(dtype)
        scale = (torch.rand(shape, generator=g, dtype=F64) + 0.2).to(dtype)
        out, coef, so, _ = lib.radial_noise(loc, scale, 3, rowwise, seed=17, offset=6)
        out_d, coef_d, so_d, _ = lib.radial_noise(loc.to(device), scale.to(device), 3, rowwise, seed=17, offset=6)
        assert out_d.device.type == device and so_d.device.type == device
        assert so_d.cpu().tolist() == so.tolist() == [17, 6]
        torch.testing.assert_close(coef_d.cpu(), coef, rtol=1e-12, atol=0)
        torch.testing.assert_close(out_d.cpu(), out, rtol=tol, atol=tol)
        grad = torch.randn(out.shape, generator=g, dtype=F64).to(dtype)
        gs = lib.radial_noise_scale_grad(grad, coef, so, rowwise)
        gs_d = lib.radial_noise_scale_grad(grad.to(device), coef_d, so_d, rowwise)
        torch.testing.assert_close(gs_d.cpu(), gs, rtol=tol, atol=tol)
        # the kept noise on the device: the same values as regenerating them there
        _, _, _, noise_d = lib.radial_noise(loc.to(device), scale.to(device), 3, rowwise, True, seed=17, offset=6)
        assert torch.equal(lib.radial_noise_scale_grad(grad.to(device), coef_d, so_d, rowwise, noise_d), gs_d)


# ---------------------------------------------------------------------------
# radius-prior KLs


def _mc_kl(q, p, n=200000, seed=0):
    torch.manual_seed(seed)
    x = q.sample((n,))
    lr = q.log_prob(x) - p.log_prob(x)
    return lr.mean().item(), lr.std().item() / math.sqrt(n)


@pytest.mark.parametrize("mu,s,a,b", [(0.0, 0.5, 2.0, 3.0), (-1.0, 1.2, 0.5, 0.2), (2.0, 0.1, 7.0, 0.5)])
def test_kl_lognormal_gamma_and_inverse_gamma(mu, s, a, b):
    q = LogNormal(torch.tensor(mu, dtype=F64), torch.tensor(s, dtype=F64))
    for p in (Gamma(torch.tensor(a, dtype=F64), torch.tensor(b, dtype=F64)),
              InverseGamma(torch.tensor(a, dtype=F64), torch.tensor(b, dtype=F64))):
        kl = kl_divergence(q, p).item()
        est, se = _mc_kl(q, p)
        assert abs(est - kl) <= Z * se, (type(p).__name__, est, kl, se)


@pytest.mark.parametrize("lq,kq,lp,kp", [(1.0, 2.0, 1.5, 1.0), (0.3, 0.7, 2.0, 3.0), (2.0, 5.0, 2.0, 5.0)])
def test_kl_weibull(lq, kq, lp, kp):
    q = Weibull(torch.tensor(lq, dtype=F64), torch.tensor(kq, dtype=F64))
    p = Weibull(torch.tensor(lp, dtype=F64), torch.tensor(kp, dtype=F64))
    kl = kl_divergence(q, p).item()
    est, se = _mc_kl(q, p)
    assert abs(est - kl) <= Z * se + 1e-12
    # the printed eq. (50) (Gamma(kq/kp + 1)) is wrong whenever kq != kp
    if kq != kp:
        wrong = kl - (lq / lp) ** kp * math.gamma(kp / kq + 1) + (lq / lp) ** kp * math.gamma(kq / kp + 1)
        assert abs(est - wrong) > 10 * se


def test_torch_gamma_gamma_agrees_with_eq49():
    aq, bq, ap, bp = 2.5, 1.5, 0.7, 3.0
    q = Gamma(torch.tensor(aq, dtype=F64), torch.tensor(bq, dtype=F64))
    p = Gamma(torch.tensor(ap, dtype=F64), torch.tensor(bp, dtype=F64))
    eq49 = ((aq - ap) * scipy.special.digamma(aq) - scipy.special.gammaln(aq) + scipy.special.gammaln(ap)
            + ap * (math.log(bq) - math.log(bp)) + aq * (bp - bq) / bq)
    assert kl_divergence(q, p).item() == pytest.approx(eq49, rel=1e-13)


# ---------------------------------------------------------------------------
# batch shapes: Radial(loc, scale, event_dims=k)


def test_batch_shapes_and_agreement_with_unbatched():
    g = torch.Generator().manual_seed(11)
    loc = torch.randn(2, 3, 4, 5, generator=g, dtype=F64)
    scale = torch.rand(3, 1, 5, generator=g, dtype=F64) + 0.3  # broadcast against loc
    w = torch.randn(6, 2, 3, 4, 5, generator=g, dtype=F64)
    for k in (0, 1, 2, 3, 4):
        q = Radial(loc, scale, event_dims=k)
        split = 4 - k
        assert q.batch_shape == loc.shape[:split] and q.event_shape == loc.shape[split:]
        assert q.event_dims == k and q.numel == loc.shape[split:].numel()
        assert q.support.event_dim == k and q.arg_constraints["loc"].event_dim == k
        lp, h = q.log_prob(w), q.entropy()
        assert lp.shape == (6,) + q.batch_shape and h.shape == q.batch_shape
        assert q.sample((7,)).shape == (7,) + loc.shape
        assert q.variance.shape == loc.shape and torch.equal(q.mean, q.loc)
        # every batch element is the unbatched Radial over its own event
        sb = scale.expand_as(loc)
        for idx in [(0,) * split, tuple(s - 1 for s in loc.shape[:split])]:
            one = Radial(loc[idx], sb[idx])
            torch.testing.assert_close(lp[(slice(None),) + idx], one.log_prob(w[(slice(None),) + idx]),
                                       rtol=1e-14, atol=1e-12)
            torch.testing.assert_close(h[idx], one.entropy(), rtol=1e-14, atol=1e-13)
    assert Radial(loc, scale).batch_shape == () and Radial(loc, scale).event_shape == loc.shape  # the default


def test_event_dims_zero_is_the_normal_distribution():
    g = torch.Generator().manual_seed(12)
    loc, scale = torch.randn(3, 4, generator=g, dtype=F64), torch.rand(3, 4, generator=g, dtype=F64) + 0.5
    q, n = Radial(loc, scale, event_dims=0), Normal(loc, scale)
    w = torch.randn(5, 3, 4, generator=g, dtype=F64)
    torch.testing.assert_close(q.log_prob(w), n.log_prob(w), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(q.entropy(), n.entropy(), rtol=1e-14, atol=1e-14)
    x = q.sample((4000,), generator=torch.Generator().manual_seed(3))
    z = ((x - loc) / scale).reshape(-1).numpy()
    assert scipy.stats.kstest(z, scipy.stats.norm.cdf).pvalue > 1e-4
    # a 0-dimensional loc is one D = 1 Radial
    q0 = Radial(torch.tensor(0.5, dtype=F64), torch.tensor(2.0, dtype=F64))
    assert q0.event_shape == () and q0.sample((3,)).shape == (3,)
    assert q0.log_prob(torch.tensor(1.0, dtype=F64)).item() == pytest.approx(
        scipy.stats.norm(0.5, 2.0).logpdf(1.0), rel=1e-14)


def test_batched_samples_per_event_distribution_and_independence():
    """Each event has its own half-normal radius and uniform direction; events are independent."""
    n, b, d = 6000, 3, 9
    g = torch.Generator().manual_seed(13)
    loc, scale = torch.randn(b, d, generator=g, dtype=F64), torch.rand(b, d, generator=g, dtype=F64) + 0.2
    q = Radial(loc, scale, event_dims=1)
    w = q.sample((n,), generator=torch.Generator().manual_seed(4))
    v = (w - loc) / scale
    rho = v.norm(dim=-1)  # (n, b)
    for j in range(b):
        assert scipy.stats.kstest(rho[:, j].numpy(), scipy.stats.halfnorm.cdf).pvalue > 1e-4
        u = v[:, j] / rho[:, j:j + 1]
        assert (u.mean(0).abs() <= Z / math.sqrt(d * n)).all()
    # radii (and directions) of different events are uncorrelated: |corr| <= Z / sqrt(n)
    corr = np.corrcoef(rho.T.numpy())
    assert np.all(np.abs(corr[np.triu_indices(b, 1)]) <= Z / math.sqrt(n))
    dots = (v[:, 0] * v[:, 1]).sum(-1) / (rho[:, 0] * rho[:, 1])
    assert abs(dots.mean().item()) <= Z * dots.std().item() / math.sqrt(n)
    # the unbatched Radial over the whole tensor is a different distribution: one radius for all
    rho_all = ((Radial(loc, scale).sample((n,), generator=torch.Generator().manual_seed(4)) - loc) / scale).norm(
        dim=(-2, -1))
    assert scipy.stats.kstest(rho_all.numpy(), scipy.stats.halfnorm.cdf).pvalue > 1e-4


def test_expand_and_batched_rsample_gradients():
    g = torch.Generator().manual_seed(14)
    loc = torch.randn(4, generator=g, dtype=F64)
    scale = torch.rand(4, generator=g, dtype=F64) + 0.5
    q = Radial(loc, scale)
    e = q.expand((2, 3))
    assert isinstance(e, Radial) and e.batch_shape == (2, 3) and e.event_shape == (4,) and e.event_dims == 1
    assert e.sample((5,)).shape == (5, 2, 3, 4)
    w = torch.randn(5, 2, 3, 4, generator=g, dtype=F64)
    torch.testing.assert_close(e.log_prob(w), q.log_prob(w), rtol=0, atol=0)
    torch.testing.assert_close(e.entropy(), q.entropy().expand(2, 3), rtol=0, atol=0)
    assert e.support.event_dim == 1
    b = Radial(loc.expand(3, 4), scale, event_dims=1).expand((2, 3))
    assert b.batch_shape == (2, 3)
    with pytest.raises(RuntimeError):  # as torch's own distributions: the tensors cannot expand
        Radial(loc.expand(3, 4), scale, event_dims=1).expand((2, 4))
    # gradients of batched samples: loc gets sum over samples, scale the regenerated noise
    locb = torch.randn(3, 4, generator=g, dtype=F64, requires_grad=True)
    scaleb = (torch.rand(3, 4, generator=g, dtype=F64) + 0.5).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda l, s: Radial(l, s, event_dims=1).rsample((2,), generator=torch.Generator().manual_seed(1)),
        (locb, scaleb))
    assert torch.autograd.gradcheck(
        lambda l, s: (Radial(l, s, event_dims=1).log_prob(w[:, 0, :3]), Radial(l, s, event_dims=1).entropy()),
        (locb, scaleb))


def test_support_agrees_with_instances():
    assert constraints.is_dependent(Radial.support)
    with pytest.raises(NotImplementedError):
        Radial.support.event_dim  # depends on event_dims: not known on the class
    for shape, k in [((3,), None), ((2, 3), None), ((2, 3), 1), ((2, 3), 0)]:
        q = Radial(torch.zeros(shape, dtype=F64), torch.ones(shape, dtype=F64), event_dims=k)
        assert q.support.event_dim == len(q.event_shape)
        assert bool(q.support.check(torch.zeros(shape, dtype=F64)).all())
    q = Radial(torch.zeros(2, 3, dtype=F64), torch.ones(2, 3, dtype=F64), event_dims=1, validate_args=True)
    with pytest.raises(ValueError):
        q.log_prob(torch.full((2, 3), math.nan, dtype=F64))


def test_batched_kl_to_normal_and_radial_radial():
    g = torch.Generator().manual_seed(15)
    loc, scale = torch.randn(3, 5, generator=g, dtype=F64), torch.rand(3, 5, generator=g, dtype=F64) + 0.4
    q = Radial(loc, scale, event_dims=1)
    mp, sp = torch.randn(2, 1, 5, generator=g, dtype=F64), torch.rand(2, 1, 5, generator=g, dtype=F64) + 0.5
    p = Independent(Normal(mp, sp), 1)
    kl = kl_divergence(q, p)
    assert kl.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            one = kl_divergence(Radial(loc[j], scale[j]), Independent(Normal(mp[i, 0], sp[i, 0]), 1))
            torch.testing.assert_close(kl[i, j], one, rtol=1e-14, atol=1e-14)
    w = q.sample((40000,), generator=torch.Generator().manual_seed(5))
    lr = q.log_prob(w).unsqueeze(1) - p.log_prob(w.unsqueeze(1))  # (n, 2, 3)
    assert ((lr.mean(0) - kl).abs() <= Z * lr.std(0) / math.sqrt(len(lr))).all()
    with pytest.raises(ValueError, match="event shapes must match"):
        kl_divergence(q, Independent(Normal(mp, sp), 2))
    # k = 0 against Independent(Normal, 0): the normal KL elementwise
    kl0 = kl_divergence(Radial(loc, scale, event_dims=0), Independent(Normal(mp[0], sp[0]), 0))
    torch.testing.assert_close(kl0, kl_divergence(Normal(loc, scale), Normal(mp[0], sp[0])), rtol=1e-13, atol=1e-14)
    # the Monte Carlo KL between Radials is batched too
    p2 = Radial(torch.zeros(5, dtype=F64), torch.ones(5, dtype=F64))
    est = kl_radial_radial(q, p2, 8, generator=torch.Generator().manual_seed(6))
    assert est.shape == (3,)
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        kl_radial_radial(q, p2, 0)


def test_radial_errors_name_the_argument():
    loc = torch.zeros(3)
    with pytest.raises(ValueError, match="scale must be on the same device as loc"):
        Radial(loc, torch.ones(3, device="meta"))
    with pytest.raises(TypeError, match="loc must be real"):
        Radial(torch.zeros(3, dtype=torch.complex64), torch.ones(3))
    with pytest.raises(TypeError, match="scale must be real"):
        Radial(loc, torch.ones(3, dtype=torch.complex128))
    with pytest.raises(TypeError, match="scale must be a tensor or a real number, got None"):
        Radial(loc, None)
    with pytest.raises(ValueError, match="do not broadcast"):
        Radial(loc, torch.ones(4))
    with pytest.raises(ValueError, match=r"event_dims must be between 0 and loc.dim\(\) = 1"):
        Radial(loc, torch.ones(3), event_dims=2)
    with pytest.raises(ValueError, match="event_dims must be between"):
        Radial(loc, torch.ones(3), event_dims=-1)
    with pytest.raises(TypeError, match="event_dims must be an int"):
        Radial(loc, torch.ones(3), event_dims=True)
    with pytest.raises(ValueError, match="at least one element"):
        Radial(torch.zeros(2, 0), torch.ones(2, 0), event_dims=1)
    q = Radial(torch.zeros(2, 3), torch.ones(2, 3), event_dims=1)
    with pytest.raises(ValueError, match=r"Radial.log_prob: value must end in the event shape \(3,\)"):
        q.log_prob(torch.zeros(2, 4))
    # an empty batch samples (validation off: torch's independent constraint cannot reshape 0 elements)
    assert Radial(torch.zeros(0, 3), torch.ones(0, 3), event_dims=1, validate_args=False).sample((2,)).shape == (2, 0, 3)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("rowwise", [False, True])
def test_radial_noise_kept_noise_gives_the_same_bits(dtype, rowwise):
    """save_noise keeps the normals of the forward pass for the backward: the samples, and the scale
    gradient from the kept normals, equal (bit for bit) those of regenerating them; the kept
    normals are eps itself ((out - loc) / scale = eps * coef)."""
    g = torch.Generator().manual_seed(5)
    for shape, s in [((3, 5), 1), ((2, 4100), 3)]:
        loc = torch.randn(shape, generator=g, dtype=F64).to(dtype)
        scale = (torch.rand(shape, generator=g, dtype=F64) + 0.2).to(dtype)
        out, coef, so, empty = lib.radial_noise(loc, scale, s, rowwise, seed=11, offset=4)
        out2, coef2, so2, noise = lib.radial_noise(loc, scale, s, rowwise, True, seed=11, offset=4)
        assert empty.numel() == 0 and noise.shape == out.shape and noise.dtype == dtype
        assert torch.equal(out, out2) and torch.equal(coef, coef2) and torch.equal(so, so2)
        k = coef.reshape((s,) + (coef.shape[1:] + (1,) if rowwise else (1,) * len(shape)))
        tol = 1e-12 if dtype == F64 else 1e-4
        torch.testing.assert_close(((out.double() - loc.double()) / scale.double()), noise.double() * k,
                                   rtol=tol, atol=tol)
        grad = torch.randn(out.shape, generator=g, dtype=F64).to(dtype)
        regen = lib.radial_noise_scale_grad(grad, coef, so, rowwise)
        assert torch.equal(regen, lib.radial_noise_scale_grad(grad, coef, so, rowwise, noise))
        # (and it is the kept tensor that is read: doubling it doubles the gradient, exactly)
        assert torch.equal(2 * regen, lib.radial_noise_scale_grad(grad, coef, so, rowwise, 2 * noise))
    # through autograd (the layer's path): the same gradients
    loc = torch.randn(6, 7, dtype=dtype, requires_grad=True)
    scale = (torch.rand(6, 7, dtype=dtype) + 0.2).requires_grad_(True)
    grads = []
    for save in (False, True):
        w = radial_noise(loc, scale, (2,), rowwise=rowwise, generator=torch.Generator().manual_seed(3), save_noise=save)
        grads.append(torch.autograd.grad((w * torch.arange(84.0, dtype=dtype).view(2, 6, 7)).sum(), (loc, scale)))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_kl_radial_normal_functions_are_the_registered_kl():
    """distributions.kl.kl_radial_normal (what the registered Radial || Independent(Normal) calls,
    and the Radial layers with it) takes the prior's parameters as numbers, 0-dim or broadcasting
    tensors: all give the registered KL against the prior expanded to full size; and
    kl_radial_normal_softplus, the layers' fused evaluation from (mu, rho), gives the same value."""
    from vmfdist.distributions.kl import kl_radial_normal, kl_radial_normal_softplus

    g = torch.Generator().manual_seed(21)
    mu, rho = torch.randn(4, 6, generator=g, dtype=F64), torch.randn(4, 6, generator=g, dtype=F64) - 1
    q = Radial(mu, torch.nn.functional.softplus(rho))
    for m, s in [(0.0, 1.0), (torch.tensor(0.3, dtype=F64), torch.tensor(0.8, dtype=F64)),
                 (torch.randn(4, 6, generator=g, dtype=F64), torch.rand(4, 6, generator=g, dtype=F64) + 0.5),
                 (torch.zeros(4, 1, dtype=F64), torch.linspace(0.5, 2.0, 4, dtype=F64).reshape(4, 1))]:
        mt, st_ = (torch.as_tensor(x, dtype=F64).expand(4, 6) for x in (m, s))
        ref = kl_divergence(q, Independent(Normal(mt, st_), 2))
        torch.testing.assert_close(kl_radial_normal(q, m, s), ref, rtol=1e-13, atol=1e-13)
        if torch.as_tensor(m).numel() == 1 or torch.as_tensor(m).shape == mu.shape:
            fused = kl_radial_normal_softplus(mu, rho, torch.as_tensor(m, dtype=F64), torch.as_tensor(s, dtype=F64))
            torch.testing.assert_close(fused, ref, rtol=1e-12, atol=1e-12)
    # one element: the normal KL
    one = Radial(mu[:1, :1], q.scale[:1, :1])
    torch.testing.assert_close(kl_radial_normal(one, 0.2, 1.5),
                               kl_divergence(Normal(mu[0, 0], q.scale[0, 0]),
                                             Normal(torch.tensor(0.2, dtype=F64), torch.tensor(1.5, dtype=F64))),
                               rtol=1e-14, atol=0)
    # a batch of Radials with 0-dim prior parameters: summed over each event
    qb = Radial(mu, q.scale, event_dims=1)
    torch.testing.assert_close(kl_radial_normal(qb, torch.tensor(0.1, dtype=F64), torch.tensor(2.0, dtype=F64)),
                               torch.stack([kl_radial_normal(Radial(mu[i], q.scale[i]), 0.1, 2.0) for i in range(4)]),
                               rtol=1e-14, atol=1e-14)
