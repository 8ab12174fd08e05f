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


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow; run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


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
