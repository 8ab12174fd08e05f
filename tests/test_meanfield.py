"""Tests of the fused mean-field Gaussian ops (csrc/include/vmfdist/meanfield.h): sampling
``loc + softplus(rho) * eps`` (optionally with the KL in the same pass), its gradients, and the
KL to a Gaussian prior.

References: mpmath for the scalar functions (a compiled driver of the header), NumPy's Philox
(tests/test_philox.py) and Box-Muller for the normals, torch.distributions' Normal-Normal KL in
float64, gradcheck, opcheck, hypothesis inputs including the extremes, and Monte Carlo moments
with tolerances from standard errors.
"""
from __future__ import annotations

import math
import os
import subprocess

import mpmath
import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vmfdist._ops import lib
from vmfdist.distributions import meanfield_kl, meanfield_sample
from vmfdist.testing import cpu_and_cuda

from .drivers import compile_driver
from .test_philox import np_stream_words

F64 = torch.float64
Z = 4.5  # standard errors allowed
EXAMPLES = int(os.environ.get("VMFDIST_HYPOTHESIS_EXAMPLES", "60"))


# ---------------------------------------------------------------------------------------------
# the scalar functions of the header against mpmath

@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    # -O3: the float functions must give these values when vectorised, as in the CPU kernels
    return compile_driver(tmp_path_factory, "meanfield_check", "-O3", "-fno-math-errno")


