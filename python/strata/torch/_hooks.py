"""The autograd glue: turns one forward and one backward of a torch model into the engine's protocol.

Per micro-batch (a forward with grad enabled, then its backward):
  root forward pre-hook   begin_micro_batch, begin_forward(root); saved-tensor hooks on
  block pre-hook / hook   begin_forward(block) / end_forward(block)
  root forward hook       end_forward(root); a hook on each output that requires grad
  first backward event    begin_backward(root), which stays open until the end of the backward
  a block's output grad   begin_backward(block) (also begun on demand: a saved parameter unpacked, or a
                          checkpointed block recomputed)
  a block's input grads   end_backward(block) (a Function over the block's inputs, run once all are done)
  end of the backward     end_backward of every use still open, end_micro_batch
Parameters are views of the gathered buffer while their unit is begun, empty placeholders otherwise
(whose every read or write is refused: Note [Parameters between uses] in _sharded).
Autograd saves some parameters for the backward (a Linear's weight); the forward buffer is gone by then,
so the pack hook replaces a tensor over a forward buffer by (unit, offset, size, stride) and the unpack
hook rebuilds it over the buffer of the unit's backward use. Gradients: while a unit's backward is open
each parameter's .grad is a view of the engine's fp32 gradient buffer, so autograd's AccumulateGrad adds
into it in place (the engine's "+=" contract; tied uses add up).
Idle memory (strata.release_idle_memory): when the backward has ended every block's last use, the C
library's heap is trimmed once per micro-batch (Note [Trimmed heap] in _heap_trimmer).
Activation checkpointing: a block re-run inside the backward (torch.utils.checkpoint, reentrant or not)
finds its unit in backward and computes with the backward buffers; no begin_forward is issued there.
Outside the model's forward a unit's module called directly gathers its unit (block_pre / block_post), and a
module reading the root unit's parameters gathers the root (Note [The root outside the forward]).
"""
import ctypes
import weakref

import torch
from torch.overrides import TorchFunctionMode

from strata import _capi
from strata.torch._gathered import GradInEngine, drop_grad_markers, holds_gathered, mark_grads
from strata.torch._sharded import set_placeholder, set_values

IDLE, FORWARD, AWAIT_BACKWARD, BACKWARD, EVAL = "idle", "forward", "await-backward", "backward", "eval"


def _weak_hook(tracker_ref, fn):
    """A post-accumulate-grad hook calling fn(tracker, param) while the tracker lives; nothing once it is gone. It
    must not hold the tracker, hence the engine (Note [Dropped engines] in strata._comm)."""
    def hook(p):
        t = tracker_ref()
        if t is not None:
            fn(t, p)
    return hook


def _heap_trimmer():
    """glibc's malloc_trim, or None where the C library has none.

    Note [Trimmed heap]. glibc keeps the pages of freed blocks below its mmap threshold, and raises that
    threshold to the size of each mmapped block freed (up to 32 MiB), so torch's activations and their
    temporaries soon come from the heap; as the backward frees them, their pages stay resident. At the
    end of the backward the root's gradients (a tied embedding's two contributions, 2 x 150 MiB on
    GPT-2) then come on top of a heap that still holds the forward's activations, and that is the step's
    peak. With strata.release_idle_memory, once every block's backward has ended the heap is trimmed
    (malloc_trim(0): the free pages of every arena go back to the OS), so that peak is the live bytes.
    Cost: the next forward faults those pages in again (docs/perf-notes.md, "Trimmed heap"). Where the
    last block is ended only after autograd has finished (a frozen prefix that autograd never reaches),
    there is no trim: it would cut no peak. A model of root units only has no trim either.
    docs/decisions/0023-trimmed-heap.md."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # TypeError: CDLL(None) where there is no dlopen(NULL)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


class _PostBackward(torch.autograd.Function):
    """Identity on a block's inputs whose backward runs when all their gradients are computed."""

    @staticmethod
    def forward(ctx, callback, *tensors):
        ctx.callback = callback
        return tensors if len(tensors) > 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.callback()
        return (None,) + grads


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class ParamGuard(TorchFunctionMode):
    """Active during the model's forward: an op given a parameter whose unit is not begun (a block's
    parameter used outside the block) is an error naming it, the same on every rank, instead of an op
    on the empty placeholder (which a reduction would silently accept)."""

    def __init__(self, tracker):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "__get__":  # metadata (p.dtype, p.device) reads no data
            return func(*args, **kwargs)
        unit_of = self.tracker.unit_of
        for a in list(args) + list(kwargs.values()):
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                hit = unit_of.get(id(t)) if isinstance(t, torch.nn.Parameter) else None
                if hit is not None and hit[0].forward_open == 0 and not hit[0].backward_open:
                    u, name = hit
                    raise RuntimeError(f"strata: parameter '{name}' of unit '{u.spec.name}' is used outside "
                                       f"its unit's forward ({getattr(func, '__name__', func)}): a unit's "
                                       f"parameters exist only while its module runs; make the module that "
                                       f"uses it part of that unit, or the parameter part of the root unit")
        return func(*args, **kwargs)


