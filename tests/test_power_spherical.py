"""PowerSpherical: closed forms against independent references, the fused sampler, its gradients, the KLs.

References: the normaliser, E[log(1 + t)] (entropy) and the KLs by mpmath quadrature of the marginal
density of t = mu^T x (never from the closed forms under test); dt/dkappa against mpmath's derivative of
the regularised incomplete beta function; the ``power_spherical`` PyPI package (De Cao's own code) where
it overlaps; SciPy's Beta CDF for the sampled marginal; sample moments and Monte Carlo KLs with
tolerances of Z standard errors at fixed seeds.
"""
from __future__ import annotations

import contextlib
import math
import os

import mpmath
import numpy as np
import pytest
import scipy.stats
import scipy.special
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import kl_divergence

from vmfdist._ops import lib
from vmfdist.distributions import HypersphericalUniform, PowerSpherical, VonMisesFisher, power_spherical_sample
from vmfdist.distributions.kl import kl_power_spherical_uniform
from vmfdist.distributions.power_spherical import digamma_diff, lgamma_diff, trigamma_diff

F64 = torch.float64
Z = 5.0  # tolerance of the statistical tests, in standard errors
EXAMPLES = int(os.environ.get("VMFDIST_HYPOTHESIS_EXAMPLES", "40"))

try:
    import power_spherical as ps_pkg
except ImportError:  # the test peer (benchmarks/requirements-kron.txt); the tests that need it skip
    ps_pkg = None
needs_pkg = pytest.mark.skipif(ps_pkg is None, reason="the power_spherical package (0.8.1) is not installed")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def unit(d, seed=0, first=None):
    v = torch.randn(d, generator=gen(seed), dtype=F64)
    if first is not None:
        v[0] = 0.0
        v = v / v.norm() * math.sqrt(1 - first * first) if d > 1 else v
        v[0] = first
    return v / v.norm()


# ---------------------------------------------------------------------------------- mpmath references
mpmath.mp.dps = 30


def marginal_quad(f, k, d):
    """The integral of f(t) (1 + t)^k (1 - t^2)^((d-3)/2) over t = mu^T x in [-1, 1] (the unnormalised marginal
    density of PS(mu, k) on S^(d-1)), in the half angle t = cos 2psi, where the integrand
    2 (2 cos^2 psi)^k (2 sin psi cos psi)^(d-2) has no endpoint singularity for any d >= 2; f gets
    (cos psi, sin psi): 1 + t = 2 cos^2 psi, t = cos^2 psi - sin^2 psi."""
    k = mpmath.mpf(k)

    def g(p):
        c, s = mpmath.cos(p), mpmath.sin(p)
        return f(c, s) * 2 * (2 * c * c) ** k * (2 * s * c) ** (d - 2)

    return mpmath.quad(g, [0, mpmath.pi / 4, mpmath.pi / 2])


def _sphere_area(n):
    """Surface area of S^(n-1) in R^n (n = 1: the two points of S^0)."""
    return 2 * mpmath.pi ** (mpmath.mpf(n) / 2) / mpmath.gamma(mpmath.mpf(n) / 2)


def log_c_ref(k, d):
    """log C_d(k) = -log of the integral of (1 + mu^T x)^k over the sphere: S_{d-2} times the marginal integral."""
    return -mpmath.log(_sphere_area(d - 1) * marginal_quad(lambda c, s: 1, k, d))


def moment_ref(k, d, power):
    """E[t^power] by quadrature."""
    return marginal_quad(lambda c, s: (c * c - s * s) ** power, k, d) / marginal_quad(lambda c, s: 1, k, d)


def entropy_ref(k, d):
    """-E[log p(x)] = -log C - k E[log(1 + t)], E by quadrature of the marginal."""
    e = marginal_quad(lambda c, s: mpmath.log(2) + 2 * mpmath.log(c), k, d) / marginal_quad(lambda c, s: 1, k, d)
    return -log_c_ref(k, d) - k * e


def dt_dkappa_ref(omt, k, d):
    """dt/dkappa = 2 dB/dalpha = -2 (d/dalpha I_B(alpha, beta)) / f(B), B = 1 - omt/2, by mpmath."""
    b = mpmath.mpf(d - 1) / 2
    a = b + mpmath.mpf(k)
    x = 1 - mpmath.mpf(omt) / 2
    dF = mpmath.diff(lambda aa: mpmath.betainc(aa, b, 0, x, regularized=True), a)
    f = x ** (a - 1) * (1 - x) ** (b - 1) / mpmath.beta(a, b)
    return float(-2 * dF / f)


@contextlib.contextmanager
def default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


# ---------------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("d", [2, 3, 5, 10])
def test_log_normalizer_and_entropy_vs_quadrature(d):
    ks = [0.0, 1e-3, 0.5, 3.0, 40.0, 1e3]
    q = PowerSpherical(unit(d), torch.tensor(ks, dtype=F64))
    lc, h = q.log_normalizer(), q.entropy()
    for i, k in enumerate(ks):
        assert abs(lc[i].item() - float(log_c_ref(k, d))) <= 1e-12 * max(1.0, abs(lc[i].item())), (d, k)
        assert abs(h[i].item() - float(entropy_ref(k, d))) <= 1e-12 * max(1.0, abs(h[i].item())), (d, k)
    # kappa = 0 is the uniform distribution
    hu = HypersphericalUniform(d, dtype=F64)
    torch.testing.assert_close(h[0], hu.entropy(), rtol=1e-14, atol=0)


def test_log_prob_at_points_and_near_the_antipode():
    """log p at explicit points against log C (mpmath) + k log(1 + mu^T x) in 30 digits: x = mu, x = -mu
    (p = 0 for k > 0, the uniform density for k = 0), x orthogonal to mu, and x = (-1, 1e-9, 0, 0) for
    mu = e_1, whose nearest point of the sphere has 1 + mu^T x = 5e-19 (the dot product gives 0 there:
    log p = -inf instead of log C + k log 5e-19)."""
    d, mu = 4, unit(4, 1)
    tang = unit(4, 2)
    tang = tang - (tang @ mu) * mu
    tang = tang / tang.norm()
    e1 = torch.tensor([1.0, 0, 0, 0], dtype=F64)
    near = torch.tensor([-1.0, 1e-9, 0, 0], dtype=F64)
    cases = [(mu, mu, mpmath.mpf(2)), (mu, -mu, mpmath.mpf(0)), (mu, tang, mpmath.mpf(1)),
             (e1, near, 1 - 1 / mpmath.sqrt(1 + mpmath.mpf(1e-9) ** 2))]
    for k in (0.0, 2.5, 300.0):
        for m, x, one_plus in cases:
            lp = PowerSpherical(m, torch.tensor(k, dtype=F64)).log_prob(x).item()
            want = log_c_ref(k, d) + (k * mpmath.log(one_plus) if k > 0 else 0)
            if want == -mpmath.inf:
                assert lp == -math.inf
            else:
                assert abs(lp - float(want)) <= 1e-12 * max(1.0, abs(float(want))), (k, x, lp, float(want))


