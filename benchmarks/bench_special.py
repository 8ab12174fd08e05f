"""Benchmarks of ``vmfdist.special`` against peers, all timed in the same process.

Peers
-----
* TFP on JAX (``tensorflow_probability.substrates.jax``), jit-compiled, warmed up
  (compile time excluded) and timed with ``block_until_ready``:
  ``tfp.math.bessel_iv_ratio(v, z) = I_v(z) / I_{v-1}(z)`` (same convention as ours) and
  ``tfp.math.log_bessel_ive(v, z) = log I_v(z) - z`` (``+ z`` inside the jit for log I).
* SciPy: ``scipy.special._ufuncs._iv_ratio`` / ``_iv_ratio_c`` (private, SciPy >= 1.15)
  and ``log(scipy.special.ive(v, z))`` (``+ z`` for log I).  SciPy ufuncs are
  single-threaded; for n >= ``SCIPY_SPLIT_MIN`` the arrays are split in
  ``torch.get_num_threads()`` chunks evaluated on a thread pool (numpy ufuncs
  release the GIL), so SciPy uses the same number of cores as the others.
* A pure-PyTorch composite of the same closed-form formulas (Ruiz-Antolín--Segura
  theorem 5 bounds with ``torch.hypot``, their midpoint, the two-branch asymptotic)
  for the closed-form functions, plus a memory-bandwidth floor
  (``torch.add(a, b, out=c)``) measured in the same run.

Everything here is importable without JAX/TFP: missing peers are skipped.
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from vmfdist import special as S

SCIPY_SPLIT_MIN = 100_000

# --------------------------------------------------------------------------- workloads


def make_workload(name: str, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float64 (nu, z) arrays of length n."""
    # separate streams for nu and z, so the first k points are the same for every n
    rnu, rz = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    if name == "mixed":
        nu = rnu.uniform(0.5, 500.0, n)
        z = np.exp(rz.uniform(math.log(1e-3), math.log(1e3), n))
    elif name == "vMF":
        nu = np.full(n, 128.0)
        z = rz.uniform(1.0, 1000.0, n)
    else:
        raise ValueError(f"unknown workload {name!r}")
    return nu, z


def make_box(nu_lo, nu_hi, z_lo, z_hi, n, seed=0):
    """nu uniform, z log-uniform in a box (for the per-regime profile)."""
    rng = np.random.default_rng(seed)
    nu = rng.uniform(nu_lo, nu_hi, n)
    z = np.exp(rng.uniform(math.log(z_lo), math.log(z_hi), n))
    return nu, z


WORKLOADS = {
    "mixed": "ν ~ U[0.5, 500], z log-uniform in [1e-3, 1e3]",
    "vMF": "ν = 128, z ~ U[1, 1000]",
}

# --------------------------------------------------------------------------- peers


def _torch_b(nu, z, alpha):
    lam = nu + (alpha - 1) / 2
    delta = (nu - 0.5) + lam / (2 * torch.hypot(lam, z))
    return z / (delta + torch.hypot(delta, z))


def torch_bounds5(nu, z):
    return _torch_b(nu, z, 2.0), _torch_b(nu, z, 0.0)


def torch_approx(nu, z):
    return 0.5 * (_torch_b(nu, z, 2.0) + _torch_b(nu, z, 0.0))


def torch_asymptotic(nu, z):
    eta = (nu + 0.5) / (2 * (nu + 1))
    small = nu * torch.log(z) + eta * z - (eta + nu) * math.log(2.0) - torch.lgamma(nu + 1)
    large = z - 0.5 * torch.log(z) - 0.5 * math.log(2 * math.pi)
    return torch.where(z < nu, small, large)


_jax = None
_tfp = None
_jax_err = None


def jax_modules():
    """(jax, tfp) or (None, None) when unavailable."""
    global _jax, _tfp, _jax_err
    if _jax is None and _jax_err is None:
        try:
            import jax

            jax.config.update("jax_enable_x64", True)
            jax.config.update("jax_platforms", "cpu" if not torch.cuda.is_available() else "cuda,cpu")
            from tensorflow_probability.substrates import jax as tfp

            _jax, _tfp = jax, tfp
        except Exception as e:  # pragma: no cover - depends on the environment
            _jax_err = f"{type(e).__name__}: {e}"
    return _jax, _tfp


def versions() -> Dict[str, str]:
    import platform

    import scipy

    v = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
         "scipy": scipy.__version__}
    jax, tfp = jax_modules()
    if jax is not None:
        import jaxlib
        import tensorflow_probability

        v["jax"] = jax.__version__
        v["jaxlib"] = jaxlib.__version__
        v["tensorflow-probability"] = tensorflow_probability.__version__
        v["jax backend"] = jax.default_backend()
    else:
        v["jax"] = f"unavailable ({_jax_err})"
    return v


_pool: Optional[ThreadPoolExecutor] = None


