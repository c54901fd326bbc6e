"""Builds the binding with the repository's CMake project and packages the folder it assembles
(build/<dir>/python/strata: the Python files, _strata.*.so and the libstrata.so.N it loads
through $ORIGIN). STRATA_BUILD_DIR reuses a configured build folder (e.g. build/release);
otherwise build/pip is configured for the running interpreter."""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(strata VERSION ([0-9.]+)", f.read()).group(1)


class BuildWithCMake(build_ext):
    def run(self):
        if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
            sys.exit("setup.py: build from a Strata checkout (pip install ./python from the "
                     "repository root); the C++ sources are one folder up")
        build = os.environ.get("STRATA_BUILD_DIR") or os.path.join(ROOT, "build", "pip")
        build = os.path.abspath(build)
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=Release", "-DSTRATA_BUILD_TESTS=OFF",
                                   "-DSTRATA_WITH_PYTHON=ON",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
        jobs = str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build, "--target", "strata_python",
                               "-j", jobs])
        package = os.path.join(build, "python", "strata")
        dest = os.path.join(self.build_lib, "strata")
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(package, dest, symlinks=False)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # runs build_ext (CMake), and makes a platform wheel
        return True


setup(version=version(), packages=[], cmdclass={"build_ext": BuildWithCMake},
      distclass=BinaryDistribution)
