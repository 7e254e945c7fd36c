"""Shared by the strata.torch tests: configurations, the single-process torch reference, comparisons, and the
tests' own collectives (world()), under mpirun or torchrun."""
import os

import pytest
import torch

import strata.torch as st
from strata import _comm
from models import batches

LR, WD = 1e-3, 0.1


def config(stage, accumulation=1, clip=0.0, **extra):
    cfg = {"zero_optimization": {"stage": stage}, "gradient_accumulation_steps": accumulation,
           "gradient_clipping": clip,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD, "betas": [0.9, 0.999],
                                                     "eps": 1e-8}},
           "strata": {"optimizer_threads": 1, "collective_timeout_ms": 20000, "weight_decay_1d": False}}
    cfg.update(extra)
    return cfg


def reference_optimizer(model):
    """torch.optim.AdamW with Strata's semantics: decay on 2-D weights only (strata.weight_decay_1d false), the same
    betas, eps and lr; the tied weight is one parameter, as in the engine."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                             lr=LR, betas=(0.9, 0.999), eps=1e-8)


def reference_step(model, opt, batches_of, step, world, accumulation, clip):
    """One step of plain torch over the global batch: every rank's micro-batches, each mean loss scaled
    by 1 / (ranks x micro-batches), which is how the engine averages."""
    for m in range(accumulation):
        for r in range(world):
            x, y = batches_of(step, m, r)
            (model(x, y) / (world * accumulation)).backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad()


def train(model, engine, first, last, accumulation=1):
    """Steps first..last-1 of a sharded tiny_lm on the tests' batches (models.batches)."""
    for step in range(first, last):
        for m in range(accumulation):
            x, y = batches(step, m, st.rank())
            model(x, y).backward()
        engine.step()


def reference_train(ref, opt, first, last, accumulation=1, clip=0.0):
    """The same steps of plain torch (reference_step) over every rank's batches."""
    for step in range(first, last):
        reference_step(ref, opt, batches, step, st.world_size(), accumulation, clip)


def train_labelled(model, engine, ref, opt, batch_of, steps):
    """`steps` steps of a sharded transformers model that takes labels (model(x, labels=x).loss), and of plain
    torch `ref` with `opt` over every rank's batch_of(step, rank), each rank's loss scaled by 1 / ranks."""
    for step in range(steps):
        x = batch_of(step, st.rank())
        model(x, labels=x).loss.backward()
        engine.step()
        for r in range(st.world_size()):
            xr = batch_of(step, r)
            (ref(xr, labels=xr).loss / st.world_size()).backward()
        opt.step()
        opt.zero_grad()


def strata_step(model, engine, batches_of, step, accumulation):
    losses = []
    for m in range(accumulation):
        x, y = batches_of(step, m, st.rank())
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
    return engine.step(), losses


def rel_errors(state, ref_state):
    return {k: ((state[k] - v).norm() / v.norm()).item() for k, v in ref_state.items()}


def assert_matches(state, ref_state, tol=1e-5):
    """Every tensor of ref_state within relative L2 `tol` of state's."""
    errors = rel_errors(state, ref_state)
    worst = max(errors, key=errors.get)
    assert errors[worst] <= tol, f"{worst}: relative L2 error {errors[worst]:.3g}"


class _TorchWorld:
    """The few calls of mpi4py's COMM_WORLD that the tests make for their own comparisons (bcast, allgather,
    allreduce of a sum, Barrier, Ibarrier), over the job's torch.distributed ranks (strata._comm's gloo group), under
    torchrun."""

    def bcast(self, obj, root=0):
        return _comm.broadcast_object(obj, root)

    def allgather(self, obj):
        return _comm.allgather_object(obj)

    def allreduce(self, value):  # mpi4py's default op: the sum
        return sum(self.allgather(value))

    def _group(self):
        return _comm.bind().host_group

    def Barrier(self):  # noqa: N802 (mpi4py's name)
        if st.world_size() > 1:
            import torch.distributed as dist
            dist.barrier(group=self._group())

    def Ibarrier(self):  # noqa: N802
        class Done:
            def __init__(self, work):
                self.work = work

            def Test(self):  # noqa: N802
                return self.work is None or self.work.is_completed()

        if st.world_size() == 1:
            return Done(None)
        import torch.distributed as dist
        return Done(dist.barrier(group=self._group(), async_op=True))


def _once():
    """The suite's 1-rank run under mpirun (or plain pytest), not its other runs (tests/python/run.sh)."""
    return st.world_size() == 1 and not os.environ.get("TORCHELASTIC_RUN_ID")


# A test that starts jobs of its own (mpirun, torchrun) tests the same thing whatever job the suite itself runs in,
# so it runs once per suite: in the 1-rank mpirun run, where no other rank of the suite waits (and spins a core).
once = pytest.mark.skipif(not _once(), reason="starts jobs of its own: run once per suite, in its 1-rank mpirun run "
                          "(tests/python/run.sh)")


def world():
    """The tests' own collectives: MPI's world under mpirun (mpi4py), else the torch.distributed ranks."""
    return st.world() if _comm.mpi_launch(os.environ) else _TorchWorld()


def shared_dir(tmp_path):
    """One directory every rank sees: rank 0's pytest tmp_path."""
    return world().bcast(str(tmp_path) if st.rank() == 0 else None, root=0)


def on_rank_0(work):
    """work() on rank 0; its failure fails every rank (no rank goes on to the next collective alone)."""
    error = None
    if st.rank() == 0:
        try:
            work()
        except Exception as e:  # noqa: BLE001  (raised on every rank below)
            error = f"rank 0: {type(e).__name__}: {e}"
    error = world().bcast(error, root=0)
    assert error is None, error
