"""engine.save_pretrained(dir): the model in Hugging Face's layout, written one unit at a time (Note
[Streaming export]). The files load with transformers' from_pretrained into a model equal to the trained one
bit for bit, with the names and files transformers' own save_pretrained writes (tied weights once,
transformers 5's checkpoint names for Mixtral and ViT); sharded with an index, or one file; trainable_only
writes a peft adapter that PeftModel.from_pretrained loads, without gathering the frozen base; no rank holds
more than one unit's gathered tensors."""
import json
import os
import weakref

import pytest
import torch
from safetensors import safe_open

import strata.torch as st
from common import config, shared_dir, world
from models import batches, hf_builders, hf_gpt2_batch, tiny_lm
from strata.torch import _export


def barrier():
    world().Barrier()


def read_dir(path, where=None):
    """{name: tensor} of every safetensors file in `path`, and the files; where: {name: its file}, filled."""
    out, files = {}, sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    for f in files:
        with safe_open(os.path.join(path, f), "pt") as sf:
            assert sf.metadata() == {"format": "pt"}
            for k in sf.keys():
                assert k not in out, f"{k} in two files"
                out[k] = sf.get_tensor(k)
                if where is not None:
                    where[k] = f
    return out, files


def train(engine, steps, batch):
    for step in range(steps):
        x = batch(step, st.rank())
        engine.model(x, labels=x).loss.backward()
        engine.step()


@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral", "bert", "t5", "vit"])
def test_export_loads_with_from_pretrained(name, tmp_path):
    """Created sharded, trained 2 steps where the model takes labels, exported in files of at most 20 kB: the
    index and the tensors are those of transformers' save_pretrained of the same weights, and from_pretrained
    gives the trained model, bit for bit."""
    build = hf_builders()[name]
    torch.manual_seed(4)
    engine = st.shard(build, config(3))
    if name in ("gpt2", "llama"):
        train(engine, 2, hf_gpt2_batch)
    base = shared_dir(tmp_path)  # collective: outside any rank-0 block
    out, ref = os.path.join(base, "out"), os.path.join(base, "ref")
    files = engine.save_pretrained(out, max_shard_size="20KB")
    full = engine.full_state_dict()
    assert len(files) > 2
    if st.rank() == 0:
        plain = build()
        plain.load_state_dict(full)
        plain.save_pretrained(ref, max_shard_size="20KB")
        where = {}
        got, got_files = read_dir(out, where)
        want, _ = read_dir(ref)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        assert index["weight_map"] == where and got_files == sorted(files)
        assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
        assert os.path.exists(os.path.join(out, "config.json"))
        loaded = type(plain).from_pretrained(out)
        state = loaded.state_dict()
        assert state.keys() == full.keys()
        for k in full:
            assert torch.equal(state[k], full[k]), k
    barrier()
    engine.close()


def test_gpt2_export_ties_and_logits(tmp_path):
    """GPT-2's lm_head is its wte: written once under transformers.wte.weight, as transformers writes it, tied
    again by from_pretrained; the loaded model's logits are the sharded model's."""
    torch.manual_seed(5)
    engine = st.shard(hf_builders()["gpt2"], config(3))
    train(engine, 3, hf_gpt2_batch)
    out = os.path.join(shared_dir(tmp_path), "gpt2")
    assert engine.save_pretrained(out) == ["model.safetensors"]  # fits in one file: no index
    x = hf_gpt2_batch(99, 0)
    engine.model.eval()
    with torch.no_grad():
        sharded = engine.model(x).logits
    if st.rank() == 0:
        got, files = read_dir(out)
        assert files == ["model.safetensors"] and not os.path.exists(os.path.join(out, "model.safetensors.index.json"))
        assert "transformer.wte.weight" in got and "lm_head.weight" not in got
        from transformers import GPT2LMHeadModel
        loaded = GPT2LMHeadModel.from_pretrained(out).eval()
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
        with torch.no_grad():
            assert torch.equal(loaded(x).logits, sharded)
    barrier()
    engine.close()


def test_a_new_export_replaces_the_last_one(tmp_path):
    """Sharded after single, single after sharded: the files of the earlier export that this one does not
    replace are removed (a stale model.safetensors beside a new index would be what from_pretrained loads)."""
    engine = st.shard(tiny_lm(), config(3))
    out = os.path.join(shared_dir(tmp_path), "out")
    listing = []
    for size in ("50GB", "2KB", "50GB"):
        files = engine.save_pretrained(out, max_shard_size=size)
        barrier()
        listing.append(sorted(os.listdir(out)))
        assert sorted(f for f in listing[-1] if f.endswith(".safetensors")) == sorted(files)
        barrier()
    assert listing[0] == listing[2] == ["model.safetensors"]
    assert "model.safetensors.index.json" in listing[1] and "model.safetensors" not in listing[1]
    full = engine.full_state_dict()
    if st.rank() == 0:
        got, _ = read_dir(out)
        assert got.keys() == {k for k in full if k != "head.weight"}  # the tie under its first name
        assert all(torch.equal(got[k], full[k]) for k in got)
    barrier()
    engine.close()


