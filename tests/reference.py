"""Independent high-precision references for the modified Bessel function I_nu(z).

Nothing here calls vmfdist.  Everything is evaluated in mpmath at a working
precision chosen per call, with an error estimate that is asserted to be tiny,
so that a reference value is certified to at least ``DIGITS`` significant
decimal digits (default 40) before it is used to judge the code under test.

log I_mu(z) is written as ``A + log S`` and one of three methods gives (A, S):

* the power series (DLMF 10.25.2), all terms positive for mu > -1::

      A = mu log(z/2) - log Gamma(mu+1),   S = sum_k (z^2/4)^k / (k! (mu+1)_k)

  error: the tail is bounded by the last term times r/(1-r) once the term ratio r
  is below 1/2 (the ratios then decrease monotonically);
* Hankel's expansion (DLMF 10.40.1) for large z::

      A = z - log(2 pi z)/2,   S = sum_k (-1)^k a_k(mu) / z^k,
      a_k = a_{k-1} (4 mu^2 - (2k-1)^2) / (8k)

  error: 10x the first omitted term plus the neglected exponentially small
  solution, relative size e^{-2z};
* Olver's uniform expansion (DLMF 10.41.3) for large order, with the Debye
  polynomials u_k generated exactly (``scripts/gen_olver_coeffs.py: debye``)::

      t = z/mu, p = 1/sqrt(1+t^2), eta = sqrt(1+t^2) + log(t / (1 + sqrt(1+t^2))),
      A = mu eta - log(2 pi mu)/2 - log(1+t^2)/4,   S = sum_k u_k(p) / mu^k

  error: 10x the larger of the first two omitted terms.

Derived quantities use exact identities:

* R_nu = I_nu / I_{nu-1} = exp(log I_nu - log I_{nu-1}), C_nu = 1 - R_nu;
* d/dz log I_nu = R_{nu+1} + nu/z,   d/dz (log I_nu - z) = nu/z - C_{nu+1};
* dR_nu/dz = 1 - R^2 - (2nu-1) R / z = C (2 - C) - (2nu - 1)(1 - C)/z;
* nu = 1/2: R = tanh z, C = 2/(e^{2z}+1), R' = sech^2 z, in closed form.

Where a derived quantity cancels (C when R -> 1, the derivatives for z >> nu, the
zero of the scaled log-derivative), the working precision is raised by the number
of digits lost and the evaluation repeated until the requested number of digits
survives.  Inputs are Python floats (or anything mpmath converts exactly); the
value of a double is used exactly.
"""
from __future__ import annotations

import functools
import math
import os
import sys
from fractions import Fraction

import mpmath
from mpmath import mp, mpf

DIGITS = 40  # significant decimal digits every returned reference is certified to
_GUARD = 12  # extra working digits

__all__ = [
    "DIGITS",
    "log_iv",
    "log_ive",
    "ratio",
    "ratio_c",
    "dlog_iv",
    "dlog_ive",
    "dratio",
    "log_iv_method",
    "ratio_bounds",
    "bound5",
    "ReferenceError_",
]


class ReferenceError_(AssertionError):
    """The reference could not certify a value (its own error estimate was too large)."""


# ---------------------------------------------------------------------------
# Debye polynomials u_k(p) = p^k P_k(p^2), exact rationals, generated once.
_KMAX = 64


@functools.lru_cache(maxsize=1)
def _debye_even():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts")
    sys.path.insert(0, os.path.abspath(root))
    try:
        from gen_olver_coeffs import debye  # exact rational recurrences (DLMF 10.41.9-10)
    finally:
        sys.path.pop(0)
    u, _ = debye(_KMAX + 1)
    out = []
    for k, c in enumerate(u):
        c = list(c) + [Fraction(0)] * (3 * k + 1 - len(c))
        assert all(c[i] == 0 for i in range(len(c)) if (i - k) % 2 or i < k)
        out.append([(x.numerator, x.denominator) for x in (c[k + 2 * j] for j in range(k + 1))])
    return out


_coef_cache: dict = {}


