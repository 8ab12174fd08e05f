r"""UCI regression by the authors' recipe (``python -m vmfdist.experiments uci --preset paper``): Table 1 of
Bae, Zhang & Grosse (2018) with the settings of their released code (docs/experiments/uci_paper_recipe.md).

Every split of a data set is one member of one batched model (:class:`vmfdist.optim.BatchedNoisyEKFAC` /
:class:`~vmfdist.optim.BatchedNoisyKFAC`; BBB: stacked mean-field weights trained by Adam), so a data set's
splits train together at little more than the cost of one.  The recipe, per member:

* one hidden layer of 50 ReLU units (protein 100), the means Glorot-uniform over ``[W | b]``, float32;
* λ = 1, prior N(0, 1), α = 0.01, β = 0.001, β′ = 0.01, all ×0.1 from epoch 500, no extrinsic damping, no
  trust region, the step along the bias-corrected moving average of the gradient (0.9), the EK-FAC
  re-scaling reset to the damped K-FAC eigenvalues, the factors started at I + T T^T (T = 0.1 N(0, 1)) and
  averaged exponentially from there -- ``preset="uci_paper"`` -- with bases and reset every 5 steps on the
  sets trained with batch 10 and every 50 on the others (the configs' intent, see the note);
* 1000 epochs, batch 10 (≤ 5000 training examples) or 100, 10 weight samples per step, each on the whole
  batch (``--particle-batch whole``, as the authors) or each on a tenth of it (``share``, 10× cheaper);
* the noise precision τ: prior Gamma(6, 6), posterior q(τ) = Gamma(a, b) from (6, 6), one τ per weight
  sample in the likelihood and the sampled-label statistics, (a, b) by Adam (1e-3, never decayed) on
  ½(E_q[τ]·MSE − E_q[log τ]) + λ KL(q ‖ p)/N with the step's MSE held fixed;
* test: 10 weight samples, each with its own τ ~ q: LL = mean_n log (1/10) Σ_s N(y_n | f_s(x_n), 1/τ_s),
  RMSE of the 10-sample predictive mean, on the original scale.

BBB (the authors released no BBB regression code; these choices are ours): the same network, prior,
λ, epochs, batches and 10 samples; mean-field Gaussian weights (σ from 1e-3) and q(τ) trained jointly by
Adam at 0.01, ×0.1 from epoch 500, on the negative ELBO with E_q(τ) in closed form.

Each member draws only from its own streams (the optimizer's, and per-member generators for batches,
τ and test samples), so a split trained alone (``--splits K``) follows the trajectory it follows among
the others -- up to rounding, which batched and single matrix products may do differently.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..optim import BatchedNoisyEKFAC, BatchedNoisyKFAC
from ..optim._step import mix64
from . import _common
from .uci_data import Split

#: The recipe's numbers (docs/experiments/uci_paper_recipe.md).
PAPER = dict(epochs=1000, particles=10, test_samples=10, noise_lr=1e-3, bbb_lr=1e-2, bbb_sigma_init=1e-3,
             gamma_prior=(6.0, 6.0), kl_weight=1.0, prior_var=1.0, small_interval=5, large_interval=50)
PAPER_METHODS = ("noisy-ekfac", "noisy-kfac", "bbb")
PARTICLE_BATCHES = ("whole", "share")
#: When noisy (E)K-FAC refreshes its factors' bases and resets the re-scaling: "intended" -- every 5 steps
#: on the batch-10 sets, every 50 on the others (the configs' values); "as-run" -- every step, which is what
#: the released trainer does because its global step never advances (uci_paper_recipe.md, finding 4).
CADENCES = ("intended", "as-run")
#: How noisy (E)K-FAC averages its factors: "ema" -- from I + T T^T (T = 0.1 N(0, 1)) at the rate beta, as the
#: authors' code (``ema_from_init``); "mean" -- the plain mean of the first 1/beta updates, then at beta (the
#: library's default, which forgets the start; what the runs recorded before this option used).
FACTOR_AVERAGES = ("ema", "mean")
DT = torch.float32


def _stack(splits: List[Split]):
    n = {len(s.y_train) for s in splits}
    if len(n) != 1:
        raise ValueError("--preset paper trains a data set's splits as one batched model: they need equal training "
                         f"sizes (got {sorted(n)}); use --split-protocol random10")
    X = torch.stack([s.x_train for s in splits]).to(DT)
    Y = torch.stack([s.y_train for s in splits]).to(DT)
    return X, Y


class Checkpoint:
    """The state of one (data set, method) task after each epoch, written to ``path`` (atomically: a kill
    mid-write keeps the previous one); with ``resume`` the task continues from it -- every tensor, optimizer
    and random stream restored, so to the numbers of an uninterrupted run -- and a file written with other
    ``settings`` is refused."""

    def __init__(self, path: str, settings: dict, resume: bool):
        self.path, self.settings, self.resume = path, dict(settings), bool(resume)

    def load(self) -> Optional[dict]:
        return _common.load_checkpoint(self.path, self.settings) if self.resume else None

    def save(self, epoch: int, state: dict) -> None:
        _common.save_checkpoint(self.path, dict(state, settings=self.settings, epoch=epoch))


#: A task's checkpointed state: entry name -> (get, set), the getter's value saved, handed to the setter on resume.
Parts = Dict[str, Tuple[Callable[[], object], Callable[[object], None]]]


def _restore(checkpoint: Optional[Checkpoint], parts: Parts) -> int:
    """The epoch to start from: 0, or the checkpoint's, after handing each saved entry to its setter."""
    saved = None if checkpoint is None else checkpoint.load()
    if saved is None:
        return 0
    for key, (_, setter) in parts.items():
        setter(saved[key])
    return saved["epoch"]


