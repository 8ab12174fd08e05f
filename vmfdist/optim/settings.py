"""The noisy optimizers' settings: which layers they train, the hyper-parameter presets of Bae et
al. (2018), and the checks of every setting, each error naming its argument."""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch

from ..curvature import FISHER_TYPES, KFAC_APPROX, check_choice, find_layers

__all__ = ["PRESETS", "trained_layers", "resolve_hyperparameters", "check_step_options"]

#: Hyper-parameter presets by name, ``"uci"`` (Bae et al. 2018, §6.1: batch 10 or 100,
#: T_stats = 1, re-scaling re-initialised and bases recomputed every 50 steps, decay by 0.1 for
#: the second half) and ``"classification"`` (Bae et al. 2018, §6.2: batch 128, amortised statistics,
#: inverse and re-scaling updates).  Where the stored copy of the paper lost a number, the value
#: is ours (see docs/optim.md).  ``"uci_paper"``: the authors' regression configuration as their
#: code runs it (docs/experiments/uci_paper_recipe.md): no extrinsic damping and no trust region, the
#: step along a bias-corrected moving average of the gradient (m <- 0.9 m + 0.1 g), beta' = 0.01, and
#: the re-scaling reset to the *damped* K-FAC eigenvalues, every 5 steps (the small sets' T_eig; the
#: configs reset every 50 on the others: give T_inv / T_reinit), and the factors started at I + T T^T
#: (T = 0.1 N(0, 1)) and averaged exponentially from there (``ema_from_init``; the other presets take the
#: plain mean of the first 1/beta updates, which forgets the start).
PRESETS = {
    "uci": dict(lr=0.01, beta=0.001, beta_scale=0.001, T_stats=1, T_inv=50, T_scale=1, T_reinit=50,
                damping=1e-3, prior_var=1.0, kl_weight=1.0, kl_clip=1e-3, momentum=0.0, reinit_damped=False,
                ema_from_init=False),
    "classification": dict(lr=0.01, beta=0.01, beta_scale=0.01, T_stats=10, T_inv=100, T_scale=10, T_reinit=100,
                           damping=1e-3, prior_var=1.0, kl_weight=1.0, kl_clip=1e-3, momentum=0.0,
                           reinit_damped=False, ema_from_init=False),
    "uci_paper": dict(lr=0.01, beta=0.001, beta_scale=0.01, T_stats=1, T_inv=5, T_scale=1, T_reinit=5,
                      damping=0.0, prior_var=1.0, kl_weight=1.0, kl_clip=None, momentum=0.9, reinit_damped=True,
                      ema_from_init=True),
}


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def resolve_hyperparameters(likelihood: str, preset: Optional[str], kl_clip, **given) -> Tuple[dict, Optional[float]]:
    """``(hp, kl_clip)``: the preset (default ``"uci"`` for regression, ``"classification"`` otherwise)
    overridden by the ``given`` values that are not ``None``, each checked; ``kl_clip="preset"`` takes
    the preset's trust region."""
    if preset is None:
        preset = "uci" if likelihood == "regression" else "classification"
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    hp = dict(PRESETS[preset])
    hp.update({k: v for k, v in given.items() if v is not None})
    for k in ("lr", "prior_var"):
        if not (hp[k] > 0 and math.isfinite(hp[k])):
            raise ValueError(f"{k} must be positive and finite, got {hp[k]!r}")
    for k in ("kl_weight", "damping"):
        if not (hp[k] >= 0 and math.isfinite(hp[k])):
            raise ValueError(f"{k} must be non-negative and finite, got {hp[k]!r}")
    for k in ("beta", "beta_scale"):
        if not (0 < hp[k] <= 1):
            raise ValueError(f"{k} must be in (0, 1], got {hp[k]!r}")
    if not (_real(hp["momentum"]) and 0 <= hp["momentum"] < 1):
        raise ValueError(f"momentum must be in [0, 1), got {hp['momentum']!r}")
    for k in ("reinit_damped", "ema_from_init"):
        if not isinstance(hp[k], bool):
            raise ValueError(f"{k} must be True or False, got {hp[k]!r}")
    for k in ("T_stats", "T_inv", "T_scale", "T_reinit"):
        if not (isinstance(hp[k], int) and hp[k] >= 1):
            raise ValueError(f"{k} must be a positive integer, got {hp[k]!r}")
    if hp["T_inv"] % hp["T_stats"] != 0:
        raise ValueError(f"T_inv ({hp['T_inv']}) must be a multiple of T_stats ({hp['T_stats']})")
    if isinstance(kl_clip, str):
        if kl_clip != "preset":
            raise ValueError(f"kl_clip must be a positive number, None or 'preset', got {kl_clip!r}")
        kl_clip = hp.pop("kl_clip")
    else:
        hp.pop("kl_clip")
    if kl_clip is not None and not kl_clip > 0:
        raise ValueError(f"kl_clip must be positive or None, got {kl_clip!r}")
    if hp["kl_weight"] == 0 and hp["damping"] == 0:
        raise ValueError("kl_weight = 0 and damping = 0 leave the curvature undamped; give damping > 0")
    return hp, kl_clip


