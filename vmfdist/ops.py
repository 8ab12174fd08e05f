"""The compiled operators of vmfdist, with fake (meta) kernels and autograd.

Every operator is declared once in ``csrc/ops.cpp`` (namespace ``vmfdist``) and
implemented by ``csrc/cpu/*_cpu.cpp`` and ``csrc/cuda/*_cuda.cu``.  This module
loads the extension, registers a fake kernel for each operator (so they work
under ``torch.compile`` and with meta tensors) and the autograd formulas.
Public, user-facing wrappers live in :mod:`vmfdist.special` and here:
:func:`kron_eigen_matvec` and :func:`kron_eigen_sample` (the Kronecker-eigenbasis
ops, see ``docs/matrix_normal.md``).
"""
from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loading the library runs the TORCH_LIBRARY registrations)

__all__ = ["vmf", "has_cuda_kernels", "kron_eigen_matvec", "kron_eigen_sample"]

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


# ----------------------------------------------------------------------------
# Kronecker-factored eigenbases (csrc/include/vmfdist/kron.h, kron_host.h)
def _kron_promote(op, **named):
    dt = None
    for name, t in named.items():
        torch._check(t.dtype.is_floating_point, lambda: f"{op}: {name} must be a floating tensor, got dtype {t.dtype}")
        dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    return dt


def _kron_check_matrix(op, name, t, rows, cols, what):
    torch._check(t.dim() >= 2, lambda: f"{op}: {name} must have at least 2 dimensions ({what}), got shape {tuple(t.shape)}")
    torch._check(t.shape[-2] == rows and t.shape[-1] == cols,
                 lambda: f"{op}: {name} must have trailing shape ({rows}, {cols}) ({what}), got shape {tuple(t.shape)}")


def _kron_check_bcast(op, name, t, rows, cols, what):
    torch._check(t.dim() >= 2, lambda: f"{op}: {name} must have at least 2 dimensions ({what}), got shape {tuple(t.shape)}")
    torch._check((t.shape[-2] == rows or t.shape[-2] == 1) and (t.shape[-1] == cols or t.shape[-1] == 1),
                 lambda: f"{op}: {name} must have trailing shape ({rows}, {cols}) or one that broadcasts to it ({what}), "
                         f"got shape {tuple(t.shape)}")


def _kron_batch(op, **named):
    try:
        return torch.broadcast_shapes(*(t.shape[:-2] for t in named.values()))
    except RuntimeError:
        shapes = ", ".join(f"{k} {tuple(t.shape[:-2])}" for k, t in named.items())
        raise RuntimeError(f"{op}: the batch shapes do not broadcast: {shapes}") from None


@torch.library.register_fake("vmfdist::kron_eigen_matvec")
def _(q_out, q_in, scale, v, power=1.0):
    op = "kron_eigen_matvec"
    torch._check(v.dim() >= 2, lambda: f"{op}: v must have shape (..., out, in), got {tuple(v.shape)}")
    o, i = v.shape[-2], v.shape[-1]
    _kron_check_matrix(op, "q_out", q_out, o, o, "the out x out eigenbasis, out = v.size(-2)")
    _kron_check_matrix(op, "q_in", q_in, i, i, "the in x in eigenbasis, in = v.size(-1)")
    _kron_check_bcast(op, "scale", scale, o, i, "the eigenvalues, like v")
    dt = _kron_promote(op, v=v, q_out=q_out, q_in=q_in, scale=scale)
    batch = _kron_batch(op, v=v, q_out=q_out, q_in=q_in, scale=scale)
    return v.new_empty(tuple(batch) + (o, i), dtype=dt)


@torch.library.register_fake("vmfdist::kron_eigen_noise")
def _(variance, size, seed, offset, power=0.5):
    torch._check(len(size) >= 2, lambda: f"kron_eigen_noise: size must have at least 2 dimensions, got {size}")
    torch._check(variance.dtype.is_floating_point,
                 lambda: f"kron_eigen_noise: variance must be a floating tensor, got dtype {variance.dtype}")
    return variance.new_empty(size)


