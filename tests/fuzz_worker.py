"""Fuzz cases over every public op, one case group per process.

Run by tests/test_fuzz.py as ``python -m tests.fuzz_worker GROUP EXAMPLES`` in a subprocess
with a timeout, so that a hang fails that test instead of stalling the run, and a crash
(a signal) fails it with the signal in the return code.  Each group draws its inputs with
hypothesis (derandomised, no example database) from strategies that include the extremes
(0, subnormals, 1e-300, 1e308, DBL_MAX, inf, NaN, negative values, orders up to DBL_MAX)
and checks, for every result, either the documented NaN (out of the domain) or the
documented convention (boundary values), or agreement with an mpmath reference
(tests/reference.py and the formulas below, independent of our code) within the
documented tolerance; samplers must return unit vectors (or NaN rows where the
parameters are invalid) and finite values.  Exit status 0 when every case passes.
"""
from __future__ import annotations

import math
import sys
import time

import mpmath
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mpmath import mp, mpf

from vmfdist import special as S
from vmfdist.distributions import Radial, VonMisesFisher, radial_noise
from vmfdist.linalg import kron_eigen_matvec, kron_eigen_sample

from . import reference as ref

DBL_MAX = 1.7976931348623157e308
INF = math.inf
NAN = math.nan
EPS = 2.0 ** -52

# the documented tolerances (docs/accuracy.md, tests/test_special.py)
TOL_RATIO = 4.0     # ulp, nu >= 1/2
TOL_RATIO_LOW = 8.0  # ulp, 0 <= nu < 1/2 (the recurrence adds a division and a sum)
TOL_RATIO_C = 10.0  # ulp
TOL_LOG = 4.0       # eps max(1, |log I|)
TOL_GRAD = 10.0     # ulp

POS_EXTREMES = [0.0, 5e-324, 1e-310, 2.2250738585072014e-308, 1e-300, 1e-160, 1e-45, 1e-8, 0.25, 0.5,
                0.5 + 2.0 ** -52, 1.0, 1.5, 12.0, 20.0, 50.0, 1e6, 2.0 ** 53, 1e154, 1e180, 1e300, 2.0 ** 1000,
                1.5 * 2.0 ** 1000, 1e305, 1e307, 1e308, DBL_MAX]
BAD = [-5e-324, -1.0, -1e300, -INF, NAN]


def log_uniform(lo, hi):
    # log2(DBL_MAX) rounds to 1024.0 and 2.0 ** 1024.0 raises OverflowError in Python, while a
    # float product overflows to inf (clamped to hi); a product that underflows clamps to lo
    return st.floats(math.log2(lo), math.log2(hi)).map(lambda e: min(hi, max(lo, 2.0 ** (e - 1.0) * 2.0)))


finite_pos = st.one_of(st.sampled_from([x for x in POS_EXTREMES if x > 0]), log_uniform(5e-324, DBL_MAX),
                       st.floats(1e-3, 100.0))
order = st.one_of(st.sampled_from(POS_EXTREMES), log_uniform(1e-300, DBL_MAX), st.floats(0.0, 60.0),
                  st.integers(0, 400).map(lambda k: k / 2))
any_value = st.one_of(st.sampled_from(POS_EXTREMES + BAD + [INF]), st.floats(allow_nan=True, allow_infinity=True))

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck), print_blob=False)


def t(x):
    return torch.tensor([x], dtype=torch.float64)


def val(fn, nu, z):
    return fn(t(nu), t(z)).item()


def dz(fn, nu, z):
    zt = t(z).requires_grad_(True)
    (g,) = torch.autograd.grad(fn(t(nu), zt).sum(), zt)
    return g.item()


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def fail(msg):
    raise AssertionError(msg)


# ---------------------------------------------------------------------------
# special functions: the domain and the conventions (cheap; no references)

def expected_edge(name, nu, z):
    """The documented value where it is a convention (NaN outside the domain, the z = 0 and
    z = inf and nu = inf rows of docs/special.md), or None where a reference is needed."""
    low = {"ratio": 0.0, "ratio_c": 0.5, "log_iv": 0.0, "log_ive": 0.0}[name]
    if math.isnan(nu) or math.isnan(z) or nu < low or z < 0:
        return NAN
    if math.isinf(nu):
        if math.isinf(z):
            return NAN
        return {"ratio": 0.0, "ratio_c": 1.0, "log_iv": -INF, "log_ive": -INF}[name]
    if z == 0:
        if name == "ratio":
            return INF if nu == 0 else 0.0
        if name == "ratio_c":
            return 1.0
        return 0.0 if nu == 0 else -INF
    if math.isinf(z):
        return {"ratio": 1.0, "ratio_c": 0.0, "log_iv": INF, "log_ive": -INF}[name]
    return None


