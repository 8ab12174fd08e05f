"""Build script for vmfdist and its compiled extension ``vmfdist._C``.

The C++ sources (``csrc/ops.cpp`` and ``csrc/cpu/*.cpp``) are always compiled.
The CUDA sources (``csrc/cuda/*.cu``) are compiled whenever torch is a CUDA
build and a CUDA toolkit (nvcc) is found; no GPU is needed for that.  Set
``VMFDIST_FORCE_CPU=1`` to skip them, or ``VMFDIST_REQUIRE_CUDA=1`` to make a
missing toolkit an error (CI does this so that a broken .cu file fails it).

Install with ``pip install --no-build-isolation .`` so that the build uses the
torch already in the environment.
"""
import glob
import os
import site
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


def extensions():
    use_cuda = _use_cuda()
    sources = ["csrc/ops.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    # csrc/include: the host-device math (no ATen); csrc/host: host-side checks and orchestration
    include_dirs = [os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc")]
    cxx = ["-O3", "-std=c++20", "-fno-math-errno", "-ffp-contract=off", "-fopenmp"]
    extra = {"cxx": cxx}
    define_macros = []
    if use_cuda:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        include_dirs += _nvidia_include_dirs()
        extra["nvcc"] = ["-O3", "-std=c++20", "--fmad=false", "--expt-relaxed-constexpr",
                         "-Werror", "cross-execution-space-call"]
        ext_cls = ce.CUDAExtension
        define_macros.append(("VMFDIST_WITH_CUDA", None))
    else:
        ext_cls = ce.CppExtension
    return [ext_cls(
        name="vmfdist._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args=extra,
        define_macros=define_macros,
        # at::parallel_for is only parallel when the extension itself is built with OpenMP
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )]


setup(
    name="vmfdist",
    version="0.1.0",
    description="Directional and structured distributions, exact Bessel functions and Bayesian layers for PyTorch",
    packages=find_packages(include=["vmfdist", "vmfdist.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": ce.BuildExtension.with_options(use_ninja=True)},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "numpy"],
)
