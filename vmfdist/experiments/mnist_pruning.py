r"""RDP structured pruning of LeNet-5-Caffe on MNIST (Oh, Adamczewski & Park 2019, §5.2, Table 2).

Per seed, three networks of the same shape (:func:`~vmfdist.experiments.mnist_data.lenet5_caffe`,
20-50-800-500) are trained alike -- Adam at 1e-3 for every parameter, batch 100, ``--epochs``
epochs (200 as the authors):

* RDP (:func:`vmfdist.nn.to_bayesian` with ``kind="rdp"``) with double grouping in all four
  layers, half-Cauchy scales 1e-2 (local) and 1e-3 (global), the vMF posterior concentration
  initialised at the prior's (``init_eps = prior_eps = 0.1``: both solve
  :math:`A_d(\kappa) = 0.9`) and the log-normal radius factors at scale 1e-4, all as in the
  authors' code (github.com/ChangYong-Oh/RadiusDirectionPosteriors: ``main.py``,
  ``HalfCauchy-fc0.01-conv0.01.json``, ``models/lenet_prior.py``, ``compress.py``) -- except
  three things the authors' code does differently (docs/experiments.md): its first convolution
  is a mean-field Gaussian layer pruned by filter norm, its thresholds are set by hand, and it
  trains on 50,000 of the 60,000 images;
* a mean-field (Bayes by Backprop) network (``kind="meanfield"``, the library's defaults);
* a deterministic network (cross-entropy only).

The Bayesian networks minimise the negative ELBO per example, its KL weight annealed linearly,
step by step, from 0 to 1 over the first ``--anneal-epochs`` epochs (100 as the authors).  The
model kept is the one with the lowest training cross-entropy (mean over the epoch's
mini-batches) among the last 10 epochs (the paper; the authors' ``compress_lenet_conv_double.py``).
Pixels are scaled to [-1, 1] as the authors' data loader does.

The RDP network is pruned at the gap of each grouping's log-modes (:func:`vmfdist.nn.gap_threshold`)
and compressed (:func:`vmfdist.nn.compress`) under both rules: ``"either"`` (a neuron goes
when its incoming *or* its outgoing group is pruned: the authors' count, which Table 2 uses)
and ``"both"`` (the library's default).  Recorded per rule: the pruned architecture, parameters
and FLOPs (the paper's formulas), the test error of the pruned network's posterior-mean
weights and of its 32-sample predictive (the RDP posterior with the pruned groups set to zero).
:func:`cut_to_target` adds, from training images only, what the issue's target widths would cost
each seed's posterior (evidence, not a pruning rule).

``--resume`` continues from the checkpoint written after every epoch of every network (model,
optimizer, random states, epoch, step and the best model so far): an interrupted run resumed
gives the numbers of an uninterrupted one.  ``--jobs N`` trains the seeds' networks in N worker
processes at once (one thread each; the longest first), then evaluates them here: every network
is trained from its own seed and random states, so the numbers are those of ``--jobs 1``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import math
import multiprocessing
import os
import sys
import time
from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F

from .. import nn as bnn
from . import _common, digits, mnist_data
from .pruning import plot_log_modes

BATCH = 100
LR = 1e-3
#: the model kept is the best (lowest training cross-entropy) of this many last epochs
SELECT_LAST = 10
PREDICTIVE_SAMPLES = 32
#: test images per predictive pass (32 samples of LeNet-5's activations stay within ~0.5 GB)
EVAL_CHUNK = 250
INPUT = (1, 28, 28)
NETWORKS = ("rdp", "meanfield", "deterministic")
#: the RDP layers' options (authors' values; see the module docstring)
RDP_OPTIONS = dict(grouping="double", tau_local=1e-2, tau_global=1e-3, prior_eps=0.1, init_eps=0.1,
                   lognormal_sigma=1e-4)
RULES = ("either", "both")
PAPER = "RDP (Oh et al. 2019, Table 2): 4-7-110-66, 125K FLOPs, 20K parameters, 1.0% test error"
#: Table 2 of Oh et al. 2019: (method, pruned architecture, FLOPs, parameters, test error) as printed
TABLE2 = (("RDP", "4-7-110-66", "125K", "20K", "1.0%"), ("BC-GNJ", "8-13-88-13", "307K", "22K", "1.0%"),
          ("BC-GHS", "5-10-76-16", "169K", "15K", "1.0%"), ("FDOO(100K)", "2-7-112-478", "119K", "66K", "1.1%"),
          ("FDOO(200K)", "3-8-128-499", "163K", "81K", "1.0%"), ("GL", "3-12-192-500", "236K", "134K", "1.0%"),
          ("GD", "7-13-208-16", "298K", "49K", "1.1%"), ("SBP", "3-18-284-283", "295K", "164K", "0.9%"))
#: the issue's target for every seed: test error of the pruned network at most this, widths at most these
TARGET_ERROR = 0.011
TARGET_WIDTHS = (10, 20, 250, 150)
#: the groupings whose kept count is each of the four widths: conv1's and conv2's filters (rows),
#: fc1's inputs (columns) and outputs (rows), in the order of the RDP layers
_WIDTH_GROUPINGS = ((0, "row"), (1, "row"), (2, "column"), (2, "row"))
#: training images (drawn at random, seed 0) on which :func:`cut_to_target` scores the cut networks
CUT_IMAGES = 10000


def add_arguments(p: argparse.ArgumentParser) -> None:
    mnist_data.add_data_arguments(p)
    p.add_argument("--seeds", type=int, default=3, help="training seeds 0..N-1 (default 3)")
    p.add_argument("--epochs", type=int, default=200, help="training epochs of every network (default 200, as the "
                                                           "authors)")
    p.add_argument("--anneal-epochs", type=int, default=100,
                   help="epochs over which the KL weight rises linearly from 0 to 1 (default 100, as the authors)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoints in <out>/mnist_pruning_checkpoints (written after every "
                        "epoch) instead of starting afresh")
    p.add_argument("--report", action="store_true",
                   help="only write <out>/mnist_pruning.md again from <out>/mnist_pruning.json (no training)")
    p.add_argument("--jobs", type=int, default=1,
                   help="train the networks of all seeds in this many processes at once (one thread each), then "
                        "evaluate them; the same numbers as --jobs 1 (default 1)")
    _common.out_argument(p, "mnist_pruning.json/.md, the log-mode picture and the checkpoints")


def _after_epoch(net: str, seed: int, epoch: int) -> None:
    """Called after every epoch's checkpoint is written (a hook for tests that interrupt a run)."""


