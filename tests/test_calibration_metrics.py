"""vmfdist.nn.calibration: adaptive ECE, AURC, FPR@TPR, temperature scaling, reliability diagram.

References: scikit-learn's ``roc_curve`` (FPR@TPR), numpy implementations written here from the
definitions (AURC, adaptive ECE), the average over all tie orderings (AURC with ties),
``scipy.optimize.minimize_scalar`` on the same NLL and the MLE's standard error (temperature),
and small examples worked by hand.
"""
from __future__ import annotations

import itertools
import math
import sys
import warnings

import numpy as np
import pytest
import torch

import vmfdist.nn as vnn


def _probs_with_conf(conf, guess, num_classes):
    """Rows with probability ``conf`` on class ``guess`` and the rest spread evenly."""
    conf = torch.as_tensor(conf, dtype=torch.float64)
    p = ((1 - conf) / (num_classes - 1)).unsqueeze(-1).repeat(1, num_classes)
    p[torch.arange(len(conf)), torch.as_tensor(guess)] = conf
    return p


def _random_case(n=400, c=5, seed=0, scale=2.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    probs = (scale * torch.randn(n, c, generator=g, dtype=torch.float64)).softmax(-1)
    y = torch.multinomial(probs, 1, generator=g).squeeze(-1)  # roughly calibrated
    y = torch.where(torch.rand(n, generator=g) < 0.3, torch.randint(0, c, (n,), generator=g), y)  # ... and not quite
    return probs.to(dtype), y


def _conf_err(probs, y):
    p = probs.to(torch.float64).numpy()
    return p.max(-1), (p.argmax(-1) != y.numpy()).astype(float)


# ----------------------------------------------------------------------------- adaptive ECE

def _adaptive_ece_np(conf, correct, num_bins):
    order = np.argsort(conf, kind="stable")
    total = 0.0
    for idx in np.array_split(order, num_bins):
        if len(idx):
            total += abs(correct[idx].sum() - conf[idx].sum())
    return total / len(conf)


@pytest.mark.parametrize("n,num_bins", [(400, 15), (401, 15), (37, 10), (7, 15), (1000, 1)])
def test_adaptive_ece_matches_numpy_reference(n, num_bins):
    probs, y = _random_case(n, seed=n + num_bins)
    conf, err = _conf_err(probs, y)
    ref = _adaptive_ece_np(conf, 1 - err, num_bins)
    assert float(vnn.adaptive_ece(probs, y, num_bins)) == pytest.approx(ref, rel=1e-12, abs=1e-15)
    got32 = vnn.adaptive_ece(probs.float(), y, num_bins)
    assert got32.dtype == torch.float32 and float(got32) == pytest.approx(ref, rel=1e-5, abs=1e-6)


def test_adaptive_ece_hand_examples():
    # confidences 0.6 (right), 0.9 (wrong), 0.7 (wrong), 0.8 (right); 2 bins: {0.6, 0.7}, {0.8, 0.9}
    p = torch.tensor([[0.6, 0.4], [0.1, 0.9], [0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    # |0.5 - 0.65| / 2 + |0.5 - 0.85| / 2
    assert float(vnn.adaptive_ece(p, y, 2)) == pytest.approx(0.25, rel=1e-12)
    # a fifth example, 0.95 and right: bins of 3 and 2, {0.6, 0.7, 0.8}, {0.9, 0.95}
    p5 = torch.cat([p, torch.tensor([[0.05, 0.95]], dtype=torch.float64)])
    y5 = torch.cat([y, torch.tensor([1])])
    assert float(vnn.adaptive_ece(p5, y5, 2)) == pytest.approx(3 / 5 * abs(2 / 3 - 0.7) + 2 / 5 * abs(0.5 - 0.925),
                                                               rel=1e-12)
    # one bin: |accuracy - mean confidence|
    assert float(vnn.adaptive_ece(p5, y5, 1)) == pytest.approx(abs(3 / 5 - 3.95 / 5), rel=1e-12)
    # more bins than examples: each example its own bin, the mean |correct - conf|
    assert float(vnn.adaptive_ece(p5, y5, 9)) == pytest.approx((0.4 + 0.9 + 0.7 + 0.2 + 0.05) / 5, rel=1e-12)


@pytest.mark.parametrize("ece_bins,adaptive_bins,num_classes,low", [(4, 4, 10, 0.11), (8, 4, 2, 0.5)])
def test_adaptive_ece_equals_ece_when_the_bins_coincide(ece_bins, adaptive_bins, num_classes, low):
    """``m`` confidences strictly inside each equal-width bin that can be reached: the equal-mass
    bins hold exactly the examples of the non-empty equal-width ones."""
    g = torch.Generator().manual_seed(3)
    m, width = 9, 1 / ece_bins
    first = int(low / width)
    conf = torch.cat([b * width + 0.01 + (width - 0.02) * torch.rand(m, generator=g, dtype=torch.float64)
                      for b in range(first, ece_bins)]).clamp_min(low)
    assert ece_bins - first == adaptive_bins
    guess = torch.randint(0, num_classes, (len(conf),), generator=g)
    p = _probs_with_conf(conf, guess, num_classes)
    assert torch.equal(p.max(-1).values, conf)
    y = torch.where(torch.rand(len(conf), generator=g, dtype=torch.float64) < conf, guess, (guess + 1) % num_classes)
    a, e = float(vnn.adaptive_ece(p, y, adaptive_bins)), float(vnn.ece(p, y, ece_bins))
    assert a == pytest.approx(e, rel=1e-12) and a > 0.01


def test_adaptive_ece_takes_a_categorical_predictive():
    probs, y = _random_case(200, seed=9)
    pc = vnn.PredictiveCategorical(torch.stack([probs, probs]))
    assert float(vnn.adaptive_ece(pc, y)) == pytest.approx(float(vnn.adaptive_ece(probs, y)), rel=1e-12)


# ----------------------------------------------------------------------------- AURC

def _aurc_np(conf, err):
    """Sort by decreasing confidence; the error rate of the top k, averaged over k = 1..n."""
    order = np.argsort(-conf, kind="stable")
    return float(np.mean(np.cumsum(err[order]) / np.arange(1, len(conf) + 1)))


@pytest.mark.parametrize("n", [1, 2, 50, 999])
def test_aurc_matches_numpy_reference(n):
    probs, y = _random_case(n, seed=100 + n)
    conf, err = _conf_err(probs, y)
    assert len(np.unique(conf)) == n  # no ties here
    ref = _aurc_np(conf, err)
    assert float(vnn.aurc(probs, y)) == pytest.approx(ref, rel=1e-12, abs=1e-15)
    got32 = vnn.aurc(probs.float(), y)
    assert got32.dtype == torch.float32 and float(got32) == pytest.approx(ref, rel=1e-5, abs=1e-6)


def test_aurc_hand_examples():
    # confidences 0.9, 0.8, 0.7, 0.6 with errors at the 2nd and 4th: risks 0, 1/2, 1/3, 1/2
    p = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]], dtype=torch.float64)
    y = torch.zeros(4, dtype=torch.long)
    assert float(vnn.aurc(p, y)) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4, rel=1e-12)
    assert float(vnn.aurc(p, p.argmax(-1))) == 0.0  # no errors
    assert float(vnn.aurc(p, 1 - p.argmax(-1))) == 1.0  # all errors
    # a tie at 0.8 between an error and a hit, then a hit at 0.6: risks 1/2 (either order, on
    # average), 1/2, 1/3
    pt = torch.tensor([[0.8, 0.2], [0.8, 0.2], [0.6, 0.4]], dtype=torch.float64)
    for yt in (torch.tensor([1, 0, 0]), torch.tensor([0, 1, 0])):
        assert float(vnn.aurc(pt, yt)) == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3, rel=1e-12)


