"""Post-hoc Laplace approximations with Kronecker-factored curvature: :class:`KFACLaplace`
and :class:`EKFACLaplace`, with laplace-torch's interface (see ``docs/laplace.md``), and
laplace-torch's factory :func:`Laplace`."""
import torch

from .kron import EKFACLaplace, KFACLaplace, _KroneckerLaplace

__all__ = ["KFACLaplace", "EKFACLaplace", "Laplace"]


def Laplace(model: torch.nn.Module, likelihood: str, subset_of_weights: str = "all", hessian_structure: str = "kron",
            **kwargs) -> _KroneckerLaplace:
    """laplace-torch's factory: ``hessian_structure="kron"`` gives :class:`KFACLaplace`,
    ``"ekfac"`` :class:`EKFACLaplace`; ``subset_of_weights`` must be ``"all"`` (restrict layers
    with ``modules=`` instead).  Other structures (``"full"``, ``"diag"``, ``"lowrank"``) are
    laplace-torch's, not offered here."""
    if subset_of_weights != "all":
        raise ValueError(f"subset_of_weights={subset_of_weights!r} is not supported (only 'all'); pass modules=[...] "
                         f"to cover chosen layers")
    classes = {"kron": KFACLaplace, "ekfac": EKFACLaplace}
    if hessian_structure not in classes:
        raise ValueError(f"hessian_structure must be one of {tuple(classes)}, got {hessian_structure!r}")
    return classes[hessian_structure](model, likelihood, **kwargs)
