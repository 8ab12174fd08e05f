r"""Linear algebra over Kronecker-factored eigenbases, and the vMF sampler's reflection.

* :func:`kron_eigen_matvec` -- :math:`(Q_{out}\otimes Q_{in})\,\mathrm{diag}(S)^p\,(Q_{out}\otimes Q_{in})^T v`
  without forming the Kronecker product (one fused op; ``docs/matrix_normal.md``)
* :func:`kron_eigen_sample` -- Gaussian samples with that covariance (:math:`p = 1`)
* :func:`kron_eigen_ngd` -- the damped natural-gradient step
  :math:`((Q_{out}\otimes Q_{in})\,\mathrm{diag}(S + \lambda)\,(Q_{out}\otimes Q_{in})^T)^{-1}\,\mathrm{vec}\,U`
  of noisy K-FAC / EK-FAC, and its inner product with :math:`U`
* :func:`kron_eigen_moments` -- EK-FAC's running second moments of per-example gradients in the
  Kronecker eigenbasis
* :func:`householder` -- the reflection :math:`Q(\mu)` with :math:`Q e_1 = \mu` used by the
  von Mises--Fisher sampler

The compiled operators under the first four, for loops that call them many times per step on
arguments they have checked once (the noisy optimizers, per layer and step), are also here as
``torch.ops`` overloads: :data:`kron_eigen_matvec_op`, :data:`kron_eigen_sample_op`,
:data:`kron_eigen_ngd_op`, :data:`kron_eigen_moments_op` (``torch.ops.vmfdist.<name>.default``:
the schema in ``csrc/ops.cpp`` is the signature -- positional ``num_samples`` for the sampler,
whose randomness is the keywords of :func:`vmfdist.random.random_kwargs` -- no Python wrapper
and no checks beyond the kernels' own, which name the argument at fault).  They are
differentiable where the functions are; an optimizer that needs no graph calls them under
``torch.no_grad()`` (and, to skip the autograd layer altogether,
``vmfdist._torch_internals.below_autograd()``).
"""
from __future__ import annotations

from numbers import Real
from typing import Optional, Tuple

import torch

from ._ops import lib
from ._ops.random import call_sampler
from ._ops.vmf import householder

__all__ = ["kron_eigen_matvec", "kron_eigen_sample", "kron_eigen_ngd", "kron_eigen_moments", "householder",
           "kron_eigen_matvec_op", "kron_eigen_sample_op", "kron_eigen_noise_keyed_op", "kron_eigen_ngd_op", "kron_eigen_moments_op"]

#: ``torch.ops.vmfdist.kron_eigen_matvec.default``, the op under :func:`kron_eigen_matvec`
#: (``power`` a float).
kron_eigen_matvec_op = lib.kron_eigen_matvec.default
#: ``torch.ops.vmfdist.kron_eigen_sample.default``: ``(loc, q_out, q_in, variance, num_samples, *,
#: generator=None, seed=None, offset=None) -> (samples (num_samples, *batch, out, in), seed_offset)``,
#: the op under :func:`kron_eigen_sample`.
kron_eigen_sample_op = lib.kron_eigen_sample.default
#: ``torch.ops.vmfdist.kron_eigen_noise_keyed.default``: ``(variance, size, seed_offsets, power=0.5)``:
#: :math:`E \odot \mathrm{variance}^{p}` of ``size`` ``(..., out, in)`` with one Philox stream per matrix,
#: ``seed_offsets`` int64 ``(matrices, 2)``; matrix ``k`` is what :func:`kron_eigen_sample` with
#: ``seed, offset = seed_offsets[k]`` draws for one ``(out, in)`` sample.  No derivative (the batched
#: optimizers' weight noise, :mod:`vmfdist.optim.batched`).
kron_eigen_noise_keyed_op = lib.kron_eigen_noise_keyed.default
#: ``torch.ops.vmfdist.kron_eigen_ngd.default``, the op under :func:`kron_eigen_ngd` (``damping`` and
#: ``weight_decay`` floats).
kron_eigen_ngd_op = lib.kron_eigen_ngd.default
#: ``torch.ops.vmfdist.kron_eigen_moments.default``, the op under :func:`kron_eigen_moments`
#: (``beta`` and ``alpha`` floats).
kron_eigen_moments_op = lib.kron_eigen_moments.default


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


