"""Issue 14: every repro of a hang or a silent wrong value at extreme inputs, as a test.

References are mpmath (tests/reference.py, or the closed forms written out below at 60+
digits), never our own code.  Tolerances are the documented ones (docs/accuracy.md).
The hangs run in a subprocess with a timeout so that a regression fails instead of
stalling the suite.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import mpmath
import pytest
import torch
from mpmath import mp, mpf

from vmfdist import special as S
from torch.distributions import kl_divergence

from vmfdist.distributions import VonMisesFisher, vmf_log_normalizer
from vmfdist.testing import cpu_and_cuda

from . import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DBL_MAX = 1.7976931348623157e308
EPS = 2.0 ** -52


def t(x, device="cpu"):
    return torch.tensor([x], dtype=torch.float64, device=device)


def dz(fn, nu, z, order=1, device="cpu"):
    zt = t(z, device).requires_grad_(True)
    y = fn(t(nu, device), zt).sum()
    for _ in range(order):
        (y,) = torch.autograd.grad(y, zt, create_graph=True)
    return y.item()


def _run_python(code: str, timeout: float = 120.0):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------
# hangs


def test_vmf_sample_invalid_kappa_gives_nan_rows():
    """kappa < 0 never returned (Wood's test NaN forever: -1e10 at d = 2, -1e8, -1e300, and through
    VonMisesFisher(validate_args=False)); NaN or -inf returned loc (d != 3) or uniform samples
    (d = 3).  The op itself returns NaN rows (validation is off under torch.compile); valid rows
    of the same call are untouched.  In a subprocess with a timeout: a hang fails."""
    code = (
        "import torch\n"
        "from vmfdist._ops import lib\n"
        "from vmfdist.distributions import VonMisesFisher\n"
        "for d in (2, 3, 5):\n"
        "    for kappa in (-1e10, -1e8, -1e300, -1.0, -5e-324, float('-inf'), float('nan')):\n"
        "        for dtype in (torch.float64, torch.float32):\n"
        "            if float(torch.tensor(kappa, dtype=dtype)) == 0.0:\n"
        "                continue  # -5e-324 rounds to -0.0 in float32: a valid kappa = 0\n"
        "            loc = torch.zeros(2, d, dtype=dtype); loc[:, 0] = 1\n"
        "            k = torch.tensor([kappa, 2.0], dtype=dtype)\n"
        "            x, omw = lib.vmf_sample(loc, k, 3, seed=0, offset=0)\n"
        "            assert torch.isnan(x[:, 0]).all() and torch.isnan(omw[:, 0]).all(), (d, kappa, x)\n"
        "            assert torch.isfinite(x[:, 1]).all(), (d, kappa, x)\n"
        "            assert ((x[:, 1].double().norm(dim=-1) - 1).abs() < 1e-6).all()\n"
        "            y = VonMisesFisher(loc[0], torch.tensor(kappa, dtype=dtype), validate_args=False).rsample((4,))\n"
        "            assert torch.isnan(y).all(), (d, kappa, y)\n"
        "print('ok')\n"
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("loc", [[1e300, 1e300, 0.0, 0.0], [1e-200, 0.0, 0.0, 0.0], [5e-324, 0.0, 0.0, 5e-324],
                                 [DBL_MAX, -DBL_MAX, DBL_MAX, 0.0], [0.0, 3e-320, 0.0, 4e-320]])
def test_vmf_sample_badly_scaled_loc_is_normalised(loc, device):
    """loc = [1e300, 1e300, 0, 0] gave non-unit samples, [1e-200, 0, ...] NaN.  The samples
    must be those of loc / |loc| (computed here by mpmath-free exact scaling in Python)."""
    raw = torch.tensor([loc], dtype=torch.float64, device=device)
    k = torch.tensor([5.0], dtype=torch.float64, device=device)
    x, omw = torch.ops.vmfdist.vmf_sample(raw, k, 64, seed=7, offset=0)
    assert torch.isfinite(x).all()
    assert torch.allclose(x.norm(dim=-1), torch.ones(64, 1, dtype=torch.float64, device=device), atol=1e-14)
    # the same draws as from the unit vector (a power-of-two scaling is exact, the unit
    # vector computed in mpmath)
    with mp.workdps(50):
        n = mpmath.sqrt(sum(mpf(v) ** 2 for v in loc))
        unit = [float(mpf(v) / n) for v in loc]
    xu, omwu = torch.ops.vmfdist.vmf_sample(torch.tensor([unit], dtype=torch.float64, device=device), k, 64, seed=7, offset=0)
    assert torch.equal(omw, omwu)
    assert torch.allclose(x, xu, rtol=0, atol=4e-16)
    # the mean direction: E[x] = A_d(kappa) mu; 64 samples, tolerance 6 standard errors
    mean = x.mean(0)[0].cpu()
    assert torch.allclose(mean, torch.tensor(unit, dtype=torch.float64) * S.bessel_iv_ratio(2.0, 5.0).item(),
                          atol=6 * 0.5 / 8)


def test_log_bessel_iv_series_order_limit_returns_nan_quickly():
    """log_bessel_iv_series(1e300, 1) never returned (nu = 1e9 took minutes; from 2^53 the loop
    counter stalls): NaN past the documented limit 2^20."""
    code = (
        "import torch\n"
        "from vmfdist import special as S\n"
        "nu = torch.tensor([1e300, 1e9, 2.0**53, 2.0**20 + 0.5, float('inf')], dtype=torch.float64)\n"
        "out = S.log_bessel_iv_series(nu, torch.ones_like(nu))\n"
        "assert torch.isnan(out).all(), out\n"
        "v = S.log_bessel_iv_series(torch.tensor([2.0**20], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))\n"
        "assert torch.isfinite(v).all(), v\n"
        "print('ok')\n"
    )
    proc = _run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---------------------------------------------------------------------------
# the papers' eq. (45) at small z: underflow


def _series_mp(nu, z):
    """eq. (45) at 60 digits: log I_{nu - n}(z) + sum_j log((B_2 + B_0)/2 at order nu - j)."""
    with mp.workdps(60):
        nm, zm = mpf(nu), mpf(z)
        n = math.floor(nu)
        parts = [ref.log_iv(nu - n, z)] + [mpmath.log((ref.bound5(nm - j, zm, 2) + ref.bound5(nm - j, zm, 0)) / 2)
                                            for j in range(n)]
        return sum(parts), sum(abs(p) for p in parts), n


@pytest.mark.parametrize("nu,z", [(143.0, 1.5446e-118), (55.089, 1e-159), (40.5, 5e-324), (300.0, 1e-300),
                                  (12.0, 1e-200), (3.25, 2.0 ** -950)])
def test_log_bessel_iv_series_small_z(nu, z):
    """(143, 1.5446e-118) gave -inf (true -39460.85), (55.089, 1e-159) -20375.576 (true -20375.543)."""
    ours = S.log_bessel_iv_series(t(nu), t(z)).item()
    r, scale, n = _series_mp(nu, z)
    assert abs(mpf(ours) - r) <= EPS * (4 * scale + 8 * n + 4), (ours, mpmath.nstr(r, 20))


def test_log_bessel_iv_series_backward_is_a_clear_error():
    z = t(1.0).requires_grad_(True)
    with pytest.raises(RuntimeError, match="log_bessel_iv_series is not differentiable"):
        S.log_bessel_iv_series(t(2.5), z).backward()
    with pytest.raises(RuntimeError, match="log_bessel_iv_series is not differentiable"):
        torch.autograd.grad(S.log_bessel_iv_series(t(2.5), z).sum(), z)


# ---------------------------------------------------------------------------
# orders comparable to huge arguments; overflow near DBL_MAX


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("nu,z", [(1e308, 1e305), (2e301, 2e301), (1e308, 1.0), (1e305, 1e308), (DBL_MAX, DBL_MAX),
                                  (0.75, 1e305), (5.0, 2.0 ** 1001), (2.0 ** 1000, 3.0), (1e303, 1e-300),
                                  (1e300, 5e-324)])
def test_ratio_huge(nu, z, device):
    """ratio(1e308, 1e305) was -999 (true 5.0e-4), (2e301, 2e301) 0 (true 0.41421), (1e308, 1) NaN."""
    ours = S.bessel_iv_ratio(t(nu, device), t(z, device)).item()
    assert ref.ulp_error(ours, ref.ratio(nu, z)) <= 4.0
    ours_c = S.bessel_iv_ratio_c(t(nu, device), t(z, device)).item()
    assert ref.ulp_error(ours_c, ref.ratio_c(nu, z)) <= 10.0
    g = dz(S.bessel_iv_ratio, nu, z, device=device)
    assert ref.ulp_error(g, ref.dratio(nu, z)) <= 10.0


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("nu,z", [(1e305, 1e305), (1e308, 1e308), (1e180, 1.0), (1e154, 1e300), (3e307, 1.0),
                                  (2.0 ** 500, 2.0 ** 1000), (1e200, 1e280), (0.0, 1e305), (7.5, DBL_MAX),
                                  (DBL_MAX, 2.0)])
def test_log_iv_grad_huge(nu, z, device):
    """d/dz log_bessel_iv at (1e305, 1e305) was 2.0 (true 1.41421); d/dz log_bessel_ive was -inf
    for nu >~ 1e154 (1e180 at nu = 1e180, z = 1)."""
    g = dz(S.log_bessel_iv, nu, z, device=device)
    r = ref.dlog_iv(nu, z)
    assert (math.isinf(g) and r > DBL_MAX) or ref.ulp_error(g, r) <= 10.0, (g, mpmath.nstr(r, 17))
    gs = dz(S.log_bessel_ive, nu, z, device=device)
    rs = ref.dlog_ive(nu, z)
    assert (math.isinf(gs) and rs > DBL_MAX) or ref.ulp_error(gs, rs) <= 10.0, (gs, mpmath.nstr(rs, 17))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("nu,z", [(1e308, 1e308), (DBL_MAX, DBL_MAX), (DBL_MAX, 1e300), (1e300, DBL_MAX),
                                  (2e307, 1e-45), (1e308, 1e-300), (1.5e308, 1e308), (50.0, DBL_MAX),
                                  (3.196670515523576e147, 2.247116418577895e307), (1e20, 1e53), (1e140, 1e300)])
def test_log_iv_huge(nu, z, device):
    """log_bessel_iv(1e308, 1e308) was NaN (true 5.328e307), (2e307, 1e-45) NaN (true -inf);
    log_bessel_ive(3.2e147, 2.2e307) 5.9 eps off (arsinh(nu/z) lost below the double-double
    precision; found by the fuzz test)."""
    for fn, reff in ((S.log_bessel_iv, ref.log_iv), (S.log_bessel_ive, ref.log_ive)):
        ours = fn(t(nu, device), t(z, device)).item()
        r = reff(nu, z)
        if abs(r) > DBL_MAX:
            assert math.isinf(ours) and (ours > 0) == (r > 0), (ours, mpmath.nstr(r, 17))
        else:
            assert ref.log_error(ours, r) <= 4.0, (ours, mpmath.nstr(r, 17))


def _bounds_mp(nu, z, theorem, dps=60):
    with mp.workdps(dps):
        return _bounds_mp_at(nu, mpf(z), theorem)


def _bounds_mp_at(nu, zm, theorem):
    """The bounds' formulas at the current mpmath precision, z an mpf."""
    nm = mpf(nu)
    if theorem == 5:
        return ref.bound5(nm, zm, 2), ref.bound5(nm, zm, 0)
    c = [mpf(1) / 2, mpf(1)]
    return tuple(zm / (nm - ci + mpmath.sqrt((nm + ci) ** 2 + zm * zm)) for ci in c)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("nu,z", [(1e308, 1e308), (DBL_MAX, DBL_MAX), (1e308, 1.0), (3.0, DBL_MAX), (2e307, 1e-45)])
