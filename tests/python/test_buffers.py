"""Module buffers (docs/decisions/0026-buffers.md): BatchNorm1d/2d running statistics and counters, and a
buffer the training loss depends on, kept as DDP keeps them (strata.broadcast_buffers), cast with bf16
parameters, checkpointed and restored bit for bit, returned by full_state_dict as rank 0's.

What the equivalence test compares. Each rank's BatchNorm normalises with the statistics of its own
micro-batch, so the engine is not plain torch on the global batch; it is DDP with broadcast_buffers=True:
every training forward starts from rank 0's buffers, and rank 0's update is the one kept. The reference
is single-process torch doing exactly that: for each micro-batch index, every rank's micro-batch is run,
starting from the same buffers (each its own BatchNorm batch statistics and loss, the gradients summed
with weight 1 / (ranks x micro-batches) as the engine averages), and the buffers after rank 0's forward
are the next start. Centering's running mean enters the loss in training mode too, so a rank computing
with its own drifting buffers would train differently (BatchNorm's running statistics alone only show
in evaluation). Compared after 10 steps: parameters and floating buffers within 1e-5 (decision 0003's
measure), counters exactly, every rank's buffers bit for bit rank 0's, and an evaluation forward giving
the same loss on every rank. With strata.broadcast_buffers false the reference keeps one buffer stream
per rank, and each rank's buffers must follow its own."""
import os

import pytest
import torch
from torch import nn

import strata.torch as st
from strata._capi import StrataError
from strata.torch import _model_buffers
from common import config, reference_optimizer, rel_errors, shared_dir, world

STEPS = 10


class Centering(nn.Module):
    """x minus a running mean of x that training updates and uses (a buffer the loss depends on), times a
    non-persistent scale buffer; `calls` counts training forwards."""

    def __init__(self, d, momentum=0.25):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running_mean", torch.zeros(d))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("scale", torch.ones(d), persistent=False)

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(x.mean(0).to(self.running_mean.dtype),
                                                               alpha=self.momentum)
                self.calls += 1
        return (x - self.running_mean) * self.scale


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)  # a bias before a BatchNorm has zero gradient
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))).flatten(1)


class MLPBlock(nn.Module):
    def __init__(self, d_in, d):
        super().__init__()
        self.fc = nn.Linear(d_in, d, bias=False)
        self.bn = nn.BatchNorm1d(d)
        self.center = Centering(d)

    def forward(self, x):
        return nn.functional.gelu(self.center(self.bn(self.fc(x))))


class Net(nn.Module):
    """Conv + BatchNorm2d, then Linear + BatchNorm1d + Centering blocks (the units), a root BatchNorm1d with
    momentum=None (its running statistics a cumulative average over num_batches_tracked) and a head."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([ConvBlock(), MLPBlock(64, 16), MLPBlock(16, 16)])
        self.norm = nn.BatchNorm1d(16, momentum=None)
        self.head = nn.Linear(16, 5)

    def forward(self, x, y):
        h = x.to(self.head.weight.dtype)  # bf16 parameters: the input too
        for layer in self.layers:
            h = layer(h)
        return nn.functional.cross_entropy(self.head(self.norm(h)).float(), y)


def net(seed=0):
    torch.manual_seed(seed)
    m = Net()
    with torch.no_grad():  # random BatchNorm affine parameters and non-trivial starting buffers
        for name, p in m.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif ".bn." in name or name.startswith("norm."):
                p.normal_(1.0, 0.1)
        for layer in m.layers[1:]:
            layer.center.scale.uniform_(0.5, 1.5)
    return m


def batch(step, micro, rank, n=4):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + rank)
    return torch.randn(n, 3, 4, 4, generator=g) * 2 + 0.5, torch.randint(0, 5, (n,), generator=g)


def buffers_of(model):
    return {k: v.detach().clone() for k, v in model.named_buffers()}


def set_buffers(model, values):
    with torch.no_grad():
        for k, v in model.named_buffers():
            v.copy_(values[k])


def reference_step(ref, opt, step, world, accumulation, own=None):
    """One step of DDP semantics in one process (the module docstring). own: None for broadcast_buffers
    true, else each rank's own buffers (a list, updated)."""
    for m in range(accumulation):
        start = buffers_of(ref)
        for r in range(world):
            set_buffers(ref, start if own is None else own[r])
            x, y = batch(step, m, r)
            (ref(x, y) / (world * accumulation)).backward()
            if own is not None:
                own[r] = buffers_of(ref)
            elif r == 0:
                after_rank0 = buffers_of(ref)
        set_buffers(ref, after_rank0 if own is None else own[0])
    opt.step()
    opt.zero_grad()


