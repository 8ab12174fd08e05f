"""Reproductions of the papers' experiments, as commands of the library.

Run ``python -m vmfdist.experiments <name> [options]``; ``--help`` lists the names and each
one's options.  Every experiment uses only the library's public API, writes its tables
(markdown + JSON with every per-split number, the commit and the wall time) and pictures
to ``--out`` (default ``./vmfdist-results``; the recorded runs are written to ``docs/experiments``
only when that is named), atomically after every unit of work, and fixes its seeds per split
so that a split re-run alone reproduces the number recorded for it in a full run.

* ``uci`` -- the UCI regression table of Bae et al. 2018 (Table 1): test
  log-likelihood and RMSE per data set and method (:mod:`vmfdist.experiments.uci`).
* ``digits-pruning`` -- RDP structured pruning (Oh et al. 2019, section 5) on scikit-learn's digits
  (:mod:`vmfdist.experiments.pruning`).
* ``radial-robustness`` -- Radial vs mean-field VI over a grid of learning rates and initial
  posterior scales (Farquhar et al. 2020, section 4.1.3) (:mod:`vmfdist.experiments.robustness`).
* ``laplace-calibration`` -- MAP vs K-FAC / EK-FAC Laplace (Kolesov 2021): accuracy, NLL, ECE,
  OOD AUROC and reliability diagrams on digits (:mod:`vmfdist.experiments.calibration`).

:mod:`vmfdist.experiments.digits` holds the digits data, network and training loops they share.
"""
