"""vmfdist.optim.batched: E models trained as one batched model equal E unbatched optimizers with the same
seeds (to rounding), a step with per-sample noise precisions against dense linear algebra, the keyed noise op
against kron_eigen_noise, and the errors. """
import copy

import pytest
import torch
from torch import nn

from vmfdist._ops import lib
from vmfdist.optim import BatchedNoisyEKFAC, BatchedNoisyKFAC, NoisyEKFAC, NoisyKFAC
from vmfdist.optim._step import mix64
from vmfdist.optim.batched import mix64_array

DT = torch.float64


def _mlp(seed, d=3, hidden=5, out=1, act=nn.ReLU, bias=True):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d, hidden, bias=bias), act(), nn.Linear(hidden, out)).to(DT)


def _compare(ekfac, lik, preset, particles, act=nn.ReLU, steps=14, E=3, bias=True):
    """Largest relative difference of the means and factors after ``steps`` steps, batched vs unbatched."""
    out = 1 if lik == "regression" else 4
    models = [_mlp(10 + e, out=out, act=act, bias=bias) for e in range(E)]
    seeds = [107, 2 ** 62 + 1, 5]
    g = torch.Generator().manual_seed(0)
    # 8 rows a batch: the first factors have full rank (a factor with a repeated eigenvalue, e.g. rank-deficient
    # or with two dead units, has no unique eigenbasis: rounding alone then rotates it, and the samples with it)
    B = 8
    X = torch.randn(E, steps, B, 3, generator=g, dtype=DT)
    Y = (torch.randn(E, steps, B, generator=g, dtype=DT) if lik == "regression"
         else torch.randint(0, out, (E, steps, B), generator=g))
    kw = dict(preset=preset, particles=particles, total_steps=10, sigma_noise=0.7)
    cls, bcls = (NoisyEKFAC, BatchedNoisyEKFAC) if ekfac else (NoisyKFAC, BatchedNoisyKFAC)
    bopt = bcls([copy.deepcopy(m) for m in models], 40, lik, seeds=seeds[:E], **kw)
    for k in range(steps):
        bopt.step(X[:, k], Y[:, k])
    err = 0.0
    for e in range(E):
        opt = cls(models[e], 40, lik, seed=seeds[e], **kw)
        for k in range(steps):
            opt.step(X[e, k], Y[e, k].unsqueeze(-1) if lik == "regression" else Y[e, k])
        for i, (name, mod) in enumerate(opt.layers.items()):
            ref = opt._mat[name]
            err = max(err, float((bopt.means[i][e] - ref).abs().max() / ref.abs().max()))
            st = opt.state[mod.weight]
            for key in ["A", "G", "q_a", "q_g"] + (["S"] if ekfac else []):
                err = max(err, float((bopt.state[i][key][e] - st[key]).abs().max() / st[key].abs().max()))
    return err


@pytest.mark.parametrize("ekfac", [False, True])
@pytest.mark.parametrize("lik", ["regression", "classification"])
@pytest.mark.parametrize("preset", ["uci", "uci_paper"])
@pytest.mark.parametrize("particles", [1, 2])
def test_batched_equals_unbatched(one_thread, ekfac, lik, preset, particles):
    """Member e after 14 steps (bases renewed, the re-scaling reset, the learning-rate decay at step 5, the
    trust region of "uci", the momentum and damped reset of "uci_paper") = NoisyKFAC / NoisyEKFAC with
    seed=seeds[e] on the same batches: the same weight noise and sampled labels, so equal to rounding."""
    assert _compare(ekfac, lik, preset, particles) < 1e-11


@pytest.mark.parametrize("act", [nn.Tanh, nn.GELU])
def test_batched_other_activations_and_no_bias(one_thread, act):
    assert _compare(True, "regression", "uci_paper", 2, act=act) < 1e-11
    assert _compare(False, "regression", "uci", 1, bias=False) < 1e-11


