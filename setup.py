"""Build script for vmfdist and its compiled extension ``vmfdist._C``.

The C++ sources (``csrc/ops.cpp`` and ``csrc/cpu/*.cpp``) are always compiled.
The CUDA sources (``csrc/cuda/*.cu``) are compiled whenever torch is a CUDA
build and a CUDA toolkit (nvcc) is found; no GPU is needed for that.  Set
``VMFDIST_FORCE_CPU=1`` to skip them, or ``VMFDIST_REQUIRE_CUDA=1`` to make a
missing toolkit an error (CI does this so that a broken .cu file fails it).
``TORCH_CUDA_ARCH_LIST`` is respected; when it is unset and no GPU is visible, the
architectures come from the installed torch (see ``_default_cuda_arch_list``).
``VMFDIST_SKIP_EXTENSION=1`` installs the pure-Python package only (``scripts/setup.sh``
does that once, then builds the extension in place, incrementally).

Install with ``pip install --no-build-isolation .`` so that the build uses the
torch already in the environment.
"""
import glob
import os
import site
import subprocess
import sys

from setuptools import find_packages, setup

import torch
from torch.utils import cpp_extension as ce

ROOT = os.path.dirname(os.path.abspath(__file__))


def _nvidia_include_dirs():
    """Headers shipped by the ``nvidia-*`` pip packages (needed by ATen/cuda)."""
    dirs = []
    for base in site.getsitepackages() + [site.getusersitepackages()]:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
            p = os.path.join(base, sub)
            if os.path.isdir(p):
                dirs.append(p)
    return dirs


def _use_cuda():
    if os.environ.get("VMFDIST_FORCE_CPU", "0") == "1":
        return False
    ok = torch.version.cuda is not None and ce.CUDA_HOME is not None and (
        os.path.exists(os.path.join(ce.CUDA_HOME, "bin", "nvcc")))
    if not ok and os.environ.get("VMFDIST_REQUIRE_CUDA", "0") == "1":
        sys.exit("VMFDIST_REQUIRE_CUDA=1 but torch is not a CUDA build or nvcc was not found")
    return ok


def _arch(entry):
    """'sm_86' -> (8, 6); None for anything else (compute_*, suffixed variants)."""
    if not entry.startswith("sm_") or not entry[3:].isdigit():
        return None
    digits = entry[3:]
    return int(digits[:-1]), int(digits[-1])


def _nvcc_archs():
    """The real architectures nvcc can compile for, or None if it cannot tell."""
    try:
        out = subprocess.run([os.path.join(ce.CUDA_HOME, "bin", "nvcc"), "--list-gpu-arch"], capture_output=True,
                             text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return None
    return {(int(e[8:-1]), int(e[-1])) for e in out if e.startswith("compute_") and e[8:].isdigit()}


def _default_cuda_arch_list():
    """TORCH_CUDA_ARCH_LIST for a build on a machine where no GPU is visible.

    The architectures the installed torch itself ships kernels for
    (``torch.cuda.get_arch_list()``, which needs no GPU) that nvcc supports, one per
    major version -- the lowest minor, since a cubin for X.y runs on every X.z with
    z >= y -- plus PTX of the newest, which the driver compiles for later GPUs.  With
    torch 2.14 (CUDA 13) and nvcc 13 that is "7.5;8.0;9.0;10.0;12.0+PTX" (Turing to
    Blackwell).
    """
    archs = sorted({a for a in map(_arch, torch.cuda.get_arch_list()) if a is not None})
    supported = _nvcc_archs()
    if supported is not None:
        archs = [a for a in archs if a in supported]
    if not archs:
        sys.exit("no CUDA architecture both torch.cuda.get_arch_list() and nvcc support; set TORCH_CUDA_ARCH_LIST")
    lowest = {}
    for major, minor in archs:
        lowest.setdefault(major, (major, minor))
    chosen = [f"{ma}.{mi}" for ma, mi in sorted(lowest.values())]
    chosen[-1] += "+PTX"
    return ";".join(chosen)


def _set_cuda_arch_list():
    """Respect the user's TORCH_CUDA_ARCH_LIST; with none, let torch build for the GPUs it
    sees; with no GPU visible (where torch's own detection fails) use the default list."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    os.environ["TORCH_CUDA_ARCH_LIST"] = _default_cuda_arch_list()


def extensions():
    if os.environ.get("VMFDIST_SKIP_EXTENSION", "0") == "1":
        return []  # the pure-Python package only (scripts/setup.sh builds the extension in place)
    use_cuda = _use_cuda()
    sources = ["csrc/ops.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    # csrc/include: the host-device math (no ATen); csrc/host: host-side checks and orchestration
    include_dirs = [os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc")]
    cxx = ["-O3", "-std=c++20", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]
    extra = {"cxx": cxx}
    if use_cuda:
        _set_cuda_arch_list()
        print(f"vmfdist: CUDA kernels for TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST', '(the visible GPUs)')}")
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        include_dirs += _nvidia_include_dirs()
        extra["nvcc"] = ["-O3", "-std=c++20", "--fmad=false", "--expt-relaxed-constexpr",
                         "-Werror", "cross-execution-space-call"]
        ext_cls = ce.CUDAExtension
    else:
        ext_cls = ce.CppExtension
    # headers too: setuptools rebuilds only when a listed file is newer than the module,
    # and ninja then recompiles only the objects whose sources or headers changed
    depends = sorted(glob.glob("csrc/**/*.h", recursive=True) + glob.glob("csrc/**/*.cuh", recursive=True))
    return [ext_cls(
        name="vmfdist._C",
        sources=sources,
        depends=depends,
        include_dirs=include_dirs,
        extra_compile_args=extra,
        # at::parallel_for is only parallel when the extension itself is built with OpenMP
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )]


setup(
    name="vmfdist",
    version="0.1.0",
    description="Directional and structured distributions, exact Bessel functions and Bayesian layers for PyTorch",
    packages=find_packages(include=["vmfdist", "vmfdist.*"]),
    package_data={"vmfdist.datasets": ["uci_sha256.json"]},  # the UCI files' SHA-256 sums
    ext_modules=extensions(),
    cmdclass={"build_ext": ce.BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    python_requires=">=3.10",
    install_requires=["torch>=2.11", "numpy"],
)
