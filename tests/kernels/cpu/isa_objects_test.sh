#!/usr/bin/env bash
# Checks the compiled ISA variant objects of strata_kernels_cpu for the two hazards the source can only
# promise to avoid (kernels/cpu/cpu_kernels.h):
#  - Note [ISA translation units]: a variant object (kernels_avx2/avx512*) must define no external or
#    weak code symbol but its table accessor, else the linker may pick a wide-ISA copy for baseline callers;
#  - Note [One operation order]: no FMA instruction outside the sum of squares (where it is exact), else
#    the optimizer results would drift from the scalar reference.
# Usage: isa_objects_test.sh OBJECT... (the library's object files; others are ignored). Prints
# "N passed, N failed".
set -uo pipefail
passed=0 failed=0
check() {  # check NAME CONDITION-OUTPUT: empty output passes
  if [ -z "$2" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL $1:"; echo "$2"; fi
}
for obj in "$@"; do
  case "$(basename "$obj")" in
    kernels_avx2.cc.o | kernels_avx512.cc.o | kernels_avx512bf16.cc.o) ;;
    *) continue ;;
  esac
  # Code symbols only (T, W, i): weak data such as DW.ref.__gxx_personality_v0 holds no instructions.
  exported=$(nm -C --defined-only --extern-only "$obj" | awk '$2 ~ /^[TWi]$/' |
             grep -v -E ' strata::kernels::cpu::(Avx2|Avx512|Avx512Bf16)Kernels\(\)$')
  check "$(basename "$obj") exports only its accessor" "$exported"
  fma=$(objdump -d -C --no-show-raw-insn "$obj" |
        awk '/^[0-9a-f]+ <.*>:$/ {fn = $0} /vfn?m(add|sub)[0-9]+[ps][sd]/ && fn !~ /SumSquares|AddSquares/ {print fn ": " $0}' | head -5)
  check "$(basename "$obj") has FMA only in SumSquares" "$fma"
done
[ $((passed + failed)) -gt 0 ] || { echo "no ISA variant object given"; exit 1; }
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
