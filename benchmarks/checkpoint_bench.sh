#!/usr/bin/env bash
# Asynchronous against synchronous checkpoint saves of the same state (strata_checkpoint_bench), then fio
# writing the same bytes to the same directory the way a save does (sequential 1 MiB writes, one file per
# writer, fsync at the end; buffered as saves wrote before decision 0054, then O_DIRECT as they write now: Note
# [Direct checkpoint writes]), in one run. docs/perf-notes.md "Asynchronous checkpoints" holds results.
# usage: benchmarks/checkpoint_bench.sh BUILD_DIR DIR [--hidden N] [--world N] [--rounds N] [--threads N] [--nvme DIR]
# (--nvme: the optimizer state on NVMe under DIR; the save then holds its tiles, not a host copy)
set -euo pipefail
build=$1 dir=$2
shift 2
mkdir -p "$dir"
out=$("$build/bin/strata_checkpoint_bench" --dir "$dir" "$@")
echo "$out"
bytes=$(tail -1 <<<"$out" | python3 -c "import json, sys; print(json.load(sys.stdin)['bytes'])")
if ! command -v fio > /dev/null; then echo "fio: not installed"; exit 0; fi
for i in 1 2 3; do
  for direct in 0 1; do
    t0=$(date +%s.%N)
    fio --name=ckpt --directory="$dir" --rw=write --bs=1M --size="$bytes" --end_fsync=1 --ioengine=psync \
        --direct=$direct --output-format=json --unlink=1 > "$dir/fio.json"
    t1=$(date +%s.%N)
    python3 - "$dir/fio.json" "$t0" "$t1" "$direct" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["write"]
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"fio direct={sys.argv[4]}: {j['io_bytes'] / 1e6:.1f} MB; fio's rate {j['bw_bytes'] / 1e6:.1f} MB/s; "
      f"{j['io_bytes'] / 1e6 / wall:.1f} MB/s over its wall time with the end fsync ({wall:.3f} s)")
PY
  done
done
rm -f "$dir/fio.json"