def train(model, engine, first, last, accumulation=1):
    log = []
    for step in range(first, last):
        for m in range(accumulation):
            loss = model(*batch(step, m, st.rank()))
            loss.backward()
            log.append(loss.item())
        log.append(engine.step()["grad_norm"])
    return log


def from_rank0(x):
    return world().bcast(x if st.rank() == 0 else None, root=0)


def on_rank0(fn):
    """fn() on rank 0 (a file operation), then every rank: its exception fails the test on every rank."""
    error = None
    if st.rank() == 0:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
    error = from_rank0(error)
    assert error is None, f"on rank 0: {error}"


class Expect:
    """Checks of one rank's own values, reported at the end of the test on every rank: a rank whose check
    fails still takes part in the test's later collectives (a plain assert would leave its peers waiting)."""

    def __init__(self):
        self.failures = []

    def __call__(self, ok, why):
        if not ok:
            self.failures.append(f"rank {st.rank()}: {why}")

    def done(self):
        failures = sum(world().allgather(self.failures), [])
        assert not failures, "\n".join(failures)


def same_as_rank0(expect, tensors, what):
    """Every rank's `tensors` (a dict) bit for bit rank 0's."""
    mine = {k: v.cpu() for k, v in tensors.items()}
    theirs = from_rank0(mine)
    differ = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    expect(not differ, f"{what} differ from rank 0's: {differ}")


def config_with(stage, broadcast=None, accumulation=1, **extra):
    cfg = config(stage, accumulation, **extra)
    if broadcast is not None:
        cfg["strata"]["broadcast_buffers"] = broadcast
    return cfg


def eval_loss(model):
    model.eval()
    with torch.no_grad():
        loss = model(*batch(99, 0, 0)).item()
    model.train()
    return loss


VARIANTS = {"plain": (1, None), "accumulate": (2, None), "own-buffers": (1, False)}


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_torch_with_ddp_buffer_semantics(stage, variant):
    accumulation, broadcast = VARIANTS[variant]
    if variant != "plain" and stage in (1, 2):
        pytest.skip("the variants at stages 0 and 3")
    model, ref = net(), net()
    engine = st.shard(model, config_with(stage, broadcast, accumulation))
    opt = reference_optimizer(ref)
    own = None if broadcast is None else [buffers_of(ref) for _ in range(st.world_size())]
    for step in range(STEPS):
        train(model, engine, step, step + 1, accumulation)
        reference_step(ref, opt, step, st.world_size(), accumulation, own)
    expect = Expect()
    state, ref_state = engine.full_state_dict(), ref.state_dict()
    expect(set(state) == set(ref_state), f"names {sorted(set(state) ^ set(ref_state))}")
    floats = [k for k, v in ref_state.items() if v.is_floating_point()]
    errors = rel_errors({k: state[k] for k in floats}, {k: ref_state[k] for k in floats})
    worst = max(errors, key=errors.get)
    expect(errors[worst] <= 1e-5, f"{worst}: relative L2 error {errors[worst]:.3g}")
    counters = [k for k in ref_state if k not in floats]
    expect(len(counters) == 6 and all(torch.equal(state[k], ref_state[k]) for k in counters),
           f"counters {[(k, state[k].item(), ref_state[k].item()) for k in counters]}")
    expect(state["norm.num_batches_tracked"].item() == STEPS * accumulation, "norm.num_batches_tracked")
    start = net().state_dict()
    expect(all(not torch.equal(state[k], start[k]) for k in ref_state), "a tensor did not move")
    local = buffers_of(model)
    if broadcast is None:
        same_as_rank0(expect, local, "buffers")
        losses = world().allgather(eval_loss(model))
        expect(len(set(losses)) == 1, f"evaluation losses differ over ranks: {losses}")
        expect(abs(losses[0] - eval_loss(ref)) <= 1e-5 * abs(losses[0]), "evaluation loss differs from torch's")
    else:  # each rank its own: its buffers follow the reference's stream of that rank
        for k, v in local.items():
            ref_v = own[st.rank()][k]
            close = (((v - ref_v).norm() / ref_v.norm()).item() <= 1e-5 if v.is_floating_point()
                     else torch.equal(v, ref_v))
            expect(close, f"{k} is not this rank's own stream")
        theirs = from_rank0(local)  # the ranks' running statistics did drift apart, as asked
        expect(st.rank() == 0 or not torch.equal(local["norm.running_mean"], theirs["norm.running_mean"]),
               "the same running statistics as rank 0 with broadcast_buffers false")
    engine.close()
    expect.done()


