"""The timing harness and report writer shared by every benchmark (see benchmarks/README.md).

An area is a module ``benchmarks/bench_<area>.py`` defining ``TITLE``, ``run(args) -> dict`` (with a
``"meta"`` record from :func:`meta`), ``render(result) -> str`` (the markdown, from the result alone)
and optionally ``add_args(parser)`` and ``plot(result, path)``; ``python -m benchmarks.run <area>``
runs it and writes docs/benchmarks/<area>.{md,json[,png]} through :func:`write_report`.

Timing: :func:`time_fn` (one implementation: warm-up, then repeats until a count and a total time)
or :func:`time_rounds` (several, in interleaved rounds, so that load changes on a shared machine hit
all of them).  Tables use the minimum; the JSON keeps the median.
"""
from __future__ import annotations

import json
import math
import os
import platform
import random
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "docs", "benchmarks")

# repeats of time_fn: (at least min_reps and min_total seconds, at most max_reps)
FULL = {"min_reps": 5, "max_reps": 50, "min_total": 0.4}
QUICK = {"min_reps": 3, "max_reps": 10, "min_total": 0.1}


def timing(quick: bool) -> Dict[str, float]:
    return dict(QUICK if quick else FULL)


# --------------------------------------------------------------------------- environment


def set_threads(threads: int) -> None:
    """Give every library the same number of threads.  Call before numpy / JAX are imported
    (XLA and the BLAS libraries read their settings once); torch is set here too."""
    if "intra_op_parallelism_threads" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=true "
                                   f"intra_op_parallelism_threads={threads}").strip()
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(k, str(threads))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import torch

    torch.set_num_threads(threads)


def sync_fn(device) -> Callable[[], None]:
    """What makes a timing of work on `device` complete (CUDA is asynchronous)."""
    import torch

    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


_JAX: Dict[str, object] = {}


def jax_tfp():
    """(jax, tfp) with float64 enabled, or (None, None) when they cannot be imported (the reason
    is in :func:`versions`)."""
    if not _JAX:
        # JAX takes 75 % of a GPU's memory at its first use by default; torch shares the GPU here
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        try:
            import jax
            import torch

            jax.config.update("jax_enable_x64", True)
            jax.config.update("jax_platforms", "cuda,cpu" if torch.cuda.is_available() else "cpu")
            _tfp_jax_shim(jax)
            from tensorflow_probability.substrates import jax as tfp

            _JAX.update(jax=jax, tfp=tfp)
        except Exception as e:  # depends on the environment
            _JAX.update(jax=None, tfp=None, error=f"{type(e).__name__}: {e}")
    return _JAX["jax"], _JAX["tfp"]


def _tfp_jax_shim(jax) -> None:
    """TFP 0.25.0 (the newest release) registers its variable type in
    ``jax.interpreters.xla.pytype_aval_mappings``, which jax 0.7 removed (the table lives on in
    ``jax._src.core``): alias it, so that TFP's JAX substrate imports with a current jax (the GPU
    machine's 0.11; tested with 0.10.2 here).  Nothing is changed where the attribute exists."""
    import jax.interpreters.xla as xla

    if not hasattr(xla, "pytype_aval_mappings"):
        from jax._src import core

        xla.pytype_aval_mappings = core.pytype_aval_mappings


def versions(*packages: str) -> Dict[str, str]:
    """python, torch, numpy and the named distributions (``"jax"`` adds jaxlib, TFP and the backend)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    v = {"python": platform.python_version(), "torch": torch.__version__}
    for p in ("numpy",) + packages:
        if p != "jax":
            try:
                v[p] = version(p)
            except PackageNotFoundError:
                v[p] = "unavailable"
        elif jax_tfp()[0] is None:
            v["jax"] = f"unavailable ({_JAX['error']})"
        else:
            v.update({q: version(q) for q in ("jax", "jaxlib", "tensorflow-probability")})
            v["jax backend"] = _JAX["jax"].default_backend()
    return v


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def git_rev() -> str:
    """Short commit of the working tree, with -dirty when it has uncommitted changes."""
    try:
        return subprocess.check_output(["git", "-C", ROOT, "describe", "--always", "--dirty"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "?"


def meta(args, packages=(), **extra) -> dict:
    """The record every report starts with: date, commit, machine, versions, threads, load.
    :func:`write_report` adds ``load_after`` and ``seconds``."""
    import torch

    m = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "git": git_rev(), "cpu": cpu_name(), "nproc": os.cpu_count(),
         "versions": versions(*packages), "threads": args.threads, "torch_threads": torch.get_num_threads(),
         "quick": bool(args.quick), "load_before": list(os.getloadavg()), "t_start": time.time()}
    if torch.cuda.is_available():
        m["gpu"] = torch.cuda.get_device_name()
    return {**m, **extra}


def steady_heap(limit: int = 32 * 2 ** 20) -> bool:
    """Ask glibc to serve allocations up to ``limit`` bytes (at most its maximum, 32 MiB) from the
    heap and never to give freed heap memory back (``mallopt`` M_MMAP_THRESHOLD, M_TRIM_THRESHOLD).
    With glibc's defaults a tensor of a few MB may be a fresh ``mmap`` on one call and heap memory
    on the next (the threshold adapts to the frees so far), and the first-touch page faults of a
    fresh mapping cost as much as a cheap kernel on it: timings then depend on the order of the
    allocations before them.  This is the behaviour the allocators PyTorch's CPU tuning guide
    recommends (jemalloc, tcmalloc) give by default.  It cannot be undone in the process.
    Returns False where there is no glibc ``mallopt``."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, int(limit))) and bool(mallopt(m_trim_threshold, 2 ** 31 - 1))