@pytest.mark.parametrize("theorem", [4, 5])
def test_bounds_and_approx_huge(nu, z, theorem, device):
    """Bounds and approximation were 0 at (1e308, 1e308)."""
    lo, hi = S.bessel_iv_ratio_bounds(t(nu, device), t(z, device), theorem=theorem)
    rlo, rhi = _bounds_mp(nu, z, theorem)
    assert ref.ulp_error(lo.item(), rlo) <= 4.0 and ref.ulp_error(hi.item(), rhi) <= 4.0
    if theorem == 5:
        ap = S.bessel_iv_ratio_approx(t(nu, device), t(z, device)).item()
        assert ref.ulp_error(ap, (rlo + rhi) / 2) <= 4.0


@pytest.mark.parametrize("nu,z", [(0.5, 5e-324), (0.25, 1e-320), (0.0, 5e-324), (0.999, 3e-323), (1e-300, 5e-324)])
def test_bounds_theorem4_subnormal_z(nu, z):
    """Theorem 4 below nu = c with z subnormal: z / (4 c nu) alone rounded to 0 (the upper bound
    was 0, below the lower, at nu = 1/2, z = 5e-324; found by the fuzz test)."""
    lo, hi = S.bessel_iv_ratio_bounds(t(nu), t(z), theorem=4)
    rlo, rhi = _bounds_mp(nu, z, 4, dps=1500)  # (nu - c) + sqrt((nu + c)^2 + z^2) cancels to z^2
    for ours, r in ((lo.item(), rlo), (hi.item(), rhi)):
        if abs(r) > DBL_MAX:
            assert ours == math.inf
        else:
            assert ref.ulp_error(ours, r) <= 4.0, (ours, mpmath.nstr(r, 17))