FUNCS = {"ratio": S.bessel_iv_ratio, "ratio_c": S.bessel_iv_ratio_c, "log_iv": S.log_bessel_iv,
         "log_ive": S.log_bessel_ive}


def check_reference(name, nu, z, ours):
    if name == "ratio":
        r = ref.ratio_low(nu, z)
        err, tol = ref.ulp_error(ours, r), (TOL_RATIO if nu >= 0.5 else TOL_RATIO_LOW)
    elif name == "ratio_c":
        r = ref.ratio_c(nu, z)
        err, tol = ref.ulp_error(ours, r), TOL_RATIO_C
    elif name == "log_iv":
        r = ref.log_iv(nu, z)
        err, tol = ref.log_error(ours, r), TOL_LOG
    else:
        r = ref.log_ive(nu, z)
        err, tol = ref.log_error(ours, r), TOL_LOG
    if math.isinf(ours) and abs(r) > DBL_MAX:  # the exact value overflows: +-inf is right
        if (ours > 0) == (r > 0):
            return
    if not err <= tol:
        fail(f"{name}({nu!r}, {z!r}) = {ours!r}, mpmath {mpmath.nstr(r, 20)} ({err:.3g} > {tol})")


def check_grad_reference(name, nu, z):
    if name == "ratio":
        if nu < 0.5:
            return  # derivative below 1/2: checked against mpmath in tests/test_extremes.py
        ours, r = dz(S.bessel_iv_ratio, nu, z), ref.dratio(nu, z)
    elif name == "log_iv":
        ours, r = dz(S.log_bessel_iv, nu, z), ref.dlog_iv(nu, z)
    elif name == "log_ive":
        ours, r = dz(S.log_bessel_ive, nu, z), ref.dlog_ive(nu, z)
    else:
        return
    if math.isinf(ours) and abs(r) > DBL_MAX and (ours > 0) == (r > 0):
        return
    err = ref.ulp_error(ours, r)
    if not err <= TOL_GRAD:
        fail(f"d/dz {name}({nu!r}, {z!r}) = {ours!r}, mpmath {mpmath.nstr(r, 20)} ({err:.3g} ulp > {TOL_GRAD})")


def special_conventions(n):
    """Every pair of extremes and bad values through every special function: NaN or the
    documented convention wherever one applies, and never a hang or a crash."""
    values = POS_EXTREMES + BAD + [INF]
    nu = torch.tensor([a for a in values for _ in values], dtype=torch.float64)
    z = torch.tensor([b for _ in values for b in values], dtype=torch.float64)
    for name, fn in FUNCS.items():
        out = fn(nu, z).tolist()
        for a, b, o in zip(nu.tolist(), z.tolist(), out):
            e = expected_edge(name, a, b)
            if e is not None and not same(o, e):
                fail(f"{name}({a!r}, {b!r}) = {o!r}, documented {e!r}")
            if e is None and math.isnan(o):
                fail(f"{name}({a!r}, {b!r}) = NaN inside the domain")
    lo, hi = S.bessel_iv_ratio_bounds(nu, z)
    lo4, hi4 = S.bessel_iv_ratio_bounds(nu, z, theorem=4)
    ap = S.bessel_iv_ratio_approx(nu, z)
    asym = S.log_bessel_iv_asymptotic(nu, z)
    for i, (a, b) in enumerate(zip(nu.tolist(), z.tolist())):
        for (l, h, low, what) in ((lo[i].item(), hi[i].item(), 0.5, "theorem 5"),
                                  (lo4[i].item(), hi4[i].item(), 0.0, "theorem 4")):
            if math.isnan(a) or math.isnan(b) or a < low or b < 0 or (math.isinf(a) and math.isinf(b)):
                if not (math.isnan(l) and math.isnan(h)):
                    fail(f"bounds ({what}) at ({a!r}, {b!r}) = ({l!r}, {h!r}), documented NaN")
            elif not (0.0 <= l <= h and (l <= 1.0 or a < 0.5)):
                # (theorem 4 bounds R_nu, which exceeds 1 below nu = 1/2 -- R_0 ~ 2/z -- and its upper
                # bound exceeds 1 for nu < 1)
                fail(f"bounds ({what}) at ({a!r}, {b!r}) = ({l!r}, {h!r}): not 0 <= lower <= upper")
        x = ap[i].item()
        if not (math.isnan(a) or math.isnan(b) or a < 0.5 or b < 0 or (math.isinf(a) and math.isinf(b))):
            if not (lo[i].item() <= x <= hi[i].item()):
                fail(f"bessel_iv_ratio_approx({a!r}, {b!r}) = {x!r} outside its bounds")
        elif not math.isnan(x):
            fail(f"bessel_iv_ratio_approx({a!r}, {b!r}) = {x!r}, documented NaN")
        y = asym[i].item()
        if math.isnan(a) or math.isnan(b) or a < 0 or b < 0 or (math.isinf(a) and math.isinf(b)):
            if not math.isnan(y):
                fail(f"log_bessel_iv_asymptotic({a!r}, {b!r}) = {y!r}, documented NaN")
        elif math.isnan(y):
            fail(f"log_bessel_iv_asymptotic({a!r}, {b!r}) = NaN inside the domain")
    # eq. (45): NaN above the documented order limit, never a hang
    big = torch.tensor([2.0 ** 20 + 1, 1e9, 2.0 ** 53, 1e300, INF, NAN, -1.0], dtype=torch.float64)
    out = S.log_bessel_iv_series(big, torch.ones_like(big))
    if not torch.isnan(out).all():
        fail(f"log_bessel_iv_series above its order limit: {out.tolist()}, documented NaN")


