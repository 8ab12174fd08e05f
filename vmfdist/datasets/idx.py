"""MNIST-format (IDX) files: :func:`read_idx` for one file, :func:`load_mnist` for a folder.

The IDX format (LeCun et al.): a big-endian header -- two zero bytes, a type code, the number
of dimensions ``d`` -- then ``d`` 32-bit sizes, then the values, row-major.  Files may be gzip-
compressed (as published) or not (as torchvision leaves them under ``root/MNIST/raw/``).
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from typing import Dict, Optional, Tuple

import torch

from .download import data_root, download_mnist

#: IDX type code -> (torch dtype, big-endian numpy-style format of one value, bytes per value)
_TYPES = {0x08: (torch.uint8, "B", 1), 0x09: (torch.int8, "b", 1), 0x0B: (torch.int16, "h", 2),
          0x0C: (torch.int32, "i", 4), 0x0D: (torch.float32, "f", 4), 0x0E: (torch.float64, "d", 8)}

#: the four files of an MNIST-format data set, by role: (file stem, dimensions)
IDX_FILES = {"train_images": ("train-images-idx3-ubyte", 3), "train_labels": ("train-labels-idx1-ubyte", 1),
             "test_images": ("t10k-images-idx3-ubyte", 3), "test_labels": ("t10k-labels-idx1-ubyte", 1)}

_HOW_TO_GET = ("the four IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
               "t10k-labels-idx1-ubyte; gzip-compressed or not) are published with each data set -- MNIST by "
               "LeCun, Cortes and Burges (the same files torchvision's MNIST(root, download=True) puts under "
               "root/MNIST/raw/), Fashion-MNIST by Zalando Research -- put them in one folder and pass that folder")


def _open_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise FileNotFoundError(f"cannot read IDX file {path!r}: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":  # gzip magic
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise ValueError(f"IDX file {path!r} is a corrupt or truncated gzip file ({e}); "
                             "download it again") from None
    return raw


def read_idx(path: str, ndim: Optional[int] = None) -> torch.Tensor:
    """The array in the IDX file ``path`` (gzip-compressed or not) as a tensor of its own dtype
    (``uint8`` for MNIST).  The header is checked -- magic, type code, dimensions (``ndim`` when
    given) and that the file holds exactly the values it declares -- and a violation raises
    ``ValueError`` naming the file and the fault."""
    data = _open_bytes(os.fspath(path))
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _TYPES:
        raise ValueError(f"{path!r} is not an IDX file: its first four bytes are {data[:4].hex() or 'missing'} "
                         "(expected 00 00, a type code 08/09/0b/0c/0d/0e and the number of dimensions)")
    dtype, fmt, size = _TYPES[data[2]]
    d = data[3]
    if ndim is not None and d != ndim:
        raise ValueError(f"IDX file {path!r} holds a {d}-dimensional array; expected {ndim} dimensions "
                         "(images have 3, labels 1) -- is it the right file?")
    if len(data) < 4 + 4 * d:
        raise ValueError(f"IDX file {path!r} is truncated inside its header")
    shape = struct.unpack(f">{d}I", data[4:4 + 4 * d])
    count = 1
    for s in shape:
        count *= s
    body = len(data) - 4 - 4 * d
    if body != count * size:
        what = "truncated" if body < count * size else "longer than its header says"
        raise ValueError(f"IDX file {path!r} is {what}: the header declares shape {tuple(shape)} "
                         f"({count * size} bytes of values) but {body} bytes follow; download it again")
    values = torch.frombuffer(bytearray(data[4 + 4 * d:]), dtype=dtype) if count else torch.empty(0, dtype=dtype)
    if size > 1 and torch.tensor([1], dtype=torch.int16).view(torch.uint8)[0] == 1:  # little-endian host
        values = values.view(torch.uint8).reshape(-1, size).flip(1).reshape(-1).view(dtype)
    return values.reshape(shape)


def _candidates(root: str, name: Optional[str]):
    """Folders that may hold the files: ``root`` itself, then ``root/<Name>`` (where
    :func:`~vmfdist.datasets.download_mnist` puts them), torchvision's layouts ``root/<Name>/raw``
    and ``root/raw``."""
    yield root
    names = [name] if name else ["MNIST", "FashionMNIST", "KMNIST", "QMNIST"]
    for n in names:
        yield os.path.join(root, n)
        yield os.path.join(root, n, "raw")
    yield os.path.join(root, "raw")


def find_idx_files(root: str, name: Optional[str] = None) -> Dict[str, str]:
    """Paths of the four MNIST-format files under ``root`` (keys of ``IDX_FILES``): each
    may be gzip-compressed (``.gz``) or not, and spelt ``train-images-idx3-ubyte`` or
    ``train-images.idx3-ubyte``; besides ``root`` itself, ``root/<name>/`` and torchvision's ``root/<name>/raw/``
    (``name`` ``"MNIST"``, ``"FashionMNIST"``, ... ; all of them when ``None``) is searched.
    ``FileNotFoundError`` saying which files are missing and how to get them otherwise."""
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a folder path, got {type(root).__name__}")
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"data folder {root!r} does not exist; {_HOW_TO_GET}")
    best, best_missing = None, None
    for folder in _candidates(root, name):
        if not os.path.isdir(folder):
            continue
        found, missing = {}, []
        for role, (stem, _) in IDX_FILES.items():
            spellings = [stem, stem.replace("-idx", ".idx")]
            hit = next((os.path.join(folder, s + ext) for s in spellings for ext in ("", ".gz")
                        if os.path.isfile(os.path.join(folder, s + ext))), None)
            if hit is None:
                missing.append(stem)
            else:
                found[role] = hit
        if not missing:
            return found
        if best_missing is None or len(missing) < len(best_missing):
            best, best_missing = folder, missing
    raise FileNotFoundError(f"no MNIST-format data in {root!r}: {best!r} lacks {', '.join(best_missing)} "
                            f"(with or without .gz); {_HOW_TO_GET}")


def load_mnist(root: Optional[str] = None, train: bool = True, name: Optional[str] = None,
               download: bool = False, **download_kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)`` of the training (``train=True``) or test part of the MNIST-format
    data set in the folder ``root`` (see :func:`find_idx_files` for the layouts): images as
    ``uint8`` of shape ``(N, H, W)`` (28 x 28 for MNIST), labels as ``int64`` of shape ``(N,)``.
    Checks each file's header and that images and labels agree in number.

    ``root=None`` is the data cache (``$VMFDIST_DATA`` or ``~/.cache/vmfdist``).  With
    ``download=True`` the files of ``name`` (default ``"MNIST"``) missing from ``root/<name>/`` are
    fetched and checked first (:func:`~vmfdist.datasets.download_mnist`, which also takes
    ``download_kwargs``: ``mirrors``, ``checksums``, ``timeout``) and read from there."""
    if download:
        files = find_idx_files(download_mnist(root, name or "MNIST", **download_kwargs))
    elif download_kwargs:
        raise TypeError(f"load_mnist got {', '.join(download_kwargs)}, which only apply with download=True")
    else:
        files = find_idx_files(data_root(root), name)
    part = "train" if train else "test"
    images = read_idx(files[f"{part}_images"], ndim=3)
    labels = read_idx(files[f"{part}_labels"], ndim=1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{files[f'{part}_images']!r} holds {images.shape[0]} images but "
                         f"{files[f'{part}_labels']!r} {labels.shape[0]} labels; the files do not belong together")
    if images.dtype != torch.uint8:
        raise ValueError(f"{files[f'{part}_images']!r} holds {images.dtype} values; MNIST-format images are unsigned "
                         "bytes (type code 08)")
    return images, labels.long()
