"""The Bayesian training step at the papers' scale: LeNet-5-Caffe on MNIST-sized inputs, batch 100.

    python -m benchmarks.run lenet [--threads 2] [--quick] [--out DIR]
    python -m benchmarks.bench_lenet [the same options]

Writes docs/benchmarks/lenet.{md,json}.  One training step (forward, ELBO with the KL / 60000,
backward, Adam) of LeNet-5-Caffe (conv 20 5x5, pool, conv 50 5x5, pool, fc 800 -> 500, fc 500 -> 10,
431K weights; random 28x28 inputs: the timing does not depend on the pixels) for the deterministic
network and every Bayesian kind of ``vmfdist.nn.to_bayesian`` (mean-field with the three gradient
estimators, Radial, RDP with row and double grouping), bayesian-torch's ``dnn_to_bnn``
(reparameterisation and flipout) and the floor, all in interleaved rounds in one process, at one
thread and then at every core.  The issue's targets are on the medians of the rounds.

The floor is what sampling the weights cannot avoid: the deterministic step plus, timed in the same
rounds, one draw of a normal per weight (``torch.randn``), one fused pass that forms the weights
(``addcmul``) and Adam over the second set of parameters.  The predictive is ``vmfdist.nn.predict``
with 32 samples against one deterministic forward pass (no gradients).

Everything is measured twice in one process: with glibc's default allocation behaviour (what a
plain ``python`` gets), then with a steady heap (``harness.steady_heap``, what jemalloc / tcmalloc
give), because the Bayesian steps allocate several weight-sized tensors per layer and step, and
with the defaults their first-touch page faults are a large part of the gap to the deterministic
step.
"""
from __future__ import annotations

import os
import sys

TITLE = "LeNet-5-Caffe training step (batch 100): Bayesian kinds vs the deterministic step, bayesian-torch and the floor"
NAME = "lenet"
MNIST = 60000
BATCH = 100
# (kind, target ratio to the deterministic step) of the speed section
TARGETS = {"meanfield reparam": 1.15, "radial": 1.2, "rdp double": 1.5}
PREDICT_TARGET = 20.0


def add_args(p):
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per thread count (default 15, quick 2)")


def _steps(torch, x, y):
    """{name: step()} with every network built from the same seed."""
    from torch import nn

    from benchmarks.bench_gpu import KINDS, lenet5
    from vmfdist.nn import ELBO

    def adam_step(params):
        return torch.optim.Adam(params, lr=1e-3)

    steps = {}
    torch.manual_seed(0)
    net = lenet5(None)
    opt = adam_step(net.parameters())

    def det(net=net, opt=opt):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    steps["deterministic"] = det

    # the floor's extras: a normal per weight, one pass forming the weights, Adam over a second set
    n_weights = sum(p.numel() for p in net.parameters())
    mu, rho = torch.zeros(n_weights), torch.full((n_weights,), -5.0, requires_grad=True)
    opt_rho = adam_step([rho])

    def extras(mu=mu, rho=rho, opt=opt_rho):
        opt.zero_grad(set_to_none=True)
        w = torch.addcmul(mu, rho, torch.randn(n_weights))
        w.backward(torch.ones_like(w))
        opt.step()
    steps["floor extras"] = extras

    for name, (kind, opts) in KINDS.items():
        torch.manual_seed(0)
        m = lenet5((kind, opts))
        # check_finite=False: the same work as a user's loop that does not check for NaN every step
        elbo, o = ELBO(m, num_data=MNIST, check_finite=False), adam_step(m.parameters())

        def bstep(m=m, elbo=elbo, o=o):
            o.zero_grad(set_to_none=True)
            elbo(m(x), y).backward()
            o.step()
        steps[name] = bstep

    try:
        from bayesian_torch.models.dnn_to_bnn import dnn_to_bnn, get_kl_loss
    except Exception:  # optional peer
        return steps, net
    for flavour in ("Reparameterization", "Flipout"):
        torch.manual_seed(0)
        m = lenet5(None)
        dnn_to_bnn(m, {"prior_mu": 0.0, "prior_sigma": 1.0, "posterior_mu_init": 0.0, "posterior_rho_init": -3.0,
                       "type": flavour, "moped_enable": False})
        o = adam_step(m.parameters())

        def btstep(m=m, o=o):
            o.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(m(x), y) + get_kl_loss(m) / MNIST
            loss.backward()
            o.step()
        steps[f"bayesian-torch {flavour.lower()}"] = btstep
    return steps, net


