#!/usr/bin/env bash
# Asynchronous checkpoints of `strata train` (--checkpoint-async; docs/decisions/0036-async-checkpoints.md)
# under real MPI processes:
#   resume:  a run that saves asynchronously and resumes continues with the same losses, bit for bit, as the
#            uninterrupted run; its step directory equals a synchronous save's of the same step (shards)
#   kills:   SIGKILL to every rank at 10 moments drawn by a seeded RNG, of a run that saves asynchronously
#            every step (so a save is nearly always being written) and prunes: after each kill every step
#            directory with a manifest verifies (`strata ckpt inspect --verify`: never a half-written one that
#            looks complete), and the next run resumes from the newest of them; at the end nothing is left
#            behind. The assertions hold at any moment of a kill; the RNG only spreads the moments.
#   nvme:    with the optimizer state on NVMe (held by the save, not copied: decision 0046), saves every 2 steps
#            while training goes on write the shards of a synchronous run's saves, byte for byte, and the
#            losses are those of that run
#   xfs:     nvme and kills again, with the NVMe state and the checkpoints on a small XFS with reflink (a loop
#            device), where the asynchronous writer clones the held tiles (decision 0057); needs root and xfsprogs,
#            skipped without them unless STRATA_REQUIRE_XFS=1 (.ci/run), which makes that a failure
# usage: async_checkpoint.sh MPIRUN STRATA [section]
set -uo pipefail
mpirun=$1 strata=$2 only=${3:-all}
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"
small=(--layers 2 --d-model 64 --heads 4 --seq-len 32 --lr 1e-3 --seed 5 --print-every 1000)
want() { section=$1; [ "$only" = all ] || [ "$only" = "$section" ]; }

if want resume; then
  d="$work/r"
  "$mpirun" -n 2 "$strata" train "${small[@]}" --stage 3 --steps 10 --micro-batch 2 --metrics "$d.full.jsonl" \
    --checkpoint-dir "$d.sync" --checkpoint-every 5 > /dev/null 2>&1
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --stage 3 --steps 5 --micro-batch 2 --checkpoint-dir "$d" \
        --checkpoint-async 2>&1)
  rc=$?
  [ $rc -eq 0 ] && grep -q "checkpoint: $d/step_00000005" <<<"$out" && [ -f "$d/step_00000005/manifest.json" ] &&
    cmp -s "$d/step_00000005/shard_00000.bin" "$d.sync/step_00000005/shard_00000.bin" &&
    cmp -s "$d/step_00000005/shard_00001.bin" "$d.sync/step_00000005/shard_00001.bin"
  check "--checkpoint-async writes step 5, its shards equal the synchronous save's" $? "rc $rc; $out"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --stage 3 --steps 10 --micro-batch 2 --resume "$d" \
        --metrics "$d.resumed.jsonl" 2>&1) && out=$(same_losses "$d.full.jsonl" "$d.resumed.jsonl" 5)
  check "resumed from the asynchronous save at step 5, losses of steps 6-10 $out" $? "$out"
  out=$("$strata" train "${small[@]}" --steps 2 --checkpoint-async 2>&1)
  [ $? -ne 0 ] && grep -q "need --checkpoint-dir" <<<"$out"
  check "--checkpoint-async without --checkpoint-dir is refused" $? "$out"
fi

nvme_saves() {  # nvme_saves DIR: the nvme section's runs and checks, in DIR.*
  local d=$1 what=${2:-}
  mkdir -p "$d.nvme"
  nvme=(--stage 3 --steps 6 --micro-batch 2 --checkpoint-every 2 --offload-optimizer nvme --nvme-path "$d.nvme")
  "$mpirun" -n 2 "$strata" train "${small[@]}" "${nvme[@]}" --metrics "$d.sync.jsonl" --checkpoint-dir "$d.sync" \
    > /dev/null 2>&1
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" "${nvme[@]}" --metrics "$d.async.jsonl" --checkpoint-dir "$d" \
        --checkpoint-async 2>&1)
  rc=$?
  same=0
  for s in 2 4 6; do
    for r in 0 1; do
      f="step_$(printf %08d $s)/shard_0000$r.bin"
      [ -f "$d/$f" ] && cmp -s "$d/$f" "$d.sync/$f" && same=$((same + 1))
    done
  done
  [ $rc -eq 0 ] && [ $same -eq 6 ]
  check "NVMe state$what: the asynchronous saves of steps 2, 4, 6 equal the synchronous ones ($same of 6 shards)" \
    $? "rc $rc; $out"
  out=$(same_losses "$d.sync.jsonl" "$d.async.jsonl" 0)
  check "NVMe state$what: the losses over the asynchronous saves are the synchronous run's $out" $? "$out"
}

