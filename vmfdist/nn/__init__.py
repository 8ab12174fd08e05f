r"""Bayesian neural-network layers and the tools around them.

* Layers (``nn.Linear`` / ``nn.Conv2d`` constructor signatures plus keyword options):
  :class:`MeanFieldLinear`, :class:`MeanFieldConv2d` (factorised Gaussian; estimators
  ``"reparam"``, ``"local"``, ``"flipout"``), :class:`RadialLinear`, :class:`RadialConv2d`
  (Radial BNN posterior), :class:`RDPLinear`, :class:`RDPConv2d` (radial--directional
  posterior with row / column / double grouping).
* Model level: :func:`kl_divergence`, :func:`deterministic`, :func:`set_mode`,
  :func:`sample_forward`, :class:`ELBO` with the likelihoods :class:`Categorical`,
  :class:`Gaussian`, :class:`GammaPrecisionGaussian`; :func:`to_bayesian`,
  :func:`to_deterministic`; :func:`predict` and the metrics; :func:`check_finite`.
* Calibration and selective prediction: :func:`adaptive_ece`, :func:`aurc`, :func:`fpr_at_tpr`,
  :class:`TemperatureScaling`, :func:`reliability_diagram`.
* Continual learning: :func:`posterior_as_prior` (the VCL step: the current posterior becomes
  the prior of the next task).
* RDP pruning: :func:`log_modes`, :func:`gap_threshold`, :func:`compress`,
  :func:`count_flops`, :func:`count_parameters`.

This package imports only :mod:`vmfdist.distributions` and :mod:`vmfdist.special` below it.
"""
from ._base import MODES, BayesianModule  # noqa: F401
from .calibration import TemperatureScaling, adaptive_ece, aurc, fpr_at_tpr, reliability_diagram  # noqa: F401
from .continual import posterior_as_prior  # noqa: F401
from .convert import to_bayesian, to_deterministic  # noqa: F401
from .elbo import ELBO, Categorical, GammaPrecisionGaussian, Gaussian, Likelihood  # noqa: F401
from .meanfield import MeanFieldConv2d, MeanFieldLinear  # noqa: F401
from .model import bayesian_modules, check_finite, deterministic, kl_divergence, sample_forward, set_mode  # noqa: F401
from .predictive import (PredictiveCategorical, accuracy, brier_score, calibration_bins, ece,  # noqa: F401
                         log_likelihood, mutual_information, nll, ood_auroc, predict, predictive_entropy, rmse)
from .prune import architecture, compress, count_flops, count_parameters, gap_threshold, log_modes  # noqa: F401
from .radial import RadialConv2d, RadialLinear  # noqa: F401
from .rdp import RDPConv2d, RDPLinear, RDPPosterior, concentration_for_mean_length, param_groups  # noqa: F401

__all__ = [
    "BayesianModule", "MODES",
    "MeanFieldLinear", "MeanFieldConv2d", "RadialLinear", "RadialConv2d", "RDPLinear", "RDPConv2d",
    "RDPPosterior", "concentration_for_mean_length", "param_groups",
    "kl_divergence", "deterministic", "set_mode", "sample_forward", "bayesian_modules", "check_finite",
    "ELBO", "Likelihood", "Categorical", "Gaussian", "GammaPrecisionGaussian",
    "to_bayesian", "to_deterministic", "posterior_as_prior",
    "predict", "PredictiveCategorical", "nll", "log_likelihood", "rmse", "accuracy", "ece", "calibration_bins",
    "brier_score", "predictive_entropy", "mutual_information", "ood_auroc",
    "adaptive_ece", "aurc", "fpr_at_tpr", "TemperatureScaling", "reliability_diagram",
    "log_modes", "gap_threshold", "compress", "count_flops", "count_parameters", "architecture",
]
