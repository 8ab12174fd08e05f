"""Fuzz test of the upper floors' public API (issue 22): optimizers, Laplace, layers / ELBO /
predict / metrics, and the experiment commands' arguments.  Each case group of
tests/fuzz_upper_worker.py runs in its own subprocess with a timeout (tests/test_fuzz.py's
harness: a hang or a crash fails the test).  The properties every case must satisfy are written
down in the worker's docstring: a result that is finite, shaped and in range, or a clear refusal
naming the argument, with nothing half-changed.  A few dozen examples per group in CI; the long
campaign under ``--slow``.
"""
from __future__ import annotations

import re

import pytest

from .test_fuzz import TIMEOUT_FAST, TIMEOUT_SLOW, _run

WORKER = "tests.fuzz_upper_worker"
# (group, examples in CI, examples under --slow)
GROUPS = [
    ("optim", 20, 400),
    ("laplace", 15, 300),
    ("nn_layers", 20, 400),
    ("experiment_args", 20, 200),
]


def _check(line: str, group: str) -> None:
    m = re.search(r"(\d+) cases, (\d+) results, (\d+) clear refusals, 0 silent wrong", line)
    assert m and line.startswith(f"{group}: ok"), line
    cases, results, refusals = map(int, m.groups())
    assert cases == results + refusals and cases > 0, line


@pytest.mark.parametrize("group,examples", [(g, n) for g, n, _ in GROUPS])
def test_upper_fuzz_fast(group, examples):
    _check(_run(group, examples, TIMEOUT_FAST, WORKER), group)


@pytest.mark.slow
@pytest.mark.parametrize("group,examples", [(g, n) for g, _, n in GROUPS])
def test_upper_fuzz_campaign(group, examples):
    line = _run(group, examples, TIMEOUT_SLOW, WORKER)
    print(line)
    _check(line, group)
