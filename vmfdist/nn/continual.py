r"""Posterior-to-prior updates for variational continual learning (VCL, Nguyen et al. 2018).

In VCL the approximate posterior after task :math:`t` is the prior of task :math:`t + 1`:
:math:`q_t(w) = \arg\min_q \mathrm{KL}(q \,\|\, q_{t-1}) - E_q[\log p(D_t \mid w)]`.
:func:`posterior_as_prior` makes that step for the mean-field and Radial layers: each layer's
weight (and bias) prior becomes the elementwise Gaussian :math:`\mathcal N(\mu, \sigma^2)` at the
layer's current posterior parameters (detached copies, so later training does not move it).

* Mean-field layers: the prior *is* the current posterior, so the layer's KL is zero right after
  the call, and the next task's KL is the closed-form Gaussian KL to the previous posterior.
* Radial layers: the prior is the Gaussian with the posterior's mean and :math:`\sigma` -- the
  prior of Farquhar et al. 2020 (Appendix C, eq. 44: the cross-entropy
  :math:`-\tfrac12\|(w - \mu_{prior})/\sigma_{prior}\|^2` is that of this Gaussian), whose KL from
  a Radial posterior has the library's closed form (:func:`~vmfdist.distributions.kl.kl_radial_normal`).
  It is not the Radial posterior itself, so the KL right after the call is a positive constant
  that depends only on the number of weights :math:`D` (the posterior's per-weight spread is
  :math:`\sigma/\sqrt D`, much narrower than the prior's :math:`\sigma`).  A Radial prior is also
  possible (pass a :class:`~vmfdist.distributions.radial.Radial` as a layer's ``prior``; its KL is
  a Monte Carlo estimate), but is not what this function sets.

The priors are stored as buffers of the prior's new shape (the parameter's shape): to load a
``state_dict`` saved after the call into a freshly built model, call :func:`posterior_as_prior`
on the fresh model first (or pickle the whole module).
"""
from __future__ import annotations

import torch
from torch.distributions import Normal

from ._base import _Prior, _ScaledGaussianLayer
from .model import bayesian_modules

__all__ = ["posterior_as_prior"]


@torch.no_grad()
def posterior_as_prior(model: torch.nn.Module) -> torch.nn.Module:
    r"""Set the prior of every Bayesian layer of ``model`` to the Gaussian of its current
    posterior: weight prior :math:`\mathcal N(\mu_w, \sigma_w^2)` elementwise
    (``weight_mu``, ``softplus(weight_rho)``), bias prior likewise; the VCL step between two
    tasks.  The prior tensors are detached copies (later training does not move them), in the
    layer's dtype and on its device.  Returns ``model`` (changed in place).

    Only mean-field and Radial layers have such a posterior; a model holding another Bayesian
    layer (RDP) raises ``TypeError`` and is left unchanged, a model without Bayesian layers
    ``ValueError``.  Layers that should keep their prior (e.g. a new task's head) are simply not
    part of the module passed in.
    """
    layers = list(bayesian_modules(model))
    if not layers:
        raise ValueError("posterior_as_prior: the model has no Bayesian layers (vmfdist.nn)")
    for name, m in layers:
        if not isinstance(m, _ScaledGaussianLayer):
            raise TypeError(f"posterior_as_prior: layer {name or 'model'!r} ({type(m).__name__}) has no Gaussian "
                            "(mean, scale) posterior; only mean-field and Radial layers are supported")
    for _, m in layers:
        m.prior = _Prior(Normal(m.weight_mu.detach().clone(), m.weight_sigma.detach().clone(), validate_args=False),
                         "prior")
        if m.bias_mu is not None:
            m.bias_prior = _Prior(Normal(m.bias_mu.detach().clone(), m.bias_sigma.detach().clone(),
                                         validate_args=False), "bias_prior")
    return model