def _debye_mpf():
    """The coefficients of P_k as mpf at the current precision (cached per precision)."""
    key = mp.prec
    got = _coef_cache.get(key)
    if got is None:
        got = [[mpf(n) / d for (n, d) in row] for row in _debye_even()]
        _coef_cache[key] = got
    return got


# ---------------------------------------------------------------------------
# the three methods; each returns (A, S, relative error estimate of S) or None


def _series(mu, z, tol):
    x = (z / 2) ** 2
    s = t = mpf(1)
    mu1 = mu + 1
    k = 0
    while True:
        k += 1
        r = x / (k * (mu1 + k - 1))
        t *= r
        s += t
        if r < 0.5 and t * r / (1 - r) <= tol * s:
            err = t * r / (1 - r) / s
            break
        if k > 200000:
            return None
    a = mu * mpmath.log(z / 2) - mpmath.loggamma(mu1)
    return a, s, err


def _hankel(mu, z, tol):
    if z < 20:
        return None
    expo = mpmath.exp(-2 * z)  # the neglected solution, relative size
    if 10 * expo > tol / 2:  # half the budget for the neglected solution, half for the tail
        return None
    four_mu2 = 4 * mu * mu
    s = t = mpf(1)
    big = mpf(1)
    prev = mpf(1)
    k = 0
    kmax = int(min(2 * z + abs(mu) + 50, 20000))
    while True:
        k += 1
        t = -t * (four_mu2 - (2 * k - 1) ** 2) / (8 * k * z)
        at = abs(t)
        if at == 0:  # half-integer order: the series terminates
            err = mpf(0)
            break
        if at <= tol * abs(s) / 20:
            err = 10 * at / abs(s)
            break
        if k > abs(mu) + 1 and at > prev:
            return None  # diverging before reaching the tolerance
        if k > kmax:
            return None
        s += t
        big = max(big, at)
        prev = at
    if big > 1e6 * abs(s):
        return None  # internal cancellation; leave it to another method
    a = z - mpmath.log(2 * mpmath.pi * z) / 2
    return a, s, err + 10 * expo


def _olver(mu, z, tol):
    if mu < 30:
        return None
    coef = _debye_mpf()
    t = z / mu
    w = mpmath.sqrt(1 + t * t)
    p = 1 / w
    p2 = p * p
    eta = w + mpmath.log(t / (1 + w))
    imu = 1 / mu
    terms = []
    acc = mpf(0)
    pk = mpf(1)
    for k in range(0, _KMAX + 1):
        if k:
            pk *= p * imu
        row = coef[k]
        poly = row[-1]
        for c in reversed(row[:-1]):
            poly = poly * p2 + c
        terms.append(pk * poly)
        acc += terms[-1]
        # the estimate below is relative to the sum (about 1): leave a factor 2 for that
        if k >= 2 and max(abs(terms[-1]), abs(terms[-2])) * 10 <= tol * abs(acc) / 2:
            break
    else:
        return None
    s = mpmath.fsum(terms[:-2])
    err = 10 * max(abs(terms[-1]), abs(terms[-2])) / abs(s)
    a = mu * eta - mpmath.log(2 * mpmath.pi * mu) / 2 - mpmath.log(1 + t * t) / 4
    return a, s, err


_METHODS = {"series": _series, "hankel": _hankel, "olver": _olver}


def _choose(mu, z, tol):
    """Try the methods in order of cost for this (mu, z)."""
    order = []
    if mu >= 30:
        order.append("olver")
    if z >= 20:
        order.append("hankel")
    if z <= 5000:
        order.append("series")
    for name in order:
        got = _METHODS[name](mu, z, tol)
        # a method whose own error estimate misses the tolerance is not certified here:
        # try the next one rather than fail
        if got is not None and got[2] <= tol:
            return name, got
    raise ReferenceError_(f"no method certifies log I_{mu}({z}) to {tol}")


