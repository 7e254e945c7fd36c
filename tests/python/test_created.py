"""Models created sharded: st.shard(factory, config) builds the model without its values and replays its
construction into the engine one tensor at a time (docs/decisions/0034). The initial values are bit for bit
those of a plain factory() under the same seed, for transformers' GPT-2, Llama, Mixtral, BERT, T5 and ViT and
for plain torch models; training from them is the training of the built model; and no rank holds the model
while it is created (an RSS bound that the built model's path exceeds)."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import strata.torch as st
from common import config, once, shared_dir, world
from models import InitZoo, TinyLM, hf_builders, hf_gpt2_batch, tiny_lm
from strata.torch._deferred import DeferredTensor


def bits(t):
    return t.detach().contiguous().flatten().view(torch.uint8)


def assert_same_bits(got, want, what):
    assert got.keys() == want.keys(), f"{what}: {sorted(got.keys() ^ want.keys())}"
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, f"{what} {k}"
        assert torch.equal(bits(got[k]), bits(want[k])), f"{what} {k}: values differ"


def built_and_created(build, seed, cfg, **kw):
    """(the plain build(), its generator state after it, the engine of st.shard(build, cfg)), both from `seed`."""
    torch.manual_seed(seed)
    plain = build()
    after = torch.get_rng_state()
    torch.manual_seed(seed)
    engine = st.shard(build, cfg, **kw)
    return plain, after, engine


def check_created(build, seed, cfg, **kw):
    plain, after, engine = built_and_created(build, seed, cfg, **kw)
    assert torch.equal(torch.get_rng_state(), after), "the generator is not where a plain construction leaves it"
    assert_same_bits(engine.full_state_dict(), plain.state_dict(), "state_dict")
    assert_same_bits(dict(engine.model.named_buffers()), dict(plain.named_buffers()), "buffers")  # non-persistent too
    for (n, p), (_, q) in zip(engine.model.named_parameters(), plain.named_parameters()):
        assert not isinstance(p, DeferredTensor) and isinstance(p, torch.nn.Parameter), n
        assert p.requires_grad == q.requires_grad, n
    return plain, engine


@pytest.mark.parametrize("name", ["gpt2", "llama", "mixtral", "bert", "t5", "vit"])
def test_hf_models_created_bit_for_bit(name):
    _, engine = check_created(hf_builders()[name], 11, config(3))
    assert len(engine.units) >= 3  # the blocks are units: the model was split, not one root
    engine.close()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_plain_torch_created_bit_for_bit(stage):
    check_created(InitZoo, 5, config(stage))[1].close()
    plain, engine = check_created(TinyLM, 6, config(stage))
    assert engine.model.head.weight is engine.model.emb.weight  # the tie is kept: one parameter
    engine.close()


def test_created_trains_as_the_built_model():
    """GPT-2 (tied wte / lm_head) created sharded and the same model built and given to st.shard: the same
    losses, bit for bit, and the same weights after 3 steps."""
    build = hf_builders()["gpt2"]
    torch.manual_seed(3)
    built = st.shard(build(), config(3))
    torch.manual_seed(3)
    created = st.shard(build, config(3))
    model = created.model
    assert model.lm_head.weight is model.transformer.wte.weight
    for step in range(3):
        x = hf_gpt2_batch(step, st.rank())
        losses = []
        for e in (built, created):
            loss = e.model(x, labels=x).loss
            loss.backward()
            e.step()
            losses.append(loss.item())
        assert losses[0] == losses[1], f"step {step}: {losses}"
    a, b = built.full_state_dict(), created.full_state_dict()
    assert b["lm_head.weight"] is b["transformer.wte.weight"]
    assert_same_bits(b, a, "after training")
    built.close()
    created.close()


def test_lora_adapter_created_with_its_base():
    """peft's LoRA wrapping inside the factory: the base frozen, the adapters trainable, all bit for bit."""
    peft = pytest.importorskip("peft")

    def build():
        m = hf_builders()["llama"]()
        return peft.get_peft_model(m, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights="gaussian"))

    plain, engine = check_created(build, 8, config(3))
    frozen = {n for n, p in engine.model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, p in plain.named_parameters() if not p.requires_grad} and frozen
    assert any(u.spec.frozen for u in engine.units) and any(not u.spec.frozen for u in engine.units)
    engine.close()


def test_ranks_run_the_factory_from_rank_0s_generator():
    """Ranks seeded differently still build rank 0's model (as st.shard(model) takes rank 0's values)."""
    build = hf_builders()["bert"]
    torch.manual_seed(21)
    plain = build()
    torch.manual_seed(21 + 1000 * st.rank())
    engine = st.shard(build, config(3))
    assert_same_bits(engine.full_state_dict(), plain.state_dict(), "state_dict")
    engine.close()


