"""Tests of vmfdist.special against the mpmath references in tests/reference.py.

Targets (float64, vs references certified to 40 digits):
  bessel_iv_ratio <= 4 ulp, bessel_iv_ratio_c <= 10 ulp,
  log_bessel_iv / log_bessel_ive: |error| <= 4 eps max(1, |log I|)  (eps = 2^-52),
  derivatives w.r.t. z <= 10 ulp, float32 <= 2 float32-ulp of the correctly rounded value,
  bounds bracket the exact ratio within 2 ulp.
A failing assertion here means the implementation misses its target: do not loosen.
"""
from __future__ import annotations

import glob
import math
import os
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from . import reference as ref
from vmfdist import special as S
from vmfdist.testing import cpu_and_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DBL_MAX = 1.7976931348623157e308
DBL_TRUE_MIN = 5e-324
DBL_MIN = 2.2250738585072014e-308
F32_MAX = float(np.finfo(np.float32).max)

TOL_RATIO = 4.0  # ulp
TOL_RATIO_C = 10.0  # ulp
TOL_LOG = 4.0  # eps max(1, |log I|)
TOL_GRAD = 10.0  # ulp
TOL_F32 = 2.0  # float32 ulp

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
N_EXAMPLES = int(os.environ.get("VMFDIST_HYPOTHESIS_EXAMPLES", "120"))


# ---------------------------------------------------------------------------
# strategies over the whole domain


def log_uniform(lo: float, hi: float, width: int = 64):
    def to_float(e):
        # 10.0 ** e raises OverflowError just below log10(DBL_MAX) (e is rounded up); a
        # product overflows to inf instead, which the clamp below maps back into range
        x = min(hi, 10.0 ** min(e, 300.0) * 10.0 ** max(e - 300.0, 0.0))
        return float(np.float32(x)) if width == 32 else x

    return st.floats(math.log10(lo), math.log10(hi)).map(to_float).filter(lambda x: lo <= x <= hi and x > 0)


SPECIAL_NU = [0.0, 5e-324, 1e-300, 1e-8, 0.5, 0.5 + 2**-52, 0.75, 1.0, 1.5, 2.0, 2.5, 7.999, 8.0, 11.999, 12.0,
              19.999, 20.0, 29.5, 30.0, 49.5, 50.0, 100.0, 1000.5, 1e5, 999999.5, 1e6]


def nu_strategy(lo: float):
    special = st.sampled_from([x for x in SPECIAL_NU if x >= lo])
    return st.one_of(
        special,
        log_uniform(max(lo, 1e-300), 1e6) if lo > 0 else st.one_of(log_uniform(1e-300, 1e6), st.just(0.0)),
        st.floats(max(lo, 0.0), 60.0),
        st.integers(max(1, int(2 * lo)), 2000).map(lambda k: k / 2),
    )


SPECIAL_Z = [DBL_TRUE_MIN, 1e-320, DBL_MIN, 1e-300, 1e-100, 1e-10, 1e-3, 0.5, 1.0, 2.0, 10.0, 20.0, 25.0, 25.0001,
             50.0, 50.0001, 100.0, 1e3, 1e4, 1e8, 1e15, 1e100, 1e300, DBL_MAX]


@st.composite
def nu_z(draw, lo: float = 0.0):
    """(nu, z) with z > 0 finite: anywhere, tiny, subnormal, huge, near the turning point
    z ~ nu, near z ~ nu^2 (where Hankel's expansion takes over), and fixed special values."""
    nu = draw(nu_strategy(lo))
    kind = draw(st.sampled_from(["any", "any", "tiny", "subnormal", "huge", "turning", "square", "special",
                                 "moderate"]))
    if kind == "any":
        z = draw(log_uniform(1e-320, 1e300))
    elif kind == "tiny":
        z = draw(log_uniform(1e-300, 1e-5))
    elif kind == "subnormal":
        z = draw(st.floats(DBL_TRUE_MIN, DBL_MIN, exclude_max=True))
    elif kind == "huge":
        z = draw(log_uniform(1e10, DBL_MAX))
    elif kind == "turning":
        base = max(nu, 1.0)
        z = base * (1.0 + draw(st.one_of(st.floats(-0.2, 0.2), st.sampled_from([0.0, 1e-15, -1e-15, 1e-8]))))
    elif kind == "square":
        base = max(nu, 1.0) ** 2
        z = base * 10.0 ** draw(st.floats(-1.5, 1.5))
    elif kind == "special":
        z = draw(st.sampled_from(SPECIAL_Z))
    else:
        z = draw(st.floats(1e-3, 300.0))
    assume(0.0 < z <= DBL_MAX and math.isfinite(z))
    return float(nu), float(z)


# ---------------------------------------------------------------------------
# helpers


def _t(x, dtype=torch.float64, device="cpu"):
    return torch.tensor([x], dtype=dtype, device=device)


def _ours(fn, nu, z, dtype=torch.float64):
    return fn(_t(nu, dtype), _t(z, dtype)).item()


def _ours_grad(fn, nu, z, dtype=torch.float64):
    zt = _t(z, dtype).requires_grad_(True)
    (g,) = torch.autograd.grad(fn(_t(nu, dtype), zt).sum(), zt)
    return g.item()


def _overflows(r, max_finite=DBL_MAX, bits=53) -> bool:
    """True if the exact value r rounds to +-inf in round-to-nearest."""
    from mpmath import mpf, mp

    with mp.workdps(60):
        return abs(mpf(r)) >= mpf(max_finite) * (1 + mpf(2) ** -bits)


