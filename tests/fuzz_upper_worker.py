"""Fuzz cases over the upper floors' public API (issue 22), one case group per process.

Run by tests/test_fuzz_upper.py as ``python -m tests.fuzz_upper_worker GROUP EXAMPLES`` in a
subprocess with a timeout (a hang fails that test, a crash fails it with its signal).  Each
group draws small models, settings and batches with hypothesis (derandomised, no example
database), bad ones among them -- wrong target shapes and dtypes, labels out of range, NaN
inputs, empty batches, non-positive or non-finite hyper-parameters, frozen and tied layers,
half precision, the meta device, unusable experiment arguments -- and checks the properties
below on every case.  A case ends in one of two ways, and anything else is a violation:

* **a result** -- finite (or of a documented non-finite kind), of the documented shape, in
  the documented range (probabilities sum to 1; ECE, accuracy in [0, 1]; ...);
* **a clear refusal** -- ``ValueError`` / ``TypeError`` / ``FloatingPointError`` (or, for the
  experiment commands, the parser's exit status 2) whose message names the argument or the
  quantity at fault (a case lists the words that may name it) -- and **no state half-changed**:
  after a refused optimizer step or Laplace fit the model's parameters, the optimizer's state
  and the approximation are exactly what they were.

Exit status 0 when every case passes; the last line counts the cases, results and refusals.
"""
from __future__ import annotations

import contextlib
import io
import math
import sys
import tempfile
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import vmfdist.nn as vnn
from vmfdist.laplace import EKFACLaplace, KFACLaplace
from vmfdist.optim import NoisyEKFAC, NoisyKFAC

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
                print_blob=True)
CLEAR = (ValueError, TypeError, FloatingPointError)
VERBOSE = bool(__import__("os").environ.get("VMFDIST_FUZZ_VERBOSE"))
COUNTS = {"cases": 0, "results": 0, "refusals": 0}


def fail(msg: str) -> None:
    raise AssertionError(msg)


# torch's own error when a batch does not fit the user's model (raised inside the model's forward;
# the library's part is to leave everything as it was, which the groups check)
MODEL_ERRORS = ("cannot be multiplied", "size mismatch")


@contextlib.contextmanager
def case(names, what):
    """One case: a result, or a clear refusal whose message names one of ``names`` (or torch's
    shape error from the user's model itself)."""
    COUNTS["cases"] += 1
    if VERBOSE:
        print(what, flush=True)
    try:
        yield
    except CLEAR as e:
        msg = str(e)
        if not any(n.lower() in msg.lower() for n in names):
            fail(f"{what}: {type(e).__name__} does not name any of {names}: {msg!r}")
        COUNTS["refusals"] += 1
        return
    except RuntimeError as e:
        if not any(m in str(e) for m in MODEL_ERRORS):
            raise
        COUNTS["refusals"] += 1
        return
    COUNTS["results"] += 1


def _finite(t, what):
    if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
        fail(f"{what}: non-finite result")


# ---- strategies ---------------------------------------------------------------------------------------------
def _mlp(seed, d_in, hidden, out, extra, dtype=torch.float64):
    torch.manual_seed(seed)
    layers = [nn.Linear(d_in, hidden), nn.Tanh()] + ([nn.LayerNorm(hidden)] if extra else []) + [nn.Linear(hidden, out)]
    return nn.Sequential(*layers).to(dtype)


def _targets(kind, likelihood, B, K, g):
    """Targets of a kind: good, or one of the bad kinds a user produces."""
    if likelihood == "classification":
        good = torch.randint(0, K, (B,), generator=g)
        return {"good": good, "short": good[:-1] if B > 1 else good[:0], "float": good.double(),
                "high": good + K, "negative": good - K, "matrix": good[:, None]}[kind]
    good = torch.randn(B, K, generator=g, dtype=torch.float64)
    return {"good": good, "short": good[:-1] if B > 1 else good[:0], "float": good, "high": good * 1e3,
            "negative": -good, "matrix": good[:, :1] if K > 1 else good[:, None]}[kind]


TARGET_KINDS = st.sampled_from(["good", "good", "good", "short", "float", "high", "negative", "matrix"])
INPUT_KINDS = st.sampled_from(["good", "good", "good", "nan", "inf", "empty", "wide"])