def build(net: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    base = mnist_data.lenet5_caffe()
    if net == "rdp":
        return bnn.to_bayesian(base, "rdp", **RDP_OPTIONS)
    if net == "meanfield":
        return bnn.to_bayesian(base, "meanfield")
    return base


def _checkpoint_path(out: str, net: str, seed: int) -> str:
    return os.path.join(out, "mnist_pruning_checkpoints", f"seed{seed}_{net}.pt")


def train(net: str, seed: int, x: torch.Tensor, y: torch.Tensor, epochs: int, anneal_epochs: int,
          checkpoint: str, settings: dict, resume: bool) -> Tuple[torch.nn.Module, dict]:
    """Train one network (checkpoint after every epoch); returns the kept model (best training
    cross-entropy of the last :data:`SELECT_LAST` epochs) and the training record."""
    model = build(net, seed)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(seed)
    n = len(x)
    anneal = anneal_epochs * math.ceil(n / BATCH)
    elbo = None if net == "deterministic" else bnn.ELBO(
        model, num_data=n, kl_weight=lambda s: min(s, anneal) / anneal if anneal else 1.0, check_finite=False)
    rec = {"epoch": 0, "step": 0, "best_state": None, "best_xent": math.inf, "best_epoch": None, "log": [],
           "train_seconds": 0.0}
    state = _common.load_checkpoint(checkpoint, settings) if resume else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        mnist_data.set_rng_state(state["rng"])
        gen.set_state(state["batch_rng"])
        rec = state["record"]
    else:
        torch.manual_seed(seed)
    if elbo is not None:
        elbo.step = rec["step"]
    model.train()
    for epoch in range(rec["epoch"], epochs):
        t0 = time.perf_counter()
        tot_loss, tot_xent, count = 0.0, 0.0, 0
        for idx in _common.minibatches(n, BATCH, gen):
            out = model(x[idx])
            if elbo is None:
                loss = xent = F.cross_entropy(out, y[idx])
            else:
                loss = elbo(out, y[idx])
                xent = elbo.nll
            if not bool(torch.isfinite(loss)):
                raise FloatingPointError(f"{net}, seed {seed}: the loss is not finite in epoch {epoch + 1}")
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot_loss += float(loss.detach()) * len(idx)
            tot_xent += float(xent.detach()) * len(idx)
            count += len(idx)
        seconds = time.perf_counter() - t0
        rec["step"] = elbo.step if elbo is not None else rec["step"] + math.ceil(n / BATCH)
        entry = {"epoch": epoch + 1, "loss": tot_loss / count, "cross_entropy": tot_xent / count,
                 "kl_weight": None if elbo is None else elbo.kl_weight_value}
        rec["log"].append(entry)
        rec["train_seconds"] += seconds
        if epoch >= epochs - SELECT_LAST and entry["cross_entropy"] < rec["best_xent"]:
            rec.update(best_state=copy.deepcopy(model.state_dict()), best_xent=entry["cross_entropy"],
                       best_epoch=epoch + 1)
        rec["epoch"] = epoch + 1
        _common.save_checkpoint(checkpoint, {"settings": settings, "model": model.state_dict(),
                                                "optimizer": opt.state_dict(), "rng": mnist_data.rng_state(),
                                                "batch_rng": gen.get_state(), "record": rec})
        sys.stderr.write(f"mnist-pruning seed {seed} {net:<13} epoch {epoch + 1}/{epochs}: loss {entry['loss']:.4f}, "
                         f"cross-entropy {entry['cross_entropy']:.4f}, {seconds:.1f} s\n")
        sys.stderr.flush()
        _after_epoch(net, seed, epoch + 1)
    model.load_state_dict(rec["best_state"])
    model.eval()
    return model, rec


@torch.no_grad()
def errors(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, predictive: bool, seed: int) -> Dict[str, float]:
    """Test error of the posterior-mean weights (of the plain weights for a plain network) and,
    with ``predictive``, of the :data:`PREDICTIVE_SAMPLES`-sample predictive (seeded by ``seed``),
    in chunks of :data:`EVAL_CHUNK` images."""
    model.eval()
    wrong_mean = wrong_pred = 0
    torch.manual_seed(seed)
    with bnn.deterministic(model, "mean"):
        for i in range(0, len(x), EVAL_CHUNK):
            wrong_mean += int((model(x[i:i + EVAL_CHUNK]).argmax(-1) != y[i:i + EVAL_CHUNK]).sum())
    res = {"error_mean_weights": wrong_mean / len(x)}
    if predictive:
        for i in range(0, len(x), EVAL_CHUNK):
            pred = bnn.predict(model, x[i:i + EVAL_CHUNK], num_samples=PREDICTIVE_SAMPLES)
            wrong_pred += int((pred.probs.argmax(-1) != y[i:i + EVAL_CHUNK]).sum())
        res["error_predictive"] = wrong_pred / len(x)
    return res


@torch.no_grad()
def masked_copy(model: torch.nn.Sequential, thresholds: Dict[str, float], rule: str) -> torch.nn.Sequential:
    """A copy of the RDP ``model`` whose pruned groups are exactly zero in every weight sample
    and in the posterior mean (their local radius factor ``a`` at ``exp(-1e4)``); with
    ``rule="either"`` the pruned rows' biases are zero too (but the last layer's), as the
    authors' masked forward: the function of ``compress(model, thresholds, rule=rule)``, with
    the posterior's randomness kept for the predictive."""
    m = copy.deepcopy(model)
    layers = [(name, mod) for name, mod in bnn.bayesian_modules(m) if isinstance(mod, (bnn.RDPLinear, bnn.RDPConv2d))]
    for k, (name, layer) in enumerate(layers):
        for side, lm in layer.log_modes().items():
            pruned = lm <= thresholds[f"{name}.{side}"]
            factor = getattr(layer, side)
            factor.local_radius[0, pruned] = -1e4
            if side == "row" and rule == "either" and k < len(layers) - 1 and layer.bias_mu is not None:
                layer.bias_mu[pruned] = 0.0
                layer.bias_rho[pruned] = -1e4
    return m


def _arch(model) -> List[int]:
    return [int(v) for v in bnn.architecture(model).split("-")]


def _error(model, x, y) -> float:
    """The fraction of ``x`` that the plain (compressed) ``model`` misclassifies, in chunks."""
    with torch.no_grad():
        return sum(int((model(x[i:i + EVAL_CHUNK]).argmax(-1) != y[i:i + EVAL_CHUNK]).sum())
                   for i in range(0, len(x), EVAL_CHUNK)) / len(x)


def prune(rdp: torch.nn.Module, xte, yte, seed: int) -> Tuple[dict, dict, Dict[str, torch.Tensor]]:
    """Thresholds at the log-mode gaps; per rule the compressed network's numbers."""
    modes = {f"{name}.{side}": v.detach().clone() for name, d in bnn.log_modes(rdp).items() for side, v in d.items()}
    thresholds = {k: bnn.gap_threshold(v) for k, v in modes.items()}
    per_rule = {}
    for rule in RULES:
        small = bnn.compress(rdp, threshold=thresholds, rule=rule).eval()
        err = _error(small, xte, yte)
        masked = errors(masked_copy(rdp, thresholds, rule), xte, yte, True, seed)
        per_rule[rule] = {"architecture": _arch(small), "params": bnn.count_parameters(small),
                          "flops": bnn.count_flops(small, INPUT), "error_mean_weights": err,
                          "error_mean_weights_masked": masked["error_mean_weights"],
                          "error_predictive": masked["error_predictive"]}
    return per_rule, thresholds, modes


def cut_to_target(rdp: torch.nn.Module, thresholds: Dict[str, float], modes: Dict[str, torch.Tensor], x, y) -> dict:
    """What the target widths would cost this posterior, on training images only: on top of the
    gap thresholds, each grouping that sets one of the four widths is cut to at most its target
    width (keeping its groups with the largest log-modes: the library's ranking), the network
    compressed by the authors' rule, and its error counted on :data:`CUT_IMAGES` training images
    drawn at random (seed 0) beside the gap-pruned network's.  No test image is used: the cut is
    evidence of whether any log-mode threshold could meet the target, not a pruning rule."""
    sel = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:CUT_IMAGES]
    xs, ys = x[sel], y[sel]
    names = [name for name, mod in bnn.bayesian_modules(rdp) if isinstance(mod, (bnn.RDPLinear, bnn.RDPConv2d))]
    cut = dict(thresholds)
    for (layer, side), width in zip(_WIDTH_GROUPINGS, TARGET_WIDTHS):
        key = f"{names[layer]}.{side}"
        s = torch.sort(modes[key].to(torch.float64), descending=True).values
        if s.numel() > width:
            cut[key] = max(cut[key], float(0.5 * (s[width - 1] + s[width])))
    gap_net = bnn.compress(rdp, threshold=thresholds, rule="either").eval()
    cut_net = bnn.compress(rdp, threshold=cut, rule="either").eval()
    return {"images": len(xs), "train_error_gap": _error(gap_net, xs, ys), "architecture": _arch(cut_net),
            "params": bnn.count_parameters(cut_net), "train_error": _error(cut_net, xs, ys),
            "thresholds": {k: (t if t > -math.inf else None) for k, t in cut.items()}}


