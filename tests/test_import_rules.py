"""The house's import rules (../shared/DESIGN.md, "Layers of the house"), checked on the source.

Every module of the ``vmfdist`` package is parsed (not imported) and each of its
``vmfdist`` imports is resolved to the module it names.  The test fails when

* a module imports from a floor above its own (data flows downward only), or from a
  sibling the rules single out (optim never imports nn; optim and laplace never import
  each other);
* a module outside ``special``, ``random``, ``linalg`` and ``distributions`` imports the
  private ``_ops`` (the floors above use the public functions);
* an import of a ``vmfdist`` module sits inside a function or class body (such imports
  are how a cycle gets hidden);
* the module graph has a cycle;
* a torch internal (a private attribute of torch, ``Tensor._version``, the engine, a grad_fn
  class name) is used outside ``vmfdist/_torch_internals.py``;
* a module is longer than 700 lines or a function longer than 120.

The floors, bottom to top (:data:`FLOORS`).  Modules of one floor may import each other
except where a rule below forbids it; the package roots (``vmfdist/__init__.py`` and each
subpackage's ``__init__``) re-export their own floor and the floors below them.
``_torch_internals`` (every use of torch internals) sits at the bottom, so any floor may
import it.  Each check is also run on a planted violation, to show that it can fail.
"""
from __future__ import annotations

import ast
import pathlib
import re
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "vmfdist"

# rank of each top-level part of the package (higher = further up the house)
FLOORS = {
    "_C": 0,
    "_torch_internals": 0,
    "_ops": 1,
    "special": 2, "random": 2, "linalg": 2, "testing": 2, "datasets": 2,
    "distributions": 3,
    "curvature": 4,
    "nn": 5,
    "optim": 6,
    "laplace": 7,
    "experiments": 8,
    "demo": 9,
}
# (importer part, imported part) pairs forbidden although the ranks would allow them
FORBIDDEN = {("optim", "nn"), ("optim", "laplace"), ("laplace", "optim")}
# pairs allowed although the ranks would forbid them (none today; DESIGN.md lets laplace use nn,
# which the ranks already allow)
ALLOWED_UPWARD: set = set()
# the parts that may import the private _ops (besides _ops itself and the package root, which
# imports it to load the extension); testing.py has no need to
OPS_IMPORTERS = {"_ops", "special", "random", "linalg", "distributions"}
# modules that still import _ops although their floor may not, each with the reason (none today; an
# entry that no longer imports _ops fails test_ops_pending_is_current)
_OPS_PENDING: set = set()


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> list:
    """The absolute ``vmfdist`` module names an ImportFrom refers to."""
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    names = [target]
    # `from . import x` / `from .pkg import mod`: the names may be submodules
    names += [f"{target}.{a.name}" for a in node.names]
    return names


