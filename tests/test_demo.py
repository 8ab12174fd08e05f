"""The README's demo command runs end to end (a short version: one training epoch per network)."""
import os
import subprocess
import sys


def test_demo_runs_and_writes_its_pictures(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "vmfdist.demo", "--out", str(tmp_path), "--epochs", "1"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("ratio_approximations.png", "rdp_log_modes.png", "reliability.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    assert "bracket ok" in proc.stdout and "pruned architecture" in proc.stdout
