"""The machinery under the noisy optimizers' step: the per-step random streams, the compiled
Kronecker-eigenbasis ops called without an autograd graph, the running Gram update, and the
step's plan and working data (see ``_NoisyKroneckerOptimizer.step``).  The compiled ops are
:mod:`vmfdist.linalg`'s graph-free overloads, below autograd by ``vmfdist._torch_internals``."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from .._torch_internals import below_autograd
from ..curvature import batch_rows, damped_kfac_eigenvalues, kfac_eigenvalues, running_average_weight
from ..linalg import kron_eigen_matvec_op as MATVEC
from ..linalg import kron_eigen_moments_op as MOMENTS
from ..linalg import kron_eigen_ngd_op as NGD
from ..linalg import kron_eigen_sample_op as SAMPLE
from ..random import random_kwargs

__all__ = ["MIX_START", "MASK63", "mix64_state", "mix64", "below_autograd", "SAMPLE", "NGD", "MOMENTS",
           "sample_now", "matvec_now", "running_gram", "dist_info", "StepPlan", "StepWork", "parameter_gradients",
           "check_batch", "checkpoint", "roll_back", "check_labels", "StateCache", "moving_average", "kfac_rescaling",
           "plan_step"]

MIX_START = 0x9E3779B97F4A7C15
MASK63 = 0x7FFFFFFFFFFFFFFF


def mix64_state(h: int, *xs: int) -> int:
    """The running 64-bit combination of ``mix64`` continued over ``xs`` from the state ``h``."""
    for x in xs:
        h = (h ^ (int(x) & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF
        h = (h + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = h
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        h = z ^ (z >> 31)
    return h


def mix64(*xs: int) -> int:
    """A 63-bit seed from integers (SplitMix64 finaliser over a running combination)."""
    return mix64_state(MIX_START, *xs) & MASK63


def sample_now(loc, q_out, q_in, variance, generator):
    """``kron_eigen_sample(loc, q_out, q_in, variance, generator=generator)`` (one sample, same
    bits, no graph)."""
    rng = random_kwargs("NoisyKFAC.sampled_weights", generator)
    with torch.no_grad(), below_autograd():
        return SAMPLE(loc, q_out, q_in, variance, 1, **rng)[0][0]


def matvec_now(q_out, q_in, scale, v, power):
    """``kron_eigen_matvec(q_out, q_in, scale, v, power)`` without a graph."""
    with torch.no_grad(), below_autograd():
        return MATVEC(q_out, q_in, scale, v, float(power))


def running_gram(old, rows, beta, alpha, world, avg):
    """``beta * old + alpha * R^T R`` for the row blocks ``rows`` stacked into ``R`` (a new tensor); on
    ``world > 1`` ranks ``R^T R`` is averaged over the ranks first (``avg``)."""
    r = rows[0] if len(rows) == 1 else torch.cat(rows)
    if world == 1:
        return torch.addmm(old, r.mT, r, beta=beta, alpha=alpha)
    return (old * beta).add_(avg(r.mT @ r), alpha=alpha)


def dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class StepPlan(NamedTuple):
    """What one step updates, and its rates."""
    lr: float
    beta: float
    beta_scale: float
    do_stats: bool
    do_inv: bool
    do_scale: bool
    do_reinit: bool
    need_acts: bool


def plan_step(k: int, hp: dict, stats_count: int, ekfac: bool, lr: float, total_steps: Optional[int],
              lr_decay: float) -> StepPlan:
    """What step ``k`` (from 0) of a noisy optimizer with settings ``hp`` updates, and its rates: ``lr``
    and the running-average rates, times ``lr_decay`` in the second half of ``total_steps``."""
    f = lr_decay if total_steps is not None and k >= total_steps / 2 else 1.0
    do_stats = k % hp["T_stats"] == 0
    # bases every T_inv steps, and (warm-up, ours) at the 1st, 2nd, 4th, 8th, ... statistics update
    # while that is sooner: the first factors come from a few batches and are far from full rank
    n_next = stats_count + 1
    do_inv = k % hp["T_inv"] == 0 or (do_stats and n_next * hp["T_stats"] < hp["T_inv"] and n_next & (n_next - 1) == 0)
    do_scale = ekfac and k % hp["T_scale"] == 0
    do_reinit = ekfac and (do_inv or k % hp["T_reinit"] == 0)
    return StepPlan(lr * f, hp["beta"] * f, hp["beta_scale"] * f, do_stats, do_inv, do_scale, do_reinit,
                    do_stats or do_scale)


class StepWork:
    """One step's working data, filled phase by phase: per layer, the row matrices whose Gram
    matrices sum to the batch factors (A: times ``a_scale``), (patches, [output gradients]) for the
    re-scaling where an example has several locations or ranks average the moments, the loss
    gradient (a matrix, or output-gradient and input rows for the preconditioning op), the sampled
    weights' sum over shares and their mean."""

    def __init__(self, opt, B: int):
        nl = len(opt._layer_list)
        self.B, self.chunk = B, B // opt.particles
        self.states = [opt.state[m.weight] for _, m in opt._layer_list]
        self.means = [t.clone() for t in opt._mats]
        # one backward for the loss and the sampled-label statistics (the batch stacked with itself; the
        # weight gradients come from the collector) unless other parameters need .grad
        self.stacked = not opt.other_params and opt.fisher_type in ("mc", "empirical")
        self.w_sum, self.grads = [None] * nl, [None] * nl
        self.a_rows, self.g_rows, self.saved = [[] for _ in range(nl)], [[] for _ in range(nl)], [[] for _ in range(nl)]
        self.grad_rows = [[] for _ in range(nl)]
        self.a_scale = [1.0] * nl
        self.g_out_rows, self.g_in_rows = [None] * nl, [None] * nl
        self.w_bar = []
        self.total_nll = None
        self.n_outputs = None  # the model's outputs, once a forward pass has run
        self._world = opt._world

    def avg(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the ranks, in place."""
        dist.all_reduce(t)
        t /= self._world
        return t

    def direction(self, i: int, gamma_in: float) -> torch.Tensor:
        """Layer i's u = grad + gamma_in W as a matrix (what the NGD op otherwise forms inside)."""
        u = self.w_bar[i] * gamma_in
        if self.grads[i] is not None:
            u = u + self.grads[i]
        if self.g_out_rows[i] is not None:
            u = u + self.g_out_rows[i].T @ self.g_in_rows[i]
        return u


def initial_factor(n: int, seed: int, layer: int, which: int, like: torch.Tensor, authors: bool) -> torch.Tensor:
    """A running Kronecker factor's start, ``(n, n)`` in ``like``'s dtype and device: the identity (the running
    mean's warm-up forgets it), or with ``authors`` the authors' initializer (their ``mvg_optimizer.py`` /
    ``emvg_optimizer.py``) I + T T^T with T = 0.1 N(0, 1)^(n x n), drawn in float64 from the stream
    mix64(seed, layer, which) (``which``: 7 for A, 8 for G), so that batched and unbatched optimizers with one
    seed start from the same bits."""
    if not authors:
        return torch.eye(n, dtype=like.dtype, device=like.device)
    t = 0.1 * torch.randn(n, n, generator=torch.Generator().manual_seed(mix64(seed, layer, which)), dtype=torch.float64)
    return (torch.eye(n, dtype=torch.float64) + t @ t.T).to(dtype=like.dtype, device=like.device)


def average_weight(hp: dict, beta: float, count: int) -> float:
    """The new estimate's weight in a running factor's k-th update (``count``, from 1): ``beta`` throughout
    with ``hp["ema_from_init"]`` (the authors' exponential average from the initial factor), else
    :func:`~vmfdist.curvature.running_average_weight` (the plain mean for the first 1/beta updates)."""
    return float(beta) if hp.get("ema_from_init", False) else running_average_weight(beta, count)


def moving_average(m: Optional[torch.Tensor], u: torch.Tensor, mu: float, t: int):
    """``(m', c)``: the moving average m' = mu m + (1 - mu) u (m None: 0) as a new tensor, and the bias
    correction c = 1 / (1 - mu^t) at step t (from 1) that makes c m' an average of the u's."""
    m = u * (1 - mu) if m is None else m * mu + u * (1 - mu)
    return m, 1.0 / (1 - mu ** t)


def kfac_rescaling(st, min_eigenvalue: float, damping: Optional[float] = None) -> torch.Tensor:
    """Noisy EK-FAC's re-scaling reset from a layer's state: the K-FAC eigenvalues in the current basis,
    diag(Q_G^T G Q_G) diag(Q_A^T A Q_A)^T (clamped at ``min_eigenvalue``), or with ``damping`` gamma the
    factored-damped ones (d_g + sqrt(gamma)/pi)(d_a + pi sqrt(gamma))^T, the authors' reset (the step then
    adds gamma again)."""
    da = ((st["A"] @ st["q_a"]) * st["q_a"]).sum(-2).clamp_min(min_eigenvalue)  # (batches of layers too)
    dg = ((st["G"] @ st["q_g"]) * st["q_g"]).sum(-2).clamp_min(min_eigenvalue)
    return kfac_eigenvalues(dg, da) if damping is None else damped_kfac_eigenvalues(dg, da, damping, st["pi"])


def parameter_gradients(loss, layer_list, weights, biases, other, means, grads) -> None:
    """Adds d loss / d [W | b] of every layer to ``grads`` (a list in layer order; a missing gradient is
    zero) and accumulates the ``other`` parameters' ``.grad``."""
    gr = torch.autograd.grad(loss, weights + biases + other, allow_unused=True)
    for p, g in zip(other, gr[len(weights) + len(biases):]):
        if g is not None:
            p.grad = g if p.grad is None else p.grad + g
    gw, gb = gr[:len(weights)], gr[len(weights):len(weights) + len(biases)]
    bi = 0
    for i, (n, m) in enumerate(layer_list):
        g = gw[i].reshape(gw[i].shape[0], -1) if gw[i] is not None else torch.zeros_like(
            means[i][:, :m.weight[0].numel()])
        if m.bias is not None:
            b = gb[bi] if gb[bi] is not None else torch.zeros_like(means[i][:, -1])
            g = torch.cat([g, b.unsqueeze(1)], 1)
            bi += 1
        grads[i] = g if grads[i] is None else grads[i] + g


def check_batch(inputs, targets, particles: int) -> int:
    """The batch size, after the checks that need no computation."""
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError(f"inputs and targets must be tensors, got {type(inputs).__name__} and "
                        f"{type(targets).__name__}")
    B = batch_rows(inputs, targets) or 0  # (curvature's check: one target row per example)
    if B == 0:
        raise ValueError(f"inputs: the batch is empty (shape {tuple(inputs.shape)})")
    if B % particles != 0:
        raise ValueError(f"the batch size {B} must be divisible by particles={particles}")
    return B


def checkpoint(opt, work: "StepWork"):
    """What a step of ``opt`` may change besides the means (kept in ``work.means``): the counters, each
    layer's state entries (the step replaces them, never modifies them in place) and the other
    parameters' gradients."""
    return (opt._stats_count, opt._scale_count, [dict(st) for st in work.states],
            [p.grad for p in opt.other_params])

def roll_back(opt, saved, work: "StepWork") -> None:
    """Undo a step of ``opt`` that raised: the means back in the layers, the state and counters as they were."""
    opt._stats_count, opt._scale_count, states, grads = saved
    with torch.no_grad():
        for mat, mean in zip(opt._mats, work.means):
            mat.copy_(mean)
    for st, old in zip(work.states, states):
        st.clear()
        st.update(old)
    for p, g in zip(opt.other_params, grads):
        p.grad = g



def check_labels(ys: torch.Tensor, k) -> None:
    """``ValueError`` naming ``targets`` when integer class labels lie outside ``[0, k)``."""
    if k is not None and not ys.dtype.is_floating_point and bool(((ys < 0) | (ys >= k)).any()):
        raise ValueError(f"targets: class labels must lie in [0, {k}) (the model has {k} outputs), got values "
                         f"from {int(ys.min())} to {int(ys.max())}") from None


class StateCache:
    """Values derived from a layer's state, kept while the state holds the very tensors they came
    from.  K-FAC's eigenvalues change only with the bases, the damping and pi (every T_inv steps, or
    when sigma_noise or the state is set), and each of those puts new tensors in the state; also
    0-dim tensors of constants."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._eig = {}
        self._scalars = {}

    def eigenvalues(self, key, st, compute):
        """The value stored under ``key`` if ``st``'s ``d_g``, ``d_a`` and ``pi`` are the tensors it
        was computed from, else ``compute()`` (stored)."""
        hit = self._eig.get(key)
        if hit is not None and hit[0] is st["d_g"] and hit[1] is st["d_a"] and hit[2] is st["pi"]:
            return hit[3]
        value = compute()
        if len(self._eig) > self.capacity:
            self._eig.clear()
        self._eig[key] = (st["d_g"], st["d_a"], st["pi"], value)
        return value

    def scalar(self, value: float, like: torch.Tensor) -> torch.Tensor:
        """``value`` as a 0-dim tensor of ``like``'s dtype and device (kept)."""
        key = (value, like.dtype, like.device)
        t = self._scalars.get(key)
        if t is None:
            if len(self._scalars) > 8:
                self._scalars.clear()
            t = self._scalars[key] = torch.tensor(value, dtype=like.dtype, device=like.device)
        return t
