r"""Radial vs mean-field robustness to hyperparameters (Farquhar, Osborne & Gal 2020, section 4.1.3, Fig. 4).

The paper's claim: mean-field VI (MFVI) fails to train for most hyperparameter settings (82% of
its configurations learned "barely anything"), the Radial posterior for far fewer (39%).  Here
the same grid of learning rate x initial posterior scale is run for both posteriors, on two
tasks:

* ``digits`` -- scikit-learn's ``load_digits`` with the LeNet-5-shaped network of
  :func:`vmfdist.experiments.digits.lenet5` (115k weights), ELBO with the categorical
  likelihood; a configuration *fails* when its test accuracy (32-sample predictive) is not
  significantly above chance: at most 0.1 + 3 binomial standard errors at p = 0.1 on the 360
  test images (0.147);
* ``uci`` -- one UCI set (``--uci-dataset``, default boston, standard split 0) with the UCI
  network (one hidden layer of 50 units) and the Gamma(6, 6)-precision Gaussian likelihood; a
  configuration fails when its test log-likelihood is no better than that of the input-free
  predictive N(training mean, training variance).

Grid (the paper's own: initial rho in {-6, -4, -2, 0}, sigma = softplus(rho); Adam learning
rates of its search, 1e-2 to 1e-4): 3 learning rates x 4 scales x 2 posteriors per task, one
seed per cell, plain ELBO (KL weight 1, as the paper: no down-weighting).  As the paper
allowed ("we did allow models to pre-train the means using a negative log-likelihood loss for
one epoch before beginning ELBO training, a common tweak to improve MFVI"), both posteriors'
means are first trained for ``--pretrain-epochs`` (default 1) on the likelihood alone, with the
layers in mean mode (the scales untouched), at the cell's learning rate.
"""
from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

from .. import nn as bnn
from . import _common, digits, uci

LRS = [1e-2, 1e-3, 1e-4]
RHOS = [-6.0, -4.0, -2.0, 0.0]
KINDS = {"meanfield": "mean-field (MFVI)", "radial": "Radial"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=20, help="digits training epochs (default 20)")
    p.add_argument("--uci-epochs", type=int, default=40, help="UCI training epochs (default 40)")
    p.add_argument("--uci-dataset", default="boston", help="UCI set (default boston), split 0")
    p.add_argument("--data-dir", default=None, help=f"required for the uci task: {uci.DATA_HELP}")
    p.add_argument("--tasks", nargs="+", default=["digits", "uci"], choices=["digits", "uci"])
    p.add_argument("--pretrain-epochs", type=int, default=1,
                   help="epochs of NLL-only training of the means before the ELBO (default 1, as the paper)")
    p.add_argument("--lrs", nargs="+", type=float, default=LRS, help=f"Adam learning rates (default {LRS})")
    p.add_argument("--rhos", nargs="+", type=float, default=RHOS, help=f"initial rho values (default {RHOS})")
    _common.out_argument(p, "radial_robustness.json/.md and the heat maps")


def chance_accuracy_bar(n_test: int, classes: int = 10) -> float:
    p = 1.0 / classes
    return p + 3.0 * math.sqrt(p * (1 - p) / n_test)


def pretrain_means(model, x, y, epochs, lr, seed, **kw):
    """``epochs`` of Adam on the likelihood alone with the layers in mean mode (KL weight 0): the
    means (and the likelihood's own parameters) move, the scales get no gradient."""
    with bnn.deterministic(model, use="mean"):
        return digits.train_elbo(model, x, y, epochs, lr=lr, seed=seed, kl_weight=0.0, **kw)


def _train(model, x, y, epochs, pretrain, lr, seed, **kw):
    """:func:`pretrain_means` for ``pretrain`` epochs, then ``epochs`` on the ELBO; returns the
    per-epoch losses (the last one ``nan`` when training diverged)."""
    if pretrain > 0:
        losses = pretrain_means(model, x, y, pretrain, lr, seed + 1, **kw)
        if not math.isfinite(losses[-1]):
            return losses
    return digits.train_elbo(model, x, y, epochs, lr=lr, seed=seed, **kw)


def _digits_cell(kind, lr, rho, epochs, data, seed=0, pretrain=1):
    xtr, xte, ytr, yte = data
    torch.manual_seed(seed)
    model = bnn.to_bayesian(digits.lenet5(), kind, sigma_init=F.softplus(torch.tensor(rho)).item())
    losses = _train(model, xtr, ytr, epochs, pretrain, lr, seed)
    if not math.isfinite(losses[-1]):
        return {"accuracy": 0.1, "diverged": True}
    pred = bnn.predict(model, xte, num_samples=32)
    return {"accuracy": float(bnn.accuracy(pred, yte)), "nll": float(bnn.nll(pred, yte)), "diverged": False}


