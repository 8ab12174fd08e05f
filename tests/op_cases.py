"""One call of every compiled op (``torch.ops.vmfdist.*``), on any device, dtype and size.

Used twice: ``tests/test_cuda.py`` runs each case on the CPU and on the GPU and compares
(CPU<->GPU agreement of every op), and ``scripts/gpu_kernels.py`` -- the program that
compute-sanitizer watches in ``scripts/gpu_check.sh`` -- runs each case on small and odd shapes.
A new op gets a case here; ``test_cuda.test_every_op_has_a_case`` fails until it does.

A case is ``fn(dev, dt, n, layout) -> tuple of tensors``.  Its inputs are drawn on the CPU in
float64 from a fixed generator, then moved to ``dev`` and rounded to ``dt``, so the CPU and GPU
calls see the same values; random ops get an explicit ``seed``/``offset``.  ``n`` sets the size
(0 gives empty inputs or zero samples, 1 a single element); ``layout`` is ``"contiguous"``,
``"noncontiguous"`` (inputs are strided views) or ``"broadcast"`` (inputs of different shapes
that broadcast; stride-0 expanded views for the ops that do not broadcast).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Tuple

import torch

from vmfdist._ops import lib

F64 = torch.float64
LAYOUTS = ("contiguous", "noncontiguous", "broadcast")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lay(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A strided view with the values of ``t`` for the noncontiguous layout (every other element
    of a twice-as-long buffer), ``t`` itself otherwise."""
    if layout != "noncontiguous" or t.dim() == 0:
        return t
    buf = torch.empty(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=t.device)
    buf[..., ::2] = t
    return buf[..., ::2]


def _to(t: torch.Tensor, dev, dt, layout="contiguous") -> torch.Tensor:
    return _lay(t.to(device=dev, dtype=dt), layout)


def _nu_z(n: int, layout: str, nu_lo: float, nu_hi: float, z_lo: float, z_hi: float, seed: int):
    """(nu, z) in float64 on the CPU: n values each (log-uniform z), or for the broadcast layout
    nu of shape (n, 1) and z of shape (1, 3)."""
    g = _gen(seed)
    rows, cols = (n, 1) if layout == "broadcast" else (n,), (1, 3) if layout == "broadcast" else (n,)
    nu = nu_lo + (nu_hi - nu_lo) * torch.rand(rows, generator=g, dtype=F64)
    z = torch.exp(math.log(z_lo) + (math.log(z_hi) - math.log(z_lo)) * torch.rand(cols, generator=g, dtype=F64))
    return nu, z


def _elementwise(op: Callable, nu_range=(0.5, 300.0), z_range=(1e-3, 1e3), seed=0):
    def case(dev, dt, n, layout="contiguous"):
        nu, z = _nu_z(n, layout, *nu_range, *z_range, seed)
        out = op(_to(nu, dev, dt, layout), _to(z, dev, dt, layout))
        return out if isinstance(out, tuple) else (out,)
    return case


def _orth(k: int, g) -> torch.Tensor:
    if k == 0:
        return torch.zeros(0, 0, dtype=F64)
    return torch.linalg.qr(torch.randn(k, k, generator=g, dtype=F64))[0]


@functools.lru_cache(maxsize=64)
def _kron_inputs(n: int, seed: int):
    """(q_out, q_in, scale, v) for a (out, in) = (m, m + 2) layer, m = n up to 67 (larger n would
    only cost the CPU's QR time: 67 x 69 already leaves partial tiles and blocks)."""
    g = _gen(seed)
    o = min(n, 67)
    i = o + 2
    return _orth(o, g), _orth(i, g), torch.rand(o, i, generator=g, dtype=F64) + 0.1, torch.randn(o, i, generator=g,
                                                                                                   dtype=F64)


def _seed_offset(dev, seed=7, offset=3) -> torch.Tensor:
    return torch.tensor([seed, offset], dtype=torch.int64, device=dev)


def _unit_rows(b: int, d: int, g) -> torch.Tensor:
    x = torch.randn(b, d, generator=g, dtype=F64)
    return x / x.norm(dim=-1, keepdim=True)


# ------------------------------------------------------------------------------------ cases


