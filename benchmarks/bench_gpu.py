"""Everything on one device (the GPU by default): the GPU check's benchmark (scripts/gpu_check.sh).

    python -m benchmarks.run gpu                          # on the GPU, full sizes (~2 min on an H100)
    python -m benchmarks.run gpu --device cpu --quick     # the rehearsal of its code paths on a CPU

Jobs, all on ``--device``, float32 unless said, every implementation of a job in interleaved
rounds (harness.time_rounds), min over rounds:
  bandwidth  a device-to-device copy of N floats: the measured peak (bytes read + written per
             second); the nominal HBM peak where the device is known (H100 SXM 3.35 TB/s, H200 4.8 TB/s)
  fused      bessel_iv_ratio, log_bessel_iv (float32 and float64; nu = 128, z ~ U[1, 1000], the vMF
             workload), radial_noise (4 samples) and meanfield_sample (1 sample) at N elements
             (1e8 on the GPU): bytes each must move / time, as a fraction of the copy's bandwidth and
             of the nominal peak, against TFP-JAX on the same device (the Bessel functions) and the
             pure-PyTorch composite (the noises)
  vmf        vMF samples (d = 3, 16, 256, 1024; about N floats of output) against TFP-JAX's
             VonMisesFisher, power_spherical's PowerSpherical and torch.randn of the output's size
  kron       kron_eigen_matvec against its matmul floor (the four products alone), 1024 x 1024
  layers     a training step (forward + KL + backward) of each Bayesian layer against nn.Linear /
             nn.Conv2d and bayesian-torch (the jobs of bench_layers)
  optim      a NoisyKFAC / NoisyEKFAC step against an Adam step on LeNet-5 (batch 128)
  lenet      one MNIST-sized epoch (60000 28x28 images, batch 128, 32 with --quick; random data -- the timing
             does not depend on the pixels, and the GPU machine carries no data) of LeNet-5-Caffe
             for each Bayesian kind, noisy K-FAC / EK-FAC and the deterministic network with Adam
``--quick`` shrinks N and the epoch to a few steps (the epoch time is then extrapolated).
"""
from __future__ import annotations

import json
import math
import os
import time

import torch
from torch import nn

from benchmarks import harness as H

TITLE = "vmfdist on one device (the GPU check): fused ops, vMF, Kronecker, layers, optimizers, LeNet-5 epochs"
IN_ALL = False  # run by scripts/gpu_check.sh, not by `all` (it is for a GPU)
NOMINAL_TBPS = {"H100": 3.35, "H200": 4.8, "A100": 2.0}
VMF_DIMS = (3, 16, 256, 1024)
MNIST = 60000


def add_args(p):
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--n", type=float, default=None, help="elements of the fused-op jobs (default 1e8 GPU, 1e6 CPU)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds per job (default 10, quick 3)")
    p.add_argument("--jobs", nargs="*", default=None,
                   help="subset of: bandwidth fused vmf ps kron layers optim lenet (default all)")
    p.add_argument("--lenet-steps", type=int, default=None,
                   help="training steps timed per LeNet-5 run (default: a whole epoch, 469; quick 4)")
    p.add_argument("--max-call", type=float, default=1.0,
                   help="a peer whose warm-up call takes longer (s) is timed once, outside the rounds")


def _nominal(dev) -> float | None:
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    return next((v * 1e12 for k, v in NOMINAL_TBPS.items() if k in name), None)


MAX_CALL = [1.0]  # --max-call


def _rounds(fns, rounds, sync):
    """Interleaved rounds; an implementation whose first (warm-up) call takes over --max-call
    seconds is timed by one more call alone instead (a slow peer must not eat the lease)."""
    slow = {}
    for k, f in list(fns.items()):
        if k == "vmfdist":
            continue
        t0 = time.perf_counter()
        f()
        sync()
        if time.perf_counter() - t0 > MAX_CALL[0]:
            t0 = time.perf_counter()
            f()
            sync()
            dt = time.perf_counter() - t0
            slow[k] = {"min": dt, "median": dt, "single_call": True}
            del fns[k]
    r = H.time_rounds(fns, rounds, sync=sync, verbose=False)
    return {**{k: {"min": v["min"], "median": v["median"]} for k, v in r.items()}, **slow}


# ------------------------------------------------------------------------------------ jobs


