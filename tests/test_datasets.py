"""vmfdist.datasets: the IDX reader against files written here by an independent writer
(numpy's big-endian dtypes and the format's published layout), every layout the loader
promises, and a clear error for every kind of bad file."""
import gzip
import os

import numpy as np
import pytest
import torch

from vmfdist.datasets import find_idx_files, load_mnist, read_idx

from .shared_data import SHARED_DATA

_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}


def write_idx(path, array, compress=False):
    """An IDX file by the format's definition: 00 00 <type> <ndim>, big-endian uint32 sizes, big-endian values."""
    array = np.asarray(array)
    head = bytes([0, 0, _CODES[array.dtype.type], array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    body = array.astype(array.dtype.newbyteorder(">")).tobytes()
    data = head + body
    with open(path, "wb") as f:
        f.write(gzip.compress(data) if compress else data)
    return path


def write_mnist(folder, n_train=12, n_test=5, size=(28, 28), compress=True, dotted=False, seed=0):
    """A small MNIST-format data set; returns the arrays written."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, *size), dtype=np.uint8),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, *size), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8)}
    for stem, a in arrays.items():
        name = stem.replace("-idx", ".idx") if dotted else stem
        write_idx(os.path.join(folder, name + (".gz" if compress else "")), a, compress)
    return arrays


@pytest.mark.parametrize("dtype", list(_CODES))
@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_every_type(tmp_path, dtype, compress):
    rng = np.random.default_rng(1)
    if np.issubdtype(dtype, np.floating):
        a = rng.standard_normal((3, 4, 5)).astype(dtype)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, (3, 4, 5), dtype=dtype, endpoint=True)
    t = read_idx(write_idx(tmp_path / "a.idx", a, compress))
    assert tuple(t.shape) == a.shape
    np.testing.assert_array_equal(t.numpy(), a)  # exact, bit for bit


def test_read_idx_empty_and_scalar_shapes(tmp_path):
    assert read_idx(write_idx(tmp_path / "e", np.zeros((0, 28, 28), np.uint8))).shape == (0, 28, 28)


@pytest.mark.parametrize("layout", ["flat", "flat-raw", "dotted", "torchvision", "fashion"])
def test_load_mnist_layouts(tmp_path, layout):
    folder = {"flat": tmp_path, "flat-raw": tmp_path, "dotted": tmp_path,
              "torchvision": tmp_path / "MNIST" / "raw", "fashion": tmp_path / "FashionMNIST" / "raw"}[layout]
    arrays = write_mnist(folder, compress=layout not in ("flat-raw", "torchvision"), dotted=layout == "dotted")
    x, y = load_mnist(tmp_path)
    assert x.dtype == torch.uint8 and y.dtype == torch.int64
    np.testing.assert_array_equal(x.numpy(), arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(y.numpy(), arrays["train-labels-idx1-ubyte"])
    xt, yt = load_mnist(str(tmp_path), train=False)
    np.testing.assert_array_equal(xt.numpy(), arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(yt.numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_missing_folder_and_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*train-images-idx3-ubyte"):
        load_mnist(tmp_path / "nowhere")
    write_mnist(tmp_path)
    os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(FileNotFoundError, match="lacks t10k-labels-idx1-ubyte .*torchvision"):
        load_mnist(tmp_path)
    with pytest.raises(TypeError, match="root"):
        find_idx_files(3)


def _corrupt(tmp_path, how):
    write_mnist(tmp_path, compress=how.startswith("gz"))
    name = "train-images-idx3-ubyte" + (".gz" if how.startswith("gz") else "")
    path = tmp_path / name
    data = path.read_bytes()
    if how == "gz-truncated":
        data = data[:len(data) // 2]
    elif how == "gz-crc":
        data = data[:-8] + bytes(8)
    elif how == "truncated":
        data = data[:-7]
    elif how == "trailing":
        data = data + b"\0"
    elif how == "magic":
        data = b"\x01" + data[1:]
    elif how == "type":
        data = data[:2] + b"\x07" + data[3:]
    elif how == "ndim":
        data = data[:3] + b"\x02" + data[4:]
    elif how == "header":
        data = data[:9]
    elif how == "labels":
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(3, np.uint8))
    elif how == "signed":
        a = np.zeros((12, 28, 28), np.int8)
        write_idx(path, a)
        return
    path.write_bytes(data)


@pytest.mark.parametrize("how, message", [
    ("gz-truncated", "corrupt or truncated gzip"), ("gz-crc", "corrupt or truncated gzip"),
    ("truncated", "is truncated: the header declares shape \\(12, 28, 28\\)"),
    ("trailing", "longer than its header says"), ("magic", "is not an IDX file"), ("type", "is not an IDX file"),
    ("ndim", "2-dimensional array; expected 3"), ("header", "truncated inside its header"),
    ("labels", "12 images but .* 3 labels"), ("signed", "unsigned bytes")])
def test_corrupt_files_are_refused_by_name(tmp_path, how, message):
    _corrupt(tmp_path, how)
    with pytest.raises(ValueError, match=message) as e:
        load_mnist(tmp_path)
    assert "train-" in str(e.value)


MNIST_DIR = SHARED_DATA / "mnist"


@pytest.mark.skipif(not MNIST_DIR.is_dir(), reason=f"the MNIST files are not at {MNIST_DIR} (../shared/data/mnist "
                    "beside this checkout, or set VMFDIST_SHARED_DATA)")
def test_real_mnist_matches_its_published_counts():
    """The label counts of the published files (LeCun et al.; also listed in the data folder's README)."""
    x, y = load_mnist(MNIST_DIR)
    assert x.shape == (60000, 28, 28)
    assert y.bincount().tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    xt, yt = load_mnist(MNIST_DIR, train=False)
    assert xt.shape == (10000, 28, 28)
    assert yt.bincount().tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