def _uci_cell(kind, lr, rho, epochs, split, seed=0, pretrain=1):
    torch.manual_seed(seed)
    n, d = split.x_train.shape
    net = torch.nn.Sequential(torch.nn.Linear(d, split.n_hidden), torch.nn.ReLU(), torch.nn.Linear(split.n_hidden, 1))
    model = bnn.to_bayesian(net.to(split.x_train.dtype), kind, sigma_init=F.softplus(torch.tensor(rho)).item())
    lik = bnn.GammaPrecisionGaussian(*uci.GAMMA_PRIOR).to(split.x_train.dtype)
    losses = _train(model, split.x_train, split.y_train, epochs, pretrain, lr, seed, likelihood=lik,
                    batch=split.batch_size)
    if not math.isfinite(losses[-1]):
        return {"test_ll": -math.inf, "diverged": True}
    pred = bnn.predict(model, split.x_test, num_samples=32, likelihood=lik)
    ll = float(bnn.log_likelihood(pred, split.y_test, split.y_mean, split.y_std))
    rm = float(bnn.rmse(pred, split.y_test, split.y_mean, split.y_std))
    return {"test_ll": ll, "rmse": rm, "diverged": False}


def _baseline_ll(split) -> float:
    """Test log-likelihood of N(training mean, training variance), on the original scale."""
    y = split.y_test
    loc, scale = torch.tensor(split.y_mean, dtype=y.dtype), torch.tensor(split.y_std, dtype=y.dtype)
    return float(torch.distributions.Normal(loc, scale).log_prob(y).mean())


def run(args) -> dict:
    if args.epochs < 1 or args.uci_epochs < 1 or args.pretrain_epochs < 0:
        raise ValueError("--epochs and --uci-epochs must be positive and --pretrain-epochs non-negative")
    # read before any training, so that a missing --data-dir or set is refused at once
    uci_data = uci.load_dataset(args.uci_dataset, args.data_dir) if "uci" in args.tasks else None
    lrs, rhos = list(args.lrs), list(args.rhos)
    if not all(lr > 0 and math.isfinite(lr) for lr in lrs) or not all(math.isfinite(r) for r in rhos):
        raise ValueError(f"--lrs must be positive and --rhos finite, got {lrs} and {rhos}")
    _common.prepare_out(args.out)  # before any training
    meta = _common.run_metadata()
    t_all = time.perf_counter()
    results = {"grid": {"lr": lrs, "rho": rhos, "sigma_init": [F.softplus(torch.tensor(r)).item() for r in rhos]},
               "tasks": {}, "meta": meta,
               "settings": {"epochs": args.epochs, "uci_epochs": args.uci_epochs, "uci_dataset": args.uci_dataset,
                            "seed": 0, "kl_weight": 1.0, "pretrain_epochs": args.pretrain_epochs}}
    cells = [(kind, lr, rho) for kind in KINDS for lr in lrs for rho in rhos]
    with digits.one_thread():
        if "digits" in args.tasks:
            data = digits.load()
            bar = chance_accuracy_bar(len(data[3]))
            t0 = time.perf_counter()
            out = {k: [] for k in KINDS}
            for kind, lr, rho in _common.progress(cells, "radial-robustness digits"):
                r = _digits_cell(kind, lr, rho, args.epochs, data, pretrain=args.pretrain_epochs)
                out[kind].append(dict(r, lr=lr, rho=rho, failed=r["accuracy"] <= bar))
                results["tasks"]["digits"] = {"metric": "test accuracy", "failure_bar": bar, "cells": out,
                                              "wall_seconds": round(time.perf_counter() - t0, 1)}
                _checkpoint(args.out, results)
            results["wall_seconds"] = round(time.perf_counter() - t_all, 1)
            _write(args.out, results)
        if "uci" in args.tasks:
            split = uci.make_split(uci_data, 0)
            bar = _baseline_ll(split)
            t0 = time.perf_counter()
            out = {k: [] for k in KINDS}
            for kind, lr, rho in _common.progress(cells, f"radial-robustness {args.uci_dataset}"):
                r = _uci_cell(kind, lr, rho, args.uci_epochs, split, pretrain=args.pretrain_epochs)
                out[kind].append(dict(r, lr=lr, rho=rho, failed=r["test_ll"] <= bar))
                results["tasks"]["uci"] = {"metric": f"test log-likelihood ({args.uci_dataset}, split 0)",
                                           "failure_bar": bar, "cells": out,
                                           "wall_seconds": round(time.perf_counter() - t0, 1)}
                _checkpoint(args.out, results)
    results["wall_seconds"] = round(time.perf_counter() - t_all, 1)
    _write(args.out, results, partial=False)
    return results


