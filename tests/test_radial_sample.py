"""Tests of ``radial_sample`` -- the Radial layers' fused draw: ``radial_noise`` with the scale
``softplus(rho)`` computed inside and, with a Gaussian prior, the KL in the same pass -- and of its
public wrappers ``radial_sample`` / ``radial_sample_kl``.

References: the unfused ops (``radial_noise`` with torch's softplus: the same streams), the closed
form of KL(Radial || Normal) built on ``Radial.entropy`` (``kl_radial_normal``), float64 gradcheck,
and autograd through the unfused composition.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vmfdist import nn as bnn
from vmfdist._ops import lib
from vmfdist.distributions import Radial, radial_sample, radial_sample_kl
from vmfdist.distributions.kl import kl_radial_normal, kl_radial_normal_softplus
from vmfdist.testing import cpu_and_cuda

F64 = torch.float64


def _inputs(shape, seed=0, dtype=F64, full_prior=False):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(shape, generator=g, dtype=F64)
    rho = torch.randn(shape, generator=g, dtype=F64) - 3
    m = torch.randn(shape, generator=g, dtype=F64) * 0.1 if full_prior else torch.tensor(0.1, dtype=F64)
    s = torch.rand(shape, generator=g, dtype=F64) + 0.3 if full_prior else torch.tensor(0.7, dtype=F64)
    return tuple(t.to(dtype) for t in (mu, rho, m, s))


@pytest.mark.parametrize("dtype,rtol", [(F64, 1e-13), (torch.float32, 2e-6)])
@pytest.mark.parametrize("shape", [(37, 300), (5,), (3, 4100)])
def test_samples_are_radial_noise_with_the_softplus_scale(dtype, rtol, shape):
    """The same eps and coef as radial_noise for the same (seed, offset) -- bitwise -- and the same
    samples as radial_noise(loc, softplus(rho)) up to the rounding of the two softplus codes."""
    mu, rho, m, s = _inputs(shape, 1, dtype)
    out, coef, so, noise, kl = lib.radial_sample(mu, rho, m, s, 3, True, seed=5, offset=2)
    ref, rcoef, rso, rnoise = lib.radial_noise(mu, F.softplus(rho), 3, False, True, seed=5, offset=2)
    assert torch.equal(coef, rcoef) and torch.equal(noise, rnoise) and torch.equal(so, rso)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=rtol * float(ref.abs().max()))
    bare = lib.radial_sample(mu, rho, None, None, 3, False, seed=5, offset=2)
    assert torch.equal(bare[0], out) and bare[3].numel() == 0 and float(bare[4]) == 0.0


@pytest.mark.parametrize("full_prior", [False, True])
@pytest.mark.parametrize("shape", [(1,), (7,), (37, 300)])
def test_kl_is_the_closed_form(full_prior, shape):
    """KL(Radial(mu, softplus(rho)) || N(m, s^2)) with the constant passed as kl_offset: the
    closed form of kl_radial_normal (cross-entropy minus Radial.entropy), float64."""
    mu, rho, m, s = _inputs(shape, 2, full_prior=full_prior)
    _, kl = radial_sample_kl(mu, rho, m, s, (2,), generator=torch.Generator().manual_seed(0))
    ref = kl_radial_normal(Radial(mu, F.softplus(rho)), m, s)
    torch.testing.assert_close(kl, ref, rtol=1e-12, atol=1e-9)
    # zero samples: the KL alone
    out, kl0 = radial_sample_kl(mu, rho, m, s, (0,))
    assert out.shape == (0,) + shape
    torch.testing.assert_close(kl0, ref, rtol=1e-12, atol=1e-9)


def test_kl_float32_matches_float64():
    mu, rho, m, s = _inputs((50, 800), 3)
    kl64 = radial_sample_kl(mu, rho, m, s, (1,))[1]
    kl32 = radial_sample_kl(mu.float(), rho.float(), m.float(), s.float(), (1,))[1]
    assert abs(float(kl32) - float(kl64)) <= 1e-5 * abs(float(kl64))


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("num_samples", [1, 3])
@pytest.mark.parametrize("full_prior", [False, True])
def test_gradcheck(keep, num_samples, full_prior):
    mu, rho, m, s = _inputs((3, 5), 4, full_prior=full_prior)
    mu.requires_grad_(), rho.requires_grad_()

    def f(a, b):
        out, _, _, _, kl = lib.radial_sample(a, b, m, s, num_samples, keep, 0.25, seed=9, offset=4)
        return out, kl
    assert torch.autograd.gradcheck(f, (mu, rho))
    assert torch.autograd.gradcheck(lambda b: lib.radial_sample(mu.detach(), b, None, None, num_samples, keep,
                                                                seed=9, offset=4)[0], (rho,))


@pytest.mark.parametrize("dtype,rtol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_gradients_equal_the_unfused_composition(dtype, rtol):
    """d/d(mu, rho) of sum(w * out) + c * KL: the fused backward against autograd through
    radial_noise(mu, softplus(rho)) and kl_radial_normal_softplus (meanfield_kl + a squared sum)."""
    mu, rho, m, s = _inputs((40, 130), 5, dtype)
    w = torch.randn((3, 40, 130), generator=torch.Generator().manual_seed(1), dtype=F64).to(dtype)
    grads = []
    for fused in (True, False):
        a, b = mu.clone().requires_grad_(), rho.clone().requires_grad_()
        if fused:
            out, _, _, _, kl = lib.radial_sample(a, b, m, s, 3, False, seed=2, offset=0)
        else:
            out = lib.radial_noise(a, F.softplus(b), 3, False, False, seed=2, offset=0)[0]
            kl = kl_radial_normal_softplus(a, b, m, s)
        ((out * w).sum() + 0.3 * kl).backward()
        grads.append((a.grad, b.grad))
    for x, y in zip(*grads):
        torch.testing.assert_close(x, y, rtol=rtol, atol=rtol * float(y.abs().max()))


def test_deterministic_and_thread_independent():
    mu, rho, m, s = _inputs((3, 9000), 6, torch.float32)
    threads = torch.get_num_threads()
    try:
        res = []
        for t in (1, max(2, threads)):
            torch.set_num_threads(t)
            a, b = mu.clone().requires_grad_(), rho.clone().requires_grad_()
            out, _, _, _, kl = lib.radial_sample(a, b, m, s, 2, False, seed=3, offset=1)
            (out.sin().sum() + kl).backward()
            res.append((out, kl, a.grad, b.grad))
    finally:
        torch.set_num_threads(threads)
    for x, y in zip(*res):
        assert torch.equal(x, y)


def test_extremes_and_empty():
    # sigma underflows (rho = -100) or is huge: the KL and its gradients stay finite (closed forms
    # for log sigma and sigmoid / sigma below rho = -16 / -40)
    for dtype in (torch.float32, F64):
        mu = torch.zeros(6, dtype=dtype, requires_grad=True)
        rho = torch.tensor([-100.0, -30.0, -1.0, 0.0, 5.0, 40.0], dtype=dtype, requires_grad=True)
        out, kl = radial_sample_kl(mu, rho, 0.0, 1.0, (2,))
        (out.sum() + kl).backward()
        assert torch.isfinite(out).all() and torch.isfinite(kl)
        assert torch.isfinite(mu.grad).all() and torch.isfinite(rho.grad).all()
        ref = kl_radial_normal(Radial(mu.detach().double(), F.softplus(rho.detach().double())), 0.0, 1.0)
        if dtype == F64:  # (the float64 closed form itself: log(softplus(-100)) is finite there)
            torch.testing.assert_close(kl.double(), ref, rtol=1e-12, atol=1e-9)
    # NaN in rho gives NaN, not a crash
    out, kl = radial_sample_kl(torch.zeros(3), torch.tensor([0.0, float("nan"), 1.0]), 0.0, 1.0, (1,))
    assert torch.isnan(kl) and torch.isnan(out).any()
    # an empty tensor: no samples to draw, a KL of zero
    out, kl = radial_sample_kl(torch.zeros(0, 4), torch.zeros(0, 4), 0.0, 1.0, (2,))
    assert out.shape == (2, 0, 4) and float(kl) == 0.0
    # half precision draws in float (its op-math type)
    h = radial_sample(torch.zeros(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float16), (2,))
    assert h.dtype == torch.float16 and h.shape == (2, 8) and torch.isfinite(h).all()


def test_bad_input_names_the_argument():
    mu, rho = torch.zeros(3, 4), torch.zeros(3, 4)
    with pytest.raises(ValueError, match="loc and rho must have the same shape"):
        radial_sample(torch.zeros(4), rho)
    with pytest.raises(ValueError, match="prior_scale must be positive"):
        radial_sample_kl(mu, rho, 0.0, -1.0)
    with pytest.raises(ValueError, match="prior_loc must be"):
        radial_sample_kl(mu, rho, torch.zeros(5), 1.0)
    with pytest.raises(TypeError, match="loc must be a tensor"):
        radial_sample(None, rho)
    with pytest.raises(RuntimeError, match="pass both prior_loc and prior_scale"):
        lib.radial_sample(mu, rho, torch.zeros(()), None, 1)
    with pytest.raises(RuntimeError, match="loc and rho must have the same dtype"):
        lib.radial_sample(mu.double(), rho, None, None, 1)
    with pytest.raises(RuntimeError, match="num_samples must be non-negative"):
        lib.radial_sample(mu, rho, None, None, -1)
    with pytest.raises(RuntimeError, match="coef must have shape"):
        lib.radial_sample_backward(torch.zeros(2, 3, 4), mu, rho, torch.zeros(3, dtype=F64),
                                   torch.tensor([1, 0]), None, None, None, None)
    with pytest.raises(RuntimeError, match="the KL's gradient needs prior_loc"):
        lib.radial_sample_backward(torch.zeros(2, 3, 4), mu, rho, torch.zeros(2, dtype=F64),
                                   torch.tensor([1, 0]), None, None, None, torch.ones(()))


def test_double_backward_refused_and_prior_not_differentiable():
    mu, rho = torch.zeros(3, dtype=F64, requires_grad=True), torch.zeros(3, dtype=F64, requires_grad=True)
    w = lib.radial_sample(mu, rho, None, None, 2)[0]
    with pytest.raises(RuntimeError, match="differentiable only once"):
        torch.autograd.grad(w.square().sum(), rho, create_graph=True)
    s = torch.ones((), dtype=F64, requires_grad=True)
    kl = lib.radial_sample(mu, rho, torch.zeros((), dtype=F64), s, 1)[4]
    with pytest.raises(RuntimeError, match="no gradient with respect to the prior"):
        kl.backward()


def test_opcheck():
    mu, rho, m, s = _inputs((3, 5), 7)
    rnd = {"seed": 4, "offset": 2}
    torch.library.opcheck(lib.radial_sample, (mu, rho, m, s, 3, True, 1.5), rnd)
    torch.library.opcheck(lib.radial_sample, (mu.requires_grad_(), rho.requires_grad_(), m, s, 2), rnd)
    torch.library.opcheck(lib.radial_sample, (mu, rho, None, None, 0), rnd)
    out, coef, so, noise, _ = lib.radial_sample(mu.detach(), rho.detach(), None, None, 2, True, **rnd)
    grad = torch.randn_like(out)
    torch.library.opcheck(lib.radial_sample_backward, (grad, mu.detach(), rho.detach(), coef, so, noise, None, None,
                                                       None, False))
    torch.library.opcheck(lib.radial_sample_backward, (grad, mu.detach(), rho.detach(), coef, so, None, m, s,
                                                       torch.tensor(2.0, dtype=F64)))


@pytest.mark.parametrize("device", cpu_and_cuda())
@pytest.mark.parametrize("dtype,tol", [(F64, 1e-12), (torch.float32, 1e-5)])
def test_devices_agree(device, dtype, tol):
    mu, rho, m, s = _inputs((2, 3, 1100), 8, dtype, full_prior=True)
    res = []
    for dev in ("cpu", device):
        a, b = mu.to(dev).detach().requires_grad_(), rho.to(dev).detach().requires_grad_()
        out, _, so, _, kl = lib.radial_sample(a, b, m.to(dev), s.to(dev), 3, dev == "cpu", 0.5, seed=17, offset=6)
        assert so.device.type == dev and so.cpu().tolist() == [17, 6]
        (out.sin().sum() + kl).backward()
        res.append([t.detach().cpu() for t in (out, kl, a.grad, b.grad)])
    for x, y in zip(*res):
        torch.testing.assert_close(y, x, rtol=tol, atol=tol * max(1.0, float(x.abs().max())))


# ---------------------------------------------------------------------------------------------
# the layers: the KL computed with the training step's weights


@pytest.mark.parametrize("cls", ["linear", "conv"])
def test_layer_takes_the_kl_of_its_forward_pass(cls):
    """A training forward pass computes the KL with the weights (one radial_sample node), which
    kl_divergence() hands out once; an in-place update makes the layer recompute it; the value is
    the closed form either way."""
    torch.manual_seed(0)
    layer = bnn.RadialLinear(30, 20, prior=0.5) if cls == "linear" else bnn.RadialConv2d(3, 4, 3, prior=0.5)
    x = torch.randn(8, 30) if cls == "linear" else torch.randn(2, 3, 6, 6)
    layer(x).sum().backward()  # (the graph of this pass is freed: its KL is stale)
    layer(x)
    kl = layer.kl_divergence()
    assert "radial_sample" in type(kl.grad_fn.next_functions[0][0]).__name__
    ref = (kl_radial_normal(Radial(layer.weight_mu.detach(), F.softplus(layer.weight_rho.detach())), 0.0, 0.5)
           + kl_radial_normal(Radial(layer.bias_mu.detach(), F.softplus(layer.bias_rho.detach())), 0.0, 0.5))
    torch.testing.assert_close(kl.detach(), ref, rtol=1e-5, atol=1e-3)
    again = layer.kl_divergence()  # handed out once: recomputed by the unfused closed form
    assert "radial_sample" not in type(again.grad_fn.next_functions[0][0]).__name__
    torch.testing.assert_close(again.detach(), ref, rtol=1e-5, atol=1e-3)
    layer(x)
    with torch.no_grad():
        layer.weight_mu.add_(0.1)
    moved = layer.kl_divergence()
    ref = (kl_radial_normal(Radial(layer.weight_mu.detach(), F.softplus(layer.weight_rho.detach())), 0.0, 0.5)
           + kl_radial_normal(Radial(layer.bias_mu.detach(), F.softplus(layer.bias_rho.detach())), 0.0, 0.5))
    torch.testing.assert_close(moved.detach(), ref, rtol=1e-5, atol=1e-3)


def test_layer_kl_gradient_is_the_closed_forms():
    torch.manual_seed(1)
    layer = bnn.RadialLinear(12, 7, prior=0.8).double()
    x = torch.randn(5, 12, dtype=F64)
    (layer(x).sum() * 0 + layer.kl_divergence()).backward()
    fused = [p.grad.clone() for p in (layer.weight_mu, layer.weight_rho, layer.bias_mu, layer.bias_rho)]
    layer.zero_grad()
    s = layer.prior.param_scale  # (0.8 rounded to float32 when the layer was made, then float64)
    ref = (kl_radial_normal(Radial(layer.weight_mu, F.softplus(layer.weight_rho)), 0.0, s)
           + kl_radial_normal(Radial(layer.bias_mu, F.softplus(layer.bias_rho)), 0.0, s))
    ref.backward()
    for a, p in zip(fused, (layer.weight_mu, layer.weight_rho, layer.bias_mu, layer.bias_rho)):
        torch.testing.assert_close(a, p.grad, rtol=1e-10, atol=1e-12)
    assert math.isfinite(float(ref.detach()))
