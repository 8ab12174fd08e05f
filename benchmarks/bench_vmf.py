"""Throughput of ``vmfdist.distributions.VonMisesFisher`` sampling against peers, in one process.

Driven by ``benchmarks/run_vmf.py`` (``python -m benchmarks.run_vmf``), which sets the thread
environment *before* JAX is imported and writes ``docs/benchmarks/vmf.{md,json,png}``.

Implementations (all draw n samples of one vMF(mu, kappa) in R^d; mu a fixed random unit vector,
kappa a scalar):

* ``vmfdist``        ``VonMisesFisher(loc, kappa).sample((n,))`` (float32 / float64).
* ``TFP-JAX``        ``tfp.distributions.VonMisesFisher(mu, kappa).sample(n, seed=key)`` inside
                     ``jax.jit`` (compiled and warmed up per n and dtype; compile time excluded;
                     ``block_until_ready``).  The key is ``fold_in(key, i)`` with a fresh ``i`` per call.
* ``SciPy``          ``scipy.stats.vonmises_fisher(mu, kappa).rvs(n, random_state=rng)``; SciPy
                     always computes in float64.  Two variants: one call (its rotation and QR use
                     BLAS/LAPACK with ``OPENBLAS_NUM_THREADS`` threads), and ``SciPy x2`` = the n
                     samples split over ``torch.get_num_threads()`` Python threads with independent
                     ``Generator``s (numpy releases the GIL inside its kernels).
* ``PowerSpherical`` ``power_spherical.PowerSpherical(loc, scale=kappa).rsample((n,))`` (PyPI
                     package): a different, rejection-free distribution - the speed reference.
* ``s-vae (torch)``  :class:`SVAEVonMisesFisher` below: a pure-PyTorch re-implementation of the
                     s-vae-pytorch sampler (Davidson et al. 2018): Wood's rejection sampler run as
                     a Python ``while`` loop over rounds of ``k = 20`` Beta proposals per sample,
                     with that code's blended approximation of Wood's ``b`` for kappa > 10; the
                     tangent part from d normals of which the first is dropped; and a Householder
                     reflection of e1 onto mu.
* ``randn floor``    ``torch.randn((n, d))``: the cost of generating the randomness itself.

``rsample`` + backward (``loss = (x * c).sum()``, ``loc`` and ``kappa`` requiring grad) is timed
for vmfdist, PowerSpherical and the s-vae re-implementation (TFP's vMF is not reparameterised for
d != 3 and SciPy has no gradients).
"""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from benchmarks import bench_special as _special_bench

# (d, kappa): the three cases of issue #3 first, then the additional ones; run in order of d.
CASES = [(16, 100.0), (256, 1e3), (4096, 1e4), (3, 10.0), (64, 10.0), (1000, 50.0)]
TARGET_CASES = [(16, 100.0), (256, 1e3), (4096, 1e4)]

OURS = "vmfdist"
TFP = "TFP-JAX"
SCIPY = "SciPy"
SCIPY2 = "SciPy x2"
PS = "PowerSpherical"
SVAE = "s-vae (torch)"
FLOOR = "randn floor"
SAMPLE_IMPLS = [OURS, TFP, SCIPY, SCIPY2, PS, SVAE, FLOOR]
GRAD_IMPLS = [OURS, PS, SVAE]


def case_name(d, kappa) -> str:
    return f"d={d}, κ={kappa:g}"


def make_loc(d: int, seed: int = 0) -> np.ndarray:
    """A fixed random unit vector (float64).  Not e1: TFP's sampler is NaN at mu = e1."""
    v = np.random.default_rng(seed + d).standard_normal(d)
    return v / np.linalg.norm(v)