def _log_iv_mp(mu, z, digits, method=None):
    """log I_mu(z) as an mpf, at the *current* working precision, certified to relative
    error 10^-digits of S (absolute error of log I about the same plus rounding)."""
    tol = mpf(10) ** (-digits)
    if mu < 0 and mu == mpmath.floor(mu):
        mu = -mu  # I_{-n} = I_n
    if method is None:
        name, (a, s, err) = _choose(mu, z, tol)
    else:
        got = _METHODS[method](mu, z, tol)
        if got is None:
            raise ReferenceError_(f"method {method} does not certify log I_{mu}({z})")
        name, (a, s, err) = method, got
    if not err <= tol:
        raise ReferenceError_(f"{name}: error estimate {mpmath.nstr(err, 3)} > {tol} at mu={mu}, z={z}")
    return a + mpmath.log(s)


def log_iv_method(nu, z) -> str:
    """Which method the reference uses for log I_nu(z) (for reports)."""
    with mp.workdps(DIGITS + _GUARD):
        name, _ = _choose(mpf(nu), mpf(z), mpf(10) ** (-DIGITS - 2))
    return name


# ---------------------------------------------------------------------------
# working precision


def _extra_digits(nu, z) -> int:
    """Decimal digits needed in front of the point for |log I| (and the large terms)."""
    nu, z = float(nu), float(z)
    lz = abs(math.log(z)) if z > 0 else 0.0
    # log10 of 1 + z + nu (1 + |log z| + |log nu|), taken term by term: the sum overflows near DBL_MAX
    logs = [0.0, math.log10(z) if z > 0 else 0.0]
    if nu > 0:
        logs.append(math.log10(nu) + math.log10(1.0 + lz + abs(math.log(nu))))
    return int(max(logs) + math.log10(3.0)) + 2


def _check_args(nu, z, lo):
    nu = float(nu)
    z = float(z)
    if not (math.isfinite(nu) and math.isfinite(z) and nu >= lo and z > 0):
        raise ValueError(f"reference needs finite nu >= {lo} and finite z > 0, got nu={nu!r}, z={z!r}")
    return nu, z


def _adaptive(fn, digits):
    """Evaluate fn(dps) -> (value, lost) where lost is the number of digits cancelled;
    raise the precision until digits survive."""
    dps = digits + _GUARD
    for _ in range(12):
        with mp.workdps(dps):
            val, lost = fn(dps)
        if dps - lost >= digits + _GUARD - 2:
            return val
        if lost >= dps - 5:  # (nearly) everything cancelled: the value is noise; double
            dps = 2 * dps
        else:
            dps = int(max(digits + _GUARD + lost + 10, dps + 10))
        if dps > 20000:
            break
    raise ReferenceError_(f"cancellation: could not reach {digits} digits (lost {lost})")


def _lost(value, *scales):
    """Digits lost forming ``value`` from terms of the sizes ``scales``."""
    m = max(abs(s) for s in scales)
    if value == 0:
        return float("inf") if m != 0 else 0.0
    return max(0.0, float(mpmath.log10(m / abs(value))))


# ---------------------------------------------------------------------------
# public references (return mpf; convert with float() for a correctly rounded double)


def log_iv(nu, z, digits: int = DIGITS):
    """log I_nu(z), nu >= 0, z > 0 finite: absolute error <= 10^-digits max(1, |log I|)."""
    nu, z = _check_args(nu, z, 0.0)
    ex = _extra_digits(nu, z)
    with mp.workdps(digits + _GUARD + ex):
        return +_log_iv_mp(mpf(nu), mpf(z), digits + 4)


def log_ive(nu, z, digits: int = DIGITS):
    """log I_nu(z) - z."""
    nu, z = _check_args(nu, z, 0.0)
    ex = _extra_digits(nu, z)
    with mp.workdps(digits + _GUARD + ex):
        return +(_log_iv_mp(mpf(nu), mpf(z), digits + 4) - mpf(z))


def _ratio_parts(nu, z, dps_rel):
    """(R, C, lost_R, lost_C) at the current precision: R has relative error about
    10^-dps_rel, C relative error 10^-(dps_rel - lost_C)."""
    nu_m = mpf(nu)
    zz = mpf(z)
    if nu_m == mpf(1) / 2:  # closed form, no cancellation
        e = mpmath.exp(-2 * zz)
        return -mpmath.expm1(-2 * zz) / (1 + e), 2 * e / (1 + e), 0.0, 0.0
    d = _log_iv_mp(nu_m, zz, dps_rel) - _log_iv_mp(nu_m - 1, zz, dps_rel)
    r = mpmath.exp(d)
    c = -mpmath.expm1(d)  # absolute error ~ r 10^-dps_rel
    return r, c, 0.0, _lost(c, r)


