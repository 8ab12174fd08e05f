#!/usr/bin/env python3
"""Measure how far the papers' Bessel-ratio approximations are from the truth.

Needs only mpmath (no compiled extension).  For each order nu it scans z over a
log-spaced grid and reports, against the exact ratio R_nu(z) = I_nu(z)/I_{nu-1}(z)
computed by mpmath at 50 digits:

* the maximum relative error of the papers' approximation (B_2 + B_0)/2
  (Ruiz-Antolin--Segura theorem 5, eq. 13/29/33 of the radial--directional paper)
  and the z where it occurs;
* the same for the theorem 4 midpoint (eq. 28/32);
* the largest absolute gap B_0 - B_2 between the theorem 5 bounds (the paper
  claims it is below e^-10 "even in low dimensions");
* a check that B_2 <= R <= B_0 holds at every grid point.

The maximum of the relative error of (B_2 + B_0)/2 is refined by a golden-section
search between the neighbours of the best grid point.

It also reports the maximum absolute error of the two log I approximations
(eq. 44 and eq. 45) over the same grid.

Usage:  python docs/scripts/approx_error.py [--points N] [--markdown]
The numbers quoted in docs/special.md come from the default settings.
"""
from __future__ import annotations

import argparse

import mpmath as mp

mp.mp.dps = 50

ORDERS = [0.5, 1.0, 1.5, 2.0, 5.0, 10.0, 50.0, 100.0]


def ratio(nu, z):
    return mp.besseli(nu, z) / mp.besseli(nu - 1, z)


def segura_b(nu, z, alpha):
    lam = nu + (alpha - 1) / mp.mpf(2)
    delta = (nu - mp.mpf(1) / 2) + lam / (2 * mp.sqrt(lam**2 + z**2))
    return z / (delta + mp.sqrt(delta**2 + z**2))


def thm4(nu, z):
    lo = z / (nu - mp.mpf(1) / 2 + mp.sqrt((nu + mp.mpf(1) / 2) ** 2 + z**2))
    hi = z / (nu - 1 + mp.sqrt((nu + 1) ** 2 + z**2))
    return lo, hi


def log_iv_eq44(nu, z):
    if z < nu:
        eta = (nu + mp.mpf(1) / 2) / (2 * (nu + 1))
        return nu * mp.log(z) + eta * z - (eta + nu) * mp.log(2) - mp.loggamma(nu + 1)
    return z - mp.log(z) / 2 - mp.log(2 * mp.pi) / 2


def log_iv_eq45(nu, z):
    n = int(mp.floor(nu))
    acc = mp.log(mp.besseli(nu - n, z))
    for j in range(n):
        acc += mp.log((segura_b(nu - j, z, 2) + segura_b(nu - j, z, 0)) / 2)
    return acc


def scan(nu, zs):
    nu = mp.mpf(nu)
    out = {"approx5": (0, None), "approx4": (0, None), "gap5": (0, None), "eq44": (0, None), "eq45": (0, None)}
    bounds_hold = True

    def upd(key, val, z):
        if val > out[key][0]:
            out[key] = (val, z)

    for z in zs:
        r = ratio(nu, z)
        b2, b0 = segura_b(nu, z, 2), segura_b(nu, z, 0)
        # non-strict: for large z, R = 1 to working precision and B_0 = 1 exactly at nu = 1/2
        bounds_hold &= bool(b2 <= r <= b0)
        upd("approx5", abs((b2 + b0) / 2 - r) / r, z)
        lo4, hi4 = thm4(nu, z)
        upd("approx4", abs((lo4 + hi4) / 2 - r) / r, z)
        upd("gap5", b0 - b2, z)
        exact_log = mp.log(mp.besseli(nu, z))
        upd("eq44", abs(log_iv_eq44(nu, z) - exact_log), z)
        upd("eq45", abs(log_iv_eq45(nu, z) - exact_log), z)
    out["approx5"] = refine(lambda z: abs((segura_b(nu, z, 2) + segura_b(nu, z, 0)) / 2 - ratio(nu, z)) / ratio(nu, z),
                            zs, out["approx5"])
    return out, bounds_hold