def n_ladder(d: int, max_elems: float, max_n: float, rungs: int) -> List[int]:
    """Sample counts n_max / 10^k (k = rungs-1..0), n_max the largest {1,2,5}x10^e with
    n_max * d <= max_elems and n_max <= max_n."""
    cands = sorted(m * 10**e for e in range(0, 9) for m in (1, 2, 5))
    n_max = max([c for c in cands if c * d <= max_elems and c <= max_n] or [1])
    return sorted({max(1, n_max // 10**k) for k in range(rungs)})


# --------------------------------------------------------------------------- s-vae re-implementation


class SVAEVonMisesFisher:
    r"""Pure-PyTorch re-implementation of the s-vae-pytorch vMF sampler (Davidson et al. 2018).

    Written from the algorithm (not copied); reproduces its cost model and its approximations:

    * d = 3: inverse CDF, ``w = 1 + log(u + (1 - u) exp(-2 kappa)) / kappa`` (as a logsumexp).
    * d != 3: Wood (1994).  ``b`` blends the exact ``(sqrt(4k^2 + (d-1)^2) - 2k)/(d-1)`` into the
      Taylor approximation ``(d-1)/(4k)`` for 10 < kappa < 11 and uses the approximation above
      (which is wrong when d is not << kappa, e.g. b > 1 at d = 1000, kappa = 50); ``a`` and the
      acceptance constant follow from that ``b``.  Each round draws ``k`` proposals
      ``e ~ Beta((d-1)/2, (d-1)/2)`` (in float64, then cast) and ``k`` uniforms *for every
      sample*, keeps the first accepted proposal of the samples still pending, and repeats in a
      Python ``while`` loop until all are accepted.
    * tangent: d standard normals with the first dropped, normalised, scaled by sqrt(1 - w^2).
    * Householder reflection with ``u = (e1 - mu)/(|e1 - mu| + 1e-5)``.

    ``rsample`` differentiates through the accepted proposal (``e`` treated as a constant), the
    biased gradient that issue #3 describes.
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, k: int = 20):
        self.loc, self.scale, self.k = loc, scale, k
        self.d = loc.shape[-1]
        self.dtype, self.device = loc.dtype, loc.device

    def _w_d3(self, n):
        u = torch.rand(n, 1, dtype=self.dtype, device=self.device)
        kappa = self.scale
        return 1 + torch.stack([torch.log(u), torch.log1p(-u) - 2 * kappa], 0).logsumexp(0) / kappa

    def _w_wood(self, n, eps=1e-20):
        m1 = self.d - 1
        kappa = self.scale
        root = torch.sqrt(4 * kappa**2 + m1**2)
        b_exact = (root - 2 * kappa) / m1
        b_taylor = m1 / (4 * kappa)
        s = (kappa - 10).clamp(0, 1)
        b = b_taylor * s + b_exact * (1 - s)
        a = (m1 + 2 * kappa + root) / 4
        c = 4 * a * b / (1 + b) - m1 * math.log(m1)
        half = torch.tensor(m1 / 2, dtype=torch.float64, device=self.device)
        beta = torch.distributions.Beta(half, half)
        w = torch.zeros(n, 1, dtype=self.dtype, device=self.device)
        pending = torch.ones(n, dtype=torch.bool, device=self.device)
        while bool(pending.any()):
            e = beta.sample((n, self.k)).to(self.dtype)
            u = torch.empty(n, self.k, dtype=self.dtype, device=self.device).uniform_(eps, 1 - eps)
            denom = 1 - (1 - b) * e
            w_prop = (1 - (1 + b) * e) / denom
            t = 2 * a * b / denom
            ok = (m1 * torch.log(t) - t + c) > torch.log(u)
            any_ok = ok.any(1)
            first = ok.to(torch.uint8).argmax(1, keepdim=True)  # index of the first accepted proposal
            take = pending & any_ok
            w = torch.where(take.unsqueeze(1), w_prop.gather(1, first), w)
            pending = pending & ~any_ok
        return w

    def rsample(self, sample_shape=torch.Size()):
        n = math.prod(sample_shape)
        w = self._w_d3(n) if self.d == 3 else self._w_wood(n)
        v = torch.randn(n, self.d, dtype=self.dtype, device=self.device)[:, 1:]
        v = v / v.norm(dim=-1, keepdim=True)
        x = torch.cat((w, torch.sqrt(torch.clamp(1 - w**2, 1e-10)) * v), -1)
        e1 = torch.zeros_like(self.loc)
        e1[..., 0] = 1
        u = e1 - self.loc
        u = u / (u.norm(dim=-1, keepdim=True) + 1e-5)
        z = x - 2 * (x * u).sum(-1, keepdim=True) * u
        return z.reshape(tuple(sample_shape) + (self.d,))

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)


# --------------------------------------------------------------------------- peers

def jax_modules():
    """(jax, tfp) or (None, None); float64 enabled; CPU platform (shared with bench_special)."""
    return _special_bench.jax_modules()


def power_spherical_cls():
    try:
        from power_spherical import PowerSpherical

        return PowerSpherical
    except Exception:  # pragma: no cover
        return None


def versions() -> Dict[str, str]:
    """bench_special's versions (python, torch, numpy, scipy, jax/TFP) plus power_spherical."""
    v = _special_bench.versions()
    try:
        from importlib.metadata import version

        v["power_spherical"] = version("power_spherical")
    except Exception:
        v["power_spherical"] = "unavailable"
    return v


_TORCH_DT = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Runner:
    """run() draws the samples (synchronised) and returns them (sampling) or None (backward)."""

    run: Callable[[], object]
    to_numpy: Callable[[object], np.ndarray] = lambda x: x  # noqa: E731


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_sampler(impl: str, d: int, kappa: float, dtype: str, n: int, mu: Optional[np.ndarray] = None,
                 threads: int = 2) -> Optional[Runner]:
    """A Runner drawing n samples with implementation `impl`, or None when it is unavailable."""
    mu = make_loc(d) if mu is None else mu
    tdt = _TORCH_DT[dtype]
    tnp = lambda x: x.detach().double().cpu().numpy()  # noqa: E731
    if impl == OURS:
        from vmfdist.distributions import VonMisesFisher

        dist = VonMisesFisher(torch.as_tensor(mu, dtype=tdt), torch.tensor(kappa, dtype=tdt))

        def run():
            x = dist.sample((n,))
            _sync()
            return x

        return Runner(run, tnp)
    if impl == FLOOR:
        return Runner(lambda: torch.randn((n, d), dtype=tdt), tnp)
    if impl == PS:
        cls = power_spherical_cls()
        if cls is None:
            return None
        dist = cls(torch.as_tensor(mu, dtype=tdt), torch.tensor(kappa, dtype=tdt))

        def run():
            with torch.no_grad():
                return dist.rsample((n,))

        return Runner(run, tnp)
    if impl == SVAE:
        dist = SVAEVonMisesFisher(torch.as_tensor(mu, dtype=tdt), torch.tensor(kappa, dtype=tdt))
        return Runner(lambda: dist.sample((n,)), tnp)
    if impl == TFP:
        jax, tfp = jax_modules()
        if jax is None:
            return None
        jnp = jax.numpy
        jdt = {"float32": jnp.float32, "float64": jnp.float64}[dtype]
        f = jax.jit(lambda m, k, key, i: tfp.distributions.VonMisesFisher(m, k).sample(
            n, seed=jax.random.fold_in(key, i)))
        m = jax.device_put(jnp.asarray(mu, dtype=jdt))
        k = jax.device_put(jnp.asarray(kappa, dtype=jdt))
        key = jax.random.PRNGKey(0)
        f(m, k, key, 0).block_until_ready()  # compile (excluded from timing)
        counter = [0]

        def run():
            counter[0] += 1
            return f(m, k, key, counter[0]).block_until_ready()

        return Runner(run, lambda x: np.asarray(x, dtype=np.float64))
    if impl in (SCIPY, SCIPY2):
        from scipy.stats import vonmises_fisher

        dist = vonmises_fisher(mu, kappa)
        if impl == SCIPY:
            rng = np.random.default_rng(1)
            return Runner(lambda: dist.rvs(n, random_state=rng))
        rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(1).spawn(threads)]
        pool = ThreadPoolExecutor(threads)
        bounds = np.linspace(0, n, threads + 1).astype(int)
        sizes = [int(hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]

        def run():
            futs = [pool.submit(dist.rvs, s, random_state=r) for s, r in zip(sizes, rngs)]
            return np.concatenate([np.atleast_2d(f.result()) for f in futs])

        return Runner(run)
    raise ValueError(impl)


def make_grad(impl: str, d: int, kappa: float, dtype: str, n: int, mu: Optional[np.ndarray] = None) -> Optional[Runner]:
    """rsample((n,)) + backward of (x * c).sum() with loc and kappa requiring grad."""
    mu = make_loc(d) if mu is None else mu
    tdt = _TORCH_DT[dtype]
    loc = torch.as_tensor(mu, dtype=tdt).clone().requires_grad_(True)
    kap = torch.tensor(kappa, dtype=tdt, requires_grad=True)
    c = torch.as_tensor(np.random.default_rng(7).standard_normal(d), dtype=tdt)
    if impl == OURS:
        from vmfdist.distributions import VonMisesFisher as cls
    elif impl == PS:
        cls = power_spherical_cls()
        if cls is None:
            return None
    elif impl == SVAE:
        cls = SVAEVonMisesFisher
    else:
        raise ValueError(impl)

    def run():
        loc.grad = kap.grad = None
        x = cls(loc, kap).rsample((n,))
        (x * c).sum().backward()
        _sync()
        return (loc.grad, kap.grad)

    return Runner(run)


# --------------------------------------------------------------------------- timing and checks


def time_call(run: Callable, min_reps: int, max_reps: int, min_total: float, keep_first: bool = False,
              max_call: float = math.inf):
    """One untimed warm-up call, then repeats (>= min_reps and >= min_total s, <= max_reps;
    3 reps when a call takes > 0.5 s).  Returns ({min, median, reps, warmup}, warm-up output).

    When the warm-up call alone takes longer than ``max_call`` s, only one more call is made
    (none above ``3 * max_call``) and the best of the two is kept (``reps = 0``)."""
    t0 = time.perf_counter()
    out = run()
    tw = time.perf_counter() - t0
    if not keep_first:
        out = None
    if tw > max_call:
        if tw > 3 * max_call:
            return {"min": tw, "median": tw, "reps": 0, "warmup": tw}, out
        t0 = time.perf_counter()
        run()
        t1 = time.perf_counter() - t0
        return {"min": min(tw, t1), "median": max(tw, t1), "reps": 0, "warmup": tw}, out
    if tw > 0.5:
        min_reps = min(min_reps, 3)
    ts: List[float] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
        if len(ts) >= max_reps or (len(ts) >= min_reps and time.perf_counter() - t_start >= min_total):
            break
    ts.sort()
    return {"min": ts[0], "median": ts[len(ts) // 2], "reps": len(ts), "warmup": tw}, out


SCIPY_QR_SECONDS: Dict[int, float] = {}  # d -> seconds of the QR in SciPy's rotation (measured or projected)


def scipy_qr_seconds(d: int, measure_max_d: int = 1024) -> float:
    """Seconds of the d x d QR that every ``vonmises_fisher.rvs`` call does (``_rotate_samples``):
    measured (best of 2) for d <= measure_max_d, else extrapolated ~ d^3 from measure_max_d."""
    if d not in SCIPY_QR_SECONDS:
        if d <= measure_max_d:
            mu = make_loc(d)
            emb = np.concatenate([mu[None, :], np.zeros((d - 1, d))])
            best = math.inf
            for _ in range(2):
                t0 = time.perf_counter()
                np.linalg.qr(np.transpose(emb))
                best = min(best, time.perf_counter() - t0)
            SCIPY_QR_SECONDS[d] = best
        else:
            SCIPY_QR_SECONDS[d] = scipy_qr_seconds(measure_max_d) * (d / measure_max_d) ** 3
    return SCIPY_QR_SECONDS[d]


def canary(size: int = 100_000, ops: int = 100) -> float:
    """Best of 3 x (ops x torch.exp on `size` float32): a noise probe on the benchmark's threads."""
    x = torch.rand(size)
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(ops):
            torch.exp(x)
        best = min(best, time.perf_counter() - t0)
    return best


def mean_resultant_length(d: int, kappa: float) -> float:
    """A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa) = E[mu^T x] under vMF (float64)."""
    from vmfdist import special

    return float(special.bessel_iv_ratio(torch.tensor([0.5 * d], dtype=torch.float64),
                                         torch.tensor([kappa], dtype=torch.float64))[0])


def check_samples(x: np.ndarray, mu: np.ndarray, d: int, kappa: float) -> Dict[str, float]:
    """Non-finite count, max | |x| - 1 |, mean of w = mu^T x and its z-score against A_d(kappa)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1, d)
    finite = np.isfinite(x).all(axis=1)
    res = {"n": int(x.shape[0]), "nonfinite_rows": int((~finite).sum())}
    xf = x[finite]
    if len(xf) == 0:
        return res
    w = xf @ mu
    a = mean_resultant_length(d, kappa)
    se = float(w.std(ddof=1) / math.sqrt(len(w))) if len(w) > 1 else float("nan")
    res.update({"max_norm_err": float(np.abs(np.linalg.norm(xf, axis=1) - 1).max()),
                "mean_w": float(w.mean()), "A_d": a, "se": se,
                "z": float((w.mean() - a) / se) if se > 0 else float("nan")})
    return res
