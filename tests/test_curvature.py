"""vmfdist.curvature against dense linear algebra and curvlinops' KFACLinearOperator (float64)."""
import math

import pytest
import torch
from torch import nn

from vmfdist.curvature import (compute_kfac, eigen_basis, find_layers, trace_norm_pi, damped_kfac_factors,
                               damped_kfac_eigenvalues, weight_matrix)

curvlinops = pytest.importorskip("curvlinops")
from curvlinops import KFACLinearOperator  # noqa: E402

DT = torch.float64


def _mlp(d_in=5, h=7, c=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, h), nn.Tanh(), nn.Linear(h, h), nn.ReLU(inplace=True),
                         nn.Linear(h, c)).to(DT)


def _cnn(c=4, seed=0, bias=True):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, bias=bias), nn.ReLU(), nn.Conv2d(3, 4, 2, stride=2),
                         nn.Tanh(), nn.Flatten(), nn.Linear(4 * 3 * 3, c)).to(DT)


def _cls_data(model_in_shape, n_batches=3, b=6, c=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn((b,) + model_in_shape, generator=g, dtype=DT), torch.randint(0, c, (b,), generator=g))
            for _ in range(n_batches)]


def _curvlinops(model, loss, data, fisher_type, kfac_approx="expand"):
    params = [p for p in model.parameters()]
    op = KFACLinearOperator(model, loss, params, data, fisher_type=fisher_type, kfac_approx=kfac_approx,
                            separate_weight_and_bias=False, check_deterministic=False)
    op.compute_kronecker_factors()
    return op._input_covariances, op._gradient_covariances