@pytest.mark.parametrize("broadcast", [None, False])  # None: the key left out (true)
def test_shard_gives_every_rank_rank0s_buffers(broadcast):
    """At shard(), whatever strata.broadcast_buffers says: persistent and non-persistent buffers alike."""
    model = net()
    with torch.no_grad():
        for b in model.buffers():
            b.add_(st.rank() + 1)  # each rank different
    before = buffers_of(model)
    expected = from_rank0(before)
    st.shard(model, config_with(3, broadcast)).close()
    after = buffers_of(model)
    expect = Expect()
    expect(all(torch.equal(after[k], expected[k]) for k in expected), "buffers are not rank 0's")
    expect(st.rank() == 0 or not torch.equal(after["layers.1.center.scale"], before["layers.1.center.scale"]),
           "a non-persistent buffer was not broadcast")
    expect.done()


def test_full_state_dict_holds_rank0s_buffers():
    """With broadcast_buffers false the ranks' buffers differ; full_state_dict still gives rank 0's on
    every rank (and does not change the ranks' own)."""
    model = net()
    engine = st.shard(model, config_with(2, False))
    train(model, engine, 0, 3)
    local = buffers_of(model)
    state = engine.full_state_dict()
    persistent = [k for k in local if not k.endswith("scale")]
    assert set(persistent) <= set(state) and not any(k.endswith("scale") for k in state)
    expect = Expect()
    rank0 = from_rank0(local)
    expect(all(torch.equal(state[k], rank0[k]) for k in persistent), "full_state_dict's buffers are not rank 0's")
    expect(st.rank() == 0 or not torch.equal(local["norm.running_mean"], rank0["norm.running_mean"]),
           "the ranks' own buffers did not differ: the test would not test anything")
    expect(all(torch.equal(v, local[k]) for k, v in buffers_of(model).items()), "full_state_dict changed buffers")
    engine.close()
    expect.done()


def test_bf16_batchnorm_trains():
    """bf16 parameters: the floating buffers are bf16 as well (where model.to(torch.bfloat16) casts),
    num_batches_tracked stays int64, and the model trains (before: torch's 'expected scalar type
    BFloat16 but found Float' in the first BatchNorm)."""
    model = net()
    cfg = config_with(3, bf16={"enabled": True})
    cfg["optimizer"]["params"]["lr"] = 1e-2
    engine = st.shard(model, cfg)
    bufs = dict(model.named_buffers())
    assert bufs["layers.0.bn.running_mean"].dtype == torch.bfloat16
    assert bufs["layers.1.center.scale"].dtype == torch.bfloat16
    assert bufs["norm.num_batches_tracked"].dtype == torch.int64
    losses = []
    for step in range(STEPS):
        x, y = batch(0, 0, st.rank())  # one batch, again and again: its loss must fall
        loss = model(x, y)
        loss.backward()
        engine.step()
        losses.append(st.all_reduce_mean(loss.item()))
    assert losses[-1] < 0.9 * losses[0], losses
    assert bufs["norm.num_batches_tracked"].item() == STEPS
    expect = Expect()
    same_as_rank0(expect, buffers_of(model), "bf16 buffers")
    state = engine.full_state_dict()
    assert state["layers.2.bn.running_var"].dtype == torch.bfloat16
    losses = world().allgather(eval_loss(model))
    expect(len(set(losses)) == 1, f"evaluation losses differ over ranks: {losses}")
    engine.close()
    expect.done()


def checkpoint_run(root, stage, save_at=3, steps=6):
    model = net()
    engine = st.shard(model, config_with(stage))
    train(model, engine, 0, save_at)
    saved = engine.full_state_dict()
    engine.save_checkpoint(root, {"next_step": save_at})
    after = train(model, engine, save_at, steps)
    final = engine.full_state_dict()
    engine.close()
    return saved, after, final


