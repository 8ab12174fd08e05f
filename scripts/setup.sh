#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and build vmfdist into it.
# Cheap to run again: the dependencies and the editable install of the Python package
# are redone only when their inputs change, and the extension is built in place with
# ninja in the persistent build/ folder, so unchanged sources compile nothing and a
# changed source (or header) recompiles only the objects that depend on it.
#
# What is built is what the machine can use (docs/install.md, "make demo / make test"):
#   no GPU visible (nvidia-smi lists none) and no CUDA asked for: the CPU build of torch
#   (torch==2.13.0, 0.2 GB, on this machine's disk) and the C++ kernels only -- minutes, not
#   the half hour the CUDA kernels for every architecture take on 2 cores;
#   a GPU visible, or VMFDIST_CUDA=1 (or VMFDIST_REQUIRE_CUDA=1, as CI sets): the CUDA build of
#   torch (torch==2.14.1) and the CUDA kernels too -- for the visible GPU only, or without one
#   for the architectures of TORCH_CUDA_ARCH_LIST / setup.py's default list.
#
#   VENV            where the environment lives (default: .venv in the repo root)
#   VMFDIST_TORCH   the torch requirement, overriding the choice above (any pip arguments,
#                   e.g. "torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu"
#                   where the CPU build is not on the local disk)
#   VMFDIST_CUDA=1  build the CUDA kernels (and install the CUDA build of torch) without a GPU
#   CUDA_HOME, TORCH_CUDA_ARCH_LIST, VMFDIST_FORCE_CPU, VMFDIST_REQUIRE_CUDA: see setup.py
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  WANT_CUDA=1
elif [ "${VMFDIST_CUDA:-0}" = 1 ] || [ "${VMFDIST_REQUIRE_CUDA:-0}" = 1 ]; then
  WANT_CUDA=1
else
  WANT_CUDA=0
fi
if [ -n "${VMFDIST_TORCH:-}" ]; then
  TORCH_REQ="$VMFDIST_TORCH"
elif [ "$WANT_CUDA" = 1 ]; then
  TORCH_REQ="torch==2.14.1"
else
  TORCH_REQ="torch==2.13.0"
  export VMFDIST_FORCE_CPU=${VMFDIST_FORCE_CPU:-1}
fi
REQS="$TORCH_REQ numpy scipy mpmath hypothesis pytest pytest-xdist ninja setuptools wheel matplotlib scikit-learn"
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
# build/ and the in-place module belong to one torch and one choice of kernels: after a switch
# (a CPU venv made a CUDA one, or torch upgraded) everything is rebuilt once, not mixed
CONFIG="torch $("$PY" -c 'import torch; print(torch.__version__)') force_cpu=${VMFDIST_FORCE_CPU:-0} archs=${TORCH_CUDA_ARCH_LIST:-default}"
if [ -f build/.vmfdist-config ] && [ "$(cat build/.vmfdist-config)" != "$CONFIG" ]; then
  echo "build configuration changed ($(cat build/.vmfdist-config) -> $CONFIG): rebuilding from scratch"
  rm -rf build vmfdist/_C*.so
fi
mkdir -p build
echo "$CONFIG" > build/.vmfdist-config
# vmfdist/_C*.so next to the sources; a no-op when nothing changed
"$PY" setup.py -q build_ext --inplace
"$PY" - <<'PYEOF'
import torch, vmfdist
print(f"vmfdist {vmfdist.__version__} built against torch {torch.__version__}; "
      f"CUDA kernels compiled: {torch._C._dispatch_has_kernel_for_dispatch_key('vmfdist::log_bessel_iv', 'CUDA')}")
PYEOF
