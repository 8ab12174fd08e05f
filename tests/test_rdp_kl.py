"""``rdp_kl``: the KL of one grouping of a radial--directional layer with its gradient
(``csrc/include/vmfdist/rdp.h``), the forward of :class:`vmfdist.nn.rdp._FactorKL`.

Values against mpmath from the definitions (KL = -entropy - expected log prior density, each
written out here, not taken from the library); gradients against finite differences (gradcheck of
``_FactorKL``, ``tests/test_nn.py``) and against autograd through the library's composite
formula; dtypes, thread counts, extremes, errors and opcheck."""
import math

import mpmath as mp
import pytest
import torch

import vmfdist  # noqa: F401  (loads the ops)
from vmfdist.nn.rdp import _factor_kl

lib = torch.ops.vmfdist
DT = torch.float64


def _mp_lognormal_kl(m, s, prior, rate):
    """KL(LogNormal(m, s) || prior) = -H(q) - E_q[log p], with H = m + 1/2 + log(s sqrt(2 pi)),
    E[log x] = m, E[x] = e^{m + s^2/2}, E[1/x] = e^{-m + s^2/2}; prior Gamma(1/2, rate) or
    InverseGamma(1/2, 1)."""
    m, s, a = mp.mpf(m), mp.mpf(s), mp.mpf(1) / 2
    ent = m + a + mp.log(s * mp.sqrt(2 * mp.pi))
    if prior == "gamma":
        b = mp.mpf(rate)
        elogp = a * mp.log(b) - mp.loggamma(a) + (a - 1) * m - b * mp.e ** (m + s * s / 2)
    else:
        elogp = -mp.loggamma(a) - (a + 1) * m - mp.e ** (-m + s * s / 2)
    return -ent - elogp


def _mp_log_c(k, d):
    """log C_d(k) of the vMF density C_d(k) e^{k mu^T x} on S^{d-1}."""
    nu = mp.mpf(d) / 2 - 1
    return nu * mp.log(k) - mp.mpf(d) / 2 * mp.log(2 * mp.pi) - mp.log(mp.besseli(nu, k))


def _mp_rdp_kl(log_kappa, local, glob, kappa_p, tau_l, tau_g, d, uniform):
    with mp.workdps(50):
        kq = mp.e ** mp.mpf(log_kappa)
        a = mp.besseli(mp.mpf(d) / 2, kq) / mp.besseli(mp.mpf(d) / 2 - 1, kq)
        if uniform:
            log_area = mp.log(2) + mp.mpf(d) / 2 * mp.log(mp.pi) - mp.loggamma(mp.mpf(d) / 2)
            one = _mp_log_c(kq, d) + kq * a + log_area
        else:
            kp = mp.mpf(kappa_p)
            one = _mp_log_c(kq, d) - _mp_log_c(kp, d) + (kq - kp) * a
        g = local.shape[1]
        total = g * one
        cols = [(local[:, j], tau_l) for j in range(g)] + [(glob, tau_g)]
        for p, tau in cols:
            sa, sb = (mp.log1p(mp.e ** mp.mpf(float(r))) for r in (p[2], p[3]))
            total += _mp_lognormal_kl(float(p[0]), sa, "gamma", 1 / mp.mpf(tau) ** 2)
            total += _mp_lognormal_kl(float(p[1]), sb, "inverse_gamma", None)
        return float(total)


def _inputs(g, seed, dtype=DT, rho_shift=-3.0):
    gen = torch.Generator().manual_seed(seed)
    local = torch.randn(4, g, generator=gen, dtype=DT)
    local[0] += 2 * math.log(1e-2)
    local[2:] += rho_shift
    glob = torch.tensor([2 * math.log(1e-3), -2 * math.log(1e-3), -4.0, -5.0], dtype=DT)
    t = lambda v: torch.as_tensor(v, dtype=DT).to(dtype)  # noqa: E731
    return local.to(dtype), glob.to(dtype), t(1e-2), t(1e-3)


@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("g,d,log_kappa,kappa_p", [(5, 25, 3.0, 40.0), (1, 2, -1.0, 0.5), (3, 800, 8.0, 7000.0),
                                                   (4, 3, -30.0, 2.0), (2, 50, 11.0, 10.0)])
