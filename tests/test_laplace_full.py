"""vmfdist.laplace.full: FullLaplace and its subnetwork form against laplace-torch 0.3's FullLaplace
and SubnetLaplace (hessian_structure="full"), and against dense algebra with Jacobians from
torch.autograd.functional.jacobian, in float64.

laplace-torch's default backend (CurvlinopsGGN) computes the full GGN as ``linop @ torch.eye(P)``
with a float32 identity, so curvlinops returns it in float32 (relative error ~1e-8 for a float64
model; shown in test_laplace_torch_default_full_ggn_is_float32).  The comparisons therefore use
laplace-torch's BackPACK backend (``backend=BackPackGGN``), which forms the same exact GGN in
float64; SubnetLaplace's own path (torch.func Jacobians) is exact already."""
import copy
import importlib.util
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vmfdist.laplace.full import FullLaplace

# the peer reference, imported when a test needs it (the dense-algebra tests run without it, and the
# processes of the distributed test do not pay for its import)
needs_laplace_torch = pytest.mark.skipif(importlib.util.find_spec("laplace") is None,
                                         reason="laplace-torch (pip install --no-deps -r "
                                         "benchmarks/requirements-kron.txt) is the reference")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread for this file: the tiny convolutions here run ~5x slower with two OpenMP
    threads on a loaded two-core machine (each small op waits for the busy second core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _peer():
    """laplace-torch's (FullLaplace, Laplace, BackPackGGN)."""
    from laplace import FullLaplace, Laplace
    from laplace.curvature import BackPackGGN
    return FullLaplace, Laplace, BackPackGGN

DT = torch.float64
RTOL = 1e-8  # the agreement asked for (observed ~1e-14, see the report in docs)


def _mlp(seed=0, n_out=3):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, n_out)).to(DT)  # 66 parameters (n_out 3)


def _cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 3, stride=2), nn.Flatten(),
                         nn.Linear(8, 4)).to(DT)  # 149 parameters


def _data(kind, likelihood, n=200, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 5, generator=g, dtype=DT) if kind == "mlp" else torch.randn(n, 2, 6, 6, generator=g, dtype=DT)
    K = 3 if kind == "mlp" else 4
    y = torch.randint(0, K, (n,), generator=g) if likelihood == "classification" else \
        torch.randn(n, K, generator=g, dtype=DT)
    return X, y


def _loader(X, y, batch_size=64):
    return DataLoader(TensorDataset(X, y), batch_size=batch_size)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _close(a, b, rtol=RTOL):
    return abs(float(a) - float(b)) <= rtol * abs(float(b))


def _model(kind):
    return _mlp() if kind == "mlp" else _cnn()


def _ref(model, likelihood, loader, subnet=None, **kw):
    """laplace-torch on a copy of the model (BackPACK extends the modules it sees)."""
    RefFullLaplace, RefLaplace, BackPackGGN = _peer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if subnet is None:
            ref = RefFullLaplace(copy.deepcopy(model), likelihood, backend=BackPackGGN, **kw)
        else:
            ref = RefLaplace(copy.deepcopy(model), likelihood, subset_of_weights="subnetwork", hessian_structure="full",
                             subnetwork_indices=subnet, **kw)
        ref.fit(loader)
    return ref


# ---------------------------------------------------------------------------- dense reference
def _dense_jacobians(model, X):
    """Per-example output Jacobians ``(N, K, P)`` (model.parameters() order) by
    torch.autograd.functional.jacobian, one example at a time."""
    names = [n for n, p in model.named_parameters()]
    values = tuple(p.detach() for p in model.parameters())
    rows = []
    for x in X:
        def f(*ps, x=x):
            return torch.func.functional_call(model, dict(zip(names, ps)), (x[None],))[0]
        J = torch.autograd.functional.jacobian(f, values)
        rows.append(torch.cat([j.reshape(j.shape[0], -1) for j in J], 1))
    return torch.stack(rows)


def _dense_ggn(model, X, likelihood):
    """``(sum_n J_n^T Lambda_n J_n, J)`` with the loss Hessian Lambda in the output formed by hand."""
    J = _dense_jacobians(model, X)
    with torch.no_grad():
        f = model(X)
    if likelihood == "classification":
        p = f.softmax(-1)
        Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    else:
        Lam = torch.eye(f.shape[1], dtype=DT).expand(f.shape[0], -1, -1)
    H = sum(J[n].T @ Lam[n] @ J[n] for n in range(len(X)))
    return H, J


