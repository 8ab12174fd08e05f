"""vmfdist.laplace: KFACLaplace / EKFACLaplace against laplace-torch's KronLaplace (same
models, float64) and against dense linear algebra (exact GGN from torch.func Jacobians,
dense inverse precision, sample covariances with standard-error tolerances)."""
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vmfdist.laplace import EKFACLaplace, KFACLaplace, Laplace

try:  # the peer reference; the dense-algebra tests below run without it
    from laplace import KronLaplace
except ImportError:  # pragma: no cover - depends on the environment
    KronLaplace = None
needs_laplace_torch = pytest.mark.skipif(KronLaplace is None, reason="laplace-torch (pip install --no-deps -r "
                                         "benchmarks/requirements-kron.txt) is the reference")

DT = torch.float64
RTOL = 1e-8  # the agreement the issue asks for (observed: ~1e-15)


def _mlp(n_in=5, n_hidden=7, n_out=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, n_hidden), nn.Tanh(), nn.Linear(n_hidden, n_out)).to(DT)


def _cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 3, stride=2), nn.Flatten(),
                         nn.Linear(8, 4)).to(DT)


def _data(likelihood, n=40, n_in=5, n_out=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, n_in, generator=g, dtype=DT)
    y = torch.randint(0, n_out, (n,), generator=g) if likelihood == "classification" else \
        torch.randn(n, n_out, generator=g, dtype=DT)
    return X, y