def _ratio_fn(nu, z, which):
    ex = _extra_digits(nu, z)

    def fn(dps):
        with mp.workdps(dps + ex):
            r, c, lr, lc = _ratio_parts(nu, z, dps)
        return (+r, lr) if which == "R" else (+c, lc)

    return fn


def ratio(nu, z, digits: int = DIGITS, allow_below_half: bool = False):
    """R_nu(z) = I_nu(z) / I_{nu-1}(z), nu >= 1/2 (nu >= 0 with allow_below_half), z > 0 finite;
    relative error <= 10^-digits."""
    nu, z = _check_args(nu, z, 0.0 if allow_below_half else 0.5)
    return _adaptive(_ratio_fn(nu, z, "R"), digits)


def ratio_low(nu, z, digits: int = DIGITS):
    """R_nu(z) for 0 <= nu < 1/2 as well, including orders so small that nu - 1 is not
    representable at the working precision of ratio() (there -1 + 5e-324 rounds to -1):
    nu = 0 from I_0 / I_1 (I_{-1} = I_1); nu < 1e-40 at z >= 1e-3 from R_0, since
    |d log R / d nu| <= 4 / z^2 there (R = z / (2 nu + z R_{nu+1})), a relative change below
    1e-33; at smaller z by mpmath's besseli at 420 digits, which hold nu - 1 exactly."""
    nu, z = _check_args(nu, z, 0.0)
    if nu >= 1e-40:
        return ratio(nu, z, digits, allow_below_half=True)
    if nu == 0.0 or z >= 1e-3:
        with mp.workdps(digits + _GUARD):
            return +(mpmath.besseli(0, mpf(z)) / mpmath.besseli(1, mpf(z)))
    with mp.workdps(420):
        r = mpmath.besseli(mpf(nu), mpf(z)) / mpmath.besseli(mpf(nu) - 1, mpf(z))
    return r


def ratio_c(nu, z, digits: int = DIGITS):
    """C_nu(z) = 1 - R_nu(z) without cancellation; relative error <= 10^-digits."""
    nu, z = _check_args(nu, z, 0.5)
    return _adaptive(_ratio_fn(nu, z, "C"), digits)


def dlog_iv(nu, z, digits: int = DIGITS):
    """d/dz log I_nu(z) = R_{nu+1}(z) + nu/z (no cancellation)."""
    nu, z = _check_args(nu, z, 0.0)
    ex = _extra_digits(nu + 1, z)

    def fn(dps):
        with mp.workdps(dps + ex):
            r, _, lr, _ = _ratio_parts(mpf(nu) + 1, z, dps)
            q = mpf(nu) / mpf(z)
            v = r + q
        return +v, lr  # two positive terms

    return _adaptive(fn, digits)


def dlog_ive(nu, z, digits: int = DIGITS):
    """d/dz (log I_nu(z) - z) = nu/z - C_{nu+1}(z), precision raised across its zero."""
    nu, z = _check_args(nu, z, 0.0)
    ex = _extra_digits(nu + 1, z)

    def fn(dps):
        with mp.workdps(dps + ex):
            r, c, _, _ = _ratio_parts(mpf(nu) + 1, z, dps)
            q = mpf(nu) / mpf(z)
            v = q - c
        # C carries absolute error ~ r 10^-dps, q relative 10^-dps
        return +v, _lost(v, r, q)

    return _adaptive(fn, digits)


def dratio(nu, z, digits: int = DIGITS):
    """dR_nu/dz = C (2 - C) - (2 nu - 1)(1 - C) / z, precision raised for z >> nu."""
    nu, z = _check_args(nu, z, 0.5)
    if nu == 0.5:
        with mp.workdps(digits + _GUARD):
            return +mpmath.sech(mpf(z)) ** 2

    def fn(dps):
        ex = _extra_digits(nu, z)
        with mp.workdps(dps + ex):
            r, c, _, _ = _ratio_parts(nu, z, dps)
            a = c * (2 - c)
            b = (2 * mpf(nu) - 1) * r / mpf(z)
            v = a - b
        # C has absolute error ~ r 10^-dps (so a: 2 r 10^-dps), b relative 10^-dps
        return +v, _lost(v, 2 * r, b)

    return _adaptive(fn, digits)


