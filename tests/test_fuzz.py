"""Fuzz test of every public op (issue 14): each case group of tests/fuzz_worker.py runs in
its own subprocess with a timeout, so that a hang FAILS the test instead of stalling the
run, and a crash fails it with the signal.  The fast part runs in CI (a few dozen
hypothesis examples per group, about 20 s in all on the 2 shared cores here); the
long campaign (many more examples per group) runs under ``--slow``.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (group, examples in CI, examples under --slow); the timeouts are generous for a loaded
# machine -- they are there to turn a hang into a failure, not to measure speed.
GROUPS = [
    ("special_conventions", 1, 1),
    ("special_reference", 120, 3000),
    ("papers_reference", 40, 1000),
    ("vmf_samples", 80, 2000),
    ("radial_and_kron", 30, 500),
]
TIMEOUT_FAST = 240
TIMEOUT_SLOW = 3600


def _run(group: str, examples: int, timeout: float, worker: str = "tests.fuzz_worker") -> str:
    """Run one case group of ``worker`` in a subprocess; its last output line (the counts)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        proc = subprocess.run([sys.executable, "-m", worker, group, str(examples)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stdout or b"")[-2000:] if isinstance(e.stdout, bytes) else (e.stdout or "")[-2000:]
        pytest.fail(f"fuzz group {group!r} did not finish within {timeout} s (a hang?)\n{tail}")
    if proc.returncode != 0:
        pytest.fail(f"fuzz group {group!r} failed (return code {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


@pytest.mark.parametrize("group,examples", [(g, n) for g, n, _ in GROUPS])
def test_fuzz_fast(group, examples):
    _run(group, examples, TIMEOUT_FAST)


@pytest.mark.slow
@pytest.mark.parametrize("group,examples", [(g, n) for g, _, n in GROUPS])
def test_fuzz_campaign(group, examples):
    _run(group, examples, TIMEOUT_SLOW)


def test_harness_turns_a_hang_into_a_failure():
    """The harness itself: a group that never returns fails its test (after the timeout)."""
    with pytest.raises(pytest.fail.Exception, match="did not finish"):
        _run("_hang", 1, 5)
