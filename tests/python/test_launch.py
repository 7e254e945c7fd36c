"""Launchers (docs/decisions/0033): a host model trains under `torchrun --standalone` on torch.distributed's gloo,
bit for bit as under mpirun on MPI, at 2 and 4 ranks, without mpi4py; a rank that raises ends a torchrun job
within seconds. A CUDA model's ranks under torchrun are torchrun's (NCCL, bootstrapped by
strata_comm_create_torchrun; docs/decisions/0020, 0039): on this GPU-less host its bootstrap over torchrun's store
runs for real and every rank fails naming the missing GPU; a rank killed in the bootstrap and a taken MASTER_PORT end
the job within seconds, naming it; over two torchrun nodes, a rank killed on one ends the other within 10 s naming
it (the job watch). No port is picked here: torchrun's --standalone store binds one and keeps it, and
the taken port is a socket this test binds and holds."""
import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

import strata.torch as st
from common import once
from strata._comm import mpi_launch, torchrun_launch
from strata._log import who

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

def test_launch_decision():
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    assert torchrun_launch(torchrun) == (0, 2, 0) and not mpi_launch(torchrun)
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"):  # an MPI launcher started it: MPI's ranks
        assert mpi_launch(dict(torchrun, **{var: "2"})) and torchrun_launch(dict(torchrun, **{var: "2"})) is None
    assert torchrun_launch({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) is None  # shell leftovers
    # strata's own lines on stderr name the rank in a job of more than one, MPI's before the shell's torchrun's.
    assert who({}) == who({"WORLD_SIZE": "1", "RANK": "0"}) == "strata"
    assert who(dict(torchrun, RANK="1")) == "strata r1"
    assert who(dict(torchrun, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="4")) == "strata r3"
    assert who(dict(torchrun, PMI_RANK="2", PMI_SIZE="4")) == "strata r2"


def _clean_env():
    """This test job's environment without its MPI launch (the launches below are jobs of their own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_"))}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(cmd, env):
    start = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - start


def _torchrun(n, *args, env=None):
    """`torchrun --standalone`: its rendezvous store binds a port of its own choosing and keeps it (no port
    picked here)."""
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n),
                 *args], env or _clean_env())


def _mpirun(n, *args):
    return _run([os.path.join(ROOT, "scripts", "mpirun_local"), "-n", str(n), sys.executable, *args], _clean_env())


def _saved(out_dir, n):
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt")) for r in range(n)]


def _same(a, b, where):
    assert a["losses"] == b["losses"], f"{where}: losses {a['losses']} vs {b['losses']}"
    assert a["results"] == b["results"], f"{where}: step results {a['results']} vs {b['results']}"
    assert a["mean_loss"] == b["mean_loss"], where
    assert a["held"] == b["held"], f"{where}: held ranges {a['held']} vs {b['held']}"
    assert a["state"].keys() == b["state"].keys(), where
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), f"{where}: {k} differs"


@once
@pytest.mark.parametrize("ranks,stage,transport", [(2, 3, "shm"), (4, 3, "shm"), (4, 1, "shm"), (2, 3, "gloo")])
def test_torchrun_trains_a_host_model_as_mpirun_does_bit_for_bit(tmp_path_factory, ranks, stage, transport):
    """The same script under both launchers: every rank's losses, step results (gradient norms, clipping) and
    final weights are equal bit for bit. The torchrun ranks import no mpi4py (launch_train.py's run is checked
    for it by a blocker), so neither mpi4py nor mpirun is needed there. Their host collectives go over shared
    memory (one host: Note [The host transport under torchrun]), or over gloo with STRATA_HOST_TRANSPORT=gloo."""
    _on_rank_0(lambda: _compare_launchers(tmp_path_factory.mktemp("launch"), ranks, stage, transport))


def _compare_launchers(tmp, ranks, stage, transport):
    script = os.path.join(HERE, "launch_train.py")
    rc, out, _ = _mpirun(ranks, script, str(tmp / "mpi"), str(stage))
    assert rc == 0, out
    env = _clean_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "no_mpi4py"), env.get("PYTHONPATH", "")])
    if transport == "gloo":
        env["STRATA_HOST_TRANSPORT"] = "gloo"
    rc, out, _ = _torchrun(ranks, script, str(tmp / "torchrun"), str(stage), env=env)
    assert rc == 0, out
    assert f"rank {ranks - 1} of {ranks}: sharded (host transport {transport})" in out, out
    mpi, tr = _saved(tmp / "mpi", ranks), _saved(tmp / "torchrun", ranks)
    for r in range(ranks):
        assert mpi[r]["world"] == tr[r]["world"] == ranks
        _same(mpi[r], tr[r], f"rank {r} of {ranks}, stage {stage}")
    assert mpi[0]["losses"] != mpi[1]["losses"]  # the ranks saw their own batches
    assert mpi[0]["results"][0]["clip_coef"] < 1.0  # the clipping (the norm's all-reduce) took part


def _torchrun_two_nodes(args, env, ends=None):
    """`torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --node-rank i` started twice on loopback, as on
    two nodes: (exit statuses, output, seconds). The rendezvous endpoint is a TCPStore this test serves: it binds a
    port and keeps it for the whole job (no port picked), and both agents are its clients (is_host=0). `ends`, a
    list, receives each node's output and the wall-clock time (time.time()) at which it was seen to end."""
    from torch.distributed import TCPStore
    env = dict(env, STRATA_HOST_TRANSPORT="gloo")  # two nodes on one host: gloo between them, as between two hosts
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{store.port}",
                               "--rdzv-id", "launch-test", "--rdzv-conf", "is_host=0", "--node-rank", str(i), *args],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [None, None]
    try:
        def read(i):  # each node's output on a thread of its own, its end time as soon as it ends
            outs[i] = procs[i].communicate(timeout=900)[0]
            if ends is not None:
                ends.append((outs[i], time.time()))
        readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    del store
    return [p.returncode for p in procs], "".join(o or "" for o in outs), time.monotonic() - start


