"""The compiled operators of vmfdist, with fake (meta) kernels and autograd.

Every operator is declared once in ``csrc/ops.cpp`` (namespace ``vmfdist``) and
implemented by ``csrc/cpu/*_cpu.cpp`` and ``csrc/cuda/*_cuda.cu``.  This module
loads the extension, registers a fake kernel for each operator (so they work
under ``torch.compile`` and with meta tensors) and the autograd formulas.
Public, user-facing wrappers live in :mod:`vmfdist.special`.
"""
from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loading the library runs the TORCH_LIBRARY registrations)

__all__ = ["vmf", "has_cuda_kernels"]

vmf = torch.ops.vmfdist


def has_cuda_kernels() -> bool:
    """Whether this build of the extension registered CUDA kernels."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("vmfdist::log_bessel_iv", "CUDA")


# ----------------------------------------------------------------------------
# fake kernels
def _binary_result(nu: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    dt = torch.result_type(nu, z)
    if not dt.is_floating_point:
        dt = torch.get_default_dtype()
    shape = torch.broadcast_shapes(nu.shape, z.shape)
    return nu.new_empty(shape, dtype=dt)


@torch.library.register_fake("vmfdist::bessel_iv_ratio")
def _(nu, z, complement=False):
    return _binary_result(nu, z)


@torch.library.register_fake("vmfdist::bessel_iv_ratio_grad")
def _(nu, z):
    return _binary_result(nu, z)


@torch.library.register_fake("vmfdist::log_bessel_iv")
def _(nu, z, scaled=False):
    return _binary_result(nu, z)


@torch.library.register_fake("vmfdist::log_bessel_iv_grad")
def _(nu, z, scaled=False):
    return _binary_result(nu, z)


@torch.library.register_fake("vmfdist::bessel_iv_ratio_bounds")
def _(nu, z, theorem=5):
    return _binary_result(nu, z), _binary_result(nu, z)


for _name in ("bessel_iv_ratio_approx", "log_bessel_iv_asymptotic", "log_bessel_iv_series"):
    torch.library.register_fake(f"vmfdist::{_name}")(lambda nu, z: _binary_result(nu, z))


# ----------------------------------------------------------------------------
# autograd: derivatives w.r.t. z.  The order nu is not differentiable.
def _sum_to(grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reduce a broadcast gradient back to the shape (and dtype) of ``like``."""
    if grad.shape != like.shape:
        lead = grad.dim() - like.dim()
        if lead > 0:
            grad = grad.sum(dim=tuple(range(lead)))
        dims = tuple(i for i, s in enumerate(like.shape) if s == 1 and grad.shape[i] != 1)
        if dims:
            grad = grad.sum(dim=dims, keepdim=True)
    return grad.to(like.dtype) if like.is_floating_point() else grad


def _no_nu_grad(ctx, name: str) -> None:
    if ctx.needs_input_grad[0]:
        raise RuntimeError(f"{name}: the order nu is not differentiable; pass a tensor that does not require grad")


