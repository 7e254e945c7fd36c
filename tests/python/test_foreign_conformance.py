"""The Communicator conformance suite (tests/runtime/comm/comm_conformance.h) over torch.distributed's gloo: a
foreign communicator (strata_comm_create_foreign, docs/decisions/0033) whose callbacks are strata._torch_comm's,
in `torchrun --standalone --nproc-per-node N` jobs at 2, 3 and 4 ranks. The suite's C++ cases run in
libstrata_conformance.so (tests/runtime/capi/conformance_module.cc), which foreign_conformance.py loads into each
rank. The C++ test of the same suite over C callbacks is capi_foreign_test."""
import os
import subprocess
import sys

import pytest

import strata.torch as st
from common import once

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _module():
    """STRATA_CONFORMANCE_MODULE (tests/python/run.sh sets it), else build/release's."""
    path = os.environ.get("STRATA_CONFORMANCE_MODULE") or os.path.join(ROOT, "build", "release", "lib",
                                                                       "libstrata_conformance.so")
    if not os.path.exists(path):
        pytest.fail(f"{path} does not exist: build it (cmake --build build/release --target "
                    f"strata_conformance_module) or set STRATA_CONFORMANCE_MODULE")
    return path


@once
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_the_conformance_suite_passes_over_gloo(ranks):
    out = {}
    try:
        if st.rank() == 0:  # one torchrun job, not one per rank of this test's job
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
            for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k, None)
            p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                str(ranks), os.path.join(HERE, "foreign_conformance.py"), _module()],
                               env=dict(env, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
            out["rc"], out["text"] = p.returncode, p.stdout + p.stderr
    finally:
        st.world().Barrier()
    if st.rank() == 0:
        assert out["rc"] == 0, out["text"]
        assert "GlooConformance.Passes/NotifyFailureEndsThePeersWaitsAtOnce" in out["text"], out["text"]
        for r in range(ranks):  # RUN_ALL_TESTS's status on each rank (the ranks' gtest lines interleave)
            assert f"rank {r}: conformance exit 0" in out["text"], out["text"]