def _vmf_sample(dev, dt, n, layout="contiguous"):
    g = _gen(11)
    d = max(n, 3)
    loc, kap = _unit_rows(2, d, g), torch.tensor([0.5 * d, 5.0 * d], dtype=F64)
    if layout == "broadcast":  # one row expanded to the batch
        loc, kap = loc[:1].expand(2, d), kap[:1].expand(2)
        return lib.vmf_sample(loc.to(dev, dt), kap.to(dev, dt), n, seed=42, offset=0)
    return lib.vmf_sample(_to(loc, dev, dt, layout), _to(kap, dev, dt, layout), n, seed=42, offset=0)


def _vmf_backward(dev, dt, n, layout="contiguous"):
    g = _gen(12)
    d = max(n, 3)
    loc, kap = _unit_rows(2, d, g), torch.tensor([0.5 * d, 5.0 * d], dtype=F64)
    x, omw = lib.vmf_sample(loc.to(dt), kap.to(dt), n, seed=5, offset=0)  # the sample: drawn on the CPU
    gx, go = torch.randn(x.shape, generator=g, dtype=F64), torch.randn(omw.shape, generator=g, dtype=F64)
    return lib.vmf_sample_backward(_to(gx, dev, dt, layout), _to(go, dev, dt, layout), _to(loc, dev, dt, layout),
                                   _to(kap, dev, dt, layout), _to(x, dev, dt, layout), _to(omw, dev, dt, layout))


def _vmf_marginal_grad(dev, dt, n, layout="contiguous"):
    omw, kap = _nu_z(n, layout, 0.0, 2.0, 1e-2, 1e3, 13)
    return (lib.vmf_marginal_grad(_to(omw, dev, dt, layout), _to(kap, dev, dt, layout), 17),)


def _power_spherical_sample(dev, dt, n, layout="contiguous"):
    g = _gen(21)
    d = max(n, 2)
    loc, kap = _unit_rows(3, d, g), torch.tensor([0.0, 0.5 * d, 5.0 * d], dtype=F64)
    if layout == "broadcast":  # one row expanded to the batch
        loc, kap = loc[:1].expand(3, d), kap[1:2].expand(3)
        return lib.power_spherical_sample(loc.to(dev, dt), kap.to(dev, dt), n, seed=43, offset=1)
    return lib.power_spherical_sample(_to(loc, dev, dt, layout), _to(kap, dev, dt, layout), n, seed=43, offset=1)


def _power_spherical_marginal_grad(dev, dt, n, layout="contiguous"):
    omt, kap = _nu_z(n, layout, 0.0, 2.0, 1e-2, 1e3, 22)
    return (lib.power_spherical_marginal_grad(_to(omt, dev, dt, layout), _to(kap, dev, dt, layout), 17),
            lib.power_spherical_marginal_grad(_to(omt, dev, dt, layout), _to(kap, dev, dt, layout), 2))


def _power_spherical_backward(dev, dt, n, layout="contiguous"):
    g = _gen(23)
    d = max(n, 3)
    loc, kap = _unit_rows(2, d, g), torch.tensor([0.5 * d, 5.0 * d], dtype=F64)
    x, omt = lib.power_spherical_sample(loc.to(dt), kap.to(dt), n, seed=6, offset=0)  # drawn on the CPU
    gx, go = torch.randn(x.shape, generator=g, dtype=F64), torch.randn(omt.shape, generator=g, dtype=F64)
    return lib.power_spherical_sample_backward(_to(gx, dev, dt, layout), _to(go, dev, dt, layout),
                                               _to(loc, dev, dt, layout), _to(kap, dev, dt, layout),
                                               _to(x, dev, dt, layout), _to(omt, dev, dt, layout))


def _radial_noise(rowwise):
    def case(dev, dt, n, layout="contiguous"):
        g = _gen(14)
        shape = (3, n) if rowwise else (n, 3)
        loc, scale = torch.randn(shape, generator=g, dtype=F64), torch.rand(shape, generator=g, dtype=F64) + 0.1
        if layout == "broadcast":
            scale = scale[:1].expand(shape) if not rowwise else scale[:, :1].expand(shape)
            loc, scale = loc.to(dev, dt), scale.to(dev, dt)
        else:
            loc, scale = _to(loc, dev, dt, layout), _to(scale, dev, dt, layout)
        out, coef, so, noise = lib.radial_noise(loc, scale, 2, rowwise, True, seed=9, offset=2)
        return out, coef, so, noise
    return case


