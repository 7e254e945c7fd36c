#!/usr/bin/env bash
# The STRATA_WITH_MPI=OFF build (issue 35; docs/decisions/0041-mpi-backend-module.md, "The build without MPI"):
# configures the project with -DSTRATA_WITH_MPI=OFF (CUDA, tests and benchmarks off: the least that makes the
# Python package's library) in a build directory of its own beside BUILD_DIR, builds the target strata_capi
# (libstrata.so) there, incrementally on later runs, and checks that
#   1. libstrata.so needs no libmpi and no MPI module was built;
#   2. strata.torch over that library trains under `torchrun --standalone --nproc-per-node 2` (mpi4py blocked),
#      every rank's losses, step results and final weights equal bit for bit to the same run over BUILD_DIR's
#      library (the MPI build);
#   3. the C ABI's MPI communicators are refused there with STRATA_ERR_UNIMPLEMENTED naming the build and the fix.
#   no_mpi_build.sh BUILD_DIR PYTHON        (run by tests/python/run.sh; STRATA_NO_MPI_BUILD=0 leaves it out)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd) python=$2
nompi=$(dirname "$build")/no_mpi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

start=$SECONDS
cmake -S "$root" -B "$nompi" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_WITH_MPI=OFF -DSTRATA_WITH_CUDA=OFF \
  -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCHMARKS=OFF -DSTRATA_WERROR=ON > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; fail "configuring with STRATA_WITH_MPI=OFF"; }
cmake --build "$nompi" -j "$(nproc)" --target strata_capi > "$work/build.log" 2>&1 ||
  { tail -n 60 "$work/build.log"; fail "building strata_capi with STRATA_WITH_MPI=OFF"; }
echo "ok: configured and built strata_capi with STRATA_WITH_MPI=OFF in $((SECONDS - start)) s ($nompi)"

lib=$nompi/lib/libstrata.so.1
[ -f "$lib" ] || fail "$lib was not built"
! readelf -d "$lib" | grep -q 'libmpi' || fail "libstrata.so of the STRATA_WITH_MPI=OFF build needs libmpi"
[ ! -e "$nompi/lib/libstrata_mpi.so" ] || fail "the STRATA_WITH_MPI=OFF build made an MPI module"
echo "ok: libstrata.so needs no libmpi, and no libstrata_mpi.so was built"

# 2. The same torchrun job over each library: the Python package from the source tree, the library named by
# STRATA_LIBRARY, mpi4py blocked (tests/python/no_mpi4py).
train() {  # train LIBRARY OUT
  PYTHONPATH="$root/python:$root/tests/python/no_mpi4py" STRATA_LIBRARY=$1 OMP_NUM_THREADS=1 \
    timeout 600 "$python" -m torch.distributed.run --standalone --nproc-per-node 2 \
    "$root/tests/python/launch_train.py" "$2" 3 > "$2.log" 2>&1 || { cat "$2.log"; fail "torchrun over $1"; }
}
train "$lib" "$work/nompi"
train "$build/lib/libstrata.so.1" "$work/mpi"
"$python" - "$work" <<'PY' || fail "the STRATA_WITH_MPI=OFF build trains otherwise than the MPI build"
import sys
import torch
work = sys.argv[1]
for r in (0, 1):
    a, b = (torch.load(f"{work}/{d}/rank{r}.pt") for d in ("nompi", "mpi"))
    assert a["world"] == 2 and a["losses"] == b["losses"] and a["results"] == b["results"], (r, a["losses"], b["losses"])
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in b["state"]), r
    assert a["results"][0]["clip_coef"] < 1.0  # the gradient norm's all-reduce took part
print(f"ok: 2 torchrun ranks over the STRATA_WITH_MPI=OFF library trained bit for bit as over the MPI build's "
      f"({len(b['losses'])} losses per rank, the last {b['losses'][-1]:.6f})")
PY

# 3. MPI refused by name, with the fix.
STRATA_LIBRARY=$lib PYTHONPATH="$root/python" "$python" - <<'PY' || fail "the MPI communicator was not refused"
import ctypes
from strata import _capi
out = ctypes.c_void_p()
for call in (lambda: _capi.lib.strata_comm_create_mpi_world(ctypes.byref(out)),
             lambda: _capi.lib.strata_comm_create_mpi(0, ctypes.byref(out))):
    status = call()
    text = _capi.lib.strata_last_error().decode()
    assert _capi.lib.strata_status_name(status).decode() == "STRATA_ERR_UNIMPLEMENTED", (status, text)
    assert "built without MPI (STRATA_WITH_MPI=OFF)" in text and "-DSTRATA_WITH_MPI=ON" in text, text
    assert "torchrun" in text and out.value is None, text
print(f"ok: the MPI communicators are refused: {text}")
PY
echo "ok: the STRATA_WITH_MPI=OFF build, $((SECONDS - start)) s in all"
