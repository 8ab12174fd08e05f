r"""K-FAC Laplace calibration (Kolesov 2021, scalable Laplace) on digits.

A MAP network (:func:`vmfdist.experiments.digits.lenet5`, Adam on the negative log joint with a
N(0, 1) weight prior) against two post-hoc Laplace approximations around it:
:class:`vmfdist.laplace.KFACLaplace` and :class:`vmfdist.laplace.EKFACLaplace` (GGN curvature,
prior precision by maximising the marginal likelihood, GLM predictive with the probit
approximation).  Metrics on the test images: accuracy, NLL, ECE (15 bins) and Brier score; and
out-of-distribution detection by the predictive entropy against a shifted input set -- the
test images rotated by 90 degrees (``torch.rot90``: same pixel statistics, digit-like strokes,
but not digits in any trained orientation) -- as the AUROC.  Reliability diagrams of each.
Every method sees the same data: the training images minus a fixed stratified 20% held out as
a validation set (the MAP network is trained on the rest).  Besides the prior precision chosen
by the marginal likelihood (the issue's protocol), two variants are ours: the prior precision
chosen on the validation set by a grid search on the predictive NLL (the paper tunes its
regularisation hyperparameters on validation data), and the last layer only
(``modules=[model[-1]]``, the rest at the MAP).  The all-layer approximations with a
marginal-likelihood prior are strongly under-confident here -- as is laplace-torch's
``KronLaplace`` on the same network (docs/experiments.md).
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from .. import nn as bnn
from ..laplace import EKFACLaplace, KFACLaplace
from . import _common, digits

METHODS = {"map": "MAP", "kfac-laplace": "K-FAC Laplace", "ekfac-laplace": "EK-FAC Laplace",
           "kfac-laplace-val": "K-FAC Laplace, validation prior", "ekfac-laplace-val": "EK-FAC Laplace, validation prior",
           "kfac-laplace-last": "K-FAC Laplace, last layer", "ekfac-laplace-last": "EK-FAC Laplace, last layer"}
#: (class, modules: None = every layer / "last", how the prior precision is chosen)
VARIANTS = {"kfac-laplace": (KFACLaplace, None, "marglik"), "ekfac-laplace": (EKFACLaplace, None, "marglik"),
            "kfac-laplace-val": (KFACLaplace, None, "gridsearch"),
            "ekfac-laplace-val": (EKFACLaplace, None, "gridsearch"),
            "kfac-laplace-last": (KFACLaplace, "last", "marglik"),
            "ekfac-laplace-last": (EKFACLaplace, "last", "marglik")}
METRICS = ["accuracy", "nll", "ece", "brier", "ood_auroc"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seeds", type=int, default=5, help="MAP training seeds 0..N-1 (default 5)")
    p.add_argument("--epochs", type=int, default=30, help="MAP training epochs (default 30)")
    _common.out_argument(p, "laplace_calibration.json/.md and the reliability diagrams")


def shifted(x: torch.Tensor) -> torch.Tensor:
    """The out-of-distribution set: the images rotated by 90 degrees."""
    return torch.rot90(x, 1, dims=(2, 3)).contiguous()


def _metrics(probs, y, probs_ood):
    ent_in = bnn.predictive_entropy(probs)
    ent_out = bnn.predictive_entropy(probs_ood)
    return {"accuracy": float(bnn.accuracy(probs, y)),
            "nll": float(-probs.gather(1, y.long().unsqueeze(1)).clamp_min(1e-300).log().mean()),
            "ece": float(bnn.ece(probs, y)), "brier": float(bnn.brier_score(probs, y)),
            "ood_auroc": float(bnn.ood_auroc(ent_in, ent_out))}


def run_seed(seed: int, epochs: int, data=None):
    xtr, xval, xte, ytr, yval, yte = data or digits.load_with_validation()
    x_ood = shifted(xte)
    out, probs, extra = {}, {}, {}
    with digits.one_thread():
        torch.manual_seed(seed)
        model = digits.train_map(digits.lenet5(), xtr, ytr, epochs, lr=5e-3, seed=seed)
        with torch.no_grad():
            probs["map"] = (model(xte).softmax(-1), model(x_ood).softmax(-1))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xtr, ytr), batch_size=128)
        val_loader = [(xval, yval)]
        for name, (cls, modules, method) in VARIANTS.items():
            t0 = time.perf_counter()
            la = cls(model, "classification", prior_precision=1.0,
                     modules=[model[-1]] if modules == "last" else None)
            la.fit(loader)
            if method == "marglik":
                la.optimize_prior_precision(method="marglik")
            else:  # validation NLL of the GLM probit predictive over 10^-2 .. 10^5
                la.optimize_prior_precision(method="gridsearch", val_loader=val_loader, link_approx="probit",
                                            log_prior_prec_min=-2, log_prior_prec_max=5, grid_size=29)
            with torch.no_grad():
                probs[name] = (la(xte, pred_type="glm", link_approx="probit"),
                               la(x_ood, pred_type="glm", link_approx="probit"))
            extra[name] = {"prior_precision": float(la.prior_precision.reshape(-1)[0]),
                           "fit_seconds": round(time.perf_counter() - t0, 2)}
    for name, (p_in, p_out) in probs.items():
        out[name] = dict(_metrics(p_in.double(), yte, p_out.double()), **extra.get(name, {}))
    return out, {k: v[0] for k, v in probs.items()}, yte


def run(args) -> dict:
    if args.seeds < 1 or args.epochs < 1:
        raise ValueError(f"--seeds and --epochs must be positive, got {args.seeds} and {args.epochs}")
    _common.prepare_out(args.out)  # before any training
    meta = _common.run_metadata()
    data = digits.load_with_validation()
    t_all = time.perf_counter()
    per_seed, first = [], None
    results = {"seeds": per_seed, "meta": meta, "wall_seconds": 0.0,
               "settings": {"epochs": args.epochs, "seeds": args.seeds,
                            "network": "LeNet-5 scaled to 8x8 (20-50-200-500)",
                            "ood": "test images rotated by 90 degrees", "ece_bins": 15, "predictive": "GLM, probit",
                            "prior_precision": "scalar: marginal likelihood, or validation NLL on a grid "
                                               "10^-2..10^5 (29 points)",
                            "data": f"digits: {len(data[0])} train / {len(data[1])} validation / {len(data[2])} test"}}
    for seed in _common.progress(range(args.seeds), "laplace-calibration"):
        res, probs, yte = run_seed(seed, args.epochs, data)
        per_seed.append(dict(res, seed=seed))
        if first is None:
            first = (probs, yte)
        # after every seed (an interrupted run keeps the seeds it finished), atomically
        results.update(wall_seconds=round(time.perf_counter() - t_all, 1), partial=len(per_seed) < args.seeds)
        _common.write_results(args.out, "laplace_calibration", results, lambda path: _plot(*first, path), markdown)
    return results


def markdown(results: dict, picture: str = None) -> str:
    meta = results["meta"]
    seeds = results["seeds"]
    lines = _common.header("K-FAC Laplace calibration on digits", meta, results["wall_seconds"],
                           f"{len(seeds)} seeds, mean ± standard error; OOD set: {results['settings']['ood']}") + [
             "", "| method | accuracy (%) | NLL | ECE (%) | Brier | OOD AUROC (entropy) |", "|---|---|---|---|---|---|"]
    for m, label in METHODS.items():
        cells = []
        for k in METRICS:
            scale = 100.0 if k in ("accuracy", "ece") else 1.0
            mean, se = _common.mean_se([s[m][k] * scale for s in seeds])
            cells.append(f"{mean:.3f} ± {se:.3f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    pps = []
    for m in METHODS:
        if m != "map":
            pp = [s[m]["prior_precision"] for s in seeds]
            pps.append(f"{METHODS[m]} {min(pp):.3g}-{max(pp):.3g}")
    lines += ["", "Prior precision chosen (range over the seeds): " + "; ".join(pps) + ".",
              "", f"Data: {results['settings'].get('data', '')}; the validation images choose the "
                  "'validation prior' rows and nothing else."]
    if picture:
        lines += ["", f"![reliability diagrams, seed 0]({os.path.basename(picture)})"]
    return "\n".join(lines) + "\n"


def _plot(probs, y, path):
    plt = _common.pyplot()
    if plt is None:
        return None
    ncol = 3
    nrow = -(-len(probs) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.6 * nrow), squeeze=False)
    for ax in axes.flat[len(probs):]:
        ax.set_visible(False)
    for ax, (name, p) in zip(axes.flat, probs.items()):
        conf, acc, count = bnn.calibration_bins(p.double(), y, 15)
        keep = count > 0
        width = 1.0 / 15
        centers = (torch.arange(15, dtype=torch.float64) + 0.5) * width
        ax.bar(centers[keep].numpy(), acc[keep].numpy(), width=width, edgecolor="black", color="tab:blue",
               label="accuracy")
        lo, gap = torch.minimum(acc, conf), (conf - acc).abs()
        ax.bar(centers[keep].numpy(), gap[keep].numpy(), bottom=lo[keep].numpy(), width=width, color="none",
               edgecolor="tab:red", hatch="//", label="gap to the bin's confidence")
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--")
        for c, a, n in zip(centers[keep].tolist(), acc[keep].tolist(), count[keep].tolist()):
            ax.text(c, min(a, 1.0) + 0.01, str(int(n)), ha="center", va="bottom", fontsize=5, color="dimgrey")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.08)
        ax.set_xlabel("confidence")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{METHODS[name]} (ECE {100 * float(bnn.ece(p.double(), y)):.2f}%)", fontsize=9)
    # one legend for all panels, below them, where it covers no bar
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.suptitle("Reliability diagrams, digits test set, seed 0 (15 bins; the number above a bar is its count of "
                 "test images)", fontsize=9)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
