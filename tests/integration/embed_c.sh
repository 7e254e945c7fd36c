#!/usr/bin/env bash
# The C example against the INSTALLED package, never the build tree: `cmake --install` into a temporary
# prefix, build examples/embed_c from that prefix twice (pkg-config + the C compiler, and
# find_package(strata) + CMake), run both under mpirun -n 2 (no arguments: exit 0 when the model learned),
# and check the final parameters equal those of the same model trained through the C++ API (mlp_train
# with the configuration and schedule embed_c prints).
# usage: embed_c.sh MPIRUN CMAKE CC BUILD_DIR SOURCE_DIR MLP_TRAIN
set -euo pipefail
mpirun=$1 cmake=$2 cc=$3 build=$4 src=$5 mlp=$6
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
fail() { echo "FAIL: $*"; exit 1; }

"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
pc=$(find "$prefix" -name strata.pc)
[ -n "$pc" ] || fail "no strata.pc installed under $prefix"
export PKG_CONFIG_PATH=${pc%/*}

# 1. pkg-config: a plain C99 build.
libdir=$(pkg-config --variable=libdir strata)
# shellcheck disable=SC2046
"$cc" -std=c99 -pedantic -Wall -Wextra -Werror -O2 "$src/examples/embed_c/embed_c.c" \
  $(pkg-config --cflags --libs strata) -lm -Wl,-rpath,"$libdir" -o "$work/embed_c_pc"
# 2. find_package(strata) through CMake's package registry-free search of CMAKE_PREFIX_PATH.
"$cmake" -S "$src/examples/embed_c" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_BUILD_TYPE=Release > "$work/cmake.log"
"$cmake" --build "$work/cmake" > "$work/build.log"
strata_dir=$(sed -n 's/^strata_DIR:PATH=//p' "$work/cmake/CMakeCache.txt")
[[ $strata_dir == "$prefix"/* ]] || fail "find_package(strata) found '$strata_dir', not the installed package"

for exe in "$work/embed_c_pc" "$work/cmake/embed_c"; do
  loaded=$(ldd "$exe" | awk '/libstrata/ {print $3}')
  [[ $loaded == "$prefix"/* ]] || fail "$exe loads libstrata from '$loaded', not from the install prefix"
done

# 3. Both run at 2 ranks with no arguments; the CMake build also dumps its parameters.
"$mpirun" -n 2 "$work/embed_c_pc" > "$work/pc.out" 2>&1 || { cat "$work/pc.out"; fail "embed_c (pkg-config) failed"; }
"$mpirun" -n 2 "$work/cmake/embed_c" --dump "$work/c.bin" > "$work/cmake.out" 2>&1 ||
  { cat "$work/cmake.out"; fail "embed_c (find_package) failed"; }
cat "$work/pc.out"
grep '^params:' "$work/cmake.out" | diff - <(grep '^params:' "$work/pc.out") > /dev/null ||
  fail "the two builds of embed_c ended with different parameters"

# 4. The same model through the C++ API.
sed -n 's/^config: //p' "$work/pc.out" > "$work/config.json"
read -r -a schedule <<< "$(sed -n 's/^schedule: //p' "$work/pc.out")"
"$mpirun" -n 2 "$mlp" --config "$work/config.json" "${schedule[@]}" --compare "$work/c.bin" --rtol 1e-6 \
  > "$work/mlp.out" 2>&1 || { cat "$work/mlp.out"; fail "mlp_train disagrees with embed_c"; }
grep '^compare:' "$work/mlp.out"
echo "ok: embed_c built from the installed package (pkg-config and find_package) matches mlp_train"