def _dense_log_lik(model, X, y, likelihood, sigma=1.0, T=1.0):
    with torch.no_grad():
        f = model(X)
    if likelihood == "classification":
        return -torch.nn.functional.cross_entropy(f, y, reduction="sum") / T
    n, k = f.shape
    return -0.5 * (f - y).square().sum() / sigma ** 2 / T - n * k * math.log(sigma * math.sqrt(2 * math.pi))


# ---------------------------------------------------------------------------- laplace-torch's float32 GGN
@needs_laplace_torch
def test_laplace_torch_default_full_ggn_is_float32():
    """laplace-torch 0.3's default FullLaplace backend (curvlinops) returns the GGN of a float64
    model rounded through float32 (``linop @ torch.eye(P)``); ours and BackPACK's equal the dense GGN."""
    model = _mlp()
    X, y = _data("mlp", "classification")
    H_dense, _ = _dense_ggn(model, X, "classification")
    RefFullLaplace = _peer()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = RefFullLaplace(copy.deepcopy(model), "classification")
        default.fit(_loader(X, y))
    ours = FullLaplace(model, "classification")
    ours.fit(_loader(X, y))
    assert _rel(ours.H, H_dense) < 1e-13
    assert _rel(_ref(model, "classification", _loader(X, y)).H, H_dense) < 1e-13
    assert 1e-10 < _rel(default.H, H_dense) < 1e-6  # float32 rounding (observed 1.5e-8)


# ---------------------------------------------------------------------------- agreement with laplace-torch
CASES = [
    ("mlp", "classification", dict(prior_precision=0.7)),
    ("mlp", "classification", dict(prior_precision=0.7, temperature=0.5, prior_mean=0.1)),
    ("mlp", "regression", dict(prior_precision=0.7, sigma_noise=0.8)),
    ("mlp", "regression", dict(prior_precision=2.0, sigma_noise=1.3, temperature=1.7, prior_mean=-0.2)),
    ("cnn", "classification", dict(prior_precision=0.5)),
    ("cnn", "regression", dict(prior_precision=1.5, sigma_noise=0.6)),
]


@needs_laplace_torch
@pytest.mark.parametrize("kind,likelihood,kw", CASES)
def test_posterior_and_marglik_match_laplace_torch(kind, likelihood, kw):
    model = _model(kind)
    X, y = _data(kind, likelihood)
    ref = _ref(model, likelihood, _loader(X, y), **kw)
    ours = FullLaplace(model, likelihood, **kw)
    ours.fit(_loader(X, y))
    assert ours.n_params == ref.n_params and ours.n_layers == ref.n_layers and torch.equal(ours.mean, ref.mean)
    assert _rel(ours.H, ref.H) < RTOL
    assert _rel(ours.posterior_precision, ref.posterior_precision) < RTOL
    assert _rel(ours.posterior_covariance, ref.posterior_covariance) < RTOL
    assert _rel(ours.posterior_scale, ref.posterior_scale) < RTOL
    assert _close(ours.log_likelihood, ref.log_likelihood)
    g = torch.Generator().manual_seed(4)
    per_layer = 0.2 + 2 * torch.rand(ours.n_layers, generator=g, dtype=DT)
    per_param = 0.2 + 2 * torch.rand(ours.n_params, generator=g, dtype=DT)
    for pp in (None, 0.05, 30.0, per_layer, per_param):
        a = ref.log_marginal_likelihood(prior_precision=pp)
        b = ours.log_marginal_likelihood(prior_precision=pp)
        assert _close(b, a), (pp, float(a), float(b))
        assert _close(ours.log_det_posterior_precision, ref.log_det_posterior_precision)
        assert _rel(ours.prior_precision_diag, ref.prior_precision_diag) < 1e-15
    if likelihood == "regression":
        for s in (0.3, 2.5):
            a = ref.log_marginal_likelihood(sigma_noise=torch.tensor(s, dtype=DT))
            b = ours.log_marginal_likelihood(sigma_noise=torch.tensor(s, dtype=DT))
            assert _close(b, a)


