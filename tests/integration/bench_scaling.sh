#!/usr/bin/env bash
# `strata bench scaling` at 1 and 2 ranks on a small GPT: one JSON object with positive samples/s, an
# efficiency that is their ratio, and the table form; bad usage exits 2 naming the problem.
# usage: bench_scaling.sh MPIRUN STRATA
set -uo pipefail
mpirun=$1 strata=$2
export OMP_NUM_THREADS=1
fails=0
check() {  # check NAME STATUS OUTPUT
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$3" | tail -20; fails=$((fails + 1)); fi
}
small=(--layers 2 --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --steps 2 --stage 3)

out=$("$strata" bench scaling --ranks 2 --mpirun "$mpirun" "${small[@]}" --json 2>&1); rc=$?
verdict=$(python3 -c '
import json, sys
d = json.loads([l for l in sys.stdin.read().splitlines() if l.startswith("{")][-1])
one, two = d["one_rank"], d["n_ranks"]
assert d["ranks"] == 2 and one["ranks"] == 1 and two["ranks"] == 2, d
assert d["samples_per_s_1"] > 0 and d["samples_per_s_per_rank_n"] > 0
expect = two["tokens_per_s"] / 32 / 2 / (one["tokens_per_s"] / 32)
assert abs(d["scaling_efficiency"] - expect) < 1e-9 * expect, (d["scaling_efficiency"], expect)
print("ok efficiency %.3f" % d["scaling_efficiency"])
' <<<"$out" 2>&1)
[ $rc -eq 0 ] && [[ $verdict == ok* ]]; check "1 vs 2 ranks, --json: $verdict" $? "$out"

out=$("$strata" bench scaling --ranks 2 --mpirun "$mpirun" "${small[@]}" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "scaling efficiency at 2 ranks" <<<"$out" && grep -q "samples/s/rank" <<<"$out"
check "1 vs 2 ranks, table" $? "$out"

out=$("$strata" bench scaling --mpirun "$mpirun" "${small[@]}" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "\-\-ranks N is required" <<<"$out"; check "no --ranks: exit 2 ($rc)" $? "$out"
out=$("$strata" bench scaling --ranks 2 --micro-bath 2 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "did you mean --micro-batch" <<<"$out"; check "misspelt flag: exit 2 ($rc)" $? "$out"
out=$("$strata" bench scaling --ranks 2 --mpirun /nonexistent/mpirun "${small[@]}" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "posix_spawnp(/nonexistent/mpirun)" <<<"$out"; check "missing launcher: exit 1 ($rc), named" $? "$out"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
