#!/usr/bin/env bash
# The files and the start and end of a `strata train` job under real MPI processes (issue 33):
#   start:  a bad flag, a missing data file or a device that cannot start on one rank only, or ranks given
#           different trainer options (MPMD): every rank stops within seconds, each naming the failing rank
#           and the cause;
#   dirs:   a checkpoint directory belongs to one run (Note [A directory per run]): a new run in another
#           run's directory, a rollback over later steps and --resume of a directory of two runs are refused
#           with nothing deleted; a killed save's step directory (no manifest) is removed by the next prune;
#   shared: a checkpoint directory that is not shared between the ranks (each rank its own tmpfs, through
#           unshare -m) is refused before training, every rank saying why (Note [Visible shards]; the
#           check at each save is engine_checkpoint_test's);
#   disk:   --metrics and --trace on a full disk (a tmpfs with a size limit) fail naming ENOSPC, with no
#           half line and no partial trace left behind (Note [Run outputs]);
#   sigterm: SIGTERM to one rank stops every rank with 128 + 15, never 128;
#   kills:  SIGKILL to every rank at random moments of a run that saves and prunes every step and writes
#           --save-weights (and a weights temporary a killed writer left): each resume continues from the newest complete step, and at the end no step
#           directory lacks a manifest, no temporary is left and at most --keep-last steps remain.
# usage: run_files.sh MPIRUN STRATA [section]
set -uo pipefail
mpirun=$1 strata=$2 only=${3:-all}
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"
small=(--layers 2 --d-model 64 --heads 4 --seq-len 32 --lr 1e-3 --seed 5 --print-every 1000)
seconds_since() { python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$1"; }
under() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$1" "$2"; }
want() { section=$1; [ "$only" = all ] || [ "$only" = "$section" ]; }

if want start; then
  # Each case: rank 0 as given, rank 1 with the extra flags; every rank must name rank 1 and the cause.
  while IFS='|' read -r extra cause; do
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$(timeout 120 "$mpirun" -n 1 "$strata" train "${small[@]}" --steps 3 : \
          -n 1 "$strata" train "${small[@]}" --steps 3 $extra 2>&1 < /dev/null)
    rc=$? elapsed=$(seconds_since "$t0")
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank 1.*$cause" <<<"$out" &&
      grep -Eq "rank 0 (stops|failed).*rank 1 (failed|: )|differs across ranks.*on rank 1" <<<"$out" && under "$elapsed" 30
    check "'$extra' on rank 1 only: every rank names rank 1 ($cause), exit $rc in ${elapsed}s" $? "$out"
  done <<EOF2
--bogus|unknown flag --bogus
--data $work/no_such_tokens.bin|no_such_tokens
--data-order sequential|--data-order is shuffled on rank 0 but sequential
--steps 4|--steps is 3 on rank 0 but 4
--device cuda|no CUDA device is visible
EOF2
fi

if want dirs; then
  d="$work/ck"
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 4 --checkpoint-dir "$d" --checkpoint-every 2 > /dev/null 2>&1
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 3 --checkpoint-dir "$d" --keep-last 1 2>&1)
  [ $? -ne 0 ] && grep -q "holds checkpoints of another run (step_00000002, step_00000004)" <<<"$out" &&
    [ -f "$d/step_00000002/manifest.json" ] && [ -f "$d/step_00000004/manifest.json" ]
  check "a new run in another run's checkpoint directory is refused; its steps are kept" $? "$out"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 6 --resume "$d/step_00000002" --checkpoint-dir "$d" 2>&1)
  [ $? -ne 0 ] && grep -q "after step 2, the one resumed (step_00000004)" <<<"$out" && [ -f "$d/step_00000004/manifest.json" ]
  check "a rollback over this run's later steps is refused before training" $? "$out"
  # A killed save: a step directory with a shard and no manifest. The next save of the run removes it.
  mkdir -p "$d/step_00000005" && echo x > "$d/step_00000005/shard_00000.bin"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 6 --resume "$d" --checkpoint-dir "$d" --keep-last 1 2>&1)
  [ $? -eq 0 ] && [ "$(ls "$d")" = step_00000006 ]
  check "resume, save and prune: only the newest step is left, the killed save's directory is gone" $? "$out; $(ls "$d")"
  # Checkpoints from before run identities (no trainer.run_id): the run that resumes them owns them, and so do
  # its own later resumes.
  l="$work/legacy"
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 4 --checkpoint-dir "$l" --checkpoint-every 2 > /dev/null 2>&1
  python3 - "$l" <<'PY'
