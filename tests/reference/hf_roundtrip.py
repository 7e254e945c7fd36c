#!/usr/bin/env python3
"""Hugging Face interoperability of `strata train` weights (needs torch + transformers from PyPI; not part
of the project's own test suite, which must not depend on them).

1. transformers writes a small GPT2LMHeadModel with save_pretrained (safetensors, "transformer." names,
   tied lm_head);
2. `strata train --init-from` loads it, trains one step with lr 0 (weights unchanged) on the first
   sequential window of a text file, and reports that step's loss; the same loss computed by transformers
   on the same tokens must agree within 1e-5 relative (the forward pass and the tensor layouts match);
3. `strata train` trains 5 real steps and --save-weights; transformers loads that file with
   from_pretrained and its logits equal those of a model built from the same tensors by hand.
Run from the repository root:  python3 tests/reference/hf_roundtrip.py build/bin/strata
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel

L, C, NH, T, V = 2, 64, 4, 32, 256


def strata(args, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([STRATA, "train", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)


def main():
    work = tempfile.mkdtemp()
    cfg = GPT2Config(n_layer=L, n_embd=C, n_head=NH, n_positions=T, vocab_size=V, activation_function="gelu_new",
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(os.path.join(work, "hf"), safe_serialization=True)
    text = ("The harbour master walked to the old bridge at dawn. " * 40).encode()
    open(os.path.join(work, "data.txt"), "wb").write(text)
    shape = ["--layers", str(L), "--d-model", str(C), "--heads", str(NH), "--seq-len", str(T), "--vocab", str(V)]
    common = shape + ["--data", "data.txt", "--data-order", "sequential", "--micro-batch", "1", "--stage", "0"]
    # The loss of step 1 is the forward loss before its update.
    strata(common + ["--init-from", "hf/model.safetensors", "--steps", "1", "--metrics", "m.jsonl"], work)
    loss = json.loads(open(os.path.join(work, "m.jsonl")).readline())["loss"]
    ids = torch.tensor(list(text[: T + 1]))
    with torch.no_grad():
        ref = hf(ids[None, :T], labels=None).logits
        ref_loss = torch.nn.functional.cross_entropy(ref[0].double(), ids[1:].long()).item()
    ok1 = abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
    print(f"1. transformers weights in strata: loss {loss:.7f} vs transformers {ref_loss:.7f}: {'ok' if ok1 else 'DIFFER'}")

    strata(common + ["--init-from", "hf/model.safetensors", "--steps", "5", "--lr", "1e-3",
                     "--save-weights", "out/model.safetensors"], work)
    cfg.save_pretrained(os.path.join(work, "out"))
    back = GPT2LMHeadModel.from_pretrained(os.path.join(work, "out")).eval()
    from safetensors.torch import load_file
    tensors = load_file(os.path.join(work, "out/model.safetensors"))
    manual = GPT2LMHeadModel(cfg).eval()
    missing, unexpected = manual.transformer.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if not m.endswith("attn.bias") and not m.endswith("masked_bias")]
    with torch.no_grad():
        a, b = back(ids[None, :T]).logits, manual(ids[None, :T]).logits
    changed = not torch.equal(back.transformer.wte.weight, hf.transformer.wte.weight)
    ok2 = torch.equal(a, b) and not missing and not unexpected and changed and torch.equal(back.lm_head.weight, back.transformer.wte.weight)
    print(f"2. strata weights in transformers: from_pretrained loads every tensor, tied head, logits equal: "
          f"{'ok' if ok2 else f'DIFFER (missing {missing}, unexpected {unexpected}, trained {changed})'}")
    print(f"{int(ok1) + int(ok2)} passed, {2 - int(ok1) - int(ok2)} failed")
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    STRATA = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/release/bin/strata")
    sys.exit(main())
