"""vmfdist.optim: noisy K-FAC / EK-FAC against closed forms (Bayesian linear regression), dense linear algebra
(one preconditioned step), and training runs on the UCI MLP and a CNN on load_digits."""
import math

import pytest
import torch
from torch import nn

from vmfdist.curvature import compute_kfac
from vmfdist.distributions import EigenvalueCorrectedMatrixNormal, MatrixNormal
from vmfdist.optim import NoisyEKFAC, NoisyKFAC

from .shared_data import UCI_DIR

DT = torch.float64


def _blr_problem(N=200, d=4, sigma=0.5, eta=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, d, generator=g, dtype=DT)
    y = X @ torch.randn(d, generator=g, dtype=DT) + 0.3 + sigma * torch.randn(N, generator=g, dtype=DT)
    Xa = torch.cat([X, torch.ones(N, 1, dtype=DT)], 1)
    prec = Xa.T @ Xa / sigma ** 2 + torch.eye(d + 1, dtype=DT) / eta
    cov = torch.linalg.inv(prec)
    return X, y, cov, cov @ Xa.T @ y / sigma ** 2, Xa


def test_noisy_ekfac_bayesian_linear_regression_is_exact(one_thread):
    """One Linear layer, Gaussian likelihood, full batch, exact GGN, kl_weight 1: the EK-FAC posterior covariance is
    the exact posterior covariance (Sigma^{-1} = X^T X / sigma^2 + I / eta) to rounding, and the mean iterates
    fluctuate around the exact posterior mean (an AR(1) process: mu' - mu* = (1 - lr)(mu - mu*) - lr eps, eps ~ q;
    the average of n iterates has standard error about sd * sqrt((1 + rho)/(1 - rho) / (3 n)) with rho = 1 - lr)."""
    N, sigma, eta, lr = 200, 0.5, 0.5, 0.5
    X, y, cov, mean, _ = _blr_problem(N, sigma=sigma, eta=eta)
    torch.manual_seed(0)
    m = nn.Linear(4, 1).to(DT)
    opt = NoisyEKFAC(m, N, "regression", sigma_noise=sigma, prior_var=eta, kl_weight=1.0, fisher_type="type-2",
                     lr=lr, damping=0.0, T_inv=1, T_scale=1, T_stats=1, beta=1.0, beta_scale=1.0, kl_clip=None, seed=1)
    its = []
    n_burn, n = 100, 400
    for i in range(n_burn + n):
        opt.step(X, y)
        if i >= n_burn:
            its.append(torch.cat([m.weight.detach()[0], m.bias.detach()]))
    q = opt.posterior(m)
    assert isinstance(q, EigenvalueCorrectedMatrixNormal) and q.event_shape == (1, 5)
    Q = torch.kron(q.q_out, q.q_in)
    C = Q @ torch.diag(q.eigenvalues.reshape(-1)) @ Q.T
    torch.testing.assert_close(C, cov, rtol=1e-10, atol=1e-14)
    sd = cov.diagonal().sqrt()
    rho = 1 - lr
    se = sd * math.sqrt((1 + rho) / (1 - rho) * (lr / (2 - lr)) / n)
    avg = torch.stack(its).mean(0)
    assert bool(((avg - mean).abs() < 4.5 * se).all()), ((avg - mean) / se)