# --------------------------------------------------------------------------- timing


def _once(fn, sync) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def time_fn(fn: Callable[[], object], *, min_reps: int = 5, max_reps: int = 50, min_total: float = 0.4,
            max_call: float = math.inf, sync: Callable[[], None] = lambda: None,
            on_warmup: Optional[Callable[[object], None]] = None) -> Dict[str, float]:
    """Seconds per call of ``fn()``: one untimed warm-up call (its output goes to ``on_warmup``), then
    repeats until at least ``min_reps`` calls and ``min_total`` seconds (at most ``max_reps``; 3 calls
    suffice when one takes over 0.5 s).  Returns ``{"min", "median", "reps", "warmup"}``.  When the
    warm-up alone takes longer than ``max_call`` s, one more call is made (none above 3 * max_call)
    and ``reps`` is 0: min and median are then the better and worse of the two."""
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    tw = time.perf_counter() - t0
    if on_warmup is not None:
        on_warmup(out)
    del out
    if tw > max_call:
        ts = [tw] if tw > 3 * max_call else [tw, _once(fn, sync)]
        return {"min": min(ts), "median": max(ts), "reps": 0, "warmup": tw}
    min_reps = min(min_reps, 3) if tw > 0.5 else min_reps
    ts: List[float] = []
    t_start = time.perf_counter()
    while len(ts) < max_reps and (len(ts) < min_reps or time.perf_counter() - t_start < min_total):
        ts.append(_once(fn, sync))
    return {"min": min(ts), "median": statistics.median(ts), "reps": len(ts), "warmup": tw}


def time_rounds(fns: Dict[str, Callable[[], object]], rounds: int, sync: Callable[[], None] = lambda: None,
                verbose: bool = True) -> Dict[str, Dict[str, object]]:
    """One warm-up call of each, then ``rounds`` rounds that call every implementation once, each
    round in a new (seeded) random order: what runs just before a call leaves the caches, the
    allocator and the clock in its own state (after a 6 ms step of another layer a 2 ms step was
    measured 10% slower), so no implementation should always follow the same one.  Returns
    ``{name: {"min", "median", "times"}}``."""
    for f in fns.values():
        f()
        sync()
    times: Dict[str, List[float]] = {k: [] for k in fns}
    order = list(fns)
    rng = random.Random(0)
    for r in range(rounds):
        rng.shuffle(order)
        for k in order:
            sync()
            times[k].append(_once(fns[k], sync))
        if verbose:
            print(f"round {r + 1}/{rounds}", flush=True)
    return {k: {"min": min(ts), "median": statistics.median(ts), "times": ts} for k, ts in times.items()}


_POOL: Dict[int, ThreadPoolExecutor] = {}


