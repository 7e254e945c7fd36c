#!/usr/bin/env bash
# Checkpoints and failure handling of `strata train` under real MPI processes:
#   resume:    same world size, stages 1-3: the loss trajectory after resuming is bitwise identical; the
#              same --metrics continues its file; a checkpoint at or past --steps is refused;
#   reshard:   saved at 4 ranks, resumed at 2 and at 1; saved at 1, resumed at 4: the final weights match
#              the uninterrupted run within fp32 tolerance (per-tensor relative L2 <= 1e-5);
#   tools:     ckpt inspect --verify passes, then fails naming the range after a flipped byte; ckpt export
#              writes HF-named weights that --init-from loads; a manifest naming a shard outside its step
#              directory, or a mistyped next_step, is a named error (exit 1-127) for inspect, export, --resume;
#   failures:  one rank killed (SIGKILL) or stopped (SIGSTOP) mid-run makes every rank exit non-zero
#              within the bound, with blocks small and large enough for both reduce-scatter paths;
#              SIGTERM stops the job cleanly at a step boundary with no partial checkpoint; ranks started with
#              different flags (MPMD) are refused at once, naming the key (Note [One configuration]).
# usage: resilience.sh MPIRUN STRATA [section]
set -uo pipefail
mpirun=$1 strata=$2 only=${3:-all}
# shellcheck source=checks.sh
source "$(dirname "$0")/checks.sh"
small=(--layers 2 --d-model 64 --heads 4 --seq-len 32 --lr 1e-3 --seed 5 --print-every 1000)
exclude="h.0.attn.c_attn.bias[64:128],h.1.attn.c_attn.bias[64:128]"

if [ "$only" = all ] || [ "$only" = resume ]; then
  for stage in 1 2 3; do
    d="$work/r$stage"
    "$mpirun" -n 2 "$strata" train "${small[@]}" --stage $stage --steps 10 --micro-batch 2 --metrics "$d.full.jsonl" > /dev/null 2>&1
    "$mpirun" -n 2 "$strata" train "${small[@]}" --stage $stage --steps 5 --micro-batch 2 --checkpoint-dir "$d" > /dev/null 2>&1
    out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --stage $stage --steps 10 --micro-batch 2 --resume "$d" \
          --metrics "$d.resumed.jsonl" 2>&1) && out=$(same_losses "$d.full.jsonl" "$d.resumed.jsonl" 5)
    rc=$?
    check "stage $stage: resumed at step 5, losses of steps 6-10 $out" $rc "$out"
  done
  mkdir -p "$work/nvme"
  for offload in "--offload-optimizer cpu --offload-params cpu" "--offload-optimizer nvme --nvme-path $work/nvme" \
                 "--offload-optimizer nvme --offload-params nvme --nvme-path $work/nvme"; do
    d="$work/o$(echo "$offload" | tr -dc 'a-z' | cut -c1-40)"
    # shellcheck disable=SC2086
    "$mpirun" -n 2 "$strata" train "${small[@]}" --stage 3 $offload --steps 10 --micro-batch 2 --metrics "$d.full.jsonl" > /dev/null 2>&1
    # shellcheck disable=SC2086
    "$mpirun" -n 2 "$strata" train "${small[@]}" --stage 3 $offload --steps 5 --micro-batch 2 --checkpoint-dir "$d" > /dev/null 2>&1
    # shellcheck disable=SC2086
    out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --stage 3 $offload --steps 10 --micro-batch 2 --resume "$d" \
          --metrics "$d.resumed.jsonl" 2>&1) && out=$(same_losses "$d.full.jsonl" "$d.resumed.jsonl" 5)
    rc=$?
    check "stage 3 with ${offload%% --nvme-path*}: resumed at step 5, losses of steps 6-10 $out" $rc "$out"
  done
fi