@once
@pytest.mark.parametrize("group", [None, "node"])
def test_torchrun_two_nodes_train_a_host_model_as_mpirun_does_bit_for_bit(tmp_path_factory, group):
    """Two torchrun nodes of one rank each (a c10d rendezvous) train as `mpirun -n 2` does, bit for bit, held
    ranges included. With shard_group_size "node", torchrun's LOCAL_WORLD_SIZE (1) decides the node, not the host
    name (both "nodes" are this host): each rank is its own shard group and holds whole units, as under mpirun
    with shard_group_size 1, where mpirun's "node" (one host) would be one group of 2 holding halves."""
    _on_rank_0(lambda: _compare_two_nodes(tmp_path_factory.mktemp("nodes"), group))


def _compare_two_nodes(tmp, group):
    script = os.path.join(HERE, "launch_train.py")
    env = _clean_env()
    if group:
        env["LAUNCH_SHARD_GROUP"] = "1"
    rc, out, _ = _run([os.path.join(ROOT, "scripts", "mpirun_local"), "-n", "2", sys.executable, script,
                       str(tmp / "mpi"), "3"], env)
    assert rc == 0, out
    env = _clean_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "no_mpi4py"), env.get("PYTHONPATH", "")])
    if group:
        env["LAUNCH_SHARD_GROUP"] = group
    rcs, out, _ = _torchrun_two_nodes([script, str(tmp / "torchrun"), "3"], env)
    assert rcs == [0, 0], out
    assert "rank 1 of 2: sharded" in out, out
    mpi, tr = _saved(tmp / "mpi", 2), _saved(tmp / "torchrun", 2)
    for r in range(2):
        _same(mpi[r], tr[r], f"rank {r} of 2 on two nodes, shard_group_size {group}")
    whole = all(b == 0 for b, _ in tr[0]["held"]) and tr[0]["held"] == tr[1]["held"]
    assert whole == (group == "node"), tr[0]["held"]  # a group of one holds whole units; a group of two, halves


def _kernel_keeps_exit_status():
    """Linux 6.15 or later: a pidfd still gives the exit status of a process its parent has collected."""
    m = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (6, 15)


_KILLED = (r"rank 1: killing itself (in torch's rendezvous|in the bootstrap|in step 2|before importing strata|"
           r"before st.shard|before init_process_group|after init_process_group) at (\d+\.\d+)")


