r"""Noisy K-FAC (Zhang et al. 2018) and noisy EK-FAC (Bae et al. 2018): natural-gradient
variational inference with matrix-variate Gaussian posteriors on ordinary models.

For every ``nn.Linear`` / ``nn.Conv2d`` layer with weight matrix :math:`W` (``(out, in+1)``,
the bias as the last column) the variational posterior is

* noisy K-FAC: :math:`q(W) = \mathcal{MN}\big(M,\ \tfrac{\lambda}{N}(G+\tfrac{\sqrt{\gamma_{in}}}{\pi}I)^{-1},\
  (A+\pi\sqrt{\gamma_{in}}I)^{-1}\big)`, covariance :math:`\tfrac{\lambda}{N}[(G+\tfrac{\sqrt{\gamma_{in}}}{\pi}I)\otimes(A+\pi\sqrt{\gamma_{in}}I)]^{-1}`;
* noisy EK-FAC: :math:`\mathrm{Cov}(\mathrm{vec}\,W) = \tfrac{\lambda}{N}(Q_G\otimes Q_A)\,\mathrm{diag}(\mathrm{vec}\,S + \gamma_{in})^{-1}(Q_G\otimes Q_A)^T`,

with :math:`\gamma_{in} = \lambda/(N\eta)` (KL weight :math:`\lambda`, prior :math:`\mathcal N(0,\eta I)`,
:math:`N` = ``num_data``, the global data set size), :math:`A, G` running averages of the
K-FAC factors at the sampled weights (:mod:`vmfdist.curvature` conventions: :math:`G\otimes A`
is the Fisher per data point), :math:`Q_A, Q_G` their eigenbases and :math:`S` the running
second moments of the per-example gradients in that basis.  A step:

1. sample :math:`W\sim q` (``kron_eigen_sample``: :math:`W = M + Q_G(E\odot\sigma)Q_A^T`, never a
   dense Cholesky);
2. forward and backward at :math:`W`: the gradient of the mean negative log-likelihood and,
   on statistics steps, the factor contributions from labels sampled from the model's
   predictive (``fisher_type="mc"``, the true Fisher);
3. every ``T_stats`` steps :math:`A, G \leftarrow (1-\tilde\beta)\,\cdot + \tilde\beta\,\cdot_{batch}`; every
   ``T_inv`` steps new eigenbases (``torch.linalg.eigh``, eigenvalues clamped at
   ``min_eigenvalue``), :math:`\pi` by the trace norm, and (EK-FAC) :math:`S` re-initialised
   from the K-FAC eigenvalues :math:`\mathrm{diag}(Q_G^TGQ_G)\,\mathrm{diag}(Q_A^TAQ_A)^T`, which is also done
   every ``T_reinit`` steps; every ``T_scale`` steps (EK-FAC)
   :math:`S\leftarrow(1-\tilde\beta')S+\tilde\beta'\,\overline{(Q_G^T\nabla_n Q_A)^{2}}`;
4. :math:`V = -\nabla_W \overline{\ell} - \gamma_{in}W` (``W`` the sample, as in the papers'
   algorithms) and :math:`M \leftarrow M + \alpha\,P^{-1}V` with the damped curvature
   :math:`P = (G+\tfrac{\sqrt\gamma}{\pi}I)\otimes(A+\pi\sqrt\gamma I)` (K-FAC) or
   :math:`(Q_G\otimes Q_A)\mathrm{diag}(S+\gamma)(Q_G\otimes Q_A)^T` (EK-FAC), :math:`\gamma = \gamma_{in}+\gamma_{ex}`
   (one ``kron_eigen_matvec``).  The extrinsic damping :math:`\gamma_{ex}` enters this mean
   step only, never the posterior covariance.

:math:`\tilde\beta = \max(\beta, 1/k)` at the :math:`k`-th update (a plain mean at the start, then an
exponential average).  With ``total_steps`` given, :math:`\alpha, \beta, \beta'` are multiplied by
``lr_decay`` (0.1) for the second half of training, as in the paper.

Parameters outside supported layers (e.g. normalisation layers) are point estimates trained
by plain Adam (``other_optimizer="adam"``, default) or SGD on the same mean loss, without
prior or noise.
"""
from __future__ import annotations

import contextlib
import math
from typing import Dict, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..curvature import (KFACCollector, KroneckerFactor, check_output, check_targets, damped_kfac_eigenvalues, eigen_basis,
                         find_layers, input_patches, output_gradients, output_grads, per_example_second_moments,
                         require_finite, resolve_loss, running_average_weight, trace_norm_pi, weight_matrix)
from ..curvature.layers import layer_shape
from ..distributions import EigenvalueCorrectedMatrixNormal, MatrixNormal
from .._ops import lib
from .._ops.random import random_kwargs

__all__ = ["NoisyKFAC", "NoisyEKFAC", "PRESETS"]

#: Hyper-parameter presets by name, ``"uci"`` (Bae et al. section 6.1: batch 10 or 100,
#: T_stats = 1, re-scaling re-initialised and bases recomputed every 50 steps, decay by 0.1 for
#: the second half) and ``"classification"`` (section 6.2: batch 128, amortised statistics,
#: inverse and re-scaling updates).  Where the stored copy of the paper lost a number, the value
#: is ours (see docs/optim.md).
PRESETS = {
    "uci": dict(lr=0.01, beta=0.001, beta_scale=0.001, T_stats=1, T_inv=50, T_scale=1, T_reinit=50,
                damping=1e-3, prior_var=1.0, kl_weight=1.0, kl_clip=1e-3),
    "classification": dict(lr=0.01, beta=0.01, beta_scale=0.01, T_stats=10, T_inv=100, T_scale=10, T_reinit=100,
                           damping=1e-3, prior_var=1.0, kl_weight=1.0, kl_clip=1e-3),
}