if [ "$only" = all ] || [ "$only" = resume ]; then
  # Resuming with the same --metrics continues the file (issue 33: it was emptied): the lines up to the
  # checkpoint are kept, the run's later lines are replaced by the resumed ones (the same bits), each step
  # once; a checkpoint at or past --steps is refused before anything is written.
  m="$work/m.jsonl"
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 2 --checkpoint-dir "$work/mc" \
    --checkpoint-every 4 --metrics "$m" > /dev/null 2>&1
  cp "$m" "$work/m.first.jsonl"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 2 --resume "$work/mc/step_00000004" \
        --metrics "$m" 2>&1) && out=$(python3 - "$work/m.first.jsonl" "$m" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = [r["step"] for r in b] == list(range(1, 9)) and [(r["loss"], r["grad_norm"]) for r in a] == \
    [(r["loss"], r["grad_norm"]) for r in b]
print("steps 1-8 once each, the same losses" if same else f"steps {[r['step'] for r in b]}")
sys.exit(0 if same else 1)
PY
)
  check "resumed at step 4 with the same --metrics: $out" $? "$out"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 3 --micro-batch 2 --resume "$work/mc" --metrics "$m" 2>&1)
  rc=$?
  [ $rc -ne 0 ] && grep -q "is at step 8 and --steps is 3, so there is nothing to train" <<<"$out" &&
    [ "$(wc -l < "$m")" -eq 8 ]
  check "resumed at step 8 with --steps 3: refused (exit $rc), the metrics kept" $? "$out"
fi

if [ "$only" = all ] || [ "$only" = reshard ]; then
  # Global batch 8 at every world size: micro-batch 8 / world.
  "$mpirun" -n 4 "$strata" train "${small[@]}" --steps 12 --micro-batch 2 --save-weights "$work/full4.safetensors" > /dev/null 2>&1
  "$mpirun" -n 4 "$strata" train "${small[@]}" --steps 4 --micro-batch 2 --checkpoint-dir "$work/c4" > /dev/null 2>&1
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 4 --stage 2 --resume "$work/c4" \
    --checkpoint-dir "$work/c2" > /dev/null 2>&1
  out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --steps 12 --micro-batch 8 --stage 0 --resume "$work/c2" \
        --save-weights "$work/via421.safetensors" 2>&1) &&
    out=$("$strata" compare "$work/via421.safetensors" "$work/full4.safetensors" --per-tensor --rtol 1e-5 --exclude "$exclude")
  rc=$?
  check "4 -> 2 -> 1 ranks: $(grep compare: <<<"$out")" $rc "$out"
  "$mpirun" -n 1 "$strata" train "${small[@]}" --steps 12 --micro-batch 8 --save-weights "$work/full1.safetensors" > /dev/null 2>&1
  "$mpirun" -n 1 "$strata" train "${small[@]}" --steps 6 --micro-batch 8 --checkpoint-dir "$work/c1" > /dev/null 2>&1
  out=$("$mpirun" -n 4 "$strata" train "${small[@]}" --steps 12 --micro-batch 2 --resume "$work/c1" \
        --save-weights "$work/via14.safetensors" 2>&1) &&
    out=$("$strata" compare "$work/via14.safetensors" "$work/full1.safetensors" --per-tensor --rtol 1e-5 --exclude "$exclude")
  rc=$?
  check "1 -> 4 ranks: $(grep compare: <<<"$out")" $rc "$out"
fi

