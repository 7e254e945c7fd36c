"""A torch.distributed process group as Strata's communicator: strata_comm_create_foreign's callbacks over gloo
(docs/decisions/0033-foreign-communicators.md).

Strata calls each communicator's callbacks on a thread of its own (never the thread that runs the script): ctypes
takes the GIL for the callback, and torch's collectives let it go while they wait, so the script's thread runs
meanwhile. Each communicator Strata asks for (the engine's gather, reduce and step streams, the splits of hybrid
sharding) is a gloo group of its own, split off its parent with torch.distributed.split_group, so that the
collectives of two threads never share a group. The groups' timeout is Strata's collective timeout, so a gloo
call Strata gave up on ends at about the same time.

The sums are the MPI back-end's, term for term, so that a job gives the same bits under torchrun as under mpirun:
a block of 1 MiB or more (up to 8 ranks) is summed in rank order, as mpi_communicator.cc's direct reduce-scatter
does (Note [Reduce-scatter over point to point]); a smaller one pairwise, (r0 + r1) + (r2 + r3), the binomial
tree of Open MPI's collectives (libnbc) under it. Each rank's block arrives by all_to_all_single, is summed here,
and an all-reduce gathers the summed blocks again (all_gather_into_tensor). bf16 and fp16 add in fp32 and round
after each addition, as the engine's kernels do.
"""
import atexit
import ctypes
import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from strata import _capi
from strata._log import who

_TORCH_DTYPE = {_capi.DTYPE_F32: torch.float32, _capi.DTYPE_BF16: torch.bfloat16, _capi.DTYPE_F16: torch.float16}
_DIRECT_BYTES = 1 << 20  # kReduceChunkBytes of runtime/comm/mpi_communicator.cc
_MAX_DIRECT_RANKS = 8    # kMaxDirectRanks
_SMALL_ALL_REDUCE_BYTES = 1 << 16  # below it an all-reduce gathers every rank's whole buffer (one collective)

# The callbacks and groups Strata holds, by id(user): kept alive until Strata calls destroy.
_live = {}

# Note [Idle gloo groups]. Every communicator Strata asks for is a gloo group of its own (a dup or split), and
# every engine asks for several (its streams) and gives them back when it closes. Making a gloo group is not free:
# torch's split_group connects a new TCPStore client and gloo's pairs, about 10 ms, and on this torch (2.15) one
# split in every 13 to 15 waited 5 s in that connection, on every rank alike, so a process that made an engine per
# test spent 5 s every few engines (docs/perf-notes.md, "The strata.torch suite under torchrun"). A group Strata
# gives back whole therefore waits here, by (its global ranks, its timeout), instead of being destroyed, and the next
# dup or split over the same ranks takes it back. Which groups a rank holds depends on when its engines were
# collected, so the choice is collective: the members of the parent all-gather the names of their idle groups (a
# gloo group's name is the same on its every member) with the number of calls each carried, and each part of the
# split takes the first one that all of its members hold with the same count; when any part has none, every rank
# splits as before. The count keeps out a group on which one rank completed a call its peer never made (a
# broadcast's root can finish its send alone): the peer's next call would read it. A group on which a callback
# failed is destroyed, never kept. A call Strata abandoned (Note [Foreign calls]) that later returns without error
# was joined by its peers, and is counted as any other.
_idle = {}  # (global ranks, timeout_ms) -> [(group_name, calls), ...] in the order given back
_idle_groups = {}  # group_name -> the idle group
_idle_lock = threading.Lock()  # destroy runs on the thread of whichever communicator Strata ends

# Note [Calls in flight at exit]. A callback runs on a thread of Strata's (a ctypes callback: it holds a Python
# thread state), mostly inside a gloo collective that let the GIL go. A call Strata abandoned (Note [Foreign calls]:
# a peer diverged or failed) stays there until its peers join it, their process ends (gloo then fails it: the
# connection closed) or the group's timeout. If the interpreter is finalizing when it returns, taking the GIL back
# ends the thread with pthread_exit inside torch's gil_scoped_release destructor, which is noexcept: std::terminate,
# and the rank dies with SIGABRT after its script ended well ("terminate called without an active exception": seen
# with tests/python/test_divergence.py alone under torchrun). So at exit, before finalization, the process waits for
# the callbacks in flight to return, at most the longest timeout of its groups (after which gloo fails them), saying
# so on stderr when that takes more than a second.
_in_flight = 0
_in_flight_cv = threading.Condition()