def _real(op: str, arg: str, value) -> float:
    """A float argument of an op: a real number or a one-element real tensor (a ``TypeError`` naming
    the argument otherwise; ``float("0.1")`` would accept a string)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return float(value)
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{op}: {arg} must be a real number, got {type(value).__name__}")
    return float(value)


def kron_eigen_ngd(q_out: torch.Tensor, q_in: torch.Tensor, scale: torch.Tensor, damping: float, w: torch.Tensor,
                   weight_decay: float = 0.0, grad: Optional[torch.Tensor] = None,
                   grad_out: Optional[torch.Tensor] = None,
                   grad_in: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""The damped natural-gradient step of one layer,
    :math:`D = Q_{out}\big((Q_{out}^T U Q_{in}) \oslash (S + \lambda)\big)Q_{in}^T`, that is
    :math:`\mathrm{vec}\,D = \big((Q_{out}\otimes Q_{in})\,\mathrm{diag}(\mathrm{vec}\,S + \lambda)\,
    (Q_{out}\otimes Q_{in})^T\big)^{-1}\mathrm{vec}\,U` for orthogonal bases, with
    :math:`U = \gamma W + G + E^T X` (``weight_decay`` :math:`\gamma`, ``w`` :math:`W`, the loss
    gradient as a matrix ``grad`` :math:`G`, as per-example rows ``grad_out`` :math:`E` ``(n, out)``
    and ``grad_in`` :math:`X` ``(n, in)``, or both; absent terms are zero).  Returns
    ``(D, <D, U>)``, the second a 0-dim tensor (the optimizers' finiteness check).

    2-D operands of one floating dtype on one device: ``w``, ``grad``, ``scale`` :math:`S`
    ``(out, in)``, ``q_out`` ``(out, out)``, ``q_in`` ``(in, in)``; ``damping`` :math:`\lambda` a float.
    Not differentiable (an optimizer update): it runs under ``torch.no_grad()``, so parameters
    may be passed as they are and the results carry no graph.  One compiled op
    (:data:`kron_eigen_ngd_op`); bad shapes, dtypes and devices raise errors naming the argument.
    """
    damping = _real("kron_eigen_ngd", "damping", damping)
    weight_decay = _real("kron_eigen_ngd", "weight_decay", weight_decay)
    with torch.no_grad():
        return lib.kron_eigen_ngd(q_out, q_in, scale, damping, w, weight_decay, grad, grad_out, grad_in)


def kron_eigen_moments(q_out: torch.Tensor, q_in: torch.Tensor, x: torch.Tensor, e: torch.Tensor,
                       moments: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    r""":math:`\beta M + \alpha \sum_n \big(Q_{out}^T e_n x_n^T Q_{in}\big)^{\odot 2}
    = \beta M + \alpha\,((E Q_{out})^{\odot 2})^T (X Q_{in})^{\odot 2}`: EK-FAC's running second
    moments of the per-example gradients :math:`e_n x_n^T` in the Kronecker eigenbasis (one location
    per example), as a new tensor.  ``x`` ``(n, in)``, ``e`` ``(n, out)``, ``moments`` :math:`M`
    ``(out, in)``, the bases as in :func:`kron_eigen_ngd`, one floating dtype; ``beta`` and
    ``alpha`` floats.  Not differentiable: it runs under ``torch.no_grad()``, as
    :func:`kron_eigen_ngd`.  One compiled op (:data:`kron_eigen_moments_op`)."""
    beta, alpha = _real("kron_eigen_moments", "beta", beta), _real("kron_eigen_moments", "alpha", alpha)
    with torch.no_grad():
        return lib.kron_eigen_moments(q_out, q_in, x, e, moments, beta, alpha)