@torch.library.register_fake("vmfdist::kron_eigen_sample")
def _(loc, q_out, q_in, variance, num_samples, seed, offset):
    op = "kron_eigen_sample"
    torch._check(loc.dim() >= 2, lambda: f"{op}: loc must have shape (..., out, in), got {tuple(loc.shape)}")
    o, i = loc.shape[-2], loc.shape[-1]
    _kron_check_matrix(op, "q_out", q_out, o, o, "the out x out eigenbasis, out = loc.size(-2)")
    _kron_check_matrix(op, "q_in", q_in, i, i, "the in x in eigenbasis, in = loc.size(-1)")
    _kron_check_bcast(op, "variance", variance, o, i, "the eigenvalues, like loc")
    torch._check(num_samples >= 0, lambda: f"{op}: num_samples must be non-negative, got {num_samples}")
    dt = _kron_promote(op, loc=loc, q_out=q_out, q_in=q_in, variance=variance)
    batch = _kron_batch(op, loc=loc, q_out=q_out, q_in=q_in, variance=variance)
    return loc.new_empty((num_samples,) + tuple(batch) + (o, i), dtype=dt)


def _kron_matvec_setup(ctx, inputs, output):
    q_out, q_in, scale, v = inputs[:4]
    ctx.power = float(inputs[4]) if len(inputs) > 4 else 1.0
    ctx.save_for_backward(q_out, q_in, scale, v)


def _kron_matvec_backward(ctx, grad):
    r"""Y = Q_o K Q_i^T, K = T * S, T = Q_o^T V Q_i, S = scale^p.  With H = Q_o^T G Q_i:
    dV = Q_o (H * S) Q_i^T (the op itself: it is self-adjoint in V),
    dscale = H * T * p scale^(p-1),
    dQ_o = G Q_i K^T + V Q_i (H * S)^T,   dQ_i = G^T Q_o K + V^T Q_o (H * S)."""
    qo0, qi0, s0, v0 = ctx.saved_tensors
    p = ctx.power
    need_qo, need_qi, need_s, need_v = ctx.needs_input_grad[:4]
    dt = grad.dtype
    qo, qi, s, v = (t.to(dt) for t in (qo0, qi0, s0, v0))
    g_qo = g_qi = g_s = g_v = None
    if need_v and not (need_qo or need_qi or need_s):
        return None, None, None, _sum_to(vmf.kron_eigen_matvec(qo, qi, s, grad, p), v0), None
    h = qo.mT @ grad @ qi
    sp = s if p == 1.0 else (torch.ones_like(s) if p == 0.0 else s.pow(p))
    hs = h * sp
    if need_v:
        g_v = _sum_to(qo @ hs @ qi.mT, v0)
    if need_s or need_qo or need_qi:
        t = qo.mT @ v @ qi
        if need_s:
            if p == 0.0:
                g_s = torch.zeros_like(s0)
            else:
                ds = 1.0 if p == 1.0 else p * s.pow(p - 1.0)
                g_s = _sum_to(h * t * ds, s0)
        if need_qo or need_qi:
            k = t * sp
            if need_qo:
                g_qo = _sum_to(grad @ qi @ k.mT + v @ qi @ hs.mT, qo0)
            if need_qi:
                g_qi = _sum_to(grad.mT @ qo @ k + v.mT @ qo @ hs, qi0)
    return g_qo, g_qi, g_s, g_v, None


torch.library.register_autograd("vmfdist::kron_eigen_matvec", _kron_matvec_backward, setup_context=_kron_matvec_setup)


def _kron_noise_setup(ctx, inputs, output):
    variance, size, seed, offset = inputs[:4]
    ctx.power = float(inputs[4]) if len(inputs) > 4 else 0.5
    ctx.size, ctx.seed, ctx.offset = list(size), seed, offset
    ctx.save_for_backward(variance)


def _kron_noise_backward(ctx, grad):
    """d(E * var^p)/dvar = p E var^(p-1): the same noise, regenerated with power p - 1."""
    (variance,) = ctx.saved_tensors
    p = ctx.power
    if p == 0.0:
        return torch.zeros_like(variance), None, None, None, None
    e = vmf.kron_eigen_noise(variance.to(grad.dtype), ctx.size, ctx.seed, ctx.offset, p - 1.0)
    return _sum_to(p * grad * e, variance), None, None, None, None


torch.library.register_autograd("vmfdist::kron_eigen_noise", _kron_noise_backward, setup_context=_kron_noise_setup)


def _kron_sample_setup(ctx, inputs, output):
    loc, q_out, q_in, variance, num_samples, seed, offset = inputs
    ctx.seed, ctx.offset = seed, offset
    ctx.save_for_backward(loc, q_out, q_in, variance)


