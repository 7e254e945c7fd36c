"""Bad use is a clear error on every rank (every rank runs the same code, so every rank raises), never a
hang or a silently wrong result."""
import pytest
import torch

import strata.torch as st
from common import assert_matches, config, reference_optimizer, reference_train, train
from models import TinyLM, batches, tiny_lm


class LeakyLM(TinyLM):
    """Uses a block's parameter in the root's code, outside the block."""

    def forward(self, x, labels):
        return super().forward(x, labels) + 0.0 * self.blocks[1].fc1.weight.sum()


@pytest.mark.parametrize("stage", [0, 3])
def test_param_used_outside_its_unit(stage):
    torch.manual_seed(0)
    model = LeakyLM()
    engine = st.shard(model, config(stage))
    x, y = batches(0, 0, st.rank())
    with pytest.raises(RuntimeError, match=r"parameter 'fc1.weight' of unit 'blocks.1' is used outside its unit"):
        model(x, y)
    with pytest.raises(RuntimeError, match="an earlier forward or backward failed"):
        model(x, y)
    engine.close()


def test_step_without_backward():
    model = tiny_lm()
    engine = st.shard(model, config(3, accumulation=2))
    with pytest.raises(RuntimeError, match=r"step\(\) after 0 completed backward passes"):
        engine.step()
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    with pytest.raises(RuntimeError, match=r"step\(\) after 1 completed backward passes .*gradient_accumulation_steps=2"):
        engine.step()
    loss = model(x, y)
    with pytest.raises(RuntimeError, match=r"phase 'await-backward'"):
        engine.step()
    loss.backward()
    assert engine.step()["step"] == 1  # the refusals changed nothing: the engine goes on
    engine.close()


def test_forward_twice_before_backward():
    model = tiny_lm()
    engine = st.shard(model, config(2))
    x, y = batches(0, 0, st.rank())
    model(x, y)
    with pytest.raises(RuntimeError, match="forward was called again in phase 'await-backward'"):
        model(x, y)
    engine.close()


def test_one_loss_of_two_forwards_names_the_fix():
    """A loss made of two forwards' outputs (a siamese or contrastive model) is refused; the error names the fix
    (one forward of the concatenated inputs), not summing the losses into one backward, which is this very use."""
    model = tiny_lm()
    engine = st.shard(model, config(3))
    x, y = batches(0, 0, st.rank())
    first = model(x, y)
    with pytest.raises(RuntimeError, match="concatenate their inputs into one forward") as refused:
        first + model(x, y)
    assert "sum their losses" not in str(refused.value)
    engine.close()


def test_config_without_optimizer_warns():
    """A config without "optimizer" (LLaMA-Factory's and axolotl's ZeRO configs, made for a Trainer that brings
    its own) trains with Strata's default AdamW at lr 1e-3: said at shard(), with the values, not silently."""
    cfg = config(3)
    del cfg["optimizer"]
    with pytest.warns(UserWarning, match=r'no "optimizer", so the engine trains with .*AdamW, lr 0.001'):
        engine = st.shard(tiny_lm(), cfg)
    engine.close()


def test_use_after_close_names_it():
    """A forward or step() after engine.close() names the close, not a NULL engine handle."""
    model = tiny_lm()
    engine = st.shard(model, config(3))
    engine.close()
    x, y = batches(0, 0, st.rank())
    with pytest.raises(RuntimeError, match=r"the model's forward after engine.close\(\)"):
        model(x, y)
    with pytest.raises(RuntimeError, match=r"step\(\) after engine.close\(\)"):
        engine.step()


