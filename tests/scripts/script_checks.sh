# Sourced by the tests of scripts/check_*: a scratch directory removed on exit, and check NAME STATUS DETAIL,
# which counts in runs / fails and prints FAIL with the detail when STATUS is not 0.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 runs=0
check() { runs=$((runs + 1)); [ "$2" -eq 0 ] || { echo "FAIL: $1: $3"; fails=$((fails + 1)); }; }
