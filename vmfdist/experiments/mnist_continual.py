r"""Split MNIST variational continual learning: mean-field VI (VCL) against Radial BNNs
(Farquhar, Osborne & Gal 2020, section 4.2 and Appendix D.2).

The paper runs Split FashionMNIST, which is not available here; this runs the same protocol on
Split MNIST (the benchmark of Nguyen et al. 2018, VCL).  Five two-class tasks, digits 0/1, 2/3,
4/5, 6/7, 8/9, learned in that order by a multi-head network: a shared Bayesian MLP body (the
Radial paper's: four hidden layers of 200 units, ReLU) and one Bayesian 2-way output head per
task.  Every weight has a mean-field Gaussian (``kind="meanfield"``) or Radial
(``kind="radial"``) posterior (:func:`vmfdist.nn.to_bayesian`).  Task 1 starts from the
N(0, 1) prior; after each task :func:`vmfdist.nn.posterior_as_prior` makes the body's (and that
head's) posterior the prior of the next task -- for Radial the Gaussian with the posterior's mean
and sigma, the prior the paper's Appendix C (eq. 44) evaluates -- and the next task's training
starts from that posterior; each new head starts from the initial N(0, 1) prior.  No coresets
and no pre-training of the means (as the paper).

Settings of the paper (App. D.2): 90% of the training images for training (54000), 10% held out
(fixed seed; :func:`mnist_data.split_validation`), inputs standardised by the training
images' mean and standard deviation, He-initialised means, rho = -6 (sigma = softplus(-6)),
AMSGrad with learning rate 1e-3, batches of 1024 with the last incomplete batch of each epoch
dropped, one weight sample per step (the paper does not say; VCL's code draws 10), the
ELBO with the full KL (:class:`vmfdist.nn.ELBO`, N = the task's training images).  Epochs per
task: the paper's validation choices, 60 for mean-field and 20 for Radial (``--epochs`` sets one
number for both).  Metric: after each task t, the test accuracy of every task 1..t with its own
head on its own test images, from the 32-sample predictive (:func:`vmfdist.nn.predict`), and
their average.  ``--validation`` scores on the held-out images instead (for choosing settings).

Every epoch of every task is checkpointed (``<out>/mnist_continual.checkpoint.pt``, removed when
the run completes); ``--resume`` continues an interrupted run to the numbers an uninterrupted
one gives.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Dict, List, Optional

import torch
from torch import nn

from .. import nn as bnn
from . import _common, digits, mnist_data

TASKS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
METHODS = {"meanfield": "mean-field (VCL)", "radial": "Radial"}
#: hidden layers of the shared body (Farquhar et al. 2020, App. D.2)
HIDDEN = (200, 200, 200, 200)
BATCH = 1024
LR = 1e-3
RHO_INIT = -6.0
SIGMA_INIT = math.log1p(math.exp(RHO_INIT))  # softplus(-6) = 0.00248
#: epochs per task chosen on validation data by the paper (App. D.2), per method
PAPER_EPOCHS = {"meanfield": 60, "radial": 20}
TEST_SAMPLES = 32
VALIDATION_FRACTION = 0.1
STEM = "mnist_continual"

#: published average accuracies after the 5 tasks of Split MNIST (multi-head) of mean-field VCL, with
#: where each comes from: (label, value in %, source).  VCL's network is 2 x 256 units, 120 full-batch
#: epochs per task, means pre-trained by maximum likelihood -- not this protocol.
PUBLISHED = [
    ("VCL without coreset (Nguyen et al. 2018, ICLR, section 5.1, Split MNIST)", "97.0",
     "the value as recalled from the paper's text; the paper itself was not available here to check it"),
    ("VCL, variant not stated (attributed to Nguyen et al. 2018)", "98.4",
     "wizwand.com's benchmark listing of the VCL paper, https://www.wizwand.com/paper/68fa645e1e209131cea040c5: "
     "'Continual Learning / Split MNIST / Mean Test Accuracy 98.4'; the same page lists "
     "'Image Classification / Split MNIST / Average Accuracy 96.45' for it, source not stated"),
]
#: what differs from the paper, and the cost (printed under the tables)
NOTES = [
    "The paper's data set is Split FashionMNIST (not available here); its settings are used unchanged on MNIST.",
    "Epochs per task: the paper's validation choices for batch 1024 (App. D.2: 60 mean-field, 20 Radial; "
    "grid 3-120); VCL (Nguyen et al. 2018) trains 120 full-batch epochs per task after pre-training the means. "
    "The whole run (3 seeds) takes about a quarter of an hour on one CPU thread; 1 weight sample per step "
    "(VCL's code draws 10) and a 32-sample predictive (VCL: 100) keep it there.",
    "With rho initialised at -6 and AMSGrad at 1e-3, rho moves by about 1e-3 per step: after task 1 (seed 0, "
    "measured separately) sigma is at most 0.0048 (mean-field, 600 steps) and 0.0031 (Radial, 200 steps) from "
    "0.0025, so each task's prior N(mu, sigma^2) holds the shared weights within a few thousandths of the previous "
    "means (both methods; the Radial posterior's own per-weight spread is sigma / sqrt(D), far narrower still).",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    mnist_data.add_data_arguments(p)
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--epochs", type=int, default=None,
                   help="training epochs per task, both methods (default: the paper's validation choices, "
                        f"{PAPER_EPOCHS['meanfield']} mean-field and {PAPER_EPOCHS['radial']} Radial)")
    p.add_argument("--batch", type=int, default=BATCH,
                   help=f"batch size (default {BATCH}; at most a task's training images)")
    p.add_argument("--validation", action="store_true",
                   help=f"score on the held-out {VALIDATION_FRACTION:.0%} of the training images instead of the "
                        "test images: for choosing settings")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --out (written after every epoch of every task)")
    _common.out_argument(p, f"{STEM}.json/.md/.png (and the checkpoint while running)")


# ---- data --------------------------------------------------------------------------------
def prepare(args):
    """``[((x_train, y_train), (x_eval, y_eval)) per task]`` (inputs standardised and flattened,
    labels 0/1 within the task) and a description of the data."""
    xtr, ytr, xte, yte = mnist_data.load(args)
    n_val = max(1, int(round(VALIDATION_FRACTION * len(xtr))))
    xfit, yfit, xval, yval = mnist_data.split_validation(xtr, ytr, n_val, seed=0)
    if args.validation:
        xte, yte = xval, yval
    mean, std = xfit.mean(), xfit.std()
    tasks = []
    for a, b in TASKS:
        parts = []
        for x, y in ((xfit, yfit), (xte, yte)):
            sel = (y == a) | (y == b)
            if not bool(sel.any()):
                raise ValueError(f"--data-dir: no images of digits {a}/{b} in the {'training' if x is xfit else 'test'} "
                                 "set (too small a --limit / --test-limit?)")
            parts.append((((x[sel] - mean) / std).flatten(1).contiguous(), (y[sel] == b).long()))
        tasks.append(tuple(parts))
    info = (f"MNIST: {len(xfit)} training images ({len(xval)} held out), "
            f"{len(xte)} {'validation' if args.validation else 'test'} images; per task "
            f"{', '.join(str(len(t[0][1])) for t in tasks)} training images")
    return tasks, info


# ---- model and training ------------------------------------------------------------------
def build(kind: str, seed: int, in_features: int = 28 * 28) -> nn.ModuleDict:
    """The multi-head network: ``body`` (Bayesian MLP, :data:`HIDDEN`, ReLU) and one Bayesian
    2-way ``heads[t]`` per task, all with the N(0, 1) prior and sigma = softplus(-6).  The same
    ``seed`` gives both kinds the same initial means."""
    torch.manual_seed(seed)
    layers, n = [], in_features
    for h in HIDDEN:
        layers += [nn.Linear(n, h), nn.ReLU()]
        n = h
    body = bnn.to_bayesian(nn.Sequential(*layers), kind, sigma_init=SIGMA_INIT)
    heads = nn.ModuleList(bnn.to_bayesian(nn.Sequential(nn.Linear(n, 2)), kind, sigma_init=SIGMA_INIT)
                          for _ in TASKS)
    return nn.ModuleDict({"body": body, "heads": heads})


def network(model: nn.ModuleDict, task: int) -> nn.Sequential:
    """The body followed by head ``task`` (the same modules, one flat ``nn.Sequential``)."""
    return nn.Sequential(*model["body"], *model["heads"][task])


def _seed(seed: int, kind: str, task: int) -> int:
    return 10007 * seed + 101 * (list(METHODS).index(kind) + 1) + task


def _epoch(net, elbo, opt, x, y, batch, gen) -> Dict[str, float]:
    """One epoch of AMSGrad on the negative ELBO, the last incomplete batch dropped; the mean NLL
    and KL / N of its steps."""
    b = min(batch, len(x))
    nll = kl = 0.0
    steps = 0
    for idx in _common.minibatches(len(x), b, gen):
        if len(idx) < b:
            continue
        loss = elbo(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        nll += float(elbo.nll)
        kl += float(elbo.kl) / elbo.num_data
        steps += 1
    return {"nll": nll / steps, "kl_per_datum": kl / steps}


@torch.no_grad()
def evaluate(model: nn.ModuleDict, tasks, upto: int, seed: int) -> List[float]:
    """Accuracy of tasks ``0..upto`` (each with its own head, on its own evaluation images) from the
    :data:`TEST_SAMPLES`-sample predictive; the random draws are forked off (fixed per seed and
    task), so that evaluating changes nothing in the training."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(seed, "meanfield", upto) + 55)
        return [float(bnn.accuracy(bnn.predict(network(model, k), tasks[k][1][0], num_samples=TEST_SAMPLES),
                                   tasks[k][1][1])) for k in range(upto + 1)]