def _imports(module: str, path: pathlib.Path):
    """(imported vmfdist module, line, nested) for every vmfdist import of ``module``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    known = _modules()
    out = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name == "vmfdist" or a.name.startswith("vmfdist."):
                        out.append((a.name, child.lineno, nested))
            elif isinstance(child, ast.ImportFrom):
                cands = _resolve(module, is_pkg, child)
                if not cands[0].startswith("vmfdist"):
                    continue
                hits = [c for c in cands[1:] if c in known or (cands[0] == "vmfdist" and _part(c) in FLOORS)]
                for c in hits or [cands[0]]:
                    out.append((c, child.lineno, nested))
            visit(child, inner)

    visit(tree, False)
    return out


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph():
    return {m: _imports(m, p) for m, p in _modules().items()}


def test_every_part_has_a_floor():
    parts = {_part(m) for m in _modules()} - {""}
    assert parts <= set(FLOORS), f"modules outside the floor table: {sorted(parts - set(FLOORS))}"


def test_imports_go_downward_only():
    bad = []
    for mod, imports in _graph().items():
        src = _part(mod)
        if src == "":
            continue  # the package root re-exports everything
        for target, line, _ in imports:
            dst = _part(target)
            if dst == "" or dst == src:
                continue
            if (src, dst) in FORBIDDEN:
                bad.append(f"{mod}:{line} imports {target} ({src} must never import {dst})")
            elif FLOORS[dst] > FLOORS[src] and (src, dst) not in ALLOWED_UPWARD:
                bad.append(f"{mod}:{line} imports {target}, a floor above it ({dst} over {src})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _ops_imports():
    """(module, line, target) for every import of _ops from a part that may not import it."""
    return [(mod, line, target) for mod, imports in _graph().items() for target, line, _ in imports
            if _part(target) == "_ops" and _part(mod) not in OPS_IMPORTERS | {""}]


def test_only_special_random_linalg_and_distributions_import_ops():
    bad = [f"{mod}:{line} imports {target} (only {', '.join(sorted(OPS_IMPORTERS - {'_ops'}))} may import the "
           f"private _ops; use the public functions)" for mod, line, target in _ops_imports()
           if mod not in _OPS_PENDING]
    assert not bad, "imports of _ops:\n" + "\n".join(bad)


def test_the_pending_ops_importers_still_need_their_allowance():
    """An entry of _OPS_PENDING whose module no longer imports _ops (or no longer exists) must go."""
    still = {mod for mod, _, _ in _ops_imports()}
    assert _OPS_PENDING <= still, f"remove from _OPS_PENDING: {sorted(_OPS_PENDING - still)}"


def test_no_function_level_imports_of_vmfdist():
    bad = [f"{mod}:{line} imports {target} inside a function or class"
           for mod, imports in _graph().items() for target, line, nested in imports if nested]
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    graph = {m: sorted({t for t, _, _ in imps if t in _modules() and t != m}) for m, imps in _graph().items()}
    state, stack, cycles = {}, [], []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for n in graph.get(m, ()):
            # a package importing its own submodules (or a submodule importing its package's
            # already-initialised names) is how packages are built, not a cycle of floors
            if n.startswith(m + ".") or m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                dfs(n)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            dfs(m)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("src, dst", [("special", "distributions"), ("_ops", "random"), ("optim", "nn")])
def test_the_checker_catches_a_violation(tmp_path, monkeypatch, src, dst):
    """The check itself can fail: an upward (or forbidden) import planted in a copy of the
    package is reported."""
    pkg = tmp_path / "vmfdist"
    shutil.copytree(ROOT, pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    target = pkg / (src if (pkg / src).is_dir() else f"{src}.py")
    if target.is_dir():
        target = target / "__init__.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    text = target.read_text() if target.exists() else ""
    target.write_text(text + f"\nfrom vmfdist import {dst}  # planted\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    with pytest.raises(AssertionError, match=rf"(?s)upward imports:.*vmfdist\.{src}:\d+ imports vmfdist\.{dst}"):
        test_imports_go_downward_only()


@pytest.mark.parametrize("where, line", [
    ("nn/meanfield.py", "from .._ops import lib"),
    ("laplace/kron.py", "from .._ops.random import random_kwargs"),
    ("curvature/__init__.py", "import vmfdist._ops"),
    ("testing.py", "from vmfdist._ops import lib"),
    ("experiments/uci.py", "from vmfdist import _ops"),
])
def test_the_checker_catches_an_ops_import(tmp_path, monkeypatch, where, line):
    """An import of the private _ops planted in a copy of the package, from a floor that may not
    import it (in each spelling), is reported, naming the module."""
    pkg = tmp_path / "vmfdist"
    shutil.copytree(ROOT, pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    target = pkg / where
    target.write_text(target.read_text() + f"\n{line}  # planted\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    mod = "vmfdist." + where[:-3].replace("/__init__", "").replace("/", ".")
    with pytest.raises(AssertionError, match=rf"(?s)imports of _ops:.*{re.escape(mod)}:\d+ imports vmfdist\._ops"):
        test_only_special_random_linalg_and_distributions_import_ops()


def test_the_checkers_on_a_small_planted_tree(tmp_path, monkeypatch):
    """A package of five files: an nn module importing .._ops and a distributions module importing
    the nn floor are both reported; special importing ._ops and nn importing distributions are not;
    the pending allowance covers only the module it names."""
    pkg = tmp_path / "vmfdist"
    files = {
        "__init__.py": "from . import _ops\n",
        "_ops/__init__.py": "",
        "special.py": "from ._ops import lib\n",
        "distributions/__init__.py": "from .. import special\n",
        "distributions/bad.py": "from ..nn import layer\n",
        "nn/__init__.py": "from ..distributions import bad\n",
        "nn/layer.py": "from .._ops import lib\nfrom ..distributions import bad\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    assert [(m, t) for m, _, t in _ops_imports()] == [("vmfdist.nn.layer", "vmfdist._ops")]  # not special, not the root
    with pytest.raises(AssertionError, match="vmfdist.nn.layer:1 imports vmfdist._ops"):
        test_only_special_random_linalg_and_distributions_import_ops()
    with pytest.raises(AssertionError) as up:
        test_imports_go_downward_only()
    msg = str(up.value)
    assert "vmfdist.distributions.bad:1 imports vmfdist.nn.layer, a floor above it" in msg
    assert "vmfdist.nn.layer:" not in msg and "vmfdist.nn:" not in msg  # nn importing distributions is downward
    monkeypatch.setattr(sys.modules[__name__], "_OPS_PENDING", {"vmfdist.nn.layer"})
    test_only_special_random_linalg_and_distributions_import_ops()
    monkeypatch.setattr(sys.modules[__name__], "_OPS_PENDING", {"vmfdist.nn.other"})
    with pytest.raises(AssertionError, match="vmfdist.nn.layer:1 imports vmfdist._ops"):
        test_only_special_random_linalg_and_distributions_import_ops()
    with pytest.raises(AssertionError, match=r"remove from _OPS_PENDING: \['vmfdist.nn.other'\]"):
        test_the_pending_ops_importers_still_need_their_allowance()


def test_the_checker_catches_a_cycle_and_a_hidden_import(tmp_path, monkeypatch):
    pkg = tmp_path / "vmfdist"
    shutil.copytree(ROOT, pkg, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (pkg / "linalg.py").write_text((pkg / "linalg.py").read_text() + "\nfrom . import special  # planted\n")
    (pkg / "special.py").write_text((pkg / "special.py").read_text()
                                    + "\nfrom . import linalg  # planted\n\ndef f():\n    from . import random\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    with pytest.raises(AssertionError, match="cycles"):
        test_no_import_cycles()
    with pytest.raises(AssertionError, match="inside a function"):
        test_no_function_level_imports_of_vmfdist()


# ---- torch internals in one quarantined module ---------------------------------------------------------------
# torch.<_name> attributes that are documented public API (torch._check and friends are torch's
# documented checks for custom ops and compiled code)
_PUBLIC_UNDERSCORE = {"_check", "_check_index", "_check_value", "_check_type", "_check_not_implemented"}
# private attributes of torch objects whose use marks a torch internal wherever it appears
_PRIVATE_ATTRS = {"_execution_engine", "_version", "_AutoDispatchBelowAutograd", "_is_all_true", "_assert_async"}
_INTERNALS = "vmfdist._torch_internals"


def _torch_internal_uses(module: str, path: pathlib.Path):
    """(line, what) for every torch internal ``module`` touches: an attribute ``torch._x`` (or
    ``torch.<sub>._x``, ``nn.<sub>._x``, ``F._x``) other than the documented ones, any of ``_PRIVATE_ATTRS``, or a comparison
    with a grad_fn class name (``"...Backward0"``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            in_torch = isinstance(base, ast.Name) and base.id in ("torch", "nn", "F")  # torch, torch.nn, functional
            if node.attr in _PRIVATE_ATTRS or (in_torch and node.attr.startswith("_")
                                               and not node.attr.startswith("__")
                                               and node.attr not in _PUBLIC_UNDERSCORE):
                out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"\w+Backward\d+", node.value):
            out.append((node.lineno, repr(node.value)))
    return out