@needs_laplace_torch
@pytest.mark.parametrize("kind,likelihood,kw", [CASES[1], CASES[3], CASES[4], CASES[5]])
def test_glm_predictive_matches_laplace_torch(kind, likelihood, kw):
    model = _model(kind)
    X, y = _data(kind, likelihood)
    ref = _ref(model, likelihood, _loader(X, y), **kw)
    ours = FullLaplace(model, likelihood, **kw)
    ours.fit(_loader(X, y))
    ref.prior_precision = ours.prior_precision = 0.3 + torch.arange(ours.n_layers, dtype=DT)  # per layer
    Xt = _data(kind, likelihood, n=9, seed=5)[0]
    fa, fb = ref._glm_predictive_distribution(Xt), ours._glm_predictive_distribution(Xt)
    assert _rel(fb[0], fa[0]) < RTOL and _rel(fb[1], fa[1]) < RTOL and fb[1].shape == fa[1].shape
    if likelihood == "classification":
        for link in ("probit", "bridge", "bridge_norm"):
            assert _rel(ours(Xt, link_approx=link), ref(Xt, link_approx=link)) < RTOL, link
    else:
        (ma, va), (mb, vb) = ref(Xt), ours(Xt)
        assert _rel(mb, ma) < RTOL and _rel(vb, va) < RTOL
        (ma, ca), (mb, cb) = ref(Xt, joint=True), ours(Xt, joint=True)
        assert _rel(mb, ma) < RTOL and _rel(cb, ca) < RTOL and cb.shape == ca.shape
        assert _rel(ours(Xt, diagonal_output=True)[1], ref(Xt, diagonal_output=True)[1]) < RTOL
    Js, _ = ref.backend.jacobians(Xt)
    assert _rel(ours.functional_variance(Js), ref.functional_variance(Js)) < RTOL
    assert _rel(ours.functional_covariance(Js), ref.functional_covariance(Js)) < RTOL
    ours.glm_chunk_elements = 1  # one example per Jacobian pass: the same numbers
    assert _rel(ours._glm_predictive_distribution(Xt)[1], fa[1]) < RTOL


