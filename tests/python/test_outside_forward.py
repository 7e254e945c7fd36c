"""A sharded model's parameters outside a forward (issue 33, decision 0030): between uses a parameter is an
empty placeholder and its values live in the engine, so what torch would do to it there is refused at the
call, naming the parameter and the way that works, instead of reading nothing or writing into nothing:
reads (p.sum() used to be 0), writes through p.data (lost), model.zero_grad() between a backward and the step
(the engine applied the gradients anyway) and model.to(dtype or device) / .half() / .double() (ignored).
Metadata reads, state_dict and st.GatheredParameters keep working, and every refusal leaves the training
exactly where it was (it then matches torch trained without the refused call)."""
import copy
import re

import pytest
import torch

import strata.torch as st
from common import assert_matches, config, reference_optimizer, reference_train, train
from models import batches, tiny_lm


def sharded(name):
    return rf"strata: parameter '{re.escape(name)}' is sharded"


def assert_matches_torch(engine, ref):
    assert_matches(engine.full_state_dict(), ref.state_dict())


@pytest.mark.parametrize("stage", [0, 3])
def test_writes_through_p_data_are_refused(stage):
    """p.data.zero_() and friends wrote into the empty placeholder (its own version counter, so no later
    check saw them) and were lost; p.data = t and in-place ops on p were refused only at the next forward.
    Each is now refused where it happens, naming the parameter and st.GatheredParameters; nothing changed."""
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage))
    opt = reference_optimizer(ref)
    train(model, engine, 0, 1)
    reference_train(ref, opt, 0, 1)
    p = model.blocks[2].fc2.bias
    version = p._version
    writes = {
        "p.data.zero_()": lambda: p.data.zero_(),
        "p.data.copy_(t)": lambda: p.data.copy_(torch.ones(16)),
        "p.data.fill_(1)": lambda: p.data.fill_(1.0),
        "p.data[0] = 1": lambda: p.data.__setitem__(0, 1.0),
        "p.data += 1": lambda: p.data.__iadd__(1.0),
        "nn.init.normal_(p.data)": lambda: torch.nn.init.normal_(p.data),
        "nn.init.uniform_(p)": lambda: torch.nn.init.uniform_(p),
        "p.zero_() under no_grad": lambda: p.zero_(),
        "p.detach().mul_(2)": lambda: p.detach().mul_(2.0),
        "p.data = t": lambda: setattr(p, "data", torch.ones(16)),
    }
    for what, write in writes.items():
        with torch.no_grad(), pytest.raises(RuntimeError, match=sharded("blocks.2.fc2.bias") +
                                            r".*would be lost.*st\.GatheredParameters\(params, modifier_rank=0\)"):
            write()
            pytest.fail(f"{what} was not refused")
    assert p.shape == (0,) and p._version == version
    train(model, engine, 1, 3)  # the refusals changed nothing: the engine goes on, as torch without the writes
    reference_train(ref, opt, 1, 3)
    assert_matches_torch(engine, ref)
    engine.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_reads_are_refused_metadata_and_gathered_reads_work(stage):
    """p.sum() of a sharded parameter outside a forward was 0 (the empty placeholder), p.norm() 0, p.clone()
    empty: silently wrong. Reads are now refused naming st.GatheredParameters; metadata (shape (0,) as in
    DeepSpeed ZeRO-3, dtype, device, requires_grad), hashing, repr, state_dict and reads inside
    st.GatheredParameters work."""
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    train(model, engine, 0, 1)
    p = model.blocks[1].fc1.weight
    reads = {
        "p.sum()": lambda: p.sum(), "torch.sum(p)": lambda: torch.sum(p), "p.norm()": lambda: p.norm(),
        "p.clone()": lambda: p.clone(), "p.tolist()": lambda: p.tolist(), "p + 1": lambda: p + 1,
        "p.detach().sum()": lambda: p.detach().sum(), "p.data.mean()": lambda: p.data.mean(),
        "p.to(float64)": lambda: p.to(torch.float64), "p.T": lambda: p.T, "p.numpy()": lambda: p.numpy(),
        "torch.save(p)": lambda: torch.save(p, "/dev/null"), "copy.deepcopy(p)": lambda: copy.deepcopy(p),
    }
    for what, read in reads.items():
        with pytest.raises(RuntimeError, match=sharded("blocks.1.fc1.weight") +
                           r".*would read no values.*st\.GatheredParameters"):
            read()
            pytest.fail(f"{what} was not refused")
    with pytest.raises(RuntimeError, match=sharded("pos")):  # the first of model.parameters()
        torch.nn.utils.parameters_to_vector(model.parameters())
    # metadata, identity and the state dict
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad and p.grad is None
    assert p.shape == (0,) and p.numel() == 0 and p.dim() == 1 and p.dtype == torch.float32
    assert p.device.type == "cpu" and p.is_leaf and len({p, model.blocks[1].fc1.bias}) == 2
    assert "sharded" in repr(p) and "(32, 16)" in repr(p) and "blocks.1.fc1.weight" in f"{p}"
    full = engine.full_state_dict()
    assert torch.equal(model.state_dict()["blocks.1.fc1.weight"], full["blocks.1.fc1.weight"])
    with st.GatheredParameters(p):
        assert type(p) is torch.nn.Parameter and torch.equal(p.detach(), full["blocks.1.fc1.weight"])
        assert p.sum().item() == full["blocks.1.fc1.weight"].sum().item()
    with pytest.raises(RuntimeError, match=sharded("blocks.1.fc1.weight")):
        p.sum()  # a placeholder again
    train(model, engine, 1, 2)
    engine.close()
    with pytest.raises(RuntimeError, match=r"'blocks\.1\.fc1\.weight' belonged to an engine that was closed"):
        p.sum()


