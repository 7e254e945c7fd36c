"""deepspeed.zero: GatheredParameters is strata.torch's (the same contract: full values inside, rank
modifier_rank's changes written into the engine at exit); Init (building a model already sharded) is not
available yet and says so, unless it is disabled."""
from strata.torch import GatheredParameters

__all__ = ["GatheredParameters", "Init"]

INIT_MESSAGE = (
    "strata.deepspeed.zero.Init: building a model already sharded (each rank allocating only its share of the "
    "parameters) is not available yet; it is the issue on models bigger than one rank's memory. Build the model "
    "normally, without `with deepspeed.zero.Init(...)`: every rank builds the whole model on the host and "
    "strata.deepspeed.initialize() shards it (rank 0's values become every rank's), so the model must fit in one "
    "rank's host memory until then")


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
