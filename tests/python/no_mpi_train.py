"""Run by test_no_mpi.py as each torchrun rank on a machine without MPI (tests/python/without_mpi.sh):
launch_train.py's training (argv as there), framed by the checks that make the run mean "no MPI".

NO_MPI_MODE=namespace (the namespace hides MPI): before training, libmpi cannot be loaded and mpi4py's MPI cannot be
imported (the simulation holds); after it, asking the C ABI for an MPI communicator fails naming the module, the
missing libmpi and the ways out (Open MPI, or torchrun). NO_MPI_MODE=maps (no namespace could be made): mpi4py is
blocked (tests/python/no_mpi4py) and only the loader check below is made. Both: at the end no libmpi is mapped in
this process (/proc/self/maps), so libstrata.so and everything strata.torch loaded ran without it."""
import ctypes
import os
import runpy
import sys

from strata import _capi

HERE = os.path.dirname(os.path.abspath(__file__))
mode = os.environ["NO_MPI_MODE"]
rank = int(os.environ["RANK"])


def libmpi_mapped():
    with open("/proc/self/maps") as maps:
        return sorted({line.split()[-1] for line in maps if "libmpi" in line})


if mode == "namespace":
    try:
        ctypes.CDLL("libmpi.so.40")
        sys.exit("no_mpi_train.py: libmpi.so.40 loads: the namespace does not hide MPI")
    except OSError as e:
        print(f"rank {rank}: libmpi.so.40 cannot be loaded ({e})", flush=True)
    try:
        from mpi4py import MPI  # noqa: F401
        sys.exit("no_mpi_train.py: mpi4py's MPI imports: the namespace does not hide it")
    except ImportError as e:
        print(f"rank {rank}: mpi4py cannot be imported ({e})", flush=True)

sys.argv = [os.path.join(HERE, "launch_train.py")] + sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

if mode == "namespace":
    comm = ctypes.c_void_p()
    status = _capi.lib.strata_comm_create_mpi_world(ctypes.byref(comm))
    name, message = _capi.lib.strata_status_name(status).decode(), _capi.lib.strata_last_error().decode()
    print(f"rank {rank}: strata_comm_create_mpi_world: {name}: {message}", flush=True)
    if comm.value:
        sys.exit("no_mpi_train.py: an MPI communicator was made without MPI")
mapped = libmpi_mapped()
if mapped:
    sys.exit(f"no_mpi_train.py: rank {rank} mapped {mapped}")
print(f"rank {rank}: no libmpi mapped", flush=True)