@pytest.mark.parametrize("stage", [0, 3])
def test_zero_grad_between_backward_and_step_is_refused(stage):
    """model.zero_grad() (p.grad = None) between a backward and engine.step() dropped the .grad markers, and
    the step applied the gradients the engine had already reduced: torch would have applied none. The engine
    cannot drop them, so it is refused, naming when zero_grad works (before the forward, after the step, where
    it is a no-op as in torch); the markers stay and training matches torch."""
    accumulation = 2
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage, accumulation))
    opt = reference_optimizer(ref)
    model.zero_grad()  # nothing accumulated: a no-op
    message = r"model\.zero_grad\(\) \(or p\.grad = None\) between a backward and engine\.step\(\)"
    for step in range(2):
        for m in range(accumulation):
            x, y = batches(step, m, st.rank())
            model(x, y).backward()
            with pytest.raises(RuntimeError, match=message + r".*'pos'.*after engine\.step\(\)"):
                model.zero_grad()
            with pytest.raises(RuntimeError, match=message):
                model.blocks[0].fc1.weight.grad = None
            with pytest.raises(RuntimeError, match=message):
                torch.optim.SGD(model.blocks[2].parameters(), lr=0.1).zero_grad()
            assert all(p.grad is not None for p in model.parameters())
        engine.step()
        model.zero_grad()  # after the step: a no-op, as before the first pass
        reference_train(ref, opt, step, step + 1, accumulation)
    # set by hand: a gradient outside the engine would not be used either
    with pytest.raises(RuntimeError, match=sharded("norm.bias") + r".*\.grad set by hand"):
        model.norm.bias.grad = torch.empty(0)
    # past the refusal (a gathered parameter is a plain one): engine.step() refuses, the gradients stay
    for m in range(accumulation):
        x, y = batches(2, m, st.rank())
        model(x, y).backward()
    with st.GatheredParameters(model.norm):
        model.norm.weight.grad = None
    with pytest.raises(RuntimeError, match=r"the \.grad of 'norm\.weight' was cleared .*between a backward and "
                                           r"engine\.step\(\)"):
        engine.step()
    assert model.norm.weight.grad is not None
    engine.step()  # the engine's gradients were never dropped: this step applies them, as the error says
    reference_train(ref, opt, 2, 3, accumulation)
    assert_matches_torch(engine, ref)
    engine.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_evaluation_forward_between_backward_and_step_keeps_the_gradients(stage):
    """A forward under torch.no_grad() between a backward and engine.step() (a metric logged on the batch
    before the update, as torch allows) ended its units' uses by clearing every .grad, the markers of Note
    [Gradients in the engine] with them, and the step then refused, blaming a model.zero_grad() never
    called. The markers outlive it: the step applies the gradients and training matches torch, whose
    evaluation forward sees the same weights."""
    accumulation = 2
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage, accumulation))
    opt = reference_optimizer(ref)
    for step in range(2):
        for m in range(accumulation):
            x, y = batches(step, m, st.rank())
            model(x, y).backward()
            with torch.no_grad():
                seen, want = model(x, y), ref(x, y)
            assert abs(seen.item() - want.item()) <= 1e-5 * abs(want.item())
            assert all(p.grad is not None for p in model.parameters())
        engine.step()
        reference_train(ref, opt, step, step + 1, accumulation)
    assert_matches_torch(engine, ref)
    engine.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_a_unit_called_directly_between_forward_and_backward_is_refused_and_changes_nothing(stage):
    """A unit's module called directly (under no_grad, to log an activation, say) after a training forward and
    before its backward began a use in the middle of the micro-batch: the engine found it off the recorded schedule
    and failed for good, so the pending backward could not run. It is refused at the call instead, before the
    engine is asked, naming the unit and where the call works; the backward, the step and training then go on as
    torch's, and the same call after the backward computes torch's values."""
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage))
    opt = reference_optimizer(ref)
    h = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))
    x, y = batches(0, 0, st.rank())
    loss = model(x, y)
    for grad in (False, True):
        with torch.set_grad_enabled(grad), pytest.raises(
                RuntimeError, match=r"unit 'blocks\.1' was called directly .* between a training forward and its "
                                    r"backward.*after loss\.backward\(\)"):
            model.blocks[1](h)
    loss.backward()
    with torch.no_grad():  # after the backward (before the step: the weights are still the initial ones)
        assert torch.equal(model.blocks[1](h), ref.blocks[1](h))
    engine.step()
    reference_train(ref, opt, 0, 1)
    train(model, engine, 1, 3)
    reference_train(ref, opt, 1, 3)
    assert_matches_torch(engine, ref)
    engine.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_dtype_and_device_changes_after_shard_are_refused(stage):
    """model.half() / .double() / .to(dtype) / .to(device) after shard() changed the placeholders only and
    the engine went on in its own dtype and device: ignored without a word. Refused before anything changes
    (buffers included), naming the config keys and shard(device=); calls that change nothing still work."""
    model, ref = tiny_lm(), tiny_lm()
    model.register_buffer("scale", torch.ones(3))
    engine = st.shard(model, config(stage))
    opt = reference_optimizer(ref)
    dtype = r"after st\.shard\(\) would change the parameters' dtype from float32 to {}.*set it in the config " \
            r"before st\.shard\(\)"
    device = r"after st\.shard\(\) would move the parameters from cpu to meta.*st\.shard\(model, device="
    refused = {
        "model.half()": (model.half, dtype.format("float16")),
        "model.double()": (model.double, dtype.format("float64")),
        "model.bfloat16()": (model.bfloat16, dtype.format("bfloat16")),
        "model.to(torch.float16)": (lambda: model.to(torch.float16), dtype.format("float16")),
        "model.blocks[0].double()": (lambda: model.blocks[0].double(), r"\(on 'blocks\.0'\) " + dtype.format("float64")),
        "model.to('meta')": (lambda: model.to("meta"), device),
    }
    for what, (call, message) in refused.items():
        with pytest.raises(RuntimeError, match=message):
            call()
            pytest.fail(f"{what} was not refused")
    assert model.scale.dtype == torch.float32  # refused before any buffer was cast
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    for call in (model.float, model.cpu, lambda: model.to("cpu"), lambda: model.to(torch.float32)):
        assert call() is model  # changes nothing: allowed, as on any model
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    assert model.to("cpu") is model and model.pos.grad is not None  # with .grad markers too
    engine.step()
    train(model, engine, 1, 2)
    reference_train(ref, opt, 0, 2)
    assert_matches_torch(engine, ref)
    engine.close()


