"""Kronecker-factored curvature (K-FAC, EK-FAC) of ``nn.Linear`` and ``nn.Conv2d`` layers.

Shared by :mod:`vmfdist.optim` (noisy K-FAC / EK-FAC) and ``vmfdist.laplace``; imports
neither.  The rooms:

* :mod:`~vmfdist.curvature.factor` -- :class:`KroneckerFactor`, the one value type (factors,
  eigenbases, damping, EK-FAC moments) every consumer speaks;
* :mod:`~vmfdist.curvature.collect` -- :class:`KFACCollector`, the one collection pass
  (hooks, output gradients, per-batch statistics), and the option names;
* :mod:`~vmfdist.curvature.kfac` -- :func:`compute_kfac`, factors over a data set, and the
  conventions;
* :mod:`~vmfdist.curvature.eigen` -- eigenbases, damping, running averages;
* :mod:`~vmfdist.curvature.layers` -- which modules carry factors and how their inputs and
  output gradients are laid out.
"""
from .collect import (FISHER_TYPES, KFAC_APPROX, LIKELIHOODS, KFACCollector, batch_nll, batch_rows, canonical_fisher_type,
                      check_choice, check_output, check_targets, factor_rows, gradient_factor, input_factor, output_gradients,
                      per_example_second_moments, resolve_loss)
from .eigen import (damped_kfac_eigenvalues, damped_kfac_factors, eigen_basis, kfac_eigenvalues, require_finite,
                    running_average_weight, symmetrise, trace_norm_pi)
from .factor import KroneckerFactor
from .kfac import KFACResult, compute_kfac
from .layers import (SUPPORTED_LAYERS, TRANSPOSED_CONVS, check_layer, find_layers, grad_matrix, input_patches, layer_shape,
                     output_grads, set_weight_matrix, weight_matrix)

__all__ = [
    "compute_kfac", "KFACResult", "KroneckerFactor", "KFACCollector", "output_gradients", "input_factor",
    "gradient_factor", "factor_rows", "per_example_second_moments", "batch_nll", "batch_rows", "resolve_loss", "check_targets", "check_output",
    "check_choice", "canonical_fisher_type", "FISHER_TYPES", "KFAC_APPROX", "LIKELIHOODS",
    "eigen_basis", "symmetrise", "trace_norm_pi", "kfac_eigenvalues", "damped_kfac_eigenvalues",
    "damped_kfac_factors", "running_average_weight", "require_finite", "SUPPORTED_LAYERS", "TRANSPOSED_CONVS", "find_layers",
    "check_layer", "input_patches", "output_grads", "layer_shape", "weight_matrix", "set_weight_matrix",
    "grad_matrix",
]
