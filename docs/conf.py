"""Sphinx configuration for vmfdist.

The documentation builds without compiling the extension.  ``vmfdist._ops`` does
``from . import _C`` and then registers fake kernels and autograd formulas for the
``torch.ops.vmfdist.*`` operators at import time, which needs the operator
schemas to exist.  When the compiled ``vmfdist._C`` cannot be imported, the shim
below defines exactly the schemas declared in ``csrc/ops.cpp`` (read from that
file, so there is no second copy to keep in sync) with :mod:`torch.library`,
and puts a placeholder module in ``sys.modules["vmfdist._C"]``.  The library's
own code is imported unchanged; the operators just have no kernels, which
autodoc does not need.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import types

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, ROOT)


def _has_compiled_extension() -> bool:
    from importlib.machinery import EXTENSION_SUFFIXES

    pkg = os.path.join(ROOT, "vmfdist")
    suffixes = tuple(EXTENSION_SUFFIXES) + (".abi3.so", ".pyd")
    return any(f.startswith("_C.") and f.endswith(suffixes) for f in os.listdir(pkg))


def _import_vmfdist_or_shim():
    """Import vmfdist from the source tree, shimming ``vmfdist._C`` if it is not built.

    Set ``VMFDIST_DOCS_SHIM=1`` to use the shim even where the extension is built.
    """
    if _has_compiled_extension() and os.environ.get("VMFDIST_DOCS_SHIM", "0") != "1":
        importlib.import_module("vmfdist")
        return "compiled extension"

    import torch

    with open(os.path.join(ROOT, "csrc", "ops.cpp"), encoding="utf-8") as fh:
        src = fh.read()
    body = src[src.index("TORCH_LIBRARY(vmfdist, m)"):]
    schemas = re.findall(r'm\.def\(\s*"([^"]+)"', body)
    if not schemas:
        raise RuntimeError("docs/conf.py: found no m.def(...) schemas in csrc/ops.cpp")
    lib = torch.library.Library("vmfdist", "DEF")  # noqa: F841  (kept alive below)
    for schema in schemas:
        lib.define(schema)
    shim = types.ModuleType("vmfdist._C")
    shim.__doc__ = "Placeholder for the compiled extension (documentation build only)."
    shim._docs_library = lib
    sys.modules["vmfdist._C"] = shim
    importlib.import_module("vmfdist")
    return f"shim ({len(schemas)} schemas from csrc/ops.cpp)"


_how = _import_vmfdist_or_shim()
print(f"[vmfdist docs] imported vmfdist via {_how}")

import vmfdist  # noqa: E402

# -- Project -------------------------------------------------------------------
project = "vmfdist"
author = "the vmfdist developers"
copyright = "the vmfdist developers"  # noqa: A001
release = vmfdist.__version__
version = ".".join(release.split(".")[:2])

# -- General -------------------------------------------------------------------
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "scripts", "README.md", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# TensorLike is a typing alias; keep signatures short.
autodoc_type_aliases = {"TensorLike": "vmfdist.special.TensorLike"}

# The build runs with -n (nitpicky).  There is no intersphinx (builds must work
# offline), so references to torch's own objects cannot resolve; TensorLike is a
# typing alias documented in prose on the API page.
nitpick_ignore_regex = [
    ("py:(class|mod|func|data|obj)", r"torch(\..*)?"),
    ("py:(class|data|obj)", r"(vmfdist\.special\.)?TensorLike"),
    ("py:class", r"numbers\.Number"),
    # bare "Tensor" from torch's own annotations, and the property machinery of
    # torch.distributions (``support`` is a dependent property) that autodoc lists
    ("py:class", r"Tensor"),
    ("py:class", r"collections\.abc\.Callable"),
    ("py:class", r"_DependentProperty"),
    # private base classes named in "Bases:" (their members are documented on the subclasses)
    ("py:class", r"vmfdist\..*\._[A-Za-z]\w*"),
    # the signature autodoc reads off a torch.ops overload (vmfdist.linalg's *_op data) is torch's
    # generic ``(*args: _P.args, **kwargs: _P.kwargs)``
    ("py:obj", r"typing\.~?_P"),
]
suppress_warnings = ["myst.header"]

# -- HTML ----------------------------------------------------------------------
html_theme = "alabaster"
html_title = f"vmfdist {release}"
html_static_path = []
html_theme_options = {
    "description": "Directional distributions, exact Bessel functions and Bayesian layers for PyTorch",
    "fixed_sidebar": True,
}
