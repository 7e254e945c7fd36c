"""Builds libstrata.so (CMake target strata_capi of the enclosing repository) into strata/_lib/.

    pip install ./python                       configures <repo>/build/python and builds strata_capi there
    STRATA_BUILD_DIR=build/release pip install ./python    reuses a configured build tree instead
    STRATA_CMAKE_ARGS="-DSTRATA_WITH_CUDA=OFF" pip install ./python    extra configure arguments
Only the library is built (no tests, tools or benchmarks); the package itself is pure Python (ctypes).
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ABI = 1


def build_library():
    build = os.environ.get("STRATA_BUILD_DIR")
    build = os.path.join(REPO, build) if build and not os.path.isabs(build) else build
    if not build:
        build = os.path.join(REPO, "build", "python")
        if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            args = ["cmake", "-S", REPO, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DSTRATA_BUILD_TESTS=OFF", "-DSTRATA_BUILD_BENCHMARKS=OFF"]
            subprocess.run(args + os.environ.get("STRATA_CMAKE_ARGS", "").split(), check=True)
    jobs = os.environ.get("STRATA_BUILD_JOBS", str(os.cpu_count() or 1))
    subprocess.run(["cmake", "--build", build, "--target", "strata_capi", "-j", jobs], check=True)
    return os.path.join(build, "lib", f"libstrata.so.{ABI}")


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "strata", "_lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(build_library(), os.path.join(dest, f"libstrata.so.{ABI}"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a native library: tag it for this platform
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
