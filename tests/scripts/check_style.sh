#!/usr/bin/env bash
# scripts/check_style, checked: it passes on this tree, and on a copy with a line one column too long it fails
# naming file:line and the length, while a line of exactly the limit passes.
#   check_style.sh SOURCE_DIR
set -uo pipefail
src=$1
# shellcheck source=script_checks.sh
source "$(dirname "$0")/script_checks.sh"

out=$("$src/scripts/check_style" --root "$src" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^check_style: ok" <<<"$out"
check "the tree's C/C++/CUDA lines are within the limit" $? "$rc $out"
printf 'BasedOnStyle: Google\nColumnLimit: 120\n' > "$work/.clang-format"
python3 -c "print('//' + 'x' * 118)" > "$work/a.cc"
out=$("$src/scripts/check_style" --root "$work" 2>&1); rc=$?
[ $rc -eq 0 ]
check "a line of exactly 120 columns passes" $? "$rc $out"
python3 -c "print('int x;'); print('//' + 'x' * 119)" > "$work/b.h"
out=$("$src/scripts/check_style" --root "$work" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "^b.h:2: 121 columns" <<<"$out"
check "a line of 121 columns is named with file:line" $? "$rc $out"
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
