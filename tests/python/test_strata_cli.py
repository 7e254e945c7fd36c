"""A strata.torch checkpoint is a `strata train` checkpoint: `strata ckpt inspect --verify` reads it and
`strata ckpt export` writes the same values full_state_dict() gives; a `strata train` checkpoint exported into
Hugging Face's sharded layout loads in transformers and back into `strata train --init-from`. Needs the CLI:
tests/python/run.sh sets STRATA_CLI to BUILD_DIR/bin/strata when it was built."""
import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

import strata.torch as st
from common import config, shared_dir, world
from models import batches, tiny_lm
from strata.torch._units import FROZEN_SUFFIX
from test_frozen import frozen_lm


def run_cli(*args):
    # Without the launcher's variables (mpirun's, or torchrun's) the CLI starts as a 1-rank job of its own, not as
    # a rank of this one.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                         "MASTER_PORT")}
    return subprocess.run([os.environ["STRATA_CLI"], *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("frozen", [False, True])
def test_checkpoint_reads_with_strata_ckpt(tmp_path, frozen):
    """frozen: with frozen parameters (test_frozen.py's model), saved as their values alone; the CLI counts
    them and exports them under their unit's name, "<module>[frozen].<param>" for a module's frozen part."""
    if not os.environ.get("STRATA_CLI"):
        pytest.skip("STRATA_CLI unset (tests/python/run.sh sets it when bin/strata is built)")
    root = shared_dir(tmp_path)
    model = frozen_lm() if frozen else tiny_lm()
    engine = st.shard(model, config(3))
    for step in range(2):
        x, y = batches(step, 0, st.rank())
        model(x, y).backward()
        engine.step()
    engine.save_checkpoint(root, {"epoch": 1})
    state = engine.full_state_dict()
    engine.close()
    problem = None
    if st.rank() == 0:
        inspect = run_cli("ckpt", "inspect", root, "--verify")
        export = run_cli("ckpt", "export", root, "-o", os.path.join(root, "w.safetensors"))
        if inspect.returncode or f"world size {st.world_size()}, ZeRO stage 3" not in inspect.stdout or \
                "every checksum matches" not in inspect.stdout or '"epoch":1' not in inspect.stdout.replace(" ", "") or \
                frozen != (" frozen)" in inspect.stdout):
            problem = f"inspect: {inspect.returncode} {inspect.stdout} {inspect.stderr}"
        elif export.returncode:
            problem = f"export: {export.returncode} {export.stdout} {export.stderr}"
        else:
            exported = {k.replace(FROZEN_SUFFIX, "").removeprefix("root."): v
                        for k, v in load_file(os.path.join(root, "w.safetensors")).items()}
            params = {k for k, _ in model.named_parameters()}  # deduplicated: the tied head is emb.weight
            if set(exported) != params:
                problem = f"exported names {sorted(exported)} != {sorted(params)}"
            else:
                bad = [k for k in params if not torch.equal(exported[k], state[k])]
                problem = f"exported values differ: {bad}" if bad else None
    problem = world().bcast(problem, root=0)
    assert problem is None, problem


def _losses(path):
    """{step: loss} of a `strata train --metrics` file."""
    out = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "step" in j and "loss" in j:
                out[j["step"]] = j["loss"]
    return out


def test_export_to_a_directory_round_trips_through_transformers_and_init_from(tmp_path):
    """`strata ckpt export CKPT -o DIR --max-shard-size` writes Hugging Face's sharded layout: transformers'
    from_pretrained of it gives the logits of the single-file export loaded by hand, bit for bit; and
    `strata train --init-from` of it, and of transformers' own save_pretrained of that model (its "transformer."
    names, its shards and index), starts from those weights: its first-step loss is the loss the training run that
    wrote the checkpoint computed with them at its next step (every window of a constant text is the same batch).
    Decision 0037."""
    if not os.environ.get("STRATA_CLI"):
        pytest.skip("STRATA_CLI unset (tests/python/run.sh sets it when bin/strata is built)")
    problem = None
    if st.rank() == 0:
        from transformers import GPT2Config, GPT2LMHeadModel
        root = str(tmp_path)
        data = os.path.join(root, "same.txt")
        with open(data, "w") as f:
            f.write("a" * 4000)
        gpt = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq-len", "32", "--seed", "3", "--data", data,
               "--micro-batch", "2", "--print-every", "100"]
        ckpt, hf, one, theirs = (os.path.join(root, n) for n in ("ck", "hf", "one.safetensors", "theirs"))
        runs = [run_cli("train", *gpt, "--steps", "1", "--checkpoint-dir", ckpt),
                run_cli("train", *gpt, "--steps", "2", "--metrics", os.path.join(root, "a.jsonl")),
                run_cli("ckpt", "export", ckpt, "-o", hf, "--max-shard-size", "40KB"),
                run_cli("ckpt", "export", ckpt, "-o", one)]
        failed = [r for r in runs if r.returncode]
        if failed:
            problem = f"{failed[0].args}: {failed[0].returncode} {failed[0].stdout} {failed[0].stderr}"
        else:
            files = sorted(os.listdir(hf))
            weights = load_file(one)
            cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32,
                             vocab_size=weights["wte.weight"].shape[0], bos_token_id=0, eos_token_id=0)
            cfg.save_pretrained(hf)  # the export writes weights; the model's config is the user's
            theirs_model = GPT2LMHeadModel.from_pretrained(hf).eval()
            by_hand = GPT2LMHeadModel(cfg).eval()
            by_hand.transformer.load_state_dict(weights)
            x = torch.arange(32).view(1, 32) % cfg.vocab_size
            theirs_model.save_pretrained(theirs, max_shard_size="40KB")
            starts = [run_cli("train", *gpt, "--steps", "1", "--init-from", d, "--metrics",
                              os.path.join(root, f"b{i}.jsonl")) for i, d in enumerate((hf, theirs))]
            step2 = _losses(os.path.join(root, "a.jsonl")).get(2)
            if "model.safetensors.index.json" not in files or len(files) < 3:
                problem = f"not a sharded export: {files}"
            elif not torch.equal(theirs_model(x).logits, by_hand(x).logits):
                problem = "transformers' from_pretrained of the directory gives other logits"
            elif "model.safetensors.index.json" not in os.listdir(theirs):
                problem = f"transformers did not shard: {os.listdir(theirs)}"
            elif any(r.returncode for r in starts):
                r = next(r for r in starts if r.returncode)
                problem = f"{r.args}: {r.returncode} {r.stdout} {r.stderr}"
            else:
                first = [_losses(os.path.join(root, f"b{i}.jsonl")).get(1) for i in range(2)]
                if step2 is None or first != [step2, step2]:
                    problem = f"first-step losses {first} from the exported weights, {step2} at step 2 of training"
    problem = world().bcast(problem, root=0)
    assert problem is None, problem
