#!/usr/bin/env bash
# libstrata.so links no libmpi; the MPI back-end is the module libstrata_mpi.so (docs/decisions/0041):
#   1. readelf -d: no NEEDED entry of libstrata.so, nor of the CUDA module beside it, names libmpi, nor does
#      ldd's closure of libstrata.so; libstrata_mpi.so does need libmpi and exports its entry point alone;
#   2. a C host's strata_comm_create_mpi_world loads the module beside libstrata.so under mpirun -n 2 and gets
#      the MPI world; STRATA_MPI_MODULE naming a missing file, and a module of another build, give
#      FAILED_PRECONDITION naming the file and the fix, and make no communicator;
#   3. on a machine without MPI (tests/python/without_mpi.sh: a namespace without Open MPI's libraries),
#      libstrata.so loads, an in-process communicator works, and the MPI world fails naming the missing libmpi
#      and the ways out (Open MPI, or torchrun).
# usage: mpi_module.sh MPIRUN CC BUILD_DIR SOURCE_DIR
# shellcheck source=other_build_module.sh
source "$(dirname "$0")/other_build_module.sh"
set -euo pipefail
mpirun=$1 cc=$2 build=$3 src=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
lib=$build/lib

# 1. NEEDED.
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
core_needed=$(needed "$lib/libstrata.so")
[ -n "$core_needed" ] || fail "readelf -d listed no NEEDED entry of libstrata.so"
if grep libmpi <<<"$core_needed"; then fail "libstrata.so needs libmpi"; fi
echo "ok: libstrata.so needs only: $(tr '\n' ' ' <<<"$core_needed")"
if ldd "$lib/libstrata.so" | grep libmpi; then fail "libstrata.so's dependencies load libmpi"; fi
if [ -f "$lib/libstrata_cuda.so" ]; then
  if needed "$lib/libstrata_cuda.so" | grep libmpi; then fail "libstrata_cuda.so needs libmpi"; fi
  echo "ok: libstrata_cuda.so needs no libmpi"
fi
[ -f "$lib/libstrata_mpi.so" ] || fail "no $lib/libstrata_mpi.so"
needed "$lib/libstrata_mpi.so" | grep -q '^libmpi\.so' || fail "libstrata_mpi.so needs no libmpi: $(needed "$lib/libstrata_mpi.so")"
exported=$(nm -D --defined-only "$lib/libstrata_mpi.so" | awk '{print $3}')
[ "$exported" = strata_mpi_module_part ] || fail "libstrata_mpi.so exports more than its entry point: $exported"
echo "ok: libstrata_mpi.so needs $(needed "$lib/libstrata_mpi.so" | grep libmpi) and exports $exported alone"

# 2. A C host: the world, then the two faults.
cat > "$work/ask_mpi.c" <<'C'
/* argv[1] "mpi": strata_comm_create_mpi_world; "in_process": a 1-rank in-process communicator. Prints the status
 * name, the message and the rank and size when made. */
#include <stdio.h>
#include <string.h>
#include <strata/strata.h>
int main(int argc, char** argv) {
  strata_comm* comm = NULL;
  strata_status s = argc > 1 && strcmp(argv[1], "mpi") == 0 ? strata_comm_create_mpi_world(&comm)
                                                             : strata_comm_create_in_process(1, &comm);
  int32_t rank = -1, size = -1;
  if (s == STRATA_OK) {
    strata_comm_rank(comm, &rank);
    strata_comm_size(comm, &size);
  }
  printf("%s: %s: rank %d of %d%s\n", strata_status_name(s), s == STRATA_OK ? "" : strata_last_error(), (int)rank,
         (int)size, s != STRATA_OK && comm != NULL ? " (and a communicator was made)" : "");
  strata_comm_destroy(comm);
  return 0;
}
C
"$cc" -std=c99 "$work/ask_mpi.c" -I"$build/include" -L"$lib" -lstrata -Wl,-rpath,"$lib" -o "$work/ask_mpi"
out=$("$mpirun" -n 2 "$work/ask_mpi" mpi 2>&1) || fail "ask_mpi under mpirun -n 2 failed: $out"
grep -q "STRATA_OK: : rank 0 of 2" <<<"$out" && grep -q "STRATA_OK: : rank 1 of 2" <<<"$out" ||
  fail "the MPI world through the module: $out"
echo "ok: strata_comm_create_mpi_world loads libstrata_mpi.so under mpirun -n 2"

out=$(STRATA_MPI_MODULE=$work/none.so "$work/ask_mpi" mpi 2>&1)
grep -q "STRATA_ERR_FAILED_PRECONDITION: strata_comm_create_mpi_world: the MPI back-end module libstrata_mpi.so could not be loaded (tried $work/none.so ($work/none.so: cannot open shared object file" <<<"$out" ||
  fail "STRATA_MPI_MODULE naming a missing file: $out"
grep -q "install Open MPI" <<<"$out" && grep -q "launch with torchrun" <<<"$out" && grep -q "rank -1 of -1$" <<<"$out" ||
  fail "the error does not name the fix, or a communicator was made: $out"
echo "ok: a missing module: $out"

other_build_module "$cc" mpi "$work/other_build.so"
out=$(STRATA_MPI_MODULE=$work/other_build.so "$work/ask_mpi" mpi 2>&1)
grep -q "STRATA_ERR_FAILED_PRECONDITION: strata_comm_create_mpi_world: the MPI back-end module $work/other_build.so is of another build (0.0.0 Other 1 headers 0123456789abcdef; this library is .*): install the libstrata_mpi.so built with this library" <<<"$out" ||
  fail "a module of another build was not refused by name: $out"
echo "ok: a module of another build is refused"

# 3. Without MPI on the machine.
without=$src/tests/python/without_mpi.sh
if ! "$without" true; then fail "no user and mount namespace here (tests/python/without_mpi.sh true failed)"; fi
out=$("$without" "$work/ask_mpi" in_process 2>&1) || fail "libstrata.so did not run without MPI: $out"
grep -q "^STRATA_OK: : rank 0 of 1$" <<<"$out" || fail "an in-process communicator without MPI: $out"
out=$("$without" "$work/ask_mpi" mpi 2>&1) || fail "ask_mpi crashed without MPI: $out"
grep -q "STRATA_ERR_FAILED_PRECONDITION: strata_comm_create_mpi_world: the MPI back-end module libstrata_mpi.so could not be loaded (tried $lib/libstrata_mpi.so (libmpi.so.40: cannot open shared object file" <<<"$out" ||
  fail "the MPI world without MPI: $out"
grep -q "install Open MPI" <<<"$out" && grep -q "launch with torchrun" <<<"$out" || fail "no fix named: $out"
echo "ok: without MPI, libstrata.so runs and the MPI world names what is missing: $out"
