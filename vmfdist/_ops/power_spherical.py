"""Fake kernels and the autograd of the power spherical ops (``csrc/include/vmfdist/power_spherical.h``).

The sampler ``power_spherical_sample`` returns ``x = Q(mu) (t, sqrt(1 - t^2) v)`` and ``1 - t``.  On the CPU
its backward is one fused op, ``power_spherical_sample_backward`` (one pass over the sample rows, as
``vmf_sample_backward``, with the marginal's dt/dkappa computed in it).  On CUDA the backward is assembled
here from two compiled pieces computing the same map (the op itself exists on CUDA too, composed in C++ the
same way, but until a GPU session has run it autograd keeps this tested path):

* with respect to ``loc``: the reflection is the vMF sampler's, so ``vmf_sample_backward`` with
  ``concentration_grad=False`` gives exactly d/dloc with the unrotated sample held fixed (it never
  reads the concentration or the marginal then);
* with respect to the concentration: ``dL/dt`` per sample row times ``dt/dkappa`` from
  ``power_spherical_marginal_grad`` (the implicit reparameterisation gradient of the Beta marginal),
  summed over samples.  With ``x = t mu + sqrt(1 - t^2) u`` (u the unit tangent) and the tangent
  direction held fixed, ``dx/dt = mu - t (x - t mu) / (1 - t^2)``, so
  ``dL/dt = g.mu - t (g.x - t g.mu) / (1 - t^2)`` (the same quantity as ``vmf.h: marginal_dl_dw``),
  minus the gradient of the second output ``1 - t``.
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


def dl_dt(grad_x: torch.Tensor, grad_omt, mu_hat: torch.Tensor, x: torch.Tensor, omt: torch.Tensor) -> torch.Tensor:
    r""":math:`\partial L/\partial t` per sample row (shape ``omt.shape``) for the gradient ``grad_x`` of
    ``x = t\hat\mu + \sqrt{1 - t^2}\,u`` with the tangent direction ``u`` held fixed, minus ``grad_omt``
    (the gradient of the op's second output :math:`1 - t`, or None); 0 at the poles, where
    :math:`1 - t^2 = (1 - t)(1 + t)` vanishes."""
    gm = (grad_x * mu_hat).sum(-1)
    gx = (grad_x * x).sum(-1)
    t = 1.0 - omt
    one_m_t2 = omt * (2.0 - omt)
    pos = one_m_t2 > 0
    safe = torch.where(pos, one_m_t2, torch.ones_like(one_m_t2))
    out = gm - torch.where(pos, t * (gx - t * gm) / safe, torch.zeros_like(gm))
    return out if grad_omt is None else out - grad_omt


def _sample_backward(ctx, grad_x, grad_omt):
    """d/dloc through the reflection (fused, ``vmf_sample_backward``; with ``create_graph`` by
    autograd through :func:`householder`, so higher derivatives in loc are exact) and d/dkappa by
    implicit reparameterisation of the marginal (differentiable once: a double backward that needs
    it raises)."""
    create = torch.is_grad_enabled()  # backward(create_graph=True)
    if create and ctx.needs_input_grad[1]:
        _once_differentiable("power_spherical_sample (PowerSpherical.rsample)", "the concentration")
    loc, kappa, x, omt = ctx.saved_tensors
    d = loc.shape[-1]
    if grad_x is None:
        grad_x = torch.zeros_like(x)
    grad_loc = grad_kappa = None
    if loc.device.type == "cpu" and not create:
        gl, gk = lib.power_spherical_sample_backward(grad_x, grad_omt, loc, kappa, x, omt, ctx.needs_input_grad[0],
                                                     ctx.needs_input_grad[1])
        return (gl if ctx.needs_input_grad[0] else None), (gk if ctx.needs_input_grad[1] else None), None
    with torch.no_grad():
        mu_hat = loc / torch.linalg.vector_norm(loc, dim=-1, keepdim=True)
    if ctx.needs_input_grad[1]:
        grad_kappa = (dl_dt(grad_x, grad_omt, mu_hat, x, omt) * lib.power_spherical_marginal_grad(omt, kappa, d)).sum(0)
    if ctx.needs_input_grad[0]:
        if not create:
            grad_loc, _ = lib.vmf_sample_backward(grad_x, None, loc, kappa, x, omt, True, False)
        else:
            with torch.no_grad():
                y = householder(mu_hat, x)  # Q is an involution: the unrotated sample
            with torch.enable_grad():
                loc_ = loc if loc.requires_grad else loc.detach().requires_grad_(True)
                xr = householder(loc_ / torch.linalg.vector_norm(loc_, dim=-1, keepdim=True), y)
                (grad_loc,) = torch.autograd.grad(xr, loc_, grad_x, create_graph=True)
    return grad_loc, grad_kappa, None


torch.library.register_autograd("vmfdist::power_spherical_sample", _sample_backward, setup_context=_sample_setup)