def test_noisy_kfac_bayesian_linear_regression_factored_posterior():
    """NoisyKFAC's posterior is (lambda/N) [(G + sqrt(g)/pi I) (x) (A + pi sqrt(g) I)]^{-1}, g = lambda/(N eta), with
    G = 1/sigma^2, A = X_a^T X_a / N, pi by the trace norm: checked as a dense matrix."""
    N, sigma, eta, lam = 150, 0.7, 2.0, 0.5
    X, y, _, _, Xa = _blr_problem(N, sigma=sigma, eta=eta, seed=3)
    torch.manual_seed(0)
    m = nn.Linear(4, 1).to(DT)
    opt = NoisyKFAC(m, N, "regression", sigma_noise=sigma, prior_var=eta, kl_weight=lam, fisher_type="type-2",
                    T_inv=1, T_stats=1, beta=1.0, seed=2)
    for _ in range(3):
        opt.step(X, y)
    q = opt.posterior("")
    assert isinstance(q, MatrixNormal)
    A = Xa.T @ Xa / N
    G = torch.full((1, 1), 1 / sigma ** 2, dtype=DT)
    gam = lam / (N * eta)
    pi = math.sqrt((A.trace() / 5) / (G.trace() / 1))
    P = torch.kron(G + math.sqrt(gam) / pi, A + pi * math.sqrt(gam) * torch.eye(5, dtype=DT))
    ref = lam / N * torch.linalg.inv(P)
    torch.testing.assert_close(torch.kron(q.row_covariance, q.column_covariance), ref, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("likelihood,fisher_type", [("classification", "type-2"), ("classification", "mc"),
                                                    ("regression", "mc"), ("regression", "empirical")])
@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_one_step_is_the_damped_natural_gradient(cls, likelihood, fisher_type):
    """noise=False, one step from a fresh optimizer (running averages = this batch's factors): the mean moves by
    lr * P^{-1} (-grad - gamma_in mu), P the damped K-FAC / EK-FAC matrix built densely from compute_kfac (for "mc"
    with the optimizer's label stream, generator seeded with _mix64(seed, step 0, share 0))."""
    from vmfdist.optim._step import mix64 as _mix64

    torch.manual_seed(0)
    # an in-place activation after a layer: the optimizer must differentiate the layer output, not the ReLU's
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=True), nn.Linear(5, 2)).to(DT)
    X = torch.randn(7, 3, dtype=DT)
    y = torch.randint(0, 2, (7,)) if likelihood == "classification" else torch.randn(7, 2, dtype=DT)
    N, lam, eta, gex, lr, sigma, seed = 50, 0.8, 0.3, 0.02, 0.1, 0.7, 17
    gen = torch.Generator().manual_seed(_mix64(seed, 0, 0))
    res = compute_kfac(model, [(X, y)], likelihood, sigma_noise=sigma, fisher_type=fisher_type, ekfac=True,
                       generator=gen)
    mu = {n: torch.cat([m.weight.detach(), m.bias.detach().unsqueeze(1)], 1) for n, m in
          (("0", model[0]), ("2", model[2]))}
    model.zero_grad()
    out = model(X)
    loss = (nn.functional.cross_entropy(out, y) if likelihood == "classification"
            else 0.5 * (out - y).pow(2).sum(1).mean() / sigma ** 2)
    loss.backward()
    grads = {n: torch.cat([m.weight.grad, m.bias.grad.unsqueeze(1)], 1) for n, m in (("0", model[0]), ("2", model[2]))}
    gin = lam / (N * eta)
    gam = gin + gex
    expected = {}
    for n, lf in res.layers.items():
        v = -(grads[n] + gin * mu[n]).reshape(-1)
        if cls is NoisyKFAC:
            pi = math.sqrt((lf.A.trace() / lf.A.shape[0]) / (lf.G.trace() / lf.G.shape[0]))
            P = torch.kron(lf.G + math.sqrt(gam) / pi * torch.eye(lf.G.shape[0], dtype=DT),
                           lf.A + pi * math.sqrt(gam) * torch.eye(lf.A.shape[0], dtype=DT))
        else:
            Q = torch.kron(lf.q_g, lf.q_a)
            P = Q @ torch.diag(lf.moments.reshape(-1) + gam) @ Q.T
        expected[n] = mu[n] + lr * torch.linalg.solve(P, v).reshape(mu[n].shape)
    opt = cls(model, N, likelihood, sigma_noise=sigma, noise=False, fisher_type=fisher_type, kl_weight=lam,
              prior_var=eta, damping=gex, lr=lr, kl_clip=None, T_stats=1, T_inv=1, T_scale=1, seed=seed)
    opt.step(X, y)
    for n, m in (("0", model[0]), ("2", model[2])):
        got = torch.cat([m.weight.detach(), m.bias.detach().unsqueeze(1)], 1)
        torch.testing.assert_close(got, expected[n], rtol=1e-10, atol=1e-13)