import glob, json, sys
for m in glob.glob(sys.argv[1] + "/step_*/manifest.json"):
    doc = json.load(open(m))
    doc["trainer"] = {k: v for k, v in doc["trainer"].items() if k not in ("run_id", "data_fingerprint")}
    json.dump(doc, open(m, "w"))
PY
  out=$({ "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 6 --checkpoint-dir "$l" --checkpoint-every 2 --resume "$l" &&
          "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --checkpoint-dir "$l" --checkpoint-every 2 --resume "$l"; } 2>&1)
  [ $? -eq 0 ] && [ -f "$l/step_00000008/manifest.json" ] && [ -f "$l/step_00000002/manifest.json" ]
  check "a directory from before run identities is resumed, and resumed again" $? "$out"
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 2 --checkpoint-dir "$work/other" > /dev/null 2>&1
  cp -r "$work/other/step_00000002" "$d/"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --resume "$d" 2>&1)
  [ $? -ne 0 ] && grep -q "holds checkpoints of 2 different runs" <<<"$out"
  check "--resume of a directory holding two runs' steps is refused" $? "$out"
fi

if want shared; then
  mkdir -p "$work/local"
  t0=$(date +%s.%N)
  out=$(timeout 120 "$mpirun" -n 2 unshare -m sh -c "mount -t tmpfs none '$work/local' && exec '$strata' train \
        ${small[*]} --steps 2 --checkpoint-dir '$work/local'" 2>&1)
  rc=$? elapsed=$(seconds_since "$t0")
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "rank 0 does not see the files that rank 1 created" <<<"$out")" -ge 2 ] &&
    ! grep -q "^step " <<<"$out" && under "$elapsed" 30
  check "a checkpoint directory local to each rank: refused before training, both ranks say why (exit $rc)" $? "$out"
fi

if want disk; then
  mkdir -p "$work/full"
  out=$(unshare -m sh -c "mount -t tmpfs -o size=16k none '$work/full' && '$mpirun' -n 2 '$strata' train \
        ${small[*]} --steps 400 --metrics '$work/full/m.jsonl' 2>&1; echo \"rc=\$?\";
        python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]; print(\"whole lines\")' '$work/full/m.jsonl'")
  grep -q "No space left on device" <<<"$out" && grep -q "whole lines" <<<"$out" && ! grep -q "^rc=0" <<<"$out"
  check "--metrics on a full disk: an error naming ENOSPC, whole lines only, exit non-zero" $? "$out"
  out=$(unshare -m sh -c "mount -t tmpfs -o size=8k none '$work/full' && '$mpirun' -n 2 '$strata' train \
        ${small[*]} --steps 3 --trace '$work/full/t.json' 2>&1; echo \"rc=\$?\"; echo left: \$(ls '$work/full')")
  grep -q "writing trace.*No space left on device" <<<"$out" && grep -q "^left: *$" <<<"$out" && ! grep -q "^rc=0" <<<"$out"
  check "--trace on a full disk: an error naming ENOSPC, no partial file left" $? "$out"
  out=$(unshare -m sh -c "mount -t tmpfs -o size=8k none '$work/full' && '$mpirun' -n 2 '$strata' train \
        ${small[*]} --steps 3 --trace '$work/full/t.json' --save-weights '$work/w.safetensors' 2>&1; echo \"rc=\$?\"")
  grep -q "writing trace.*No space left on device" <<<"$out" && [ -s "$work/w.safetensors" ] && ! grep -q "^rc=0" <<<"$out"
  check "a trace that fails to write does not cost the trained weights" $? "$out"
