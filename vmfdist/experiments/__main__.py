"""``python -m vmfdist.experiments <name> [options]`` (``--help`` for the list)."""
from __future__ import annotations

import argparse
import sys

from . import calibration, mnist_continual, mnist_data, mnist_laplace, mnist_pruning, pruning, robustness, uci

EXPERIMENTS = {
    "uci": (uci, "UCI regression table (Bae et al. 2018, Table 1): test log-likelihood and RMSE"),
    "digits-pruning": (pruning, "RDP structured pruning on digits (Oh et al. 2019, section 5)"),
    "radial-robustness": (robustness, "Radial vs mean-field over a hyperparameter grid "
                                      "(Farquhar et al. 2020, section 4.1.3)"),
    "laplace-calibration": (calibration, "MAP vs K-FAC / EK-FAC Laplace: calibration and OOD detection on digits"),
    "mnist-pruning": (mnist_pruning, "RDP structured pruning of LeNet-5-Caffe on MNIST (Oh et al. 2019, Table 2)"),
    "mnist-laplace": (mnist_laplace, "K-FAC / EK-FAC Laplace on MNIST: calibration, rotated MNIST, OOD detection"),
    "mnist-continual": (mnist_continual, "Split MNIST continual learning: mean-field vs Radial (Farquhar et al. "
                                         "2020, section 4.2)"),
}


_DIGITS = ("scikit-learn's handwritten digits (sklearn.datasets.load_digits: 1797 images of 8x8 pixels), bundled with "
           "scikit-learn -- nothing to download")
#: where each experiment's data come from (its --help says so)
DATA = {
    "uci": f"--data-dir: {uci.DATA_HELP}.",
    "digits-pruning": _DIGITS + ".",
    "radial-robustness": f"{_DIGITS}; and for the uci task, --data-dir: {uci.DATA_HELP}.",
    "laplace-calibration": _DIGITS + ".",
    "mnist-pruning": f"--data-dir: {mnist_data.DATA_HELP}.",
    "mnist-laplace": f"--data-dir: {mnist_data.DATA_HELP}.",
    "mnist-continual": f"--data-dir: {mnist_data.DATA_HELP}.",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vmfdist.experiments",
                                     description="Reproductions of the papers' experiments.")
    sub = parser.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, (mod, text) in EXPERIMENTS.items():
        p = sub.add_parser(name, help=text, description=(mod.__doc__ or "").split("\n\n")[0],
                           epilog=f"Data: {DATA[name]}")
        mod.add_arguments(p)
    args = parser.parse_args(argv)
    try:
        EXPERIMENTS[args.name][0].run(args)
    except (FileNotFoundError, ValueError) as e:  # bad paths or arguments: say what, no traceback
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
