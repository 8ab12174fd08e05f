"""Core checks of vmfdist.special on a fixed grid against the mpmath references.

The hypothesis-driven sweep over the whole domain lives in test_special.py; this
file pins the regimes (series, Hankel, Olver, turning point, extremes), the
documented conventions, autograd, opcheck and argument errors.
"""
import pathlib

import pytest
import torch

from vmfdist import special
from vmfdist.testing import cpu_and_cuda

from . import reference as ref

F64 = torch.float64
NU = [0.0, 0.3, 1.0, 2.5, 7.9, 11.9, 12.0, 15.0, 19.9, 20.0, 64.0, 127.0, 1e3, 1e5, 1e6]
Z = [1e-300, 1e-20, 1e-3, 0.5, 3.0, 12.0, 24.9, 26.0, 49.0, 60.0, 400.0, 1e4, 1e8, 1e300]


def _t(x, dtype=F64, device="cpu"):
    return torch.tensor(x, dtype=dtype, device=device)


@pytest.mark.parametrize("nu", NU)
def test_log_bessel_iv_grid(nu):
    zs = Z + [0.6627 * nu, nu, 2 * nu] if nu > 0 else Z
    for z in zs:
        r = ref.log_iv(nu, z)
        ours = special.log_bessel_iv(_t(nu), _t(z)).item()
        assert ref.log_error(ours, r) <= 4, (nu, z, ours, r)
        ours_e = special.log_bessel_ive(_t(nu), _t(z)).item()
        assert ref.log_error(ours_e, ref.log_ive(nu, z)) <= 4, (nu, z, ours_e)


@pytest.mark.parametrize("nu", [0.5, 0.5000001, 0.75, 1.0, 1.5, 5.0, 64.0, 1e3, 1e6])
def test_ratio_and_complement_grid(nu):
    # tiny z: R = z / (2 nu) (1 + O(z^2)), a closed form exact in float64
    tiny = special.bessel_iv_ratio(_t(nu), _t(1e-300)).item()
    assert abs(tiny - 1e-300 / (2 * nu)) <= 2**-52 * tiny
    for z in [1e-5, 0.1, 1.0, 3.0, 30.0, 1e3, 1e6, 1e300]:
        r = ref.ratio(nu, z)
        assert ref.ulp_error(special.bessel_iv_ratio(_t(nu), _t(z)).item(), r) <= 4, (nu, z)
        c = ref.ratio_c(nu, z)
        if c != 0:
            assert ref.ulp_error(special.bessel_iv_ratio_c(_t(nu), _t(z)).item(), c) <= 10, (nu, z)


@pytest.mark.parametrize("nu", [0.0, 0.75, 1.0, 5.0, 30.0, 1e3])
def test_gradients_against_reference(nu):
    for z in [1e-3, 0.7, 4.0, 40.0, 2e3]:
        zt = _t(z).requires_grad_()
        (g,) = torch.autograd.grad(special.log_bessel_iv(nu, zt), zt)
        assert ref.ulp_error(g.item(), ref.dlog_iv(nu, z)) <= 10
        zt = _t(z).requires_grad_()
        (g,) = torch.autograd.grad(special.log_bessel_ive(nu, zt), zt)
        assert ref.ulp_error(g.item(), ref.dlog_ive(nu, z)) <= 10, (nu, z)
        if nu >= 0.5:
            zt = _t(z).requires_grad_()
            (g,) = torch.autograd.grad(special.bessel_iv_ratio(nu, zt), zt)
            assert ref.ulp_error(g.item(), ref.dratio(nu, z)) <= 10, (nu, z)


def test_extreme_order_tiny_argument():
    v = special.log_bessel_iv(_t(1e6), _t(1e-300)).item()
    assert abs(v - float(ref.log_iv(1e6, 1e-300))) <= 4 * 2**-52 * abs(v)
    assert -7.05e8 < v < -7.03e8


@pytest.mark.parametrize("fn", [special.bessel_iv_ratio, special.bessel_iv_ratio_c,
                                special.log_bessel_iv, special.log_bessel_ive])
def test_gradcheck(fn):
    nu = _t([0.5, 1.0, 2.5, 30.0, 500.0])
    z = _t([0.3, 1.3, 7.0, 25.0, 800.0]).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fn(nu, x), (z,))
    assert torch.autograd.gradgradcheck(lambda x: fn(nu, x), (z,))


@pytest.mark.parametrize("theorem", [4, 5])
def test_bounds_bracket_and_gradcheck(theorem):
    nu = torch.tensor([0.5, 1.0, 3.0, 40.0, 1e4], dtype=F64)[:, None]
    z = torch.logspace(-4, 6, 61, dtype=F64)[None, :]
    lo, hi = special.bessel_iv_ratio_bounds(nu, z, theorem=theorem)
    exact = special.bessel_iv_ratio(nu, z)
    slack = 4 * 2**-53
    assert bool((lo <= exact * (1 + slack)).all()) and bool((exact <= hi * (1 + slack)).all())
    zz = _t([0.3, 2.0, 90.0]).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: special.bessel_iv_ratio_bounds(_t([1.0, 2.0, 9.0]), x, theorem), (zz,))


