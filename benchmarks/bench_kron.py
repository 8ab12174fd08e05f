"""The Kronecker-eigenbasis op against the bare matrix products, eager PyTorch and laplace-torch.

Job: Y = Q_out ((Q_out^T V Q_in) * S^p) Q_in^T for V of shape (rhs, out, in), orthogonal Q_out, Q_in
and S = l_out l_in^T + delta > 0 (a damped K-FAC factor pair's eigenvalues), p = 1 and p = -1.
Implementations, in interleaved rounds: the four bare products alone (the floor: target ours
within 1.3x); ours (kron_eigen_matvec: one op, S^p fused into one pass); the same formula in eager
PyTorch; laplace-torch's KronDecomposed.bmm(W, exponent=p) on the same factors (omitted with a note
when laplace-torch cannot be imported: benchmarks/requirements-kron.txt).  Sampling: kron_eigen_sample
(rhs draws, Philox noise inside) against loc + Q_out (randn * var^(1/2)) Q_in^T.
"""
from __future__ import annotations

import re
import warnings

import torch

from benchmarks import harness as H
from vmfdist.linalg import kron_eigen_matvec, kron_eigen_sample

TITLE = "Kronecker-eigenbasis matvec and sampling vs bare matmuls and laplace-torch"


def add_args(p):
    p.add_argument("--size", type=int, default=None, help="out = in (default 1024; --quick 256)")
    p.add_argument("--rhs", type=int, default=8, help="right-hand sides / samples (default 8)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7; --quick 5)")
    p.add_argument("--device", default="cpu")


def run(args):
    n, r = args.size or (256 if args.quick else 1024), args.rhs
    rounds = args.repeats or (5 if args.quick else 7)
    dev, dt = torch.device(args.device), getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)

    def factor(m):
        a = torch.randn(m, 2 * m, generator=g, dtype=torch.float64)
        lam, q = torch.linalg.eigh(a @ a.T / (2 * m))
        return lam.clamp_min(0).to(dev, dt), q.to(dev, dt)

    (l_out, q_out), (l_in, q_in), delta = factor(n), factor(n), 1e-2
    scale = (torch.outer(l_out, l_in) + delta).contiguous()
    v, loc = (torch.randn(s, generator=g, dtype=torch.float64).to(dev, dt) for s in ((r, n, n), (n, n)))
    fns = {}  # "impl|group" -> callable
    for p in (1.0, -1.0):
        grp = f"matvec p={p:+g}"
        fns[f"bare matmuls|{grp}"] = lambda: q_out @ ((q_out.mT @ v) @ q_in) @ q_in.mT
        fns[f"ours|{grp}"] = lambda p=p: kron_eigen_matvec(q_out, q_in, scale, v, p)
        fns[f"torch composite|{grp}"] = lambda p=p: q_out @ (((q_out.mT @ v) @ q_in) * scale.pow(p)) @ q_in.mT
    note = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from laplace.utils.matrix import KronDecomposed
        w = v.reshape(r, 1, n * n)
        kd = KronDecomposed([[q_out, q_in]], [[l_out, l_in]], deltas=torch.tensor([delta], dtype=dt, device=dev))
        for p in (1.0, -1.0):
            fns[f"laplace-torch KronDecomposed.bmm|matvec p={p:+g}"] = lambda p=p: kd.bmm(w, exponent=p)
    except Exception as e:  # depends on the environment
        note = f"laplace-torch not importable here: {type(e).__name__}: {e}"
        print(note, flush=True)
    var = scale.reciprocal()  # posterior variances of a noisy EK-FAC layer, ~ 1 / (eigenvalues + delta)
    grp = f"sample x{r}"
    fns[f"ours|{grp}"] = lambda: kron_eigen_sample(loc, q_out, q_in, var, (r,))
    fns[f"torch composite (randn)|{grp}"] = lambda: loc + q_out @ (torch.randn(r, n, n, dtype=dt, device=dev)
                                                                  * var.sqrt()) @ q_in.mT
    fns[f"bare matmuls|{grp}"] = lambda: q_out @ v @ q_in.mT

    checks = {}  # agreement with a float64 evaluation (dense reference)
    with torch.no_grad():
        for p in (1.0, -1.0):
            qo, qi = q_out.double(), q_in.double()
            ref = qo @ ((qo.mT @ v.double() @ qi) * scale.double().pow(p)) @ qi.mT
            for k in (f"ours|matvec p={p:+g}", f"laplace-torch KronDecomposed.bmm|matvec p={p:+g}"):
                if k in fns:
                    checks[k] = ((fns[k]().reshape(ref.shape).double() - ref).abs().max() / ref.abs().max()).item()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    meta = H.meta(args, ("laplace-torch",), size=n, rhs=r, dtype=args.dtype, device=str(dev), repeats=rounds,
                  delta=delta, laplace_note=note, gflop_per_call=8 * n**3 * r / 1e9, checks=checks,
                  blas=blas.group(1) if blas else "unknown")
    with torch.no_grad():
        times = H.time_rounds(fns, rounds, H.sync_fn(dev))
    rows = []
    for k, t in times.items():
        impl, grp = k.split("|")
        rows.append({"group": grp, "impl": impl, **t})
    order = list(dict.fromkeys(x["group"] for x in rows))
    rows.sort(key=lambda x: order.index(x["group"]))
    for row in rows:
        base = next(x for x in rows if x["group"] == row["group"] and x["impl"] == "bare matmuls")
        row["vs_bare_min"], row["vs_bare_median"] = row["min"] / base["min"], row["median"] / base["median"]
    return {"meta": meta, "rows": rows}


