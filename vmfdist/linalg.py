r"""Linear algebra over Kronecker-factored eigenbases, and the vMF sampler's reflection.

* :func:`kron_eigen_matvec` -- :math:`(Q_{out}\otimes Q_{in})\,\mathrm{diag}(S)^p\,(Q_{out}\otimes Q_{in})^T v`
  without forming the Kronecker product (one fused op; ``docs/matrix_normal.md``)
* :func:`kron_eigen_sample` -- Gaussian samples with that covariance (:math:`p = 1`)
* :func:`householder` -- the reflection :math:`Q(\mu)` with :math:`Q e_1 = \mu` used by the
  von Mises--Fisher sampler
"""
from __future__ import annotations

import torch

from ._ops import lib
from ._ops.random import call_sampler
from ._ops.vmf import householder

__all__ = ["kron_eigen_matvec", "kron_eigen_sample", "householder"]


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
    return lib.kron_eigen_matvec(q_out, q_in, scale, v, float(power))


def kron_eigen_sample(loc: torch.Tensor, q_out: torch.Tensor, q_in: torch.Tensor, variance: torch.Tensor,
                      sample_shape=torch.Size(), *, generator=None) -> torch.Tensor:
    r"""Draws :math:`W = M + Q_{out}(E \odot \sigma)Q_{in}^T`, :math:`\sigma = \mathrm{variance}^{1/2}`,
    :math:`E` standard normal: samples of :math:`\mathcal N(\mathrm{vec}\,M,
    (Q_{out}\otimes Q_{in})\,\mathrm{diag}(\mathrm{vec}\,\mathrm{variance})\,(Q_{out}\otimes Q_{in})^T)`
    for orthogonal bases.

    Shapes as in :func:`kron_eigen_matvec` (``loc`` and ``variance`` ``(..., out, in)``);
    returns ``sample_shape + batch + (out, in)``.  :math:`E` is drawn inside the op from
    the project's Philox streams (``kron_eigen_noise``; the seed is drawn inside the op from
    ``generator``, default the device's default generator; see :mod:`vmfdist.random`), and
    is regenerated in the backward pass instead of being stored.  Reparameterised:
    differentiable in ``loc``, ``variance`` and both bases.
    """
    w, _ = call_sampler("kron_eigen_sample", lib.kron_eigen_sample, loc, q_out, q_in, variance,
                        sample_shape=sample_shape, generator=generator)
    return w