def _kron_sample_backward(ctx, grad):
    r"""W = loc + Q_o Z Q_i^T with Z = E * var^(1/2) regenerated from (seed, offset):
    dloc = G, dvar = (Q_o^T G Q_i) * E var^(-1/2) / 2, dQ_o = G Q_i Z^T, dQ_i = G^T Q_o Z
    (summed over the samples and any broadcast batch dimensions)."""
    loc0, qo0, qi0, var0 = ctx.saved_tensors
    need_loc, need_qo, need_qi, need_var = ctx.needs_input_grad[:4]
    dt = grad.dtype
    qo, qi, var = qo0.to(dt), qi0.to(dt), var0.to(dt)
    size = list(grad.shape)
    g_loc = _sum_to(grad, loc0) if need_loc else None
    g_qo = g_qi = g_var = None
    if need_var:
        h = qo.mT @ grad @ qi
        g_var = _sum_to(0.5 * h * vmf.kron_eigen_noise(var, size, ctx.seed, ctx.offset, -0.5), var0)
    if need_qo or need_qi:
        z = vmf.kron_eigen_noise(var, size, ctx.seed, ctx.offset, 0.5)
        if need_qo:
            g_qo = _sum_to(grad @ qi @ z.mT, qo0)
        if need_qi:
            g_qi = _sum_to(grad.mT @ qo @ z, qi0)
    return g_loc, g_qo, g_qi, g_var, None, None, None


torch.library.register_autograd("vmfdist::kron_eigen_sample", _kron_sample_backward, setup_context=_kron_sample_setup)


def kron_eigen_matvec(q_out: torch.Tensor, q_in: torch.Tensor, scale: torch.Tensor, v: torch.Tensor,
                      power: float = 1.0) -> torch.Tensor:
    r""":math:`Q_{out}\big((Q_{out}^T V Q_{in}) \odot S^{p}\big)Q_{in}^T`, the matrix form of
    :math:`(Q_{out}\otimes Q_{in})\,\mathrm{diag}(\mathrm{vec}\,S)^p\,(Q_{out}\otimes Q_{in})^T\mathrm{vec}\,V`
    (row-major vec), without forming the Kronecker product.

    Args:
        q_out: ``(..., out, out)`` (the eigenbasis of the output-side factor).
        q_in: ``(..., in, in)``.
        scale: ``(..., out, in)`` (or broadcastable to it), the eigenvalues :math:`S` in the
            Kronecker eigenbasis (positive when ``power`` is not an integer).
        v: ``(..., out, in)``, one matrix or a batch of right-hand sides.
        power: the exponent :math:`p` (1: multiply by the matrix, -1: solve, 1/2: its square
            root, ...).

    Batch dimensions broadcast; dtypes promote to a common floating dtype (float16,
    bfloat16, float32, float64); CPU and CUDA.  One compiled op: four matrix products
    into two buffers (one is the output) and one fused pass for :math:`\odot S^p`.
    Differentiable in every tensor argument (the bases included) to any order.  The
    bases need not be orthogonal for the op; the formula is as written.
    """
    return vmf.kron_eigen_matvec(q_out, q_in, scale, v, float(power))


def kron_eigen_sample(loc: torch.Tensor, q_out: torch.Tensor, q_in: torch.Tensor, variance: torch.Tensor,
                      sample_shape=torch.Size(), *, generator=None) -> torch.Tensor:
    r"""Draws :math:`W = M + Q_{out}(E \odot \sigma)Q_{in}^T`, :math:`\sigma = \mathrm{variance}^{1/2}`,
    :math:`E` standard normal: samples of :math:`\mathcal N(\mathrm{vec}\,M,
    (Q_{out}\otimes Q_{in})\,\mathrm{diag}(\mathrm{vec}\,\mathrm{variance})\,(Q_{out}\otimes Q_{in})^T)`
    for orthogonal bases.

    Shapes as in :func:`kron_eigen_matvec` (``loc`` and ``variance`` ``(..., out, in)``);
    returns ``sample_shape + batch + (out, in)``.  :math:`E` is drawn inside the op from
    the project's Philox streams (``kron_eigen_noise``; the seed comes from ``generator``,
    default ``torch.default_generator``, via ``vmfdist.random.draw_seed_offset``), and
    is regenerated in the backward pass instead of being stored.  Reparameterised:
    differentiable in ``loc``, ``variance`` and both bases.
    """
    from .random import draw_seed_offset  # (vmfdist.random imports this module)

    sample_shape = torch.Size(sample_shape)
    n = 1
    for k in sample_shape:
        n *= k
    seed, offset = draw_seed_offset(generator, loc.device)
    w = vmf.kron_eigen_sample(loc, q_out, q_in, variance, n, seed, offset)
    return w.reshape(sample_shape + w.shape[1:])
