"""Tests of vmfdist.distributions.VonMisesFisher / HypersphericalUniform.

References are independent of the code under test: mpmath (log-normaliser, entropy,
KL, the implicit gradient by adaptive quadrature), SciPy (vonmises_fisher, quad,
kstest), closed forms (moments), and statistics with tolerances from standard errors.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import scipy.integrate
import scipy.stats
import torch
from torch.distributions import kl_divergence

from vmfdist.distributions import HypersphericalUniform, VonMisesFisher, fit_vmf, log_sphere_area
from vmfdist._ops import lib
from vmfdist.linalg import householder
from vmfdist.testing import cpu_and_cuda

from . import reference as ref
from .drivers import compile_driver

F64 = torch.float64
Z = 4.5  # standard errors allowed in statistical tests (two-sided p ~ 7e-6 each)


def unit(d, seed=0, dtype=F64, first=None):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(d, generator=g, dtype=F64)
    if first is not None:
        v[0] = first * v.norm()
    return (v / v.norm()).to(dtype)


def A_ref(d, k):
    """A_d(k) = I_{d/2}(k) / I_{d/2-1}(k) from the certified mpmath reference."""
    return float(ref.ratio(0.5 * d, k)) if k > 0 else 0.0


def dA_ref(d, k):
    a = A_ref(d, k)
    return 1 - a * a - (d - 1) * a / k


def log_c_ref(d, k):
    """log C_d(k) in mpmath."""
    with mpmath.workdps(40):
        if k == 0:
            return float(-(mpmath.log(2) + (mpmath.mpf(d) / 2) * mpmath.log(mpmath.pi) - mpmath.loggamma(mpmath.mpf(d) / 2)))
        nu = mpmath.mpf(d) / 2 - 1
        return float(nu * mpmath.log(k) - (mpmath.mpf(d) / 2) * mpmath.log(2 * mpmath.pi) - ref.log_iv(float(nu), k))


# ---------------------------------------------------------------------------
# the reflection


@pytest.mark.parametrize("first", [None, 1.0, -1.0, 1 - 1e-12, -1 + 1e-12, 0.0])
def test_householder_maps_e1_to_mu_and_is_orthogonal_involution(first):
    d = 7
    mu = unit(d, 3, first=first)
    if first in (1.0, -1.0):
        mu = torch.zeros(d, dtype=F64)
        mu[0] = first
    eye = torch.eye(d, dtype=F64)
    q = householder(mu.expand(d, d), eye)  # rows: Q e_i (Q symmetric)
    torch.testing.assert_close(q[0], mu, rtol=0, atol=1e-15)
    torch.testing.assert_close(q @ q.T, eye, rtol=0, atol=1e-14)
    torch.testing.assert_close(q, q.T, rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------
# shapes, determinism, API


def test_shapes_and_broadcasting():
    loc = torch.stack([unit(5, s) for s in range(3)])  # (3, 5)
    kappa = torch.tensor([[1.0], [10.0]], dtype=F64)  # (2, 1) -> batch (2, 3)
    v = VonMisesFisher(loc, kappa)
    assert v.batch_shape == (2, 3) and v.event_shape == (5,)
    x = v.sample((4, 6))
    assert x.shape == (4, 6, 2, 3, 5)
    assert v.log_prob(x).shape == (4, 6, 2, 3)
    assert v.entropy().shape == (2, 3) and v.mean.shape == (2, 3, 5) and v.variance.shape == (2, 3, 5)
    e = v.expand((7, 2, 3))
    assert e.sample().shape == (7, 2, 3, 5)
    assert VonMisesFisher(unit(4), 2.0).sample().shape == (4,)


def test_same_seed_same_samples_any_thread_count():
    v = VonMisesFisher(unit(33, 1), torch.tensor([0.5, 50.0, 5e4], dtype=F64))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = v.sample((500,), generator=torch.Generator().manual_seed(5))
        torch.set_num_threads(max(2, threads))
        b = v.sample((500,), generator=torch.Generator().manual_seed(5))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b)
    c = v.sample((500,), generator=torch.Generator().manual_seed(6))
    assert not torch.equal(a, c)
    torch.manual_seed(3)
    d1 = v.sample((10,))
    torch.manual_seed(3)
    assert torch.equal(d1, v.sample((10,)))


def test_meta_mixed_with_cpu_is_an_error():
    """A meta argument sends the call to the fake kernel (which used to return uninitialised
    CPU memory): the raw ops must refuse arguments on different devices, naming them."""
    loc, kappa = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([2.0])
    with pytest.raises(RuntimeError, match="concentration must be on the same device as loc, got concentration on meta"):
        lib.vmf_sample(loc, kappa.to("meta"), 1, seed=0, offset=0)
    with pytest.raises(RuntimeError, match="concentration must be on the same device as loc, got concentration on cpu"):
        lib.vmf_sample(loc.to("meta"), kappa, 1, seed=0, offset=0)
    with pytest.raises(RuntimeError, match="concentration must be on the same device as one_minus_w"):
        lib.vmf_marginal_grad(torch.tensor([0.5]), kappa.to("meta"), 3)
    x, omw = lib.vmf_sample(loc.to("meta"), kappa.to("meta"), 4, seed=0, offset=0)
    assert x.device.type == "meta" and x.shape == (4, 1, 3) and omw.shape == (4, 1)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_float32_and_devices(device):
    for d, k in [(2, 3.0), (3, 1e6), (64, 0.0), (1000, 1e9)]:
        v = VonMisesFisher(unit(d, 2, torch.float32).to(device), torch.tensor(k, device=device))
        x = v.sample((256,))
        assert x.dtype == torch.float32 and x.device.type == device
        assert torch.isfinite(x).all()
        assert (x.double().norm(dim=-1) - 1).abs().max() < 1e-5
        assert torch.isfinite(v.log_prob(x)).all()


# ---------------------------------------------------------------------------
# moments and goodness of fit of the marginal

CASES = [(2, 0.5), (2, 20.0), (3, 0.0), (3, 5.0), (4, 1.0), (5, 2.0), (10, 1e-3), (16, 100.0),
         (64, 10.0), (256, 1e3), (1000, 50.0), (2000, 1e6)]


@pytest.mark.parametrize("d,k", CASES)
def test_moments(d, k):
    n = 40000
    mu = unit(d, d)
    x = VonMisesFisher(mu, torch.tensor(k, dtype=F64)).sample((n,), generator=torch.Generator().manual_seed(d))
    torch.testing.assert_close(x.norm(dim=-1), torch.ones(n, dtype=F64), rtol=0, atol=1e-14)
    w = x @ mu
    a = A_ref(d, k)
    m2 = 1 - (d - 1) * a / k if k > 0 else 1.0 / d  # E[w^2]
    assert abs(w.mean().item() - a) <= Z * w.std().item() / math.sqrt(n) + 1e-15
    assert abs((w * w).mean().item() - m2) <= Z * (w * w).std().item() / math.sqrt(n) + 1e-15
    # tangent part isotropic: t = x - w mu has E[t] = 0 and E[t t^T] = (1 - E w^2)/(d - 1) (I - mu mu^T)
    t = x - w.unsqueeze(-1) * mu
    se = t.std(0) / math.sqrt(n)
    assert (t.mean(0).abs() <= Z * se + 1e-12).all()
    basis = torch.linalg.qr(torch.cat([mu.unsqueeze(-1), torch.eye(d, dtype=F64)[:, : min(d - 1, 4)]], 1))[0][:, 1:]
    proj2 = (t @ basis) ** 2  # a few tangent coordinates
    target = (1 - m2) / (d - 1)
    assert ((proj2.mean(0) - target).abs() <= Z * proj2.std(0) / math.sqrt(n) + 1e-15).all()


def _marginal_cdf(d, k):
    """CDF of w = mu^T x by quadrature (SciPy): f(w) ~ exp(k(w-1)) (1-w^2)^((d-3)/2).  The factor
    (1 -+ w)^((d-3)/2), singular at the ends for d = 2, is QUADPACK's algebraic weight (QAWS), so
    the integrands are smooth; the CDF integrates from -1 for w <= 0 and its complement from 1 above."""
    a = 0.5 * (d - 3)
    total = scipy.integrate.quad(lambda t: math.exp(k * (t - 1)), -1, 1, weight="alg", wvar=(a, a),
                                 epsabs=0, epsrel=1e-12, limit=500)[0]

    def cdf(w):
        w = np.asarray(w, dtype=float)
        out = np.empty_like(w)
        for i, wi in enumerate(w.ravel()):
            if wi <= -1:
                out.ravel()[i] = 0.0
            elif wi >= 1:
                out.ravel()[i] = 1.0
            elif wi <= 0:  # (t + 1)^a weight at -1
                lo = scipy.integrate.quad(lambda t: math.exp(k * (t - 1)) * (1 - t) ** a, -1, wi, weight="alg",
                                          wvar=(a, 0.0), epsabs=0, epsrel=1e-10, limit=500)[0]
                out.ravel()[i] = lo / total
            else:  # (1 - t)^a weight at 1
                hi = scipy.integrate.quad(lambda t: math.exp(k * (t - 1)) * (1 + t) ** a, wi, 1, weight="alg",
                                          wvar=(0.0, a), epsabs=0, epsrel=1e-10, limit=500)[0]
                out.ravel()[i] = 1.0 - hi / total
        return out

    return cdf


@pytest.mark.parametrize("d,k", [(2, 1.0), (3, 2.0), (4, 0.3), (5, 2.0), (7, 30.0), (40, 15.0)])
def test_marginal_goodness_of_fit(d, k):
    n = 3000
    mu = unit(d, 11)
    x = VonMisesFisher(mu, torch.tensor(k, dtype=F64)).sample((n,), generator=torch.Generator().manual_seed(7))
    w = (x @ mu).numpy()
    res = scipy.stats.kstest(w, _marginal_cdf(d, k))
    assert res.pvalue > 1e-4, res


def test_cap_area_uniform():
    """kappa = 0 is uniform: P(mu^T x > t) equals the normalised cap area (closed form for d = 3: (1 - t)/2;
    for d = 4 by the regularised incomplete beta)."""
    n = 200000
    for d, t in [(3, 0.3), (4, 0.5), (10, 0.2)]:
        mu = unit(d, 4)
        x = VonMisesFisher(mu, torch.tensor(0.0, dtype=F64)).sample((n,), generator=torch.Generator().manual_seed(d))
        p_hat = ((x @ mu) > t).double().mean().item()
        # cap fraction: (1/2) I_{1 - t^2}((d-1)/2, 1/2) for t >= 0
        p = 0.5 * scipy.special.betainc((d - 1) / 2, 0.5, 1 - t * t)
        assert abs(p_hat - p) <= Z * math.sqrt(p * (1 - p) / n)
    u = HypersphericalUniform(5, dtype=F64)
    xs = u.sample((n,), generator=torch.Generator().manual_seed(1))
    assert (xs.mean(0).abs() <= Z / math.sqrt(5 * n)).all()


# ---------------------------------------------------------------------------
# densities against mpmath and SciPy


@pytest.mark.parametrize("d,k", [(2, 0.0), (2, 1.5), (3, 1e-3), (5, 2.0), (64, 10.0), (512, 10.0), (1000, 1e5),
                                 (100000, 1e-3), (100000, 1e8), (3, 1e9)])
def test_log_normalizer_entropy_vs_mpmath(d, k):
    v = VonMisesFisher(unit(d, 1), torch.tensor(k, dtype=F64))
    lc = log_c_ref(d, k)
    got = v.log_normalizer().item()
    assert abs(got - lc) <= 4e-15 * max(1.0, abs(lc), k), (got, lc)
    ent = -lc - k * A_ref(d, k)
    assert abs(v.entropy().item() - ent) <= 1e-13 * max(1.0, abs(lc), k), (v.entropy().item(), ent)


def test_log_prob_vs_scipy():
    for d, k in [(3, 2.0), (10, 5.0), (64, 30.0), (512, 10.0)]:
        mu = unit(d, 5)
        v = VonMisesFisher(mu, torch.tensor(k, dtype=F64))
        x = v.sample((50,), generator=torch.Generator().manual_seed(2))
        sp = scipy.stats.vonmises_fisher(mu.numpy(), k)
        # SciPy's normaliser underflows at d = 512 (ive(255, 10) = 0): its log divides by zero and
        # its logpdf and entropy are infinite; expected, and the comparison is skipped there
        with np.errstate(divide="ignore", invalid="ignore"):
            ref_lp = sp.logpdf(x.numpy())
            sp_entropy = sp.entropy()
        ours = v.log_prob(x).numpy()
        if np.all(np.isfinite(ref_lp)):
            np.testing.assert_allclose(ours, ref_lp, rtol=1e-11, atol=1e-11)
        # and against the definition in mpmath
        lc = log_c_ref(d, k)
        np.testing.assert_allclose(ours, lc + k * (x @ mu).numpy(), rtol=1e-12, atol=1e-11)
        if np.isfinite(sp_entropy):
            assert abs(v.entropy().item() - sp_entropy) <= 1e-10 * max(1.0, abs(sp_entropy))


def test_log_normalizer_gradient_is_minus_A():
    k = torch.tensor([0.0, 1e-8, 0.5, 30.0, 1e6], dtype=F64, requires_grad=True)
    for d in (2, 3, 50):
        v = VonMisesFisher(unit(d).expand(5, d), k)
        (g,) = torch.autograd.grad(v.log_normalizer().sum(), k)
        a = torch.tensor([A_ref(d, float(x)) for x in k.detach()], dtype=F64)
        torch.testing.assert_close(g, -a, rtol=1e-14, atol=1e-300)


def test_gradcheck_log_prob_entropy_kl():
    d = 4
    loc = unit(d, 2).requires_grad_(True)
    k = torch.tensor(2.5, dtype=F64, requires_grad=True)
    x = VonMisesFisher(loc.detach(), k.detach()).sample((3,))
    loc2 = unit(d, 9)

    def f(loc, k):
        mu = loc / loc.norm()
        p = VonMisesFisher(mu, k)
        q = VonMisesFisher(loc2, k * 0.5 + 1.0)
        return p.log_prob(x).sum(), p.entropy(), kl_divergence(p, q), kl_divergence(q, p), \
            kl_divergence(p, HypersphericalUniform(d, dtype=F64))

    assert torch.autograd.gradcheck(f, (loc, k))
    assert torch.autograd.gradgradcheck(lambda k: VonMisesFisher(loc2, k).entropy(), (k,))


@pytest.mark.parametrize("d", [2, 3, 10, 300])
def test_kl_vs_mpmath_and_monte_carlo(d):
    mq, mp_ = unit(d, 1), unit(d, 2)
    for kq, kp in [(0.0, 3.0), (3.0, 0.0), (2.0, 7.0), (500.0, 40.0)]:
        q = VonMisesFisher(mq, torch.tensor(kq, dtype=F64))
        p = VonMisesFisher(mp_, torch.tensor(kp, dtype=F64))
        kl = kl_divergence(q, p).item()
        a = A_ref(d, kq)
        exact = log_c_ref(d, kq) + kq * a - log_c_ref(d, kp) - kp * a * float(mq @ mp_)
        assert abs(kl - exact) <= 1e-12 * max(1.0, abs(log_c_ref(d, kq)), kq, kp), (kl, exact)
        x = q.sample((20000,), generator=torch.Generator().manual_seed(1))
        lr = q.log_prob(x) - p.log_prob(x)
        assert abs(lr.mean().item() - kl) <= Z * lr.std().item() / math.sqrt(len(lr)) + 1e-12
    # KL(q || q) = 0, KL to uniform at kappa = 0 is 0
    q = VonMisesFisher(mq, torch.tensor(1e4, dtype=F64))
    assert abs(kl_divergence(q, q).item()) < 1e-9
    u = HypersphericalUniform(d, dtype=F64)
    assert kl_divergence(VonMisesFisher(mq, torch.tensor(0.0, dtype=F64)), u).item() == pytest.approx(0, abs=1e-12)
    kq = 5.0
    exact_u = log_c_ref(d, kq) + kq * A_ref(d, kq) + float(log_sphere_area(d))
    assert kl_divergence(VonMisesFisher(mq, torch.tensor(kq, dtype=F64)), u).item() == pytest.approx(exact_u, rel=1e-12)


def test_uniform_log_prob_entropy():
    for d in (2, 3, 10, 1000):
        u = HypersphericalUniform(d, dtype=F64)
        with mpmath.workdps(30):
            area = mpmath.log(2) + (mpmath.mpf(d) / 2) * mpmath.log(mpmath.pi) - mpmath.loggamma(mpmath.mpf(d) / 2)
        assert u.entropy().item() == pytest.approx(float(area), rel=1e-14, abs=1e-14)
        assert u.log_prob(unit(d)).item() == pytest.approx(-float(area), rel=1e-14, abs=1e-14)


# ---------------------------------------------------------------------------
# the implicit reparameterisation gradient


def _dw_dkappa_mpmath(d, k, omw):
    """dw/dkappa = int_w^1 (t - A) f(t)/f(w) dt = -int_{-1}^w (...) dt, f(t) = exp(k t)(1-t^2)^((d-3)/2),
    by adaptive tanh-sinh quadrature at 40 digits, on the side of w away from the mode (the other side
    cancels), in the distance s to the end of that side (t = 1 - s or t = -1 + s, 1 - t^2 = s (2 - s)),
    so that nodes near the ends keep their precision; breakpoints at scales around w."""
    with mpmath.workdps(40):
        omw = mpmath.mpf(omw)
        w = 1 - omw
        A = mpmath.mpf(ref.ratio(0.5 * d, k)) if k > 0 else mpmath.mpf(0)
        kk = mpmath.mpf(k)
        e = mpmath.mpf(d - 3) / 2
        log_fw = kk * w + (e * (mpmath.log(omw) + mpmath.log(2 - omw)) if e != 0 else 0)
        m2 = d - 2
        mode = 2 * kk / (m2 + mpmath.sqrt(m2 * m2 + 4 * kk * kk)) if m2 > 0 else mpmath.mpf(1)
        sc = 1 / mpmath.sqrt(kk + d)
        upper = w >= mode
        end = omw if upper else 2 - omw  # length of the side

        def g(s):  # t = 1 - s (upper side) or -1 + s (lower side)
            t = 1 - s if upper else -1 + s
            lf = kk * t + (e * (mpmath.log(s) + mpmath.log(2 - s)) if e != 0 else 0)
            return (t - A) * mpmath.exp(lf - log_fw)

        pts = sorted({mpmath.mpf(0), end} | {end - x for x in (sc / 100, sc / 10, sc, 10 * sc) if 0 < end - x < end})
        val = mpmath.quad(g, pts)
        return val if upper else -val


@pytest.mark.parametrize("d", [2, 3, 4, 5, 10, 64, 1000])
def test_marginal_grad_vs_quadrature(d):
    rows = []
    for k in [1e-3, 0.7, 10.0, 300.0, 1e4]:
        x = VonMisesFisher(unit(d), torch.tensor(k, dtype=F64)).sample((400,), generator=torch.Generator().manual_seed(1))
        w = torch.sort(x @ unit(d))[0]
        for q in (0.001, 0.1, 0.5, 0.9, 0.999):  # empirical quantiles of w
            rows.append((k, float(w[int(q * (len(w) - 1))])))
    omw = torch.tensor([1 - wi for _, wi in rows], dtype=F64)
    kap = torch.tensor([k for k, _ in rows], dtype=F64)
    ours = lib.vmf_marginal_grad(omw, kap, d)
    for (k, wi), o, om in zip(rows, ours.tolist(), omw.tolist()):
        exact = _dw_dkappa_mpmath(d, k, om)
        assert math.isfinite(float(exact)) and abs(o - float(exact)) <= 1e-6 * abs(float(exact)), (d, k, wi, o,
                                                                                                   float(exact))


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3, 4, 7, 30, 300, 3000, 100000])
def test_marginal_grad_vs_quadrature_extremes(d):
    """kappa from 0 to 1e8 and quantiles 5e-4 .. 1 - 5e-4: relative error <= 1e-6 (measured: 2e-8)."""
    mu = unit(d)
    for k in [0.0, 1e-6, 0.05, 3.0, 100.0, 1e4, 1e6, 1e8]:
        x = VonMisesFisher(mu, torch.tensor(k, dtype=F64)).sample((2000,), generator=torch.Generator().manual_seed(1))
        w = torch.sort(x @ mu)[0]
        omw = torch.tensor([1 - float(w[int(q * (len(w) - 1))]) for q in (5e-4, 0.02, 0.5, 0.98, 1 - 5e-4)],
                           dtype=F64)
        ours = lib.vmf_marginal_grad(omw, torch.full_like(omw, k), d)
        for o, om in zip(ours.tolist(), omw.tolist()):
            exact = float(_dw_dkappa_mpmath(d, k, om))
            assert math.isfinite(exact) and abs(o - exact) <= 1e-6 * abs(exact), (d, k, om, o, exact)


@pytest.mark.parametrize("d,k", [(2, 1.0), (3, 4.0), (5, 2.0), (16, 50.0), (128, 20.0), (1000, 5e3)])
def test_rsample_gradient_is_unbiased(d, k):
    """mean of d(mu^T x)/dkappa over samples -> A'_d(kappa) = 1 - A^2 - (d-1)A/kappa."""
    n = 60000
    mu = unit(d, 6)
    # the op sums the gradient over samples: independent batches give the spread for the SE
    per = []
    for chunk in torch.split(torch.arange(n), n // 20):
        kap_c = torch.tensor(k, dtype=F64, requires_grad=True)
        xc = VonMisesFisher(mu, kap_c).rsample((len(chunk),), generator=torch.Generator().manual_seed(100 + int(chunk[0])))
        (gc,) = torch.autograd.grad((xc @ mu).mean(), kap_c)
        per.append(gc.item())
    per = np.array(per)
    target = dA_ref(d, k)
    se = per.std(ddof=1) / math.sqrt(len(per))
    assert abs(per.mean() - target) <= Z * se, (per.mean(), target, se)


def test_naive_gradient_through_the_proposal_is_biased():
    """Regression guard: differentiating Wood's accepted proposal w(z, b(kappa)) with z held fixed
    (the s-vae-pytorch estimator) is biased -- 0.1276 instead of A' = 0.1474 at d = 5, kappa = 2."""
    d, k, n = 5, 2.0, 200000
    mu = unit(d, 6)
    x = VonMisesFisher(mu, torch.tensor(k, dtype=F64)).sample((n,), generator=torch.Generator().manual_seed(9))
    omw = (1 - x @ mu).clamp(min=0)
    kap = torch.tensor(k, dtype=F64, requires_grad=True)
    m = d - 1
    b_fixed = m / (2 * k + math.sqrt(4 * k * k + m * m))
    z = omw / (2 * b_fixed + omw * (1 - b_fixed))  # the accepted Beta variate, inverted from w
    b = m / (2 * kap + torch.sqrt(4 * kap * kap + m * m))
    w = (1 - (1 + b) * z) / (1 - (1 - b) * z)
    per = torch.autograd.grad(w.sum(), kap)[0].item() / n
    # per-sample spread for the SE
    b0 = b.detach()
    eps = 1e-6
    b1 = m / (2 * (k + eps) + math.sqrt(4 * (k + eps) ** 2 + m * m))
    gs = ((1 - (1 + b1) * z) / (1 - (1 - b1) * z) - (1 - (1 + b0) * z) / (1 - (1 - b0) * z)) / eps
    se = gs.std().item() / math.sqrt(n)
    target = dA_ref(d, k)
    assert abs(target - 0.1474) < 1e-4
    assert abs(per - 0.1276) <= Z * se
    assert abs(per - target) > 10 * se


def test_loc_gradient():
    """d/dmu E[c^T x] = A(kappa) (I - mu mu^T) c / |loc| through the rotation (loc normalised)."""
    d, k, n = 6, 3.0, 100000
    loc = unit(d, 2).requires_grad_(True)
    c = unit(d, 8)
    x = VonMisesFisher(loc / loc.norm(), torch.tensor(k, dtype=F64)).rsample((n,), generator=torch.Generator().manual_seed(4))
    (g,) = torch.autograd.grad((x @ c).mean(), loc)
    mu = loc.detach()
    exact = A_ref(d, k) * (c - (mu @ c) * mu)
    # per-coordinate SE from batches
    per = []
    for s in range(20):
        xs = VonMisesFisher(loc / loc.norm(), torch.tensor(k, dtype=F64)).rsample(
            (n // 20,), generator=torch.Generator().manual_seed(50 + s))
        per.append(torch.autograd.grad((xs @ c).mean(), loc)[0])
    per = torch.stack(per)
    se = per.std(0) / math.sqrt(20)
    assert ((per.mean(0) - exact).abs() <= Z * se + 1e-12).all()
    assert ((g - exact).abs() <= Z * se * math.sqrt(20) + 1e-12).all()


def test_double_backward():
    """Issue 14: d2/dkappa2 through rsample was silently 0 (finite differences of the first derivative give
    -0.0255 at the issue's case) and the loc part raised "element 0 of tensors does not require grad".
    Now: with respect to loc the higher derivatives are exact (gradgradcheck against finite differences,
    same streams); with respect to kappa a double backward raises a clear error."""
    loc = torch.stack([unit(5, 1), unit(5, 2, first=-0.9)]).requires_grad_(True)
    kappa = torch.tensor([3.0, 40.0], dtype=F64)

    def f(l):
        return lib.vmf_sample(l, kappa, 3, seed=11, offset=4)[0]

    assert torch.autograd.gradcheck(f, (loc,))
    assert torch.autograd.gradgradcheck(f, (loc,))
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    x = VonMisesFisher(unit(4), k).rsample((8,), generator=torch.Generator().manual_seed(0))
    (g,) = torch.autograd.grad(x[..., 0].sum(), k)  # once: fine
    assert torch.isfinite(g)
    x = VonMisesFisher(unit(4), k).rsample((8,), generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="differentiable only once with respect to the concentration"):
        torch.autograd.grad(x[..., 0].sum(), k, create_graph=True)


def _sample_backward_reference(grad_x, grad_omw, loc, kappa, x, omw):
    """The backward of vmf_sample written with PyTorch ops: loc by autograd through the reflection
    x = Q(loc/|loc|) y with y = Q x held fixed; kappa by dL/dw times vmf_marginal_grad (tested
    against mpmath quadrature above), dL/dw from the rotated gradient."""
    mu = loc / torch.linalg.vector_norm(loc, dim=-1, keepdim=True)
    y = householder(mu, x)
    gq = householder(mu, grad_x)
    w, one_m_w2 = 1 - omw, omw * (2 - omw)
    tang = (gq[..., 1:] * y[..., 1:]).sum(-1)
    dl_dw = gq[..., 0] - torch.where(one_m_w2 > 0, w * tang / torch.where(one_m_w2 > 0, one_m_w2, 1.0), 0.0)
    if grad_omw is not None:
        dl_dw = dl_dw - grad_omw
    gk = (dl_dw * lib.vmf_marginal_grad(omw, kappa, loc.shape[-1])).sum(0)
    loc_ = loc.detach().requires_grad_(True)
    xr = householder(loc_ / torch.linalg.vector_norm(loc_, dim=-1, keepdim=True), y)
    (gl,) = torch.autograd.grad(xr, loc_, grad_x)
    return gl, gk


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("d", [2, 3, 5, 64])
def test_sample_backward_matches_reference(d, dtype):
    """The fused backward op (vmf_sample_backward) against the same map written with PyTorch ops, for
    loc = +-e_1, mu_0 = 0, non-unit loc, kappa = 0 and large, several samples per row, with and without a
    gradient for the second output; and the flags that skip a gradient."""
    g = torch.Generator().manual_seed(d)
    locs = [unit(d, 1), unit(d, 2, first=1.0), unit(d, 3, first=-1.0), unit(d, 4, first=0.0), 3.7 * unit(d, 5),
            unit(d, 6, first=-0.3)]
    loc = torch.stack(locs).to(dtype)
    kap = torch.tensor([2.0, 50.0, 0.0, 7.0, 1e4, 0.3], dtype=dtype)
    x, omw = lib.vmf_sample(loc, kap, 4, seed=5, offset=2)
    gx = torch.randn(x.shape, generator=g, dtype=F64).to(dtype)
    go = torch.randn(omw.shape, generator=g, dtype=F64).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-11, atol=1e-11)
    for grad_omw in (None, go):
        gl, gk = lib.vmf_sample_backward(gx, grad_omw, loc, kap, x, omw, True, True)
        rl, rk = _sample_backward_reference(gx.double(), None if grad_omw is None else grad_omw.double(), loc.double(),
                                            kap.double(), x.double(), omw.double())
        assert gl.dtype == dtype and gk.dtype == dtype
        torch.testing.assert_close(gl.double(), rl, **tol)
        torch.testing.assert_close(gk.double(), rk, **tol)
    only_loc = lib.vmf_sample_backward(gx, None, loc, kap, x, omw, True, False)
    only_kappa = lib.vmf_sample_backward(gx, None, loc, kap, x, omw, False, True)
    both = lib.vmf_sample_backward(gx, None, loc, kap, x, omw)
    assert only_loc[1].shape == (0,) and only_kappa[0].shape == (0,)
    assert torch.equal(only_loc[0], both[0]) and torch.equal(only_kappa[1], both[1])


def test_sample_backward_loc_scale_and_side():
    """d/dloc is (I - mu mu^T) d/dmu / |loc|: exactly scaled for loc far outside [2^-480, 2^480] (the
    kernels rescale by a power of two), and at mu_0 = 0, where the reflection Q(mu) changes, it is the
    derivative on the side of the reflection used (mu_0 >= 0), checked by a one-sided finite difference."""
    d = 6
    loc = torch.stack([unit(d, 1), unit(d, 2, first=0.0)])
    kap = torch.tensor([3.0, 20.0], dtype=F64)
    x, omw = lib.vmf_sample(loc, kap, 3, seed=8, offset=0)
    gx = torch.randn(x.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    gl, gk = lib.vmf_sample_backward(gx, None, loc, kap, x, omw)
    for c in (2.0 ** 700, 2.0 ** -700):
        xs, os = lib.vmf_sample(loc * c, kap, 3, seed=8, offset=0)
        gls, gks = lib.vmf_sample_backward(gx, None, loc * c, kap, xs, os)
        torch.testing.assert_close(gls * c, gl, rtol=1e-14, atol=0)
        torch.testing.assert_close(gks, gk, rtol=1e-14, atol=0)
    # mu_0 = 0 (row 1): a one-sided difference from the mu_0 > 0 side, same streams
    h = 1e-7
    lp = loc.clone()
    lp[1, 0] += h
    xp, _ = lib.vmf_sample(lp, kap, 3, seed=8, offset=0)
    fd = float(((xp - x) * gx).sum()) / h
    assert abs(fd - float(gl[1, 0])) <= 1e-5 * max(1.0, abs(fd))
    # the double-backward path (autograd through householder) gives the same one-sided derivative
    loc_ = loc.clone().requires_grad_(True)
    xr = lib.vmf_sample(loc_, kap, 3, seed=8, offset=0)[0]
    (g2,) = torch.autograd.grad(xr, loc_, gx, create_graph=True)
    torch.testing.assert_close(g2.detach(), gl, rtol=1e-12, atol=1e-12)


def test_sample_backward_opcheck():
    loc = torch.stack([unit(5, 1), unit(5, 2, first=-1.0)])
    kap = torch.tensor([1.0, 30.0], dtype=F64)
    x, omw = lib.vmf_sample(loc, kap, 3, seed=1, offset=0)
    gx = torch.randn_like(x)
    for args in ((gx, None, loc, kap, x, omw, True, True), (gx, torch.randn_like(omw), loc, kap, x, omw, False, True)):
        torch.library.opcheck(lib.vmf_sample_backward, args,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    with pytest.raises(RuntimeError, match="grad_x must have the shape of x"):
        lib.vmf_sample_backward(gx[:2], None, loc, kap, x, omw)
    with pytest.raises(RuntimeError, match="one_minus_w must have loc's dtype"):
        lib.vmf_sample_backward(gx, None, loc, kap, x, omw.float())


def test_seed_and_offset_ranges():
    """Issue 14: vmf_sample(..., 2**63 - 1) was accepted (offset + 1 < 2^48 overflowed) and reused the streams
    of other offsets.  The op uses offsets offset and offset + 1: both must be below 2^48."""
    loc, k = unit(3).unsqueeze(0), torch.ones(1, dtype=F64)
    for off in (2 ** 63 - 1, 2 ** 48 - 1, 2 ** 48, -1):
        with pytest.raises(RuntimeError, match=r"vmf_sample: offset must be in \[0, 2\^48 - 2\]"):
            lib.vmf_sample(loc, k, 1, seed=1, offset=off)
    with pytest.raises(RuntimeError, match=r"vmf_sample: seed must be in \[0, 2\^63\)"):
        lib.vmf_sample(loc, k, 1, seed=-1)
    with pytest.raises(RuntimeError, match="offset needs an explicit seed"):
        lib.vmf_sample(loc, k, 1, offset=3)
    with pytest.raises(RuntimeError, match="either generator or seed"):
        lib.vmf_sample(loc, k, 1, generator=torch.Generator(), seed=3)
    a = lib.vmf_sample(loc, k, 4, seed=1, offset=2 ** 48 - 2)[0]  # the last valid offset
    b = lib.vmf_sample(loc, k, 4, seed=1, offset=2 ** 48 - 3)[0]
    assert torch.isfinite(a).all() and not torch.equal(a, b)
    # explicit seed = the seed the op draws from an equal generator state is not observable, but equal
    # generator states give equal samples, and the generator advances
    g1, g2 = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    x1 = lib.vmf_sample(loc, k, 4, generator=g1)[0]
    assert torch.equal(x1, lib.vmf_sample(loc, k, 4, generator=g2)[0])
    assert not torch.equal(x1, lib.vmf_sample(loc, k, 4, generator=g1)[0])


# ---------------------------------------------------------------------------
# fitting


def test_fit_recovers_parameters_and_agrees_with_scipy():
    for d, k in [(3, 0.5), (10, 20.0), (50, 500.0)]:
        mu = unit(d, 3)
        x = VonMisesFisher(mu, torch.tensor(k, dtype=F64)).sample((5000,), generator=torch.Generator().manual_seed(1))
        loc, kap = fit_vmf(x)
        sp_mu, sp_k = scipy.stats.vonmises_fisher.fit(x.numpy())
        np.testing.assert_allclose(loc.numpy(), sp_mu, atol=1e-10)
        assert kap.item() == pytest.approx(sp_k, rel=1e-8)
        # the estimating equation A_d(kappa) = rbar, exactly
        rbar = x.mean(0).norm().item()
        assert A_ref(d, kap.item()) == pytest.approx(rbar, rel=1e-12)


def test_fit_extremes_and_batching():
    d = 4
    # rbar -> 1: concentrated data; 1 - rbar from |x - mu|^2 / 2 keeps kappa accurate
    mu = unit(d, 1)
    x = VonMisesFisher(mu, torch.tensor(1e10, dtype=F64)).sample((1000,), generator=torch.Generator().manual_seed(2))
    _, kap = fit_vmf(x)
    assert kap.item() == pytest.approx(1e10, rel=0.1)
    # rbar -> 0: symmetric data
    xs = torch.cat([x, -x])
    loc, kap0 = fit_vmf(xs)
    assert kap0.item() < 1e-6
    # identical points: kappa = inf, or as large as the rounding of mean/|mean| allows
    _, kinf = fit_vmf(mu.expand(10, d))
    assert kinf.item() > 1e25
    # batched with weights
    xb = torch.stack([x[:50], -x[:50]])
    wts = torch.rand(2, 50, dtype=F64)
    locb, kb = fit_vmf(xb, wts)
    assert locb.shape == (2, d) and kb.shape == (2,)
    l1, k1 = fit_vmf(xb[1], wts[1])
    torch.testing.assert_close(locb[1], l1)
    torch.testing.assert_close(kb[1], k1)
    v = VonMisesFisher.fit(x[:100])
    assert isinstance(v, VonMisesFisher)


# ---------------------------------------------------------------------------
# extremes and errors


@pytest.mark.parametrize("d,k", [(100000, 1e8), (100000, 1e-3), (100000, 0.0), (2, 1e9), (3, 0.0), (2, 0.0)])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("first", [1.0, -1.0, None])
def test_extremes_finite_and_on_sphere(d, k, dtype, first):
    if first is None:
        mu = unit(d, 0, dtype)
    else:
        mu = torch.zeros(d, dtype=dtype)
        mu[0] = first
    kap = torch.tensor(k, dtype=dtype, requires_grad=True)
    v = VonMisesFisher(mu, kap)
    x = v.rsample((8,))
    assert torch.isfinite(x).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    assert (x.double().norm(dim=-1) - 1).abs().max() <= tol  # (torch's float32 norm is too coarse at d = 1e5)
    lp = v.log_prob(x)
    assert torch.isfinite(lp).all()
    (g,) = torch.autograd.grad(lp.sum() + (x[..., 0]).sum(), kap)
    assert torch.isfinite(g)
    assert torch.isfinite(v.entropy()) and torch.isfinite(v.variance).all()


def test_bad_inputs():
    with pytest.raises(ValueError, match="concentration"):
        VonMisesFisher(unit(3), torch.tensor(-1.0, dtype=F64), validate_args=True)
    with pytest.raises(ValueError, match="loc"):
        VonMisesFisher(torch.tensor([1.0, 1.0, 0.0], dtype=F64), 1.0, validate_args=True)
    with pytest.raises(ValueError, match="dim must be at least 2"):
        VonMisesFisher(torch.tensor([1.0], dtype=F64), 1.0)
    with pytest.raises(ValueError, match="incompatible batch shapes"):
        VonMisesFisher(torch.stack([unit(3)] * 3), torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="dim must be at least 2"):
        HypersphericalUniform(1)
    v = VonMisesFisher(unit(3), 1.0, validate_args=True)
    with pytest.raises(ValueError):
        v.log_prob(torch.tensor([2.0, 0.0, 0.0], dtype=F64))
    with pytest.raises(RuntimeError, match="num_samples must be non-negative"):
        lib.vmf_sample(unit(3).unsqueeze(0), torch.ones(1, dtype=F64), -1, seed=0, offset=0)
    with pytest.raises(RuntimeError, match="concentration must have shape"):
        lib.vmf_sample(unit(3).unsqueeze(0), torch.ones(2, dtype=F64), 1, seed=0, offset=0)
    with pytest.raises(RuntimeError, match="dim must be at least 2"):
        lib.vmf_marginal_grad(torch.ones(2, dtype=F64), torch.ones(2, dtype=F64), 1)
    # out-of-domain marginal gradient: NaN, documented
    assert torch.isnan(lib.vmf_marginal_grad(torch.tensor([-0.5, 2.5]), torch.tensor([1.0, 1.0]), 3)).all()
    assert torch.isnan(lib.vmf_marginal_grad(torch.tensor([0.5]), torch.tensor([-1.0]), 3)).all()


def test_opcheck():
    loc = torch.stack([unit(5, 1), unit(5, 2)])
    kap = torch.tensor([1.0, 30.0], dtype=F64)
    torch.library.opcheck(lib.vmf_sample, (loc, kap, 3), {"seed": 123, "offset": 0},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    torch.library.opcheck(lib.vmf_marginal_grad, (torch.tensor([0.1, 1.5], dtype=F64), kap, 5))


# ---------------------------------------------------------------------------
# the float Box-Muller of fast_normal.h (float32 tangent normals)


@pytest.fixture(scope="module")
def fast_normal_driver(tmp_path_factory):
    # -O3: the batch routine must give the same bits when vectorised (in both copies of isa::dispatch)
    return compile_driver(tmp_path_factory, "fast_normal_check", "-O3", "-fno-math-errno")


@pytest.mark.parametrize("seed,offset,row,n", [(0, 1, 0, 9), (2 ** 64 - 1, 2 ** 48 - 1, 2 ** 48 - 1, 130),
                                               (987654321, 3, 12345, 4099)])
def test_fast_normals(fast_normal_driver, seed, offset, row, n):
    import subprocess

    from .test_philox import np_stream_words

    out = subprocess.run([fast_normal_driver, str(seed), str(offset), str(row), str(n)], check=True,
                         capture_output=True, text=True).stdout.split("\n")
    pairs = np.array([[float.fromhex(a) for a in line.split()] for line in out if line])
    assert pairs.shape == (n, 3)
    # the vectorised batch (AVX2 + FMA and baseline copies) and the scalar (device) routine agree bit for bit
    assert np.array_equal(pairs[:, 0], pairs[:, 2]) and np.array_equal(pairs[:, 1], pairs[:, 2])
    # against Box-Muller in float64 on the same words: u = (2k + 1) / 2^24, k = word >> 9
    words = np.array(np_stream_words(seed, offset, row, (n + 3) // 4), dtype=np.uint64)
    u = ((words >> np.uint64(9)) * 2 + 1).astype(np.float64) / 2.0 ** 24
    r = np.sqrt(-2 * np.log(u[0::2]))
    ang = 2 * np.pi * u[1::2]
    exact = np.empty(2 * len(r))
    exact[0::2], exact[1::2] = r * np.cos(ang), r * np.sin(ang)
    err = np.abs(pairs[:, 0] - exact[:n])
    assert np.all(err <= 4 * np.finfo(np.float32).eps * np.maximum(1.0, np.abs(exact[:n]))), err.max()


@pytest.mark.parametrize("seed,offset,row,n,nrows", [(5, 1, 0, 15, 16), (7, 3, 2 ** 32 - 5, 1, 13),
                                                     (2 ** 64 - 1, 2 ** 48 - 1, 2 ** 48 - 3, 6, 7),
                                                     (11, 2, 100, 16, 3)])
def test_fast_normals_multi_row(fast_normal_driver, seed, offset, row, n, nrows):
    """The routine that fills short vMF rows several at a time (their blocks share the vector
    lanes, rows crossing a 2^32 boundary of the stream index included) gives each row the
    bits of the scalar per-row routine."""
    import subprocess

    out = subprocess.run([fast_normal_driver, str(seed), str(offset), str(row), str(n), str(nrows)], check=True,
                         capture_output=True, text=True).stdout.split("\n")
    pairs = np.array([[float.fromhex(a) for a in line.split()] for line in out if line])
    assert pairs.shape == (n * nrows, 3)
    assert np.array_equal(pairs[:, 0], pairs[:, 2]) and np.array_equal(pairs[:, 1], pairs[:, 2])
    assert len(np.unique(pairs[:, 0])) == n * nrows  # distinct streams, not one row repeated


def test_fast_normals_distribution():
    """float32 vMF rows at mu = e_1, kappa = 0 are uniform directions; their tangent coordinates,
    rescaled, are the normalised normals: check the normal law by a KS test on x_i sqrt(d) for d large."""
    d = 20001
    mu = torch.zeros(d)
    mu[0] = 1
    x = VonMisesFisher(mu, torch.tensor(0.0)).sample((2,), generator=torch.Generator().manual_seed(4))
    z = (x[:, 1:] * math.sqrt(d)).double().reshape(-1).numpy()
    assert scipy.stats.kstest(z, "norm").pvalue > 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_cuda_matches_cpu(dtype):
    """Same seed: the same samples on the GPU as on the CPU, up to rounding of the double
    transcendental functions (an acceptance decision may flip in a vanishing fraction of rows)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA not available")
    for d, k in [(3, 5.0), (16, 100.0), (300, 1e3), (5000, 1e4)]:
        loc = torch.stack([unit(d, 1, dtype), unit(d, 2, dtype, first=-1.0)])
        kap = torch.tensor([k, 0.1 * k], dtype=dtype)
        x_cpu, o_cpu = lib.vmf_sample(loc, kap, 257, seed=42, offset=0)
        x_gpu, o_gpu = lib.vmf_sample(loc.cuda(), kap.cuda(), 257, seed=42, offset=0)
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        close = ((x_cpu - x_gpu.cpu()).abs().amax(-1) <= tol)
        assert close.double().mean() >= 0.995
        g_cpu = lib.vmf_marginal_grad(o_cpu, kap, d)
        g_gpu = lib.vmf_marginal_grad(o_cpu.cuda(), kap.cuda(), d).cpu()
        # the quadrature's terms partly cancel, so libm's and CUDA's last bits show against the
        # batch's largest value (a 2e-17 difference at 1.1e-12 relative was seen on an H200)
        gtol = 1e-5 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(g_gpu, g_cpu, rtol=gtol, atol=gtol * g_cpu.abs().amax().item())
        # the fused backward on the same (CPU) sample
        gx = torch.randn(x_cpu.shape, generator=torch.Generator().manual_seed(d), dtype=F64).to(dtype)
        go = torch.randn(o_cpu.shape, generator=torch.Generator().manual_seed(d + 1), dtype=F64).to(dtype)
        b_cpu = lib.vmf_sample_backward(gx, go, loc, kap, x_cpu, o_cpu)
        b_gpu = lib.vmf_sample_backward(gx.cuda(), go.cuda(), loc.cuda(), kap.cuda(), x_cpu.cuda(), o_cpu.cuda())
        for a, b in zip(b_cpu, b_gpu):
            torch.testing.assert_close(b.cpu(), a, rtol=1e-4 if dtype == torch.float32 else 1e-10,
                                       atol=1e-4 if dtype == torch.float32 else 1e-10)


# ---------------------------------------------------------------------------
# covariance matrix


def _marginal_moments_mpmath(d, k):
    """(E[1 - w^2] / (d - 1), Var[w]) of the marginal w = mu^T x by mpmath quadrature, in
    t = k (1 - w): density ~ exp(-t) t^((d-3)/2) (2 - t/k)^((d-3)/2) on [0, 2k]."""
    with mpmath.workdps(50):
        k_ = mpmath.mpf(k)
        e = mpmath.mpf(d - 3) / 2

        def mom(p):
            f = lambda t: t ** p * mpmath.exp(-t) * (t * (2 - t / k_)) ** e  # noqa: E731
            pts = [0] + [x for x in (1, 10, 50, 200) if x < 2 * k_] + [2 * k_]
            return mpmath.quad(f, pts)

        m0, m1, m2 = mom(0), mom(1), mom(2)
        et, et2 = m1 / m0, m2 / m0  # E[t], E[t^2]
        one_m_w = et / k_
        ew2 = 1 - 2 * one_m_w + et2 / k_ ** 2  # E[w^2] = E[(1 - t/k)^2]
        var_w = (et2 - et * et) / k_ ** 2
        return float((1 - ew2) / (d - 1)), float(var_w)


@pytest.mark.parametrize("d,k", [(2, 0.5), (3, 5.0), (4, 1e-3), (5, 2.0), (16, 100.0), (64, 1e4), (3, 1e8),
                                 (1000, 50.0)])
def test_covariance_matrix_vs_quadrature(d, k):
    """Cov[x] = (A/k)(I - mu mu^T) + Var[w] mu mu^T against moments of the marginal computed by
    mpmath quadrature (independent of the Bessel-ratio code): with mu = e1 the matrix is diagonal
    with entries Var[w], then E[1 - w^2]/(d - 1)."""
    tang, var_w = _marginal_moments_mpmath(d, k)
    mu = torch.zeros(d, dtype=F64)
    mu[0] = 1.0
    v = VonMisesFisher(mu, torch.tensor(k, dtype=F64))
    cov = v.covariance_matrix
    assert cov.shape == (d, d)
    assert cov[0, 0].item() == pytest.approx(var_w, rel=1e-12)
    torch.testing.assert_close(cov.diagonal()[1:], torch.full((d - 1,), tang, dtype=F64), rtol=1e-13, atol=0)
    assert (cov - torch.diag(cov.diagonal())).abs().max().item() == 0.0
    torch.testing.assert_close(v.variance, cov.diagonal(), rtol=0, atol=0)
    # a general direction: the same eigenvalues, eigenvector mu
    mu = unit(d, 3)
    v = VonMisesFisher(mu, torch.tensor(k, dtype=F64))
    cov = v.covariance_matrix
    ref_cov = tang * (torch.eye(d, dtype=F64) - torch.outer(mu, mu)) + var_w * torch.outer(mu, mu)
    torch.testing.assert_close(cov, ref_cov, rtol=1e-12, atol=1e-13 * max(tang, var_w))
    torch.testing.assert_close(v.variance, cov.diagonal(), rtol=1e-15, atol=0)
    torch.testing.assert_close(cov, cov.mT, rtol=0, atol=0)


def test_covariance_matrix_extremes_and_naive_formula():
    """Along mu the variance is A'(k) ~ (d - 1)/(2 k^2); the textbook (A/k) I + (1 - dA/k - A^2) mu mu^T
    forms it from order-one terms and loses every digit by k = 1e8.  Reference: the certified mpmath
    derivative of the Bessel ratio (tests/reference.py)."""
    for d, k in [(3, 1e8), (2, 1e12), (100, 1e6), (10, 1e-200), (100000, 1e3)]:
        mu = torch.zeros(d, dtype=F64)
        mu[0] = 1.0
        cov_diag = VonMisesFisher(mu, torch.tensor(k, dtype=F64)).variance
        var_w = float(ref.dratio(0.5 * d, k))
        a_over_k = float(ref.ratio(0.5 * d, k) / mpmath.mpf(k))
        assert cov_diag[0].item() == pytest.approx(var_w, rel=1e-13)
        assert cov_diag[1].item() == pytest.approx(a_over_k, rel=1e-14)
    a = A_ref(3, 1e8)
    naive = 1 - 3 * a / 1e8 - a * a + a / 1e8
    assert abs(naive - float(ref.dratio(1.5, 1e8))) > 0.01 * float(ref.dratio(1.5, 1e8))
    # k = 0: I / d exactly; float32 agrees with float64
    v = VonMisesFisher(unit(5, 1), torch.tensor(0.0, dtype=F64))
    torch.testing.assert_close(v.covariance_matrix, torch.eye(5, dtype=F64) / 5, rtol=1e-15, atol=1e-17)
    torch.testing.assert_close(HypersphericalUniform(5, batch_shape=(2,), dtype=F64).covariance_matrix,
                               torch.eye(5, dtype=F64).expand(2, 5, 5) / 5, rtol=0, atol=0)
    k = torch.tensor([0.0, 1e-3, 3.0, 1e4, 1e8], dtype=F64)
    loc = unit(7, 2).expand(5, 7)
    c64 = VonMisesFisher(loc, k).covariance_matrix
    c32 = VonMisesFisher(loc.float(), k.float()).covariance_matrix
    assert c32.dtype == torch.float32 and c64.shape == (5, 7, 7)
    scale = c64.abs().amax((-2, -1), keepdim=True)
    assert ((c32.double() - c64).abs() <= 1e-5 * scale).all()


@pytest.mark.parametrize("d,k", [(3, 2.0), (6, 20.0)])
def test_covariance_matrix_vs_monte_carlo(d, k):
    n = 40000
    v = VonMisesFisher(unit(d, 4), torch.tensor(k, dtype=F64))
    x = v.sample((n,), generator=torch.Generator().manual_seed(3))
    c = x - v.mean
    prods = c.unsqueeze(-1) * c.unsqueeze(-2)  # (n, d, d): unbiased for Cov with the exact mean
    se = prods.std(0) / math.sqrt(n)
    assert ((prods.mean(0) - v.covariance_matrix).abs() <= Z * se + 1e-15).all()


def test_covariance_matrix_gradcheck():
    loc = unit(4, 2).requires_grad_(True)
    k = torch.tensor([0.7, 40.0], dtype=F64, requires_grad=True)

    def f(loc, k):
        v = VonMisesFisher((loc / loc.norm()).expand(2, 4), k)
        return v.covariance_matrix, v.variance

    assert torch.autograd.gradcheck(f, (loc, k))


# ---------------------------------------------------------------------------
# KL(uniform || vMF)


def _kl_uniform_vmf_mpmath(d, k):
    """(-log S_{d-1} - log C_d(k), |log C_d(k) + k|) in mpmath (log I_nu from tests/reference.py,
    certified to 55 digits)."""
    with mpmath.workdps(80):
        dd = mpmath.mpf(d)
        log_s = mpmath.log(2) + dd / 2 * mpmath.log(mpmath.pi) - mpmath.loggamma(dd / 2)
        if k == 0:
            return 0.0, float(abs(log_s))
        nu = dd / 2 - 1
        log_c = nu * mpmath.log(k) - dd / 2 * mpmath.log(2 * mpmath.pi) - ref.log_iv(float(nu), k, digits=55)
        return float(-log_s - log_c), float(abs(log_c + k))


@pytest.mark.parametrize("d", [2, 3, 10, 300, 100000])
def test_kl_uniform_vmf_vs_mpmath(d):
    ks = [0.0, 1e-8, 1e-3, 0.4, 1.0, math.sqrt(d / 2.0), 1.01 * math.sqrt(d / 2.0), 3.0, 40.0, 1e4, 1e9]
    mu = unit(d, 1)
    kl = kl_divergence(HypersphericalUniform(d, dtype=F64), VonMisesFisher(mu.expand(len(ks), d),
                                                                           torch.tensor(ks, dtype=F64)))
    assert kl.shape == (len(ks),)
    log_s = abs(float(log_sphere_area(d)))
    for k, ours in zip(ks, kl.tolist()):
        exact, log_c_scaled = _kl_uniform_vmf_mpmath(d, k)
        # relative precision from the series (k^2/4 <= d/8); above it the terms k, log S and the
        # scaled log C are summed, each with its own rounding: 1e-15 of their sizes on top
        tol = 1e-13 * abs(exact) + (1e-15 * (log_s + k + log_c_scaled) if k * k / 4 > d / 8 else 0.0)
        assert abs(ours - exact) <= tol, (d, k, ours, exact)
        if 0 < k <= 1.0:  # the closed form log 0F1(; d/2; k^2/4), independently in mpmath
            with mpmath.workdps(40):
                assert ours == pytest.approx(float(mpmath.log(mpmath.hyp0f1(d / 2, mpmath.mpf(k) ** 2 / 4))),
                                             rel=1e-13)


@pytest.mark.parametrize("d,k", [(3, 2.0), (10, 7.0)])
def test_kl_uniform_vmf_monte_carlo_and_shapes(d, k):
    n = 40000
    u = HypersphericalUniform(d, batch_shape=(2, 1), dtype=F64)
    p = VonMisesFisher(torch.stack([unit(d, 1), unit(d, 2), unit(d, 3)]), torch.tensor([k, k, 0.0], dtype=F64))
    kl = kl_divergence(u, p)
    assert kl.shape == (2, 3)
    assert kl[:, 2].abs().max().item() == 0.0
    x = HypersphericalUniform(d, dtype=F64).sample((n,), generator=torch.Generator().manual_seed(5))
    lr = -float(log_sphere_area(d)) - VonMisesFisher(unit(d, 1), torch.tensor(k, dtype=F64)).log_prob(x)
    assert abs(lr.mean().item() - kl[0, 0].item()) <= Z * lr.std().item() / math.sqrt(n)
    torch.testing.assert_close(kl[0, 0], kl[1, 1], rtol=0, atol=0)  # independent of mu
    with pytest.raises(ValueError, match="same dimension"):
        kl_divergence(HypersphericalUniform(4), VonMisesFisher(unit(3), 1.0))


def test_kl_uniform_vmf_gradcheck():
    loc = unit(5, 2).requires_grad_(True)
    k = torch.tensor([1e-3, 0.9, 1.7, 30.0], dtype=F64, requires_grad=True)  # both sides of the series branch

    def f(loc, k):
        return kl_divergence(HypersphericalUniform(5, dtype=F64), VonMisesFisher((loc / loc.norm()).expand(4, 5), k))

    assert torch.autograd.gradcheck(f, (loc, k))
    assert torch.autograd.gradgradcheck(lambda k: f(loc.detach(), k), (k,))
    # d KL / d k = -d log C / d k = A_d(k)
    (g,) = torch.autograd.grad(f(loc.detach(), k).sum(), k)
    torch.testing.assert_close(g, torch.tensor([A_ref(5, float(x)) for x in k.detach()], dtype=F64),
                               rtol=1e-13, atol=0)


# ---------------------------------------------------------------------------
# clear errors


def test_errors_name_the_argument():
    loc = unit(3)
    with pytest.raises(TypeError, match="concentration must be a tensor or a real number, got the string"):
        VonMisesFisher(torch.tensor([1.0, 0.0]), "1.0")
    with pytest.raises(TypeError, match="loc must be a tensor or a real number, got None"):
        VonMisesFisher(None, 1.0)
    with pytest.raises(TypeError, match="concentration must be a tensor or a real number, got None"):
        VonMisesFisher(loc, None)
    with pytest.raises(TypeError, match="loc must be real"):
        VonMisesFisher(torch.tensor([1.0 + 0j, 0.0]), 1.0)
    with pytest.raises(TypeError, match="concentration must be real"):
        VonMisesFisher(loc, 1.0 + 2j)
    with pytest.raises(TypeError, match="concentration must be real"):
        VonMisesFisher(loc, torch.tensor(1.0 + 0j))
    with pytest.raises(ValueError, match="concentration must be on the same device as loc"):
        VonMisesFisher(loc, torch.tensor(1.0, dtype=F64, device="meta"))
    with pytest.raises(ValueError, match="batch_shape must be a sequence of non-negative ints"):
        HypersphericalUniform(3, batch_shape=(-1,))
    with pytest.raises(TypeError, match="batch_shape"):
        HypersphericalUniform(3, batch_shape=(2.5,))
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        HypersphericalUniform(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="device"):
        HypersphericalUniform(3, device="not-a-device")
    assert HypersphericalUniform(3, batch_shape=4).batch_shape == (4,)
    # a Python float concentration is converted straight to loc's dtype (no float32 rounding first)
    assert VonMisesFisher(loc, 0.1).concentration.item() == 0.1


@pytest.mark.parametrize("validate", [True, False])
def test_log_prob_wrong_dimension(validate):
    v = VonMisesFisher(unit(3).expand(2, 3), torch.ones(2, dtype=F64), validate_args=validate)
    with pytest.raises(ValueError, match=r"VonMisesFisher.log_prob: value must end in the event shape \(3,\)"):
        v.log_prob(unit(4))
    with pytest.raises(ValueError, match="do not broadcast against the batch shape"):
        v.log_prob(unit(3).expand(5, 3))
    u = HypersphericalUniform(3, dtype=F64, validate_args=validate)
    with pytest.raises(ValueError, match=r"HypersphericalUniform.log_prob: value must end in the event shape"):
        u.log_prob(unit(4))
    assert v.log_prob(unit(3).expand(4, 1, 3)).shape == (4, 2)


def test_fit_checks_unit_vectors_and_real_input():
    x = VonMisesFisher(unit(4, 1), torch.tensor(5.0, dtype=F64)).sample((100,),
                                                                       generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="x must hold unit vectors .* 1 of 100 are not"):
        fit_vmf(torch.cat([x[:99], 2 * x[99:]]))
    with pytest.raises(ValueError, match="unit vectors"):
        VonMisesFisher.fit(x * 1.001)
    fit_vmf(x * (1 + 5e-7))  # within the float64 tolerance of the sphere constraint (1e-6)
    fit_vmf(x.float())
    with pytest.raises(TypeError, match="x must be real"):
        fit_vmf(x.to(torch.complex128))
    with pytest.raises(TypeError, match="weights must be real"):
        fit_vmf(x, torch.ones(100, dtype=torch.complex128))


# ---------------------------------------------------------------------------
# vmf_sample: the public sampler over raw tensors (what the RDP layers call)


def test_vmf_sample_is_rsample_for_unit_loc_and_normalises_loc():
    """The same op as VonMisesFisher.rsample: the same samples for unit directions with the same
    generator, shape sample_shape + loc.shape (batch dimensions kept); a scaled direction gives the
    samples of its unit vector, and the gradient to it is the chain rule through the normalisation."""
    from vmfdist.distributions import vmf_sample

    loc = torch.stack([torch.stack([unit(5, 1), unit(5, 2), unit(5, 3)]), torch.stack([unit(5, 4), unit(5, 5),
                                                                                        unit(5, 6)])])
    k = torch.tensor([[0.0, 2.0, 40.0], [1e-3, 5.0, 1e4]], dtype=F64)
    x = vmf_sample(loc, k, (4,), generator=torch.Generator().manual_seed(7))
    assert x.shape == (4, 2, 3, 5)
    ref_x = VonMisesFisher(loc, k).rsample((4,), generator=torch.Generator().manual_seed(7))
    assert torch.equal(x, ref_x)
    scale = torch.tensor([[2.0], [0.5], [3.0]], dtype=F64)
    raw = (loc * scale).requires_grad_(True)
    kg = k.clone().requires_grad_(True)
    x2 = vmf_sample(raw, kg, (4,), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(x2, ref_x, rtol=1e-14, atol=1e-14)
    c = torch.randn(5, generator=torch.Generator().manual_seed(8), dtype=F64)
    g_raw, g_k = torch.autograd.grad((x2 @ c).square().sum(), (raw, kg))
    raw2 = raw.detach().clone().requires_grad_(True)
    kg2 = k.clone().requires_grad_(True)
    xr = VonMisesFisher(raw2 / raw2.norm(dim=-1, keepdim=True), kg2).rsample(
        (4,), generator=torch.Generator().manual_seed(7))
    r_raw, r_k = torch.autograd.grad((xr @ c).square().sum(), (raw2, kg2))
    torch.testing.assert_close(g_raw, r_raw, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_k, r_k, rtol=1e-10, atol=1e-12)
    # a 1-d loc (one direction, 0-dim concentration) and a sample_shape of several dimensions
    assert vmf_sample(unit(3), torch.tensor(1.0, dtype=F64), (2, 3)).shape == (2, 3, 3)


def test_vmf_sample_bad_input():
    from vmfdist.distributions import vmf_sample

    loc, k = torch.stack([unit(4, 1), unit(4, 2)]), torch.ones(2, dtype=F64)
    with pytest.raises(ValueError, match=r"vmf_sample: concentration must have shape loc.shape\[:-1\] = \(2,\)"):
        vmf_sample(loc, torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="vmf_sample: loc must have shape .* d >= 2"):
        vmf_sample(torch.ones(2, 1, dtype=F64), k)
    with pytest.raises(TypeError, match="vmf_sample: loc and concentration must be tensors"):
        vmf_sample(loc.tolist(), k)
    with pytest.raises(TypeError, match="vmf_sample: generator must be a torch.Generator"):
        vmf_sample(loc, k, (2,), generator=3)
    with pytest.raises(RuntimeError, match="vmf_sample"):  # the op names the dtype mismatch
        vmf_sample(loc, k.float())
