"""vmfdist.laplace fitted under torch.distributed (gloo, 2 CPU processes): each rank fits on its
half of the data with ``fit(..., distributed=True)``; every rank must then hold the approximation
of the whole data, equal to rounding (float64) to one process fitting all of it.  laplace-torch,
curvlinops and BackPACK have no multi-process fit to compare with; the reference is the
single-process fit, itself compared with laplace-torch in tests/test_laplace*.py."""
import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from vmfdist.laplace import Laplace

DT = torch.float64
CASES = [("all", "kron"), ("all", "ekfac"), ("all", "diag"), ("all", "full"), ("last_layer", "kron")]


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(DT)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(40, 4, generator=g, dtype=DT)
    y = torch.randint(0, 3, (40,), generator=g)
    return model, X, y


def _batches(X, y, size=7):
    return [(X[i:i + size], y[i:i + size]) for i in range(0, len(X), size)]


def _summary(la, X):
    out = {"n_data": torch.tensor(la.n_data), "loss": torch.as_tensor(la.loss).reshape(1),
           "pred": la(X[:6])}
    for pp in (1.0, 0.3):
        la.prior_precision = pp
        out[f"lml{pp}"] = la.log_marginal_likelihood().reshape(1)
    return out


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model, X, y = _setup()
        half = len(X) // world
        shard = slice(rank * half, (rank + 1) * half)
        for subset, structure in CASES:
            la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
            la.fit(_batches(X[shard], y[shard]), distributed=True)
            torch.save(_summary(la, X), os.path.join(out_dir, f"{subset}-{structure}-{rank}.pt"))
        dist.barrier()  # both ranks finish before either tears gloo down (see test_optim_distributed.py)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def two_rank_results():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        yield {(s, h, r): torch.load(os.path.join(tmp, f"{s}-{h}-{r}.pt")) for s, h in CASES for r in (0, 1)}


@pytest.mark.parametrize("subset,structure", CASES)
def test_two_ranks_equal_one_process_on_all_data(two_rank_results, subset, structure):
    model, X, y = _setup()
    la = Laplace(model, "classification", subset_of_weights=subset, hessian_structure=structure)
    la.fit(_batches(X, y))
    ref = _summary(la, X)
    for rank in (0, 1):
        got = two_rank_results[(subset, structure, rank)]
        assert int(got["n_data"]) == 40
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-11, atol=1e-13, msg=lambda m: f"rank {rank} {k}: {m}")


def test_distributed_without_a_process_group_is_refused():
    model, X, y = _setup()
    la = Laplace(model, "classification")
    with pytest.raises(ValueError, match="distributed=True needs an initialised torch.distributed process group"):
        la.fit(_batches(X, y), distributed=True)