def _radial_scale_grad(rowwise):
    def case(dev, dt, n, layout="contiguous"):
        g = _gen(15)
        shape = (3, n) if rowwise else (n, 3)
        loc, scale = torch.zeros(shape, dtype=F64).to(dt), torch.ones(shape, dtype=F64).to(dt)
        _, coef, _, noise = lib.radial_noise(loc, scale, 2, rowwise, True, seed=9, offset=2)
        grad = torch.randn((2,) + shape, generator=g, dtype=F64)
        so = _seed_offset(dev, 9, 2)
        regenerated = lib.radial_noise_scale_grad(_to(grad, dev, dt, layout), coef.to(dev), so, rowwise)
        kept = lib.radial_noise_scale_grad(_to(grad, dev, dt, layout), coef.to(dev), so, rowwise,
                                           _to(noise, dev, dt, layout))
        return regenerated, kept
    return case


def _radial_sample(dev, dt, n, layout="contiguous"):
    mu, rho, pl, ps = _meanfield_inputs(n, layout, _gen(20))
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    kept = lib.radial_sample(t(mu), t(rho), t(pl), t(ps), 2, True, 0.5, seed=21, offset=4)
    bare = lib.radial_sample(t(mu), t(rho), None, None, 2, False, seed=21, offset=4)
    return kept + bare[:2]


def _radial_sample_backward(dev, dt, n, layout="contiguous"):
    g = _gen(21)
    mu, rho, pl, ps = _meanfield_inputs(n, layout, g)
    _, coef, _, noise, _ = lib.radial_sample(mu.to(dt), rho.to(dt), None, None, 2, True, seed=21, offset=4)
    grad, gkl = torch.randn((2,) + tuple(rho.shape), generator=g, dtype=F64), torch.tensor(0.3, dtype=F64)
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    so = _seed_offset(dev, 21, 4)
    kept = lib.radial_sample_backward(t(grad), t(mu), t(rho), coef.to(dev), so, noise.to(dev), t(pl), t(ps), t(gkl))
    regen = lib.radial_sample_backward(t(grad), t(mu), t(rho), coef.to(dev), so, None, None, None, None, False)
    return kept + regen[1:]


def _meanfield_inputs(n, layout, g):
    shape = (n, 3)
    mu, rho = torch.randn(shape, generator=g, dtype=F64), torch.randn(shape, generator=g, dtype=F64) - 2
    pl, ps = torch.tensor(0.2, dtype=F64), torch.rand(shape, generator=g, dtype=F64) + 0.5
    if layout == "broadcast":
        ps = torch.tensor(0.7, dtype=F64)
    return mu, rho, pl, ps


def _meanfield_sample(dev, dt, n, layout="contiguous"):
    mu, rho, pl, ps = _meanfield_inputs(n, layout, _gen(16))
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    out, noise, kl, so = lib.meanfield_sample(t(mu), t(rho), t(pl), t(ps), 2, True, seed=17, offset=6)
    bare = lib.meanfield_sample(None, t(rho), None, None, 2, False, seed=17, offset=6)[0]
    return out, noise, kl, so, bare


def _meanfield_backward(dev, dt, n, layout="contiguous"):
    g = _gen(17)
    mu, rho, pl, ps = _meanfield_inputs(n, layout, g)
    noise = lib.meanfield_sample(mu.to(dt), rho.to(dt), None, None, 2, True, seed=17, offset=6)[1]
    grad, gkl = torch.randn((2,) + tuple(rho.shape), generator=g, dtype=F64), torch.tensor(0.3, dtype=F64)
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    so = _seed_offset(dev, 17, 6)
    kept = lib.meanfield_sample_backward(t(grad), t(rho), so, noise.to(dev), t(mu), t(pl), t(ps), t(gkl), True)
    regen = lib.meanfield_sample_backward(t(grad), t(rho), so, None, None, None, None, None, False)
    return kept + regen[:1]


def _meanfield_kl(dev, dt, n, layout="contiguous"):
    mu, rho, pl, ps = _meanfield_inputs(n, layout, _gen(18))
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    return (lib.meanfield_kl(t(mu), t(rho), t(pl), t(ps)),)


