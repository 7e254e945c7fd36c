# Sourced by the tests of scripts/check_*: a scratch directory removed on exit; check NAME STATUS DETAIL,
# which counts in runs / fails and prints FAIL with the detail when STATUS is not 0; copy_tree FILE... (a clean
# copy of those files of $src in $work/t) and inject FILE LINE (LINE becomes line 2 of $work/t/FILE).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 runs=0
check() { runs=$((runs + 1)); [ "$2" -eq 0 ] || { echo "FAIL: $1: $3"; fails=$((fails + 1)); }; }
copy_tree() { rm -rf "$work/t" && mkdir -p "$work/t" && (cd "$src" && cp --parents "$@" "$work/t"); }
inject() { sed -i "1a $2" "$work/t/$1"; }
