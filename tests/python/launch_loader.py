"""Run by test_launch.py under `torchrun --standalone --nproc-per-node 2`: before its st.shard, each rank starts a
worker with multiprocessing's spawn, as a torch DataLoader with multiprocessing_context="spawn" starts its workers.
The worker imports this script's modules again, strata.torch among them, with the rank's environment, then exits
with status 3. It is not the rank (Note [The watch from import]): its exit must not read as the rank's death, so
both ranks shard, outlive the job watch's 2 s grace, and exit 0."""
import multiprocessing
import os
import time

import torch

import strata.torch as st


def worker():
    os._exit(3)  # as a loader's worker that failed; strata.torch was imported with this module


if __name__ == "__main__":
    p = multiprocessing.get_context("spawn").Process(target=worker)
    p.start()
    p.join()
    print(f"rank {st.rank()}: worker exited with status {p.exitcode}", flush=True)
    st.shard(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
    time.sleep(3)  # past the watch's 2 s grace: a notice of the worker's exit would have ended this rank by now
    print(f"rank {st.rank()}: sharded, mean rank {st.all_reduce_mean(st.rank())}", flush=True)