@pytest.mark.parametrize("fisher_type", ["type-2", "mc", "empirical"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mlp_classification_matches_curvlinops(fisher_type, reduction):
    model = _mlp()
    data = _cls_data((5,))
    loss = nn.CrossEntropyLoss(reduction=reduction)
    ref_a, ref_g = _curvlinops(model, loss, data, fisher_type)
    res = compute_kfac(model, data, loss_func=loss, fisher_type=fisher_type, seed=2147483647)
    n = 18
    assert res.num_data == n and res.curvature_scale == (n if reduction == "sum" else 1.0)
    for name, lf in res.layers.items():
        torch.testing.assert_close(lf.A, ref_a[name], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(lf.G * res.curvature_scale, ref_g[name], rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("fisher_type", ["type-2", "mc"])
def test_mlp_regression_matches_curvlinops(fisher_type):
    model = _mlp(c=2)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(5, 5, generator=g, dtype=DT), torch.randn(5, 2, generator=g, dtype=DT)) for _ in range(2)]
    loss = nn.MSELoss(reduction="sum")
    ref_a, ref_g = _curvlinops(model, loss, data, fisher_type)
    # MSELoss is a Gaussian with sigma^2 = 1/2; the likelihood name gives the same factors
    res = compute_kfac(model, data, "regression", sigma_noise=math.sqrt(0.5), fisher_type=fisher_type,
                       seed=2147483647)
    for name, lf in res.layers.items():
        torch.testing.assert_close(lf.A, ref_a[name], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(lf.G * res.num_data, ref_g[name], rtol=1e-11, atol=1e-14)


@pytest.mark.parametrize("kfac_approx", ["expand", "reduce"])
@pytest.mark.parametrize("fisher_type", ["type-2", "mc"])
def test_cnn_matches_curvlinops(kfac_approx, fisher_type):
    model = _cnn()
    data = _cls_data((2, 6, 6), n_batches=2, b=4, c=4)
    loss = nn.CrossEntropyLoss()
    ref_a, ref_g = _curvlinops(model, loss, data, fisher_type, kfac_approx)
    res = compute_kfac(model, data, loss_func=loss, fisher_type=fisher_type, kfac_approx=kfac_approx,
                       seed=2147483647)
    assert list(res.layers) == ["0", "2", "5"]
    for name, lf in res.layers.items():
        torch.testing.assert_close(lf.A, ref_a[name], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(lf.G, ref_g[name], rtol=1e-11, atol=1e-14)


# ---- dense references --------------------------------------------------------------------------------------
def _dense_ggn_blocks(model, X, likelihood, sigma=1.0):
    """Exact per-data-point GGN blocks of every Linear/Conv2d layer (w.r.t. [W|b] row-major), from dense
    Jacobians: (1/N) sum_n J_n^T H_n J_n."""
    layers = find_layers(model)
    names = list(layers)
    mats = [weight_matrix(m).clone() for m in layers.values()]

    def f(*ws):
        saved = {}
        for (name, mod), w in zip(layers.items(), ws):
            n_w = mod.weight[0].numel()
            saved[name] = (mod.weight, mod.bias)
            del mod.weight
            mod.weight = w[:, :n_w].reshape(saved[name][0].shape)
            if saved[name][1] is not None:
                del mod.bias
                mod.bias = w[:, n_w]
        try:
            return model(X)
        finally:
            for name, mod in layers.items():
                del mod.weight
                mod.weight = saved[name][0]
                if saved[name][1] is not None:
                    del mod.bias
                    mod.bias = saved[name][1]

    jac = torch.autograd.functional.jacobian(f, tuple(mats))  # each (N, C, out, in)
    out = model(X).detach()
    N, C = out.shape
    if likelihood == "classification":
        p = out.softmax(-1)
        H = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    else:
        H = torch.eye(C, dtype=DT).expand(N, C, C) / sigma ** 2
    blocks = {}
    for name, J in zip(names, jac):
        Jf = J.reshape(N, C, -1)
        blocks[name] = torch.einsum("nci,ncd,ndj->ij", Jf, H, Jf) / N
    return blocks


def test_single_example_kfac_is_exact_ggn_block_for_linear_layers():
    model = _mlp()
    X = torch.randn(1, 5, dtype=DT)
    res = compute_kfac(model, [(X, torch.tensor([1]))], "classification", fisher_type="ggn")
    blocks = _dense_ggn_blocks(model, X, "classification")
    for name, lf in res.layers.items():
        torch.testing.assert_close(lf.dense(), blocks[name], rtol=1e-10, atol=1e-13)


def test_regression_single_layer_kfac_is_exact_for_any_batch():
    """One Linear layer with a Gaussian likelihood: the GGN is (I/sigma^2) (x) mean(a a^T), exactly K-FAC."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 2)).to(DT)
    X = torch.randn(9, 4, dtype=DT)
    res = compute_kfac(model, [(X, torch.randn(9, 2, dtype=DT))], "regression", sigma_noise=0.7)
    blocks = _dense_ggn_blocks(model, X, "regression", sigma=0.7)
    torch.testing.assert_close(res["0"].dense(), blocks["0"], rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("model_fn,shape", [(_mlp, (5,)), (lambda: _cnn(c=3), (2, 6, 6))])
def test_ekfac_second_moments_are_the_exact_ggn_diagonal_in_the_kfac_basis(model_fn, shape):
    """With the exact GGN (type-2), the EK-FAC eigenvalues equal diag((Q_G x Q_A)^T GGN (Q_G x Q_A)) for any
    layer: the per-example gradient is summed over spatial locations before it is squared."""
    model = model_fn()
    data = _cls_data(shape, n_batches=2, b=3, c=3)
    X = torch.cat([x for x, _ in data])
    res = compute_kfac(model, data, "classification", fisher_type="type-2", ekfac=True)
    blocks = _dense_ggn_blocks(model, X, "classification")
    for name, lf in res.layers.items():
        Q = torch.kron(lf.q_g, lf.q_a)
        ref = torch.diagonal(Q.T @ blocks[name] @ Q).reshape(lf.moments.shape)
        torch.testing.assert_close(lf.moments, ref, rtol=1e-9, atol=1e-13)
        # the Kronecker eigenvalues are the K-FAC approximation's (check eigen_basis against the dense one)
        torch.testing.assert_close(torch.kron(lf.G, lf.A), Q @ torch.diag(lf.kfac_eigenvalues().reshape(-1)) @ Q.T,
                                   rtol=1e-9, atol=1e-12)


def test_ekfac_mc_pass_replays_the_same_labels():
    model = _mlp()
    data = _cls_data((5,))
    res = compute_kfac(model, data, "classification", fisher_type="mc", ekfac=True, seed=7)
    for lf in res:
        assert bool((lf.moments >= 0).all())
    res2 = compute_kfac(model, data, "classification", fisher_type="mc", ekfac=True, seed=7)
    for a, b in zip(res, res2):
        assert torch.equal(a.moments, b.moments) and torch.equal(a.G, b.G)


def test_ekfac_mc_equals_dense_per_example_reference():
    """MC EK-FAC moments against per-example gradients computed by autograd, one example at a time, with the
    labels that compute_kfac draws (replayed from the same seed)."""
    model = _mlp()
    data = _cls_data((5,), n_batches=1, b=4)
    res = compute_kfac(model, data, "classification", fisher_type="mc", ekfac=True, seed=11)
    X, _ = data[0]
    gen = torch.Generator().manual_seed(11)
    labels = model(X).detach().softmax(-1).multinomial(1, generator=gen).squeeze(-1)
    layers = find_layers(model)
    acc = {n: 0 for n in layers}
    for i in range(X.shape[0]):
        model.zero_grad()
        nn.functional.cross_entropy(model(X[i:i + 1]), labels[i:i + 1], reduction="sum").backward()
        for n, m in layers.items():
            gmat = torch.cat([m.weight.grad, m.bias.grad.unsqueeze(1)], 1)
            lf = res[n]
            acc[n] = acc[n] + (lf.q_g.T @ gmat @ lf.q_a).pow(2)
    for n in layers:
        torch.testing.assert_close(res[n].moments, acc[n] / X.shape[0], rtol=1e-10, atol=1e-14)


# ---- helpers -----------------------------------------------------------------------------------------------
def test_eigen_basis_clamps_and_canonical_signs():
    torch.manual_seed(0)
    B = torch.randn(5, 3, dtype=DT)
    M = B @ B.T  # rank 3: two (numerically) zero eigenvalues
    d, q = eigen_basis(M, min_eigenvalue=1e-6)
    assert bool((d >= 1e-6).all())
    torch.testing.assert_close(q.T @ q, torch.eye(5, dtype=DT), rtol=0, atol=1e-12)
    ref = torch.linalg.eigvalsh(M)
    torch.testing.assert_close(d[2:], ref[2:], rtol=1e-12, atol=1e-12)
    idx = q.abs().argmax(0)
    assert bool((q[idx, torch.arange(5)] > 0).all())
    d2, q2 = eigen_basis(-(-M))  # same matrix, same basis
    assert torch.equal(q, q2)


def test_factored_damping_is_invariant_to_splitting_a_constant():
    torch.manual_seed(1)
    A = torch.randn(4, 4, dtype=DT); A = A @ A.T
    G = torch.randn(3, 3, dtype=DT); G = G @ G.T
    Ad, Gd = damped_kfac_factors(A, G, 0.3)
    Ad2, Gd2 = damped_kfac_factors(9.0 * A, G / 9.0, 0.3)  # e.g. the spatial count moved from G to A
    torch.testing.assert_close(torch.kron(Gd, Ad), torch.kron(Gd2, Ad2), rtol=1e-12, atol=1e-12)
    pi = trace_norm_pi(A, G)
    torch.testing.assert_close(pi, torch.sqrt((A.trace() / 4) / (G.trace() / 3)))
    dA, _ = eigen_basis(A)
    dG, _ = eigen_basis(G)
    ev = damped_kfac_eigenvalues(dG, dA, 0.3, pi)
    torch.testing.assert_close(torch.sort(ev.reshape(-1)).values, torch.linalg.eigvalsh(torch.kron(Gd, Ad)),
                               rtol=1e-10, atol=1e-12)


# ---- bad input ---------------------------------------------------------------------------------------------
def test_errors_name_the_layer():
    data = _cls_data((5,))
    m = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).to(DT)
    with pytest.raises(ValueError, match=r"module '1' of type BatchNorm1d .*supported layers: nn.Linear, nn.Conv2d"):
        compute_kfac(m, data, "classification")
    res = compute_kfac(m, data, "classification", modules=["0", m[2]])  # explicit selection is fine
    assert list(res.layers) == ["0", "2"]
    with pytest.raises(ValueError, match=r"layer 'c' is a grouped convolution \(groups=2\)"):
        find_layers(nn.ModuleDict({"c": nn.Conv2d(2, 2, 1, groups=2)}))
    with pytest.raises(ValueError, match=r"layer 't' is a transposed convolution \(ConvTranspose2d\)"):
        find_layers(nn.ModuleDict({"t": nn.ConvTranspose2d(2, 2, 3)}))
    with pytest.raises(ValueError, match=r"layer 'e' of type Embedding is not supported; supported layers"):
        find_layers(nn.ModuleDict({"e": nn.Embedding(3, 2)}), modules=["e"])


def test_errors_on_mis_scaling_losses_and_options():
    model = _mlp(c=2)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 5, generator=g, dtype=DT), torch.randn(4, 2, generator=g, dtype=DT))]
    with pytest.raises(ValueError, match=r"MSELoss\(reduction='mean'\) with 2 outputs averages over the outputs"):
        compute_kfac(model, data, loss_func=nn.MSELoss())
    with pytest.raises(ValueError, match=r"reduction='none'"):
        compute_kfac(model, data, loss_func=nn.MSELoss(reduction="none"))
    with pytest.raises(ValueError, match="label smoothing"):
        compute_kfac(model, data, loss_func=nn.CrossEntropyLoss(label_smoothing=0.1))
    with pytest.raises(ValueError, match="fisher_type must be one of"):
        compute_kfac(model, data, "regression", fisher_type="fisher")
    with pytest.raises(ValueError, match="kfac_approx must be one of"):
        compute_kfac(model, data, "regression", kfac_approx="full")
    with pytest.raises(ValueError, match="likelihood must be one of"):
        compute_kfac(model, data, "poisson")
    with pytest.raises(ValueError, match="sigma_noise must be a positive"):
        compute_kfac(model, data, "regression", sigma_noise=0.0)
    with pytest.raises(ValueError, match=r"regression targets must have the model output's shape \(4, 2\)"):
        compute_kfac(model, [(data[0][0], torch.randn(4, 3, dtype=DT))], "regression", fisher_type="empirical")


def test_non_finite_factor_names_the_layer():
    model = _mlp()
    X = torch.randn(3, 5, dtype=DT)
    X[1, 2] = float("inf")
    with pytest.raises(FloatingPointError, match=r"layer '0'"):
        compute_kfac(model, [(X, torch.tensor([0, 1, 2]))], "classification")


def test_mc_fisher_is_unbiased_for_the_exact_fisher():
    """For the categorical likelihood the Fisher equals the GGN: the MC gradient factor (labels sampled from the
    predictive) averages to the type-2 factor.  12 independent runs of 50 draws each; every entry within 5 standard
    errors (estimated from the runs) of the exact value."""
    model = _mlp()
    data = _cls_data((5,), n_batches=1, b=6)
    exact = compute_kfac(model, data, "classification", fisher_type="type-2")
    runs = [compute_kfac(model, data, "classification", fisher_type="mc", mc_samples=50, seed=100 + r)
            for r in range(12)]
    for name, lf in exact.layers.items():
        gs = torch.stack([r[name].G for r in runs])
        se = gs.std(0) / math.sqrt(len(runs))
        assert bool(((gs.mean(0) - lf.G).abs() <= 5 * se + 1e-12).all())
        torch.testing.assert_close(runs[0][name].A, lf.A, rtol=1e-13, atol=1e-15)  # A does not depend on labels


# ---- the value type and the collection pass -------------------------------------------------------------------
def test_kronecker_factor_blocks_scaling_and_damping_against_dense():
    from vmfdist.curvature import KroneckerFactor
    g = torch.Generator().manual_seed(4)
    ra, rg = torch.randn(9, 4, generator=g, dtype=DT), torch.randn(9, 3, generator=g, dtype=DT)
    f = KroneckerFactor(ra.T @ ra, rg.T @ rg)
    assert f.shape == (3, 4)
    assert f.q_a is None and f.q_g is None  # no bases before they are asked for
    # K-FAC eigenvalues in the eigenbasis reproduce G (x) A
    ev = f.kfac_eigenvalues()
    Q = torch.kron(f.q_g, f.q_a)
    torch.testing.assert_close(Q @ torch.diag(ev.reshape(-1)) @ Q.T, f.dense(), rtol=1e-10, atol=1e-12)
    # damped eigenvalues are those of the damped factors' Kronecker product (pi fixed at 1.7)
    Ad, Gd = f.damped_factors(0.3, pi=1.7)
    dense = torch.linalg.eigvalsh(torch.kron(Gd, Ad))
    torch.testing.assert_close(torch.sort(f.damped_eigenvalues(0.3, 1.7).reshape(-1)).values, dense, rtol=1e-10,
                               atol=1e-12)
    # the weight and bias parts of a joint factor
    torch.testing.assert_close(f.block("weight").A, f.A[:3, :3])
    torch.testing.assert_close(f.block("bias").A, f.A[3:, 3:])
    assert f.block("joint").A is f.A
    with pytest.raises(ValueError, match="kind must be"):
        f.block("both")
    s = f.scaled(2.0, 3.0)
    torch.testing.assert_close(s.dense(), 6.0 * f.dense())
    torch.testing.assert_close(s.kfac_eigenvalues(), 6.0 * ev)


def test_factor_rows_give_the_batch_factors():
    from vmfdist.curvature import factor_rows, gradient_factor, input_factor
    g = torch.Generator().manual_seed(5)
    for T in (1, 4):
        a = torch.randn(6, T, 5, generator=g, dtype=DT)
        gs = [torch.randn(6, T, 3, generator=g, dtype=DT) for _ in range(2)]
        for approx in ("expand", "reduce"):
            ra, c, rg = factor_rows(a, gs, approx)
            torch.testing.assert_close(c * ra.T @ ra, input_factor(a, approx), rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(sum(r.T @ r for r in rg), sum(gradient_factor(x, approx) for x in gs),
                                       rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_compute_kfac_reports_the_data_loss(likelihood):
    model = _mlp()
    g = torch.Generator().manual_seed(6)
    X = torch.randn(15, 5, generator=g, dtype=DT)
    y = torch.randint(0, 3, (15,), generator=g) if likelihood == "classification" else torch.randn(15, 3, generator=g,
                                                                                                      dtype=DT)
    data = [(X[:8], y[:8]), (X[8:], y[8:])]
    res = compute_kfac(model, data, likelihood, sigma_noise=0.7)
    with torch.no_grad():
        f = model(X)
    if likelihood == "classification":
        ref = nn.functional.cross_entropy(f, y, reduction="sum")
    else:
        ref = 0.5 * ((f - y) ** 2).sum() / 0.7 ** 2
    torch.testing.assert_close(res.loss, ref, rtol=1e-12, atol=0)
    assert res.settings["num_outputs"] == 3 and set(res.modules) == set(res.layers)


def test_collector_and_targets_checks():
    from vmfdist.curvature import KFACCollector, batch_nll, check_output, find_layers
    model = _mlp()
    X = torch.randn(4, 5, dtype=DT)
    with pytest.raises(ValueError, match=r"the model must return a \(batch, outputs\) tensor, got \(4,\)"):
        check_output(torch.zeros(4))
    with pytest.raises(ValueError, match="got tuple"):
        check_output((torch.zeros(4, 3),))
    f = model(X)
    with pytest.raises(ValueError, match=r"classification targets must lie in \[0, 3\)"):
        batch_nll(f, torch.tensor([0, 1, 3, 0]), "classification")
    with pytest.raises(ValueError, match="integer class indices"):
        batch_nll(f, torch.tensor([0.0, 1.0, 2.0, 0.0]), "classification")
    layers = find_layers(model)
    with KFACCollector(layers) as col:
        params = [m.weight for m in layers.values()]
        out, stats = col.collect(model, X, None, "classification", "type-2", params)
        assert out.shape == (4, 3) and list(stats) == list(layers)
        a, gs = stats["0"]
        assert a.shape == (4, 1, 6) and len(gs) == 3 and gs[0].shape == (4, 1, 7)
        assert not col.inputs and all(not v for v in col.grads.values())  # cleared after the batch
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in layers.values())  # hooks removed on exit


def test_eigen_basis_falls_back_to_float64_when_float32_eigh_returns_nan(monkeypatch):
    """Some LAPACK builds return NaN eigenvectors for such a factor instead of raising (an Intel Xeon with
    torch 2.13 / 2.14, LeNet-5's 500-unit layer): retried in float64 too."""
    g = torch.Generator().manual_seed(8)
    r = torch.randn(30, 12, generator=g)
    m = r.T @ r
    real = torch.linalg.eigh
    calls = []

    def nan_in_float32(x, *a, **k):
        calls.append(x.dtype)
        d, q = real(x, *a, **k)
        return (d, torch.full_like(q, float("nan"))) if x.dtype == torch.float32 else (d, q)

    monkeypatch.setattr(torch.linalg, "eigh", nan_in_float32)
    d, q = eigen_basis(m)
    assert calls == [torch.float32, torch.float64] and d.dtype == q.dtype == torch.float32
    torch.testing.assert_close(q @ torch.diag(d) @ q.T, m, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(q.T @ q, torch.eye(12), rtol=0, atol=1e-5)


def test_eigen_basis_falls_back_to_float64_when_float32_eigh_fails(monkeypatch):
    """A float32 factor whose LAPACK factorisation does not converge (e.g. many dead units' zero rows)
    gets its basis from float64; the result is still an eigendecomposition of the factor."""
    g = torch.Generator().manual_seed(7)
    r = torch.randn(30, 12, generator=g)
    r[:, 5:] = 0.0  # seven dead units: zero rows and columns
    m = r.T @ r
    real = torch.linalg.eigh
    calls = []

    def flaky(x, *a, **k):
        calls.append(x.dtype)
        if x.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return real(x, *a, **k)

    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    d, q = eigen_basis(m)
    assert calls == [torch.float32, torch.float64]
    assert d.dtype == q.dtype == torch.float32
    torch.testing.assert_close(q @ torch.diag(d) @ q.T, m, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(q.T @ q, torch.eye(12), rtol=0, atol=1e-5)
    with pytest.raises(torch.linalg.LinAlgError):  # float64 failures are not hidden
        monkeypatch.setattr(torch.linalg, "eigh", lambda x, *a, **k: (_ for _ in ()).throw(
            torch.linalg.LinAlgError("no convergence")))
        eigen_basis(m.double())
