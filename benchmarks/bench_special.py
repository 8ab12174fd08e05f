"""vmfdist.special against TFP on JAX, SciPy and pure-PyTorch composites, in one process.

Peers: TFP-JAX ``tfp.math.bessel_iv_ratio`` (same convention as ours) and ``log_bessel_ive``
(``+ z`` inside the jit for log I), jit-compiled and warmed up per shape (compile excluded);
SciPy ``_iv_ratio`` / ``_iv_ratio_c`` (private, SciPy >= 1.15) and ``log(ive)`` (``+ z``), split
over the same threads for n >= 1e5; torch composites of the closed forms (Ruiz-Antolin--Segura
bounds with ``torch.hypot``, their midpoint, the two-branch asymptotic) and the bandwidth floor
``torch.add(a, b, out=c)``.  Also: non-finite counts and max relative error against
tests/reference.py, a per-regime profile in boxes of (nu, z), and the 1 -> N thread speed-up.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict

import numpy as np
import torch

from benchmarks import harness as H
from tests import reference as R
from vmfdist import _C
from vmfdist import special as S

TITLE = "vmfdist.special vs TFP-JAX, SciPy and torch composites"
SPLIT_MIN = 100_000  # SciPy arrays at least this long are split over the threads
WORKLOADS = {"mixed": "ν ~ U[0.5, 500], z log-uniform in [1e-3, 1e3]", "vMF": "ν = 128, z ~ U[1, 1000]"}
PROFILE_NU = [(0.5, 2.0), (2.0, 20.0), (20.0, 100.0), (100.0, 500.0)]
PROFILE_Z = [(1e-3, 0.1), (0.1, 10.0), (10.0, 100.0), (100.0, 1000.0)]
TARGETS = {"bessel_iv_ratio": ("TFP-JAX bessel_iv_ratio", 5.0), "log_bessel_iv": ("TFP-JAX log_bessel_ive+z", 10.0)}
CLOSED_FORM = {"bessel_iv_ratio_bounds": 4, "bessel_iv_ratio_approx": 3, "log_bessel_iv_asymptotic": 3}  # I/O arrays
REFERENCES = {"ratio": R.ratio, "ratio_c": R.ratio_c, "log_iv": R.log_iv, "log_ive": R.log_ive}


def add_args(p):
    p.add_argument("--benches", nargs="*", default=None, help="function names (default: all)")
    p.add_argument("--sizes", nargs="*", type=float, default=None, help="element counts (default 1e3..1e7)")
    p.add_argument("--dtypes", nargs="*", default=["float64", "float32"])
    p.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    p.add_argument("--devices", nargs="*", default=None, help="cpu and/or cuda (default: cpu + cuda if available)")
    p.add_argument("--max-call", type=float, default=3.0, help="skip a size whose projected call exceeds this (s)")
    p.add_argument("--all-1e7", action="store_true", help="run n = 1e7 for the iterative functions too")
    p.add_argument("--no-profile", action="store_true", help="skip the per-regime profile and thread scaling")
    p.add_argument("--no-accuracy", action="store_true")


def workload(name: str, n: int, seed: int = 0):
    """float64 (nu, z) of length n; separate streams, so the first k points are the same for every n."""
    rnu, rz = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    if name == "mixed":
        return rnu.uniform(0.5, 500.0, n), np.exp(rz.uniform(math.log(1e-3), math.log(1e3), n))
    if name == "vMF":
        return np.full(n, 128.0), rz.uniform(1.0, 1000.0, n)
    raise ValueError(f"unknown workload {name!r}")


def box(nu_lo, nu_hi, z_lo, z_hi, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(nu_lo, nu_hi, n), np.exp(rng.uniform(math.log(z_lo), math.log(z_hi), n))


# ------------------------------------------------------------------ implementations: make(nu, z, dtype) -> run()


def _b(nu, z, alpha):  # Ruiz-Antolin--Segura theorem 5 bound as a torch composite
    lam = nu + (alpha - 1) / 2
    delta = (nu - 0.5) + lam / (2 * torch.hypot(lam, z))
    return z / (delta + torch.hypot(delta, z))


def _asymptotic(nu, z):
    eta = (nu + 0.5) / (2 * (nu + 1))
    small = nu * torch.log(z) + eta * z - (eta + nu) * math.log(2.0) - torch.lgamma(nu + 1)
    return torch.where(z < nu, small, z - 0.5 * torch.log(z) - 0.5 * math.log(2 * math.pi))


def torch_impl(fn, device):
    def make(nu, z, dt):
        a, b = (torch.as_tensor(x).to(device=device, dtype=dt) for x in (nu, z))
        return lambda: fn(a, b)
    return make


def tfp_impl(expr):
    jax, tfp = H.jax_tfp()
    if jax is None:
        return None
    f = jax.jit({"ratio": lambda v, z: tfp.math.bessel_iv_ratio(v, z),
                 "log_ive": lambda v, z: tfp.math.log_bessel_ive(v, z),
                 "log_iv": lambda v, z: tfp.math.log_bessel_ive(v, z) + z}[expr])

    def make(nu, z, dt):
        a, b = (jax.device_put(jax.numpy.asarray(x, dtype=str(dt).replace("torch.", ""))) for x in (nu, z))
        f(a, b).block_until_ready()  # compile for this shape and dtype, untimed
        return lambda: f(a, b).block_until_ready()
    return make


def scipy_impl(kernel):
    def make(nu, z, dt):
        npdt = np.float32 if dt == torch.float32 else np.float64
        a, b = np.ascontiguousarray(nu, npdt), np.ascontiguousarray(z, npdt)
        o = np.empty_like(a)

        def run():
            if len(o) < SPLIT_MIN:
                kernel(a, b, o)
            else:
                H.split_threads(lambda lo, hi: kernel(a[lo:hi], b[lo:hi], o[lo:hi]), len(o), torch.get_num_threads())
            return o
        return run
    return make


def _log_ive(plus_z):
    from scipy.special import ive

    def k(v, z, o):
        with np.errstate(divide="ignore", invalid="ignore"):
            ive(v, z, out=o)
            np.log(o, out=o)
            if plus_z:
                np.add(o, z, out=o)
    return k


def benches(device):
    """{function: (ours, [(peer name, make)], reference key, closed form?, max n)}."""
    from scipy.special._ufuncs import _iv_ratio, _iv_ratio_c

    T = lambda fn: torch_impl(fn, device)  # noqa: E731
    sp = (lambda k: scipy_impl(k)) if device.type == "cpu" else (lambda k: None)
    hyp = "torch composite (hypot)"
    rows = [  # (function, peers, reference key, largest n)
        ("bessel_iv_ratio", [("TFP-JAX bessel_iv_ratio", tfp_impl("ratio")),
                             ("SciPy _iv_ratio", sp(lambda v, z, o: _iv_ratio(v, z, out=o)))], "ratio", None),
        ("bessel_iv_ratio_c", [("SciPy _iv_ratio_c", sp(lambda v, z, o: _iv_ratio_c(v, z, out=o)))], "ratio_c", None),
        ("log_bessel_iv", [("TFP-JAX log_bessel_ive+z", tfp_impl("log_iv")), ("SciPy log(ive)+z", sp(_log_ive(True)))],
         "log_iv", None),
        ("log_bessel_ive", [("TFP-JAX log_bessel_ive", tfp_impl("log_ive")), ("SciPy log(ive)", sp(_log_ive(False)))],
         "log_ive", None),
        ("bessel_iv_ratio_bounds", [(hyp, T(lambda v, z: (_b(v, z, 2.0), _b(v, z, 0.0))))], None, None),
        ("bessel_iv_ratio_approx", [(hyp, T(lambda v, z: 0.5 * (_b(v, z, 2.0) + _b(v, z, 0.0))))], None, None),
        ("log_bessel_iv_asymptotic", [("torch composite (where)", T(_asymptotic))], None, None),
        ("log_bessel_iv_series", [("SciPy log(ive)+z", sp(_log_ive(True)))], None, 1_000_000),
    ]
    return {f: ([("vmfdist", T(getattr(S, f)))] + [(n, m) for n, m in peers if m is not None], ref, mx)
            for f, peers, ref, mx in rows}


def to_np(r):
    if isinstance(r, tuple):
        return tuple(to_np(x) for x in r)
    if isinstance(r, torch.Tensor):
        return r.detach().double().cpu().numpy()
    return np.asarray(r, dtype=np.float64)


def reference(key, nu, z):
    out = np.empty(len(nu))
    for i, (v, x) in enumerate(zip(nu.tolist(), z.tolist())):
        try:
            out[i] = float(REFERENCES[key](v, x))
        except R.ReferenceError_:
            out[i] = np.nan
    return out


def accuracy(out, want, key, dtype):
    res = {"nonfinite": int(sum((~np.isfinite(x)).sum() for x in (out if isinstance(out, tuple) else (out,)))),
           "n_checked": int(len(out[0] if isinstance(out, tuple) else out))}
    if want is not None:
        got = out[: len(want)]
        err = np.abs(got - want) / (np.maximum(1.0, np.abs(want)) if key.startswith("log") else np.abs(want))
        err = np.where(np.isfinite(got), err, np.inf)[np.isfinite(want)]
        res.update(maxrel=float(err.max()), n_bad=int((err > (1e-9 if dtype == torch.float64 else 1e-4)).sum()),
                   n_ref=int(len(err)))
    return res


# ------------------------------------------------------------------ run


def run(args):
    tkw = H.timing(args.quick)
    sizes = sorted(int(s) for s in (args.sizes or ([1e3, 1e4, 1e5] if args.quick else [1e3, 1e4, 1e5, 1e6, 1e7])))
    dtypes = [getattr(torch, d) for d in args.dtypes]
    devices = [torch.device(d) for d in (args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]))]
    n_ref = 200 if args.quick else 1000
    meta = H.meta(args, ("scipy", "jax"), XLA_FLAGS=os.environ.get("XLA_FLAGS"), timing=tkw,
                  reference="tests/reference.py (mpmath, certified to 40 digits)",
                  torch_parallel_backend="OpenMP" if "OpenMP" in torch.__config__.parallel_info() else "native",
                  extension_calls_openmp=_calls_openmp())
    res = {"meta": meta, "rows": [], "accuracy": [], "bandwidth": [], "profile": [], "scaling": []}
    refs = {}
    for dev in devices:
        bs = benches(dev)
        for dt in dtypes:
            dts = str(dt).replace("torch.", "")
            for n in sizes:
                a, b, c = (torch.rand(n, dtype=dt, device=dev) for _ in range(3))
                t = H.time_fn(lambda: torch.add(a, b, out=c), sync=H.sync_fn(dev), **tkw)
                res["bandwidth"].append({"device": dev.type, "dtype": dts, "n": n, **t,
                                         "GBps": 3 * n * a.element_size() / t["min"] / 1e9})
            for name in args.benches or list(bs):
                impls, key, max_n = bs[name]
                for wl in args.workloads:
                    last = {}  # impl -> (n, seconds) of its previous size, to project the next
                    for n in sizes:
                        if (max_n and n > max_n) or (n >= 10**7 and name not in CLOSED_FORM and not args.all_1e7):
                            continue
                        nu, z = workload(wl, n)
                        row = {"function": name, "workload": wl, "dtype": dts, "device": dev.type, "n": n, "impls": {}}
                        for iname, make in impls:
                            pn, pt = last.get(iname, (n, 0.0))
                            if pt is None or pt * n / pn > args.max_call:
                                row["impls"][iname] = last[iname] = None
                                continue
                            t = H.time_fn(make(nu, z, dt), sync=H.sync_fn(dev), **tkw)
                            row["impls"][iname], last[iname] = t, (n, t["min"])
                        res["rows"].append(row)
                        print(dev.type, dts, name, wl, f"n={n:.0e}", " | ".join(
                            f"{k}: {H.fmt_time(t and t['min'])}" for k, t in row["impls"].items()), flush=True)
                    if args.no_accuracy:
                        continue
                    nu, z = workload(wl, min(100_000, sizes[-1]))
                    want = None
                    if key is not None:
                        npdt = np.float32 if dt == torch.float32 else np.float64
                        k = min(n_ref, len(nu))
                        if (key, wl, dts, k) not in refs:  # inputs rounded to the dtype first
                            refs[(key, wl, dts, k)] = reference(key, nu[:k].astype(npdt).astype(np.float64),
                                                                z[:k].astype(npdt).astype(np.float64))
                        want = refs[(key, wl, dts, k)]
                    for iname, make in impls:
                        res["accuracy"].append({"function": name, "workload": wl, "dtype": dts, "device": dev.type,
                                                "impl": iname, **accuracy(to_np(make(nu, z, dt)()), want, key, dt)})
    if not args.no_profile:
        bs, n = benches(torch.device("cpu")), 20_000 if args.quick else 100_000
        for fname in [f for f in ("bessel_iv_ratio", "log_bessel_iv") if f in (args.benches or [f])]:
            for (a, b) in PROFILE_NU:
                for (c, d) in PROFILE_Z:
                    nu, z = box(a, b, c, d, n)
                    ns = {iname: H.time_fn(make(nu, z, torch.float64), **tkw)["min"] / n * 1e9
                          for iname, make in bs[fname][0]}
                    res["profile"].append({"function": fname, "nu": [a, b], "z": [c, d], "n": n, "ns_per_elem": ns})
                    print("profile", fname, [a, b], [c, d], {k: round(v, 1) for k, v in ns.items()}, flush=True)
        res["scaling"] = scaling(args.threads, 100_000 if args.quick else 1_000_000, tkw)
    return res


def scaling(threads, n, tkw):
    """Speed-up of ours from 1 to `threads` threads, torch.exp as the control: ~1 for ours while the
    control scales means at::parallel_for ran serially (extension built without -fopenmp)."""
    nu, z = (torch.as_tensor(a) for a in workload("mixed", n))
    cases = [("bessel_iv_ratio", lambda: S.bessel_iv_ratio(nu, z)), ("log_bessel_iv", lambda: S.log_bessel_iv(nu, z)),
             ("bessel_iv_ratio_bounds", lambda: S.bessel_iv_ratio_bounds(nu, z)),
             ("torch.exp (control)", lambda: torch.exp(z))]
    out = []
    for name, f in cases:
        t = {}
        for th in (1, threads):
            torch.set_num_threads(th)
            t[th] = H.time_fn(f, **tkw)["min"]
        torch.set_num_threads(threads)
        out.append({"case": name, "n": n, "t1": t[1], "tN": t[threads], "threads": threads,
                    "speedup": t[1] / t[threads]})
    return out


def _calls_openmp() -> str:
    with open(_C.__file__, "rb") as f:
        data = f.read()
    return "yes" if b"GOMP_parallel" in data or b"__kmpc_fork_call" in data else "no"


# ------------------------------------------------------------------ report


def _ours(r):
    return r["impls"].get("vmfdist")


def render(res):
    m = res["meta"]
    tm = m["timing"]
    L = H.header(res, "Benchmarks: `vmfdist.special` vs peers", "python -m benchmarks.run special", "special")
    L += [f"- Threads: `torch.set_num_threads({m['threads']})` (ours and the torch composites); JAX with "
          f"`XLA_FLAGS=\"{m['XLA_FLAGS']}\"` on a {m['nproc']}-core machine; SciPy ufuncs split over {m['threads']} "
          "Python threads for n ≥ 1e5 (single call below).",
          f"- Times are the **minimum** over repeats (min {tm['min_reps']}, up to {tm['max_reps']}, ≥ "
          f"{tm['min_total']} s "
          "per point) after one warm-up call; JAX functions are `jax.jit`-compiled and warmed up per shape (compile "
          "excluded), timed with `block_until_ready()`. Inputs are pre-converted to each library's array type "
          "(conversion excluded). Medians are in `special.json`.",
          "- Ratio = peer time / our time (> 1: we are faster). Workloads: "
          + "; ".join(f"{k} = {v}" for k, v in WORKLOADS.items()) + ".",
          "- \"—\" = not run (projected single call over the time cap, or size not in the plan).\n"]
    cpu64 = [r for r in res["rows"] if r["dtype"] == "float64" and r["device"] == "cpu"]
    t = H.Table("function", "peer", "workload", "target", "ratio by n", "met (largest n)")
    for fn, (peer, tgt) in TARGETS.items():
        for wl in WORKLOADS:
            rat = {r["n"]: r["impls"][peer]["min"] / _ours(r)["min"] for r in cpu64 if r["function"] == fn
                   and r["workload"] == wl and _ours(r) and r["impls"].get(peer)}
            if rat:
                top = rat[max(rat)]
                t.add(f"`{fn}`", peer, wl, f"≥ {tgt:g}×", ", ".join(f"{H.fmt_n(n)}: {H.fmt_ratio(x)}" for n, x in
                                                                  sorted(rat.items())),
                      f"{'yes' if top >= tgt else '**no**'} ({H.fmt_ratio(top)} at {H.fmt_n(max(rat))})")
    if t.rows:
        L += ["## Targets (float64, CPU, same threads)\n", str(t)]
    t = H.Table("function", "workload", "n", "dtype", "device", "ours", "ours ns/elem", "peer", "peer time",
                "peer/ours")
    for r in res["rows"]:
        o = _ours(r)
        for k in [k for k in r["impls"] if k != "vmfdist"] or [None]:
            p = r["impls"].get(k) if k else None
            t.add(f"`{r['function']}`", r["workload"], H.fmt_n(r["n"]), r["dtype"], r["device"],
                  H.fmt_time(o and o["min"]), f"{o['min'] / r['n'] * 1e9:.1f}" if o else "—", k or "(no peer)",
                  H.fmt_time(p and p["min"]), H.fmt_ratio(p["min"] / o["min"] if p and o else None))
    L += ["## Timings\n", str(t)]
    bw = {(b["device"], b["dtype"], b["n"]): b["GBps"] for b in res["bandwidth"]}
    t = H.Table("function", "workload", "n", "dtype", "ours GB/s", "floor GB/s", "% of floor", "torch composite / ours")
    for r in res["rows"]:
        o, floor = _ours(r), bw.get((r["device"], r["dtype"], r["n"]))
        if r["function"] in CLOSED_FORM and o and floor:
            gbps = CLOSED_FORM[r["function"]] * r["n"] * (4 if r["dtype"] == "float32" else 8) / o["min"] / 1e9
            p = [v for k, v in r["impls"].items() if k != "vmfdist" and v]
            t.add(f"`{r['function']}`", r["workload"], H.fmt_n(r["n"]), r["dtype"], f"{gbps:.2f}", f"{floor:.2f}",
                  f"{100 * gbps / floor:.0f}%", H.fmt_ratio(p[0]["min"] / o["min"] if p else None))
    if t.rows:
        L += ["## Closed-form kernels vs the memory-bandwidth floor\n",
              "Effective GB/s = (inputs + outputs) bytes / time (bounds: 2 in + 2 out, others 2 in + 1 out). Floor = "
              "`torch.add(a, b, out=c)` on the same n and dtype (3 arrays), measured in the same run; \"% of floor\" = "
              "our GB/s / floor GB/s.\n", str(t)]
    if res["accuracy"]:
        t = H.Table("function", "workload", "dtype", "implementation", "non-finite / n", "max rel err", "bad / checked")
        for a in res["accuracy"]:
            t.add(f"`{a['function']}`", a["workload"], a["dtype"], a["impl"], f"{a['nonfinite']} / {a['n_checked']}",
                  f"{a['maxrel']:.1e}" if "maxrel" in a else "—",
                  f"{a['n_bad']} / {a['n_ref']}" if "n_bad" in a else "—")
        L += ["## Accuracy side column\n",
              "Non-finite outputs over n = 1e5 points of the workload (the true values are all finite); max relative "
              "error (logs: |Δ| / max(1, |log|)) on the first points against "
              f"{m.get('reference', 'mpmath at 30 digits')} (inputs rounded to the dtype first); \"bad\" = error > "
              "1e-9 "
              "(float64) or 1e-4 (float32). The closed-form approximations have no exact reference here (only "
              "non-finite counts).\n", str(t)]
    if res["profile"]:
        L += ["## Where the time goes: per-regime profile (float64, CPU)\n",
              f"ns per element (min over repeats) with ν uniform and z log-uniform inside each box, n = "
              f"{res['profile'][0]['n']:.0e} per box.\n",
              "Caveat: TFP evaluates its iterations with a batched `while_loop` that runs until the slowest element of "
              "the batch has converged, so it is relatively faster on these homogeneous boxes than on the mixed "
              "workload; ours and SciPy pay per element.\n"]
        by_fn = defaultdict(list)
        for p in res["profile"]:
            by_fn[p["function"]].append(p)
        for fn, recs in by_fn.items():
            impls = list(recs[0]["ns_per_elem"])
            t = H.Table("ν", "z", *[f"{k} ns/elem" for k in impls], *[f"{k} / ours" for k in impls[1:]])
            for p in recs:
                ns = p["ns_per_elem"]
                t.add(f"[{p['nu'][0]:g}, {p['nu'][1]:g}]", f"[{p['z'][0]:g}, {p['z'][1]:g}]",
                      *[f"{ns[k]:.1f}" for k in impls], *[H.fmt_ratio(ns[k] / ns[impls[0]]) for k in impls[1:]])
            L += [f"### `{fn}`\n", str(t)]
    if res.get("scaling"):
        t = H.Table("kernel", "n", "1 thread", "N threads", "N", "speed-up")
        for c in res["scaling"]:
            t.add(c["case"], H.fmt_n(c["n"]), H.fmt_time(c["t1"]), H.fmt_time(c["tN"]), c["threads"],
                  f"{c['speedup']:.2f}×")
        L += ["## Thread scaling of our kernels\n",
              f"float64, mixed workload; torch's parallel backend: {m.get('torch_parallel_backend', '?')}; the "
              f"extension's .so calls the OpenMP runtime: **{m.get('extension_calls_openmp', '?')}**. A speed-up near "
              "1 "
              "while `torch.exp` scales means `at::parallel_for` ran serially (its OpenMP implementation is inline in "
              "the headers, so an extension compiled without `-fopenmp` gets a serial loop).\n", str(t)]
    return "\n".join(L + ["![timings](special.png)\n"])


def plot(res, path):
    plt = H.pyplot()
    rows = [r for r in res["rows"] if r["device"] == "cpu"] or res["rows"]
    fns, wls = list(dict.fromkeys(r["function"] for r in rows)), list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(len(fns), len(wls), figsize=(5.5 * len(wls), 2.8 * len(fns)), squeeze=False)
    colors, palette = {}, plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, fn in enumerate(fns):
        for j, wl in enumerate(wls):
            ax, series = axes[i][j], defaultdict(list)
            for r in rows:
                if r["function"] == fn and r["workload"] == wl:
                    for k, t in r["impls"].items():
                        if t:
                            series[(k, r["dtype"])].append((r["n"], t["min"] / r["n"] * 1e9))
            for (k, dt), pts in series.items():
                pts.sort()
                ax.plot(*zip(*pts), marker="o", ms=3, color=colors.setdefault(k, palette[len(colors) % len(palette)]),
                        ls="-" if dt == "float64" else "--", label=f"{k} ({dt})")
            ax.set(xscale="log", yscale="log", xlabel="n (elements)", ylabel="ns / element")
            ax.set_title(f"{fn} — {wl}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(f"vmfdist.special vs peers (CPU, {res['meta']['threads']} threads; solid float64, dashed float32)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=80)
    plt.close(fig)
