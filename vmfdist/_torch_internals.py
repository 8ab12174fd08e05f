r"""Every use of torch internals in vmfdist, in one place.

torch's public API cannot say a few things the library relies on for speed; each is wrapped
here in a small named function, and ``tests/test_torch_internals.py`` has a test per internal
that fails loudly when torch changes it:

* :func:`below_autograd` -- ``torch._C._AutoDispatchBelowAutograd``: ops called inside skip
  the Autograd dispatch key (no graph, and no Python autograd layer of the custom ops, which
  costs about as much as the op on a small layer).  The noisy optimizers' sampling and
  preconditioning, which need no graph.
* :func:`grad` -- ``torch.autograd.Variable._execution_engine.run_backward``: the C++ autograd
  engine called directly for CPU tensors (``torch.autograd.grad``'s Python checks and set-up
  cost about a tenth of a small training step).  The noisy optimizers' layer-output gradients.
* :func:`versions_available`, :func:`version`, :func:`first_addend`, :func:`graph_alive` --
  ``Tensor._version`` (the in-place version counter), the class name ``AddBackward0`` of the
  node of ``a + b`` and ``saved_tensors`` raising once a backward pass has freed a graph: the
  mean-field layers' cache of the KL their sampling pass computed
  (:class:`vmfdist.nn.meanfield._KLCache`).
* :func:`is_all_true` -- ``torch._is_all_true`` (what ``torch.distributions`` itself uses to
  validate parameters, traceable by ``torch.compile``); the distributions' validation.
* :func:`assert_async` -- ``torch._assert_async``: a data-dependent check kept inside a
  ``torch.compile`` graph (the matrix normals' Cholesky check).

(``torch._check``, used by the fake kernels and the distributions, is documented public API
and is not wrapped.)

**No silent fallback.**  Each internal is checked once, on its first eager use (nothing runs at
import time, nor inside a graph ``torch.compile`` is tracing): the probe runs it on a small case and compares with what torch's public API gives.  If
the internal is missing or behaves differently -- a new torch changed it -- the call raises a
``RuntimeError`` that names the torch version and the internal, instead of quietly taking
another path.  Setting the environment variable ``VMFDIST_NO_TORCH_INTERNALS=1`` (read when an
internal is first used) makes every function here take the public path instead:
:func:`below_autograd` does nothing (callers still run under ``torch.no_grad()``), :func:`grad`
is ``torch.autograd.grad``, the KL cache is off (:func:`versions_available` is False, so the KL
is recomputed), :func:`is_all_true` is ``bool(t.all())`` and :func:`assert_async` an eager
check (a graph break under ``torch.compile``).  The results are the same; only slower.

Private module, importable by every floor of the package (``tests/test_import_rules.py``).
"""
from __future__ import annotations

import contextlib
import os
from typing import Dict, Optional, Sequence, Tuple

import torch

__all__ = ["ENV", "below_autograd", "grad", "versions_available", "version", "first_addend", "graph_alive",
           "is_all_true", "assert_async"]

#: The environment variable that switches every internal off (value ``1``).
ENV = "VMFDIST_NO_TORCH_INTERNALS"

# name -> None (checked, in use), "public" (switched off by ENV) or the error message of a failed check
_VERDICTS: Dict[str, Optional[str]] = {}
_UNKNOWN = object()


def _forget() -> None:
    """Forget every verdict (tests: the next use checks again and re-reads :data:`ENV`)."""
    _VERDICTS.clear()


def _failure(internal: str, what: str) -> str:
    return (f"vmfdist relies on the torch internal {internal}, which changed in torch {torch.__version__}: {what}.  "
            f"Set the environment variable {ENV}=1 to use torch's public API instead (the same results, "
            f"slower), and please report this to vmfdist.")


def _verdict(name: str) -> Optional[str]:
    """Run the check of ``name`` once and keep its verdict."""
    if os.environ.get(ENV, "") == "1":
        _VERDICTS[name] = "public"
    else:
        with torch.inference_mode(False), torch.enable_grad():
            _VERDICTS[name] = _PROBES[name]()
    return _VERDICTS[name]


def _use(name: str) -> bool:
    """True: use the internal; False: the public path (``ENV``); raises if its check failed."""
    v = _VERDICTS.get(name, _UNKNOWN)
    if v is _UNKNOWN:
        if torch.compiler.is_compiling():
            # nothing is probed while torch.compile traces a graph: the first eager use checks it
            return os.environ.get(ENV, "") != "1"
        v = _verdict(name)
    if v is None:
        return True
    if v == "public":
        return False
    raise RuntimeError(v)


