"""strata.torch: train an unmodified torch model sharded (ZeRO 0-3) with Strata as its memory backend.

    import strata.torch as st
    engine = st.shard(model, config="ds_config.json")   # a dict or a path: DeepSpeed-style keys
    engine = st.shard(lambda: Model(cfg), config)        # or created sharded: never whole on any rank
    loss = model(x, labels=y).loss; loss.backward(); engine.step()

Launch with `mpirun -n N python train.py`; every rank runs the same code on its own micro-batches. A model
on CUDA (or shard(..., device="cuda")) trains on the GPU of its local rank over NCCL, under mpirun or
`torchrun --nproc_per_node N train.py` (unverified on a GPU: docs/decisions/0020).
"""
import torch  # noqa: F401  (before libstrata: see strata/__init__.py)

from strata import StrataError
from strata._comm import _torchrun, all_reduce_sum, rank, world_size, world
from strata.torch._engine import Engine
from strata.torch._gathered import GatheredParameters

__all__ = ["shard", "Engine", "GatheredParameters", "rank", "world_size", "all_reduce_mean", "StrataError"]


def shard(model, config=None, unit_classes=None, **kwargs):
    """Collective. Hands `model`'s parameters to a Strata engine configured by `config` (dict or JSON path, as `strata
    train --config`) and hooks its forward. `model` may be a factory instead (a callable that builds it, e.g.
    `lambda: GPT2LMHeadModel(cfg)`, or a model class): the model is then created sharded, its construction recorded
    without values and replayed into the engine one tensor at a time, so no rank holds it whole; its initial values
    are bit for bit a plain factory()'s from rank 0's generator state, and the model is engine.model
    (docs/decisions/0034-models-created-sharded.md). Units: the modules of `unit_classes`, or by default the
    members of the model's largest nn.ModuleList; the remaining parameters form the root unit. Rank 0's parameter
    values are every rank's initial values, and rank 0's module buffers every rank's buffers (kept so by
    strata.broadcast_buffers, default true: docs/decisions/0026-buffers.md; cast to bf16 with bf16 parameters where
    model.to would). `weight_decay=callable(name, param)` says which parameters AdamW decays (default: every
    parameter, DeepSpeed's rule; with the config's "strata": {"weight_decay_1d": false}, those with 2 or more
    dimensions). A parameter with requires_grad=False is frozen (fine-tuning, adapters): gathered and checkpointed,
    never reduced or updated, no .grad and no gradient or optimizer memory. `device`: "cuda" (or "cuda:k", a
    torch.device) or "cpu"; default: where the model's parameters are. On CUDA the engine's buffers are on the GPU
    of the local rank and the parameter views are CUDA tensors over them (unverified on a GPU). Outside a forward
    the parameters are empty placeholders whose reads and writes are refused (read or edit them inside
    st.GatheredParameters), as are model.zero_grad() between a backward and engine.step() and a model.to() that
    would change their dtype or device: docs/decisions/0030-sharded-parameters-outside-a-forward.md."""
    return Engine(model, config=config, unit_classes=unit_classes, **kwargs)


def all_reduce_mean(x):
    """The mean over ranks of a number or a tensor (collective; a CUDA tensor comes back on its device)."""
    from mpi4py import MPI
    if _torchrun() is not None:  # torchrun's ranks (a CUDA model): torch.distributed's gloo
        t = torch.as_tensor(x).detach().to("cpu", torch.float64).contiguous().clone()
        all_reduce_sum(t)
        t = t / world_size()
        return t.to(x.device, x.dtype) if isinstance(x, torch.Tensor) else float(t)
    if isinstance(x, torch.Tensor):
        t = x.detach().to(torch.float64).contiguous().clone()
        world().Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.SUM)
        return (t / world_size()).to(x.dtype)
    return world().allreduce(float(x), op=MPI.SUM) / world_size()
