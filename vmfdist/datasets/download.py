"""Downloading published data sets, checked against checksums written here.

* :func:`download_mnist` -- the four IDX files of MNIST, Fashion-MNIST or KMNIST;
* :func:`fetch_checked` -- the engine (also used by :func:`vmfdist.datasets.download_uci`):
  each mirror in turn, into a temporary file beside the destination, checked, then renamed
  into place (so a file under its final name is always a checked one).

Where the files go: ``root`` when given, else ``$VMFDIST_DATA``, else ``~/.cache/vmfdist``
(:func:`data_root`), one sub-folder per data set.  Only the standard library is used
(``urllib.request``, with a timeout on every request).

Checksums and where they come from (see docs/datasets.md):

* MNIST: SHA-256 of the *uncompressed* IDX files.  Computed from a copy whose uncompressed MD5s
  equal the published ones (the sums many loaders check), so a recompressed copy is accepted too.
* Fashion-MNIST, KMNIST: MD5 *and* SHA-256 of the published ``.gz`` files -- MD5 from the
  Fashion-MNIST README and torchvision's ``datasets/mnist.py``, SHA-256 from torchvision's
  (prototype) ``datasets/_builtin/mnist.py``; both must match.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import socket
import tempfile
import urllib.error
import urllib.request
import zlib
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

__all__ = ["DownloadError", "MNIST_SOURCES", "data_root", "download_mnist", "fetch_checked", "file_digest"]

#: seconds one request may wait for the server (connect and each read)
TIMEOUT = 60.0
_CHUNK = 1 << 20
#: the four files of an MNIST-format data set (the stems of vmfdist.datasets.IDX_FILES)
MNIST_STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


class DownloadError(OSError):
    """No mirror could be reached for a file; the message lists the URLs tried and where to
    put the file by hand."""


def data_root(root=None) -> str:
    """The folder data sets are kept in: ``root`` when given, else ``$VMFDIST_DATA`` when set
    (and not empty), else ``~/.cache/vmfdist``."""
    if root is not None:
        return os.fspath(root)
    env = os.environ.get("VMFDIST_DATA")
    if env:
        return os.path.expanduser(env)
    return os.path.join(os.path.expanduser("~"), ".cache", "vmfdist")


# --- the published MNIST-format data sets --------------------------------------------------------
# checks per file stem: "sha256" = SHA-256 of the uncompressed IDX content; "gz_sha256" /
# "gz_md5" = digests of the published .gz bytes

#: name -> {"mirrors": base URLs, tried in order; "files": stem -> checks}
MNIST_SOURCES: Dict[str, dict] = {
    "MNIST": {
        "mirrors": ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
        "files": {
            "train-images-idx3-ubyte": {"sha256": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"},
            "train-labels-idx1-ubyte": {"sha256": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"},
            "t10k-images-idx3-ubyte": {"sha256": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"},
            "t10k-labels-idx1-ubyte": {"sha256": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"},
        },
    },
    "FashionMNIST": {
        "mirrors": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        "files": {
            "train-images-idx3-ubyte": {
                "gz_md5": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                "gz_sha256": "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
            "train-labels-idx1-ubyte": {
                "gz_md5": "25c81989df183df01b3e8a0aad5dffbe",
                "gz_sha256": "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
            "t10k-images-idx3-ubyte": {
                "gz_md5": "bef4ecab320f06d8554ea6380940ec79",
                "gz_sha256": "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
            "t10k-labels-idx1-ubyte": {
                "gz_md5": "bb300cfdad3c16e7a12a480ee83cd310",
                "gz_sha256": "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"},
        },
    },
    "KMNIST": {
        "mirrors": ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",),
        "files": {
            "train-images-idx3-ubyte": {
                "gz_md5": "bdb82020997e1d708af4cf47b453dcf7",
                "gz_sha256": "51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4"},
            "train-labels-idx1-ubyte": {
                "gz_md5": "e144d726b3acfaa3e44228e80efcd344",
                "gz_sha256": "e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17"},
            "t10k-images-idx3-ubyte": {
                "gz_md5": "5c965bf0a639b31b8f53240b1b52f4d7",
                "gz_sha256": "edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5"},
            "t10k-labels-idx1-ubyte": {
                "gz_md5": "7320c461ea6c1c855c0b718fb2a4b134",
                "gz_sha256": "20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c"},
        },
    },
}
_ALIASES = {"mnist": "MNIST", "fashionmnist": "FashionMNIST", "fashion-mnist": "FashionMNIST",
            "fashion_mnist": "FashionMNIST", "kmnist": "KMNIST"}


# --- checking ------------------------------------------------------------------------------------

def file_digest(path: str, algorithm: str = "sha256", uncompress: bool = False) -> str:
    """Hex digest of the file ``path`` (of its uncompressed content when ``uncompress`` and the
    file is gzip-compressed); a corrupt or truncated gzip file raises ``ValueError``."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        gz = uncompress and f.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
    except (OSError, EOFError, zlib.error) as e:
        if not gz:
            raise
        raise ValueError(f"it is a corrupt or truncated gzip file ({e})") from None
    return h.hexdigest()