def test_large_concentration_keeps_its_digits():
    """kappa = 1e6 .. 1e12: log C, entropy and KL to the uniform against mpmath's loggamma / digamma (which
    the closed forms use, not the quadrature: the marginal is too narrow for it).  Two lgamma calls in
    double precision lose kappa * 1e-16 in absolute terms; the Stirling differences do not."""
    d = 7
    b = mpmath.mpf(d - 1) / 2
    for k in (1e6, 1e9, 1e12):
        a = b + k
        lg = mpmath.loggamma(a + b) - mpmath.loggamma(a)
        dg = mpmath.digamma(a + b) - mpmath.digamma(a)
        lc = lg - k * mpmath.log(2) - b * mpmath.log(4 * mpmath.pi)
        h = b * mpmath.log(4 * mpmath.pi) - lg + k * dg
        q = PowerSpherical(unit(d), torch.tensor(k, dtype=F64))
        assert abs(q.log_normalizer().item() - float(lc)) <= 1e-13 * abs(float(lc)), k
        assert abs(q.entropy().item() - float(h)) <= 1e-13 * abs(float(h)), k
        kl = kl_divergence(q, HypersphericalUniform(d, dtype=F64)).item()
        assert abs(kl - float(-h + mpmath.log(_sphere_area(d)))) <= 1e-13 * kl, k
        # and the helpers at the same points, with b not a half-integer too
        for bb in (b, mpmath.mpf("0.3")):
            at = torch.tensor(float(bb + k), dtype=F64)
            want_lg = mpmath.loggamma(bb + k + bb) - mpmath.loggamma(bb + k)
            want_dg = mpmath.digamma(bb + k + bb) - mpmath.digamma(bb + k)
            assert abs(lgamma_diff(at, float(bb)).item() - float(want_lg)) <= 1e-14 * abs(float(want_lg))
            assert abs(digamma_diff(at, float(bb)).item() - float(want_dg)) <= 1e-14 * abs(float(want_dg))


@pytest.mark.parametrize("a", [0.5, 1.7, 9.99, 10.0, 37.5, 1e4, 1e9])
@pytest.mark.parametrize("b", [0.5, 1.0, 4.5, 0.3, 499.5])
def test_gamma_differences_vs_mpmath(a, b):
    """lgamma_diff, digamma_diff and trigamma_diff on both sides of their switch at a = 10, against mpmath
    (a + b formed in mpmath: b = 0.3 is not exact, and 1e9 + b would round)."""
    at = torch.tensor(a, dtype=F64)
    ma, mb = mpmath.mpf(a), mpmath.mpf(b)
    want_lg = float(mpmath.loggamma(ma + mb) - mpmath.loggamma(ma))
    want_dg = float(mpmath.psi(0, ma + mb) - mpmath.psi(0, ma))
    want_tg = float(mpmath.psi(1, ma) - mpmath.psi(1, ma + mb))
    assert abs(lgamma_diff(at, b).item() - want_lg) <= 4e-15 * max(1.0, abs(want_lg))
    assert abs(digamma_diff(at, b).item() - want_dg) <= 4e-15 * want_dg
    assert abs(trigamma_diff(at, b).item() - want_tg) <= 4e-15 * want_tg


