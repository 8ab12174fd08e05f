r"""Modified Bessel functions of the first kind for PyTorch.

All functions are elementwise and broadcast ``nu`` against ``z``; they accept
tensors or Python numbers, run on CPU and CUDA, and support float32 and float64
(half and bfloat16 too; float32 and lower are computed in float64 internally and
rounded once).  Every function accepts the whole float range of both arguments (up to
``DBL_MAX``; the supported range of each is in its docstring and ``docs/special.md``):
out-of-domain arguments (``nu`` or ``z`` negative, NaN) give NaN, as in
:mod:`torch.special`, and values whose exact result overflows give +-inf.
Conventions at the boundary:

=========================  ==========================  ===========================
function                   ``z = 0``                   ``z = inf``
=========================  ==========================  ===========================
``bessel_iv_ratio``        0 (+inf if ``nu = 0``)      1
``bessel_iv_ratio_c``      1                           0
``bessel_iv_ratio_grad``   1/(2 nu) (-inf if nu = 0)   0
``log_bessel_iv``          0 if ``nu = 0`` else -inf   +inf
``log_bessel_ive``         0 if ``nu = 0`` else -inf   -inf
=========================  ==========================  ===========================

``nu = inf`` gives ratio 0 (complement 1) and log -inf for finite ``z``;
``nu = z = inf`` gives NaN.  Gradients are available with respect to ``z``
(to any order; :func:`log_bessel_iv_series` alone is not differentiable and its
backward raises); ``nu`` is not differentiable and asking for its gradient raises.
The derivative of the ratio itself, :math:`dR_\nu/dz`, is a function of its own,
:func:`bessel_iv_ratio_grad` (the variance of a von Mises--Fisher distribution along its
mean direction), computed from the continued fraction rather than from the identity
:math:`R' = 1 - R^2 - (2\nu - 1)R/z`, which cancels for large ``z``.
"""
from __future__ import annotations

from numbers import Number
from typing import Tuple, Union

import torch

from ._ops import lib

__all__ = [
    "bessel_iv_ratio",
    "bessel_iv_ratio_c",
    "bessel_iv_ratio_grad",
    "log_bessel_iv",
    "log_bessel_ive",
    "bessel_iv_ratio_bounds",
    "bessel_iv_ratio_approx",
    "log_bessel_iv_asymptotic",
    "log_bessel_iv_series",
]

TensorLike = Union[torch.Tensor, Number]


def _as_tensors(name: str, nu: TensorLike, z: TensorLike) -> Tuple[torch.Tensor, torch.Tensor]:
    for arg, value in (("nu", nu), ("z", z)):
        if not isinstance(value, (torch.Tensor, Number)):
            raise TypeError(f"{name}: {arg} must be a tensor or a real number, got {type(value).__name__}")
    if isinstance(nu, torch.Tensor) and isinstance(z, torch.Tensor):
        pass
    elif isinstance(nu, torch.Tensor):
        z = torch.as_tensor(z, dtype=nu.dtype if nu.is_floating_point() else None, device=nu.device)
    elif isinstance(z, torch.Tensor):
        nu = torch.as_tensor(nu, dtype=z.dtype if z.is_floating_point() else None, device=z.device)
    else:
        nu = torch.as_tensor(nu, dtype=torch.get_default_dtype())
        z = torch.as_tensor(z, dtype=torch.get_default_dtype())
    if nu.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{name}: the order nu is not differentiable; pass nu.detach() or a number")
    return nu, z


