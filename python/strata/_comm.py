"""The job's ranks: MPI_COMM_WORLD through mpi4py (launch with `mpirun -n N python train.py`).

mpi4py initialises MPI with MPI_THREAD_MULTIPLE, which Strata needs when it adopts a host-initialised MPI;
Strata duplicates the world communicator (strata_comm_create_mpi), so its traffic never meets the
host's. One strata communicator serves every engine of the process; it is destroyed at exit after the
engines still alive (Python's atexit runs before mpi4py finalises MPI).
"""
import atexit
import ctypes
import os
import sys
import weakref

from mpi4py import MPI

from strata import _capi


def torchrun_refusal(env, mpi_size):
    """The error for a torchrun launch of more than one rank, else None (docs/decisions/0007). Under
    torchrun each process initialises MPI as a 1-rank singleton, so it would train a model of its own;
    the host back-end's collectives need MPI's world. MPI's world wins when it has more than one rank or
    mpirun started the process (OMPI_COMM_WORLD_SIZE, PMI_SIZE), whatever the shell still holds."""
    try:
        size = int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return None
    if size <= 1 or mpi_size > 1 or "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        return None
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "train.py"
    return (f"strata: started by torchrun (WORLD_SIZE={size}), where each process is its own 1-rank MPI "
            f"world and would train a model of its own; strata.torch's ranks are MPI's: launch with "
            f"`mpirun -n {size} python {script}` (or srun)")


_refusal = torchrun_refusal(os.environ, MPI.COMM_WORLD.Get_size())
if _refusal:  # at import, on every rank, before any engine or collective
    raise RuntimeError(_refusal)

_comm = None
_engines = weakref.WeakSet()


def world():
    return MPI.COMM_WORLD


def strata_comm():
    """The process's strata_comm* (created on first use; collective then)."""
    global _comm
    if _comm is None:
        out = ctypes.c_void_p()
        _capi.check(_capi.lib.strata_comm_create_mpi(MPI.COMM_WORLD.py2f(), ctypes.byref(out)))
        _comm = out
        if MPI.COMM_WORLD.Get_size() > 1:
            _abort_on_uncaught_exception()
    return _comm


def _abort_on_uncaught_exception():
    """An exception that ends one rank's script ends the job at once (MPI_Abort, after the traceback),
    instead of leaving the other ranks in a collective until strata.collective_timeout_ms."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        abort(f"rank {rank()}: uncaught {kind.__name__}: {value}")

    sys.excepthook = hook


def track(engine):
    _engines.add(engine)


@atexit.register
def _shutdown():
    """At interpreter exit. A rank that leaves in the middle of a step (sys.exit, or a script that returns
    early) while its peers go on would leave them in a collective until its deadline: it ends the job
    instead, naming why. Otherwise the engines are closed and the communicator destroyed."""
    global _comm
    if _comm is not None and world_size() > 1:
        for e in list(_engines):
            why = e.mid_step()
            if why is not None:
                sys.stderr.flush()
                abort(f"rank {rank()}: exited in the middle of a step ({why})")
    for e in list(_engines):
        e.close()
    if _comm is not None:
        _capi.lib.strata_comm_destroy(_comm)
        _comm = None


def rank():
    return MPI.COMM_WORLD.Get_rank()


def world_size():
    return MPI.COMM_WORLD.Get_size()


def abort(reason):
    """Ends the whole job from this rank (MPI_Abort), so the others do not wait for a deadline."""
    if _comm is not None:
        _capi.lib.strata_comm_abort(_comm, reason.encode())
    MPI.COMM_WORLD.Abort(1)
