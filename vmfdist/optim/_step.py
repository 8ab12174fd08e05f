"""The machinery under the noisy optimizers' step: the per-step random streams, the compiled
Kronecker-eigenbasis ops called without an autograd graph, the running Gram update, and the
step's plan and working data (see ``_NoisyKroneckerOptimizer.step``).  The compiled ops are
:mod:`vmfdist.linalg`'s graph-free overloads, the autograd shortcuts ``vmfdist._torch_internals``'."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from .._torch_internals import below_autograd, grad
from ..linalg import kron_eigen_matvec_op as MATVEC
from ..linalg import kron_eigen_moments_op as MOMENTS
from ..linalg import kron_eigen_ngd_op as NGD
from ..linalg import kron_eigen_sample_op as SAMPLE
from ..random import random_kwargs

__all__ = ["MIX_START", "MASK63", "mix64_state", "mix64", "below_autograd", "grad", "SAMPLE", "NGD", "MOMENTS",
           "sample_now", "matvec_now", "running_gram", "dist_info", "StepPlan", "StepWork", "parameter_gradients"]

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
        self._world = opt._world

    def avg(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` averaged over the ranks, in place."""
        dist.all_reduce(t)
        t /= self._world
        return t


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
