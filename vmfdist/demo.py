"""vmfdist demo: the exact Bessel ratio against the papers' bounds and approximations.

Run ``python -m vmfdist.demo [--out DIR]``.  Prints a table and writes
``DIR/ratio_approximations.png`` (default DIR: ``demo_output``); the Bayesian-layers section
(:func:`layers_demo`) writes ``DIR/rdp_log_modes.png`` and ``DIR/reliability.png``.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from . import nn as vnn
from . import special
from .distributions import VonMisesFisher
from .experiments._common import pyplot
from .experiments.pruning import plot_log_modes


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
    parser.add_argument("--out", default="demo_output", help="directory for the pictures")
    parser.add_argument("--epochs", type=int, default=None,
                        help="training epochs of every Bayesian network (default: 20, and 30 for RDP); "
                             "a small value gives a quick smoke run")
    args = parser.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs must be positive, got {args.epochs}")

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
    if args.epochs is None:
        layers_demo(args.out)
    else:
        layers_demo(args.out, epochs=args.epochs, rdp_epochs=args.epochs)

    plt = pyplot()
    if plt is None:  # pragma: no cover
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



def layers_demo(out: str = "demo_output", epochs: int = 20, rdp_epochs: int = 30):
    """Bayesian layers on scikit-learn's digits (8x8): a LeNet-style network trained as mean-field
    VI, Radial and RDP (double grouping), the RDP network pruned; prints accuracy, NLL, ECE, the
    pruned architecture, parameters and FLOPs, and writes the log-mode histograms with their
    thresholds (``rdp_log_modes.png``) and a reliability diagram (``reliability.png``)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:  # pragma: no cover
        print("\n(scikit-learn not installed: no Bayesian-layers demo)")
        return

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: one thread is fastest (no spinning second thread)
    try:
        _layers_demo(out, epochs, rdp_epochs, load_digits, train_test_split)
    finally:
        torch.set_num_threads(threads)


def _layers_demo(out, epochs, rdp_epochs, load_digits, train_test_split):
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)

    def lenet():
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))

    print(f"\nBayesian layers on digits ({len(xtr)} train / {len(xte)} test, 8x8), LeNet-style "
          f"{vnn.architecture(lenet())}, {epochs} epochs of Adam ({rdp_epochs} for RDP), ELBO with N = {len(xtr)}; "
          "predictive from 32 samples")
    print("accuracy, NLL and ECE of the 32-sample predictive; 'mean w': accuracy with the posterior-mean weights")
    print(f"{'model':>22} {'accuracy':>9} {'NLL':>7} {'ECE':>7} {'mean w':>7} {'params':>7} {'FLOPs':>8} {'time':>7}")
    results = {}
    for label, kind, opts, n_epochs in [("mean-field (reparam)", "meanfield", {}, epochs),
                                        ("Radial", "radial", {}, epochs),
                                        ("RDP (double grouping)", "rdp", {"grouping": "double"}, rdp_epochs)]:
        torch.manual_seed(0)
        model = vnn.to_bayesian(lenet(), kind, **opts)
        elbo = vnn.ELBO(model, num_data=len(xtr))
        radius = [p for n, p in model.named_parameters() if "local_" in n or "global_" in n]
        rest = [p for n, p in model.named_parameters() if not ("local_" in n or "global_" in n)]
        # the log-normal radius factors get a larger step: their prior pull is weak per step
        groups = [{"params": rest}] + ([{"params": radius, "lr": 3e-2}] if radius else [])
        opt = torch.optim.Adam(groups, lr=5e-3)
        t0 = time.time()
        for _ in range(n_epochs):
            perm = torch.randperm(len(xtr))
            for i in range(0, len(xtr), 64):
                idx = perm[i:i + 64]
                loss = elbo(model(xtr[idx]), ytr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        pred = vnn.predict(model, xte, 32)
        results[label] = (model, pred)
        with torch.no_grad(), vnn.deterministic(model, "mean"):
            acc_mean = float((model(xte).argmax(-1) == yte).float().mean())
        print(f"{label:>22} {float(vnn.accuracy(pred, yte)):>9.4f} {float(vnn.nll(pred, yte)):>7.3f} "
              f"{float(vnn.ece(pred, yte)):>7.3f} {acc_mean:>7.4f} {vnn.count_parameters(model):>7d} "
              f"{vnn.count_flops(model, (1, 8, 8)):>8d} {time.time() - t0:>6.1f}s")
    rdp = results["RDP (double grouping)"][0]
    small = vnn.compress(rdp)
    with torch.no_grad():
        acc_small = float((small(xte).argmax(-1) == yte).float().mean())
    print(f"{'RDP pruned':>22} {'':>9} {'':>7} {'':>7} {acc_small:>7.4f} {vnn.count_parameters(small):>7d} "
          f"{vnn.count_flops(small, (1, 8, 8)):>8d}")
    print(f"pruned architecture: {vnn.architecture(lenet())} -> {vnn.architecture(small)}")

    plt = pyplot()
    if plt is None:  # pragma: no cover
        return
    os.makedirs(out, exist_ok=True)
    modes = {f"{name}.{side}": v for name, d in vnn.log_modes(rdp).items() for side, v in d.items()}
    plot_log_modes(modes, {k: vnn.gap_threshold(v) for k, v in modes.items()}, os.path.join(out, "rdp_log_modes.png"),
                   "RDP on digits: log-modes of the local radii and pruning thresholds")
    fig, (ax, axc) = plt.subplots(2, 1, figsize=(5.0, 5.6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect calibration")
    width = 1.0 / 15 / (len(results) + 1)
    for k, (label, (_, pred)) in enumerate(results.items()):
        conf, acc, count = vnn.calibration_bins(pred, yte, 15)
        m = count > 0
        line, = ax.plot(conf[m].numpy(), acc[m].numpy(), marker="o",
                        label=f"{label} (ECE {float(vnn.ece(pred, yte)):.3f})")
        # the images per bin, side by side: a point of few images says little
        edges = (torch.arange(15, dtype=torch.float64) + 0.5) / 15 + (k - (len(results) - 1) / 2) * width
        axc.bar(edges[m].numpy(), count[m].numpy(), width=width, color=line.get_color())
    ax.set_ylabel("accuracy in the bin")
    ax.set_title("Reliability diagram, digits test set (15 bins)", fontsize=9)
    # the legend in the count panel's empty corner (few images have a low confidence), off the curves
    axc.legend(*ax.get_legend_handles_labels(), fontsize=6, loc="upper left", frameon=False)
    axc.set_yscale("log")
    axc.set_ylabel("test images", fontsize=8)
    axc.set_xlabel("confidence (mean top probability in the bin)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "reliability.png"), dpi=110)
    plt.close(fig)
    print(f"plots written to {os.path.join(out, 'rdp_log_modes.png')} and {os.path.join(out, 'reliability.png')}")


if __name__ == "__main__":
    main()
