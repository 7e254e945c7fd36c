"""Models created sharded: a model's construction recorded without its values, replayed one tensor at a time.

Note [Deferred construction]. st.shard(factory, config) calls `factory()` (which builds the model, e.g.
`lambda: GPT2LMHeadModel(cfg)`) under a TorchDispatchMode, the Recording, in which every tensor torch would
create on the CPU is a DeferredTensor instead: a subclass over a meta tensor (its storage holds no memory)
that reads as device cpu, on which ops run torch's meta kernels (shapes only). Every aten op that writes
such a tensor is recorded in order, its tensor arguments as references (storage, dtype, size, stride, offset)
into the meta storages, so a view costs nothing and needs no record. The model's code sees CPU tensors and
takes the code path of a plain construction (Hugging Face's post_init() skips its weight initialisation on
torch's meta device; torch's orthogonal_ returns at once on a meta tensor).

Random numbers. An op that draws from a generator (torch.Tag.nondeterministic_seeded: normal_, uniform_,
randn, ...) is run at once on scratch memory of the same size and strides, which advances the generator
exactly as the plain construction would, and the generator's state before it is kept with the record (5 KiB
for the CPU generator). So the generator ends where a plain factory() leaves it, and the replay needs no
global order: before a random op it restores the state recorded for it.

Replay (materialize). Given the tensors wanted (the parameters and buffers), a backward scan keeps the ops
whose writes reach them: an op that writes a whole storage without reading it (fill_, normal_, copy_, ...
through a view covering every byte, or an out= argument) ends the need for what was written before, so a
constructor's reset_parameters that post_init's _init_weights overwrites is never replayed. The kept ops run
in order on real CPU storages, each allocated at its first use and freed (the heap trimmed) after its last;
a wanted tensor is handed to `deliver` as soon as the last op on its storage has run. Peak: the storages
live at once, about one tensor for torch's and Hugging Face's initialisations.

Values read during construction (x.item(), x.tolist(), `if mask.any():`, an op with no meta kernel such as
nonzero) are computed there by the same replay of what they depend on, every generator's state kept; its
tensor results become constants of the record. docs/decisions/0034-models-created-sharded.md.

Note [Draws left for later]. A model whose parameters a checkpoint will overwrite (st.shard(factory, config,
pretrained=DIR)) is recorded with Recording(lazy=True): a random op that reads none of our tensors (normal_,
uniform_, randn, ... on a parameter) is not run at record time. The generator is left where it is and the op
joins its generator's chain: the state before the chain's first op is kept, and the state before any later op
is computed when a replay needs it (_Chain.state_before: the chain's ops up to it are run on scratch memory,
as _advance runs them, each state kept). A replay that leaves the checkpoint's parameters out never asks for
their draws, so a model loaded whole draws nothing; a tensor the checkpoint lacks gets the state it gets
without lazy (the same ops, from the same state: bit for bit), at the cost of the draws before it on its
generator. A random op that reads our tensors, and a random op torch runs on real tensors during the factory,
first bring the generator to the chain's end (flush) and then run as without lazy. Two things differ from a
plain factory(): the generator ends where the factory left it without the chains' draws (flushes aside: a
construction that is then loaded draws nothing from it), and a factory that reads the CPU generator's state
in Python (torch.get_rng_state()) sees it without them. docs/decisions/0034 ("Pretrained at creation").
"""
import contextlib
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

_OVERWRITES = frozenset(("fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_", "exponential_",
                         "geometric_", "log_normal_", "cauchy_", "copy_"))  # write all of self, read none of it
_READS = frozenset(("tolist", "numpy", "__array__", "__dlpack__", "item"))  # Python-level reads of the values
_CPU, _META = torch.device("cpu"), torch.device("meta")
_TRIM_BYTES = 1 << 20  # a freed block this large or larger: the heap is trimmed (_trim)
_state = threading.local()  # .recording: the Recording running on this thread; .in_kernel: a meta kernel runs
_draw_hook = []  # tests: callables told (func, scratch args, kwargs) before each random op runs on real memory
_kept = []  # the Recordings of ended deepspeed.zero.Init blocks whose models no engine has taken yet (keep, adopt)


class DeferredError(RuntimeError):
    pass


def _in_kernel():
    return getattr(_state, "in_kernel", False)


