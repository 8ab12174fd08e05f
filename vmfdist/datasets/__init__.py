"""Data sets in their published file formats, read -- and, when asked, downloaded and checked --
without extra dependencies (torch and the standard library only).

* :func:`load_mnist` -- MNIST and every data set distributed in its IDX format (Fashion-MNIST,
  KMNIST, EMNIST's MNIST-shaped parts) from a folder; :func:`read_idx` reads one IDX file.
  ``load_mnist(download=True)`` fetches missing files first.
* :func:`download_mnist` -- MNIST, Fashion-MNIST or KMNIST from their published locations,
  each file checked against a checksum written in the code.
* :func:`download_uci` -- the nine UCI regression sets with their standard splits, in the layout
  ``vmfdist.experiments.uci --data-dir`` reads, each file checked against its SHA-256.

Nothing is downloaded unless asked for.  Downloads go to ``root`` when given, else
``$VMFDIST_DATA``, else ``~/.cache/vmfdist`` (:func:`data_root`); a file that fails its check
is never kept, and when no mirror answers the error says where to put the files by hand.
"""
from .download import MNIST_SOURCES, DownloadError, data_root, download_mnist, file_digest
from .idx import IDX_FILES, find_idx_files, load_mnist, read_idx
from .uci import UCI_DATASETS, download_uci, uci_checksums

__all__ = ["DownloadError", "IDX_FILES", "MNIST_SOURCES", "UCI_DATASETS", "data_root", "download_mnist",
           "download_uci", "file_digest", "find_idx_files", "load_mnist", "read_idx", "uci_checksums"]