def run_seed(seed: int, args, data, settings: dict) -> Tuple[dict, dict, dict]:
    xtr, ytr, xte, yte = data
    res = {"seed": seed}
    with digits.one_thread():
        kept = {}
        for net in NETWORKS:
            model, rec = train(net, seed, xtr, ytr, args.epochs, args.anneal_epochs,
                               _checkpoint_path(args.out, net, seed), dict(settings, network=net, seed=seed), args.resume)
            kept[net] = model
            res[net] = dict(errors(model, xte, yte, net != "deterministic", seed), best_epoch=rec["best_epoch"],
                            best_train_cross_entropy=rec["best_xent"], train_seconds=round(rec["train_seconds"], 1),
                            epoch_seconds=round(rec["train_seconds"] / max(len(rec["log"]), 1), 1),
                            log=[{k: (round(v, 6) if isinstance(v, float) else v) for k, v in e.items()}
                                 for e in rec["log"]])
        per_rule, thresholds, modes = prune(kept["rdp"], xte, yte, seed)
        res["target_cut"] = cut_to_target(kept["rdp"], thresholds, modes, xtr, ytr)
    full = mnist_data.lenet5_caffe()
    res["unpruned"] = {"architecture": _arch(full), "params": bnn.count_parameters(full),
                       "flops": bnn.count_flops(full, INPUT)}
    res["pruned"] = per_rule
    main = per_rule["either"]
    res.update(architecture=main["architecture"], params_pruned=main["params"], flops_pruned=main["flops"],
               error_pruned=main["error_mean_weights"], error_predictive=main["error_predictive"],
               rule="either",
               error_meanfield=res["meanfield"]["error_mean_weights"],
               error_meanfield_predictive=res["meanfield"]["error_predictive"],
               error_deterministic=res["deterministic"]["error_mean_weights"],
               error_rdp_unpruned=res["rdp"]["error_mean_weights"],
               error_rdp_unpruned_predictive=res["rdp"]["error_predictive"],
               thresholds={k: (t if t > -math.inf else None) for k, t in thresholds.items()},
               kept={k: [int((v > thresholds[k]).sum()), v.numel()] for k, v in modes.items()})
    return res, modes, thresholds


