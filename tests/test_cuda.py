"""The GPU's side of every op, distribution and layer (needs a GPU; ``scripts/gpu_check.sh``).

* every compiled op gives the CPU's result on the GPU for the same inputs and (seed, offset):
  bitwise for the Philox words and uniforms, to rounding otherwise (the bounds of docs/vmf.md,
  docs/radial.md, docs/matrix_normal.md: 1e-12 relative in float64, 1e-5 in float32), for
  contiguous, strided and broadcast inputs, empty and one-element ones included;
* every distribution's log_prob, entropy, mean and closed-form KLs agree across devices, and
  its samples have the right mean on the GPU;
* samplers and Bayesian layers (forward and backward) never synchronise with the host
  (``torch.cuda.set_sync_debug_mode("error")``);
* indices past 2**31 elements (where the GPU has the memory).

Only ``test_every_op_has_a_case`` runs without a GPU: a new op without a case in
tests/op_cases.py fails it.
"""
from __future__ import annotations

import math

import pytest
import torch

from tests.op_cases import BITWISE, CASES, LAYOUTS, MATMUL, registered_ops
from vmfdist._ops import lib

F64 = torch.float64
HAS_GPU = torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key("vmfdist::log_bessel_iv",
                                                                                         "CUDA")
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs CUDA (a GPU and the CUDA kernels)")
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def test_every_op_has_a_case():
    assert sorted(CASES) == registered_ops()


