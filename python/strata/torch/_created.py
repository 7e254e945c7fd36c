"""st.shard(factory, config): a model created sharded, its initial values bit for bit a plain factory()'s.

The factory runs recorded (Note [Deferred construction] in _deferred): the model's parameters and buffers
are tensors without values, so the engine registers its units from their shapes. After finalize, the record
is replayed one tensor at a time into the engine (strata_engine_set_param: each rank keeps its shard of the
full value), so no rank ever holds more than about one unit of the model's values. Then the model's
parameters become ordinary nn.Parameter objects (the engine's placeholders from then on) and its buffers and
tensor attributes real tensors.

Ranks. Every rank runs the factory from rank 0's CPU generator state (broadcast first: ranks need not seed
alike, as st.shard(model) takes rank 0's values) and replays the whole record, so every rank computes the
same full values and keeps its own shard of them: no values travel between ranks. Afterwards every rank's
CPU generator is where the construction left rank 0's. A factory whose values differ between ranks (one
that reads a rank-dependent file, or a kernel that is not deterministic) would leave shards of different
models: a digest of each parameter's full value is compared across ranks, and a difference is an error
naming the parameter. docs/decisions/0034-models-created-sharded.md.

Pretrained (st.shard(factory, config, pretrained=DIR)): the factory is recorded lazily (Note [Draws left for
later] in _deferred) and load(engine, skip) leaves out the parameters the checkpoint supplies, so their ops,
random draws included, never run; engine.load_pretrained then writes them. docs/decisions/0034, "Pretrained at
creation".
"""
import ctypes
import hashlib

import torch

from strata import _capi, _comm
from strata.torch import _deferred

_lib = _capi.lib


def _digest(v):
    return hashlib.blake2b(memoryview(v.contiguous().view(torch.uint8).numpy()), digest_size=16).digest()


def same_generator_as_rank_0():
    """Rank 0's CPU generator state into every rank's (collective): rank 0's generator builds every rank's model."""
    state = torch.get_rng_state()
    _comm.broadcast_from_0(state)
    torch.set_rng_state(state)


def not_fp32(name, dtype):
    """The error for a parameter given to st.shard in another dtype than fp32 (a model loaded or built in bf16)."""
    return TypeError(f"strata: parameter '{name}' is {dtype}; give st.shard a model with fp32 parameters: the engine "
                     f"keeps the fp32 master and computes in bf16 / fp16 per the config's bf16.enabled / "
                     f"fp16.enabled. Build or load it in fp32 (model.float(), from_pretrained(dir, "
                     f"dtype=torch.float32), or from_config(cfg, dtype=torch.float32): transformers' from_config "
                     f"builds in the dtype of a bf16 checkpoint's config.json) and set bf16.enabled")