def test_moments_closed_forms_vs_quadrature():
    """E[t] and Var(t) (mean, variance, covariance_matrix) against quadrature of the marginal, and the
    covariance across mu (E[1 - t^2] / (d - 1)); kappa = 0 gives I/d."""
    for d, k in [(2, 0.3), (3, 0.0), (5, 7.0), (10, 150.0)]:
        mu = unit(d, 3)
        q = PowerSpherical(mu, torch.tensor(k, dtype=F64))
        m1, m2 = moment_ref(k, d, 1), moment_ref(k, d, 2)
        along, across = float(m2 - m1 * m1), float((1 - m2) / (d - 1))
        torch.testing.assert_close(q.mean, float(m1) * mu, rtol=1e-12, atol=1e-14)
        outer = torch.outer(mu, mu)
        cov = across * (torch.eye(d, dtype=F64) - outer) + along * outer
        torch.testing.assert_close(q.covariance_matrix, cov, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(q.variance, torch.diagonal(cov), rtol=1e-12, atol=1e-14)
        if k == 0:
            torch.testing.assert_close(q.covariance_matrix, torch.eye(d, dtype=F64) / d, rtol=1e-14, atol=1e-15)
    inf = PowerSpherical(unit(4), torch.tensor(math.inf, dtype=F64))
    assert torch.equal(inf.mean, inf.loc) and torch.equal(inf.variance, torch.zeros(4, dtype=F64))


# ---------------------------------------------------------------------------------- the peer package
@needs_pkg
@pytest.mark.parametrize("d", [2, 3, 5, 10, 64])
def test_matches_the_power_spherical_package(d):
    """log_prob, entropy and KL to the uniform equal De Cao's package to 1e-12 in float64 (its uniform works
    in the default dtype, hence float64 as default here), for kappa up to 40 (above, the package's lgamma
    differences lose kappa * 1e-16: see test_large_concentration_keeps_its_digits)."""
    loc = torch.stack([unit(d, 1), unit(d, 2), unit(d, 3, first=-0.5), unit(d, 4)])
    k = torch.tensor([1e-3, 0.5, 3.0, 40.0], dtype=F64)
    x = PowerSpherical(loc, k).sample((50,), generator=gen(0))
    with default_dtype(F64):
        theirs = ps_pkg.PowerSpherical(loc, k)
        ours = PowerSpherical(loc, k)
        torch.testing.assert_close(ours.log_prob(x), theirs.log_prob(x), rtol=0, atol=1e-12)
        torch.testing.assert_close(ours.entropy(), theirs.entropy(), rtol=0, atol=1e-12)
        for i in range(len(k)):  # (the package's mean broadcasts loc (B, d) against (B,): one row at a time)
            torch.testing.assert_close(ours.mean[i], ps_pkg.PowerSpherical(loc[i], k[i]).mean, rtol=0, atol=1e-15)
        kl_theirs = kl_divergence(theirs, ps_pkg.HypersphericalUniform(d, dtype=F64))
        kl_ours = kl_divergence(ours, HypersphericalUniform(d, dtype=F64))
        torch.testing.assert_close(kl_ours, kl_theirs, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------- KL divergences
@pytest.mark.parametrize("d", [2, 3, 5, 10, 1000])
def test_kl_uniform_vs_mpmath(d):
    """KL(PS || uniform) = -H + log S_{d-1} by quadrature (d <= 10, k >= 1e-4), in relative terms, on both
    sides of the switch at k = d - 1 between the closed form and its integral for small k; for tiny k (and
    d = 1000, where the marginal is too narrow for plain quadrature) the closed form in 60 digits (the
    quadrature's -H + log S would need more than 30 digits to resolve a KL of order k^2)."""
    ks = [0.0, 1e-8, 1e-5, 1e-3, 0.02, 1.0, 30.0, 1e3, (d - 1) * 0.999, (d - 1) * 1.001]
    kl = kl_divergence(PowerSpherical(unit(d), torch.tensor(ks, dtype=F64)), HypersphericalUniform(d, dtype=F64))
    assert kl[0].item() == 0.0
    for i, k in enumerate(ks[1:], 1):
        if k < 1e-4 or d > 10:
            with mpmath.workdps(60):
                b, kk = mpmath.mpf(d - 1) / 2, mpmath.mpf(k)
                a = b + kk
                want = (mpmath.loggamma(a + b) - mpmath.loggamma(a) - mpmath.loggamma(2 * b) + mpmath.loggamma(b)
                        - kk * (mpmath.psi(0, a + b) - mpmath.psi(0, a)))
        else:
            want = -entropy_ref(k, d) + mpmath.log(_sphere_area(d))
        assert abs(kl[i].item() - float(want)) <= 1e-12 * float(want), (d, k, kl[i].item(), float(want))


@pytest.mark.parametrize("d,kq,kp", [(2, 2.0, 1.0), (3, 0.5, 4.0), (5, 20.0, 10.0), (10, 3.0, 0.0)])
def test_kl_vmf_vs_quadrature_and_monte_carlo(d, kq, kp):
    mu_q, mu_p = unit(d, 5), unit(d, 6)
    q, p = PowerSpherical(mu_q, torch.tensor(kq, dtype=F64)), VonMisesFisher(mu_p, torch.tensor(kp, dtype=F64))
    kl = kl_divergence(q, p)
    # independent: -H[q] by quadrature, log C_vmf by mpmath's Bessel function, E_q[mu_p^T x] = E[t] mu_p^T mu_q
    m = moment_ref(kq, d, 1)
    nu = mpmath.mpf(d) / 2 - 1
    if kp == 0:
        log_c_vmf = -mpmath.log(_sphere_area(d))
    else:
        log_c_vmf = nu * mpmath.log(kp) - (mpmath.mpf(d) / 2) * mpmath.log(2 * mpmath.pi) - mpmath.log(
            mpmath.besseli(nu, kp))
    want = -entropy_ref(kq, d) - log_c_vmf - kp * m * float(mu_p @ mu_q)
    assert abs(kl.item() - float(want)) <= 1e-11 * max(1.0, abs(float(want)))
    x = q.sample((40000,), generator=gen(7))
    diff = q.log_prob(x) - p.log_prob(x)
    se = diff.std().item() / math.sqrt(len(diff))
    assert abs(diff.mean().item() - kl.item()) <= Z * se + 1e-12, (diff.mean().item(), kl.item(), se)


@pytest.mark.parametrize("d,k", [(2, 0.7), (3, 5.0), (10, 50.0)])
def test_kl_uniform_monte_carlo(d, k):
    q = PowerSpherical(unit(d, 1), torch.tensor(k, dtype=F64))
    u = HypersphericalUniform(d, dtype=F64)
    x = q.sample((40000,), generator=gen(3))
    diff = q.log_prob(x) - u.log_prob(x)
    se = diff.std().item() / math.sqrt(len(diff))
    assert abs(diff.mean().item() - kl_divergence(q, u).item()) <= Z * se


def test_kl_shapes_and_errors():
    loc = torch.stack([unit(4, 1), unit(4, 2)])
    q = PowerSpherical(loc, torch.tensor([1.0, 5.0], dtype=F64))
    p = VonMisesFisher(unit(4, 3).expand(3, 1, 4), torch.tensor([[2.0], [3.0], [4.0]], dtype=F64))
    kl = kl_divergence(q, p)
    assert kl.shape == (3, 2)
    torch.testing.assert_close(kl[2, 1], kl_divergence(PowerSpherical(loc[1], torch.tensor(5.0, dtype=F64)),
                                                       VonMisesFisher(unit(4, 3), torch.tensor(4.0, dtype=F64))))
    assert kl_divergence(q, HypersphericalUniform(4, batch_shape=(3, 2), dtype=F64)).shape == (3, 2)
    with pytest.raises(ValueError, match="same dimension"):
        kl_divergence(q, HypersphericalUniform(5, dtype=F64))
    with pytest.raises(ValueError, match="same dimension"):
        kl_divergence(q, VonMisesFisher(unit(3), torch.tensor(1.0, dtype=F64)))


# ---------------------------------------------------------------------------------- the sampler
@pytest.mark.parametrize("d,k", [(2, 0.0), (2, 0.3), (3, 1.0), (5, 0.0), (10, 20.0), (64, 500.0), (3, 1e8)])
def test_marginal_goodness_of_fit(d, k):
    """(1 + t)/2 of the samples against SciPy's Beta((d-1)/2 + k, (d-1)/2) CDF (Kolmogorov-Smirnov; for
    k = 1e8 (1 - t)/2 against Beta(beta, alpha), where B itself rounds to 1)."""
    mu = unit(d, 2)
    x = PowerSpherical(mu, torch.tensor(k, dtype=F64)).sample((4000,), generator=gen(11))
    omt = (x - mu).pow(2).sum(-1) / 2  # 1 - t without cancellation
    b = (d - 1) / 2
    p = scipy.stats.kstest((omt / 2).numpy(), scipy.stats.beta(b, b + k).cdf).pvalue
    assert p > 1e-4, (d, k, p)


def test_tangent_direction_is_uniform():
    """d = 3: the azimuth of x around mu is uniform; d = 6: the tangent part's projections are symmetric
    with E[(u.e)^2] = 1/(d-1)."""
    mu = unit(3, 4)
    x = PowerSpherical(mu, torch.tensor(4.0, dtype=F64)).sample((4000,), generator=gen(5))
    e1 = torch.linalg.svd((torch.eye(3, dtype=F64) - torch.outer(mu, mu)))[0][:, :2]
    az = torch.atan2(x @ e1[:, 1], x @ e1[:, 0])
    assert scipy.stats.kstest(((az + math.pi) / (2 * math.pi)).numpy(), "uniform").pvalue > 1e-4
    d, mu = 6, unit(6, 5)
    x = PowerSpherical(mu, torch.tensor(2.0, dtype=F64)).sample((20000,), generator=gen(6))
    tang = x - (x @ mu)[:, None] * mu
    u = tang / tang.norm(dim=-1, keepdim=True)
    c = unit(6, 9)
    c = c - (c @ mu) * mu
    c = c / c.norm()
    proj = u @ c
    assert abs(proj.mean().item()) <= Z * proj.std().item() / math.sqrt(len(proj))
    sq = proj * proj
    assert abs(sq.mean().item() - 1 / (d - 1)) <= Z * sq.std().item() / math.sqrt(len(sq))


@pytest.mark.parametrize("d,k", [(2, 0.5), (3, 5.0), (10, 0.0), (10, 100.0), (100, 30.0)])
def test_sample_moments(d, k):
    """Sample mean and per-coordinate second moments against the closed forms, within Z standard errors."""
    mu = unit(d, 7)
    q = PowerSpherical(mu, torch.tensor(k, dtype=F64))
    x = q.sample((20000,), generator=gen(d))
    n = x.shape[0]
    se = x.std(0) / math.sqrt(n)
    assert ((x.mean(0) - q.mean).abs() <= Z * se + 1e-15).all()
    t = x @ mu
    assert abs(t.mean().item() - q.mean_t.item()) <= Z * t.std().item() / math.sqrt(n)
    sec = (x - q.mean) ** 2
    assert ((sec.mean(0) - q.variance).abs() <= Z * sec.std(0) / math.sqrt(n) + 1e-15).all()


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("k", [0.0, 1e-300, 0.2, 1e3, 1e8, 1e300, math.inf])
def test_samples_are_unit_and_finite(dtype, k):
    d = 7
    locs = torch.stack([unit(d, 1), unit(d, 2, first=1.0), unit(d, 3, first=-1.0), unit(d, 4, first=0.0)]).to(dtype)
    x = PowerSpherical(locs, torch.tensor(k, dtype=dtype)).sample((300,), generator=gen(1))
    assert x.dtype == dtype and torch.isfinite(x).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert ((x.norm(dim=-1) - 1).abs() <= tol).all()
    if k == math.inf:  # the point mass at loc (reflected e_1: loc to rounding)
        torch.testing.assert_close(x, locs.expand_as(x), rtol=0, atol=4 * torch.finfo(dtype).eps)
    for d2 in (2, 3, 1000):  # d = 2 (shape-1/2 Gammas), d = 3, large d
        x = PowerSpherical(unit(d2, 5).to(dtype), torch.tensor(k, dtype=dtype)).sample((50,), generator=gen(2))
        assert torch.isfinite(x).all() and ((x.norm(dim=-1) - 1).abs() <= tol).all()


def test_negative_or_nan_concentration_gives_nan_rows_without_validation():
    loc = torch.stack([unit(4, 1)] * 3)
    k = torch.tensor([-1.0, math.nan, 2.0], dtype=F64)
    x = PowerSpherical(loc, k, validate_args=False).sample((5,), generator=gen(0))
    assert torch.isnan(x[:, :2]).all() and torch.isfinite(x[:, 2]).all()
    q = PowerSpherical(loc, k, validate_args=False)
    assert torch.isnan(q.entropy()[:2]).all() and torch.isnan(q.log_prob(loc)[:2]).all()


def test_reproducible_seeds_generators_and_thread_counts():
    loc = torch.stack([unit(5, 1), unit(5, 2)])
    q = PowerSpherical(loc, torch.tensor([1.0, 30.0], dtype=F64))
    torch.manual_seed(123)
    a = q.sample((64,))
    torch.manual_seed(123)
    b = q.sample((64,))
    assert torch.equal(a, b)
    c = q.sample((64,))
    assert not torch.equal(a, c)
    assert torch.equal(q.sample((64,), generator=gen(9)), q.sample((64,), generator=gen(9)))
    threads = torch.get_num_threads()
    try:
        x1 = lib.power_spherical_sample(loc, q.scale, 3000, seed=77, offset=3)[0]
        torch.set_num_threads(1)
        x2 = lib.power_spherical_sample(loc, q.scale, 3000, seed=77, offset=3)[0]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(x1, x2)
    # the explicit-seed op and the distribution: same streams, same samples
    x3 = power_spherical_sample(loc, q.scale, (4,), generator=gen(5))
    assert torch.equal(x3, q.rsample((4,), generator=gen(5)))


# ---------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("d", [2, 3, 5, 10, 64])
def test_marginal_grad_vs_mpmath(d):
    """dt/dkappa (implicit reparameterisation) against mpmath's derivative of the regularised incomplete beta
    function, at sample quantiles of t from the left tail to the right; relative error <= 1e-7 (the
    quadrature's worst measured over d = 2..3000, kappa = 0..1e6: 3.3e-9)."""
    rows = []
    b = (d - 1) / 2
    for k in [0.0, 1e-3, 0.7, 10.0, 300.0]:
        for q in (0.001, 0.2, 0.5, 0.8, 0.999):
            omt = 2 * scipy.stats.beta(b, b + k).ppf(q)
            rows.append((k, omt))
    omt = torch.tensor([r[1] for r in rows], dtype=F64)
    kap = torch.tensor([r[0] for r in rows], dtype=F64)
    ours = lib.power_spherical_marginal_grad(omt, kap, d)
    for (k, om), o in zip(rows, ours.tolist()):
        exact = dt_dkappa_ref(om, k, d)
        assert math.isfinite(exact) and abs(o - exact) <= 1e-7 * abs(exact), (d, k, om, o, exact)


def test_marginal_grad_sphere3_closed_form():
    """d = 3 takes the closed form -2 B log(B) / alpha (Beta(alpha, 1) has CDF B^alpha): to a few ulp of
    mpmath's derivative of the regularised incomplete beta function, over the whole range of t."""
    rows = [(k, 2 * scipy.stats.beta(1.0, 1.0 + k).ppf(q)) for k in (0.0, 1e-3, 0.7, 10.0, 300.0, 1e6)
            for q in (1e-6, 0.01, 0.3, 0.7, 0.99, 1 - 1e-6)]
    rows = [(k, om) for k, om in rows if 0 < om < 2]
    ours = lib.power_spherical_marginal_grad(torch.tensor([r[1] for r in rows], dtype=F64),
                                             torch.tensor([r[0] for r in rows], dtype=F64), 3)
    for (k, om), o in zip(rows, ours.tolist()):
        exact = dt_dkappa_ref(om, k, 3)
        assert abs(o - exact) <= 1e-14 * abs(exact), (k, om, o, exact)


@pytest.mark.slow
@pytest.mark.parametrize("d", [2, 3, 4, 7, 30, 300, 3000])
def test_marginal_grad_vs_mpmath_extremes(d):
    b = (d - 1) / 2
    for k in [0.0, 1e-6, 0.05, 3.0, 100.0, 1e4, 1e6]:
        omt = torch.tensor([2 * scipy.stats.beta(b, b + k).ppf(q) for q in (1e-6, 5e-4, 0.02, 0.5, 0.98,
                                                                           1 - 5e-4, 1 - 1e-6)], dtype=F64)
        omt = omt[(omt > 0) & (omt < 2)]
        ours = lib.power_spherical_marginal_grad(omt, torch.full_like(omt, k), d)
        for o, om in zip(ours.tolist(), omt.tolist()):
            exact = dt_dkappa_ref(om, k, d)
            assert abs(o - exact) <= 1e-7 * abs(exact), (d, k, om, o, exact)


@settings(max_examples=EXAMPLES, deadline=None)
@given(d=st.integers(2, 5000), k=st.one_of(st.just(0.0), st.floats(1e-12, 1e6)), q=st.floats(1e-3, 1 - 1e-3))
def test_marginal_grad_property_vs_scipy(d, k, q):
    """Generated (d, kappa, quantile): dt/dkappa against a central difference of SciPy's regularised
    incomplete beta function in its first parameter (the tail probability on the smaller side, so that
    the difference keeps its digits), divided by SciPy's Beta density."""
    b = (d - 1) / 2
    a = b + k
    omt = 2 * scipy.stats.beta(b, a).ppf(q)  # 1 - t = 2 (1 - B), 1 - B ~ Beta(beta, alpha)
    ours = lib.power_spherical_marginal_grad(torch.tensor([omt], dtype=F64), torch.tensor([k], dtype=F64), d).item()
    x = 1 - omt / 2
    h = 1e-4 * a / max(b, 1.0) ** 0.5  # small against the scale on which the CDF moves with alpha
    if q < 0.5:  # 1 - B in its lower tail: B in its upper tail, F(B) = 1 - betaincc
        dF = -(scipy.special.betaincc(a + h, b, x) - scipy.special.betaincc(a - h, b, x)) / (2 * h)
    else:
        dF = (scipy.special.betainc(a + h, b, x) - scipy.special.betainc(a - h, b, x)) / (2 * h)
    want = -2 * dF / scipy.stats.beta(a, b).pdf(x)
    assert math.isfinite(ours) and abs(ours - want) <= 1e-5 * abs(want) + 1e-12, (d, k, q, ours, want)


@settings(max_examples=EXAMPLES, deadline=None)
@given(d=st.integers(2, 300), k=st.one_of(st.sampled_from([0.0, 5e-324, 1e-300, 1e300, math.inf]),
                                          st.floats(0.0, 1e12)),
       scale_exp=st.integers(-700, 700), first=st.sampled_from([None, 1.0, -1.0, 0.0]),
       dtype=st.sampled_from([torch.float32, F64]), seed=st.integers(0, 2 ** 40))
def test_sampler_property(d, k, scale_exp, first, dtype, seed):
    """Generated dimension, concentration (0, subnormal, huge, inf), loc scale (2^-700 .. 2^700: the op
    normalises loc) and direction (+-e_1, mu_0 = 0): every sample finite and on the sphere, and the op's
    second output 1 - t equal to |x - mu|^2 / 2."""
    mu = unit(d, 3, first=first)
    loc = (mu * 2.0 ** scale_exp) if dtype == F64 else mu.to(dtype)
    kap = torch.tensor([k], dtype=dtype)
    x, omt = lib.power_spherical_sample(loc.to(dtype)[None], kap, 8, seed=seed, offset=0)
    assert torch.isfinite(x).all() and torch.isfinite(omt).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert ((x.norm(dim=-1) - 1).abs() <= tol).all()
    assert ((omt >= 0) & (omt <= 2)).all()
    half_sq = 0.5 * (x.double() - mu).pow(2).sum(-1)
    assert ((omt.double() - half_sq).abs() <= 8 * tol * (1 + omt.double())).all()


def test_marginal_grad_edges():
    g = lib.power_spherical_marginal_grad(torch.tensor([0.0, 2.0, 1.0, -0.1, 2.1, math.nan, 1.0, 1.0], dtype=F64),
                                          torch.tensor([1.0, 1.0, math.inf, 1.0, 1.0, 1.0, -1.0, math.nan],
                                                       dtype=F64), 4)
    assert g[:3].tolist() == [0.0, 0.0, 0.0] and torch.isnan(g[3:]).all()
    with pytest.raises(RuntimeError, match="dim must be at least 2"):
        lib.power_spherical_marginal_grad(torch.tensor([1.0]), torch.tensor([1.0]), 1)


@pytest.mark.parametrize("d,k", [(2, 0.3), (3, 1.0), (5, 2.0), (16, 50.0), (128, 20.0), (1000, 5e3)])
def test_rsample_gradient_is_unbiased(d, k):
    """mean over samples of d(mu^T x)/dkappa -> dE[t]/dkappa = (d - 1)/(kappa + d - 1)^2, and of
    d(mu^T x)^2/dkappa -> dE[t^2]/dkappa (E[t^2] = 1 - E[1 - t^2] from the covariance), within Z SE over
    independent batches."""
    mu = unit(d, 6)
    per1, per2 = [], []
    for c in range(20):
        kap = torch.tensor(k, dtype=F64, requires_grad=True)
        x = PowerSpherical(mu, kap).rsample((2000,), generator=gen(100 + c))
        t = x @ mu
        g1 = torch.autograd.grad(t.mean(), kap, retain_graph=True)[0]
        g2 = torch.autograd.grad((t * t).mean(), kap)[0]
        per1.append(g1.item())
        per2.append(g2.item())
    kk = torch.tensor(k, dtype=F64, requires_grad=True)
    q = PowerSpherical(mu, kk)
    et2 = q.mean_t ** 2 + (q.covariance_matrix @ mu @ mu)  # E[t^2] = E[t]^2 + Var(t)
    (target2,) = torch.autograd.grad(et2, kk)
    for per, target in ((np.array(per1), (d - 1) / (k + d - 1) ** 2), (np.array(per2), target2.item())):
        se = per.std(ddof=1) / math.sqrt(len(per))
        assert abs(per.mean() - target) <= Z * se, (per.mean(), target, se)


def test_loc_gradient_is_unbiased():
    """d/dloc E[c^T x] = E[t] (I - mu mu^T) c / |loc| through the reflection (loc normalised by the op)."""
    d, k = 6, 3.0
    loc = (2.5 * unit(d, 2)).requires_grad_(True)
    c = unit(d, 8)
    per = []
    for s in range(20):
        x = power_spherical_sample(loc, torch.tensor(k, dtype=F64), (5000,), generator=gen(50 + s))
        per.append(torch.autograd.grad((x @ c).mean(), loc)[0])
    per = torch.stack(per)
    mu = loc.detach() / loc.detach().norm()
    exact = k / (k + d - 1) * (c - (mu @ c) * mu) / loc.detach().norm()
    se = per.std(0) / math.sqrt(len(per))
    assert ((per.mean(0) - exact).abs() <= Z * se + 1e-12).all()


def test_gradcheck_deterministic_parts():
    """float64 gradcheck: the sample as a function of loc with the streams fixed (and its second derivative),
    log_prob in loc / scale / value, entropy, mean, variance, the KLs in both concentrations and directions."""
    loc = torch.stack([unit(5, 1), unit(5, 2, first=-0.9)]).requires_grad_(True)
    kappa = torch.tensor([3.0, 40.0], dtype=F64)

    def f(lc):
        return lib.power_spherical_sample(lc, kappa, 3, seed=11, offset=4)[0]

    assert torch.autograd.gradcheck(f, (loc,))
    assert torch.autograd.gradgradcheck(f, (loc,))
    k = torch.tensor([0.3, 2.0, 15.0, 5e-5], dtype=F64, requires_grad=True)
    mu = torch.stack([unit(4, 1), unit(4, 2), unit(4, 3), unit(4, 4)]).requires_grad_(True)
    x = PowerSpherical(mu.detach(), k.detach()).sample((3,), generator=gen(1)).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda m, kk, xx: PowerSpherical(m, kk, validate_args=False).log_prob(xx),
                                    (mu, k, x))
    assert torch.autograd.gradcheck(lambda kk: PowerSpherical(mu.detach(), kk).entropy(), (k,))
    assert torch.autograd.gradcheck(lambda m, kk: PowerSpherical(m, kk, validate_args=False).mean, (mu, k))
    assert torch.autograd.gradcheck(lambda m, kk: PowerSpherical(m, kk, validate_args=False).variance, (mu, k))
    kp = torch.tensor([1.0, 0.5, 30.0, 2.0], dtype=F64, requires_grad=True)
    mp = torch.stack([unit(4, 5), unit(4, 6), unit(4, 7), unit(4, 8)]).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda kk, m, kq, m2: kl_divergence(PowerSpherical(m2, kq, validate_args=False),
                                            VonMisesFisher(m, kk, validate_args=False)), (kp, mp, k, mu))
    kb = torch.tensor([5e-5, 0.2, 1.99, 2.01, 20.0, 1e4], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda kk: kl_power_spherical_uniform(kk, 3), (kb,))
    # the KL's derivative is k (psi'(alpha) - psi'(alpha + beta)), on both sides of the switch at k = d - 1 = 2
    (g,) = torch.autograd.grad(kl_power_spherical_uniform(kb, 3).sum(), kb)
    for gi, ki in zip(g.tolist(), kb.tolist()):
        want = float(ki * (mpmath.psi(1, 1 + mpmath.mpf(ki)) - mpmath.psi(1, 2 + mpmath.mpf(ki))))
        assert abs(gi - want) <= 1e-13 * want, (ki, gi, want)