@pytest.mark.parametrize("theorem", [4, 5])
def test_bound_derivatives_huge(theorem):
    """d/dz of the bounds was inf/NaN from nu ~ 1e154 on (theorem 4: (nu + c)^2 overflowed) and 0 at
    nu = 1e308 (theorem 5): against mpmath.diff of the formulas (800 digits)."""
    nus, zs = [0.5, 3.0, 1e160, 1e200, 1e308, DBL_MAX], [1e139, 1e200, 1e300, DBL_MAX]
    bad = []
    for nu in nus:
        zt = torch.tensor(zs, dtype=torch.float64).requires_grad_()
        lo, hi = S.bessel_iv_ratio_bounds(torch.full((len(zs),), nu, dtype=torch.float64), zt, theorem=theorem)
        (g_lo,) = torch.autograd.grad(lo.sum(), zt, retain_graph=True)
        (g_hi,) = torch.autograd.grad(hi.sum(), zt)
        for k, g in ((0, g_lo), (1, g_hi)):
            for z, ours in zip(zs, g.tolist()):
                with mp.workdps(800):
                    exact = mpmath.diff(lambda x: _bounds_mp_at(nu, x, theorem)[k], mpf(z))
                if not ref.ulp_error(ours, exact) <= 8:
                    bad.append((k, nu, z, ours, mpmath.nstr(exact, 12)))
    assert not bad, bad


