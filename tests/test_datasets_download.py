"""vmfdist.datasets downloads, against local mirrors only (a ``file://`` folder and an
``http.server`` on a free port in a thread; never the real network): good downloads checked
with hashlib here, corrupt / truncated files refused with nothing left behind, mirror
fall-back, the all-mirrors-down message, $VMFDIST_DATA, no second download of a verified file,
and the built-in MNIST / UCI checksums against the shared local copies."""
import functools
import gzip
import hashlib
import http.server
import os
import socket
import threading

import numpy as np
import pytest

from vmfdist.datasets import (MNIST_SOURCES, DownloadError, data_root, download_mnist, download_uci, load_mnist,
                              uci_checksums)

from .shared_data import SHARED_DATA, UCI_DIR, needs_uci
from .test_datasets import write_mnist

STEMS = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]


def _content_sha256(path):
    with open(path, "rb") as f:
        raw = f.read()
    return hashlib.sha256(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).hexdigest()


@pytest.fixture
def source(tmp_path):
    """A small MNIST-format data set in a folder, with its arrays and checksums computed here."""
    folder = tmp_path / "mirror"
    arrays = write_mnist(folder, n_train=7, n_test=3, size=(4, 5))
    sums = {stem: _content_sha256(folder / (stem + ".gz")) for stem in STEMS}
    return folder, arrays, sums


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _Lying(_Quiet):
    """Announces the full length, sends half the body, then closes the connection."""
    def do_GET(self):
        path = self.translate_path(self.path)
        with open(path, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True


def _serve(folder, handler=_Quiet):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture
def http_mirror(source):
    server, url = _serve(source[0])
    yield url
    server.shutdown()
    server.server_close()


def _dead_url():
    """An http URL on a port nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def _leftovers(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".part")) if os.path.isdir(folder) else []


def test_good_download_over_http(tmp_path, source, http_mirror):
    _, arrays, sums = source
    root = tmp_path / "data"
    folder = download_mnist(root, name="Tiny", mirrors=[http_mirror], checksums=sums)
    assert folder == str(root / "Tiny")
    assert sorted(os.listdir(folder)) == sorted(s + ".gz" for s in STEMS)
    for stem in STEMS:  # the bytes that landed, hashed independently
        assert _content_sha256(os.path.join(folder, stem + ".gz")) == sums[stem]
    x, y = load_mnist(folder)
    np.testing.assert_array_equal(x.numpy(), arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(y.numpy(), arrays["train-labels-idx1-ubyte"])
    xt, yt = load_mnist(root, train=False, name="Tiny", download=True, mirrors=[http_mirror], checksums=sums)
    np.testing.assert_array_equal(xt.numpy(), arrays["t10k-images-idx3-ubyte"])


def test_good_download_from_file_url(tmp_path, source):
    folder, arrays, sums = source
    x, _ = load_mnist(tmp_path / "d", name="Tiny", download=True, mirrors=[folder.as_uri()], checksums=sums)
    np.testing.assert_array_equal(x.numpy(), arrays["train-images-idx3-ubyte"])


def test_corrupt_file_refused_and_not_kept(tmp_path, source, http_mirror):
    folder, _, sums = source
    path = folder / "t10k-images-idx3-ubyte.gz"
    raw = bytearray(gzip.decompress(path.read_bytes()))
    raw[-1] ^= 0x01  # one byte of one pixel
    path.write_bytes(gzip.compress(bytes(raw)))
    root = tmp_path / "data"
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte\.gz downloaded from http://127\.0\.0\.1:\d+/"
                       r"t10k-images-idx3-ubyte\.gz failed its check.*SHA256"):
        download_mnist(root, name="Tiny", mirrors=[http_mirror], checksums=sums)
    assert not (root / "Tiny" / "t10k-images-idx3-ubyte.gz").exists()
    assert _leftovers(root / "Tiny") == []


@pytest.mark.parametrize("how", ["short-file", "connection-closed"])
def test_truncated_download_refused(tmp_path, source, how):
    folder, _, sums = source
    if how == "short-file":  # the mirror's file itself is cut short
        path = folder / "train-images-idx3-ubyte.gz"
        path.write_bytes(path.read_bytes()[:-20])
    server, url = _serve(folder, _Quiet if how == "short-file" else _Lying)
    root = tmp_path / "data"
    try:
        with pytest.raises(ValueError, match=r"train-images-idx3-ubyte\.gz .*" + url.replace(".", r"\.")
                           + r".*(truncated|corrupt)"):
            download_mnist(root, name="Tiny", mirrors=[url], checksums=sums)
    finally:
        server.shutdown()
        server.server_close()
    assert not (root / "Tiny" / "train-images-idx3-ubyte.gz").exists()
    assert _leftovers(root / "Tiny") == []


def test_first_mirror_down_second_used(tmp_path, source, http_mirror):
    _, _, sums = source
    for first in (_dead_url(), http_mirror + "missing/"):  # refused; HTTP 404
        root = tmp_path / first.split(":")[-1].strip("/").replace("/", "_")
        download_mnist(root, name="Tiny", mirrors=[first, http_mirror], checksums=sums)
        assert sorted(os.listdir(root / "Tiny")) == sorted(s + ".gz" for s in STEMS)


def test_all_mirrors_down_names_urls_and_folder(tmp_path, source):
    _, _, sums = source
    dead = [_dead_url(), (tmp_path / "nowhere").as_uri() + "/"]
    root = tmp_path / "data"
    with pytest.raises(DownloadError) as info:
        download_mnist(root, name="Tiny", mirrors=dead, checksums=sums, timeout=5)
    msg = str(info.value)
    for url in dead:
        assert url + "train-images-idx3-ubyte.gz" in msg
    assert str(root / "Tiny" / "train-images-idx3-ubyte.gz") in msg and "by hand" in msg
    assert _leftovers(root / "Tiny") == []


def test_vmfdist_data_env_honoured(tmp_path, source, monkeypatch):
    folder, arrays, sums = source
    monkeypatch.setenv("VMFDIST_DATA", str(tmp_path / "cache"))
    assert data_root() == str(tmp_path / "cache")
    assert download_mnist(name="Tiny", mirrors=[folder.as_uri()], checksums=sums) == str(tmp_path / "cache" / "Tiny")
    x, _ = load_mnist(name="Tiny")  # root=None reads the cache
    np.testing.assert_array_equal(x.numpy(), arrays["train-images-idx3-ubyte"])
    monkeypatch.delenv("VMFDIST_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == str(tmp_path / "home" / ".cache" / "vmfdist")


def test_verified_file_not_downloaded_again_bad_one_replaced(tmp_path, source):
    folder, _, sums = source
    root = tmp_path / "data"
    out = download_mnist(root, name="Tiny", mirrors=[folder.as_uri()], checksums=sums)
    stamps = {s: os.stat(os.path.join(out, s + ".gz")).st_mtime_ns for s in STEMS}
    download_mnist(root, name="Tiny", mirrors=[_dead_url()], checksums=sums)  # would fail if it fetched
    assert {s: os.stat(os.path.join(out, s + ".gz")).st_mtime_ns for s in STEMS} == stamps
    bad = os.path.join(out, "train-labels-idx1-ubyte.gz")
    with open(bad, "wb") as f:
        f.write(gzip.compress(b"not the file"))
    with pytest.raises(DownloadError, match="train-labels-idx1-ubyte"):
        download_mnist(root, name="Tiny", mirrors=[_dead_url()], checksums=sums)
    download_mnist(root, name="Tiny", mirrors=[folder.as_uri()], checksums=sums)
    assert _content_sha256(bad) == sums["train-labels-idx1-ubyte"]


def test_unknown_set_needs_mirrors_and_all_checksums(tmp_path, source):
    folder, _, sums = source
    with pytest.raises(ValueError, match="no published location and checksums"):
        download_mnist(tmp_path, name="Tiny", mirrors=[folder.as_uri()], checksums={STEMS[0]: sums[STEMS[0]]})
    with pytest.raises(ValueError, match="SHA-256 hex digest"):
        download_mnist(tmp_path, name="Tiny", mirrors=[folder.as_uri()], checksums=dict(sums, **{STEMS[1]: "abc"}))
    with pytest.raises(TypeError, match="download=True"):
        load_mnist(tmp_path, mirrors=[folder.as_uri()])


def test_builtin_table_checks_every_file():
    assert set(MNIST_SOURCES) == {"MNIST", "FashionMNIST", "KMNIST"}
    for name, src in MNIST_SOURCES.items():
        assert set(src["files"]) == set(STEMS) and src["mirrors"]
        for checks in src["files"].values():
            assert checks and all(len(v) == (32 if k.endswith("md5") else 64) for k, v in checks.items())
    assert MNIST_SOURCES["MNIST"]["mirrors"][0] == "https://ossci-datasets.s3.amazonaws.com/mnist/"


MNIST_DIR = SHARED_DATA / "mnist"


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=f"the MNIST files are not at {MNIST_DIR}")
def test_builtin_mnist_checksums_accept_the_real_files(tmp_path):
    """The real (recompressed) MNIST files pass the built-in uncompressed-content SHA-256s."""
    folder = download_mnist(tmp_path, mirrors=[MNIST_DIR.as_uri() + "/"])
    x, y = load_mnist(folder, train=False)
    assert tuple(x.shape) == (10000, 28, 28) and int(y.bincount()[0]) == 980


@needs_uci
def test_builtin_uci_checksums_and_layout(tmp_path):
    """Two real sets fetched from the shared copy with the built-in SHA-256s, into the layout
    the UCI experiment reads; a changed byte is refused."""
    from vmfdist.experiments.uci_data import list_datasets, load_dataset  # the consumer of the layout
    table = uci_checksums()
    assert len(table) == 9 and sum(len(v) for v in table.values()) == 402
    template = UCI_DIR.as_uri() + "/{name}/{file}"
    for name in ("yacht", "energy"):
        folder = download_uci(name, tmp_path / "uci", mirrors=[template])
        assert sorted(os.listdir(folder)) == sorted(table[os.path.basename(folder)])
    assert list_datasets(str(tmp_path / "uci")) == ["energy", "yacht"]
    assert load_dataset("yacht", str(tmp_path / "uci")).x.shape == (308, 6)
    # a mirror whose data.txt differs in one byte
    mirror = tmp_path / "mirror" / "yacht"
    mirror.mkdir(parents=True)
    raw = bytearray((UCI_DIR / "yacht" / "data.txt").read_bytes())
    raw[5] = ord("9") if raw[5] != ord("9") else ord("8")
    (mirror / "data.txt").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="data.txt downloaded from file:.*failed its check"):
        download_uci("yacht", tmp_path / "other", mirrors=[(tmp_path / "mirror").as_uri() + "/{name}/{file}"])
    assert _leftovers(tmp_path / "other" / "yacht") == [] and not (tmp_path / "other" / "yacht" / "data.txt").exists()


def test_uci_download_with_checksums_over_http(tmp_path):
    """download_uci with the repository's layout (<base>/<name>/data/<file>) on a local server."""
    base = tmp_path / "repo"
    (base / "concrete" / "data").mkdir(parents=True)
    files = {"data.txt": b"1 2 3\n4 5 6\n7 8 10\n", "index_features.txt": b"0\n1\n", "index_target.txt": b"2\n",
             "n_splits.txt": b"1\n", "index_train_0.txt": b"0\n1\n", "index_test_0.txt": b"2\n"}
    for f, data in files.items():
        (base / "concrete" / "data" / f).write_bytes(data)
    sums = {f: hashlib.sha256(d).hexdigest() for f, d in files.items()}
    server, url = _serve(base)
    try:
        folder = download_uci("concrete", tmp_path / "uci", mirrors=[_dead_url(), url], checksums=sums)
    finally:
        server.shutdown()
        server.server_close()
    assert folder == str(tmp_path / "uci" / "concrete")
    for f, d in files.items():
        assert (tmp_path / "uci" / "concrete" / f).read_bytes() == d
    with pytest.raises(ValueError, match="unknown UCI data set 'bostn'"):
        download_uci("bostn", tmp_path)