@once
@pytest.mark.parametrize("where", ["rendezvous", "bootstrap", "training", "before-shard", "own-pg-before",
                                   "own-pg-after"])
def test_torchrun_two_nodes_a_rank_killed_ends_the_other_node_naming_it(where):
    """Two torchrun nodes of one rank each; rank 1 kills itself (SIGKILL), in torch's rendezvous (as strata.torch,
    at the script's first st.shard, calls init_process_group: rank 0 then waits for it in gloo's connection of the
    default group, whose timeout is torch's 30 minutes), in the bootstrap of a host model (rank 0 then waits in
    torch's split of the gloo group, where Strata does not poll) or in step 2 of training (rank 0 in the engine's
    collectives). The other node's agent does not stop rank 0, and the collective timeout is 900 s: the job watch
    (docs/decisions/0039; in the rendezvous, the watch started before it) does. Rank 0's node ends within 10 s of
    the kill, naming rank 1, its pid and the signal: in training as the engine's error (STRATA_ERR_PEER_FAILED),
    elsewhere as the watch's end of the rank.
    Before its first call into strata.torch (docs/decisions/0048, Note [The watch from import]): rank 1 imported
    strata.torch and dies before st.shard while rank 0 waits for it in st.shard's rendezvous ("before-shard"); the
    script initialises torch.distributed itself and rank 1 dies before its init_process_group, rank 0 waiting in
    the script's own (torch's) rendezvous, where no Strata code runs ("own-pg-before"), or after it, rank 0 waiting
    in st.shard's split of the script's group ("own-pg-after"). Rank 1's watch, started at its import, posts it."""
    _on_rank_0(lambda: _killed_on_another_node(where))


def _killed_on_another_node(where):
    env = _clean_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "no_mpi4py"), env.get("PYTHONPATH", "")])
    probe = {"rendezvous": "kill-rdzv", "bootstrap": "kill-host", "before-shard": "kill-before-shard",
             "own-pg-before": "own-pg-kill-before", "own-pg-after": "own-pg-kill-after"}
    if where in probe:
        args = [os.path.join(HERE, "launch_probe.py"), probe[where]]
    else:
        args = [os.path.join(HERE, "launch_train.py"), os.path.join(ROOT, "build", "never-written"), "3", "kill"]
    ends = []
    rcs, out, _ = _torchrun_two_nodes(args, env, ends)
    assert rcs[0] != 0 and rcs[1] != 0, out
    killed = re.search(_KILLED, out)
    assert killed, out
    other = [(o, t) for o, t in ends if "killing itself" not in o]
    assert len(other) == 1, out
    other_out, other_end = other[0]
    died = r"rank 1 of 2 \(LOCAL_RANK 0, pid \d+ on \S+\) died: killed by signal 9 \(SIGKILL\)"
    if not _kernel_keeps_exit_status():
        # Rank 1's agent may collect it before its watch reads the zombie, and older kernels keep no status for
        # the pidfd (job_watch.h, EndedStatus): the notice then says only how it ended.
        died = died.replace(r"killed by signal 9 \(SIGKILL\)", r"(killed by signal 9 \(SIGKILL\)|it ended without "
                            r"running its exit handlers)")
    if where == "training":
        assert re.search(r"STRATA_ERR_PEER_FAILED: .* abandoned: rank 1 failed and will not join it: " + died,
                         other_out), other_out
    else:
        assert re.search(r"strata: ending rank 0 of 2: a rank of the job died, and this one had not ended 2000 ms "
                         r"later: " + died, other_out), other_out
        assert "sharded" not in other_out.splitlines(), other_out
    seconds = other_end - float(killed.group(2))
    print(f"{where}: rank 0's node ended {seconds:.1f} s after rank 1's death")
    assert seconds < 10, f"rank 0's node ended {seconds:.1f} s after rank 1's death\n{out}"


