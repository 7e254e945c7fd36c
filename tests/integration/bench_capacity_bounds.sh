#!/usr/bin/env bash
# `strata bench capacity` stopped before it converges (bench_capacity.sh runs this): by SIGINT / SIGTERM
# in the middle of the search, it ends within seconds, naming how many candidates finished and where, and
# --results holds exactly those, as valid JSON lines (Note [Interrupted search]); --time-limit ends the
# search well before an unbounded one would, with the table of what finished and the largest of them;
# --max-params bounds the search, which converges on the largest model under it.
# usage: bench_capacity_bounds.sh MPIRUN STRATA WORKDIR
set -uo pipefail
mpirun=$1 strata=$2 work=$3
export OMP_NUM_THREADS=1
fails=0
check() {  # check NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; echo "$3" | tail -8; fails=$((fails + 1)); fi
}
# Budgets far above what the tiny model needs: the search goes on for minutes unless stopped.
args=(bench capacity --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --device-budget 1GiB --host-budget 1GiB)
valid_lines() { python3 -c "import json, sys; print(sum(1 for l in open(sys.argv[1]) if json.loads(l)))" "$1"; }

for sig in INT TERM; do
  res="$work/stop-$sig.jsonl" log="$work/stop-$sig.log"
  "$mpirun" -n 1 "$strata" "${args[@]}" --results "$res" > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 1200); do  # until 3 candidates finished, at most 120 s
    [ -f "$res" ] && [ "$(wc -l < "$res")" -ge 3 ] && break
    sleep 0.1
  done
  sleep 0.3  # most likely inside a candidate now
  # mpirun passes SIGTERM on to the rank, and SIGINT as SIGTERM too: SIGINT goes to the rank itself, as a
  # Ctrl-C in a terminal reaches every process of the foreground job.
  if [ $sig = INT ]; then pkill -INT -P "$pid"; else kill -s $sig "$pid"; fi
  start=$(date +%s.%N)
  wait "$pid"
  rc=$?
  took=$(python3 -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$start" "$(date +%s.%N)")
  lines=$(valid_lines "$res"); valid=$?
  [ $rc -ne 0 ] && python3 -c "import sys; sys.exit(float(sys.argv[1]) > 10)" "$took"
  check "SIG$sig: exits non-zero within 10 s (${took} s)" $? "$(tail -3 "$log")"
  grep -q "strata bench capacity: stopped by SIG$sig; finished candidates: $lines, in $res" "$log"
  check "SIG$sig: the message names the $lines finished candidates and the file" $? "$(tail -3 "$log")"
  [ $valid -eq 0 ] && [ "$lines" -ge 3 ] && [ "$lines" -eq "$(wc -l < "$res")" ]
  check "SIG$sig: --results holds $lines whole, valid JSON lines" $? "$(tail -c 300 "$res")"
  [ "$(grep -c '^  fits\|^  does not fit' "$log")" -eq "$lines" ]
  check "SIG$sig: one line per candidate that finished" $? "$(tail -3 "$log")"
done

# --time-limit: the unbounded search takes minutes (the SIGINT run above was still going after 3 candidates).
start=$(date +%s)
out=$("$mpirun" -n 1 "$strata" "${args[@]}" --time-limit 3 --results "$work/limit.jsonl" 2>&1); rc=$?
took=$(($(date +%s) - start))
check "--time-limit 3: exit 0" $rc "$out"
[ $took -le 20 ]; check "--time-limit 3: ended after ${took} s" $? "$out"
grep -q "^search stopped early: --time-limit 3 s reached" <<<"$out" && grep -q "^largest model within the budgets" <<<"$out"
check "--time-limit: says so, and prints the largest that finished" $? "$out"
rows=$(sed -n '/^candidates (in the order tried)/,/^search stopped/p' <<<"$out" | grep -cE '^ +[0-9]+ +64 ')
[ "$rows" -ge 1 ] && [ "$rows" -eq "$(valid_lines "$work/limit.jsonl")" ]
check "--time-limit: the table has the $rows finished candidates of --results" $? "$out"

# --max-params: the search stops at the bound and converges on the largest model under it.
out=$("$mpirun" -n 1 "$strata" "${args[@]}" --max-params 1e6 --results "$work/max.jsonl" 2>&1); rc=$?
check "--max-params 1e6: exit 0" $rc "$out"
grep -q "over --max-params 1000000, not tried" <<<"$out"; check "--max-params: a larger candidate is not tried" $? "$out"
python3 - "$out" "$work/max.jsonl" <<'PY'
import json, re, sys
out, path = sys.argv[1:]
largest = int(re.search(r"largest model within the budgets: layers (\d+).*, (\d+) parameters", out).group(2))
lines = [json.loads(l) for l in open(path)]
assert all(j["params"] <= 1e6 for j in lines), "a candidate over --max-params ran"
a, b = sorted(lines, key=lambda j: j["layers"])[-2:]
per_layer = (b["params"] - a["params"]) / (b["layers"] - a["layers"])
assert largest <= 1e6 < largest + per_layer, f"{largest} + one layer ({per_layer}) is still under the bound"
PY
check "--max-params: the largest model is the last under 1e6 parameters" $? "$out"
[ "$fails" -eq 0 ] && echo "bench_capacity_bounds: all checks passed"
exit "$fails"
