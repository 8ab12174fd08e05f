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
``lr_decay`` (0.1) for the second half of training, as in Bae et al. 2018, §6.1.

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

from ..curvature import (KFACCollector, KroneckerFactor, check_output, check_targets, damped_kfac_eigenvalues,
                         eigen_basis, factor_rows, input_patches, output_gradients, output_grads, per_example_second_moments,
                         require_finite, resolve_loss, trace_norm_pi, weight_matrix)
from ..curvature.layers import layer_shape
from ..distributions import EigenvalueCorrectedMatrixNormal, MatrixNormal
from ._step import (MASK63, MIX_START, MOMENTS, NGD, SAMPLE, StepPlan, StepWork, below_autograd, check_batch,
                    kfac_rescaling, moving_average, StateCache, check_labels, checkpoint, dist_info, roll_back,
                    mix64_state, parameter_gradients, plan_step, running_gram, sample_now, average_weight,
                    initial_factor)
from .settings import PRESETS, check_step_options, resolve_hyperparameters, trained_layers

__all__ = ["NoisyKFAC", "NoisyEKFAC", "PRESETS"]


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
                 seed: Optional[int] = None, momentum: Optional[float] = None,
                 reinit_damped: Optional[bool] = None, ema_from_init: Optional[bool] = None):
        if num_data is None:
            raise ValueError("num_data (the global number of training examples N) is required: it sets the "
                             "intrinsic damping lambda/(N eta) and the posterior scale lambda/N")
        if not (isinstance(num_data, int) and num_data >= 1):
            raise ValueError(f"num_data must be a positive integer, got {num_data!r}")
        self.likelihood, sigma_noise, _ = resolve_loss(likelihood, sigma_noise)
        self._sigma_noise = sigma_noise
        hp, kl_clip = resolve_hyperparameters(self.likelihood, preset, kl_clip, lr=lr, kl_weight=kl_weight,
                                              prior_var=prior_var, damping=damping, beta=beta, beta_scale=beta_scale,
                                              T_stats=T_stats, T_inv=T_inv, T_scale=T_scale, T_reinit=T_reinit,
                                              momentum=momentum, reinit_damped=reinit_damped,
                                              ema_from_init=ema_from_init)
        check_step_options(fisher_type, kfac_approx, particles, other_optimizer, total_steps)

        self.model = model
        self.layers: Dict[str, torch.nn.Module] = trained_layers(model, modules)
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

        rank, world = dist_info()
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
        for i, (name, mod) in enumerate(self.layers.items()):
            out, inn = layer_shape(mod)
            w = mod.weight
            kw = dict(dtype=w.dtype, device=w.device)
            st = self.state[mod.weight]
            st["A"] = initial_factor(inn, self.seed, i, 7, w, hp["ema_from_init"])
            st["G"] = initial_factor(out, self.seed, i, 8, w, hp["ema_from_init"])
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
        self._cache = StateCache(4 * len(self.layers))  # K-FAC eigenvalues by the state tensors they came from
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
            return torch.div(self._cache.scalar(c, s), s + self.gamma_in)  # (a tensor numerator: one op)
        return self._cache.eigenvalues(("variance", id(st["d_g"]), c, self.gamma_in), st,
                                       lambda: c / damped_kfac_eigenvalues(st["d_g"], st["d_a"], self.gamma_in, st["pi"]))

    def _kfac_eigenvalues(self, st, damping) -> torch.Tensor:
        """The damped K-FAC eigenvalues ``damped_kfac_eigenvalues(d_g, d_a, damping, pi)`` of a layer."""
        return self._cache.eigenvalues(("damped", id(st["d_g"]), damping), st, lambda: damped_kfac_eigenvalues(
            st["d_g"], st["d_a"], damping, st["pi"]))

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
        return sample_now(mean, st["q_g"], st["q_a"], self._posterior_variance(st), generator)

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

    def _lr(self) -> float:
        """The parameter group's ``lr`` (set by the constructor, an LR scheduler or the user, as in torch.optim)."""
        lr = self.param_groups[0]["lr"]
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"lr (param_groups[0]['lr']) must be a non-negative finite number, got {lr!r}")
        return lr

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One step on a batch: returns the mean negative log-likelihood at the sampled weights
        (the data term of the negative ELBO per example, detached).  Under torch.distributed,
        ``inputs`` is this rank's share of the global batch (equal sizes on all ranks)."""
        plan = self._plan()
        B = check_batch(inputs, targets, self.particles)
        work = StepWork(self, B)
        saved = checkpoint(self, work)
        hooks = self._hooks
        try:
            for p in self.other_params:
                p.grad = None
            for j in range(self.particles):
                self._run_share(j, inputs, targets, plan, work)
            loss = self._average_across_ranks(work)
            with torch.no_grad(), below_autograd():
                self._update_curvature(plan, work)
                deltas, check = self._precondition(work)
            self._move_means(work, deltas, check, plan.lr, loss)
        except BaseException:  # a step completes or changes nothing (Ctrl-C included)
            roll_back(self, saved, work)
            raise
        finally:
            hooks.record_inputs = False
            hooks.record_grads = False
            hooks.clear()
        if self.other_optimizer is not None:
            self.other_optimizer.step()
        self._step += 1
        return loss

    def _plan(self) -> "StepPlan":
        """What this step updates, and its rates."""
        return plan_step(self._step, self.hp, self._stats_count, self._ekfac, self._lr(), self.total_steps, self.lr_decay)

    def _run_share(self, j: int, inputs, targets, plan: "StepPlan", work: "StepWork") -> None:
        """Share ``j`` of the batch: sample the weights, forward, backward; the loss gradient goes to
        ``work.grads`` (or, stacked, to ``work.grad_rows``), the statistics to ``work``'s row lists."""
        P, chunk = self.particles, work.chunk
        # the random streams of this share of the global batch: mix64(seed, step, share) for the
        # sampled labels, mix64(seed, step, share, layer, 1) for the weight noise (Philox)
        h = mix64_state(MIX_START, self.seed, self._step, self._rank * P + j)
        gen = None
        if plan.need_acts and self.fisher_type == "mc":
            gen = self._label_generator(inputs.device)
            gen.manual_seed(h & MASK63)
        xs, ys = (inputs, targets) if P == 1 else (inputs[j * chunk:(j + 1) * chunk],
                                                   targets[j * chunk:(j + 1) * chunk])
        if self.noise:
            self._sample_weights(h, work)
        hooks = self._hooks
        hooks.clear()
        hooks.record_inputs = plan.need_acts
        hooks.record_grads = plan.need_acts
        try:
            if work.stacked and plan.need_acts:
                nll = self._stacked_pass(xs, ys, gen, work)
            else:
                nll = self._plain_pass(xs, ys, gen, plan, work)
        except (RuntimeError, IndexError):  # one_hot / cross_entropy on a label out of range: say so
            if self.likelihood == "classification":
                check_labels(ys, work.n_outputs)
            raise
        nll = nll.detach()
        work.total_nll = nll if work.total_nll is None else work.total_nll + nll
        if plan.need_acts:
            self._record_statistics(plan, work)
        hooks.clear()

    def _sample_weights(self, h: int, work: "StepWork") -> None:
        """Each layer holds a fresh posterior sample (its Philox stream ``mix64(h, layer, 1)``)."""
        with torch.no_grad(), below_autograd():
            for i, st in enumerate(work.states):
                w = SAMPLE(work.means[i], st["q_g"], st["q_a"], self._posterior_variance(st), 1,
                            seed=mix64_state(h, i, 1) & MASK63, offset=0)[0]  # (1, out, in)
                self._mats3[i].copy_(w)
                if self.particles > 1:
                    work.w_sum[i] = w[0] if work.w_sum[i] is None else work.w_sum[i] + w[0]

    def _stacked_pass(self, xs, ys, gen, work: "StepWork") -> torch.Tensor:
        """One forward and one backward for the loss and the sampled-label statistics: the batch is
        stacked with itself; the weight gradients come from the collector.  Returns the summed nll."""
        chunk, B = work.chunk, work.B
        out2 = check_output(self.model(torch.cat([xs, xs])))
        work.n_outputs = out2.shape[1]
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
            self._hooks.backward_to_outputs(out2, go, False)
            return nll
        if self.likelihood == "regression":
            diff = f - ys
            e_loss = diff * (1.0 / (self.sigma_noise ** 2 * B))
            nll = (diff * diff).sum() * (0.5 / self.sigma_noise ** 2)
        else:
            logp = f.log_softmax(-1)
            onehot = nn.functional.one_hot(ys.long(), f.shape[1]).to(f.dtype)
            e_loss = (logp.exp() - onehot) / B
            nll = -(logp * onehot).sum()
        e_stat = self._statistics_gradients(out2[chunk:], ys, gen)[0]
        self._hooks.backward_to_outputs(out2, torch.cat([e_loss, e_stat.to(out.dtype)]), False)
        return nll

    def _plain_pass(self, xs, ys, gen, plan: "StepPlan", work: "StepWork") -> torch.Tensor:
        """Forward; the statistics' backward passes (if this step collects); the loss gradient by
        autograd (weights and other parameters).  Returns the summed nll."""
        hooks = self._hooks
        out = check_output(self.model(xs))
        work.n_outputs = out.shape[1]
        ys = check_targets(out, ys, self.likelihood)
        if plan.need_acts:
            for e in self._statistics_gradients(out, ys, gen):
                hooks.backward_to_outputs(out, e.to(out.dtype), True)
        hooks.record_grads = False
        hooks.record_inputs = False
        nll = self._nll_sum(out, ys)
        parameter_gradients(nll / work.B, self._layer_list, self._weights, self._biases, self.other_params,
                            work.means, work.grads)
        return nll

    def _statistics_gradients(self, out, ys, gen):
        """curvature's ``output_gradients`` for the statistics; a non-finite output names the first layer
        whose input was not finite."""
        try:
            return output_gradients(out, ys, self.likelihood, self.fisher_type, self.sigma_noise, 1, gen)
        except FloatingPointError:
            name = self._hooks.first_non_finite_input()
            if name is not None:
                raise FloatingPointError(f"non-finite input to layer {name!r} (check the data and the learning "
                                         "rate)") from None
            raise

    def _record_statistics(self, plan: "StepPlan", work: "StepWork") -> None:
        """This share's statistics of each layer, as row matrices (curvature's ``factor_rows``), and (stacked)
        the loss gradient as rows; the patches and gradients themselves where the EK-FAC re-scaling needs
        them (several locations per example, or several ranks)."""
        hooks, chunk = self._hooks, work.chunk
        for i, (n, m) in enumerate(self._layer_list):
            x_in, g_out = hooks.inputs[n], hooks.grads[n]
            if work.stacked:
                a = input_patches(m, x_in[:chunk])
                g_both = output_grads(m, g_out[0])
                gl = [g_both[chunk:]]
                # the loss gradient as rows: sum over examples and locations of g a^T
                rows = chunk * a.shape[1]
                work.grad_rows[i].append((g_both.flatten(0, 1)[:rows], a.flatten(0, 1)))
            else:
                a = input_patches(m, x_in)
                gl = [output_grads(m, g) for g in g_out]
            ra, work.a_scale[i], rg = factor_rows(a, gl, self.kfac_approx)
            work.a_rows[i].append(ra)
            work.g_rows[i].extend(rg)
            if plan.do_scale and (a.shape[1] > 1 or self._world > 1):
                work.saved[i].append((a, gl))

    def _average_across_ranks(self, work: "StepWork") -> torch.Tensor:
        """The loss gradient per layer (in row form on one process: the preconditioning op forms the
        gradient itself), the sampled weights' mean over shares, the loss; averaged over the ranks."""
        world, nl = self._world, len(self._layer_list)
        for i, pairs in enumerate(work.grad_rows):
            if pairs:
                go_, gi_ = (torch.cat(t) for t in zip(*pairs)) if len(pairs) > 1 else pairs[0]
                if world > 1:
                    work.grads[i] = go_.mT @ gi_
                else:
                    work.g_out_rows[i], work.g_in_rows[i] = go_, gi_
        if world > 1:
            for g in work.grads:
                work.avg(g)
            for p in self.other_params:
                if p.grad is not None:
                    work.avg(p.grad)
        for i in range(nl):
            # the sampled weights (with one share, the layer still holds its sample), their mean over shares
            w = work.means[i] if not self.noise else (self._mats[i] if self.particles == 1
                                                      else work.w_sum[i] / self.particles)
            work.w_bar.append(work.avg(w.clone()) if world > 1 and self.noise else w)
        loss = work.total_nll / work.B
        if world > 1:
            work.avg(loss)
        return loss

    def _update_curvature(self, plan: "StepPlan", work: "StepWork") -> None:
        """Running factors, eigenbases (rank 0, broadcast), EK-FAC re-initialisation and re-scaling (new
        tensors, not in-place: a state_dict() taken earlier must not change)."""
        states, B, world = work.states, work.B, self._world
        if plan.do_stats:
            self._stats_count += 1
            wgt = average_weight(self.hp, plan.beta, self._stats_count)
            for i, st in enumerate(states):
                st["A"] = running_gram(st["A"], work.a_rows[i], 1 - wgt, wgt * work.a_scale[i] / B, world, work.avg)
                st["G"] = running_gram(st["G"], work.g_rows[i], 1 - wgt, wgt / B, world, work.avg)
        if plan.do_inv:
            self._new_bases(states)
        if plan.do_reinit:
            damping = self.gamma if self.hp.get("reinit_damped", False) else None
            for st in states:
                st["S"] = kfac_rescaling(st, self.min_eigenvalue, damping)
        if plan.do_scale:
            self._scale_count += 1
            wgt = average_weight(self.hp, plan.beta_scale, self._scale_count)
            for i, st in enumerate(states):
                self._rescale(st, work, i, wgt)

    def _new_bases(self, states) -> None:
        """Eigenbases and pi of every layer's factors on rank 0, broadcast to the others."""
        rank, world = self._rank, self._world
        for i, st in enumerate(states):
            n = self._layer_list[i][0]
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

    def _rescale(self, st, work: "StepWork", i: int, wgt: float) -> None:
        """EK-FAC: the running second moments of the per-example gradients in the basis."""
        B = work.B
        if not work.saved[i]:
            # one location per example, one process: the rows of the factors, each label draw's
            # output-gradient rows beside its examples' input rows, and the running average in one op
            a_rows, g_rows = work.a_rows[i], work.g_rows[i]
            draws = len(g_rows) // len(a_rows)
            xr = a_rows if draws == 1 else [r for r in a_rows for _ in range(draws)]
            x = xr[0] if len(xr) == 1 else torch.cat(xr)
            e = g_rows[0] if len(g_rows) == 1 else torch.cat(g_rows)
            st["S"] = MOMENTS(st["q_g"], st["q_a"], x, e, st["S"], 1 - wgt, wgt / B)
            return
        s = None
        for a, gs in work.saved[i]:
            for g in gs:
                v = per_example_second_moments(a, g, st["q_a"], st["q_g"])
                s = v if s is None else s + v
        if self._world > 1:
            work.avg(s)
        st["S"] = (st["S"] * (1 - wgt)).add_(s, alpha=wgt / B)

    def _precondition(self, work: "StepWork"):
        """P^{-1} u per layer with u = grad + gamma_in W (the step is -lr times it; V = -u), and the sum of
        u^T P^{-1} u over the layers for the trust region (u: its bias-corrected average with ``momentum``)."""
        deltas, check = [], None
        mu = self.hp.get("momentum", 0.0)
        for i, st in enumerate(work.states):
            if self._ekfac:
                scale, damping = st["S"], self.gamma
            else:
                scale, damping = self._kfac_eigenvalues(st, self.gamma), 0.0
            if mu > 0:  # a new tensor st["m"]: a step that raises restores the old one
                st["m"], correction = moving_average(st.get("m"), work.direction(i, self.gamma_in), mu, self._step + 1)
                d, du = NGD(st["q_g"], st["q_a"], scale, damping, st["m"], correction, None, None, None)
            else:
                d, du = NGD(st["q_g"], st["q_a"], scale, damping, work.w_bar[i], self.gamma_in, work.grads[i],
                            work.g_out_rows[i], work.g_in_rows[i])
            deltas.append(d)
            check = du if check is None else check + du
        return deltas, check

    def _move_means(self, work: "StepWork", deltas, check, lr: float, loss) -> None:
        """M <- M - lr * nu * P^{-1} u, with the K-FAC trust region's nu; a non-finite step names the layer."""
        vg = float(check)
        if not math.isfinite(vg):
            for (n, _), d in zip(self._layer_list, deltas):
                require_finite(n, "natural-gradient step", d)
            raise FloatingPointError(f"non-finite natural-gradient step (loss {float(loss)})")
        nu = 1.0
        if self.kl_clip is not None and vg > 0 and lr > 0:
            nu = min(1.0, math.sqrt(self.kl_clip / (lr * lr * vg)))
        with torch.no_grad():
            for mean, d, mat in zip(work.means, deltas, self._mats):
                torch.add(mean, d, alpha=-lr * nu, out=mat)

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
        momentum: :math:`\\mu \\in [0, 1)`: step along :math:`m/(1-\\mu^t)`, :math:`m \\leftarrow \\mu m + (1-\\mu)\\nabla`
            (state ``"m"``), not the gradient (default 0; the authors' regression code: 0.9).
        reinit_damped: EK-FAC's re-scaling reset to the factored-*damped* K-FAC eigenvalues (theirs).
        ema_from_init: start the factors at :math:`I + TT^T`, :math:`T = 0.1\\,N(0, 1)` (from the
            ``seed``'s stream), and average them (and EK-FAC's re-scaling) exponentially at the rate
            :math:`\\beta` from there, as the authors' code does (``"uci_paper"``); default (the other
            presets): the plain mean of the first :math:`1/\\beta` updates, which forgets the start.
        other_optimizer, other_lr: ``"adam"`` (lr 1e-3) or ``"sgd"`` (lr ``lr``) for the other
            parameters.
        seed: the weight-noise and label stream (default: drawn from torch's global generator).
        preset: ``"uci"``, ``"classification"`` or ``"uci_paper"`` (the authors' regression recipe)
            (``PRESETS``; default ``"uci"`` or ``"classification"`` by ``likelihood``); the
            hyper-parameters given explicitly override it.
        min_eigenvalue: clamp for the factors' eigenvalues (default 0).
        modules: the layers to train (modules or names; default every trainable ``nn.Linear`` /
            ``nn.Conv2d``; other trainable parameters go to ``other_optimizer``).

    Supported models: ``nn.Linear`` and ``nn.Conv2d`` layers (groups 1, zero padding) in float32 or
    float64; a frozen layer is left alone; half-frozen layers, tied parameters and float16 models
    are refused by name.  ``step(inputs, targets)``: ``inputs`` a batch the model takes (the first
    dimension is the batch, divisible by ``particles``), ``targets`` one row per example -- class
    indices in ``[0, outputs)`` for classification, the output's shape (or ``(batch,)`` for one
    output) for regression.  A step that raises changes nothing.  The learning rate is
    ``param_groups[0]["lr"]`` (LR schedulers work).

    Use ``loss = opt.step(x, y)`` per batch (it samples, runs forward and backward itself).
    """
    _ekfac = False


class NoisyEKFAC(_NoisyKroneckerOptimizer):
    """Noisy EK-FAC (Bae et al. 2018): an eigenvalue-corrected matrix-normal posterior per layer.
    Arguments as :class:`NoisyKFAC`, plus ``beta_scale`` (:math:`\\beta'`), ``T_scale`` (re-scaling
    update interval) and ``T_reinit`` (re-initialise :math:`S` from the K-FAC eigenvalues); the
    supported models and batches are :class:`NoisyKFAC`'s."""
    _ekfac = True
