"""The torch-free C++ drivers of tests/ (``*_check.cpp``): each compiles a math header of
csrc/include/vmfdist by itself, so that a test can compare the header's own output with an
independent reference."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_driver(tmp_path_factory, name, *flags):
    """tests/``name``.cpp compiled with ``flags`` (and C++17 without floating-point contraction,
    as the extension is built) into a temporary folder; the path of the executable.  Skips the
    test where there is no C++ compiler."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = str(tmp_path_factory.mktemp(name) / name)
    subprocess.run([cxx, "-std=c++17", *flags, "-ffp-contract=off", "-I", os.path.join(ROOT, "csrc", "include"),
                    os.path.join(ROOT, "tests", name + ".cpp"), "-o", exe], check=True)
    return exe