@needs_laplace_torch
@pytest.mark.parametrize("structure", ["scalar", "layerwise", "diag"])
def test_marglik_prior_optimisation_matches_laplace_torch(structure):
    model = _mlp()
    X, y = _data("mlp", "classification")
    ref = _ref(model, "classification", _loader(X, y))
    ours = FullLaplace(model, "classification")
    ours.fit(_loader(X, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.optimize_prior_precision(method="marglik", n_steps=30, prior_structure=structure)
    ours.optimize_prior_precision(method="marglik", n_steps=30, prior_structure=structure)
    assert ours.prior_precision.shape == ref.prior_precision.shape
    assert _rel(ours.prior_precision, ref.prior_precision) < RTOL


@needs_laplace_torch
def test_samples_and_mc_predictive_moments():
    """Posterior draws: mean and covariance within 5 standard errors of laplace-torch's mean and
    P^-1; GLM function draws against the closed-form (f_mu, f_var); the mc link against
    laplace-torch's mc link (both random: the standard errors of both)."""
    model = _mlp()
    X, y = _data("mlp", "regression")
    ref = _ref(model, "regression", _loader(X, y), prior_precision=3.0, sigma_noise=0.5)
    ours = FullLaplace(model, "regression", prior_precision=3.0, sigma_noise=0.5)
    ours.fit(_loader(X, y))
    n = 40_000
    s = ours.sample(n, generator=torch.Generator().manual_seed(0))
    S = ref.posterior_covariance
    sd = S.diagonal().sqrt()
    assert float(((s.mean(0) - ref.mean).abs() / (sd / math.sqrt(n))).max()) < 5
    C = torch.cov(s.T)
    se = ((S.diagonal()[:, None] * S.diagonal()[None, :] + S.square()) / n).sqrt()
    assert float(((C - S).abs() / se).max()) < 5
    Xt = _data("mlp", "regression", n=4, seed=6)[0]
    f_mu, f_var = ref._glm_predictive_distribution(Xt)
    fs = ours.functional_samples(Xt, n_samples=n, generator=torch.Generator().manual_seed(1))
    v = f_var.diagonal(dim1=-2, dim2=-1)
    assert float(((fs.mean(0) - f_mu).abs() / (v / n).sqrt()).max()) < 5
    cov = torch.einsum("sbi,sbj->bij", fs - fs.mean(0), fs - fs.mean(0)) / (n - 1)
    se = ((v[:, :, None] * v[:, None, :] + f_var.square()) / n).sqrt()
    assert float(((cov - f_var).abs() / se).max()) < 5
    # classification: the mc link averages softmax draws; laplace-torch's draws come from the global RNG
    model = _mlp()
    X, y = _data("mlp", "classification")
    ref = _ref(model, "classification", _loader(X, y), prior_precision=0.2)
    ours = FullLaplace(model, "classification", prior_precision=0.2)
    ours.fit(_loader(X, y))
    Xt = _data("mlp", "classification", n=5, seed=7)[0]
    torch.manual_seed(3)
    pa = ref.predictive_samples(Xt, n_samples=n)
    pb = ours.predictive_samples(Xt, n_samples=n, generator=torch.Generator().manual_seed(2))
    se = (pa.var(0) / n + pb.var(0) / n).sqrt()
    assert float(((pa.mean(0) - pb.mean(0)).abs() / se).max()) < 5
    assert torch.equal(ours(Xt, link_approx="mc", n_samples=n, generator=torch.Generator().manual_seed(2)),
                       pb.mean(0))


# ---------------------------------------------------------------------------- subnetwork Laplace
def _subnet(n_params, k, seed=0):
    """``k`` distinct indices in random (unsorted) order."""
    return torch.randperm(n_params, generator=torch.Generator().manual_seed(seed))[:k]


@needs_laplace_torch
@pytest.mark.parametrize("kind,likelihood,kw", [CASES[1], CASES[3], CASES[4]])
def test_subnetwork_matches_laplace_torch(kind, likelihood, kw):
    model = _model(kind)
    X, y = _data(kind, likelihood)
    idx = _subnet(sum(p.numel() for p in model.parameters()), 30)
    kw = {k: v for k, v in kw.items() if k != "prior_mean"} | dict(prior_mean=0.1)  # laplace-torch: scalar only
    ref = _ref(model, likelihood, _loader(X, y), subnet=idx, **kw)
    ours = FullLaplace(model, likelihood, subnetwork_indices=idx, **kw)
    ours.fit(_loader(X, y))
    assert ours.n_params_subnet == ref.n_params_subnet == 30 and torch.equal(ours.mean_subnet, ref.mean_subnet)
    assert _rel(ours.H, ref.H) < RTOL
    assert _rel(ours.posterior_precision, ref.posterior_precision) < RTOL
    assert _rel(ours.posterior_covariance, ref.posterior_covariance) < RTOL
    for pp in (None, 0.05, 30.0):
        a, b = ref.log_marginal_likelihood(prior_precision=pp), ours.log_marginal_likelihood(prior_precision=pp)
        assert _close(b, a), (pp, float(a), float(b))
    Xt = _data(kind, likelihood, n=7, seed=5)[0]
    fa, fb = ref._glm_predictive_distribution(Xt), ours._glm_predictive_distribution(Xt)
    assert _rel(fb[0], fa[0]) < RTOL and _rel(fb[1], fa[1]) < RTOL
    if likelihood == "classification":
        assert _rel(ours(Xt), ref(Xt)) < RTOL
    Js, _ = ref.backend.jacobians(Xt)  # the subnetwork's columns
    assert _rel(ours.functional_variance(Js), ref.functional_variance(Js)) < RTOL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.optimize_prior_precision(method="marglik", n_steps=20)
    ours.optimize_prior_precision(method="marglik", n_steps=20)
    assert _rel(ours.prior_precision, ref.prior_precision) < RTOL
    # draws: the coordinates outside the subnetwork stay at the MAP, the others have covariance P^-1
    n = 20_000
    s = ours.sample(n, generator=torch.Generator().manual_seed(0))
    out = torch.ones(ours.n_params, dtype=torch.bool)
    out[idx] = False
    assert torch.equal(s[:, out], ours.mean[out].expand(n, -1))
    S = ref.posterior_covariance
    se = ((S.diagonal()[:, None] * S.diagonal()[None, :] + S.square()) / n).sqrt()
    assert float(((torch.cov(s[:, idx].T) - S).abs() / se).max()) < 5


@needs_laplace_torch
def test_subnetwork_priors_laplace_torch_refuses_against_dense():
    """laplace-torch's SubnetLaplace accepts only a scalar prior: a per-parameter prior of the
    subnetwork's length is refused by the prior setter and a per-layer one by prior_precision_diag.
    Ours take both (per-layer: each coordinate gets its parameter tensor's value) and a full-length
    prior mean; checked against dense algebra."""
    model = _mlp()
    X, y = _data("mlp", "regression")
    idx = _subnet(66, 25, seed=3)
    ref = _ref(model, "regression", _loader(X, y), subnet=idx, sigma_noise=0.7)
    per_param = 0.3 + torch.rand(25, generator=torch.Generator().manual_seed(1), dtype=DT)
    per_layer = torch.tensor([0.4, 1.1, 0.8, 2.0], dtype=DT)
    with pytest.raises(ValueError, match="Length of prior precision does not align"):
        ref.prior_precision = per_param
    with pytest.raises(ValueError, match="Mismatch of prior and model"):
        ref.log_marginal_likelihood(prior_precision=per_layer)
    prior_mean = 0.05 * torch.randn(66, generator=torch.Generator().manual_seed(2), dtype=DT)
    ours = FullLaplace(model, "regression", sigma_noise=0.7, temperature=0.9, subnetwork_indices=idx,
                       prior_mean=prior_mean)
    ours.fit(_loader(X, y))
    H, _ = _dense_ggn(model, X, "regression")
    H = H[idx][:, idx]
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    d = (theta - prior_mean)[idx]
    owner = torch.repeat_interleave(torch.arange(4), torch.tensor([35, 7, 21, 3]))[idx]
    for pp, p0 in ((per_param, per_param), (per_layer, per_layer[owner])):
        P = H / (0.7 ** 2 * 0.9) + torch.diag(p0)
        lml = _dense_log_lik(model, X, y, "regression", 0.7, 0.9) - 0.5 * (
            torch.linalg.slogdet(P)[1] - p0.log().sum() + d @ (p0 * d))
        assert _close(ours.log_marginal_likelihood(prior_precision=pp), lml, 1e-10)
        assert _rel(ours.posterior_precision, P) < 1e-12


@needs_laplace_torch
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_last_layer_matches_laplace_torch_full_ll(likelihood):
    """subset_of_weights="last_layer" against laplace-torch's FullLLLaplace (BackPACK backend: exact GGN)."""
    _, RefLaplace, BackPackGGN = _peer()
    model = _mlp()
    X, y = _data("mlp", likelihood)
    kw = dict(prior_precision=0.7) | (dict(sigma_noise=0.8) if likelihood == "regression" else {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = RefLaplace(copy.deepcopy(model), likelihood, subset_of_weights="last_layer", hessian_structure="full",
                         backend=BackPackGGN, **kw)
        ref.fit(_loader(X, y))
    ours = FullLaplace(model, likelihood, subset_of_weights="last_layer", **kw)
    ours.fit(_loader(X, y))
    assert ours.last_layer_name == "2" and ours.n_params == ref.n_params == 24
    assert _rel(ours.H, ref.H) < RTOL
    for pp in (None, 0.05, 30.0):
        assert _close(ours.log_marginal_likelihood(prior_precision=pp), ref.log_marginal_likelihood(prior_precision=pp))
    Xt = X[:7]
    fa, fb = ref._glm_predictive_distribution(Xt), ours._glm_predictive_distribution(Xt)
    assert _rel(fb[0], fa[0]) < RTOL and _rel(fb[1], fa[1]) < RTOL
    by_mask = FullLaplace(model, likelihood, subset_of_weights="subnetwork", subnetwork_indices=torch.arange(42, 66),
                          **kw)
    by_mask.fit(_loader(X, y))
    assert by_mask.subset_of_weights == "subnetwork" and _rel(by_mask.H, ours.H) < 1e-13


# ---------------------------------------------------------------------------- dense algebra
@pytest.mark.parametrize("kind,likelihood", [("mlp", "classification"), ("mlp", "regression"),
                                             ("cnn", "classification")])
def test_against_dense_jacobians(kind, likelihood):
    """The GGN, evidence (per-layer prior, temperature, noise, prior mean), GLM variances and log_prob
    against sum_n J_n^T Lambda_n J_n from per-example torch.autograd.functional.jacobian."""
    model = _model(kind)
    X, y = _data(kind, likelihood, n=120 if kind == "mlp" else 60)
    sigma, T = (0.7, 0.8) if likelihood == "regression" else (1.0, 0.8)
    pp = 0.3 + torch.arange(4 if kind == "mlp" else 6, dtype=DT) / 2
    extra = dict(sigma_noise=sigma) if likelihood == "regression" else {}
    la = FullLaplace(model, likelihood, prior_precision=pp, temperature=T, prior_mean=0.05, **extra)
    la.fit(_loader(X, y, batch_size=50))
    H, _ = _dense_ggn(model, X, likelihood)
    assert _rel(la.H, H) < 1e-12
    p0 = la.prior_precision_diag
    assert torch.equal(p0, torch.cat([v * torch.ones(p.numel(), dtype=DT) for v, p in zip(pp, model.parameters())]))
    P = H / (sigma ** 2 * T) + torch.diag(p0)
    theta = la.mean
    lml = _dense_log_lik(model, X, y, likelihood, sigma, T) - 0.5 * (
        torch.linalg.slogdet(P)[1] - p0.log().sum() + (theta - 0.05) @ (p0 * (theta - 0.05)))
    assert _close(la.log_marginal_likelihood(), lml, 1e-10)
    Xt = _data(kind, likelihood, n=6, seed=7)[0]
    J = _dense_jacobians(model, Xt)
    assert _rel(la._glm_predictive_distribution(Xt)[1], J @ torch.linalg.solve(P, J.transpose(1, 2))) < 1e-10
    v = theta + 0.01 * torch.randn(theta.shape, dtype=DT, generator=torch.Generator().manual_seed(2))
    mvn = torch.distributions.MultivariateNormal(theta, precision_matrix=P)
    assert _close(la.log_prob(v), mvn.log_prob(v), 1e-10)
    post = la.posterior()["all"]
    assert _rel(post.covariance_matrix, torch.linalg.inv(P)) < 1e-10


def test_subnetwork_and_modules_against_dense():
    """A subnetwork's GGN is the dense GGN's sub-matrix in the order of the indices; modules=[last
    layer] is the subnetwork of that layer's coordinates; log_prob counts the subnetwork's
    dimension only."""
    model = _mlp()
    X, y = _data("mlp", "classification", n=150)
    H, _ = _dense_ggn(model, X, "classification")
    idx = _subnet(66, 20, seed=5)
    sub = FullLaplace(model, "classification", subnetwork_indices=idx, prior_precision=0.4)
    sub.fit(_loader(X, y))
    assert _rel(sub.H, H[idx][:, idx]) < 1e-12
    one_by_one = FullLaplace(model, "classification", subnetwork_indices=idx, prior_precision=0.4)
    one_by_one.glm_chunk_elements = 1  # one example per Jacobian pass in fit
    one_by_one.fit(_loader(X, y))
    assert _rel(one_by_one.H, sub.H) < 1e-13 and _close(one_by_one.loss, sub.loss, 1e-13)
    P = H[idx][:, idx] + 0.4 * torch.eye(20, dtype=DT)
    v = sub.mean + 0.01 * torch.randn(66, dtype=DT, generator=torch.Generator().manual_seed(3))
    mvn = torch.distributions.MultivariateNormal(sub.mean[idx], precision_matrix=P)
    assert _close(sub.log_prob(v), mvn.log_prob(v[idx]), 1e-10)
    last = torch.arange(42, 66)
    by_layer = FullLaplace(model, "classification", modules=["2"], prior_precision=0.4)
    by_layer.fit(_loader(X, y))
    by_index = FullLaplace(model, "classification", subnetwork_indices=last, prior_precision=0.4)
    by_index.fit(_loader(X, y))
    assert by_layer.n_params == 24 and _rel(by_layer.H, H[42:, 42:]) < 1e-12
    assert _close(by_layer.log_marginal_likelihood(), by_index.log_marginal_likelihood(), 1e-12)
    Xt = X[:5]
    assert _rel(by_layer(Xt), by_index(Xt)) < 1e-12


@needs_laplace_torch
def test_fit_without_override_adds_the_data():
    model = _mlp()
    X, y = _data("mlp", "classification")
    whole = FullLaplace(model, "classification", prior_precision=0.3)
    whole.fit(_loader(X, y))
    parts = FullLaplace(model, "classification", prior_precision=0.3)
    parts.fit(_loader(X[:120], y[:120]))
    parts.fit(_loader(X[120:], y[120:]), override=False)
    assert parts.n_data == 200 and _rel(parts.H, whole.H) < 1e-13
    assert _close(parts.log_marginal_likelihood(), whole.log_marginal_likelihood(), 1e-12)
    RefFullLaplace, _, BackPackGGN = _peer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = RefFullLaplace(copy.deepcopy(model), "classification", prior_precision=0.3, backend=BackPackGGN)
        ref.fit(_loader(X[:120], y[:120]))
        ref.fit(_loader(X[120:], y[120:]), override=False)
    assert ref.n_data == 200 and _close(parts.log_marginal_likelihood(), ref.log_marginal_likelihood())


def test_failed_fit_changes_nothing_and_names_the_parameter():
    model = _mlp()
    X, y = _data("mlp", "classification")
    la = FullLaplace(model, "classification", prior_precision=0.5)
    la.fit(_loader(X, y))
    before = (float(la.log_marginal_likelihood()), la(X[:5]).clone(), la.n_data, la.H.clone())
    with pytest.raises(ValueError, match=r"lie in \[0, 3\)"):
        la.fit(_loader(X, y + 1))
    X_nan = X.clone()
    X_nan[-1, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="GGN of parameter '0.weight' is not finite"):
        la.fit(_loader(X_nan, y), override=False)
    assert float(la.log_marginal_likelihood()) == before[0] and torch.equal(la(X[:5]), before[1])
    assert la.n_data == before[2] and torch.equal(la.H, before[3])


def test_enable_backprop_gives_input_gradients():
    model = _mlp(n_out=2)
    X, y = _data("mlp", "regression", n=40)
    y = y[:, :2]
    la = FullLaplace(model, "regression", prior_precision=0.5, enable_backprop=True,
                     subnetwork_indices=_subnet(sum(p.numel() for p in model.parameters()), 20))
    la.fit(_loader(X, y))
    assert torch.autograd.gradcheck(lambda x: la(x), (X[:3].clone().requires_grad_(True),))


# ---------------------------------------------------------------------------- bad input
def test_bad_input_is_named():
    model = _mlp()
    with pytest.raises(ValueError, match="prior_precision must hold 1 value.*one per block"):
        FullLaplace(model, "classification", prior_precision=torch.ones(5, dtype=DT))
    with pytest.raises(ValueError, match="prior_precision must be a scalar or a 1-d tensor"):
        FullLaplace(model, "classification", prior_precision=torch.ones(2, 2, dtype=DT))
    with pytest.raises(ValueError, match="prior_precision must be finite and positive"):
        FullLaplace(model, "classification", prior_precision=torch.full((66,), -1.0, dtype=DT))
    idx = torch.arange(10)
    with pytest.raises(ValueError, match="prior_precision must hold 1 value.*one per parameter \\(10\\)"):
        FullLaplace(model, "classification", subnetwork_indices=idx, prior_precision=torch.ones(66, dtype=DT))
    for bad, msg in [(torch.tensor([0, 66]), r"subnetwork_indices must lie in \[0, n_params = 66\)"),
                     (torch.tensor([-1, 3]), "subnetwork_indices must lie in"),
                     (torch.tensor([1, 2, 2]), "subnetwork_indices must not contain duplicates"),
                     (torch.tensor([1.0, 2.0]), "subnetwork_indices must hold integer indices"),
                     (torch.tensor([True, False]), "subnetwork_indices must hold integer indices"),
                     (torch.zeros(2, 2, dtype=torch.long), "subnetwork_indices must be a non-empty 1-d"),
                     (torch.zeros(0, dtype=torch.long), "subnetwork_indices must be a non-empty 1-d"),
                     ([1, 2], "subnetwork_indices must be a 1-d integer tensor")]:
        with pytest.raises(ValueError, match=msg):
            FullLaplace(model, "classification", subnetwork_indices=bad)
    with pytest.raises(ValueError, match=r"P = 66 parameters; its dense P x P precision needs 34848 bytes.*"
                                         r"max_size = 50"):
        FullLaplace(model, "classification", max_size=50)
    assert FullLaplace(model, "classification", max_size=50, subnetwork_indices=idx).n_params_subnet == 10
    with pytest.raises(ValueError, match="subset_of_weights='subnetwork' needs subnetwork_indices"):
        FullLaplace(model, "classification", subset_of_weights="subnetwork")
    with pytest.raises(ValueError, match="max_size must be a positive int or None"):
        FullLaplace(model, "classification", max_size=0)
    with pytest.raises(NotImplementedError, match="no Kronecker factors"):
        FullLaplace.from_curvature(model, "classification", {})
    la = FullLaplace(model, "classification", subnetwork_indices=idx)
    X, y = _data("mlp", "classification", n=30)
    with pytest.raises(RuntimeError, match="not fitted"):
        la.log_marginal_likelihood()
    la.fit(_loader(X, y))
    with pytest.raises(ValueError, match=r"Js must have shape \(batch, outputs, 10\) \(the posterior.s coordinates\)"):
        la.functional_variance(torch.zeros(2, 3, 66, dtype=DT))
    with pytest.raises(ValueError, match="prior_structure must be one of"):
        la.optimize_prior_precision(prior_structure="kron")
    with pytest.raises(ValueError, match="train_loader yielded no data"):
        la.fit(_loader(X[:0], y[:0]))


# ---------------------------------------------------------------------------- saving and distributed fits
def test_state_dict_and_pickle_round_trip(tmp_path):
    model = _mlp()
    X, y = _data("mlp", "regression", n=60)
    idx = _subnet(66, 15)
    la = FullLaplace(model, "regression", sigma_noise=0.6, prior_precision=0.8, subnetwork_indices=idx)
    la.fit(_loader(X, y))
    Xt = X[:4]
    lml, pred = la.log_marginal_likelihood(), la(Xt)
    torch.save(la.state_dict(), tmp_path / "la.pt")
    back = FullLaplace(model, "regression", subnetwork_indices=idx)
    back.load_state_dict(torch.load(tmp_path / "la.pt"))
    assert float(back.log_marginal_likelihood()) == float(lml) and torch.equal(back(Xt)[1], pred[1])
    torch.save(la, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    assert float(whole.log_marginal_likelihood()) == float(lml) and torch.equal(whole(Xt)[1], pred[1])
    with pytest.raises(ValueError, match="subnetwork_indices differ"):
        FullLaplace(model, "regression").load_state_dict(la.state_dict())
    with pytest.raises(ValueError, match="likelihood is 'classification' here"):
        FullLaplace(model, "classification", subnetwork_indices=idx).load_state_dict(la.state_dict())


def _dist_worker(rank, world, init_file, out_dir):
    import os
    import sys

    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model = _mlp()
        X, y = _data("mlp", "classification", n=60)
        shard = slice(rank * 30, (rank + 1) * 30)
        for name, kw in (("full", {}), ("subnet", dict(subnetwork_indices=_subnet(66, 20)))):
            la = FullLaplace(model, "classification", prior_precision=0.5, **kw)
            la.fit(_loader(X[shard], y[shard], batch_size=13), distributed=True)
            torch.save({"H": la.H, "lml": la.log_marginal_likelihood(), "n": la.n_data},
                       os.path.join(out_dir, f"{name}-{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_distributed_fit_equals_one_process(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_dist_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    model = _mlp()
    X, y = _data("mlp", "classification", n=60)
    for name, kw in (("full", {}), ("subnet", dict(subnetwork_indices=_subnet(66, 20)))):
        la = FullLaplace(model, "classification", prior_precision=0.5, **kw)
        la.fit(_loader(X, y))
        for rank in (0, 1):
            got = torch.load(tmp_path / f"{name}-{rank}.pt")
            assert got["n"] == 60 and _rel(got["H"], la.H) < 1e-13
            assert _close(got["lml"], la.log_marginal_likelihood(), 1e-12)
    with pytest.raises(ValueError, match="distributed=True needs an initialised torch.distributed process group"):
        FullLaplace(model, "classification").fit(_loader(X, y), distributed=True)