@once
def test_torchrun_log_lines_name_their_rank(tmp_path_factory):
    """Under torchrun the library's log lines carry the rank, as under mpirun ("[strata r1 I] ..."): strata.torch
    tags them when it starts the job watch at import (strata_comm_watch_torchrun). Before, a job of 8 ranks printed
    8 untagged copies of each warning."""
    def check():
        env = _clean_env()
        env.update(STRATA_LOG_LEVEL="info", LAUNCH_NVME="1")
        rc, out, _ = _torchrun(2, os.path.join(HERE, "launch_train.py"), str(tmp_path_factory.mktemp("log")), "3",
                               env=env)
        assert rc == 0, out
        for r in range(2):
            assert re.search(rf"\[strata r{r} I\] I/O queue 'offload'", out), out
        assert not re.search(r"\[strata [IWE]\]", out), out
    _on_rank_0(check)


@once
def test_a_2d_device_mesh_shards_as_shard_group_size_does_bit_for_bit(tmp_path_factory):
    """st.shard(..., device_mesh=init_device_mesh("cpu", (2, 2))) under torchrun at 4 ranks (each row of the mesh a
    shard group, two replicas) trains as `mpirun -n 4` with zero_optimization.shard_group_size 2 does, bit for bit,
    held ranges included (each rank holds half of each unit: a group of 2, not of 4)."""
    _on_rank_0(lambda: _compare_mesh(tmp_path_factory.mktemp("mesh")))


def _compare_mesh(tmp):
    script = os.path.join(HERE, "launch_train.py")
    env = _clean_env()
    env["LAUNCH_SHARD_GROUP"] = "2"
    rc, out, _ = _run([os.path.join(ROOT, "scripts", "mpirun_local"), "-n", "4", sys.executable, script,
                       str(tmp / "mpi"), "3"], env)
    assert rc == 0, out
    env = _clean_env()
    env["LAUNCH_MESH"] = "2x2"
    rc, out, _ = _torchrun(4, script, str(tmp / "torchrun"), "3", env=env)
    assert rc == 0, out
    mpi, tr = _saved(tmp / "mpi", 4), _saved(tmp / "torchrun", 4)
    for r in range(4):
        _same(mpi[r], tr[r], f"rank {r} of 4, a 2 x 2 mesh")
    assert tr[0]["held"] == tr[2]["held"] != tr[1]["held"]  # replicas hold the same half; the group's other, the other
    assert all(e - b < 1024 * 1024 for b, e in tr[0]["held"][:2])  # under half of a 1024 x 1024 + 1024 unit


@once
def test_the_mesh_example_trains_each_member_as_it_would_alone(tmp_path_factory):
    """examples/torch/mesh_ensemble.py at 4 ranks: a (member, dp) mesh of 2 x 2, Strata sharding each member over
    "dp" and the script all-reducing the members' losses over "member". Member 0 trains bit for bit as the same
    script with one member at 2 ranks (its own dp ranks alone), both members learn, and the ensemble mean the
    script prints is the mean of the members' losses."""
    _on_rank_0(lambda: _mesh_example(tmp_path_factory.mktemp("ensemble")))


def _mesh_example(tmp):
    example = os.path.join(ROOT, "examples", "torch", "mesh_ensemble.py")
    rc, out, _ = _torchrun(4, example, "--members", "2", "--steps", "30", "--out", str(tmp / "mesh"))
    assert rc == 0, out
    rc, alone, _ = _torchrun(2, example, "--members", "1", "--steps", "30", "--out", str(tmp / "alone"))
    assert rc == 0, alone
    m0, m1 = (torch.load(tmp / "mesh" / f"member{m}.pt") for m in (0, 1))
    a0 = torch.load(tmp / "alone" / "member0.pt")
    assert m0["losses"] == a0["losses"], (m0["losses"], a0["losses"])
    for k in a0["state"]:
        assert torch.equal(m0["state"][k], a0["state"][k]), k
    assert m0["losses"] != m1["losses"]
    for m in (m0, m1):
        assert m["losses"][-1] < m["losses"][0] / 2, m["losses"]
    last = re.search(r"step  29  member 0 loss \S+  ensemble mean loss (\S+)", out)
    assert last, out
    assert float(last.group(1)) == pytest.approx((m0["losses"][-1] + m1["losses"][-1]) / 2, abs=2e-5), out