# ---- below the autograd key --------------------------------------------------------------
def _probe_below_autograd() -> Optional[str]:
    internal = "torch._C._AutoDispatchBelowAutograd"
    guard = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
    if guard is None:
        return _failure(internal, "it no longer exists")
    x = torch.ones(2, requires_grad=True)
    try:
        with guard():
            y = x * 2.0
    except Exception as e:  # noqa: BLE001 -- any failure of the internal is reported as such
        return _failure(internal, f"entering it raised {type(e).__name__}: {e}")
    if y.grad_fn is not None or y.requires_grad or not torch.equal(y, torch.full((2,), 2.0)):
        return _failure(internal, "an op inside it still recorded a graph (or computed a different value)")
    return None


def below_autograd():
    """A context manager under which ops skip the Autograd dispatch key: no graph is recorded and
    the custom ops' Python autograd layer is not entered.  For code that needs no graph (use it
    inside ``torch.no_grad()``); with ``VMFDIST_NO_TORCH_INTERNALS=1`` it does nothing."""
    if not _use("below_autograd"):
        return contextlib.nullcontext()
    return torch._C._AutoDispatchBelowAutograd()


# ---- the autograd engine -----------------------------------------------------------------
def _engine():
    return getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)


def _run_backward(engine, out, inputs, grad_out, retain):
    # (tensors, grad_tensors, keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad)
    return engine.run_backward((out,), (grad_out,), retain, False, inputs, True, False)


def _probe_engine() -> Optional[str]:
    internal = "torch.autograd.Variable._execution_engine.run_backward"
    engine = _engine()
    if engine is None or not hasattr(engine, "run_backward"):
        return _failure(internal, "it no longer exists")
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    unused = torch.tensor([3.0], requires_grad=True)
    y = x * x
    ones = torch.ones(2)
    want = torch.autograd.grad(y, (x, unused), grad_outputs=ones, retain_graph=True, allow_unused=True)
    try:
        got = _run_backward(engine, y, (x, unused), ones, False)
    except Exception as e:  # noqa: BLE001 -- a changed signature: report it
        return _failure(internal, f"calling it as (tensors, grad_tensors, keep_graph, create_graph, inputs, "
                                  f"allow_unreachable, accumulate_grad) raised {type(e).__name__}: {e}")
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], torch.Tensor)
            and torch.equal(got[0], want[0]) and torch.equal(want[0], 2 * x.detach())
            and got[1] is None and want[1] is None):
        return _failure(internal, f"it returned {got!r} where torch.autograd.grad returns {want!r}")
    return None


def grad(out: torch.Tensor, inputs: Sequence[torch.Tensor], grad_out: torch.Tensor,
         retain: bool) -> Tuple[Optional[torch.Tensor], ...]:
    """``torch.autograd.grad(out, inputs, grad_out, retain_graph=retain, allow_unused=True)`` for a
    ``grad_out`` of ``out``'s shape and dtype (a tuple, ``None`` for an input ``out`` does not
    depend on).  For CPU tensors the C++ engine is called directly (the Python wrapper's checks and
    set-up cost 30-40 us of a 300 us small-network step); elsewhere through the wrapper (CUDA
    backward passes run in device threads that need the context the wrapper sets up), as with
    ``VMFDIST_NO_TORCH_INTERNALS=1``."""
    inputs = tuple(inputs)
    if out.device.type == "cpu" and _use("engine"):
        return _run_backward(_engine(), out, inputs, grad_out, retain)
    return torch.autograd.grad(out, inputs, grad_outputs=grad_out, retain_graph=retain, allow_unused=True)


# ---- the mean-field KL cache ---------------------------------------------------------------
class _Saved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * x