def refine(f, zs, best):
    """Golden-section search for the maximum of f(z) in log z around the best grid point."""
    val, z = best
    i = zs.index(z)
    if i == 0 or i == len(zs) - 1:
        return best
    a, b = mp.log(zs[i - 1]), mp.log(zs[i + 1])
    g = (mp.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(mp.exp(c)) > f(mp.exp(d)):
            b = d
        else:
            a = c
    zm = mp.exp((a + b) / 2)
    fm = f(zm)
    return (fm, zm) if fm > val else best


def max_gap(nu, zs):
    nu = mp.mpf(nu)
    return max(segura_b(nu, z, 0) - segura_b(nu, z, 2) for z in zs)


def gap_threshold(zs, target=mp.exp(-10)):
    """Smallest integer nu whose largest theorem 5 gap B_0 - B_2 over zs is below target."""
    nu = 1
    while max_gap(nu, zs) >= target:
        nu += 1
    return nu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=401, help="grid points in log10 z from -4 to 4 (default 401)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    zs = [mp.mpf(10) ** (mp.mpf(-4) + 8 * mp.mpf(i) / (args.points - 1)) for i in range(args.points)]

    gap_zs = [mp.mpf(10) ** (mp.mpf(i) / 100) for i in range(-200, 501)]
    nu_gap = gap_threshold(gap_zs)
    gap_note = (f"max over z of B0 - B2 first drops below e^-10 = {mp.nstr(mp.exp(-10), 3)} at nu = {nu_gap} "
                f"(d = {2 * nu_gap}); at nu = {nu_gap - 1} it is {mp.nstr(max_gap(nu_gap - 1, gap_zs), 3)}")

    rows = []
    for nu in ORDERS:
        res, ok = scan(nu, zs)
        rows.append((nu, res, ok))

    def g(v):
        return "-" if v is None else mp.nstr(v, 3)

    if args.markdown:
        print("| nu | d = 2 nu | max rel. err. (B2+B0)/2 | at z | max rel. err. thm 4 midpoint | at z "
              "| max gap B0 - B2 | at z | B2 <= R <= B0 | max abs. err. eq. 44 | max abs. err. eq. 45 |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for nu, res, ok in rows:
            print(f"| {nu:g} | {2 * nu:g} | {g(res['approx5'][0])} | {g(res['approx5'][1])} "
                  f"| {g(res['approx4'][0])} | {g(res['approx4'][1])} "
                  f"| {g(res['gap5'][0])} | {g(res['gap5'][1])} | {'yes' if ok else 'NO'} "
                  f"| {g(res['eq44'][0])} | {g(res['eq45'][0])} |")
        print()
        print(gap_note)
    else:
        print(gap_note)
        print(f"z grid: {args.points} points, log-spaced on [1e-4, 1e4]; mpmath {mp.mp.dps} digits")
        for nu, res, ok in rows:
            print(f"nu = {nu:g} (d = {2 * nu:g}):")
            print(f"  (B2+B0)/2       max rel err {g(res['approx5'][0])} at z = {g(res['approx5'][1])}")
            print(f"  thm 4 midpoint  max rel err {g(res['approx4'][0])} at z = {g(res['approx4'][1])}")
            print(f"  gap B0 - B2     max {g(res['gap5'][0])} at z = {g(res['gap5'][1])}   bounds hold: {ok}")
            print(f"  eq. 44 log I    max abs err {g(res['eq44'][0])} at z = {g(res['eq44'][1])}")
            print(f"  eq. 45 log I    max abs err {g(res['eq45'][0])} at z = {g(res['eq45'][1])}")


if __name__ == "__main__":
    main()
