r"""RDP structured pruning (Oh, Adamczewski & Park 2019, section 5, Table 2 and Fig. 7) on digits.

The paper prunes LeNet-5-Caffe (20-50-800-500) on MNIST; MNIST is not available here, so this
uses scikit-learn's ``load_digits`` (8x8, 10 classes, the fixed split of
:func:`vmfdist.experiments.digits.load`) and the same network scaled to the input,
20-50-200-500 (:func:`~vmfdist.experiments.digits.lenet5`).

Per seed: an RDP network (:func:`vmfdist.nn.to_bayesian` with ``kind="rdp"``,
``grouping="double"`` in every layer, as the paper) is trained on the ELBO (Adam 5e-3, the radius
parameters ``RADIUS_LR``, chosen on validation data); the log-modes of its local radii are split at their gap
(:func:`vmfdist.nn.gap_threshold`) and :func:`vmfdist.nn.compress` removes the neurons whose
groups fall below; the pruned architecture, parameters and FLOPs (the paper's formulas,
:func:`vmfdist.nn.count_flops`) and test error are recorded beside the unpruned RDP network and a
mean-field (Bayes by Backprop) network of the same shape trained the same way.  Test errors are
those of the posterior-mean weights (the deployed network) and of the 32-sample predictive.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Dict, List

import torch

from .. import nn as bnn
from . import _common, digits

# Adam learning rate of the RDP radius parameters, chosen with --validation (docs/experiments.md)
RADIUS_LR = 1e-2
ARCH_INPUT = (1, 8, 8)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, default=5, help="training seeds 0..N-1 (default 5)")
    p.add_argument("--epochs", type=int, default=60, help="training epochs of every network (default 60)")
    p.add_argument("--radius-lr", type=float, default=RADIUS_LR,
                   help=f"Adam learning rate of the RDP radius parameters (default {RADIUS_LR})")
    p.add_argument("--validation", action="store_true",
                   help="score on a held-out 20%% of the training images (fixed, stratified) instead of the "
                        "test images: for choosing settings")
    _common.out_argument(p, "digits_pruning.json/.md and the log-mode picture")


def _errors(model, x, y) -> Dict[str, float]:
    with torch.no_grad(), bnn.deterministic(model, "mean"):
        mean_err = float((model(x).argmax(-1) != y).float().mean())
    pred = bnn.predict(model, x, num_samples=32)
    return {"error_mean_weights": mean_err, "error_predictive": 1.0 - float(bnn.accuracy(pred, y))}


def run_seed(seed: int, epochs: int, data=None, radius_lr: float = RADIUS_LR) -> dict:
    """One seed: train RDP and mean-field, prune RDP; returns the numbers and the RDP log-modes."""
    xtr, xte, ytr, yte = data or digits.load()
    with digits.one_thread():
        torch.manual_seed(seed)
        rdp = bnn.to_bayesian(digits.lenet5(), "rdp", grouping="double")
        t0 = time.perf_counter()
        digits.train_elbo(rdp, xtr, ytr, epochs, lr=5e-3, seed=seed, radius_lr=radius_lr)
        t_rdp = time.perf_counter() - t0
        modes = {f"{name}.{side}": v.detach().clone() for name, d in bnn.log_modes(rdp).items()
                 for side, v in d.items()}
        thresholds = {k: bnn.gap_threshold(v) for k, v in modes.items()}
        small = bnn.compress(rdp, threshold=thresholds)
        with torch.no_grad():
            pruned_err = float((small(xte).argmax(-1) != yte).float().mean())
        torch.manual_seed(seed)
        mf = bnn.to_bayesian(digits.lenet5(), "meanfield")
        t0 = time.perf_counter()
        digits.train_elbo(mf, xtr, ytr, epochs, lr=5e-3, seed=seed)
        t_mf = time.perf_counter() - t0
        full = digits.lenet5()
        res = {
            "seed": seed,
            "unpruned": dict(_errors(rdp, xte, yte), architecture=bnn.architecture(full),
                             params=bnn.count_parameters(full), flops=bnn.count_flops(full, ARCH_INPUT),
                             train_seconds=round(t_rdp, 1)),
            "pruned": dict(error_mean_weights=pruned_err, architecture=bnn.architecture(small),
                           params=bnn.count_parameters(small), flops=bnn.count_flops(small, ARCH_INPUT)),
            "meanfield": dict(_errors(mf, xte, yte), params=bnn.count_parameters(full),
                              flops=bnn.count_flops(full, ARCH_INPUT), train_seconds=round(t_mf, 1)),
            # None: no clear gap, nothing pruned in that group (JSON has no -inf)
            "thresholds": {k: (t if t > -float("inf") else None) for k, t in thresholds.items()},
            "kept": {k: [int((v > thresholds[k]).sum()), v.numel()] for k, v in modes.items()},
        }
    return res, modes


def run(args) -> dict:
    if args.seeds < 1 or args.epochs < 1:
        raise ValueError(f"--seeds and --epochs must be positive, got {args.seeds} and {args.epochs}")
    if not args.radius_lr > 0:
        raise ValueError(f"--radius-lr must be positive, got {args.radius_lr}")
    _common.prepare_out(args.out)  # before any training
    meta = _common.run_metadata()
    if args.validation:  # train on 80% of the training images, score on the rest; no test image is used
        xtr, xval, _, ytr, yval, _ = digits.load_with_validation()
        data = (xtr, xval, ytr, yval)
    else:
        data = digits.load()
    t_all = time.perf_counter()
    per_seed: List[dict] = []
    first_modes = None
    results = {"seeds": per_seed, "settings": {"epochs": args.epochs, "seeds": args.seeds, "batch": digits.BATCH,
                                               "network": "LeNet-5-Caffe scaled to 8x8 (20-50-200-500)",
                                               "radius_lr": args.radius_lr, "validation": bool(args.validation),
                                               "data": ("validation: 20% of the training images held out"
                                                        if args.validation else
                                                        "sklearn load_digits, stratified 80/20 split, seed 0")},
               "meta": meta, "wall_seconds": 0.0}
    for seed in _common.progress(range(args.seeds), "digits-pruning"):
        res, modes = run_seed(seed, args.epochs, data, args.radius_lr)
        per_seed.append(res)
        if first_modes is None:
            first_modes = (modes, {k: (-float("inf") if t is None else t) for k, t in res["thresholds"].items()})
        # after every seed (an interrupted run keeps the seeds it finished), atomically
        results.update(wall_seconds=round(time.perf_counter() - t_all, 1), partial=len(per_seed) < args.seeds)
        _common.write_results(args.out, "digits_pruning", results,
                              lambda path: plot_log_modes(*first_modes, path, "RDP on digits (seed 0): log-modes and "
                                                          "pruning thresholds (cf. Oh et al. 2019, Fig. 7)"), markdown)
    return results


def markdown(results: dict, picture: str = None) -> str:
    seeds = results["seeds"]
    meta = results["meta"]

    def ms(values, scale=1.0, fmt="{:.2f}"):
        m, se = _common.mean_se([v * scale for v in values])
        return f"{fmt.format(m)} ± {fmt.format(se)}"

    part = "validation" if results["settings"].get("validation") else "test"
    rows = [("RDP, unpruned", "unpruned"), ("RDP, pruned", "pruned"), ("mean-field (BBB)", "meanfield")]
    lines = _common.header("RDP structured pruning on digits", meta, results["wall_seconds"],
                           f"{len(seeds)} seeds, mean ± standard error; radius learning rate "
                           f"{results['settings'].get('radius_lr', 3e-2):g}") + [
             "", f"| network | {part} error, mean weights (%) | {part} error, predictive (%) | parameters | FLOPs |",
             "|---|---|---|---|---|"]
    for label, key in rows:
        e_mean = ms([s[key]["error_mean_weights"] for s in seeds], 100)
        e_pred = ms([s[key]["error_predictive"] for s in seeds], 100) if "error_predictive" in seeds[0][key] else "—"
        lines.append(f"| {label} | {e_mean} | {e_pred} | {ms([s[key]['params'] for s in seeds], fmt='{:.0f}')} | "
                     f"{ms([s[key]['flops'] for s in seeds], fmt='{:.0f}')} |")
    lines += ["", "The paper (Oh et al. 2019, Table 2; LeNet-5-Caffe 20-50-800-500 on 28x28 MNIST, so not the same "
              "network or data): RDP pruned to 4-7-110-66, 125K FLOPs, 20K parameters, 1.0% test error.",
              "", "Pruned architectures (unpruned: " + seeds[0]["unpruned"]["architecture"] + "):", ""]
    for s in seeds:
        lines.append(f"- seed {s['seed']}: {s['pruned']['architecture']} "
                     f"({s['pruned']['params']} parameters, {s['pruned']['flops']} FLOPs, "
                     f"error {100 * s['pruned']['error_mean_weights']:.2f}% vs "
                     f"{100 * s['unpruned']['error_mean_weights']:.2f}% unpruned)")
    if picture:
        lines += ["", f"![log-modes of the local radii, seed 0]({os.path.basename(picture)})"]
    return "\n".join(lines) + "\n"


def plot_log_modes(modes: Dict[str, torch.Tensor], thresholds: Dict[str, float], path: str, title: str):
    """Histograms of the log-modes of every RDP grouping (``{"<layer>.<side>": values}``) with
    their pruning thresholds (``-inf``: none), as Fig. 7 of Oh et al. 2019; returns ``path`` (``None``
    without matplotlib)."""
    plt = _common.pyplot()
    if plt is None:
        return None
    panels = [(k, v) for k, v in modes.items() if v.numel() > 1]
    ncol = min(4, len(panels))
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 2.9 * nrow), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (key, v) in zip(axes.flat, panels):
        layer, side = key.rsplit(".", 1)
        t = thresholds[key]
        ax.hist(v.numpy(), bins=30, color="tab:blue")
        if t > -float("inf"):
            ax.axvline(t, color="red", linestyle=":", label=f"threshold {t:.2f}")
            ax.legend(fontsize=7)
        ax.set_title(f"layer {layer}, {side}s: {int((v > t).sum())}/{v.numel()} kept", fontsize=8)
        ax.set_xlabel("log mode of the local radius")
        ax.set_ylabel(f"number of {side}s")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
