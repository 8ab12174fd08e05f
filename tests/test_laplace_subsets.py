"""vmfdist.laplace as a drop-in for laplace-torch's default calls: the last-layer Laplace
(``Laplace(model, likelihood)``), the diagonal structure, chosen layers, and saving a fitted
approximation.  References: laplace-torch 0.3 (KronLLLaplace, DiagLaplace, DiagLLLaplace) in
float64, and dense algebra (the exact GGN diagonal from per-example Jacobians by torch.func)."""
import io
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vmfdist.laplace import (DiagLaplace, DiagLLLaplace, EKFACLaplace, KFACLaplace, KronLaplace, KronLLLaplace,
                             Laplace)

try:  # the peer reference; the dense-algebra tests run without it
    import laplace as laplace_torch
except ImportError:  # pragma: no cover - depends on the environment
    laplace_torch = None
needs_laplace_torch = pytest.mark.skipif(laplace_torch is None, reason="laplace-torch (pip install --no-deps -r "
                                         "benchmarks/requirements-kron.txt) is the reference")

DT = torch.float64
RTOL = 1e-8  # the agreement the issue asks for


def _mlp(n_out=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, n_out)).to(DT)


def _cnn(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Conv2d(3, 2, 3, stride=2), nn.Flatten(),
                         nn.Linear(8, 4)).to(DT)


class _Reordered(nn.Module):
    """The head is registered first but runs last: registration order is not execution order."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.head = nn.Linear(6, 3)
        self.body = nn.Sequential(nn.Linear(5, 6), nn.Tanh())
        self.to(DT)

    def forward(self, x):
        return self.head(self.body(x))


def _data(likelihood, n=60, shape=(5,), n_out=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn((n,) + shape, generator=g, dtype=DT)
    y = torch.randint(0, n_out, (n,), generator=g) if likelihood == "classification" else \
        torch.randn(n, n_out, generator=g, dtype=DT)
    return X, y


def _loader(X, y, batch_size=16):
    return DataLoader(TensorDataset(X, y), batch_size=batch_size)


def _rel(a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _reference(model, likelihood, loader, subset, structure, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = laplace_torch.Laplace(model, likelihood, subset_of_weights=subset, hessian_structure=structure, **kw)
        ref.fit(loader)
    return ref


def _compare(ref, ours, X, n_blocks, per_parameter):
    """Log evidence and GLM predictive at several prior precisions (laplace-torch's last-layer
    classes take no per-layer prior precisions: n_blocks=None)."""
    priors = [1.0, 0.37] + ([torch.linspace(0.5, 2.0, n_blocks, dtype=DT)] if n_blocks else [])
    if per_parameter:
        priors.append(torch.linspace(0.2, 3.0, ours.n_params, dtype=DT))
    for pp in priors:
        ref.prior_precision, ours.prior_precision = pp, pp
        assert _rel(ours.log_marginal_likelihood(), ref.log_marginal_likelihood()) < RTOL, pp
        for link in ("probit", "bridge"):
            if ours.likelihood == "regression" and link == "bridge":
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = ref(X, pred_type="glm", link_approx=link)
            got = ours(X, pred_type="glm", link_approx=link)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert _rel(g, w) < RTOL, (pp, link)


# ---- laplace-torch's default: Laplace(model, likelihood) is the last-layer K-FAC -------------------------------
@needs_laplace_torch
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_default_factory_is_laplace_torchs_last_layer_kfac(likelihood):
    model = _mlp()
    X, y = _data(likelihood)
    kw = {"sigma_noise": 0.7} if likelihood == "regression" else {}
    ref = _reference(model, likelihood, _loader(X, y), "last_layer", "kron", **kw)
    ours = Laplace(model, likelihood, **kw)
    ours.fit(_loader(X, y))
    assert type(ours) is KFACLaplace and ours.last_layer_name == "4" and ours.n_params == ref.n_params == 6 * 3 + 3
    _compare(ref, ours, X[:9], None, per_parameter=False)


@needs_laplace_torch
def test_last_layer_of_a_conv_net_matches_laplace_torch():
    model = _cnn()
    X, y = _data("classification", shape=(2, 5, 5), n_out=4)
    ref = _reference(model, "classification", _loader(X, y), "last_layer", "kron")
    ours = KronLLLaplace(model, "classification")
    ours.fit(_loader(X, y))
    _compare(ref, ours, X[:7], None, per_parameter=False)


@needs_laplace_torch
def test_last_layer_follows_the_forward_pass_not_the_registration_order():
    model = _Reordered()
    X, y = _data("classification")
    ours = Laplace(model, "classification")
    assert ours.last_layer_name == "body.0"  # the guess before any data
    ours.fit(_loader(X, y))
    assert ours.last_layer_name == "head" and ours.n_params == 6 * 3 + 3
    ref = _reference(model, "classification", _loader(X, y), "last_layer", "kron")
    _compare(ref, ours, X[:5], None, per_parameter=False)
    named = KronLLLaplace(model, "classification", last_layer_name="head")
    named.fit(_loader(X, y))
    ours.prior_precision = 1.0  # _compare left its last value
    assert _rel(named.log_marginal_likelihood(), ours.log_marginal_likelihood()) == 0.0


def _diagonal(la):
    """A DiagLaplace's likelihood curvature (the GGN diagonal), in parameter order."""
    out = torch.empty(la.n_params, dtype=DT)
    for b in la.blocks:
        la._layout.scatter(b, b.factor.moments, out)
    return out


