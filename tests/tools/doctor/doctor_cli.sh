#!/usr/bin/env bash
# `strata doctor` as a user runs it, on this machine:
#   --json prints one valid JSON object and exits 0; without an NVIDIA driver it says there is no GPU
#   (a warn, never a fail); the table has its header; --nvme-path measures a directory and leaves it
#   empty; a missing path fails naming the call (exit 1); --nvme-path is also the job's NVMe path, and the
#   nvme_space verdicts on tmpfs disks below, between and above the job's need and room agree with what
#   `strata train` does on them; a misspelt flag names the nearest one (exit 2);
#   a config that offloads the optimizer under a 1 MiB locked-memory limit fails the memlock check;
#   with FAKE_NVML_DIR's stand-in libnvidia-ml.so.1 (4 GPUs over two sockets, one throttled, one link at
#   x8) the GPU checks read it through dlopen and flag exactly those;
#   --measure at tiny sizes writes every host figure (the collectives over scripts/mpirun_local, really
#   launched), and `strata plan --host-figures` reads that file; a launcher that does not exist, or one
#   rank, leaves the collectives out saying why (a warn) and the plan refuses the file naming the key.
# usage: doctor_cli.sh STRATA [FAKE_NVML_DIR] [FAKE_TCP_STORE]
set -uo pipefail
strata=$1 fake_nvml=${2:-} fake_store=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0
check() {  # check NAME CONDITION-STATUS OUTPUT
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$3" | tail -20; fails=$((fails + 1)); fi
}
py() { python3 -c "$1" "$work/out.json"; }

"$strata" doctor --json > "$work/out.json" 2> "$work/err"; rc=$?
py 'import json,sys; json.load(open(sys.argv[1]))'; valid=$?
[ $rc -eq 0 ] && [ $valid -eq 0 ]; check "doctor --json: exit 0 ($rc), valid JSON" $? "$(cat "$work/out.json" "$work/err")"
if [ ! -e /dev/nvidiactl ]; then
  py '
import json, sys
d = json.load(open(sys.argv[1]))
g = [c for c in d["checks"] if c["name"] == "gpus"][0]
assert d["facts"]["gpu_count"] == 0 and d["facts"]["gpus"] == [] and not d["facts"]["nvml"]["loaded"], d["facts"]
assert g["verdict"] == "warn" and "no GPU" in g["detail"], g
assert all(c["verdict"] != "fail" for c in d["checks"]), d["checks"]
assert d["facts"]["cpu_cores"] >= 1 and d["facts"]["host_ram_bytes"] > 0
'
  check "no driver: reports no GPU as a warning, nothing fails" $? "$(cat "$work/out.json")"
fi

out=$("$strata" doctor 2>&1); rc=$?
grep -q "^check .*verdict  detail" <<<"$out" && grep -q "^gpus " <<<"$out" && grep -q " ok$" <<<"$out"
check "doctor (table): exit 0 ($rc), header, rows, summary" $(( rc | $? )) "$out"

mkdir -p "$work/disk"
"$strata" doctor --json --nvme-path "$work/disk" --nvme-test-size 16MiB > "$work/out.json"; rc=$?
py '
import json, sys
d = json.load(open(sys.argv[1]))
n = [c for c in d["checks"] if c["name"] == "nvme"][0]
assert n["verdict"] != "fail" and d["facts"]["nvme"]["test_bytes"] == 16 << 20, (n, d["facts"]["nvme"])
assert d["facts"]["nvme"]["read_bytes_per_s"] > 0 and d["facts"]["nvme"]["write_bytes_per_s"] > 0
'
ok=$?; [ -z "$(ls -A "$work/disk")" ]; empty=$?
check "--nvme-path: measured, directory left empty (exit $rc)" $(( rc | ok | empty )) "$(cat "$work/out.json")"

"$strata" doctor --json --nvme-path /nonexistent/strata > "$work/out.json"; rc=$?
py '
import json, sys
d = json.load(open(sys.argv[1]))
n = [c for c in d["checks"] if c["name"] == "nvme"][0]
assert n["verdict"] == "fail" and "statvfs" in n["detail"], n
'
ok=$?; [ $rc -eq 1 ]; check "--nvme-path missing: nvme fails naming statvfs, exit 1 ($rc)" $(( ok | $? )) "$(cat "$work/out.json")"