def run_method(seed: int, kind: str, tasks, epochs: int, batch: int, save, label: str, resume: Optional[dict] = None):
    """Train ``kind`` on the tasks in sequence (from ``resume``, a checkpoint's method state, when
    given); ``save(state)`` after every epoch.  Returns the method's record: ``accuracy`` (after
    task t, the accuracy of tasks 1..t), ``average`` (their means), ``train`` (the last epoch's
    NLL and KL / N of every task) and ``seconds``."""
    if resume is None:
        model = build(kind, seed)
        rec = {"accuracy": [], "average": [], "train": [], "seconds": 0.0}
        task0, epoch0 = 0, 0
    else:
        model, rec, task0, epoch0 = resume["model"], resume["record"], resume["task"], resume["epoch"]
    for t in range(task0, len(tasks)):
        (x, y), _ = tasks[t]
        net = network(model, t)
        opt = torch.optim.Adam(net.parameters(), lr=LR, amsgrad=True)
        gen = torch.Generator()
        start = epoch0 if t == task0 else 0
        if start:
            opt.load_state_dict(resume["opt"])
            gen.set_state(resume["gen"])
            mnist_data.set_rng_state(resume["rng"])
        else:
            gen.manual_seed(_seed(seed, kind, t))
            torch.manual_seed(_seed(seed, kind, t))
        elbo = bnn.ELBO(net, num_data=len(x))
        for e in range(start, epochs):
            t0 = time.perf_counter()
            stats = _epoch(net, elbo, opt, x, y, batch, gen)
            done = e + 1 == epochs
            if done:  # the task is learned: score tasks 1..t, then the posterior becomes the prior
                row = evaluate(model, tasks, t, seed)
                rec["accuracy"].append(row)
                rec["average"].append(sum(row) / len(row))
                rec["train"].append(stats)
                bnn.posterior_as_prior(net)
            rec["seconds"] = round(rec["seconds"] + time.perf_counter() - t0, 2)
            save({"kind": kind, "model": model, "record": rec, "task": t + 1 if done else t,
                  "epoch": 0 if done else e + 1, "opt": opt.state_dict(), "gen": gen.get_state(),
                  "rng": mnist_data.rng_state()})
            _progress_line(f"{label} {kind} task {t + 1}/{len(tasks)} epoch {e + 1}/{epochs}: "
                           f"nll {stats['nll']:.4f}, KL/N {stats['kl_per_datum']:.4f}"
                           + (f"; accuracy of tasks 1..{t + 1}: " + " ".join(f"{100 * a:.1f}" for a in row)
                              if done else ""))
    return rec


