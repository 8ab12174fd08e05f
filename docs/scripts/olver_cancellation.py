#!/usr/bin/env python3
"""How many bits plain float64 loses in the leading terms of Olver's expansion.

Evaluates  A + nu log(z / (nu + A)) - log(2 pi A) / 2,  A = sqrt(nu^2 + z^2)
(the leading order of log I_nu(z)) in float64 and in mpmath at 40 digits, near
the turning point z = c0 nu, c0 = 0.66274..., where the two O(nu) terms cancel
and log I_nu(z) is only O(log nu).  Prints the worst error in ulps of the
result; it grows like nu, i.e. about log2(nu) bits are lost.  This is why
csrc/include/vmfdist/bessel.h carries these terms in double-double.

Usage: python docs/scripts/olver_cancellation.py   (needs mpmath and numpy)
"""
import math

import mpmath as mp
import numpy as np

mp.mp.dps = 40
C0 = float(mp.findroot(lambda c: mp.sqrt(1 + c**2) - mp.asinh(1 / c), 0.66))


def main():
    rng = np.random.default_rng(0)
    print(f"turning point c0 = {C0:.6f}")
    for nu in [1e2, 1e3, 1e4, 1e5, 1e6]:
        errs, vals = [], []
        for z in C0 * nu + rng.uniform(-0.3, 0.3, 300):
            a = math.sqrt(nu * nu + z * z)
            v = a + nu * math.log(z / (nu + a)) - 0.5 * math.log(2 * math.pi * a)
            am = mp.sqrt(mp.mpf(nu) ** 2 + mp.mpf(z) ** 2)
            vm = am + nu * mp.log(mp.mpf(z) / (nu + am)) - mp.log(2 * mp.pi * am) / 2
            errs.append(float(abs(v - vm) / abs(vm)) / 2.0**-53)
            vals.append(abs(float(vm)))
        worst = max(errs)
        print(f"nu = {nu:8.0e}: |log I| ~ {np.median(vals):5.2f}, worst float64 error {worst:9.0f} ulp "
              f"= {math.log2(worst):4.1f} bits lost (log2 nu = {math.log2(nu):4.1f})")


if __name__ == "__main__":
    main()
