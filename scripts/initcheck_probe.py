"""Localise compute-sanitizer initcheck reports (docs/install.md, "What the first GPU session learnt").

    compute-sanitizer --tool initcheck python scripts/initcheck_probe.py

Runs a few labelled cases, each followed by a device synchronisation and a line
``=== CASE <name> done``, so that every report the sanitizer prints (to the same stream) falls
between the marker of the case before and that of its own case.  The cases separate "our kernel
reads memory nobody wrote" from "the sanitizer does not see a write made by someone else" (torch's
strided copy, cuBLAS): torch's own kernels read the same memory in the control cases.
"""
from __future__ import annotations

import sys

import torch

import vmfdist  # noqa: F401  (loads the extension)

ops = torch.ops.vmfdist
dev = "cuda"
n = 37


def mark(name: str) -> None:
    torch.cuda.synchronize()
    print(f"=== CASE {name} done", flush=True)


def values(dt, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)).to(device=dev, dtype=dt)


def strided_as_tests(t):  # tests/op_cases.py's noncontiguous layout: every other element of empty()
    buf = torch.empty(2 * n, dtype=t.dtype, device=dev)
    buf[::2] = t
    return buf[::2]


def strided_zeroed(t):  # the same view of a buffer that is written everywhere first
    buf = torch.zeros(2 * n, dtype=t.dtype, device=dev)
    buf[::2] = t
    return buf[::2]


mark("start")
for dt in (torch.float32, torch.float64):
    tag = str(dt).split(".")[-1]
    nu, z = values(dt, 0.5, 300.0, 1), values(dt, 1e-3, 1e3, 2)
    nu_s, z_s = strided_as_tests(nu), strided_as_tests(z)
    mark(f"{tag} make strided views (torch copy into empty buffer)")
    torch.add(nu_s, z_s)
    mark(f"{tag} torch.add on strided views")
    ops.bessel_iv_ratio(nu_s, z_s)
    mark(f"{tag} vmfdist bessel_iv_ratio on strided views")
    ops.bessel_iv_ratio(nu_s.contiguous(), z_s.contiguous())
    mark(f"{tag} vmfdist bessel_iv_ratio on contiguous copies")
    nu_z, z_z = strided_zeroed(nu), strided_zeroed(z)
    ops.bessel_iv_ratio(nu_z, z_z)
    mark(f"{tag} vmfdist bessel_iv_ratio on strided views of zeroed buffers")
    full = torch.linspace(1.0, 2.0, 2 * n, dtype=dt, device=dev)
    ops.bessel_iv_ratio(full[::2], full[1::2])
    mark(f"{tag} vmfdist bessel_iv_ratio on strided views of a kernel-written buffer")
    # cuBLAS output read by torch, then by the Kronecker op in power mode kRecip (-1)
    a = torch.randn(24, 24, dtype=dt, device=dev)
    m = a @ a.T + 24 * torch.eye(24, dtype=dt, device=dev)
    mark(f"{tag} matmul")
    torch.reciprocal(m)
    mark(f"{tag} torch.reciprocal of the matmul output")
    qa, qg = torch.linalg.qr(torch.randn(6, 6, dtype=dt, device=dev))[0], torch.linalg.qr(
        torch.randn(4, 4, dtype=dt, device=dev))[0]
    s = torch.rand(4, 6, dtype=dt, device=dev) + 0.5
    v = torch.randn(4, 6, dtype=dt, device=dev)
    mark(f"{tag} kron inputs")
    for p in (1.0, -1.0, -0.5):
        ops.kron_eigen_matvec(qg, qa, s, v, p)
        mark(f"{tag} kron_eigen_matvec power {p}")

    def lay(t):  # every other column of an empty() buffer, as tests/op_cases.py
        buf = torch.empty(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=dev)
        buf[:, ::2] = t
        return buf[:, ::2]

    ops.kron_eigen_matvec(lay(qg), lay(qa), lay(s), lay(v), -1.0)
    mark(f"{tag} kron_eigen_matvec power -1 on strided views")
print("probe finished", file=sys.stderr, flush=True)
