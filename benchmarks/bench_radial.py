"""Fused radial noise (``vmfdist.distributions.radial_noise``) against the composite PyTorch expression.

Job: a 3x3x512x512 convolution kernel (2.36M weights; --quick: 3x3x64x64), 4 samples, float32.
  composite: eps = randn; eps / |eps| (over the event) * randn(radius); * sigma; + mu
  ours:      radial_noise(mu, sigma, (4,)) (one op, two passes, no temporaries)
Also forward + backward (loss = (w * c).sum(), gradients to mu and sigma) and a memory probe:
the bytes the fused op must move (write the output, read and rewrite it, read mu and sigma)
per second, against torch.add on two tensors of the output's size.  Interleaved rounds.
"""
from __future__ import annotations

import torch

from benchmarks import harness as H
from vmfdist.distributions import radial_noise

TITLE = "fused radial noise vs the PyTorch composite"
S = 4


def add_args(p):
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds (default 15)")


def run(args):
    shape = (3, 3, 64, 64) if args.quick else (3, 3, 512, 512)
    g = torch.Generator().manual_seed(0)
    mu, sigma = torch.randn(shape, generator=g), torch.rand(shape, generator=g) * 0.1
    c, a, b = (torch.randn((S,) + shape, generator=g) for _ in range(3))
    ev = (S,) + (1,) * len(shape)

    def composite(m, s):
        eps = torch.randn((S,) + shape)
        return m + s * (eps / eps.flatten(1).norm(dim=1).view(ev) * torch.randn(ev))

    def fwd_bwd(fn):
        def f():
            m, s = mu.clone().requires_grad_(True), sigma.clone().requires_grad_(True)
            (fn(m, s) * c).sum().backward()
        return f

    ours = lambda m, s: radial_noise(m, s, (S,))  # noqa: E731
    fns = {"composite": lambda: composite(mu, sigma), "ours": lambda: ours(mu, sigma),
           "composite fwd+bwd": fwd_bwd(composite), "ours fwd+bwd": fwd_bwd(ours),
           "add (bandwidth probe)": lambda: torch.add(a, b)}
    meta = H.meta(args, shape=list(shape), samples=S, repeats=args.repeats)
    rows = H.time_rounds(fns, args.repeats, verbose=False)
    return {"meta": meta, "rows": {k: {"min": v["min"], "median": v["median"]} for k, v in rows.items()}}


def render(res):
    m, r = res["meta"], res["rows"]
    shape, d = m["shape"], 1
    for s in shape:
        d *= s
    nbytes = 4 * m["samples"] * d
    probe = 3 * nbytes / r["add (bandwidth probe)"]["min"]  # reads 2, writes 1
    moved = 3 * nbytes + 2 * 4 * d
    t = H.Table("job", "composite", "ours", "composite / ours")
    for job in ("", " fwd+bwd"):
        tc, to = r["composite" + job], r["ours" + job]
        t.add(f"sample{job or ' (forward)'}", f"{H.fmt_time(tc['min'])} ({H.fmt_time(tc['median'])})",
              f"{H.fmt_time(to['min'])} ({H.fmt_time(to['median'])})", f"**{H.fmt_ratio(tc['min'] / to['min'])}**")
    L = H.header(res, "Benchmark: fused radial noise", "python -m benchmarks.run radial", "radial")
    L += [f"- Job: {'x'.join(map(str, shape))} kernel ({d / 1e6:.2f}M weights), {m['samples']} samples, float32, CPU, "
          f"{m['threads']} threads; times are min (median) of "
          f"{m.get('timing', str(m['repeats']) + ' interleaved rounds')}.\n", str(t),
          f"Memory: the fused forward moves {moved / 1e6:.0f} MB (writes the output, reads and rewrites it, reads mu "
          "and "
          f"sigma): {moved / r['ours']['min'] / 1e9:.1f} GB/s, against {probe / 1e9:.1f} GB/s for torch.add on tensors "
          f"of the output's size ({moved / r['ours']['min'] / probe:.0%} of that probe).  Its only allocation is the "
          "output (plus one double per 4096-element chunk); the composite allocates four temporaries of the output's "
          "size.\n",
          "Target (issue #4): ≥ 2× the composite for this job.\n"]
    return "\n".join(L)
