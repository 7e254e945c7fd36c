#!/usr/bin/env bash
# scripts/check_layers' rule for the top floor, checked (docs/decisions/0035-model-interface.md): models/ and
# tools/ sit on spec/ and never on each other. On a copy of a few files of the tree: an include either way
# between models/ and tools/ (a model's header, or a leaf kernel of models/) fails naming file:line, the
# include and the rule, and so does spec/ including either, or a CMakeLists.txt under one naming a library of
# the other; both including spec/, and examples/ (a bare [top] name) including both, pass. A [top] entry
# allowing an unknown folder exits 2.
#   check_layers_top.sh SOURCE_DIR
set -uo pipefail
src=$1
# shellcheck source=script_checks.sh
source "$(dirname "$0")/script_checks.sh"

copied=(docs/layers.txt README.md runtime/CMakeLists.txt spec/CMakeLists.txt spec/flags.h spec/model_spec.h
        models/gpt/train/CMakeLists.txt models/gpt/train/trainer.h models/gpt/nn/cpu/nn.h tools/CMakeLists.txt
        tools/plan/plan.h tools/cli/commands.h examples/mlp/mlp_train.cc)
fresh() { copy_tree "${copied[@]}"; }  # a clean copy of those files in $work/t (inject: script_checks.sh)
run() { out=$("$src/scripts/check_layers" --root "$work/t" 2>&1); rc=$?; }

fresh; run
[ $rc -eq 0 ] && grep -q "^check_layers: ok" <<<"$out"
check "a clean copy passes: models/ and tools/ include spec/ only" $? "$rc $out"

fresh; inject models/gpt/train/trainer.h '#include "tools/plan/plan.h"'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION models/gpt/train/trainer.h:2: #include "tools/plan/plan.h": models/ may not include tools/: models sits on spec/ only (docs/layers.txt \[top\])$' <<<"$out" &&
  grep -q "^check_layers: 1 violation(s)" <<<"$out"
check "models/ including tools/ fails naming file:line, the include and the rule" $? "$rc $out"

fresh; inject tools/plan/plan.h '#include "models/gpt/train/trainer.h"'; inject tools/cli/commands.h '#include <models/gpt/nn/cpu/nn.h>'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION tools/plan/plan.h:2: #include "models/gpt/train/trainer.h": tools/ may not include models/: tools sits on spec/ only' <<<"$out" &&
  grep -q '^LAYER VIOLATION tools/cli/commands.h:2: #include <models/gpt/nn/cpu/nn.h>: tools/ may not include models/' <<<"$out" &&
  grep -q "^check_layers: 2 violation(s)" <<<"$out"
check "tools/ including models/ (a header, or a leaf kernel of models/) fails" $? "$rc $out"

fresh; inject spec/model_spec.h '#include "tools/cli/commands.h"'; inject spec/flags.h '#include "models/gpt/train/trainer.h"'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION spec/model_spec.h:2: #include "tools/cli/commands.h": spec/ may not include tools/: spec sits on no other top folder' <<<"$out" &&
  grep -q '^LAYER VIOLATION spec/flags.h:2: #include "models/gpt/train/trainer.h": spec/ may not include models/' <<<"$out"
check "spec/ including either side fails" $? "$rc $out"

fresh; inject examples/mlp/mlp_train.cc '#include "tools/plan/plan.h"'; inject examples/mlp/mlp_train.cc '#include "models/gpt/train/trainer.h"'; run
[ $rc -eq 0 ]
check "examples/ (a bare [top] name) may include both" $? "$rc $out"

fresh; sed -i 's/PUBLIC strata_engine strata_spec/PUBLIC strata_engine strata_spec strata_gpt_train/' "$work/t/tools/CMakeLists.txt"
sed -i 's/PRIVATE strata_gpt_train strata_gpt strata_spec_launch/PRIVATE strata_gpt_train strata_plan_lib strata_spec_launch/' "$work/t/models/gpt/train/CMakeLists.txt"; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION tools/CMakeLists.txt:[0-9]*: names strata_gpt_train, a library of models/: tools sits on spec/ only' <<<"$out" &&
  grep -q '^LAYER VIOLATION models/gpt/train/CMakeLists.txt:[0-9]*: names strata_plan_lib, a library of tools/: models sits on spec/ only' <<<"$out"
check "a CMake link either way between models/ and tools/ fails" $? "$rc $out"

fresh; sed -i 's/^models: spec$/models: spec nowhere/' "$work/t/docs/layers.txt"; run
[ $rc -eq 2 ] && grep -q "top folder models may include 'nowhere', which is not another top folder" <<<"$out"
check "a [top] entry allowing an unknown folder exits 2" $? "$rc $out"

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