@once
def test_torchrun_a_rank_that_raises_ends_the_job_within_seconds(tmp_path_factory):
    """Rank 1 raises in the middle of step 2, while rank 0 waits in the engine's collectives (whose timeout is
    900 s): rank 1's hook sends its failure notice and exits, rank 0 stops at the notice or torchrun's agent
    stops it, and the job ends naming the failure."""
    _on_rank_0(lambda: _raise_ends_the_job(tmp_path_factory.mktemp("raise")))


def _raise_ends_the_job(tmp):
    rc, out, seconds = _torchrun(2, os.path.join(HERE, "launch_train.py"), str(tmp), "3", "raise")
    assert rc != 0, out
    assert "planted failure of rank 1 in step 2" in out, out
    assert "rank 1: saved" not in out and "rank 0: saved" not in out, out
    assert seconds < 300, f"{seconds:.0f} s: waited for a deadline?\n{out}"


def _torchrun_probe(mode):
    """`torchrun --standalone --nproc-per-node 2 launch_probe.py mode` outside this test's MPI job: (exit status,
    output, seconds)."""
    return _torchrun(2, os.path.join(HERE, "launch_probe.py"), mode)


def _on_rank_0(check):
    """One torchrun job, not one per rank of this test job; the others wait for rank 0 even if it fails."""
    try:
        if st.rank() == 0:
            check()
    finally:
        st.world().Barrier()
@once
@pytest.mark.parametrize("transport", ["gloo", "shm"])
def test_torchrun_a_rank_that_stops_is_named_at_the_collective_timeout(tmp_path_factory, transport):
    """Rank 1 sleeps for 10 minutes before its backward in step 2; rank 0's gradient reduction waits for it until
    strata.collective_timeout_ms (4 s), and its error names the collective and rank 1: over gloo as the rank that
    did not respond (the liveness check over torch's store), over shared memory as the rank that did not join
    (its counter in the segment); rank 0's failure then ends the job."""
    _on_rank_0(lambda: _stall_is_named(tmp_path_factory.mktemp("stall"), transport))


def _stall_is_named(tmp, transport):
    env = dict(_clean_env(), STRATA_HOST_TRANSPORT=transport)
    rc, out, seconds = _torchrun(2, os.path.join(HERE, "launch_train.py"), str(tmp), "3", "stall", env=env)
    assert rc != 0, out
    if transport == "shm":
        assert re.search(r"STRATA_ERR_DEADLINE_EXCEEDED: .*(reduce_scatter|all_gather) #\d+ on '\w+' \(rank 0 of 2\) "
                         r"timed out after \d+ ms waiting for rank\(s\) 1 to join it", out), out
    else:
        # Strata's deadline and gloo's (the same 4 s) race: either names the collective, and the check names rank 1
        assert re.search(r"STRATA_ERR_DEADLINE_EXCEEDED: .*(reduce_scatter|all_gather) #\d+ on '\w+' \(rank 0 of 2\) "
                         r"(timed out: the trainer's collective had not returned|failed in the trainer's collective: .*"
                         r"Timed out)", out), out
        assert "rank(s) 1 did not respond to a liveness check" in out, out
    assert seconds < 300, f"{seconds:.0f} s: the stalled rank's sleep ended the job, not the timeout?\n{out}"
@once
def test_torchrun_two_ranks_of_a_cuda_model_without_a_gpu_fail_naming_it():
    """The NCCL bootstrap of strata_comm_create_torchrun for real, over torchrun's store (no port of Strata's own):
    each rank arrives in the store, then fails naming the missing GPU, quickly: well inside the 900 s collective
    timeout of the probe, so no deadline was waited for (about 16 s on an idle host, two imports of torch). Rank 0
    then reads both ranks' arrival keys with torch's own TCPStore client: Strata's client spoke torch's protocol
    to torchrun's agent store."""
    _on_rank_0(_cuda_model_fails_naming_the_gpu)


