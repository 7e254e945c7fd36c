"""examples/deepspeed_style/train.py, a DeepSpeed training script (ZeRO-3, gradient_accumulation_steps 4, param
groups, a tagged checkpoint with client state, resume) whose only change is its import line, against
strata.torch's own loop (st.shard, loss.backward(), engine.step() after the accumulation): the same losses, the
same learning rates and the same weights, bit for bit; resumed from its checkpoint it continues bit for bit."""
import ast
import importlib.util
import os

import torch

import strata.torch as st
from common import shared_dir, world

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "deepspeed_style", "train.py")
STEPS, SAVE_AT = 6, 3


def load_script():
    spec = importlib.util.spec_from_file_location("deepspeed_style_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_names_strata_only_in_its_import_line():
    with open(SCRIPT, encoding="utf-8") as f:
        source = f.read()
    code = source.replace(ast.get_docstring(ast.parse(source), clean=False), "")
    assert [line for line in code.splitlines() if "strata" in line.lower()] == ["import strata.deepspeed as deepspeed"]


def strata_torch_loop(ex, steps):
    """The same training written for strata.torch: the engine's default param handling but for the script's
    groups (no decay for 1-D parameters and the position table), its config unchanged."""
    model = ex.build_model()
    engine = st.shard(model, ex.CONFIG, weight_decay=lambda name, p: p.ndim >= 2 and name != "pos")
    data, losses, lrs = ex.corpus(), [], []
    micro = ex.CONFIG["train_micro_batch_size_per_gpu"]
    for step in range(steps):
        for m in range(ex.CONFIG["gradient_accumulation_steps"]):
            loss = model(*ex.batch(data, step, m, st.rank(), micro))
            loss.backward()
            losses.append(loss.item())
        lrs.append(engine.step()["lr"])
    return engine, losses, lrs


def test_script_matches_strata_torch_bit_for_bit_and_resumes(tmp_path):
    ex = load_script()
    root = shared_dir(tmp_path)
    engine, history = ex.main(["--steps", str(STEPS), "--save-at", str(SAVE_AT), "--ckpt", root, "--print-every",
                               "100"])
    assert engine.global_steps == STEPS and engine.micro_steps == STEPS * 4
    final = engine.strata.full_state_dict()
    engine.destroy()

    ref, losses, lrs = strata_torch_loop(ex, STEPS)
    assert history["losses"] == losses  # every micro-batch's loss, exactly
    assert history["lrs"] == lrs        # get_lr() before each step is the lr that step used
    assert len(set(lrs)) > 1            # (the warm-up moves it)
    expected = ref.full_state_dict()
    assert all(torch.equal(final[k], v) for k, v in expected.items())
    ref.close()

    # DeepSpeed's layout: <ckpt>/<tag>/..., <ckpt>/latest naming the tag
    with open(os.path.join(root, "latest"), encoding="utf-8") as f:
        assert f.read() == f"step{SAVE_AT}"
    assert os.path.isdir(os.path.join(root, f"step{SAVE_AT}", f"step_{SAVE_AT:08d}"))

    engine, resumed = ex.main(["--steps", str(STEPS), "--ckpt", root, "--resume", "--print-every", "100"])
    assert engine.global_steps == STEPS
    # the client state is rank 0's (DeepSpeed's too: data-parallel rank 0 writes it): rank 0's history up to
    # the save, then this rank's own steps again
    rank0 = world().bcast(history if st.rank() == 0 else None, root=0)
    cut = SAVE_AT * 4
    assert resumed["losses"] == rank0["losses"][:cut] + history["losses"][cut:]
    assert resumed["lrs"] == history["lrs"]
    state = engine.strata.full_state_dict()
    assert all(torch.equal(state[k], v) for k, v in final.items())
    engine.destroy()