kill_trials() {  # kill_trials DIR WHAT TRAIN-ARGS...: the kills section's trials, checkpoints in DIR
  local d=$1 what=$2; shift 2
  local extra=("$@") partial=0 i latest resume job s bad steps from out rc incomplete temps
  complete_steps() { ls "$d" 2>/dev/null | grep -E '^step_[0-9]+$' | while read -r s; do
                       [ -f "$d/$s/manifest.json" ] && echo "$((10#${s#step_}))"; done | sort -n; }
  for i in $(seq 10); do
    latest=$(complete_steps | tail -1)
    resume=(); [ -n "$latest" ] && resume=(--resume "$d")
    "$mpirun" -n 2 "$strata" train "${small[@]}" --d-model 128 --steps 100000 --checkpoint-dir "$d" \
      --checkpoint-every 1 --checkpoint-async --keep-last 2 "${extra[@]}" "${resume[@]}" > "$d.kills$i.log" 2>&1 &
    job=$!
    # The moment: a seeded draw after this run's first new complete step (so each trial kills a run that is
    # saving every step, whatever the machine's speed).
    for _ in $(seq 1200); do
      [ "$(complete_steps | tail -1)" != "$latest" ] && [ -n "$(complete_steps | tail -1)" ] && break
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
    done
    sleep "$(python3 -c "import random, sys; random.seed(3600 + int(sys.argv[1])); print(round(random.uniform(0.0, 1.5), 2))" "$i")"
    for p in $(pgrep -P "$job"); do kill -9 "$p"; done
    wait "$job" 2>/dev/null
    if [ -n "$latest" ]; then
      grep -q "resumed from $d/step_$(printf %08d "$latest")" "$d.kills$i.log"
      check "kill $i$what: the run resumed from the newest complete step ($latest)" $? "$(tail -5 "$d.kills$i.log")"
    fi
    bad=""
    for s in $(complete_steps); do
      "$strata" ckpt inspect "$d/step_$(printf %08d "$s")" --verify 2>&1 | grep -q "verify: ok" || bad="$bad $s"
    done
    for s in "$d"/step_*; do [ -f "$s/manifest.json" ] || partial=$((partial + 1)); done
    steps=$(complete_steps | tr '\n' ' ')
    [ -z "$bad" ] && [ -n "$steps" ]
    check "kill $i$what: every step with a manifest verifies ($steps)" $? "failed:$bad; $(ls "$d")"
  done
  echo "info: $partial step directories were left without a manifest by the kills (saves cut mid-write)"
  from=$(complete_steps | tail -1)
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --d-model 128 --steps $((from + 2)) --checkpoint-dir "$d" \
        --checkpoint-every 1 --checkpoint-async --keep-last 2 "${extra[@]}" --resume "$d" 2>&1)
  rc=$?
  incomplete=$(for s in "$d"/step_*; do [ -f "$s/manifest.json" ] || echo "$s"; done)
  temps=$(find "$d" -name '*.tmp.*')
  [ $rc -eq 0 ] && grep -q "resumed from $d/step_$(printf %08d "$from")" <<<"$out" && [ -z "$incomplete" ] &&
    [ -z "$temps" ] && [ "$(ls "$d" | wc -l)" -le 2 ]
  check "after 10 kills$what: resumed from step $from, finished, nothing left behind" $? \
    "rc $rc; incomplete: $incomplete; temps: $temps; $(ls "$d"); $out"
}

want nvme && nvme_saves "$work/n"
want kills && kill_trials "$work/kills" ""

if want xfs; then
  img="$work/xfs.img" xfs="$work/xfs"
  mkdir -p "$xfs"
  if truncate -s 512M "$img" && mkfs.xfs -q -f -m reflink=1 "$img" > /dev/null 2>&1 &&
     mount -o loop "$img" "$xfs" 2> /dev/null; then
    trap 'umount "$xfs"; rm -rf "$work"' EXIT
    nvme_saves "$xfs/n" " on XFS (cloned)"
    mkdir -p "$xfs/kills.nvme"
    kill_trials "$xfs/kills" " (NVMe state on XFS, cloned)" --stage 3 --offload-optimizer nvme \
      --nvme-path "$xfs/kills.nvme"
  elif [ "${STRATA_REQUIRE_XFS:-0}" = 1 ]; then
    check "a 512 MiB XFS on a loop device (root, xfsprogs) for the clone runs" 1 "mkfs.xfs or mount -o loop failed"
  else
    echo "skipped: no XFS on a loop device here (needs root and xfsprogs); STRATA_REQUIRE_XFS=1 makes this a failure"
  fi
fi

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