class UnitState:
    def __init__(self, uid, spec, layout):
        self.id, self.spec, self.layout = uid, spec, layout
        self.forward_open = 0      # begun forward uses not yet ended
        self.forward_uses = 0      # in this micro-batch
        self.backward_uses = 0     # ended, in this micro-batch
        self.backward_open = False
        self.backward_flat = None  # the flat tensor of the open backward use
        self.forward_flat = None
        self.unarmed = 0           # forward uses without an input Function (no grad then: reentrant checkpoint)
        self.grad_targets = None   # bf16 units: the fp32 gradient views of the open backward use

    def set_data(self, views):
        with torch._C.DisableTorchFunction():  # not an use of the parameters: ParamGuard must not see it
            for p, v in zip(self.spec.params, views):
                set_values(p, v)

    def clear(self):
        """The parameters become placeholders (Note [Parameters between uses] in _sharded), and the engine's
        gradient views of a use go; a marker of Note [Gradients in the engine] stays (an evaluation forward
        between a backward and the step ends its uses here, and the step applies those gradients)."""
        with torch._C.DisableTorchFunction():
            for p in self.spec.params:
                set_placeholder(p, p.dtype, self.layout.device)
                if type(p.grad) is not GradInEngine:
                    p.grad = None


class Tracker:
    def __init__(self, engine, units):
        self.engine, self.units = engine, units
        self.phase = IDLE
        self.live_forward = {}     # storage data_ptr -> unit, for the pack hook
        self.saved_hooks = None
        self.backward_order = []   # units whose backward was begun, in order
        self.guard = None
        self.failed = None
        self.recomputed = 0        # blocks run again inside a backward (activation checkpointing)
        self.late = []             # bf16 gradients that arrived after their unit's backward ended
        self.scaled_backward = False  # inside Engine.backward (fp16: the loss was multiplied by the loss scale)
        # Note [Parameters without a gradient] (runtime/engine/engine_step.cc): with params_without_grad "skip",
        # the parameters autograd accumulated a gradient into in this micro-batch; the others are marked.
        self.mark_no_grad = engine.config.get("strata", {}).get("params_without_grad") == "skip"
        self.touched = set()
        me = weakref.ref(self)  # torch holds these hooks where the collector cannot see (Note [Dropped engines])
        for u in units:  # a unit kept in fp32 (Note [Modules kept in fp32] in _fp32_modules) takes fp32 .grad
            if u.layout.dtype != _capi.DTYPE_F32 and not u.spec.frozen and not u.spec.fp32:
                for i, p in enumerate(u.spec.params):
                    p.register_post_accumulate_grad_hook(
                        _weak_hook(me, lambda t, p, u=u, i=i: t.add_low_precision_grad(u, i, p)))
            elif self.mark_no_grad and not u.spec.frozen:
                for p in u.spec.params:
                    p.register_post_accumulate_grad_hook(_weak_hook(me, lambda t, p: t.touched.add(id(p))))
        self.unit_of = {id(p): (u, n) for u in units for n, p in zip(u.spec.names, u.spec.params)}
        # a set: end_backward asks `u in`. Leaf units (Note [Leaf units] in _units) are left out: an embedding's
        # backward ends with the pass, and the trim is for the activations freed before that
        self.blocks = {u for u in units if u not in engine.roots and not u.spec.leaf}
        idle = engine.config.get("strata", {}).get("release_idle_memory", False)
        self.trim_heap = _heap_trimmer() if idle else None  # Note [Trimmed heap]
        self.ending = False        # in _end_of_backward: autograd is done, a trim would cut no peak
        # Note [Writes outside a forward]: each parameter's version counter while it is a placeholder
        self.versions = {id(p): p._version for u in units for p in u.spec.params}
        self.outside = []          # Note [The root outside the forward]: the hooked calls inside one that gathered it

    # ---- engine calls ----
    def _call(self, fn, *args):
        _capi.check(fn(self.engine.handle, *args))

    def _views(self, u, bufs):
        """The flat tensor and the parameter views of a begun use: over the engine's gathered buffer, or for a
        unit kept in fp32 over its full fp32 master (Note [Modules kept in fp32] in _fp32_modules)."""
        if not u.spec.fp32:
            return u.layout.param_views(bufs)
        flat = self.engine.fp32_values(u)
        return flat, [flat[o:o + n].view(s) for o, n, s in zip(u.layout.offsets, u.layout.numels, u.layout.shapes)]

    def begin_forward(self, u):
        bufs = _capi.UnitBuffers.new()
        self._call(_capi.lib.strata_engine_begin_forward, u.id, bufs)
        u.forward_flat, views = self._views(u, bufs)
        u.set_data(views)
        u.forward_open += 1
        if self.phase == FORWARD:
            u.forward_uses += 1
        self.live_forward[u.forward_flat.untyped_storage().data_ptr()] = u

    def end_forward(self, u):
        self.live_forward.pop(u.forward_flat.untyped_storage().data_ptr(), None)
        u.forward_open -= 1
        u.clear()
        u.forward_flat = None
        self.engine.fence()
        self._call(_capi.lib.strata_engine_end_forward, u.id)

    def begin_backward(self, u):
        if u.backward_open:
            return
        if u.backward_uses >= u.forward_uses:
            raise RuntimeError(f"strata: unit '{u.spec.name}' is used in this backward more often than in its "
                               f"forward ({u.forward_uses} uses): each training forward takes one backward (two "
                               f"backward calls through one graph, e.g. with retain_graph=True? sum the losses and "
                               f"call backward once)")
        bufs = _capi.UnitBuffers.new()
        self._call(_capi.lib.strata_engine_begin_backward, u.id, bufs)
        u.backward_flat, views = self._views(u, bufs)
        u.set_data(views)
        grads = [] if u.spec.frozen else u.layout.grad_views(bufs)  # a frozen unit has no gradient buffers
        if u.layout.dtype == _capi.DTYPE_F32 or u.spec.fp32:
            with torch._C.DisableTorchFunction():
                for p, g in zip(u.spec.params, grads):
                    p.grad = g
        else:  # bf16 parameters get bf16 .grad: add_low_precision_grad moves each into the fp32 buffer
            u.grad_targets = grads
        u.backward_open = True
        self.backward_order.append(u)

    def add_low_precision_grad(self, u, i, p):
        """post-accumulate-grad hook of a bf16 parameter: its gradient, in fp32, into the engine's buffer."""
        self.touched.add(id(p))
        if not u.backward_open:
            self.late.append(f"{u.spec.name}.{u.spec.names[i]}")
            return
        u.grad_targets[i].add_(p.grad.to(torch.float32))
        p.grad = None

    def end_backward(self, u):
        if not u.backward_open:
            return
        u.grad_targets = None
        u.backward_open = False
        u.backward_uses += 1
        u.clear()
        u.backward_flat = None
        self.engine.fence()
        self._call(_capi.lib.strata_engine_end_backward, u.id)
        if (self.trim_heap is not None and not self.ending and u in self.blocks and
                all(b.backward_uses >= b.forward_uses for b in self.blocks)):
            self.trim_heap(0)  # Note [Trimmed heap]: the blocks' activations are freed by now

    # ---- saved tensors ----
    def pack(self, t):
        if t.device != self.engine.device or t.layout != torch.strided:
            return t
        u = self.live_forward.get(t.untyped_storage().data_ptr())
        if u is None:
            return t
        return (u, t.storage_offset(), tuple(t.shape), t.stride())

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        u, offset, shape, stride = packed
        self.begin_backward(u)
        return u.backward_flat.as_strided(shape, stride, offset)

    # ---- the root (the whole model): Engine wraps model.forward in these ----
    def root_enter(self):
        self.engine.refuse_closed("the model's forward")
        if self.failed:
            raise RuntimeError(f"strata: an earlier forward or backward failed ({self.failed}); this engine "
                               f"cannot go on: build a new one (or load a checkpoint into one)")
        if self.phase in (FORWARD, AWAIT_BACKWARD, BACKWARD):
            raise RuntimeError(f"strata: the model's forward was called again in phase '{self.phase}': each "
                               f"training forward must be followed by its backward before the next, so a loss "
                               f"made of several forwards' outputs (two towers of a siamese or contrastive "
                               f"model) cannot train: concatenate their inputs into one forward. Run "
                               f"evaluation forwards under torch.no_grad()")
        self._check_frozenness()
        self._check_untouched()
        self._check_parameters_kept()
        if torch.is_grad_enabled():
            self._call(_capi.lib.strata_engine_begin_micro_batch)
            self.touched.clear()
            drop_grad_markers(self.engine)  # before any accumulation (Note [Gradients in the engine])
            for u in self.units:
                u.forward_uses = u.backward_uses = u.unarmed = 0
            self.backward_order = []
            self.phase = FORWARD
            self.saved_hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
            self.saved_hooks.__enter__()
        else:
            self.phase = EVAL
        self.guard = ParamGuard(self)
        self.guard.__enter__()
        for root in self.engine.roots:
            self.begin_forward(root)

    def _check_frozenness(self):
        """Which parameters are frozen is fixed at shard() (the engine keeps no gradient or optimizer state for
        them): a requires_grad changed since would be ignored, so it is refused, naming the parameter."""
        with torch._C.DisableTorchFunction():  # the engine's own reads: not through ShardedParameter
            for u in self.units:
                for n, p in zip(u.spec.names, u.spec.params):
                    if p.requires_grad == u.spec.frozen:
                        was = "frozen (requires_grad=False)" if u.spec.frozen else "trainable (requires_grad=True)"
                        raise RuntimeError(
                            f"strata: parameter '{n}' of unit '{u.spec.name}' was {was} at shard() and its "
                            f"requires_grad changed since; which parameters train is fixed when the engine is built. "
                            f"Set requires_grad before st.shard(), or carry the weights to a new engine "
                            f"(engine.full_state_dict(), or save_checkpoint and load_checkpoint into an engine built "
                            f"after the change)")

    def _check_untouched(self):
        """Note [Writes outside a forward]. Between uses a parameter is an empty placeholder and its values
        live in the engine, so a write to it there would be lost without a word. Note [Parameters between
        uses] (_sharded) refuses each write where it is made; this is the check behind it, for a write torch's
        __torch_function__ does not see (under torch._C.DisableTorchFunction, in a C++ extension): an
        in-place op bumps the parameter's version counter and an assignment to .data gives it elements, so
        the next forward refuses either, naming the parameter and the way to edit it (st.GatheredParameters,
        whose edits reach the engine)."""
        with torch._C.DisableTorchFunction():
            for u in self.units:
                for n, p in zip(u.spec.names, u.spec.params):
                    if p._version != self.versions.get(id(p), p._version) or p.numel() != 0:
                        raise RuntimeError(
                            f"strata: parameter '{n}' of unit '{u.spec.name}' was written where the engine does not "
                            f"see it: between forwards (an nn.init function, an in-place op or an assignment to "
                            f".data), or in place by the model's own forward (nn.Embedding with max_norm "
                            f"renormalises the rows it looks up); a sharded parameter's values live in the engine, "
                            f"so the write would be lost or differ between ranks. Edit it inside "
                            f"`with st.GatheredParameters(params, modifier_rank=0):` (the edit then reaches every "
                            f"rank's shard and the optimizer's fp32 copy), or set the values before st.shard(); "
                            f"a forward must not write its parameters (for nn.Embedding: max_norm=None)")

    def _check_parameters_kept(self):
        """A parameter object replaced after shard() (`module.bias = nn.Parameter(t)`, a module swapped for a new
        one) is not the engine's: the forward would compute with the new tensor and nothing would ever train it,
        nor would a checkpoint hold it. Refused at the next forward, naming it."""
        for u in self.units:
            for n, p in zip(u.spec.names, u.spec.params):
                try:
                    now = u.spec.module.get_parameter(n)
                except AttributeError:
                    now = None
                if now is not p:
                    raise RuntimeError(
                        f"strata: parameter '{n}' of unit '{u.spec.name}' was replaced (or removed) after st.shard(); "
                        f"the engine holds the one that was sharded, and a new tensor would never be trained. Change "
                        f"a parameter's values inside `with st.GatheredParameters(params, modifier_rank=0):`, or "
                        f"change the model's structure before st.shard()")

    def root_abandon(self, error):
        """The forward raised: undo what root_enter pushed so the process can go on (without this engine)."""
        self._pop_contexts()
        self.failed = f"{type(error).__name__}: {error}"
        self.phase = IDLE

    def _pop_contexts(self):
        if self.guard is not None:
            self.guard.__exit__(None, None, None)
            self.guard = None
        if self.saved_hooks is not None:
            self.saved_hooks.__exit__(None, None, None)
            self.saved_hooks = None

    def root_exit(self, output):
        for root in self.engine.roots:
            self.end_forward(root)
        self._pop_contexts()
        if self.phase == EVAL:
            self.phase = IDLE
            return output
        self.phase = AWAIT_BACKWARD
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(self._backward_event)
        return output

    def _backward_event(self, grad):
        if self.phase == AWAIT_BACKWARD and self.engine.fp16 and not self.scaled_backward:
            raise RuntimeError("strata: with fp16 the loss must be multiplied by the loss scale before backward: "
                               "call engine.backward(loss) instead of loss.backward() (DeepSpeed's engine.backward)")
        if self.phase == AWAIT_BACKWARD:
            self.phase = BACKWARD
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            for root in self.engine.roots:
                self.begin_backward(root)
        return grad

    # ---- blocks ----
    def block_pre(self, u, args, kwargs):
        if self.phase == BACKWARD:  # recomputation (activation checkpointing) inside the backward
            self.recomputed += 1
            self.begin_backward(u)
            if u.unarmed > 0 and torch.is_grad_enabled():  # its forward ran without grad: arm it now
                armed = self._arm_post_backward(u, args, kwargs)
                u.unarmed -= armed is not None
                return armed
            return None
        if self.phase == AWAIT_BACKWARD:  # called directly after a training forward: refused before the engine
            raise RuntimeError(f"strata: unit '{u.spec.name}' was called directly (outside the model's forward) "
                               f"between a training forward and its backward, where its parameters belong to the "
                               f"pending backward; nothing was run. Call it before the model's forward or after "
                               f"loss.backward(), or compute it inside the model's forward")
        self.begin_forward(u)
        if self.phase != FORWARD:
            return None
        armed = self._arm_post_backward(u, args, kwargs) if torch.is_grad_enabled() else None
        u.unarmed += armed is None
        return armed

    def _arm_post_backward(self, u, args, kwargs):
        flat = list(args) + list(kwargs.values())
        idx = [i for i, a in enumerate(flat) if isinstance(a, torch.Tensor) and a.requires_grad]
        if not idx:
            return None
        out = _PostBackward.apply(lambda: self.end_backward(u), *[flat[i] for i in idx])
        out = out if isinstance(out, tuple) else (out,)
        for i, t in zip(idx, out):
            flat[i] = t
        return tuple(flat[:len(args)]), dict(zip(kwargs.keys(), flat[len(args):]))

    def block_post(self, u, output):
        if self.phase == BACKWARD:
            return output
        self.end_forward(u)
        if self.phase == FORWARD:
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda g, u=u: (self.begin_backward(u), g)[1])
        elif self.phase == IDLE:  # the module called directly, outside the model's forward
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(lambda g, u=u: self._refuse_outside_backward(f"unit '{u.spec.name}'"))
        return output

    def _refuse_outside_backward(self, what):
        """A backward reaching a unit's use outside the model's forward (`what`: "unit 'name'"), or the root's
        (Note [The root outside the forward]): no micro-batch holds it and its parameters are placeholders again
        (autograd would fail on their size); named instead."""
        raise RuntimeError(f"strata: {what} ran outside the model's forward (its module called "
                           f"directly, with gradients enabled) and a backward reached it: its gradients have no "
                           f"micro-batch to go to. Train through the model's forward (model(...), with the extra "
                           f"computation inside it: a wrapper nn.Module whose forward calls the submodules is "
                           f"sharded as one model), or run the direct call under torch.no_grad()")

    # Note [The root outside the forward]. The model's forward gathers the root unit (root_enter) and a unit's
    # module gathers its unit (block_pre), so a unit's module called directly, outside the model's forward, works,
    # but a module reading the root's parameters found them placeholders: transformers' generate() of an
    # encoder-decoder runs model.get_encoder()(...) before any forward, and T5's or BART's encoder reads the shared
    # embedding, its norms and (the smaller stack, by default) its layers from the root. So each module whose
    # parameters, its own or a submodule's, include a root parameter (_units.root_holders; not the model, whose
    # forward root_enter wraps) is hooked: called in phase IDLE while the root is not gathered, it begins the
    # root's forward use (every part of it, as root_enter does) before its forward and ends it after, also when
    # the forward raises (an always_call forward hook). The hooked modules inside it find the root gathered and
    # only nest (`outside`, a stack), so one call gathers the root once; units inside gather themselves, as when
    # called directly. These are an evaluation forward's engine calls (begin_forward / end_forward outside a
    # micro-batch), so at stage 3 each gather is agreed across ranks first (Note [Agreed schedule]): every rank
    # must make the same calls in the same order, as every rank runs the same generate() (README), and a rank that
    # does not fails at the agreement, naming it; at stages 0-2 the gather is local. Whether a call gathers
    # depends only on the phase, the root's state and the calls before it, so it is the same on every rank that
    # runs the same code. Nothing is gathered inside the model's forward or backward (the root is live there),
    # between a training forward and its backward (phase AWAIT_BACKWARD: a use there would be one of the micro-
    # batch, off its schedule; the placeholders' refusal stays), or while st.GatheredParameters holds parameters
    # of the engine (those are used as before and the others refused as placeholders; a gather would replace
    # the context's values). A backward reaching such a call is refused as a unit's is. Cost in a training pass:
    # two Python calls per call of a hooked module, each returning at its first test.
    # docs/decisions/0056-root-outside-the-forward.md.
    def holder_pre(self, m):
        if self.outside:
            self.outside.append(m)
        elif (self.phase == IDLE and self.engine.handle is not None and not holds_gathered(self.engine)
              and not any(r.forward_open or r.backward_open for r in self.engine.roots)):
            for root in self.engine.roots:
                self.begin_forward(root)
            self.outside.append(m)

    def holder_post(self, m, name, output):
        """The forward hook of a module of Note [The root outside the forward], run also when its forward raised
        (then `output` is None): the call that gathered the root ends its use."""
        if not self.outside or self.outside[-1] is not m:
            return
        self.outside.pop()
        if self.outside:
            return
        for root in self.engine.roots:
            self.end_forward(root)
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(lambda g: self._refuse_outside_backward(
                    f"module '{name}', which reads the root unit's parameters,"))

    def _end_of_backward(self):
        self.ending = True
        try:
            for u in reversed(self.backward_order):
                self.end_backward(u)
            for u in reversed(self.units):  # uses whose backward autograd never reached (no gradient path)
                while u.backward_uses < u.forward_uses:
                    self.begin_backward(u)
                    self.end_backward(u)
            with torch._C.DisableTorchFunction():  # the engine's own reads: not through ShardedParameter
                late = self.late + [f"{u.spec.name}.{n}" for u in self.units
                                    for n, p in zip(u.spec.names, u.spec.params) if p.grad is not None]
            self.late = []
            if late:
                raise RuntimeError(f"strata: the gradient of {', '.join(late)} arrived after its unit's backward "
                                   f"had ended (a parameter used outside its unit's forward?)")
            if self.mark_no_grad:  # Note [Parameters without a gradient]: torch's .grad None, per parameter
                for u in self.units:
                    if u.spec.frozen or u.backward_uses == 0:  # a unit without a backward use needs no marks
                        continue
                    for i, p in enumerate(u.spec.params):
                        if id(p) not in self.touched:
                            self._call(_capi.lib.strata_engine_mark_no_grad, u.id, i)
            self._call(_capi.lib.strata_engine_end_micro_batch)
            self.engine.micro_batches += 1
            mark_grads(self.engine)  # Note [Gradients in the engine]
        except BaseException as e:
            self.failed = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.ending = False
            self.phase = IDLE
