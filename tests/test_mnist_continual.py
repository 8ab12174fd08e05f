"""The ``mnist-continual`` experiment (vmfdist.experiments.mnist_continual) on synthetic
MNIST-format data, and :func:`vmfdist.nn.posterior_as_prior` against closed forms computed here."""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import struct

import pytest
import torch
from torch import nn

from vmfdist import nn as bnn
from vmfdist.experiments import mnist_continual as mc

N_TRAIN, N_TEST = 300, 100


# ---- synthetic MNIST-format data -----------------------------------------------------------------
def write_idx(path, array: torch.Tensor, compress: bool) -> None:
    """An IDX file of uint8 ``array``: 00 00 08 ndim, big-endian uint32 sizes, the bytes."""
    a = array.to(torch.uint8).contiguous()
    raw = bytes([0, 0, 0x08, a.dim()]) + struct.pack(f">{a.dim()}I", *a.shape) + a.numpy().tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(raw) if compress else raw)


def digits_like(n: int, gen: torch.Generator):
    """``n`` 28x28 images whose class (0..9, cycling) sets which horizontal band is bright, plus noise."""
    y = torch.arange(n) % 10
    x = torch.randint(0, 60, (n, 28, 28), generator=gen).float()
    for i, c in enumerate(y.tolist()):
        x[i, 2 + 2 * c: 6 + 2 * c, 4:24] += 180
    return x.clamp(0, 255).to(torch.uint8), y.to(torch.uint8)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mnist")
    gen = torch.Generator().manual_seed(0)
    xtr, ytr = digits_like(N_TRAIN, gen)
    xte, yte = digits_like(N_TEST, gen)
    write_idx(d / "train-images-idx3-ubyte.gz", xtr, True)
    write_idx(d / "train-labels-idx1-ubyte.gz", ytr, True)
    write_idx(d / "t10k-images-idx3-ubyte", xte, False)
    write_idx(d / "t10k-labels-idx1-ubyte", yte, False)
    return str(d)


def parse(data_dir, out, *extra):
    p = argparse.ArgumentParser()
    mc.add_arguments(p)
    return p.parse_args(["--data-dir", data_dir, "--seeds", "2", "--epochs", "2", "--batch", "8",
                         "--out", str(out), *extra])


def numbers(results):
    """Every per-seed number except the timings."""
    return [{k: v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "seconds"}
             for k, v in s.items()} for s in results["seeds"]]