def _dense_preconditioner(opt, st) -> torch.Tensor:
    """The damped K-FAC / EK-FAC matrix P a step of ``opt`` preconditions with, dense, from a layer's state:
    the bases' Kronecker product with the diagonal EK-FAC moments + gamma, or the factored-damped K-FAC
    eigenvalues (d_g + sqrt(gamma)/pi)(d_a + pi sqrt(gamma))."""
    Q = torch.kron(st["q_g"], st["q_a"])
    if isinstance(opt, NoisyEKFAC):
        ev = st["S"].reshape(-1) + opt.gamma
    else:
        r = math.sqrt(opt.gamma)
        ev = torch.outer(st["d_g"] + r / st["pi"], st["d_a"] + r * st["pi"]).reshape(-1)
    return Q @ torch.diag(ev) @ Q.T


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_momentum_steps_along_the_bias_corrected_average(cls):
    """momentum = mu, noise=False, exact GGN: the first step is the plain damped natural gradient of
    u1 = grad + gamma_in W0 (bias correction), the second moves by -lr P2^{-1} (mu (1 - mu) u1 + (1 - mu) u2) /
    (1 - mu^2), with u1, u2 from autograd here and P the dense preconditioner of the optimizer's state."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).to(DT)
    X1, X2 = torch.randn(7, 3, dtype=DT), torch.randn(7, 3, dtype=DT)
    y1, y2 = torch.randn(7, 2, dtype=DT), torch.randn(7, 2, dtype=DT)
    N, lam, eta, lr, sigma, mu = 50, 0.8, 0.3, 0.1, 0.7, 0.9
    gin = lam / (N * eta)
    layers = (model[0], model[2])

    def mats():
        return [torch.cat([m.weight.detach(), m.bias.detach().unsqueeze(1)], 1).clone() for m in layers]

    def direction(X, y):
        model.zero_grad()
        (0.5 * (model(X) - y).pow(2).sum(1).mean() / sigma ** 2).backward()
        return [torch.cat([m.weight.grad, m.bias.grad.unsqueeze(1)], 1) + gin * w for m, w in zip(layers, mats())]

    opt = cls(model, N, "regression", sigma_noise=sigma, noise=False, fisher_type="type-2", kl_weight=lam,
              prior_var=eta, damping=0.02, lr=lr, kl_clip=None, T_stats=1, T_inv=1, T_scale=1, seed=3, momentum=mu)
    w0, u1 = mats(), direction(X1, y1)
    opt.step(X1, y1)
    for m, w_old, w_new, u in zip(layers, w0, mats(), u1):
        P = _dense_preconditioner(opt, opt.state[m.weight])
        want = w_old - lr * torch.linalg.solve(P, u.reshape(-1)).reshape(u.shape)
        torch.testing.assert_close(w_new, want, rtol=1e-10, atol=1e-13)
    w1, u2 = mats(), direction(X2, y2)
    opt.step(X2, y2)
    for m, w_old, w_new, a, b in zip(layers, w1, mats(), u1, u2):
        P = _dense_preconditioner(opt, opt.state[m.weight])
        mhat = (mu * (1 - mu) * a + (1 - mu) * b) / (1 - mu ** 2)
        want = w_old - lr * torch.linalg.solve(P, mhat.reshape(-1)).reshape(a.shape)
        torch.testing.assert_close(w_new, want, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("damped", [False, True])
def test_rescaling_reset_to_kfac_eigenvalues(damped):
    """Noisy EK-FAC's reset of the re-scaling S (T_reinit = 1, no re-scaling statistics after the first step):
    the K-FAC eigenvalues d_g d_a^T of the fresh bases, or with reinit_damped the factored-damped ones
    (d_g + sqrt(gamma)/pi)(d_a + pi sqrt(gamma))^T, as the authors' code resets it."""
    from vmfdist.curvature import damped_kfac_eigenvalues

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(DT)
    opt = NoisyEKFAC(model, 40, "regression", fisher_type="type-2", T_stats=1, T_inv=1, T_reinit=1, T_scale=1000,
                     kl_clip=None, seed=0, reinit_damped=damped, damping=0.01)
    for _ in range(2):
        opt.step(torch.randn(8, 3, dtype=DT), torch.randn(8, 2, dtype=DT))
    for m in (model[0], model[2]):
        st = opt.state[m.weight]
        want = (damped_kfac_eigenvalues(st["d_g"], st["d_a"], opt.gamma, st["pi"]) if damped
                else torch.outer(st["d_g"], st["d_a"]))
        torch.testing.assert_close(st["S"], want, rtol=1e-10, atol=1e-14)


