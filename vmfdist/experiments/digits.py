"""Shared plumbing of the experiments on scikit-learn's ``load_digits`` (8x8 grey images, 10
classes; MNIST is not available here): the fixed train/test split, a LeNet-5-shaped network
scaled to the input, and the training loops (ELBO for the Bayesian layers, the negative log
joint for a MAP network).  Everything comes from the library's public API."""
from __future__ import annotations

import contextlib
import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from .. import nn as bnn
from . import _common

#: images per batch in every digits experiment
BATCH = 64
#: fraction of the training images held out by :func:`load_with_validation`
VALIDATION = 0.2


def load(test_size: float = 0.2, split_seed: int = 0, dtype=torch.float32) -> Tuple[torch.Tensor, ...]:
    """``(x_train, x_test, y_train, y_test)``: pixel values scaled to [0, 1] (divided by 16),
    shape ``(N, 1, 8, 8)``; a stratified split with a fixed seed (1437 / 360 images)."""
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as e:  # pragma: no cover - scikit-learn is a dependency of the experiments
        raise RuntimeError("the digits experiments need scikit-learn (pip install scikit-learn)") from e
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=dtype).reshape(-1, 1, 8, 8)
    y = torch.tensor(y)
    return tuple(train_test_split(x, y, test_size=test_size, random_state=split_seed, stratify=y))


def load_with_validation(fraction: float = VALIDATION) -> Tuple[torch.Tensor, ...]:
    """``(x_train, x_val, x_test, y_train, y_val, y_test)``: the split of :func:`load` with a
    stratified ``fraction`` of its training images (fixed seed) held out for choosing settings
    (laplace-calibration's prior precision, digits-pruning's --validation)."""
    from sklearn.model_selection import train_test_split  # load() has checked that it is there
    xtr, xte, ytr, yte = load()
    xtr, xval, ytr, yval = train_test_split(xtr, ytr, test_size=fraction, random_state=0, stratify=ytr)
    return xtr, xval, xte, ytr, yval, yte


def lenet5(c1: int = 20, c2: int = 50, hidden: int = 500, classes: int = 10) -> nn.Sequential:
    """LeNet-5-Caffe (20-50-800-500 on 28x28 MNIST) scaled to 8x8 inputs: 3x3 convolutions with
    padding 1 keep the 8x8 and 4x4 maps, so the two 2x2 poolings leave 2x2 x ``c2`` = 200
    features for the fully-connected layer: 20-50-200-500."""
    return nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(c2 * 4, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def train_elbo(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int,
               radius_lr: Optional[float] = None, likelihood=None, kl_weight: float = 1.0,
               batch: Optional[int] = None) -> List[float]:
    """Adam on the negative ELBO (``vmfdist.nn.ELBO`` with ``num_data = len(x)``); the RDP radius
    parameters (``local_*``/``global_*``) get ``radius_lr`` when given.  Returns the mean loss of
    every epoch (``nan`` once the loss stops being finite: the run is then abandoned)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    elbo = bnn.ELBO(model, num_data=len(x), likelihood=likelihood, kl_weight=kl_weight, check_finite=False)
    radius = [p for n, p in model.named_parameters() if "local_" in n or "global_" in n]
    rest = [p for n, p in model.named_parameters() if not ("local_" in n or "global_" in n)]
    groups = [{"params": rest}] + ([{"params": radius, "lr": radius_lr}] if radius and radius_lr else [])
    if likelihood is not None:
        groups.append({"params": list(likelihood.parameters())})
    opt = torch.optim.Adam(groups, lr=lr, foreach=True)
    model.train()
    losses = []
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in _common.minibatches(len(x), batch or BATCH, gen):
            out = model(x[idx])
            loss = elbo(out.squeeze(-1) if likelihood is not None else out, y[idx])
            if not torch.isfinite(loss):
                losses.append(math.nan)
                return losses
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        losses.append(total / count)
    return losses


def train_map(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int,
              prior_precision: float = 1.0, batch: int = BATCH, on_epoch=None) -> nn.Module:
    """Adam on the negative log joint per example: cross-entropy plus the N(0, 1/prior_precision)
    weight prior divided by N (weight decay ``prior_precision / N``), learning rate decayed by 0.1
    for the last quarter; ``batch`` images per step; ``on_epoch(epoch, mean loss)`` after every epoch."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    n = len(x)
    opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=True)
    steps = epochs * math.ceil(n / batch)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, (3 * steps) // 4), gamma=0.1)
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for idx in _common.minibatches(n, batch, gen):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss = loss + 0.5 * prior_precision / n * sum(p.pow(2).sum() for p in model.parameters())
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        if on_epoch is not None:
            on_epoch(epoch, total / n)
    model.eval()
    return model


@contextlib.contextmanager
def one_thread():
    """One intra-op thread inside (these networks are tiny: per-op overhead dominates, and the
    numbers do not depend on the machine's thread count)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