def assert_ulp(ours, r, tol, what, nu, z, bits=53, emin=-1022, max_finite=DBL_MAX):
    if _overflows(r, max_finite, bits):
        assert math.isinf(ours) and (ours > 0) == (r > 0), f"{what}(nu={nu!r}, z={z!r}) = {ours!r}, exact {r}"
        return
    err = ref.ulp_error(ours, r, bits, emin)
    assert err <= tol, f"{what}(nu={nu!r}, z={z!r}) = {ours!r}, exact {float(r)!r} ({r}): {err:.3g} ulp > {tol}"


def assert_log(ours, r, tol, what, nu, z):
    err = ref.log_error(ours, r)
    assert err <= tol, (f"{what}(nu={nu!r}, z={z!r}) = {ours!r}, exact {float(r)!r}: "
                        f"{err:.3g} eps*max(1,|log I|) > {tol}")


# ---------------------------------------------------------------------------
# (a) float64 values against the references, hypothesis over the whole domain

EXTREMES = [(1e6, 1e-300), (1e6, DBL_TRUE_MIN), (0.5, DBL_TRUE_MIN), (0.5, DBL_MAX), (1e6, 1e6), (1e6, 1e12),
            (1e6, 1e300), (0.75, 1e300), (1.0, 25.0), (8.0, 50.0), (20.0, 20.0), (12.0, 12.5), (0.5000000000000002, 3.0),
            (66957.9142664298, 30.599215019053574)]  # the last was 4.09 ulp (Perron head)


def _with_examples(points):
    def deco(f):
        for p in points:
            f = example(p)(f)
        return f

    return deco


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.5))
@_with_examples(EXTREMES)
def test_ratio_vs_reference(p):
    nu, z = p
    assert_ulp(_ours(S.bessel_iv_ratio, nu, z), ref.ratio(nu, z), TOL_RATIO, "bessel_iv_ratio", nu, z)


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.5))
@_with_examples(EXTREMES)
def test_ratio_c_vs_reference(p):
    nu, z = p
    assert_ulp(_ours(S.bessel_iv_ratio_c, nu, z), ref.ratio_c(nu, z), TOL_RATIO_C, "bessel_iv_ratio_c", nu, z)


LOG_EXTREMES = EXTREMES + [(0.0, DBL_TRUE_MIN), (0.0, 1e300), (0.0, 1.0), (5e-324, 1.0), (1e-300, 1e-300)]


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.0))
@_with_examples(LOG_EXTREMES)
def test_log_iv_vs_reference(p):
    nu, z = p
    ours = _ours(S.log_bessel_iv, nu, z)
    assert math.isfinite(ours), f"log_bessel_iv(nu={nu!r}, z={z!r}) = {ours!r} (must be finite for z > 0)"
    assert_log(ours, ref.log_iv(nu, z), TOL_LOG, "log_bessel_iv", nu, z)


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.0))
@_with_examples(LOG_EXTREMES)
def test_log_ive_vs_reference(p):
    nu, z = p
    ours = _ours(S.log_bessel_ive, nu, z)
    assert math.isfinite(ours), f"log_bessel_ive(nu={nu!r}, z={z!r}) = {ours!r}"
    assert_log(ours, ref.log_ive(nu, z), TOL_LOG, "log_bessel_ive", nu, z)


def test_log_iv_never_nan_at_extremes():
    nu = torch.tensor([0.0, 0.5, 1e-300, 1.0, 1e3, 1e6, 1e6, 1e6], dtype=torch.float64)
    z = torch.tensor([DBL_TRUE_MIN, 1e-300, 1e-300, DBL_MAX, 1e300, 1e-300, DBL_TRUE_MIN, DBL_MAX],
                     dtype=torch.float64)
    for fn in (S.log_bessel_iv, S.log_bessel_ive):
        out = fn(nu, z)
        assert torch.isfinite(out).all(), (fn.__name__, out)
    # the example (nu = 1e6, z = 1e-300 gives about -7.04e8) is in test_special_core.py


# ---------------------------------------------------------------------------
# derivatives w.r.t. z through autograd, against the reference derivatives


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.5))
@_with_examples(EXTREMES)
def test_ratio_grad_vs_reference(p):
    nu, z = p
    r = ref.dratio(nu, z)
    assert_ulp(_ours_grad(S.bessel_iv_ratio, nu, z), r, TOL_GRAD, "d/dz bessel_iv_ratio", nu, z)
    assert_ulp(-_ours_grad(S.bessel_iv_ratio_c, nu, z), r, TOL_GRAD, "-d/dz bessel_iv_ratio_c", nu, z)


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.5))
@_with_examples(EXTREMES)
def test_ratio_grad_function_vs_reference(p):
    """The public dR/dz: within TOL_GRAD ulp of the reference, and bit for bit what autograd
    gives through bessel_iv_ratio (one kernel)."""
    nu, z = p
    ours = _ours(S.bessel_iv_ratio_grad, nu, z)
    assert_ulp(ours, ref.dratio(nu, z), TOL_GRAD, "bessel_iv_ratio_grad", nu, z)
    assert ours == _ours_grad(S.bessel_iv_ratio, nu, z) or (math.isnan(ours) and math.isnan(
        _ours_grad(S.bessel_iv_ratio, nu, z)))


