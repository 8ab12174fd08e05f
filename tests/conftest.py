"""pytest configuration: ``--slow`` option, RNG state restored after every test."""
import os
import random

import numpy as np
import pytest
import torch
from hypothesis import settings


# hypothesis examples per property test in tests/test_special.py under --slow (unless
# VMFDIST_HYPOTHESIS_EXAMPLES is set); the default there (120) keeps that file to well
# under 3 minutes on one core, this takes about 4
SLOW_HYPOTHESIS_EXAMPLES = "1500"


# CI (CI=true) explores a fixed set of hypothesis examples, so a run is reproducible and a
# landing cannot fail on an example no earlier run drew; local runs keep exploring new ones.
# The long fuzz campaign (tests/fuzz_worker.py) is derandomized on its own.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_configure(config):
    """``--slow`` also raises the number of hypothesis examples (test modules read
    VMFDIST_HYPOTHESIS_EXAMPLES at import, which happens after this hook)."""
    if config.getoption("--slow"):
        os.environ.setdefault("VMFDIST_HYPOTHESIS_EXAMPLES", SLOW_HYPOTHESIS_EXAMPLES)


# VMFDIST_REQUIRE_GPU=1 (scripts/gpu_check.sh sets it): a test that needs a GPU and skips is a
# failure, and the run stops at once if torch sees no GPU or the CUDA kernels were not built.  Not
# to be confused with VMFDIST_REQUIRE_CUDA, the build-time switch that makes a missing CUDA
# toolkit an error (CI sets that one, on a machine without a GPU).
REQUIRE_GPU = os.environ.get("VMFDIST_REQUIRE_GPU", "0") == "1"


def _needs_gpu(item) -> bool:
    """A test runs on the GPU when its name or parameters say cuda (``cpu_and_cuda()`` ids,
    ``test_cuda_*``) or it skips for want of CUDA."""
    if "cuda" in item.name.lower():
        return True
    return any("cuda" in str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers("skipif"))


def pytest_collection_modifyitems(config, items):
    for item in items:  # `pytest -m cuda` selects every test that needs a GPU
        if item.get_closest_marker("cuda") is None and _needs_gpu(item):
            item.add_marker(pytest.mark.cuda)
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow; run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_sessionstart(session):
    if not REQUIRE_GPU:
        return
    import vmfdist  # noqa: F401  (loads the extension)

    if not torch.cuda.is_available():
        pytest.exit("VMFDIST_REQUIRE_GPU=1 but torch sees no GPU", returncode=3)
    if not torch._C._dispatch_has_kernel_for_dispatch_key("vmfdist::log_bessel_iv", "CUDA"):
        pytest.exit("VMFDIST_REQUIRE_GPU=1 but vmfdist was built without its CUDA kernels", returncode=3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_GPU and rep.skipped and item.get_closest_marker("cuda") is not None and "--slow" not in str(
            rep.longrepr):
        rep.outcome = "failed"
        rep.longrepr = f"VMFDIST_REQUIRE_GPU=1: a GPU test skipped ({rep.longrepr})"


@pytest.fixture(autouse=True)
def _restore_rng_state():
    """Restore every random state a test may touch (like torchvision's conftest)."""
    py = random.getstate()
    npy = np.random.get_state()
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    yield
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


@pytest.fixture
def one_thread():
    """Small models: one intra-op thread (several threads on a loaded 2-core machine are many times slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
