#!/usr/bin/env bash
# libstrata.so exports exactly the functions strata.h declares: every defined dynamic symbol is strata_*,
# and the exported and declared sets are equal (a declared function missing from the library, or a
# strata_* symbol the header does not declare, fails too).
# usage: exported_symbols_test.sh LIBSTRATA_SO STRATA_H
set -euo pipefail
lib=$1 header=$2
exported=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u)
# Declarations start a line (comments start with "/*" or " *"): "<type> [*]strata_name(".
declared=$(sed -nE 's/^[a-z_0-9 ]+[ *]+(strata_[a-z0-9_]+)\(.*/\1/p' "$header" | sort -u)
fail=0
if foreign=$(grep -v '^strata_' <<<"$exported"); then
  echo "FAIL: libstrata.so exports symbols outside the C ABI:"; echo "$foreign" | head -20; fail=1
fi
if extra=$(comm -23 <(echo "$exported") <(echo "$declared")) && [ -n "$extra" ]; then
  echo "FAIL: exported but not declared in strata.h:"; echo "$extra"; fail=1
fi
if missing=$(comm -13 <(echo "$exported") <(echo "$declared")) && [ -n "$missing" ]; then
  echo "FAIL: declared in strata.h but not exported:"; echo "$missing"; fail=1
fi
echo "$(wc -l <<<"$exported") exported, $(wc -l <<<"$declared") declared"
[ "$fail" -eq 0 ] && echo "ok: libstrata.so exports exactly the strata_* functions of strata.h"
exit "$fail"