def test_bounds_and_approx_minus_inf_order_is_nan():
    for theorem in (4, 5):
        lo, hi = S.bessel_iv_ratio_bounds(t(float("-inf")), t(1.0), theorem=theorem)
        assert math.isnan(lo.item()) and math.isnan(hi.item())
    assert math.isnan(S.bessel_iv_ratio_approx(t(float("-inf")), t(1.0)).item())
    assert S.bessel_iv_ratio_bounds(t(float("inf")), t(1.0))[0].item() == 0.0  # +inf: the documented 0


def test_log_iv_asymptotic_limits():
    assert S.log_bessel_iv_asymptotic(t(1.5), t(float("inf"))).item() == math.inf
    assert S.log_bessel_iv_asymptotic(t(float("inf")), t(3.0)).item() == -math.inf
    assert math.isnan(S.log_bessel_iv_asymptotic(t(float("inf")), t(float("inf"))).item())
    # beyond nu = 2^1000 (lgamma and nu log z overflow separately): mpmath of eq. (44)
    for nu, z in ((1e305, 1e304), (1e308, 1e300), (2.0 ** 1001, 2.0 ** 1000)):
        ours = S.log_bessel_iv_asymptotic(t(nu), t(z)).item()
        with mp.workdps(80):
            nm, zm = mpf(nu), mpf(z)
            eta = (nm + mpf(1) / 2) / (2 * (nm + 1))
            r = nm * mpmath.log(zm) + eta * zm - (eta + nm) * mpmath.log(2) - mpmath.loggamma(nm + 1)
            scale = max(abs(nm * mpmath.log(zm)), abs(mpmath.loggamma(nm + 1)))
        if abs(r) > DBL_MAX:
            assert math.isinf(ours) and (ours > 0) == (r > 0)
        else:  # the formula's terms nu log z and log Gamma(nu + 1) carry 8 eps of their size
            assert abs(mpf(ours) - r) <= 8 * EPS * scale, (ours, mpmath.nstr(r, 17))


