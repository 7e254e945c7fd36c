#!/usr/bin/env bash
# The strata.torch tests: scripts/python_env installs the package from python/ (its libstrata.so built in
# BUILD_DIR) into the project venv, creating it with the tests' requirements when missing; then pytest runs
# under mpirun at 2, 1 and 4 ranks (every rank runs every test; each test is collective), then under torchrun.
#   tests/python/run.sh [BUILD_DIR]      (default build/release; STRATA_VENV overrides build/venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=$(cd "${1:-build/release}" && pwd)
python=$(scripts/python_env "$build" | tail -n 1)
unset STRATA_LIBRARY  # the tests load the installed package's copy
# test_strata_cli reads a strata.torch checkpoint with `strata ckpt` (scripts/test builds it).
if [ -x "$build/bin/strata" ]; then export STRATA_CLI=$build/bin/strata; fi
# test_foreign_conformance loads the conformance suite's module into torchrun's ranks.
cmake --build "$build" --target strata_conformance_module > /tmp/strata-conformance-module.log 2>&1 ||
  { cat /tmp/strata-conformance-module.log; exit 1; }
export STRATA_CONFORMANCE_MODULE=$build/lib/libstrata_conformance.so
# 2 ranks first: test_checkpoint's reshard test writes a checkpoint there that the 1- and 4-rank runs load.
# A test that starts jobs of its own runs once, in the 1-rank mpirun run (common.once).
STRATA_TEST_SHARED=$(mktemp -d)
trap 'rm -rf "$STRATA_TEST_SHARED"' EXIT
export STRATA_TEST_SHARED
for n in 2 1 4; do
  echo "== strata.torch tests at $n ranks"
  OMP_NUM_THREADS=1 scripts/mpirun_local -n "$n" "$python" -m pytest -q -p no:cacheprovider tests/python
done
# The same suite under torchrun (docs/decisions/0039), on torch.distributed's gloo, with mpi4py blocked: every
# test but test_launch.py, test_no_mpi.py and test_foreign_conformance.py, which start their own mpirun and torchrun
# jobs (from rank 0 of the mpirun runs above). --standalone: torchrun's store binds its own port. STRATA_TORCHRUN_TESTS=0
# leaves it out.
if [ "${STRATA_TORCHRUN_TESTS:-1}" != 0 ]; then
  mkdir -p "$STRATA_TEST_SHARED/torchrun"  # the reshard test's checkpoint: written at 2 ranks, read at 1 and 4
  for n in 2 1 4; do
    echo "== strata.torch tests at $n ranks under torchrun"
    STRATA_TEST_SHARED="$STRATA_TEST_SHARED/torchrun" PYTHONPATH="$root/tests/python/no_mpi4py" OMP_NUM_THREADS=1 \
      "$python" -m torch.distributed.run --standalone --nproc-per-node "$n" -m pytest -q -p no:cacheprovider \
      tests/python --ignore tests/python/test_launch.py --ignore tests/python/test_no_mpi.py \
      --ignore tests/python/test_foreign_conformance.py
  done
fi
# An uncaught exception on one rank ends the job at once (strata's excepthook), not at the collective timeout.
echo "== an uncaught exception on rank 0 aborts the 2-rank job"
start=$SECONDS
if out=$(timeout 120 scripts/mpirun_local -n 2 "$python" tests/python/abort_on_exception.py 2>&1); then
  echo "$out"; echo "FAIL: the job exited 0"; exit 1
fi
grep -q "aborting the job: rank 0: uncaught ValueError: rank 0 fails on purpose" <<<"$out" ||
  { echo "$out"; echo "FAIL: no abort message"; exit 1; }
[ $((SECONDS - start)) -lt 100 ] || { echo "FAIL: took $((SECONDS - start)) s (waited for a timeout?)"; exit 1; }
echo "ok: aborted after $((SECONDS - start)) s"
echo "== sys.exit on rank 0 in the middle of a step aborts the 2-rank job"
start=$SECONDS
if out=$(timeout 120 scripts/mpirun_local -n 2 "$python" tests/python/abort_on_exception.py exit 2>&1); then
  echo "$out"; echo "FAIL: the job exited 0"; exit 1
fi
grep -q "aborting the job: rank 0: exited in the middle of a step (1 backward passes were done and step() was not called)" <<<"$out" ||
  { echo "$out"; echo "FAIL: no abort message"; exit 1; }
[ $((SECONDS - start)) -lt 100 ] || { echo "FAIL: took $((SECONDS - start)) s (waited for a timeout?)"; exit 1; }
echo "ok: aborted after $((SECONDS - start)) s"
# The example runs and learns (its full run is examples/torch/run).
echo "== examples/torch/train_gpt2.py, 40 steps at 2 ranks"
out=$(OMP_NUM_THREADS=1 scripts/mpirun_local -n 2 "$python" examples/torch/train_gpt2.py --steps 40 --print-every 39)
echo "$out"
first=$(sed -n 's/^step *0  loss \([0-9.]*\).*/\1/p' <<<"$out")
last=$(sed -n 's/^step *39  loss \([0-9.]*\).*/\1/p' <<<"$out")
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a != "" && b != "" && b < a - 1.0) }' ||
  { echo "FAIL: the example's loss went from '$first' to '$last' (expected a drop of more than 1)"; exit 1; }
# The LoRA example (the base frozen, adapters trained) learns and leaves the base bit for bit unchanged.
echo "== examples/torch/lora_gpt2.py, 40 + 40 steps at 2 ranks"
out=$(OMP_NUM_THREADS=1 scripts/mpirun_local -n 2 "$python" examples/torch/lora_gpt2.py --base-steps 40 --steps 40 \
  --print-every 39)
echo "$out"
before=$(sed -n 's/^held-out loss on the fine-tuning text before: \([0-9.]*\).*/\1/p' <<<"$out")
after=$(sed -n 's/^held-out loss on the fine-tuning text after: \([0-9.]*\).*/\1/p' <<<"$out")
grep -q "base weights bit for bit unchanged: True" <<<"$out" || { echo "FAIL: the frozen base changed"; exit 1; }
awk -v a="$before" -v b="$after" 'BEGIN { exit !(a != "" && b != "" && b < a) }' ||
  { echo "FAIL: the fine-tune's held-out loss went from '$before' to '$after' (expected a drop)"; exit 1; }
# The STRATA_WITH_MPI=OFF build (issue 35): strata_capi built in a build directory of its own, trained over under
# torchrun bit for bit as the MPI build, its MPI communicators refused naming the fix. STRATA_NO_MPI_BUILD=0 leaves
# it out (a cold build of strata_capi without CUDA: about 9 min on 2 busy cores; incremental afterwards, 80 s in all
# after a change of a few sources).
if [ "${STRATA_NO_MPI_BUILD:-1}" != 0 ]; then
  echo "== the STRATA_WITH_MPI=OFF build"
  tests/integration/no_mpi_build.sh "$build" "$python"
fi
