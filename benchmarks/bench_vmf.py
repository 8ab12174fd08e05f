"""VonMisesFisher sampling throughput against peers, in one process (n samples of one vMF(mu, kappa) in R^d).

* vmfdist         ``VonMisesFisher(loc, kappa).sample((n,))``.
* TFP-JAX         ``tfp.distributions.VonMisesFisher(mu, kappa).sample(n, seed=fold_in(key, i))`` in ``jax.jit``
                  (compiled per n and dtype, compile excluded, ``block_until_ready``).
* SciPy           ``scipy.stats.vonmises_fisher(mu, kappa).rvs(n)`` (always float64; its QR and rotation use
                  BLAS threads); ``SciPy x2``: n split over the threads with independent generators.
* PowerSpherical  ``power_spherical.PowerSpherical(loc, kappa).rsample((n,))``: a different, rejection-free
                  distribution, the speed reference.
* s-vae (torch)   :class:`SVAEVonMisesFisher`, a pure-PyTorch re-implementation of the s-vae-pytorch sampler.
* randn floor     ``torch.randn((n, d))``: the cost of the randomness itself.

``rsample`` + backward (``(x * c).sum()``, loc and kappa requiring grad) for vmfdist, PowerSpherical and
s-vae.  Sample counts n_max / 10^k per case; a size is skipped when the previous one's time scaled to it
(SciPy's first: its per-call d x d QR) exceeds --max-call.  Every sweep runs --passes times; the
tables keep the best per point.  The warm-up samples are checked (norms, mean of mu^T x against
A_d(kappa) from tests/reference.py), and each sampler is also drawn once at mu = e1.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict

import numpy as np
import torch

from benchmarks import harness as H
from tests import reference as R
from vmfdist.distributions import VonMisesFisher

TITLE = "VonMisesFisher sampling vs TFP-JAX, SciPy, PowerSpherical, s-vae"
CASES = [(16, 100.0), (256, 1e3), (4096, 1e4), (3, 10.0), (64, 10.0), (1000, 50.0)]  # issue #3's three first
TARGET_CASES = [(16, 100.0), (256, 1e3), (4096, 1e4)]
NAMES = ["vmfdist", "TFP-JAX", "SciPy", "SciPy x2", "PowerSpherical", "s-vae (torch)", "randn floor"]
GRAD_IMPLS = ["vmfdist", "PowerSpherical", "s-vae (torch)"]
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def add_args(p):
    p.add_argument("--cases", nargs="*", default=None, help="d,kappa pairs (default: all of CASES)")
    p.add_argument("--dtypes", nargs="*", default=["float32", "float64"])
    p.add_argument("--impls", nargs="*", default=None, help="subset of implementations (default: all)")
    p.add_argument("--max-elems", type=float, default=None, help="largest n*d per call (default 2e7; --quick 2e5)")
    p.add_argument("--max-n", type=float, default=None, help="largest n (default 2e6; --quick 2e4)")
    p.add_argument("--rungs", type=int, default=None, help="n values per case, 10x apart (default 3; --quick 2)")
    p.add_argument("--max-call", type=float, default=3.0, help="skip an n whose projected call exceeds this (s)")
    p.add_argument("--passes", type=int, default=None,
                   help="sweeps; the tables keep the best per point (default 2; --quick 1)")
    p.add_argument("--no-grad", action="store_true", help="skip rsample + backward")
    p.add_argument("--no-e1", action="store_true", help="skip the mu = e1 check")


def make_loc(d: int, seed: int = 0) -> np.ndarray:
    """A fixed random unit vector (not e1: TFP's sampler is NaN at mu = e1)."""
    v = np.random.default_rng(seed + d).standard_normal(d)
    return v / np.linalg.norm(v)


def n_ladder(d, max_elems, max_n, rungs):
    """n_max / 10^k, n_max the largest {1,2,5}x10^e with n_max * d <= max_elems and n_max <= max_n."""
    cands = [m * 10**e for e in range(9) for m in (1, 2, 5)]
    n_max = max([c for c in cands if c * d <= max_elems and c <= max_n] or [1])
    return sorted({max(1, n_max // 10**k) for k in range(rungs)})


class SVAEVonMisesFisher:
    r"""Pure-PyTorch re-implementation (written from the algorithm) of the s-vae-pytorch sampler
    (Davidson et al. 2018), with its cost model and approximations: d = 3 by inverse CDF; otherwise Wood's
    rejection sampler in a Python ``while`` loop over rounds of ``k`` Beta proposals *per sample*, with ``b``
    blending the exact ``(sqrt(4k^2 + (d-1)^2) - 2k)/(d-1)`` into the Taylor ``(d-1)/(4k)`` for 10 < kappa < 11
    and the Taylor form above (wrong when d is not << kappa); the tangent from d normals with the first
    dropped; a Householder reflection with ``u = (e1 - mu)/(|e1 - mu| + 1e-5)``.  ``rsample`` differentiates
    through the accepted proposal (``e`` held constant), the biased gradient issue #3 describes."""

    def __init__(self, loc, scale, k: int = 20):
        self.loc, self.scale, self.k, self.d = loc, scale, k, loc.shape[-1]
        self.kw = {"dtype": loc.dtype, "device": loc.device}

    def _w(self, n, eps=1e-20):
        kappa, m1 = self.scale, self.d - 1
        if self.d == 3:
            u = torch.rand(n, 1, **self.kw)
            return 1 + torch.stack([torch.log(u), torch.log1p(-u) - 2 * kappa], 0).logsumexp(0) / kappa
        root = torch.sqrt(4 * kappa**2 + m1**2)
        s = (kappa - 10).clamp(0, 1)
        b = m1 / (4 * kappa) * s + (root - 2 * kappa) / m1 * (1 - s)
        a = (m1 + 2 * kappa + root) / 4
        c = 4 * a * b / (1 + b) - m1 * math.log(m1)
        half = torch.tensor(m1 / 2, dtype=torch.float64, device=self.loc.device)
        beta = torch.distributions.Beta(half, half)
        w = torch.zeros(n, 1, **self.kw)
        pending = torch.ones(n, dtype=torch.bool, device=self.loc.device)
        while bool(pending.any()):
            e = beta.sample((n, self.k)).to(self.loc.dtype)
            u = torch.empty(n, self.k, **self.kw).uniform_(eps, 1 - eps)
            denom = 1 - (1 - b) * e
            t = 2 * a * b / denom
            ok = (m1 * torch.log(t) - t + c) > torch.log(u)
            first = ok.to(torch.uint8).argmax(1, keepdim=True)  # the first accepted proposal
            w = torch.where((pending & ok.any(1)).unsqueeze(1), ((1 - (1 + b) * e) / denom).gather(1, first), w)
            pending = pending & ~ok.any(1)
        return w

    def rsample(self, sample_shape=torch.Size()):
        n = math.prod(sample_shape)
        w = self._w(n)
        v = torch.randn(n, self.d, **self.kw)[:, 1:]
        x = torch.cat((w, torch.sqrt(torch.clamp(1 - w**2, 1e-10)) * v / v.norm(dim=-1, keepdim=True)), -1)
        u = torch.zeros_like(self.loc)
        u[..., 0] = 1
        u = u - self.loc
        u = u / (u.norm(dim=-1, keepdim=True) + 1e-5)
        return (x - 2 * (x * u).sum(-1, keepdim=True) * u).reshape(tuple(sample_shape) + (self.d,))

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)


def _power_spherical():
    try:
        from power_spherical import PowerSpherical

        return PowerSpherical
    except ImportError:
        return None


def sampler(impl, d, kappa, dt, n, mu, threads):
    """A callable drawing n samples, or None when `impl` is unavailable."""
    tdt = DTYPES[dt]
    loc, k = torch.as_tensor(mu, dtype=tdt), torch.tensor(kappa, dtype=tdt)
    if impl == "vmfdist":
        dist = VonMisesFisher(loc, k)
        return lambda: dist.sample((n,))
    if impl == "randn floor":
        return lambda: torch.randn((n, d), dtype=tdt)
    if impl == "s-vae (torch)":
        svae = SVAEVonMisesFisher(loc, k)
        return lambda: svae.sample((n,))
    if impl == "PowerSpherical":
        cls = _power_spherical()
        if cls is None:
            return None
        ps = cls(loc, k)
        return torch.no_grad()(lambda: ps.rsample((n,)))
    if impl == "TFP-JAX":
        jax, tfp = H.jax_tfp()
        if jax is None:
            return None
        f = jax.jit(lambda m, k, key, i: tfp.distributions.VonMisesFisher(m, k).sample(
            n, seed=jax.random.fold_in(key, i)))
        m, kk, key = jax.numpy.asarray(mu, dtype=dt), jax.numpy.asarray(kappa, dtype=dt), jax.random.PRNGKey(0)
        f(m, kk, key, 0).block_until_ready()  # compile, untimed
        calls = iter(range(1, 1 << 62))
        return lambda: f(m, kk, key, next(calls)).block_until_ready()
    from scipy.stats import vonmises_fisher

    dist = vonmises_fisher(mu, kappa)
    if impl == "SciPy":
        rng = np.random.default_rng(1)
        return lambda: dist.rvs(n, random_state=rng)
    seeds = np.random.SeedSequence(1).spawn(threads)
    rng = {n * i // threads: np.random.default_rng(s) for i, s in enumerate(seeds)}  # chunk start -> generator
    return lambda: np.concatenate(H.split_threads(
        lambda lo, hi: np.atleast_2d(dist.rvs(hi - lo, random_state=rng[lo])), n, threads))


def grad_step(impl, d, kappa, dt, n, mu):
    """rsample((n,)) + backward of (x * c).sum() with loc and kappa requiring grad."""
    tdt = DTYPES[dt]
    loc = torch.as_tensor(mu, dtype=tdt).clone().requires_grad_(True)
    kap = torch.tensor(kappa, dtype=tdt, requires_grad=True)
    c = torch.as_tensor(np.random.default_rng(7).standard_normal(d), dtype=tdt)
    cls = {"vmfdist": VonMisesFisher, "s-vae (torch)": SVAEVonMisesFisher}.get(impl) or _power_spherical()
    if cls is None:
        return None

    def step():
        loc.grad = kap.grad = None
        (cls(loc, kap).rsample((n,)) * c).sum().backward()
    return step


_QR = {}  # d -> seconds


def scipy_qr_seconds(d, measure_max_d=1024):
    """Seconds of the d x d QR every ``vonmises_fisher.rvs`` call does: measured (best of 2) up to
    measure_max_d, extrapolated ~ d^3 above."""
    if d not in _QR:
        if d > measure_max_d:
            _QR[d] = scipy_qr_seconds(measure_max_d) * (d / measure_max_d) ** 3
        else:
            emb = np.concatenate([make_loc(d)[None, :], np.zeros((d - 1, d))]).T
            _QR[d] = H.time_fn(lambda: np.linalg.qr(emb), min_reps=2, max_reps=2, min_total=0)["min"]
    return _QR[d]


def check_samples(x, mu, d, kappa):
    """Non-finite rows, max | |x| - 1 |, mean of w = mu^T x and its z-score against A_d(kappa)."""
    x = (x.detach().double().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float64)).reshape(-1, d)
    finite = np.isfinite(x).all(axis=1)
    res = {"n": int(x.shape[0]), "nonfinite_rows": int((~finite).sum())}
    w = x[finite] @ mu
    if len(w) > 1:
        a, se = float(R.ratio(0.5 * d, kappa)), float(w.std(ddof=1) / math.sqrt(len(w)))
        res.update(max_norm_err=float(np.abs(np.linalg.norm(x[finite], axis=1) - 1).max()), mean_w=float(w.mean()),
                   A_d=a, se=se, z=float((w.mean() - a) / se) if se > 0 else math.nan)
    return res


# ------------------------------------------------------------------ run


def run(args):
    cases = sorted([(int(float(c.split(",")[0])), float(c.split(",")[1])) for c in args.cases] if args.cases else CASES)
    max_elems, max_n = args.max_elems or (2e5 if args.quick else 2e7), args.max_n or (2e4 if args.quick else 2e6)
    rungs, tkw = args.rungs or (2 if args.quick else 3), H.timing(args.quick)
    args.passes = args.passes or (1 if args.quick else 2)
    impls = {"sample": [i for i in NAMES if not args.impls or i in args.impls],
             "grad": [] if args.no_grad else [i for i in GRAD_IMPLS if not args.impls or i in args.impls]}
    meta = H.meta(args, ("scipy", "power_spherical", "jax"), XLA_FLAGS=os.environ.get("XLA_FLAGS"),
                  OPENBLAS_NUM_THREADS=os.environ.get("OPENBLAS_NUM_THREADS"), timing=tkw, max_call=args.max_call,
                  ladder={"max_elems": max_elems, "max_n": max_n, "rungs": rungs}, cases=[list(c) for c in cases],
                  target_cases=[list(c) for c in TARGET_CASES], dtypes=args.dtypes, passes=args.passes)
    res = {"meta": meta, "rows": [], "checks": [], "e1_checks": [], "notes": [], "monitor": []}
    rows = res["rows"]
    for pas in range(args.passes):
        scipy_rows = {}  # SciPy computes in float64 whatever the dtype: measured once per pass
        for dt in args.dtypes:
            for d, kappa in cases:
                ladder, mu = n_ladder(d, max_elems, max_n, rungs), make_loc(d)
                base = {"d": d, "kappa": kappa, "dtype": dt, "pass": pas}
                res["monitor"].append({**base, "load": os.getloadavg()[0], "canary_ms": H.canary() * 1e3})
                print(f"--- pass {pas} {dt} d={d}, κ={kappa:g}: n in {ladder}; load "
                      f"{res['monitor'][-1]['load']:.2f}", flush=True)
                for mode, names in impls.items():
                    for impl in names:
                        if impl in ("SciPy", "SciPy x2") and (impl, d, kappa) in scipy_rows:
                            rows += [{**r, "dtype": dt, "reused_from": r["dtype"]} for r in scipy_rows[impl, d, kappa]]
                            continue
                        mine, prev, kept = [], None, {}
                        for n in ladder:
                            row = {**base, "mode": mode, "impl": impl, "n": n}
                            proj = prev[1] * n / prev[0] if prev else (scipy_qr_seconds(d) if impl == "SciPy" else None)
                            if impl == "SciPy x2":  # at least half the single call, which repeats the QR
                                sp = [r for r in rows if r["impl"] == "SciPy" and r["mode"] == mode and r["pass"] == pas
                                      and (r["d"], r["kappa"], r["n"], r["dtype"]) == (d, kappa, n, dt)]
                                proj = sp[0]["projected_s"] if sp and sp[0].get("skipped") else \
                                    max(proj or 0.0, 0.5 * sp[0]["min"]) if sp and "min" in sp[0] else proj
                            if proj is not None and proj > args.max_call:
                                row.update(skipped=True, projected_s=proj, sps_bound=n / proj)
                                rows.append(row)
                                mine.append(row)
                                prev = (n, proj)
                                continue
                            try:
                                fn = (sampler(impl, d, kappa, dt, n, mu, args.threads) if mode == "sample"
                                      else grad_step(impl, d, kappa, dt, n, mu))
                                if fn is None:
                                    break
                                keep = mode == "sample" and impl != "randn floor" and pas == 0
                                t = H.time_fn(fn, max_call=args.max_call, **tkw,
                                              on_warmup=(lambda x: kept.update(x=x, n=n)) if keep else None)
                            except Exception as e:
                                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                                res["notes"].append(f"{impl} {mode} d={d}, κ={kappa:g} {dt} n={n}: failed: {msg}")
                                rows.append({**row, "failed": msg})
                                break
                            row.update(t, sps=n / t["min"])
                            rows.append(row)
                            mine.append(row)
                            prev = (n, t["min"])
                            print(f"  {mode:6s} {impl:15s} n={n:<8d} {H.fmt_time(t['min']):>10s} "
                                  f"{H.fmt_rate(row['sps'])}/s", flush=True)
                        if "x" in kept:
                            res["checks"].append({**base, "impl": impl, **check_samples(kept.pop("x"), mu, d, kappa)})
                        if mode == "sample" and impl in ("SciPy", "SciPy x2"):
                            scipy_rows[impl, d, kappa] = mine
                if not args.no_e1 and dt == args.dtypes[0] and pas == 0:
                    e1 = np.eye(d)[0]
                    for impl in impls["sample"]:
                        if impl in ("randn floor", "SciPy x2") or any(
                                r.get("skipped") and (r["impl"], r["d"], r["kappa"], r["mode"], r["n"]) ==
                                (impl, d, kappa, "sample", ladder[0]) for r in rows):
                            continue
                        n1 = 1000 if d <= 1000 else 100
                        try:
                            fn = sampler(impl, d, kappa, dt, n1, e1, args.threads)
                            c = fn and check_samples(fn(), e1, d, kappa)
                        except Exception as e:
                            c = {"n": n1, "failed": f"{type(e).__name__}: {str(e)[:200]}"}
                        if c:
                            res["e1_checks"].append({**base, "impl": impl, **c})
    meta["scipy_qr_s"] = {str(k): v for k, v in _QR.items()}
    return res


# ------------------------------------------------------------------ report


def best_of(res):
    """{(d, kappa, dtype, mode, impl): best samples/s over sizes and passes (usually the largest n), else
    the projected bound of a skipped size, else the failure}."""
    best = {}
    for r in res["rows"]:
        h = best.setdefault((r["d"], r["kappa"], r["dtype"], r["mode"], r["impl"]), {})
        if "sps" in r and r["sps"] > (h.get("sps") or 0):
            h.update(sps=r["sps"], n=r["n"], reps=r.get("reps"))
        elif r.get("skipped") and h.get("sps") is None and "proj" not in h:
            h.update(proj=r["projected_s"])
        elif r.get("failed"):
            h.setdefault("failed", r["failed"])
    return best


def _cell(h):
    if not h:
        return "—"
    if h.get("sps") is not None:
        return H.fmt_rate(h["sps"]) + (" ¹" if h.get("reps") == 0 else "")
    if "proj" in h:
        return f"skipped (≈ {h['proj']:.0g} s/call projected)"
    return "failed" if "failed" in h else "—"


def _ratio(a, b):
    return a / b if a and b else None


def _yes(ok):
    return "—" if ok is None else ("yes" if ok else "**no**")


def disturbed(res, factor=2.0):
    """{(dtype, d, kappa)} whose best canary over passes exceeds `factor` x the best of the run."""
    mon = res.get("monitor") or []
    best = {}
    for x in mon:
        k = (x["dtype"], x["d"], x["kappa"])
        best[k] = min(best.get(k, math.inf), x["canary_ms"])
    return {k for k, v in best.items() if v > factor * min(x["canary_ms"] for x in mon)}


def render(res):
    m, best, dist = res["meta"], best_of(res), disturbed(res)
    sps = lambda d, k, dt, impl, mode="sample": (best.get((d, k, dt, mode, impl)) or {}).get("sps")  # noqa: E731
    label = lambda d, k, dt: f"d={d}, κ={k:g}" + (" †" if (dt, d, k) in dist else "")  # noqa: E731
    cases = [tuple(c) for c in m["cases"]]
    tm, lad = m["timing"], m["ladder"]
    L = H.header(res, "Benchmarks: `VonMisesFisher` sampling vs peers", "python -m benchmarks.run vmf", "vmf")
    L += [f"- Threads: `torch.set_num_threads({m['threads']})` (vmfdist, PowerSpherical, s-vae, randn); JAX with "
          f"`XLA_FLAGS=\"{m['XLA_FLAGS']}\"` on a {m['nproc']}-core machine; SciPy: one call (its QR and rotation use "
          f"OpenBLAS with `OPENBLAS_NUM_THREADS={m['OPENBLAS_NUM_THREADS']}`) and \"SciPy x2\" = n split over "
          f"{m['threads']} Python threads with independent generators.",
          f"- Throughput = n / (minimum time of one call) over repeats (≥ {tm['min_reps']} and ≥ {tm['min_total']} s, "
          f"≤ {tm['max_reps']}; 3 when a call takes > 0.5 s) after a warm-up call; medians in the JSON. TFP is "
          "`jax.jit`-compiled per n and dtype (compile excluded), `block_until_ready()`. Each implementation runs n = "
          f"n_max/10^k (k = {lad['rungs'] - 1}..0; n_max·d ≤ {lad['max_elems']:.0e}, n_max ≤ {lad['max_n']:.0e}); a "
          "size is skipped when the previous size's time scaled to it (SciPy's first size: the time of its per-call "
          f"d×d QR) exceeds {m['max_call']:g} s. The whole sweep runs {m.get('passes', 1)} time(s); tables show the "
          "**best samples/s over the sizes and passes** (normally the largest n).",
          "- μ is a fixed random unit vector (not e₁), κ a scalar. SciPy computes in float64 only: its float32 columns "
          "repeat the float64 measurement. PowerSpherical is a different (rejection-free) distribution with the same κ "
          "as its scale, the speed reference. s-vae (torch) is our pure-PyTorch re-implementation of the s-vae-pytorch "
          "sampler (Python `while` loop over rejection rounds of 20 proposals per sample, its Taylor approximation of "
          "Wood's b for κ > 10).",
          "- Ratios are our samples/s ÷ theirs (> 1: we are faster); \"ours / floor\" = our samples/s ÷ those of "
          "`torch.randn((n, d))` (1 = as fast as generating the normals alone). ¹ = one call took longer than the cap: "
          "best of the warm-up call and one more call. † = the noise canary (see the end) stayed above twice its best "
          "value in every pass of that dtype and case: other processes competed for the cores, treat those numbers "
          "with care.\n"]
    for dt in [x for x in ("float32", "float64") if x in m["dtypes"]]:
        t = H.Table("case", "ours", "faster of TFP / SciPy", "PowerSpherical", "randn floor",
                    "ours / faster(TFP, SciPy)", "≥ 3×", "ours / PowerSpherical", "≥ 1×", "ours / floor",
                    "≥ 0.5 (d ≥ 256)")
        for d, k in cases:
            o = sps(d, k, dt, "vmfdist")
            if o is None:
                continue
            fast = max([x for x in (sps(d, k, dt, i) for i in ("TFP-JAX", "SciPy", "SciPy x2")) if x] or [None],
                       key=lambda x: x or 0)
            ps, fl = sps(d, k, dt, "PowerSpherical"), sps(d, k, dt, "randn floor")
            r1, r2, r3 = _ratio(o, fast), _ratio(o, ps), _ratio(o, fl)
            name = f"**d={d}, κ={k:g}**" if [d, k] in m["target_cases"] else f"d={d}, κ={k:g}"
            t.add(name + (" †" if (dt, d, k) in dist else ""), H.fmt_rate(o), H.fmt_rate(fast), H.fmt_rate(ps),
                  H.fmt_rate(fl), H.fmt_ratio(r1), _yes(r1 and r1 >= 3), H.fmt_ratio(r2), _yes(r2 and r2 >= 1),
                  H.fmt_ratio(r3), _yes(r3 and r3 >= 0.5) if d >= 256 else "n/a")
        if t.rows:
            L += ["## Targets (issue #3; float32, samples/s)\n",
                  "Targets: ours ≥ 3× the faster of TFP and SciPy (either variant), ≥ 1× PowerSpherical, and for "
                  "d ≥ 256 within 2× of the randn floor (ours / floor ≥ 0.5). The issue's three cases are in bold; the "
                  "others are extra.\n"] if dt == "float32" else \
                ["## Same ratios in float64 (no targets)\n"]
            L.append(str(t))
    impls = [i for i in NAMES if any(r["impl"] == i and r["mode"] == "sample" for r in res["rows"])]
    for dt in m["dtypes"]:
        t, q = H.Table("case", "n", *impls), H.Table("case", *[f"ours / {p}" for p in impls[1:]])
        for d, k in cases:
            o = best.get((d, k, dt, "sample", "vmfdist")) or {}
            t.add(label(d, k, dt), H.fmt_n(o["n"]) if o.get("n") else "—",
                  *[_cell(best.get((d, k, dt, "sample", i))) for i in impls])
            q.add(label(d, k, dt), *[H.fmt_ratio(_ratio(o.get("sps"), sps(d, k, dt, p))) for p in impls[1:]])
        L += [f"## `sample` throughput, {dt} (samples/s; n at our best)\n", str(t), f"Ours ÷ each ({dt}):\n", str(q)]
    gi = [i for i in NAMES if any(r["impl"] == i and r["mode"] == "grad" for r in res["rows"])]
    if gi:
        t = H.Table("case", "dtype", *gi, *[f"ours / {p}" for p in gi[1:]], "ours sample ÷ ours rsample+backward")
        for dt in m["dtypes"]:
            for d, k in cases:
                o = sps(d, k, dt, "vmfdist", "grad")
                t.add(label(d, k, dt), dt, *[_cell(best.get((d, k, dt, "grad", i))) for i in gi],
                      *[H.fmt_ratio(_ratio(o, sps(d, k, dt, p, "grad"))) for p in gi[1:]],
                      H.fmt_ratio(_ratio(sps(d, k, dt, "vmfdist"), o)))
        L += ["## `rsample` + backward (samples/s)\n", "`x = Dist(loc, κ).rsample((n,)); (x * c).sum().backward()` "
              "with `loc` and `κ` requiring grad (c a fixed random vector). TFP (not reparameterised for d ≠ 3) and "
              "SciPy "
              "(no gradients) are absent. The last column is the cost of the gradient path relative to our `sample`.\n",
              str(t)]
    if res.get("checks"):
        t = H.Table("case", "dtype", "implementation", "n", "non-finite rows", "max ‖x‖−1", "mean μᵀx", "A_d(κ)", "z")
        for c in res["checks"]:
            z = c.get("z")
            zs = "—" if z is None or not math.isfinite(z) else (f"**{z:.1f}**" if abs(z) > 5 and c["impl"] !=
                                                                "PowerSpherical" else f"{z:.1f}")
            t.add(f"d={c['d']}, κ={c['kappa']:g}", c["dtype"], c["impl"], H.fmt_n(c["n"]), c["nonfinite_rows"],
                  *[f"{c.get(k, math.nan):{f}}" for k, f in (("max_norm_err", ".1e"), ("mean_w", ".5f"),
                                                              ("A_d", ".5f"))],
                  zs)
        L += ["## Sanity checks of the timed samples\n", "On the warm-up output at the largest n each implementation "
              "ran: rows with a non-finite entry, max | ‖x‖ − 1 |, and the mean of w = μᵀx against E[w] = A_d(κ) of "
              "the vMF (z = (mean − A_d) / standard error). PowerSpherical is a different distribution (its E[w] "
              "differs by design). A large |z| for a vMF sampler means wrong samples.\n", str(t)]
    if res.get("e1_checks"):
        t = H.Table("case", "implementation", "n", "non-finite rows", "z")
        for c in res["e1_checks"]:
            z, nf = c.get("z"), c.get("nonfinite_rows")
            t.add(f"d={c['d']}, κ={c['kappa']:g}", c["impl"], c["n"], f"failed: {c['failed']}" if "failed" in c else
                  f"**{nf}**" if nf else 0, "—" if z is None or not math.isfinite(z) else f"{z:.1f}")
        L += ["## μ = e₁\n", "One draw per implementation with μ = e₁ (float32 / first dtype; n = 1000, 100 at d = "
              "4096): rows with a non-finite entry, and z of the mean of w as above.\n", str(t)]
    key = lambda r: (r["impl"], r["mode"], r["d"], r["kappa"], r["dtype"], r["n"])  # noqa: E731
    measured, skipped = {key(r) for r in res["rows"] if "sps" in r}, {}
    for r in res["rows"]:
        if r.get("skipped") and not r.get("reused_from") and key(r) not in measured:
            skipped.setdefault(key(r), r)
    if skipped or res.get("notes"):
        qr = ", ".join(f"d={k}: {v:.2g} s" for k, v in sorted(m.get("scipy_qr_s", {}).items(),
                                                                key=lambda kv: int(kv[0])))
        L += ["## Skipped sizes and failures\n", "Sizes not measured in any pass. SciPy's first size in a case is "
              "projected by the time of the d×d QR that every `rvs` call does (measured for d ≤ 1024, extrapolated ∝ "
              "d³ "
              f"above: {qr}).\n"]
        L += [f"- {r['impl']} ({r['mode']}) d={r['d']}, κ={r['kappa']:g}, {r['dtype']}, n={H.fmt_n(r['n'])}: skipped, "
              f"projected {r['projected_s']:.1f} s per call (> {m['max_call']:g} s)." for r in skipped.values()]
        L += [f"- {s}" for s in res.get("notes", [])] + [""]
    if res.get("monitor"):
        t = H.Table("pass", "dtype", "case", "load (1 min)", "canary")
        for x in res["monitor"]:
            t.add(x["pass"], x["dtype"], f"d={x['d']}, κ={x['kappa']:g}", f"{x['load']:.2f}",
                  f"{x['canary_ms']:.2f} ms")
        L += ["## Noise monitor\n", "At the start of each case: the 1-minute load average (this benchmark itself adds "
              "about 2) and a canary, the best of 3 × (100 × `torch.exp` on 1e5 float32 on the same threads); a canary "
              "far "
              "above its minimum means other processes were competing for the cores. Every point is measured in each "
              "of "
              f"the {m.get('passes', 1)} passes and the tables keep the best.\n", str(t)]
    return "\n".join(L + ["![throughput](vmf.png)\n"])


def plot(res, path):
    plt = H.pyplot()
    m, cases = res["meta"], [tuple(c) for c in res["meta"]["cases"]]
    dt = "float32" if "float32" in m["dtypes"] else m["dtypes"][0]
    nrow = max(1, math.ceil(len(cases) / 3))
    fig, axes = plt.subplots(nrow, 3, figsize=(13.8, 3.2 * nrow), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles = {}
    for idx, (d, kappa) in enumerate(cases):
        ax, series = axes[idx // 3][idx % 3], defaultdict(dict)
        for r in res["rows"]:
            if (r["d"], r["kappa"], r["dtype"]) == (d, kappa, dt) and "sps" in r:
                s = series[(r["impl"], r["mode"])]
                s[r["n"]] = max(r["sps"], s.get(r["n"], 0.0))  # best over passes
        for (impl, mode), pts in sorted(series.items(), key=lambda kv: (kv[0][1] != "sample", NAMES.index(kv[0][0]))):
            ax.plot(*zip(*sorted(pts.items())), marker="o", ms=3, color=palette[NAMES.index(impl) % len(palette)],
                    ls="-" if mode == "sample" else "--", label=impl + ("" if mode == "sample" else " (rsample+bwd)"))
        ax.set(xscale="log", yscale="log", xlabel="n (samples per call)", ylabel="samples / s")
        ax.set_title(f"d={d}, κ={kappa:g}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        handles.update({lab: h for h, lab in zip(*ax.get_legend_handles_labels())})
    for idx in range(len(cases), nrow * 3):
        axes[idx // 3][idx % 3].axis("off")
    fig.suptitle(f"vMF sampling throughput ({dt}, CPU, {m['threads']} threads; solid: sample, dashed: rsample + "
                 "backward)", fontsize=10)
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=5, fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    fig.savefig(path, dpi=80)
    plt.close(fig)