@pytest.mark.parametrize("nu,z", [(0.5, 0.3), (1.0, 2.0), (2.5, 10.0), (7.0, 0.01), (40.0, 45.0), (1000.5, 3.0),
                                  (3.0, 1e8), (0.25, 1.5), (0.0, 1.0), (0.1, 1e-3)])
def test_ratio_grad_identity_and_closed_form(nu, z):
    """dR/dz = 1 - R^2 - (2 nu - 1) R / z, checked in mpmath at 60 digits against the quotient
    rule on I_nu / I_{nu-1} with I_mu' = (I_{mu-1} + I_{mu+1}) / 2 (DLMF 10.29.1); the public
    function within 10 ulp of it for nu >= 1/2 (below, the recurrence loses up to a factor
    (1 + 4 nu)/(1 - 2 nu): docs/special.md), and sech^2 at nu = 1/2."""
    import mpmath

    with mpmath.workdps(60):
        def i(k):  # I_{nu+k}(z), the order formed exactly
            return mpmath.besseli(mpmath.mpf(nu) + k, z)

        a, b = i(0), i(-1)
        da, db = (i(-1) + i(1)) / 2, (i(-2) + i(0)) / 2
        exact = (da * b - a * db) / (b * b)
        r = a / b
        identity = 1 - r * r - (2 * mpmath.mpf(nu) - 1) * r / z
        assert abs(identity - exact) <= mpmath.mpf(10) ** -45 * max(1, abs(exact))
    ours = _ours(S.bessel_iv_ratio_grad, nu, z)
    tol = TOL_GRAD if nu >= 0.5 else 16.0 * (1 + 4 * nu) / (1 - 2 * nu)
    assert_ulp(ours, exact, tol, "bessel_iv_ratio_grad", nu, z)
    if nu == 0.5:
        assert ours == pytest.approx(1 / math.cosh(z) ** 2, rel=4 * 2.0 ** -52)


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.0))
@_with_examples(LOG_EXTREMES)
def test_log_iv_grad_vs_reference(p):
    nu, z = p
    assert_ulp(_ours_grad(S.log_bessel_iv, nu, z), ref.dlog_iv(nu, z), TOL_GRAD, "d/dz log_bessel_iv", nu, z)


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.0))
@_with_examples(LOG_EXTREMES + [(1e6, 1e12), (1.0, 1.0), (2.0, 1.5), (30.0, 215.87130201035154)])
def test_log_ive_grad_vs_reference(p):
    nu, z = p
    assert_ulp(_ours_grad(S.log_bessel_ive, nu, z), ref.dlog_ive(nu, z), TOL_GRAD, "d/dz log_bessel_ive", nu, z)


# ---------------------------------------------------------------------------
# (e) float32 (computed in float64 internally, rounded once)

F32_ARGS = dict(bits=24, emin=-126, max_finite=F32_MAX)


@st.composite
def nu_z32(draw, lo):
    nu, z = draw(nu_z(lo))
    with np.errstate(over="ignore"):  # z beyond FLT_MAX becomes inf and is rejected below
        nu32, z32 = float(np.float32(nu)), float(np.float32(z))
    assume(nu32 >= lo and 0.0 < z32 < math.inf and math.isfinite(nu32))
    return nu32, z32


def _f32_check(fn, reffn, nu, z, log=False):
    ours = _ours(fn, nu, z, torch.float32)
    r = reffn(nu, z)
    rn = ref.round_float32(r)
    if math.isinf(rn):
        assert ours == rn, f"{fn.__name__}[float32](nu={nu!r}, z={z!r}) = {ours!r}, exact {r}"
        return
    err = ref.ulp_error(ours, rn, bits=24, emin=-126)
    # a log's float64 error budget (4 eps max(1,|log I|)) is also allowed where it exceeds a float32 ulp
    extra = (TOL_LOG * 2.0**-52 * max(1.0, abs(float(r)))) / ref.ulp(rn, 24, -126) if log else 0.0
    assert err <= TOL_F32 + extra, (f"{fn.__name__}[float32](nu={nu!r}, z={z!r}) = {ours!r}, "
                                    f"correctly rounded {rn!r}: {err:.3g} float32 ulp")


