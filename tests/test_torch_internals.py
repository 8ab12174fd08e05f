"""The torch internals vmfdist relies on (vmfdist/_torch_internals.py), one test per internal.

Each test pins down the behaviour the library assumes, on the internal itself and through its
wrapper, so that a torch release that changes it fails here by name instead of making the
library silently slower or wrong; and the wrappers' own promises: nothing is probed at import
time, a failed check raises a ``RuntimeError`` naming the torch version and the internal, and
``VMFDIST_NO_TORCH_INTERNALS=1`` takes the public path with the same results.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import vmfdist.nn as vnn
from vmfdist import _torch_internals as ti
from vmfdist.distributions import meanfield_sample_kl
from vmfdist.linalg import kron_eigen_matvec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DT = torch.float64
TORCH = re.escape(torch.__version__)


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    """Every test starts and ends with no verdicts (and without the switch), so that probes run
    (again) under what the test set up and no test leaves a patched verdict behind."""
    monkeypatch.delenv(ti.ENV, raising=False)
    ti._forget()
    yield
    ti._forget()


# ---------------------------------------------------------------------------
# nothing at import time

# modules allowed to probe torch at import time (none)
_PROBES_AT_IMPORT_PENDING: set = set()


def test_importing_vmfdist_runs_no_autograd_and_no_probe():
    """Every module of the package imported in a fresh process: no call reaches the autograd
    engine (torch.autograd.grad and backward go through it too) from vmfdist code, and no
    internal has been checked yet."""
    code = textwrap.dedent(f"""
        import pkgutil, traceback, importlib
        import torch
        calls = []
        engine = torch.autograd.Variable._execution_engine

        class Spy:
            def __getattr__(self, name):
                return getattr(engine, name)

            def run_backward(self, *args, **kwargs):
                calls.append([f.filename for f in traceback.extract_stack()])
                return engine.run_backward(*args, **kwargs)

        torch.autograd.Variable._execution_engine = Spy()
        import vmfdist
        for m in pkgutil.walk_packages(vmfdist.__path__, "vmfdist."):
            if not m.name.endswith("__main__"):
                importlib.import_module(m.name)
        from vmfdist import _torch_internals
        pending = {sorted(_PROBES_AT_IMPORT_PENDING)!r}
        origins = [[f for f in c if "vmfdist" in f][-1:] for c in calls]  # the innermost vmfdist frame
        bad = [o for o in origins if not o or not any(o[0].endswith(p) for p in pending)]
        print("VERDICTS", _torch_internals._VERDICTS)
        print("CALLS", len(bad))
        for o in bad:
            print("FROM", o)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "VERDICTS {}" in out.stdout, out.stdout
    assert "CALLS 0" in out.stdout, out.stdout


# ---------------------------------------------------------------------------
# torch._C._AutoDispatchBelowAutograd


def test_below_autograd_skips_the_autograd_key():
    """Ops inside the guard record no graph even in grad mode, and compute the same values
    (an aten op, and a vmfdist op with a Python autograd registration)."""
    assert hasattr(torch._C, "_AutoDispatchBelowAutograd")
    x = torch.randn(3, 4, dtype=DT, requires_grad=True)
    q_out, q_in = torch.linalg.qr(torch.randn(3, 3, dtype=DT))[0], torch.linalg.qr(torch.randn(4, 4, dtype=DT))[0]
    scale = torch.rand(3, 4, dtype=DT) + 0.5
    with torch.enable_grad():
        ref = kron_eigen_matvec(q_out, q_in, scale, x, -1.0)
        assert ref.grad_fn is not None
        with ti.below_autograd():
            y = x * 2.0
            got = kron_eigen_matvec(q_out, q_in, scale, x, -1.0)
            assert torch.is_grad_enabled()
    assert y.grad_fn is None and not y.requires_grad
    assert got.grad_fn is None and not got.requires_grad
    assert torch.equal(got, ref.detach())
    # and the autograd key is back after the guard
    with torch.enable_grad():
        assert (x * 2.0).grad_fn is not None


# ---------------------------------------------------------------------------
# torch.autograd.Variable._execution_engine.run_backward


