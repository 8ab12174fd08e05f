"""Time per training step of NoisyEKFAC / NoisyKFAC against Adam and SGD on the same model.

Jobs (float32, CPU, the threads of the run):
  uci: the UCI MLP (13 -> 50 -> 1, ReLU; Boston housing's shape), batch 10, Gaussian likelihood, the
       paper's UCI amortisation (PRESETS["uci"]: statistics, re-scaling every step, bases every 50);
  cnn: a small CNN on 8x8 images (conv 1->8, pool, conv 8->16, pool, linear 64->10; sklearn's digits
       shape), batch 128, categorical likelihood, PRESETS["classification"] (statistics and re-scaling
       every 10 steps, bases every 100).
One timed call is a whole amortisation cycle (50 steps for uci, 100 for cnn, over distinct
random batches), so the per-step time includes the eigendecompositions at their real frequency.
Every step of every optimizer is a full training step: zero_grad, forward, loss, backward, update
(the noisy optimizers also sample weights and update factors / bases / re-scaling).  The
implementations are interleaved round-robin (H.time_rounds).  Target (issue #10): a NoisyEKFAC step
<= 1.5x an Adam step on the UCI MLP.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from benchmarks import harness as H
from vmfdist.optim import NoisyEKFAC, NoisyKFAC

TITLE = "noisy K-FAC / EK-FAC step vs Adam and SGD"


def add_args(p):
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 7; --quick 3)")


def _mlp():
    return nn.Sequential(nn.Linear(13, 50), nn.ReLU(), nn.Linear(50, 1))


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 10))


def _job(name, quick):
    g = torch.Generator().manual_seed(0)
    if name == "uci":
        steps, b, n = (10 if quick else 50), 10, 455
        X = torch.randn(steps, b, 13, generator=g)
        Y = torch.randn(steps, b, generator=g)
        return dict(make=_mlp, X=X, Y=Y, steps=steps, n=n, likelihood="regression",
                    loss=lambda out, y: 0.5 * (out.squeeze(1) - y).pow(2).mean())
    steps, b, n = (20 if quick else 100), 128, 1500
    X = torch.rand(steps, b, 1, 8, 8, generator=g)
    Y = torch.randint(0, 10, (steps, b), generator=g)
    return dict(make=_cnn, X=X, Y=Y, steps=steps, n=n, likelihood="classification",
                loss=lambda out, y: nn.functional.cross_entropy(out, y))


def _fns(job):
    X, Y, steps = job["X"], job["Y"], job["steps"]
    fns = {}
    for name, cls in (("Adam", torch.optim.Adam), ("SGD", torch.optim.SGD)):
        torch.manual_seed(0)
        model = job["make"]()
        opt = cls(model.parameters(), lr=1e-3 if name == "Adam" else 1e-2)
        loss = job["loss"]

        def cycle(model=model, opt=opt, loss=loss):
            for s in range(steps):
                opt.zero_grad()
                loss(model(X[s]), Y[s]).backward()
                opt.step()
        fns[name] = cycle
    for name, cls in (("NoisyKFAC", NoisyKFAC), ("NoisyEKFAC", NoisyEKFAC)):
        torch.manual_seed(0)
        model = job["make"]()
        opt = cls(model, job["n"], job["likelihood"], seed=0)

        def cycle(opt=opt):
            for s in range(steps):
                opt.step(X[s], Y[s])
        fns[name] = cycle
    return fns


def run(args):
    rounds = args.repeats or (3 if args.quick else 7)
    meta = H.meta(args, rounds=rounds)  # before timing: load_before and the start time
    rows = {}
    for job in ("uci", "cnn"):
        j = _job(job, args.quick)
        fns = _fns(j)
        res = H.time_rounds(fns, rounds, verbose=False)
        rows[job] = {k: {"min": v["min"] / j["steps"], "median": v["median"] / j["steps"]} for k, v in res.items()}
        # CPU time of this process (time.process_time), interleaved the same way: on a loaded shared
        # machine it does not count the time the process waits for a core
        cpu = {k: [] for k in fns}
        for _ in range(rounds):
            for k, f in fns.items():
                t0 = time.process_time()
                f()
                cpu[k].append((time.process_time() - t0) / j["steps"])
        for k in fns:
            rows[job][k]["cpu_min"] = min(cpu[k])
            rows[job][k]["cpu_median"] = statistics.median(cpu[k])
        rows[job]["_steps"] = j["steps"]
    return {"meta": meta, "rows": rows}


def render(res):
    m, r = res["meta"], res["rows"]
    L = H.header(res, "Benchmark: noisy K-FAC / EK-FAC training step", "python -m benchmarks.run optim", "optim")
    L.append(f"- Time per training step, min (median) over {m['rounds']} interleaved rounds; one round runs a whole "
             "amortisation cycle of each optimizer on distinct batches; float32, CPU, "
             f"{m['threads']} threads.\n")
    for job, title in (("uci", "UCI MLP (13-50-1, batch 10, PRESETS['uci'])"),
                       ("cnn", "CNN on 8x8 images (batch 128, PRESETS['classification'])")):
        rr = r[job]
        t = H.Table("optimizer", "time / step", "/ Adam", "/ SGD", "CPU time / step", "/ Adam (CPU)")
        for k in ("Adam", "SGD", "NoisyKFAC", "NoisyEKFAC"):
            v = rr[k]
            t.add(k, f"{H.fmt_time(v['min'])} ({H.fmt_time(v['median'])})", H.fmt_ratio(v["min"] / rr["Adam"]["min"]),
                  H.fmt_ratio(v["min"] / rr["SGD"]["min"]),
                  f"{H.fmt_time(v['cpu_min'])} ({H.fmt_time(v['cpu_median'])})",
                  H.fmt_ratio(v["cpu_min"] / rr["Adam"]["cpu_min"]))
        L += [f"### {title}, {rr['_steps']} steps per round\n", str(t), ""]
    ratio = r["uci"]["NoisyEKFAC"]["min"] / r["uci"]["Adam"]["min"]
    cpu = r["uci"]["NoisyEKFAC"]["cpu_min"] / r["uci"]["Adam"]["cpu_min"]
    L.append("Wall-clock times are min (median) over the interleaved rounds; CPU times (`time.process_time`, a "
             "second set of interleaved rounds) leave out the time the process waits for a core on a loaded "
             "machine.\n")
    L.append(f"Target (issue #10): NoisyEKFAC step <= 1.5x an Adam step on the UCI MLP: measured "
             f"**{H.fmt_ratio(ratio)}** wall-clock, **{H.fmt_ratio(cpu)}** CPU time "
             f"({'met' if max(ratio, cpu) <= 1.5 else 'not met'}).\n")
    return "\n".join(L)