# ---------------------------------------------------------------------------
# second derivatives


def _ratio_d2_mp(nu, z):
    """R'' = -2 R R' - (2nu - 1)(R'/z - R/z^2) with R' = 1 - R^2 - (2nu - 1) R / z, at a
    precision that survives the cancellation (z^2/nu relative at small z, nu/z at large z,
    e^-2z at nu = 1/2)."""
    digits = (60 + int(max(0, -2 * math.log10(z))) + 2 * int(math.log10(nu + 2)) + 2 * int(max(0, math.log10(z)))
              + (int(z) if nu == 0.5 else 0))
    with mp.workdps(digits):
        nm, zm = mpf(nu), mpf(z)
        im1 = mpmath.besseli(1, zm) if nm == 0 else mpmath.besseli(nm - 1, zm)  # I_{-1} = I_1
        r = mpmath.besseli(nm, zm) / im1
        d1 = 1 - r * r - (2 * nm - 1) * r / zm
        return -2 * r * d1 - (2 * nm - 1) * (d1 / zm - r / zm ** 2)


@pytest.mark.parametrize("nu,z", [(125.0, 1e-5), (63.0, 1.4e-26), (1.5, 1e-100), (30.0, 2.0), (2.5, 1e6),
                                  (1000.5, 10.0), (0.75, 3.0), (0.5, 100.0), (0.5 + 2.0 ** -40, 7.0), (1.0, 30.0),
                                  (1e5, 1e4), (10.0, 1e30), (2.0 ** 1001, 3.0)])
def test_ratio_second_derivative(nu, z):
    """d2R/dz2 cancelled for z << nu: (125, 1e-5) gave +5.5e-12 (true -3.8e-12), (63, 1.4e-26) 8.4e9.
    Now its own kernel (second-order duals through Perron's fraction): 16 ulp (measured <= 10.3
    on the grid of the report), for nu >= 1/2."""
    ours = dz(S.bessel_iv_ratio, nu, z, order=2)
    r = _ratio_d2_mp(nu, z)
    assert ref.ulp_error(ours, r) <= 16.0, (ours, mpmath.nstr(r, 17))


@pytest.mark.parametrize("nu,z", [(0.0, 1e-200), (0.0, 1e-10), (3.0, 1e-200), (0.0, 5e-324)])
def test_log_iv_second_derivative_small_z(nu, z):
    """d2/dz2 log_bessel_iv at (0, 1e-200) was NaN (true 0.5): R'_{nu+1} - nu/z^2, at 60 digits."""
    with mp.workdps(60 + int(-2 * math.log10(z))):
        nm, zm = mpf(nu) + 1, mpf(z)
        r = mpmath.besseli(nm, zm) / mpmath.besseli(nm - 1, zm)
        d1 = 1 - r * r - (2 * nm - 1) * r / zm
        expect = d1 - mpf(nu) / zm ** 2
    for fn in (S.log_bessel_iv, S.log_bessel_ive):
        ours = dz(fn, nu, z, order=2)
        if abs(expect) > DBL_MAX:
            assert ours == -math.inf
        else:
            assert ref.ulp_error(ours, expect) <= 10.0, (ours, mpmath.nstr(expect, 17))


# ---------------------------------------------------------------------------
# the ratio below order 1/2 (issue 12)


@pytest.mark.parametrize("nu", [0.0, 5e-324, 1e-300, 1e-8, 0.1, 0.25, 0.49, 0.5 - 2.0 ** -54])
@pytest.mark.parametrize("z", [5e-324, 1e-300, 1e-8, 0.3, 1.0, 7.0, 60.0, 1e4, 1e12, 1e305])
def test_ratio_below_one_half(nu, z):
    """R_nu = I_nu / I_{nu-1} for 0 <= nu < 1/2 (defined there; NaN before), vs mpmath."""
    ours = S.bessel_iv_ratio(t(nu), t(z)).item()
    r = ref.ratio_low(nu, z)
    if abs(r) > DBL_MAX:
        assert ours == math.inf
    else:
        assert ref.ulp_error(ours, r) <= 8.0, (ours, mpmath.nstr(r, 17))


