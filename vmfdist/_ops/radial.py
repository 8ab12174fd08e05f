"""Fake kernels and autograd of the fused radial-noise ops (``csrc/include/vmfdist/radial.h``):
``radial_noise`` (any scale, whole tensor or per row) and ``radial_sample`` (the Radial layers'
draw: scale ``softplus(rho)`` and the KL to a Gaussian prior in the same pass).
"""
from __future__ import annotations

import math

import torch

from ._lib import _check_same_device, _once_differentiable, lib
from .meanfield import _check_like_rho, _check_prior


@torch.library.register_fake("vmfdist::radial_noise")
def _(loc, scale, num_samples, rowwise=False, save_noise=False, *, generator=None, seed=None, offset=None):
    # the same checks and shapes as csrc/host/radial_host.h
    _check_same_device("radial_noise", loc=loc, scale=scale)
    torch._check(loc.dtype.is_floating_point, lambda: f"radial_noise: loc must be a floating tensor, got {loc.dtype}")
    torch._check(loc.dtype == scale.dtype, lambda: "radial_noise: loc and scale must have the same dtype")
    torch._check(loc.shape == scale.shape, lambda: "radial_noise: loc and scale must have the same shape")
    torch._check(num_samples >= 0, lambda: f"radial_noise: num_samples must be non-negative, got {num_samples}")
    out = loc.new_empty((num_samples,) + tuple(loc.shape))
    seed_offset = loc.new_empty((2,), dtype=torch.int64)
    noise = torch.empty_like(out) if save_noise else loc.new_empty((0,))
    if rowwise:
        torch._check(loc.dim() >= 1, lambda: "radial_noise: rowwise needs loc with at least one dimension")
        rows = math.prod(loc.shape[:-1]) if loc.shape[-1] != 0 else 0
        return out, loc.new_empty((num_samples, rows), dtype=torch.float64), seed_offset, noise
    return out, loc.new_empty((num_samples,), dtype=torch.float64), seed_offset, noise


@torch.library.register_fake("vmfdist::radial_noise_scale_grad")
def _(grad, coef, seed_offset, rowwise=False, noise=None):
    torch._check(grad.dim() >= 1, lambda: "radial_noise_scale_grad: grad must have a leading sample dimension")
    if noise is not None:
        torch._check(noise.shape == grad.shape and noise.dtype == grad.dtype,
                     lambda: "radial_noise_scale_grad: noise must have the shape and dtype of grad")
    return grad.new_empty(grad.shape[1:])


def _radial_setup(ctx, inputs, keyword_only_inputs, output):
    ctx.rowwise = inputs[3] if len(inputs) > 3 else False
    ctx.set_materialize_grads(False)  # the unused outputs' gradients are None, not zero-filled tensors
    noise = output[3]
    ctx.save_for_backward(output[1], output[2], noise if noise.numel() else None)


def _radial_backward(ctx, grad_out, grad_coef, grad_seed_offset, grad_noise):
    """d out[s] / d loc = 1, d out[s] / d scale = eps_s coef_s (eps read from the kept noise with
    ``save_noise``, else regenerated from the streams of seed_offset: the same values).  The scale
    formula is a kernel without a derivative: a double backward through it raises
    (_once_differentiable); through loc it is exact (a sum)."""
    coef, seed_offset, noise = ctx.saved_tensors
    grad_loc = grad_scale = None
    if grad_out is None:
        return None, None, None, None, None
    if ctx.needs_input_grad[1] and torch.is_grad_enabled():
        _once_differentiable("radial_noise (Radial.rsample)", "scale")
    if ctx.needs_input_grad[0]:  # one sample (a layer's training step): the gradient itself, as a view
        grad_loc = grad_out.view(grad_out.shape[1:]) if grad_out.shape[0] == 1 else grad_out.sum(0)
    if ctx.needs_input_grad[1]:
        grad_scale = lib.radial_noise_scale_grad(grad_out.contiguous(), coef, seed_offset, ctx.rowwise, noise)
    return grad_loc, grad_scale, None, None, None


torch.library.register_autograd("vmfdist::radial_noise", _radial_backward, setup_context=_radial_setup)


# ---- radial_sample: the Radial layers' draw with softplus and the KL inside ----------------