def _bandwidth(dev, n, rounds, sync):
    x, y = torch.rand(n, device=dev), torch.empty(n, device=dev)
    r = _rounds({"copy": lambda: y.copy_(x)}, rounds, sync)["copy"]
    return {"n": n, **r, "Bps": 2 * 4 * n / r["min"]}


def _fused(dev, n, rounds, sync):
    from benchmarks.bench_special import tfp_impl
    from vmfdist import special
    from vmfdist._ops import lib

    rows = []
    g = torch.Generator().manual_seed(0)
    for fname, tfp_expr in (("bessel_iv_ratio", "ratio"), ("log_bessel_iv", "log_iv")):
        for dt in (torch.float32, torch.float64):
            nu = torch.full((n,), 128.0, dtype=dt, device=dev)
            z = (1 + 999 * torch.rand(n, generator=g, dtype=torch.float64)).to(dev, dt)
            fns = {"vmfdist": (lambda f=getattr(special, fname), a=nu, b=z: f(a, b))}
            make = tfp_impl(tfp_expr)  # compiles for this shape and dtype, on the device JAX uses
            if make is not None:
                fns["TFP-JAX"] = make(nu.cpu().numpy(), z.cpu().numpy(), dt)
            r = _rounds(fns, rounds, sync)
            rows.append({"job": f"{fname} {str(dt)[6:]}", "bytes": 3 * n * nu.element_size(), "impls": r,
                         "peer": "TFP-JAX" if "TFP-JAX" in r else None})
            del nu, z, fns  # free the device memory before the next dtype
    S = 4
    loc, scale = torch.randn(n // S, device=dev), torch.rand(n // S, device=dev) * 0.1

    def radial_composite():
        eps = torch.randn((S, n // S), device=dev)
        return loc + scale * (eps / eps.norm(dim=1, keepdim=True) * torch.randn(S, 1, device=dev))

    r = _rounds({"vmfdist": lambda: lib.radial_noise(loc, scale, S), "composite": radial_composite}, rounds, sync)
    # writes the output, reads and rewrites it (normalisation), reads loc and scale
    rows.append({"job": f"radial_noise x{S}", "bytes": 3 * 4 * n + 2 * 4 * (n // S), "impls": r, "peer": "composite"})
    rho = torch.randn(n, device=dev) - 3
    loc2 = torch.randn(n, device=dev)
    r = _rounds({"vmfdist": lambda: lib.meanfield_sample(loc2, rho, None, None, 1),
                 "composite": lambda: loc2 + nn.functional.softplus(rho) * torch.randn(n, device=dev)}, rounds, sync)
    rows.append({"job": "meanfield_sample x1", "bytes": 3 * 4 * n, "impls": r, "peer": "composite"})
    return rows


def _sphere_peers():
    """The peers of the samplers' jobs: (jax, tfp) (None where not installed) and the power_spherical
    package's class (or None)."""
    jax, tfp = H.jax_tfp()
    try:
        from power_spherical import PowerSpherical
    except Exception:
        PowerSpherical = None
    return jax, tfp, PowerSpherical


def _tfp_sampler(jax, dist, s):
    """A warmed-up jitted TFP-JAX draw of s samples from dist, as a timed callable."""
    f = jax.jit(lambda key: dist.sample(s, seed=key))
    key = jax.random.PRNGKey(0)
    f(key).block_until_ready()
    return lambda: f(key).block_until_ready()


def _batch(dev, b, d):
    return nn.functional.normalize(torch.randn(b, d, device=dev), dim=-1), torch.full((b,), 10.0 * d, device=dev)


def _vmf(dev, n, rounds, sync):
    from vmfdist._ops import lib

    rows = []
    jax, tfp, PowerSpherical = _sphere_peers()
    for d in VMF_DIMS:
        b = 64
        s = max(1, n // (b * d))
        loc, kap = _batch(dev, b, d)
        fns = {"vmfdist": lambda: lib.vmf_sample(loc, kap, s),
               "torch.randn (floor)": lambda: torch.randn(s, b, d, device=dev)}
        if PowerSpherical is not None:
            ps = PowerSpherical(loc, kap)
            fns["power_spherical"] = lambda: ps.rsample((s,))
        if jax is not None:
            fns["TFP-JAX"] = _tfp_sampler(jax, tfp.distributions.VonMisesFisher(
                jax.device_put(loc.cpu().numpy()), jax.device_put(kap.cpu().numpy())), s)
        r = _rounds(fns, rounds, sync)
        rows.append({"d": d, "batch": b, "samples": s, "bytes": 4 * s * b * (d + 1), "impls": r})
    return rows


def _ps(dev, n, rounds, sync):
    """PowerSpherical: sample, and rsample + backward (loc and scale), ours against the power_spherical
    package and TFP-JAX (sample only)."""
    from vmfdist.distributions import PowerSpherical as Ours

    rows = []
    jax, tfp, Theirs = _sphere_peers()
    for d in VMF_DIMS:
        b = 64
        s = max(1, n // (4 * b * d))  # a quarter of the vMF job's size: the backward keeps the samples
        loc, kap = _batch(dev, b, d)
        lg, kg = loc.clone().requires_grad_(), kap.clone().requires_grad_()
        for mode in ("sample", "rsample + backward"):
            if mode == "sample":
                fns = {"vmfdist": lambda: Ours(loc, kap).sample((s,))}
                if Theirs is not None:
                    fns["power_spherical"] = lambda: Theirs(loc, kap).rsample((s,))
                if jax is not None and hasattr(tfp.distributions, "PowerSpherical"):
                    fns["TFP-JAX"] = _tfp_sampler(jax, tfp.distributions.PowerSpherical(
                        jax.device_put(loc.cpu().numpy()), jax.device_put(kap.cpu().numpy())), s)
            else:
                fns = {"vmfdist": lambda: Ours(lg, kg).rsample((s,)).sum().backward()}
                if Theirs is not None:
                    fns["power_spherical"] = lambda: Theirs(lg, kg).rsample((s,)).sum().backward()
            r = _rounds(fns, rounds, sync)
            rows.append({"d": d, "batch": b, "samples": s, "mode": mode, "impls": r})
    return rows


def _kron(dev, quick, rounds, sync):
    from vmfdist._ops import lib

    k = 256 if quick else 1024
    g = torch.Generator().manual_seed(1)
    qo, qi = (torch.linalg.qr(torch.randn(k, k, generator=g))[0].to(dev) for _ in range(2))
    s, v = torch.rand(k, k, generator=g).to(dev) + 0.1, torch.randn(k, k, generator=g).to(dev)
    return {"k": k, "impls": _rounds({"vmfdist": lambda: lib.kron_eigen_matvec(qo, qi, s, v),
                                      "matmul floor": lambda: qo @ ((qo.T @ v) @ qi) @ qi.T}, rounds, sync)}


def _layers(dev, rounds, sync):
    import vmfdist.nn as vnn
    from benchmarks.bench_layers import _layers as layer_set, _step_fn

    try:
        import bayesian_torch.layers as bt
    except Exception:
        bt = None
    out = {}
    torch.manual_seed(0)
    for job, x in {"linear": torch.randn(128, 512), "conv": torch.randn(32, 32, 16, 16)}.items():
        fns = {name: _step_fn(m.to(dev), x.to(dev), ours) for name, (m, ours) in layer_set(job, torch, vnn, bt).items()}
        out[job] = _rounds(fns, rounds, sync)
    return out


def lenet5(bayes_kind=None, dev="cpu"):
    """LeNet-5-Caffe: conv 20 5x5, pool, conv 50 5x5, pool, fc 800 -> 500, fc 500 -> 10."""
    from vmfdist.nn import to_bayesian

    net = nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))
    if bayes_kind is not None:
        kind, opts = bayes_kind
        net = to_bayesian(net, kind, **opts)
    return net.to(dev)


KINDS = {"meanfield reparam": ("meanfield", {}), "meanfield local": ("meanfield", {"estimator": "local"}),
         "meanfield flipout": ("meanfield", {"estimator": "flipout"}), "radial": ("radial", {}),
         "rdp row": ("rdp", {}), "rdp double": ("rdp", {"grouping": "double"})}


def _trainers(dev, names=None):
    """{name: step(x, y)} for the deterministic network, every Bayesian kind and the noisy
    optimizers (or only those in ``names``)."""
    from vmfdist.nn import ELBO
    from vmfdist.optim import NoisyEKFAC, NoisyKFAC

    torch.manual_seed(0)
    steps = {}
    net = lenet5(None, dev)
    adam = torch.optim.Adam(net.parameters(), lr=1e-3)

    def det(x, y, net=net, opt=adam):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    steps["deterministic (Adam)"] = det
    for name, kind in KINDS.items():
        if names is not None and name not in names:
            continue
        m = lenet5(kind, dev)
        # check_finite=False: the NaN check synchronises with the host each step (docs/nn.md)
        elbo, opt = ELBO(m, num_data=MNIST, check_finite=False), torch.optim.Adam(m.parameters(), lr=1e-3)

        def bstep(x, y, m=m, elbo=elbo, opt=opt):
            opt.zero_grad(set_to_none=True)
            elbo(m(x), y).backward()
            opt.step()
        steps[name] = bstep
    for name, cls in (("noisy K-FAC", NoisyKFAC), ("noisy EK-FAC", NoisyEKFAC)):
        if names is not None and name not in names:
            continue
        opt = cls(lenet5(None, dev), MNIST, "classification", seed=0)
        steps[name] = lambda x, y, opt=opt: opt.step(x, y)
    return steps


def _optim(dev, rounds, sync):
    batch = 128
    x, y = torch.randn(batch, 1, 28, 28, device=dev), torch.randint(0, 10, (batch,), device=dev)
    st = _trainers(dev, ("noisy K-FAC", "noisy EK-FAC"))
    return _rounds({k: (lambda f=f: f(x, y)) for k, f in st.items()}, rounds, sync)


def _lenet(dev, quick, sync, steps=None):
    batch = 32 if quick else 128  # quick: a check of the code path, not a timing
    total = math.ceil(MNIST / batch)
    n_steps = steps or (4 if quick else total)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(min(MNIST, n_steps * batch), 1, 28, 28, generator=g).to(dev)
    Y = torch.randint(0, 10, (len(X),), generator=g).to(dev)
    out = {}
    for name, step in _trainers(dev).items():
        step(X[:batch], Y[:batch])  # warm-up (lazy set-up, cuBLAS / cuDNN plans)
        sync()
        t0 = time.perf_counter()
        for i in range(n_steps):
            j = (i * batch) % len(X)
            step(X[j:j + batch], Y[j:j + batch])
        sync()
        dt = time.perf_counter() - t0
        out[name] = {"steps": n_steps, "seconds": dt, "epoch_seconds": dt / n_steps * total}
        print(f"lenet {name}: {dt / n_steps * 1e3:.2f} ms/step, epoch {dt / n_steps * total:.1f} s", flush=True)
    return out


# ------------------------------------------------------------------------------------ driver


def run(args):
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    sync = H.sync_fn(dev)
    n = int(args.n or (1e6 if dev.type == "cpu" or args.quick else 1e8))
    if args.quick:
        n = min(n, 100_000)
    rounds = args.rounds or (3 if args.quick else 10)
    MAX_CALL[0] = args.max_call
    jobs = args.jobs or ["bandwidth", "fused", "vmf", "ps", "kron", "layers", "optim", "lenet"]
    res = {"meta": H.meta(args, ("jax", "power_spherical", "bayesian-torch"), device=str(dev), n=n, rounds=rounds,
                          nominal_Bps=_nominal(dev), lenet_batch=32 if args.quick else 128,
                          driver=_driver() if dev.type == "cuda" else None)}
    for job in jobs:
        t0 = time.perf_counter()
        res[job] = {"bandwidth": lambda: _bandwidth(dev, n, rounds, sync), "fused": lambda: _fused(dev, n, rounds, sync),
                    "vmf": lambda: _vmf(dev, n, rounds, sync), "ps": lambda: _ps(dev, n, rounds, sync), "kron": lambda: _kron(dev, args.quick, rounds, sync),
                    "layers": lambda: _layers(dev, rounds, sync), "optim": lambda: _optim(dev, rounds, sync),
                    "lenet": lambda: _lenet(dev, args.quick, sync, args.lenet_steps)}[job]()
        print(f"gpu bench: {job} done in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.out:  # what is done so far, in case the lease ends before the last job
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "gpu.partial.json"), "w") as f:
                json.dump(res, f, indent=1, default=str)
    return res


def _driver():
    import subprocess

    try:
        return subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       text=True).strip()
    except Exception:
        return None


def render(res):
    m = res["meta"]
    L = H.header(res, f"Benchmark: vmfdist on {m['device']}" + (f" ({m['gpu']})" if m.get("gpu") else ""),
                 "python -m benchmarks.run gpu", "gpu")
    L.append(f"- Device {m['device']}{', ' + m['gpu'] if m.get('gpu') else ''}; driver {m.get('driver') or '-'}; "
             f"torch {m['versions']['torch']}; N = {H.fmt_n(m['n'])}; min (median) of {m['rounds']} interleaved "
             "rounds.\n")
    bw = res.get("bandwidth", {}).get("Bps")
    nominal = m.get("nominal_Bps")
    if bw:
        L.append(f"Copy bandwidth (read + write): **{bw / 1e9:.0f} GB/s**"
                 + (f" ({bw / nominal:.0%} of the nominal {nominal / 1e12:.2f} TB/s)" if nominal else "") + ".\n")
    if "fused" in res:
        t = H.Table("op", "ours", "GB/s", "% of copy", "% of nominal", "peer", "peer time", "peer / ours")
        for r in res["fused"]:
            o = r["impls"]["vmfdist"]["min"]
            p = r["impls"].get(r["peer"] or "", {}).get("min")
            t.add(r["job"], H.fmt_time(o), f"{r['bytes'] / o / 1e9:.1f}", f"{r['bytes'] / o / bw:.0%}" if bw else "-",
                  f"{r['bytes'] / o / nominal:.0%}" if nominal else "-", r["peer"] or "-", H.fmt_time(p),
                  H.fmt_ratio(p / o) if p else "-")
        L += ["## Fused ops\n", str(t), ""]
    if "vmf" in res:
        names = sorted({k for r in res["vmf"] for k in r["impls"]} - {"vmfdist"})
        t = H.Table("d", "samples x batch", "ours", "% of copy", *[f"{k} / ours" for k in names])
        for r in res["vmf"]:
            o = r["impls"]["vmfdist"]["min"]
            t.add(r["d"], f"{r['samples']} x {r['batch']}", H.fmt_time(o), f"{r['bytes'] / o / bw:.0%}" if bw else "-",
                  *[H.fmt_ratio(r["impls"][k]["min"] / o) if k in r["impls"] else "-" for k in names])
        L += ["## vMF sampling (float32)\n", str(t), ""]
    if "ps" in res:
        names = sorted({k for r in res["ps"] for k in r["impls"]} - {"vmfdist"})
        t = H.Table("d", "mode", "samples x batch", "ours", *[f"{k} / ours" for k in names])
        for r in res["ps"]:
            o = r["impls"]["vmfdist"]["min"]
            t.add(r["d"], r["mode"], f"{r['samples']} x {r['batch']}", H.fmt_time(o),
                  *[H.fmt_ratio(r["impls"][k]["min"] / o) if k in r["impls"] else "-" for k in names])
        L += ["## PowerSpherical (float32)\n", str(t), ""]
    if "kron" in res:
        k = res["kron"]
        o, f = k["impls"]["vmfdist"]["min"], k["impls"]["matmul floor"]["min"]
        L += [f"## Kronecker op\n\nkron_eigen_matvec {k['k']} x {k['k']}: {H.fmt_time(o)} against the four matmuls "
              f"alone {H.fmt_time(f)}: **{o / f:.2f}x** its matmul floor.\n"]
    if "layers" in res:
        for job, r in res["layers"].items():
            base = r.get("nn.Linear", r.get("nn.Conv2d"))["min"]
            t = H.Table("layer", "step", "/ deterministic")
            for name, v in sorted(r.items(), key=lambda kv: kv[1]["min"]):
                t.add(name, H.fmt_time(v["min"]), H.fmt_ratio(v["min"] / base))
            L += [f"## Layer training step: {job}\n", str(t), ""]
    if "optim" in res:
        r = res["optim"]
        base = r["deterministic (Adam)"]["min"]
        t = H.Table("optimizer", "step", "/ Adam")
        for name, v in r.items():
            t.add(name, H.fmt_time(v["min"]), H.fmt_ratio(v["min"] / base))
        L += ["## Noisy K-FAC / EK-FAC step, LeNet-5, batch 128\n", str(t), ""]
    if "lenet" in res:
        r = res["lenet"]
        base = r["deterministic (Adam)"]["epoch_seconds"]
        t = H.Table("training", "epoch", "/ deterministic", "steps timed")
        for name, v in r.items():
            t.add(name, f"{v['epoch_seconds']:.1f} s", H.fmt_ratio(v["epoch_seconds"] / base), v["steps"])
        L += [f"## LeNet-5-Caffe, one MNIST-sized epoch (60000 images, batch {m.get('lenet_batch', 128)})\n", str(t),
              ""]
    return "\n".join(L)
