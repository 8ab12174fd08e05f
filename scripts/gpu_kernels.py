"""Call every compiled op once per size and layout: the program compute-sanitizer watches.

    python scripts/gpu_kernels.py [--device cuda|cpu] [--sizes 0 1 2 3 37 1031] [--ops NAME ...]
                                  [--layouts contiguous noncontiguous broadcast] [--dtypes float32 float64]

Every case of tests/op_cases.py (one per op of csrc/ops.cpp) runs for each size (0: empty
inputs or zero samples; 1: one element; odd sizes that leave partial vectors, warps and
blocks) and each layout (contiguous, strided views, broadcast / stride-0 inputs), in float32
and float64, plus the backward passes of the autograd formulas that call the backward ops.
``scripts/gpu_check.sh`` runs it under compute-sanitizer's memcheck, racecheck, synccheck and
initcheck on the GPU; ``--device cpu`` is its rehearsal on a machine without one.  Prints one
line per op and exits non-zero if any call raised.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from tests.op_cases import CASES, LAYOUTS  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", nargs="*", type=int, default=[0, 1, 2, 3, 37, 1031])
    p.add_argument("--ops", nargs="*", default=None, help="op names (default: all)")
    p.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=LAYOUTS,
                   help="input layouts (default: all), e.g. to localise a sanitizer report")
    p.add_argument("--dtypes", nargs="*", default=["float32", "float64"], choices=["float32", "float64"])
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    failed = 0
    for name in args.ops or sorted(CASES):
        t0, calls = time.perf_counter(), 0
        try:
            for dt in (getattr(torch, d) for d in args.dtypes):
                for n in args.sizes:
                    for layout in args.layouts:
                        outs = CASES[name](dev, dt, n, layout)
                        sync()
                        calls += 1
                        assert all(o.device.type == dev.type for o in outs), f"{name}: output on the wrong device"
        except Exception:  # report every op, then fail
            failed += 1
            print(f"FAIL {name} (after {calls} calls)\n{traceback.format_exc()}", flush=True)
            continue
        print(f"ok   {name}: {calls} calls, {time.perf_counter() - t0:.2f} s", flush=True)
    # the autograd formulas (they call the backward ops) with grad on
    try:
        from vmfdist.distributions import Radial, VonMisesFisher

        loc = torch.nn.functional.normalize(torch.randn(3, 5, device=dev, dtype=torch.float64), dim=-1)
        loc.requires_grad_()
        kap = torch.tensor([0.5, 5.0, 50.0], device=dev, dtype=torch.float64, requires_grad=True)
        VonMisesFisher(loc, kap).rsample((4,)).sum().backward()
        mu = torch.zeros(4, 3, device=dev, requires_grad=True)
        sig = torch.ones(4, 3, device=dev, requires_grad=True)
        Radial(mu, sig).rsample((2,)).square().sum().backward()
        sync()
        print("ok   autograd: vMF and Radial rsample backward", flush=True)
    except Exception:
        failed += 1
        print(f"FAIL autograd\n{traceback.format_exc()}", flush=True)
    print(f"{len(args.ops or CASES) + 1 - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
