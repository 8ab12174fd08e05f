#!/usr/bin/env python3
"""Dense accuracy sweep of vmfdist.special against the mpmath references (tests/reference.py).

Writes docs/accuracy.md (tables of max and median error per function and regime) and
docs/accuracy.json (every figure, the worst point of each cell, the grid and the command).

    python -m benchmarks.accuracy                 # default: about 12000 float64 + 3000 float32 points (~15 min)
    python benchmarks/accuracy.py --points 2000   # a quicker, coarser sweep
    python -m benchmarks.accuracy --workers 2     # reference values in 2 processes

The grid is deterministic (orders on a log scale plus 0, 1/2, 1, integers, half-integers
and the algorithms' switch points up to 1e6; arguments log-spaced from the smallest
subnormal to DBL_MAX, denser in [1e-3, 1e8], plus points at the turning point z ~ nu and
around z ~ nu^2 for every order), with seeded random points added (--seed).  The
extension must be built (``python setup.py build_ext --inplace``).
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shlex
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from tests import reference as R  # noqa: E402

DBL_MAX = float(np.finfo(np.float64).max)
DBL_MIN = float(np.finfo(np.float64).tiny)
DBL_TRUE_MIN = 5e-324
F32_MAX = float(np.finfo(np.float32).max)
F32_MIN = float(np.finfo(np.float32).tiny)
F32_TRUE_MIN = float(np.float32(1.4e-45))

# ---------------------------------------------------------------------------
# targets (issue #2), in the units of each row

TARGETS = {
    "bessel_iv_ratio": 4.0,
    "bessel_iv_ratio_c": 10.0,
    "log_bessel_iv": 4.0,
    "log_bessel_ive": 4.0,
    "d/dz bessel_iv_ratio": 10.0,
    "-d/dz bessel_iv_ratio_c": 10.0,
    "d/dz log_bessel_iv": 10.0,
    "d/dz log_bessel_ive": 10.0,
}
F32_TARGET = 2.0
UNITS = {
    "bessel_iv_ratio": "ulp",
    "bessel_iv_ratio_c": "ulp",
    "log_bessel_iv": "eps·max(1,|log I|)",
    "log_bessel_ive": "eps·max(1,|log I − z|)",
    "d/dz bessel_iv_ratio": "ulp",
    "-d/dz bessel_iv_ratio_c": "ulp",
    "d/dz log_bessel_iv": "ulp",
    "d/dz log_bessel_ive": "ulp",
}
VALUE_FUNCS = ["bessel_iv_ratio", "bessel_iv_ratio_c", "log_bessel_iv", "log_bessel_ive"]
GRAD_FUNCS = ["d/dz bessel_iv_ratio", "-d/dz bessel_iv_ratio_c", "d/dz log_bessel_iv", "d/dz log_bessel_ive"]
REGIMES = ["small z", "large z", "large order", "turning point", "moderate"]
REGIME_TEXT = {
    "small z": "z < 1e-3",
    "large z": "z ≥ 100·max(ν,1)² (Hankel's regime and beyond), z ≥ 1e-3",
    "large order": "ν ≥ 1000, otherwise",
    "turning point": "1 ≤ ν < 1000, ν/2 ≤ z ≤ 2ν",
    "moderate": "everything else",
}


def regime(nu: float, z: float) -> str:
    if z < 1e-3:
        return "small z"
    if z >= 100.0 * max(nu, 1.0) ** 2:
        return "large z"
    if nu >= 1000.0:
        return "large order"
    if nu >= 1.0 and 0.5 * nu <= z <= 2.0 * nu:
        return "turning point"
    return "moderate"


# ---------------------------------------------------------------------------
# the grid

SPECIAL_NU = [0.0, 1e-300, 1e-8, 1e-3, 0.25, 0.5, 0.5 + 2**-52, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 5.5,
              7.5, 7.999, 8.0, 10.0, 10.5, 11.999, 12.0, 12.5, 15.0, 19.999, 20.0, 20.5, 29.5, 30.0, 50.0, 63.5, 64.0,
              100.0, 100.5, 127.5, 128.0, 500.0, 999.5, 1000.0, 1000.5, 1e4, 1e4 + 0.5, 1e5, 1e5 + 0.5, 999999.5, 1e6]


KEY_NU = [0.0, 0.5, 1.0, 1e6]


def _grid_orders(n_log: int, thin: int):
    nus = set(SPECIAL_NU[::thin]) | set(KEY_NU)
    # log-spaced, generic (not integers), 1e-3 .. 1e6
    nus.update(float(x) for x in np.logspace(-3, 6, n_log) if x <= 1e6)
    return sorted(nus)


def _grid_args(n_full: int, n_dense: int, f32: bool):
    lo, hi, tiny, big = ((F32_TRUE_MIN, F32_MAX, F32_MIN, 1e38) if f32 else (DBL_TRUE_MIN, DBL_MAX, DBL_MIN, 1e300))
    zs = set(float(x) for x in 10.0 ** np.linspace(math.log10(lo), math.log10(big), n_full))
    zs.update(float(x) for x in np.logspace(-3, 8, n_dense))
    zs.update([lo, tiny, 0.5, 1.0, 2.0, 25.0, 50.0, big, hi])
    if not f32:
        zs.update([1e-320, 1e-300, 2.0**1000 * 1.5])
    return sorted(z for z in zs if lo <= z <= hi)


def _per_order_args(nu: float, hi: float):
    out = []
    if nu > 0:
        out += [nu * f for f in (0.5, 0.9, 0.999, 1.0, 1.001, 1.1, 2.0)]
    if nu >= 1:
        out += [nu * nu * f for f in (0.1, 1.0, 10.0, 100.0)]
    return [z for z in out if 0.0 < z <= hi]


def _random_points(rng, n: int, f32: bool):
    """Seeded: orders log-uniform in [1e-3, 1e6] (a quarter integers or half-integers),
    arguments log-uniform over the whole range or near z ~ nu or z ~ nu^2."""
    lo, hi = (math.log10(F32_TRUE_MIN), math.log10(F32_MAX) - 0.01) if f32 else (-323.0, 300.0)
    pts = []
    for _ in range(n):
        nu = 10.0 ** rng.uniform(-3, 6)
        if rng.random() < 0.25:
            nu = float(np.round(2 * nu) / 2)
        kind = rng.integers(3)
        if kind == 0:
            z = 10.0 ** rng.uniform(lo, hi)
        elif kind == 1:
            z = max(nu, 1.0) * (1.0 + rng.uniform(-0.3, 0.3))
        else:
            z = max(nu, 1.0) ** 2 * 10.0 ** rng.uniform(-1.5, 1.5)
        pts.append((float(nu), float(z)))
    return pts


def build_points(n_points: int, seed: int, f32: bool):
    """About n_points (nu, z) pairs: 90% grid, 10% seeded random (float32-representable if f32)."""
    n_random = n_points // 10
    n_grid = n_points - n_random
    hi = F32_MAX if f32 else DBL_MAX
    scale = 1.0
    for _ in range(40):  # choose densities so that the grid has about n_grid points
        thin = max(1, math.ceil(1.0 / scale))
        nus = _grid_orders(max(2, int(16 * scale)), thin)
        zs = _grid_args(max(4, int(40 * scale)), max(4, int(50 * scale)), f32)
        total = sum(len(zs) + len(_per_order_args(nu, hi)) for nu in nus)
        if abs(total - n_grid) <= 0.05 * n_grid:
            break
        scale *= (n_grid / total) ** 0.5
    pts = set()
    for nu in nus:
        for z in zs + _per_order_args(nu, hi):
            pts.add((nu, z))
    for p in _random_points(np.random.default_rng(seed), n_random, f32):
        pts.add(p)
    if f32:
        with np.errstate(over="ignore", under="ignore"):
            conv = {(float(np.float32(nu)), float(np.float32(z))) for nu, z in pts}
        pts = {(nu, z) for nu, z in conv if math.isfinite(nu) and 0.0 < z <= F32_MAX and nu <= 1e6}
    return sorted(pts), {"orders": len(nus), "args_per_order": len(zs), "random": n_random}


# ---------------------------------------------------------------------------
# reference values (in worker processes when --workers > 1)

def reference_values(point, values_only=False):
    """The exact values at (nu, z), as strings (mpf repr), or the error text where the
    reference failed to certify one; values_only: no derivatives, no bounds (float32)."""
    import mpmath

    nu, z = point
    out = {}

    def put(key, fn, *args, **kw):
        try:
            # all digits (str() would round to the current mp.dps, 15)
            out[key] = mpmath.nstr(fn(*args, **kw), 50, min_fixed=1, max_fixed=0)
        except R.ReferenceError_ as e:  # reported, never hidden
            out[key] = "ReferenceError: " + str(e)[:200]

    put("log_bessel_iv", R.log_iv, nu, z)
    put("log_bessel_ive", R.log_ive, nu, z)
    if nu >= 0.5:
        put("bessel_iv_ratio", R.ratio, nu, z)
        put("bessel_iv_ratio_c", R.ratio_c, nu, z)
    if values_only:
        return out
    put("d/dz log_bessel_iv", R.dlog_iv, nu, z)
    put("d/dz log_bessel_ive", R.dlog_ive, nu, z)
    if nu >= 0.5:
        put("d/dz bessel_iv_ratio", R.dratio, nu, z)
    elif nu == 0.0 or nu >= 1e-6:  # theorem 4 bracket below 1/2 (R_nu with I_{nu-1}, nu - 1 < 0)
        put("ratio_below_half", R.ratio, nu, z, allow_below_half=True)
    return out


def compute_references(points, workers: int, label: str, values_only: bool):
    t0 = time.time()
    out = []
    if workers > 1:
        import functools
        import multiprocessing as mp

        fn = functools.partial(reference_values, values_only=values_only)
        with mp.get_context("spawn").Pool(workers) as pool:
            for i, r in enumerate(pool.imap(fn, points, chunksize=8)):
                out.append(r)
                _progress(label, i + 1, len(points), t0)
    else:
        for i, p in enumerate(points):
            out.append(reference_values(p, values_only))
            _progress(label, i + 1, len(points), t0)
    sys.stderr.write("\n")
    return out, time.time() - t0


def _progress(label, i, n, t0):
    if i % 50 == 0 or i == n:
        el = time.time() - t0
        sys.stderr.write(f"\r{label}: {i}/{n} reference points, {el:.0f} s (eta {el / i * (n - i):.0f} s)   ")
        sys.stderr.flush()


# ---------------------------------------------------------------------------
# our values


def our_values(points, dtype):
    import torch

    from vmfdist import special as S

    nu = torch.tensor([p[0] for p in points], dtype=dtype)
    z = torch.tensor([p[1] for p in points], dtype=dtype)
    ok_ratio = nu >= 0.5
    nu_r = torch.where(ok_ratio, nu, torch.ones_like(nu))
    out = {}
    with torch.no_grad():
        out["bessel_iv_ratio"] = S.bessel_iv_ratio(nu_r, z)
        out["bessel_iv_ratio_c"] = S.bessel_iv_ratio_c(nu_r, z)
        out["log_bessel_iv"] = S.log_bessel_iv(nu, z)
        out["log_bessel_ive"] = S.log_bessel_ive(nu, z)
        lo5, hi5 = S.bessel_iv_ratio_bounds(nu_r, z, theorem=5)
        lo4, hi4 = S.bessel_iv_ratio_bounds(nu, z, theorem=4)
        out.update({"lower5": lo5, "upper5": hi5, "lower4": lo4, "upper4": hi4})
    for key, fn, nus, sign in (("d/dz bessel_iv_ratio", S.bessel_iv_ratio, nu_r, 1.0),
                               ("-d/dz bessel_iv_ratio_c", S.bessel_iv_ratio_c, nu_r, -1.0),
                               ("d/dz log_bessel_iv", S.log_bessel_iv, nu, 1.0),
                               ("d/dz log_bessel_ive", S.log_bessel_ive, nu, 1.0)):
        zz = z.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(nus, zz).sum(), zz)
        out[key] = sign * g
    return {k: v.double().tolist() for k, v in out.items()}


# ---------------------------------------------------------------------------
# error measures


def _overflows(r, max_finite, bits):
    from mpmath import mp, mpf

    with mp.workdps(60):
        return abs(mpf(r)) >= mpf(max_finite) * (1 + mpf(2) ** -bits)


def error_of(name, ours, exact, f32):
    """The error in the row's unit; an exact value that overflows counts as 0 when ours is
    the correctly signed infinity (and inf otherwise)."""
    bits, emin, big = (24, -126, F32_MAX) if f32 else (53, -1022, DBL_MAX)
    if name.startswith("log_"):
        if f32:  # float32 ulps of the exact value, like every float32 row
            return R.ulp_error(ours, exact, bits, emin)
        return R.log_error(ours, exact)
    if _overflows(exact, big, bits):
        return 0.0 if (math.isinf(ours) and (ours > 0) == (exact > 0)) else math.inf
    return R.ulp_error(ours, exact, bits, emin)


# ---------------------------------------------------------------------------
# the sweep


def _summary(rows):
    """rows: list of (err, nu, z, ours, exact)."""
    if not rows:
        return None
    errs = [r[0] for r in rows]
    worst = max(rows, key=lambda r: r[0])
    return {
        "n": len(rows),
        "max": worst[0],
        "median": statistics.median(errs),
        "worst": {"nu": worst[1], "z": worst[2], "value": worst[3], "exact": worst[4]},
    }


def analyse(points, refs, ours, f32):
    from mpmath import mp, mpf

    cells = {}  # (function, regime) -> rows
    ref_failures = []
    bounds = {4: {"n": 0, "violations": [], "max_excess_ulp": -math.inf},
              5: {"n": 0, "violations": [], "max_excess_ulp": -math.inf}}
    bound_err = {}  # name -> rows of ulp error against the formula
    bits, emin = (24, -126) if f32 else (53, -1022)
    for i, ((nu, z), rv) in enumerate(zip(points, refs)):
        reg = regime(nu, z)
        rv = dict(rv)
        if "d/dz bessel_iv_ratio" in rv:  # d/dz (1 - R) = -dR/dz
            rv["-d/dz bessel_iv_ratio_c"] = rv["d/dz bessel_iv_ratio"]
        for name, exact in rv.items():
            if exact.startswith("ReferenceError"):
                ref_failures.append({"function": name, "nu": nu, "z": z, "error": exact})
                continue
            if name == "ratio_below_half":
                continue
            if f32 and name not in VALUE_FUNCS:
                continue
            with mp.workdps(60):
                ex = mpf(exact)
            o = ours[name][i]
            e = error_of(name, o, ex, f32)
            row = (e, nu, z, o, exact[:30])
            cells.setdefault((name, reg), []).append(row)
            cells.setdefault((name, "all"), []).append(row)
        if f32:
            continue
        # bounds: bracket (within 2 ulp of the exact ratio) and accuracy against their formulas
        r_key = "bessel_iv_ratio" if nu >= 0.5 else "ratio_below_half"
        r = rv.get(r_key)
        if r is None or r.startswith("ReferenceError"):
            continue
        with mp.workdps(60):
            r = mpf(r)
        for th in (5, 4) if nu >= 0.5 else (4,):
            lo, hi = ours[f"lower{th}"][i], ours[f"upper{th}"][i]
            b = bounds[th]
            b["n"] += 1
            if _overflows(r, DBL_MAX, 53):  # R_0 ~ 2/z at subnormal z
                ok = hi == math.inf
                excess = 0.0 if ok else math.inf
            else:
                u = R.ulp(float(r))
                with mp.workdps(60):
                    excess = float(max(mpf(lo) - r, r - mpf(hi)) / u) if math.isfinite(lo) and math.isfinite(
                        hi) else math.inf
                ok = excess <= 2.0
            b["max_excess_ulp"] = max(b["max_excess_ulp"], excess)
            if not ok:
                b["violations"].append({"nu": nu, "z": z, "lower": lo, "upper": hi, "exact": str(r)[:30]})
            blo, bhi = R.ratio_bounds(nu, z, th)
            for which, val, exact_b in (("lower", lo, blo), ("upper", hi, bhi)):
                e = error_of("bound", val, exact_b, False)
                bound_err.setdefault(f"theorem {th} {which}", []).append((e, nu, z, val, str(exact_b)[:30]))
    table = {}
    for (name, reg), rows in cells.items():
        table.setdefault(name, {})[reg] = _summary(rows)
    for b in bounds.values():
        b["violations"] = b["violations"][:20]
    return table, ref_failures, bounds, {k: _summary(v) for k, v in bound_err.items()}


# ---------------------------------------------------------------------------
# output


def _fmt(x):
    if x is None:
        return "–"
    if math.isinf(x):
        return "inf"
    if x == 0:
        return "0"
    if x < 0.01:
        return f"{x:.1e}"
    return f"{x:.2f}" if x < 100 else f"{x:.3g}"


def _fmt_point(w):
    return f"({w['nu']:.6g}, {w['z']:.6g})"


def render_markdown(res):
    m = res["meta"]
    L = ["# Accuracy", "", "<!-- Generated by benchmarks/accuracy.py; do not edit by hand. -->", "",
         f"Measured accuracy of {{mod}}`vmfdist.special` on the CPU (the CUDA kernels run the same host-device code) "
         f"over a dense sweep of (ν, z), against references computed with mpmath and certified to "
         f"{m['reference_digits']} significant digits (`tests/reference.py`: power series, Hankel's expansion and "
         "Olver's uniform expansion, each with an error estimate that is checked, and the precision raised wherever a "
         "derived quantity cancels).", "", "**Units.**", "",
         "- *ulp*: |ours − exact| divided by the spacing of the doubles at the exact value (2^(⌊log₂|exact|⌋ − 52), "
         "and 2^−1074 in the subnormal range). A correctly rounded result has error ≤ 0.5 ulp.",
         "- *eps·max(1,|log I|)*: |ours − exact| / (2^−52 · max(1, |exact|)) for the logarithms (an absolute error "
         "near 0, relative for large |log I|).",
         "- *float32 ulp*: the same in the float32 format (2^(e − 23), subnormal step 2^−149), against the exact "
         "value, for every float32 row (float32 results are computed in float64 and rounded once, so they should be "
         "within 0.5 ulp plus the float64 error).",
         "- An exact value beyond the largest finite number counts as error 0 when the result is the correctly "
         "signed infinity.", "",
         f"**Targets** (issue #2): ratio ≤ 4 ulp, 1 − R ≤ 10 ulp, logarithms ≤ 4 eps·max(1,|log I|), z-derivatives ≤ "
         f"10 ulp, float32 ≤ {F32_TARGET:g} float32 ulp.  A bold maximum misses its target.", "",
         "**Regimes** (each point belongs to the first that applies):", ""]
    L += [f"- *{reg}*: {REGIME_TEXT[reg]}" for reg in REGIMES]
    L += ["", "**Grid.** " + m["grid_text"], "",
          f"Generated {m['date']} by `{m['command']}` (git {m['git']}, torch {m['torch']}, mpmath {m['mpmath']}; "
          f"{m['seconds']:.0f} s with {m['workers']} worker(s)).  Every figure, with the worst point of each cell, "
          "is in `docs/accuracy.json`.", ""]
    for title, names, dt, f32 in (("float64 values", VALUE_FUNCS, "float64", False),
                                  ("float64 derivatives with respect to z (autograd)", GRAD_FUNCS, "float64", False),
                                  ("float32 values", VALUE_FUNCS, "float32", True)):
        t = H.Table("function", "unit", "target", "regime", "points", "max", "median", "worst at (ν, z)",
                    right=(4, 5, 6))
        for name in names:
            target, unit = (F32_TARGET, "float32 ulp") if f32 else (TARGETS[name], UNITS[name])
            for reg in ["all"] + REGIMES:
                c = res[dt].get(name, {}).get(reg)
                if c is not None:
                    mx = _fmt(c["max"]) if c["max"] <= target else f"**{_fmt(c['max'])}**"
                    top = reg == "all"  # a pipe ends a cell
                    t.add(f"`{name}`" if top else "", unit.replace("|", "\\|") if top else "",
                          f"{target:g}" if top else "", "**all**" if top else reg, c["n"], mx, _fmt(c["median"]),
                          _fmt_point(c["worst"]))
        L += [f"## {title}", "", str(t)]
    t = H.Table("theorem", "points", "violations", "max excess (ulp)", right=(1, 2, 3))
    for th in ("5", "4"):
        b = res["bounds"][th]
        t.add(th, b["n"], len(b["violations"]), f"{b['max_excess_ulp']:.3g}")
    L += ["## Bounds (`bessel_iv_ratio_bounds`)", "",
          "Bracket: the lower bound must not exceed the exact ratio, nor the upper bound fall below it, by more than "
          "2 ulp (of the exact ratio). *excess* is the largest of (lower − R) and (R − upper) in ulp: negative means "
          "strictly inside.", "", str(t),
          "Accuracy of the computed bounds against their own formulas (evaluated in mpmath), in ulp: correctly "
          "rounded (double-double) for orders up to 2^500 and arguments in [2^-500, 2^500], in double with hypot "
          "beyond (docs/special.md):", ""]
    t = H.Table("bound", "points", "max", "median", "worst at (ν, z)", right=(1, 2, 3))
    for k, c in sorted(res["bound_formulas"].items()):
        t.add(k, c["n"], _fmt(c["max"]), _fmt(c["median"]), _fmt_point(c["worst"]))
    fails = res["reference_failures"]
    L += [str(t), f"Reference failures (points where mpmath could not certify a value, left out above): {len(fails)}.",
          ""]
    L += [f"- {f['dtype']} `{f['function']}` at ν = {f['nu']!r}, z = {f['z']!r}: {f['error']}" for f in fails[:20]]
    return "\n".join(L + ([""] if fails else []))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, default=12000, help="about this many float64 points (default 12000, ~15 min "
                   "on one core)")
    p.add_argument("--points32", type=int, default=None, help="float32 points (default points/4)")
    p.add_argument("--seed", type=int, default=20240531, help="seed of the random points")
    p.add_argument("--workers", type=int, default=1, help="processes computing references (default 1)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs"), help="folder for accuracy.md / accuracy.json")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--report", action="store_true", help="only re-render <out>/accuracy.md from its JSON")
    args = p.parse_args(argv)
    if args.report:
        res = H.load_json(os.path.join(args.out, "accuracy.json"))
        return H.write_report("accuracy", res, render_markdown, args.out, finish=False)
    import mpmath
    import torch

    torch.set_num_threads(args.threads)
    t_start = time.time()
    res, grid_info, all_fail = {"float64": {}, "float32": {}}, {}, []
    for label, f32, n in (("float64", False, args.points), ("float32", True, args.points32 or args.points // 4)):
        points, info = build_points(n, args.seed, f32)
        refs, secs = compute_references(points, args.workers, label, f32)
        grid_info[label] = dict(info, points=len(points), reference_seconds=round(secs, 1))
        res[label], fails, bounds, bform = analyse(points, refs, our_values(points, torch.float32 if f32 else
                                                                            torch.float64), f32)
        all_fail += [dict(f, dtype=label) for f in fails]
        if not f32:
            res["bounds"], res["bound_formulas"] = {str(k): v for k, v in bounds.items()}, bform
    res["reference_failures"] = all_fail
    g64, g32 = grid_info["float64"], grid_info["float32"]
    grid_text = (
        f"{g64['points']} float64 points: {g64['orders']} orders ν (0, 1e-300, 1e-8, 1/2, 1/2 + 2⁻⁵², 3/4, integers "
        f"and half-integers, the algorithms' switch points 8, 12, 20, 30 and their neighbours, up to 1e6, plus generic "
        f"orders log-spaced in [1e-3, 1e6]) × {g64['args_per_order']} arguments z (log-spaced from 5e-324 through "
        f"1e300, denser in [1e-3, 1e8], plus 2^1000·1.5 and DBL_MAX) and, for each order, z = ν·(0.5, 0.9, 0.999, 1, "
        f"1.001, 1.1, 2) and z = ν²·(0.1, 1, 10, 100); plus {g64['random']} seeded random points (seed {args.seed}; ν "
        f"log-uniform in [1e-3, 1e6], a quarter rounded to half-integers; z log-uniform over the whole range, near ν, "
        f"or near ν²).  The ratio rows use the points with ν ≥ 1/2.  {g32['points']} float32 points from the same "
        f"construction rounded to float32 (z from 1.4e-45 to FLT_MAX).")
    res["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m benchmarks.accuracy"] + [shlex.quote(a) for a in (
            sys.argv[1:] if argv is None else argv)]),
        "git": H.git_rev(), "torch": torch.__version__, "mpmath": mpmath.__version__,
        "python": platform.python_version(), "machine": platform.machine(), "reference_digits": R.DIGITS,
        "workers": args.workers, "seconds": round(time.time() - t_start, 1), "grid": grid_info,
        "grid_text": grid_text, "targets": dict(TARGETS, float32=F32_TARGET), "units": UNITS,
        "regimes": REGIME_TEXT}
    print(open(H.write_report("accuracy", res, render_markdown, args.out)).read())
    return res


if __name__ == "__main__":
    main()