def _wait_calls_in_flight():
    timeout_s = max([e.timeout_ms or 60000 for e, _ in list(_live.values())] + [60000]) / 1000 + 5
    start = time.monotonic()
    told = False
    with _in_flight_cv:
        while _in_flight > 0:
            waited = time.monotonic() - start
            if waited >= timeout_s:
                print(f"{who()}: exiting with {_in_flight} torch.distributed call(s) of Strata's still in flight after "
                      f"{waited:.0f} s", file=sys.stderr, flush=True)
                return
            if waited >= 1 and not told:
                print(f"{who()}: waiting for {_in_flight} torch.distributed call(s) Strata left in flight (a failed or "
                      f"closed engine's) to end before exiting, at most {timeout_s:.0f} s", file=sys.stderr, flush=True)
                told = True
            _in_flight_cv.wait(min(0.1, timeout_s - waited))


atexit.register(_wait_calls_in_flight)


def view(ptr, count, dtype):
    """A tensor over `count` elements of strata_dtype `dtype` at address `ptr` (no copy)."""
    t = _TORCH_DTYPE[dtype]
    if count == 0:
        return torch.empty(0, dtype=t)
    return torch.frombuffer((ctypes.c_char * (count * element_size(dtype))).from_address(ptr), dtype=t)


def element_size(dtype):
    return 4 if dtype == _capi.DTYPE_F32 else 2


def ordered_sum(blocks, direct):
    """The sum over the first dimension of `blocks` ([ranks, n]) in the MPI back-end's order: rank order when
    `direct`, else the pairwise tree (r0 + r1) + (r2 + r3), ..."""
    n = blocks.shape[0]
    if direct:
        acc = blocks[0].clone()
        for q in range(1, n):
            acc.add_(blocks[q])
        return acc
    parts = list(blocks)
    step = 1
    while step < n:
        for i in range(0, n - step, 2 * step):
            parts[i] = parts[i] + parts[i + step]
        step *= 2
    return parts[0].clone() if n == 1 else parts[0]


def _direct(block_elems, dtype, ranks):
    """Whether the MPI back-end sums a block of `block_elems` in rank order (its direct exchange)."""
    return block_elems * element_size(dtype) >= _DIRECT_BYTES and ranks <= _MAX_DIRECT_RANKS


def _status_of(error):
    """A gloo failure's strata_status: a timeout or a lost peer is DEADLINE_EXCEEDED (strata.h: Strata then
    names the ranks that did not respond), anything else INTERNAL."""
    text = str(error).lower()
    lost = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe", "connection refused")
    return _capi.ERR_DEADLINE_EXCEEDED if any(w in text for w in lost) else _capi.ERR_INTERNAL