def test_double_backward_in_kappa_raises_and_loc_works():
    k = torch.tensor(2.0, dtype=F64, requires_grad=True)
    x = PowerSpherical(unit(4), k).rsample((8,), generator=gen(0))
    with pytest.raises(RuntimeError, match="differentiable only once with respect to the concentration"):
        torch.autograd.grad(x[..., 0].sum(), k, create_graph=True)
    loc = unit(4, 3).requires_grad_(True)
    x = PowerSpherical(loc, torch.tensor(2.0, dtype=F64)).rsample((8,), generator=gen(0))
    (g,) = torch.autograd.grad(x[..., 1].sum(), loc, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), loc)
    assert torch.isfinite(gg).all()
    # the fused first derivative equals the autograd one of the double-backward path
    x = PowerSpherical(loc, torch.tensor(2.0, dtype=F64)).rsample((8,), generator=gen(0))
    (g1,) = torch.autograd.grad(x[..., 1].sum(), loc)
    torch.testing.assert_close(g1, g.detach(), rtol=1e-12, atol=1e-14)


def _backward_parts(gx, go, loc, kap, x, omt):
    """The sampler's backward assembled from separately tested pieces, each summand kept: dL/dt per sample
    row written here with torch ops (x = t mu + sqrt(1 - t^2) u, u fixed), times dt/dkappa from the
    elementwise op (tested against mpmath above), and d/dloc from vmf_sample_backward (the same reflection;
    tested in test_vmf.py against autograd through householder)."""
    mu = loc / loc.norm(dim=-1, keepdim=True)
    t = 1 - omt
    gm, gxx = (gx * mu).sum(-1), (gx * x).sum(-1)
    dl = gm - t * (gxx - t * gm) / (omt * (2 - omt)) - (0 if go is None else go)
    terms = dl * lib.power_spherical_marginal_grad(omt, kap, loc.shape[-1])
    gl, _ = lib.vmf_sample_backward(gx, None, loc, kap, x, omt, True, False)
    return gl, terms


