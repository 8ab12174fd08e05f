"""Fake kernels and autograd of the mean-field Gaussian ops (``csrc/include/vmfdist/meanfield.h``):
sampling ``loc + softplus(rho) * eps`` (optionally with the KL to a Gaussian prior in the same
pass) and the KL alone.
"""
from __future__ import annotations

import torch

from ._lib import _check_same_device, _once_differentiable, lib


def _check_like_rho(op, name, x, rho):
    _check_same_device(op, rho=rho, **{name: x})
    torch._check(x.dtype == rho.dtype, lambda: f"{op}: {name} and rho must have the same dtype, got {x.dtype} and "
                                               f"{rho.dtype}")
    torch._check(x.shape == rho.shape, lambda: f"{op}: {name} and rho must have the same shape, got "
                                               f"{tuple(x.shape)} and {tuple(rho.shape)}")


def _check_prior(op, rho, prior_loc, prior_scale):
    for name, p in (("prior_loc", prior_loc), ("prior_scale", prior_scale)):
        _check_same_device(op, rho=rho, **{name: p})
        torch._check(p.dtype == rho.dtype, lambda: f"{op}: {name} must have rho's dtype {rho.dtype}, got {p.dtype}")
        torch._check(p.numel() == 1 or p.shape == rho.shape,
                     lambda: f"{op}: {name} must have a single element or rho's shape {tuple(rho.shape)}, got "
                             f"{tuple(p.shape)}")


def _noise_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- fake kernels (the same checks and shapes as csrc/host/meanfield_host.h) --------------

@torch.library.register_fake("vmfdist::meanfield_sample")
def _(loc, rho, prior_loc, prior_scale, num_samples, save_noise=False, *, generator=None, seed=None, offset=None):
    op = "meanfield_sample"
    torch._check(rho.dtype.is_floating_point, lambda: f"{op}: rho must be a floating tensor, got {rho.dtype}")
    if loc is not None:
        _check_like_rho(op, "loc", loc, rho)
    torch._check(num_samples >= 0, lambda: f"{op}: num_samples must be non-negative, got {num_samples}")
    torch._check((prior_loc is None) == (prior_scale is None),
                 lambda: f"{op}: pass both prior_loc and prior_scale, or neither")
    if prior_loc is not None:
        torch._check(loc is not None, lambda: f"{op}: the KL (prior_loc, prior_scale) needs loc")
        _check_prior(op, rho, prior_loc, prior_scale)
    shape = (num_samples,) + tuple(rho.shape)
    noise = rho.new_empty(shape if save_noise else (0,), dtype=_noise_dtype(rho.dtype))
    return rho.new_empty(shape), noise, rho.new_empty(()), rho.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake("vmfdist::meanfield_sample_backward")
def _(grad, rho, seed_offset, noise, loc, prior_loc, prior_scale, grad_kl, loc_grad):
    op = "meanfield_sample_backward"
    torch._check(grad.dim() == rho.dim() + 1 and grad.shape[1:] == rho.shape,
                 lambda: f"{op}: grad must have shape (num_samples, *rho.shape)")
    torch._check(not loc_grad or loc is not None, lambda: f"{op}: loc_grad needs loc")
    if grad_kl is not None:
        torch._check(loc is not None and prior_loc is not None and prior_scale is not None,
                     lambda: f"{op}: the KL's gradient needs loc, prior_loc and prior_scale")
        _check_prior(op, rho, prior_loc, prior_scale)
    return rho.new_empty(rho.shape if loc_grad else (0,)), rho.new_empty(rho.shape)


def _check_kl_fake(op, loc, rho, prior_loc, prior_scale):
    torch._check(rho.dtype.is_floating_point, lambda: f"{op}: rho must be a floating tensor, got {rho.dtype}")
    _check_like_rho(op, "loc", loc, rho)
    _check_prior(op, rho, prior_loc, prior_scale)


@torch.library.register_fake("vmfdist::meanfield_kl")
def _(loc, rho, prior_loc, prior_scale):
    _check_kl_fake("meanfield_kl", loc, rho, prior_loc, prior_scale)
    return rho.new_empty(())


@torch.library.register_fake("vmfdist::meanfield_kl_backward")
def _(grad, loc, rho, prior_loc, prior_scale):
    _check_kl_fake("meanfield_kl_backward", loc, rho, prior_loc, prior_scale)
    return rho.new_empty(rho.shape), rho.new_empty(rho.shape)