def test_value_against_mpmath(g, d, log_kappa, kappa_p, uniform):
    local, glob, tl, tg = _inputs(g, g + d)
    kl = lib.rdp_kl(torch.tensor(log_kappa, dtype=DT), local, glob, torch.tensor(kappa_p, dtype=DT), tl, tg, d,
                    uniform)[0]
    ref = _mp_rdp_kl(log_kappa, local, glob, kappa_p, 1e-2, 1e-3, d, uniform)
    assert float(kl) == pytest.approx(ref, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("uniform", [False, True])
def test_gradients_equal_autograd_through_the_composite(uniform):
    """d kl / d (log_kappa, local, glob) equal autograd through the library's composite formula
    (_factor_kl: torch ops over the registered KLs' closed forms)."""
    local, glob, tl, tg = _inputs(6, 1)
    lk, pk = torch.tensor(4.0, dtype=DT), torch.tensor(60.0, dtype=DT)
    kl, g_lk, g_local, g_glob = lib.rdp_kl(lk, local, glob, pk, tl, tg, 30, uniform)
    ins = [t.clone().requires_grad_(True) for t in (lk, local, glob)]
    ref = _factor_kl(*ins, pk, tl, tg, 30, uniform)
    refs = torch.autograd.grad(ref, ins)
    torch.testing.assert_close(kl, ref.detach(), rtol=1e-13, atol=0)
    for got, want in zip((g_lk, g_local, g_glob), refs):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_narrow_dtypes_are_the_float64_result_rounded(dtype):
    """Computed in double whatever the dtype: the result for inputs of a narrow dtype is the
    float64 op's result on the same (rounded) values, rounded once."""
    local, glob, tl, tg = _inputs(9, 2, dtype)
    lk, pk = torch.tensor(2.5, dtype=dtype), torch.tensor(30.0, dtype=dtype)
    got = lib.rdp_kl(lk, local, glob, pk, tl, tg, 20, False)
    want = lib.rdp_kl(*(t.double() for t in (lk, local, glob, pk, tl, tg)), 20, False)
    for a, b in zip(got, want):
        assert a.dtype == dtype and a.shape == b.shape
        assert torch.equal(a, b.to(dtype))


def test_the_sum_does_not_depend_on_the_thread_count():
    local, glob, tl, tg = _inputs(20000, 3)
    args = (torch.tensor(3.0, dtype=DT), local, glob, torch.tensor(20.0, dtype=DT), tl, tg, 100, False)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = lib.rdp_kl(*args)
        torch.set_num_threads(max(2, n))
        many = lib.rdp_kl(*args)
    finally:
        torch.set_num_threads(n)
    for a, b in zip(one, many):
        assert torch.equal(a, b)


def test_extremes():
    """No groups; scales far below and above 1 (softplus(-100) ~ 4e-44: log s = rho, finite);
    kappa_q below 2^-20 (the series) and huge; NaN propagates."""
    lk, pk = torch.tensor(1.0, dtype=DT), torch.tensor(5.0, dtype=DT)
    local, glob, tl, tg = _inputs(0, 4)
    kl, g_lk, g_local, g_glob = lib.rdp_kl(lk, local, glob, pk, tl, tg, 10, False)
    assert g_local.shape == (4, 0) and g_lk == 0 and math.isfinite(float(kl))
    ref = _mp_rdp_kl(1.0, local, glob, 5.0, 1e-2, 1e-3, 10, False)
    assert float(kl) == pytest.approx(ref, rel=1e-12)
    local = torch.tensor([[0.0, 0.0], [0.0, 0.0], [-100.0, 20.0], [-60.0, 25.0]], dtype=DT)
    kl, _, g_local, _ = lib.rdp_kl(lk, local, glob, pk, tl, tg, 10, False)
    assert torch.isfinite(kl) and torch.isfinite(g_local).all()
    assert float(kl) == pytest.approx(_mp_rdp_kl(1.0, local, glob, 5.0, 1e-2, 1e-3, 10, False), rel=1e-12)
    # s = softplus(40) = 40: E[a] = e^{800} overflows, as the KL itself does: +inf, not NaN
    big = local.clone()
    big[2, 1] = 40.0
    kl, _, g_big, _ = lib.rdp_kl(lk, big, glob, pk, tl, tg, 10, False)
    assert kl == math.inf and g_big[2, 1] == math.inf and g_big[0, 1] == math.inf
    # the rho = -100 factor: -log s = 100 + O(e^-100) and d/drho = -1 + O(e^-100)
    assert float(g_local[2, 0]) == pytest.approx(-1.0, rel=1e-12)
    for lkv in (-40.0, 30.0):
        kl, g, _, _ = lib.rdp_kl(torch.tensor(lkv, dtype=DT), local[:, :1] * 0, glob, pk, tl, tg, 10, True)
        assert torch.isfinite(kl) and torch.isfinite(g)
    kl, g, _, _ = lib.rdp_kl(torch.tensor(-40.0, dtype=DT), local[:, :1] * 0, glob, pk, tl, tg, 10, True)
    ref = _mp_rdp_kl(-40.0, local[:, :1] * 0, glob, 5.0, 1e-2, 1e-3, 10, True)
    assert float(kl) == pytest.approx(ref, rel=1e-12)
    nan_local = local.clone()
    nan_local[1, 1] = math.nan
    kl, _, g_local, _ = lib.rdp_kl(lk, nan_local, glob, pk, tl, tg, 10, False)
    assert math.isnan(float(kl)) and math.isnan(float(g_local[1, 1])) and not math.isnan(float(g_local[1, 0]))


def test_bad_arguments_are_refused_by_name():
    lk, pk = torch.tensor(1.0, dtype=DT), torch.tensor(5.0, dtype=DT)
    local, glob, tl, tg = _inputs(3, 5)
    with pytest.raises(RuntimeError, match="local must have shape"):
        lib.rdp_kl(lk, local[:3], glob, pk, tl, tg, 10, False)
    with pytest.raises(RuntimeError, match="glob must have shape"):
        lib.rdp_kl(lk, local, glob[:3], pk, tl, tg, 10, False)
    with pytest.raises(RuntimeError, match="tau_local must be a 0-dim"):
        lib.rdp_kl(lk, local, glob, pk, tl.reshape(1), tg, 10, False)
    with pytest.raises(RuntimeError, match="prior_kappa must have local's dtype"):
        lib.rdp_kl(lk, local, glob, pk.float(), tl, tg, 10, False)
    with pytest.raises(RuntimeError, match="dim"):
        lib.rdp_kl(lk, local, glob, pk, tl, tg, 1, False)
    with pytest.raises(RuntimeError, match="glob must be on the same device"):
        lib.rdp_kl(lk, local, glob.to("meta"), pk, tl, tg, 10, False)


def test_opcheck():
    local, glob, tl, tg = _inputs(4, 6)
    args = (torch.tensor(2.0, dtype=DT), local, glob, torch.tensor(9.0, dtype=DT), tl, tg, 12, False)
    torch.library.opcheck(lib.rdp_kl.default, args)


def test_layers_use_it_and_keep_their_kl():
    """An RDP layer's KL (the groupings through rdp_kl, the bias through meanfield_kl) equals the
    sum of the registered KLs of its distribution objects, and a training step's gradients
    equal autograd through the composite formulas."""
    from vmfdist import nn as vnn
    torch.manual_seed(8)
    layer = vnn.RDPConv2d(3, 4, 3, dtype=DT, grouping="double", init_eps=0.1, lognormal_sigma=0.3)
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    kl = layer.kl_divergence()
    grads = torch.autograd.grad(kl, list(layer.parameters()), allow_unused=True)
    ref = torch.distributions.kl_divergence(layer.bias_posterior(), layer.bias_prior.distribution((4,)))
    for _, f in layer._factors():
        ref = ref + _factor_kl(f.log_concentration, f.local_radius, f.global_radius, f.prior_concentration,
                               f.tau_local, f.tau_global, f.dim, False)
    refs = torch.autograd.grad(ref, list(layer.parameters()), allow_unused=True)
    torch.testing.assert_close(kl, ref, rtol=1e-13, atol=1e-12)
    for a, b in zip(grads, refs):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12)


def test_public_wrapper():
    """vmfdist.distributions.kl.kl_rdp_grouping returns the op's value and its gradient."""
    from vmfdist.distributions.kl import kl_rdp_grouping
    local, glob, tl, tg = _inputs(5, 9)
    args = (torch.tensor(2.0, dtype=DT), local, glob, torch.tensor(9.0, dtype=DT), tl, tg)
    kl, grads = kl_rdp_grouping(*args, 12, True)
    want = lib.rdp_kl(*args, 12, True)
    assert torch.equal(kl, want[0]) and all(torch.equal(a, b) for a, b in zip(grads, want[1:]))
