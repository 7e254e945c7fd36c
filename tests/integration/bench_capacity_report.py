#!/usr/bin/env python3
"""Checks what `strata bench capacity` reports beyond the search itself (bench_capacity.sh runs it):
the physical bound against its own terms and the disk's free space, the I/O floor against the step's
counters and the bandwidth it measured, and the --results file against the table.
usage: bench_capacity_report.py CPU_OUTPUT NVME_OUTPUT NVME_RESULTS NVME_DIR fio|builtin"""
import json
import os
import re
import shutil
import sys

cpu, out, results, nvme_dir, fio = sys.argv[1:]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
failed = passed = 0


def check(ok, what):
    global failed, passed
    passed += bool(ok)
    failed += not ok
    print(("ok   " if ok else "FAIL ") + what)


def size(text):
    v, unit = re.fullmatch(r"([\d.]+) (B|KiB|MiB|GiB|TiB)", text).groups()
    return float(v) * UNITS[unit]


def near(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b))


SIZE = r"[\d.]+ (?:B|KiB|MiB|GiB|TiB)"
check("nothing is offloaded to NVMe" in cpu and "I/O floor: none" in cpu, "cpu offload: no disk term, no I/O floor")
# With the state on the host, the host budget is the whole room: the model that fitted lies within it.
m = re.search(r"bound\s+([\d.e+]+) parameters; the largest model found, (\d+), is ([\d.e+-]+) of it", cpu)
check(m and 0 < float(m.group(3)) <= 1 and int(m.group(2)) <= float(m.group(1)),
      f"cpu offload: the largest model is within the host-budget bound ({m and m.group(3)} of it)")

# The bound: (free disk + host budget) / bytes per parameter, each term named with its source.
largest = int(re.search(r"largest model within the budgets: .*, (\d+) parameters", out).group(1))
free = size(re.search(rf"free disk\s+({SIZE}): statvfs of ", out).group(1))
host = size(re.search(rf"host budget\s+({SIZE}): --host-budget", out).group(1))
m = re.search(r"bytes/param\s+([\d.]+): the least this config keeps.*?the engine's accounting.*?: ([\d.]+) "
              r"\(device ([\d.]+), pinned_host ([\d.]+), nvme ([\d.]+)\)", out, re.S)
least, bpp, dev, pinned, nv = map(float, m.groups())
bound, found, frac = re.search(r"bound\s+([\d.e+]+) parameters; the largest model found, (\d+), is ([\d.e+-]+) of it",
                               out).groups()
bound, frac = float(bound), float(frac)
disk_now = shutil.disk_usage(nvme_dir).free
check(near(free, disk_now, 0.05) or abs(free - disk_now) < 2**31, f"free disk {free:.3g} B is the disk's ({disk_now:.3g} B now)")
check(host == 4 * 2**20, "host budget term is --host-budget")
check(near(dev + pinned + nv, bpp, 0.01) and nv > 0, f"bytes/param {bpp} is the sum of its tiers, NVMe's {nv} among them")
check(bpp >= least - 0.01, f"the engine keeps at least the config's least ({bpp} >= {least} B/param)")
check(near(bound, (free + host) / least, 0.01), f"bound {bound:.4g} = (free + host) / the least bytes per param")
check(int(found) == largest and near(frac, largest / bound, 0.01), f"largest as a fraction of the bound: {frac}")

# The I/O floor: the step's NVMe bytes over the bandwidth measured in this run.
rd, wr = (size(x) for x in re.search(rf"NVMe bytes per step: ({SIZE}) read, ({SIZE}) written", out).groups())
step = float(re.search(r"^  step ([\d.]+) ms: compute", out, re.M).group(1))
m = re.search(rf"measured by (fio|the built-in probe).*\n  read  ({SIZE}) at ([\d.]+) MB/s, write ({SIZE}) at ([\d.]+) MB/s",
              out)
how, frd, rbw, fwr, wbw = m.groups()
check((how == "fio") == (fio == "fio"), f"bandwidth measured by {how} (fio on PATH: {fio == 'fio'})")
check(size(frd) == rd and size(fwr) == wr, "the floor's bytes are the step's NVMe counters")
floor, fstep, ratio = map(float, re.search(r"floor ([\d.]+) ms, step ([\d.]+) ms: step / floor ([\d.]+)", out).groups())
expect = 1e3 * (rd / (float(rbw) * 1e6) + wr / (float(wbw) * 1e6))
check(near(floor, expect, 0.05) or abs(floor - expect) < 0.1, f"floor {floor} ms = read / read bw + write / write bw ({expect:.2f})")
check(fstep == step and floor > 0 and near(ratio, step / floor, 0.05), f"step / floor {ratio} = {step} / {floor}")
check(re.search(r"split: compute [\d.]+ ms, exposed I/O [\d.]+ ms, optimizer [\d.]+ ms", out), "the step's split")

check(os.listdir(nvme_dir) == [], f"nothing left in the NVMe directory by the search or the probe: {os.listdir(nvme_dir)}")

# Progress as it went, and the results file: one valid line per candidate of the table, in order.
# Note [Capacity search]: without NVMe the search walks up from the base model, announcing each candidate
# with an estimate once one fitted; with NVMe it starts at the accounting's prediction, which fits, and
# the next size is predicted not to, so that is the only candidate.
def starts(text):
    return re.findall(r"^candidate (\d+): (\d+) layers x .*?, (\d+) parameters, (no estimate yet|estimated \d+ s)$",
                      text, re.M)
walk = starts(cpu)
check(len(walk) >= 2 and walk[0][3] == "no estimate yet" and all(s[3] != "no estimate yet" for s in walk[1:]),
      f"cpu offload: {len(walk)} candidates announced, with an estimate after the first fit")
m = re.search(r"^the engine's accounting predicts the largest fit at (\d+) layers x d_model 64 \((\d+) parameters\): "
              r"the first candidate; (\d+) layers x d_model 64 does not fit: tier '(\w+)' needs", out, re.M)
jump = starts(out)
check(m and jump and jump[0][1] == m.group(1) and int(m.group(3)) == int(m.group(1)) + 1,
      f"NVMe: the first candidate is the predicted largest ({m and m.group(1)} layers), the next one over a tier")
check(m and len(jump) == 1 and int(m.group(2)) == largest, f"NVMe: the prediction fits and ends the search ({len(jump)} candidate)")
rows = re.findall(r"^\s+(\d+)\s+64\s+(\d+)\s+(yes|no)\s", out, re.M)
lines = [json.loads(line) for line in open(results)]
check([(str(j["layers"]), str(j["params"]), "yes" if j["fits"] else "no") for j in lines] == rows,
      f"--results holds the table's {len(rows)} candidates")
check(max(j["params"] for j in lines if j["fits"]) == largest, "the largest fitted line is the largest model")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