@pytest.mark.parametrize("name", ["bessel_iv_ratio", "bessel_iv_ratio_c", "log_bessel_iv", "log_bessel_ive"])
@settings(max_examples=max(20, N_EXAMPLES // 3), **SETTINGS)
@given(data=st.data())
def test_float32_vs_reference(name, data):
    lo = 0.5 if "ratio" in name else 0.0
    nu, z = data.draw(nu_z32(lo))
    reffn = {"bessel_iv_ratio": ref.ratio, "bessel_iv_ratio_c": ref.ratio_c,
             "log_bessel_iv": ref.log_iv, "log_bessel_ive": ref.log_ive}[name]
    _f32_check(getattr(S, name), reffn, nu, z, log="log" in name)


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_is_float64_rounded_once(dtype, device):
    nu = torch.tensor([0.5, 1.0, 2.5, 10.0, 40.0, 300.0, 1e4], dtype=dtype, device=device)
    z = torch.tensor([0.25, 1.0, 3.0, 12.0, 50.0, 250.0, 2e4], dtype=dtype, device=device)
    for fn in (S.bessel_iv_ratio, S.bessel_iv_ratio_c, S.log_bessel_iv, S.log_bessel_ive):
        out = fn(nu, z)
        assert out.dtype == dtype
        expect = fn(nu.double(), z.double()).to(dtype)
        assert torch.equal(out, expect), (fn.__name__, out, expect)


# ---------------------------------------------------------------------------
# (b) properties


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(st.one_of(log_uniform(0.5, 1e6), st.sampled_from([0.5, 1.0, 1.5, 20.0, 1e6])),
       st.one_of(log_uniform(1e-300, 1e300), st.sampled_from([1e-300, 1.0, 25.0, 50.0, 1e300])))
def test_recurrence(nu, z):
    """I_{nu-1} - I_{nu+1} = (2nu/z) I_nu, i.e. 1/R_nu - R_{nu+1} = 2nu/z; in cancellation-free
    form (C_nu + R_nu C_{nu+1}) / R_nu = 2nu/z, which also checks the complements."""
    n = _t(nu)
    zt = _t(z)
    r0 = S.bessel_iv_ratio(n, zt).item()
    r1 = S.bessel_iv_ratio(n + 1, zt).item()
    c0 = S.bessel_iv_ratio_c(n, zt).item()
    c1 = S.bessel_iv_ratio_c(n + 1, zt).item()
    rhs = 2.0 * nu / z
    assume(math.isfinite(rhs) and rhs > 1e-300 and r0 > 1e-300)
    eps = 2.0**-52
    lhs = 1.0 / r0 - r1
    assert abs(lhs - rhs) <= 16 * eps * (1.0 / r0 + r1), (nu, z, lhs, rhs)
    lhs_c = c0 / r0 + c1
    assert abs(lhs_c - rhs) <= 40 * eps * rhs, (nu, z, lhs_c, rhs, abs(lhs_c / rhs - 1) / eps)


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.5))
def test_complement_sums_to_one(p):
    nu, z = p
    r = _ours(S.bessel_iv_ratio, nu, z)
    c = _ours(S.bessel_iv_ratio_c, nu, z)
    tol = TOL_RATIO * ref.ulp(r) + TOL_RATIO_C * ref.ulp(c) + ref.ulp(1.0)
    assert abs((r - 1.0) + c) <= tol, (nu, z, r, c)


@pytest.mark.parametrize("theorem", [5, 4])
@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_bounds_bracket_exact_ratio(theorem, data):
    lo_nu = 0.5 if theorem == 5 else 0.0
    nu, z = data.draw(nu_z(lo_nu))
    assume(nu == 0.0 or nu >= 1e-6)  # the reference order nu - 1 needs nu + (k-1) > 0 at double precision
    lo, hi = S.bessel_iv_ratio_bounds(_t(nu), _t(z), theorem=theorem)
    lo, hi = lo.item(), hi.item()
    r = ref.ratio(nu, z, allow_below_half=True)
    if _overflows(r):  # R_0(z) ~ 2/z overflows for subnormal z: so must the upper bound
        assert hi == math.inf, f"theorem {theorem}: upper {hi!r} < exact {r} at nu={nu!r}, z={z!r}"
        # a finite lower bound is below r; an infinite one only if its exact value overflows too
        assert lo < math.inf or _overflows(_bound_exact(nu, z, theorem)[0]), (nu, z, lo)
        return
    u = 2 * ref.ulp(float(r))
    assert lo - float(r) <= u, f"theorem {theorem}: lower {lo!r} > exact {float(r)!r} at nu={nu!r}, z={z!r}"
    assert float(r) - hi <= u, f"theorem {theorem}: upper {hi!r} < exact {float(r)!r} at nu={nu!r}, z={z!r}"


def _bound_exact(nu, z, theorem):
    """The bound formulas in mpmath (60 digits): (lower, upper)."""
    from mpmath import mp, mpf, sqrt

    with mp.workdps(60):
        nu, z = mpf(nu), mpf(z)
        if theorem == 4:
            def b4(c):  # z / ((nu - c) + sqrt((nu + c)^2 + z^2)), rationalised where it cancels
                h = sqrt((nu + c) ** 2 + z * z)
                return z / ((nu - c) + h) if nu >= c else (h + (c - nu)) / (4 * c * nu / z + z)

            return b4(mpf(1) / 2), b4(mpf(1))

        def b(alpha):
            lam = nu + (alpha - 1) / 2
            delta = (nu - mpf(1) / 2) + lam / (2 * sqrt(lam * lam + z * z))
            return z / (delta + sqrt(delta * delta + z * z))

        return b(2), b(0)


# Where no square over- or underflows (orders up to 2^500, z in [2^-500, 2^500]) the bounds
# are evaluated in double-double: the formula correctly rounded, so within half an ulp of its
# value at 60 digits (1 ulp allowed: double rounding of the last bit is possible).
BOUNDS_DD_RANGE = (2.0**-500, 2.0**500)


@pytest.mark.parametrize("theorem", [5, 4])
@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_bounds_are_their_formulas_correctly_rounded(theorem, data):
    lo_nu = 0.5 if theorem == 5 else 0.0
    nu, z = data.draw(nu_z(lo_nu))
    assume(nu <= BOUNDS_DD_RANGE[1] and BOUNDS_DD_RANGE[0] <= z <= BOUNDS_DD_RANGE[1])
    lo, hi = (x.item() for x in S.bessel_iv_ratio_bounds(_t(nu), _t(z), theorem=theorem))
    elo, ehi = _bound_exact(nu, z, theorem)
    assert ref.ulp_error(lo, elo) <= 1.0, (theorem, nu, z, lo, elo)
    assert ref.ulp_error(hi, ehi) <= 1.0, (theorem, nu, z, hi, ehi)


