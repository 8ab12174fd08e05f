"""The benchmark harness (benchmarks/harness.py) and the recorded reports in docs/benchmarks.

No speed is asserted here: these check that the harness counts, orders and records what it says,
that every recorded table is exactly what the report writer makes of its JSON, and that the
driver runs one area end to end."""
import importlib
import json
import math
import os
import time

import pytest

from benchmarks import accuracy
from benchmarks import harness as H
from benchmarks import run as R

DOCS = os.path.join(H.ROOT, "docs", "benchmarks")


def test_time_fn_repeats_until_count_and_time():
    calls = []
    t = H.time_fn(lambda: calls.append(1), min_reps=4, max_reps=7, min_total=0.0)
    assert t["reps"] == 4 and len(calls) == 5  # warm-up + 4
    calls.clear()
    t0 = time.perf_counter()
    t = H.time_fn(lambda: calls.append(time.sleep(0.002)), min_reps=1, max_reps=100, min_total=0.02)
    # stops at the first call that ends past 0.02 s of timed calls: each sleeps >= 0.002 s, so <= 10 calls
    assert time.perf_counter() - t0 >= 0.022 and 1 <= t["reps"] <= 10 and len(calls) == t["reps"] + 1
    assert 0.002 <= t["min"] <= t["median"]


def test_time_fn_long_calls_and_warmup_output():
    seen, calls = [], []

    def f():
        calls.append(1)
        time.sleep(0.03)
        return "out"

    t = H.time_fn(f, max_call=0.009, on_warmup=seen.append)  # warm-up > 3 * max_call: no second call
    assert (t["reps"], len(calls), seen) == (0, 1, ["out"])
    calls.clear()
    t = H.time_fn(f, max_call=0.029)  # max_call < warm-up <= 3 * max_call: one more call
    assert (t["reps"], len(calls)) == (0, 2) and t["min"] <= t["median"]


def test_time_rounds_interleaves():
    """A warm-up round in order, then every round calls each implementation once, in an order that
    changes between rounds (so none always follows the same one)."""
    order = []
    names = "abcd"
    res = H.time_rounds({k: (lambda k=k: order.append(k)) for k in names}, rounds=8, verbose=False)
    assert order[:4] == list(names)
    rounds = [order[4 * (r + 1):4 * (r + 2)] for r in range(8)]
    assert all(sorted(r) == list(names) for r in rounds) and len(order) == 36
    assert len({tuple(r) for r in rounds}) > 1
    assert all(len(v["times"]) == 8 and v["min"] <= v["median"] for v in res.values())


def test_split_threads_covers_range_once():
    parts = H.split_threads(lambda lo, hi: list(range(lo, hi)), 10, 3)
    assert len(parts) == 3 and sum(parts, []) == list(range(10))


def test_table_and_formats():
    t = H.Table("a", "b").add(1, None)
    assert str(t) == "| a | b |\n|---|---|\n| 1 |  |\n"
    assert str(H.Table("a", "b", "c", right=(1,)).add(1, 2, 3)) == "| a | b | c |\n|---|---:|---|\n| 1 | 2 | 3 |\n"
    assert [H.fmt_ratio(x) for x in (0.0364, 2.7, 43.14, 250.0, None)] == ["0.036×", "2.70×", "43.1×", "250×", "—"]
    assert [H.fmt_n(x) for x in (1000, 20000, 5)] == ["1e3", "2e4", "5e0"]
    assert [H.fmt_time(x) for x in (3.1e-5, 0.4372, 2.0)] == ["31.0 µs", "437.20 ms", "2.00 s"]


def test_json_keeps_inf_and_nan(tmp_path):
    p = str(tmp_path / "x.json")
    H.save_json({"a": [math.inf, -math.inf, 1.5], "b": {"c": math.nan}}, p)
    json.load(open(p))  # strict JSON
    back = H.load_json(p)
    assert back["a"] == [math.inf, -math.inf, 1.5] and math.isnan(back["b"]["c"])