fi

if want sigterm; then
  # SIGTERM_TRIES=100 with an ASan build of strata is the loop that chased issue 33's one-off heap
  # corruption after SIGTERM to one rank (decision 0031).
  for i in $(seq "${SIGTERM_TRIES:-3}"); do
    "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 100000 --metrics "$work/t$i.jsonl" > "$work/t$i.log" 2>&1 &
    job=$!
    for _ in $(seq 300); do [ -s "$work/t$i.jsonl" ] && [ "$(wc -l < "$work/t$i.jsonl")" -ge 3 ] && break; sleep 0.1; done
    sleep "$(python3 -c "import random; print(round(random.uniform(0, 0.3), 3))")"  # anywhere in a step
    for p in $(pgrep -P "$job"); do
      tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && kill -TERM "$p"
    done
    wait "$job"
    rc=$?
    # mpirun exits with the status of the first rank to end; with both at 143 it is 143 whichever that was.
    [ $rc -eq 143 ] && ! grep -q "Exit code: *128" "$work/t$i.log" && ! grep -q "Sanitizer\|corrupted" "$work/t$i.log"
    check "SIGTERM to rank 1 only (try $i): the job exits 143" $? "rc $rc; $(tail -5 "$work/t$i.log")"
  done
fi

if want kills; then
  d="$work/kills" w="$work/kills_w/w.safetensors"
  last_step() { ls "$d" 2>/dev/null | grep -E '^step_[0-9]+$' | while read -r s; do
                  [ -f "$d/$s/manifest.json" ] && echo "$((10#${s#step_}))"; done | sort -n | tail -1; }
  for i in 1 2 3 4 5 6; do
    resume=(); [ -n "$(last_step)" ] && resume=(--resume "$d")
    "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 100000 --checkpoint-dir "$d" --checkpoint-every 1 \
      --keep-last 2 --save-weights "$w" "${resume[@]}" > "$work/kills$i.log" 2>&1 &
    job=$!
    # The moment: a seeded draw after this run's first new complete step, so each kill lands in a run that saves
    # and prunes every step whatever the machine's load (a fixed draw from the launch could kill a loaded run
    # before its ranks existed, and then wait on it for good).
    latest=$(last_step)
    for _ in $(seq 1200); do
      [ "$(last_step)" != "$latest" ] && break
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
    done
    sleep "$(python3 -c "import random, sys; random.seed(4200 + int(sys.argv[1])); print(round(random.uniform(0.0, 1.5), 2))" "$i")"
    for p in $(pgrep -P "$job"); do kill -9 "$p"; done
    wait "$job" 2>/dev/null
  done
  from=$(last_step)
  # A --save-weights killed mid-write leaves its temporary (the pid of a process that has exited).
  mkdir -p "$(dirname "$w")" && dead=$(sh -c 'echo $$') && echo partial > "$w.tmp.$dead"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps $((from + 2)) --checkpoint-dir "$d" --checkpoint-every 1 \
        --keep-last 2 --save-weights "$w" --resume "$d" 2>&1)
  rc=$?
  incomplete=$(for s in "$d"/step_*; do [ -f "$s/manifest.json" ] || echo "$s"; done)
  temps=$(find "$d" "$(dirname "$w")" -name '*.tmp.*')
  [ $rc -eq 0 ] && [ -n "$from" ] && grep -q "resumed from $d/step_$(printf %08d "$from")" <<<"$out" &&
    [ -z "$incomplete" ] && [ -z "$temps" ] && [ "$(ls "$d" | wc -l)" -le 2 ] && [ -s "$w" ]
  check "6 SIGKILLs of every rank while saving and pruning each step: resumed from step $from, nothing left behind" $? \
    "rc $rc; incomplete: $incomplete; temps: $temps; $(ls "$d"); $out"
fi

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
