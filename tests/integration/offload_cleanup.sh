#!/usr/bin/env bash
# Nothing left behind (Note [Swap files leave nothing behind], runtime/offload/nvme_files.h): `strata train` with
# parameters and optimizer state on NVMe, on 2 ranks, ended by a normal finish, by an error, by SIGINT,
# SIGTERM and SIGKILL in the middle of its steps, leaves no file in the NVMe directory; and a dead run's
# file (as a SIGKILL between a file's creation and its unlink, or an older release, leaves it) is
# reclaimed by the next run, which names it.
# usage: offload_cleanup.sh MPIRUN STRATA
set -uo pipefail
mpirun=$1 strata=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fails=0
check() {  # check NAME STATUS DETAIL
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$3" | tail -8; fails=$((fails + 1)); fi
}
nvme="$work/nvme"
mkdir -p "$nvme"
args=(train --layers 2 --d-model 64 --heads 4 --seq-len 32 --micro-batch 2 --stage 3 --print-every 1
      --offload-params nvme --offload-optimizer nvme --nvme-path "$nvme")
left() { find "$nvme" -mindepth 1 | sed 's/^/  left: /'; }

out=$("$mpirun" -n 2 "$strata" "${args[@]}" --steps 3 2>&1); rc=$?
check "normal end: exit 0" $rc "$out"
[ -z "$(left)" ]; check "normal end: nothing left in the NVMe directory" $? "$(left)"

out=$("$mpirun" -n 2 "$strata" "${args[@]}" --steps 3 --data "$work/missing.bin" 2>&1); rc=$?
[ $rc -ne 0 ]; check "error (missing data): non-zero exit" $? "$out"
[ -z "$(left)" ]; check "error: nothing left" $? "$(left)"

for sig in INT TERM KILL; do
  log="$work/run-$sig.log"
  "$mpirun" -n 2 "$strata" "${args[@]}" --steps 100000 > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do  # until a step has run (the files exist and are in use), at most 60 s
    grep -q "^step" "$log" && break
    sleep 0.1
  done
  grep -q "^step" "$log"; check "SIG$sig: the run was training when signalled" $? "$(tail -5 "$log")"
  # mpirun forwards INT and TERM to the ranks; SIGKILL goes to the ranks themselves (mpirun cannot forward it).
  if [ $sig = KILL ]; then pkill -KILL -P "$pid" 2>/dev/null; fi
  kill -s $sig "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  sleep 0.5
  [ -z "$(left)" ]; check "SIG$sig: nothing left in the NVMe directory" $? "$(left)"
done

# A file a dead run left behind, as an older release or a SIGKILL in the instant between a file's creation
# and its unlink leaves it: the next run reclaims it and says so.
fallocate -l 1MiB "$nvme/strata-swap-r0.0.swap"
out=$("$mpirun" -n 2 "$strata" "${args[@]}" --steps 1 2>&1); rc=$?
check "after a dead run: exit 0" $rc "$out"
grep -q "reclaimed '$nvme/strata-swap-r0.0.swap'" <<<"$out"; check "the dead run's file is named as reclaimed" $? "$out"
[ -z "$(left)" ]; check "after a dead run: nothing left" $? "$(left)"

[ "$fails" -eq 0 ] && echo "offload_cleanup: all checks passed"
exit "$fails"