def _cuda_model_fails_naming_the_gpu():
    rc, out, seconds = _torchrun_probe("cuda")
    assert rc != 0, out
    for r in (0, 1):
        assert re.search(rf"rank {r} failed: StrataError: STRATA_ERR_FAILED_PRECONDITION: strata_comm_create_torchrun: "
                         rf"bootstrap over torchrun's store at \S+:\d+ \(rank {r} of 2\): rank {r} of 2: "
                         rf"FAILED_PRECONDITION: torchrun LOCAL_RANK {r}: no CUDA GPU is visible", out), out
        assert f"store: arrived/{r} = b'2\\nFAILED_PRECONDITION: torchrun LOCAL_RANK {r}: no CUDA GPU" in out, out
    assert "sharded" not in out.splitlines(), out  # the probe's line, not a path holding the word
    assert seconds < 300, f"{seconds:.0f} s: waited for a deadline?\n{out}"


@once
def test_torchrun_a_rank_killed_in_the_bootstrap_ends_the_job_naming_it():
    """Rank 1 dies (SIGKILL) while rank 0 waits for it in the bootstrap, whose deadline is the probe's 900 s
    collective timeout: torchrun's agent sees the death and stops rank 0, and the job ends naming rank 1 and the
    signal, well before that deadline (60 s is generous: about 16 s here, two imports of torch)."""
    _on_rank_0(_killed_rank_ends_the_job)


def _killed_rank_ends_the_job():
    rc, out, seconds = _torchrun_probe("kill")
    assert rc != 0, out
    assert "rank 1: killing itself in the bootstrap" in out, out
    assert re.search(r"rank\s*:\s*1 .*\n.*exitcode\s*:\s*-9", out) or "Signal 9 (SIGKILL) received by PID" in out, out
    assert "sharded" not in out.splitlines(), out
    assert seconds < 60, f"{seconds:.0f} s: waited for a deadline?\n{out}"


@once
@pytest.mark.parametrize("where", ["import", "before-shard"])
def test_torchrun_a_rank_killed_before_its_first_call_to_strata_ends_the_job_naming_it(where):
    """Rank 1 dies (SIGKILL) before it imports strata.torch, or after, before st.shard, while rank 0 waits for it
    in st.shard's rendezvous (torch's init_process_group, whose gloo connection waits 30 minutes): torchrun's agent
    sees the death and stops rank 0, and the job ends within 10 s of the kill naming rank 1 and signal 9
    (docs/decisions/0048; over two nodes, test_torchrun_two_nodes_a_rank_killed_ends_the_other_node_naming_it)."""
    _on_rank_0(lambda: _killed_before_strata(where))


def _killed_before_strata(where):
    rc, out, _ = _torchrun_probe("kill-import" if where == "import" else "kill-before-shard")
    end = time.time()
    assert rc != 0, out
    killed = re.search(_KILLED, out)
    assert killed and killed.group(1) == ("before importing strata" if where == "import" else "before st.shard"), out
    assert re.search(r"rank\s*:\s*1 .*\n.*exitcode\s*:\s*-9", out) or "Signal 9 (SIGKILL) received by PID" in out, out
    assert "sharded" not in out.splitlines(), out
    seconds = end - float(killed.group(2))
    print(f"{where}: the job ended {seconds:.1f} s after rank 1's death")
    assert seconds < 10, f"the job ended {seconds:.1f} s after rank 1's death\n{out}"


@once
def test_torchrun_a_spawned_worker_that_fails_is_not_the_rank():
    """launch_loader.py: each rank's spawned worker (as a DataLoader's) imports strata.torch with the rank's
    environment and exits with status 3 before the rank's st.shard. The watch from import is the rank's alone
    (Note [The watch from import]): no notice is posted, both ranks shard and the job exits 0."""
    _on_rank_0(_spawned_worker_is_not_the_rank)


def _spawned_worker_is_not_the_rank():
    rc, out, _ = _torchrun(2, os.path.join(HERE, "launch_loader.py"))
    assert rc == 0, out
    for r in (0, 1):
        assert f"rank {r}: worker exited with status 3" in out, out
        assert f"rank {r}: sharded, mean rank 0.5" in out, out
    assert "died" not in out, out