def special_reference(n):
    """Hypothesis pairs (nu, z) over the whole finite range against mpmath."""

    @settings(max_examples=n, **SETTINGS)
    @given(st.sampled_from(sorted(FUNCS)), order, finite_pos)
    def prop(name, nu, z):
        ours = val(FUNCS[name], nu, z)
        if expected_edge(name, nu, z) is not None:
            return
        check_reference(name, nu, z, ours)
        check_grad_reference(name, nu, z)

    prop()


def _approx_mp(nu, z):
    """eq. (33) at mpmath precision: the mean of theorem 5's bounds."""
    return (ref.bound5(nu, z, 2) + ref.bound5(nu, z, 0)) / 2


def papers_reference(n):
    """The papers' formulas (eqs. 33, 44, 45) against their mpmath evaluation."""

    @settings(max_examples=n, **SETTINGS)
    @given(order, finite_pos)
    def prop(nu, z):
        with mp.workdps(60):
            nm, zm = mpf(nu), mpf(z)
            if nu >= 0.5:
                ours = val(S.bessel_iv_ratio_approx, nu, z)
                r = _approx_mp(nm, zm)
                if not ref.ulp_error(ours, r) <= 8.0:
                    fail(f"bessel_iv_ratio_approx({nu!r}, {z!r}) = {ours!r}, mpmath {mpmath.nstr(r, 20)}")
            ours = val(S.log_bessel_iv_asymptotic, nu, z)
            if z < nu:
                eta = (nm + mpf(1) / 2) / (2 * (nm + 1))
                terms = [nm * mpmath.log(zm), eta * zm, (eta + nm) * mpmath.log(2), mpmath.loggamma(nm + 1)]
                r = terms[0] + terms[1] - terms[2] - terms[3]
            else:
                terms = [zm, mpmath.log(zm) / 2, mpmath.log(2 * mpmath.pi) / 2]
                r = terms[0] - terms[1] - terms[2]
            scale = max(abs(x) for x in terms)
            if abs(r) > DBL_MAX:
                if not (math.isinf(ours) and (ours > 0) == (r > 0)):
                    fail(f"log_bessel_iv_asymptotic({nu!r}, {z!r}) = {ours!r}, mpmath {mpmath.nstr(r, 20)}")
            elif not abs(mpf(ours) - r) <= 8 * EPS * max(1, scale):
                fail(f"log_bessel_iv_asymptotic({nu!r}, {z!r}) = {ours!r}, mpmath {mpmath.nstr(r, 20)}")
            if nu <= 300:
                ours = val(S.log_bessel_iv_series, nu, z)
                k = math.floor(nu)
                parts = [ref.log_iv(nu - k, z)] + [mpmath.log(_approx_mp(nm - j, zm)) for j in range(k)]
                r = sum(parts)
                tol = EPS * (4 * sum(abs(p) for p in parts) + 8 * k + 4)
                if not abs(mpf(ours) - r) <= tol:
                    fail(f"log_bessel_iv_series({nu!r}, {z!r}) = {ours!r}, mpmath {mpmath.nstr(r, 20)}")

    prop()


# ---------------------------------------------------------------------------
# samplers and the Kronecker ops, through the public API

def _rows_ok(x, what):
    """Every row a unit vector (to 8 eps of the dtype times sqrt(d)), or entirely NaN."""
    tol = 8 * torch.finfo(x.dtype).eps * max(1, x.shape[-1]) ** 0.5
    x = x.reshape(-1, x.shape[-1]).double()
    nan_rows = torch.isnan(x).all(-1)
    good = x[~nan_rows]
    if not torch.isfinite(good).all():
        fail(f"{what}: non-finite entries in a sample row that is not all NaN")
    if good.numel():
        err = (torch.linalg.vector_norm(good, dim=-1) - 1).abs().max().item()
        if err > tol:
            fail(f"{what}: sample norms off by {err:.3g}")
    return nan_rows