def _train_job(net: str, seed: int, args, settings: dict) -> None:
    """One network of one seed, in a worker process of ``--jobs``: trained to its last epoch
    (checkpoint after every epoch, as in the main process), for :func:`run` to evaluate."""
    xtr, ytr, _, _ = _scaled(mnist_data.load(args))
    with digits.one_thread():
        train(net, seed, xtr, ytr, args.epochs, args.anneal_epochs, _checkpoint_path(args.out, net, seed),
              dict(settings, network=net, seed=seed), args.resume)


def _train_in_parallel(args, settings: dict) -> None:
    """Every (seed, network) pair trained in ``args.jobs`` processes, the RDP networks (the
    slowest) first; a worker's error is raised here."""
    jobs = [(net, seed) for net in NETWORKS for seed in range(args.seeds)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with torch's thread pools
    with concurrent.futures.ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs)), mp_context=ctx) as pool:
        futures = [pool.submit(_train_job, net, seed, args, settings) for net, seed in jobs]
        for f in concurrent.futures.as_completed(futures):
            f.result()


def _scaled(data):
    xtr, ytr, xte, yte = data
    return xtr * 2 - 1, ytr, xte * 2 - 1, yte  # the authors' Normalize((0.5,), (0.5,))


def run(args) -> dict:
    if args.report:
        return _report(args.out)
    mnist_data.check_positive(seeds=args.seeds, epochs=args.epochs, jobs=args.jobs)
    if not isinstance(args.anneal_epochs, int) or args.anneal_epochs < 0:
        raise ValueError(f"--anneal-epochs must be a non-negative integer, got {args.anneal_epochs!r}")
    _common.prepare_out(args.out)  # before any training
    meta = _common.run_metadata()
    data = _scaled(mnist_data.load(args))
    xtr, xte = data[0], data[2]
    settings = {"epochs": args.epochs, "anneal_epochs": args.anneal_epochs, "batch": BATCH, "lr": LR,
                "optimizer": "Adam (torch defaults but the learning rate), every parameter", "train_images": len(xtr),
                "test_images": len(xte), "limit": args.limit, "test_limit": args.test_limit,
                "rdp_options": dict(RDP_OPTIONS), "select": f"best training cross-entropy of the last {SELECT_LAST} "
                                                            "epochs", "predictive_samples": PREDICTIVE_SAMPLES,
                "pixels": "scaled to [-1, 1]", "network": "LeNet-5-Caffe 20-50-800-500 (ReLU after every layer)"}
    ck_settings = {k: settings[k] for k in ("epochs", "anneal_epochs", "batch", "lr", "train_images", "limit",
                                            "rdp_options")}
    t_all = time.perf_counter()
    resume = bool(args.resume)
    if args.jobs > 1:
        _train_in_parallel(args, ck_settings)
        args = argparse.Namespace(**dict(vars(args), resume=True))  # evaluate the trained checkpoints
    per_seed: List[dict] = []
    first = None
    results = {"seeds": per_seed, "settings": dict(settings, seeds=args.seeds, resume=resume, jobs=args.jobs),
               "meta": meta, "wall_seconds": 0.0}
    for seed in range(args.seeds):
        res, modes, thresholds = run_seed(seed, args, data, ck_settings)
        per_seed.append(res)
        if first is None:
            first = (modes, thresholds)
        results.update(wall_seconds=round(time.perf_counter() - t_all, 1), partial=len(per_seed) < args.seeds)
        _common.write_results(args.out, "mnist_pruning", results,
                              lambda path: plot_log_modes(*first, path, "RDP LeNet-5-Caffe on MNIST (seed 0): "
                                                          "log-modes and pruning thresholds (cf. Oh et al. 2019, "
                                                          "Fig. 7)"), markdown)
    return results