def _assert_agree(name, cpu, dev, dt):
    assert len(cpu) == len(dev)
    for i, (a, b) in enumerate(zip(cpu, dev)):
        assert b.device.type == "cuda", (name, i)
        b = b.cpu()
        assert a.shape == b.shape and a.dtype == b.dtype, (name, i, a.shape, b.shape, a.dtype, b.dtype)
        if name in BITWISE or not a.is_floating_point():
            assert torch.equal(a, b), (name, i)
            continue
        tol = TOL[dt]  # float64 outputs of float32 inputs (e.g. radial_noise's coef) are float32-accurate
        scale = a.abs().nan_to_num(0, 0, 0).amax().item() if name in MATMUL and a.numel() else 0.0
        torch.testing.assert_close(b, a, rtol=tol, atol=tol * scale, equal_nan=True, msg=lambda m: f"{name}[{i}]: {m}")


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [0, 1, 37])
@pytest.mark.parametrize("dt", [F64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_agrees_with_cpu(name, dt, n, layout):
    if name in ("vmf_sample", "power_spherical_sample"):
        # unit vectors: entries agree to rounding of 1 (absolute), and a rejection step's acceptance
        # may flip with the last bit of a double logarithm (docs/vmf.md): 99.5% of rows
        x_c, o_c = CASES[name]("cpu", dt, n, layout)
        x_g, o_g = (t.cpu() for t in CASES[name]("cuda", dt, n, layout))
        if n:
            close = ((x_c - x_g).abs().amax(-1) <= TOL[dt]) & ((o_c - o_g).abs() <= TOL[dt] * (1 + o_c.abs()))
            assert close.double().mean() >= 0.995
        return
    _assert_agree(name, CASES[name]("cpu", dt, n, layout), CASES[name]("cuda", dt, n, layout), dt)


@gpu
def test_vmf_sample_rows_agree_at_scale():
    """Many rows, several dimensions: the 99.5% criterion of docs/vmf.md on 2048 rows each."""
    g = torch.Generator().manual_seed(3)
    for d, k in [(3, 5.0), (16, 100.0), (300, 1e3), (5000, 1e4)]:
        loc = torch.randn(8, d, generator=g, dtype=F64)
        loc = loc / loc.norm(dim=-1, keepdim=True)
        kap = torch.full((8,), k, dtype=F64)
        for dt in (F64, torch.float32):
            x_c, _ = lib.vmf_sample(loc.to(dt), kap.to(dt), 256, seed=1, offset=4)
            x_g, _ = lib.vmf_sample(loc.to("cuda", dt), kap.to("cuda", dt), 256, seed=1, offset=4)
            close = (x_c - x_g.cpu()).abs().amax(-1) <= TOL[dt]
            assert close.double().mean() >= 0.995, (d, dt)


# ----------------------------------------------------------------------------- distributions


def _distributions(dev):
    """(name, q, p, points): a distribution, a second one to take KLs against, points to score."""
    from torch.distributions import Gamma, Independent, InverseGamma, LogNormal, Normal, Weibull

    from vmfdist.distributions import (EigenvalueCorrectedMatrixNormal, HypersphericalUniform, MatrixNormal,
                                       PowerSpherical, Radial, VonMisesFisher)

    g = torch.Generator().manual_seed(5)
    t = lambda x: x.to(dev)  # noqa: E731
    out = []
    for d in (3, 64):
        mu = torch.randn(4, d, generator=g, dtype=F64)
        mu = mu / mu.norm(dim=-1, keepdim=True)
        kap = torch.tensor([0.0, 1.0, 50.0, 1e4], dtype=F64)
        x = torch.randn(6, 4, d, generator=g, dtype=F64)
        x = x / x.norm(dim=-1, keepdim=True)
        q = VonMisesFisher(t(mu), t(kap))
        out.append((f"vmf{d}", q, VonMisesFisher(t(mu.flip(0)), t(kap.flip(0) + 1)), t(x)))
        out.append((f"vmf{d}-uniform", q, HypersphericalUniform(d, (4,), dtype=F64, device=dev), t(x)))
        out.append((f"uniform{d}", HypersphericalUniform(d, (4,), dtype=F64, device=dev), q, t(x)))
        ps = PowerSpherical(t(mu), t(kap))
        out.append((f"power-spherical{d}", ps, VonMisesFisher(t(mu.flip(0)), t(kap.flip(0) + 1)), t(x)))
        out.append((f"power-spherical{d}-uniform", ps, HypersphericalUniform(d, (4,), dtype=F64, device=dev), t(x)))
    loc, scale = torch.randn(5, 3, generator=g, dtype=F64), torch.rand(5, 3, generator=g, dtype=F64) + 0.1
    out.append(("radial", Radial(t(loc), t(scale)), Independent(Normal(t(loc * 0), t(scale * 0 + 1)), 2),
                t(torch.randn(7, 5, 3, generator=g, dtype=F64))))
    a, b = torch.randn(4, 4, generator=g, dtype=F64), torch.randn(3, 3, generator=g, dtype=F64)
    u, v = a @ a.T + torch.eye(4, dtype=F64), b @ b.T + torch.eye(3, dtype=F64)
    m = torch.randn(4, 3, generator=g, dtype=F64)
    mn, mn2 = MatrixNormal(t(m), t(u), t(v)), MatrixNormal(t(m * 0), t(u * 2), t(v))
    pts = t(torch.randn(5, 4, 3, generator=g, dtype=F64))
    out.append(("matrix-normal", mn, mn2, pts))
    qo, qi = torch.linalg.qr(a)[0], torch.linalg.qr(b)[0]
    var = torch.rand(4, 3, generator=g, dtype=F64) + 0.1
    ec = EigenvalueCorrectedMatrixNormal(t(m), t(qo), t(qi), t(var))
    out.append(("ekfac-normal", ec, mn, pts))
    out.append(("ekfac-normal-ekfac", ec, EigenvalueCorrectedMatrixNormal(t(m * 0), t(qo), t(qi), t(var * 2)), pts))
    r = torch.rand(6, generator=g, dtype=F64) + 0.5
    out.append(("lognormal-gamma", LogNormal(t(r - 1), t(r)), Gamma(t(r + 1), t(r)), t(r)))
    out.append(("lognormal-invgamma", LogNormal(t(r - 1), t(r)), InverseGamma(t(r + 1), t(r)), t(r)))
    out.append(("weibull", Weibull(t(r), t(r + 1)), Weibull(t(r + 1), t(r)), t(r)))
    return out


@gpu
def test_distributions_agree_with_cpu():
    """log_prob, entropy, mean and the closed-form KL of every distribution: the same numbers on
    the GPU as on the CPU, to rounding."""
    from torch.distributions import kl_divergence

    for (name, q, p, x), (_, qg, pg, xg) in zip(_distributions("cpu"), _distributions("cuda")):
        pairs = [("kl", kl_divergence(q, p), kl_divergence(qg, pg))]
        if not name.startswith(("lognormal", "weibull")):
            pairs += [("log_prob", q.log_prob(x), qg.log_prob(xg)), ("entropy", q.entropy(), qg.entropy()),
                      ("mean", q.mean, qg.mean)]
        for what, a, b in pairs:
            assert b.device.type == "cuda", (name, what)
            torch.testing.assert_close(b.cpu(), a, rtol=1e-10, atol=1e-10, equal_nan=True,
                                       msg=lambda m: f"{name} {what}: {m}")


@gpu
def test_gpu_samples_have_the_right_mean():
    """rsample on the GPU: the sample mean within 5 standard errors of the distribution's mean
    (per coordinate, standard errors from the samples)."""
    n = 20000
    for name, q, _, _ in _distributions("cuda"):
        if name.startswith(("uniform", "lognormal", "weibull")):
            continue
        s = q.rsample((n,))
        assert s.device.type == "cuda" and bool(torch.isfinite(s).all()), name
        se = s.std(0) / math.sqrt(n)
        z = ((s.mean(0) - q.mean) / se.clamp_min(1e-12)).abs()
        assert z.max().item() < 5.5, (name, z.max().item())


# ----------------------------------------------------------------------------- no host syncs


def _bayesian_models(dev):
    from torch import nn

    from vmfdist import nn as bnn

    models = {}
    for kind in ("meanfield", "meanfield-local", "meanfield-flipout", "radial", "rdp"):
        if kind.startswith("meanfield"):
            est = {"meanfield": "reparam", "meanfield-local": "local", "meanfield-flipout": "flipout"}[kind]
            conv, lin = (bnn.MeanFieldConv2d(1, 4, 3, estimator=est, device=dev),
                         bnn.MeanFieldLinear(4 * 6 * 6, 5, estimator=est, device=dev))
        elif kind == "radial":
            conv, lin = bnn.RadialConv2d(1, 4, 3, device=dev), bnn.RadialLinear(4 * 6 * 6, 5, device=dev)
        else:
            conv, lin = bnn.RDPConv2d(1, 4, 3, device=dev), bnn.RDPLinear(4 * 6 * 6, 5, device=dev)
        models[kind] = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), lin)
    return models


