"""Fake kernels and autograd of the Kronecker-eigenbasis ops (``csrc/include/vmfdist/kron.h``,
``kron_host.h``).
"""
from __future__ import annotations

import torch

from ._lib import _check_same_device, _sum_to, lib


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


def _kron_operands(op, x_name, x, q_out, q_in, s_name, s):
    """The checks of the two fake kernels below (as csrc/host/kron_host.h makes them): x of shape
    (..., out, in), the eigenbases q_out, q_in and s (the eigenvalues) broadcasting to x.
    Returns (out, in, the promoted dtype, the broadcast batch shape)."""
    named = {x_name: x, "q_out": q_out, "q_in": q_in, s_name: s}
    _check_same_device(op, **named)
    torch._check(x.dim() >= 2, lambda: f"{op}: {x_name} must have shape (..., out, in), got {tuple(x.shape)}")
    o, i = x.shape[-2], x.shape[-1]
    _kron_check_matrix(op, "q_out", q_out, o, o, f"the out x out eigenbasis, out = {x_name}.size(-2)")
    _kron_check_matrix(op, "q_in", q_in, i, i, f"the in x in eigenbasis, in = {x_name}.size(-1)")
    _kron_check_bcast(op, s_name, s, o, i, f"the eigenvalues, like {x_name}")
    return o, i, _kron_promote(op, **named), _kron_batch(op, **named)


@torch.library.register_fake("vmfdist::kron_eigen_matvec")
def _(q_out, q_in, scale, v, power=1.0):
    o, i, dt, batch = _kron_operands("kron_eigen_matvec", "v", v, q_out, q_in, "scale", scale)
    return v.new_empty(tuple(batch) + (o, i), dtype=dt)


@torch.library.register_fake("vmfdist::kron_eigen_noise")
def _(variance, size, seed_offset, power=0.5):
    torch._check(len(size) >= 2, lambda: f"kron_eigen_noise: size must have at least 2 dimensions, got {size}")
    torch._check(variance.dtype.is_floating_point,
                 lambda: f"kron_eigen_noise: variance must be a floating tensor, got dtype {variance.dtype}")
    return variance.new_empty(size)


@torch.library.register_fake("vmfdist::kron_eigen_noise_keyed")
def _(variance, size, seed_offsets, power=0.5):
    op = "kron_eigen_noise_keyed"
    torch._check(len(size) >= 2, lambda: f"{op}: size must have at least 2 dimensions, got {size}")
    torch._check(variance.dtype.is_floating_point, lambda: f"{op}: variance must be a floating tensor, got dtype "
                 f"{variance.dtype}")
    torch._check(seed_offsets.dtype == torch.int64 and seed_offsets.dim() == 2 and seed_offsets.shape[1] == 2,
                 lambda: f"{op}: seed_offsets must be an int64 tensor of shape (matrices, 2), got dtype "
                 f"{seed_offsets.dtype} and shape {tuple(seed_offsets.shape)}")
    return variance.new_empty(size)


@torch.library.register_fake("vmfdist::kron_eigen_sample")
def _(loc, q_out, q_in, variance, num_samples, *, generator=None, seed=None, offset=None):
    op = "kron_eigen_sample"
    torch._check(num_samples >= 0, lambda: f"{op}: num_samples must be non-negative, got {num_samples}")
    o, i, dt, batch = _kron_operands(op, "loc", loc, q_out, q_in, "variance", variance)
    return loc.new_empty((num_samples,) + tuple(batch) + (o, i), dtype=dt), loc.new_empty((2,), dtype=torch.int64)


def _kron_check_2d(op, name, t, rows, cols, what):
    torch._check(t.dim() == 2 and t.shape[0] == rows and t.shape[1] == cols,
                 lambda: f"{op}: {name} must have shape ({rows}, {cols}) ({what}), got shape {tuple(t.shape)}")


def _kron_check_dtypes(op, ref_name, ref, **named):
    torch._check(ref.dtype.is_floating_point,
                 lambda: f"{op}: {ref_name} must be a floating tensor, got dtype {ref.dtype}")
    for name, t in named.items():
        torch._check(t.dtype == ref.dtype,
                     lambda: f"{op}: {name} must have the dtype of {ref_name} ({ref.dtype}), got {t.dtype}")


