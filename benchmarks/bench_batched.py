"""Batched noisy K-FAC / EK-FAC (vmfdist.optim.BatchedNoisy*) against the unbatched optimizer, per step of the
authors' UCI recipe (issue 26): E = 10 members (the splits of a data set), 10 weight samples per step,
PRESETS["uci_paper"], float32, the threads of the run (recorded: ``--threads 1``, as the experiment's tasks).

Jobs: ``small`` (13 -> 50 -> 1, batch 10: Boston's shape), ``large`` (9 -> 100 -> 1, batch 100: protein's).
Modes: ``whole`` (each weight sample on the whole batch, as the authors: batch repeated 10 times) and
``share`` (each sample on a tenth of it).  Per job and mode, one timed call is 10 steps of:

* ``batched``: one BatchedNoisy* step of all 10 members;
* ``unbatched x10``: one NoisyEKFAC / NoisyKFAC step of each of 10 separate optimizers;
* ``batched E=1``: the batched optimizer with one member, the per-op overhead a step pays however many
  members it carries (the floor of a batched step that is not bound by arithmetic);
* ``model only``: forward and backward of the same stacked MLP for the 10 x 10 weight samples by torch
  autograd (torch.bmm), no sampling and no curvature: what the network itself costs.

Implementations are interleaved round-robin (H.time_rounds).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from benchmarks import harness as H
from vmfdist.optim import BatchedNoisyEKFAC, BatchedNoisyKFAC, NoisyEKFAC, NoisyKFAC

TITLE = "batched noisy K-FAC / EK-FAC vs the unbatched optimizer"
E, P = 10, 10
JOBS = {"small": (13, 50, 10, 455), "large": (9, 100, 100, 41157)}


def add_args(p):
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 7; --quick 3)")


def _fns(job, mode, ekfac, steps):
    d, h, b, n = JOBS[job]
    g = torch.Generator().manual_seed(0)
    X = torch.randn(steps, E, b, d, generator=g)
    Y = torch.randn(steps, E, b, generator=g)
    if mode == "whole":
        X, Y = X.repeat(1, 1, P, 1), Y.repeat(1, 1, P)
    tau = torch.ones(E, P)
    models = []
    for e in range(E):
        torch.manual_seed(e)
        models.append(nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, 1)))
    bcls, cls = (BatchedNoisyEKFAC, NoisyEKFAC) if ekfac else (BatchedNoisyKFAC, NoisyKFAC)
    kw = dict(preset="uci_paper", particles=P)
    batched = bcls([copy.deepcopy(m) for m in models], n, "regression", seeds=list(range(E)), **kw)
    one = bcls([copy.deepcopy(models[0])], n, "regression", seeds=[0], **kw)
    singles = [cls(copy.deepcopy(m), n, "regression", seed=e, **kw) for e, m in enumerate(models)]
    ws = [torch.randn(E * P, h, d + 1, requires_grad=True), torch.randn(E * P, 1, h + 1, requires_grad=True)]

    def f_batched():
        for s in range(steps):
            batched.step(X[s], Y[s], tau)

    def f_one():
        for s in range(steps):
            one.step(X[s, :1], Y[s, :1], tau[:1])

    def f_unbatched():
        for s in range(steps):
            for e in range(E):
                singles[e].step(X[s, e], Y[s, e].unsqueeze(-1))

    def f_model():
        for s in range(steps):
            x = X[s].reshape(E * P, -1, d)
            a = nn.functional.pad(x, (0, 1), value=1.0)
            z = torch.bmm(a, ws[0].mT).relu()
            out = torch.bmm(nn.functional.pad(z, (0, 1), value=1.0), ws[1].mT)
            out.pow(2).sum().backward()
            ws[0].grad = ws[1].grad = None

    return {"batched": f_batched, "unbatched x10": f_unbatched, "batched E=1": f_one, "model only": f_model}


def run(args):
    rounds = args.repeats or (3 if args.quick else 7)
    steps = 3 if args.quick else 10
    meta = H.meta(args, rounds=rounds, steps=steps)
    rows = {}
    for job in JOBS:
        for mode in ("whole", "share"):
            for ekfac in (True, False):
                res = H.time_rounds(_fns(job, mode, ekfac, steps), rounds, verbose=False)
                rows[f"{job}/{mode}/{'ekfac' if ekfac else 'kfac'}"] = {
                    k: {"min": v["min"] / steps, "median": v["median"] / steps} for k, v in res.items()}
    return {"meta": meta, "rows": rows}


def render(res):
    m, r = res["meta"], res["rows"]
    L = H.header(res, "Benchmark: batched noisy K-FAC / EK-FAC (E = 10 members, 10 samples)",
                 "python -m benchmarks.run batched --threads 1", "batched")
    L.append(f"- Time per step of all 10 members, min (median) over {m['rounds']} interleaved rounds of "
             f"{m['steps']} steps; float32, CPU, {m['threads']} thread(s); PRESETS['uci_paper'].\n")
    t = H.Table("job", "mode", "optimizer", "batched", "unbatched x10", "speed-up", "batched E=1 (floor)",
                "model only")
    for key, rr in r.items():
        job, mode, kind = key.split("/")
        t.add(f"{job} ({'13-50-1, batch 10' if job == 'small' else '9-100-1, batch 100'})", mode,
              "EK-FAC" if kind == "ekfac" else "K-FAC",
              f"{H.fmt_time(rr['batched']['min'])} ({H.fmt_time(rr['batched']['median'])})",
              f"{H.fmt_time(rr['unbatched x10']['min'])} ({H.fmt_time(rr['unbatched x10']['median'])})",
              H.fmt_ratio(rr["unbatched x10"]["min"] / rr["batched"]["min"]),
              H.fmt_time(rr["batched E=1"]["min"]), H.fmt_time(rr["model only"]["min"]))
    L += [str(t), ""]
    L.append("`whole`: each of the 10 weight samples on the whole batch (the authors' code; the batch is repeated "
             "10 times), `share`: each on a tenth.  `batched E=1` is the same optimizer with one member: the "
             "per-op overhead that one step pays whatever the number of members.  `model only`: forward and "
             "backward of the stacked network for the 100 weight samples by autograd, without sampling or "
             "curvature.\n")
    return "\n".join(L)