@pytest.mark.parametrize("nu,z", [(0.0, 1.0), (0.25, 0.5), (0.1, 30.0), (0.4, 1e-3), (1e-8, 1e-6), (0.0, 1e-100)])
def test_ratio_below_one_half_derivative(nu, z):
    """dR/dz and d2R/dz2 below 1/2 against the Riccati equation R' = 1 - R^2 - (2nu - 1) R / z
    (and its derivative) with R from mpmath's besseli at 120 digits.  Tolerance 10 ulp, or 10 ulp
    of the larger of our two summands near the maximum of R (where R' has a true zero)."""
    ours = dz(S.bessel_iv_ratio, nu, z)
    ours2 = dz(S.bessel_iv_ratio, nu, z, order=2)
    with mp.workdps(120):
        nm, zm = mpf(nu), mpf(z)
        im1 = mpmath.besseli(1, zm) if nm == 0 else mpmath.besseli(nm - 1, zm)  # I_{-1} = I_1
        r = mpmath.besseli(nm, zm) / im1
        d1 = 1 - r * r - (2 * nm - 1) * r / zm
        d2 = -2 * r * d1 - (2 * nm - 1) * (d1 / zm - r / zm ** 2)
        r1 = mpmath.besseli(nm + 1, zm) / mpmath.besseli(nm, zm)
        scale = r * r * (abs(2 * nm / zm ** 2) + abs(1 - r1 * r1 - (2 * nm + 1) * r1 / zm))
    assert abs(mpf(ours) - d1) <= 10 * max(ref.ulp(float(d1)), ref.ulp(float(scale))), (ours, mpmath.nstr(d1, 17))
    # R' and R'' below 1/2 come from order nu + 1, which forms nu - 1/2 as 2nu - (nu + 1/2) for large z:
    # a loss of up to (1 + 4nu)/(1 - 2nu) (docs/special.md); 16 ulp times that
    if abs(d2) > DBL_MAX:
        assert ours2 == math.inf
    else:
        assert ref.ulp_error(ours2, d2) <= 16.0 * (1 + 4 * nu) / (1 - 2 * nu), (ours2, mpmath.nstr(d2, 17))


def test_ratio_below_one_half_conventions():
    assert S.bessel_iv_ratio(t(0.0), t(0.0)).item() == math.inf
    assert S.bessel_iv_ratio(t(0.25), t(0.0)).item() == 0.0
    assert S.bessel_iv_ratio(t(0.25), t(float("inf"))).item() == 1.0
    assert math.isnan(S.bessel_iv_ratio_c(t(0.25), t(1.0)).item())  # the complement stays nu >= 1/2


# ---------------------------------------------------------------------------
# vMF log-normaliser and KL


def test_vmf_log_normalizer_negative_is_nan():
    for k in (-1.0, -5e-324, float("-inf"), float("nan")):
        for scaled in (False, True):
            assert math.isnan(vmf_log_normalizer(t(k), 3, scaled=scaled).item())


@pytest.mark.parametrize("d", [2, 3, 256])
@pytest.mark.parametrize("kappa", [5e-324, 1e-300, 1e-10, 2.0 ** -21, 2.0 ** -19, 1e-3])
def test_vmf_log_normalizer_small_kappa(d, kappa):
    """log C_d(kappa) + kappa at small kappa vs mpmath (it cancelled terms of size nu |log kappa|)."""
    ours = vmf_log_normalizer(t(kappa), d, scaled=True).item()
    with mp.workdps(80):
        nu = mpf(d) / 2 - 1
        k = mpf(kappa)
        r = nu * mpmath.log(k) - mpf(d) / 2 * mpmath.log(2 * mpmath.pi) - mpmath.log(mpmath.besseli(nu, k)) + k
    assert abs(mpf(ours) - r) <= 4 * EPS * max(1, abs(r)), (ours, mpmath.nstr(r, 17))


def test_kl_vmf_tiny_kappa_against_uniform_limit():
    """KL(vMF(5e-324) || vMF(0)) at d = 256 was 2.1e-11; the exact value is ~kappa^2/(2d) = 0 in double."""
    loc = torch.zeros(256, dtype=torch.float64)
    loc[0] = 1.0
    kl = kl_divergence(VonMisesFisher(loc, t(5e-324)[0]), VonMisesFisher(loc, t(0.0)[0])).item()
    assert abs(kl) <= 1e-300