def test_per_sample_precision_step_against_dense(one_thread):
    """One noise-free K-FAC step with a different noise precision per weight sample: the factors, the damped
    Kronecker preconditioner and the step from their definitions with dense linear algebra (torch.kron, solve),
    the sampled-label noise regenerated from the documented streams."""
    E, P, B, N, lr = 2, 2, 6, 50, 0.3
    models = [_mlp(3 + e) for e in range(E)]
    seeds = [11, 12]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(E, B, 3, generator=g, dtype=DT)
    y = torch.randn(E, B, generator=g, dtype=DT)
    tau = torch.tensor([[0.5, 2.0], [3.0, 0.25]], dtype=DT)
    opt = BatchedNoisyKFAC([copy.deepcopy(m) for m in models], N, "regression", preset="uci", kl_clip=None,
                           noise=False, lr=lr, seeds=seeds, particles=P)
    opt.step(x, y, precision=tau)
    gamma_in = 1.0 / N
    gamma = gamma_in + 1e-3  # preset "uci": damping 1e-3
    c = B // P
    for e in range(E):
        m = models[e]
        W1 = torch.cat([m[0].weight, m[0].bias[:, None]], 1).detach()
        W2 = torch.cat([m[2].weight, m[2].bias[:, None]], 1).detach()
        a1 = torch.cat([x[e], torch.ones(B, 1, dtype=DT)], 1)
        z1 = a1 @ W1.T
        a2 = torch.cat([z1.relu(), torch.ones(B, 1, dtype=DT)], 1)
        f = a2 @ W2.T
        t = tau[e].repeat_interleave(c)[:, None]  # each row's sample's precision
        eps = torch.cat([torch.randn(c, 1, generator=torch.Generator().manual_seed(mix64(seeds[e], 0, j)), dtype=DT)
                         for j in range(P)])
        go_loss, go_stat = t * (f - y[e][:, None]) / B, -t.sqrt() * eps
        rows = {}
        for name, go in (("loss", go_loss), ("stat", go_stat)):
            g2 = go
            g1 = (g2 @ W2[:, :-1]) * (z1 > 0)
            rows[name] = (g1, g2)
        for i, (a, W) in enumerate(((a1, W1), (a2, W2))):
            gl, gs = rows["loss"][i], rows["stat"][i]
            A, G = a.T @ a / B, gs.T @ gs / B  # the first update of a running average is the batch value
            torch.testing.assert_close(opt.state[i]["A"][e], A, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(opt.state[i]["G"][e], G, rtol=1e-12, atol=1e-14)
            pi = ((A.trace() / A.shape[0]) / (G.trace() / G.shape[0])).sqrt()
            r = gamma ** 0.5
            Pmat = torch.kron(G + r / pi * torch.eye(G.shape[0], dtype=DT), A + r * pi * torch.eye(A.shape[0], dtype=DT))
            U = gl.T @ a + gamma_in * W
            D = torch.linalg.solve(Pmat, U.reshape(-1)).reshape(U.shape)
            torch.testing.assert_close(opt.means[i][e], W - lr * D, rtol=1e-10, atol=1e-12)


def test_keyed_noise_is_per_matrix_kron_noise():
    """kron_eigen_noise_keyed's matrix k = kron_eigen_noise of that matrix alone with seed_offsets[k],
    bitwise, float32 and float64, broadcast variance; and the seed hashing of the batched optimizers equals
    the unbatched one's."""
    g = torch.Generator().manual_seed(2)
    for dt in (torch.float32, torch.float64):
        var = torch.rand(4, 1, 5, 7, generator=g, dtype=dt) + 0.1
        keys = torch.tensor([[1, 0], [2 ** 63 - 1, 5], [3, 2 ** 48 - 1], [1, 0], [9, 9], [0, 0], [7, 1], [8, 2]])
        z = lib.kron_eigen_noise_keyed(var, [4, 2, 5, 7], keys, 0.5)
        for k in range(8):
            ref = lib.kron_eigen_noise(var[k // 2, 0], [5, 7], keys[k], 0.5)
            assert torch.equal(z.view(8, 5, 7)[k], ref)
    import numpy as np
    h = mix64_array(np.full(3, 0x9E3779B97F4A7C15, dtype=np.uint64), np.array([5, 2 ** 62, 0], dtype=np.uint64), 7)
    assert [int(v) & (2 ** 63 - 1) for v in h] == [mix64(5, 7), mix64(2 ** 62, 7), mix64(0, 7)]


def test_keyed_noise_errors():
    var = torch.ones(2, 3, 4)
    with pytest.raises(RuntimeError, match="seed_offsets must be an int64 tensor of shape \\(2, 2\\)"):
        lib.kron_eigen_noise_keyed(var, [2, 3, 4], torch.zeros(3, 2, dtype=torch.int64), 0.5)
    with pytest.raises(RuntimeError, match="seed_offsets\\[1\\] holds the seed -1"):
        lib.kron_eigen_noise_keyed(var, [2, 3, 4], torch.tensor([[0, 0], [-1, 0]]), 0.5)
    with pytest.raises(RuntimeError, match="seed_offsets\\[0\\] holds the offset"):
        lib.kron_eigen_noise_keyed(var, [2, 3, 4], torch.tensor([[0, 2 ** 48], [1, 0]]), 0.5)
    with pytest.raises(RuntimeError, match="does not broadcast"):
        lib.kron_eigen_noise_keyed(torch.ones(3, 3, 4), [2, 3, 4], torch.zeros(2, 2, dtype=torch.int64), 0.5)


def test_batched_errors_name_the_argument():
    models = [_mlp(0), _mlp(1)]
    with pytest.raises(ValueError, match="models: layer 1 is a Dropout"):
        BatchedNoisyKFAC([nn.Sequential(nn.Linear(2, 2), nn.Dropout())], 10)
    with pytest.raises(ValueError, match=r"models\[1\] does not have the architecture"):
        BatchedNoisyKFAC([_mlp(0), _mlp(1, hidden=4)], 10)
    with pytest.raises(ValueError, match="num_data"):
        BatchedNoisyKFAC(models, 0)
    with pytest.raises(ValueError, match="seeds must be 2 integers"):
        BatchedNoisyKFAC(models, 10, seeds=[1])
    opt = BatchedNoisyEKFAC(models, 10, particles=2, seeds=[1, 2])
    x, y = torch.randn(2, 4, 3, dtype=DT), torch.randn(2, 4, dtype=DT)
    with pytest.raises(ValueError, match="inputs must have shape"):
        opt.step(x[0], y)
    with pytest.raises(ValueError, match="divisible by particles=2"):
        opt.step(x[:, :3], y[:, :3])
    with pytest.raises(ValueError, match="targets must have shape"):
        opt.step(x, y[:, :2])
    with pytest.raises(ValueError, match="precision must broadcast"):
        opt.step(x, y, precision=torch.ones(3))
    with pytest.raises(ValueError, match="precision must be positive"):
        opt.step(x, y, precision=torch.tensor([[1.0, -1.0], [1.0, 1.0]]))
    bad = x.clone()
    bad[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="inputs: non-finite"):
        opt.step(bad, y)
    assert opt.steps_taken == 0
    opt.step(x, y)
    before = [m.clone() for m in opt.means]
    states = [dict(st) for st in opt.state]
    big = x.clone()
    big[1] *= 1e200  # member 1's activations overflow: refused, naming it, and nothing changes
    with pytest.raises(FloatingPointError, match="member 1"):
        opt.step(big, y)
    assert opt.steps_taken == 1
    assert all(torch.equal(a, b) for a, b in zip(before, opt.means))
    assert all(st[k] is old[k] for st, old in zip(opt.state, states) for k in old)


def test_batched_predict_and_state_dict(one_thread):
    models = [_mlp(0), _mlp(1)]
    opt = BatchedNoisyEKFAC([copy.deepcopy(m) for m in models], 20, preset="uci_paper", particles=2, seeds=[3, 4])
    x, y = torch.randn(2, 4, 3, dtype=DT), torch.randn(2, 4, dtype=DT)
    for _ in range(3):
        opt.step(x, y)
    sd = copy.deepcopy(opt.state_dict())
    twin = BatchedNoisyEKFAC([copy.deepcopy(m) for m in models], 20, preset="uci_paper", particles=2, seeds=[0, 0])
    twin.load_state_dict(sd)
    opt.step(x, y)
    twin.step(x, y)
    for a, b in zip(opt.means, twin.means):
        assert torch.equal(a, b)
    out = opt.predict(torch.randn(5, 3, dtype=DT), n_samples=4, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 4, 5, 1)
    opt.write_back()
    mean_out = opt.forward(x)
    torch.testing.assert_close(mean_out[:, 0], torch.stack([opt.models[e](x[e]) for e in range(2)]).detach())