@once
@pytest.mark.parametrize("store", ["agent", "rank 0"])
def test_ranks_that_disagree_on_the_world_size_fail_naming_it(store):
    """Rank 1 runs with WORLD_SIZE 3 while rank 0 runs with torchrun's 2 (a launch whose ranks disagree), and
    st.shard is each rank's first call to Strata. Without a check, rank 1 would wait in torch's rendezvous (gloo's
    connection) for a rank 2 and rank 0 for rank 1, for torch's 30 minutes. strata.torch compares the sizes in the
    launch's store before torch's rendezvous (Note [A launch's ranks agree]): each rank fails within 10 s of entering
    st.shard naming both sizes and the fix. "agent": torchrun's agent serves the store (its default); "rank 0":
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, no store is shared, and strata.torch's rank 0 serves MASTER_PORT (chosen by
    torchrun, not here) as env:// does: the path of ranks started by hand."""
    _on_rank_0(lambda: _sizes_disagree(store))


def _sizes_disagree(store):
    env = _clean_env()
    if store == "rank 0":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    rc, out, _ = _torchrun(2, os.path.join(HERE, "launch_probe.py"), "size-mismatch", env=env)
    end = time.time()
    assert rc != 0, out
    fix = (r"Start every rank of a job with the same WORLD_SIZE: under torchrun, the same --nnodes and "
           r"--nproc-per-node on every node; by hand \(env://\), the same WORLD_SIZE for every process")
    named = [re.search(rf"rank {r} failed: RuntimeError: strata: the job's ranks disagree on its size: rank {1 - r} "
                       rf"was started with WORLD_SIZE {3 if r == 0 else 2}, this rank \({r}\) with {2 if r == 0 else 3}"
                       rf"\. {fix}", out) for r in (0, 1)]
    assert any(named), out  # the first to fail may end the other (torchrun's agent) before it prints
    _ended_soon_after_st_shard(out, end, f"store {store}")


@once
@pytest.mark.parametrize("mode", ["rank-twice", "rank-outside", "rank-late"])
def test_a_launch_whose_ranks_are_wrong_fails_naming_it(mode):
    """The other checks of Note [A launch's ranks agree], under `torchrun --standalone` at 2 ranks, st.shard each
    rank's first call to Strata: rank 1 running with RANK 0 (a rank started twice: the second to claim it fails
    naming it), with RANK 2 (outside WORLD_SIZE 2: refused naming both), or starting late while rank 0 waits for it
    with torch's default_pg_timeout set to 2 s (rank 0 names rank 1 at that bound, torch's 30 minutes by default).
    The job ends within 10 s of the last st.shard (of rank 0's, for the late rank)."""
    _on_rank_0(lambda: _wrong_ranks(mode))


def _wrong_ranks(mode):
    rc, out, _ = _torchrun_probe(mode)
    end = time.time()
    assert rc != 0, out
    expected = {
        "rank-twice": r"rank 0 failed: RuntimeError: strata: RANK 0 was started twice: another process of this job, "
                      r"at the same MASTER_ADDR:MASTER_PORT, has it; give the job's WORLD_SIZE processes the ranks 0 "
                      r"to 1, one each",
        "rank-outside": r"rank 2 failed: ValueError: strata: RANK is 2, outside 0 \.\. WORLD_SIZE - 1 = 1: give the "
                        r"job's processes the ranks 0 to WORLD_SIZE - 1, one each",
        "rank-late": r"rank 0 failed: TimeoutError: strata: rank\(s\) 1 of 2 did not start within 0:00:02 \(rank 0 "
                     r"waited at MASTER_ADDR:MASTER_PORT \S+:\d+\)",
    }[mode]
    assert re.search(expected, out), out
    _ended_soon_after_st_shard(out, end, mode)


def _ended_soon_after_st_shard(out, end, what):
    """The probe's job, which ended at `end` (time.time()), did so within 10 s of its last rank's "st.shard at"."""
    assert "sharded" not in out.splitlines(), out
    entered = [float(t) for t in re.findall(r"rank \d: st.shard at (\d+\.\d+)", out)]
    assert entered, out
    seconds = end - max(entered)
    print(f"{what}: the job ended {seconds:.1f} s after the last st.shard")
    assert seconds < 10, f"the job ended {seconds:.1f} s after the last st.shard\n{out}"


@once
def test_torchrun_a_taken_master_port_ends_the_launch_naming_it():
    """The bootstrap's only port is torchrun's MASTER_PORT. Taken (here by a socket this test binds and keeps
    listening), torchrun's agent cannot serve its store and the launch ends at once naming the port, before any
    rank starts: nothing waits for a deadline."""
    _on_rank_0(_taken_port_ends_the_launch)


