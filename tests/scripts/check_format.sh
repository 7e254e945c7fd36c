#!/usr/bin/env bash
# scripts/check_format, checked on a scratch git repository holding the tree's .clang-format: lines older than
# the base are left alone (an unformatted file committed at the base passes); a changed line that clang-format
# would change fails naming the file, and passes once formatted; a commit subject of 72 characters or more fails
# naming the commit; a base the clone lacks exits 2.
#   check_format.sh SOURCE_DIR
set -uo pipefail
src=$1
# shellcheck source=script_checks.sh
source "$(dirname "$0")/script_checks.sh"

r=$work/repo
mkdir -p "$r/scripts" "$r/.ci" "$r/lib"
cp "$src/.clang-format" "$r/"
cp "$src/scripts/check_format" "$r/scripts/"
git() { command git -C "$r" -c user.name=t -c user.email=t@t -c commit.gpgsign=false "$@"; }
git init -q
printf 'int  old( int a ){return a;}\n' > "$r/lib/a.cc"  # unformatted, and older than the check
git add -A && git commit -qm "base"
git rev-parse HEAD > "$r/.ci/format-base"
git add -A && git commit -qm "the check begins"
run() { out=$("$r/scripts/check_format" "$@" 2>&1); rc=$?; }

run
[ $rc -eq 0 ] && grep -q "^check_format: ok" <<<"$out"
check "lines older than the base are left alone" $? "$rc $out"

printf 'int  old( int a ){return a;}\nint  added( int b ){return b;}\n' > "$r/lib/a.cc"
git commit -qam "add a function"
run
[ $rc -eq 1 ] && grep -q "^FORMAT lib/a.cc: changed lines are not as .clang-format formats them$" <<<"$out" &&
  grep -q "^+int added(int b) { return b; }" <<<"$out" && ! grep -q "^+int old" <<<"$out"
check "a changed line clang-format would change fails naming the file, only that line" $? "$rc $out"

printf 'int  old( int a ){return a;}\nint added(int b) { return b; }\n' > "$r/lib/a.cc"
git commit -qam "format it"
run
[ $rc -eq 0 ]
check "the formatted change passes" $? "$rc $out"

printf '// x\n' >> "$r/lib/a.cc"
git commit -qam "$(printf 'a%.0s' {1..72})"
run
[ $rc -eq 1 ] && grep -qE "^SUBJECT [0-9a-f]{12}: 72 characters \(under 72; the detail goes in the body\)" <<<"$out"
check "a subject of 72 characters fails naming the commit" $? "$rc $out"

run 0123456789abcdef0123456789abcdef01234567
[ $rc -eq 2 ] && grep -q "is not in this clone" <<<"$out"
check "a base the clone lacks exits 2 naming it" $? "$rc $out"

echo "check_format.sh: $runs checks, $fails failed"
[ $fails -eq 0 ]