@pytest.mark.parametrize("factory", [False, True])
def test_bf16_parameters_name_the_fix(factory):
    """A model built or loaded in bf16 (from_pretrained(dtype=torch.bfloat16), or transformers' from_config of a
    bf16 checkpoint's config) is refused naming the parameter and how to give it in fp32 with bf16.enabled."""
    def build():
        return tiny_lm().to(torch.bfloat16)
    match = (r"parameter '[\w.]+' is torch.bfloat16; give st.shard a model with fp32 parameters.*"
             r"from_config\(cfg, dtype=torch.float32\).*bf16.enabled")
    with pytest.raises(TypeError, match=match):
        st.shard(build if factory else build(), config(3, bf16={"enabled": True}))


@pytest.mark.parametrize("stage", [0, 3])
def test_requires_grad_changed_after_shard(stage):
    """Frozenness is fixed at shard(): freezing a trainable parameter (or unfreezing a frozen one) afterwards
    would be ignored (the "frozen" weight kept moving), so the next forward refuses it, naming the parameter,
    and the engine goes on once it is set back."""
    model = tiny_lm()
    model.blocks[0].fc1.bias.requires_grad_(False)
    engine = st.shard(model, config(stage))
    x, y = batches(0, 0, st.rank())
    model.blocks[1].fc2.weight.requires_grad_(False)
    with pytest.raises(RuntimeError, match=r"parameter 'fc2.weight' of unit 'blocks.1' was trainable .* at shard\(\)"):
        model(x, y)
    model.blocks[1].fc2.weight.requires_grad_(True)
    model.blocks[0].fc1.bias.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"parameter 'fc1.bias' of unit 'blocks.0\[frozen\]' was frozen"):
        model(x, y)
    model.blocks[0].fc1.bias.requires_grad_(False)
    model(x, y).backward()
    assert engine.step()["step"] == 1
    engine.close()


def test_shard_twice_is_refused_naming_it():
    """A model given to st.shard() once: a second shard() says so (it used to fail on the placeholders'
    dimension 0 and leave a half-built engine that raised at exit), and the first engine trains on."""
    model = tiny_lm()
    engine = st.shard(model, config(3))
    with pytest.raises(RuntimeError, match=r"already given to st.shard\(\)"):
        st.shard(model, config(3))
    x, y = batches(0, 0, st.rank())
    model(x, y).backward()
    assert engine.step()["step"] == 1
    engine.close()


class _RenormingLookup(torch.nn.Module):
    def __init__(self, frozen):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16, max_norm=0.5)  # renormalises the looked-up rows in place
        self.emb.weight.requires_grad_(not frozen)
        self.out = torch.nn.Linear(16, 50)

    def forward(self, x):
        return self.out(self.emb(x)).logsumexp(-1).mean()


@pytest.mark.parametrize("stage", [0, 3])
@pytest.mark.parametrize("frozen", [False, True])
def test_a_forward_that_writes_its_own_weight_is_refused_naming_it(stage, frozen):
    """nn.Embedding(max_norm=...) writes its weight in the forward: at stages 0-2 into the engine's storage on
    this rank alone (the ranks look up different rows), at stage 3 into a gathered copy, whose write is lost.
    The next forward refuses it (Note [Writes outside a forward]), naming the parameter and this cause."""
    torch.manual_seed(0)
    model = _RenormingLookup(frozen)
    engine = st.shard(model, config(stage))
    x = torch.randint(0, 50, (4, 8), generator=torch.Generator().manual_seed(st.rank()))
    model(x).backward()
    engine.step()
    with pytest.raises(RuntimeError, match=r"parameter 'emb\.weight' of unit .* was written where the engine does "
                                           r"not see it: .*in place by the model's own forward \(nn\.Embedding "
                                           r"with max_norm"):
        model(x)
    engine.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_writes_outside_a_forward_are_refused(stage):
    """nn.init or an in-place op on a sharded parameter, or an assignment to its .data, used to be lost
    silently (the values live in the engine). Each is refused where it is made (Note [Parameters between
    uses]); one made past that (torch's __torch_function__ off) is refused by the next forward (Note [Writes
    outside a forward]), naming the parameter and st.GatheredParameters, whose edit does reach the engine."""
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    x, y = batches(0, 0, st.rank())
    with pytest.raises(RuntimeError, match=r"parameter 'blocks\.2\.fc2\.bias' is sharded.*would be lost"):
        torch.nn.init.zeros_(model.blocks[2].fc2.bias)
    with torch._C.DisableTorchFunction():
        torch.nn.init.zeros_(model.blocks[2].fc2.bias)
    with pytest.raises(RuntimeError, match=r"parameter 'fc2.bias' of unit 'blocks.2' was written where the engine "
                                           r"does not see it: between forwards"):
        model(x, y)
    engine.close()
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    with pytest.raises(RuntimeError, match=r"parameter 'norm\.weight' is sharded.*an assignment to p\.data"):
        model.norm.weight.data = torch.ones(16)
    with torch._C.DisableTorchFunction():
        model.norm.weight.data = torch.ones(16)
    with pytest.raises(RuntimeError, match=r"parameter 'norm.weight' of unit 'root' was written where the engine "
                                           r"does not see it: between forwards"):
        model(x, y)
    engine.close()
    model = tiny_lm()
    engine = st.shard(model, config(stage))
    with st.GatheredParameters(model.blocks[2].fc2.bias, modifier_rank=0):
        torch.nn.init.zeros_(model.blocks[2].fc2.bias)
    model(x, y).backward()  # the edit went through the engine: no refusal
    engine.step()
    engine.close()