def test_ranks_that_build_different_values_are_refused():
    """A factory whose values depend on the rank would leave shards of different models: refused on every
    rank, naming a parameter. At one rank there is nothing to differ and it is accepted."""
    def build():
        torch.manual_seed(st.rank())
        return TinyLM()

    if st.world_size() == 1:
        st.shard(build, config(3)).close()
        return
    with pytest.raises(RuntimeError, match=r"different initial values for parameter '.*' on rank 1 than on rank 0"):
        st.shard(build, config(3))


def test_factory_errors():
    with pytest.raises(TypeError, match="a torch.nn.Module or a factory"):
        st.shard(42, config(3))
    with pytest.raises(TypeError, match="returned list, not a torch.nn.Module"):
        st.shard(lambda: [torch.nn.Linear(2, 2)], config(3))
    with pytest.raises(TypeError, match="parameter 'weight' is torch.float16"):
        st.shard(lambda: torch.nn.Linear(2, 2).half(), config(3))


def test_a_tensor_left_out_of_the_model_says_so():
    """A tensor made in the factory that is none of the model's parameters, buffers or attributes has no values:
    an op on it names that, instead of computing on nothing."""
    kept = []

    def build():
        m = tiny_lm()
        kept.append(torch.ones(3))
        return m

    engine = st.shard(build, config(3))
    with pytest.raises(RuntimeError, match="none of the model's parameters, buffers or module attributes"):
        kept[0] + 1
    engine.close()


# ---- peak RSS: a model 32 units large, created sharded and built, 2 ranks, parameters and state on NVMe ----
_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rss_probe.py")


def _probe(mode, nvme):
    """`mpirun -n 2 python rss_probe.py mode nvme` outside this test's job (mpirun's or torchrun's, whose variables
    and mpi4py blocker it leaves out): each rank's figures."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    if "PYTHONPATH" in env:
        env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if "no_mpi4py" not in p)
    env["OMP_NUM_THREADS"] = "1"
    mpirun = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "mpirun_local")
    os.makedirs(nvme)
    p = subprocess.run([mpirun, "-n", "2", sys.executable, _PROBE, mode, nvme], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    figures = []
    for r in range(2):
        with open(os.path.join(nvme, f"rss-{r}.json")) as f:
            figures.append(json.load(f))
    return figures


def _wait_for_rank_0(work):
    """Rank 0 runs work() and every rank gets its result or its failure; the others wait without spinning on a
    core (MPI's barrier would)."""
    out = None
    if st.rank() == 0:
        try:
            out = ("ok", work())
        except Exception as e:  # noqa: BLE001  (every rank raises it below)
            out = ("failed", f"{type(e).__name__}: {e}")
    req = world().Ibarrier()
    while not req.Test():
        time.sleep(0.05)
    status, value = world().bcast(out, root=0)
    assert status == "ok", value
    return value


@once
def test_created_peak_rss_is_the_engine_plus_a_unit(tmp_path):
    """Per rank, the RSS a created model adds at st.shard() is the engine's own host memory plus at most 3
    units and 32 MiB; the same model built first adds the whole model (8 MiB units, 32 of them: 256 MiB), which
    this bound would refuse, so the test fails if creation materialised the model. Its export, once the engine's
    buffers are resident, adds at most 3 units and 32 MiB (a full state dict would add the model)."""
    nvme = shared_dir(tmp_path)
    results = _wait_for_rank_0(lambda: {m: _probe(m, os.path.join(nvme, m)) for m in ("created", "built")})
    for mode in ("created", "built"):
        assert len(results[mode]) == 2, results
    for created, built in zip(results["created"], results["built"]):
        unit, model = created["unit_bytes"], created["model_bytes"]
        assert model >= 30 * unit
        bound = created["engine_host_bytes"] + 3 * unit + (32 << 20)
        assert created["added_bytes"] <= bound, (created, bound)
        assert built["added_bytes"] > bound, (built, bound)  # the bound tells the two apart
        assert built["added_bytes"] - created["added_bytes"] > model // 2
        # its export (engine.save_pretrained), a unit at a time, never the model: the first one also pages in
        # the engine's own buffers (its accounted bytes), the second adds the export's memory alone
        assert created["first_export_added_bytes"] <= bound, created
        assert created["second_export_added_bytes"] <= 3 * unit + (32 << 20) < model // 4, created