def _save_nu_z(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.flag = inputs[2] if len(inputs) > 2 else None


def _ratio_backward(ctx, grad):
    _no_nu_grad(ctx, "bessel_iv_ratio")
    nu, z = ctx.saved_tensors
    g = vmf.bessel_iv_ratio_grad(nu, z)
    if ctx.flag:  # complement: d(1 - R)/dz = -dR/dz
        g = -g
    return None, _sum_to(grad * g, z), None


def _ratio_grad_backward(ctx, grad):
    # R'' = d/dz (1 - R^2 - (2nu - 1) R / z) = -2 R R' - (2nu - 1) (R' / z - R / z^2)
    _no_nu_grad(ctx, "bessel_iv_ratio_grad")
    nu, z = ctx.saved_tensors
    r = vmf.bessel_iv_ratio(nu, z, False)
    dr = vmf.bessel_iv_ratio_grad(nu, z)
    d2 = -2.0 * r * dr - (2.0 * nu - 1.0) * (dr / z - r / (z * z))
    return None, _sum_to(grad * d2, z)


def _log_iv_backward(ctx, grad):
    _no_nu_grad(ctx, "log_bessel_iv")
    nu, z = ctx.saved_tensors
    return None, _sum_to(grad * vmf.log_bessel_iv_grad(nu, z, bool(ctx.flag)), z), None


def _log_iv_grad_backward(ctx, grad):
    # d^2/dz^2 log I_nu(z) = R'_{nu+1}(z) - nu / z^2 (the same for the scaled form)
    _no_nu_grad(ctx, "log_bessel_iv_grad")
    nu, z = ctx.saved_tensors
    d2 = vmf.bessel_iv_ratio_grad(nu + 1.0, z) - nu / (z * z)
    return None, _sum_to(grad * d2, z), None


torch.library.register_autograd("vmfdist::bessel_iv_ratio", _ratio_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::bessel_iv_ratio_grad", _ratio_grad_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::log_bessel_iv", _log_iv_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::log_bessel_iv_grad", _log_iv_grad_backward, setup_context=_save_nu_z)


# ----------------------------------------------------------------------------
# The papers' bounds and approximations are closed forms; their z-derivatives are
# written with differentiable torch ops, so higher derivatives follow by autograd.
def _segura_b_dz(nu, z, alpha):
    """d/dz of B_alpha(nu, z) = z / (delta + sqrt(delta^2 + z^2)) (theorem 5)."""
    lam = nu + 0.5 * (alpha - 1.0)
    h = torch.hypot(lam, z)
    safe_h = torch.where(h > 0, h, torch.ones_like(h))
    delta = (nu - 0.5) + torch.where(h > 0, lam / (2.0 * safe_h), torch.zeros_like(h))
    ddelta = torch.where(h > 0, -lam * z / (2.0 * safe_h**3), torch.zeros_like(h))
    s = torch.hypot(delta, z)
    d = delta + s
    dd_ = ddelta + (delta * ddelta + z) / s
    return (d - z * dd_) / (d * d)


def _thm4_dz(nu, z, a_shift, b_shift):
    """d/dz of z / (nu + a_shift + sqrt((nu + b_shift)^2 + z^2)) (theorem 4)."""
    h = torch.hypot(nu + b_shift, z)
    d = (nu + a_shift) + h
    return (d - z * z / h) / (d * d)


def _bounds_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.theorem = inputs[2] if len(inputs) > 2 else 5


def _bounds_backward(ctx, grad_lo, grad_hi):
    _no_nu_grad(ctx, "bessel_iv_ratio_bounds")
    nu, z = ctx.saved_tensors
    if ctx.theorem == 5:
        d_lo, d_hi = _segura_b_dz(nu, z, 2.0), _segura_b_dz(nu, z, 0.0)
    else:
        d_lo, d_hi = _thm4_dz(nu, z, -0.5, 0.5), _thm4_dz(nu, z, -1.0, 1.0)
    g = torch.zeros_like(z) if grad_lo is None else grad_lo * d_lo
    if grad_hi is not None:
        g = g + grad_hi * d_hi
    return None, _sum_to(g, z), None


def _approx_backward(ctx, grad):
    _no_nu_grad(ctx, "bessel_iv_ratio_approx")
    nu, z = ctx.saved_tensors
    return None, _sum_to(grad * 0.5 * (_segura_b_dz(nu, z, 2.0) + _segura_b_dz(nu, z, 0.0)), z)


def _asymptotic_backward(ctx, grad):
    # eq. (44): nu/z + eta for z < nu, 1 - 1/(2z) otherwise
    _no_nu_grad(ctx, "log_bessel_iv_asymptotic")
    nu, z = ctx.saved_tensors
    eta = (nu + 0.5) / (2.0 * (nu + 1.0))
    d = torch.where(z < nu, nu / z + eta, 1.0 - 0.5 / z)
    return None, _sum_to(grad * d, z)


torch.library.register_autograd("vmfdist::bessel_iv_ratio_bounds", _bounds_backward, setup_context=_bounds_setup)
torch.library.register_autograd("vmfdist::bessel_iv_ratio_approx", _approx_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::log_bessel_iv_asymptotic", _asymptotic_backward, setup_context=_save_nu_z)


# ----------------------------------------------------------------------------
# counter-based randomness (csrc/include/vmfdist/philox.h); integer or
# random outputs, so no autograd formulas.
@torch.library.register_fake("vmfdist::philox4x32")
def _(counter, key, rounds=10):
    torch._check(counter.dtype == torch.int64, lambda: f"philox4x32: counter must have dtype int64, got {counter.dtype}")
    torch._check(key.dtype == torch.int64, lambda: f"philox4x32: key must have dtype int64, got {key.dtype}")
    torch._check(counter.dim() == 2 and counter.shape[1] == 4,
                 lambda: f"philox4x32: counter must have shape (n, 4), got {tuple(counter.shape)}")
    torch._check(key.dim() == 2 and key.shape[1] == 2,
                 lambda: f"philox4x32: key must have shape (n, 2), got {tuple(key.shape)}")
    torch._check(counter.shape[0] == key.shape[0],
                 lambda: "philox4x32: counter and key must have the same number of rows")
    return counter.new_empty((counter.shape[0], 4))


def _philox_factory_fake(size, seed, offset, *, dtype, device):
    return torch.empty(size, dtype=dtype, device=device)


torch.library.register_fake("vmfdist::philox_uniform")(_philox_factory_fake)
torch.library.register_fake("vmfdist::philox_normal")(_philox_factory_fake)


# ----------------------------------------------------------------------------
# von Mises-Fisher (csrc/include/vmfdist/vmf.h)
@torch.library.register_fake("vmfdist::vmf_sample")
def _(loc, concentration, num_samples, seed, offset):
    torch._check(loc.dim() == 2, lambda: f"vmf_sample: loc must have shape (batch, d), got {tuple(loc.shape)}")
    torch._check(concentration.dim() == 1 and concentration.shape[0] == loc.shape[0],
                 lambda: "vmf_sample: concentration must have shape (batch,)")
    b, d = loc.shape
    return loc.new_empty((num_samples, b, d)), loc.new_empty((num_samples, b))


@torch.library.register_fake("vmfdist::vmf_marginal_grad")
def _(one_minus_w, concentration, dim):
    return _binary_result(one_minus_w, concentration)


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
    den = 1.0 + mu0.abs()
    sigma = y[..., :1] * den - sgn * (mu[..., 1:] * y[..., 1:]).sum(-1, keepdim=True)
    return torch.cat([sgn * (y[..., :1] - sigma), sgn * y[..., 1:] + mu[..., 1:] * (sigma / den)], dim=-1)


def _vmf_sample_setup(ctx, inputs, output):
    loc, concentration = inputs[0], inputs[1]
    x, omw = output
    ctx.save_for_backward(loc, concentration, x, omw)


def _vmf_sample_backward(ctx, grad_x, grad_omw):
    """Implicit reparameterisation: x = Q(mu/|mu|) (w, sqrt(1 - w^2) v) with the noise
    (the quantile of w and the direction v) held fixed.  dw/dkappa comes from the
    vmf_marginal_grad kernel; the rotation is differentiated by autograd."""
    loc, kappa, x, omw = ctx.saved_tensors
    d = loc.shape[-1]
    grad_loc = grad_kappa = None
    if grad_x is None:
        grad_x = torch.zeros_like(x)
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
        grad_kappa = (dl_dw * vmf.vmf_marginal_grad(omw, kappa, d)).sum(0)
    if ctx.needs_input_grad[0]:
        with torch.enable_grad():
            loc_ = loc.detach().requires_grad_(True)
            xr = householder(loc_ / torch.linalg.vector_norm(loc_, dim=-1, keepdim=True), y)
            (grad_loc,) = torch.autograd.grad(xr, loc_, grad_x)
    return grad_loc, grad_kappa, None, None, None


torch.library.register_autograd("vmfdist::vmf_sample", _vmf_sample_backward, setup_context=_vmf_sample_setup)


# ----------------------------------------------------------------------------
# radial noise (csrc/include/vmfdist/radial.h)
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
        grad_scale = vmf.radial_noise_scale_grad(grad_out.contiguous(), coef, ctx.seed, ctx.offset, ctx.rowwise)
    return grad_loc, grad_scale, None, None, None, None


torch.library.register_autograd("vmfdist::radial_noise", _radial_backward, setup_context=_radial_setup)
