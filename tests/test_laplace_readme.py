"""laplace-torch's README examples, run unchanged against vmfdist.laplace (only the import
differs) and against laplace-torch 0.3 itself: the same numbers (float64, models and data of
the tests' own in place of the README's pre-trained model and loaders)."""
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import vmfdist.laplace as ours

try:
    import laplace as theirs
except ImportError:  # pragma: no cover - depends on the environment
    theirs = None
pytestmark = pytest.mark.skipif(theirs is None, reason="laplace-torch (pip install --no-deps -r "
                                "benchmarks/requirements-kron.txt) is the reference")

DT = torch.float64


def _model(n_out, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 10), nn.Tanh(), nn.Linear(10, n_out)).to(DT)


def _loaders(likelihood, n_out):
    g = torch.Generator().manual_seed(2)
    X = torch.randn(90, 4, generator=g, dtype=DT)
    if likelihood == "classification":
        y = (X[:, 0] + 0.5 * X[:, 1] > 0).long() + (X[:, 2] > 1).long()
    else:
        y = torch.sin(X[:, :1]) + 0.1 * torch.randn(90, 1, generator=g, dtype=DT)
    train = DataLoader(TensorDataset(X[:60], y[:60]), batch_size=20)
    val = DataLoader(TensorDataset(X[60:], y[60:]), batch_size=15)
    return train, val, X[60:]


def _train(model, loader, likelihood, epochs=60):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss() if likelihood == "classification" else nn.MSELoss()
    for _ in range(epochs):
        for X, y in loader:
            opt.zero_grad()
            loss_fn(model(X), y).backward()
            opt.step()
    return model


def _readme_posthoc(lib, model, train_loader, val_loader, x):
    """The README's "simple usage": a diagonal Laplace over all weights, the prior precision by
    grid search on validation data, the GLM predictive with the probit link."""
    la = lib.Laplace(model, "classification", subset_of_weights="all", hessian_structure="diag")
    la.fit(train_loader)
    la.optimize_prior_precision(method="gridsearch", pred_type="glm", link_approx="probit", val_loader=val_loader,
                                loss=lambda p, y: -p.clamp_min(1e-12).log().gather(1, y[:, None]).mean(),
                                grid_size=20)
    pred = la(x, pred_type="glm", link_approx="probit")
    return la.prior_precision.reshape(-1), pred


def _readme_marglik(lib, model, train_loader, n_epochs=40, structure="diag"):
    """The README's marginal-likelihood tuning of the prior precision and the observation noise
    of a regression model.  (Not with hessian_structure="kron": laplace-torch's gradient in
    sigma_noise is wrong there, see test_kron_evidence_gradient_in_sigma_is_right.)"""
    la = lib.Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure)
    la.fit(train_loader)
    log_prior, log_sigma = torch.ones(1, requires_grad=True, dtype=DT), torch.ones(1, requires_grad=True, dtype=DT)
    hyper_optimizer = torch.optim.Adam([log_prior, log_sigma], lr=1e-1)
    for _ in range(n_epochs):
        hyper_optimizer.zero_grad()
        neg_marglik = -la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())
        neg_marglik.backward()
        hyper_optimizer.step()
    return log_prior.detach(), log_sigma.detach(), la.log_marginal_likelihood().detach()


def _readme_last_layer(lib, model, train_loader, x):
    """The README's last-layer example: K-FAC over the last layer, the prior by marginal
    likelihood, the GLM predictive and its functional variance."""
    la = lib.Laplace(model, "classification", subset_of_weights="last_layer", hessian_structure="kron")
    la.fit(train_loader)
    la.optimize_prior_precision(method="marglik", pred_type="glm")
    f_mu, f_var = la._glm_predictive_distribution(x)
    return la.prior_precision.reshape(-1), la(x), f_mu, f_var


def _run(example, likelihood, n_out, *args):
    train, val, x = _loaders(likelihood, n_out)
    model = _train(_model(n_out), train, likelihood)
    got, want = [], []
    for lib, out in ((ours, got), (theirs, want)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = {"train_loader": train}
            if example is not _readme_marglik:
                kwargs["x"] = x
            if example is _readme_posthoc:
                kwargs["val_loader"] = val
            out.extend(example(lib, model, **kwargs))
    return got, want


@pytest.mark.parametrize("example,likelihood,n_out", [(_readme_posthoc, "classification", 3),
                                                      (_readme_marglik, "regression", 1),
                                                      (_readme_last_layer, "classification", 3)])
def test_readme_example_gives_laplace_torchs_numbers(example, likelihood, n_out):
    got, want = _run(example, likelihood, n_out)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.reshape(g.shape), rtol=1e-8, atol=1e-10)


def test_readme_marglik_example_with_the_full_ggn():
    """The README's own structure for the marginal-likelihood example, hessian_structure="full"
    (laplace-torch's default backend rounds the full GGN to float32, so BackPACK's is the
    reference: tests/test_laplace_full.py)."""
    from laplace.curvature import BackPackGGN

    train, _, _ = _loaders("regression", 1)
    model = _train(_model(1), train, "regression")

    class Peer:  # laplace-torch with the float64 backend
        @staticmethod
        def Laplace(*args, **kwargs):
            return theirs.Laplace(*args, backend=BackPackGGN, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _readme_marglik(ours, model, train, structure="full")
        want = _readme_marglik(Peer, model, train, structure="full")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.reshape(g.shape), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("subset", ["last_layer", "all"])
def test_kron_evidence_gradient_in_sigma_is_right(subset):
    """laplace-torch 0.3's KronLaplace gives the right log evidence but a wrong gradient in
    sigma_noise (the log-determinant's dependence on sigma is lost: its gradient is the same for
    the last layer and for all weights).  Ours: the central difference, to 1e-6."""
    train, _, _ = _loaders("regression", 1)
    model = _train(_model(1), train, "regression")
    la = ours.Laplace(model, "regression", subset_of_weights=subset)
    la.fit(train)
    prior = torch.tensor([1.3], dtype=DT)
    sigma = torch.tensor([0.8], dtype=DT, requires_grad=True)
    la.log_marginal_likelihood(prior, sigma).backward()
    h = 1e-5

    def f(s):
        return float(la.log_marginal_likelihood(prior, torch.tensor([s], dtype=DT)))

    fd = (f(0.8 + h) - f(0.8 - h)) / (2 * h)
    assert abs(float(sigma.grad) - fd) <= 1e-6 * abs(fd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = theirs.Laplace(model, "regression", subset_of_weights=subset, hessian_structure="kron")
        ref.fit(train)
    s_ref = torch.tensor([0.8], dtype=DT, requires_grad=True)
    value = ref.log_marginal_likelihood(prior, s_ref)
    value.backward()
    assert abs(float(value) - f(0.8)) <= 1e-10 * abs(f(0.8))  # the value agrees
    assert abs(float(s_ref.grad) - fd) > 1e-3 * abs(fd)  # its gradient does not (if this fails, it was fixed)