def test_uci_paper_preset_and_momentum_checks():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).to(DT)
    opt = NoisyEKFAC(model, 100, "regression", preset="uci_paper")
    assert opt.hp["momentum"] == 0.9 and opt.hp["reinit_damped"] and opt.hp["damping"] == 0
    assert opt.kl_clip is None and opt.hp["beta_scale"] == 0.01 and opt.hp["T_reinit"] == 5
    assert NoisyKFAC(model, 100, "regression").hp["momentum"] == 0.0
    for bad in (1.0, -0.1, math.nan, True):
        with pytest.raises(ValueError, match="momentum must be in \\[0, 1\\)"):
            NoisyKFAC(model, 100, "regression", momentum=bad)
    with pytest.raises(ValueError, match="reinit_damped must be True or False"):
        NoisyEKFAC(model, 100, "regression", reinit_damped="yes")
    with pytest.raises(ValueError, match="ema_from_init must be True or False"):
        NoisyKFAC(model, 100, "regression", ema_from_init=1)


@pytest.mark.parametrize("preset", ["uci_paper", "uci"])
def test_factor_start_and_average_follow_the_preset(preset):
    """"uci_paper" starts the first layer's input factor at I + T T^T, T = 0.1 N(0, 1) from the seed's stream
    mix64(seed, 0, 7) (the authors' initializer), and averages at the rate beta from there: after one step
    A = (1 - beta) A_0 + beta [x | 1]^T [x | 1] / B.  "uci" starts at I and takes the plain mean, which
    forgets it: A = [x | 1]^T [x | 1] / B.  (The first layer's input does not depend on the weight noise.)"""
    from vmfdist.optim._step import mix64

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).to(DT)
    opt = NoisyKFAC(model, 100, "regression", preset=preset, seed=41, T_inv=1)
    st = opt.state[model[0].weight]
    t = 0.1 * torch.randn(4, 4, generator=torch.Generator().manual_seed(mix64(41, 0, 7)), dtype=torch.float64)
    a0 = torch.eye(4, dtype=DT) + (t @ t.T if preset == "uci_paper" else 0)
    torch.testing.assert_close(st["A"], a0, rtol=0, atol=0)
    x = torch.randn(8, 3, dtype=DT)
    opt.step(x, torch.randn(8, 1, dtype=DT))
    xa = torch.cat([x, torch.ones(8, 1, dtype=DT)], 1)
    beta = opt.hp["beta"]
    want = (1 - beta) * a0 + beta * xa.T @ xa / 8 if preset == "uci_paper" else xa.T @ xa / 8
    torch.testing.assert_close(opt.state[model[0].weight]["A"], want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_changing_sigma_noise_rescales_the_curvature(cls, one_thread):
    """Bayesian linear regression with the exact GGN and factors averaged over every step: after
    steps at sigma = 1, setting sigma_noise = 0.5 (a learned noise level) makes the posterior the
    exact one for sigma = 0.5 at once and after further steps -- the stored gradient factor is
    rescaled, not averaged with statistics taken at the old noise level (which would leave it
    between 1 and 4 for many steps).  A state dict keeps the noise level its curvature refers to."""
    N, eta = 200, 0.5
    X, y, _, _, Xa = _blr_problem(N, sigma=0.5, eta=eta)
    torch.manual_seed(0)
    m = nn.Linear(4, 1).to(DT)
    opt = cls(m, N, "regression", sigma_noise=1.0, prior_var=eta, kl_weight=1.0, fisher_type="type-2", lr=0.1,
              damping=0.0, T_inv=1, T_scale=1, T_stats=1, beta=1e-6, beta_scale=1e-6, kl_clip=None, seed=1)
    for _ in range(5):
        opt.step(X, y)
    opt.sigma_noise = 0.5

    def check():
        q = opt.posterior(m)
        if cls is NoisyEKFAC:  # the exact posterior
            exact = torch.linalg.inv(Xa.T @ Xa / 0.5 ** 2 + torch.eye(5, dtype=DT) / eta)
            Q = torch.kron(q.q_out, q.q_in)
            cov = Q @ torch.diag(q.eigenvalues.reshape(-1)) @ Q.T
        else:  # the factored posterior with G = 1/sigma^2 (as in the test above)
            A, G, gam = Xa.T @ Xa / N, torch.full((1, 1), 1 / 0.5 ** 2, dtype=DT), 1.0 / (N * eta)
            pi = math.sqrt((A.trace() / 5) / G.trace())
            P = torch.kron(G + math.sqrt(gam) / pi, A + pi * math.sqrt(gam) * torch.eye(5, dtype=DT))
            exact = torch.linalg.inv(P) / N
            cov = torch.kron(q.row_covariance, q.column_covariance)
        torch.testing.assert_close(cov, exact, rtol=1e-10, atol=1e-14)

    check()
    sd = opt.state_dict()
    assert sd["noisy"]["sigma_noise"] == 0.5
    for _ in range(3):
        opt.step(X, y)
    check()
    with pytest.raises(ValueError, match="sigma_noise"):
        opt.sigma_noise = -1.0
    m2 = nn.Linear(4, 1).to(DT)
    o2 = cls(m2, N, "regression", sigma_noise=1.0, prior_var=eta, fisher_type="type-2", seed=1)
    o2.load_state_dict(sd)
    assert o2.sigma_noise == 0.5


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_state_dict_round_trip_continues_identically(cls):
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 1)).to(DT)  # noqa: E731
    m1 = make()
    X, y = torch.randn(40, 3, dtype=DT), torch.randn(40, dtype=DT)
    o1 = cls(m1, 40, "regression", T_inv=2, T_stats=1, T_scale=1, T_reinit=3, seed=5)
    for i in range(3):
        o1.step(X[i * 10:(i + 1) * 10], y[i * 10:(i + 1) * 10])
    sd_model, sd_opt = {k: v.clone() for k, v in m1.state_dict().items()}, o1.state_dict()
    for key in ("A", "G", "q_a", "q_g", "d_a", "d_g"):
        assert key in sd_opt["state"][0]
    if cls is NoisyEKFAC:
        assert "S" in sd_opt["state"][0]
    assert sd_opt["noisy"]["step"] == 3
    m2 = make()
    m2.load_state_dict(sd_model)
    o2 = cls(m2, 40, "regression", T_inv=2, T_stats=1, T_scale=1, T_reinit=3, seed=99)
    o2.load_state_dict(sd_opt)
    for i in range(3, 4):
        o1.step(X[i * 10:(i + 1) * 10], y[i * 10:(i + 1) * 10])
        o2.step(X[i * 10:(i + 1) * 10], y[i * 10:(i + 1) * 10])
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)


