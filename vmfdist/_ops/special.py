"""Fake kernels and autograd formulas of the Bessel special-function ops (``csrc/include/vmfdist/bessel.h``).

The papers' bounds and approximations are closed forms; their z-derivatives are written
with differentiable torch ops, so higher derivatives follow by autograd.
"""
from __future__ import annotations

import torch

from ._lib import _binary_result, _sum_to, lib


@torch.library.register_fake("vmfdist::bessel_iv_ratio")
def _(nu, z, complement=False):
    return _binary_result(nu, z, "bessel_iv_ratio")


@torch.library.register_fake("vmfdist::bessel_iv_ratio_grad")
def _(nu, z):
    return _binary_result(nu, z, "bessel_iv_ratio_grad")


@torch.library.register_fake("vmfdist::log_bessel_iv")
def _(nu, z, scaled=False):
    return _binary_result(nu, z, "log_bessel_iv")


@torch.library.register_fake("vmfdist::log_bessel_iv_grad")
def _(nu, z, scaled=False):
    return _binary_result(nu, z, "log_bessel_iv_grad")


@torch.library.register_fake("vmfdist::bessel_iv_ratio_bounds")
def _(nu, z, theorem=5):
    torch._check(theorem in (4, 5), lambda: f"bessel_iv_ratio_bounds: theorem must be 4 or 5, got {theorem}")
    return _binary_result(nu, z, "bessel_iv_ratio_bounds"), _binary_result(nu, z, "bessel_iv_ratio_bounds")


for _name in ("bessel_iv_ratio_approx", "log_bessel_iv_asymptotic", "log_bessel_iv_series"):
    torch.library.register_fake(f"vmfdist::{_name}")(lambda nu, z, _op=_name: _binary_result(nu, z, _op))


# autograd: derivatives w.r.t. z.  The order nu is not differentiable.
def _no_nu_grad(ctx, name: str) -> None:
    if ctx.needs_input_grad[0]:
        raise RuntimeError(f"{name}: the order nu is not differentiable; pass a tensor that does not require grad")