_MIX_START = 0x9E3779B97F4A7C15
_MASK63 = 0x7FFFFFFFFFFFFFFF


def _mix64_state(h: int, *xs: int) -> int:
    """The running 64-bit combination of ``_mix64`` continued over ``xs`` from the state ``h``."""
    for x in xs:
        h = (h ^ (int(x) & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        h = (h + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        h = z ^ (z >> 31)
    return h


def _mix64(*xs: int) -> int:
    """A 63-bit seed from integers (SplitMix64 finaliser over a running combination)."""
    return _mix64_state(_MIX_START, *xs) & _MASK63


def _below_autograd():
    """The optimizer's own sampling and preconditioning need no autograd graph: skip the Python
    autograd layer of the custom ops (it costs about as much as the op on small layers)."""
    guard = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
    return guard() if guard is not None else contextlib.nullcontext()


def _sample_now(loc, q_out, q_in, variance, generator):
    """``kron_eigen_sample(loc, q_out, q_in, variance, generator=generator)`` (one sample, same
    bits, no graph)."""
    rng = random_kwargs("NoisyKFAC.sampled_weights", generator)
    with torch.no_grad(), _below_autograd():
        return lib.kron_eigen_sample(loc, q_out, q_in, variance, 1, **rng)[0][0]


def _matvec_now(q_out, q_in, scale, v, power):
    """``kron_eigen_matvec(q_out, q_in, scale, v, power)`` without a graph."""
    with torch.no_grad(), _below_autograd():
        return lib.kron_eigen_matvec(q_out, q_in, scale, v, float(power))


# the compiled ops, called below the autograd layer (the optimizer needs no graph)
_SAMPLE = lib.kron_eigen_sample.default
_NGD = lib.kron_eigen_ngd.default
_MOMENTS = lib.kron_eigen_moments.default


def _probe_engine():
    """torch's C++ autograd engine, when calling it directly (a private API: the signature of
    ``run_backward`` is torch's own business) gives what ``torch.autograd.grad`` gives on a
    small probe; ``None`` otherwise, and :func:`_grad` then always takes the public wrapper."""
    engine = getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)
    if engine is None:
        return None
    try:
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        y = x * x
        (g,) = engine.run_backward((y,), (torch.ones(2),), False, False, (x,), True, False)
        return engine if torch.equal(g, torch.tensor([2.0, 4.0])) else None
    except Exception:  # a changed private signature: use the public path
        return None


_ENGINE = _probe_engine()


def _grad(out, inputs, grad_out, retain):
    """``torch.autograd.grad(out, inputs, grad_out, retain_graph=retain, allow_unused=True)`` for a
    ``grad_out`` of ``out``'s shape and dtype.  On the CPU the autograd engine is called directly: the
    Python wrapper's argument checks and set-up cost about a tenth of a whole UCI-MLP step (measured
    30-40 us of 300); elsewhere (CUDA backward passes run in device threads, which need the context
    the wrapper stashes for them) through the wrapper."""
    if _ENGINE is not None and out.device.type == "cpu":
        return _ENGINE.run_backward((out,), (grad_out,), retain, False, inputs, True, False)
    return torch.autograd.grad(out, inputs, grad_outputs=grad_out, retain_graph=retain, allow_unused=True)


def _running_gram(old, rows, beta, alpha, world, avg):
    """``beta * old + alpha * R^T R`` for the row blocks ``rows`` stacked into ``R`` (a new tensor); on
    ``world > 1`` ranks ``R^T R`` is averaged over the ranks first (``avg``)."""
    r = rows[0] if len(rows) == 1 else torch.cat(rows)
    if world == 1:
        return torch.addmm(old, r.mT, r, beta=beta, alpha=alpha)
    return (old * beta).add_(avg(r.mT @ r), alpha=alpha)


def _dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _NoisyKroneckerOptimizer(torch.optim.Optimizer):
    _ekfac = False

    def __init__(self, model: torch.nn.Module, num_data: int, likelihood: str = "classification", *,
                 sigma_noise: float = 1.0, preset: Optional[str] = None, lr: Optional[float] = None,
                 kl_weight: Optional[float] = None, prior_var: Optional[float] = None,
                 damping: Optional[float] = None, beta: Optional[float] = None, beta_scale: Optional[float] = None,
                 T_stats: Optional[int] = None, T_inv: Optional[int] = None, T_scale: Optional[int] = None,
                 T_reinit: Optional[int] = None, noise: bool = True, fisher_type: str = "mc",
                 kfac_approx: str = "expand", particles: int = 1, total_steps: Optional[int] = None,
                 lr_decay: float = 0.1, min_eigenvalue: float = 0.0, kl_clip="preset",
                 other_optimizer: str = "adam", other_lr: Optional[float] = None, modules=None,
                 seed: Optional[int] = None):
        if num_data is None:
            raise ValueError("num_data (the global number of training examples N) is required: it sets the "
                             "intrinsic damping lambda/(N eta) and the posterior scale lambda/N")
        if not (isinstance(num_data, int) and num_data >= 1):
            raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
        self.likelihood, sigma_noise, _ = resolve_loss(likelihood, sigma_noise)
        self._sigma_noise = sigma_noise
        if preset is None:
            preset = "uci" if self.likelihood == "regression" else "classification"
        if preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
        hp = dict(PRESETS[preset])
        given = dict(lr=lr, kl_weight=kl_weight, prior_var=prior_var, damping=damping, beta=beta,
                     beta_scale=beta_scale, T_stats=T_stats, T_inv=T_inv, T_scale=T_scale, T_reinit=T_reinit)
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
        for k in ("T_stats", "T_inv", "T_scale", "T_reinit"):
            if not (isinstance(hp[k], int) and hp[k] >= 1):
                raise ValueError(f"{k} must be a positive integer, got {hp[k]!r}")
        if hp["T_inv"] % hp["T_stats"] != 0:
            raise ValueError(f"T_inv ({hp['T_inv']}) must be a multiple of T_stats ({hp['T_stats']})")
        if fisher_type not in ("mc", "empirical", "type-2", "ggn"):
            raise ValueError(f"fisher_type must be one of 'mc', 'empirical', 'type-2', 'ggn', got {fisher_type!r}")
        if kfac_approx not in ("expand", "reduce"):
            raise ValueError(f"kfac_approx must be 'expand' or 'reduce', got {kfac_approx!r}")
        if not (isinstance(particles, int) and particles >= 1):
            raise ValueError(f"particles must be a positive integer, got {particles!r}")
        if other_optimizer not in ("adam", "sgd"):
            raise ValueError(f"other_optimizer must be 'adam' or 'sgd', got {other_optimizer!r}")
        if total_steps is not None and not (isinstance(total_steps, int) and total_steps >= 1):
            raise ValueError(f"total_steps must be a positive integer or None, got {total_steps!r}")
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

        self.model = model
        self.layers: Dict[str, torch.nn.Module] = find_layers(model, modules, allow_other_parameters=True)
        self.hp = hp
        self.num_data = num_data
        self.noise = bool(noise)
        self.fisher_type = fisher_type
        self.kfac_approx = kfac_approx
        self.particles = particles
        self.total_steps = total_steps
        self.lr_decay = float(lr_decay)
        self.min_eigenvalue = float(min_eigenvalue)
        self.kl_clip = kl_clip
        self.gamma_in = hp["kl_weight"] / (num_data * hp["prior_var"])
        self.gamma = self.gamma_in + hp["damping"]

        layer_params = []
        ids = set()
        for mod in self.layers.values():
            for p in (mod.weight, mod.bias):
                if p is not None:
                    layer_params.append(p)
                    ids.add(id(p))
        other = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
        groups = [dict(params=layer_params, lr=hp["lr"], kind="kfac")]
        super().__init__(groups, dict(lr=hp["lr"]))
        self.other_params = other
        if other:
            olr = other_lr if other_lr is not None else (1e-3 if other_optimizer == "adam" else hp["lr"])
            self.other_optimizer = (torch.optim.Adam(other, lr=olr) if other_optimizer == "adam"
                                    else torch.optim.SGD(other, lr=olr))
        else:
            self.other_optimizer = None

        rank, world = _dist_info()
        self._rank, self._world = rank, world
        if seed is None:
            seed = int(torch.randint(0, 2 ** 62, ()).item())
        if world > 1:
            t = torch.tensor([seed], dtype=torch.int64)
            dist.broadcast(t, 0)
            seed = int(t.item())
        self.seed = int(seed)
        self._step = 0
        self._stats_count = 0
        self._scale_count = 0
        for name, mod in self.layers.items():
            out, inn = layer_shape(mod)
            w = mod.weight
            kw = dict(dtype=w.dtype, device=w.device)
            st = self.state[mod.weight]
            st["A"] = torch.eye(inn, **kw)
            st["G"] = torch.eye(out, **kw)
            st["q_a"], st["d_a"] = torch.eye(inn, **kw), torch.ones(inn, **kw)
            st["q_g"], st["d_g"] = torch.eye(out, **kw), torch.ones(out, **kw)
            st["pi"] = torch.ones((), **kw)
            if self._ekfac:
                st["S"] = torch.ones(out, inn, **kw)
        self._hooks = KFACCollector(self.layers, capture_outputs=True)
        self._hooks.record_inputs = False
        # each layer's weight and bias become views into one (out, in+1) matrix [W | b], so that a
        # sample or a mean is written with one copy (move the model to its device/dtype first)
        self._mat = {}
        for name, mod in self.layers.items():
            mat = weight_matrix(mod).clone().contiguous()
            n_w = mod.weight[0].numel()
            with torch.no_grad():
                mod.weight.data = mat[:, :n_w].view(mod.weight.shape)
                if mod.bias is not None:
                    mod.bias.data = mat[:, n_w]
            self._mat[name] = mat
        self._layer_list = list(self.layers.items())
        self._mats = [self._mat[n] for n in self.layers]
        self._mats3 = [m.unsqueeze(0) for m in self._mats]  # (1, out, in) views, as the sampling op returns
        self._label_gens = {}  # device -> the generator of the sampled labels, re-seeded every step
        self._scalars = {}  # 0-dim tensors of constants (_scalar)
        self._eig_cache = {}  # K-FAC eigenvalues and the state tensors they were computed from (_cached)
        self._weights = [m.weight for m in self.layers.values()]
        self._biases = [m.bias for m in self.layers.values() if m.bias is not None]

    @property
    def sigma_noise(self) -> float:
        """The Gaussian likelihood's noise standard deviation (regression).  It may be changed
        between steps (a learned or coordinate-ascent noise precision): the curvature the
        optimizer holds is rescaled at once, since the Fisher of a Gaussian likelihood is
        :math:`\\sigma^{-2}` times that of unit noise (:math:`\\sigma^{-4}` for the empirical Fisher),
        so the posterior never lags behind the noise level by the running averages' memory."""
        return self._sigma_noise

    @sigma_noise.setter
    def sigma_noise(self, value: float) -> None:
        value = float(value)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"sigma_noise must be positive and finite, got {value!r}")
        old = self._sigma_noise
        self._sigma_noise = value
        if self.likelihood != "regression" or value == old or not hasattr(self, "layers"):
            return
        c = (old / value) ** (4 if self.fisher_type == "empirical" else 2)
        for mod in self.layers.values():
            st = self.state[mod.weight]
            st["G"] = st["G"] * c
            st["d_g"] = st["d_g"] * c
            st["pi"] = st["pi"] / math.sqrt(c)
            if self._ekfac:
                st["S"] = st["S"] * c

    # ---- posterior ------------------------------------------------------------------------------------------
    def _layer_state(self, layer):
        if isinstance(layer, str):
            if layer not in self.layers:
                raise KeyError(f"{layer!r} is not one of the optimizer's layers {list(self.layers)}")
            layer = self.layers[layer]
        return layer, self.state[layer.weight]

    def _name_of(self, mod):
        for n, m in self.layers.items():
            if m is mod:
                return n
        raise KeyError("not one of the optimizer's layers")

    def _posterior_variance(self, st) -> torch.Tensor:
        """Eigenvalues of Cov(vec W) in the Kronecker eigenbasis."""
        c = self.hp["kl_weight"] / self.num_data
        if self._ekfac:
            s = st["S"]
            return torch.div(self._scalar(c, s), s + self.gamma_in)  # (a tensor numerator: one op)
        key = ("variance", id(st["d_g"]), c, self.gamma_in)
        hit = self._cached(key, st)
        if hit is None:
            hit = self._store(key, st, c / damped_kfac_eigenvalues(st["d_g"], st["d_a"], self.gamma_in, st["pi"]))
        return hit

    def _kfac_eigenvalues(self, st, damping) -> torch.Tensor:
        """The damped K-FAC eigenvalues ``damped_kfac_eigenvalues(d_g, d_a, damping, pi)`` of a layer."""
        key = ("damped", id(st["d_g"]), damping)
        hit = self._cached(key, st)
        if hit is None:
            hit = self._store(key, st, damped_kfac_eigenvalues(st["d_g"], st["d_a"], damping, st["pi"]))
        return hit

    # K-FAC's eigenvalues change only with the bases, the damping and pi (every T_inv steps, or when
    # sigma_noise or the state is set), and each of those puts new tensors in the state: a value is reused
    # while the very tensors it was computed from are still the state's.
    def _cached(self, key, st):
        hit = self._eig_cache.get(key)
        if hit is not None and hit[0] is st["d_g"] and hit[1] is st["d_a"] and hit[2] is st["pi"]:
            return hit[3]
        return None

    def _store(self, key, st, value):
        if len(self._eig_cache) > 4 * len(self.layers):
            self._eig_cache.clear()
        self._eig_cache[key] = (st["d_g"], st["d_a"], st["pi"], value)
        return value

    def _scalar(self, value: float, like: torch.Tensor) -> torch.Tensor:
        """``value`` as a 0-dim tensor of ``like``'s dtype and device (kept)."""
        key = (value, like.dtype, like.device)
        t = self._scalars.get(key)
        if t is None:
            if len(self._scalars) > 8:
                self._scalars.clear()
            t = self._scalars[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
        return t

    def _label_generator(self, device) -> torch.Generator:
        gen = self._label_gens.get(device)
        if gen is None:
            gen = self._label_gens[device] = torch.Generator(device=device)
        return gen

    def posterior(self, layer):
        """The posterior of one layer's ``(out, in+1)`` weight matrix ``[W | b]``:
        :class:`~vmfdist.distributions.matrix_normal.MatrixNormal` (noisy K-FAC) or
        :class:`~vmfdist.distributions.matrix_normal.EigenvalueCorrectedMatrixNormal` (noisy EK-FAC).
        ``layer`` is the module or its name."""
        mod, st = self._layer_state(layer)
        mean = self._mat[self._name_of(mod)].clone()
        if self._ekfac:
            return EigenvalueCorrectedMatrixNormal(mean, st["q_g"], st["q_a"], self._posterior_variance(st))
        c = self.hp["kl_weight"] / self.num_data
        r = math.sqrt(self.gamma_in)
        pi = st["pi"]
        row = c * (st["q_g"] / (st["d_g"] + r / pi)) @ st["q_g"].T
        col = (st["q_a"] / (st["d_a"] + r * pi)) @ st["q_a"].T
        return MatrixNormal(mean, 0.5 * (row + row.T), 0.5 * (col + col.T))

    def kronecker_factors(self) -> Dict[str, KroneckerFactor]:
        """Each layer's current curvature as a :class:`~vmfdist.curvature.KroneckerFactor` (the running
        averages ``A``, ``G`` per data point at this optimizer's ``sigma_noise``, their eigenbases as of
        the last basis update, and for noisy EK-FAC the second ``moments`` in that basis), by layer
        name.  The tensors are the optimizer's own (replaced, never modified in place, by later steps)."""
        out = {}
        for name, mod in self.layers.items():
            st = self.state[mod.weight]
            out[name] = KroneckerFactor(st["A"], st["G"], st["d_a"], st["q_a"], st["d_g"], st["q_g"], st.get("S"))
        return out

    def _sample_layer(self, st, mean, generator):
        return _sample_now(mean, st["q_g"], st["q_a"], self._posterior_variance(st), generator)

    @contextlib.contextmanager
    def sampled_weights(self, generator: Optional[torch.Generator] = None):
        """Context manager: the layers hold one posterior sample inside, their means again after."""
        means = {n: self._mat[n].clone() for n in self.layers}
        try:
            with torch.no_grad():
                for n, m in self.layers.items():
                    self._mat[n].copy_(self._sample_layer(self.state[m.weight], means[n], generator))
            yield
        finally:
            with torch.no_grad():
                for n in self.layers:
                    self._mat[n].copy_(means[n])

    @torch.no_grad()
    def predictive(self, inputs: torch.Tensor, n_samples: int = 10, generator: Optional[torch.Generator] = None):
        """Posterior predictive with ``n_samples`` weight samples: class probabilities
        (mean of the softmax) for classification; ``(mean, variance)`` of the network output
        for regression (add ``sigma_noise**2`` for the variance of a new observation)."""
        if not (isinstance(n_samples, int) and n_samples >= 1):
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        outs = []
        for _ in range(n_samples):
            with self.sampled_weights(generator):
                f = self.model(inputs)
            outs.append(f.softmax(-1) if self.likelihood == "classification" else f)
        stack = torch.stack(outs)
        if self.likelihood == "classification":
            return stack.mean(0)
        return stack.mean(0), stack.var(0, unbiased=False)

    # ---- the step -------------------------------------------------------------------------------------------
    def _nll_sum(self, out, target):
        if self.likelihood == "classification":
            return nn.functional.cross_entropy(out, target, reduction="sum")
        if target.dim() == 1 and out.dim() == 2 and out.shape[1] == 1:
            target = target.unsqueeze(1)
        if target.shape != out.shape:
            raise ValueError(f"regression targets must have the output's shape {tuple(out.shape)}, got "
                             f"{tuple(target.shape)}")
        return 0.5 * (out - target).pow(2).sum() / self.sigma_noise ** 2

    def _rates(self):
        f = 1.0
        if self.total_steps is not None and self._step >= self.total_steps / 2:
            f = self.lr_decay
        return self.hp["lr"] * f, self.hp["beta"] * f, self.hp["beta_scale"] * f

    def _real_output_grad(self, out, target):
        """d(sum of per-example nll)/d(output), per example."""
        f = out.detach()
        if self.likelihood == "classification":
            return f.softmax(-1) - nn.functional.one_hot(target.long(), f.shape[1]).to(f.dtype)
        return (f - target) / self.sigma_noise ** 2

    def _output_grads(self, out, grad_out, retain):
        """Gradients of ``out`` (weighted by ``grad_out``) with respect to every layer's output,
        appended to the hooks' ``grads``."""
        hooks = self._hooks
        outputs = hooks.outputs
        if len(outputs) != len(self.layers):
            missing = [n for n in self.layers if n not in outputs]
            raise RuntimeError(f"layer {missing[0]!r} was not called in the forward pass")
        gs = _grad(out, tuple(outputs[n] for n in self.layers), grad_out, retain)
        for (n, g), grads in zip(zip(self.layers, gs), hooks.grads.values()):
            if g is None:
                raise RuntimeError(f"the output of layer {n!r} does not reach the model output")
            grads.append(g)

    def _name_non_finite_input(self):
        for n in self.layers:
            x = self._hooks.inputs.get(n)
            if x is not None and not bool(torch.isfinite(x).all()):
                raise FloatingPointError(f"non-finite input to layer {n!r} (check the data and the learning rate)")

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step on a batch: returns the mean negative log-likelihood at the sampled weights
        (the data term of the negative ELBO per example, detached).  Under torch.distributed,
        ``inputs`` is this rank's share of the global batch (equal sizes on all ranks)."""
        k = self._step
        hp = self.hp
        rank, world = self._rank, self._world
        lr, beta, beta_scale = self._rates()
        do_stats = k % hp["T_stats"] == 0
        # bases every T_inv steps, and (warm-up, ours) at the 1st, 2nd, 4th, 8th, ... statistics update
        # while that is sooner: the first factors come from a few batches and are far from full rank
        n_next = self._stats_count + 1
        do_inv = k % hp["T_inv"] == 0 or (do_stats and n_next * hp["T_stats"] < hp["T_inv"]
                                           and n_next & (n_next - 1) == 0)
        do_scale = self._ekfac and k % hp["T_scale"] == 0
        do_reinit = self._ekfac and (do_inv or k % hp["T_reinit"] == 0)
        need_acts = do_stats or do_scale
        B = inputs.shape[0]
        P = self.particles
        if B % P != 0:
            raise ValueError(f"the batch size {B} must be divisible by particles={P}")
        chunk = B // P
        layers = self._layer_list
        nl = len(layers)
        mats, mats3 = self._mats, self._mats3
        states = [self.state[m.weight] for _, m in layers]
        means = [t.clone() for t in mats]
        w_sum, grads = [None] * nl, [None] * nl
        # this step's curvature statistics of each layer: row matrices R whose Gram matrices R^T R sum
        # to the batch factors (A: times a_scale), and (patches, [output gradients]) for the re-scaling
        # where an example has several locations or the moments are averaged over ranks
        a_rows, g_rows, saved = [[] for _ in layers], [[] for _ in layers], [[] for _ in layers]
        grad_rows = [[] for _ in layers]  # stacked batch: (output-gradient rows, input rows) of the loss gradient
        a_scale = [1.0] * nl
        for p in self.other_params:
            p.grad = None
        # one backward for the loss and the sampled-label statistics (the batch is stacked with
        # itself; the weight gradients come from the hooks) unless other parameters need .grad
        stacked = need_acts and not self.other_params and self.fisher_type in ("mc", "empirical")
        total_nll = None
        hooks = self._hooks
        try:
            for j in range(P):
                # the random streams of this share of the global batch: _mix64(seed, step, share) for the
                # sampled labels, _mix64(seed, step, share, layer, 1) for the weight noise (Philox)
                h = _mix64_state(_MIX_START, self.seed, k, rank * P + j)
                gen = None
                if need_acts and self.fisher_type == "mc":
                    gen = self._label_generator(inputs.device)
                    gen.manual_seed(h & _MASK63)
                xs, ys = (inputs, targets) if P == 1 else (inputs[j * chunk:(j + 1) * chunk],
                                                           targets[j * chunk:(j + 1) * chunk])
                if self.noise:
                    with torch.no_grad(), _below_autograd():
                        for i, st in enumerate(states):
                            w = _SAMPLE(means[i], st["q_g"], st["q_a"], self._posterior_variance(st), 1,
                                        seed=_mix64_state(h, i, 1) & _MASK63, offset=0)[0]  # (1, out, in)
                            mats3[i].copy_(w)
                            if P > 1:
                                w_sum[i] = w[0] if w_sum[i] is None else w_sum[i] + w[0]
                hooks.clear()
                hooks.record_inputs = need_acts
                hooks.record_grads = need_acts
                if stacked:
                    out2 = check_output(self.model(torch.cat([xs, xs])))
                    out = out2[:chunk]
                    ys = check_targets(out, ys, self.likelihood)
                    f = out.detach()
                    if self.likelihood == "regression" and self.fisher_type == "mc":
                        # the output gradients of both halves in one buffer: (f - y)/(sigma^2 B) for the
                        # loss, -eps/sigma for a label drawn from the predictive (as output_gradients)
                        sig2 = self.sigma_noise ** 2
                        diff = f - ys
                        nll = torch.dot(diff.view(-1), diff.view(-1)) * (0.5 / sig2)
                        eps = torch.randn(f.shape, generator=gen, dtype=f.dtype, device=f.device)
                        go = torch.cat([diff.mul_(1.0 / (sig2 * B)), eps.mul_(-1.0 / self.sigma_noise)])
                        self._output_grads(out2, go, False)
                    else:
                        if self.likelihood == "regression":
                            diff = f - ys
                            e_loss = diff * (1.0 / (self.sigma_noise ** 2 * B))
                            nll = (diff * diff).sum() * (0.5 / self.sigma_noise ** 2)
                        else:
                            logp = f.log_softmax(-1)
                            onehot = nn.functional.one_hot(ys.long(), f.shape[1]).to(f.dtype)
                            e_loss = (logp.exp() - onehot) / B
                            nll = -(logp * onehot).sum()
                        try:
                            e_stat = output_gradients(out2[chunk:], ys, self.likelihood, self.fisher_type,
                                                      self.sigma_noise, 1, gen)[0]
                        except FloatingPointError:
                            self._name_non_finite_input()
                            raise
                        self._output_grads(out2, torch.cat([e_loss, e_stat.to(out.dtype)]), False)
                else:
                    out = check_output(self.model(xs))
                    ys = check_targets(out, ys, self.likelihood)
                    if need_acts:
                        try:
                            es = output_gradients(out, ys, self.likelihood, self.fisher_type, self.sigma_noise, 1,
                                                  gen)
                        except FloatingPointError:
                            self._name_non_finite_input()
                            raise
                        for e in es:
                            self._output_grads(out, e.to(out.dtype), True)
                    hooks.record_grads = False
                    hooks.record_inputs = False
                    nll = self._nll_sum(out, ys)
                    self._parameter_gradients(nll / B, means, grads)
                nll = nll.detach()
                total_nll = nll if total_nll is None else total_nll + nll
                if need_acts:
                    for i, (n, m) in enumerate(layers):
                        x_in, g_out = hooks.inputs[n], hooks.grads[n]
                        if stacked:
                            a = input_patches(m, x_in[:chunk])
                            g_both = output_grads(m, g_out[0])
                            gl = [g_both[chunk:]]
                            # the loss gradient as rows: sum over examples and locations of g a^T
                            rows = chunk * a.shape[1]
                            grad_rows[i].append((g_both.flatten(0, 1)[:rows], a.flatten(0, 1)))
                        else:
                            a = input_patches(m, x_in)
                            gl = [output_grads(m, g) for g in g_out]
                        locs = a.shape[1]
                        if locs == 1 or self.kfac_approx == "expand":  # sum_n (1/T) sum_t a a^T, sum_n sum_t g g^T
                            a_scale[i] = 1.0 / locs
                            a_rows[i].append(a.flatten(0, 1))
                            g_rows[i].extend(g.flatten(0, 1) for g in gl)
                        else:  # sum_n mean_t(a) mean_t(a)^T, sum_n sum_t(g) sum_t(g)^T
                            a_rows[i].append(a.mean(1))
                            g_rows[i].extend(g.sum(1) for g in gl)
                        if do_scale and (locs > 1 or world > 1):
                            saved[i].append((a, gl))
                hooks.clear()
        finally:
            hooks.record_inputs = False
            hooks.record_grads = False
            hooks.clear()

        # ---- average across ranks ------------------------------------------------------------------------------
        def avg(t):
            dist.all_reduce(t)
            t /= world
            return t

        g_out_rows, g_in_rows = [None] * nl, [None] * nl
        for i, pairs in enumerate(grad_rows):
            if pairs:
                go_, gi_ = (torch.cat(t) for t in zip(*pairs)) if len(pairs) > 1 else pairs[0]
                if world > 1:
                    grads[i] = go_.mT @ gi_
                else:  # the preconditioning op forms the gradient itself
                    g_out_rows[i], g_in_rows[i] = go_, gi_
        if world > 1:
            for g in grads:
                avg(g)
            for p in self.other_params:
                if p.grad is not None:
                    avg(p.grad)
        w_bar = []
        for i in range(nl):
            # the sampled weights (with one share, the layer still holds its sample), their mean over shares
            w = means[i] if not self.noise else (mats[i] if P == 1 else w_sum[i] / P)
            w_bar.append(avg(w.clone()) if world > 1 and self.noise else w)
        loss = total_nll / B
        if world > 1:
            avg(loss)

        with torch.no_grad(), _below_autograd():
            # ---- statistics, bases, re-scaling (new tensors, not in-place: a state_dict() taken earlier
            # must not change) -------------------------------------------------------------------------------
            if do_stats:
                self._stats_count += 1
                wgt = running_average_weight(beta, self._stats_count)
                for i, st in enumerate(states):
                    st["A"] = _running_gram(st["A"], a_rows[i], 1 - wgt, wgt * a_scale[i] / B, world, avg)
                    st["G"] = _running_gram(st["G"], g_rows[i], 1 - wgt, wgt / B, world, avg)
            if do_inv:
                for i, st in enumerate(states):
                    n = layers[i][0]
                    if rank == 0:
                        require_finite(n, "input factor A", st["A"])
                        require_finite(n, "gradient factor G", st["G"])
                        st["d_a"], st["q_a"] = eigen_basis(st["A"], self.min_eigenvalue)
                        st["d_g"], st["q_g"] = eigen_basis(st["G"], self.min_eigenvalue)
                        st["pi"] = trace_norm_pi(st["A"], st["G"])
                    if world > 1:
                        for key in ("d_a", "q_a", "d_g", "q_g", "pi"):
                            # a fresh contiguous tensor: broadcast sends the storage as it lies
                            st[key] = st[key].contiguous() if rank == 0 else torch.empty_like(
                                st[key], memory_format=torch.contiguous_format)
                            dist.broadcast(st[key], 0)
            if do_reinit:
                for st in states:
                    da = ((st["A"] @ st["q_a"]) * st["q_a"]).sum(0)  # diag(Q_A^T A Q_A)
                    dg = ((st["G"] @ st["q_g"]) * st["q_g"]).sum(0)
                    st["S"] = dg.clamp_min(self.min_eigenvalue).unsqueeze(1) * da.clamp_min(self.min_eigenvalue)
            if do_scale:
                self._scale_count += 1
                wgt = running_average_weight(beta_scale, self._scale_count)
                for i, st in enumerate(states):
                    if not saved[i]:
                        # one location per example, one process: the rows of the factors, each label draw's
                        # output-gradient rows beside its examples' input rows, and the running average in one op
                        draws = len(g_rows[i]) // len(a_rows[i])
                        xr = a_rows[i] if draws == 1 else [r for r in a_rows[i] for _ in range(draws)]
                        x = xr[0] if len(xr) == 1 else torch.cat(xr)
                        e = g_rows[i][0] if len(g_rows[i]) == 1 else torch.cat(g_rows[i])
                        st["S"] = _MOMENTS(st["q_g"], st["q_a"], x, e, st["S"], 1 - wgt, wgt / B)
                        continue
                    s = None
                    for a, gs in saved[i]:
                        for g in gs:
                            v = per_example_second_moments(a, g, st["q_a"], st["q_g"])
                            s = v if s is None else s + v
                    if world > 1:
                        avg(s)
                    st["S"] = (st["S"] * (1 - wgt)).add_(s, alpha=wgt / B)

            # ---- the mean step ------------------------------------------------------------------------------------
            # P^{-1} V with V = -(grad + gamma_in W): precondition u = grad + gamma_in W and step by -lr
            deltas = []
            check = None
            for i, st in enumerate(states):
                if self._ekfac:
                    scale, damping = st["S"], self.gamma
                else:
                    scale, damping = self._kfac_eigenvalues(st, self.gamma), 0.0
                d, du = _NGD(st["q_g"], st["q_a"], scale, damping, w_bar[i], self.gamma_in, grads[i], g_out_rows[i],
                             g_in_rows[i])
                deltas.append(d)
                check = du if check is None else check + du
        vg = float(check)
        if not math.isfinite(vg):
            for (n, _), d in zip(layers, deltas):
                require_finite(n, "natural-gradient step", d)
            raise FloatingPointError(f"non-finite natural-gradient step (loss {float(loss)})")
        nu = 1.0
        if self.kl_clip is not None and vg > 0:
            nu = min(1.0, math.sqrt(self.kl_clip / (lr * lr * vg)))
        with torch.no_grad():
            for mean, d, mat in zip(means, deltas, mats):
                torch.add(mean, d, alpha=-lr * nu, out=mat)
        if self.other_optimizer is not None:
            self.other_optimizer.step()
        self.param_groups[0]["lr"] = lr
        self._step += 1
        return loss

    def _parameter_gradients(self, loss, means, grads):
        """Adds d loss / d [W | b] of every layer to ``grads`` (a list in layer order) and
        accumulates the other parameters' ``.grad``."""
        weights, biases, other = self._weights, self._biases, self.other_params
        gr = torch.autograd.grad(loss, weights + biases + other, allow_unused=True)
        for p, g in zip(other, gr[len(weights) + len(biases):]):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        gw, gb = gr[:len(weights)], gr[len(weights):len(weights) + len(biases)]
        bi = 0
        for i, (n, m) in enumerate(self._layer_list):
            g = gw[i].reshape(gw[i].shape[0], -1) if gw[i] is not None else torch.zeros_like(
                means[i][:, :m.weight[0].numel()])
            if m.bias is not None:
                b = gb[bi] if gb[bi] is not None else torch.zeros_like(means[i][:, -1])
                g = torch.cat([g, b.unsqueeze(1)], 1)
                bi += 1
            grads[i] = g if grads[i] is None else grads[i] + g

    # ---- state ----------------------------------------------------------------------------------------------------
    def state_dict(self):
        sd = super().state_dict()
        sd["noisy"] = dict(step=self._step, stats_count=self._stats_count, scale_count=self._scale_count,
                           seed=self.seed, hp=dict(self.hp), num_data=self.num_data,
                           sigma_noise=self._sigma_noise,
                           other=None if self.other_optimizer is None else self.other_optimizer.state_dict())
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        extra = state_dict.pop("noisy")
        if extra["num_data"] != self.num_data:
            raise ValueError(f"state_dict was saved with num_data={extra['num_data']}, this optimizer has "
                             f"num_data={self.num_data}")
        super().load_state_dict(state_dict)
        self._step, self._stats_count, self._scale_count = extra["step"], extra["stats_count"], extra["scale_count"]
        self.seed = extra["seed"]
        # the loaded curvature refers to the saved noise level (older state dicts: this one's)
        self._sigma_noise = float(extra.get("sigma_noise", self._sigma_noise))
        self.hp = dict(extra["hp"])
        self.gamma_in = self.hp["kl_weight"] / (self.num_data * self.hp["prior_var"])
        self.gamma = self.gamma_in + self.hp["damping"]
        if self.other_optimizer is not None and extra["other"] is not None:
            self.other_optimizer.load_state_dict(extra["other"])

    @property
    def steps_taken(self) -> int:
        return self._step


# torch.optim.Optimizer wraps ``step`` of each subclass in a profiling hook unless it is marked as
# hooked; the per-call record_function costs more than a whole small step here.
_NoisyKroneckerOptimizer.step.hooked = True


class NoisyKFAC(_NoisyKroneckerOptimizer):
    """Noisy K-FAC (Zhang et al. 2018): a matrix-normal posterior per layer, fitted by
    natural-gradient VI.  See the module docstring for the algorithm and
    ``docs/optim.md``; hyper-parameters default to ``PRESETS["uci"]`` for regression and
    ``PRESETS["classification"]`` for classification.

    Args:
        model: an ordinary module (not a DDP wrapper) whose output is ``(batch, outputs)``.
        num_data: :math:`N`, the number of training examples (over all ranks).
        likelihood: ``"classification"`` or ``"regression"`` (Gaussian, ``sigma_noise``).
        lr, kl_weight, prior_var, damping, beta, T_stats, T_inv: :math:`\\alpha`, :math:`\\lambda`,
            :math:`\\eta`, :math:`\\gamma_{ex}`, :math:`\\beta` and the amortisation intervals.
        noise: ``False``: no weight noise (plain K-FAC with the prior as weight decay).
        fisher_type, kfac_approx: as in :func:`vmfdist.curvature.compute_kfac` (``"mc"``).
        particles: independent weight samples per step, each for a contiguous equal share of
            the batch (under torch.distributed, rank ``r``'s share ``j`` is share
            ``r * particles + j`` of the global batch).
        total_steps, lr_decay: learning-rate decay by ``lr_decay`` for the second half.
        kl_clip: optional K-FAC trust region on :math:`\\alpha^2 \\Delta^T\\nabla`.
        other_optimizer, other_lr: ``"adam"`` (lr 1e-3) or ``"sgd"`` (lr ``lr``) for the other
            parameters.
        seed: the weight-noise and label stream (default: drawn from torch's global generator).

    Use ``loss = opt.step(x, y)`` per batch (it samples, runs forward and backward itself).
    """
    _ekfac = False


class NoisyEKFAC(_NoisyKroneckerOptimizer):
    """Noisy EK-FAC (Bae et al. 2018): an eigenvalue-corrected matrix-normal posterior per layer.
    Arguments as :class:`NoisyKFAC`, plus ``beta_scale`` (:math:`\\beta'`), ``T_scale`` (re-scaling
    update interval) and ``T_reinit`` (re-initialise :math:`S` from the K-FAC eigenvalues)."""
    _ekfac = True