def test_aurc_with_ties_is_the_mean_over_all_orderings():
    g = torch.Generator().manual_seed(5)
    conf = torch.tensor([0.9, 0.7, 0.7, 0.7, 0.5, 0.5, 0.9], dtype=torch.float64)
    guess = torch.randint(0, 3, (7,), generator=g)
    p = _probs_with_conf(conf, guess, 3)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 1])
    c, err = _conf_err(p, y)
    assert 0 < err.sum() < 7
    refs = [_aurc_np(c[list(perm)], err[list(perm)]) for perm in itertools.permutations(range(7))]
    assert float(vnn.aurc(p, y)) == pytest.approx(float(np.mean(refs)), rel=1e-12)
    assert float(vnn.aurc(p.flip(0), y.flip(0))) == pytest.approx(float(np.mean(refs)), rel=1e-12)


# ----------------------------------------------------------------------------- FPR @ TPR

def _fpr_sklearn(s_in, s_out, tpr):
    roc_curve = pytest.importorskip("sklearn.metrics").roc_curve
    labels = np.r_[np.zeros(len(s_in)), np.ones(len(s_out))]  # out of distribution = positive
    fpr, tprs, _ = roc_curve(labels, np.r_[s_in, s_out], drop_intermediate=False)
    return fpr[np.searchsorted(tprs, tpr, side="left")]  # the first ROC point with TPR >= tpr


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("n_in,n_out", [(300, 200), (57, 41), (1000, 20), (5, 1)])
def test_fpr_at_tpr_matches_sklearn_roc_curve(ties, n_in, n_out):
    g = torch.Generator().manual_seed(n_in * 7 + n_out + ties)
    s_in = torch.randn(n_in, generator=g, dtype=torch.float64)
    s_out = torch.randn(n_out, generator=g, dtype=torch.float64) + 1.0
    if ties:  # coarse scores: many ties within and across the two sets
        s_in, s_out = s_in.round(decimals=1), s_out.round(decimals=1)
    for tpr in (0.95, 0.9, 0.5, 0.8, 0.01, 1.0, 1 / 3):
        ref = _fpr_sklearn(s_in.numpy(), s_out.numpy(), tpr)
        assert float(vnn.fpr_at_tpr(s_in, s_out, tpr)) == ref, (tpr, ref)
    assert float(vnn.fpr_at_tpr(s_in.float(), s_out.float())) == _fpr_sklearn(s_in.float().numpy(),
                                                                                s_out.float().numpy(), 0.95)


