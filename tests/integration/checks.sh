# Sourced by integration scripts: a scratch directory removed on exit, one thread per rank, and
# check NAME STATUS DETAIL, which prints ok / FAIL (with the detail's tail) and counts in runs / fails, and
# same_losses (metrics files of two runs compared bit for bit).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fails=0 runs=0
check() {
  runs=$((runs + 1))
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$3" | tail -8; fails=$((fails + 1)); fi
}
same_losses() {  # same_losses A.jsonl B.jsonl FIRST_STEP: B's steps equal A's from FIRST_STEP on, bit for bit
  python3 - "$@" <<'PY'
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
bad = [r["step"] for r in b if (r["loss"], r["grad_norm"]) != (a[r["step"]]["loss"], a[r["step"]]["grad_norm"])]
ok = b and b[0]["step"] == int(sys.argv[3]) + 1 and not bad
print("identical" if ok else f"differ at steps {bad} (first resumed step {b[0]['step'] if b else None})")
sys.exit(0 if ok else 1)
PY
}
