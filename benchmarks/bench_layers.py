"""Bayesian layers: one training step (forward + KL + backward) of each layer kind against
nn.Linear / nn.Conv2d and bayesian-torch's layers, and predict() with 32 samples evaluated as one
batch against a Python loop over samples.

    python -m benchmarks.run layers [--threads 2] [--quick]      # the shared driver
    python -m benchmarks.bench_layers [--threads 2] [--quick] [--no-write]

Writes docs/benchmarks/layers.{md,json} through benchmarks/harness.py.  All implementations of
one job are timed in interleaved rounds (harness.time_rounds, each round in a new order), so load
changes on a shared machine hit all of them alike; the tables use the minimum over rounds.  The
whole set of jobs runs twice in the process: with glibc's default allocation behaviour, then with
a steady heap (harness.steady_heap), because with the defaults a tensor of a few MB page-faults on
some calls and not on others, which moved single ratios by 10-15% between runs.

Jobs (float32, CPU):
  linear: batch 128, 512 -> 512;   conv: batch 32, 32 -> 64 channels, 3x3, padding 1, 16x16 images.
  step = out = layer(x); loss = out.square().mean() + KL / N; loss.backward()   (N = 50000)
  bayesian-torch's layers compute their KL inside forward (return_kl=True); ours call
  layer.kl_divergence().  Both use a N(0, 1) prior.
  predict, 32 samples: vmfdist.nn.predict (one batched pass) vs `mean(softmax(model(x)) for 32
  samples)` in a Python loop (the model in sample mode, one forward per sample), on an MLP
  784-400-400-10 with batch 256 (compute-bound: each sample is ~0.25 GFLOP and ~0.48M normals in
  the loop; predict shares the first layer's work across samples -- see docs/nn.md for what that
  allows) and on the digits LeNet 16-32-128 with batch 64 (overhead-bound: many small calls per
  sample).
"""
from __future__ import annotations

import argparse
import os
import sys

TITLE = "Bayesian layers: training step vs nn and bayesian-torch; batched vs looped predict"
NAME = "layers"


def add_args(p):
    """Options of this area (benchmarks/run.py adds --threads, --quick, --out, --report)."""
    p.add_argument("--rounds", type=int, default=None, help="rounds of the training-step jobs (default 60, quick 5)")
    p.add_argument("--predict-rounds", type=int, default=None, help="rounds of the predict jobs (default 20, quick 2)")


def _step_fn(layer, x, ours, num_data=50000.0):
    def step():
        layer.zero_grad(set_to_none=True)
        if ours is None:  # plain torch layer
            out = layer(x)
            loss = out.square().mean()
        elif ours:
            out = layer(x)
            loss = out.square().mean() + layer.kl_divergence() / num_data
        else:  # bayesian-torch: (out, kl)
            out, kl = layer(x)
            loss = out.square().mean() + kl / num_data
        loss.backward()
        return loss
    return step


def _layers(kind, torch, vnn, bt):
    """{name: (module, is_ours)} for one job."""
    if kind == "linear":
        a, b = 512, 512
        mk = {
            "nn.Linear": (torch.nn.Linear(a, b), None),
            "bayesian-torch LinearReparameterization": (bt.LinearReparameterization(a, b), False) if bt else None,
            "bayesian-torch LinearFlipout": (bt.LinearFlipout(a, b), False) if bt else None,
            "MeanFieldLinear reparam": (vnn.MeanFieldLinear(a, b), True),
            "MeanFieldLinear local": (vnn.MeanFieldLinear(a, b, estimator="local"), True),
            "MeanFieldLinear flipout": (vnn.MeanFieldLinear(a, b, estimator="flipout"), True),
            "RadialLinear": (vnn.RadialLinear(a, b), True),
            "RDPLinear row": (vnn.RDPLinear(a, b), True),
            "RDPLinear double": (vnn.RDPLinear(a, b, grouping="double"), True),
        }
    else:
        a, b, k = 32, 64, 3
        mk = {
            "nn.Conv2d": (torch.nn.Conv2d(a, b, k, padding=1), None),
            "bayesian-torch Conv2dReparameterization": (bt.Conv2dReparameterization(a, b, k, padding=1), False)
            if bt else None,
            "bayesian-torch Conv2dFlipout": (bt.Conv2dFlipout(a, b, k, padding=1), False) if bt else None,
            "MeanFieldConv2d reparam": (vnn.MeanFieldConv2d(a, b, k, padding=1), True),
            "MeanFieldConv2d local": (vnn.MeanFieldConv2d(a, b, k, padding=1, estimator="local"), True),
            "MeanFieldConv2d flipout": (vnn.MeanFieldConv2d(a, b, k, padding=1, estimator="flipout"), True),
            "RadialConv2d": (vnn.RadialConv2d(a, b, k, padding=1), True),
            "RDPConv2d row": (vnn.RDPConv2d(a, b, k, padding=1), True),
            "RDPConv2d double": (vnn.RDPConv2d(a, b, k, padding=1, grouping="double"), True),
        }
    return {k: v for k, v in mk.items() if v is not None}


