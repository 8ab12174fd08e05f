"""Copy-free broadcasting of the elementwise ops: peak memory and speed, two builds compared.

Each measurement runs in a fresh subprocess with ``PYTHONPATH`` set to one source tree
(its ``vmfdist`` and its compiled ``vmfdist/_C*.so``), so two builds of the extension can
be compared in the same run: ``--before`` (e.g. a checkout of main) and ``--after``
(this tree).  The subprocesses alternate, ``--rounds`` times, and each figure is the
minimum over the rounds (the machine may be shared).

* Peak memory: in a fresh process, the peak resident set size during one call on nu of
  shape (2000, 1) and z of shape (1, 10000), float64, minus the resident set before it,
  divided by the output's size (160 MB; bounds: per output, so 2.0 is its two outputs).
  The peak (``VmHWM`` in ``/proc/self/status``) is reset to the current resident set
  just before the call by writing 5 to ``/proc/self/clear_refs`` (Linux >= 4.0).  Torch's
  CPU allocator takes blocks this large straight from the OS and every page is written,
  so the resident set grows by what the op allocates.
* Speed: nanoseconds per element, best of several calls, for the two workloads of
  ``bench_special.py`` (contiguous inputs of equal shape) and for the outer-product
  broadcast above (1e6 elements, (100, 1) x (1, 10000), for the two exact functions).

    python -m benchmarks.run broadcast --before /path/to/main [--after .] [--rounds 3]

(not part of ``all``: it needs a second tree).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness as H

TITLE = "copy-free broadcasting: peak memory and speed, two builds compared"
IN_ALL = False
OUTER = (2000, 10000)
OPS = ["bessel_iv_ratio", "log_bessel_iv", "bessel_iv_ratio_bounds", "bessel_iv_ratio_approx",
       "log_bessel_iv_asymptotic"]
FAST = {"bessel_iv_ratio_bounds", "bessel_iv_ratio_approx", "log_bessel_iv_asymptotic"}

_MEMORY = r"""
import re, torch
from vmfdist import special as S
def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
nu = torch.linspace(0.5, 500.0, {rows}, dtype=torch.float64).reshape(-1, 1)
z = torch.logspace(-3, 3, {cols}, dtype=torch.float64).reshape(1, -1)
fn = getattr(S, "{op}")
fn(nu[:2], z[:, :2])  # load everything once
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS")
out = fn(nu, z)
peak = status("VmHWM")
out = out[0] if isinstance(out, tuple) else out
print((peak - before) / out.nbytes)
"""

# vmfdist is already imported from the measured tree; the harness and the workloads come from this one
_SPEED = r"""
import json, sys, torch
sys.path.insert(0, {root!r})
from benchmarks.bench_special import workload
from benchmarks.harness import time_fn
from vmfdist import special as S
def best(fn, *args, reps=5):
    return time_fn(lambda: fn(*args), min_reps=reps, max_reps=reps, min_total=0)["min"]
res = {{}}
for op in {ops!r}:
    fn = getattr(S, op)
    n = 1_000_000 if op in {fast!r} else 100_000
    for wl in ("mixed", "vMF"):
        nu, z = (torch.from_numpy(a) for a in workload(wl, n))
        res[f"{{op}} {{wl}}"] = best(fn, nu, z) / n * 1e9
    rows, cols = {outer!r}
    nu = torch.linspace(0.5, 500.0, rows, dtype=torch.float64).reshape(-1, 1)
    z = torch.logspace(-3, 3, cols, dtype=torch.float64).reshape(1, -1)
    if op not in {fast!r}:
        nu, z = nu[: rows // 20], z  # 1e6 elements for the expensive functions
    res[f"{{op}} outer"] = best(fn, nu, z, reps=3) / (nu.numel() * z.numel()) * 1e9
print(json.dumps(res))
"""


def add_args(p):
    p.add_argument("--before", default=None, help="source tree of the build to compare against (required)")
    p.add_argument("--after", default=H.ROOT, help="source tree of the build measured (default: this one)")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 3; --quick 1)")
    p.add_argument("--notes", default="", help="a paragraph on reading the numbers, kept in the JSON and the page")


def _run(tree: str, code: str) -> str:
    tree = str(Path(tree).resolve())
    # run outside any source tree: python -c puts the working directory first on sys.path
    code = f"import vmfdist; assert vmfdist.__file__.startswith({tree!r}), vmfdist.__file__\n" + code
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=tree), capture_output=True,
                         text=True, check=True, cwd=tempfile.gettempdir())
    return out.stdout.strip().splitlines()[-1]


def run(args):
    if args.before is None:
        raise SystemExit("broadcast: --before TREE is required (a source tree with a built extension)")
    rounds = args.rounds or (1 if args.quick else 3)
    res = {"meta": H.meta(args), "memory": {"before": {}, "after": {}}, "speed": {"before": {}, "after": {}},
           "rounds": rounds, "notes": args.notes}
    for _ in range(rounds):
        for label, tree in (("before", args.before), ("after", args.after)):
            for op in OPS:
                r = float(_run(tree, _MEMORY.format(rows=OUTER[0], cols=OUTER[1], op=op)))
                res["memory"][label][op] = min(res["memory"][label].get(op, float("inf")), r)
            s = json.loads(_run(tree, _SPEED.format(root=H.ROOT, ops=OPS, fast=sorted(FAST), outer=OUTER)))
            for k, v in s.items():
                res["speed"][label][k] = min(res["speed"][label].get(k, float("inf")), v)
    return res


def render(res: dict) -> str:
    mem, speed = res["memory"], res["speed"]
    t = H.Table("op", "peak / output, before", "peak / output, after", right=(1, 2))
    for op in OPS:
        t.add(op, f"{mem['before'][op]:.2f}", f"{mem['after'][op]:.2f}")
    s = H.Table("op, workload", "ns/element before", "ns/element after", "after / before", right=(1, 2, 3))
    for k, a in speed["after"].items():
        s.add(k, f"{speed['before'][k]:.2f}", f"{a:.2f}", f"{a / speed['before'][k]:.2f}")
    return ("# Broadcasting without copies\n\n"
            "The elementwise ops used to broadcast by `expand(...).contiguous()`, so orders of shape (2000, 1)\n"
            "against arguments of shape (1, 10000) allocated both inputs at the output's size.  They now\n"
            "broadcast through `at::TensorIterator` strides (`csrc/host/elementwise_host.h`).  Below,\n"
            "*before* is a build of main without that change and *after* this tree, measured in the same run\n"
            f"by `python -m benchmarks.run broadcast --before MAIN --rounds {res['rounds']}` (each figure the\n"
            "best of the rounds; float64, CPU, torch's default thread count).\n\n"
            + __doc__[__doc__.index("* Peak"):__doc__.index("    python -m benchmarks")].strip() + "\n\n"
            + str(t) + "\n" + str(s) + (f"\n{res['notes']}\n" if res.get("notes") else ""))