SYNC_CASES = ["VonMisesFisher", "Radial", "philox", "meanfield", "meanfield-local", "meanfield-flipout", "radial",
              "rdp", "predict"]


@gpu
@pytest.mark.parametrize("what", SYNC_CASES)
def test_samplers_and_layers_never_sync_with_the_host(what):
    """One case per sampler or layer kind, so that one that synchronises does not hide the others."""
    from vmfdist import nn as bnn
    from vmfdist.distributions import Radial, VonMisesFisher
    from vmfdist.random import philox_normal, philox_uniform

    dev = "cuda"
    if what == "VonMisesFisher":
        loc = torch.nn.functional.normalize(torch.randn(8, 16, device=dev), dim=-1).requires_grad_()
        kap = torch.full((8,), 20.0, device=dev, requires_grad=True)
        dist = VonMisesFisher(loc, kap)  # constructing validates the arguments (a sync): outside the watch
        step = lambda: dist.rsample((3,)).sum().backward()  # noqa: E731
    elif what == "Radial":
        mu, sig = torch.zeros(4, 5, device=dev, requires_grad=True), torch.ones(4, 5, device=dev, requires_grad=True)
        dist = Radial(mu, sig)
        step = lambda: dist.rsample((2,)).sum().backward()  # noqa: E731
    elif what == "philox":
        step = lambda: (philox_uniform(100, device=dev), philox_normal(100, device=dev))  # noqa: E731
    elif what == "predict":  # the predictive's sampled forward; the wide Radial layer takes its per-example draw
        from vmfdist.nn.predictive import _predictive_forward

        m = torch.nn.Sequential(bnn.RadialLinear(256, 128, device=dev), torch.nn.ReLU(),
                                bnn.MeanFieldLinear(128, 5, device=dev)).eval()
        x = torch.randn(2, 256, device=dev)
        # (predict itself reads one flag pair on the host by design: its check that x and the outputs are finite)
        step = lambda: _predictive_forward(m, x, 8, None)  # noqa: E731
    else:
        m = _bayesian_models(dev)[what]
        x, y = torch.randn(16, 1, 8, 8, device=dev), torch.randint(0, 5, (16,), device=dev)
        # check_finite=False: the ELBO's NaN check reads two flags on the host each step by design
        # (docs/nn.md); what must not synchronise is the layers' forward and backward
        elbo = bnn.ELBO(m, num_data=1000, check_finite=False)
        step = lambda: elbo(m(x), y).backward()  # noqa: E731
    step()  # the first call (lazy set-up, cuBLAS handles) before watching
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


# ----------------------------------------------------------------------------- large indices


@gpu
def test_indices_past_two_to_the_31():
    """An elementwise op and a sampler over 2**31 + 5 elements: the last elements are the ones the
    CPU computes for those indices (no 32-bit index overflow in the kernels)."""
    n = 2 ** 31 + 5
    free, _ = torch.cuda.mem_get_info()
    if free < 2 * 4 * n:
        pytest.skip(f"needs {2 * 4 * n / 2 ** 30:.0f} GiB of free GPU memory for 2**31 + 5 floats, has "
                    f"{free / 2 ** 30:.0f} (CUDA large-index test)")
    u = lib.philox_uniform([n], seed=3, offset=1, dtype=torch.float32, device="cuda")
    tail = u[-9:].cpu()
    del u
    assert torch.equal(tail, lib.philox_uniform([n], seed=3, offset=1, dtype=torch.float32, device="cpu")[-9:])
    nu = torch.tensor(100.0, device="cuda").expand(n)
    z = torch.tensor(50.0, device="cuda").expand(n)
    out = torch.ops.vmfdist.bessel_iv_ratio_approx(nu, z)[-3:].cpu()
    want = torch.ops.vmfdist.bessel_iv_ratio_approx(torch.tensor([100.0]), torch.tensor([50.0]))
    torch.testing.assert_close(out, want.expand(3), rtol=1e-6, atol=0)
