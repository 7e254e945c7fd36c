#!/usr/bin/env bash
# scripts/check_deps, checked: it passes on this build with install_deps' own list, and it fails naming the
# package when one the build needs is taken off the list (ocl-icd-opencl-dev: oneDNN's CMake config needs
# OpenCL, which libdnnl-dev only Recommends, so nothing else on the list brings it), or naming the module
# when a test imports a Python package that python/requirements-test.txt does not name.
#   check_deps.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fails=0 runs=0
check() { runs=$((runs + 1)); [ "$2" -eq 0 ] || { echo "FAIL: $1: $3"; fails=$((fails + 1)); }; }

out=$("$src/scripts/check_deps" "$build" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "check_deps: ok" <<<"$out"
check "install_deps' list covers this build" $? "$rc $out"
out=$("$src/scripts/check_deps" --without ocl-icd-opencl-dev "$build" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "MISSING package ocl-icd-opencl-dev: the build read /usr/lib/x86_64-linux-gnu/libOpenCL.so" <<<"$out"
check "without ocl-icd-opencl-dev on the list, it fails naming it" $? "$rc $out"
printf 'import json\nimport scipy.linalg\n' > "$work/uses_scipy.py"
out=$("$src/scripts/check_deps" --also-scan "$work/uses_scipy.py" "$build" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "MISSING Python module scipy: imported by" <<<"$out" && ! grep -q "module json" <<<"$out"
check "a test's import of a package not in python/requirements-test.txt is named" $? "$rc $out"
echo "$((runs - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
