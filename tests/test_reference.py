"""Checks of the mpmath references themselves (tests/reference.py); no vmfdist needed.

The references judge the implementation, so they are checked against closed forms
(half-integer orders), against each other where two of their methods both certify a
value, and at points where they once failed.
"""
import math

import mpmath
import pytest
from mpmath import mp, mpf

from . import reference as ref

TIGHT = mpf(10) ** -38  # the references promise 40 digits; allow two for the comparison


def _rel(a, b):
    with mp.workdps(60):
        return abs(mpf(a) / mpf(b) - 1)


@pytest.mark.parametrize("z", [5e-324, 1e-320, 2.2250738585072014e-308, 1e-300, 1e-100, 1e-10, 1e-3, 0.5, 3.0,
                               30.0, 61.5, 700.0, 1e5, 1e300])
def test_half_order_closed_forms(z):
    """nu = 1/2: R = tanh z, C = 2/(e^{2z}+1), R' = sech^2 z; log I_{1/2} = log(sinh z) + log(2/(pi z))/2
    and I_{3/2} = sqrt(2/(pi z)) (cosh z - sinh z / z) (the latter evaluated with ample precision)."""
    with mp.workdps(80):
        zz = mpf(z)
        assert _rel(ref.ratio(0.5, z), mpmath.tanh(zz)) <= TIGHT
        assert _rel(ref.ratio_c(0.5, z), 2 / (mpmath.exp(2 * zz) + 1)) <= TIGHT
        assert _rel(ref.dratio(0.5, z), mpmath.sech(zz) ** 2) <= TIGHT
    with mp.workdps(80 + int(-math.log10(z)) * 2 if z < 1 else 80):
        zz = mpf(z)
        log_i_half = mpmath.log(mpmath.sinh(zz)) + mpmath.log(2 / (mpmath.pi * zz)) / 2
        i32 = mpmath.sqrt(2 / (mpmath.pi * zz)) * (mpmath.cosh(zz) - mpmath.sinh(zz) / zz) if z < 1e4 else None
        log_i32 = mpmath.log(i32) if i32 is not None else None
        exact_ratio = mpmath.exp(log_i32 - log_i_half) if i32 is not None else None
    assert abs(ref.log_iv(0.5, z) - log_i_half) <= TIGHT * max(1, abs(log_i_half))
    if log_i32 is not None:
        assert abs(ref.log_iv(1.5, z) - log_i32) <= TIGHT * max(1, abs(log_i32))
        assert _rel(ref.ratio(1.5, z), exact_ratio) <= TIGHT


def test_ratio_tiny_argument():
    """R_nu(z) = z / (2 nu) (1 + O(z^2)) for tiny z (regression: R_{1/2}(1e-300) must be ~1e-300, not 0)."""
    for nu in (0.5, 0.75, 1.0, 3.0, 1e6):
        for z in (5e-324, 1e-300, 1e-20):
            r = ref.ratio(nu, z)
            assert r > 0
            with mp.workdps(60):
                assert _rel(r, mpf(z) / (2 * mpf(nu))) <= max(mpf(z) ** 2, mpf(10) ** -45) * 10


# (mu, z) pairs inside the overlap of two methods: each must certify and they must agree.
OVERLAP = [
    ("series", "hankel", 0.0, 100.0),
    ("series", "hankel", 2.5, 80.0),
    ("series", "hankel", 10.375, 61.88570042349226),
    ("series", "hankel", 0.75, 61.5),
    ("series", "hankel", -0.25, 300.0),
    ("series", "olver", 30.0, 1e-3),
    ("series", "olver", 50.0, 40.0),
    ("series", "olver", 400.0, 1000.0),
    ("hankel", "olver", 40.0, 4000.0),
    ("hankel", "olver", 1000.0, 1e8),
    ("olver", "series", 1e6, 1e-300),
]


@pytest.mark.parametrize("m1,m2,mu,z", OVERLAP)
def test_methods_agree(m1, m2, mu, z):
    with mp.workdps(ref.DIGITS + 30):
        a = ref._log_iv_mp(mpf(mu), mpf(z), ref.DIGITS + 4, method=m1)
        b = ref._log_iv_mp(mpf(mu), mpf(z), ref.DIGITS + 4, method=m2)
        assert abs(a - b) <= TIGHT * max(1, abs(a)), (m1, m2, mu, z, a, b)


@pytest.mark.parametrize("nu,z", [(0.0, 1.0), (1.0, 25.0), (3.25, 7.0), (30.0, 45.0), (75.5, 10.0), (100.0, 250.0)])
def test_against_mpmath_besseli(nu, z):
    """mpmath's own besseli (hypergeometric series) at moderate arguments."""
    with mp.workdps(70):
        exact = mpmath.log(mpmath.besseli(mpf(nu), mpf(z)))
    assert abs(ref.log_iv(nu, z) - exact) <= TIGHT * max(1, abs(exact))


@pytest.mark.parametrize("nu,z", [(0.75, 61.5), (10.375, 61.88570042349226), (12.0, 1.7976931348623157e308),
                                  (0.5000000000000002, 5e-324), (1e6, 1.7976931348623157e308), (29.999, 5001.0),
                                  (1e6, 1e6), (0.0, 5e-324)])
def test_hard_points_certify(nu, z):
    """Points drawn by the hypothesis sweep where the reference once raised ReferenceError_."""
    ref.log_iv(nu, z)
    ref.log_ive(nu, z)
    ref.dlog_iv(nu, z)
    ref.dlog_ive(nu, z)
    if nu >= 0.5:
        ref.ratio(nu, z)
        ref.ratio_c(nu, z)
        ref.dratio(nu, z)
