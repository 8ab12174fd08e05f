"""Shared plumbing of the MNIST experiments (``mnist-pruning``, ``mnist-laplace``,
``mnist-continual``): the ``--data-dir`` / ``--limit`` options, the images as tensors, the
papers' LeNet-5-Caffe, and per-epoch checkpoints for ``--resume``.

The data come from the folder the user names (:func:`vmfdist.datasets.load_mnist`: the four
IDX files, gzip-compressed or not, or torchvision's ``root/MNIST/raw/`` layout); nothing here
has a default location.
"""
from __future__ import annotations

import argparse
from typing import Tuple

import torch
from torch import nn

from ..datasets import load_mnist

DATA_HELP = ("a folder holding the four MNIST IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, "
             "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, gzip-compressed or not; or torchvision's "
             "root/MNIST/raw/ layout) -- e.g. what torchvision.datasets.MNIST(root, download=True) fetches")


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """``--data-dir`` (required), ``--limit`` and ``--test-limit`` (the first N images, for smoke runs)."""
    p.add_argument("--data-dir", default=None, help=f"required unless --download: {DATA_HELP}")
    p.add_argument("--download", action="store_true",
                   help="fetch the MNIST files (checked by SHA-256) into --data-dir, or without it into the data cache "
                        "($VMFDIST_DATA or ~/.cache/vmfdist), when they are not there yet (vmfdist.datasets.download_mnist)")
    p.add_argument("--limit", type=int, default=None,
                   help="use only the first N training images (default: all 60000; for quick and smoke runs)")
    p.add_argument("--test-limit", type=int, default=None,
                   help="use only the first N test images (default: all 10000)")


def check_positive(**values) -> None:
    """``ValueError`` naming the first option that is not a positive integer (``None`` passes)."""
    for name, v in values.items():
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {v!r}")


def load(args, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_test, y_test)`` from ``args.data_dir``: pixels scaled to [0, 1],
    shape ``(N, 1, 28, 28)``, the first ``args.limit`` / ``args.test_limit`` images."""
    download = getattr(args, "download", False)
    if args.data_dir is None and not download:
        raise ValueError(f"--data-dir is required: {DATA_HELP}; or pass --download to fetch them")
    check_positive(limit=args.limit, test_limit=args.test_limit)
    xtr, ytr = load_mnist(args.data_dir, train=True, download=download)
    xte, yte = load_mnist(args.data_dir, train=False, download=download)
    xtr, ytr = xtr[:args.limit], ytr[:args.limit]
    xte, yte = xte[:args.test_limit], yte[:args.test_limit]
    scale = lambda x: (x.to(dtype) / 255.0).unsqueeze(1).contiguous()  # noqa: E731
    return scale(xtr), ytr, scale(xte), yte


def split_validation(x: torch.Tensor, y: torch.Tensor, count: int, seed: int = 0):
    """``(x_fit, y_fit, x_val, y_val)``: ``count`` images drawn at random (fixed ``seed``) held out."""
    if not 0 < count < len(x):
        raise ValueError(f"a validation set of {count} images needs more than {count} training images, got {len(x)}")
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    val, fit = perm[:count], perm[count:]
    return x[fit], y[fit], x[val], y[val]


def lenet5_caffe(classes: int = 10) -> nn.Sequential:
    """LeNet-5-Caffe as in the papers (Oh et al. 2019, Table 2): conv 20 5x5 -> max-pool 2 ->
    conv 50 5x5 -> max-pool 2 -> fc 800 -> 500 -> fc 500 -> ``classes``, ReLU activations
    (431,080 parameters for 10 classes)."""
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(20, 50, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, classes))


def rng_state() -> dict:
    """torch's global random state (saved in checkpoints so that a resumed run draws the same numbers)."""
    return {"torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