@pytest.fixture(scope="module")
def full_run(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    return out, mc.run(parse(data_dir, out))


# ---- the experiment ------------------------------------------------------------------------------
def test_smoke_run_files_and_structure(full_run):
    out, res = full_run
    saved = json.load(open(os.path.join(out, "mnist_continual.json")))
    assert saved["seeds"] == json.loads(json.dumps(res["seeds"]))
    assert {"seeds", "meta", "wall_seconds", "settings"} <= set(saved)
    assert saved["meta"]["command"] and "commit" in saved["meta"] and saved["partial"] is False
    assert saved["settings"]["epochs"] == {"meanfield": 2, "radial": 2} and saved["settings"]["batch"] == 8
    assert [s["seed"] for s in saved["seeds"]] == [0, 1]
    for s in saved["seeds"]:
        for kind in ("meanfield", "radial"):
            r = s[kind]
            assert [len(row) for row in r["accuracy"]] == [1, 2, 3, 4, 5]
            assert all(0.0 <= a <= 1.0 for row in r["accuracy"] for a in row)
            assert r["average"] == pytest.approx([sum(row) / len(row) for row in r["accuracy"]])
            assert len(r["train"]) == 5 and all(math.isfinite(t["nll"]) and t["kl_per_datum"] >= 0 for t in r["train"])
            # the class-dependent images are learned: task 1, right after it is learned, is far above chance
            # (the later tasks, with ~50 images each, N(mu, 0.0025^2) priors and 12 steps, are not reliably)
            assert r["accuracy"][0][0] >= 0.9, r["accuracy"]
    md = open(os.path.join(out, "mnist_continual.md")).read()
    assert "| tasks seen | mean-field (VCL) | Radial |" in md and "| 5 (0/1, 2/3, 4/5, 6/7, 8/9) |" in md
    assert md.count(" ± ") >= 3 * 5 * 2
    assert os.path.getsize(os.path.join(out, "mnist_continual.png")) > 1000
    assert not os.path.exists(os.path.join(out, "mnist_continual.checkpoint.pt"))  # removed at the end
    # the two seeds differ (each seed is its own run) and the two methods differ
    assert saved["seeds"][0]["meanfield"]["train"] != saved["seeds"][1]["meanfield"]["train"]
    assert saved["seeds"][0]["meanfield"]["train"] != saved["seeds"][0]["radial"]["train"]


class Interrupt(Exception):
    pass


def test_resume_continues_to_the_same_numbers(data_dir, full_run, tmp_path, monkeypatch):
    """Interrupted after epoch 3 (inside task 2), at the end of a method, at the end of a seed, one
    epoch later and inside seed 2's Radial run; each time resumed: the same numbers as one run."""
    lines = []
    budget = {"left": 0}

    def progress(text):
        lines.append(text)
        budget["left"] -= 1
        if budget["left"] == 0:
            raise Interrupt(text)

    monkeypatch.setattr(mc, "_progress_line", progress)
    ckpt = tmp_path / "mnist_continual.checkpoint.pt"
    # 10 epoch lines per method and seed (5 tasks x 2 epochs): cumulative stops 3, 10, 20, 21, 33
    for i, n in enumerate((3, 7, 10, 1, 12)):
        budget["left"] = n
        torch.manual_seed(1000 + i)  # as a fresh process would: the random state comes from the checkpoint
        with pytest.raises(Interrupt):
            mc.run(parse(data_dir, tmp_path, *(["--resume"] if i else [])))
        assert ckpt.exists()
        if i == 3:  # seed 0 is complete: its results are written, marked partial
            saved = json.load(open(tmp_path / "mnist_continual.json"))
            assert len(saved["seeds"]) == 1 and saved["partial"] is True
    budget["left"] = -1
    torch.manual_seed(999)
    res = mc.run(parse(data_dir, tmp_path, "--resume"))
    assert len(lines) == 40  # no epoch was run twice or skipped
    assert numbers(res) == numbers(full_run[1])
    assert not ckpt.exists()


def test_resume_refuses_other_settings(data_dir, tmp_path, monkeypatch):
    def stop(text):
        raise Interrupt(text)

    monkeypatch.setattr(mc, "_progress_line", stop)
    with pytest.raises(Interrupt):
        mc.run(parse(data_dir, tmp_path))
    with pytest.raises(ValueError, match="other settings"):
        mc.run(parse(data_dir, tmp_path, "--resume", "--batch", "16"))


def test_bad_options(data_dir, tmp_path):
    with pytest.raises(ValueError, match="--epochs"):
        mc.run(parse(data_dir, tmp_path, "--epochs", "0"))
    p = argparse.ArgumentParser()
    mc.add_arguments(p)
    with pytest.raises(ValueError, match="--data-dir"):
        mc.run(p.parse_args(["--out", str(tmp_path)]))


# ---- posterior_as_prior --------------------------------------------------------------------------
def _gauss_kl(mu, sig, m, s):
    """sum KL(N(mu, sig^2) || N(m, s^2)), elementwise formula, float64."""
    mu, sig, m, s = (t.double() for t in (mu, sig, m, s))
    return float((torch.log(s / sig) + (sig ** 2 + (mu - m) ** 2) / (2 * s ** 2) - 0.5).sum())


def _radial_kl(mu, sig, m, s):
    """KL(Radial(mu, sig) || prod N(m, s^2)) = -H[q] - E_q log p, from scratch: w = mu + sig * r u,
    r ~ N(0, 1), u uniform on the unit sphere of R^D, so E[(w_i - mu_i)^2] = sig_i^2 / D, and the
    density of z = r u is 2 phi(|z|) / (A_D |z|^(D-1)) with A_D = 2 pi^(D/2) / Gamma(D/2):
    H[q] = sum log sig + log A_D - E log(2 phi(r)) + (D - 1) E log|r|, E log|r| = -(gamma + log 2)/2."""
    mu, sig, m, s = (t.double().reshape(-1) for t in (mu, sig, m, s))
    d = mu.numel()
    log_area = math.log(2) + 0.5 * d * math.log(math.pi) - math.lgamma(0.5 * d)
    e_log_2phi = math.log(2) - 0.5 * math.log(2 * math.pi) - 0.5
    e_log_r = -(0.5772156649015329 + math.log(2)) / 2
    entropy = float(sig.log().sum()) + log_area - e_log_2phi + (d - 1) * e_log_r
    cross = float((0.5 * torch.log(2 * math.pi * s ** 2) + ((mu - m) ** 2 + sig ** 2 / d) / (2 * s ** 2)).sum())
    return cross - entropy


def _layers(model):
    return [m for _, m in bnn.bayesian_modules(model)]


def _model(kind, seed=0):
    torch.manual_seed(seed)
    model = bnn.to_bayesian(nn.Sequential(nn.Linear(7, 5), nn.ReLU(), nn.Linear(5, 3)), kind, sigma_init=0.05)
    with torch.no_grad():  # posteriors away from the N(0, 1) prior and from each other
        for m in _layers(model):
            m.weight_rho.add_(torch.randn_like(m.weight_rho) * 0.5)
            m.bias_mu.add_(torch.randn_like(m.bias_mu))
    return model


def _kl_reference(kind, layer, prior):
    ref = _gauss_kl if kind == "meanfield" else _radial_kl
    (pw_m, pw_s), (pb_m, pb_s) = prior
    return (ref(layer.weight_mu.detach(), layer.weight_sigma.detach(), pw_m, pw_s)
            + ref(layer.bias_mu.detach(), layer.bias_sigma.detach(), pb_m, pb_s))


@pytest.mark.parametrize("kind", ["meanfield", "radial"])
def test_posterior_as_prior_kl_against_closed_forms(kind):
    model = _model(kind)
    # before: the N(0, 1) prior, KL from the formulas here
    for m in _layers(model):
        one = (torch.zeros(()), torch.ones(()))
        assert float(m.kl_divergence().detach()) == pytest.approx(_kl_reference(kind, m, (one, one)), rel=1e-5)
    assert bnn.posterior_as_prior(model) is model
    saved = [((m.weight_mu.detach().clone(), m.weight_sigma.detach().clone()),
              (m.bias_mu.detach().clone(), m.bias_sigma.detach().clone())) for m in _layers(model)]
    for m, prior in zip(_layers(model), saved):
        kl = float(m.kl_divergence().detach())
        if kind == "meanfield":  # the prior is the posterior itself
            assert abs(kl) < 1e-4
        else:  # the Gaussian with the posterior's mean and sigma: a constant of D only, > 0
            d_w, d_b = m.weight_mu.numel(), m.bias_mu.numel()
            const = _radial_kl(torch.zeros(d_w), torch.ones(d_w), torch.zeros(d_w), torch.ones(d_w)) \
                + _radial_kl(torch.zeros(d_b), torch.ones(d_b), torch.zeros(d_b), torch.ones(d_b))
            assert kl == pytest.approx(const, rel=1e-5) and kl > 0
        assert kl == pytest.approx(_kl_reference(kind, m, prior), rel=1e-5, abs=1e-4)
    # the prior stays where it was while the posterior moves (an optimizer step on a loss)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.functional.cross_entropy(model(torch.randn(16, 7)), torch.randint(0, 3, (16,))) + bnn.kl_divergence(model)
    loss.backward()
    opt.step()
    for m, prior in zip(_layers(model), saved):
        assert torch.equal(m.prior.param_loc, prior[0][0]) and torch.equal(m.prior.param_scale, prior[0][1])
        assert not torch.equal(m.weight_mu.detach(), prior[0][0])
        assert float(m.kl_divergence().detach()) == pytest.approx(_kl_reference(kind, m, prior), rel=1e-5)
        # gradients flow to the posterior, not to the (buffer) prior
        assert not m.prior.param_loc.requires_grad


def test_posterior_as_prior_state_dict_and_errors():
    a, b = _model("meanfield", 0), _model("meanfield", 1)
    bnn.posterior_as_prior(a)
    with pytest.raises(RuntimeError):  # shapes of the prior buffers differ from a fresh model's
        b.load_state_dict(a.state_dict())
    bnn.posterior_as_prior(b)  # the documented way: same call on the fresh model first
    b.load_state_dict(a.state_dict())
    for ma, mb in zip(_layers(a), _layers(b)):
        assert torch.equal(ma.prior.param_loc, mb.prior.param_loc)
        assert float(ma.kl_divergence().detach()) == float(mb.kl_divergence().detach())
    with pytest.raises(ValueError, match="no Bayesian layers"):
        bnn.posterior_as_prior(nn.Sequential(nn.Linear(2, 2)))
    rdp = bnn.to_bayesian(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), "rdp")
    before = {k: v.clone() for k, v in rdp.state_dict().items()}
    with pytest.raises(TypeError, match="RDP"):
        bnn.posterior_as_prior(rdp)
    assert all(torch.equal(before[k], v) for k, v in rdp.state_dict().items())