# ---- the diagonal structure ---------------------------------------------------------------------------------------
@needs_laplace_torch
@pytest.mark.parametrize("subset", ["all", "last_layer"])
@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_diagonal_matches_laplace_torch(subset, likelihood):
    model = _mlp()
    X, y = _data(likelihood)
    kw = {"sigma_noise": 0.7} if likelihood == "regression" else {}
    ref = _reference(model, likelihood, _loader(X, y), subset, "diag", **kw)
    ours = Laplace(model, likelihood, subset_of_weights=subset, hessian_structure="diag", **kw)
    ours.fit(_loader(X, y))
    assert type(ours) is DiagLaplace and ours.n_params == ref.n_params
    n_blocks = 6 if subset == "all" else None
    _compare(ref, ours, X[:9], n_blocks, per_parameter=True)
    # the curvature itself: laplace-torch's H is the GGN diagonal in parameter order
    assert _rel(_diagonal(ours), ref.H) < RTOL


@needs_laplace_torch
def test_diagonal_of_a_conv_net_matches_laplace_torch():
    model = _cnn()
    X, y = _data("classification", shape=(2, 5, 5), n_out=4)
    ref = _reference(model, "classification", _loader(X, y), "all", "diag")
    ours = DiagLaplace(model, "classification")
    ours.fit(_loader(X, y))
    _compare(ref, ours, X[:6], 6, per_parameter=True)


