"""Kronecker-factored curvature (K-FAC, EK-FAC) of ``nn.Linear`` and ``nn.Conv2d`` layers.

Shared by :mod:`vmfdist.optim` (noisy K-FAC / EK-FAC) and ``vmfdist.laplace``; imports
neither.  Main entry point: :func:`compute_kfac` (factors over a data set);
:class:`KFACHooks`, :func:`output_gradients`, :func:`input_factor`,
:func:`gradient_factor` and :func:`per_example_second_moments` are the building blocks for
running estimates.  Conventions: :mod:`vmfdist.curvature.kfac`.
"""
from .eigen import (check_finite, damped_kfac_eigenvalues, damped_kfac_factors, eigen_basis, kfac_eigenvalues,
                    running_average_weight, symmetrise, trace_norm_pi)
from .kfac import (FISHER_TYPES, KFAC_APPROX, LIKELIHOODS, KFACHooks, KFACResult, LayerFactors, check_targets,
                   compute_kfac, gradient_factor, input_factor, output_gradients, per_example_second_moments, resolve_loss)
from .layers import (SUPPORTED_LAYERS, check_layer, find_layers, grad_matrix, input_patches, layer_shape,
                     output_grads, set_weight_matrix, weight_matrix)

__all__ = [
    "compute_kfac", "KFACResult", "LayerFactors", "KFACHooks", "output_gradients", "input_factor",
    "gradient_factor", "per_example_second_moments", "resolve_loss", "check_targets", "FISHER_TYPES", "KFAC_APPROX", "LIKELIHOODS",
    "eigen_basis", "symmetrise", "trace_norm_pi", "kfac_eigenvalues", "damped_kfac_eigenvalues",
    "damped_kfac_factors", "running_average_weight", "check_finite", "SUPPORTED_LAYERS", "find_layers",
    "check_layer", "input_patches", "output_grads", "layer_shape", "weight_matrix", "set_weight_matrix",
    "grad_matrix",
]
