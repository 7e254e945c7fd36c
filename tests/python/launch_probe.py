"""Run by test_launch.py under `torchrun --standalone --nproc-per-node 2` on a host without a GPU. argv[1]:
  cuda  st.shard(..., device="cuda"): strata_comm_create_torchrun's bootstrap over torchrun's store runs for real,
        then every rank fails naming the missing GPU. Rank 0 then reads both ranks' arrival keys from torchrun's
        store with torch's own TCPStore client (the keys Strata's client wrote: docs/decisions/0039).
  kill  rank 1 kills itself (SIGKILL) while rank 0 waits for it in the bootstrap.
  kill-host  the same with a host model: rank 0 waits for rank 1 in torch's split of the gloo group for Strata
        (under two torchrun nodes, test_launch.py: only the job watch ends it there, docs/decisions/0039).
  kill-rdzv  st.shard of a host model is the script's first call to Strata; rank 1 kills itself as strata.torch
        calls torch.distributed.init_process_group, so rank 0 waits for it in torch's rendezvous (gloo's
        connection of the default group), where only the job watch, started before it, ends rank 0.
  kill-import  rank 1 kills itself before it imports strata.torch (no watch of its own), rank 0 in st.shard.
  kill-before-shard  rank 1 imports strata.torch, then kills itself before its first call to it; rank 0 waits for
        it in st.shard's rendezvous (docs/decisions/0048: rank 1's watch, started at its import, posts the death).
  own-pg-kill-before, own-pg-kill-after  the script calls torch.distributed.init_process_group itself, and rank 1
        kills itself before that call (rank 0 then waits in it: torch's rendezvous, no Strata code) or after it
        (rank 0 then waits in st.shard, which splits the script's group).
  size-mismatch  rank 1 runs with WORLD_SIZE 3, rank 0 with torchrun's 2 (a launch whose ranks disagree): both
        fail in st.shard before torch's rendezvous, naming the sizes (docs/decisions/0048); each prints its failure
        and exits at once (the ranks never formed a group).
  rank-twice, rank-outside  rank 1 runs with RANK 0 (a rank started twice) or RANK 2 (outside WORLD_SIZE 2).
  rank-late  rank 1 sleeps before st.shard, rank 0 waits for it to start with torch's default_pg_timeout set to
        2 s, as a rank started by hand that never comes would be waited for at that timeout (30 minutes).
Each rank prints its failure, then meets the others (gloo) before exiting, since torchrun stops the other
ranks at the first exit and would cut their output short."""
import os
import signal
import sys
import time

import torch

if sys.argv[1] == "kill-import" and os.environ["RANK"] == "1":  # before its first line of Strata: no watch of its own
    time.sleep(2)  # the other ranks are in st.shard by now, or soon
    print(f"rank 1: killing itself before importing strata at {time.time():.3f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

_LAUNCH_EDITS = {"size-mismatch": ("WORLD_SIZE", "3"), "rank-twice": ("RANK", "0"), "rank-outside": ("RANK", "2")}
if sys.argv[1] in _LAUNCH_EDITS and os.environ["RANK"] == "1":  # as if launched so, before Strata reads it
    os.environ[_LAUNCH_EDITS[sys.argv[1]][0]] = _LAUNCH_EDITS[sys.argv[1]][1]

import strata.torch as st  # noqa: E402 (after kill-import's death)

if sys.argv[1] == "kill-before-shard" and st.rank() == 1:  # imported strata.torch, never called it
    time.sleep(2)
    print(f"rank 1: killing itself before st.shard at {time.time():.3f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[1].startswith("own-pg"):  # the script initialises torch.distributed itself, before any st.shard
    import torch.distributed as dist
    if sys.argv[1] == "own-pg-kill-before" and st.rank() == 1:
        time.sleep(2)  # rank 0 waits in the script's init_process_group by now, or soon
        print(f"rank 1: killing itself before init_process_group at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.init_process_group("gloo")
    if sys.argv[1] == "own-pg-kill-after" and st.rank() == 1:
        print(f"rank 1: killing itself after init_process_group at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[1] in ("kill-import", "kill-before-shard", "own-pg-kill-before", "own-pg-kill-after"):
    pass  # st.shard is rank 0's first call to Strata
elif sys.argv[1] in _LAUNCH_EDITS or sys.argv[1] == "rank-late":
    if sys.argv[1] == "rank-late":
        import datetime
        import torch.distributed as dist
        dist.default_pg_timeout = datetime.timedelta(seconds=2)  # the bound strata.torch waits for a rank to start
        if st.rank() == 1:
            time.sleep(600)
    print(f"rank {st.rank()}: st.shard at {time.time():.3f}", flush=True)
elif sys.argv[1] == "kill-rdzv":
    import torch.distributed as dist
    rendezvous = dist.init_process_group

    def dying_rendezvous(*args, **kwargs):
        if st.rank() == 1:
            print(f"rank 1: killing itself in torch's rendezvous at {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return rendezvous(*args, **kwargs)

    dist.init_process_group = dying_rendezvous  # what strata._comm calls when it binds torchrun's world
else:
    print(f"imported: rank {st.rank()} of {st.world_size()}, mean rank {st.all_reduce_mean(st.rank())}", flush=True)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
if sys.argv[1] in ("kill", "kill-host") and st.rank() == 1:
    print(f"rank 1: killing itself in the bootstrap at {time.time():.3f}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
try:
    st.shard(model, config={"strata": {"collective_timeout_ms": 900000}},
             device="cuda" if sys.argv[1] in ("cuda", "kill") else "cpu")
except Exception as e:  # noqa: BLE001 (printed and re-raised as an exit status)
    print(f"rank {st.rank()} failed: {type(e).__name__}: {e}", flush=True)
    if sys.argv[1] in _LAUNCH_EDITS or sys.argv[1] == "rank-late":  # the ranks never formed a group to meet on
        sys.exit(3)
    st.all_reduce_mean(0.0)
    if st.rank() == 0:
        import torch.distributed as dist
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        keys = f"strata/bootstrap/{os.environ['TORCHELASTIC_RUN_ID']}/{os.environ['TORCHELASTIC_RESTART_COUNT']}/nccl"
        for r in (0, 1):
            print(f"store: arrived/{r} = {store.get(f'{keys}/arrived/{r}')!r}", flush=True)
    st.all_reduce_mean(0.0)
    sys.exit(3)
print("sharded", flush=True)