@needs_laplace_torch
@pytest.mark.parametrize("structure", ["scalar", "layerwise", "diag"])
def test_diagonal_prior_optimisation_matches_laplace_torch(structure):
    model = _mlp()
    X, y = _data("classification")
    ref = _reference(model, "classification", _loader(X, y), "all", "diag")
    ours = DiagLaplace(model, "classification")
    ours.fit(_loader(X, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref.optimize_prior_precision(method="marglik", prior_structure=structure, n_steps=60)
    ours.optimize_prior_precision(method="marglik", prior_structure=structure, n_steps=60)
    assert ours.prior_precision.shape == ref.prior_precision.reshape(-1).shape
    assert _rel(ours.prior_precision, ref.prior_precision.reshape(-1)) < 1e-7


def _dense_ggn_diagonal(model, X, likelihood, sigma=1.0):
    """sum_n diag(J_n^T Lambda_n J_n) from per-example Jacobians (torch.func)."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, x):
        return torch.func.functional_call(model, p, (x[None],))[0]

    total = None
    for x in X:
        J = torch.func.jacrev(f)(params, x)
        Jm = torch.cat([J[k].reshape(J[k].shape[0], -1) for k in params], 1)  # (outputs, n_params)
        if likelihood == "classification":
            p = f(params, x).softmax(-1)
            lam = torch.diag(p) - torch.outer(p, p)
        else:
            lam = torch.eye(Jm.shape[0], dtype=DT) / sigma ** 2
        d = ((Jm.T @ lam) * Jm.T).sum(1)
        total = d if total is None else total + d
    return total


@pytest.mark.parametrize("likelihood", ["classification", "regression"])
def test_diagonal_is_the_exact_ggn_diagonal(likelihood):
    """Independent of laplace-torch: the diagonal against dense per-example Jacobians, and the
    precision, log determinant and posterior variances it implies."""
    model = _cnn() if likelihood == "classification" else _mlp()
    X, y = _data(likelihood, n=25, shape=(2, 5, 5) if likelihood == "classification" else (5,),
                 n_out=4 if likelihood == "classification" else 3)
    ours = DiagLaplace(model, likelihood, prior_precision=0.8)
    ours.fit(_loader(X, y, batch_size=10))
    want = _dense_ggn_diagonal(model, X, likelihood)
    assert _rel(_diagonal(ours), want) < 1e-12
    prec = want + 0.8
    assert _rel(ours.log_det_posterior_precision, prec.log().sum()) < 1e-12
    # posterior samples: per-parameter variance 1 / prec, within 5 standard errors (chi-square)
    n = 4000
    s = ours.sample(n, generator=torch.Generator().manual_seed(0))
    var = (s - ours.mean).square().mean(0)
    z = (var * prec - 1.0) / (2.0 / n) ** 0.5
    assert float(z.abs().max()) < 5.0


def test_diagonal_fit_adds_data_with_override_false():
    model = _mlp()
    X, y = _data("classification")
    whole = DiagLaplace(model, "classification")
    whole.fit(_loader(X, y))
    parts = DiagLaplace(model, "classification")
    parts.fit(_loader(X[:25], y[:25]))
    parts.fit(_loader(X[25:], y[25:]), override=False)
    assert parts.n_data == whole.n_data == 60
    assert _rel(parts.log_marginal_likelihood(), whole.log_marginal_likelihood()) < 1e-12


# ---- chosen layers --------------------------------------------------------------------------------------------------
def test_subnetwork_of_layers_equals_modules():
    model = _mlp()
    X, y = _data("classification")
    a = Laplace(model, "classification", subset_of_weights="subnetwork", modules=["0", "4"])
    b = KFACLaplace(model, "classification", modules=["0", "4"])
    a.fit(_loader(X, y))
    b.fit(_loader(X, y))
    assert a.n_params == b.n_params == 5 * 7 + 7 + 6 * 3 + 3
    assert float(a.log_marginal_likelihood()) == float(b.log_marginal_likelihood())


# ---- saving ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", ["kron", "ekfac", "diag"])
@pytest.mark.parametrize("subset", ["all", "last_layer"])
def test_state_dict_round_trip(structure, subset):
    model = _Reordered()
    X, y = _data("classification")
    la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
    la.fit(_loader(X, y))
    la.prior_precision = 0.6
    buf = io.BytesIO()
    torch.save(la.state_dict(), buf)
    buf.seek(0)
    fresh = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
    fresh.load_state_dict(torch.load(buf))
    assert fresh.last_layer_name == la.last_layer_name
    assert float(fresh.log_marginal_likelihood()) == float(la.log_marginal_likelihood())
    assert torch.equal(fresh(X[:4]), la(X[:4]))
    g = [torch.Generator().manual_seed(5) for _ in range(2)]
    assert torch.equal(fresh.sample(3, generator=g[0]), la.sample(3, generator=g[1]))
    buf = io.BytesIO()
    torch.save(la, buf)  # the whole object, model included
    buf.seek(0)
    whole = torch.load(buf, weights_only=False)
    assert float(whole.log_marginal_likelihood()) == float(la.log_marginal_likelihood())


def test_load_state_dict_refuses_another_approximation():
    model = _mlp()
    X, y = _data("classification")
    la = KFACLaplace(model, "classification")
    la.fit(_loader(X, y))
    state = la.state_dict()
    with pytest.raises(ValueError, match="the state is of a KFACLaplace"):
        EKFACLaplace(model, "classification").load_state_dict(state)
    with pytest.raises(ValueError, match="likelihood is 'regression' here"):
        KFACLaplace(model, "regression").load_state_dict(state)
    with pytest.raises(ValueError, match="the blocks here"):
        KFACLaplace(model, "classification", modules=["0"]).load_state_dict(state)
    with pytest.raises(ValueError, match="state_dict must be a dict"):
        la.load_state_dict([1, 2])
    with pytest.raises(RuntimeError, match="not fitted"):
        KFACLaplace(model, "classification").state_dict()


# ---- bad input ------------------------------------------------------------------------------------------------------
def test_subset_arguments_are_checked():
    model = _mlp()
    with pytest.raises(ValueError, match="subset_of_weights must be one of"):
        KFACLaplace(model, "classification", subset_of_weights="last")
    with pytest.raises(ValueError, match="give last_layer_name"):
        KronLLLaplace(model, "classification", modules=["0"])
    with pytest.raises(ValueError, match="last_layer_name is for subset_of_weights='last_layer'"):
        KFACLaplace(model, "classification", last_layer_name="4")
    with pytest.raises(ValueError, match="needs modules"):
        Laplace(model, "classification", subset_of_weights="subnetwork")
    with pytest.raises(ValueError, match="'nope' is not a submodule"):
        DiagLLLaplace(model, "classification", last_layer_name="nope")
    with pytest.raises(ValueError, match="one per parameter"):
        DiagLaplace(model, "classification", prior_precision=torch.ones(5, dtype=DT))
    with pytest.raises(ValueError, match=r"1 value or one per block \(6 blocks: .*\), got"):
        KFACLaplace(model, "classification", prior_precision=torch.ones(model[0].weight.numel(), dtype=DT))
    with pytest.raises(ValueError, match="fit it on the data"):
        DiagLaplace.from_curvature(model, "classification", {})
    la = KFACLaplace(model, "classification")
    X, y = _data("classification")
    la.fit(_loader(X, y))
    with pytest.raises(ValueError, match="'diag', one per parameter, needs a diagonal or full posterior"):
        la.optimize_prior_precision(prior_structure="diag")
    assert KronLaplace is KFACLaplace
