"""Post-hoc Laplace approximations with laplace-torch's interface (see ``docs/laplace.md``):
Kronecker-factored (:class:`KFACLaplace`, :class:`EKFACLaplace`) and diagonal
(:class:`DiagLaplace`) curvature over all weights, the last layer or chosen layers, and
laplace-torch's factory :func:`Laplace` with its defaults."""
import torch

from .kron import (DiagLaplace, DiagLLLaplace, EKFACLaplace, EKFACLLLaplace, KFACLaplace, KronLaplace, KronLLLaplace,
                   _KroneckerLaplace)

__all__ = ["KFACLaplace", "EKFACLaplace", "DiagLaplace", "KronLaplace", "KronLLLaplace", "EKFACLLLaplace",
           "DiagLLLaplace", "Laplace"]

#: ``hessian_structure`` -> class (``"ekfac"`` is ours; laplace-torch's ``"lowrank"`` is not offered)
_STRUCTURES = {"kron": KFACLaplace, "ekfac": EKFACLaplace, "diag": DiagLaplace}


def Laplace(model: torch.nn.Module, likelihood: str, subset_of_weights: str = "last_layer",
            hessian_structure: str = "kron", **kwargs) -> _KroneckerLaplace:
    """laplace-torch's factory, with its defaults: ``Laplace(model, likelihood)`` is the K-FAC
    Laplace over the **last layer** (laplace-torch's ``KronLLLaplace``).

    ``subset_of_weights``: ``"last_layer"`` (the last layer with trainable parameters that the
    forward pass runs, found on the first batch of ``fit``; or ``last_layer_name=...``), ``"all"``,
    or ``"subnetwork"`` (``modules=[...]``: layers or their names).  ``hessian_structure``:
    ``"kron"`` (K-FAC), ``"ekfac"`` (EK-FAC, ours), ``"diag"`` (the exact GGN diagonal).
    Other keyword arguments go to the class (see :class:`KFACLaplace`)."""
    if hessian_structure not in _STRUCTURES:
        extra = (" ('lowrank' is laplace-torch's and not offered here)" if hessian_structure == "lowrank" else "")
        raise ValueError(f"hessian_structure must be one of {tuple(_STRUCTURES)}, got {hessian_structure!r}{extra}")
    return _STRUCTURES[hessian_structure](model, likelihood, subset_of_weights=subset_of_weights, **kwargs)