def test_engine_returns_what_autograd_grad_returns():
    """The engine called directly (the signature _torch_internals uses) gives torch.autograd.grad's
    gradients: several inputs, an unused one (None), retain_graph, a non-scalar grad_out."""
    engine = torch.autograd.Variable._execution_engine
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(5, 4, dtype=DT, generator=g, requires_grad=True)
    w2 = torch.randn(3, 5, dtype=DT, generator=g, requires_grad=True)
    unused = torch.randn(2, dtype=DT, requires_grad=True)
    x = torch.randn(7, 4, dtype=DT, generator=g)
    h = torch.tanh(x @ w1.T)
    out = h @ w2.T
    grad_out = torch.randn(7, 3, dtype=DT, generator=g)
    want = torch.autograd.grad(out, (w1, w2, h, unused), grad_outputs=grad_out, retain_graph=True, allow_unused=True)
    raw = engine.run_backward((out,), (grad_out,), True, False, (w1, w2, h, unused), True, False)
    got = ti.grad(out, [w1, w2, h, unused], grad_out, False)
    for r in (raw, got):
        assert isinstance(r, tuple) and len(r) == 4 and r[3] is None
        for a, b in zip(r[:3], want[:3]):
            assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        ti.grad(out, [w1], grad_out, False)  # retain=False freed it
    assert ti._probe_engine() is None


# ---------------------------------------------------------------------------
# Tensor._version, AddBackward0, saved_tensors after backward (the mean-field KL cache)


def test_version_counts_in_place_changes_only():
    t = torch.zeros(3, dtype=DT)
    v = t._version
    assert ti.version(t) == v
    t.add_(1.0)
    t[0] = 2.0
    t.copy_(torch.ones(3, dtype=DT))
    assert ti.version(t) == v + 3
    _ = t + 1.0
    assert ti.version(t) == v + 3
    p = torch.nn.Parameter(torch.zeros(2, dtype=DT))
    p.grad = torch.ones(2, dtype=DT)
    v = ti.version(p)
    torch.optim.SGD([p], lr=0.1).step()
    assert ti.version(p) > v
    v = ti.version(p)
    p.data.add_(1.0)  # the documented blind spot: changes through .data are not counted
    assert ti.version(p) == v


def test_the_node_of_a_sum_is_add_backward0_and_its_first_input_is_the_first_addend():
    """kl_w + kl_b of the mean-field layer: the sum's node is AddBackward0 and its first next
    function is the node of the weight's fused op (whose saved tensors the cache inspects)."""
    g = torch.Generator().manual_seed(1)
    mu, rho = (torch.randn(4, 3, dtype=DT, generator=g).requires_grad_() for _ in range(2))
    mb, rb = (torch.randn(4, dtype=DT, generator=g).requires_grad_() for _ in range(2))
    _, kl_w = meanfield_sample_kl(mu, rho, 0.0, 1.0, (1,))
    _, kl_b = meanfield_sample_kl(mb, rb, 0.0, 1.0, (1,))
    total = kl_w + kl_b
    assert type(total.grad_fn).__name__ == "AddBackward0"
    assert total.grad_fn.next_functions[0][0] is kl_w.grad_fn
    assert ti.first_addend(total.grad_fn) is kl_w.grad_fn
    assert ti.first_addend(kl_w.grad_fn) is kl_w.grad_fn and ti.first_addend(None) is None


def test_saved_tensors_raise_once_backward_freed_the_graph():
    g = torch.Generator().manual_seed(2)
    mu, rho = (torch.randn(5, dtype=DT, generator=g).requires_grad_() for _ in range(2))
    w, kl = meanfield_sample_kl(mu, rho, 0.0, 1.0, (2,))
    node = kl.grad_fn
    assert len(node.saved_tensors) > 0 and ti.graph_alive(node)
    (w.sum() + kl).backward()
    with pytest.raises(RuntimeError):
        node.saved_tensors
    assert not ti.graph_alive(node) and not ti.graph_alive(None)
    assert ti._probe_kl_cache() is None and ti.versions_available()


# ---------------------------------------------------------------------------
# torch._is_all_true, torch._assert_async


def test_is_all_true():
    assert torch._is_all_true(torch.tensor([True, True])) and not torch._is_all_true(torch.tensor([True, False]))
    for t in (torch.tensor([True, True]), torch.tensor([True, False]), torch.tensor(True), torch.ones(0, dtype=bool)):
        assert ti.is_all_true(t) is bool(t.all())