def test_torch_internals_live_in_one_module():
    bad = [f"{mod}:{line} uses {what}" for mod, path in _modules().items() if mod != _INTERNALS
           for line, what in _torch_internal_uses(mod, path)]
    assert not bad, "torch internals outside vmfdist/_torch_internals.py:\n" + "\n".join(bad)
    assert _torch_internal_uses(_INTERNALS, ROOT / "_torch_internals.py"), "the quarantine module uses no internal?"


def test_the_internals_checker_catches_a_planted_use(tmp_path, monkeypatch):
    pkg = tmp_path / "vmfdist"
    (pkg / "nn").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_torch_internals.py").write_text("import torch\nG = torch._C._AutoDispatchBelowAutograd\n")
    (pkg / "nn" / "__init__.py").write_text(
        "import torch\n\ndef f(t, node):\n    torch._check(t.dim() == 1)\n    a = t._version\n"
        "    b = type(node).__name__ == 'AddBackward0'\n    c = isinstance(t, nn.modules.conv._ConvTransposeNd)\n"
        "    return torch.autograd.Variable._execution_engine, a, b, c\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    with pytest.raises(AssertionError) as err:
        test_torch_internals_live_in_one_module()
    msg = str(err.value)
    for what in ("t._version", "'AddBackward0'", "torch.autograd.Variable._execution_engine",
                 "nn.modules.conv._ConvTransposeNd"):
        assert f"uses {what}" in msg, (what, msg)
    assert "torch._check" not in msg  # documented API


# ---- room sizes (issue 21: no god classes) ----------------------------------------------------------------------
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 120


def _oversized():
    bad = []
    for mod, path in _modules().items():
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_MODULE_LINES:
            bad.append(f"{mod}: {n} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{mod}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return bad


def test_no_module_or_function_is_too_large():
    bad = _oversized()
    assert not bad, "split these:\n" + "\n".join(bad)


def test_the_size_check_catches_a_large_module_and_function(tmp_path, monkeypatch):
    pkg = tmp_path / "vmfdist"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (pkg / "big.py").write_text("def f():\n" + body + "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", pkg)
    bad = _oversized()
    assert any(b.startswith("vmfdist.big: ") for b in bad) and any("vmfdist.big:1 f: 121 lines" in b for b in bad), bad
