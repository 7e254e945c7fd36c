"""strata.deepspeed: DeepSpeed's training loop on Strata, for a script whose only change is its import line.

    import strata.deepspeed as deepspeed
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                           config="ds_config.json")
    for x, y in batches:                 # each rank its own micro-batches
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()                    # after every micro-batch; the update at the accumulation boundary
    engine.save_checkpoint("ckpt", tag="epoch1", client_state={"epoch": 1})
    path, client_state = engine.load_checkpoint("ckpt")

The config goes to strata.torch.shard unchanged (Strata reads DeepSpeed's keys: docs/configuration.md). What
DeepSpeed does that Strata cannot do exactly is refused with the fix named: docs/migrating-from-deepspeed.md.
"""
import argparse
import json
import os

import torch  # noqa: F401  (before libstrata: see strata/__init__.py)

import strata.torch as st
from strata import StrataError
from strata.deepspeed import _groups, zero
from strata.deepspeed._engine import DeepSpeedEngine
from strata.deepspeed._refusals import refuse_client_optimizer, refuse_client_scheduler

__all__ = ["initialize", "DeepSpeedEngine", "zero", "init_distributed", "add_config_arguments", "StrataError"]


def _load_config(args, config, config_params):
    if config is None and config_params is not None:
        config = config_params
    from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if from_args is not None:
        if config is not None:
            raise ValueError("strata.deepspeed.initialize: a config came both as args.deepspeed_config and as "
                             "config=; give one")
        config = from_args
    if config is None:
        raise ValueError("strata.deepspeed.initialize: no config: pass config= (a dict or a JSON path), or "
                         "args with deepspeed_config")
    if isinstance(config, (str, os.PathLike)):
        with open(config, encoding="utf-8") as f:
            return json.load(f)
    if not isinstance(config, dict):
        raise TypeError(f"strata.deepspeed.initialize: config is a {type(config).__name__}; give a dict or the "
                        f"path of a JSON file")
    return json.loads(json.dumps(config))  # a deep copy, and proof it is plain JSON


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None):
    """Collective: shards `model` with strata.torch (the config passed through unchanged) and returns
    (engine, optimizer, training_dataloader, lr_scheduler) as deepspeed.initialize does: the optimizer when the
    config has one (else None), the dataloader when training_data is given, the scheduler when the config has
    one. Param groups in model_parameters may set their own lr and weight_decay, as DeepSpeed takes them (a group
    without the key has the config's); betas / eps / momentum must be the config's."""
    if model is None:
        raise ValueError("strata.deepspeed.initialize requires a model")
    if optimizer is not None:
        refuse_client_optimizer(optimizer)
    if lr_scheduler is not None:
        refuse_client_scheduler(lr_scheduler)
    if mpu is not None or mesh_param is not None:
        raise NotImplementedError("strata.deepspeed.initialize: mpu / mesh_param (tensor, pipeline or sequence "
                                  "parallelism) are not supported; Strata shards data-parallel ranks only")
    cfg = _load_config(args, config, config_params)
    # DeepSpeed updates a parameter that got no gradient as if its gradient were zero (decayed, its moments
    # moving); strata.torch skips it as torch.optim does (decision 0027). A DeepSpeed script gets DeepSpeed's
    # rule unless its config says otherwise.
    cfg.setdefault("strata", {}).setdefault("params_without_grad", "zero")
    optimizer_params = dict(cfg.get("optimizer", {}).get("params", {}))
    groups = _groups.normalize(model, model_parameters)
    hyper = _groups.param_hyper(model, groups, optimizer_params)
    # without "optimizer" the engine refuses to train (_engine.py), so strata.torch's default-optimizer warning
    # would name an update that never happens
    strata_engine = st.shard(model, cfg, weight_decay=lambda name, p: hyper[id(p)][0],
                             lr=lambda name, p: hyper[id(p)][1], _warn_default_optimizer=False)
    engine = DeepSpeedEngine(model, strata_engine, cfg, groups, optimizer_params)
    if training_data is not None:
        engine.training_dataloader = _dataloader(engine, training_data, collate_fn, cfg)
    return engine, engine.optimizer, engine.training_dataloader, engine.lr_scheduler


def _dataloader(engine, dataset, collate_fn, cfg):
    """DeepSpeed's training dataloader: micro-batches of train_micro_batch_size_per_gpu, each rank its share of
    the dataset through a DistributedSampler."""
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=engine.world_size, rank=engine.global_rank)
    return torch.utils.data.DataLoader(dataset, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler,
                                       collate_fn=collate_fn, drop_last=bool(cfg.get("dataloader_drop_last", False)))


def init_distributed(*args, **kwargs):
    """A no-op: Strata's ranks are the launch's (mpirun's MPI world, or torchrun's, over torch.distributed's
    gloo: docs/decisions/0033); the engine makes its communicator."""


def add_config_arguments(parser):
    """DeepSpeed's command-line arguments: --deepspeed, --deepspeed_config (and the old --deepscale names)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="Enable DeepSpeed")
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file.")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser
