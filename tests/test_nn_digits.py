"""Each Bayesian layer kind trains a small LeNet-style network on scikit-learn's digits (8x8) to
the test accuracy a plain network reaches (>= 95 %), and RDP pruning keeps that accuracy."""
import pytest
import torch
from torch import nn

import vmfdist.nn as vnn

sklearn_datasets = pytest.importorskip("sklearn.datasets")
sklearn_model_selection = pytest.importorskip("sklearn.model_selection")


@pytest.fixture(autouse=True)
def _one_thread():
    """These networks are tiny: per-op overhead dominates, and a second (spinning) OpenMP thread
    only costs CPU time on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def digits():
    x, y = sklearn_datasets.load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    return sklearn_model_selection.train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def lenet(c1=8, c2=16, hidden=64):
    return nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(c2 * 4, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def train(model, xtr, ytr, epochs, lr, batch=64, seed=0, radius_lr=None):
    torch.manual_seed(seed)
    elbo = vnn.ELBO(model, num_data=len(xtr))  # kl_weight 1: the plain ELBO
    radius = [p for n, p in model.named_parameters() if "local_" in n or "global_" in n]
    rest = [p for n, p in model.named_parameters() if not ("local_" in n or "global_" in n)]
    groups = [{"params": rest}] + ([{"params": radius, "lr": radius_lr}] if radius and radius_lr else [])
    opt = torch.optim.Adam(groups, lr=lr)
    for _ in range(epochs):
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), batch):
            idx = perm[i:i + batch]
            loss = elbo(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return elbo


KINDS = [
    ("meanfield", {"estimator": "reparam"}),
    ("meanfield", {"estimator": "local"}),
    ("meanfield", {"estimator": "flipout"}),
    ("radial", {}),
    ("rdp", {"grouping": "row", "init_eps": 1e-4}),
]


@pytest.mark.parametrize("kind,opts", KINDS)
def test_layer_kind_learns_digits(digits, kind, opts):
    xtr, xte, ytr, yte = digits
    torch.manual_seed(0)
    model = vnn.to_bayesian(lenet(), kind, **opts)
    elbo = train(model, xtr, ytr, epochs=20, lr=5e-3)
    pred = vnn.predict(model, xte, num_samples=16)
    assert float(vnn.accuracy(pred, yte)) >= 0.95
    with vnn.deterministic(model, "mean"):
        assert float((model(xte).argmax(-1) == yte).float().mean()) >= 0.95
    assert float(vnn.ece(pred, yte)) < 0.1
    assert float(elbo.kl) > 0


@pytest.mark.slow
def test_rdp_double_grouping_learns_and_prunes():
    """RDP with double grouping in every layer (the paper's pruning set-up) on the digits-pruning
    experiment's network and settings (20-50-200-500, 60 epochs, the radius learning rate chosen
    there on validation data), its first seed: at least 95 % test accuracy with the mean weights,
    and the network compressed at the log-mode gaps keeps it within a point with under half the
    parameters.  (This test used a 16-32-128 network with radius learning rate 3e-2; after the RDP
    step rework that rate collapses some runs -- docs/experiments.md -- and on validation data
    16-32-128 pruned less than half of its parameters at every rate tried.)"""
    from vmfdist.experiments import digits, pruning

    xtr, xte, ytr, yte = digits.load()
    with digits.one_thread():
        torch.manual_seed(0)
        model = vnn.to_bayesian(digits.lenet5(), "rdp", grouping="double")
        digits.train_elbo(model, xtr, ytr, 60, lr=5e-3, seed=0, radius_lr=pruning.RADIUS_LR)
        thresholds = {f"{name}.{side}": vnn.gap_threshold(v) for name, d in vnn.log_modes(model).items()
                      for side, v in d.items()}
        small = vnn.compress(model, threshold=thresholds)
        with torch.no_grad(), vnn.deterministic(model, "mean"):
            correct = int((model(xte).argmax(-1) == yte).sum())
            correct_small = int((small(xte).argmax(-1) == yte).sum())
    n = len(yte)
    assert correct >= 0.95 * n  # counts: 95 % of 360 is exactly 342
    assert correct_small >= correct - 0.01 * n
    assert vnn.count_parameters(small) < 0.5 * vnn.count_parameters(model)
