r"""Eigenbases, damping and running averages of Kronecker factors.

Conventions (see :mod:`vmfdist.curvature.kfac`): a layer's Fisher block per data point is
approximated by :math:`G\otimes A` (row-major ``vec`` of the ``(out, in+1)`` weight matrix,
``torch.kron`` order), with :math:`G = Q_G\,\mathrm{diag}(d_G)\,Q_G^T` and
:math:`A = Q_A\,\mathrm{diag}(d_A)\,Q_A^T`.  Its eigenvalues as an ``(out, in+1)`` matrix are
``outer(d_G, d_A)``; EK-FAC replaces them by the second moments of the per-example
gradients in the same basis.
"""
from __future__ import annotations

import math
from typing import Tuple, Union

import torch

__all__ = ["symmetrise", "eigen_basis", "trace_norm_pi", "kfac_eigenvalues", "damped_kfac_eigenvalues",
           "damped_kfac_factors", "running_average_weight", "require_finite"]


def symmetrise(m: torch.Tensor) -> torch.Tensor:
    """:math:`(M + M^T)/2`."""
    return 0.5 * (m + m.mT)


def eigen_basis(factor: torch.Tensor, min_eigenvalue: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (ascending, clamped below at ``min_eigenvalue``) and orthonormal
    eigenvectors (columns) of the symmetrised ``factor``, by ``torch.linalg.eigh``.

    The basis is returned contiguous (row-major), e.g. for ``torch.distributed.broadcast``,
    which sends the storage as it lies.  Signs are canonical: the entry of largest magnitude of each eigenvector is positive,
    so that nearly equal factors (e.g. on different ranks, or summed in another order)
    give nearly equal bases, not bases differing by column signs.
    """
    d, q = _eigh(symmetrise(factor))
    idx = q.abs().argmax(dim=-2, keepdim=True)
    sign = torch.gather(q, -2, idx).sign()
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return d.clamp_min(min_eigenvalue), (q * sign).contiguous()  # eigh returns column-major


def _eigh(m: torch.Tensor):
    """``torch.linalg.eigh``, retried in float64 when a float32 factorisation of a finite factor fails.

    LAPACK's float32 divide-and-conquer solver can fail on a factor with many equal eigenvalues --
    e.g. the gradient factor of a layer with many dead ReLU units, whose rows are exactly zero (seen
    with torch 2.14 on a 500-unit layer with 207 dead units; float64 and a rescaled copy succeed).
    How it fails depends on the LAPACK build and the processor: on an AMD EPYC it raised
    ``LinAlgError``; on an Intel Xeon the same factorisation returned NaN eigenvectors without an
    error (torch 2.13 and 2.14, LeNet-5's 500-unit layer).  Both are retried in float64, rounded back
    to the factor's dtype; a float64 failure propagates, and a factor that is itself non-finite keeps
    its non-finite result (the caller's checks name it)."""
    try:
        d, q = torch.linalg.eigh(m)
        # one host read per float32 factorisation (eigh itself reads its status back on CUDA)
        if m.dtype == torch.float64 or bool(torch.isfinite(q).all() & torch.isfinite(d).all()) \
                or not bool(torch.isfinite(m).all()):
            return d, q
    except torch.linalg.LinAlgError:
        if m.dtype == torch.float64:
            raise
    d, q = torch.linalg.eigh(m.double())
    return d.to(m.dtype), q.to(m.dtype)


def trace_norm_pi(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    r"""Martens & Grosse's :math:`\pi = \sqrt{(\mathrm{tr}A/\dim A)/(\mathrm{tr}G/\dim G)}` (1 where
    either trace is not positive).  With this :math:`\pi` the factored damping below does
    not depend on how a constant is split between :math:`A` and :math:`G`; in particular,
    for convolutions it does not matter whether the spatial sum sits in :math:`A` or in
    :math:`G` (Grosse & Martens 2016 apply the damping per spatial location)."""
    ta = torch.diagonal(a, dim1=-2, dim2=-1).sum(-1) / a.shape[-1]
    tg = torch.diagonal(g, dim1=-2, dim2=-1).sum(-1) / g.shape[-1]
    ok = (ta > 0) & (tg > 0)
    return torch.where(ok, (ta / torch.where(ok, tg, torch.ones_like(tg))).clamp_min(0).sqrt(), torch.ones_like(ta))


def kfac_eigenvalues(d_g: torch.Tensor, d_a: torch.Tensor) -> torch.Tensor:
    """The eigenvalues of :math:`G\\otimes A` as an ``(out, in)`` matrix: ``outer(d_G, d_A)``."""
    return d_g.unsqueeze(-1) * d_a.unsqueeze(-2)


def damped_kfac_eigenvalues(d_g: torch.Tensor, d_a: torch.Tensor, damping: float,
                            pi: Union[float, torch.Tensor] = 1.0) -> torch.Tensor:
    r"""Eigenvalues of the factored-damped :math:`(G + \tfrac{\sqrt\gamma}{\pi}I)\otimes(A + \pi\sqrt\gamma I)`
    (Martens & Grosse 2015, section 6.3) as an ``(out, in)`` matrix."""
    r = math.sqrt(damping)
    return (d_g + r / pi).unsqueeze(-1) * (d_a + r * pi).unsqueeze(-2)


def damped_kfac_factors(a: torch.Tensor, g: torch.Tensor, damping: float, pi="trace"):
    r""":math:`(A + \pi\sqrt\gamma I,\; G + \sqrt\gamma/\pi\, I)`; ``pi="trace"`` uses
    :func:`trace_norm_pi`, a number fixes it."""
    p = trace_norm_pi(a, g) if isinstance(pi, str) and pi == "trace" else pi
    r = math.sqrt(damping)
    ia = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    ig = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
    return a + (r * p) * ia, g + (r / p) * ig


def running_average_weight(beta: float, count: int) -> float:
    r"""Weight of the new estimate in :math:`X \leftarrow (1-w)X + w\hat X`: :math:`w = \max(\beta, 1/k)` for
    the :math:`k`-th update (:math:`k \ge 1`), so the first :math:`1/\beta` updates form the plain mean
    (no bias towards the initial value), after which the average is exponential with rate :math:`\beta`."""
    return max(float(beta), 1.0 / max(int(count), 1))


def require_finite(name: str, what: str, t: torch.Tensor) -> None:
    """``FloatingPointError`` naming the layer ``name`` and the quantity ``what`` when ``t`` holds a NaN or an
    infinity.  (``vmfdist.nn.check_finite`` is the model-level check of the Bayesian layers.)"""
    if not bool(torch.isfinite(t).all()):
        raise FloatingPointError(f"non-finite values in the {what} of layer {name!r} (check the inputs, the loss "
                                 "and the learning rate)")
