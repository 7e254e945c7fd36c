#!/usr/bin/env bash
# mlp_train picks its world through the runtime's launcher (runtime/comm/launcher.h, Note [Launchers]):
# a torchrun launch of two ranks on the host is refused naming the mpirun command (before, each process
# silently trained alone), one torchrun rank trains, and a malformed torchrun variable is named.
# usage: mlp_launch.sh MLP_TRAIN
set -uo pipefail
mlp=$1
fail() { echo "FAIL: $*"; exit 1; }
torchrun() { env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE="$1" "${@:2}"; }

out=$(torchrun 2 "$mlp" --steps 2 2>&1); rc=$?
[ $rc -eq 2 ] || fail "two torchrun ranks on the host: exit $rc, not 2: $out"
grep -q "started by torchrun (WORLD_SIZE=2) on the host back-end" <<<"$out" || fail "no refusal: $out"
grep -q "mpirun -n 2 mlp_train" <<<"$out" || fail "the refusal does not name the mpirun command: $out"

out=$(torchrun 1 "$mlp" --steps 2 2>&1); rc=$?
[ $rc -eq 0 ] || fail "one torchrun rank: exit $rc: $out"
grep -q "^step   2" <<<"$out" || fail "one torchrun rank did not train: $out"

out=$(torchrun two "$mlp" --steps 2 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "WORLD_SIZE" <<<"$out" || fail "a malformed WORLD_SIZE: exit $rc: $out"
echo "ok: mlp_train's launch goes through the runtime launcher"
