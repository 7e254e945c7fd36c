"""Launchers: strata.torch's ranks are MPI's. A torchrun launch of more than one rank would be N separate
1-rank jobs (each process a singleton MPI world), so it fails at import on every rank, naming mpirun."""
import os
import subprocess
import sys

from strata._comm import torchrun_refusal

import strata.torch as st


def test_refusal_decision():
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    msg = torchrun_refusal(torchrun, 1)
    assert msg is not None and "torchrun (WORLD_SIZE=2)" in msg and "mpirun -n 2" in msg
    assert torchrun_refusal({"WORLD_SIZE": "1"}, 1) is None                 # one rank: nothing to refuse
    assert torchrun_refusal(torchrun, 2) is None                            # MPI's world has the ranks
    assert torchrun_refusal(dict(torchrun, OMPI_COMM_WORLD_SIZE="1"), 1) is None  # mpirun started it
    assert torchrun_refusal(dict(torchrun, PMI_SIZE="1"), 1) is None
    assert torchrun_refusal({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, 1) is None  # leftovers


def test_torchrun_two_ranks_fails_at_import():
    if st.rank() == 0:  # one torchrun job, not one per rank of this test job
        script = os.path.join(os.path.dirname(__file__), "launch_probe.py")
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
        env.pop("WORLD_SIZE", None)
        p = subprocess.run([torchrun, "--nproc-per-node", "2", script], env=env, capture_output=True, text=True,
                           timeout=300)
        out = p.stdout + p.stderr
        assert p.returncode != 0, out
        assert out.count("started by torchrun (WORLD_SIZE=2)") >= 2, out  # both ranks say it
        assert "mpirun -n 2 python launch_probe.py" in out, out
        assert "imported" not in out, out  # before the script's first line after the import
    st.world().Barrier()