def _report(out: str) -> dict:
    """``--report``: the page written again from the results file (the picture kept as it is)."""
    path = os.path.join(out, "mnist_pruning.json")
    if not os.path.exists(path):
        raise ValueError(f"--report: no results file {path!r} (run the experiment with --out {out!r} first)")
    with open(path, encoding="utf-8") as f:
        results = json.load(f)
    picture = os.path.join(out, "mnist_pruning.png")
    _common.write_text(os.path.join(out, "mnist_pruning.md"),
                       markdown(results, picture if os.path.exists(picture) else None))
    return results


def _mean_se(values, fmt: str) -> str:
    """``mean ± standard error`` (:func:`_common.mean_se`); the mean alone for one value."""
    m, se = _common.mean_se(values)
    return format(m, fmt) if len(values) < 2 else f"{format(m, fmt)} ± {format(se, fmt)}"


def _target_lines(seeds: List[dict]) -> List[str]:
    """Per rule: mean ± standard error over the seeds, and on how many seeds the issue's target
    (error of the pruned posterior mean <= 1.1 %, widths <= 10-20-250-150) is met."""
    lines = ["", "| rule | pruned, mean weights (%) | pruned, predictive (%) | parameters | FLOPs | "
                 "seeds meeting the target |", "|---|---|---|---|---|---|"]
    for rule in RULES:
        ps = [s["pruned"][rule] for s in seeds]
        met = sum(p["error_mean_weights"] <= TARGET_ERROR and
                  all(w <= t for w, t in zip(p["architecture"], TARGET_WIDTHS)) for p in ps)
        lines.append(f"| {rule} | {_mean_se([100 * p['error_mean_weights'] for p in ps], '.2f')} | "
                     f"{_mean_se([100 * p['error_predictive'] for p in ps], '.2f')} | "
                     f"{_mean_se([p['params'] for p in ps], '.0f')} | {_mean_se([p['flops'] for p in ps], '.0f')} | "
                     f"{met} of {len(ps)} |")
    lines += ["", f"Mean ± standard error over {len(seeds)} seed(s).  The target (every seed): test error of the "
                  f"pruned network's posterior mean at most {100 * TARGET_ERROR:.1f}% and an architecture no larger "
                  f"than {'-'.join(map(str, TARGET_WIDTHS))}, no collapsed seed."]
    return lines


