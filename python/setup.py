"""Builds libstrata.so (CMake target strata_capi of the enclosing repository) into strata/_lib/, with the CUDA
back-end module libstrata_cuda.so beside it when the build has CUDA, and the MPI back-end module libstrata_mpi.so
when it has MPI (the only part that links libmpi, loaded in MPI jobs alone: docs/decisions/0041).

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
    targets = ["strata_capi"]
    # A CUDA build also has the CUDA back-end module, which libstrata loads from beside itself at run time
    # (docs/decisions/0012); without it the package runs host-only.
    with open(os.path.join(build, "CMakeCache.txt")) as cache:
        text = cache.read()
    modules = {"strata_cuda_module": "libstrata_cuda.so", "strata_mpi_module": "libstrata_mpi.so"}
    if "STRATA_WITH_CUDA:BOOL=ON" in text:
        targets.append("strata_cuda_module")
    if "STRATA_WITH_MPI:BOOL=ON" in text:
        targets.append("strata_mpi_module")
    subprocess.run(["cmake", "--build", build, "--target", *targets, "-j", jobs], check=True)
    libs = [os.path.join(build, "lib", f"libstrata.so.{ABI}")]
    for target in targets[1:]:
        module = os.path.join(build, "lib", modules[target])
        if os.path.exists(module):
            libs.append(module)
    return libs


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "strata", "_lib")
        os.makedirs(dest, exist_ok=True)
        for lib in build_library():
            shutil.copy2(lib, os.path.join(dest, os.path.basename(lib)))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel carries a native library: tag it for this platform
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=BinaryDistribution)
