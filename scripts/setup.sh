#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and build vmfdist into it.
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
"$PY" -m pip install -q "${VMFDIST_TORCH:-torch==2.14.1}" numpy scipy mpmath hypothesis pytest ninja \
  setuptools wheel matplotlib
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-"8.0;9.0+PTX"}
export MAX_JOBS=${MAX_JOBS:-2}
"$PY" -m pip install -q --no-build-isolation -e .
"$PY" - <<'PYEOF'
import torch, vmfdist
print(f"vmfdist {vmfdist.__version__} built against torch {torch.__version__}; "
      f"CUDA kernels compiled: {torch._C._dispatch_has_kernel_for_dispatch_key('vmfdist::log_bessel_iv', 'CUDA')}")
PYEOF