def test_predictive_and_posterior_shapes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    opt = NoisyEKFAC(model, 100, "classification", T_stats=1, T_inv=1, T_scale=1)
    X, y = torch.randn(8, 1, 6, 6), torch.randint(0, 3, (8,))
    opt.step(X, y)
    p = opt.predictive(X, n_samples=4)
    assert p.shape == (8, 3)
    torch.testing.assert_close(p.sum(-1), torch.ones(8), rtol=0, atol=1e-5)
    q = opt.posterior("0")
    assert q.event_shape == (2, 10)
    w = q.sample((5,))
    assert w.shape == (5, 2, 10) and bool(torch.isfinite(w).all())
    before = [t.clone() for t in model.parameters()]
    with opt.sampled_weights():
        assert not torch.equal(model[0].weight, before[0])
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_bad_input():
    m = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="num_data"):
        NoisyKFAC(m, None)
    with pytest.raises(ValueError, match="likelihood must be one of"):
        NoisyKFAC(m, 10, "poisson")
    with pytest.raises(ValueError, match=r"T_inv \(15\) must be a multiple of T_stats \(10\)"):
        NoisyKFAC(m, 10, T_inv=15)
    with pytest.raises(ValueError, match="grouped convolution"):
        NoisyKFAC(nn.Sequential(nn.Conv2d(2, 2, 1, groups=2)), 10)
    with pytest.raises(ValueError, match="divisible by particles=3"):
        NoisyKFAC(m, 10, particles=3).step(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match=r"classification targets must have shape \(batch,\)"):
        NoisyKFAC(m, 10).step(torch.randn(4, 3), torch.zeros(4, 2))
    with pytest.raises(ValueError, match="kl_weight = 0 and damping = 0"):
        NoisyEKFAC(m, 10, kl_weight=0.0, damping=0.0)