def fresh(stage, seed=7):
    """Another model (other initial values, other persistent buffers on each rank): all of it must be
    restored by the checkpoint. Its non-persistent buffers are those the model's constructor makes (net(0)'s):
    as in torch, they are not in a state dict or a checkpoint."""
    model, made = net(seed), net(0)
    with torch.no_grad():
        for (k, b), made_b in zip(model.named_buffers(), made.buffers()):
            b.copy_(made_b) if k.endswith("scale") else b.add_(st.rank() + 3)
    return model, st.shard(model, config_with(stage))


@pytest.mark.parametrize("stage", [1, 3])
def test_resume_restores_buffers_bit_for_bit(stage, tmp_path):
    root = shared_dir(tmp_path)
    saved, after, final = checkpoint_run(root, stage)
    step_dir = os.path.join(root, "step_00000003")
    assert os.path.isfile(os.path.join(step_dir, _model_buffers.FILE_NAME))
    model, engine = fresh(stage)
    assert engine.load_checkpoint(root) == {"next_step": 3}
    expect = Expect()
    local = buffers_of(model)
    for k, v in saved.items():
        if k in local:
            expect(torch.equal(local[k], v), f"{k} not restored")
    expect(local["layers.0.bn.num_batches_tracked"].item() == 3 and local["layers.1.center.calls"].item() == 3,
           "counters not restored")
    expect(train(model, engine, 3, 6) == after, "the resumed losses and gradient norms differ")
    state = engine.full_state_dict()
    expect(all(torch.equal(state[k], final[k]) for k in final), "the resumed run ends elsewhere")
    engine.close()
    expect.done()


def test_checkpoint_without_buffers_loads_with_a_warning(tmp_path):
    """A step directory of the older format (no buffers file): the engine's state loads, the buffers
    stay as they were, rank 0's on every rank, and every rank is warned."""
    root = shared_dir(tmp_path)
    saved, _, _ = checkpoint_run(root, 2)
    on_rank0(lambda: os.unlink(os.path.join(root, "step_00000003", _model_buffers.FILE_NAME)))
    model, engine = fresh(2)
    expected = from_rank0(buffers_of(model))
    with pytest.warns(RuntimeWarning, match="holds no module buffers"):
        engine.load_checkpoint(root)
    local = buffers_of(model)
    expect = Expect()
    expect(all(torch.equal(local[k], expected[k]) for k in local), "buffers are not rank 0's")
    state = engine.full_state_dict()
    assert torch.equal(state["head.weight"], saved["head.weight"])
    engine.close()
    expect.done()


def _rewrite(step_dir, edit):
    """Rank 0 replaces the buffers file by `edit` of its tensors, written as strata writes it."""
    def run():
        path = os.path.join(step_dir, _model_buffers.FILE_NAME)
        named = edit(_model_buffers.read_file(path, _expected(path)))
        _model_buffers.write_file(step_dir, list(named.items()))
    on_rank0(run)


def _expected(path):
    """The file's own names, shapes and dtypes (read without a model, for the rewriting above)."""
    import json
    import struct
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__")
    return {k: (tuple(v["shape"]), _model_buffers._DTYPES[v["dtype"]]) for k, v in header.items()}


def _raw(step_dir, edit):
    def run():
        path = os.path.join(step_dir, _model_buffers.FILE_NAME)
        with open(path, "rb") as f:
            data = bytearray(f.read())
        with open(path, "wb") as f:
            f.write(edit(data))
    on_rank0(run)


def _put(step_dir, data):
    with open(os.path.join(step_dir, _model_buffers.FILE_NAME), "wb") as f:
        f.write(data)


