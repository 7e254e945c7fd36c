#!/usr/bin/env python3
"""What the hooks of Note [The root outside the forward] (python/strata/torch/_hooks.py, docs/decisions/
0056-root-outside-the-forward.md) cost a training step: the tests' small T5 (hf_builders' "t5", whose encoder
layers are in the root unit, so most of its modules are hooked) sharded twice, once with the hooks and once with
root_holders patched to find no module, their steps interleaved:

    STRATA_LIBRARY=... scripts/mpirun_local -n 1 build/venv/bin/python benchmarks/peers/root_holder_hooks.py

Prints the hooked module calls per step, the cost of one hooked call's two hooks inside a forward (a loop of
holder_pre / holder_post in phase FORWARD, where both return at their first test), and the median step of each
engine with their ratio.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "python"))

import torch  # noqa: E402

import strata.torch as st  # noqa: E402
from common import config  # noqa: E402  (the tests' configuration and models)
from models import HF_VOCAB, hf_builders  # noqa: E402
from strata.torch import _engine, _hooks  # noqa: E402


def sharded(hooked, stage):
    found = _engine.root_holders
    if not hooked:
        _engine.root_holders = lambda model, params: []
    try:
        torch.manual_seed(0)
        model = hf_builders()["t5"]()
        return model, st.shard(model, config(stage))
    finally:
        _engine.root_holders = found


def step(model, engine, x):
    model(input_ids=x, decoder_input_ids=x, labels=x).loss.backward()
    engine.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--stage", type=int, default=3)
    args = ap.parse_args()
    x = torch.randint(0, HF_VOCAB, (4, 12), generator=torch.Generator().manual_seed(1))
    engines = {hooked: sharded(hooked, args.stage) for hooked in (True, False)}
    tracker = engines[True][1].tracker
    calls, pre = [0], tracker.holder_pre
    tracker.holder_pre = lambda m: (calls.__setitem__(0, calls[0] + 1), pre(m))[1]
    step(*engines[True], x)
    del tracker.holder_pre
    tracker.phase, m, n = _hooks.FORWARD, engines[True][0].shared, 100000
    start = time.perf_counter()
    for _ in range(n):
        tracker.holder_pre(m)
        tracker.holder_post(m, "shared", None)
    per_call = (time.perf_counter() - start) / n
    tracker.phase = _hooks.IDLE
    times = {True: [], False: []}
    for i in range(args.steps):
        for hooked in ((True, False) if i % 2 else (False, True)):
            start = time.perf_counter()
            step(*engines[hooked], x)
            times[hooked].append(time.perf_counter() - start)
    if st.rank() == 0:
        hooked, plain = (statistics.median(times[h][5:]) for h in (True, False))
        print(f"stage {args.stage}: {calls[0]} hooked module calls per step; their two hooks {1e6 * per_call:.2f} us "
              f"per call ({1e3 * calls[0] * per_call:.3f} ms per step); step median {1e3 * hooked:.2f} ms hooked, "
              f"{1e3 * plain:.2f} ms without, ratio {hooked / plain:.3f}")
    for _, engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
