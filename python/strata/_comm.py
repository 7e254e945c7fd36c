"""The job's ranks (docs/decisions/0014, 0020, 0033). One world per process, chosen at the first st.shard (or the
first collective of the front end):

  mpi    mpirun / srun started the process (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK) and st.shard was given no
         process_group: MPI_COMM_WORLD through mpi4py, imported only then. mpi4py initialises MPI with
         MPI_THREAD_MULTIPLE, which Strata needs when it adopts a host-initialised MPI; Strata duplicates the world
         communicator (strata_comm_create_mpi), so its traffic never meets the host's.
  torch  a process group of torch.distributed: the one st.shard was given, else the default group (under torchrun
         initialised here as gloo from torchrun's environment when the script has not, once the ranks agree on
         it: Note [A launch's ranks agree]). A host engine's
         communicator is strata_comm_create_foreign over gloo groups split off it (strata._torch_comm), or, when
         every rank is on this host, the shared-memory one set up over it (Note [The host transport under
         torchrun]); a CUDA
         engine's, torchrun's NCCL world (strata_comm_create_torchrun). The front end's own small collectives
         (rank 0's initial values, plans, all_reduce_mean) run on a gloo group over the same ranks: the group
         itself when it is gloo and Strata initialised it, else a gloo group beside it.
  single neither: one process, a 1-rank in-process communicator (no MPI needed).

One strata communicator serves every engine of the process; it is destroyed at exit after the engines still
alive (Python's atexit runs before mpi4py finalises MPI).
"""
import atexit
import collections
import ctypes
import os
import sys
import weakref

from strata import _capi
from strata._log import who

_MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def mpi_launch(env):
    """Whether an MPI launcher (mpirun, srun) started this process."""
    return any(v in env for v in _MPI_VARIABLES)


def torchrun_launch(env, mpi_size=1):
    """(rank, world_size, local_rank) of a torchrun launch, else None (docs/decisions/0007): recognised by
    WORLD_SIZE; MPI's world wins when it has more than one rank or an MPI launcher started the process,
    whatever the shell still holds."""
    if "WORLD_SIZE" not in env or mpi_size > 1 or mpi_launch(env):
        return None
    try:
        size = int(env["WORLD_SIZE"])
        rank = int(env.get("RANK", "0"))
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        return None  # not torchrun's: left to torch.distributed / strata_comm_create_torchrun, which name it
    return rank, size, local


def _torchrun():
    return torchrun_launch(os.environ)


class _World:
    """The ranks of the job: kind "mpi", "torch" or "single" (the module's docstring)."""

    def __init__(self, kind, group=None, host_group=None, owns_default=False):
        self.kind, self.group, self.host_group, self.owns_default = kind, group, host_group, owns_default

    def rank(self):
        if self.kind == "mpi":
            return _mpi().COMM_WORLD.Get_rank()
        return self.group.rank() if self.kind == "torch" else 0

    def size(self):
        if self.kind == "mpi":
            return _mpi().COMM_WORLD.Get_size()
        return self.group.size() if self.kind == "torch" else 1


_world = None  # the bound _World
_comm = None   # the process's strata_comm*
_cuda = None   # whether _comm is a CUDA engine's (torch: NCCL) or a host one's
_watch_tried = False  # strata_comm_watch_torchrun was called
_engines = weakref.WeakSet()
_dropped = collections.deque()  # Note [Dropped engines]: handles of host engines collected without close()
_dropped_cuda = collections.deque()  # of CUDA engines: destroyed at the exit


def _mpi():
    try:
        from mpi4py import MPI  # only in an MPI job: neither mpi4py nor MPI is needed otherwise
    except ImportError as e:  # no mpi4py, or no libmpi under it: name the launch, the cause and both ways out
        launcher = ", ".join(f"{v}={os.environ[v]}" for v in _MPI_VARIABLES if v in os.environ)
        raise ImportError(f"strata: an MPI launcher (mpirun, srun) started this process ({launcher}), and an MPI "
                          f"job's ranks are reached through mpi4py, which cannot be imported here ({e}): install "
                          f"Open MPI and mpi4py (pip install 'strata[mpi]'), or launch with `torchrun "
                          f"--nproc_per_node N` instead, where strata.torch needs no MPI") from e
    return MPI


