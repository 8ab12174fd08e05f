"""Run benchmarks and write docs/benchmarks/<area>.{md,json[,png]}.

    python -m benchmarks.run special                # one area, full size
    python -m benchmarks.run all --quick            # every area, small sizes, written to /tmp/vmfdist-bench
    python -m benchmarks.run vmf --report           # re-render vmf.md / vmf.png from vmf.json, run nothing
    python -m benchmarks.run kron --help            # the area's own options

Every ``benchmarks/bench_<area>.py`` is an area (see benchmarks/harness.py for what it defines).
``--quick`` shrinks the sizes and writes to /tmp/vmfdist-bench unless ``--out`` is given, so that a
check of the scripts never overwrites the recorded tables.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

if __package__ in (None, ""):  # python benchmarks/run.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # noqa: E402

QUICK_OUT = "/tmp/vmfdist-bench"


def areas():
    here = os.path.dirname(os.path.abspath(__file__))
    return sorted(m.name[len("bench_"):] for m in pkgutil.iter_modules([here]) if m.name.startswith("bench_"))


def parser(area: str):
    mod = importlib.import_module(f"benchmarks.bench_{area}")
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.run {area}", description=mod.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"small sizes, fewer repeats; output to {QUICK_OUT}")
    p.add_argument("--threads", type=int, default=2, help="threads for every library (default 2)")
    p.add_argument("--out", default=None, help="output folder (default docs/benchmarks)")
    p.add_argument("--report", action="store_true", help="only re-render <out>/<area>.md (and .png) from its JSON")
    if hasattr(mod, "add_args"):
        mod.add_args(p)
    return mod, p


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    names = areas()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in names + ["all"]:
        print(__doc__ + "\nareas: " + ", ".join(names) + ", all")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=2)
    harness.set_threads(pre.parse_known_args(argv[1:])[0].threads)  # before numpy / JAX start thread pools
    for area in names if argv[0] == "all" else [argv[0]]:
        mod, p = parser(area)
        args = p.parse_args(argv[1:])
        out = args.out or (QUICK_OUT if args.quick else harness.OUT_DIR)
        if argv[0] == "all" and not args.report and not getattr(mod, "IN_ALL", True):
            print(f"=== {area}: not run by all (see python -m benchmarks.run {area} --help)", flush=True)
            continue
        if args.report:
            res = harness.load_json(os.path.join(out, f"{area}.json"))
            harness.write_report(area, res, mod.render, out, getattr(mod, "plot", None), finish=False)
            print(f"re-rendered {out}/{area}.md", flush=True)
            continue
        print(f"=== {area}: {mod.TITLE}", flush=True)
        res = mod.run(args)
        path = harness.write_report(area, res, mod.render, out, getattr(mod, "plot", None))
        print(f"{area}: {res['meta']['seconds']:.0f} s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