@pytest.mark.parametrize("area", sorted(f[:-5] for f in os.listdir(DOCS) if f.endswith(".json")))
def test_recorded_report_matches_its_json(area):
    """docs/benchmarks/<area>.md is what the report writer makes of <area>.json (no hand edits)."""
    mod = importlib.import_module(f"benchmarks.bench_{area}")
    with open(os.path.join(DOCS, f"{area}.md")) as f:
        assert mod.render(H.load_json(os.path.join(DOCS, f"{area}.json"))) == f.read()


def test_recorded_accuracy_table_matches_its_json(tmp_path):
    with open(os.path.join(H.ROOT, "docs", "accuracy.md")) as f:
        md = f.read()
    assert accuracy.render_markdown(H.load_json(os.path.join(H.ROOT, "docs", "accuracy.json"))) == md
    # --report re-renders through the shared report writer, JSON unchanged
    with open(os.path.join(H.ROOT, "docs", "accuracy.json")) as f:
        raw = f.read()
    (tmp_path / "accuracy.json").write_text(raw)
    accuracy.main(["--report", "--out", str(tmp_path)])
    assert (tmp_path / "accuracy.md").read_text() == md and (tmp_path / "accuracy.json").read_text() == raw


def test_all_skips_areas_not_in_all(tmp_path, monkeypatch, capsys):
    """broadcast needs a second tree: `all` leaves it out (and says so), `all --report` re-renders it."""
    monkeypatch.setattr(R, "areas", lambda: ["broadcast"])
    assert R.main(["all", "--quick", "--out", str(tmp_path)]) == 0
    assert "broadcast: not run by all" in capsys.readouterr().out and not list(tmp_path.iterdir())
    for ext in ("json", "md"):
        (tmp_path / f"broadcast.{ext}").write_text(open(os.path.join(DOCS, f"broadcast.{ext}")).read())
    assert R.main(["all", "--report", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "broadcast.md").read_text() == open(os.path.join(DOCS, "broadcast.md")).read()


def test_driver_runs_an_area_end_to_end(tmp_path, monkeypatch):
    import torch

    assert {"special", "vmf", "radial", "kron"} <= set(R.areas())
    for k in ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.setenv(k, os.environ.get(k, ""))  # restored after the test
        monkeypatch.delenv(k)
    threads = torch.get_num_threads()
    try:
        assert R.main(["radial", "--quick", "--repeats", "2", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    res = H.load_json(str(tmp_path / "radial.json"))
    assert res["meta"]["shape"] == [3, 3, 64, 64] and res["meta"]["seconds"] > 0
    assert set(res["rows"]) == {"composite", "ours", "composite fwd+bwd", "ours fwd+bwd", "add (bandwidth probe)"}
    md = (tmp_path / "radial.md").read_text()
    assert "| sample (forward) |" in md and "| sample fwd+bwd |" in md
    assert R.main(["radial", "--report", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "radial.md").read_text() == md


def test_gpu_area_runs_on_the_cpu(tmp_path):
    """The GPU check's benchmark (benchmarks/bench_gpu.py) through every job on the CPU, as
    scripts/gpu_check.sh --dry-run rehearses it: a table per job, times positive."""
    pytest.importorskip("vmfdist._C")
    R.main(["gpu", "--device", "cpu", "--quick", "--rounds", "1", "--lenet-steps", "1", "--out", str(tmp_path)])
    res = H.load_json(str(tmp_path / "gpu.json"))
    for job in ("bandwidth", "fused", "vmf", "kron", "layers", "optim", "lenet"):
        assert job in res, job
    assert res["bandwidth"]["Bps"] > 0 and all(r["impls"]["vmfdist"]["min"] > 0 for r in res["fused"] + res["vmf"])
    assert set(res["lenet"]) >= {"deterministic (Adam)", "radial", "rdp double", "noisy K-FAC", "noisy EK-FAC"}
    md = (tmp_path / "gpu.md").read_text()
    for title in ("Fused ops", "vMF sampling", "Kronecker op", "Layer training step: conv", "LeNet-5-Caffe"):
        assert title in md