# Points where one bound lies within an ulp of the exact ratio (both tend to z / (2 nu) as
# z -> 0), so that any evaluation error can put it on the wrong side.  At the first, found
# by CI's property sweep, the plain double evaluation used before (up to 3 ulp off its
# formula) gave an upper bound 3 ulp below the ratio; the others are from a sweep of that
# evaluation against mpmath.  Correctly rounded, a bound brackets the ratio exactly.
@pytest.mark.parametrize("theorem,nu,z", [(4, 0.002, 1.4330125702369627e-05), (4, 0.043312617174810816, 1.2865788227401231e-06),
                                          (4, 0.011570650264432995, 8.186686861242279e-08), (5, 1.2355256639701342, 7.087073240879656e-08)])
def test_bounds_bracket_where_tight(theorem, nu, z):
    lo, hi = (x.item() for x in S.bessel_iv_ratio_bounds(_t(nu), _t(z), theorem=theorem))
    r = ref.ratio(nu, z, allow_below_half=True)
    assert lo <= float(r) <= hi, (lo, float(r), hi)


def _bounds45(nu, z):
    lo5, hi5 = (x.item() for x in S.bessel_iv_ratio_bounds(_t(nu), _t(z), theorem=5))
    lo4, hi4 = (x.item() for x in S.bessel_iv_ratio_bounds(_t(nu), _t(z), theorem=4))
    return lo4, lo5, hi5, hi4


@settings(max_examples=N_EXAMPLES, **SETTINGS)
@given(nu_z(0.5))
def test_theorem5_lower_bound_tighter_than_theorem4(p):
    nu, z = p
    lo4, lo5, hi5, hi4 = _bounds45(nu, z)
    assert lo5 >= lo4 - 2 * ref.ulp(lo4), (nu, z, lo4, lo5)


@pytest.mark.parametrize("nu,z,tighter", [(1.0, 1.0, 4), (2.0, 0.1, 4), (50.0, 10.0, 4), (1e4, 100.0, 4),
                                           (1.0, 10.0, 5), (2.0, 100.0, 5), (50.0, 100.0, 5), (1e4, 1e4, 5)])
def test_neither_upper_bound_dominates(nu, z, tighter):
    """The papers call theorem 5 the sharper pair; that holds for the lower bound B_2 only.
    The upper bound B_0 is the looser one for z below about the order (nu = z = 1:
    B_0 is 0.064 above the ratio, theorem 4's upper bound 0.0008), and the tighter one above."""
    r = ref.ratio(nu, z)
    lo4, lo5, hi5, hi4 = _bounds45(nu, z)
    gap4, gap5 = float(hi4 - r), float(hi5 - r)
    assert gap4 >= 0 and gap5 >= 0, (gap4, gap5)
    if tighter == 4:
        assert gap4 < 0.5 * gap5, (gap4, gap5)
    else:
        assert gap5 < 0.5 * gap4, (gap4, gap5)


def test_half_order_closed_form():
    z = torch.tensor([1e-300, 1e-5, 0.3, 1.0, 4.0, 20.0, 400.0], dtype=torch.float64)
    torch.testing.assert_close(S.bessel_iv_ratio(0.5, z), torch.tanh(z), rtol=4 * 2**-52, atol=0)
    torch.testing.assert_close(S.bessel_iv_ratio_c(0.5, z), 2 / (1 + torch.exp(2 * z)), rtol=1e-15, atol=0)


# ---------------------------------------------------------------------------
# (c) autograd

GRAD_NU = [0.5, 0.75, 1.0, 2.5, 15.0, 40.0, 500.0]
GRAD_Z = [0.05, 0.7, 3.0, 22.0, 60.0, 900.0, 800.0]
GRAD_FNS = [S.bessel_iv_ratio, S.bessel_iv_ratio_c, S.bessel_iv_ratio_grad, S.log_bessel_iv, S.log_bessel_ive]


@pytest.mark.parametrize("fn", GRAD_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_gradcheck(fn, device):
    nu = torch.tensor(GRAD_NU, dtype=torch.float64, device=device)
    z = torch.tensor(GRAD_Z, dtype=torch.float64, device=device).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z_: fn(nu, z_), (z,))
    assert torch.autograd.gradgradcheck(lambda z_: fn(nu, z_), (z,))


@pytest.mark.parametrize("fn", GRAD_FNS, ids=lambda f: f.__name__)
def test_gradcheck_broadcast(fn):
    nu = torch.tensor([[0.5], [3.0], [25.0]], dtype=torch.float64)
    z = torch.tensor([[0.3, 2.0, 30.0]], dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z_: fn(nu, z_), (z,))


@pytest.mark.parametrize("fn", GRAD_FNS + [S.bessel_iv_ratio_bounds], ids=lambda f: f.__name__)
def test_nu_requires_grad_is_an_error(fn):
    nu = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)
    z = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="nu"):
        fn(nu, z)


@pytest.mark.parametrize("op,args", [("bessel_iv_ratio", (False,)), ("log_bessel_iv", (True,))])
def test_raw_op_nu_grad_is_an_error(op, args):
    nu = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)
    z = torch.tensor([2.0], dtype=torch.float64, requires_grad=True)
    out = getattr(torch.ops.vmfdist, op)(nu, z, *args)
    with pytest.raises(RuntimeError, match="nu"):
        out.sum().backward()


# ---------------------------------------------------------------------------
# (d) opcheck for every special op

