"""Launchers: a host model's ranks are MPI's. A torchrun launch of more than one rank of a host model would
be N separate 1-rank jobs (each process a singleton MPI world), so st.shard fails on every rank, naming
mpirun. A CUDA model's ranks under torchrun are torchrun's (NCCL, bootstrapped by strata_comm_create_torchrun;
docs/decisions/0020): on this GPU-less host its bootstrap exchange runs for real and then every rank fails
naming the missing GPU."""
import os
import random
import re
import socket
import subprocess
import sys
import time

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


def _free_ports():
    """Two consecutive ports for torchrun's store and the bootstrap exchange, free now. Not from the kernel's
    ephemeral range (what binding port 0 returns): every outgoing connection on the machine takes ports from
    there, and one did take the bootstrap's port between this test's check and rank 0's bind (issue 35). Below
    it, only a process that binds that exact number could. Reserving the port for good needs a bootstrap over
    torchrun's own store (issue 35)."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, ephemeral_low - 2)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port, port + 1
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports below the ephemeral range")


def _torchrun_probe(mode):
    """`torchrun --nproc-per-node 2 launch_probe.py mode` outside this test's MPI job: (exit status, output,
    seconds)."""
    script = os.path.join(os.path.dirname(__file__), "launch_probe.py")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
    env.pop("WORLD_SIZE", None)
    master_port, bootstrap_port = _free_ports()
    env["STRATA_BOOTSTRAP_PORT"] = str(bootstrap_port)
    start = time.monotonic()
    p = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                        str(master_port), script, mode], env=env, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - start


def _on_rank_0(check):
    """One torchrun job, not one per rank of this test job; the others wait for rank 0 even if it fails."""
    try:
        if st.rank() == 0:
            check()
    finally:
        st.world().Barrier()


def test_torchrun_two_ranks_of_a_host_model_fail_at_shard():
    _on_rank_0(_host_model_refused)


def _host_model_refused():
    rc, out, _ = _torchrun_probe("host")
    assert rc != 0, out
    assert out.count("started by torchrun (WORLD_SIZE=2)") >= 2, out  # both ranks say it
    assert "mpirun -n 2 python launch_probe.py" in out, out
    # torchrun's ranks and the front end's collectives are real before the refusal
    assert "rank 0 of 2, mean rank 0.5" in out and "rank 1 of 2, mean rank 0.5" in out, out
    assert "sharded\n" not in out + "\n", out  # the probe's line, not a path holding the word (wt-sharded/)


def test_torchrun_two_ranks_of_a_cuda_model_without_a_gpu_fail_naming_it():
    """The NCCL bootstrap of strata_comm_create_torchrun for real: rank 0's NCCL id reaches rank 1 over the
    exchange (both name the same id, whose first 8 bytes are a random magic of the job), then each rank
    fails naming the missing GPU, quickly: well inside the 900 s collective timeout of the probe, so no
    deadline was waited for (about 16 s on an idle host, two imports of torch)."""
    _on_rank_0(_cuda_model_fails_naming_the_gpu)


def _cuda_model_fails_naming_the_gpu():
    rc, out, seconds = _torchrun_probe("cuda")
    assert rc != 0, out
    ids = {}
    for r in (0, 1):
        m = re.search(rf"rank {r} failed: StrataError: STRATA_ERR_FAILED_PRECONDITION: strata_comm_create_torchrun: "
                      rf"rank {r} of 2 \(torchrun, LOCAL_RANK {r}\): no CUDA GPU is visible .*?\. The bootstrap "
                      rf"exchange with rank 0 at 127.0.0.1:\d+ had completed \(NCCL id ([0-9a-f]{{16}})\.\.\.\)", out)
        assert m, out
        ids[r] = m.group(1)
    assert ids[0] == ids[1], out
    assert "sharded\n" not in out + "\n", out  # the probe's line, not a path holding the word (wt-sharded/)
    assert seconds < 300, f"{seconds:.0f} s: waited for a deadline?\n{out}"