def _meanfield_kl_backward(dev, dt, n, layout="contiguous"):
    mu, rho, pl, ps = _meanfield_inputs(n, layout, _gen(19))
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    return lib.meanfield_kl_backward(t(torch.tensor(1.5, dtype=F64)), t(mu), t(rho), t(pl), t(ps))


def _rdp_kl(dev, dt, n, layout="contiguous"):
    g = _gen(25)
    local = torch.randn(4, n, generator=g, dtype=F64) + torch.tensor([[-9.0], [9.0], [-3.0], [-3.0]], dtype=F64)
    glob = torch.tensor([-13.8, 13.8, -4.0, -5.0], dtype=F64)
    sc = [torch.tensor(v, dtype=F64) for v in (2.5, 30.0, 1e-2, 1e-3)]
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    if layout == "broadcast":  # stride-0 views: one factor's values for every group
        local = local[:, :1].expand(4, n)
        return lib.rdp_kl(t(sc[0]), local.to(device=dev, dtype=dt), t(glob), *(t(v) for v in sc[1:]), 40, True)
    return lib.rdp_kl(t(sc[0]), t(local), t(glob), *(t(v) for v in sc[1:]), 40, False)


def _kron_matvec(dev, dt, n, layout="contiguous"):
    qo, qi, s, v = _kron_inputs(n, 20)
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    if layout == "broadcast":  # a batch of three v against one set of factors
        v = torch.stack([v, 2 * v, -v])
    return lib.kron_eigen_matvec(t(qo), t(qi), t(s), t(v), -1.0), lib.kron_eigen_matvec(t(qo), t(qi), t(s), t(v), 0.5)


def _kron_noise(dev, dt, n, layout="contiguous"):
    _, _, s, _ = _kron_inputs(n, 21)
    var = s[:1] if layout == "broadcast" else s
    return (lib.kron_eigen_noise(_to(var, dev, dt, layout), [2, *s.shape], _seed_offset(dev), 0.5),)


def _kron_noise_keyed(dev, dt, n, layout="contiguous"):
    _, _, s, _ = _kron_inputs(n, 26)
    var = s[:1] if layout == "broadcast" else s
    keys = torch.tensor([[7, 0], [2 ** 62 + 5, 3], [7, 1]], dtype=torch.int64, device=dev)
    return (lib.kron_eigen_noise_keyed(_to(var, dev, dt, layout), [3, *s.shape], keys, 0.5),)


def _kron_sample(dev, dt, n, layout="contiguous"):
    qo, qi, s, v = _kron_inputs(n, 22)
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    return lib.kron_eigen_sample(t(v), t(qo), t(qi), t(s), 2, seed=7, offset=3)


def _kron_ngd(dev, dt, n, layout="contiguous"):
    g = _gen(23)
    qo, qi, s, w = _kron_inputs(n, 23)
    grad = torch.randn(w.shape, generator=g, dtype=F64)
    go, gi = torch.randn(4, w.shape[0], generator=g, dtype=F64), torch.randn(4, w.shape[1], generator=g, dtype=F64)
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    both = lib.kron_eigen_ngd(t(qo), t(qi), t(s), 0.1, t(w), 1e-3, grad=t(grad), grad_out=t(go), grad_in=t(gi))
    return both + lib.kron_eigen_ngd(t(qo), t(qi), t(s), 0.1, t(w), 0.0, grad=t(grad))


def _kron_moments(dev, dt, n, layout="contiguous"):
    g = _gen(24)
    qo, qi, m, _ = _kron_inputs(n, 24)
    x, e = torch.randn(5, m.shape[1], generator=g, dtype=F64), torch.randn(5, m.shape[0], generator=g, dtype=F64)
    t = lambda x: _to(x, dev, dt, layout)  # noqa: E731
    return (lib.kron_eigen_moments(t(qo), t(qi), t(x), t(e), t(m), 0.9, 0.25),)


def _philox4x32(dev, dt, n, layout="contiguous"):
    g = _gen(25)
    ctr = torch.randint(0, 2 ** 32, (n, 4), generator=g, dtype=torch.int64)
    key = torch.randint(0, 2 ** 32, (n, 2), generator=g, dtype=torch.int64)
    return lib.philox4x32(_lay(ctr.to(dev), layout), _lay(key.to(dev), layout), 10), lib.philox4x32(ctr.to(dev),
                                                                                                    key.to(dev), 7)


