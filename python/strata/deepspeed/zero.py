"""deepspeed.zero: GatheredParameters is strata.torch's (the same contract: full values inside, rank
modifier_rank's changes written into the engine at exit); Init (building a model already sharded) is not
available here yet and says so, naming strata.torch's factory form, unless it is disabled."""
from strata.torch import GatheredParameters

__all__ = ["GatheredParameters", "Init"]

INIT_MESSAGE = (
    "strata.deepspeed.zero.Init: building a model already sharded inside `with deepspeed.zero.Init(...)` is not "
    "available in strata.deepspeed yet. strata.torch creates a model sharded from a factory, never whole on any "
    "rank and bit for bit a plain construction: `engine = strata.torch.shard(lambda: Model(cfg), config)` "
    "(docs/decisions/0034-models-created-sharded.md). Or build the model normally, without zero.Init: "
    "strata.deepspeed.initialize() then shards it (rank 0's values become every rank's), and the model must fit "
    "in one rank's host memory")


class Init:
    """Refused (NotImplementedError, INIT_MESSAGE) unless enabled=False, which DeepSpeed also makes a no-op:
    scripts write `with deepspeed.zero.Init(enabled=stage == 3):`."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 **kwargs):
        if enabled:
            raise NotImplementedError(INIT_MESSAGE)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