def _save(checkpoint: Optional[Checkpoint], epoch: int, parts: Parts) -> None:
    if checkpoint is not None:
        checkpoint.save(epoch, {key: getter() for key, (getter, _) in parts.items()})


def _rng_part(gens: List[torch.Generator]):
    """The (get, set) of the generators' states, one per member."""
    def set_states(states):
        for g, st in zip(gens, states):
            g.set_state(st)

    return (lambda: [g.get_state() for g in gens], set_states)


def _glorot_mlp(d: int, hidden: int, seed: int) -> nn.Sequential:
    g = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, 1)).to(DT)
    with torch.no_grad():
        for lin in (model[0], model[2]):
            fan_in, fan_out = lin.in_features + 1, lin.out_features
            a = math.sqrt(6.0 / (fan_in + fan_out))
            w = (torch.rand(fan_out, fan_in, generator=g, dtype=DT) * 2 - 1) * a
            lin.weight.copy_(w[:, :-1])
            lin.bias.copy_(w[:, -1])
    return model


def _gamma_kl(a, b, a0: float, b0: float):
    """KL(Gamma(a, b) || Gamma(a0, b0)), shape-rate, elementwise."""
    return ((a - a0) * torch.digamma(a) - torch.lgamma(a) + math.lgamma(a0) + a0 * (torch.log(b) - math.log(b0))
            + a * (b0 - b) / b)


def gamma_draws(a: torch.Tensor, n: int, gens: List[torch.Generator]) -> torch.Tensor:
    """``(E, n)`` draws of Gamma(a_e, 1) (float64), member e's from ``gens[e]`` alone: Marsaglia & Tsang's (2000)
    rejection method, vectorised over the members (for a < 1 from Gamma(a + 1) times U^(1/a)); exact, and a
    member's draws do not depend on the others'."""
    a = a.detach().double()
    E = len(gens)
    boost = a < 1
    d = torch.where(boost, a + 1, a) - 1.0 / 3.0
    c = 1.0 / torch.sqrt(9.0 * d)
    out = torch.empty(E, n, dtype=torch.float64)
    have = [0] * E
    need = list(range(E))
    while need:
        ms = [2 * (n - have[e]) + 4 for e in need]  # each member draws for its own need (padding is rejected)
        m = max(ms)
        x = torch.stack([nn.functional.pad(torch.randn(k, generator=gens[e], dtype=torch.float64), (0, m - k),
                                           value=-math.inf) for e, k in zip(need, ms)])
        u = torch.stack([nn.functional.pad(torch.rand(k, generator=gens[e], dtype=torch.float64), (0, m - k),
                                           value=0.5) for e, k in zip(need, ms)])
        de, ce = d[need, None], c[need, None]
        v = (1 + ce * x) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * x * x + de - de * v + de * torch.log(v.clamp_min(1e-300)))
        dv = de * v
        for r, e in enumerate(need):
            acc = dv[r][ok[r]][:n - have[e]]
            out[e, have[e]:have[e] + acc.numel()] = acc
            have[e] += acc.numel()
        need = [e for e in need if have[e] < n]
    if bool(boost.any()):
        us = torch.stack([torch.rand(n, generator=g, dtype=torch.float64) for g in gens])
        out = torch.where(boost[:, None], out * us ** (1.0 / a[:, None]), out)
    return out