def test_papers_approximation_is_poor_at_low_order():
    z = torch.logspace(-2, 2, 2001, dtype=F64)
    for nu, lo_err, hi_err in [(1.0, 0.06, 0.08), (2.0, 0.01, 0.015)]:
        n = torch.full_like(z, nu)
        rel = ((special.bessel_iv_ratio_approx(n, z) - special.bessel_iv_ratio(n, z)) / special.bessel_iv_ratio(n, z)).abs()
        assert lo_err < rel.max().item() < hi_err  # 7.1% at nu = 1 (d = 2), 1.3% at nu = 2 (d = 4)


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_conventions_and_domain(device):
    t = lambda x: _t(x, device=device)  # noqa: E731
    inf, nan = float("inf"), float("nan")
    assert special.bessel_iv_ratio(t(2.0), t(0.0)).item() == 0.0
    assert special.bessel_iv_ratio(t(2.0), t(inf)).item() == 1.0
    assert special.bessel_iv_ratio_c(t(2.0), t(0.0)).item() == 1.0
    assert special.bessel_iv_ratio_c(t(2.0), t(inf)).item() == 0.0
    assert special.log_bessel_iv(t(0.0), t(0.0)).item() == 0.0
    assert special.log_bessel_iv(t(3.0), t(0.0)).item() == -inf
    assert special.log_bessel_iv(t(3.0), t(inf)).item() == inf
    assert special.log_bessel_ive(t(3.0), t(inf)).item() == -inf
    for f in (special.bessel_iv_ratio, special.log_bessel_iv):
        assert torch.isnan(f(t(-1.0), t(1.0))).item()
        assert torch.isnan(f(t(1.0), t(-1.0))).item()
        assert torch.isnan(f(t(nan), t(1.0))).item()
    assert torch.isnan(special.bessel_iv_ratio(t(0.25), t(1.0))).item()


@pytest.mark.parametrize("device", cpu_and_cuda())
def test_float32_matches_rounded_float64(device):
    nu = torch.tensor([0.5, 1.0, 7.0, 128.0, 1e4], device=device)
    z = torch.tensor([1e-3, 0.9, 30.0, 500.0, 2e4], device=device)
    for fn in (special.bessel_iv_ratio, special.log_bessel_iv, special.log_bessel_ive):
        lo = fn(nu, z)
        assert lo.dtype == torch.float32
        hi = fn(nu.double(), z.double()).float()
        ulps = ((lo - hi).abs() / torch.finfo(torch.float32).eps / hi.abs()).max().item()
        assert ulps <= 1.0


def test_broadcasting_and_numbers():
    out = special.log_bessel_iv(torch.tensor([[1.0], [2.0]], dtype=F64), torch.tensor([1.0, 2.0, 3.0], dtype=F64))
    assert out.shape == (2, 3)
    assert special.bessel_iv_ratio(1.5, 2.0).dtype == torch.get_default_dtype()


def test_errors_name_the_argument():
    with pytest.raises(RuntimeError, match="nu"):
        special.log_bessel_iv(torch.tensor(1.0, requires_grad=True), torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        special.log_bessel_iv(torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match="z"):
        special.log_bessel_iv(1.0, "x")
    with pytest.raises(ValueError, match="theorem"):
        special.bessel_iv_ratio_bounds(1.0, 1.0, theorem=3)
    with pytest.raises(RuntimeError, match="nu must be real"):
        special.log_bessel_iv(torch.ones(2, dtype=torch.complex128), torch.ones(2, dtype=F64))


@pytest.mark.parametrize("name", ["bessel_iv_ratio", "bessel_iv_ratio_grad", "log_bessel_iv", "log_bessel_iv_grad",
                                  "bessel_iv_ratio_bounds", "bessel_iv_ratio_approx", "log_bessel_iv_asymptotic",
                                  "log_bessel_iv_series"])
def test_opcheck(name):
    op = getattr(torch.ops.vmfdist, name)
    nu = torch.tensor([1.0, 2.5, 40.0], dtype=F64)
    z = torch.tensor([0.5, 3.0, 100.0], dtype=F64, requires_grad=name not in ("bessel_iv_ratio_grad", "log_bessel_iv_grad", "log_bessel_iv_series"))
    torch.library.opcheck(op, (nu, z))


def test_source_file_stems_unique():
    root = pathlib.Path(__file__).resolve().parents[1] / "csrc"
    stems = [p.stem for p in root.rglob("*") if p.suffix in (".cpp", ".cu", ".h", ".cuh")]
    assert len(stems) == len(set(stems)), sorted(s for s in stems if stems.count(s) > 1)
