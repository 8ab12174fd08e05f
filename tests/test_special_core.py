"""Core checks of vmfdist.special on a fixed grid against the mpmath references.

This file pins the regimes (series, Hankel, Olver, turning point, extremes) on a
fixed grid of (nu, z), and the bounds on a fixed grid.  The hypothesis sweep over
the whole domain, float32, the conventions, autograd, opcheck, broadcasting and
argument errors are in test_special.py; checks of the references themselves in
test_reference.py.
"""
import pytest
import torch

from vmfdist import special

from . import reference as ref

F64 = torch.float64
NU = [0.0, 0.3, 1.0, 2.5, 7.9, 11.9, 12.0, 15.0, 19.9, 20.0, 64.0, 127.0, 1e3, 1e5, 1e6]
Z = [1e-300, 1e-20, 1e-3, 0.5, 3.0, 12.0, 24.9, 26.0, 49.0, 60.0, 400.0, 1e4, 1e8, 1e300]


def _t(x, dtype=F64, device="cpu"):
    return torch.tensor(x, dtype=dtype, device=device)


@pytest.mark.parametrize("nu", NU)
def test_log_bessel_iv_grid(nu):
    zs = Z + [0.6627 * nu, nu, 2 * nu] if nu > 0 else Z
    for z in zs:
        r = ref.log_iv(nu, z)
        ours = special.log_bessel_iv(_t(nu), _t(z)).item()
        assert ref.log_error(ours, r) <= 4, (nu, z, ours, r)
        ours_e = special.log_bessel_ive(_t(nu), _t(z)).item()
        assert ref.log_error(ours_e, ref.log_ive(nu, z)) <= 4, (nu, z, ours_e)


@pytest.mark.parametrize("nu", [0.5, 0.5000001, 0.75, 1.0, 1.5, 5.0, 64.0, 1e3, 1e6])
def test_ratio_and_complement_grid(nu):
    # tiny z: R = z / (2 nu) (1 + O(z^2)), a closed form exact in float64
    tiny = special.bessel_iv_ratio(_t(nu), _t(1e-300)).item()
    assert abs(tiny - 1e-300 / (2 * nu)) <= 2**-52 * tiny
    for z in [1e-5, 0.1, 1.0, 3.0, 30.0, 1e3, 1e6, 1e300]:
        r = ref.ratio(nu, z)
        assert ref.ulp_error(special.bessel_iv_ratio(_t(nu), _t(z)).item(), r) <= 4, (nu, z)
        c = ref.ratio_c(nu, z)
        if c != 0:
            assert ref.ulp_error(special.bessel_iv_ratio_c(_t(nu), _t(z)).item(), c) <= 10, (nu, z)


@pytest.mark.parametrize("nu", [0.0, 0.75, 1.0, 5.0, 30.0, 1e3])
def test_gradients_against_reference(nu):
    for z in [1e-3, 0.7, 4.0, 40.0, 2e3]:
        zt = _t(z).requires_grad_()
        (g,) = torch.autograd.grad(special.log_bessel_iv(nu, zt), zt)
        assert ref.ulp_error(g.item(), ref.dlog_iv(nu, z)) <= 10
        zt = _t(z).requires_grad_()
        (g,) = torch.autograd.grad(special.log_bessel_ive(nu, zt), zt)
        assert ref.ulp_error(g.item(), ref.dlog_ive(nu, z)) <= 10, (nu, z)
        if nu >= 0.5:
            zt = _t(z).requires_grad_()
            (g,) = torch.autograd.grad(special.bessel_iv_ratio(nu, zt), zt)
            assert ref.ulp_error(g.item(), ref.dratio(nu, z)) <= 10, (nu, z)


def test_extreme_order_tiny_argument():
    v = special.log_bessel_iv(_t(1e6), _t(1e-300)).item()
    assert abs(v - float(ref.log_iv(1e6, 1e-300))) <= 4 * 2**-52 * abs(v)
    assert -7.05e8 < v < -7.03e8