# ---- autograd ------------------------------------------------------------------------------

def _sample_setup(ctx, inputs, keyword_only_inputs, output):
    loc, rho, prior_loc, prior_scale, num_samples = inputs[:5]
    out, noise, _, seed_offset = output
    # outputs without a gradient reach the backward as None, not as zeros (a training step
    # would zero-fill a noise-sized tensor just to ignore it)
    ctx.set_materialize_grads(False)
    ctx.num_samples = out.shape[0]
    ctx.save_for_backward(rho, seed_offset, noise if noise.numel() else None, loc, prior_loc, prior_scale)


def _sample_backward(ctx, grad_out, grad_noise, grad_kl, grad_seed_offset):
    """d out[s] / d loc = 1 and d out[s] / d rho = sigmoid(rho) eps_s, with eps the kept normals
    (``save_noise``) or else regenerated from the streams of seed_offset, plus the KL's gradients
    when the forward pass computed it: one fused kernel.  It has no derivative itself: a double
    backward raises (_once_differentiable)."""
    rho, seed_offset, noise, loc, prior_loc, prior_scale = ctx.saved_tensors
    needs_loc, needs_rho = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        raise RuntimeError("meanfield_sample: the KL computed with the samples has no gradient with respect to the "
                           "prior; use meanfield_kl for a trainable prior")
    if not (needs_loc or needs_rho):
        return None, None, None, None, None, None
    if torch.is_grad_enabled():
        _once_differentiable("meanfield_sample (the MeanField layers)", "loc and rho")
    with_kl = prior_loc is not None and grad_kl is not None
    if grad_out is None:  # only the KL is used: no samples to differentiate
        grad, noise = rho.new_zeros((0,) + tuple(rho.shape)), None
    else:
        grad = grad_out.contiguous()
    # without the KL and with one sample the loc gradient is grad_out itself (a view)
    fused_loc = needs_loc and (with_kl or grad.shape[0] != 1)
    grad_loc = grad_rho = None
    if needs_rho or fused_loc:
        gl, gr = lib.meanfield_sample_backward(grad, rho, seed_offset, noise, loc if with_kl or fused_loc else None,
                                               prior_loc if with_kl else None, prior_scale if with_kl else None,
                                               grad_kl if with_kl else None, fused_loc)
        grad_rho = gr if needs_rho else None
        grad_loc = gl if fused_loc else None
    if needs_loc and not fused_loc:
        grad_loc = grad.view(grad.shape[1:])
    return grad_loc, grad_rho, None, None, None, None


torch.library.register_autograd("vmfdist::meanfield_sample", _sample_backward, setup_context=_sample_setup)


def _kl_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _reduce_to(g, p):
    """Sum a per-element gradient to the shape of a one-element prior parameter."""
    return g.sum().reshape(p.shape) if p.shape != g.shape else g


def _kl_backward(ctx, grad):
    """Gradients of the summed KL: a fused kernel for loc and rho; for the prior's parameters
    (rarely trainable) the torch formulas d/dm = -(mu - m)/s^2 and
    d/ds = 1/s - (sigma^2 + (mu - m)^2)/s^3, summed to their shapes."""
    loc, rho, prior_loc, prior_scale = ctx.saved_tensors
    needs = ctx.needs_input_grad
    if torch.is_grad_enabled() and (needs[0] or needs[1]):
        _once_differentiable("meanfield_kl (the MeanField layers' KL)", "loc and rho")
    g_loc = g_rho = g_m = g_s = None
    if needs[0] or needs[1]:
        g_loc, g_rho = lib.meanfield_kl_backward(grad, loc, rho, prior_loc, prior_scale)
        g_loc = g_loc if needs[0] else None
        g_rho = g_rho if needs[1] else None
    if needs[2] or needs[3]:
        diff = loc - prior_loc
        if needs[2]:
            g_m = _reduce_to(grad * (-diff / prior_scale.square()), prior_loc)
        if needs[3]:
            sigma = torch.nn.functional.softplus(rho)
            g_s = _reduce_to(grad * (1.0 / prior_scale - (sigma.square() + diff.square()) / prior_scale.pow(3)),
                             prior_scale)
    return g_loc, g_rho, g_m, g_s


torch.library.register_autograd("vmfdist::meanfield_kl", _kl_backward, setup_context=_kl_setup)
