#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and build vmfdist into it.
# Cheap to run again: the dependencies and the editable install of the Python package
# are redone only when their inputs change, and the extension is built in place with
# ninja in the persistent build/ folder, so unchanged sources compile nothing and a
# changed source (or header) recompiles only the objects that depend on it.
#
#   VENV            where the environment lives (default: .venv in the repo root)
#   VMFDIST_TORCH   the torch requirement (default: torch==2.14.1, the CUDA build that
#                   lies on this machine's disk; torch==2.13.0 is the CPU build)
#   CUDA_HOME, TORCH_CUDA_ARCH_LIST, VMFDIST_FORCE_CPU, VMFDIST_REQUIRE_CUDA: see setup.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
REQS="${VMFDIST_TORCH:-torch==2.14.1} numpy scipy mpmath hypothesis pytest ninja setuptools wheel matplotlib scikit-learn"
STAMP="$VENV/.vmfdist-setup"
STATE="$REQS | $(cat pyproject.toml setup.py benchmarks/requirements-kron.txt | cksum)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$STATE" ]; then
  # shellcheck disable=SC2086
  "$PY" -m pip install -q $REQS
  # the peers the tests compare against (laplace-torch's KronLaplace, curvlinops' K-FAC,
  # torchmetrics), pinned and without dependencies: pip's resolver would replace torch
  "$PY" -m pip install -q --no-deps -r benchmarks/requirements-kron.txt
  # the Python package only, editable (a plain `pip install -e .` would compile the
  # extension in a fresh temporary folder every time)
  VMFDIST_SKIP_EXTENSION=1 "$PY" -m pip install -q --no-build-isolation --no-deps -e .
  echo "$STATE" > "$STAMP"
fi
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
export MAX_JOBS=${MAX_JOBS:-2}
# torch runs whatever `ninja` is first on PATH: put the environment's own (pinned in REQS) first,
# so a build from an activated shell and one from a plain shell use the same ninja.  Two ninja
# versions disagree on the hashes in build/.../.ninja_log (1.11 and 1.13 here), and each then
# rebuilt every object the other had built.
PATH="$(cd "$(dirname "$PY")" && pwd):$PATH"
export PATH
# vmfdist/_C*.so next to the sources; a no-op when nothing changed
"$PY" setup.py -q build_ext --inplace
"$PY" - <<'PYEOF'
import torch, vmfdist
print(f"vmfdist {vmfdist.__version__} built against torch {torch.__version__}; "
      f"CUDA kernels compiled: {torch._C._dispatch_has_kernel_for_dispatch_key('vmfdist::log_bessel_iv', 'CUDA')}")
PYEOF
