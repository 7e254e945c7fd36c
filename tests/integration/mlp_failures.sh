#!/usr/bin/env bash
# Failure behaviour under real MPI processes:
#  1. ranks that register different units fail at registration, and every rank prints the error;
#  2. a rank that stops responding makes the job exit non-zero within the collective timeout, with an
#     error naming that rank (never a hang); one stopped with SIGSTOP is named too, and blames itself;
#  3. bad configuration values are rejected with a message naming the key.
# usage: mlp_failures.sh MPIRUN MLP_TRAIN
set -uo pipefail
mpirun=$1 mlp=$2
fails=0 runs=0
check() {  # check NAME CONDITION-RESULT DETAIL
  runs=$((runs + 1))
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1: $3"; fails=$((fails + 1)); fi
}

out=$(timeout 60 "$mpirun" -n 4 "$mlp" --stage 3 --steps 2 --inject-mismatch-rank 2 2>&1); rc=$?
count=$(grep -c "unit registrations differ across ranks" <<<"$out")
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$count" -ge 4 ]; check "registration mismatch reported on all 4 ranks" $? "rc=$rc count=$count"

start=$(date +%s)
out=$(timeout 60 "$mpirun" -n 2 "$mlp" --stage 3 --steps 5 --timeout-ms 2000 --inject-stall-rank 1 2>&1); rc=$?
elapsed=$(( $(date +%s) - start ))
grep -q "rank(s) 1 did not respond" <<<"$out"; named=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $named -eq 0 ] && [ $elapsed -lt 30 ]
check "stalled rank 1 named, job exits non-zero in ${elapsed}s (timeout 2 s)" $? "rc=$rc named=$named; $(tail -3 <<<"$out")"
# The diagnosis fits inside the configured timeout (it once named the rank after up to twice it, 4000 ms) and
# the error reports the time measured. The bound leaves room for the loaded machine, not for that regression: a
# scheduling gap of rank 0 as the deadline passes re-graces it by late_ms (Note [Own stop]), and the liveness
# check then still waits its share, so a 150 ms stall under ctest -j 2 measured past 2200 ms.
measured=$(grep -o "not complete after [0-9]* ms (collective timeout 2000 ms" <<<"$out" | head -1 | grep -o "after [0-9]*" | grep -o "[0-9]*")
[ -n "$measured" ] && [ "$measured" -ge 2000 ] && [ "$measured" -lt 3000 ]
check "the stall is diagnosed within the 2000 ms timeout (measured ${measured:-none} ms)" $? "$(grep -m1 "timed out" <<<"$out")"

# A rank stopped (SIGSTOP) for 4 s, twice the 2 s timeout of the engine's collectives. Where the stop
# lands decides the outcome, so both are accepted, and what must hold in each is asserted:
#  - rank 0 waits in an engine collective: it times out naming rank 1, the job exits non-zero, and
#    rank 1, resumed by mpirun's SIGCONT as it kills the job, blames its own stop if it speaks at all
#    (it once said "the ranks disagree on the order of collectives" and measured the stop short);
#  - rank 0 waits in the example's loss all-reduce (60 s timeout): the job must keep training once
#    rank 1 is continued (rank 1 once gave up its collective at its first poll after the stop and
#    aborted the job, naming rank 0 as not responding).
stopfile=$(mktemp)
"$mpirun" -n 2 "$mlp" --stage 3 --steps 100000000 --timeout-ms 2000 >"$stopfile" 2>&1 & mp=$!
r1=""
for _ in $(seq 100); do
  for p in $(pgrep -P $mp); do grep -qzx OMPI_COMM_WORLD_RANK=1 /proc/$p/environ 2>/dev/null && r1=$p; done
  [ -n "$r1" ] && break; sleep 0.1
done
sleep 2; [ -n "$r1" ] && kill -STOP "$r1"; sleep 4; [ -n "$r1" ] && kill -CONT "$r1" 2>/dev/null
for _ in $(seq 50); do kill -0 $mp 2>/dev/null || break; sleep 0.2; done  # 10 s to fail, if it fails
survived=1; kill -0 $mp 2>/dev/null && survived=0 && kill -TERM $mp
for _ in $(seq 50); do kill -0 $mp 2>/dev/null || break; sleep 0.2; done
kill -0 $mp 2>/dev/null && kill -KILL $mp; wait $mp; rc=$?
out=$(cat "$stopfile"); rm -f "$stopfile"
if [ $survived -eq 0 ]; then
  ! grep -q "timed out" <<<"$out"; result=$?; spoke="the job kept training"
else
  grep -q "(rank 0 of 2) timed out.*rank(s) 1 did not respond" <<<"$out"; named=$?
  r1said=$(grep -m1 "(rank 1 of 2) timed out" <<<"$out")
  [ -z "$r1said" ] || grep -q "this rank itself did not run for at least" <<<"$r1said"; own=$?
  ! grep -q "disagree on the order of collectives" <<<"$out"; nodisorder=$?
  [ $rc -ne 0 ] && [ $named -eq 0 ] && [ $own -eq 0 ] && [ $nodisorder -eq 0 ]; result=$?
  spoke="rank 0 names it, rank 1 said nothing"; [ -n "$r1said" ] && spoke="rank 0 names it, rank 1 blames its own stop"
fi
[ -n "$r1" ]; found=$?; [ $found -eq 0 ] && [ $result -eq 0 ]; result=$?
check "rank 1 stopped for 4 s (timeout 2 s): $spoke" $result "pid=$r1 rc=$rc; $(grep "timed out" <<<"$out" | head -3)"

out=$(timeout 60 "$mpirun" -n 1 "$mlp" --stage 4 --steps 1 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "zero_optimization.stage" <<<"$out"; check "stage 4 rejected naming the key" $? "$out"

out=$(timeout 60 "$mpirun" -n 1 "$mlp" --set zero_optimization.stag=2 --steps 1 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "did you mean 'zero_optimization.stage'" <<<"$out"; check "unknown key suggests the nearest" $? "$out"

out=$(timeout 60 "$mpirun" -n 1 "$mlp" --lr -1 --steps 1 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "optimizer.params.lr" <<<"$out"; check "negative lr rejected naming the key" $? "$out"

out=$(timeout 60 "$mpirun" -n 1 "$mlp" --config / --steps 1 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "config file '/' is a directory, not a file" <<<"$out"
check "a directory as --config is named" $? "$out"

out=$(timeout 60 "$mpirun" -n 1 "$mlp" --global-batch 9223372036854775807 --steps 1 2>&1); rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q -- "--global-batch 9223372036854775807 is out of range" <<<"$out"
check "a --global-batch past int is out of range, not narrowed" $? "$out"

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