def _opcheck_cases(device):
    nu = torch.tensor([0.5, 1.0, 3.5, 40.0], dtype=torch.float64, device=device)
    z = torch.tensor([0.2, 2.0, 30.0, 45.0], dtype=torch.float64, device=device)
    zg = z.clone().requires_grad_(True)
    v = torch.ops.vmfdist
    return [
        (v.bessel_iv_ratio.default, (nu, zg, False)),
        (v.bessel_iv_ratio.default, (nu, zg, True)),
        (v.bessel_iv_ratio_grad.default, (nu, zg)),
        (v.bessel_iv_ratio_grad2.default, (nu, zg)),
        (v.log_bessel_iv.default, (nu, zg, False)),
        (v.log_bessel_iv.default, (nu, zg, True)),
        (v.log_bessel_iv_grad.default, (nu, zg, False)),
        (v.log_bessel_iv_grad.default, (nu, zg, True)),
        (v.bessel_iv_ratio_bounds.default, (nu, z, 5)),
        (v.bessel_iv_ratio_bounds.default, (nu, z, 4)),
        (v.bessel_iv_ratio_approx.default, (nu, z)),
        (v.log_bessel_iv_asymptotic.default, (nu, z)),
        (v.log_bessel_iv_series.default, (nu, z)),
        (v.bessel_iv_ratio.default, (nu[:1].reshape(()), z.float(), False)),  # 0-dim, mixed dtype
    ]


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("case", range(14))
def test_opcheck(device, case):
    op, args = _opcheck_cases(device)[case]
    torch.library.opcheck(op, args)


def test_every_special_op_is_opchecked():
    names = {op._schema.name.split("::")[1] for op, _ in _opcheck_cases("cpu")}
    declared = {n for n in dir(torch.ops.vmfdist) if "bessel" in n}
    assert declared <= names, declared - names


# ---------------------------------------------------------------------------
# (f) domain, boundary conventions, bad arguments

NAN = float("nan")
INF = float("inf")


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_out_of_domain_is_nan(device, dtype):
    nu = torch.tensor([-1.0, 1.0, NAN, 1.0, 0.25, 0.0], dtype=dtype, device=device)
    z = torch.tensor([1.0, -1.0, 1.0, NAN, 1.0, 1.0], dtype=dtype, device=device)
    assert torch.isnan(S.bessel_iv_ratio_c(nu, z)).all()  # domain nu >= 1/2
    # domain nu >= 0 (the ratio below 1/2: issue 12; values against mpmath in tests/test_extremes.py)
    for fn in (S.bessel_iv_ratio, S.bessel_iv_ratio_grad, S.log_bessel_iv, S.log_bessel_ive):
        out = fn(nu, z)
        assert torch.isnan(out[:4]).all() and torch.isfinite(out[4:]).all(), (fn.__name__, out)
    lo, hi = S.bessel_iv_ratio_bounds(nu, z, theorem=5)
    assert torch.isnan(lo).all() and torch.isnan(hi).all()
    lo, hi = S.bessel_iv_ratio_bounds(nu, z, theorem=4)
    assert torch.isnan(lo[:4]).all() and torch.isfinite(lo[4:]).all()
    zg = z.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(S.log_bessel_iv(nu, zg).sum(), zg)
    assert torch.isnan(g[:4]).all()


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_boundary_conventions(device, dtype):
    """The table in the vmfdist.special docstring."""
    def ev(fn, nu, z):
        return fn(torch.tensor([nu], dtype=dtype, device=device), torch.tensor([z], dtype=dtype, device=device)).item()

    for nu in (0.5, 1.0, 7.5, 1e6):
        assert ev(S.bessel_iv_ratio, nu, 0.0) == 0.0
        assert ev(S.bessel_iv_ratio, nu, INF) == 1.0
        assert ev(S.bessel_iv_ratio_c, nu, 0.0) == 1.0
        assert ev(S.bessel_iv_ratio_c, nu, INF) == 0.0
        assert ev(S.log_bessel_iv, nu, 0.0) == -INF
        assert ev(S.log_bessel_ive, nu, 0.0) == -INF
        assert ev(S.log_bessel_iv, nu, INF) == INF
        assert ev(S.log_bessel_ive, nu, INF) == -INF
        assert ev(S.bessel_iv_ratio, INF, nu) == 0.0
        assert ev(S.bessel_iv_ratio_c, INF, nu) == 1.0
        assert ev(S.log_bessel_iv, INF, nu) == -INF
        assert ev(S.bessel_iv_ratio_grad, nu, 0.0) == torch.tensor(0.5 / nu, dtype=dtype).item()
        assert ev(S.bessel_iv_ratio_grad, nu, INF) == 0.0
        assert ev(S.bessel_iv_ratio_grad, INF, nu) == 0.0
    assert ev(S.bessel_iv_ratio_grad, 0.0, 0.0) == -INF
    assert ev(S.log_bessel_iv, 0.0, 0.0) == 0.0
    assert ev(S.log_bessel_ive, 0.0, 0.0) == 0.0
    assert ev(S.log_bessel_iv, 0.0, INF) == INF
    assert ev(S.log_bessel_ive, 0.0, INF) == -INF
    for fn in (S.bessel_iv_ratio, S.bessel_iv_ratio_c, S.bessel_iv_ratio_grad, S.log_bessel_iv, S.log_bessel_ive):
        assert math.isnan(ev(fn, INF, INF)), fn.__name__


