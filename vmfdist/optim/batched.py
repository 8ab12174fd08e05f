r"""Noisy K-FAC / EK-FAC for many independent copies of one multilayer perceptron at once.

:class:`BatchedNoisyKFAC` and :class:`BatchedNoisyEKFAC` train ``E`` models of one architecture --
the splits of a data set, an ensemble of posteriors, a sweep over seeds -- as one batched model: the
means of every layer are stacked into ``(E, out, in+1)`` tensors, the Kronecker factors into
``(E, in+1, in+1)`` / ``(E, out, out)``, and each step runs one batched forward and backward pass
(``bmm`` over members and weight samples), one batched ``eigh`` per factor, and one call of the
compiled ``kron_eigen_noise_keyed`` op for the weight noise of all members and samples.  On small
networks (the UCI regression MLPs) a step of ``E`` members costs little more than a step of one:
the unbatched optimizer's time is the per-op overhead of a few hundred small ops, paid once here.

Member ``e`` follows exactly the algorithm of :class:`~vmfdist.optim.noisy.NoisyKFAC` /
:class:`~vmfdist.optim.noisy.NoisyEKFAC` with ``seed=seeds[e]`` (the same random streams: the same weight
noise and sampled labels), so it equals an unbatched optimizer on that member's batches to rounding
(``tests/test_optim_batched.py``).  The models must be ``nn.Sequential`` stacks of ``nn.Linear``
layers and elementwise activations (``ReLU``, ``Tanh``, ``Sigmoid``, ``GELU``, ``SiLU``, ``ELU``,
``LeakyReLU``, ``Softplus``, ``Identity``); ``fisher_type="mc"`` (the true Fisher) on one process.

Beyond the unbatched optimizer, ``step(..., precision=tau)`` takes a noise precision per member and
weight sample (regression): each sample's likelihood is :math:`\mathcal N(y \mid f(x; W_p), 1/\tau_p)`,
in the loss gradient and in the sampled-label statistics alike -- the authors' regression code draws
one :math:`\tau_p` per weight sample from the Gamma posterior over the noise precision
(``vmfdist.experiments.uci_paper``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from ..curvature import (damped_kfac_eigenvalues, eigen_basis, require_finite, resolve_loss,
                         trace_norm_pi, weight_matrix)
from ..linalg import kron_eigen_noise_keyed_op as NOISE_KEYED
from ._step import (MASK63, MIX_START, StateCache, average_weight, initial_factor, kfac_rescaling, moving_average,
                    plan_step)
from .settings import check_step_options, resolve_hyperparameters

__all__ = ["BatchedNoisyKFAC", "BatchedNoisyEKFAC"]

_ACTIVATIONS = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.ELU, nn.LeakyReLU, nn.Softplus, nn.Identity)
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def mix64_array(h, *xs):
    """``_step.mix64_state`` elementwise over a ``uint64`` array of states (the same values)."""
    with np.errstate(over="ignore"):
        for x in xs:
            h = h ^ (np.asarray(x, dtype=np.uint64) & _M64)
            h = h + np.uint64(0x9E3779B97F4A7C15)
            z = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = z ^ (z >> np.uint64(31))
    return h


def _structure(models) -> list:
    """The layers of the stacked model: ``("linear", out, in, has_bias)`` or ``("act", module)``."""
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or len(models) == 0:
        raise TypeError("models must be a non-empty list of nn.Sequential models of one architecture")
    plan = []
    for k, mod in enumerate(models[0]) if isinstance(models[0], nn.Sequential) else []:
        if isinstance(mod, nn.Linear):
            plan.append(("linear", mod.out_features, mod.in_features, mod.bias is not None))
        elif isinstance(mod, _ACTIVATIONS):
            plan.append(("act", mod))
        else:
            raise ValueError(f"models: layer {k} is a {type(mod).__name__}; the batched optimizers take nn.Sequential "
                             f"stacks of nn.Linear and elementwise activations ({', '.join(a.__name__ for a in _ACTIVATIONS)})")
    if not any(p[0] == "linear" for p in plan):
        raise ValueError("models must be nn.Sequential stacks with at least one nn.Linear layer")
    ref = models[0]
    for e, m in enumerate(models):
        if not isinstance(m, nn.Sequential) or len(m) != len(ref) or any(
                type(a) is not type(b) or (isinstance(a, nn.Linear) and (
                    a.weight.shape != b.weight.shape or (a.bias is None) != (b.bias is None)
                    or a.weight.dtype != ref[0].weight.dtype or a.weight.device != ref[0].weight.device))
                for a, b in zip(m, ref)):
            raise ValueError(f"models[{e}] does not have the architecture, dtype and device of models[0]")
    dt = next(p for p in ref if isinstance(p, nn.Linear)).weight.dtype
    if dt not in (torch.float32, torch.float64):
        raise ValueError(f"models: dtype {dt}; the batched optimizers train float32 or float64 models")
    return plan


class _BatchedNoisyKronecker:
    _ekfac = False

    def __init__(self, models: Sequence, num_data: int, likelihood: str = "regression", *,
                 sigma_noise: float = 1.0, preset: Optional[str] = None, lr: Optional[float] = None,
                 kl_weight: Optional[float] = None, prior_var: Optional[float] = None,
                 damping: Optional[float] = None, beta: Optional[float] = None, beta_scale: Optional[float] = None,
                 T_stats: Optional[int] = None, T_inv: Optional[int] = None, T_scale: Optional[int] = None,
                 T_reinit: Optional[int] = None, particles: int = 1, total_steps: Optional[int] = None,
                 lr_decay: float = 0.1, min_eigenvalue: float = 0.0, kl_clip="preset",
                 seeds: Optional[Sequence[int]] = None, momentum: Optional[float] = None,
                 reinit_damped: Optional[bool] = None, noise: bool = True, ema_from_init: Optional[bool] = None):
        if not (isinstance(num_data, int) and not isinstance(num_data, bool) and num_data >= 1):
            raise ValueError(f"num_data must be a positive integer (the training-set size of every member), got "
                             f"{num_data!r}")
        likelihood, sigma_noise, _ = resolve_loss(likelihood, sigma_noise)  # (the unbatched optimizer's checks)
        hp, kl_clip = resolve_hyperparameters(likelihood, preset, kl_clip, lr=lr, kl_weight=kl_weight,
                                              prior_var=prior_var, damping=damping, beta=beta, beta_scale=beta_scale,
                                              T_stats=T_stats, T_inv=T_inv, T_scale=T_scale, T_reinit=T_reinit,
                                              momentum=momentum, reinit_damped=reinit_damped,
                                              ema_from_init=ema_from_init)
        check_step_options("mc", "expand", particles, "adam", total_steps)
        if not (isinstance(lr_decay, (int, float)) and 0 < lr_decay <= 1):
            raise ValueError(f"lr_decay must be in (0, 1], got {lr_decay!r}")
        self._plan_layers = _structure(models)
        self.models = list(models)
        self.copies = E = len(self.models)
        self.likelihood, self.sigma_noise, self.hp, self.kl_clip = likelihood, sigma_noise, hp, kl_clip
        self.num_data, self.particles, self.total_steps = num_data, particles, total_steps
        self.lr_decay, self.min_eigenvalue, self.noise = float(lr_decay), float(min_eigenvalue), bool(noise)
        self.lr = hp["lr"]
        self.gamma_in = hp["kl_weight"] / (num_data * hp["prior_var"])
        self.gamma = self.gamma_in + hp["damping"]
        if seeds is None:
            seeds = [int(torch.randint(0, 2 ** 62, ()).item()) for _ in range(E)]
        seeds = [int(s) for s in seeds]
        if len(seeds) != E or any(not (0 <= s < 2 ** 63) for s in seeds):
            raise ValueError(f"seeds must be {E} integers in [0, 2^63) (one per model), got {seeds!r}")
        self.seeds = seeds
        self._seed_arr = np.array(seeds, dtype=np.uint64)
        linears = [[m for m in model if isinstance(m, nn.Linear)] for model in self.models]
        w0 = linears[0][0].weight
        kw = dict(dtype=w0.dtype, device=w0.device)
        # per layer: the stacked means (E, out, in + has_bias) and the state (A, G, bases, pi (E, 1), S, m)
        self.means: List[torch.Tensor] = [torch.stack([weight_matrix(ls[i]) for ls in linears]).contiguous()
                                          for i in range(len(linears[0]))]
        self.state: List[dict] = []
        for i, mean in enumerate(self.means):
            out, inn = mean.shape[1:]
            ema = hp["ema_from_init"]
            st = dict(A=torch.stack([initial_factor(inn, s, i, 7, w0, ema) for s in seeds]),
                      G=torch.stack([initial_factor(out, s, i, 8, w0, ema) for s in seeds]),
                      q_a=torch.eye(inn, **kw).expand(E, inn, inn).clone(), d_a=torch.ones(E, inn, **kw),
                      q_g=torch.eye(out, **kw).expand(E, out, out).clone(), d_g=torch.ones(E, out, **kw),
                      pi=torch.ones(E, 1, **kw))
            if self._ekfac:
                st["S"] = torch.ones(E, out, inn, **kw)
            self.state.append(st)
        self._step = 0
        self._stats_count = 0
        self._scale_count = 0
        self._gen = torch.Generator(device=w0.device)
        self._cache = StateCache(4 * len(self.means))

    # ---- posterior ---------------------------------------------------------------------------------------
    def _kfac_eigs(self, i: int, st: Optional[dict] = None):
        """(variance, damped curvature eigenvalues) of K-FAC layer i (state ``st``, default its current one),
        kept (``StateCache``, as the unbatched optimizer) while its bases and pi are the same tensors."""
        st = self.state[i] if st is None else st
        c = self.hp["kl_weight"] / self.num_data
        var = self._cache.eigenvalues(("variance", i), st, lambda: c / damped_kfac_eigenvalues(
            st["d_g"], st["d_a"], self.gamma_in, st["pi"]))
        return var, self._cache.eigenvalues(("damped", i), st, lambda: damped_kfac_eigenvalues(
            st["d_g"], st["d_a"], self.gamma, st["pi"]))

    def posterior_variance(self, i: int) -> torch.Tensor:
        """Layer ``i``'s posterior variances in its Kronecker eigenbasis, ``(E, out, in)``:
        Cov(vec W_e) = (Q_G ⊗ Q_A) diag(variance_e) (Q_G ⊗ Q_A)^T."""
        if self._ekfac:
            st = self.state[i]
            return (self.hp["kl_weight"] / self.num_data) / (st["S"] + self.gamma_in)
        return self._kfac_eigs(i)[0]

    def sample_weights(self, n: int = 1, generator=None) -> List[torch.Tensor]:
        """``n`` posterior samples of every layer, ``(E, n, out, in)`` per layer; the noise from ``generator``,
        or member e's from ``generator[e]`` when it is a list of E generators (then a member's samples do not
        depend on the others)."""
        if isinstance(generator, (list, tuple)) and len(generator) != self.copies:
            raise ValueError(f"generator: a list of generators needs one per member ({self.copies}), got "
                             f"{len(generator)}")
        ws = []
        for i, (mean, st) in enumerate(zip(self.means, self.state)):
            shape = (n,) + tuple(mean.shape[1:])
            if isinstance(generator, (list, tuple)):
                z = torch.stack([torch.randn(shape, generator=g, dtype=mean.dtype, device=mean.device)
                                 for g in generator])
            else:
                z = torch.randn((self.copies,) + shape, generator=generator, dtype=mean.dtype, device=mean.device)
            z = z * self.posterior_variance(i).sqrt().unsqueeze(1)
            ws.append(mean.unsqueeze(1) + st["q_g"].unsqueeze(1) @ z @ st["q_a"].mT.unsqueeze(1))
        return ws

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor, weights: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """The members' outputs ``(E, n, N, outputs)`` for ``inputs`` ``(E, N, d)`` (or ``(N, d)``, shared) at
        ``weights`` (``sample_weights``'s layout; default the means, ``n = 1``)."""
        ws = [m.unsqueeze(1) for m in self.means] if weights is None else weights
        n = ws[0].shape[1]
        x = inputs.expand(self.copies, *inputs.shape) if inputs.dim() == 2 else inputs
        if x.dim() != 3 or x.shape[0] != self.copies:
            raise ValueError(f"inputs must have shape ({self.copies}, N, d) or (N, d), got {tuple(inputs.shape)}")
        h = x.unsqueeze(1).expand(-1, n, -1, -1).reshape(self.copies * n, x.shape[1], x.shape[2])
        ws = [w.reshape(self.copies * n, *w.shape[2:]) for w in ws]
        h = self._forward(h, ws, None)
        return h.view(self.copies, n, *h.shape[1:])

    @torch.no_grad()
    def predict(self, inputs: torch.Tensor, n_samples: int = 10, generator=None):
        """Network outputs at ``n_samples`` posterior samples, ``(E, n_samples, N, outputs)`` (``generator`` as in
        ``sample_weights``)."""
        if not (isinstance(n_samples, int) and n_samples >= 1):
            raise ValueError(f"n_samples must be a positive integer, got {n_samples!r}")
        return self.forward(inputs, self.sample_weights(n_samples, generator))

    def write_back(self) -> None:
        """Copies the means into the models' ``nn.Linear`` layers (``[W | b]`` of member e into ``models[e]``)."""
        with torch.no_grad():
            for e, model in enumerate(self.models):
                for mean, lin in zip(self.means, (m for m in model if isinstance(m, nn.Linear))):
                    n_w = lin.in_features
                    lin.weight.copy_(mean[e, :, :n_w])
                    if lin.bias is not None:
                        lin.bias.copy_(mean[e, :, n_w])

    # ---- the step ------------------------------------------------------------------------------------------
    def _forward(self, h, ws, saved):
        """The stacked MLP on ``h`` (members x samples, rows, d) at ``ws``; ``saved`` (a list) gets, per
        linear layer, its input with the ones column, and per activation its pre-activation."""
        li = 0
        for kind, *rest in self._plan_layers:
            if kind == "linear":
                has_bias = rest[2]
                a = nn.functional.pad(h, (0, 1), value=1.0) if has_bias else h
                if saved is not None:
                    saved.append(a)
                h = torch.bmm(a, ws[li].mT)
                li += 1
            else:
                if saved is not None:
                    saved.append(h)
                h = rest[0](h)
        return h

    def _backward(self, g, ws, saved):
        """Gradients with respect to each linear layer's output, last layer first, from the output gradient."""
        grads = []
        li = len(ws)
        for (kind, *rest), t in zip(reversed(self._plan_layers), reversed(saved)):
            if kind == "linear":
                li -= 1
                grads.append(g)
                if li == 0:
                    break
                g = torch.bmm(g, ws[li][:, :, :rest[1]])
            elif isinstance(rest[0], nn.ReLU):
                g = g * (t > 0)
            elif not isinstance(rest[0], nn.Identity):
                with torch.enable_grad():
                    z = t.detach().requires_grad_()
                    g, = torch.autograd.grad(rest[0](z), z, g)
        return grads[::-1]

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, precision: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One step of every member on its batch: ``inputs`` ``(E, B, d)``, ``targets`` ``(E, B)`` (class
        indices, or one regression output) or ``(E, B, outputs)``; ``B`` divisible by ``particles``,
        sample ``p`` of member ``e`` on rows ``[p B/P, (p+1) B/P)`` as ``NoisyKFAC`` shares its batch
        (give each sample the whole batch by repeating it ``particles`` times).  ``precision``:
        regression noise precisions broadcastable to ``(E, particles)`` (default ``sigma_noise**-2``).
        Returns each member's mean negative log-likelihood at the sampled weights, ``(E,)``; also sets
        ``last_sq_error`` (regression: each member's mean squared residual, ``(E,)``).  A step that raises
        changes nothing."""
        E, P = self.copies, self.particles
        if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
            raise TypeError("inputs and targets must be tensors")
        if inputs.dim() != 3 or inputs.shape[0] != E:
            raise ValueError(f"inputs must have shape ({E}, batch, features), got {tuple(inputs.shape)}")
        B = inputs.shape[1]
        if B == 0 or B % P:
            raise ValueError(f"inputs: the batch size {B} must be positive and divisible by particles={P}")
        if targets.shape[:2] != (E, B):
            raise ValueError(f"targets must have shape ({E}, {B}[, outputs]) like inputs, got {tuple(targets.shape)}")
        if not torch.isfinite(inputs).all():
            raise ValueError("inputs: non-finite values")
        plan = plan_step(self._step, self.hp, self._stats_count, self._ekfac, self.lr, self.total_steps, self.lr_decay)
        with torch.no_grad():  # (the activations' derivatives other than ReLU's take autograd)
            new, loss = self._compute(plan, inputs, targets, precision, B)
        # commit (nothing above changed the optimizer: the new state is new tensors in new dicts)
        self.state = new["state"]
        self.means = new["means"]
        self._stats_count += plan.do_stats
        self._scale_count += plan.do_scale
        self._step += 1
        return loss

    def _tau(self, precision, dtype, device):
        E, P = self.copies, self.particles
        if precision is None:
            return torch.full((E, P), self.sigma_noise ** -2, dtype=dtype, device=device)
        tau = torch.as_tensor(precision, dtype=dtype, device=device)
        try:
            tau = tau.expand(E, P) if tau.dim() <= 2 else None
        except RuntimeError:
            tau = None
        if tau is None:
            raise ValueError(f"precision must broadcast to ({E}, particles={P}), got shape "
                             f"{tuple(torch.as_tensor(precision).shape)}")
        if not bool(((tau > 0) & torch.isfinite(tau)).all()):
            raise ValueError("precision must be positive and finite")
        return tau

    def _keys(self):
        """Per (member, sample): the hash state of NoisyKFAC's share streams, (E, P) uint64."""
        E, P = self.copies, self.particles
        h = np.full((E, P), MIX_START, dtype=np.uint64)
        return mix64_array(h, self._seed_arr[:, None], np.uint64(self._step), np.arange(P, dtype=np.uint64)[None, :])

    def _sample(self, h):
        """This step's weight samples, (E P, out, in) per layer: NoisyKFAC's streams mix64(h, layer, 1)."""
        E, P = self.copies, self.particles
        ws = []
        for i, (mean, st) in enumerate(zip(self.means, self.state)):
            if not self.noise:
                ws.append(mean.repeat_interleave(P, 0))
                continue
            keys = (mix64_array(h, np.uint64(i), np.uint64(1)) & np.uint64(MASK63)).astype(np.int64)
            so = torch.from_numpy(np.stack([keys.reshape(-1), np.zeros(E * P, dtype=np.int64)], 1)).to(mean.device)
            out, inn = mean.shape[1:]
            z = NOISE_KEYED(self.posterior_variance(i).unsqueeze(1), [E, P, out, inn], so, 0.5)
            # Q_G Z_p Q_A^T + M for every sample p as two GEMMs per member: (Z Q_A^T) over the stacked rows of the
            # samples, then Q_G times the samples side by side
            y = torch.bmm(z.view(E, P * out, inn), st["q_a"].mT).view(E, P, out, inn).transpose(1, 2)
            w = torch.bmm(st["q_g"], y.reshape(E, out, P * inn)).view(E, out, P, inn).add_(mean.unsqueeze(2))
            ws.append(w.transpose(1, 2).reshape(E * P, out, inn))
        return ws

    def _output_grads(self, f, targets, tau, h, c, B):
        """(summed nll (E, P), squared residuals, output gradients of the loss half and the label half)."""
        E, P = self.copies, self.particles
        fl = f[:, :c]
        gen = self._gen
        lab = (h & np.uint64(MASK63)).astype(np.int64).reshape(-1).tolist()
        if self.likelihood == "regression":
            y = targets.reshape(E * P, c, -1).to(f.dtype)
            if y.shape[-1] != f.shape[-1]:
                raise ValueError(f"targets: the model has {f.shape[-1]} outputs, the targets {y.shape[-1]}")
            diff = fl - y
            sq = diff.pow(2).sum((1, 2)).view(E, P)
            t = tau.reshape(E * P, 1, 1)
            eps = torch.empty_like(fl)
            for r, s in enumerate(lab):  # (normal_ fills as torch.randn draws: NoisyKFAC's sampled targets)
                gen.manual_seed(s)
                eps[r].normal_(generator=gen)
            go_stat = eps.mul_(-t.sqrt())
            return 0.5 * tau * sq, sq, diff * (t / B), go_stat
        ys = targets.reshape(E * P, c)
        k = f.shape[-1]
        if ys.dtype.is_floating_point or bool(((ys < 0) | (ys >= k)).any()):
            raise ValueError(f"targets: class labels must be integers in [0, {k}) (the model has {k} outputs)")
        logp = fl.log_softmax(-1)
        onehot = nn.functional.one_hot(ys.long(), k).to(f.dtype)
        nll = -(logp * onehot).sum((1, 2)).view(E, P)
        p = logp.exp()
        if not bool(torch.isfinite(p).all()):
            raise FloatingPointError("non-finite model output: cannot sample labels from the predictive")
        draws = []
        for r, s in enumerate(lab):
            gen.manual_seed(s)
            draws.append(p[r].multinomial(1, generator=gen).squeeze(-1))
        go_stat = p - nn.functional.one_hot(torch.stack(draws), k).to(f.dtype)
        return nll, None, (p - onehot) / B, go_stat

    def _compute(self, plan, inputs, targets, precision, B):
        E, P = self.copies, self.particles
        c = B // P
        nl = len(self.means)
        dt = self.means[0].dtype
        if precision is not None and self.likelihood != "regression":
            raise ValueError("precision is a regression likelihood's noise precision; this optimizer is for "
                             "classification")
        tau = self._tau(precision, dt, inputs.device) if self.likelihood == "regression" else None
        h = self._keys()
        ws = self._sample(h)
        x = inputs.to(dt).reshape(E * P, c, inputs.shape[2])
        saved = []
        f = self._forward(torch.cat([x, x], 1), ws, saved)
        nll, sq, go_loss, go_stat = self._output_grads(f, targets, tau, h, c, B)
        gs = self._backward(torch.cat([go_loss, go_stat.to(f.dtype)], 1), ws, saved)
        acts = [t for t, (kind, *_) in zip(saved, self._plan_layers) if kind == "linear"]
        rows = []
        for i in range(nl):
            a, g = acts[i], gs[i]
            rows.append((a[:, :c].reshape(E, B, -1), g[:, :c].reshape(E, B, -1), g[:, c:].reshape(E, B, -1)))
        states = [dict(st) for st in self.state]
        if plan.do_stats:
            w = average_weight(self.hp, plan.beta, self._stats_count + 1)
            for st, (a, _, gst) in zip(states, rows):
                st["A"] = torch.baddbmm(st["A"], a.mT, a, beta=1 - w, alpha=w / B)
                st["G"] = torch.baddbmm(st["G"], gst.mT, gst, beta=1 - w, alpha=w / B)
        if plan.do_inv:
            for i, st in enumerate(states):
                for key in ("A", "G"):
                    if not bool(torch.isfinite(st[key]).all()):
                        bad = int((~torch.isfinite(st[key])).flatten(1).any(1).nonzero()[0])
                        require_finite(f"{i} of member {bad}", "input factor A" if key == "A" else "gradient factor G",
                                       st[key][bad])
                st["d_a"], st["q_a"] = eigen_basis(st["A"], self.min_eigenvalue)
                st["d_g"], st["q_g"] = eigen_basis(st["G"], self.min_eigenvalue)
                st["pi"] = trace_norm_pi(st["A"], st["G"]).unsqueeze(-1)
        if plan.do_reinit:
            damping = self.gamma if self.hp["reinit_damped"] else None
            for st in states:
                st["S"] = kfac_rescaling(st, self.min_eigenvalue, damping)
        if plan.do_scale:
            w = average_weight(self.hp, plan.beta_scale, self._scale_count + 1)
            for st, (a, _, gst) in zip(states, rows):
                xp = torch.bmm(a, st["q_a"]).square_()
                ep = torch.bmm(gst, st["q_g"]).square_()
                st["S"] = torch.baddbmm(st["S"], ep.mT, xp, beta=1 - w, alpha=w / B)
        mu = self.hp["momentum"]
        deltas, check = [], None
        for i, (st, (a, gl, _)) in enumerate(zip(states, rows)):
            w_bar = ws[i].view(E, P, *ws[i].shape[1:]).mean(1) if self.noise else self.means[i]
            u = torch.baddbmm(w_bar, gl.mT, a, beta=self.gamma_in)
            if mu > 0:
                st["m"], correction = moving_average(st.get("m"), u, mu, self._step + 1)
                u = st["m"] * correction
            if self._ekfac:
                denom = st["S"] + self.gamma
            else:
                denom = self._kfac_eigs(i, st)[1]
            d = st["q_g"] @ ((st["q_g"].mT @ u @ st["q_a"]) / denom) @ st["q_a"].mT
            deltas.append(d)
            du = (d * u).sum((1, 2))
            check = du if check is None else check + du
        if not bool(torch.isfinite(check).all()):
            bad = int((~torch.isfinite(check)).nonzero()[0])
            raise FloatingPointError(f"non-finite natural-gradient step of member {bad} (loss "
                                     f"{float(nll[bad].sum() / B)}; check its data and the learning rate)")
        lr = plan.lr
        nu = torch.ones_like(check)
        if self.kl_clip is not None and lr > 0:
            pos = check > 0
            nu = torch.where(pos, (self.kl_clip / (lr * lr * torch.where(pos, check, torch.ones_like(check)))).sqrt()
                             .clamp_max(1.0), nu)
        means = [mean - (lr * nu).view(E, 1, 1) * d for mean, d in zip(self.means, deltas)]
        loss = nll.sum(1) / B
        self.last_sq_error = None if sq is None else sq.sum(1) / B
        return dict(state=states, means=means), loss

    # ---- state ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything a resumed run needs (tensors are the optimizer's own; ``torch.save`` copies them)."""
        return dict(step=self._step, stats_count=self._stats_count, scale_count=self._scale_count, seeds=self.seeds,
                    hp=dict(self.hp), num_data=self.num_data, lr=self.lr, means=list(self.means),
                    state=[dict(st) for st in self.state], ekfac=self._ekfac)

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("ekfac") != self._ekfac or len(sd["means"]) != len(self.means) or any(
                a.shape != b.shape for a, b in zip(sd["means"], self.means)):
            raise ValueError("state_dict is from an optimizer of another kind or architecture")
        if sd["num_data"] != self.num_data:
            raise ValueError(f"state_dict was saved with num_data={sd['num_data']}, this optimizer has "
                             f"num_data={self.num_data}")
        self._step, self._stats_count, self._scale_count = sd["step"], sd["stats_count"], sd["scale_count"]
        self.seeds = list(sd["seeds"])
        self._seed_arr = np.array(self.seeds, dtype=np.uint64)
        self.hp, self.lr = dict(sd["hp"]), sd["lr"]
        self.gamma_in = self.hp["kl_weight"] / (self.num_data * self.hp["prior_var"])
        self.gamma = self.gamma_in + self.hp["damping"]
        self.means = [m.clone() for m in sd["means"]]
        self.state = [dict(st) for st in sd["state"]]
        self._cache = StateCache(4 * len(self.means))

    @property
    def steps_taken(self) -> int:
        return self._step


class BatchedNoisyKFAC(_BatchedNoisyKronecker):
    """Noisy K-FAC (:class:`~vmfdist.optim.noisy.NoisyKFAC`) for ``E`` models of one MLP architecture at once.

    Args:
        models: ``E`` ``nn.Sequential`` models of ``nn.Linear`` layers and elementwise activations, one
            architecture, dtype and device (their weights are the initial means; ``write_back`` copies
            the trained means into them).
        num_data: the training-set size :math:`N` (the same for every member).
        seeds: one per model (member ``e`` draws the streams of ``NoisyKFAC(seed=seeds[e])``).
        others: as :class:`~vmfdist.optim.noisy.NoisyKFAC` (``lr`` is the attribute ``lr``); only
            ``fisher_type="mc"`` on one process, no ``other_optimizer`` (every parameter is in a layer).

    ``step(inputs (E, B, d), targets (E, B[, k]), precision=None)`` returns each member's mean
    negative log-likelihood; ``predict(x, n_samples)`` gives ``(E, n_samples, N, outputs)``.
    """
    _ekfac = False


class BatchedNoisyEKFAC(_BatchedNoisyKronecker):
    """Noisy EK-FAC (:class:`~vmfdist.optim.noisy.NoisyEKFAC`) for ``E`` models of one MLP architecture at once;
    arguments as :class:`BatchedNoisyKFAC` plus ``beta_scale``, ``T_scale``, ``T_reinit``."""
    _ekfac = True