@pytest.mark.parametrize("theorem", [4, 5])
def test_bounds_bracket_and_gradcheck(theorem):
    nu = torch.tensor([0.5, 1.0, 3.0, 40.0, 1e4], dtype=F64)[:, None]
    z = torch.logspace(-4, 6, 61, dtype=F64)[None, :]
    lo, hi = special.bessel_iv_ratio_bounds(nu, z, theorem=theorem)
    exact = special.bessel_iv_ratio(nu, z)
    slack = 4 * 2**-53
    assert bool((lo <= exact * (1 + slack)).all()) and bool((exact <= hi * (1 + slack)).all())
    zz = _t([0.3, 2.0, 90.0]).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: special.bessel_iv_ratio_bounds(_t([1.0, 2.0, 9.0]), x, theorem), (zz,))


def _bound_formula(nu, z, theorem, which):
    """The bound as a function of an mpf z, evaluated in mpmath (for mpmath.diff)."""
    import mpmath
    from mpmath import mpf

    nu = mpf(nu)
    if theorem == 4:
        c = mpf(1) / 2 if which == "lower" else mpf(1)
        return z / ((nu - c) + mpmath.sqrt((nu + c) ** 2 + z * z))
    lam = nu + (mpf(2 if which == "lower" else 0) - 1) / 2
    delta = (nu - mpf(1) / 2) + lam / (2 * mpmath.sqrt(lam * lam + z * z))
    return z / (delta + mpmath.sqrt(delta * delta + z * z))


@pytest.mark.parametrize("theorem", [4, 5])
def test_bound_derivatives_vs_formula(theorem):
    """d/dz of the bounds (also used by bessel_iv_ratio_approx) against mpmath.diff of the
    formulas: they used to cancel for z >> nu (theorem 5: 0 instead of 1e-24 at nu = 1/2,
    z = 1e8) and near nu = 0 for small z (theorem 4: NaN at nu = 0, z = 1e-9)."""
    import mpmath
    from mpmath import mp, mpf

    nus = [0.5, 0.75, 1.0, 3.0, 100.0, 1e4] + ([0.0, 1e-8, 0.25, 0.999] if theorem == 4 else [])
    zs = [1e-300, 1e-9, 1e-5, 0.3, 0.999, 1.0, 1.5, 7.0, 1e4, 1e8, 1e150, 1e300]
    bad = []
    for nu in nus:
        zt = _t(zs).requires_grad_()
        lo, hi = special.bessel_iv_ratio_bounds(_t([nu] * len(zs)), zt, theorem=theorem)
        (g_lo,) = torch.autograd.grad(lo.sum(), zt, retain_graph=True)
        (g_hi,) = torch.autograd.grad(hi.sum(), zt)
        for which, g in (("lower", g_lo), ("upper", g_hi)):
            for z, ours in zip(zs, g.tolist()):
                with mp.workdps(1500):
                    exact = mpmath.diff(lambda t: _bound_formula(nu, t, theorem, which), mpf(z))
                    if abs(exact) > mpf(1.7976931348623157e308):  # -1/z^2-like at nu = 0: overflows
                        ok = ours == -float("inf")
                    else:
                        ok = ref.ulp_error(ours, exact) <= 8
                if not ok:
                    bad.append((which, nu, z, ours, mpmath.nstr(exact, 17)))
    assert not bad, bad


def test_bounds_gradcheck_below_half():
    """Theorem 4 below nu = 1/2 (the rearranged formulas), first and second derivatives."""
    nu = _t([0.0, 1e-3, 0.25, 0.75])
    z = _t([1e-3, 0.2, 0.9, 3.0]).requires_grad_()
    for k in (0, 1):
        f = lambda x: special.bessel_iv_ratio_bounds(nu, x, 4)[k]  # noqa: E731
        assert torch.autograd.gradcheck(f, (z,))
        assert torch.autograd.gradgradcheck(f, (z,))