# ---------------------------------------------------------------------------
# error measures


def ulp(x: float, bits: int = 53, emin: int = -1022) -> float:
    """The spacing of the floating-point numbers at |x| (binary64 by default)."""
    x = abs(float(x))
    if x == 0.0 or not math.isfinite(x):
        return math.ldexp(1.0, emin - bits + 1)
    e = math.frexp(x)[1] - 1  # x in [2^e, 2^(e+1))
    return math.ldexp(1.0, max(e, emin) - bits + 1)


def ulp_error(ours: float, ref, bits: int = 53, emin: int = -1022) -> float:
    """|ours - ref| in units of the spacing of floats at ref (the exact value)."""
    ours = float(ours)
    if not math.isfinite(ours):
        return float("inf")
    with mp.workdps(60):
        refm = mpf(ref)
        if refm == 0:
            return abs(ours) / ulp(0.0, bits, emin)
        # ulp of the exact value: 2^(floor(log2|ref|) - bits + 1), floored at the subnormal step
        e = int(mpmath.floor(mpmath.log(abs(refm), 2)))
        u = mpmath.ldexp(mpf(1), max(e, emin) - bits + 1)
        return float(abs(mpf(ours) - refm) / u)


def log_error(ours: float, ref) -> float:
    """|ours - ref| / (eps max(1, |ref|)) with eps = 2^-52 (the log_bessel_iv measure)."""
    ours = float(ours)
    if not math.isfinite(ours):
        return float("inf")
    with mp.workdps(60):
        refm = mpf(ref)
        return float(abs(mpf(ours) - refm) / (mpf(2) ** -52 * max(mpf(1), abs(refm))))


def round_float32(x) -> float:
    """The float32 value nearest to the mpf x (round to nearest even), as a Python float."""
    import numpy as np

    with mp.workdps(60):
        xm = mpf(x)
        if xm == 0:
            return 0.0
        if abs(xm) > mpf(2) ** 128:
            return math.copysign(math.inf, float(xm))
        e = int(mpmath.floor(mpmath.log(abs(xm), 2)))
        step = mpmath.ldexp(mpf(1), max(e, -126) - 23)
        q = xm / step
        n = int(mpmath.nint(q))  # mpmath nint rounds half to even
        y = float(mpmath.ldexp(mpf(n), max(e, -126) - 23))
        return float(np.float32(y))  # exact (or overflow to inf)


def bound5(nu, z, alpha):
    """B_alpha(nu, z) of Ruiz-Antolin and Segura's theorem 5 (alpha = 0: upper bound, alpha = 2:
    lower bound; their mean is eq. (33)) at the current mpmath precision, nu and z mpf."""
    lam = nu + mpf(alpha - 1) / 2
    delta = (nu - mpf(1) / 2) + lam / (2 * mpmath.sqrt(lam * lam + z * z))
    return z / (delta + mpmath.sqrt(delta * delta + z * z))


def ratio_bounds(nu, z, theorem: int, dps: int = 60):
    """(lower, upper): the formulas of Ruiz-Antolin and Segura's bounds on R_nu(z), theorem 4 or 5,
    evaluated in mpmath at `dps` digits and rationalised where they cancel -- the reference for how
    well a floating-point evaluation computes the formulas (not for the ratio itself)."""
    with mp.workdps(dps):
        nu, z = mpf(nu), mpf(z)
        if theorem == 4:
            def b4(c):
                h = mpmath.sqrt((nu + c) ** 2 + z * z)
                return z / ((nu - c) + h) if nu >= c else (h + (c - nu)) / (4 * c * nu / z + z)

            return b4(mpf(1) / 2), b4(mpf(1))

        return bound5(nu, z, 2), bound5(nu, z, 0)
