"""The job's ranks: MPI_COMM_WORLD through mpi4py (`mpirun -n N python train.py`), or, for a model on CUDA,
torchrun's world (`torchrun --nproc_per_node N train.py`; docs/decisions/0020).

mpi4py initialises MPI with MPI_THREAD_MULTIPLE, which Strata needs when it adopts a host-initialised MPI;
Strata duplicates the world communicator (strata_comm_create_mpi), so its traffic never meets the
host's. Under torchrun (each process a 1-rank MPI singleton) a CUDA engine's communicator is
strata_comm_create_torchrun's NCCL world, and the front end's own small collectives (rank 0's initial
values, all_reduce_mean) run on a gloo group of torch.distributed over the same ranks. One strata
communicator serves every engine of the process; it is destroyed at exit after the engines still alive
(Python's atexit runs before mpi4py finalises MPI).
"""
import atexit
import ctypes
import os
import sys
import weakref

from mpi4py import MPI

from strata import _capi


def torchrun_launch(env, mpi_size):
    """(rank, world_size, local_rank) of a torchrun launch, else None (docs/decisions/0007): recognised by
    WORLD_SIZE; MPI's world wins when it has more than one rank or mpirun started the process
    (OMPI_COMM_WORLD_SIZE, PMI_SIZE), whatever the shell still holds."""
    if "WORLD_SIZE" not in env or mpi_size > 1 or "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        return None
    try:
        size = int(env["WORLD_SIZE"])
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        return None  # not torchrun's: left to strata_comm_create_torchrun, which names the variable
    return rank, size, local


def torchrun_refusal(env, mpi_size):
    """The error for a torchrun launch of more than one rank of a host (CPU) model, else None. Under
    torchrun each process initialises MPI as a 1-rank singleton, so it would train a model of its own;
    the host back-end's collectives need MPI's world. A model on CUDA is not refused (NCCL's world)."""
    launch = torchrun_launch(env, mpi_size)
    if launch is None or launch[1] <= 1:
        return None
    size = launch[1]
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "train.py"
    return (f"strata: started by torchrun (WORLD_SIZE={size}), where each process is its own 1-rank MPI "
            f"world and would train a model of its own; strata.torch's ranks on the host are MPI's: launch with "
            f"`mpirun -n {size} python {script}` (or srun), or put the model on CUDA (torchrun's ranks then "
            f"bootstrap NCCL)")


def _torchrun():
    return torchrun_launch(os.environ, MPI.COMM_WORLD.Get_size())


_comm = None
_engines = weakref.WeakSet()


_kind = None  # "mpi" or "torchrun": the kind of _comm
_gloo = None


def world():
    return MPI.COMM_WORLD


def strata_comm(cuda=False, timeout_ms=0):
    """The process's strata_comm* (created on first use; collective then): torchrun's NCCL world for a CUDA
    engine under torchrun, else MPI's world (on CUDA the engine bootstraps NCCL over it)."""
    global _comm, _kind
    kind = "torchrun" if cuda and _torchrun() is not None else "mpi"
    if not cuda:
        refusal = torchrun_refusal(os.environ, MPI.COMM_WORLD.Get_size())
        if refusal:  # on every rank, before any engine or collective
            raise RuntimeError(refusal)
    if _comm is not None:
        if kind != _kind:
            raise RuntimeError(f"strata: this process's engines already run on the {_kind} world; a host and a "
                               f"CUDA model cannot both be sharded under torchrun")
        return _comm
    out = ctypes.c_void_p()
    if kind == "torchrun":
        _capi.check(_capi.lib.strata_comm_create_torchrun(int(timeout_ms), ctypes.byref(out)))
    else:
        _capi.check(_capi.lib.strata_comm_create_mpi(MPI.COMM_WORLD.py2f(), ctypes.byref(out)))
    _comm, _kind = out, kind
    if kind == "mpi" and MPI.COMM_WORLD.Get_size() > 1:
        _abort_on_uncaught_exception()
    return _comm


def _gloo_group():
    """torchrun's ranks for host-buffer collectives: torch.distributed's gloo, over torchrun's store."""
    global _gloo
    if _gloo is None:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo")
            _gloo = dist.group.WORLD
        else:  # the script's own process group (often NCCL): a gloo group beside it
            _gloo = dist.new_group(backend="gloo")
    return _gloo


def broadcast(t, root=0):
    """Rank `root`'s values of a contiguous CPU tensor into every rank's (collective)."""
    if _torchrun() is None:
        MPI.COMM_WORLD.Bcast(t.numpy(), root=root)
    elif world_size() > 1:
        import torch.distributed as dist
        dist.broadcast(t, src=root, group=_gloo_group())


def broadcast_from_0(t):
    """Rank 0's values of a contiguous CPU tensor into every rank's (collective)."""
    broadcast(t, 0)


def broadcast_object(obj, root=0):
    """Rank `root`'s picklable `obj` on every rank (collective; small host values: plans, verdicts)."""
    if _torchrun() is None:
        return MPI.COMM_WORLD.bcast(obj, root=root)
    if world_size() == 1:
        return obj
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, src=root, group=_gloo_group())
    return box[0]


def allgather_object(obj):
    """Every rank's picklable `obj`, in rank order, on every rank (collective)."""
    if _torchrun() is None:
        return MPI.COMM_WORLD.allgather(obj)
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * world_size()
    dist.all_gather_object(out, obj, group=_gloo_group())
    return out


def all_reduce_sum(t):
    """In place: the sum over ranks of a contiguous CPU float64 tensor (collective)."""
    if _torchrun() is None:
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)
    elif world_size() > 1:
        import torch.distributed as dist
        dist.all_reduce(t, group=_gloo_group())


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
    t = _torchrun()
    return MPI.COMM_WORLD.Get_rank() if t is None else t[0]


def world_size():
    t = _torchrun()
    return MPI.COMM_WORLD.Get_size() if t is None else t[1]


def abort(reason):
    """Ends the whole job from this rank (MPI_Abort), so the others do not wait for a deadline. Under torchrun
    the process exits non-zero and torchrun's agent stops the other ranks."""
    if _kind == "torchrun":
        print(f"strata: aborting: {reason}", file=sys.stderr, flush=True)
        os._exit(1)
    if _comm is not None:
        _capi.lib.strata_comm_abort(_comm, reason.encode())
    MPI.COMM_WORLD.Abort(1)