class Endpoint:
    """One rank's strata_foreign_comm over `group` (a gloo process group)."""

    def __init__(self, group, store, owned, timeout_ms=None):
        self.group = group
        self.store = store
        self.owned = owned  # a group split off for Strata: kept idle or destroyed when Strata is done with it
        self.timeout_ms = timeout_ms  # an owned group's: the key of Note [Idle gloo groups], with its ranks
        self.failed = False  # a callback raised: the group is not kept (Note [Idle gloo groups])
        self.calls = 0  # the collective callbacks completed on the group (Note [Idle gloo groups])
        self.rank = group.rank()
        self.size = group.size()

    # ---- the collectives (strata.h's layouts) ----
    def all_gather(self, send, recv, count, dtype):
        out = view(recv, self.size * count, dtype)
        src = view(send, count, dtype)
        if (send or 0) == (recv or 0) + self.rank * count * element_size(dtype):  # in place: no aliased input
            src = src.clone()
        dist.all_gather_into_tensor(out, src, group=self.group)

    def reduce_scatter(self, send, recv, count, dtype):
        """A chunk of at most 1 MiB of every block at a time (as the MPI back-end's direct exchange), so the
        temporaries are 2 x size MiB, not the send buffer's size; the chunks do not change any element's sum."""
        n, out = self.size, view(recv, count, dtype)
        src = view(send, n * count, dtype).view(n, count)
        direct = _direct(count, dtype, n)
        chunk = max(_DIRECT_BYTES // element_size(dtype), 1)
        for first in range(0, count, chunk):
            part = src[:, first:first + chunk].contiguous()  # row q: the chunk of rank q's block
            blocks = torch.empty_like(part)
            dist.all_to_all_single(blocks, part, group=self.group)  # row q: rank q's chunk of this rank's block
            out[first:first + chunk].copy_(ordered_sum(blocks, direct))

    def all_reduce(self, send, recv, count, dtype):
        n = self.size
        src, out = view(send, count, dtype), view(recv, count, dtype)
        block = -(-count // n)
        direct = _direct(block, dtype, n)  # mpi_communicator.cc: Note [All-reduce over point to point]
        if count * element_size(dtype) * n <= _SMALL_ALL_REDUCE_BYTES:
            every = torch.empty(n * count, dtype=src.dtype)
            dist.all_gather_into_tensor(every, src.clone(), group=self.group)
            out.copy_(ordered_sum(every.view(n, count), direct))
            return
        padded = torch.zeros(n * block, dtype=src.dtype)
        padded[:count] = src
        blocks = torch.empty_like(padded)
        dist.all_to_all_single(blocks, padded, group=self.group)
        mine = ordered_sum(blocks.view(n, block), direct)
        full = torch.empty_like(padded)
        dist.all_gather_into_tensor(full, mine, group=self.group)
        out.copy_(full[:count])

    def broadcast(self, buf, count, dtype, root):
        dist.broadcast(view(buf, count, dtype), group=self.group, group_src=root)

    def barrier(self):
        dist.barrier(group=self.group)

    # ---- new communicators ----
    def dup(self, timeout_ms, reuse=True):
        """A group over the same ranks; `reuse`: possibly an idle one (Note [Idle gloo groups])."""
        return self._split([list(range(self.size))], timeout_ms, reuse)

    def split(self, colors, keys, timeout_ms):
        """strata.h's split: every rank's color and key; the groups by color, ranked by (key, rank)."""
        parts = {}
        for r in range(self.size):
            parts.setdefault(colors[r], []).append(r)
        ranks = [sorted(parts[c], key=lambda r: (keys[r], r)) for c in sorted(parts)]
        return self._split(ranks, timeout_ms)

    def _split(self, ranks, timeout_ms, reuse=True):
        """`ranks`: the parts of the split, ranks of this group. An idle group over each part when `reuse` and every
        member of every part holds one (Note [Idle gloo groups]), else a split of this group."""
        if not reuse:
            g = dist.split_group(self.group, ranks, timeout=datetime.timedelta(milliseconds=timeout_ms))
            return Endpoint(g, self.store, owned=True, timeout_ms=timeout_ms)
        world = dist.get_process_group_ranks(self.group)
        keys = [(tuple(world[r] for r in part), timeout_ms) for part in ranks]
        mine = next(i for i, part in enumerate(ranks) if self.rank in part)
        with _idle_lock:  # not those torch destroyed meanwhile (destroy_process_group() of every group)
            held = [h for h in _idle.get(keys[mine], ()) if _idle_groups[h[0]] in dist.distributed_c10d._world.pg_map]
        every = [None] * self.size
        dist.all_gather_object(every, held, group=self.group)
        chosen = []
        for part in ranks:
            common = [h for h in every[part[0]] if all(h in every[r] for r in part)]
            chosen.append(common[0] if common else None)
        if all(h is not None for h in chosen):
            with _idle_lock:
                _idle[keys[mine]].remove(chosen[mine])
                g = _idle_groups.pop(chosen[mine][0])
            calls = chosen[mine][1]
        else:
            g = dist.split_group(self.group, ranks, timeout=datetime.timedelta(milliseconds=timeout_ms))
            calls = 0
        made = Endpoint(g, self.store, owned=True, timeout_ms=timeout_ms)
        made.calls = calls
        return made

    # ---- the store ----
    def kv_set(self, key, value):
        self.store.set(key, value)

    def kv_get(self, key):
        return self.store.get(key) if self.store.check([key]) else None

    def destroy(self):
        """Strata is done with this group: a group split off for it waits for the next dup or split over its ranks
        (Note [Idle gloo groups]), or goes when a call on it failed (not while the script's own goes on)."""
        if self.owned and not self.failed and dist.is_initialized():
            key = (tuple(dist.get_process_group_ranks(self.group)), self.timeout_ms)
            with _idle_lock:
                _idle.setdefault(key, []).append((self.group.group_name, self.calls))
                _idle_groups[self.group.group_name] = self.group
            return
        if self.owned and dist.is_initialized():
            try:
                dist.destroy_process_group(self.group)
            except ValueError:  # already gone: the script destroyed torch.distributed's groups first
                pass


def _guard(fn, endpoint, collective):
    """A callback: runs `fn`, or writes its exception into Strata's error buffer (no exception crosses C) and marks
    `endpoint` failed. A `collective` one that completes is counted (Note [Idle gloo groups])."""

    def call(*args):
        global _in_flight
        error, capacity = args[-2], args[-1]
        with _in_flight_cv:
            _in_flight += 1
        try:
            fn(*args[:-2])
            if collective:
                endpoint.calls += 1
            return 0
        except BaseException as e:  # noqa: BLE001 (the message goes back to Strata)
            endpoint.failed = True
            text = f"{type(e).__name__}: {e}".encode(errors="replace")[:max(capacity - 1, 0)]
            ctypes.memmove(error, text + b"\0", len(text) + 1)
            return _status_of(e)
        finally:
            with _in_flight_cv:  # Note [Calls in flight at exit]
                _in_flight -= 1
                _in_flight_cv.notify_all()

    return call


def make(endpoint):
    """A strata_foreign_comm (_capi.ForeignComm) over `endpoint`; its callbacks live until Strata destroys it."""
    key = id(endpoint)
    fc = _capi.ForeignComm.new(rank=endpoint.rank, size=endpoint.size, user=key)
    prototypes = dict(_capi.ForeignComm._fields_)

    def adopt(made, out):
        out[0] = make(made)

    def destroy(_user):
        if _live.pop(key, None) is not None:
            try:
                endpoint.destroy()
            except Exception as e:  # noqa: BLE001 (nothing to report it to; the group is gone either way)
                print(f"{who()}: destroying a process group Strata used failed: {e}", file=sys.stderr)

    callbacks = {
        "all_gather": lambda u, s, r, n, d: endpoint.all_gather(s, r, n, d),
        "reduce_scatter": lambda u, s, r, n, d: endpoint.reduce_scatter(s, r, n, d),
        "all_reduce": lambda u, s, r, n, d: endpoint.all_reduce(s, r, n, d),
        "broadcast": lambda u, b, n, d, root: endpoint.broadcast(b, n, d, root),
        "barrier": lambda u: endpoint.barrier(),
        "dup": lambda u, t, out: adopt(endpoint.dup(t), out),
        "split": lambda u, c, k, t, out: adopt(endpoint.split(c[:endpoint.size], k[:endpoint.size], t), out),
        "kv_set": lambda u, key_, v, n: endpoint.kv_set(key_.decode(), ctypes.string_at(v, n)),
        "kv_get": lambda u, key_, v, cap, n: _kv_get(endpoint, key_.decode(), v, cap, n),
    }
    held = []  # the ctypes callbacks: C holds their addresses until destroy
    for name, fn in callbacks.items():
        held.append(prototypes[name](_guard(fn, endpoint, collective=not name.startswith("kv_"))))
        setattr(fc, name, held[-1])
    held.append(prototypes["destroy"](destroy))
    fc.destroy = held[-1]
    _live[key] = (endpoint, held)
    return fc


def _kv_get(endpoint, key, value, capacity, out_length):
    got = endpoint.kv_get(key)
    if got is None:
        out_length[0] = -1
        return
    ctypes.memmove(value, got, min(capacity, len(got)))
    out_length[0] = len(got)


def create(group, store, timeout_ms, choice=None):
    """Collective over `group` (gloo): a strata_comm* whose collectives give up after `timeout_ms` (<= 0: 60 s), as
    Strata's own waits do: over shared memory when every rank is on this host (Note [The host transport under
    torchrun]), else over a gloo group split off `group` for Strata alone. `choice`: "auto", "shm" or "gloo"
    (None: STRATA_HOST_TRANSPORT's, else "auto")."""
    timeout_ms = int(timeout_ms) if timeout_ms and timeout_ms > 0 else 60000
    # Made once per process, on the script's thread: no idle group to take back, and no all-gather on the script's
    # group before it (a peer that dies here leaves this rank in torch's split, for the job watch to end and name).
    own = Endpoint(group, store, owned=False).dup(timeout_ms, reuse=False)
    out = ctypes.c_void_p()
    _capi.check(_capi.lib.strata_comm_create_foreign(ctypes.byref(make(own)), timeout_ms, ctypes.byref(out)))
    return _host_transport(out, own.size, timeout_ms, choice)


# Note [The host transport under torchrun]. gloo goes through loopback TCP even between the ranks of one host, 4-5x
# slower than the MPI back-end's shared memory there (docs/perf-notes.md). So when the ranks are all on this host,
# the engine's communicator is the shared-memory one (strata_comm_create_shm, decision 0053), set up over the gloo
# one, which is then given back: its collectives have the MPI back-end's sums, so the bits stay those of mpirun.
# Ranks on several hosts keep gloo (every rank learns it from the same exchange, so they all keep it), and so does
# a rank that cannot use /dev/shm (a warning says why). STRATA_HOST_TRANSPORT=gloo keeps gloo, for comparison;
# =shm makes any failure to set up shared memory an error.
#
# The engine's own communicators are Dups and Splits of that one, each a segment of its own (2 x size MiB): a
# /dev/shm that holds the first may not hold an engine's (Docker's 64 MiB at 8 ranks holds the first and two of an
# engine's). Every rank fails such a Dup alike (AgreeOnSegment), so under "auto" strata.torch then makes the
# process's communicator a gloo one, with the warning, and makes the engine again on it (dev_shm_full, _engine).
_HOST_TRANSPORTS = ("auto", "shm", "gloo")
transport = None  # what the engine's communicator went over: "shm" or "gloo" (set by create)


def _host_transport(foreign, size, timeout_ms, choice):
    global transport
    choice = choice or os.environ.get("STRATA_HOST_TRANSPORT", "auto")
    if choice not in _HOST_TRANSPORTS:
        _capi.check(_capi.lib.strata_comm_destroy(foreign))
        raise ValueError(f"STRATA_HOST_TRANSPORT={choice!r}: expected one of {', '.join(_HOST_TRANSPORTS)}")
    if choice == "gloo" or size == 1:
        transport = "gloo"
        return foreign
    shm = ctypes.c_void_p()
    status = _capi.lib.strata_comm_create_shm(foreign, timeout_ms, ctypes.byref(shm))
    if status == 0:
        _capi.check(_capi.lib.strata_comm_destroy(foreign))
        transport = "shm"
        return shm
    error = _capi.lib.strata_last_error().decode(errors="replace")
    if choice == "auto" and status == _capi.ERR_FAILED_PRECONDITION:
        if "needs every rank on one host" not in error:
            _warn_gloo(error)
        transport = "gloo"
        return foreign
    _capi.check(_capi.lib.strata_comm_destroy(foreign))
    hint = _SHM_HINT if choice == "shm" and _no_room_in_dev_shm(status, error) else ""
    raise _capi.StrataError(_capi.lib.strata_status_name(status).decode(), error + hint)


def _no_room_in_dev_shm(status, error):
    return status == _capi.ERR_FAILED_PRECONDITION and "the shared segment" in error and "in /dev/shm" in error


# What to do when STRATA_HOST_TRANSPORT=shm could not have its shared memory.
_SHM_HINT = ("; STRATA_HOST_TRANSPORT=shm asks for shared memory or an error: unset it (the default, auto, keeps gloo "
             "with a warning where /dev/shm has no room) or set STRATA_HOST_TRANSPORT=gloo")


def _warn_gloo(error):
    print(f"{who()}: warning: the host collectives stay on gloo: {error}", file=sys.stderr, flush=True)


def dev_shm_full(status, error):
    """Whether a failed strata_engine_create (`status`, `error`) on the shared-memory communicator failed for want
    of /dev/shm under "auto": then the engine is made again over gloo (Note [The host transport under torchrun]),
    and this says so. Every rank fails such a Dup alike, so every rank answers alike. Under "shm" such a failure
    raises, saying what to do."""
    choice = os.environ.get("STRATA_HOST_TRANSPORT", "auto")  # the process's communicator's (strata._comm)
    if transport != "shm" or not _no_room_in_dev_shm(status, error):
        return False
    if choice == "shm":
        raise _capi.StrataError(_capi.lib.strata_status_name(status).decode(), error + _SHM_HINT)
    if choice != "auto":
        return False
    _warn_gloo(error)
    return True
