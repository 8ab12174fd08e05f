"""Shared plumbing of the experiments: run metadata, a progress bar, result files."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, List, Optional

import torch


def run_metadata(argv: Optional[list] = None) -> dict:
    """Commit, versions and machine of this run (recorded beside every result)."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        # only code and data count: results written under docs/ (by this or a concurrent run) and
        # prose do not change what a run computes
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                     ":(top)", ":(top,exclude)docs"], cwd=here,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "commit": commit,
        "dirty": dirty,
        "command": "python -m vmfdist.experiments " + " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def progress(items: Iterable, label: str, total: Optional[int] = None, stream=None):
    """Yield ``items`` while drawing a one-line text bar (on stderr) with elapsed time."""
    stream = stream or sys.stderr
    items = list(items) if total is None else items
    total = len(items) if total is None else total
    start = time.perf_counter()
    width = 30

    def draw(done):
        filled = int(width * done / max(total, 1))
        el = time.perf_counter() - start
        stream.write(f"\r{label:<28} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {el:7.1f}s")
        stream.flush()

    draw(0)
    for i, item in enumerate(items):
        yield item
        draw(i + 1)
    stream.write("\n")
    stream.flush()


#: where results go unless ``--out`` says otherwise: a folder in the working directory, never the
#: recorded tables under ``docs/experiments`` (record a run there with ``--out docs/experiments``)
DEFAULT_OUT = "vmfdist-results"


def out_argument(p, files: str) -> None:
    """The ``--out`` option of every experiment."""
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"folder for {files} (default: ./{DEFAULT_OUT}; the recorded runs are in docs/experiments, "
                        "written there only when named)")


def prepare_out(out: str) -> str:
    """Create ``out`` and check that files can be written in it, before any training
    (``ValueError`` naming ``--out`` otherwise)."""
    try:
        os.makedirs(out, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"--out {out!r} is not a writable folder: {e.strerror or e}") from None
    return out


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file in ``path``'s folder, then a rename onto ``path``, so
    that a kill mid-write leaves the previous file, never a truncated one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:func:`atomic_write`)."""
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    atomic_write(path, write)


def minibatches(n: int, batch: int, gen: torch.Generator):
    """Index tensors of one epoch's shuffled mini-batches of ``batch`` (the last one smaller)."""
    perm = torch.randperm(n, generator=gen)
    for i in range(0, n, batch):
        yield perm[i:i + batch]


def write_json(path: str, payload: dict) -> None:
    """``payload`` as JSON, atomically (:func:`write_text`)."""
    write_text(path, json.dumps(payload, indent=1, sort_keys=False) + "\n")


def mean_se(values) -> tuple:
    """Mean and standard error (sample standard deviation / sqrt(n); 0 for one value)."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64)
    if t.numel() == 0:
        return float("nan"), float("nan")
    se = float(t.std(unbiased=True) / t.numel() ** 0.5) if t.numel() > 1 else 0.0
    return float(t.mean()), se


def header(title: str, meta: dict, wall_seconds: float, extra: str = "") -> List[str]:
    """The first lines of a result page: title, command, commit (flagged when the tree had
    uncommitted changes) and wall time."""
    return [f"# {title}", "",
            f"Command: `{meta.get('command', '')}`; commit `{meta.get('commit')}`"
            f"{' (uncommitted changes)' if meta.get('dirty') else ''}; wall time {wall_seconds:.0f} s"
            + (f"; {extra}" if extra else "") + "."]


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend, or ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    return plt


def write_results(out: str, stem: str, results: dict, plot: Callable[[str], Optional[str]],
                  markdown: Callable[[dict, Optional[str]], str]) -> None:
    """``<out>/<stem>.json``, the picture ``plot(<out>/<stem>.png)`` (its path, or ``None``
    when it could not be drawn) and ``<out>/<stem>.md`` (``markdown(results, picture)``, also
    printed)."""
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, f"{stem}.json"), results)
    picture = plot(os.path.join(out, f"{stem}.png"))
    text = markdown(results, picture)
    write_text(os.path.join(out, f"{stem}.md"), text)
    print(text)


def save_checkpoint(path: str, state: dict) -> None:
    """``torch.save(state)`` to ``path`` atomically (a kill mid-write keeps the previous checkpoint)."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: str, settings: dict) -> Optional[dict]:
    """The checkpoint at ``path`` (``None`` when there is none); ``ValueError`` when it was
    written with other ``settings`` (its ``"settings"`` entry), so that ``--resume`` never
    continues a different run."""
    if not os.path.exists(path):
        return None
    state = torch.load(path, weights_only=False)
    if state.get("settings") != settings:
        raise ValueError(f"--resume: the checkpoint {path!r} belongs to a run with other settings "
                         f"({state.get('settings')}); remove it or run with the same options")
    return state