def test_other_parameters_get_adam():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2))
    opt = NoisyEKFAC(model, 64, "classification", T_stats=1, T_inv=1, T_scale=1)
    assert isinstance(opt.other_optimizer, torch.optim.Adam)
    bn_w = model[1].weight.detach().clone()
    opt.step(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    assert not torch.equal(model[1].weight, bn_w)


# ---- training runs ---------------------------------------------------------------------------------------------
def _load_uci(name="bostonHousing", split=0):
    root = UCI_DIR / name
    if not root.exists():
        pytest.skip(f"UCI data not found at {root}")
    data = torch.tensor([[float(v) for v in line.split()] for line in (root / "data.txt").read_text().splitlines()
                         if line.strip()], dtype=torch.float32)
    feats = [int(v) for v in (root / "index_features.txt").read_text().split()]
    tgt = int((root / "index_target.txt").read_text().split()[0])
    tr = [int(float(v)) for v in (root / f"index_train_{split}.txt").read_text().split()]
    te = [int(float(v)) for v in (root / f"index_test_{split}.txt").read_text().split()]
    X, y = data[:, feats], data[:, tgt]
    mx, sx = X[tr].mean(0), X[tr].std(0).clamp_min(1e-6)
    my, sy = y[tr].mean(), y[tr].std()
    return (X[tr] - mx) / sx, (y[tr] - my) / sy, (X[te] - mx) / sx, (y[te] - my) / sy


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_trains_uci_mlp(cls, one_thread):
    """Boston housing, split 0, one hidden layer of 50, the UCI preset (batch 10): the predictive mean's test RMSE
    (standardised targets) beats least squares' on the same split (0.40 there; the optimizers reach about 0.25-0.26)
    and the run stays finite."""
    Xtr, ytr, Xte, yte = _load_uci()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(Xtr.shape[1], 50), nn.ReLU(), nn.Linear(50, 1))
    epochs = 40
    steps = epochs * (Xtr.shape[0] // 10)
    opt = cls(model, Xtr.shape[0], "regression", sigma_noise=0.3, total_steps=steps, seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        perm = torch.randperm(Xtr.shape[0], generator=g)
        for i in range(0, Xtr.shape[0] - 9, 10):
            loss = opt.step(Xtr[perm[i:i + 10]], ytr[perm[i:i + 10]])
            assert math.isfinite(float(loss))
    mean, var = opt.predictive(Xte, n_samples=20)
    rmse = float((mean.squeeze(1) - yte).pow(2).mean().sqrt())
    Xa = torch.cat([Xtr, torch.ones(Xtr.shape[0], 1)], 1)
    w = torch.linalg.lstsq(Xa, ytr.unsqueeze(1)).solution
    ls = float((torch.cat([Xte, torch.ones(Xte.shape[0], 1)], 1) @ w).squeeze(1).sub(yte).pow(2).mean().sqrt())
    assert rmse < ls, (rmse, ls)
    assert bool((var >= 0).all())


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_trains_cnn_on_digits(cls, one_thread):
    """A two-conv CNN on sklearn's 8x8 digits (1500 train, 297 test), batch 128, the classification preset's
    amortisation, a tempered posterior (kl_weight 0.1, prior variance 0.01): the loss stays finite and the
    10-sample predictive reaches well above chance (0.1) accuracy on the test digits."""
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    X = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target)
    Xtr, ytr, Xte, yte = X[:1500], y[:1500], X[1500:], y[1500:]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 10))
    opt = cls(model, 1500, "classification", kl_weight=0.1, prior_var=0.01, seed=0)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        perm = torch.randperm(1500, generator=g)
        for i in range(0, 1500 - 127, 128):
            loss = opt.step(Xtr[perm[i:i + 128]], ytr[perm[i:i + 128]])
            assert math.isfinite(float(loss))
    acc = float((opt.predictive(Xte, n_samples=10).argmax(1) == yte).float().mean())
    assert acc > 0.6, acc


def test_graph_free_op_calls_match_the_public_functions():
    """The optimizer calls the compiled ops below the autograd layer; same bits as vmfdist.linalg's functions."""
    from vmfdist.linalg import kron_eigen_matvec, kron_eigen_sample
    from vmfdist.optim._step import matvec_now as _matvec_now, sample_now as _sample_now

    g = torch.Generator().manual_seed(0)
    qg = torch.linalg.qr(torch.randn(5, 5, generator=g))[0].contiguous()
    qa = torch.linalg.qr(torch.randn(3, 3, generator=g))[0].contiguous()
    s, v, m = torch.rand(5, 3, generator=g) + 0.1, torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    assert torch.equal(_matvec_now(qg, qa, s, v, -1.0), kron_eigen_matvec(qg, qa, s, v, -1.0))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(_sample_now(m, qg, qa, s, g1), kron_eigen_sample(m, qg, qa, s, generator=g2))