if [ "$only" = all ] || [ "$only" = tools ]; then
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 6 --micro-batch 2 --checkpoint-dir "$work/t" \
    --checkpoint-every 2 --keep-last 2 > /dev/null 2>&1
  n=$(ls -d "$work"/t/step_* | wc -l)
  [ "$n" -eq 2 ] && [ -d "$work/t/step_00000006" ] && [ -d "$work/t/step_00000004" ]
  check "--keep-last 2 keeps the two newest of 3 checkpoints ($n left)" $? "$(ls "$work/t")"
  out=$("$strata" ckpt inspect "$work/t" --verify 2>&1)
  grep -q "verify: ok" <<<"$out"; check "ckpt inspect --verify on a good checkpoint" $? "$out"
  out=$("$strata" ckpt export "$work/t" -o "$work/t.safetensors" 2>&1) &&
    out=$("$mpirun" -n 1 "$strata" train "${small[@]}" --steps 1 --micro-batch 2 --init-from "$work/t.safetensors" 2>&1)
  check "ckpt export writes HF-named weights that --init-from loads" $? "$out"
  hostile() {  # hostile NAME FROM TO: a copy of step 6 under $work/NAME with FROM replaced by TO in its manifest
    mkdir -p "$work/$1" && cp -r "$work/t/step_00000006" "$work/$1/" &&
      python3 -c "import sys; p = sys.argv[1]; t = open(p).read(); assert sys.argv[2] in t; open(p, 'w').write(t.replace(sys.argv[2], sys.argv[3], 1))" \
        "$work/$1/step_00000006/manifest.json" "$2" "$3"
  }
  named_error() {  # named_error RC OUTPUT TEXT: exit status 1-127 (no signal) and TEXT in the output
    [ "$1" -ge 1 ] && [ "$1" -le 127 ] && grep -qF -- "$3" <<<"$2"
  }
  hostile out '"shard_00001.bin"' '"../outside.bin"' && mv "$work/out/step_00000006/shard_00001.bin" "$work/out/outside.bin"
  out=$("$strata" ckpt inspect "$work/out" --verify 2>&1); rc=$?
  named_error $rc "$out" "shards[1].file"; check "ckpt inspect refuses a shard named outside its step directory" $? "$out"
  out=$("$strata" ckpt export "$work/out" -o "$work/out.safetensors" 2>&1); rc=$?
  named_error $rc "$out" "shards[1].file"; check "ckpt export refuses a shard named outside its step directory" $? "$out"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 2 --resume "$work/out" 2>&1); rc=$?
  named_error $rc "$out" "shards[1].file"; check "--resume refuses a shard named outside its step directory" $? "$out"
  hostile link '"crc32"' '"crc32"' && mv "$work/link/step_00000006/shard_00001.bin" "$work/link/outside.bin" &&
    ln -s ../outside.bin "$work/link/step_00000006/shard_00001.bin"
  out=$("$strata" ckpt inspect "$work/link" --verify 2>&1); rc=$?
  named_error $rc "$out" "symlink"; check "ckpt inspect --verify refuses a shard symlinked outside" $? "$out"
  hostile next '"next_step": 6' '"next_step": "6"'
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 2 --resume "$work/next" 2>&1); rc=$?
  named_error $rc "$out" "trainer.next_step"; check "--resume with a mistyped next_step is a named error (exit $rc)" $? "$out"
  hostile renamed '"next_step": 6' '"next_step": 4'
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 2 --resume "$work/renamed" 2>&1); rc=$?
  named_error $rc "$out" "named for step 6"; check "--resume refuses next_step disagreeing with the directory" $? "$out"
  python3 - "$work/t/step_00000006/shard_00001.bin" <<'PY'
