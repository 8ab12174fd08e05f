"""Distributions in the :mod:`torch.distributions` API, with registered KL divergences.

* :class:`VonMisesFisher`, :class:`HypersphericalUniform` (``von_mises_fisher.py``)
* :class:`MatrixNormal`, :class:`EigenvalueCorrectedMatrixNormal` (``matrix_normal.py``)
"""
from .matrix_normal import EigenvalueCorrectedMatrixNormal, MatrixNormal  # noqa: F401
from .von_mises_fisher import (  # noqa: F401
    HypersphericalUniform,
    VonMisesFisher,
    fit_vmf,
    log_sphere_area,
    sphere,
    unit_vector,
    vmf_log_normalizer,
)

__all__ = [
    "MatrixNormal",
    "EigenvalueCorrectedMatrixNormal",
    "VonMisesFisher",
    "HypersphericalUniform",
    "fit_vmf",
    "log_sphere_area",
    "vmf_log_normalizer",
    "sphere",
    "unit_vector",
]
