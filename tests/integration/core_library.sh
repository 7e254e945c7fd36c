#!/usr/bin/env bash
# libstrata.so carries only what it needs (issue 16, docs/decisions/0012-cuda-backend-module.md):
#   1. readelf -d: no NEEDED entry of the core library names CUDA, NCCL, cuDNN, cuBLAS or oneDNN; on a CUDA
#      build the module libstrata_cuda.so exists beside it and does need libcudart (the check has teeth);
#   2. installed (cmake --install to a temporary prefix) with libstrata_cuda.so removed, examples/embed_c
#      trains on the host through the C ABI under mpirun -n 2 and passes;
#   3. there, STRATA_DEVICE_CUDA fails cleanly (FAILED_PRECONDITION naming the file looked for and
#      dlerror()'s text), and with the module present (CUDA build, no GPU visible) it is loaded from the
#      install and answers that no CUDA device is visible; STRATA_CUDA_MODULE names another file; the CLI
#      (`strata train --device cuda`) goes through the same loader; a module of another build (a foreign
#      build string: version, compiler or the digest of the runtime headers) is refused by name.
# usage: core_library.sh MPIRUN CMAKE CC BUILD_DIR SOURCE_DIR WITH_CUDA(0|1)
# shellcheck source=other_build_module.sh
source "$(dirname "$0")/other_build_module.sh"
set -euo pipefail
mpirun=$1 cmake=$2 cc=$3 build=$4 src=$5 with_cuda=$6
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
forbidden='cudart|libcuda|nccl|cudnn|cublas|dnnl'