def _cut_lines(seeds: List[dict]) -> List[str]:
    """The table of :func:`cut_to_target` (absent from results written before it existed)."""
    if not all("target_cut" in s for s in seeds):
        return []
    n = seeds[0]["target_cut"]["images"]
    lines = ["", f"What the target widths cost, on {n} training images (no test image): the gap-pruned network "
                 "(*either*) beside the same network with the groupings that set the four widths cut further, by "
                 f"log-mode, to at most {'-'.join(map(str, TARGET_WIDTHS))}. A training error above "
                 f"{100 * TARGET_ERROR:.1f}% for the cut network says that no log-mode threshold meets the target on "
                 "that seed's posterior.", "",
             "| seed | gap-pruned | training error (%) | cut to the target widths | parameters | training error (%) |",
             "|---|---|---|---|---|---|"]
    for s in seeds:
        c = s["target_cut"]
        lines.append(f"| {s['seed']} | {'-'.join(map(str, s['pruned']['either']['architecture']))} | "
                     f"{100 * c['train_error_gap']:.2f} | {'-'.join(map(str, c['architecture']))} | {c['params']} | "
                     f"{100 * c['train_error']:.2f} |")
    return lines


def _table2_lines() -> List[str]:
    return (["", "Table 2 of the paper (LeNet-5-Caffe 20-50-800-500 on MNIST, as printed):", "",
             "| method | pruned architecture | FLOPs | parameters | error |", "|---|---|---|---|---|"]
            + [f"| {' | '.join(row)} |" for row in TABLE2])