@contextlib.contextmanager
def _meta_kernels():
    """Ops on DeferredTensors run torch's meta kernels (shapes, no values), which see them as meta tensors."""
    was, meta = _in_kernel(), torch._C._meta_in_tls_dispatch_include()
    _state.in_kernel = True
    torch._C._set_meta_in_tls_dispatch_include(True)
    try:
        with torch._C._DisableTorchDispatch():
            yield
    finally:
        _state.in_kernel = was
        torch._C._set_meta_in_tls_dispatch_include(meta)


class DeferredTensor(torch.Tensor):
    """A CPU tensor of a model under construction, without values: its storage is a meta tensor's (no
    memory) and it says device cpu (Note [Deferred construction])."""

    @staticmethod
    def __new__(cls, elem):
        return torch.Tensor._make_subclass(cls, elem, elem.requires_grad, dispatch_device=True,
                                           device_for_backend_keys=_CPU)

    @property
    def device(self):
        return _META if _in_kernel() else _CPU

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _READS:  # values read in Python: computed now by the recording
            rec = getattr(_state, "recording", None)
            mine = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, DeferredTensor)]
            if rec is None:
                raise DeferredError(_unmaterialised(mine[0], getattr(func, "__name__", "")))
            values = rec.values_now(mine)
            args, kwargs = tree_map(lambda a: values.get(id(a), a), (args, kwargs))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # outside a recording
        if func is torch.ops.prim.device.default:
            return _META if _in_kernel() else _CPU
        t = next(a for a in tree_flatten((args, kwargs))[0] if isinstance(a, DeferredTensor))
        raise DeferredError(_unmaterialised(t, str(func)))

    def __repr__(self, *, tensor_contents=None):
        return f"DeferredTensor(shape={tuple(self.shape)}, dtype={self.dtype})"


def _unmaterialised(t, what):
    if any(r.is_ours(t) for r in _kept):
        return (f"strata: {what} on a tensor of shape {tuple(t.shape)} of a model built under "
                f"deepspeed.zero.Init(): it has no values until deepspeed.initialize() (or st.shard) shards the "
                f"model (Note [Deferred construction]); do this inside the `with deepspeed.zero.Init()` block, or "
                f"after initialize under deepspeed.zero.GatheredParameters")
    return (f"strata: {what} on a tensor of shape {tuple(t.shape)} made during a sharded model's construction "
            f"(st.shard(factory, ...)) that is none of the model's parameters, buffers or module attributes, so it "
            f"has no values (Note [Deferred construction]); keep such a tensor as a registered buffer")


_trimmer = []


def _trim():
    """Freed memory back to the OS (glibc's malloc_trim, Note [Trimmed heap] in _hooks). The record and the
    replay free one tensor's memory after another, with small allocations between them (records, generator
    states) that land in the freed blocks, so glibc's heap would keep growing by the blocks it can no longer
    reuse (~the model's size over a construction, measured) and the peak would be the model, not a tensor."""
    if not _trimmer:
        from strata.torch._hooks import _heap_trimmer  # noqa: PLC0415  (_hooks imports torch's autograd glue)
        _trimmer.append(_heap_trimmer())
    if _trimmer[0] is not None:
        _trimmer[0](0)


def _wrap(o):
    return DeferredTensor(o) if isinstance(o, torch.Tensor) and not isinstance(o, DeferredTensor) else o


class _Ref:
    """A tensor of the record: a view (dtype, size, stride, offset) of storage `sid`."""
    __slots__ = ("sid", "dtype", "size", "stride", "offset")

    def __init__(self, sid, t):
        self.sid, self.dtype = sid, t.dtype
        self.size, self.stride, self.offset = tuple(t.shape), tuple(t.stride()), t.storage_offset()


class _Const:
    """A real tensor an op of the record read (a torch.tensor(...) literal, a tensor made outside)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Op:
    __slots__ = ("func", "args", "kwargs", "writes", "reads", "fresh", "rng")

    def __init__(self, func, args, kwargs, writes, reads, fresh, rng):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.writes, self.reads = writes, reads  # storage ids
        self.fresh = fresh    # [(position in the flattened output, _Ref)]: storages this op creates
        self.rng = rng        # (generator, state before the op) for a random op, else None


def _draw(func, args, kwargs):
    """A random op run on real memory: the one place a draw of the record happens (recording, chains, replay)."""
    for hook in _draw_hook:
        hook(func, args, kwargs)
    return func(*args, **kwargs)


def _scratch(a):
    """A chain's op argument as _advance gives it: a written tensor as fresh memory of its size and strides."""
    if isinstance(a, _Ref):
        return torch.empty_strided(a.size, a.stride, dtype=a.dtype)
    if isinstance(a, _Const):
        return a.value
    return a