def split_threads(fn: Callable, n: int, threads: int) -> list:
    """``[fn(lo, hi) for each of `threads` contiguous chunks of range(n)]``, run on a thread pool:
    gives single-threaded numpy / SciPy kernels (which release the GIL) the same cores as the others."""
    if threads <= 1:
        return [fn(0, n)]
    pool = _POOL.setdefault(threads, ThreadPoolExecutor(threads))
    cuts = [n * i // threads for i in range(threads + 1)]
    return [f.result() for f in [pool.submit(fn, lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]]


def canary(size: int = 100_000, ops: int = 100) -> float:
    """Best of 3 x (ops x torch.exp on `size` float32), seconds: a probe of competing load."""
    import torch

    x = torch.rand(size)
    return time_fn(lambda: [torch.exp(x) for _ in range(ops)], min_reps=3, max_reps=3, min_total=0)["min"]


# --------------------------------------------------------------------------- report


def fmt_time(s: Optional[float]) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def fmt_ratio(r: Optional[float]) -> str:
    if r is None:
        return "—"
    if r < 0.1:
        return f"{r:.2g}×"
    return f"{r:.2f}×" if r < 10 else f"{r:.1f}×" if r < 100 else f"{r:.0f}×"


def fmt_n(n: float) -> str:
    e = int(math.floor(math.log10(n))) if n > 0 else 0
    m = n / 10**e
    return f"1e{e}" if m == 1 else f"{m:g}e{e}"


def fmt_rate(v: Optional[float]) -> str:
    """Events per second: 3 significant digits with k / M."""
    if v is None:
        return "—"
    if v >= 1e6:
        return f"{v / 1e6:.3g} M"
    return f"{v / 1e3:.3g} k" if v >= 1e3 else f"{v:.3g}"


class Table:
    """A markdown table: ``t = Table("a", "b"); t.add(1, 2); str(t)``; the columns named in ``right``
    (indices) are right-aligned."""

    def __init__(self, *header: str, right=()):
        self.header, self.right = list(header), set(right)
        self.rows: List[List[str]] = []

    def add(self, *cells) -> "Table":
        self.rows.append(["" if c is None else str(c) for c in cells])
        return self

    def __str__(self) -> str:
        rule = "|" + "".join("---:|" if i in self.right else "---|" for i in range(len(self.header)))
        return "\n".join(["| " + " | ".join(self.header) + " |", rule] + ["| " + " | ".join(r) + " |"
                                                                         for r in self.rows]) + "\n"


def header(result: dict, title: str, command: str, name: str) -> List[str]:
    """The opening lines every report shares: title, command, date, commit, machine, load, versions."""
    m = result["meta"]
    lb, la = m["load_before"], m.get("load_after", m["load_before"])
    return [f"# {title}\n",
            f"Generated by `{command}` (see `benchmarks/README.md`); raw numbers in `{name}.json`.\n",
            f"- Date {m['date']}, git `{m['git']}`, {'quick run' if m.get('quick') else 'full run'}"
            + (f", {m['seconds']:.0f} s total." if "seconds" in m else "."),
            f"- CPU: {m['cpu']} ({m['nproc']} logical cores); load average ({'/'.join(('1', '5', '15')[:len(lb)])} "
            f"min) before {'/'.join(f'{x:.2f}' for x in lb)}, after {'/'.join(f'{x:.2f}' for x in la)}."
            + (f" GPU: {m['gpu']}." if "gpu" in m else ""),
            "- " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + "."] + [
            # rows re-measured after a change to a few functions (merged by hand into the JSON)
            f"- Re-measured {r['date']}, git `{r['git']}` ({r['why']}): {', '.join(f'`{f}`' for f in r['functions'])}; "
            f"load before {'/'.join(f'{x:.2f}' for x in r['load_before'])}." for r in m.get("reruns", [])]


def _json_map(o, leaf):
    if isinstance(o, dict):
        return {k: _json_map(v, leaf) for k, v in o.items()}
    return [_json_map(v, leaf) for v in o] if isinstance(o, (list, tuple)) else leaf(o)


def save_json(obj, path: str) -> None:
    """JSON with inf / nan written as strings (JSON has neither)."""
    with open(path, "w") as f:
        json.dump(_json_map(obj, lambda x: str(x) if isinstance(x, float) and not math.isfinite(x) else x), f,
                  indent=1, ensure_ascii=False)
        f.write("\n")


def load_json(path: str):
    with open(path) as f:
        return _json_map(json.load(f), lambda x: float(x) if x in ("inf", "-inf", "nan") else x)


def write_report(name: str, result: dict, render: Callable[[dict], str], out_dir: str = OUT_DIR,
                 plot: Optional[Callable[[dict, str], None]] = None, finish: bool = True) -> str:
    """Write <out_dir>/<name>.json, <name>.md (``render(result)``) and, with ``plot``, <name>.png.
    ``finish`` records ``load_after`` and ``seconds`` in the meta first (off when re-rendering)."""
    m = result.get("meta", {})
    if finish and "t_start" in m:
        m["load_after"] = list(os.getloadavg())
        m["seconds"] = time.time() - m.pop("t_start")
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, name)
    save_json(result, base + ".json")
    with open(base + ".md", "w") as f:
        f.write(render(result))
    if plot is not None:
        plot(result, base + ".png")
    return base + ".md"


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