def _check_radial_sample_fake(op, loc, rho, prior_loc, prior_scale):
    torch._check(rho.dtype.is_floating_point, lambda: f"{op}: rho must be a floating tensor, got {rho.dtype}")
    _check_like_rho(op, "loc", loc, rho)
    torch._check((prior_loc is None) == (prior_scale is None),
                 lambda: f"{op}: pass both prior_loc and prior_scale, or neither")
    if prior_loc is not None:
        _check_prior(op, rho, prior_loc, prior_scale)


@torch.library.register_fake("vmfdist::radial_sample")
def _(loc, rho, prior_loc, prior_scale, num_samples, save_noise=False, kl_offset=0.0, *, generator=None, seed=None,
      offset=None):
    _check_radial_sample_fake("radial_sample", loc, rho, prior_loc, prior_scale)
    torch._check(num_samples >= 0, lambda: f"radial_sample: num_samples must be non-negative, got {num_samples}")
    out = rho.new_empty((num_samples,) + tuple(rho.shape))
    noise = torch.empty_like(out) if save_noise else rho.new_empty((0,))
    return (out, rho.new_empty((num_samples,), dtype=torch.float64), rho.new_empty((2,), dtype=torch.int64), noise,
            rho.new_empty(()))


@torch.library.register_fake("vmfdist::radial_sample_backward")
def _(grad, loc, rho, coef, seed_offset, noise, prior_loc, prior_scale, grad_kl, loc_grad=True):
    op = "radial_sample_backward"
    torch._check(grad.dim() == rho.dim() + 1 and grad.shape[1:] == rho.shape,
                 lambda: f"{op}: grad must have shape (num_samples, *rho.shape)")
    _check_like_rho(op, "loc", loc, rho)
    if grad_kl is not None:
        torch._check(prior_loc is not None and prior_scale is not None,
                     lambda: f"{op}: the KL's gradient needs prior_loc and prior_scale")
        _check_prior(op, rho, prior_loc, prior_scale)
    return rho.new_empty(rho.shape if loc_grad else (0,)), rho.new_empty(rho.shape)


def _radial_sample_setup(ctx, inputs, keyword_only_inputs, output):
    loc, rho, prior_loc, prior_scale = inputs[:4]
    _, coef, seed_offset, noise, _ = output
    ctx.set_materialize_grads(False)  # the unused outputs' gradients are None, not zero-filled tensors
    ctx.save_for_backward(loc, rho, coef, seed_offset, noise if noise.numel() else None, prior_loc, prior_scale)


def _radial_sample_backward(ctx, grad_out, grad_coef, grad_seed_offset, grad_noise, grad_kl):
    """d out[s] / d loc = 1, d out[s] / d rho = sigmoid(rho) eps_s coef_s (eps kept or
    regenerated), plus the KL's gradients when the forward pass computed it: one fused kernel.
    It has no derivative itself: a double backward raises (_once_differentiable)."""
    loc, rho, coef, seed_offset, noise, prior_loc, prior_scale = ctx.saved_tensors
    needs_loc, needs_rho = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if ctx.needs_input_grad[2] or ctx.needs_input_grad[3]:
        raise RuntimeError("radial_sample: the KL computed with the samples has no gradient with respect to the "
                           "prior; use kl_radial_normal_softplus for a trainable prior")
    rest = (None,) * 5  # prior_loc, prior_scale, num_samples, save_noise, kl_offset (one per positional input)
    if not (needs_loc or needs_rho) or (grad_out is None and grad_kl is None):
        return (None, None) + rest
    if torch.is_grad_enabled():
        _once_differentiable("radial_sample (the Radial layers)", "loc and rho")
    with_kl = prior_loc is not None and grad_kl is not None
    if grad_out is None:  # only the KL is used: no samples to differentiate
        grad, coef, noise = rho.new_zeros((0,) + tuple(rho.shape)), coef[:0], None
    else:
        grad = grad_out.contiguous()
    gl, gr = lib.radial_sample_backward(grad, loc, rho, coef, seed_offset, noise, prior_loc if with_kl else None,
                                        prior_scale if with_kl else None, grad_kl if with_kl else None, needs_loc)
    return (gl if needs_loc else None, gr if needs_rho else None) + rest


torch.library.register_autograd("vmfdist::radial_sample", _radial_sample_backward, setup_context=_radial_sample_setup)