class _Chain:
    """Note [Draws left for later]: one generator's random ops not run at record time, from a kept state."""
    __slots__ = ("gen", "ops", "states", "expect")

    def __init__(self, gen, state):
        self.gen, self.ops, self.states, self.expect = gen, [], {0: state}, state

    def state_before(self, k):
        """The generator's state before the chain's op k (k = len(ops): after the last), computed from the
        nearest state kept before it; the generator is left in that state."""
        j = max(i for i in self.states if i <= k)
        self.gen.set_state(self.states[j])
        with _disable_current_modes(), torch.no_grad():
            for i in range(j, k):
                op = self.ops[i]
                args, kwargs = tree_map(_scratch, (op.args, op.kwargs))
                out = _draw(op.func, args, kwargs)
                big = sum(t.untyped_storage().nbytes() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
                del out, args, kwargs
                if big >= _TRIM_BYTES:
                    _trim()
                self.states[i + 1] = self.gen.get_state()
        return self.states[k]


class _Later:
    """The state before a random op recorded lazily: op `index` of `chain`."""
    __slots__ = ("chain", "index")

    def __init__(self, chain, index):
        self.chain, self.index = chain, index


def _state_before(rng):
    gen, state = rng
    return state.chain.state_before(state.index) if isinstance(state, _Later) else state


class _Storage:
    __slots__ = ("keep", "nbytes")

    def __init__(self, storage):
        self.keep = storage   # holds the meta StorageImpl, so its address (the id) is not reused
        self.nbytes = storage.nbytes()


def _same_self(func, args, kwargs, mutated, flat_in):
    """An in-place op on `self` alone (normal_, uniform_, fill_, mul_ by a number, ...) that returns it and
    changes no metadata: its result is known without a meta kernel. Several of those are Python decompositions
    whose first use imports torch's symbolic-shape machinery (sympy and more, ~40 MiB per rank)."""
    return len(mutated) == 1 and mutated[0][1] == "self" and args and mutated[0][0] is args[0] and \
        torch.Tag.inplace_view not in func.tags and \
        sum(1 for a in flat_in if isinstance(a, torch.Tensor)) == 1 and \
        len(func._schema.returns) == 1 and func._schema.returns[0].alias_info is not None


def ours_in(leaves):
    return any(isinstance(a, DeferredTensor) for a in leaves)


def _sid(t):
    return t.untyped_storage()._cdata


def _factory(func):
    """Whether an op with no tensor argument makes a tensor on a device it is given (torch.empty, randn, ...)."""
    return any(a.name == "device" for a in func._schema.arguments) and \
        any(str(r.type) in ("Tensor", "Tensor[]") for r in func._schema.returns)


def _on_cpu(device):
    if device is None:
        return torch.get_default_device().type == "cpu"
    return torch.device(device).type == "cpu"


def _mutated(func, args, kwargs):
    """[(argument value, schema name)] of the tensor arguments the op writes (Tensor(a!))."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
        for t in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(t, torch.Tensor):
                out.append((t, a.name))
    return out


def _covers(t, nbytes):
    """Whether the view `t` is every byte of its storage (then a write through it replaces the storage)."""
    if t.numel() * t.element_size() != nbytes:
        return False
    expected = 1  # dense: the dimensions, by stride, each spanning exactly the ones inside it
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


class Recording(TorchDispatchMode):
    """The record of one factory() call (Note [Deferred construction])."""

    def __init__(self, lazy=False):
        super().__init__()
        self.ops, self.storages = [], {}
        self.model = None
        self.lazy = lazy  # Note [Draws left for later]
        self._chains = {}  # id(generator) -> its _Chain, while lazy

    def flush(self):
        """Every generator at its chain's end, as a plain construction would have left it by now (Note [Draws
        left for later]); the next lazy random op starts a new chain."""
        chains, self._chains = self._chains, {}
        for c in chains.values():
            c.gen.set_state(c.state_before(len(c.ops)))

    @classmethod
    def _should_skip_dynamo(cls):
        """False: torch would wrap __torch_dispatch__ in torch._dynamo.disable, whose first call imports
        torch._dynamo (with sympy, triton, ...: 900 modules, 150 MiB of RSS per rank, measured); nothing is
        compiled inside a model's construction."""
        return False

    def is_ours(self, t):
        return isinstance(t, DeferredTensor) and _sid(t) in self.storages

    # ---- recording ----
    def _storage(self, t):
        sid = _sid(t)
        s = self.storages.get(sid)
        if s is None:
            self.storages[sid] = _Storage(t.untyped_storage())
        else:
            s.nbytes = max(s.nbytes, t.untyped_storage().nbytes())
        return sid

    def _const(self, real):
        """A DeferredTensor whose storage the record makes from `real`'s values."""
        t = DeferredTensor(torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=_META))
        ref = _Ref(self._storage(t), t)
        self.ops.append(_Op(None, (_Const(real.detach().clone()),), {}, {ref.sid}, set(), [(0, ref)], None))
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.prim.device.default:
            return _META if _in_kernel() else _CPU
        leaves = tree_flatten((args, kwargs))[0]
        ours = [a for a in leaves if isinstance(a, DeferredTensor)]
        real = [a for a in leaves if isinstance(a, torch.Tensor) and not isinstance(a, DeferredTensor)]
        if any(not self.is_ours(a) for a in ours):
            raise DeferredError(f"strata: {func} in a factory given to st.shard() uses a tensor of another sharded "
                                f"model's construction")
        if not ours:
            if func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default) and \
                    args[0].device.type == "cpu":  # torch.tensor(data)
                return self._const(args[0])
            if real or not _factory(func) or not _on_cpu(kwargs.get("device")):
                if torch.Tag.nondeterministic_seeded in func.tags:
                    self.flush()  # it draws from a generator now: where a plain construction would have it
                with _disable_current_modes():
                    return func(*args, **kwargs)  # not the model's CPU tensors: torch's own
            return self._record(func, args, kwargs)
        if any(r.device.type != "cpu" for r in real) or not _on_cpu(kwargs.get("device")):
            raise DeferredError(f"strata: {func} in a sharded model's construction (st.shard(factory, ...)) mixes "
                                f"its CPU tensors with one on another device; build the model on the CPU (the "
                                f"engine places it)")
        if func._schema.name.split("::")[-1] in ("set_", "resize_", "resize_as_"):
            raise DeferredError(f"strata: {func} on a tensor of a sharded model's construction (st.shard(factory, "
                                f"...)) is not supported: it replaces a tensor's storage")
        if any(t is r for t, _ in _mutated(func, args, kwargs) for r in real):
            return self._run_real(func, args, kwargs)  # it writes a real tensor: that needs the values now
        return self._record(func, args, kwargs)

    def _record_arg(self, a):
        if self.is_ours(a):
            return _Ref(self._storage(a), a)
        if isinstance(a, torch.Tensor):
            return _Const(a.detach().clone())
        return a

    def _record(self, func, args, kwargs):
        flat_in = tree_flatten((args, kwargs))[0]
        reads = {self._storage(a) for a in flat_in if self.is_ours(a)}
        known = set(self.storages)
        writes = set()
        base = func._schema.name.split("::")[-1]
        mutated = [(t, n) for t, n in _mutated(func, args, kwargs) if self.is_ours(t)]
        for t, argname in mutated:
            sid = _sid(t)
            writes.add(sid)
            whole = (base in _OVERWRITES and argname == "self") or argname.startswith("out")
            if whole and _covers(t, self.storages[sid].nbytes) and sum(1 for a in flat_in if a is t) == 1:
                reads.discard(sid)
        rec_args, rec_kwargs = tree_map(self._record_arg, (args, kwargs))
        rng = self._advance(func, args, kwargs, [t for t, _ in mutated])
        meta_args, meta_kwargs = tree_map(lambda a: a.to(_META) if isinstance(a, torch.Tensor) and
                                          not isinstance(a, DeferredTensor) else a, (args, kwargs))
        if not ours_in(flat_in):
            meta_kwargs["device"] = _META  # a factory
        try:
            if _same_self(func, args, kwargs, mutated, flat_in):
                out = args[0]
            else:
                with _meta_kernels():
                    out = tree_map(_wrap, func(*meta_args, **meta_kwargs))
        except (NotImplementedError, RuntimeError):  # no meta kernel, or values needed (item, nonzero): now
            if mutated:
                raise
            return self._run_real(func, args, kwargs)
        fresh = []
        for i, o in enumerate(tree_flatten(out)[0]):
            if isinstance(o, DeferredTensor) and _sid(o) not in known:
                fresh.append((i, _Ref(self._storage(o), o)))
                writes.add(fresh[-1][1].sid)
        if not ours_in(flat_in):
            rec_kwargs["device"] = _CPU  # a factory: the replay makes the CPU tensor
        op = _Op(func, rec_args, rec_kwargs, writes, reads, fresh, rng)
        if rng is not None and isinstance(rng[1], _Later):
            rng[1].chain.ops.append(op)  # drawn or not, it moves the generator: on the chain
        if writes:
            self.ops.append(op)
        return out

    def _advance(self, func, args, kwargs, written):
        """For a random op: the generator's state before it, after running it on scratch memory (which
        advances the generator as the real op would). written: our tensors it writes."""
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return None
        gen = kwargs.get("generator") or torch.default_generator
        written = {id(t) for t in written}
        need = [a for a in tree_flatten((args, kwargs))[0] if self.is_ours(a) and id(a) not in written]
        if self.lazy and not need:  # Note [Draws left for later]
            chain, now = self._chains.get(id(gen)), gen.get_state()
            if chain is None or not torch.equal(now, chain.expect):  # none yet, or the factory reseeded it
                chain = self._chains[id(gen)] = _Chain(gen, now)
            return gen, _Later(chain, len(chain.ops))
        self.flush()
        state = gen.get_state()
        values = self.values_now(need) if need else {}

        def scratch(a):
            if self.is_ours(a):
                if id(a) in written:
                    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
                return values[id(a)]
            return a

        with _disable_current_modes(), torch.no_grad():
            out = _draw(func, tree_map(scratch, args), tree_map(scratch, kwargs))
        big = sum(t.untyped_storage().nbytes() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        del out
        if big >= _TRIM_BYTES:
            _trim()
        return gen, state

    def _run_real(self, func, args, kwargs):
        """Computes the op now on the values (a read such as item(), an op without a meta kernel): its
        tensor outputs become constants of the record."""
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.flush()
        values = self.values_now([a for a in tree_flatten((args, kwargs))[0] if self.is_ours(a)])
        real_args, real_kwargs = tree_map(lambda a: values.get(id(a), a) if self.is_ours(a) else a, (args, kwargs))
        with _disable_current_modes():
            out = func(*real_args, **real_kwargs)

        return tree_map(lambda o: self._const(o) if isinstance(o, torch.Tensor) and o.device.type == "cpu" else o,
                        out)

    def values_now(self, tensors):
        """{id(t): its values now} for our tensors, during the recording: the replay of what they depend
        on, every generator's state kept."""
        got = {}
        materialize(self, [(id(t), t) for t in tensors], lambda key, v: got.__setitem__(key, v.clone()),
                    upto=len(self.ops))
        return got

    # ---- the factory ----
    def __enter__(self):
        if getattr(_state, "recording", None) is not None:
            raise DeferredError("strata: st.shard(factory, ...) inside another st.shard(factory, ...)'s factory")
        _state.recording = self
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _state.recording = None


def keep(rec):
    """After a deepspeed.zero.Init block: its record waits for the engine that shards its model (adopt)."""
    _kept.append(rec)


def adopt(model):
    """The kept Recording whose tensors `model`'s parameters are, or None when none of them is deferred. Parameters
    from two records, or deferred ones of no kept record, are refused. The record stays kept: a block may build
    several models (a model and its reference model, a teacher and a student), each given to initialize() in turn,
    and each is replayed from the same record (materialize replays only what the tensors asked for need). What it
    keeps is the construction's ops, generator states and constants, not values: no memory of the model's size."""
    recs = []
    for n, p in model.named_parameters():
        if isinstance(p, DeferredTensor):
            rec = next((r for r in _kept if r.is_ours(p)), None)
            if rec is None:
                raise DeferredError(f"strata: parameter '{n}' has no values and belongs to no deepspeed.zero.Init() "
                                    f"block whose model is waiting to be sharded (a model already sharded, or a "
                                    f"tensor of another factory's construction)")
            if rec not in recs:
                recs.append(rec)
    if len(recs) > 1:
        raise DeferredError("strata: the model's parameters were built in two separate deepspeed.zero.Init() "
                            "blocks; build the whole model inside one block")
    if not recs:
        return None
    return recs[0]


def record(factory, lazy=False):
    """Runs `factory()` recording its tensors (Note [Deferred construction]; lazy: Note [Draws left for
    later]); returns the Recording, whose .model is what factory returned."""
    rec = Recording(lazy)
    with rec:
        rec.model = factory()
    return rec


# ---- replay ----
def _needed(rec, sids, upto):
    """The indices of the ops (of the first `upto`) whose writes reach storages `sids`, in order."""
    live, keep = set(sids), []
    for i in range(upto - 1, -1, -1):
        op = rec.ops[i]
        if not (op.writes & live):
            continue
        keep.append(i)
        live -= op.writes - op.reads
        live |= op.reads
    keep.reverse()
    return keep


class _Real:
    """The real storages of one replay."""

    def __init__(self, rec):
        self.rec, self.storages = rec, {}

    def tensor(self, ref, zero=True):
        s = self.storages.get(ref.sid)
        if s is None:
            nbytes = self.rec.storages[ref.sid].nbytes
            s = (torch.zeros if zero else torch.empty)(nbytes, dtype=torch.uint8).untyped_storage()
            self.storages[ref.sid] = s
        return torch.empty(0, dtype=ref.dtype).set_(s, ref.offset, ref.size, ref.stride)

    def arg(self, a, overwritten):
        if isinstance(a, _Ref):
            return self.tensor(a, zero=a.sid not in overwritten)
        if isinstance(a, _Const):
            return a.value
        return a

    def run(self, op):
        if op.func is None:  # a constant: its storage from the value
            ref = op.fresh[0][1]
            self.tensor(ref, zero=False).copy_(op.args[0].value)
            return
        overwritten = op.writes - op.reads
        args, kwargs = tree_map(lambda a: self.arg(a, overwritten), (op.args, op.kwargs))
        if op.rng is not None:
            op.rng[0].set_state(_state_before(op.rng))
            out = _draw(op.func, args, kwargs)
        else:
            out = op.func(*args, **kwargs)
        flat = tree_flatten(out)[0]
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for i, ref in op.fresh:
            o = flat[i]
            if (tuple(o.shape), tuple(o.stride()), o.storage_offset(), o.dtype) == \
                    (ref.size, ref.stride, ref.offset, ref.dtype) and \
                    o.untyped_storage().nbytes() >= self.rec.storages[ref.sid].nbytes and \
                    o.untyped_storage().data_ptr() not in inputs:
                self.storages[ref.sid] = o.untyped_storage()
            else:  # laid out otherwise than by the meta kernel, or an input's memory (a constant): a copy
                self.tensor(ref, zero=False).copy_(o)


@contextlib.contextmanager
def _generators_kept(rec):
    gens = {id(op.rng[0]): op.rng[0] for op in rec.ops if op.rng is not None}
    states = [(g, g.get_state()) for g in gens.values()]
    try:
        yield
    finally:
        for g, s in states:
            g.set_state(s)


def materialize(rec, wanted, deliver, upto=None):
    """Replays what `wanted` ([(key, DeferredTensor)]) needs of the record's first `upto` ops, calling
    deliver(key, real tensor) once per key as soon as its storage is final (the tensor is a view of memory
    freed after the call: copy what is kept). Peak: the storages live at once (Note [Deferred construction])."""
    upto = len(rec.ops) if upto is None else upto
    refs = {}
    for key, t in wanted:
        sid = _sid(t)
        if not rec.is_ours(t) or sid not in rec.storages:
            raise DeferredError(f"strata: a tensor of shape {tuple(t.shape)} was not made by this model's factory")
        refs.setdefault(sid, []).append((key, _Ref(sid, t)))
    order = _needed(rec, refs, upto)
    last = {}
    for j, i in enumerate(order):
        op = rec.ops[i]
        for sid in op.writes | op.reads:
            last[sid] = j
    ends = {}
    for sid, j in last.items():
        ends.setdefault(j, []).append(sid)
    real = _Real(rec)
    with _disable_current_modes(), torch.no_grad(), _generators_kept(rec):
        for sid in [s for s in refs if s not in last]:  # never written: zeros (torch.empty's garbage in torch)
            for key, ref in refs[sid]:
                deliver(key, real.tensor(ref))
            real.storages.pop(sid, None)
        for j, i in enumerate(order):
            real.run(rec.ops[i])
            freed = 0
            for sid in ends.get(j, ()):
                for key, ref in refs.get(sid, ()):
                    deliver(key, real.tensor(ref))
                s = real.storages.pop(sid, None)
                freed += 0 if s is None else s.nbytes()
                del s
            if freed >= _TRIM_BYTES:
                _trim()