def world():
    """MPI_COMM_WORLD (mpi4py) of an MPI job."""
    return _mpi().COMM_WORLD


def _default_world():
    if mpi_launch(os.environ):
        return _World("mpi")
    import torch.distributed as dist
    if not dist.is_initialized():
        if _torchrun() is None:
            return _World("single")
        _init_default_group(dist)  # torchrun's environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
        return _World("torch", dist.group.WORLD, dist.group.WORLD, owns_default=True)
    return _torch_world(dist.group.WORLD)


def _init_default_group(dist):
    """init_process_group("gloo") from the launch's environment, after the ranks have agreed on it (Note [A launch's
    ranks agree])."""
    rank, size, _ = _torchrun()
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not addr or not port.isdigit() or size < 2:
        dist.init_process_group("gloo")  # torch names what is missing, or has nobody to wait for
        return
    if not 0 <= rank < size:
        raise ValueError(f"strata: RANK is {rank}, outside 0 .. WORLD_SIZE - 1 = {size - 1}: give the job's "
                         f"processes the ranks 0 to WORLD_SIZE - 1, one each")
    timeout = dist.default_pg_timeout
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent serves the store already
        store = dist.TCPStore(addr, int(port), is_master=False, timeout=timeout)
        _agree_on_launch(store, rank, size, timeout)
        dist.init_process_group("gloo")
        return
    # Nothing serves MASTER_PORT yet: rank 0 serves it here (as torch's env:// would) without waiting for the others
    # to connect (torch's store would wait for WORLD_SIZE of them, its own, for 30 minutes), and torch uses it.
    store = dist.TCPStore(addr, int(port), is_master=rank == 0, wait_for_workers=False, timeout=timeout,
                          multi_tenant=True)
    _agree_on_launch(store, rank, size, timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("default_pg", store), rank=rank, world_size=size,
                            timeout=timeout)


def _agree_on_launch(store, rank, size, timeout):
    """Note [A launch's ranks agree]. Before torch's rendezvous, which would wait 30 minutes (its gloo connection,
    or the store of env:// counting WORLD_SIZE connections) for a rank that a disagreeing launch never starts, each
    rank that strata.torch initialises posts its WORLD_SIZE under strata/launch/<TORCHELASTIC_RUN_ID>/<restart>/ in
    the launch's store and claims its RANK (an ADD). Rank 0 reads every other rank's WORLD_SIZE as it arrives,
    every other rank reads rank 0's: a rank started with another WORLD_SIZE, or a RANK started twice, fails the
    ranks that see it at once (about 20 ms), naming the ranks, their sizes and the fix (docs/decisions/0048). A rank
    that never starts cannot be told from a late one: it is named at torch's own timeout (default_pg_timeout)."""
    import time
    prefix = "strata/launch/{}/{}/".format(os.environ.get("TORCHELASTIC_RUN_ID", "none"),
                                            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if store.add(f"{prefix}claim/{rank}", 1) != 1:
        raise RuntimeError(f"strata: RANK {rank} was started twice: another process of this job, at the same "
                           f"MASTER_ADDR:MASTER_PORT, has it; give the job's WORLD_SIZE processes the ranks 0 to "
                           f"{size - 1}, one each")
    store.set(f"{prefix}size/{rank}", str(size))
    waiting = list(range(1, size)) if rank == 0 else [0]
    deadline = time.monotonic() + timeout.total_seconds()
    while waiting:
        for r in [r for r in waiting if store.check([f"{prefix}size/{r}"])]:
            theirs = int(store.get(f"{prefix}size/{r}"))
            if theirs != size:
                raise RuntimeError(
                    f"strata: the job's ranks disagree on its size: rank {r} was started with WORLD_SIZE {theirs}, "
                    f"this rank ({rank}) with {size}. Start every rank of a job with the same WORLD_SIZE: under "
                    f"torchrun, the same --nnodes and --nproc-per-node on every node; by hand (env://), the same "
                    f"WORLD_SIZE for every process")
            waiting.remove(r)
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(f"strata: rank(s) {', '.join(map(str, waiting))} of {size} did not start within "
                               f"{timeout} (rank {rank} waited at MASTER_ADDR:MASTER_PORT {store.host}:{store.port})")
        if waiting:
            time.sleep(0.02)


def _torch_world(group):
    """A process group's world; the front end's collectives on a gloo group of its ranks (not the script's)."""
    import torch.distributed as dist
    if not dist.is_initialized():
        raise RuntimeError("strata: st.shard(..., process_group=...) was given a process group, but "
                           "torch.distributed is not initialised (call torch.distributed.init_process_group first)")
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError("strata: process_group is not a group this rank belongs to")
    ranks = dist.get_process_group_ranks(group)
    if dist.get_backend(group) == "gloo":
        host = dist.split_group(group, [list(range(len(ranks)))])
    else:  # NCCL, say: gloo beside it, over the same ranks (only they call this)
        host = dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=True)
    return _World("torch", group, host)