def _run_driver(exe, kind, xs):
    """Rows (x, e^{-|x|}, softplus, sigmoid, log softplus, sigmoid / softplus) as the CPU kernels
    compute them (the copy isa::dispatch runs), once the baseline copy is seen to print the same."""
    out = subprocess.run([exe, kind], input="\n".join(float(v).hex() for v in xs), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    lines = [line.split() for line in out if line]
    differ = [w[0] for w in lines if w[1:6] != w[6:11]]
    assert not differ, f"the two copies of isa::dispatch differ at x = {differ[:5]}"
    return np.array([[float.fromhex(a) for a in w[:6]] for w in lines])


def _exact(x):
    x = mpmath.mpf(x)
    t = mpmath.exp(-abs(x))
    sp = mpmath.log1p(mpmath.exp(x))
    sg = 1 / (1 + mpmath.exp(-x))
    return [t, sp, sg, mpmath.log(sp), sg / sp]


@pytest.mark.parametrize("kind", ["f", "d"])
def test_scalar_functions_against_mpmath(driver, kind):
    """e^{-|x|}, softplus, sigmoid, log softplus and sigmoid / softplus (the float polynomials and
    the double libm path) over the whole range, into the subnormal results and the closed forms
    below rho = -16 (float) / -40 (double)."""
    mpmath.mp.prec = 100
    fdt = np.float32 if kind == "f" else np.float64
    xs = np.concatenate([np.linspace(-110, 95, 4001), -np.logspace(-9, 2.3, 801), np.logspace(-9, 2, 801),
                         [0.0, -16.0, -15.99, -40.0, -39.99, -87.3, -103.9, -104.1]]).astype(fdt)
    rows = _run_driver(driver, kind, xs)
    eps = float(np.finfo(fdt).eps) / 2  # unit roundoff
    tiny = float(np.finfo(fdt).tiny)
    exact = np.array([[float(v) for v in _exact(x)] for x in rows[:, 0]])
    ulps = {"f": (2, 4, 4, 5), "d": (2, 3, 4, 5)}[kind]
    for k, name, tol in zip((0, 1, 2, 4), ("exp", "softplus", "sigmoid", "sigmoid/softplus"), ulps):
        got, ref = rows[:, k + 1], exact[:, k]
        normal = np.abs(ref) >= tiny
        rel = np.abs(got - ref)[normal] / np.abs(ref)[normal]
        assert rel.max() <= tol * eps, (name, rel.max() / eps, rows[normal, 0][np.argmax(rel)])
        # subnormal results: within one subnormal step
        assert np.all(np.abs(got - ref)[~normal] <= float(np.finfo(fdt).smallest_subnormal)), name
    # log softplus: absolute error (it is 0 at softplus = 1, where a relative error is meaningless)
    err = np.abs(rows[:, 4] - exact[:, 3]) / np.maximum(1.0, np.abs(exact[:, 3]))
    assert err.max() <= 4 * eps, err.max() / eps


@pytest.mark.parametrize("kind", ["f", "d"])
def test_scalar_functions_at_infinities_and_nan(driver, kind):
    rows = _run_driver(driver, kind, [-math.inf, math.inf, math.nan])
    # x = -inf: e^{-|x|} = 0, softplus 0, sigmoid 0, log softplus -inf, sigmoid / softplus -> 1
    assert list(rows[0, 1:4]) == [0.0, 0.0, 0.0] and rows[0, 4] == -math.inf and rows[0, 5] == 1.0
    # x = +inf: softplus inf, sigmoid 1
    assert rows[1, 1] == 0.0 and rows[1, 2] == math.inf and rows[1, 3] == 1.0
    assert np.isnan(rows[2, 2]) and np.isnan(rows[2, 3])


# ---------------------------------------------------------------------------------------------
# the sampling op against an independent reference

def _np_normals(seed, stream, n, float32):
    """Normals 0..n-1 of the Philox stream (seed, 0, stream) as meanfield.h defines them:
    Box-Muller on uniforms (2k + 1) / 2^24, k = word >> 9 (float32), or (k + 1/2) 2^-32 (others)."""
    words = np.array(np_stream_words(seed, 0, stream, (n + 3) // 4), dtype=np.uint64)
    if float32:
        u = ((words >> np.uint64(9)) * 2 + 1).astype(np.float64) / 2.0 ** 24
    else:
        u = (words.astype(np.float64) + 0.5) * 2.0 ** -32
    r, ang = np.sqrt(-2 * np.log(u[0::2])), 2 * np.pi * u[1::2]
    z = np.empty(2 * len(r))
    z[0::2], z[1::2] = r * np.cos(ang), r * np.sin(ang)
    return z[:n]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("with_loc", [True, False])
def test_sample_against_reference(dtype, with_loc):
    """out[s] = loc + softplus(rho) eps_s with eps_s the normals of stream s, for shapes shorter and
    longer than a chunk (1024), and rho across the range (incl. where sigma underflows)."""
    g = torch.Generator().manual_seed(0)
    for shape in [(3, 5), (2, 1500)]:
        loc = torch.randn(shape, generator=g, dtype=F64)
        rho = torch.empty(shape, dtype=F64).uniform_(-30, 10, generator=g)
        rho.view(-1)[:3] = torch.tensor([-100.0, 0.0, 50.0], dtype=F64)
        out = lib.meanfield_sample(loc.to(dtype) if with_loc else None, rho.to(dtype), None, None, 2, seed=9,
                                   offset=0)[0]
        sp = torch.nn.functional.softplus(rho.to(dtype).double()).numpy().reshape(-1)
        for s in range(2):
            eps = _np_normals(9, s, sp.size, dtype == torch.float32)
            ref = sp * eps + (loc.to(dtype).double().numpy().reshape(-1) if with_loc else 0.0)
            got = out[s].double().numpy().reshape(-1)
            scale = np.abs(sp * eps) + (np.abs(ref) if with_loc else 0.0)
            fi = np.finfo(np.float32 if dtype == torch.float32 else np.float64)
            # a few ulp, and where sigma is subnormal (rho = -100 in float32) a few subnormal steps
            tol = 16 * fi.eps * scale + 4 * float(fi.smallest_subnormal) * (1 + np.abs(eps))
            assert np.all(np.abs(got - ref) <= tol), np.max(np.abs(got - ref) - tol)


def test_sample_deterministic_and_thread_independent():
    loc, rho = torch.randn(7, 700), torch.randn(7, 700) - 2
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = lib.meanfield_sample(loc, rho, None, None, 3, seed=5, offset=2)[0]
        torch.set_num_threads(max(2, threads))
        b = lib.meanfield_sample(loc, rho, None, None, 3, seed=5, offset=2)[0]
        c = meanfield_sample(loc, rho, (3,), generator=torch.Generator().manual_seed(4))
        d = meanfield_sample(loc, rho, (3,), generator=torch.Generator().manual_seed(4))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b) and torch.equal(c, d)
    assert not torch.equal(a[0], a[1])
    # the normals are those of radial_noise's eps for a whole-tensor event (the same streams)
    z = lib.meanfield_sample(None, torch.full((5, 6), 30.0, dtype=F64), None, None, 2, seed=3, offset=0)[0] / 30.0
    w, coef, _, _ = lib.radial_noise(torch.zeros(5, 6, dtype=F64), torch.ones(5, 6, dtype=F64), 2, seed=3, offset=0)
    torch.testing.assert_close(z, w / coef.view(2, 1, 1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_sample_moments(dtype):
    """Mean and variance of every element over many draws against mu and softplus(rho)^2."""
    n = 4000
    loc = torch.tensor([0.5, -2.0, 0.0, 3.0], dtype=dtype)
    rho = torch.tensor([-3.0, 0.0, 1.5, -8.0], dtype=dtype)
    w = meanfield_sample(loc, rho, (n,), generator=torch.Generator().manual_seed(1)).double()
    sig = torch.nn.functional.softplus(rho.double())
    zs = ((w - loc.double()) / sig).numpy()
    assert np.all(np.abs(zs.mean(0)) <= Z / math.sqrt(n))
    assert np.all(np.abs((zs ** 2).mean(0) - 1) <= Z * math.sqrt(2 / n))
    for j in range(4):
        assert scipy.stats.kstest(zs[:, j], scipy.stats.norm.cdf).pvalue > 1e-4


def test_sample_gradients_unbiased():
    """d/drho E[sum w^2] = 2 sigma sigmoid(rho) and d/dmu = 2 mu: the average of the
    reparameterised gradients over independent draws, within standard errors."""
    loc = torch.tensor([0.3, -1.0, 2.0], dtype=F64, requires_grad=True)
    rho = torch.tensor([-1.0, 0.5, -4.0], dtype=F64, requires_grad=True)
    n = 4000
    w = lib.meanfield_sample(loc, rho, None, None, n, True, seed=11, offset=0)[0]
    per_draw_rho = 2 * w.detach() * ((w.detach() - loc.detach()) / torch.nn.functional.softplus(rho.detach())) \
        * torch.sigmoid(rho.detach())
    (w.square().sum() / n).backward()
    exact_rho = 2 * torch.nn.functional.softplus(rho.detach()) * torch.sigmoid(rho.detach())
    se = per_draw_rho.std(0) / math.sqrt(n)
    assert torch.all((rho.grad - exact_rho).abs() <= Z * se)
    se_mu = (2 * w.detach()).std(0) / math.sqrt(n)
    assert torch.all((loc.grad - 2 * loc.detach()).abs() <= Z * se_mu)
    # the op's gradient is exactly the mean of the per-draw gradients it estimates
    torch.testing.assert_close(rho.grad, per_draw_rho.mean(0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("num_samples", [1, 3])
@pytest.mark.parametrize("prior", ["none", "scalar", "full", "mixed"])
def test_sample_gradcheck(keep, num_samples, prior):
    g = torch.Generator().manual_seed(2)
    mu = torch.randn(4, 5, dtype=F64, generator=g).requires_grad_()
    rho = (3 * torch.randn(4, 5, dtype=F64, generator=g)).requires_grad_()
    m_full, s_full = torch.randn(4, 5, dtype=F64, generator=g), torch.rand(4, 5, dtype=F64, generator=g) + 0.5
    m, s = {"none": (None, None), "scalar": (torch.tensor(0.2, dtype=F64), torch.tensor(0.7, dtype=F64)),
            "full": (m_full, s_full), "mixed": (torch.tensor([0.1], dtype=F64), s_full)}[prior]

    def f(a, b):
        out, _, kl, _ = lib.meanfield_sample(a, b, m, s, num_samples, keep, seed=4, offset=1)
        return (out, kl) if m is not None else out

    assert torch.autograd.gradcheck(f, (mu, rho))
    if m is not None:  # the KL alone (no gradient flows into the samples)
        assert torch.autograd.gradcheck(lambda a, b: lib.meanfield_sample(a, b, m, s, num_samples, keep, seed=4,
                                                                          offset=1)[2], (mu, rho))
    # kept and regenerated normals give the same gradients, bit for bit
    grads = []
    for k in (False, True):
        a, b = mu.detach().clone().requires_grad_(), rho.detach().clone().requires_grad_()
        out, _, kl, _ = lib.meanfield_sample(a, b, m, s, num_samples, k, seed=4, offset=1)
        (out.sin().sum() + (kl if m is not None else 0)).backward()
        grads.append((a.grad, b.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert torch.autograd.gradcheck(lambda b: lib.meanfield_sample(None, b, None, None, num_samples, keep, seed=4,
                                                                   offset=1)[0], (rho,))


def test_sample_double_backward_refused():
    mu, rho = torch.zeros(3, dtype=F64, requires_grad=True), torch.zeros(3, dtype=F64, requires_grad=True)
    w = lib.meanfield_sample(mu, rho, None, None, 2)[0]
    with pytest.raises(RuntimeError, match="differentiable only once"):
        torch.autograd.grad(w.square().sum(), rho, create_graph=True)


# ---------------------------------------------------------------------------------------------
# the KL

def _torch_kl(mu, rho, m, s):
    q = torch.distributions.Normal(mu, torch.nn.functional.softplus(rho))
    return torch.distributions.kl_divergence(q, torch.distributions.Normal(m, s)).sum()


@pytest.mark.parametrize("dtype,rtol", [(F64, 1e-12), (torch.float32, 2e-6)])
def test_kl_against_torch_distributions(dtype, rtol):
    g = torch.Generator().manual_seed(3)
    mu = torch.randn(30, 70, dtype=F64, generator=g)
    rho = torch.empty(30, 70, dtype=F64).uniform_(-12, 4, generator=g)
    for m, s in [(torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)),
                 (torch.randn(30, 70, dtype=F64, generator=g), torch.rand(30, 70, dtype=F64, generator=g) + 0.1),
                 (torch.tensor([0.3], dtype=F64), torch.rand(30, 70, dtype=F64, generator=g) + 0.1)]:
        ref = _torch_kl(mu, rho, m, s)
        args = (mu.to(dtype), rho.to(dtype), m.to(dtype), s.to(dtype))
        got = lib.meanfield_kl(*args)
        assert got.dtype == dtype and got.shape == ()
        # the float32 terms are float computations of float32 inputs: compare with the float64
        # KL of those same inputs
        ref = _torch_kl(*(a.double() for a in args))
        assert float(got) == pytest.approx(float(ref), rel=rtol)
        # the KL computed in the sampling pass is the same number
        fused = lib.meanfield_sample(*args[:2], *args[2:], 2)[2]
        assert torch.equal(fused, got)


def test_kl_small_sigma_and_public_wrapper():
    """Where softplus(rho) underflows the KL stays finite and exact: log sigma = rho."""
    mu, rho = torch.zeros(2, dtype=F64), torch.tensor([-200.0, -50.0], dtype=F64)
    exact = float(sum(-r + 0.5 * (float(mpmath.log1p(mpmath.exp(r))) ** 2) - 0.5 for r in (-200.0, -50.0)))
    assert float(lib.meanfield_kl(mu, rho, torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64))) == \
        pytest.approx(exact, rel=1e-14)
    kl32 = lib.meanfield_kl(mu.float(), rho.float(), torch.tensor(0.0), torch.tensor(1.0))
    assert float(kl32) == pytest.approx(exact, rel=1e-6)
    assert float(meanfield_kl(mu, rho)) == pytest.approx(exact, rel=1e-14)
    with pytest.raises(ValueError, match="prior_scale must be positive"):
        meanfield_kl(mu, rho, 0.0, -1.0)
    with pytest.raises(ValueError, match="prior_loc"):
        meanfield_kl(mu, rho, torch.zeros(3), 1.0)


def test_kl_gradcheck_including_the_prior():
    g = torch.Generator().manual_seed(4)
    mu = torch.randn(3, 4, dtype=F64, generator=g).requires_grad_()
    rho = (2 * torch.randn(3, 4, dtype=F64, generator=g)).requires_grad_()
    for m, s in [(torch.randn((), dtype=F64, generator=g), torch.rand((), dtype=F64, generator=g) + 0.5),
                 (torch.randn(3, 4, dtype=F64, generator=g), torch.rand(3, 4, dtype=F64, generator=g) + 0.5)]:
        assert torch.autograd.gradcheck(lib.meanfield_kl, (mu, rho, m.requires_grad_(), s.requires_grad_()))


def test_opcheck():
    g = torch.Generator().manual_seed(5)
    mu, rho = torch.randn(4, 6, dtype=F64, generator=g), torch.randn(4, 6, dtype=F64, generator=g)
    m, s = torch.tensor(0.1, dtype=F64), torch.rand(4, 6, dtype=F64, generator=g) + 0.5
    rnd = {"seed": 7, "offset": 0}
    torch.library.opcheck(lib.meanfield_sample, (mu, rho, None, None, 3, True), rnd)
    torch.library.opcheck(lib.meanfield_sample, (mu.requires_grad_(), rho.requires_grad_(), m, s, 2, False), rnd)
    torch.library.opcheck(lib.meanfield_sample, (None, rho, None, None, 3), rnd)
    torch.library.opcheck(lib.meanfield_kl, (mu, rho, m, s))
    mu, rho = mu.detach(), rho.detach()
    out, noise, _, so = lib.meanfield_sample(mu, rho, None, None, 3, True, **rnd)
    grad = torch.randn(3, 4, 6, dtype=F64, generator=g)
    torch.library.opcheck(lib.meanfield_sample_backward, (grad, rho, so, noise, None, None, None, None, False))
    torch.library.opcheck(lib.meanfield_sample_backward, (grad, rho, so, None, mu, m, s, torch.tensor(2.0, dtype=F64),
                                                          True))
    torch.library.opcheck(lib.meanfield_kl_backward, (torch.tensor(1.5, dtype=F64), mu, rho, m, s))


def test_bad_input_names_the_argument():
    mu, rho = torch.zeros(2, 3), torch.zeros(2, 3)
    cases = [
        (lambda: lib.meanfield_sample(torch.zeros(3, 2), rho, None, None, 1), "loc and rho must have the same shape"),
        (lambda: lib.meanfield_sample(mu.double(), rho, None, None, 1), "loc and rho must have the same dtype"),
        (lambda: lib.meanfield_sample(mu, rho, None, None, -1), "num_samples must be non-negative"),
        (lambda: lib.meanfield_sample(mu, rho, torch.tensor(0.0), None, 1), "both prior_loc and prior_scale"),
        (lambda: lib.meanfield_sample(None, rho, torch.tensor(0.0), torch.tensor(1.0), 1), "needs loc"),
        (lambda: lib.meanfield_sample(mu, rho, torch.zeros(3), torch.tensor(1.0), 1), "prior_loc must have a single"),
        (lambda: lib.meanfield_sample(mu, rho, torch.tensor(0.0, dtype=F64), torch.tensor(1.0), 1), "prior_loc must "
                                                                                                     "have rho's dtype"),
        (lambda: lib.meanfield_sample(mu, torch.zeros(2, 3, dtype=torch.int64), None, None, 1), "rho must be a floating"),
        (lambda: lib.meanfield_kl(mu, rho, torch.tensor(0.0), torch.ones(2)), "prior_scale must have a single"),
        (lambda: lib.meanfield_sample(mu, rho, None, None, 1, seed=-1), "seed must be in"),
        (lambda: lib.meanfield_sample(mu, rho, None, None, 1, offset=3), "offset needs an explicit seed"),
    ]
    for fn, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            fn()
    _, noise, _, so = lib.meanfield_sample(mu, rho, None, None, 2, True, seed=1, offset=0)
    with pytest.raises(RuntimeError, match="grad must have shape"):
        lib.meanfield_sample_backward(torch.zeros(2, 3, 2), rho, so, None, None, None, None, None, False)
    with pytest.raises(RuntimeError, match="noise must be meanfield_sample's kept normals"):
        lib.meanfield_sample_backward(torch.zeros(2, 2, 3), rho, so, noise[:1], None, None, None, None, False)
    with pytest.raises(RuntimeError, match="loc_grad needs loc"):
        lib.meanfield_sample_backward(torch.zeros(2, 2, 3), rho, so, noise, None, None, None, None, True)
    with pytest.raises(ValueError, match="loc and rho must have the same shape"):
        meanfield_sample(torch.zeros(3), torch.zeros(4))


def test_empty_and_zero_samples():
    out, noise, kl, _ = lib.meanfield_sample(torch.zeros(0, 3), torch.zeros(0, 3), torch.tensor(0.0),
                                             torch.tensor(1.0), 2, True)
    assert out.shape == (2, 0, 3) and noise.shape == (2, 0, 3) and float(kl) == 0.0
    out, _, kl, _ = lib.meanfield_sample(torch.zeros(3), torch.zeros(3), torch.tensor(0.0), torch.tensor(1.0), 0)
    assert out.shape == (0, 3)
    assert float(kl) == pytest.approx(float(_torch_kl(torch.zeros(3), torch.zeros(3), 0.0, 1.0)), rel=1e-6)


@settings(max_examples=EXAMPLES, deadline=None)
@given(rho=st.lists(st.one_of(st.floats(-300, 300), st.sampled_from([-104.0, -87.0, -16.0, -40.0, 0.0, 88.0])),
                    min_size=1, max_size=9),
       mu=st.floats(-1e6, 1e6), m=st.floats(-10, 10), s=st.floats(1e-3, 1e3), dtype=st.sampled_from([F64,
                                                                                                  torch.float32]))
def test_hypothesis_extremes(rho, mu, m, s, dtype):
    """Any finite rho and loc: finite samples and gradients, the KL equal to the float64 formula
    (with log sigma = rho where sigma underflows), and finite KL gradients."""
    r = torch.tensor(rho, dtype=dtype)
    loc = torch.full_like(r, mu)
    pm, ps = torch.tensor(m, dtype=dtype), torch.tensor(s, dtype=dtype)
    rr, ll = r.clone().requires_grad_(), loc.clone().requires_grad_()
    out, _, kl, _ = lib.meanfield_sample(ll, rr, pm, ps, 2, True, seed=3, offset=0)
    r64 = r.double()
    # softplus exactly (torch's F.softplus returns rho itself above its threshold 20, off by
    # e^-rho: 7.6e-10 at rho = 21, which the float64 KL resolves)
    sig = r64.clamp_min(0) + torch.log1p(torch.exp(-r64.abs()))
    assert torch.isfinite(out).all() or not torch.isfinite(sig.to(dtype)).all()
    log_sig = torch.where(r64 < -30, r64, torch.log(sig))
    quad = (sig ** 2 + (loc.double() - pm.double()) ** 2) / (2 * ps.double() ** 2)
    ref = torch.log(ps.double()) - log_sig + quad - 0.5
    tol = 1e-12 if dtype == F64 else 2e-6
    # the error of a sum is relative to its terms, not to the result: where sigma ~ s the KL is
    # a cancellation (e.g. rho = 9, s = 9: terms ~2, KL 1.9e-10), exact only to ~eps * the terms
    scale = float((torch.log(ps.double()).abs() + log_sig.abs() + quad + 0.5).sum())
    assert float(kl.detach()) == pytest.approx(float(ref.sum()), rel=tol, abs=tol * scale + 1e-30)
    (out.sum() + kl).backward()
    if bool(torch.isfinite(sig.to(dtype) ** 2 / ps.double() ** 2).all()):
        assert torch.isfinite(rr.grad).all() and torch.isfinite(ll.grad).all()


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_devices_agree(device, dtype, tol):
    """The same (seed, offset) on another device: the same samples up to the rounding of libm vs
    CUDA (double) -- the float path is the same float operations --, the same KL up to the
    summation order, the same gradients with kept and with regenerated normals."""
    g = torch.Generator().manual_seed(6)
    for shape in [(3, 5), (2, 3, 1100)]:
        mu = torch.randn(shape, generator=g, dtype=F64).to(dtype)
        rho = (torch.randn(shape, generator=g, dtype=F64) - 2).to(dtype)
        m, s = torch.tensor(0.2, dtype=dtype), torch.rand(shape, generator=g, dtype=F64).to(dtype) + 0.5
        res = []
        for dev in ("cpu", device):
            # detach: mu.to("cpu") is mu itself, which must stay a leaf without grad for the next device
            a, b = mu.to(dev).detach().requires_grad_(), rho.to(dev).detach().requires_grad_()
            out, _, kl, so = lib.meanfield_sample(a, b, m.to(dev), s.to(dev), 3, dev == "cpu", seed=17, offset=6)
            assert so.device.type == dev and so.cpu().tolist() == [17, 6]
            (out.sin().sum() + kl).backward()
            res.append([t.detach().cpu() for t in (out, kl, a.grad, b.grad)])
        for x, y in zip(*res):
            torch.testing.assert_close(y, x, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# the public functions the mean-field layers call: save_noise, the fused sample + KL, validate_args


def test_sample_kl_is_sample_and_kl_in_one_pass():
    """meanfield_sample_kl gives meanfield_sample's samples and meanfield_kl's value for the same
    generator, and the gradient of a loss through both is the sum of the two separate gradients;
    save_noise changes neither values nor gradients."""
    from vmfdist.distributions import meanfield_sample_kl

    g = torch.Generator().manual_seed(11)
    mu0, rho0 = torch.randn(4, 6, dtype=F64, generator=g), torch.randn(4, 6, dtype=F64, generator=g) - 1
    c = torch.randn(2, 4, 6, dtype=F64, generator=g)
    for m, s in [(0.0, 1.0), (torch.tensor(0.3, dtype=F64), torch.rand(4, 6, dtype=F64, generator=g) + 0.5)]:
        res = []
        for save in (False, True):
            mu, rho = mu0.clone().requires_grad_(), rho0.clone().requires_grad_()
            w, kl = meanfield_sample_kl(mu, rho, m, s, (2,), torch.Generator().manual_seed(3), save_noise=save)
            assert w.shape == (2, 4, 6) and kl.shape == ()
            res.append([t.detach() for t in (w, kl, *torch.autograd.grad((w * c).sum() + kl, (mu, rho)))])
            mu2, rho2 = mu0.clone().requires_grad_(), rho0.clone().requires_grad_()
            w2 = meanfield_sample(mu2, rho2, (2,), torch.Generator().manual_seed(3), save_noise=save)
            kl2 = meanfield_kl(mu2, rho2, m, s)
            assert torch.equal(w.detach(), w2.detach()) and torch.equal(kl.detach(), kl2.detach())
            g2 = torch.autograd.grad((w2 * c).sum() + kl2, (mu2, rho2))
            for a, b in zip(res[-1][2:], g2):
                torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)
        for a, b in zip(*res):
            assert torch.equal(a, b)
    # sample shapes of any length, and loc=None for meanfield_sample only
    w, kl = meanfield_sample_kl(mu0, rho0, sample_shape=(2, 3))
    assert w.shape == (2, 3, 4, 6)
    assert meanfield_sample(None, rho0, ()).shape == (4, 6)


def test_validate_args_skips_only_the_read_back():
    """validate_args=False skips the check prior_scale > 0 (a device read-back); types, shapes and
    devices are still checked, with the same messages."""
    from vmfdist.distributions import meanfield_sample_kl

    mu, rho = torch.zeros(2, 3, dtype=F64), torch.zeros(2, 3, dtype=F64)
    neg = torch.tensor(-1.0, dtype=F64)
    with pytest.raises(ValueError, match="meanfield_kl: prior_scale must be positive"):
        meanfield_kl(mu, rho, 0.0, neg)
    with pytest.raises(ValueError, match="meanfield_sample_kl: prior_scale must be positive"):
        meanfield_sample_kl(mu, rho, 0.0, neg)
    assert torch.isnan(meanfield_kl(mu, rho, 0.0, neg, validate_args=False))  # log of a negative scale
    meanfield_sample_kl(mu, rho, 0.0, neg, validate_args=False)
    for kw in ({}, {"validate_args": False}):
        with pytest.raises(ValueError, match="prior_loc must be a number, a one-element tensor or have rho's shape"):
            meanfield_kl(mu, rho, torch.zeros(3, dtype=F64), 1.0, **kw)
        with pytest.raises(ValueError, match="meanfield_sample_kl: prior_scale must be a number"):
            meanfield_sample_kl(mu, rho, 0.0, torch.ones(3, dtype=F64), **kw)
        with pytest.raises(ValueError, match="loc and rho must have the same shape"):
            meanfield_sample_kl(torch.zeros(3, dtype=F64), rho, **kw)
        with pytest.raises(TypeError, match="meanfield_sample_kl: loc must be a tensor, got None"):
            meanfield_sample_kl(None, rho, **kw)
        with pytest.raises(TypeError, match="meanfield_sample_kl: prior_loc must be real"):
            meanfield_sample_kl(mu, rho, 1j, 1.0, **kw)
    with pytest.raises(ValueError, match="meanfield_sample_kl: sample_shape must hold sizes"):
        meanfield_sample_kl(mu, rho, sample_shape=(-1,))
    with pytest.raises(TypeError, match="meanfield_sample_kl: generator must be a torch.Generator"):
        meanfield_sample_kl(mu, rho, generator=1)
    # float32 priors under float64 parameters are cast (what the layers' buffers may be)
    kl32 = meanfield_kl(mu, rho, torch.tensor(0.5), torch.tensor(2.0))
    assert kl32.dtype == F64 and torch.equal(kl32, meanfield_kl(mu, rho, 0.5, 2.0))


def test_kl_diag_normal_is_the_sum_of_torchs_normal_kl():
    """distributions.kl.kl_diag_normal (the mean-field layers' closed form from tensors) against
    torch's registered Normal || Normal, for number, 0-dim, full and broadcasting prior parameters,
    and a float32 prior under float64 parameters."""
    from vmfdist.distributions.kl import kl_diag_normal

    g = torch.Generator().manual_seed(12)
    mu, sig = torch.randn(5, 7, dtype=F64, generator=g), torch.rand(5, 7, dtype=F64, generator=g) + 0.1
    for m, s in [(0.0, 1.0), (torch.tensor(0.2, dtype=F64), torch.tensor(0.7, dtype=F64)),
                 (torch.randn(5, 7, dtype=F64, generator=g), torch.rand(5, 7, dtype=F64, generator=g) + 0.3),
                 (torch.zeros(5, 1, dtype=F64), torch.linspace(0.5, 1.5, 5, dtype=F64).reshape(5, 1)),
                 (torch.tensor(0.2), torch.tensor(0.7))]:
        mt, st_ = (torch.as_tensor(x, dtype=F64) for x in (m, s))
        ref = torch.distributions.kl_divergence(torch.distributions.Normal(mu, sig),
                                                torch.distributions.Normal(mt, st_)).sum()
        got = kl_diag_normal(mu, sig, m, s)
        assert got.shape == () and got.dtype == F64
        torch.testing.assert_close(got, ref, rtol=1e-13, atol=1e-13)