def _measure(torch, H, threads, rounds):
    H.set_threads(threads)  # torch's too
    g = torch.Generator().manual_seed(0)
    x = torch.rand(BATCH, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    steps, det_net = _steps(torch, x, y)
    print(f"[{threads} thread(s)] {len(steps)} steps, {rounds} rounds", flush=True)
    t = H.time_rounds(steps, rounds, verbose=False)
    out = {"steps": {k: {"min": v["min"], "median": v["median"]} for k, v in t.items()}}

    from benchmarks.bench_gpu import lenet5
    from vmfdist.nn import predict, to_bayesian

    torch.manual_seed(0)
    bayes = to_bayesian(lenet5(None), "meanfield").eval()
    det_net.eval()

    def forward():
        with torch.no_grad():
            return det_net(x)
    t = H.time_rounds({"deterministic forward": forward, "predict 32 samples": lambda: predict(bayes, x, 32).probs},
                      rounds, verbose=False)
    out["predict"] = {k: {"min": v["min"], "median": v["median"]} for k, v in t.items()}
    return out


def run(args) -> dict:
    from benchmarks import harness as H

    import torch

    rounds = args.rounds or (2 if args.quick else 15)
    nproc = os.cpu_count() or 1
    counts = sorted({1, max(1, min(args.threads, nproc))})
    result = {"meta": H.meta(args, packages=("bayesian-torch",), rounds=rounds, thread_counts=counts)}
    result["by_threads"] = {str(c): _measure(torch, H, c, rounds) for c in counts}
    if H.steady_heap():  # (cannot be undone in the process: measured second)
        result["steady_heap"] = {str(c): _measure(torch, H, c, rounds) for c in counts}
    return result


def _ratios(res, key):
    rows = res["steps"]
    det = rows["deterministic"][key]
    out = {k: v[key] / det for k, v in rows.items() if k != "floor extras"}
    out["floor"] = (det + rows["floor extras"][key]) / det
    return out


def render(result) -> str:
    from benchmarks import harness as H

    lines = H.header(result, "LeNet-5-Caffe training step", "python -m benchmarks.run lenet", NAME)
    m = result["meta"]
    lines.append(f"- Batch {BATCH}, 28x28 inputs, float32; {m.get('rounds')} interleaved rounds per thread count; "
                 "ratios to the deterministic step of the same thread count, from the medians of the rounds "
                 "(the minimum in brackets).")
    lb = m["load_before"][0]
    if lb > 0.5 * m["nproc"]:
        lines.append(f"- **The machine was busy** (load average {lb:.1f} on {m['nproc']} logical cores before "
                     "the run): the ratios come from interleaved rounds and are the numbers to read.")
    lines.append("")
    runs = [("", result["by_threads"])]
    if "steady_heap" in result:
        runs.append((", steady heap", result["steady_heap"]))
        lines.append("- Measured twice in one process: with glibc's default allocation behaviour, then with a steady "
                     "heap (`harness.steady_heap`: allocations up to 32 MiB from the heap and freed memory kept, as "
                     "jemalloc / tcmalloc do). With the defaults a weight-sized tensor is often a fresh `mmap` whose "
                     "first-touch page faults cost as much as a cheap kernel over it; the Bayesian steps allocate "
                     "several per layer and step.\n")
    cols = [(label, c, r) for label, by in runs for c, r in by.items()]
    tt = H.Table("target", *[f"{c} thread(s){label}" for label, c, _ in cols], "met")
    checks = []
    for name, tgt in TARGETS.items():
        checks.append((f"{name} / deterministic step <= {tgt}", [_ratios(r, "median")[name] for _, _, r in cols], tgt))
    vals = [r["predict"]["predict 32 samples"]["median"] / r["predict"]["deterministic forward"]["median"]
            for _, _, r in cols]
    checks.append((f"predict, 32 samples / one deterministic forward <= {PREDICT_TARGET:g}", vals, PREDICT_TARGET))
    for name, vals, tgt in checks:
        ok = [v <= tgt for v in vals]
        tt.add(name, *[H.fmt_ratio(v) for v in vals], "yes" if all(ok) else ("**no**" if not any(ok) else "partly"))
    lines.append("## Targets\n\n" + str(tt))
    for label, c, res in cols:
        med, mn = _ratios(res, "median"), _ratios(res, "min")
        lines.append(f"## {c} thread(s){label}\n")
        t = H.Table("step", "median", "/ deterministic", "(min ratio)")
        for name, v in res["steps"].items():
            if name == "floor extras":
                continue
            t.add(name, H.fmt_time(v["median"]), H.fmt_ratio(med[name]), H.fmt_ratio(mn[name]))
        fl = res["steps"]["deterministic"]["median"] + res["steps"]["floor extras"]["median"]
        t.add("floor (deterministic + extras)", H.fmt_time(fl), H.fmt_ratio(med["floor"]), H.fmt_ratio(mn["floor"]))
        lines.append(str(t))
        p = res["predict"]
        lines.append(f"Predictive: one deterministic forward {H.fmt_time(p['deterministic forward']['median'])}, "
                     f"`predict` with 32 samples (mean-field) {H.fmt_time(p['predict 32 samples']['median'])}.\n")
    return "\n".join(lines) + "\n"


def main(argv=None):
    """``python -m benchmarks.bench_lenet [options]`` is ``python -m benchmarks.run lenet [options]``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import run as R

    return R.main(["lenet"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
