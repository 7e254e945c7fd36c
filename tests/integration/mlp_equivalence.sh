#!/usr/bin/env bash
# Equivalence under real MPI processes: for each variant (plain, 2 and 4 micro-batches of accumulation,
# active clipping), the MLP trained 30 steps at world size N with stages 0-3 must end with parameters
# equal to the single-rank stage-0 run within 1e-5 relative (see mlp_train --compare for the measure).
# usage: mlp_equivalence.sh MPIRUN MLP_TRAIN N
set -euo pipefail
mpirun=$1 mlp=$2 n=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
variants=("" "--grad-accum 2" "--grad-accum 4" "--clip 0.05")
fails=0 runs=0
for i in "${!variants[@]}"; do
  v=${variants[$i]}
  # shellcheck disable=SC2086
  "$mpirun" -n 1 "$mlp" --stage 0 --steps 30 --seed 7 $v --dump "$work/ref$i.bin" > "$work/ref$i.log"
  for stage in 0 1 2 3; do
    runs=$((runs + 1))
    # shellcheck disable=SC2086
    if out=$("$mpirun" -n "$n" "$mlp" --stage "$stage" --steps 30 --seed 7 $v --compare "$work/ref$i.bin" 2>&1); then
      echo "ok    n=$n stage=$stage ${v:-plain}: $(grep compare: <<<"$out")"
    else
      echo "FAIL  n=$n stage=$stage ${v:-plain}:"; echo "$out" | tail -5
      fails=$((fails + 1))
    fi
  done
done
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