# 1. The core library's NEEDED entries.
core=$build/lib/libstrata.so
needed=$(readelf -d "$core" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
[ -n "$needed" ] || fail "readelf -d $core listed no NEEDED entry"
if grep -E "$forbidden" <<<"$needed"; then fail "libstrata.so needs the libraries above"; fi
echo "ok: libstrata.so needs only: $(tr '\n' ' ' <<<"$needed")"
# Nor does anything it needs, transitively (what the dynamic loader would have to find on a machine).
if ldd "$core" | grep -E "$forbidden"; then fail "libstrata.so's dependencies load the libraries above"; fi
if [ "$with_cuda" = 1 ]; then
  [ -f "$build/lib/libstrata_cuda.so" ] || fail "a CUDA build has no $build/lib/libstrata_cuda.so"
  readelf -d "$build/lib/libstrata_cuda.so" | grep -q 'NEEDED.*libcudart' || fail "libstrata_cuda.so needs no libcudart"
  exported=$(nm -D --defined-only "$build/lib/libstrata_cuda.so" | awk '{print $3}')
  [ "$exported" = strata_cuda_module_part ] || fail "libstrata_cuda.so exports more than its entry point: $exported"
fi

# The CLI (static libraries, module found from the executable: bin/../lib) asks the same loader.
if [ "$with_cuda" = 1 ] && [ -x "$build/bin/strata" ]; then
  out=$(CUDA_VISIBLE_DEVICES="" "$build/bin/strata" train --device cuda --steps 1 2>&1) && fail "strata train --device cuda ran without a GPU"
  grep -q -- "--device cuda: no CUDA device is visible" <<<"$out" || fail "the CLI did not reach the module: $out"
  out=$(STRATA_CUDA_MODULE=$work/none.so "$build/bin/strata" train --device cuda --steps 1 2>&1) && fail "ran without the module"
  grep -q -- "--device cuda: the CUDA back-end module libstrata_cuda.so could not be loaded (tried $work/none.so (" <<<"$out" ||
    fail "the CLI's error does not name the module it tried: $out"
  echo "ok: strata train --device cuda reaches the module, and names it when it is absent"
fi

# 2. Install, take the CUDA module away, train on the host through the C ABI.
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
pc=$(find "$prefix" -name strata.pc)
[ -n "$pc" ] || fail "no strata.pc installed under $prefix"
export PKG_CONFIG_PATH=${pc%/*}
libdir=$(pkg-config --variable=libdir strata)
if [ "$with_cuda" = 1 ]; then
  [ -f "$libdir/libstrata_cuda.so" ] || fail "the install has no $libdir/libstrata_cuda.so"
fi
# shellcheck disable=SC2046
"$cc" -std=c99 -O2 "$src/examples/embed_c/embed_c.c" $(pkg-config --cflags --libs strata) -lm \
  -Wl,-rpath,"$libdir" -o "$work/embed_c"
cat > "$work/ask_cuda.c" <<'C'
/* Asks for a CUDA engine on a one-rank in-process communicator; prints the status name and message. */
#include <stdio.h>
#include <strata/strata.h>
int main(void) {
  strata_comm* comm = NULL;
  if (strata_comm_create_in_process(1, &comm) != STRATA_OK) return 3;
  strata_engine_options o = STRATA_ENGINE_OPTIONS_INIT;
  o.device = STRATA_DEVICE_CUDA;
  strata_engine* e = NULL;
  const strata_status s = strata_engine_create(comm, &o, &e);
  printf("%s: %s\n", strata_status_name(s), strata_last_error());
  strata_comm_destroy(comm);
  return s == STRATA_OK ? 4 : 0;
}
C
# shellcheck disable=SC2046
"$cc" -std=c99 "$work/ask_cuda.c" $(pkg-config --cflags --libs strata) -Wl,-rpath,"$libdir" -o "$work/ask_cuda"

if [ "$with_cuda" = 1 ]; then  # the module is found beside the installed libstrata.so (no GPU is visible here)
  out=$(CUDA_VISIBLE_DEVICES="" "$work/ask_cuda")
  echo "with the module: $out"
  grep -q "STRATA_ERR_FAILED_PRECONDITION: strata_engine_create: STRATA_DEVICE_CUDA: no CUDA device is visible" <<<"$out" ||
    fail "with libstrata_cuda.so installed, a CUDA engine did not reach the module: $out"
  out=$(STRATA_CUDA_MODULE=$work/elsewhere.so "$work/ask_cuda")
  grep -q "could not be loaded (tried $work/elsewhere.so (" <<<"$out" || fail "STRATA_CUDA_MODULE was not used: $out"
  if [ -x "$prefix/bin/strata" ]; then  # the installed CLI finds it in ../lib
    out=$(CUDA_VISIBLE_DEVICES="" "$prefix/bin/strata" train --device cuda --steps 1 2>&1) && fail "ran without a GPU"
    grep -q -- "--device cuda: no CUDA device is visible" <<<"$out" || fail "the installed CLI missed the module: $out"
  fi
fi

# A module of another build (here a stand-in with a foreign build string) is refused by name, not run.
other_build_module "$cc" cuda "$work/other_build.so"
out=$(STRATA_CUDA_MODULE=$work/other_build.so "$work/ask_cuda") || fail "ask_cuda crashed on a module of another build: $out"
grep -q "the CUDA back-end module $work/other_build.so is of another build (0.0.0 Other 1 headers 0123456789abcdef; this library is .* headers [0-9a-f]\{16\})" <<<"$out" ||
  fail "a module of another build was not refused by name: $out"
echo "ok: a module of another build is refused: $out"

rm -f "$libdir"/libstrata_cuda.so*
"$mpirun" -n 2 "$work/embed_c" > "$work/embed.out" 2>&1 || { cat "$work/embed.out"; fail "embed_c failed without the CUDA module"; }
grep '^params:' "$work/embed.out" > /dev/null || { cat "$work/embed.out"; fail "embed_c printed no parameters"; }
echo "ok: embed_c trained on the host (mpirun -n 2) with libstrata_cuda.so removed from the install"

# 3. A CUDA device asked for without the module: a clear error, not a crash.
out=$("$work/ask_cuda") || fail "ask_cuda crashed or succeeded without the module (rc $?): $out"
echo "without the module: $out"
if [ "$with_cuda" = 1 ]; then
  grep -q "STRATA_ERR_FAILED_PRECONDITION: strata_engine_create: STRATA_DEVICE_CUDA: the CUDA back-end module libstrata_cuda.so could not be loaded (tried $libdir/libstrata_cuda.so (" <<<"$out" ||
    fail "the error does not name the file looked for: $out"
  grep -q "No such file or directory" <<<"$out" || fail "the error does not carry dlerror()'s text: $out"
else
  grep -q "STRATA_ERR_UNIMPLEMENTED: strata_engine_create: STRATA_DEVICE_CUDA: this libstrata was built without CUDA" <<<"$out" ||
    fail "unexpected answer of a build without CUDA: $out"
fi
echo "ok: the core library runs host-only without the CUDA module and names it when a CUDA device is asked for"
