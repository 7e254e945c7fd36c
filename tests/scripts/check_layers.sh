#!/usr/bin/env bash
# scripts/check_layers, checked: it passes on this tree, and on a copy of a few of its files it fails naming
# file:line, the include and the rule for each kind of violation injected there (an upward include, Abseil
# or runtime/ in a leaf kernel, a library including a top folder or a top folder's leaf kernels, an upward CMake link, a README whose layer
# line disagrees with docs/layers.txt, runtime/CMakeLists.txt out of order, a callback a lower layer's header
# declares, a class implementing a lower layer's interface); a malformed table exits 2.
#   check_layers.sh SOURCE_DIR
set -uo pipefail
src=$1
# shellcheck source=script_checks.sh
source "$(dirname "$0")/script_checks.sh"

out=$("$src/scripts/check_layers" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "^check_layers: ok" <<<"$out" && grep -q "^check_layers: known exceptions:" <<<"$out"
check "the tree keeps the order of docs/layers.txt" $? "$rc $out"

fresh() {  # a clean copy of a few files of the tree in $work/t
  copy_tree docs/layers.txt README.md runtime/CMakeLists.txt runtime/device/CMakeLists.txt runtime/offload/CMakeLists.txt \
            runtime/base/crc32.h runtime/base/crc32.cc runtime/shard/layout.h runtime/offload/io_work.cc kernels/cpu/isa.h \
            kernels/cpu/isa.cc
}
run() { out=$("$src/scripts/check_layers" --root "$work/t" 2>&1); rc=$?; }

fresh; run
[ $rc -eq 0 ] && grep -q "^check_layers: ok" <<<"$out"
check "a clean copy of a few files passes" $? "$rc $out"

fresh; inject runtime/base/crc32.cc '#include "runtime/shard/layout.h"'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/base/crc32.cc:2: #include "runtime/shard/layout.h": upward include: runtime/base (layer 0 of 10) is below runtime/shard (layer 5 of 10)$' <<<"$out" &&
  grep -q "^check_layers: 1 violation(s)" <<<"$out"
check "an upward include fails naming file:line, the include and the rule" $? "$rc $out"

fresh; inject runtime/shard/layout.h '#include "../offload/io_work.h"'; inject runtime/base/crc32.h '#include <runtime/device/device.h>'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/base/crc32.h:2: #include <runtime/device/device.h>: upward include' <<<"$out" &&
  ! grep -q "runtime/shard/layout.h" <<<"$out"
check "an angle-bracket tree include is checked; offload below runtime/shard is allowed" $? "$rc $out"

fresh; inject kernels/cpu/isa.h '#include "absl/status/status.h"'; inject kernels/cpu/isa.cc '#include "runtime/base/crc32.h"'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION kernels/cpu/isa.h:2: #include "absl/status/status.h": kernels/cpu is a leaf library: no Abseil$' <<<"$out" &&
  grep -q '^LAYER VIOLATION kernels/cpu/isa.cc:2: #include "runtime/base/crc32.h": kernels/cpu is a leaf library: no runtime/' <<<"$out"
check "a leaf kernel including Abseil or runtime/ fails" $? "$rc $out"

fresh; inject runtime/offload/io_work.cc '#include "tools/flags.h"'; inject runtime/base/crc32.cc '#include "tests/offload/offload_test_util.h"'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/offload/io_work.cc:2: #include "tools/flags.h": runtime/offload (layer 4 of 10) may not include tools/, which sits on top$' <<<"$out" &&
  grep -q '^LAYER VIOLATION runtime/base/crc32.cc:2: #include "tests/offload/offload_test_util.h": .* may not include tests/' <<<"$out"
check "a library including tools/ or tests/ fails" $? "$rc $out"

fresh; inject runtime/base/crc32.cc '#include "models/gpt/nn/cpu/nn.h"'; inject kernels/cpu/isa.cc '#include "models/gpt/nn/common/nn_math.h"'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/base/crc32.cc:2: #include "models/gpt/nn/cpu/nn.h": runtime/base (layer 0 of 10) may not include models/gpt/nn/cpu/, a leaf of models/, which sits on top$' <<<"$out" &&
  grep -q '^LAYER VIOLATION kernels/cpu/isa.cc:2: #include "models/gpt/nn/common/nn_math.h": kernels/cpu is a leaf library: it may include itself and kernels/common, not models/gpt/nn/common (leaf)$' <<<"$out"
check "the runtime and its kernels include no leaf of the model (models/gpt/nn)" $? "$rc $out"

fresh; sed -i 's/DEPS strata_base)/DEPS strata_base strata_engine)/' "$work/t/runtime/device/CMakeLists.txt"; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/device/CMakeLists.txt:[0-9]*: names strata_engine: upward link' <<<"$out"
check "an upward CMake link fails" $? "$rc $out"

fresh; sed -i 's/comm -> offload -> shard/comm -> shard/' "$work/t/README.md"; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION README.md:[0-9]*: its layer line states `runtime/base -> device -> memory -> comm -> shard' <<<"$out"
check "a README layer line that disagrees with docs/layers.txt fails" $? "$rc $out"

fresh; sed -i 's/^add_subdirectory(shard)$/add_subdirectory(SHARD_TMP)/; s/^add_subdirectory(optim)$/add_subdirectory(shard)/; s/^add_subdirectory(SHARD_TMP)$/add_subdirectory(optim)/' "$work/t/runtime/CMakeLists.txt"; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/CMakeLists.txt:[0-9]*: adds runtime/optim where the order of docs/layers.txt puts runtime/shard$' <<<"$out"
check "runtime/CMakeLists.txt adding folders out of order fails" $? "$rc $out"

# Calls only descend (docs/design.md "Calls only descend"): a std::function in a lower layer's header is a
# callback the layers above could fill; a class deriving from a lower layer's is called up through.
fresh; inject runtime/shard/layout.h 'struct Up { std::function<void()> call; };'; inject runtime/offload/io_work.cc 'class Ev final : public device::Event {};'; run
[ $rc -eq 1 ] && grep -q '^LAYER VIOLATION runtime/shard/layout.h:2: declares a std::function (1 in the file, 0 known): a callback the layers above could fill is an upward call' <<<"$out" &&
  grep -q '^LAYER VIOLATION runtime/offload/io_work.cc:2: implements device::Event: an upward call: runtime/offload is above runtime/device' <<<"$out" &&
  grep -q "^check_layers: 2 violation(s)" <<<"$out"
check "a callback in a lower layer's header or a class implementing a lower layer's interface fails" $? "$rc $out"

fresh; printf '[order]\nruntime/base\n[leaves]\nkernels/cpu kernels/common\n' > "$work/t/docs/layers.txt"; run
[ $rc -eq 2 ] && grep -q "docs/layers.txt:4: a leaf is 'folder: what it may include'" <<<"$out"
check "a malformed layers table exits 2 naming its line" $? "$rc $out"

echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