class _NoisePosterior:
    """q(τ) = Gamma(a, b) per member, (log a, log b) fitted by Adam; per-member streams for τ samples."""

    def __init__(self, seeds: List[int], num_data: int):
        a0, b0 = PAPER["gamma_prior"]
        E = len(seeds)
        self.log_a = torch.full((E,), math.log(a0), dtype=torch.float64, requires_grad=True)
        self.log_b = torch.full((E,), math.log(b0), dtype=torch.float64, requires_grad=True)
        self.opt = torch.optim.Adam([self.log_a, self.log_b], lr=PAPER["noise_lr"])
        self.num_data = num_data

    def sample(self, n: int, gens: List[torch.Generator]) -> torch.Tensor:
        """(E, n) draws of τ ~ q, member e's from ``gens[e]``."""
        return _tau_draws(self.log_a.detach().exp(), self.log_b.detach().exp(), n, gens)

    def state_dict(self) -> dict:
        return {"log_a": self.log_a.detach().clone(), "log_b": self.log_b.detach().clone(),
                "adam": self.opt.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        with torch.no_grad():
            self.log_a.copy_(sd["log_a"])
            self.log_b.copy_(sd["log_b"])
        self.opt.load_state_dict(sd["adam"])

    def update(self, mse: torch.Tensor) -> None:
        a0, b0 = PAPER["gamma_prior"]
        a, b = self.log_a.exp(), self.log_b.exp()
        loss = (_expected_nll(a, b, mse.detach()) + PAPER["kl_weight"] * _gamma_kl(a, b, a0, b0) / self.num_data).sum()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def _streams(seeds: List[int], k: int) -> List[torch.Generator]:
    """Each member's generator of stream ``k``, seeded mix64(seed, k): 2 batches, 3 training tau, 4 test weights,
    5 BBB's training weights, 6 test tau."""
    return [torch.Generator().manual_seed(mix64(s, k)) for s in seeds]


def _expected_nll(a: torch.Tensor, b: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    """E_q(tau)[-log N(y | f, 1/tau)] for q = Gamma(a, b) and mean squared residual ``sq``, per member."""
    return 0.5 * (math.log(2 * math.pi) - (torch.digamma(a) - torch.log(b)) + (a / b) * sq.double())


def _tau_draws(a: torch.Tensor, b: torch.Tensor, n: int, gens: List[torch.Generator]) -> torch.Tensor:
    return gamma_draws(a, n, gens) / b.detach().double()[:, None]


def _batches(n: int, batch: int, gens: List[torch.Generator]):
    """Per epoch: the (E, b) index tensors of each step, every member shuffled by its own generator."""
    perms = torch.stack([torch.randperm(n, generator=g) for g in gens])
    for k in range(0, n, batch):
        yield perms[:, k:k + batch]


def _metrics(splits: List[Split], f: torch.Tensor, tau: torch.Tensor) -> List[Dict[str, float]]:
    """Test LL and RMSE per member from outputs f (E, S, N) and precisions tau (E, S), standardised scale."""
    out = []
    for e, sp in enumerate(splits):
        mu = f[e].double() * sp.y_std + sp.y_mean  # (S, N)
        var = (1.0 / tau[e].double())[:, None] * sp.y_std ** 2
        y = sp.y_test.double()
        log_p = -0.5 * (math.log(2 * math.pi) + var.log() + (y - mu).pow(2) / var)
        ll = torch.logsumexp(log_p, 0) - math.log(log_p.shape[0])
        rmse = (mu.mean(0) - y).pow(2).mean().sqrt()
        out.append({"test_ll": float(ll.mean()), "rmse": float(rmse)})
    return out


def train_noisy(splits: List[Split], ekfac: bool, epochs: int, seeds: List[int],
                particle_batch: str = "whole", cadence: str = "intended",
                checkpoint: Optional[Checkpoint] = None, factor_average: str = "ema") -> List[Dict[str, float]]:
    """Noisy (E)K-FAC by the authors' recipe on the splits of one data set, one member per split
    (``checkpoint``: written after every epoch, continued from when it says so)."""
    X, Y = _stack(splits)
    E, n, d = X.shape
    batch = splits[0].batch_size
    P = PAPER["particles"]
    steps = epochs * math.ceil(n / batch)
    interval = 1 if cadence == "as-run" else PAPER["small_interval"] if batch <= 10 else PAPER["large_interval"]
    cls = BatchedNoisyEKFAC if ekfac else BatchedNoisyKFAC
    models = [_glorot_mlp(d, splits[0].n_hidden, s) for s in seeds]
    opt = cls(models, n, "regression", preset="uci_paper", particles=P, total_steps=steps, seeds=seeds,
              T_inv=interval, T_reinit=interval, ema_from_init=factor_average == "ema")
    noise = _NoisePosterior(seeds, n)
    gens = _streams(seeds, 2)
    tau_gens = _streams(seeds, 3)
    rows = torch.arange(E)[:, None]
    parts = {"optimizer": (opt.state_dict, opt.load_state_dict), "noise": (noise.state_dict, noise.load_state_dict),
             "batch_rng": _rng_part(gens), "tau_rng": _rng_part(tau_gens)}
    for epoch in range(_restore(checkpoint, parts), epochs):
        for idx in _batches(n, batch, gens):
            xb, yb = X[rows, idx], Y[rows, idx]
            if particle_batch == "whole":
                xb, yb = xb.repeat(1, P, 1), yb.repeat(1, P)
            elif xb.shape[1] % P:
                # a last batch smaller than the samples: each sample gets its whole share
                m = P // math.gcd(xb.shape[1], P)
                xb, yb = xb.repeat(1, m, 1), yb.repeat(1, m)
            tau = noise.sample(P, tau_gens)
            opt.step(xb, yb, precision=tau.to(DT))
            noise.update(opt.last_sq_error)
        _save(checkpoint, epoch + 1, parts)
    S = PAPER["test_samples"]
    Xt = torch.stack([s.x_test for s in splits]).to(DT)
    f = opt.predict(Xt, S, _streams(seeds, 4))[..., 0]  # (E, S, N)
    return _metrics(splits, f, noise.sample(S, _streams(seeds, 6)))


def train_bbb(splits: List[Split], epochs: int, seeds: List[int], particle_batch: str = "whole",
              checkpoint: Optional[Checkpoint] = None) -> List[Dict[str, float]]:
    """Bayes by Backprop (ours, see the module docstring) on the splits of one data set, one member per split
    (``checkpoint`` as in :func:`train_noisy`)."""
    X, Y = _stack(splits)
    E, n, d = X.shape
    batch, hidden, P = splits[0].batch_size, splits[0].n_hidden, PAPER["particles"]
    models = [_glorot_mlp(d, hidden, s) for s in seeds]
    mus = [torch.stack([torch.cat([m[k].weight, m[k].bias[:, None]], 1).detach() for m in models]).requires_grad_()
           for k in (0, 2)]
    rho0 = math.log(math.expm1(PAPER["bbb_sigma_init"]))
    rhos = [torch.full_like(mu, rho0).requires_grad_() for mu in mus]
    a0, b0 = PAPER["gamma_prior"]
    log_a = torch.full((E,), math.log(a0), dtype=torch.float64, requires_grad=True)
    log_b = torch.full((E,), math.log(b0), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam(mus + rhos + [log_a, log_b], lr=PAPER["bbb_lr"])
    steps = epochs * math.ceil(n / batch)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, steps // 2), gamma=0.1)
    gens = _streams(seeds, 2)
    noise_gens = _streams(seeds, 5)
    rows = torch.arange(E)[:, None]
    lam = PAPER["kl_weight"]

    def sample(S, gens_):
        ws = []
        for mu, rho in zip(mus, rhos):
            eps = torch.stack([torch.randn((S,) + tuple(mu.shape[1:]), generator=g, dtype=DT) for g in gens_])
            ws.append(mu.unsqueeze(1) + nn.functional.softplus(rho).unsqueeze(1) * eps)
        return ws

    def forward(x, ws):  # x (E, S, b, d), ws (E, S, out, in+1)
        h = nn.functional.pad(x, (0, 1), value=1.0) @ ws[0].mT
        return (nn.functional.pad(h.relu(), (0, 1), value=1.0) @ ws[1].mT)[..., 0]

    params = mus + rhos + [log_a, log_b]

    def set_params(values):
        with torch.no_grad():
            for t, v in zip(params, values):
                t.copy_(v)

    parts = {"params": (lambda: [t.detach().clone() for t in params], set_params),
             "optimizer": (opt.state_dict, opt.load_state_dict), "scheduler": (sched.state_dict, sched.load_state_dict),
             "batch_rng": _rng_part(gens), "noise_rng": _rng_part(noise_gens)}
    for epoch in range(_restore(checkpoint, parts), epochs):
        for idx in _batches(n, batch, gens):
            xb, yb = X[rows, idx], Y[rows, idx]
            if particle_batch == "whole":
                f = forward(xb.unsqueeze(1).expand(-1, P, -1, -1), sample(P, noise_gens))  # (E, P, b)
                sq = (f - yb.unsqueeze(1)).pow(2).mean((1, 2))
            else:
                c = max(1, xb.shape[1] // P)
                k = xb.shape[1] // c
                f = forward(xb[:, :k * c].reshape(E, k, c, d), sample(k, noise_gens))
                sq = (f - yb[:, :k * c].reshape(E, k, c)).pow(2).mean((1, 2))
            a, b = log_a.exp(), log_b.exp()
            nll = _expected_nll(a, b, sq)
            kl_w = sum((0.5 * (nn.functional.softplus(r).pow(2) + m.pow(2) - 1) - torch.log(nn.functional.softplus(r)))
                       .sum((1, 2)) for m, r in zip(mus, rhos))
            loss = (nll + lam * (kl_w.double() + _gamma_kl(a, b, a0, b0)) / n).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        _save(checkpoint, epoch + 1, parts)
    S = PAPER["test_samples"]
    with torch.no_grad():
        Xt = torch.stack([s.x_test for s in splits]).to(DT)
        f = forward(Xt.unsqueeze(1).expand(-1, S, -1, -1), sample(S, _streams(seeds, 4)))
        tau = _tau_draws(log_a.exp(), log_b.exp(), S, _streams(seeds, 6))
    return _metrics(splits, f, tau)


def train(method: str, splits: List[Split], epochs: int, seeds: List[int], particle_batch: str = "whole",
          cadence: str = "intended", checkpoint: Optional[Checkpoint] = None, factor_average: str = "ema"
          ) -> Tuple[List[Dict[str, float]], float]:
    """One method by the paper's recipe on a data set's splits: (per-split metrics, seconds of this call)."""
    if method not in PAPER_METHODS:
        raise ValueError(f"--preset paper runs {', '.join(PAPER_METHODS)}; got method {method!r}")
    if particle_batch not in PARTICLE_BATCHES:
        raise ValueError(f"--particle-batch must be one of {', '.join(PARTICLE_BATCHES)}, got {particle_batch!r}")
    if cadence not in CADENCES:
        raise ValueError(f"--cadence must be one of {', '.join(CADENCES)}, got {cadence!r}")
    if factor_average not in FACTOR_AVERAGES:
        raise ValueError(f"--factor-average must be one of {', '.join(FACTOR_AVERAGES)}, got {factor_average!r}")
    t0 = time.perf_counter()
    if method == "bbb":
        res = train_bbb(splits, epochs, seeds, particle_batch, checkpoint)
    else:
        res = train_noisy(splits, method == "noisy-ekfac", epochs, seeds, particle_batch, cadence, checkpoint,
                          factor_average)
    return res, time.perf_counter() - t0
