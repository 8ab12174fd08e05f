"""Post-hoc Laplace approximations with laplace-torch's interface (see ``docs/laplace.md``):
Kronecker-factored (:class:`KFACLaplace`, :class:`EKFACLaplace`) and diagonal
(:class:`DiagLaplace`) and dense (:class:`FullLaplace`) curvature over all weights, the last layer or chosen layers, and
laplace-torch's factory :func:`Laplace` with its defaults."""
import torch

from .diag import DiagLaplace, DiagLLLaplace
from .full import FullLaplace, FullLLLaplace
from .kron import EKFACLaplace, EKFACLLLaplace, KFACLaplace, KronLaplace, KronLLLaplace, _BaseLaplace

__all__ = ["KFACLaplace", "EKFACLaplace", "DiagLaplace", "FullLaplace", "KronLaplace", "KronLLLaplace",
           "EKFACLLLaplace", "DiagLLLaplace", "FullLLLaplace", "Laplace"]

#: ``hessian_structure`` -> class (``"ekfac"`` is ours; laplace-torch's ``"lowrank"`` is not offered)
_STRUCTURES = {"kron": KFACLaplace, "ekfac": EKFACLaplace, "diag": DiagLaplace, "full": FullLaplace}


def Laplace(model: torch.nn.Module, likelihood: str, subset_of_weights: str = "last_layer",
            hessian_structure: str = "kron", **kwargs) -> _BaseLaplace:
    """laplace-torch's factory, with its defaults: ``Laplace(model, likelihood)`` is the K-FAC
    Laplace over the **last layer** (laplace-torch's ``KronLLLaplace``).

    ``subset_of_weights``: ``"last_layer"`` (the last layer with trainable parameters that the
    forward pass runs, found on the first batch of ``fit``; or ``last_layer_name=...``), ``"all"``,
    or ``"subnetwork"`` (``modules=[...]``: layers or their names).  ``hessian_structure``:
    ``"kron"`` (K-FAC), ``"ekfac"`` (EK-FAC, ours), ``"diag"`` (the exact GGN diagonal), ``"full"``
    (the dense GGN; with ``subset_of_weights="subnetwork", subnetwork_indices=...``, laplace-torch's
    ``SubnetLaplace``).  Other keyword arguments go to the class (see :class:`KFACLaplace`)."""
    if hessian_structure not in _STRUCTURES:
        extra = (" ('lowrank' is laplace-torch's and not offered here)" if hessian_structure == "lowrank" else "")
        raise ValueError(f"hessian_structure must be one of {tuple(_STRUCTURES)}, got {hessian_structure!r}{extra}")
    if kwargs.get("subnetwork_indices") is not None and hessian_structure != "full":
        raise ValueError(f"subnetwork_indices (a parameter mask) needs hessian_structure='full', got "
                         f"{hessian_structure!r}; for whole layers use modules=[...] with any structure")
    return _STRUCTURES[hessian_structure](model, likelihood, subset_of_weights=subset_of_weights, **kwargs)