def test_bad_buffers_file_is_refused_on_every_rank(tmp_path):
    """The buffers file is untrusted input: each defect is refused with the same error on every rank,
    before the engine or the model changes. A floating dtype other than the model's is cast (fp64 here)."""
    root = shared_dir(tmp_path)
    saved, _, _ = checkpoint_run(root, 3)
    step_dir = os.path.join(root, "step_00000003")
    with open(os.path.join(step_dir, _model_buffers.FILE_NAME), "rb") as f:  # every rank: all fail alike
        good = f.read()
    model, engine = fresh(3)
    before, start = buffers_of(model), engine.full_state_dict()

    def drop(t):
        t.pop("norm.running_var")
        return t

    def reshape(t):
        t["norm.running_var"] = torch.ones(17)
        return t

    def extra(t):
        t["norm.other"] = torch.ones(2)
        return t

    def as_int(t):
        t["layers.0.bn.running_mean"] = t["layers.0.bn.running_mean"].to(torch.int32)
        return t

    def counter_as_float(t):
        t["layers.0.bn.num_batches_tracked"] = t["layers.0.bn.num_batches_tracked"].double()
        return t

    def flip_data_byte(d):
        d[-1] ^= 1
        return d

    def huge_header(d):
        d[:8] = (len(d)).to_bytes(8, "little")
        return d

    def bad_offsets(d):
        return d.replace(b'"data_offsets":[0,', b'"data_offsets":[1,', 1)

    cases = [(_rewrite, drop, "missing norm.running_var"), (_rewrite, reshape, "has shape [17]; the model's is [16]"),
             (_rewrite, extra, "unexpected norm.other"),
             (_rewrite, as_int, "is torch.int32; the model's is torch.float32"),
             (_rewrite, counter_as_float, "is torch.float64; the model's is torch.int64"),
             (_raw, flip_data_byte, "does not match its sha256"), (_raw, huge_header, "exceeds the file"),
             (_raw, bad_offsets, "data_offsets"), (_raw, lambda d: d[:-3], "data_offsets"),
             (_raw, lambda d: d[:5], "shorter than the 8-byte header length"),
             (_raw, lambda d: d[:8] + b"x" + d[9:], "not a JSON document")]
    expect = Expect()
    for how, edit, message in cases:
        on_rank0(lambda: _put(step_dir, good))
        how(step_dir, edit)
        with pytest.raises(ValueError, match="checkpoint buffers") as e:
            engine.load_checkpoint(root)
        assert message in str(e.value), str(e.value)
        expect(from_rank0(str(e.value)) == str(e.value), f"not rank 0's error: {e.value}")
        expect(all(torch.equal(v, before[k]) for k, v in buffers_of(model).items()), f"buffers changed ({message})")
    state = engine.full_state_dict()  # nor the engine's state
    assert all(torch.equal(state[k], start[k]) for k in start)

    def as_f64(t):
        return {k: v.double() if v.is_floating_point() else v for k, v in t.items()}

    on_rank0(lambda: _put(step_dir, good))
    _rewrite(step_dir, as_f64)
    engine.load_checkpoint(root)
    local = buffers_of(model)
    expect(all(torch.equal(local[k], saved[k]) for k in local if k in saved), "fp64 buffers not loaded")
    engine.close()
    expect.done()


def test_save_is_published_only_with_its_buffers(tmp_path):
    """Crash safety: a save whose buffers rank 0 cannot write is not published on any rank; a step
    directory with buffers but no manifest (a save that died after them) is not loaded; a dead save's
    temporary is removed by the next save."""
    root = shared_dir(tmp_path)
    model = net()
    engine = st.shard(model, config_with(3))
    train(model, engine, 0, 2)
    step2 = os.path.join(root, "step_00000002")
    stale = os.path.join(step2, _model_buffers.FILE_NAME + ".tmp.123")  # a dead save's temporary
    on_rank0(lambda: (os.makedirs(step2), open(stale, "w").close()))
    engine.save_checkpoint(root)
    saved = engine.full_state_dict()
    assert not os.path.exists(stale)
    train(model, engine, 2, 3)
    step3 = os.path.join(root, "step_00000003")
    on_rank0(lambda: os.makedirs(os.path.join(step3, _model_buffers.FILE_NAME, "x")))  # rank 0 cannot write it
    with pytest.raises(StrataError, match="STRATA_ERR_IO: .*was not published: rank 0 could not write the model's "
                       "buffers"):  # the engine's error type, as every other save failure
        engine.save_checkpoint(root)
    assert not os.path.exists(os.path.join(step3, "manifest.json"))
    train(model, engine, 3, 4)
    engine.model_buffers.save(os.path.join(root, "step_00000004"))  # the buffers, and then a crash
    model2, engine2 = fresh(3)
    engine2.load_checkpoint(root)
    state = engine2.full_state_dict()
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    expect = Expect()
    expect(buffers_of(model2)["norm.num_batches_tracked"].item() == 2, "not step 2's buffers")
    engine.close()
    engine2.close()
    expect.done()


def test_broadcast_buffers_must_be_a_bool():
    with pytest.raises(ValueError, match="'strata.broadcast_buffers' must be true or false"):
        st.shard(net(), config_with(0, "yes"))