import os, sys
p = sys.argv[1]; f = open(p, "r+b"); f.seek(os.path.getsize(p) - 9); b = f.read(1); f.seek(-1, 1)
f.write(bytes([b[0] ^ 0xff])); f.close()
PY
  out=$("$strata" ckpt inspect "$work/t" --verify 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "fails its checksum" <<<"$out"; check "a flipped byte fails --verify naming the range" $? "$out"
  out=$("$mpirun" -n 2 "$strata" train "${small[@]}" --steps 8 --micro-batch 2 --resume "$work/t" 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "fails its checksum" <<<"$out"; check "resuming from the corrupted checkpoint is an error" $? "$out"
fi

rank_pid() {  # rank_pid MPIRUN_PID RANK
  for p in $(pgrep -P "$1"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
  done
}
start_job() {  # start_job NAME EXTRA...: a long 2-rank run in the background, waiting for its 3rd step
  local name=$1; shift
  "$mpirun" -n 2 "$strata" train "${small[@]}" --steps 100000 --micro-batch 2 --collective-timeout 3 \
    --metrics "$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 &
  job=$!
  for _ in $(seq 200); do [ -s "$work/$name.jsonl" ] && [ "$(wc -l < "$work/$name.jsonl")" -ge 3 ] && break; sleep 0.1; done
}
finish_job() {  # waits for the job (at most 60 s), sets rc and elapsed
  local t0=$(date +%s.%N)
  for _ in $(seq 600); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2>/dev/null; then kill -9 "$job"; rc=124; else wait "$job"; rc=$?; fi
  elapsed=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)")
}

if [ "$only" = all ] || [ "$only" = failures ]; then
  # d-model 64: every reduce-scatter is MPI's collective; d-model 256: each block's reduce-scatter moves
  # 1.5 MiB per rank, over point to point (Note [Reduce-scatter over point to point]).
  for width in 64 256; do
    start_job kill$width --d-model $width
    kill -9 "$(rank_pid $job 1)"
    finish_job
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 20 else 1)" "$elapsed"
    check "d-model $width, rank 1 killed: the job exits non-zero ($rc) in ${elapsed}s" $? "$(tail -5 "$work/kill$width.log")"
    start_job stop$width --d-model $width
    pid=$(rank_pid $job 1)
    kill -STOP "$pid"
    finish_job
    kill -9 "$pid" 2>/dev/null
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "rank(s) 1 did not respond" "$work/stop$width.log" &&
      python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 20 else 1)" "$elapsed"
    check "d-model $width, rank 1 stopped (SIGSTOP): named, the job exits non-zero ($rc) in ${elapsed}s (timeout 3 s)" $? \
      "$(tail -5 "$work/stop$width.log")"
  done
  # Ranks started with different flags (an MPMD launch): every rank fails at once naming the key and the
  # values (Note [One configuration]), instead of training on different settings.
  for flag in "--lr 2e-3" "--seed 6" "--stage 2" "--micro-batch 3" "--grad-clip 0.5"; do
    key=$(case "$flag" in --lr*) echo optimizer.params.lr;; --seed*) echo strata.seed;; --stage*)
          echo zero_optimization.stage;; --micro-batch*) echo train_micro_batch_size_per_gpu;; *) echo gradient_clipping;; esac)
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    out=$(timeout 120 "$mpirun" -n 1 "$strata" train "${small[@]}" --steps 3 --micro-batch 2 : \
          -n 1 "$strata" train "${small[@]}" --steps 3 --micro-batch 2 $flag 2>&1)
    rc=$?
    elapsed=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$t0")
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "configuration differs across ranks: $key is" <<<"$out")" -ge 1 ] &&
      python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 30 else 1)" "$elapsed"
    check "ranks started with and without '$flag': refused naming $key (exit $rc) in ${elapsed}s" $? "$out"
  done
  # A flag only one rank has wrong: that rank names itself and ends the job, instead of leaving its peer in
  # MPI's communicator creation, which has no deadline (it hung forever, even with --collective-timeout).
  t0=$(date +%s.%N)
  out=$(timeout 120 "$mpirun" -n 1 "$strata" train "${small[@]}" --steps 3 : \
        -n 1 "$strata" train "${small[@]}" --steps 3 --bogus 2>&1)
  rc=$?
  elapsed=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 1))" "$t0")
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "strata train: rank 1: unknown flag --bogus" <<<"$out" &&
    python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 30 else 1)" "$elapsed"
  check "an unknown flag on rank 1 only: named, the job ends (exit $rc) in ${elapsed}s" $? "$out"
  start_job term --checkpoint-dir "$work/term" --checkpoint-every 1
  # To every rank, as a scheduler's stop (scancel, a preemption) or a terminal's group signal delivers it. Not to
  # mpirun alone: Open MPI 4.1's mpirun, signalled itself, forwards SIGTERM to the ranks and may close their output
  # before rank 0's line naming the stop reaches it (seen under load: exit 1, every directory complete, no line).
  kill -TERM "$(rank_pid $job 0)" "$(rank_pid $job 1)"
  finish_job
  incomplete=$(for d in "$work"/term/step_*; do [ -f "$d/manifest.json" ] || echo "$d"; done)
  # The ranks exit 143 (128 + SIGTERM); mpirun reports that as its own non-zero code.
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -z "$incomplete" ] && grep -q "stopped by signal" "$work/term.log"
  check "SIGTERM: clean stop (exit $rc) in ${elapsed}s, every step directory complete" $? "$(tail -5 "$work/term.log"); incomplete: $incomplete"
fi

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
