"""Data sets in their published file formats, read without extra dependencies.

* :func:`load_mnist` -- MNIST and every data set distributed in its IDX format (Fashion-MNIST,
  KMNIST, EMNIST's MNIST-shaped parts) from a folder the caller names; :func:`read_idx` reads one
  IDX file.

Nothing here downloads or guesses a location: the caller passes the folder, and a missing or
corrupt file is reported by name with what to do about it.
"""
from .idx import IDX_FILES, find_idx_files, load_mnist, read_idx

__all__ = ["IDX_FILES", "find_idx_files", "load_mnist", "read_idx"]
