#!/usr/bin/env bash
# Every command and subcommand of the strata CLI answers --help (and -h) with its usage on stdout and exit
# status 0, at once: nothing runs (no MPI start, no benchmark). The commands are read from `strata --help`
# and `strata bench --help`, so a command added to the table is walked too.
#   help_cli.sh STRATA
set -uo pipefail
strata=$1
fails=0 runs=0
errfile=$(mktemp)
trap 'rm -f "$errfile"' EXIT
check() {  # check NAME ARGS...
  local name=$1; shift
  runs=$((runs + 1))
  local out err rc
  out=$(timeout 10 "$strata" "$@" 2>"$errfile"); rc=$?
  err=$(cat "$errfile")
  if [ $rc -ne 0 ] || ! grep -q "^usage: strata $name" <<<"$out" || [ -n "$err" ]; then
    echo "FAIL: strata $* (exit $rc): stdout: $(head -2 <<<"$out") stderr: $err"
    fails=$((fails + 1))
  fi
}
commands=$("$strata" --help | awk '/^  [a-z]/ {print $1}')
bench=$("$strata" bench --help | awk '/^  [a-z]/ {print $1}')
[ "$(wc -w <<<"$commands")" -ge 7 ] && [ "$(wc -w <<<"$bench")" -ge 6 ] || { echo "FAIL: listings too short"; exit 1; }
check "<command>" --help
check "bench <benchmark>" bench --help
for c in $commands; do
  [ "$c" = bench ] && continue
  check "$c" "$c" --help
  check "$c" "$c" -h
done
for b in $bench; do
  check "bench $b" bench "$b" --help
  # help wins wherever it stands: a benchmark must not start because other flags came first
  check "bench $b" bench "$b" --steps 1000000 --help
done
check "ckpt" ckpt inspect --help
check "ckpt" ckpt export DIR --help
# An unknown command or benchmark is a usage error (2) naming it, with the listing on stderr.
out=$("$strata" frobnicate 2>&1); rc=$?
runs=$((runs + 1)); { [ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" <<<"$out"; } || { echo "FAIL: unknown command: $rc $out"; fails=$((fails + 1)); }
out=$("$strata" bench frob 2>&1); rc=$?
runs=$((runs + 1)); { [ $rc -eq 2 ] && grep -q "unknown benchmark 'frob'" <<<"$out"; } || { echo "FAIL: unknown benchmark: $rc $out"; fails=$((fails + 1)); }
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