def mesh_group(mesh, config):
    """The process group of a torch DeviceMesh given to st.shard (docs/decisions/0039, "A mesh"). 1-D: the mesh's
    group. 2-D (replicate, shard): a group over all of its ranks, and the config's shard_group_size set to the
    shard dimension's size, so that each row of the mesh is one of the engine's shard groups. Those are
    consecutive ranks of the group (runtime/comm/shard_groups.h, ContiguousGroups), so the rows must be too."""
    import torch.distributed as dist
    if mesh.ndim == 1:
        return mesh.get_group()
    if mesh.ndim != 2:
        raise ValueError(f"strata: device_mesh has {mesh.ndim} dimensions; give a 1-D mesh (its ranks share the "
                         f"model) or a 2-D one (replicate, shard): hybrid sharding")
    rows = mesh.mesh.tolist()
    ranks = [r for row in rows for r in row]
    if ranks != sorted(ranks):
        raise ValueError(f"strata: a 2-D device_mesh's rows are its shard groups, and Strata's are consecutive "
                         f"ranks in order; this mesh is {rows}: lay it out as torch.arange(n).view(replicas, "
                         f"shard_size) does (init_device_mesh's layout)")
    zero = config.setdefault("zero_optimization", {})
    size = mesh.size(1)
    if zero.get("shard_group_size", size) != size:
        raise ValueError(f"strata: the config's zero_optimization.shard_group_size is "
                         f"{zero['shard_group_size']!r}, but the device_mesh's shard dimension has {size} ranks; "
                         f"leave shard_group_size out (the mesh sets it)")
    zero["shard_group_size"] = size
    group = getattr(mesh, "_strata_group", None)
    if group is None:  # one group per mesh: every st.shard of a process names the same one
        if ranks == list(range(dist.get_world_size())):
            group = dist.group.WORLD
        else:
            group = dist.new_group(ranks=ranks, use_local_synchronization=True)
        mesh._strata_group = group
    return group


def bind(process_group=None):
    """The process's world (collective the first time): `process_group`'s, else the launch's. A later call with
    another group is refused: one communicator serves every engine of a process."""
    global _world
    if _world is None:
        launch = _torchrun()
        watched = launch is not None and launch[1] > 1
        if watched and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            _watch_torchrun_job()  # the agent's store already serves: before torch's rendezvous (decision 0039)
        _world = _default_world() if process_group is None else _torch_world(process_group)
        if _world.size() > 1:
            _abort_on_uncaught_exception()
        if watched and _world.kind == "torch":
            _watch_torchrun_job()  # else only once init_process_group's rank 0 serves the store (at once if started)
    elif process_group is not None and process_group is not _world.group:
        raise RuntimeError("strata: this process's engines already run on another set of ranks (an earlier "
                           "st.shard, or the launch's); every st.shard of a process must name the same "
                           "process_group")
    return _world


