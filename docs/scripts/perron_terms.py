#!/usr/bin/env python3
"""Perron's continued fraction as summed in bessel.h, transcribed to Python floats.

For each order nu, over z in [1e-4, 1e6], prints the largest number of terms
the series needs (stopping rule |t_k| <= 2^-55 |partial sum|, as in the header)
and the largest cancellation factor (head + |rest|) / f, i.e. how many times
larger the summands are than the result f = head + rest.  A factor near 1
means float64 gives f to a few ulp; a large one (nu -> 1/2) is why the
complement 1 - R is summed in double-double for nu < 1.

Usage: python docs/scripts/perron_terms.py   (needs numpy)
"""
import numpy as np


def perron(mu, z):
    two = 2.0 * mu
    b_prev = two + 2.0 * z + 1.0
    t = -(two + 1.0) * z / b_prev
    head = (two * (two + 1.0) + (two - 1.0) * z) / b_prev
    rest, g, k = 0.0, 1.0, 1
    for k in range(2, 20000):
        b_k = b_prev + 1.0
        q = -((two + 2 * k - 1) / b_prev) * (z / b_k) * g
        g = 1.0 / (q + 1.0)
        t = t * (-q) * g
        rest += t
        b_prev = b_k
        if abs(t) <= 2.0**-55 * abs(head + rest):
            break
    return head, rest, k


def main():
    zs = np.logspace(-4, 6, 300)
    for nu in [0.51, 0.6, 0.75, 1.0, 2.0, 10.0, 100.0, 1000.0]:
        worst, most = 0.0, 0
        for z in zs:
            h, r, k = perron(nu, z)
            worst = max(worst, (h - r) / (h + r))
            most = max(most, k)
        print(f"nu = {nu:7g}: at most {most:3d} terms, max (head + |rest|) / f = {worst:.3f}")


if __name__ == "__main__":
    main()
