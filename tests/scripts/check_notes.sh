#!/usr/bin/env bash
# scripts/check_notes, checked: it passes on this tree, and on a copy of two of its files it fails naming
# file:line and the name for a citation of a note nothing defines (a renamed note, an abbreviation), while
# the forms a definition takes ("// Note [X].", "// Note [X]" alone, "Note [X]:" in a docstring) count.
#   check_notes.sh SOURCE_DIR
set -uo pipefail
src=$1
# shellcheck source=script_checks.sh
source "$(dirname "$0")/script_checks.sh"

out=$("$src/scripts/check_notes" --root "$src" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^check_notes: ok" <<<"$out"
check "every note the tree cites is defined" $? "$rc $out"

mkdir -p "$work/t"
printf '%s\n' '// Note [Defined here]. Its text.' '// Note [Alone on its line]' '// body' > "$work/t/a.h"
printf '%s\n' '"""Module.' '' 'Note [In a docstring]: text."""' > "$work/t/b.py"
printf '%s\n' '// uses (Note [Defined here]), Note [Alone on its line] and Note [In a docstring]' > "$work/t/c.cc"
out=$("$src/scripts/check_notes" --root "$work/t" 2>&1); rc=$?
[ $rc -eq 0 ]
check "each form of definition resolves its citations" $? "$rc $out"
printf '%s\n' 'x = 1  # see Note [Defined ...] and Note [Renamed away]' >> "$work/t/b.py"
out=$("$src/scripts/check_notes" --root "$work/t" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "^b.py:4: Note \[Defined ...\] is cited but defined nowhere" <<<"$out" &&
  grep -q "^b.py:4: Note \[Renamed away\]" <<<"$out"
check "an abbreviated and a renamed note are named with file:line" $? "$rc $out"

# Design sections: a citation resolves to a "## " heading of docs/design.md; a missing section and a
# citation of the outside DESIGN file are named with file:line.
mkdir -p "$work/d/docs"
printf '%s\n' '# Design' '## Memory is a contract' 'text' > "$work/d/docs/design.md"
printf '%s\n' '// Pools (docs/design.md "Memory is a contract").' > "$work/d/a.h"
out=$("$src/scripts/check_notes" --root "$work/d" 2>&1); rc=$?
[ $rc -eq 0 ]
check "a design section citation resolves to its heading" $? "$rc $out"
printf '%s\n' '// Tiers (docs/design.md "Tiers are objects").' '// Old (DESIGN "Communication").' >> "$work/d/a.h"
out=$("$src/scripts/check_notes" --root "$work/d" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q '^a.h:2: docs/design.md "Tiers are objects" is cited but' <<<"$out" &&
  grep -q "^a.h:3: cites DESIGN, a file outside the repository" <<<"$out"
check "a missing design section and an outside DESIGN citation are named" $? "$rc $out"

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
