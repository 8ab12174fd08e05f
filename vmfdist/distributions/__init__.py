"""Distributions in the :mod:`torch.distributions` API, with registered KL divergences.

* :class:`VonMisesFisher`, :class:`HypersphericalUniform`, :func:`vmf_sample` (``von_mises_fisher.py``)
* :class:`PowerSpherical`, :func:`power_spherical_sample` (``power_spherical.py``)
* :class:`Radial`, :func:`radial_noise`, :func:`radial_sample`, :func:`kl_radial_radial` (``radial.py``); :func:`radial_sample_kl`:
  fused sampling and KL of the Radial layers (``kl.py``)
* :func:`meanfield_sample`, :func:`meanfield_kl`, :func:`meanfield_sample_kl`: fused sampling and KL of a factorised Gaussian
  with a softplus scale, the mean-field layers' posterior (``meanfield.py``)
* KL divergences torch lacks for the radius priors: LogNormal||Gamma,
  LogNormal||InverseGamma, Weibull||Weibull (``kl.py``)
* :class:`MatrixNormal`, :class:`EigenvalueCorrectedMatrixNormal` (``matrix_normal.py``)
* :class:`StereographicTransform`, :class:`NormalizeTransform`: ``biject_to(sphere)`` and
  ``transform_to(sphere)`` (``transforms.py``)
"""
from . import kl  # noqa: F401  (registers the KL divergences)
from .kl import radial_sample_kl  # noqa: F401
from . import transforms  # noqa: F401  (registers biject_to / transform_to for the sphere)
from .matrix_normal import EigenvalueCorrectedMatrixNormal, MatrixNormal  # noqa: F401
from .meanfield import meanfield_kl, meanfield_sample, meanfield_sample_kl  # noqa: F401
from .power_spherical import PowerSpherical, power_spherical_sample  # noqa: F401
from .radial import Radial, kl_radial_radial, radial_noise, radial_sample  # noqa: F401
from .transforms import NormalizeTransform, StereographicTransform  # noqa: F401
from .von_mises_fisher import (  # noqa: F401
    HypersphericalUniform,
    VonMisesFisher,
    fit_vmf,
    log_sphere_area,
    sphere,
    vmf_log_normalizer,
    vmf_sample,
)

__all__ = [
    "Radial",
    "radial_noise",
    "kl_radial_radial",
    "meanfield_sample",
    "meanfield_kl",
    "meanfield_sample_kl",
    "radial_sample",
    "radial_sample_kl",
    "MatrixNormal",
    "EigenvalueCorrectedMatrixNormal",
    "VonMisesFisher",
    "HypersphericalUniform",
    "PowerSpherical",
    "power_spherical_sample",
    "fit_vmf",
    "log_sphere_area",
    "vmf_log_normalizer",
    "vmf_sample",
    "sphere",
    "StereographicTransform",
    "NormalizeTransform",
]
