"""generate() of a sharded transformers model (README: at stage 3 a forward outside training is collective,
so every rank runs it) gives the tokens of the same model unsharded, greedy. An encoder-decoder model's
generate() runs its encoder through model.get_encoder() outside the model's forward; the encoder reads the root
unit's parameters (the shared embedding, and by default the encoder's layers), which that call gathers for
itself and releases after (Note [The root outside the forward] in strata/torch/_hooks.py,
docs/decisions/0056-root-outside-the-forward.md)."""
import pytest
import torch

import strata.torch as st
from common import config
from models import HF_VOCAB, hf_builders

# generate()'s arguments beyond the prompt: T5's config names no decoder start token (its generate() needs one)
ENC_DEC = {"t5": {"decoder_start_token_id": 0}, "bart": {}}


def greedy(model, **kw):
    model.eval()
    with torch.no_grad():
        out = model.generate(**kw, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    model.train()
    return out


def prompt():
    return torch.randint(0, HF_VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))


def sharded_and_plain(name, stage):
    """hf_builders()[name] built twice from one seed: one sharded at `stage` (with its engine), one plain."""
    build = hf_builders()[name]
    torch.manual_seed(0)
    model = build()
    torch.manual_seed(0)
    plain = build()
    return model, plain, st.shard(model, config(stage))


def root_params(engine):
    return [p for r in engine.roots for p in r.spec.params]


@pytest.mark.parametrize("stage", [0, 3])
def test_decoder_only_generate_matches_the_plain_model(stage):
    model, plain, engine = sharded_and_plain("llama", stage)
    assert torch.equal(greedy(model, input_ids=prompt()), greedy(plain, input_ids=prompt()))
    engine.close()


@pytest.mark.parametrize("name", sorted(ENC_DEC))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_encoder_decoder_generate_matches_the_plain_model(name, stage):
    """Was refused (the encoder read the placeholder of T5's 'shared.weight'); the tokens are now the plain
    model's, and the root's parameters are placeholders again afterwards."""
    model, plain, engine = sharded_and_plain(name, stage)
    try:
        got = greedy(model, input_ids=prompt(), **ENC_DEC[name])
        assert all(p.numel() == 0 for p in root_params(engine)) and engine.tracker.outside == []
    finally:
        model.train()
        engine.close()
    assert torch.equal(got, greedy(plain, input_ids=prompt(), **ENC_DEC[name]))


@pytest.mark.parametrize("name", sorted(ENC_DEC))
@pytest.mark.parametrize("stage", [0, 3])
def test_the_encoder_called_directly_gathers_the_root_once(name, stage):
    """model.get_encoder()(...) alone gives the plain model's encoder output; the root is gathered once for the
    call (not once per module inside it that reads it) and released when it returns."""
    model, plain, engine = sharded_and_plain(name, stage)
    model.eval()
    plain.eval()
    begun, begin = [], engine.tracker.begin_forward
    engine.tracker.begin_forward = lambda u: (begun.append(u.spec.name), begin(u))[1]
    with torch.no_grad():
        got = model.get_encoder()(input_ids=prompt()).last_hidden_state
        want = plain.get_encoder()(input_ids=prompt()).last_hidden_state
    assert torch.equal(got, want)
    assert [n for n in begun if n == "root"] == ["root"]
    assert all(p.numel() == 0 for p in root_params(engine)) and engine.tracker.outside == []
    engine.close()


@pytest.mark.parametrize("stage", [0, 3])
def test_a_lora_encoder_decoder_generate_matches_the_plain_model(stage):
    """peft's LoRA on T5: the root has a trainable and a frozen part (both gathered for a direct call), and
    PeftModelForSeq2SeqLM.generate() runs the inner T5's generate(), whose decoder steps call the inner model, not
    the sharded model's forward: those calls gather the root as the encoder's does."""
    import peft  # noqa: PLC0415  (only this test needs it)

    def build():
        torch.manual_seed(0)
        return peft.get_peft_model(hf_builders()["t5"](), peft.LoraConfig(r=4, target_modules=["q", "v"],
                                                                          init_lora_weights=False))
    model, plain = build(), build()
    engine = st.shard(model, config(stage))
    assert sorted(u.spec.name for u in engine.roots) == ["root", "root[frozen]"]
    try:
        got = greedy(model, input_ids=prompt(), decoder_start_token_id=0)
        assert all(p.numel() == 0 for p in root_params(engine)) and engine.tracker.outside == []
    finally:
        model.train()
        engine.close()
    assert torch.equal(got, greedy(plain, input_ids=prompt(), decoder_start_token_id=0))