def test_export_in_bf16(tmp_path):
    engine = st.shard(tiny_lm(), config(3))
    out = os.path.join(shared_dir(tmp_path), "bf16")
    engine.save_pretrained(out, dtype=torch.bfloat16)
    full = engine.full_state_dict()
    if st.rank() == 0:
        got, _ = read_dir(out)
        assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], full[k].to(torch.bfloat16)) for k in got)
    barrier()
    engine.close()


def test_lora_adapter_alone_without_gathering_the_base(tmp_path):
    """trainable_only=True on a peft model created sharded and trained: peft's adapter files, which
    PeftModel.from_pretrained puts on the untouched base; no frozen unit is gathered."""
    peft = pytest.importorskip("peft")
    lora = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)

    def build():
        return peft.get_peft_model(hf_builders()["llama"](), peft.LoraConfig(**lora))

    torch.manual_seed(9)
    engine = st.shard(build, config(3))
    train(engine, 3, hf_gpt2_batch)
    gathered, inner = [], engine.gather_unit
    engine.gather_unit = lambda unit: gathered.append(unit) or inner(unit)
    out = os.path.join(shared_dir(tmp_path), "adapter")
    assert engine.save_pretrained(out, trainable_only=True) == ["adapter_model.safetensors"]
    del engine.gather_unit
    frozen = {u.id for u in engine.units if u.spec.frozen}
    assert gathered and not frozen & set(gathered)
    full = engine.full_state_dict()
    if st.rank() == 0:
        assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors"]
        torch.manual_seed(9)
        base = hf_builders()["llama"]()  # what the factory's base was: frozen, so untouched by training
        loaded = peft.PeftModel.from_pretrained(base, out)
        state = loaded.state_dict()
        assert state.keys() == full.keys()
        for k in full:
            assert torch.equal(state[k], full[k]), k
        assert any("lora_B" in k and full[k].abs().max() > 0 for k in full)  # trained (B starts at zero)
    barrier()
    engine.close()


def test_trainable_only_of_a_plain_model(tmp_path):
    model = tiny_lm()
    for p in model.blocks.parameters():
        p.requires_grad_(False)
    engine = st.shard(model, config(3))
    out = os.path.join(shared_dir(tmp_path), "trainable")
    engine.save_pretrained(out, trainable_only=True)
    full = engine.full_state_dict()
    if st.rank() == 0:
        got, _ = read_dir(out)
        assert got.keys() == {"emb.weight", "pos", "norm.weight", "norm.bias"}
        assert all(torch.equal(got[k], full[k]) for k in got)
    barrier()
    engine.close()


def test_at_most_one_unit_gathered_at_a_time(tmp_path):
    """The tensors export gathers are alive one unit at a time: at each gather, those still alive (weakly
    tracked) are of the unit being gathered."""
    torch.manual_seed(1)
    engine = st.shard(hf_builders()["mixtral"], config(3))
    alive, worst, inner = [], {}, engine.gather_unit

    def gather_unit(unit):
        v = inner(unit)
        units = {u for u, r in alive if r() is not None}
        worst[unit] = len(units | {unit})
        alive.append((unit, weakref.ref(v)))
        return v

    engine.gather_unit = gather_unit
    engine.save_pretrained(os.path.join(shared_dir(tmp_path), "m"), max_shard_size="30KB")
    del engine.gather_unit
    assert len(worst) == len(engine.units) and max(worst.values()) == 1, worst  # each unit once, alone
    barrier()
    engine.close()


def test_export_errors(tmp_path):
    engine = st.shard(tiny_lm(), config(3))
    base = shared_dir(tmp_path)
    with pytest.raises(ValueError, match="max_shard_size '5 apples'"):
        engine.save_pretrained(os.path.join(base, "a"), max_shard_size="5 apples")
    frozen = tiny_lm()
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen_engine = st.shard(frozen, config(3))
    with pytest.raises(ValueError, match="no trainable parameters"):
        frozen_engine.save_pretrained(os.path.join(base, "b"), trainable_only=True)
    frozen_engine.close()
    if st.rank() == 0:
        open(os.path.join(base, "file"), "w").close()
    barrier()
    with pytest.raises(RuntimeError, match="save_pretrained: the directory: rank 0: .* is a file"):
        engine.save_pretrained(os.path.join(base, "file"))
    engine.model(*batches(0, 0, st.rank())).backward()
    with pytest.raises(RuntimeError, match=r"in the middle of a step \(1 backward passes"):
        engine.save_pretrained(os.path.join(base, "c"))
    engine.step()
    engine.close()


def test_a_write_that_fails_on_one_rank_fails_on_every_rank(tmp_path, monkeypatch):
    """Fault injection: the last rank's rename fails. Every rank raises naming it, after the gathers (no rank
    is left waiting), and the failing rank leaves no temporary file."""
    engine = st.shard(tiny_lm(layers=6), config(3))
    last = st.world_size() - 1
    real_replace = os.replace

    def replace(src, dst):
        if st.rank() == last:
            raise OSError(28, "No space left on device (injected)")
        return real_replace(src, dst)

    monkeypatch.setattr(_export.os, "replace", replace)
    out = os.path.join(shared_dir(tmp_path), "out")
    with pytest.raises(RuntimeError, match=rf"writing the files: rank {last}: writing model.*No space left"):
        engine.save_pretrained(out, max_shard_size="2KB")
    monkeypatch.undo()
    barrier()
    assert not [f for f in os.listdir(out) if ".tmp." in f]
    engine.close()