def test_mismatched_models_across_ranks():
    if st.world_size() == 1:
        pytest.skip("needs two ranks")
    torch.manual_seed(0)
    model = TinyLM(d=16 if st.rank() == 0 else 24)  # rank 0 differs from the others
    with pytest.raises(st.StrataError, match="STRATA_ERR_INVALID_ARGUMENT|STRATA_ERR_FAILED_PRECONDITION") as e:
        st.shard(model, config(3))
    assert "root" in str(e.value) or "blocks" in str(e.value), str(e.value)


def test_evaluation_forward_is_not_a_micro_batch():
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(3))
    x, y = batches(0, 0, st.rank())
    with torch.no_grad():
        loss = model(x, y)
    assert torch.equal(loss, ref(x, y))  # the same parameters, the same arithmetic
    with pytest.raises(RuntimeError, match="step"):
        engine.step()  # an evaluation pass is no micro-batch
    engine.close()


def test_parameter_shared_by_two_units_is_refused():
    model = tiny_lm()
    model.blocks[1].fc1.weight = model.blocks[0].fc1.weight
    with pytest.raises(ValueError, match="'blocks.1.fc1.weight' is shared by units 'blocks.0' and 'blocks.1'"):
        st.shard(model, config(3))


@pytest.mark.parametrize("stage", [0, 3])
def test_backward_through_a_unit_called_outside_the_models_forward_names_it(stage):
    """A unit's module called directly with gradients on (a custom head on model.blocks, a backbone call) runs
    outside the model's forward, so no micro-batch begins and its parameters are placeholders again once it
    returns: a backward through it failed inside autograd with torch's "The size of tensor a (0) must match
    the size of tensor b (16)". It names the unit and the fix; the forward itself, and one under no_grad,
    still work, and training through the model's forward then goes on as torch's."""
    model, ref = tiny_lm(), tiny_lm()
    engine = st.shard(model, config(stage))
    h = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.allclose(model.blocks[0](h), ref.blocks[0](h))
    out = model.blocks[0](h.requires_grad_())
    assert torch.allclose(out.detach(), ref.blocks[0](h).detach())
    with pytest.raises(RuntimeError, match=r"unit 'blocks\.0' ran outside the model's forward.*model\(\.\.\.\)"):
        out.sum().backward()
    opt = reference_optimizer(ref)
    train(model, engine, 0, 2)
    reference_train(ref, opt, 0, 2)
    assert_matches(engine.full_state_dict(), ref.state_dict())
    engine.close()