KAPPAS = [0.0, 5e-324, 1e-300, 1e-8, 1.0, 1e3, 1e8, 1e154, 1e300, DBL_MAX, INF]
BAD_KAPPAS = [-5e-324, -1.0, -1e8, -1e10, -1e300, -INF, NAN]
LOCS = [[1.0, 0.0], [1e300, 1e300], [1e-200, 0.0], [5e-324, 0.0], [-1.0, 1e-300], [DBL_MAX, DBL_MAX],
        [0.6, 0.8]]


def vmf_samples(n):
    """vMF samples for every kappa extreme, bad kappa and badly scaled loc, d in 2, 3, 4, 7, 33:
    unit vectors, or NaN rows exactly where kappa < 0 or NaN (or loc is zero/inf/NaN)."""

    @settings(max_examples=n, **SETTINGS)
    @given(st.sampled_from([2, 3, 4, 7, 33]), st.one_of(st.sampled_from(KAPPAS + BAD_KAPPAS), any_value),
           st.sampled_from(LOCS), st.sampled_from([torch.float64, torch.float32]))
    def prop(d, kappa, loc2, dtype):
        loc = torch.zeros(d, dtype=torch.float64)
        loc[0], loc[-1] = loc2[0], loc2[1] if d > 1 else 0.0
        loc = loc.to(dtype)
        k = torch.tensor(kappa, dtype=dtype)
        x = VonMisesFisher(loc, k, validate_args=False).rsample((4,))
        nan_rows = _rows_ok(x, f"vMF d={d} kappa={kappa!r} loc={loc2} {dtype}")
        loc_ok = bool(torch.isfinite(loc).all()) and bool((loc != 0).any())
        invalid = not (k.item() >= 0) or not loc_ok
        if invalid != bool(nan_rows.all()) or bool(nan_rows.any()) != bool(nan_rows.all()):
            fail(f"vMF d={d} kappa={kappa!r} loc={loc2} {dtype}: NaN rows {nan_rows.tolist()}, "
                 f"expected {'all' if invalid else 'none'}")

    prop()


def radial_and_kron(n):
    """Radial samples and the Kronecker ops over extreme scales: finite output for finite
    input, the radial direction a unit vector, kron_eigen_matvec equal to the dense product."""

    @settings(max_examples=n, **SETTINGS)
    @given(st.integers(1, 6), st.integers(1, 6), st.sampled_from([0.0, 5e-324, 1e-300, 1e-8, 1.0, 1e8, 1e150]),
           st.booleans())
    def prop(rows, cols, s, rowwise):
        loc = torch.zeros(rows, cols, dtype=torch.float64)
        scale = torch.full((rows, cols), s, dtype=torch.float64)
        w = radial_noise(loc, scale, (3,), rowwise=rowwise)
        if not torch.isfinite(w).all():
            fail(f"radial_noise scale={s!r} {rows}x{cols}: non-finite samples")
        if s in (1.0, 1e8):
            v = (w / s).reshape(3, rows, cols) if rowwise else (w / s).reshape(3, -1)
            r = torch.linalg.vector_norm(v, dim=-1)  # |r| per row or per sample: half-normal, finite
            if not (torch.isfinite(r).all() and (r >= 0).all()):
                fail("radial_noise: radius not finite")
        Radial(loc, torch.ones_like(loc)).rsample((2,))
        g = torch.Generator().manual_seed(rows * 7 + cols)
        qo = torch.linalg.qr(torch.randn(rows, rows, dtype=torch.float64, generator=g))[0]
        qi = torch.linalg.qr(torch.randn(cols, cols, dtype=torch.float64, generator=g))[0]
        sc = torch.rand(rows, cols, dtype=torch.float64, generator=g) + 0.5
        v = torch.randn(rows, cols, dtype=torch.float64, generator=g) * (s if s > 0 else 1.0)
        ours = kron_eigen_matvec(qo, qi, sc, v)
        dense = qo @ ((qo.T @ v @ qi) * sc) @ qi.T
        if not torch.allclose(ours, dense, rtol=1e-12, atol=1e-300):
            fail(f"kron_eigen_matvec differs from the dense product at scale {s!r}")
        smp = kron_eigen_sample(v, qo, qi, sc, (2,))
        if not torch.isfinite(smp).all():
            fail("kron_eigen_sample: non-finite samples")

    prop()


def _hang(n):
    """Never returns: tests/test_fuzz.py checks that its harness reports this as a failure."""
    while True:
        time.sleep(1)


GROUPS = {
    "_hang": _hang,
    "special_conventions": special_conventions,
    "special_reference": special_reference,
    "papers_reference": papers_reference,
    "vmf_samples": vmf_samples,
    "radial_and_kron": radial_and_kron,
}


def main(argv):
    group, n = argv[1], int(argv[2])
    torch.manual_seed(0)
    GROUPS[group](n)
    print(f"{group}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
