"""Benchmark of the Kronecker-eigenbasis op against the bare matrix products and peers.

    python -m benchmarks.bench_kron                 # out = in = 1024, 8 right-hand sides, float32, 2 threads
    python -m benchmarks.bench_kron --quick         # out = in = 256, fewer repeats (~10 s)
    python benchmarks/bench_kron.py --size 512 --rhs 4 --dtype float64 --out-dir /tmp/kron

The job: Y = Q_out ((Q_out^T V Q_in) * S^p) Q_in^T for V of shape (rhs, out, in), with
orthogonal Q_out (out x out), Q_in (in x in) and S = l_out l_in^T + delta > 0 (the
eigenvalues of a damped K-FAC factor pair), p = 1 (multiply) and p = -1 (solve).
Everything is timed in the same process, interleaved round-robin (one call of each
implementation per round, so slow phases of a shared machine hit all of them), and
the table reports the minimum and the median per implementation:

* bare matmuls -- the four products Q_out @ ((Q_out^T @ V) @ Q_in) @ Q_in^T alone
  (torch.matmul; the floor the target refers to: ours within 1.3x);
* ours -- vmfdist.ops.kron_eigen_matvec (one compiled op: the four products into two
  buffers, S^p fused into one pass);
* torch composite -- the same formula in eager PyTorch with S.pow(p);
* laplace-torch KronDecomposed.bmm(W, exponent=p) on the same factors (W of shape
  (rhs, 1, out*in)); it builds S^p = (l_out l_in^T + delta)^p itself, as it does in use.
  Skipped with a note when laplace-torch cannot be imported (see benchmarks/README.md).

The sampling variant is timed too: kron_eigen_sample (8 draws, Philox noise drawn
inside) against the eager composite loc + Q_out (randn * var^(1/2)) Q_in^T.

Writes docs/benchmarks/kron.md and kron.json (``--out-dir``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=int, default=1024, help="out = in (default 1024)")
    p.add_argument("--rhs", type=int, default=8, help="right-hand sides / samples (default 8)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="size 256, 5 rounds")
    p.add_argument("--out-dir", default=None, help="default: docs/benchmarks of the repository")
    p.add_argument("--no-write", action="store_true", help="print only")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(k, str(args.threads))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    import torch

    from benchmarks.run import _cpu_name, _git  # stdlib-only module
    from vmfdist.ops import kron_eigen_matvec, kron_eigen_sample

    if args.quick:
        args.size, args.repeats = 256, 5
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    dt = getattr(torch, args.dtype)
    n, r = args.size, args.rhs
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    # ---- the job --------------------------------------------------------------------
    g = torch.Generator().manual_seed(0)

    def factor(m):
        a = torch.randn(m, 2 * m, generator=g, dtype=torch.float64)
        lam, q = torch.linalg.eigh(a @ a.T / (2 * m))
        return lam.clamp_min(0).to(dt).to(dev), q.to(dt).to(dev)

    l_out, q_out = factor(n)
    l_in, q_in = factor(n)
    delta = 1e-2
    scale = (torch.outer(l_out, l_in) + delta).contiguous()
    v = torch.randn(r, n, n, generator=g, dtype=torch.float64).to(dt).to(dev)
    loc = torch.randn(n, n, generator=g, dtype=torch.float64).to(dt).to(dev)

    impls = {}  # name -> (group, callable)
    for p in (1.0, -1.0):
        grp = f"matvec p={p:+g}"
        impls[f"bare matmuls|{grp}"] = (grp, lambda: q_out @ ((q_out.mT @ v) @ q_in) @ q_in.mT)
        impls[f"ours|{grp}"] = (grp, lambda p=p: kron_eigen_matvec(q_out, q_in, scale, v, p))
        impls[f"torch composite|{grp}"] = (grp, lambda p=p: q_out @ (((q_out.mT @ v) @ q_in) * scale.pow(p)) @ q_in.mT)

    laplace_note = None
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import laplace  # noqa: F401
            from laplace.utils.matrix import KronDecomposed
        from importlib.metadata import version as _v

        laplace_version = _v("laplace-torch")
        kd = KronDecomposed([[q_out, q_in]], [[l_out, l_in]], deltas=torch.tensor([delta], dtype=dt, device=dev))
        w = v.reshape(r, 1, n * n)
        for p in (1.0, -1.0):
            grp = f"matvec p={p:+g}"
            impls[f"laplace-torch KronDecomposed.bmm|{grp}"] = (grp, lambda p=p: kd.bmm(w, exponent=p))
    except Exception as e:  # pragma: no cover - depends on the environment
        laplace_version = None
        laplace_note = f"laplace-torch not importable here: {type(e).__name__}: {e}"
        print(laplace_note, flush=True)

    var = scale.reciprocal()  # the posterior variances of a noisy EK-FAC layer, ~ 1 / (eigenvalues + delta)
    grp = f"sample x{r}"
    impls[f"ours|{grp}"] = (grp, lambda: kron_eigen_sample(loc, q_out, q_in, var, (r,)))
    impls[f"torch composite (randn)|{grp}"] = (
        grp, lambda: loc + q_out @ (torch.randn(r, n, n, dtype=dt, device=dev) * var.sqrt()) @ q_in.mT)
    impls[f"bare matmuls|{grp}"] = (grp, lambda: q_out @ v @ q_in.mT)

    # ---- agreement ----------------------------------------------------------------------
    checks = {}
    with torch.no_grad():
        for p in (1.0, -1.0):
            ref = q_out.double() @ ((q_out.double().mT @ v.double() @ q_in.double()) * scale.double().pow(p)) \
                @ q_in.double().mT
            for name in ("ours", "laplace-torch KronDecomposed.bmm"):
                key = f"{name}|matvec p={p:+g}"
                if key in impls:
                    y = impls[key][1]().reshape(ref.shape).double()
                    checks[key] = ((y - ref).abs().max() / ref.abs().max()).item()
    print("max |y - y_float64| / max |y_float64|:", {k: f"{x:.1e}" for k, x in checks.items()}, flush=True)

    # ---- timing: one warm-up each, then interleaved rounds -------------------------
    load_before = os.getloadavg()
    t_begin = time.time()
    times = {k: [] for k in impls}
    with torch.no_grad():
        for _, f in impls.values():
            f()
            sync()
        for rnd in range(args.repeats):
            for k, (_, f) in impls.items():
                sync()
                t0 = time.perf_counter()
                f()
                sync()
                times[k].append(time.perf_counter() - t0)
            print(f"round {rnd + 1}/{args.repeats}", flush=True)
    load_after = os.getloadavg()

    rows = []
    order = list(dict.fromkeys(grp for grp, _ in impls.values()))
    for k, ts in sorted(times.items(), key=lambda kv: order.index(impls[kv[0]][0])):
        name, grp = k.split("|")
        rows.append({"group": grp, "impl": name, "min": min(ts), "median": statistics.median(ts), "times": ts})
    for row in rows:
        base = next(x for x in rows if x["group"] == row["group"] and x["impl"] == "bare matmuls")
        row["vs_bare_min"] = row["min"] / base["min"]
        row["vs_bare_median"] = row["median"] / base["median"]
        ours = next((x for x in rows if x["group"] == row["group"] and x["impl"] == "ours"), None)
        row["vs_ours_min"] = row["min"] / ours["min"] if ours else None
        print(f"{row['group']:>14} {row['impl']:>34}: min {row['min'] * 1e3:9.1f} ms  median "
              f"{row['median'] * 1e3:9.1f} ms  x bare {row['vs_bare_min']:.2f} (median {row['vs_bare_median']:.2f})",
              flush=True)

    flops = 4 * 2 * n * n * n * r
    meta = {
        "size": n, "rhs": r, "dtype": args.dtype, "threads": args.threads, "device": str(dev),
        "repeats": args.repeats, "quick": args.quick, "delta": delta,
        "cpu": _cpu_name(), "nproc": os.cpu_count(), "load_before": load_before, "load_after": load_after,
        "seconds": time.time() - t_begin, "git": _git(root), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "laplace-torch": laplace_version},
        "laplace_note": laplace_note, "gflop_per_call": flops / 1e9,
        "blas": _blas(torch), "checks": checks,
    }
    result = {"meta": meta, "rows": rows}
    if not args.no_write:
        out_dir = args.out_dir or os.path.join(root, "docs", "benchmarks")
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "kron.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        with open(os.path.join(out_dir, "kron.md"), "w") as fh:
            fh.write(render_markdown(result))
        print(f"wrote {out_dir}/kron.md and kron.json", flush=True)
    return result


def _ms(s):
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"


def render_markdown(result) -> str:
    m, rows = result["meta"], result["rows"]
    n, r = m["size"], m["rhs"]
    lines = [
        "# Benchmarks: the Kronecker-eigenbasis op",
        "",
        "Generated by `python -m benchmarks.bench_kron` (see `benchmarks/README.md`); raw numbers in `kron.json`.",
        "",
        f"- Job: $Y = Q_{{out}}((Q_{{out}}^T V Q_{{in}}) \\odot S^p)Q_{{in}}^T$ with out = in = {n}, "
        f"V of shape ({r}, {n}, {n}) ({r} right-hand sides), {m['dtype']}, {m['device']}, "
        f"{m['threads']} threads (`torch.set_num_threads`); $S = l_{{out}}l_{{in}}^T + \\delta$, "
        f"$\\delta$ = {m['delta']}. The four products are {m['gflop_per_call']:.1f} GFLOP per call.",
        f"- Date {m['date']}, git `{m['git']}`, {m['seconds']:.0f} s. CPU: {m['cpu']} ({m['nproc']} logical cores); "
        f"load average before/after {m['load_before'][0]:.2f} / {m['load_after'][0]:.2f} "
        "(the machine is shared: compare the ratios, which are taken within one run).",
        f"- python {m['versions']['python']}, torch {m['versions']['torch']}"
        + (f", laplace-torch {m['versions']['laplace-torch']}" if m['versions']['laplace-torch'] else "")
        + f"; BLAS: {m['blas']}.",
        f"- {m['repeats']} interleaved rounds after one warm-up call each (every round times every implementation "
        "once, so load changes hit all of them); min and median per implementation. "
        "Ratio = time / time of the bare matmuls of the same row group (< 1.3 is the target for ours).",
    ]
    if m.get("laplace_note"):
        lines.append(f"- {m['laplace_note']}")
    lines += ["", "| job | implementation | min | median | × bare (min) | × bare (median) |",
              "|---|---|---|---|---|---|"]
    for row in rows:
        bold = "**" if row["impl"] == "ours" else ""
        lines.append(f"| {row['group']} | {bold}{row['impl']}{bold} | {_ms(row['min'])} | {_ms(row['median'])} | "
                     f"{row['vs_bare_min']:.2f} | {row['vs_bare_median']:.2f} |")
    lines += ["", "Agreement with a float64 evaluation of the same formula (max abs error / max abs value):", ""]
    for k, x in m["checks"].items():
        lines.append(f"- {k.replace('|', ', ')}: {x:.1e}")
    lines += ["", "For the sampling rows, *bare matmuls* is the two products $Q_{out} V Q_{in}^T$ alone; the "
              "composite draws its noise with `torch.randn` (ours draws it from the project's Philox streams, "
              "fused with the multiplication by $\\mathrm{var}^{1/2}$).", ""]
    ours = {row["group"]: row for row in rows if row["impl"] == "ours"}
    verdict = []
    for grp, row in ours.items():
        if grp.startswith("matvec"):
            ok = row["vs_bare_min"] <= 1.3
            verdict.append(f"{grp}: {row['vs_bare_min']:.2f}× the bare matmuls (min), "
                           f"{row['vs_bare_median']:.2f}× (median) — target ≤ 1.3×: {'met' if ok else 'not met'}")
    lines += ["Target (issue #4): " + "; ".join(verdict) + ".", ""]
    return "\n".join(lines)


def _blas(torch):
    import re

    m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return m.group(1) if m else "unknown"


if __name__ == "__main__":
    main()
