"""vmfdist demo: the exact Bessel ratio against the papers' bounds and approximations.

Run ``python -m vmfdist.demo [--out DIR]``.  Prints a table and writes
``DIR/ratio_approximations.png`` (default DIR: ``demo_output``).
"""
from __future__ import annotations

import argparse
import os

import torch

from . import special
from .distributions import VonMisesFisher


def _table(orders, z):
    rows = []
    for nu in orders:
        n = torch.full_like(z, nu)
        exact = special.bessel_iv_ratio(n, z)
        lo5, hi5 = special.bessel_iv_ratio_bounds(n, z, theorem=5)
        lo4, hi4 = special.bessel_iv_ratio_bounds(n, z, theorem=4)
        approx = special.bessel_iv_ratio_approx(n, z)
        rel = ((approx - exact) / exact).abs()
        worst = int(rel.argmax())
        rows.append((nu, 2 * nu, float(rel.max()), float(z[worst]), float(((hi5 - lo5) / exact).max()),
                     float(((hi4 - lo4) / exact).max()),
                     bool(((lo5 <= exact * (1 + 4e-16)) & (exact <= hi5 * (1 + 4e-16))).all())))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo_output", help="directory for the plot")
    args = parser.parse_args(argv)

    z = torch.logspace(-3, 4, 2001, dtype=torch.float64)
    orders = [0.5, 1.0, 1.5, 2.0, 5.0, 10.0, 50.0, 128.0, 1000.0, 1e5]
    print("Ratio R_nu(z) = I_nu(z)/I_{nu-1}(z) over z in [1e-3, 1e4]: the papers' approximation")
    print("(B2+B0)/2 and the widths of the Ruiz-Antolin--Segura brackets, relative to the exact ratio.\n")
    print(f"{'nu':>8} {'d=2nu':>8} {'max rel err (B2+B0)/2':>22} {'at z':>10} {'thm5 width':>11} "
          f"{'thm4 width':>11} {'bracket ok':>10}")
    # "bracket ok": B2 <= R <= B0 holds to within 2 ulp (rounding of the bounds and of R)
    for nu, d, err, at, w5, w4, ok in _table(orders, z):
        note = "  <- see (*)" if nu == 0.5 else ""
        print(f"{nu:>8g} {d:>8g} {err:>22.3e} {at:>10.3g} {w5:>11.2e} {w4:>11.2e} {str(ok):>10}{note}")
    print("(*) at nu = 1/2 theorem 5's upper bound B0 = z / (delta + sqrt(delta^2 + z^2)) has delta = 0, so B0 = 1 for")
    print("    every z while R = tanh(z) ~ z as z -> 0: the average (B2 + B0)/2 is off by about 1/(2z) (5e2 at z = 1e-3).")
    print("    The bracket B2 <= R <= B0 still holds; the papers use the approximation for d >= 2 (nu >= 1).")

    print("\nlog I_nu(z): exact vs the papers' eq. (44) and eq. (45)")
    print(f"{'nu':>8} {'z':>8} {'exact':>22} {'eq. 44':>14} {'eq. 45':>22}")
    for nu, zz in [(0.0, 1.0), (10.0, 5.0), (127.0, 50.0), (127.0, 500.0), (1e4, 1e3), (1e6, 1e-300)]:
        n, x = torch.tensor([nu], dtype=torch.float64), torch.tensor([zz], dtype=torch.float64)
        ex = float(special.log_bessel_iv(n, x))
        a44 = float(special.log_bessel_iv_asymptotic(n, x))
        a45 = float(special.log_bessel_iv_series(n, x))  # O(nu) work: ~30 ms at nu = 1e6
        print(f"{nu:>8g} {zz:>8g} {ex:>22.15g} {a44:>14.6g} {a45:>22.15g}")

    _vmf_table()

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        print("\n(matplotlib not installed: no plot)")
        return
    os.makedirs(args.out, exist_ok=True)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for nu in [1.0, 2.0, 5.0, 50.0, 1000.0]:
        n = torch.full_like(z, nu)
        exact = special.bessel_iv_ratio(n, z)
        ax[0].loglog(z, ((special.bessel_iv_ratio_approx(n, z) - exact) / exact).abs().clamp_min(1e-17),
                     label=f"nu={nu:g} (d={2 * nu:g})")
        lo4, hi4 = special.bessel_iv_ratio_bounds(n, z, theorem=4)
        ax[1].loglog(z, (((lo4 + hi4) / 2 - exact) / exact).abs().clamp_min(1e-17), label=f"nu={nu:g}")
    ax[0].set_title("(B2 + B0)/2 (theorem 5)")
    ax[1].set_title("theorem-4 midpoint")
    for a in ax:
        a.set_xlabel("argument z")
        a.set_ylabel("relative error |approx - R| / R")
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(args.out, "ratio_approximations.png")
    fig.savefig(path, dpi=120)
    print(f"\nplot written to {path}")


def _vmf_table():
    """Sample the von Mises-Fisher distribution and check the moments and the gradient."""
    print("\nvon Mises-Fisher: 20000 samples, E[mu^T x] vs A_d(kappa), mean d(mu^T x)/dkappa vs A'_d(kappa)")
    print(f"{'d':>6} {'kappa':>8} {'E[w] (MC)':>12} {'A_d':>12} {'grad (MC)':>12} {'A_d prime':>12}")
    gen = torch.Generator().manual_seed(0)
    for d, k in [(3, 5.0), (5, 2.0), (64, 10.0), (512, 1e3), (4096, 1e4)]:
        mu = torch.zeros(d, dtype=torch.float64)
        mu[0] = 1.0
        kappa = torch.tensor(k, dtype=torch.float64, requires_grad=True)
        q = VonMisesFisher(mu, kappa)
        w = q.rsample((20000,), generator=gen)[:, 0]
        (g,) = torch.autograd.grad(w.mean(), kappa)
        a = float(q.mean_resultant_length.detach())
        da = 1 - a * a - (d - 1) * a / k
        print(f"{d:>6} {k:>8g} {float(w.detach().mean()):>12.6f} {a:>12.6f} {float(g):>12.6f} {da:>12.6f}")


if __name__ == "__main__":
    main()