def _probe_kl_cache() -> Optional[str]:
    t = torch.zeros(2)
    v0 = getattr(t, "_version", None)
    if not isinstance(v0, int):
        return _failure("Tensor._version", "tensors no longer have an integer version counter")
    t.add_(1.0)
    if t._version <= v0:
        return _failure("Tensor._version", "an in-place op did not increase it")
    a = torch.ones(1, requires_grad=True)
    b = torch.ones(1, requires_grad=True)
    s = _Saved.apply(a) + b * 2.0
    name = type(s.grad_fn).__name__
    if name != "AddBackward0":
        return _failure("the autograd node class AddBackward0", f"the node of a + b is now {name!r}")
    first = first_addend(s.grad_fn)
    if first is s.grad_fn or type(first).__name__ != "_SavedBackward":
        return _failure("AddBackward0.next_functions", "its first entry is no longer the node of the first operand")
    if not graph_alive(first):
        return _failure("saved_tensors of a custom autograd node", "reading it before the backward pass raised")
    s.backward()
    if graph_alive(first):
        return _failure("saved_tensors of a custom autograd node", "reading it after a backward pass (which frees "
                                                                    "the graph) no longer raises")
    return None


def versions_available() -> bool:
    """Whether the mean-field layers may cache the KL of their sampling pass: the internals it
    checks (:func:`version`, :func:`first_addend`, :func:`graph_alive`) behave as assumed; False
    with ``VMFDIST_NO_TORCH_INTERNALS=1`` (the KL is then always recomputed)."""
    return _use("kl_cache")


def version(t: torch.Tensor) -> int:
    """``t._version``: the counter torch increments on every in-place change of ``t``'s data
    (not on changes through ``.data``).  Use after :func:`versions_available`."""
    return t._version


def first_addend(node):
    """For the autograd node of ``a + b``, the node of ``a``; any other node (or None) as it is."""
    if node is not None and node.next_functions and type(node).__name__ == "AddBackward0":
        return node.next_functions[0][0]
    return node


def graph_alive(node) -> bool:
    """Whether ``node`` (an autograd node with saved tensors) still holds them, i.e. no backward
    pass has freed its graph; False for None."""
    try:
        node.saved_tensors
    except (RuntimeError, AttributeError):
        return False
    return True


# ---- checks inside compiled graphs ---------------------------------------------------------
def _probe_is_all_true() -> Optional[str]:
    internal = "torch._is_all_true"
    fn = getattr(torch, "_is_all_true", None)
    if fn is None:
        return _failure(internal, "it no longer exists")
    try:
        yes, no = bool(fn(torch.tensor([True, True]))), bool(fn(torch.tensor([True, False])))
    except Exception as e:  # noqa: BLE001
        return _failure(internal, f"it raised {type(e).__name__}: {e}")
    if not yes or no:
        return _failure(internal, f"it gave {yes} for [True, True] and {no} for [True, False]")
    return None


def is_all_true(t: torch.Tensor) -> bool:
    """``bool(t.all())`` for a boolean tensor, the way ``torch.distributions`` validates
    parameters (``torch._is_all_true``, which ``torch.compile`` can trace)."""
    if not _use("is_all_true"):
        return bool(t.all())
    return bool(torch._is_all_true(t))


def _probe_assert_async() -> Optional[str]:
    internal = "torch._assert_async"
    fn = getattr(torch, "_assert_async", None)
    if fn is None:
        return _failure(internal, "it no longer exists")
    try:
        fn(torch.tensor(True), "vmfdist probe")
    except Exception as e:  # noqa: BLE001
        return _failure(internal, f"it raised {type(e).__name__} for a true condition: {e}")
    try:
        fn(torch.tensor(False), "vmfdist probe")
    except RuntimeError:
        return None
    except Exception as e:  # noqa: BLE001
        return _failure(internal, f"it raised {type(e).__name__}, not RuntimeError, for a false condition")
    return _failure(internal, "it did not raise for a false condition on the CPU")


def assert_async(cond: torch.Tensor, msg: str) -> None:
    """Check the one-element tensor ``cond`` inside a ``torch.compile`` graph, without reading it
    back (``torch._assert_async``: a ``RuntimeError`` with ``msg``, at once on the CPU, at a later
    synchronisation on CUDA).  With ``VMFDIST_NO_TORCH_INTERNALS=1``: an eager check raising
    ``RuntimeError(msg)`` (a graph break)."""
    if not _use("assert_async"):
        if not bool(cond):
            raise RuntimeError(msg)
        return
    torch._assert_async(cond, msg)


_PROBES = {"below_autograd": _probe_below_autograd, "engine": _probe_engine, "kl_cache": _probe_kl_cache,
           "is_all_true": _probe_is_all_true, "assert_async": _probe_assert_async}
