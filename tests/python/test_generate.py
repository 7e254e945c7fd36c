"""generate() of a sharded transformers model (README: at stage 3 a forward outside training is collective,
so every rank runs it) gives the tokens of the same model unsharded, greedy. An encoder-decoder model's
generate() runs its encoder through model.get_encoder() outside the model's forward, where the root unit's
parameters are placeholders: refused at every stage (not silently wrong), a known gap."""
import pytest
import torch

import strata.torch as st
from common import config
from models import HF_VOCAB, hf_builders


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


@pytest.mark.parametrize("stage", [0, 3])
def test_decoder_only_generate_matches_the_plain_model(stage):
    model, plain, engine = sharded_and_plain("llama", stage)
    assert torch.equal(greedy(model, input_ids=prompt()), greedy(plain, input_ids=prompt()))
    engine.close()


@pytest.mark.xfail(strict=True, raises=RuntimeError,
                   reason="known gap: generate() calls model.get_encoder() outside the model's forward, where the "
                          "root unit (T5's shared embedding) is a placeholder; refused with a clear error")
@pytest.mark.parametrize("stage", [0, 3])
def test_encoder_decoder_generate_matches_the_plain_model(stage):
    model, plain, engine = sharded_and_plain("t5", stage)
    try:
        got = greedy(model, input_ids=prompt(), decoder_start_token_id=0)
    finally:
        model.train()
        engine.close()
    assert torch.equal(got, greedy(plain, input_ids=prompt(), decoder_start_token_id=0))