# The job's NVMe need against its disk. The doctor's --nvme-path is also the job's (strata train's flag of that
# name), so a train command line with doctor's flags added parses: before, the path was the doctor's alone and
# the offload had none (exit 2, "must be a non-empty path").
job=(--model gpt2-tiny --stage 3 --offload-optimizer nvme)
"$strata" doctor --json "${job[@]}" --nvme-path "$work/disk" --nvme-test-size 16MiB > "$work/out.json" 2> "$work/err"
rc=$?
py '
import json, sys
d = json.load(open(sys.argv[1]))
s = d["facts"]["nvme_space"]
assert s["offloaded"] and s["ranks_on_node"] == 1 and len(s["disks"]) == 1, s
disk = s["disks"][0]
assert disk["path"].endswith("/disk") and disk["stores"] == "optimizer state", disk
assert disk["need_per_rank"] > 0 and disk["room_per_rank"] == disk["need_per_rank"] and disk["free_bytes"] > 0, disk
assert d["facts"]["nvme"]["path"] == disk["path"], d["facts"]["nvme"]
'
check "--offload-optimizer nvme --nvme-path DIR: the job's path, its need computed (exit $rc)" $(( (rc > 1) | $? )) \
  "$(cat "$work/out.json" "$work/err")"
need=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["facts"]["nvme_space"]["disks"][0]["need_per_rank"])' \
  "$work/out.json" 2>/dev/null || echo 0)
# On a tmpfs below the need, between it and twice it (the state's room for asynchronous checkpoints), and above:
# the doctor's verdict and what `strata train` on the same disk does agree (it stops naming the disk; it trains,
# warning that there is no room for twice the state; it trains). Each disk is too small for the bandwidth test,
# which says so and is no failure. Needs a mount namespace (root): skipped without one.
mkdir -p "$work/t1"
on_tmpfs() {  # on_tmpfs KIB CMD...: CMD with a KIB KiB tmpfs on $work/t1, in a mount namespace of its own
  unshare -m sh -c 'mount -t tmpfs -o size="$1"k none "$2" && shift 2 && exec "$@"' sh "$@"
}
if [ "$need" -eq 0 ]; then
  echo "skip  nvme_space on a small tmpfs: no need to size the disks from (the check above failed)"
elif unshare -m sh -c "mount -t tmpfs none '$work/t1'" 2> /dev/null; then
  k=$((need / 1024))
  for case in "fail $((k - 64)) is too small" "warn $((k + k / 2)) no room on" "ok $((2 * k + 256)) done: 1 steps"; do
    read -r verdict size says <<<"$case"
    on_tmpfs "$size" "$work/t1" "$strata" doctor --json "${job[@]}" --nvme-path "$work/t1" --nvme-test-size 16MiB \
      > "$work/out.json" 2> "$work/err"
    V=$verdict py '
import json, os, sys
d = json.load(open(sys.argv[1]))
c = {x["name"]: x for x in d["checks"]}
assert c["nvme_space"]["verdict"] == os.environ["V"], c["nvme_space"]
assert "checkpoints saved on the same disk need their own room" in c["nvme_space"]["detail"], c["nvme_space"]
assert c["nvme"]["verdict"] == "ok" and "bandwidth not measured" in c["nvme"]["detail"], c["nvme"]
'
    ok=$?
    out=$(on_tmpfs "$size" "$work/t1" "$strata" train "${job[@]}" --nvme-path "$work/t1" --steps 1 2>&1)
    grep -q "$says" <<<"$out"; trained=$?
    if [ "$verdict" = ok ]; then ! grep -q "no room on" <<<"$out"; trained=$(( trained | $? )); fi
    check "a ${size} KiB disk for a ${k} KiB need: nvme_space $verdict, and train agrees ('$says')" $(( ok | trained )) \
      "$(cat "$work/out.json"; echo "$out")"
  done
else
  echo "skip  nvme_space on a small tmpfs: no mount namespace here (needs root)"
fi
# On XFS the bandwidth test's deleted file gave its room back only seconds later, and nvme_space, read after it,
# found the disk 16 MiB (the test's bytes) short. The free space is now read first: it is what df said before.
img="$work/xfs.img"
mkdir -p "$work/x1"
if truncate -s 320M "$img" && mkfs.xfs -q -f "$img" > /dev/null 2>&1 && mount -o loop "$img" "$work/x1" 2> /dev/null
then
  before=$(df -B1 --output=avail "$work/x1" | tail -1)
  "$strata" doctor --json "${job[@]}" --nvme-path "$work/x1" --nvme-test-size 16MiB > "$work/out.json" 2> "$work/err"
  B=$before py '
