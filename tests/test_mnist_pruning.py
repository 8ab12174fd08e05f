"""``mnist-pruning`` (vmfdist.experiments.mnist_pruning) on synthetic MNIST-format data, and the
``rule="either"`` option of :func:`vmfdist.nn.compress` it uses."""
import argparse
import json
import math
import struct

import pytest
import torch
from torch import nn

from vmfdist import nn as vnn
from vmfdist.experiments import mnist_pruning


def _write_idx(path, array):
    t = torch.as_tensor(array, dtype=torch.uint8)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 8, t.dim()]) + b"".join(struct.pack(">I", s) for s in t.shape))
        f.write(t.numpy().tobytes())


def _synthetic_mnist(folder, n_train=200, n_test=100, seed=0):
    """Class c: a bright bar at rows 2c..2c+5 plus noise, as uint8 28x28 images."""
    g = torch.Generator().manual_seed(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = torch.arange(n) % 10
        x = torch.randint(0, 60, (n, 28, 28), generator=g)
        for c in range(10):
            x[y == c, 2 * c + 2:2 * c + 7, 4:24] += 180
        _write_idx(folder / f"{prefix}-images-idx3-ubyte", x.clamp(0, 255))
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte", y)
    return folder


def _args(argv):
    p = argparse.ArgumentParser()
    mnist_pruning.add_arguments(p)
    return p.parse_args(argv)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return _synthetic_mnist(tmp_path_factory.mktemp("mnist"))


def _numbers(results):
    """The per-seed numbers without the timings."""
    out = json.loads(json.dumps(results["seeds"]))
    for s in out:
        for net in mnist_pruning.NETWORKS:
            s[net].pop("train_seconds")
            s[net].pop("epoch_seconds")
    return out


def test_smoke_run_writes_the_results(data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    res = mnist_pruning.run(_args(["--data-dir", str(data_dir), "--seeds", "1", "--epochs", "3",
                                   "--anneal-epochs", "1", "--out", str(out)]))
    saved = json.loads((out / "mnist_pruning.json").read_text())
    assert saved["seeds"] == json.loads(json.dumps(res["seeds"]))
    assert set(saved) >= {"seeds", "meta", "wall_seconds", "settings"} and saved["meta"]["commit"] is not None
    s = saved["seeds"][0]
    for key in ("error_pruned", "error_predictive", "error_meanfield", "error_deterministic"):
        assert 0.0 <= s[key] <= 1.0
    assert len(s["architecture"]) == 4 and all(isinstance(v, int) and v >= 1 for v in s["architecture"])
    assert s["architecture"] == s["pruned"]["either"]["architecture"] and s["rule"] == "either"
    assert s["params_pruned"] == s["pruned"]["either"]["params"] <= 431080
    assert s["flops_pruned"] == s["pruned"]["either"]["flops"] <= s["unpruned"]["flops"]
    assert s["unpruned"] == {"architecture": [20, 50, 800, 500], "params": 431080,
                             "flops": 26 * 576 * 20 + 501 * 64 * 50 + 801 * 500 + 501 * 10}
    # the compressed network computes what the masked posterior mean computes
    for rule in ("either", "both"):
        p = s["pruned"][rule]
        assert p["error_mean_weights"] == pytest.approx(p["error_mean_weights_masked"], abs=0.011)
    # the kept model is the epoch with the lowest training cross-entropy (all 3 epochs are in the last 10)
    for net in mnist_pruning.NETWORKS:
        log = s[net]["log"]
        assert [e["epoch"] for e in log] == [1, 2, 3]
        assert s[net]["best_epoch"] == min(log, key=lambda e: e["cross_entropy"])["epoch"]
    # the KL weight: 2 steps per epoch, annealed over 1 epoch; its last value in epoch 1 is 1/2
    assert [e["kl_weight"] for e in s["rdp"]["log"]] == [0.5, 1.0, 1.0]
    assert s["deterministic"]["log"][0]["kl_weight"] is None
    md = (out / "mnist_pruning.md").read_text()
    assert "short run, not the paper's protocol" in md and "4-7-110-66" in md and "113148" in md
    assert "| BC-GHS | 5-10-76-16 | 169K | 15K | 1.0% |" in md  # Table 2 beside
    met = sum(p["error_mean_weights"] <= 0.011 and all(w <= t for w, t in zip(p["architecture"], (10, 20, 250, 150)))
              for p in (s["pruned"]["either"],))
    p = s["pruned"]["either"]
    assert f"| either | {100 * p['error_mean_weights']:.2f} | {100 * p['error_predictive']:.2f} | {p['params']} | " in md
    assert f"| {met} of 1 |" in md
    c = s["target_cut"]  # the cut to the target widths, scored on the 200 training images
    assert c["images"] == 200 and all(w <= t for w, t in zip(c["architecture"], (10, 20, 250, 150)))
    assert 0.0 <= c["train_error"] <= 1.0 and 0.0 <= c["train_error_gap"] <= 1.0
    assert (f"| 0 | {'-'.join(map(str, p['architecture']))} | {100 * c['train_error_gap']:.2f} | "
            f"{'-'.join(map(str, c['architecture']))} | {c['params']} | {100 * c['train_error']:.2f} |") in md
    # --report writes the page again from the results file alone
    (out / "mnist_pruning.md").unlink()
    again = mnist_pruning.run(_args(["--out", str(out), "--report"]))
    assert again["seeds"] == saved["seeds"] and (out / "mnist_pruning.md").read_text() == md
    with pytest.raises(ValueError, match="--report: no results file"):
        mnist_pruning.run(_args(["--out", str(tmp_path / "none"), "--report"]))
    assert (out / "mnist_pruning.png").exists()
    err = capsys.readouterr().err
    assert "seed 0 rdp           epoch 3/3: loss" in err and "deterministic epoch 1/3" in err


def test_resume_after_an_interruption_gives_the_same_numbers(data_dir, tmp_path, monkeypatch):
    argv = ["--data-dir", str(data_dir), "--seeds", "1", "--epochs", "3", "--anneal-epochs", "2", "--limit", "150",
            "--test-limit", "60"]
    whole = mnist_pruning.run(_args(argv + ["--out", str(tmp_path / "a")]))

    class Stop(Exception):
        pass

    def stop(net, seed, epoch):
        if (net, epoch) == ("rdp", 2):
            raise Stop

    monkeypatch.setattr(mnist_pruning, "_after_epoch", stop)
    with pytest.raises(Stop):
        mnist_pruning.run(_args(argv + ["--out", str(tmp_path / "b")]))
    assert not (tmp_path / "b" / "mnist_pruning.json").exists()
    monkeypatch.setattr(mnist_pruning, "_after_epoch", lambda *a: None)
    torch.manual_seed(12345)  # the resumed run must not depend on the global random state it starts with
    resumed = mnist_pruning.run(_args(argv + ["--out", str(tmp_path / "b"), "--resume"]))
    assert [e["epoch"] for e in resumed["seeds"][0]["rdp"]["log"]] == [1, 2, 3]
    assert _numbers(resumed) == _numbers(whole)
    # a checkpoint of other settings is refused, not continued
    with pytest.raises(ValueError, match="other settings"):
        mnist_pruning.run(_args(argv[:-4] + ["--limit", "140", "--test-limit", "60", "--out", str(tmp_path / "b"),
                                             "--resume"]))


def test_jobs_train_in_parallel_to_the_same_numbers(data_dir, tmp_path):
    """--jobs 2: every (seed, network) trained in its own worker process, then evaluated here;
    the numbers are those of the sequential run (each network has its own seed and states)."""
    argv = ["--data-dir", str(data_dir), "--seeds", "2", "--epochs", "2", "--anneal-epochs", "1", "--limit", "120",
            "--test-limit", "50"]
    seq = mnist_pruning.run(_args(argv + ["--out", str(tmp_path / "a")]))
    par = mnist_pruning.run(_args(argv + ["--out", str(tmp_path / "b"), "--jobs", "2"]))
    assert _numbers(par) == _numbers(seq) and len(par["seeds"]) == 2
    assert par["settings"]["jobs"] == 2 and par["settings"]["resume"] is False


def test_bad_options_are_refused(data_dir, tmp_path):
    with pytest.raises(ValueError, match="--epochs"):
        mnist_pruning.run(_args(["--data-dir", str(data_dir), "--epochs", "0", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="--anneal-epochs"):
        mnist_pruning.run(_args(["--data-dir", str(data_dir), "--anneal-epochs", "-1", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="--jobs"):
        mnist_pruning.run(_args(["--data-dir", str(data_dir), "--jobs", "0", "--out", str(tmp_path)]))
    with pytest.raises(ValueError, match="--data-dir"):
        mnist_pruning.run(_args(["--out", str(tmp_path)]))


def _prune_rows(factor, groups):
    with torch.no_grad():
        factor.local_radius[1, groups] -= 30.0  # log-mode far below the threshold -7


def test_either_rule_removes_the_union_of_pruned_rows_and_columns():
    torch.manual_seed(3)
    model = nn.Sequential(vnn.RDPLinear(6, 7, grouping="double"), nn.ReLU(), vnn.RDPLinear(7, 5, grouping="double"),
                          nn.ReLU(), vnn.RDPLinear(5, 3, grouping="double"))
    _prune_rows(model[0].row, [1, 4])      # hidden 1: rows 1, 4 pruned
    _prune_rows(model[2].column, [4, 6])   # ... columns 4, 6 of the next layer: union {1, 4, 6}
    _prune_rows(model[2].row, [0])         # hidden 2: row 0 pruned
    _prune_rows(model[4].column, [0, 3])   # ... columns 0, 3: union {0, 3}
    either = vnn.compress(model, threshold=-7.0, rule="either")
    both = vnn.compress(model, threshold=-7.0, rule="both")
    assert vnn.architecture(either) == "6-4-3" and vnn.architecture(both) == "6-6-4"
    full = vnn.to_deterministic(model, "mean")
    keep1, keep2 = [0, 2, 3, 5], [1, 2, 4]
    torch.testing.assert_close(either[0].weight, full[0].weight[keep1])
    torch.testing.assert_close(either[0].bias, full[0].bias[keep1])
    torch.testing.assert_close(either[2].weight, full[2].weight[keep2][:, keep1])
    torch.testing.assert_close(either[4].weight, full[4].weight[:, keep2])
    assert vnn.count_parameters(either) == 7 * 4 + 5 * 3 + 4 * 3
    with pytest.raises(ValueError, match="rule"):
        vnn.compress(model, threshold=-7.0, rule="any")


def test_either_rule_after_flatten_counts_features_and_is_the_authors_masked_forward():
    """Conv (4 channels) -> Flatten (2x2 maps: 16 features) -> Linear: the compressed network
    against the authors' masked forward written out here (inputs times the column mask, outputs,
    bias included, times the row mask), and the kept features counted by hand."""
    torch.manual_seed(4)
    model = nn.Sequential(vnn.RDPConv2d(2, 3, 3, grouping="double"), nn.ReLU(), nn.MaxPool2d(2),
                          vnn.RDPConv2d(3, 4, 3, grouping="double"), nn.ReLU(), nn.Flatten(),
                          vnn.RDPLinear(16, 6, grouping="double"), nn.ReLU(), vnn.RDPLinear(6, 3, grouping="double"))
    _prune_rows(model[3].row, [2])            # channel 2 (features 8..11)
    _prune_rows(model[6].column, [0, 1, 9])   # features 0, 1 of channel 0, 9 of channel 2
    _prune_rows(model[0].row, [1])            # conv1 channel 1
    _prune_rows(model[6].row, [5])
    small = vnn.compress(model, threshold=-7.0, rule="either")
    # 16 features - {0, 1, 8, 9, 10, 11} = 10; channels: 3 of 4; conv1: 2 of 3
    assert vnn.architecture(small) == "2-3-10-5"
    assert isinstance(small[6], vnn.prune.SelectFeatures) and small[7].in_features == 10
    # conv1's channel 1 goes by its row alone (its column in conv2 is kept)
    full = vnn.to_deterministic(model, "mean")
    masks = {}
    for i in (0, 3, 6, 8):
        lm = model[i].log_modes()
        masks[i] = ((lm["row"] > -7.0).float(), (lm["column"] > -7.0).float())
    x = torch.randn(5, 2, 10, 10)
    with torch.no_grad():
        h = full[0](x * masks[0][1].view(1, -1, 1, 1)) * masks[0][0].view(1, -1, 1, 1)
        h = full[2](full[1](h))
        h = full[3](h * masks[3][1].view(1, -1, 1, 1)) * masks[3][0].view(1, -1, 1, 1)
        h = full[5](full[4](h))
        h = full[7](full[6](h * masks[6][1]) * masks[6][0])
        ref = full[8](h * masks[8][1])  # the last layer's rows are kept (never removed)
        torch.testing.assert_close(small(x), ref)
    # under "both" nothing is removed here (no neuron has both sides pruned), only zeroed
    assert vnn.architecture(vnn.compress(model, threshold=-7.0)) == "3-4-16-6"
    assert vnn.count_flops(small, (2, 10, 10)) == (18 + 1) * 64 * 2 + (18 + 1) * 4 * 3 + 11 * 5 + 6 * 3


def test_masked_copy_matches_compress_and_zeroes_samples():
    """mnist_pruning.masked_copy: its posterior mean is the compressed network's function under
    each rule, and its weight samples are exactly zero on the pruned groups."""
    torch.manual_seed(5)
    model = nn.Sequential(vnn.RDPConv2d(1, 3, 3, grouping="double"), nn.ReLU(), nn.Flatten(),
                          vnn.RDPLinear(12, 5, grouping="double"), nn.ReLU(), vnn.RDPLinear(5, 3, grouping="double"))
    _prune_rows(model[0].row, [1])
    _prune_rows(model[3].column, [0])
    _prune_rows(model[3].row, [2])
    th = {f"{i}.{side}": -7.0 for i in (0, 3, 5) for side in ("row", "column")}
    x = torch.randn(4, 1, 4, 4)
    for rule in ("either", "both"):
        masked = mnist_pruning.masked_copy(model, th, rule)
        with torch.no_grad(), vnn.deterministic(masked, "mean"):
            torch.testing.assert_close(masked(x), vnn.compress(model, threshold=th, rule=rule)(x))
        w, b = masked[3].sample_weights(8)
        assert bool((w[:, 2] == 0).all() and (w[:, :, 0] == 0).all()) and bool((w[:, 0, 1:] != 0).all())
        assert bool((b[:, 2] == 0).all()) == (rule == "either")
    assert math.isfinite(float(vnn.kl_divergence(model).detach()))  # the original is untouched


def test_cut_to_target_keeps_the_largest_log_modes_and_scores_training_images():
    """mnist_pruning.cut_to_target on LeNet-5's RDP posterior with distinct log-modes: the four
    groupings that set the widths keep exactly their target counts of largest log-modes (the
    other groupings stay at their thresholds), and its errors are those of the masked posterior
    mean (masked_copy, a second path) on the same training images."""
    torch.manual_seed(0)
    rdp = mnist_pruning.build("rdp", 0)
    with torch.no_grad():
        for _, layer in vnn.bayesian_modules(rdp):
            for side in ("row", "column"):
                factor = getattr(layer, side)
                factor.local_radius[0] = torch.randn(factor.local_radius.shape[1]) * 0.5
    modes = {f"{n}.{s}": v.clone() for n, d in vnn.log_modes(rdp).items() for s, v in d.items()}
    gap = {k: -math.inf for k in modes}
    gap["9.column"] = float(torch.sort(modes["9.column"]).values[99:101].mean())  # 400 of fc2's 500 inputs kept
    x, y = torch.randn(60, 1, 28, 28), torch.randint(0, 10, (60,))
    c = mnist_pruning.cut_to_target(rdp, gap, modes, x, y)
    assert c["images"] == 60
    kept = {}
    for key, width in (("0.row", 10), ("3.row", 20), ("7.column", 250), ("7.row", 150)):
        kept[key] = modes[key] > c["thresholds"][key]
        assert int(kept[key].sum()) == width
        assert float(modes[key][kept[key]].min()) >= float(modes[key][~kept[key]].max())
    # the authors' rule: fc1's inputs go with their own column or conv2's channel (16 inputs each),
    # fc1's outputs with their row or fc2's column
    fc1_in = int((kept["7.column"] & kept["3.row"].repeat_interleave(16)).sum())
    fc1_out = int((kept["7.row"] & (modes["9.column"] > gap["9.column"])).sum())
    assert c["architecture"] == [10, 20, fc1_in, fc1_out] and fc1_in < 250 and fc1_out < 150
    assert c["thresholds"]["9.column"] == gap["9.column"] and c["thresholds"]["0.column"] is None
    for th, err in ((gap, c["train_error_gap"]), ({k: (-math.inf if v is None else v)
                                                  for k, v in c["thresholds"].items()}, c["train_error"])):
        masked = mnist_pruning.masked_copy(rdp, th, "either")
        assert err == mnist_pruning.errors(masked, x, y, False, 0)["error_mean_weights"]
