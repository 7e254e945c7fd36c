#!/usr/bin/env bash
# `strata bench capacity` finds the largest GPT (layers at fixed width) within tiny budgets, and reports
# peaks that respect the budgets: with CPU offload, and with parameters and optimizer state on NVMe,
# which under the same host budget must fit a deeper model and report the NVMe traffic of a step.
# usage: bench_capacity.sh MPIRUN STRATA
set -uo pipefail
mpirun=$1 strata=$2
export OMP_NUM_THREADS=1
nvme=$(mktemp -d)
trap 'rm -rf "$nvme"' EXIT
capacity() {
  "$mpirun" -n 1 "$strata" bench capacity --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --device-budget 2MiB "$@" 2>&1
}
cpu16=$(capacity --host-budget 16MiB --offload-optimizer cpu --offload-params cpu)
rc1=$?
cpu4=$(capacity --host-budget 4MiB --offload-optimizer cpu --offload-params cpu)
rc2=$?
nvme4=$(capacity --host-budget 4MiB --offload-optimizer nvme --offload-params nvme --nvme-path "$nvme")
rc3=$?
printf '%s\n\n%s\n\n%s\n' "$cpu16" "$cpu4" "$nvme4"
python3 - "$cpu16" "$cpu4" "$nvme4" <<'PY'
import re, sys
def layers(out):
    m = re.search(r"layers (\d+), d_model 64", out)
    assert m, "no model found:\n" + out
    return int(m.group(1))
def size(out, what):
    v, unit = re.search(rf"{what}\s+([\d.]+) (B|KiB|MiB)", out).groups()
    return float(v) * {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1}[unit]
cpu16, cpu4, nvme4 = sys.argv[1:]
failed = passed = 0
def check(ok, what):
    global failed, passed
    passed += ok
    print(("ok   " if ok else "FAIL ") + what)
    failed += not ok
check(layers(cpu16) >= 2, f"cpu offload, 16 MiB host: {layers(cpu16)} layers")
for out, host in ((cpu16, 16), (cpu4, 4), (nvme4, 4)):
    check(size(out, "peak device") <= 2 and size(out, "peak pinned_host") <= host, f"peaks within 2 MiB device, {host} MiB host")
check(layers(nvme4) > layers(cpu4), f"NVMe fits more under 4 MiB host: {layers(nvme4)} layers vs {layers(cpu4)} with cpu")
check(size(nvme4, "peak nvme") > 0, "NVMe holds state")
m = re.search(r"NVMe bytes per step: ([\d.]+) (B|KiB|MiB) read, ([\d.]+) (B|KiB|MiB) written", nvme4)
check(m is not None and float(m.group(1)) > 0 and float(m.group(3)) > 0, "NVMe bytes read and written per step reported")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
checked=$?
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ $checked -eq 0 ]