@pytest.mark.parametrize("d", [2, 3, 5, 10, 64])
def test_fused_backward_equals_its_parts(d):
    """power_spherical_sample_backward (the CPU's one pass over sample rows) against the same gradient
    assembled from its parts in float64: d/dkappa to rounding of the sum of |summands|, d/dloc to rounding;
    float32 inputs give the float64 result of the same inputs rounded once (the op works in double)."""
    loc = torch.stack([unit(d, 1), unit(d, 2, first=-0.9), unit(d, 3), unit(d, 4), 3.0 * unit(d, 5)])
    kap = torch.tensor([0.0, 1e-3, 0.7, 10.0, 1e4], dtype=F64)
    x, omt = lib.power_spherical_sample(loc, kap, 40, seed=5, offset=0)
    g = torch.Generator().manual_seed(d)
    gx, go = torch.randn(x.shape, generator=g, dtype=F64), torch.randn(omt.shape, generator=g, dtype=F64)
    for grad_omt in (go, None):
        gl_ref, terms = _backward_parts(gx, grad_omt, loc, kap, x, omt)
        gl, gk = lib.power_spherical_sample_backward(gx, grad_omt, loc, kap, x, omt)
        assert (gk - terms.sum(0)).abs().le(1e-14 * terms.abs().sum(0)).all(), (gk, terms.sum(0))
        torch.testing.assert_close(gl, gl_ref, rtol=1e-13, atol=1e-14)
    # float32: the float64 result of the same (rounded) inputs, rounded once (the op works in double;
    # compared with the op in float64, as the rounded x and 1 - t are no longer exactly consistent).  From
    # d = 8 on, float32 takes 12-node panels: d/dkappa's summands then carry their error bound, 1.1e-8
    # relative (test_float32_marginal_grad_vs_mpmath), besides the rounding.
    args32 = [a.float() for a in (gx, go, loc, kap, x, omt)]
    gl64, gk64 = lib.power_spherical_sample_backward(*[a.double() for a in args32])
    gl, gk = lib.power_spherical_sample_backward(*args32)
    assert gk.dtype == torch.float32 and gl.dtype == torch.float32
    assert torch.equal(gl, gl64.float())
    if d < 8:
        assert torch.equal(gk, gk64.float())
    else:
        _, terms = _backward_parts(*[a.double() for a in args32])
        bound = 2.0 ** -24 * gk64.abs() + 1.1e-8 * terms.abs().sum(0)
        assert (gk.double() - gk64).abs().le(bound).all(), (gk, gk64)
    # what is not asked for is an empty (0,) tensor, and the other output is unchanged
    only_k = lib.power_spherical_sample_backward(gx, go, loc, kap, x, omt, False, True)
    only_l = lib.power_spherical_sample_backward(gx, go, loc, kap, x, omt, True, False)
    both = lib.power_spherical_sample_backward(gx, go, loc, kap, x, omt)
    assert only_k[0].shape == (0,) and only_l[1].shape == (0,)
    assert torch.equal(only_k[1], both[1]) and torch.equal(only_l[0], both[0])


