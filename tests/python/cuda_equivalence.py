"""strata.torch on CUDA against plain torch on the same GPU, for scripts/gpu_check (one GPU):
    torchrun --nproc_per_node 1 tests/python/cuda_equivalence.py
The test_equivalence.py check (per-tensor relative L2 <= 1e-5 after 10 steps, tied embedding / LM head,
AdamW) at stages 0-3, with gradient accumulation + clipping and with non-reentrant activation
checkpointing, the engine on the GPU of LOCAL_RANK over torchrun's NCCL world (strata_comm_create_torchrun),
the parameters CUDA views of the engine's device buffers. Never run yet (docs/decisions/0020): no session
has had a GPU since it was written. Prints one line per case and exits non-zero on any failure."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strata.torch as st  # noqa: E402
from common import config, reference_optimizer, rel_errors  # noqa: E402
from models import batches, tiny_lm  # noqa: E402

STEPS = 10
torch.backends.cuda.matmul.allow_tf32 = False  # both sides in fp32 products
torch.backends.cudnn.allow_tf32 = False


def on(device, xy):
    return tuple(t.to(device) for t in xy)


def run(stage, accumulation, clip, ckpt):
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    model, ref = tiny_lm(ckpt=ckpt).to(device), tiny_lm().to(device)
    engine = st.shard(model, config(stage, accumulation, clip))
    assert engine.device == device, engine.device
    opt = reference_optimizer(ref)
    world = st.world_size()
    for step in range(STEPS):
        for m in range(accumulation):
            x, y = on(device, batches(step, m, st.rank()))
            loss = model(x, y)
            assert loss.device == device
            loss.backward()
        engine.step()
        for m in range(accumulation):
            for r in range(world):
                x, y = on(device, batches(step, m, r))
                (ref(x, y) / (world * accumulation)).backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        opt.step()
        opt.zero_grad()
    state = engine.full_state_dict()
    ref_state = {k: v.detach().cpu() for k, v in ref.state_dict().items()}
    errors = rel_errors({k: v.cpu() for k, v in state.items()}, ref_state)
    worst = max(errors, key=errors.get)
    start = tiny_lm().state_dict()
    moved = all(not torch.equal(state[k].cpu(), start[k]) for k in start)
    engine.close()
    return errors[worst], worst, moved


failed = 0
for stage in (0, 1, 2, 3):
    for name, (accumulation, clip, ckpt) in {"plain": (1, 0.0, None), "accumulate-clip": (2, 0.5, None),
                                             "checkpoint": (1, 0.0, "non-reentrant")}.items():
        try:
            err, worst, moved = run(stage, accumulation, clip, ckpt)
            ok = err <= 1e-5 and moved
            detail = f"worst relative L2 {err:.3g} ({worst}){'' if moved else ', a tensor did not move'}"
        except Exception as e:  # noqa: BLE001 (reported per case)
            ok, detail = False, f"{type(e).__name__}: {e}"
        failed += not ok
        if st.rank() == 0:
            print(f"stage {stage} {name:16s} {'ok' if ok else 'FAIL'}  {detail}", flush=True)
if st.rank() == 0:
    print(f"strata.torch on CUDA: {12 - failed} of 12 cases match torch", flush=True)
sys.exit(1 if failed else 0)
