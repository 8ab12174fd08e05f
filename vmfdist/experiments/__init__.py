"""Reproductions of the papers' experiments, as commands of the library.

Run ``python -m vmfdist.experiments <name> [options]``; ``--help`` lists the names and each
one's options.  Every experiment uses only the library's public API, writes its tables
(markdown + JSON with every per-split number, the commit and the wall time) and pictures
to ``--out`` (default ``docs/experiments``), and fixes its seeds per split so that a split
re-run alone reproduces the number recorded for it in a full run.

* ``uci`` -- the UCI regression table of 000_70f16331c5caf49d.txt (Table 1): test
  log-likelihood and RMSE per data set and method (:mod:`vmfdist.experiments.uci`).
"""