def _philox(op):
    def case(dev, dt, n, layout="contiguous"):
        return (op([n, 3], seed=99, offset=5, dtype=dt, device=dev), op([n], seed=99, offset=2 ** 40, dtype=dt,
                                                                         device=dev))
    return case


_S = torch.ops.vmfdist
CASES: Dict[str, Callable[..., Tuple[torch.Tensor, ...]]] = {
    "bessel_iv_ratio": _elementwise(lambda v, z: (_S.bessel_iv_ratio(v, z, False), _S.bessel_iv_ratio(v, z, True))),
    "bessel_iv_ratio_grad": _elementwise(_S.bessel_iv_ratio_grad, seed=1),
    "bessel_iv_ratio_grad2": _elementwise(_S.bessel_iv_ratio_grad2, seed=2),
    "log_bessel_iv": _elementwise(lambda v, z: (_S.log_bessel_iv(v, z, False), _S.log_bessel_iv(v, z, True)),
                                  nu_range=(0.0, 1e4), seed=3),
    "log_bessel_iv_grad": _elementwise(lambda v, z: (_S.log_bessel_iv_grad(v, z, False),
                                                     _S.log_bessel_iv_grad(v, z, True)), seed=4),
    "bessel_iv_ratio_bounds": _elementwise(lambda v, z: _S.bessel_iv_ratio_bounds(v, z, 5)
                                           + _S.bessel_iv_ratio_bounds(v, z, 4), seed=5),
    "bessel_iv_ratio_approx": _elementwise(_S.bessel_iv_ratio_approx, seed=6),
    "log_bessel_iv_asymptotic": _elementwise(_S.log_bessel_iv_asymptotic, seed=7),
    "log_bessel_iv_series": _elementwise(_S.log_bessel_iv_series, nu_range=(0.0, 50.0), z_range=(1e-3, 30.0), seed=8),
    "vmf_sample": _vmf_sample,
    "vmf_marginal_grad": _vmf_marginal_grad,
    "vmf_sample_backward": _vmf_backward,
    "power_spherical_sample": _power_spherical_sample,
    "power_spherical_marginal_grad": _power_spherical_marginal_grad,
    "power_spherical_sample_backward": _power_spherical_backward,
    "radial_noise": lambda dev, dt, n, layout="contiguous": (_radial_noise(False)(dev, dt, n, layout)
                                                             + _radial_noise(True)(dev, dt, n, layout)),
    "radial_noise_scale_grad": lambda dev, dt, n, layout="contiguous": (_radial_scale_grad(False)(dev, dt, n, layout)
                                                                        + _radial_scale_grad(True)(dev, dt, n, layout)),
    "radial_sample": _radial_sample,
    "radial_sample_backward": _radial_sample_backward,
    "meanfield_sample": _meanfield_sample,
    "meanfield_sample_backward": _meanfield_backward,
    "meanfield_kl": _meanfield_kl,
    "meanfield_kl_backward": _meanfield_kl_backward,
    "rdp_kl": _rdp_kl,
    "kron_eigen_matvec": _kron_matvec,
    "kron_eigen_noise": _kron_noise,
    "kron_eigen_noise_keyed": _kron_noise_keyed,
    "kron_eigen_sample": _kron_sample,
    "kron_eigen_ngd": _kron_ngd,
    "kron_eigen_moments": _kron_moments,
    "philox4x32": _philox4x32,
    "philox_uniform": _philox(lib.philox_uniform),
    "philox_normal": _philox(lib.philox_normal),
}

#: ops whose CPU and GPU results are bitwise equal for the same (seed, offset): integer Philox
#: words and uniforms (one integer-to-float conversion); everything else agrees to rounding.
BITWISE = {"philox4x32", "philox_uniform"}

#: ops that multiply matrices (cuBLAS and the CPU BLAS sum in different orders): their
#: tolerance is relative to the largest entry, not to each entry.
MATMUL = {"kron_eigen_matvec", "kron_eigen_sample", "kron_eigen_ngd", "kron_eigen_moments"}


def registered_ops():
    """The names of every op of the ``vmfdist`` library (``csrc/ops.cpp``)."""
    return sorted({n.split("::", 1)[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                   if n.startswith("vmfdist::")})