@pytest.mark.parametrize("d", [5, 8, 10, 64, 1000])
def test_float32_marginal_grad_vs_mpmath(d):
    """The fused backward's dt/dkappa in float32 (read off with grad_x = 0 and the gradient of 1 - t = -1,
    so that dL/dt = 1): 12-node panels from d = 8 on, whose error (at most 1.03e-8 relative over a sweep of
    d = 8..3000, kappa = 0..1e8, quantiles 1e-6..1 - 1e-6, documented in power_spherical_cpu.cpp) stays a
    fraction of float32's rounding: within 2^-24 + 1.1e-8 relative of mpmath at the rounded 1 - t (16 nodes
    below d = 8: 2^-24 + 1e-9)."""
    b = (d - 1) / 2
    rows = [(k, 2 * scipy.stats.beta(b, b + k).ppf(q)) for k in (0.0, 0.05, 1.0, 10.0, 30.0, 1e3, 1e6)
            for q in (1e-4, 0.1, 0.4, 0.6, 0.9, 1 - 1e-4)]
    rows = [(k, om) for k, om in rows if 0 < om < 2]
    B = len(rows)
    loc = torch.zeros(B, d)
    loc[:, 0] = 1
    x = loc[None].clone()
    omt = torch.tensor([[om for _, om in rows]], dtype=torch.float32)
    kap = torch.tensor([k for k, _ in rows], dtype=torch.float32)
    _, gk = lib.power_spherical_sample_backward(torch.zeros_like(x), -torch.ones_like(omt), loc, kap, x, omt,
                                                False, True)
    tol = 2.0 ** -24 + (1.1e-8 if d >= 8 else 1e-9)
    for o, om, k in zip(gk.tolist(), omt[0].tolist(), kap.tolist()):
        exact = dt_dkappa_ref(om, k, d)
        assert abs(o - exact) <= tol * abs(exact), (d, k, om, o, exact)


