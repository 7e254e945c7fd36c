#!/usr/bin/env bash
# The real DeepSpeed configs of tests/configs/deepspeed (sources in SOURCES.md) through
# `strata train --config FILE`, 2 steps of a tiny GPT at 1 rank: each trains unchanged, or is refused once
# (exit 1, one error) naming exactly the key paths expected.json lists for it (docs/decisions/0028). Then
# the batch triangle, the log warm-up and fp16 hysteresis end to end, against DeepSpeed's numbers.
# usage: deepspeed_corpus.sh MPIRUN STRATA CONFIG_DIR
set -uo pipefail
mpirun=$1 strata=$2 dir=$3
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"
small=(--layers 2 --d-model 64 --heads 4 --seq-len 32 --steps 2 --print-every 100)
# One line per config: file, then "train" or the refused key paths (strata train's column of expected.json).
python3 -c '
import json, sys
for name, e in sorted(json.load(open(sys.argv[1])).items()):
    print(name, *(e["strata_train"] or ["train"]))' "$dir/expected.json" > "$work/cases" || exit 1
[ "$(wc -l < "$work/cases")" -ge 20 ] || { echo "FAIL: fewer than 20 configs in expected.json"; exit 1; }
[ "$(wc -l < "$work/cases")" -eq "$(find "$dir" -name '*.json' ! -name expected.json | wc -l)" ] ||
  { echo "FAIL: expected.json does not list every config of $dir"; exit 1; }
while read -r name keys; do
  out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --config "$dir/$name" 2>&1 < /dev/null); rc=$?  # not the list
  if [ "$keys" = train ]; then
    check "$name trains unchanged" $rc "$out"
    continue
  fi
  # Refused once: a non-zero exit, every expected key path named, and as many problems as expected.
  ok=0
  [ $rc -ne 0 ] || ok=1
  n=0
  for key in $keys; do
    n=$((n + 1))
    grep -qF "config key '$key'" <<<"$out" || { ok=1; echo "missing '$key'"; }
  done
  named=$(grep -o "config key '[^']*'" <<<"$out" | sort -u | wc -l)
  [ "$named" -eq "$n" ] || { ok=1; echo "named $named keys, expected $n"; }
  check "$name refused in one pass naming $keys" $ok "$out"
done < "$work/cases"

# DeepSpeed's meaning end to end, against numbers from its formulas. The batch triangle: 16 = 4 x 4 x 1.
echo '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}' > "$work/batch.json"
out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --config "$work/batch.json" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "micro 4 x accum 4 x ranks 1" <<<"$out"
check "train_batch_size 16 with micro-batch 4 on 1 rank accumulates 4" $? "$out"
# WarmupLR's default log warm-up (W = 10, peak 1e-3): 0, 0, then 1e-3 ln(i + 1) / ln(10) at iteration i.
echo '{"optimizer": {"params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}' \
  > "$work/warmup.json"
out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --steps 4 --config "$work/warmup.json" --metrics "$work/w.jsonl" 2>&1) &&
  out=$(python3 -c '
import json, math, sys
lrs = [json.loads(l)["lr"] for l in open(sys.argv[1])]
want = [0, 0, 1e-3 * math.log(2) / math.log(10), 1e-3 * math.log(3) / math.log(10)]
ok = len(lrs) == 4 and all(abs(a - b) <= 1e-5 * 1e-3 for a, b in zip(lrs, want))  # the metrics print 6 digits
print("ok" if ok else f"bad: {lrs} != {want}"); sys.exit(0 if ok else 1)' "$work/w.jsonl" 2>&1)
check "WarmupLR warms up logarithmically ($out)" $? "$out"
# fp16 with DeepSpeed's hysteresis 2: one overflow skips its step and keeps the scale.
echo '{"fp16": {"enabled": true}, "zero_optimization": {"stage": 2}}' > "$work/fp16.json"
out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --steps 4 --config "$work/fp16.json" --metrics "$work/f.jsonl" \
      --inject-nonfinite-step 1 --inject-nonfinite-rank 0 2>&1) &&
  out=$(python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = [r["skipped"] for r in rows] == [False, True, False, False] and {r["loss_scale"] for r in rows} == {65536}
print("ok" if ok else f"bad: {rows}"); sys.exit(0 if ok else 1)' "$work/f.jsonl" 2>&1)
check "fp16 hysteresis 2: an overflow skips its step and keeps the scale ($out)" $? "$out"
# An overflow with the scale already at min_loss_scale ends the run, as DeepSpeed's raise does.
echo '{"fp16": {"enabled": true, "initial_scale_power": 0, "hysteresis": 1}}' > "$work/floor.json"
out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --steps 4 --config "$work/floor.json" \
      --inject-nonfinite-step 1 --inject-nonfinite-rank 0 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "already at fp16.min_loss_scale (1)" <<<"$out"
check "fp16: an overflow at the minimum scale ends the run (exit $rc)" $? "$out"
[ "$runs" -eq $(($(wc -l < "$work/cases") + 4)) ] || { echo "FAIL: only $runs checks ran"; fails=$((fails + 1)); }
echo "$runs checks, $fails failed"
[ "$fails" -eq 0 ]
