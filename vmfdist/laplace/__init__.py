"""Post-hoc Laplace approximations with Kronecker-factored curvature: :class:`KFACLaplace`
and :class:`EKFACLaplace`, with laplace-torch's interface (see ``docs/laplace.md``)."""
from .kron import EKFACLaplace, KFACLaplace, Laplace

__all__ = ["KFACLaplace", "EKFACLaplace", "Laplace"]
