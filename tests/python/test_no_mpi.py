"""strata.torch on a machine with no MPI (issue 35, docs/decisions/0041-mpi-backend-module.md).

libstrata.so and everything beside it that strata.torch loads need no libmpi (readelf NEEDED, and the loader's
closure); only the MPI back-end module libstrata_mpi.so does. `torchrun --nproc-per-node 2` trains a host model on
a machine without MPI, simulated by tests/python/without_mpi.sh (a user and mount namespace in which Open MPI's
libraries and mpi4py are gone), bit for bit as `mpirun -n 2` does on this machine; no libmpi is mapped in its
ranks. Asking for MPI there fails naming the missing library and the ways out: the C ABI's MPI world, and an MPI
launch of strata.torch without mpi4py. Where no namespace can be made, the torchrun job runs with mpi4py blocked and
only the loader check (/proc/self/maps) stands for the missing MPI; the test prints which it used."""
import ctypes
import os
import subprocess
import sys

import pytest

import strata.torch as st
from common import once
from strata import _capi
from test_launch import _clean_env, _mpirun, _same, _saved, _torchrun

HERE = os.path.dirname(os.path.abspath(__file__))
WITHOUT_MPI = os.path.join(HERE, "without_mpi.sh")


def _needed(path):
    out = subprocess.run(["readelf", "-d", path], check=True, capture_output=True, text=True).stdout
    return [line.split("[")[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]


def test_the_libraries_strata_torch_loads_need_no_libmpi():
    """NEEDED of libstrata.so and of the modules beside it (libstrata_cuda.so when built), and ldd's closure of
    libstrata.so, name no libmpi; libstrata_mpi.so, the one library that may, does (the check has teeth)."""
    lib = _capi.library_path()
    libdir = os.path.dirname(lib)
    needed = _needed(lib)
    assert needed and not [n for n in needed if "libmpi" in n], f"{lib} needs {needed}"
    closure = subprocess.run(["ldd", lib], check=True, capture_output=True, text=True).stdout
    assert "libmpi" not in closure, closure
    others = [f for f in sorted(os.listdir(libdir)) if f.endswith(".so") and f != "libstrata_mpi.so"]
    for f in others:
        assert not [n for n in _needed(os.path.join(libdir, f)) if "libmpi" in n], f"{f} needs libmpi"
    module = os.path.join(libdir, "libstrata_mpi.so")
    assert os.path.exists(module), f"the package has no {module}"
    assert [n for n in _needed(module) if n.startswith("libmpi.so")], _needed(module)


def _namespace_works():
    return subprocess.run([WITHOUT_MPI, "true"], capture_output=True).returncode == 0


def _without_mpi_env():
    env = _clean_env()
    import mpi4py  # this job's (an mpirun job): its package is hidden in the namespace
    env["WITHOUT_MPI_HIDE"] = os.path.dirname(os.path.abspath(mpi4py.__file__))
    return env


@once
def test_torchrun_trains_without_mpi_as_mpirun_does_bit_for_bit(tmp_path):
    script = os.path.join(HERE, "launch_train.py")
    rc, out, _ = _mpirun(2, script, str(tmp_path / "mpi"), "3")
    assert rc == 0, out
    if _namespace_works():
        mode, env, prefix = "namespace", _without_mpi_env(), [WITHOUT_MPI]
    else:
        env = _clean_env()
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "no_mpi4py"), env.get("PYTHONPATH", "")])
        mode, prefix = "maps", []
    print(f"machine without MPI simulated by: {mode}")
    env["NO_MPI_MODE"] = mode
    cmd = prefix + [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    os.path.join(HERE, "no_mpi_train.py"), str(tmp_path / "torchrun"), "3"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(2):
        assert f"rank {r}: no libmpi mapped" in out, out
        if mode == "namespace":
            assert f"rank {r}: libmpi.so.40 cannot be loaded" in out, out
            assert (f"rank {r}: strata_comm_create_mpi_world: STRATA_ERR_FAILED_PRECONDITION: "
                    "strata_comm_create_mpi_world: the MPI back-end module libstrata_mpi.so could not be loaded") in out
            assert "libmpi.so.40: cannot open shared object file" in out, out
            assert "install Open MPI" in out and "launch with torchrun" in out, out
    mpi, tr = _saved(tmp_path / "mpi", 2), _saved(tmp_path / "torchrun", 2)
    for r in range(2):
        assert mpi[r]["world"] == tr[r]["world"] == 2
        _same(mpi[r], tr[r], f"rank {r} of 2 without MPI")
    assert mpi[0]["losses"] != mpi[1]["losses"]


@once
def test_an_mpi_launch_without_mpi_names_the_cause_and_the_fix():
    """A process that looks started by mpirun (OMPI_COMM_WORLD_SIZE) on a machine without MPI: st.shard's world
    needs mpi4py, and the ImportError names the launch, the cause and both ways out."""
    code = ("import torch, strata.torch as st\n"
            "st.shard(torch.nn.Linear(4, 4), config={'zero_optimization': {'stage': 3}})\n")
    if _namespace_works():
        cmd, env = [WITHOUT_MPI, sys.executable, "-c", code], _without_mpi_env()
    else:
        cmd, env = [sys.executable, "-c", code], _clean_env()
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "no_mpi4py"), env.get("PYTHONPATH", "")])
    env["OMPI_COMM_WORLD_SIZE"] = "1"
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0, p.stdout + p.stderr
    assert ("ImportError: strata: an MPI launcher (mpirun, srun) started this process (OMPI_COMM_WORLD_SIZE=1), and "
            "an MPI job's ranks are reached through mpi4py, which cannot be imported here") in p.stderr, p.stderr
    assert "install Open MPI and mpi4py" in p.stderr and "torchrun --nproc_per_node N" in p.stderr, p.stderr


def test_an_mpi_world_without_the_mpi_module_names_the_file_and_the_fix(tmp_path):
    """Fault injection at the C ABI: STRATA_MPI_MODULE names a file that is not there; strata_comm_create_mpi_world
    and strata_comm_create_mpi fail with FAILED_PRECONDITION naming it, dlerror()'s text and the fix, and make
    nothing (in a process of its own: the module's outcome is kept for the process)."""
    missing = tmp_path / "libstrata_mpi.so"
    code = ("import ctypes\nfrom strata import _capi\n"
            "for call, args in (('strata_comm_create_mpi_world', ()), ('strata_comm_create_mpi', (0,))):\n"
            "    comm = ctypes.c_void_p()\n"
            "    s = getattr(_capi.lib, call)(*args, ctypes.byref(comm))\n"
            "    print(_capi.lib.strata_status_name(s).decode(), _capi.lib.strata_last_error().decode(), comm.value)\n")
    env = _clean_env()
    env["STRATA_MPI_MODULE"] = str(missing)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 2, p.stdout
    for call, line in zip(("strata_comm_create_mpi_world", "strata_comm_create_mpi"), lines):
        assert line.startswith(f"STRATA_ERR_FAILED_PRECONDITION {call}: the MPI back-end module libstrata_mpi.so could "
                               f"not be loaded (tried {missing} ({missing}: cannot open shared object file"), line
        assert "install Open MPI" in line and "launch with torchrun" in line, line
        assert line.endswith(" None"), line
