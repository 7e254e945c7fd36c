#!/usr/bin/env bash
# The `strata` executable's second model family, the MLP (models/mlp; --model-family mlp), through every
# command that takes a model, as a user runs them. Each check fails if the command ran the GPT (the default):
#   plan:           the JSON's model is the MLP's: its parameter count and its dimensions; the MLP's flags
#                   without --model-family mlp are unknown flags;
#   bench step:     2 ranks: the reported model and parameter count are the MLP's, a sample per "token"; its
#                   warm-up step checked the MLP's schedule against the hooks its trainer called (exit 0);
#   bench capacity: --vary width under a 1 MiB device budget: the largest model is an MLP with the MLP's
#                   parameter count for its hidden width, which `strata plan` (the same accounting) says fits
#                   that budget, and one unit wider does not; --vary layers is refused naming --vary width;
#   doctor:         the pinned-memory estimate counts the MLP's parameters;
#   --help:         plan, bench step, bench capacity and doctor list the MLP's flags.
# usage: model_family_cli.sh MPIRUN STRATA
set -uo pipefail
mpirun=$1 strata=$2
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 runs=0
check() {  # check NAME STATUS OUTPUT
  runs=$((runs + 1))
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$3" | tail -20; fails=$((fails + 1)); fi
}
params() { echo $(($1 * $2 + $2 + $2 * $2 + $2 + $2 * $3 + $3)); }  # params IN HIDDEN OUT: the MLP's count

# ---- strata plan
out=$("$strata" plan --model-family mlp --in 12 --hidden 40 --out 3 --ranks 2 --micro-batch 4 --json 2>&1); rc=$?
python3 - "$out" "$(params 12 40 3)" <<'PY'
import json, sys
p = json.loads(sys.argv[1])
assert p["model"] == {"params": int(sys.argv[2]), "hidden": 40, "in": 12, "out": 3}, p["model"]
assert p["config"]["micro_batch"] == 4 and p["cluster"]["ranks"] == 2, p["config"]
PY
py=$?
check "plan --model-family mlp: the MLP's $(params 12 40 3) parameters and dimensions (exit $rc)" $((rc | py)) "$out"
out=$("$strata" plan --hidden 40 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "unknown flag --hidden" <<<"$out"
check "plan --hidden without --model-family mlp: an unknown flag of the GPT (exit $rc)" $? "$out"

# ---- strata bench step
out=$("$mpirun" -n 2 "$strata" bench step --model-family mlp --hidden 32 --micro-batch 4 --steps 2 --json 2>&1); rc=$?
python3 - "$(grep '^{' <<<"$out" | tail -1)" "$(params 16 32 4)" <<'PY'
import json, sys
j = json.loads(sys.argv[1])
assert j["model"] == "in 16, hidden 32, out 4" and j["params"] == int(sys.argv[2]), j
assert j["seq_len"] == 1 and j["ranks"] == 2 and j["micro_batch"] == 4, j
assert j["tokens_per_s"] > 0 and j["sgemm_gflops_per_rank"] > 0, j
PY
py=$?
check "bench step --model-family mlp at 2 ranks: the MLP's model and $(params 16 32 4) parameters (exit $rc)" \
  $((rc | py)) "$out"

# ---- strata bench capacity
out=$("$mpirun" -n 1 "$strata" bench capacity --model-family mlp --vary width --device-budget 1MiB 2>&1); rc=$?
largest=$(sed -n 's/^largest model within the budgets: in 16, hidden \([0-9]*\), out 4, \([0-9]*\) parameters.*/\1 \2/p' \
  <<<"$out")
read -r hidden count <<<"${largest:-0 0}"
[ $rc -eq 0 ] && [ "$hidden" -gt 48 ] && [ "$count" -eq "$(params 16 "$hidden" 4)" ]
check "bench capacity --model-family mlp: the largest is an MLP (hidden $hidden, $count parameters; exit $rc)" $? "$out"
fits() {  # fits HIDDEN: strata plan's verdict on that MLP under the same budget
  "$strata" plan --model-family mlp --hidden "$1" --device-budget 1MiB --json |
    python3 -c 'import json, sys; m = json.load(sys.stdin)["memory"]; print(m["fits"], m["why_not"])'
}
at=$(fits "$hidden") above=$(fits $((hidden + 1)))
grep -q "^True" <<<"$at" && grep -q "^False .*strata.device_budget" <<<"$above"
check "strata plan agrees: hidden $hidden fits 1 MiB, hidden $((hidden + 1)) does not" $? "$at / $above"
out=$("$mpirun" -n 1 "$strata" bench capacity --model-family mlp --device-budget 1MiB 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "does not grow in layers (its layers is fixed at 1): pass --vary width" <<<"$out"
check "bench capacity --model-family mlp --vary layers: refused naming --vary width (exit $rc)" $? "$out"

# ---- strata doctor
"$strata" doctor --json --model-family mlp --hidden 100 --offload-optimizer cpu --ranks 1 > "$work/doctor.json"
python3 - "$work/doctor.json" "$(params 16 100 4)" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["facts"]["pinned"]
assert p["offloaded"] and p["breakdown"].endswith(f"; {sys.argv[2]} params over 1 ranks"), p
PY
py=$?
check "doctor --model-family mlp: the pinned estimate counts the MLP's $(params 16 100 4) parameters" $py \
  "$(cat "$work/doctor.json")"

# ---- --help
for cmd in plan "bench step" "bench capacity" doctor; do
  # shellcheck disable=SC2086  # the subcommand is two words
  out=$("$strata" $cmd --help 2>&1)
  grep -q "model-family V .*gpt, mlp (default gpt)" <<<"$out" && grep -q "with --model-family mlp, its flags instead: --in --hidden --out" <<<"$out"
  check "$cmd --help lists the families and the MLP's flags" $? "$out"
done

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