class Created:
    """The record of a factory and what st.shard does with it."""

    def __init__(self, factory, rec=None, lazy=False):
        """From `factory`, recorded here; or (factory None) from `rec`, a deepspeed.zero.Init block's record, whose
        .model is the model given to st.shard. lazy: the factory's draws left for later (Note [Draws left for
        later] in _deferred), for a model a checkpoint is loaded into."""
        if rec is None:
            if not callable(factory):
                raise TypeError(f"strata: st.shard() takes a torch.nn.Module or a factory (a callable that builds "
                                f"one, e.g. `lambda: GPT2LMHeadModel(cfg)`), not {type(factory).__name__}")
            same_generator_as_rank_0()
            rec = _deferred.record(factory, lazy)
        self.rec = rec
        self.model = self.rec.model
        if not isinstance(self.model, torch.nn.Module):
            raise TypeError(f"strata: the factory given to st.shard() returned {type(self.model).__name__}, not a "
                            f"torch.nn.Module")
        for n, p in self.model.named_parameters():
            if self.rec.is_ours(p) and p.dtype != torch.float32:
                raise not_fp32(n, p.dtype)

    def load(self, engine, skip=frozenset()):
        """After strata_engine_finalize: the initial values into the engine, one tensor at a time, and the model's
        deferred tensors replaced by real ones. skip: ids of parameters left unwritten (a checkpoint's, which
        engine.load_pretrained writes next): nothing of their construction is replayed."""
        rec, wanted, real_params = self.rec, [], []
        for u in engine.units:
            for i, p in enumerate(u.spec.params):
                if id(p) not in skip:
                    (wanted if rec.is_ours(p) else real_params).append(((u.id, i), p))
        tensors = {}  # id -> (module, kind, name) of the model's other deferred tensors
        for m in self.model.modules():
            for name, b in m._buffers.items():
                if b is not None and rec.is_ours(b):
                    tensors.setdefault(id(b), (b, []))[1].append((m, "buffer", name))
            for name, v in vars(m).items():
                if rec.is_ours(v):
                    tensors.setdefault(id(v), (v, []))[1].append((m, "attribute", name))
        wanted += [(("tensor", k), t) for k, (t, _) in tensors.items()]
        digests, real = {}, {}

        def deliver(key, value):
            if key[0] == "tensor":
                real[key[1]] = value.clone()
                return
            v = value.contiguous()
            digests[key] = _digest(v)
            _capi.check(_lib.strata_engine_set_param(engine.handle, key[0], key[1], ctypes.c_void_p(v.data_ptr()),
                                                     v.numel()))

        _deferred.materialize(rec, wanted, deliver)
        for (uid, i), p in real_params:  # made outside the factory's record: rank 0's, as st.shard(model)
            v = p.detach().to("cpu", torch.float32).contiguous().clone()
            _comm.broadcast_from_0(v)
            _capi.check(_lib.strata_engine_set_param(engine.handle, uid, i, ctypes.c_void_p(v.data_ptr()),
                                                     v.numel()))
        self._check_ranks(engine, digests)
        self._install(engine, real, tensors)

    def _check_ranks(self, engine, digests):
        keys = sorted(digests)
        mine = [digests[k] for k in keys]
        ours = _comm.allgather_object(mine)
        for r, theirs in enumerate(ours):
            for k, a, b in zip(keys, ours[0], theirs):
                if a != b:
                    u = engine.units[k[0]]
                    name = u.spec.names[k[1]] if u.spec.module is engine.model else \
                        f"{u.spec.prefix}.{u.spec.names[k[1]]}"
                    raise RuntimeError(f"strata: the factory given to st.shard() built different initial values for "
                                       f"parameter '{name}' on rank {r} than on rank 0 (every rank runs it from rank "
                                       f"0's generator state); make it deterministic and the same on every rank (no "
                                       f"rank-dependent input), or build the model and call st.shard(model, ...)")

    def _install(self, engine, real, tensors):
        """Real objects in the model for its deferred ones: parameters (each an empty nn.Parameter, which the
        engine makes a placeholder; ties kept: one new object per old one), buffers and tensor attributes."""
        rec = self.rec
        new = {}
        for m in self.model.modules():
            for name, p in list(m._parameters.items()):
                if p is None or not rec.is_ours(p):
                    continue
                if id(p) not in new:
                    q = torch.nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=p.requires_grad)
                    for k, v in vars(p).items():  # the model's own marks (e.g. transformers' _is_hf_initialized)
                        if k != "_is_param":
                            setattr(q, k, v)
                    new[id(p)] = q
                m._parameters[name] = new[id(p)]
        for u in engine.units:
            u.spec.params = [new.get(id(p), p) for p in u.spec.params]
        for k, (_, places) in tensors.items():
            for m, kind, name in places:
                if kind == "buffer":
                    m._buffers[name] = real[k]
                else:
                    object.__setattr__(m, name, real[k])
        rec.model = None  # a deepspeed.zero.Init block's record stays kept (_deferred.adopt): not with this model
        self.rec = None  # the record (its constants, generator states) is not needed any more here