def run(args) -> dict:
    from benchmarks import harness as H

    H.set_threads(args.threads)
    import torch

    import vmfdist.nn as vnn
    try:
        import bayesian_torch.layers as bt
    except Exception:  # optional peer
        bt = None
    rounds = args.rounds or (5 if args.quick else 60)
    p_rounds = args.predict_rounds or (2 if args.quick else 20)
    result = {"meta": H.meta(args, packages=("bayesian-torch",), rounds=rounds, predict_rounds=p_rounds)}
    # every job twice: with glibc's default allocation behaviour (what a plain `python` gets),
    # then with a steady heap (harness.steady_heap), which takes page-fault luck out of the timings
    result.update(_measure(torch, vnn, bt, H, rounds, p_rounds))
    if H.steady_heap():
        result["steady_heap"] = _measure(torch, vnn, bt, H, rounds, p_rounds)
    return result


def _measure(torch, vnn, bt, H, rounds, p_rounds) -> dict:
    out = {"steps": {}, "predict": {}}
    torch.manual_seed(0)
    inputs = {"linear": torch.randn(128, 512), "conv": torch.randn(32, 32, 16, 16)}
    for job, x in inputs.items():
        layers = _layers(job, torch, vnn, bt)
        fns = {name: _step_fn(m, x, ours) for name, (m, ours) in layers.items()}
        print(f"[{job}] {len(fns)} implementations, {rounds} rounds", flush=True)
        t = H.time_rounds(fns, rounds, verbose=False)
        out["steps"][job] = {k: {"min": v["min"], "median": v["median"]} for k, v in t.items()}

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(), torch.nn.Linear(400, 400),
                                   torch.nn.ReLU(), torch.nn.Linear(400, 10))

    def lenet():
        return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Flatten(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))

    s = 32
    for net_name, make, x in (("MLP 784-400-400-10, batch 256", mlp, torch.randn(256, 784)),
                              ("LeNet 16-32-128 on 8x8 images, batch 64", lenet, torch.randn(64, 1, 8, 8))):
        out["predict"][net_name] = {}
        for kind in ("meanfield", "radial", "rdp"):
            model = vnn.to_bayesian(make(), kind).eval()

            def batched(model=model, x=x):
                return vnn.predict(model, x, s).probs

            def loop(model=model, x=x):
                with torch.no_grad():
                    return torch.stack([torch.softmax(model(x), -1) for _ in range(s)]).mean(0)

            t = H.time_rounds({"batched": batched, "loop": loop}, p_rounds, verbose=False)
            out["predict"][net_name][kind] = {k: {"min": v["min"], "median": v["median"]} for k, v in t.items()}
            print(f"[predict {net_name} {kind}] loop/batched = {t['loop']['min'] / t['batched']['min']:.2f}",
                  flush=True)
    return out