def _loader(X, y, batch_size=16):  # 40 examples in batches of 16, 16, 8
    return DataLoader(TensorDataset(X, y), batch_size=batch_size)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _pair(model, likelihood, loader, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = KronLaplace(model, likelihood, **kw)
        ref.fit(loader)
    ours = KFACLaplace(model, likelihood, **kw)
    ours.fit(loader)
    return ref, ours


CASES = [
    ("classification", dict(prior_precision=0.7)),
    ("classification", dict(prior_precision=0.7, temperature=0.5, prior_mean=0.1)),
    ("regression", dict(prior_precision=0.7, sigma_noise=0.8)),
    ("regression", dict(prior_precision=2.0, sigma_noise=1.3, temperature=1.7, prior_mean=-0.2)),
]


# ---------------------------------------------------------------------------- laplace-torch agreement
@needs_laplace_torch
@pytest.mark.parametrize("likelihood,kw", CASES)
def test_factors_and_marglik_match_laplace_torch(likelihood, kw):
    model = _mlp()
    X, y = _data(likelihood)
    ref, ours = _pair(model, likelihood, _loader(X, y), **kw)
    # the Kronecker factors, block by block (laplace-torch: [G, A] for weights, [G] for biases)
    assert len(ref.H_facs.kfacs) == len(ours.blocks) == ours.n_layers
    # (laplace-torch spreads the regression loss's factor 1/2 as sqrt(1/2) over both factors)
    for F, b in zip(ref.H_facs.kfacs, ours.blocks):
        ref_block = torch.kron(F[0], F[1]) if len(F) == 2 else F[0]
        assert _rel(torch.kron(b.factor.G, b.factor.A), ref_block) < 1e-12
    assert ours.n_params == ref.n_params and torch.equal(ours.mean, ref.mean)
    assert abs(float(ours.log_likelihood - ref.log_likelihood)) <= RTOL * abs(float(ref.log_likelihood))
    for pp in (None, 0.05, 30.0, torch.tensor([0.3, 2.0, 1.5, 0.9], dtype=DT)):
        a = ref.log_marginal_likelihood(prior_precision=pp)
        b = ours.log_marginal_likelihood(prior_precision=pp)
        assert abs(float(a - b)) <= RTOL * abs(float(a)), (pp, float(a), float(b))
        assert abs(float(ours.log_det_posterior_precision - ref.log_det_posterior_precision)) <= \
            RTOL * abs(float(ref.log_det_posterior_precision))
    if likelihood == "regression":
        for s in (0.3, 2.5):
            a = ref.log_marginal_likelihood(sigma_noise=torch.tensor(s, dtype=DT))
            b = ours.log_marginal_likelihood(sigma_noise=torch.tensor(s, dtype=DT))
            assert abs(float(a - b)) <= RTOL * abs(float(a))


@needs_laplace_torch
@pytest.mark.parametrize("likelihood,kw", CASES)
def test_glm_predictive_matches_laplace_torch(likelihood, kw):
    model = _mlp()
    X, y = _data(likelihood)
    ref, ours = _pair(model, likelihood, _loader(X, y), **kw)
    Xt = _data(likelihood, n=9, seed=5)[0]
    fa = ref._glm_predictive_distribution(Xt)
    fb = ours._glm_predictive_distribution(Xt)
    assert _rel(fb[0], fa[0]) < RTOL and _rel(fb[1], fa[1]) < RTOL
    if likelihood == "classification":
        for link in ("probit", "bridge", "bridge_norm"):
            assert _rel(ours(Xt, link_approx=link), ref(Xt, link_approx=link)) < RTOL, link
    else:
        (ma, va), (mb, vb) = ref(Xt), ours(Xt)
        assert _rel(mb, ma) < RTOL and _rel(vb, va) < RTOL and vb.shape == (9, 3, 3)
        (ma, ca), (mb, cb) = ref(Xt, joint=True), ours(Xt, joint=True)
        assert _rel(mb, ma) < RTOL and _rel(cb, ca) < RTOL and cb.shape == (27, 27)
        assert _rel(ours(Xt, diagonal_output=True)[1], ref(Xt, diagonal_output=True)[1]) < RTOL
    # the same from full Jacobians (laplace-torch's functional_variance interface)
    Js, _ = ref.backend.jacobians(Xt)
    assert _rel(ours.functional_variance(Js), ref.functional_variance(Js)) < RTOL


@needs_laplace_torch
@pytest.mark.parametrize("kfac_approx", ["expand", "reduce"])
def test_conv_net_matches_laplace_torch(kfac_approx):
    model = _cnn()
    g = torch.Generator().manual_seed(3)
    X = torch.randn(24, 2, 6, 6, generator=g, dtype=DT)
    y = torch.randint(0, 4, (24,), generator=g)
    loader = _loader(X, y, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = KronLaplace(model, "classification", prior_precision=0.5, asdl_fisher_kwargs={"kfac_approx": kfac_approx})
        ref.fit(loader)
    ours = KFACLaplace(model, "classification", prior_precision=0.5, kfac_approx=kfac_approx)
    ours.fit(loader)
    a, b = ref.log_marginal_likelihood(), ours.log_marginal_likelihood()
    assert abs(float(a - b)) <= RTOL * abs(float(a))
    assert _rel(ours(X[:5]), ref(X[:5])) < RTOL
    assert _rel(ours._glm_predictive_distribution(X[:5])[1], ref._glm_predictive_distribution(X[:5])[1]) < RTOL
    ours.glm_chunk_elements = 1  # one example at a time: the same numbers
    assert _rel(ours(X[:5]), ref(X[:5])) < RTOL


@needs_laplace_torch
@pytest.mark.parametrize("structure", ["scalar", "layerwise"])
def test_marglik_prior_optimisation_matches_laplace_torch(structure):
    model = _mlp()
    X, y = _data("classification")
    ref, ours = _pair(model, "classification", _loader(X, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.optimize_prior_precision(method="marglik", n_steps=30, prior_structure=structure)
    ours.optimize_prior_precision(method="marglik", n_steps=30, prior_structure=structure)
    assert ours.prior_precision.shape == ref.prior_precision.shape
    assert _rel(ours.prior_precision, ref.prior_precision) < RTOL


@needs_laplace_torch
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_gridsearch_matches_laplace_torch(likelihood):
    """Same grid, same validation loss (a callable: laplace-torch's default torchmetrics metric is
    not reset between grid values, so its running average mixes them)."""
    model = _mlp()
    X, y = _data(likelihood)
    Xv, yv = _data(likelihood, n=30, seed=9)
    ref, ours = _pair(model, likelihood, _loader(X, y), **({"sigma_noise": 0.3} if likelihood == "regression" else {}))
    if likelihood == "classification":
        def loss(p, t):
            return -p.log().gather(1, t[:, None]).mean()
    else:
        def loss(*args):  # laplace-torch calls loss(mean, var, y), ours loss((mean, var), y)
            (m, v), t = (args[0], args[1]) if len(args) == 2 else ((args[0], args[1]), args[2])
            v = v.diagonal(dim1=-2, dim2=-1) + 0.09
            return (0.5 * (v.log() + (t - m).square() / v)).mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.optimize_prior_precision(method="gridsearch", val_loader=_loader(Xv, yv), grid_size=21, loss=loss)
    ours.optimize_prior_precision(method="gridsearch", val_loader=_loader(Xv, yv), grid_size=21, loss=loss)
    assert _rel(ours.prior_precision, ref.prior_precision) < RTOL


def test_laplace_factory():
    """laplace-torch's defaults: the K-FAC Laplace of the last layer (tests/test_laplace_subsets.py
    compares the numbers)."""
    model = _mlp()
    la = Laplace(model, "classification")
    assert type(la) is KFACLaplace and la.subset_of_weights == "last_layer" and la.last_layer_name == "2"
    assert la.n_params == 3 * 7 + 3
    la = Laplace(model, "regression", "all", "ekfac", sigma_noise=0.5)
    assert type(la) is EKFACLaplace and la.n_params == sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="hessian_structure must be one of .*'lowrank' is laplace-torch's"):
        Laplace(model, "classification", hessian_structure="lowrank")
    with pytest.raises(ValueError, match="subset_of_weights must be one of"):
        Laplace(model, "classification", subset_of_weights="first_layer")


def test_gridsearch_picks_the_best_validation_nll():
    model = _mlp()
    X, y = _data("classification")
    Xv, yv = _data("classification", n=30, seed=9)
    la = KFACLaplace(model, "classification")
    la.fit(_loader(X, y))
    la.optimize_prior_precision(method="gridsearch", val_loader=_loader(Xv, yv), grid_size=7)
    chosen = float(la.prior_precision)
    nll = {}
    for pp in torch.logspace(-4, 4, 7):
        la.prior_precision = float(pp)
        p = la(Xv)
        nll[float(pp)] = float(-p.log().gather(1, yv[:, None]).mean())
    assert nll[chosen] == min(nll.values())


# ---------------------------------------------------------------------------- dense references
def _dense_ggn(model, X, likelihood):
    """Exact GGN sum_n J_n^T Lambda_n J_n by torch.func (parameter order of model.parameters())."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, x):
        return torch.func.functional_call(model, p, (x[None],))[0]

    J = torch.func.vmap(torch.func.jacrev(f), in_dims=(None, 0))(params, X)
    J = torch.cat([j.flatten(2) for j in J.values()], 2)  # (N, K, P)
    out = model(X).detach()
    if likelihood == "classification":
        p = out.softmax(-1)
        Lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    else:
        Lam = torch.eye(out.shape[1], dtype=DT).expand(out.shape[0], -1, -1)
    return torch.einsum("nkp,nkl,nlq->pq", J, Lam, J), J


def _dense_precision(la, kind="kfac"):
    """Block-diagonal dense posterior precision from the object's factors (G, A) or
    EK-FAC scales, with the prior added by dense algebra."""
    P = torch.zeros(la.n_params, la.n_params, dtype=DT)
    h = float(la._H_factor)
    for i, b in enumerate(la.blocks):
        d = float(la._delta(i))
        n = b.numel
        if kind == "ekfac":
            Q = torch.kron(b.factor.q_g, b.factor.q_a)
            blk = Q @ torch.diag(h * b.factor.moments.reshape(-1) + d) @ Q.T
        elif kind == "damped" and b.kind != "bias":
            blk = torch.kron(math.sqrt(h) * b.factor.G + math.sqrt(d) * torch.eye(b.out_dim, dtype=DT),
                             math.sqrt(h) * b.factor.A + math.sqrt(d) * torch.eye(b.in_dim, dtype=DT))
        else:
            blk = h * torch.kron(b.factor.G, b.factor.A) + d * torch.eye(n, dtype=DT)
        idx = _block_index(la, b)
        P[idx[:, None], idx[None, :]] = blk
    return P


def _block_index(la, b):
    """Positions in the parameter vector of the block's row-major (out, in) entries."""
    if b.kind == "joint":
        w, bias = b.params
        ow, ob = la._layout.offsets[id(w)], la._layout.offsets[id(bias)]
        wi = (ow + torch.arange(w.numel())).reshape(b.out_dim, -1)
        bi = (ob + torch.arange(bias.numel())).reshape(b.out_dim, 1)
        return torch.cat([wi, bi], 1).reshape(-1)
    o = la._layout.offsets[id(b.params[0])]
    return o + torch.arange(b.params[0].numel())


@pytest.mark.parametrize("cls,kind,kw", [
    (KFACLaplace, "kfac", {}),
    (KFACLaplace, "damped", dict(damping=True)),
    (KFACLaplace, "kfac", dict(separate_weight_and_bias=False)),
    (EKFACLaplace, "ekfac", {}),
    (EKFACLaplace, "ekfac", dict(separate_weight_and_bias=False)),
])
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_against_dense_precision(cls, kind, kw, likelihood):
    """log det, log marginal likelihood, GLM variance and log_prob against dense algebra."""
    model = _mlp(n_out=2)
    X, y = _data(likelihood, n_out=2)
    extra = dict(sigma_noise=0.7) if likelihood == "regression" else {}
    n_blocks = 4 if kw.get("separate_weight_and_bias", True) else 2
    pp = torch.tensor([0.4, 1.1, 0.8, 2.0][:n_blocks], dtype=DT)  # one prior precision per block
    la = cls(model, likelihood, prior_precision=pp, temperature=0.8, **extra, **kw)
    la.fit(_loader(X, y))
    P = _dense_precision(la, kind)
    assert abs(float(la.log_det_posterior_precision - torch.linalg.slogdet(P)[1])) < 1e-9 * abs(
        float(torch.linalg.slogdet(P)[1]))
    Xt = _data(likelihood, n=6, n_out=2, seed=7)[0]
    _, J = _dense_ggn(model, Xt, likelihood)
    f_var_dense = J @ torch.linalg.solve(P, J.transpose(1, 2))
    assert _rel(la._glm_predictive_distribution(Xt)[1], f_var_dense) < 1e-9
    # log-evidence: log-likelihood - 1/2 (log det P - log det P0 + scatter), all dense
    theta = la.mean
    P0 = torch.diag(la.prior_precision_diag)
    ll = float(la.log_likelihood)
    lml = ll - 0.5 * (torch.linalg.slogdet(P)[1] - torch.linalg.slogdet(P0)[1] + theta @ P0 @ theta)
    assert abs(float(la.log_marginal_likelihood()) - float(lml)) < 1e-9 * abs(float(lml))
    v = theta + 0.1 * torch.randn(theta.shape, dtype=DT, generator=torch.Generator().manual_seed(2))
    mvn = torch.distributions.MultivariateNormal(theta, precision_matrix=P)
    assert abs(float(la.log_prob(v) - mvn.log_prob(v))) < 1e-9 * abs(float(mvn.log_prob(v)))


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
@pytest.mark.parametrize("separate", [True, False])
def test_ekfac_scales_are_the_ggn_diagonal_in_the_kfac_basis(likelihood, separate):
    model = _mlp(n_out=3)
    X, y = _data(likelihood)
    la = EKFACLaplace(model, likelihood, separate_weight_and_bias=separate)
    la.fit(_loader(X, y))
    ggn, _ = _dense_ggn(model, X, likelihood)
    for b in la.blocks:
        idx = _block_index(la, b)
        Q = torch.kron(b.factor.q_g, b.factor.q_a)
        ref = (Q.T @ ggn[idx[:, None], idx[None, :]] @ Q).diagonal().reshape(b.out_dim, b.in_dim)
        assert _rel(b.factor.moments, ref) < 1e-10, b.name


def test_kfac_is_exact_for_one_example_and_one_layer():
    """For a single linear layer and a single example, G (x) A is the exact GGN (joint
    weight-and-bias block)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3)).to(DT)
    X, y = _data("classification", n=1, n_in=4)
    la = KFACLaplace(model, "classification", separate_weight_and_bias=False)
    la.fit(_loader(X, y))
    ggn, _ = _dense_ggn(model, X, "classification")
    b = la.blocks[0]
    idx = _block_index(la, b)
    assert _rel(torch.kron(b.factor.G, b.factor.A), ggn[idx[:, None], idx[None, :]]) < 1e-12


@pytest.mark.parametrize("cls,kw", [(KFACLaplace, {}), (KFACLaplace, dict(damping=True)),
                                    (EKFACLaplace, dict(separate_weight_and_bias=False))])
def test_sample_covariance_matches_dense_inverse_precision(cls, kw):
    """20000 posterior draws: every entry of the sample covariance (about the known mean)
    within 5 standard errors of the dense inverse precision, sqrt((S_ii S_jj + S_ij^2)/n)."""
    model = _mlp(n_in=3, n_hidden=4, n_out=2)
    X, y = _data("classification", n_in=3, n_out=2)
    la = cls(model, "classification", prior_precision=0.6, **kw)
    la.fit(_loader(X, y))
    Sigma = torch.linalg.inv(_dense_precision(la, "ekfac" if cls is EKFACLaplace else
                                              ("damped" if kw.get("damping") else "kfac")))
    n = 20000
    th = la.sample(n, generator=torch.Generator().manual_seed(11))
    assert th.shape == (n, la.n_params)
    d = th - la.mean
    S = d.T @ d / n
    se = ((Sigma.diagonal()[:, None] * Sigma.diagonal()[None, :] + Sigma.square()) / n).sqrt()
    z = (S - Sigma) / se
    assert float(z.abs().max()) < 5.0
    zm = d.mean(0) / (Sigma.diagonal() / n).sqrt()
    assert float(zm.abs().max()) < 5.0


def test_posterior_distributions():
    model = _mlp()
    X, y = _data("classification")
    la = KFACLaplace(model, "classification", prior_precision=0.5)
    la.fit(_loader(X, y))
    from vmfdist.distributions import EigenvalueCorrectedMatrixNormal, MatrixNormal
    post = la.posterior()
    assert list(post) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert all(isinstance(d, EigenvalueCorrectedMatrixNormal) for d in post.values())
    assert post["0.weight"].event_shape == (7, 5) and post["0.bias"].event_shape == (7, 1)
    torch.testing.assert_close(post["2.weight"].mean, model[2].weight.detach())
    # block entropies sum to the Gaussian entropy from the log-determinant
    H = sum(d.entropy() for d in post.values())
    ref = 0.5 * la.n_params * (1 + math.log(2 * math.pi)) - 0.5 * la.log_det_posterior_precision
    assert abs(float(H - ref)) < 1e-10 * abs(float(ref))
    la2 = KFACLaplace(model, "classification", prior_precision=0.5, damping=True)
    la2.fit(_loader(X, y))
    post2 = la2.posterior()
    assert isinstance(post2["0.weight"], MatrixNormal) and isinstance(post2["0.bias"], EigenvalueCorrectedMatrixNormal)


def test_nn_predictive_restores_parameters_and_averages_samples():
    model = _mlp()
    X, y = _data("classification")
    la = KFACLaplace(model, "classification", prior_precision=50.0)
    la.fit(_loader(X, y))
    before = [p.detach().clone() for p in model.parameters()]
    p = la(X[:5], pred_type="nn", link_approx="mc", n_samples=50)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert p.shape == (5, 3) and torch.allclose(p.sum(-1), torch.ones(5, dtype=DT))
    reg = KFACLaplace(_mlp(n_out=2), "regression", prior_precision=50.0)
    Xr, yr = _data("regression", n_out=2)
    reg.fit(_loader(Xr, yr))
    m, v = reg(Xr[:4], pred_type="nn", link_approx="mc", n_samples=40)
    assert m.shape == (4, 2) and v.shape == (4, 2) and bool((v > 0).all())


class _HostBranch(nn.Module):
    """A layer whose forward reads a value on the host (data-dependent control flow): torch.func.vmap
    cannot run it, so the nn predictive must take its per-sample loop."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3).to(DT)

    def forward(self, x):
        out = self.lin(x)
        return out if float(out.sum()) < 1e300 else -out


@pytest.mark.parametrize("make", [_mlp, _cnn, lambda: nn.Sequential(_HostBranch())])
def test_nn_predictive_batched_forward_equals_each_sampled_network(make):
    """The nn predictive runs the sampled networks as one vmapped call where it can, the per-sample loop
    otherwise; either way sample s is the model with parameter vector s loaded, checked here by loading
    each with torch.nn.utils.vector_to_parameters into a copy of the model."""
    import copy

    model = make()
    cnn = isinstance(model[0], nn.Conv2d)
    g = torch.Generator().manual_seed(2)
    X = torch.randn(24, 2, 5, 5, generator=g, dtype=DT) if cnn else torch.randn(24, 5, generator=g, dtype=DT)
    y = torch.randint(0, 4 if cnn else 3, (24,), generator=g)
    la = KFACLaplace(model, "classification", prior_precision=2.0)
    la.fit(_loader(X, y))
    thetas = la.sample(6, torch.Generator().manual_seed(5))
    fs = la._nn_functional_samples(X[:7], 6, torch.Generator().manual_seed(5))
    batched = la._batched_forward(X[:7], thetas, {})
    assert (batched is None) == isinstance(model[0], _HostBranch)
    ref_model = copy.deepcopy(model)
    with torch.no_grad():
        for s in range(6):
            torch.nn.utils.vector_to_parameters(thetas[s], ref_model.parameters())
            assert _rel(fs[s], ref_model(X[:7])) < 1e-12


def test_mc_link_approaches_the_mean_of_softmax_samples():
    model = _mlp()
    X, y = _data("classification")
    la = KFACLaplace(model, "classification", prior_precision=0.3)
    la.fit(_loader(X, y))
    g = torch.Generator().manual_seed(4)
    p = la(X[:3], link_approx="mc", n_samples=4000, generator=g)
    s = la.predictive_samples(X[:3], n_samples=4000, generator=torch.Generator().manual_seed(5))
    se = s.std(0) / math.sqrt(4000)
    assert float(((p - s.mean(0)).abs() / (math.sqrt(2) * se)).max()) < 5.0


@pytest.mark.parametrize("fisher_type", ["mc", "empirical"])
def test_other_fisher_types(fisher_type):
    """Output layer (its output is the network output, g = softmax - onehot(label)).
    Empirical Fisher: G = sum_n g_n g_n^T at the observed labels.  MC Fisher, S labels per
    example drawn from the model: each entry within 5 standard errors of the exact
    expectation sum_n sum_y p_ny g g^T (the GGN's G), the variance computed exactly over y."""
    model = _mlp()
    X, y = _data("classification")
    S = 64
    kw = dict(mc_samples=S, generator=torch.Generator().manual_seed(0)) if fisher_type == "mc" else {}
    la = KFACLaplace(model, "classification", fisher_type=fisher_type, **kw)
    la.fit(_loader(X, y, batch_size=40))
    out = model(X).detach()
    p = out.softmax(-1)
    if fisher_type == "empirical":
        g = p - nn.functional.one_hot(y, 3).to(DT)
        torch.testing.assert_close(la.blocks[3].factor.G, g.T @ g, rtol=1e-12, atol=1e-14)
        return
    eye = torch.eye(3, dtype=DT)
    g = p[:, None, :] - eye[None]  # (N, y, K): the output gradient for each possible label
    x = g[:, :, :, None] * g[:, :, None, :]  # (N, y, K, K)
    mean = torch.einsum("ny,nykl->kl", p, x)
    var = torch.einsum("ny,nykl->kl", p, x.square()) - torch.einsum("ny,nykl->nkl", p, x).square().sum(0)
    z = (la.blocks[3].factor.G - mean) / (var / S).sqrt()
    assert float(z.abs().max()) < 5.0
    ggn = KFACLaplace(model, "classification")
    ggn.fit(_loader(X, y, batch_size=40))
    torch.testing.assert_close(ggn.blocks[3].factor.G, mean, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------- bad input
def test_unsupported_layer_is_named():
    model = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Linear(4, 2)).to(DT)
    with pytest.raises(ValueError, match=r"'1' \(torch\.nn\.modules\.normalization\.LayerNorm\).*Supported layers: "
                                         r"torch\.nn\.Linear, torch\.nn\.Conv2d"):
        KFACLaplace(model, "classification")
    model[1].requires_grad_(False)  # frozen: left out of the posterior
    la = KFACLaplace(model, "classification")
    assert la.n_params == 5 * 4 + 4 + 4 * 2 + 2


def test_grouped_and_transposed_convolutions_refused():
    with pytest.raises(ValueError, match=r"layer '0' is a grouped convolution \(groups=2\)"):
        KFACLaplace(nn.Sequential(nn.Conv2d(4, 4, 3, groups=2)), "classification")
    with pytest.raises(ValueError, match=r"transposed convolution \(ConvTranspose2d\)"):
        KFACLaplace(nn.Sequential(nn.ConvTranspose2d(2, 2, 3)), "classification")
    with pytest.raises(ValueError, match="padding_mode='reflect'.*not supported"):
        KFACLaplace(nn.Sequential(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect")), "classification")


def test_missing_or_malformed_data():
    model = _mlp()
    X, y = _data("classification")
    la = KFACLaplace(model, "classification")
    with pytest.raises(RuntimeError, match="not fitted: call fit"):
        la.log_marginal_likelihood()
    with pytest.raises(RuntimeError, match="not fitted"):
        la(X)
    with pytest.raises(ValueError, match="yielded no data"):
        la.fit(DataLoader(TensorDataset(X[:0], y[:0]), batch_size=4))
    with pytest.raises(ValueError, match="train_loader is None"):
        la.fit(None)
    with pytest.raises(ValueError, match=r"\(inputs, targets\) pairs"):
        la.fit([X])
    with pytest.raises(ValueError, match="class indices"):
        la.fit(_loader(X, y.to(DT)))
    with pytest.raises(ValueError, match=r"lie in \[0, 3\)"):
        la.fit(_loader(X, y + 3))
    reg = KFACLaplace(_mlp(), "regression")
    with pytest.raises(ValueError, match="regression targets must have the model output's shape"):
        reg.fit(_loader(X, torch.randn(40, dtype=DT)))
    la.fit(_loader(X, y))
    with pytest.raises(ValueError, match="val_loader"):
        la.optimize_prior_precision(method="gridsearch")


def test_diverging_marglik_says_so():
    """An Adam step far too large for the log prior precision ends in NaN: a clear error naming lr, and the
    prior precision left as it was."""
    X, y = _data("classification")
    la = KFACLaplace(_mlp(), "classification")
    la.fit(_loader(X, y))
    la.prior_precision = 2.0
    with pytest.raises(ValueError, match="optimisation diverged .* lr=100000000.0\\); try a smaller lr"):
        la.optimize_prior_precision(method="marglik", n_steps=30, lr=1e8)
    assert la.prior_precision.tolist() == [2.0]


def test_bad_hyperparameters_named():
    model = _mlp()
    with pytest.raises(ValueError, match="likelihood must be one of"):
        KFACLaplace(model, "poisson")
    with pytest.raises(ValueError, match="sigma_noise != 1 is only available for regression"):
        KFACLaplace(model, "classification", sigma_noise=2.0)
    with pytest.raises(ValueError, match="prior_precision must hold 1 value or one per block"):
        KFACLaplace(model, "classification", prior_precision=torch.ones(3))
    with pytest.raises(ValueError, match="prior_precision must be finite and positive"):
        KFACLaplace(model, "classification", prior_precision=-1.0)
    with pytest.raises(ValueError, match="sigma_noise must be finite and positive"):
        KFACLaplace(model, "regression", sigma_noise=0.0)
    with pytest.raises(ValueError, match="temperature"):
        KFACLaplace(model, "regression", temperature=0.0)
    with pytest.raises(ValueError, match="prior_mean must be a scalar or a vector of length"):
        KFACLaplace(model, "regression", prior_mean=torch.zeros(7))
    with pytest.raises(ValueError, match="fisher_type"):
        KFACLaplace(model, "regression", fisher_type="hessian")
    with pytest.raises(ValueError, match="damping.*KFACLaplace only"):
        EKFACLaplace(model, "regression", damping=True)
    with pytest.raises(ValueError, match="the model must return a \\(batch, outputs\\) tensor"):
        KFACLaplace(nn.Sequential(nn.Linear(5, 3), nn.Flatten(0)).to(DT), "regression").fit(
            _loader(*_data("regression")))
    la = KFACLaplace(model, "classification")
    X, y = _data("classification")
    la.fit(_loader(X, y))
    with pytest.raises(ValueError, match="pred_type"):
        la(X, pred_type="laplace")
    with pytest.raises(ValueError, match="pred_type='nn' supports link_approx='mc' only"):
        la(X, pred_type="nn")
    with pytest.raises(ValueError, match="prior_structure"):
        la.optimize_prior_precision(prior_structure="diag")


def test_non_finite_factors_name_the_layer():
    model = _mlp()
    X, y = _data("regression")
    X[3, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="input factor A of layer '0'"):
        KFACLaplace(model, "regression").fit(_loader(X, y))


# ---------------------------------------------------------------------------- factors from elsewhere
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_from_curvature_equals_fit(likelihood):
    from vmfdist.curvature import compute_kfac

    model = _mlp()
    X, y = _data(likelihood)
    loader = _loader(X, y)
    kw = dict(prior_precision=0.6, sigma_noise=0.7) if likelihood == "regression" else dict(prior_precision=0.6)
    for sep in (True, False):
        ref = KFACLaplace(model, likelihood, separate_weight_and_bias=sep, **kw)
        ref.fit(loader)
        # curvature for sigma_noise 0.5: from_curvature rescales G to unit noise
        curv = compute_kfac(model, loader, likelihood, sigma_noise=0.5 if likelihood == "regression" else 1.0)
        la = KFACLaplace.from_curvature(model, likelihood, curv, loader, separate_weight_and_bias=sep, **kw)
        assert abs(float(la.log_marginal_likelihood() - ref.log_marginal_likelihood())) < 1e-12 * abs(
            float(ref.log_marginal_likelihood()))
        assert _rel(la._glm_predictive_distribution(X[:5])[1], ref._glm_predictive_distribution(X[:5])[1]) < 1e-12
    ek_ref = EKFACLaplace(model, likelihood, separate_weight_and_bias=False, **kw)
    ek_ref.fit(loader)
    ek = EKFACLaplace.from_curvature(model, likelihood, compute_kfac(model, loader, likelihood, ekfac=True), loader,
                                     **kw)
    assert abs(float(ek.log_marginal_likelihood() - ek_ref.log_marginal_likelihood())) < 1e-12 * abs(
        float(ek_ref.log_marginal_likelihood()))
    assert _rel(ek._glm_predictive_distribution(X[:5])[1], ek_ref._glm_predictive_distribution(X[:5])[1]) < 1e-10


def test_from_curvature_without_data_and_missing_num_data():
    from vmfdist.curvature import compute_kfac

    model = _mlp()
    X, y = _data("classification")
    loader = _loader(X, y)
    curv = compute_kfac(model, loader, "classification")
    la = KFACLaplace.from_curvature(model, "classification", curv)  # no train_loader: no log-likelihood
    with pytest.raises(ValueError, match="needs the training loss: pass train_loader"):
        la.log_marginal_likelihood()
    ref = KFACLaplace(model, "classification", separate_weight_and_bias=False)
    ref.fit(loader)
    la.optimize_prior_precision(n_steps=20)
    ref.optimize_prior_precision(n_steps=20)
    assert _rel(la.prior_precision, ref.prior_precision) < 1e-12
    assert _rel(la(X[:4]), ref(X[:4])) < 1e-12
    plain = {name: {"A": lf.A, "G": lf.G} for name, lf in curv.layers.items()}
    with pytest.raises(ValueError, match="num_data .* is required"):
        KFACLaplace.from_curvature(model, "classification", plain)
    la2 = KFACLaplace.from_curvature(model, "classification", plain, num_data=40, prior_precision=ref.prior_precision)
    assert _rel(la2(X[:4]), ref(X[:4])) < 1e-12
    with pytest.raises(ValueError, match="does not match the curvature's likelihood"):
        KFACLaplace.from_curvature(model, "regression", curv)
    with pytest.raises(ValueError, match="needs separate_weight_and_bias=False"):
        EKFACLaplace.from_curvature(model, "classification", compute_kfac(model, loader, "classification",
                                                                          ekfac=True), separate_weight_and_bias=True)


def test_ekfac_from_noisy_ekfac_is_the_optimizers_posterior():
    """NoisyEKFAC's posterior is (lambda/N) / (S + lambda/(N eta)) in its eigenbasis; with
    temperature = kl_weight and prior precision 1/prior_var, EKFACLaplace.from_optimizer is the
    same distribution, block by block."""
    from vmfdist.optim import NoisyEKFAC

    model = _mlp()
    X, y = _data("classification")
    opt = NoisyEKFAC(model, 40, "classification", seed=0, T_stats=1, T_inv=1, T_scale=1, kl_weight=0.5,
                     prior_var=2.0)
    for _ in range(4):
        opt.step(X, y)
    la = EKFACLaplace.from_optimizer(opt, _loader(X, y))
    assert la.temperature == 0.5 and float(la.prior_precision) == 0.5
    post = la.posterior()
    for name in opt.layers:
        ref = opt.posterior(name)
        assert _rel(post[name].eigenvalues, ref.eigenvalues) < 1e-12
        assert torch.equal(post[name].loc, ref.loc)
        torch.testing.assert_close(post[name].q_out, ref.q_out, rtol=0, atol=0)
    assert math.isfinite(float(la.log_marginal_likelihood()))


def test_kfac_from_noisy_kfac_against_dense_precision():
    """KFACLaplace.from_optimizer(NoisyKFAC): per layer (N / kl_weight) G (x) A + I / prior_var
    from the optimizer's own factors (G includes its 1/sigma^2), against dense algebra."""
    from vmfdist.optim import NoisyKFAC

    model = _mlp(n_out=2)
    X, y = _data("regression", n_out=2)
    opt = NoisyKFAC(model, 40, "regression", sigma_noise=0.7, seed=1, T_stats=1, T_inv=1, kl_weight=0.8,
                    prior_var=0.5)
    for _ in range(4):
        opt.step(X, y)
    la = KFACLaplace.from_optimizer(opt, _loader(X, y))
    assert float(la.sigma_noise) == 0.7 and la.temperature == 0.8 and float(la.prior_precision) == 2.0
    P = torch.zeros(la.n_params, la.n_params, dtype=DT)
    for b in la.blocks:
        st = opt.state[b.module.weight]
        idx = _block_index(la, b)
        P[idx[:, None], idx[None, :]] = 40 / 0.8 * torch.kron(st["G"], st["A"]) + 2.0 * torch.eye(b.numel, dtype=DT)
    assert abs(float(la.log_det_posterior_precision - torch.linalg.slogdet(P)[1])) < 1e-9 * abs(
        float(torch.linalg.slogdet(P)[1]))
    _, J = _dense_ggn(model, X[:5], "regression")
    assert _rel(la(X[:5])[1], J @ torch.linalg.solve(P, J.transpose(1, 2))) < 1e-9
    with pytest.raises(ValueError, match="needs a NoisyEKFAC"):
        EKFACLaplace.from_optimizer(opt)
    with pytest.raises(TypeError, match="expects a vmfdist.optim"):
        KFACLaplace.from_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))


def test_enable_backprop_gives_input_gradients_of_the_glm_predictive():
    model = _mlp(n_out=2)
    X, y = _data("regression", n_out=2)
    la = KFACLaplace(model, "regression", prior_precision=0.5, enable_backprop=True)
    la.fit(_loader(X, y))
    x = X[:3].clone().requires_grad_(True)

    def f(x):
        mean, var = la(x)
        return mean, var

    assert torch.autograd.gradcheck(f, (x,))
    probs_model = _mlp()
    Xc, yc = _data("classification")
    lc = KFACLaplace(probs_model, "classification", enable_backprop=True)
    lc.fit(_loader(Xc, yc))
    assert torch.autograd.gradcheck(lambda x: lc(x), (Xc[:3].clone().requires_grad_(True),))


def test_fit_without_override_adds_the_data():
    model = _mlp()
    X, y = _data("classification")
    full = KFACLaplace(model, "classification", prior_precision=0.3)
    full.fit(_loader(X, y))
    parts = KFACLaplace(model, "classification", prior_precision=0.3)
    parts.fit(_loader(X[:24], y[:24]))
    parts.fit(_loader(X[24:], y[24:]), override=False)
    assert parts.n_data == 40
    assert abs(float(parts.log_marginal_likelihood() - full.log_marginal_likelihood())) < 1e-12 * abs(
        float(full.log_marginal_likelihood()))
    ek = EKFACLaplace(model, "classification")
    ek.fit(_loader(X, y))
    with pytest.raises(ValueError, match=r"override=False\) is not supported"):
        ek.fit(_loader(X, y), override=False)


@pytest.mark.parametrize("cls", [KFACLaplace, EKFACLaplace])
def test_a_failed_fit_leaves_the_approximation_as_it_was(cls):
    """fit collects everything before it changes anything: a batch that fails half-way through the
    data (wrong target shape, non-finite curvature) raises and the earlier fit stands unchanged."""
    model = _mlp()
    X, y = _data("classification")
    la = cls(model, "classification", prior_precision=0.5)
    la.fit(_loader(X, y))
    before = (float(la.log_marginal_likelihood()), la(X[:5]).clone(), la.n_data, la.loss.clone())
    bad_shape = [(X[:16], y[:16]), (X[16:32], y[16:32]), (X[32:35], y[32:34])]
    with pytest.raises(ValueError, match="targets must hold one row per example"):
        la.fit(bad_shape)
    X_nan = X.clone()
    X_nan[-1, 0] = float("nan")
    with pytest.raises(FloatingPointError):
        la.fit(_loader(X_nan, y), override=cls is EKFACLaplace)
    assert float(la.log_marginal_likelihood()) == before[0] and torch.equal(la(X[:5]), before[1])
    assert la.n_data == before[2] and torch.equal(la.loss, before[3])


def test_optimizer_factors_are_curvatures_value_type():
    """NoisyKFAC / NoisyEKFAC hand out their curvature as vmfdist.curvature.KroneckerFactor; the
    Laplace reads those, not the optimizer's state."""
    from vmfdist.curvature import KroneckerFactor
    from vmfdist.optim import NoisyEKFAC, NoisyKFAC

    X, y = _data("classification")
    for cls in (NoisyKFAC, NoisyEKFAC):
        opt = cls(_mlp(), 40, "classification", seed=0, T_stats=1, T_inv=1, T_scale=1)
        for _ in range(3):
            opt.step(X, y)
        fs = opt.kronecker_factors()
        assert list(fs) == list(opt.layers)
        for name, mod in opt.layers.items():
            f, st = fs[name], opt.state[mod.weight]
            assert isinstance(f, KroneckerFactor)
            assert f.A is st["A"] and f.G is st["G"] and f.q_a is st["q_a"] and f.q_g is st["q_g"]
            assert (f.moments is st["S"]) if cls is NoisyEKFAC else f.moments is None


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_an_empty_batch_gives_empty_predictions(likelihood):
    """laplace-torch returns (0, K) for an empty batch; so does every predictive here (issue 22)."""
    X, y = _data(likelihood)
    la = KFACLaplace(_mlp(), likelihood)
    la.fit(_loader(X, y))
    empty = X[:0]
    if likelihood == "classification":
        assert la(empty).shape == (0, 3)
        assert la(empty, link_approx="mc", n_samples=4).shape == (0, 3)
        assert la(empty, pred_type="nn", link_approx="mc", n_samples=4).shape == (0, 3)
        assert la.predictive_samples(empty, n_samples=4).shape == (4, 0, 3)
    else:
        mu, var = la(empty)
        assert mu.shape == (0, 3) and var.shape == (0, 3, 3)
        assert la(empty, diagonal_output=True)[1].shape == (0, 3)
        mu, cov = la(empty, joint=True)
        assert mu.shape == (0,) and cov.shape == (0, 0)