import json, os, sys
d = json.load(open(sys.argv[1]))
assert d["facts"]["nvme"]["test_bytes"] > 0, d["facts"]["nvme"]  # the bandwidth test ran
# Within 1 MiB of df (the log may move a block), far inside the 16 MiB of the test.
assert abs(d["facts"]["nvme_space"]["disks"][0]["free_bytes"] - int(os.environ["B"])) < 1 << 20, d["facts"]
'
  check "on XFS the disk's free space is read before the bandwidth test (df: $before bytes)" $? \
    "$(cat "$work/out.json" "$work/err")"
  umount "$work/x1"
elif [ "${STRATA_REQUIRE_XFS:-0}" = 1 ]; then
  check "a 320 MiB XFS on a loop device (root, xfsprogs) for the free space read" 1 "mkfs.xfs or mount -o loop failed"
else
  echo "skip  free space on XFS: no XFS on a loop device here (needs root and xfsprogs)"
fi
rm -f "$img"
# R: the launcher's ranks on this node (each rank's stores are on the node's disk), or --ranks-per-node.
OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_SIZE=2 "$strata" doctor --json "${job[@]}" --nvme-path "$work/disk" \
  --nvme-test-size 16MiB > "$work/out.json" 2> "$work/err"
py '
import json, sys
s = json.load(open(sys.argv[1]))["facts"]["nvme_space"]
assert s["ranks"] == 4 and s["ranks_on_node"] == 2, s
'
check "under a launcher: 4 ranks, 2 of them on this node's disk" $? "$(cat "$work/out.json" "$work/err")"
out=$("$strata" doctor --ranks 2 --ranks-per-node 4 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "\-\-ranks-per-node 4 is more than --ranks 2" <<<"$out"
check "--ranks-per-node above --ranks: usage error (exit $rc)" $? "$out"

out=$("$strata" doctor --nvme-pth x 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "did you mean --nvme-path" <<<"$out"
check "misspelt flag: exit 2 ($rc), nearest flag named" $? "$out"

echo '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}' > "$work/cfg.json"
# Without CAP_IPC_LOCK (root has it: mlock then ignores the limit, and the check says so below).
nocap=(); [ "$(id -u)" = 0 ] && nocap=(setpriv --bounding-set -ipc_lock)
(ulimit -l 1024 && "${nocap[@]}" "$strata" doctor --json --config "$work/cfg.json" --model gpt2 --ranks 2 \
  > "$work/out.json"); rc=$?
py '
import json, sys
d = json.load(open(sys.argv[1]))
m = [c for c in d["checks"] if c["name"] == "memlock"][0]
p = d["facts"]["pinned"]
assert m["verdict"] == "fail" and p["offloaded"] and p["bytes_per_rank"] > 1 << 20, (m, p)
assert d["verdict"] == "fail"
'
ok=$?; [ $rc -eq 1 ]; check "optimizer offload under a 1 MiB memlock limit: memlock fails, exit 1 ($rc)" $(( ok | $? )) "$(cat "$work/out.json")"
if [ "$(id -u)" = 0 ]; then
  (ulimit -l 1024 && "$strata" doctor --json --config "$work/cfg.json" --model gpt2 --ranks 2 > "$work/out.json")
  py '
import json, sys
d = json.load(open(sys.argv[1]))
m = [c for c in d["checks"] if c["name"] == "memlock"][0]
assert m["verdict"] == "ok" and "CAP_IPC_LOCK" in m["detail"] and d["facts"]["lock_past_limit"], m
'
  check "root under a 1 MiB memlock limit: memlock ok (CAP_IPC_LOCK locks past it)" $? "$(cat "$work/out.json")"
fi

out=$("$strata" doctor --json --config "$work/cfg.json" --stage 0 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "offload_optimizer" <<<"$out"
check "an invalid config is a usage error naming the key (exit $rc)" $? "$out"

if [ -n "$fake_nvml" ]; then
  # The fake GPUs must be visible whatever the caller set (scripts/test hides real GPUs from the CPU tests).
  env -u CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH="$fake_nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$strata" doctor --json \
    > "$work/out.json"; rc=$?
  RC=$rc py '
import json, os, sys
d = json.load(open(sys.argv[1]))
c = {x["name"]: x for x in d["checks"]}
f = d["facts"]
assert f["nvml"]["loaded"] and f["gpu_count"] == 4, f["nvml"]
assert f["topology"][0][1] == 10 and f["topology"][0][2] == 50 and f["nvlink"][0][1] is False, f["topology"]
assert c["gpus"]["verdict"] == "ok" and "4 x NVIDIA H100 80GB HBM3" in c["gpus"]["detail"], c["gpus"]
assert c["interconnect"]["verdict"] == "warn" and "0-2 0-3 1-2 1-3 cross the CPU socket" in c["interconnect"]["detail"], c["interconnect"]
assert c["pcie"]["verdict"] == "warn" and "GPU 3 runs x8 of x16" in c["pcie"]["detail"], c["pcie"]
assert c["clocks"]["verdict"] == "warn" and "GPU 2 hw_thermal" in c["clocks"]["detail"], c["clocks"]
assert "driver 550.54.15 (CUDA 12.4)" in c["versions"]["detail"], c["versions"]
assert (int(os.environ["RC"]) == 1) == (d["verdict"] == "fail"), (os.environ["RC"], d["verdict"])
'
  check "fake NVML: 4 GPUs read through dlopen, cross-socket pairs / x8 link / thermal throttle flagged (exit $rc)" $? \
    "$(cat "$work/out.json")"
fi

# Under torchrun every rank runs the doctor and the launch check tries rank 0's id exchange for real, over
# torchrun's store on MASTER_PORT (docs/decisions/0039). A stand-in of torch's TCPStore serves it here; it binds
# its own port and keeps it (tests/runtime/comm/fake_tcp_store.h), so no port is picked by this script.
if [ -n "$fake_store" ]; then
coproc STORE { "$fake_store"; }
read -r port <&"${STORE[0]}"
trun() { env RANK="$1" WORLD_SIZE="$2" LOCAL_RANK="$1" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
  TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RUN_ID="$3" "$strata" doctor --json "${@:4}"; }
trun 1 2 job1 > "$work/r1.json" 2>&1 &
one=$!
trun 0 2 job1 > "$work/r0.json" 2>&1; rc0=$?
wait $one; rc1=$?
python3 - "$work/r0.json" "$work/r1.json" "$port" <<'PY'
import json, sys
for r, path in enumerate(sys.argv[1:3]):
    d = json.load(open(path))
    c = [c for c in d["checks"] if c["name"] == "launch"][0]
    l = d["facts"]["launch"]
    assert l["torchrun"] and l["rank"] == r and l["size"] == 2 and not l["error"], l
    assert l["exchange"] == "127.0.0.1:%d" % int(sys.argv[3]), l
    assert c["verdict"] in ("ok", "warn") and ("rank %d of 2" % r) in c["detail"], c
PY
check "torchrun, 2 ranks: both exchange rank 0's id over the store on MASTER_PORT (exit $rc0/$rc1)" \
  $(( rc0 | rc1 | $? )) "$(cat "$work/r0.json" "$work/r1.json")"
out=$(trun 0 2 job2 --collective-timeout 1 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "rank(s) 1 had not arrived by the deadline" <<<"$out"
check "torchrun, rank 1 never starts: the launch check fails naming it (exit $rc)" $? "$out"
kill "$STORE_PID" 2>/dev/null
wait "$STORE_PID" 2>/dev/null
fi

# --measure at tiny sizes: every figure, the collectives through a real launch of 2 ranks.
mpirun_local="$(cd "$(dirname "$0")/../../../scripts" && pwd)/mpirun_local"
tiny=(--model gpt2-tiny --micro-batch 1 --comm-bytes 64KiB --adam-elems 65536)
OMP_NUM_THREADS=1 "$strata" doctor --measure --json --ranks 2 --launcher "$mpirun_local" "${tiny[@]}" \
  > "$work/m.json" 2> "$work/err"; rc=$?
python3 - "$work/m.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = d["facts"]["host_figures"]
for k in ("matmul_gflops", "matmul_gflops_one_rank", "update_gbps", "allgather_gbps", "reduce_scatter_gbps",
          "allreduce_gbps"):
    assert h[k] > 0, (k, h)
assert h["alpha_us"] >= 0 and h["ranks"] == 2 and h["comm_error"] == "" and h["update_error"] == "", h
assert h["omp_num_threads"] == "1" and h["sgemm_shape"] == [128, 128, 512] and h["comm_bytes"] == 65536, h
c = [c for c in d["checks"] if c["name"] == "host figures"][0]
assert c["verdict"] == "ok" and "all-gather" in c["detail"], c
PY
check "--measure --ranks 2: every host figure, collectives launched (exit $rc)" $(( (rc > 1) | $? )) \
  "$(cat "$work/m.json" "$work/err")"
out=$("$strata" plan --device-preset host --host-figures "$work/m.json" --ranks 2 --model gpt2-tiny --stage 3 --json 2>&1)
python3 -c 'import json,sys; t = json.loads(sys.argv[1])["time"]; assert t["step_ms"] > 0 and t["gather_ms"] > 0, t' "$out"
check "plan --host-figures reads the doctor's file" $? "$out"

"$strata" doctor --measure --json --ranks 2 --launcher /nonexistent/mpirun "${tiny[@]}" > "$work/m.json" 2> "$work/err"; rc=$?
python3 - "$work/m.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = d["facts"]["host_figures"]
assert h["matmul_gflops"] > 0 and h["update_gbps"] > 0 and h["allgather_gbps"] == 0, h
assert "posix_spawnp(/nonexistent/mpirun)" in h["comm_error"], h
c = [c for c in d["checks"] if c["name"] == "host figures"][0]
assert c["verdict"] == "warn" and "collectives not measured" in c["detail"], c
PY
check "--measure, launcher missing: the collectives' absence reported by name, a warn (exit $rc)" $(( (rc > 1) | $? )) \
  "$(cat "$work/m.json" "$work/err")"
out=$("$strata" plan --device-preset host --host-figures "$work/m.json" --ranks 2 --model gpt2-tiny 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "m.json: facts.host_figures.allgather_gbps is 0 (not measured: .*posix_spawnp" <<<"$out"
check "plan refuses that file for 2 ranks naming the key and the reason (exit $rc)" $? "$out"

"$strata" doctor --measure --json --ranks 1 "${tiny[@]}" > "$work/m.json" 2> "$work/err"; rc=$?
python3 -c 'import json,sys; h = json.load(open(sys.argv[1]))["facts"]["host_figures"]; assert "one rank" in h["comm_error"], h' \
  "$work/m.json"
check "--measure --ranks 1: no collectives, and why (exit $rc)" $(( (rc > 1) | $? )) "$(cat "$work/m.json")"
# A launcher that hangs (its rank, a sleep, never ends): --measure-timeout ends its whole process group and
# the doctor reports the collectives not measured, naming the command and the timeout, in seconds. The same
# timeout bounds the AdamW child, which must still be measured: 10 s, not 1, so that a loaded host starting
# that child slowly cannot fail the test (it did at 1 s, under a load average of 12).
printf '#!/bin/sh\nsleep 300 &\necho $! > "%s/hung_rank.pid"\nwait\n' "$work" > "$work/hung_launcher"
chmod +x "$work/hung_launcher"
start=$(date +%s)
"$strata" doctor --measure --json --ranks 2 --launcher "$work/hung_launcher" --measure-timeout 10 "${tiny[@]}" \
  > "$work/m.json" 2> "$work/err"; rc=$?
took=$(( $(date +%s) - start ))
rank=$(cat "$work/hung_rank.pid" 2>/dev/null || echo 0)
# Gone, or a zombie left to a PID 1 that does not reap (not running either way).
state=$(awk '{print $3}' "/proc/$rank/stat" 2>/dev/null || echo gone)
python3 - "$work/m.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))["facts"]["host_figures"]
assert h["allgather_gbps"] == 0 and h["update_gbps"] > 0, h
assert "hung_launcher -n 2 " in h["comm_error"] and "did not finish within 10 s (timeout)" in h["comm_error"], h
PY
[ $? -eq 0 ] && [ $rc -le 1 ] && [ "$rank" -gt 0 ] && { [ "$state" = gone ] || [ "$state" = Z ]; } && [ $took -lt 60 ]
check "--measure, hung launcher: its group killed at --measure-timeout 10, reported (exit $rc, ${took}s, rank $rank: $state)" $? \
  "$(cat "$work/m.json" "$work/err")"
out=$("$strata" doctor --measure-timeout 5 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "\-\-measure-timeout needs --measure" <<<"$out"
check "--measure-timeout without --measure: usage error (exit $rc)" $? "$out"
out=$("$strata" doctor --launcher x 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "\-\-launcher needs --measure" <<<"$out"
check "--launcher without --measure: usage error (exit $rc)" $? "$out"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