def render(result) -> str:
    from benchmarks import harness as H

    lines = H.header(result, "Bayesian layers", "python -m benchmarks.bench_layers", NAME)
    m = result["meta"]
    lines.append(f"- {m['threads']} threads; {m.get('rounds')} interleaved rounds per training-step job and "
                 f"{m.get('predict_rounds')} per predict job; times are the minimum over rounds (medians in the JSON).")
    lb = m["load_before"][0]
    if lb > 0.5 * m["nproc"]:
        lines.append(f"- **The machine was shared and busy** (load average {lb:.1f} on {m['nproc']} logical cores "
                     "before the run): absolute times are inflated; the ratios come from interleaved rounds "
                     "and are the numbers to read.")
    lines.append("- Every job is measured twice in the same process: first with glibc's default allocation "
                 "behaviour, then with a steady heap (`harness.steady_heap`: allocations up to 32 MiB from the heap, "
                 "freed memory kept, as jemalloc / tcmalloc do). With the defaults, a tensor of a few MB is a fresh "
                 "`mmap` on some calls and reused heap memory on others, and the page faults of a fresh mapping "
                 "cost as much as a cheap kernel on it, so those timings depend on the allocations before them.")
    lines.append("")
    runs = [("glibc default", result)]
    if "steady_heap" in result:
        runs.append(("steady heap", result["steady_heap"]))
    sections, per_run = [], []
    for label, res in runs:
        targets, body = _sections(res, label, H)
        per_run.append(targets)
        sections.extend(body)
    tt = H.Table("target", *[f"measured ({label})" for label, _ in runs], "met")
    for i, (name, _, tgt, higher) in enumerate(per_run[0]):
        vals = [t[i][1] for t in per_run]
        ok = [(v >= tgt if higher else v <= tgt) for v in vals]
        met = "yes" if all(ok) else ("**no**" if not any(ok) else "only " + ", ".join(
            label for (label, _), o in zip(runs, ok) if o))
        tt.add(name, *[H.fmt_ratio(v) for v in vals], met)
    lines.append("## Targets\n\n" + str(tt))
    lines.extend(sections)
    return "\n".join(lines) + "\n"


def _sections(res, label, H):
    """(targets, markdown lines) of one measurement run."""
    lines, targets = [], []
    for job, rows in res["steps"].items():
        base = "nn.Linear" if job == "linear" else "nn.Conv2d"
        mf = "MeanFieldLinear reparam" if job == "linear" else "MeanFieldConv2d reparam"
        btname = ("bayesian-torch LinearReparameterization" if job == "linear"
                  else "bayesian-torch Conv2dReparameterization")
        desc = ("batch 128, 512 -> 512" if job == "linear" else "batch 32, 32 -> 64 channels, 3x3, 16x16")
        lines.append(f"## Training step, {job} ({desc}), {label}\n")
        lines.append("forward + KL/N + backward, float32.\n")
        t = H.Table("layer", "time", "/ plain", "/ our mean-field (reparam)")
        for name, v in rows.items():
            t.add(name, H.fmt_time(v["min"]), H.fmt_ratio(v["min"] / rows[base]["min"]),
                  H.fmt_ratio(v["min"] / rows[mf]["min"]))
        lines.append(str(t))
        if btname in rows:
            targets.append((f"{job}: bayesian-torch reparam / our mean-field reparam (target >= 1)",
                            rows[btname]["min"] / rows[mf]["min"], 1.0, True))
            flip_bt = btname.replace("Reparameterization", "Flipout")
            flip_ours = mf.replace("reparam", "flipout")
            if flip_bt in rows:
                targets.append((f"{job}: bayesian-torch flipout / our mean-field flipout (target >= 1)",
                                rows[flip_bt]["min"] / rows[flip_ours]["min"], 1.0, True))
        rad = "RadialLinear" if job == "linear" else "RadialConv2d"
        targets.append((f"{job}: Radial / our mean-field reparam (target <= 1.3)",
                        rows[rad]["min"] / rows[mf]["min"], 1.3, False))
    for net_name, per_kind in res["predict"].items():
        lines.append(f"## predict: 32 samples, {net_name}, {label}\n")
        t = H.Table("kind", "batched (predict)", "Python loop", "loop / batched")
        for kind, v in per_kind.items():
            r = v["loop"]["min"] / v["batched"]["min"]
            t.add(kind, H.fmt_time(v["batched"]["min"]), H.fmt_time(v["loop"]["min"]), H.fmt_ratio(r))
            targets.append((f"predict {kind}, {net_name}: loop / batched (target >= 3)", r, 3.0, True))
        lines.append(str(t))
    return targets, lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    add_args(ap)
    ap.add_argument("--no-write", action="store_true", help="print the report instead of writing docs/benchmarks")
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import harness as H

    result = run(args)
    if args.no_write:
        print(render(result))
    else:
        print("wrote", H.write_report(NAME, result, render))


if __name__ == "__main__":
    main()