def test_boundary_gradients():
    # dR/dz at z = 0 is 1/(2nu); d/dz log I_0 at 0 is 0
    z = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    nu = torch.tensor([0.5, 1.0, 10.0], dtype=torch.float64)
    (g,) = torch.autograd.grad(S.bessel_iv_ratio(nu, z).sum(), z)
    torch.testing.assert_close(g, 0.5 / nu, rtol=0, atol=0)
    (g,) = torch.autograd.grad(S.log_bessel_iv(torch.zeros(3, dtype=torch.float64), z).sum(), z)
    assert (g == 0).all()


def test_bad_types_name_the_argument():
    with pytest.raises(TypeError, match="nu"):
        S.bessel_iv_ratio("1.0", 2.0)
    with pytest.raises(TypeError, match="z"):
        S.log_bessel_iv(1.0, [2.0])
    with pytest.raises(TypeError, match="bessel_iv_ratio_grad: nu"):
        S.bessel_iv_ratio_grad(None, 2.0)
    with pytest.raises(ValueError, match="theorem"):
        S.bessel_iv_ratio_bounds(1.0, 2.0, theorem=3)
    with pytest.raises(RuntimeError, match="theorem"):
        torch.ops.vmfdist.bessel_iv_ratio_bounds(torch.ones(1), torch.ones(1), 3)


@pytest.mark.parametrize("fn", GRAD_FNS + [S.bessel_iv_ratio_approx, S.log_bessel_iv_asymptotic,
                                           S.log_bessel_iv_series, S.bessel_iv_ratio_bounds],
                         ids=lambda f: f.__name__)