def test_non_finite_step_names_the_layer():
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = NoisyEKFAC(m, 10, "classification", T_stats=1, T_inv=1, T_scale=1)
    X = torch.randn(4, 3)
    X[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"layer '0'"):
        opt.step(X, torch.tensor([0, 1, 0, 1]))


class _SeqLinear(nn.Module):
    """A Linear layer applied to every position of a (batch, 3, 4) input (several locations per example)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 5)
        self.b = nn.Linear(15, 2, bias=False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)).flatten(1))


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
@pytest.mark.parametrize("case", ["conv-reduce", "conv-nobias-particles", "linear-3d", "ggn-regression"])
def test_configurations_run_and_stay_finite(cls, case):
    """Paths beyond the fast one (several locations, KFAC-reduce, no bias, particles, type-2 labels): a few steps
    with every update, finite state, and the posterior of every layer has the layer's matrix shape."""
    torch.manual_seed(0)
    if case.startswith("conv"):
        model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1, bias=case == "conv-reduce"), nn.ReLU(), nn.Flatten(),
                              nn.Linear(3 * 5 * 5, 4))
        X, y, like = torch.randn(8, 1, 5, 5), torch.randint(0, 4, (8,)), "classification"
    elif case == "linear-3d":
        model = _SeqLinear()
        X, y, like = torch.randn(8, 3, 4), torch.randint(0, 2, (8,)), "classification"
    else:
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        X, y, like = torch.randn(8, 3), torch.randn(8, 2), "regression"
    kw = dict(T_stats=1, T_inv=2, T_scale=1, T_reinit=3, seed=0)
    if case == "conv-reduce":
        kw["kfac_approx"] = "reduce"
    if case == "conv-nobias-particles":
        kw["particles"] = 2
    if case == "ggn-regression":
        kw["fisher_type"] = "type-2"
    opt = cls(model, 64, like, **kw)
    for _ in range(4):
        assert math.isfinite(float(opt.step(X, y)))
    for name, mod in opt.layers.items():
        st = opt.state[mod.weight]
        assert all(bool(torch.isfinite(v).all()) for v in st.values())
        q = opt.posterior(name)
        out = mod.weight.shape[0]
        assert q.event_shape == (out, mod.weight[0].numel() + (mod.bias is not None))


# ---- a step completes or changes nothing; what torch.optim users expect (issue 22, items 1-4) ----------------
def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    state = {id(k): {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in st.items()}
             for k, st in opt.state.items()}
    return params, state, (opt._step, opt._stats_count, opt._scale_count)


def _same(model, opt, snap):
    params, state, counts = snap
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert (opt._step, opt._stats_count, opt._scale_count) == counts
    for k, st in opt.state.items():
        assert set(st) == set(state[id(k)])
        for n, v in st.items():
            assert torch.equal(v, state[id(k)][n]) if isinstance(v, torch.Tensor) else v == state[id(k)][n]


