r"""K-FAC / EK-FAC Laplace on MNIST (Kolesov 2021, scalable Laplace; the rotated-MNIST
benchmark of Laplace Redux, Daxberger et al. 2021).

Per seed: a MAP LeNet-5-Caffe (:func:`vmfdist.experiments.mnist_data.lenet5_caffe`; Adam on the
negative log joint with a N(0, 1) weight prior, as :func:`vmfdist.experiments.digits.train_map`)
is trained on the MNIST training images minus a validation set (``--validation`` images drawn
with a fixed seed); then :class:`vmfdist.laplace.KFACLaplace` and
:class:`vmfdist.laplace.EKFACLaplace` over every layer (GGN curvature from the same training
images) with the prior precision chosen two ways -- by the marginal likelihood
(``optimize_prior_precision(method="marglik")``) and on the validation images (a grid search on
the GLM predictive's NLL over 10^-2..10^5) -- and two predictives: the GLM predictive with the
probit approximation and the Monte Carlo predictive of sampled weights (``pred_type="nn"``).

Scored on the MNIST test images: accuracy, NLL, ECE (15 bins), Brier; under shift, on the test
images rotated by 15, 30, ..., 180 degrees (bilinear, zero fill); and out-of-distribution
detection by the predictive entropy as the AUROC against ``--ood-dir`` (any MNIST-format data
set, e.g. Fashion-MNIST) or, without it, the test images with their pixels shuffled by one fixed
permutation (the same intensity histogram, no strokes).  laplace-torch's ``KronLaplace`` is
fitted to the same network and data beside ours (when installed): the log marginal likelihood
and the GLM predictive on the test images at our prior precision, as relative differences.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from .. import nn as bnn
from ..datasets import load_mnist
from ..laplace import EKFACLaplace, KFACLaplace
from . import _common, digits, mnist_data

ANGLES = list(range(15, 181, 15))
#: method key -> (label, Laplace class, prior choice, predictive); "kfac"/"ekfac" use the
#: validation prior, the one docs/experiments.md recommends on this benchmark
METHODS = {
    "map": ("MAP", None, None, None),
    "kfac": ("K-FAC Laplace, validation prior, GLM probit", KFACLaplace, "validation", "probit"),
    "ekfac": ("EK-FAC Laplace, validation prior, GLM probit", EKFACLaplace, "validation", "probit"),
    "kfac-marglik": ("K-FAC Laplace, marginal-likelihood prior, GLM probit", KFACLaplace, "marglik", "probit"),
    "ekfac-marglik": ("EK-FAC Laplace, marginal-likelihood prior, GLM probit", EKFACLaplace, "marglik", "probit"),
    "kfac-mc": ("K-FAC Laplace, validation prior, GLM Monte Carlo", KFACLaplace, "validation", "mc"),
    "ekfac-mc": ("EK-FAC Laplace, validation prior, GLM Monte Carlo", EKFACLaplace, "validation", "mc"),
}
METRICS = ["accuracy", "nll", "ece", "brier", "ood_auroc"]
BATCH = 128
MC_SAMPLES = 100


def add_arguments(p: argparse.ArgumentParser) -> None:
    mnist_data.add_data_arguments(p)
    p.add_argument("--seeds", type=int, default=3, help="MAP training seeds 0..N-1 (default 3)")
    p.add_argument("--epochs", type=int, default=10, help="MAP training epochs (default 10)")
    p.add_argument("--validation", type=int, default=5000,
                   help="training images held out (fixed seed) to choose the validation prior (default 5000)")
    p.add_argument("--ood-dir", default=None,
                   help="an MNIST-format data set (e.g. Fashion-MNIST) whose test images are the OOD set "
                        "(default: the MNIST test images with their pixels shuffled by one fixed permutation)")
    p.add_argument("--shift-images", type=int, default=1000,
                   help="test images rotated at each angle, and OOD images (the first N; default 1000)")
    p.add_argument("--no-laplace-torch", action="store_true", help="skip the laplace-torch comparison")
    p.add_argument("--resume", action="store_true",
                   help="keep the seeds already in <out>/mnist_laplace.json (a run with the same settings) and run "
                        "the rest; each seed is saved when it finishes, and a seed's numbers do not depend on the others")
    _common.out_argument(p, "mnist_laplace.json/.md and the pictures")


def rotate(x: torch.Tensor, degrees: float) -> torch.Tensor:
    """The images ``x`` (N, C, H, W) rotated counter-clockwise by ``degrees`` about their centre
    (bilinear interpolation, zeros outside)."""
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    theta = torch.tensor([[c, -s, 0.0], [s, c, 0.0]], dtype=x.dtype).expand(len(x), 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def ood_images(args, x_test: torch.Tensor):
    """(images, description) of the out-of-distribution set."""
    if args.ood_dir:
        x, _ = load_mnist(args.ood_dir, train=False)
        x = (x[:len(x_test)].to(x_test.dtype) / 255.0).unsqueeze(1)
        return x, f"the test images of the MNIST-format set in {os.path.basename(os.path.abspath(args.ood_dir))}"
    perm = torch.randperm(x_test[0].numel(), generator=torch.Generator().manual_seed(0))
    return (x_test.reshape(len(x_test), -1)[:, perm].reshape(x_test.shape),
            "MNIST test images with their pixels shuffled by one fixed permutation")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _scores(probs: torch.Tensor, y: torch.Tensor) -> dict:
    probs = probs.double()
    return {"accuracy": float(bnn.accuracy(probs, y)), "nll": float(bnn.nll(probs, y)),
            "ece": float(bnn.ece(probs, y)), "brier": float(bnn.brier_score(probs, y))}


def _chunked(fn, x, size=500):
    with torch.no_grad():
        return torch.cat([fn(x[i:i + size]) for i in range(0, len(x), size)])


def _predictor(la, link_approx, seed):
    if link_approx == "probit":
        return lambda x: la(x, pred_type="glm", link_approx="probit")
    gen = torch.Generator().manual_seed(seed)  # the same draws of the logits' noise for every input set
    state = gen.get_state()

    def predict(x):
        gen.set_state(state)
        return la(x, pred_type="glm", link_approx="mc", n_samples=MC_SAMPLES, generator=gen)
    return predict


def _fit_laplaces(model, loader, val, seed):
    """{(class, prior choice): fitted Laplace} and their fit/prior timings."""
    fitted, info = {}, {}
    for cls in (KFACLaplace, EKFACLaplace):
        t0 = time.perf_counter()
        la = cls(model, "classification", prior_precision=1.0)
        la.fit(loader)
        t_fit = time.perf_counter() - t0
        for choice in ("marglik", "validation"):
            t0 = time.perf_counter()
            if choice == "marglik":
                la.optimize_prior_precision(method="marglik")
            else:
                # in batches of 500: the per-example rotated Jacobians of the convolutions are
                # (classes x images x out x in), 0.5 GB per 500 images for LeNet-5's second one
                val_batches = [(val[0][i:i + 500], val[1][i:i + 500]) for i in range(0, len(val[0]), 500)]
                la.optimize_prior_precision(method="gridsearch", val_loader=val_batches, link_approx="probit",
                                            log_prior_prec_min=-2, log_prior_prec_max=5, grid_size=29)
            fitted[(cls, choice)] = la.prior_precision.detach().clone()
            info[(cls.__name__, choice)] = {"prior_precision": float(la.prior_precision.reshape(-1)[0]),
                                            "fit_seconds": round(t_fit, 1),
                                            "prior_seconds": round(time.perf_counter() - t0, 1)}
        fitted[cls] = la
    return fitted, info


def run_seed(seed: int, args, data, x_ood) -> tuple:
    """One seed: MAP, the Laplaces, every method scored; returns (result, test probabilities)."""
    x_fit, y_fit, x_val, y_val, x_te, y_te = data
    res, test_probs = {}, {}
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = digits.train_map(mnist_data.lenet5_caffe(), x_fit, y_fit, args.epochs, lr=1e-3, seed=seed, batch=BATCH,
                             on_epoch=lambda e, loss: _say(f"seed {seed}: MAP epoch {e + 1}/{args.epochs}, loss "
                                                           f"{loss:.4f}, {time.perf_counter() - t0:.0f} s"))
    t_map = time.perf_counter() - t0
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_fit, y_fit), batch_size=BATCH)
    _say(f"seed {seed}: fitting K-FAC and EK-FAC Laplace on {len(x_fit)} images, choosing prior precisions")
    fitted, info = _fit_laplaces(model, loader, (x_val, y_val), seed)
    shift = x_te[:args.shift_images]
    sets = {"test": x_te, "ood": x_ood[:args.shift_images], **{str(a): rotate(shift, a) for a in ANGLES}}
    y_shift = y_te[:args.shift_images]
    for key, (_, cls, choice, link_approx) in METHODS.items():
        _say(f"seed {seed}: scoring {key}")
        t0 = time.perf_counter()
        if cls is None:
            predict = lambda x: model(x).softmax(-1)  # noqa: E731
        else:
            la = fitted[cls]
            la.prior_precision = fitted[(cls, choice)]
            predict = _predictor(la, link_approx, seed)
        probs = {name: _chunked(predict, x) for name, x in sets.items()}
        r = _scores(probs["test"], y_te)
        r["ood_auroc"] = float(bnn.ood_auroc(bnn.predictive_entropy(probs["test"].double()),
                                             bnn.predictive_entropy(probs["ood"].double())))
        r["rotated"] = {a: _scores(probs[str(a)], y_shift) for a in ANGLES}
        r["predict_seconds"] = round(time.perf_counter() - t0, 1)
        if cls is not None:
            r.update(info[(cls.__name__, choice)])
        else:
            r["train_seconds"] = round(t_map, 1)
        res[key] = r
        test_probs[key] = probs["test"]
    if not args.no_laplace_torch:
        res["laplace_torch"] = compare_laplace_torch(model, x_fit[:2000], y_fit[:2000], x_te[:200])
    return res, test_probs


def compare_laplace_torch(model, x, y, x_test) -> dict:
    """laplace-torch's ``KronLaplace`` and our ``KFACLaplace``, both fitted to the same network
    on the images ``x`` (float64 copies, prior precision 1): the relative difference of the log
    marginal likelihood and the largest difference of the GLM probit predictive on ``x_test``,
    with both fit times (``{"available": False}`` without laplace-torch)."""
    try:
        from laplace import KronLaplace
    except ImportError:
        return {"available": False}
    model = copy.deepcopy(model).double()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.double(), y), batch_size=BATCH)
    fits = {}
    for name, cls in (("laplace_torch", KronLaplace), ("vmfdist", KFACLaplace)):
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            la = cls(model, "classification", prior_precision=1.0)
            la.fit(loader)
        fits[name] = (la, round(time.perf_counter() - t0, 2))
    (ref, t_ref), (ours, t_ours) = fits["laplace_torch"], fits["vmfdist"]
    a, b = float(ref.log_marginal_likelihood()), float(ours.log_marginal_likelihood())
    # laplace-torch forms the (batch, classes, parameters) Jacobian: 20 images at a time (0.7 GB in float64)
    xt = x_test.double()
    pa = _chunked(lambda z: ref(z, pred_type="glm", link_approx="probit"), xt, 20)
    pb = _chunked(lambda z: ours(z, pred_type="glm", link_approx="probit"), xt, 20)
    return {"available": True, "images": len(x), "test_images": len(x_test), "fit_seconds": {"laplace_torch": t_ref, "vmfdist": t_ours},
            "log_marglik": {"laplace_torch": a, "vmfdist": b}, "log_marglik_rel_diff": abs(a - b) / abs(a),
            "glm_max_abs_diff": float((pa - pb).abs().max())}


def run(args) -> dict:
    mnist_data.check_positive(seeds=args.seeds, epochs=args.epochs, validation=args.validation,
                              shift_images=args.shift_images)
    _common.prepare_out(args.out)  # before any training
    xtr, ytr, xte, yte = mnist_data.load(args)
    data = mnist_data.split_validation(xtr, ytr, args.validation) + (xte, yte)
    x_ood, ood_text = ood_images(args, xte)
    meta = _common.run_metadata()
    t_all = time.perf_counter()
    per_seed, first = [], None
    results = {"seeds": per_seed, "meta": meta, "wall_seconds": 0.0,
               "settings": {"epochs": args.epochs, "seeds": args.seeds, "batch": BATCH, "lr": 1e-3,
                            "network": "LeNet-5-Caffe (20-50-800-500)", "ood": ood_text, "ece_bins": 15,
                            "angles": ANGLES, "mc_samples": MC_SAMPLES, "shift_images": args.shift_images,
                            "prior_precision": "scalar: marginal likelihood, or validation NLL of the GLM probit "
                                               "predictive on a grid 10^-2..10^5 (29 points)",
                            "data": f"MNIST: {len(data[0])} train / {len(data[2])} validation / {len(xte)} test"}}
    done = _finished_seeds(args, results["settings"]) if args.resume else []
    per_seed.extend(done)
    for seed in _common.progress(range(len(done), args.seeds), "mnist-laplace"):
        res, probs = run_seed(seed, args, data, x_ood)
        per_seed.append(dict(res, seed=seed))
        if first is None:
            first = (probs, yte, seed)
        results.update(wall_seconds=round(time.perf_counter() - t_all, 1), partial=len(per_seed) < args.seeds)
        _common.write_results(args.out, "mnist_laplace", results, lambda path: _plot(results, first, path), markdown)
    return results


def _finished_seeds(args, settings: dict) -> list:
    """The seeds of an earlier run in ``args.out`` with the same settings (``--resume``)."""
    path = os.path.join(args.out, "mnist_laplace.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        old = json.load(f)
    mine = json.loads(json.dumps(settings))  # the same JSON types as the file's
    mine.pop("seeds"), old["settings"].pop("seeds", None)
    if old["settings"] != mine:
        raise ValueError(f"--resume: {path!r} holds a run with other settings; remove it or run with the same options")
    return old["seeds"][:args.seeds]


def _rotated(method: dict, angle: int) -> dict:
    """The scores at ``angle`` (int keys in memory, str keys once read back from JSON)."""
    rot = method["rotated"]
    return rot[angle] if angle in rot else rot[str(angle)]


def _ms(values, scale=1.0):
    m, se = _common.mean_se([v * scale for v in values])
    return f"{m:.3f} ± {se:.3f}"


def markdown(results: dict, picture: str = None) -> str:
    seeds = results["seeds"]
    st = results["settings"]
    lines = _common.header("K-FAC / EK-FAC Laplace on MNIST", results["meta"], results["wall_seconds"],
                           f"{len(seeds)} seeds, mean ± standard error; {st['data']}") + [
        "", "| method | accuracy (%) | NLL | ECE (%) | Brier | OOD AUROC | prior precision |", "|---|---|---|---|---|---|---|"]
    for key, (label, *_rest) in METHODS.items():
        cells = [_ms([s[key][k] for s in seeds], 100.0 if k in ("accuracy", "ece") else 1.0) for k in METRICS]
        pp = [s[key].get("prior_precision") for s in seeds]
        pp = f"{min(pp):.3g}–{max(pp):.3g}" if pp[0] is not None else "—"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {pp} |")
    lines += ["", f"OOD set: {st['ood']} (the first {st['shift_images']}).", "",
              f"Rotated test images (the first {st['shift_images']}): NLL / ECE (%) per angle (mean over seeds).", "",
              "| method | " + " | ".join(f"{a}°" for a in st["angles"]) + " |", "|---|" + "---|" * len(st["angles"])]
    for key, (label, *_rest) in METHODS.items():
        cells = []
        for a in st["angles"]:
            rot = [_rotated(s[key], a) for s in seeds]
            cells.append(f"{sum(r['nll'] for r in rot) / len(rot):.2f} / {100 * sum(r['ece'] for r in rot) / len(rot):.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lt = [s["laplace_torch"] for s in seeds if s.get("laplace_torch", {}).get("available")]
    if lt:
        lines += ["", f"laplace-torch's KronLaplace beside our KFACLaplace, both fitted in float64 to the MAP network "
                  f"on the first {lt[0]['images']} training images (prior precision 1): log marginal likelihood "
                  f"relative difference up to {max(r['log_marglik_rel_diff'] for r in lt):.1e}, GLM probit predictive "
                  f"on {lt[0].get('test_images', 200)} test images up to {max(r['glm_max_abs_diff'] for r in lt):.1e} (absolute); fit "
                  f"{lt[0]['fit_seconds']['laplace_torch']} s (laplace-torch) against {lt[0]['fit_seconds']['vmfdist']} s "
                  "(ours), seed 0."]
    if picture:
        lines += ["", f"![reliability diagrams and accuracy / NLL per rotation angle]({os.path.basename(picture)})"]
    return "\n".join(lines) + "\n"


def _plot(results, first, path):
    plt = _common.pyplot()
    if plt is None:
        return None
    probs, y, first_seed = first
    seeds = results["seeds"]
    shown = ["map", "kfac", "ekfac", "kfac-marglik"]
    fig, axes = plt.subplots(2, 4, figsize=(14, 6.5))
    for ax, key in zip(axes[0], shown):
        bnn.reliability_diagram(probs[key].double(), y, 15, ax=ax)
        ax.set_title(f"{METHODS[key][0]}\nECE {100 * float(bnn.ece(probs[key].double(), y)):.2f}%", fontsize=7)
        ax.legend().set_visible(False)
    angles = results["settings"]["angles"]
    for ax, metric in zip(axes[1], ("accuracy", "nll", "ece")):
        for key in METHODS:
            vals = [sum(_rotated(s[key], a)[metric] for s in seeds) / len(seeds) for a in angles]
            ax.plot(angles, vals, marker=".", label=key)
        ax.set_xlabel("rotation (degrees)")
        ax.set_ylabel(metric)
    axes[1][0].legend(fontsize=6)
    axes[1][3].set_visible(False)
    fig.suptitle(f"MNIST test set: reliability diagrams (seed {first_seed}) and metrics per rotation angle (mean over "
                 "seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
