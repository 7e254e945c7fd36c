#!/usr/bin/env bash
# strata.optimizer_in_backward under real MPI processes (docs/decisions/0018-step-in-backward.md): at
# stages 2 and 3, fp32 and bf16 params, the MLP trained 20 steps at world size N with the update in
# backward ends with exactly the parameters of the same run without it (--rtol 0: bit for bit).
# usage: mlp_optimizer_in_backward.sh MPIRUN MLP_TRAIN N
set -euo pipefail
mpirun=$1 mlp=$2 n=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 runs=0
for stage in 2 3; do
  for dtype in fp32 bf16; do
    runs=$((runs + 1))
    args=(--stage "$stage" --param-dtype "$dtype" --steps 20 --seed 7)
    "$mpirun" -n "$n" "$mlp" "${args[@]}" --dump "$work/ref.bin" > "$work/ref.log"
    if out=$("$mpirun" -n "$n" "$mlp" "${args[@]}" --set strata.optimizer_in_backward=true \
               --compare "$work/ref.bin" --rtol 0 2>&1); then
      echo "ok    n=$n stage=$stage $dtype: $(grep compare: <<<"$out")"
    else
      echo "FAIL  n=$n stage=$stage $dtype:"; echo "$out" | tail -5
      fails=$((fails + 1))
    fi
  done
done
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
