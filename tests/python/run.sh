#!/usr/bin/env bash
# The strata.torch tests: installs the package from python/ (its libstrata.so taken from BUILD_DIR, already
# built by the caller) into a project venv, then runs pytest under mpirun at 1, 2 and 4 ranks (every rank
# runs every test; each test is collective), 2 ranks first.
#   tests/python/run.sh [BUILD_DIR]      (default build/release)
# The venv is $STRATA_VENV, else build/venv. When it lacks python/requirements-test.txt's packages they are
# installed with pip from PyPI once (torch is a large download), so a fresh machine needs network once.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build/release}" && pwd)
venv=${STRATA_VENV:-$root/build/venv}
cd "$root"
if ! "$venv/bin/python" -c "import torch, transformers, pytest, mpi4py, numpy, setuptools, wheel" 2>/dev/null; then
  echo "== python venv $venv: installing python/requirements-test.txt (once)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  log=/tmp/strata-venv-install.log
  # `strata` itself is this repository's python/, installed below (--no-deps): its own dependencies
  # (python/pyproject.toml: mpi4py, numpy) come with the tests' here.
  { "$venv/bin/pip" install --upgrade pip setuptools wheel &&
    "$venv/bin/pip" install -r <(grep -Ev '^strata( |$)' python/requirements-test.txt) "mpi4py>=3.1" numpy; } > "$log" 2>&1 || {
    tail -n 30 "$log"; echo "tests/python/run.sh: pip failed; the whole log is $log"; exit 1; }
fi
# Build isolation off: the venv's setuptools builds it, with no download; the library is BUILD_DIR's.
STRATA_BUILD_DIR=$build "$venv/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall ./python \
  > /tmp/strata-pip-install.log 2>&1 || { cat /tmp/strata-pip-install.log; exit 1; }
unset STRATA_LIBRARY  # the tests load the installed package's copy
# 2 ranks first: test_checkpoint's reshard test writes a checkpoint there that the 1- and 4-rank runs load.
STRATA_TEST_SHARED=$(mktemp -d)
trap 'rm -rf "$STRATA_TEST_SHARED"' EXIT
export STRATA_TEST_SHARED
for n in 2 1 4; do
  echo "== strata.torch tests at $n ranks"
  OMP_NUM_THREADS=1 scripts/mpirun_local -n "$n" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python
done