def bessel_iv_ratio(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The ratio :math:`R_\nu(z) = I_\nu(z) / I_{\nu-1}(z)` for :math:`\nu \ge 0`, :math:`z \ge 0`.

    Exact to a few ulp in float64 over the whole float range (Perron's continued fraction;
    the leading uniform asymptotic form beyond :math:`2^{1000}`; for :math:`0 \le \nu < 1/2`,
    where the ratio exceeds 1 for large :math:`z`, the recurrence
    :math:`1/R_\nu = 2\nu/z + R_{\nu+1}`, within 8 ulp).  :math:`R_0(0) = +\infty`.
    See ``docs/special.md``.
    For :math:`1 - R_\nu(z)` where :math:`R \to 1` use :func:`bessel_iv_ratio_c`.
    The mean resultant length of a von Mises--Fisher distribution on
    :math:`S^{d-1}` is ``bessel_iv_ratio(d / 2, kappa)``.
    """
    nu, z = _as_tensors("bessel_iv_ratio", nu, z)
    return lib.bessel_iv_ratio(nu, z, False)


def bessel_iv_ratio_c(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The complement :math:`1 - I_\nu(z)/I_{\nu-1}(z)` for :math:`\nu \ge 1/2`, :math:`z \ge 0`
    (NaN below :math:`\nu = 1/2`), computed without cancellation over the whole float range."""
    nu, z = _as_tensors("bessel_iv_ratio_c", nu, z)
    return lib.bessel_iv_ratio(nu, z, True)


def bessel_iv_ratio_grad(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The derivative in :math:`z` of the ratio, :math:`R_\nu'(z) = \frac{d}{dz}\,I_\nu(z)/I_{\nu-1}(z)
    = 1 - R_\nu(z)^2 - \frac{2\nu - 1}{z}R_\nu(z)`, for :math:`\nu \ge 0`, :math:`z \ge 0`
    (NaN for negative or NaN arguments, as :func:`bessel_iv_ratio`).

    The same value as ``torch.autograd.grad(bessel_iv_ratio(nu, z), z)``, without a graph:
    dual numbers carried through Perron's continued fraction (``docs/special.md``, *Gradients*),
    within 10 ulp of mpmath in float64 for :math:`\nu \ge 1/2` over the whole float range, so that the
    :math:`O(1/z^2)` value for large :math:`z` keeps its digits (the identity above loses
    them all by :math:`z \approx 10^8`).  For :math:`0 \le \nu < 1/2` it comes from the
    recurrence :math:`1/R_\nu = 2\nu/z + R_{\nu+1}` and is negative for large :math:`z`.
    :math:`R_\nu'(0) = 1/(2\nu)` (:math:`-\infty` at :math:`\nu = 0`), :math:`R_\nu'(\infty) = 0`,
    :math:`R_{1/2}' = \operatorname{sech}^2 z`; ``nu = inf`` gives 0 for finite ``z``,
    ``nu = z = inf`` NaN.  Differentiable in ``z`` (its derivative is :math:`R_\nu''` from a
    kernel of its own; third and higher derivatives by the Riccati form).  The variance of
    :math:`\mu^T x` under a von Mises--Fisher distribution on :math:`S^{d-1}` is
    ``bessel_iv_ratio_grad(d / 2, kappa)``.
    """
    nu, z = _as_tensors("bessel_iv_ratio_grad", nu, z)
    return lib.bessel_iv_ratio_grad(nu, z)


def log_bessel_iv(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r""":math:`\log I_\nu(z)` for :math:`\nu \ge 0`, :math:`z \ge 0` up to ``DBL_MAX``; finite wherever
    :math:`z > 0`, even where :math:`I_\nu(z)` under- or overflows, except that it is :math:`\pm\infty`
    where :math:`\log I_\nu(z)` itself overflows (e.g. :math:`\nu = 2\cdot10^{307}`, :math:`z = 10^{-45}`)."""
    nu, z = _as_tensors("log_bessel_iv", nu, z)
    return lib.log_bessel_iv(nu, z, False)


def log_bessel_ive(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The exponentially scaled :math:`\log I_\nu(z) - z`; the same range as :func:`log_bessel_iv`."""
    nu, z = _as_tensors("log_bessel_ive", nu, z)
    return lib.log_bessel_iv(nu, z, True)


def bessel_iv_ratio_bounds(nu: TensorLike, z: TensorLike, theorem: int = 5) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Ruiz-Antolín--Segura (2016) bounds ``(lower, upper)`` on :math:`I_\nu(z)/I_{\nu-1}(z)`.

    ``theorem=5`` (default): :math:`B_2(\nu,z) < R_\nu(z) < B_0(\nu,z)` for :math:`\nu \ge 1/2`, with
    :math:`B_\alpha = z / (\delta_\alpha + \sqrt{\delta_\alpha^2 + z^2})`,
    :math:`\delta_\alpha = \nu - 1/2 + \lambda / (2\sqrt{\lambda^2 + z^2})`, :math:`\lambda = \nu + (\alpha-1)/2`.
    ``theorem=4``: :math:`z/(\nu - 1/2 + \sqrt{(\nu+1/2)^2+z^2}) < R_\nu(z) < z/(\nu - 1 + \sqrt{(\nu+1)^2+z^2})`
    for :math:`\nu \ge 0`.  NaN outside the theorem's range of :math:`\nu` (also at :math:`\nu = -\infty`);
    any :math:`z \ge 0` up to ``DBL_MAX``.

    Theorem 5's lower bound is never looser than theorem 4's, but neither upper bound
    dominates: :math:`B_0` is the looser one for :math:`z` below about :math:`\nu`
    (at :math:`\nu = z = 1` it is 0.064 above the ratio, theorem 4's upper bound 0.0008)
    and the tighter one above.
    """
    if theorem not in (4, 5):
        raise ValueError(f"bessel_iv_ratio_bounds: theorem must be 4 or 5, got {theorem!r}")
    nu, z = _as_tensors("bessel_iv_ratio_bounds", nu, z)
    return lib.bessel_iv_ratio_bounds(nu, z, theorem)


def bessel_iv_ratio_approx(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The papers' approximation :math:`R_\nu(z) \approx (B_2 + B_0)/2` (eq. 33 of the
    radial--directional supplement), for :math:`\nu \ge 1/2`, :math:`z \ge 0` up to ``DBL_MAX``.
    About 7% off at :math:`\nu = 1` (d = 2); see docs."""
    nu, z = _as_tensors("bessel_iv_ratio_approx", nu, z)
    return lib.bessel_iv_ratio_approx(nu, z)


def log_bessel_iv_asymptotic(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The papers' two-branch approximation (eq. 44):
    :math:`\nu\log z + \eta z - (\eta+\nu)\log 2 - \log\Gamma(\nu+1)` for :math:`z < \nu`
    (:math:`\eta = (\nu + 1/2)/(2(\nu+1))`) and :math:`z - \tfrac12\log z - \tfrac12\log 2\pi` otherwise.
    Any :math:`\nu, z \ge 0` (beyond :math:`\nu = 2^{1000}` through Stirling's series, since
    :math:`\log\Gamma` overflows); :math:`+\infty` at :math:`z = \infty`, :math:`-\infty` at :math:`\nu = \infty`."""
    nu, z = _as_tensors("log_bessel_iv_asymptotic", nu, z)
    return lib.log_bessel_iv_asymptotic(nu, z)


def log_bessel_iv_series(nu: TensorLike, z: TensorLike) -> torch.Tensor:
    r"""The papers' log-ratio series (eq. 45):
    :math:`\log I_{\nu - \lfloor\nu\rfloor}(z) + \sum_{n=0}^{\lfloor\nu\rfloor-1} \log R_{\nu-n}(z)`
    with every ratio replaced by :func:`bessel_iv_ratio_approx`, in one fused kernel.
    The cost grows linearly with :math:`\nu`, so orders above :math:`2^{20}` (1048576) give NaN
    (a million terms take milliseconds per element).  Any :math:`z \ge 0`.  Not differentiable:
    its backward raises a clear error (use :func:`log_bessel_iv`, which is exact)."""
    nu, z = _as_tensors("log_bessel_iv_series", nu, z)
    return lib.log_bessel_iv_series(nu, z)