def watch_from_import():
    """Note [The watch from import]. Under torchrun with the agent's store (TORCHELASTIC_USE_AGENT_STORE=True,
    torchrun's default: it serves before any worker starts) and more than one rank, `import strata.torch` starts
    the job watch (docs/decisions/0039, 0048), not the first st.shard: a rank that dies after its import but before
    its first call into strata.torch (a script that reads its data first, or initialises torch.distributed itself
    and dies there) is posted by its own watch, and the other ranks, waiting for it in st.shard, in torch's
    rendezvous or in the script's own collectives, end within seconds naming it. Not in a process that Python's
    multiprocessing started (a data loader's spawned worker imports the script's modules again, with the rank's
    environment, but is not the rank). Without the agent's store nothing serves MASTER_PORT before torch's rank 0
    does, so the watch starts at the first st.shard, after init_process_group, as before."""
    launch = _torchrun()
    if launch is None or launch[1] <= 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    import multiprocessing
    # A spawned child imports the script's main module before its bootstrap sets parent_process(), but after
    # multiprocessing names it ("SpawnProcess-1", ...).
    if multiprocessing.parent_process() is not None or multiprocessing.current_process().name != "MainProcess":
        return
    _watch_torchrun_job()


def _watch_torchrun_job():
    """Failure notices across torchrun's nodes (docs/decisions/0039): a rank of the job that dies, on any node,
    ends every rank within seconds, naming it (strata_comm_watch_torchrun). Without it a job still runs, and a
    dead rank on another node is named at the next collective with it, so a failure to start is a warning (once:
    bind tries before torch's rendezvous and again after it)."""
    global _watch_tried
    if _watch_tried:
        return
    _watch_tried = True
    status = _capi.lib.strata_comm_watch_torchrun()
    if status != 0:
        print(f"{who()}: warning: no failure notices across torchrun's nodes: "
              f"{_capi.lib.strata_last_error().decode(errors='replace')}", file=sys.stderr, flush=True)


def strata_comm(cuda=False, timeout_ms=0, process_group=None):
    """The process's strata_comm* (made on first use; collective then). mpi: MPI's world (on CUDA the engine
    bootstraps NCCL over it); torch: a foreign communicator over gloo for a host engine, torchrun's NCCL world
    for a CUDA one; single: one in-process rank."""
    global _comm, _cuda
    w = bind(process_group)
    if _comm is not None:
        if w.kind == "torch" and cuda != _cuda:
            raise RuntimeError("strata: this process's engines already run on the "
                               f"{'NCCL' if _cuda else 'gloo'} world; a host and a CUDA model cannot both be "
                               f"sharded over torch.distributed")
        return _comm
    out = ctypes.c_void_p()
    if w.kind == "mpi":
        _capi.check(_capi.lib.strata_comm_create_mpi(world().py2f(), ctypes.byref(out)))
    elif w.kind == "single":
        _capi.check(_capi.lib.strata_comm_create_in_process(1, ctypes.byref(out)))
    elif cuda:
        import torch.distributed as dist
        if _torchrun() is None or w.size() != dist.get_world_size():
            raise RuntimeError("strata: a CUDA engine's ranks are torchrun's whole world (NCCL, bootstrapped by "
                               "strata_comm_create_torchrun): launch with torchrun and give no process_group, or "
                               "put the model on the host")
        _capi.check(_capi.lib.strata_comm_create_torchrun(int(timeout_ms), ctypes.byref(out)))
    else:
        from strata import _torch_comm
        import torch.distributed.distributed_c10d as c10d
        out = _torch_comm.create(w.host_group, c10d._get_default_store(), timeout_ms)
    _comm, _cuda = out, cuda
    return _comm


def dev_shm_full(status):
    """Whether strata_engine_create's failure `status` (its error the last one) is the shared-memory communicator's
    want of /dev/shm, under torchrun's "auto" choice (strata._torch_comm.dev_shm_full)."""
    if _comm is None or _cuda or bind().kind != "torch":
        return False
    from strata import _torch_comm
    return _torch_comm.dev_shm_full(status, _capi.lib.strata_last_error().decode(errors="replace"))


