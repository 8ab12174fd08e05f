"""Run the special-function benchmarks and write docs/benchmarks/special.{md,json,png}.

    python -m benchmarks.run                 # full run (~10 min on 2 cores)
    python -m benchmarks.run --quick         # sizes 1e3..1e5, fewer repeats (~1-2 min)
    python benchmarks/run.py --benches bessel_iv_ratio log_bessel_iv --dtypes float64 --sizes 1e4 1e6

Thread fairness: torch.set_num_threads(--threads) for us and the torch composites;
XLA_FLAGS / TF intra-op settings for JAX are set *before* JAX is imported (see README);
SciPy ufuncs are split over the same number of threads (see bench_special.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time


def _set_thread_env(threads: int) -> None:
    # Must happen before jax / torch import their thread pools.
    flags = os.environ.get("XLA_FLAGS", "")
    extra = f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}"
    if "intra_op_parallelism_threads" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " " + extra).strip()
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(k, str(threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--benches", nargs="*", default=["all"], help="function names (default: all)")
    p.add_argument("--sizes", nargs="*", type=float, default=None, help="element counts (default 1e3..1e7)")
    p.add_argument("--dtypes", nargs="*", default=["float64", "float32"])
    p.add_argument("--workloads", nargs="*", default=["mixed", "vMF"])
    p.add_argument("--devices", nargs="*", default=None, help="cpu and/or cuda (default: cpu + cuda if available)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="sizes 1e3..1e5, fewer repeats, small accuracy sample")
    p.add_argument("--max-call", type=float, default=3.0,
                   help="skip a size for an implementation when its projected single call exceeds this (s)")
    p.add_argument("--all-1e7", action="store_true", help="run n=1e7 for the slow (iterative) functions too")
    p.add_argument("--no-profile", action="store_true", help="skip the per-regime profile")
    p.add_argument("--no-accuracy", action="store_true")
    p.add_argument("--out", default=None, help="output folder (default docs/benchmarks under the repo root)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    _set_thread_env(args.threads)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from benchmarks import bench_special as B

    out_dir = args.out or os.path.join(root, "docs", "benchmarks")
    os.makedirs(out_dir, exist_ok=True)
    if args.sizes is None:
        sizes = [1e3, 1e4, 1e5] if args.quick else [1e3, 1e4, 1e5, 1e6, 1e7]
    else:
        sizes = args.sizes
    sizes = sorted(int(s) for s in sizes)
    tkw = dict(min_reps=3, max_reps=10, min_total=0.1) if args.quick else dict(min_reps=5, max_reps=50, min_total=0.4)
    n_acc_ref = 200 if args.quick else 1000
    dtypes = [getattr(torch, d) for d in args.dtypes]
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    devices = [torch.device(d) for d in devices]

    t_begin = time.time()
    meta = {
        "versions": B.versions(),
        "threads": args.threads,
        "torch_threads": torch.get_num_threads(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
        "cpu": _cpu_name(),
        "nproc": os.cpu_count(),
        "load_before": os.getloadavg(),
        "git": _git(root),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quick": args.quick,
        "timing": tkw,
        "torch_parallel_backend": "OpenMP" if "OpenMP" in torch.__config__.parallel_info() else "native",
        "extension_calls_openmp": _extension_uses_openmp(),
    }
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    print("versions:", meta["versions"], "\nXLA_FLAGS:", meta["XLA_FLAGS"], flush=True)

    rows, acc_rows, bw_rows = [], [], []
    wl_cache = {}

    def workload(name, n):
        if (name, n) not in wl_cache:
            wl_cache[(name, n)] = B.make_workload(name, n)
        return wl_cache[(name, n)]

    # mpmath references on the first n_acc_ref points of each workload, per dtype (rounded inputs)
    refs = {}
    if not args.no_accuracy:
        t0 = time.time()
        for wl in args.workloads:
            nu, z = B.make_workload(wl, n_acc_ref)
            for dt in dtypes:
                npdt = np.float32 if dt == torch.float32 else np.float64
                refs[(wl, dt)] = B.mpmath_reference(nu.astype(npdt).astype(np.float64), z.astype(npdt).astype(np.float64))
        print(f"mpmath references: {time.time() - t0:.1f}s", flush=True)

    for dev in devices:
        benches = B.make_benches(dev)
        names = list(benches) if args.benches in (["all"], []) else args.benches
        for dt in dtypes:
            for n in sizes:
                bw = B.bandwidth_floor(n, dt, dev, **tkw)
                bw_rows.append({"device": dev.type, "dtype": str(dt).replace("torch.", ""), "n": n, **bw})
            for name in names:
                bench = benches[name]
                for wl in args.workloads:
                    last = {}  # impl name -> (n, seconds) for the skip projection
                    for n in sizes:
                        if bench.max_n is not None and n > bench.max_n:
                            continue
                        if n >= 10_000_000 and not bench.fast and not args.all_1e7:
                            continue
                        nu, z = workload(wl, n)
                        row = {"function": name, "workload": wl, "dtype": str(dt).replace("torch.", ""),
                               "device": dev.type, "n": n, "impls": {}}
                        for impl in [bench.ours] + bench.peers:
                            if impl.name in last:
                                pn, pt = last[impl.name]
                                if pt is None or pt * n / pn > args.max_call:
                                    row["impls"][impl.name] = None
                                    last[impl.name] = (n, None)
                                    continue
                            a = impl.prepare(nu, z, dt)
                            t = B.time_call(impl.run, a, **tkw)
                            del a
                            t["ns_per_elem"] = t["min"] / n * 1e9
                            row["impls"][impl.name] = t
                            last[impl.name] = (n, t["min"])
                        ours = row["impls"][bench.ours.name]
                        if ours is not None:
                            itemsize = torch.finfo(dt).bits // 8
                            ours["GBps"] = bench.io_elems * n * itemsize / ours["min"] / 1e9
                        rows.append(row)
                        _print_row(row, bench)
                    # accuracy at n = min(1e5, largest size)
                    if not args.no_accuracy:
                        n_acc = min(100_000, sizes[-1])
                        nu, z = workload(wl, n_acc)
                        ref = refs.get((wl, dt))
                        idx = np.arange(min(n_acc_ref, n_acc))
                        if ref is not None and len(idx) < n_acc_ref:
                            ref = {k: v[: len(idx)] for k, v in ref.items()}
                        for impl in [bench.ours] + bench.peers:
                            acc = B.accuracy(impl, bench.ref, nu, z, dt, ref, idx)
                            acc_rows.append({"function": name, "workload": wl, "dtype": str(dt).replace("torch.", ""),
                                             "device": dev.type, "impl": impl.name, **acc})

    profile = []
    if not args.no_profile and any(n in ("bessel_iv_ratio", "log_bessel_iv") for n in
                                    (list(B.make_benches(torch.device("cpu"))) if args.benches in (["all"], []) else args.benches)):
        profile = run_profile(B, torch, quick=args.quick, tkw=tkw)

    scaling = [] if args.no_profile else run_scaling(B, torch, args.threads, quick=args.quick, tkw=tkw)

    meta["load_after"] = os.getloadavg()
    meta["seconds"] = time.time() - t_begin
    result = {"meta": meta, "rows": rows, "accuracy": acc_rows, "bandwidth": bw_rows, "profile": profile,
              "scaling": scaling}
    with open(os.path.join(out_dir, "special.json"), "w") as f:
        json.dump(result, f, indent=1)
    from benchmarks.report import write_markdown, write_plot

    write_markdown(result, os.path.join(out_dir, "special.md"))
    write_plot(result, os.path.join(out_dir, "special.png"))
    print(f"done in {meta['seconds']:.0f}s -> {out_dir}/special.md", flush=True)


PROFILE_NU = [(0.5, 2.0), (2.0, 20.0), (20.0, 100.0), (100.0, 500.0)]
PROFILE_Z = [(1e-3, 0.1), (0.1, 10.0), (10.0, 100.0), (100.0, 1000.0)]


def run_profile(B, torch, quick: bool, tkw):
    """ns/element of ours vs peers (float64, CPU) in boxes of (nu, z)."""
    n = 20_000 if quick else 100_000
    benches = B.make_benches(torch.device("cpu"))
    out = []
    for fname in ("bessel_iv_ratio", "log_bessel_iv"):
        bench = benches[fname]
        for (a, b) in PROFILE_NU:
            for (c, d) in PROFILE_Z:
                nu, z = B.make_box(a, b, c, d, n)
                rec = {"function": fname, "nu": [a, b], "z": [c, d], "n": n, "ns_per_elem": {}}
                for impl in [bench.ours] + bench.peers:
                    args = impl.prepare(nu, z, torch.float64)
                    t = B.time_call(impl.run, args, **tkw)
                    rec["ns_per_elem"][impl.name] = t["min"] / n * 1e9
                out.append(rec)
                print("profile", fname, rec["nu"], rec["z"],
                      {k: round(v, 1) for k, v in rec["ns_per_elem"].items()}, flush=True)
    return out


def run_scaling(B, torch, threads: int, quick: bool, tkw):
    """Speed-up of ours from 1 to `threads` threads (float64, mixed), with torch.exp as a control.

    A speed-up near 1 for ours while the control scales means at::parallel_for ran
    serially (e.g. the extension was compiled without -fopenmp while torch uses OpenMP)."""
    import numpy as np

    n = 100_000 if quick else 1_000_000
    nu, z = (torch.as_tensor(a) for a in B.make_workload("mixed", n))
    z = z.clone()
    cases = [("bessel_iv_ratio", lambda: B.S.bessel_iv_ratio(nu, z)),
             ("log_bessel_iv", lambda: B.S.log_bessel_iv(nu, z)),
             ("bessel_iv_ratio_bounds", lambda: B.S.bessel_iv_ratio_bounds(nu, z)),
             ("torch.exp (control)", lambda: torch.exp(z))]
    out = []
    for name, f in cases:
        t = {}
        for th in (1, threads):
            torch.set_num_threads(th)
            t[th] = B.time_call(lambda _: f(), None, **tkw)["min"]
        torch.set_num_threads(threads)
        out.append({"case": name, "n": n, "t1": t[1], "tN": t[threads], "threads": threads, "speedup": t[1] / t[threads]})
        print("scaling", name, f"{t[1] / t[threads]:.2f}x", flush=True)
    return out


def _extension_uses_openmp() -> str:
    try:
        import vmfdist._C as C  # noqa: N812

        with open(C.__file__, "rb") as f:
            data = f.read()
        return "yes" if b"GOMP_parallel" in data or b"__kmpc_fork_call" in data else "no"
    except Exception as e:  # pragma: no cover
        return f"unknown ({type(e).__name__})"


def _print_row(row, bench):
    parts = []
    for k, t in row["impls"].items():
        parts.append(f"{k}: " + ("skipped" if t is None else f"{t['min'] * 1e3:.3f}ms"))
    print(f"{row['device']} {row['dtype']} {row['function']} {row['workload']} n={row['n']:.0e} | " + " | ".join(parts),
          flush=True)


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git(root):
    try:
        return subprocess.check_output(["git", "-C", root, "describe", "--always", "--dirty"], text=True).strip()
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