def _classifier(seed=0, extra=False):
    torch.manual_seed(seed)
    layers = [nn.Linear(4, 6), nn.Tanh()] + ([nn.LayerNorm(6)] if extra else []) + [nn.Linear(6, 3)]
    return nn.Sequential(*layers).to(DT)


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
@pytest.mark.parametrize("extra", [False, True])  # stacked fast path / plain path with Adam on LayerNorm
def test_a_failed_step_leaves_model_and_state_as_they_were(cls, extra):
    """Bad batches raise and change nothing: the means stay in the layers (the step used to leave its
    posterior sample there, which the next step took as the mean), the curvature and the counters stay,
    and the next good step is the one a never-failed optimizer takes."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(8, 4, generator=g, dtype=DT), torch.randint(0, 3, (8,), generator=g)
    model, twin = _classifier(extra=extra), _classifier(extra=extra)
    kw = dict(seed=3, T_stats=1, T_inv=2, T_scale=1)
    opt, ref = cls(model, 50, "classification", **kw), cls(twin, 50, "classification", **kw)
    opt.step(X, y), ref.step(X, y)
    snap = _snapshot(model, opt)
    X_nan = X.clone()
    X_nan[3, 1] = float("nan")
    bad = [((X, y[:5]), ValueError, "targets must hold one row per example"),
           ((X, torch.tensor([0, 1, 2, 3, 0, 1, 2, 0])), ValueError, r"targets: class labels must lie in \[0, 3\)"),
           ((X, y.to(DT)), ValueError, "integer class indices"),
           ((X[:0], y[:0]), ValueError, "inputs: the batch is empty"),
           ((X_nan, y), FloatingPointError, "non-finite")]
    for (xb, yb), err, msg in bad:
        with pytest.raises(err, match=msg):
            opt.step(xb, yb)
        _same(model, opt, snap)
    opt.step(X, y), ref.step(X, y)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_frozen_layers_are_left_alone(cls):
    g = torch.Generator().manual_seed(2)
    X, y = torch.randn(8, 4, generator=g, dtype=DT), torch.randint(0, 3, (8,), generator=g)
    model = _classifier()
    model[2].requires_grad_(False)
    frozen = [p.detach().clone() for p in model[2].parameters()]
    opt = cls(model, 100, "classification", T_stats=1, T_inv=2, seed=0)
    assert list(opt.layers) == ["0"]
    for _ in range(4):
        opt.step(X, y)
    assert all(torch.equal(p, q) for p, q in zip(model[2].parameters(), frozen))
    assert not torch.equal(model[0].weight, _classifier()[0].weight)  # the trainable layer did move
    half = _classifier()
    half[2].bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"layer '2' has a frozen bias and a trainable weight"):
        cls(half, 100, "classification")
    with pytest.raises(ValueError, match=r"modules: layer '2' is frozen"):
        cls(model, 100, "classification", modules=[model[2], model[0]])
    model[0].requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable supported layers"):
        cls(model, 100, "classification")


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_the_parameter_group_lr_is_the_source_of_truth(cls):
    """An LR scheduler (or the user) sets param_groups[0]['lr'] and the step uses it, as torch.optim's
    optimizers do; lr 0 leaves the means where they are, and a group lr of 2a is a constructor lr of 2a."""
    g = torch.Generator().manual_seed(3)
    X, y = torch.randn(8, 4, generator=g, dtype=DT), torch.randint(0, 3, (8,), generator=g)
    model = _classifier()
    opt = cls(model, 100, "classification", seed=0, T_stats=1, T_inv=1, lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.0)
    opt.step(X, y)
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.0
    before = [p.detach().clone() for p in model.parameters()]
    opt.step(X, y)
    assert opt.param_groups[0]["lr"] == 0.0
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    a, b = _classifier(), _classifier()
    oa = cls(a, 100, "classification", seed=1, lr=0.02)
    ob = cls(b, 100, "classification", seed=1, lr=0.01)
    ob.param_groups[0]["lr"] = 0.02
    for _ in range(3):
        oa.step(X, y), ob.step(X, y)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    ob.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"lr \(param_groups\[0\]\['lr'\]\) must be a non-negative finite number"):
        ob.step(X, y)


@pytest.mark.parametrize("cls", [NoisyKFAC, NoisyEKFAC])
def test_tied_weights_are_refused_by_name(cls):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)).to(DT)
    model[2].weight = model[0].weight
    with pytest.raises(ValueError, match=r"layers '0' and '2' share a parameter \(tied weights\)"):
        cls(model, 10, "regression")
    emb = nn.Embedding(5, 4).to(DT)

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = emb, nn.Linear(4, 5).to(DT)
            self.head.weight = self.emb.weight

        def forward(self, i):
            return self.head(self.emb(i))

    with pytest.raises(ValueError, match=r"module 'emb' \(Embedding\) shares a parameter with layer 'head'"):
        cls(Tied(), 10, "classification")


def test_half_precision_models_are_refused_by_name():
    """A float16 model used to fail inside eigh ("not implemented for 'Half'") after a step had started."""
    from vmfdist.laplace import KFACLaplace
    m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).half()
    for cls in (NoisyKFAC, NoisyEKFAC):
        with pytest.raises(ValueError, match=r"layer '0' has dtype torch.float16; .* float32 or float64"):
            cls(m, 10, "classification")
    with pytest.raises(ValueError, match=r"parameter '0.weight' has dtype torch.float16"):
        KFACLaplace(m, "classification")