def host_comm_on_gloo(timeout_ms=0, process_group=None):
    """The process's host communicator made again over gloo (collective): an engine could not make its
    shared-memory communicators (Note [The host transport under torchrun]). The shared-memory one stays alive,
    unused, for the engines made on it."""
    global _comm
    from strata import _torch_comm
    import torch.distributed.distributed_c10d as c10d
    w = bind(process_group)
    _retired.append(_comm)
    _comm = _torch_comm.create(w.host_group, c10d._get_default_store(), timeout_ms, "gloo")
    return _comm


_retired = []  # host communicators replaced by host_comm_on_gloo


def broadcast(t, root=0):
    """Rank `root`'s values of a contiguous CPU tensor into every rank's (collective)."""
    w = bind()
    if w.kind == "mpi":
        world().Bcast(t.numpy(), root=root)
    elif w.kind == "torch" and w.size() > 1:
        import torch.distributed as dist
        dist.broadcast(t, group=w.host_group, group_src=root)


def broadcast_from_0(t):
    """Rank 0's values of a contiguous CPU tensor into every rank's (collective)."""
    broadcast(t, 0)


def broadcast_object(obj, root=0):
    """Rank `root`'s picklable `obj` on every rank (collective; small host values: plans, verdicts)."""
    w = bind()
    if w.kind == "mpi":
        return world().bcast(obj, root=root)
    if w.size() == 1:
        return obj
    import torch.distributed as dist
    box = [obj]
    dist.broadcast_object_list(box, group=w.host_group, group_src=root)
    return box[0]


def allgather_object(obj):
    """Every rank's picklable `obj`, in rank order, on every rank (collective)."""
    w = bind()
    if w.kind == "mpi":
        return world().allgather(obj)
    if w.size() == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * w.size()
    dist.all_gather_object(out, obj, group=w.host_group)
    return out


def all_reduce_sum(t):
    """In place: the sum over ranks of a contiguous CPU float64 tensor (collective). Over torch.distributed
    every rank's values are gathered and summed pairwise, (r0 + r1) + (r2 + r3), as MPI's all-reduce of a few
    values does (strata._torch_comm), so that both launches give the same bits."""
    w = bind()
    if w.kind == "mpi":
        world().Allreduce(_mpi().IN_PLACE, t.numpy(), op=_mpi().SUM)
    elif w.kind == "torch" and w.size() > 1:
        import torch
        import torch.distributed as dist
        from strata._torch_comm import ordered_sum
        flat = t.reshape(-1).contiguous()
        every = torch.empty(w.size() * flat.numel(), dtype=t.dtype)
        dist.all_gather_into_tensor(every, flat, group=w.host_group)
        t.copy_(ordered_sum(every.view(w.size(), -1), direct=False).view(t.shape))


