"""deepspeed.zero: Init builds a model sharded, as strata.torch's factory form does (the record of the block's
construction, replayed into the engine by initialize); GatheredParameters is strata.torch's (the same contract:
full values inside, rank modifier_rank's changes written into the engine at exit)."""
import torch

from strata import _comm
from strata.torch import GatheredParameters
from strata.torch import _created, _deferred

__all__ = ["GatheredParameters", "Init"]


class Init:
    """`with deepspeed.zero.Init(): model = Model(cfg)`, then `deepspeed.initialize(model=model, ...)`.

    Inside the block the model is built without values (Note [Deferred construction]: its tensors say cpu and
    hold no memory); initialize() shards it and replays the construction one tensor at a time into each rank's
    shard. So no rank ever holds the whole model, and the initial values are bit for bit those of a plain
    construction from rank 0's generator (every rank starts the block from it). Between the block and
    initialize() the parameters have no values: an op on one is refused, naming this.

    Collective (rank 0's generator state is broadcast at the start). enabled=False is a no-op, as in DeepSpeed
    (scripts write `with deepspeed.zero.Init(enabled=stage == 3):`). Where the shards live (remote_device,
    pin_memory) is the config's zero_optimization.offload_param, read by initialize(); config_dict_or_path,
    config and mem_efficient_linear are accepted and not needed. A block inside another one is part of it.
    Refused: dtype other than fp32 (the engine keeps fp32 masters; the config's bf16 / fp16 section sets the
    compute dtype), mpu, and module= (a model built already: give it to initialize() directly)."""

    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None,
                 **kwargs):
        self.enabled = bool(enabled)
        self._rec = None
        if not self.enabled:
            return
        if module is not None:
            raise NotImplementedError("strata.deepspeed.zero.Init(module=...): the model is built already and whole "
                                      "on this rank; give it to deepspeed.initialize() directly, which shards it "
                                      "(or build it inside `with deepspeed.zero.Init():` so it is never whole)")
        if mpu is not None:
            raise NotImplementedError("strata.deepspeed.zero.Init(mpu=...): tensor, pipeline or sequence "
                                      "parallelism is not supported; Strata shards data-parallel ranks only")
        if dtype is not None and dtype != torch.float32:
            raise NotImplementedError(f"strata.deepspeed.zero.Init(dtype={dtype}): the parameters are created fp32, "
                                      f"the engine's masters; the config's bf16 / fp16 section sets the dtype the "
                                      f"model computes in. Leave dtype out")
        _comm.bind(data_parallel_group)  # the ranks, as initialize() will use them

    def __enter__(self):
        if not self.enabled or getattr(_deferred._state, "recording", None) is not None and \
                getattr(_deferred._state.recording, "zero_init", False):
            return self  # disabled, or inside another block: that block records
        _created.same_generator_as_rank_0()
        self._rec = _deferred.Recording()
        self._rec.zero_init = True
        self._rec.__enter__()
        return self

    def __exit__(self, *exc):
        if self._rec is None:
            return False
        rec, self._rec = self._rec, None
        try:
            return rec.__exit__(*exc)
        finally:
            if exc[0] is None:
                _deferred.keep(rec)  # initialize() (st.shard) adopts it with the model
