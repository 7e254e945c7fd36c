#!/usr/bin/env bash
# The real DeepSpeed configs of tests/configs/deepspeed (sources in SOURCES.md) through
# `strata train --config FILE`, 2 steps of a tiny GPT at 1 rank: each trains unchanged, or is refused once
# (exit 1, one error) naming exactly the key paths expected.json lists for it (docs/decisions/0028).
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
  out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --config "$dir/$name" 2>&1); rc=$?
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
echo "$runs checks, $fails failed"
[ "$fails" -eq 0 ]
