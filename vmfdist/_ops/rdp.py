"""Fake kernel of ``rdp_kl`` (``csrc/include/vmfdist/rdp.h``): the KL of one grouping of a
radial--directional layer with its gradient, which :class:`vmfdist.nn.rdp._FactorKL` uses as its
forward (no derivative of its own: the gradient is among its outputs).
"""
from __future__ import annotations

import torch

from ._lib import _check_same_device


@torch.library.register_fake("vmfdist::rdp_kl")
def _(log_kappa, local, glob, prior_kappa, tau_local, tau_global, dim, uniform):
    # the same checks and shapes as csrc/host/rdp_host.h
    _check_same_device("rdp_kl", local=local, log_kappa=log_kappa, glob=glob, prior_kappa=prior_kappa,
                       tau_local=tau_local, tau_global=tau_global)
    torch._check(local.dtype.is_floating_point, lambda: f"rdp_kl: local must be a floating tensor, got {local.dtype}")
    for name, t in (("log_kappa", log_kappa), ("glob", glob), ("prior_kappa", prior_kappa), ("tau_local", tau_local),
                    ("tau_global", tau_global)):
        torch._check(t.dtype == local.dtype, lambda: f"rdp_kl: {name} must have local's dtype {local.dtype}")
    torch._check(local.dim() == 2 and local.shape[0] == 4,
                 lambda: f"rdp_kl: local must have shape (4, groups), got {tuple(local.shape)}")
    torch._check(glob.dim() == 1 and glob.shape[0] == 4, lambda: f"rdp_kl: glob must have shape (4,), got {tuple(glob.shape)}")
    for name, t in (("log_kappa", log_kappa), ("prior_kappa", prior_kappa), ("tau_local", tau_local),
                    ("tau_global", tau_global)):
        torch._check(t.dim() == 0, lambda: f"rdp_kl: {name} must be a 0-dim tensor, got shape {tuple(t.shape)}")
    torch._check(dim >= 2, lambda: f"rdp_kl: dim (the groups' dimension) must be at least 2, got {dim}")
    return (local.new_empty(()), local.new_empty(()), local.new_empty(local.shape), local.new_empty((4,)))