def test_fpr_at_tpr_hand_examples_and_sign_convention():
    s_out = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s_in = torch.tensor([0.0, 1.5, 2.0, 5.0])
    # TPR 0.75 needs 3 of 4 flagged: threshold 2, and 2.0, 5.0 of the in-distribution pass it
    assert float(vnn.fpr_at_tpr(s_in, s_out, 0.75)) == 0.5
    # TPR 0.95 needs all 4: threshold 1
    assert float(vnn.fpr_at_tpr(s_in, s_out)) == 0.75
    # integer scores (e.g. counts) work too
    assert float(vnn.fpr_at_tpr(torch.tensor([0, 1, 2, 5]), torch.tensor([1, 2, 3, 4]), 0.75)) == 0.5
    # the convention of ood_auroc: perfectly separated, higher out of distribution
    lo, hi = torch.arange(10.0), torch.arange(10.0) + 100
    assert float(vnn.ood_auroc(lo, hi)) == 1.0 and float(vnn.fpr_at_tpr(lo, hi)) == 0.0
    assert float(vnn.ood_auroc(hi, lo)) == 0.0 and float(vnn.fpr_at_tpr(hi, lo)) == 1.0


# ----------------------------------------------------------------------------- temperature scaling

def _nll_of_temperature(z, y, t):
    a = z / t
    m = a.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(a - m).sum(-1, keepdims=True))).squeeze(-1)
    return float(np.mean(lse - a[np.arange(len(y)), y]))


def _scaled_logits(n, c, seed, num_classes=6):
    g = torch.Generator().manual_seed(seed)
    true = 1.5 * torch.randn(n, num_classes, generator=g, dtype=torch.float64)
    y = torch.multinomial(true.softmax(-1), 1, generator=g).squeeze(-1)
    return true, true * c, y