def test_rsample_backward_equals_the_separately_tested_parts():
    """autograd through the sampler (the op power_spherical_sample_backward, on every device) equals the
    gradient assembled from separately tested pieces (_backward_parts)."""
    loc = torch.stack([unit(7, 1), unit(7, 2)]).requires_grad_(True)
    kap = torch.tensor([2.0, 40.0], dtype=F64, requires_grad=True)
    c = unit(7, 9)
    x, omt = lib.power_spherical_sample(loc, kap, 30, seed=3, offset=0)
    gl, gk = torch.autograd.grad(((x @ c) ** 2).sum() + omt.sum(), (loc, kap))
    xd, od, ld, kd = x.detach(), omt.detach(), loc.detach(), kap.detach()
    gx, go = (2 * (xd @ c)).unsqueeze(-1) * c, torch.ones_like(od)
    ref_l, terms = _backward_parts(gx, go, ld, kd, xd, od)
    torch.testing.assert_close(gk, terms.sum(0), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gl, ref_l, rtol=1e-12, atol=1e-14)


def test_opcheck():
    loc = torch.stack([unit(5, 1), unit(5, 2, first=-1.0)])
    kap = torch.tensor([1.0, 30.0], dtype=F64)
    torch.library.opcheck(lib.power_spherical_sample, (loc, kap, 3), {"seed": 123, "offset": 0},
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    torch.library.opcheck(lib.power_spherical_marginal_grad, (torch.tensor([0.1, 1.5], dtype=F64), kap, 5))
    x, omt = lib.power_spherical_sample(loc, kap, 3, seed=1, offset=0)
    for flags in ((True, True), (False, True), (True, False)):
        torch.library.opcheck(lib.power_spherical_sample_backward, (torch.ones_like(x), omt, loc, kap, x, omt, *flags))
    with pytest.raises(RuntimeError, match="power_spherical_sample_backward: grad_x must have the shape of x"):
        lib.power_spherical_sample_backward(x[:2], None, loc, kap, x, omt)
    with pytest.raises(RuntimeError, match="power_spherical_sample_backward: .*dtype"):
        lib.power_spherical_sample_backward(x, None, loc, kap, x, omt.float())


# ---------------------------------------------------------------------------------- API, shapes, errors
def test_shapes_broadcasting_and_expand():
    loc = torch.stack([unit(4, 1), unit(4, 2), unit(4, 3)]).reshape(3, 1, 4)
    k = torch.tensor([0.5, 2.0], dtype=F64)
    q = PowerSpherical(loc, k)
    assert q.batch_shape == (3, 2) and q.event_shape == (4,) and q.dim == 4
    x = q.rsample((5,))
    assert x.shape == (5, 3, 2, 4)
    assert q.log_prob(x).shape == (5, 3, 2) and q.log_prob(x[:, :1]).shape == (5, 3, 2)
    assert q.entropy().shape == (3, 2) and q.mean.shape == (3, 2, 4) and q.variance.shape == (3, 2, 4)
    assert q.covariance_matrix.shape == (3, 2, 4, 4) and q.mode.shape == (3, 2, 4)
    e = q.expand((7, 3, 2))
    assert type(e) is PowerSpherical and e.batch_shape == (7, 3, 2) and e.sample((2,)).shape == (2, 7, 3, 2, 4)
    torch.testing.assert_close(e.log_prob(x.unsqueeze(1)), q.log_prob(x).unsqueeze(1).expand(5, 7, 3, 2), rtol=0,
                               atol=0)
    assert torch.equal(q.concentration, q.scale)
    # the torch.distributions conventions (as tests/test_distributions.py checks for the others)
    assert q.support.event_dim == 1 and bool(q.support.check(x).all())
    assert set(q.arg_constraints) == {"loc", "scale"}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_dtypes(dtype):
    loc, k = unit(6, 1), torch.tensor([0.0, 2.0, 300.0], dtype=F64)
    q64 = PowerSpherical(loc, k)
    q = PowerSpherical(loc.to(dtype), k.to(dtype))
    x = q.rsample((10,), generator=gen(3))
    assert x.dtype == dtype and q.log_prob(x).dtype == dtype and q.entropy().dtype == dtype
    assert q.mean.dtype == dtype and q.variance.dtype == dtype
    rtol = 1e-5 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(q.log_prob(x).double(), q64.log_prob(x.double()), rtol=rtol, atol=rtol)
    torch.testing.assert_close(q.entropy().double(), q64.entropy(), rtol=rtol, atol=rtol)
    kap = k.to(dtype).requires_grad_(True)
    PowerSpherical(loc.to(dtype), kap).rsample((4,), generator=gen(0)).sum().backward()
    assert kap.grad.dtype == dtype and torch.isfinite(kap.grad).all()


def test_bad_inputs_name_the_argument():
    mu = unit(3)
    with pytest.raises(TypeError, match="loc"):
        PowerSpherical(None, 1.0)
    with pytest.raises(TypeError, match="scale"):
        PowerSpherical(mu, "big")
    with pytest.raises(TypeError, match="scale must be real"):
        PowerSpherical(mu, 1.0 + 2.0j)
    with pytest.raises(ValueError, match="dim must be at least 2"):
        PowerSpherical(torch.ones(1, dtype=F64), 1.0)
    with pytest.raises(ValueError, match="incompatible batch shapes"):
        PowerSpherical(torch.stack([mu, mu]), torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="scale must be on the same device as loc"):
        PowerSpherical(mu, torch.ones((), device="meta"))
    with pytest.raises(ValueError, match="parameter loc"):
        PowerSpherical(2 * mu, 1.0, validate_args=True)
    with pytest.raises(ValueError, match="parameter scale"):
        PowerSpherical(mu, -1.0, validate_args=True)
    q = PowerSpherical(mu, 1.0, validate_args=True)
    with pytest.raises(ValueError, match="event shape"):
        q.log_prob(torch.ones(4, dtype=F64))
    with pytest.raises(ValueError, match="support"):
        q.log_prob(torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="scale must have shape"):
        power_spherical_sample(mu, torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="sample_shape"):
        q.sample((-1,))
    with pytest.raises(RuntimeError, match="concentration must have shape"):
        lib.power_spherical_sample(mu[None], torch.ones(2, dtype=F64), 1, seed=1)
    with pytest.raises(RuntimeError, match="same dtype"):
        lib.power_spherical_sample(mu[None], torch.ones(1), 1, seed=1)
    with pytest.raises(RuntimeError, match="offset must be in"):
        lib.power_spherical_sample(mu[None], torch.ones(1, dtype=F64), 1, seed=1, offset=2 ** 48 - 1)