def test_assert_async():
    torch._assert_async(torch.tensor(True), "fine")
    with pytest.raises(RuntimeError):
        torch._assert_async(torch.tensor(False), "not fine")
    ti.assert_async(torch.tensor([True]).all(), "fine")
    with pytest.raises(RuntimeError, match="the matrix is not fine"):
        ti.assert_async(torch.tensor([True, False]).all(), "the matrix is not fine")


# ---------------------------------------------------------------------------
# no silent fallback; the public path on request


def test_a_missing_internal_raises_naming_torch_and_the_internal(monkeypatch):
    monkeypatch.delattr(torch._C, "_AutoDispatchBelowAutograd")
    with pytest.raises(RuntimeError, match=rf"torch._C._AutoDispatchBelowAutograd, which changed in torch "
                                           rf"{TORCH}.*{ti.ENV}=1"):
        ti.below_autograd()
    with pytest.raises(RuntimeError, match="_AutoDispatchBelowAutograd"):  # every time, not only the first
        ti.below_autograd()
    monkeypatch.delattr(torch, "_is_all_true")
    with pytest.raises(RuntimeError, match=rf"torch._is_all_true, which changed in torch {TORCH}"):
        ti.is_all_true(torch.tensor(True))


def test_an_engine_that_disagrees_raises(monkeypatch):
    engine = torch.autograd.Variable._execution_engine

    class Changed:
        def run_backward(self, *args, **kwargs):
            # torch's own call (keywords) still works; ours (positional) now returns something else
            out = engine.run_backward(*args, **kwargs)
            return out if kwargs else out[:1]

    monkeypatch.setattr(torch.autograd.Variable, "_execution_engine", Changed())
    x = torch.ones(2, dtype=DT, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"run_backward, which changed in torch .* it returned"):
        ti.grad((x * x).sum(), [x], torch.ones((), dtype=DT), False)
    # on another device than the CPU the public path is taken anyway: no check needed
    monkeypatch.setattr(torch.autograd.Variable, "_execution_engine", engine)
    ti._forget()
    monkeypatch.setattr(torch.autograd.Variable, "_execution_engine", object())
    with pytest.raises(RuntimeError, match="run_backward, which changed in torch .* no longer exists"):
        ti.grad((x * x).sum(), [x], torch.ones((), dtype=DT), False)


def test_a_kl_cache_internal_that_changed_raises(monkeypatch):
    monkeypatch.setattr(ti, "graph_alive", lambda node: True)  # as if saved_tensors no longer raised
    with pytest.raises(RuntimeError, match="saved_tensors of a custom autograd node.*no longer raises"):
        ti.versions_available()
    layer = vnn.MeanFieldLinear(3, 2, dtype=DT)
    with pytest.raises(RuntimeError, match="saved_tensors"):
        layer(torch.ones(1, 3, dtype=DT))  # the forward that would store its KL


def test_the_switch_takes_the_public_path_with_the_same_results(monkeypatch):
    monkeypatch.setenv(ti.ENV, "1")
    with monkeypatch.context() as m:  # not even looked at (torch itself needs _is_all_true back, below)
        m.delattr(torch._C, "_AutoDispatchBelowAutograd")
        m.delattr(torch, "_is_all_true")
        m.delattr(torch, "_assert_async")
        x = torch.ones(2, dtype=DT, requires_grad=True)
        with torch.no_grad(), ti.below_autograd():
            assert (x * 2.0).grad_fn is None
        y = torch.tanh(x * 3.0)
        assert torch.equal(ti.grad(y.sum(), [x], torch.ones((), dtype=DT), True)[0],
                           torch.autograd.grad(y.sum(), x)[0])
        assert ti.is_all_true(torch.tensor([True])) and not ti.is_all_true(torch.tensor([False]))
        with pytest.raises(RuntimeError, match="bad"):
            ti.assert_async(torch.tensor(False), "bad")
        assert not ti.versions_available()
    assert set(ti._VERDICTS.values()) == {"public"}
    # the mean-field layer then never hands out a cached KL: the same value, recomputed
    torch.manual_seed(3)
    layer = vnn.MeanFieldLinear(4, 3, dtype=DT, sigma_init=0.2)
    layer(torch.randn(5, 4, dtype=DT))
    assert layer._kl_cache.kl is None
    kl = layer.kl_divergence()
    monkeypatch.delenv(ti.ENV)
    ti._forget()
    layer(torch.randn(5, 4, dtype=DT))
    assert layer._kl_cache.kl is not None
    assert torch.equal(layer.kl_divergence(), kl)