@pytest.mark.parametrize("c", [0.4, 1.0, 2.5])
def test_temperature_recovers_the_scale_within_standard_errors(c):
    n = 20000
    true, logits, y = _scaled_logits(n, c, seed=int(c * 10))
    ts = vnn.TemperatureScaling().fit(logits, y)
    # MLE of beta = 1/T: Fisher information per example = Var_{softmax(true)}(logits) at the truth
    p = true.softmax(-1)
    info = float(((p * logits ** 2).sum(-1) - (p * logits).sum(-1) ** 2).mean())
    se_t = c ** 2 / math.sqrt(n * info)  # delta method, dT = T^2 dbeta
    assert abs(float(ts.temperature) - c) < 4 * se_t, (float(ts.temperature), c, se_t)
    assert 0.001 < 4 * se_t / c < 0.1  # the check has teeth and is not a coin flip


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_temperature_minimises_the_nll_as_scipy_does(dtype):
    optimize = pytest.importorskip("scipy.optimize")
    _, logits, y = _scaled_logits(3000, 1.7, seed=4)
    logits = logits.to(dtype)
    z = logits.to(torch.float64).numpy()
    res = optimize.minimize_scalar(lambda lt: _nll_of_temperature(z, y.numpy(), math.exp(lt)),
                                   bounds=(math.log(1e-2), math.log(1e2)), method="bounded",
                                   options={"xatol": 1e-10})
    ts = vnn.TemperatureScaling().fit(logits, y)
    assert float(ts.temperature) == pytest.approx(math.exp(res.x), rel=1e-5)
    out = ts(logits)
    assert out.dtype == dtype
    ref = torch.softmax(logits.to(torch.float64) / float(ts.temperature), -1)
    torch.testing.assert_close(out.to(torch.float64), ref, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-7)
    # the calibrated probabilities are accepted by the metrics, and the NLL went down
    assert float(vnn.nll(out, y)) <= float(vnn.nll(torch.softmax(logits, -1), y)) + 1e-6


def test_temperature_edge_cases_stay_bounded():
    g = torch.Generator().manual_seed(8)
    y = torch.randint(0, 3, (100,), generator=g)
    separable = 5.0 * torch.nn.functional.one_hot(y, 3).to(torch.float64)
    with pytest.warns(RuntimeWarning, match="separable"):
        ts = vnn.TemperatureScaling().fit(separable, y)
    assert float(ts.temperature) == 1e-2
    with pytest.warns(RuntimeWarning, match="separable"):
        assert float(vnn.TemperatureScaling().fit(separable, y, bounds=(0.5, 3)).temperature) == 0.5
    wrong = -separable  # confidently wrong: the best temperature is as high as allowed
    with pytest.warns(RuntimeWarning, match="upper bound"):
        assert float(vnn.TemperatureScaling().fit(wrong, y).temperature) == 1e2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = torch.full((100, 3), 2.0, dtype=torch.float64)  # the NLL does not depend on T
        assert float(vnn.TemperatureScaling().fit(flat, y).temperature) == 1.0
    # one row of logits, each label once: no information, so T -> inf, stopped at the bound
    with pytest.warns(RuntimeWarning, match="upper bound"):
        ts = vnn.TemperatureScaling().fit(torch.tensor([[1.0, 0.0, 0.5]] * 3), torch.tensor([0, 1, 2]))
    assert float(ts.temperature) == 1e2
    # the module form: state_dict, repr, usable before fitting (T = 1)
    ts = vnn.TemperatureScaling()
    x = torch.randn(4, 3, generator=g)
    torch.testing.assert_close(ts(x), x.softmax(-1))
    assert "temperature" in ts.state_dict() and "temperature=1" in repr(ts)


# ----------------------------------------------------------------------------- reliability diagram

def test_reliability_diagram_draws_at_most_num_bins_bars():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    probs, y = _random_case(300, seed=11)
    for num_bins in (15, 4, 40):
        ax = vnn.reliability_diagram(probs, y, num_bins=num_bins)
        try:
            bars = [b for b in ax.patches if type(b).__name__ == "Rectangle"]
            _, acc, count = vnn.calibration_bins(probs, y, num_bins)
            assert 0 < len(bars) <= num_bins and len(bars) == int((count > 0).sum())
            np.testing.assert_allclose(sorted(b.get_height() for b in bars), sorted(acc[count > 0].tolist()))
            assert all(b.get_width() == pytest.approx(1 / num_bins) for b in bars)  # the equal-width bins
            assert "ECE" in ax.get_title()
        finally:
            plt.close(ax.figure)
    fig, ax = plt.subplots()
    try:
        assert vnn.reliability_diagram(probs.float(), y, 10, ax=ax) is ax
    finally:
        plt.close(fig)