def markdown(results: dict, picture: str = None) -> str:
    seeds = results["seeds"]
    st = results["settings"]
    short = st["epochs"] < 200 or st["anneal_epochs"] != 100 or st["train_images"] < 50000
    lines = _common.header("RDP structured pruning of LeNet-5-Caffe on MNIST", results["meta"],
                           results["wall_seconds"],
                           f"{len(seeds)} seed(s); {st['epochs']} epochs, KL weight annealed over {st['anneal_epochs']}; "
                           f"{st['train_images']} training and {st['test_images']} test images")
    if short:
        lines += ["", f"**A short run, not the paper's protocol** (200 epochs, KL annealed over 100, on MNIST): "
                      f"{st['epochs']} epochs, annealing over {st['anneal_epochs']}. Its numbers say that the "
                      "command works, not what the method reaches."]
    pc = lambda v: f"{100 * v:.2f}"  # noqa: E731
    lines += ["", "Test errors in %; pruned networks by the authors' rule (*either*: a neuron goes when its incoming "
                  "or its outgoing group is pruned) and by the library's default (*both*: when both are); "
                  "mean weights = posterior mean, predictive = 32 samples with the pruned groups zeroed.", "",
              "| seed | rule | architecture | parameters | FLOPs | pruned, mean weights | pruned, predictive | "
              "RDP unpruned, mean / predictive | mean-field, mean / predictive | deterministic |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for s in seeds:
        for rule in RULES:
            p = s["pruned"][rule]
            lines.append(f"| {s['seed']} | {rule} | {'-'.join(map(str, p['architecture']))} | {p['params']} | "
                         f"{p['flops']} | {pc(p['error_mean_weights'])} | {pc(p['error_predictive'])} | "
                         f"{pc(s['rdp']['error_mean_weights'])} / {pc(s['rdp']['error_predictive'])} | "
                         f"{pc(s['meanfield']['error_mean_weights'])} / {pc(s['meanfield']['error_predictive'])} | "
                         f"{pc(s['deterministic']['error_mean_weights'])} |")
    lines += _target_lines(seeds) + _cut_lines(seeds) + _table2_lines()
    u = seeds[0]["unpruned"]
    lines += ["", f"Unpruned: {'-'.join(map(str, u['architecture']))}, {u['params']} parameters, {u['flops']} FLOPs.",
              "", f"The paper: {PAPER}. By the paper's own formulas 4-7-110-66 has (25+1)·4 + (4·25+1)·7 + (110+1)·66 "
              "+ (66+1)·10 = 8807 parameters and (25+1)·24·24·4 + (4·25+1)·8·8·7 + (110+1)·66 + (66+1)·10 = 113148 "
              "FLOPs, not 20K and 125K.", "",
              "Training time per epoch (one thread, mean over the epochs run): " + "; ".join(
                  f"seed {s['seed']}: " + ", ".join(f"{n} {s[n]['epoch_seconds']} s" for n in NETWORKS) for s in seeds)
              + ". Kept epochs (best training cross-entropy of the last 10): " + "; ".join(
                  f"seed {s['seed']}: " + ", ".join(f"{n} {s[n]['best_epoch']}" for n in NETWORKS) for s in seeds) + "."]
    if picture:
        lines += ["", f"![log-modes of the local radii, seed 0]({os.path.basename(picture)})"]
    return "\n".join(lines) + "\n"