def _check_digests(path: str, checks: Mapping[str, str]) -> None:
    """``ValueError`` unless every digest in ``checks`` matches the file.  Keys: ``sha256`` (of
    the content, uncompressed when the file is gzip-compressed), ``file_sha256`` (of the file's
    bytes as they are), ``gz_sha256`` and ``gz_md5`` (of the bytes of a gzip-compressed file)."""
    if not checks:
        raise ValueError("no checksum is known for it")
    for key, want in checks.items():
        algo = "md5" if key.endswith("md5") else "sha256"
        if key.startswith("gz_"):
            with open(path, "rb") as f:
                if f.read(2) != b"\x1f\x8b":
                    raise ValueError("it is not gzip-compressed, but the published .gz bytes are what is checked")
        got = file_digest(path, algo, uncompress=key == "sha256")
        if got != want.lower():
            what = {"gz_": "the published .gz file's ", "fil": "the file's ", "sha": "the content's "}[key[:3]]
            raise ValueError(f"{what}{algo.upper()} is {got}, expected {want.lower()}")


def _is_verified(path: str, checks: Mapping[str, str]) -> bool:
    if not os.path.isfile(path):
        return False
    try:
        _check_digests(path, checks)
    except (ValueError, OSError):
        return False
    return True


# --- fetching ------------------------------------------------------------------------------------

_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, socket.timeout, TimeoutError,
                   ConnectionError)


def _download_to(url: str, out, timeout: float) -> None:
    """Copy ``url`` into the open file ``out``.  Network faults propagate as they are;
    a body shorter than the server announced raises ``ValueError`` (truncated)."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        declared = resp.headers.get("Content-Length") if hasattr(resp, "headers") else None
        got = 0
        while True:
            try:
                chunk = resp.read(_CHUNK)
            except http.client.IncompleteRead as e:
                got += len(e.partial)
                raise ValueError(f"the download is truncated: the connection closed after {got} bytes"
                                 + (f" of {declared}" if declared else "")) from None
            if not chunk:
                break
            out.write(chunk)
            got += len(chunk)
    if declared is not None and declared.isdigit() and got != int(declared):
        raise ValueError(f"the download is truncated: {got} bytes of the {declared} announced")


def fetch_checked(urls: Sequence[str], dest: str, check: Callable[[str], None],
                  timeout: float = TIMEOUT, manual_hint: str = "") -> str:
    """Fetch ``dest`` from the first of ``urls`` that answers, into a temporary file in
    ``dest``'s folder; ``check(tmp_path)`` (raising ``ValueError`` on a bad file) decides, then
    the file is renamed to ``dest`` atomically.  Returns the URL used.

    A network failure (refused, unknown host, HTTP error, timeout) moves on to the next URL.
    A truncated download or a failed check raises ``ValueError`` naming the file and the URL
    (the temporary file is deleted; nothing is left under ``dest``).  When every URL fails,
    :class:`DownloadError` lists them and says where to put the file by hand."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(dest)
    tried: List[str] = []
    for url in urls:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                try:
                    _download_to(url, out, timeout)
                except ValueError as e:
                    raise ValueError(f"{name} from {url}: {e}; nothing was kept") from None
                except _NETWORK_ERRORS as e:
                    tried.append(f"{url} ({getattr(e, 'reason', None) or e})")
                    continue
            try:
                check(tmp)
            except ValueError as e:
                raise ValueError(f"{name} downloaded from {url} failed its check: {e}; the downloaded file was "
                                 "deleted (a corrupt mirror or a changed file -- nothing was kept)") from None
            os.replace(tmp, dest)
            return url
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    raise DownloadError(f"could not download {name}: every location failed -- " + "; ".join(tried)
                        + f". Offline: put the file there by hand as {dest}" + (f" ({manual_hint})" if manual_hint
                                                                               else "")
                        + "; a file already there that passes the checksum is not downloaded again")


