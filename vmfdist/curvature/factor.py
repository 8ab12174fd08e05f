r"""The Kronecker factor: one value type for a layer's (or a block's) curvature
:math:`G\otimes A`, its eigenbasis, its damping and its EK-FAC second moments.

Every consumer speaks this one vocabulary: :func:`~vmfdist.curvature.compute_kfac` returns
one :class:`KroneckerFactor` per layer, ``vmfdist.laplace`` keeps one per posterior block and
the noisy optimizers of ``vmfdist.optim`` hand theirs out through ``kronecker_factors()``.

Layout: ``A`` is the input factor (``in`` square; with the bias as an appended input of 1,
``in + 1``), ``G`` the output-gradient factor (``out`` square); the curvature of the
row-major ``vec`` of the ``(out, in)`` weight matrix is :math:`G\otimes A` (``torch.kron``
order).  With :math:`A = Q_A\,\mathrm{diag}(d_A)\,Q_A^T` and :math:`G = Q_G\,\mathrm{diag}(d_G)\,Q_G^T`,
``moments`` (EK-FAC, George et al. 2018) replaces the K-FAC eigenvalues
:math:`d_G d_A^T` by the second moments of the per-example gradients in the basis
:math:`Q_G\otimes Q_A`, an ``(out, in)`` matrix.  What the factors are normalised to (per data
point, or summed over the data) is the owner's convention and is stated there.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

import torch

from .eigen import damped_kfac_eigenvalues, damped_kfac_factors, eigen_basis, kfac_eigenvalues, trace_norm_pi

__all__ = ["KroneckerFactor"]


@dataclass
class KroneckerFactor:
    """``A`` (input factor), ``G`` (output-gradient factor), and, once computed, the
    eigenbases ``(d_a, q_a)``, ``(d_g, q_g)`` and the EK-FAC second ``moments``
    (``(out, in)``, in the basis ``q_g``, ``q_a``)."""

    A: torch.Tensor
    G: torch.Tensor
    d_a: Optional[torch.Tensor] = None
    q_a: Optional[torch.Tensor] = None
    d_g: Optional[torch.Tensor] = None
    q_g: Optional[torch.Tensor] = None
    moments: Optional[torch.Tensor] = None

    @property
    def shape(self):
        """``(out, in)``: the shape of the weight matrix the factor describes."""
        return self.G.shape[-1], self.A.shape[-1]

    def eigen(self, min_eigenvalue: float = 0.0) -> "KroneckerFactor":
        """Compute (and keep) the eigenbases of ``A`` and ``G`` (eigenvalues clamped below at
        ``min_eigenvalue``, canonical signs: :func:`~vmfdist.curvature.eigen_basis`); returns self."""
        self.d_a, self.q_a = eigen_basis(self.A, min_eigenvalue)
        self.d_g, self.q_g = eigen_basis(self.G, min_eigenvalue)
        return self

    def _bases(self):
        if self.d_a is None or self.d_g is None:
            self.eigen()
        return self.d_g, self.d_a

    def kfac_eigenvalues(self) -> torch.Tensor:
        """``outer(d_G, d_A)``: the K-FAC eigenvalues in the Kronecker eigenbasis, ``(out, in)``
        (the eigenbases are computed first if they are missing)."""
        d_g, d_a = self._bases()
        return kfac_eigenvalues(d_g, d_a)

    def trace_pi(self) -> torch.Tensor:
        """Martens & Grosse's trace-norm :math:`\\pi` of the factors (:func:`~vmfdist.curvature.trace_norm_pi`)."""
        return trace_norm_pi(self.A, self.G)

    def damped_eigenvalues(self, damping: float, pi: Union[float, torch.Tensor] = 1.0) -> torch.Tensor:
        r"""Eigenvalues of the factored-damped :math:`(G + \frac{\sqrt\gamma}{\pi}I)\otimes(A + \pi\sqrt\gamma I)`,
        ``(out, in)`` (:func:`~vmfdist.curvature.damped_kfac_eigenvalues`)."""
        d_g, d_a = self._bases()
        return damped_kfac_eigenvalues(d_g, d_a, damping, pi)

    def damped_factors(self, damping: float, pi="trace"):
        r""":math:`(A + \pi\sqrt\gamma I,\; G + \sqrt\gamma/\pi\, I)` (:func:`~vmfdist.curvature.damped_kfac_factors`)."""
        return damped_kfac_factors(self.A, self.G, damping, pi)

    def block(self, kind: str) -> "KroneckerFactor":
        """The factor of part of a layer whose ``A`` has the bias as its last input:
        ``"weight"`` (``A`` without the bias row and column), ``"bias"`` (the bias alone: ``A``
        is the ``1 x 1`` corner) or ``"joint"`` (the whole).  No eigenbases are carried over."""
        if kind == "joint":
            return KroneckerFactor(self.A, self.G)
        if kind == "weight":
            return KroneckerFactor(self.A[:-1, :-1], self.G)
        if kind == "bias":
            return KroneckerFactor(self.A[-1:, -1:], self.G)
        raise ValueError(f"kind must be 'weight', 'bias' or 'joint', got {kind!r}")

    def scaled(self, a: float = 1.0, g: float = 1.0) -> "KroneckerFactor":
        """A copy with ``A * a`` and ``G * g`` (eigenvalues and moments scaled to match; the
        bases are shared)."""
        def mul(t, c):
            return None if t is None else t * c
        return replace(self, A=self.A * a, G=self.G * g, d_a=mul(self.d_a, a), d_g=mul(self.d_g, g),
                       moments=mul(self.moments, a * g))

    def dense(self) -> torch.Tensor:
        """:math:`G\\otimes A` as a dense matrix (for tests and small layers only)."""
        return torch.kron(self.G, self.A)