def _progress_line(text: str) -> None:
    sys.stderr.write(f"mnist-continual {text}\n")
    sys.stderr.flush()


def _epochs(args) -> Dict[str, int]:
    return {k: (args.epochs if args.epochs is not None else PAPER_EPOCHS[k]) for k in METHODS}


def run(args) -> dict:
    mnist_data.check_positive(seeds=args.seeds, epochs=args.epochs, batch=args.batch)
    _common.prepare_out(args.out)  # before any training
    meta = _common.run_metadata()
    tasks, info = prepare(args)
    epochs = _epochs(args)
    settings = {"seeds": args.seeds, "epochs": epochs, "batch": args.batch, "lr": LR, "optimizer": "AMSGrad",
                "rho_init": RHO_INIT, "network": f"MLP 784-{'-'.join(map(str, HIDDEN))}, ReLU, one 2-way head per task",
                "prior": "N(0, 1), then the previous task's posterior (Gaussian with its mean and sigma)",
                "train_samples": 1, "test_samples": TEST_SAMPLES, "validation": bool(args.validation),
                "limit": args.limit, "test_limit": args.test_limit, "data": info,
                "tasks": [list(t) for t in TASKS]}
    ckpt = os.path.join(args.out, f"{STEM}.checkpoint.pt")
    state = _common.load_checkpoint(ckpt, settings) if args.resume else None
    per_seed: List[dict] = list(state["seeds"]) if state else []
    current = state["current"] if state else None
    pending = state["method"] if state else None
    spent = state["wall_seconds"] if state else 0.0
    results = {"seeds": per_seed, "meta": meta, "wall_seconds": 0.0, "settings": settings}
    t_all = time.perf_counter()
    with digits.one_thread():
        for seed in range(len(per_seed), args.seeds):
            rec = current if current is not None and current["seed"] == seed else {"seed": seed}
            for kind in METHODS:
                if kind in rec:
                    continue
                resume = pending if pending is not None and pending["kind"] == kind else None
                pending = None

                def save(method_state, rec=rec):
                    _common.save_checkpoint(ckpt, {
                        "settings": settings, "seeds": per_seed, "current": rec, "method": method_state,
                        "wall_seconds": spent + time.perf_counter() - t_all})

                rec[kind] = run_method(seed, kind, tasks, epochs[kind], args.batch, save,
                                       f"seed {seed + 1}/{args.seeds}", resume)
            per_seed.append(rec)
            current = None
            # after every seed (an interrupted run keeps the seeds it finished), atomically
            results.update(wall_seconds=round(spent + time.perf_counter() - t_all, 1),
                           partial=len(per_seed) < args.seeds)
            _common.write_results(args.out, STEM, results, lambda path: plot(results, path), markdown)
    if os.path.exists(ckpt):
        os.remove(ckpt)
    return results


