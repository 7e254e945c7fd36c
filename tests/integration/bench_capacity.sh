#!/usr/bin/env bash
# `strata bench capacity` finds the largest GPT (layers at fixed width) within tiny budgets with CPU
# offload, and reports peaks that respect the budgets.
# usage: bench_capacity.sh MPIRUN STRATA
set -uo pipefail
mpirun=$1 strata=$2
export OMP_NUM_THREADS=1
out=$("$mpirun" -n 1 "$strata" bench capacity --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 \
      --device-budget 2MiB --host-budget 16MiB --offload-optimizer cpu --offload-params cpu 2>&1)
rc=$?
echo "$out"
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
m = re.search(r"layers (\d+), d_model 64", out)
assert m and int(m.group(1)) >= 2, "no model found"
def mib(tier):
    v, unit = re.search(rf"peak {tier}\s+([\d.]+) (B|KiB|MiB)", out).groups()
    return float(v) * {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1}[unit]
assert mib("device") <= 2 and mib("pinned_host") <= 16, "a peak exceeds its budget"
print("1 passed, 0 failed")
PY
checked=$?
[ $rc -eq 0 ] && [ $checked -eq 0 ]
