"""Fake kernels and the autograd of the power spherical ops (``csrc/include/vmfdist/power_spherical.h``).

The sampler ``power_spherical_sample`` returns ``x = Q(mu) (t, sqrt(1 - t^2) v)`` and ``1 - t``.  Its
backward is one op on every device, ``power_spherical_sample_backward``: the vMF sampler's backward
(the reflection is the same map; ``csrc/cpu/sphere_backward_cpu.h``, ``csrc/cuda/sphere_backward.cuh``)
with this marginal's dt/dkappa, the implicit reparameterisation gradient of the Beta marginal, in place of
the vMF's: d/dkappa = sum over samples of dL/dt * dt/dkappa, where with ``x = t mu + sqrt(1 - t^2) u``
(u the unit tangent held fixed) ``dL/dt = g.mu - t (g.x - t g.mu) / (1 - t^2)``, minus the gradient of
the second output ``1 - t``.

A backward with ``create_graph`` differentiates the reflection by autograd instead (so higher
derivatives in loc are exact); the concentration's gradient is differentiable once.
"""
from __future__ import annotations

import torch

from ._lib import _binary_result, _check_same_device, _once_differentiable, lib
from .vmf import householder


@torch.library.register_fake("vmfdist::power_spherical_sample")
def _(loc, concentration, num_samples, *, generator=None, seed=None, offset=None):
    op = "power_spherical_sample"
    _check_same_device(op, loc=loc, concentration=concentration)
    torch._check(loc.dim() == 2, lambda: f"{op}: loc must have shape (batch, d), got {tuple(loc.shape)}")
    torch._check(loc.shape[1] >= 2, lambda: f"{op}: the dimension d = loc.size(-1) must be at least 2")
    torch._check(concentration.dim() == 1 and concentration.shape[0] == loc.shape[0],
                 lambda: f"{op}: concentration must have shape (batch,)")
    torch._check(loc.dtype.is_floating_point and concentration.dtype == loc.dtype,
                 lambda: f"{op}: loc and concentration must be floating tensors of the same dtype")
    torch._check(num_samples >= 0, lambda: f"{op}: num_samples must be non-negative, got {num_samples}")
    b, d = loc.shape
    return loc.new_empty((num_samples, b, d)), loc.new_empty((num_samples, b))


@torch.library.register_fake("vmfdist::power_spherical_marginal_grad")
def _(one_minus_t, concentration, dim):
    return _binary_result(one_minus_t, concentration, "power_spherical_marginal_grad",
                          ("one_minus_t", "concentration"))


@torch.library.register_fake("vmfdist::power_spherical_sample_backward")
def _(grad_x, grad_one_minus_t, loc, concentration, x, one_minus_t, loc_grad=True, concentration_grad=True):
    _check_same_device("power_spherical_sample_backward", loc=loc, concentration=concentration, x=x, grad_x=grad_x,
                       one_minus_t=one_minus_t)
    torch._check(loc.dim() == 2 and x.dim() == 3,
                 lambda: "power_spherical_sample_backward: loc must be (batch, d), x (n, batch, d)")
    b, d = loc.shape
    return (loc.new_empty((b, d) if loc_grad else (0,)), loc.new_empty((b,) if concentration_grad else (0,)))


def _sample_setup(ctx, inputs, keyword_only_inputs, output):
    loc, concentration = inputs[0], inputs[1]
    x, omt = output
    ctx.save_for_backward(loc, concentration, x, omt)


def _sample_backward(ctx, grad_x, grad_omt):
    """The op ``power_spherical_sample_backward`` (d/dloc through the reflection, d/dkappa by implicit
    reparameterisation of the marginal); with ``create_graph``, d/dloc by autograd through
    :func:`householder` (higher derivatives in loc exact), and a double backward that needs the
    concentration raises (differentiable once)."""
    create = torch.is_grad_enabled()  # backward(create_graph=True)
    if create and ctx.needs_input_grad[1]:
        _once_differentiable("power_spherical_sample (PowerSpherical.rsample)", "the concentration")
    loc, kappa, x, omt = ctx.saved_tensors
    if grad_x is None:
        grad_x = torch.zeros_like(x)
    if not create:
        gl, gk = lib.power_spherical_sample_backward(grad_x, grad_omt, loc, kappa, x, omt, ctx.needs_input_grad[0],
                                                     ctx.needs_input_grad[1])
        return (gl if ctx.needs_input_grad[0] else None), (gk if ctx.needs_input_grad[1] else None), None
    grad_loc = None
    if ctx.needs_input_grad[0]:
        with torch.no_grad():
            y = householder(loc / torch.linalg.vector_norm(loc, dim=-1, keepdim=True), x)  # Q is an involution
        with torch.enable_grad():
            loc_ = loc if loc.requires_grad else loc.detach().requires_grad_(True)
            xr = householder(loc_ / torch.linalg.vector_norm(loc_, dim=-1, keepdim=True), y)
            (grad_loc,) = torch.autograd.grad(xr, loc_, grad_x, create_graph=True)
    return grad_loc, None, None


torch.library.register_autograd("vmfdist::power_spherical_sample", _sample_backward, setup_context=_sample_setup)
