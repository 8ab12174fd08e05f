"""Full-GGN Laplace benchmark: vmfdist.laplace.full.FullLaplace against laplace-torch's FullLaplace
(default backend) and, with ``subnetwork_indices``, its SubnetLaplace (``hessian_structure="full"``), on
the same models and data, in the same process and run.

    python -m benchmarks.run laplace_full --threads 1      # writes docs/benchmarks/laplace_full.{md,json}
    python -m benchmarks.run laplace_full --quick          # fewer repeats, to /tmp/vmfdist-bench

What is timed (float32, CPU, ``--threads`` threads for everyone):

- ``fit``: ``la.fit(train_loader)`` (batches of 128): the exact GGN (laplace-torch: curvlinops'
  GGN linear operator applied to the identity; SubnetLaplace: torch.func Jacobians; ours: one
  batched backward pass per chunk of examples and the Gram matrix of the loss-Hessian-weighted
  Jacobian rows) and the training loss.
- ``glm predictive``: ``la(x_test)`` (probit link for classification; mean and variance for
  regression).  laplace-torch forms ``J P^-1 J^T`` with the explicit covariance (a Cholesky
  factorisation and inverse per call); ours solves with the cached Cholesky factor.

Models: the UCI MLP (13-50-1, 751 parameters, N = 455, regression), a small digits MLP (64-30-10,
2260 parameters, N = 1437, classification) and a small CNN on 8x8 images (conv 1->8, conv 8->8 stride
2, linear 128->10; 1954 parameters, N = 1437); the subnetwork rows take 500 random coordinates of the
digits MLP.  Inputs are standard normal with the data sets' shapes.  Each row checks that the two
implementations agree (largest relative difference of the log evidence / the outputs).
"""
from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks import harness as H
from benchmarks.bench_laplace import _rel  # the agreement measure both Laplace areas report

TITLE = "Laplace: full GGN and subnetwork Laplace against laplace-torch"

MODELS = ("uci_mlp", "digits_mlp", "digits_cnn", "digits_mlp_subnet")


def add_args(p):
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    p.add_argument("--n-test", type=int, default=500, help="test inputs of the GLM predictive")
    p.add_argument("--max-call", type=float, default=30.0, help="cap (s) on one call of a slow implementation")


def _setup(name, n_test):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "uci_mlp":
        N, lik = 455, "regression"
        model = nn.Sequential(nn.Linear(13, 50), nn.ReLU(), nn.Linear(50, 1))
        X, y = torch.randn(N, 13, generator=g), torch.randn(N, 1, generator=g)
        Xt = torch.randn(n_test, 13, generator=g)
    elif name in ("digits_mlp", "digits_mlp_subnet"):
        N, lik = 1437, "classification"
        model = nn.Sequential(nn.Linear(64, 30), nn.ReLU(), nn.Linear(30, 10))
        X, y = torch.randn(N, 64, generator=g), torch.randint(0, 10, (N,), generator=g)
        Xt = torch.randn(n_test, 64, generator=g)
    else:
        N, lik = 1437, "classification"
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                              nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
        X, y = torch.randn(N, 1, 8, 8, generator=g), torch.randint(0, 10, (N,), generator=g)
        # laplace-torch's full-GGN predictive of the CNN for 500 inputs took 22 GB and was killed (OOM)
        Xt = torch.randn(min(n_test, 50), 1, 8, 8, generator=g)
    subnet = None
    if name.endswith("_subnet"):
        n_params = sum(p.numel() for p in model.parameters())
        subnet = torch.randperm(n_params, generator=g)[:500]
    return model, lik, X, y, Xt, subnet


def run(args) -> dict:
    from laplace import FullLaplace as PeerFull  # the peer (benchmarks/requirements-kron.txt)
    from laplace import Laplace as PeerLaplace

    from vmfdist.laplace.full import FullLaplace

    warnings.simplefilter("ignore")
    meta = H.meta(args, packages=("laplace-torch", "curvlinops-for-pytorch"))
    tkw = H.timing(args.quick)
    tkw["max_call"] = args.max_call
    rows = []
    for name in args.models:
        model, lik, X, y, Xt, subnet = _setup(name, args.n_test)
        loader = DataLoader(TensorDataset(X, y), batch_size=128)
        if subnet is None:
            impls = {"laplace-torch": lambda: PeerFull(model, lik),
                     "FullLaplace": lambda: FullLaplace(model, lik)}
        else:
            impls = {"laplace-torch": lambda: PeerLaplace(model, lik, subset_of_weights="subnetwork",
                                                          hessian_structure="full", subnetwork_indices=subnet),
                     "FullLaplace": lambda: FullLaplace(model, lik, subnetwork_indices=subnet)}
        fitted = {}
        for k, make in impls.items():
            fitted[k] = make()
            fitted[k].fit(loader)
        ref, ours = fitted["laplace-torch"], fitted["FullLaplace"]
        tasks = {"fit": lambda k: lambda: impls[k]().fit(loader),
                 "glm predictive": lambda k: lambda: fitted[k](Xt)}
        for task, build in tasks.items():
            times = {}
            for k in impls:
                times[k] = H.time_fn(build(k), **tkw)
                print(f"{name:17s} {task:15s} {k:14s} {H.fmt_time(times[k]['min'])}", flush=True)
            if task == "fit":
                agree = abs(float(ours.log_marginal_likelihood() - ref.log_marginal_likelihood())) / \
                    abs(float(ref.log_marginal_likelihood()))
            else:
                agree = _rel(ours(Xt), ref(Xt))
            rows.append({"model": name, "likelihood": lik, "n_params": ours.n_params_subnet, "N": len(X),
                         "n_test": len(Xt), "task": task, "times": times, "agreement": agree})
    return {"meta": meta, "rows": rows}


def render(result) -> str:
    threads = result["meta"]["threads"]
    lines = H.header(result, TITLE, f"python -m benchmarks.run laplace_full --threads {threads}", "laplace_full")
    lines += ["",
              f"Same model, data and settings for both libraries: float32 on the CPU, {threads} thread(s), the "
              "exact GGN, batches of 128.  laplace-torch: `FullLaplace` with its default `CurvlinopsGGN` "
              "backend, or `Laplace(..., subset_of_weights='subnetwork', hessian_structure='full')` for the "
              "subnetwork rows; ours: `vmfdist.laplace.full.FullLaplace` (with `subnetwork_indices`).  Times "
              "are the minimum over repeats (`benchmarks/harness.py`); *speed-up* is laplace-torch's time over "
              "ours (> 1: we are faster).  *agreement* is the largest relative difference between the two "
              "results (fit: log marginal likelihood; GLM predictive: the outputs), in float32.",
              ""]
    t = H.Table("model", "task", "laplace-torch", "FullLaplace", "speed-up", "agreement")
    for r in result["rows"]:
        ref, ours = r["times"]["laplace-torch"]["min"], r["times"]["FullLaplace"]["min"]
        t.add(f"{r['model']} ({r['n_params']} posterior params, N = {r['N']}, {r['n_test']} test)", r["task"],
              H.fmt_time(ref), H.fmt_time(ours), H.fmt_ratio(ref / ours), f"{r['agreement']:.1e}")
    lines.append(str(t))
    lines.append("")
    return "\n".join(lines)