def _scipy_parallel(kernel: Callable, arrays, out):
    """kernel(*arrays_chunk, out_chunk) over torch.get_num_threads() chunks."""
    global _pool
    n = out.shape[0]
    k = torch.get_num_threads()
    if n < SCIPY_SPLIT_MIN or k <= 1:
        kernel(*arrays, out)
        return out
    if _pool is None or _pool._max_workers != k:
        _pool = ThreadPoolExecutor(k)
    bounds = np.linspace(0, n, k + 1).astype(int)
    futs = [_pool.submit(kernel, *(a[lo:hi] for a in arrays), out[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for f in futs:
        f.result()
    return out


def _sp_iv_ratio():
    from scipy.special._ufuncs import _iv_ratio

    return lambda v, z, o: _iv_ratio(v, z, out=o)


def _sp_iv_ratio_c():
    from scipy.special._ufuncs import _iv_ratio_c

    return lambda v, z, o: _iv_ratio_c(v, z, out=o)


def _sp_log_ive(plus_z: bool):
    from scipy.special import ive

    def k(v, z, o):
        with np.errstate(divide="ignore", invalid="ignore"):
            ive(v, z, out=o)
            np.log(o, out=o)
            if plus_z:
                np.add(o, z, out=o)

    return k


# --------------------------------------------------------------------------- implementation records


@dataclass
class Impl:
    """One implementation: prepare(nu64, z64, dtype) -> args; run(args) -> result (synchronised)."""

    name: str
    prepare: Callable
    run: Callable
    to_numpy: Callable = lambda r: r


def _torch_prepare(device):
    def prep(nu, z, dtype):
        return (torch.as_tensor(nu).to(device=device, dtype=dtype), torch.as_tensor(z).to(device=device, dtype=dtype))

    return prep


def _torch_sync(device):
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _torch_np(r):
    if isinstance(r, tuple):
        return tuple(x.detach().double().cpu().numpy() for x in r)
    return r.detach().double().cpu().numpy()


def torch_impl(name, fn, device):
    sync = _torch_sync(device)

    def run(args):
        r = fn(*args)
        sync()
        return r

    return Impl(name, _torch_prepare(device), run, _torch_np)


def tfp_impl(name, expr: str):
    jax, tfp = jax_modules()
    if jax is None:
        return None
    jnp = jax.numpy
    if expr == "ratio":
        f = jax.jit(lambda v, z: tfp.math.bessel_iv_ratio(v, z))
    elif expr == "log_ive":
        f = jax.jit(lambda v, z: tfp.math.log_bessel_ive(v, z))
    elif expr == "log_iv":
        f = jax.jit(lambda v, z: tfp.math.log_bessel_ive(v, z) + z)
    else:
        raise ValueError(expr)
    jdt = {torch.float32: jnp.float32, torch.float64: jnp.float64}

    def prep(nu, z, dtype):
        a = jax.device_put(jnp.asarray(nu, dtype=jdt[dtype]))
        b = jax.device_put(jnp.asarray(z, dtype=jdt[dtype]))
        f(a, b).block_until_ready()  # compile for this shape/dtype (excluded from timing)
        return a, b

    return Impl(name, prep, lambda args: f(*args).block_until_ready(), lambda r: np.asarray(r, dtype=np.float64))


def scipy_impl(name, kernel_factory):
    try:
        kernel = kernel_factory()
    except Exception:  # pragma: no cover
        return None
    npdt = {torch.float32: np.float32, torch.float64: np.float64}

    def prep(nu, z, dtype):
        a = np.ascontiguousarray(nu, dtype=npdt[dtype])
        b = np.ascontiguousarray(z, dtype=npdt[dtype])
        return a, b, np.empty_like(a)

    return Impl(name, prep, lambda args: _scipy_parallel(kernel, args[:2], args[2]),
                lambda r: np.asarray(r, dtype=np.float64))


@dataclass
class Bench:
    name: str  # our function name
    ours: Impl
    peers: List[Impl]
    # rough cost class: "fast" benches run at the largest sizes
    fast: bool = False
    # accuracy reference: key into the mpmath reference dict, or None
    ref: Optional[str] = None
    # bytes moved per element (in units of itemsize) for GB/s reporting
    io_elems: int = 3
    max_n: Optional[int] = None
    targets: Dict[str, float] = field(default_factory=dict)


def make_benches(device: torch.device) -> Dict[str, Bench]:
    T = lambda name, fn: torch_impl(name, fn, device)  # noqa: E731
    on_cpu = device.type == "cpu"
    sp = (lambda *a: scipy_impl(*a)) if on_cpu else (lambda *a: None)
    drop = lambda xs: [x for x in xs if x is not None]  # noqa: E731
    return {
        "bessel_iv_ratio": Bench(
            "bessel_iv_ratio", T("vmfdist", S.bessel_iv_ratio),
            drop([tfp_impl("TFP-JAX bessel_iv_ratio", "ratio"), sp("SciPy _iv_ratio", _sp_iv_ratio)]),
            ref="ratio", targets={"TFP-JAX bessel_iv_ratio": 5.0}),
        "bessel_iv_ratio_c": Bench(
            "bessel_iv_ratio_c", T("vmfdist", S.bessel_iv_ratio_c),
            drop([sp("SciPy _iv_ratio_c", _sp_iv_ratio_c)]), ref="ratio_c"),
        "log_bessel_iv": Bench(
            "log_bessel_iv", T("vmfdist", S.log_bessel_iv),
            drop([tfp_impl("TFP-JAX log_bessel_ive+z", "log_iv"), sp("SciPy log(ive)+z", lambda: _sp_log_ive(True))]),
            ref="log_iv", targets={"TFP-JAX log_bessel_ive+z": 10.0}),
        "log_bessel_ive": Bench(
            "log_bessel_ive", T("vmfdist", S.log_bessel_ive),
            drop([tfp_impl("TFP-JAX log_bessel_ive", "log_ive"), sp("SciPy log(ive)", lambda: _sp_log_ive(False))]),
            ref="log_ive"),
        "bessel_iv_ratio_bounds": Bench(
            "bessel_iv_ratio_bounds", T("vmfdist", S.bessel_iv_ratio_bounds),
            [T("torch composite (hypot)", torch_bounds5)], fast=True, io_elems=4),
        "bessel_iv_ratio_approx": Bench(
            "bessel_iv_ratio_approx", T("vmfdist", S.bessel_iv_ratio_approx),
            [T("torch composite (hypot)", torch_approx)], fast=True, io_elems=3),
        "log_bessel_iv_asymptotic": Bench(
            "log_bessel_iv_asymptotic", T("vmfdist", S.log_bessel_iv_asymptotic),
            [T("torch composite (where)", torch_asymptotic)], fast=True, io_elems=3),
        "log_bessel_iv_series": Bench(
            "log_bessel_iv_series", T("vmfdist", S.log_bessel_iv_series),
            drop([sp("SciPy log(ive)+z", lambda: _sp_log_ive(True))]), max_n=1_000_000),
    }


# --------------------------------------------------------------------------- timing


def time_call(run: Callable, args, min_reps: int, max_reps: int, min_total: float) -> Dict[str, float]:
    """Run once untimed (warm-up), then repeatedly; returns min / median seconds per call."""
    t0 = time.perf_counter()
    run(args)
    if time.perf_counter() - t0 > 0.5:  # long calls: 3 repeats are enough
        min_reps = min(min_reps, 3)
    ts: List[float] = []
    t_start = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        run(args)
        ts.append(time.perf_counter() - t0)
        if len(ts) >= max_reps:
            break
        if len(ts) >= min_reps and time.perf_counter() - t_start >= min_total:
            break
    ts.sort()
    return {"min": ts[0], "median": ts[len(ts) // 2], "reps": len(ts)}


def bandwidth_floor(n: int, dtype: torch.dtype, device: torch.device, **kw) -> Dict[str, float]:
    """torch.add(a, b, out=c): 3 arrays of n elements moved; returns seconds and GB/s."""
    a = torch.rand(n, dtype=dtype, device=device)
    b = torch.rand(n, dtype=dtype, device=device)
    c = torch.empty_like(a)
    sync = _torch_sync(device)

    def run(_):
        torch.add(a, b, out=c)
        sync()

    t = time_call(run, None, **kw)
    t["GBps"] = 3 * n * a.element_size() / t["min"] / 1e9
    return t


# --------------------------------------------------------------------------- accuracy


def mpmath_reference(nu: np.ndarray, z: np.ndarray) -> Dict[str, np.ndarray]:
    """float64 references of R, 1-R, log I, log I - z at (nu, z) with mpmath (30 digits)."""
    import mpmath as mp

    mp.mp.dps = 30
    out = {k: np.empty(len(nu)) for k in ("ratio", "ratio_c", "log_iv", "log_ive")}
    for i, (v, x) in enumerate(zip(nu.tolist(), z.tolist())):
        v, x = mp.mpf(v), mp.mpf(x)
        a = mp.besseli(v, x)
        b = mp.besseli(v - 1, x)
        r = a / b
        out["ratio"][i] = float(r)
        out["ratio_c"][i] = float(1 - r)
        out["log_iv"][i] = float(mp.log(a))
        out["log_ive"][i] = float(mp.log(a) - x)
    return out


def accuracy(impl: Impl, ref_key: Optional[str], nu, z, dtype, ref: Optional[Dict[str, np.ndarray]],
             ref_idx: np.ndarray) -> Dict[str, float]:
    """Non-finite outputs over all of (nu, z); max relative error on the mpmath subsample.

    For logs the error is |a - b| / max(1, |b|)."""
    args = impl.prepare(nu, z, dtype)
    r = impl.to_numpy(impl.run(args))
    rs = r if isinstance(r, tuple) else (r,)
    res = {"nonfinite": int(sum((~np.isfinite(x)).sum() for x in rs)), "n_checked": int(len(nu))}
    if ref is not None and ref_key is not None:
        got = rs[0][ref_idx]
        want = ref[ref_key]
        if ref_key.startswith("log"):
            err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
        else:
            err = np.abs(got - want) / np.abs(want)
        err = np.where(np.isfinite(got), err, np.inf)
        res["maxrel"] = float(np.max(err))
        tol = 1e-9 if dtype == torch.float64 else 1e-4
        res["n_bad"] = int((err > tol).sum())
        res["n_ref"] = int(len(want))
    return res