def test_dtype_changes_with_bf16_parameters():
    """With bf16 parameters the model computes in bf16: model.to(torch.bfloat16) changes nothing and works;
    model.float() would ask for fp32 compute, which the engine would not do: refused."""
    model = tiny_lm()
    engine = st.shard(model, config(3, bf16={"enabled": True}))
    model.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"dtype from bfloat16 to float32"):
        model.float()
    train(model, engine, 0, 1)
    engine.close()


def test_a_parameter_replaced_after_shard_is_refused():
    """`module.bias = nn.Parameter(t)` after shard() trained without a word, and the new bias was never
    updated (the engine holds the sharded one). The next forward refuses it, naming the parameter."""
    model = tiny_lm()
    engine = st.shard(model, config(3))
    train(model, engine, 0, 1)
    model.blocks[2].fc2.bias = torch.nn.Parameter(torch.zeros(16))
    with pytest.raises(RuntimeError, match=r"parameter 'fc2\.bias' of unit .* was replaced"):
        train(model, engine, 1, 2)
    engine.close()


def root_placeholders(engine):
    """Whether every parameter of the root unit is a placeholder again and no direct call holds the root."""
    return all(p.numel() == 0 for r in engine.roots for p in r.spec.params) and engine.tracker.outside == []


@pytest.mark.parametrize("stage", [0, 3])
def test_a_root_module_called_directly_gathers_the_root(stage):
    """Note [The root outside the forward] (decision 0056): the root unit's modules (the final norm, the tied
    embedding and head) called outside the model's forward read placeholders and were refused; they now compute
    torch's values, the root gathered for the call and released after it, also when the call raises. With
    gradients on, a backward through such a call is refused naming the module (no micro-batch holds it);
    between a training forward and its backward nothing is gathered (a use there would be the micro-batch's):
    refused as before. Training then goes on as torch's."""
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage))
    opt = reference_optimizer(ref)
    h = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))
    x, y = batches(0, 0, st.rank())
    with torch.no_grad():
        assert torch.equal(model.norm(h), ref.norm(h))
        assert torch.equal(model.emb(x), ref.emb(x))
        assert torch.equal(model.head(h), ref.head(h))
    assert root_placeholders(engine)
    out = model.norm(h.clone().requires_grad_())
    assert torch.equal(out.detach(), ref.norm(h).detach()) and root_placeholders(engine)
    with pytest.raises(RuntimeError, match=r"module 'norm', which reads the root unit's parameters, ran outside "
                                           r"the model's forward.*model\(\.\.\.\)"):
        out.sum().backward()
    with pytest.raises(IndexError):
        model.emb(torch.tensor([[99]]))  # raises inside the module's forward: the root is released all the same
    assert root_placeholders(engine)
    loss = model(x, y)
    with torch.no_grad(), pytest.raises(RuntimeError, match=sharded("norm.weight")):
        model.norm(h)
    loss.backward()
    engine.step()
    train(model, engine, 1, 2)
    reference_train(ref, opt, 0, 2)
    assert_matches_torch(engine, ref)
    engine.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_a_root_module_inside_gathered_parameters_computes_with_their_values(stage):
    """Inside st.GatheredParameters a root module called directly gathers nothing (that would replace the
    context's values): it computes with the gathered values, an edit included, as before decision 0056; after
    the context the edit is the engine's, and the module's own gather computes with it."""
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    h = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))
    with st.GatheredParameters(model.norm, modifier_rank=0):
        with torch.no_grad():
            model.norm.weight.mul_(2.0)
            want = torch.nn.functional.layer_norm(h, (16,), model.norm.weight, model.norm.bias)
            assert torch.equal(model.norm(h), want)
    assert root_placeholders(engine)
    with torch.no_grad():
        assert torch.equal(model.norm(h), want)
    engine.close()


def test_ranks_calling_different_modules_directly_fail_alike_at_stage_3():
    """At stage 3 a direct call's gather is agreed across ranks (Note [Agreed schedule]), the root's as a unit's:
    ranks that call different modules fail at once on every rank, naming what each was about to gather, instead
    of gathering different units into one collective."""
    if st.world_size() < 2:
        pytest.skip("needs two ranks")
    model = tiny_lm()
    engine = st.shard(model, config(3))
    h = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"took different paths through the model in an "
                                                           r"evaluation forward.*unit 'root'.*unit 'blocks\.0'"):
        model.norm(h) if st.rank() == 0 else model.blocks[0](h)
    engine.close()
