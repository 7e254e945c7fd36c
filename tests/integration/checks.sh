# Sourced by integration scripts: a scratch directory removed on exit, one thread per rank, and
# check NAME STATUS DETAIL, which prints ok / FAIL (with the detail's tail) and counts in runs / fails.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fails=0 runs=0
check() {
  runs=$((runs + 1))
  if [ "$2" -eq 0 ]; then echo "ok    $1"; else echo "FAIL  $1"; echo "$3" | tail -8; fails=$((fails + 1)); fi
}