# The two ops of the noisy K-FAC / EK-FAC update (optimizer state, no derivatives).
@torch.library.register_fake("vmfdist::kron_eigen_ngd")
def _(q_out, q_in, scale, damping, w, weight_decay, grad=None, grad_out=None, grad_in=None):
    op = "kron_eigen_ngd"
    torch._check(w.dim() == 2, lambda: f"{op}: w must be an (out, in) matrix, got shape {tuple(w.shape)}")
    o, i = w.shape
    torch._check((grad_out is None) == (grad_in is None), lambda: f"{op}: grad_out and grad_in must be given together")
    _check_same_device(op, w=w, q_out=q_out, q_in=q_in, scale=scale)
    _kron_check_2d(op, "q_out", q_out, o, o, "the out x out eigenbasis, out = w.size(0)")
    _kron_check_2d(op, "q_in", q_in, i, i, "the in x in eigenbasis, in = w.size(1)")
    _kron_check_2d(op, "scale", scale, o, i, "w's shape")
    _kron_check_dtypes(op, "w", w, q_out=q_out, q_in=q_in, scale=scale)
    if grad is not None:
        _check_same_device(op, w=w, grad=grad)
        _kron_check_2d(op, "grad", grad, o, i, "w's shape")
        _kron_check_dtypes(op, "w", w, grad=grad)
    if grad_out is not None:
        _check_same_device(op, w=w, grad_out=grad_out, grad_in=grad_in)
        torch._check(grad_out.dim() == 2 and grad_out.shape[1] == o,
                     lambda: f"{op}: grad_out must be an (n, out) matrix, out = {o}, got shape {tuple(grad_out.shape)}")
        _kron_check_2d(op, "grad_in", grad_in, grad_out.shape[0], i, "(n, in), n = grad_out.size(0)")
        _kron_check_dtypes(op, "w", w, grad_out=grad_out, grad_in=grad_in)
    return w.new_empty((o, i)), w.new_empty(())


@torch.library.register_fake("vmfdist::kron_eigen_moments")
def _(q_out, q_in, x, e, moments, beta, alpha):
    op = "kron_eigen_moments"
    torch._check(x.dim() == 2, lambda: f"{op}: x must be an (n, in) matrix (one row per example), got shape "
                                       f"{tuple(x.shape)}")
    torch._check(e.dim() == 2 and e.shape[0] == x.shape[0],
                 lambda: f"{op}: e must be an (n, out) matrix with x's {x.shape[0]} rows, got shape {tuple(e.shape)}")
    o, i = e.shape[1], x.shape[1]
    _check_same_device(op, x=x, e=e, q_out=q_out, q_in=q_in, moments=moments)
    _kron_check_2d(op, "q_out", q_out, o, o, "the out x out eigenbasis, out = e.size(1)")
    _kron_check_2d(op, "q_in", q_in, i, i, "the in x in eigenbasis, in = x.size(1)")
    _kron_check_2d(op, "moments", moments, o, i, "(out, in)")
    _kron_check_dtypes(op, "x", x, e=e, q_out=q_out, q_in=q_in, moments=moments)
    return moments.new_empty((o, i))


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
        return None, None, None, _sum_to(lib.kron_eigen_matvec(qo, qi, s, grad, p), v0), None
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
    variance, size, seed_offset = inputs[:3]
    ctx.power = float(inputs[3]) if len(inputs) > 3 else 0.5
    ctx.size = list(size)
    ctx.save_for_backward(variance, seed_offset)


def _kron_noise_backward(ctx, grad):
    """d(E * var^p)/dvar = p E var^(p-1): the same noise, regenerated with power p - 1."""
    variance, seed_offset = ctx.saved_tensors
    p = ctx.power
    if p == 0.0:
        return torch.zeros_like(variance), None, None, None
    e = lib.kron_eigen_noise(variance.to(grad.dtype), ctx.size, seed_offset, p - 1.0)
    return _sum_to(p * grad * e, variance), None, None, None


torch.library.register_autograd("vmfdist::kron_eigen_noise", _kron_noise_backward, setup_context=_kron_noise_setup)


def _kron_sample_setup(ctx, inputs, keyword_only_inputs, output):
    loc, q_out, q_in, variance = inputs[:4]
    ctx.save_for_backward(loc, q_out, q_in, variance, output[1])


def _kron_sample_backward(ctx, grad, grad_seed_offset):
    r"""W = loc + Q_o Z Q_i^T with Z = E * var^(1/2) regenerated from (seed_offset):
    dloc = G, dvar = (Q_o^T G Q_i) * E var^(-1/2) / 2, dQ_o = G Q_i Z^T, dQ_i = G^T Q_o Z
    (summed over the samples and any broadcast batch dimensions)."""
    loc0, qo0, qi0, var0, seed_offset = ctx.saved_tensors
    need_loc, need_qo, need_qi, need_var = ctx.needs_input_grad[:4]
    dt = grad.dtype
    qo, qi, var = qo0.to(dt), qi0.to(dt), var0.to(dt)
    size = list(grad.shape)
    g_loc = _sum_to(grad, loc0) if need_loc else None
    g_qo = g_qi = g_var = None
    if need_var:
        h = qo.mT @ grad @ qi
        g_var = _sum_to(0.5 * h * lib.kron_eigen_noise(var, size, seed_offset, -0.5), var0)
    if need_qo or need_qi:
        z = lib.kron_eigen_noise(var, size, seed_offset, 0.5)
        if need_qo:
            g_qo = _sum_to(grad @ qi @ z.mT, qo0)
        if need_qi:
            g_qi = _sum_to(grad.mT @ qo @ z, qi0)
    return g_loc, g_qo, g_qi, g_var, None


torch.library.register_autograd("vmfdist::kron_eigen_sample", _kron_sample_backward, setup_context=_kron_sample_setup)