def test_reliability_diagram_without_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    probs, y = _random_case(20, seed=1)
    with pytest.raises(ImportError, match="reliability_diagram needs matplotlib"):
        vnn.reliability_diagram(probs, y)


# ----------------------------------------------------------------------------- bad inputs

def test_bad_inputs_name_the_argument():
    probs, y = _random_case(30, c=4, seed=2)
    logits = 3 * torch.randn(30, 4, dtype=torch.float64)
    for metric in (vnn.adaptive_ece, vnn.aurc, vnn.reliability_diagram):
        with pytest.raises(ValueError, match="pred must be class probabilities"):
            metric(logits, y)
        with pytest.raises(ValueError, match="y must have shape"):
            metric(probs, y[:5])
        with pytest.raises(ValueError, match="y must hold integer class indices"):
            metric(probs, y.double())
        with pytest.raises(ValueError, match=r"y must hold class indices in \[0, 4\)"):
            metric(probs, y + 4)
        with pytest.raises(TypeError, match="pred must be"):
            metric(probs.tolist(), y)
        with pytest.raises(ValueError, match="pred must hold at least one example"):
            metric(probs[:0], y[:0])
    for bad_bins in (0, 2.5, True):
        with pytest.raises(ValueError, match="num_bins must be a positive int"):
            vnn.adaptive_ece(probs, y, bad_bins)
        with pytest.raises(ValueError, match="num_bins must be a positive int"):
            vnn.reliability_diagram(probs, y, bad_bins)
    s = torch.randn(10)
    with pytest.raises(TypeError, match="score_in must be a tensor"):
        vnn.fpr_at_tpr([0.1, 0.2], s)
    with pytest.raises(ValueError, match="score_out must be non-empty"):
        vnn.fpr_at_tpr(s, s[:0])
    with pytest.raises(ValueError, match="score_out holds NaN"):
        vnn.fpr_at_tpr(s, torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="score_in must hold real scores"):
        vnn.fpr_at_tpr(s > 0, s)
    # ood_auroc checks its scores alike (a NaN gave a rank-sum of garbage, e.g. 0.25)
    with pytest.raises(ValueError, match="score_in holds NaN"):
        vnn.ood_auroc(torch.tensor([float("nan"), 1.0]), s)
    with pytest.raises(ValueError, match="score_out must be non-empty"):
        vnn.ood_auroc(s, s[:0])
    with pytest.raises(TypeError, match="score_out must be a tensor"):
        vnn.ood_auroc(s, [0.1])
    assert float(vnn.ood_auroc(torch.tensor([-math.inf, 0.0]), torch.tensor([math.inf, 1.0]))) == 1.0
    for bad_tpr in (0.0, 1.5, -0.1, float("nan"), "0.95"):
        with pytest.raises(ValueError, match="tpr must be a number in"):
            vnn.fpr_at_tpr(s, s, bad_tpr)
    ts = vnn.TemperatureScaling()
    with pytest.raises(ValueError, match="logits look like probabilities"):
        ts.fit(probs, y)
    with pytest.raises(ValueError, match="logits must be floating"):
        ts.fit(y.unsqueeze(-1).repeat(1, 4), y)
    with pytest.raises(TypeError, match="logits must be a tensor"):
        ts.fit(logits.tolist(), y)
    with pytest.raises(ValueError, match=r"logits must have shape \(n >= 1, classes\)"):
        ts.fit(logits[:0], y[:0])
    nan = logits.clone()
    nan[3, 1] = float("inf")
    with pytest.raises(ValueError, match="logits holds NaN or infinite"):
        ts.fit(nan, y)
    with pytest.raises(ValueError, match="y must have shape"):
        ts.fit(logits, y[:3])
    with pytest.raises(ValueError, match=r"y must hold class indices in \[0, 4\)"):
        ts.fit(logits, y - 1)
    for bounds in ((0, 10), (2, 1), (1, float("inf")), "ab", (1,)):
        with pytest.raises(ValueError, match="bounds must"):
            ts.fit(logits, y, bounds=bounds)
    with pytest.raises(ValueError, match="logits must be floating"):
        ts(torch.zeros(3, 1))
    for t in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be a positive finite number"):
            vnn.TemperatureScaling(t)
    assert float(ts.temperature) == 1.0  # the failed fits left it alone