# ---- report ------------------------------------------------------------------------------
def _ms(values, scale=100.0) -> str:
    m, se = _common.mean_se([v * scale for v in values])
    return f"{m:.2f} ± {se:.2f}"


def markdown(results: dict, picture: Optional[str] = None) -> str:
    seeds, settings = results["seeds"], results["settings"]
    part = "validation" if settings.get("validation") else "test"
    epochs = settings["epochs"]
    lines = _common.header("Split MNIST continual learning: mean-field VCL vs Radial BNN", results["meta"],
                           results["wall_seconds"],
                           f"{len(seeds)} seed(s), mean ± standard error over seeds"
                           + ("; partial: more seeds to come" if results.get("partial") else ""))
    lines += ["", f"Protocol of Farquhar et al. 2020 (section 4.2, App. D.2) on Split MNIST (digits 0/1, 2/3, 4/5, 6/7, "
                  f"8/9), multi-head; {settings['network']}; {settings['prior']}; {settings['optimizer']} "
                  f"lr {settings['lr']:g}, batch {settings['batch']} (last incomplete batch dropped), rho init "
                  f"{settings['rho_init']:g}, epochs per task: "
                  + ", ".join(f"{METHODS[k]} {v}" for k, v in epochs.items())
                  + f"; {settings['train_samples']} weight sample per step, {settings['test_samples']}-sample "
                    f"predictive. {settings['data']}.",
              "", f"Average {part} accuracy (%) over the tasks seen so far, each task scored with its own head:", "",
              "| tasks seen | " + " | ".join(METHODS.values()) + " |", "|---|" + "---|" * len(METHODS)]
    for t in range(len(TASKS)):
        cells = [_ms([s[k]["average"][t] for s in seeds]) if all(len(s[k]["average"]) > t for s in seeds) else "—"
                 for k in METHODS]
        lines.append(f"| {t + 1} ({', '.join(f'{a}/{b}' for a, b in TASKS[:t + 1])}) | " + " | ".join(cells) + " |")
    lines += ["", f"The final model (after task 5): {part} accuracy (%) of each task (cf. the paper's Figure 5, on "
                  "FashionMNIST):", "", "| task | " + " | ".join(METHODS.values()) + " |", "|---|" + "---|" * len(METHODS)]
    for t, (a, b) in enumerate(TASKS):
        cells = [_ms([s[k]["accuracy"][-1][t] for s in seeds]) for k in METHODS]
        lines.append(f"| {t + 1} (digits {a}/{b}) | " + " | ".join(cells) + " |")
    lines += ["", "Accuracy (%) of each task right after it was learned (before any later task):", "",
              "| task | " + " | ".join(METHODS.values()) + " |", "|---|" + "---|" * len(METHODS)]
    for t, (a, b) in enumerate(TASKS):
        cells = [_ms([s[k]["accuracy"][t][t] for s in seeds]) for k in METHODS]
        lines.append(f"| {t + 1} (digits {a}/{b}) | " + " | ".join(cells) + " |")
    lines += ["", "Per seed, average accuracy (%) after task 5: "
              + "; ".join(f"seed {s['seed']}: " + ", ".join(f"{METHODS[k]} {100 * s[k]['average'][-1]:.2f}"
                                                           for k in METHODS) for s in seeds) + "."]
    if PUBLISHED:
        lines += ["", "Published average accuracies of mean-field VCL on Split MNIST after 5 tasks (multi-head; "
                      "other networks and training settings -- VCL: 2 x 256 units, 120 full-batch epochs per task, means "
                      "pre-trained):", ""]
        lines += [f"- {label}: {value} ({source})" for label, value, source in PUBLISHED]
    lines += ["", "Notes:", ""] + [f"- {n}" for n in NOTES]
    if picture:
        lines += ["", f"![accuracy per task]({os.path.basename(picture)})"]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: str) -> Optional[str]:
    """Left: the average accuracy after each task (mean ± SE over seeds); right: the final
    model's accuracy on each task (the paper's Figure 5)."""
    plt = _common.pyplot()
    if plt is None:
        return None
    seeds = results["seeds"]
    part = "validation" if results["settings"].get("validation") else "test"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    n = len(TASKS)
    width = 0.38
    for i, (k, label) in enumerate(METHODS.items()):
        avg = [_common.mean_se([100 * s[k]["average"][t] for s in seeds]) for t in range(n)]
        ax1.errorbar(range(1, n + 1), [m for m, _ in avg], yerr=[e for _, e in avg], marker="o", capsize=3,
                     label=label)
        fin = [_common.mean_se([100 * s[k]["accuracy"][-1][t] for s in seeds]) for t in range(n)]
        ax2.bar([t + 1 + (i - 0.5) * width for t in range(n)], [m for m, _ in fin], width=width,
                yerr=[e for _, e in fin], capsize=3, label=label)
        ax2.axhline(sum(m for m, _ in fin) / n, color=f"C{i}", linestyle=":", linewidth=1)
    ax1.set_xlabel("tasks learned")
    ax1.set_ylabel(f"average {part} accuracy over tasks seen (%)")
    ax1.set_xticks(range(1, n + 1))
    ax1.legend(fontsize=8)
    ax1.set_title("after each task", fontsize=9)
    ax2.set_xticks(range(1, n + 1), [f"{a}/{b}" for a, b in TASKS])
    ax2.set_xlabel("task (digits)")
    ax2.set_ylabel(f"{part} accuracy of the final model (%)")
    lo = min(100 * s[k]["accuracy"][-1][t] for s in seeds for k in METHODS for t in range(n))
    ax2.set_ylim(max(0.0, lo - 5), 100.5)
    ax2.legend(fontsize=8, loc="lower left")
    ax2.set_title("final model, each task (dotted: average)", fontsize=9)
    fig.suptitle(f"Split MNIST, multi-head VCL: mean-field vs Radial ({len(seeds)} seed(s), mean ± SE)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