def _checkpoint(out: str, results: dict) -> None:
    """After every cell: the JSON, atomically (an interrupted run keeps the cells it finished)."""
    _common.write_json(os.path.join(out, "radial_robustness.json"), dict(results, partial=True))


def _write(out: str, results: dict, partial: bool = True) -> None:
    """JSON, heat maps and page (after each task, and at the end)."""
    _common.write_results(out, "radial_robustness", dict(results, partial=partial),
                          lambda path: _plot(results, path), markdown)


def _value(task, cell):
    return cell["accuracy"] if task == "digits" else cell["test_ll"]


def markdown(results: dict, picture: str = None) -> str:
    meta = results["meta"]
    lines = _common.header("Radial vs mean-field: robustness to hyperparameters", meta,
                           results["wall_seconds"]) + [
             f"Grid: Adam learning rate {results['grid']['lr']} x initial rho {results['grid']['rho']} "
             "(sigma = softplus(rho)), one seed per cell, plain ELBO after "
             f"{results['settings'].get('pretrain_epochs', 0)} epoch(s) of NLL-only training of the means.", "",
             "The paper (Farquhar et al. 2020, section 4.1.3; 86 random configurations of a VGG-like network "
             "on diabetic retinopathy): 82% of the MFVI configurations and 39% of the Radial ones barely improved on "
             "random guessing.", "",
             "| task | posterior | failed (no better than chance) | best | median |", "|---|---|---|---|---|"]
    for task, r in results["tasks"].items():
        for kind, cells in r["cells"].items():
            vals = sorted(_value(task, c) for c in cells)
            failed = sum(c["failed"] for c in cells)
            med = 0.5 * (vals[(len(vals) - 1) // 2] + vals[len(vals) // 2])
            lines.append(f"| {r['metric']} | {KINDS[kind]} | {failed}/{len(cells)} ({100 * failed / len(cells):.0f}%) "
                         f"| {vals[-1]:.3f} | {med:.3f} |")
    lines += ["", "Failure bars: " + "; ".join(f"{r['metric']}: {r['failure_bar']:.3f}" for r in results["tasks"].values())
              + " (digits: chance 0.1 + 3 binomial SE on the test set; UCI: the input-free Gaussian predictive)."]
    if picture:
        lines += ["", f"![heat maps]({os.path.basename(picture)})"]
    return "\n".join(lines) + "\n"


def _plot(results, path):
    plt = _common.pyplot()
    if plt is None:
        return None
    tasks = list(results["tasks"])
    fig, axes = plt.subplots(len(tasks), 2, figsize=(8.4, 3.3 * len(tasks)), squeeze=False)
    lrs, rhos = results["grid"]["lr"], results["grid"]["rho"]
    for row, task in enumerate(tasks):
        r = results["tasks"][task]
        grids = {}
        for kind, cells in r["cells"].items():
            g = torch.full((len(lrs), len(rhos)), float("nan"))
            for c in cells:
                v = _value(task, c)
                g[lrs.index(c["lr"]), rhos.index(c["rho"])] = v if math.isfinite(v) else float("nan")
            grids[kind] = (g, cells)
        finite = torch.cat([g[torch.isfinite(g)] for g, _ in grids.values()])
        lo, hi = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
        if task == "uci":
            lo = max(lo, r["failure_bar"] - 1.0)
        for col, (kind, (g, cells)) in enumerate(grids.items()):
            ax = axes[row, col]
            im = ax.imshow(g.numpy(), vmin=lo, vmax=hi, cmap="viridis", aspect="auto")
            for c in cells:
                i, j = lrs.index(c["lr"]), rhos.index(c["rho"])
                v = _value(task, c)
                ax.text(j, i, ("diverged" if c["diverged"] else f"{v:.2f}") + ("\nfailed" if c["failed"] else ""),
                        ha="center", va="center", fontsize=7, color="white" if not c["failed"] else "red")
            ax.set_xticks(range(len(rhos)), [f"{x:g}" for x in rhos])
            ax.set_yticks(range(len(lrs)), [f"{x:g}" for x in lrs])
            ax.set_xlabel("initial rho (sigma = softplus(rho))")
            ax.set_ylabel("learning rate")
            failed = sum(c["failed"] for c in cells)
            ax.set_title(f"{KINDS[kind]}: {r['metric']}\n{failed}/{len(cells)} failed", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
