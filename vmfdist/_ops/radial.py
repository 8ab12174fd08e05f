"""Fake kernels and autograd of the fused radial-noise ops (``csrc/include/vmfdist/radial.h``).
"""
from __future__ import annotations

import math

import torch

from ._lib import _check_same_device, _once_differentiable, lib


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