def _abort_on_uncaught_exception():
    """An exception that ends one rank's script ends the job at once (after the traceback), instead of leaving
    the other ranks in a collective until strata.collective_timeout_ms."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        abort(f"rank {rank()}: uncaught {kind.__name__}: {value}")

    sys.excepthook = hook


# Note [Dropped engines]. An engine the script drops without close() (a sweep making an engine per trial, a test
# suite) is destroyed, its memory, threads and communicators given back, instead of living until the exit. Two
# parts. (1) Collectable: nothing that torch holds from C++ (a parameter's hooks: the cycle collector does not look
# inside a tensor that C++ also holds) may hold the engine; the post-accumulate-grad hooks hold their tracker
# weakly (_hooks), so the engine, its model and its tracker form a cycle the collector frees once the script holds
# neither the engine nor the model (whose forward is the engine's). (2) Destroyed at a safe point: the collector
# runs on whichever thread allocates, also Strata's caller threads inside a torch.distributed callback (which may
# hold _torch_comm's locks), so the finalizer only appends the handle to _dropped (a deque: atomic, no lock), and
# the next st.shard (on the script's thread, before anything of its own) or the exit destroys it.
# strata_engine_destroy is not collective (strata.h): it waits for the engine's own asynchronous save (whose
# collectives run on the saver's thread and communicator, whatever the script's thread does), drains the engine's
# streams and frees its communicators, which issues nothing on a communicator another engine or the root uses:
# under MPI each is an MPI_Comm_free (local in Open MPI: the next communicator's context id is agreed at its
# creation); under torchrun each gloo group goes to the idle pool (Note [Idle gloo groups] in strata._torch_comm),
# which a later dup takes back only once every member gave it back whole, agreed in that dup's own all-gather. So
# the ranks may destroy the same engine at different points of their common sequence of collectives, as they do
# when the collector frees it at different times (tests/python/test_dropped_engines.py, also a creation refused on
# every rank, whose half-made engine each rank drops at a different point). A CUDA engine's NCCL communicators are
# finalised (ncclCommFinalize, which may wait for the peers): a dropped one waits for the exit, as before. A dropped
# engine is destroyed without its before-close callbacks, so a front end with one still due holds the engine until
# it has run (strata.deepspeed's `latest` of an asynchronous save: _latest_due).
def track(engine, cuda=False):
    """Called once the engine has its handle: closed at exit if still alive, destroyed after it is dropped without
    close() (Note [Dropped engines]). Returns the finalizer, which close() detaches."""
    _engines.add(engine)
    finalizer = weakref.finalize(engine, (_dropped_cuda if cuda else _dropped).append, engine.handle.value)
    finalizer.atexit = False  # _shutdown closes the engines still alive and destroys the dropped ones
    return finalizer


def destroy_dropped(at_exit=False):
    """Destroys, on the calling thread, the engines collected without close() (Note [Dropped engines]); the CUDA
    ones only `at_exit`."""
    for queue in (_dropped, _dropped_cuda) if at_exit else (_dropped,):
        while queue:
            _capi.lib.strata_engine_destroy(ctypes.c_void_p(queue.popleft()))


@atexit.register
def _shutdown():
    """At interpreter exit. A rank that leaves in the middle of a step (sys.exit, or a script that returns
    early) while its peers go on would leave them in a collective until its deadline: it ends the job
    instead, naming why. Otherwise the engines are closed and the communicator destroyed (and the default
    process group, when Strata initialised it)."""
    global _comm
    if _comm is not None and world_size() > 1:
        for e in list(_engines):
            why = e.mid_step()
            if why is not None:
                sys.stderr.flush()
                abort(f"rank {rank()}: exited in the middle of a step ({why})")
    destroy_dropped(at_exit=True)
    for e in list(_engines):
        e.close()
    if _comm is not None:
        _capi.lib.strata_comm_destroy(_comm)
        _comm = None
    if _world is not None and _world.owns_default:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def rank():
    """This rank in the job's world (before any st.shard: the launch's)."""
    if _world is not None:
        return _world.rank()
    if mpi_launch(os.environ):
        return world().Get_rank()
    t = _torchrun()
    return 0 if t is None else t[0]


def world_size():
    if _world is not None:
        return _world.size()
    if mpi_launch(os.environ):
        return world().Get_size()
    t = _torchrun()
    return 1 if t is None else t[1]


def abort(reason):
    """Ends the whole job from this rank so that the others do not wait for a deadline: MPI_Abort in an MPI job;
    otherwise the failure notice to the peers of Strata's communicator (strata_comm_abort), then exit 1 (torchrun's
    agent stops the other ranks)."""
    if _world is not None and _world.kind == "mpi":
        if _comm is not None:
            _capi.lib.strata_comm_abort(_comm, reason.encode())  # logs the reason, MPI_Abort: does not return
        world().Abort(1)
    print(f"{who()}: aborting: {reason}", file=sys.stderr, flush=True)
    if _comm is not None and not _cuda:  # a NCCL world is left to the exit (torchrun's agent ends the job)
        _capi.lib.strata_comm_abort(_comm, reason.encode())
    os._exit(1)
