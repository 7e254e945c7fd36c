"""A strata.torch checkpoint is a `strata train` checkpoint: `strata ckpt inspect --verify` reads it and
`strata ckpt export` writes the same values full_state_dict() gives. Needs the CLI: tests/python/run.sh
sets STRATA_CLI to BUILD_DIR/bin/strata when it was built."""
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
    # The CLI links MPI: without the launcher's variables it starts as a singleton, not a rank of this job.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
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