def _taken_port_ends_the_launch():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        rc, out, seconds = _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                 "--master-addr", "127.0.0.1", "--master-port", str(port),
                                 os.path.join(HERE, "launch_probe.py"), "cuda"], _clean_env())
    assert rc != 0, out
    assert re.search(rf"port: {port}.*EADDRINUSE", out), out
    assert "imported: rank" not in out, out
    assert seconds < 60, f"{seconds:.0f} s: waited for a deadline?\n{out}"


@once
def test_torchrun_calls_left_in_flight_do_not_abort_the_exit(tmp_path_factory):
    """Note [Calls in flight at exit] (strata._torch_comm): test_divergence.py's ranks end with torch.distributed
    calls that Strata abandoned still in gloo; when one returned while the interpreter finalized, the rank died with
    SIGABRT ("terminate called without an active exception") after every test had passed, so the job failed. The
    same file under torchrun, on its own, now exits 0."""
    _on_rank_0(lambda: _calls_in_flight_at_exit(str(tmp_path_factory.mktemp("in_flight"))))


def _calls_in_flight_at_exit(shared):
    env = _clean_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "no_mpi4py"), env.get("PYTHONPATH", "")])
    env["STRATA_TEST_SHARED"] = shared
    rc, out, _ = _torchrun(2, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "test_divergence.py"),
                           env=env)
    assert "terminate called" not in out, out
    assert rc == 0, out
    assert len(re.findall(r"\d+ passed", out)) == 2, out  # both ranks' summaries


@once
def test_torchrun_falls_back_to_gloo_when_dev_shm_holds_the_world_but_not_the_engine(tmp_path_factory):
    """Note [The host transport under torchrun]: under STRATA_HOST_TRANSPORT=auto a /dev/shm that cannot hold the
    engine's communicators keeps gloo with a warning. A /dev/shm of 6 MiB (a private tmpfs: needs root and
    unshare) holds the process's shared segment at 2 ranks (4 MiB) but not the engine's Dups of it: the engine
    is made on gloo, with the warning, not refused (as with Docker's 64 MiB at 8 ranks)."""
    _on_rank_0(lambda: _small_dev_shm_falls_back(tmp_path_factory.mktemp("smallshm")))


def _torchrun_with_small_dev_shm(tmp, size, env):
    """launch_train.py at 2 ranks under torchrun, in a mount namespace whose /dev/shm is a tmpfs of `size`."""
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
    if os.geteuid() != 0 or probe.returncode != 0:
        pytest.skip("needs root and unshare -m to mount a small /dev/shm")
    cmd = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} -m torch.distributed.run "
           f"--standalone --nproc-per-node 2 {os.path.join(HERE, 'launch_train.py')} {tmp} 3")
    return _run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd], env)


def _small_dev_shm_falls_back(tmp):
    rc, out, _ = _torchrun_with_small_dev_shm(tmp, "6m", _clean_env())
    assert rc == 0, out
    assert re.search(r"strata r[01]: warning: the host collectives stay on gloo", out) and "in /dev/shm" in out, out
    for r in range(2):
        assert f"rank {r} of 2: sharded (host transport gloo)" in out, out


@once
@pytest.mark.parametrize("size", ["1m", "6m"])
def test_torchrun_shm_without_room_in_dev_shm_says_what_to_do(tmp_path_factory, size):
    """STRATA_HOST_TRANSPORT=shm makes a /dev/shm without room an error, not a fall-back to gloo; the error names
    /dev/shm and says what to do instead. 1 MiB holds not even the process's segment (strata._torch_comm.create's
    failure); 6 MiB holds it but not the engine's (strata_engine_create's)."""
    def check():
        env = dict(_clean_env(), STRATA_HOST_TRANSPORT="shm")
        rc, out, _ = _torchrun_with_small_dev_shm(tmp_path_factory.mktemp(f"shm{size}"), size, env)
        assert rc != 0, out
        assert "in /dev/shm" in out and "or set STRATA_HOST_TRANSPORT=gloo" in out, out
        assert "warning: the host collectives stay on gloo" not in out, out
    _on_rank_0(check)