def test_bad_shapes_and_dtypes_name_the_argument(fn):
    with pytest.raises(RuntimeError, match=r"nu.*z.*broadcast"):
        fn(torch.ones(3, dtype=torch.float64), torch.ones(4, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="nu must be real"):
        fn(torch.ones(3, dtype=torch.complex128), torch.ones(3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="z must be real"):
        fn(torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.complex128))


@pytest.mark.parametrize("fn", GRAD_FNS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA not available"))])
def test_mixed_devices_name_the_arguments(fn, device):
    with pytest.raises(RuntimeError, match="same device"):
        fn(torch.ones(3, device=device), torch.ones(3))


ELEMENTWISE_FNS = GRAD_FNS + [S.bessel_iv_ratio_approx, S.log_bessel_iv_asymptotic, S.log_bessel_iv_series,
                              S.bessel_iv_ratio_bounds]


@pytest.mark.parametrize("fn", ELEMENTWISE_FNS, ids=lambda f: f.__name__)
def test_meta_mixed_with_cpu_is_an_error(fn):
    """A meta tensor sends the call to the fake kernel, which used to return uninitialised
    CPU memory for (CPU, meta) arguments; both orders must raise, naming the arguments."""
    cpu, meta = torch.tensor([1.5]), torch.tensor([2.0], device="meta")
    with pytest.raises(RuntimeError, match="z must be on the same device as nu, got z on meta and nu on cpu"):
        fn(cpu, meta)
    with pytest.raises(RuntimeError, match="z must be on the same device as nu, got z on cpu and nu on meta"):
        fn(meta, cpu)
    out = fn(meta, meta)  # all on meta: the fake kernel's shapes
    for o in (out if isinstance(out, tuple) else (out,)):
        assert o.device.type == "meta" and o.shape == (1,)


# ---------------------------------------------------------------------------
# (g) broadcasting


@pytest.mark.parametrize("fn", GRAD_FNS + [S.bessel_iv_ratio_approx, S.log_bessel_iv_asymptotic,
                                           S.log_bessel_iv_series], ids=lambda f: f.__name__)
@pytest.mark.parametrize("device", cpu_and_cuda())
def test_broadcasting(fn, device):
    nu = torch.tensor([[0.5], [2.0], [31.0]], dtype=torch.float64, device=device)
    z = torch.tensor([0.1, 1.0, 10.0, 100.0], dtype=torch.float64, device=device)
    out = fn(nu, z)
    assert out.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            assert out[i, j].item() == fn(nu[i, 0].reshape(1), z[j].reshape(1)).item()
    # Python numbers on either side, and 0-dim tensors
    assert fn(2.0, z).shape == (4,)
    assert fn(nu, 3.0).shape == (3, 1)
    assert fn(torch.tensor(2.0, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)).shape == ()
    # integer arguments promote to the default dtype
    assert fn(torch.tensor([2]), torch.tensor([3])).dtype == torch.get_default_dtype()


def test_bounds_broadcast_and_grad_reduces_to_input_shape():
    nu = torch.tensor([[0.5], [2.0]], dtype=torch.float64)
    z = torch.tensor([[1.0, 5.0, 9.0]], dtype=torch.float64, requires_grad=True)
    lo, hi = S.bessel_iv_ratio_bounds(nu, z.detach())
    assert lo.shape == hi.shape == (2, 3)
    (g,) = torch.autograd.grad(S.log_bessel_iv(nu, z).sum(), z)
    assert g.shape == z.shape


# ---------------------------------------------------------------------------
# (h) build hygiene


def test_csrc_source_stems_are_unique():
    """setuptools writes one object per source stem; two sources with one stem collide."""
    files = [f for ext in ("c", "cc", "cpp", "cu") for f in glob.glob(os.path.join(ROOT, "csrc", "**", f"*.{ext}"),
                                                                    recursive=True)]
    assert files
    stems = Counter(os.path.splitext(os.path.basename(f))[0] for f in files)
    assert all(n == 1 for n in stems.values()), {s: n for s, n in stems.items() if n > 1}


# ---------------------------------------------------------------------------
# (i) the papers' approximations: measured claims


def _max_rel_err_approx(nu, zs):
    zt = torch.tensor(zs, dtype=torch.float64)
    return (S.bessel_iv_ratio_approx(nu, zt) / S.bessel_iv_ratio(nu, zt) - 1).abs().max().item()


ZGRID = list(np.logspace(-3, 4, 57))


def test_ratio_approx_claims():
    """(B_2 + B_0)/2: about 7% off at nu = 1 (d = 2), error decaying like nu^-2 at high order,
    always inside the theorem 5 bracket; at nu = 1/2 (d = 1) B_0 = 1 and it is useless for small z."""
    e1 = _max_rel_err_approx(1.0, ZGRID)
    assert 0.06 < e1 < 0.075, e1
    assert _max_rel_err_approx(1.5, ZGRID) < 0.03
    for nu in (50.0, 500.0, 5000.0):
        assert _max_rel_err_approx(nu, ZGRID) < 0.04 / nu**2, nu
    assert _max_rel_err_approx(0.5, ZGRID) > 1.0
    nu = torch.tensor([[1.0], [3.0], [100.0]], dtype=torch.float64)
    zt = torch.tensor(ZGRID, dtype=torch.float64)
    lo, hi = S.bessel_iv_ratio_bounds(nu, zt)
    ap = S.bessel_iv_ratio_approx(nu, zt)
    assert ((lo <= ap) & (ap <= hi)).all()


def test_papers_approximation_is_poor_at_low_order():
    """The maximum over a dense z grid: 7.1% at nu = 1 (d = 2), 1.3% at nu = 2 (d = 4)."""
    z = torch.logspace(-2, 2, 2001, dtype=torch.float64)
    for nu, lo_err, hi_err in [(1.0, 0.06, 0.08), (2.0, 0.01, 0.015)]:
        n = torch.full_like(z, nu)
        exact = S.bessel_iv_ratio(n, z)
        rel = ((S.bessel_iv_ratio_approx(n, z) - exact) / exact).abs()
        assert lo_err < rel.max().item() < hi_err


def test_log_asymptotic_claims():
    """Eq. 44: the z >= nu branch is the leading Hankel term, so its error is about
    (4nu^2 - 1)/(8z) where that is small; the z < nu branch is a rough interpolation whose error
    grows with nu (measured below ~0.5 nu + 0.7 in absolute value)."""
    for nu in (0.0, 1.0, 5.0, 30.0):
        zs = torch.tensor([max(10 * nu * nu, 50.0) * f for f in (1, 10, 100, 1e4)], dtype=torch.float64)
        err = (S.log_bessel_iv_asymptotic(nu, zs) - S.log_bessel_iv(nu, zs)).abs()
        bound = (abs(4 * nu * nu - 1) / (8 * zs) + 1e-13 * zs) * 1.5
        assert (err <= bound).all(), (nu, err, bound)
    for nu in (1.0, 10.0, 100.0, 1000.0):
        zs = torch.tensor(ZGRID, dtype=torch.float64)
        err = (S.log_bessel_iv_asymptotic(nu, zs) - S.log_bessel_iv(nu, zs)).abs().max().item()
        assert err < 0.5 * nu + 0.7, (nu, err)


def test_log_series_claims():
    """Eq. 45: exact for nu < 1 (only the fractional order, computed exactly); otherwise the
    error of the approximate ratios adds up to at most ~0.08 whatever nu (they err like nu^-2)."""
    zs = torch.tensor(ZGRID, dtype=torch.float64)
    for nu in (0.0, 0.3, 0.5, 0.99):
        torch.testing.assert_close(S.log_bessel_iv_series(nu, zs), S.log_bessel_iv(nu, zs), rtol=0, atol=0)
    for nu in (1.0, 2.5, 10.0, 100.0, 1000.0):
        err = (S.log_bessel_iv_series(nu, zs) - S.log_bessel_iv(nu, zs)).abs().max().item()
        assert err < 0.08, (nu, err)


# ---------------------------------------------------------------------------
# heavy sweeps


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bessel_iv_ratio", "bessel_iv_ratio_c", "log_bessel_iv", "log_bessel_ive"])
def test_dense_sweep_float64(name):
    """A deterministic log-uniform grid over the whole domain (a few hundred points)."""
    rng = np.random.default_rng(1234)
    lo = 0.5 if "ratio" in name else 0.0
    nus = np.concatenate([10 ** rng.uniform(np.log10(max(lo, 1e-3)), 6, 150), [lo, 0.5, 1.0, 1e6]])
    zs = 10 ** rng.uniform(-300, 300, nus.size)
    reffn = {"bessel_iv_ratio": ref.ratio, "bessel_iv_ratio_c": ref.ratio_c,
             "log_bessel_iv": ref.log_iv, "log_bessel_ive": ref.log_ive}[name]
    out = getattr(S, name)(torch.tensor(nus), torch.tensor(zs)).tolist()
    bad = []
    for nu, z, o in zip(nus.tolist(), zs.tolist(), out):
        r = reffn(nu, z)
        err = ref.log_error(o, r) if "log" in name else ref.ulp_error(o, r)
        tol = {"bessel_iv_ratio": TOL_RATIO, "bessel_iv_ratio_c": TOL_RATIO_C}.get(name, TOL_LOG)
        if not err <= tol:
            bad.append((nu, z, o, float(r), err))
    assert not bad, bad[:10]