def check_step_options(fisher_type: str, kfac_approx: str, particles: int, other_optimizer: str,
                       total_steps: Optional[int]) -> None:
    """The step's options (curvature's option names for ``fisher_type`` and ``kfac_approx``)."""
    check_choice("fisher_type", fisher_type, FISHER_TYPES)
    check_choice("kfac_approx", kfac_approx, KFAC_APPROX)
    if not (isinstance(particles, int) and particles >= 1):
        raise ValueError(f"particles must be a positive integer, got {particles!r}")
    if other_optimizer not in ("adam", "sgd"):
        raise ValueError(f"other_optimizer must be 'adam' or 'sgd', got {other_optimizer!r}")
    if total_steps is not None and not (isinstance(total_steps, int) and total_steps >= 1):
        raise ValueError(f"total_steps must be a positive integer or None, got {total_steps!r}")


def trained_layers(model: torch.nn.Module, modules=None) -> Dict[str, torch.nn.Module]:
    """The layers the optimizer gives a Kronecker-factored posterior: every supported layer of
    ``model`` (or those of ``modules``) whose parameters require a gradient.  A frozen layer
    (weight and bias with ``requires_grad=False``) is left alone, as torch optimizers leave frozen
    parameters; it is an error to select one with ``modules``, to freeze only one of a layer's
    weight and bias (they are one matrix ``[W | b]`` to the optimizer), or to tie a parameter
    between layers (its updates would be lost)."""
    chosen = find_layers(model, modules, allow_other_parameters=True)
    out, owner = {}, {}
    for name, mod in chosen.items():
        label = name or "<model>"
        w = mod.weight.requires_grad
        b = w if mod.bias is None else mod.bias.requires_grad
        if w != b:
            raise ValueError(f"layer {label!r} has a {'frozen' if w else 'trainable'} bias and a "
                             f"{'trainable' if w else 'frozen'} weight; the optimizer trains [W | b] as one matrix: "
                             "freeze both or neither")
        if mod.weight.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"layer {label!r} has dtype {mod.weight.dtype}; the noisy optimizers keep Kronecker factors "
                             "and eigenbases in the layers' dtype, which must be float32 or float64 (train in float32, "
                             "with torch.autocast for half-precision speed)")
        if not w:
            if modules is not None:
                raise ValueError(f"modules: layer {label!r} is frozen (requires_grad=False); unfreeze it or leave it "
                                 "out")
            continue
        for p in (mod.weight, mod.bias):
            if p is None:
                continue
            if id(p) in owner:
                raise ValueError(f"layers {owner[id(p)]!r} and {label!r} share a parameter (tied weights), which the "
                                 "noisy optimizers do not support: untie them, or leave one out with modules=")
            owner[id(p)] = label
        out[name] = mod
    if not out:
        raise ValueError("model has no trainable supported layers (every nn.Linear / nn.Conv2d is frozen)")
    chosen_ids = {id(m) for m in out.values()}
    for name, mod in model.named_modules():
        if id(mod) in chosen_ids:
            continue
        for p in mod.parameters(recurse=False):
            if id(p) in owner:
                raise ValueError(f"module {name or '<model>'!r} ({type(mod).__name__}) shares a parameter with layer "
                                 f"{owner[id(p)]!r} (tied weights), which the noisy optimizers do not support")
    return out
