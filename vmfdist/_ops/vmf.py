"""Fake kernels and the implicit-reparameterisation autograd of the von Mises--Fisher ops
(``csrc/include/vmfdist/vmf.h``), and :func:`householder`, the reflection the sampler uses.
"""
from __future__ import annotations

import torch

from ._lib import _binary_result, _check_same_device, _once_differentiable, lib


@torch.library.register_fake("vmfdist::vmf_sample")
def _(loc, concentration, num_samples, *, generator=None, seed=None, offset=None):
    _check_same_device("vmf_sample", loc=loc, concentration=concentration)
    torch._check(loc.dim() == 2, lambda: f"vmf_sample: loc must have shape (batch, d), got {tuple(loc.shape)}")
    torch._check(loc.shape[1] >= 2, lambda: "vmf_sample: the dimension d = loc.size(-1) must be at least 2")
    torch._check(concentration.dim() == 1 and concentration.shape[0] == loc.shape[0],
                 lambda: "vmf_sample: concentration must have shape (batch,)")
    torch._check(loc.dtype.is_floating_point and concentration.dtype == loc.dtype,
                 lambda: "vmf_sample: loc and concentration must be floating tensors of the same dtype")
    torch._check(num_samples >= 0, lambda: f"vmf_sample: num_samples must be non-negative, got {num_samples}")
    b, d = loc.shape
    return loc.new_empty((num_samples, b, d)), loc.new_empty((num_samples, b))


@torch.library.register_fake("vmfdist::vmf_marginal_grad")
def _(one_minus_w, concentration, dim):
    return _binary_result(one_minus_w, concentration, "vmf_marginal_grad", ("one_minus_w", "concentration"))


@torch.library.register_fake("vmfdist::vmf_sample_backward")
def _(grad_x, grad_one_minus_w, loc, concentration, x, one_minus_w, loc_grad=True, concentration_grad=True):
    _check_same_device("vmf_sample_backward", loc=loc, concentration=concentration, x=x, grad_x=grad_x,
                       one_minus_w=one_minus_w)
    torch._check(loc.dim() == 2 and x.dim() == 3, lambda: "vmf_sample_backward: loc must be (batch, d), x (n, batch, d)")
    b, d = loc.shape
    return (loc.new_empty((b, d) if loc_grad else (0,)), loc.new_empty((b,) if concentration_grad else (0,)))


def householder(mu: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r"""Apply the reflection :math:`Q(\mu)` with :math:`Q e_1 = \mu` (unit ``mu``) to ``y``.

    The same map as the sampling kernels (``vmf.h: Reflection``): for
    :math:`\mu_0 \ge 0`, :math:`Q = -(I - 2uu^T)` with :math:`u \propto e_1 + \mu`;
    otherwise :math:`Q = I - 2uu^T` with :math:`u \propto e_1 - \mu`, so the
    normaliser :math:`2(1 + |\mu_0|)` never cancels.  :math:`Q` is symmetric and
    its own inverse.  Broadcasts over leading dimensions; differentiable.
    """
    mu0 = mu[..., :1]
    sgn = torch.where(mu0 >= 0, -1.0, 1.0).to(y.dtype)
    den = 1.0 - sgn * mu0  # = 1 + |mu0|, differentiated on the side of the reflection used (also at mu0 = 0)
    sigma = y[..., :1] * den - sgn * (mu[..., 1:] * y[..., 1:]).sum(-1, keepdim=True)
    return torch.cat([sgn * (y[..., :1] - sigma), sgn * y[..., 1:] + mu[..., 1:] * (sigma / den)], dim=-1)


def _vmf_sample_setup(ctx, inputs, keyword_only_inputs, output):
    loc, concentration = inputs[0], inputs[1]
    x, omw = output
    ctx.save_for_backward(loc, concentration, x, omw)


def _vmf_sample_backward(ctx, grad_x, grad_omw):
    """Implicit reparameterisation: x = Q(mu/|mu|) (w, sqrt(1 - w^2) v) with the noise
    (the quantile of w and the direction v) held fixed, dw/dkappa from the marginal's CDF.

    A first derivative is one fused op, ``vmf_sample_backward`` (the closed forms in
    ``csrc/include/vmfdist/vmf.h``).  Higher derivatives: with respect to loc alone they are
    exact (with create_graph, x = Q(loc/|loc|) y with the unrotated sample y held fixed is
    differentiated by autograd below, the same map written with differentiable ops); with
    respect to the concentration the formula uses the vmf_marginal_grad kernel, which has
    no derivative, so a double backward that needs them raises (_once_differentiable)
    instead of returning 0."""
    create = torch.is_grad_enabled()  # backward(create_graph=True)
    if create and ctx.needs_input_grad[1]:
        _once_differentiable("vmf_sample (VonMisesFisher.rsample)", "the concentration")
    loc, kappa, x, omw = ctx.saved_tensors
    d = loc.shape[-1]
    grad_loc = grad_kappa = None
    if grad_x is None:
        grad_x = torch.zeros_like(x)
    if not create:
        gl, gk = lib.vmf_sample_backward(grad_x, grad_omw, loc, kappa, x, omw, ctx.needs_input_grad[0],
                                         ctx.needs_input_grad[1])
        return (gl if ctx.needs_input_grad[0] else None), (gk if ctx.needs_input_grad[1] else None), None
    with torch.no_grad():
        mu_hat = loc / torch.linalg.vector_norm(loc, dim=-1, keepdim=True)
        y = householder(mu_hat, x)  # Q is an involution: the unrotated sample
    if ctx.needs_input_grad[1]:
        w = 1.0 - omw
        gq = householder(mu_hat, grad_x)
        one_m_w2 = omw * (2.0 - omw)
        tang = (gq[..., 1:] * y[..., 1:]).sum(-1)
        safe = torch.where(one_m_w2 > 0, one_m_w2, torch.ones_like(one_m_w2))
        dl_dw = gq[..., 0] - torch.where(one_m_w2 > 0, w * tang / safe, torch.zeros_like(tang))
        if grad_omw is not None:
            dl_dw = dl_dw - grad_omw
        grad_kappa = (dl_dw * lib.vmf_marginal_grad(omw, kappa, d)).sum(0)
    if ctx.needs_input_grad[0]:
        with torch.enable_grad():
            loc_ = loc if create and loc.requires_grad else loc.detach().requires_grad_(True)
            xr = householder(loc_ / torch.linalg.vector_norm(loc_, dim=-1, keepdim=True), y)
            (grad_loc,) = torch.autograd.grad(xr, loc_, grad_x, create_graph=create)
    return grad_loc, grad_kappa, None


torch.library.register_autograd("vmfdist::vmf_sample", _vmf_sample_backward, setup_context=_vmf_sample_setup)
