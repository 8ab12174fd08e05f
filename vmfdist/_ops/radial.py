"""Fake kernels and autograd of the fused radial-noise ops (``csrc/include/vmfdist/radial.h``).
"""
from __future__ import annotations

import torch

from ._lib import lib


@torch.library.register_fake("vmfdist::radial_noise")
def _(loc, scale, num_samples, seed, offset, rowwise=False):
    torch._check(loc.shape == scale.shape, lambda: "radial_noise: loc and scale must have the same shape")
    out = loc.new_empty((num_samples,) + tuple(loc.shape))
    if rowwise:
        rows = 1
        for s in loc.shape[:-1]:
            rows *= s
        return out, loc.new_empty((num_samples, rows), dtype=torch.float64)
    return out, loc.new_empty((num_samples,), dtype=torch.float64)


@torch.library.register_fake("vmfdist::radial_noise_scale_grad")
def _(grad, coef, seed, offset, rowwise=False):
    return grad.new_empty(grad.shape[1:])


def _radial_setup(ctx, inputs, output):
    ctx.seed, ctx.offset = inputs[3], inputs[4]
    ctx.rowwise = inputs[5] if len(inputs) > 5 else False
    ctx.save_for_backward(output[1])


def _radial_backward(ctx, grad_out, grad_coef):
    """d out[s] / d loc = 1, d out[s] / d scale = eps_s coef_s (regenerated, not stored)."""
    (coef,) = ctx.saved_tensors
    grad_loc = grad_scale = None
    if grad_out is None:
        return None, None, None, None, None, None
    if ctx.needs_input_grad[0]:
        grad_loc = grad_out.sum(0)
    if ctx.needs_input_grad[1]:
        grad_scale = lib.radial_noise_scale_grad(grad_out.contiguous(), coef, ctx.seed, ctx.offset, ctx.rowwise)
    return grad_loc, grad_scale, None, None, None, None


torch.library.register_autograd("vmfdist::radial_noise", _radial_backward, setup_context=_radial_setup)