def _urls(mirrors: Iterable[str], file: str, **fields: str) -> List[str]:
    """Each mirror's URL for ``file``: a mirror with ``{file}`` in it is a template (also
    given ``fields``), any other is a base URL the file name is appended to."""
    out = []
    for m in mirrors:
        if "{file}" in m:
            out.append(m.format(file=file, **fields))
        else:
            out.append(m if m.endswith("/") else m + "/")
            out[-1] += file
    return out


def _normalise_checksums(checksums: Optional[Mapping[str, str]], stems: Iterable[str]) -> Dict[str, Dict[str, str]]:
    """``checksums`` (file name or stem -> SHA-256 of the uncompressed content) by stem."""
    out: Dict[str, Dict[str, str]] = {}
    stems = list(stems)
    for key, value in (checksums or {}).items():
        stem = key[:-3] if key.endswith(".gz") else key
        if stem not in stems:
            raise ValueError(f"checksums names {key!r}, which is not one of the files {stems}")
        if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdefABCDEF" for c in value)):
            raise ValueError(f"checksums[{key!r}] must be a SHA-256 hex digest (64 hex digits), got {value!r}")
        out[stem] = {"sha256": value.lower()}
    return out


def download_mnist(root=None, name: str = "MNIST", mirrors: Optional[Sequence[str]] = None,
                   checksums: Optional[Mapping[str, str]] = None, timeout: float = TIMEOUT) -> str:
    """Fetch the four IDX files of the MNIST-format data set ``name`` (``"MNIST"``,
    ``"FashionMNIST"`` or ``"KMNIST"``; see ``MNIST_SOURCES``) into ``<root>/<name>/``
    and return that folder (:func:`vmfdist.datasets.load_mnist` reads it).

    ``root`` defaults to :func:`data_root` (``$VMFDIST_DATA`` or ``~/.cache/vmfdist``).  Files
    already there that pass their checksum are not fetched again; others are fetched from
    ``mirrors`` (default: the published locations, primary first), checked, and renamed into
    place.  A mirror is a base URL (``<mirror><stem>.gz`` is fetched) or a template holding
    ``{file}``; ``file://`` URLs work, for a local copy.

    ``checksums`` maps file stems (``"train-images-idx3-ubyte"``, with or without ``.gz``) to the
    SHA-256 of their *uncompressed* content, replacing the built-in check for those files -- for
    a data set not in the table (then all four are needed, and ``mirrors``), or for tests.
    Raises ``ValueError`` for a corrupt or truncated download, :class:`DownloadError` when no
    mirror answers (the message names the URLs and the folder for putting the files by hand)."""
    key = _ALIASES.get(str(name).lower().replace(" ", ""), name)
    stems = list(MNIST_STEMS)
    source = MNIST_SOURCES.get(key)
    user = _normalise_checksums(checksums, stems)
    if source is None:
        known = ", ".join(MNIST_SOURCES)
        if mirrors is None or set(user) != set(stems):
            raise ValueError(f"no published location and checksums are known for the data set {name!r} (known: "
                             f"{known}); pass mirrors= and checksums= with the SHA-256 of all four uncompressed files")
        source = {"mirrors": (), "files": {}}
    else:
        name = key
    if mirrors is None:
        mirrors = source["mirrors"]
    if isinstance(mirrors, str):
        mirrors = [mirrors]
    if not mirrors:
        raise ValueError("mirrors is empty: there is nowhere to download from")
    folder = os.path.join(data_root(root), name)
    for stem in stems:
        checks = user.get(stem) or source["files"].get(stem)
        if not checks:
            raise ValueError(f"no checksum is known for {stem} of {name!r}; pass checksums= (it is never "
                             "downloaded unchecked)")
        dest = os.path.join(folder, stem + ".gz")
        present = [p for p in (dest, os.path.join(folder, stem)) if _is_verified(p, checks)]
        if present:
            continue
        fetch_checked(_urls(mirrors, stem + ".gz", name=name), dest, lambda p, c=checks: _check_digests(p, c),
                      timeout=timeout,
                      manual_hint=f"the file {stem}.gz published with {name}; gzip-compressed as published")
    return folder
