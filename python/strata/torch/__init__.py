"""strata.torch: train an unmodified torch model sharded (ZeRO 0-3) with Strata as its memory backend.

    import strata.torch as st
    engine = st.shard(model, config="ds_config.json")   # a dict or a path: DeepSpeed-style keys
    engine = st.shard(lambda: Model(cfg), config)        # or created sharded: never whole on any rank
    loss = model(x, labels=y).loss; loss.backward(); engine.step()

Launch with `torchrun --nproc_per_node N train.py` or `mpirun -n N python train.py`; every rank runs the same
code on its own micro-batches. Under torchrun (or on a torch.distributed process group the script passes) the
host collectives run on torch's gloo (docs/decisions/0033), under mpirun on MPI, with the same results. A model
on CUDA (or shard(..., device="cuda")) trains on the GPU of its local rank over NCCL, under mpirun or torchrun
(unverified on a GPU: docs/decisions/0020).
"""
import torch  # noqa: F401  (before libstrata: see strata/__init__.py)

from strata import StrataError
from strata import _comm
from strata._comm import all_reduce_sum, rank, world_size, world
from strata.torch._engine import Engine
from strata.torch._gathered import GatheredParameters

_comm.watch_from_import()  # Note [The watch from import]

__all__ = ["shard", "Engine", "GatheredParameters", "rank", "world_size", "all_reduce_mean", "StrataError"]


def shard(model, config=None, unit_classes=None, process_group=None, device_mesh=None, **kwargs):
    """Collective. Hands `model`'s parameters to a Strata engine configured by `config` (dict or JSON
    path, as `strata train --config`) and hooks its forward. `model` may be a factory instead (a callable that
    builds it, e.g. `lambda: GPT2LMHeadModel(cfg)`, or a model class): the model is then created sharded, its
    construction recorded without values and replayed into the engine one tensor at a time, so no rank holds it
    whole; its initial values are bit for bit a plain factory()'s from rank 0's generator state, and the model
    is engine.model (docs/decisions/0034-models-created-sharded.md). `pretrained=DIR`: a Hugging Face checkpoint
    directory loaded at creation, as engine.load_pretrained(DIR, strict=pretrained_strict) after st.shard gives
    the same values bit for bit, but a factory's random initialisation of the parameters DIR supplies is never
    computed (only the others' is: the values they get without pretrained); the load's {"missing_keys",
    "unexpected_keys"} are engine.pretrained_keys (docs/decisions/0034, "Pretrained at creation").
    Units: the modules of `unit_classes`, or by default the members of the model's largest nn.ModuleList and,
    outside them, each untied nn.Embedding or nn.Linear at least as large as the smallest of them (an untied input
    embedding and LM head: Note [Leaf units] in _units, docs/decisions/0040); the remaining parameters form the
    root unit, live for the whole pass.
    Rank 0's parameter values are every rank's initial values, and rank 0's module buffers every rank's
    buffers (kept so by strata.broadcast_buffers, default true: docs/decisions/0026-buffers.md; cast to
    bf16 with bf16 parameters where model.to would). With bf16 / fp16 parameters, the parameters and buffers a
    transformers model keeps in fp32 (its _keep_in_fp32_modules_strict, and under fp16 _keep_in_fp32_modules)
    stay fp32, computed from the fp32 master (docs/decisions/0045-modules-kept-in-fp32.md; the config's
    data_types.keep_in_fp32_modules: "auto", a list of globs, or []). `weight_decay=callable(name, param)`
    says which parameters decay (default: every parameter, DeepSpeed's rule; with the config's
    "strata": {"weight_decay_1d": false}, those with 2 or more dimensions): True / False for the config's
    optimizer.params.weight_decay or none, or a float, that parameter's own weight decay (0.0: none).
    `lr=callable(name, param)` gives a parameter its own lr (a number; None: the config's), as a torch param
    group's lr: it follows the config's scheduler as DeepSpeed's schedules treat a group's lr
    (docs/decisions/0032-param-groups.md); engine.lr(param) is the lr its next step uses. A parameter with
    requires_grad=False is frozen (fine-tuning, adapters): gathered and checkpointed, never reduced or
    updated, no .grad and no gradient or optimizer memory. `device`: "cuda" (or "cuda:k", a torch.device)
    or "cpu"; default: where the model's parameters are. On CUDA the engine's buffers are on the GPU of the
    local rank and the parameter views are CUDA tensors over them (unverified on a GPU). Outside a forward
    the parameters are empty placeholders whose reads and writes are refused (read or edit them inside
    st.GatheredParameters), as are model.zero_grad() between a backward and engine.step() and a model.to()
    that would change their dtype or device: docs/decisions/0030-sharded-parameters-outside-a-forward.md.
    `process_group`: the torch.distributed group whose ranks share the model (docs/decisions/0033); default: the
    launch's ranks (mpirun's MPI world, else torch.distributed's default group, initialised as gloo from
    torchrun's environment when the script has not). Every st.shard of a process names the same group.
    `device_mesh`: a torch DeviceMesh instead of a process_group. 1-D: its group. 2-D (replicate, shard): hybrid
    sharding over its ranks, each row of the mesh one shard group, as the config's
    zero_optimization.shard_group_size = mesh.size(1) gives (docs/decisions/0039, "A mesh")."""
    return Engine(model, config=config, unit_classes=unit_classes, process_group=process_group,
                  device_mesh=device_mesh, **kwargs)


def all_reduce_mean(x):
    """The mean over ranks of a number or a tensor (collective; a tensor comes back with its dtype and device)."""
    if _comm.bind().kind == "mpi" and not isinstance(x, torch.Tensor):
        from mpi4py import MPI
        return world().allreduce(float(x), op=MPI.SUM) / world_size()
    t = torch.as_tensor(x).detach().to("cpu", torch.float64).contiguous().clone()
    all_reduce_sum(t)
    t = t / world_size()
    return t.to(x.device, x.dtype) if isinstance(x, torch.Tensor) else float(t)