def render(res):
    m, rows = res["meta"], res["rows"]
    n, r = m["size"], m["rhs"]
    L = H.header(res, "Benchmarks: the Kronecker-eigenbasis op", "python -m benchmarks.run kron", "kron")
    L += [f"- Job: $Y = Q_{{out}}((Q_{{out}}^T V Q_{{in}}) \\odot S^p)Q_{{in}}^T$ with out = in = {n}, V of shape "
          f"({r}, {n}, {n}) ({r} right-hand sides), {m['dtype']}, {m['device']}, {m['threads']} threads "
          f"(`torch.set_num_threads`); $S = l_{{out}}l_{{in}}^T + \\delta$, $\\delta$ = {m['delta']}. The four "
          "products "
          f"are {m['gflop_per_call']:.1f} GFLOP per call. BLAS: {m['blas']}.",
          f"- {m['repeats']} interleaved rounds after one warm-up call each (every round times every implementation "
          "once, so load changes hit all of them); min and median per implementation. Ratio = time / time of the "
          "bare matmuls of the same row group (< 1.3 is the target for ours); compare the ratios, which are taken "
          "within one run on a shared machine."] + ([f"- {m['laplace_note']}"] if m.get("laplace_note") else [])
    t = H.Table("job", "implementation", "min", "median", "× bare (min)", "× bare (median)")
    for row in rows:
        b = "**" if row["impl"] == "ours" else ""
        t.add(row["group"], f"{b}{row['impl']}{b}", H.fmt_time(row["min"]), H.fmt_time(row["median"]),
              f"{row['vs_bare_min']:.2f}", f"{row['vs_bare_median']:.2f}")
    L += ["", str(t), "Agreement with a float64 evaluation of the same formula (max abs error / max abs value):\n"]
    L += [f"- {k.replace('|', ', ')}: {x:.1e}" for k, x in m["checks"].items()]
    L += ["", "For the sampling rows, *bare matmuls* is the two products $Q_{out} V Q_{in}^T$ alone; the composite "
          "draws its noise with `torch.randn` (ours draws it from the project's Philox streams, fused with the "
          "multiplication by $\\mathrm{var}^{1/2}$).\n"]
    verdict = [f"{x['group']}: {x['vs_bare_min']:.2f}× the bare matmuls (min), {x['vs_bare_median']:.2f}× (median) — "
               f"target ≤ 1.3×: {'met' if x['vs_bare_min'] <= 1.3 else 'not met'}"
               for x in rows if x["impl"] == "ours" and x["group"].startswith("matvec")]
    return "\n".join(L + ["Target (issue #4): " + "; ".join(verdict) + ".\n"])