def _save_nu_z(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.flag = inputs[2] if len(inputs) > 2 else None


def _ratio_backward(ctx, grad):
    _no_nu_grad(ctx, "bessel_iv_ratio")
    nu, z = ctx.saved_tensors
    g = lib.bessel_iv_ratio_grad(nu, z)
    if ctx.flag:  # complement: d(1 - R)/dz = -dR/dz
        g = -g
    return None, _sum_to(grad * g, z), None


def _ratio_grad_backward(ctx, grad):
    # R'' = d/dz (1 - R^2 - (2nu - 1) R / z) = -2 R R' - (2nu - 1) (R' / z - R / z^2)
    _no_nu_grad(ctx, "bessel_iv_ratio_grad")
    nu, z = ctx.saved_tensors
    r = lib.bessel_iv_ratio(nu, z, False)
    dr = lib.bessel_iv_ratio_grad(nu, z)
    d2 = -2.0 * r * dr - (2.0 * nu - 1.0) * (dr / z - r / (z * z))
    return None, _sum_to(grad * d2, z)


def _log_iv_backward(ctx, grad):
    _no_nu_grad(ctx, "log_bessel_iv")
    nu, z = ctx.saved_tensors
    return None, _sum_to(grad * lib.log_bessel_iv_grad(nu, z, bool(ctx.flag)), z), None


def _log_iv_grad_backward(ctx, grad):
    # d^2/dz^2 log I_nu(z) = R'_{nu+1}(z) - nu / z^2 (the same for the scaled form)
    _no_nu_grad(ctx, "log_bessel_iv_grad")
    nu, z = ctx.saved_tensors
    d2 = lib.bessel_iv_ratio_grad(nu + 1.0, z) - nu / (z * z)
    return None, _sum_to(grad * d2, z), None


torch.library.register_autograd("vmfdist::bessel_iv_ratio", _ratio_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::bessel_iv_ratio_grad", _ratio_grad_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::log_bessel_iv", _log_iv_backward, setup_context=_save_nu_z)
torch.library.register_autograd("vmfdist::log_bessel_iv_grad", _log_iv_grad_backward, setup_context=_save_nu_z)


# ----------------------------------------------------------------------------
# The papers' bounds and approximations are closed forms; their z-derivatives are
# written with differentiable torch ops, so higher derivatives follow by autograd.
def _segura_b_dz(nu, z, alpha):
    """d/dz of B_alpha(nu, z) = z / (delta + s) (theorem 5), s = sqrt(delta^2 + z^2).

    Differentiating directly gives ((delta + s) - z (delta' + (delta delta' + z)/s)) / (delta + s)^2,
    whose numerator cancels for z >> nu (100% error by z = 1e8).  It simplifies to
    (delta + s)(delta - z delta')/s, so dB/dz = (delta - z delta') / (s (delta + s)) with
    -z delta' = (lambda / (2h)) (z/h)^2, h = hypot(lambda, z): every term >= 0 for nu >= 1/2."""
    lam = nu + 0.5 * (alpha - 1.0)
    h = torch.hypot(lam, z)
    pos = h > 0
    safe_h = torch.where(pos, h, torch.ones_like(h))
    half = torch.where(pos, lam / (2.0 * safe_h), torch.zeros_like(h))  # lambda / (2h)
    delta = (nu - 0.5) + half
    r = z / safe_h
    num = delta + half * r * r  # delta - z delta'
    s = torch.hypot(delta, z)
    return num / s / (delta + s)


def _thm4_dz(nu, z, c):
    """d/dz of B = z / ((nu - c) + sqrt((nu + c)^2 + z^2)) (theorem 4, c = 1/2 or 1), without
    cancellation: for nu >= c, dB/dz = ((nu - c) + (nu + c)^2 / h) / d^2 (h = hypot(nu + c, z),
    d = nu - c + h; the numerator was d - z^2/h, which cancels for z >> nu); for nu < c, as in
    bessel.h, B = N / (q + z) with N = h + c - nu, q = 4 c nu / z, so
    dB/dz = (z/h - B + (B/z) q) / (q + z), and N / (4 c nu) where q overflows (z -> 0).  That
    form cancels for large z (B -> 1), where the first is fine again: it is used for z < 1 only.
    Each branch sees harmless inputs where it is not selected (so double backward has no NaN)."""
    small = (nu < c) & (z < 1.0)
    one = torch.ones_like(z)
    # nu >= c
    nu_d = torch.where(small, torch.full_like(nu, c), nu)
    h_d = torch.hypot(nu_d + c, z)
    d = (nu_d - c) + h_d
    direct = ((nu_d - c) + (nu_d + c) ** 2 / h_d) / d / d
    # nu < c
    nu_s = torch.where(small, nu, torch.zeros_like(nu))
    z_s = torch.where(small, z, one)
    q = 4.0 * c * nu_s / z_s
    q_inf = torch.isinf(q)
    z_s = torch.where(q_inf, one, z_s)
    q_s = torch.where(q_inf, torch.zeros_like(q), q)
    h_s = torch.hypot(nu_s + c, z_s)
    n_s = h_s + (c - nu_s)
    b_s = n_s / (q_s + z_s)
    third = torch.where(q_s > 0, (b_s / z_s) * q_s, torch.zeros_like(q_s))
    rational = (z_s / h_s - b_s + third) / (q_s + z_s)
    nu_l = torch.where(q_inf, nu_s, torch.ones_like(nu_s))
    limit = (torch.hypot(nu_l + c, z) + (c - nu_l)) / (4.0 * c * nu_l)
    return torch.where(small, torch.where(q_inf, limit, rational), direct)


def _bounds_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.theorem = inputs[2] if len(inputs) > 2 else 5


def _bounds_backward(ctx, grad_lo, grad_hi):
    _no_nu_grad(ctx, "bessel_iv_ratio_bounds")
    nu, z = ctx.saved_tensors
    if ctx.theorem == 5:
        d_lo, d_hi = _segura_b_dz(nu, z, 2.0), _segura_b_dz(nu, z, 0.0)
    else:
        d_lo, d_hi = _thm4_dz(nu, z, 0.5), _thm4_dz(nu, z, 1.0)
    # an output that does not reach the loss gets zero incoming gradient: let it contribute 0 even
    # where its derivative overflows (nu = 0, z -> 0), not 0 * inf = NaN
    g = torch.zeros_like(z)
    for grad, d in ((grad_lo, d_lo), (grad_hi, d_hi)):
        if grad is not None:
            g = g + torch.where(grad == 0, torch.zeros_like(d), grad * d)
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
