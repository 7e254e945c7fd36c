#!/usr/bin/env bash
# `strata bench capacity` finds the largest GPT (layers at fixed width) within tiny budgets, and reports
# peaks that respect the budgets: with CPU offload, and with parameters and optimizer state on NVMe,
# which under the same host budget must fit a deeper model and report the NVMe traffic of a step, and
# with --optimizer-in-backward 4 bytes per parameter fewer (no gradient kept).
# Then what a person watching it relies on: the physical bound it prints agrees with its own terms and
# with the disk's free space; the I/O floor with its counters and the bandwidth it measured (fio when
# installed); every finished candidate is one valid line of --results, also after SIGINT / SIGTERM in
# the middle of the search, which ends promptly naming them; --time-limit ends the search with the table
# of what finished; --max-params bounds it, and the search converges on that bound.
# usage: bench_capacity.sh MPIRUN STRATA
set -uo pipefail
mpirun=$1 strata=$2
export OMP_NUM_THREADS=1
nvme=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$nvme" "$work"' EXIT
capacity() {
  "$mpirun" -n 1 "$strata" bench capacity --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --device-budget 2MiB "$@" 2>&1
}
cpu16=$(capacity --host-budget 16MiB --offload-optimizer cpu --offload-params cpu)
rc1=$?
cpu4=$(capacity --host-budget 4MiB --offload-optimizer cpu --offload-params cpu)
rc2=$?
nvme4=$(capacity --host-budget 4MiB --offload-optimizer nvme --offload-params nvme --nvme-path "$nvme" \
        --results "$work/nvme4.jsonl" --probe-bytes 8MiB)
rc3=$?
# The same search with the update in backward, bounded by the model it found (no gradient: it would go
# deeper, for minutes), so both report bytes/param of the same model.
largest=$(sed -n 's/^largest model within the budgets: .*, \([0-9]*\) parameters.*/\1/p' <<<"$nvme4")
nvme4f=$(capacity --host-budget 4MiB --offload-optimizer nvme --offload-params nvme --nvme-path "$nvme" \
         --optimizer-in-backward --probe-bytes 8MiB --max-params "${largest:-1}")
rc4=$?
printf '%s\n\n%s\n\n%s\n\n%s\n' "$cpu16" "$cpu4" "$nvme4" "$nvme4f"
python3 - "$cpu16" "$cpu4" "$nvme4" "$nvme4f" <<'PY'
import re, sys
def layers(out):
    m = re.search(r"layers (\d+), d_model 64", out)
    assert m, "no model found:\n" + out
    return int(m.group(1))
def size(out, what):
    v, unit = re.search(rf"{what}\s+([\d.]+) (B|KiB|MiB)", out).groups()
    return float(v) * {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1}[unit]
cpu16, cpu4, nvme4, nvme4f = sys.argv[1:]
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
# --optimizer-in-backward (0018): no gradient is kept, so 4 B/param fewer, in the least the config needs
# and in the engine's accounting (a little more: the shards are padded), and at least as deep a model fits.
def bpp(out):
    m = re.search(r"bytes/param\s+([\d.]+): the least this config keeps.*?the engine's accounting.*?: ([\d.]+) \(",
                  out, re.S)
    assert m, "no bytes/param line:\n" + out
    return float(m.group(2)), float(m.group(1))
(measured, least), (measured_f, least_f) = bpp(nvme4), bpp(nvme4f)
check(least - least_f == 4, f"--optimizer-in-backward: the least bytes/param {least_f:.2f}, 4 below {least:.2f}")
check(3.9 < measured - measured_f < 4.5, f"--optimizer-in-backward: measured bytes/param {measured_f:.2f} vs {measured:.2f}")
check(layers(nvme4f) == layers(nvme4), f"--optimizer-in-backward fits the same {layers(nvme4f)} layers under that bound")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
checked=$?
fio=builtin
command -v fio > /dev/null && fio=fio
python3 "$(dirname "$0")/bench_capacity_report.py" "$cpu16" "$nvme4" "$work/nvme4.jsonl" "$nvme" "$fio"
reported=$?
"$(dirname "$0")/bench_capacity_bounds.sh" "$mpirun" "$strata" "$work"
bounded=$?
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ $rc4 -eq 0 ] && [ $checked -eq 0 ] && [ $reported -eq 0 ] && [ $bounded -eq 0 ]