def _inputs(kind, B, d, g):
    x = torch.randn(B, d, generator=g, dtype=torch.float64)
    if kind == "nan":
        x[B // 2, 0] = math.nan
    elif kind == "inf":
        x[0, -1] = math.inf
    elif kind == "empty":
        x = x[:0]
    elif kind == "wide":
        x = torch.randn(B, d + 1, generator=g, dtype=torch.float64)
    return x


def _snapshot(model, opt=None):
    params = [p.detach().clone() for p in model.parameters()]
    state = None
    if opt is not None:
        state = {id(k): {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in st_.items()}
                 for k, st_ in opt.state.items()}
        state["counts"] = (opt.steps_taken, opt._stats_count, opt._scale_count)
    return params, state


def _unchanged(model, opt, snap, what):
    params, state = snap
    if not all(torch.equal(p, q) for p, q in zip(model.parameters(), params)):
        fail(f"{what}: the model's parameters changed although the call raised")
    if opt is None:
        return
    if (opt.steps_taken, opt._stats_count, opt._scale_count) != state["counts"]:
        fail(f"{what}: the optimizer's counters changed although the step raised")
    for k, st_ in opt.state.items():
        for n, v in st_.items():
            old = state[id(k)][n]
            if isinstance(v, torch.Tensor) and not torch.equal(v, old):
                fail(f"{what}: optimizer state {n!r} changed although the step raised")


# ---- groups ------------------------------------------------------------------------------------------------
def optim(n):
    """Noisy K-FAC / EK-FAC steps on small models with good and bad batches and settings."""

    @settings(max_examples=n, **SETTINGS)
    @given(st.sampled_from([NoisyKFAC, NoisyEKFAC]), st.sampled_from(["classification", "regression"]),
           st.integers(0, 10 ** 6), st.integers(1, 5), st.integers(1, 6), st.integers(2, 4), st.booleans(),
           st.sampled_from([1, 2]), st.sampled_from(["mc", "empirical", "type-2"]), TARGET_KINDS, INPUT_KINDS,
           st.sampled_from([0.0, 1e-4, 0.01, 1.0, -1.0, math.nan]), st.sampled_from(["none", "frozen", "tied"]),
           st.sampled_from([torch.float64, torch.float64, torch.float32, torch.float16]))
    def prop(cls, likelihood, seed, d, hidden, K, extra, particles, fisher, tkind, xkind, lr, layers, dtype):
        g = torch.Generator().manual_seed(seed)
        model = _mlp(seed, d, hidden, K, extra, dtype)
        if layers == "frozen":
            model[-1].requires_grad_(False)
        elif layers == "tied" and hidden == K:
            model[-1].weight = model[0].weight if d == hidden else model[-1].weight
        what = f"{cls.__name__} {likelihood} seed={seed} d={d} h={hidden} K={K} extra={extra} P={particles} " \
               f"{fisher} targets={tkind} x={xkind} lr={lr} layers={layers}"
        opt = None
        what += f" {dtype}"
        with case(["lr", "tied", "share", "frozen", "dtype"], what + " (constructor)"):
            opt = cls(model, 50, likelihood, seed=seed, particles=particles, fisher_type=fisher, lr=lr, T_stats=1,
                      T_inv=2, T_scale=1)
        if opt is None:
            return
        B = 4 * particles
        X, y = _inputs("good", B, d, g).to(dtype), _targets("good", likelihood, B, K, g)
        loss = opt.step(X, y.to(dtype) if y.is_floating_point() else y)  # a good step first, so that a bad one has state to lose
        _finite(loss, what + " (good step)")
        xb, yb = _inputs(xkind, B, d, g).to(dtype), _targets(tkind, likelihood, B, K, g)
        snap = _snapshot(model, opt)
        raised = True
        with case(["targets", "inputs", "labels", "class", "non-finite", "batch", "shape", "input"], what):
            loss = opt.step(xb, yb)
            raised = False
        if raised:
            _unchanged(model, opt, snap, what)
        else:
            _finite(loss, what)
            for p in model.parameters():
                _finite(p, what + " (parameters after the step)")

    prop()


def laplace(n):
    """K-FAC / EK-FAC Laplace: fits on good and bad data, hyper-parameters, predictives."""

    @settings(max_examples=n, **SETTINGS)
    @given(st.sampled_from([KFACLaplace, EKFACLaplace]), st.sampled_from(["classification", "regression"]),
           st.integers(0, 10 ** 6), st.integers(1, 4), st.integers(2, 5), st.integers(2, 3), st.booleans(),
           TARGET_KINDS, INPUT_KINDS, st.sampled_from([1.0, 0.3, 0.0, -2.0, math.nan, math.inf]),
           st.sampled_from(["probit", "mc", "bridge"]), st.integers(0, 3))
    def prop(cls, likelihood, seed, d, hidden, K, sep, tkind, xkind, pp, link, n_pred):
        g = torch.Generator().manual_seed(seed)
        model = _mlp(seed, d, hidden, K, False)
        what = f"{cls.__name__} {likelihood} seed={seed} sep={sep} targets={tkind} x={xkind} pp={pp} link={link}"
        B = 8
        X, y = _inputs("good", B, d, g), _targets("good", likelihood, B, K, g)
        la = cls(model, likelihood, separate_weight_and_bias=sep)
        la.fit([(X[:5], y[:5]), (X[5:], y[5:])])
        lml = float(la.log_marginal_likelihood())
        if not math.isfinite(lml):
            fail(what + ": non-finite log marginal likelihood on good data")
        xb, yb = _inputs(xkind, B, d, g), _targets(tkind, likelihood, B, K, g)
        snap = _snapshot(model)
        raised = True
        with case(["targets", "target", "input", "non-finite", "shape", "train_loader", "class"], what + " (fit)"):
            la.fit([(xb, yb)])
            raised = False
        if raised:
            _unchanged(model, None, snap, what)
            if float(la.log_marginal_likelihood()) != lml:
                fail(what + ": a refused fit changed the approximation")
        with case(["prior_precision"], what + " (prior precision)"):
            la.prior_precision = pp
        xp = _inputs("good", n_pred, d, g)
        with case(["x", "link_approx"], what + " (predictive)"):
            p = la(xp, link_approx=link, n_samples=8)
            if likelihood == "classification":
                if p.shape != (n_pred, K) or (n_pred and not torch.allclose(p.sum(-1), torch.ones(n_pred, dtype=p.dtype))):
                    fail(f"{what}: predictive of shape {tuple(p.shape)} or not summing to 1")
                _finite(p, what)
            else:
                mu, var = p
                if mu.shape != (n_pred, K) or var.shape != (n_pred, K, K):
                    fail(f"{what}: predictive shapes {tuple(mu.shape)}, {tuple(var.shape)}")
                _finite(mu, what)
                _finite(var, what)

    prop()


def nn_layers(n):
    """Bayesian layers, conversion, ELBO, predict and the metrics."""
    kinds = {"meanfield": vnn.MeanFieldLinear, "radial": vnn.RadialLinear, "rdp": vnn.RDPLinear}

    @settings(max_examples=n, **SETTINGS)
    @given(st.sampled_from(sorted(kinds)), st.integers(0, 10 ** 6), st.integers(1, 5), st.integers(2, 4),
           st.sampled_from([torch.float32, torch.float64, torch.float16]), st.booleans(), TARGET_KINDS,
           st.sampled_from([1, 2, 0, -3, 10 ** 12]), INPUT_KINDS,
           st.sampled_from(["probs", "logits", "nan", "uint8"]))
    def prop(kind, seed, d, K, dtype, meta, tkind, num_samples, xkind, metric_input):
        g = torch.Generator().manual_seed(seed)
        what = f"{kind} seed={seed} d={d} K={K} {dtype} meta={meta} targets={tkind} S={num_samples} x={xkind}"
        layer = None
        with case(["grouping", "in_features", "out_features"], what + " (constructor)"):
            layer = kinds[kind](d, K, device="meta" if meta else None, dtype=dtype)
        if layer is None:
            return
        devices = {t.device.type for t in list(layer.parameters()) + list(layer.buffers())}
        if devices != {"meta" if meta else "cpu"}:
            fail(f"{what}: parameters and buffers on {devices}")
        if meta:
            return
        kl = layer.kl_divergence()
        if not math.isfinite(float(kl.detach())):
            fail(f"{what}: non-finite KL at initialisation")
        model = nn.Sequential(layer).double() if dtype != torch.float16 else nn.Sequential(layer.double())
        elbo = vnn.ELBO(model, num_data=20)
        x, y = _inputs(xkind, 6, d, g), _targets(tkind, "classification", 6, K, g)
        with case(["target", "output", "input", "shape", "non-finite", "loss"], what + " (ELBO)"):
            loss = elbo(model(x), y)
            _finite(loss, what + " (ELBO)")
        with case(["num_samples", "x", "batch"], what + " (predict)"):
            pred = vnn.predict(model, x, num_samples)
            p = pred.probs
            if p.shape != (x.shape[0], K):
                fail(f"{what}: predictive probabilities of shape {tuple(p.shape)}")
            _finite(p, what + " (predict)")
        probs = torch.softmax(torch.randn(6, K, generator=g, dtype=torch.float64), -1)
        inp = {"probs": probs, "logits": torch.randn(6, K, generator=g, dtype=torch.float64) * 3,
               "nan": probs.masked_fill(torch.arange(6)[:, None] == 2, math.nan), "uint8": probs}[metric_input]
        labels = _targets(tkind, "classification", 6, K, g)
        if metric_input == "uint8" and not labels.dtype.is_floating_point:
            labels = labels.clamp(0, 255).to(torch.uint8)
        for name, fn, lo, hi in (("ece", vnn.ece, 0, 1), ("accuracy", vnn.accuracy, 0, 1),
                                 ("brier_score", vnn.brier_score, 0, 2), ("nll", vnn.nll, 0, math.inf)):
            with case(["pred", "y", "probabilities", "class"], f"{what} ({name} of {metric_input})"):
                v = float(fn(inp, labels))
                if not (lo <= v <= hi) or math.isnan(v):
                    fail(f"{what}: {name} = {v} outside [{lo}, {hi}]")

    prop()


def experiment_args(n):
    """The experiment commands' argument checks: bad arguments end with the parser's status 2 and
    a message, before any training and without writing anything."""
    from vmfdist.experiments import __main__ as cli
    from vmfdist.experiments import calibration, pruning, robustness, uci

    def never(*a, **k):
        raise AssertionError("training started")

    for mod, name in ((calibration, "run_seed"), (pruning, "run_seed"), (robustness, "_digits_cell"),
                      (robustness, "_uci_cell"), (uci, "_task")):
        setattr(mod, name, never)

    @settings(max_examples=n, **SETTINGS)
    @given(st.sampled_from(["laplace-calibration", "digits-pruning", "radial-robustness", "uci"]),
           st.sampled_from([["--seeds", "0"], ["--seeds", "-2"], ["--epochs", "0"], ["--radius-lr", "0"],
                            ["--lrs", "-1"], ["--rhos", "nan"], ["--splits", "x"], ["--splits", "99"],
                            ["--jobs", "0"], ["--epochs", "-5"], ["--set", "bbb.nope=1"], ["--methods", "zzz"],
                            ["--data-dir", "/nonexistent"], ["--out", "/proc/vmfdist-cannot-write"]]))
    def prop(name, extra):
        with tempfile.TemporaryDirectory() as tmp:
            argv = [name] + (["--data-dir", tmp] if name == "uci" and "--data-dir" not in extra else []) + extra
            if "--out" not in extra:
                argv += ["--out", tmp + "/out"]
            err = io.StringIO()
            COUNTS["cases"] += 1
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    cli.main(argv)
            except SystemExit as e:
                if e.code != 2 or "error:" not in err.getvalue():
                    fail(f"{argv}: exit {e.code} without a parser error message: {err.getvalue()[-300:]!r}")
                COUNTS["refusals"] += 1
                return
            except AssertionError:
                fail(f"{argv}: training started although the arguments are bad")
            fail(f"{argv}: accepted")

    prop()


GROUPS = {"optim": optim, "laplace": laplace, "nn_layers": nn_layers, "experiment_args": experiment_args}


def main(argv):
    group, n = argv[1], int(argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    GROUPS[group](n)
    print(f"{group}: ok; {COUNTS['cases']} cases, {COUNTS['results']} results, {COUNTS['refusals']} clear refusals, "
          "0 silent wrong, 0 hangs, 0 crashes, 0 losses")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
