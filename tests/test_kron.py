"""Tests of the Kronecker-eigenbasis ops (kron_eigen_matvec / kron_eigen_noise /
kron_eigen_sample) and of vmfdist.distributions.MatrixNormal /
EigenvalueCorrectedMatrixNormal.

The independent reference is dense linear algebra on the (out*in) x (out*in)
covariance (torch.kron, torch.distributions.MultivariateNormal), built only here;
every Kronecker identity the code relies on is checked against it.  Random ops are
tested statistically with tolerances from standard errors.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Independent, MultivariateNormal, Normal, kl_divergence

from vmfdist.distributions import EigenvalueCorrectedMatrixNormal, MatrixNormal
from vmfdist.distributions import matrix_normal as mn
from vmfdist._ops import lib
from vmfdist import linalg
from vmfdist.linalg import kron_eigen_matvec, kron_eigen_sample
from vmfdist.testing import cpu_and_cuda

F64 = torch.float64
Z = 4.5  # standard errors allowed in statistical tests (two-sided p ~ 7e-6 each)


# ---------------------------------------------------------------------------
# helpers: random parameters and the dense references


def gen(seed):
    return torch.Generator().manual_seed(seed)


def _so(seed, offset, device="cpu"):
    """The int64 (2,) [seed, offset] tensor that kron_eigen_sample returns and kron_eigen_noise takes."""
    return torch.tensor([seed, offset], dtype=torch.int64, device=device)


def orth(n, seed, batch=(), dtype=F64):
    q, r = torch.linalg.qr(torch.randn(*batch, n, n, generator=gen(seed), dtype=F64))
    return (q * torch.sign(r.diagonal(dim1=-2, dim2=-1)).unsqueeze(-2)).to(dtype)


def spd(n, seed, batch=(), dtype=F64):
    a = torch.randn(*batch, n, n, generator=gen(seed), dtype=F64)
    return (a @ a.mT / n + 0.5 * torch.eye(n, dtype=F64)).to(dtype)


def pos(shape, seed, dtype=F64, lo=0.2):
    return (lo + torch.rand(*shape, generator=gen(seed), dtype=F64) * 2).to(dtype)


def randn(shape, seed, dtype=F64):
    return torch.randn(*shape, generator=gen(seed), dtype=F64).to(dtype)


def bkron(a, b):
    """Batched Kronecker product (torch.kron on the last two dimensions)."""
    n1, n2 = a.shape[-2:]
    m1, m2 = b.shape[-2:]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return (a[..., :, None, :, None] * b[..., None, :, None, :]).reshape(*batch, n1 * m1, n2 * m2)


def vec(x):
    return x.reshape(*x.shape[:-2], -1)


def dense_mn(d):
    """MultivariateNormal on vec W (row-major) for a MatrixNormal."""
    return MultivariateNormal(vec(d.loc), covariance_matrix=bkron(d.row_covariance, d.column_covariance))


def dense_emvg(d):
    k = bkron(d.q_out, d.q_in)
    cov = k @ torch.diag_embed(vec(d.eigenvalues)) @ k.mT
    return MultivariateNormal(vec(d.loc), covariance_matrix=0.5 * (cov + cov.mT))


def dense_diag(p):
    return MultivariateNormal(vec(p.base_dist.loc), covariance_matrix=torch.diag_embed(vec(p.base_dist.scale.pow(2))))


def dense_matvec(q_out, q_in, scale, v, power):
    k = bkron(q_out, q_in)
    y = k @ (vec(scale.pow(power)).unsqueeze(-1) * (k.mT @ vec(v).unsqueeze(-1)))
    return y.squeeze(-1).reshape(y.shape[:-2] + v.shape[-2:])


def make_mn(out, inn, seed, batch=(), tril=False):
    loc = randn(batch + (out, inn), seed)
    u, v = spd(out, seed + 1, batch), spd(inn, seed + 2)
    if tril:
        return MatrixNormal(loc, row_scale_tril=torch.linalg.cholesky(u), column_scale_tril=torch.linalg.cholesky(v))
    return MatrixNormal(loc, u, v)


def make_emvg(out, inn, seed, batch=(), q=None):
    q_out, q_in = q if q is not None else (orth(out, seed + 1), orth(inn, seed + 2, batch))
    return EigenvalueCorrectedMatrixNormal(randn(batch + (out, inn), seed), q_out, q_in, pos(batch + (out, inn), seed + 3))


def make_diag(out, inn, seed, batch=()):
    return Independent(Normal(randn(batch + (out, inn), seed), pos(batch + (out, inn), seed + 1, lo=0.5)), 2)


# ---------------------------------------------------------------------------
# Kronecker identities, against dense linear algebra


def test_bkron_is_torch_kron():
    a, b = randn((3, 2), 0), randn((4, 5), 1)
    torch.testing.assert_close(bkron(a, b), torch.kron(a, b), rtol=0, atol=0)
    ab = randn((2, 3, 3), 2)
    torch.testing.assert_close(bkron(ab, b)[1], torch.kron(ab[1], b), rtol=0, atol=0)


def test_identity_vec_row_major():
    """vec(A X B^T) = (A kron B) vec(X) for the row-major vec (reshape(-1))."""
    a, x, b = randn((3, 4), 0), randn((4, 5), 1), randn((2, 5), 2)
    torch.testing.assert_close(vec(a @ x @ b.T), torch.kron(a, b) @ vec(x), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("n,m", [(2, 3), (3, 2), (4, 1), (1, 4)])
def test_identity_determinant_corrected_exponents(n, m):
    """det(U kron V) = det(U)^m det(V)^n for U n x n, V m x m (the ELBO notes swap the exponents)."""
    u, v = spd(n, 0) * 1.7, spd(m, 1) * 0.6
    dense = torch.logdet(torch.kron(u, v))
    torch.testing.assert_close(dense, m * torch.logdet(u) + n * torch.logdet(v), rtol=1e-12, atol=1e-12)
    if n != m:  # the swapped form of the ELBO notes (sec. 3.3) is wrong whenever n != m and the determinants are not 1
        assert not torch.allclose(dense, n * torch.logdet(u) + m * torch.logdet(v))
    a, b = torch.linalg.cholesky(u), torch.linalg.cholesky(v)
    torch.testing.assert_close(2 * mn.kron_half_logdet(a, b), dense, rtol=1e-12, atol=1e-12)


def test_identity_inverse_cholesky_mixed_product():
    u, v = spd(3, 0), spd(4, 1)
    torch.testing.assert_close(torch.linalg.inv(torch.kron(u, v)), torch.kron(torch.linalg.inv(u), torch.linalg.inv(v)),
                               rtol=1e-10, atol=1e-12)
    a, b = torch.linalg.cholesky(u), torch.linalg.cholesky(v)
    # the Cholesky factor of U kron V is A kron B (lower triangular, positive diagonal)
    torch.testing.assert_close(torch.linalg.cholesky(torch.kron(u, v)), torch.kron(a, b), rtol=1e-10, atol=1e-12)
    c, d = randn((3, 3), 2), randn((4, 4), 3)
    torch.testing.assert_close(torch.kron(u, v) @ torch.kron(c, d), torch.kron(u @ c, v @ d), rtol=1e-12, atol=1e-12)


def test_identity_mahalanobis_trace_diag():
    u, v, up, vp = spd(3, 0), spd(4, 1), spd(3, 2), spd(4, 3)
    a, b, ap, bp = (torch.linalg.cholesky(x) for x in (u, v, up, vp))
    d = randn((3, 4), 4)
    dense = vec(d) @ torch.linalg.solve(torch.kron(u, v), vec(d))
    torch.testing.assert_close(mn.kron_mahalanobis(a, b, d), dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dense, torch.trace(torch.linalg.solve(u, d) @ torch.linalg.solve(v, d.T)),
                               rtol=1e-12, atol=1e-12)
    tr_dense = torch.trace(torch.linalg.solve(torch.kron(up, vp), torch.kron(u, v)))
    tr_fact = torch.trace(torch.linalg.solve(up, u)) * torch.trace(torch.linalg.solve(vp, v))
    torch.testing.assert_close(tr_dense, tr_fact, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mn._tril_trace_ratio(ap, a) * mn._tril_trace_ratio(bp, b), tr_dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.kron(u, v).diagonal(), vec(u.diagonal()[:, None] * v.diagonal()[None, :]),
                               rtol=1e-14, atol=0)


def test_identity_eigenbasis_covariance():
    """(Q_o kron Q_i) diag(vec S) (Q_o kron Q_i)^T: eigenvalues vec S, log det sum log S, and
    marginal variance (Q_o*Q_o) S (Q_i*Q_i)^T; Q_o kron Q_i is orthogonal."""
    qo, qi, s = orth(3, 0), orth(4, 1), pos((3, 4), 2)
    k = torch.kron(qo, qi)
    torch.testing.assert_close(k.T @ k, torch.eye(12, dtype=F64), rtol=0, atol=1e-13)
    cov = k @ torch.diag(vec(s)) @ k.T
    torch.testing.assert_close(torch.linalg.eigvalsh(cov), vec(s).sort().values, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.logdet(cov), s.log().sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vec(mn.eigen_marginal_variance(qo, qi, s)), cov.diagonal(), rtol=1e-12, atol=1e-13)
    # the projection Q_o^T D Q_i is K^T vec D
    d = randn((3, 4), 3)
    torch.testing.assert_close(vec(qo.T @ d @ qi), k.T @ vec(d), rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------
# kron_eigen_matvec


@pytest.mark.parametrize("power", [1.0, 0.5, -0.5, -1.0, 2.0, 0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_matvec_matches_dense(power, dtype):
    qo, qi, s, v = orth(5, 0, dtype=dtype), orth(3, 1, dtype=dtype), pos((5, 3), 2, dtype), randn((4, 5, 3), 3, dtype)
    y = kron_eigen_matvec(qo, qi, s, v, power)
    assert y.dtype == dtype and y.shape == (4, 5, 3)
    ref = dense_matvec(qo.double(), qi.double(), s.double(), v.double(), power)
    tol = 1e-12 if dtype == F64 else 2e-5
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_matvec_broadcasting_and_non_square():
    """Batched bases and scales broadcast against v; out != in; non-orthogonal bases follow the formula."""
    qo = randn((2, 1, 4, 4), 0)  # batch (2, 1)
    qi = orth(2, 1, batch=(3,))  # batch (3,)
    s = pos((1, 3, 4, 2), 2)     # batch (1, 3)
    v = randn((4, 2), 3)         # unbatched
    y = kron_eigen_matvec(qo, qi, s, v, -0.5)
    assert y.shape == (2, 3, 4, 2)
    torch.testing.assert_close(y, dense_matvec(qo, qi, s, v, -0.5), rtol=1e-12, atol=1e-12)


def test_matvec_and_sample_broadcast_trailing_scale():
    """scale / variance of trailing shape (out, 1), (1, in) or (1, 1) broadcast; gradients sum back."""
    qo, qi, v = orth(4, 0), orth(3, 1), randn((2, 4, 3), 3)
    for shape in [(4, 1), (1, 3), (1, 1)]:
        s = pos(shape, 2).requires_grad_()
        torch.testing.assert_close(kron_eigen_matvec(qo, qi, s, v, 0.5), dense_matvec(qo, qi, s.expand(4, 3), v, 0.5),
                                   rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(lambda t: kron_eigen_matvec(qo, qi, t, v, 0.5), (s,))
        assert torch.autograd.gradcheck(lambda t: lib.kron_eigen_sample(v, qo, qi, t, 2, seed=5, offset=0)[0], (s,))


def test_matvec_power_algebra():
    """power -1 inverts power 1, power 1/2 twice is power 1 (the natural-gradient uses)."""
    qo, qi, s, v = orth(6, 0), orth(4, 1), pos((6, 4), 2), randn((3, 6, 4), 3)
    y = kron_eigen_matvec(qo, qi, s, v, 1.0)
    torch.testing.assert_close(kron_eigen_matvec(qo, qi, s, y, -1.0), v, rtol=1e-12, atol=1e-12)
    h = kron_eigen_matvec(qo, qi, s, kron_eigen_matvec(qo, qi, s, v, 0.5), 0.5)
    torch.testing.assert_close(h, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("power", [1.0, -1.0, 0.5, -0.5])
def test_matvec_extreme_scales(power):
    """Eigenvalues spread over 1e-150 .. 1e150: the fused pass stays exact (no pow overflow
    for the special powers), and 0^0 = 1."""
    qo, qi, v = orth(5, 0), orth(4, 1), randn((5, 4), 2)
    s = 10.0 ** (300 * torch.rand(5, 4, generator=gen(3), dtype=F64) - 150)
    y, ref = kron_eigen_matvec(qo, qi, s, v, power), dense_matvec(qo, qi, s, v, power)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12 * ref.abs().max().item())
    z = torch.zeros(5, 4, dtype=F64)
    torch.testing.assert_close(kron_eigen_matvec(qo, qi, z, v, 0.0), v, rtol=1e-12, atol=1e-12)
    assert torch.equal(kron_eigen_matvec(qo, qi, z, v, 1.0), torch.zeros_like(v))


def test_matvec_non_contiguous_and_empty():
    qo, qi, s = orth(4, 0), orth(3, 1), pos((4, 3), 2)
    v = randn((2, 3, 4), 4).transpose(-1, -2)  # (2, 4, 3), non-contiguous
    torch.testing.assert_close(kron_eigen_matvec(qo.T.contiguous().T, qi, s, v), dense_matvec(qo, qi, s, v, 1.0),
                               rtol=1e-12, atol=1e-12)
    assert kron_eigen_matvec(qo, qi, s, torch.zeros(0, 4, 3, dtype=F64)).shape == (0, 4, 3)
    e = kron_eigen_matvec(torch.zeros(0, 0, dtype=F64), qi, torch.zeros(0, 3, dtype=F64), torch.zeros(2, 0, 3, dtype=F64))
    assert e.shape == (2, 0, 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matvec_low_precision(dtype):
    qo, qi, s, v = orth(8, 0), orth(6, 1), pos((8, 6), 2), randn((2, 8, 6), 3)
    y = kron_eigen_matvec(qo.to(dtype), qi.to(dtype), s.to(dtype), v.to(dtype), 0.5)
    assert y.dtype == dtype
    ref = dense_matvec(qo.to(dtype).double(), qi.to(dtype).double(), s.to(dtype).double(), v.to(dtype).double(), 0.5)
    assert (y.double() - ref).abs().max() < 0.05 * ref.abs().max()


def test_matvec_dtype_promotion():
    qo, qi, s, v = orth(3, 0), orth(2, 1), pos((3, 2), 2), randn((3, 2), 3)
    y = kron_eigen_matvec(qo.float(), qi, s.float(), v.float())
    assert y.dtype == F64
    torch.testing.assert_close(y, dense_matvec(qo.float().double(), qi, s.float().double(), v.float().double(), 1.0))


@pytest.mark.parametrize("power", [1.0, 0.5, -1.0, 0.0, 0.3])
def test_matvec_gradcheck(power):
    qo = randn((2, 3, 3), 0).requires_grad_()  # general (non-orthogonal) bases: the op is the formula
    qi = randn((4, 4), 1).requires_grad_()
    s = pos((3, 4), 2).requires_grad_()
    v = randn((2, 1, 3, 4), 3).requires_grad_()

    def f(a, b, c, d):
        return kron_eigen_matvec(a, b, c, d, power)

    assert torch.autograd.gradcheck(f, (qo, qi, s, v))
    assert torch.autograd.gradgradcheck(f, (qo, qi, s, v))
    # the fast path when only v needs a gradient
    assert torch.autograd.gradcheck(lambda d: f(qo.detach(), qi.detach(), s.detach(), d), (v,))


def test_matvec_errors():
    qo, qi, s, v = orth(3, 0), orth(2, 1), pos((3, 2), 2), randn((3, 2), 3)
    with pytest.raises(RuntimeError, match="q_out must have trailing shape"):
        kron_eigen_matvec(orth(2, 0), qi, s, v)
    with pytest.raises(RuntimeError, match="q_in must have trailing shape"):
        kron_eigen_matvec(qo, randn((2, 3), 0), s, v)
    with pytest.raises(RuntimeError, match="scale must have trailing shape"):
        kron_eigen_matvec(qo, qi, pos((2, 3), 0), v)
    with pytest.raises(RuntimeError, match="v must have shape"):
        kron_eigen_matvec(qo, qi, s, randn((3,), 0))
    with pytest.raises(RuntimeError, match="does not broadcast"):
        kron_eigen_matvec(qo.expand(2, 3, 3), qi, s, v.expand(3, 3, 2))
    with pytest.raises(RuntimeError, match="v must be a floating tensor"):
        kron_eigen_matvec(qo, qi, s, torch.ones(3, 2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="power must be finite"):
        kron_eigen_matvec(qo, qi, s, v, math.inf)


def test_opcheck_kron_ops():
    qo, qi = randn((2, 3, 3), 0), randn((4, 4), 1)
    s, v = pos((3, 4), 2), randn((2, 3, 4), 3)
    torch.library.opcheck(lib.kron_eigen_matvec, (qo, qi, s, v, 0.5))
    torch.library.opcheck(lib.kron_eigen_matvec, (qo.float(), qi.float(), s.float(), v.float()))
    torch.library.opcheck(lib.kron_eigen_noise, (s, [2, 3, 4], _so(7, 1), -0.5))
    torch.library.opcheck(lib.kron_eigen_sample, (v, qo, qi, s, 3), {"seed": 123, "offset": 0})


def test_plain_matrix_path_matches_the_batched_one():
    """2-D operands of one dtype take a shorter path (plain GEMMs): the same values as a batch of one
    (which takes the batched path) and as the dense formula; the sample's noise is the same stream."""
    qo, qi, s, v = orth(6, 0), orth(4, 1), pos((6, 4), 2), randn((6, 4), 3)
    for power in (1.0, -1.0, 0.5, 0.3):
        y = lib.kron_eigen_matvec(qo, qi, s, v, power)
        torch.testing.assert_close(y, lib.kron_eigen_matvec(qo, qi, s, v.unsqueeze(0), power)[0], rtol=1e-13,
                                   atol=1e-13)
        torch.testing.assert_close(y, dense_matvec(qo, qi, s, v, power), rtol=1e-12, atol=1e-12)
    w = lib.kron_eigen_sample(v, qo, qi, s, 1, seed=5, offset=3)[0]
    wb = lib.kron_eigen_sample(v.unsqueeze(0), qo, qi, s, 1, seed=5, offset=3)[0]
    e = lib.kron_eigen_noise(s, [1, 6, 4], _so(5, 3), 0.5)
    assert w.shape == (1, 6, 4)
    torch.testing.assert_close(w, wb[:, 0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(w[0], v + qo @ e[0] @ qi.T, rtol=1e-13, atol=1e-13)
    # a broadcast (1, in) scale is not a plain matrix: still the formula
    s1 = pos((1, 4), 4)
    torch.testing.assert_close(lib.kron_eigen_matvec(qo, qi, s1, v, -1.0), dense_matvec(qo, qi, s1.expand(6, 4), v, -1.0),
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# kron_eigen_ngd / kron_eigen_moments (the noisy K-FAC / EK-FAC update)


@pytest.mark.parametrize("ngd", [linalg.kron_eigen_ngd, linalg.kron_eigen_ngd_op], ids=["public", "op"])
@pytest.mark.parametrize("form", ["matrix", "rows", "both", "none"])
def test_ngd_is_the_damped_dense_solve(form, ngd):
    """D = P^{-1} U with P = (Q_out (x) Q_in) diag(vec(scale) + damping) (Q_out (x) Q_in)^T (dense solve) and
    U = weight_decay * w + grad + grad_out^T grad_in; the second output is <D, U>."""
    out, inn, n = 5, 3, 7
    qo, qi, s = orth(out, 0), orth(inn, 1), pos((out, inn), 2)
    w, g, go, gi = randn((out, inn), 3), randn((out, inn), 4), randn((n, out), 5), randn((n, inn), 6)
    damping, wd = 0.3, 0.05
    kw = {}
    u = wd * w
    if form in ("matrix", "both"):
        kw["grad"] = g
        u = u + g
    if form in ("rows", "both"):
        kw["grad_out"], kw["grad_in"] = go, gi
        u = u + go.T @ gi
    d, inner = ngd(qo, qi, s, damping, w, wd, **kw)
    k = torch.kron(qo, qi)
    p = k @ torch.diag(vec(s) + damping) @ k.T
    ref = torch.linalg.solve(p, vec(u)).reshape(out, inn)
    torch.testing.assert_close(d, ref, rtol=1e-12, atol=1e-13)
    assert inner.shape == ()
    torch.testing.assert_close(inner, (ref * u).sum(), rtol=1e-12, atol=1e-13)
    d32, _ = ngd(qo.float(), qi.float(), s.float(), damping, w.float(), wd, **{key: t.float() for key, t in kw.items()})
    torch.testing.assert_close(d32.double(), ref, rtol=2e-5, atol=2e-5 * ref.abs().max().item())


@pytest.mark.parametrize("moments", [linalg.kron_eigen_moments, linalg.kron_eigen_moments_op], ids=["public", "op"])
def test_moments_are_the_per_example_second_moments(moments):
    """beta * M + alpha * sum_n (Q_out^T e_n x_n^T Q_in)^2, the per-example products built one by one."""
    out, inn, n = 4, 6, 5
    qo, qi, m = orth(out, 0), orth(inn, 1), pos((out, inn), 2)
    x, e = randn((n, inn), 3), randn((n, out), 4)
    got = moments(qo, qi, x, e, m, 0.9, 0.25)
    ref = 0.9 * m + 0.25 * sum((qo.T @ torch.outer(e[k], x[k]) @ qi) ** 2 for k in range(n))
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-13)


def test_ngd_and_moments_errors():
    qo, qi, s, w = orth(3, 0), orth(2, 1), pos((3, 2), 2), randn((3, 2), 3)
    x, e = randn((4, 2), 4), randn((4, 3), 5)
    with pytest.raises(RuntimeError, match=r"kron_eigen_ngd: q_out must be the \(out, out\) eigenbasis"):
        lib.kron_eigen_ngd(orth(2, 0), qi, s, 0.1, w, 0.0)
    with pytest.raises(RuntimeError, match="kron_eigen_ngd: scale must have w's shape"):
        lib.kron_eigen_ngd(qo, qi, pos((2, 3), 0), 0.1, w, 0.0)
    with pytest.raises(RuntimeError, match="kron_eigen_ngd: grad must have w's shape"):
        lib.kron_eigen_ngd(qo, qi, s, 0.1, w, 0.0, grad=randn((2, 3), 0))
    with pytest.raises(RuntimeError, match="grad_out and grad_in must be given together"):
        lib.kron_eigen_ngd(qo, qi, s, 0.1, w, 0.0, grad_out=e)
    with pytest.raises(RuntimeError, match="grad_in must be an \\(n, in\\) matrix with grad_out's 4 rows"):
        lib.kron_eigen_ngd(qo, qi, s, 0.1, w, 0.0, grad_out=e, grad_in=randn((3, 2), 0))
    with pytest.raises(RuntimeError, match=r"kron_eigen_ngd: scale must have the dtype of w \(Double\), got Float"):
        lib.kron_eigen_ngd(qo, qi, s.float(), 0.1, w, 0.0)
    with pytest.raises(RuntimeError, match="damping must be finite"):
        lib.kron_eigen_ngd(qo, qi, s, math.nan, w, 0.0)
    with pytest.raises(RuntimeError, match="kron_eigen_moments: e must be an \\(n, out\\) matrix with x's 4 rows"):
        lib.kron_eigen_moments(qo, qi, x, e[:3], s, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="kron_eigen_moments: moments must have shape"):
        lib.kron_eigen_moments(qo, qi, x, e, s.T, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="kron_eigen_moments: q_in must be the"):
        lib.kron_eigen_moments(qo, orth(3, 0), x, e, s, 1.0, 1.0)
    with pytest.raises(RuntimeError, match="kron_eigen_moments: x must be a floating tensor"):
        lib.kron_eigen_moments(qo, qi, x.long(), e, s, 1.0, 1.0)


def test_public_entry_points_for_the_optimizers():
    """linalg's *_op names are the compiled overloads; kron_eigen_ngd / kron_eigen_moments run without a
    graph on parameters that require grad (an optimizer update), give the op's numbers, take numbers for
    the float arguments and pass the op's errors on; random.random_kwargs is the sampler's randomness."""
    from vmfdist import random as vrandom

    v = torch.ops.vmfdist
    assert linalg.kron_eigen_matvec_op is v.kron_eigen_matvec.default
    assert linalg.kron_eigen_sample_op is v.kron_eigen_sample.default
    assert linalg.kron_eigen_ngd_op is v.kron_eigen_ngd.default
    assert linalg.kron_eigen_moments_op is v.kron_eigen_moments.default
    qo, qi, s, w = orth(3, 0), orth(2, 1), pos((3, 2), 2), randn((3, 2), 3).requires_grad_()
    x, e = randn((4, 2), 4), randn((4, 3), 5)
    d, inner = linalg.kron_eigen_ngd(qo, qi, s, 1, w, 0, grad=randn((3, 2), 6))
    assert not d.requires_grad and d.grad_fn is None
    assert torch.equal(d, lib.kron_eigen_ngd(qo, qi, s, 1.0, w.detach(), 0.0, randn((3, 2), 6))[0])
    m = linalg.kron_eigen_moments(qo, qi, x.requires_grad_(), e, s, 1, 0.5)
    assert m.grad_fn is None and torch.equal(m, lib.kron_eigen_moments(qo, qi, x.detach(), e, s, 1.0, 0.5))
    with pytest.raises(RuntimeError, match="kron_eigen_ngd: scale must have w's shape"):
        linalg.kron_eigen_ngd(qo, qi, pos((2, 3), 0), 0.1, w, 0.0)
    with pytest.raises(RuntimeError, match="kron_eigen_moments: moments must have shape"):
        linalg.kron_eigen_moments(qo, qi, x, e, s.T, 1.0, 1.0)
    with pytest.raises(TypeError, match="kron_eigen_ngd: damping must be a real number, got str"):
        linalg.kron_eigen_ngd(qo, qi, s, "0.1", w, 0.0)
    with pytest.raises(TypeError, match="kron_eigen_moments: alpha must be a real number, got NoneType"):
        linalg.kron_eigen_moments(qo, qi, x, e, s, 1.0, None)
    # the sampler overload with random_kwargs: kron_eigen_sample's samples for the same seed
    loc, var = randn((3, 2), 7), pos((3, 2), 8)
    rng = vrandom.random_kwargs("test", None, seed=5, offset=2)
    assert rng == {"seed": 5, "offset": 2}
    raw, so = linalg.kron_eigen_sample_op(loc, qo, qi, var, 1, **rng)
    assert raw.shape == (1, 3, 2) and so.tolist() == [5, 2]
    gen = torch.Generator().manual_seed(9)
    a = linalg.kron_eigen_sample_op(loc, qo, qi, var, 1, **vrandom.random_kwargs("test", gen))[0][0]
    b = kron_eigen_sample(loc, qo, qi, var, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="test: pass either generator or seed, not both"):
        vrandom.random_kwargs("test", gen, seed=1)


def test_opcheck_ngd_and_moments():
    qo, qi, s, w = orth(3, 0), orth(4, 1), pos((3, 4), 2), randn((3, 4), 3)
    go, gi = randn((5, 3), 4), randn((5, 4), 5)
    torch.library.opcheck(lib.kron_eigen_ngd, (qo, qi, s, 0.1, w, 0.2), {"grad": randn((3, 4), 6)})
    torch.library.opcheck(lib.kron_eigen_ngd, (qo.float(), qi.float(), s.float(), 0.0, w.float(), 0.2),
                          {"grad_out": go.float(), "grad_in": gi.float()})
    torch.library.opcheck(lib.kron_eigen_moments, (qo, qi, gi, go, s, 0.5, 0.1))


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_ngd_and_moments_devices_agree(device):
    qo, qi, s, w = orth(6, 0), orth(5, 1), pos((6, 5), 2), randn((6, 5), 3)
    go, gi = randn((4, 6), 4), randn((4, 5), 5)
    on = [t.to(device) for t in (qo, qi, s, w, go, gi)]
    d, inner = lib.kron_eigen_ngd(*on[:3], 0.1, on[3], 0.2, grad_out=on[4], grad_in=on[5])
    d0, inner0 = lib.kron_eigen_ngd(qo, qi, s, 0.1, w, 0.2, grad_out=go, grad_in=gi)
    torch.testing.assert_close(d.cpu(), d0, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(inner.cpu(), inner0, rtol=1e-12, atol=1e-12)
    m = lib.kron_eigen_moments(on[0], on[1], on[5], on[4], on[2], 0.9, 0.1)
    torch.testing.assert_close(m.cpu(), lib.kron_eigen_moments(qo, qi, gi, go, s, 0.9, 0.1), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# kron_eigen_noise / kron_eigen_sample


def test_noise_contract_and_thread_independence():
    """sample = loc + Q_out noise(var, 1/2) Q_in^T, and the same (seed, offset) gives the
    same tensor on any thread count; rows are the Philox streams (the float32 and float64
    Box-Muller use the same words, so they agree to float rounding)."""
    loc, qo, qi, var = randn((2, 5, 7), 0), orth(5, 1), orth(7, 2), pos((5, 7), 3)
    w = lib.kron_eigen_sample(loc, qo, qi, var, 3, seed=99, offset=5)[0]
    e = lib.kron_eigen_noise(var, [3, 2, 5, 7], _so(99, 5), 0.5)
    torch.testing.assert_close(w, loc + qo @ e @ qi.T, rtol=0, atol=1e-14)
    unit = lib.kron_eigen_noise(torch.ones(1, 1, dtype=F64), [3, 2, 5, 7], _so(99, 5), 1.0)
    torch.testing.assert_close(e, unit * var.sqrt(), rtol=1e-15, atol=0)
    e32 = lib.kron_eigen_noise(torch.ones(1, 1), [3, 2, 5, 7], _so(99, 5), 1.0)
    assert (e32.double() - unit).abs().max() < 1e-5
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = lib.kron_eigen_noise(var.float(), [64, 5, 7], _so(3, 0), 0.5)
        torch.set_num_threads(max(2, threads))
        b = lib.kron_eigen_noise(var.float(), [64, 5, 7], _so(3, 0), 0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(a, b)
    assert not torch.equal(a, lib.kron_eigen_noise(var.float(), [64, 5, 7], _so(4, 0), 0.5))
    assert not torch.equal(a, lib.kron_eigen_noise(var.float(), [64, 5, 7], _so(3, 1), 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_noise_moments(dtype):
    """Mean 0, variance 1, no correlation between neighbouring entries, rows and samples."""
    n = 200_000
    e = lib.kron_eigen_noise(torch.ones(1, 1, dtype=dtype), [n // 40, 4, 10], _so(11, 0), 0.5).double()
    x = e.reshape(-1)
    assert abs(x.mean().item()) < Z / math.sqrt(n)
    assert abs(x.var().item() - 1) < Z * math.sqrt(2 / n)
    for a, b in [(e[..., :-1], e[..., 1:]), (e[:, :-1], e[:, 1:]), (e[:-1], e[1:])]:
        assert abs((a * b).mean().item()) < Z / math.sqrt(a.numel())


def test_sample_and_noise_gradcheck():
    loc = randn((3, 4), 0).requires_grad_()
    qo = randn((2, 3, 3), 1).requires_grad_()
    qi = randn((4, 4), 2).requires_grad_()
    var = pos((2, 3, 4), 3).requires_grad_()

    def f(a, b, c, d):
        return lib.kron_eigen_sample(a, b, c, d, 3, seed=123, offset=0)[0]

    assert torch.autograd.gradcheck(f, (loc, qo, qi, var))
    assert torch.autograd.gradgradcheck(f, (loc, qo, qi, var))
    g = lambda d: lib.kron_eigen_noise(d, [3, 2, 3, 4], _so(5, 1), 0.7)  # noqa: E731
    assert torch.autograd.gradcheck(g, (var,)) and torch.autograd.gradgradcheck(g, (var,))
    assert torch.autograd.gradcheck(lambda d: lib.kron_eigen_noise(d, [3, 2, 3, 4], _so(5, 1), 0.0), (var,))


def test_sample_wrapper_generator_and_shapes():
    loc, qo, qi, var = randn((5, 3), 0), orth(5, 1), orth(3, 2), pos((5, 3), 3)
    a = kron_eigen_sample(loc, qo, qi, var, (2, 4), generator=gen(7))
    assert a.shape == (2, 4, 5, 3)
    assert torch.equal(a, kron_eigen_sample(loc, qo, qi, var, (2, 4), generator=gen(7)))
    torch.manual_seed(1)
    b = kron_eigen_sample(loc, qo, qi, var)
    torch.manual_seed(1)
    assert b.shape == (5, 3) and torch.equal(b, kron_eigen_sample(loc, qo, qi, var))
    assert kron_eigen_sample(loc, qo, qi, var, (0,)).shape == (0, 5, 3)


def test_sample_errors():
    loc, qo, qi, var = randn((5, 3), 0), orth(5, 1), orth(3, 2), pos((5, 3), 3)
    with pytest.raises(RuntimeError, match="variance must have trailing shape"):
        lib.kron_eigen_sample(loc, qo, qi, var.T, 2, seed=0, offset=0)[0]
    with pytest.raises(RuntimeError, match="q_in must have trailing shape"):
        lib.kron_eigen_sample(loc, qo, qo, var, 2, seed=0, offset=0)[0]
    with pytest.raises(RuntimeError, match="num_samples must be non-negative"):
        lib.kron_eigen_sample(loc, qo, qi, var, -1, seed=0, offset=0)[0]
    for off in (-1, 2 ** 48, 2 ** 63 - 1):
        with pytest.raises(RuntimeError, match=r"offset must be in \[0, 2\^48 - 1\]"):
            lib.kron_eigen_sample(loc, qo, qi, var, 2, seed=0, offset=off)
    with pytest.raises(RuntimeError, match=r"seed must be in \[0, 2\^63\)"):
        lib.kron_eigen_sample(loc, qo, qi, var, 2, seed=-5)
    w, so = lib.kron_eigen_sample(loc, qo, qi, var, 2, seed=3, offset=2 ** 48 - 1)  # the last valid offset
    assert so.dtype == torch.int64 and so.tolist() == [3, 2 ** 48 - 1]
    torch.testing.assert_close(w, loc + qo @ lib.kron_eigen_noise(var, [2, 5, 3], so, 0.5) @ qi.T, rtol=0, atol=1e-14)
    with pytest.raises(RuntimeError, match="seed_offset must be an int64 tensor of shape"):
        lib.kron_eigen_noise(var, [2, 5, 3], so[:1], 0.5)
    with pytest.raises(RuntimeError, match="does not broadcast to size"):
        lib.kron_eigen_noise(var, [2, 3, 5], _so(0, 0), 0.5)


def test_meta_mixed_with_cpu_is_an_error():
    """A meta argument sends the call to the fake kernel (which used to return uninitialised
    CPU memory): it must refuse arguments on different devices, naming them."""
    loc, qo, qi, var = randn((2, 6, 5), 0), orth(6, 1), orth(5, 2), pos((6, 5), 3)
    with pytest.raises(RuntimeError, match="scale must be on the same device as v, got scale on meta and v on cpu"):
        kron_eigen_matvec(qo, qi, var.to("meta"), loc, -0.5)
    with pytest.raises(RuntimeError, match="q_out must be on the same device as v"):
        lib.kron_eigen_matvec(qo.to("meta"), qi, var, loc, 1.0)
    with pytest.raises(RuntimeError, match="variance must be on the same device as loc"):
        lib.kron_eigen_sample(loc, qo, qi, var.to("meta"), 2, seed=0, offset=0)
    assert lib.kron_eigen_matvec(*(t.to("meta") for t in (qo, qi, var, loc)), 1.0).shape == (2, 6, 5)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_devices_agree(device):
    """The same op on another device: same noise (float64 to rounding), same products."""
    loc, qo, qi, var = randn((2, 6, 5), 0), orth(6, 1), orth(5, 2), pos((6, 5), 3)
    args = [t.to(device) for t in (loc, qo, qi, var)]
    w = lib.kron_eigen_sample(*args, 4, seed=17, offset=2)[0]
    torch.testing.assert_close(w.cpu(), lib.kron_eigen_sample(loc, qo, qi, var, 4, seed=17, offset=2)[0], rtol=1e-12, atol=1e-12)
    w32 = lib.kron_eigen_sample(*[t.float() for t in args], 4, seed=17, offset=2)[0]
    torch.testing.assert_close(w32.cpu(), lib.kron_eigen_sample(loc.float(), qo.float(), qi.float(), var.float(), 4,
                                                                seed=17, offset=2)[0], rtol=1e-5, atol=1e-5)
    y = kron_eigen_matvec(args[1], args[2], args[3], args[0], -0.5)
    torch.testing.assert_close(y.cpu(), dense_matvec(qo, qi, var, loc, -0.5), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# MatrixNormal


@pytest.mark.parametrize("tril", [False, True])
def test_matrix_normal_density_entropy_moments(tril):
    d = make_mn(3, 4, 0, batch=(2,), tril=tril)
    ref = dense_mn(d)
    assert d.batch_shape == (2,) and d.event_shape == (3, 4)
    x = randn((5, 2, 3, 4), 9)
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(vec(x)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(d.entropy(), ref.entropy(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vec(d.variance), ref.variance, rtol=1e-12, atol=1e-12)
    assert torch.equal(d.mean, d.loc) and torch.equal(d.mode, d.loc)
    torch.testing.assert_close(d.row_covariance @ torch.ones(3, 1, dtype=F64),
                               (d.row_scale_tril @ d.row_scale_tril.mT) @ torch.ones(3, 1, dtype=F64))


def test_matrix_normal_broadcast_expand_sample_shapes():
    loc = randn((2, 1, 3, 2), 0)
    d = MatrixNormal(loc, spd(3, 1, batch=(4,)), spd(2, 2))
    assert d.batch_shape == (2, 4)
    assert d.sample((5,)).shape == (5, 2, 4, 3, 2)
    assert d.log_prob(d.sample((5,))).shape == (5, 2, 4)
    e = d.expand((6, 2, 4))
    assert e.batch_shape == (6, 2, 4) and e.rsample().shape == (6, 2, 4, 3, 2)
    torch.testing.assert_close(e.entropy()[3], d.entropy())
    assert e.row_covariance.shape == (6, 2, 4, 3, 3)


def test_matrix_normal_rsample_moments():
    """Mean and the full 6x6 covariance of vec W against U kron V, tolerances from SEs."""
    d = make_mn(3, 2, 0)
    n = 40_000
    w = d.rsample((n,), generator=gen(3))
    _check_moments(vec(w), vec(d.loc), bkron(d.row_covariance, d.column_covariance), n)


def _check_moments(x, mean, cov, n):
    se_mean = (cov.diagonal() / n).sqrt()
    assert ((x.mean(0) - mean).abs() / se_mean).max() < Z
    c = x - mean  # the true mean: E[c_a c_b] = cov_ab, Var(c_a c_b) = cov_aa cov_bb + cov_ab^2
    emp = c.T @ c / n
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov.pow(2)) / n).sqrt()
    assert ((emp - cov).abs() / se).max() < Z


def test_matrix_normal_rsample_gradient_unbiased():
    """f(W) = |W|_F^2 has E f = |M|^2 + tr(U) tr(V), so the exact gradients are 2M, 2A tr(V)
    and 2B tr(U).  The pathwise gradients of the op equal the per-sample formulas
    2W, 2W B E^T, 2W^T A E (E recovered from W), whose spread gives the SEs."""
    loc = randn((2, 3), 0).requires_grad_()
    a = torch.linalg.cholesky(spd(2, 1)).requires_grad_()
    b = torch.linalg.cholesky(spd(3, 2)).requires_grad_()
    n = 20_000
    w = MatrixNormal(loc, row_scale_tril=a, column_scale_tril=b).rsample((n,), generator=gen(5))
    gl, ga, gb = torch.autograd.grad(w.pow(2).sum((-2, -1)).mean(), (loc, a, b))
    with torch.no_grad():
        w = w.detach()
        e = torch.linalg.solve_triangular(b, torch.linalg.solve_triangular(a, w - loc, upper=False).mT,
                                          upper=False).mT  # A^{-1} (W - M) B^{-T}
        per = {"loc": 2 * w, "a": 2 * w @ b @ e.mT, "b": 2 * w.mT @ a @ e}
        exact = {"loc": 2 * loc, "a": 2 * a * (b @ b.T).trace(), "b": 2 * b * (a @ a.T).trace()}
        for name, g in (("loc", gl), ("a", ga), ("b", gb)):
            torch.testing.assert_close(g, per[name].mean(0), rtol=1e-10, atol=1e-10)
            se = per[name].std(0) / math.sqrt(n)
            assert ((g - exact[name]).abs() <= Z * se + 1e-12).all(), name


def test_matrix_normal_kls_against_dense():
    q, p = make_mn(3, 4, 0, batch=(2,)), make_mn(3, 4, 10, tril=True)
    torch.testing.assert_close(kl_divergence(q, p), kl_divergence(dense_mn(q), dense_mn(p)).expand(2),
                               rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(kl_divergence(q, q), torch.zeros(2, dtype=F64), rtol=0, atol=1e-12)
    r = make_diag(3, 4, 20, batch=(2,))
    torch.testing.assert_close(kl_divergence(q, r), kl_divergence(dense_mn(q), dense_diag(r)), rtol=1e-11, atol=1e-11)


def test_matrix_normal_gradcheck_log_prob_and_kl():
    loc = randn((2, 3), 0).requires_grad_()
    u = spd(2, 1).requires_grad_()
    b = torch.linalg.cholesky(spd(3, 2)).requires_grad_()
    x = randn((4, 2, 3), 3)

    def lp(loc, u, b):
        return MatrixNormal(loc, row_covariance=0.5 * (u + u.mT), column_scale_tril=b.tril()).log_prob(x)

    assert torch.autograd.gradcheck(lp, (loc, u, b))
    p = make_mn(2, 3, 7)
    r = make_diag(2, 3, 8)

    def kls(loc, u, b):
        q = MatrixNormal(loc, row_covariance=0.5 * (u + u.mT), column_scale_tril=b.tril())
        return torch.stack([kl_divergence(q, p), kl_divergence(q, r), kl_divergence(p, q), q.entropy()])

    assert torch.autograd.gradcheck(kls, (loc, u, b))


def test_matrix_normal_errors():
    loc, u, v = randn((3, 2), 0), spd(3, 1), spd(2, 2)
    with pytest.raises(ValueError, match="at most one of row_covariance or row_scale_tril"):
        MatrixNormal(loc, u, v, row_scale_tril=torch.linalg.cholesky(u))
    with pytest.raises(ValueError, match="at most one of column_covariance or column_scale_tril"):
        MatrixNormal(loc, u, v, column_scale_tril=torch.linalg.cholesky(v))
    with pytest.raises(ValueError, match=r"row_covariance must have trailing shape \(3, 3\)"):
        MatrixNormal(loc, v, v)
    with pytest.raises(ValueError, match=r"column_scale_tril must have trailing shape \(2, 2\)"):
        MatrixNormal(loc, u, column_scale_tril=randn((2, 3), 0))
    with pytest.raises(ValueError, match="loc must have shape"):
        MatrixNormal(randn((3,), 0), u, v)
    with pytest.raises(ValueError, match="batch shapes of the arguments do not broadcast"):
        MatrixNormal(randn((2, 3, 2), 0), spd(3, 1, batch=(3,)), v)
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=F64)  # symmetric, not PD
    with pytest.raises(ValueError, match="column_covariance"):
        MatrixNormal(loc, u, bad, validate_args=True)
    with pytest.raises(ValueError, match="column_covariance is not positive definite"):
        MatrixNormal(loc, u, bad, validate_args=False)
    with pytest.raises(ValueError, match="row_scale_tril"):
        MatrixNormal(loc, row_scale_tril=-torch.eye(3, dtype=F64), column_covariance=v, validate_args=True)
    d = MatrixNormal(loc, u, v, validate_args=True)
    with pytest.raises(ValueError):
        d.log_prob(randn((2, 3), 0))


# ---------------------------------------------------------------------------
# EigenvalueCorrectedMatrixNormal


def test_emvg_density_entropy_moments():
    d = make_emvg(3, 4, 0, batch=(2,))
    ref = dense_emvg(d)
    x = randn((5, 2, 3, 4), 9)
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(vec(x)), rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(d.entropy(), ref.entropy(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vec(d.variance), ref.variance, rtol=1e-12, atol=1e-12)
    assert d.batch_shape == (2,) and d.eigenvalues.shape == (2, 3, 4)
    assert d.expand((3, 2)).sample((4,)).shape == (4, 3, 2, 3, 4)


def test_emvg_is_matrix_normal_when_eigenvalues_are_kronecker():
    """S = lambda_U lambda_V^T with the eigenbases of U and V is the matrix normal MN(M, U, V)."""
    u, v = spd(3, 1), spd(4, 2)
    lu, qo = torch.linalg.eigh(u)
    lv, qi = torch.linalg.eigh(v)
    loc, x = randn((3, 4), 0), randn((6, 3, 4), 5)
    e = EigenvalueCorrectedMatrixNormal(loc, qo, qi, lu[:, None] * lv[None, :])
    m = MatrixNormal(loc, u, v)
    torch.testing.assert_close(e.log_prob(x), m.log_prob(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(e.variance, m.variance, rtol=1e-12, atol=1e-12)


def test_emvg_rsample_moments():
    d = make_emvg(3, 2, 0)
    n = 40_000
    w = d.rsample((n,), generator=gen(4))
    _check_moments(vec(w), vec(d.loc), dense_emvg(d).covariance_matrix, n)


def test_emvg_rsample_gradient_unbiased():
    """With orthogonal bases |W - M|_F^2 = sum E^2 S, so d/dS of its mean is 1 (var 2/n)."""
    qo, qi = orth(3, 1), orth(2, 2)
    s = pos((3, 2), 3).requires_grad_()
    loc = randn((3, 2), 0)
    n = 20_000
    w = EigenvalueCorrectedMatrixNormal(loc, qo, qi, s).rsample((n,), generator=gen(6))
    (g,) = torch.autograd.grad((w - loc).pow(2).sum((-2, -1)).mean(), s)
    assert ((g - 1).abs() < Z * math.sqrt(2 / n)).all()


def test_emvg_kls_against_dense():
    qo, qi = orth(3, 1), orth(4, 2, batch=(2,))
    q, p = make_emvg(3, 4, 0, batch=(2,), q=(qo, qi)), make_emvg(3, 4, 10, batch=(2,), q=(qo.clone(), qi))
    torch.testing.assert_close(kl_divergence(q, p), kl_divergence(dense_emvg(q), dense_emvg(p)), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kl_divergence(q, q), torch.zeros(2, dtype=F64), rtol=0, atol=1e-12)
    r = make_diag(3, 4, 20)
    torch.testing.assert_close(kl_divergence(q, r), kl_divergence(dense_emvg(q), dense_diag(r).expand((2,))),
                               rtol=1e-10, atol=1e-10)
    other = make_emvg(3, 4, 30)
    with pytest.raises(ValueError, match="shared eigenbases only"):
        kl_divergence(q, other)


def test_emvg_gradcheck_log_prob_and_kl():
    qo, qi = orth(2, 1), orth(3, 2)
    loc = randn((2, 3), 0).requires_grad_()
    s = pos((2, 3), 3).requires_grad_()
    x = randn((4, 2, 3), 4)
    p = make_emvg(2, 3, 7, q=(qo, qi))
    r = make_diag(2, 3, 8)

    def f(loc, s):
        q = EigenvalueCorrectedMatrixNormal(loc, qo, qi, s)
        return torch.cat([q.log_prob(x), torch.stack([kl_divergence(q, p), kl_divergence(p, q), kl_divergence(q, r),
                                                      q.entropy()])])

    assert torch.autograd.gradcheck(f, (loc, s))


def test_emvg_errors():
    loc, qo, qi, s = randn((3, 2), 0), orth(3, 1), orth(2, 2), pos((3, 2), 3)
    with pytest.raises(ValueError, match=r"q_out must have trailing shape \(3, 3\)"):
        EigenvalueCorrectedMatrixNormal(loc, qi, qi, s)
    with pytest.raises(ValueError, match=r"variance must have trailing shape \(3, 2\)"):
        EigenvalueCorrectedMatrixNormal(loc, qo, qi, s.T)
    with pytest.raises(ValueError, match="q_in"):
        EigenvalueCorrectedMatrixNormal(loc, qo, qi * 1.1, s, validate_args=True)
    with pytest.raises(ValueError, match="parameter variance"):
        EigenvalueCorrectedMatrixNormal(loc, qo, qi, -s, validate_args=True)
    EigenvalueCorrectedMatrixNormal(loc.float(), qo.float(), qi.float(), s.float(), validate_args=True)
    with pytest.raises(NotImplementedError, match="Independent"):
        kl_divergence(make_emvg(3, 2, 0), Independent(Normal(randn((3, 2), 1), pos((3, 2), 2)), 1))


# ---------------------------------------------------------------------------
# hypothesis: random shapes against the dense references


@settings(max_examples=25, deadline=None)
@given(out=st.integers(1, 4), inn=st.integers(1, 4), nb=st.integers(0, 2), seed=st.integers(0, 10_000),
       power=st.sampled_from([1.0, -1.0, 0.5, -0.5, 0.25]))
def test_hypothesis_against_dense(out, inn, nb, seed, power):
    batch = (2,) * nb
    q, p = make_mn(out, inn, seed, batch=batch), make_mn(out, inn, seed + 50, tril=True)
    x = randn((3,) + batch + (out, inn), seed + 99)
    torch.testing.assert_close(q.log_prob(x), dense_mn(q).log_prob(vec(x)), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(kl_divergence(q, p), kl_divergence(dense_mn(q), dense_mn(p)).expand(batch),
                               rtol=1e-9, atol=1e-10)
    e = make_emvg(out, inn, seed, batch=batch)
    torch.testing.assert_close(e.log_prob(x), dense_emvg(e).log_prob(vec(x)), rtol=1e-10, atol=1e-10)
    v = randn(batch + (out, inn), seed + 7)
    torch.testing.assert_close(kron_eigen_matvec(e.q_out, e.q_in, e.eigenvalues, v, power),
                               dense_matvec(e.q_out, e.q_in, e.eigenvalues, v, power), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------
# MatrixNormal <-> EigenvalueCorrectedMatrixNormal KLs, identity and scalar covariances,
# constraints keyed by constructor names, clear log_prob errors


@pytest.mark.parametrize("tril", [False, True])
def test_kl_matrix_normal_emvg_both_directions_against_dense(tril):
    """Against torch's MultivariateNormal KL on the dense (nm x nm) covariances, batched and
    broadcast (the MatrixNormal batched in its row factor, the EVMN in its column basis)."""
    mn = make_mn(3, 4, 0, batch=(2,), tril=tril)
    ev = make_emvg(3, 4, 10, batch=(2,))
    ev1 = make_emvg(3, 4, 20)
    for q, p in ((mn, ev), (ev, mn), (mn, ev1), (ev1, mn)):
        ours = kl_divergence(q, p)
        dense = kl_divergence(dense_emvg(q) if q is not mn else dense_mn(q), dense_emvg(p) if p is not mn
                              else dense_mn(p))
        assert ours.shape == (2,)
        torch.testing.assert_close(ours, dense.expand(2), rtol=1e-10, atol=1e-10)
    # an EVMN with the eigenbases of U and V and S = outer(eig U, eig V) is MN(M, U, V): KL = 0 both ways
    u, v = spd(3, 5), spd(4, 6)
    lu, qu = torch.linalg.eigh(u)
    lv, qv = torch.linalg.eigh(v)
    loc = randn((3, 4), 7)
    a, b = MatrixNormal(loc, u, v), EigenvalueCorrectedMatrixNormal(loc, qu, qv, torch.outer(lu, lv))
    assert abs(kl_divergence(a, b).item()) <= 1e-12 and abs(kl_divergence(b, a).item()) <= 1e-12


def test_kl_matrix_normal_emvg_monte_carlo():
    q, p = make_mn(2, 3, 1), make_emvg(2, 3, 2)
    for a, b in ((q, p), (p, q)):
        x = a.sample((20000,), generator=gen(3))
        lr = a.log_prob(x) - b.log_prob(x)
        assert abs(lr.mean().item() - kl_divergence(a, b).item()) <= Z * lr.std().item() / math.sqrt(len(lr))
    with pytest.raises(ValueError, match="event shapes differ"):
        kl_divergence(make_mn(2, 3, 1), make_emvg(3, 2, 2))


def test_kl_matrix_normal_emvg_gradcheck():
    qo, qi = orth(2, 1), orth(3, 2)
    loc = randn((2, 3), 0).requires_grad_()
    s = pos((2, 3), 3).requires_grad_()
    a = torch.linalg.cholesky(spd(2, 4)).requires_grad_()
    m = make_mn(2, 3, 5)

    def f(loc, s, a):
        e = EigenvalueCorrectedMatrixNormal(loc, qo, qi, s)
        n = MatrixNormal(m.loc, row_scale_tril=a.tril(), column_covariance=m.column_covariance)
        return torch.stack([kl_divergence(e, n), kl_divergence(n, e), kl_divergence(e, m), kl_divergence(m, e)])

    assert torch.autograd.gradcheck(f, (loc, s, a))


def test_matrix_normal_identity_and_scalar_covariances():
    loc = randn((2, 3, 4), 0)
    x = randn((5, 2, 3, 4), 1)
    iid = Independent(Normal(loc, torch.ones_like(loc)), 2)
    for d in (MatrixNormal(loc), MatrixNormal(loc, 1.0, 1.0), MatrixNormal(loc, row_scale_tril=1.0)):
        torch.testing.assert_close(d.log_prob(x), iid.log_prob(x), rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(d.entropy(), iid.entropy(), rtol=1e-13, atol=1e-13)
        assert d.batch_shape == (2,) and d.event_shape == (3, 4)
        torch.testing.assert_close(d.row_covariance, torch.eye(3, dtype=F64).expand(2, 3, 3), rtol=0, atol=0)
        torch.testing.assert_close(d.column_covariance, torch.eye(4, dtype=F64).expand(2, 4, 4), rtol=0, atol=0)
    # scalars: U = c I (covariance), A = s I (scale_tril), mixed with a full matrix on the other side
    v = spd(4, 2)
    d = MatrixNormal(loc, 2.5, v)
    ref = MatrixNormal(loc, 2.5 * torch.eye(3, dtype=F64), v)
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(x), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(d.row_covariance, ref.row_covariance, rtol=1e-15, atol=0)
    torch.testing.assert_close(d._row_tril, math.sqrt(2.5) * torch.eye(3, dtype=F64), rtol=1e-15, atol=0)
    d = MatrixNormal(loc, row_covariance=v[:3, :3], column_scale_tril=torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(d.column_covariance, 0.25 * torch.eye(4, dtype=F64).expand(2, 4, 4), rtol=1e-15, atol=0)
    torch.testing.assert_close(kl_divergence(d, MatrixNormal(loc)),
                               kl_divergence(dense_mn(d), dense_mn(MatrixNormal(loc))), rtol=1e-11, atol=1e-11)
    # samples of the default: i.i.d. standard normal entries around loc
    w = MatrixNormal(torch.zeros(3, 4, dtype=F64)).sample((20000,), generator=gen(4)).reshape(20000, -1)
    _check_moments(w, torch.zeros(12, dtype=F64), torch.eye(12, dtype=F64), 20000)
    with pytest.raises(ValueError, match="row_covariance given as a scalar must be positive"):
        MatrixNormal(loc, -1.0)
    with pytest.raises(ValueError, match="column_scale_tril given as a scalar must be positive"):
        MatrixNormal(loc, column_scale_tril=0.0)
    with pytest.raises(ValueError, match="row_covariance given as a scalar must be positive"):
        MatrixNormal(loc, torch.tensor(-2.0, dtype=F64))
    with pytest.raises(TypeError, match="row_covariance must be real"):
        MatrixNormal(loc, 1.0 + 1j)


def test_arg_constraints_keyed_by_constructor_arguments():
    """torch.distributions' convention (its test_params_constraints): every arg_constraints key is a
    constructor argument, and the constructor's value satisfies it; validation reads the argument."""
    import inspect

    loc, qo, qi, s = randn((3, 2), 0), orth(3, 1), orth(2, 2), pos((3, 2), 3)
    e = EigenvalueCorrectedMatrixNormal(loc, qo, qi, s, validate_args=True)
    params = inspect.signature(EigenvalueCorrectedMatrixNormal.__init__).parameters
    assert set(e.arg_constraints) <= set(params) and "variance" in e.arg_constraints
    for name, value in (("loc", loc), ("q_out", qo), ("q_in", qi), ("variance", s)):
        assert bool(e.arg_constraints[name].check(value).all())
    assert set(MatrixNormal.arg_constraints) <= set(inspect.signature(MatrixNormal.__init__).parameters)
    # validation checks the constructor's variance (S), not the marginal variance property: a negative
    # S with orthogonal bases can have positive marginal variances, and must still be refused
    s_bad = s.clone()
    s_bad[0, 0] = -0.01
    assert (EigenvalueCorrectedMatrixNormal(loc, qo, qi, s_bad, validate_args=False).variance > 0).all()
    with pytest.raises(ValueError, match="Expected parameter variance"):
        EigenvalueCorrectedMatrixNormal(loc, qo, qi, s_bad, validate_args=True)
    torch.testing.assert_close(e.variance, mn.eigen_marginal_variance(qo, qi, s), rtol=0, atol=0)


@pytest.mark.parametrize("validate", [True, False])
def test_log_prob_wrong_event_shape_is_a_clear_error(validate):
    for d in (make_mn(3, 2, 0, batch=(2,)), make_emvg(3, 2, 0, batch=(2,))):
        d = d.expand(d.batch_shape) if validate else type(d).expand(d, d.batch_shape)
        d._validate_args = validate
        name = type(d).__name__
        with pytest.raises(ValueError, match=rf"{name}.log_prob: value must end in the event shape \(3, 2\)"):
            d.log_prob(randn((2, 2, 3), 1))
        with pytest.raises(ValueError, match="do not broadcast against the batch shape"):
            d.log_prob(randn((3, 3, 2), 1))
        assert d.log_prob(randn((4, 1, 3, 2), 1)).shape == (4, 2)
